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
pub mod qwen2;

use std::any::Any;
use std::sync::Arc;

use ds4_kernels::{Backend, BackendError, DeviceBytes, HostBytes, KvPoolConfig, WeightSource};

use crate::chat::{ChatProtocol, PromptError};
use crate::gguf::{GgufError, GgufFile, Metadata, TensorInfo};
pub use contract::{check_inventory, ExpectedTensor};

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

    /// The paged KV shape; `None` for families whose per-sequence state is
    /// not a plain key/value row per token (they keep a [`PrivateState`]).
    fn kv_layout(&self) -> Option<KvLayout>;

    /// Bytes of per-sequence state per token (the memory ledger's unit;
    /// an estimate for families with a private state).
    fn state_bytes_per_token(&self) -> usize;

    /// Activation scratch per token row of a forward pass, in bytes (an
    /// upper estimate).
    fn scratch_bytes_per_row(&self) -> usize;

    /// One forward pass over several sequences of a paged pool.
    fn forward_paged(
        &self,
        backend: &B,
        pool: &mut B::KvPool,
        batch: &[PagedInput<'_>],
    ) -> Result<Vec<Vec<f32>>, ModelError>;

    /// A fresh private state, for families without a [`KvLayout`].
    fn private_state(&self) -> Option<Box<dyn PrivateState>> {
        None
    }

    /// Run `tokens` after the private state's tokens. On error the state
    /// may be partially updated; the caller resets it.
    fn forward_private(
        &self,
        _backend: &B,
        _state: &mut dyn PrivateState,
        _tokens: &[u32],
        _want: Logits,
    ) -> Result<Vec<f32>, ModelError> {
        unreachable!("only a family with a private state is given one to run")
    }
}

/// Per-sequence state of a family that does not keep it in the paged pool.
pub trait PrivateState: Send {
    /// Tokens whose state is held.
    fn n_tokens(&self) -> usize;
    /// Forget everything (back to an empty sequence).
    fn reset(&mut self);
    /// The family's own type, for its forward pass.
    fn as_any_mut(&mut self) -> &mut dyn Any;
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
    #[error("{family} models keep per-sequence state that is not paged")]
    NotPaged { family: &'static str },
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

/// One sequence's part of a batched forward pass over a paged KV pool.
#[derive(Clone, Copy, Debug)]
pub struct PagedInput<'a> {
    /// Tokens to run, at positions `pos ..`.
    pub tokens: &'a [u32],
    /// Positions already cached for this sequence.
    pub pos: usize,
    /// The sequence's block table (covers `pos + tokens.len()` positions).
    pub blocks: &'a [u32],
    /// Which logits to return for this input, if any.
    pub logits: Option<Logits>,
}

/// Shape of a family's per-token attention state when it is a plain
/// key/value row per layer (and can live in a paged KV pool).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvLayout {
    pub n_layer: usize,
    /// Values per token of each layer's keys (and of its values).
    pub kv_dim: usize,
}

/// Positions per KV block of a standalone [`Sequence`].
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

/// A validated, bound model of any family.
pub struct Model<B: Backend> {
    info: ModelInfo,
    inner: Box<dyn FamilyModel<B>>,
}

/// Where a sequence's state lives.
enum SequenceState<B: Backend> {
    /// A private KV pool whose blocks, in order, are the sequence's.
    Paged { pool: B::KvPool, blocks: Vec<u32> },
    /// The family's own state (families without a [`KvLayout`]).
    Private(Box<dyn PrivateState>),
}

/// The per-sequence state a model needs (KV cache and the tokens in it).
pub struct Sequence<B: Backend> {
    state: SequenceState<B>,
    ctx: usize,
    tokens: Vec<u32>,
}

