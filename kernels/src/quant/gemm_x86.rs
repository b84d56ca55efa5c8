//! x86_64 register-tiled micro-kernels for [`gemm`](fn@super::gemm)
//! (Q4_1 × Q8_1 and Q8_0 × Q8_0), and a vectorized Q8_0/Q8_1 activation
//! quantizer.
//!
//! A tile is `RW` weight rows × `RA` activation rows (2 × 4 on AVX2, 4 × 4
//! on AVX-512 VNNI, whose 32 vector registers hold the 16 accumulators).
//! Each weight tile is unpacked to bytes once per group of activation rows
//! and dotted against them, with one `__m256` accumulator per (weight row,
//! activation row) pair held in registers. Two instruction sets, chosen at
//! run time ([`Isa`]): AVX2 (`maddubs` + `madd`, as `simd_x86.rs`) and,
//! where the CPU has AVX-512 F/VL/VNNI, `vpdpbusd` on 256-bit vectors.
//!
//! **Bit-identity with [`vec_dot`](super::vec_dot).** The single-row AVX2
//! kernels (`simd_x86.rs`) accumulate block `i` into accumulator `i & 1`
//! (`acc = fma(d, float(isum), acc)`, `d = d_w * d_a` rounded to f32, `isum`
//! the eight exact i32 lane sums of `maddubs` + `madd`, lane `j` summing
//! the products of elements `4j..4j + 4`), then return `hsum(acc0 + acc1)`
//! (+ the Q4_1 `mins`, summed in block order as `mins += m_w * s_a`). The
//! two accumulators are independent chains, so these kernels run all even
//! blocks first (chain 0) and then all odd blocks (chain 1), with each
//! chain's operations in the same order and the same lane layout; then
//! they combine exactly as the single-row kernel does. Integer lane sums
//! are exact however they are computed (no `maddubs` pair sum here can
//! saturate), f16 → f32 conversions are exact, and f32 products are
//! commutative, so every output is bit-identical. The AVX2 dot table and
//! these kernels need the same base features, so wherever a tiled kernel
//! runs, `vec_dot` runs the AVX2 kernel it reproduces.
//!
//! Soundness rests on the same two invariants as `simd_x86.rs`:
//!
//! 1. **Features.** Every kernel is a `#[target_feature] unsafe fn` of
//!    one [`Isa`], reached only through [`gemm`] and [`quantize_q8`],
//!    which return `false` without calling it unless
//!    `is_x86_feature_detected!` confirmed all the features of that `Isa`
//!    ([`Isa::available`]).
//! 2. **Bounds.** The entry points check every slice length up front;
//!    kernels then only read blocks `b < nb` of rows `< m` (weights) and
//!    `< n` (activations), and scratch tables within their sizes (stated
//!    where they are indexed unchecked).

#![allow(unsafe_code)]

use std::arch::x86_64::*;
use std::sync::OnceLock;

use super::activation::{Q8_0_BYTES, Q8_1_BYTES};
use super::q4::Q4_1_BYTES;
use super::types::{put_f16, F16_TO_F32};
use super::GgmlType;

/// The instruction sets the tiled kernels come in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Isa {
    /// AVX2 + FMA + F16C: `maddubs` + `madd`.
    Avx2,
    /// The same plus AVX-512 F/VL/VNNI: `vpdpbusd` on 256-bit vectors.
    Avx512Vnni,
}

impl Isa {
    /// Whether this CPU runs the kernels of `self`. AVX2, FMA and F16C
    /// are the features the AVX2 dot table requires, so wherever a tiled
    /// kernel runs, `vec_dot` runs the single-row AVX2 kernel it matches.
    pub(super) fn available(self) -> bool {
        let avx2 = is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c");
        match self {
            Isa::Avx2 => avx2,
            Isa::Avx512Vnni => {
                avx2 && is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512vl")
                    && is_x86_feature_detected!("avx512vnni")
            }
        }
    }

