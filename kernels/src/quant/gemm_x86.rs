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
//! **Layout.** The sixteen 32-bit lanes of a vector are `16 / G`
//! activation rows × `G` weight rows: lane `j * G + h` is activation row
//! `j` of the tile with weight row `h` of a group, and holds that pair's
//! running `sumf`. `G = 2` (eight activation rows a tile) suits most
//! counts; `G = 8` (two) serves counts that would leave eight-row tiles
//! mostly idle, such as 2 to 5 rows. A block's integer dots for all
//! sixteen pairs are eight `vpdpbusd`, one per 4-byte segment `s` of the
//! block: the weight group's segment (its rows' dwords, broadcast to
//! every lane group; unsigned: Q4_1 nibbles, Q8_0 `x + 128`) times the
//! activation rows' segment (signed, each row's dword over its lane
//! group), summed in i32 from a start of 0 (Q4_1) or `-128 * sum(y)`
//! (Q8_0, since `(x + 128) * y - 128 * y = x * y`). Integer sums are exact
//! in any order; the float steps are then one lane per pair, in the scalar
//! order.
//!
//! The activation rows are packed once per matmul ([`ActPanel`]); each
//! tile of eight weight rows is prepared once per chunk of 64 activation
//! rows (kept in L2: nibbles unpacked, rows interleaved by group, scales
//! converted) and swept against the chunk's activation tiles.
//!
//! Soundness rests on two invariants:
//!
//! 1. **Features.** Every kernel is a `#[target_feature] unsafe fn`,
//!    reached only through [`gemm`], [`ActPanel::new`] and
//!    [`quantize_q8`], which return without calling it unless
//!    `is_x86_feature_detected!` confirmed the features ([`vnni()`],
//!    [`avx2_available`]).
//! 2. **Bounds.** The entry points check every slice length up front;
//!    kernels then only read blocks `b < nb` of rows `< m` (weights) and
//!    `< n` (activations), and tables within their sizes (stated where
//!    they are indexed unchecked).

#![allow(unsafe_code)]

use std::arch::x86_64::*;
use std::sync::OnceLock;

use super::activation::{Q8_0_BYTES, Q8_1_BYTES};
use super::q4::Q4_1_BYTES;
use super::simd_x86::{avx2_available, prefetch_l2, vnni_available};
use super::types::{f16_at, put_f16};
use super::GgmlType;

/// Whether the tiled kernel runs here: AVX2 and AVX-512 F/VL/VNNI
/// ([`vnni_available`], probed once). `DS4_GEMM_TILED=0` turns it off, for
/// comparisons; a matmul then makes one `vec_dot` per pair, with the same
/// results.
pub(super) fn vnni() -> bool {
    static YES: OnceLock<bool> = OnceLock::new();
    *YES.get_or_init(|| {
        vnni_available() && std::env::var("DS4_GEMM_TILED").map_or(true, |v| v != "0")
    })
}

/// Weight rows per tile.
const RW: usize = 8;
/// Activation rows per sweep over the weight rows.
const CHUNK_ROWS: usize = 64;

/// The tile shape for `n` activation rows: `G` weight rows per vector,
/// `16 / G` activation rows (lane `j * G + g`). `G = 2` (eight activation
/// rows) unless that leaves more than two lanes of its last tile idle; then
/// `G = 8` (two activation rows), whose tiles waste at most one row.
fn weight_rows_per_lane_group(n: usize) -> usize {
    if n.next_multiple_of(8) - n > 2 {
        8
    } else {
        2
    }
}

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
/// its calls: per tile `t` of `16 / g` rows and block `b`, the entry
/// `[t * nb + b]`. Rows past `n` of the last tile are zeros.
pub(super) struct ActPanel {
    q41: bool,
    n: usize,
    nb: usize,
    /// Weight rows per lane group (2 or 8; see
    /// [`weight_rows_per_lane_group`]).
    g: usize,
    entries: Vec<PanelEntry>,
}

