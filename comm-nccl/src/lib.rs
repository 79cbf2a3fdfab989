//! `comm-nccl`: the NCCL backend of the `comm` crates.
//!
//! [`NcclComm`] implements [`comm_core::Communicator`] over `cudarc::nccl`: one rank per
//! GPU, ranks found through any [`comm_core::Bootstrap`] (the NCCL unique id travels
//! through it), collectives enqueued on the stream of the device views they are given
//! (so they can be captured into CUDA graphs), and host waits that are bounded and abort
//! the communicator instead of hanging.
//!
//! `libnccl` is opened at run time; without it (or without a driver or GPU) every entry
//! point returns [`comm_core::Error::LibraryMissing`] / [`comm_core::Error::NoDevice`].
//! Since NCCL 2.27, buffers that every rank registered as a symmetric window run on NCCL's
//! low-latency symmetric kernels: [`NcclComm::alloc`] (or
//! [`Communicator::alloc_registered`](comm_core::Communicator::alloc_registered)) hands
//! out such buffers ([`NcclBuffer`]), and the algorithm `symmetric` stages all-reduces of
//! other buffers through a window of the communicator's own. The version is read at run
//! time: where windows cannot be had, the plain path stays and the capabilities say why.
//!
//! `cudarc` looks for `libnccl.so`: where only `libnccl.so.2` is installed, add a
//! `libnccl.so` symlink on `LD_LIBRARY_PATH` (`scripts/gpu-bundle` does).
#![warn(missing_docs)]

mod buffer;
mod comm;
mod probe;
mod raw;
mod staging;
mod symmetric;
mod types;
mod window;

pub use buffer::NcclBuffer;
pub use comm::NcclComm;
pub use probe::{LIBNCCL, nccl_version, require_nccl};
pub use symmetric::{STAGING_BYTES, SYMMETRIC_SINCE};

/// Kernel sources of this crate (none: NCCL brings its own).
pub const KERNELS: &[comm_core::cuda::KernelSource] = &[];
