//! K-quants: Q2_K, Q3_K, Q4_K, Q5_K and Q6_K, 256-element super-blocks
//! with quantized per-sub-block scales (ggml's "k-quants", ggml PR #1684).
//!
//! ```text
//! Q2_K (84 bytes):  scales: [u8; 16] (lo nibble scale, hi nibble min) | qs: [u8; 64] (2-bit)
//!                   | d: f16 | dmin: f16                     x = d*sc*q - dmin*m   (16 × 16)
//! Q3_K (110 bytes): hmask: [u8; 32] | qs: [u8; 64] | scales: [u8; 12] (6-bit, biased 32)
//!                   | d: f16                                  x = d*(sc-32)*q, q in [-4, 3]
//! Q4_K (144 bytes): d: f16 | dmin: f16 | scales: [u8; 12] (6-bit scale + min) | qs: [u8; 128]
//!                                                             x = d*sc*q - dmin*m   (8 × 32)
//! Q5_K (176 bytes): d | dmin | scales: [u8; 12] | qh: [u8; 32] | qs: [u8; 128]
//! Q6_K (210 bytes): ql: [u8; 128] | qh: [u8; 64] | scales: [i8; 16] | d: f16
//!                                                             x = d*sc*(q-32)       (16 × 16)
//! ```
//!
//! Each format is first unpacked into plain integer quants and scales
//! (the `unpack_*` functions, written so LLVM vectorizes them), then
//! dequantized with exactly ggml's float operations (`dequantize_row_q*_K`)
//! or dotted with a Q8_K activation using ggml's integer formulation
//! (`ggml_vec_dot_q*_K_q8_K`): integer sums per sub-block, one float
//! multiply per super-block, and mins folded in through Q8_K's `bsums`.

use super::activation::{q8k_bsums, q8k_d, q8k_qs, Q8_K_BYTES};
use super::types::{f16_at, QK_K};

pub(crate) const Q2_K_BYTES: usize = 84;
pub(crate) const Q3_K_BYTES: usize = 110;
pub(crate) const Q4_K_BYTES: usize = 144;
pub(crate) const Q5_K_BYTES: usize = 176;
pub(crate) const Q6_K_BYTES: usize = 210;

/// Quants of a 256-element super-block, as signed bytes.
type Quants = [i8; QK_K];

/// 2-bit fields of `qs` (64 bytes) in ggml's order: 32-byte halves, each
/// byte contributing one element to four 32-element runs (shift 0, 2, 4, 6).
#[inline(always)]
fn unpack_2bit(qs: &[u8], q: &mut Quants) {
    for (qs, q) in qs.chunks_exact(32).zip(q.chunks_exact_mut(128)) {
        for (j, q) in q.chunks_exact_mut(32).enumerate() {
            for (q, &b) in q.iter_mut().zip(qs) {
                *q = ((b >> (2 * j)) & 3) as i8;
            }
        }
    }
}

/// Element `e`'s high bit is bit `e / 32` of `h[e % 32]` (Q3_K hmask,
/// Q5_K qh). Adds `set` where the bit is 1 and `clear` where it is 0.
#[inline(always)]
fn apply_high_bits(h: &[u8], q: &mut Quants, set: i8, clear: i8) {
    for (bit, q) in q.chunks_exact_mut(32).enumerate() {
        for (q, &h) in q.iter_mut().zip(h) {
            *q += if h & (1 << bit) != 0 { set } else { clear };
        }
    }
}

/// Low and high nibbles of `qs` (128 bytes): each 32-byte run yields 32
/// elements from the low nibbles followed by 32 from the high nibbles.
#[inline(always)]
fn unpack_nibbles(qs: &[u8], q: &mut Quants) {
    for (qs, q) in qs.chunks_exact(32).zip(q.chunks_exact_mut(64)) {
        let (lo, hi) = q.split_at_mut(32);
        for ((lo, hi), &b) in lo.iter_mut().zip(hi).zip(qs) {
            *lo = (b & 0x0f) as i8;
            *hi = (b >> 4) as i8;
        }
    }
}

/// Q3_K's sixteen 6-bit scales, unbiased to [-32, 31]. Byte `i < 8` holds
/// the low nibbles of scales `i` and `i + 8`; bytes 8..12 hold the top two
/// bits, scale `i` at byte `8 + i % 4`, shift `2 * (i / 4)`.
#[inline(always)]
pub(crate) fn q3k_scales(s: &[u8]) -> [i32; 16] {
    let mut out = [0i32; 16];
    for (i, o) in out.iter_mut().enumerate() {
        let lo = if i < 8 { s[i] & 0x0f } else { s[i - 8] >> 4 };
        let hi = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
        *o = (lo | (hi << 4)) as i32 - 32;
    }
    out
}

