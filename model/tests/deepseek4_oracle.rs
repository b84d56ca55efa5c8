//! DeepSeek V4 on the CPU reference backend against independent
//! implementations, on the miniature Flash-layout model (5 layers, width
//! 256, ratios [0, 0, 4, 128, 4], seed 1234).
//!
//! The model is generated at test time by the committed generator
//! (`fixtures/deepseek4/gen_ds4_tiny.py`, run by `scripts/gen-ds4-tiny.sh`;
//! `DS4_TINY_DIR` names the folder holding `ds4-tiny.gguf`). The reference
//! logits are llama.cpp's (exact mode: F32 weights, F32 cache, no flash
//! attention; and default numerics on the q2 file), trimmed by
//! `fixtures/deepseek4/trim_logits.py`; `fixtures/deepseek4/README.md`
//! has the commands. In exact mode llama.cpp and a float64 NumPy
//! implementation agree to 7.6e-6 over 600 tokens.

mod deepseek4_common;

use ds4_kernels::{CpuBackend, Numerics};
use ds4_model::gguf::GgufFile;
use ds4_model::{Logits, Model};
use serde_json::Value;

/// Exact numerics: our f32 forward against llama.cpp's f32 mode.
const EXACT_TOL: f32 = 1e-4;

fn load(file: &str, numerics: Numerics) -> (Model<CpuBackend>, CpuBackend) {
    let be = CpuBackend::with_numerics(numerics);
    let f =
        GgufFile::open(&deepseek4_common::tiny_dir().join(file)).expect("open the miniature model");
    let m = Model::load(&f, &be).expect("the miniature model passes the deepseek4 contract");
    (m, be)
}

struct Reference {
    tokens: Vec<u32>,
    positions: Vec<Value>,
}

fn reference(name: &str) -> Reference {
    let path = deepseek4_common::fixture(name);
    let v: Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("fixture")).expect("json");
    Reference {
        tokens: v["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_u64().unwrap() as u32)
            .collect(),
        positions: v["positions"].as_array().unwrap().clone(),
    }
}

#[derive(Debug, Default)]
struct Diff {
    max_abs: f32,
    sum_abs: f64,
    n: usize,
    argmax_agree: usize,
    argmax_checked: usize,
}

/// Compare our logits (`n_pos × n_vocab`) with every value the trimmed
/// reference keeps. Argmax is checked where the reference's top-2 margin
/// exceeds `argmax_margin`.
fn compare(ours: &[f32], n_vocab: usize, r: &Reference, argmax_margin: f64) -> Diff {
    let mut d = Diff::default();
    assert_eq!(ours.len(), r.positions.len() * n_vocab);
    for (i, p) in r.positions.iter().enumerate() {
        let row = &ours[i * n_vocab..(i + 1) * n_vocab];
        let mut add = |id: usize, want: f64| {
            let e = (row[id] as f64 - want).abs() as f32;
            d.max_abs = d.max_abs.max(e);
            d.sum_abs += e as f64;
            d.n += 1;
        };
        if let Some(full) = p["logits"].as_array() {
            for (id, v) in full.iter().enumerate() {
                add(id, v.as_f64().unwrap());
            }
        }
        for pair in p["top"].as_array().unwrap() {
            add(
                pair[0].as_u64().unwrap() as usize,
                pair[1].as_f64().unwrap(),
            );
        }
        if p["margin"].as_f64().unwrap() > argmax_margin {
            d.argmax_checked += 1;
            let ours_arg = row
                .iter()
                .enumerate()
                .fold(
                    (0, f32::NEG_INFINITY),
                    |b, (j, &v)| if v > b.1 { (j, v) } else { b },
                )
                .0;
            if ours_arg as u64 == p["argmax"].as_u64().unwrap() {
                d.argmax_agree += 1;
            }
        }
    }
    d
}

fn run(m: &Model<CpuBackend>, be: &CpuBackend, tokens: &[u32], decode: bool) -> Vec<f32> {
    let mut seq = m.new_sequence(be, tokens.len());
    if decode {
        tokens
            .iter()
            .flat_map(|&t| m.forward(be, &mut seq, &[t], Logits::Last).unwrap())
            .collect()
    } else {
        m.forward(be, &mut seq, tokens, Logits::All).unwrap()
    }
}

fn check_exact(fixture: &str, decode: bool) {
    let (m, be) = load("ds4-tiny.gguf", Numerics::Exact);
    let r = reference(fixture);
    let ours = run(&m, &be, &r.tokens, decode);
    let d = compare(&ours, m.info().n_vocab, &r, 1e-3);
    eprintln!(
        "{fixture} decode={decode}: {d:?} mean {:.3e}",
        d.sum_abs / d.n as f64
    );
    assert!(
        d.max_abs < EXACT_TOL,
        "max |Δlogit| {} exceeds {EXACT_TOL}",
        d.max_abs
    );
    assert_eq!(d.argmax_agree, d.argmax_checked);
}

