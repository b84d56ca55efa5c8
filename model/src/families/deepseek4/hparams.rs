//! Hyper-parameters of the DeepSeek V4 family and its tensor contract.
//!
//! Dimensions come from metadata, so miniature test models load through
//! the same checks as the published Flash files. What does not scale is
//! fixed: four hyper-connection streams and compression ratios drawn from
//! {0, 4, 128}. A file that declares Flash's width must carry every
//! published Flash value ([`Ds4HParams::check_flash`]).

use crate::families::{check_inventory, ExpectedTensor, Family, ModelError};
use crate::gguf::{GgufFile, MetaValue};

const FAMILY: &str = "deepseek4";

/// Metadata keys a deepseek4 GGUF must carry: the reference engine's set
/// plus the keys llama.cpp's loader requires.
pub const REQUIRED_KEYS: &[&str] = &[
    "{arch}.block_count",
    "{arch}.embedding_length",
    "{arch}.vocab_size",
    "{arch}.context_length",
    "{arch}.attention.head_count",
    "{arch}.attention.head_count_kv",
    "{arch}.attention.key_length",
    "{arch}.attention.value_length",
    "{arch}.rope.dimension_count",
    "{arch}.attention.q_lora_rank",
    "{arch}.attention.output_lora_rank",
    "{arch}.attention.output_group_count",
    "{arch}.expert_count",
    "{arch}.expert_used_count",
    "{arch}.expert_feed_forward_length",
    "{arch}.expert_shared_count",
    "{arch}.hash_layer_count",
    "{arch}.attention.sliding_window",
    "{arch}.attention.indexer.head_count",
    "{arch}.attention.indexer.key_length",
    "{arch}.attention.indexer.top_k",
    "{arch}.hyper_connection.count",
    "{arch}.hyper_connection.sinkhorn_iterations",
    "{arch}.attention.compress_ratios",
    "{arch}.swiglu_clamp_exp",
    "{arch}.rope.scaling.original_context_length",
    "{arch}.rope.freq_base",
    "{arch}.rope.scaling.factor",
    "{arch}.rope.scaling.yarn_beta_fast",
    "{arch}.rope.scaling.yarn_beta_slow",
    "{arch}.rope.scaling.type",
    "{arch}.attention.compress_rope_freq_base",
    "{arch}.expert_weights_scale",
    "{arch}.expert_weights_norm",
    "{arch}.expert_gating_func",
    "{arch}.attention.layer_norm_rms_epsilon",
    "{arch}.hyper_connection.epsilon",
];

/// Hyper-connection streams (fixed by the architecture).
pub const N_HC: usize = 4;
/// `expert_gating_func` value for sqrt(softplus) (llama.cpp's numbering).
pub const GATING_SQRT_SOFTPLUS: u64 = 4;

#[derive(Clone, Debug, PartialEq)]
pub struct YarnConfig {
    pub factor: f64,
    pub orig_ctx: f64,
    pub beta_fast: f64,
    pub beta_slow: f64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Ds4HParams {
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_vocab: usize,
    pub n_ctx_train: usize,
    pub n_head: usize,
    /// Head size of Q and of the shared K=V vector.
    pub head_dim: usize,
    /// Rotated dims at the tail of each head.
    pub n_rot: usize,
    pub q_lora: usize,
    pub o_lora: usize,
    pub o_groups: usize,
    pub n_expert: usize,
    pub n_expert_used: usize,
    pub n_ff: usize,
    pub n_hash_layers: usize,
    pub window: usize,
    pub idx_heads: usize,
    pub idx_dim: usize,
    pub idx_top_k: usize,
    pub sinkhorn_iters: usize,
    /// Compression ratio of each layer (0, 4 or 128).
    pub ratios: Vec<usize>,
    pub clamp: Vec<f32>,
    /// Shared-expert clamp per layer (defaults to `clamp`).
    pub clamp_shared: Vec<f32>,
    pub rope_base: f64,
    pub compress_rope_base: f64,
    pub yarn: YarnConfig,
    pub route_scale: f32,
    pub rms_eps: f32,
    pub hc_eps: f32,
}

fn bad(key: &str, value: impl std::fmt::Display, problem: &str) -> ModelError {
    ModelError::BadKey {
        family: FAMILY,
        key: key.to_string(),
        value: value.to_string(),
        problem: problem.to_string(),
    }
}

fn k(s: &str) -> String {
    format!("{FAMILY}.{s}")
}

fn count(file: &GgufFile, key: &str) -> Result<usize, ModelError> {
    let key = k(key);
    let v = file.metadata().require_u64(&key)?;
    if v == 0 || v > (1 << 24) {
        return Err(bad(&key, v, "expected a positive count below 2^24"));
    }
    Ok(v as usize)
}

fn float(file: &GgufFile, key: &str) -> Result<f64, ModelError> {
    let key = k(key);
    let v = file.metadata().require_f64(&key)?;
    if !v.is_finite() {
        return Err(bad(&key, v, "expected a finite number"));
    }
    Ok(v)
}

fn array<'a>(file: &'a GgufFile, key: &str, min_len: usize) -> Result<&'a [MetaValue], ModelError> {
    let key = k(key);
    let a = file
        .metadata()
        .get_array(&key)
        .ok_or_else(|| bad(&key, "(not an array)", "expected an array"))?;
    if a.len() < min_len {
        return Err(bad(
            &key,
            format!("{} entries", a.len()),
            &format!("expected at least block_count = {min_len} entries"),
        ));
    }
    Ok(a)
}

