//! Opening files that must be regular files: model files, their shards,
//! and any other file a ds4 process reads whole (disk KV cache entries,
//! token files). A FIFO, socket or device in their place is refused with
//! an error that says what the path is, and never blocks: opening a FIFO
//! for reading would wait for a writer forever.

use std::fs::{File, FileType, OpenOptions};
use std::io;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// Open `path` for reading if it is a regular file (symlinks followed).
///
/// The type is checked with `stat` before opening (so that no FIFO or
/// device is ever opened), and again on the opened descriptor, which is
/// opened non-blocking in case the path was replaced in between.
/// `O_NONBLOCK` has no effect on reads of a regular file. A path that is
/// not a regular file gives an [`io::ErrorKind::InvalidInput`] error
/// naming its type.
pub fn open_regular(path: &Path) -> io::Result<File> {
    check_type(std::fs::metadata(path)?.file_type())?;
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(nix::fcntl::OFlag::O_NONBLOCK.bits())
        .open(path)?;
    check_type(file.metadata()?.file_type())?;
    Ok(file)
}

fn check_type(t: FileType) -> io::Result<()> {
    if t.is_file() {
        return Ok(());
    }
    let what = if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO (named pipe)"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else {
        "not a regular file"
    };
    Err(io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("is {what}, not a regular file"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_fifos_and_directories_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("pipe.gguf");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let e = open_regular(&fifo).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(e.to_string().contains("FIFO"), "{e}");
        let e = open_regular(dir.path()).unwrap_err();
        assert!(e.to_string().contains("a directory"), "{e}");
        let e = open_regular(&dir.path().join("missing")).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        let file = dir.path().join("ok");
        std::fs::write(&file, b"x").unwrap();
        assert!(open_regular(&file).is_ok());
    }
}
