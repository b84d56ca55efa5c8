//! x86_64 AVX2 + FMA + F16C dot kernels.
//!
//! This is the only module of the quant code that uses `unsafe`: the
//! `std::arch` intrinsics are `unsafe fn`s (they need CPU features the
//! compiler cannot assume for a generic x86_64 build), and the kernels read
//! blocks through raw pointers so that the hot loops carry no bounds
//! checks. Soundness rests on two invariants, each stated where it is used:
//!
//! 1. **Features.** Every kernel is a `#[target_feature(enable =
//!    "avx2,fma,f16c")] unsafe fn`. The safe wrappers that call them are
//!    private and only reachable through the table that [`install`] fills
//!    after `is_x86_feature_detected!` confirmed all three features.
//! 2. **Bounds.** A kernel handles `nb = min(w.len() / W, a.len() / A)`
//!    blocks (W, A the block sizes) and only loads bytes
//!    `[i * W, (i + 1) * W)` and `[i * A, (i + 1) * A)` for `i < nb`.
//!
//! The kernels follow ggml's AVX2 formulation (`ggml-cpu-quants.c`): widen
//! the quants to bytes, `maddubs` (u8 × i8 → i16 pairs) then `madd` with
//! ones or the sub-block scales (→ i32), convert, and FMA with the block
//! scale. Integer sums are exact; only the float accumulation order
//! differs from the scalar kernels. Where ggml subtracts an offset from
//! the weight quants first (Q4_0, Q5_0, Q6_K), these kernels keep the
//! quants unsigned and subtract `offset * activation` instead, which stays
//! exact for every activation byte. Only Q8_0 × Q8_0 uses ggml's
//! sign trick and needs activation quants in [-127, 127], which
//! `quantize_row` guarantees.
//!
//! Q4_1 × Q8_1 and Q8_0 × Q8_0, the formats of the tiled GEMM, are the
//! exception: they keep the scalar kernels' float arithmetic exactly (the
//! exact integer dot of each block, then the scalar's f32 operations in
//! block order), so they are bit-identical to them, and the tiled GEMM,
//! which does the same per (weight row, activation row) pair, is too.

#![allow(unsafe_code)]

use std::arch::x86_64::*;

use super::dot::{DotIsa, DotTable};
use super::k_quants::k4_scales_mins;
use super::GgmlType;

/// Installs the AVX2 kernels into `table` if the CPU has AVX2, FMA and
/// F16C.
pub(super) fn install(table: &mut DotTable) {
    if !avx2_available() {
        return;
    }
    table.set_simd(GgmlType::F32, dot_f32);
    table.set_simd(GgmlType::F16, dot_f16);
    table.set_simd(GgmlType::Q4_0, dot_q4_0_q8_0);
    table.set_simd(GgmlType::Q4_1, dot_q4_1_q8_1);
    table.set_simd(GgmlType::Q5_0, dot_q5_0_q8_0);
    table.set_simd(GgmlType::Q5_1, dot_q5_1_q8_1);
    table.set_simd(GgmlType::Q8_0, dot_q8_0_q8_0);
    table.set_simd(GgmlType::Q4_K, dot_q4_k_q8_k);
    table.set_simd(GgmlType::Q6_K, dot_q6_k_q8_k);
    table.set_simd4(GgmlType::Q4_1, dot4_q4_1_q8_1);
    table.set_simd4(GgmlType::Q8_0, dot4_q8_0_q8_0);
    if vnni_available() {
        table.set_rows4(GgmlType::Q4_1, rows4_q4_1_q8_1_vnni);
        table.set_rows4(GgmlType::Q8_0, rows4_q8_0_q8_0_vnni);
    } else {
        table.set_rows4(GgmlType::Q4_1, rows4_q4_1_q8_1);
        table.set_rows4(GgmlType::Q8_0, rows4_q8_0_q8_0);
    }
    table.isa = DotIsa::Avx2;
}

/// Asks the CPU to bring every cache line of `data` into L2 (a hint:
/// nothing is read, nothing can fault), so that what is read soon after
/// comes from cache rather than memory. Into L2, not L1: data streaming
/// from memory arrives in bursts, and bursts of prefetches into L1 stall
/// on its few miss buffers.
#[inline]
pub(crate) fn prefetch_l2<T>(data: &[T]) {
    let (p, bytes) = (data.as_ptr().cast::<i8>(), std::mem::size_of_val(data));
    for off in (0..bytes).step_by(64) {
        // SAFETY: SSE (baseline on x86_64); a prefetch of any address is
        // defined and never faults, and `p + off` lies inside `data`.
        unsafe { _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(off)) };
    }
}

/// Whether this CPU runs the AVX2 kernels: AVX2, FMA and F16C.
pub(super) fn avx2_available() -> bool {
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
}

