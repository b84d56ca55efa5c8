//! Importing CUDA VMM regions exported by the weight owner: import the
//! POSIX fd, reserve, map read-only. The only module of the worker that
//! calls the CUDA driver; handles live in [`ImportedRegion`], whose `Drop`
//! is the only release path. The driver is loaded at run time: without
//! one, [`VmmDevice::open`] fails with a clear error.
#![allow(unsafe_code)]

use std::ffi::c_void;
use std::os::fd::{AsRawFd, OwnedFd};

use cudarc::driver::sys::{self, CUresult};

#[derive(Debug, thiserror::Error)]
pub enum VmmError {
    #[error("no CUDA driver (libcuda.so.1) on this machine")]
    NoDriver,
    #[error("CUDA {call} failed: {code:?}")]
    Cuda { call: &'static str, code: CUresult },
    #[error("no CUDA device with UUID {uuid} on this machine ({count} devices visible)")]
    NoDevice { uuid: String, count: i32 },
}

fn check(call: &'static str, code: CUresult) -> Result<(), VmmError> {
    if code == CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(VmmError::Cuda { call, code })
    }
}

fn uuid_string(u: &sys::CUuuid) -> String {
    let b: Vec<u8> = u.bytes.iter().map(|&c| c as u8).collect();
    let hex =
        |r: std::ops::Range<usize>| -> String { b[r].iter().map(|x| format!("{x:02x}")).collect() };
    format!(
        "GPU-{}-{}-{}-{}-{}",
        hex(0..4),
        hex(4..6),
        hex(6..8),
        hex(8..10),
        hex(10..16)
    )
}

/// The device the owner's regions live on, with its primary context
/// current on the calling thread.
pub struct VmmDevice {
    dev: sys::CUdevice,
    ordinal: i32,
}

impl VmmDevice {
    /// Open the device with the owner's UUID.
    pub fn open(uuid: &str) -> Result<VmmDevice, VmmError> {
        // SAFETY: probes whether the driver library loads.
        if !unsafe { sys::is_culib_present() } {
            return Err(VmmError::NoDriver);
        }
        // SAFETY: flags 0; may be called repeatedly.
        check("cuInit", unsafe { sys::cuInit(0) })?;
        let mut count = 0i32;
        // SAFETY: valid out-pointer.
        check("cuDeviceGetCount", unsafe {
            sys::cuDeviceGetCount(&mut count)
        })?;
        for ordinal in 0..count {
            let mut dev: sys::CUdevice = 0;
            let mut u = sys::CUuuid { bytes: [0; 16] };
            // SAFETY: valid out-pointers, ordinal below the count.
            unsafe {
                check("cuDeviceGet", sys::cuDeviceGet(&mut dev, ordinal))?;
                check("cuDeviceGetUuid", sys::cuDeviceGetUuid_v2(&mut u, dev))?;
            }
            if uuid_string(&u) == uuid {
                let mut ctx: sys::CUcontext = std::ptr::null_mut();
                // SAFETY: valid out-pointer; released in Drop.
                check("cuDevicePrimaryCtxRetain", unsafe {
                    sys::cuDevicePrimaryCtxRetain(&mut ctx, dev)
                })?;
                let d = VmmDevice { dev, ordinal };
                // SAFETY: the context was just retained.
                check("cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(ctx) })?;
                return Ok(d);
            }
        }
        Err(VmmError::NoDevice {
            uuid: uuid.into(),
            count,
        })
    }

    /// Import one exported allocation of `bytes` and map it read-only.
    pub fn import(&self, fd: &OwnedFd, bytes: u64) -> Result<ImportedRegion, VmmError> {
        let size = bytes as usize;
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: for POSIX fd handles the "pointer" argument carries the
        // descriptor value; the driver dups what it needs.
        check("cuMemImportFromShareableHandle", unsafe {
            sys::cuMemImportFromShareableHandle(
                &mut handle,
                fd.as_raw_fd() as usize as *mut c_void,
                sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
            )
        })?;
        let mut r = ImportedRegion {
            handle,
            ptr: 0,
            size,
            mapped: false,
        };
        // SAFETY: valid out-pointer; freed in Drop.
        check("cuMemAddressReserve", unsafe {
            sys::cuMemAddressReserve(&mut r.ptr, size, 0, 0, 0)
        })?;
        // SAFETY: reserved range and imported handle of `size` bytes.
        check("cuMemMap", unsafe {
            sys::cuMemMap(r.ptr, size, 0, handle, 0)
        })?;
        r.mapped = true;
        // SAFETY: plain-old-data struct; all-zero is its default.
        let mut access: sys::CUmemAccessDesc = unsafe { std::mem::zeroed() };
        access.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        access.location.id = self.ordinal;
        access.flags = sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READ;
        // SAFETY: the range is mapped; one descriptor.
        check("cuMemSetAccess", unsafe {
            sys::cuMemSetAccess(r.ptr, size, &access, 1)
        })?;
        Ok(r)
    }

    /// Copy `out.len()` bytes at `offset` of a region back to the host.
    pub fn read(&self, r: &ImportedRegion, offset: u64, out: &mut [u8]) -> Result<(), VmmError> {
        assert!(
            offset as usize + out.len() <= r.size,
            "read out of the region"
        );
        // SAFETY: the source range lies in the mapped region; `out` is a
        // valid host buffer of the given length.
        check("cuMemcpyDtoH", unsafe {
            sys::cuMemcpyDtoH_v2(out.as_mut_ptr().cast::<c_void>(), r.ptr + offset, out.len())
        })
    }
}

impl Drop for VmmDevice {
    fn drop(&mut self) {
        // SAFETY: retained in `open`.
        unsafe { sys::cuDevicePrimaryCtxRelease_v2(self.dev) };
    }
}

/// An imported region, mapped read-only at a device address.
pub struct ImportedRegion {
    handle: sys::CUmemGenericAllocationHandle,
    ptr: sys::CUdeviceptr,
    size: usize,
    mapped: bool,
}

impl ImportedRegion {
    /// The device address.
    pub fn device_ptr(&self) -> u64 {
        self.ptr
    }

    /// `len` bytes at `offset` of this region as weight bytes a GPU backend
    /// binds in place; `keep` must keep this region mapped (it owns it).
    /// `None` when the range is outside the region.
    pub fn device_bytes(
        &self,
        offset: u64,
        len: u64,
        keep: std::sync::Arc<dyn std::any::Any + Send + Sync>,
    ) -> Option<ds4_kernels::DeviceBytes> {
        let end = offset.checked_add(len)?;
        if end > self.size as u64 {
            return None;
        }
        // SAFETY: the range lies inside this region, imported and mapped
        // readable in the device's primary context; `keep` owns the region,
        // so it stays mapped while the bytes are in use.
        Some(unsafe { ds4_kernels::DeviceBytes::new(self.ptr + offset, len as usize, keep) })
    }
}

impl Drop for ImportedRegion {
    fn drop(&mut self) {
        // SAFETY: each call undoes one step of `VmmDevice::import`.
        unsafe {
            if self.mapped {
                sys::cuMemUnmap(self.ptr, self.size);
            }
            if self.ptr != 0 {
                sys::cuMemAddressFree(self.ptr, self.size);
            }
            sys::cuMemRelease(self.handle);
        }
    }
}
