//! Parity of the CUDA backend with the CPU reference, op by op, on random
//! data and random valid quant blocks. GPU tests: `#[ignore]`d, run on the
//! GPU machine with `--ignored --test-threads=1`
//! (`scripts/device/cuda-tests.sh`).
//!
//! Each check prints `PARITY <name> max_abs=<..> rel=<..> tol=<..>`, where
//! `rel = max |gpu - cpu| / max |cpu|` over the whole output, and fails
//! when `rel > tol`. Tolerances: 0 where both sides run the same
//! operations in the same order (embed, add, copies, argmax, KV bytes);
//! 1e-6 where a libm function may differ by an ulp or an f64 sum is
//! ordered differently (rope, swiglu, rms_norm); 1e-5 where the order of
//! f32 sums differs (matmul, attention); 2e-3 for production attention,
//! whose prefill rows run on f16 tensor cores (q and the softmax weights
//! rounded to f16). Measured on an H200 (sm_90): rope, rms_norm 0; swiglu
//! 4e-8; matmul <= 5e-7 (production, dp4a and tensor cores) and <= 8e-7
//! (exact); attention <= 4e-7 (exact).
#![cfg(feature = "cuda")]

mod cuda_common;

use cuda_common::*;
use ds4_kernels::quant::GgmlType;
use ds4_kernels::{
    AttentionConfig, Backend, CpuBackend, DenseLayer, DenseLayerConfig, KvPoolConfig, KvSeq,
    Numerics, RopeConfig, RopeMode,
};

const TYPES: [GgmlType; 9] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

