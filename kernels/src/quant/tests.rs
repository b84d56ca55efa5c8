//! Unit tests of the quant internals, and a micro-benchmark of the dots.
//!
//! The golden-vector and property tests of the public API live in
//! `kernels/tests/quant_golden.rs`.

use super::*;

/// Deterministic pseudo-random floats in [-scale, scale).
pub(crate) fn floats(seed: u64, n: usize, scale: f32) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

/// `x` quantized to `ty` as one row.
pub(crate) fn quantized(ty: GgmlType, x: &[f32]) -> Vec<u8> {
    let mut q = vec![0u8; ty.row_bytes(x.len()).expect("whole blocks")];
    quantize_row(ty, x, &mut q).expect("quantizable");
    q
}

#[test]
fn q3_k_scales_unpack_like_ggml() {
    // ggml unpacks through four u32 words; check the closed form against
    // that word-level formulation on every byte pattern of one position.
    for seed in 0..64u64 {
        let raw: Vec<u8> = floats(seed, 12, 1.0)
            .iter()
            .map(|v| (v.to_bits() >> 7) as u8)
            .collect();
        let mut aux = [0u32; 3];
        for (a, c) in aux.iter_mut().zip(raw.chunks_exact(4)) {
            *a = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        }
        let (k1, k2) = (0x0303_0303u32, 0x0f0f_0f0fu32);
        let tmp = aux[2];
        let words = [
            (aux[0] & k2) | ((tmp & k1) << 4),
            (aux[1] & k2) | (((tmp >> 2) & k1) << 4),
            ((aux[0] >> 4) & k2) | (((tmp >> 4) & k1) << 4),
            ((aux[1] >> 4) & k2) | (((tmp >> 6) & k1) << 4),
        ];
        let expected: Vec<i32> = words
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .map(|b| b as i8 as i32 - 32)
            .collect();
        assert_eq!(k_quants::q3k_scales(&raw).to_vec(), expected);
    }
}

#[test]
fn zero_rows_dot_to_zero() {
    for ty in GgmlType::ALL {
        let n = ty.block_size().max(32) * 2;
        let w = vec![0u8; ty.row_bytes(n).unwrap()];
        let a = quantized(ty.vec_dot_type(), &floats(1, n, 1.0));
        assert_eq!(vec_dot(ty, n, &w, &a), 0.0, "{ty}");
        assert_eq!(vec_dot_scalar(ty, n, &w, &a), 0.0, "{ty}");
    }
}

#[test]
fn four_row_dots_equal_single_row_dots_bit_for_bit() {
    // Batched prefill uses vec_dot_x4; it must give exactly what four
    // vec_dot calls give, or batched and token-by-token logits would drift.
    for ty in [
        GgmlType::Q4_1,
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::F32,
    ] {
        for blocks in [1usize, 2, 3, 18, 48] {
            let n = ty.block_size().max(32) * blocks;
            let w = quantized(ty, &floats(10 + blocks as u64, n, 1.0));
            let acts: Vec<Vec<u8>> = (0..4)
                .map(|r| quantized(ty.vec_dot_type(), &floats(20 + r, n, 3.0)))
                .collect();
            let got = vec_dot_x4(ty, n, &w, [&acts[0], &acts[1], &acts[2], &acts[3]]);
            for r in 0..4 {
                let want = vec_dot(ty, n, &w, &acts[r]);
                assert_eq!(
                    got[r].to_bits(),
                    want.to_bits(),
                    "{ty}, {blocks} blocks, row {r}"
                );
            }
        }
    }
}

/// Q4_1 and Q8_0, the tiled GEMM's formats, give the scalar kernel's
/// result bit for bit on every path (the SIMD row kernel, four
/// activation or four weight rows at once), on random rows and on rows of extreme and zero blocks.
#[test]
fn gemm_formats_dot_bit_identical_to_scalar() {
    for ty in [GgmlType::Q4_1, GgmlType::Q8_0] {
        let at = ty.vec_dot_type();
        for (seed, &n) in [32usize, 64, 96, 576, 1536].iter().enumerate() {
            let mut wf = floats(seed as u64, n, 1.0);
            wf[..32].fill(0.0);
            if n > 64 {
                for (j, v) in wf[32..64].iter_mut().enumerate() {
                    *v = if j % 3 == 0 { 40.0 } else { -0.001 * j as f32 };
                }
            }
            let w = quantized(ty, &wf);
            let acts: Vec<Vec<u8>> = (0..4)
                .map(|r| quantized(at, &floats(100 + r, n, 10f32.powi(r as i32 - 2))))
                .collect();
            let four = vec_dot_x4(ty, n, &w, [&acts[0], &acts[1], &acts[2], &acts[3]]);
            for (r, a) in acts.iter().enumerate() {
                let want = vec_dot_scalar(ty, n, &w, a).to_bits();
                assert_eq!(vec_dot(ty, n, &w, a).to_bits(), want, "{ty} n={n} row {r}");
                assert_eq!(four[r].to_bits(), want, "{ty} n={n} row {r} (x4)");
            }
            // Four weight rows (the extreme one among them) against each
            // activation row.
            let ws: Vec<Vec<u8>> = (0..4)
                .map(|i| {
                    if i == 2 {
                        w.clone()
                    } else {
                        quantized(ty, &floats(50 + i, n, 2.0))
                    }
                })
                .collect();
            for (r, a) in acts.iter().enumerate() {
                let got = vec_dot_rows4(ty, n, [&ws[0], &ws[1], &ws[2], &ws[3]], a);
                for (i, w) in ws.iter().enumerate() {
                    let want = vec_dot_scalar(ty, n, w, a).to_bits();
                    assert_eq!(
                        got[i].to_bits(),
                        want,
                        "{ty} n={n} act {r} weight row {i} (rows4)"
                    );
                }
            }
        }
    }
}