#[test]
fn exact_prefill_64_matches_llamacpp_f32() {
    check_exact("logits-f32-64.trim.json", false);
}

#[test]
fn exact_prefill_600_matches_llamacpp_f32() {
    check_exact("logits-f32-600.trim.json", false);
}

#[test]
fn exact_decode_600_matches_llamacpp_f32() {
    check_exact("logits-f32-600.trim.json", true);
}

#[test]
fn chunked_prefill_equals_one_prefill() {
    let (m, be) = load("ds4-tiny.gguf", Numerics::Exact);
    let r = reference("logits-f32-600.trim.json");
    let tokens = &r.tokens[..300];
    let whole = run(&m, &be, tokens, false);
    let mut seq = m.new_sequence(&be, tokens.len());
    let chunked: Vec<f32> = tokens
        .chunks(37)
        .flat_map(|c| m.forward(&be, &mut seq, c, Logits::All).unwrap())
        .collect();
    assert_eq!(whole, chunked);
}

#[test]
fn truncation_recomputes_the_kept_prefix() {
    let (m, be) = load("ds4-tiny.gguf", Numerics::Exact);
    let r = reference("logits-f32-64.trim.json");
    let t = &r.tokens;
    let mut seq = m.new_sequence(&be, 64);
    let direct = m.forward(&be, &mut seq, t, Logits::Last).unwrap();
    seq.truncate(&be, 21);
    assert_eq!(seq.tokens(), &t[..21]);
    let again = m.forward(&be, &mut seq, &t[21..], Logits::Last).unwrap();
    assert_eq!(direct, again);
}

/// Production numerics: Q8_0/Q8_K activation quantization, F16 caches, and
/// (all on) the reference engine's FP8 K/V and FP4 indexer rounding.
fn production_diff(sim: ds4_model::families::deepseek4::Ds4Numerics) -> Diff {
    let (mut m, be) = load("ds4-tiny.gguf", Numerics::Production);
    m.deepseek4_mut().unwrap().set_numerics(sim);
    let r = reference("logits-q2-64.trim.json");
    let ours = run(&m, &be, &r.tokens, false);
    compare(&ours, m.info().n_vocab, &r, 0.05)
}

#[test]
fn production_q2_is_close_to_llamacpp_default_numerics() {
    use ds4_model::families::deepseek4::Ds4Numerics;
    // llama.cpp has no FP8/FP4 simulation: compare the like-for-like setting.
    let like = production_diff(Ds4Numerics {
        fp8_kv: false,
        fp4_indexer: false,
        f16_cache: true,
    });
    let full = production_diff(Ds4Numerics::PRODUCTION);
    eprintln!(
        "q2, F16 cache only: {like:?} mean {:.3e}",
        like.sum_abs / like.n as f64
    );
    eprintln!(
        "q2, FP8+FP4+F16: {full:?} mean {:.3e}",
        full.sum_abs / full.n as f64
    );
    // Measured: like-for-like max 0.73, mean 0.015, argmax 57/59; with the
    // simulations max 0.74, mean 0.030, argmax 57/59. llama.cpp's own
    // default numerics sit at mean 0.026, max 0.82 from exact math here:
    // Q8 activation noise is amplified through the random layers.
    for (d, mean_tol) in [(&like, 0.03), (&full, 0.06)] {
        assert!(d.max_abs < 1.5, "{d:?}");
        assert!(d.sum_abs / (d.n as f64) < mean_tol, "{d:?}");
        assert!(d.argmax_agree * 10 >= d.argmax_checked * 9, "{d:?}");
    }
}

/// The reference engine's activation roundings (FP8 K/V, Hadamard + FP4
/// indexer, F16 cache rows) on exact weights, against the float64 NumPy
/// implementation of the same specification text (`ref_numpy.py --fp8
/// --fp4 --f16`, 64 tokens; the indexer selects from position 35 on).
/// llama.cpp has no such simulation, and neither side has been checked
/// against the reference engine itself. Measured: max 3.1e-5. Over 600
/// tokens an occasional element lands within f32 noise of an FP8/F16
/// rounding boundary and rounds the other way (max 0.038, mean 1.6e-4).
#[test]
fn activation_rounding_matches_the_float64_reference() {
    use ds4_model::families::deepseek4::Ds4Numerics;
    let (mut m, be) = load("ds4-tiny.gguf", Numerics::Exact);
    m.deepseek4_mut()
        .unwrap()
        .set_numerics(Ds4Numerics::PRODUCTION);
    let r = reference("ref-sim-64.trim.json");
    let ours = run(&m, &be, &r.tokens, false);
    let d = compare(&ours, m.info().n_vocab, &r, 1e-3);
    eprintln!(
        "FP8+FP4+F16 on exact weights: {d:?} mean {:.3e}",
        d.sum_abs / d.n as f64
    );
    assert!(d.max_abs < 2e-4, "{d:?}");
    assert_eq!(d.argmax_agree, d.argmax_checked);
}
