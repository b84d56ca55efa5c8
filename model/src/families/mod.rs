//! Model families: one folder per family, registered in one table.
//!
//! A GGUF is accepted only when its `general.architecture` names a family
//! registered in [`families!`] below and the family's contract (required
//! keys, tensor inventory and shapes) holds. Validation runs on the mapped
//! header before any weight is bound.
//!
//! Each family folder answers for itself through [`FamilyDef`] (its
//! architecture string, required keys, binder and chat protocol) and the
//! [`FamilyModel`] it binds (forward pass, KV shape, memory per token and
//! scratch estimates); this module only delegates. Adding a family means a
//! folder and one line in the `families!` table.

mod contract;
pub mod deepseek4;
pub mod llama;
mod model;
pub mod qwen2;
mod state;

use std::any::Any;
use std::sync::Arc;

use ds4_kernels::{Backend, BackendError, DeviceBytes, HostBytes, WeightSource};

use crate::chat::{ChatProtocol, PromptError};
use crate::gguf::{GgufError, GgufFile, Metadata, TensorInfo};
pub use contract::{check_inventory, ExpectedTensor};
pub use model::{Model, Sequence};
pub use state::{CompressedLayout, KvLayout, PoolSizes, StateLayout, StatePool};

/// What a family folder registers: its architecture, the metadata keys it
/// requires, how to bind a model of it, and its chat protocol.
pub trait FamilyDef {
    /// The `general.architecture` string.
    const ARCHITECTURE: &'static str;
    /// Metadata keys that must be present (`{arch}` stands for the architecture).
    const REQUIRED_KEYS: &'static [&'static str];

    /// Validate the file against the family's contract and bind its
    /// weights (required keys are already checked).
    fn load<B: Backend>(
        src: &TensorSource<'_>,
        backend: &B,
    ) -> Result<Box<dyn FamilyModel<B>>, ModelError>;

    /// The family's chat protocol for a model with this metadata.
    fn chat(meta: &Metadata) -> Result<Arc<dyn ChatProtocol>, PromptError>;
}

/// The sizes of a bound model the serving layer needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dims {
    pub n_vocab: usize,
    pub n_ctx_train: usize,
    pub n_layer: usize,
    pub n_embd: usize,
}

/// A bound model of one family, as the serving layer drives it.
pub trait FamilyModel<B: Backend>: Send + Sync {
    fn dims(&self) -> Dims;

    /// The family's own model type, for family-specific settings.
    fn as_any_mut(&mut self) -> &mut dyn Any;

    /// Where its sequences keep their state.
    fn state_layout(&self) -> StateLayout;

    /// Bytes of state per token of context (the compressed or key/value
    /// rows; not the per-sequence windows and slots).
    fn state_bytes_per_token(&self) -> usize;

    /// Activation scratch per token row of a forward pass, in bytes (an
    /// upper estimate).
    fn scratch_bytes_per_row(&self) -> usize;

    /// One forward pass over several sequences of a state pool of the
    /// family's layout; per input, the logits it asked for.
    fn forward_paged(
        &self,
        backend: &B,
        pool: &mut StatePool<B>,
        batch: &[PagedInput<'_>],
    ) -> Result<Vec<Vec<f32>>, ModelError>;
}

/// One row of the family table.
#[derive(Debug)]
pub struct FamilyInfo {
    pub family: Family,
    /// The `general.architecture` string.
    pub architecture: &'static str,
    /// Metadata keys that must be present (`{arch}` stands for the architecture).
    pub required_keys: &'static [&'static str],
}

