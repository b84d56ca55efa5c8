//! Parity of the CUDA backend's compressed-attention ops (pool, raw-row
//! stores, compressors, the indexer's selection, attention with sinks)
//! with the CPU reference, on random data. GPU tests: `#[ignore]`d, run on
//! the GPU machine with `--ignored --test-threads=1`
//! (`scripts/device/cuda-tests.sh`).
//!
//! The same pool is built on both backends and driven through the same
//! steps: several sequences prefilling in chunks that cross window and
//! block boundaries, a sequence resumed at a block boundary from another
//! one's carry, then decode steps. Each check prints `PARITY <name>
//! max_abs=<..> rel=<..> tol=<..>` (`rel = max |gpu - cpu| / max |cpu|`).
//! Tolerances:
//!
//! - raw rows and carries: 0 (the same values stored, in the same dtype);
//! - pooled and indexer rows: 1e-6. The GPU pools, normalizes and rotates
//!   in f64 in the CPU's order (only the norm's f64 sum is ordered
//!   differently) and emulates the FP8 / FP4 rounding exactly, so the
//!   rows agree bit for bit unless an ulp of f64 `exp`, `sin` or `cos`
//!   moves a value across an f32 rounding (about 1e-8 a value);
//! - attention: 1e-5, f32 dot products and softmax against the CPU's f64
//!   (heads of up to 512 values, up to a few hundred keys);
//! - the indexer's selection: the index sets exactly, wherever the top-k
//!   boundary has a margin (the k-th best score above the next by more
//!   than 1e-4 of the largest score, in the test's own f64 scores): the
//!   GPU sums the scores in f32 (tensor cores or f32 FMAs), which can
//!   reorder scores within about 1e-6 of each other. Rows without that
//!   margin are counted and skipped (the test fails if more than a tenth
//!   of the rows are); the dedicated indexer test draws its queries until
//!   every row has the margin, and plants an exact tie at the boundary
//!   (identical indexer rows), which must go to the lower index.
#![cfg(feature = "cuda")]

mod cuda_common;

use cuda_common::*;
use ds4_kernels::backend::{
    CompressedAttentionConfig, CompressedPoolConfig, CompressedSeq, CompressorConfig,
    CompressorKind, TailRope,
};
use ds4_kernels::quant::GgmlType;
use ds4_kernels::{Backend, CpuBackend, Numerics};

const WINDOW: usize = 128;
const BS: usize = 128;

/// Model shape of a scenario.
#[derive(Clone)]
struct Shape {
    ratios: Vec<usize>,
    head_dim: usize,
    index_dim: usize,
    /// Attention heads.
    n_head: usize,
    /// Indexer heads.
    ix_heads: usize,
    top_k: usize,
}

fn tiny() -> Shape {
    Shape {
        ratios: vec![0, 0, 4, 128, 4],
        head_dim: 128,
        index_dim: 128,
        n_head: 4,
        ix_heads: 4,
        top_k: 8,
    }
}

fn flash_width() -> Shape {
    Shape {
        ratios: vec![4, 128],
        head_dim: 512,
        index_dim: 128,
        n_head: 64,
        ix_heads: 64,
        top_k: 16,
    }
}

fn pool_config(shape: &Shape, f16_rows: bool, n_blocks: usize) -> CompressedPoolConfig {
    CompressedPoolConfig {
        ratios: shape.ratios.clone().into(),
        head_dim: shape.head_dim,
        index_dim: shape.index_dim,
        window: WINDOW,
        block_size: BS,
        n_blocks,
        n_window_blocks: n_blocks,
        n_slots: 4,
        f16_rows,
    }
}

/// The compressed-row RoPE of the DeepSeek V4 layers (plain frequencies of
/// base 160000 over the last 64 dims).
fn rope() -> TailRope {
    TailRope {
        omega: (0..32)
            .map(|k| 160000f64.powf(-2.0 * k as f64 / 64.0))
            .collect::<Vec<_>>()
            .into(),
    }
}

