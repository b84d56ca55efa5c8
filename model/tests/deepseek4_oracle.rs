//! DeepSeek V4 on the CPU reference backend against independent
//! implementations, on two miniature models:
//!
//! * A, `ds4-tiny.gguf`: the Flash layout (5 layers, width 256, ratios
//!   [0, 0, 4, 128, 4], window 128, 8 experts / 2 used, 4 heads, indexer
//!   top-k 8, 3 hash layers), seed 1234;
//! * B, `ds4-tiny-b.gguf`: 6 layers, ratios [0, 4, 128, 4, 0, 128],
//!   window 64, 16 experts / 3 used, 8 heads in 4 output groups, indexer
//!   top-k 6, 2 hash layers, seed 2718.
//!
//! The models are generated at test time by the committed generator
//! (`fixtures/deepseek4/gen_ds4_tiny.py`, run by `scripts/gen-ds4-tiny.sh`,
//! which checks their sha256; `DS4_TINY_DIR` names the folder holding
//! them). The reference logits are llama.cpp's (exact mode: F32 weights,
//! F32 cache, no flash attention; and default numerics on the q2 file) and
//! a float64 NumPy implementation's (with the production roundings),
//! trimmed by `fixtures/deepseek4/trim_logits.py`;
//! `fixtures/deepseek4/README.md` has the commands and the measurements.
//! In exact mode llama.cpp and the NumPy implementation agree to 7.9e-6
//! (A) and 1.1e-5 (B) over 600 tokens.
//!
//! Every configuration is checked in exact numerics for one prefill,
//! token-by-token decode and prefill in chunks of 37, each against
//! llama.cpp at every position, and in production numerics against the
//! NumPy implementation's production mode.

use ds4_kernels::{CpuBackend, Numerics};
use ds4_model::families::deepseek4::Ds4Model;
use ds4_model::gguf::GgufFile;
use ds4_model::{Logits, Model};
use ds4_tests::deepseek4::{compare, tiny_model, Diff, Reference};

/// Exact numerics: our f32 forward against llama.cpp's f32 mode.
const EXACT_TOL: f32 = 1e-4;

/// A miniature model and its reference logits.
struct Config {
    gguf: &'static str,
    /// llama.cpp exact mode, 64 and 600 tokens.
    f32_64: &'static str,
    f32_600: &'static str,
    /// `ref_numpy.py --fp8 --fp4 --f16`, 600 tokens.
    prod_600: &'static str,
}

const A: Config = Config {
    gguf: "ds4-tiny.gguf",
    f32_64: "logits-f32-64.trim.json",
    f32_600: "logits-f32-600.trim.json",
    prod_600: "ref-prod-600.trim.json",
};

const B: Config = Config {
    gguf: "ds4-tiny-b.gguf",
    f32_64: "b-logits-f32-64.trim.json",
    f32_600: "b-logits-f32-600.trim.json",
    prod_600: "b-ref-prod-600.trim.json",
};

fn load(file: &str, numerics: Numerics) -> (Model<CpuBackend>, CpuBackend) {
    let be = CpuBackend::with_numerics(numerics);
    let f = GgufFile::open(&tiny_model(file)).expect("open the miniature model");
    let m = Model::load(&f, &be).expect("the miniature model passes the deepseek4 contract");
    (m, be)
}

fn run(m: &Model<CpuBackend>, be: &CpuBackend, tokens: &[u32], decode: bool) -> Vec<f32> {
    let mut seq = m.new_sequence(be, tokens.len()).expect("sequence");
    if decode {
        tokens
            .iter()
            .flat_map(|&t| m.forward(be, &mut seq, &[t], Logits::Last).unwrap())
            .collect()
    } else {
        m.forward(be, &mut seq, tokens, Logits::All).unwrap()
    }
}

fn run_chunked(m: &Model<CpuBackend>, be: &CpuBackend, tokens: &[u32], chunk: usize) -> Vec<f32> {
    let mut seq = m.new_sequence(be, tokens.len()).expect("sequence");
    tokens
        .chunks(chunk)
        .flat_map(|c| m.forward(be, &mut seq, c, Logits::All).unwrap())
        .collect()
}

fn assert_exact(what: &str, ours: &[f32], n_vocab: usize, r: &Reference) {
    let d = compare(ours, n_vocab, r, 1e-3);
    eprintln!("{what}: {d:?} mean {:.3e}", d.mean());
    assert!(
        d.max_abs < EXACT_TOL,
        "{what}: max |Δlogit| {} at position {} exceeds {EXACT_TOL}",
        d.max_abs,
        d.worst_pos
    );
    assert_eq!(d.argmax_agree, d.argmax_checked, "{what}: {d:?}");
}

fn check_exact(c: &Config, fixture: &str, decode: bool) {
    let (m, be) = load(c.gguf, Numerics::Exact);
    let r = Reference::load(fixture);
    let ours = run(&m, &be, &r.tokens, decode);
    let what = format!("{} {fixture} decode={decode}", c.gguf);
    assert_exact(&what, &ours, m.info().n_vocab, &r);
}

