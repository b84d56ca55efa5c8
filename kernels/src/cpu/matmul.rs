//! Matrix multiplication on the CPU.
//!
//! Production numerics follow ggml's CPU path: each activation row is
//! quantized once to the weight type's `vec_dot_type`, then every output
//! is one block-wise dot product of a weight row with an activation row.
//! Exact numerics dequantize each weight row to f32 and use unrounded
//! activations. Either way work is split over weight rows, so each weight
//! byte is read once per call, whatever the number of tokens.

use rayon::prelude::*;

use super::elementwise::dot_f32;
use super::{CpuTensor, CpuWeight};
use crate::backend::BackendError;
use crate::quant;

/// Weight rows per parallel task.
const ROWS_PER_TASK: usize = 32;

fn check(w: &CpuWeight, x: &CpuTensor, out: &CpuTensor) -> Result<(), BackendError> {
    if x.cols != w.cols || out.rows != x.rows || out.cols != w.rows {
        return Err(BackendError::Shape {
            op: "matmul",
            detail: format!(
                "{} is [{}, {}], x is [{}, {}], out is [{}, {}]",
                w.name, w.rows, w.cols, x.rows, x.cols, out.rows, out.cols
            ),
        });
    }
    Ok(())
}

pub fn matmul(w: &CpuWeight, x: &CpuTensor, out: &mut CpuTensor) -> Result<(), BackendError> {
    check(w, x, out)?;
    let act_type = w.ggml_type.vec_dot_type();
    let act_row = act_type
        .row_bytes(x.cols)
        .ok_or_else(|| BackendError::Shape {
            op: "matmul",
            detail: format!(
                "row of {} values is not whole {} blocks",
                x.cols,
                act_type.name()
            ),
        })?;
    let mut act = vec![0u8; act_row * x.rows];
    let quantize = |(src, dst): (&[f32], &mut [u8])| {
        quant::quantize_row(act_type, src, dst).expect("activation formats always quantize");
    };
    if x.rows > 1 {
        x.data
            .par_chunks(x.cols)
            .zip(act.par_chunks_mut(act_row))
            .for_each(quantize);
    } else {
        quantize((&x.data, &mut act));
    }

    let (n, k, ty) = (x.rows, x.cols, w.ggml_type);
    if n == 1 {
        out.data
            .par_chunks_mut(ROWS_PER_TASK)
            .enumerate()
            .for_each(|(task, dst)| {
                let base = task * ROWS_PER_TASK;
                for (i, o) in dst.iter_mut().enumerate() {
                    *o = quant::vec_dot(ty, k, w.row(base + i), &act);
                }
            });
        return Ok(());
    }
    let act_of = |r: usize| &act[r * act_row..(r + 1) * act_row];
    by_weight_rows(w, n, out, |wrow, col| {
        // Four tokens at a time share each unpacked weight block.
        let mut r = 0;
        while r + 4 <= n {
            let four = quant::vec_dot_x4(
                ty,
                k,
                wrow,
                [act_of(r), act_of(r + 1), act_of(r + 2), act_of(r + 3)],
            );
            col[r..r + 4].copy_from_slice(&four);
            r += 4;
        }
        for (i, o) in col[r..].iter_mut().enumerate() {
            *o = quant::vec_dot(ty, k, wrow, act_of(r + i));
        }
    });
    Ok(())
}

/// Exact numerics: each weight row dequantized to f32, f32 dot products
/// with unrounded activations.
pub fn matmul_exact(w: &CpuWeight, x: &CpuTensor, out: &mut CpuTensor) -> Result<(), BackendError> {
    check(w, x, out)?;
    // Validate the format once so the parallel loop cannot fail.
    let mut row = vec![0.0f32; w.cols];
    quant::dequantize_row(w.ggml_type, w.row(0), &mut row).map_err(|e| {
        BackendError::BadWeight {
            name: w.name.clone(),
            problem: e.to_string(),
        }
    })?;
    by_weight_rows(w, x.rows, out, |wrow, col| {
        let mut row = vec![0.0f32; w.cols];
        quant::dequantize_row(w.ggml_type, wrow, &mut row).expect("format validated above");
        for (r, o) in col.iter_mut().enumerate() {
            *o = dot_f32(&row, x.row(r));
        }
    });
    Ok(())
}

/// Fill `out[r, i]` from `f(weight row i, column [n])`: tasks own blocks of
/// weight rows and write columns of a `[w.rows, n]` buffer, transposed into
/// `out` at the end.
fn by_weight_rows(
    w: &CpuWeight,
    n: usize,
    out: &mut CpuTensor,
    f: impl Fn(&[u8], &mut [f32]) + Sync,
) {
    let mut t = vec![0.0f32; w.rows * n];
    t.par_chunks_mut(ROWS_PER_TASK * n)
        .enumerate()
        .for_each(|(task, dst)| {
            let base = task * ROWS_PER_TASK;
            for (i, col) in dst.chunks_mut(n).enumerate() {
                f(w.row(base + i), col);
            }
        });
    for (i, col) in t.chunks(n).enumerate() {
        for (r, &v) in col.iter().enumerate() {
            out.data[r * w.rows + i] = v;
        }
    }
}
