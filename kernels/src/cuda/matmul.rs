//! Wrapper of `kernels/cuda/matmul.cu` and `kernels/cuda/matmul_tiled.cu`:
//! `out[t] = W · x[t]`.
//!
//! Production numerics: activations quantized on the device to the
//! weight's `vec_dot_type` (Q8_0, Q8_1, Q8_K; F16 weights: rounded to f16)
//! exactly as [`crate::quant::quantize_row`] does (inside the norm or
//! SwiGLU launch that produced them where the backend can fuse it), then
//! integer block dots. Exact numerics (and F32 weights): weights
//! dequantized in registers, f32 dots with unrounded activations. Decode
//! (one token) runs dp4a matvecs (a warp per two rows for large Q4_K
//! matrices, else 32 to 128 threads per row; up to three matrices of one
//! type applied to the same input in one launch); 2 to 16 tokens through
//! a large Q4_K matrix run the multi-token matvec (a warp per two rows,
//! each weight unit dotted against 8 or 16 tokens); other batches of more
//! than eight tokens of quantized production matmuls run the shared-memory
//! tiled int8 tensor-core kernel (sm_80+, where the block's shared memory
//! fits; else the register tensor-core kernel, 16 rows x 32 tokens per
//! warp), smaller batches (and GPUs without int8 tensor cores) the dp4a
//! kernel with eight tokens sharing each unpacked chunk.

use super::{kernel_suffix, CudaBackend, CudaTensor, CudaWeight};
use crate::backend::{BackendError, Numerics};
use crate::quant::GgmlType;

/// Weight rows per 128-thread block (one warp each).
const ROWS_PER_BLOCK: usize = 4;
/// Tensor-core kernel: warps per block (16 weight rows each) and 8-token
/// tiles per warp (`MMA_WARPS`, `MMA_TT` in matmul.cu).
const MMA_WARPS: usize = 4;
const MMA_TOKEN_TILES: usize = 4;
/// Tiled tensor-core kernel (matmul_tiled.cu): warps along the weight
/// rows (32 rows each) of a block.
const TILED_ROW_WARPS: usize = 4;
const TILED_ROWS: usize = 32 * TILED_ROW_WARPS;

/// `(splits, K-tiles per split)` of a tiled matmul of `blocks` blocks
/// over `k_tiles` K-tiles: batches of up to 64 tokens whose grid would
/// leave SMs idle are cut along K (up to 8 ways, aiming at two blocks per
/// SM), so that more blocks stream the weights at once; larger batches
/// (prefill) are not split.
fn k_splits(blocks: usize, k_tiles: usize, n_tok: usize, sms: usize) -> (usize, usize) {
    if n_tok > 64 || blocks >= sms {
        return (1, k_tiles);
    }
    let want = (2 * sms).div_ceil(blocks).clamp(1, 8).min(k_tiles);
    let per = k_tiles.div_ceil(want);
    (k_tiles.div_ceil(per), per)
}

/// Dynamic shared memory of `mmt<wc>_<type>` and the gathered
/// `mmg<wc>_<type>`, `mmgu<wc>_<type>` (`Layout` in matmul_tiled.cu): raw
/// weight rows, two stages of activation quants and scales, then the
/// unpacked int8 tile, block scale words, chunk scales, the min-term
/// operands and each token's activation row.
fn tiled_smem_bytes(ty: GgmlType, wc: usize) -> usize {
    let tile_bytes = ty.row_bytes(256).expect("quantized types fill 256 values");
    let raw_stride = 16 * ((tile_bytes + 30) / 16);
    let (rows, toks) = (TILED_ROWS, 32 * wc);
    let k_quant = ty.vec_dot_type() == GgmlType::Q8_K;
    let mins = matches!(ty, GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q2_K);
    // Per token: quants, 8 ad, 8 Q8_1 sums, 16 Q8_K 16-value sums.
    let act_tok = 272
        + 32
        + if ty.vec_dot_type() == GgmlType::Q8_1 {
            32
        } else {
            0
        }
        + if mins { 64 } else { 0 };
    let blocks = if k_quant { 1 } else { 8 };
    let headers = (rows * blocks * 4).next_multiple_of(16);
    let scales = if k_quant { rows * 4 * 9 } else { 0 };
    let min_terms = if mins { rows * 16 + toks * 32 } else { 0 };
    // The activation row of each token.
    let act_rows = 4 * toks;
    rows * raw_stride + 2 * toks * act_tok + rows * 272 + headers + scales + min_terms + act_rows
}

