//! Q5_0 and Q5_1: 32 elements per block, 5-bit quants.
//!
//! ```text
//! Q5_0 (22 bytes): d: f16 |          qh: u32 | qs: [u8; 16]   x = d * (q - 16)
//! Q5_1 (24 bytes): d: f16 | m: f16 | qh: u32 | qs: [u8; 16]   x = d * q + m
//! ```
//!
//! The low four bits are packed like Q4 (`qs[j]`: element `j` low nibble,
//! element `j + 16` high nibble); bit `i` of the little-endian `qh` is the
//! fifth bit of element `i`. Follows ggml's `quantize_row_q5_{0,1}_ref`,
//! `dequantize_row_q5_*` and the scalar `ggml_vec_dot_q5_*`.

use super::q4::{min_max, signed_absmax};
use super::types::{f16_at, put_f16, QK};

pub(crate) const Q5_0_BYTES: usize = 22;
pub(crate) const Q5_1_BYTES: usize = 24;
const Q8_0_BYTES: usize = 34;
const Q8_1_BYTES: usize = 36;

/// Packs 32 five-bit quants into `qh` (returned) and `qs`.
#[inline(always)]
fn pack5(q: &[u8; QK], qs: &mut [u8]) -> u32 {
    let mut qh = 0u32;
    for j in 0..QK / 2 {
        let (q0, q1) = (q[j], q[j + QK / 2]);
        qs[j] = (q0 & 0x0f) | ((q1 & 0x0f) << 4);
        qh |= (((q0 & 0x10) >> 4) as u32) << j;
        qh |= (((q1 & 0x10) >> 4) as u32) << (j + QK / 2);
    }
    qh
}

/// Unpacks the 32 five-bit quants of a block.
#[inline(always)]
fn unpack5(qh: &[u8], qs: &[u8]) -> [u8; QK] {
    let qh = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
    let mut q = [0u8; QK];
    for j in 0..QK / 2 {
        let h0 = (((qh >> j) << 4) & 0x10) as u8;
        let h1 = ((qh >> (j + 12)) & 0x10) as u8;
        q[j] = (qs[j] & 0x0f) | h0;
        q[j + QK / 2] = (qs[j] >> 4) | h1;
    }
    q
}

pub(crate) fn quantize_q5_0(src: &[f32], dst: &mut [u8]) {
    for (x, y) in src.chunks_exact(QK).zip(dst.chunks_exact_mut(Q5_0_BYTES)) {
        let d = signed_absmax(x) / -16.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        put_f16(y, 0, d);
        let mut q = [0u8; QK];
        for (q, &v) in q.iter_mut().zip(x) {
            *q = ((v * id + 16.5) as i8).min(31) as u8;
        }
        let qh = pack5(&q, &mut y[6..]);
        y[2..6].copy_from_slice(&qh.to_le_bytes());
    }
}

pub(crate) fn quantize_q5_1(src: &[f32], dst: &mut [u8]) {
    for (x, y) in src.chunks_exact(QK).zip(dst.chunks_exact_mut(Q5_1_BYTES)) {
        let (min, max) = min_max(x);
        let d = (max - min) / 31.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        put_f16(y, 0, d);
        put_f16(y, 2, min);
        let mut q = [0u8; QK];
        for (q, &v) in q.iter_mut().zip(x) {
            // ggml does not clamp here; the value is at most 31.5 so the
            // clamp only guards against float noise.
            *q = (((v - min) * id + 0.5) as u8).min(31);
        }
        let qh = pack5(&q, &mut y[8..]);
        y[4..8].copy_from_slice(&qh.to_le_bytes());
    }
}

pub(crate) fn dequantize_q5_0(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(Q5_0_BYTES).zip(dst.chunks_exact_mut(QK)) {
        let d = f16_at(b, 0);
        let q = unpack5(&b[2..6], &b[6..]);
        for (y, &q) in y.iter_mut().zip(&q) {
            *y = (q as i32 - 16) as f32 * d;
        }
    }
}

pub(crate) fn dequantize_q5_1(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(Q5_1_BYTES).zip(dst.chunks_exact_mut(QK)) {
        let d = f16_at(b, 0);
        let m = f16_at(b, 2);
        let q = unpack5(&b[4..8], &b[8..]);
        for (y, &q) in y.iter_mut().zip(&q) {
            *y = q as f32 * d + m;
        }
    }
}

#[inline(always)]
fn q5_isum(q: &[u8; QK], a: &[u8], bias: i32) -> i32 {
    q.iter()
        .zip(&a[..QK])
        .map(|(&q, &y)| (q as i32 - bias) * (y as i8) as i32)
        .sum()
}

/// Q5_0 weights × Q8_0 activations (scalar).
pub(crate) fn dot_q5_0_q8_0(w: &[u8], a: &[u8]) -> f32 {
    let mut sumf = 0f32;
    for (x, y) in w.chunks_exact(Q5_0_BYTES).zip(a.chunks_exact(Q8_0_BYTES)) {
        let q = unpack5(&x[2..6], &x[6..]);
        let sumi = q5_isum(&q, &y[2..], 16);
        sumf += (f16_at(x, 0) * f16_at(y, 0)) * sumi as f32;
    }
    sumf
}

/// Q5_1 weights × Q8_1 activations (scalar).
pub(crate) fn dot_q5_1_q8_1(w: &[u8], a: &[u8]) -> f32 {
    let mut sumf = 0f32;
    for (x, y) in w.chunks_exact(Q5_1_BYTES).zip(a.chunks_exact(Q8_1_BYTES)) {
        let q = unpack5(&x[4..8], &x[8..]);
        let sumi = q5_isum(&q, &y[4..], 0);
        sumf += (f16_at(x, 0) * f16_at(y, 0)) * sumi as f32 + f16_at(x, 2) * f16_at(y, 2);
    }
    sumf
}
