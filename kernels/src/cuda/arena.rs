//! Memory the CUDA backend hands out per forward pass: device bump regions
//! (tensors and uploads; per-op scratch) and pinned host staging for
//! host-to-device copies.
//!
//! Addresses are deterministic: a pass that makes the same requests as an
//! earlier one gets the same addresses, so its recorded command list is
//! equal to the earlier one and a CUDA graph captured from it can be
//! replayed (see [`super::queue`]). A region grows by adding a chunk and
//! is folded back into one chunk of the total size at its next reset (the
//! caller issues pending work first: freeing is stream-ordered).

use std::sync::Arc;

use cudarc::driver::{result, CudaContext, CudaSlice, CudaStream};

use super::dev_err;
use crate::backend::BackendError;

/// Alignment of every allocation (covers vector loads of any width).
pub(super) const ALIGN: usize = 256;

/// A device bump allocator over one or more chunks.
pub struct Region {
    what: &'static str,
    min_chunk: usize,
    chunks: Vec<CudaSlice<u8>>,
    /// Bytes used in the last chunk.
    used: usize,
}

impl Region {
    pub fn new(what: &'static str, min_chunk: usize) -> Region {
        Region {
            what,
            min_chunk,
            chunks: Vec::new(),
            used: 0,
        }
    }

    /// `bytes` (at least one) of uninitialized device memory.
    pub fn alloc(&mut self, stream: &Arc<CudaStream>, bytes: usize) -> Result<u64, BackendError> {
        let bytes = bytes.max(1).next_multiple_of(ALIGN);
        if let Some(last) = self.chunks.last() {
            if self.used + bytes <= last.len() {
                let p = ptr(last, stream) + self.used as u64;
                self.used += bytes;
                return Ok(p);
            }
        }
        // Grow by half of what is held (or the request): the chunks of a
        // first pass are folded into one at the next reset, so the region
        // settles at most about 1.5x the largest pass's need; doubling
        // left it at up to 3x (24 GB of tensors for an 8 GB prefill chunk).
        let size = bytes.max(self.total() / 2).max(self.min_chunk);
        // SAFETY: region memory is only read after a recorded command wrote it.
        let chunk = unsafe { stream.alloc::<u8>(size) }
            .map_err(|e| dev_err(&format!("allocating {size} bytes of {}", self.what), e))?;
        let p = ptr(&chunk, stream);
        self.chunks.push(chunk);
        self.used = bytes;
        Ok(p)
    }

    /// Whether [`Region::reset`] frees chunks (pending work that uses them
    /// must be issued first).
    pub fn needs_fold(&self) -> bool {
        self.chunks.len() > 1
    }

    /// Forgets every allocation; folds several chunks into one.
    pub fn reset(&mut self, stream: &Arc<CudaStream>) -> Result<(), BackendError> {
        self.used = 0;
        if self.needs_fold() {
            let total = self.total();
            self.chunks.clear();
            self.alloc(stream, total)?;
            self.used = 0;
        }
        Ok(())
    }

    fn total(&self) -> usize {
        self.chunks.iter().map(|c| c.len()).sum()
    }
}

fn ptr(s: &CudaSlice<u8>, stream: &CudaStream) -> u64 {
    use cudarc::driver::DevicePtr;
    s.device_ptr(stream).0
}

/// Page-locked host memory from `cuMemHostAlloc`.
struct Pinned {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: a plain host allocation; the staging area that owns it is only
// used under the backend's lock.
unsafe impl Send for Pinned {}

impl Pinned {
    /// `len` bytes (the context must be current on this thread).
    fn alloc(len: usize) -> Result<Pinned, BackendError> {
        // SAFETY: a fresh allocation, written before it is read.
        let p = unsafe { result::malloc_host(len, 0) }
            .map_err(|e| dev_err(&format!("allocating {len} bytes of pinned staging"), e))?;
        Ok(Pinned { ptr: p.cast(), len })
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        // SAFETY: allocated by malloc_host and freed once; staging is only
        // dropped or folded after the stream has finished reading it.
        let _ = unsafe { result::free_host(self.ptr.cast()) };
    }
}

/// Pinned host memory that device-to-host copies land in, grown on
/// demand: a copy into pageable memory goes through the driver's own
/// staging (SmolLM2's logits, 196 KB, after every decode step).
#[derive(Default)]
pub struct ReadBack {
    buf: Option<Pinned>,
}

impl ReadBack {
    /// The host address of at least `bytes` bytes of pinned memory (the
    /// context is bound to this thread).
    pub fn reserve(&mut self, bytes: usize) -> Result<*mut u8, BackendError> {
        match &self.buf {
            Some(b) if b.len >= bytes => Ok(b.ptr),
            _ => {
                self.buf = None;
                let b = Pinned::alloc(bytes.max(1).next_power_of_two())?;
                let ptr = b.ptr;
                self.buf = Some(b);
                Ok(ptr)
            }
        }
    }
}

/// Pinned host memory that host-to-device copies read from: the data of a
/// recorded copy sits here until the stream has executed it, so the area
/// is only reset after a synchronization.
#[derive(Default)]
pub struct Staging {
    chunks: Vec<Pinned>,
    used: usize,
}

impl Staging {
    /// Copies `data` into staging; returns its host address.
    pub fn put(&mut self, ctx: &CudaContext, data: &[u8]) -> Result<usize, BackendError> {
        let bytes = data.len().max(1).next_multiple_of(16);
        let fits = self
            .chunks
            .last()
            .is_some_and(|c| self.used + bytes <= c.len);
        if !fits {
            let len = bytes.max(2 * self.total()).max(1 << 16);
            ctx.bind_to_thread()
                .map_err(|e| dev_err("binding the CUDA context", e))?;
            self.chunks.push(Pinned::alloc(len)?);
            self.used = 0;
        }
        let c = self.chunks.last().expect("a chunk");
        // SAFETY: `used + data.len() <= len` (checked above); nothing else
        // references this part of the chunk until the copy is recorded.
        let dst = unsafe { c.ptr.add(self.used) };
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), dst, data.len()) };
        self.used += bytes;
        Ok(dst as usize)
    }

    /// Forgets the data (the stream has executed every copy from it);
    /// folds several chunks into one. The caller has bound the context.
    pub fn reset(&mut self) {
        self.used = 0;
        if self.chunks.len() > 1 {
            let total = self.total();
            self.chunks.clear();
            // On failure the next put allocates again (and reports it).
            if let Ok(p) = Pinned::alloc(total) {
                self.chunks.push(p);
            }
        }
    }

    fn total(&self) -> usize {
        self.chunks.iter().map(|c| c.len).sum()
    }
}
