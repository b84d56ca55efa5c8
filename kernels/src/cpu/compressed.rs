//! CPU reference of compressed attention (DeepSeek V4, spec §3.4-§3.6):
//! the pool of blocks, window blocks and frontier slots
//! ([`CompressedPoolConfig`]), raw-row stores, the compressors, the
//! lightning indexer's selection and attention with sinks over the raw
//! window plus pooled rows. Pooling, scores and attention accumulate in
//! f64, as the specification's float64 reference does.

use half::f16;
use rayon::prelude::*;

use super::hyper::{fp8_blocks, indexer_head, rope_tail_head};
use super::{CpuTensor, CpuWeight};
use crate::backend::{
    BackendError, CompressedAttentionConfig, CompressedPoolConfig, CompressedSeq, CompressorConfig,
    CompressorKind,
};
use crate::quant;

/// Rows in the pool's row dtype.
#[derive(Clone, Debug)]
enum Rows {
    F16(Vec<f16>),
    F32(Vec<f32>),
}

impl Rows {
    fn zeroed(n: usize, f16_rows: bool) -> Rows {
        if f16_rows {
            Rows::F16(vec![f16::ZERO; n])
        } else {
            Rows::F32(vec![0.0; n])
        }
    }

    fn read(&self, at: usize, out: &mut [f32]) {
        let n = out.len();
        match self {
            Rows::F16(v) => out
                .iter_mut()
                .zip(&v[at..at + n])
                .for_each(|(o, x)| *o = x.to_f32()),
            Rows::F32(v) => out.copy_from_slice(&v[at..at + n]),
        }
    }

    fn write(&mut self, at: usize, src: &[f32]) {
        match self {
            Rows::F16(v) => v[at..at + src.len()]
                .iter_mut()
                .zip(src)
                .for_each(|(o, &x)| *o = f16::from_f32(x)),
            Rows::F32(v) => v[at..at + src.len()].copy_from_slice(src),
        }
    }

    fn to_bytes(&self, out: &mut [u8]) {
        match self {
            Rows::F16(v) => out
                .chunks_exact_mut(2)
                .zip(v)
                .for_each(|(o, x)| o.copy_from_slice(&x.to_le_bytes())),
            Rows::F32(v) => out
                .chunks_exact_mut(4)
                .zip(v)
                .for_each(|(o, x)| o.copy_from_slice(&x.to_le_bytes())),
        }
    }

    fn fill_from(&mut self, data: &[u8]) {
        match self {
            Rows::F16(v) => v
                .iter_mut()
                .zip(data.chunks_exact(2))
                .for_each(|(o, b)| *o = f16::from_le_bytes([b[0], b[1]])),
            Rows::F32(v) => v
                .iter_mut()
                .zip(data.chunks_exact(4))
                .for_each(|(o, b)| *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        }
    }
}

/// A window block: raw rows, then the carry.
#[derive(Clone, Debug)]
struct Window {
    raw: Rows,
    carry: Vec<f32>,
}

/// Where a layer's parts are, in values.
#[derive(Clone, Copy, Debug, Default)]
struct LayerOffsets {
    /// Pooled rows within a block.
    rows: usize,
    /// Indexer rows within a block (ratio 4).
    index_rows: usize,
    /// Attention compressor frontier within a slot.
    slot: usize,
    /// Indexer compressor frontier within a slot (ratio 4).
    index_slot: usize,
    /// Carry within a window block's carry (ratio 4).
    carry: usize,
}

/// The compressed-attention pool in host memory; blocks, window blocks
/// and slots are allocated when first written.
#[derive(Debug)]
pub struct CpuCompressedPool {
    cfg: CompressedPoolConfig,
    offsets: Vec<LayerOffsets>,
    blocks: Vec<Option<Rows>>,
    windows: Vec<Option<Window>>,
    slots: Vec<Option<Vec<f32>>>,
}

fn shape_err(op: &'static str, detail: String) -> BackendError {
    BackendError::Shape { op, detail }
}

impl CpuCompressedPool {
    pub fn new(cfg: CompressedPoolConfig) -> Result<CpuCompressedPool, BackendError> {
        if cfg
            .ratios
            .iter()
            .any(|&r| r != 0 && !cfg.block_size.is_multiple_of(r))
            || cfg.block_size < cfg.window
            || !cfg.block_size.is_multiple_of(4)
        {
            return Err(shape_err(
                "compressed_pool",
                format!(
                    "block size {} must be a multiple of 4 and of every ratio {:?}, and at least the window {}",
                    cfg.block_size, cfg.ratios, cfg.window
                ),
            ));
        }
        let (mut rows, mut slot, mut carry) = (0, 0, 0);
        let offsets = cfg
            .ratios
            .iter()
            .map(|&r| {
                let n = cfg.rows_per_block(r);
                let mut o = LayerOffsets {
                    rows,
                    slot,
                    carry,
                    ..LayerOffsets::default()
                };
                rows += n * cfg.head_dim;
                match r {
                    0 => {}
                    4 => {
                        o.index_rows = rows;
                        rows += n * cfg.index_dim;
                        slot += 2 * 8 * 2 * cfg.head_dim;
                        o.index_slot = slot;
                        slot += 2 * 8 * 2 * cfg.index_dim;
                        carry += 4 * 2 * (cfg.head_dim + cfg.index_dim);
                    }
                    r => slot += 2 * r * cfg.head_dim,
                }
                o
            })
            .collect();
        Ok(CpuCompressedPool {
            offsets,
            blocks: vec![None; cfg.n_blocks],
            windows: vec![None; cfg.n_window_blocks],
            slots: vec![None; cfg.n_slots],
            cfg,
        })
    }

