//! The op interface (`Backend`) that every family forward pass is written
//! against. The CPU implementation ([`crate::cpu`]) is the reference; other
//! backends are tested against it op by op.
//!
//! Shapes: activations are row-major `[rows, cols]` f32 matrices, one row
//! per token. Weights keep their GGUF layout: a matrix of shape
//! `[n_out, n_in]` (ggml `ne = [n_in, n_out]`) with each row of `n_in`
//! values stored as quant blocks.

use std::sync::Arc;

use crate::quant::GgmlType;

/// Bytes of a weight that live in host memory (a memory-mapped file, a
/// shared-memory region, or an owned buffer), shared without copying.
#[derive(Clone)]
pub struct HostBytes {
    owner: Arc<dyn AsRef<[u8]> + Send + Sync>,
    start: usize,
    len: usize,
}

impl HostBytes {
    /// A view of `owner[start..start + len]`; `None` when out of range.
    pub fn new(
        owner: Arc<dyn AsRef<[u8]> + Send + Sync>,
        start: usize,
        len: usize,
    ) -> Option<HostBytes> {
        let end = start.checked_add(len)?;
        ((*owner).as_ref().len() >= end).then_some(HostBytes { owner, start, len })
    }

    /// `self[start..start + len]`, sharing the same owner; `None` when out
    /// of range.
    pub fn slice(&self, start: usize, len: usize) -> Option<HostBytes> {
        let end = start.checked_add(len)?;
        (end <= self.len).then(|| HostBytes {
            owner: self.owner.clone(),
            start: self.start + start,
            len,
        })
    }

    /// Owned bytes (tests, small derived tensors).
    pub fn from_vec(v: Vec<u8>) -> HostBytes {
        let len = v.len();
        HostBytes {
            owner: Arc::new(v),
            start: 0,
            len,
        }
    }

    pub fn as_slice(&self) -> &[u8] {
        &(*self.owner).as_ref()[self.start..self.start + self.len]
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl std::fmt::Debug for HostBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HostBytes({} bytes at {})", self.len, self.start)
    }
}

/// Bytes of a weight already in GPU memory (imported from the weight
/// owner), which a GPU backend binds in place instead of uploading.
#[derive(Clone)]
pub struct DeviceBytes {
    ptr: u64,
    len: usize,
    owner: Arc<dyn std::any::Any + Send + Sync>,
}

impl DeviceBytes {
    /// # Safety
    /// `ptr .. ptr + len` must be device memory readable in the primary
    /// context of the device the binding backend runs on, holding the
    /// tensor's GGUF bytes, mapped and unchanged while `owner` lives.
    #[allow(unsafe_code)]
    pub unsafe fn new(
        ptr: u64,
        len: usize,
        owner: Arc<dyn std::any::Any + Send + Sync>,
    ) -> DeviceBytes {
        DeviceBytes { ptr, len, owner }
    }

    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// `self[start .. start + len]`; `None` when out of range.
    pub fn slice(&self, start: usize, len: usize) -> Option<DeviceBytes> {
        let end = start.checked_add(len)?;
        (end <= self.len).then(|| DeviceBytes {
            ptr: self.ptr + start as u64,
            len,
            owner: self.owner.clone(),
        })
    }

    /// What keeps the memory mapped.
    pub fn owner(&self) -> Arc<dyn std::any::Any + Send + Sync> {
        self.owner.clone()
    }
}

impl std::fmt::Debug for DeviceBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeviceBytes({} bytes at {:#x})", self.len, self.ptr)
    }
}

/// A weight as the model file stores it, to be bound by a backend.
#[derive(Clone, Debug)]
pub struct WeightSource {
    pub name: String,
    pub ggml_type: GgmlType,
    /// `[n_out, n_in]` for matrices (rows first), `[n]` for vectors.
    pub rows: usize,
    pub cols: usize,
    pub bytes: HostBytes,
    /// The same bytes in GPU memory, when the weight owner placed them
    /// there (a GPU backend binds them in place; the CPU backend reads
    /// `bytes`).
    pub device: Option<DeviceBytes>,
}

/// How faithfully a backend rounds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Numerics {
    /// The serving path: activations quantized to each weight type's
    /// `vec_dot_type` before quantized dot products, KV cache in f16
    /// (what llama.cpp computes, and what the fast kernels compute).
    #[default]
    Production,
    /// Weights dequantized to f32, f32 activations and caches, no
    /// activation rounding: the model's math, for comparisons with
    /// independent float reference implementations.
    Exact,
}

