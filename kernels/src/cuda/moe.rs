//! Launch wrappers of `moe.cu`: routing (sqrt-softplus, hash-routed or
//! biased top-k), the routed experts and grouped projections.
//!
//! `moe_experts` is five stages on the device, with no host round trip:
//! `moe_plan` sorts the rows' (row, slot) entries by expert and cuts
//! each expert's entries into tiles; the gate and up projections of
//! every tile run together and store the clamped SwiGLU times the route
//! weight (one row per entry); that is quantized once; the down
//! projection writes one row per entry; `moe_reduce` adds each row's
//! entries in ascending expert order. The projections run as matvecs
//! (`moe_mv*`: decode, a few entries per expert, each expert's weights
//! read once per tile of up to 8 entries) or, once the entries average
//! [`GEMM_TOKENS`] per expert, as matmul_tiled.cu's int8 tensor-core GEMM
//! over the gathered rows (launched through [`matmul::gathered_tiled`]).
//! Both compute the same integer block dots and add the block terms in the
//! same order, so a row's result does not depend on the rest of its batch
//! (the parity tests check it bit for bit). Exact numerics and float
//! weights take the float matvecs (`moe_f*`) at every batch size.
//!
//! Costs (DeepSeek V4 Flash, 2-bit experts, per layer): decode reads each
//! routed expert's 7.1 MB once per tile (6 experts: 42 MB for one row);
//! prefill's GEMMs are int8 tensor-core work (3 · 2048 · 4096 MACs per
//! entry), the plan a few microseconds on one block, `moe_reduce`
//! one pass over `y`. Scratch per call: `x` quantized, `h` (`n · n_ff` f32,
//! and its quantization) and `y` (`n · d` f32) for `n = rows · k` entries
//! (2048 rows: 100 MB and 201 MB).
//!
//! `matmul_grouped` views `x` as `[rows · groups, n]` and `out` as
//! `[rows · groups, m]` (row `r · groups + g` is group `g` of row `r`)
//! and runs the same projection kernels on host-made tiles, one weight
//! block per group: one launch, every weight byte read once per tile.

use super::matmul::{self, Act, Gather};
use super::{kernel_suffix, CudaBackend, CudaTensor, CudaWeight};
use crate::backend::{BackendError, Numerics, RouteConfig};
use crate::quant::GgmlType;

/// Entries per matvec tile (`MV_NT` in moe.cu).
const MV_TOKENS: usize = 8;
/// Most slots per row `moe_reduce` orders (`MAX_K`).
const MAX_K: usize = 16;
/// Most experts: `moe_route`'s lane masks and `moe_plan`'s shared memory.
const MAX_EXPERTS: usize = 1024;
/// Warps of `moe_plan` (`PLAN_WARPS`).
const PLAN_WARPS: usize = 8;
/// Entries per active expert from which the expert projections run as
/// tensor-core GEMMs (below, the matvecs read each expert's weights once
/// per tile of 8 and are bound by those bytes; above, int8 dp4a work per
/// byte outgrows them). Not tuned on a GPU yet.
const GEMM_TOKENS: usize = 6;
/// Output rows (SwiGLU: gate and up row pairs) of a warp-per-row matvec
/// block, one a warp (`DV_WARPS`).
const DV_ROWS: usize = 4;
/// Weight-block terms a matvec block computes (two per thread).
const MV_ITEMS: usize = 256;
/// Shared memory a matvec block may use without opting in.
const MV_SMEM: usize = 48 << 10;
/// Most blocks along a grid's y dimension (tiles).
const MAX_TILES: usize = 65535;

fn shape_err(op: &'static str, detail: String) -> BackendError {
    BackendError::Shape { op, detail }
}

/// Types moe.cu has quantized matvecs for (`moe_mv_<type>`).
fn has_mv(ty: GgmlType) -> bool {
    matches!(
        ty,
        GgmlType::Q4_0
            | GgmlType::Q4_1
            | GgmlType::Q5_0
            | GgmlType::Q8_0
            | GgmlType::Q2_K
            | GgmlType::Q4_K
            | GgmlType::Q5_K
            | GgmlType::Q6_K
            | GgmlType::IQ2_XXS
    )
}