    /// The fastest available set (probed once); `DS4_GEMM_ISA=avx2`
    /// restricts it to AVX2 (for comparisons).
    pub(super) fn best() -> Option<Isa> {
        static BEST: OnceLock<Option<Isa>> = OnceLock::new();
        *BEST.get_or_init(|| {
            let avx2_only = std::env::var("DS4_GEMM_ISA").is_ok_and(|v| v == "avx2");
            [Isa::Avx512Vnni, Isa::Avx2]
                .into_iter()
                .filter(|&isa| !(avx2_only && isa == Isa::Avx512Vnni))
                .find(|isa| isa.available())
        })
    }
}

#[inline(always)]
fn f16_at(b: &[u8], off: usize) -> f32 {
    F16_TO_F32[u16::from_le_bytes([b[off], b[off + 1]]) as usize]
}

/// The activation block scales the tiled kernels read, transposed to
/// `[nb][n]` (`da`; Q8_1's block sums `sa`, empty for Q8_0): made once
/// per set of activation rows ([`ActScales::new`]) and shared by every
/// [`gemm`] call over those rows.
pub(super) struct ActScales {
    da: Vec<f32>,
    sa: Vec<f32>,
    /// Activation rows and blocks per row they were made for.
    n: usize,
    nb: usize,
}

impl ActScales {
    /// The scales of `act` (rows of `k` values in `ty`'s `vec_dot_type`),
    /// or None where no tiled kernel takes `ty` or a length is wrong.
    pub(super) fn new(ty: GgmlType, k: usize, act: &[u8]) -> Option<ActScales> {
        let (q41, a_bytes) = match ty {
            GgmlType::Q4_1 => (true, Q8_1_BYTES),
            GgmlType::Q8_0 => (false, Q8_0_BYTES),
            _ => return None,
        };
        let nb = k / 32;
        if nb == 0 || !k.is_multiple_of(32) || !act.len().is_multiple_of(nb * a_bytes) {
            return None;
        }
        let n = act.len() / (nb * a_bytes);
        Some(ActScales {
            da: scales_t(act, n, nb, a_bytes, 0),
            sa: if q41 {
                scales_t(act, n, nb, a_bytes, 2)
            } else {
                Vec::new()
            },
            n,
            nb,
        })
    }
}

/// The f32 scales of `n` activation rows of `nb` blocks each, transposed
/// to `[nb][n]`: field at byte `off` of each `bytes`-byte block.
fn scales_t(act: &[u8], n: usize, nb: usize, bytes: usize, off: usize) -> Vec<f32> {
    // Eight spare lanes: kernels load eight scales from any row index.
    let mut t = vec![0f32; nb * n + 8];
    for (r, row) in act.chunks_exact(nb * bytes).take(n).enumerate() {
        for (b, blk) in row.chunks_exact(bytes).enumerate() {
            t[b * n + r] = f16_at(blk, off);
        }
    }
    t
}

/// `out[r * ldo + i] = vec_dot(ty, k, w row i, act row r)` on `isa` for
/// every weight row `i` in `w` and activation row `r` in `act`, where `ty`
/// is Q4_1 (× Q8_1) or Q8_0 (× Q8_0), with `act`'s scales from
/// [`ActScales::new`] (made here when None). Returns `false` (and writes
/// nothing) for other types, when the CPU lacks `isa`, or when a length
/// is wrong.
#[allow(clippy::too_many_arguments)]
pub(super) fn gemm(
    isa: Isa,
    ty: GgmlType,
    k: usize,
    w: &[u8],
    act: &[u8],
    scales: Option<&ActScales>,
    out: &mut [f32],
    ldo: usize,
) -> bool {
    let (q41, w_bytes, a_bytes) = match ty {
        GgmlType::Q4_1 => (true, Q4_1_BYTES, Q8_1_BYTES),
        GgmlType::Q8_0 => (false, Q8_0_BYTES, Q8_0_BYTES),
        _ => return false,
    };
    let nb = k / 32;
    if !isa.available() || nb == 0 || !k.is_multiple_of(32) {
        return false;
    }
    let (wrow, arow) = (nb * w_bytes, nb * a_bytes);
    let (m, n) = (w.len() / wrow, act.len() / arow);
    if w.len() != m * wrow || act.len() != n * arow || !out_fits(out.len(), m, n, ldo) {
        return false;
    }
    let made;
    let scales = match scales {
        Some(s) => s,
        None => match ActScales::new(ty, k, act) {
            Some(s) => {
                made = s;
                &made
            }
            None => return false,
        },
    };
    if (scales.n, scales.nb) != (n, nb) {
        return false;
    }
    let p = Panel {
        w: w.as_ptr(),
        act: act.as_ptr(),
        nb,
        n,
        da: &scales.da,
        sa: &scales.sa,
    };
    // SAFETY: features checked by `available`; lengths checked above,
    // and `tiles` only reads rows < m, < n and blocks < nb.
    unsafe {
        if q41 {
            tiles::<true>(isa, &p, m, out.as_mut_ptr(), ldo);
        } else {
            tiles::<false>(isa, &p, m, out.as_mut_ptr(), ldo);
        }
    }
    true
}