#[test]
#[ignore = "needs a CUDA GPU"]
fn tensors_copy_row_to_host() {
    let g = gpu(Numerics::Production);
    let mut rng = Rng::new(1);
    let a = rng.vec(5 * 96, 3.0);
    let t = g.tensor_from(5, 96, &a);
    assert_eq!(g.dims(&t), (5, 96));
    assert_eq!(g.to_host(&t), a);
    let mut d = g.tensor(3, 96);
    g.copy_row(&t, 4, &mut d, 1);
    let h = g.to_host(&d);
    assert!(h[..96].iter().all(|&v| v == 0.0));
    assert_eq!(&h[96..192], &a[4 * 96..5 * 96]);
    println!("PARITY copy_row max_abs=0 rel=0 tol=0");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn embed_every_type() {
    let (g, c) = (gpu(Numerics::Production), CpuBackend::new());
    let mut rng = Rng::new(2);
    let (rows, cols) = (37, 512);
    let ids = [0u32, 36, 5, 5, 17, 2];
    for ty in TYPES {
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
    let bytes = weight_bytes(GgmlType::Q8_0, rows, cols, &mut rng);
    let w = bind(g, "tok", GgmlType::Q8_0, rows, cols, &bytes);
    assert!(
        g.embed(&w, &[37], &mut g.tensor(1, cols)).is_err(),
        "id past the vocabulary"
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn rms_norm_rows() {
    let (g, c) = (gpu(Numerics::Production), CpuBackend::new());
    let mut rng = Rng::new(3);
    for (rows, cols) in [(1, 4096), (7, 576), (3, 64)] {
        let x = rng.vec(rows * cols, 4.0);
        let (wg, wc) = row_weight(g, &c, "norm", &rng.vec(cols, 2.0));
        let (xg, xc) = (g.tensor_from(rows, cols, &x), c.tensor_from(rows, cols, &x));
        let (mut og, mut oc) = (g.tensor(rows, cols), c.tensor(rows, cols));
        g.rms_norm(&xg, &wg, 1e-5, &mut og);
        c.rms_norm(&xc, &wc, 1e-5, &mut oc);
        check(
            &format!("rms_norm_{rows}x{cols}"),
            &g.to_host(&og),
            &oc.data,
            1e-6,
        );
    }
}

/// An op that writes its whole output drops the pending zeroing of a
/// fresh output tensor (its zeros would never be read): the output,
/// landing on a dead tensor's values, is the same as one that was zeroed.
#[test]
#[ignore = "needs a CUDA GPU"]
fn fresh_outputs_skip_their_zeroing() {
    let g = gpu(Numerics::Production);
    let mut rng = Rng::new(5);
    let (rows, n_in, n_out) = (3, 1024, 512);
    let bytes = weight_bytes(GgmlType::Q8_0, n_out, n_in, &mut rng);
    let w = bind(g, "w", GgmlType::Q8_0, n_out, n_in, &bytes);
    let (nw, _) = row_weight(g, &CpuBackend::new(), "norm", &rng.vec(n_in, 2.0));
    let x = rng.vec(rows * n_in, 3.0);
    let run = |zeroed: bool| {
        // Nonzero values where the next tensors will be (the arena starts
        // over once no tensor is alive).
        drop(g.tensor_from(
            4 * rows,
            n_in + n_out,
            &rng_values(4 * rows * (n_in + n_out)),
        ));
        let xg = g.tensor_from(rows, n_in, &x);
        let (mut normed, mut out) = (g.tensor(rows, n_in), g.tensor(rows, n_out));
        if zeroed {
            // Reading them issues their zeroing.
            assert!(g
                .to_host(&normed)
                .iter()
                .chain(&g.to_host(&out))
                .all(|&v| v == 0.0));
        }
        let before = g.dropped_memsets();
        g.rms_norm(&xg, &nw, 1e-5, &mut normed);
        g.matmul(&w, &normed, &mut out).unwrap();
        let dropped = g.dropped_memsets() - before;
        assert_eq!(dropped, if zeroed { 0 } else { 2 }, "zeroings dropped");
        (g.to_host(&normed), g.to_host(&out))
    };
    let skipped = run(false);
    let zeroed = run(true);
    assert!(
        skipped == zeroed,
        "outputs written over stale values differ"
    );
    println!("PARITY fresh_outputs_skip_their_zeroing max_abs=0 rel=0 tol=0");
}

/// Values that are not zero.
fn rng_values(n: usize) -> Vec<f32> {
    (0..n).map(|i| 1.0 + (i % 97) as f32).collect()
}

/// The fused residual add + norm equals the two ops, bit for bit, on the
/// GPU, and matches the CPU.
#[test]
#[ignore = "needs a CUDA GPU"]
fn add_rms_norm_fused() {
    let (g, c) = (gpu(Numerics::Production), CpuBackend::new());
    let mut rng = Rng::new(31);
    for (rows, cols) in [(1, 576), (5, 3584)] {
        let (x, y) = (rng.vec(rows * cols, 4.0), rng.vec(rows * cols, 4.0));
        let (wg, wc) = row_weight(g, &c, "norm", &rng.vec(cols, 2.0));
        let yg = g.tensor_from(rows, cols, &y);
        let (mut xf, mut of) = (g.tensor_from(rows, cols, &x), g.tensor(rows, cols));
        g.add_rms_norm(&mut xf, &yg, &wg, 1e-5, &mut of);
        let (mut xs, mut os) = (g.tensor_from(rows, cols, &x), g.tensor(rows, cols));
        g.add_assign(&mut xs, &yg);
        g.rms_norm(&xs, &wg, 1e-5, &mut os);
        assert_eq!(g.to_host(&xf), g.to_host(&xs), "residual sum");
        assert_eq!(g.to_host(&of), g.to_host(&os), "norm");
        let (mut xc, yc, mut oc) = (
            c.tensor_from(rows, cols, &x),
            c.tensor_from(rows, cols, &y),
            c.tensor(rows, cols),
        );
        c.add_rms_norm(&mut xc, &yc, &wc, 1e-5, &mut oc);
        check(
            &format!("add_rms_norm_{rows}x{cols}"),
            &g.to_host(&of),
            &oc.data,
            1e-6,
        );
    }
}

/// Weights applied to one input (one quantization per activation
/// format), with biases (added by the decode kernels as they store), give
/// exactly what separate matmuls and bias adds give: weights of different
/// formats, and runs of one format that decode takes in one launch (three
/// at most; small and large Q4_K matrices keep their kernel).
#[test]
#[ignore = "needs a CUDA GPU"]
fn matmul_many_equals_separate_matmuls() {
    use GgmlType::{F16, Q4_1, Q4_K, Q6_K, Q8_0};
    let g = gpu(Numerics::Production);
    let mut rng = Rng::new(32);
    let cases: [&[(GgmlType, usize)]; 5] = [
        &[(Q4_K, 64), (Q6_K, 96), (F16, 128), (Q4_1, 160)],
        &[(Q4_1, 64), (Q4_1, 96), (Q4_1, 32), (Q4_1, 160)],
        &[(Q4_K, 64), (Q4_K, 96), (Q4_K, 128)],
        &[(Q4_K, 1024), (Q4_K, 1056), (Q6_K, 64)],
        &[(Q8_0, 64), (Q8_0, 96), (Q8_0, 32)],
    ];
    for case in cases {
        for n_tok in [1, 40] {
            let ws: Vec<_> = case
                .iter()
                .map(|&(ty, n_out)| {
                    let bytes = weight_bytes(ty, n_out, 1024, &mut rng);
                    bind(g, "w", ty, n_out, 1024, &bytes)
                })
                .collect();
            let x = g.tensor_from(n_tok, 1024, &rng.vec(n_tok * 1024, 2.0));
            let mut many: Vec<_> = ws.iter().map(|w| g.tensor(n_tok, w.rows)).collect();
            let refs: Vec<_> = ws.iter().collect();
            let mut outs: Vec<_> = many.iter_mut().collect();
            let bias_bytes: Vec<Vec<u8>> = ws
                .iter()
                .map(|w| f32_bytes(&rng.vec(w.rows, 1.0)))
                .collect();
            let biases: Vec<_> = ws
                .iter()
                .zip(&bias_bytes)
                .map(|(w, b)| bind(g, "b", GgmlType::F32, 1, w.rows, b))
                .collect();
            let bias_refs: Vec<_> = biases.iter().collect();
            g.matmul_many(&refs, Some(&bias_refs), &x, &mut outs)
                .unwrap();
            for ((w, b), got) in ws.iter().zip(&biases).zip(&many) {
                let mut want = g.tensor(n_tok, w.rows);
                g.matmul(w, &x, &mut want).unwrap();
                g.add_bias(&mut want, b);
                assert_eq!(
                    g.to_host(got),
                    g.to_host(&want),
                    "{} x {} with {n_tok} tokens in {case:?}",
                    w.ggml_type,
                    w.rows
                );
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn rope_normal_and_neox() {
    let (g, c) = (gpu(Numerics::Production), CpuBackend::new());
    let mut rng = Rng::new(4);
    let (rows, hd, heads) = (6, 128, 4);
    let positions = [0u32, 1, 7, 300, 4095, 70000];
    for (mode, n_rot, base, scale) in [
        (RopeMode::Normal, 128, 10000.0, 1.0),
        (RopeMode::Neox, 128, 1_000_000.0, 1.0),
        (RopeMode::Neox, 64, 10000.0, 0.25),
        (RopeMode::Normal, 96, 500000.0, 0.5),
    ] {
        let cfg = RopeConfig {
            mode,
            n_rot,
            freq_base: base,
            freq_scale: scale,
        };
        let x = rng.vec(rows * hd * heads, 2.0);
        let (mut xg, mut xc) = (
            g.tensor_from(rows, hd * heads, &x),
            c.tensor_from(rows, hd * heads, &x),
        );
        g.rope(&mut xg, &positions, hd, &cfg);
        c.rope(&mut xc, &positions, hd, &cfg);
        // f64 sin/cos of CUDA's libdevice and Rust's libm may differ in the
        // last f64 bit, which can flip an f32 rounding.
        check(
            &format!("rope_{mode:?}_rot{n_rot}"),
            &g.to_host(&xg),
            &xc.data,
            1e-6,
        );
        // Queries and keys (fewer heads) in one launch: the same values as
        // one rope each.
        let y = rng.vec(rows * hd, 2.0);
        let (mut q2, mut k2) = (
            g.tensor_from(rows, hd * heads, &x),
            g.tensor_from(rows, hd, &y),
        );
        g.rope_qk(&mut q2, &mut k2, &positions, hd, &cfg);
        let mut k1 = g.tensor_from(rows, hd, &y);
        g.rope(&mut k1, &positions, hd, &cfg);
        assert_eq!(g.to_host(&q2), g.to_host(&xg), "rope_qk queries");
        assert_eq!(g.to_host(&k2), g.to_host(&k1), "rope_qk keys");
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn swiglu_and_add() {
    let (g, c) = (gpu(Numerics::Production), CpuBackend::new());
    let mut rng = Rng::new(5);
    let (rows, cols) = (9, 1000);
    let (a, b) = (rng.vec(rows * cols, 8.0), rng.vec(rows * cols, 3.0));
    let (ag, bg) = (g.tensor_from(rows, cols, &a), g.tensor_from(rows, cols, &b));
    let (ac, bc) = (c.tensor_from(rows, cols, &a), c.tensor_from(rows, cols, &b));
    let (mut og, mut oc) = (g.tensor(rows, cols), c.tensor(rows, cols));
    g.swiglu(&ag, &bg, &mut og);
    c.swiglu(&ac, &bc, &mut oc);
    // expf of CUDA and of Rust's libm may differ by an ulp.
    check("swiglu", &g.to_host(&og), &oc.data, 1e-6);
    let (mut xg, mut xc) = (g.tensor_from(rows, cols, &a), c.tensor_from(rows, cols, &a));
    g.add_assign(&mut xg, &bg);
    c.add_assign(&mut xc, &bc);
    check("add_assign", &g.to_host(&xg), &xc.data, 0.0);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn add_bias_rows() {
    let (g, c) = (gpu(Numerics::Production), CpuBackend::new());
    let mut rng = Rng::new(8);
    for (rows, cols) in [(1, 3584), (9, 512), (5, 96)] {
        let x = rng.vec(rows * cols, 8.0);
        let (bg, bc) = row_weight(g, &c, "bias", &rng.vec(cols, 3.0));
        let (mut xg, mut xc) = (g.tensor_from(rows, cols, &x), c.tensor_from(rows, cols, &x));
        g.add_bias(&mut xg, &bg);
        c.add_bias(&mut xc, &bc);
        assert_ne!(xc.data, x, "the bias changed the rows");
        check(
            &format!("add_bias_{rows}x{cols}"),
            &g.to_host(&xg),
            &xc.data,
            0.0,
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn argmax_rows_first_on_ties() {
    let g = gpu(Numerics::Production);
    let mut rng = Rng::new(6);
    let (rows, cols) = (4, 50_000);
    let mut x = rng.vec(rows * cols, 10.0);
    x[cols + 777] = 20.0;
    x[cols + 30_000] = 20.0;
    x[2 * cols + 49_999] = 50.0;
    let got = g.argmax_rows(&g.tensor_from(rows, cols, &x)).unwrap();
    let want: Vec<u32> = x
        .chunks(cols)
        .map(|r| ds4_kernels::cpu::sampling::argmax(r).unwrap() as u32)
        .collect();
    assert_eq!(got, want);
    assert_eq!(got[1], 777);
    println!("PARITY argmax max_abs=0 rel=0 tol=0");
}

fn matmul_case(
    numerics: Numerics,
    ty: GgmlType,
    n_out: usize,
    n_in: usize,
    n_tok: usize,
    seed: u64,
) -> f32 {
    let g = gpu(numerics);
    let c = CpuBackend::with_numerics(numerics);
    let mut rng = Rng::new(seed);
    let bytes = weight_bytes(ty, n_out, n_in, &mut rng);
    let (wg, wc) = (
        bind(g, "w", ty, n_out, n_in, &bytes),
        bind(&c, "w", ty, n_out, n_in, &bytes),
    );
    let x = rng.vec(n_tok * n_in, 2.0);
    let (xg, xc) = (
        g.tensor_from(n_tok, n_in, &x),
        c.tensor_from(n_tok, n_in, &x),
    );
    let (mut og, mut oc) = (g.tensor(n_tok, n_out), c.tensor(n_tok, n_out));
    g.matmul(&wg, &xg, &mut og).unwrap();
    c.matmul(&wc, &xc, &mut oc).unwrap();
    let path = if numerics == Numerics::Exact || !ty.is_quantized() {
        "float"
    } else if ty == GgmlType::Q4_K && n_tok > 1 && n_tok <= g.mvt_tokens() && n_out >= 1024 {
        "mvt"
    } else if n_tok > g.dp4a_tokens().max(1) && g.tensor_cores() {
        "mma"
    } else {
        "dp4a"
    };
    check(
        &format!(
            "matmul_{numerics:?}_{path}_{}_{n_out}x{n_in}_tok{n_tok}",
            ty.name()
        ),
        &g.to_host(&og),
        &oc.data,
        1e-5,
    )
}

fn matmul_all(numerics: Numerics, tensor_cores: bool) {
    gpu(numerics).set_tensor_cores(tensor_cores);
    let mut failed = Vec::new();
    for (i, ty) in TYPES.into_iter().enumerate() {
        for (n_out, n_in, n_tok) in [
            (67, 2048, 1),
            (67, 2048, 3),
            (67, 2048, 13),
            (256, 4096, 1),
            (5, 256, 9),
            (130, 1024, 70),
            (33, 576, 1),
            (9, 18944, 1),
            (33, 576, 100),
            (96, 2304, 65),
            (1100, 2048, 1),
            (1100, 2048, 2),
            (1030, 4096, 9),
            (1030, 4096, 16),
            (300, 4096, 40),
            (40, 576, 20),
        ] {
            if ty.row_bytes(n_in).is_none() {
                continue; // 576 values are not whole K-quant super-blocks
            }
            let r = std::panic::catch_unwind(|| {
                matmul_case(numerics, ty, n_out, n_in, n_tok, 100 + i as u64)
            });
            if r.is_err() {
                failed.push(format!("{} {n_out}x{n_in} tok{n_tok}", ty.name()));
            }
        }
    }
    gpu(numerics).set_tensor_cores(true);
    assert!(failed.is_empty(), "failed: {failed:?}");
}

/// A Q8_0 row decoded alone (the staged matvecs) has the same bits as
/// that row in a batch on the tensor cores, for plain and grouped weights:
/// a token's result does not depend on its batch.
#[test]
#[ignore = "needs a CUDA GPU"]
fn q8_0_decode_rows_equal_batched_rows() {
    let g = gpu(Numerics::Production);
    if !g.staged_q8() {
        // mv_q adds a row's blocks in its own order: only the staged
        // kernels promise this (DS4_CUDA_STAGED_Q8=1).
        println!("PARITY q8_0_decode_batch_invariant skipped: staged Q8_0 matvecs are off");
        return;
    }
    let mut rng = Rng::new(77);
    let n_tok = 64;
    for n_in in [1024, 4096, 8192] {
        let n_out = 300;
        let bytes = weight_bytes(GgmlType::Q8_0, n_out, n_in, &mut rng);
        let w = bind(g, "w", GgmlType::Q8_0, n_out, n_in, &bytes);
        let x = rng.vec(n_tok * n_in, 2.0);
        let mut batch = g.tensor(n_tok, n_out);
        g.matmul(&w, &g.tensor_from(n_tok, n_in, &x), &mut batch)
            .unwrap();
        let batch = g.to_host(&batch);
        for t in [0, 17, 63] {
            let mut one = g.tensor(1, n_out);
            let xt = g.tensor_from(1, n_in, &x[t * n_in..(t + 1) * n_in]);
            g.matmul(&w, &xt, &mut one).unwrap();
            assert!(
                g.to_host(&one) == batch[t * n_out..(t + 1) * n_out],
                "Q8_0 {n_out}x{n_in}: token {t} alone differs from its row in a batch of {n_tok}"
            );
        }
    }
    // Grouped: 4 groups of 96 rows, each reading its 1024 inputs.
    let (groups, m, n) = (4, 96, 1024);
    let bytes = weight_bytes(GgmlType::Q8_0, groups * m, n, &mut rng);
    let w = bind(g, "wg", GgmlType::Q8_0, groups * m, n, &bytes);
    let x = rng.vec(n_tok * groups * n, 2.0);
    let mut batch = g.tensor(n_tok, groups * m);
    g.matmul_grouped(
        &w,
        &g.tensor_from(n_tok, groups * n, &x),
        groups,
        &mut batch,
    )
    .unwrap();
    let batch = g.to_host(&batch);
    for t in [0, 40] {
        let mut one = g.tensor(1, groups * m);
        let xt = g.tensor_from(1, groups * n, &x[t * groups * n..(t + 1) * groups * n]);
        g.matmul_grouped(&w, &xt, groups, &mut one).unwrap();
        assert!(
            g.to_host(&one) == batch[t * groups * m..(t + 1) * groups * m],
            "grouped Q8_0: token {t} alone differs from its row in a batch of {n_tok}"
        );
    }
    println!("PARITY q8_0_decode_batch_invariant max_abs=0 rel=0 tol=0");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn matmul_every_type_production() {
    matmul_all(Numerics::Production, true);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn matmul_every_type_production_dp4a() {
    matmul_all(Numerics::Production, false);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn matmul_every_type_exact() {
    matmul_all(Numerics::Exact, true);
}

/// Three sequences in one batch with non-contiguous block tables: a
/// prefill step, a mixed decode / chunked-prefill step, then the GPU pool
/// rebuilt from the CPU pool's bytes (kv_read_block -> kv_write_block) and
/// one more step; outputs and every block's bytes compared.
fn paged_attention(numerics: Numerics, n_head: usize, n_head_kv: usize, hd: usize) {
    let g = gpu(numerics);
    let c = CpuBackend::with_numerics(numerics);
    let mut rng = Rng::new(7 + hd as u64);
    let pcfg = KvPoolConfig {
        n_layer: 2,
        kv_dim: n_head_kv * hd,
        block_size: 16,
        n_blocks: 64,
    };
    let acfg = AttentionConfig {
        n_head,
        n_head_kv,
        head_dim: hd,
        scale: 1.0 / (hd as f32).sqrt(),
    };
    let (mut pg, mut pc) = (g.kv_pool(pcfg).unwrap(), c.kv_pool(pcfg).unwrap());
    assert_eq!(g.kv_dtype(&pg), c.kv_dtype(&pc));
    // C is long enough for the decode steps to split its positions.
    let tables: [&[u32]; 3] = [
        &[5, 17, 2],
        &[9, 31],
        &[
            30, 1, 12, 22, 40, 33, 3, 50, 61, 7, 8, 45, 19, 26, 55, 36, 14,
        ],
    ];
    // (n_rows, pos) of sequences A, B, C per step; `orders` lays their
    // rows out A B C, then B A C, then C B A.
    let steps: [[(usize, usize); 3]; 3] = [
        [(20, 0), (7, 0), (250, 0)],
        [(1, 20), (3, 7), (1, 250)],
        [(1, 21), (1, 10), (2, 251)],
    ];
    let orders: [[usize; 3]; 3] = [[0, 1, 2], [1, 0, 2], [2, 1, 0]];
    let tag = format!("{numerics:?}_h{n_head}_kv{n_head_kv}_d{hd}");
    for (step, (shape, order)) in steps.iter().zip(&orders).enumerate() {
        if step == 2 {
            // Rebuild the GPU pool from the CPU's bytes.
            pg = g.kv_pool(pcfg).unwrap();
            let mut buf = vec![0u8; pcfg.block_bytes(c.kv_dtype(&pc))];
            for b in 0..pcfg.n_blocks as u32 {
                c.kv_read_block(&pc, b, &mut buf).unwrap();
                g.kv_write_block(&mut pg, b, &buf).unwrap();
            }
        }
        let n: usize = shape.iter().map(|s| s.0).sum();
        let mut seqs = Vec::new();
        let mut row = 0;
        for &s in order {
            seqs.push(KvSeq {
                blocks: tables[s],
                row,
                n_rows: shape[s].0,
                pos: shape[s].1,
            });
            row += shape[s].0;
        }
        let q = rng.vec(n * n_head * hd, 1.5);
        let k = rng.vec(n * n_head_kv * hd, 1.5);
        let v = rng.vec(n * n_head_kv * hd, 1.5);
        let (qd, kd) = (n_head * hd, n_head_kv * hd);
        let (qg, kg, vg) = (
            g.tensor_from(n, qd, &q),
            g.tensor_from(n, kd, &k),
            g.tensor_from(n, kd, &v),
        );
        let (qc, kc, vc) = (
            c.tensor_from(n, qd, &q),
            c.tensor_from(n, kd, &k),
            c.tensor_from(n, kd, &v),
        );
        let (mut og, mut oc) = (g.tensor(n, qd), c.tensor(n, qd));
        g.attention(&qg, &kg, &vg, &mut pg, 1, &seqs, &acfg, &mut og)
            .unwrap();
        c.attention(&qc, &kc, &vc, &mut pc, 1, &seqs, &acfg, &mut oc)
            .unwrap();
        // Production: prefill rows on f16 tensor cores.
        let tol = if numerics == Numerics::Production {
            2e-3
        } else {
            1e-5
        };
        check(
            &format!("attention_{tag}_step{step}"),
            &g.to_host(&og),
            &oc.data,
            tol,
        );
    }
    let bb = pcfg.block_bytes(g.kv_dtype(&pg));
    let (mut a, mut b) = (vec![0u8; bb], vec![0u8; bb]);
    for blk in 0..pcfg.n_blocks as u32 {
        g.kv_read_block(&pg, blk, &mut a).unwrap();
        c.kv_read_block(&pc, blk, &mut b).unwrap();
        assert!(a == b, "{tag}: KV block {blk} bytes differ");
    }
    println!("PARITY kv_blocks_{tag} max_abs=0 rel=0 tol=0");
    // A table too short for the positions is refused.
    let seqs = [KvSeq {
        blocks: &[3],
        row: 0,
        n_rows: 1,
        pos: 16,
    }];
    let t = g.tensor(1, n_head * hd);
    let kv = g.tensor(1, n_head_kv * hd);
    let mut o = g.tensor(1, n_head * hd);
    assert!(g
        .attention(&t, &kv, &kv, &mut pg, 0, &seqs, &acfg, &mut o)
        .is_err());
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn paged_attention_production_f16() {
    paged_attention(Numerics::Production, 8, 2, 64);
    paged_attention(Numerics::Production, 4, 4, 128);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn paged_attention_exact_f32() {
    paged_attention(Numerics::Exact, 8, 2, 64);
    paged_attention(Numerics::Exact, 6, 1, 192);
}

/// A weight dropped while a recorded matmul that reads it has not been
/// issued yet stays allocated until it is: the result is still right.
#[test]
#[ignore = "needs a CUDA GPU"]
fn weight_dropped_before_its_matmul_is_issued() {
    let g = gpu(Numerics::Production);
    let mut rng = Rng::new(33);
    let bytes = weight_bytes(GgmlType::Q4_K, 64, 1024, &mut rng);
    let x = g.tensor_from(1, 1024, &rng.vec(1024, 2.0));
    let keep = bind(g, "keep", GgmlType::Q4_K, 64, 1024, &bytes);
    let mut want = g.tensor(1, 64);
    g.matmul(&keep, &x, &mut want).unwrap();
    let want = g.to_host(&want);
    let mut got = g.tensor(1, 64);
    {
        let gone = bind(g, "gone", GgmlType::Q4_K, 64, 1024, &bytes);
        g.matmul(&gone, &x, &mut got).unwrap();
    }
    // Allocations after the drop must not take the weight's memory either.
    let _other = bind(
        g,
        "other",
        GgmlType::Q4_K,
        64,
        1024,
        &vec![0u8; bytes.len()],
    );
    assert_eq!(g.to_host(&got), want);
}

/// A matmul's activation quantization fused into the RMSNorm or SwiGLU
/// launch that produced its input gives the same bits as its own launch
/// (forced by issuing the producer before the matmul is recorded).
#[test]
#[ignore = "needs a CUDA GPU"]
fn fused_activation_quantization_is_bit_identical() {
    let (g, c) = (gpu(Numerics::Production), CpuBackend::new());
    let mut rng = Rng::new(41);
    let n_out = 48;
    for (ty, cols, rows) in [
        (GgmlType::Q4_K, 1024, 1),
        (GgmlType::Q6_K, 3584, 3),
        (GgmlType::Q4_1, 576, 1),
        (GgmlType::Q8_0, 576, 5),
        // Past the 4,096 values a norm block keeps in shared memory.
        (GgmlType::Q4_K, 5120, 2),
    ] {
        let w = bind(
            g,
            "w",
            ty,
            n_out,
            cols,
            &weight_bytes(ty, n_out, cols, &mut rng),
        );
        let (nw, _) = row_weight(g, &c, "norm", &rng.vec(cols, 1.0));
        let (x, y) = (rng.vec(rows * cols, 2.0), rng.vec(rows * cols, 1.0));
        // (producer, issue it before the matmul) -> matmul output.
        let run = |producer: usize, issue_first: bool| {
            let mut xt = g.tensor_from(rows, cols, &x);
            let yt = g.tensor_from(rows, cols, &y);
            let mut h = g.tensor(rows, cols);
            match producer {
                0 => g.rms_norm(&xt, &nw, 1e-6, &mut h),
                1 => g.add_rms_norm(&mut xt, &yt, &nw, 1e-6, &mut h),
                _ => g.swiglu(&xt, &yt, &mut h),
            }
            if issue_first {
                g.synchronize().unwrap();
            }
            let before = g.fused_quantizations();
            let mut o = g.tensor(rows, n_out);
            g.matmul(&w, &h, &mut o).unwrap();
            let fused = g.fused_quantizations() - before;
            (g.to_host(&o), fused)
        };
        for producer in 0..3 {
            let (fused, n_fused) = run(producer, false);
            let (separate, n_separate) = run(producer, true);
            assert_eq!(
                (n_fused, n_separate),
                (1, 0),
                "{} producer {producer}",
                ty.name()
            );
            assert!(
                fused == separate,
                "{} {cols} x {rows} producer {producer}: fused quantization changed the result",
                ty.name()
            );
        }
    }
    println!("PARITY fused_activation_quantization max_abs=0 rel=0 tol=0");
}

/// The KV store fused into the RoPE launch before it (`rope_qk` then
/// `attention`) leaves the same queries, keys, pool contents and attention
/// output as the two launches apart: both RoPE modes, a partial rotation,
/// f16 and f32 pools, a prefilling and a decoding sequence.
#[test]
#[ignore = "needs a CUDA GPU"]
fn rope_fused_with_kv_store_is_bit_identical() {
    let mut rng = Rng::new(47);
    let (n_head, n_head_kv, hd) = (4, 2, 64);
    for (numerics, mode, n_rot) in [
        (Numerics::Production, RopeMode::Neox, 64),
        (Numerics::Production, RopeMode::Normal, 32),
        (Numerics::Exact, RopeMode::Neox, 32),
    ] {
        let g = gpu(numerics);
        let pcfg = KvPoolConfig {
            n_layer: 2,
            kv_dim: n_head_kv * hd,
            block_size: 16,
            n_blocks: 8,
        };
        let acfg = AttentionConfig {
            n_head,
            n_head_kv,
            head_dim: hd,
            scale: 1.0 / (hd as f32).sqrt(),
        };
        let rope = RopeConfig {
            mode,
            n_rot,
            freq_base: 10000.0,
            freq_scale: 1.0,
        };
        // Sequence 0 prefills 3 rows at 18..21, sequence 1 decodes at 5.
        let (t0, t1) = ([1u32, 4], [6u32]);
        let seqs = [
            KvSeq {
                blocks: &t0,
                row: 0,
                n_rows: 3,
                pos: 18,
            },
            KvSeq {
                blocks: &t1,
                row: 3,
                n_rows: 1,
                pos: 5,
            },
        ];
        let positions = [18, 19, 20, 5];
        let rows = 4;
        let q = rng.vec(rows * n_head * hd, 1.5);
        let k = rng.vec(rows * pcfg.kv_dim, 1.5);
        let v = rng.vec(rows * pcfg.kv_dim, 1.5);
        let run = |apart: bool| {
            let mut pool = g.kv_pool(pcfg).unwrap();
            let mut qt = g.tensor_from(rows, n_head * hd, &q);
            let mut kt = g.tensor_from(rows, pcfg.kv_dim, &k);
            let vt = g.tensor_from(rows, pcfg.kv_dim, &v);
            let mut att = g.tensor(rows, n_head * hd);
            g.rope_qk(&mut qt, &mut kt, &positions, hd, &rope);
            if apart {
                g.synchronize().unwrap();
            }
            let before = g.fused_rope_stores();
            g.attention(&qt, &kt, &vt, &mut pool, 1, &seqs, &acfg, &mut att)
                .unwrap();
            let fused = g.fused_rope_stores() - before;
            let mut blocks = Vec::new();
            for b in [1u32, 4, 6] {
                let mut buf = vec![0u8; pcfg.block_bytes(g.kv_dtype(&pool))];
                g.kv_read_block(&pool, b, &mut buf).unwrap();
                blocks.push(buf);
            }
            (g.to_host(&qt), g.to_host(&att), blocks, fused)
        };
        let (q_f, att_f, pool_f, n_f) = run(false);
        let (q_a, att_a, pool_a, n_a) = run(true);
        let what = format!("{numerics:?} {mode:?} n_rot {n_rot}");
        assert_eq!((n_f, n_a), (1, 0), "{what}: fusions");
        assert!(q_f == q_a, "{what}: queries differ");
        assert!(pool_f == pool_a, "{what}: pool contents differ");
        assert!(att_f == att_a, "{what}: attention output differs");
    }
    println!("PARITY rope_kv_store max_abs=0 rel=0 tol=0");
}

/// Decode attention output quantized inside the attention kernel (Q8_0
/// and Q8_1 activations: a head holds whole 32-value blocks) gives the
/// matmul exactly what a separate quantization gives; Q8_K activations
/// (256-value blocks across heads) are not fused there.
#[test]
#[ignore = "needs a CUDA GPU"]
fn attention_fused_quantization_is_bit_identical() {
    let g = gpu(Numerics::Production);
    let mut rng = Rng::new(43);
    let n_out = 40;
    for (ty, n_head, n_head_kv, hd, rows) in [
        (GgmlType::Q4_1, 9, 3, 64, 1),
        (GgmlType::Q4_1, 9, 3, 64, 3),
        (GgmlType::Q8_0, 4, 2, 128, 5),
        (GgmlType::Q4_K, 8, 2, 128, 2),
    ] {
        let cols = n_head * hd;
        let w = bind(
            g,
            "w",
            ty,
            n_out,
            cols,
            &weight_bytes(ty, n_out, cols, &mut rng),
        );
        let pcfg = KvPoolConfig {
            n_layer: 1,
            kv_dim: n_head_kv * hd,
            block_size: 16,
            n_blocks: 2 * rows,
        };
        let acfg = AttentionConfig {
            n_head,
            n_head_kv,
            head_dim: hd,
            scale: 1.0 / (hd as f32).sqrt(),
        };
        let mut pool = g.kv_pool(pcfg).unwrap();
        let tables: Vec<[u32; 2]> = (0..rows as u32).map(|r| [2 * r, 2 * r + 1]).collect();
        let seqs: Vec<KvSeq> = (0..rows)
            .map(|r| KvSeq {
                blocks: &tables[r],
                row: r,
                n_rows: 1,
                pos: 17 + r,
            })
            .collect();
        let q = rng.vec(rows * cols, 1.5);
        let k = rng.vec(rows * pcfg.kv_dim, 1.5);
        let v = rng.vec(rows * pcfg.kv_dim, 1.5);
        let mut run = |issue_first: bool| {
            let qt = g.tensor_from(rows, cols, &q);
            let kt = g.tensor_from(rows, pcfg.kv_dim, &k);
            let vt = g.tensor_from(rows, pcfg.kv_dim, &v);
            let mut att = g.tensor(rows, cols);
            g.attention(&qt, &kt, &vt, &mut pool, 0, &seqs, &acfg, &mut att)
                .unwrap();
            if issue_first {
                g.synchronize().unwrap();
            }
            let before = g.fused_quantizations();
            let mut o = g.tensor(rows, n_out);
            g.matmul(&w, &att, &mut o).unwrap();
            (g.to_host(&o), g.fused_quantizations() - before)
        };
        let (fused, n_fused) = run(false);
        let (separate, n_separate) = run(true);
        let want = u64::from(ty.vec_dot_type() != GgmlType::Q8_K);
        assert_eq!(
            (n_fused, n_separate),
            (want, 0),
            "{} with {rows} rows",
            ty.name()
        );
        assert!(
            fused == separate,
            "{} with {rows} rows: fused quantization changed the result",
            ty.name()
        );
    }
    println!("PARITY attention_fused_quantization max_abs=0 rel=0 tol=0");
}

/// One dense decoder layer (width `e`, feed-forward `f`) op by op, what a
/// llama forward pass runs for it, on any backend: the reference for the
/// fused layer.
#[allow(clippy::too_many_arguments)]
fn layer_ops<B: Backend>(
    be: &B,
    (e, f): (usize, usize),
    l: &DenseLayer<'_, B::Weight>,
    cfg: &DenseLayerConfig,
    x: &mut B::Tensor,
    pool: &mut B::KvPool,
    index: usize,
    seq: &KvSeq<'_>,
) {
    let n = be.dims(x).0;
    let a = &cfg.attn;
    let (qd, kvd) = (a.n_head * a.head_dim, a.n_head_kv * a.head_dim);
    let positions: Vec<u32> = (seq.pos..seq.pos + n).map(|p| p as u32).collect();
    let mut h = be.tensor(n, e);
    let (mut q, mut k, mut v) = (be.tensor(n, qd), be.tensor(n, kvd), be.tensor(n, kvd));
    let (mut att, mut proj) = (be.tensor(n, qd), be.tensor(n, e));
    let (mut gate, mut up, mut act) = (be.tensor(n, f), be.tensor(n, f), be.tensor(n, f));
    be.rms_norm(x, l.attn_norm, cfg.rms_eps, &mut h);
    be.matmul_many(&[l.wq, l.wk, l.wv], None, &h, &mut [&mut q, &mut k, &mut v])
        .unwrap();
    be.rope_qk(&mut q, &mut k, &positions, a.head_dim, &cfg.rope);
    be.attention(
        &q,
        &k,
        &v,
        pool,
        index,
        std::slice::from_ref(seq),
        a,
        &mut att,
    )
    .unwrap();
    be.matmul(l.wo, &att, &mut proj).unwrap();
    be.add_rms_norm(x, &proj, l.ffn_norm, cfg.rms_eps, &mut h);
    be.matmul_many(&[l.w_gate, l.w_up], None, &h, &mut [&mut gate, &mut up])
        .unwrap();
    be.swiglu(&gate, &up, &mut act);
    be.matmul(l.w_down, &act, &mut proj).unwrap();
    be.add_assign(x, &proj);
}

/// A layer of norm scales `attn_norm`, `ffn_norm` and matrices `m` (q, k,
/// v, o, gate, up, down).
fn dense<'a, W>(attn_norm: &'a W, ffn_norm: &'a W, m: &'a [W]) -> DenseLayer<'a, W> {
    DenseLayer {
        attn_norm,
        wq: &m[0],
        wk: &m[1],
        wv: &m[2],
        wo: &m[3],
        ffn_norm,
        w_gate: &m[4],
        w_up: &m[5],
        w_down: &m[6],
    }
}

/// The fused decoder layer (one cluster launch) against the CPU running
/// the layer op by op: the residual row after the layer and the key and
/// value it stored, at the first position, after a prefill, across the
/// position splits of a long context, and at a block boundary. Both sides
/// quantize activations to Q8_1 and store an f16 pool, but the fused
/// kernel sums in another order, so a value can land on the other side of
/// a rounding step: 1e-2 of the largest value (a wrong head, position or
/// block is off by O(1)).
fn fused_layer_case(e: usize, f: usize, n_head: usize, n_head_kv: usize) {
    let g = gpu(Numerics::Production);
    let c = CpuBackend::with_numerics(Numerics::Production);
    let hd = 64;
    let mut rng = Rng::new((e * 31 + n_head) as u64);
    let (qd, kvd) = (n_head * hd, n_head_kv * hd);
    let mats = [
        ("wq", qd, e),
        ("wk", kvd, e),
        ("wv", kvd, e),
        ("wo", e, qd),
        ("w_gate", f, e),
        ("w_up", f, e),
        ("w_down", e, f),
    ];
    let mut wg = Vec::new();
    let mut wc = Vec::new();
    for (name, rows, cols) in mats {
        let bytes = weight_bytes(GgmlType::Q4_1, rows, cols, &mut rng);
        wg.push(bind(g, name, GgmlType::Q4_1, rows, cols, &bytes));
        wc.push(bind(&c, name, GgmlType::Q4_1, rows, cols, &bytes));
    }
    let norm_vals: Vec<Vec<f32>> = (0..2)
        .map(|_| (0..e).map(|_| 1.0 + 0.5 * rng.f()).collect())
        .collect();
    let (ang, anc) = row_weight(g, &c, "attn_norm", &norm_vals[0]);
    let (fng, fnc) = row_weight(g, &c, "ffn_norm", &norm_vals[1]);
    let (layer_g, layer_c) = (dense(&ang, &fng, &wg), dense(&anc, &fnc, &wc));
    let cfg = DenseLayerConfig {
        attn: AttentionConfig {
            n_head,
            n_head_kv,
            head_dim: hd,
            scale: 1.0 / (hd as f32).sqrt(),
        },
        rope: RopeConfig {
            mode: RopeMode::Normal,
            n_rot: hd,
            freq_base: 10000.0,
            freq_scale: 1.0,
        },
        rms_eps: 1e-5,
    };
    let pcfg = KvPoolConfig {
        n_layer: 2,
        kv_dim: kvd,
        block_size: 16,
        n_blocks: 32,
    };
    let (mut pg, mut pc) = (g.kv_pool(pcfg).unwrap(), c.kv_pool(pcfg).unwrap());
    assert!(
        g.fuses_dense_layer(&layer_g, &cfg, &pg, 1),
        "the fused layer does not take e {e}, f {f}, {n_head}/{n_head_kv} heads"
    );
    assert!(!g.fuses_dense_layer(&layer_g, &cfg, &pg, 2), "two rows");
    let table: Vec<u32> = (0..20).map(|i| (i * 7 + 3) % 32).collect();
    let seq = |pos: usize, n_rows: usize| KvSeq {
        blocks: &table,
        row: 0,
        n_rows,
        pos,
    };
    let tag = format!("e{e}_f{f}_h{n_head}_kv{n_head_kv}");
    // The layer op by op on the CPU, into layer 1 of the pool.
    let cpu_layer =
        |x: &mut <CpuBackend as Backend>::Tensor,
         pool: &mut <CpuBackend as Backend>::KvPool,
         s: &KvSeq<'_>| layer_ops(&c, (e, f), &layer_c, &cfg, x, pool, 1, s);
    // (prefill this many positions on the CPU first, then decode at pos).
    let steps: [(usize, usize); 5] = [(0, 0), (0, 1), (62, 63), (0, 64), (200, 264)];
    for (prefill, pos) in steps {
        if prefill > 0 {
            let start = pos - prefill;
            let xs = rng.vec(prefill * e, 1.0);
            let mut xc = c.tensor_from(prefill, e, &xs);
            cpu_layer(&mut xc, &mut pc, &seq(start, prefill));
            let mut buf = vec![0u8; pcfg.block_bytes(c.kv_dtype(&pc))];
            for b in 0..pcfg.n_blocks as u32 {
                c.kv_read_block(&pc, b, &mut buf).unwrap();
                g.kv_write_block(&mut pg, b, &buf).unwrap();
            }
        }
        let x = rng.vec(e, 1.0);
        let mut xg = g.tensor_from(1, e, &x);
        let mut xc = c.tensor_from(1, e, &x);
        g.dense_layer(&layer_g, &cfg, &mut xg, &mut pg, 1, &seq(pos, 1))
            .unwrap();
        cpu_layer(&mut xc, &mut pc, &seq(pos, 1));
        check(
            &format!("fused_layer_{tag}_pos{pos}"),
            &g.to_host(&xg),
            &xc.data,
            1e-2,
        );
        // The key and value stored at pos (layer 1 of its block).
        let bb = pcfg.block_bytes(g.kv_dtype(&pg));
        let (mut a, mut b) = (vec![0u8; bb], vec![0u8; bb]);
        let blk = table[pos / 16];
        g.kv_read_block(&pg, blk, &mut a).unwrap();
        c.kv_read_block(&pc, blk, &mut b).unwrap();
        let at =
            |buf: &[u8], i: usize| half::f16::from_le_bytes([buf[2 * i], buf[2 * i + 1]]).to_f32();
        let base = 2 * 16 * kvd + (pos % 16) * kvd;
        let kv = |buf: &[u8]| -> Vec<f32> {
            (0..kvd)
                .flat_map(|i| [at(buf, base + i), at(buf, base + 16 * kvd + i)])
                .collect()
        };
        check(
            &format!("fused_layer_kv_{tag}_pos{pos}"),
            &kv(&a),
            &kv(&b),
            1e-2,
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn fused_decoder_layer() {
    let g = gpu(Numerics::Production);
    if g.arch() < 90 {
        eprintln!("sm_{}: no fused decoder layer below sm_90", g.arch());
        return;
    }
    // SmolLM2-135M's shape (3 q heads per kv head), and a smaller one.
    fused_layer_case(576, 1536, 9, 3);
    fused_layer_case(128, 256, 4, 2);
}
