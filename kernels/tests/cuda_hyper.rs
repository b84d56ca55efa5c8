//! Parity of the CUDA backend's hyper-connection ops, head norms, tail
//! RoPE, activation roundings and clamped SwiGLU (kernels/src/cuda/hyper.rs)
//! with the CPU reference, on random data in the shapes of the tiny test
//! model (4 streams of d = 256, heads of 128) and of DeepSeek V4 Flash (4
//! streams of d = 4096, 64 heads of 512 with 64 rotary dims, one K/V head
//! of 512, indexer heads of 128). GPU tests: `#[ignore]`d, run with
//! `--ignored --test-threads=1` (`scripts/device/cuda-tests.sh`).
//!
//! Each check prints `PARITY <name> max_abs=<..> rel=<..> tol=<..>` (see
//! cuda_parity.rs) and fails when `rel > tol`. Tolerances:
//! - 0 where both sides run the same operations in the same order:
//!   `hc_post` (f64 sums of exact f32 x f32 products), the FP8 and
//!   Hadamard + FP4 roundings (a power-of-two scale, then the nearest code
//!   with ties to even), `round_f16`, `scale`, `hc_expand` (copies);
//! - 1e-6 where a libm function (sin/cos, exp) may differ from CUDA's by
//!   an f64 ulp, or an f64 sum of squares is ordered differently, either
//!   of which can flip an f32 rounding: `rope_tail`, `swiglu_clamped`,
//!   `rms_norm_heads`;
//! - 1e-5 for `hc_pre` and `hc_head`, whose mix is a dot product of
//!   `n_hc·d` (16384) terms summed in f32 in another order than the CPU's
//!   matmul (as the matmul parity tests allow); the f64 split and the
//!   collapse after it pass that difference on without amplifying it (a
//!   sigmoid's slope is at most 1/4, Sinkhorn normalizations are
//!   contractions).
#![cfg(feature = "cuda")]

mod cuda_common;

use std::sync::Arc;

use cuda_common::*;
use ds4_kernels::backend::{HcConfig, TailRope};
use ds4_kernels::cuda::CudaBackend;
use ds4_kernels::quant::GgmlType;
use ds4_kernels::{Backend, CpuBackend, Numerics};

const NUMERICS: [Numerics; 2] = [Numerics::Production, Numerics::Exact];

fn hc_cfg() -> HcConfig {
    HcConfig {
        n_hc: 4,
        iters: 20,
        eps: 1e-6,
        norm_eps: 1e-6,
    }
}

/// The streams of `rows` rows of width `d`: random values, each stream on
/// its own scale (as a model's streams drift apart).
fn streams(rng: &mut Rng, rows: usize, n: usize, d: usize) -> Vec<f32> {
    let mut x = Vec::with_capacity(rows * n * d);
    for _ in 0..rows {
        for a in 0..n {
            x.extend(rng.vec(d, 0.5 + a as f32));
        }
    }
    x
}

