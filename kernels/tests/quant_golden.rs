//! ggml quant formats against golden vectors from an independent reference
//! (the `gguf` Python package; see `fixtures/quant/README.md`), plus the
//! properties the dot products must have.
//!
//! Tolerances:
//! - dequantization and quantization: exact (bitwise), because our kernels
//!   perform the same f32 operations in the same order as ggml.
//! - `vec_dot` vs an f64 dot of the dequantized rows: `1e-6 * mag`, where
//!   `mag = sum_i (|w_i| + max|w| of i's block) * |a_i|` bounds the f32
//!   rounding of per-block scale products and of the accumulation, plus,
//!   for Q4_1/Q5_1 × Q8_1, `sum_b |m_b| * |s_b| * 2^-10` for the f16
//!   rounding of Q8_1's `s = d * sum(q)` that ggml's formulation uses
//!   instead of the exact sum.
//! - SIMD vs scalar kernels: `1e-6 * mag` (integer parts are exact; only
//!   f32 accumulation order differs).
//!
//! Observed errors are below `2e-8 * mag` for every type, so the bounds
//! leave a 50x margin while still catching any wrong quant or scale.

use ds4_kernels::quant::{
    dequantize_row, dot_isa, quantize_row, simd_dot_types, vec_dot, vec_dot_scalar, DotIsa,
    GgmlType, QuantError,
};

const GOLDEN: &[u8] = include_bytes!("fixtures/quant/golden.bin");

/// One record of `golden.bin`.
struct Record {
    quantize: bool,
    ty: GgmlType,
    values: Vec<f32>,
    bytes: Vec<u8>,
}

fn read_u32(b: &[u8], off: &mut usize) -> u32 {
    let v = u32::from_le_bytes(b[*off..*off + 4].try_into().unwrap());
    *off += 4;
    v
}

fn golden_records() -> Vec<Record> {
    assert_eq!(&GOLDEN[..8], b"DS4QGLD1", "golden.bin magic");
    let mut off = 8;
    let mut out = Vec::new();
    while off < GOLDEN.len() {
        let kind = read_u32(GOLDEN, &mut off);
        let id = read_u32(GOLDEN, &mut off);
        let n = read_u32(GOLDEN, &mut off) as usize;
        let nbytes = read_u32(GOLDEN, &mut off) as usize;
        let ty = GgmlType::from_id(id).unwrap_or_else(|| panic!("unknown type id {id}"));
        let take_bytes = |off: &mut usize| {
            let v = GOLDEN[*off..*off + nbytes].to_vec();
            *off += nbytes;
            v
        };
        let take_values = |off: &mut usize| {
            let v: Vec<f32> = GOLDEN[*off..*off + 4 * n]
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect();
            *off += 4 * n;
            v
        };
        let (values, bytes) = match kind {
            0 => {
                let b = take_bytes(&mut off);
                (take_values(&mut off), b)
            }
            1 => {
                let v = take_values(&mut off);
                (v, take_bytes(&mut off))
            }
            k => panic!("unknown record kind {k}"),
        };
        out.push(Record {
            quantize: kind == 1,
            ty,
            values,
            bytes,
        });
    }
    out
}

#[test]
fn dequantize_matches_reference_bitwise() {
    let mut seen = Vec::new();
    for (i, r) in golden_records().iter().filter(|r| !r.quantize).enumerate() {
        let mut got = vec![0f32; r.values.len()];
        dequantize_row(r.ty, &r.bytes, &mut got).unwrap();
        for (j, (g, e)) in got.iter().zip(&r.values).enumerate() {
            assert_eq!(
                g.to_bits(),
                e.to_bits(),
                "{} record {i}, element {j}: got {g}, expected {e}",
                r.ty
            );
        }
        seen.push(r.ty);
    }
    use GgmlType::*;
    for ty in [
        F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ2_XXS,
    ] {
        assert!(seen.contains(&ty), "no dequantization golden for {ty}");
    }
}

