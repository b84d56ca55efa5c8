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

use ds4_kernels::{Backend, Numerics};

use super::{Logits, ModelError, TensorSource};
pub use hparams::{Ds4HParams, REQUIRED_KEYS};
pub use numerics::Ds4Numerics;
use rope::Rope;
pub use state::Ds4State;
use weights::Ds4Weights;

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
