//! Causal multi-head attention with grouped KV heads over a paged KV pool.
//!
//! The pool holds fixed-size blocks; each block keeps `block_size`
//! consecutive positions of one sequence for every layer, laid out as the
//! serialized form of [`crate::Backend::kv_read_block`]: for each layer the
//! keys `[block_size, kv_dim]`, then the values. A sequence reaches its
//! positions through its block table. Storage is allocated when a block is
//! first written.
//!
//! With production numerics values are stored as f16, the precision of
//! llama.cpp's default F16 cache, so the reference backend computes what
//! the fast paths compute; with exact numerics they are kept as f32.

use half::f16;
use half::slice::HalfFloatSliceExt;
use rayon::prelude::*;

use super::elementwise::{axpy, dot_f32};
use super::CpuTensor;
use crate::backend::{AttentionConfig, BackendError, KvDtype, KvPoolConfig, KvSeq};

/// Blocks of every sequence, for every layer.
#[derive(Debug)]
pub struct CpuKvPool {
    cfg: KvPoolConfig,
    storage: Storage,
    /// Per-sequence f32 copies of the cache, reused from call to call (a
    /// fresh allocation per layer costs page faults and zero fills).
    gathered: Vec<(Vec<f32>, Vec<f32>)>,
}

#[derive(Debug)]
enum Storage {
    F16(Vec<Option<Box<[f16]>>>),
    F32(Vec<Option<Box<[f32]>>>),
}

impl CpuKvPool {
    pub fn new(cfg: KvPoolConfig, dtype: KvDtype) -> CpuKvPool {
        let storage = match dtype {
            KvDtype::F16 => Storage::F16((0..cfg.n_blocks).map(|_| None).collect()),
            KvDtype::F32 => Storage::F32((0..cfg.n_blocks).map(|_| None).collect()),
        };
        CpuKvPool {
            cfg,
            storage,
            gathered: Vec::new(),
        }
    }

    pub fn config(&self) -> KvPoolConfig {
        self.cfg
    }

    pub fn dtype(&self) -> KvDtype {
        match self.storage {
            Storage::F16(_) => KvDtype::F16,
            Storage::F32(_) => KvDtype::F32,
        }
    }

    /// Values per block.
    fn block_len(&self) -> usize {
        self.cfg.n_layer * 2 * self.cfg.block_size * self.cfg.kv_dim
    }

    /// Offset of `(layer, keys or values, slot)` inside a block.
    fn offset(&self, layer: usize, values: bool, slot: usize) -> usize {
        ((layer * 2 + usize::from(values)) * self.cfg.block_size + slot) * self.cfg.kv_dim
    }

    fn check_block(&self, block: u32) -> Result<usize, BackendError> {
        let b = block as usize;
        if b >= self.cfg.n_blocks {
            return Err(BackendError::Shape {
                op: "kv pool",
                detail: format!("block {b} of a pool of {}", self.cfg.n_blocks),
            });
        }
        Ok(b)
    }

    /// Serialize block `block` (zeros if it was never written).
    pub fn read_block(&self, block: u32, out: &mut [u8]) -> Result<(), BackendError> {
        let b = self.check_block(block)?;
        let want = self.cfg.block_bytes(self.dtype());
        if out.len() != want {
            return Err(BackendError::Shape {
                op: "kv_read_block",
                detail: format!("{} bytes for a block of {want}", out.len()),
            });
        }
        match &self.storage {
            Storage::F16(blocks) => match &blocks[b] {
                Some(data) => {
                    for (dst, v) in out.chunks_exact_mut(2).zip(data.iter()) {
                        dst.copy_from_slice(&v.to_le_bytes());
                    }
                }
                None => out.fill(0),
            },
            Storage::F32(blocks) => match &blocks[b] {
                Some(data) => {
                    for (dst, v) in out.chunks_exact_mut(4).zip(data.iter()) {
                        dst.copy_from_slice(&v.to_le_bytes());
                    }
                }
                None => out.fill(0),
            },
        }
        Ok(())
    }

