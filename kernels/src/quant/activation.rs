//! 8-bit formats: Q8_0 (a weight format too), and the activation formats
//! Q8_1 and Q8_K that the dot products take on their right-hand side.
//!
//! ```text
//! Q8_0 (34 bytes):  d: f16 |          qs: [i8; 32]                      x = d * q
//! Q8_1 (36 bytes):  d: f16 | s: f16 | qs: [i8; 32]  s = d * sum(qs)     x = d * q
//! Q8_K (292 bytes): d: f32 | qs: [i8; 256] | bsums: [i16; 16] (sums of 16 quants)
//! ```
//!
//! Quantization is ggml's reference (`quantize_row_q8_{0,1}_ref`,
//! `quantize_row_q8_K_ref`): Q8_0/Q8_1 scale by `1 / (amax / 127)` and round
//! half away from zero; Q8_K scales by `-127 / max` and rounds half to even.
//! (ggml's AVX2 activation quantizer multiplies by `127 / amax` and rounds
//! half to even instead, which can differ in the last bit of a quant.)
//! Produced quants always lie in [-127, 127]; the SIMD kernels rely on it
//! only where noted.
//!
//! Unlike ggml, an all-zero Q8_K block also gets zero `bsums` (ggml leaves
//! them stale), so a zero block is fully zero.

use super::types::{f16_at, put_f16, QK, QK_K};

pub(crate) const Q8_0_BYTES: usize = 34;
pub(crate) const Q8_1_BYTES: usize = 36;
pub(crate) const Q8_K_BYTES: usize = 292;
/// Byte offset of `bsums` in a Q8_K block.
pub(crate) const Q8_K_BSUMS: usize = 4 + QK_K;

#[inline(always)]
fn absmax(x: &[f32]) -> f32 {
    x.iter().fold(0f32, |m, v| m.max(v.abs()))
}

pub(crate) fn quantize_q8_0(src: &[f32], dst: &mut [u8]) {
    for (x, y) in src.chunks_exact(QK).zip(dst.chunks_exact_mut(Q8_0_BYTES)) {
        let d = absmax(x) / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        put_f16(y, 0, d);
        for (q, &v) in y[2..].iter_mut().zip(x) {
            *q = (v * id).round() as i8 as u8;
        }
    }
}

pub(crate) fn quantize_q8_1(src: &[f32], dst: &mut [u8]) {
    for (x, y) in src.chunks_exact(QK).zip(dst.chunks_exact_mut(Q8_1_BYTES)) {
        let d = absmax(x) / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut sum = 0i32;
        for (q, &v) in y[4..].iter_mut().zip(x) {
            let qi = (v * id).round() as i8;
            sum += qi as i32;
            *q = qi as u8;
        }
        put_f16(y, 0, d);
        put_f16(y, 2, sum as f32 * d);
    }
}

