//! CPU reference of the row-wise ops of hyper-connection models
//! (DeepSeek V4, spec §3.0-§3.3, §3.8): the hyper-connection mix, split
//! (with Sinkhorn), collapse and post; the output head's collapse; RMSNorm
//! of heads; RoPE on the tail of heads; the reference engine's activation
//! roundings (FP8 E4M3 of K/V rows, Hadamard + FP4 E2M1 of indexer rows);
//! the clamped SwiGLU. Reductions and transcendental functions run in f64,
//! as the specification's float64 reference does.

use half::f16;
use rayon::prelude::*;

use super::{CpuTensor, CpuWeight};
use crate::backend::{BackendError, HcConfig, TailRope};

/// Most streams supported (arrays on the stack).
const MAX_HC: usize = 8;

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// `x / sqrt(mean(x²) + eps)` (sum of squares in f64, scale in f32).
fn norm_into(x: &[f32], eps: f32, out: &mut [f32]) {
    let ss: f64 = x.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
    let scale = (1.0 / (ss / x.len() as f64 + f64::from(eps)).sqrt()) as f32;
    for (o, &v) in out.iter_mut().zip(x) {
        *o = v * scale;
    }
}

/// `m = mix · rms_norm(x)` for every row (the matmul through `matmul`).
fn mix_of(
    x: &CpuTensor,
    mix: &CpuWeight,
    cfg: &HcConfig,
    matmul: &dyn Fn(&CpuWeight, &CpuTensor, &mut CpuTensor) -> Result<(), BackendError>,
) -> Result<CpuTensor, BackendError> {
    let mut flat = CpuTensor {
        rows: x.rows,
        cols: x.cols,
        data: vec![0.0; x.data.len()],
    };
    for (src, dst) in x.data.chunks(x.cols).zip(flat.data.chunks_mut(x.cols)) {
        norm_into(src, cfg.norm_eps, dst);
    }
    let mut m = CpuTensor {
        rows: x.rows,
        cols: mix.rows,
        data: vec![0.0; x.rows * mix.rows],
    };
    matmul(mix, &flat, &mut m)?;
    Ok(m)
}

/// One row's split: `pre`, `post` and the Sinkhorn-normalized `C`.
fn split_row(m: &[f32], scale: &[f32], base: &[f32], cfg: &HcConfig, out: &mut [f32]) {
    let n = cfg.n_hc;
    let eps = f64::from(cfg.eps);
    for a in 0..n {
        out[a] = (sigmoid(f64::from(m[a]) * f64::from(scale[0]) + f64::from(base[a])) + eps) as f32;
        out[n + a] = (2.0
            * sigmoid(f64::from(m[n + a]) * f64::from(scale[1]) + f64::from(base[n + a])))
            as f32;
    }
    let mut c = [[0f64; MAX_HC]; MAX_HC];
    for (a, row) in c.iter_mut().enumerate().take(n) {
        for (b, v) in row.iter_mut().enumerate().take(n) {
            let i = 2 * n + a * n + b;
            *v = f64::from(m[i]) * f64::from(scale[2]) + f64::from(base[i]);
        }
        let mx = row[..n].iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        row[..n].iter_mut().for_each(|v| *v = (*v - mx).exp());
        let s: f64 = row[..n].iter().sum();
        row[..n].iter_mut().for_each(|v| *v = *v / s + eps);
    }
    let col_norm = |c: &mut [[f64; MAX_HC]; MAX_HC]| {
        let sums: [f64; MAX_HC] = std::array::from_fn(|b| {
            if b < n {
                c[..n].iter().map(|row| row[b]).sum::<f64>() + eps
            } else {
                1.0
            }
        });
        for row in c[..n].iter_mut() {
            row[..n].iter_mut().zip(&sums).for_each(|(v, s)| *v /= s);
        }
    };
    col_norm(&mut c);
    for _ in 1..cfg.iters {
        for row in c[..n].iter_mut() {
            let s: f64 = row[..n].iter().sum::<f64>() + eps;
            row[..n].iter_mut().for_each(|v| *v /= s);
        }
        col_norm(&mut c);
    }
    for a in 0..n {
        for b in 0..n {
            out[2 * n + a * n + b] = c[a][b] as f32;
        }
    }
}

/// `out = Σ_a w_a · X_a` for one row (`x` is `n_hc × d`).
fn collapse(x: &[f32], w: &[f32], out: &mut [f32]) {
    let d = out.len();
    for (i, o) in out.iter_mut().enumerate() {
        *o = w
            .iter()
            .enumerate()
            .map(|(a, &wa)| f64::from(wa) * f64::from(x[a * d + i]))
            .sum::<f64>() as f32;
    }
}

