//! Wrapper of `kernels/cuda/attention.cu`: paged KV writes and causal
//! attention over a [`CudaKvPool`].
//!
//! The host turns the sequences' block tables into one table array and,
//! per q row, `{block, slot, pos, table_off}` (see the kernel source); one
//! launch stores every row's k/v, a second computes partial attention for
//! every (row, head, split of the positions), a third merges the splits
//! (split-KV, so that a decode batch of a few rows still fills the GPU).
//! With production numerics on an f16 pool, the rows of sequences that
//! prefill several positions go instead to the f16 tensor-core kernel of
//! `kernels/cuda/attention_prefill.cu`, in tiles of consecutive rows.

use super::{CudaBackend, CudaKvPool, CudaTensor};
use crate::backend::{AttentionConfig, BackendError, KvDtype, KvPoolConfig, KvSeq, Numerics};

/// Largest head dimension the kernel holds in registers.
const MAX_HEAD_DIM: usize = 512;

/// Checks a block id and a buffer length; returns the block's size.
pub fn check_block(pool: &CudaKvPool, block: u32, len: usize) -> Result<usize, BackendError> {
    let bb = pool.cfg.block_bytes(pool.dtype);
    if block as usize >= pool.cfg.n_blocks || len != bb {
        return Err(BackendError::Shape {
            op: "kv block copy",
            detail: format!(
                "block {block} of {} with {len} bytes; a block is {bb} bytes",
                pool.cfg.n_blocks
            ),
        });
    }
    Ok(bb)
}