/// Whether it also has AVX-512 F, VL and VNNI (the `_vnni` kernels here
/// and the tiled GEMM of `gemm_x86.rs`).
pub(super) fn vnni_available() -> bool {
    avx2_available()
        && is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512vnni")
}

/// Declares a private safe wrapper around an AVX2 kernel.
macro_rules! wrapper {
    ($name:ident) => {
        fn $name(w: &[u8], a: &[u8]) -> f32 {
            // SAFETY: this function is private and only stored in the dot
            // table by `install`, after AVX2, FMA and F16C were detected.
            // The kernel bounds its reads by the slice lengths.
            unsafe { avx2::$name(w, a) }
        }
    };
}

wrapper!(dot_f32);
wrapper!(dot_f16);
wrapper!(dot_q4_0_q8_0);
wrapper!(dot_q4_1_q8_1);
wrapper!(dot_q5_0_q8_0);
wrapper!(dot_q5_1_q8_1);
wrapper!(dot_q8_0_q8_0);
wrapper!(dot_q4_k_q8_k);
wrapper!(dot_q6_k_q8_k);

/// Declares a private safe wrapper around a four-row AVX2 kernel.
macro_rules! wrapper4 {
    ($name:ident) => {
        fn $name(w: &[u8], a: [&[u8]; 4]) -> [f32; 4] {
            // SAFETY: as for `wrapper!`: stored only by `install` after the
            // features were detected; reads are bounded by the slices.
            unsafe { avx2::$name(w, a) }
        }
    };
}

wrapper4!(dot4_q4_1_q8_1);
wrapper4!(dot4_q8_0_q8_0);

/// Declares a private safe wrapper around a four-weight-row kernel.
macro_rules! wrapper_rows4 {
    ($name:ident) => {
        fn $name(w: [&[u8]; 4], a: &[u8]) -> [f32; 4] {
            // SAFETY: as for `wrapper!`: stored only by `install` after the
            // features were detected (AVX-512 VL and VNNI too for the
            // `_vnni` kernels); reads are bounded by the slices.
            unsafe { avx2::$name(w, a) }
        }
    };
}

wrapper_rows4!(rows4_q4_1_q8_1);
wrapper_rows4!(rows4_q8_0_q8_0);
wrapper_rows4!(rows4_q4_1_q8_1_vnni);
wrapper_rows4!(rows4_q8_0_q8_0_vnni);

mod avx2 {
    //! The kernels. Every function here requires AVX2, FMA and F16C, and
    //! every pointer argument must point at a whole block (see the module
    //! invariants above).

    use super::*;
    use crate::quant::activation::{Q8_0_BYTES, Q8_1_BYTES, Q8_K_BSUMS, Q8_K_BYTES};
    use crate::quant::k_quants::{Q4_K_BYTES, Q6_K_BYTES};
    use crate::quant::q4::{Q4_0_BYTES, Q4_1_BYTES};
    use crate::quant::q5::{Q5_0_BYTES, Q5_1_BYTES};
    use crate::quant::types::{F16_TO_F32, QK_K};

