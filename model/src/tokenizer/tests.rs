//! Tokenizer tests on a small synthetic vocabulary written as a GGUF
//! header: construction errors for broken metadata, and encoding rules
//! that do not need the real model.

use super::*;
use crate::gguf::writer::write_gguf;
use crate::gguf::{parse_header, MetaValue, DEFAULT_ALIGNMENT};

/// The 256 byte-level characters, then a few merged tokens and specials.
fn base_tokens() -> Vec<String> {
    let mut tokens: Vec<String> = (0..=255u8)
        .map(|b| {
            let cp = match b {
                0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF => u32::from(b),
                _ => {
                    0x100
                        + (0..b)
                            .filter(|x| !matches!(x, 0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF))
                            .count() as u32
                }
            };
            char::from_u32(cp).unwrap().to_string()
        })
        .collect();
    for t in ["Ġt", "he", "Ġthe", "<|im_start|>", "<|im_end|>", "<tool>"] {
        tokens.push(t.to_string());
    }
    tokens
}

const N_BASE: u32 = 256;
const ID_GT: u32 = N_BASE; // "Ġt"
const ID_THE: u32 = N_BASE + 2; // "Ġthe"
const ID_IM_START: u32 = N_BASE + 3;
const ID_IM_END: u32 = N_BASE + 4;
const ID_TOOL: u32 = N_BASE + 5;

fn strings(v: &[&str]) -> MetaValue {
    MetaValue::Array(v.iter().map(|s| MetaValue::String(s.to_string())).collect())
}

/// A valid tokenizer header; `edit` changes it before it is written.
fn metadata(edit: impl FnOnce(&mut Vec<(String, MetaValue)>)) -> Metadata {
    let tokens = base_tokens();
    let mut types = vec![MetaValue::I32(1); tokens.len()];
    types[ID_IM_START as usize] = MetaValue::I32(3);
    types[ID_IM_END as usize] = MetaValue::I32(3);
    types[ID_TOOL as usize] = MetaValue::I32(4);
    let mut kv: Vec<(String, MetaValue)> = vec![
        (
            "tokenizer.ggml.model".into(),
            MetaValue::String("gpt2".into()),
        ),
        (
            "tokenizer.ggml.pre".into(),
            MetaValue::String("smollm".into()),
        ),
        (
            "tokenizer.ggml.tokens".into(),
            MetaValue::Array(tokens.into_iter().map(MetaValue::String).collect()),
        ),
        ("tokenizer.ggml.token_type".into(), MetaValue::Array(types)),
        (
            "tokenizer.ggml.merges".into(),
            strings(&["Ġ t", "h e", "Ġt he"]),
        ),
        (
            "tokenizer.ggml.bos_token_id".into(),
            MetaValue::U32(ID_IM_START),
        ),
        (
            "tokenizer.ggml.eos_token_id".into(),
            MetaValue::U32(ID_IM_END),
        ),
        (
            "tokenizer.ggml.add_bos_token".into(),
            MetaValue::Bool(false),
        ),
    ];
    edit(&mut kv);
    let bytes = write_gguf(&kv, &[], DEFAULT_ALIGNMENT);
    parse_header(&bytes).expect("test header parses").metadata
}

fn set(kv: &mut Vec<(String, MetaValue)>, key: &str, value: MetaValue) {
    match kv.iter_mut().find(|(k, _)| k == key) {
        Some(slot) => slot.1 = value,
        None => kv.push((key.to_string(), value)),
    }
}

fn remove(kv: &mut Vec<(String, MetaValue)>, key: &str) {
    kv.retain(|(k, _)| k != key);
}

fn build_err(edit: impl FnOnce(&mut Vec<(String, MetaValue)>)) -> TokenizerError {
    Tokenizer::from_gguf(&metadata(edit)).expect_err("broken metadata must be refused")
}

#[test]
fn is_shareable_between_threads() {
    fn check<T: Send + Sync>() {}
    check::<Tokenizer>();
}

