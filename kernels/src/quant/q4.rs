//! Q4_0 and Q4_1: 32 elements per block, 4-bit quants.
//!
//! ```text
//! Q4_0 (18 bytes): d: f16 | qs: [u8; 16]          x = d * (q - 8)
//! Q4_1 (20 bytes): d: f16 | m: f16 | qs: [u8; 16] x = d * q + m
//! ```
//!
//! `qs[j]` holds element `j` in its low nibble and element `j + 16` in its
//! high nibble. Quantization follows ggml's `quantize_row_q4_{0,1}_ref`
//! exactly (same float operations in the same order), dequantization and
//! the dots follow `dequantize_row_q4_*` and the scalar
//! `ggml_vec_dot_q4_{0,1}_q8_{0,1}`.

use super::types::{f16_at, put_f16, QK};

pub(crate) const Q4_0_BYTES: usize = 18;
pub(crate) const Q4_1_BYTES: usize = 20;
/// Q8_0 block bytes, the activation of Q4_0.
const Q8_0_BYTES: usize = 34;
/// Q8_1 block bytes, the activation of Q4_1.
const Q8_1_BYTES: usize = 36;

/// Absolute maximum of a block, keeping its sign (first one wins on ties),
/// as ggml's reference quantizers pick it.
#[inline(always)]
pub(crate) fn signed_absmax(x: &[f32]) -> f32 {
    let mut amax = 0f32;
    let mut max = 0f32;
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    max
}

#[inline(always)]
pub(crate) fn min_max(x: &[f32]) -> (f32, f32) {
    let mut min = f32::MAX;
    let mut max = -f32::MAX;
    for &v in x {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    (min, max)
}

pub(crate) fn quantize_q4_0(src: &[f32], dst: &mut [u8]) {
    for (x, y) in src.chunks_exact(QK).zip(dst.chunks_exact_mut(Q4_0_BYTES)) {
        let d = signed_absmax(x) / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        put_f16(y, 0, d);
        for j in 0..QK / 2 {
            // `as i8` truncates toward zero like C's (int8_t) cast; the
            // values are in [0.5, 16.5] so it never saturates.
            let q0 = ((x[j] * id + 8.5) as i8).min(15) as u8;
            let q1 = ((x[j + QK / 2] * id + 8.5) as i8).min(15) as u8;
            y[2 + j] = q0 | (q1 << 4);
        }
    }
}

pub(crate) fn quantize_q4_1(src: &[f32], dst: &mut [u8]) {
    for (x, y) in src.chunks_exact(QK).zip(dst.chunks_exact_mut(Q4_1_BYTES)) {
        let (min, max) = min_max(x);
        let d = (max - min) / 15.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        put_f16(y, 0, d);
        put_f16(y, 2, min);
        for j in 0..QK / 2 {
            let q0 = (((x[j] - min) * id + 0.5) as i8).min(15) as u8;
            let q1 = (((x[j + QK / 2] - min) * id + 0.5) as i8).min(15) as u8;
            y[4 + j] = q0 | (q1 << 4);
        }
    }
}

pub(crate) fn dequantize_q4_0(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(Q4_0_BYTES).zip(dst.chunks_exact_mut(QK)) {
        let d = f16_at(b, 0);
        for j in 0..QK / 2 {
            let q = b[2 + j];
            y[j] = ((q & 0x0f) as i32 - 8) as f32 * d;
            y[j + QK / 2] = ((q >> 4) as i32 - 8) as f32 * d;
        }
    }
}

pub(crate) fn dequantize_q4_1(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(Q4_1_BYTES).zip(dst.chunks_exact_mut(QK)) {
        let d = f16_at(b, 0);
        let m = f16_at(b, 2);
        for j in 0..QK / 2 {
            let q = b[4 + j];
            y[j] = (q & 0x0f) as f32 * d + m;
            y[j + QK / 2] = (q >> 4) as f32 * d + m;
        }
    }
}

/// Integer dot of 16 packed nibble bytes (elements `j` and `j + 16`) with
/// 32 signed bytes, the nibbles offset by `-bias`.
#[inline(always)]
pub(crate) fn nibble_dot(qs: &[u8], a: &[u8], bias: i32) -> i32 {
    let (a0, a1) = a.split_at(QK / 2);
    let mut sum = 0i32;
    for ((&q, &y0), &y1) in qs[..QK / 2].iter().zip(a0).zip(&a1[..QK / 2]) {
        sum += ((q & 0x0f) as i32 - bias) * (y0 as i8) as i32;
        sum += ((q >> 4) as i32 - bias) * (y1 as i8) as i32;
    }
    sum
}

/// Q4_0 weights × Q8_0 activations (scalar).
pub(crate) fn dot_q4_0_q8_0(w: &[u8], a: &[u8]) -> f32 {
    let mut sumf = 0f32;
    for (x, y) in w.chunks_exact(Q4_0_BYTES).zip(a.chunks_exact(Q8_0_BYTES)) {
        let sumi = nibble_dot(&x[2..], &y[2..], 8);
        sumf += sumi as f32 * (f16_at(x, 0) * f16_at(y, 0));
    }
    sumf
}

/// Q4_1 weights × Q8_1 activations (scalar):
/// `sum(d_w * d_a * isum + m_w * s_a)` over blocks.
pub(crate) fn dot_q4_1_q8_1(w: &[u8], a: &[u8]) -> f32 {
    let mut sumf = 0f32;
    for (x, y) in w.chunks_exact(Q4_1_BYTES).zip(a.chunks_exact(Q8_1_BYTES)) {
        let sumi = nibble_dot(&x[4..], &y[4..], 0);
        sumf += (f16_at(x, 0) * f16_at(y, 0)) * sumi as f32 + f16_at(x, 2) * f16_at(y, 2);
    }
    sumf
}
