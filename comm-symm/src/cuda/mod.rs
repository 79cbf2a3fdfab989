//! The CUDA backing of comm-symm (feature `cuda`).
//!
//! - [`DeviceHeap`]: the device symmetric heap: one segment per rank, allocated with
//!   `cuMemCreate` (POSIX file-descriptor handles passed over Unix sockets and mapped by
//!   every local rank) or, where VMM is missing, `cuMemAlloc` + legacy CUDA IPC; a device
//!   table of every rank's address; signal pads at the same offset in every segment; the
//!   primitives `put_signal` / `wait_signal` / `barrier` as kernels (no peer atomics,
//!   every spin bounded).
//! - [`CudaSymmComm`]: [`comm_core::Communicator`] over the heap: one-shot, two-shot and
//!   Lamport all-reduce (by name, or automatic), all_gather, reduce_scatter, broadcast,
//!   barrier, f32/f16/bf16; plus [`CudaSymmComm::all_reduce_residual_rmsnorm`], the fused
//!   all-reduce + residual add + RMSNorm.
//! - Kernels: `kernels/symm.cuh` (layout, signals, barriers) and
//!   `kernels/symm_collectives.cu`, compiled by NVRTC at first use ([`KERNELS`] for the
//!   `kernels` builder).

mod comm;
mod heap;
mod kernels;
pub mod layout;
mod segment;
mod status;

pub use comm::{CudaSymmComm, CudaSymmConfig};
pub use heap::DeviceHeap;
pub use kernels::{COLLECTIVES, DTYPES, KERNELS, OPS};
pub use segment::Backing;