#[test]
fn synthetic_vocab_encodes_and_decodes() {
    let tok = Tokenizer::from_gguf(&metadata(|_| {})).unwrap();
    assert_eq!(tok.vocab_size(), 262);
    assert_eq!(tok.encode(" the", false).unwrap(), [ID_THE]);
    // Token i < 256 is byte i; "h" is 0x68.
    assert_eq!(tok.encode(" th", false).unwrap(), [ID_GT, 0x68]);
    let ids = tok.encode("<|im_start|> the<|im_end|>", true).unwrap();
    assert_eq!(ids, [ID_IM_START, ID_THE, ID_IM_END]);
    assert_eq!(tok.decode(&ids), "<|im_start|> the<|im_end|>");
    // Control tokens stay text without parse_special; user-defined ones do not.
    let ids = tok.encode("<|im_end|><tool>", false).unwrap();
    assert!(!ids.contains(&ID_IM_END));
    assert_eq!(ids.last(), Some(&ID_TOOL));
    assert_eq!(tok.decode(&ids), "<|im_end|><tool>");
    assert_eq!(tok.stop_tokens(), [ID_IM_END]);
    assert!(tok.is_control(ID_IM_START) && !tok.is_control(ID_TOOL));
}

#[test]
fn bos_and_eos_follow_the_flags() {
    let tok = Tokenizer::from_gguf(&metadata(|kv| {
        set(kv, "tokenizer.ggml.add_bos_token", MetaValue::Bool(true));
        set(kv, "tokenizer.ggml.add_eos_token", MetaValue::Bool(true));
    }))
    .unwrap();
    assert_eq!(
        tok.encode(" the", false).unwrap(),
        [ID_IM_START, ID_THE, ID_IM_END]
    );
    assert_eq!(tok.encode_with(" the", false, false).unwrap(), [ID_THE]);
}

#[test]
fn missing_keys_are_named() {
    for key in [
        "tokenizer.ggml.model",
        "tokenizer.ggml.pre",
        "tokenizer.ggml.tokens",
        "tokenizer.ggml.merges",
    ] {
        let err = build_err(|kv| remove(kv, key));
        assert!(
            matches!(&err, TokenizerError::MissingKey { key: k } if *k == key),
            "{key}: {err:?}"
        );
        assert!(err.to_string().contains(key));
    }
}

#[test]
fn wrong_types_are_refused() {
    let err = build_err(|kv| {
        set(
            kv,
            "tokenizer.ggml.tokens",
            MetaValue::Array(vec![MetaValue::U32(1)]),
        )
    });
    assert!(
        matches!(
            &err,
            TokenizerError::WrongElementType {
                key: "tokenizer.ggml.tokens",
                index: 0,
                ..
            }
        ),
        "{err:?}"
    );
    let err = build_err(|kv| set(kv, "tokenizer.ggml.merges", MetaValue::String("Ġ t".into())));
    assert!(
        matches!(
            &err,
            TokenizerError::WrongType {
                key: "tokenizer.ggml.merges",
                ..
            }
        ),
        "{err:?}"
    );
    let err = build_err(|kv| set(kv, "tokenizer.ggml.add_bos_token", MetaValue::U8(1)));
    assert!(
        matches!(
            &err,
            TokenizerError::WrongType {
                key: "tokenizer.ggml.add_bos_token",
                ..
            }
        ),
        "{err:?}"
    );
    let err = build_err(|kv| {
        set(
            kv,
            "tokenizer.ggml.token_type",
            MetaValue::Array(vec![MetaValue::I32(1); 3]),
        )
    });
    assert!(
        matches!(
            &err,
            TokenizerError::LengthMismatch {
                key: "tokenizer.ggml.token_type",
                expected: 262,
                found: 3
            }
        ),
        "{err:?}"
    );
}

