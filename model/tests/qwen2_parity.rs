//! The qwen2 family on a tiny random qwen2 GGUF built here with the repo's
//! writer (the Q4_K_M mix of real Qwen2 files: Q4_K, Q6_K, Q8_0, f32 norms
//! and q/k/v biases, an untied output head):
//!
//! - exact numerics against an independent float64 NumPy evaluation of
//!   the same file (`fixtures/qwen2/gen_tiny_qwen2_numpy.py`, built on the
//!   `gguf` package's reader and dequantization; its output
//!   `fixtures/qwen2/tiny-qwen2-numpy-f64.json` names the file by hash);
//! - production numerics stay near it, and batched prefill equals
//!   token-by-token decoding;
//! - the contract names a missing bias tensor and a missing RoPE base.
//!
//! Regenerate the fixture only when the model built here changes on
//! purpose:
//!
//! ```text
//! DS4_QWEN2_TINY_OUT=/tmp/tiny-qwen2.gguf cargo test -p ds4-model --test qwen2_parity
//! python3 model/tests/fixtures/qwen2/gen_tiny_qwen2_numpy.py /tmp/tiny-qwen2.gguf \
//!     > model/tests/fixtures/qwen2/tiny-qwen2-numpy-f64.json
//! ```

use ds4_kernels::quant::GgmlType;
use ds4_kernels::{CpuBackend, Numerics};
use ds4_model::families::{Logits, Model, ModelError};
use ds4_model::gguf::writer::{write_gguf, TensorToWrite};
use ds4_model::gguf::{GgufFile, MetaValue, DEFAULT_ALIGNMENT};
use serde_json::Value;

const N_VOCAB: u64 = 128;
const N_EMBD: u64 = 256;
const N_HEAD: u64 = 4;
const N_HEAD_KV: u64 = 2;
const N_FF: u64 = 512;
const N_LAYER: usize = 2;
const PROMPT: [u32; 9] = [3, 17, 64, 101, 5, 5, 90, 127, 0];

