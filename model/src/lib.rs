//! What a model is in ds4: the GGUF reader, family contracts with their
//! forward passes, the tokenizer and prompt rendering. Knows nothing of
//! HTTP or processes.

pub mod chat;
pub mod families;
pub mod gguf;
pub mod tokenizer;

pub use families::{
    Family, KvLayout, Logits, Model, ModelError, ModelInfo, PagedInput, PoolSizes, Sequence,
    StateLayout, StatePool,
};
