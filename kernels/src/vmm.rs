//! CUDA virtual memory management (VMM) through cudarc's raw driver
//! bindings: the one layer the weight owner and its workers share.
//!
//! The owner opens a device by ordinal, creates exportable allocations
//! ([`Device::allocate`]), maps them read-write and fills them through
//! pinned staging buffers ([`Stager`]); it hands each allocation's POSIX
//! file descriptor to workers. A worker opens the device by the UUID the
//! manifest names, imports each descriptor ([`Device::import`]) mapped
//! read-only, binds tensors in place ([`Region::device_bytes`]) and reads
//! bytes back for checks ([`Device::read`]).
//!
//! Raw handles live in owning types whose `Drop` is the only release path:
//! a region unmaps, frees its address range and releases its handle in
//! that order, whichever step its creation got to. The driver library is
//! loaded at run time, so this builds and runs on machines without CUDA:
//! there [`Device::open`] fails with [`VmmError::NoDriver`]. Messages name
//! what is missing; what to do about it depends on the caller, which adds
//! its own hint.
#![allow(unsafe_code)]

use std::ffi::c_void;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::Arc;

use cudarc::driver::sys::{self, CUresult};

use crate::backend::DeviceBytes;

#[derive(Debug, thiserror::Error)]
pub enum VmmError {
    #[error("the CUDA driver library (libcuda.so.1) is not installed on this machine")]
    NoDriver,
    #[error("CUDA {call} failed: {code:?}")]
    Cuda { call: &'static str, code: CUresult },
    #[error("CUDA device {ordinal} does not exist ({count} visible)")]
    NoOrdinal { ordinal: u32, count: i32 },
    #[error("no CUDA device with UUID {uuid} on this machine ({count} devices visible)")]
    NoUuid { uuid: String, count: i32 },
}

fn check(call: &'static str, code: CUresult) -> Result<(), VmmError> {
    if code == CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(VmmError::Cuda { call, code })
    }
}

/// Initialise the driver and count the devices; `Err` without a driver.
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

/// The driver's device handle and its `GPU-xxxxxxxx-...` UUID string.
fn device_at(ordinal: i32) -> Result<(sys::CUdevice, String), VmmError> {
    let mut dev: sys::CUdevice = 0;
    let mut uuid = sys::CUuuid { bytes: [0; 16] };
    // SAFETY: valid out-pointers; the caller checked the ordinal against
    // the device count.
    unsafe {
        check("cuDeviceGet", sys::cuDeviceGet(&mut dev, ordinal))?;
        check("cuDeviceGetUuid", sys::cuDeviceGetUuid_v2(&mut uuid, dev))?;
    }
    let b: Vec<u8> = uuid.bytes.iter().map(|&c| c as u8).collect();
    let hex =
        |r: std::ops::Range<usize>| -> String { b[r].iter().map(|x| format!("{x:02x}")).collect() };
    let uuid = format!(
        "GPU-{}-{}-{}-{}-{}",
        hex(0..4),
        hex(4..6),
        hex(6..8),
        hex(8..10),
        hex(10..16)
    );
    Ok((dev, uuid))
}

fn attribute(dev: sys::CUdevice, attr: sys::CUdevice_attribute) -> Result<i32, VmmError> {
    let mut v = 0i32;
    // SAFETY: valid out-pointer, a device handle from cuDeviceGet.
    check("cuDeviceGetAttribute", unsafe {
        sys::cuDeviceGetAttribute(&mut v, attr, dev)
    })?;
    Ok(v)
}

/// The properties of an exportable allocation on device `ordinal`.
fn allocation_prop(ordinal: i32) -> sys::CUmemAllocationProp {
    // SAFETY: the struct is plain old data (integers and a null pointer);
    // all-zero is its documented default.
    let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
    prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.requestedHandleTypes =
        sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    prop.location = location(ordinal);
    prop
}

fn location(ordinal: i32) -> sys::CUmemLocation {
    sys::CUmemLocation {
        type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
        id: ordinal,
    }
}

/// A CUDA device with its primary context retained and current on the
/// opening thread.
pub struct Device {
    dev: sys::CUdevice,
    ordinal: u32,
    uuid: String,
    /// `sm_XY`.
    arch: String,
}