/// Types matmul_tiled.cu has gathered GEMMs for (`mmg*_<type>`).
fn has_gather(ty: GgmlType) -> bool {
    matches!(
        ty,
        GgmlType::Q8_0
            | GgmlType::Q2_K
            | GgmlType::Q4_K
            | GgmlType::Q5_K
            | GgmlType::Q6_K
            | GgmlType::IQ2_XXS
    )
}

/// How one projection runs.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Path {
    /// The gathered tensor-core GEMM with `wc` token warps.
    Gemm(usize),
    /// Quantized matvecs.
    Mv,
    /// Float matvecs; `round16`: the input rounded to f16 (F16 weights,
    /// production numerics, as the CPU does).
    Float { round16: bool },
}

impl Path {
    /// Entries one tile of this path holds.
    fn tile_tokens(self) -> usize {
        match self {
            Path::Gemm(wc) => 32 * wc,
            _ => MV_TOKENS,
        }
    }

    /// Whether the path reads a quantized activation.
    fn quantized(self) -> bool {
        !matches!(self, Path::Float { .. })
    }
}

/// The path of a weight of type `ty` whose tiles average `avg` entries
/// (`gemm`: whether the batch is large enough for the GEMM at all).
fn path(be: &CudaBackend, ty: GgmlType, avg: usize, gemm: bool) -> Path {
    if be.numerics == Numerics::Exact || !ty.is_quantized() {
        return Path::Float {
            round16: be.numerics == Numerics::Production && ty == GgmlType::F16,
        };
    }
    if gemm && has_gather(ty) {
        if let Some(wc) = matmul::gather_token_warps(be, ty, avg) {
            return Path::Gemm(wc);
        }
    }
    if has_mv(ty) {
        Path::Mv
    } else {
        // Types without integer kernels here (none that binds today).
        Path::Float { round16: false }
    }
}

/// Tiles of one projection: `(e, first, cnt, 0)` records at `tiles`, their
/// count at `n_tiles` (device memory), at most `max`; entry `t` of a tile
/// is position `first + t · stride`, its activation row `src[p] / div`
/// (`src` 0: `p`).
#[derive(Clone, Copy)]
struct Tiles {
    tiles: u64,
    n_tiles: u64,
    max: usize,
    src: u64,
    div: i32,
    stride: i32,
}

/// One projection: `w0` (and `w1`, the up weight, for the SwiGLU
/// kernels) in row blocks of `n_out` rows of `n_in` values.
struct Proj<'a> {
    w0: &'a CudaWeight,
    w1: Option<&'a CudaWeight>,
    n_out: usize,
    n_in: usize,
}

/// The input of a projection: a quantized activation (`Mv`, `Gemm`) or
/// f32 rows (`Float`).
enum Input<'a> {
    Quantized(&'a Act),
    F32(u64),
}

