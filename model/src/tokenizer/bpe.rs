//! Byte-level BPE: the GPT-2 byte <-> character mapping and the merge model
//! built from `tokenizer.ggml.tokens` and `tokenizer.ggml.merges`.
//!
//! The merge loop is the `tokenizers` crate's `BPE` model: repeatedly merge
//! the adjacent pair of lowest rank, leftmost first, which is what
//! llama.cpp's `llm_tokenizer_bpe_session` does. Merges are ranked by their
//! position in the GGUF list; a pair listed twice keeps its first rank, as
//! in llama.cpp.

use std::collections::HashSet;
use std::sync::LazyLock;

use tokenizers::models::bpe::{Vocab, BPE};

use super::vocab::TokenKind;
use super::TokenizerError;

/// GPT-2's `bytes_to_unicode`: printable Latin-1 bytes stand for
/// themselves, the other 68 bytes for U+0100..=U+0143 in byte order.
/// Indexed by code point: the byte a vocabulary character stands for, `None`
/// for characters that stand for no byte. (The other direction is applied by
/// the `tokenizers` crate's `ByteLevel` pre-tokenizer, which uses the same
/// table.)
static CHAR_TO_BYTE: LazyLock<[Option<u8>; 0x144]> = LazyLock::new(|| {
    let mut from_char = [None; 0x144];
    let mut next = 0x100u32;
    for b in 0..=255u8 {
        let cp = if matches!(b, 0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF) {
            u32::from(b)
        } else {
            next += 1;
            next - 1
        };
        from_char[cp as usize] = Some(b);
    }
    from_char
});

/// The byte a vocabulary character stands for, if it is one of the 256.
fn char_to_byte(c: char) -> Option<u8> {
    CHAR_TO_BYTE.get(c as usize).copied().flatten()
}

/// The bytes a token stands for in output text (llama.cpp's
/// `token_to_piece` with special tokens rendered).
pub(crate) fn token_piece(text: &str, kind: TokenKind, out: &mut Vec<u8>) {
    match kind {
        TokenKind::Normal => {
            for c in text.chars() {
                match char_to_byte(c) {
                    Some(b) => out.push(b),
                    // Not a byte-level character: keep it as written.
                    None => out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
                }
            }
        }
        TokenKind::Control | TokenKind::UserDefined | TokenKind::Unknown => {
            out.extend_from_slice(text.as_bytes())
        }
        TokenKind::Byte => match parse_byte_token(text) {
            Some(b) => out.push(b),
            None => out.extend_from_slice(text.as_bytes()),
        },
        TokenKind::Unused | TokenKind::Undefined => {}
    }
}

/// `<0xAB>` -> 0xAB.
fn parse_byte_token(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

/// Build the merge model. Fails on duplicate tokens, merges that are not
/// `left right`, and merges whose parts or result are not tokens.
pub(crate) fn build_bpe(
    tokens: &[String],
    merges: &[&str],
    ignore_merges: bool,
) -> Result<BPE, TokenizerError> {
    let mut vocab = Vocab::with_capacity(tokens.len());
    for (id, text) in tokens.iter().enumerate() {
        if let Some(first) = vocab.insert(text.clone(), id as u32) {
            return Err(TokenizerError::DuplicateToken {
                text: text.clone(),
                first,
                second: id as u32,
            });
        }
    }

    let mut pairs = Vec::with_capacity(merges.len());
    let mut seen = HashSet::with_capacity(merges.len());
    let mut joined = String::new();
    for (index, &merge) in merges.iter().enumerate() {
        let (left, right) = split_merge(merge).ok_or_else(|| TokenizerError::BadMerge {
            index,
            merge: merge.to_string(),
        })?;
        joined.clear();
        joined.push_str(left);
        joined.push_str(right);
        let mut ids = [0u32; 2];
        for (slot, part) in ids.iter_mut().zip([left, right]) {
            *slot = *vocab
                .get(part)
                .ok_or_else(|| TokenizerError::MergeNotInVocab {
                    index,
                    merge: merge.to_string(),
                    token: part.to_string(),
                })?;
        }
        if !vocab.contains_key(joined.as_str()) {
            return Err(TokenizerError::MergeNotInVocab {
                index,
                merge: merge.to_string(),
                token: joined.clone(),
            });
        }
        if seen.insert((ids[0], ids[1])) {
            pairs.push((left.to_string(), right.to_string()));
        }
    }

    BPE::builder()
        .vocab_and_merges(vocab, pairs)
        .ignore_merges(ignore_merges)
        .build()
        .map_err(|e| TokenizerError::Bpe {
            message: e.to_string(),
        })
}

/// `"left right"` -> (`left`, `right`), splitting at the first space after
/// the first byte, as llama.cpp does (so a merge may start with a space).
fn split_merge(merge: &str) -> Option<(&str, &str)> {
    let pos = merge.bytes().skip(1).position(|b| b == b' ')? + 1;
    let (left, right) = (&merge[..pos], &merge[pos + 1..]);
    (!right.is_empty()).then_some((left, right))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_map_is_a_bijection() {
        let mut hit = [0u32; 256];
        for c in (0..0x200u32).filter_map(char::from_u32) {
            if let Some(b) = char_to_byte(c) {
                hit[b as usize] += 1;
            }
        }
        assert!(
            hit.iter().all(|&n| n == 1),
            "each byte has exactly one character"
        );
        assert_eq!(char_to_byte('Ġ'), Some(b' '));
        assert_eq!(char_to_byte('Ċ'), Some(b'\n'));
        assert_eq!(char_to_byte('Ń'), Some(0xAD));
        assert_eq!(char_to_byte('A'), Some(b'A'));
        assert_eq!(char_to_byte('中'), None);
    }

    #[test]
    fn pieces_decode_byte_level() {
        let mut out = Vec::new();
        token_piece("Ġhello", TokenKind::Normal, &mut out);
        token_piece("<|im_end|>", TokenKind::Control, &mut out);
        token_piece("<0x0A>", TokenKind::Byte, &mut out);
        assert_eq!(out, b" hello<|im_end|>\n");
    }

    #[test]
    fn merges_split_like_llama_cpp() {
        assert_eq!(split_merge("Ġ t"), Some(("Ġ", "t")));
        assert_eq!(split_merge("  x"), Some((" ", "x")));
        assert_eq!(split_merge("ab"), None);
        assert_eq!(split_merge("a "), None);
        assert_eq!(split_merge(""), None);
    }
}
