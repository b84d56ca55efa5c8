//! Binding a llama-layout GGUF's tensors to a backend.

use ds4_kernels::{Backend, DenseLayer};

use super::LlamaHParams;
use crate::families::{ModelError, TensorSource};

pub struct LayerWeights<B: Backend> {
    pub attn_norm: B::Weight,
    pub wq: B::Weight,
    pub wk: B::Weight,
    pub wv: B::Weight,
    /// q/k/v biases (variants with [`super::hparams::Variant::qkv_bias`]).
    pub qkv_bias: Option<[B::Weight; 3]>,
    pub wo: B::Weight,
    pub ffn_norm: B::Weight,
    pub w_gate: B::Weight,
    pub w_up: B::Weight,
    pub w_down: B::Weight,
}

impl<B: Backend> LayerWeights<B> {
    /// The layer as the backend's fused decoder layer takes it (the q/k/v
    /// biases aside).
    pub fn dense(&self) -> DenseLayer<'_, B::Weight> {
        DenseLayer {
            attn_norm: &self.attn_norm,
            wq: &self.wq,
            wk: &self.wk,
            wv: &self.wv,
            wo: &self.wo,
            ffn_norm: &self.ffn_norm,
            w_gate: &self.w_gate,
            w_up: &self.w_up,
            w_down: &self.w_down,
        }
    }
}

pub struct LlamaWeights<B: Backend> {
    pub token_embd: B::Weight,
    pub layers: Vec<LayerWeights<B>>,
    pub output_norm: B::Weight,
    /// `None` when tied to `token_embd`.
    pub output: Option<B::Weight>,
}

impl<B: Backend> LlamaWeights<B> {
    pub fn output(&self) -> &B::Weight {
        self.output.as_ref().unwrap_or(&self.token_embd)
    }

    /// Bind every tensor (the inventory has been checked already).
    pub fn bind(
        src: &TensorSource<'_>,
        h: &LlamaHParams,
        backend: &B,
    ) -> Result<LlamaWeights<B>, ModelError> {
        let family = h.variant.family.name();
        let bind = |name: &str| -> Result<B::Weight, ModelError> {
            let t = src.info(family, name)?;
            Ok(backend.bind_weight(src.weight(t))?)
        };
        let layers = (0..h.n_layer)
            .map(|i| {
                let b = |s: &str| bind(&format!("blk.{i}.{s}.weight"));
                let bias = |s: &str| bind(&format!("blk.{i}.{s}.bias"));
                let qkv_bias = if h.variant.qkv_bias {
                    Some([bias("attn_q")?, bias("attn_k")?, bias("attn_v")?])
                } else {
                    None
                };
                Ok(LayerWeights {
                    attn_norm: b("attn_norm")?,
                    wq: b("attn_q")?,
                    wk: b("attn_k")?,
                    wv: b("attn_v")?,
                    qkv_bias,
                    wo: b("attn_output")?,
                    ffn_norm: b("ffn_norm")?,
                    w_gate: b("ffn_gate")?,
                    w_up: b("ffn_up")?,
                    w_down: b("ffn_down")?,
                })
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        Ok(LlamaWeights {
            token_embd: bind("token_embd.weight")?,
            layers,
            output_norm: bind("output_norm.weight")?,
            output: if h.tied_embeddings {
                None
            } else {
                Some(bind("output.weight")?)
            },
        })
    }
}
