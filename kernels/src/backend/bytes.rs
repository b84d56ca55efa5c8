//! Where a weight's bytes are: host memory shared without copying
//! ([`HostBytes`]), GPU memory imported from the weight owner
//! ([`DeviceBytes`]), and a weight as the model file describes it
//! ([`WeightSource`]).

use std::sync::Arc;

use crate::quant::GgmlType;

/// Bytes of a weight that live in host memory (a memory-mapped file, a
/// shared-memory region, or an owned buffer), shared without copying.
#[derive(Clone)]
pub struct HostBytes {
    owner: Arc<dyn AsRef<[u8]> + Send + Sync>,
    start: usize,
    len: usize,
}

impl HostBytes {
    /// A view of `owner[start..start + len]`; `None` when out of range.
    pub fn new(
        owner: Arc<dyn AsRef<[u8]> + Send + Sync>,
        start: usize,
        len: usize,
    ) -> Option<HostBytes> {
        let end = start.checked_add(len)?;
        ((*owner).as_ref().len() >= end).then_some(HostBytes { owner, start, len })
    }

    /// `self[start..start + len]`, sharing the same owner; `None` when out
    /// of range.
    pub fn slice(&self, start: usize, len: usize) -> Option<HostBytes> {
        let end = start.checked_add(len)?;
        (end <= self.len).then(|| HostBytes {
            owner: self.owner.clone(),
            start: self.start + start,
            len,
        })
    }

    /// Owned bytes (tests, small derived tensors).
    pub fn from_vec(v: Vec<u8>) -> HostBytes {
        let len = v.len();
        HostBytes {
            owner: Arc::new(v),
            start: 0,
            len,
        }
    }

    pub fn as_slice(&self) -> &[u8] {
        &(*self.owner).as_ref()[self.start..self.start + self.len]
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl std::fmt::Debug for HostBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HostBytes({} bytes at {})", self.len, self.start)
    }
}

/// Bytes of a weight already in GPU memory (imported from the weight
/// owner), which a GPU backend binds in place instead of uploading.
#[derive(Clone)]
pub struct DeviceBytes {
    ptr: u64,
    len: usize,
    owner: Arc<dyn std::any::Any + Send + Sync>,
}

impl DeviceBytes {
    /// # Safety
    /// `ptr .. ptr + len` must be device memory readable in the primary
    /// context of the device the binding backend runs on, holding the
    /// tensor's GGUF bytes, mapped and unchanged while `owner` lives.
    #[allow(unsafe_code)]
    pub unsafe fn new(
        ptr: u64,
        len: usize,
        owner: Arc<dyn std::any::Any + Send + Sync>,
    ) -> DeviceBytes {
        DeviceBytes { ptr, len, owner }
    }

    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// `self[start .. start + len]`; `None` when out of range.
    pub fn slice(&self, start: usize, len: usize) -> Option<DeviceBytes> {
        let end = start.checked_add(len)?;
        (end <= self.len).then(|| DeviceBytes {
            ptr: self.ptr + start as u64,
            len,
            owner: self.owner.clone(),
        })
    }

    /// What keeps the memory mapped.
    pub fn owner(&self) -> Arc<dyn std::any::Any + Send + Sync> {
        self.owner.clone()
    }
}

impl std::fmt::Debug for DeviceBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeviceBytes({} bytes at {:#x})", self.len, self.ptr)
    }
}

/// A weight as the model file stores it, to be bound by a backend.
#[derive(Clone, Debug)]
pub struct WeightSource {
    pub name: String,
    pub ggml_type: GgmlType,
    /// `[n_out, n_in]` for matrices (rows first), `[n]` for vectors.
    pub rows: usize,
    pub cols: usize,
    pub bytes: HostBytes,
    /// The same bytes in GPU memory, when the weight owner placed them
    /// there (a GPU backend binds them in place; the CPU backend reads
    /// `bytes`).
    pub device: Option<DeviceBytes>,
}
