//! Launch wrappers of `hyper.cu`: hyper-connection mix/split/collapse and
//! post, the output head's collapse, RMSNorm of heads, tail RoPE, the
//! reference engine's activation roundings (FP8 K/V, Hadamard + FP4
//! indexer, f16), row scaling and the clamped SwiGLU.
//!
//! Numerics follow the CPU reference ([`crate::cpu`]'s `hyper.rs`)
//! operation by operation. The hyper-connection mix is the one place whose
//! float order differs: its dot products (`n_hc·d` long) are summed in
//! another order, with the same activation rounding as the CPU's matmul
//! (f16 with production numerics and an F16 weight). The split (sigmoids,
//! softmax, Sinkhorn) runs in f64 like the CPU, one thread per element of
//! the mixing matrix with the CPU's sums and exact divisions; collapse and
//! post are f64 sums of exact products, the CPU's bits. The FP8 and FP4
//! roundings are bit-exact (see `round_mini` in hyper.cu).

use std::collections::HashMap;
use std::sync::Mutex;

use cudarc::driver::CudaSlice;

use super::{dev_err, CudaBackend, CudaTensor, CudaWeight};
use crate::backend::{BackendError, HcConfig, Numerics, TailRope};
use crate::quant::GgmlType;

/// Most streams (`HC_MAX` in hyper.cu, the CPU reference's limit).
const HC_MAX: usize = 8;
/// hc_mix: mix rows per block (grid.z) and activation rows per block
/// (`MIX_J`, `MIX_ROWS` in hyper.cu).
const MIX_J: usize = 24;
const MIX_ROWS: usize = 16;
/// hc_mix_short: the chunk it takes (the one of up to 16 rows) and the mix
/// rows per warp (`MIX_SHORT`, `MIX_JG` in hyper.cu).
const MIX_SHORT: usize = 256;
const MIX_JG: usize = 6;
/// Shared memory a block may use without opting in.
const SMEM: usize = 48 << 10;

fn blocks(n: usize, per: usize) -> u32 {
    n.div_ceil(per).max(1) as u32
}

fn shape(op: &'static str, detail: String) -> BackendError {
    BackendError::Shape { op, detail }
}

/// Frequencies of each distinct [`TailRope`] in device memory, uploaded
/// once (keyed by their bits) and kept for the backend's life: a model has
/// a handful (its attention's and its compressors' ropes).
#[derive(Default)]
pub(super) struct TailRopes(Mutex<HashMap<Vec<u64>, CudaSlice<f64>>>);

impl TailRopes {
    fn device_ptr(&self, be: &CudaBackend, omega: &[f64]) -> Result<u64, BackendError> {
        let key: Vec<u64> = omega.iter().map(|w| w.to_bits()).collect();
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = map.get(&key) {
            return Ok(be.ptr(s));
        }
        // A copy issued on the backend's stream now, under its lock (so no
        // graph capture is under way): every command recorded from here on
        // is issued after it on the same stream.
        let _st = be.lock();
        be.bind()?;
        let s = be
            .stream
            .clone_htod(omega)
            .map_err(|e| dev_err("uploading tail RoPE frequencies", e))?;
        let p = be.ptr(&s);
        map.insert(key, s);
        Ok(p)
    }
}

/// `x` holds `n_hc` streams of `out`'s width, row for row.
fn check_streams(
    op: &'static str,
    x: &CudaTensor,
    out: &CudaTensor,
    n_hc: usize,
) -> Result<(), BackendError> {
    if n_hc == 0 || n_hc > HC_MAX || x.cols != n_hc * out.cols || x.rows != out.rows {
        return Err(shape(
            op,
            format!(
                "{n_hc} streams (1 to {HC_MAX}): x is [{}, {}], out is [{}, {}]",
                x.rows, x.cols, out.rows, out.cols
            ),
        ));
    }
    Ok(())
}

