//! Parity of the CUDA backend's mixture-of-experts ops (`moe_route`,
//! `moe_experts`), grouped projections (`matmul_grouped`) and matmul on
//! DeepSeek V4's expert types (IQ2_XXS, Q2_K) with the CPU reference, on
//! random data and random valid quant blocks. GPU tests: `#[ignore]`d, run
//! on the GPU machine with `--ignored --test-threads=1`
//! (`scripts/device/cuda-tests.sh`).
//!
//! Shapes: the miniature model's (d 256, n_ff 256, 8 experts, k 2) and a
//! slice of DeepSeek V4 Flash (d 4096, n_ff 2048, 16 of its 256 experts,
//! k 6; routing with all 256), with the q2 (IQ2_XXS gate/up, Q2_K down)
//! and q4 (Q4_K) expert types, 1, 8 and 300 rows (decode matvecs and the
//! prefill GEMM over gathered rows).
//!
//! Each check prints `PARITY <name> max_abs=<..> rel=<..> tol=<..>` (`rel
//! = max |gpu - cpu| / max |cpu|`) and fails when `rel > tol`. Tolerances:
//! - routing: expert ids 0 (both sides rank the same f64 scores); weights
//!   1e-6 (f64 on both sides, the GPU's exp and log1p within an ulp or two
//!   of libm's, so the f32 weights are equal or an ulp apart);
//! - experts, exact numerics: 1e-5, as matmul (two chained f32 dots in
//!   another order);
//! - experts, production numerics: 2e-3. Both sides compute the same
//!   integer block dots and f32 block terms; g and u differ only by the
//!   order of f32 sums over blocks (about 1e-7; Q4_K: the CPU's AVX2
//!   kernel), but h is quantized again to Q8_K before the down projection,
//!   and a value on a rounding edge moves by one quant step. Perturbing g
//!   and u by 1.2e-7 on the CPU moved outputs by up to 5e-4 of the largest
//!   (a wrong expert, weight, scale or min term moves them by O(1));
//! - a row's result alone, in a batch of 8 and in a batch of 300 (the
//!   matvec and the GEMM paths), with tensor cores on and off: 0 (the
//!   same bits);
//! - matmul_grouped, matmul on IQ2_XXS and Q2_K: 1e-5, as matmul;
//!   embedding rows of IQ2_XXS and Q2_K: 0.
#![cfg(feature = "cuda")]

mod cuda_common;

use cuda_common::*;
use ds4_kernels::backend::RouteConfig;
use ds4_kernels::cpu::{CpuTensor, CpuWeight};
use ds4_kernels::cuda::CudaWeight;
use ds4_kernels::quant::GgmlType;
use ds4_kernels::{Backend, CpuBackend, Numerics};

/// The SwiGLU clamp of DeepSeek V4.
const CLAMP: f32 = 10.0;

/// Stacked expert weights, the same bytes bound on both backends.
struct Experts {
    d: usize,
    n_expert: usize,
    gpu: [CudaWeight; 3],
    cpu: [CpuWeight; 3],
}

fn experts(
    numerics: Numerics,
    gate_up: GgmlType,
    down: GgmlType,
    d: usize,
    n_ff: usize,
    n_expert: usize,
    seed: u64,
) -> Experts {
    let (g, c) = (gpu(numerics), CpuBackend::with_numerics(numerics));
    let mut rng = Rng::new(seed);
    let shapes = [
        ("gate", gate_up, n_expert * n_ff, d),
        ("up", gate_up, n_expert * n_ff, d),
        ("down", down, n_expert * d, n_ff),
    ];
    let bytes: Vec<Vec<u8>> = shapes
        .iter()
        .map(|&(_, ty, rows, cols)| weight_bytes(ty, rows, cols, &mut rng))
        .collect();
    let gw = |i: usize| {
        let (name, ty, rows, cols) = shapes[i];
        bind(g, name, ty, rows, cols, &bytes[i])
    };
    let cw = |i: usize| {
        let (name, ty, rows, cols) = shapes[i];
        bind(&c, name, ty, rows, cols, &bytes[i])
    };
    Experts {
        d,
        n_expert,
        gpu: [gw(0), gw(1), gw(2)],
        cpu: [cw(0), cw(1), cw(2)],
    }
}