fn check_streams(
    op: &'static str,
    x: &CpuTensor,
    out: &CpuTensor,
    n_hc: usize,
) -> Result<(), BackendError> {
    if n_hc > MAX_HC || x.cols != n_hc * out.cols || x.rows != out.rows {
        return Err(BackendError::Shape {
            op,
            detail: format!(
                "{n_hc} streams: x is [{}, {}], out is [{}, {}]",
                x.rows, x.cols, out.rows, out.cols
            ),
        });
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
pub fn hc_pre(
    x: &CpuTensor,
    mix: &CpuWeight,
    scale: &[f32],
    base: &[f32],
    cfg: &HcConfig,
    out: &mut CpuTensor,
    split: &mut CpuTensor,
    matmul: &dyn Fn(&CpuWeight, &CpuTensor, &mut CpuTensor) -> Result<(), BackendError>,
) -> Result<(), BackendError> {
    check_streams("hc_pre", x, out, cfg.n_hc)?;
    let w = cfg.mix_width();
    if split.rows != x.rows || split.cols != w || mix.rows != w {
        return Err(BackendError::Shape {
            op: "hc_pre",
            detail: format!(
                "mix has {} rows and split is [{}, {}], expected {w}",
                mix.rows, split.rows, split.cols
            ),
        });
    }
    let m = mix_of(x, mix, cfg, matmul)?;
    let d = out.cols;
    for r in 0..x.rows {
        let s = &mut split.data[r * w..(r + 1) * w];
        split_row(m.row(r), scale, base, cfg, s);
        collapse(x.row(r), &s[..cfg.n_hc], &mut out.data[r * d..(r + 1) * d]);
    }
    Ok(())
}

pub fn hc_expand(x: &CpuTensor, n_hc: usize, out: &mut CpuTensor) {
    assert!(
        out.rows == x.rows && out.cols == n_hc * x.cols,
        "hc_expand: shapes"
    );
    for (src, dst) in x.data.chunks(x.cols).zip(out.data.chunks_mut(out.cols)) {
        for stream in dst.chunks_mut(x.cols) {
            stream.copy_from_slice(src);
        }
    }
}

pub fn hc_post(x: &mut CpuTensor, y: &CpuTensor, split: &CpuTensor, cfg: &HcConfig) {
    let n = cfg.n_hc;
    let d = y.cols;
    assert_eq!(x.cols, n * d, "hc_post: streams");
    x.data
        .par_chunks_mut(n * d)
        .enumerate()
        .for_each(|(r, xr)| {
            let s = split.row(r);
            let (post, comb) = (&s[n..2 * n], &s[2 * n..]);
            let yr = y.row(r);
            for i in 0..d {
                let old: [f64; MAX_HC] =
                    std::array::from_fn(|a| if a < n { f64::from(xr[a * d + i]) } else { 0.0 });
                for b in 0..n {
                    let mixed: f64 = (0..n).map(|a| f64::from(comb[a * n + b]) * old[a]).sum();
                    xr[b * d + i] = (f64::from(post[b]) * f64::from(yr[i]) + mixed) as f32;
                }
            }
        });
}

pub fn hc_head(
    x: &CpuTensor,
    mix: &CpuWeight,
    scale: &[f32],
    base: &[f32],
    cfg: &HcConfig,
    out: &mut CpuTensor,
    matmul: &dyn Fn(&CpuWeight, &CpuTensor, &mut CpuTensor) -> Result<(), BackendError>,
) -> Result<(), BackendError> {
    check_streams("hc_head", x, out, cfg.n_hc)?;
    let m = mix_of(x, mix, cfg, matmul)?;
    let d = out.cols;
    for r in 0..x.rows {
        let mr = m.row(r);
        let w: Vec<f32> = (0..cfg.n_hc)
            .map(|a| {
                (sigmoid(f64::from(mr[a]) * f64::from(scale[0]) + f64::from(base[a]))
                    + f64::from(cfg.eps)) as f32
            })
            .collect();
        collapse(x.row(r), &w, &mut out.data[r * d..(r + 1) * d]);
    }
    Ok(())
}

pub fn rms_norm_heads(x: &mut CpuTensor, head_dim: usize, eps: f32) {
    let mut buf = vec![0f32; head_dim];
    for h in x.data.chunks_exact_mut(head_dim) {
        norm_into(h, eps, &mut buf);
        h.copy_from_slice(&buf);
    }
}

/// Rotate the tail of one head to `pos` (or back).
pub fn rope_tail_head(head: &mut [f32], pos: u32, rope: &TailRope, inverse: bool) {
    let start = head.len() - rope.n_rot();
    let sign = if inverse { -1.0 } else { 1.0 };
    for (pair, &w) in head[start..].chunks_exact_mut(2).zip(rope.omega.iter()) {
        let phi = sign * f64::from(pos) * w;
        let (s, c) = phi.sin_cos();
        let (a, b) = (f64::from(pair[0]), f64::from(pair[1]));
        pair[0] = (a * c - b * s) as f32;
        pair[1] = (a * s + b * c) as f32;
    }
}

pub fn rope_tail(
    x: &mut CpuTensor,
    positions: &[u32],
    head_dim: usize,
    rope: &TailRope,
    inverse: bool,
) {
    assert_eq!(positions.len(), x.rows, "rope_tail: one position per row");
    assert!(
        rope.n_rot() <= head_dim,
        "rope_tail: more rotated dims than the head has"
    );
    let cols = x.cols;
    x.data
        .par_chunks_mut(cols)
        .zip(positions)
        .for_each(|(row, &p)| {
            for h in row.chunks_exact_mut(head_dim) {
                rope_tail_head(h, p, rope, inverse);
            }
        });
}

/// Nearest value of a sorted non-negative grid; ties go to the even index
/// (the even code, since the grids are listed in code order).
fn round_grid(a: f32, grid: &[f32]) -> f32 {
    let i = grid.partition_point(|&g| g < a).clamp(1, grid.len() - 1);
    let (lo, hi) = (grid[i - 1], grid[i]);
    let (dl, dh) = (a - lo, hi - a);
    if dl > dh || (dl == dh && i % 2 == 0) {
        hi
    } else {
        lo
    }
}

/// E4M3FN magnitudes in code order: 0, subnormals m·2⁻⁹, normals up to 448.
fn e4m3_grid() -> &'static [f32] {
    static GRID: std::sync::OnceLock<Vec<f32>> = std::sync::OnceLock::new();
    GRID.get_or_init(|| {
        let mut g = vec![0.0f32];
        g.extend((1..8).map(|m| m as f32 * (2f32).powi(-9)));
        for e in 1..16 {
            for m in 0..8 {
                let v = (1.0 + m as f32 / 8.0) * (2f32).powi(e - 7);
                if v <= 448.0 {
                    g.push(v);
                }
            }
        }
        g
    })
}

const E2M1: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];

