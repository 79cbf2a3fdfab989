//! `comm-ipc`: a CUDA-IPC custom all-reduce, the fast path for small and medium messages
//! between the GPUs of one node.
//!
//! [`IpcComm`] implements [`comm_core::Communicator`] (all-reduce and barrier). Each rank
//! allocates one region (`cuMemAlloc`) whose IPC handle travels through the
//! [`Bootstrap`](comm_core::Bootstrap); peers in other processes open it with
//! `cuIpcOpenMemHandle` (lazy peer access) and close it on drop, peers in this process
//! (virtual ranks sharing one device) use it directly. A region holds barrier flags, the
//! call counter, eager copy buffers and the Lamport mailboxes (see [`layout`]).
//!
//! Four algorithms ([`Algorithm`]), each a kernel of `kernels/ipc_allreduce.cu` compiled
//! by NVRTC for the running device:
//!
//! - `oneshot-pull`: copy in, one flag barrier, every rank reads every rank and reduces;
//! - `twoshot-pull`: copy in, barrier, reduce-scatter into the owner's tmp, barrier,
//!   all-gather;
//! - `oneshot-push`: Lamport: write into every peer's mailbox, poll the own mailbox
//!   until no sentinel is left, reduce. No barrier;
//! - `twoshot-push`: Lamport: slice j to rank j, which reduces it and pushes the result
//!   to every rank.
//!
//! Every rank reduces in rank order in f32 (two-shot: the slice's owner, whose result
//! everyone copies), so results are bitwise identical on every rank. Barriers store
//! monotonically increasing counters with `st.release.sys` and wait with
//! `ld.acquire.sys`: no peer atomics, so they work over PCIe too. Every spin is bounded
//! by [`IpcConfig::timeout`]: a rank that never arrives makes the others' kernels record
//! a failure in host-mapped memory and exit, and the host reports
//! [`Error::Timeout`](comm_core::Error::Timeout); the communicator is unusable after that.
//!
//! Modes: *eager* (any device buffer; the kernel copies the input into the region) and
//! *zero-copy* (buffers from [`IpcComm::alloc`]: peers read the input in place). Calls only
//! enqueue a kernel whose changing state (call counter, buffer parity) lives on the
//! device, so both modes can be captured into CUDA graphs and replayed.
//!
//! Without validation ([`IpcConfig::validate`] off) a call costs one kernel launch; with
//! it, the ranks also compare their arguments through the bootstrap so that mismatched
//! calls fail with `Error::Mismatch` on every rank.
#![warn(missing_docs)]

pub mod algo;
mod comm;
pub mod config;
pub mod launch;
pub mod layout;
mod registered;
mod status;
mod zero_copy;

pub use algo::Algorithm;
pub use comm::IpcComm;
pub use config::IpcConfig;
pub use zero_copy::IpcBuffer;

/// Kernel sources of this crate, for the workspace's `kernels` builder.
pub const KERNELS: &[comm_core::cuda::KernelSource] = &[launch::ALLREDUCE];
