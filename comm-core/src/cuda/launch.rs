//! [`launch_overlapping`]: a kernel launch that may overlap the end of the previous kernel
//! of its stream (programmatic dependent launch, sm_90+).

use std::ffi::c_void;

use cudarc::driver::sys;

use super::error::driver_error;
use crate::error::Result;

/// Enqueues `function` on `stream` with `(blocks, threads)` and programmatic stream
/// serialization allowed: the kernel may start while the previous kernel of the stream
/// finishes (once that one executes `griddepcontrol.launch_dependents`, or ends), so that
/// its launch and prologue overlap the previous kernel's tail.
///
/// # Safety
/// `function` must belong to the current context and `params` point to one value of each
/// of its parameters, of its type; the kernel must wait for its stream's previous kernel
/// (`griddepcontrol.wait`) before it touches memory that kernel may write or read.
pub unsafe fn launch_overlapping(
    function: sys::CUfunction,
    (blocks, threads): (u32, u32),
    stream: sys::CUstream,
    params: &mut [*mut c_void],
) -> Result<()> {
    let mut attr = sys::CUlaunchAttribute {
        id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
        pad: [0; 4],
        // SAFETY: an all-zero value is valid for every member of the union.
        value: unsafe { std::mem::zeroed() },
    };
    attr.value.programmaticStreamSerializationAllowed = 1;
    let config = sys::CUlaunchConfig {
        gridDimX: blocks,
        gridDimY: 1,
        gridDimZ: 1,
        blockDimX: threads,
        blockDimY: 1,
        blockDimZ: 1,
        sharedMemBytes: 0,
        hStream: stream,
        attrs: &mut attr,
        numAttrs: 1,
    };
    // SAFETY: the caller vouches for the function and its parameters; `config` and the
    // attribute it points to outlive the call, which copies them.
    unsafe { sys::cuLaunchKernelEx(&config, function, params.as_mut_ptr(), std::ptr::null_mut()) }
        .result()
        .map_err(driver_error)
}