/// The mix weight is `[nw, cols]` F16 or F32; `scale` and `base` are
/// one-row weights of at least `n_scale` and `nw` values.
fn check_gate(
    op: &'static str,
    mix: &CudaWeight,
    scale: &CudaWeight,
    base: &CudaWeight,
    cols: usize,
    nw: usize,
    n_scale: usize,
) -> Result<(), BackendError> {
    if !matches!(mix.ggml_type, GgmlType::F16 | GgmlType::F32) {
        return Err(shape(
            op,
            format!(
                "mix weight {} is {}; the CUDA kernel reads F16 or F32",
                mix.name, mix.ggml_type
            ),
        ));
    }
    if mix.rows != nw || mix.cols != cols || !cols.is_multiple_of(2) {
        return Err(shape(
            op,
            format!(
                "mix weight {} is [{}, {}], expected [{nw}, {cols}] (an even width)",
                mix.name, mix.rows, mix.cols
            ),
        ));
    }
    for (w, n) in [(scale, n_scale), (base, nw)] {
        if w.rows != 1 || w.cols < n {
            return Err(shape(
                op,
                format!(
                    "{} is [{}, {}], expected one row of at least {n} values",
                    w.name, w.rows, w.cols
                ),
            ));
        }
    }
    Ok(())
}

/// Columns of an hc_mix block: few rows (decode) take short chunks, so
/// that many blocks share the weight's reads; many rows take long ones,
/// so that the lanes' final sums stay a small part of the work.
fn mix_chunk(rows: usize) -> usize {
    match rows {
        0..=16 => MIX_SHORT,
        17..=256 => 512,
        _ => 1024,
    }
}

/// hc_norm then hc_mix: the per-chunk partial sums of `m = mix · (x /
/// rms(x))` in op scratch; returns them and the number of chunks.
fn mix_partials(
    be: &CudaBackend,
    x: &CudaTensor,
    mix: &CudaWeight,
    nw: usize,
    norm_eps: f32,
) -> Result<(u64, usize), BackendError> {
    let (rows, cols) = (x.rows, x.cols);
    let chunk = mix_chunk(rows);
    let n_chunks = cols.div_ceil(chunk);
    let s = be.scratch(&[4 * rows, 4 * n_chunks * rows * nw])?;
    let (rs, part) = (s[0], s[1]);
    let (xp, wp) = (x.ptr, be.weight_ptr(mix));
    let cols_i = cols as i32;
    launch!(be, "hc_norm", (rows as u32, 1, 1), 512; &xp, &rs, &cols_i, &norm_eps)?;
    // The activation rounding of the CPU's matmul: F16 weights see f16
    // activations with production numerics (their vec_dot_type).
    let round16 = i32::from(be.numerics == Numerics::Production && mix.ggml_type == GgmlType::F16);
    let name = if mix.ggml_type == GgmlType::F16 {
        "hc_mix_f16"
    } else {
        "hc_mix_f32"
    };
    let (rows_i, nw_i, chunk_i) = (rows as i32, nw as i32, chunk as i32);
    if chunk == MIX_SHORT {
        // The same sums with every warp busy: the mix rows over the warps.
        let name = if mix.ggml_type == GgmlType::F16 {
            "hc_mix_short_f16"
        } else {
            "hc_mix_short_f32"
        };
        let grid = (n_chunks as u32, blocks(rows, 2), 1);
        let threads = 32 * nw.div_ceil(MIX_JG) as u32;
        launch!(be, name, grid, threads;
            &xp, &rs, &wp, &part, &rows_i, &cols_i, &nw_i, &round16)?;
        return Ok((part, n_chunks));
    }
    let grid = (n_chunks as u32, blocks(rows, MIX_ROWS), blocks(nw, MIX_J));
    launch!(be, name, grid, 256;
        &xp, &rs, &wp, &part, &rows_i, &cols_i, &nw_i, &chunk_i, &round16)?;
    Ok((part, n_chunks))
}