/// Q4_K/Q5_K's eight 6-bit scales and eight 6-bit mins (ggml's
/// `get_scale_min_k4`).
#[inline(always)]
pub(crate) fn k4_scales_mins(s: &[u8]) -> ([u8; 8], [u8; 8]) {
    let mut sc = [0u8; 8];
    let mut mn = [0u8; 8];
    for j in 0..8 {
        if j < 4 {
            sc[j] = s[j] & 63;
            mn[j] = s[j + 4] & 63;
        } else {
            sc[j] = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
            mn[j] = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
        }
    }
    (sc, mn)
}

fn unpack_q2_k(b: &[u8]) -> Quants {
    let mut q = [0i8; QK_K];
    unpack_2bit(&b[16..80], &mut q);
    q
}

fn unpack_q3_k(b: &[u8]) -> Quants {
    let mut q = [0i8; QK_K];
    unpack_2bit(&b[32..96], &mut q);
    apply_high_bits(&b[0..32], &mut q, 0, -4);
    q
}

fn unpack_q4_k(b: &[u8]) -> Quants {
    let mut q = [0i8; QK_K];
    unpack_nibbles(&b[16..144], &mut q);
    q
}

fn unpack_q5_k(b: &[u8]) -> Quants {
    let mut q = [0i8; QK_K];
    unpack_nibbles(&b[48..176], &mut q);
    apply_high_bits(&b[16..48], &mut q, 16, 0);
    q
}

/// Q6_K quants minus 32. Per 128-element half (64 `ql` bytes, 32 `qh`
/// bytes): run `r` (0..4) of 32 elements takes the low (r = 0, 1) or high
/// (r = 2, 3) nibble of `ql[32 * (r % 2) + l]` and bits `2r..2r+2` of `qh[l]`.
fn unpack_q6_k(b: &[u8]) -> Quants {
    let mut q = [0i8; QK_K];
    let (ql, qh) = (&b[0..128], &b[128..192]);
    for ((ql, qh), q) in ql
        .chunks_exact(64)
        .zip(qh.chunks_exact(32))
        .zip(q.chunks_exact_mut(128))
    {
        for (r, q) in q.chunks_exact_mut(32).enumerate() {
            let lo = &ql[32 * (r % 2)..32 * (r % 2) + 32];
            let shift = if r < 2 { 0 } else { 4 };
            for ((q, &l), &h) in q.iter_mut().zip(lo).zip(qh) {
                let v = ((l >> shift) & 0x0f) | (((h >> (2 * r)) & 3) << 4);
                *q = v as i8 - 32;
            }
        }
    }
    q
}

pub(crate) fn dequantize_q2_k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(Q2_K_BYTES).zip(dst.chunks_exact_mut(QK_K)) {
        let (d, dmin) = (f16_at(b, 80), f16_at(b, 82));
        let q = unpack_q2_k(b);
        for ((y, q), &sc) in y.chunks_exact_mut(16).zip(q.chunks_exact(16)).zip(&b[..16]) {
            let dl = d * (sc & 0x0f) as f32;
            let ml = dmin * (sc >> 4) as f32;
            for (y, &q) in y.iter_mut().zip(q) {
                *y = dl * q as f32 - ml;
            }
        }
    }
}

pub(crate) fn dequantize_q3_k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(Q3_K_BYTES).zip(dst.chunks_exact_mut(QK_K)) {
        let d = f16_at(b, 108);
        let scales = q3k_scales(&b[96..108]);
        let q = unpack_q3_k(b);
        for ((y, q), &sc) in y.chunks_exact_mut(16).zip(q.chunks_exact(16)).zip(&scales) {
            let dl = d * sc as f32;
            for (y, &q) in y.iter_mut().zip(q) {
                *y = dl * q as f32;
            }
        }
    }
}

/// Q4_K and Q5_K share the scale layout and the `d*sc*q - dmin*m` form.
fn dequantize_k4(b: &[u8], q: &Quants, y: &mut [f32]) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let (sc, mn) = k4_scales_mins(&b[4..16]);
    for (((y, q), &sc), &m) in y
        .chunks_exact_mut(32)
        .zip(q.chunks_exact(32))
        .zip(&sc)
        .zip(&mn)
    {
        let d1 = d * sc as f32;
        let m1 = dmin * m as f32;
        for (y, &q) in y.iter_mut().zip(q) {
            *y = d1 * q as f32 - m1;
        }
    }
}

pub(crate) fn dequantize_q4_k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(Q4_K_BYTES).zip(dst.chunks_exact_mut(QK_K)) {
        dequantize_k4(b, &unpack_q4_k(b), y);
    }
}

pub(crate) fn dequantize_q5_k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(Q5_K_BYTES).zip(dst.chunks_exact_mut(QK_K)) {
        dequantize_k4(b, &unpack_q5_k(b), y);
    }
}