pub fn matmul(
    be: &CudaBackend,
    w: &CudaWeight,
    x: &CudaTensor,
    out: &mut CudaTensor,
) -> Result<(), BackendError> {
    matmul_many(be, &[w], None, x, &mut [out])
}

/// `outs[i] = ws[i] · x (+ biases[i])`, quantizing `x` once for each
/// activation format the weights need (q/k/v or gate/up share one
/// quantization); the decode kernels add the bias as they store.
pub fn matmul_many(
    be: &CudaBackend,
    ws: &[&CudaWeight],
    biases: Option<&[&CudaWeight]>,
    x: &CudaTensor,
    outs: &mut [&mut CudaTensor],
) -> Result<(), BackendError> {
    assert_eq!(ws.len(), outs.len(), "matmul_many: one output per weight");
    if let Some(b) = biases {
        assert_eq!(b.len(), ws.len(), "matmul_many: one bias per weight");
        for (w, b) in ws.iter().zip(b) {
            assert_eq!(b.cols, w.rows, "matmul_many: bias length of {}", w.name);
        }
    }
    for (w, out) in ws.iter().zip(outs.iter()) {
        if w.ggml_type == GgmlType::I32 {
            return Err(BackendError::BadWeight {
                name: w.name.clone(),
                problem: "an i32 table is not a matrix a matmul can apply".into(),
            });
        }
        BackendError::check_matmul(
            &w.name,
            (w.rows, w.cols),
            (x.rows, x.cols),
            (out.rows, out.cols),
        )?;
        // (Binding allows other widths for one-row F32 weights only.)
        if !w.cols.is_multiple_of(32) {
            return Err(BackendError::BadWeight {
                name: w.name.clone(),
                problem: format!("rows of {} values: matmuls need a multiple of 32", w.cols),
            });
        }
    }
    if x.rows == 0 {
        return Ok(());
    }
    // Every path writes each output value once (no accumulation).
    for out in outs.iter() {
        be.overwrites(out);
    }
    // Activation formats the production integer path needs, each
    // quantized once into this op's scratch; F16 weights read the input
    // rounded to f16 (as ggml does), also made once.
    let mut acts: Vec<(GgmlType, Act)> = Vec::new();
    let mut f16_x = x.ptr;
    if be.numerics == Numerics::Production {
        let formats: Vec<GgmlType> = ws
            .iter()
            .filter(|w| w.ggml_type.is_quantized())
            .map(|w| w.ggml_type.vec_dot_type())
            .fold(Vec::new(), |mut v, a| {
                if !v.contains(&a) {
                    v.push(a);
                }
                v
            });
        let n = x.rows * x.cols;
        let mut sizes: Vec<usize> = formats.iter().flat_map(|&a| act_sizes(a, n)).collect();
        let round = ws.iter().any(|w| w.ggml_type == GgmlType::F16);
        if round {
            sizes.push(4 * n);
        }
        let s = be.scratch(&sizes)?;
        if round {
            let (xp, xr, n_i) = (x.ptr, s[sizes.len() - 1], n as i32);
            launch!(be, "round_f16", (n.div_ceil(256) as u32, 1, 1), 256; &xp, &xr, &n_i)?;
            f16_x = xr;
        }
        for (i, &a) in formats.iter().enumerate() {
            let act = Act {
                aq: s[4 * i],
                ad: s[4 * i + 1],
                asum: s[4 * i + 2],
                bs: s[4 * i + 3],
            };
            quantize(be, a, x, &act)?;
            acts.push((a, act));
        }
    }
    let mut i = 0;
    while i < ws.len() {
        let w = ws[i];
        let act = acts
            .iter()
            .find(|(a, _)| w.ggml_type.is_quantized() && *a == w.ggml_type.vec_dot_type())
            .map(|(_, act)| act);
        // Decode: up to three matrices of one type in one launch.
        let mut j = i + 1;
        if x.rows == 1 && act.is_some() {
            while j < ws.len() && j - i < MV_MATRICES && ws[j].ggml_type == w.ggml_type {
                j += 1;
            }
        }
        match act {
            Some(act) if x.rows == 1 => {
                matvecs(be, &ws[i..j], biases.map(|b| &b[i..j]), act, &outs[i..j])?;
            }
            _ if w.rows == 0 => {}
            _ => {
                let out = &mut *outs[i];
                match act {
                    Some(act) => launch_quantized(be, w, x.rows, act, out)?,
                    None if w.ggml_type == GgmlType::F16 => {
                        launch_float(be, w, f16_x, x.rows, out)?
                    }
                    None => launch_float(be, w, x.ptr, x.rows, out)?,
                }
                if let Some(b) = biases.map(|b| b[i]) {
                    super::elementwise::add_bias(be, out, b)?;
                }
            }
        }
        i = j;
    }
    Ok(())
}