/// A mix weight `[nw, cols]` of type `ty` bound on both backends, its
/// values scaled so that the mix of a normalized row is of order one (the
/// sigmoids and the softmax are then away from saturation).
fn mix_weight(
    g: &CudaBackend,
    c: &CpuBackend,
    ty: GgmlType,
    nw: usize,
    cols: usize,
    rng: &mut Rng,
) -> (
    <CudaBackend as Backend>::Weight,
    <CpuBackend as Backend>::Weight,
) {
    let v = rng.vec(nw * cols, 3.0 / (cols as f32).sqrt());
    let bytes: Vec<u8> = match ty {
        GgmlType::F16 => v.iter().flat_map(|&x| f16_bytes(x)).collect(),
        GgmlType::F32 => f32_bytes(&v),
        other => panic!("no mix weight of type {other}"),
    };
    (
        bind(g, "hc_fn", ty, nw, cols, &bytes),
        bind(c, "hc_fn", ty, nw, cols, &bytes),
    )
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn hc_pre_matches_cpu() {
    let cfg = hc_cfg();
    let (n, nw) = (cfg.n_hc, cfg.mix_width());
    let mut rng = Rng::new(101);
    // Rows cover each split-K chunk size (<= 16, <= 256, more) and
    // several row groups of a block.
    let cases = [
        (GgmlType::F16, 256, 1),
        (GgmlType::F16, 256, 5),
        (GgmlType::F16, 256, 40),
        (GgmlType::F16, 4096, 1),
        (GgmlType::F16, 4096, 3),
        (GgmlType::F16, 4096, 20),
        (GgmlType::F16, 4096, 300),
        (GgmlType::F32, 4096, 3),
        (GgmlType::F32, 256, 17),
    ];
    for numerics in NUMERICS {
        let (g, c) = (gpu(numerics), CpuBackend::with_numerics(numerics));
        for (ty, d, rows) in cases {
            let cols = n * d;
            let (mg, mc) = mix_weight(g, &c, ty, nw, cols, &mut rng);
            let (sg, sc) = row_weight(g, &c, "hc_scale", &[0.6, 0.9, 1.4]);
            let (bg, bc) = row_weight(g, &c, "hc_base", &rng.vec(nw, 0.5));
            let x = streams(&mut rng, rows, n, d);
            let (xg, xc) = (g.tensor_from(rows, cols, &x), c.tensor_from(rows, cols, &x));
            let (mut og, mut oc) = (g.tensor(rows, d), c.tensor(rows, d));
            let (mut spg, mut spc) = (g.tensor(rows, nw), c.tensor(rows, nw));
            g.hc_pre(&xg, &mg, &sg, &bg, &cfg, &mut og, &mut spg)
                .unwrap();
            c.hc_pre(&xc, &mc, &sc, &bc, &cfg, &mut oc, &mut spc)
                .unwrap();
            let name = format!("hc_pre_{numerics:?}_{}_{rows}x{d}", ty.name());
            check(&format!("{name}_split"), &g.to_host(&spg), &spc.data, 1e-5);
            check(&format!("{name}_out"), &g.to_host(&og), &oc.data, 1e-5);
        }
    }
    // A split of the wrong width is refused, not written past.
    let g = gpu(Numerics::Production);
    let c = CpuBackend::new();
    let (mg, _) = mix_weight(g, &c, GgmlType::F16, nw, n * 256, &mut rng);
    let (sg, _) = row_weight(g, &c, "hc_scale", &[1.0, 1.0, 1.0]);
    let (bg, _) = row_weight(g, &c, "hc_base", &[0.0; 24]);
    let x = g.tensor(2, n * 256);
    let (mut o, mut bad) = (g.tensor(2, 256), g.tensor(2, nw - 1));
    assert!(g.hc_pre(&x, &mg, &sg, &bg, &cfg, &mut o, &mut bad).is_err());
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn hc_head_matches_cpu() {
    let cfg = hc_cfg();
    let n = cfg.n_hc;
    let mut rng = Rng::new(102);
    for numerics in NUMERICS {
        let (g, c) = (gpu(numerics), CpuBackend::with_numerics(numerics));
        for (ty, d, rows) in [
            (GgmlType::F16, 256, 3),
            (GgmlType::F16, 4096, 1),
            (GgmlType::F16, 4096, 9),
            (GgmlType::F32, 4096, 2),
        ] {
            let cols = n * d;
            let (mg, mc) = mix_weight(g, &c, ty, n, cols, &mut rng);
            let (sg, sc) = row_weight(g, &c, "output_hc_scale", &[0.8]);
            let (bg, bc) = row_weight(g, &c, "output_hc_base", &rng.vec(n, 0.5));
            let x = streams(&mut rng, rows, n, d);
            let (xg, xc) = (g.tensor_from(rows, cols, &x), c.tensor_from(rows, cols, &x));
            let (mut og, mut oc) = (g.tensor(rows, d), c.tensor(rows, d));
            g.hc_head(&xg, &mg, &sg, &bg, &cfg, &mut og).unwrap();
            c.hc_head(&xc, &mc, &sc, &bc, &cfg, &mut oc).unwrap();
            check(
                &format!("hc_head_{numerics:?}_{}_{rows}x{d}", ty.name()),
                &g.to_host(&og),
                &oc.data,
                1e-5,
            );
        }
    }
}

/// A weight bound on both backends.
type Both = (
    <CudaBackend as Backend>::Weight,
    <CpuBackend as Backend>::Weight,
);

/// One pre step's weights (an F16 mix, scale, base) on both backends,
/// random streams of `rows` rows of width `d`, and a real split: the
/// CPU's hc_pre of those streams.
struct PreCase {
    mix: Both,
    scale: Both,
    base: Both,
    x: Vec<f32>,
    split: <CpuBackend as Backend>::Tensor,
}

fn pre_case(
    g: &CudaBackend,
    c: &CpuBackend,
    cfg: &HcConfig,
    rows: usize,
    d: usize,
    rng: &mut Rng,
) -> PreCase {
    let (n, nw) = (cfg.n_hc, cfg.mix_width());
    let mix = mix_weight(g, c, GgmlType::F16, nw, n * d, rng);
    let scale = row_weight(g, c, "hc_scale", &[0.6, 0.9, 1.4]);
    let base = row_weight(g, c, "hc_base", &rng.vec(nw, 0.5));
    let x = streams(rng, rows, n, d);
    let (mut collapsed, mut split) = (c.tensor(rows, d), c.tensor(rows, nw));
    let xc = c.tensor_from(rows, n * d, &x);
    c.hc_pre(
        &xc,
        &mix.1,
        &scale.1,
        &base.1,
        cfg,
        &mut collapsed,
        &mut split,
    )
    .unwrap();
    PreCase {
        mix,
        scale,
        base,
        x,
        split,
    }
}

/// The post step from the same split on both sides: the CPU's bits.
#[test]
#[ignore = "needs a CUDA GPU"]
fn hc_post_is_exact() {
    let cfg = hc_cfg();
    let (n, nw) = (cfg.n_hc, cfg.mix_width());
    let (g, c) = (gpu(Numerics::Production), CpuBackend::new());
    let mut rng = Rng::new(103);
    for (d, rows) in [(256, 1), (256, 6), (4096, 1), (4096, 7), (4096, 64)] {
        let cols = n * d;
        let PreCase { x, split, .. } = pre_case(g, &c, &cfg, rows, d, &mut rng);
        let y = rng.vec(rows * d, 3.0);
        let (mut xg, yg, sg) = (
            g.tensor_from(rows, cols, &x),
            g.tensor_from(rows, d, &y),
            g.tensor_from(rows, nw, &split.data),
        );
        let (mut xc, yc) = (c.tensor_from(rows, cols, &x), c.tensor_from(rows, d, &y));
        g.hc_post(&mut xg, &yg, &sg, &cfg);
        c.hc_post(&mut xc, &yc, &split, &cfg);
        check(
            &format!("hc_post_{rows}x{d}"),
            &g.to_host(&xg),
            &xc.data,
            0.0,
        );
    }
}

/// A residual add, the post step and the next pre step, as a decode step
/// records them: on the GPU the add runs inside hc_post and, for up to 16
/// rows, hc_pre takes its 1/rms from hc_post's sums of squares instead of
/// an hc_norm launch. The same results as the ops one by one on the CPU.
#[test]
#[ignore = "needs a CUDA GPU"]
fn hc_post_fuses_add_and_next_norm() {
    let cfg = hc_cfg();
    let (n, nw) = (cfg.n_hc, cfg.mix_width());
    let (g, c) = (gpu(Numerics::Production), CpuBackend::new());
    let mut rng = Rng::new(107);
    for (d, rows) in [(256, 1), (256, 5), (4096, 1), (4096, 3), (4096, 20)] {
        let cols = n * d;
        let PreCase {
            mix: (mg, mc),
            scale: (sg, sc),
            base: (bg, bc),
            x,
            split,
        } = pre_case(g, &c, &cfg, rows, d, &mut rng);
        let (y, z) = (rng.vec(rows * d, 3.0), rng.vec(rows * d, 1.0));
        let (mut xg, mut yg, zg, spg) = (
            g.tensor_from(rows, cols, &x),
            g.tensor_from(rows, d, &y),
            g.tensor_from(rows, d, &z),
            g.tensor_from(rows, nw, &split.data),
        );
        let (mut og, mut sog) = (g.tensor(rows, d), g.tensor(rows, nw));
        let (mut xc, mut yc, zc) = (
            c.tensor_from(rows, cols, &x),
            c.tensor_from(rows, d, &y),
            c.tensor_from(rows, d, &z),
        );
        let (mut oc, mut soc) = (c.tensor(rows, d), c.tensor(rows, nw));
        let before = g.fused_hc();
        g.add_assign(&mut yg, &zg);
        g.hc_post(&mut xg, &yg, &spg, &cfg);
        g.hc_pre(&xg, &mg, &sg, &bg, &cfg, &mut og, &mut sog)
            .unwrap();
        let after = g.fused_hc();
        c.add_assign(&mut yc, &zc);
        c.hc_post(&mut xc, &yc, &split, &cfg);
        c.hc_pre(&xc, &mc, &sc, &bc, &cfg, &mut oc, &mut soc)
            .unwrap();
        let name = format!("hc_post_fused_{rows}x{d}");
        check(&format!("{name}_y"), &g.to_host(&yg), &yc.data, 0.0);
        check(&format!("{name}_x"), &g.to_host(&xg), &xc.data, 0.0);
        check(&format!("{name}_split"), &g.to_host(&sog), &soc.data, 1e-5);
        check(&format!("{name}_out"), &g.to_host(&og), &oc.data, 1e-5);
        let fuse = u64::from(g.hc_fuse());
        assert_eq!(
            after.0,
            before.0 + fuse,
            "{name}: the add ran inside hc_post"
        );
        let norm = fuse * u64::from(rows <= 16);
        assert_eq!(
            after.1,
            before.1 + norm,
            "{name}: hc_pre's norm from hc_post"
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn rms_norm_heads_matches_cpu() {
    let (g, c) = (gpu(Numerics::Production), CpuBackend::new());
    let mut rng = Rng::new(104);
    // Tiny q heads, Flash q heads, the Flash K/V row, Flash indexer q heads.
    for (rows, heads, hd) in [(3, 4, 128), (2, 64, 512), (5, 1, 512), (4, 64, 128)] {
        let x = rng.vec(rows * heads * hd, 6.0);
        let (mut xg, mut xc) = (
            g.tensor_from(rows, heads * hd, &x),
            c.tensor_from(rows, heads * hd, &x),
        );
        g.rms_norm_heads(&mut xg, hd, 1e-6);
        c.rms_norm_heads(&mut xc, hd, 1e-6);
        check(
            &format!("rms_norm_heads_{rows}x{heads}x{hd}"),
            &g.to_host(&xg),
            &xc.data,
            1e-6,
        );
    }
}

/// Frequencies of 32 rotated pairs: plain RoPE of `base`, the pairs past
/// 15 divided by up to `factor` (a YaRN-like blend).
fn omega(base: f64, factor: f64) -> TailRope {
    let w: Vec<f64> = (0..32)
        .map(|k| {
            let theta = base.powf(-2.0 * k as f64 / 64.0);
            let ramp = ((k as f64 - 15.0) / 10.0).clamp(0.0, 1.0);
            theta * (1.0 - ramp) + theta / factor * ramp
        })
        .collect();
    TailRope {
        omega: Arc::from(w),
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn rope_tail_matches_cpu() {
    let (g, c) = (gpu(Numerics::Production), CpuBackend::new());
    let mut rng = Rng::new(105);
    // Two ropes used alternately: the device copies of their frequencies
    // are kept apart by content.
    let ropes = [omega(10000.0, 1.0), omega(160000.0, 16.0)];
    for (rows, heads, hd) in [(5, 4, 128), (3, 64, 512), (7, 1, 512), (2, 64, 128)] {
        let positions: Vec<u32> = (0..rows)
            .map(|r| match r {
                0 => 0,
                1 => 1_000_000,
                _ => (rng.next() % 70_000) as u32,
            })
            .collect();
        for (i, rope) in ropes.iter().enumerate() {
            for inverse in [false, true] {
                let x = rng.vec(rows * heads * hd, 3.0);
                let (mut xg, mut xc) = (
                    g.tensor_from(rows, heads * hd, &x),
                    c.tensor_from(rows, heads * hd, &x),
                );
                g.rope_tail(&mut xg, &positions, hd, rope, inverse);
                c.rope_tail(&mut xc, &positions, hd, rope, inverse);
                let got = g.to_host(&xg);
                // The head dims before the tail are untouched.
                for (h, (a, b)) in got.chunks(hd).zip(x.chunks(hd)).enumerate() {
                    assert_eq!(
                        &a[..hd - 64],
                        &b[..hd - 64],
                        "head {h}: only the tail rotates"
                    );
                }
                check(
                    &format!(
                        "rope_tail_{rows}x{heads}x{hd}_rope{i}_inv{}",
                        u8::from(inverse)
                    ),
                    &got,
                    &xc.data,
                    1e-6,
                );
            }
        }
    }
}

/// Values of log-uniform magnitude (1e-7 .. 10) with random signs: every
/// range of the FP8 and FP4 grids (subnormal codes included) is hit.
fn spread(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n)
        .map(|_| rng.f().signum() * 10f32.powf(1.0 - 8.0 * rng.f().abs()))
        .collect()
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn round_fp8_is_exact() {
    let (g, c) = (gpu(Numerics::Production), CpuBackend::new());
    let mut rng = Rng::new(106);
    // (rows, cols, width, n_round): Flash K/V rows (the 64 rotary dims
    // kept), two pieces per row, a short last block, tiny-model rows.
    for (rows, cols, width, n_round) in [
        (4, 512, 512, 448),
        (3, 1024, 512, 448),
        (2, 96, 96, 80),
        (5, 256, 128, 128),
    ] {
        let mut x = spread(&mut rng, rows * cols);
        // An all-zero block (amax floored at 1e-4) and a block of ties:
        // amax 448 gives scale 1, then halfway points between codes.
        x[64..128].fill(0.0);
        let ties = [
            448.0,
            1.0625,
            -1.1875,
            3.0 * 2f32.powi(-10),
            2f32.powi(-10),
            7.5 * 2f32.powi(-9),
            -240.0,
            0.015_625 * 1.0625,
        ];
        x[..ties.len()].copy_from_slice(&ties);
        let (mut xg, mut xc) = (g.tensor_from(rows, cols, &x), c.tensor_from(rows, cols, &x));
        g.round_fp8(&mut xg, width, n_round);
        c.round_fp8(&mut xc, width, n_round);
        assert_eq!(xc.data[1], 1.0, "the tie went to the even code");
        check(
            &format!("round_fp8_{rows}x{cols}_w{width}_r{n_round}"),
            &g.to_host(&xg),
            &xc.data,
            0.0,
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn round_indexer_is_exact() {
    let (g, c) = (gpu(Numerics::Production), CpuBackend::new());
    let mut rng = Rng::new(107);
    // Flash indexer queries, one indexer key row, other head widths.
    for (rows, cols, dim) in [
        (3, 64 * 128, 128),
        (5, 128, 128),
        (2, 256, 32),
        (2, 512, 256),
        (1, 4096, 4096),
    ] {
        let mut x = spread(&mut rng, rows * cols);
        x[..dim].fill(0.0);
        let (mut xg, mut xc) = (g.tensor_from(rows, cols, &x), c.tensor_from(rows, cols, &x));
        g.round_indexer(&mut xg, dim);
        c.round_indexer(&mut xc, dim);
        check(
            &format!("round_indexer_{rows}x{cols}_d{dim}"),
            &g.to_host(&xg),
            &xc.data,
            0.0,
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn round_f16_and_scale_are_exact() {
    let (g, c) = (gpu(Numerics::Production), CpuBackend::new());
    let mut rng = Rng::new(108);
    let (rows, cols) = (7, 1000);
    // Magnitudes from f16 subnormals to near its largest value, and ties.
    let mut x: Vec<f32> = (0..rows * cols)
        .map(|_| rng.f().signum() * 10f32.powf(4.5 - 12.0 * rng.f().abs()))
        .collect();
    x[..3].copy_from_slice(&[1.0 + 2f32.powi(-11), 1.0 + 3.0 * 2f32.powi(-11), 6e4]);
    let (mut xg, mut xc) = (g.tensor_from(rows, cols, &x), c.tensor_from(rows, cols, &x));
    g.round_f16(&mut xg);
    c.round_f16(&mut xc);
    check("round_f16", &g.to_host(&xg), &xc.data, 0.0);
    let (mut xg, mut xc) = (g.tensor_from(rows, cols, &x), c.tensor_from(rows, cols, &x));
    g.scale(&mut xg, 0.088_388_35);
    c.scale(&mut xc, 0.088_388_35);
    check("scale", &g.to_host(&xg), &xc.data, 0.0);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn hc_expand_is_exact() {
    let (g, c) = (gpu(Numerics::Production), CpuBackend::new());
    let mut rng = Rng::new(109);
    for (rows, d) in [(1, 256), (5, 4096)] {
        let x = rng.vec(rows * d, 1.0);
        let (xg, xc) = (g.tensor_from(rows, d, &x), c.tensor_from(rows, d, &x));
        let (mut og, mut oc) = (g.tensor(rows, 4 * d), c.tensor(rows, 4 * d));
        g.hc_expand(&xg, 4, &mut og);
        c.hc_expand(&xc, 4, &mut oc);
        check(
            &format!("hc_expand rows={rows} d={d}"),
            &g.to_host(&og),
            &oc.data,
            0.0,
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn swiglu_clamped_matches_cpu() {
    let (g, c) = (gpu(Numerics::Production), CpuBackend::new());
    let mut rng = Rng::new(109);
    for (rows, cols) in [(1, 2048), (37, 2048), (3, 100)] {
        let (a, b) = (rng.vec(rows * cols, 30.0), rng.vec(rows * cols, 30.0));
        let (mut og, mut oc) = (g.tensor(rows, cols), c.tensor(rows, cols));
        g.swiglu_clamped(
            &g.tensor_from(rows, cols, &a),
            &g.tensor_from(rows, cols, &b),
            10.0,
            &mut og,
        );
        c.swiglu_clamped(
            &c.tensor_from(rows, cols, &a),
            &c.tensor_from(rows, cols, &b),
            10.0,
            &mut oc,
        );
        check(
            &format!("swiglu_clamped_{rows}x{cols}"),
            &g.to_host(&og),
            &oc.data,
            1e-6,
        );
    }
}
