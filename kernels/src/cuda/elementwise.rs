//! Wrappers of `kernels/cuda/elementwise.cu`: RMSNorm (alone and fused
//! with the residual add), SwiGLU, residual add, bias add, RoPE, argmax.

use super::{CudaBackend, CudaTensor, CudaWeight};
use crate::backend::{BackendError, RopeConfig, RopeMode};

/// Threads of a norm's one block per row: a few values each (decode has
/// a single row, so one block does all the work).
fn norm_threads(cols: usize) -> u32 {
    (cols.div_ceil(4).next_multiple_of(32)).clamp(64, 1024) as u32
}

fn blocks(n: usize, per: usize) -> u32 {
    n.div_ceil(per).max(1) as u32
}

/// `x += y`, then `out = rms_norm(x) · w`, one block per row (the same
/// sums in the same order as `add_assign` then `rms_norm`).
pub fn add_rms_norm(
    be: &CudaBackend,
    x: &mut CudaTensor,
    y: &CudaTensor,
    w: &CudaWeight,
    eps: f32,
    out: &mut CudaTensor,
) -> Result<(), BackendError> {
    assert_eq!((x.rows, x.cols), (y.rows, y.cols), "add_rms_norm: shapes");
    assert_eq!(
        (x.rows, x.cols),
        (out.rows, out.cols),
        "add_rms_norm: shapes"
    );
    assert_eq!(w.cols, x.cols, "add_rms_norm: weight length");
    let wp = be.dense_ptr(w);
    if x.rows == 0 {
        return Ok(());
    }
    be.issue_chunk()?;
    be.overwrites(out);
    let (xp, yp, op) = (x.ptr, y.ptr, out.ptr);
    let cols = x.cols as i32;
    // No quantization (fmt -1) unless a matmul fuses it in.
    let (fmt, null) = (-1i32, 0u64);
    launch!(be, "add_rms_norm", (x.rows as u32, 1, 1), norm_threads(x.cols);
        &xp, &yp, &wp, &op, &cols, &eps, &fmt, &null, &null, &null, &null)
}

pub fn rms_norm(
    be: &CudaBackend,
    x: &CudaTensor,
    w: &CudaWeight,
    eps: f32,
    out: &mut CudaTensor,
) -> Result<(), BackendError> {
    assert_eq!((x.rows, x.cols), (out.rows, out.cols), "rms_norm: shapes");
    assert_eq!(w.cols, x.cols, "rms_norm: weight length");
    let wp = be.dense_ptr(w);
    if x.rows == 0 {
        return Ok(());
    }
    be.issue_chunk()?;
    be.overwrites(out);
    let (xp, op) = (x.ptr, out.ptr);
    let cols = x.cols as i32;
    let (fmt, null) = (-1i32, 0u64);
    launch!(be, "rms_norm", (x.rows as u32, 1, 1), norm_threads(x.cols);
        &xp, &wp, &op, &cols, &eps, &fmt, &null, &null, &null, &null)
}

pub fn swiglu(
    be: &CudaBackend,
    gate: &CudaTensor,
    up: &CudaTensor,
    out: &mut CudaTensor,
) -> Result<(), BackendError> {
    let n = gate.rows * gate.cols;
    assert_eq!(n, up.rows * up.cols, "swiglu: shapes");
    assert_eq!(n, out.rows * out.cols, "swiglu: shapes");
    if n == 0 {
        return Ok(());
    }
    be.overwrites(out);
    let (gp, upp, op) = (gate.ptr, up.ptr, out.ptr);
    let (n64, cols) = (n as u64, out.cols as u64);
    let (fmt, null) = (-1i32, 0u64);
    // A warp per 256 values (8 per lane), 8 warps per block.
    launch!(be, "swiglu", (blocks(n, 2048), 1, 1), 256;
        &gp, &upp, &op, &n64, &cols, &fmt, &null, &null, &null, &null)
}

