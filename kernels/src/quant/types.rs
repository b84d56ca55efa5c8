//! The ggml type table and the errors of this module.
//!
//! Numeric ids, names, block sizes and block byte sizes are those of ggml
//! (`ggml.c` `type_traits`, `ggml-common.h` block structs). They are part
//! of the GGUF file format and must never change.

use std::fmt;

/// A ggml tensor element type.
///
/// Variant names follow ggml's spelling (`Q4_K`, `IQ2_XXS`), which is why
/// the usual camel-case rule is switched off.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    Q8_K,
    IQ2_XXS,
    BF16,
    /// 32-bit integers (index tables such as DeepSeek V4's hash-routing
    /// table); never a matmul weight.
    I32,
}

/// Static facts about one type: `(id, name, block_size, type_size)`.
struct Traits {
    id: u32,
    name: &'static str,
    block_size: usize,
    type_size: usize,
}

/// Elements in a K-quant super-block (`QK_K`).
pub(crate) const QK_K: usize = 256;
/// Elements in a legacy block (`QK4_0`, `QK8_0`, ...).
pub(crate) const QK: usize = 32;

impl GgmlType {
    /// Every numeric format the quant kernels compute with, in ggml id
    /// order. [`GgmlType::I32`] (index tables) is not one of them, but
    /// [`from_id`](Self::from_id) knows it.
    pub const ALL: [GgmlType; 16] = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q8_1,
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::Q8_K,
        GgmlType::IQ2_XXS,
        GgmlType::BF16,
    ];

    const fn traits(self) -> Traits {
        const fn t(id: u32, name: &'static str, block_size: usize, type_size: usize) -> Traits {
            Traits {
                id,
                name,
                block_size,
                type_size,
            }
        }
        match self {
            GgmlType::F32 => t(0, "f32", 1, 4),
            GgmlType::F16 => t(1, "f16", 1, 2),
            // d: f16, qs: 16 bytes of nibbles
            GgmlType::Q4_0 => t(2, "q4_0", QK, 2 + QK / 2),
            // d, m: f16, qs: 16 bytes
            GgmlType::Q4_1 => t(3, "q4_1", QK, 4 + QK / 2),
            // d: f16, qh: u32, qs: 16 bytes
            GgmlType::Q5_0 => t(6, "q5_0", QK, 2 + 4 + QK / 2),
            // d, m: f16, qh: u32, qs: 16 bytes
            GgmlType::Q5_1 => t(7, "q5_1", QK, 4 + 4 + QK / 2),
            // d: f16, qs: 32 x i8
            GgmlType::Q8_0 => t(8, "q8_0", QK, 2 + QK),
            // d, s: f16, qs: 32 x i8
            GgmlType::Q8_1 => t(9, "q8_1", QK, 4 + QK),
            // scales: 16, qs: 64, d, dmin: f16
            GgmlType::Q2_K => t(10, "q2_K", QK_K, QK_K / 16 + QK_K / 4 + 4),
            // hmask: 32, qs: 64, scales: 12, d: f16
            GgmlType::Q3_K => t(11, "q3_K", QK_K, QK_K / 8 + QK_K / 4 + 12 + 2),
            // d, dmin: f16, scales: 12, qs: 128
            GgmlType::Q4_K => t(12, "q4_K", QK_K, 4 + 12 + QK_K / 2),
            // d, dmin: f16, scales: 12, qh: 32, qs: 128
            GgmlType::Q5_K => t(13, "q5_K", QK_K, 4 + 12 + QK_K / 8 + QK_K / 2),
            // ql: 128, qh: 64, scales: 16 x i8, d: f16
            GgmlType::Q6_K => t(14, "q6_K", QK_K, QK_K / 2 + QK_K / 4 + QK_K / 16 + 2),
            // d: f32, qs: 256 x i8, bsums: 16 x i16
            GgmlType::Q8_K => t(15, "q8_K", QK_K, 4 + QK_K + 2 * QK_K / 16),
            // d: f16, qs: 32 x u16
            GgmlType::IQ2_XXS => t(16, "iq2_xxs", QK_K, 2 + QK_K / 4),
            GgmlType::BF16 => t(30, "bf16", 1, 2),
            GgmlType::I32 => t(26, "i32", 1, 4),
        }
    }

    /// The type with ggml's numeric id `id` (as stored in GGUF tensor
    /// infos), or `None` if the id is unknown or not supported here.
    pub fn from_id(id: u32) -> Option<GgmlType> {
        GgmlType::ALL
            .into_iter()
            .chain([GgmlType::I32])
            .find(|t| t.id() == id)
    }

    /// ggml's numeric type id.
    pub fn id(self) -> u32 {
        self.traits().id
    }

    /// ggml's spelling of the type name (`"q4_K"`, `"iq2_xxs"`, ...).
    pub fn name(self) -> &'static str {
        self.traits().name
    }

    /// Elements per block: 1 for the float types, 32 for the legacy
    /// quants, 256 for K-quants and IQ2_XXS.
    pub fn block_size(self) -> usize {
        self.traits().block_size
    }

    /// Bytes per block.
    pub fn type_size(self) -> usize {
        self.traits().type_size
    }

    /// Whether the type is block-quantized (everything but F32/F16/BF16).
    pub fn is_quantized(self) -> bool {
        !matches!(
            self,
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 | GgmlType::I32
        )
    }

    /// Bytes taken by a row of `n` elements, or `None` if `n` is not a
    /// multiple of [`block_size`](Self::block_size) or the size overflows.
    pub fn row_bytes(self, n: usize) -> Option<usize> {
        let blocks = n / self.block_size();
        if blocks * self.block_size() != n {
            return None;
        }
        blocks.checked_mul(self.type_size())
    }

    /// The format activations must be quantized to before
    /// [`vec_dot`](super::vec_dot) with a weight row of this type, as in
    /// ggml's CPU backend:
    ///
    /// - Q4_0, Q5_0, Q8_0 → Q8_0; Q4_1, Q5_1 → Q8_1;
    /// - K-quants and IQ2_XXS → Q8_K;
    /// - F32 → F32, F16 → F16, BF16 → BF16 (activations are rounded to the
    ///   weight's float format, like ggml does);
    /// - the activation formats Q8_1 and Q8_K dot with themselves.
    pub fn vec_dot_type(self) -> GgmlType {
        match self {
            GgmlType::F32 | GgmlType::I32 => GgmlType::F32,
            GgmlType::F16 => GgmlType::F16,
            GgmlType::BF16 => GgmlType::BF16,
            GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => GgmlType::Q8_0,
            GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q8_1 => GgmlType::Q8_1,
            GgmlType::Q2_K
            | GgmlType::Q3_K
            | GgmlType::Q4_K
            | GgmlType::Q5_K
            | GgmlType::Q6_K
            | GgmlType::Q8_K
            | GgmlType::IQ2_XXS => GgmlType::Q8_K,
        }
    }

    /// Whether [`quantize_row`](super::quantize_row) can produce this type.
    pub fn can_quantize(self) -> bool {
        !matches!(
            self,
            GgmlType::Q2_K
                | GgmlType::Q3_K
                | GgmlType::Q4_K
                | GgmlType::Q5_K
                | GgmlType::Q6_K
                | GgmlType::IQ2_XXS
                | GgmlType::I32
        )
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a quantization routine refused its arguments.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum QuantError {
    /// The element count is not a whole number of blocks.
    #[error(
        "{ty}: a row of {elements} elements is not a whole number of {block_size}-element blocks; \
         pad or split the row to a multiple of {block_size}"
    )]
    PartialBlock {
        ty: GgmlType,
        elements: usize,
        block_size: usize,
    },
    /// The quantized buffer does not have the size the element count implies.
    #[error("{ty}: {elements} elements take {expected} bytes, but the buffer holds {got} bytes")]
    ByteLength {
        ty: GgmlType,
        elements: usize,
        expected: usize,
        got: usize,
    },
    /// Quantizing to this type is not implemented (only dequantization is).
    #[error(
        "quantizing to {ty} is not supported; supported targets are f32, f16, bf16, \
         q4_0, q4_1, q5_0, q5_1, q8_0, q8_1 and q8_K"
    )]
    Unsupported { ty: GgmlType },
}

