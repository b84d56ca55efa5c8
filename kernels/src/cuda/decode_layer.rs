//! Wrapper of `kernels/cuda/decode_layer.cu`: a whole dense decoder layer
//! for one token in one launch on a cluster of [`CLUSTER`] blocks (see
//! the kernel source for the stages and their barriers).
//!
//! It takes what a batch-1 decode step of a small llama-layout model looks
//! like: Q4_1 matrices, 64-dimensional heads, f32 norm scales, an f16 KV
//! pool, production numerics, and widths small enough that each block's
//! rows of o, gate, up and down fit in its shared memory with the rest
//! ([`smem_bytes`]; SmolLM2-135M: about 185 KB); anything else runs op by
//! op. The fused layer is on by default on sm_90+ where the device can
//! place the cluster; `DS4_CUDA_FUSED_LAYER=0` turns it off (results
//! agree to rounding; for comparisons).

use super::attention::{kv_tables, KvTables};
use super::{CudaBackend, CudaKvPool, CudaTensor, CudaWeight};
use crate::backend::{
    BackendError, DenseLayer, DenseLayerConfig, KvDtype, KvSeq, Numerics, RopeMode,
};
use crate::quant::GgmlType;

/// Blocks per cluster (`DL_CL`).
pub const CLUSTER: u32 = 16;
/// Threads per block (`DL_THREADS`).
const THREADS: u32 = 768;
/// Head dimension the kernel is written for (`DL_HD`).
const HEAD_DIM: usize = 64;
/// Warps per block (`DL_WARPS`).
const WARPS: usize = THREADS as usize / 32;
/// Most q heads per kv head (`DL_MAXG`).
const MAX_GROUP: usize = 4;
pub const KERNEL: &str = "decode_layer_q4_1";

/// The kernel's dynamic shared memory for these dimensions: `dl_mem` in
/// decode_layer.cu, region by region (each rounded up to 4 floats).
pub fn smem_bytes(e: usize, f: usize, h: usize, hk: usize) -> usize {
    let r4 = |n: usize| n.div_ceil(4) * 4;
    let (qd, kvd, g, ns) = (h * HEAD_DIM, hk * HEAD_DIM, h / hk, CLUSTER as usize / hk);
    let a = e.max(qd).max(f);
    let floats = r4(e)
        + 2 * 32
        + r4(qd + 2 * kvd)
        + r4((g + 1) * HEAD_DIM)
        + r4(h * ns * (HEAD_DIM + 2))
        + r4(g * WARPS * (HEAD_DIM + 2))
        + r4(e)
        + r4(qd)
        + r4(f)
        + r4(e)
        + 2 * r4(a / 32);
    // This block's rows of o, gate, up and down (`dl_rows`, each region
    // rounded up to 16 bytes).
    let gw = CLUSTER as usize * WARPS;
    let block = GgmlType::Q4_1.type_size();
    let rows =
        |n: usize, cols: usize| (n.div_ceil(gw) * WARPS * cols / 32 * block).div_ceil(16) * 16;
    4 * floats + a + rows(e, qd) + 2 * rows(f, e) + rows(e, f)
}

/// Whether the fused kernel takes `layer` (see the module doc).
pub fn supports(
    be: &CudaBackend,
    l: &DenseLayer<'_, CudaWeight>,
    cfg: &DenseLayerConfig,
    pool: &CudaKvPool,
    rows: usize,
) -> bool {
    let a = &cfg.attn;
    let (e, f) = (l.wq.cols, l.w_gate.rows);
    let (qd, kvd) = (a.n_head * HEAD_DIM, a.n_head_kv * HEAD_DIM);
    let q4_1 = |w: &CudaWeight, rows: usize, cols: usize| {
        w.ggml_type == GgmlType::Q4_1 && w.rows == rows && w.cols == cols
    };
    let norm = |w: &CudaWeight| w.rows == 1 && w.cols == e && w.dense.is_some();
    // The kernel copies rows of these into shared memory 16 bytes at a time.
    let aligned = [l.wo, l.w_gate, l.w_up, l.w_down]
        .iter()
        .all(|w| be.weight_ptr(w).is_multiple_of(16));
    let shape_ok = rows == 1
        && be.numerics == Numerics::Production
        && pool.dtype == KvDtype::F16
        && a.head_dim == HEAD_DIM
        && a.n_head_kv > 0
        && a.n_head_kv <= CLUSTER as usize
        && a.n_head.is_multiple_of(a.n_head_kv)
        && a.n_head / a.n_head_kv <= MAX_GROUP
        && cfg.rope.n_rot <= HEAD_DIM
        && cfg.rope.n_rot.is_multiple_of(2)
        && pool.cfg.kv_dim == kvd
        && e.is_multiple_of(32)
        && f.is_multiple_of(32)
        && q4_1(l.wq, qd, e)
        && q4_1(l.wk, kvd, e)
        && q4_1(l.wv, kvd, e)
        && q4_1(l.wo, e, qd)
        && q4_1(l.w_gate, f, e)
        && q4_1(l.w_up, f, e)
        && q4_1(l.w_down, e, f)
        && norm(l.attn_norm)
        && norm(l.ffn_norm)
        && aligned;
    shape_ok && cluster_fits(be, smem_bytes(e, f, a.n_head, a.n_head_kv) as u32)
}

