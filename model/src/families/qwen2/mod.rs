//! The `qwen2` family: llama's layout (RMSNorm, grouped-query attention,
//! SwiGLU feed-forward) plus a bias on each of the q, k and v projections,
//! and rotary embeddings in the NeoX layout (pairs `(x[i], x[i + d/2])`)
//! over the whole head (Qwen2 Technical Report, arXiv:2407.10671). Covers
//! Qwen2, Qwen2.5 and the DeepSeek-R1-Distill-Qwen models.
//!
//! Written after llama.cpp's `src/models/qwen2.cpp` (`LLM_ARCH_QWEN2`:
//! `LLAMA_ROPE_TYPE_NEOX`, `bq`/`bk`/`bv` added after the projections) and
//! checked against an independent float64 NumPy evaluation of a small
//! random qwen2 GGUF (`model/tests/qwen2_parity.rs`,
//! `model/tests/fixtures/qwen2/`).
//!
//! The family is a [`Variant`] of the llama code: same hyper-parameters
//! (read under the `qwen2.` keys), same binder and forward pass, which add
//! the biases when the variant has them. Its tokenizer's pre-tokenizer is
//! `qwen2` (also named `deepseek-r1-qwen`), in [`crate::tokenizer`].

use std::sync::Arc;

use ds4_kernels::{Backend, RopeMode};

use super::llama::{LlamaModel, Variant};
use super::{Family, FamilyDef, FamilyModel, ModelError, TensorSource};
use crate::chat::templated::TemplateChat;
use crate::chat::{ChatProtocol, PromptError};
use crate::gguf::Metadata;

/// The qwen2 family's registration.
#[derive(Debug)]
pub struct Qwen2;

impl FamilyDef for Qwen2 {
    const ARCHITECTURE: &'static str = "qwen2";
    const REQUIRED_KEYS: &'static [&'static str] = REQUIRED_KEYS;

    fn load<B: Backend>(
        src: &TensorSource<'_>,
        backend: &B,
    ) -> Result<Box<dyn FamilyModel<B>>, ModelError> {
        Ok(Box::new(load(src, backend)?))
    }

    /// The model's own Jinja template (Qwen2's ChatML), tools through the
    /// generic envelope.
    fn chat(meta: &Metadata) -> Result<Arc<dyn ChatProtocol>, PromptError> {
        Ok(Arc::new(TemplateChat::from_gguf(meta)?))
    }
}

/// Metadata keys a qwen2 GGUF must carry. Unlike llama, the KV head count
/// and the RoPE base are required: Qwen2 models use several bases (10^4,
/// 10^6) and a silent default would be wrong for some of them.
pub const REQUIRED_KEYS: &[&str] = &[
    "{arch}.block_count",
    "{arch}.context_length",
    "{arch}.embedding_length",
    "{arch}.feed_forward_length",
    "{arch}.attention.head_count",
    "{arch}.attention.head_count_kv",
    "{arch}.attention.layer_norm_rms_epsilon",
    "{arch}.rope.freq_base",
];

/// How qwen2 differs from llama.
pub const VARIANT: Variant = Variant {
    family: Family::Qwen2,
    rope_mode: RopeMode::Neox,
    qkv_bias: true,
    unsupported_hint: "qwen2 MoE and vision tensors belong to other architectures \
                       (qwen2moe, qwen2vl), which are not supported",
};

/// Validate a qwen2 GGUF against its contract and bind it.
pub fn load<B: Backend>(src: &TensorSource<'_>, backend: &B) -> Result<LlamaModel<B>, ModelError> {
    LlamaModel::load_as(src, backend, VARIANT)
}
