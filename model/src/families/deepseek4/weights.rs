//! Binding a deepseek4 GGUF's tensors: every tensor is bound to the
//! backend in place, as the file stores it. The routed experts stay one
//! stacked weight per projection (expert `e` is row block `e`, for
//! `Backend::moe_experts`), the grouped output projection one weight (row
//! block `g` reads group `g`, for `Backend::matmul_grouped`), and the I32
//! hash-routing table a weight of its own (its expert ids are checked
//! here).

use ds4_kernels::quant::GgmlType;
use ds4_kernels::Backend;

use super::hparams::Ds4HParams;
use crate::families::{ModelError, TensorSource};

const FAMILY: &str = "deepseek4";

/// Hyper-connection mixer of one sublayer (or of the output head).
pub struct HcWeights<B: Backend> {
    pub fn_: B::Weight,
    pub scale: B::Weight,
    pub base: B::Weight,
}

pub struct CompressorWeights<B: Backend> {
    pub kv: B::Weight,
    pub gate: B::Weight,
    /// Position bias of the scores, `[ratio, lanes·dim]`.
    pub ape: B::Weight,
    pub norm: B::Weight,
}

pub struct IndexerWeights<B: Backend> {
    pub q_b: B::Weight,
    pub proj: B::Weight,
    pub compressor: CompressorWeights<B>,
}

/// A SwiGLU feed-forward: the shared expert, or all routed experts
/// stacked (expert `e` is row block `e` of each).
pub struct FfnWeights<B: Backend> {
    pub gate: B::Weight,
    pub up: B::Weight,
    pub down: B::Weight,
}

pub struct LayerWeights<B: Backend> {
    pub hc_attn: HcWeights<B>,
    pub attn_norm: B::Weight,
    pub q_a: B::Weight,
    pub q_a_norm: B::Weight,
    pub q_b: B::Weight,
    pub kv: B::Weight,
    pub kv_norm: B::Weight,
    pub sinks: B::Weight,
    /// `[groups·o_lora, group input]`: row block `g` reads group `g`.
    pub out_a: B::Weight,
    pub out_b: B::Weight,
    pub compressor: Option<CompressorWeights<B>>,
    pub indexer: Option<IndexerWeights<B>>,
    pub hc_ffn: HcWeights<B>,
    pub ffn_norm: B::Weight,
    pub router: B::Weight,
    /// Selection bias (biased top-k layers; absent means 0).
    pub router_bias: Option<B::Weight>,
    /// Expert ids per token id (hash-routed layers), `[n_vocab, k]` i32.
    pub tid2eid: Option<B::Weight>,
    pub experts: FfnWeights<B>,
    pub shared: FfnWeights<B>,
}

pub struct Ds4Weights<B: Backend> {
    pub token_embd: B::Weight,
    pub layers: Vec<LayerWeights<B>>,
    pub hc_out: HcWeights<B>,
    pub output_norm: B::Weight,
    pub output: B::Weight,
}

impl<B: Backend> Ds4Weights<B> {
    pub fn bind(
        src: &TensorSource<'_>,
        h: &Ds4HParams,
        be: &B,
    ) -> Result<Ds4Weights<B>, ModelError> {
        let bind = |name: &str| -> Result<B::Weight, ModelError> {
            Ok(be.bind_weight(src.weight(src.info(FAMILY, name)?))?)
        };
        let hc = |prefix: &str| -> Result<HcWeights<B>, ModelError> {
            Ok(HcWeights {
                fn_: bind(&format!("{prefix}_fn.weight"))?,
                scale: bind(&format!("{prefix}_scale.weight"))?,
                base: bind(&format!("{prefix}_base.weight"))?,
            })
        };
        let compressor = |prefix: &str| -> Result<CompressorWeights<B>, ModelError> {
            Ok(CompressorWeights {
                kv: bind(&format!("{prefix}_kv.weight"))?,
                gate: bind(&format!("{prefix}_gate.weight"))?,
                ape: bind(&format!("{prefix}_ape.weight"))?,
                norm: bind(&format!("{prefix}_norm.weight"))?,
            })
        };
        let mut layers = Vec::with_capacity(h.n_layer);
        for (l, &r) in h.ratios.iter().enumerate() {
            let b = |s: &str| format!("blk.{l}.{s}.weight");
            let tid2eid = if l < h.n_hash_layers {
                let name = b("ffn_gate_tid2eid");
                let t = src.info(FAMILY, &name)?;
                debug_assert_eq!(t.ggml_type, GgmlType::I32);
                if let Some(id) = src
                    .bytes(t)
                    .as_slice()
                    .chunks_exact(4)
                    .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .find(|&id| id < 0 || id as usize >= h.n_expert)
                {
                    return Err(ModelError::BadKey {
                        family: FAMILY,
                        key: name,
                        value: id.to_string(),
                        problem: format!("expert ids must lie in 0..{}", h.n_expert),
                    });
                }
                Some(bind(&name)?)
            } else {
                None
            };
            let bias_name = format!("blk.{l}.exp_probs_b.bias");
            let router_bias = match src.file().tensor(&bias_name) {
                Some(_) => Some(bind(&bias_name)?),
                None => None,
            };
            layers.push(LayerWeights {
                hc_attn: hc(&format!("blk.{l}.hc_attn"))?,
                attn_norm: bind(&b("attn_norm"))?,
                q_a: bind(&b("attn_q_a"))?,
                q_a_norm: bind(&b("attn_q_a_norm"))?,
                q_b: bind(&b("attn_q_b"))?,
                kv: bind(&b("attn_kv"))?,
                kv_norm: bind(&b("attn_kv_a_norm"))?,
                sinks: bind(&b("attn_sinks"))?,
                out_a: bind(&b("attn_output_a"))?,
                out_b: bind(&b("attn_output_b"))?,
                compressor: if r != 0 {
                    Some(compressor(&format!("blk.{l}.attn_compressor"))?)
                } else {
                    None
                },
                indexer: if r == 4 {
                    Some(IndexerWeights {
                        q_b: bind(&b("indexer.attn_q_b"))?,
                        proj: bind(&b("indexer.proj"))?,
                        compressor: compressor(&format!("blk.{l}.indexer_compressor"))?,
                    })
                } else {
                    None
                },
                hc_ffn: hc(&format!("blk.{l}.hc_ffn"))?,
                ffn_norm: bind(&b("ffn_norm"))?,
                router: bind(&b("ffn_gate_inp"))?,
                router_bias,
                tid2eid,
                experts: FfnWeights {
                    gate: bind(&b("ffn_gate_exps"))?,
                    up: bind(&b("ffn_up_exps"))?,
                    down: bind(&b("ffn_down_exps"))?,
                },
                shared: FfnWeights {
                    gate: bind(&b("ffn_gate_shexp"))?,
                    up: bind(&b("ffn_up_shexp"))?,
                    down: bind(&b("ffn_down_shexp"))?,
                },
            });
        }
        Ok(Ds4Weights {
            token_embd: bind("token_embd.weight")?,
            layers,
            hc_out: hc("output_hc")?,
            output_norm: bind("output_norm.weight")?,
            output: bind("output.weight")?,
        })
    }
}