/// SplitMix64: a fixed, documented generator (the file must be
/// byte-identical wherever the test runs).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1).
    fn uniform(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

fn f16(v: f32) -> [u8; 2] {
    half::f16::from_f32(v).to_le_bytes()
}

/// Random but valid blocks: f16 scales small and positive, quants random.
fn quant_bytes(ty: GgmlType, n_elements: u64, rng: &mut Rng) -> Vec<u8> {
    let blocks = n_elements as usize / ty.block_size();
    let mut out = Vec::with_capacity(blocks * ty.type_size());
    for _ in 0..blocks {
        match ty {
            GgmlType::Q8_0 => {
                out.extend(f16(0.004 * (1.5 + rng.uniform())));
                out.extend(rng.bytes(32));
            }
            GgmlType::Q4_K => {
                out.extend(f16(0.0004 * (1.5 + rng.uniform())));
                out.extend(f16(0.002 * (1.5 + rng.uniform())));
                out.extend(rng.bytes(12 + 128));
            }
            GgmlType::Q6_K => {
                out.extend(rng.bytes(128 + 64 + 16));
                out.extend(f16(0.00006 * (1.5 + rng.uniform())));
            }
            other => panic!("no generator for {other:?}"),
        }
    }
    assert_eq!(out.len(), blocks * ty.type_size());
    out
}

fn f32_bytes(n: u64, rng: &mut Rng, center: f32, spread: f32) -> Vec<u8> {
    (0..n)
        .flat_map(|_| (center + spread * rng.uniform()).to_le_bytes())
        .collect()
}

/// The tiny model: every tensor's bytes from one seeded stream, in order.
fn tiny_qwen2(skip_tensor: Option<&str>, skip_key: Option<&str>) -> Vec<u8> {
    let mut rng = Rng(0x5157_454E_3200_0001);
    let (e, v, f) = (N_EMBD, N_VOCAB, N_FF);
    let hd = N_EMBD / N_HEAD;
    let kv = N_HEAD_KV * hd;
    let mut tensors = Vec::new();
    let mut push = |name: String, shape: &[u64], ty: GgmlType, data: Vec<u8>| {
        tensors.push(TensorToWrite {
            name,
            shape: shape.to_vec(),
            ggml_type: ty,
            data,
        })
    };
    let quant = |name: String, shape: &[u64], ty: GgmlType, rng: &mut Rng| {
        let data = quant_bytes(ty, shape.iter().product(), rng);
        (name, shape.to_vec(), ty, data)
    };
    let mut all = vec![
        quant(
            "token_embd.weight".into(),
            &[e, v],
            GgmlType::Q8_0,
            &mut rng,
        ),
        (
            "output_norm.weight".into(),
            vec![e],
            GgmlType::F32,
            f32_bytes(e, &mut rng, 1.0, 0.2),
        ),
        quant("output.weight".into(), &[e, v], GgmlType::Q6_K, &mut rng),
    ];
    for i in 0..N_LAYER {
        let n = |s: &str| format!("blk.{i}.{s}");
        all.push((
            n("attn_norm.weight"),
            vec![e],
            GgmlType::F32,
            f32_bytes(e, &mut rng, 1.0, 0.2),
        ));
        all.push(quant(n("attn_q.weight"), &[e, e], GgmlType::Q4_K, &mut rng));
        all.push((
            n("attn_q.bias"),
            vec![e],
            GgmlType::F32,
            f32_bytes(e, &mut rng, 0.0, 0.5),
        ));
        all.push(quant(
            n("attn_k.weight"),
            &[e, kv],
            GgmlType::Q8_0,
            &mut rng,
        ));
        all.push((
            n("attn_k.bias"),
            vec![kv],
            GgmlType::F32,
            f32_bytes(kv, &mut rng, 0.0, 1.5),
        ));
        all.push(quant(
            n("attn_v.weight"),
            &[e, kv],
            GgmlType::Q6_K,
            &mut rng,
        ));
        all.push((
            n("attn_v.bias"),
            vec![kv],
            GgmlType::F32,
            f32_bytes(kv, &mut rng, 0.0, 0.5),
        ));
        all.push(quant(
            n("attn_output.weight"),
            &[e, e],
            GgmlType::Q4_K,
            &mut rng,
        ));
        all.push((
            n("ffn_norm.weight"),
            vec![e],
            GgmlType::F32,
            f32_bytes(e, &mut rng, 1.0, 0.2),
        ));
        all.push(quant(
            n("ffn_gate.weight"),
            &[e, f],
            GgmlType::Q4_K,
            &mut rng,
        ));
        all.push(quant(n("ffn_up.weight"), &[e, f], GgmlType::Q4_K, &mut rng));
        all.push(quant(
            n("ffn_down.weight"),
            &[f, e],
            GgmlType::Q6_K,
            &mut rng,
        ));
    }
    for (name, shape, ty, data) in all {
        if Some(name.as_str()) != skip_tensor {
            push(name, &shape, ty, data);
        }
    }
    let s = |v: &str| MetaValue::String(v.into());
    let meta: Vec<(String, MetaValue)> = vec![
        ("general.architecture".into(), s("qwen2")),
        ("general.name".into(), s("tiny random qwen2 (ds4 test)")),
        ("qwen2.block_count".into(), MetaValue::U32(N_LAYER as u32)),
        ("qwen2.context_length".into(), MetaValue::U32(256)),
        ("qwen2.embedding_length".into(), MetaValue::U32(e as u32)),
        ("qwen2.feed_forward_length".into(), MetaValue::U32(f as u32)),
        (
            "qwen2.attention.head_count".into(),
            MetaValue::U32(N_HEAD as u32),
        ),
        (
            "qwen2.attention.head_count_kv".into(),
            MetaValue::U32(N_HEAD_KV as u32),
        ),
        ("qwen2.rope.freq_base".into(), MetaValue::F32(1_000_000.0)),
        (
            "qwen2.attention.layer_norm_rms_epsilon".into(),
            MetaValue::F32(1e-6),
        ),
    ]
    .into_iter()
    .filter(|(k, _): &(String, MetaValue)| Some(k.as_str()) != skip_key)
    .collect();
    write_gguf(&meta, &tensors, DEFAULT_ALIGNMENT)
}

/// FNV-1a, 64 bit: names the file the fixture was computed on.
fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

fn open(bytes: &[u8]) -> (tempfile::TempDir, GgufFile) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("tiny-qwen2.gguf");
    std::fs::write(&path, bytes).expect("write model");
    let file = GgufFile::open(&path).expect("open tiny qwen2");
    (dir, file)
}

fn reference() -> Value {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/qwen2/tiny-qwen2-numpy-f64.json");
    let text = std::fs::read_to_string(&path).expect("fixture");
    serde_json::from_str(&text).expect("fixture JSON")
}

