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

use super::elementwise::{axpy, axpy_f16, dot_f16, dot_f32};
use super::CpuTensor;
use crate::backend::{AttentionConfig, BackendError, KvDtype, KvPoolConfig, KvSeq};

/// Blocks of every sequence, for every layer.
#[derive(Debug)]
pub struct CpuKvPool {
    cfg: KvPoolConfig,
    storage: Storage,
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
        CpuKvPool { cfg, storage }
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

    /// The keys and the values of layer `layer` in each of `blocks`, in
    /// place (`[block_size, kv_dim]` each); blocks never written read as
    /// zeros.
    fn layer_rows<'a, E: KvValue>(
        &self,
        store: &'a [Option<Box<[E]>>],
        zeros: &'a [E],
        layer: usize,
        blocks: &[u32],
    ) -> Vec<(&'a [E], &'a [E])> {
        let len = self.cfg.block_size * self.cfg.kv_dim;
        let (ko, vo) = (self.offset(layer, false, 0), self.offset(layer, true, 0));
        blocks
            .iter()
            .map(|&b| match &store[b as usize] {
                Some(d) => (&d[ko..ko + len], &d[vo..vo + len]),
                None => (zeros, zeros),
            })
            .collect()
    }
}

/// A type the pool stores values in: attention reads them in place, each
/// converted exactly to f32 as it is used. Both methods give the same bits
/// as `dot_f32` and `axpy` over the converted rows; where the CPU has the
/// vector kernels (`attention_rows` in `simd.rs`) they run those.
trait KvValue: Copy + Default + Send + Sync {
    /// `scores[t] = dot(q, rows(t)) * scale`.
    fn dots<'a>(q: &[f32], rows: impl Fn(usize) -> &'a [Self], scale: f32, scores: &mut [f32])
    where
        Self: 'a;

    /// `dst = 0`, then `axpy(dst, w[t], rows(t))` for every `t` in order.
    fn weighted_sum<'a>(dst: &mut [f32], w: &[f32], rows: impl Fn(usize) -> &'a [Self])
    where
        Self: 'a;
}

/// `KvValue` for `$t`: the vector kernels `$dots` and `$wsum` of `simd.rs`
/// where the CPU runs them, else `$dot` and `$axpy` row by row.
macro_rules! kv_value {
    ($t:ty, $dot:ident, $axpy:ident, $dots:ident, $wsum:ident) => {
        impl KvValue for $t {
            fn dots<'a>(
                q: &[f32],
                rows: impl Fn(usize) -> &'a [$t],
                scale: f32,
                scores: &mut [f32],
            ) {
                #[cfg(target_arch = "x86_64")]
                if super::simd::$dots(q, &rows, scale, scores) {
                    return;
                }
                for (t, s) in scores.iter_mut().enumerate() {
                    *s = $dot(q, &rows(t)[..q.len()]) * scale;
                }
            }

            fn weighted_sum<'a>(dst: &mut [f32], w: &[f32], rows: impl Fn(usize) -> &'a [$t]) {
                #[cfg(target_arch = "x86_64")]
                if super::simd::$wsum(dst, w, &rows) {
                    return;
                }
                dst.fill(0.0);
                let hd = dst.len();
                for (t, &wt) in w.iter().enumerate() {
                    $axpy(dst, wt, &rows(t)[..hd]);
                }
            }
        }
    };
}

kv_value!(f32, dot_f32, axpy, dots_f32, weighted_sum_f32);
kv_value!(f16, dot_f16, axpy_f16, dots_f16, weighted_sum_f16);

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
    match &pool.storage {
        Storage::F16(store) => attend(pool, store, q, layer, seqs, &row_seq, cfg, out),
        Storage::F32(store) => attend(pool, store, q, layer, seqs, &row_seq, cfg, out),
    }
    Ok(())
}

/// Every row of `q` against the cached keys and values of its sequence,
/// read in place from the pool's blocks `store`; `row_seq` gives each
/// row's sequence and position. One task per row and KV head.
#[allow(clippy::too_many_arguments)]
fn attend<E: KvValue>(
    pool: &CpuKvPool,
    store: &[Option<Box<[E]>>],
    q: &CpuTensor,
    layer: usize,
    seqs: &[KvSeq<'_>],
    row_seq: &[Option<(usize, usize)>],
    cfg: &AttentionConfig,
    out: &mut CpuTensor,
) {
    let (hd, bs) = (cfg.head_dim, pool.cfg.block_size);
    let kv_dim = cfg.n_head_kv * hd;
    let group = cfg.n_head / cfg.n_head_kv;
    let zeros = vec![E::default(); bs * kv_dim];
    let rows: Vec<_> = seqs
        .iter()
        .map(|seq| pool.layer_rows(store, &zeros, layer, seq.blocks))
        .collect();
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
            let blocks = &rows[s];
            // Position t's key or value row of this KV head.
            let at = |t: usize, values: bool| {
                let (k, v) = blocks[t / bs];
                let o = (t % bs) * kv_dim + kvh * hd;
                &(if values { v } else { k })[o..o + hd]
            };
            let n = pos + 1;
            let mut scores = vec![0.0f32; n];
            for (g, dst) in dst.chunks_exact_mut(hd).enumerate() {
                let h = kvh * group + g;
                let qh = &q.data[r * q.cols + h * hd..r * q.cols + (h + 1) * hd];
                E::dots(qh, |t| at(t, false), cfg.scale, &mut scores);
                let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let mut sum = 0.0f32;
                for s in &mut scores {
                    *s = (*s - max).exp();
                    sum += *s;
                }
                // The probabilities, as each value row's weight.
                for s in &mut scores {
                    *s /= sum;
                }
                E::weighted_sum(dst, &scores, |t| at(t, true));
            }
        });
}
