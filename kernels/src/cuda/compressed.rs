//! Launch wrappers of `compressed.cu`: the compressed-attention pool in
//! device memory (blocks, window blocks, frontier slots), raw-row stores,
//! the compressors, the lightning indexer's selection and attention with
//! sinks over the raw window plus pooled rows.
//!
//! Not implemented yet: every op says so.

use super::{CudaBackend, CudaTensor, CudaWeight};
use crate::backend::{
    BackendError, CompressedAttentionConfig, CompressedPoolConfig, CompressedSeq, CompressorConfig,
};

fn missing(op: &str) -> BackendError {
    BackendError::Device(format!("{op} is not implemented on the CUDA backend yet"))
}

/// The compressed-attention pool in device memory.
pub struct CudaCompressedPool {
    cfg: CompressedPoolConfig,
}

impl CudaCompressedPool {
    pub fn config(&self) -> &CompressedPoolConfig {
        &self.cfg
    }
}

pub(super) fn pool(
    _be: &CudaBackend,
    cfg: &CompressedPoolConfig,
) -> Result<CudaCompressedPool, BackendError> {
    let _ = CudaCompressedPool { cfg: cfg.clone() };
    Err(missing("compressed_pool"))
}

pub(super) fn begin(
    _be: &CudaBackend,
    _pool: &mut CudaCompressedPool,
    _slot: u32,
    _window: Option<u32>,
) -> Result<(), BackendError> {
    Err(missing("compressed_begin"))
}

pub(super) fn window_store(
    _be: &CudaBackend,
    _pool: &mut CudaCompressedPool,
    _layer: usize,
    _seqs: &[CompressedSeq<'_>],
    _kv: &CudaTensor,
) -> Result<(), BackendError> {
    Err(missing("window_store"))
}

#[allow(clippy::too_many_arguments)]
pub(super) fn compress(
    _be: &CudaBackend,
    _pool: &mut CudaCompressedPool,
    _layer: usize,
    _seqs: &[CompressedSeq<'_>],
    _k: &CudaTensor,
    _s: &CudaTensor,
    _ape: &CudaWeight,
    _norm: &CudaWeight,
    _cfg: &CompressorConfig,
) -> Result<(), BackendError> {
    Err(missing("compress"))
}

#[allow(clippy::too_many_arguments)]
pub(super) fn indexer_select(
    _be: &CudaBackend,
    _pool: &CudaCompressedPool,
    _layer: usize,
    _seqs: &[CompressedSeq<'_>],
    _q: &CudaTensor,
    _w: &CudaTensor,
    _top_k: usize,
    _out: &mut CudaTensor,
) -> Result<(), BackendError> {
    Err(missing("indexer_select"))
}

#[allow(clippy::too_many_arguments)]
pub(super) fn attention(
    _be: &CudaBackend,
    _q: &CudaTensor,
    _pool: &CudaCompressedPool,
    _layer: usize,
    _seqs: &[CompressedSeq<'_>],
    _selected: Option<&CudaTensor>,
    _sinks: &CudaWeight,
    _cfg: &CompressedAttentionConfig,
    _out: &mut CudaTensor,
) -> Result<(), BackendError> {
    Err(missing("compressed_attention"))
}

pub(super) fn read_block(
    _be: &CudaBackend,
    _pool: &CudaCompressedPool,
    _block: u32,
    _out: &mut [u8],
) -> Result<(), BackendError> {
    Err(missing("compressed_read_block"))
}

pub(super) fn write_block(
    _be: &CudaBackend,
    _pool: &mut CudaCompressedPool,
    _block: u32,
    _data: &[u8],
) -> Result<(), BackendError> {
    Err(missing("compressed_write_block"))
}

pub(super) fn window_read(
    _be: &CudaBackend,
    _pool: &CudaCompressedPool,
    _window: u32,
    _out: &mut [u8],
) -> Result<(), BackendError> {
    Err(missing("window_read"))
}

pub(super) fn window_write(
    _be: &CudaBackend,
    _pool: &mut CudaCompressedPool,
    _window: u32,
    _data: &[u8],
) -> Result<(), BackendError> {
    Err(missing("window_write"))
}
