//! The vocabulary as GGUF states it: token strings, token types, special
//! token ids and the BOS/EOS flags, read with a typed error for every key
//! that is missing, of the wrong type, or out of range.

use crate::gguf::{MetaValue, Metadata};

use super::TokenizerError;

pub(crate) const KEY_MODEL: &str = "tokenizer.ggml.model";
pub(crate) const KEY_PRE: &str = "tokenizer.ggml.pre";
pub(crate) const KEY_TOKENS: &str = "tokenizer.ggml.tokens";
pub(crate) const KEY_TOKEN_TYPE: &str = "tokenizer.ggml.token_type";
pub(crate) const KEY_MERGES: &str = "tokenizer.ggml.merges";
const KEY_BOS: &str = "tokenizer.ggml.bos_token_id";
const KEY_EOS: &str = "tokenizer.ggml.eos_token_id";
const KEY_EOT: &str = "tokenizer.ggml.eot_token_id";
const KEY_EOM: &str = "tokenizer.ggml.eom_token_id";
const KEY_UNK: &str = "tokenizer.ggml.unknown_token_id";
const KEY_PAD: &str = "tokenizer.ggml.padding_token_id";
const KEY_ADD_BOS: &str = "tokenizer.ggml.add_bos_token";
const KEY_ADD_EOS: &str = "tokenizer.ggml.add_eos_token";

/// A token's type, as `tokenizer.ggml.token_type` numbers it (llama.cpp's
/// `llama_token_type`). Unknown numbers read as [`TokenKind::Undefined`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenKind {
    Undefined,
    Normal,
    Unknown,
    /// Chat and document structure (`<|im_start|>`, BOS, EOS): matched in
    /// text only when special tokens are parsed.
    Control,
    /// Added by the model's authors; always matched in text.
    UserDefined,
    Unused,
    Byte,
}

impl TokenKind {
    fn from_gguf(v: i64) -> TokenKind {
        match v {
            1 => TokenKind::Normal,
            2 => TokenKind::Unknown,
            3 => TokenKind::Control,
            4 => TokenKind::UserDefined,
            5 => TokenKind::Unused,
            6 => TokenKind::Byte,
            _ => TokenKind::Undefined,
        }
    }
}

/// Token texts that end a turn or a generation, as llama.cpp lists them
/// for its end-of-generation set (`src/llama-vocab.cpp`), without the
/// fill-in-the-middle tokens, which only end code completions.
pub(crate) const END_OF_TURN_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<｜end▁of▁sentence｜>",
];

/// Texts llama.cpp takes as the end-of-turn token when `eot_token_id` is
/// absent.
const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];

/// The vocabulary read from metadata.
#[derive(Debug)]
pub(crate) struct Vocab {
    pub tokens: Vec<String>,
    pub kinds: Vec<TokenKind>,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub eot: Option<u32>,
    pub eom: Option<u32>,
    pub unk: Option<u32>,
    pub pad: Option<u32>,
    pub add_bos: bool,
    pub add_eos: bool,
}

impl Vocab {
    /// Read the vocabulary; `default_add_bos` is the family's default when
    /// `add_bos_token` is absent.
    pub fn from_gguf(meta: &Metadata, default_add_bos: bool) -> Result<Vocab, TokenizerError> {
        let tokens = string_array(meta, KEY_TOKENS)?;
        if tokens.is_empty() {
            return Err(TokenizerError::EmptyVocab);
        }
        if u32::try_from(tokens.len()).is_err() {
            return Err(TokenizerError::VocabTooLarge {
                count: tokens.len(),
            });
        }
        let mut tokens: Vec<String> = tokens.into_iter().map(str::to_string).collect();
        for (i, t) in tokens.iter_mut().enumerate() {
            if t.is_empty() {
                // As llama.cpp does: an empty token can never be produced by
                // BPE; give it a unique printable name.
                *t = format!("[EMPTY_{i}]");
            }
        }
        let n = tokens.len();

        let mut kinds = vec![TokenKind::Normal; n];
        if let Some(value) = meta.get(KEY_TOKEN_TYPE) {
            let items = value
                .as_array()
                .ok_or_else(|| wrong_type(KEY_TOKEN_TYPE, "array of i32", value))?;
            if items.len() < n {
                return Err(TokenizerError::LengthMismatch {
                    key: KEY_TOKEN_TYPE,
                    expected: n,
                    found: items.len(),
                });
            }
            for (index, (item, kind)) in items.iter().zip(kinds.iter_mut()).enumerate() {
                let v = item.as_i64().ok_or(TokenizerError::WrongElementType {
                    key: KEY_TOKEN_TYPE,
                    index,
                    expected: "an integer",
                    found: item.type_name(),
                })?;
                *kind = TokenKind::from_gguf(v);
            }
        }

        let mut vocab = Vocab {
            bos: token_id(meta, KEY_BOS, n)?,
            eos: token_id(meta, KEY_EOS, n)?,
            eot: token_id(meta, KEY_EOT, n)?,
            eom: token_id(meta, KEY_EOM, n)?,
            unk: token_id(meta, KEY_UNK, n)?,
            pad: token_id(meta, KEY_PAD, n)?,
            add_bos: flag(meta, KEY_ADD_BOS)?.unwrap_or(default_add_bos),
            add_eos: flag(meta, KEY_ADD_EOS)?.unwrap_or(false),
            tokens,
            kinds,
        };
        if vocab.add_bos && vocab.bos.is_none() {
            return Err(TokenizerError::MissingSpecialToken {
                flag: KEY_ADD_BOS,
                id_key: KEY_BOS,
            });
        }
        if vocab.add_eos && vocab.eos.is_none() {
            return Err(TokenizerError::MissingSpecialToken {
                flag: KEY_ADD_EOS,
                id_key: KEY_EOS,
            });
        }
        vocab.mark_end_of_turn_tokens();
        Ok(vocab)
    }