/// Where layer `l`'s pooled rows and indexer rows start in a block, in
/// values (the layout of `CompressedPoolConfig::block_values`).
fn row_offsets(cfg: &CompressedPoolConfig, l: usize) -> (usize, usize) {
    let mut at = 0;
    for (i, &r) in cfg.ratios.iter().enumerate() {
        let n = cfg.rows_per_block(r);
        if i == l {
            return (at, at + n * cfg.head_dim);
        }
        at += n * cfg.head_dim + if r == 4 { n * cfg.index_dim } else { 0 };
    }
    unreachable!("layer {l} of {}", cfg.ratios.len())
}

/// Row values of a block or window block's bytes.
fn values(bytes: &[u8], f16_rows: bool) -> Vec<f32> {
    if f16_rows {
        bytes
            .chunks_exact(2)
            .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect()
    } else {
        bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    }
}

fn weight_of(values: &[f32], ty: GgmlType) -> Vec<u8> {
    match ty {
        GgmlType::F16 => values.iter().flat_map(|&v| f16_bytes(v)).collect(),
        _ => f32_bytes(values),
    }
}

/// One layer's weights on one backend.
struct LayerW<B: Backend> {
    /// Attention compressor: position bias and norm.
    comp: Option<(B::Weight, B::Weight)>,
    /// Indexer compressor (ratio 4).
    index: Option<(B::Weight, B::Weight)>,
    sinks: B::Weight,
}

/// Host values of a compressor's position bias and norm.
type CompHost = Option<(Vec<f32>, Vec<f32>)>;

/// Host values of every layer's weights, bound on either backend alike:
/// per layer the attention compressor's, the indexer compressor's, and
/// the sinks.
struct HostW {
    ty: GgmlType,
    layers: Vec<(CompHost, CompHost, Vec<f32>)>,
}

impl HostW {
    fn new(shape: &Shape, ty: GgmlType, rng: &mut Rng) -> HostW {
        let comp = |rng: &mut Rng, r: usize, dim: usize| {
            let lanes = if r == 4 { 2 } else { 1 };
            let ape = rng.vec(r * lanes * dim, 0.5);
            let norm: Vec<f32> = (0..dim).map(|_| 1.0 + 0.5 * rng.f()).collect();
            (ape, norm)
        };
        let layers = shape
            .ratios
            .iter()
            .map(|&r| {
                let c = (r > 0).then(|| comp(rng, r, shape.head_dim));
                let i = (r == 4).then(|| comp(rng, 4, shape.index_dim));
                (c, i, rng.vec(shape.n_head, 1.0))
            })
            .collect();
        HostW { ty, layers }
    }

    fn bind<B: Backend>(&self, be: &B, shape: &Shape) -> Vec<LayerW<B>> {
        let one = |name: &str, v: &[f32]| bind(be, name, GgmlType::F32, 1, v.len(), &f32_bytes(v));
        let pair = |p: &Option<(Vec<f32>, Vec<f32>)>, r: usize| {
            p.as_ref().map(|(ape, norm)| {
                let width = ape.len() / r;
                (
                    bind(be, "ape", self.ty, r, width, &weight_of(ape, self.ty)),
                    one("norm", norm),
                )
            })
        };
        self.layers
            .iter()
            .zip(&shape.ratios)
            .map(|((c, i, sinks), &r)| LayerW {
                comp: pair(c, r.max(1)),
                index: pair(i, 4),
                sinks: one("sinks", sinks),
            })
            .collect()
    }
}

/// Host inputs of one step for one layer.
struct LayerIn {
    kv: Vec<f32>,
    k: Vec<f32>,
    s: Vec<f32>,
    ik: Vec<f32>,
    is: Vec<f32>,
    iq: Vec<f32>,
    iw: Vec<f32>,
    q: Vec<f32>,
}

