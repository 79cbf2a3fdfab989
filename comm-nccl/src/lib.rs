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
//! `cudarc` looks for `libnccl.so`: where only `libnccl.so.2` is installed, add a
//! `libnccl.so` symlink on `LD_LIBRARY_PATH` (`scripts/gpu-bundle` does).
#![warn(missing_docs)]

mod comm;
mod probe;
mod raw;
mod types;

pub use comm::NcclComm;
pub use probe::{LIBNCCL, nccl_version, require_nccl};

/// Kernel sources of this crate (none: NCCL brings its own).
pub const KERNELS: &[comm_core::cuda::KernelSource] = &[];
