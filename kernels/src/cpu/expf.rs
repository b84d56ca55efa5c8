//! `exp` for f32, vectorized: the softmax of attention and SwiGLU's
//! sigmoid call it for every score and every hidden value.
//!
//! The method is the usual one (as in Cephes and ARM's optimized
//! routines): `exp(x) = 2^n * exp(r)` with `n = round(x / ln 2)` and
//! `r = x - n ln 2` (ln 2 in two parts), `exp(r)` by a degree-5
//! polynomial, `2^n` built in the exponent bits. Its error is at most 2.5
//! units in the last place (2.27 over the tests' inputs). The scalar [`expf`] and the AVX2 kernel make
//! the same operations (fused multiply-adds included), so they give the
//! same bits, and results do not depend on which one ran.
//!
//! Domain: below [`LO`] the result is 0 (the true value is below the
//! smallest normal f32), above [`HI`] it is infinity (the true value is
//! within 30% of `f32::MAX`), NaN stays NaN.

/// Inputs below give 0.
pub const LO: f32 = -87.33;
/// Inputs above give infinity.
pub const HI: f32 = 88.37;

const LOG2E: f32 = std::f32::consts::LOG2_E;
/// `1.5 * 2^23`: adding it rounds to an integer (ties to even).
const ROUND: f32 = 12_582_912.0;
/// ln 2 = LN2_HI + LN2_LO (LN2_HI has few significant bits, so `n * LN2_HI`
/// is exact for the `n` in range).
const LN2_HI: f32 = 0.693_145_75;
const LN2_LO: f32 = 1.428_606_8e-6;
/// exp(r) ~ 1 + r + C2 r^2 + C3 r^3 + C4 r^4 + C5 r^5 on |r| <= ln2 / 2,
/// fitted for the least largest relative error (1.1e-7): the generator
/// is `scripts/lib/fit-expf.py`.
const C2: f32 = 0.499_991_92;
const C3: f32 = 0.166_671_13;
const C4: f32 = 0.041_895_326;
const C5: f32 = 0.008_314_21;

/// `e^x`, bit-identical to the vector kernel.
#[inline]
pub fn expf(x: f32) -> f32 {
    if x.is_nan() {
        return x;
    }
    if x < LO {
        return 0.0;
    }
    if x > HI {
        return f32::INFINITY;
    }
    let z = x.mul_add(LOG2E, ROUND);
    let n = z - ROUND;
    let r = (-n).mul_add(LN2_LO, (-n).mul_add(LN2_HI, x));
    let p = C5
        .mul_add(r, C4)
        .mul_add(r, C3)
        .mul_add(r, C2)
        .mul_add(r, 1.0);
    let e = p.mul_add(r, 1.0);
    // 2^n from the integer in z's low mantissa bits.
    let k = z.to_bits().wrapping_sub(ROUND.to_bits()) as i32;
    let two_n = f32::from_bits(((k + 127) as u32) << 23);
    e * two_n
}

/// `s = exp(s - max) / sum` over `s` (the softmax of attention scores),
/// `max` and `sum` over all of `s`. The sum is taken in eight lanes
/// (element `i` into lane `i % 8`, in order), the lanes then added in
/// order, then the elements past the last whole eight: the same on every
/// CPU.
pub fn softmax(s: &mut [f32]) {
    let max = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let whole = s.len() / 8 * 8;
    let mut lanes = [0.0f32; 8];
    #[cfg(target_arch = "x86_64")]
    let vectored = x86::exp_sub_lanes(&mut s[..whole], max, &mut lanes);
    #[cfg(not(target_arch = "x86_64"))]
    let vectored = false;
    if !vectored {
        for chunk in s[..whole].chunks_exact_mut(8) {
            for (v, l) in chunk.iter_mut().zip(&mut lanes) {
                *v = expf(*v - max);
                *l += *v;
            }
        }
    }
    let mut sum = lanes.iter().fold(0.0f32, |a, &l| a + l);
    for v in &mut s[whole..] {
        *v = expf(*v - max);
        sum += *v;
    }
    for v in s.iter_mut() {
        *v /= sum;
    }
}