/// Records one projection over `tiles` into `out` (`positions` rows of
/// `n_out`); `wts`, `clamp`: route weights by entry and the SwiGLU clamp
/// (SwiGLU kernels only). `split_tokens`: the GEMM may cut K for a batch
/// of that many rows (grouped projections; never the experts, whose
/// results must not depend on the batch).
#[allow(clippy::too_many_arguments)]
fn project(
    be: &CudaBackend,
    path: Path,
    p: &Proj<'_>,
    t: &Tiles,
    input: Input<'_>,
    out: u64,
    positions: usize,
    wts: u64,
    clamp: f32,
    split_tokens: Option<usize>,
) -> Result<(), BackendError> {
    let gu = p.w1.is_some();
    let ty = p.w0.ggml_type;
    let (w0, w1) = (be.weight_ptr(p.w0), p.w1.map_or(0, |w| be.weight_ptr(w)));
    let rb = p.w0.row_bytes as u64;
    if t.max == 0 {
        return Ok(());
    }
    if t.max > MAX_TILES {
        return Err(shape_err(
            "moe",
            format!("{} tiles exceed the grid's {MAX_TILES}", t.max),
        ));
    }
    match (path, input) {
        (Path::Gemm(wc), Input::Quantized(a)) => {
            let g = Gather {
                w0,
                w1,
                ty,
                rb,
                n_out: p.n_out,
                n_in: p.n_in,
                tiles: t.tiles,
                n_tiles: t.n_tiles,
                tiles_max: t.max,
                src: t.src,
                div: t.div,
                stride: t.stride,
                out,
                positions,
                wts,
                clamp,
            };
            matmul::gathered_tiled(be, &g, wc, gu, split_tokens, a)
        }
        (Path::Mv, Input::Quantized(a)) if be.warp_mv() => {
            let suffix = kernel_suffix(ty).expect("bound weights have a CUDA type");
            let name = format!("moe_dv{}_{suffix}", if gu { "gu" } else { "" });
            let grid = (p.n_out.div_ceil(DV_ROWS) as u32, t.max as u32, 1);
            let (n_out_i, n_in_i) = (p.n_out as i32, p.n_in as i32);
            launch!(be, name.as_str(), grid, ((32 * DV_ROWS) as u32, 0);
                &w0, &w1, &rb, &n_out_i, &n_in_i, &t.tiles, &t.n_tiles, &t.src, &t.div,
                &t.stride, &a.aq, &a.ad, &a.asum, &a.bs, &out, &wts, &clamp)
        }
        (Path::Mv, Input::Quantized(a)) => {
            let (nr, smem) = mv_shape(ty, p.n_in, gu)?;
            let suffix = kernel_suffix(ty).expect("bound weights have a CUDA type");
            let name = format!("moe_mv{}_{suffix}", if gu { "gu" } else { "" });
            let grid = (
                p.n_out.div_ceil(if gu { nr / 2 } else { nr }) as u32,
                t.max as u32,
                1,
            );
            let (n_out_i, n_in_i, nr_i) = (p.n_out as i32, p.n_in as i32, nr as i32);
            launch!(be, name.as_str(), grid, (128, smem as u32);
                &w0, &w1, &rb, &n_out_i, &n_in_i, &nr_i, &t.tiles, &t.n_tiles, &t.src, &t.div,
                &t.stride, &a.aq, &a.ad, &a.asum, &a.bs, &out, &wts, &clamp)
        }
        (Path::Float { round16 }, Input::F32(x)) => {
            let round16 = i32::from(round16);
            let (nr, smem) = mv_shape(ty, p.n_in, gu)?;
            let suffix = kernel_suffix(ty).expect("bound weights have a CUDA type");
            let name = format!("moe_f{}_{suffix}", if gu { "gu" } else { "" });
            let grid = (
                p.n_out.div_ceil(if gu { nr / 2 } else { nr }) as u32,
                t.max as u32,
                1,
            );
            let (n_out_i, n_in_i, nr_i) = (p.n_out as i32, p.n_in as i32, nr as i32);
            launch!(be, name.as_str(), grid, (128, smem as u32);
                &w0, &w1, &rb, &n_out_i, &n_in_i, &nr_i, &t.tiles, &t.n_tiles, &t.src, &t.div,
                &t.stride, &x, &round16, &out, &wts, &clamp)
        }
        _ => unreachable!("a projection reads the input its path quantized for"),
    }
}

/// Weight rows per matvec block (gate and up rows counted apart) and its
/// shared memory: about [`MV_ITEMS`] weight blocks a block.
fn mv_shape(ty: GgmlType, n_in: usize, gu: bool) -> Result<(usize, usize), BackendError> {
    // Blocks of 256 values for K-quants and IQ2_XXS, else of 32.
    let per_block = if ty.block_size() == 256 { 256 } else { 32 };
    let nb = n_in / per_block;
    let mut nr = (MV_ITEMS / nb.max(1)).max(1);
    if gu {
        nr = nr.max(2).next_multiple_of(2);
    }
    let smem = 4 * MV_TOKENS + 4 * nr * MV_TOKENS * nb;
    if smem > MV_SMEM {
        return Err(shape_err(
            "moe",
            format!("rows of {n_in} values are too wide for the expert matvecs"),
        ));
    }
    Ok((nr, smem))
}

