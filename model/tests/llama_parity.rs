//! SmolLM2-135M-Instruct (llama family, Q4_1) on the CPU backend against
//! llama.cpp on the same GGUF (`fixtures/smollm2-llamacpp.json`, produced by
//! llama.cpp through llama-cpp-python 0.3.36 on its CPU backend).
//!
//! Both engines quantize activations to 8 bits per 32-value block before
//! every quantized dot product, and SmolLM2 amplifies the rounding of
//! that step chaotically: changing only the summation order of the f32
//! q·k dot products in attention moves the final logits by 0.3. Measured
//! over the reference's 42 prompt positions against an exact float64
//! evaluation of the same GGUF (`fixtures/gen_smollm2_numpy.py`), llama.cpp
//! deviates by 0.25 logits RMS (0.60 at most) and this engine by 0.30 RMS
//! (0.75 at most): both are that far from the model's exact math, in
//! different directions. So the tests check:
//!
//! - exact numerics against the float64 reference, tightly (5e-4): the
//!   forward math itself;
//! - production numerics against llama.cpp: identical prompt tokens, the
//!   same greedy continuation, the same top-2 (ranks 3 to 5 are within
//!   0.1 of each other in llama.cpp's own output, inside the noise), and
//!   llama.cpp's top-5 logits within the measured noise;
//! - production numerics against the float64 reference: deviation of the
//!   same size as llama.cpp's own, so a broken quantized path cannot hide.

mod common;

use ds4_kernels::cpu::sampling::{argmax, top_k};
use ds4_kernels::CpuBackend;
use ds4_model::chat::{ChatMessage, ChatTemplate};
use ds4_model::gguf::GgufFile;
use ds4_model::tokenizer::Tokenizer;
use ds4_model::{Logits, Model};
use serde_json::Value;

/// Two engines each up to 0.75 from the exact logits (see above) agree
/// within this at the first generated position.
const LOGIT_TOLERANCE: f32 = 0.75;
/// Leading ranks whose order must match (1.49 logits apart in llama.cpp).
const ORDERED_RANKS: usize = 2;

fn reference() -> Value {
    let text = std::fs::read_to_string(common::fixture("smollm2-llamacpp.json"))
        .expect("reference fixture");
    let v: Value = serde_json::from_str(&text).expect("reference JSON");
    v["prompts"][0].clone()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

#[test]
fn smollm2_matches_llamacpp() {
    let r = reference();
    let file = GgufFile::open(&common::model_path()).expect("open model");
    let backend = CpuBackend::new();
    let model = Model::load(&file, &backend).expect("load model");
    let tokenizer = Tokenizer::from_gguf(file.metadata()).expect("tokenizer");
    let template = ChatTemplate::from_gguf(file.metadata())
        .expect("template")
        .expect("model has a template");

    // The prompt, rendered and tokenized exactly as generation does.
    let messages = [ChatMessage {
        role: "user".into(),
        content: "What is the capital of France? Answer in one sentence.".into(),
    }];
    let prompt = template.render(&messages, true).expect("render");
    assert_eq!(prompt, r["prompt"].as_str().unwrap());
    let prompt_ids = tokenizer.encode(&prompt, true).expect("encode");
    assert_eq!(prompt_ids, ids(&r["token_ids"]));

    // First generated position: the leading ranks in llama.cpp's order, and
    // every one of llama.cpp's top-5 logits within tolerance.
    let mut seq = model.new_sequence(&backend, 512).expect("sequence");
    let logits = model
        .forward(&backend, &mut seq, &prompt_ids, Logits::Last)
        .expect("prefill");
    let want = r["first_generated_position"]["top5"].as_array().unwrap();
    let got = top_k(&logits, want.len());
    for (rank, w) in want.iter().enumerate() {
        let (wid, wlogit) = (
            w["id"].as_u64().unwrap() as u32,
            w["logit"].as_f64().unwrap() as f32,
        );
        if rank < ORDERED_RANKS {
            assert_eq!(got[rank].0, wid, "rank {rank}: token id (ours {got:?})");
        }
        let ours = logits[wid as usize];
        assert!(
            (ours - wlogit).abs() <= LOGIT_TOLERANCE,
            "rank {rank} token {wid}: logit {ours} vs llama.cpp {wlogit}"
        );
    }

    // Greedy continuation, one token per forward step, until EOS.
    let want_ids = ids(&r["greedy_argmax_continuation"]["ids"]);
    let mut got_ids = Vec::new();
    let mut next = argmax(&logits).unwrap() as u32;
    for _ in 0..want_ids.len() {
        got_ids.push(next);
        if tokenizer.stop_tokens().contains(&next) {
            break;
        }
        let l = model
            .forward(&backend, &mut seq, &[next], Logits::Last)
            .expect("decode");
        next = argmax(&l).unwrap() as u32;
    }
    assert_eq!(got_ids, want_ids);
    assert_eq!(
        tokenizer.decode(&got_ids),
        r["greedy_argmax_continuation"]["text"].as_str().unwrap()
    );
}

#[test]
fn batched_prefill_equals_token_by_token() {
    // The same tokens through one batched forward and through single-token
    // steps give the same logits (up to activation-quantization noise).
    let r = reference();
    let file = GgufFile::open(&common::model_path()).expect("open model");
    let backend = CpuBackend::new();
    let model = Model::load(&file, &backend).expect("load model");
    let prompt = ids(&r["token_ids"]);
    let mut a = model.new_sequence(&backend, 64).expect("sequence");
    let batched = model
        .forward(&backend, &mut a, &prompt, Logits::All)
        .expect("batched");
    let mut b = model.new_sequence(&backend, 64).expect("sequence");
    let n_vocab = model.info().n_vocab;
    for (i, &t) in prompt.iter().enumerate() {
        let step = model
            .forward(&backend, &mut b, &[t], Logits::Last)
            .expect("step");
        let row = &batched[i * n_vocab..(i + 1) * n_vocab];
        let max_diff = row
            .iter()
            .zip(&step)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0f32, f32::max);
        assert!(
            max_diff < 1e-3,
            "position {i}: batched and stepwise logits differ by {max_diff}"
        );
        assert_eq!(argmax(row), argmax(&step), "position {i}");
    }
}

