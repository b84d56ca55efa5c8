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
