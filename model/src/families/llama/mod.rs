//! The `llama` family: decoder-only transformer with RMSNorm, rotary
//! embeddings (ggml "normal" pair layout, as llama GGUFs are converted),
//! grouped-query attention and a SwiGLU feed-forward (LLaMA,
//! arXiv:2302.13971). Covers SmolLM2, the embedded default model.
//!
//! Checked against llama.cpp (`src/models/llama.cpp`) on
//! SmolLM2-135M-Instruct: prompt tokens, top-5 logits and the greedy
//! continuation (see `model/tests/llama_parity.rs`).
//!
//! Families that keep llama's layout (qwen2: q/k/v biases, NeoX RoPE) are
//! bound and run by this code too, as a [`Variant`].
//!
//! Files in forward-pass order: [`hparams`] (keys and the tensor
//! contract), [`weights`] (binder), [`forward`].

mod forward;
pub mod hparams;
mod weights;

use ds4_kernels::Backend;

use super::{ModelError, PagedInput, TensorSource};
pub use hparams::{LlamaHParams, Variant, LLAMA, REQUIRED_KEYS};
use weights::LlamaWeights;

/// A bound llama model.
pub struct LlamaModel<B: Backend> {
    hparams: LlamaHParams,
    weights: LlamaWeights<B>,
}

impl<B: Backend> LlamaModel<B> {
    pub fn load(src: &TensorSource<'_>, backend: &B) -> Result<LlamaModel<B>, ModelError> {
        LlamaModel::load_as(src, backend, LLAMA)
    }

    /// Bind a model of a family with llama's layout.
    pub fn load_as(
        src: &TensorSource<'_>,
        backend: &B,
        variant: Variant,
    ) -> Result<LlamaModel<B>, ModelError> {
        let hparams = LlamaHParams::from_file_as(src.file(), variant)?;
        hparams::check_tensors(src.file(), &hparams)?;
        let weights = LlamaWeights::bind(src, &hparams, backend)?;
        Ok(LlamaModel { hparams, weights })
    }

    pub fn hparams(&self) -> &LlamaHParams {
        &self.hparams
    }

    /// Values per token of each layer's keys (and of its values).
    pub fn kv_dim(&self) -> usize {
        self.hparams.n_head_kv * self.hparams.head_dim
    }

    pub fn forward(
        &self,
        backend: &B,
        pool: &mut B::KvPool,
        batch: &[PagedInput<'_>],
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        forward::forward(&self.hparams, &self.weights, backend, pool, batch)
    }
}
