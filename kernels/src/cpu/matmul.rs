//! Matrix multiplication on the CPU.
//!
//! Production numerics follow ggml's CPU path: each activation row is
//! quantized once to the weight type's `vec_dot_type`, then every output
//! is one block-wise dot product of a weight row with an activation row.
//! Exact numerics dequantize each weight row to f32 and use unrounded
//! activations. Either way work is split over weight rows, so each weight
//! byte is read once per call, whatever the number of tokens. One token
//! goes four weight rows at a time ([`quant::vec_dot_rows4`]); several go
//! through [`quant::gemm`], a tiled kernel. Both give the same bits as one
//! `vec_dot` per (weight row, token), so a token's output does not depend
//! on the batch it is in.

use rayon::prelude::*;

use super::elementwise::dot_f32;
use super::{CpuTensor, CpuWeight};
use crate::backend::BackendError;
use crate::quant;

/// Weight rows per parallel task (single-token and exact paths).
const ROWS_PER_TASK: usize = 32;

fn check(w: &CpuWeight, x: &CpuTensor, out: &CpuTensor) -> Result<(), BackendError> {
    BackendError::check_matmul(
        &w.name,
        (w.rows, w.cols),
        (x.rows, x.cols),
        (out.rows, out.cols),
    )
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
    // Bit-identical to `quantize_row`, vectorized for Q8_0/Q8_1.
    let quantize = |(src, dst): (&[f32], &mut [u8])| {
        quant::quantize_act_row(act_type, src, dst).expect("activation formats always quantize");
    };
    if x.rows <= 1 {
        quantize((&x.data, &mut act));
    } else if x.data.len() >= PARALLEL_QUANTIZE {
        x.data
            .par_chunks(x.cols)
            .zip(act.par_chunks_mut(act_row))
            .for_each(quantize);
    } else {
        x.data
            .chunks(x.cols)
            .zip(act.chunks_mut(act_row))
            .for_each(quantize);
    }

    let (n, k, ty) = (x.rows, x.cols, w.ggml_type);
    if n == 1 {
        out.data
            .par_chunks_mut(ROWS_PER_TASK)
            .enumerate()
            .for_each(|(task, dst)| {
                let base = task * ROWS_PER_TASK;
                let done = base + dst.len() / 4 * 4;
                let mut fours = dst.chunks_exact_mut(4);
                for (i, o) in (&mut fours).enumerate() {
                    let r = base + 4 * i;
                    let rows = [w.row(r), w.row(r + 1), w.row(r + 2), w.row(r + 3)];
                    o.copy_from_slice(&quant::vec_dot_rows4(ty, k, rows, &act));
                }
                for (i, o) in fours.into_remainder().iter_mut().enumerate() {
                    *o = quant::vec_dot(ty, k, w.row(done + i), &act);
                }
            });
        return Ok(());
    }
    // Tasks own blocks of weight rows (each weight byte is read once per
    // call) and fill a `[n, rows]` panel each with the tiled kernel, which
    // is bit-identical to a `vec_dot` per (weight row, token) pair, so a
    // token's output does not depend on the batch it is in.
    if n == 0 || w.rows == 0 || k == 0 {
        out.data.fill(0.0);
        return Ok(());
    }
    let (m, wrow) = (w.rows, w.row_bytes);
    let rows = rows_per_task(m);
    let bytes = w.bytes.as_slice();
    let mut panels = vec![0.0f32; m * n];
    let prepared = quant::GemmAct::new(ty, k, &act);
    panels
        .par_chunks_mut(rows * n)
        .enumerate()
        .for_each(|(task, panel)| {
            let (base, len) = (task * rows, panel.len() / n);
            let w = &bytes[base * wrow..(base + len) * wrow];
            quant::gemm_with(ty, k, w, &prepared, panel, len);
        });
    // Output row r is the concatenation of every panel's row r.
    let gather = |(r, dst): (usize, &mut [f32])| {
        for (task, dst) in dst.chunks_mut(rows).enumerate() {
            let len = dst.len();
            let panel = &panels[task * rows * n..];
            dst.copy_from_slice(&panel[r * len..(r + 1) * len]);
        }
    };
    if m * n >= PARALLEL_GATHER {
        out.data.par_chunks_mut(m).enumerate().for_each(gather);
    } else {
        out.data.chunks_mut(m).enumerate().for_each(gather);
    }
    Ok(())
}

/// Outputs from which the panels are gathered into `out` in parallel.
const PARALLEL_GATHER: usize = 1 << 16;

/// Activation values from which they are quantized in parallel (below,
/// a rayon dispatch costs more than the vectorized quantization).
const PARALLEL_QUANTIZE: usize = 1 << 15;

/// Weight rows per task of the multi-row path: about four tasks per
/// thread (for balance), at least 16 rows (for the per-task set-up) and
/// at most 256 (so the activations swept stay cache-resident).
fn rows_per_task(m: usize) -> usize {
    let threads = rayon::current_num_threads().max(1);
    m.div_ceil(4 * threads).clamp(16, 256).next_multiple_of(8)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::HostBytes;
    use crate::quant::tests::floats;
    use crate::quant::GgmlType;

    fn weight(ty: GgmlType, rows: usize, cols: usize, seed: u64) -> CpuWeight {
        let row_bytes = ty.row_bytes(cols).expect("whole blocks");
        let mut bytes = vec![0u8; rows * row_bytes];
        let f = floats(seed, rows * cols, 1.0);
        for (src, dst) in f.chunks(cols).zip(bytes.chunks_mut(row_bytes)) {
            quant::quantize_row(ty, src, dst).expect("quantizable");
        }
        CpuWeight {
            name: format!("w.{ty}"),
            ggml_type: ty,
            rows,
            cols,
            row_bytes,
            bytes: HostBytes::from_vec(bytes),
            dense: None,
        }
    }

    /// The production matmul of n tokens gives, bit for bit, one
    /// `vec_dot` per (weight row, token) — what each token gets alone —
    /// for 1..=17 tokens, several widths and row counts (tails of tasks
    /// and tiles included).
    #[test]
    fn matmul_is_bit_identical_to_vec_dot_per_pair() {
        for ty in [
            GgmlType::Q4_1,
            GgmlType::Q8_0,
            GgmlType::Q4_0,
            GgmlType::F16,
        ] {
            let at = ty.vec_dot_type();
            for (t, &k) in [32usize, 96, 576, 1536].iter().enumerate() {
                for n in 1..=17usize {
                    let m = [1, 7, 45, 192, 301][(n + t) % 5];
                    let seed = (n * 977 + k * 13 + ty as usize) as u64;
                    let w = weight(ty, m, k, seed);
                    let x = CpuTensor {
                        rows: n,
                        cols: k,
                        data: floats(seed ^ 0xabc, n * k, 4.0),
                    };
                    let mut out = CpuTensor {
                        rows: n,
                        cols: m,
                        data: vec![f32::NAN; n * m],
                    };
                    matmul(&w, &x, &mut out).expect("shapes match");
                    let mut act = vec![0u8; at.row_bytes(k).unwrap()];
                    for r in 0..n {
                        quant::quantize_row(at, x.row(r), &mut act).unwrap();
                        for i in 0..m {
                            let want = quant::vec_dot(ty, k, w.row(i), &act);
                            let got = out.data[r * m + i];
                            assert_eq!(
                                got.to_bits(),
                                want.to_bits(),
                                "{ty} k={k} m={m} n={n} token {r} row {i}: {got} vs {want}"
                            );
                        }
                    }
                }
            }
        }
    }
}