/// The family table: the [`Family`] enum, [`FAMILIES`], and the two
/// dispatches to each family's [`FamilyDef`].
macro_rules! families {
    ($($(#[$doc:meta])* $variant:ident => $def:ty,)+) => {
        /// The model families ds4 serves.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum Family {
            $($(#[$doc])* $variant,)+
        }

        /// Every family ds4 knows, by architecture string.
        pub static FAMILIES: &[FamilyInfo] = &[$(FamilyInfo {
            family: Family::$variant,
            architecture: <$def as FamilyDef>::ARCHITECTURE,
            required_keys: <$def as FamilyDef>::REQUIRED_KEYS,
        },)+];

        impl Family {
            fn load<B: Backend>(
                self,
                src: &TensorSource<'_>,
                backend: &B,
            ) -> Result<Box<dyn FamilyModel<B>>, ModelError> {
                match self {
                    $(Family::$variant => <$def as FamilyDef>::load(src, backend),)+
                }
            }

            /// The family's chat protocol for a model with this metadata.
            pub fn chat_protocol(self, meta: &Metadata) -> Result<Arc<dyn ChatProtocol>, PromptError> {
                match self {
                    $(Family::$variant => <$def as FamilyDef>::chat(meta),)+
                }
            }
        }
    };
}

families! {
    Llama => llama::Llama,
    /// llama's layout with q/k/v biases and NeoX RoPE (run by the llama code).
    Qwen2 => qwen2::Qwen2,
    DeepSeek4 => deepseek4::DeepSeek4,
}

impl Family {
    pub fn info(self) -> &'static FamilyInfo {
        FAMILIES
            .iter()
            .find(|f| f.family == self)
            .expect("every family has a table row")
    }

    pub fn name(self) -> &'static str {
        self.info().architecture
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error("model has no general.architecture key; is this a model GGUF?")]
    NoArchitecture,
    #[error("architecture {found:?} is not supported; ds4 serves: {supported}")]
    UnsupportedArchitecture { found: String, supported: String },
    #[error("{family} model: required metadata key {key:?} is missing")]
    MissingKey { family: &'static str, key: String },
    #[error("{family} model: metadata {key:?} = {value}: {problem}")]
    BadKey {
        family: &'static str,
        key: String,
        value: String,
        problem: String,
    },
    #[error("{family} model: required tensor {name:?} is missing")]
    MissingTensor { family: &'static str, name: String },
    #[error("{family} model: tensor {name:?} has shape {found:?}, expected {expected:?}")]
    TensorShape {
        family: &'static str,
        name: String,
        expected: Vec<u64>,
        found: Vec<u64>,
    },
    #[error("{family} model: tensor {name:?} is not part of the {family} contract ({hint})")]
    UnexpectedTensor {
        family: &'static str,
        name: String,
        hint: &'static str,
    },
    #[error("backend: {0}")]
    Backend(#[from] BackendError),
    #[error("token id {token} is outside the vocabulary of {n_vocab} tokens")]
    BadToken { token: u32, n_vocab: usize },
    #[error("context full: {needed} tokens do not fit the sequence's {ctx}-token context")]
    ContextFull { needed: usize, ctx: usize },
    #[error("tensor {name:?}: {problem}")]
    WeightBytes { name: String, problem: String },
    #[error("{family} models keep their state in blocks of {needed} positions, not {given}")]
    BlockSize {
        family: &'static str,
        needed: usize,
        given: usize,
    },
}

/// The family a file belongs to, from `general.architecture`.
pub fn detect(file: &GgufFile) -> Result<Family, ModelError> {
    let arch = file.architecture().ok_or(ModelError::NoArchitecture)?;
    FAMILIES
        .iter()
        .find(|f| f.architecture == arch)
        .map(|f| f.family)
        .ok_or_else(|| ModelError::UnsupportedArchitecture {
            found: arch.to_string(),
            supported: FAMILIES
                .iter()
                .map(|f| f.architecture)
                .collect::<Vec<_>>()
                .join(", "),
        })
}

/// Check that every required key of `family` is present.
pub fn check_required_keys(file: &GgufFile, family: Family) -> Result<(), ModelError> {
    let info = family.info();
    for key in info.required_keys {
        let key = key.replace("{arch}", info.architecture);
        if file.metadata().get(&key).is_none() {
            return Err(ModelError::MissingKey {
                family: info.architecture,
                key,
            });
        }
    }
    Ok(())
}

/// Where a model's tensor bytes come from: the GGUF's own mapping, or
/// memory supplied by a weight owner (one range per tensor, laid out as in
/// the file). Family binders take every tensor through this, so a model is
/// bound identically from either.
pub struct TensorSource<'a> {
    file: &'a GgufFile,
    supplied: Option<std::collections::HashMap<String, HostBytes>>,
    /// The same tensors in GPU memory, when the owner placed them there.
    device: std::collections::HashMap<String, DeviceBytes>,
}

impl<'a> TensorSource<'a> {
    /// The file's own mapping (no copy).
    pub fn from_file(file: &'a GgufFile) -> TensorSource<'a> {
        TensorSource {
            file,
            supplied: None,
            device: std::collections::HashMap::new(),
        }
    }

    /// Bytes supplied per tensor (by name), and the tensors also in GPU
    /// memory.
    pub fn supplied(
        file: &'a GgufFile,
        bytes: std::collections::HashMap<String, HostBytes>,
        device: std::collections::HashMap<String, DeviceBytes>,
    ) -> TensorSource<'a> {
        TensorSource {
            file,
            supplied: Some(bytes),
            device,
        }
    }

    /// The model's header and metadata.
    pub fn file(&self) -> &'a GgufFile {
        self.file
    }

    /// The tensor called `name`, or a typed error naming it.
    pub fn info(&self, family: &'static str, name: &str) -> Result<&'a TensorInfo, ModelError> {
        self.file
            .tensor(name)
            .ok_or_else(|| ModelError::MissingTensor {
                family,
                name: name.into(),
            })
    }

    /// The bytes of a tensor of this model.
    pub fn bytes(&self, t: &TensorInfo) -> HostBytes {
        if let Some(b) = self.supplied.as_ref().and_then(|m| m.get(&t.name)) {
            return b.clone();
        }
        let shard = &self.file.shards()[t.shard];
        let owner: std::sync::Arc<dyn AsRef<[u8]> + Send + Sync> = shard.map().clone();
        HostBytes::new(owner, t.file_offset as usize, t.n_bytes as usize)
            .expect("tensor ranges are checked when the file is opened")
    }

    /// The tensor's bytes in GPU memory, if the owner placed them there.
    pub fn device(&self, t: &TensorInfo) -> Option<DeviceBytes> {
        self.device.get(&t.name).cloned()
    }

    /// A whole tensor as a weight source for a backend (no copy).
    pub fn weight(&self, t: &TensorInfo) -> WeightSource {
        let cols = t.shape[0] as usize;
        WeightSource {
            name: t.name.clone(),
            ggml_type: t.ggml_type,
            rows: (t.n_elements() / t.shape[0]) as usize,
            cols,
            bytes: self.bytes(t),
            device: self.device(t),
        }
    }
}

/// Which logits a forward pass returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    /// Only the last token's row.
    Last,
    /// One row per input token.
    All,
}

/// One sequence's part of a batched forward pass over a state pool.
#[derive(Clone, Copy, Debug)]
pub struct PagedInput<'a> {
    /// Tokens to run, at positions `pos ..`.
    pub tokens: &'a [u32],
    /// Positions already computed for this sequence.
    pub pos: usize,
    /// The sequence's block table (covers `pos + tokens.len()` positions).
    pub blocks: &'a [u32],
    /// Window block per block index ([`StateLayout::has_windows`] layouts:
    /// covering the window of `pos` through `pos + tokens.len()`;
    /// `u32::MAX` for blocks whose window block is not held). Empty for
    /// dense layouts.
    pub window: &'a [u32],
    /// The sequence's frontier slot (layouts with windows).
    pub slot: u32,
    /// Which logits to return for this input, if any.
    pub logits: Option<Logits>,
}

/// Positions per KV block of a standalone [`Sequence`] of a family that
/// does not fix its block size.
pub const SEQUENCE_KV_BLOCK: usize = 16;

/// What the serving layer needs to know about a loaded model.
#[derive(Clone, Debug)]
pub struct ModelInfo {
    pub family: Family,
    pub name: Option<String>,
    pub n_vocab: usize,
    pub n_ctx_train: usize,
    pub n_layer: usize,
    pub n_embd: usize,
}
