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

/// `sum_lanes` of four dots' lanes at once: their lanes transposed into
/// eight f64 vectors (lane k of each dot) and added in lane order from
/// the empty sum's `start`, then the (empty) `tail` added: the same
/// additions on the same values. Returns the four sums as f32.
#[inline]
#[target_feature(enable = "avx")]
fn sum_lanes4(a: __m256, b: __m256, c: __m256, d: __m256, start: f64, tail: f64) -> __m128 {
    let (ab_lo, ab_hi) = (_mm256_unpacklo_ps(a, b), _mm256_unpackhi_ps(a, b));
    let (cd_lo, cd_hi) = (_mm256_unpacklo_ps(c, d), _mm256_unpackhi_ps(c, d));
    // u[k]: lane k of a, b, c, d (low half), lane k + 4 (high).
    let u = [
        _mm256_shuffle_ps::<0x44>(ab_lo, cd_lo),
        _mm256_shuffle_ps::<0xEE>(ab_lo, cd_lo),
        _mm256_shuffle_ps::<0x44>(ab_hi, cd_hi),
        _mm256_shuffle_ps::<0xEE>(ab_hi, cd_hi),
    ];
    let mut sum = _mm256_set1_pd(start);
    for v in u {
        sum = _mm256_add_pd(sum, _mm256_cvtps_pd(_mm256_castps256_ps128(v)));
    }
    for v in u {
        sum = _mm256_add_pd(sum, _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(v)));
    }
    _mm256_cvtpd_ps(_mm256_add_pd(sum, _mm256_set1_pd(tail)))
}

