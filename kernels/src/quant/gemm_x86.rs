//! The x86_64 tiled micro-kernel of [`gemm`](fn@super::gemm) (Q4_1 × Q8_1
//! and Q8_0 × Q8_0 on AVX-512 VNNI), and a vectorized Q8_0/Q8_1
//! activation quantizer.
//!
//! **Numerics.** Every output is the scalar kernel's arithmetic, bit for
//! bit: per block the exact integer dot `sumi`, then in f32 and in block
//! order `sumf += (d_w * d_a) * sumi + m_w * s_a` for Q4_1, or
//! `sumf += sumi * (d_w * d_a)` for Q8_0. The single-row kernels
//! (`simd_x86.rs`) compute the same, so a row's result does not depend on
//! the rows batched with it.
//!
//! **Layout.** The sixteen 32-bit lanes of a vector are eight activation
//! rows × two weight rows: lane `2j + h` is activation row `j` of the
//! tile with weight row `h` of a pair, and holds that pair's running
//! `sumf`. A block's integer dots for all sixteen pairs are eight
//! `vpdpbusd`, one per 4-byte segment `s` of the block: the weight pair's
//! segment (the two rows' dwords as one qword broadcast to every lane;
//! unsigned: Q4_1 nibbles, Q8_0 `x + 128`) times the activation rows'
//! segment (signed, each row's dword in its two lanes), summed in i32
//! from a start of 0 (Q4_1) or `-128 * sum(y)` (Q8_0, since `(x + 128) *
//! y - 128 * y = x * y`). Integer sums are exact in any order; the float
//! steps are then one lane per pair, in the scalar order.
//!
//! The activation rows are packed once per matmul ([`ActPanel`]); each
//! tile of eight weight rows is prepared once per chunk of 64 activation
//! rows (kept in L2) and swept against the chunk's tiles of eight.
//!
//! Soundness rests on two invariants:
//!
//! 1. **Features.** Every kernel is a `#[target_feature] unsafe fn`,
//!    reached only through [`gemm`], [`ActPanel::new`] and
//!    [`quantize_q8`], which return without calling it unless
//!    `is_x86_feature_detected!` confirmed the features ([`vnni`],
//!    [`avx2`]).
//! 2. **Bounds.** The entry points check every slice length up front;
//!    kernels then only read blocks `b < nb` of rows `< m` (weights) and
//!    `< n` (activations), and tables within their sizes (stated where
//!    they are indexed unchecked).

#![allow(unsafe_code)]

use std::arch::x86_64::*;
use std::sync::OnceLock;

use super::activation::{Q8_0_BYTES, Q8_1_BYTES};
use super::q4::Q4_1_BYTES;
use super::types::{put_f16, F16_TO_F32};
use super::GgmlType;

/// Whether this CPU has AVX2, FMA and F16C (the activation quantizer).
fn avx2() -> bool {
    static YES: OnceLock<bool> = OnceLock::new();
    *YES.get_or_init(|| {
        is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
    })
}

/// Whether the tiled kernel runs here: AVX2 and AVX-512 F/VL/VNNI
/// (probed once). `DS4_GEMM_TILED=0` turns it off, for comparisons; a
/// matmul then makes one `vec_dot` per pair, with the same results.
pub(super) fn vnni() -> bool {
    static YES: OnceLock<bool> = OnceLock::new();
    *YES.get_or_init(|| {
        avx2()
            && is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("avx512vnni")
            && std::env::var("DS4_GEMM_TILED").map_or(true, |v| v != "0")
    })
}

#[inline(always)]
fn f16_at(b: &[u8], off: usize) -> f32 {
    F16_TO_F32[u16::from_le_bytes([b[off], b[off + 1]]) as usize]
}

/// Activation rows per tile (vector lanes hold two weight rows each).
const RA: usize = 8;
/// Weight rows per tile: four pairs.
const RW: usize = 8;
const PAIRS: usize = RW / 2;
/// Activation tiles per sweep over the weight rows (64 rows).
const CHUNK_TILES: usize = 8;