/// Prefill in odd-sized chunks (37: chunk boundaries fall at every phase
/// of the ratio-4 and ratio-128 compressors and of the window) against
/// llama.cpp's one-batch prefill, and bit-identical to our own one-batch
/// prefill.
fn check_chunked(c: &Config) {
    let (m, be) = load(c.gguf, Numerics::Exact);
    let r = Reference::load(c.f32_600);
    let chunked = run_chunked(&m, &be, &r.tokens, 37);
    let what = format!("{} {} chunks of 37", c.gguf, c.f32_600);
    assert_exact(&what, &chunked, m.info().n_vocab, &r);
    let whole = run(&m, &be, &r.tokens[..300], false);
    assert!(
        whole == chunked[..whole.len()],
        "{what}: chunked prefill differs from one prefill"
    );
}

#[test]
fn a_exact_prefill_64_matches_llamacpp_f32() {
    check_exact(&A, A.f32_64, false);
}

#[test]
fn a_exact_prefill_600_matches_llamacpp_f32() {
    check_exact(&A, A.f32_600, false);
}

#[test]
fn a_exact_decode_600_matches_llamacpp_f32() {
    check_exact(&A, A.f32_600, true);
}

#[test]
fn a_exact_chunked_prefill_600_matches_llamacpp_f32() {
    check_chunked(&A);
}

#[test]
fn b_exact_prefill_64_matches_llamacpp_f32() {
    check_exact(&B, B.f32_64, false);
}

#[test]
fn b_exact_prefill_600_matches_llamacpp_f32() {
    check_exact(&B, B.f32_600, false);
}

#[test]
fn b_exact_decode_600_matches_llamacpp_f32() {
    check_exact(&B, B.f32_600, true);
}

#[test]
fn b_exact_chunked_prefill_600_matches_llamacpp_f32() {
    check_chunked(&B);
}

#[test]
fn truncation_recomputes_the_kept_prefix() {
    let (m, be) = load(A.gguf, Numerics::Exact);
    let r = Reference::load(A.f32_64);
    let t = &r.tokens;
    let mut seq = m.new_sequence(&be, 64).expect("sequence");
    let direct = m.forward(&be, &mut seq, t, Logits::Last).unwrap();
    seq.truncate(21);
    assert_eq!(seq.tokens(), &t[..21]);
    let again = m.forward(&be, &mut seq, &t[21..], Logits::Last).unwrap();
    assert_eq!(direct, again);
}