#[allow(clippy::too_many_arguments)]
pub fn attention(
    be: &CudaBackend,
    q: &CudaTensor,
    k: &CudaTensor,
    v: &CudaTensor,
    pool: &mut CudaKvPool,
    layer: usize,
    seqs: &[KvSeq<'_>],
    cfg: &AttentionConfig,
    out: &mut CudaTensor,
) -> Result<(), BackendError> {
    let hd = cfg.head_dim;
    let kv_dim = cfg.n_head_kv * hd;
    let pc = pool.cfg;
    let shape_ok = q.cols == cfg.n_head * hd
        && k.cols == kv_dim
        && v.cols == kv_dim
        && pc.kv_dim == kv_dim
        && k.rows == q.rows
        && v.rows == q.rows
        && out.rows == q.rows
        && out.cols == q.cols
        && layer < pc.n_layer
        && cfg.n_head_kv > 0
        && cfg.n_head.is_multiple_of(cfg.n_head_kv)
        && hd > 0
        && hd <= MAX_HEAD_DIM;
    if !shape_ok {
        return Err(BackendError::Shape {
            op: "attention",
            detail: format!(
                "q [{}, {}], k [{}, {}], v [{}, {}], out [{}, {}], layer {layer}, {cfg:?}, pool {pc:?} (head_dim <= {MAX_HEAD_DIM})",
                q.rows, q.cols, k.rows, k.cols, v.rows, v.cols, out.rows, out.cols
            ),
        });
    }
    let bs = pc.block_size;
    let KvTables {
        info,
        tables,
        toffs,
        ctx_bucket,
    } = kv_tables(seqs, q.rows, &pc)?;
    if q.rows == 0 {
        return Ok(());
    }
    // Prefill rows (sequences with several rows in the batch) go to the
    // tensor-core kernel in tiles of consecutive rows; the split-KV kernel
    // takes the rest (its copy of `info` marks the tiled rows as rows of
    // no sequence, whose output it zeroes before the tiles are written).
    let prefill = if be.numerics == Numerics::Production
        && pool.dtype == KvDtype::F16
        && (hd == 64 || hd == 128)
        && be.tensor_cores()
    {
        prefill_tiles(seqs, &toffs)
    } else {
        Vec::new()
    };
    let tiled_rows: usize = prefill.chunks(4).map(|t| t[1] as usize).sum();
    // Every layer of a forward pass has the same tables: uploaded once.
    let (ip, tp) = (be.upload_cached(&info)?, be.upload_cached(&tables)?);
    let elem = pool.dtype.bytes();
    let block_elems = (pc.block_bytes(pool.dtype) / elem) as u64;
    let layer_off = (layer * 2 * bs * kv_dim) as u64;
    let (qp, kp, vp, pp, op) = (q.ptr, k.ptr, v.ptr, be.ptr(&pool.buf), out.ptr);
    let (kv_dim_i, bs_i) = (kv_dim as i32, bs as i32);
    let (nh, nkv) = (cfg.n_head as i32, cfg.n_head_kv as i32);
    let fused = fuse_rope_store(
        be,
        q,
        k,
        v,
        pool.dtype,
        [pp, ip, bs_i as u64, block_elems, layer_off],
    )?;
    if !fused {
        let store = match pool.dtype {
            KvDtype::F16 => "kv_store_f16",
            KvDtype::F32 => "kv_store_f32",
        };
        launch!(be, store, (q.rows as u32, 1, 1), 128;
            &kp, &vp, &pp, &ip, &kv_dim_i, &bs_i, &block_elems, &layer_off)?;
    }
    if tiled_rows < q.rows {
        let sp = if prefill.is_empty() {
            ip
        } else {
            let mut split_info = info.clone();
            for t in prefill.chunks(4) {
                for r in t[0]..t[0] + t[1] {
                    split_info[4 * r as usize] = -1;
                }
            }
            be.upload_cached(&split_info)?
        };
        split_kv(
            be,
            q,
            pool,
            cfg,
            ctx_bucket,
            tp,
            sp,
            block_elems,
            layer_off,
            out,
        )?;
    }
    if prefill.is_empty() {
        return Ok(());
    }
    let tiles = be.upload_cached(&prefill)?;
    let name = if hd == 64 {
        "attn_prefill_d64"
    } else {
        "attn_prefill_d128"
    };
    let grid = ((prefill.len() / 4) as u32, cfg.n_head as u32, 1);
    launch!(be, name, grid, 128;
        &qp, &pp, &tp, &tiles, &nh, &nkv, &bs_i, &block_elems, &layer_off, &cfg.scale, &op)
}

/// What the attention kernels read of a batch's sequences: per row
/// `{block, slot, pos, table_off}` (`info`), every sequence's block table
/// padded to `ctx_bucket` positions (`tables`, each starting at its
/// sequence's `toffs` entry).
pub struct KvTables {
    pub info: Vec<i32>,
    pub tables: Vec<u32>,
    pub toffs: Vec<i32>,
    pub ctx_bucket: usize,
}

/// Checks `seqs` (rows within `rows`, blocks within the pool, positions
/// within their tables) and lays out their [`KvTables`].
pub fn kv_tables(
    seqs: &[KvSeq<'_>],
    rows: usize,
    pc: &KvPoolConfig,
) -> Result<KvTables, BackendError> {
    let bs = pc.block_size;
    // Each sequence's table padded to the context bucket, so that the
    // upload's size (and so the recorded pass) stays the same from one
    // decode step to the next.
    let ctx_bucket = bucket(max_len(seqs));
    let table_len = ctx_bucket.div_ceil(bs);
    let mut info = vec![-1i32; 4 * rows];
    let mut tables: Vec<u32> = Vec::new();
    let mut toffs = Vec::with_capacity(seqs.len());
    for s in seqs {
        if s.row + s.n_rows > rows {
            return Err(BackendError::Shape {
                op: "attention",
                detail: format!(
                    "sequence rows {}..{} past the {} rows of q",
                    s.row,
                    s.row + s.n_rows,
                    rows
                ),
            });
        }
        let end = s.pos + s.n_rows;
        if end > s.blocks.len() * bs {
            return Err(BackendError::ContextFull {
                pos: end - 1,
                ctx: s.blocks.len() * bs,
            });
        }
        if let Some(&b) = s.blocks[..end.div_ceil(bs)]
            .iter()
            .find(|&&b| b as usize >= pc.n_blocks)
        {
            return Err(BackendError::Shape {
                op: "attention",
                detail: format!("block {b} is outside the pool of {} blocks", pc.n_blocks),
            });
        }
        let toff = tables.len() as i32;
        toffs.push(toff);
        tables.extend_from_slice(&s.blocks[..end.div_ceil(bs)]);
        tables.resize(toff as usize + table_len, 0);
        for i in 0..s.n_rows {
            let p = s.pos + i;
            let r = s.row + i;
            if info[4 * r] >= 0 {
                return Err(BackendError::Shape {
                    op: "attention",
                    detail: format!("row {r} belongs to two sequences"),
                });
            }
            info[4 * r..4 * r + 4].copy_from_slice(&[
                s.blocks[p / bs] as i32,
                (p % bs) as i32,
                p as i32,
                toff,
            ]);
        }
    }
    Ok(KvTables {
        info,
        tables,
        toffs,
        ctx_bucket,
    })
}

/// Records the KV store fused with the RoPE launch of these `q` and `k`
/// rows when that is the last command recorded (`rope_qk` right before
/// `attention`, as every llama-family layer does), but for uploads and
/// memsets of fresh buffers, which the RoPE does not read: the RoPE
/// launch is taken back and `rope_kv_store` recorded instead (the same
/// rotation, then the store). `store` = pool, info, block size, block
/// elements, layer offset. Returns whether it did.
fn fuse_rope_store(
    be: &CudaBackend,
    q: &CudaTensor,
    k: &CudaTensor,
    v: &CudaTensor,
    dtype: KvDtype,
    store: [u64; 5],
) -> Result<bool, BackendError> {
    use super::queue::Cmd;
    let rope = {
        let mut st = be.lock();
        let fresh = |c: &Cmd| matches!(c, Cmd::Memset { .. } | Cmd::HtoD { .. });
        let Some((back, Cmd::Launch { func, args, .. })) = st.last_launch(fresh) else {
            return Ok(false);
        };
        // rope(x, y, pos, rows, cols, cols_y, head_dim, n_rot, base, scale, mode)
        let same = *func == be.rope_func
            && args[0] == q.ptr
            && args[1] == k.ptr
            && args[3] == q.rows as u64
            && args[4] == q.cols as u64
            && args[5] == k.cols as u64;
        if !same {
            return Ok(false);
        }
        let rope = *args;
        st.edit(back, |_| None);
        st.fused_rope_stores += 1;
        rope
    };
    let (hd, heads) = (rope[6] as usize, (q.cols + k.cols) / rope[6] as usize);
    let n = q.rows * heads * (hd / 2);
    let name = match dtype {
        KvDtype::F16 => "rope_kv_store_f16",
        KvDtype::F32 => "rope_kv_store_f32",
    };
    let (qp, kp, vp) = (q.ptr, k.ptr, v.ptr);
    let [pp, ip, bs, block_elems, layer_off] = store;
    // rows, q cols, kv_dim (= k cols), head_dim, n_rot, freq base and
    // scale, mode: the RoPE launch's own argument slots.
    launch!(be, name, (n.div_ceil(256) as u32, 1, 1), 256;
        &qp, &kp, &vp, &rope[2], &pp, &ip, &rope[3], &rope[4], &rope[5], &rope[6], &rope[7],
        &rope[8], &rope[9], &rope[10], &bs, &block_elems, &layer_off)?;
    Ok(true)
}

/// Rows per tile of the prefill kernel (`FA_ROWS` in attention_prefill.cu).
const PREFILL_TILE_ROWS: usize = 64;

/// `{first row, rows, first position, table offset}` per tile of at most
/// [`PREFILL_TILE_ROWS`] consecutive rows of the sequences that have more
/// than one row in the batch.
fn prefill_tiles(seqs: &[KvSeq<'_>], toffs: &[i32]) -> Vec<i32> {
    let mut tiles = Vec::new();
    for (s, &toff) in seqs.iter().zip(toffs) {
        if s.n_rows < 2 {
            continue;
        }
        for start in (0..s.n_rows).step_by(PREFILL_TILE_ROWS) {
            let n = PREFILL_TILE_ROWS.min(s.n_rows - start);
            tiles.extend_from_slice(&[
                (s.row + start) as i32,
                n as i32,
                (s.pos + start) as i32,
                toff,
            ]);
        }
    }
    tiles
}

/// The split-KV kernel (and its merge) over every row of `info` (rows of
/// no sequence get zeros).
#[allow(clippy::too_many_arguments)]
fn split_kv(
    be: &CudaBackend,
    q: &CudaTensor,
    pool: &CudaKvPool,
    cfg: &AttentionConfig,
    ctx_bucket: usize,
    tp: u64,
    ip: u64,
    block_elems: u64,
    layer_off: u64,
    out: &mut CudaTensor,
) -> Result<(), BackendError> {
    let hd = cfg.head_dim;
    let (qp, pp, op) = (q.ptr, be.ptr(&pool.buf), out.ptr);
    let bs_i = pool.cfg.block_size as i32;
    let elem_name = match pool.dtype {
        KvDtype::F16 => "f16",
        KvDtype::F32 => "f32",
    };
    // Registers per lane for a head: kernels for 64, 128 and 512 dims.
    let maxd = match hd.div_ceil(32) {
        0..=2 => 2,
        3..=4 => 4,
        _ => 16,
    };
    let part = format!("attn_part_{elem_name}_d{maxd}");
    // Split the positions so that short batches still fill the GPU.
    let (n_split, chunk) = split(q.rows * cfg.n_head, ctx_bucket);
    let parts = q.rows * cfg.n_head * n_split;
    let s = be.scratch(&[4 * parts, 4 * parts, 4 * parts * hd])?;
    let (pm, pl, pa) = (s[0], s[1], s[2]);
    let (nh, nkv, hd_i) = (cfg.n_head as i32, cfg.n_head_kv as i32, hd as i32);
    let (n_split_i, chunk_i) = (n_split as i32, chunk as i32);
    // One split: attn_part writes the output itself (no merge launch).
    let direct = if n_split == 1 { op } else { 0u64 };
    // No quantization (fmt -1) unless the next matmul fuses it in.
    let (fmt, null) = (-1i32, 0u64);
    launch!(be, part.as_str(), (q.rows as u32, cfg.n_head as u32, n_split as u32), 128;
        &qp, &pp, &tp, &ip, &pm, &pl, &pa, &nh, &nkv, &hd_i, &bs_i, &block_elems, &layer_off,
        &cfg.scale, &chunk_i, &direct, &fmt, &null, &null, &null, &null)?;
    if n_split == 1 {
        return Ok(()); // attn_part wrote the result
    }
    launch!(be, "attn_merge", (q.rows as u32, cfg.n_head as u32, 1), 128;
        &pm, &pl, &pa, &ip, &op, &nh, &hd_i, &n_split_i)
}

/// The longest sequence of a batch, in positions (at least 1).
fn max_len(seqs: &[KvSeq<'_>]) -> usize {
    seqs.iter()
        .map(|s| s.pos + s.n_rows)
        .max()
        .unwrap_or(0)
        .max(1)
}

/// Context lengths rounded up to a power of two (at least 256): the
/// attention grid depends only on the bucket, so consecutive decode steps
/// launch the same work (the kernel clips each row to its own position).
fn bucket(len: usize) -> usize {
    len.next_power_of_two().max(256)
}

/// Blocks the attention grid aims for (a few waves over an H200's 132 SMs).
const TARGET_BLOCKS: usize = 4096;
/// Fewest positions one split block covers (its 4 warps take 32 each,
/// twice): a decode step within 256 positions is one split, without a
/// merge.
const MIN_CHUNK: usize = 256;

/// `(n_split, chunk)`: positions `0 .. max_len` cut into `n_split` chunks
/// of `chunk` positions, for `row_heads` (row, head) pairs.
fn split(row_heads: usize, max_len: usize) -> (usize, usize) {
    let by_len = max_len.div_ceil(MIN_CHUNK);
    let by_grid = (TARGET_BLOCKS / row_heads.max(1)).max(1);
    let n_split = by_len.min(by_grid).clamp(1, 65535);
    let chunk = max_len.div_ceil(n_split);
    (max_len.div_ceil(chunk), chunk)
}
