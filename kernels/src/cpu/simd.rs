//! AVX versions of the CPU backend's f32 helpers, chosen at run time.
//!
//! They compute exactly what the portable loops in [`super::elementwise`]
//! compute: the same 8 lanes, each a multiply then an add (no fused
//! multiply-add, which would round differently), the same final sums. So
//! results are bit-identical whichever runs; only the width of the
//! instructions changes (a generic x86_64 build only has 4-lane SSE2).
//!
//! `unsafe` here: the intrinsics need the AVX feature, which
//! [`has_avx`] confirms at run time before any `#[target_feature]`
//! function is called; loads and stores go through raw pointers within the
//! bounds computed from the slice lengths.

#![allow(unsafe_code)]

use std::arch::x86_64::*;

/// Whether this CPU runs AVX (checked once by std, then cached).
pub fn has_avx() -> bool {
    is_x86_feature_detected!("avx")
}

/// Whether this CPU converts f16 in hardware (F16C, with AVX).
pub fn has_f16c() -> bool {
    has_avx() && is_x86_feature_detected!("f16c")
}

/// [`dot_lanes`] with f16 values `b`, converted exactly (F16C); the
/// caller checked [`has_f16c`].
pub fn dot_lanes_f16(a: &[f32], b: &[half::f16]) -> [f32; 8] {
    let n = a.len().min(b.len()) / 8 * 8;
    // SAFETY: `has_f16c` was checked by the caller; the kernel reads the
    // first `n` values of both slices (`f16` is a 2-byte `u16` value).
    unsafe { dot_lanes_f16c(a.as_ptr(), b.as_ptr().cast::<u16>(), n) }
}

#[target_feature(enable = "avx,f16c")]
unsafe fn dot_lanes_f16c(a: *const f32, b: *const u16, n: usize) -> [f32; 8] {
    let mut acc = _mm256_setzero_ps();
    let mut i = 0;
    while i < n {
        // SAFETY: i + 8 <= n, within both slices (see `dot_lanes_f16`).
        let (x, y) = unsafe {
            (
                _mm256_loadu_ps(a.add(i)),
                _mm256_cvtph_ps(_mm_loadu_si128(b.add(i).cast::<__m128i>())),
            )
        };
        acc = _mm256_add_ps(acc, _mm256_mul_ps(x, y));
        i += 8;
    }
    let mut out = [0.0f32; 8];
    // SAFETY: `out` holds 8 floats.
    unsafe { _mm256_storeu_ps(out.as_mut_ptr(), acc) };
    out
}

/// [`axpy`] with f16 values `x`, converted exactly (F16C); the caller
/// checked [`has_f16c`].
pub fn axpy_f16(dst: &mut [f32], w: f32, x: &[half::f16]) {
    let n = dst.len().min(x.len());
    let whole = n / 8 * 8;
    // SAFETY: `has_f16c` was checked by the caller; the kernel touches the
    // first `whole` values of both slices.
    unsafe { axpy_f16c(dst.as_mut_ptr(), w, x.as_ptr().cast::<u16>(), whole) };
    for i in whole..n {
        dst[i] += w * x[i].to_f32();
    }
}

#[target_feature(enable = "avx,f16c")]
unsafe fn axpy_f16c(dst: *mut f32, w: f32, x: *const u16, n: usize) {
    let wv = _mm256_set1_ps(w);
    let mut i = 0;
    while i < n {
        // SAFETY: i + 8 <= n, within both slices (see `axpy_f16`).
        unsafe {
            let d = _mm256_loadu_ps(dst.add(i));
            let xv = _mm256_cvtph_ps(_mm_loadu_si128(x.add(i).cast::<__m128i>()));
            _mm256_storeu_ps(dst.add(i), _mm256_add_ps(d, _mm256_mul_ps(wv, xv)));
        }
        i += 8;
    }
}

/// The 8 lane sums of `a[i] * b[i]` over whole chunks of 8 (the remainder
/// is the caller's).
pub fn dot_lanes(a: &[f32], b: &[f32]) -> [f32; 8] {
    let n = a.len().min(b.len()) / 8 * 8;
    // SAFETY: `has_avx` checked the feature; `dot_lanes_avx` reads the
    // first `n` values of both slices, `n` <= both lengths.
    unsafe { dot_lanes_avx(a.as_ptr(), b.as_ptr(), n) }
}

#[target_feature(enable = "avx")]
unsafe fn dot_lanes_avx(a: *const f32, b: *const f32, n: usize) -> [f32; 8] {
    let mut acc = _mm256_setzero_ps();
    let mut i = 0;
    while i < n {
        // SAFETY: i + 8 <= n, within both slices (see `dot_lanes`).
        let (x, y) = unsafe { (_mm256_loadu_ps(a.add(i)), _mm256_loadu_ps(b.add(i))) };
        acc = _mm256_add_ps(acc, _mm256_mul_ps(x, y));
        i += 8;
    }
    let mut out = [0.0f32; 8];
    // SAFETY: `out` holds 8 floats.
    unsafe { _mm256_storeu_ps(out.as_mut_ptr(), acc) };
    out
}

