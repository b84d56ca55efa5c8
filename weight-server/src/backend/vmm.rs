//! CUDA VMM regions: `cuMemCreate` allocations exportable as POSIX file
//! descriptors, mapped read-write in the owner for the upload, filled
//! through pinned staging buffers.
//!
//! This is the only module of the owner that calls the CUDA driver. Raw
//! handles live in owning types ([`Device`], [`Allocation`], [`Stager`])
//! whose `Drop` is the only release path. The driver library is loaded at
//! run time, so this builds and runs on machines without CUDA: there
//! [`Device::open`] fails with [`VmmError::NoDriver`].
#![allow(unsafe_code)]

use std::ffi::c_void;
use std::os::fd::{FromRawFd, OwnedFd};

use cudarc::driver::sys::{self, CUresult};

#[derive(Debug, thiserror::Error)]
pub enum VmmError {
    #[error("the CUDA driver library (libcuda.so.1) is not installed on this machine; use --backend host")]
    NoDriver,
    #[error("CUDA {call} failed: {code:?}")]
    Cuda { call: &'static str, code: CUresult },
    #[error("CUDA device {ordinal} does not exist ({count} visible); pick one with --device")]
    NoDevice { ordinal: u32, count: i32 },
}

fn check(call: &'static str, code: CUresult) -> Result<(), VmmError> {
    if code == CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(VmmError::Cuda { call, code })
    }
}

/// Initialise the driver; `Err` when there is no driver or device.
fn init() -> Result<i32, VmmError> {
    // SAFETY: only probes whether the shared library can be loaded.
    if !unsafe { sys::is_culib_present() } {
        return Err(VmmError::NoDriver);
    }
    // SAFETY: cuInit takes flags 0 and may be called repeatedly.
    check("cuInit", unsafe { sys::cuInit(0) })?;
    let mut count = 0i32;
    // SAFETY: `count` is a valid out-pointer.
    check("cuDeviceGetCount", unsafe {
        sys::cuDeviceGetCount(&mut count)
    })?;
    Ok(count)
}

/// Whether a CUDA device is usable (driver present, at least one device).
pub fn usable() -> bool {
    matches!(init(), Ok(n) if n > 0)
}

fn allocation_prop(ordinal: i32) -> sys::CUmemAllocationProp {
    // SAFETY: the struct is plain old data (integers and a null pointer);
    // all-zero is its documented default.
    let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
    prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.requestedHandleTypes =
        sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    prop.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = ordinal;
    prop
}

/// A CUDA device with its primary context current on the opening thread.
pub struct Device {
    pub ordinal: u32,
    dev: sys::CUdevice,
    pub uuid: String,
    /// `sm_XY`.
    pub arch: String,
}

