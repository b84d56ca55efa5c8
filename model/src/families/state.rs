//! Where a family keeps its sequences' state, in the engine's paged
//! memory: dense key/value rows per position ([`StateLayout::Kv`]), or
//! compressed attention ([`StateLayout::Compressed`]: pooled rows in shared
//! blocks, raw rows in window blocks, compressor frontiers in per-sequence
//! slots; see `docs/design/deepseek4-state.md`). The engine sizes, budgets
//! and caches state through this description without knowing the family.

use std::sync::Arc;

use ds4_kernels::{Backend, BackendError, CompressedPoolConfig, KvPoolConfig};

/// Shape of a family's per-token attention state when it is a plain
/// key/value row per layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvLayout {
    pub n_layer: usize,
    /// Values per token of each layer's keys (and of its values).
    pub kv_dim: usize,
}

/// Shape of a compressed-attention state (the settings of a
/// [`CompressedPoolConfig`] that do not depend on the pool's size).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompressedLayout {
    pub ratios: Arc<[usize]>,
    pub head_dim: usize,
    pub index_dim: usize,
    pub window: usize,
    /// Positions per block, fixed by the family (a multiple of every
    /// ratio, at least the window).
    pub block_size: usize,
    /// Rows stored as f16 rather than f32.
    pub f16_rows: bool,
}

/// How a family's sequences keep their state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StateLayout {
    Kv(KvLayout),
    Compressed(CompressedLayout),
}

/// How many of each part a state pool holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolSizes {
    pub block_size: usize,
    pub n_blocks: usize,
    /// Window blocks (compressed layouts only).
    pub n_window_blocks: usize,
    /// Frontier slots, one per running sequence (compressed layouts only).
    pub n_slots: usize,
}

impl StateLayout {
    /// The block size the family needs, if it fixes one.
    pub fn block_size(&self) -> Option<usize> {
        match self {
            StateLayout::Kv(_) => None,
            StateLayout::Compressed(c) => Some(c.block_size),
        }
    }

    /// Whether sequences also hold window blocks and a slot, and resume
    /// only at blocks whose window block is kept.
    pub fn has_windows(&self) -> bool {
        matches!(self, StateLayout::Compressed(_))
    }

    fn compressed_config(c: &CompressedLayout, sizes: PoolSizes) -> CompressedPoolConfig {
        CompressedPoolConfig {
            ratios: c.ratios.clone(),
            head_dim: c.head_dim,
            index_dim: c.index_dim,
            window: c.window,
            block_size: c.block_size,
            n_blocks: sizes.n_blocks,
            n_window_blocks: sizes.n_window_blocks,
            n_slots: sizes.n_slots,
            f16_rows: c.f16_rows,
        }
    }

    fn kv_config(l: &KvLayout, sizes: PoolSizes) -> KvPoolConfig {
        KvPoolConfig {
            n_layer: l.n_layer,
            kv_dim: l.kv_dim,
            block_size: sizes.block_size,
            n_blocks: sizes.n_blocks,
        }
    }

    fn one(block_size: usize) -> PoolSizes {
        PoolSizes {
            block_size,
            n_blocks: 1,
            n_window_blocks: 1,
            n_slots: 1,
        }
    }

    /// Bytes of one block of `block_size` positions, as the disk cache
    /// stores it.
    pub fn block_bytes<B: Backend>(&self, backend: &B, block_size: usize) -> usize {
        match self {
            StateLayout::Kv(l) => StateLayout::kv_config(l, StateLayout::one(block_size))
                .block_bytes(backend.kv_pool_dtype()),
            StateLayout::Compressed(c) => {
                StateLayout::compressed_config(c, StateLayout::one(block_size)).block_bytes()
            }
        }
    }

    /// Bytes of one window block (0 without windows).
    pub fn window_bytes(&self) -> usize {
        match self {
            StateLayout::Kv(_) => 0,
            StateLayout::Compressed(c) => {
                StateLayout::compressed_config(c, StateLayout::one(c.block_size)).window_bytes()
            }
        }
    }

    /// Bytes of one frontier slot (0 without windows).
    pub fn slot_bytes(&self) -> usize {
        match self {
            StateLayout::Kv(_) => 0,
            StateLayout::Compressed(c) => {
                StateLayout::compressed_config(c, StateLayout::one(c.block_size)).slot_values() * 4
            }
        }
    }

