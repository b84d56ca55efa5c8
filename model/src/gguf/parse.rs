//! Parsing of the GGUF header (magic, version, metadata, tensor infos) from
//! a byte slice. Every read is bounds-checked and every count taken from the
//! file is checked against the bytes left before it is trusted. Nothing is
//! allocated from a claimed length: vectors grow with the items actually
//! decoded, and the number of array elements in a header is capped
//! ([`MAX_ARRAY_ELEMENTS`]), so a hostile file can neither panic the reader
//! nor make it allocate more than a small multiple of its header's size.

use super::{GgufError, MetaValue, Metadata};
use ds4_kernels::quant::GgmlType;

/// GGML_MAX_DIMS: tensors have at most four dimensions.
pub const MAX_DIMS: usize = 4;
/// Arrays of arrays deeper than this are refused.
pub const MAX_ARRAY_DEPTH: usize = 8;
/// Array elements allowed in one header, over all arrays. A u8 in the file
/// costs one byte there and a [`MetaValue`] here, so without a cap a large
/// file could claim arrays whose decoding exhausts memory. Real headers hold
/// a few million (vocabulary, scores, token types, merges).
pub const MAX_ARRAY_ELEMENTS: u64 = 1 << 24;
/// Vectors are preallocated for at most this many items; beyond that they
/// grow only as items are actually decoded.
const MAX_PREALLOC: u64 = 1 << 12;
/// Default `general.alignment`.
pub const DEFAULT_ALIGNMENT: u64 = 32;

/// A tensor as described by the header, before it is checked against the
/// data section.
#[derive(Clone, Debug)]
pub struct RawTensorInfo {
    pub name: String,
    /// Dimensions in ggml order: `shape[0]` is the contiguous (row) length.
    pub shape: Vec<u64>,
    pub ggml_type: GgmlType,
    /// Offset relative to the start of the data section.
    pub offset: u64,
    /// Bytes occupied, from the type and shape.
    pub n_bytes: u64,
}

