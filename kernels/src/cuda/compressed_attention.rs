//! Launch wrappers of `kernels/cuda/compressed_attention.cu`: attention
//! with sinks over a [`CudaCompressedPool`]'s raw window and pooled rows.
//!
//! One launch computes every (row, group of 8 heads, split of the row's
//! keys); when the keys are split (decode batches that would not fill the
//! GPU otherwise), a second merges the splits with the sink. Scores,
//! softmax and sums run in f32 where the CPU reference runs f64.

use super::compressed::{
    bucket, max_end, need_blocks, need_windows, seq_tables, shape_err, CudaCompressedPool,
};
use super::{CudaBackend, CudaTensor, CudaWeight};
use crate::backend::{BackendError, CompressedAttentionConfig, CompressedSeq};

/// Heads per block (`CA_WARPS`).
const HEADS_PER_BLOCK: usize = 8;
/// Blocks the grid aims for (a few waves over an H200's 132 SMs).
const TARGET_BLOCKS: usize = 4096;
/// Fewest keys one split covers (4 tiles of 32 per warp).
const MIN_CHUNK: usize = 128;

#[allow(clippy::too_many_arguments)]
pub(super) fn attention(
    be: &CudaBackend,
    q: &CudaTensor,
    pool: &CudaCompressedPool,
    layer: usize,
    seqs: &[CompressedSeq<'_>],
    selected: Option<&CudaTensor>,
    sinks: &CudaWeight,
    cfg: &CompressedAttentionConfig,
    out: &mut CudaTensor,
) -> Result<(), BackendError> {
    let pc = &pool.cfg;
    let d = cfg.head_dim;
    let r = cfg.ratio;
    let kernel = match d {
        128 => "comp_attn_d128",
        256 => "comp_attn_d256",
        512 => "comp_attn_d512",
        _ => "",
    };
    let sel = selected.filter(|_| r > 0);
    if d != pc.head_dim
        || kernel.is_empty()
        || q.cols != cfg.n_head * d
        || out.cols != q.cols
        || out.rows != q.rows
        || sinks.rows != 1
        || sinks.cols != cfg.n_head
        || pc.ratios.get(layer) != Some(&r)
        || sel.is_some_and(|s| s.rows != q.rows || s.cols == 0)
    {
        return Err(shape_err(
            "compressed_attention",
            format!(
                "{} heads of {d} (128, 256 or 512) at ratio {r}: q [{}, {}], out [{}, {}], sinks [{}, {}], selection {:?}; pool rows of {}, layer {layer} of ratios {:?}",
                cfg.n_head,
                q.rows,
                q.cols,
                out.rows,
                out.cols,
                sinks.rows,
                sinks.cols,
                sel.map(|s| (s.rows, s.cols)),
                pc.head_dim,
                pc.ratios
            ),
        ));
    }
    let window = pc.window;
    for s in seqs.iter().filter(|s| s.n_rows > 0) {
        let last = s.pos + s.n_rows - 1;
        need_windows(
            pc,
            "compressed_attention",
            s,
            (s.pos + 1).saturating_sub(window),
            last,
        )?;
        if r > 0 && sel.is_none() {
            need_blocks(pc, "compressed_attention", s, r, 0..(last + 1) / r)?;
        }
    }
    let t = seq_tables(be, pc, "compressed_attention", seqs, q.rows)?;
    if seqs.iter().all(|s| s.n_rows == 0) {
        return Ok(());
    }
    let top_k = sel.map_or(0, |s| s.cols);
    // Keys of the longest list, by the context bucket (so that
    // consecutive decode steps launch the same grid).
    let pooled = match (r, sel) {
        (0, _) => 0,
        (_, Some(_)) => top_k,
        _ => bucket(max_end(seqs)) / r,
    };
    let groups = cfg.n_head.div_ceil(HEADS_PER_BLOCK);
    let (n_split, chunk) = split(q.rows * groups, window + pooled);
    let parts = q.rows * cfg.n_head * n_split;
    let (pm, pl, pa) = if n_split > 1 {
        let s = be.scratch(&[4 * parts, 4 * parts, 4 * parts * d])?;
        (s[0], s[1], s[2])
    } else {
        (0, 0, 0)
    };
    let (qp, op, skp) = (q.ptr, out.ptr, be.dense_ptr(sinks));
    let selp = sel.map_or(0, |s| s.ptr);
    let (wp, wstride) = (be.ptr(&pool.windows), pool.window_stride as u64);
    let raw_off = (layer * pc.block_size) as u64;
    let (bp, bstride) = (be.ptr(&pool.blocks), pool.block_stride as u64);
    let rows_at = pool.offsets[layer].rows as u64;
    let (k_i, r_i, bs_i, win_i, nh_i) = (
        top_k as i32,
        r as i32,
        pc.block_size as i32,
        window as i32,
        cfg.n_head as i32,
    );
    let (f16, chunk_i, d_i, n_split_i) =
        (pc.f16_rows as i32, chunk as i32, d as i32, n_split as i32);
    // Bound by the key rows read (once per block from L2, shared by its
    // 8 heads) and 4 · head_dim flops per key and head.
    launch!(be, kernel, (q.rows as u32, groups as u32, n_split as u32), 32 * HEADS_PER_BLOCK as u32;
        &qp, &op, &skp, &selp, &k_i, &t.seq, &t.rows, &t.tab, &wp, &wstride, &raw_off, &bp,
        &bstride, &rows_at, &r_i, &bs_i, &win_i, &nh_i, &cfg.scale, &f16, &chunk_i, &pm, &pl, &pa)?;
    if n_split == 1 {
        return Ok(());
    }
    launch!(be, "comp_attn_merge", (q.rows as u32, cfg.n_head as u32, 1), 128;
        &pm, &pl, &pa, &t.rows, &skp, &op, &nh_i, &d_i, &n_split_i)
}

/// `(n_split, chunk)`: `max_keys` keys cut into `n_split` chunks of
/// `chunk`, for `blocks` (row, head group) pairs.
fn split(blocks: usize, max_keys: usize) -> (usize, usize) {
    let by_len = max_keys.div_ceil(MIN_CHUNK);
    let by_grid = (TARGET_BLOCKS / blocks.max(1)).max(1);
    let n_split = by_len.min(by_grid).clamp(1, 65535);
    let chunk = max_keys.div_ceil(n_split);
    (max_keys.div_ceil(chunk), chunk)
}
