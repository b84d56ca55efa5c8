//! Host regions: sealed memfds. The owner writes each region with
//! `pwrite` (no mapping), then seals it against writes, growing and
//! shrinking; workers map the fd read-only.

use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::FileExt;

use nix::fcntl::{fcntl, FcntlArg, SealFlag};
use nix::sys::memfd::{memfd_create, MFdFlags};

pub struct HostRegion {
    file: File,
    bytes: u64,
}

impl HostRegion {
    pub fn create(id: u32, bytes: u64) -> std::io::Result<HostRegion> {
        let name = format!("ds4-region-{id}");
        let fd = memfd_create(
            name.as_str(),
            MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING,
        )?;
        let file = File::from(fd);
        file.set_len(bytes)?;
        Ok(HostRegion { file, bytes })
    }

    pub fn write_at(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        self.file.write_all_at(data, offset)
    }

    /// Forbid any further change of size or content.
    pub fn seal(&self) -> std::io::Result<()> {
        let seals = SealFlag::F_SEAL_SHRINK
            | SealFlag::F_SEAL_GROW
            | SealFlag::F_SEAL_WRITE
            | SealFlag::F_SEAL_SEAL;
        fcntl(&self.file, FcntlArg::F_ADD_SEALS(seals))?;
        Ok(())
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sealed_region_refuses_changes() {
        let r = HostRegion::create(0, 8192).unwrap();
        r.write_at(100, b"weights").unwrap();
        r.seal().unwrap();
        assert!(r.write_at(0, b"x").is_err(), "write after seal");
        let f = File::from(r.fd().try_clone_to_owned().unwrap());
        assert!(f.set_len(4096).is_err(), "shrink after seal");
        let mut buf = [0u8; 7];
        std::os::unix::fs::FileExt::read_exact_at(&f, &mut buf, 100).unwrap();
        assert_eq!(&buf, b"weights");
    }
}