#[test]
fn quantize_matches_reference_bytes() {
    let mut seen = Vec::new();
    for (i, r) in golden_records().iter().filter(|r| r.quantize).enumerate() {
        let mut got = vec![0u8; r.bytes.len()];
        quantize_row(r.ty, &r.values, &mut got).unwrap();
        assert_eq!(got, r.bytes, "{} record {i}", r.ty);
        seen.push(r.ty);
    }
    use GgmlType::*;
    for ty in [F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1] {
        assert!(seen.contains(&ty), "no quantization golden for {ty}");
    }
}

#[test]
fn type_table_matches_ggml() {
    use GgmlType::*;
    // (type, id, name, block size, bytes per block) from ggml's type_traits
    // and the static_asserts of ggml-common.h.
    let table = [
        (F32, 0, "f32", 1, 4),
        (F16, 1, "f16", 1, 2),
        (Q4_0, 2, "q4_0", 32, 18),
        (Q4_1, 3, "q4_1", 32, 20),
        (Q5_0, 6, "q5_0", 32, 22),
        (Q5_1, 7, "q5_1", 32, 24),
        (Q8_0, 8, "q8_0", 32, 34),
        // ggml's block_q8_1 is two f16 + 32 quants (the gguf Python table
        // still lists the older 40-byte f32 layout).
        (Q8_1, 9, "q8_1", 32, 36),
        (Q2_K, 10, "q2_K", 256, 84),
        (Q3_K, 11, "q3_K", 256, 110),
        (Q4_K, 12, "q4_K", 256, 144),
        (Q5_K, 13, "q5_K", 256, 176),
        (Q6_K, 14, "q6_K", 256, 210),
        (Q8_K, 15, "q8_K", 256, 292),
        (IQ2_XXS, 16, "iq2_xxs", 256, 66),
        (BF16, 30, "bf16", 1, 2),
    ];
    assert_eq!(table.len(), GgmlType::ALL.len());
    for (ty, id, name, bs, ts) in table {
        assert_eq!(ty.id(), id, "{name}");
        assert_eq!(GgmlType::from_id(id), Some(ty));
        assert_eq!(ty.name(), name);
        assert_eq!(ty.to_string(), name);
        assert_eq!(ty.block_size(), bs, "{name}");
        assert_eq!(ty.type_size(), ts, "{name}");
        assert_eq!(ty.row_bytes(0), Some(0));
        assert_eq!(ty.row_bytes(bs * 7), Some(ts * 7), "{name}");
        if bs > 1 {
            assert_eq!(ty.row_bytes(bs + 1), None, "{name}");
            assert_eq!(ty.row_bytes(bs / 2), None, "{name}");
        }
        let huge = usize::MAX / bs * bs;
        assert_eq!(
            ty.row_bytes(huge),
            (huge / bs).checked_mul(ts),
            "{name} overflow"
        );
    }
    assert_eq!(F32.row_bytes(usize::MAX), None, "overflow");
    assert_eq!(Q8_0.row_bytes(usize::MAX / 32 * 32), None, "overflow");
    for id in [4, 5, 17, 29, 31, 1000] {
        assert_eq!(GgmlType::from_id(id), None, "id {id}");
    }
    let dot = [
        (F32, F32),
        (F16, F16),
        (BF16, BF16),
        (Q4_0, Q8_0),
        (Q5_0, Q8_0),
        (Q8_0, Q8_0),
        (Q4_1, Q8_1),
        (Q5_1, Q8_1),
        (Q2_K, Q8_K),
        (Q3_K, Q8_K),
        (Q4_K, Q8_K),
        (Q5_K, Q8_K),
        (Q6_K, Q8_K),
        (IQ2_XXS, Q8_K),
    ];
    for (w, a) in dot {
        assert_eq!(w.vec_dot_type(), a, "{w}");
    }
}

