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

    /// `axpy(dst, w[t], rows(t))` for every `t` in order.
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
/// row's sequence and position.
///
/// A task is one row and a run of its KV heads: all of them where the
/// rows alone keep every thread busy (each block's key and value rows
/// are then read front to back, which the caches fetch ahead), else one
/// each. Block by block, the next block's keys and this block's values
/// are prefetched while this block's keys are scored: the cache streams
/// from memory, and its rows are too short for the hardware to guess.
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
    let kv_per_task = if q.rows >= 2 * rayon::current_num_threads() {
        cfg.n_head_kv
    } else {
        1
    };
    let tasks_per_row = cfg.n_head_kv / kv_per_task;
    out.data
        .par_chunks_mut(kv_per_task * group * hd)
        .enumerate()
        .for_each(|(idx, dst)| {
            let (r, kv0) = (idx / tasks_per_row, idx % tasks_per_row * kv_per_task);
            let Some((s, pos)) = row_seq[r] else {
                // A row outside every sequence attends to nothing.
                dst.fill(0.0);
                return;
            };
            let n = pos + 1;
            // Per block: its keys and values, and how many of its
            // positions this row sees.
            let spans: Vec<(&[E], &[E], usize)> = rows[s]
                .iter()
                .take(n.div_ceil(bs))
                .enumerate()
                .map(|(b, &(k, v))| (k, v, bs.min(n - b * bs)))
                .collect();
            // The task's part of each key and value row.
            let (off, width) = (kv0 * hd, kv_per_task * hd);
            let heads = kv_per_task * group;
            let mut scores = vec![0.0f32; heads * n];
            for (b, &(k, v, len)) in spans.iter().enumerate() {
                if b == 0 {
                    prefetch_rows(k, len, kv_dim, off, width);
                }
                if let Some(&(k, _, len)) = spans.get(b + 1) {
                    prefetch_rows(k, len, kv_dim, off, width);
                }
                prefetch_rows(v, len, kv_dim, off, width);
                for (h, scores) in scores.chunks_exact_mut(n).enumerate() {
                    let head = kv0 * group + h;
                    let o = off + h / group * hd;
                    let qh = &q.data[r * q.cols + head * hd..][..hd];
                    let scores = &mut scores[b * bs..b * bs + len];
                    E::dots(qh, |t| &k[t * kv_dim + o..][..hd], cfg.scale, scores);
                }
            }
            // The probabilities, as each value row's weight.
            scores.chunks_exact_mut(n).for_each(super::expf::softmax);
            dst.fill(0.0);
            for (b, &(_, v, len)) in spans.iter().enumerate() {
                for (h, (dst, w)) in dst
                    .chunks_exact_mut(hd)
                    .zip(scores.chunks_exact(n))
                    .enumerate()
                {
                    let o = off + h / group * hd;
                    E::weighted_sum(dst, &w[b * bs..b * bs + len], |t| {
                        &v[t * kv_dim + o..][..hd]
                    });
                }
            }
        });
}

