//! The host-mapped backing: segments of shared host memory that every rank's device
//! reaches over PCIe, for GPUs that cannot access each other's memory (no P2P: consumer
//! cards, PCIe across sockets, virtual machines).
//!
//! Every rank creates one `memfd` segment (the host backing's [`Mapping`]), registers it
//! with its device (`cuMemHostRegister`, `DEVICEMAP | PORTABLE`), initialises it through
//! the device address (`comm_peer::init_region`), and passes its descriptor to every local
//! rank ([`exchange_fds`]); each rank maps every peer's segment and registers that mapping
//! with its own device too. Kernels then read and write every rank's segment in host
//! memory; nothing needs peer access or peer atomics. The memory lies outside every device,
//! so the source says so ([`PeerSource::host_memory`]) and the kernels order their flags at
//! system scope.
//!
//! Every driver call is checked; on drop each mapping is unregistered, then unmapped; the
//! memory goes with the last mapping or descriptor of it, in any process. Each collective
//! step ends with an exchange of verdicts, so that a rank that fails makes every rank fail
//! instead of leaving them waiting.

use std::os::fd::AsFd;
use std::sync::Arc;

use comm_core::cuda::cudarc::driver::{CudaContext, sys};
use comm_core::cuda::driver_error;
use comm_core::{Bootstrap, Error, Result};
use comm_peer::{PeerSource, device_table, init_region};

use super::heap::{Segments, every_rank};
use super::segment::cu;
use crate::fdpass::exchange_fds;
use crate::host::Mapping;

/// True when host memory can be registered with the device of `ctx` and mapped into it.
pub(crate) fn supported(ctx: &CudaContext) -> bool {
    let attr = |a| ctx.attribute(a).unwrap_or(0) != 0;
    attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY)
        && attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED)
}

/// One rank's segment mapped in this process and registered with this rank's device.
#[derive(Debug)]
struct RegisteredMapping {
    ctx: Arc<CudaContext>,
    /// The device's address of the mapping.
    device: u64,
    /// Unmapped after the registration is gone (fields drop after `Drop::drop`).
    mapping: Mapping,
}

impl RegisteredMapping {
    /// Pins `mapping` and maps it into the device of `ctx`.
    fn register(ctx: &Arc<CudaContext>, mapping: Mapping) -> Result<Self> {
        ctx.bind_to_thread().map_err(driver_error)?;
        let flags = sys::CU_MEMHOSTREGISTER_DEVICEMAP | sys::CU_MEMHOSTREGISTER_PORTABLE;
        // SAFETY: the range is one live mapping of this process, page aligned, of this
        // length; it stays mapped until the registration is undone (drop).
        let r = unsafe { sys::cuMemHostRegister_v2(mapping.ptr().cast(), mapping.len(), flags) };
        cu(r, "cuMemHostRegister")?;
        let mut registered = RegisteredMapping {
            ctx: ctx.clone(),
            device: 0,
            mapping,
        };
        // SAFETY: valid out-pointer; the range was registered with DEVICEMAP just above.
        let r = unsafe {
            sys::cuMemHostGetDevicePointer_v2(
                &mut registered.device,
                registered.mapping.ptr().cast(),
                0,
            )
        };
        cu(r, "cuMemHostGetDevicePointer")?;
        Ok(registered)
    }
}

impl Drop for RegisteredMapping {
    fn drop(&mut self) {
        // Failures leave nothing to undo; drop cannot report them.
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: registered once by `register`, unregistered once, before the unmap.
            let _ = unsafe { sys::cuMemHostUnregister(self.mapping.ptr().cast()) };
        }
    }
}

/// `bytes` rounded up to whole pages (what a registration pins).
fn page_rounded(bytes: usize) -> usize {
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    bytes
        .max(1)
        .next_multiple_of(usize::try_from(page).unwrap_or(4096).max(1))
}

/// Collective: creates, registers and initialises this rank's segment of `wanted` bytes
/// (rounded up to pages; header zeroed, `sentinel` filled) and maps every rank's. Returns
/// the source and the segment size. `sharing` is the most ranks per device.
pub(crate) fn map(
    bootstrap: &dyn Bootstrap,
    ctx: &Arc<CudaContext>,
    wanted: usize,
    sentinel: std::ops::Range<usize>,
    sharing: usize,
) -> Result<(Box<dyn PeerSource>, usize)> {
    let (world, me) = (bootstrap.world_size(), bootstrap.rank());
    let size = page_rounded(wanted);
    // Step 1: this rank's segment, initialised before any peer sees its descriptor.
    let own = Mapping::create(size).and_then(|(fd, mapping)| {
        let own = RegisteredMapping::register(ctx, mapping)?;
        init_region(ctx, own.device, size, sentinel)?;
        Ok((fd, own))
    });
    let msg = match &own {
        Ok(_) => [&[1u8][..], &(size as u64).to_le_bytes()].concat(),
        Err(e) => [&[0u8][..], e.to_string().as_bytes()].concat(),
    };
    let all = bootstrap.all_gather_bytes(&msg)?;
    // Keep the descriptor exchange in step: a failed rank takes no part in it, so nobody does.
    if let Some((r, m)) = all.iter().enumerate().find(|(_, m)| m.first() != Some(&1)) {
        return Err(Error::Bootstrap(format!(
            "rank {r} could not create its host-mapped symm segment: {}",
            String::from_utf8_lossy(m.get(1..).unwrap_or_default())
        )));
    }
    if let Some((r, _)) = all.iter().enumerate().find(|(_, m)| m[1..] != msg[1..]) {
        return Err(Error::Mismatch(format!(
            "symm: rank {r}'s host segment size differs from rank {me}'s {size} (same \
             data_bytes everywhere?)"
        )));
    }
    let (fd, own) = own?;
    // Step 2: map and register every peer's segment. Every rank takes part in the
    // descriptor exchange even if a later step fails here (the verdicts report it).
    let mapped = exchange_fds(bootstrap, fd.as_fd()).and_then(|fds| {
        drop(fd);
        // `fds` close here: the mappings hold the memory.
        let mut mappings = fds
            .iter()
            .enumerate()
            .filter(|&(r, _)| r != me)
            .map(|(_, peer_fd)| {
                RegisteredMapping::register(ctx, Mapping::map(peer_fd.as_fd(), size)?)
            })
            .collect::<Result<Vec<_>>>()?;
        mappings.insert(me, own);
        let ptrs: Vec<u64> = mappings.iter().map(|m| m.device).collect();
        let table = device_table(ctx, &ptrs)?;
        Ok(Segments {
            _held: mappings,
            ptrs,
            table,
            sharing,
            host_memory: true,
        })
    });
    // Also the barrier before use: nobody touches a peer's segment before every rank has
    // mapped every segment.
    let mapped = every_rank(bootstrap, mapped, "map the host-mapped symm segments")?;
    debug_assert_eq!(mapped.ptrs.len(), world);
    Ok((Box::new(mapped), size))
}

#[cfg(test)]
mod tests {
    #[test]
    fn segments_are_whole_pages() {
        let page = super::page_rounded(1);
        assert!(page >= 4096 && page.is_power_of_two());
        assert_eq!(super::page_rounded(0), page);
        assert_eq!(super::page_rounded(page), page);
        assert_eq!(super::page_rounded(page + 1), 2 * page);
    }
}
