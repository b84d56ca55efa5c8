//! The shapes and settings backend ops take: numerics, RoPE, attention,
//! the paged KV pool and the sequences of a batched call, the fused dense
//! layer, and the backend's error type.

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

/// Where the ops recorded next run ([`crate::Backend::branch`]): a
/// forward pass marks ops that do not depend on each other, and a backend
/// that can overlap them (the CUDA backend's second stream) does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Branch {
    /// The ops up to the next [`Branch::Main`] form a side branch: they
    /// may run beside the ops recorded after it until [`Branch::Join`].
    /// They read only what was written before this mark and write only
    /// tensors (and pool state) that nothing reads or overwrites before
    /// the join.
    Beside,
    /// The ops after this mark are the main line again.
    Main,
    /// The ops after this mark see everything the side branch wrote.
    Join,
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
