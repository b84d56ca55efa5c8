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

/// Blocks per row of hc_post over rows of `d` values (its grid.y): the
/// block sums of squares it leaves when fused with the next hc_pre.
fn post_blocks(d: usize) -> usize {
    blocks(d, POST_THREADS) as usize
}

/// Threads of an hc_post block (a value of each stream per thread).
const POST_THREADS: usize = 256;

/// Op scratch of [`mix_partials`]: 1/rms, the chunk partials, hc_post's
/// block sums of squares.
fn mix_scratch(
    be: &CudaBackend,
    x: &CudaTensor,
    nw: usize,
    d: usize,
) -> Result<Vec<u64>, BackendError> {
    let rows = x.rows;
    let n_chunks = x.cols.div_ceil(mix_chunk(rows));
    be.scratch(&[
        4 * rows,
        4 * n_chunks * rows * nw,
        8 * rows * post_blocks(d),
    ])
}

/// When the last command recorded is the hc_post that wrote `x` (rows of
/// `d` values per stream) and it is not fused yet, records it again
/// leaving its block sums of squares at `ssp`, and returns how many a row
/// (hc_mix_short then takes the 1/rms from them: no hc_norm launch).
fn fuse_post_norm(be: &CudaBackend, x: &CudaTensor, d: usize, ssp: u64) -> Option<usize> {
    use super::queue::Cmd;
    let post = be.func("hc_post").cu_function() as usize;
    let mut st = be.lock();
    let (back, parts) = match st.last_launch(|_| false) {
        // hc_post(x, y, y2, split, n, d, ssp)
        Some((
            back,
            Cmd::Launch {
                func, grid, args, ..
            },
        )) if *func == post
            && args[0] == x.ptr
            && grid.0 as usize == x.rows
            && args[5] == d as u64
            && args[6] == 0 =>
        {
            (back, grid.1 as usize)
        }
        _ => return None,
    };
    st.edit(back, |mut c| {
        if let Cmd::Launch { ref mut args, .. } = c {
            args[6] = ssp;
        }
        Some(c)
    });
    st.fused_hc_norms += 1;
    Some(parts)
}

/// hc_norm (unless `ssp` holds hc_post's block sums of squares and how
/// many a row) then hc_mix: the per-chunk partial sums of `m = mix · (x /
/// rms(x))` in op scratch `s` ([`mix_scratch`]); returns them and the
/// number of chunks.
fn mix_partials(
    be: &CudaBackend,
    x: &CudaTensor,
    mix: &CudaWeight,
    nw: usize,
    norm_eps: f32,
    s: &[u64],
    ssp: Option<(u64, usize)>,
) -> Result<(u64, usize), BackendError> {
    let (rows, cols) = (x.rows, x.cols);
    let chunk = mix_chunk(rows);
    let n_chunks = cols.div_ceil(chunk);
    let (rs, part) = (s[0], s[1]);
    let (xp, wp) = (x.ptr, be.weight_ptr(mix));
    let cols_i = cols as i32;
    let (ssp, n_part) = match ssp {
        Some((p, n)) if chunk == MIX_SHORT => (p, n as i32),
        _ => {
            launch!(be, "hc_norm", (rows as u32, 1, 1), 512; &xp, &rs, &cols_i, &norm_eps)?;
            (0, 0)
        }
    };
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
            &xp, &rs, &ssp, &n_part, &norm_eps, &wp, &part, &rows_i, &cols_i, &nw_i, &round16)?;
        return Ok((part, n_chunks));
    }
    let grid = (n_chunks as u32, blocks(rows, MIX_ROWS), blocks(nw, MIX_J));
    launch!(be, name, grid, 256;
        &xp, &rs, &wp, &part, &rows_i, &cols_i, &nw_i, &chunk_i, &round16)?;
    Ok((part, n_chunks))
}

/// What hc_split computes besides the collapse (its `head` argument).
#[derive(Clone, Copy, PartialEq, Eq)]
enum SplitMode {
    /// hc_pre: the split, written to `split`.
    Pre = 0,
    /// hc_head: the pre weights only.
    Head = 1,
    /// hc_pre with the split left to hc_sinkhorn: the row's mix is
    /// written to `split`.
    PreMix = 2,
}

/// hc_split: the split of every row (see [`SplitMode`]) and the collapse
/// into `out`.
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
    mode: SplitMode,
) -> Result<(), BackendError> {
    let (rows, d) = (x.rows, out.cols);
    // Blocks per row: enough to fill the device when rows are few (each
    // block redoes the row's split, in parallel), slices of >= 256 values.
    let per_row = (2 * be.sm_count())
        .div_ceil(rows)
        .clamp(1, 8)
        .min(d.div_ceil(256).max(1));
    let slice = d.div_ceil(per_row);
    let steps = sinkhorn_steps(cfg);
    let (xp, sp, bp, op) = (x.ptr, be.dense_ptr(scale), be.dense_ptr(base), out.ptr);
    let (nc, rows_i, n_i, d_i) = (n_chunks as i32, rows as i32, cfg.n_hc as i32, d as i32);
    let (steps_i, head_i, slice_i) = (steps as i32, mode as i32, slice as i32);
    launch!(be, "hc_split", (rows as u32, per_row as u32, 1), 256;
        &xp, &part, &nc, &sp, &bp, &split, &op, &rows_i, &n_i, &d_i, &steps_i, &cfg.eps,
        &head_i, &slice_i)
}