/// Checks that `bytes` holds exactly `elements` elements of type `ty`.
pub(crate) fn check_row(ty: GgmlType, elements: usize, bytes: usize) -> Result<(), QuantError> {
    let expected = ty.row_bytes(elements).ok_or(QuantError::PartialBlock {
        ty,
        elements,
        block_size: ty.block_size(),
    })?;
    if expected != bytes {
        return Err(QuantError::ByteLength {
            ty,
            elements,
            expected,
            got: bytes,
        });
    }
    Ok(())
}

/// f16 → f32 for every bit pattern (256 KiB, built at compile time), like
/// ggml's `ggml_table_f32_f16`: the dot kernels convert two to four block
/// scales per block, and one load beats a conversion on every target.
pub(crate) static F16_TO_F32: [f32; 65536] = {
    let mut table = [0f32; 65536];
    let mut i = 0;
    while i < table.len() {
        table[i] = half::f16::from_bits(i as u16).to_f32_const();
        i += 1;
    }
    table
};

/// Reads the little-endian f16 at `b[off..off + 2]` as f32.
#[inline(always)]
pub(crate) fn f16_at(b: &[u8], off: usize) -> f32 {
    F16_TO_F32[u16::from_le_bytes([b[off], b[off + 1]]) as usize]
}

/// Writes `v` rounded to f16 (nearest-even, like ggml) at `b[off..off + 2]`.
#[inline(always)]
pub(crate) fn put_f16(b: &mut [u8], off: usize, v: f32) {
    b[off..off + 2].copy_from_slice(&half::f16::from_f32(v).to_bits().to_le_bytes());
}
