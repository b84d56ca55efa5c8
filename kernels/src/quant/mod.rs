//! ggml quant block formats: dequantization, quantization of activations
//! and small test models, and the quantized dot products a CPU matmul is
//! built from.
//!
//! Layouts and arithmetic follow ggml (`ggml-common.h`, `ggml-quants.c`,
//! `ggml-cpu-quants.c` of llama.cpp), so that a forward pass through these
//! kernels reproduces llama.cpp's CPU logits closely:
//!
//! - [`dequantize_row`] is bit-identical to ggml's `dequantize_row_*`
//!   (checked against the `gguf` Python package's reference
//!   implementation by `tests/quant_golden.rs`);
//! - [`quantize_row`] is bit-identical to ggml's `quantize_row_*_ref`;
//! - [`vec_dot`] uses ggml's integer formulation: activations are first
//!   quantized to [`GgmlType::vec_dot_type`] (Q8_0, Q8_1 or Q8_K), the
//!   products are summed exactly in integers per block, and scales are
//!   applied once per block in f32 (e.g. Q4_1 × Q8_1 is
//!   `sum(d_w * d_a * isum + m_w * s_a)` over blocks, with
//!   `s_a = f16(d_a * sum(q_a))`). Only the float accumulation order may
//!   differ from ggml's.
//!
//! Rows are byte slices of any alignment; all multi-byte fields are
//! little-endian. The module map, by format family:
//!
//! | file            | holds                                          |
//! |-----------------|------------------------------------------------|
//! | `types.rs`      | [`GgmlType`] table, [`QuantError`]             |
//! | `float.rs`      | F32, F16, BF16                                 |
//! | `q4.rs`/`q5.rs` | Q4_0, Q4_1 / Q5_0, Q5_1                        |
//! | `activation.rs` | Q8_0, Q8_1, Q8_K                               |
//! | `k_quants.rs`   | Q2_K, Q3_K, Q4_K, Q5_K, Q6_K                   |
//! | `iq2.rs`        | IQ2_XXS and its lattice tables                 |
//! | `dot.rs`        | [`vec_dot`] (and four-row forms), the run-time kernel choice |
//! | `gemm.rs`       | [`gemm()`] ([`gemm_with`] over [`GemmAct`] rows prepared once): weight rows × many activation rows |
//! | `simd_x86.rs`   | AVX2 dot kernels (`unsafe`)                    |
//! | `gemm_x86.rs`   | tiled gemm kernel (AVX-512 VNNI), Q8 activation quantizer (`unsafe`) |
//! | `validate.rs`   | [`find_non_finite`]: non-finite values and block scales (`--check-tensors`) |

mod activation;
mod dot;
mod float;
mod gemm;
#[cfg(target_arch = "x86_64")]
mod gemm_x86;
mod iq2;
mod k_quants;
mod q4;
mod q5;
#[cfg(target_arch = "x86_64")]
mod simd_x86;
mod types;
mod validate;

#[cfg(target_arch = "x86_64")]
pub(crate) use simd_x86::prefetch_l2;

#[cfg(test)]
pub(crate) mod tests;

pub use dot::{
    dot_isa, simd_dot_types, vec_dot, vec_dot_rows4, vec_dot_scalar, vec_dot_x4, DotIsa,
};
pub use gemm::{gemm, gemm_with, quantize_act_row, GemmAct};
pub use iq2::{IQ2XXS_GRID, KMASK_IQ2XS, KSIGNS_IQ2XS};
pub use types::{GgmlType, QuantError};
pub use validate::{find_non_finite, NonFinite};

/// Dequantizes `dst.len()` values of type `ty` from `src`.
///
/// `src.len()` must equal `ty.row_bytes(dst.len())`; otherwise nothing is
/// written and the error says which length is wrong.
pub fn dequantize_row(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), QuantError> {
    types::check_row(ty, dst.len(), src.len())?;
    match ty {
        GgmlType::F32 => float::dequantize_f32(src, dst),
        GgmlType::F16 => float::dequantize_f16(src, dst),
        GgmlType::BF16 => float::dequantize_bf16(src, dst),
        GgmlType::I32 => float::dequantize_i32(src, dst),
        GgmlType::Q4_0 => q4::dequantize_q4_0(src, dst),
        GgmlType::Q4_1 => q4::dequantize_q4_1(src, dst),
        GgmlType::Q5_0 => q5::dequantize_q5_0(src, dst),
        GgmlType::Q5_1 => q5::dequantize_q5_1(src, dst),
        GgmlType::Q8_0 => activation::dequantize_q8_0(src, dst),
        GgmlType::Q8_1 => activation::dequantize_q8_1(src, dst),
        GgmlType::Q8_K => activation::dequantize_q8_k(src, dst),
        GgmlType::Q2_K => k_quants::dequantize_q2_k(src, dst),
        GgmlType::Q3_K => k_quants::dequantize_q3_k(src, dst),
        GgmlType::Q4_K => k_quants::dequantize_q4_k(src, dst),
        GgmlType::Q5_K => k_quants::dequantize_q5_k(src, dst),
        GgmlType::Q6_K => k_quants::dequantize_q6_k(src, dst),
        GgmlType::IQ2_XXS => iq2::dequantize_iq2_xxs(src, dst),
    }
    Ok(())
}

/// Quantizes `src` into `dst` as type `ty`, with ggml's reference
/// quantizers.
///
/// Supported targets: F32, F16, BF16, the activation formats Q8_0, Q8_1,
/// Q8_K, and Q4_0, Q4_1, Q5_0, Q5_1 (enough to build small test models).
/// K-quants and IQ2_XXS need importance-weighted searches and return
/// [`QuantError::Unsupported`]. `dst.len()` must equal
/// `ty.row_bytes(src.len())`.
pub fn quantize_row(ty: GgmlType, src: &[f32], dst: &mut [u8]) -> Result<(), QuantError> {
    if !ty.can_quantize() {
        return Err(QuantError::Unsupported { ty });
    }
    types::check_row(ty, src.len(), dst.len())?;
    match ty {
        GgmlType::F32 => float::quantize_f32(src, dst),
        GgmlType::F16 => float::quantize_f16(src, dst),
        GgmlType::BF16 => float::quantize_bf16(src, dst),
        GgmlType::Q4_0 => q4::quantize_q4_0(src, dst),
        GgmlType::Q4_1 => q4::quantize_q4_1(src, dst),
        GgmlType::Q5_0 => q5::quantize_q5_0(src, dst),
        GgmlType::Q5_1 => q5::quantize_q5_1(src, dst),
        GgmlType::Q8_0 => activation::quantize_q8_0(src, dst),
        GgmlType::Q8_1 => activation::quantize_q8_1(src, dst),
        GgmlType::Q8_K => activation::quantize_q8_k(src, dst),
        GgmlType::Q2_K
        | GgmlType::Q3_K
        | GgmlType::Q4_K
        | GgmlType::Q5_K
        | GgmlType::Q6_K
        | GgmlType::IQ2_XXS
        | GgmlType::I32 => return Err(QuantError::Unsupported { ty }),
    }
    Ok(())
}
