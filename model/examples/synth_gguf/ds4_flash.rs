//! The published DeepSeek V4 Flash layout (every metadata key ds4 and
//! llama.cpp read, all 1,328 tensors with the q2 or q4 file's types), as
//! a header for `fill`: the shapes and types are those of the
//! specification's tensor inventory; the tokenizer keys are copied from a
//! tokenizer GGUF (DeepSeek V4's real vocabulary).

use ds4_kernels::quant::GgmlType;
use ds4_model::gguf::MetaValue;

use super::{read_layout, Layout, Result, Tensor};

pub const NAME: &str = "synthetic DeepSeek V4 Flash layout (random weights)";

const LAYERS: u32 = 43;
const EMBD: u64 = 4096;
const VOCAB: u64 = 129_280;
const HEADS: u64 = 64;
const HEAD_DIM: u64 = 512;
const Q_LORA: u64 = 1024;
const O_GROUPS: u64 = 8;
const O_LORA: u64 = 1024;
const EXPERTS: u64 = 256;
const EXPERTS_USED: u64 = 6;
const FF: u64 = 2048;
const HASH_LAYERS: u32 = 3;
const HC: u64 = 4;
const IDX_HEADS: u64 = 64;
const IDX_DIM: u64 = 128;

/// The routed experts' types: the q2 files' (IQ2_XXS gate and up, Q2_K
/// down) or the q4 files' (Q4_K throughout).
#[derive(Clone, Copy, Debug)]
pub enum Experts {
    Q2,
    Q4,
}

impl Experts {
    pub fn parse(s: &str) -> Result<Experts> {
        match s {
            "q2" => Ok(Experts::Q2),
            "q4" => Ok(Experts::Q4),
            _ => Err(format!("--experts {s}: q2 or q4")),
        }
    }

    fn gate_up(self) -> GgmlType {
        match self {
            Experts::Q2 => GgmlType::IQ2_XXS,
            Experts::Q4 => GgmlType::Q4_K,
        }
    }

    fn down(self) -> GgmlType {
        match self {
            Experts::Q2 => GgmlType::Q2_K,
            Experts::Q4 => GgmlType::Q4_K,
        }
    }
}

/// Compression ratio of layer `l`: window-only layers 0 and 1, then 4 on
/// even and 128 on odd layers.
fn ratio(l: u32) -> u64 {
    match l {
        0 | 1 => 0,
        l if l % 2 == 0 => 4,
        _ => 128,
    }
}