/// Expert ids and route weights of `rows` rows from random logits (the
/// CPU's routing: k distinct experts per row).
fn routes(n_expert: usize, k: usize, rows: usize, rng: &mut Rng) -> (Vec<f32>, Vec<f32>) {
    let c = CpuBackend::new();
    let logits = c.tensor_from(rows, n_expert, &rng.vec(rows * n_expert, 3.0));
    let (mut ids, mut w) = (c.tensor(rows, k), c.tensor(rows, k));
    c.moe_route(
        &logits,
        None,
        None,
        &RouteConfig { k, scale: 1.5 },
        &mut ids,
        &mut w,
    )
    .expect("CPU routing");
    (ids.data, w.data)
}

/// `moe_experts` on the GPU backend of `numerics`.
fn gpu_experts(
    numerics: Numerics,
    e: &Experts,
    x: &[f32],
    ids: &[f32],
    w: &[f32],
    k: usize,
) -> Vec<f32> {
    let g = gpu(numerics);
    let rows = x.len() / e.d;
    let (xt, it, wt) = (
        g.tensor_from(rows, e.d, x),
        g.tensor_from(rows, k, ids),
        g.tensor_from(rows, k, w),
    );
    let mut out = g.tensor(rows, e.d);
    let [gate, up, down] = &e.gpu;
    g.moe_experts(gate, up, down, e.n_expert, &xt, &it, &wt, CLAMP, &mut out)
        .expect("CUDA moe_experts");
    g.to_host(&out)
}

fn cpu_experts(
    numerics: Numerics,
    e: &Experts,
    x: &[f32],
    ids: &[f32],
    w: &[f32],
    k: usize,
) -> Vec<f32> {
    let c = CpuBackend::with_numerics(numerics);
    let rows = x.len() / e.d;
    let (xt, it, wt) = (
        c.tensor_from(rows, e.d, x),
        c.tensor_from(rows, k, ids),
        c.tensor_from(rows, k, w),
    );
    let mut out: CpuTensor = c.tensor(rows, e.d);
    let [gate, up, down] = &e.cpu;
    c.moe_experts(gate, up, down, e.n_expert, &xt, &it, &wt, CLAMP, &mut out)
        .expect("CPU moe_experts");
    out.data
}

/// `moe_experts` against the CPU for 1, 8 and 300 rows. `x_scale` puts
/// the gate and up values mostly inside the clamp (random blocks of each
/// type have their own scale), with a tail past it.
#[allow(clippy::too_many_arguments)]
fn experts_case(
    numerics: Numerics,
    tag: &str,
    gate_up: GgmlType,
    down: GgmlType,
    (d, n_ff, n_expert, k): (usize, usize, usize, usize),
    x_scale: f32,
    seed: u64,
) {
    let e = experts(numerics, gate_up, down, d, n_ff, n_expert, seed);
    let mut rng = Rng::new(seed + 1);
    let tol = match numerics {
        Numerics::Production => 2e-3,
        Numerics::Exact => 1e-5,
    };
    for rows in [1, 8, 300] {
        let x = rng.vec(rows * d, x_scale);
        let (ids, w) = routes(n_expert, k, rows, &mut rng);
        let got = gpu_experts(numerics, &e, &x, &ids, &w, k);
        let want = cpu_experts(numerics, &e, &x, &ids, &w, k);
        check(
            &format!("moe_experts_{tag}_{numerics:?}_rows{rows}"),
            &got,
            &want,
            tol,
        );
    }
}

const TINY: (usize, usize, usize, usize) = (256, 256, 8, 2);
const FLASH: (usize, usize, usize, usize) = (4096, 2048, 16, 6);

