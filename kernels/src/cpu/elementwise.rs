//! Element-wise and row-wise CPU ops: embedding gather, RMSNorm, SwiGLU,
//! residual add, bias add.

use half::f16;
use rayon::prelude::*;

use super::{CpuTensor, CpuWeight};
use crate::backend::BackendError;
use crate::quant;

/// Rows at or above this count are processed in parallel.
const PAR_ROWS: usize = 4;

pub fn embed(table: &CpuWeight, ids: &[u32], out: &mut CpuTensor) -> Result<(), BackendError> {
    if out.rows != ids.len() || out.cols != table.cols {
        return Err(BackendError::Shape {
            op: "embed",
            detail: format!(
                "{} ids into [{}, {}], table width {}",
                ids.len(),
                out.rows,
                out.cols,
                table.cols
            ),
        });
    }
    if let Some(&bad) = ids.iter().find(|&&id| id as usize >= table.rows) {
        return Err(BackendError::Shape {
            op: "embed",
            detail: format!(
                "token id {bad} is outside the vocabulary of {} tokens",
                table.rows
            ),
        });
    }
    for (dst, &id) in out.data.chunks_mut(table.cols).zip(ids) {
        quant::dequantize_row(table.ggml_type, table.row(id as usize), dst).map_err(|e| {
            BackendError::BadWeight {
                name: table.name.clone(),
                problem: e.to_string(),
            }
        })?;
    }
    Ok(())
}

pub fn rms_norm(x: &CpuTensor, w: &[f32], eps: f32, out: &mut CpuTensor) {
    assert_eq!((x.rows, x.cols), (out.rows, out.cols), "rms_norm: shapes");
    assert_eq!(w.len(), x.cols, "rms_norm: weight length");
    let f = |(src, dst): (&[f32], &mut [f32])| {
        let sum: f64 = src.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
        let scale = (1.0 / (sum / src.len() as f64 + f64::from(eps)).sqrt()) as f32;
        for ((d, &s), &g) in dst.iter_mut().zip(src).zip(w) {
            *d = s * scale * g;
        }
    };
    if x.rows >= PAR_ROWS {
        x.data
            .par_chunks(x.cols)
            .zip(out.data.par_chunks_mut(x.cols))
            .for_each(f);
    } else {
        x.data
            .chunks(x.cols)
            .zip(out.data.chunks_mut(x.cols))
            .for_each(f);
    }
}

pub fn swiglu(gate: &CpuTensor, up: &CpuTensor, out: &mut CpuTensor) {
    assert_eq!(gate.data.len(), up.data.len(), "swiglu: shapes");
    assert_eq!(gate.data.len(), out.data.len(), "swiglu: shapes");
    let f = |((o, g), u): ((&mut [f32], &[f32]), &[f32])| super::expf::swiglu(o, g, u);
    let cols = out.cols.max(1);
    if out.rows >= PAR_ROWS {
        out.data
            .par_chunks_mut(cols)
            .zip(gate.data.par_chunks(cols))
            .zip(up.data.par_chunks(cols))
            .for_each(f);
    } else {
        f(((&mut out.data, &gate.data), &up.data));
    }
}

pub fn add_assign(x: &mut CpuTensor, y: &CpuTensor) {
    assert_eq!(x.data.len(), y.data.len(), "add_assign: shapes");
    for (a, &b) in x.data.iter_mut().zip(&y.data) {
        *a += b;
    }
}

/// `x[r] += bias` for every row `r`.
pub fn add_bias(x: &mut CpuTensor, bias: &[f32]) {
    assert_eq!(bias.len(), x.cols, "add_bias: bias length");
    for row in x.data.chunks_exact_mut(x.cols.max(1)) {
        for (a, &b) in row.iter_mut().zip(bias) {
            *a += b;
        }
    }
}

/// f32 dot product in eight independent lanes (so it vectorizes), the
/// lanes summed in f64.
pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    let lanes = super::simd::has_avx().then_some(super::simd::dot_lanes as LanesFn<f32>);
    #[cfg(not(target_arch = "x86_64"))]
    let lanes = None;
    dot_by(a, b, |v| v, lanes)
}

/// [`dot_f32`] of `a` with f16 values `b`, each converted exactly: the
/// same lanes and sums, so the same result as converting `b` first.
pub fn dot_f16(a: &[f32], b: &[f16]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    let lanes = super::simd::has_f16c().then_some(super::simd::dot_lanes_f16 as LanesFn<f16>);
    #[cfg(not(target_arch = "x86_64"))]
    let lanes = None;
    dot_by(a, b, f16::to_f32, lanes)
}

/// A vector kernel giving the 8 lanes of a dot over whole chunks of 8.
type LanesFn<T> = fn(&[f32], &[T]) -> [f32; 8];

/// The dot of `a` with `b` converted by `to_f32`: lane `l` sums the
/// products of elements `8i + l` (by `lanes` where given, which computes
/// the same), then [`sum_lanes`] with the products past the last whole
/// chunk of 8.
fn dot_by<T: Copy>(
    a: &[f32],
    b: &[T],
    to_f32: impl Fn(T) -> f32,
    lanes: Option<LanesFn<T>>,
) -> f32 {
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f64 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, &y)| f64::from(x * to_f32(y)))
        .sum();
    let lanes = lanes.map_or_else(
        || {
            let mut l = [0.0f32; 8];
            for (x, y) in ca.zip(cb) {
                for i in 0..8 {
                    l[i] += x[i] * to_f32(y[i]);
                }
            }
            l
        },
        |k| k(a, b),
    );
    sum_lanes(&lanes, tail)
}

/// How [`dot_f32`] ends: its lanes summed in f64, in order, plus the f64
/// sum of the products past the last whole chunk of 8.
pub(super) fn sum_lanes(lanes: &[f32; 8], tail: f64) -> f32 {
    (lanes.iter().map(|&v| f64::from(v)).sum::<f64>() + tail) as f32
}

/// [`axpy`] with f16 values `x`, each converted exactly.
pub fn axpy_f16(dst: &mut [f32], w: f32, x: &[f16]) {
    #[cfg(target_arch = "x86_64")]
    if super::simd::has_f16c() {
        return super::simd::axpy_f16(dst, w, x);
    }
    for (d, v) in dst.iter_mut().zip(x) {
        *d += w * v.to_f32();
    }
}

/// `dst[i] += w * x[i]`, a multiply then an add per element.
pub fn axpy(dst: &mut [f32], w: f32, x: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    if super::simd::has_avx() {
        return super::simd::axpy(dst, w, x);
    }
    for (d, &v) in dst.iter_mut().zip(x) {
        *d += w * v;
    }
}
