//! Typed errors of the GGUF reader. Every variant names what is wrong and
//! where (byte offset, key or tensor), so an operator can act on it.

use std::path::{Path, PathBuf};

use ds4_kernels::quant::GgmlType;

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
    /// Found by [`super::check_tensor`] (`--check-tensors`).
    #[error("tensor {name:?} ({ggml_type}): {} is {value} (byte {byte} of its data)", place(*.block, .field))]
    NonFinite {
        name: String,
        ggml_type: GgmlType,
        block: u64,
        /// `value` for a float tensor, else the scale's name (`d`, `dmin`, ...).
        field: &'static str,
        value: f32,
        byte: u64,
    },
}

fn place(block: u64, field: &str) -> String {
    if field == "value" {
        format!("element {block}")
    } else {
        format!("block {block}'s scale {field}")
    }
}

impl GgufError {
    /// The file the error is about, when it names one.
    pub fn path(&self) -> Option<&Path> {
        match self {
            GgufError::Io { path, .. } | GgufError::InFile { path, .. } => Some(path),
            _ => None,
        }
    }

    /// The error without the file's path in front.
    pub fn problem(&self) -> String {
        match self {
            GgufError::Io { source, .. } => source.to_string(),
            GgufError::InFile { source, .. } => source.problem(),
            other => other.to_string(),
        }
    }

    /// Whether the file does not exist.
    pub fn is_missing(&self) -> bool {
        matches!(self, GgufError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound)
    }

    /// What to do about it, for an operator; empty when the message
    /// already says (split models, unsupported versions) or when only the
    /// caller knows (a missing file: see [`GgufError::is_missing`]).
    pub fn advice(&self) -> &'static str {
        use std::io::ErrorKind;
        match self {
            GgufError::InFile { source, .. } => source.advice(),
            GgufError::Io { source, .. } => match source.kind() {
                ErrorKind::NotFound => "",
                ErrorKind::PermissionDenied => "make it readable by this user",
                ErrorKind::InvalidInput => {
                    "pass the .gguf file itself, or the first shard of a split model"
                }
                _ => "check the file and the disk it is on",
            },
            GgufError::UnsupportedVersion { .. } | GgufError::Split { .. } => "",
            GgufError::UnknownTensorType { .. } => {
                "convert the model to a supported tensor type (see the README)"
            }
            GgufError::NonFinite { .. } => {
                "the weights are damaged: download or convert the model again"
            }
            _ => "the file is damaged or not a GGUF model: download or convert it again",
        }
    }

    /// One line for an operator: which file, what is wrong, what to do.
    /// `path` names the model when the error names no file of its own;
    /// `if_missing` is the advice for a file that does not exist, which
    /// depends on who asked for it.
    pub fn report(&self, path: &Path, if_missing: &str) -> String {
        let file = self.path().unwrap_or(path).display();
        let advice = if self.is_missing() {
            if_missing
        } else {
            self.advice()
        };
        if advice.is_empty() {
            format!("model {file}: {}", self.problem())
        } else {
            format!("model {file}: {}; {advice}", self.problem())
        }
    }

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