/// Block geometry: (weight block bytes, activation block bytes, offset
/// of the quants in each), for Q4_1 (`q41`) or Q8_0.
const fn geometry(q41: bool) -> (usize, usize, usize, usize) {
    if q41 {
        (Q4_1_BYTES, Q8_1_BYTES, 4, 4)
    } else {
        (Q8_0_BYTES, Q8_0_BYTES, 2, 2)
    }
}

/// Activation rows packed for the kernel, once per matmul and shared by
/// its calls: per tile `t` of eight rows and block `b`, at `[t * nb + b]`.
/// Rows past `n` of the last tile are zeros.
pub(super) struct ActPanel {
    q41: bool,
    n: usize,
    nb: usize,
    /// Segment `s` of the tile's rows, `[t * nb + b][s]`: row `j`'s dword
    /// `s` of the block's quants in lanes `2j` and `2j + 1`.
    seg: Vec<[__m512i; 8]>,
    /// `d_a` of row `j` in lanes `2j`, `2j + 1`.
    da: Vec<__m512>,
    /// Q4_1: the Q8_1 block sums `s_a`, laid out as `da`; Q8_0: empty.
    sa: Vec<__m512>,
    /// Q8_0: `-128 * sum(y)` of the block's quants, as `da`; Q4_1: empty.
    corr: Vec<__m512i>,
}

impl ActPanel {
    /// `act`: rows of `k` values in `ty.vec_dot_type()` (Q8_1 for Q4_1,
    /// Q8_0 for Q8_0). None where the kernel does not run here, for other
    /// types, or where a length is wrong.
    pub(super) fn new(ty: GgmlType, k: usize, act: &[u8]) -> Option<ActPanel> {
        let q41 = match ty {
            GgmlType::Q4_1 => true,
            GgmlType::Q8_0 => false,
            _ => return None,
        };
        let (_, a_bytes, _, _) = geometry(q41);
        let nb = k / 32;
        if !vnni() || nb == 0 || !k.is_multiple_of(32) || !act.len().is_multiple_of(nb * a_bytes) {
            return None;
        }
        // SAFETY: `vnni` confirmed the features; `act` is whole rows.
        Some(unsafe { pack(q41, nb, act) })
    }
}

/// [`ActPanel::new`] once checked.
///
/// # Safety
/// [`vnni`] is true; `act` is whole rows of `nb` blocks.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
unsafe fn pack(q41: bool, nb: usize, act: &[u8]) -> ActPanel {
    let (_, a_bytes, _, a_qs) = geometry(q41);
    let row = nb * a_bytes;
    let n = act.len() / row;
    let tiles = n.div_ceil(RA);
    let mut p = ActPanel {
        q41,
        n,
        nb,
        seg: Vec::with_capacity(tiles * nb),
        da: Vec::with_capacity(tiles * nb),
        sa: Vec::with_capacity(if q41 { tiles * nb } else { 0 }),
        corr: Vec::with_capacity(if q41 { 0 } else { tiles * nb }),
    };
    for t in 0..tiles {
        for b in 0..nb {
            let mut seg = [[0i32; 16]; 8];
            let (mut da, mut sa, mut corr) = ([0f32; 16], [0f32; 16], [0i32; 16]);
            for j in 0..RA.min(n - t * RA) {
                let blk = &act[(t * RA + j) * row + b * a_bytes..][..a_bytes];
                let qs = &blk[a_qs..a_qs + 32];
                for (s, seg) in seg.iter_mut().enumerate() {
                    let v = i32::from_le_bytes([
                        qs[4 * s],
                        qs[4 * s + 1],
                        qs[4 * s + 2],
                        qs[4 * s + 3],
                    ]);
                    seg[2 * j..2 * j + 2].fill(v);
                }
                da[2 * j..2 * j + 2].fill(f16_at(blk, 0));
                if q41 {
                    sa[2 * j..2 * j + 2].fill(f16_at(blk, 2));
                } else {
                    let sum: i32 = qs.iter().map(|&y| i32::from(y as i8)).sum();
                    corr[2 * j..2 * j + 2].fill(-128 * sum);
                }
            }
            // SAFETY: each array holds 16 lanes.
            unsafe {
                p.seg
                    .push(seg.map(|v| _mm512_loadu_si512(v.as_ptr().cast())));
                p.da.push(_mm512_loadu_ps(da.as_ptr()));
                if q41 {
                    p.sa.push(_mm512_loadu_ps(sa.as_ptr()));
                } else {
                    p.corr.push(_mm512_loadu_si512(corr.as_ptr().cast()));
                }
            }
        }
    }
    p
}