/// Production numerics: Q8_0/Q8_K activation quantization, F16 caches, and
/// (all on) the reference engine's FP8 K/V and FP4 indexer rounding.
fn production_diff(sim: ds4_model::families::deepseek4::Ds4Numerics) -> Diff {
    let (mut m, be) = load(A.gguf, Numerics::Production);
    m.family_model_mut::<Ds4Model<CpuBackend>>()
        .unwrap()
        .set_numerics(sim);
    let r = Reference::load("logits-q2-64.trim.json");
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
    eprintln!("q2, F16 cache only: {like:?} mean {:.3e}", like.mean());
    eprintln!("q2, FP8+FP4+F16: {full:?} mean {:.3e}", full.mean());
    // Measured: like-for-like max 0.73, mean 0.015, argmax 57/59; with the
    // simulations max 0.74, mean 0.030, argmax 57/59. llama.cpp's own
    // default numerics sit at mean 0.026, max 0.82 from exact math here:
    // Q8 activation noise is amplified through the random layers.
    for (d, mean_tol) in [(&like, 0.03), (&full, 0.06)] {
        assert!(d.max_abs < 1.5, "{d:?}");
        assert!(d.mean() < mean_tol, "{d:?}");
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
    let (mut m, be) = load(A.gguf, Numerics::Exact);
    m.family_model_mut::<Ds4Model<CpuBackend>>()
        .unwrap()
        .set_numerics(Ds4Numerics::PRODUCTION);
    let r = Reference::load("ref-sim-64.trim.json");
    let ours = run(&m, &be, &r.tokens, false);
    let d = compare(&ours, m.info().n_vocab, &r, 1e-3);
    eprintln!("FP8+FP4+F16 on exact weights: {d:?} mean {:.3e}", d.mean());
    assert!(d.max_abs < 2e-4, "{d:?}");
    assert_eq!(d.argmax_agree, d.argmax_checked);
}

/// Production numerics (the q2 file, Q8_0/Q8_K activations, F16 cache rows,
/// FP8 K/V and FP4 indexer rounding: what the server runs) against the
/// NumPy implementation's production mode (`ref_numpy.py --fp8 --fp4
/// --f16`: the same K/V, indexer and cache roundings in float64 on the
/// dequantized weights, without activation quantization), 600 tokens.
///
/// The tolerance `tol` bounds every kept logit, and the argmax must agree
/// wherever the reference's top-1 − top-2 margin exceeds `tol`. Below it
/// the argmax is only required to agree at `min_agree` of all positions.
fn check_production(c: &Config, tol: f32, mean_tol: f64, min_agree: f64) {
    let (mut m, be) = load(c.gguf, Numerics::Production);
    assert_eq!(
        m.family_model_mut::<Ds4Model<CpuBackend>>()
            .unwrap()
            .numerics(),
        ds4_model::families::deepseek4::Ds4Numerics::PRODUCTION
    );
    let r = Reference::load(c.prod_600);
    let ours = run(&m, &be, &r.tokens, false);
    let d = compare(&ours, m.info().n_vocab, &r, tol as f64);
    let all = compare(&ours, m.info().n_vocab, &r, f64::NEG_INFINITY);
    eprintln!(
        "{} production vs {}: {d:?} mean {:.3e}; argmax agrees at {}/{} positions",
        c.gguf,
        c.prod_600,
        d.mean(),
        all.argmax_agree,
        all.argmax_checked
    );
    assert!(d.max_abs < tol, "max |Δlogit| {} ≥ {tol}: {d:?}", d.max_abs);
    assert!(
        d.mean() < mean_tol,
        "mean |Δlogit| {} ≥ {mean_tol}",
        d.mean()
    );
    assert_eq!(d.argmax_agree, d.argmax_checked, "{d:?}");
    assert!(
        all.argmax_agree as f64 >= min_agree * all.argmax_checked as f64,
        "argmax agrees at {}/{} positions",
        all.argmax_agree,
        all.argmax_checked
    );
}

// Measured over the 600 tokens (every kept value: the top 3 logits of every
// position and 6 complete rows):
//   A: max 0.963, mean 0.047; argmax 571/600, the 29 disagreements all at
//      margins below 0.151; 1 position has a margin above 1.25.
//   B: max 1.017, mean 0.081; argmax 508/600, disagreements at margins up
//      to 0.788; 9 positions have a margin above 1.25.
// Nearly all of it is Q8 activation noise amplified through the random
// layers, and the discrete router/indexer selection flips it causes:
// llama.cpp's own default numerics on the same q2 files, against the same
// reference, reach max 1.26 / 1.61, mean 0.035 / 0.088 (all logits),
// argmax 94.3% / 82.5%. The roundings alone are checked much more tightly
// below (`*_production_roundings_match_numpy_production_mode`).
const PROD_TOL: f32 = 1.25;
const PROD_MEAN_TOL: f64 = 0.12;

#[test]
fn a_production_matches_numpy_production_mode() {
    check_production(&A, PROD_TOL, PROD_MEAN_TOL, 0.9);
}

#[test]
fn b_production_matches_numpy_production_mode() {
    check_production(&B, PROD_TOL, PROD_MEAN_TOL, 0.8);
}

/// The production roundings alone (FP8 K/V, Hadamard + FP4 indexer, F16
/// cache rows) on exact weights and f32 activations against the same
/// reference, 600 tokens: the comparison without activation quantization.
/// What remains are discrete rounding flips: an element within f32 noise
/// of an FP8 (or F16) rounding midpoint rounds the other way, and the
/// random layers amplify the one-step change. On B the first one is at
/// position 29 (an FP8 input 1.9e-6 relative from a midpoint, 3.7e-4 in
/// the logits); the window carries it forward.
fn check_roundings(c: &Config, tol: f32, mean_tol: f64) {
    use ds4_model::families::deepseek4::Ds4Numerics;
    let (mut m, be) = load(c.gguf, Numerics::Exact);
    m.family_model_mut::<Ds4Model<CpuBackend>>()
        .unwrap()
        .set_numerics(Ds4Numerics::PRODUCTION);
    let r = Reference::load(c.prod_600);
    let ours = run(&m, &be, &r.tokens, false);
    let d = compare(&ours, m.info().n_vocab, &r, tol as f64);
    eprintln!(
        "{} FP8+FP4+F16 on exact weights vs {}: {d:?} mean {:.3e}",
        c.gguf,
        c.prod_600,
        d.mean()
    );
    assert!(d.max_abs < tol, "max |Δlogit| {} ≥ {tol}: {d:?}", d.max_abs);
    assert!(
        d.mean() < mean_tol,
        "mean |Δlogit| {} ≥ {mean_tol}",
        d.mean()
    );
    assert_eq!(d.argmax_agree, d.argmax_checked, "{d:?}");
}

/// Measured: max 0.038, mean 1.8e-4, argmax agrees at all 600 positions.
#[test]
fn a_production_roundings_match_numpy_production_mode() {
    check_roundings(&A, 0.06, 5e-4);
}

/// Measured: max 0.48, mean 2.9e-3; the argmax differs at 5 positions,
/// all with margins below 0.239.
#[test]
fn b_production_roundings_match_numpy_production_mode() {
    check_roundings(&B, 0.6, 5e-3);
}