/// Power-of-two block scale `2^ceil(log2(amax / top))`.
fn block_scale(amax: f32, top: f32) -> f32 {
    (2f64).powf((f64::from(amax) / f64::from(top)).log2().ceil()) as f32
}

fn sim_block(v: &mut [f32], top: f32, min_amax: f32, grid: &[f32]) {
    let amax = v.iter().fold(0f32, |m, x| m.max(x.abs())).max(min_amax);
    let s = block_scale(amax, top);
    for x in v.iter_mut() {
        let q = (*x / s).clamp(-top, top);
        *x = round_grid(q.abs(), grid).copysign(q) * s;
    }
}

/// FP8 E4M3 rounding of each 64-value block of `v[..n_round]`.
pub fn fp8_blocks(v: &mut [f32], n_round: usize) {
    for b in v[..n_round].chunks_mut(64) {
        sim_block(b, 448.0, 1e-4, e4m3_grid());
    }
}

/// FP4 E2M1 rounding of each 32-value block.
pub fn fp4_blocks(v: &mut [f32]) {
    for b in v.chunks_mut(32) {
        sim_block(b, 6.0, 6.0 * (2f32).powi(-126), &E2M1);
    }
}

/// Normalized Walsh–Hadamard transform (Sylvester order) of a
/// power-of-two-length vector.
pub fn hadamard(v: &mut [f32]) {
    let n = v.len();
    debug_assert!(n.is_power_of_two());
    let mut s = 1;
    while s < n {
        for i in (0..n).step_by(2 * s) {
            for j in i..i + s {
                let (a, b) = (v[j], v[j + s]);
                v[j] = a + b;
                v[j + s] = a - b;
            }
        }
        s *= 2;
    }
    let norm = 1.0 / (n as f32).sqrt();
    v.iter_mut().for_each(|x| *x *= norm);
}

/// The indexer's rounding of one head: Hadamard, then FP4.
pub fn indexer_head(v: &mut [f32]) {
    hadamard(v);
    fp4_blocks(v);
}

pub fn round_fp8(x: &mut CpuTensor, width: usize, n_round: usize) {
    assert!(
        n_round <= width && x.cols.is_multiple_of(width),
        "round_fp8: shapes"
    );
    x.data
        .par_chunks_mut(width)
        .for_each(|piece| fp8_blocks(piece, n_round));
}

pub fn round_indexer(x: &mut CpuTensor, dim: usize) {
    assert!(
        dim.is_power_of_two() && x.cols.is_multiple_of(dim),
        "round_indexer: shapes"
    );
    x.data.par_chunks_mut(dim).for_each(indexer_head);
}