/// The Flash header: `tokenizer`'s tokenizer keys, the Flash keys, and
/// the tensor table (offsets placed by the caller).
pub fn layout(tokenizer: &std::path::Path, experts: Experts) -> Result<Layout> {
    let tok = read_layout(tokenizer)?;
    let mut metadata: Vec<(String, MetaValue)> = vec![
        (
            "general.architecture".into(),
            MetaValue::String("deepseek4".into()),
        ),
        ("general.name".into(), MetaValue::String(NAME.into())),
        (
            "general.description".into(),
            MetaValue::String(
                "SYNTHETIC: random but valid quant blocks in the published DeepSeek V4 Flash \
                 tensor layout (ds4 model/examples/synth_gguf); for performance runs only, its \
                 outputs mean nothing"
                    .into(),
            ),
        ),
        ("general.quantization_version".into(), MetaValue::U32(2)),
        ("general.alignment".into(), MetaValue::U32(32)),
    ];
    let p = |k: &str| format!("deepseek4.{k}");
    let u = |k: &str, v: u64| (p(k), MetaValue::U32(v as u32));
    let f = |k: &str, v: f32| (p(k), MetaValue::F32(v));
    metadata.extend([
        u("block_count", LAYERS.into()),
        u("embedding_length", EMBD),
        u("vocab_size", VOCAB),
        u("attention.head_count", HEADS),
        u("attention.head_count_kv", 1),
        u("attention.key_length", HEAD_DIM),
        u("attention.value_length", HEAD_DIM),
        u("rope.dimension_count", 64),
        u("attention.q_lora_rank", Q_LORA),
        u("attention.output_lora_rank", O_LORA),
        u("attention.output_group_count", O_GROUPS),
        u("expert_count", EXPERTS),
        u("expert_used_count", EXPERTS_USED),
        u("expert_feed_forward_length", FF),
        u("expert_shared_count", 1),
        u("hash_layer_count", HASH_LAYERS.into()),
        u("attention.sliding_window", 128),
        u("attention.indexer.head_count", IDX_HEADS),
        u("attention.indexer.key_length", IDX_DIM),
        u("attention.indexer.top_k", 512),
        u("hyper_connection.count", HC),
        u("hyper_connection.sinkhorn_iterations", 20),
        (
            p("attention.compress_ratios"),
            // The published files carry a trailing 0 for the MTP layer.
            MetaValue::Array(
                (0..LAYERS)
                    .map(|l| MetaValue::U32(ratio(l) as u32))
                    .chain([MetaValue::U32(0)])
                    .collect(),
            ),
        ),
        (
            p("swiglu_clamp_exp"),
            MetaValue::Array((0..LAYERS).map(|_| MetaValue::F32(10.0)).collect()),
        ),
        u("rope.scaling.original_context_length", 65536),
        f("rope.freq_base", 10000.0),
        f("rope.scaling.factor", 16.0),
        f("rope.scaling.yarn_beta_fast", 32.0),
        f("rope.scaling.yarn_beta_slow", 1.0),
        f("attention.compress_rope_freq_base", 160_000.0),
        f("expert_weights_scale", 1.5),
        f("attention.layer_norm_rms_epsilon", 1e-6),
        f("hyper_connection.epsilon", 1e-6),
        (p("expert_weights_norm"), MetaValue::Bool(true)),
        // Read by llama.cpp: the context, sqrt(softplus) gating, YaRN.
        u("context_length", 1 << 20),
        u("expert_gating_func", 4),
        (p("rope.scaling.type"), MetaValue::String("yarn".into())),
    ]);
    let tokenizer_keys = tok
        .metadata
        .into_iter()
        .filter(|(k, _)| k.starts_with("tokenizer."));
    metadata.extend(tokenizer_keys);
    if !metadata.iter().any(|(k, _)| k == "tokenizer.ggml.tokens") {
        return Err(format!("{}: no tokenizer.ggml.tokens", tokenizer.display()));
    }

    let mut tensors = Vec::new();
    let mut add = |name: String, shape: &[u64], ty: GgmlType| -> Result<()> {
        let n: u64 = shape.iter().product();
        let rows = n / shape[0];
        let row = ty.row_bytes(shape[0] as usize).ok_or_else(|| {
            format!(
                "{name}: {} values are not whole {} blocks",
                shape[0],
                ty.name()
            )
        })?;
        tensors.push(Tensor {
            name,
            shape: shape.to_vec(),
            ggml_type: ty,
            offset: 0,
            n_bytes: rows * row as u64,
        });
        Ok(())
    };
    use GgmlType::{F16, F32, I32, Q8_0};
    let hc_flat = HC * EMBD;
    let hc_mix = (2 + HC) * HC;
    add("token_embd.weight".into(), &[EMBD, VOCAB], F16)?;
    add("output_hc_fn.weight".into(), &[hc_flat, HC], F16)?;
    add("output_hc_scale.weight".into(), &[1], F32)?;
    add("output_hc_base.weight".into(), &[HC], F32)?;
    add("output_norm.weight".into(), &[EMBD], F32)?;
    add("output.weight".into(), &[EMBD, VOCAB], Q8_0)?;
    for l in 0..LAYERS {
        let b = |s: &str| format!("blk.{l}.{s}");
        add(b("hc_attn_fn.weight"), &[hc_flat, hc_mix], F16)?;
        add(b("hc_attn_scale.weight"), &[3], F32)?;
        add(b("hc_attn_base.weight"), &[hc_mix], F32)?;
        add(b("attn_norm.weight"), &[EMBD], F32)?;
        add(b("attn_q_a.weight"), &[EMBD, Q_LORA], Q8_0)?;
        add(b("attn_q_a_norm.weight"), &[Q_LORA], F32)?;
        add(b("attn_q_b.weight"), &[Q_LORA, HEADS * HEAD_DIM], Q8_0)?;
        add(b("attn_kv.weight"), &[EMBD, HEAD_DIM], Q8_0)?;
        add(b("attn_kv_a_norm.weight"), &[HEAD_DIM], F32)?;
        add(b("attn_sinks.weight"), &[HEADS], F32)?;
        let group_in = HEAD_DIM * HEADS / O_GROUPS;
        add(
            b("attn_output_a.weight"),
            &[group_in, O_GROUPS * O_LORA],
            Q8_0,
        )?;
        add(b("attn_output_b.weight"), &[O_GROUPS * O_LORA, EMBD], Q8_0)?;
        add(b("hc_ffn_fn.weight"), &[hc_flat, hc_mix], F16)?;
        add(b("hc_ffn_scale.weight"), &[3], F32)?;
        add(b("hc_ffn_base.weight"), &[hc_mix], F32)?;
        add(b("ffn_norm.weight"), &[EMBD], F32)?;
        add(b("ffn_gate_inp.weight"), &[EMBD, EXPERTS], F16)?;
        add(
            b("ffn_gate_exps.weight"),
            &[EMBD, FF, EXPERTS],
            experts.gate_up(),
        )?;
        add(
            b("ffn_up_exps.weight"),
            &[EMBD, FF, EXPERTS],
            experts.gate_up(),
        )?;
        add(
            b("ffn_down_exps.weight"),
            &[FF, EMBD, EXPERTS],
            experts.down(),
        )?;
        add(b("ffn_gate_shexp.weight"), &[EMBD, FF], Q8_0)?;
        add(b("ffn_up_shexp.weight"), &[EMBD, FF], Q8_0)?;
        add(b("ffn_down_shexp.weight"), &[FF, EMBD], Q8_0)?;
        if l < HASH_LAYERS {
            add(b("ffn_gate_tid2eid.weight"), &[EXPERTS_USED, VOCAB], I32)?;
        } else {
            add(b("exp_probs_b.bias"), &[EXPERTS], F32)?;
        }
        let r = ratio(l);
        if r != 0 {
            let c = if r == 4 { 2 } else { 1 };
            add(b("attn_compressor_kv.weight"), &[EMBD, c * HEAD_DIM], F16)?;
            add(b("attn_compressor_gate.weight"), &[EMBD, c * HEAD_DIM], F16)?;
            add(b("attn_compressor_ape.weight"), &[c * HEAD_DIM, r], F16)?;
            add(b("attn_compressor_norm.weight"), &[HEAD_DIM], F32)?;
        }
        if r == 4 {
            add(
                b("indexer.attn_q_b.weight"),
                &[Q_LORA, IDX_HEADS * IDX_DIM],
                F16,
            )?;
            add(b("indexer.proj.weight"), &[EMBD, IDX_HEADS], F16)?;
            add(b("indexer_compressor_kv.weight"), &[EMBD, 2 * IDX_DIM], F16)?;
            add(
                b("indexer_compressor_gate.weight"),
                &[EMBD, 2 * IDX_DIM],
                F16,
            )?;
            add(b("indexer_compressor_ape.weight"), &[2 * IDX_DIM, 4], F16)?;
            add(b("indexer_compressor_norm.weight"), &[IDX_DIM], F32)?;
        }
    }
    Ok(Layout {
        metadata,
        tensors,
        alignment: 32,
    })
}