/// Rotary position embedding variants.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RopeMode {
    /// Rotate adjacent pairs `(x[2i], x[2i+1])` (ggml "normal"; llama GGUFs).
    Normal,
    /// Rotate `(x[i], x[i + d/2])` (ggml "neox"; qwen2, gpt-neox).
    Neox,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeConfig {
    pub mode: RopeMode,
    /// Number of dimensions of each head that are rotated (<= head_dim).
    pub n_rot: usize,
    pub freq_base: f32,
    /// Linear position scaling: positions are multiplied by this.
    pub freq_scale: f32,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionConfig {
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    /// Usually `1 / sqrt(head_dim)`.
    pub scale: f32,
}

/// Geometry of a paged KV pool: `n_blocks` blocks, each holding the keys
/// and values of `block_size` consecutive positions of one sequence for
/// every layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvPoolConfig {
    pub n_layer: usize,
    /// Values per token for keys (and for values): `n_head_kv * head_dim`.
    pub kv_dim: usize,
    pub block_size: usize,
    pub n_blocks: usize,
}

/// How a KV pool stores values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvDtype {
    F16,
    F32,
}

impl KvDtype {
    pub fn bytes(self) -> usize {
        match self {
            KvDtype::F16 => 2,
            KvDtype::F32 => 4,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            KvDtype::F16 => "f16",
            KvDtype::F32 => "f32",
        }
    }
}

impl KvPoolConfig {
    /// Bytes of one block in `dtype` (keys and values, every layer): the
    /// size of [`Backend::kv_read_block`]'s output.
    pub fn block_bytes(&self, dtype: KvDtype) -> usize {
        self.n_layer * 2 * self.block_size * self.kv_dim * dtype.bytes()
    }
}

/// The weights of one pre-norm dense decoder layer (the llama layout,
/// without q/k/v biases), for [`Backend::dense_layer`]:
///
/// ```text
/// x += Wo · attention(rope(Wq h), rope(Wk h), Wv h)   h = rms_norm(x) · attn_norm
/// x += Wdown · (silu(Wgate h) * Wup h)                h = rms_norm(x) · ffn_norm
/// ```
pub struct DenseLayer<'a, W> {
    pub attn_norm: &'a W,
    pub wq: &'a W,
    pub wk: &'a W,
    pub wv: &'a W,
    pub wo: &'a W,
    pub ffn_norm: &'a W,
    pub w_gate: &'a W,
    pub w_up: &'a W,
    pub w_down: &'a W,
}

/// The shape of a [`Backend::dense_layer`] call besides its weights.
#[derive(Clone, Copy, Debug)]
pub struct DenseLayerConfig {
    pub attn: AttentionConfig,
    pub rope: RopeConfig,
    pub rms_eps: f32,
}

/// One sequence's rows in a batched attention call. Position `p` of the
/// sequence lives in pool block `blocks[p / block_size]`, slot
/// `p % block_size`.
#[derive(Clone, Copy, Debug)]
pub struct KvSeq<'a> {
    /// The sequence's block table (covers at least `pos + n_rows` positions).
    pub blocks: &'a [u32],
    /// First row of this sequence in `q`, `k`, `v` and `out`.
    pub row: usize,
    /// Rows of this sequence: positions `pos .. pos + n_rows`.
    pub n_rows: usize,
    /// Position of the first row (the number of positions already cached).
    pub pos: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("weight {name:?}: {problem}")]
    BadWeight { name: String, problem: String },
    #[error("KV cache full: position {pos} is past the context of {ctx} tokens")]
    ContextFull { pos: usize, ctx: usize },
    #[error("shape mismatch in {op}: {detail}")]
    Shape { op: &'static str, detail: String },
    #[error("out of device memory: {0}")]
    OutOfMemory(String),
    #[error("device error: {0}")]
    Device(String),
}

impl BackendError {
    /// Checks `out = W · x` shapes (`[rows, cols]` each) for every backend's
    /// matmul: `x` is as wide as `W`, `out` has a row per `x` row and a
    /// column per `W` row.
    pub fn check_matmul(
        weight: &str,
        w: (usize, usize),
        x: (usize, usize),
        out: (usize, usize),
    ) -> Result<(), BackendError> {
        if x.1 != w.1 || out.0 != x.0 || out.1 != w.0 {
            return Err(BackendError::Shape {
                op: "matmul",
                detail: format!(
                    "{weight} is [{}, {}], x is [{}, {}], out is [{}, {}]",
                    w.0, w.1, x.0, x.1, out.0, out.1
                ),
            });
        }
        Ok(())
    }
}

