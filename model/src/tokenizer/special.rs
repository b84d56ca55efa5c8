//! Cutting special tokens out of a text before BPE sees it.
//!
//! llama.cpp's `tokenizer_st_partition`: special tokens are tried longest
//! first; each one splits every text fragment left by the ones before it at
//! each of its (non-overlapping, left to right) occurrences. Control and
//! unknown tokens are only cut out when special tokens are parsed;
//! user-defined tokens always are.

use super::vocab::TokenKind;

/// A piece of the input: text still to be BPE-encoded, or a token id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fragment<'a> {
    Text(&'a str),
    Token(u32),
}

/// A token that can appear verbatim in text.
#[derive(Clone, Debug)]
pub(crate) struct SpecialToken {
    pub id: u32,
    pub text: String,
    /// User-defined tokens are matched even when special tokens are not
    /// parsed.
    pub always: bool,
}

/// The special tokens of a vocabulary in matching order: longest text
/// first, then by id.
pub(crate) fn special_tokens(tokens: &[String], kinds: &[TokenKind]) -> Vec<SpecialToken> {
    let mut out: Vec<SpecialToken> = tokens
        .iter()
        .zip(kinds)
        .enumerate()
        .filter(|(_, (_, kind))| {
            matches!(
                kind,
                TokenKind::Control | TokenKind::UserDefined | TokenKind::Unknown
            )
        })
        .map(|(id, (text, kind))| SpecialToken {
            id: id as u32,
            text: text.clone(),
            always: *kind == TokenKind::UserDefined,
        })
        .collect();
    out.sort_by(|a, b| b.text.len().cmp(&a.text.len()).then(a.id.cmp(&b.id)));
    out
}

/// Split `text` into fragments at the special tokens.
pub(crate) fn partition<'a>(
    text: &'a str,
    specials: &[SpecialToken],
    parse_special: bool,
) -> Vec<Fragment<'a>> {
    if text.is_empty() {
        return Vec::new();
    }
    let mut fragments = vec![Fragment::Text(text)];
    let mut next = Vec::new();
    for special in specials {
        if !(parse_special || special.always) {
            continue;
        }
        let needle = special.text.as_str();
        // Cheap pre-check: most texts contain few or none of the specials.
        let present = fragments
            .iter()
            .any(|f| matches!(f, Fragment::Text(s) if s.contains(needle)));
        if !present {
            continue;
        }
        next.clear();
        for fragment in fragments.drain(..) {
            let Fragment::Text(s) = fragment else {
                next.push(fragment);
                continue;
            };
            let mut rest = 0;
            for (at, _) in s.match_indices(needle) {
                if at > rest {
                    next.push(Fragment::Text(&s[rest..at]));
                }
                next.push(Fragment::Token(special.id));
                rest = at + needle.len();
            }
            if rest < s.len() {
                next.push(Fragment::Text(&s[rest..]));
            }
        }
        std::mem::swap(&mut fragments, &mut next);
    }
    fragments
}

#[cfg(test)]
mod tests {
    use super::*;

    fn specials() -> Vec<SpecialToken> {
        let tokens: Vec<String> = ["<s>", "<|im_start|>", "<|im", "<tool>"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let kinds = [
            TokenKind::Control,
            TokenKind::Control,
            TokenKind::Control,
            TokenKind::UserDefined,
        ];
        special_tokens(&tokens, &kinds)
    }

    #[test]
    fn longest_first_then_left_to_right() {
        let f = partition("a<|im_start|>b<|im<s><s>", &specials(), true);
        assert_eq!(
            f,
            [
                Fragment::Text("a"),
                Fragment::Token(1),
                Fragment::Text("b"),
                Fragment::Token(2),
                Fragment::Token(0),
                Fragment::Token(0),
            ]
        );
    }

    #[test]
    fn user_defined_tokens_are_always_parsed() {
        let f = partition("x<tool><s>", &specials(), false);
        assert_eq!(
            f,
            [
                Fragment::Text("x"),
                Fragment::Token(3),
                Fragment::Text("<s>")
            ]
        );
        assert!(partition("", &specials(), true).is_empty());
    }
}
