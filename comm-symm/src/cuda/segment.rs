//! VMM device memory that other local processes can map: one rank's segment and the
//! mappings of its peers' segments.
//!
//! VMM (preferred): `cuMemCreate` with a POSIX file-descriptor handle type, sized to the
//! allocation granularity; `cuMemExportToShareableHandle` gives a descriptor that travels
//! over a Unix socket (`fdpass`); a peer imports it (`cuMemImportFromShareableHandle`),
//! reserves an address range, maps and enables read/write access for its device. Every
//! descriptor is closed once imported; the physical memory lives until the last mapping
//! of it is gone, so a rank may free its own segment while peers still hold theirs.
//!
//! Legacy CUDA IPC (where VMM or descriptor handles are missing) is the peer-memory
//! layer's own registration (`comm_peer::Registered`); host memory (devices without peer
//! access) is `host_mapped`.
//!
//! Every driver call is checked; every resource is released on drop, and a half-built
//! value releases what it already holds.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;

use comm_core::cuda::cudarc::driver::{CudaContext, sys};
use comm_core::cuda::driver_error;
use comm_core::{Error, Result};

/// Checks one raw driver call, naming it in the error.
pub(crate) fn cu(r: sys::CUresult, what: &str) -> Result<()> {
    r.result()
        .map_err(|e| Error::backend("cuda", format!("{what}: {}", driver_error(e))))
}

/// True when the device of `ctx` can create VMM memory with descriptor handles.
pub(crate) fn vmm_supported(ctx: &CudaContext) -> bool {
    let attr = |a| ctx.attribute(a).unwrap_or(0) != 0;
    attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_VIRTUAL_ADDRESS_MANAGEMENT_SUPPORTED)
        && attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED)
}

fn location(ctx: &CudaContext) -> sys::CUmemLocation {
    sys::CUmemLocation {
        type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
        id: ctx.ordinal() as i32,
    }
}

fn prop(ctx: &CudaContext) -> sys::CUmemAllocationProp {
    prop_at(location(ctx))
}

fn prop_at(location: sys::CUmemLocation) -> sys::CUmemAllocationProp {
    // SAFETY: an all-zero CUmemAllocationProp is valid (no handle types, no flags).
    let mut p: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
    p.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    p.requestedHandleTypes =
        sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    p.location = location;
    p
}

/// Read-write access for `ctx`'s device.
fn device_access(ctx: &CudaContext) -> sys::CUmemAccessDesc {
    sys::CUmemAccessDesc {
        location: location(ctx),
        flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    }
}

/// `bytes` rounded up to the device's VMM granularity.
pub(crate) fn vmm_size(ctx: &CudaContext, bytes: usize) -> Result<usize> {
    granular(&prop(ctx), bytes)
}

/// `bytes` rounded up to the VMM granularity of host memory near `ctx`'s device.
pub(crate) fn vmm_host_size(ctx: &CudaContext, bytes: usize) -> Result<usize> {
    granular(&host_prop(ctx), bytes)
}

/// Host memory on the NUMA node nearest `ctx`'s device (node 0 where the driver cannot say).
fn host_prop(ctx: &CudaContext) -> sys::CUmemAllocationProp {
    let numa = ctx
        .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID)
        .unwrap_or(0)
        .max(0);
    prop_at(sys::CUmemLocation {
        type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST_NUMA,
        id: numa,
    })
}

fn granular(p: &sys::CUmemAllocationProp, bytes: usize) -> Result<usize> {
    let mut gran = 0usize;
    // SAFETY: valid out-pointer and property.
    let r = unsafe {
        sys::cuMemGetAllocationGranularity(
            &mut gran,
            p,
            sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
        )
    };
    cu(r, "cuMemGetAllocationGranularity")?;
    Ok(bytes.max(1).next_multiple_of(gran.max(1)))
}

/// A VMM mapping: a reserved range, the memory mapped into it, the handle held; all of it
/// released on drop. Device memory here, or host memory of a NUMA node
/// ([`VmmMapping::create_in_host`]).
#[derive(Debug)]
pub struct VmmMapping {
    ctx: Arc<CudaContext>,
    handle: sys::CUmemGenericAllocationHandle,
    ptr: u64,
    size: usize,
    mapped: bool,
}

impl VmmMapping {
    /// Creates `size` bytes (a multiple of the granularity) on `ctx`'s device, mapped here.
    pub(crate) fn create(ctx: &Arc<CudaContext>, size: usize) -> Result<Self> {
        ctx.bind_to_thread().map_err(driver_error)?;
        let p = prop(ctx);
        let mut handle = 0;
        // SAFETY: valid out-pointer and property; size is granularity-aligned.
        let r = unsafe { sys::cuMemCreate(&mut handle, size, &p, 0) };
        cu(r, "cuMemCreate")?;
        Self::map(ctx, handle, size, &[device_access(ctx)])
    }

