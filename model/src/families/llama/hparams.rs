//! Hyper-parameters of the llama family and its tensor contract, shared by
//! the families that keep llama's layout (see [`Variant`]).

use ds4_kernels::{RopeConfig, RopeMode};

use crate::families::{check_inventory, ExpectedTensor, Family, ModelError};
use crate::gguf::GgufFile;

/// What sets a family with llama's layout apart from llama itself. The
/// metadata keys are read under the family's architecture string.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Variant {
    pub family: Family,
    /// How its GGUFs lay out the rotated pairs of a head.
    pub rope_mode: RopeMode,
    /// Every layer's `attn_q`, `attn_k` and `attn_v` carry a `.bias`.
    pub qkv_bias: bool,
    /// Named when a file holds tensors outside the contract.
    pub unsupported_hint: &'static str,
}

/// The llama family itself.
pub const LLAMA: Variant = Variant {
    family: Family::Llama,
    rope_mode: RopeMode::Normal,
    qkv_bias: false,
    unsupported_hint:
        "mixture-of-experts llama variants and RoPE frequency-factor tensors are not supported",
};

/// Metadata keys a llama GGUF must carry.
pub const REQUIRED_KEYS: &[&str] = &[
    "{arch}.block_count",
    "{arch}.context_length",
    "{arch}.embedding_length",
    "{arch}.feed_forward_length",
    "{arch}.attention.head_count",
    "{arch}.attention.layer_norm_rms_epsilon",
];

#[derive(Clone, Debug, PartialEq)]
pub struct LlamaHParams {
    /// The family these were read for.
    pub variant: Variant,
    pub n_vocab: usize,
    pub n_ctx_train: usize,
    pub n_embd: usize,
    pub n_ff: usize,
    pub n_layer: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub rms_eps: f32,
    pub rope: RopeConfig,
    /// `output.weight` is absent: the output head reuses `token_embd.weight`.
    pub tied_embeddings: bool,
}

fn bad(
    family: &'static str,
    key: &str,
    value: impl std::fmt::Display,
    problem: &str,
) -> ModelError {
    ModelError::BadKey {
        family,
        key: key.to_string(),
        value: value.to_string(),
        problem: problem.to_string(),
    }
}

fn count(file: &GgufFile, family: &'static str, key: &str) -> Result<usize, ModelError> {
    let v = file.metadata().require_u64(key)?;
    if v == 0 || v > (1 << 24) {
        return Err(bad(family, key, v, "expected a positive count below 2^24"));
    }
    Ok(v as usize)
}

impl LlamaHParams {
    /// The hyper-parameters of a llama GGUF.
    pub fn from_file(file: &GgufFile) -> Result<LlamaHParams, ModelError> {
        LlamaHParams::from_file_as(file, LLAMA)
    }

