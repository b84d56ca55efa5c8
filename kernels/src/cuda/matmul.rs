//! Wrapper of `kernels/cuda/matmul.cu`: `out[t] = W · x[t]`.
//!
//! Production numerics: activations quantized on the device to the
//! weight's `vec_dot_type` (Q8_0, Q8_1, Q8_K; F16 weights: rounded to f16)
//! exactly as [`crate::quant::quantize_row`] does, then integer block dots.
//! Exact numerics (and F32 weights): weights dequantized in registers, f32
//! dots with unrounded activations. Decode (one token) runs one warp per
//! weight row with dp4a; batches of quantized production matmuls run on
//! int8 tensor cores (sm_80+, 16 rows x 32 tokens per warp), otherwise
//! on the dp4a kernel with eight tokens sharing each unpacked chunk.

use super::{kernel_suffix, CudaBackend, CudaTensor, CudaWeight};
use crate::backend::{BackendError, Numerics};
use crate::quant::GgmlType;

/// Weight rows per 128-thread block (one warp each).
const ROWS_PER_BLOCK: usize = 4;
/// Tensor-core kernel: warps per block (16 weight rows each) and 8-token
/// tiles per warp (`MMA_WARPS`, `MMA_TT` in matmul.cu).
const MMA_WARPS: usize = 4;
const MMA_TOKEN_TILES: usize = 4;

pub fn matmul(
    be: &CudaBackend,
    w: &CudaWeight,
    x: &CudaTensor,
    out: &mut CudaTensor,
) -> Result<(), BackendError> {
    if x.cols != w.cols || out.rows != x.rows || out.cols != w.rows {
        return Err(BackendError::Shape {
            op: "matmul",
            detail: format!(
                "{} is [{}, {}], x is [{}, {}], out is [{}, {}]",
                w.name, w.rows, w.cols, x.rows, x.cols, out.rows, out.cols
            ),
        });
    }
    let (n_tok, n_in, n_out) = (x.rows, x.cols, w.rows);
    if n_tok == 0 || n_out == 0 {
        return Ok(());
    }
    let nt = if n_tok == 1 { 1 } else { 8 };
    let grid = (
        n_out.div_ceil(ROWS_PER_BLOCK) as u32,
        n_tok.div_ceil(nt) as u32,
        1,
    );
    let suffix = kernel_suffix(w.ggml_type).expect("bound weights have a CUDA type");
    let wp = be.weight_ptr(w);
    let rb = w.row_bytes as u64;
    let (n_out_i, n_in_i, n_tok_i) = (n_out as i32, n_in as i32, n_tok as i32);
    let op = be.ptr(&out.buf);
    let quantized = w.ggml_type.is_quantized();

    if be.numerics == Numerics::Production && quantized {
        let act = w.ggml_type.vec_dot_type();
        let n = n_tok * n_in;
        let aq = be.scratch::<i8>(n)?;
        let ad = be.scratch::<f32>(n / 32)?;
        let asum = be.scratch::<f32>(if act == GgmlType::Q8_1 { n / 32 } else { 1 })?;
        let bs = be.scratch::<i32>(if act == GgmlType::Q8_K { n / 16 } else { 1 })?;
        let (xp, aqp, adp, asp, bsp) = (
            be.ptr(&x.buf),
            be.ptr(&aq),
            be.ptr(&ad),
            be.ptr(&asum),
            be.ptr(&bs),
        );
        match act {
            GgmlType::Q8_0 | GgmlType::Q8_1 => {
                let n_i = n as i32;
                let with_sum = i32::from(act == GgmlType::Q8_1);
                launch!(be, "act_q8_0", (n.div_ceil(256) as u32, 1, 1), 256;
                    &xp, &aqp, &adp, &asp, &n_i, &with_sum)?;
            }
            GgmlType::Q8_K => {
                launch!(be, "act_q8_k", ((n / 256) as u32, 1, 1), 256;
                    &xp, &aqp, &adp, &bsp, &n_in_i)?;
            }
            other => unreachable!("quantized weights dot with q8 activations, not {other}"),
        }
        if n_tok > 1 && be.tensor_cores() {
            let name = format!("mma_{suffix}");
            let grid = (
                n_out.div_ceil(16 * MMA_WARPS) as u32,
                n_tok.div_ceil(8 * MMA_TOKEN_TILES) as u32,
                1,
            );
            return launch!(be, name.as_str(), grid, 128;
                &wp, &rb, &aqp, &adp, &asp, &bsp, &op, &n_out_i, &n_in_i, &n_tok_i);
        }
        let name = format!("mmq{nt}_{suffix}");
        return launch!(be, name.as_str(), grid, 128;
            &wp, &rb, &aqp, &adp, &asp, &bsp, &op, &n_out_i, &n_in_i, &n_tok_i);
    }

    let name = format!("mmf{nt}_{suffix}");
    if be.numerics == Numerics::Production && w.ggml_type == GgmlType::F16 {
        // ggml rounds activations to the weight's float format first.
        let n = n_tok * n_in;
        let xr = be.scratch::<f32>(n)?;
        let (xp, xrp) = (be.ptr(&x.buf), be.ptr(&xr));
        let n_i = n as i32;
        launch!(be, "round_f16", (n.div_ceil(256) as u32, 1, 1), 256; &xp, &xrp, &n_i)?;
        return launch!(be, name.as_str(), grid, 128;
            &wp, &rb, &xrp, &op, &n_out_i, &n_in_i, &n_tok_i);
    }
    let xp = be.ptr(&x.buf);
    launch!(be, name.as_str(), grid, 128; &wp, &rb, &xp, &op, &n_out_i, &n_in_i, &n_tok_i)
}