fn step_inputs(shape: &Shape, rows: usize, round: bool, rng: &mut Rng) -> Vec<LayerIn> {
    let cpu = CpuBackend::new();
    shape
        .ratios
        .iter()
        .map(|&r| {
            let width = if r == 4 { 2 } else { 1 } * shape.head_dim;
            let iwidth = 2 * shape.index_dim;
            let mut iq = rng.vec(rows * shape.ix_heads * shape.index_dim, 1.0);
            if round && r == 4 {
                // Production queries are rotated and rounded (FP4 values).
                let mut t = cpu.tensor_from(rows, shape.ix_heads * shape.index_dim, &iq);
                cpu.round_indexer(&mut t, shape.index_dim);
                iq = t.data;
            }
            LayerIn {
                kv: rng.vec(rows * shape.head_dim, 1.0),
                k: rng.vec(rows * width, 1.0),
                s: rng.vec(rows * width, 2.0),
                ik: rng.vec(rows * iwidth, 1.0),
                is: rng.vec(rows * iwidth, 2.0),
                iw: rng.vec(rows * shape.ix_heads, 0.2),
                iq,
                q: rng.vec(rows * shape.n_head * shape.head_dim, 2.0),
            }
        })
        .collect()
}

/// One layer's outputs of a step.
struct LayerOut {
    selection: Option<Vec<f32>>,
    attention: Vec<f32>,
    /// Ratio 4: attention over every visible pooled row.
    attention_all: Option<Vec<f32>>,
}

