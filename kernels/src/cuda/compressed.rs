//! Launch wrappers of `kernels/cuda/compressed.cu`: the compressed-attention
//! pool in device memory (blocks, window blocks, frontier slots, allocated
//! zeroed up front like [`super::CudaKvPool`]), frontier resets, raw-row
//! stores and the compressors; block and window-block copies. The
//! sequence tables every compressed-attention kernel reads are laid out
//! here; the indexer's selection is `indexer.rs`, attention
//! `compressed_attention.rs`.
//!
//! Device layout: block `b` at byte `b · block_stride` holds exactly the
//! bytes [`crate::Backend::compressed_read_block`] returns, window block
//! `w` at `w · window_stride` those [`crate::Backend::window_read`]
//! returns (strides padded to 256 bytes for aligned vector loads), so the
//! disk cache files are the same on both backends. A slot holds the f32
//! frontiers at the CPU's offsets.

use cudarc::driver::CudaSlice;

use super::{dev_err, embed, queue, CudaBackend, CudaTensor, CudaWeight};
use crate::backend::{
    BackendError, CompressedPoolConfig, CompressedSeq, CompressorConfig, CompressorKind,
};
use crate::quant::GgmlType;

/// Alignment of blocks and window blocks in device memory.
const ALIGN: usize = 256;
/// Widest pooled row `compress_pool` holds (`CP_MAX_DIM`).
const MAX_DIM: usize = 1024;

/// Where a layer's parts are, in values (as `cpu/compressed.rs` lays them out).
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct LayerOffsets {
    /// Pooled rows within a block.
    pub rows: usize,
    /// Indexer rows within a block (ratio 4).
    pub index_rows: usize,
    /// Attention compressor frontier within a slot.
    slot: usize,
    /// Indexer compressor frontier within a slot (ratio 4).
    index_slot: usize,
    /// Carry within a window block's carry (ratio 4).
    carry: usize,
}

fn layer_offsets(cfg: &CompressedPoolConfig) -> Vec<LayerOffsets> {
    let (mut rows, mut slot, mut carry) = (0, 0, 0);
    cfg.ratios
        .iter()
        .map(|&r| {
            let n = cfg.rows_per_block(r);
            let mut o = LayerOffsets {
                rows,
                slot,
                carry,
                ..LayerOffsets::default()
            };
            rows += n * cfg.head_dim;
            match r {
                0 => {}
                4 => {
                    o.index_rows = rows;
                    rows += n * cfg.index_dim;
                    slot += 2 * 8 * 2 * cfg.head_dim;
                    o.index_slot = slot;
                    slot += 2 * 8 * 2 * cfg.index_dim;
                    carry += 4 * 2 * (cfg.head_dim + cfg.index_dim);
                }
                r => slot += 2 * r * cfg.head_dim,
            }
            o
        })
        .collect()
}

/// The compressed-attention pool in device memory.
pub struct CudaCompressedPool {
    pub(super) cfg: CompressedPoolConfig,
    pub(super) offsets: Vec<LayerOffsets>,
    pub(super) block_stride: usize,
    pub(super) window_stride: usize,
    pub(super) blocks: queue::Deferred<CudaSlice<u8>>,
    pub(super) windows: queue::Deferred<CudaSlice<u8>>,
    slots: queue::Deferred<CudaSlice<f32>>,
    /// Slots [`begin`] started.
    begun: Vec<bool>,
}

impl CudaCompressedPool {
    pub fn config(&self) -> &CompressedPoolConfig {
        &self.cfg
    }

    /// Bytes of a window block's raw rows (its carry follows).
    fn raw_bytes(&self) -> usize {
        self.cfg.window_raw_values() * self.cfg.row_bytes()
    }
}

pub(super) fn shape_err(op: &'static str, detail: String) -> BackendError {
    BackendError::Shape { op, detail }
}

