//! Helpers shared by the GGUF reader tests: a byte-level header builder for
//! files the writer cannot (or must not) produce, deterministic tensor
//! data, and error unwrapping.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use ds4_kernels::quant::GgmlType;
use ds4_model::gguf::writer::TensorToWrite;
use ds4_model::gguf::GgufError;

/// GGUF value type ids.
pub mod vt {
    pub const U8: u32 = 0;
    pub const I8: u32 = 1;
    pub const U16: u32 = 2;
    pub const I16: u32 = 3;
    pub const U32: u32 = 4;
    pub const I32: u32 = 5;
    pub const F32: u32 = 6;
    pub const BOOL: u32 = 7;
    pub const STRING: u32 = 8;
    pub const ARRAY: u32 = 9;
    pub const U64: u32 = 10;
    pub const I64: u32 = 11;
    pub const F64: u32 = 12;
}

/// Bytes a tensor of this type and shape occupies (shape[0] a multiple of the block).
pub fn tensor_size(ty: GgmlType, shape: &[u64]) -> usize {
    let n: u64 = shape.iter().product();
    (n as usize / ty.block_size()) * ty.type_size()
}

/// A tensor with deterministic, name-dependent bytes.
pub fn tensor(name: &str, shape: &[u64], ty: GgmlType) -> TensorToWrite {
    let seed = name
        .bytes()
        .fold(7u8, |a, b| a.wrapping_mul(31).wrapping_add(b));
    let data = (0..tensor_size(ty, shape))
        .map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed))
        .collect();
    TensorToWrite {
        name: name.to_string(),
        shape: shape.to_vec(),
        ggml_type: ty,
        data,
    }
}

/// One tensor info as raw fields, so tests can write any offset, type id or shape.
#[derive(Clone, Debug)]
pub struct RawTensor {
    pub name: String,
    pub dims: Vec<u64>,
    pub type_id: u32,
    pub offset: u64,
}

pub fn raw_tensor(name: &str, dims: &[u64], type_id: u32, offset: u64) -> RawTensor {
    RawTensor {
        name: name.to_string(),
        dims: dims.to_vec(),
        type_id,
        offset,
    }
}

/// A GGUF file assembled byte by byte. Key/value pairs are stored as their
/// encoded value (type id included), so malformed values are expressible.
#[derive(Clone, Debug)]
pub struct RawGguf {
    pub version: u32,
    pub kvs: Vec<(String, Vec<u8>)>,
    pub tensors: Vec<RawTensor>,
    /// Padding applied after the header (not written as a key).
    pub pad_to: u64,
    pub data: Vec<u8>,
}

impl Default for RawGguf {
    fn default() -> Self {
        RawGguf {
            version: 3,
            kvs: Vec::new(),
            tensors: Vec::new(),
            pad_to: 32,
            data: Vec::new(),
        }
    }
}

pub fn enc_str(s: &str) -> Vec<u8> {
    let mut v = (s.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(s.as_bytes());
    v
}

/// A typed value: type id followed by the payload.
pub fn typed(type_id: u32, payload: &[u8]) -> Vec<u8> {
    let mut v = type_id.to_le_bytes().to_vec();
    v.extend_from_slice(payload);
    v
}

pub fn typed_u32(x: u32) -> Vec<u8> {
    typed(vt::U32, &x.to_le_bytes())
}

pub fn typed_str(s: &str) -> Vec<u8> {
    typed(vt::STRING, &enc_str(s))
}

impl RawGguf {
    pub fn kv(mut self, key: &str, typed_value: Vec<u8>) -> Self {
        self.kvs.push((key.to_string(), typed_value));
        self
    }

    pub fn tensor(mut self, t: RawTensor) -> Self {
        self.tensors.push(t);
        self
    }

    /// Header bytes, unpadded.
    pub fn header(&self) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.kvs.len() as u64).to_le_bytes());
        for (k, v) in &self.kvs {
            out.extend_from_slice(&enc_str(k));
            out.extend_from_slice(v);
        }
        for t in &self.tensors {
            out.extend_from_slice(&enc_str(&t.name));
            out.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&t.type_id.to_le_bytes());
            out.extend_from_slice(&t.offset.to_le_bytes());
        }
        out
    }

    /// The whole file: header, padding to `pad_to`, data.
    pub fn build(&self) -> Vec<u8> {
        let mut out = self.header();
        let len = (out.len() as u64).div_ceil(self.pad_to) * self.pad_to;
        out.resize(len as usize, 0);
        out.extend_from_slice(&self.data);
        out
    }
}

/// The error inside the `InFile` wrapper that `GgufFile::open` adds.
pub fn inner(e: &GgufError) -> &GgufError {
    match e {
        GgufError::InFile { source, .. } => inner(source),
        other => other,
    }
}

pub fn write_file(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, bytes).expect("write test file");
    path
}

/// Deterministic xorshift64* generator (no dependency, fixed seeds).
#[derive(Clone, Debug)]
pub struct XorShift(pub u64);

impl XorShift {
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform-ish in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    pub fn chance(&mut self, one_in: u64) -> bool {
        self.below(one_in) == 0
    }
}