impl<B: Backend> Sequence<B> {
    /// Tokens whose state the sequence holds.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    pub fn ctx(&self) -> usize {
        self.ctx
    }

    /// Forget everything from position `len` on (keeps a shared prefix).
    ///
    /// A private state (DeepSeek V4's compressor frontiers) cannot be
    /// rewound: when `len` is shorter than the held tokens, the state is
    /// dropped and the next forward pass recomputes the kept prefix first.
    pub fn truncate(&mut self, len: usize) {
        match &mut self.state {
            // Positions past `len` are overwritten when they are next run.
            SequenceState::Paged { .. } => {}
            SequenceState::Private(st) => {
                if len < st.n_tokens() {
                    st.reset();
                }
            }
        }
        self.tokens.truncate(len);
    }
}

impl<B: Backend> Model<B> {
    /// Validate `file` against its family contract and bind its weights.
    pub fn load(file: &GgufFile, backend: &B) -> Result<Model<B>, ModelError> {
        Model::bind(&TensorSource::from_file(file), backend)
    }

    /// Validate the model and bind every tensor from `src`.
    fn bind(src: &TensorSource<'_>, backend: &B) -> Result<Model<B>, ModelError> {
        let file = src.file();
        let family = detect(file)?;
        check_required_keys(file, family)?;
        let name = file.metadata().get_str("general.name").map(str::to_string);
        let inner = family.load(src, backend)?;
        let Dims {
            n_vocab,
            n_ctx_train,
            n_layer,
            n_embd,
        } = inner.dims();
        let info = ModelInfo {
            family,
            name,
            n_vocab,
            n_ctx_train,
            n_layer,
            n_embd,
        };
        Ok(Model { info, inner })
    }

    /// Like [`Model::load`], but every tensor's bytes come from `bytes_of`
    /// (e.g. a read-only mapping of a region imported from the weight
    /// owner) instead of the file's mapping; nothing is copied. The file
    /// still supplies metadata and tensor descriptions.
    /// `device` names tensors whose bytes are also in GPU memory (imported
    /// from the owner): a GPU backend binds those in place.
    pub fn load_with<E: std::fmt::Display>(
        file: &GgufFile,
        backend: &B,
        bytes_of: impl Fn(&TensorInfo) -> Result<HostBytes, E>,
        device: std::collections::HashMap<String, DeviceBytes>,
    ) -> Result<Model<B>, ModelError> {
        let mut map = std::collections::HashMap::with_capacity(file.tensors().len());
        for t in file.tensors() {
            let bytes = bytes_of(t).map_err(|e| ModelError::WeightBytes {
                name: t.name.clone(),
                problem: e.to_string(),
            })?;
            if bytes.len() as u64 != t.n_bytes {
                return Err(ModelError::WeightBytes {
                    name: t.name.clone(),
                    problem: format!("{} bytes supplied, the file has {}", bytes.len(), t.n_bytes),
                });
            }
            map.insert(t.name.clone(), bytes);
        }
        Model::bind(
            &TensorSource {
                file,
                supplied: Some(map),
                device,
            },
            backend,
        )
    }

    pub fn info(&self) -> &ModelInfo {
        &self.info
    }

