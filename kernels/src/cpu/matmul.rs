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
    matmul_many(&[w], x, &mut [out])
}

/// One matmul per weight over the same activations `x`: the activations
/// are quantized (and packed for the tiled kernel) once, and every
/// weight's row blocks are the tasks of one parallel region. Weights of
/// different types each go on their own.
pub fn matmul_many(
    ws: &[&CpuWeight],
    x: &CpuTensor,
    outs: &mut [&mut CpuTensor],
) -> Result<(), BackendError> {
    assert_eq!(ws.len(), outs.len(), "matmul_many: one output per weight");
    for (w, out) in ws.iter().zip(outs.iter()) {
        check(w, x, out)?;
    }
    let Some(ty) = ws.first().map(|w| w.ggml_type) else {
        return Ok(());
    };
    if ws.iter().any(|w| w.ggml_type != ty) {
        for (w, out) in ws.iter().zip(outs.iter_mut()) {
            matmul_many(&[w], x, &mut [&mut **out])?;
        }
        return Ok(());
    }
    let act_type = ty.vec_dot_type();
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
    let (n, k) = (x.rows, x.cols);
    if n == 0 {
        return Ok(());
    }
    if k == 0 {
        outs.iter_mut().for_each(|o| o.data.fill(0.0));
        return Ok(());
    }
    let mut act = vec![0u8; act_row * n];
    // Bit-identical to `quantize_row`, vectorized for Q8_0/Q8_1.
    let quantize = |(src, dst): (&[f32], &mut [u8])| {
        quant::quantize_act_row(act_type, src, dst).expect("activation formats always quantize");
    };
    if x.data.len() >= PARALLEL_QUANTIZE {
        x.data
            .par_chunks(k)
            .zip(act.par_chunks_mut(act_row))
            .for_each(quantize);
    } else {
        x.data
            .chunks(k)
            .zip(act.chunks_mut(act_row))
            .for_each(quantize);
    }

    if n == 1 {
        // Tasks of ROWS_PER_TASK weight rows, four rows per call.
        let tasks: Vec<(&CpuWeight, usize, &mut [f32])> = ws
            .iter()
            .zip(outs.iter_mut())
            .flat_map(|(w, out)| {
                out.data
                    .chunks_mut(ROWS_PER_TASK)
                    .enumerate()
                    .map(move |(t, dst)| (*w, t * ROWS_PER_TASK, dst))
            })
            .collect();
        tasks.into_par_iter().for_each(|(w, base, dst)| {
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
    // call) and write their columns of every output row in place with the
    // tiled kernel, which is bit-identical to a `vec_dot` per (weight row,
    // token) pair, so a token's output does not depend on the batch it is
    // in.
    let prepared = quant::GemmAct::new(ty, k, &act);
    let mut tasks: Vec<(&CpuWeight, usize, Vec<&mut [f32]>)> = Vec::new();
    for (w, out) in ws.iter().zip(outs.iter_mut()) {
        if w.rows == 0 {
            continue;
        }
        let rows = rows_per_task(w.rows);
        let first = tasks.len();
        tasks.extend((0..w.rows.div_ceil(rows)).map(|t| (*w, t * rows, Vec::with_capacity(n))));
        for row in out.data.chunks_mut(w.rows) {
            for (t, cols) in row.chunks_mut(rows).enumerate() {
                tasks[first + t].2.push(cols);
            }
        }
    }
    tasks.into_par_iter().for_each(|(w, base, mut cols)| {
        let len = cols[0].len();
        let bytes = &w.bytes.as_slice()[base * w.row_bytes..(base + len) * w.row_bytes];
        quant::gemm_with(ty, k, bytes, &prepared, &mut cols);
    });
    Ok(())
}

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

    /// `matmul_many` gives, bit for bit, what one `matmul` per weight
    /// gives, for weights of one type (one shared quantization and
    /// parallel region) and of mixed types (each on its own).
    #[test]
    fn matmul_many_equals_one_matmul_per_weight() {
        let k = 576;
        for n in [1usize, 3, 8, 17] {
            for types in [
                [GgmlType::Q4_1; 3],
                [GgmlType::Q8_0; 3],
                [GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::F16],
            ] {
                let ws: Vec<CpuWeight> = types
                    .iter()
                    .zip([576usize, 192, 45])
                    .enumerate()
                    .map(|(i, (&ty, m))| weight(ty, m, k, 31 * i as u64 + n as u64))
                    .collect();
                let x = CpuTensor {
                    rows: n,
                    cols: k,
                    data: floats(n as u64, n * k, 3.0),
                };
                let mut many: Vec<CpuTensor> = ws
                    .iter()
                    .map(|w| CpuTensor {
                        rows: n,
                        cols: w.rows,
                        data: vec![f32::NAN; n * w.rows],
                    })
                    .collect();
                let refs: Vec<&CpuWeight> = ws.iter().collect();
                let mut outs: Vec<&mut CpuTensor> = many.iter_mut().collect();
                matmul_many(&refs, &x, &mut outs).expect("shapes match");
                for (w, got) in ws.iter().zip(&many) {
                    let mut want = CpuTensor {
                        rows: n,
                        cols: w.rows,
                        data: vec![0.0; n * w.rows],
                    };
                    matmul(w, &x, &mut want).expect("shapes match");
                    let bits =
                        |t: &CpuTensor| t.data.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(got), bits(&want), "{} n={n}", w.name);
                }
            }
        }
    }
}