/// One block of one tile of activation rows.
#[derive(Clone, Copy)]
struct PanelEntry {
    /// Segment `s` of the tile's rows: row `j`'s dword `s` of the block's
    /// quants in lanes `j * g .. (j + 1) * g`.
    seg: [__m512i; 8],
    /// `d_a` of row `j` in the same lanes.
    da: __m512,
    /// Q4_1: the Q8_1 block sums `s_a`, laid out as `da`; Q8_0: the bits
    /// of `-128 * sum(y)` of the block's quants (i32), as `da`.
    extra: __m512,
}

/// Entries packed per parallel task (about 10 µs of work; below two
/// tasks' worth the packing stays on the calling thread).
const PACK_PER_TASK: usize = 64;

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
        let n = act.len() / (nb * a_bytes);
        let g = weight_rows_per_lane_group(n);
        let total = n.div_ceil(16 / g) * nb;
        // SAFETY (both): `vnni` confirmed the features; `act` is whole
        // rows of `nb` blocks, and `e < total` is a block of a tile.
        let entry = |e: usize| unsafe { pack_entry(q41, nb, g, act, e) };
        let entries = if total >= 2 * PACK_PER_TASK {
            use rayon::prelude::*;
            let mut v = Vec::with_capacity(total);
            (0..total)
                .into_par_iter()
                .with_min_len(PACK_PER_TASK)
                .map(entry)
                .collect_into_vec(&mut v);
            v
        } else {
            (0..total).map(entry).collect()
        };
        Some(ActPanel {
            q41,
            n,
            nb,
            g,
            entries,
        })
    }
}

/// Entry `e` (tile `e / nb`, block `e % nb`) of the panel of `act`.
///
/// # Safety
/// [`vnni`] is true; `act` is whole rows of `nb` blocks; `e` is a block
/// of one of the tiles of `16 / g` of its rows.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
unsafe fn pack_entry(q41: bool, nb: usize, g: usize, act: &[u8], e: usize) -> PanelEntry {
    let (_, a_bytes, _, a_qs) = geometry(q41);
    let row = nb * a_bytes;
    let n = act.len() / row;
    let ra = 16 / g;
    let (t, b) = (e / nb, e % nb);
    let mut q = [_mm256_setzero_si256(); 8];
    let (mut da, mut extra) = ([0f32; 16], [0f32; 16]);
    for j in 0..ra.min(n - t * ra) {
        let blk = &act[(t * ra + j) * row + b * a_bytes..][..a_bytes];
        let qs = &blk[a_qs..a_qs + 32];
        // SAFETY: `qs` holds 32 bytes.
        q[j] = unsafe { load256(qs.as_ptr()) };
        let lanes = j * g..(j + 1) * g;
        da[lanes.clone()].fill(f16_at(blk, 0));
        extra[lanes].fill(if q41 {
            f16_at(blk, 2)
        } else {
            let sum: i32 = qs.iter().map(|&y| i32::from(y as i8)).sum();
            f32::from_bits((-128 * sum) as u32)
        });
    }
    // Segment s: row j's dword s in lanes j * g .. (j + 1) * g.
    let seg: [__m512i; 8] = if g == 2 {
        // Lane j takes dword j / 2.
        let dup2 = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
        transpose8(q).map(|v| _mm512_permutexvar_epi32(dup2, _mm512_castsi256_si512(v)))
    } else {
        // Lanes 0..8 take row 0's dword s, lanes 8..16 row 1's.
        let rows = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(q[0]), q[1]);
        std::array::from_fn(|s| {
            let s = s as i32;
            let idx =
                _mm512_mask_blend_epi32(0xff00, _mm512_set1_epi32(s), _mm512_set1_epi32(8 + s));
            _mm512_permutexvar_epi32(idx, rows)
        })
    };
    // SAFETY: each array holds 16 lanes.
    unsafe {
        PanelEntry {
            seg,
            da: _mm512_loadu_ps(da.as_ptr()),
            extra: _mm512_loadu_ps(extra.as_ptr()),
        }
    }
}