/// hc_split: the split of every row (written to `split` unless `head`)
/// and the collapse into `out`.
#[allow(clippy::too_many_arguments)]
fn split_collapse(
    be: &CudaBackend,
    x: &CudaTensor,
    (part, n_chunks): (u64, usize),
    scale: &CudaWeight,
    base: &CudaWeight,
    split: u64,
    out: &mut CudaTensor,
    cfg: &HcConfig,
    head: bool,
) -> Result<(), BackendError> {
    let (rows, d) = (x.rows, out.cols);
    // Blocks per row: enough to fill the device when rows are few (each
    // block redoes the row's split, in parallel), slices of >= 256 values.
    let per_row = (2 * be.sm_count())
        .div_ceil(rows)
        .clamp(1, 8)
        .min(d.div_ceil(256).max(1));
    let slice = d.div_ceil(per_row);
    // One column normalization, then `iters − 1` (row, column) pairs.
    let steps = (2 * cfg.iters).saturating_sub(1).max(1);
    let (xp, sp, bp, op) = (x.ptr, be.dense_ptr(scale), be.dense_ptr(base), out.ptr);
    let (nc, rows_i, n_i, d_i) = (n_chunks as i32, rows as i32, cfg.n_hc as i32, d as i32);
    let (steps_i, head_i, slice_i) = (steps as i32, i32::from(head), slice as i32);
    launch!(be, "hc_split", (rows as u32, per_row as u32, 1), 256;
        &xp, &part, &nc, &sp, &bp, &split, &op, &rows_i, &n_i, &d_i, &steps_i, &cfg.eps,
        &head_i, &slice_i)
}

/// Three kernels: hc_norm (one block per row: bound by reading the row),
/// hc_mix (split-K dots: bound by the mix weight's reads, from L2 after
/// the first row group, and the rows' from HBM; up to 16 rows take
/// hc_mix_short, the same sums with the mix rows over the warps) and
/// hc_split (bound by the f64 Sinkhorn's latency for few rows, one warp
/// running it while the others collapse; by reading the row for many).
#[allow(clippy::too_many_arguments)]
pub(super) fn hc_pre(
    be: &CudaBackend,
    x: &CudaTensor,
    mix: &CudaWeight,
    scale: &CudaWeight,
    base: &CudaWeight,
    cfg: &HcConfig,
    out: &mut CudaTensor,
    split: &mut CudaTensor,
) -> Result<(), BackendError> {
    check_streams("hc_pre", x, out, cfg.n_hc)?;
    let nw = cfg.mix_width();
    if split.rows != x.rows || split.cols != nw {
        return Err(shape(
            "hc_pre",
            format!(
                "split is [{}, {}], expected [{}, {nw}]",
                split.rows, split.cols, x.rows
            ),
        ));
    }
    check_gate("hc_pre", mix, scale, base, x.cols, nw, 3)?;
    if x.rows == 0 {
        return Ok(());
    }
    be.issue_chunk()?;
    let part = mix_partials(be, x, mix, nw, cfg.norm_eps)?;
    split_collapse(be, x, part, scale, base, split.ptr, out, cfg, false)
}

/// A thread per (row, value of a stream): bound by memory.
pub(super) fn hc_post(
    be: &CudaBackend,
    x: &mut CudaTensor,
    y: &CudaTensor,
    split: &CudaTensor,
    cfg: &HcConfig,
) -> Result<(), BackendError> {
    let (n, d) = (cfg.n_hc, y.cols);
    check_streams("hc_post", x, y, n)?;
    if split.rows != x.rows || split.cols != cfg.mix_width() {
        return Err(shape(
            "hc_post",
            format!(
                "split is [{}, {}], expected [{}, {}]",
                split.rows,
                split.cols,
                x.rows,
                cfg.mix_width()
            ),
        ));
    }
    if x.rows == 0 || d == 0 {
        return Ok(());
    }
    let (xp, yp, sp) = (x.ptr, y.ptr, split.ptr);
    let (n_i, d_i) = (n as i32, d as i32);
    launch!(be, "hc_post", (x.rows as u32, blocks(d, 256), 1), 256; &xp, &yp, &sp, &n_i, &d_i)
}