/// Expert `j` (of the `EXPERTS_USED`) for token `row` of a hash layer's
/// table: six distinct experts per token (steps of 43 from a hashed
/// start), every expert used about equally often over the vocabulary.
pub fn hashed_expert(row: u64, j: u64) -> i32 {
    let start = row.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 56;
    ((start + 43 * j) % EXPERTS) as i32
}

/// Whether `name` is a hash layer's token-to-expert table.
pub fn is_expert_table(name: &str) -> bool {
    name.ends_with("ffn_gate_tid2eid.weight")
}

/// Expert ids for the I32 values at `first..first + out.len() / 4` of a
/// token-to-expert table.
pub fn fill_expert_table(out: &mut [u8], first: u64) {
    for (i, v) in out.chunks_exact_mut(4).enumerate() {
        let k = first + i as u64;
        v.copy_from_slice(&hashed_expert(k / EXPERTS_USED, k % EXPERTS_USED).to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_token_gets_six_distinct_experts_and_all_are_used() {
        let mut count = vec![0u32; EXPERTS as usize];
        for row in 0..VOCAB {
            let e: Vec<i32> = (0..EXPERTS_USED).map(|j| hashed_expert(row, j)).collect();
            for (a, x) in e.iter().enumerate() {
                assert!((0..EXPERTS as i32).contains(x));
                assert!(!e[..a].contains(x), "row {row}: {e:?}");
                count[*x as usize] += 1;
            }
        }
        let (lo, hi) = (count.iter().min().unwrap(), count.iter().max().unwrap());
        assert!(*lo > 0 && *hi < 2 * *lo, "{lo}..{hi}");
    }
}