/// Runs the tile loops of `isa`.
///
/// # Safety
/// `isa.available()`, and the invariants of the `tiles` functions.
unsafe fn tiles<const Q41: bool>(isa: Isa, p: &Panel, m: usize, out: *mut f32, ldo: usize) {
    // SAFETY: forwarded from the caller.
    unsafe {
        match isa {
            Isa::Avx2 => tiles_avx2::tiles::<Q41>(p, m, out, ldo),
            Isa::Avx512Vnni => tiles_vnni::tiles::<Q41>(p, m, out, ldo),
        }
    }
}

fn out_fits(len: usize, m: usize, n: usize, ldo: usize) -> bool {
    m <= ldo && (n == 0 || m == 0 || (n - 1) * ldo + m <= len)
}

/// The operands of one call.
struct Panel<'a> {
    w: *const u8,
    act: *const u8,
    nb: usize,
    n: usize,
    /// Activation block scales, `[nb][n]`.
    da: &'a [f32],
    /// Q8_1 activation block sums `s_a`, `[nb][n]` (empty for Q8_0).
    sa: &'a [f32],
}

/// Block geometry: (weight block bytes, activation block bytes, offset
/// of the activation quants), for Q4_1 (`Q41 = true`) or Q8_0.
const fn geometry(q41: bool) -> (usize, usize, usize) {
    if q41 {
        (Q4_1_BYTES, Q8_1_BYTES, 4)
    } else {
        (Q8_0_BYTES, Q8_0_BYTES, 2)
    }
}