pub(crate) fn dequantize_q6_k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(Q6_K_BYTES).zip(dst.chunks_exact_mut(QK_K)) {
        let d = f16_at(b, 208);
        let q = unpack_q6_k(b);
        for ((y, q), &sc) in y
            .chunks_exact_mut(16)
            .zip(q.chunks_exact(16))
            .zip(&b[192..208])
        {
            let dl = d * (sc as i8) as f32;
            for (y, &q) in y.iter_mut().zip(q) {
                *y = dl * q as f32;
            }
        }
    }
}

/// Integer dots of `S`-element sub-blocks of weight and activation quants.
#[inline(always)]
fn sub_dots<const S: usize, const N: usize>(q: &Quants, a: &Quants) -> [i32; N] {
    let mut out = [0i32; N];
    for ((o, q), a) in out.iter_mut().zip(q.chunks_exact(S)).zip(a.chunks_exact(S)) {
        *o = q.iter().zip(a).map(|(&x, &y)| x as i32 * y as i32).sum();
    }
    out
}

/// Q2_K weights × Q8_K activations (scalar).
pub(crate) fn dot_q2_k_q8_k(w: &[u8], a: &[u8]) -> f32 {
    let mut sumf = 0f32;
    for (x, y) in w.chunks_exact(Q2_K_BYTES).zip(a.chunks_exact(Q8_K_BYTES)) {
        let sc = &x[..16];
        let bsums = q8k_bsums(y);
        let summs: i32 = bsums
            .iter()
            .zip(sc)
            .map(|(&s, &c)| s * (c >> 4) as i32)
            .sum();
        let dots = sub_dots::<16, 16>(&unpack_q2_k(x), &q8k_qs(y));
        let isum: i32 = dots
            .iter()
            .zip(sc)
            .map(|(&p, &c)| p * (c & 0x0f) as i32)
            .sum();
        let dy = q8k_d(y);
        sumf += dy * f16_at(x, 80) * isum as f32 - dy * f16_at(x, 82) * summs as f32;
    }
    sumf
}

/// Q3_K weights × Q8_K activations (scalar).
pub(crate) fn dot_q3_k_q8_k(w: &[u8], a: &[u8]) -> f32 {
    let mut sumf = 0f32;
    for (x, y) in w.chunks_exact(Q3_K_BYTES).zip(a.chunks_exact(Q8_K_BYTES)) {
        let scales = q3k_scales(&x[96..108]);
        let dots = sub_dots::<16, 16>(&unpack_q3_k(x), &q8k_qs(y));
        let isum: i32 = dots.iter().zip(&scales).map(|(&p, &s)| p * s).sum();
        sumf += f16_at(x, 108) * q8k_d(y) * isum as f32;
    }
    sumf
}

/// Shared tail of the Q4_K/Q5_K dots.
#[inline(always)]
fn dot_k4_block(x: &[u8], q: &Quants, y: &[u8]) -> f32 {
    let (sc, mn) = k4_scales_mins(&x[4..16]);
    let bsums = q8k_bsums(y);
    let summs: i32 = bsums
        .iter()
        .enumerate()
        .map(|(j, &s)| s * mn[j / 2] as i32)
        .sum();
    let dots = sub_dots::<32, 8>(q, &q8k_qs(y));
    let isum: i32 = dots.iter().zip(&sc).map(|(&p, &s)| p * s as i32).sum();
    let dy = q8k_d(y);
    f16_at(x, 0) * dy * isum as f32 - f16_at(x, 2) * dy * summs as f32
}

/// Q4_K weights × Q8_K activations (scalar).
pub(crate) fn dot_q4_k_q8_k(w: &[u8], a: &[u8]) -> f32 {
    w.chunks_exact(Q4_K_BYTES)
        .zip(a.chunks_exact(Q8_K_BYTES))
        .map(|(x, y)| dot_k4_block(x, &unpack_q4_k(x), y))
        .sum()
}

/// Q5_K weights × Q8_K activations (scalar).
pub(crate) fn dot_q5_k_q8_k(w: &[u8], a: &[u8]) -> f32 {
    w.chunks_exact(Q5_K_BYTES)
        .zip(a.chunks_exact(Q8_K_BYTES))
        .map(|(x, y)| dot_k4_block(x, &unpack_q5_k(x), y))
        .sum()
}

/// Q6_K weights × Q8_K activations (scalar).
pub(crate) fn dot_q6_k_q8_k(w: &[u8], a: &[u8]) -> f32 {
    let mut sumf = 0f32;
    for (x, y) in w.chunks_exact(Q6_K_BYTES).zip(a.chunks_exact(Q8_K_BYTES)) {
        let dots = sub_dots::<16, 16>(&unpack_q6_k(x), &q8k_qs(y));
        let isum: i32 = dots
            .iter()
            .zip(&x[192..208])
            .map(|(&p, &s)| p * (s as i8) as i32)
            .sum();
        sumf += f16_at(x, 208) * q8k_d(y) * isum as f32;
    }
    sumf
}