pub(super) fn matmul_grouped(
    be: &CudaBackend,
    w: &CudaWeight,
    x: &CudaTensor,
    groups: usize,
    out: &mut CudaTensor,
) -> Result<(), BackendError> {
    if groups == 0
        || !w.rows.is_multiple_of(groups)
        || x.cols != groups * w.cols
        || out.cols != w.rows
        || out.rows != x.rows
    {
        return Err(shape_err(
            "matmul_grouped",
            format!(
                "{} is [{}, {}] in {groups} groups, x is [{}, {}], out is [{}, {}]",
                w.name, w.rows, w.cols, x.rows, x.cols, out.rows, out.cols
            ),
        ));
    }
    if w.ggml_type == GgmlType::I32 {
        return Err(BackendError::BadWeight {
            name: w.name.clone(),
            problem: "an i32 table is not a matrix a matmul can apply".into(),
        });
    }
    let (m, n, rows) = (w.rows / groups, w.cols, x.rows);
    if rows == 0 || m == 0 {
        return Ok(());
    }
    // Virtual rows v = r · groups + g: x as [v, n], out as [v, m].
    let virt = rows * groups;
    let ty = w.ggml_type;
    let gemm = rows > be.dp4a_tokens().max(MV_TOKENS);
    let path = path(be, ty, rows, gemm);
    let per = path.tile_tokens();
    // Group g's tiles: rows t0 .. t0 + per at positions t · groups + g.
    let mut words: Vec<u32> = Vec::new();
    for g in 0..groups {
        for t0 in (0..rows).step_by(per) {
            words.extend([
                g as u32,
                (t0 * groups + g) as u32,
                per.min(rows - t0) as u32,
                0,
            ]);
        }
    }
    // The activation first (quantized inside the kernel that produced it
    // where it can: nothing may be recorded between them), then the tiles.
    let input = if path.quantized() {
        let fmt = ty.vec_dot_type();
        let act = Act::at(&be.scratch(&matmul::act_sizes(fmt, virt * n))?);
        if fmt == GgmlType::Q8_K {
            // Q8_K's scales are laid out per row: quantize the virtual rows.
            matmul::quantize_rows(be, fmt, x.ptr, virt, n, &act)?;
        } else {
            // Per 32 values: the same bytes for either view (n % 32 == 0).
            matmul::quantize(be, fmt, x, &act)?;
        }
        Some(act)
    } else {
        None
    };
    if let (1, Path::Mv, Some(act)) = (rows, path, &input) {
        if matmul::mvs_fits(be, w) {
            // One row of Q8_0: the staged matvec, same bits as the tiles'.
            return matmul::grouped_matvec(be, w, m, act, out.ptr);
        }
        if be.grouped_mv() {
            // The dense decode matvec, each row on its group's input.
            if let Some(r) = matmul::grouped_dense_matvec(be, w, m, act, out.ptr) {
                return r;
            }
        }
    }
    let n_tiles = words.len() / 4;
    let t = Tiles {
        tiles: be.upload_cached(&words)?,
        n_tiles: be.upload_cached(&[n_tiles as u32])?,
        max: n_tiles,
        src: 0,
        div: 1,
        stride: groups as i32,
    };
    let proj = Proj {
        w0: w,
        w1: None,
        n_out: m,
        n_in: n,
    };
    let input = match &input {
        Some(act) => Input::Quantized(act),
        None => Input::F32(x.ptr),
    };
    project(
        be,
        path,
        &proj,
        &t,
        input,
        out.ptr,
        virt,
        0,
        0.0,
        Some(rows),
    )
}