    /// At least `bytes` of host memory on the NUMA node nearest the first of `devices`,
    /// exportable as a file descriptor, mapped read-write into every one of `devices` and
    /// zeroed: what a host heap shared between processes can be instead of memory
    /// registered page by page with `cuMemHostRegister`.
    pub fn create_in_host(devices: &[&Arc<CudaContext>], bytes: usize) -> Result<Self> {
        let ctx = *devices
            .first()
            .ok_or_else(|| Error::InvalidArgument("host VMM memory for no device".into()))?;
        ctx.bind_to_thread().map_err(driver_error)?;
        let p = host_prop(ctx);
        let size = granular(&p, bytes)?;
        let mut handle = 0;
        // SAFETY: valid out-pointer and property; size is granularity-aligned.
        let r = unsafe { sys::cuMemCreate(&mut handle, size, &p, 0) };
        cu(r, "cuMemCreate (host NUMA)")?;
        let access: Vec<_> = devices.iter().map(|d| device_access(d)).collect();
        let m = Self::map(ctx, handle, size, &access)?;
        // SAFETY: the mapped range, writable by the current context's device.
        let r = unsafe { sys::cuMemsetD8_v2(m.ptr, 0, size) };
        cu(r, "cuMemsetD8")?;
        Ok(m)
    }

    /// Imports a peer's exported descriptor and maps it here. The descriptor is closed by
    /// the caller (it is only borrowed).
    pub(crate) fn import(ctx: &Arc<CudaContext>, fd: &OwnedFd, size: usize) -> Result<Self> {
        ctx.bind_to_thread().map_err(driver_error)?;
        let mut handle = 0;
        // SAFETY: the descriptor is open for the call; the driver takes its own reference
        // to the memory (the fd is passed by value, cast to a pointer, as documented).
        let r = unsafe {
            sys::cuMemImportFromShareableHandle(
                &mut handle,
                fd.as_raw_fd() as isize as *mut std::ffi::c_void,
                sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
            )
        };
        cu(r, "cuMemImportFromShareableHandle")?;
        Self::map(ctx, handle, size, &[device_access(ctx)])
    }

    fn map(
        ctx: &Arc<CudaContext>,
        handle: sys::CUmemGenericAllocationHandle,
        size: usize,
        access: &[sys::CUmemAccessDesc],
    ) -> Result<Self> {
        let mut m = VmmMapping {
            ctx: ctx.clone(),
            handle,
            ptr: 0,
            size,
            mapped: false,
        };
        // SAFETY: valid out-pointer; no fixed address asked for.
        let r = unsafe { sys::cuMemAddressReserve(&mut m.ptr, size, 0, 0, 0) };
        cu(r, "cuMemAddressReserve")?;
        // SAFETY: the range was just reserved with this size; the handle is live.
        let r = unsafe { sys::cuMemMap(m.ptr, size, 0, handle, 0) };
        cu(r, "cuMemMap")?;
        m.mapped = true;
        // SAFETY: the whole mapped range, one descriptor per device.
        let r = unsafe { sys::cuMemSetAccess(m.ptr, size, access.as_ptr(), access.len()) };
        cu(r, "cuMemSetAccess")?;
        Ok(m)
    }

    /// Exports the memory as a POSIX file descriptor (owned by the caller).
    pub(crate) fn export(&self) -> Result<OwnedFd> {
        let mut fd: i32 = -1;
        // SAFETY: for POSIX descriptors the out-pointer is an int.
        let r = unsafe {
            sys::cuMemExportToShareableHandle(
                &mut fd as *mut i32 as *mut std::ffi::c_void,
                self.handle,
                sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                0,
            )
        };
        cu(r, "cuMemExportToShareableHandle")?;
        if fd < 0 {
            return Err(Error::backend(
                "cuda",
                "cuMemExportToShareableHandle gave no descriptor",
            ));
        }
        // SAFETY: the driver created this descriptor for us; nothing else owns it.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// Start of the mapping in this process (the same address in every device of it).
    pub fn ptr(&self) -> u64 {
        self.ptr
    }
}

impl Drop for VmmMapping {
    fn drop(&mut self) {
        // Failures leave nothing to undo; drop cannot report them.
        let _ = self.ctx.bind_to_thread();
        if self.mapped {
            // SAFETY: mapped by `map` with this range, unmapped once.
            let _ = unsafe { sys::cuMemUnmap(self.ptr, self.size) };
        }
        if self.ptr != 0 {
            // SAFETY: reserved by `map` with this size, freed once.
            let _ = unsafe { sys::cuMemAddressFree(self.ptr, self.size) };
        }
        // SAFETY: created or imported once, released once (the memory itself goes when
        // the last mapping and handle of it are gone, in any process).
        let _ = unsafe { sys::cuMemRelease(self.handle) };
    }
}