pub(super) fn hc_head(
    be: &CudaBackend,
    x: &CudaTensor,
    mix: &CudaWeight,
    scale: &CudaWeight,
    base: &CudaWeight,
    cfg: &HcConfig,
    out: &mut CudaTensor,
) -> Result<(), BackendError> {
    check_streams("hc_head", x, out, cfg.n_hc)?;
    check_gate("hc_head", mix, scale, base, x.cols, cfg.n_hc, 1)?;
    if x.rows == 0 {
        return Ok(());
    }
    be.issue_chunk()?;
    let part = mix_partials(be, x, mix, cfg.n_hc, cfg.norm_eps)?;
    split_collapse(be, x, part, scale, base, 0, out, cfg, true)
}

/// A warp per head: bound by memory.
pub(super) fn rms_norm_heads(
    be: &CudaBackend,
    x: &mut CudaTensor,
    head_dim: usize,
    eps: f32,
) -> Result<(), BackendError> {
    if head_dim == 0 || !x.cols.is_multiple_of(head_dim) {
        return Err(shape(
            "rms_norm_heads",
            format!("rows of {} values in heads of {head_dim}", x.cols),
        ));
    }
    let n_heads = x.rows * x.cols / head_dim;
    if n_heads == 0 {
        return Ok(());
    }
    let (xp, nh, hd) = (x.ptr, n_heads as u64, head_dim as i32);
    launch!(be, "rms_norm_heads", (blocks(n_heads, 8), 1, 1), 256; &xp, &nh, &hd, &eps)
}

/// A block per (row, group of heads), the row's angles computed once per
/// block: bound by the rotated values moved.
pub(super) fn rope_tail(
    be: &CudaBackend,
    x: &mut CudaTensor,
    positions: &[u32],
    head_dim: usize,
    rope: &TailRope,
    inverse: bool,
) -> Result<(), BackendError> {
    let n_pairs = rope.omega.len();
    if positions.len() != x.rows
        || head_dim == 0
        || !x.cols.is_multiple_of(head_dim)
        || rope.n_rot() > head_dim
    {
        return Err(shape(
            "rope_tail",
            format!(
                "{} positions for [{}, {}] in heads of {head_dim} rotating {} dims",
                positions.len(),
                x.rows,
                x.cols,
                rope.n_rot()
            ),
        ));
    }
    let heads = x.cols / head_dim;
    if n_pairs == 0 || x.rows == 0 || heads == 0 {
        return Ok(());
    }
    let smem = 16 * n_pairs;
    if smem > SMEM {
        return Err(shape(
            "rope_tail",
            format!("{n_pairs} rotated pairs exceed the kernel's shared memory"),
        ));
    }
    let wp = be.tail_ropes.device_ptr(be, &rope.omega)?;
    let (xp, pp) = (x.ptr, be.upload_cached(positions)?);
    let per_block = (256 / n_pairs).clamp(1, heads);
    let threads = (per_block * n_pairs).next_multiple_of(32).clamp(32, 256) as u32;
    let (cols, hd, np, hpb, inv) = (
        x.cols as i32,
        head_dim as i32,
        n_pairs as i32,
        per_block as i32,
        i32::from(inverse),
    );
    let grid = (x.rows as u32, blocks(heads, per_block), 1);
    launch!(be, "rope_tail", grid, (threads, smem as u32);
        &xp, &pp, &wp, &cols, &hd, &np, &hpb, &inv)
}

/// A warp per block of 64 values: bound by memory.
pub(super) fn round_fp8(
    be: &CudaBackend,
    x: &mut CudaTensor,
    width: usize,
    n_round: usize,
) -> Result<(), BackendError> {
    if width == 0 || n_round > width || !x.cols.is_multiple_of(width) {
        return Err(shape(
            "round_fp8",
            format!(
                "rows of {} values in pieces of {width}, {n_round} rounded",
                x.cols
            ),
        ));
    }
    let nb = n_round.div_ceil(64);
    let n_blocks = x.rows * (x.cols / width) * nb;
    if n_blocks == 0 {
        return Ok(());
    }
    let (xp, n64) = (x.ptr, n_blocks as u64);
    let (w_i, nr_i, nb_i) = (width as i32, n_round as i32, nb as i32);
    launch!(be, "round_fp8", (blocks(n_blocks, 8), 1, 1), 256; &xp, &n64, &w_i, &nr_i, &nb_i)
}