    /// The hyper-parameters of a GGUF of a family with llama's layout.
    pub fn from_file_as(file: &GgufFile, variant: Variant) -> Result<LlamaHParams, ModelError> {
        let family = variant.family.name();
        let count = |key: &str| count(file, family, key);
        let m = file.metadata();
        let k = |s: &str| format!("{family}.{s}");
        let n_embd = count(&k("embedding_length"))?;
        let n_head = count(&k("attention.head_count"))?;
        let n_head_kv = match m.get(&k("attention.head_count_kv")) {
            Some(_) => count(&k("attention.head_count_kv"))?,
            None => n_head,
        };
        if n_head % n_head_kv != 0 {
            return Err(bad(
                family,
                &k("attention.head_count_kv"),
                n_head_kv,
                "must divide attention.head_count",
            ));
        }
        if n_embd % n_head != 0 {
            return Err(bad(
                family,
                &k("embedding_length"),
                n_embd,
                "must be a multiple of attention.head_count",
            ));
        }
        let head_dim = n_embd / n_head;
        for key in ["attention.key_length", "attention.value_length"] {
            if let Some(v) = m.get_u64(&k(key)) {
                if v as usize != head_dim {
                    return Err(bad(
                        family,
                        &k(key),
                        v,
                        "head sizes other than embedding_length / head_count are not supported",
                    ));
                }
            }
        }
        let n_rot = match m.get(&k("rope.dimension_count")) {
            Some(_) => count(&k("rope.dimension_count"))?,
            None => head_dim,
        };
        if n_rot > head_dim || n_rot % 2 != 0 {
            return Err(bad(
                family,
                &k("rope.dimension_count"),
                n_rot,
                "must be even and at most the head size",
            ));
        }
        let freq_base = m.get_f64(&k("rope.freq_base")).unwrap_or(10_000.0) as f32;
        let mut freq_scale = 1.0f32;
        match m.get_str(&k("rope.scaling.type")) {
            None | Some("none") => {}
            Some("linear") => {
                let f = m.get_f64(&k("rope.scaling.factor")).unwrap_or(1.0);
                if !(f > 0.0 && f.is_finite()) {
                    return Err(bad(
                        family,
                        &k("rope.scaling.factor"),
                        f,
                        "must be a positive number",
                    ));
                }
                freq_scale = (1.0 / f) as f32;
            }
            Some(other) => {
                return Err(bad(
                    family,
                    &k("rope.scaling.type"),
                    other,
                    "only linear RoPE scaling is supported",
                ));
            }
        }
        let rms_eps = m.require_f64(&k("attention.layer_norm_rms_epsilon"))? as f32;
        if !(rms_eps > 0.0 && rms_eps < 1.0) {
            return Err(bad(
                family,
                &k("attention.layer_norm_rms_epsilon"),
                rms_eps,
                "expected a small positive number",
            ));
        }
        let embd = file
            .tensor("token_embd.weight")
            .ok_or(ModelError::MissingTensor {
                family,
                name: "token_embd.weight".into(),
            })?;
        let n_vocab = match m.get_u64(&k("vocab_size")) {
            Some(v) => v as usize,
            None => embd.shape.get(1).copied().unwrap_or(0) as usize,
        };
        Ok(LlamaHParams {
            variant,
            n_vocab,
            n_ctx_train: count(&k("context_length"))?,
            n_embd,
            n_ff: count(&k("feed_forward_length"))?,
            n_layer: count(&k("block_count"))?,
            n_head,
            n_head_kv,
            head_dim,
            rms_eps,
            rope: RopeConfig {
                mode: variant.rope_mode,
                n_rot,
                freq_base,
                freq_scale,
            },
            tied_embeddings: file.tensor("output.weight").is_none(),
        })
    }

    /// Every tensor of the contract with its ggml shape (row length first).
    pub fn expected_tensors(&self) -> Vec<ExpectedTensor> {
        let (e, v, f) = (self.n_embd as u64, self.n_vocab as u64, self.n_ff as u64);
        let q = (self.n_head * self.head_dim) as u64;
        let kv = (self.n_head_kv * self.head_dim) as u64;
        let mut t = vec![
            ExpectedTensor::required("token_embd.weight", &[e, v]),
            ExpectedTensor::required("output_norm.weight", &[e]),
            ExpectedTensor::optional("output.weight", &[e, v]),
        ];
        for i in 0..self.n_layer {
            let b = |s: &str| format!("blk.{i}.{s}.weight");
            if self.variant.qkv_bias {
                let bias = |s: &str| format!("blk.{i}.{s}.bias");
                t.extend([
                    ExpectedTensor::required(bias("attn_q"), &[q]),
                    ExpectedTensor::required(bias("attn_k"), &[kv]),
                    ExpectedTensor::required(bias("attn_v"), &[kv]),
                ]);
            }
            t.extend([
                ExpectedTensor::required(b("attn_norm"), &[e]),
                ExpectedTensor::required(b("attn_q"), &[e, q]),
                ExpectedTensor::required(b("attn_k"), &[e, kv]),
                ExpectedTensor::required(b("attn_v"), &[e, kv]),
                ExpectedTensor::required(b("attn_output"), &[q, e]),
                ExpectedTensor::required(b("ffn_norm"), &[e]),
                ExpectedTensor::required(b("ffn_gate"), &[e, f]),
                ExpectedTensor::required(b("ffn_up"), &[e, f]),
                ExpectedTensor::required(b("ffn_down"), &[f, e]),
            ]);
        }
        t
    }
}

/// Check the file's tensors against the contract.
pub fn check_tensors(file: &GgufFile, h: &LlamaHParams) -> Result<(), ModelError> {
    check_inventory(
        file,
        h.variant.family,
        &h.expected_tensors(),
        h.variant.unsupported_hint,
    )
}