#[test]
fn wrong_lengths_are_typed_errors() {
    let mut out = vec![0f32; 64];
    // Q4_1: 64 elements are 2 blocks of 20 bytes.
    let err = dequantize_row(GgmlType::Q4_1, &[0u8; 39], &mut out).unwrap_err();
    assert_eq!(
        err,
        QuantError::ByteLength {
            ty: GgmlType::Q4_1,
            elements: 64,
            expected: 40,
            got: 39
        }
    );
    assert!(err.to_string().contains("expected") || err.to_string().contains("40 bytes"));
    let err = dequantize_row(GgmlType::Q4_K, &[0u8; 144], &mut out).unwrap_err();
    assert_eq!(
        err,
        QuantError::PartialBlock {
            ty: GgmlType::Q4_K,
            elements: 64,
            block_size: 256
        }
    );
    let mut bytes = vec![0u8; 68];
    // 64 elements of Q8_0 take exactly 68 bytes.
    assert!(quantize_row(GgmlType::Q8_0, &[0f32; 64], &mut bytes).is_ok());
    let err = quantize_row(GgmlType::Q8_0, &[0f32; 64], &mut bytes[..60]).unwrap_err();
    assert_eq!(
        err,
        QuantError::ByteLength {
            ty: GgmlType::Q8_0,
            elements: 64,
            expected: 68,
            got: 60
        }
    );
    let err = quantize_row(GgmlType::Q8_0, &[0f32; 40], &mut bytes).unwrap_err();
    assert!(matches!(err, QuantError::PartialBlock { elements: 40, .. }));
    for ty in [
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::IQ2_XXS,
    ] {
        let mut b = vec![0u8; ty.type_size()];
        let err = quantize_row(ty, &[0f32; 256], &mut b).unwrap_err();
        assert_eq!(err, QuantError::Unsupported { ty });
        assert!(!ty.can_quantize());
    }
}

/// splitmix64: a small deterministic generator for test data.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in [-1, 1).
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
    fn floats(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.unit() * scale).collect()
    }
}

/// Offsets of the f16 scale fields per block, as in `gen_golden.py`.
fn scale_fields(ty: GgmlType) -> &'static [usize] {
    use GgmlType::*;
    match ty {
        Q4_0 | Q5_0 | Q8_0 | IQ2_XXS => &[0],
        Q4_1 | Q5_1 | Q4_K | Q5_K => &[0, 2],
        Q2_K => &[80, 82],
        Q3_K => &[108],
        Q6_K => &[208],
        _ => &[],
    }
}

/// A weight row of `n` elements: random bytes with plausible f16 scales
/// (every quant bit pattern), or quantized random floats where we can.
fn weight_row(rng: &mut Rng, ty: GgmlType, n: usize, random_bytes: bool) -> Vec<u8> {
    let mut w = vec![0u8; ty.row_bytes(n).unwrap()];
    let random_bytes = random_bytes || !ty.can_quantize();
    if random_bytes && ty.is_quantized() && !matches!(ty, GgmlType::Q8_1 | GgmlType::Q8_K) {
        for b in w.iter_mut() {
            *b = rng.next() as u8;
        }
        for block in w.chunks_exact_mut(ty.type_size()) {
            for &off in scale_fields(ty) {
                let v = half::f16::from_f32(0.001 + 0.05 * rng.unit().abs());
                block[off..off + 2].copy_from_slice(&v.to_bits().to_le_bytes());
            }
        }
    } else {
        quantize_row(ty, &rng.floats(n, 2.0), &mut w).unwrap();
    }
    w
}

fn act_row(rng: &mut Rng, ty: GgmlType, n: usize) -> Vec<u8> {
    let at = ty.vec_dot_type();
    let mut a = vec![0u8; at.row_bytes(n).unwrap()];
    quantize_row(at, &rng.floats(n, 3.0), &mut a).unwrap();
    a
}

fn dequant(ty: GgmlType, b: &[u8], n: usize) -> Vec<f32> {
    let mut v = vec![0f32; n];
    dequantize_row(ty, b, &mut v).unwrap();
    v
}

/// `sum_i (|w_i| + max|w| over i's block) * |a_i|`.
fn magnitude(ty: GgmlType, w: &[f32], a: &[f32]) -> f64 {
    let bs = ty.block_size().max(32);
    w.chunks(bs)
        .zip(a.chunks(bs))
        .map(|(w, a)| {
            let wmax = w.iter().fold(0f32, |m, v| m.max(v.abs())) as f64;
            w.iter()
                .zip(a)
                .map(|(&w, &a)| (w.abs() as f64 + wmax) * a.abs() as f64)
                .sum::<f64>()
        })
        .sum()
}