pub(super) fn route(
    be: &CudaBackend,
    logits: &CudaTensor,
    bias: Option<&CudaWeight>,
    hash: Option<(&CudaWeight, &[u32])>,
    cfg: &RouteConfig,
    ids: &mut CudaTensor,
    weights: &mut CudaTensor,
) -> Result<(), BackendError> {
    let (rows, n_expert, k) = (logits.rows, logits.cols, cfg.k);
    if ids.cols != k || weights.cols != k || ids.rows != rows || weights.rows != rows {
        return Err(shape_err(
            "moe_route",
            format!(
                "{rows} rows of {n_expert} logits into ids [{}, {}] and weights [{}, {}], k = {k}",
                ids.rows, ids.cols, weights.rows, weights.cols
            ),
        ));
    }
    if k == 0 || k > n_expert || k > 32 || n_expert > MAX_EXPERTS {
        return Err(shape_err(
            "moe_route",
            format!(
                "{k} of {n_expert} experts: the CUDA kernel takes 1 to 32 of at most {MAX_EXPERTS}"
            ),
        ));
    }
    let mut bias_ptr = 0u64;
    let (mut hash_ptr, mut tok_ptr) = (0u64, 0u64);
    match hash {
        Some((table, tokens)) => {
            if table.ggml_type != GgmlType::I32 {
                return Err(shape_err(
                    "moe_route",
                    format!(
                        "hash table {} is {}, expected i32",
                        table.name, table.ggml_type
                    ),
                ));
            }
            if tokens.len() != rows || table.cols != k {
                return Err(shape_err(
                    "moe_route",
                    format!(
                        "{} tokens for {rows} rows, hash rows of {} for k = {k}",
                        tokens.len(),
                        table.cols
                    ),
                ));
            }
            if let Some(&t) = tokens.iter().find(|&&t| t as usize >= table.rows) {
                return Err(shape_err(
                    "moe_route",
                    format!("token {t} is outside the hash table of {} rows", table.rows),
                ));
            }
            hash_ptr = be.weight_ptr(table);
            if rows > 0 {
                tok_ptr = be.upload_cached(tokens)?;
            }
        }
        None => {
            if let Some(b) = bias {
                if b.rows != 1 || b.cols != n_expert {
                    return Err(shape_err(
                        "moe_route",
                        format!(
                            "bias {} is [{}, {}], expected one row of {n_expert}",
                            b.name, b.rows, b.cols
                        ),
                    ));
                }
                bias_ptr = be.dense_ptr(b);
            }
        }
    }
    if rows == 0 {
        return Ok(());
    }
    let (lp, ip, wp) = (logits.ptr, ids.ptr, weights.ptr);
    let (rows_i, ne_i, k_i) = (rows as i32, n_expert as i32, k as i32);
    // Four rows (warps) a block, each with its n_expert f64 scores.
    let smem = (4 * n_expert * 8) as u32;
    launch!(be, "moe_route", (rows.div_ceil(4) as u32, 1, 1), (128, smem);
        &lp, &bias_ptr, &hash_ptr, &tok_ptr, &ip, &wp, &rows_i, &ne_i, &k_i, &cfg.scale)
}