/// Everything the header says.
#[derive(Debug)]
pub struct Header {
    pub version: u32,
    pub metadata: Metadata,
    pub tensors: Vec<RawTensorInfo>,
    pub alignment: u64,
    /// Absolute file offset where the data section begins.
    pub data_offset: u64,
}

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    /// Array elements still allowed ([`MAX_ARRAY_ELEMENTS`]).
    elements_left: u64,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    fn take(&mut self, n: u64, what: &'static str) -> Result<&'a [u8], GgufError> {
        if n > self.remaining() {
            return Err(GgufError::Truncated {
                what,
                offset: self.pos as u64,
                needed: n,
                len: self.buf.len() as u64,
            });
        }
        let start = self.pos;
        self.pos += n as usize;
        Ok(&self.buf[start..self.pos])
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], GgufError> {
        let b = self.take(N as u64, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(b);
        Ok(out)
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &'static str) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A count that promises `count * min_item_bytes` more bytes of header.
    fn count(&mut self, what: &'static str, min_item_bytes: u64) -> Result<u64, GgufError> {
        let offset = self.pos as u64;
        let count = self.u64(what)?;
        let remaining = self.remaining();
        if count.saturating_mul(min_item_bytes) > remaining {
            return Err(GgufError::CountTooLarge {
                what,
                count,
                offset,
                remaining,
            });
        }
        Ok(count)
    }

    fn string(&mut self, context: &dyn Fn() -> String) -> Result<String, GgufError> {
        let len = self.count("string length", 1)?;
        let offset = self.pos as u64;
        let bytes = self.take(len, "string bytes")?;
        String::from_utf8(bytes.to_vec()).map_err(|_| GgufError::BadUtf8 {
            context: context(),
            offset,
        })
    }
}

/// Value type ids of the GGUF format.
mod value_type {
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

    /// The fewest bytes one value of this type occupies in the file.
    pub fn min_size(t: u32) -> Option<u64> {
        Some(match t {
            U8 | I8 | BOOL => 1,
            U16 | I16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 | STRING => 8,
            ARRAY => 12,
            _ => return None,
        })
    }
}

fn read_value(
    cur: &mut Cursor<'_>,
    type_id: u32,
    key: &str,
    depth: usize,
) -> Result<MetaValue, GgufError> {
    use value_type as t;
    Ok(match type_id {
        t::U8 => MetaValue::U8(cur.array::<1>("u8 value")?[0]),
        t::I8 => MetaValue::I8(i8::from_le_bytes(cur.array("i8 value")?)),
        t::U16 => MetaValue::U16(u16::from_le_bytes(cur.array("u16 value")?)),
        t::I16 => MetaValue::I16(i16::from_le_bytes(cur.array("i16 value")?)),
        t::U32 => MetaValue::U32(u32::from_le_bytes(cur.array("u32 value")?)),
        t::I32 => MetaValue::I32(i32::from_le_bytes(cur.array("i32 value")?)),
        t::U64 => MetaValue::U64(u64::from_le_bytes(cur.array("u64 value")?)),
        t::I64 => MetaValue::I64(i64::from_le_bytes(cur.array("i64 value")?)),
        t::F32 => MetaValue::F32(f32::from_le_bytes(cur.array("f32 value")?)),
        t::F64 => MetaValue::F64(f64::from_le_bytes(cur.array("f64 value")?)),
        t::BOOL => {
            let offset = cur.pos as u64;
            match cur.array::<1>("bool value")?[0] {
                0 => MetaValue::Bool(false),
                1 => MetaValue::Bool(true),
                b => {
                    return Err(GgufError::BadValue {
                        key: key.to_string(),
                        offset,
                        problem: format!("bool byte is {b}, expected 0 or 1"),
                    });
                }
            }
        }
        t::STRING => MetaValue::String(cur.string(&|| format!("value of key {key:?}"))?),
        t::ARRAY => {
            if depth >= MAX_ARRAY_DEPTH {
                return Err(GgufError::TooDeep {
                    key: key.to_string(),
                    max: MAX_ARRAY_DEPTH,
                });
            }
            let offset = cur.pos as u64;
            let elem_type = cur.u32("array element type")?;
            let min = t::min_size(elem_type).ok_or_else(|| GgufError::BadValueType {
                key: key.to_string(),
                type_id: elem_type,
                offset,
            })?;
            let n = cur.count("array length", min)?;
            if n > cur.elements_left {
                return Err(GgufError::TooManyElements {
                    key: key.to_string(),
                    count: MAX_ARRAY_ELEMENTS - cur.elements_left + n,
                    offset,
                    max: MAX_ARRAY_ELEMENTS,
                });
            }
            cur.elements_left -= n;
            let mut items = Vec::with_capacity(n.min(MAX_PREALLOC) as usize);
            for _ in 0..n {
                items.push(read_value(cur, elem_type, key, depth + 1)?);
            }
            MetaValue::Array(items)
        }
        other => {
            return Err(GgufError::BadValueType {
                key: key.to_string(),
                type_id: other,
                offset: cur.pos.saturating_sub(4) as u64,
            });
        }
    })
}

/// Parse a GGUF header. `buf` is the whole file (or at least its header;
/// the data section is checked separately by [`check_tensors`]).
pub fn parse_header(buf: &[u8]) -> Result<Header, GgufError> {
    let mut cur = Cursor {
        buf,
        pos: 0,
        elements_left: MAX_ARRAY_ELEMENTS,
    };
    if buf.len() < 4 && b"GGUF".starts_with(buf) {
        // Empty, or cut inside the magic: say so rather than "bad magic".
        cur.take(4, "magic")?;
    }
    let magic = cur.take(4, "magic").map_err(|_| GgufError::BadMagic {
        found: buf[..buf.len().min(4)].to_vec(),
    })?;
    if magic != b"GGUF" {
        return Err(GgufError::BadMagic {
            found: magic.to_vec(),
        });
    }
    let version = cur.u32("version")?;
    match version {
        2 | 3 => {}
        1 => {
            return Err(GgufError::UnsupportedVersion {
                version,
                hint: "; convert the file with a current llama.cpp",
            })
        }
        v if v.swap_bytes() == 2 || v.swap_bytes() == 3 => {
            return Err(GgufError::UnsupportedVersion {
                version,
                hint: " (this looks like a big-endian GGUF)",
            });
        }
        _ => return Err(GgufError::UnsupportedVersion { version, hint: "" }),
    }
    // A tensor info takes at least 8 (name length) + 4 (n_dims) + 4 (type) + 8 (offset) bytes.
    let n_tensors = cur.count("tensor", 24)?;
    // A key/value pair takes at least 8 (key length) + 4 (type) + 1 byte.
    let n_kv = cur.count("metadata key/value", 13)?;

    let mut metadata = Metadata::default();
    for _ in 0..n_kv {
        let key_offset = cur.pos as u64;
        let key = cur.string(&|| format!("metadata key at offset {key_offset}"))?;
        let type_id = cur.u32("metadata value type")?;
        let value = read_value(&mut cur, type_id, &key, 0)?;
        metadata.insert(key, value, key_offset)?;
    }

    let alignment = match metadata.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(v) => {
            let value = v.as_u64().ok_or(GgufError::WrongKeyType {
                key: "general.alignment".into(),
                expected: "an unsigned integer",
                found: v.type_name(),
            })?;
            if value == 0 || !value.is_power_of_two() || value > (1 << 30) {
                return Err(GgufError::BadAlignment { value });
            }
            value
        }
    };

    let mut tensors = Vec::with_capacity(n_tensors.min(MAX_PREALLOC) as usize);
    for _ in 0..n_tensors {
        tensors.push(read_tensor_info(&mut cur)?);
    }
    let data_offset = (cur.pos as u64).div_ceil(alignment) * alignment;
    Ok(Header {
        version,
        metadata,
        tensors,
        alignment,
        data_offset,
    })
}

fn read_tensor_info(cur: &mut Cursor<'_>) -> Result<RawTensorInfo, GgufError> {
    let name_offset = cur.pos as u64;
    let name = cur.string(&|| format!("tensor name at offset {name_offset}"))?;
    let bad = |problem: String| GgufError::BadTensor {
        name: name.clone(),
        problem,
    };
    let n_dims = cur.u32("tensor dimension count")?;
    if n_dims == 0 || n_dims as usize > MAX_DIMS {
        return Err(bad(format!(
            "{n_dims} dimensions (expected 1 to {MAX_DIMS})"
        )));
    }
    let mut shape = Vec::with_capacity(n_dims as usize);
    for _ in 0..n_dims {
        shape.push(cur.u64("tensor dimension")?);
    }
    let type_id = cur.u32("tensor type")?;
    let offset = cur.u64("tensor offset")?;
    let ggml_type = GgmlType::from_id(type_id).ok_or_else(|| GgufError::UnknownTensorType {
        name: name.clone(),
        type_id,
    })?;
    if shape.contains(&0) {
        return Err(bad(format!("shape {shape:?} has a zero dimension")));
    }
    let n_elements = shape
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| bad(format!("shape {shape:?} overflows")))?;
    let block = ggml_type.block_size() as u64;
    if shape[0] % block != 0 {
        return Err(bad(format!(
            "row length {} is not a multiple of the {} block size {block}",
            shape[0],
            ggml_type.name()
        )));
    }
    let n_bytes = (n_elements / block)
        .checked_mul(ggml_type.type_size() as u64)
        .ok_or_else(|| bad(format!("byte size of shape {shape:?} overflows")))?;
    Ok(RawTensorInfo {
        name,
        shape,
        ggml_type,
        offset,
        n_bytes,
    })
}

