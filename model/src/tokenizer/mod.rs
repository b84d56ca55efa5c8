//! Tokenizer built from GGUF metadata, matching llama.cpp's token ids.
//!
//! Supported now: `tokenizer.ggml.model = gpt2` (byte-level BPE) with the
//! pre-tokenizers of [`PreTokenizerKind`]. Encoding follows llama.cpp's
//! `llama_vocab::tokenize` (`src/llama-vocab.cpp`):
//!
//! 1. special tokens are cut out of the text (`special.rs`);
//! 2. each remaining text fragment is split into words by the family's
//!    expressions and mapped to byte-level characters (`pretokenizer.rs`);
//! 3. each word is merged by BPE rank (`bpe.rs`), with the `tokenizers`
//!    crate's `BPE` model;
//! 4. BOS/EOS are added when `add_bos_token`/`add_eos_token` say so.
//!
//! Decoding concatenates token pieces, as llama.cpp's `token_to_piece`
//! does for streamed output; llama.cpp's `clean_up_tokenization_spaces`
//! pass (" ." -> ".", used by some families in `llama_detokenize`) is not
//! applied.
//!
//! Checked against llama.cpp's ids for the SmolLM2 chat prompt and against
//! an independent re-implementation for tricky strings
//! (`model/tests/tokenizer_smollm2.rs`).

mod bpe;
mod error;
mod pretokenizer;
mod special;
mod stream;
#[cfg(test)]
mod tests;
mod vocab;

use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::{Model, OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer};

use crate::gguf::Metadata;

pub use error::TokenizerError;
pub use pretokenizer::PreTokenizerKind;
pub use stream::StreamDecoder;
pub use vocab::TokenKind;

use special::{Fragment, SpecialToken};
use vocab::{Vocab, END_OF_TURN_TEXTS, KEY_MERGES, KEY_MODEL, KEY_PRE};

/// A model's tokenizer: text <-> token ids.
pub struct Tokenizer {
    pre_kind: PreTokenizerKind,
    pre: PreTokenizerWrapper,
    bpe: BPE,
    vocab: Vocab,
    /// Special tokens in matching order (longest first).
    specials: Vec<SpecialToken>,
    /// All token pieces, back to back; token `i` is
    /// `pieces[piece_ends[i - 1]..piece_ends[i]]`.
    pieces: Vec<u8>,
    piece_ends: Vec<usize>,
    stop: Vec<u32>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("pre", &self.pre_kind)
            .field("vocab_size", &self.vocab_size())
            .field("bos", &self.vocab.bos)
            .field("eos", &self.vocab.eos)
            .field("add_bos", &self.vocab.add_bos)
            .field("stop_tokens", &self.stop)
            .finish_non_exhaustive()
    }
}

impl Tokenizer {
    /// Build the tokenizer from a GGUF header.
    pub fn from_gguf(meta: &Metadata) -> Result<Tokenizer, TokenizerError> {
        let model = vocab::required_str(meta, KEY_MODEL)?;
        if model != "gpt2" {
            return Err(TokenizerError::UnsupportedModel {
                model: model.to_string(),
                supported: "gpt2",
            });
        }
        let pre_kind = PreTokenizerKind::from_gguf_name(vocab::required_str(meta, KEY_PRE)?)?;
        let vocab = Vocab::from_gguf(meta, pre_kind.default_add_bos())?;
        let merges = vocab::string_array(meta, KEY_MERGES)?;
        let bpe = bpe::build_bpe(&vocab.tokens, &merges, pre_kind.ignore_merges())?;
        let pre = pre_kind.build()?;
        let specials = special::special_tokens(&vocab.tokens, &vocab.kinds);

        let mut pieces = Vec::with_capacity(vocab.tokens.iter().map(String::len).sum());
        let mut piece_ends = Vec::with_capacity(vocab.tokens.len());
        for (text, &kind) in vocab.tokens.iter().zip(&vocab.kinds) {
            bpe::token_piece(text, kind, &mut pieces);
            piece_ends.push(pieces.len());
        }

        let stop = stop_tokens(&vocab);
        Ok(Tokenizer {
            pre_kind,
            pre,
            bpe,
            vocab,
            specials,
            pieces,
            piece_ends,
            stop,
        })
    }

    /// Encode `text`, adding BOS/EOS when the model's `add_bos_token` /
    /// `add_eos_token` say so. With `parse_special`, control tokens written
    /// in the text (`<|im_start|>`) become their ids; without it they are
    /// encoded as plain text. User-defined tokens are always matched.
    pub fn encode(&self, text: &str, parse_special: bool) -> Result<Vec<u32>, TokenizerError> {
        self.encode_with(text, parse_special, true)
    }

    /// [`encode`](Self::encode), choosing whether BOS/EOS may be added
    /// (`add_special = false` never adds them, e.g. for a rendered chat
    /// template that already starts with BOS).
    pub fn encode_with(
        &self,
        text: &str,
        parse_special: bool,
        add_special: bool,
    ) -> Result<Vec<u32>, TokenizerError> {
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_special && self.vocab.add_bos {
            out.extend(self.vocab.bos);
        }
        for fragment in special::partition(text, &self.specials, parse_special) {
            match fragment {
                Fragment::Token(id) => out.push(id),
                Fragment::Text(s) => self.encode_text(s, &mut out)?,
            }
        }
        if add_special && self.vocab.add_eos {
            out.extend(self.vocab.eos);
        }
        Ok(out)
    }