/// Sinkhorn normalizations: one column normalization, then `iters − 1`
/// (row, column) pairs.
fn sinkhorn_steps(cfg: &HcConfig) -> usize {
    (2 * cfg.iters).saturating_sub(1).max(1)
}

/// hc_sinkhorn on the side stream, after the hc_split (PreMix) that left
/// each row's mix in `split`: a fork the next hc_post joins.
fn sinkhorn_beside(
    be: &CudaBackend,
    split: &CudaTensor,
    scale: &CudaWeight,
    base: &CudaWeight,
    cfg: &HcConfig,
) -> Result<(), BackendError> {
    use super::queue::Cmd;
    let (sp, bp, xp) = (be.dense_ptr(scale), be.dense_ptr(base), split.ptr);
    let (n_i, steps_i) = (cfg.n_hc as i32, sinkhorn_steps(cfg) as i32);
    be.lock().push(Cmd::Fork);
    launch!(be, "hc_sinkhorn", (split.rows as u32, 1, 1), 32;
        &sp, &bp, &xp, &n_i, &steps_i, &cfg.eps)?;
    let mut st = be.lock();
    st.push(Cmd::Back);
    st.fork_open = true;
    Ok(())
}

/// Records the join of the side stream where a fork is open (before an
/// op that reads what the side computed).
fn join_side(be: &CudaBackend) {
    be.lock().join();
}

/// Three kernels: hc_norm (one block per row: bound by reading the row;
/// left out for up to 16 rows right after an hc_post, which leaves its
/// sums of squares), hc_mix (split-K dots: bound by the mix weight's
/// reads, from L2 after the first row group, and the rows' from HBM; up
/// to 16 rows take hc_mix_short, the same sums with the mix rows over the
/// warps) and hc_split (the collapse, bound by reading the row; the f64
/// Sinkhorn split, latency-bound, runs on the side stream in hc_sinkhorn
/// with `--cuda-hc-branch`, else on one warp of hc_split beside the
/// collapse).
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
    // Fused with the hc_post before while it is still pending.
    let s = mix_scratch(be, x, nw, out.cols)?;
    let ssp = if be.hc_fuse() && mix_chunk(x.rows) == MIX_SHORT {
        fuse_post_norm(be, x, out.cols, s[2]).map(|n| (s[2], n))
    } else {
        None
    };
    be.issue_chunk()?;
    // The split of the pre before still pending on the side stream.
    join_side(be);
    let part = mix_partials(be, x, mix, nw, cfg.norm_eps, &s, ssp)?;
    // With the branch: the collapse first (all the sublayer waits for),
    // the split beside the sublayer (only its post reads it).
    let branch = be.hc_branch() && cfg.n_hc * cfg.n_hc <= 32;
    let mode = if branch {
        SplitMode::PreMix
    } else {
        SplitMode::Pre
    };
    split_collapse(be, x, part, scale, base, split.ptr, out, cfg, mode)?;
    if branch {
        sinkhorn_beside(be, split, scale, base, cfg)?;
    }
    Ok(())
}

/// A thread per (row, value of a stream): bound by memory. A residual
/// add `y += z` recorded just before is done inside (the command taken
/// back, y still written), and the next hc_pre may patch in the sums of
/// squares it needs ([`fuse_post_norm`]).
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
    let y2 = if be.hc_fuse() {
        take_residual_add(be, y)
    } else {
        0
    };
    // The split may still be computing on the side stream.
    join_side(be);
    let (n_i, d_i, none) = (n as i32, d as i32, 0u64);
    let grid = (x.rows as u32, post_blocks(d) as u32, 1);
    launch!(be, "hc_post", grid, POST_THREADS as u32; &xp, &yp, &y2, &sp, &n_i, &d_i, &none)
}

/// When the last command recorded is `y += z` over all of `y`, takes it
/// back and returns z's address (hc_post adds it), else 0.
fn take_residual_add(be: &CudaBackend, y: &CudaTensor) -> u64 {
    use super::queue::Cmd;
    let add = be.func("add_assign").cu_function() as usize;
    let mut st = be.lock();
    let (back, z) = match st.last_launch(|_| false) {
        // add_assign(x, y, n)
        Some((back, Cmd::Launch { func, args, .. }))
            if *func == add && args[0] == y.ptr && args[2] == (y.rows * y.cols) as u64 =>
        {
            (back, args[1])
        }
        _ => return 0,
    };
    st.edit(back, |_| None);
    st.fused_hc_adds += 1;
    z
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
    let s = mix_scratch(be, x, cfg.n_hc, out.cols)?;
    let part = mix_partials(be, x, mix, cfg.n_hc, cfg.norm_eps, &s, None)?;
    split_collapse(be, x, part, scale, base, 0, out, cfg, SplitMode::Head)
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
