//! Binding a deepseek4 GGUF's tensors.
//!
//! Matrices are bound to the backend in place. Routed experts are bound one
//! expert at a time (a contiguous `[in, out]` slice of the stacked tensor)
//! and the grouped output projection one group at a time (a block of rows),
//! so that every product is a plain `Backend::matmul`. Vectors used
//! element-wise (norm weights, hyper-connection scales and biases, sinks,
//! router bias, compressor position biases) and the I32 hash-routing table
//! are read to host memory.

use ds4_kernels::quant::{self, GgmlType};
use ds4_kernels::{Backend, WeightSource};

use super::hparams::Ds4HParams;
use crate::families::{ModelError, TensorSource};
use crate::gguf::TensorInfo;

const FAMILY: &str = "deepseek4";

/// Hyper-connection mixer of one sublayer (or of the output head).
pub struct HcWeights<B: Backend> {
    /// `[mix, n_hc·D]` projection.
    pub fn_: B::Weight,
    pub scale: Vec<f32>,
    pub base: Vec<f32>,
}

/// One compressor (attention or indexer).
pub struct CompressorWeights<B: Backend> {
    pub kv: B::Weight,
    pub gate: B::Weight,
    /// `[ratio, lanes·dim]` position bias on the scores.
    pub ape: Vec<f32>,
    pub norm: Vec<f32>,
}

pub struct IndexerWeights<B: Backend> {
    pub q_b: B::Weight,
    pub proj: B::Weight,
    pub compressor: CompressorWeights<B>,
}

pub struct Expert<B: Backend> {
    pub gate: B::Weight,
    pub up: B::Weight,
    pub down: B::Weight,
}

pub struct LayerWeights<B: Backend> {
    pub hc_attn: HcWeights<B>,
    pub attn_norm: Vec<f32>,
    pub q_a: B::Weight,
    pub q_a_norm: Vec<f32>,
    pub q_b: B::Weight,
    pub kv: B::Weight,
    pub kv_norm: Vec<f32>,
    pub sinks: Vec<f32>,
    /// `attn_output_a` split by output group.
    pub out_a: Vec<B::Weight>,
    pub out_b: B::Weight,
    pub compressor: Option<CompressorWeights<B>>,
    pub indexer: Option<IndexerWeights<B>>,
    pub hc_ffn: HcWeights<B>,
    pub ffn_norm: Vec<f32>,
    pub router: B::Weight,
    /// Selection bias (non-hash layers; zeros when absent).
    pub router_bias: Vec<f32>,
    /// Hash layers: `n_expert_used` expert ids per token id.
    pub tid2eid: Option<Vec<u32>>,
    pub experts: Vec<Expert<B>>,
    pub shared: Expert<B>,
}

pub struct Ds4Weights<B: Backend> {
    pub token_embd: B::Weight,
    pub layers: Vec<LayerWeights<B>>,
    pub hc_out: HcWeights<B>,
    pub output_norm: Vec<f32>,
    pub output: B::Weight,
}

/// All values of a tensor as f32 (any float or quant type; I32 converted).
pub fn host_f32(src: &TensorSource<'_>, name: &str) -> Result<Vec<f32>, ModelError> {
    let t = src.info(FAMILY, name)?;
    let bytes = src.bytes(t);
    let bytes = bytes.as_slice();
    let n = t.n_elements() as usize;
    let mut out = vec![0f32; n];
    let row = t.shape[0] as usize;
    let row_bytes = t.ggml_type.row_bytes(row).unwrap_or(0);
    for (dst, src) in out.chunks_mut(row).zip(bytes.chunks(row_bytes.max(1))) {
        quant::dequantize_row(t.ggml_type, src, dst).map_err(|e| ModelError::BadKey {
            family: FAMILY,
            key: name.into(),
            value: t.ggml_type.to_string(),
            problem: e.to_string(),
        })?;
    }
    Ok(out)
}

/// A block of `n_rows` rows starting at row `first` of a tensor (row =
/// `shape[0]` values), as a weight source.
fn row_block(
    src: &TensorSource<'_>,
    t: &TensorInfo,
    first: usize,
    n_rows: usize,
    name: String,
) -> WeightSource {
    let cols = t.shape[0] as usize;
    let row_bytes = t
        .ggml_type
        .row_bytes(cols)
        .expect("tensor rows are whole blocks (checked when the file is opened)");
    let bytes = src
        .bytes(t)
        .slice(first * row_bytes, n_rows * row_bytes)
        .expect("row block lies inside the tensor, whose range was checked");
    let device = src
        .device(t)
        .and_then(|d| d.slice(first * row_bytes, n_rows * row_bytes));
    WeightSource {
        name,
        ggml_type: t.ggml_type,
        rows: n_rows,
        cols,
        bytes,
        device,
    }
}

