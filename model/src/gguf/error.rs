//! Typed errors of the GGUF reader. Every variant names what is wrong and
//! where (byte offset, key or tensor), so an operator can act on it.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {source}")]
    InFile {
        path: PathBuf,
        source: Box<GgufError>,
    },
    #[error("not a GGUF file: magic {found:02x?} at offset 0, expected \"GGUF\"")]
    BadMagic { found: Vec<u8> },
    #[error("GGUF version {version} is not supported (ds4 reads versions 2 and 3){hint}")]
    UnsupportedVersion { version: u32, hint: &'static str },
    #[error("truncated GGUF header: {what} needs {needed} bytes at offset {offset}, but the file ends at {len}")]
    Truncated {
        what: &'static str,
        offset: u64,
        needed: u64,
        len: u64,
    },
    #[error("{what} count {count} at offset {offset} cannot fit in the {remaining} bytes left in the file")]
    CountTooLarge {
        what: &'static str,
        count: u64,
        offset: u64,
        remaining: u64,
    },
    #[error("metadata key {key:?}: the array at offset {offset} brings the header to {count} array elements, more than the reader's limit of {max} (the file is corrupt or hostile)")]
    TooManyElements {
        key: String,
        count: u64,
        offset: u64,
        max: u64,
    },
    #[error("metadata key {key:?} at offset {offset}: {problem}")]
    BadValue {
        key: String,
        offset: u64,
        problem: String,
    },
    #[error("metadata key {key:?} at offset {offset}: unknown value type {type_id}")]
    BadValueType {
        key: String,
        type_id: u32,
        offset: u64,
    },
    #[error("string at offset {offset} ({context}) is not valid UTF-8")]
    BadUtf8 { context: String, offset: u64 },
    #[error("metadata key {key:?}: arrays nested deeper than {max} levels")]
    TooDeep { key: String, max: usize },
    #[error("metadata key {key:?} appears twice (second at offset {offset})")]
    DuplicateKey { key: String, offset: u64 },
    #[error("metadata key {key:?}: expected {expected}, found {found}")]
    WrongKeyType {
        key: String,
        expected: &'static str,
        found: &'static str,
    },
    #[error("general.alignment = {value} is not a power of two between 1 and 1 GiB")]
    BadAlignment { value: u64 },
    #[error("tensor {name:?}: ggml type id {type_id} is not supported by ds4")]
    UnknownTensorType { name: String, type_id: u32 },
    #[error("tensor {name:?}: {problem}")]
    BadTensor { name: String, problem: String },
    #[error("tensor name {name:?} appears twice")]
    DuplicateTensor { name: String },
    #[error("tensors {first:?} (bytes {first_start}..{first_end}) and {second:?} (from byte {second_start}) overlap in the data section")]
    Overlap {
        first: String,
        first_start: u64,
        first_end: u64,
        second: String,
        second_start: u64,
    },
    #[error("split model: {problem}")]
    Split { problem: String },
}

impl GgufError {
    pub(crate) fn in_file(self, path: &std::path::Path) -> GgufError {
        match self {
            e @ (GgufError::Io { .. } | GgufError::InFile { .. }) => e,
            other => GgufError::InFile {
                path: path.to_path_buf(),
                source: Box::new(other),
            },
        }
    }
}