/// `out = g / (1 + exp(-g)) * u` element by element (SwiGLU: SiLU of the
/// gate times the up projection).
pub fn swiglu(out: &mut [f32], gate: &[f32], up: &[f32]) {
    let n = out.len().min(gate.len()).min(up.len());
    let whole = n / 8 * 8;
    #[cfg(target_arch = "x86_64")]
    let done = if x86::swiglu(&mut out[..whole], &gate[..whole], &up[..whole]) {
        whole
    } else {
        0
    };
    #[cfg(not(target_arch = "x86_64"))]
    let done = 0;
    for ((o, &g), &u) in out[done..n]
        .iter_mut()
        .zip(&gate[done..n])
        .zip(&up[done..n])
    {
        *o = g / (1.0 + expf(-g)) * u;
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    #![allow(unsafe_code)]

    use std::arch::x86_64::*;

    use super::*;

    /// Whether the kernels run here (AVX2 and FMA).
    fn available() -> bool {
        is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
    }

    /// [`expf`] of eight values where the CPU has the kernel.
    #[cfg(test)]
    pub fn expf_x8(x: [f32; 8]) -> Option<[f32; 8]> {
        let mut out = [0.0f32; 8];
        // SAFETY: `available` confirmed the features; 8 floats each.
        available().then(|| unsafe {
            _mm256_storeu_ps(out.as_mut_ptr(), expf8(_mm256_loadu_ps(x.as_ptr())));
            out
        })
    }

    /// `s = exp(s - max)` eight at a time, each added to its lane of
    /// `lanes`, where the CPU has the kernel (else `false`, nothing
    /// done); `s.len() % 8 == 0`.
    pub fn exp_sub_lanes(s: &mut [f32], max: f32, lanes: &mut [f32; 8]) -> bool {
        assert!(s.len().is_multiple_of(8));
        // SAFETY: `available` confirmed the features.
        available() && unsafe { exp_sub_lanes_avx2(s, max, lanes) }
    }

    /// [`super::swiglu`] of equal slices of whole eights where the CPU
    /// has the kernel (else `false`, nothing done).
    pub fn swiglu(out: &mut [f32], gate: &[f32], up: &[f32]) -> bool {
        assert!(out.len().is_multiple_of(8) && gate.len() == out.len() && up.len() == out.len());
        // SAFETY: `available` confirmed the features; lengths as asserted.
        available() && unsafe { swiglu_avx2(out, gate, up) }
    }

    /// [`expf`] of eight values.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA ([`available`]).
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn expf8(x: __m256) -> __m256 {
        let xc = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(LO)), _mm256_set1_ps(HI));
        let round = _mm256_set1_ps(ROUND);
        let z = _mm256_fmadd_ps(xc, _mm256_set1_ps(LOG2E), round);
        let n = _mm256_sub_ps(z, round);
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_HI), xc);
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_LO), r);
        let mut p = _mm256_fmadd_ps(_mm256_set1_ps(C5), r, _mm256_set1_ps(C4));
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(C3));
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(C2));
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0));
        let e = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0));
        let k = _mm256_sub_epi32(_mm256_castps_si256(z), _mm256_castps_si256(round));
        let two_n = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(
            k,
            _mm256_set1_epi32(127),
        )));
        let y = _mm256_mul_ps(e, two_n);
        // Outside the range: 0 below, infinity above, NaN as is.
        let y = _mm256_blendv_ps(
            y,
            _mm256_setzero_ps(),
            _mm256_cmp_ps::<_CMP_LT_OQ>(x, _mm256_set1_ps(LO)),
        );
        let y = _mm256_blendv_ps(
            y,
            _mm256_set1_ps(f32::INFINITY),
            _mm256_cmp_ps::<_CMP_GT_OQ>(x, _mm256_set1_ps(HI)),
        );
        _mm256_blendv_ps(y, x, _mm256_cmp_ps::<_CMP_UNORD_Q>(x, x))
    }

    /// # Safety
    /// As [`expf8`].
    #[target_feature(enable = "avx2,fma")]
    unsafe fn exp_sub_lanes_avx2(s: &mut [f32], max: f32, lanes: &mut [f32; 8]) -> bool {
        let m = _mm256_set1_ps(max);
        // SAFETY: `lanes` holds 8 floats; every chunk 8 (the caller's length).
        unsafe {
            let mut acc = _mm256_loadu_ps(lanes.as_ptr());
            for chunk in s.chunks_exact_mut(8) {
                let e = expf8(_mm256_sub_ps(_mm256_loadu_ps(chunk.as_ptr()), m));
                _mm256_storeu_ps(chunk.as_mut_ptr(), e);
                acc = _mm256_add_ps(acc, e);
            }
            _mm256_storeu_ps(lanes.as_mut_ptr(), acc);
        }
        true
    }

    /// # Safety
    /// As [`expf8`]; the three slices have the same length, a multiple
    /// of 8.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn swiglu_avx2(out: &mut [f32], gate: &[f32], up: &[f32]) -> bool {
        let one = _mm256_set1_ps(1.0);
        let neg = _mm256_set1_ps(-0.0);
        for ((o, g), u) in out
            .chunks_exact_mut(8)
            .zip(gate.chunks_exact(8))
            .zip(up.chunks_exact(8))
        {
            // SAFETY: 8 floats in each chunk.
            unsafe {
                let g = _mm256_loadu_ps(g.as_ptr());
                let e = expf8(_mm256_xor_ps(g, neg));
                let silu = _mm256_div_ps(g, _mm256_add_ps(one, e));
                _mm256_storeu_ps(
                    o.as_mut_ptr(),
                    _mm256_mul_ps(silu, _mm256_loadu_ps(u.as_ptr())),
                );
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Inputs over the whole domain, its edges and special values.
    fn inputs() -> Vec<f32> {
        let mut v: Vec<f32> = (0..200_000)
            .map(|i| -90.0 + 180.0 * i as f32 / 200_000.0)
            .collect();
        v.extend((0..20_000).map(|i| (i as f32 - 10_000.0) * 1e-4));
        v.extend([
            0.0,
            -0.0,
            1.0,
            -1.0,
            LO,
            HI,
            LO - 1e-4,
            HI + 1e-4,
            f32::MIN_POSITIVE,
            -f32::MIN_POSITIVE,
            1e-40,
            f32::MAX,
            f32::MIN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
        ]);
        v
    }

    #[test]
    fn expf_is_within_two_and_a_half_ulp_of_exp() {
        let mut worst = 0.0f64;
        for x in inputs() {
            let got = expf(x);
            let want = f64::from(x).exp();
            if x.is_nan() {
                assert!(got.is_nan());
            } else if x < LO {
                assert_eq!(got, 0.0, "{x}");
            } else if x > HI {
                assert_eq!(got, f32::INFINITY, "{x}");
            } else {
                // Units in the last place of the f32 nearest `want`.
                let near = want as f32;
                let ulp = f64::from(f32::from_bits(near.to_bits() + 1) - near);
                let err = (f64::from(got) - want).abs() / ulp;
                worst = worst.max(err);
                assert!(err <= 2.5, "exp({x}) = {got}, want {want}: {err} ulp");
            }
        }
        assert_eq!(expf(0.0), 1.0);
        eprintln!("largest error {worst:.3} ulp");
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn vector_exp_softmax_and_swiglu_give_the_scalar_bits() {
        let v = inputs();
        for chunk in v.chunks_exact(8) {
            let x: [f32; 8] = chunk.try_into().expect("8 values");
            let Some(got) = x86::expf_x8(x) else {
                return;
            };
            for (g, &x) in got.iter().zip(chunk) {
                let want = expf(x);
                assert!(
                    g.to_bits() == want.to_bits() || (g.is_nan() && want.is_nan()),
                    "{x}: {g} vs {want}"
                );
            }
        }
        // Softmax: the vector path against the portable loop it mirrors.
        for n in [1usize, 7, 8, 9, 64, 100, 129] {
            let scores: Vec<f32> = (0..n)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.3)
                .collect();
            let mut got = scores.clone();
            softmax(&mut got);
            let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut want = scores.clone();
            let whole = n / 8 * 8;
            let mut lanes = [0.0f32; 8];
            for (i, v) in want[..whole].iter_mut().enumerate() {
                *v = expf(*v - max);
                lanes[i % 8] += *v;
            }
            let mut sum = lanes.iter().fold(0.0f32, |a, &l| a + l);
            for v in &mut want[whole..] {
                *v = expf(*v - max);
                sum += *v;
            }
            want.iter_mut().for_each(|v| *v /= sum);
            assert_eq!(
                got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "n={n}"
            );
            let total: f32 = got.iter().sum();
            assert!((total - 1.0).abs() < 1e-5, "n={n}: sums to {total}");
        }
        // SwiGLU: vector lanes and the scalar tail give the same bits.
        let g: Vec<f32> = (0..37).map(|i| (i as f32 - 18.0) * 0.7).collect();
        let u: Vec<f32> = (0..37).map(|i| 1.0 - i as f32 * 0.05).collect();
        let mut got = vec![0.0f32; 37];
        swiglu(&mut got, &g, &u);
        for i in 0..37 {
            let want = g[i] / (1.0 + expf(-g[i])) * u[i];
            assert_eq!(got[i].to_bits(), want.to_bits(), "{i}");
        }
    }
}