    /// Fill block `block` from its serialized form.
    pub fn write_block(&mut self, block: u32, data: &[u8]) -> Result<(), BackendError> {
        let b = self.check_block(block)?;
        let want = self.cfg.block_bytes(self.dtype());
        if data.len() != want {
            return Err(BackendError::Shape {
                op: "kv_write_block",
                detail: format!("{} bytes for a block of {want}", data.len()),
            });
        }
        let n = self.block_len();
        match &mut self.storage {
            Storage::F16(blocks) => {
                let dst = blocks[b].get_or_insert_with(|| vec![f16::ZERO; n].into());
                for (d, s) in dst.iter_mut().zip(data.chunks_exact(2)) {
                    *d = f16::from_le_bytes([s[0], s[1]]);
                }
            }
            Storage::F32(blocks) => {
                let dst = blocks[b].get_or_insert_with(|| vec![0.0; n].into());
                for (d, s) in dst.iter_mut().zip(data.chunks_exact(4)) {
                    *d = f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
                }
            }
        }
        Ok(())
    }

    /// Store the key and value rows of position `pos` of a sequence.
    fn store(
        &mut self,
        layer: usize,
        blocks: &[u32],
        pos: usize,
        k: &[f32],
        v: &[f32],
    ) -> Result<(), BackendError> {
        let bs = self.cfg.block_size;
        let block = *blocks.get(pos / bs).ok_or_else(|| BackendError::Shape {
            op: "attention",
            detail: format!(
                "position {pos} is past the {} blocks of the sequence",
                blocks.len()
            ),
        })?;
        let b = self.check_block(block)?;
        let (ko, vo) = (
            self.offset(layer, false, pos % bs),
            self.offset(layer, true, pos % bs),
        );
        let (n, d) = (self.block_len(), self.cfg.kv_dim);
        match &mut self.storage {
            Storage::F16(blocks) => {
                let dst = blocks[b].get_or_insert_with(|| vec![f16::ZERO; n].into());
                dst[ko..ko + d].convert_from_f32_slice(k);
                dst[vo..vo + d].convert_from_f32_slice(v);
            }
            Storage::F32(blocks) => {
                let dst = blocks[b].get_or_insert_with(|| vec![0.0; n].into());
                dst[ko..ko + d].copy_from_slice(k);
                dst[vo..vo + d].copy_from_slice(v);
            }
        }
        Ok(())
    }

    /// Keys and values of layer `layer` for positions `0 .. n` of the
    /// sequence with block table `blocks`, as f32 `[n, kv_dim]` each, into
    /// the first `n * kv_dim` values of `keys` and `vals` (grown as needed):
    /// one conversion per block (a block's slots are contiguous per layer).
    fn gather(
        &self,
        layer: usize,
        blocks: &[u32],
        n: usize,
        keys: &mut Vec<f32>,
        vals: &mut Vec<f32>,
    ) {
        let (bs, d) = (self.cfg.block_size, self.cfg.kv_dim);
        for buf in [&mut *keys, &mut *vals] {
            if buf.len() < n * d {
                buf.resize(n * d, 0.0);
            }
        }
        let (ko, vo) = (self.offset(layer, false, 0), self.offset(layer, true, 0));
        for (i, (kd, vd)) in keys[..n * d]
            .chunks_mut(bs * d)
            .zip(vals[..n * d].chunks_mut(bs * d))
            .enumerate()
        {
            let len = kd.len();
            match &self.storage {
                Storage::F16(store) => match &store[blocks[i] as usize] {
                    Some(b) => {
                        to_f32(&b[ko..ko + len], kd);
                        to_f32(&b[vo..vo + len], vd);
                    }
                    None => {
                        kd.fill(0.0);
                        vd.fill(0.0);
                    }
                },
                Storage::F32(store) => match &store[blocks[i] as usize] {
                    Some(b) => {
                        kd.copy_from_slice(&b[ko..ko + len]);
                        vd.copy_from_slice(&b[vo..vo + len]);
                    }
                    None => {
                        kd.fill(0.0);
                        vd.fill(0.0);
                    }
                },
            }
        }
    }
}

/// Exact f16 to f32 conversion of a slice, in hardware where the CPU can.
fn to_f32(src: &[f16], dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if super::simd::has_f16c() {
        return super::simd::f16_to_f32(src, dst);
    }
    src.convert_to_f32_slice(dst);
}