/// `out[r][i] = vec_dot(ty, k, w row i, act row r)` for every weight
/// row `i` in `w` and activation row `r` of `panel` (made from the
/// activations with the same `ty` and `k`). Returns `false` (and writes
/// nothing) where the panel is of another type or shape, or a length is
/// wrong.
pub(super) fn gemm(
    ty: GgmlType,
    k: usize,
    w: &[u8],
    panel: &ActPanel,
    out: &mut [&mut [f32]],
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
    if w.len() != m * wrow || out.len() < n || out[..n].iter().any(|r| r.len() < m) {
        return false;
    }
    let out = &mut out[..n];
    // SAFETY: a panel exists only where `vnni` confirmed the features;
    // lengths checked above.
    unsafe {
        match (q41, panel.g) {
            (true, 2) => tiles::<true, 2>(w, m, panel, out),
            (true, _) => tiles::<true, 8>(w, m, panel, out),
            (false, 2) => tiles::<false, 2>(w, m, panel, out),
            (false, _) => tiles::<false, 8>(w, m, panel, out),
        }
    }
    true
}

/// A tile of eight weight rows prepared for the kernel: per block `b` and
/// lane group `c` of `G` rows (`RW / G` groups), entry `b * RW / G + c`.
/// Rows past `m` are zeros.
struct WeightTile {
    /// The group's quants as unsigned bytes (Q4_1 nibbles, Q8_0 `x + 128`):
    /// eight entries of `G` dwords (the rows' dword `s` each), `8 * G`
    /// dwords an entry, in the segment order [`segment`] gives.
    q: Vec<u32>,
    /// The group's `d_w`, then its `m_w` (Q8_0: unused), `2 * G` floats an
    /// entry.
    dm: Vec<f32>,
}

/// The segment that the `k`-th `G`-dword run of a [`WeightTile`] entry
/// holds: pairs of rows are interleaved by `unpacklo/hi_epi32` (segments
/// 0, 1, 4, 5, 2, 3, 6, 7); eight rows are transposed in order.
const fn segment<const G: usize>(k: usize) -> usize {
    if G == 2 {
        [0, 1, 4, 5, 2, 3, 6, 7][k]
    } else {
        k
    }
}

/// # Safety
/// [`vnni`] is true; `w` holds `m` whole rows of `panel.nb` blocks;
/// `out` holds `panel.n` rows of at least `m` values; `panel.g == G`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
unsafe fn tiles<const Q41: bool, const G: usize>(
    w: &[u8],
    m: usize,
    panel: &ActPanel,
    out: &mut [&mut [f32]],
) {
    let nb = panel.nb;
    let ra = 16 / G;
    let tiles = panel.n.div_ceil(ra);
    let mut wt = WeightTile {
        q: vec![0; nb * RW * 8],
        dm: vec![0.0; nb * RW * 2],
    };
    for chunk in (0..tiles).step_by(CHUNK_ROWS / ra) {
        for i0 in (0..m).step_by(RW) {
            prefetch_rows::<Q41>(w, nb, (i0 + 2 * RW).min(m), (i0 + 3 * RW).min(m));
            prepare::<Q41, G>(w, nb, i0, m, &mut wt);
            for t in chunk..(chunk + CHUNK_ROWS / ra).min(tiles) {
                // SAFETY: tile t < tiles; rows i0.. < m; the caller's
                // invariants otherwise.
                unsafe { tile::<Q41, G>(panel, &wt, t, i0, m, out) };
            }
        }
    }
}

/// Prefetches weight rows `from..to` (`to <= m`) into L2, two tiles
/// ahead of the one computing: weight rows stream from memory.
#[inline]
fn prefetch_rows<const Q41: bool>(w: &[u8], nb: usize, from: usize, to: usize) {
    let (w_bytes, _, _, _) = const { geometry(Q41) };
    let wrow = nb * w_bytes;
    prefetch_l2(&w[from * wrow..to.max(from) * wrow]);
}

