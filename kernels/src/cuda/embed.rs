//! Wrapper of `kernels/cuda/embed.cu`: embedding rows gathered and
//! dequantized.

use super::{kernel_suffix, CudaBackend, CudaTensor, CudaWeight};
use crate::backend::BackendError;

pub fn embed(
    be: &CudaBackend,
    table: &CudaWeight,
    ids: &[u32],
    out: &mut CudaTensor,
) -> Result<(), BackendError> {
    if out.rows != ids.len() {
        return Err(BackendError::Shape {
            op: "embed",
            detail: format!("{} ids into {} rows", ids.len(), out.rows),
        });
    }
    embed_ptr(be, table, ids, out.ptr, out.cols)
}

/// Gathers rows `ids` of `table` into `ids.len()` rows of `cols` f32 at
/// device address `out`.
pub fn embed_ptr(
    be: &CudaBackend,
    table: &CudaWeight,
    ids: &[u32],
    out: u64,
    cols: usize,
) -> Result<(), BackendError> {
    if cols != table.cols {
        return Err(BackendError::Shape {
            op: "embed",
            detail: format!(
                "{} ids into rows of {cols}, table width {}",
                ids.len(),
                table.cols
            ),
        });
    }
    if !cols.is_multiple_of(32) && table.ggml_type != crate::quant::GgmlType::I32 {
        // (Binding allows other widths for one-row F32 weights and for i32
        // tables, which `embed_i32` gathers value by value.)
        return Err(BackendError::Shape {
            op: "embed",
            detail: format!("rows of {cols} values: the gather needs a multiple of 32"),
        });
    }
    if let Some(&bad) = ids.iter().find(|&&id| id as usize >= table.rows) {
        return Err(BackendError::Shape {
            op: "embed",
            detail: format!(
                "token id {bad} is outside the vocabulary of {} tokens",
                table.rows
            ),
        });
    }
    if ids.is_empty() {
        return Ok(());
    }
    let name = match kernel_suffix(table.ggml_type) {
        Some("f32") => "embed_f32",
        Some("f16") => "embed_f16",
        Some("q4_0") => "embed_q4_0",
        Some("q4_1") => "embed_q4_1",
        Some("q5_0") => "embed_q5_0",
        Some("q8_0") => "embed_q8_0",
        Some("q4_k") => "embed_q4_k",
        Some("q5_k") => "embed_q5_k",
        Some("q6_k") => "embed_q6_k",
        Some("q2_k") => "embed_q2_k",
        Some("iq2_xxs") => "embed_iq2_xxs",
        Some("i32") => "embed_i32",
        _ => unreachable!("bound weights have a CUDA type"),
    };
    let (wp, ip, op) = (be.weight_ptr(table), be.upload_cached(ids)?, out);
    let rb = table.row_bytes as u64;
    let cols = table.cols as i32;
    launch!(be, name, (ids.len() as u32, 1, 1), 128; &wp, &rb, &ip, &op, &cols)
}