#[test]
fn unknown_model_and_pre_are_named() {
    let err = build_err(|kv| {
        set(
            kv,
            "tokenizer.ggml.model",
            MetaValue::String("llama".into()),
        )
    });
    assert!(
        matches!(&err, TokenizerError::UnsupportedModel { model, .. } if model == "llama"),
        "{err:?}"
    );
    let err = build_err(|kv| {
        set(
            kv,
            "tokenizer.ggml.pre",
            MetaValue::String("mystery-7b".into()),
        )
    });
    assert!(matches!(&err, TokenizerError::UnknownPreTokenizer { pre, .. } if pre == "mystery-7b"));
    assert!(err.to_string().contains("`mystery-7b`"), "{err}");
}

#[test]
fn bad_merges_are_refused() {
    let err = build_err(|kv| set(kv, "tokenizer.ggml.merges", strings(&["Ġ t", "he"])));
    assert!(
        matches!(&err, TokenizerError::BadMerge { index: 1, merge } if merge == "he"),
        "{err:?}"
    );
    let err = build_err(|kv| set(kv, "tokenizer.ggml.merges", strings(&["x yz"])));
    assert!(
        matches!(&err, TokenizerError::MergeNotInVocab { index: 0, token, .. } if token == "yz"),
        "{err:?}"
    );
    let err = build_err(|kv| set(kv, "tokenizer.ggml.merges", strings(&["x y"])));
    assert!(
        matches!(&err, TokenizerError::MergeNotInVocab { token, .. } if token == "xy"),
        "{err:?}"
    );
}

#[test]
fn ids_out_of_range_and_inconsistent_flags_are_refused() {
    let err = build_err(|kv| set(kv, "tokenizer.ggml.bos_token_id", MetaValue::U32(100_000)));
    assert!(
        matches!(
            &err,
            TokenizerError::IdOutOfRange {
                key: "tokenizer.ggml.bos_token_id",
                id: 100_000,
                vocab_size: 262
            }
        ),
        "{err:?}"
    );
    let err = build_err(|kv| {
        remove(kv, "tokenizer.ggml.eos_token_id");
        set(kv, "tokenizer.ggml.add_eos_token", MetaValue::Bool(true));
    });
    assert!(
        matches!(&err, TokenizerError::MissingSpecialToken { .. }),
        "{err:?}"
    );
}

#[test]
fn duplicate_and_empty_vocabularies_are_refused() {
    let err = build_err(|kv| {
        let mut tokens = base_tokens();
        tokens.push("he".into());
        set(
            kv,
            "tokenizer.ggml.tokens",
            MetaValue::Array(tokens.into_iter().map(MetaValue::String).collect()),
        );
        remove(kv, "tokenizer.ggml.token_type");
    });
    assert!(
        matches!(&err, TokenizerError::DuplicateToken { text, first: 257, second: 262 } if text == "he"),
        "{err:?}"
    );
    let err = build_err(|kv| {
        set(kv, "tokenizer.ggml.tokens", MetaValue::Array(vec![]));
        remove(kv, "tokenizer.ggml.token_type");
    });
    assert!(matches!(err, TokenizerError::EmptyVocab), "{err:?}");
}

#[test]
fn stream_decoder_holds_split_characters() {
    let tok = Tokenizer::from_gguf(&metadata(|_| {})).unwrap();
    // "é" is 0xC3 0xA9: without a merge it is two byte tokens.
    let ids = tok.encode("é!", false).unwrap();
    assert_eq!(ids.len(), 3);
    let mut stream = tok.stream_decoder();
    assert_eq!(stream.push(ids[0]), "");
    assert!(stream.has_pending());
    assert_eq!(stream.push(ids[1]), "é");
    assert_eq!(stream.push(ids[2]), "!");
    assert_eq!(stream.finish(), "");

    // An unfinished character at the end becomes U+FFFD, as decode does.
    let mut stream = tok.stream_decoder();
    assert_eq!(stream.push(ids[0]), "");
    assert_eq!(stream.finish(), "\u{FFFD}");
    // A broken sequence is replaced and the text after it kept.
    let mut stream = tok.stream_decoder();
    assert_eq!(stream.push(ids[0]), "");
    assert_eq!(stream.push(ids[2]), "\u{FFFD}!");
    assert_eq!(tok.decode(&[ids[0], ids[2]]), "\u{FFFD}!");
}