/// Threads per weight row of the decode matvecs: about one 32-value chunk
/// each, from a warp to a block (see mv_q in matmul.cu).
fn threads_per_row(n_in: usize) -> usize {
    match n_in / 32 {
        96.. => 128,
        48.. => 64,
        _ => 32,
    }
}

/// Matrices one decode launch takes (`MV_PARAMS` in matmul.cu).
const MV_MATRICES: usize = 3;

/// One token through up to [`MV_MATRICES`] matrices of one type and width
/// in one launch (dp4a matvecs: a warp per two rows for large Q4_K
/// matrices, else 32 to 128 threads per row), biases added as the results
/// are stored.
fn matvecs(
    be: &CudaBackend,
    ws: &[&CudaWeight],
    biases: Option<&[&CudaWeight]>,
    a: &Act,
    outs: &[&mut CudaTensor],
) -> Result<(), BackendError> {
    let (ty, n_in, rb) = (ws[0].ggml_type, ws[0].cols, ws[0].row_bytes);
    debug_assert!(ws.iter().all(|w| w.ggml_type == ty && w.cols == n_in));
    let tpr = threads_per_row(n_in);
    // Q4_K rows read with 16-byte loads where the weights allow it.
    let q4k16 = ty == GgmlType::Q4_K && ws.iter().all(|w| be.weight_ptr(w).is_multiple_of(16));
    let rows: usize = ws.iter().map(|w| w.rows).sum();
    let staged = ws.iter().all(|w| mvs_fits(be, w));
    // Many Q4_K rows: a warp per two rows, loads in flight before use
    // (mv_q4k_w in matmul.cu); 8 rows per block.
    let (name, rows_per_block) = if staged {
        ("mvs_q8_0".to_string(), MVS_ROWS)
    } else if q4k16 && rows >= 1024 {
        ("mvr2_q4_k16".to_string(), 8)
    } else {
        let suffix = if q4k16 {
            "q4_k16"
        } else {
            kernel_suffix(ty).expect("bound weights have a CUDA type")
        };
        (format!("mv{tpr}_{suffix}"), 128 / tpr)
    };
    // (weights, output, rows, bias) of each matrix; block ends.
    let mut m = [(0u64, 0u64, 0i32, 0u64); MV_MATRICES];
    let mut ends = [0i32; MV_MATRICES];
    let mut blocks = 0;
    for (k, w) in ws.iter().enumerate() {
        let bias = biases.map_or(0, |b| be.dense_ptr(b[k]));
        m[k] = (be.weight_ptr(w), outs[k].ptr, w.rows as i32, bias);
        blocks += w.rows.div_ceil(rows_per_block) as i32;
        ends[k] = blocks;
    }
    let (e0, e1) = (ends[0], if ws.len() > 1 { ends[1] } else { blocks });
    if blocks == 0 {
        return Ok(());
    }
    let (rb, n_in_i) = (rb as u64, n_in as i32);
    let smem = if staged { mvs_smem(rb) } else { 0 };
    launch!(be, name.as_str(), (blocks as u32, 1, 1), (128, smem);
        &m[0].0, &m[0].1, &m[0].2, &m[0].3, &m[1].0, &m[1].1, &m[1].2, &m[1].3,
        &m[2].0, &m[2].1, &m[2].2, &m[2].3, &e0, &e1,
        &rb, &a.aq, &a.ad, &a.asum, &a.bs, &n_in_i)
}

