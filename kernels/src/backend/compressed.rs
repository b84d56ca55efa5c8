//! Settings of the ops for compressed attention (raw window + pooled
//! rows chosen by a lightning indexer, attention sinks), hyper-connections
//! and routed mixtures of experts: the mechanisms of DeepSeek V4, named
//! for what they compute. The project's DeepSeek V4 specification (§3)
//! defines the math; `docs/design/deepseek4-state.md` where the state
//! lives.
//!
//! The state of a compressed-attention model is a [`CompressedPoolConfig`]
//! pool of three parts: **blocks** of `block_size` positions holding the
//! pooled rows those positions complete (shared between sequences with a
//! common prefix), **window blocks** (one per block, when present) holding
//! the raw rows of its positions and the carry at its end, and **slots**,
//! one per running sequence, holding its compressors' frontiers.

use std::sync::Arc;

/// Hyper-connections: `n_hc` residual streams mixed around each sublayer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HcConfig {
    /// Streams (4).
    pub n_hc: usize,
    /// Sinkhorn iterations (20): one softmax, `iters − 1` row
    /// normalizations, `iters` column normalizations.
    pub iters: usize,
    /// Added after the sigmoid of `pre`, after the softmax of the mixing
    /// matrix, and to every Sinkhorn normalizer (1e-6).
    pub eps: f32,
    /// Epsilon of the RMSNorm of the flattened streams (1e-6).
    pub norm_eps: f32,
}

impl HcConfig {
    /// Values a row's mix has: `pre` and `post` weights and the
    /// `n_hc × n_hc` mixing matrix (24 for 4 streams). Also the width of a
    /// split tensor ([`crate::Backend::hc_pre`]).
    pub fn mix_width(&self) -> usize {
        (2 + self.n_hc) * self.n_hc
    }
}

/// RoPE on the tail of a head: the last `2·omega.len()` dims rotate as
/// adjacent pairs `(x[2k], x[2k+1])` by `φ_k = position · omega[k]`
/// (computed in f64 by the CPU reference). Frequencies are precomputed
/// (plain or YaRN), so one op serves both.
#[derive(Clone, Debug, PartialEq)]
pub struct TailRope {
    pub omega: Arc<[f64]>,
}

impl TailRope {
    pub fn n_rot(&self) -> usize {
        2 * self.omega.len()
    }
}

/// Geometry of a compressed-attention pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompressedPoolConfig {
    /// Compression ratio of each layer: 0 (raw window only), 4 (pooled
    /// rows chosen by the indexer, overlapping two-lane windows) or any
    /// other ratio dividing `block_size` (pooled rows, one lane).
    pub ratios: Arc<[usize]>,
    /// Width of raw and pooled rows (the head dim, 512).
    pub head_dim: usize,
    /// Width of indexer rows (128).
    pub index_dim: usize,
    /// Raw rows attention sees: the current position and the `window − 1`
    /// before it (128).
    pub window: usize,
    /// Positions per block; a multiple of every ratio and at least `window`.
    pub block_size: usize,
    pub n_blocks: usize,
    pub n_window_blocks: usize,
    /// Frontier slots (running sequences).
    pub n_slots: usize,
    /// Store raw, pooled and indexer rows as f16 (production numerics: the
    /// reference engine rounds cache rows to f16) rather than f32.
    pub f16_rows: bool,
}

impl CompressedPoolConfig {
    /// Pooled (attention) rows a block holds for a layer of ratio `r`.
    pub fn rows_per_block(&self, r: usize) -> usize {
        self.block_size.checked_div(r).unwrap_or(0)
    }

    /// Values of one block: for each layer in order, its pooled rows, then
    /// (ratio 4) its indexer rows. The layout of
    /// [`crate::Backend::compressed_read_block`].
    pub fn block_values(&self) -> usize {
        self.ratios
            .iter()
            .map(|&r| {
                let n = self.rows_per_block(r);
                n * self.head_dim + if r == 4 { n * self.index_dim } else { 0 }
            })
            .sum()
    }

    /// Bytes of one stored row value.
    pub fn row_bytes(&self) -> usize {
        if self.f16_rows {
            2
        } else {
            4
        }
    }