fn float_array(file: &GgufFile, key: &str, n: usize) -> Result<Vec<f32>, ModelError> {
    array(file, key, n)?[..n]
        .iter()
        .map(|v| {
            v.as_f64()
                .filter(|x| x.is_finite() && *x > 0.0)
                .map(|x| x as f32)
                .ok_or_else(|| bad(&k(key), format!("{v:?}"), "expected positive numbers"))
        })
        .collect()
}

impl Ds4HParams {
    pub fn from_file(file: &GgufFile) -> Result<Ds4HParams, ModelError> {
        let m = file.metadata();
        let n_layer = count(file, "block_count")?;
        let n_embd = count(file, "embedding_length")?;
        let n_head = count(file, "attention.head_count")?;
        let head_dim = count(file, "attention.key_length")?;
        let n_rot = count(file, "rope.dimension_count")?;
        let o_groups = count(file, "attention.output_group_count")?;
        let n_expert = count(file, "expert_count")?;
        let n_expert_used = count(file, "expert_used_count")?;
        let idx_dim = count(file, "attention.indexer.key_length")?;
        let n_hash_layers = file.metadata().require_u64(&k("hash_layer_count"))? as usize;

        let kv = count(file, "attention.head_count_kv")?;
        if kv != 1 {
            return Err(bad(
                &k("attention.head_count_kv"),
                kv,
                "DeepSeek V4 has one shared K=V head",
            ));
        }
        let v_len = count(file, "attention.value_length")?;
        if v_len != head_dim {
            return Err(bad(
                &k("attention.value_length"),
                v_len,
                "must equal attention.key_length (K and V are one vector)",
            ));
        }
        if n_rot % 2 != 0 || n_rot > head_dim || n_rot > idx_dim {
            return Err(bad(
                &k("rope.dimension_count"),
                n_rot,
                "must be even and at most the head and indexer key sizes",
            ));
        }
        if n_head % o_groups != 0 {
            return Err(bad(
                &k("attention.output_group_count"),
                o_groups,
                "must divide attention.head_count",
            ));
        }
        if n_expert_used > n_expert {
            return Err(bad(
                &k("expert_used_count"),
                n_expert_used,
                "must be at most expert_count",
            ));
        }
        if n_hash_layers > n_layer {
            return Err(bad(
                &k("hash_layer_count"),
                n_hash_layers,
                "must be at most block_count",
            ));
        }
        let shared = count(file, "expert_shared_count")?;
        if shared != 1 {
            return Err(bad(
                &k("expert_shared_count"),
                shared,
                "exactly one shared expert is supported",
            ));
        }
        let hc = count(file, "hyper_connection.count")?;
        if hc != N_HC {
            return Err(bad(
                &k("hyper_connection.count"),
                hc,
                "DeepSeek V4 uses 4 hyper-connection streams",
            ));
        }
        for key in ["expert_group_count", "expert_group_used_count"] {
            if let Some(v) = m.get_u64(&k(key)) {
                if v != 0 {
                    return Err(bad(
                        &k(key),
                        v,
                        "expert grouping is not part of DeepSeek V4; expected 0",
                    ));
                }
            }
        }
        if m.get_bool(&k("expert_weights_norm")) != Some(true) {
            return Err(bad(
                &k("expert_weights_norm"),
                format!("{:?}", m.get(&k("expert_weights_norm"))),
                "expected true",
            ));
        }
        let gating = m.require_u64(&k("expert_gating_func"))?;
        if gating != GATING_SQRT_SOFTPLUS {
            return Err(bad(
                &k("expert_gating_func"),
                gating,
                "expected 4 (sqrt-softplus)",
            ));
        }
        let scaling = m.require_str(&k("rope.scaling.type"))?;
        if scaling != "yarn" {
            return Err(bad(&k("rope.scaling.type"), scaling, "expected \"yarn\""));
        }
        let ratios = array(file, "attention.compress_ratios", n_layer)?[..n_layer]
            .iter()
            .map(|v| match v.as_i64() {
                Some(r @ (0 | 4 | 128)) => Ok(r as usize),
                _ => Err(bad(
                    &k("attention.compress_ratios"),
                    format!("{v:?}"),
                    "every ratio must be 0, 4 or 128",
                )),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let clamp = float_array(file, "swiglu_clamp_exp", n_layer)?;
        let clamp_shared = if m.get(&k("swiglu_clamp_shexp")).is_some() {
            float_array(file, "swiglu_clamp_shexp", n_layer)?
        } else {
            clamp.clone()
        };
        let top_k = count(file, "attention.indexer.top_k")?;
        let rms_eps = float(file, "attention.layer_norm_rms_epsilon")?;
        let hc_eps = float(file, "hyper_connection.epsilon")?;
        for (key, v) in [
            ("attention.layer_norm_rms_epsilon", rms_eps),
            ("hyper_connection.epsilon", hc_eps),
        ] {
            if !(v > 0.0 && v < 1.0) {
                return Err(bad(&k(key), v, "expected a small positive number"));
            }
        }
        let yarn = YarnConfig {
            factor: float(file, "rope.scaling.factor")?,
            orig_ctx: file
                .metadata()
                .require_u64(&k("rope.scaling.original_context_length"))?
                as f64,
            beta_fast: float(file, "rope.scaling.yarn_beta_fast")?,
            beta_slow: float(file, "rope.scaling.yarn_beta_slow")?,
        };
        if !(yarn.factor >= 1.0 && yarn.orig_ctx > 0.0 && yarn.beta_fast > yarn.beta_slow) {
            return Err(bad(
                &k("rope.scaling.factor"),
                yarn.factor,
                "YaRN needs factor >= 1, original context > 0, beta_fast > beta_slow",
            ));
        }
        let h = Ds4HParams {
            n_layer,
            n_embd,
            n_vocab: count(file, "vocab_size")?,
            n_ctx_train: count(file, "context_length")?,
            n_head,
            head_dim,
            n_rot,
            q_lora: count(file, "attention.q_lora_rank")?,
            o_lora: count(file, "attention.output_lora_rank")?,
            o_groups,
            n_expert,
            n_expert_used,
            n_ff: count(file, "expert_feed_forward_length")?,
            n_hash_layers,
            window: count(file, "attention.sliding_window")?,
            idx_heads: count(file, "attention.indexer.head_count")?,
            idx_dim,
            idx_top_k: top_k,
            sinkhorn_iters: count(file, "hyper_connection.sinkhorn_iterations")?,
            ratios,
            clamp,
            clamp_shared,
            rope_base: float(file, "rope.freq_base")?,
            compress_rope_base: float(file, "attention.compress_rope_freq_base")?,
            yarn,
            route_scale: float(file, "expert_weights_scale")? as f32,
            rms_eps: rms_eps as f32,
            hc_eps: hc_eps as f32,
        };
        if h.n_embd == FLASH_EMBD {
            h.check_flash()?;
        }
        Ok(h)
    }

    /// Every published DeepSeek V4 Flash value (spec table 0.1 / 1.3).
    /// Fewer than 43 blocks are accepted: the first blocks of the model,
    /// with the same shapes (smaller files for performance runs), the
    /// hash-routed ones among them.
    pub fn check_flash(&self) -> Result<(), ModelError> {
        if !(1..=43).contains(&self.n_layer) {
            return Err(bad(
                &k("block_count"),
                self.n_layer,
                "DeepSeek V4 Flash has 43 (or, truncated, fewer)",
            ));
        }
        let want: [(&str, usize, usize); 18] = [
            ("embedding_length", self.n_embd, 4096),
            ("vocab_size", self.n_vocab, 129280),
            ("attention.head_count", self.n_head, 64),
            ("attention.key_length", self.head_dim, 512),
            ("rope.dimension_count", self.n_rot, 64),
            ("attention.q_lora_rank", self.q_lora, 1024),
            ("attention.output_lora_rank", self.o_lora, 1024),
            ("attention.output_group_count", self.o_groups, 8),
            ("expert_count", self.n_expert, 256),
            ("expert_used_count", self.n_expert_used, 6),
            ("expert_feed_forward_length", self.n_ff, 2048),
            ("hash_layer_count", self.n_hash_layers, self.n_layer.min(3)),
            ("attention.sliding_window", self.window, 128),
            ("attention.indexer.head_count", self.idx_heads, 64),
            ("attention.indexer.key_length", self.idx_dim, 128),
            ("attention.indexer.top_k", self.idx_top_k, 512),
            (
                "hyper_connection.sinkhorn_iterations",
                self.sinkhorn_iters,
                20,
            ),
            (
                "rope.scaling.original_context_length",
                self.yarn.orig_ctx as usize,
                65536,
            ),
        ];
        for (key, got, expected) in want {
            if got != expected {
                return Err(bad(
                    &k(key),
                    got,
                    &format!("DeepSeek V4 Flash requires {expected}"),
                ));
            }
        }
        for (l, &r) in self.ratios.iter().enumerate() {
            if r != flash_ratio(l) {
                return Err(bad(
                    &k("attention.compress_ratios"),
                    format!("layer {l}: {r}"),
                    &format!("Flash requires {}", flash_ratio(l)),
                ));
            }
        }
        let floats = [
            ("rope.freq_base", self.rope_base, 10000.0),
            ("rope.scaling.factor", self.yarn.factor, 16.0),
            ("rope.scaling.yarn_beta_fast", self.yarn.beta_fast, 32.0),
            ("rope.scaling.yarn_beta_slow", self.yarn.beta_slow, 1.0),
            (
                "attention.compress_rope_freq_base",
                self.compress_rope_base,
                160000.0,
            ),
            ("expert_weights_scale", self.route_scale as f64, 1.5),
            (
                "attention.layer_norm_rms_epsilon",
                self.rms_eps as f64,
                1e-6,
            ),
            ("hyper_connection.epsilon", self.hc_eps as f64, 1e-6),
        ];
        for (key, got, expected) in floats {
            if (got - expected).abs() > 1e-6 * expected.abs().max(1.0) {
                return Err(bad(
                    &k(key),
                    got,
                    &format!("DeepSeek V4 Flash requires {expected}"),
                ));
            }
        }
        if let Some(c) = self.clamp.iter().find(|&&c| (c - 10.0).abs() > 1e-5) {
            return Err(bad(
                &k("swiglu_clamp_exp"),
                c,
                "DeepSeek V4 Flash requires 10 for every layer",
            ));
        }
        Ok(())
    }

    /// Compressor lanes: 2 (overlapping windows) for ratio 4, else 1.
    pub fn lanes(r: usize) -> usize {
        if r == 4 {
            2
        } else {
            1
        }
    }

    /// Every tensor of the contract with its ggml shape (row length first).
    pub fn expected_tensors(&self) -> Vec<ExpectedTensor> {
        let u = |x: usize| x as u64;
        let (d, v, hd) = (u(self.n_embd), u(self.n_vocab), u(self.head_dim));
        let hc = u(N_HC);
        let mix = u((2 + N_HC) * N_HC);
        let (e, ff) = (u(self.n_expert), u(self.n_ff));
        let group_in = u(self.n_head / self.o_groups * self.head_dim);
        let mut t = vec![
            ExpectedTensor::required("token_embd.weight", &[d, v]),
            ExpectedTensor::required("output_hc_fn.weight", &[hc * d, hc]),
            ExpectedTensor::required("output_hc_scale.weight", &[1]),
            ExpectedTensor::required("output_hc_base.weight", &[hc]),
            ExpectedTensor::required("output_norm.weight", &[d]),
            ExpectedTensor::required("output.weight", &[d, v]),
        ];
        for (l, &r) in self.ratios.iter().enumerate() {
            let b = |s: &str| format!("blk.{l}.{s}.weight");
            t.extend([
                ExpectedTensor::required(b("hc_attn_fn"), &[hc * d, mix]),
                ExpectedTensor::required(b("hc_attn_scale"), &[3]),
                ExpectedTensor::required(b("hc_attn_base"), &[mix]),
                ExpectedTensor::required(b("attn_norm"), &[d]),
                ExpectedTensor::required(b("attn_q_a"), &[d, u(self.q_lora)]),
                ExpectedTensor::required(b("attn_q_a_norm"), &[u(self.q_lora)]),
                ExpectedTensor::required(b("attn_q_b"), &[u(self.q_lora), u(self.n_head) * hd]),
                ExpectedTensor::required(b("attn_kv"), &[d, hd]),
                ExpectedTensor::required(b("attn_kv_a_norm"), &[hd]),
                ExpectedTensor::required(b("attn_sinks"), &[u(self.n_head)]),
                ExpectedTensor::required(
                    b("attn_output_a"),
                    &[group_in, u(self.o_groups * self.o_lora)],
                ),
                ExpectedTensor::required(b("attn_output_b"), &[u(self.o_groups * self.o_lora), d]),
                ExpectedTensor::required(b("hc_ffn_fn"), &[hc * d, mix]),
                ExpectedTensor::required(b("hc_ffn_scale"), &[3]),
                ExpectedTensor::required(b("hc_ffn_base"), &[mix]),
                ExpectedTensor::required(b("ffn_norm"), &[d]),
                ExpectedTensor::required(b("ffn_gate_inp"), &[d, e]),
                ExpectedTensor::required(b("ffn_gate_exps"), &[d, ff, e]),
                ExpectedTensor::required(b("ffn_up_exps"), &[d, ff, e]),
                ExpectedTensor::required(b("ffn_down_exps"), &[ff, d, e]),
                ExpectedTensor::required(b("ffn_gate_shexp"), &[d, ff]),
                ExpectedTensor::required(b("ffn_up_shexp"), &[d, ff]),
                ExpectedTensor::required(b("ffn_down_shexp"), &[ff, d]),
            ]);
            if l < self.n_hash_layers {
                t.push(ExpectedTensor::required(
                    b("ffn_gate_tid2eid"),
                    &[u(self.n_expert_used), v],
                ));
            } else {
                t.push(ExpectedTensor::optional(
                    format!("blk.{l}.exp_probs_b.bias"),
                    &[e],
                ));
            }
            if r != 0 {
                let c = u(Self::lanes(r));
                t.extend([
                    ExpectedTensor::required(b("attn_compressor_kv"), &[d, c * hd]),
                    ExpectedTensor::required(b("attn_compressor_gate"), &[d, c * hd]),
                    ExpectedTensor::required(b("attn_compressor_ape"), &[c * hd, u(r)]),
                    ExpectedTensor::required(b("attn_compressor_norm"), &[hd]),
                ]);
            }
            if r == 4 {
                let (ih, id) = (u(self.idx_heads), u(self.idx_dim));
                t.extend([
                    ExpectedTensor::required(b("indexer.attn_q_b"), &[u(self.q_lora), ih * id]),
                    ExpectedTensor::required(b("indexer.proj"), &[d, ih]),
                    ExpectedTensor::required(b("indexer_compressor_kv"), &[d, 2 * id]),
                    ExpectedTensor::required(b("indexer_compressor_gate"), &[d, 2 * id]),
                    ExpectedTensor::required(b("indexer_compressor_ape"), &[2 * id, 4]),
                    ExpectedTensor::required(b("indexer_compressor_norm"), &[id]),
                ]);
            }
        }
        t
    }
}

const FLASH_EMBD: usize = 4096;

/// Flash's layer schedule: two window-only layers, then ratio 4 on even
/// and ratio 128 on odd layers.
pub fn flash_ratio(layer: usize) -> usize {
    match layer {
        0 | 1 => 0,
        l if l % 2 == 0 => 4,
        _ => 128,
    }
}

/// Check the file's tensors against the contract (shapes, and the types
/// the forward pass depends on).
pub fn check_tensors(file: &GgufFile, h: &Ds4HParams) -> Result<(), ModelError> {
    check_inventory(
        file,
        Family::DeepSeek4,
        &h.expected_tensors(),
        "multi-token-prediction tensors belong in a separate file and are not supported",
    )?;
    use ds4_kernels::quant::GgmlType;
    for l in 0..h.n_hash_layers {
        let name = format!("blk.{l}.ffn_gate_tid2eid.weight");
        if let Some(t) = file.tensor(&name) {
            if t.ggml_type != GgmlType::I32 {
                return Err(bad(
                    &name,
                    t.ggml_type,
                    "the hash-routing table must be I32",
                ));
            }
        }
    }
    for l in 0..h.n_layer {
        let g = file.tensor(&format!("blk.{l}.ffn_gate_exps.weight"));
        let u = file.tensor(&format!("blk.{l}.ffn_up_exps.weight"));
        if let (Some(g), Some(u)) = (g, u) {
            if g.ggml_type != u.ggml_type {
                return Err(bad(
                    &u.name,
                    u.ggml_type,
                    &format!(
                        "routed gate and up experts must share a type (gate is {})",
                        g.ggml_type
                    ),
                ));
            }
        }
    }
    Ok(())
}
