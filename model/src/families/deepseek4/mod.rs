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
//! contract), [`weights`] (binder), [`hc`] (hyper-connections),
//! [`rope`], [`numerics`] (FP8/FP4/F16 activation rounding),
//! [`compressor`], [`indexer`], [`attention`], [`moe`], [`state`],
//! [`forward`].
//!
//! Projections go through `Backend::matmul` (quantization stays a property
//! of each tensor); the per-token mechanisms (hyper-connection mixing,
//! compressors, indexer scores, attention with sinks, routing) run on
//! host vectors and are the reference a device backend will be checked
//! against when they become backend ops.

pub mod attention;
pub mod compressor;
mod forward;
pub mod hc;
pub mod hparams;
pub mod indexer;
pub mod moe;
pub mod numerics;
pub mod rope;
pub mod state;
mod weights;

use std::sync::Arc;

use ds4_kernels::{Backend, Numerics};

use super::{
    Dims, FamilyDef, FamilyModel, KvLayout, Logits, ModelError, PagedInput, PrivateState,
    TensorSource,
};
use crate::chat::deepseek4::Ds4Chat;
use crate::chat::{ChatProtocol, PromptError};
use crate::gguf::Metadata;
pub use hparams::{Ds4HParams, REQUIRED_KEYS};
pub use numerics::Ds4Numerics;
use rope::Rope;
pub use state::Ds4State;
use weights::Ds4Weights;

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
    rope_plain: Rope,
    rope_comp: Rope,
    numerics: Ds4Numerics,
}

impl<B: Backend> Ds4Model<B> {
    pub fn load(src: &TensorSource<'_>, backend: &B) -> Result<Ds4Model<B>, ModelError> {
        let hparams = Ds4HParams::from_file(src.file())?;
        hparams::check_tensors(src.file(), &hparams)?;
        let weights = Ds4Weights::bind(src, &hparams, backend)?;
        let rope_plain = Rope::plain(hparams.n_rot, hparams.rope_base);
        let rope_comp = Rope::yarn(hparams.n_rot, hparams.compress_rope_base, &hparams.yarn);
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

    pub fn set_numerics(&mut self, numerics: Ds4Numerics) {
        self.numerics = numerics;
    }

    pub fn new_state(&self) -> Ds4State {
        Ds4State::new(&self.hparams)
    }

    /// Run `tokens` after the state's tokens. On error the state is left
    /// partially updated; callers reset it.
    pub fn forward(
        &self,
        backend: &B,
        state: &mut Ds4State,
        tokens: &[u32],
        want: Logits,
    ) -> Result<Vec<f32>, ModelError> {
        if let Some(&t) = tokens.iter().find(|&&t| t as usize >= self.hparams.n_vocab) {
            return Err(ModelError::BadToken {
                token: t,
                n_vocab: self.hparams.n_vocab,
            });
        }
        forward::Ctx {
            h: &self.hparams,
            w: &self.weights,
            be: backend,
            rope_plain: &self.rope_plain,
            rope_comp: &self.rope_comp,
            num: self.numerics,
        }
        .forward(state, tokens, want)
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

    /// The window, compressed rows and compressor frontiers are a private
    /// state, not plain key/value rows.
    fn kv_layout(&self) -> Option<KvLayout> {
        None
    }

    /// An estimate: compressed rows are f32, one per ratio positions of
    /// each compressed layer (ratio 4 dominates), plus indexer rows; the
    /// raw window is bounded.
    fn state_bytes_per_token(&self) -> usize {
        let h = &self.hparams;
        h.n_layer * (h.head_dim + h.idx_dim) * 4 / 4 + 1
    }

    fn scratch_bytes_per_row(&self) -> usize {
        let h = &self.hparams;
        // Four hyper-connection streams and the expert activations.
        (16 * h.n_embd + 4 * h.n_ff + h.n_head * h.head_dim * 2) * 4
    }

    fn forward_paged(
        &self,
        _backend: &B,
        _pool: &mut B::KvPool,
        _batch: &[PagedInput<'_>],
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        Err(ModelError::NotPaged {
            family: DeepSeek4::ARCHITECTURE,
        })
    }

    fn private_state(&self) -> Option<Box<dyn PrivateState>> {
        Some(Box::new(self.new_state()))
    }

    fn forward_private(
        &self,
        backend: &B,
        state: &mut dyn PrivateState,
        tokens: &[u32],
        want: Logits,
    ) -> Result<Vec<f32>, ModelError> {
        let state = state
            .as_any_mut()
            .downcast_mut::<Ds4State>()
            .expect("a DeepSeek V4 sequence holds a DeepSeek V4 state");
        self.forward(backend, state, tokens, want)
    }
}