/// `[n_tokens, n_vocab]` logits of the NumPy reference.
fn reference_logits(r: &Value) -> Vec<f32> {
    r["logits"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|row| row.as_array().unwrap().iter())
        .map(|v| v.as_f64().unwrap() as f32)
        .collect()
}

fn run(bytes: &[u8], numerics: Numerics) -> Vec<f32> {
    let (_dir, file) = open(bytes);
    let backend = CpuBackend::with_numerics(numerics);
    let model = Model::load(&file, &backend).expect("load tiny qwen2");
    let mut seq = model.new_sequence(&backend, 32).expect("sequence");
    model
        .forward(&backend, &mut seq, &PROMPT, Logits::All)
        .expect("forward")
}

#[test]
fn exact_numerics_match_float64_reference() {
    let bytes = tiny_qwen2(None, None);
    if let Some(out) = std::env::var_os("DS4_QWEN2_TINY_OUT") {
        std::fs::write(&out, &bytes).expect("write DS4_QWEN2_TINY_OUT");
    }
    let r = reference();
    assert_eq!(
        r["gguf_fnv1a64"].as_str().unwrap(),
        format!("{:016x}", fnv1a64(&bytes)),
        "the fixture was computed on another file: the model built here changed \
         (see this file's header to regenerate it, on purpose only)"
    );
    let ids: Vec<u32> = r["token_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    assert_eq!(ids, PROMPT);
    let want = reference_logits(&r);
    let got = run(&bytes, Numerics::Exact);
    assert_eq!(got.len(), want.len());
    let scale = want.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    assert!(scale > 1.0, "logits are not degenerate ({scale})");
    let mut worst = 0.0f32;
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        let diff = (g - w).abs();
        worst = worst.max(diff);
        assert!(
            diff <= 2e-4 * scale,
            "position {} token {}: {g} vs float64 {w}",
            i / N_VOCAB as usize,
            i % N_VOCAB as usize
        );
    }
    eprintln!(
        "largest difference from the float64 reference: {worst:.2e} (logit scale {scale:.2})"
    );
}

/// 8-bit activations and an f16 KV cache move the logits a little, never
/// the argmax of a clear winner; batched prefill equals token by token.
#[test]
fn production_numerics_near_reference_and_batch_invariant() {
    let bytes = tiny_qwen2(None, None);
    let want = reference_logits(&reference());
    let got = run(&bytes, Numerics::Production);
    let n = N_VOCAB as usize;
    let scale = want.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    for (pos, (g, w)) in got.chunks(n).zip(want.chunks(n)).enumerate() {
        let worst = g
            .iter()
            .zip(w)
            .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(
            worst < 0.05 * scale,
            "position {pos}: production logits {worst} from float64"
        );
    }

    let (_dir, file) = open(&bytes);
    let backend = CpuBackend::new();
    let model = Model::load(&file, &backend).expect("load");
    let mut seq = model.new_sequence(&backend, 32).expect("sequence");
    for (pos, &t) in PROMPT.iter().enumerate() {
        let row = model
            .forward(&backend, &mut seq, &[t], Logits::Last)
            .expect("decode");
        let batched = &got[pos * n..(pos + 1) * n];
        let diff = row
            .iter()
            .zip(batched)
            .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(
            diff < 1e-4 * scale,
            "position {pos}: decode vs prefill {diff}"
        );
    }
}

#[test]
fn contract_names_missing_bias_and_rope_base() {
    let refused = |bytes: &[u8]| {
        let (_dir, file) = open(bytes);
        Model::load(&file, &CpuBackend::new())
            .err()
            .expect("refused")
    };
    let err = refused(&tiny_qwen2(Some("blk.1.attn_k.bias"), None));
    assert!(
        matches!(
            &err,
            ModelError::MissingTensor { family: "qwen2", name } if name == "blk.1.attn_k.bias"
        ),
        "{err:?}"
    );

    let err = refused(&tiny_qwen2(None, Some("qwen2.rope.freq_base")));
    assert!(
        matches!(
            &err,
            ModelError::MissingKey { family: "qwen2", key } if key == "qwen2.rope.freq_base"
        ),
        "{err:?}"
    );

    // Without `output.weight` the head is tied to the embeddings.
    let bytes = tiny_qwen2(Some("output.weight"), None);
    let (_dir, file) = open(&bytes);
    let model = Model::load(&file, &CpuBackend::new()).expect("tied qwen2 loads");
    assert_eq!(model.info().family.name(), "qwen2");
    assert_eq!(model.info().n_vocab, N_VOCAB as usize);
}
