//! The error record kernels write when a spin-wait gives up: four words of host-mapped
//! memory (`cuMemHostAlloc` with `DEVICEMAP`), readable by the host at any time without
//! synchronising, even while the kernel that wrote it is still winding down.

use std::sync::Arc;
use std::time::Duration;

use comm_core::cuda::cudarc::driver::{CudaContext, sys};
use comm_core::cuda::driver_error;
use comm_core::{Error, Result};

/// Codes of word 0 (the kernel's `IPC_TIMEOUT_*`).
const OK: u32 = 0;
const TIMEOUT_BARRIER: u32 = 1;
const TIMEOUT_PUSH: u32 = 2;

/// Host-mapped `[code, rank, phase, peer]`.
#[derive(Debug)]
pub(crate) struct Status {
    host: *mut u32,
    device: u64,
    ctx: Arc<CudaContext>,
}

// SAFETY: the pointer is pinned host memory owned by this value; it is read and written
// with volatile accesses only, and freed once, on drop.
unsafe impl Send for Status {}

impl Status {
    pub(crate) fn new(ctx: &Arc<CudaContext>) -> Result<Self> {
        ctx.bind_to_thread().map_err(driver_error)?;
        let mut host: *mut std::ffi::c_void = std::ptr::null_mut();
        // SAFETY: valid out-pointer; 16 bytes of pinned, device-mapped memory.
        unsafe { sys::cuMemHostAlloc(&mut host, 16, sys::CU_MEMHOSTALLOC_DEVICEMAP) }
            .result()
            .map_err(driver_error)?;
        let mut device = 0;
        // SAFETY: `host` was just allocated with DEVICEMAP in this context.
        let got = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut device, host, 0) }.result();
        let status = Status {
            host: host.cast(),
            device,
            ctx: ctx.clone(),
        };
        got.map_err(driver_error)?;
        for i in 0..4 {
            // SAFETY: four words of our allocation.
            unsafe { status.host.add(i).write_volatile(0) };
        }
        Ok(status)
    }

    /// The address kernels write to.
    pub(crate) fn device_ptr(&self) -> u64 {
        self.device
    }

    /// `Err(Timeout)` once a kernel has recorded a failure.
    pub(crate) fn check(&self, timeout: Duration) -> Result<()> {
        // SAFETY: four words of our allocation; the kernel writes word 0 last.
        let w: [u32; 4] = std::array::from_fn(|i| unsafe { self.host.add(i).read_volatile() });
        let what = match w[0] {
            OK => return Ok(()),
            TIMEOUT_BARRIER => format!(
                "rank {} at barrier {} of an ipc all-reduce: rank {} never arrived",
                w[1], w[2], w[3]
            ),
            TIMEOUT_PUSH => format!(
                "rank {} in step {} of a push all-reduce: data of rank {} never arrived",
                w[1], w[2], w[3]
            ),
            code => format!("an ipc kernel reported unknown failure {code}"),
        };
        Err(Error::Timeout {
            what,
            after: timeout,
        })
    }
}

impl Drop for Status {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: allocated by cuMemHostAlloc, freed once.
            let _ = unsafe { sys::cuMemFreeHost(self.host.cast()) };
        }
    }
}
