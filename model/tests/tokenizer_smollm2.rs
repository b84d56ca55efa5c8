//! The tokenizer on the real SmolLM2 GGUF, against references produced
//! without this crate:
//! - `fixtures/smollm2-llamacpp.json`: llama.cpp's own ids for the chat
//!   prompt;
//! - `fixtures/smollm2-tokenizer-cases.json`: tricky strings, ids from an
//!   independent Python port of llama.cpp's tokenizer cross-checked with
//!   Hugging Face `tokenizers` (`fixtures/gen_smollm2_tokenizer_cases.py`).
//!
//! The model is found through `DS4_TEST_MODEL` or as `ds4.gguf` in a parent
//! folder of this crate; run `./scripts/fetch-model.sh` to get it.

mod common;
use common::{model_path, smollm2_tokenizer as tokenizer};

use std::time::Instant;

use ds4_model::gguf::GgufFile;
use ds4_model::tokenizer::{TokenKind, Tokenizer};
use serde::Deserialize;

#[derive(Deserialize)]
struct LlamaCppReference {
    prompts: Vec<ReferencePrompt>,
}

#[derive(Deserialize)]
struct ReferencePrompt {
    name: String,
    prompt: String,
    add_bos: bool,
    parse_special: bool,
    token_ids: Vec<u32>,
    tokens: Vec<String>,
}

#[derive(Deserialize)]
struct Cases {
    add_bos: bool,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    name: String,
    text: String,
    parse_special: bool,
    ids: Vec<u32>,
}

fn llama_cpp_reference() -> LlamaCppReference {
    serde_json::from_str(include_str!("fixtures/smollm2-llamacpp.json")).unwrap()
}

#[test]
fn vocabulary_and_special_tokens() {
    let tok = tokenizer();
    assert_eq!(tok.vocab_size(), 49152);
    assert_eq!(tok.bos(), Some(1));
    assert_eq!(tok.eos(), Some(2));
    assert_eq!(tok.eot(), Some(2), "<|im_end|> ends a ChatML turn");
    assert!(!tok.add_bos() && !tok.add_eos());
    // <|endoftext|> and <|im_end|>.
    assert_eq!(tok.stop_tokens(), [0, 2]);
    assert_eq!(tok.token_id("<|im_start|>"), Some(1));
    assert_eq!(tok.token_str(2), Some("<|im_end|>"));
    assert_eq!(tok.token_id("Ġthe"), Some(260));
    assert_eq!(tok.token_bytes(260), b" the");
    assert!(tok.is_control(1) && !tok.is_control(260));
    assert_eq!(tok.token_kind(260), Some(TokenKind::Normal));
    assert_eq!(tok.token_bytes(u32::MAX), b"");
}

#[test]
fn chat_prompt_matches_llama_cpp_ids() {
    let tok = tokenizer();
    for p in llama_cpp_reference().prompts {
        assert_eq!(tok.add_bos(), p.add_bos, "{}", p.name);
        let ids = tok.encode(&p.prompt, p.parse_special).unwrap();
        assert_eq!(ids, p.token_ids, "{}: ids differ from llama.cpp", p.name);
        // llama.cpp's pieces, token by token.
        let pieces: Vec<String> = ids
            .iter()
            .map(|&id| String::from_utf8_lossy(tok.token_bytes(id)).into_owned())
            .collect();
        assert_eq!(pieces, p.tokens, "{}", p.name);
        assert_eq!(
            tok.decode(&p.token_ids),
            p.prompt,
            "{}: decode must round-trip",
            p.name
        );
    }
}