    /// As llama.cpp does: find EOT by its text when the key is absent, and
    /// make every end-of-turn token a control token even if the converter
    /// typed it otherwise.
    fn mark_end_of_turn_tokens(&mut self) {
        if self.eot.is_none() {
            // The first text of the list that the vocabulary has, so that a
            // ChatML model gets `<|im_end|>` rather than `<|endoftext|>`.
            self.eot = EOT_TEXTS
                .iter()
                .find_map(|want| self.tokens.iter().position(|t| t == want))
                .map(|i| i as u32);
        }
        for (text, kind) in self.tokens.iter().zip(self.kinds.iter_mut()) {
            if END_OF_TURN_TEXTS.contains(&text.as_str()) && *kind != TokenKind::Control {
                tracing::warn!(token = %text, "end-of-turn token is not typed as control; treating it as control");
                *kind = TokenKind::Control;
            }
        }
    }
}

fn wrong_type(key: &'static str, expected: &'static str, value: &MetaValue) -> TokenizerError {
    let found = match value {
        MetaValue::Array(items) => match items.first() {
            Some(first) => format!("an array of {}", first.type_name()),
            None => "an empty array".to_string(),
        },
        other => format!("a {}", other.type_name()),
    };
    TokenizerError::WrongType {
        key,
        expected,
        found,
    }
}

/// A required string, e.g. `tokenizer.ggml.model`.
pub(crate) fn required_str<'m>(
    meta: &'m Metadata,
    key: &'static str,
) -> Result<&'m str, TokenizerError> {
    let value = meta.get(key).ok_or(TokenizerError::MissingKey { key })?;
    value
        .as_str()
        .ok_or_else(|| wrong_type(key, "a string", value))
}

/// A required array of strings, e.g. `tokenizer.ggml.tokens`.
pub(crate) fn string_array<'m>(
    meta: &'m Metadata,
    key: &'static str,
) -> Result<Vec<&'m str>, TokenizerError> {
    let value = meta.get(key).ok_or(TokenizerError::MissingKey { key })?;
    let items = value
        .as_array()
        .ok_or_else(|| wrong_type(key, "an array of strings", value))?;
    items
        .iter()
        .enumerate()
        .map(|(index, item)| {
            item.as_str().ok_or(TokenizerError::WrongElementType {
                key,
                index,
                expected: "a string",
                found: item.type_name(),
            })
        })
        .collect()
}

fn token_id(
    meta: &Metadata,
    key: &'static str,
    vocab_size: usize,
) -> Result<Option<u32>, TokenizerError> {
    let Some(value) = meta.get(key) else {
        return Ok(None);
    };
    let id = match value.as_i64() {
        Some(v) if v < 0 => return Ok(None), // -1: explicitly unset
        Some(v) => v as u64,
        None => value
            .as_u64()
            .ok_or_else(|| wrong_type(key, "an integer", value))?,
    };
    if id >= vocab_size as u64 {
        return Err(TokenizerError::IdOutOfRange {
            key,
            id,
            vocab_size,
        });
    }
    Ok(Some(id as u32))
}

fn flag(meta: &Metadata, key: &'static str) -> Result<Option<bool>, TokenizerError> {
    match meta.get(key) {
        None => Ok(None),
        Some(MetaValue::Bool(b)) => Ok(Some(*b)),
        Some(other) => Err(wrong_type(key, "a bool", other)),
    }
}
