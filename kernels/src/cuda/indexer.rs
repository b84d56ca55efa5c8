//! Launch wrappers of `kernels/cuda/indexer.cu`: the lightning indexer's
//! selection over a [`CudaCompressedPool`]'s indexer rows.
//!
//! Query rows go in groups of up to [`QG`] consecutive rows of one
//! sequence; the groups go in chunks whose scores (one f32 per visible
//! indexer row and query row) fit [`SCORE_BYTES`] of scratch, each chunk
//! a score launch then a top-k launch (commands run in order, so chunks
//! reuse the scratch). With f16 rows of 128 values the scores run on the
//! tensor cores: f16 inputs (exact for the FP4-rounded queries and keys
//! of production numerics) with f32 accumulation; f32 rows run in f32.
//! Either way the sums are f32 where the CPU's are f64, so a selection
//! can differ from the CPU's only between scores within f32 rounding of
//! each other.

use super::compressed::{bucket, max_end, need_blocks, seq_tables, shape_err, CudaCompressedPool};
use super::{CudaBackend, CudaTensor};
use crate::backend::{BackendError, CompressedSeq};

/// Query rows per group (`IX_QG`).
const QG: usize = 4;
/// Staged f16 per query head (`IX_QROW`).
const QROW: usize = 160;
/// Indexer rows per block tile: `IX_TILE` (tensor cores), 256 (f32).
const MMA_TILE: usize = 128;
const SIMT_TILE: usize = 256;
/// Most scratch the scores of one chunk take (256K indexer rows, a 1M
/// context, at 1 MB per query row: 64 rows per chunk).
const SCORE_BYTES: usize = 64 << 20;
/// Score blocks a launch aims for (a few waves over an H200's 132 SMs).
const TARGET_BLOCKS: usize = 1024;
/// Threads of a top-k block (`TK_THREADS`).
const TK_THREADS: u32 = 512;

#[allow(clippy::too_many_arguments)]
pub(super) fn select(
    be: &CudaBackend,
    pool: &CudaCompressedPool,
    layer: usize,
    seqs: &[CompressedSeq<'_>],
    q: &CudaTensor,
    w: &CudaTensor,
    top_k: usize,
    out: &mut CudaTensor,
) -> Result<(), BackendError> {
    let cfg = &pool.cfg;
    let dim = cfg.index_dim;
    let n_head = w.cols;
    if cfg.ratios.get(layer) != Some(&4)
        || n_head == 0
        || q.cols != n_head * dim
        || w.rows != q.rows
        || out.cols != top_k
        || out.rows != q.rows
        || !dim.is_multiple_of(4)
    {
        return Err(shape_err(
            "indexer_select",
            format!(
                "layer {layer} (ratio {:?}), queries [{}, {}], weights [{}, {}], out [{}, {}], top {top_k}, indexer rows of {dim}",
                cfg.ratios.get(layer), q.rows, q.cols, w.rows, w.cols, out.rows, out.cols
            ),
        ));
    }
    for s in seqs {
        need_blocks(cfg, "indexer_select", s, 4, 0..(s.pos + s.n_rows) / 4)?;
    }
    let t = seq_tables(be, cfg, "indexer_select", seqs, q.rows)?;
    if top_k == 0 || seqs.iter().all(|s| s.n_rows == 0) {
        return Ok(());
    }
    // {sequence, first row, rows, first scratch row (set per chunk)}.
    let mut groups: Vec<i32> = Vec::new();
    for (i, s) in seqs.iter().enumerate() {
        for start in (0..s.n_rows).step_by(QG) {
            let n = QG.min(s.n_rows - start);
            groups.extend([i as i32, (s.row + start) as i32, n as i32, 0]);
        }
    }
    let mma = cfg.f16_rows && dim == 128 && be.arch() >= 80;
    let tile = if mma { MMA_TILE } else { SIMT_TILE };
    // Scores per query row: the bucketed context's indexer rows.
    let ldk = (bucket(max_end(seqs)) / 4).next_multiple_of(tile);
    let hp = n_head.next_multiple_of(8);
    let smem = if mma {
        QG * hp * (2 * QROW + 4)
    } else {
        QG * n_head * (dim + 1) * 4
    };
    if smem > be.smem_optin as usize {
        return Err(shape_err(
            "indexer_select",
            format!(
                "{n_head} heads of {dim} need {smem} bytes of shared memory, the device has {}",
                be.smem_optin
            ),
        ));
    }
    let n_groups = groups.len() / 4;
    let chunk_groups = (SCORE_BYTES / (QG * ldk * 4)).clamp(1, n_groups);
    let scores = be.scratch(&[chunk_groups * QG * ldk * 4])?[0];
    let (qp, wp, op) = (q.ptr, w.ptr, out.ptr);
    let bp = be.ptr(&pool.blocks);
    let bstride = pool.block_stride as u64;
    let rows_at = pool.offsets[layer].index_rows as u64;
    let (bs_i, nh_i, dim_i, ldk_i, k_i) = (
        cfg.block_size as i32,
        n_head as i32,
        dim as i32,
        ldk as i32,
        top_k as i32,
    );
    let f16 = cfg.f16_rows as i32;
    for chunk in groups.chunks(4 * chunk_groups) {
        let mut g = chunk.to_vec();
        for (j, e) in g.chunks_mut(4).enumerate() {
            e[3] = (j * QG) as i32;
        }
        let gp = be.upload_cached(&g)?;
        let ng = g.len() / 4;
        let n_split = (TARGET_BLOCKS / ng).clamp(1, ldk / tile);
        let grid = (ng as u32, n_split as u32, 1);
        if mma {
            // Tensor cores: bound by the indexer rows read (decode) or by
            // the 2 · 128 flops per indexer row, head and query (prefill).
            launch!(be, "ix_score_mma", grid, (256, smem as u32);
                &qp, &wp, &gp, &t.seq, &t.tab, &bp, &bstride, &rows_at, &bs_i, &nh_i, &scores,
                &ldk_i)?;
        } else {
            launch!(be, "ix_score_simt", grid, (256, smem as u32);
                &qp, &wp, &gp, &t.seq, &t.tab, &bp, &bstride, &rows_at, &bs_i, &nh_i, &dim_i, &f16,
                &scores, &ldk_i)?;
        }
        launch!(be, "ix_topk", (ng as u32, QG as u32, 1), TK_THREADS;
            &scores, &ldk_i, &gp, &t.seq, &op, &k_i)?;
    }
    Ok(())
}
