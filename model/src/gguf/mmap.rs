//! Read-only memory maps of model files.
//!
//! This is the one place in `ds4-model` that uses `unsafe`: mapping a file
//! is unsafe because another process could truncate or rewrite it while it
//! is mapped. Model files are treated as immutable while served (the owner
//! records their size and mtime in the manifest); a file changed under a
//! running process is an operator error that can fault the process, exactly
//! as with every mmap-based inference engine.
#![allow(unsafe_code)]

use std::fs::File;
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
    let file = File::open(path).map_err(io)?;
    // Opening a directory succeeds on Unix and mapping it fails with a
    // cryptic ENODEV; say what is wrong instead.
    if !file.metadata().map_err(io)?.is_file() {
        return Err(io(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a regular file (a directory?); pass the .gguf file, or the first shard of a split model",
        )));
    }
    // SAFETY: the mapping is read-only and model files are not modified while
    // in use (see the module doc); all reads through it are bounds-checked.
    let map = unsafe { Mmap::map(&file) }.map_err(io)?;
    Ok(Arc::new(map))
}