impl<B: Backend> Ds4Weights<B> {
    /// Bind every tensor (the inventory has been checked already).
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
                scale: host_f32(src, &format!("{prefix}_scale.weight"))?,
                base: host_f32(src, &format!("{prefix}_base.weight"))?,
            })
        };
        let compressor = |prefix: &str| -> Result<CompressorWeights<B>, ModelError> {
            Ok(CompressorWeights {
                kv: bind(&format!("{prefix}_kv.weight"))?,
                gate: bind(&format!("{prefix}_gate.weight"))?,
                ape: host_f32(src, &format!("{prefix}_ape.weight"))?,
                norm: host_f32(src, &format!("{prefix}_norm.weight"))?,
            })
        };
        let mut layers = Vec::with_capacity(h.n_layer);
        for (l, &r) in h.ratios.iter().enumerate() {
            let b = |s: &str| format!("blk.{l}.{s}.weight");
            let out_a_t = src.info(FAMILY, &b("attn_output_a"))?;
            let out_a = (0..h.o_groups)
                .map(|g| {
                    let src = row_block(
                        src,
                        out_a_t,
                        g * h.o_lora,
                        h.o_lora,
                        format!("{}[group {g}]", out_a_t.name),
                    );
                    be.bind_weight(src).map_err(ModelError::from)
                })
                .collect::<Result<Vec<_>, _>>()?;
            let expert_slices = |s: &str| -> Result<Vec<B::Weight>, ModelError> {
                let t = src.info(FAMILY, &b(s))?;
                let rows = t.shape[1] as usize;
                (0..h.n_expert)
                    .map(|e| {
                        let src =
                            row_block(src, t, e * rows, rows, format!("{}[expert {e}]", t.name));
                        be.bind_weight(src).map_err(ModelError::from)
                    })
                    .collect()
            };
            let (gates, ups, downs) = (
                expert_slices("ffn_gate_exps")?,
                expert_slices("ffn_up_exps")?,
                expert_slices("ffn_down_exps")?,
            );
            let experts = gates
                .into_iter()
                .zip(ups)
                .zip(downs)
                .map(|((gate, up), down)| Expert { gate, up, down })
                .collect();
            let tid2eid = if l < h.n_hash_layers {
                let name = b("ffn_gate_tid2eid");
                let t = src.info(FAMILY, &name)?;
                debug_assert_eq!(t.ggml_type, GgmlType::I32);
                let ids: Vec<u32> = src
                    .bytes(t)
                    .as_slice()
                    .chunks_exact(4)
                    .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .map(|id| {
                        u32::try_from(id)
                            .ok()
                            .filter(|&e| (e as usize) < h.n_expert)
                            .ok_or_else(|| ModelError::BadKey {
                                family: FAMILY,
                                key: name.clone(),
                                value: id.to_string(),
                                problem: format!("expert ids must lie in 0..{}", h.n_expert),
                            })
                    })
                    .collect::<Result<_, _>>()?;
                Some(ids)
            } else {
                None
            };
            let bias_name = format!("blk.{l}.exp_probs_b.bias");
            let router_bias = if src.file().tensor(&bias_name).is_some() {
                host_f32(src, &bias_name)?
            } else {
                vec![0.0; h.n_expert]
            };
            layers.push(LayerWeights {
                hc_attn: hc(&format!("blk.{l}.hc_attn"))?,
                attn_norm: host_f32(src, &b("attn_norm"))?,
                q_a: bind(&b("attn_q_a"))?,
                q_a_norm: host_f32(src, &b("attn_q_a_norm"))?,
                q_b: bind(&b("attn_q_b"))?,
                kv: bind(&b("attn_kv"))?,
                kv_norm: host_f32(src, &b("attn_kv_a_norm"))?,
                sinks: host_f32(src, &b("attn_sinks"))?,
                out_a,
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
                ffn_norm: host_f32(src, &b("ffn_norm"))?,
                router: bind(&b("ffn_gate_inp"))?,
                router_bias,
                tid2eid,
                experts,
                shared: Expert {
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
            output_norm: host_f32(src, "output_norm.weight")?,
            output: bind("output.weight")?,
        })
    }
}