    pub fn config(&self) -> &CompressedPoolConfig {
        &self.cfg
    }

    fn row_bytes(&self) -> usize {
        self.cfg.row_bytes()
    }

    fn block_mut(&mut self, b: u32) -> Result<&mut Rows, BackendError> {
        let (n, f16_rows, values) = (
            self.blocks.len(),
            self.cfg.f16_rows,
            self.cfg.block_values(),
        );
        let slot = self.blocks.get_mut(b as usize).ok_or_else(|| {
            shape_err(
                "compressed pool",
                format!("block {b} is outside the pool of {n}"),
            )
        })?;
        Ok(slot.get_or_insert_with(|| Rows::zeroed(values, f16_rows)))
    }

    fn window_mut(&mut self, w: u32) -> Result<&mut Window, BackendError> {
        let n = self.windows.len();
        let (raw, carry, f16_rows) = (
            self.cfg.window_raw_values(),
            self.cfg.carry_values(),
            self.cfg.f16_rows,
        );
        let slot = self.windows.get_mut(w as usize).ok_or_else(|| {
            shape_err(
                "compressed pool",
                format!("window block {w} is outside the pool of {n}"),
            )
        })?;
        Ok(slot.get_or_insert_with(|| Window {
            raw: Rows::zeroed(raw, f16_rows),
            carry: vec![0.0; carry],
        }))
    }

    fn window(&self, w: u32) -> Result<Option<&Window>, BackendError> {
        self.windows
            .get(w as usize)
            .map(Option::as_ref)
            .ok_or_else(|| {
                shape_err(
                    "compressed pool",
                    format!(
                        "window block {w} is outside the pool of {}",
                        self.windows.len()
                    ),
                )
            })
    }

    /// A slot [`begin`] started.
    fn slot_mut(&mut self, s: u32) -> Result<&mut Vec<f32>, BackendError> {
        let n = self.slots.len();
        match self.slots.get_mut(s as usize) {
            Some(Some(slot)) => Ok(slot),
            Some(None) => Err(shape_err(
                "compressed pool",
                format!("slot {s} was never begun"),
            )),
            None => Err(shape_err(
                "compressed pool",
                format!("slot {s} is outside the pool of {n}"),
            )),
        }
    }