    /// BPE-encode a text without special tokens in it.
    fn encode_text(&self, text: &str, out: &mut Vec<u32>) -> Result<(), TokenizerError> {
        let encode_err = |e: tokenizers::Error| TokenizerError::Encode {
            message: e.to_string(),
        };
        let mut words = PreTokenizedString::from(text);
        self.pre.pre_tokenize(&mut words).map_err(encode_err)?;
        for (word, _, _) in words.get_splits(OffsetReferential::Original, OffsetType::None) {
            out.extend(
                self.bpe
                    .tokenize(word)
                    .map_err(encode_err)?
                    .into_iter()
                    .map(|t| t.id),
            );
        }
        Ok(())
    }

    /// The text of `ids`: token bytes concatenated, invalid UTF-8 replaced
    /// by U+FFFD. Control tokens are rendered as their text; unused tokens
    /// and ids out of range render as nothing.
    pub fn decode(&self, ids: &[u32]) -> String {
        let mut bytes = Vec::with_capacity(ids.len() * 4);
        for &id in ids {
            bytes.extend_from_slice(self.token_bytes(id));
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// The raw bytes one token stands for (byte-level decoded); possibly
    /// part of a UTF-8 character. Empty for ids out of range.
    pub fn token_bytes(&self, id: u32) -> &[u8] {
        let i = id as usize;
        if i >= self.piece_ends.len() {
            return &[];
        }
        let start = if i == 0 { 0 } else { self.piece_ends[i - 1] };
        &self.pieces[start..self.piece_ends[i]]
    }

    /// The token as the vocabulary writes it (byte-level characters, e.g.
    /// `Ġthe` for " the").
    pub fn token_str(&self, id: u32) -> Option<&str> {
        self.vocab.tokens.get(id as usize).map(String::as_str)
    }

    /// The id of a vocabulary string (as [`token_str`](Self::token_str)
    /// writes it).
    pub fn token_id(&self, s: &str) -> Option<u32> {
        self.bpe.token_to_id(s)
    }

    pub fn vocab_size(&self) -> usize {
        self.vocab.tokens.len()
    }

    pub fn token_kind(&self, id: u32) -> Option<TokenKind> {
        self.vocab.kinds.get(id as usize).copied()
    }

    pub fn pre_tokenizer(&self) -> PreTokenizerKind {
        self.pre_kind
    }

    pub fn bos(&self) -> Option<u32> {
        self.vocab.bos
    }

    pub fn eos(&self) -> Option<u32> {
        self.vocab.eos
    }

    /// End of turn: `tokenizer.ggml.eot_token_id`, or else the first of
    /// llama.cpp's end-of-turn texts the vocabulary has (`<|eot_id|>`,
    /// `<|im_end|>`, ...).
    pub fn eot(&self) -> Option<u32> {
        self.vocab.eot
    }

    pub fn eom(&self) -> Option<u32> {
        self.vocab.eom
    }

    pub fn unk(&self) -> Option<u32> {
        self.vocab.unk
    }

    pub fn pad(&self) -> Option<u32> {
        self.vocab.pad
    }

    /// Whether BOS is added by [`encode`](Self::encode).
    pub fn add_bos(&self) -> bool {
        self.vocab.add_bos
    }

    /// Whether EOS is added by [`encode`](Self::encode).
    pub fn add_eos(&self) -> bool {
        self.vocab.add_eos
    }

    /// Tokens that end a generation, sorted: EOS, EOT and EOM when set, and
    /// every token whose text is one of llama.cpp's end-of-generation texts
    /// (`<|im_end|>`, `<|eot_id|>`, `<|endoftext|>`, `<end_of_turn>`,
    /// `<｜end▁of▁sentence｜>`, ...; see `END_OF_TURN_TEXTS`). Unlike
    /// llama.cpp, fill-in-the-middle tokens (`<reponame>`, `<|file_sep|>`)
    /// are not included: they end code completions, not chat turns.
    pub fn stop_tokens(&self) -> &[u32] {
        &self.stop
    }

    /// Whether `id` is a stop token.
    pub fn is_stop(&self, id: u32) -> bool {
        self.stop.binary_search(&id).is_ok()
    }

    /// Control tokens structure the prompt (`<|im_start|>`, BOS, EOS).
    pub fn is_control(&self, id: u32) -> bool {
        self.token_kind(id) == Some(TokenKind::Control)
    }

    /// A decoder for streaming output.
    pub fn stream_decoder(&self) -> StreamDecoder<'_> {
        StreamDecoder::new(self)
    }
}

fn stop_tokens(vocab: &Vocab) -> Vec<u32> {
    let mut stop: Vec<u32> = [vocab.eos, vocab.eot, vocab.eom]
        .into_iter()
        .flatten()
        .collect();
    stop.extend(
        vocab
            .tokens
            .iter()
            .enumerate()
            .filter(|(_, t)| END_OF_TURN_TEXTS.contains(&t.as_str()))
            .map(|(i, _)| i as u32),
    );
    stop.sort_unstable();
    stop.dedup();
    stop
}