impl Device {
    /// Open the device with this ordinal.
    pub fn open(ordinal: u32) -> Result<Device, VmmError> {
        let count = init()?;
        if ordinal as i32 >= count {
            return Err(VmmError::NoOrdinal { ordinal, count });
        }
        let (dev, uuid) = device_at(ordinal as i32)?;
        let major = attribute(
            dev,
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
        )?;
        let minor = attribute(
            dev,
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
        )?;
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: valid out-pointer; released in Drop.
        check("cuDevicePrimaryCtxRetain", unsafe {
            sys::cuDevicePrimaryCtxRetain(&mut ctx, dev)
        })?;
        // From here on, `device` releases the context on every return path.
        let device = Device {
            dev,
            ordinal,
            uuid,
            arch: format!("sm_{major}{minor}"),
        };
        // SAFETY: `ctx` was just retained for this device.
        check("cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(ctx) })?;
        Ok(device)
    }

    /// Open the device with this UUID (`GPU-xxxxxxxx-...`, as
    /// [`Device::uuid`] writes it).
    pub fn open_uuid(uuid: &str) -> Result<Device, VmmError> {
        let count = init()?;
        for ordinal in 0..count {
            if device_at(ordinal)?.1 == uuid {
                return Device::open(ordinal as u32);
            }
        }
        Err(VmmError::NoUuid {
            uuid: uuid.into(),
            count,
        })
    }

    pub fn ordinal(&self) -> u32 {
        self.ordinal
    }

    pub fn uuid(&self) -> &str {
        &self.uuid
    }

    /// `sm_XY`.
    pub fn arch(&self) -> &str {
        &self.arch
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

    /// Create `bytes` (a multiple of [`Device::granularity`]) of device
    /// memory, export it as a POSIX file descriptor and map it read-write
    /// here (the owner's upload).
    pub fn allocate(&self, bytes: u64) -> Result<Allocation, VmmError> {
        let size = bytes as usize;
        let prop = allocation_prop(self.ordinal as i32);
        let mut raw: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: valid out-pointer and property; size is a granularity multiple.
        check("cuMemCreate", unsafe {
            sys::cuMemCreate(&mut raw, size, &prop, 0)
        })?;
        let handle = Handle(raw);
        let mut raw_fd: i32 = -1;
        // SAFETY: the handle type asks for an int file descriptor, written
        // to `raw_fd`.
        check("cuMemExportToShareableHandle", unsafe {
            sys::cuMemExportToShareableHandle(
                (&mut raw_fd as *mut i32).cast::<c_void>(),
                handle.0,
                sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                0,
            )
        })?;
        // SAFETY: the driver returned a new descriptor that we now own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw_fd) };
        let region = self.map(handle, size, Access::ReadWrite)?;
        Ok(Allocation { region, fd })
    }

    /// Import an allocation of `bytes` exported by another process and
    /// map it read-only here (a worker's weights).
    pub fn import(&self, fd: BorrowedFd<'_>, bytes: u64) -> Result<Region, VmmError> {
        let mut raw: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: for POSIX fd handles the "pointer" argument carries the
        // descriptor value; the driver dups what it needs.
        check("cuMemImportFromShareableHandle", unsafe {
            sys::cuMemImportFromShareableHandle(
                &mut raw,
                fd.as_raw_fd() as usize as *mut c_void,
                sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
            )
        })?;
        self.map(Handle(raw), bytes as usize, Access::ReadOnly)
    }

    /// Reserve an address range for `handle`, map it and grant `access`
    /// on this device. On an error the steps taken so far are undone by
    /// their guards.
    fn map(&self, handle: Handle, size: usize, access: Access) -> Result<Region, VmmError> {
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: valid out-pointer; the range is freed by `Reservation`.
        check("cuMemAddressReserve", unsafe {
            sys::cuMemAddressReserve(&mut ptr, size, 0, 0, 0)
        })?;
        let reservation = Reservation { ptr, size };
        // SAFETY: the range was reserved above with the handle's size;
        // unmapped by `Mapping`.
        check("cuMemMap", unsafe {
            sys::cuMemMap(ptr, size, 0, handle.0, 0)
        })?;
        let mapping = Mapping { ptr, size };
        let desc = sys::CUmemAccessDesc {
            location: location(self.ordinal as i32),
            flags: match access {
                Access::ReadWrite => sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
                Access::ReadOnly => sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READ,
            },
        };
        // SAFETY: the range is mapped; one access descriptor.
        check("cuMemSetAccess", unsafe {
            sys::cuMemSetAccess(ptr, size, &desc, 1)
        })?;
        Ok(Region {
            mapping,
            reservation,
            _handle: handle,
            access,
        })
    }

    /// Copy `out.len()` bytes at `offset` of a region back to the host.
    pub fn read(&self, region: &Region, offset: u64, out: &mut [u8]) -> Result<(), VmmError> {
        assert!(
            offset as usize + out.len() <= region.size(),
            "read out of the region"
        );
        // SAFETY: the source range lies in the mapped region; `out` is a
        // valid host buffer of the given length.
        check("cuMemcpyDtoH", unsafe {
            sys::cuMemcpyDtoH_v2(
                out.as_mut_ptr().cast::<c_void>(),
                region.device_ptr() + offset,
                out.len(),
            )
        })
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        // SAFETY: retained in `open`.
        unsafe { sys::cuDevicePrimaryCtxRelease_v2(self.dev) };
    }
}

/// How a region is mapped in this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// The owner's mapping, for the upload.
    ReadWrite,
    /// A worker's mapping.
    ReadOnly,
}

/// A physical allocation handle, released on drop.
struct Handle(sys::CUmemGenericAllocationHandle);

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: created or imported once and released only here.
        unsafe { sys::cuMemRelease(self.0) };
    }
}

