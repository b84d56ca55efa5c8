//! Timings of the CUDA kernels (not a pass/fail test): matvec bandwidth
//! per weight type, batched matmul throughput, paged attention decode.
//! `#[ignore]`d; run on the GPU machine by `scripts/device/cuda-tests.sh`.
//! Prints `PERF <name> <median µs> <derived rate>` lines.
#![cfg(feature = "cuda")]

use std::time::Instant;

use ds4_kernels::cuda::CudaBackend;
use ds4_kernels::quant::GgmlType;
use ds4_kernels::{
    AttentionConfig, Backend, HostBytes, KvPoolConfig, KvSeq, Numerics, WeightSource,
};

/// Runs of `f` between two synchronizations: the per-run time then holds
/// the kernels and their launch gaps, not a host round trip each.
const BATCH: usize = 10;

/// Median wall time of one run of `f` in microseconds (after warm-up),
/// over `iters` synchronized batches of [`BATCH`] runs.
fn time_us(be: &CudaBackend, iters: usize, mut f: impl FnMut()) -> f64 {
    for _ in 0..5 {
        f();
    }
    be.synchronize().unwrap();
    let mut v: Vec<f64> = (0..iters)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..BATCH {
                f();
            }
            be.synchronize().unwrap();
            t.elapsed().as_secs_f64() * 1e6 / BATCH as f64
        })
        .collect();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Random bytes with every f16 field small (valid enough for timing).
fn weight(
    be: &CudaBackend,
    ty: GgmlType,
    rows: usize,
    cols: usize,
) -> ds4_kernels::cuda::CudaWeight {
    let n = ty.row_bytes(cols).unwrap() * rows;
    let mut s = 0x1234_5678_u64;
    let mut bytes: Vec<u8> = (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 24) as u8 & 0x3b // clears f16 exponent MSBs: no inf/nan
        })
        .collect();
    if ty == GgmlType::F32 {
        for c in bytes.chunks_mut(4) {
            c.copy_from_slice(&0.01f32.to_le_bytes());
        }
    }
    be.bind_weight(WeightSource {
        name: "w".into(),
        ggml_type: ty,
        rows,
        cols,
        bytes: HostBytes::from_vec(bytes),
        device: None,
    })
    .unwrap()
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn perf_matmul() {
    let be = CudaBackend::new(0, Numerics::Production).unwrap();
    let (n_out, n_in) = (14336, 4096);
    for ty in [
        GgmlType::F16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q8_0,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
    ] {
        let w = weight(&be, ty, n_out, n_in);
        let bytes = (ty.row_bytes(n_in).unwrap() * n_out) as f64;
        for n_tok in [1usize, 16, 64, 512] {
            let x = be.tensor_from(n_tok, n_in, &vec![0.5; n_tok * n_in]);
            let mut out = be.tensor(n_tok, n_out);
            let us = time_us(&be, 20, || be.matmul(&w, &x, &mut out).unwrap());
            let rate = if n_tok == 1 {
                format!("{:.0} GB/s", bytes / us / 1e3)
            } else {
                format!(
                    "{:.1} TFLOP/s {:.0} GB/s",
                    2.0 * (n_out * n_in * n_tok) as f64 / us / 1e6,
                    bytes / us / 1e3
                )
            };
            println!(
                "PERF matmul_{}_{n_out}x{n_in}_tok{n_tok} {us:.1} us {rate}",
                ty.name()
            );
        }
    }
}

