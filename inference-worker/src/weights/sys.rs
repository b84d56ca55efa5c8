//! Raw descriptor handling for weight import: receiving region fds over
//! SCM_RIGHTS and mapping sealed memfds read-only. The only module of the
//! worker's host import path with `unsafe`.
#![allow(unsafe_code)]

use std::io::IoSliceMut;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;

use ds4_proto::broker::MAX_FDS_PER_MESSAGE;
use nix::fcntl::{fcntl, FcntlArg, SealFlag};
use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags, UnixAddr};

/// Receive one broker message: one byte carrying descriptors.
pub fn recv_fds(stream: &UnixStream) -> std::io::Result<Vec<OwnedFd>> {
    let mut byte = [0u8; 1];
    let mut iov = [IoSliceMut::new(&mut byte)];
    let mut cmsg = nix::cmsg_space!([std::os::fd::RawFd; MAX_FDS_PER_MESSAGE]);
    let msg = recvmsg::<UnixAddr>(
        stream.as_raw_fd(),
        &mut iov,
        Some(&mut cmsg),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )?;
    if msg.bytes == 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "the broker closed the connection before sending the descriptors",
        ));
    }
    if msg.flags.contains(MsgFlags::MSG_CTRUNC) {
        return Err(std::io::Error::other(
            "descriptor message truncated (fd limit reached?)",
        ));
    }
    let mut fds = Vec::new();
    for c in msg.cmsgs()? {
        if let ControlMessageOwned::ScmRights(raw) = c {
            for fd in raw {
                // SAFETY: the kernel installed `fd` in this process for
                // this message; nothing else owns it.
                fds.push(unsafe { OwnedFd::from_raw_fd(fd) });
            }
        }
    }
    Ok(fds)
}

/// A read-only mapping of a sealed memfd region.
pub struct SealedMap(memmap2::Mmap);

impl AsRef<[u8]> for SealedMap {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

/// Map `len` bytes of a memfd that is sealed against writes and
/// shrinking; refuse one that is not.
pub fn map_sealed(fd: &OwnedFd, len: u64) -> std::io::Result<SealedMap> {
    let seals = SealFlag::from_bits_truncate(fcntl(fd.as_fd(), FcntlArg::F_GET_SEALS)?);
    let need = SealFlag::F_SEAL_WRITE | SealFlag::F_SEAL_SHRINK;
    if !seals.contains(need) {
        return Err(std::io::Error::other(format!(
            "region is not sealed (seals {seals:?}); refusing to map memory another process may change"
        )));
    }
    let size = nix::sys::stat::fstat(fd.as_fd())?.st_size as u64;
    if size < len {
        return Err(std::io::Error::other(format!(
            "region holds {size} bytes, the manifest says {len}"
        )));
    }
    // SAFETY: the memfd is sealed against writes and shrinking, so the
    // mapped bytes can neither change nor disappear while mapped.
    let map = unsafe { memmap2::MmapOptions::new().len(len as usize).map(fd)? };
    Ok(SealedMap(map))
}