/// A reserved device address range, freed on drop.
struct Reservation {
    ptr: sys::CUdeviceptr,
    size: usize,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        // SAFETY: reserved once with this size; the mapping inside it is
        // dropped first (see `Region`).
        unsafe { sys::cuMemAddressFree(self.ptr, self.size) };
    }
}

/// A handle mapped into a reservation, unmapped on drop.
struct Mapping {
    ptr: sys::CUdeviceptr,
    size: usize,
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: mapped once over this whole range.
        unsafe { sys::cuMemUnmap(self.ptr, self.size) };
    }
}

/// One allocation mapped at a device address in this process.
pub struct Region {
    // Fields drop in declaration order: unmap, free the range, release
    // the handle (held only to be released).
    mapping: Mapping,
    reservation: Reservation,
    _handle: Handle,
    access: Access,
}

impl Region {
    /// The device address.
    pub fn device_ptr(&self) -> u64 {
        self.mapping.ptr
    }

    fn size(&self) -> usize {
        self.reservation.size
    }

    pub fn bytes(&self) -> u64 {
        self.size() as u64
    }

    pub fn access(&self) -> Access {
        self.access
    }

    /// `len` bytes at `offset` of this region as weight bytes a GPU backend
    /// binds in place; `keep` must keep this region mapped (it owns it).
    /// `None` when the range is outside the region.
    pub fn device_bytes(
        &self,
        offset: u64,
        len: u64,
        keep: Arc<dyn std::any::Any + Send + Sync>,
    ) -> Option<DeviceBytes> {
        let end = offset.checked_add(len)?;
        if end > self.bytes() {
            return None;
        }
        // SAFETY: the range lies inside this region, mapped readable in the
        // device's primary context; `keep` owns the region, so it stays
        // mapped while the bytes are in use.
        Some(unsafe { DeviceBytes::new(self.device_ptr() + offset, len as usize, keep) })
    }
}

/// An allocation created here, mapped read-write, with the file descriptor
/// it was exported as (what workers import).
pub struct Allocation {
    region: Region,
    fd: OwnedFd,
}

impl Allocation {
    pub fn region(&self) -> &Region {
        &self.region
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    pub fn bytes(&self) -> u64 {
        self.region.bytes()
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
    /// Two pinned buffers of `cap` bytes and a stream for each.
    pub fn new(cap: usize) -> Result<Stager, VmmError> {
        let mut s = Stager {
            bufs: [std::ptr::null_mut(); 2],
            streams: [std::ptr::null_mut(); 2],
            cap,
            next: 0,
        };
        for i in 0..2 {
            // SAFETY: valid out-pointer; freed in Drop (null is skipped).
            check("cuMemHostAlloc", unsafe {
                sys::cuMemHostAlloc(&mut s.bufs[i], cap, 0)
            })?;
            // SAFETY: valid out-pointer; destroyed in Drop (null is skipped).
            check("cuStreamCreate", unsafe {
                sys::cuStreamCreate(&mut s.streams[i], 0)
            })?;
        }
        Ok(s)
    }

    /// Copy `data` to `dst + offset`; `dst` must be mapped read-write.
    pub fn upload(&mut self, dst: &Region, offset: u64, data: &[u8]) -> Result<(), VmmError> {
        assert!(
            dst.access() == Access::ReadWrite,
            "upload into a read-only region"
        );
        assert!(
            offset as usize + data.len() <= dst.size(),
            "upload out of the region"
        );
        let mut at = offset;
        for chunk in data.chunks(self.cap) {
            let i = self.next;
            self.next ^= 1;
            // SAFETY: the stream's previous copy out of bufs[i] must end
            // before the buffer is rewritten; the buffer holds `cap` bytes
            // and the destination range lies inside the region, mapped
            // read-write.
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
                        dst.device_ptr() + at,
                        self.bufs[i],
                        chunk.len(),
                        self.streams[i],
                    ),
                )?;
            }
            at += chunk.len() as u64;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_device_is_refused_by_name() {
        // Without a driver the error names the library; with one, an
        // ordinal past the device count and an unknown UUID are named.
        // Nothing here needs a GPU.
        match Device::open(i32::MAX as u32) {
            Ok(_) => panic!("opened device {}", i32::MAX),
            Err(VmmError::NoDriver) => {
                assert!(!usable());
                let e = Device::open_uuid("GPU-x").err().expect("no driver");
                assert!(e.to_string().contains("libcuda.so.1"), "{e}");
            }
            Err(VmmError::NoOrdinal { ordinal, .. }) => {
                assert_eq!(ordinal, i32::MAX as u32);
                let e = Device::open_uuid("GPU-x").err().expect("no such UUID");
                assert!(e.to_string().contains("GPU-x"), "{e}");
            }
            // A driver without a device fails in cuInit.
            Err(e) => assert!(matches!(e, VmmError::Cuda { .. }), "{e}"),
        }
    }
}
