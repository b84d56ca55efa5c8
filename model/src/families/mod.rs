//! Model families: one enum, one static table, one folder per family.
//!
//! A GGUF is accepted only when its `general.architecture` names a family
//! in [`FAMILIES`] and the family's contract (required keys, tensor
//! inventory and shapes) holds. Validation runs on the mapped header before
//! any weight is bound. Adding a family means adding a variant, a table
//! row, a folder and a match arm; the other families are not touched.

mod contract;
pub mod llama;

use ds4_kernels::{Backend, BackendError, HostBytes, WeightSource};

use crate::gguf::{GgufError, GgufFile, TensorInfo};
pub use contract::{check_inventory, ExpectedTensor};

/// The model families ds4 serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Family {
    Llama,
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

/// Every family ds4 knows, by architecture string.
pub static FAMILIES: &[FamilyInfo] = &[FamilyInfo {
    family: Family::Llama,
    architecture: "llama",
    required_keys: llama::REQUIRED_KEYS,
}];

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
    #[error("context full: {needed} tokens do not fit the sequence's {ctx}-token context")]
    ContextFull { needed: usize, ctx: usize },
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

/// A tensor of `file` as a weight source for a backend (no copy).
pub fn weight_source(file: &GgufFile, t: &TensorInfo) -> WeightSource {
    let shard = &file.shards()[t.shard];
    let owner: std::sync::Arc<dyn AsRef<[u8]> + Send + Sync> = shard.map().clone();
    let bytes = HostBytes::new(owner, t.file_offset as usize, t.n_bytes as usize)
        .expect("tensor ranges are checked when the file is opened");
    let cols = t.shape[0] as usize;
    WeightSource {
        name: t.name.clone(),
        ggml_type: t.ggml_type,
        rows: (t.n_elements() / t.shape[0]) as usize,
        cols,
        bytes,
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

enum FamilyModel<B: Backend> {
    Llama(llama::LlamaModel<B>),
}

/// A validated, bound model of any family.
pub struct Model<B: Backend> {
    info: ModelInfo,
    inner: FamilyModel<B>,
}

/// The per-sequence state a model needs (KV cache and the tokens in it).
pub struct Sequence<B: Backend> {
    cache: B::KvCache,
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
    pub fn truncate(&mut self, backend: &B, len: usize) {
        backend.kv_truncate(&mut self.cache, len);
        self.tokens.truncate(len);
    }
}

impl<B: Backend> Model<B> {
    /// Validate `file` against its family contract and bind its weights.
    pub fn load(file: &GgufFile, backend: &B) -> Result<Model<B>, ModelError> {
        let family = detect(file)?;
        check_required_keys(file, family)?;
        let name = file.metadata().get_str("general.name").map(str::to_string);
        match family {
            Family::Llama => {
                let m = llama::LlamaModel::load(file, backend)?;
                let h = m.hparams();
                let info = ModelInfo {
                    family,
                    name,
                    n_vocab: h.n_vocab,
                    n_ctx_train: h.n_ctx_train,
                    n_layer: h.n_layer,
                    n_embd: h.n_embd,
                };
                Ok(Model {
                    info,
                    inner: FamilyModel::Llama(m),
                })
            }
        }
    }

    pub fn info(&self) -> &ModelInfo {
        &self.info
    }

    /// A fresh sequence holding at most `ctx` tokens.
    pub fn new_sequence(&self, backend: &B, ctx: usize) -> Sequence<B> {
        let cache = match &self.inner {
            FamilyModel::Llama(m) => m.kv_cache(backend, ctx),
        };
        Sequence {
            cache,
            ctx,
            tokens: Vec::new(),
        }
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
        let positions: Vec<u32> = (start..start + tokens.len()).map(|p| p as u32).collect();
        let cache = &mut seq.cache;
        let result = backend.run(|| match &self.inner {
            FamilyModel::Llama(m) => m.forward(backend, cache, tokens, &positions, want),
        });
        match result {
            Ok(logits) => {
                seq.tokens.extend_from_slice(tokens);
                Ok(logits)
            }
            Err(e) => {
                backend.kv_truncate(&mut seq.cache, start);
                Err(e)
            }
        }
    }
}