/// Bound on the f16 rounding of Q8_1's `s` in ggml's Q4_1/Q5_1 dots.
fn q8_1_sum_term(ty: GgmlType, w: &[u8], a: &[u8]) -> f64 {
    if ty.vec_dot_type() != GgmlType::Q8_1 || ty == GgmlType::Q8_1 {
        return 0.0;
    }
    let f16 = |b: &[u8]| half::f16::from_le_bytes([b[0], b[1]]).to_f64();
    w.chunks_exact(ty.type_size())
        .zip(a.chunks_exact(36))
        .map(|(w, a)| (f16(&w[2..]) * f16(&a[2..])).abs() * 2f64.powi(-10) + 1e-12)
        .sum()
}

fn all_weight_types() -> impl Iterator<Item = GgmlType> {
    GgmlType::ALL.into_iter()
}

#[test]
fn vec_dot_matches_f64_dot_of_dequantized_rows() {
    let mut rng = Rng(1);
    for ty in all_weight_types() {
        for &blocks in &[1usize, 3, 6] {
            let n = blocks * ty.block_size().max(32);
            for random_bytes in [false, true] {
                let w = weight_row(&mut rng, ty, n, random_bytes);
                let a = act_row(&mut rng, ty, n);
                let wf = dequant(ty, &w, n);
                let af = dequant(ty.vec_dot_type(), &a, n);
                let exact: f64 = wf.iter().zip(&af).map(|(&x, &y)| x as f64 * y as f64).sum();
                let tol = 1e-6 * magnitude(ty, &wf, &af) + q8_1_sum_term(ty, &w, &a);
                for (path, got) in [
                    ("dispatch", vec_dot(ty, n, &w, &a)),
                    ("scalar", vec_dot_scalar(ty, n, &w, &a)),
                ] {
                    assert!(
                        (got as f64 - exact).abs() <= tol,
                        "{ty} {path} n={n} random_bytes={random_bytes}: got {got}, \
                         exact {exact}, tolerance {tol}"
                    );
                }
            }
        }
    }
}

#[test]
fn simd_kernels_agree_with_scalar() {
    let mut rng = Rng(2);
    for ty in all_weight_types() {
        // Odd and even block counts exercise the two-accumulator tails;
        // 576 and 1536 are the SmolLM2-135M row lengths.
        let sizes: Vec<usize> = if ty.block_size() == 256 {
            vec![256, 512, 768, 1536, 2816]
        } else {
            vec![32, 64, 96, 576, 1536, 40, 200]
        };
        for n in sizes {
            if ty.row_bytes(n).is_none() {
                continue;
            }
            for random_bytes in [false, true] {
                let w = weight_row(&mut rng, ty, n, random_bytes);
                let a = act_row(&mut rng, ty, n);
                let simd = vec_dot(ty, n, &w, &a);
                let scalar = vec_dot_scalar(ty, n, &w, &a);
                let wf = dequant(ty, &w, n);
                let af = dequant(ty.vec_dot_type(), &a, n);
                let tol = 1e-6 * magnitude(ty, &wf, &af) + 1e-30;
                assert!(
                    (simd as f64 - scalar as f64).abs() <= tol,
                    "{ty} n={n}: simd {simd}, scalar {scalar}, tolerance {tol}"
                );
            }
        }
    }
}

#[test]
fn simd_is_used_where_available() {
    let simd = simd_dot_types();
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("fma")
        && std::arch::is_x86_feature_detected!("f16c")
    {
        assert_eq!(dot_isa(), DotIsa::Avx2);
        for ty in [
            GgmlType::Q4_1,
            GgmlType::Q8_0,
            GgmlType::Q4_0,
            GgmlType::Q5_0,
            GgmlType::Q4_K,
            GgmlType::Q6_K,
        ] {
            assert!(simd.contains(&ty), "{ty} has no SIMD kernel");
        }
        return;
    }
    assert_eq!(dot_isa(), DotIsa::Scalar);
    assert!(simd.is_empty());
}