/// Prefetches rows `0..len` (each `width` values from `t * stride + off`)
/// of a block's keys or values.
fn prefetch_rows<E>(kv: &[E], len: usize, stride: usize, off: usize, width: usize) {
    #[cfg(target_arch = "x86_64")]
    for t in 0..len {
        crate::quant::prefetch_l2(&kv[t * stride + off..][..width]);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (kv, len, stride, off, width);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::tests::floats;

    fn tensor(rows: usize, cols: usize, seed: u64) -> CpuTensor {
        CpuTensor {
            rows,
            cols,
            data: floats(seed, rows * cols, 1.0),
        }
    }

    /// Causal attention in f64 over f16-rounded keys and values.
    fn reference(
        q: &[f32],
        keys: &[Vec<f32>],
        values: &[Vec<f32>],
        cfg: &AttentionConfig,
    ) -> Vec<f32> {
        let hd = cfg.head_dim;
        let group = cfg.n_head / cfg.n_head_kv;
        let round = |v: f32| f64::from(f16::from_f32(v).to_f32());
        let mut out = vec![0.0f32; cfg.n_head * hd];
        for h in 0..cfg.n_head {
            let o = h / group * hd;
            let scores: Vec<f64> = keys
                .iter()
                .map(|k| {
                    (0..hd)
                        .map(|i| f64::from(q[h * hd + i]) * round(k[o + i]))
                        .sum::<f64>()
                        * f64::from(cfg.scale)
                })
                .collect();
            let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let w: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
            let sum: f64 = w.iter().sum();
            for i in 0..hd {
                let v: f64 = w.iter().zip(values).map(|(w, v)| w * round(v[o + i])).sum();
                out[h * hd + i] = (v / sum) as f32;
            }
        }
        out
    }

    /// Decode rows of several sequences attend to their own cached
    /// positions (across blocks, the last one partial) as the f64
    /// reference does, and each row's output is bit-identical whether it
    /// runs alone (one task per KV head) or in a batch of many rows (one
    /// task per row).
    #[test]
    fn decode_rows_match_the_reference_and_do_not_depend_on_the_batch() {
        let cfg = AttentionConfig {
            n_head: 6,
            n_head_kv: 2,
            head_dim: 64,
            scale: 0.125,
        };
        let (bs, kv_dim, n_layer) = (16, 128, 2);
        let lens = [1usize, 15, 16, 17, 40, 70, 33, 5, 64, 100];
        let per_seq = 8;
        let mut pool = CpuKvPool::new(
            KvPoolConfig {
                n_layer,
                kv_dim,
                block_size: bs,
                n_blocks: lens.len() * per_seq,
            },
            KvDtype::F16,
        );
        let tables: Vec<Vec<u32>> = (0..lens.len())
            .map(|s| (0..per_seq).map(|b| (b * lens.len() + s) as u32).collect())
            .collect();
        let layer = 1;
        // Prefill every sequence but its last position.
        // Per sequence: its cached key rows and value rows.
        type Rows = Vec<Vec<f32>>;
        let mut cache: Vec<(Rows, Rows)> = Vec::new();
        for (s, &len) in lens.iter().enumerate() {
            let rows = len - 1;
            let (k, v) = (
                tensor(rows, kv_dim, 10 + s as u64),
                tensor(rows, kv_dim, 50 + s as u64),
            );
            if rows > 0 {
                let q = tensor(rows, cfg.n_head * 64, 90);
                let mut out = tensor(rows, cfg.n_head * 64, 0);
                let seq = [KvSeq {
                    blocks: &tables[s],
                    row: 0,
                    n_rows: rows,
                    pos: 0,
                }];
                attention(&q, &k, &v, &mut pool, layer, &seq, &cfg, &mut out).unwrap();
            }
            cache.push((
                (0..rows).map(|r| k.row(r).to_vec()).collect(),
                (0..rows).map(|r| v.row(r).to_vec()).collect(),
            ));
        }
        // The decode step: one new row per sequence, all in one batch.
        let n = lens.len();
        let (q, k, v) = (
            tensor(n, cfg.n_head * 64, 7),
            tensor(n, kv_dim, 8),
            tensor(n, kv_dim, 9),
        );
        let seqs: Vec<KvSeq> = (0..n)
            .map(|s| KvSeq {
                blocks: &tables[s],
                row: s,
                n_rows: 1,
                pos: lens[s] - 1,
            })
            .collect();
        let mut batched = tensor(n, cfg.n_head * 64, 0);
        attention(&q, &k, &v, &mut pool, layer, &seqs, &cfg, &mut batched).unwrap();
        for s in 0..n {
            // The same row alone (its key and value rows stored again,
            // unchanged).
            let one = |t: &CpuTensor| CpuTensor {
                rows: 1,
                cols: t.cols,
                data: t.row(s).to_vec(),
            };
            let seq = [KvSeq {
                blocks: &tables[s],
                row: 0,
                n_rows: 1,
                pos: lens[s] - 1,
            }];
            let mut alone = tensor(1, cfg.n_head * 64, 0);
            attention(
                &one(&q),
                &one(&k),
                &one(&v),
                &mut pool,
                layer,
                &seq,
                &cfg,
                &mut alone,
            )
            .unwrap();
            assert_eq!(
                alone.data.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                batched
                    .row(s)
                    .iter()
                    .map(|x| x.to_bits())
                    .collect::<Vec<_>>(),
                "sequence {s}: alone and batched differ"
            );
            let (mut keys, mut values) = cache[s].clone();
            keys.push(k.row(s).to_vec());
            values.push(v.row(s).to_vec());
            let want = reference(q.row(s), &keys, &values, &cfg);
            for (i, (&g, &w)) in batched.row(s).iter().zip(&want).enumerate() {
                assert!(
                    (g - w).abs() <= 1e-5 + 1e-4 * w.abs(),
                    "sequence {s} value {i}: {g} vs {w}"
                );
            }
        }
    }
}