/// Rows per block of the staged Q8_0 matvecs (`MVS_WARPS` in matmul.cu).
const MVS_ROWS: usize = 4;
/// Widest row the staged Q8_0 matvecs take (`MVS_MAXB` blocks a lane).
const MVS_MAX_IN: usize = 8192;

/// Whether `w` runs through the staged Q8_0 matvecs (`mvs_q8_0` in
/// matmul.cu): Q8_0 rows of a multiple of 256 values (whole 16-byte
/// lines), at most [`MVS_MAX_IN`], 16-byte aligned, when the backend
/// takes them ([`CudaBackend::staged_q8`]).
pub(super) fn mvs_fits(be: &CudaBackend, w: &CudaWeight) -> bool {
    w.ggml_type == GgmlType::Q8_0
        && be.staged_q8()
        && w.cols.is_multiple_of(256)
        && w.cols <= MVS_MAX_IN
        && be.weight_ptr(w).is_multiple_of(16)
}

/// Dynamic shared memory of a staged Q8_0 matvec block: a row (and 16
/// bytes of slack for the last block's word reads) per warp.
fn mvs_smem(rb: u64) -> u32 {
    (MVS_ROWS as u64 * (rb + 16)) as u32
}

/// One row through a grouped Q8_0 weight (`matmul_grouped`): stacked row
/// r reads activation group r / `group_rows` and writes `out[r]`.
pub(super) fn grouped_matvec(
    be: &CudaBackend,
    w: &CudaWeight,
    group_rows: usize,
    a: &Act,
    out: u64,
) -> Result<(), BackendError> {
    let blocks = w.rows.div_ceil(MVS_ROWS) as u32;
    let (wp, rb) = (be.weight_ptr(w), w.row_bytes as u64);
    let (n_out, n_in, gr) = (w.rows as i32, w.cols as i32, group_rows as i32);
    launch!(be, "mvsg_q8_0", (blocks, 1, 1), (128, mvs_smem(rb));
        &wp, &rb, &a.aq, &a.ad, &out, &n_out, &n_in, &gr)
}

/// One row through a grouped Q8_0 weight with the dense decode matvec
/// (`mvg*_q8_0`): stacked row r reads activation group r / `group_rows`.
/// None when a block's rows would span two groups.
pub(super) fn grouped_dense_matvec(
    be: &CudaBackend,
    w: &CudaWeight,
    group_rows: usize,
    a: &Act,
    out: u64,
) -> Option<Result<(), BackendError>> {
    let tpr = threads_per_row(w.cols);
    let per_block = 128 / tpr;
    if w.ggml_type != GgmlType::Q8_0 || group_rows == 0 || !group_rows.is_multiple_of(per_block) {
        return None;
    }
    let blocks = w.rows.div_ceil(per_block) as u32;
    let (wp, rb) = (be.weight_ptr(w), w.row_bytes as u64);
    let (n_out, n_in, gr) = (w.rows as i32, w.cols as i32, group_rows as i32);
    let name = format!("mvg{tpr}_q8_0");
    Some(launch!(be, name.as_str(), (blocks, 1, 1), 128;
        &wp, &rb, &a.aq, &a.ad, &out, &n_out, &n_in, &gr))
}

/// Device buffers of one quantized activation (see matmul.cu).
pub(super) struct Act {
    pub aq: u64,
    pub ad: u64,
    pub asum: u64,
    pub bs: u64,
}

impl Act {
    /// The buffers at `s[0..4]` (scratch made with [`act_sizes`]).
    pub(super) fn at(s: &[u64]) -> Act {
        Act {
            aq: s[0],
            ad: s[1],
            asum: s[2],
            bs: s[3],
        }
    }
}