#[test]
fn tricky_strings_match_the_independent_reference() {
    let tok = tokenizer();
    let fixture: Cases =
        serde_json::from_str(include_str!("fixtures/smollm2-tokenizer-cases.json")).unwrap();
    assert_eq!(tok.add_bos(), fixture.add_bos);
    assert!(fixture.cases.len() >= 15);
    let mut failures = Vec::new();
    for case in &fixture.cases {
        let ids = tok.encode(&case.text, case.parse_special).unwrap();
        if ids != case.ids {
            failures.push(format!(
                "{}: got {ids:?}, expected {:?}",
                case.name, case.ids
            ));
        }
        assert_eq!(
            tok.decode(&case.ids),
            case.text,
            "{}: decode must round-trip",
            case.name
        );
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn digits_are_split_one_per_token() {
    let tok = tokenizer();
    let ids = tok.encode("12345", false).unwrap();
    let pieces: Vec<&[u8]> = ids.iter().map(|&id| tok.token_bytes(id)).collect();
    assert_eq!(pieces, [b"1", b"2", b"3", b"4", b"5"]);
}

#[test]
fn special_tokens_only_parsed_when_asked() {
    let tok = tokenizer();
    let text = "<|im_start|>user";
    let parsed = tok.encode(text, true).unwrap();
    assert_eq!(parsed[0], 1);
    let plain = tok.encode(text, false).unwrap();
    assert!(!plain.contains(&1) && plain.len() > 3, "{plain:?}");
    assert_eq!(tok.decode(&plain), text);
}

#[test]
fn stream_decoder_on_emoji_split_over_tokens() {
    let tok = tokenizer();
    let text = "Hi 👋🏽 日本 ✓";
    let ids = tok.encode(text, false).unwrap();
    let mut stream = tok.stream_decoder();
    let mut out = String::new();
    let mut held = 0;
    for &id in &ids {
        let piece = stream.push(id);
        assert!(
            !piece.contains('\u{FFFD}'),
            "no replacement characters mid-stream: {piece:?}"
        );
        if piece.is_empty() && stream.has_pending() {
            held += 1;
        }
        out.push_str(&piece);
    }
    out.push_str(&stream.finish());
    assert_eq!(out, text);
    assert!(
        held > 0,
        "the emoji should have been split over byte tokens: {ids:?}"
    );
    // Each token alone is not valid UTF-8 for at least one of them.
    assert!(ids
        .iter()
        .any(|&id| std::str::from_utf8(tok.token_bytes(id)).is_err()));
}

/// Construction and encoding speed, printed (a benchmark, not a test).
/// Run in release with
/// `cargo test --release -p ds4-model --test tokenizer_smollm2 -- --ignored --nocapture speed`.
#[test]
#[ignore = "benchmark: prints tokenizer speed"]
fn speed() {
    let path = model_path();
    let file = GgufFile::open(&path).unwrap();
    let t0 = Instant::now();
    let tok = Tokenizer::from_gguf(file.metadata()).unwrap();
    let build = t0.elapsed();

    // Repetitive text (the BPE word cache helps) ...
    let mut text = String::new();
    let cases: Cases =
        serde_json::from_str(include_str!("fixtures/smollm2-tokenizer-cases.json")).unwrap();
    for case in cases.cases {
        text.push_str(&case.text);
        text.push('\n');
    }
    text.push_str(&llama_cpp_reference().prompts[0].prompt);
    let repetitive = text.repeat(200);
    // ... and text of pseudo-random vocabulary pieces, where few words repeat.
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut bytes = Vec::new();
    for _ in 0..60_000 {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let id = (state % tok.vocab_size() as u64) as u32;
        if !tok.is_control(id) {
            bytes.extend_from_slice(tok.token_bytes(id));
        }
    }
    let diverse = String::from_utf8_lossy(&bytes).into_owned();

    let mut report = format!("tokenizer build: {:.1} ms", build.as_secs_f64() * 1e3);
    for (name, corpus) in [("repetitive", &repetitive), ("diverse", &diverse)] {
        let t1 = Instant::now();
        let ids = tok.encode(corpus, true).unwrap();
        let took = t1.elapsed().as_secs_f64();
        report.push_str(&format!(
            "; encode {name}: {} tokens ({} bytes) in {:.1} ms = {:.0} tokens/s",
            ids.len(),
            corpus.len(),
            took * 1e3,
            ids.len() as f64 / took
        ));
    }
    println!("{report}");
}