pub fn round_f16(x: &mut CpuTensor) {
    x.data
        .iter_mut()
        .for_each(|v| *v = f16::from_f32(*v).to_f32());
}

/// `silu(min(g, c)) · clamp(u, −c, c) · w`, in f64.
pub fn clamped_swiglu_value(g: f32, u: f32, clamp: f32, w: f32) -> f32 {
    let gc = f64::from(g.min(clamp));
    let uc = f64::from(u.clamp(-clamp, clamp));
    (gc / (1.0 + (-gc).exp()) * uc * f64::from(w)) as f32
}

pub fn swiglu_clamped(gate: &CpuTensor, up: &CpuTensor, clamp: f32, out: &mut CpuTensor) {
    assert_eq!(gate.data.len(), up.data.len(), "swiglu_clamped: shapes");
    assert_eq!(gate.data.len(), out.data.len(), "swiglu_clamped: shapes");
    out.data
        .iter_mut()
        .zip(gate.data.iter().zip(&up.data))
        .for_each(|(o, (&g, &u))| *o = clamped_swiglu_value(g, u, clamp, 1.0));
}

pub fn scale(x: &mut CpuTensor, s: f32) {
    x.data.iter_mut().for_each(|v| *v *= s);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e4m3_grid_has_every_finite_code() {
        let g = e4m3_grid();
        assert_eq!(g.len(), 127);
        assert_eq!(*g.last().unwrap(), 448.0);
        assert_eq!(g[1], 2f32.powi(-9));
    }

    #[test]
    fn fp8_rounds_to_nearest_even_code() {
        // One block whose amax is 448: scale 1, values land on the grid.
        let mut v = vec![0f32; 64];
        v[0] = 448.0;
        v[1] = 1.0625; // halfway between 1.0 (code 56) and 1.125 (code 57): even wins
        v[2] = 1.1;
        v[3] = -3.3;
        fp8_blocks(&mut v, 64);
        assert_eq!(v[0], 448.0);
        assert_eq!(v[1], 1.0);
        assert_eq!(v[2], 1.125);
        assert_eq!(v[3], -3.25);
    }

    #[test]
    fn fp4_block_scale_and_ties() {
        let mut v = vec![0f32; 32];
        v[0] = 12.0; // amax 12 -> scale 2 -> 6
        v[1] = 5.0; // 2.5 between 2 (idx 4) and 3 (idx 5): even -> 2 -> 4
        v[2] = -1.3; // -0.65 -> -0.5 -> -1
        fp4_blocks(&mut v);
        assert_eq!(&v[..3], &[12.0, 4.0, -1.0]);
    }

    #[test]
    fn hadamard_is_orthonormal() {
        let mut v: Vec<f32> = (0..128).map(|i| (i as f32 * 0.37).sin()).collect();
        let orig = v.clone();
        hadamard(&mut v);
        hadamard(&mut v);
        for (a, b) in v.iter().zip(&orig) {
            assert!((a - b).abs() < 1e-5);
        }
    }

    #[test]
    fn sinkhorn_columns_sum_to_one() {
        let cfg = HcConfig {
            n_hc: 4,
            iters: 20,
            eps: 1e-6,
            norm_eps: 1e-6,
        };
        let m: Vec<f32> = (0..24).map(|i| (i as f32 * 0.7).sin()).collect();
        let mut s = [0f32; 24];
        split_row(&m, &[0.8, 0.9, 1.0], &[0.1; 24], &cfg, &mut s);
        for b in 0..4 {
            let col: f32 = (0..4).map(|a| s[8 + a * 4 + b]).sum();
            assert!((col - 1.0).abs() < 1e-4, "{col}");
        }
        assert!(s[4..8].iter().all(|&p| p > 0.0 && p < 2.0));
    }

    #[test]
    fn inverse_tail_rope_undoes_the_rotation() {
        let rope = TailRope {
            omega: vec![1.0, 0.1].into(),
        };
        let mut x = CpuTensor {
            rows: 1,
            cols: 6,
            data: vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
        };
        rope_tail(&mut x, &[7], 6, &rope, false);
        assert_eq!(&x.data[..2], &[1.0, 2.0], "only the tail rotates");
        assert_ne!(x.data[2], 3.0);
        rope_tail(&mut x, &[7], 6, &rope, true);
        for (a, b) in x.data.iter().zip([1.0, 2.0, 3.0, 4.0, 5.0, 6.0]) {
            assert!((a - b).abs() < 1e-5);
        }
    }

    #[test]
    fn clamp_limits_gate_and_up() {
        let v = clamped_swiglu_value(100.0, -50.0, 10.0, 1.0);
        let silu10 = 10.0 / (1.0 + (-10.0f64).exp());
        assert!((f64::from(v) - silu10 * -10.0).abs() < 1e-4);
    }
}