/// Byte sizes of [`Act`]'s buffers for `n` values in format `act`.
pub(super) fn act_sizes(act: GgmlType, n: usize) -> [usize; 4] {
    [
        n,
        4 * (n / 32),
        if act == GgmlType::Q8_1 {
            4 * (n / 32)
        } else {
            4
        },
        if act == GgmlType::Q8_K {
            4 * (n / 16)
        } else {
            4
        },
    ]
}

/// The kernels' code for an activation format (`fmt` of quant_warp256).
fn act_code(act: GgmlType) -> i32 {
    match act {
        GgmlType::Q8_0 => 0,
        GgmlType::Q8_1 => 1,
        GgmlType::Q8_K => 2,
        other => unreachable!("quantized weights dot with q8 activations, not {other}"),
    }
}

/// Quantizes `x` into `a`: inside the kernel that just produced `x` where
/// it can (see [`CudaBackend::fuse_quantization`]), else by its own launch.
pub(super) fn quantize(
    be: &CudaBackend,
    act: GgmlType,
    x: &CudaTensor,
    a: &Act,
) -> Result<(), BackendError> {
    if be.fuse_quantization(x, act_code(act), [a.aq, a.ad, a.asum, a.bs]) {
        return Ok(());
    }
    quantize_rows(be, act, x.ptr, x.rows, x.cols, a)
}

/// Quantizes `rows` rows of `cols` f32 at device address `xp` into `a`
/// (its own launch; `cols` a multiple of 256 for Q8_K).
pub(super) fn quantize_rows(
    be: &CudaBackend,
    act: GgmlType,
    xp: u64,
    rows: usize,
    cols: usize,
    a: &Act,
) -> Result<(), BackendError> {
    let n = rows * cols;
    let fmt = act_code(act);
    let (n_i, n_in_i) = (n as i32, cols as i32);
    // One warp per 256 values, 8 warps per block.
    let grid = (n.div_ceil(256 * 8) as u32, 1, 1);
    if fmt == 2 {
        launch!(be, "act_q8_k", grid, 256; &xp, &a.aq, &a.ad, &a.bs, &n_i, &n_in_i)
    } else {
        let with_sum = i32::from(fmt == 1);
        launch!(be, "act_q8_0", grid, 256; &xp, &a.aq, &a.ad, &a.asum, &n_i, &with_sum)
    }
}