/// Generates the tile loops for one instruction set: `$features` for
/// `#[target_feature]`, `$vnni` whether they may use `vpdpbusd`, and the
/// tile shape `$rw x $ra` (weight rows × activation rows).
///
/// Per group of activation rows (`CHUNK`, kept in L2), each tile of
/// weight rows is first *prepared* (quants unpacked to 32 bytes per block,
/// scales converted to f32), then swept against the activation tiles.
/// For each (weight tile, activation tile), a pass computes every pair's
/// `d = d_w * d_a` into a table that the inner loop broadcasts from
/// memory. The inner loop per (block, pair) is then: integer lane sums,
/// convert, FMA.
///
/// Lane sums by format and ISA (all exact, all equal to the single-row
/// kernel's `maddubs` + `madd` lanes):
/// - Q4_1: unpacked nibbles `u` (u8) with `y`: `madd(maddubs(u, y), 1)`
///   or `vpdpbusd(0, u, y)`;
/// - Q8_0, AVX2: `madd(maddubs(|x|, sign(y, x)), 1)`, as the single-row
///   kernel;
/// - Q8_0, VNNI: `vpdpbusd(-128 * sum4(y), x ^ 0x80, y)`, since
///   `(x + 128) * y - 128 * y = x * y`; `sum4(y)`, the lane sums of `y`,
///   is computed once per activation block per call.
macro_rules! tiled_kernels {
    ($module:ident, $features:literal, $vnni:literal, $rw:literal x $ra:literal) => {
        mod $module {
            //! Tile loops; see the parent module for the invariants.

            use super::*;

            const RW: usize = $rw;
            const RA: usize = $ra;
            const _: () = assert!(RA >= 4 && RA <= 8 && RW >= 1);
            /// Activation rows per sweep over the weight rows.
            const CHUNK: usize = 64;

            /// Per-call buffers.
            struct Scratch {
                /// Prepared quants of the weight tile, `[nb][RW]` × 32 bytes.
                xq: Vec<__m256i>,
                /// `[d_w, m_w]` of the weight tile, `[nb][RW]` (Q8_0 has
                /// no `m_w`).
                dm: Vec<[f32; 2]>,
                /// `d` of every pair of a tile, `[nb][RW][8]` (lanes
                /// `>= RA` unused).
                d: Vec<f32>,
                /// Q8_0 on VNNI: `-128 * sum4(y)` of the activation rows
                /// of the current chunk, `[row - chunk start][nb]`.
                corr: Vec<__m256i>,
            }

            /// # Safety
            /// The module's features present; `p` describes valid rows
            /// (`m` weight rows, `p.n` activation rows of `p.nb` blocks);
            /// `out[r * ldo + i]` writable for `r < n`, `i < m`.
            #[target_feature(enable = $features)]
            pub(super) unsafe fn tiles<const Q41: bool>(
                p: &Panel,
                m: usize,
                out: *mut f32,
                ldo: usize,
            ) {
                let nb = p.nb;
                let mut s = Scratch {
                    xq: vec![_mm256_setzero_si256(); nb * RW],
                    dm: vec![[0.0; 2]; nb * RW],
                    d: vec![0.0; nb * RW * 8],
                    corr: if !Q41 && $vnni {
                        vec![_mm256_setzero_si256(); nb * CHUNK.min(p.n)]
                    } else {
                        Vec::new()
                    },
                };
                let mut r = 0;
                while r < p.n {
                    let end = (r + CHUNK).min(p.n);
                    if !Q41 && $vnni {
                        for row in r..end {
                            for b in 0..nb {
                                // SAFETY: block b < nb of row < n; this
                                // branch only runs with VNNI features.
                                let sum4 = unsafe {
                                    let y = p.act.add((row * nb + b) * Q8_0_BYTES + 2);
                                    vnni::dot_u8_i8(_mm256_set1_epi8(1), avx2::load256(y))
                                };
                                s.corr[(row - r) * nb + b] = _mm256_slli_epi32(
                                    _mm256_sub_epi32(_mm256_setzero_si256(), sum4),
                                    7,
                                );
                            }
                        }
                    }
                    let mut i = 0;
                    // SAFETY (all calls): rows i..i + RW <= m,
                    // r..end <= n; the caller's invariants otherwise.
                    unsafe {
                        while i + RW <= m {
                            // Weight rows stream from memory: fetch those
                            // of two tiles ahead into L2 while this one
                            // computes (into L1, the bursts of prefetches
                            // stall on the few L1 miss buffers).
                            prefetch_rows::<Q41>(p, (i + 2 * RW).min(m), (i + 3 * RW).min(m));
                            act_tiles::<Q41, RW>(p, &mut s, i, r, r, end, out, ldo);
                            i += RW;
                        }
                        while i < m {
                            act_tiles::<Q41, 1>(p, &mut s, i, r, r, end, out, ldo);
                            i += 1;
                        }
                    }
                    r = end;
                }
            }

            /// Prefetches weight rows `from..to` (`to <= m`) into cache.
            #[inline]
            #[target_feature(enable = $features)]
            fn prefetch_rows<const Q41: bool>(p: &Panel, from: usize, to: usize) {
                let (w_bytes, _, _) = const { geometry(Q41) };
                let wrow = p.nb * w_bytes;
                let (start, end) = (from * wrow, to.max(from) * wrow);
                for off in (start..end).step_by(64) {
                    // A prefetch never faults, and `off` lies inside the
                    // weight rows (to <= m).
                    _mm_prefetch::<_MM_HINT_T1>(p.w.wrapping_add(off).cast());
                }
            }

            /// Weight rows `i0..i0 + W` against activation rows `r..end`
            /// of the chunk starting at row `c0`.
            ///
            /// # Safety
            /// As [`tiles`], with `i0 + W <= m`, `W <= RW`,
            /// `c0 <= r <= end <= min(n, c0 + CHUNK)`.
            #[inline]
            #[allow(clippy::too_many_arguments)]
            #[target_feature(enable = $features)]
            unsafe fn act_tiles<const Q41: bool, const W: usize>(
                p: &Panel,
                s: &mut Scratch,
                i0: usize,
                c0: usize,
                mut r: usize,
                end: usize,
                out: *mut f32,
                ldo: usize,
            ) {
                let (w_bytes, _, _) = const { geometry(Q41) };
                let wrow = p.nb * w_bytes;
                for b in 0..p.nb {
                    for i in 0..W {
                        // SAFETY: row i0 + i < m, block b < nb.
                        unsafe {
                            let x = p.w.add((i0 + i) * wrow + b * w_bytes);
                            let k = b * W + i;
                            // Q8_0: the second value (two quants) is unused.
                            s.dm[k] = avx2::f16x2_cvt(x);
                            s.xq[k] = if Q41 {
                                avx2::nibbles32(x.add(4))
                            } else if $vnni {
                                // x + 128 as u8.
                                _mm256_xor_si256(avx2::load256(x.add(2)), _mm256_set1_epi8(-128))
                            } else {
                                avx2::abs_quants(x.add(2))
                            };
                        }
                    }
                }
                // SAFETY (all calls): rows r..r + width <= end <= n,
                // i0 + W <= m.
                unsafe {
                    while r + RA <= end {
                        tile::<Q41, W, RA>(p, s, i0, c0, r, out, ldo);
                        r += RA;
                    }
                    if RA > 4 && r + 4 <= end {
                        tile::<Q41, W, 4>(p, s, i0, c0, r, out, ldo);
                        r += 4;
                    }
                    match end - r {
                        3 => tile::<Q41, W, 3>(p, s, i0, c0, r, out, ldo),
                        2 => tile::<Q41, W, 2>(p, s, i0, c0, r, out, ldo),
                        1 => tile::<Q41, W, 1>(p, s, i0, c0, r, out, ldo),
                        _ => {}
                    }
                }
            }

            /// One `W × A` tile: the prepared weight rows `i0..` (in `s`),
            /// activation rows `r0..`.
            ///
            /// # Safety
            /// As [`tiles`], with `i0 + W <= m`, `c0 <= r0`,
            /// `r0 + A <= min(n, c0 + CHUNK)`, and `s` prepared for rows
            /// `i0..i0 + W` and the chunk at `c0`.
            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn tile<const Q41: bool, const W: usize, const A: usize>(
                p: &Panel,
                s: &mut Scratch,
                i0: usize,
                c0: usize,
                r0: usize,
                out: *mut f32,
                ldo: usize,
            ) {
                let (w_bytes, a_bytes, a_qs) = const { geometry(Q41) };
                let nb = p.nb;
                let wrow = nb * w_bytes;
                let arow = nb * a_bytes;
                // SAFETY: rows i0 + W <= m and r0 + A <= n (caller).
                let wp: [*const u8; W] =
                    std::array::from_fn(|i| unsafe { p.w.add((i0 + i) * wrow) });
                let ap: [*const u8; A] =
                    std::array::from_fn(|j| unsafe { p.act.add((r0 + j) * arow) });

                // The d table: d[b][i][j] = d_w[i] * d_a[j] (the scalar
                // product, lane by lane).
                for b in 0..nb {
                    // SAFETY: `da` has 8 spare lanes past its end; `d`
                    // holds nb * RW * 8 floats, W <= RW.
                    unsafe {
                        let da = _mm256_loadu_ps(p.da.as_ptr().add(b * p.n + r0));
                        for i in 0..W {
                            let dw = _mm256_set1_ps(s.dm[b * W + i][0]);
                            let dst = s.d.as_mut_ptr().add((b * W + i) * 8);
                            _mm256_storeu_ps(dst, _mm256_mul_ps(dw, da));
                        }
                    }
                }

                // Chain 0 (even blocks), then chain 1 (odd blocks).
                let mut chains = [[[_mm256_setzero_ps(); A]; W]; 2];
                for (parity, chain) in chains.iter_mut().enumerate() {
                    let mut acc = [[_mm256_setzero_ps(); A]; W];
                    let mut b = parity;
                    while b < nb {
                        // SAFETY: b < nb, rows in range: every block read
                        // is whole; table indices are below their sizes.
                        unsafe {
                            // Unchecked: b * W + i < nb * RW = s.xq.len().
                            let xq: [__m256i; W] =
                                std::array::from_fn(|i| *s.xq.as_ptr().add(b * W + i));
                            let d = s.d.as_ptr().add(b * W * 8);
                            for j in 0..A {
                                let y = avx2::load256(ap[j].add(b * a_bytes + a_qs));
                                for i in 0..W {
                                    let isum = if Q41 {
                                        if $vnni {
                                            vnni::dot_u8_i8(xq[i], y)
                                        } else {
                                            avx2::dot_u8_i8(xq[i], y)
                                        }
                                    } else if $vnni {
                                        // Unchecked: row r0 + j - c0 <
                                        // CHUNK of the chunk's table.
                                        let c = *s.corr.as_ptr().add((r0 - c0 + j) * nb + b);
                                        vnni::dot_u8_i8_acc(c, xq[i], y)
                                    } else {
                                        // y in [-127, 127] (from
                                        // `quantize_row`), so giving it
                                        // the weight's sign is exact.
                                        let qx = avx2::load256(wp[i].add(b * w_bytes + 2));
                                        avx2::dot_u8_i8(xq[i], _mm256_sign_epi8(y, qx))
                                    };
                                    let q = _mm256_cvtepi32_ps(isum);
                                    let dij = _mm256_broadcast_ss(&*d.add(i * 8 + j));
                                    acc[i][j] = _mm256_fmadd_ps(dij, q, acc[i][j]);
                                }
                            }
                        }
                        b += 2;
                    }
                    *chain = acc;
                }

                // Q4_1: mins in block order, per pair `mins += m_w * s_a`.
                let mut mins = [[0f32; A]; W];
                if Q41 {
                    for b in 0..nb {
                        let sa = &p.sa[b * p.n + r0..b * p.n + r0 + A];
                        for (i, mins) in mins.iter_mut().enumerate() {
                            let mw = s.dm[b * W + i][1];
                            for (mn, &s) in mins.iter_mut().zip(sa) {
                                *mn += mw * s;
                            }
                        }
                    }
                }

                for i in 0..W {
                    for j in 0..A {
                        let sum = avx2::hsum_ps(_mm256_add_ps(chains[0][i][j], chains[1][i][j]));
                        let v = if Q41 { sum + mins[i][j] } else { sum };
                        // SAFETY: r0 + j < n, i0 + i < m: inside `out`.
                        unsafe { *out.add((r0 + j) * ldo + i0 + i) = v };
                    }
                }
            }
        }
    };
}

