//! A small GGUF writer (version 3). Used to build test models and fixtures,
//! and to write split models; the inverse of [`super::parse_header`].

use super::{MetaValue, DEFAULT_ALIGNMENT};
use ds4_kernels::quant::GgmlType;

/// A tensor to write: name, ggml shape (row length first), type and bytes.
#[derive(Clone, Debug)]
pub struct TensorToWrite {
    pub name: String,
    pub shape: Vec<u64>,
    pub ggml_type: GgmlType,
    pub data: Vec<u8>,
}

/// A tensor's entry in a GGUF header: name, ggml shape (row length first),
/// type, and its offset from the start of the data section.
#[derive(Clone, Copy, Debug)]
pub struct TensorHeader<'a> {
    pub name: &'a str,
    pub shape: &'a [u64],
    pub ggml_type: GgmlType,
    pub offset: u64,
}

/// The header of a GGUF v3 file, metadata written as given, padded to
/// `alignment` (where the data section starts).
pub fn header_bytes(
    metadata: &[(String, MetaValue)],
    tensors: &[TensorHeader<'_>],
    alignment: u64,
) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(b"GGUF");
    out.extend_from_slice(&3u32.to_le_bytes());
    out.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    out.extend_from_slice(&(metadata.len() as u64).to_le_bytes());
    for (k, v) in metadata {
        write_str(&mut out, k);
        write_typed(&mut out, v);
    }
    for t in tensors {
        write_str(&mut out, t.name);
        out.extend_from_slice(&(t.shape.len() as u32).to_le_bytes());
        for d in t.shape {
            out.extend_from_slice(&d.to_le_bytes());
        }
        out.extend_from_slice(&t.ggml_type.id().to_le_bytes());
        out.extend_from_slice(&t.offset.to_le_bytes());
    }
    pad_to(&mut out, alignment);
    out
}

/// Serialize a GGUF v3 file. `alignment` is written as `general.alignment`
/// when it differs from the default.
pub fn write_gguf(
    metadata: &[(String, MetaValue)],
    tensors: &[TensorToWrite],
    alignment: u64,
) -> Vec<u8> {
    let mut meta = metadata.to_vec();
    if alignment != DEFAULT_ALIGNMENT {
        meta.push(("general.alignment".into(), MetaValue::U32(alignment as u32)));
    }
    let mut offset = 0u64;
    let mut headers = Vec::with_capacity(tensors.len());
    for t in tensors {
        headers.push(TensorHeader {
            name: &t.name,
            shape: &t.shape,
            ggml_type: t.ggml_type,
            offset,
        });
        offset = (offset + t.data.len() as u64).div_ceil(alignment) * alignment;
    }
    let mut out = header_bytes(&meta, &headers, alignment);
    let data_start = out.len() as u64;
    for (t, h) in tensors.iter().zip(&headers) {
        out.resize((data_start + h.offset) as usize, 0);
        out.extend_from_slice(&t.data);
    }
    pad_to(&mut out, alignment);
    out
}

fn pad_to(out: &mut Vec<u8>, alignment: u64) {
    let len = (out.len() as u64).div_ceil(alignment) * alignment;
    out.resize(len as usize, 0);
}

fn write_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn type_id(v: &MetaValue) -> u32 {
    match v {
        MetaValue::U8(_) => 0,
        MetaValue::I8(_) => 1,
        MetaValue::U16(_) => 2,
        MetaValue::I16(_) => 3,
        MetaValue::U32(_) => 4,
        MetaValue::I32(_) => 5,
        MetaValue::F32(_) => 6,
        MetaValue::Bool(_) => 7,
        MetaValue::String(_) => 8,
        MetaValue::Array(_) => 9,
        MetaValue::U64(_) => 10,
        MetaValue::I64(_) => 11,
        MetaValue::F64(_) => 12,
    }
}

fn write_typed(out: &mut Vec<u8>, v: &MetaValue) {
    out.extend_from_slice(&type_id(v).to_le_bytes());
    write_value(out, v);
}

fn write_value(out: &mut Vec<u8>, v: &MetaValue) {
    match v {
        MetaValue::U8(x) => out.push(*x),
        MetaValue::I8(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::Bool(x) => out.push(u8::from(*x)),
        MetaValue::String(s) => write_str(out, s),
        MetaValue::Array(items) => {
            // Element type of an empty array is written as u8.
            let elem = items.first().map_or(0, type_id);
            out.extend_from_slice(&elem.to_le_bytes());
            out.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for item in items {
                write_value(out, item);
            }
        }
    }
}