fn shape_error(detail: String) -> BackendError {
    BackendError::Shape {
        op: "attention",
        detail,
    }
}

#[allow(clippy::too_many_arguments)]
pub fn attention(
    q: &CpuTensor,
    k: &CpuTensor,
    v: &CpuTensor,
    pool: &mut CpuKvPool,
    layer: usize,
    seqs: &[KvSeq<'_>],
    cfg: &AttentionConfig,
    out: &mut CpuTensor,
) -> Result<(), BackendError> {
    let hd = cfg.head_dim;
    let kv_dim = cfg.n_head_kv * hd;
    let shape_ok = q.cols == cfg.n_head * hd
        && k.cols == kv_dim
        && v.cols == kv_dim
        && pool.cfg.kv_dim == kv_dim
        && layer < pool.cfg.n_layer
        && k.rows == q.rows
        && v.rows == q.rows
        && out.rows == q.rows
        && out.cols == q.cols
        && cfg.n_head_kv > 0
        && cfg.n_head.is_multiple_of(cfg.n_head_kv);
    if !shape_ok {
        return Err(shape_error(format!(
            "q [{}, {}], k [{}, {}], v [{}, {}], out [{}, {}], layer {layer}, {cfg:?}, pool {:?}",
            q.rows, q.cols, k.rows, k.cols, v.rows, v.cols, out.rows, out.cols, pool.cfg
        )));
    }
    // Which sequence (and position) every row belongs to.
    let mut row_seq: Vec<Option<(usize, usize)>> = vec![None; q.rows];
    for (s, seq) in seqs.iter().enumerate() {
        let end = seq.row.checked_add(seq.n_rows).filter(|&e| e <= q.rows);
        let end = end
            .ok_or_else(|| shape_error(format!("rows {}+{} of {}", seq.row, seq.n_rows, q.rows)))?;
        for (i, slot) in row_seq[seq.row..end].iter_mut().enumerate() {
            if slot.replace((s, seq.pos + i)).is_some() {
                return Err(shape_error(format!(
                    "row {} belongs to two sequences",
                    seq.row + i
                )));
            }
        }
    }
    for seq in seqs {
        for i in 0..seq.n_rows {
            let r = seq.row + i;
            pool.store(layer, seq.blocks, seq.pos + i, k.row(r), v.row(r))?;
        }
    }
    let group = cfg.n_head / cfg.n_head_kv;
    // Each sequence's cached keys and values as f32, once for all its rows
    // and heads.
    let mut cached = std::mem::take(&mut pool.gathered);
    if cached.len() < seqs.len() {
        cached.resize_with(seqs.len(), Default::default);
    }
    let pool_ref = &*pool;
    cached
        .par_iter_mut()
        .zip(seqs)
        .for_each(|((k, v), seq)| pool_ref.gather(layer, seq.blocks, seq.pos + seq.n_rows, k, v));
    out.data
        .par_chunks_mut(group * hd)
        .enumerate()
        .for_each(|(idx, dst)| {
            let (r, kvh) = (idx / cfg.n_head_kv, idx % cfg.n_head_kv);
            let Some((s, pos)) = row_seq[r] else {
                // A row outside every sequence attends to nothing.
                dst.fill(0.0);
                return;
            };
            let (keys, vals) = &cached[s];
            let at = |t: usize| t * kv_dim + kvh * hd..t * kv_dim + (kvh + 1) * hd;
            let n = pos + 1;
            let mut scores = vec![0.0f32; n];
            for (g, dst) in dst.chunks_exact_mut(hd).enumerate() {
                let h = kvh * group + g;
                let qh = &q.data[r * q.cols + h * hd..r * q.cols + (h + 1) * hd];
                for (t, s) in scores.iter_mut().enumerate() {
                    *s = dot_f32(qh, &keys[at(t)]) * cfg.scale;
                }
                let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let mut sum = 0.0f32;
                for s in &mut scores {
                    *s = (*s - max).exp();
                    sum += *s;
                }
                dst.fill(0.0);
                for (t, &p) in scores.iter().enumerate() {
                    axpy(dst, p / sum, &vals[at(t)]);
                }
            }
        });
    pool.gathered = cached;
    Ok(())
}