tiled_kernels!(tiles_avx2, "avx2,fma,f16c", false, 2 x 4);
tiled_kernels!(
    tiles_vnni,
    "avx2,fma,f16c,avx512f,avx512vl,avx512vnni",
    true,
    4 x 4
);

mod avx2 {
    //! Block helpers, the same operations as `simd_x86.rs` uses. Every
    //! function requires AVX2, FMA and F16C, and every pointer must point
    //! at the bytes named.

    use super::*;

    /// Horizontal sum of eight f32 lanes, in `simd_x86`'s order.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn hsum_ps(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_movehdup_ps(s));
        _mm_cvtss_f32(s)
    }

    /// The two consecutive f16 at `p` (4 readable bytes) as f32,
    /// converted by F16C: equal to the `F16_TO_F32` table for every bit
    /// pattern (NaNs included: both set the quiet bit and keep the
    /// payload), without the table's cache misses.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn f16x2_cvt(p: *const u8) -> [f32; 2] {
        // SAFETY: the caller guarantees 4 readable bytes at p.
        let h = unsafe { p.cast::<i32>().read_unaligned() };
        let v = _mm_cvtph_ps(_mm_cvtsi32_si128(h));
        [_mm_cvtss_f32(v), _mm_cvtss_f32(_mm_movehdup_ps(v))]
    }

    /// 32 bytes at `p`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn load256(p: *const u8) -> __m256i {
        // SAFETY: the caller guarantees 32 readable bytes at p.
        unsafe { _mm256_loadu_si256(p.cast()) }
    }

    /// 16 bytes of packed nibbles at `p` as 32 bytes: low nibbles
    /// (elements 0..16) in the low lane, high nibbles in the high lane.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn nibbles32(p: *const u8) -> __m256i {
        // SAFETY: the caller guarantees 16 readable bytes at p.
        let x = unsafe { _mm_loadu_si128(p.cast()) };
        let both = _mm256_set_m128i(_mm_srli_epi16(x, 4), x);
        _mm256_and_si256(both, _mm256_set1_epi8(0x0f))
    }

    /// `u8 × i8` products of 32 bytes summed to eight i32 lanes.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot_u8_i8(x: __m256i, y: __m256i) -> __m256i {
        _mm256_madd_epi16(_mm256_maddubs_epi16(x, y), _mm256_set1_epi16(1))
    }

    /// The 32 quants at `p` as |q| (u8).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn abs_quants(p: *const u8) -> __m256i {
        // SAFETY: 32 readable bytes at p (caller).
        let q = unsafe { load256(p) };
        _mm256_sign_epi8(q, q)
    }
    /// One 32-float block at `x` quantized as `quantize_q8_0`/`_q8_1`
    /// do, the 32 quants written to `q`: returns `(d, sum of quants)`.
    ///
    /// Bit-identity with the scalar code: `amax` is a max (exact, order
    /// free; `max_ps(|v|, m)` ignores a NaN `v` as `f32::max` does), `d`
    /// and `id` are the same f32 operations, and each `v * id` is rounded
    /// half away from zero exactly (`t = trunc(p)`, `p - t` is exact, add
    /// `±1` where `|p - t| >= 0.5`), after mapping NaN to 0 and clamping
    /// to [-128, 127], which is what `as i8` does with the rounded value.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn quantize_block(x: *const f32, q: *mut u8) -> (f32, i32) {
        // SAFETY: 32 readable floats at x (caller).
        let v: [__m256; 4] = std::array::from_fn(|i| unsafe { _mm256_loadu_ps(x.add(8 * i)) });
        let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
        let mut m = _mm256_setzero_ps();
        for v in v {
            m = _mm256_max_ps(_mm256_and_ps(v, abs_mask), m);
        }
        let m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        let m1 = _mm_max_ss(m2, _mm_movehdup_ps(m2));
        let amax = _mm_cvtss_f32(m1);
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let idv = _mm256_set1_ps(id);
        let half = _mm256_set1_ps(0.5);
        let one = _mm256_set1_ps(1.0);
        let sign = _mm256_set1_ps(-0.0);
        let mut sum = _mm256_setzero_si256();
        let mut ints = [_mm256_setzero_si256(); 4];
        for (v, int) in v.into_iter().zip(&mut ints) {
            let p = _mm256_mul_ps(v, idv);
            // NaN -> 0, then clamp.
            let p = _mm256_and_ps(p, _mm256_cmp_ps::<_CMP_ORD_Q>(p, p));
            let p = _mm256_min_ps(
                _mm256_max_ps(p, _mm256_set1_ps(-128.0)),
                _mm256_set1_ps(127.0),
            );
            let t = _mm256_round_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(p);
            let frac = _mm256_andnot_ps(sign, _mm256_sub_ps(p, t));
            let away = _mm256_cmp_ps::<_CMP_GE_OQ>(frac, half);
            let step = _mm256_or_ps(_mm256_and_ps(one, away), _mm256_and_ps(p, sign));
            let r = _mm256_add_ps(t, _mm256_and_ps(step, away));
            *int = _mm256_cvtps_epi32(r);
            sum = _mm256_add_epi32(sum, *int);
        }
        // i32 -> i8 (all in [-128, 127]), back in element order.
        let a = _mm256_packs_epi32(ints[0], ints[1]);
        let b = _mm256_packs_epi32(ints[2], ints[3]);
        let bytes = _mm256_permutevar8x32_epi32(
            _mm256_packs_epi16(a, b),
            _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7),
        );
        // SAFETY: 32 writable bytes at q (caller).
        unsafe { _mm256_storeu_si256(q.cast(), bytes) };
        let s4 = _mm_add_epi32(
            _mm256_castsi256_si128(sum),
            _mm256_extracti128_si256(sum, 1),
        );
        let s2 = _mm_add_epi32(s4, _mm_unpackhi_epi64(s4, s4));
        let s1 = _mm_add_epi32(s2, _mm_shuffle_epi32::<0b01>(s2));
        (d, _mm_cvtsi128_si32(s1))
    }
}

