//! CUDA helpers shared by the GPU backends (feature `cuda`).
//!
//! Everything here loads the CUDA libraries at run time through `cudarc`'s dynamic
//! loading, so building needs no toolkit. `cudarc` panics when a library is missing;
//! every entry point of this module therefore goes through [`probe`] first and returns
//! [`Error::LibraryMissing`](crate::Error::LibraryMissing) or
//! [`Error::NoDevice`](crate::Error::NoDevice) instead.
//!
//! - [`probe`]: library and device discovery ([`context`], [`device_count`]).
//! - [`DeviceBuffer`]: device memory from `cuMemAlloc` (IPC-shareable, unlike `cudarc`'s
//!   stream-ordered pool), with host copies and [`BufferRef`](crate::BufferRef) /
//!   [`BufferMut`](crate::BufferMut) views; views of `cudarc` `CudaSlice`s come from `From`.
//! - [`DeviceMemory`]: one device and one stream to allocate typed buffers on
//!   ([`DeviceOwned`]); with feature `conformance` it is the suite's `TestMemory`, so
//!   `conformance::run_with_memory(&comm, &DeviceMemory::new(0)?, &config)` runs on the GPU.
//! - [`enable_peer_access`]: lets one device's kernels reach another device of this
//!   process (ranks on one thread per GPU).
//! - [`launch_overlapping`]: a kernel launch whose start may overlap the end of the
//!   previous kernel of its stream (programmatic dependent launch, sm_90+).
//! - [`stream`]: raw stream handles, bounded waits (a wait that can give up) and whether a
//!   stream is capturing a graph.
//! - [`timing`]: events that time calls on a stream ([`record_each`], [`event_times`]).
//! - [`kernels`]: the `.cu` registry ([`KernelSource`]), NVRTC compilation to cubin for the
//!   running device's arch, and the memory + disk cache.
//! - [`pattern`] / [`PatternKernels`]: deterministic test data made and checked on the
//!   device (the fill/check kernels), mirrored on the host.

mod buffer;
mod error;
pub mod kernels;
mod launch;
mod memory;
pub mod pattern;
mod pattern_kernels;
mod peer;
pub mod probe;
pub mod stream;
pub mod timing;
mod views;

pub use buffer::DeviceBuffer;
pub use error::{driver_error, nvrtc_error};
pub use kernels::{KernelCache, KernelSource};
pub use launch::launch_overlapping;
pub use memory::{DeviceMemory, DeviceOwned};
pub use pattern_kernels::PatternKernels;
pub use peer::enable_peer_access;
pub use probe::{context, device_count};
pub use stream::raw_stream;
pub use timing::{event_times, record_each, timing_event, timing_events};

/// The `cudarc` this crate is built against, so that dependants use the same types.
pub use cudarc;

/// The parameter array of a kernel launch (`cuLaunchKernel`'s `kernelParams`) from mutable
/// locals, one per kernel parameter, in order: `kernel_params![ptr, count, seed]`. Each
/// local must have the parameter's exact type (`u64` for a pointer or a 64-bit integer,
/// `u32`, `f32`) and outlive the launch, which copies the values.
#[macro_export]
macro_rules! kernel_params {
    ($($arg:ident),* $(,)?) => {
        [$(&mut $arg as *mut _ as *mut ::std::ffi::c_void),*]
    };
}