pub fn add_assign(
    be: &CudaBackend,
    x: &mut CudaTensor,
    y: &CudaTensor,
) -> Result<(), BackendError> {
    let n = x.rows * x.cols;
    assert_eq!(n, y.rows * y.cols, "add_assign: shapes");
    if n == 0 {
        return Ok(());
    }
    let (xp, yp) = (x.ptr, y.ptr);
    let n64 = n as u64;
    launch!(be, "add_assign", (blocks(n, 256), 1, 1), 256; &xp, &yp, &n64)
}

pub fn add_bias(
    be: &CudaBackend,
    x: &mut CudaTensor,
    bias: &CudaWeight,
) -> Result<(), BackendError> {
    assert_eq!(bias.cols, x.cols, "add_bias: bias length");
    let bp = be.dense_ptr(bias);
    let n = x.rows * x.cols;
    if n == 0 {
        return Ok(());
    }
    let xp = x.ptr;
    let (n64, cols) = (n as u64, x.cols as u64);
    launch!(be, "add_bias", (blocks(n, 256), 1, 1), 256; &xp, &bp, &n64, &cols)
}

pub fn rope(
    be: &CudaBackend,
    x: &mut CudaTensor,
    positions: &[u32],
    head_dim: usize,
    cfg: &RopeConfig,
) -> Result<(), BackendError> {
    rope_rows(be, x, None, positions, head_dim, cfg)
}

/// [`rope`] of `q` and `k` (rows at the same positions) in one launch.
pub fn rope_qk(
    be: &CudaBackend,
    q: &mut CudaTensor,
    k: &mut CudaTensor,
    positions: &[u32],
    head_dim: usize,
    cfg: &RopeConfig,
) -> Result<(), BackendError> {
    rope_rows(be, q, Some(k), positions, head_dim, cfg)
}

fn rope_rows(
    be: &CudaBackend,
    x: &mut CudaTensor,
    y: Option<&mut CudaTensor>,
    positions: &[u32],
    head_dim: usize,
    cfg: &RopeConfig,
) -> Result<(), BackendError> {
    assert_eq!(positions.len(), x.rows, "rope: one position per row");
    assert!(x.cols.is_multiple_of(head_dim), "rope: row is whole heads");
    assert!(
        cfg.n_rot <= head_dim && cfg.n_rot.is_multiple_of(2),
        "rope: n_rot"
    );
    let (yp, y_cols) = match y {
        Some(y) => {
            assert_eq!(y.rows, x.rows, "rope: q and k rows");
            assert!(y.cols.is_multiple_of(head_dim), "rope: row is whole heads");
            (y.ptr, y.cols)
        }
        None => (0u64, 0),
    };
    let n = x.rows * ((x.cols + y_cols) / head_dim) * (cfg.n_rot / 2);
    if n == 0 {
        return Ok(());
    }
    let (xp, pp) = (x.ptr, be.upload_cached(positions)?);
    let (rows, cols, cols_y, hd, n_rot) = (
        x.rows as i32,
        x.cols as i32,
        y_cols as i32,
        head_dim as i32,
        cfg.n_rot as i32,
    );
    let mode: i32 = match cfg.mode {
        RopeMode::Normal => 0,
        RopeMode::Neox => 1,
    };
    launch!(be, "rope", (blocks(n, 256), 1, 1), 256;
        &xp, &yp, &pp, &rows, &cols, &cols_y, &hd, &n_rot, &cfg.freq_base, &cfg.freq_scale, &mode)
}

pub fn argmax_rows(be: &CudaBackend, x: &CudaTensor) -> Result<Vec<u32>, BackendError> {
    if x.rows == 0 {
        return Ok(Vec::new());
    }
    let (xp, op) = (x.ptr, be.scratch(&[4 * x.rows])?[0]);
    let cols = x.cols as i32;
    launch!(be, "argmax_rows", (x.rows as u32, 1, 1), 1024; &xp, &op, &cols)?;
    be.read_back(op, x.rows)
}