fn zeroed<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
    be: &CudaBackend,
    n: usize,
    what: &str,
) -> Result<queue::Deferred<CudaSlice<T>>, BackendError> {
    let buf = be
        .stream
        .alloc_zeros::<T>(n.max(4))
        .map_err(|e| dev_err(&format!("allocating the compressed pool's {what}"), e))?;
    Ok(queue::Deferred::new(buf, be.state.clone()))
}

pub(super) fn pool(
    be: &CudaBackend,
    cfg: &CompressedPoolConfig,
) -> Result<CudaCompressedPool, BackendError> {
    if cfg
        .ratios
        .iter()
        .any(|&r| r != 0 && !cfg.block_size.is_multiple_of(r))
        || cfg.block_size < cfg.window
        || !cfg.block_size.is_multiple_of(4)
    {
        return Err(shape_err(
            "compressed_pool",
            format!(
                "block size {} must be a multiple of 4 and of every ratio {:?}, and at least the window {}",
                cfg.block_size, cfg.ratios, cfg.window
            ),
        ));
    }
    let block_stride = cfg.block_bytes().next_multiple_of(ALIGN);
    let window_stride = cfg.window_bytes().next_multiple_of(ALIGN);
    let total = |n: usize, stride: usize, what: &str| {
        n.checked_mul(stride).ok_or_else(|| {
            BackendError::OutOfMemory(format!("compressed pool {what} of {cfg:?} overflow"))
        })
    };
    let blocks = zeroed::<u8>(be, total(cfg.n_blocks, block_stride, "blocks")?, "blocks")?;
    let windows = zeroed::<u8>(
        be,
        total(cfg.n_window_blocks, window_stride, "window blocks")?,
        "window blocks",
    )?;
    let slots = zeroed::<f32>(be, total(cfg.n_slots, cfg.slot_values(), "slots")?, "slots")?;
    Ok(CudaCompressedPool {
        offsets: layer_offsets(cfg),
        block_stride,
        window_stride,
        blocks,
        windows,
        slots,
        begun: vec![false; cfg.n_slots],
        cfg: cfg.clone(),
    })
}

/// `{offset, rows, width, dim, carry offset (-1: none)}` per frontier of
/// a slot, in the slot's order (compressed.cu `comp_begin`).
fn frontier_table(pool: &CudaCompressedPool) -> Vec<i32> {
    let cfg = &pool.cfg;
    let mut t = Vec::new();
    for (&r, o) in cfg.ratios.iter().zip(&pool.offsets) {
        match r {
            0 => {}
            4 => {
                for (at, dim, carry) in [
                    (o.slot, cfg.head_dim, o.carry),
                    (o.index_slot, cfg.index_dim, o.carry + 4 * 2 * cfg.head_dim),
                ] {
                    t.extend([at as i32, 8, 2 * dim as i32, dim as i32, carry as i32]);
                }
            }
            r => t.extend([o.slot as i32, r as i32, cfg.head_dim as i32, 0, -1]),
        }
    }
    t
}

pub(super) fn begin(
    be: &CudaBackend,
    pool: &mut CudaCompressedPool,
    slot: u32,
    window: Option<u32>,
) -> Result<(), BackendError> {
    let cfg = &pool.cfg;
    if slot as usize >= cfg.n_slots {
        return Err(shape_err(
            "compressed_begin",
            format!("slot {slot} is outside the pool of {}", cfg.n_slots),
        ));
    }
    if let Some(w) = window.filter(|&w| w as usize >= cfg.n_window_blocks) {
        return Err(shape_err(
            "compressed pool",
            format!(
                "window block {w} is outside the pool of {}",
                cfg.n_window_blocks
            ),
        ));
    }
    let table = frontier_table(pool);
    if !table.is_empty() {
        let fp = be.upload_cached(&table)?;
        let sp = be.ptr(&pool.slots);
        let slot_off = slot as u64 * cfg.slot_values() as u64;
        let cp = window.map_or(0, |w| {
            be.ptr(&pool.windows) + (w as usize * pool.window_stride + pool.raw_bytes()) as u64
        });
        launch!(be, "comp_begin", ((table.len() / 5) as u32, 1, 1), 256; &sp, &slot_off, &fp, &cp)?;
    }
    pool.begun[slot as usize] = true;
    Ok(())
}

