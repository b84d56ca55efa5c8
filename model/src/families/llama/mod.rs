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

use std::sync::Arc;

use ds4_kernels::Backend;

use super::{
    Dims, FamilyDef, FamilyModel, KvLayout, ModelError, PagedInput, StateLayout, StatePool,
    TensorSource,
};
use crate::chat::templated::TemplateChat;
use crate::chat::{ChatProtocol, PromptError};
use crate::gguf::Metadata;
pub use hparams::{LlamaHParams, Variant, LLAMA, REQUIRED_KEYS};
use weights::LlamaWeights;

/// The llama family's registration.
#[derive(Debug)]
pub struct Llama;

impl FamilyDef for Llama {
    const ARCHITECTURE: &'static str = "llama";
    const REQUIRED_KEYS: &'static [&'static str] = REQUIRED_KEYS;

    fn load<B: Backend>(
        src: &TensorSource<'_>,
        backend: &B,
    ) -> Result<Box<dyn FamilyModel<B>>, ModelError> {
        Ok(Box::new(LlamaModel::load(src, backend)?))
    }

    /// The model's own Jinja template, tools through the generic envelope.
    fn chat(meta: &Metadata) -> Result<Arc<dyn ChatProtocol>, PromptError> {
        Ok(Arc::new(TemplateChat::from_gguf(meta)?))
    }
}

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

impl<B: Backend> FamilyModel<B> for LlamaModel<B> {
    fn dims(&self) -> Dims {
        let h = &self.hparams;
        Dims {
            n_vocab: h.n_vocab,
            n_ctx_train: h.n_ctx_train,
            n_layer: h.n_layer,
            n_embd: h.n_embd,
        }
    }

    fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
        self
    }

    fn state_layout(&self) -> StateLayout {
        StateLayout::Kv(KvLayout {
            n_layer: self.hparams.n_layer,
            kv_dim: self.kv_dim(),
        })
    }

    /// f16 keys and values of every layer.
    fn state_bytes_per_token(&self) -> usize {
        self.hparams.n_layer * 2 * self.kv_dim() * 2
    }

    fn scratch_bytes_per_row(&self) -> usize {
        let h = &self.hparams;
        let q = h.n_head * h.head_dim;
        // x, norm, proj; q, att; k, v; gate, up, act; and the quantized
        // copy of the widest input.
        (3 * h.n_embd + 2 * q + 2 * self.kv_dim() + 3 * h.n_ff) * 4 + h.n_ff.max(h.n_embd)
    }

    fn forward_paged(
        &self,
        backend: &B,
        pool: &mut StatePool<B>,
        batch: &[PagedInput<'_>],
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        self.forward(backend, pool.kv_mut()?, batch)
    }
}
