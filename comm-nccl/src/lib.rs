//! `comm-nccl`: the NCCL backend (placeholder).
#![warn(missing_docs)]

/// Kernel sources of this crate (none: NCCL brings its own).
pub const KERNELS: &[comm_core::cuda::KernelSource] = &[];