/// Integer block dots of a batch of tokens against a quantized
/// activation.
fn launch_quantized(
    be: &CudaBackend,
    w: &CudaWeight,
    n_tok: usize,
    a: &Act,
    out: &mut CudaTensor,
) -> Result<(), BackendError> {
    let (n_in, n_out) = (w.cols, w.rows);
    let suffix = kernel_suffix(w.ggml_type).expect("bound weights have a CUDA type");
    let (wp, rb, op) = (be.weight_ptr(w), w.row_bytes as u64, out.ptr);
    let (n_out_i, n_in_i, n_tok_i) = (n_out as i32, n_in as i32, n_tok as i32);
    // A few tokens through a large Q4_K matrix (several decode streams):
    // the multi-token matvec, NT = 8 or 16 tokens per pass over the
    // weights (see `MVT_TOKENS`).
    if w.ggml_type == GgmlType::Q4_K
        && n_tok <= be.mvt_tokens
        && n_out >= 1024
        && wp.is_multiple_of(16)
    {
        let nt = if n_tok <= 8 { 8 } else { 16 };
        let name = format!("mvt{nt}_q4_k16");
        let grid = (n_out.div_ceil(8) as u32, n_tok.div_ceil(nt) as u32, 1);
        return launch!(be, name.as_str(), grid, 128;
            &wp, &rb, &a.aq, &a.ad, &a.bs, &op, &n_out_i, &n_in_i, &n_tok_i);
    }
    // Batches of a few tokens (up to eight decode streams) read the
    // weights faster through the dp4a kernel (see `DP4A_TOKENS`).
    let tensor_cores = be.tensor_cores() && n_tok > be.dp4a_tokens;
    if tensor_cores {
        // The tiled kernel where the device gives a block its shared
        // memory: 128 weight rows x 32 or 64 tokens per block (32 where 64
        // does not fit: GPUs with about 100 KB per block).
        let preferred = if n_tok <= 32 { 1 } else { 2 };
        let fitting = [preferred, 1]
            .into_iter()
            .map(|wc| (wc, tiled_smem_bytes(w.ggml_type, wc)))
            .find(|&(_, smem)| smem <= be.smem_optin as usize);
        if let Some((wc, smem)) = fitting {
            let name = format!("mmt{wc}_{suffix}");
            let (gx, gy) = (n_out.div_ceil(TILED_ROWS), n_tok.div_ceil(32 * wc));
            let (splits, kt_per) = k_splits(gx * gy, n_in.div_ceil(256), n_tok, be.sm_count());
            // Several K-splits write partial sums, added in order after.
            let dst = if splits > 1 {
                be.arena_bytes(4 * splits * n_tok * n_out)?
            } else {
                op
            };
            let kt_per_i = kt_per as i32;
            launch!(be, name.as_str(), (gx as u32, gy as u32, splits as u32),
                (32 * TILED_ROW_WARPS as u32 * wc as u32, smem as u32);
                &wp, &rb, &a.aq, &a.ad, &a.asum, &a.bs, &dst, &n_out_i, &n_in_i, &n_tok_i, &kt_per_i)?;
            if splits > 1 {
                let (n_i, splits_i) = ((n_tok * n_out) as i32, splits as i32);
                launch!(be, "mmt_split_sum", ((n_tok * n_out).div_ceil(256) as u32, 1, 1), 256;
                    &dst, &op, &n_i, &splits_i)?;
            }
            return Ok(());
        }
    }
    let (name, grid) = if tensor_cores {
        (
            format!("mma_{suffix}"),
            (
                n_out.div_ceil(16 * MMA_WARPS) as u32,
                n_tok.div_ceil(8 * MMA_TOKEN_TILES) as u32,
                1,
            ),
        )
    } else {
        (
            format!("mmq8_{suffix}"),
            (
                n_out.div_ceil(ROWS_PER_BLOCK) as u32,
                n_tok.div_ceil(8) as u32,
                1,
            ),
        )
    };
    launch!(be, name.as_str(), grid, 128;
        &wp, &rb, &a.aq, &a.ad, &a.asum, &a.bs, &op, &n_out_i, &n_in_i, &n_tok_i)
}

/// Float dots (exact numerics, F32 and F16 weights) against `n_tok` rows
/// of f32 at `xp`.
fn launch_float(
    be: &CudaBackend,
    w: &CudaWeight,
    xp: u64,
    n_tok: usize,
    out: &mut CudaTensor,
) -> Result<(), BackendError> {
    let (n_in, n_out) = (w.cols, w.rows);
    let nt = if n_tok == 1 { 1 } else { 8 };
    let grid = (
        n_out.div_ceil(ROWS_PER_BLOCK) as u32,
        n_tok.div_ceil(nt) as u32,
        1,
    );
    let (wp, rb, op) = (be.weight_ptr(w), w.row_bytes as u64, out.ptr);
    // F16 rows are read 16 bytes at a time where they are aligned so
    // (16-byte rows: n_in % 8 == 0).
    let suffix = match kernel_suffix(w.ggml_type).expect("bound weights have a CUDA type") {
        "f16" if !(wp.is_multiple_of(16) && rb.is_multiple_of(16) && xp.is_multiple_of(16)) => {
            "f16u"
        }
        s => s,
    };
    let (n_out_i, n_in_i, n_tok_i) = (n_out as i32, n_in as i32, n_tok as i32);
    let name = format!("mmf{nt}_{suffix}");
    launch!(be, name.as_str(), grid, 128; &wp, &rb, &xp, &op, &n_out_i, &n_in_i, &n_tok_i)
}