/// The operations a family forward pass may use.
pub trait Backend: Send + Sync + 'static {
    /// An activation matrix `[rows, cols]` f32, resident where the backend computes.
    type Tensor: Send;
    /// A bound weight.
    type Weight: Send + Sync;
    /// Paged attention state shared by every sequence (all layers).
    type KvPool: Send;

    fn name(&self) -> &'static str;

    /// How this backend rounds (families that simulate activation rounding
    /// of their reference engine switch it on only for production numerics).
    fn numerics(&self) -> Numerics {
        Numerics::Production
    }

    /// Whether weights live in device memory (bound from
    /// [`WeightSource::device`] in place, or uploaded); host-memory
    /// backends read [`WeightSource::bytes`].
    fn device_resident(&self) -> bool {
        false
    }

    /// Bytes free in the memory the backend allocates KV blocks and scratch
    /// from, when it is not host memory (a GPU's); `None`: host memory.
    fn device_free_memory(&self) -> Option<u64> {
        None
    }

    /// Run `f` (a whole forward pass) where the backend's ops run best:
    /// the CPU backend runs it on one of its compute threads, so that
    /// sequential ops do not compete with idle workers for cores.
    fn run<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        f()
    }

    /// Bind a weight (may keep a reference to the host bytes, or upload them).
    fn bind_weight(&self, src: WeightSource) -> Result<Self::Weight, BackendError>;

    /// A zeroed `[rows, cols]` tensor.
    fn tensor(&self, rows: usize, cols: usize) -> Self::Tensor;
    /// A tensor holding `data` (`rows * cols` values).
    fn tensor_from(&self, rows: usize, cols: usize, data: &[f32]) -> Self::Tensor;
    /// Copy a tensor back to host memory, row-major.
    fn to_host(&self, x: &Self::Tensor) -> Vec<f32>;
    /// `(rows, cols)` of a tensor.
    fn dims(&self, x: &Self::Tensor) -> (usize, usize);
    /// Copy row `row` of `src` into row `dst_row` of `dst`.
    fn copy_row(&self, src: &Self::Tensor, row: usize, dst: &mut Self::Tensor, dst_row: usize);

    /// A pool of KV blocks (storage may be allocated lazily, as blocks are
    /// first written).
    fn kv_pool(&self, cfg: KvPoolConfig) -> Result<Self::KvPool, BackendError>;
    /// How `pool` stores values (f16 with production numerics, f32 exact).
    fn kv_dtype(&self, pool: &Self::KvPool) -> KvDtype;
    /// How the pools [`Backend::kv_pool`] makes store values (for sizing
    /// blocks before any pool exists).
    fn kv_pool_dtype(&self) -> KvDtype {
        match self.numerics() {
            Numerics::Production => KvDtype::F16,
            Numerics::Exact => KvDtype::F32,
        }
    }
    /// Copy block `block` to host memory: for each layer, the keys
    /// (`[block_size, kv_dim]`) then the values, little-endian in the pool's
    /// dtype; `out` has [`KvPoolConfig::block_bytes`] bytes.
    fn kv_read_block(
        &self,
        pool: &Self::KvPool,
        block: u32,
        out: &mut [u8],
    ) -> Result<(), BackendError>;
    /// Fill block `block` from bytes laid out as [`Backend::kv_read_block`] writes them.
    fn kv_write_block(
        &self,
        pool: &mut Self::KvPool,
        block: u32,
        data: &[u8],
    ) -> Result<(), BackendError>;

    /// `out[i] = table[ids[i]]` (rows of an embedding matrix, dequantized).
    fn embed(
        &self,
        table: &Self::Weight,
        ids: &[u32],
        out: &mut Self::Tensor,
    ) -> Result<(), BackendError>;
    /// Row-wise RMSNorm: `out = x / sqrt(mean(x^2) + eps) * w`.
    fn rms_norm(&self, x: &Self::Tensor, w: &Self::Weight, eps: f32, out: &mut Self::Tensor);
    /// `out[r] = W · x[r]` for every row `r` (W is `[n_out, n_in]`).
    fn matmul(
        &self,
        w: &Self::Weight,
        x: &Self::Tensor,
        out: &mut Self::Tensor,
    ) -> Result<(), BackendError>;
    /// `outs[i][r] = ws[i] · x[r] (+ biases[i])`: several weights applied
    /// to one input (q/k/v, gate/up), each optionally followed by
    /// [`Backend::add_bias`]. Backends that prepare the input once per
    /// matmul (quantized activations) prepare it once for all of them.
    fn matmul_many(
        &self,
        ws: &[&Self::Weight],
        biases: Option<&[&Self::Weight]>,
        x: &Self::Tensor,
        outs: &mut [&mut Self::Tensor],
    ) -> Result<(), BackendError> {
        assert_eq!(ws.len(), outs.len(), "matmul_many: one output per weight");
        for (i, (w, out)) in ws.iter().zip(outs.iter_mut()).enumerate() {
            self.matmul(w, x, out)?;
            if let Some(b) = biases {
                self.add_bias(out, b[i]);
            }
        }
        Ok(())
    }
    /// `x += y`, then `out = rms_norm(x) · w` (the residual add and the
    /// next norm, in one pass where the backend can).
    fn add_rms_norm(
        &self,
        x: &mut Self::Tensor,
        y: &Self::Tensor,
        w: &Self::Weight,
        eps: f32,
        out: &mut Self::Tensor,
    ) {
        self.add_assign(x, y);
        self.rms_norm(x, w, eps, out);
    }
    /// Rotate each head of every row in place; row `r` is at `positions[r]`.
    fn rope(&self, x: &mut Self::Tensor, positions: &[u32], head_dim: usize, cfg: &RopeConfig);
    /// [`Backend::rope`] of the queries and the keys of the same rows (one
    /// pass where the backend can).
    fn rope_qk(
        &self,
        q: &mut Self::Tensor,
        k: &mut Self::Tensor,
        positions: &[u32],
        head_dim: usize,
        cfg: &RopeConfig,
    ) {
        self.rope(q, positions, head_dim, cfg);
        self.rope(k, positions, head_dim, cfg);
    }
    /// For each sequence of `seqs`: store its `k`, `v` rows at its positions
    /// in layer `layer` of `pool`, then causal attention of its `q` rows
    /// over its positions `0 ..= pos + r` into `out`. Sequences must not
    /// share the blocks they write.
    #[allow(clippy::too_many_arguments)]
    fn attention(
        &self,
        q: &Self::Tensor,
        k: &Self::Tensor,
        v: &Self::Tensor,
        pool: &mut Self::KvPool,
        layer: usize,
        seqs: &[KvSeq<'_>],
        cfg: &AttentionConfig,
        out: &mut Self::Tensor,
    ) -> Result<(), BackendError>;
    /// Whether [`Backend::dense_layer`] runs `layer` for a pass of `rows`
    /// rows into `pool` (a fused kernel for its shape and weight types).
    fn fuses_dense_layer(
        &self,
        layer: &DenseLayer<'_, Self::Weight>,
        cfg: &DenseLayerConfig,
        pool: &Self::KvPool,
        rows: usize,
    ) -> bool {
        let _ = (layer, cfg, pool, rows);
        false
    }
    /// The whole of `layer` (see [`DenseLayer`]) for the one row of `x`,
    /// the single row of sequence `seq`, storing its key and value in layer
    /// `index` of `pool`: the ops a forward pass would run, in one step of
    /// the backend's own. Only where [`Backend::fuses_dense_layer`] said so.
    #[allow(clippy::too_many_arguments)]
    fn dense_layer(
        &self,
        layer: &DenseLayer<'_, Self::Weight>,
        cfg: &DenseLayerConfig,
        x: &mut Self::Tensor,
        pool: &mut Self::KvPool,
        index: usize,
        seq: &KvSeq<'_>,
    ) -> Result<(), BackendError> {
        let _ = (layer, cfg, x, pool, index, seq);
        Err(BackendError::Shape {
            op: "dense_layer",
            detail: format!("the {} backend has no fused decoder layer", self.name()),
        })
    }
    /// `out = silu(gate) * up`, element-wise.
    fn swiglu(&self, gate: &Self::Tensor, up: &Self::Tensor, out: &mut Self::Tensor);
    /// `x += y`, element-wise.
    fn add_assign(&self, x: &mut Self::Tensor, y: &Self::Tensor);
    /// `x[r] += bias` for every row `r` (a one-row f32 weight as wide as
    /// `x`: the q/k/v biases of qwen2).
    fn add_bias(&self, x: &mut Self::Tensor, bias: &Self::Weight);
}