/// Check tensor placement against a data section of `data_len` bytes:
/// aligned offsets, inside the section, unique names, no overlaps.
pub fn check_tensors(
    tensors: &[RawTensorInfo],
    alignment: u64,
    data_len: u64,
) -> Result<(), GgufError> {
    let mut seen = std::collections::HashSet::with_capacity(tensors.len());
    for t in tensors {
        if !seen.insert(t.name.as_str()) {
            return Err(GgufError::DuplicateTensor {
                name: t.name.clone(),
            });
        }
        if t.offset % alignment != 0 {
            return Err(GgufError::BadTensor {
                name: t.name.clone(),
                problem: format!("data offset {} is not aligned to {alignment}", t.offset),
            });
        }
        let end = t.offset.checked_add(t.n_bytes);
        if end.is_none_or(|end| end > data_len) {
            return Err(GgufError::BadTensor {
                name: t.name.clone(),
                problem: format!(
                    "data {}..{} (type {}, shape {:?}) runs past the end of the data section ({data_len} bytes)",
                    t.offset,
                    t.offset.saturating_add(t.n_bytes),
                    t.ggml_type.name(),
                    t.shape
                ),
            });
        }
    }
    let mut order: Vec<&RawTensorInfo> = tensors.iter().collect();
    order.sort_by_key(|t| t.offset);
    for pair in order.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        if a.offset + a.n_bytes > b.offset {
            return Err(GgufError::Overlap {
                first: a.name.clone(),
                first_start: a.offset,
                first_end: a.offset + a.n_bytes,
                second: b.name.clone(),
                second_start: b.offset,
            });
        }
    }
    Ok(())
}