    /// The family's own model (e.g. `deepseek4::Ds4Model<B>`, for its
    /// activation rounding); `None` when the model is of another family.
    pub fn family_model_mut<T: 'static>(&mut self) -> Option<&mut T> {
        self.inner.as_any_mut().downcast_mut::<T>()
    }

    /// The paged KV shape of this model; `None` for families whose state
    /// is not a plain per-token key/value row (DeepSeek V4's compressed
    /// rows and compressor frontiers live in a private state).
    pub fn kv_layout(&self) -> Option<KvLayout> {
        self.inner.kv_layout()
    }

    /// Bytes of per-sequence state per token (the memory ledger's unit).
    pub fn state_bytes_per_token(&self) -> usize {
        self.inner.state_bytes_per_token()
    }

    /// Activation scratch of one forward pass over `rows` tokens of up to
    /// `seqs` sequences of at most `ctx` positions (one logits row each),
    /// in bytes (an upper estimate; it includes the f32 copy of one layer
    /// of each sequence's cache that CPU attention reads).
    pub fn scratch_bytes(&self, rows: usize, seqs: usize, ctx: usize) -> usize {
        let cache_copy = self
            .kv_layout()
            .map_or(0, |l| seqs * ctx * l.kv_dim * 2 * 4);
        rows * self.inner.scratch_bytes_per_row() + seqs * self.info.n_vocab * 4 * 2 + cache_copy
    }

    /// A KV pool of `n_blocks` blocks of `block_size` positions for this
    /// model (families with a [`KvLayout`] only).
    pub fn kv_pool(
        &self,
        backend: &B,
        block_size: usize,
        n_blocks: usize,
    ) -> Result<B::KvPool, ModelError> {
        let layout = self.kv_layout().ok_or(ModelError::NotPaged {
            family: self.info.family.name(),
        })?;
        Ok(backend.kv_pool(KvPoolConfig {
            n_layer: layout.n_layer,
            kv_dim: layout.kv_dim,
            block_size,
            n_blocks,
        })?)
    }

    fn check_tokens(&self, tokens: &[u32]) -> Result<(), ModelError> {
        match tokens.iter().find(|&&t| t as usize >= self.info.n_vocab) {
            Some(&token) => Err(ModelError::BadToken {
                token,
                n_vocab: self.info.n_vocab,
            }),
            None => Ok(()),
        }
    }

    /// One forward pass over several sequences of a paged pool: every
    /// projection is one batched op over all their rows. Returns, per
    /// input, the logits it asked for (empty when none).
    pub fn forward_paged(
        &self,
        backend: &B,
        pool: &mut B::KvPool,
        batch: &[PagedInput<'_>],
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        for input in batch {
            self.check_tokens(input.tokens)?;
        }
        if self.kv_layout().is_none() {
            return Err(ModelError::NotPaged {
                family: self.info.family.name(),
            });
        }
        backend.run(|| self.inner.forward_paged(backend, pool, batch))
    }

    /// A fresh sequence holding at most `ctx` tokens.
    pub fn new_sequence(&self, backend: &B, ctx: usize) -> Result<Sequence<B>, ModelError> {
        let state = match self.inner.private_state() {
            Some(st) => SequenceState::Private(st),
            None => {
                let n_blocks = ctx.div_ceil(SEQUENCE_KV_BLOCK);
                SequenceState::Paged {
                    pool: self.kv_pool(backend, SEQUENCE_KV_BLOCK, n_blocks)?,
                    blocks: (0..n_blocks as u32).collect(),
                }
            }
        };
        Ok(Sequence {
            state,
            ctx,
            tokens: Vec::new(),
        })
    }

    /// Run `tokens` after the sequence's current tokens; returns logits
    /// (`[1, n_vocab]` for [`Logits::Last`], `[tokens.len(), n_vocab]` for
    /// [`Logits::All`]). On error the sequence is left as it was.
    pub fn forward(
        &self,
        backend: &B,
        seq: &mut Sequence<B>,
        tokens: &[u32],
        want: Logits,
    ) -> Result<Vec<f32>, ModelError> {
        let start = seq.tokens.len();
        if start + tokens.len() > seq.ctx {
            return Err(ModelError::ContextFull {
                needed: start + tokens.len(),
                ctx: seq.ctx,
            });
        }
        self.check_tokens(tokens)?;
        let held = &seq.tokens;
        let inner = &self.inner;
        let result = match &mut seq.state {
            SequenceState::Paged { pool, blocks } => backend.run(|| {
                let input = PagedInput {
                    tokens,
                    pos: start,
                    blocks,
                    logits: Some(want),
                };
                Ok(inner.forward_paged(backend, pool, &[input])?.swap_remove(0))
            }),
            SequenceState::Private(st) => {
                let st = st.as_mut();
                let r = backend.run(|| {
                    if st.n_tokens() != held.len() {
                        // After a truncation: recompute the kept prefix.
                        st.reset();
                        inner.forward_private(backend, st, held, Logits::Last)?;
                    }
                    inner.forward_private(backend, st, tokens, want)
                });
                if r.is_err() {
                    st.reset();
                }
                r
            }
        };
        let logits = result?;
        seq.tokens.extend_from_slice(tokens);
        Ok(logits)
    }
}
