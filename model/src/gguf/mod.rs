//! GGUF reader: memory-mapped, versions 2 and 3, split models opened from
//! their first shard as one logical model.
//!
//! Format: <https://github.com/ggml-org/ggml/blob/master/docs/gguf.md>.
//! The header is parsed with bounds checks on every read ([`parse`]); tensor
//! placement is checked against each shard's data section before any
//! tensor is handed out, so [`GgufFile::tensor_data`] never fails.
//! Files are opened only if they are regular files ([`open_regular`]);
//! [`check_tensors`] scans the tensor data itself (`--check-tensors`).

mod check;
mod error;
mod mmap;
mod parse;
mod regular;
mod split;
mod value;
pub mod writer;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ds4_kernels::quant::GgmlType;
use memmap2::Mmap;

pub use check::{check_tensor, check_tensors};
pub use error::GgufError;
pub use parse::{
    parse_header, Header, RawTensorInfo, DEFAULT_ALIGNMENT, MAX_ARRAY_DEPTH, MAX_ARRAY_ELEMENTS,
    MAX_DIMS,
};
pub use regular::open_regular;
pub use value::{MetaValue, Metadata};

/// One tensor of a (possibly split) model.
#[derive(Clone, Debug)]
pub struct TensorInfo {
    pub name: String,
    /// Dimensions in ggml order: `shape[0]` is the contiguous row length.
    pub shape: Vec<u64>,
    pub ggml_type: GgmlType,
    /// Index into [`GgufFile::shards`].
    pub shard: usize,
    /// Absolute byte offset of the tensor's data inside its shard file.
    pub file_offset: u64,
    pub n_bytes: u64,
}

impl TensorInfo {
    pub fn n_elements(&self) -> u64 {
        self.shape.iter().product()
    }
}

/// One file of a model.
#[derive(Debug)]
pub struct Shard {
    pub path: PathBuf,
    pub version: u32,
    pub alignment: u64,
    pub data_offset: u64,
    map: Arc<Mmap>,
}

impl Shard {
    /// The whole file, memory-mapped.
    pub fn bytes(&self) -> &[u8] {
        &self.map
    }

    /// A shared handle to the mapping, for holders that outlive a borrow.
    pub fn map(&self) -> &Arc<Mmap> {
        &self.map
    }

    /// The header bytes (everything before the data section). A file
    /// without tensors may end before the padding that would precede its
    /// data section; then this is the whole file.
    pub fn header_bytes(&self) -> &[u8] {
        let end =
            usize::try_from(self.data_offset).map_or(self.map.len(), |d| d.min(self.map.len()));
        &self.map[..end]
    }

    fn open(path: &Path) -> Result<(Shard, Header), GgufError> {
        let map = mmap::map_file(path)?;
        let header = parse_header(&map).map_err(|e| e.in_file(path))?;
        let len = map.len() as u64;
        if header.data_offset > len && !header.tensors.is_empty() {
            return Err(GgufError::Truncated {
                what: "data section",
                offset: header.data_offset,
                needed: 1,
                len,
            }
            .in_file(path));
        }
        let data_len = len.saturating_sub(header.data_offset);
        parse::check_tensors(&header.tensors, header.alignment, data_len)
            .map_err(|e| e.in_file(path))?;
        let shard = Shard {
            path: path.to_path_buf(),
            version: header.version,
            alignment: header.alignment,
            data_offset: header.data_offset,
            map,
        };
        Ok((shard, header))
    }
}

/// A GGUF model: one file, or all shards of a split model.
#[derive(Debug)]
pub struct GgufFile {
    shards: Vec<Shard>,
    metadata: Metadata,
    tensors: Vec<TensorInfo>,
    by_name: std::collections::HashMap<String, usize>,
}

impl GgufFile {
    /// Open a model file. For a split model (`name-00001-of-0000N.gguf`),
    /// pass the first shard; the others are found beside it.
    pub fn open(path: &Path) -> Result<GgufFile, GgufError> {
        let (first, header) = Shard::open(path)?;
        let metadata = header.metadata;
        let mut shards = vec![first];
        let mut raw = vec![(0usize, header.tensors)];
        let others = split::other_shards(path, &metadata)?;
        for (no, other_path) in others.into_iter().enumerate() {
            let (shard, h) = Shard::open(&other_path)?;
            split::check_shard_metadata(&other_path, &h.metadata, no + 1, &metadata)?;
            raw.push((shards.len(), h.tensors));
            shards.push(shard);
        }
        let mut tensors = Vec::new();
        let mut by_name = std::collections::HashMap::new();
        for (shard_idx, list) in raw {
            let data_offset = shards[shard_idx].data_offset;
            for t in list {
                if by_name.insert(t.name.clone(), tensors.len()).is_some() {
                    return Err(GgufError::DuplicateTensor { name: t.name });
                }
                tensors.push(TensorInfo {
                    name: t.name,
                    shape: t.shape,
                    ggml_type: t.ggml_type,
                    shard: shard_idx,
                    file_offset: data_offset + t.offset,
                    n_bytes: t.n_bytes,
                });
            }
        }
        split::check_tensor_total(&metadata, tensors.len())?;
        Ok(GgufFile {
            shards,
            metadata,
            tensors,
            by_name,
        })
    }

    /// Metadata of the model (the first shard's header).
    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    pub fn shards(&self) -> &[Shard] {
        &self.shards
    }

    /// Tensors in file order (shard by shard).
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.by_name.get(name).map(|&i| &self.tensors[i])
    }

    /// The bytes of a tensor of this file (checked at open time).
    ///
    /// # Panics
    ///
    /// If `t` did not come from this file's [`GgufFile::tensors`] (another
    /// file's tensor, or one built by hand, may lie outside this mapping).
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        let start = t.file_offset as usize;
        &self.shards[t.shard].bytes()[start..start + t.n_bytes as usize]
    }

    /// `general.architecture`, if present.
    pub fn architecture(&self) -> Option<&str> {
        self.metadata.get_str("general.architecture")
    }

    /// Total bytes of tensor data over all shards.
    pub fn tensor_bytes(&self) -> u64 {
        self.tensors.iter().map(|t| t.n_bytes).sum()
    }
}