/// Small token batches (several decode streams): the tensor-core path
/// (tiled, split along K) against the dp4a kernel.
#[test]
#[ignore = "needs a CUDA GPU"]
fn perf_small_batches() {
    let be = CudaBackend::new(0, Numerics::Production).unwrap();
    let (n_out, n_in) = (14336, 4096);
    for ty in [GgmlType::Q4_1, GgmlType::Q4_K, GgmlType::Q6_K] {
        let w = weight(&be, ty, n_out, n_in);
        let bytes = (ty.row_bytes(n_in).unwrap() * n_out) as f64;
        for n_tok in [2usize, 4, 8, 16, 32] {
            let x = be.tensor_from(n_tok, n_in, &vec![0.5; n_tok * n_in]);
            let mut out = be.tensor(n_tok, n_out);
            for tc in [true, false] {
                be.set_tensor_cores(tc);
                let us = time_us(&be, 20, || be.matmul(&w, &x, &mut out).unwrap());
                println!(
                    "PERF small_{}_{n_out}x{n_in}_tok{n_tok}_{} {us:.1} us {:.0} GB/s",
                    ty.name(),
                    if tc { "tc" } else { "dp4a" },
                    bytes / us / 1e3
                );
            }
        }
        be.set_tensor_cores(true);
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn perf_attention_decode() {
    let be = CudaBackend::new(0, Numerics::Production).unwrap();
    let (n_head, n_head_kv, hd, bs) = (32, 8, 128, 16);
    let kv_dim = n_head_kv * hd;
    for (batch, ctx) in [(1usize, 4096usize), (16, 4096), (1, 32768)] {
        let per = ctx.div_ceil(bs) + 1;
        let pcfg = KvPoolConfig {
            n_layer: 1,
            kv_dim,
            block_size: bs,
            n_blocks: per * batch,
        };
        let mut pool = be.kv_pool(pcfg).unwrap();
        let tables: Vec<Vec<u32>> = (0..batch)
            .map(|b| (0..per).map(|i| (i * batch + b) as u32).collect())
            .collect();
        let seqs: Vec<KvSeq> = tables
            .iter()
            .enumerate()
            .map(|(b, t)| KvSeq {
                blocks: t,
                row: b,
                n_rows: 1,
                pos: ctx - 1,
            })
            .collect();
        let q = be.tensor_from(batch, n_head * hd, &vec![0.1; batch * n_head * hd]);
        let k = be.tensor_from(batch, kv_dim, &vec![0.1; batch * kv_dim]);
        let mut out = be.tensor(batch, n_head * hd);
        let cfg = AttentionConfig {
            n_head,
            n_head_kv,
            head_dim: hd,
            scale: 0.088,
        };
        let us = time_us(&be, 20, || {
            be.attention(&q, &k, &k, &mut pool, 0, &seqs, &cfg, &mut out)
                .unwrap()
        });
        let kv_bytes = (batch * ctx * kv_dim * 2 * 2) as f64;
        println!(
            "PERF attention_decode_b{batch}_ctx{ctx} {us:.1} us {:.0} GB/s of KV",
            kv_bytes / us / 1e3
        );
    }
}

/// Prefill attention of one sequence (`rows` new positions after `past`):
/// the tensor-core tiles against the split-KV kernel (tensor cores off).
#[test]
#[ignore = "needs a CUDA GPU"]
fn perf_attention_prefill() {
    let be = CudaBackend::new(0, Numerics::Production).unwrap();
    let (n_head, n_head_kv, hd, bs) = (28, 4, 128, 16);
    let kv_dim = n_head_kv * hd;
    for (rows, past) in [(512usize, 0usize), (4096, 0), (512, 3584)] {
        let n_blocks = (past + rows).div_ceil(bs);
        let pcfg = KvPoolConfig {
            n_layer: 1,
            kv_dim,
            block_size: bs,
            n_blocks,
        };
        let mut pool = be.kv_pool(pcfg).unwrap();
        let table: Vec<u32> = (0..n_blocks as u32).collect();
        let seqs = [KvSeq {
            blocks: &table,
            row: 0,
            n_rows: rows,
            pos: past,
        }];
        let q = be.tensor_from(rows, n_head * hd, &vec![0.1; rows * n_head * hd]);
        let k = be.tensor_from(rows, kv_dim, &vec![0.1; rows * kv_dim]);
        let mut out = be.tensor(rows, n_head * hd);
        let cfg = AttentionConfig {
            n_head,
            n_head_kv,
            head_dim: hd,
            scale: 0.088,
        };
        // q . k and p . v over the causal triangle (and the past).
        let pairs = (rows * past + rows * (rows + 1) / 2) as f64;
        let flops = 4.0 * pairs * (n_head * hd) as f64;
        for tc in [true, false] {
            be.set_tensor_cores(tc);
            let us = time_us(&be, 5, || {
                be.attention(&q, &k, &k, &mut pool, 0, &seqs, &cfg, &mut out)
                    .unwrap()
            });
            println!(
                "PERF attention_prefill_{}_rows{rows}_past{past} {us:.1} us {:.1} TFLOP/s",
                if tc { "tiles" } else { "split_kv" },
                flops / us / 1e6
            );
        }
        be.set_tensor_cores(true);
    }
}

/// Decode matvecs at the synthetic 7B's shapes.
#[test]
#[ignore = "needs a CUDA GPU"]
fn perf_matvec_7b_shapes() {
    let be = CudaBackend::new(0, Numerics::Production).unwrap();
    for ty in [
        GgmlType::Q4_K,
        GgmlType::Q6_K,
        GgmlType::Q4_1,
        GgmlType::Q8_0,
    ] {
        for (n_out, n_in) in [(3584, 3584), (512, 3584), (18944, 3584), (3584, 18944)] {
            let w = weight(&be, ty, n_out, n_in);
            let bytes = (ty.row_bytes(n_in).unwrap() * n_out) as f64;
            let x = be.tensor_from(1, n_in, &vec![0.5; n_in]);
            let mut out = be.tensor(1, n_out);
            let us = time_us(&be, 50, || be.matmul(&w, &x, &mut out).unwrap());
            println!(
                "PERF matvec_{}_{n_out}x{n_in} {us:.2} us {:.0} GB/s",
                ty.name(),
                bytes / us / 1e3
            );
        }
    }
}

/// Device-to-device copy of 2 GiB: the memory bandwidth a kernel that
/// streams its bytes can hope for (read + write counted).
#[test]
#[ignore = "needs a CUDA GPU"]
fn perf_copy_bandwidth() {
    let be = CudaBackend::new(0, Numerics::Production).unwrap();
    let s = be.stream().clone();
    let n = 2usize << 30;
    let src = s.alloc_zeros::<u8>(n).unwrap();
    let mut dst = s.alloc_zeros::<u8>(n).unwrap();
    let us = time_us(&be, 10, || s.memcpy_dtod(&src, &mut dst).unwrap());
    println!(
        "PERF copy_dtod_2GiB {us:.1} us {:.0} GB/s (read + write)",
        2.0 * n as f64 / us / 1e3
    );
}

/// The ops of one DeepSeek V4 Flash decode step at its shapes (d 4096,
/// 256 experts of n_ff 2048, k 6, the q2 expert types, Q8_0 projections,
/// 4 hyper-connection streams), one token: each op's time and the bytes it
/// must read. Weights rotate through enough copies (experts: a different
/// route each run) that they come from memory, not the 50 MB L2, as a
/// step's 43 layers do.
#[test]
#[ignore = "needs a CUDA GPU"]
fn perf_ds4_decode_ops() {
    use ds4_kernels::backend::HcConfig;
    let be = CudaBackend::new(0, Numerics::Production).unwrap();
    let (d, n_ff, ne, k) = (4096usize, 2048usize, 256usize, 6usize);
    let gate = weight(&be, GgmlType::IQ2_XXS, ne * n_ff, d);
    let up = weight(&be, GgmlType::IQ2_XXS, ne * n_ff, d);
    let down = weight(&be, GgmlType::Q2_K, ne * d, n_ff);
    let x = be.tensor_from(1, d, &vec![0.5; d]);
    let routes: Vec<_> = (0..40)
        .map(|i| {
            let ids: Vec<f32> = (0..k).map(|j| ((i * 37 + j * 41) % ne) as f32).collect();
            be.tensor_from(1, k, &ids)
        })
        .collect();
    let wts = be.tensor_from(1, k, &[0.15; 6]);
    let mut out = be.tensor(1, d);
    let mut i = 0;
    let us = time_us(&be, 30, || {
        be.moe_experts(
            &gate,
            &up,
            &down,
            ne,
            &x,
            &routes[i % routes.len()],
            &wts,
            10.0,
            &mut out,
        )
        .unwrap();
        i += 1;
    });
    let per_expert = 2 * GgmlType::IQ2_XXS.row_bytes(d).unwrap() * n_ff
        + GgmlType::Q2_K.row_bytes(n_ff).unwrap() * d;
    let bytes = (k * per_expert) as f64;
    println!(
        "PERF ds4_moe_experts_1x6 {us:.2} us {:.0} GB/s",
        bytes / us / 1e3
    );
    drop((gate, up, down));

    // Q8_0 projections: (name, rows, cols, groups), 8 copies each.
    let q8 = GgmlType::Q8_0;
    for (name, rows, cols, groups) in [
        ("q_b", 32768, 1024, 1),
        ("out_a", 8192, 4096, 8),
        ("out_b", 4096, 8192, 1),
        ("shared_down", 4096, 2048, 1),
    ] {
        let ws: Vec<_> = (0..8).map(|_| weight(&be, q8, rows, cols)).collect();
        let x = be.tensor_from(1, cols * groups, &vec![0.5; cols * groups]);
        let mut out = be.tensor(1, rows);
        let mut i = 0;
        let us = time_us(&be, 30, || {
            let w = &ws[i % ws.len()];
            if groups == 1 {
                be.matmul(w, &x, &mut out).unwrap();
            } else {
                be.matmul_grouped(w, &x, groups, &mut out).unwrap();
            }
            i += 1;
        });
        let bytes = (q8.row_bytes(cols).unwrap() * rows) as f64;
        println!(
            "PERF ds4_{name}_q8_0 {us:.2} us {:.0} GB/s",
            bytes / us / 1e3
        );
    }
    // The shared expert's gate and up in one launch.
    let pairs: Vec<_> = (0..8)
        .map(|_| (weight(&be, q8, n_ff, d), weight(&be, q8, n_ff, d)))
        .collect();
    let (mut g, mut u) = (be.tensor(1, n_ff), be.tensor(1, n_ff));
    let mut i = 0;
    let us = time_us(&be, 30, || {
        let (a, b) = &pairs[i % pairs.len()];
        be.matmul_many(&[a, b], None, &x, &mut [&mut g, &mut u])
            .unwrap();
        i += 1;
    });
    let bytes = (2 * q8.row_bytes(d).unwrap() * n_ff) as f64;
    println!(
        "PERF ds4_shared_gate_up_q8_0 {us:.2} us {:.0} GB/s",
        bytes / us / 1e3
    );

    // Hyper-connection pre: 4 streams of d, the F16 mix of 24 outputs.
    let cfg = HcConfig {
        n_hc: 4,
        iters: 20,
        eps: 1e-6,
        norm_eps: 1e-6,
    };
    let nw = cfg.mix_width();
    let mix = weight(&be, GgmlType::F16, nw, 4 * d);
    let scale = weight(&be, GgmlType::F32, 1, 3);
    let base = weight(&be, GgmlType::F32, 1, nw);
    let xs = be.tensor_from(1, 4 * d, &vec![0.25; 4 * d]);
    let (mut col, mut split) = (be.tensor(1, d), be.tensor(1, nw));
    let us = time_us(&be, 50, || {
        be.hc_pre(&xs, &mix, &scale, &base, &cfg, &mut col, &mut split)
            .unwrap()
    });
    println!("PERF ds4_hc_pre {us:.2} us");
    let y = be.tensor_from(1, d, &vec![0.1; d]);
    let mut xs2 = be.tensor_from(1, 4 * d, &vec![0.25; 4 * d]);
    let us = time_us(&be, 50, || be.hc_post(&mut xs2, &y, &split, &cfg));
    println!("PERF ds4_hc_post {us:.2} us");
    // The FFN's end as a decode step records it: the shared expert's add,
    // the post, the next sublayer's pre (fused where --cuda-hc-fuse).
    let (mut y3, shared) = (
        be.tensor_from(1, d, &vec![0.1; d]),
        be.tensor_from(1, d, &vec![0.05; d]),
    );
    let us = time_us(&be, 50, || {
        be.add_assign(&mut y3, &shared);
        be.hc_post(&mut xs2, &y3, &split, &cfg);
        be.hc_pre(&xs2, &mix, &scale, &base, &cfg, &mut col, &mut split)
            .unwrap()
    });
    println!("PERF ds4_add_hc_post_pre {us:.2} us");
}