pub(crate) fn quantize_q8_k(src: &[f32], dst: &mut [u8]) {
    for (x, y) in src.chunks_exact(QK_K).zip(dst.chunks_exact_mut(Q8_K_BYTES)) {
        let mut amax = 0f32;
        let mut max = 0f32;
        for &v in x {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        if amax == 0.0 {
            y.fill(0);
            continue;
        }
        let iscale = -127.0 / max;
        for (q, &v) in y[4..4 + QK_K].iter_mut().zip(x) {
            // ggml's nearest_int: round half to even.
            *q = ((iscale * v).round_ties_even() as i32).min(127) as i8 as u8;
        }
        for j in 0..QK_K / 16 {
            let s: i32 = y[4 + 16 * j..4 + 16 * (j + 1)]
                .iter()
                .map(|&q| (q as i8) as i32)
                .sum();
            let o = Q8_K_BSUMS + 2 * j;
            y[o..o + 2].copy_from_slice(&(s as i16).to_le_bytes());
        }
        y[0..4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
    }
}

fn dequantize_q8(src: &[u8], dst: &mut [f32], bytes: usize, qs: usize) {
    for (b, y) in src.chunks_exact(bytes).zip(dst.chunks_exact_mut(QK)) {
        let d = f16_at(b, 0);
        for (y, &q) in y.iter_mut().zip(&b[qs..]) {
            *y = (q as i8) as f32 * d;
        }
    }
}

pub(crate) fn dequantize_q8_0(src: &[u8], dst: &mut [f32]) {
    dequantize_q8(src, dst, Q8_0_BYTES, 2);
}

pub(crate) fn dequantize_q8_1(src: &[u8], dst: &mut [f32]) {
    dequantize_q8(src, dst, Q8_1_BYTES, 4);
}

/// The f32 scale of a Q8_K block.
#[inline(always)]
pub(crate) fn q8k_d(b: &[u8]) -> f32 {
    f32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

/// The sixteen 16-element sums of a Q8_K block.
#[inline(always)]
pub(crate) fn q8k_bsums(b: &[u8]) -> [i32; 16] {
    let mut s = [0i32; 16];
    for (s, c) in s.iter_mut().zip(b[Q8_K_BSUMS..].chunks_exact(2)) {
        *s = i16::from_le_bytes([c[0], c[1]]) as i32;
    }
    s
}

/// The 256 quants of a Q8_K block.
#[inline(always)]
pub(crate) fn q8k_qs(b: &[u8]) -> [i8; QK_K] {
    let mut q = [0i8; QK_K];
    for (q, &b) in q.iter_mut().zip(&b[4..4 + QK_K]) {
        *q = b as i8;
    }
    q
}

pub(crate) fn dequantize_q8_k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(Q8_K_BYTES).zip(dst.chunks_exact_mut(QK_K)) {
        let d = q8k_d(b);
        for (y, &q) in y.iter_mut().zip(&b[4..4 + QK_K]) {
            *y = d * (q as i8) as f32;
        }
    }
}

#[inline(always)]
pub(crate) fn i8_dot(a: &[u8], b: &[u8]) -> i32 {
    a.iter()
        .zip(b)
        .map(|(&x, &y)| (x as i8) as i32 * (y as i8) as i32)
        .sum()
}

/// Q8_0 weights × Q8_0 activations (scalar).
pub(crate) fn dot_q8_0_q8_0(w: &[u8], a: &[u8]) -> f32 {
    let mut sumf = 0f32;
    for (x, y) in w.chunks_exact(Q8_0_BYTES).zip(a.chunks_exact(Q8_0_BYTES)) {
        let sumi = i8_dot(&x[2..], &y[2..]);
        sumf += sumi as f32 * (f16_at(x, 0) * f16_at(y, 0));
    }
    sumf
}

/// Q8_1 × Q8_1 (scalar). Not a ggml kernel; provided so that every type
/// has a dot product.
pub(crate) fn dot_q8_1_q8_1(w: &[u8], a: &[u8]) -> f32 {
    let mut sumf = 0f32;
    for (x, y) in w.chunks_exact(Q8_1_BYTES).zip(a.chunks_exact(Q8_1_BYTES)) {
        let sumi = i8_dot(&x[4..], &y[4..]);
        sumf += sumi as f32 * (f16_at(x, 0) * f16_at(y, 0));
    }
    sumf
}

/// Q8_K × Q8_K (scalar). Not a ggml kernel; provided so that every type
/// has a dot product.
pub(crate) fn dot_q8_k_q8_k(w: &[u8], a: &[u8]) -> f32 {
    let mut sumf = 0f32;
    for (x, y) in w.chunks_exact(Q8_K_BYTES).zip(a.chunks_exact(Q8_K_BYTES)) {
        let sumi = i8_dot(&x[4..4 + QK_K], &y[4..4 + QK_K]);
        sumf += sumi as f32 * (q8k_d(x) * q8k_d(y));
    }
    sumf
}