    /// Horizontal sum of eight f32 lanes.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn hsum_ps(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_movehdup_ps(s));
        _mm_cvtss_f32(s)
    }

    /// The f16 at `p` as f32, through the conversion table (one load; a
    /// `vcvtph2ps` needs the value moved into a vector register first).
    #[inline(always)]
    unsafe fn f16_load(p: *const u8) -> f32 {
        F16_TO_F32[p.cast::<u16>().read_unaligned() as usize]
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load256(p: *const u8) -> __m256i {
        _mm256_loadu_si256(p.cast())
    }

    /// 16 bytes of packed nibbles at `p` as 32 bytes: low nibbles (elements
    /// 0..16) in the low lane, high nibbles (16..32) in the high lane.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn nibbles32(p: *const u8) -> __m256i {
        let x = _mm_loadu_si128(p.cast());
        let both = _mm256_set_m128i(_mm_srli_epi16(x, 4), x);
        _mm256_and_si256(both, _mm256_set1_epi8(0x0f))
    }

    /// The 32 bits of the little-endian u32 at `p` as 32 bytes, 0x10 where
    /// the bit is set (the fifth bit of a Q5 quant) and 0 elsewhere.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn fifth_bits32(p: *const u8) -> __m256i {
        let qh = p.cast::<i32>().read_unaligned();
        // Byte i of the result looks at byte i / 8 of qh ...
        let spread = _mm256_shuffle_epi8(
            _mm256_set1_epi32(qh),
            _mm256_setr_epi8(
                0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, //
                2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3,
            ),
        );
        // ... and tests bit i % 8 of it.
        let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
        let set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
        _mm256_and_si256(set, _mm256_set1_epi8(0x10))
    }

    /// `u8 × i8` products of 32 bytes summed to eight i32 lanes.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dot_u8_i8(x: __m256i, y: __m256i) -> __m256i {
        _mm256_madd_epi16(_mm256_maddubs_epi16(x, y), _mm256_set1_epi16(1))
    }

    /// Like [`dot_u8_i8`] for weights offset by `-bias`: `sum((x - bias) * y)`.
    /// Pair sums stay below 2 * 31 * 128, far from i16 saturation.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dot_u8_i8_biased(x: __m256i, y: __m256i, bias: __m256i) -> __m256i {
        let p = _mm256_sub_epi16(_mm256_maddubs_epi16(x, y), _mm256_maddubs_epi16(bias, y));
        _mm256_madd_epi16(p, _mm256_set1_epi16(1))
    }

    /// Number of whole blocks both rows hold.
    #[inline(always)]
    fn blocks(w: &[u8], wb: usize, a: &[u8], ab: usize) -> usize {
        (w.len() / wb).min(a.len() / ab)
    }

    /// Generates the four-weight-row kernels (Q4_1 × Q8_1, Q8_0 × Q8_0) for
    /// one feature set; `$vnni`: whether they may use `vpdpbusd`.
    ///
    /// Each is [`dot_q4_1_q8_1`] / [`dot_q8_0_q8_0`] of four weight rows
    /// with one activation row, one row per f32 lane: the activation
    /// block is loaded once, the four blocks' integer sums are reduced
    /// together, their scales converted together, and each lane performs
    /// the single-row kernel's f32 operations in its order, so results
    /// are bit-identical to it. Integer lane sums, exact either way:
    /// `maddubs` + `madd` (AVX2) or `vpdpbusd`; Q8_0 on VNNI takes
    /// `x + 128` (u8) and starts from `-128 * sum4(y)`, since
    /// `(x + 128) * y - 128 * y = x * y`.
    macro_rules! rows4_kernels {
        ($q41:ident, $q80:ident, $features:literal, $vnni:literal) => {
            #[target_feature(enable = $features)]
            pub(super) unsafe fn $q41(w: [&[u8]; 4], a: &[u8]) -> [f32; 4] {
                let nb = blocks_rows4(&w, Q4_1_BYTES, a, Q8_1_BYTES);
                let (wp, ap) = (w.map(|r| r.as_ptr()), a.as_ptr());
                prefetch_ahead(&w);
                let mut sumf = _mm_setzero_ps();
                for i in 0..nb {
                    // SAFETY: i < nb, so every block read lies inside its row.
                    let y = ap.add(i * Q8_1_BYTES);
                    let x = wp.map(|p| p.add(i * Q4_1_BYTES));
                    let qy = load256(y.add(4));
                    let sumi = hsum4_epi32_v(x.map(|x| {
                        if $vnni {
                            _mm256_dpbusd_epi32(_mm256_setzero_si256(), nibbles32(x.add(4)), qy)
                        } else {
                            dot_u8_i8(nibbles32(x.add(4)), qy)
                        }
                    }));
                    let (dw, mw) = f16_pairs4(x);
                    let d = _mm_mul_ps(dw, _mm_set1_ps(f16_load(y)));
                    let mins = _mm_mul_ps(mw, _mm_set1_ps(f16_load(y.add(2))));
                    let t = _mm_add_ps(_mm_mul_ps(d, _mm_cvtepi32_ps(sumi)), mins);
                    sumf = _mm_add_ps(sumf, t);
                }
                let mut out = [0f32; 4];
                _mm_storeu_ps(out.as_mut_ptr(), sumf);
                out
            }

            #[target_feature(enable = $features)]
            pub(super) unsafe fn $q80(w: [&[u8]; 4], a: &[u8]) -> [f32; 4] {
                let nb = blocks_rows4(&w, Q8_0_BYTES, a, Q8_0_BYTES);
                let (wp, ap) = (w.map(|r| r.as_ptr()), a.as_ptr());
                prefetch_ahead(&w);
                let mut sumf = _mm_setzero_ps();
                for i in 0..nb {
                    // SAFETY: i < nb, so every block read lies inside its row.
                    let y = ap.add(i * Q8_0_BYTES);
                    let x = wp.map(|p| p.add(i * Q8_0_BYTES));
                    let qy = load256(y.add(2));
                    let sumi = if $vnni {
                        let bias = _mm256_set1_epi8(-128);
                        let start = _mm256_sub_epi32(
                            _mm256_setzero_si256(),
                            _mm256_dpbusd_epi32(_mm256_setzero_si256(), bias, qy),
                        );
                        hsum4_epi32_v(x.map(|x| {
                            let ux = _mm256_xor_si256(load256(x.add(2)), bias);
                            _mm256_dpbusd_epi32(start, ux, qy)
                        }))
                    } else {
                        hsum4_epi32_v(x.map(|x| {
                            let qx = load256(x.add(2));
                            // |x| as u8 times y with x's sign: exact while
                            // y != -128.
                            dot_u8_i8(_mm256_sign_epi8(qx, qx), _mm256_sign_epi8(qy, qx))
                        }))
                    };
                    let d = _mm_mul_ps(f16x4(x), _mm_set1_ps(f16_load(y)));
                    sumf = _mm_add_ps(sumf, _mm_mul_ps(_mm_cvtepi32_ps(sumi), d));
                }
                let mut out = [0f32; 4];
                _mm_storeu_ps(out.as_mut_ptr(), sumf);
                out
            }
        };
    }

    /// `sumf` over blocks `0..$nb` in block order: `$step(sumf, i, sumi)`
    /// with block `i`'s exact integer dot `sumi`, the sum of the i32
    /// lanes `$lanes(i)`; the lanes of four blocks are summed together
    /// (integer sums are exact in any order). A macro rather than a
    /// function so the closures are compiled with the caller's features.
    macro_rules! by_four_blocks {
        ($nb:expr, $lanes:expr, $step:expr) => {{
            let (nb, mut sumf, mut i) = ($nb, 0f32, 0);
            while i + 4 <= nb {
                let sums = hsum4_epi32([$lanes(i), $lanes(i + 1), $lanes(i + 2), $lanes(i + 3)]);
                for (k, sumi) in sums.into_iter().enumerate() {
                    sumf = $step(sumf, i + k, sumi);
                }
                i += 4;
            }
            for i in i..nb {
                sumf = $step(sumf, i, hsum_epi32($lanes(i)));
            }
            sumf
        }};
    }

    /// Evaluates `$body` (an `__m256` accumulator update that reads `$i`
    /// and `$acc`) for every block `$i < $nb`, alternating two accumulators
    /// so consecutive FMAs do not wait on each other; yields their sum.
    /// A macro rather than a closure so the body is compiled with the
    /// caller's target features.
    macro_rules! two_accumulators {
        ($nb:expr, |$i:ident, $acc:ident| $body:expr) => {{
            let nb = $nb;
            let mut a0 = _mm256_setzero_ps();
            let mut a1 = _mm256_setzero_ps();
            let mut k = 0;
            while k + 2 <= nb {
                a0 = {
                    let ($i, $acc) = (k, a0);
                    $body
                };
                a1 = {
                    let ($i, $acc) = (k + 1, a1);
                    $body
                };
                k += 2;
            }
            if k < nb {
                a0 = {
                    let ($i, $acc) = (k, a0);
                    $body
                };
            }
            _mm256_add_ps(a0, a1)
        }};
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot_f32(w: &[u8], a: &[u8]) -> f32 {
        const STEP: usize = 32 * 4; // 32 floats per iteration
        let nb = blocks(w, STEP, a, STEP);
        let (wp, ap) = (w.as_ptr(), a.as_ptr());
        let mut acc = [_mm256_setzero_ps(); 4];
        for i in 0..nb {
            for (k, acc) in acc.iter_mut().enumerate() {
                let o = i * STEP + 32 * k;
                // SAFETY: o + 32 <= nb * STEP, within both rows.
                let x = _mm256_loadu_ps(wp.add(o).cast());
                let y = _mm256_loadu_ps(ap.add(o).cast());
                *acc = _mm256_fmadd_ps(x, y, *acc);
            }
        }
        let sum = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
        let done = nb * STEP;
        hsum_ps(sum) + crate::quant::float::dot_f32(&w[done..], &a[done..])
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot_f16(w: &[u8], a: &[u8]) -> f32 {
        const STEP: usize = 16 * 4; // 32 halves per iteration
        let nb = blocks(w, STEP, a, STEP);
        let (wp, ap) = (w.as_ptr(), a.as_ptr());
        let mut acc = [_mm256_setzero_ps(); 4];
        for i in 0..nb {
            for (k, acc) in acc.iter_mut().enumerate() {
                let o = i * STEP + 16 * k;
                // SAFETY: o + 16 <= nb * STEP, within both rows.
                let x = _mm256_cvtph_ps(_mm_loadu_si128(wp.add(o).cast()));
                let y = _mm256_cvtph_ps(_mm_loadu_si128(ap.add(o).cast()));
                *acc = _mm256_fmadd_ps(x, y, *acc);
            }
        }
        let sum = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
        let done = nb * STEP;
        hsum_ps(sum) + crate::quant::float::dot_f16(&w[done..], &a[done..])
    }

    /// Q4_1 × Q8_1 with the scalar kernel's arithmetic (`q4.rs`), bit for
    /// bit: per block the exact integer dot (vectorized), then `sumf +=
    /// (d_w * d_a) * sumi + m_w * s_a` in f32, in block order. The tiled
    /// GEMM (`gemm_x86.rs`) does the same per (weight row, activation
    /// row) pair, so a row's result does not depend on the batch.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot_q4_1_q8_1(w: &[u8], a: &[u8]) -> f32 {
        let nb = blocks(w, Q4_1_BYTES, a, Q8_1_BYTES);
        let (wp, ap) = (w.as_ptr(), a.as_ptr());
        // SAFETY (both): i < nb, so both blocks lie inside the rows.
        let lanes = |i: usize| {
            let (x, y) = (wp.add(i * Q4_1_BYTES), ap.add(i * Q8_1_BYTES));
            dot_u8_i8(nibbles32(x.add(4)), load256(y.add(4)))
        };
        let step = |sumf: f32, i: usize, sumi: i32| {
            let (x, y) = (wp.add(i * Q4_1_BYTES), ap.add(i * Q8_1_BYTES));
            sumf + ((f16_load(x) * f16_load(y)) * sumi as f32
                + f16_load(x.add(2)) * f16_load(y.add(2)))
        };
        by_four_blocks!(nb, lanes, step)
    }

    /// Q8_0 × Q8_0 with the scalar kernel's arithmetic (`activation.rs`),
    /// bit for bit: per block the exact integer dot, then `sumf += sumi *
    /// (d_w * d_a)` in f32, in block order (see [`dot_q4_1_q8_1`]).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot_q8_0_q8_0(w: &[u8], a: &[u8]) -> f32 {
        let nb = blocks(w, Q8_0_BYTES, a, Q8_0_BYTES);
        let (wp, ap) = (w.as_ptr(), a.as_ptr());
        // SAFETY (both): i < nb, so both blocks lie inside the rows.
        let lanes = |i: usize| {
            let (x, y) = (wp.add(i * Q8_0_BYTES), ap.add(i * Q8_0_BYTES));
            let qx = load256(x.add(2));
            // |x| as u8 times y with x's sign: exact while y != -128.
            dot_u8_i8(
                _mm256_sign_epi8(qx, qx),
                _mm256_sign_epi8(load256(y.add(2)), qx),
            )
        };
        let step = |sumf: f32, i: usize, sumi: i32| {
            let (x, y) = (wp.add(i * Q8_0_BYTES), ap.add(i * Q8_0_BYTES));
            sumf + sumi as f32 * (f16_load(x) * f16_load(y))
        };
        by_four_blocks!(nb, lanes, step)
    }

    /// The sums of four vectors' eight i32 lanes (exact), in lane order.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn hsum4_epi32_v(q: [__m256i; 4]) -> __m128i {
        let h = _mm256_hadd_epi32(_mm256_hadd_epi32(q[0], q[1]), _mm256_hadd_epi32(q[2], q[3]));
        _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1))
    }

    /// [`hsum4_epi32_v`] as an array.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn hsum4_epi32(q: [__m256i; 4]) -> [i32; 4] {
        let mut out = [0i32; 4];
        _mm_storeu_si128(out.as_mut_ptr().cast(), hsum4_epi32_v(q));
        out
    }

    /// The leading f16 of each of four blocks, converted (F16C, equal to
    /// the conversion table for every f16).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn f16x4(x: [*const u8; 4]) -> __m128 {
        let h = x.map(|p| p.cast::<i16>().read_unaligned());
        _mm_cvtph_ps(_mm_setr_epi16(h[0], h[1], h[2], h[3], 0, 0, 0, 0))
    }

    /// The two leading f16 (`d`, `m`) of each of four blocks, converted as
    /// [`f16x4`]: `([d0, d1, d2, d3], [m0, m1, m2, m3])`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn f16_pairs4(x: [*const u8; 4]) -> (__m128, __m128) {
        let h = x.map(|p| p.cast::<i32>().read_unaligned());
        let dm = _mm256_cvtph_ps(_mm_setr_epi32(h[0], h[1], h[2], h[3]));
        let dm = _mm256_permutevar8x32_ps(dm, _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7));
        (_mm256_castps256_ps128(dm), _mm256_extractf128_ps::<1>(dm))
    }

    /// Prefetches into L2 the four rows that start eight rows after `w`'s
    /// first, all assumed as long as its last (the call after next of a
    /// matmul whose rows are consecutive; only a hint otherwise). The four rows of a call
    /// advance block by block, four interleaved streams that the hardware
    /// prefetchers do not follow as well as one row after another.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn prefetch_ahead(w: &[&[u8]; 4]) {
        let len = w[3].len();
        let start = w[3].as_ptr().wrapping_add(len + 4 * len);
        for off in (0..4 * len).step_by(64) {
            // A prefetch never faults, whatever the address.
            _mm_prefetch::<_MM_HINT_T1>(start.wrapping_add(off).cast());
        }
    }

    /// Blocks that all four weight rows and the activation row hold.
    #[inline(always)]
    fn blocks_rows4(w: &[&[u8]; 4], wb: usize, a: &[u8], ab: usize) -> usize {
        w.iter().fold(a.len() / ab, |nb, r| nb.min(r.len() / wb))
    }

    rows4_kernels!(rows4_q4_1_q8_1, rows4_q8_0_q8_0, "avx2,fma,f16c", false);
    rows4_kernels!(
        rows4_q4_1_q8_1_vnni,
        rows4_q8_0_q8_0_vnni,
        "avx2,fma,f16c,avx512f,avx512vl,avx512vnni",
        true
    );

    /// Blocks that a weight row and all four activation rows hold.
    #[inline(always)]
    fn blocks4(w: &[u8], wb: usize, a: &[&[u8]; 4], ab: usize) -> usize {
        a.iter().fold(w.len() / wb, |nb, r| nb.min(r.len() / ab))
    }

    /// [`dot_q4_1_q8_1`] of one weight row with four activation rows at
    /// once: the weight block is unpacked once for all four; each row's
    /// arithmetic is the single-row kernel's, so results are bit-identical
    /// to it.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot4_q4_1_q8_1(w: &[u8], a: [&[u8]; 4]) -> [f32; 4] {
        let nb = blocks4(w, Q4_1_BYTES, &a, Q8_1_BYTES);
        let wp = w.as_ptr();
        let ap = a.map(|r| r.as_ptr());
        let mut sumf = [0f32; 4];
        for i in 0..nb {
            // SAFETY: i < nb, so the weight block and each activation block
            // lie inside their rows.
            let x = wp.add(i * Q4_1_BYTES);
            let (dw, mw) = (f16_load(x), f16_load(x.add(2)));
            let qx = nibbles32(x.add(4));
            for r in 0..4 {
                let y = ap[r].add(i * Q8_1_BYTES);
                let sumi = hsum_epi32(dot_u8_i8(qx, load256(y.add(4))));
                sumf[r] += (dw * f16_load(y)) * sumi as f32 + mw * f16_load(y.add(2));
            }
        }
        sumf
    }

    /// [`dot_q8_0_q8_0`] of one weight row with four activation rows at
    /// once, bit-identical to four single-row calls.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot4_q8_0_q8_0(w: &[u8], a: [&[u8]; 4]) -> [f32; 4] {
        let nb = blocks4(w, Q8_0_BYTES, &a, Q8_0_BYTES);
        let wp = w.as_ptr();
        let ap = a.map(|r| r.as_ptr());
        let mut sumf = [0f32; 4];
        for i in 0..nb {
            // SAFETY: i < nb, so every block read lies inside its row.
            let x = wp.add(i * Q8_0_BYTES);
            let dw = f16_load(x);
            let qx = load256(x.add(2));
            let ax = _mm256_sign_epi8(qx, qx);
            for r in 0..4 {
                let y = ap[r].add(i * Q8_0_BYTES);
                let q = dot_u8_i8(ax, _mm256_sign_epi8(load256(y.add(2)), qx));
                sumf[r] += hsum_epi32(q) as f32 * (dw * f16_load(y));
            }
        }
        sumf
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot_q4_0_q8_0(w: &[u8], a: &[u8]) -> f32 {
        let nb = blocks(w, Q4_0_BYTES, a, Q8_0_BYTES);
        let (wp, ap) = (w.as_ptr(), a.as_ptr());
        let eight = _mm256_set1_epi8(8);
        let acc = two_accumulators!(nb, |i, acc| {
            // SAFETY: i < nb, so both blocks lie inside the rows.
            let (x, y) = (wp.add(i * Q4_0_BYTES), ap.add(i * Q8_0_BYTES));
            let d = _mm256_set1_ps(f16_load(x) * f16_load(y));
            let q = dot_u8_i8_biased(nibbles32(x.add(2)), load256(y.add(2)), eight);
            _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(q), acc)
        });
        hsum_ps(acc)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot_q5_0_q8_0(w: &[u8], a: &[u8]) -> f32 {
        let nb = blocks(w, Q5_0_BYTES, a, Q8_0_BYTES);
        let (wp, ap) = (w.as_ptr(), a.as_ptr());
        let sixteen = _mm256_set1_epi8(16);
        let acc = two_accumulators!(nb, |i, acc| {
            // SAFETY: i < nb, so both blocks lie inside the rows.
            let (x, y) = (wp.add(i * Q5_0_BYTES), ap.add(i * Q8_0_BYTES));
            let d = _mm256_set1_ps(f16_load(x) * f16_load(y));
            let qx = _mm256_or_si256(nibbles32(x.add(6)), fifth_bits32(x.add(2)));
            let q = dot_u8_i8_biased(qx, load256(y.add(2)), sixteen);
            _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(q), acc)
        });
        hsum_ps(acc)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot_q5_1_q8_1(w: &[u8], a: &[u8]) -> f32 {
        let nb = blocks(w, Q5_1_BYTES, a, Q8_1_BYTES);
        let (wp, ap) = (w.as_ptr(), a.as_ptr());
        let mut mins = 0f32;
        let acc = two_accumulators!(nb, |i, acc| {
            // SAFETY: i < nb, so both blocks lie inside the rows.
            let (x, y) = (wp.add(i * Q5_1_BYTES), ap.add(i * Q8_1_BYTES));
            mins += f16_load(x.add(2)) * f16_load(y.add(2));
            let d = _mm256_set1_ps(f16_load(x) * f16_load(y));
            let qx = _mm256_or_si256(nibbles32(x.add(8)), fifth_bits32(x.add(4)));
            let q = dot_u8_i8(qx, load256(y.add(4)));
            _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(q), acc)
        });
        hsum_ps(acc) + mins
    }

    /// The sixteen Q8_K `bsums` of the block at `y`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn bsums(y: *const u8) -> __m256i {
        load256(y.add(Q8_K_BSUMS))
    }

    /// Horizontal sum of eight i32 lanes.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn hsum_epi32(v: __m256i) -> i32 {
        let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
        let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01));
        _mm_cvtsi128_si32(s)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot_q4_k_q8_k(w: &[u8], a: &[u8]) -> f32 {
        let nb = blocks(w, Q4_K_BYTES, a, Q8_K_BYTES);
        let (wp, ap) = (w.as_ptr(), a.as_ptr());
        let low = _mm256_set1_epi8(0x0f);
        let mut acc = _mm256_setzero_ps();
        let mut mins_total = 0f32;
        for i in 0..nb {
            // SAFETY: i < nb, so both blocks lie inside the rows.
            let (x, y) = (wp.add(i * Q4_K_BYTES), ap.add(i * Q8_K_BYTES));
            // SAFETY: bytes 4..16 of the weight block are its scales.
            let (sc, mn) = k4_scales_mins(std::slice::from_raw_parts(x.add(4), 12));
            let dy = y.cast::<f32>().read_unaligned();
            let d = f16_load(x) * dy;
            let dmin = f16_load(x.add(2)) * dy;

            // Mins: sum_j bsums[j] * mn[j / 2], one madd over 16 i16 lanes.
            let mn16 = _mm256_setr_epi16(
                mn[0] as i16,
                mn[0] as i16,
                mn[1] as i16,
                mn[1] as i16,
                mn[2] as i16,
                mn[2] as i16,
                mn[3] as i16,
                mn[3] as i16,
                mn[4] as i16,
                mn[4] as i16,
                mn[5] as i16,
                mn[5] as i16,
                mn[6] as i16,
                mn[6] as i16,
                mn[7] as i16,
                mn[7] as i16,
            );
            let summs = hsum_epi32(_mm256_madd_epi16(bsums(y), mn16));
            mins_total += dmin * summs as f32;

            let mut sumi = _mm256_setzero_si256();
            for j in 0..QK_K / 64 {
                let q = load256(x.add(16 + 32 * j));
                let lo = _mm256_and_si256(q, low);
                let hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low);
                let y0 = load256(y.add(4 + 64 * j));
                let y1 = load256(y.add(4 + 64 * j + 32));
                let p0 = _mm256_madd_epi16(
                    _mm256_maddubs_epi16(lo, y0),
                    _mm256_set1_epi16(sc[2 * j] as i16),
                );
                let p1 = _mm256_madd_epi16(
                    _mm256_maddubs_epi16(hi, y1),
                    _mm256_set1_epi16(sc[2 * j + 1] as i16),
                );
                sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p0, p1));
            }
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
        }
        hsum_ps(acc) - mins_total
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot_q6_k_q8_k(w: &[u8], a: &[u8]) -> f32 {
        let nb = blocks(w, Q6_K_BYTES, a, Q8_K_BYTES);
        let (wp, ap) = (w.as_ptr(), a.as_ptr());
        let low = _mm256_set1_epi8(0x0f);
        let mut acc = _mm256_setzero_ps();
        let mut offsets = 0f32;
        for i in 0..nb {
            // SAFETY: i < nb, so both blocks lie inside the rows.
            let (x, y) = (wp.add(i * Q6_K_BYTES), ap.add(i * Q8_K_BYTES));
            let d = f16_load(x.add(208)) * y.cast::<f32>().read_unaligned();
            // The 16 scales, sign-extended to i16.
            let sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(x.add(192).cast()));
            // The quants are stored +32: subtract 32 * sum_j sc[j] * bsums[j].
            let offset = hsum_epi32(_mm256_madd_epi16(sc16, bsums(y)));
            offsets += d * (32 * offset) as f32;

            let mut sc = [0i16; 16];
            _mm256_storeu_si256(sc.as_mut_ptr().cast(), sc16);
            let mut sumi = _mm256_setzero_si256();
            for h in 0..2 {
                let ql0 = load256(x.add(64 * h));
                let ql1 = load256(x.add(64 * h + 32));
                let qh = load256(x.add(128 + 32 * h));
                // Four 32-element runs; quants in [0, 64).
                let q = [
                    _mm256_or_si256(
                        _mm256_and_si256(ql0, low),
                        _mm256_slli_epi16(_mm256_and_si256(qh, _mm256_set1_epi8(0x03)), 4),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(ql1, low),
                        _mm256_slli_epi16(_mm256_and_si256(qh, _mm256_set1_epi8(0x0c)), 2),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16(ql0, 4), low),
                        _mm256_and_si256(qh, _mm256_set1_epi8(0x30)),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16(ql1, 4), low),
                        _mm256_srli_epi16(_mm256_and_si256(qh, _mm256_set1_epi8(0xc0u8 as i8)), 2),
                    ),
                ];
                for (r, q) in q.iter().enumerate() {
                    let yv = load256(y.add(4 + 128 * h + 32 * r));
                    // Elements 0..16 of the run (i16 lanes 0..8) use scale
                    // s, elements 16..32 use scale s + 1.
                    let s = 8 * h + 2 * r;
                    let scale = _mm256_set_m128i(_mm_set1_epi16(sc[s + 1]), _mm_set1_epi16(sc[s]));
                    let p = _mm256_madd_epi16(_mm256_maddubs_epi16(*q, yv), scale);
                    sumi = _mm256_add_epi32(sumi, p);
                }
            }
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
        }
        hsum_ps(acc) - offsets
    }
}

