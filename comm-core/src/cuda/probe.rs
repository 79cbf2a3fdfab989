//! Library and device discovery that never panics.
//!
//! `cudarc` loads `libcuda`, `libnvrtc` and `libnccl` lazily and panics on the first call
//! when one is missing. These probes look for the library first (once per process) and
//! turn its absence into [`Error::LibraryMissing`], a driver without a usable GPU into
//! [`Error::NoDevice`]. Every other entry point of [`crate::cuda`] calls them.

use std::sync::{Arc, OnceLock};

use cudarc::driver::{CudaContext, DriverError, result, sys};

use super::error::driver_error;
use crate::error::{Error, Result};

/// File name of the CUDA driver library.
pub const LIBCUDA: &str = "libcuda.so.1";
/// The NVRTC library `cudarc` looks for with feature `cuda-13000`: CUDA 13's, else CUDA 12's
/// (whose NVRTC 12.8 builds every kernel for sm_90 and sm_120, scripts/cuda12-check).
pub const LIBNVRTC: &str = "libnvrtc.so.13 or libnvrtc.so.12";

/// Why a probe failed, kept so that later calls fail the same way without retrying.
#[derive(Debug, Clone)]
enum Failure {
    Missing(&'static str),
    NoDevice(String),
}

impl Failure {
    fn to_error(&self) -> Error {
        match self {
            Failure::Missing(name) => Error::LibraryMissing {
                name: (*name).to_string(),
            },
            Failure::NoDevice(why) => Error::NoDevice(why.clone()),
        }
    }
}

/// Succeeds when the CUDA driver library loads and `cuInit` succeeds.
pub fn driver() -> Result<()> {
    static DRIVER: OnceLock<Result<(), Failure>> = OnceLock::new();
    DRIVER
        .get_or_init(|| {
            // SAFETY: only tries to open the library; no symbol of it is called.
            if !unsafe { sys::is_culib_present() } {
                return Err(Failure::Missing(LIBCUDA));
            }
            result::init().map_err(|e| Failure::NoDevice(describe_init_failure(e)))
        })
        .clone()
        .map_err(|f| f.to_error())
}

fn describe_init_failure(e: DriverError) -> String {
    if e.0 == sys::CUresult::CUDA_ERROR_NO_DEVICE {
        "the CUDA driver found no device".to_string()
    } else {
        format!("cuInit failed: {e}")
    }
}

/// Succeeds when the NVRTC library loads.
pub fn nvrtc() -> Result<()> {
    static NVRTC: OnceLock<bool> = OnceLock::new();
    // SAFETY: only tries to open the library; no symbol of it is called.
    let present = *NVRTC.get_or_init(|| unsafe { cudarc::nvrtc::sys::is_culib_present() });
    if present {
        Ok(())
    } else {
        Err(Error::LibraryMissing {
            name: LIBNVRTC.to_string(),
        })
    }
}

/// Number of CUDA devices; an error when the driver is missing or has no device.
pub fn device_count() -> Result<usize> {
    driver()?;
    let count = result::device::get_count().map_err(driver_error)?;
    if count <= 0 {
        return Err(Error::NoDevice("the CUDA driver found no device".into()));
    }
    Ok(count as usize)
}

/// The primary context of device `ordinal`, after probing the driver.
///
/// The handle does not track `CudaSlice` uses with events (cudarc's default), since the
/// comm crates order their work on streams themselves. With tracking, cudarc synchronises
/// the whole device when a handle creates its first stream; a rank thread that did so while
/// another rank's kernel spun on the same device, waiting for it, would never return.
pub fn context(ordinal: usize) -> Result<Arc<CudaContext>> {
    let count = device_count()?;
    if ordinal >= count {
        return Err(Error::NoDevice(format!(
            "device {ordinal} was asked for, but only {count} are present"
        )));
    }
    let ctx = CudaContext::new(ordinal).map_err(driver_error)?;
    // SAFETY: no `CudaSlice` is ever made on this handle by the comm crates; callers that
    // allocate slices on it order their streams themselves (documented above).
    unsafe { ctx.disable_event_tracking() };
    Ok(ctx)
}

/// The arch name NVRTC compiles for on this context's device (`sm_90` on an H100/H200).
pub fn arch_of(ctx: &CudaContext) -> Result<String> {
    let (major, minor) = ctx.compute_capability().map_err(driver_error)?;
    Ok(format!("sm_{major}{minor}"))
}