#[allow(clippy::too_many_arguments)]
pub(super) fn experts(
    be: &CudaBackend,
    gate: &CudaWeight,
    up: &CudaWeight,
    down: &CudaWeight,
    n_expert: usize,
    x: &CudaTensor,
    ids: &CudaTensor,
    weights: &CudaTensor,
    clamp: f32,
    out: &mut CudaTensor,
) -> Result<(), BackendError> {
    let d = x.cols;
    let n_ff = gate.rows / n_expert.max(1);
    if n_expert == 0
        || gate.rows != n_expert * n_ff
        || up.rows != gate.rows
        || gate.cols != d
        || up.cols != d
        || down.rows != n_expert * d
        || down.cols != n_ff
        || ids.rows != x.rows
        || weights.rows != x.rows
        || ids.cols != weights.cols
        || out.rows != x.rows
        || out.cols != d
    {
        return Err(shape_err(
            "moe_experts",
            format!(
                "{n_expert} experts: gate [{}, {}], up [{}, {}], down [{}, {}], x [{}, {d}], ids [{}, {}], out [{}, {}]",
                gate.rows, gate.cols, up.rows, up.cols, down.rows, down.cols, x.rows, ids.rows, ids.cols, out.rows, out.cols
            ),
        ));
    }
    let (rows, k) = (x.rows, ids.cols);
    if gate.ggml_type != up.ggml_type {
        return Err(shape_err(
            "moe_experts",
            format!(
                "gate is {} and up is {}: the CUDA kernels read them together",
                gate.ggml_type, up.ggml_type
            ),
        ));
    }
    if [gate, down].iter().any(|w| w.ggml_type == GgmlType::I32) {
        return Err(shape_err(
            "moe_experts",
            "an i32 table is not an expert weight".into(),
        ));
    }
    if k > MAX_K || n_expert > MAX_EXPERTS {
        return Err(shape_err(
            "moe_experts",
            format!(
                "{k} slots of {n_expert} experts: the CUDA kernels take at most {MAX_K} of {MAX_EXPERTS}"
            ),
        ));
    }
    if rows == 0 {
        return Ok(());
    }
    let n = rows * k;
    let (k_i, d_i) = (k as i32, d as i32);
    if k == 0 {
        // No experts: moe_reduce writes zeros.
        let pos = 0u64;
        return launch!(be, "moe_reduce", (rows as u32, d.div_ceil(512) as u32, 1), 128;
            &0u64, &pos, &ids.ptr, &out.ptr, &k_i, &d_i);
    }
    // Entries per active expert, at most n_expert of them active.
    let avg = n / n_expert.min(n);
    let gemm = avg >= GEMM_TOKENS;
    let gu_path = path(be, gate.ggml_type, avg, gemm);
    let down_path = path(be, down.ggml_type, avg, gemm);
    let (bn_a, bn_b) = (gu_path.tile_tokens(), down_path.tile_tokens());
    let max_a = n_expert.min(n) + n / bn_a;
    let max_b = n_expert.min(n) + n / bn_b;

    // Scratch: x quantized, the plan, h (and h quantized), y.
    let fmt_a = gate.ggml_type.vec_dot_type();
    let fmt_b = down.ggml_type.vec_dot_type();
    let mut sizes: Vec<usize> = Vec::new();
    if gu_path.quantized() {
        sizes.extend(matmul::act_sizes(fmt_a, rows * d));
    }
    let plan_at = sizes.len();
    sizes.extend([4 * n, 4 * n, 16 * max_a, 16 * max_b, 8, 4 * n * n_ff]);
    let hq_at = sizes.len();
    if down_path.quantized() {
        sizes.extend(matmul::act_sizes(fmt_b, n * n_ff));
    }
    let y_at = sizes.len();
    sizes.push(4 * n * d);
    let s = be.scratch(&sizes)?;
    let (ent, pos, tiles_a, tiles_b, n_tiles, h) = (
        s[plan_at],
        s[plan_at + 1],
        s[plan_at + 2],
        s[plan_at + 3],
        s[plan_at + 4],
        s[plan_at + 5],
    );
    let y = s[y_at];

    // x quantized first: inside the kernel that produced it where it can.
    let act_x = gu_path.quantized().then(|| Act::at(&s[0..4]));
    if let Some(a) = &act_x {
        matmul::quantize(be, fmt_a, x, a)?;
    }

    // The plan.
    let plan_smem = (4 * (PLAN_WARPS + 1) * n_expert) as u32;
    let (n_i, ne_i, bn_a_i, bn_b_i) = (n as i32, n_expert as i32, bn_a as i32, bn_b as i32);
    launch!(be, "moe_plan", (1, 1, 1), (32 * PLAN_WARPS as u32, plan_smem);
        &ids.ptr, &n_i, &ne_i, &bn_a_i, &bn_b_i, &ent, &pos, &tiles_a, &tiles_b, &n_tiles)?;

    // Gate and up, SwiGLU, route weight: h[p] for every entry position p.
    let gu = Proj {
        w0: gate,
        w1: Some(up),
        n_out: n_ff,
        n_in: d,
    };
    let ta = Tiles {
        tiles: tiles_a,
        n_tiles,
        max: max_a,
        src: ent,
        div: k as i32,
        stride: 1,
    };
    let input = match &act_x {
        Some(a) => Input::Quantized(a),
        None => Input::F32(x.ptr),
    };
    project(be, gu_path, &gu, &ta, input, h, n, weights.ptr, clamp, None)?;

    // Down: y[p].
    let act_h = down_path.quantized().then(|| Act::at(&s[hq_at..hq_at + 4]));
    if let Some(a) = &act_h {
        matmul::quantize_rows(be, fmt_b, h, n, n_ff, a)?;
    }
    let dn = Proj {
        w0: down,
        w1: None,
        n_out: d,
        n_in: n_ff,
    };
    let tb = Tiles {
        tiles: tiles_b,
        n_tiles: n_tiles + 4,
        max: max_b,
        src: 0,
        div: 1,
        stride: 1,
    };
    let input = match &act_h {
        Some(a) => Input::Quantized(a),
        None => Input::F32(h),
    };
    project(be, down_path, &dn, &tb, input, y, n, 0, 0.0, None)?;

    // out[r]: the row's entries in ascending expert order.
    launch!(be, "moe_reduce", (rows as u32, d.div_ceil(512) as u32, 1), 128;
        &y, &pos, &ids.ptr, &out.ptr, &k_i, &d_i)
}