/// `out[r * ldo + i] = vec_dot(ty, k, w row i, act row r)` for every
/// weight row `i` in `w` and activation row `r` of `panel` (made from the
/// activations with the same `ty` and `k`). Returns `false` (and writes
/// nothing) where the panel is of another type or shape, or a length is
/// wrong.
pub(super) fn gemm(
    ty: GgmlType,
    k: usize,
    w: &[u8],
    panel: &ActPanel,
    out: &mut [f32],
    ldo: usize,
) -> bool {
    let q41 = match ty {
        GgmlType::Q4_1 => true,
        GgmlType::Q8_0 => false,
        _ => return false,
    };
    let (w_bytes, _, _, _) = geometry(q41);
    let nb = k / 32;
    if panel.q41 != q41 || panel.nb != nb || !k.is_multiple_of(32) {
        return false;
    }
    let (wrow, n) = (nb * w_bytes, panel.n);
    let m = w.len() / wrow;
    if w.len() != m * wrow || !(m <= ldo && (n == 0 || m == 0 || (n - 1) * ldo + m <= out.len())) {
        return false;
    }
    // SAFETY: a panel exists only where `vnni` confirmed the features;
    // lengths checked above.
    unsafe {
        if q41 {
            tiles::<true>(w, m, panel, out.as_mut_ptr(), ldo);
        } else {
            tiles::<false>(w, m, panel, out.as_mut_ptr(), ldo);
        }
    }
    true
}

/// A tile of eight weight rows prepared for the kernel, per block `b` and
/// pair `p` at `[b * PAIRS + p]`: rows past `m` are zeros.
struct WeightTile {
    /// The pair's quants, as qwords `[dword s of row 2p, of row 2p + 1]`
    /// in the order [`SEGS`] names (unsigned: Q4_1 nibbles, Q8_0
    /// `x + 128`).
    q: Vec<[u64; 8]>,
    /// `[d_w(2p), d_w(2p + 1), m_w(2p), m_w(2p + 1)]` (Q8_0: `m_w`
    /// unused): each pair broadcast as one qword gives lane `2j + h` row
    /// `2p + h`'s value.
    dm: Vec<[f32; 4]>,
}

/// The segment each qword of [`WeightTile::q`] holds: the order in which
/// `unpacklo/hi_epi32` interleave two rows' 32 bytes.
const SEGS: [usize; 8] = [0, 1, 4, 5, 2, 3, 6, 7];

/// # Safety
/// [`vnni`] is true; `w` holds `m` whole rows of `panel.nb` blocks;
/// `out[r * ldo + i]` writable for `r < panel.n`, `i < m`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
unsafe fn tiles<const Q41: bool>(w: &[u8], m: usize, panel: &ActPanel, out: *mut f32, ldo: usize) {
    let nb = panel.nb;
    let tiles = panel.n.div_ceil(RA);
    let mut wt = WeightTile {
        q: vec![[0; 8]; nb * PAIRS],
        dm: vec![[0.0; 4]; nb * PAIRS],
    };
    for chunk in (0..tiles).step_by(CHUNK_TILES) {
        for i0 in (0..m).step_by(RW) {
            prefetch_rows::<Q41>(w, nb, (i0 + 2 * RW).min(m), (i0 + 3 * RW).min(m));
            prepare::<Q41>(w, nb, i0, m, &mut wt);
            for t in chunk..(chunk + CHUNK_TILES).min(tiles) {
                // SAFETY: tile t < tiles; rows i0.. < m; the caller's
                // invariants otherwise.
                unsafe { tile::<Q41>(panel, &wt, t, i0, m, out, ldo) };
            }
        }
    }
}

