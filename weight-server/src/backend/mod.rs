//! Where the weights live: sealed host memfds ([`host`]) or CUDA VMM
//! allocations (`ds4_kernels::vmm`). Both hand out one file descriptor per
//! region.

pub mod host;

use std::os::fd::BorrowedFd;

use ds4_kernels::vmm::{self, VmmError};
use ds4_proto::manifest::{BackendKind, DeviceEntry};

#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("host memory")]
    Host(#[from] std::io::Error),
    /// The VMM layer's message with what an operator of the owner does
    /// about it.
    #[error("{0}{hint}", hint = vmm_hint(.0))]
    Vmm(VmmError),
}

impl From<VmmError> for BackendError {
    fn from(e: VmmError) -> BackendError {
        BackendError::Vmm(e)
    }
}

fn vmm_hint(e: &VmmError) -> &'static str {
    match e {
        VmmError::NoDriver => "; use --backend host",
        VmmError::NoOrdinal { .. } => "; pick one with --device",
        VmmError::Cuda { .. } | VmmError::NoUuid { .. } => "",
    }
}

/// The memory a backend sees, for the preflight and the log.
#[derive(Clone, Debug)]
pub struct MemoryView {
    /// What is free now (device free, or host MemAvailable).
    pub available: u64,
    pub total: u64,
    pub what: &'static str,
}

/// Host memory from `/proc/meminfo`.
pub fn host_memory() -> MemoryView {
    let text = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let field = |key: &str| -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|kb| kb.parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024)
    };
    MemoryView {
        available: field("MemAvailable:"),
        total: field("MemTotal:"),
        what: "host MemAvailable",
    }
}

/// Regions being filled or filled, one fd each.
pub enum Store {
    Host(Vec<host::HostRegion>),
    /// Fields drop in order: the allocations and staging buffers go
    /// before the device releases its context.
    Vmm {
        regions: Vec<vmm::Allocation>,
        stager: Option<vmm::Stager>,
        device: vmm::Device,
    },
}

/// Pinned staging buffer size of each of the two vmm buffers.
pub const STAGING_BYTES: usize = 64 << 20;

impl Store {
    pub fn create_host(region_bytes: &[u64]) -> Result<Store, BackendError> {
        let regions = region_bytes
            .iter()
            .enumerate()
            .map(|(i, &b)| host::HostRegion::create(i as u32, b))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Store::Host(regions))
    }

    pub fn create_vmm(device: vmm::Device, region_bytes: &[u64]) -> Result<Store, BackendError> {
        let regions = region_bytes
            .iter()
            .map(|&b| device.allocate(b))
            .collect::<Result<Vec<_>, _>>()?;
        let stager = Some(vmm::Stager::new(STAGING_BYTES)?);
        Ok(Store::Vmm {
            device,
            regions,
            stager,
        })
    }

    pub fn kind(&self) -> BackendKind {
        match self {
            Store::Host(_) => BackendKind::Host,
            Store::Vmm { .. } => BackendKind::Vmm,
        }
    }

    pub fn device(&self) -> Option<DeviceEntry> {
        match self {
            Store::Host(_) => None,
            Store::Vmm { device, .. } => Some(DeviceEntry {
                ordinal: device.ordinal(),
                uuid: device.uuid().into(),
                arch: device.arch().into(),
            }),
        }
    }

    pub fn write(&mut self, region: u32, offset: u64, data: &[u8]) -> Result<(), BackendError> {
        match self {
            Store::Host(r) => Ok(r[region as usize].write_at(offset, data)?),
            Store::Vmm {
                regions, stager, ..
            } => {
                let stager = stager.as_mut().expect("stager lives until finish");
                Ok(stager.upload(regions[region as usize].region(), offset, data)?)
            }
        }
    }

    /// Complete the upload: seal host regions, wait for device copies.
    pub fn finish(&mut self) -> Result<(), BackendError> {
        match self {
            Store::Host(r) => {
                for region in r {
                    region.seal()?;
                }
            }
            Store::Vmm { stager, .. } => {
                if let Some(mut s) = stager.take() {
                    s.finish()?;
                }
            }
        }
        Ok(())
    }

    pub fn fds(&self) -> Vec<BorrowedFd<'_>> {
        match self {
            Store::Host(r) => r.iter().map(|x| x.fd()).collect(),
            Store::Vmm { regions, .. } => regions.iter().map(|a| a.fd()).collect(),
        }
    }

    pub fn bytes_resident(&self) -> u64 {
        match self {
            Store::Host(r) => r.iter().map(|x| x.bytes()).sum(),
            Store::Vmm { regions, .. } => regions.iter().map(|a| a.bytes()).sum(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vmm_errors_say_what_to_do_with_this_owner() {
        let e = BackendError::from(VmmError::NoDriver);
        assert_eq!(
            e.to_string(),
            "the CUDA driver library (libcuda.so.1) is not installed on this machine; use --backend host"
        );
        let e = BackendError::from(VmmError::NoOrdinal {
            ordinal: 3,
            count: 1,
        });
        assert_eq!(
            e.to_string(),
            "CUDA device 3 does not exist (1 visible); pick one with --device"
        );
        assert!(std::error::Error::source(&e).is_none(), "said once");
    }
}