/// Generates the attention row kernels for one stored value type: `$dots`
/// (scores against every cached key row) and `$wsum` (the
/// probability-weighted sum of the value rows): with `@kernels`, the
/// `unsafe` kernels for `$features`, loading 8 values at `$p` as f32 with
/// `$load`; without, the safe wrappers that check `$available` first.
macro_rules! attention_rows {
    ($dots:ident, $wsum:ident, $t:ty, $available:expr) => {
        /// Runs the kernel below and returns true where the CPU has its
        /// features and `q.len() % 64 == 0`; else does nothing.
        pub fn $dots<'a>(
            q: &[f32],
            rows: &impl Fn(usize) -> &'a [$t],
            scale: f32,
            scores: &mut [f32],
        ) -> bool {
            let run = $available && q.len().is_multiple_of(64);
            if run {
                // SAFETY: the features were just checked.
                unsafe { kernels::$dots(q, rows, scale, scores) };
            }
            run
        }

        /// Runs the kernel below and returns true where the CPU has its
        /// features and `dst.len() % 64 == 0`; else does nothing.
        pub fn $wsum<'a>(dst: &mut [f32], w: &[f32], rows: &impl Fn(usize) -> &'a [$t]) -> bool {
            let run = $available && dst.len().is_multiple_of(64);
            if run {
                // SAFETY: the features were just checked.
                unsafe { kernels::$wsum(dst, w, rows) };
            }
            run
        }
    };
    (@kernels $dots:ident, $wsum:ident, $lanes:ident, $t:ty, $features:literal, |$p:ident| $load:expr) => {
        /// The 8 lanes of `q . k` over `q`'s whole chunks of 8 (each a
        /// multiply then an add per chunk); `k` at least as long. (A
        /// function, not a closure, so that it has the features.)
        ///
        /// # Safety
        /// The CPU has `$features`.
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn $lanes(q: &[f32], k: &[$t]) -> __m256 {
            let hd = q.len() / 8 * 8;
            let k = &k[..hd];
            let mut acc = _mm256_setzero_ps();
            let mut i = 0;
            while i < hd {
                // SAFETY: i + 8 <= hd, within q and k.
                let (x, y) = unsafe {
                    let $p = k.as_ptr().add(i);
                    (_mm256_loadu_ps(q.as_ptr().add(i)), $load)
                };
                acc = _mm256_add_ps(acc, _mm256_mul_ps(x, y));
                i += 8;
            }
            acc
        }

        /// `scores[t] = dot(q, rows(t)) * scale`, each dot as
        /// `elementwise::dot_f32` computes it (8 lanes of a multiply then
        /// an add, the lanes summed in f64 by `elementwise::sum_lanes`);
        /// `q.len() % 8 == 0`.
        ///
        /// # Safety
        /// The CPU has `$features`.
        #[target_feature(enable = $features)]
        pub unsafe fn $dots<'a>(
            q: &[f32],
            rows: &impl Fn(usize) -> &'a [$t],
            scale: f32,
            scores: &mut [f32],
        ) {
            let hd = q.len() / 8 * 8;
            let q = &q[..hd];
            // `sum_lanes`' start and (empty) tail.
            let (start, tail): (f64, f64) = (
                std::iter::empty::<f64>().sum(),
                std::iter::empty::<f64>().sum(),
            );
            // Eight keys at a time: eight independent chains share each
            // load of `q`; then fours; then one by one.
            let n8 = scores.len() / 8 * 8;
            for t in (0..n8).step_by(8) {
                let k: [*const $t; 8] = std::array::from_fn(|j| rows(t + j)[..hd].as_ptr());
                let mut acc = [_mm256_setzero_ps(); 8];
                for i in (0..hd).step_by(8) {
                    // SAFETY: i + 8 <= hd, within q and every key row.
                    let x = unsafe { _mm256_loadu_ps(q.as_ptr().add(i)) };
                    for (a, &k) in acc.iter_mut().zip(&k) {
                        // SAFETY: as above.
                        let y = unsafe {
                            let $p = k.add(i);
                            $load
                        };
                        *a = _mm256_add_ps(*a, _mm256_mul_ps(x, y));
                    }
                }
                for h in 0..2 {
                    let [a, b, c, d] = [acc[4 * h], acc[4 * h + 1], acc[4 * h + 2], acc[4 * h + 3]];
                    let dots = _mm_mul_ps(sum_lanes4(a, b, c, d, start, tail), _mm_set1_ps(scale));
                    // SAFETY: t + 8 <= n8 <= scores.len().
                    unsafe { _mm_storeu_ps(scores.as_mut_ptr().add(t + 4 * h), dots) };
                }
            }
            let n4 = scores.len() / 4 * 4;
            for t in (n8..n4).step_by(4) {
                // SAFETY (all four): the features of this function.
                let (a, b, c, d) = unsafe {
                    (
                        $lanes(q, rows(t)),
                        $lanes(q, rows(t + 1)),
                        $lanes(q, rows(t + 2)),
                        $lanes(q, rows(t + 3)),
                    )
                };
                let dots = _mm_mul_ps(sum_lanes4(a, b, c, d, start, tail), _mm_set1_ps(scale));
                // SAFETY: t + 4 <= n4 <= scores.len().
                unsafe { _mm_storeu_ps(scores.as_mut_ptr().add(t), dots) };
            }
            for (t, s) in scores.iter_mut().enumerate().skip(n4) {
                let mut l = [0.0f32; 8];
                // SAFETY: `l` holds 8 floats; the features of this function.
                unsafe { _mm256_storeu_ps(l.as_mut_ptr(), $lanes(q, rows(t))) };
                *s = crate::cpu::elementwise::sum_lanes(&l, tail) * scale;
            }
        }

        /// `dst += w[t] * rows(t)` for every `t` in order, each step a
        /// multiply then an add per value (repeated [`axpy`]), 64 values
        /// at a time in registers; `dst.len() % 64 == 0`.
        ///
        /// # Safety
        /// The CPU has `$features`.
        #[target_feature(enable = $features)]
        pub unsafe fn $wsum<'a>(dst: &mut [f32], w: &[f32], rows: &impl Fn(usize) -> &'a [$t]) {
            for c in (0..dst.len() / 64 * 64).step_by(64) {
                // SAFETY: c + 64 <= dst.len().
                let mut acc: [__m256; 8] = std::array::from_fn(|k| unsafe {
                    _mm256_loadu_ps(dst.as_ptr().add(c + 8 * k))
                });
                for (t, &wt) in w.iter().enumerate() {
                    let v = &rows(t)[c..c + 64];
                    let wv = _mm256_set1_ps(wt);
                    for (k, a) in acc.iter_mut().enumerate() {
                        // SAFETY: 8 * k + 8 <= 64 values of v.
                        let x = unsafe {
                            let $p = v.as_ptr().add(8 * k);
                            $load
                        };
                        *a = _mm256_add_ps(*a, _mm256_mul_ps(wv, x));
                    }
                }
                for (k, a) in acc.iter().enumerate() {
                    // SAFETY: c + 8 * k + 8 <= dst.len().
                    unsafe { _mm256_storeu_ps(dst.as_mut_ptr().add(c + 8 * k), *a) };
                }
            }
        }
    };
}