/// Prefetches weight rows `from..to` (`to <= m`) into L2, two tiles
/// ahead of the one computing: weight rows stream from memory, and bursts
/// of prefetches into L1 stall on its few miss buffers.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
fn prefetch_rows<const Q41: bool>(w: &[u8], nb: usize, from: usize, to: usize) {
    let (w_bytes, _, _, _) = const { geometry(Q41) };
    let wrow = nb * w_bytes;
    for off in (from * wrow..to.max(from) * wrow).step_by(64) {
        // A prefetch never faults, and `off` lies inside the weight rows.
        _mm_prefetch::<_MM_HINT_T1>(w.as_ptr().wrapping_add(off).cast());
    }
}

/// Weight rows `i0..i0 + RW` (those below `m`) into `wt`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
fn prepare<const Q41: bool>(w: &[u8], nb: usize, i0: usize, m: usize, wt: &mut WeightTile) {
    let (w_bytes, _, w_qs, _) = const { geometry(Q41) };
    let wrow = nb * w_bytes;
    // Rows past `m` read as a zero row.
    let zero = [0u8; Q8_0_BYTES];
    const _: () = assert!(Q8_0_BYTES >= Q4_1_BYTES);
    let rows: [&[u8]; RW] = std::array::from_fn(|r| {
        let i = i0 + r;
        if i < m {
            &w[i * wrow..(i + 1) * wrow]
        } else {
            &[]
        }
    });
    for b in 0..nb {
        for p in 0..PAIRS {
            let block = |h: usize| {
                let row = rows[2 * p + h];
                if row.is_empty() {
                    zero.as_ptr()
                } else {
                    // SAFETY: block b < nb of a whole row.
                    unsafe { row.as_ptr().add(b * w_bytes) }
                }
            };
            let (x0, x1) = (block(0), block(1));
            // SAFETY: x0 and x1 point at whole blocks (or the zero block):
            // f16 d_w (and m_w) at 0, quants at w_qs.
            unsafe {
                let quants = |x: *const u8| {
                    if Q41 {
                        nibbles32(x.add(w_qs))
                    } else {
                        _mm256_xor_si256(load256(x.add(w_qs)), _mm256_set1_epi8(-128))
                    }
                };
                let (q0, q1) = (quants(x0), quants(x1));
                let k = b * PAIRS + p;
                let dst = wt.q.as_mut_ptr().add(k).cast::<__m256i>();
                _mm256_storeu_si256(dst, _mm256_unpacklo_epi32(q0, q1));
                _mm256_storeu_si256(dst.add(1), _mm256_unpackhi_epi32(q0, q1));
                // [d0, m0, d1, m1] converted (F16C, equal to the table for
                // every f16), to [d0, d1, m0, m1].
                let h = _mm_set_epi32(
                    0,
                    0,
                    x1.cast::<i32>().read_unaligned(),
                    x0.cast::<i32>().read_unaligned(),
                );
                let v = _mm_cvtph_ps(h);
                _mm_storeu_ps(
                    wt.dm.as_mut_ptr().add(k).cast(),
                    _mm_shuffle_ps::<0b11_01_10_00>(v, v),
                );
            }
        }
    }
}