/// A warp per head, in shared memory: bound by memory.
pub(super) fn round_indexer(
    be: &CudaBackend,
    x: &mut CudaTensor,
    dim: usize,
) -> Result<(), BackendError> {
    if !dim.is_power_of_two() || !x.cols.is_multiple_of(dim) || 4 * dim > SMEM {
        return Err(shape(
            "round_indexer",
            format!(
                "rows of {} values in heads of {dim} (a power of two up to {})",
                x.cols,
                SMEM / 4
            ),
        ));
    }
    let n_heads = x.rows * x.cols / dim;
    if n_heads == 0 {
        return Ok(());
    }
    let warps = (SMEM / 4 / dim).clamp(1, 8);
    let smem = (4 * dim * warps) as u32;
    // The CPU's normalization factor, rounded the same way.
    let norm = 1.0 / (dim as f32).sqrt();
    let (xp, nh, dim_i) = (x.ptr, n_heads as u64, dim as i32);
    launch!(be, "round_indexer", (blocks(n_heads, warps), 1, 1), ((32 * warps) as u32, smem);
        &xp, &nh, &dim_i, &norm)
}

pub(super) fn hc_expand(
    be: &CudaBackend,
    x: &CudaTensor,
    n_hc: usize,
    out: &mut CudaTensor,
) -> Result<(), BackendError> {
    if out.rows != x.rows || out.cols != n_hc * x.cols {
        return Err(shape(
            "hc_expand",
            format!(
                "{n_hc} streams of x [{}, {}] into [{}, {}]",
                x.rows, x.cols, out.rows, out.cols
            ),
        ));
    }
    let n = out.rows * out.cols;
    if n == 0 {
        return Ok(());
    }
    let (xp, op, rows, d, nh) = (x.ptr, out.ptr, x.rows as u64, x.cols as i32, n_hc as i32);
    launch!(be, "hc_expand", (blocks(n, 256), 1, 1), 256; &xp, &op, &rows, &d, &nh)
}

pub(super) fn round_f16(be: &CudaBackend, x: &mut CudaTensor) -> Result<(), BackendError> {
    let n = x.rows * x.cols;
    if n == 0 {
        return Ok(());
    }
    let (xp, n64) = (x.ptr, n as u64);
    launch!(be, "round_f16_inplace", (blocks(n, 256), 1, 1), 256; &xp, &n64)
}

pub(super) fn scale(be: &CudaBackend, x: &mut CudaTensor, s: f32) -> Result<(), BackendError> {
    let n = x.rows * x.cols;
    if n == 0 {
        return Ok(());
    }
    let (xp, n64) = (x.ptr, n as u64);
    launch!(be, "scale_inplace", (blocks(n, 256), 1, 1), 256; &xp, &n64, &s)
}

pub(super) fn swiglu_clamped(
    be: &CudaBackend,
    gate: &CudaTensor,
    up: &CudaTensor,
    clamp: f32,
    out: &mut CudaTensor,
) -> Result<(), BackendError> {
    let n = gate.rows * gate.cols;
    if n != up.rows * up.cols || n != out.rows * out.cols {
        return Err(shape(
            "swiglu_clamped",
            format!(
                "gate [{}, {}], up [{}, {}], out [{}, {}]",
                gate.rows, gate.cols, up.rows, up.cols, out.rows, out.cols
            ),
        ));
    }
    if n == 0 {
        return Ok(());
    }
    be.overwrites(out);
    let (gp, upp, op, n64) = (gate.ptr, up.ptr, out.ptr, n as u64);
    launch!(be, "swiglu_clamped", (blocks(n, 256), 1, 1), 256; &gp, &upp, &op, &n64, &clamp)
}