/// Weight rows `i0..i0 + RW` (those below `m`) into `wt`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
fn prepare<const Q41: bool, const G: usize>(
    w: &[u8],
    nb: usize,
    i0: usize,
    m: usize,
    wt: &mut WeightTile,
) {
    let (w_bytes, _, w_qs, _) = const { geometry(Q41) };
    let wrow = nb * w_bytes;
    // Rows past `m` read as a zero block.
    let zero = [0u8; Q8_0_BYTES];
    const _: () = assert!(Q8_0_BYTES >= Q4_1_BYTES);
    let rows: [*const u8; RW] = std::array::from_fn(|r| {
        let i = i0 + r;
        if i < m {
            w[i * wrow..(i + 1) * wrow].as_ptr()
        } else {
            zero.as_ptr()
        }
    });
    let step = |r: usize| if i0 + r < m { w_bytes } else { 0 };
    let steps: [usize; RW] = std::array::from_fn(step);
    // The leading dwords `[d_w, m_w]` of the eight rows' blocks, as f32
    // `[d0, m0, d1, m1, ..]`, reordered to the entries' layout: per group,
    // its `d_w` then its `m_w`.
    let order = if G == 2 {
        _mm512_setr_epi32(0, 2, 1, 3, 4, 6, 5, 7, 8, 10, 9, 11, 12, 14, 13, 15)
    } else {
        _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15)
    };
    for b in 0..nb {
        let mut q = [_mm256_setzero_si256(); RW];
        let mut head = [0i32; RW];
        for r in 0..RW {
            // SAFETY: block b of a whole row (or the zero block): f16 d_w
            // (and m_w) at 0, quants at w_qs.
            unsafe {
                let x = rows[r].add(b * steps[r]);
                q[r] = if Q41 {
                    nibbles32(x.add(w_qs))
                } else {
                    _mm256_xor_si256(load256(x.add(w_qs)), _mm256_set1_epi8(-128))
                };
                head[r] = x.cast::<i32>().read_unaligned();
            }
        }
        // SAFETY: `head` holds 8 dwords; the block's entries hold
        // `RW * 2` floats from `b * RW * 2`; F16C is equal to the
        // conversion table for every f16.
        unsafe {
            let dm = _mm512_cvtph_ps(_mm256_loadu_si256(head.as_ptr().cast()));
            let dst = wt.dm.as_mut_ptr().add(b * RW * 2);
            _mm512_storeu_ps(dst, _mm512_permutexvar_ps(order, dm));
        }
        // SAFETY: entry e holds 8 * G dwords (`RW * 8` per block in all).
        unsafe {
            let dst = wt.q.as_mut_ptr().add(b * RW * 8).cast::<__m256i>();
            if G == 2 {
                for c in 0..RW / 2 {
                    let (q0, q1) = (q[2 * c], q[2 * c + 1]);
                    _mm256_storeu_si256(dst.add(2 * c), _mm256_unpacklo_epi32(q0, q1));
                    _mm256_storeu_si256(dst.add(2 * c + 1), _mm256_unpackhi_epi32(q0, q1));
                }
            } else {
                for (s, v) in transpose8(q).into_iter().enumerate() {
                    _mm256_storeu_si256(dst.add(s), v);
                }
            }
        }
    }
}

/// The 8 × 8 dwords of `q` transposed: `out[s]` holds dword `s` of
/// `q[0..8]` in order.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
fn transpose8(q: [__m256i; 8]) -> [__m256i; 8] {
    let t: [__m256i; 8] = std::array::from_fn(|i| {
        let (a, b) = (q[i / 2 * 2], q[i / 2 * 2 + 1]);
        if i % 2 == 0 {
            _mm256_unpacklo_epi32(a, b)
        } else {
            _mm256_unpackhi_epi32(a, b)
        }
    });
    // u[4h + k]: rows 4h..4h + 4 of dwords (k, k + 4) for k = 0..4.
    let u: [__m256i; 8] = std::array::from_fn(|i| {
        let (h, k) = (i / 4, i % 4);
        let (a, b) = (t[4 * h + k / 2], t[4 * h + 2 + k / 2]);
        if k % 2 == 0 {
            _mm256_unpacklo_epi64(a, b)
        } else {
            _mm256_unpackhi_epi64(a, b)
        }
    });
    std::array::from_fn(|s| {
        let k = s % 4;
        if s < 4 {
            _mm256_permute2x128_si256::<0x20>(u[k], u[4 + k])
        } else {
            _mm256_permute2x128_si256::<0x31>(u[k], u[4 + k])
        }
    })
}

