//! Unquantized element types: F32, F16 and BF16.
//!
//! Rows are little-endian byte buffers of any alignment. F16 rounding is
//! IEEE nearest-even (the `half` crate, as ggml's `GGML_FP32_TO_FP16`);
//! BF16 rounding is nearest-even with NaNs forced quiet, bit for bit as
//! ggml's `ggml_compute_fp32_to_bf16`.

use super::types::F16_TO_F32;

/// Lanes of the partial sums in the scalar dots. Sixteen independent f32
/// accumulators let LLVM keep the loop in vector registers.
const LANES: usize = 16;

pub(crate) fn dequantize_f32(src: &[u8], dst: &mut [f32]) {
    for (d, s) in dst.iter_mut().zip(src.chunks_exact(4)) {
        *d = f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
    }
}

/// I32 values converted to f32 (index tables read as numbers).
pub(crate) fn dequantize_i32(src: &[u8], dst: &mut [f32]) {
    for (d, s) in dst.iter_mut().zip(src.chunks_exact(4)) {
        *d = i32::from_le_bytes([s[0], s[1], s[2], s[3]]) as f32;
    }
}

pub(crate) fn quantize_f32(src: &[f32], dst: &mut [u8]) {
    for (d, s) in dst.chunks_exact_mut(4).zip(src) {
        d.copy_from_slice(&s.to_le_bytes());
    }
}

pub(crate) fn dequantize_f16(src: &[u8], dst: &mut [f32]) {
    for (d, s) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *d = F16_TO_F32[u16::from_le_bytes([s[0], s[1]]) as usize];
    }
}

pub(crate) fn quantize_f16(src: &[f32], dst: &mut [u8]) {
    for (d, s) in dst.chunks_exact_mut(2).zip(src) {
        d.copy_from_slice(&half::f16::from_f32(*s).to_bits().to_le_bytes());
    }
}

#[inline(always)]
fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// ggml's `ggml_compute_fp32_to_bf16`: quiet NaNs, otherwise round to
/// nearest even.
#[inline(always)]
pub(crate) fn f32_to_bf16(x: f32) -> u16 {
    let u = x.to_bits();
    if (u & 0x7fff_ffff) > 0x7f80_0000 {
        return ((u >> 16) | 64) as u16;
    }
    (u.wrapping_add(0x7fff + ((u >> 16) & 1)) >> 16) as u16
}

pub(crate) fn dequantize_bf16(src: &[u8], dst: &mut [f32]) {
    for (d, s) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *d = bf16_to_f32(u16::from_le_bytes([s[0], s[1]]));
    }
}

pub(crate) fn quantize_bf16(src: &[f32], dst: &mut [u8]) {
    for (d, s) in dst.chunks_exact_mut(2).zip(src) {
        d.copy_from_slice(&f32_to_bf16(*s).to_le_bytes());
    }
}

/// Sums `f(w_i) * f(a_i)` over elements of `width` bytes, in `LANES`
/// independent f32 partial sums.
#[inline(always)]
fn lane_dot<const W: usize>(w: &[u8], a: &[u8], f: impl Fn([u8; W]) -> f32) -> f32 {
    let mut acc = [0f32; LANES];
    let wc = w.chunks_exact(W * LANES);
    let ac = a.chunks_exact(W * LANES);
    let (wr, ar) = (wc.remainder(), ac.remainder());
    for (wb, ab) in wc.zip(ac) {
        for (l, acc) in acc.iter_mut().enumerate() {
            let x: [u8; W] = wb[l * W..(l + 1) * W].try_into().unwrap_or([0; W]);
            let y: [u8; W] = ab[l * W..(l + 1) * W].try_into().unwrap_or([0; W]);
            *acc += f(x) * f(y);
        }
    }
    let mut tail = 0f32;
    for (x, y) in wr.chunks_exact(W).zip(ar.chunks_exact(W)) {
        let x: [u8; W] = x.try_into().unwrap_or([0; W]);
        let y: [u8; W] = y.try_into().unwrap_or([0; W]);
        tail += f(x) * f(y);
    }
    acc.iter().sum::<f32>() + tail
}

pub(crate) fn dot_f32(w: &[u8], a: &[u8]) -> f32 {
    lane_dot::<4>(w, a, f32::from_le_bytes)
}

pub(crate) fn dot_i32(w: &[u8], a: &[u8]) -> f32 {
    w.chunks_exact(4)
        .zip(a.chunks_exact(4))
        .map(|(w, a)| {
            i32::from_le_bytes([w[0], w[1], w[2], w[3]]) as f32
                * f32::from_le_bytes([a[0], a[1], a[2], a[3]])
        })
        .sum()
}

pub(crate) fn dot_f16(w: &[u8], a: &[u8]) -> f32 {
    lane_dot::<2>(w, a, |b| F16_TO_F32[u16::from_le_bytes(b) as usize])
}

pub(crate) fn dot_bf16(w: &[u8], a: &[u8]) -> f32 {
    lane_dot::<2>(w, a, |b| bf16_to_f32(u16::from_le_bytes(b)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounding_matches_ggml() {
        // 1 + 2^-8 is exactly halfway between two bf16 values: ties to even.
        assert_eq!(f32_to_bf16(1.0 + 1.0 / 256.0), 0x3f80);
        assert_eq!(f32_to_bf16(1.0 + 3.0 / 256.0), 0x3f82);
        assert_eq!(f32_to_bf16(f32::INFINITY), 0x7f80);
        let nan = f32::from_bits(0x7f80_0001);
        assert_eq!(f32_to_bf16(nan), 0x7fc0);
    }
}
