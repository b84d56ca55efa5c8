//! Validation of stored tensor data, as llama.cpp's `--check-tensors`
//! (`ggml_validate_row_data`): every value of a float tensor, and every
//! scale of every block of a quantized one, must be finite. The quantized
//! values themselves are small integers and cannot be invalid; a NaN or
//! infinite scale turns its whole block into NaN.

use rayon::prelude::*;

use super::GgmlType;

/// The first non-finite number found in a tensor's data.
#[derive(Clone, Debug, PartialEq)]
pub struct NonFinite {
    /// The block holding it (for the float types, whose blocks are one
    /// element, the element).
    pub block: u64,
    /// Its byte offset in the tensor's data.
    pub byte: u64,
    /// `value` for a float tensor, else the field's name in ggml's block
    /// struct (`d`, `dmin`, `m`, `s`).
    pub field: &'static str,
    /// NaN, inf or -inf.
    pub value: f32,
}

#[derive(Clone, Copy)]
enum Enc {
    F16,
    Bf16,
    F32,
}

/// The floating-point fields of one block of `ty`: name, byte offset in
/// the block, encoding (`ggml-common.h` block structs).
fn fields(ty: GgmlType) -> &'static [(&'static str, usize, Enc)] {
    match ty {
        GgmlType::F32 => &[("value", 0, Enc::F32)],
        GgmlType::F16 => &[("value", 0, Enc::F16)],
        GgmlType::BF16 => &[("value", 0, Enc::Bf16)],
        GgmlType::I32 => &[],
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 | GgmlType::IQ2_XXS => {
            &[("d", 0, Enc::F16)]
        }
        GgmlType::Q4_1 | GgmlType::Q5_1 => &[("d", 0, Enc::F16), ("m", 2, Enc::F16)],
        GgmlType::Q8_1 => &[("d", 0, Enc::F16), ("s", 2, Enc::F16)],
        // scales: 16, qs: 64, then d, dmin
        GgmlType::Q2_K => &[("d", 80, Enc::F16), ("dmin", 82, Enc::F16)],
        // hmask: 32, qs: 64, scales: 12, then d
        GgmlType::Q3_K => &[("d", 108, Enc::F16)],
        GgmlType::Q4_K | GgmlType::Q5_K => &[("d", 0, Enc::F16), ("dmin", 2, Enc::F16)],
        // ql: 128, qh: 64, scales: 16, then d
        GgmlType::Q6_K => &[("d", 208, Enc::F16)],
        GgmlType::Q8_K => &[("d", 0, Enc::F32)],
    }
}

/// The value at `b[off..]` if it is not finite.
#[inline]
fn non_finite(b: &[u8], off: usize, enc: Enc) -> Option<f32> {
    match enc {
        Enc::F16 => {
            let bits = u16::from_le_bytes([b[off], b[off + 1]]);
            (bits & 0x7c00 == 0x7c00).then(|| half::f16::from_bits(bits).to_f32())
        }
        Enc::Bf16 => {
            let bits = u16::from_le_bytes([b[off], b[off + 1]]);
            (bits & 0x7f80 == 0x7f80).then(|| f32::from_bits(u32::from(bits) << 16))
        }
        Enc::F32 => {
            let v = f32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]]);
            (!v.is_finite()).then_some(v)
        }
    }
}

/// The first non-finite value or block scale in `data`, a tensor's bytes
/// of type `ty` (whole blocks; a partial block at the end is not looked
/// at). Scans in parallel; the result is the first in data order.
pub fn find_non_finite(ty: GgmlType, data: &[u8]) -> Option<NonFinite> {
    let fields = fields(ty);
    if fields.is_empty() {
        return None;
    }
    let size = ty.type_size();
    const CHUNK_BLOCKS: usize = 1 << 16;
    data.par_chunks(size * CHUNK_BLOCKS)
        .enumerate()
        .find_map_first(|(c, chunk)| {
            chunk.chunks_exact(size).enumerate().find_map(|(i, block)| {
                fields.iter().find_map(|&(field, off, enc)| {
                    non_finite(block, off, enc).map(|value| {
                        let block = (c * CHUNK_BLOCKS + i) as u64;
                        NonFinite {
                            block,
                            byte: block * size as u64 + off as u64,
                            field,
                            value,
                        }
                    })
                })
            })
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::quantize_row;

    fn quantized(ty: GgmlType, n: usize) -> Vec<u8> {
        let src: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
        let mut dst = vec![0u8; ty.row_bytes(n).unwrap()];
        quantize_row(ty, &src, &mut dst).unwrap();
        dst
    }

    #[test]
    fn finds_the_first_bad_value_or_scale() {
        for ty in [
            GgmlType::Q4_0,
            GgmlType::Q4_1,
            GgmlType::Q8_0,
            GgmlType::F16,
        ] {
            let mut data = quantized(ty, 32 * 8);
            assert_eq!(find_non_finite(ty, &data), None, "{ty}");
            // f16 NaN into block 5's first scale and block 6's.
            let size = ty.type_size();
            for b in [6, 5] {
                data[b * size..b * size + 2].copy_from_slice(&0x7e00u16.to_le_bytes());
            }
            let bad = find_non_finite(ty, &data).unwrap();
            assert_eq!((bad.block, bad.byte), (5, 5 * size as u64), "{ty}");
            assert!(bad.value.is_nan());
            assert_eq!(bad.field, if ty == GgmlType::F16 { "value" } else { "d" });
        }
    }

    #[test]
    fn second_scales_and_k_quant_offsets() {
        // Q4_1's m of block 2: +inf.
        let mut data = quantized(GgmlType::Q4_1, 32 * 4);
        data[2 * 20 + 2..2 * 20 + 4].copy_from_slice(&0x7c00u16.to_le_bytes());
        let bad = find_non_finite(GgmlType::Q4_1, &data).unwrap();
        assert_eq!((bad.block, bad.field, bad.value), (2, "m", f32::INFINITY));
        // Q6_K keeps d at the end of its 210-byte block.
        let mut q6 = vec![0u8; GgmlType::Q6_K.type_size() * 3];
        q6[210 + 208..210 + 210].copy_from_slice(&0xfc00u16.to_le_bytes());
        let bad = find_non_finite(GgmlType::Q6_K, &q6).unwrap();
        assert_eq!(
            (bad.block, bad.byte, bad.value),
            (1, 418, f32::NEG_INFINITY)
        );
        // f32 and bf16 values.
        let mut f = vec![0u8; 4 * 100];
        f[4 * 70..4 * 71].copy_from_slice(&f32::NAN.to_le_bytes());
        assert_eq!(find_non_finite(GgmlType::F32, &f).unwrap().block, 70);
        let mut bf = vec![0u8; 2 * 10];
        bf[6..8].copy_from_slice(&0x7f80u16.to_le_bytes());
        let bad = find_non_finite(GgmlType::BF16, &bf).unwrap();
        assert_eq!((bad.block, bad.value), (3, f32::INFINITY));
    }
}
