//! Read-only memory maps of model files.
//!
//! This is the one place in `ds4-model` that uses `unsafe`: mapping a file
//! is unsafe because another process could truncate or rewrite it while it
//! is mapped. Model files are treated as immutable while served (the owner
//! records their size and mtime in the manifest); a file changed under a
//! running process is an operator error that can fault the process, exactly
//! as with every mmap-based inference engine.
#![allow(unsafe_code)]

use std::path::Path;
use std::sync::Arc;

use memmap2::Mmap;

use super::GgufError;

/// Map `path` read-only.
pub fn map_file(path: &Path) -> Result<Arc<Mmap>, GgufError> {
    let io = |source| GgufError::Io {
        path: path.to_path_buf(),
        source,
    };
    // Only a regular file: a FIFO would block the open, a directory fails
    // to map with a cryptic ENODEV; the error says what the path is.
    let file = super::regular::open_regular(path).map_err(io)?;
    // SAFETY: the mapping is read-only and model files are not modified while
    // in use (see the module doc); all reads through it are bounds-checked.
    let map = unsafe { Mmap::map(&file) }.map_err(io)?;
    Ok(Arc::new(map))
}
