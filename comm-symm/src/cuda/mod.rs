//! The CUDA backing of comm-symm (feature `cuda`): a symmetric heap of device memory as a
//! source of peer memory for the shared layer `comm-peer`, which holds every kernel.
//!
//! - [`DeviceHeap`]: the device symmetric heap: one segment per rank, allocated with
//!   `cuMemCreate` (POSIX file-descriptor handles passed over Unix sockets and mapped by
//!   every local rank) or, where VMM is missing, `cuMemAlloc` + legacy CUDA IPC; where some
//!   pair of ranks' devices cannot access each other, shared host memory registered with
//!   every device instead ([`Backing`]); a device table of every rank's address; signal
//!   pads at the same offset in every segment; the primitives `put_signal` /
//!   `wait_signal` / `barrier` (no peer atomics, every spin bounded).
//! - [`CudaSymmComm`]: [`comm_core::Communicator`] over the heap: one-shot and two-shot,
//!   pull and push (Lamport) all-reduce (by name, or automatic), all_gather,
//!   reduce_scatter, broadcast, barrier, f32/f16/bf16; plus
//!   `all_reduce_residual_rmsnorm` (of the `PeerComm` it derefs to), the fused all-reduce + residual add +
//!   RMSNorm.

mod backing;
mod comm;
mod heap;
mod host_mapped;
mod segment;

pub use backing::Backing;
pub use comm::{CudaSymmComm, CudaSymmConfig, ENV_PREFIX};
pub use comm_peer::Algorithm;
pub use comm_peer::layout;
pub use heap::DeviceHeap;
pub use segment::VmmMapping;