impl Device {
    pub fn open(ordinal: u32) -> Result<Device, VmmError> {
        let count = init()?;
        if ordinal as i32 >= count {
            return Err(VmmError::NoDevice { ordinal, count });
        }
        let mut dev: sys::CUdevice = 0;
        // SAFETY: valid out-pointer, ordinal checked against the count.
        check("cuDeviceGet", unsafe {
            sys::cuDeviceGet(&mut dev, ordinal as i32)
        })?;
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: valid out-pointer; released in Drop.
        check("cuDevicePrimaryCtxRetain", unsafe {
            sys::cuDevicePrimaryCtxRetain(&mut ctx, dev)
        })?;
        // From here on, `device` releases the context on every return path.
        let mut device = Device {
            ordinal,
            dev,
            uuid: String::new(),
            arch: String::new(),
        };
        // SAFETY: `ctx` was just retained for this device.
        check("cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(ctx) })?;
        let mut uuid: sys::CUuuid = sys::CUuuid { bytes: [0; 16] };
        // SAFETY: valid out-pointer.
        check("cuDeviceGetUuid", unsafe {
            sys::cuDeviceGetUuid_v2(&mut uuid, dev)
        })?;
        let (mut major, mut minor) = (0i32, 0i32);
        // SAFETY: valid out-pointers and attributes.
        unsafe {
            check(
                "cuDeviceGetAttribute",
                sys::cuDeviceGetAttribute(
                    &mut major,
                    sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                    dev,
                ),
            )?;
            check(
                "cuDeviceGetAttribute",
                sys::cuDeviceGetAttribute(
                    &mut minor,
                    sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
                    dev,
                ),
            )?;
        }
        let b: Vec<u8> = uuid.bytes.iter().map(|&c| c as u8).collect();
        let hex = |r: std::ops::Range<usize>| -> String {
            b[r].iter().map(|x| format!("{x:02x}")).collect()
        };
        // Fill in the guard itself: building a new `Device` from it would
        // drop the guard and release the context this one still needs.
        device.uuid = format!(
            "GPU-{}-{}-{}-{}-{}",
            hex(0..4),
            hex(4..6),
            hex(6..8),
            hex(8..10),
            hex(10..16)
        );
        device.arch = format!("sm_{major}{minor}");
        Ok(device)
    }

    /// (free, total) device memory in bytes.
    pub fn mem_info(&self) -> Result<(u64, u64), VmmError> {
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: valid out-pointers; the context is current.
        check("cuMemGetInfo", unsafe {
            sys::cuMemGetInfo_v2(&mut free, &mut total)
        })?;
        Ok((free as u64, total as u64))
    }

    /// The recommended allocation granularity for exportable allocations.
    pub fn granularity(&self) -> Result<u64, VmmError> {
        let prop = allocation_prop(self.ordinal as i32);
        let mut g = 0usize;
        // SAFETY: valid out-pointer and property struct.
        check("cuMemGetAllocationGranularity", unsafe {
            sys::cuMemGetAllocationGranularity(
                &mut g,
                &prop,
                sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_RECOMMENDED,
            )
        })?;
        Ok(g.max(1) as u64)
    }

    /// Create, export and map (read-write) `bytes` of device memory.
    pub fn allocate(&self, bytes: u64) -> Result<Allocation, VmmError> {
        let size = bytes as usize;
        let prop = allocation_prop(self.ordinal as i32);
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: valid out-pointer and property; size is a granularity multiple.
        check("cuMemCreate", unsafe {
            sys::cuMemCreate(&mut handle, size, &prop, 0)
        })?;
        let mut a = Allocation {
            handle,
            ptr: 0,
            size,
            fd: None,
        };
        let mut raw_fd: i32 = -1;
        // SAFETY: the handle type asks for an int file descriptor, written
        // to `raw_fd`.
        check("cuMemExportToShareableHandle", unsafe {
            sys::cuMemExportToShareableHandle(
                (&mut raw_fd as *mut i32).cast::<c_void>(),
                handle,
                sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                0,
            )
        })?;
        // SAFETY: the driver returned a new descriptor that we now own.
        a.fd = Some(unsafe { OwnedFd::from_raw_fd(raw_fd) });
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: valid out-pointer; freed in Drop.
        check("cuMemAddressReserve", unsafe {
            sys::cuMemAddressReserve(&mut ptr, size, 0, 0, 0)
        })?;
        a.ptr = ptr;
        // SAFETY: range reserved above, handle of the same size.
        check("cuMemMap", unsafe {
            sys::cuMemMap(ptr, size, 0, handle, 0)
        })?;
        let access = sys::CUmemAccessDesc {
            location: prop.location,
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: the range is mapped; one access descriptor.
        if let Err(e) = check("cuMemSetAccess", unsafe {
            sys::cuMemSetAccess(ptr, size, &access, 1)
        }) {
            // SAFETY: mapped above; unmapping before Drop frees the range.
            unsafe { sys::cuMemUnmap(ptr, size) };
            return Err(e);
        }
        Ok(a)
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        // SAFETY: retained in `open`.
        unsafe { sys::cuDevicePrimaryCtxRelease_v2(self.dev) };
    }
}

/// One exported device allocation, mapped in this process.
pub struct Allocation {
    handle: sys::CUmemGenericAllocationHandle,
    ptr: sys::CUdeviceptr,
    size: usize,
    fd: Option<OwnedFd>,
}

impl Allocation {
    pub fn fd(&self) -> &OwnedFd {
        self.fd.as_ref().expect("exported at creation")
    }

    pub fn bytes(&self) -> u64 {
        self.size as u64
    }
}

impl Drop for Allocation {
    fn drop(&mut self) {
        // SAFETY: each step undoes one step of `Device::allocate`; the
        // pointer is only non-zero once reserved and mapped.
        unsafe {
            if self.ptr != 0 {
                sys::cuMemUnmap(self.ptr, self.size);
                sys::cuMemAddressFree(self.ptr, self.size);
            }
            sys::cuMemRelease(self.handle);
        }
    }
}

/// Double-buffered upload through pinned host memory: copying the next
/// chunk out of the file mapping (the file read) overlaps the DMA of the
/// previous one.
pub struct Stager {
    bufs: [*mut c_void; 2],
    streams: [sys::CUstream; 2],
    cap: usize,
    next: usize,
}

impl Stager {
    pub fn new(cap: usize) -> Result<Stager, VmmError> {
        let mut s = Stager {
            bufs: [std::ptr::null_mut(); 2],
            streams: [std::ptr::null_mut(); 2],
            cap,
            next: 0,
        };
        for i in 0..2 {
            // SAFETY: valid out-pointers; freed in Drop (null is skipped).
            check("cuMemHostAlloc", unsafe {
                sys::cuMemHostAlloc(&mut s.bufs[i], cap, 0)
            })?;
            check("cuStreamCreate", unsafe {
                sys::cuStreamCreate(&mut s.streams[i], 0)
            })?;
        }
        Ok(s)
    }

    /// Copy `data` to `dst + offset`.
    pub fn upload(&mut self, dst: &Allocation, offset: u64, data: &[u8]) -> Result<(), VmmError> {
        assert!(
            offset as usize + data.len() <= dst.size,
            "upload out of the region"
        );
        let mut at = offset as usize;
        for chunk in data.chunks(self.cap) {
            let i = self.next;
            self.next ^= 1;
            // SAFETY: the stream's previous copy out of bufs[i] must end
            // before the buffer is rewritten; the buffer holds `cap` bytes
            // and the destination range lies inside the mapped allocation.
            unsafe {
                check(
                    "cuStreamSynchronize",
                    sys::cuStreamSynchronize(self.streams[i]),
                )?;
                std::ptr::copy_nonoverlapping(
                    chunk.as_ptr(),
                    self.bufs[i].cast::<u8>(),
                    chunk.len(),
                );
                check(
                    "cuMemcpyHtoDAsync",
                    sys::cuMemcpyHtoDAsync_v2(
                        dst.ptr + at as u64,
                        self.bufs[i],
                        chunk.len(),
                        self.streams[i],
                    ),
                )?;
            }
            at += chunk.len();
        }
        Ok(())
    }

    /// Wait for every copy.
    pub fn finish(&mut self) -> Result<(), VmmError> {
        for s in self.streams {
            if !s.is_null() {
                // SAFETY: a stream created in `new`.
                check("cuStreamSynchronize", unsafe {
                    sys::cuStreamSynchronize(s)
                })?;
            }
        }
        Ok(())
    }
}

impl Drop for Stager {
    fn drop(&mut self) {
        let _ = self.finish();
        for i in 0..2 {
            // SAFETY: created in `new`; no copy is pending after finish.
            unsafe {
                if !self.streams[i].is_null() {
                    sys::cuStreamDestroy_v2(self.streams[i]);
                }
                if !self.bufs[i].is_null() {
                    sys::cuMemFreeHost(self.bufs[i]);
                }
            }
        }
    }
}
