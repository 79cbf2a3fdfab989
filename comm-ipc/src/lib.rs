//! `comm-ipc`: a CUDA-IPC custom all-reduce, the fast path for small and medium messages
//! between the GPUs of one node; larger ones run too, in parts.
//!
//! [`IpcComm`] implements [`comm_core::Communicator`]. It is one source of peer memory for
//! the shared layer `comm-peer`, which holds every kernel and every algorithm: each rank
//! allocates one region (`cuMemAlloc`) whose IPC handle travels through the
//! [`Bootstrap`](comm_core::Bootstrap); peers in other processes open it with
//! `cuIpcOpenMemHandle` (lazy peer access) and close it on drop, peers in this process
//! (virtual ranks sharing one device) use it directly.
//!
//! What this crate adds to the layer is user buffers registered with every rank
//! (`PeerComm::alloc` through `Deref` -> [`IpcBuffer`]): an all-reduce whose input lies in one is read by
//! the peers in place (zero-copy, pull algorithms), and graphs can be captured over them.
//! The algorithms ([`Algorithm`]: `oneshot-pull`, `twoshot-pull`, `oneshot-push`,
//! `twoshot-push`, `oneshot-copy`) and everything else are described in `comm-peer`.
//!
//! Settings come from [`IpcConfig`] or the environment: `COMM_IPC_MAX_BYTES`,
//! `COMM_IPC_LAMPORT_MAX_BYTES`, `COMM_IPC_ALGO`, `COMM_IPC_TIMEOUT_SECS`,
//! `COMM_IPC_AGREE_ON_HOST`, `COMM_IPC_MAX_BLOCKS`, `COMM_IPC_THREADS`.
#![warn(missing_docs)]

mod comm;

pub use comm::IpcComm;
pub use comm_peer::{Algorithm, PeerBuffer as IpcBuffer, PeerConfig as IpcConfig};

/// The prefix of this backend's environment variables.
pub const ENV_PREFIX: &str = "COMM_IPC";