/// The F16C conversion that the Q4_1 / Q8_0 kernels use for block scales
/// equals the conversion table of the scalar kernels for every f16 bit
/// pattern, NaNs included (both quiet them and keep the payload).
#[cfg(target_arch = "x86_64")]
#[test]
fn f16c_conversion_matches_the_table() {
    if let Some(cvt) = super::simd_x86::f16c_conversions() {
        for (h, v) in cvt.into_iter().enumerate() {
            assert_eq!(v.to_bits(), types::F16_TO_F32[h].to_bits(), "f16 {h:#06x}");
        }
    }
}

#[test]
fn vec_dot_reads_only_n_elements() {
    // Slices longer than `n` elements: debug builds reject the mismatch,
    // release builds compute on the first `n` elements only.
    let n = 64;
    let x = floats(2, 2 * n, 1.0);
    let w = quantized(GgmlType::Q4_1, &x);
    let a = quantized(GgmlType::Q8_1, &x);
    let wb = GgmlType::Q4_1.row_bytes(n).unwrap();
    let ab = GgmlType::Q8_1.row_bytes(n).unwrap();
    let want = vec_dot(GgmlType::Q4_1, n, &w[..wb], &a[..ab]);
    let got = std::panic::catch_unwind(|| vec_dot(GgmlType::Q4_1, n, &w, &a));
    if cfg!(debug_assertions) {
        assert!(got.is_err());
    } else {
        assert_eq!(got.ok(), Some(want));
    }
}

/// Micro-benchmark, not a test: ns per row dot and weight-bytes throughput,
/// SIMD vs scalar. Run with
/// `cargo test -p ds4-kernels --release --lib -- --ignored --nocapture bench_vec_dot`.
#[test]
#[ignore = "benchmark; run explicitly with --ignored --nocapture"]
fn bench_vec_dot() {
    use std::hint::black_box;
    use std::time::Instant;

    println!("dot isa: {:?}", dot_isa());
    for (ty, n) in [
        (GgmlType::Q4_1, 576),
        (GgmlType::Q4_1, 1536),
        (GgmlType::Q8_0, 576),
        (GgmlType::Q8_0, 1536),
        (GgmlType::Q4_0, 1536),
        (GgmlType::Q5_0, 1536),
        (GgmlType::Q4_K, 1536),
        (GgmlType::Q6_K, 1536),
    ] {
        // 512 rows: 160 KiB to 540 KiB of weights, resident in L2 like a
        // layer's matrix slice in a decode step.
        let rows = 512;
        let w: Vec<Vec<u8>> = (0..rows)
            .map(|r| match ty {
                GgmlType::Q4_K | GgmlType::Q6_K => {
                    let mut b = vec![0u8; ty.row_bytes(n).unwrap()];
                    for (i, v) in b.iter_mut().enumerate() {
                        *v = (i * 131 + r * 7) as u8;
                    }
                    b
                }
                _ => quantized(ty, &floats(r as u64, n, 1.0)),
            })
            .collect();
        let a = quantized(ty.vec_dot_type(), &floats(999, n, 1.0));
        let row_bytes = ty.row_bytes(n).unwrap() as f64;
        let mut line = format!("{:5} n={n:5}", ty.name());
        for (name, f) in [
            ("simd", vec_dot as fn(GgmlType, usize, &[u8], &[u8]) -> f32),
            ("scalar", vec_dot_scalar),
        ] {
            let mut best = f64::MAX;
            for _ in 0..5 {
                let reps = 40;
                let t = Instant::now();
                let mut acc = 0f32;
                for _ in 0..reps {
                    for row in &w {
                        acc += f(ty, n, black_box(row), black_box(&a));
                    }
                }
                black_box(acc);
                best = best.min(t.elapsed().as_nanos() as f64 / (reps * rows) as f64);
            }
            line += &format!("  {name}: {best:7.1} ns/row {:6.2} GB/s", row_bytes / best);
        }
        println!("{line}");
    }
}