/// Device addresses of what the kernels read of a call's sequences
/// (compressed.cu's `seqinfo`, `rowinfo` and `tab`), uploaded once per
/// pass for each content.
pub(super) struct SeqTables {
    pub seq: u64,
    pub rows: u64,
    pub tab: u64,
}

/// Context lengths rounded up to a power of two (at least 256).
pub(super) fn bucket(len: usize) -> usize {
    len.next_power_of_two().max(256)
}

/// The longest sequence of a batch, in positions (at least 1).
pub(super) fn max_end(seqs: &[CompressedSeq<'_>]) -> usize {
    seqs.iter()
        .map(|s| s.pos + s.n_rows)
        .max()
        .unwrap_or(0)
        .max(1)
}

/// Checks that `seqs` lie within `rows` rows, no row in two of them, and
/// uploads their tables. Block and window tables are padded to a
/// power-of-two context bucket (entries `u32::MAX`), so that consecutive
/// decode steps record the same commands.
pub(super) fn seq_tables(
    be: &CudaBackend,
    cfg: &CompressedPoolConfig,
    op: &'static str,
    seqs: &[CompressedSeq<'_>],
    rows: usize,
) -> Result<SeqTables, BackendError> {
    let tab_len = bucket(max_end(seqs)).div_ceil(cfg.block_size);
    let mut seq = Vec::with_capacity(8 * seqs.len());
    let mut row_info = vec![-1i32; 2 * rows];
    let mut tab: Vec<u32> = Vec::with_capacity(2 * tab_len * seqs.len());
    for (i, s) in seqs.iter().enumerate() {
        if s.row + s.n_rows > rows {
            return Err(shape_err(
                op,
                format!(
                    "rows {}..{} of a {rows}-row tensor",
                    s.row,
                    s.row + s.n_rows
                ),
            ));
        }
        let toff = tab.len();
        tab.extend(s.blocks.iter().take(tab_len));
        tab.resize(toff + tab_len, u32::MAX);
        let woff = tab.len();
        tab.extend(s.window.iter().take(tab_len));
        tab.resize(woff + tab_len, u32::MAX);
        seq.extend([
            s.slot as i32,
            toff as i32,
            woff as i32,
            s.row as i32,
            s.n_rows as i32,
            s.pos as i32,
            tab_len as i32,
            0,
        ]);
        for j in 0..s.n_rows {
            let r = s.row + j;
            if row_info[2 * r] >= 0 {
                return Err(shape_err(op, format!("row {r} belongs to two sequences")));
            }
            row_info[2 * r] = i as i32;
            row_info[2 * r + 1] = (s.pos + j) as i32;
        }
    }
    Ok(SeqTables {
        seq: be.upload_cached(&seq)?,
        rows: be.upload_cached(&row_info)?,
        tab: be.upload_cached(&tab)?,
    })
}

/// Checks that `s` has a block (within the pool) for each of its pooled
/// rows `rows` of ratio `r`.
pub(super) fn need_blocks(
    cfg: &CompressedPoolConfig,
    op: &'static str,
    s: &CompressedSeq<'_>,
    r: usize,
    rows: std::ops::Range<usize>,
) -> Result<(), BackendError> {
    if rows.is_empty() {
        return Ok(());
    }
    let bs = cfg.block_size;
    for bi in rows.start * r / bs..=(rows.end - 1) * r / bs {
        match s.blocks.get(bi) {
            Some(&b) if (b as usize) < cfg.n_blocks => {}
            Some(&b) => {
                return Err(shape_err(
                    op,
                    format!("block {b} is outside the pool of {}", cfg.n_blocks),
                ))
            }
            None => {
                return Err(shape_err(
                    op,
                    format!(
                        "position {} has no block in the sequence's block table",
                        bi * bs
                    ),
                ))
            }
        }
    }
    Ok(())
}

/// Checks that `s` has a window block (within the pool) for every position
/// of `first ..= last`.
pub(super) fn need_windows(
    cfg: &CompressedPoolConfig,
    op: &'static str,
    s: &CompressedSeq<'_>,
    first: usize,
    last: usize,
) -> Result<(), BackendError> {
    let bs = cfg.block_size;
    for bi in first / bs..=last / bs {
        match s.window.get(bi) {
            Some(&w) if w != u32::MAX => {
                if w as usize >= cfg.n_window_blocks {
                    return Err(shape_err(
                        op,
                        format!(
                            "window block {w} is outside the pool of {}",
                            cfg.n_window_blocks
                        ),
                    ));
                }
            }
            _ => {
                return Err(shape_err(
                    op,
                    format!(
                        "position {} has no window block in the sequence's window table",
                        (bi * bs).max(first)
                    ),
                ))
            }
        }
    }
    Ok(())
}

pub(super) fn window_store(
    be: &CudaBackend,
    pool: &mut CudaCompressedPool,
    layer: usize,
    seqs: &[CompressedSeq<'_>],
    kv: &CudaTensor,
) -> Result<(), BackendError> {
    let cfg = &pool.cfg;
    let (bs, d) = (cfg.block_size, cfg.head_dim);
    if kv.cols != d || layer >= cfg.ratios.len() {
        return Err(shape_err(
            "window_store",
            format!(
                "rows of {} values into layer {layer}; the pool's are {d} wide, {} layers",
                kv.cols,
                cfg.ratios.len()
            ),
        ));
    }
    for s in seqs.iter().filter(|s| s.n_rows > 0) {
        need_windows(cfg, "window_store", s, s.pos, s.pos + s.n_rows - 1)?;
    }
    let t = seq_tables(be, cfg, "window_store", seqs, kv.rows)?;
    if seqs.iter().all(|s| s.n_rows == 0) {
        return Ok(());
    }
    let (kp, wp) = (kv.ptr, be.ptr(&pool.windows));
    let ws = pool.window_stride as u64;
    let (layer_i, bs_i, d_i, f16) = (layer as i32, bs as i32, d as i32, cfg.f16_rows as i32);
    launch!(be, "window_store", (kv.rows as u32, 1, 1), 128;
        &kp, &t.seq, &t.rows, &t.tab, &wp, &ws, &layer_i, &bs_i, &d_i, &f16)
}

/// The position bias: its address and whether it is f16 (F32 and F16
/// weights are read in place; other types are dequantized to f32 first).
fn position_bias(be: &CudaBackend, ape: &CudaWeight) -> Result<(u64, bool), BackendError> {
    match ape.ggml_type {
        GgmlType::F32 => Ok((be.weight_ptr(ape), false)),
        GgmlType::F16 => Ok((be.weight_ptr(ape), true)),
        _ => {
            let out = be.arena_bytes(ape.rows * ape.cols * 4)?;
            let ids: Vec<u32> = (0..ape.rows as u32).collect();
            embed::embed_ptr(be, ape, &ids, out, ape.cols)?;
            Ok((out, false))
        }
    }
}

#[allow(clippy::too_many_arguments)]
pub(super) fn compress(
    be: &CudaBackend,
    pool: &mut CudaCompressedPool,
    layer: usize,
    seqs: &[CompressedSeq<'_>],
    k: &CudaTensor,
    s: &CudaTensor,
    ape: &CudaWeight,
    norm: &CudaWeight,
    cfg: &CompressorConfig,
) -> Result<(), BackendError> {
    let pc = &pool.cfg;
    let r = cfg.ratio;
    let Some(&o) = pool.offsets.get(layer) else {
        return Err(shape_err(
            "compress",
            format!("layer {layer} of a pool of {}", pc.ratios.len()),
        ));
    };
    let (dim, frontier_at, rows_at, carry_at) = match cfg.kind {
        CompressorKind::Attention => (pc.head_dim, o.slot, o.rows, o.carry),
        CompressorKind::Indexer => (
            pc.index_dim,
            o.index_slot,
            o.index_rows,
            o.carry + 4 * 2 * pc.head_dim,
        ),
    };
    let lanes = if r == 4 { 2 } else { 1 };
    let width = lanes * dim;
    if r == 0 || pc.ratios[layer] != r || (cfg.kind == CompressorKind::Indexer && r != 4) {
        return Err(shape_err(
            "compress",
            format!(
                "ratio {r} for a {:?} compressor of layer {layer} (ratio {})",
                cfg.kind, pc.ratios[layer]
            ),
        ));
    }
    let n_rot = cfg.rope.n_rot();
    if k.cols != width
        || s.cols != width
        || k.rows != s.rows
        || ape.cols != width
        || ape.rows != r
        || norm.rows != 1
        || norm.cols != dim
        || n_rot > dim
        || dim > MAX_DIM
        || (cfg.kind == CompressorKind::Indexer && !dim.is_power_of_two())
    {
        return Err(shape_err(
            "compress",
            format!(
                "values [{}, {}], scores [{}, {}], position bias [{}, {}], norm [{}, {}], {n_rot} rotated dims; expected rows of {width}, {r} bias rows, norm {dim} (at most {MAX_DIM}, a power of two for the indexer)",
                k.rows, k.cols, s.rows, s.cols, ape.rows, ape.cols, norm.rows, norm.cols
            ),
        ));
    }
    let bs = pc.block_size;
    let mut slots_seen = std::collections::HashSet::new();
    for sq in seqs.iter().filter(|sq| sq.n_rows > 0) {
        match pool.begun.get(sq.slot as usize) {
            Some(true) => {}
            Some(false) => {
                return Err(shape_err(
                    "compressed pool",
                    format!("slot {} was never begun", sq.slot),
                ))
            }
            None => {
                return Err(shape_err(
                    "compressed pool",
                    format!("slot {} is outside the pool of {}", sq.slot, pc.n_slots),
                ))
            }
        }
        if !slots_seen.insert(sq.slot) {
            return Err(shape_err(
                "compress",
                format!("two sequences of the call share slot {}", sq.slot),
            ));
        }
        let end = sq.pos + sq.n_rows;
        // Every window the call completes has a block; a ratio-4 window
        // ending a block, a window block for its carry.
        need_blocks(pc, "compress", sq, r, sq.pos / r..end / r)?;
        if r == 4 {
            for b_end in (sq.pos / bs + 1..=end / bs).map(|b| b * bs) {
                need_windows(pc, "compress", sq, b_end - 1, b_end - 1)?;
            }
        }
    }
    let t = seq_tables(be, pc, "compress", seqs, k.rows)?;
    let max_windows = seqs
        .iter()
        .map(|sq| sq.n_rows.div_ceil(r))
        .max()
        .unwrap_or(0);
    if max_windows == 0 {
        return Ok(());
    }
    let (ap, ape_f16) = position_bias(be, ape)?;
    let np = be.dense_ptr(norm);
    let omega: Vec<u32> = cfg
        .rope
        .omega
        .iter()
        .flat_map(|w| {
            let b = w.to_bits();
            [b as u32, (b >> 32) as u32]
        })
        .collect();
    let wp = if omega.is_empty() {
        0
    } else {
        be.upload_cached(&omega)?
    };
    let flags = pc.f16_rows as i32
        | ((cfg.kind == CompressorKind::Indexer) as i32) << 1
        | (cfg.round as i32) << 2
        | (ape_f16 as i32) << 3;
    let (kp, sp) = (k.ptr, s.ptr);
    let slots = be.ptr(&pool.slots);
    let (slot_values, front_at) = (pc.slot_values() as u64, frontier_at as u64);
    let (bp, bstride, rows_at) = (
        be.ptr(&pool.blocks),
        pool.block_stride as u64,
        rows_at as u64,
    );
    let (winp, wstride) = (be.ptr(&pool.windows), pool.window_stride as u64);
    let carry_b = (pool.raw_bytes() + 4 * carry_at) as u64;
    let (dim_i, r_i, bs_i, rot_i) = (dim as i32, r as i32, bs as i32, n_rot as i32);
    let n_seqs = seqs.len() as u32;
    // Pass 1: every window the call completes, pooled, normalized,
    // rotated, rounded and stored (bound by the candidates read: r or 8
    // values and scores per channel of a pooled row).
    launch!(be, "compress_pool", (n_seqs, max_windows as u32, 1), 256;
        &kp, &sp, &ap, &np, &wp, &t.seq, &t.tab, &slots, &slot_values, &front_at, &bp, &bstride,
        &rows_at, &winp, &wstride, &carry_b, &dim_i, &r_i, &bs_i, &rot_i, &cfg.norm_eps, &flags)?;
    // Pass 2: the frontier the next call reads.
    launch!(be, "compress_frontier", (n_seqs, dim.div_ceil(128) as u32, 1), 128;
        &kp, &sp, &ap, &t.seq, &slots, &slot_values, &front_at, &dim_i, &r_i, &flags)
}

/// Checks `len` bytes for one of `n` items of `want` bytes, item `i`.
fn check_copy(
    op: &'static str,
    what: &str,
    i: u32,
    n: usize,
    len: usize,
    want: usize,
) -> Result<(), BackendError> {
    if i as usize >= n || len != want {
        return Err(shape_err(
            op,
            format!("{what} {i} of {n} with {len} bytes; one is {want} bytes"),
        ));
    }
    Ok(())
}

pub(super) fn read_block(
    be: &CudaBackend,
    pool: &CudaCompressedPool,
    block: u32,
    out: &mut [u8],
) -> Result<(), BackendError> {
    let bb = pool.cfg.block_bytes();
    check_copy(
        "compressed_read_block",
        "block",
        block,
        pool.cfg.n_blocks,
        out.len(),
        bb,
    )?;
    if bb == 0 {
        return Ok(());
    }
    let start = block as usize * pool.block_stride;
    be.sync_locked(&mut be.lock())?;
    be.stream
        .memcpy_dtoh(&pool.blocks.slice(start..start + bb), out)
        .map_err(|e| dev_err("compressed_read_block", e))
}

pub(super) fn write_block(
    be: &CudaBackend,
    pool: &mut CudaCompressedPool,
    block: u32,
    data: &[u8],
) -> Result<(), BackendError> {
    let bb = pool.cfg.block_bytes();
    check_copy(
        "compressed_write_block",
        "block",
        block,
        pool.cfg.n_blocks,
        data.len(),
        bb,
    )?;
    if bb == 0 {
        return Ok(());
    }
    let start = block as usize * pool.block_stride;
    be.lock().flush(&be.stream)?;
    be.stream
        .memcpy_htod(data, &mut pool.blocks.slice_mut(start..start + bb))
        .map_err(|e| dev_err("compressed_write_block", e))
}

pub(super) fn window_read(
    be: &CudaBackend,
    pool: &CudaCompressedPool,
    window: u32,
    out: &mut [u8],
) -> Result<(), BackendError> {
    let wb = pool.cfg.window_bytes();
    check_copy(
        "window_read",
        "window block",
        window,
        pool.cfg.n_window_blocks,
        out.len(),
        wb,
    )?;
    if wb == 0 {
        return Ok(());
    }
    let start = window as usize * pool.window_stride;
    be.sync_locked(&mut be.lock())?;
    be.stream
        .memcpy_dtoh(&pool.windows.slice(start..start + wb), out)
        .map_err(|e| dev_err("window_read", e))
}

pub(super) fn window_write(
    be: &CudaBackend,
    pool: &mut CudaCompressedPool,
    window: u32,
    data: &[u8],
) -> Result<(), BackendError> {
    let wb = pool.cfg.window_bytes();
    check_copy(
        "window_write",
        "window block",
        window,
        pool.cfg.n_window_blocks,
        data.len(),
        wb,
    )?;
    if wb == 0 {
        return Ok(());
    }
    let start = window as usize * pool.window_stride;
    be.lock().flush(&be.stream)?;
    be.stream
        .memcpy_htod(data, &mut pool.windows.slice_mut(start..start + wb))
        .map_err(|e| dev_err("window_write", e))
}