/// The `unsafe` kernels behind the checked wrappers.
mod kernels {
    use std::arch::x86_64::*;

    use super::sum_lanes4;

    attention_rows!(@kernels dots_f32, weighted_sum_f32, lanes_f32, f32, "avx", |p| {
        _mm256_loadu_ps(p)
    });
    attention_rows!(@kernels dots_f16, weighted_sum_f16, lanes_f16, half::f16, "avx,f16c", |p| {
        _mm256_cvtph_ps(_mm_loadu_si128(p.cast::<__m128i>()))
    });
}

attention_rows!(dots_f32, weighted_sum_f32, f32, has_avx());
attention_rows!(dots_f16, weighted_sum_f16, half::f16, has_f16c());

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
    fn attention_row_kernels_are_bit_identical_to_dot_and_axpy() {
        use super::super::elementwise::{axpy_f16, dot_f16};
        if !has_f16c() {
            return;
        }
        for hd in [64, 128] {
            let n = 37;
            let q = values(hd, 7);
            let rows32: Vec<Vec<f32>> = (0..n).map(|t| values(hd + 8, 10 + t as u32)).collect();
            let rows16: Vec<Vec<half::f16>> = rows32
                .iter()
                .map(|r| r.iter().map(|&v| half::f16::from_f32(v)).collect())
                .collect();
            let w = values(n, 8);
            let (mut s32, mut s16) = (vec![0.0f32; n], vec![0.0f32; n]);
            assert!(dots_f32(&q, &|t| &rows32[t][..], 0.125, &mut s32));
            assert!(dots_f16(&q, &|t| &rows16[t][..], 0.125, &mut s16));
            for t in 0..n {
                let want32 = super::super::elementwise::dot_f32(&q, &rows32[t][..hd]) * 0.125;
                let want16 = dot_f16(&q, &rows16[t][..hd]) * 0.125;
                assert_eq!(s32[t].to_bits(), want32.to_bits(), "hd {hd} t {t}");
                assert_eq!(s16[t].to_bits(), want16.to_bits(), "hd {hd} t {t}");
            }
            // Onto values already there (a sum continued block by block).
            let start = values(hd, 11);
            let (mut got32, mut got16) = (start.clone(), start.clone());
            let (mut want32, mut want16) = (start.clone(), start);
            assert!(weighted_sum_f32(&mut got32, &w, &|t| &rows32[t][..]));
            assert!(weighted_sum_f16(&mut got16, &w, &|t| &rows16[t][..]));
            for t in 0..n {
                axpy(&mut want32, w[t], &rows32[t][..hd]);
                axpy_f16(&mut want16, w[t], &rows16[t][..hd]);
            }
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got32), bits(&want32), "hd {hd}");
            assert_eq!(bits(&got16), bits(&want16), "hd {hd}");
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