/// `dst[i] += w * x[i]` for every `i` (a multiply then an add each).
pub fn axpy(dst: &mut [f32], w: f32, x: &[f32]) {
    let n = dst.len().min(x.len());
    let whole = n / 8 * 8;
    // SAFETY: `has_avx` checked the feature (callers use this only then);
    // the kernel touches the first `whole` values of both slices.
    unsafe { axpy_avx(dst.as_mut_ptr(), w, x.as_ptr(), whole) };
    for i in whole..n {
        dst[i] += w * x[i];
    }
}

#[target_feature(enable = "avx")]
unsafe fn axpy_avx(dst: *mut f32, w: f32, x: *const f32, n: usize) {
    let wv = _mm256_set1_ps(w);
    let mut i = 0;
    while i < n {
        // SAFETY: i + 8 <= n, within both slices (see `axpy`).
        unsafe {
            let d = _mm256_loadu_ps(dst.add(i));
            let v = _mm256_mul_ps(wv, _mm256_loadu_ps(x.add(i)));
            _mm256_storeu_ps(dst.add(i), _mm256_add_ps(d, v));
        }
        i += 8;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic values spanning magnitudes and signs.
    fn values(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                ((s >> 8) as f32 / (1u32 << 24) as f32 - 0.5) * 10f32.powi((s % 7) as i32 - 3)
            })
            .collect()
    }

    #[test]
    fn avx_helpers_are_bit_identical_to_the_portable_loops() {
        if !has_avx() {
            return;
        }
        for n in [0, 1, 7, 8, 9, 64, 100, 576] {
            let (a, b) = (values(n, 1), values(n, 2));
            let mut lanes = [0.0f32; 8];
            for (x, y) in a.chunks_exact(8).zip(b.chunks_exact(8)) {
                for l in 0..8 {
                    lanes[l] += x[l] * y[l];
                }
            }
            assert_eq!(
                dot_lanes(&a, &b).map(f32::to_bits),
                lanes.map(f32::to_bits),
                "n={n}"
            );
            let mut want = values(n, 3);
            let mut got = want.clone();
            for (d, &v) in want.iter_mut().zip(&a) {
                *d += 0.37 * v;
            }
            axpy(&mut got, 0.37, &a);
            assert_eq!(
                got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "n={n}"
            );
        }
    }

    #[test]
    fn f16c_helpers_convert_every_f16_exactly() {
        if !has_f16c() {
            return;
        }
        // Each f16 value against 1.0 (dot lanes: the value itself) and
        // added to 0.0 with weight 1.0 (axpy), 8 at a time.
        let all: Vec<half::f16> = (0..=u16::MAX).map(half::f16::from_bits).collect();
        let same = |g: f32, h: half::f16| {
            let want = h.to_f32();
            g.to_bits() == want.to_bits() || (g.is_nan() && want.is_nan())
        };
        let mut got = vec![0.0f32; all.len()];
        axpy_f16(&mut got, 1.0, &all);
        for (h, &g) in all.iter().zip(&got) {
            assert!(
                same(g, *h) || (h.to_f32() == 0.0 && g == 0.0),
                "axpy {h:?}: {g}"
            );
        }
        for chunk in all.chunks(8) {
            let lanes = dot_lanes_f16(&[1.0; 8], chunk);
            for (h, &g) in chunk.iter().zip(&lanes) {
                assert!(
                    same(g, *h) || (h.to_f32() == 0.0 && g == 0.0),
                    "dot {h:?}: {g}"
                );
            }
        }
    }

    #[test]
    fn f16_helpers_are_bit_identical_to_converting_first() {
        if !has_f16c() {
            return;
        }
        for n in [0, 1, 7, 8, 9, 64, 100, 576] {
            let a = values(n, 4);
            let b: Vec<half::f16> = values(n, 5).into_iter().map(half::f16::from_f32).collect();
            let bf: Vec<f32> = b.iter().map(|h| h.to_f32()).collect();
            assert_eq!(
                dot_lanes_f16(&a, &b).map(f32::to_bits),
                dot_lanes(&a, &bf).map(f32::to_bits),
                "n={n}"
            );
            let (mut got, mut want) = (values(n, 6), values(n, 6));
            axpy_f16(&mut got, -1.7, &b);
            axpy(&mut want, -1.7, &bf);
            assert_eq!(
                got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "n={n}"
            );
        }
    }
}
