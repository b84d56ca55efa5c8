//! [`Model`]: a validated, bound model of any family, which delegates to
//! the family's [`FamilyModel`]; and [`Sequence`]: one sequence with a
//! private state pool, for callers that run a single conversation (the
//! CLI, tests) rather than the engine's shared pools.

use std::collections::HashMap;

use ds4_kernels::{Backend, DeviceBytes, HostBytes};

use super::{
    check_required_keys, detect, Dims, FamilyModel, Logits, ModelError, ModelInfo, PagedInput,
    PoolSizes, StateLayout, StatePool, TensorSource, SEQUENCE_KV_BLOCK,
};
use crate::gguf::{GgufFile, TensorInfo};

/// A validated, bound model of any family.
pub struct Model<B: Backend> {
    info: ModelInfo,
    inner: Box<dyn FamilyModel<B>>,
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
        device: HashMap<String, DeviceBytes>,
    ) -> Result<Model<B>, ModelError> {
        let mut map = HashMap::with_capacity(file.tensors().len());
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
        Model::bind(&TensorSource::supplied(file, map, device), backend)
    }

    pub fn info(&self) -> &ModelInfo {
        &self.info
    }

    /// The family's own model (e.g. `deepseek4::Ds4Model<B>`, for its
    /// activation rounding); `None` when the model is of another family.
    pub fn family_model_mut<T: 'static>(&mut self) -> Option<&mut T> {
        self.inner.as_any_mut().downcast_mut::<T>()
    }

    /// Where this model's sequences keep their state.
    pub fn state_layout(&self) -> StateLayout {
        self.inner.state_layout()
    }

    /// Bytes of state per token of context (the memory ledger's unit).
    pub fn state_bytes_per_token(&self) -> usize {
        self.inner.state_bytes_per_token()
    }

    /// Activation scratch of one forward pass over `rows` tokens of up to
    /// `seqs` sequences of at most `ctx` positions (one logits row each),
    /// in bytes (an upper estimate; for dense layouts it includes the f32
    /// copy of one layer of each sequence's cache that CPU attention reads).
    pub fn scratch_bytes(&self, rows: usize, seqs: usize, ctx: usize) -> usize {
        let cache_copy = match self.state_layout() {
            StateLayout::Kv(l) => seqs * ctx * l.kv_dim * 2 * 4,
            StateLayout::Compressed(_) => 0,
        };
        rows * self.inner.scratch_bytes_per_row() + seqs * self.info.n_vocab * 4 * 2 + cache_copy
    }

    /// A state pool for this model. A family that fixes its block size
    /// refuses another one.
    pub fn state_pool(&self, backend: &B, sizes: PoolSizes) -> Result<StatePool<B>, ModelError> {
        let layout = self.state_layout();
        if let Some(bs) = layout.block_size().filter(|&bs| bs != sizes.block_size) {
            return Err(ModelError::BlockSize {
                family: self.info.family.name(),
                needed: bs,
                given: sizes.block_size,
            });
        }
        Ok(layout.pool(backend, sizes)?)
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

    /// One forward pass over several sequences of a state pool: every
    /// projection is one batched op over all their rows. Returns, per
    /// input, the logits it asked for (empty when none).
    pub fn forward_paged(
        &self,
        backend: &B,
        pool: &mut StatePool<B>,
        batch: &[PagedInput<'_>],
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        for input in batch {
            self.check_tokens(input.tokens)?;
        }
        backend.run(|| self.inner.forward_paged(backend, pool, batch))
    }

    /// A fresh sequence holding at most `ctx` tokens, with a private pool.
    pub fn new_sequence(&self, backend: &B, ctx: usize) -> Result<Sequence<B>, ModelError> {
        let layout = self.state_layout();
        let block_size = layout.block_size().unwrap_or(SEQUENCE_KV_BLOCK);
        let n_blocks = ctx.div_ceil(block_size).max(1);
        let windows = layout.has_windows();
        let mut pool = self.state_pool(
            backend,
            PoolSizes {
                block_size,
                n_blocks,
                // Every window block is kept: a truncated sequence resumes
                // at any block boundary.
                n_window_blocks: if windows { n_blocks } else { 0 },
                n_slots: usize::from(windows),
            },
        )?;
        pool.begin(backend, 0, None)?;
        Ok(Sequence {
            pool,
            blocks: (0..n_blocks as u32).collect(),
            window: if windows {
                (0..n_blocks as u32).collect()
            } else {
                Vec::new()
            },
            block_size,
            resumes_at_blocks: windows,
            resume: None,
            computed: 0,
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
        let computed = seq.computed;
        let result = (|| {
            if let Some(p) = seq.resume.take() {
                let window = (p > 0).then(|| seq.window[p / seq.block_size - 1]);
                seq.pool.begin(backend, 0, window)?;
            }
            // Positions a truncation dropped the state of are computed again.
            let held = &seq.tokens[seq.computed..];
            let runs: Vec<(&[u32], usize, Option<Logits>)> = if held.is_empty() {
                vec![(tokens, seq.computed, Some(want))]
            } else {
                vec![(held, seq.computed, None), (tokens, start, Some(want))]
            };
            let mut logits = Vec::new();
            for (toks, pos, want) in runs {
                let input = PagedInput {
                    tokens: toks,
                    pos,
                    blocks: &seq.blocks,
                    window: &seq.window,
                    slot: 0,
                    logits: want,
                };
                logits = self
                    .forward_paged(backend, &mut seq.pool, &[input])?
                    .swap_remove(0);
            }
            Ok::<_, ModelError>(logits)
        })();
        match result {
            Ok(logits) => {
                seq.tokens.extend_from_slice(tokens);
                seq.computed = seq.tokens.len();
                Ok(logits)
            }
            Err(e) => {
                // The frontier may be half-updated: resume from the last
                // block boundary before what was computed.
                if seq.resumes_at_blocks {
                    let p = computed / seq.block_size * seq.block_size;
                    seq.computed = p;
                    seq.resume = Some(p);
                }
                Err(e)
            }
        }
    }
}

/// The per-sequence state a model needs (KV cache and the tokens in it).
pub struct Sequence<B: Backend> {
    pool: StatePool<B>,
    blocks: Vec<u32>,
    window: Vec<u32>,
    block_size: usize,
    /// The state resumes only at block boundaries (compressed layouts).
    resumes_at_blocks: bool,
    /// Restart the frontier at this block boundary before the next pass.
    resume: Option<usize>,
    /// Tokens whose state is computed (a prefix of `tokens`).
    computed: usize,
    ctx: usize,
    tokens: Vec<u32>,
}

impl<B: Backend> Sequence<B> {
    /// Tokens the sequence holds.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    pub fn ctx(&self) -> usize {
        self.ctx
    }

    /// Forget everything from position `len` on (keeps a shared prefix).
    ///
    /// Dense state is simply overwritten later. Compressed state resumes
    /// at the last block boundary at or before `len`; the next forward pass
    /// computes the kept tokens after it again.
    pub fn truncate(&mut self, len: usize) {
        if len < self.computed && self.resumes_at_blocks {
            let p = len / self.block_size * self.block_size;
            self.computed = p;
            self.resume = Some(p);
        }
        self.computed = self.computed.min(len);
        self.tokens.truncate(len);
    }
}
