//! The `deepseek4` family: DeepSeek V4 Flash (DeepSeek-AI, "DeepSeek-V4",
//! 2026) as its published GGUF files lay it out — hyper-connections with
//! Sinkhorn mixing, one shared K=V head with attention sinks over a raw
//! sliding window plus compressed rows (ratio 4 with the lightning indexer,
//! ratio 128), hash-routed first MoE layers, sqrt-softplus routing,
//! clamped SwiGLU experts and a shared expert.
//!
//! Written from the project's DeepSeek V4 specification and checked in
//! exact numerics against llama.cpp's `deepseek4` model and a float64
//! NumPy reference on a miniature model with the Flash layout (see
//! `model/tests/deepseek4_oracle.rs`).
//!
//! Files in forward-pass order: [`hparams`] (keys and the tensor
//! contract), [`weights`] (binder), [`rope`] (frequencies),
//! [`numerics`] (which activation roundings apply), `forward` (the pass
//! over a batch of sequences).
//!
//! Every step is a `Backend` op, so the pass runs where the backend
//! computes (the CPU reference or the GPU), from embedding to logits:
//! projections through `matmul` (quantization stays a property of each
//! tensor), the hyper-connections, compressors, lightning indexer,
//! attention with sinks and routed experts through the ops named for
//! them. The state lives in the backend's compressed-attention pool:
//! pooled rows in blocks shared by prefix, raw rows in window blocks,
//! compressor frontiers in a slot per sequence
//! (`docs/design/deepseek4-state.md`).

mod forward;
pub mod hparams;
pub mod numerics;
pub mod rope;
mod weights;

use std::sync::Arc;

use ds4_kernels::{Backend, Numerics, TailRope};

use super::{
    CompressedLayout, Dims, FamilyDef, FamilyModel, ModelError, PagedInput, StateLayout, StatePool,
    TensorSource,
};
use crate::chat::deepseek4::Ds4Chat;
use crate::chat::{ChatProtocol, PromptError};
use crate::gguf::Metadata;
pub use hparams::{Ds4HParams, REQUIRED_KEYS};
pub use numerics::Ds4Numerics;
use weights::Ds4Weights;

/// Positions per block of the paged state: a multiple of both ratios and
/// the raw window, so that a block boundary is a point where every
/// compressor's current window is empty (`docs/design/deepseek4-state.md`).
pub const BLOCK: usize = 128;

/// The deepseek4 family's registration.
#[derive(Debug)]
pub struct DeepSeek4;

impl FamilyDef for DeepSeek4 {
    const ARCHITECTURE: &'static str = "deepseek4";
    const REQUIRED_KEYS: &'static [&'static str] = REQUIRED_KEYS;

    fn load<B: Backend>(
        src: &TensorSource<'_>,
        backend: &B,
    ) -> Result<Box<dyn FamilyModel<B>>, ModelError> {
        Ok(Box::new(Ds4Model::load(src, backend)?))
    }

    /// DeepSeek V4 has no Jinja template: its own prompt, DSML tools.
    fn chat(_meta: &Metadata) -> Result<Arc<dyn ChatProtocol>, PromptError> {
        Ok(Arc::new(Ds4Chat))
    }
}

/// A bound DeepSeek V4 model.
pub struct Ds4Model<B: Backend> {
    hparams: Ds4HParams,
    weights: Ds4Weights<B>,
    rope_plain: TailRope,
    rope_comp: TailRope,
    numerics: Ds4Numerics,
}

impl<B: Backend> Ds4Model<B> {
    pub fn load(src: &TensorSource<'_>, backend: &B) -> Result<Ds4Model<B>, ModelError> {
        let hparams = Ds4HParams::from_file(src.file())?;
        hparams::check_tensors(src.file(), &hparams)?;
        let weights = Ds4Weights::bind(src, &hparams, backend)?;
        let rope_plain = rope::plain(hparams.n_rot, hparams.rope_base);
        let rope_comp = rope::yarn(hparams.n_rot, hparams.compress_rope_base, &hparams.yarn);
        let numerics = match backend.numerics() {
            Numerics::Production => Ds4Numerics::PRODUCTION,
            Numerics::Exact => Ds4Numerics::EXACT,
        };
        Ok(Ds4Model {
            hparams,
            weights,
            rope_plain,
            rope_comp,
            numerics,
        })
    }

    pub fn hparams(&self) -> &Ds4HParams {
        &self.hparams
    }

    /// The activation roundings in use (by default those of the backend's
    /// numerics: all on for production, all off for exact).
    pub fn numerics(&self) -> Ds4Numerics {
        self.numerics
    }

    /// Change the roundings (tests; before any state pool is made, since
    /// the pool's row dtype follows `f16_cache`).
    pub fn set_numerics(&mut self, numerics: Ds4Numerics) {
        self.numerics = numerics;
    }

    fn layout(&self) -> CompressedLayout {
        let h = &self.hparams;
        CompressedLayout {
            ratios: Arc::from(h.ratios.as_slice()),
            head_dim: h.head_dim,
            index_dim: h.idx_dim,
            window: h.window,
            block_size: BLOCK,
            f16_rows: self.numerics.f16_cache,
        }
    }
}

impl<B: Backend> FamilyModel<B> for Ds4Model<B> {
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
        StateLayout::Compressed(self.layout())
    }

    /// The pooled and indexer rows: a block's bytes over its positions.
    fn state_bytes_per_token(&self) -> usize {
        let l = self.layout();
        let row_bytes = if l.f16_rows { 2 } else { 4 };
        let per_block: usize = l
            .ratios
            .iter()
            .map(|&r| match r {
                0 => 0,
                4 => (BLOCK / 4) * (l.head_dim + l.index_dim),
                r => (BLOCK / r) * l.head_dim,
            })
            .sum();
        (per_block * row_bytes).div_ceil(BLOCK)
    }

    fn scratch_bytes_per_row(&self) -> usize {
        let h = &self.hparams;
        // Four hyper-connection streams, the queries and attention output,
        // the expert activations.
        (16 * h.n_embd + 4 * h.n_ff + h.n_head * h.head_dim * 2) * 4
    }

    fn forward_paged(
        &self,
        backend: &B,
        pool: &mut StatePool<B>,
        batch: &[PagedInput<'_>],
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        forward::Ctx {
            h: &self.hparams,
            w: &self.weights,
            be: backend,
            rope_plain: &self.rope_plain,
            rope_comp: &self.rope_comp,
            num: self.numerics,
        }
        .forward(pool.compressed_mut()?, batch)
    }
}