#[test]
fn context_overflow_is_an_error_and_keeps_the_sequence() {
    let file = GgufFile::open(&common::model_path()).expect("open model");
    let backend = CpuBackend::new();
    let model = Model::load(&file, &backend).expect("load model");
    let mut seq = model.new_sequence(&backend, 4).expect("sequence");
    model
        .forward(&backend, &mut seq, &[1, 2, 3], Logits::Last)
        .expect("fits");
    let err = model
        .forward(&backend, &mut seq, &[4, 5], Logits::Last)
        .unwrap_err();
    assert!(err.to_string().contains("context"), "{err}");
    assert_eq!(seq.tokens(), &[1, 2, 3]);
    let err = model
        .forward(&backend, &mut seq, &[999_999], Logits::Last)
        .unwrap_err();
    assert!(err.to_string().contains("outside the vocabulary"), "{err}");
    assert_eq!(seq.tokens(), &[1, 2, 3]);
}

/// Exact numerics against an independent float64 NumPy evaluation of the
/// same GGUF (`fixtures/gen_smollm2_numpy.py`, built on the `gguf` package's
/// dequantization): every prompt position's top-5 and probe logits. This
/// checks the forward math itself (RoPE layout, grouped-query attention,
/// norms, tied output) far more tightly than the llama.cpp comparison can.
#[test]
fn exact_numerics_match_float64_reference() {
    let text = std::fs::read_to_string(common::fixture("smollm2-numpy-f64.json")).expect("fixture");
    let r: Value = serde_json::from_str(&text).expect("fixture JSON");
    let file = GgufFile::open(&common::model_path()).expect("open model");
    let backend = CpuBackend::with_numerics(ds4_kernels::Numerics::Exact);
    let model = Model::load(&file, &backend).expect("load model");
    let prompt = ids(&r["token_ids"]);
    let probe = ids(&r["probe_ids"]);
    let mut seq = model.new_sequence(&backend, 64).expect("sequence");
    let logits = model
        .forward(&backend, &mut seq, &prompt, Logits::All)
        .expect("forward");
    let n_vocab = model.info().n_vocab;
    let mut worst = 0.0f32;
    for p in r["positions"].as_array().unwrap() {
        let i = p["pos"].as_u64().unwrap() as usize;
        let row = &logits[i * n_vocab..(i + 1) * n_vocab];
        let top = p["top5"].as_array().unwrap();
        assert_eq!(
            argmax(row),
            Some(top[0]["id"].as_u64().unwrap() as usize),
            "position {i}: argmax"
        );
        let pairs = top
            .iter()
            .map(|t| {
                (
                    t["id"].as_u64().unwrap() as usize,
                    t["logit"].as_f64().unwrap() as f32,
                )
            })
            .chain(
                probe
                    .iter()
                    .zip(p["probe"].as_array().unwrap())
                    .map(|(&id, l)| (id as usize, l.as_f64().unwrap() as f32)),
            );
        for (id, want) in pairs {
            let diff = (row[id] - want).abs();
            worst = worst.max(diff);
            assert!(
                diff < 5e-4,
                "position {i} token {id}: {} vs float64 {want}",
                row[id]
            );
        }
    }
    eprintln!("largest difference from the float64 reference: {worst:.2e}");
}

/// Production numerics (8-bit activations, f16 KV cache) stay as close to
/// the exact float64 logits as llama.cpp does: over all 42 prompt
/// positions, the top-1 logit deviates by at most 0.4 RMS and 1.0 at worst
/// (llama.cpp: 0.25 and 0.60; this engine: 0.30 and 0.75 when written).
#[test]
fn production_numerics_stay_near_float64_reference() {
    let text = std::fs::read_to_string(common::fixture("smollm2-numpy-f64.json")).expect("fixture");
    let r: Value = serde_json::from_str(&text).expect("fixture JSON");
    let file = GgufFile::open(&common::model_path()).expect("open model");
    let backend = CpuBackend::new();
    let model = Model::load(&file, &backend).expect("load model");
    let prompt = ids(&r["token_ids"]);
    let mut seq = model.new_sequence(&backend, 64).expect("sequence");
    let logits = model
        .forward(&backend, &mut seq, &prompt, Logits::All)
        .expect("forward");
    let n_vocab = model.info().n_vocab;
    let (mut sq, mut worst) = (0.0f32, 0.0f32);
    let positions = r["positions"].as_array().unwrap();
    for p in positions {
        let i = p["pos"].as_u64().unwrap() as usize;
        let top = &p["top5"][0];
        let d = logits[i * n_vocab + top["id"].as_u64().unwrap() as usize]
            - top["logit"].as_f64().unwrap() as f32;
        sq += d * d;
        worst = worst.max(d.abs());
    }
    let rms = (sq / positions.len() as f32).sqrt();
    eprintln!("production vs float64: rms {rms:.3}, max {worst:.3}");
    assert!(
        rms <= 0.4 && worst <= 1.0,
        "production numerics drift: rms {rms}, max {worst}"
    );
}