/// A launch of the gathered tiled kernels (`mmg<wc>_<type>`,
/// `mmgu<wc>_<type>` in matmul_tiled.cu): row block `e` of a stacked
/// weight times the activation rows each tile lists (see `GatherTile`
/// there). moe.rs plans the tiles and owns the buffers.
pub(super) struct Gather {
    /// The stacked weight (gate with `w1` = up for the SwiGLU kernels).
    pub w0: u64,
    pub w1: u64,
    pub ty: GgmlType,
    pub rb: u64,
    /// Rows of one block (expert or group), and their width.
    pub n_out: usize,
    pub n_in: usize,
    /// `(e, first, cnt, -)` i32 records, `n_tiles` of them (device
    /// memory), at most `tiles_max`.
    pub tiles: u64,
    pub n_tiles: u64,
    pub tiles_max: usize,
    /// Position `first + t * stride`; activation row `src[p] / div`
    /// (`src` 0: `p`).
    pub src: u64,
    pub div: i32,
    pub stride: i32,
    /// `[positions, n_out]` results; `wts`: route weights by entry (SwiGLU).
    pub out: u64,
    pub positions: usize,
    pub wts: u64,
    pub clamp: f32,
}

/// Token warps (`wc`: 32 tokens each) of the gathered tiled kernel for
/// tiles of up to `tokens` rows of `ty`, where the device runs it (tensor
/// cores on and the block's shared memory fitting); `None` otherwise.
pub(super) fn gather_token_warps(be: &CudaBackend, ty: GgmlType, tokens: usize) -> Option<usize> {
    if !be.tensor_cores() || !ty.is_quantized() {
        return None;
    }
    let preferred = if tokens <= 32 { 1 } else { 2 };
    [preferred, 1]
        .into_iter()
        .find(|&wc| tiled_smem_bytes(ty, wc) <= be.smem_optin as usize)
}

/// Records one gathered tiled launch with `wc` token warps (see
/// [`gather_token_warps`]); `gu`: gate and up with the clamped SwiGLU.
/// `split_tokens`: plain launches for batches of that many tokens whose
/// grid leaves SMs idle are cut along K (their partial sums added in
/// order after), as [`launch_quantized`] does; `None` (and the SwiGLU
/// kernels): never.
pub(super) fn gathered_tiled(
    be: &CudaBackend,
    g: &Gather,
    wc: usize,
    gu: bool,
    split_tokens: Option<usize>,
    a: &Act,
) -> Result<(), BackendError> {
    let suffix = kernel_suffix(g.ty).expect("bound weights have a CUDA type");
    let name = format!("{}{wc}_{suffix}", if gu { "mmgu" } else { "mmg" });
    let smem = tiled_smem_bytes(g.ty, wc);
    let rows_per_block = if gu { TILED_ROWS / 2 } else { TILED_ROWS };
    let gx = g.n_out.div_ceil(rows_per_block);
    let k_tiles = g.n_in.div_ceil(256);
    let (splits, kt_per) = match split_tokens {
        Some(tokens) if !gu => k_splits(gx * g.tiles_max, k_tiles, tokens, be.sm_count()),
        _ => (1, k_tiles),
    };
    let total = g.positions * g.n_out;
    let dst = if splits > 1 {
        be.arena_bytes(4 * splits * total)?
    } else {
        g.out
    };
    let (n_out_i, n_in_i, kt_per_i) = (g.n_out as i32, g.n_in as i32, kt_per as i32);
    let split_stride = total as u64;
    launch!(be, name.as_str(), (gx as u32, g.tiles_max as u32, splits as u32),
        (32 * TILED_ROW_WARPS as u32 * wc as u32, smem as u32);
        &g.w0, &g.w1, &g.rb, &n_out_i, &g.tiles, &g.n_tiles, &g.src, &g.div, &g.stride,
        &a.aq, &a.ad, &a.asum, &a.bs, &dst, &split_stride, &g.wts, &g.clamp, &n_in_i, &kt_per_i)?;
    if splits > 1 {
        let (n_i, splits_i) = (total as i32, splits as i32);
        launch!(be, "mmt_split_sum", (total.div_ceil(256) as u32, 1, 1), 256;
            &dst, &g.out, &n_i, &splits_i)?;
    }
    Ok(())
}