/// Runs one step's ops for every layer: raw rows, compressors, the
/// indexer, attention (over `selections[l]` where given, else over the
/// backend's own selection).
#[allow(clippy::too_many_arguments)]
fn run_step<B: Backend>(
    be: &B,
    pool: &mut B::CompressedPool,
    w: &[LayerW<B>],
    shape: &Shape,
    seqs: &[CompressedSeq<'_>],
    inputs: &[LayerIn],
    rows: usize,
    round: bool,
    selections: Option<&[Option<Vec<f32>>]>,
) -> Vec<LayerOut> {
    let (hd, id) = (shape.head_dim, shape.index_dim);
    let mut outs = Vec::new();
    for (l, (&r, x)) in shape.ratios.iter().zip(inputs).enumerate() {
        let kv = be.tensor_from(rows, hd, &x.kv);
        be.window_store(pool, l, seqs, &kv).expect("window_store");
        let cc = |kind, ratio| CompressorConfig {
            kind,
            ratio,
            norm_eps: 1e-6,
            rope: rope(),
            round,
        };
        if let Some((ape, norm)) = &w[l].comp {
            let width = if r == 4 { 2 * hd } else { hd };
            let (k, s) = (
                be.tensor_from(rows, width, &x.k),
                be.tensor_from(rows, width, &x.s),
            );
            let c = cc(CompressorKind::Attention, r);
            be.compress(pool, l, seqs, &k, &s, ape, norm, &c)
                .expect("compress");
        }
        let mut selection = None;
        if let Some((ape, norm)) = &w[l].index {
            let (k, s) = (
                be.tensor_from(rows, 2 * id, &x.ik),
                be.tensor_from(rows, 2 * id, &x.is),
            );
            let c = cc(CompressorKind::Indexer, 4);
            be.compress(pool, l, seqs, &k, &s, ape, norm, &c)
                .expect("compress (indexer)");
            let q = be.tensor_from(rows, shape.ix_heads * id, &x.iq);
            let wt = be.tensor_from(rows, shape.ix_heads, &x.iw);
            let mut out = be.tensor(rows, shape.top_k);
            be.indexer_select(pool, l, seqs, &q, &wt, shape.top_k, &mut out)
                .expect("indexer_select");
            selection = Some(be.to_host(&out));
        }
        let acfg = CompressedAttentionConfig {
            n_head: shape.n_head,
            head_dim: hd,
            ratio: r,
            scale: 1.0 / (hd as f32).sqrt(),
        };
        let q = be.tensor_from(rows, shape.n_head * hd, &x.q);
        let attend = |sel: Option<&[f32]>, pool: &mut B::CompressedPool| {
            let sel = sel.map(|s| be.tensor_from(rows, shape.top_k, s));
            let mut out = be.tensor(rows, shape.n_head * hd);
            be.compressed_attention(
                &q,
                pool,
                l,
                seqs,
                sel.as_ref(),
                &w[l].sinks,
                &acfg,
                &mut out,
            )
            .expect("compressed_attention");
            be.to_host(&out)
        };
        let use_sel = selections
            .and_then(|s| s[l].as_deref())
            .or(selection.as_deref());
        let attention = attend(use_sel, pool);
        let attention_all = (r == 4).then(|| attend(None, pool));
        outs.push(LayerOut {
            selection,
            attention,
            attention_all,
        });
    }
    outs
}

/// A sequence of a scenario: its slot and tables, and where it is.
struct Seq {
    slot: u32,
    blocks: Vec<u32>,
    window: Vec<u32>,
    pos: usize,
}

/// The test's own f64 indexer scores of `row` (at position `p`) over the
/// sequence's indexer rows in the CPU pool.
#[allow(clippy::too_many_arguments)]
fn scores_f64(
    c: &CpuBackend,
    pool: &<CpuBackend as Backend>::CompressedPool,
    cfg: &CompressedPoolConfig,
    layer: usize,
    blocks: &[u32],
    q: &[f32],
    w: &[f32],
    p: usize,
) -> Vec<f64> {
    let id = cfg.index_dim;
    let (_, index_at) = row_offsets(cfg, layer);
    let per = BS / 4;
    let mut cache: Vec<Option<Vec<f32>>> = vec![None; blocks.len()];
    (0..(p + 1) / 4)
        .map(|ci| {
            let bi = ci / per;
            let vals = cache[bi].get_or_insert_with(|| {
                let mut b = vec![0u8; cfg.block_bytes()];
                c.compressed_read_block(pool, blocks[bi], &mut b).unwrap();
                values(&b, cfg.f16_rows)
            });
            let key = &vals[index_at + (ci % per) * id..][..id];
            q.chunks_exact(id)
                .zip(w)
                .map(|(qh, &wh)| {
                    let dot: f64 = qh
                        .iter()
                        .zip(key)
                        .map(|(&a, &b)| f64::from(a) * f64::from(b))
                        .sum();
                    f64::from(wh) * dot.max(0.0)
                })
                .sum()
        })
        .collect()
}

/// The gap between the k-th and the (k+1)-th best of `scores`, relative to
/// the largest magnitude (infinite when all are selected).
fn margin(scores: &[f64], k: usize) -> f64 {
    if scores.len() <= k {
        return f64::INFINITY;
    }
    let mut s = scores.to_vec();
    s.sort_by(|a, b| b.total_cmp(a));
    let top = s
        .iter()
        .fold(0f64, |m, v| m.max(v.abs()))
        .max(f64::MIN_POSITIVE);
    (s[k - 1] - s[k]) / top
}

const MARGIN: f64 = 1e-4;

/// Drives both backends through a scenario and compares every output.
fn scenario(
    name: &str,
    shape: Shape,
    f16_rows: bool,
    round: bool,
    numerics: Numerics,
    plan: &[Vec<(usize, usize)>],
) {
    let (g, c) = (gpu(numerics), CpuBackend::new());
    let n_blocks = 24;
    let cfg = pool_config(&shape, f16_rows, n_blocks);
    let mut gp = g.compressed_pool(&cfg).expect("GPU pool");
    let mut cp = c.compressed_pool(&cfg).expect("CPU pool");
    let mut rng = Rng::new(0xC0 + shape.head_dim as u64 + f16_rows as u64);
    let ty = if f16_rows {
        GgmlType::F16
    } else {
        GgmlType::F32
    };
    let host_w = HostW::new(&shape, ty, &mut rng);
    let (gw, cw) = (host_w.bind(g, &shape), host_w.bind(&c, &shape));
    // A and B start empty; C resumes at position 256 from A's carry at the
    // end of A's second block, sharing A's first two blocks.
    let mut seqs = [
        Seq {
            slot: 0,
            blocks: vec![0, 1, 2, 3, 4],
            window: vec![0, 1, 2, 3, 4],
            pos: 0,
        },
        Seq {
            slot: 1,
            blocks: vec![5, 6, 7, 8],
            window: vec![5, 6, 7, 8],
            pos: 0,
        },
        Seq {
            slot: 2,
            blocks: vec![0, 1, 9, 10, 11],
            window: vec![u32::MAX, 1, 9, 10, 11],
            pos: 256,
        },
    ];
    for s in &seqs[..2] {
        g.compressed_begin(&mut gp, s.slot, None).unwrap();
        c.compressed_begin(&mut cp, s.slot, None).unwrap();
    }
    let mut begun_c = false;
    let (mut sel_rows, mut sel_skipped) = (0usize, 0usize);
    for (step, batch) in plan.iter().enumerate() {
        if !begun_c && batch.iter().any(|&(i, _)| i == 2) {
            assert!(seqs[0].pos >= 256, "C resumes after A passed position 255");
            g.compressed_begin(&mut gp, 2, Some(1)).unwrap();
            c.compressed_begin(&mut cp, 2, Some(1)).unwrap();
            begun_c = true;
        }
        let mut row = 0;
        let cs: Vec<CompressedSeq<'_>> = batch
            .iter()
            .map(|&(i, n)| {
                let s = &seqs[i];
                let cs = CompressedSeq {
                    blocks: &s.blocks,
                    window: &s.window,
                    slot: s.slot,
                    row,
                    n_rows: n,
                    pos: s.pos,
                };
                row += n;
                cs
            })
            .collect();
        let rows = row;
        let inputs = step_inputs(&shape, rows, round, &mut rng);
        let want = run_step(&c, &mut cp, &cw, &shape, &cs, &inputs, rows, round, None);
        let sels: Vec<Option<Vec<f32>>> = want.iter().map(|o| o.selection.clone()).collect();
        let got = run_step(
            g,
            &mut gp,
            &gw,
            &shape,
            &cs,
            &inputs,
            rows,
            round,
            Some(&sels),
        );
        for (l, (gl, cl)) in got.iter().zip(&want).enumerate() {
            let tag = format!("{name}_step{step}_layer{l}");
            check(
                &format!("{tag}_attention"),
                &gl.attention,
                &cl.attention,
                1e-5,
            );
            if let (Some(ga), Some(ca)) = (&gl.attention_all, &cl.attention_all) {
                check(&format!("{tag}_attention_all"), ga, ca, 1e-5);
            }
            let (Some(gs), Some(csel)) = (&gl.selection, &cl.selection) else {
                continue;
            };
            let k = shape.top_k;
            let width = shape.ix_heads * shape.index_dim;
            for (&(si, _), s) in batch.iter().zip(&cs) {
                for i in 0..s.n_rows {
                    let (r, p) = (s.row + i, s.pos + i);
                    let iq = &inputs[l].iq[r * width..][..width];
                    let iw = &inputs[l].iw[r * shape.ix_heads..][..shape.ix_heads];
                    let sc = scores_f64(&c, &cp, &cfg, l, &seqs[si].blocks, iq, iw, p);
                    sel_rows += 1;
                    if margin(&sc, k) < MARGIN {
                        sel_skipped += 1;
                        continue;
                    }
                    assert_eq!(
                        &gs[r * k..(r + 1) * k],
                        &csel[r * k..(r + 1) * k],
                        "{tag}: selection of row {r} (position {p})"
                    );
                }
            }
        }
        drop(cs);
        for &(i, n) in batch {
            seqs[i].pos += n;
        }
    }
    println!(
        "PARITY {name}_selection rows={sel_rows} skipped_without_margin={sel_skipped} max_abs=0 rel=0 tol=0"
    );
    assert!(
        sel_skipped * 10 <= sel_rows,
        "{name}: {sel_skipped} of {sel_rows} rows had no selection margin"
    );
    // Every block and window block, byte layouts as the CPU's.
    let (mut gb, mut cb) = (vec![0u8; cfg.block_bytes()], vec![0u8; cfg.block_bytes()]);
    let (mut pooled_g, mut pooled_c) = (Vec::new(), Vec::new());
    for b in 0..n_blocks as u32 {
        g.compressed_read_block(&gp, b, &mut gb).unwrap();
        c.compressed_read_block(&cp, b, &mut cb).unwrap();
        pooled_g.extend(values(&gb, f16_rows));
        pooled_c.extend(values(&cb, f16_rows));
    }
    assert!(
        pooled_c.iter().any(|&v| v != 0.0),
        "the scenario wrote pooled rows"
    );
    check(&format!("{name}_pooled_rows"), &pooled_g, &pooled_c, 1e-6);
    let raw = cfg.window_raw_values() * cfg.row_bytes();
    let (mut gwb, mut cwb) = (vec![0u8; cfg.window_bytes()], vec![0u8; cfg.window_bytes()]);
    let (mut raw_g, mut raw_c, mut carry_g, mut carry_c) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for w in 0..n_blocks as u32 {
        g.window_read(&gp, w, &mut gwb).unwrap();
        c.window_read(&cp, w, &mut cwb).unwrap();
        raw_g.extend(values(&gwb[..raw], f16_rows));
        raw_c.extend(values(&cwb[..raw], f16_rows));
        carry_g.extend(values(&gwb[raw..], false));
        carry_c.extend(values(&cwb[raw..], false));
    }
    check(&format!("{name}_raw_rows"), &raw_g, &raw_c, 0.0);
    if shape.ratios.contains(&4) {
        assert!(
            carry_c.iter().any(|&v| v != 0.0),
            "the scenario wrote carries"
        );
    }
    check(&format!("{name}_carries"), &carry_g, &carry_c, 0.0);
}

/// Steps of a scenario: (sequence, rows) per step; sequence 0 (A) and 1
/// (B) start at 0, 2 (C) at 256 from A's carry.
fn plan(a: [usize; 2], b: [usize; 2], c: usize, decode: usize) -> Vec<Vec<(usize, usize)>> {
    let mut p = vec![vec![(0, a[0]), (1, b[0])], vec![(0, a[1]), (1, b[1])]];
    p.push(vec![(2, c), (0, 1), (1, 1)]);
    p.extend((0..decode).map(|_| vec![(0, 1), (1, 1), (2, 1)]));
    p
}

/// The tiny model's shapes: A prefills 0..200 then 200..330 (windows and
/// blocks 0 and 1 completed, carries at 127 and 255), B 0..77 then
/// 77..250; C resumes at 256 with 44 rows while A and B decode; then 8
/// decode steps (B completes its block at 255).
fn tiny_plan() -> Vec<Vec<(usize, usize)>> {
    plan([200, 130], [77, 173], 44, 8)
}

/// Heads of 512 (ratios 4 and 128), shorter chunks.
fn flash_plan() -> Vec<Vec<(usize, usize)>> {
    plan([150, 110], [60, 190], 20, 6)
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn tiny_production_f16_rows() {
    scenario(
        "tiny_f16",
        tiny(),
        true,
        true,
        Numerics::Production,
        &tiny_plan(),
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn tiny_exact_f32_rows() {
    scenario(
        "tiny_f32",
        tiny(),
        false,
        false,
        Numerics::Exact,
        &tiny_plan(),
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn flash_width_production_f16_rows() {
    scenario(
        "flash_f16",
        flash_width(),
        true,
        true,
        Numerics::Production,
        &flash_plan(),
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn flash_width_f32_rows_rounded() {
    scenario(
        "flash_f32",
        flash_width(),
        false,
        true,
        Numerics::Exact,
        &flash_plan(),
    );
}

/// The indexer alone at top 512 over 5,120 indexer rows written directly
/// (FP4-rounded values), three sequences sharing them: one decode row
/// seeing all of them (two compaction rounds of the top-k kernel), nine
/// rows seeing about 750 (groups of 4, 4 and 1) and two seeing 25 (all
/// selected, padded with -1). Queries are drawn until every row has the
/// margin; then indexer row c' = c_k + 128 m (the same place in its tile)
/// gets a copy of the decode row's 512th best row c_k, an exact tie that
/// must go to c_k.
fn indexer_case(f16_rows: bool, numerics: Numerics) {
    let (g, c) = (gpu(numerics), CpuBackend::new());
    let shape = Shape {
        ratios: vec![4],
        head_dim: 128,
        index_dim: 128,
        n_head: 1,
        ix_heads: 64,
        top_k: 512,
    };
    let (id, heads, k) = (shape.index_dim, shape.ix_heads, shape.top_k);
    let n_blocks = 160;
    let per = BS / 4;
    let n_keys = n_blocks * per;
    let cfg = pool_config(&shape, f16_rows, n_blocks);
    let mut rng = Rng::new(0x1D + f16_rows as u64);
    let round = |v: Vec<f32>, rows: usize| {
        let mut t = c.tensor_from(rows, v.len() / rows, &v);
        c.round_indexer(&mut t, id);
        t.data
    };
    let mut keys = round(rng.vec(n_keys * id, 1.0), n_keys);
    // (position, rows) per sequence.
    let layout = [(n_keys * 4 - 1, 1), (3000, 9), (100, 2)];
    let rows: usize = layout.iter().map(|l| l.1).sum();
    let score = |keys: &[f32], q: &[f32], w: &[f32], nvis: usize| -> Vec<f64> {
        (0..nvis)
            .map(|ci| {
                let key = &keys[ci * id..(ci + 1) * id];
                q.chunks_exact(id)
                    .zip(w)
                    .map(|(qh, &wh)| {
                        let dot: f64 = qh
                            .iter()
                            .zip(key)
                            .map(|(&a, &b)| f64::from(a) * f64::from(b))
                            .sum();
                        f64::from(wh) * dot.max(0.0)
                    })
                    .sum()
            })
            .collect()
    };
    let (mut q, mut w) = (Vec::new(), Vec::new());
    let mut row_pos = Vec::new();
    for &(pos, n) in &layout {
        for i in 0..n {
            row_pos.push(pos + i);
            let nvis = (pos + i + 1) / 4;
            let mut tries = 0;
            loop {
                let qr = round(rng.vec(heads * id, 1.0), 1);
                let wr = rng.vec(heads, 0.2);
                tries += 1;
                if margin(&score(&keys, &qr, &wr, nvis), k) >= MARGIN {
                    q.extend(qr);
                    w.extend(wr);
                    break;
                }
                assert!(tries < 200, "no query row with a selection margin");
            }
        }
    }
    // The planted tie, for the decode row (row 0).
    let sc = score(&keys, &q[..heads * id], &w[..heads], n_keys);
    let mut order: Vec<usize> = (0..n_keys).collect();
    order.sort_by(|&a, &b| sc[b].total_cmp(&sc[a]).then(a.cmp(&b)));
    let ck = order[k - 1];
    let cp = (1..)
        .map(|m| ck + 128 * m)
        .take_while(|&cp| cp < n_keys)
        .find(|&cp| cp >= 1000 && sc[cp] < sc[ck])
        .expect("a row to copy the boundary row to");
    keys.copy_within(ck * id..(ck + 1) * id, cp * id);
    // The blocks: pooled rows (unused) then indexer rows.
    let mut gp = g.compressed_pool(&cfg).unwrap();
    let mut cpool = c.compressed_pool(&cfg).unwrap();
    let (_, index_at) = row_offsets(&cfg, 0);
    for b in 0..n_blocks {
        let mut vals = vec![0f32; cfg.block_values()];
        vals[index_at..index_at + per * id]
            .copy_from_slice(&keys[b * per * id..(b + 1) * per * id]);
        let bytes = if f16_rows {
            weight_of(&vals, GgmlType::F16)
        } else {
            f32_bytes(&vals)
        };
        g.compressed_write_block(&mut gp, b as u32, &bytes).unwrap();
        c.compressed_write_block(&mut cpool, b as u32, &bytes)
            .unwrap();
    }
    let table: Vec<u32> = (0..n_blocks as u32).collect();
    let mut row = 0;
    let seqs: Vec<CompressedSeq<'_>> = layout
        .iter()
        .enumerate()
        .map(|(i, &(pos, n))| {
            let s = CompressedSeq {
                blocks: &table,
                window: &[],
                slot: i as u32,
                row,
                n_rows: n,
                pos,
            };
            row += n;
            s
        })
        .collect();
    let want = {
        let (qt, wt) = (
            c.tensor_from(rows, heads * id, &q),
            c.tensor_from(rows, heads, &w),
        );
        let mut out = c.tensor(rows, k);
        c.indexer_select(&cpool, 0, &seqs, &qt, &wt, k, &mut out)
            .unwrap();
        out.data
    };
    let got = {
        let (qt, wt) = (
            g.tensor_from(rows, heads * id, &q),
            g.tensor_from(rows, heads, &w),
        );
        let mut out = g.tensor(rows, k);
        g.indexer_select(&gp, 0, &seqs, &qt, &wt, k, &mut out)
            .unwrap();
        g.to_host(&out)
    };
    assert!(want[..k].contains(&(ck as f32)) && !want[..k].contains(&(cp as f32)));
    let last = &want[(rows - 1) * k..];
    assert_eq!(
        last[(row_pos[rows - 1] + 1) / 4],
        -1.0,
        "short rows are padded"
    );
    for r in 0..rows {
        assert_eq!(
            &got[r * k..(r + 1) * k],
            &want[r * k..(r + 1) * k],
            "selection of row {r} (position {})",
            row_pos[r]
        );
    }
    println!(
        "PARITY indexer_top{k}_{} rows={rows} max_abs=0 rel=0 tol=0",
        if f16_rows { "f16" } else { "f32" }
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn indexer_top512_tensor_cores() {
    indexer_case(true, Numerics::Production);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn indexer_top512_f32() {
    indexer_case(false, Numerics::Exact);
}

/// Blocks and window blocks copy in and out unchanged; the pool refuses
/// what the CPU's refuses.
#[test]
#[ignore = "needs a CUDA GPU"]
fn pool_copies_and_refusals() {
    let g = gpu(Numerics::Production);
    let shape = tiny();
    let cfg = pool_config(&shape, true, 6);
    let mut pool = g.compressed_pool(&cfg).unwrap();
    let mut rng = Rng::new(0xB10C);
    let block: Vec<u8> = (0..cfg.block_bytes()).map(|_| rng.byte()).collect();
    let window: Vec<u8> = (0..cfg.window_bytes()).map(|_| rng.byte()).collect();
    g.compressed_write_block(&mut pool, 3, &block).unwrap();
    g.window_write(&mut pool, 5, &window).unwrap();
    let mut b = vec![0u8; cfg.block_bytes()];
    let mut wb = vec![0u8; cfg.window_bytes()];
    g.compressed_read_block(&pool, 3, &mut b).unwrap();
    assert_eq!(b, block);
    g.compressed_read_block(&pool, 2, &mut b).unwrap();
    assert!(b.iter().all(|&x| x == 0), "unwritten blocks read as zeros");
    g.window_read(&pool, 5, &mut wb).unwrap();
    assert_eq!(wb, window);
    assert!(g.compressed_read_block(&pool, 6, &mut b).is_err());
    assert!(g.window_read(&pool, 0, &mut b).is_err(), "wrong length");
    assert!(g.compressed_begin(&mut pool, 4, None).is_err());
    // A slot never begun.
    let (blocks, windows) = ([0u32, 1], [0u32, 1]);
    let seq = CompressedSeq {
        blocks: &blocks,
        window: &windows,
        slot: 1,
        row: 0,
        n_rows: 4,
        pos: 0,
    };
    let hd = shape.head_dim;
    let k = g.tensor(4, 2 * hd);
    let ape = bind(
        g,
        "ape",
        GgmlType::F32,
        4,
        2 * hd,
        &f32_bytes(&vec![0.0; 8 * hd]),
    );
    let norm = bind(g, "norm", GgmlType::F32, 1, hd, &f32_bytes(&vec![1.0; hd]));
    let cc = CompressorConfig {
        kind: CompressorKind::Attention,
        ratio: 4,
        norm_eps: 1e-6,
        rope: rope(),
        round: true,
    };
    assert!(g
        .compress(&mut pool, 2, &[seq], &k, &k, &ape, &norm, &cc)
        .is_err());
    g.compressed_begin(&mut pool, 1, None).unwrap();
    g.compress(&mut pool, 2, &[seq], &k, &k, &ape, &norm, &cc)
        .unwrap();
    // A window table without the block the rows go to.
    let short = CompressedSeq {
        window: &windows[..1],
        pos: 126,
        ..seq
    };
    let kv = g.tensor(4, hd);
    assert!(g.window_store(&mut pool, 0, &[short], &kv).is_err());
    println!("PARITY pool_copies max_abs=0 rel=0 tol=0");
}