/// The F16C conversion of each f16 bit pattern, for the test that it
/// equals the conversion table; `None` without F16C.
#[cfg(test)]
pub(super) fn f16c_conversions() -> Option<Vec<f32>> {
    if !is_x86_feature_detected!("f16c") {
        return None;
    }
    let all: Vec<u16> = (0..=u16::MAX).collect();
    let out = all
        .chunks_exact(8)
        .flat_map(|c| {
            let mut v = [0f32; 8];
            // SAFETY: F16C was detected; `c` holds 8 u16 and `v` 8 f32.
            unsafe { f16c8(c.as_ptr(), v.as_mut_ptr()) };
            v
        })
        .collect();
    Some(out)
}

/// Eight f16 at `src` converted to f32 at `dst`.
///
/// # Safety
/// F16C; 8 readable u16 at `src`, 8 writable f32 at `dst`.
#[cfg(test)]
#[target_feature(enable = "avx,f16c")]
unsafe fn f16c8(src: *const u16, dst: *mut f32) {
    // SAFETY: the caller's bounds.
    unsafe { _mm256_storeu_ps(dst, _mm256_cvtph_ps(_mm_loadu_si128(src.cast()))) };
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::dot::Rows4Fn;
    use crate::quant::tests::{floats, quantized};
    use crate::quant::vec_dot_scalar;

    /// Both four-weight-row kernels of each format (AVX2 and, where the
    /// CPU has it, VNNI) equal the scalar kernel bit for bit, whichever of
    /// them `install` chose.
    #[test]
    fn every_rows4_kernel_is_bit_identical_to_scalar() {
        if !avx2_available() {
            return;
        }
        let vnni = vnni_available();
        let kernels: [(GgmlType, Rows4Fn, bool); 4] = [
            (GgmlType::Q4_1, rows4_q4_1_q8_1, true),
            (GgmlType::Q8_0, rows4_q8_0_q8_0, true),
            (GgmlType::Q4_1, rows4_q4_1_q8_1_vnni, vnni),
            (GgmlType::Q8_0, rows4_q8_0_q8_0_vnni, vnni),
        ];
        for (ty, kernel, runs) in kernels {
            if !runs {
                continue;
            }
            for (seed, n) in [32usize, 96, 576, 1536].into_iter().enumerate() {
                let ws: Vec<Vec<u8>> = (0..4)
                    .map(|i| {
                        let mut f = floats(seed as u64 * 10 + i, n, 1.0);
                        if i == 1 {
                            f[..32].fill(0.0);
                        }
                        quantized(ty, &f)
                    })
                    .collect();
                let a = quantized(ty.vec_dot_type(), &floats(77 + seed as u64, n, 3.0));
                let got = kernel([&ws[0], &ws[1], &ws[2], &ws[3]], &a);
                for (i, w) in ws.iter().enumerate() {
                    let want = vec_dot_scalar(ty, n, w, &a);
                    assert_eq!(got[i].to_bits(), want.to_bits(), "{ty} n={n} row {i}");
                }
            }
        }
    }
}