/// Whether the fused layer may run with `smem` bytes of shared memory per
/// block: it is on, and the device can place its cluster (asked once per
/// size).
fn cluster_fits(be: &CudaBackend, smem: u32) -> bool {
    if !be.fused_layer || smem > be.smem_optin {
        return false;
    }
    let mut fit = be.cluster_fit.lock().unwrap_or_else(|e| e.into_inner());
    *fit.entry(smem).or_insert_with(|| {
        let cfg = cudarc::driver::LaunchConfig {
            grid_dim: (CLUSTER, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: smem,
        };
        let n = be.funcs[KERNEL].occupancy_max_active_clusters(cfg, &be.stream);
        n.is_ok_and(|n| n > 0)
    })
}

/// Records the fused layer for the single row of `x` (see
/// [`crate::Backend::dense_layer`]); `supports` said yes.
pub fn dense_layer(
    be: &CudaBackend,
    l: &DenseLayer<'_, CudaWeight>,
    cfg: &DenseLayerConfig,
    x: &mut CudaTensor,
    pool: &mut CudaKvPool,
    index: usize,
    seq: &KvSeq<'_>,
) -> Result<(), BackendError> {
    let a = &cfg.attn;
    let e = l.wq.cols;
    if x.rows != 1 || x.cols != e || seq.n_rows != 1 || seq.row != 0 || index >= pool.cfg.n_layer {
        return Err(BackendError::Shape {
            op: "dense_layer",
            detail: format!(
                "x [{}, {}] for a layer of width {e}, sequence rows {}..{}, layer {index} of {}",
                x.rows,
                x.cols,
                seq.row,
                seq.row + seq.n_rows,
                pool.cfg.n_layer
            ),
        });
    }
    let KvTables { info, tables, .. } = kv_tables(std::slice::from_ref(seq), 1, &pool.cfg)?;
    let (ip, tp) = (be.upload_cached(&info)?, be.upload_cached(&tables)?);
    let pc = pool.cfg;
    let block_elems = (pc.block_bytes(pool.dtype) / pool.dtype.bytes()) as u64;
    let layer_off = (index * 2 * pc.block_size * pc.kv_dim) as u64;
    let (e_i, f_i) = (e as i32, l.w_gate.rows as i32);
    let (h_i, hk_i) = (a.n_head as i32, a.n_head_kv as i32);
    let (n_rot, bs) = (cfg.rope.n_rot as i32, pc.block_size as i32);
    let mode = match cfg.rope.mode {
        RopeMode::Normal => 0i32,
        RopeMode::Neox => 1,
    };
    let smem = smem_bytes(e, l.w_gate.rows, a.n_head, a.n_head_kv) as u32;
    let w = |w: &CudaWeight| be.weight_ptr(w);
    let (an, fnorm) = (be.dense_ptr(l.attn_norm), be.dense_ptr(l.ffn_norm));
    let pp = be.ptr(&pool.buf);
    launch!(be, KERNEL, (CLUSTER, 1, 1), (THREADS, smem);
        &x.ptr, &an, &fnorm, &w(l.wq), &w(l.wk), &w(l.wv), &w(l.wo), &w(l.w_gate), &w(l.w_up),
        &w(l.w_down), &pp, &ip, &tp, &e_i, &f_i, &h_i, &hk_i, &cfg.rms_eps, &a.scale, &n_rot,
        &cfg.rope.freq_base, &cfg.rope.freq_scale, &mode, &bs, &block_elems, &layer_off)
}