/// The prepared weight rows `i0..` against activation tile `t`.
///
/// # Safety
/// As [`tiles`], with `t < n.div_ceil(RA)`, `wt` prepared for `i0`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
unsafe fn tile<const Q41: bool>(
    panel: &ActPanel,
    wt: &WeightTile,
    t: usize,
    i0: usize,
    m: usize,
    out: *mut f32,
    ldo: usize,
) {
    let nb = panel.nb;
    let mut acc = [_mm512_setzero_ps(); PAIRS];
    for b in 0..nb {
        let a = t * nb + b;
        // Unchecked: a < tiles * nb, the panel's tables' length.
        let (seg, da) = unsafe { (&*panel.seg.as_ptr().add(a), *panel.da.as_ptr().add(a)) };
        let (sa, start) = if Q41 {
            // SAFETY: as above (Q4_1 panels have `sa`).
            (unsafe { *panel.sa.as_ptr().add(a) }, _mm512_setzero_si512())
        } else {
            // SAFETY: as above (Q8_0 panels have `corr`).
            (_mm512_setzero_ps(), unsafe { *panel.corr.as_ptr().add(a) })
        };
        for (p, acc) in acc.iter_mut().enumerate() {
            // Unchecked: b * PAIRS + p < nb * PAIRS, the tile's length.
            let (q, dm) = unsafe {
                let k = b * PAIRS + p;
                (&*wt.q.as_ptr().add(k), &*wt.dm.as_ptr().add(k))
            };
            // Two i32 chains, summed at the end (exact).
            let mut sums = [start, _mm512_setzero_si512()];
            for (k, (&wq, &s)) in q.iter().zip(&SEGS).enumerate() {
                let x = _mm512_set1_epi64(wq as i64);
                sums[k % 2] = _mm512_dpbusd_epi32(sums[k % 2], x, seg[s]);
            }
            let sumi = _mm512_cvtepi32_ps(_mm512_add_epi32(sums[0], sums[1]));
            // Lane 2j + h: the pair (weight row 2p + h, activation row j).
            let pair = |i: usize| {
                // SAFETY: `dm` holds two pairs of f32 (8 bytes each).
                _mm512_castpd_ps(_mm512_set1_pd(unsafe {
                    dm.as_ptr().add(i).cast::<f64>().read_unaligned()
                }))
            };
            let d = _mm512_mul_ps(pair(0), da);
            *acc = if Q41 {
                let mins = _mm512_mul_ps(pair(2), sa);
                _mm512_add_ps(*acc, _mm512_add_ps(_mm512_mul_ps(d, sumi), mins))
            } else {
                _mm512_add_ps(*acc, _mm512_mul_ps(sumi, d))
            };
        }
    }
    let rows = RA.min(panel.n - t * RA);
    for (p, acc) in acc.iter().enumerate() {
        let mut lanes = [0f32; 16];
        // SAFETY: `lanes` holds 16 floats.
        unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), *acc) };
        for h in 0..2 {
            let i = i0 + 2 * p + h;
            if i >= m {
                continue;
            }
            for j in 0..rows {
                // SAFETY: row t * RA + j < n, column i < m: inside `out`.
                unsafe { *out.add((t * RA + j) * ldo + i) = lanes[2 * j + h] };
            }
        }
    }
}

/// 32 bytes at `p`.
///
/// # Safety
/// AVX2; 32 readable bytes at `p`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load256(p: *const u8) -> __m256i {
    // SAFETY: the caller guarantees 32 readable bytes at p.
    unsafe { _mm256_loadu_si256(p.cast()) }
}

/// 16 bytes of packed nibbles at `p` as 32 bytes in element order: low
/// nibbles (elements 0..16) in the low lane, high nibbles in the high lane.
///
/// # Safety
/// AVX2; 16 readable bytes at `p`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn nibbles32(p: *const u8) -> __m256i {
    // SAFETY: the caller guarantees 16 readable bytes at p.
    let x = unsafe { _mm_loadu_si128(p.cast()) };
    let both = _mm256_set_m128i(_mm_srli_epi16(x, 4), x);
    _mm256_and_si256(both, _mm256_set1_epi8(0x0f))
}

mod avx2 {
    //! The activation quantizer's block kernel (AVX2, FMA, F16C).

    use super::*;

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

/// Quantizes `src` to Q8_1 (`sums = true`) or Q8_0 into `dst`, bit for bit
/// as `quantize_row` does (`activation.rs`). Returns `false` (and writes
/// nothing) when the CPU lacks AVX2/FMA/F16C or the lengths do not match.
pub(super) fn quantize_q8(src: &[f32], dst: &mut [u8], sums: bool) -> bool {
    let (bytes, qs) = if sums {
        (Q8_1_BYTES, 4)
    } else {
        (Q8_0_BYTES, 2)
    };
    if !avx2() || !src.len().is_multiple_of(32) || dst.len() != src.len() / 32 * bytes {
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