mod vnni {
    //! AVX-512 VNNI (on 256-bit vectors) helpers.

    use super::*;

    /// `u8 × i8` products of 32 bytes summed to eight i32 lanes: the same
    /// lanes as [`avx2::dot_u8_i8`], in one
    /// instruction. Equal to it wherever `maddubs` does not saturate,
    /// which holds for every pair sum the kernels form (`|x| <= 128`,
    /// `|y| <= 127`: below 2 * 128 * 127 = 32512).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
    pub(super) unsafe fn dot_u8_i8(x: __m256i, y: __m256i) -> __m256i {
        _mm256_dpbusd_epi32(_mm256_setzero_si256(), x, y)
    }

    /// `acc` plus the lane sums of [`dot_u8_i8`], in one instruction
    /// (exact: all sums the kernels form are far from i32 overflow).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
    pub(super) unsafe fn dot_u8_i8_acc(acc: __m256i, x: __m256i, y: __m256i) -> __m256i {
        _mm256_dpbusd_epi32(acc, x, y)
    }
}

/// Every f16 bit pattern converted by F16C and by the table, for the test
/// that they agree; `None` without F16C.
#[cfg(test)]
pub(super) fn f16_conversions() -> Option<Vec<(f32, f32)>> {
    if !Isa::Avx2.available() {
        return None;
    }
    let pairs = (0..=u16::MAX)
        .flat_map(|h| {
            // h in both halves, with a different neighbour each time.
            let lo = u32::from(h) | (u32::from(h ^ 0x8001) << 16);
            let hi = u32::from(h ^ 0x7c01) | (u32::from(h) << 16);
            let table = F16_TO_F32[h as usize];
            // SAFETY: features checked; 4 bytes read from each array.
            let (a, b) = unsafe {
                (
                    avx2::f16x2_cvt(lo.to_le_bytes().as_ptr()),
                    avx2::f16x2_cvt(hi.to_le_bytes().as_ptr()),
                )
            };
            [(a[0], table), (b[1], table)]
        })
        .collect();
    Some(pairs)
}

/// Quantizes `src` to Q8_1 (`sums = true`) or Q8_0 into `dst`, bit for bit
/// as `quantize_row` does (`activation.rs`). Returns `false` (and writes
/// nothing) when the CPU lacks AVX2/FMA/F16C or the lengths do not match.
pub(super) fn quantize_q8(src: &[f32], dst: &mut [u8], sums: bool) -> bool {
    let (bytes, qs) = if sums {
        (Q8_1_BYTES, 4)
    } else {
        (Q8_0_BYTES, 2)
    };
    if !Isa::Avx2.available()
        || !src.len().is_multiple_of(32)
        || dst.len() != src.len() / 32 * bytes
    {
        return false;
    }
    for (x, y) in src.chunks_exact(32).zip(dst.chunks_exact_mut(bytes)) {
        // SAFETY: features checked above; x holds 32 floats and y[qs..]
        // at least 32 bytes.
        let (d, sum) = unsafe { avx2::quantize_block(x.as_ptr(), y[qs..].as_mut_ptr()) };
        put_f16(y, 0, d);
        if sums {
            put_f16(y, 2, sum as f32 * d);
        }
    }
    true
}