    /// Bytes of a block as [`crate::Backend::compressed_read_block`] copies it.
    pub fn block_bytes(&self) -> usize {
        self.block_values() * self.row_bytes()
    }

    /// Bytes of a window block as [`crate::Backend::window_read`] copies it.
    pub fn window_bytes(&self) -> usize {
        self.window_raw_values() * self.row_bytes() + self.carry_values() * 4
    }

    /// Values of one window block's raw rows: `block_size` rows of
    /// `head_dim` for every layer, layer by layer.
    pub fn window_raw_values(&self) -> usize {
        self.ratios.len() * self.block_size * self.head_dim
    }

    /// f32 values of one window block's carry: for every ratio-4 layer, the
    /// first lane of the last 4 positions' compressor inputs: values then
    /// scores of the attention compressor (`4 × head_dim` each), then of the
    /// indexer compressor (`4 × index_dim` each).
    pub fn carry_values(&self) -> usize {
        let n4 = self.ratios.iter().filter(|&&r| r == 4).count();
        n4 * 4 * 2 * (self.head_dim + self.index_dim)
    }

    /// f32 values of one frontier slot: for each compressed layer, its
    /// compressor's values and scores (`lanes·ratio` rows of
    /// `lanes·head_dim`, lanes = 2 for ratio 4, else 1), then for ratio 4
    /// the indexer compressor's (8 rows of `2·index_dim`).
    pub fn slot_values(&self) -> usize {
        self.ratios
            .iter()
            .map(|&r| match r {
                0 => 0,
                4 => 2 * 8 * 2 * self.head_dim + 2 * 8 * 2 * self.index_dim,
                r => 2 * r * self.head_dim,
            })
            .sum()
    }
}

/// Which compressor of a layer a [`crate::Backend::compress`] call runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompressorKind {
    /// Pooled attention rows (`head_dim` wide); after the norm and RoPE,
    /// the first `head_dim − n_rot` dims of a row are FP8-rounded when
    /// `round` is set.
    Attention,
    /// Indexer key rows (`index_dim` wide); after the norm and RoPE, a row
    /// gets the indexer's Hadamard + FP4 rounding when `round` is set.
    Indexer,
}

/// Settings of one compressor call.
#[derive(Clone, Debug)]
pub struct CompressorConfig {
    pub kind: CompressorKind,
    /// The layer's ratio (the indexer's is 4).
    pub ratio: usize,
    /// Epsilon of the pooled row's RMSNorm.
    pub norm_eps: f32,
    /// The layer's compressed-row RoPE (applied at the window's first
    /// position).
    pub rope: TailRope,
    /// Apply the reference engine's activation rounding (FP8 on pooled
    /// attention rows, Hadamard + FP4 on indexer rows).
    pub round: bool,
}

/// One sequence's part of a batched compressed-attention call. Position
/// `p` is in block `blocks[p / block_size]`; its raw row in window block
/// `window[p / block_size]` (`u32::MAX`: none held).
#[derive(Clone, Copy, Debug)]
pub struct CompressedSeq<'a> {
    pub blocks: &'a [u32],
    /// Window block per block index; must hold every block whose raw rows
    /// the call writes or reads.
    pub window: &'a [u32],
    /// The sequence's frontier slot.
    pub slot: u32,
    /// First row of this sequence in the call's tensors.
    pub row: usize,
    /// Rows of this sequence: positions `pos .. pos + n_rows`.
    pub n_rows: usize,
    /// Position of the first row.
    pub pos: usize,
}

/// Settings of [`crate::Backend::compressed_attention`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CompressedAttentionConfig {
    pub n_head: usize,
    pub head_dim: usize,
    /// The layer's ratio: 0 reads raw rows only; otherwise the pooled rows
    /// visible at each position (`(p + 1) / ratio` of them), all of them or
    /// the indexer's selection.
    pub ratio: usize,
    /// Usually `1 / sqrt(head_dim)`.
    pub scale: f32,
}

/// Settings of [`crate::Backend::moe_route`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RouteConfig {
    /// Experts per token.
    pub k: usize,
    /// Multiplies the normalized weights (`expert_weights_scale`).
    pub scale: f32,
}
