//! Quantized matrix multiplication on the CPU, following ggml's CPU path:
//! each activation row is quantized once to the weight type's
//! `vec_dot_type`, then every output is one block-wise dot product of a
//! weight row with an activation row. Work is split over weight rows so
//! each weight byte is read once per call, whatever the number of tokens.

use rayon::prelude::*;

use super::{CpuTensor, CpuWeight};
use crate::backend::BackendError;
use crate::quant;

/// Weight rows per parallel task.
const ROWS_PER_TASK: usize = 32;

pub fn matmul(w: &CpuWeight, x: &CpuTensor, out: &mut CpuTensor) -> Result<(), BackendError> {
    if x.cols != w.cols || out.rows != x.rows || out.cols != w.rows {
        return Err(BackendError::Shape {
            op: "matmul",
            detail: format!(
                "{} is [{}, {}], x is [{}, {}], out is [{}, {}]",
                w.name, w.rows, w.cols, x.rows, x.cols, out.rows, out.cols
            ),
        });
    }
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
    // Column-major result [w.rows, n]: each task owns a block of weight rows.
    let mut t = vec![0.0f32; w.rows * n];
    t.par_chunks_mut(ROWS_PER_TASK * n)
        .enumerate()
        .for_each(|(task, dst)| {
            let base = task * ROWS_PER_TASK;
            for (i, col) in dst.chunks_mut(n).enumerate() {
                let wrow = w.row(base + i);
                for (r, o) in col.iter_mut().enumerate() {
                    *o = quant::vec_dot(ty, k, wrow, &act[r * act_row..(r + 1) * act_row]);
                }
            }
        });
    for (i, col) in t.chunks(n).enumerate() {
        for (r, &v) in col.iter().enumerate() {
            out.data[r * w.rows + i] = v;
        }
    }
    Ok(())
}
