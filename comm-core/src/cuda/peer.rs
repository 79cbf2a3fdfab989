//! Peer access between the devices of one process.
//!
//! Ranks in other processes map each other's memory through IPC handles, which enable
//! peer access themselves (`CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS`). Ranks of one process
//! on different devices (one thread per GPU) address each other's memory directly, and a
//! kernel that touches another device's memory without peer access enabled faults with
//! `CUDA_ERROR_ILLEGAL_ADDRESS`.

use std::sync::Arc;

use cudarc::driver::{CudaContext, sys};

use super::error::driver_error;
use super::probe;
use crate::error::{Error, Result};

/// Lets kernels running in `ctx` read and write memory of device `peer` (this process).
/// A no-op for the context's own device and when access is already enabled; an
/// [`Error::Unsupported`] when the two devices cannot reach each other.
pub fn enable_peer_access(ctx: &Arc<CudaContext>, peer: usize) -> Result<()> {
    let own = ctx.ordinal();
    if peer == own {
        return Ok(());
    }
    let peer_ctx = probe::context(peer)?;
    let mut can = 0;
    // SAFETY: valid out-pointer; both device handles come from live contexts.
    unsafe { sys::cuDeviceCanAccessPeer(&mut can, ctx.cu_device(), peer_ctx.cu_device()) }
        .result()
        .map_err(driver_error)?;
    if can == 0 {
        return Err(Error::Unsupported(format!(
            "device {own} cannot access device {peer}'s memory (no peer access between them)"
        )));
    }
    ctx.bind_to_thread().map_err(driver_error)?;
    // SAFETY: the current context is `ctx`; `peer_ctx` is a live primary context.
    let enabled = unsafe { sys::cuCtxEnablePeerAccess(peer_ctx.cu_ctx(), 0) };
    match enabled {
        sys::CUresult::CUDA_SUCCESS | sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => {
            Ok(())
        }
        e => Err(driver_error(e.result().unwrap_err())),
    }
}