    /// Pooled row `c` of `layer` (`index`: the indexer row) into `out`;
    /// zeros when its block was never written.
    fn read_pooled(
        &self,
        seq: &CompressedSeq<'_>,
        layer: usize,
        ratio: usize,
        c: usize,
        index: bool,
        out: &mut [f32],
    ) -> Result<(), BackendError> {
        let bs = self.cfg.block_size;
        let per = bs / ratio;
        let b = *seq.blocks.get(c * ratio / bs).ok_or_else(|| {
            shape_err(
                "compressed attention",
                format!("no block for pooled row {c}"),
            )
        })?;
        let o = self.offsets[layer];
        let at = if index {
            o.index_rows + (c % per) * self.cfg.index_dim
        } else {
            o.rows + (c % per) * self.cfg.head_dim
        };
        match self.blocks.get(b as usize) {
            Some(Some(rows)) => rows.read(at, out),
            Some(None) => out.fill(0.0),
            None => {
                return Err(shape_err(
                    "compressed attention",
                    format!("block {b} is outside the pool of {}", self.blocks.len()),
                ))
            }
        }
        Ok(())
    }

    fn read_raw(
        &self,
        seq: &CompressedSeq<'_>,
        layer: usize,
        p: usize,
        out: &mut [f32],
    ) -> Result<(), BackendError> {
        let bs = self.cfg.block_size;
        let w = window_of(seq, p, bs, "compressed attention")?;
        let at = (layer * bs + p % bs) * self.cfg.head_dim;
        match self.window(w)? {
            Some(win) => win.raw.read(at, out),
            None => out.fill(0.0),
        }
        Ok(())
    }
}

fn window_of(
    seq: &CompressedSeq<'_>,
    p: usize,
    bs: usize,
    op: &'static str,
) -> Result<u32, BackendError> {
    match seq.window.get(p / bs) {
        Some(&w) if w != u32::MAX => Ok(w),
        _ => Err(shape_err(
            op,
            format!("position {p} has no window block in the sequence's window table"),
        )),
    }
}

/// Reset one frontier (`rows × width` values then as many scores).
fn reset_frontier(f: &mut [f32]) {
    let half = f.len() / 2;
    f[..half].fill(0.0);
    f[half..].fill(f32::NEG_INFINITY);
}

pub fn begin(
    pool: &mut CpuCompressedPool,
    slot: u32,
    window: Option<u32>,
) -> Result<(), BackendError> {
    let cfg = pool.cfg.clone();
    let offsets = pool.offsets.clone();
    let carry: Option<Vec<f32>> = match window {
        Some(w) => Some(match pool.window(w)? {
            Some(win) => win.carry.clone(),
            None => vec![0.0; cfg.carry_values()],
        }),
        None => None,
    };
    let n = pool.slots.len();
    let s = pool
        .slots
        .get_mut(slot as usize)
        .ok_or_else(|| {
            shape_err(
                "compressed_begin",
                format!("slot {slot} is outside the pool of {n}"),
            )
        })?
        .get_or_insert_with(|| vec![0.0; cfg.slot_values()]);
    for (l, &r) in cfg.ratios.iter().enumerate() {
        let o = offsets[l];
        match r {
            0 => {}
            4 => {
                for (base, dim, carry_at) in [
                    (o.slot, cfg.head_dim, o.carry),
                    (o.index_slot, cfg.index_dim, o.carry + 4 * 2 * cfg.head_dim),
                ] {
                    let width = 2 * dim;
                    let f = &mut s[base..base + 2 * 8 * width];
                    reset_frontier(f);
                    if let Some(c) = &carry {
                        // Rows 0..3, first lane: values then scores.
                        let (kst, sst) = f.split_at_mut(8 * width);
                        for i in 0..4 {
                            kst[i * width..i * width + dim]
                                .copy_from_slice(&c[carry_at + i * dim..carry_at + (i + 1) * dim]);
                            let sc = carry_at + 4 * dim;
                            sst[i * width..i * width + dim]
                                .copy_from_slice(&c[sc + i * dim..sc + (i + 1) * dim]);
                        }
                    }
                }
            }
            r => reset_frontier(&mut s[o.slot..o.slot + 2 * r * cfg.head_dim]),
        }
    }
    Ok(())
}

fn check_rows(
    op: &'static str,
    seqs: &[CompressedSeq<'_>],
    x: &CpuTensor,
) -> Result<(), BackendError> {
    for s in seqs {
        if s.row + s.n_rows > x.rows {
            return Err(shape_err(
                op,
                format!(
                    "rows {}..{} of a {}-row tensor",
                    s.row,
                    s.row + s.n_rows,
                    x.rows
                ),
            ));
        }
    }
    Ok(())
}

pub fn window_store(
    pool: &mut CpuCompressedPool,
    layer: usize,
    seqs: &[CompressedSeq<'_>],
    kv: &CpuTensor,
) -> Result<(), BackendError> {
    check_rows("window_store", seqs, kv)?;
    let (bs, d) = (pool.cfg.block_size, pool.cfg.head_dim);
    if kv.cols != d {
        return Err(shape_err(
            "window_store",
            format!("rows of {} values, the pool's are {d}", kv.cols),
        ));
    }
    for s in seqs {
        for i in 0..s.n_rows {
            let p = s.pos + i;
            let w = window_of(s, p, bs, "window_store")?;
            let at = (layer * bs + p % bs) * d;
            pool.window_mut(w)?.raw.write(at, kv.row(s.row + i));
        }
    }
    Ok(())
}

/// Pool channel `j` over `cands` (frontier row, column offset) pairs.
fn pool_channel(kst: &[f32], sst: &[f32], width: usize, cands: &[(usize, usize)], j: usize) -> f32 {
    let mx = cands
        .iter()
        .map(|&(i, o)| sst[i * width + o + j])
        .fold(f32::NEG_INFINITY, f32::max);
    if mx == f32::NEG_INFINITY {
        return 0.0;
    }
    let (mut num, mut den) = (0f64, 0f64);
    for &(i, o) in cands {
        let e = (f64::from(sst[i * width + o + j] - mx)).exp();
        num += e * f64::from(kst[i * width + o + j]);
        den += e;
    }
    (num / den) as f32
}

#[allow(clippy::too_many_arguments)]
pub fn compress(
    pool: &mut CpuCompressedPool,
    layer: usize,
    seqs: &[CompressedSeq<'_>],
    k: &CpuTensor,
    s: &CpuTensor,
    ape: &CpuWeight,
    norm: &[f32],
    cfg: &CompressorConfig,
) -> Result<(), BackendError> {
    check_rows("compress", seqs, k)?;
    check_rows("compress", seqs, s)?;
    let pc = pool.cfg.clone();
    let r = cfg.ratio;
    let o = pool.offsets[layer];
    let (dim, frontier_at, carry_at) = match cfg.kind {
        CompressorKind::Attention => (pc.head_dim, o.slot, o.carry),
        CompressorKind::Indexer => (pc.index_dim, o.index_slot, o.carry + 4 * 2 * pc.head_dim),
    };
    let lanes = if r == 4 { 2 } else { 1 };
    let width = lanes * dim;
    if r == 0 || !pc.block_size.is_multiple_of(r) || (cfg.kind == CompressorKind::Indexer && r != 4)
    {
        return Err(shape_err(
            "compress",
            format!("ratio {r} for a {:?} compressor", cfg.kind),
        ));
    }
    if k.cols != width || s.cols != width || ape.cols != width || ape.rows != r || norm.len() != dim
    {
        return Err(shape_err(
            "compress",
            format!(
                "values [{}, {}], scores [{}, {}], position bias [{}, {}], norm {}; expected rows of {width}, {r} bias rows, norm {dim}",
                k.rows, k.cols, s.rows, s.cols, ape.rows, ape.cols, norm.len()
            ),
        ));
    }
    let mut bias = vec![0f32; r * width];
    for (i, row) in bias.chunks_mut(width).enumerate() {
        quant::dequantize_row(ape.ggml_type, ape.row(i), row).map_err(|e| {
            BackendError::BadWeight {
                name: ape.name.clone(),
                problem: e.to_string(),
            }
        })?;
    }
    let cands: Vec<(usize, usize)> = if r == 4 {
        (0..4)
            .map(|i| (i, 0))
            .chain((4..8).map(|i| (i, dim)))
            .collect()
    } else {
        (0..r).map(|i| (i, 0)).collect()
    };
    let n_front = lanes * r * width;
    let bs = pc.block_size;
    let n_rot = cfg.rope.n_rot();
    for sq in seqs {
        for i in 0..sq.n_rows {
            let p = sq.pos + i;
            let row = sq.row + i;
            let frontier = &mut pool.slot_mut(sq.slot)?[frontier_at..frontier_at + 2 * n_front];
            let (kst, sst) = frontier.split_at_mut(n_front);
            let fr = if r == 4 { 4 + p % 4 } else { p % r };
            kst[fr * width..(fr + 1) * width].copy_from_slice(k.row(row));
            for ((d, &v), &b) in sst[fr * width..(fr + 1) * width]
                .iter_mut()
                .zip(s.row(row))
                .zip(&bias[(p % r) * width..(p % r + 1) * width])
            {
                *d = v + b;
            }
            if !(p + 1).is_multiple_of(r) {
                continue;
            }
            let pooled: Vec<f32> = (0..dim)
                .map(|j| pool_channel(kst, sst, width, &cands, j))
                .collect();
            if r == 4 {
                // The current window becomes the previous one.
                kst.copy_within(4 * width..8 * width, 0);
                sst.copy_within(4 * width..8 * width, 0);
            }
            let carry: Option<Vec<f32>> = (r == 4 && (p + 1).is_multiple_of(bs)).then(|| {
                let mut c = vec![0f32; 2 * 4 * dim];
                for q in 0..4 {
                    c[q * dim..(q + 1) * dim].copy_from_slice(&kst[q * width..q * width + dim]);
                    c[(4 + q) * dim..(5 + q) * dim]
                        .copy_from_slice(&sst[q * width..q * width + dim]);
                }
                c
            });
            // Norm, RoPE at the window's first position, rounding.
            let ss: f64 = pooled.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
            let sc = (1.0 / (ss / dim as f64 + f64::from(cfg.norm_eps)).sqrt()) as f32;
            let mut out: Vec<f32> = pooled.iter().zip(norm).map(|(v, w)| v * sc * w).collect();
            rope_tail_head(&mut out, (p + 1 - r) as u32, &cfg.rope, false);
            if cfg.round {
                match cfg.kind {
                    CompressorKind::Attention => fp8_blocks(&mut out, dim - n_rot),
                    CompressorKind::Indexer => indexer_head(&mut out),
                }
            }
            let c = p / r;
            let block = *sq.blocks.get(c * r / bs).ok_or_else(|| {
                shape_err(
                    "compress",
                    format!("position {p} has no block in the sequence's block table"),
                )
            })?;
            let per = bs / r;
            let at = match cfg.kind {
                CompressorKind::Attention => o.rows + (c % per) * dim,
                CompressorKind::Indexer => o.index_rows + (c % per) * dim,
            };
            pool.block_mut(block)?.write(at, &out);
            if let Some(c) = carry {
                let w = window_of(sq, p, bs, "compress")?;
                pool.window_mut(w)?.carry[carry_at..carry_at + c.len()].copy_from_slice(&c);
            }
        }
    }
    Ok(())
}

/// Indices (ascending) of the `top_k` best visible indexer rows of one
/// query; ties to the lower index.
fn select_rows(
    q: &[f32],
    w: &[f32],
    keys: &[f32],
    dim: usize,
    n_vis: usize,
    top_k: usize,
) -> Vec<usize> {
    if n_vis <= top_k {
        return (0..n_vis).collect();
    }
    let scores: Vec<f64> = (0..n_vis)
        .map(|c| {
            let k = &keys[c * dim..(c + 1) * dim];
            q.chunks_exact(dim)
                .zip(w)
                .map(|(qh, &wh)| {
                    let dot: f64 = qh
                        .iter()
                        .zip(k)
                        .map(|(a, b)| f64::from(*a) * f64::from(*b))
                        .sum();
                    f64::from(wh) * dot.max(0.0)
                })
                .sum()
        })
        .collect();
    let mut order: Vec<usize> = (0..n_vis).collect();
    // Highest first; ties go to the lower row index.
    order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
    order.truncate(top_k);
    order.sort_unstable();
    order
}

#[allow(clippy::too_many_arguments)]
pub fn indexer_select(
    pool: &CpuCompressedPool,
    layer: usize,
    seqs: &[CompressedSeq<'_>],
    q: &CpuTensor,
    w: &CpuTensor,
    top_k: usize,
    out: &mut CpuTensor,
) -> Result<(), BackendError> {
    check_rows("indexer_select", seqs, q)?;
    let dim = pool.cfg.index_dim;
    if pool.cfg.ratios.get(layer) != Some(&4)
        || q.cols != w.cols * dim
        || out.cols != top_k
        || out.rows != q.rows
    {
        return Err(shape_err(
            "indexer_select",
            format!(
                "layer {layer} (ratio {:?}), queries [{}, {}], weights [{}, {}], out [{}, {}], top {top_k}",
                pool.cfg.ratios.get(layer), q.rows, q.cols, w.rows, w.cols, out.rows, out.cols
            ),
        ));
    }
    for s in seqs {
        let last = s.pos + s.n_rows;
        let n_keys = last / 4;
        let mut keys = vec![0f32; n_keys * dim];
        for (c, k) in keys.chunks_mut(dim).enumerate() {
            pool.read_pooled(s, layer, 4, c, true, k)?;
        }
        for i in 0..s.n_rows {
            let p = s.pos + i;
            let sel = select_rows(
                q.row(s.row + i),
                w.row(s.row + i),
                &keys,
                dim,
                (p + 1) / 4,
                top_k,
            );
            let o = &mut out.data[(s.row + i) * top_k..(s.row + i + 1) * top_k];
            o.fill(-1.0);
            for (d, &c) in o.iter_mut().zip(&sel) {
                *d = c as f32;
            }
        }
    }
    Ok(())
}

/// Attention of one query (all heads) over `rows` with per-head sinks.
fn attend(q: &[f32], rows: &[f32], d: usize, sinks: &[f32], scale: f64, out: &mut [f32]) {
    let n = rows.len() / d;
    let mut z = vec![0f64; n];
    for ((qh, oh), &sink) in q.chunks_exact(d).zip(out.chunks_exact_mut(d)).zip(sinks) {
        for (zj, k) in z.iter_mut().zip(rows.chunks_exact(d)) {
            *zj = qh
                .iter()
                .zip(k)
                .map(|(a, b)| f64::from(*a) * f64::from(*b))
                .sum::<f64>()
                * scale;
        }
        let mx = z.iter().cloned().fold(f64::from(sink), f64::max);
        let mut den = (f64::from(sink) - mx).exp();
        let mut acc = vec![0f64; d];
        for (zj, k) in z.iter().zip(rows.chunks_exact(d)) {
            let e = (zj - mx).exp();
            den += e;
            acc.iter_mut()
                .zip(k)
                .for_each(|(a, v)| *a += e * f64::from(*v));
        }
        oh.iter_mut()
            .zip(&acc)
            .for_each(|(o, a)| *o = (a / den) as f32);
    }
}

#[allow(clippy::too_many_arguments)]
pub fn compressed_attention(
    q: &CpuTensor,
    pool: &CpuCompressedPool,
    layer: usize,
    seqs: &[CompressedSeq<'_>],
    selected: Option<&CpuTensor>,
    sinks: &[f32],
    cfg: &CompressedAttentionConfig,
    out: &mut CpuTensor,
) -> Result<(), BackendError> {
    check_rows("compressed_attention", seqs, q)?;
    let d = cfg.head_dim;
    if d != pool.cfg.head_dim
        || q.cols != cfg.n_head * d
        || out.cols != q.cols
        || out.rows != q.rows
        || sinks.len() != cfg.n_head
    {
        return Err(shape_err(
            "compressed_attention",
            format!(
                "{} heads of {d}: q [{}, {}], out [{}, {}], {} sinks, pool rows of {}",
                cfg.n_head,
                q.rows,
                q.cols,
                out.rows,
                out.cols,
                sinks.len(),
                pool.cfg.head_dim
            ),
        ));
    }
    let window = pool.cfg.window;
    let r = cfg.ratio;
    // Every (sequence, row) pair; each computes its own key set.
    let tasks: Vec<(&CompressedSeq<'_>, usize)> = seqs
        .iter()
        .flat_map(|s| (0..s.n_rows).map(move |i| (s, i)))
        .collect();
    let results: Vec<Result<(usize, Vec<f32>), BackendError>> = tasks
        .par_iter()
        .map(|&(s, i)| {
            let p = s.pos + i;
            let row = s.row + i;
            let first = (p + 1).saturating_sub(window);
            let mut keys: Vec<f32> = Vec::with_capacity((p + 1 - first) * d);
            let mut buf = vec![0f32; d];
            for pp in first..=p {
                pool.read_raw(s, layer, pp, &mut buf)?;
                keys.extend_from_slice(&buf);
            }
            if let Some(n_vis) = (p + 1).checked_div(r) {
                let visible: Vec<usize> = match selected {
                    Some(sel) => sel
                        .row(row)
                        .iter()
                        .filter(|&&c| c >= 0.0)
                        .map(|&c| c as usize)
                        .collect(),
                    None => (0..n_vis).collect(),
                };
                for c in visible {
                    pool.read_pooled(s, layer, r, c, false, &mut buf)?;
                    keys.extend_from_slice(&buf);
                }
            }
            let mut o = vec![0f32; cfg.n_head * d];
            attend(q.row(row), &keys, d, sinks, f64::from(cfg.scale), &mut o);
            Ok((row, o))
        })
        .collect();
    for r in results {
        let (row, o) = r?;
        out.data[row * out.cols..(row + 1) * out.cols].copy_from_slice(&o);
    }
    Ok(())
}

pub fn read_block(pool: &CpuCompressedPool, b: u32, out: &mut [u8]) -> Result<(), BackendError> {
    let want = pool.cfg.block_values() * pool.row_bytes();
    if out.len() != want {
        return Err(shape_err(
            "compressed_read_block",
            format!("{} bytes for a block of {want}", out.len()),
        ));
    }
    match pool.blocks.get(b as usize) {
        Some(Some(rows)) => rows.to_bytes(out),
        Some(None) => out.fill(0),
        None => {
            return Err(shape_err(
                "compressed_read_block",
                format!("block {b} is outside the pool"),
            ))
        }
    }
    Ok(())
}

pub fn write_block(pool: &mut CpuCompressedPool, b: u32, data: &[u8]) -> Result<(), BackendError> {
    let want = pool.cfg.block_values() * pool.row_bytes();
    if data.len() != want {
        return Err(shape_err(
            "compressed_write_block",
            format!("{} bytes for a block of {want}", data.len()),
        ));
    }
    pool.block_mut(b)?.fill_from(data);
    Ok(())
}

fn window_bytes(pool: &CpuCompressedPool) -> usize {
    pool.cfg.window_bytes()
}

pub fn window_read(pool: &CpuCompressedPool, w: u32, out: &mut [u8]) -> Result<(), BackendError> {
    if out.len() != window_bytes(pool) {
        return Err(shape_err(
            "window_read",
            format!(
                "{} bytes for a window block of {}",
                out.len(),
                window_bytes(pool)
            ),
        ));
    }
    let raw = pool.cfg.window_raw_values() * pool.row_bytes();
    match pool.window(w)? {
        Some(win) => {
            win.raw.to_bytes(&mut out[..raw]);
            out[raw..]
                .chunks_exact_mut(4)
                .zip(&win.carry)
                .for_each(|(o, v)| o.copy_from_slice(&v.to_le_bytes()));
        }
        None => out.fill(0),
    }
    Ok(())
}

pub fn window_write(pool: &mut CpuCompressedPool, w: u32, data: &[u8]) -> Result<(), BackendError> {
    if data.len() != window_bytes(pool) {
        return Err(shape_err(
            "window_write",
            format!(
                "{} bytes for a window block of {}",
                data.len(),
                window_bytes(pool)
            ),
        ));
    }
    let raw = pool.cfg.window_raw_values() * pool.row_bytes();
    let win = pool.window_mut(w)?;
    win.raw.fill_from(&data[..raw]);
    win.carry
        .iter_mut()
        .zip(data[raw..].chunks_exact(4))
        .for_each(|(v, b)| *v = f32::from_le_bytes([b[0], b[1], b[2], b[3]]));
    Ok(())
}