/// The prepared weight rows `i0..` against activation tile `t`.
///
/// # Safety
/// As [`tiles`], with `t < n.div_ceil(16 / G)`, `wt` prepared for `i0`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
unsafe fn tile<const Q41: bool, const G: usize>(
    panel: &ActPanel,
    wt: &WeightTile,
    t: usize,
    i0: usize,
    m: usize,
    out: &mut [&mut [f32]],
) {
    let (nb, ra, groups) = (panel.nb, 16 / G, RW / G);
    let mut acc = [_mm512_setzero_ps(); RW / 2];
    for b in 0..nb {
        let a = t * nb + b;
        // Unchecked: a < tiles * nb, the panel's length.
        let entry = unsafe { &*panel.entries.as_ptr().add(a) };
        let (seg, da) = (&entry.seg, entry.da);
        let (sa, start) = if Q41 {
            (entry.extra, _mm512_setzero_si512())
        } else {
            (_mm512_setzero_ps(), _mm512_castps_si512(entry.extra))
        };
        for (c, acc) in acc.iter_mut().take(groups).enumerate() {
            let e = b * groups + c;
            // Unchecked: entry e < nb * groups, within the tile's tables.
            let (q, dm) = unsafe { (wt.q.as_ptr().add(e * 8 * G), wt.dm.as_ptr().add(e * 2 * G)) };
            // Two i32 chains, summed at the end (exact).
            let mut sums = [start, _mm512_setzero_si512()];
            for k in 0..8 {
                // SAFETY: run k of the entry: G dwords.
                let x = unsafe { broadcast_i::<G>(q.add(k * G)) };
                sums[k % 2] = _mm512_dpbusd_epi32(sums[k % 2], x, seg[segment::<G>(k)]);
            }
            let sumi = _mm512_cvtepi32_ps(_mm512_add_epi32(sums[0], sums[1]));
            // Lane j * G + h: the pair (weight row c * G + h, activation
            // row j), as the scalar kernel computes it.
            // SAFETY: the entry's 2 * G floats.
            let d = _mm512_mul_ps(unsafe { broadcast_f::<G>(dm) }, da);
            *acc = if Q41 {
                // SAFETY: as above.
                let mins = _mm512_mul_ps(unsafe { broadcast_f::<G>(dm.add(G)) }, sa);
                _mm512_add_ps(*acc, _mm512_add_ps(_mm512_mul_ps(d, sumi), mins))
            } else {
                _mm512_add_ps(*acc, _mm512_mul_ps(sumi, d))
            };
        }
    }
    let rows = ra.min(panel.n - t * ra);
    for (c, acc) in acc.iter().take(groups).enumerate() {
        let mut lanes = [0f32; 16];
        // SAFETY: `lanes` holds 16 floats.
        unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), *acc) };
        for h in 0..G {
            let i = i0 + c * G + h;
            if i >= m {
                continue;
            }
            for j in 0..rows {
                // SAFETY: row t * ra + j < n rows of `out`, each of at
                // least m > i values.
                unsafe {
                    *out.get_unchecked_mut(t * ra + j).get_unchecked_mut(i) = lanes[j * G + h]
                };
            }
        }
    }
}

/// The `G` dwords at `p` repeated over the 16 lanes.
///
/// # Safety
/// `G` is 2 or 8; `4 * G` readable bytes at `p`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
unsafe fn broadcast_i<const G: usize>(p: *const u32) -> __m512i {
    // SAFETY: the caller's bounds.
    unsafe {
        if G == 2 {
            _mm512_set1_epi64(p.cast::<i64>().read_unaligned())
        } else {
            _mm512_broadcast_i64x4(_mm256_loadu_si256(p.cast()))
        }
    }
}

/// The `G` floats at `p` repeated over the 16 lanes.
///
/// # Safety
/// As [`broadcast_i`].
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
unsafe fn broadcast_f<const G: usize>(p: *const f32) -> __m512 {
    // SAFETY: the caller's bounds.
    unsafe { _mm512_castsi512_ps(broadcast_i::<G>(p.cast())) }
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
    if !avx2_available() || !src.len().is_multiple_of(32) || dst.len() != src.len() / 32 * bytes {
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