#[test]
#[ignore = "needs a CUDA GPU"]
fn experts_tiny_q2() {
    for numerics in [Numerics::Production, Numerics::Exact] {
        experts_case(
            numerics,
            "tiny_q2",
            GgmlType::IQ2_XXS,
            GgmlType::Q2_K,
            TINY,
            1.0,
            11,
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn experts_tiny_q4k() {
    for numerics in [Numerics::Production, Numerics::Exact] {
        experts_case(
            numerics,
            "tiny_q4k",
            GgmlType::Q4_K,
            GgmlType::Q4_K,
            TINY,
            0.2,
            12,
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn experts_flash_q2() {
    for numerics in [Numerics::Production, Numerics::Exact] {
        experts_case(
            numerics,
            "flash_q2",
            GgmlType::IQ2_XXS,
            GgmlType::Q2_K,
            FLASH,
            0.25,
            13,
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn experts_flash_q4k() {
    for numerics in [Numerics::Production, Numerics::Exact] {
        experts_case(
            numerics,
            "flash_q4k",
            GgmlType::Q4_K,
            GgmlType::Q4_K,
            FLASH,
            0.05,
            14,
        );
    }
}

/// The other expert types the miniature model's generator writes (Q8_0,
/// F16), production numerics (F16: the input rounded to f16).
#[test]
#[ignore = "needs a CUDA GPU"]
fn experts_tiny_q8_0_and_f16() {
    experts_case(
        Numerics::Production,
        "tiny_q8_0",
        GgmlType::Q8_0,
        GgmlType::Q8_0,
        TINY,
        1.0,
        15,
    );
    experts_case(
        Numerics::Production,
        "tiny_f16",
        GgmlType::F16,
        GgmlType::F16,
        TINY,
        1.0,
        16,
    );
}

/// A row's result does not depend on the rest of its batch: 300 rows in
/// one call (production: the tensor-core GEMM over gathered rows; then
/// with tensor cores off: the matvecs), 8 of them, and single rows (the
/// matvecs) give the same bits.
fn batch_independence(
    numerics: Numerics,
    tag: &str,
    gate_up: GgmlType,
    down: GgmlType,
    shape: (usize, usize, usize, usize),
    x_scale: f32,
) {
    let (d, n_ff, n_expert, k) = shape;
    let e = experts(numerics, gate_up, down, d, n_ff, n_expert, 21);
    let mut rng = Rng::new(22);
    let rows = 300;
    let x = rng.vec(rows * d, x_scale);
    let (ids, w) = routes(n_expert, k, rows, &mut rng);
    let g = gpu(numerics);
    let all = gpu_experts(numerics, &e, &x, &ids, &w, k);
    g.set_tensor_cores(false);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        gpu_experts(numerics, &e, &x, &ids, &w, k)
    }));
    g.set_tensor_cores(true);
    let no_tc = r.expect("moe_experts without tensor cores");
    check(
        &format!("moe_batch_{tag}_{numerics:?}_tensor_cores_off"),
        &no_tc,
        &all,
        0.0,
    );
    let (r0, n8) = (100, 8);
    let some = gpu_experts(
        numerics,
        &e,
        &x[r0 * d..(r0 + n8) * d],
        &ids[r0 * k..(r0 + n8) * k],
        &w[r0 * k..(r0 + n8) * k],
        k,
    );
    check(
        &format!("moe_batch_{tag}_{numerics:?}_rows8"),
        &some,
        &all[r0 * d..(r0 + n8) * d],
        0.0,
    );
    for r in [0, 137, 299] {
        let one = gpu_experts(
            numerics,
            &e,
            &x[r * d..(r + 1) * d],
            &ids[r * k..(r + 1) * k],
            &w[r * k..(r + 1) * k],
            k,
        );
        check(
            &format!("moe_batch_{tag}_{numerics:?}_row{r}"),
            &one,
            &all[r * d..(r + 1) * d],
            0.0,
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn experts_row_independent_of_batch() {
    for numerics in [Numerics::Production, Numerics::Exact] {
        batch_independence(
            numerics,
            "tiny_q2",
            GgmlType::IQ2_XXS,
            GgmlType::Q2_K,
            TINY,
            1.0,
        );
        batch_independence(
            numerics,
            "flash_q2",
            GgmlType::IQ2_XXS,
            GgmlType::Q2_K,
            FLASH,
            0.25,
        );
        batch_independence(
            numerics,
            "flash_q4k",
            GgmlType::Q4_K,
            GgmlType::Q4_K,
            FLASH,
            0.05,
        );
    }
}

// ---- routing

/// An I32 `[tokens, k]` hash table of k distinct experts per token.
fn hash_table(tokens: usize, n_expert: usize, k: usize, rng: &mut Rng) -> Vec<i32> {
    let mut t = Vec::with_capacity(tokens * k);
    for _ in 0..tokens {
        let mut all: Vec<i32> = (0..n_expert as i32).collect();
        for i in 0..k {
            let j = i + (rng.next() % (n_expert - i) as u64) as usize;
            all.swap(i, j);
        }
        t.extend_from_slice(&all[..k]);
    }
    t
}

fn route_case(n_expert: usize, k: usize, seed: u64) {
    let (g, c) = (gpu(Numerics::Production), CpuBackend::new());
    let mut rng = Rng::new(seed);
    let cfg = RouteConfig { k, scale: 1.5 };
    let n_tok = 50;
    let table: Vec<u8> = hash_table(n_tok, n_expert, k, &mut rng)
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let (tg, tc) = (
        bind(g, "tid2eid", GgmlType::I32, n_tok, k, &table),
        bind(&c, "tid2eid", GgmlType::I32, n_tok, k, &table),
    );
    let (bg, bc) = row_weight(g, &c, "exp_probs_b", &rng.vec(n_expert, 0.3));
    for rows in [1, 8, 300] {
        let mut logits = rng.vec(rows * n_expert, 4.0);
        // Both ends of the softplus, and a row of ties (lower index wins).
        logits[0] = 25.0;
        logits[1] = -30.0;
        if rows > 1 {
            logits[n_expert..2 * n_expert].fill(0.5);
        }
        let tokens: Vec<u32> = (0..rows)
            .map(|_| (rng.next() % n_tok as u64) as u32)
            .collect();
        let (lg, lc) = (
            g.tensor_from(rows, n_expert, &logits),
            c.tensor_from(rows, n_expert, &logits),
        );
        for (mode, bias, hash) in [
            ("plain", false, false),
            ("bias", true, false),
            ("hash", true, true),
        ] {
            let (mut ig, mut wg) = (g.tensor(rows, k), g.tensor(rows, k));
            let (mut ic, mut wc) = (c.tensor(rows, k), c.tensor(rows, k));
            g.moe_route(
                &lg,
                bias.then_some(&bg),
                hash.then_some((&tg, tokens.as_slice())),
                &cfg,
                &mut ig,
                &mut wg,
            )
            .expect("CUDA moe_route");
            c.moe_route(
                &lc,
                bias.then_some(&bc),
                hash.then_some((&tc, tokens.as_slice())),
                &cfg,
                &mut ic,
                &mut wc,
            )
            .expect("CPU moe_route");
            let name = format!("moe_route_{n_expert}x{k}_{mode}_rows{rows}");
            check(&format!("{name}_ids"), &g.to_host(&ig), &ic.data, 0.0);
            check(&format!("{name}_weights"), &g.to_host(&wg), &wc.data, 1e-6);
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn route_biased_and_hashed() {
    route_case(256, 6, 31);
    route_case(8, 2, 32);
    route_case(16, 3, 33);
}

/// Routing on the GPU feeding the GPU's experts: the miniature model's
/// FFN from logits to output.
#[test]
#[ignore = "needs a CUDA GPU"]
fn route_then_experts() {
    let numerics = Numerics::Production;
    let (g, c) = (gpu(numerics), CpuBackend::with_numerics(numerics));
    let (d, n_ff, n_expert, k) = TINY;
    let e = experts(
        numerics,
        GgmlType::IQ2_XXS,
        GgmlType::Q2_K,
        d,
        n_ff,
        n_expert,
        41,
    );
    let mut rng = Rng::new(42);
    let rows = 37;
    let (x, logits) = (rng.vec(rows * d, 1.0), rng.vec(rows * n_expert, 3.0));
    let cfg = RouteConfig { k, scale: 1.5 };
    let (mut ig, mut wg) = (g.tensor(rows, k), g.tensor(rows, k));
    g.moe_route(
        &g.tensor_from(rows, n_expert, &logits),
        None,
        None,
        &cfg,
        &mut ig,
        &mut wg,
    )
    .unwrap();
    let mut og = g.tensor(rows, d);
    let [gate, up, down] = &e.gpu;
    g.moe_experts(
        gate,
        up,
        down,
        n_expert,
        &g.tensor_from(rows, d, &x),
        &ig,
        &wg,
        CLAMP,
        &mut og,
    )
    .unwrap();
    let (mut ic, mut wc) = (c.tensor(rows, k), c.tensor(rows, k));
    c.moe_route(
        &c.tensor_from(rows, n_expert, &logits),
        None,
        None,
        &cfg,
        &mut ic,
        &mut wc,
    )
    .unwrap();
    let want = cpu_experts(numerics, &e, &x, &ic.data, &wc.data, k);
    check("moe_route_then_experts", &g.to_host(&og), &want, 2e-3);
}

// ---- grouped projections

fn grouped_case(
    numerics: Numerics,
    ty: GgmlType,
    groups: usize,
    m: usize,
    n: usize,
    rows: usize,
    seed: u64,
) -> f32 {
    let (g, c) = (gpu(numerics), CpuBackend::with_numerics(numerics));
    let mut rng = Rng::new(seed);
    let bytes = weight_bytes(ty, groups * m, n, &mut rng);
    let (wg, wc) = (
        bind(g, "w", ty, groups * m, n, &bytes),
        bind(&c, "w", ty, groups * m, n, &bytes),
    );
    let x = rng.vec(rows * groups * n, 2.0);
    let (mut og, mut oc) = (g.tensor(rows, groups * m), c.tensor(rows, groups * m));
    g.matmul_grouped(&wg, &g.tensor_from(rows, groups * n, &x), groups, &mut og)
        .expect("CUDA matmul_grouped");
    c.matmul_grouped(&wc, &c.tensor_from(rows, groups * n, &x), groups, &mut oc)
        .expect("CPU matmul_grouped");
    check(
        &format!(
            "matmul_grouped_{numerics:?}_{}_{groups}x{m}x{n}_rows{rows}_tc{}",
            ty.name(),
            u8::from(g.tensor_cores())
        ),
        &g.to_host(&og),
        &oc.data,
        1e-5,
    )
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn matmul_grouped_shapes() {
    let mut failed = Vec::new();
    for numerics in [Numerics::Production, Numerics::Exact] {
        for tc in [true, false] {
            gpu(numerics).set_tensor_cores(tc);
            for (i, &(ty, groups, m, n)) in [
                // Flash: attn_output_a, 8 groups of 4096 -> 1024.
                (GgmlType::Q8_0, 8, 1024, 4096),
                // The miniature models.
                (GgmlType::Q8_0, 2, 128, 512),
                (GgmlType::Q8_0, 4, 96, 512),
                (GgmlType::F16, 2, 128, 512),
                // Q8_K activations (per-row scales of each group).
                (GgmlType::Q4_K, 4, 160, 512),
            ]
            .iter()
            .enumerate()
            {
                for rows in [1, 8, 64, 300] {
                    let r = std::panic::catch_unwind(|| {
                        grouped_case(numerics, ty, groups, m, n, rows, 50 + i as u64)
                    });
                    if r.is_err() {
                        failed.push(format!(
                            "{numerics:?} tc {tc} {ty} {groups}x{m}x{n} rows {rows}"
                        ));
                    }
                }
            }
            gpu(numerics).set_tensor_cores(true);
        }
    }
    assert!(failed.is_empty(), "failed: {failed:?}");
}

// ---- matmul and embedding on the expert types

fn matmul_case(
    numerics: Numerics,
    ty: GgmlType,
    n_out: usize,
    n_in: usize,
    n_tok: usize,
    seed: u64,
) {
    let (g, c) = (gpu(numerics), CpuBackend::with_numerics(numerics));
    let mut rng = Rng::new(seed);
    let bytes = weight_bytes(ty, n_out, n_in, &mut rng);
    let (wg, wc) = (
        bind(g, "w", ty, n_out, n_in, &bytes),
        bind(&c, "w", ty, n_out, n_in, &bytes),
    );
    let x = rng.vec(n_tok * n_in, 2.0);
    let (mut og, mut oc) = (g.tensor(n_tok, n_out), c.tensor(n_tok, n_out));
    g.matmul(&wg, &g.tensor_from(n_tok, n_in, &x), &mut og)
        .expect("CUDA matmul");
    c.matmul(&wc, &c.tensor_from(n_tok, n_in, &x), &mut oc)
        .expect("CPU matmul");
    check(
        &format!(
            "matmul_{numerics:?}_tc{}_{}_{n_out}x{n_in}_tok{n_tok}",
            u8::from(g.tensor_cores()),
            ty.name()
        ),
        &g.to_host(&og),
        &oc.data,
        1e-5,
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn matmul_iq2_xxs_and_q2_k() {
    let mut failed = Vec::new();
    for (numerics, tc) in [
        (Numerics::Production, true),
        (Numerics::Production, false),
        (Numerics::Exact, true),
    ] {
        gpu(numerics).set_tensor_cores(tc);
        for (i, ty) in [GgmlType::IQ2_XXS, GgmlType::Q2_K].into_iter().enumerate() {
            for (n_out, n_in, n_tok) in [
                (67, 2048, 1),
                (67, 2048, 3),
                (67, 2048, 13),
                (256, 4096, 1),
                (5, 256, 9),
                (130, 1024, 70),
                (96, 2304, 65),
                (1100, 2048, 1),
                (1030, 4096, 9),
                (300, 4096, 40),
                (2048, 4096, 300),
            ] {
                let r = std::panic::catch_unwind(|| {
                    matmul_case(numerics, ty, n_out, n_in, n_tok, 60 + i as u64)
                });
                if r.is_err() {
                    failed.push(format!(
                        "{numerics:?} tc {tc} {ty} {n_out}x{n_in} tok{n_tok}"
                    ));
                }
            }
        }
        gpu(numerics).set_tensor_cores(true);
    }
    assert!(failed.is_empty(), "failed: {failed:?}");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn embed_expert_types_and_i32_tables() {
    let (g, c) = (gpu(Numerics::Production), CpuBackend::new());
    let mut rng = Rng::new(70);
    let (rows, cols) = (37, 512);
    let ids = [0u32, 36, 5, 5, 17, 2];
    for ty in [GgmlType::IQ2_XXS, GgmlType::Q2_K] {
        let bytes = weight_bytes(ty, rows, cols, &mut rng);
        let (wg, wc) = (
            bind(g, "tok", ty, rows, cols, &bytes),
            bind(&c, "tok", ty, rows, cols, &bytes),
        );
        let (mut og, mut oc) = (g.tensor(ids.len(), cols), c.tensor(ids.len(), cols));
        g.embed(&wg, &ids, &mut og).unwrap();
        c.embed(&wc, &ids, &mut oc).unwrap();
        check(
            &format!("embed_{}", ty.name()),
            &g.to_host(&og),
            &oc.data,
            0.0,
        );
    }
    // An I32 table of 6 columns binds (rows of any width) and reads as
    // its values; a matmul refuses it.
    let vals: Vec<i32> = (0..rows as i32 * 6).map(|v| v * 7 - 100).collect();
    let bytes: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
    let (tg, tc) = (
        bind(g, "tid2eid", GgmlType::I32, rows, 6, &bytes),
        bind(&c, "tid2eid", GgmlType::I32, rows, 6, &bytes),
    );
    let (mut og, mut oc) = (g.tensor(ids.len(), 6), c.tensor(ids.len(), 6));
    g.embed(&tg, &ids, &mut og).unwrap();
    c.embed(&tc, &ids, &mut oc).unwrap();
    check("embed_i32", &g.to_host(&og), &oc.data, 0.0);
    assert!(
        g.matmul(&tg, &g.tensor(1, 6), &mut g.tensor(1, rows))
            .is_err(),
        "an i32 table is not a matmul weight"
    );
}

/// The CPU side of this file's checks needs no GPU: the generators make
/// valid blocks of every type the tests bind.
#[test]
fn generators_make_valid_blocks() {
    let c = CpuBackend::new();
    let mut rng = Rng::new(80);
    for ty in [GgmlType::IQ2_XXS, GgmlType::Q2_K, GgmlType::Q4_K] {
        let bytes = weight_bytes(ty, 3, 512, &mut rng);
        let w = bind(&c, "w", ty, 3, 512, &bytes);
        let mut out = c.tensor(1, 3);
        c.matmul(&w, &c.tensor_from(1, 512, &rng.vec(512, 1.0)), &mut out)
            .unwrap();
        assert!(
            out.data.iter().all(|v| v.is_finite()),
            "{ty}: {:?}",
            out.data
        );
    }
    let t = hash_table(5, 8, 2, &mut rng);
    for row in t.chunks(2) {
        assert_ne!(row[0], row[1]);
        assert!(row.iter().all(|&e| (0..8).contains(&e)));
    }
}