    /// Window blocks a running sequence holds at most during a step that
    /// computes up to `chunk` positions: those its raw rows are written to,
    /// and the ones before holding the window of its first position.
    pub fn windows_per_sequence(&self, chunk: usize) -> usize {
        match self {
            StateLayout::Kv(_) => 0,
            StateLayout::Compressed(c) => (c.window - 1 + chunk).div_ceil(c.block_size) + 1,
        }
    }

    /// The layout in words (row dtype included), part of what a saved
    /// block must match.
    pub fn describe<B: Backend>(&self, backend: &B) -> String {
        match self {
            StateLayout::Kv(l) => format!(
                "kv layers={} kv_dim={} rows={}",
                l.n_layer,
                l.kv_dim,
                backend.kv_pool_dtype().name()
            ),
            StateLayout::Compressed(c) => format!(
                "compressed ratios={:?} head_dim={} index_dim={} window={} block={} rows={}",
                c.ratios,
                c.head_dim,
                c.index_dim,
                c.window,
                c.block_size,
                if c.f16_rows { "f16" } else { "f32" }
            ),
        }
    }

    /// A pool of this layout on `backend`.
    pub fn pool<B: Backend>(
        &self,
        backend: &B,
        sizes: PoolSizes,
    ) -> Result<StatePool<B>, BackendError> {
        Ok(match self {
            StateLayout::Kv(l) => StatePool::Kv(backend.kv_pool(StateLayout::kv_config(l, sizes))?),
            StateLayout::Compressed(c) => StatePool::Compressed(
                backend.compressed_pool(&StateLayout::compressed_config(c, sizes))?,
            ),
        })
    }
}

/// A state pool of one of the layouts.
pub enum StatePool<B: Backend> {
    Kv(B::KvPool),
    Compressed(B::CompressedPool),
}

fn wrong_pool() -> BackendError {
    BackendError::Shape {
        op: "state pool",
        detail: "the pool is not of the model's state layout".into(),
    }
}

impl<B: Backend> StatePool<B> {
    /// Copy block `block` to host memory ([`StateLayout::block_bytes`]).
    pub fn read_block(&self, backend: &B, block: u32, out: &mut [u8]) -> Result<(), BackendError> {
        match self {
            StatePool::Kv(p) => backend.kv_read_block(p, block, out),
            StatePool::Compressed(p) => backend.compressed_read_block(p, block, out),
        }
    }

    /// Fill block `block` from bytes [`StatePool::read_block`] wrote.
    pub fn write_block(
        &mut self,
        backend: &B,
        block: u32,
        data: &[u8],
    ) -> Result<(), BackendError> {
        match self {
            StatePool::Kv(p) => backend.kv_write_block(p, block, data),
            StatePool::Compressed(p) => backend.compressed_write_block(p, block, data),
        }
    }

    /// Copy window block `window` to host memory ([`StateLayout::window_bytes`]).
    pub fn read_window(
        &self,
        backend: &B,
        window: u32,
        out: &mut [u8],
    ) -> Result<(), BackendError> {
        match self {
            StatePool::Kv(_) => Err(wrong_pool()),
            StatePool::Compressed(p) => backend.window_read(p, window, out),
        }
    }

    /// Fill window block `window` from bytes [`StatePool::read_window`] wrote.
    pub fn write_window(
        &mut self,
        backend: &B,
        window: u32,
        data: &[u8],
    ) -> Result<(), BackendError> {
        match self {
            StatePool::Kv(_) => Err(wrong_pool()),
            StatePool::Compressed(p) => backend.window_write(p, window, data),
        }
    }

    /// Start `slot` for a sequence at a block boundary: empty, or resuming
    /// from the carry of `window` (no-op for dense pools).
    pub fn begin(
        &mut self,
        backend: &B,
        slot: u32,
        window: Option<u32>,
    ) -> Result<(), BackendError> {
        match self {
            StatePool::Kv(_) => Ok(()),
            StatePool::Compressed(p) => backend.compressed_begin(p, slot, window),
        }
    }

    pub fn kv_mut(&mut self) -> Result<&mut B::KvPool, BackendError> {
        match self {
            StatePool::Kv(p) => Ok(p),
            StatePool::Compressed(_) => Err(wrong_pool()),
        }
    }

    pub fn compressed_mut(&mut self) -> Result<&mut B::CompressedPool, BackendError> {
        match self {
            StatePool::Compressed(p) => Ok(p),
            StatePool::Kv(_) => Err(wrong_pool()),
        }
    }
}