#[test]
fn q8_1_stores_d_and_d_times_sum() {
    let mut rng = Rng(3);
    let x = rng.floats(32 * 8, 5.0);
    let mut q = vec![0u8; GgmlType::Q8_1.row_bytes(x.len()).unwrap()];
    quantize_row(GgmlType::Q8_1, &x, &mut q).unwrap();
    for (xb, b) in x.chunks_exact(32).zip(q.chunks_exact(36)) {
        let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let sum: i32 = b[4..].iter().map(|&v| v as i8 as i32).sum();
        let d16 = half::f16::from_le_bytes([b[0], b[1]]);
        let s16 = half::f16::from_le_bytes([b[2], b[3]]);
        assert_eq!(d16, half::f16::from_f32(d));
        // s is computed from the unrounded f32 scale, as in ggml.
        assert_eq!(s16, half::f16::from_f32(sum as f32 * d));
        assert!(b[4..].iter().all(|&v| v as i8 != -128));
    }
    // The Q8_0 quants of the same data are identical.
    let mut q0 = vec![0u8; GgmlType::Q8_0.row_bytes(x.len()).unwrap()];
    quantize_row(GgmlType::Q8_0, &x, &mut q0).unwrap();
    for (b0, b1) in q0.chunks_exact(34).zip(q.chunks_exact(36)) {
        assert_eq!(b0[..2], b1[..2]);
        assert_eq!(b0[2..], b1[4..]);
    }
}

#[test]
fn q8_k_stores_f32_scale_and_block_sums() {
    let mut rng = Rng(4);
    let mut x = rng.floats(256 * 3, 7.0);
    x[256..512].fill(0.0);
    let mut q = vec![0u8; GgmlType::Q8_K.row_bytes(x.len()).unwrap()];
    quantize_row(GgmlType::Q8_K, &x, &mut q).unwrap();
    for (i, (xb, b)) in x.chunks_exact(256).zip(q.chunks_exact(292)).enumerate() {
        let d = f32::from_le_bytes(b[..4].try_into().unwrap());
        let qs: Vec<i32> = b[4..260].iter().map(|&v| v as i8 as i32).collect();
        for (j, bs) in b[260..].chunks_exact(2).enumerate() {
            let s = i16::from_le_bytes([bs[0], bs[1]]) as i32;
            assert_eq!(
                s,
                qs[16 * j..16 * j + 16].iter().sum::<i32>(),
                "block {i} bsum {j}"
            );
        }
        if i == 1 {
            assert_eq!(d, 0.0);
            assert!(b.iter().all(|&v| v == 0), "zero block");
            continue;
        }
        let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
        assert!((d.abs() - amax / 127.0).abs() <= 1e-6 * amax);
        assert!(qs.iter().all(|&v| (-127..=127).contains(&v)));
        for (&xv, &qv) in xb.iter().zip(&qs) {
            assert!((xv - d * qv as f32).abs() <= d.abs() * 0.5001);
        }
    }
}

#[test]
fn quantize_dequantize_error_is_within_half_a_step() {
    let mut rng = Rng(5);
    let x = rng.floats(32 * 16, 3.0);
    for (ty, levels) in [
        (GgmlType::Q4_0, 8.0f32),
        (GgmlType::Q4_1, 15.0),
        (GgmlType::Q5_0, 16.0),
        (GgmlType::Q5_1, 31.0),
        (GgmlType::Q8_0, 127.0),
    ] {
        let mut q = vec![0u8; ty.row_bytes(x.len()).unwrap()];
        quantize_row(ty, &x, &mut q).unwrap();
        let y = dequant(ty, &q, x.len());
        for (xb, yb) in x.chunks_exact(32).zip(y.chunks_exact(32)) {
            let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
            // Step is at most 2 * amax / levels (range / levels for _1
            // formats), plus f16 rounding of the scale and min.
            let step = 2.0 * amax / levels;
            for (a, b) in xb.iter().zip(yb) {
                assert!(
                    (a - b).abs() <= 0.5 * step + 2e-3 * amax,
                    "{ty}: {a} vs {b}"
                );
            }
        }
    }
}
