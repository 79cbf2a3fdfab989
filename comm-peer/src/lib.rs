//! `comm-peer`: the GPU peer-memory layer of the comm crates. Not a backend: the backends
//! that own peer memory (comm-ipc: CUDA IPC handles of `cuMemAlloc` regions and registered
//! buffers; comm-symm: a symmetric heap of VMM or IPC segments, or of host memory mapped
//! into every device for GPUs without peer access) plug a [`PeerSource`] into it, and get
//! every collective from here.
//!
//! How it works: every rank owns one region that every rank can address ([`layout`]:
//! barrier flags and signal slots that peers store into, this rank's own call counter and
//! Lamport bookkeeping, staged inputs, Lamport mailboxes). One NVRTC program
//! (`kernels/peer_io.cuh`, `peer_sync.cuh`, `peer_lamport.cuh`, `peer_collectives.cu`) holds
//! every kernel: one-shot/two-shot all-reduce by pull (flag barrier: counters stored with
//! release, read with acquire, two alternating sets, no peer atomics) or push (Lamport:
//! sentinel-filled mailboxes, three rotating buffers, no barrier; over host memory, from
//! [`flagged_from`] bytes, data then a flag, so that every byte crosses the link once each
//! way; larger messages streamed in chunks, each with its flag, read while later ones are
//! written), or by the copy engines
//! (`copies`: kernels only signal and sum; for regions in host memory), reduce-scatter,
//! all-gather, broadcast, the fused all-reduce + residual + RMSNorm, and signal
//! primitives. Between two ranks over host memory, the one-shot push of one block and the
//! tapered stream run copies compiled for a world of two (`kernels`), whose shorter code is
//! faster. A message larger than the staging areas (`max_bytes` of [`PeerConfig`])
//! moves in parts, each starting on a 16-byte boundary and cut alike on every rank
//! (`chunks`): part after part in one launch (two-shot pull), or a launch per part. Every element is reduced in rank
//! order in f32, so every rank holds the same bits. Every spin is bounded: a kernel that
//! gives up records why in host-mapped memory ([`PeerGroup`]), the host reports
//! `Error::Timeout`, and the communicator is `Aborted` from then on. Ranks agree on each
//! call on the device, with no host work per call: every kernel publishes its call
//! (collective, dtype, op, count, root, algorithm, zero-copy offset) to its peers and
//! compares theirs before it waits on them or writes output; a difference stops every rank
//! and is reported as `Error::Mismatch` naming both calls (`calls`; an exchange through the
//! bootstrap per call remains as `agree_on_host`, a debugging aid). Everything that changes
//! per call lives on the device, so calls can be captured into CUDA graphs.
//!
//! - [`PeerComm`]: the communicator (join, per-call checks, optional host agreement,
//!   collectives, zero-copy buffers from [`PeerComm::alloc`]); backends wrap it and
//!   get `Communicator` from it by implementing [`comm_core::Forward`].
//! - [`PeerGroup`]: the ranks, kernels, status, bounded waits and signal primitives.
//! - [`Registered`]: memory registered with every rank through CUDA IPC.
//! - [`PeerConfig`] / [`config::Env`]: settings, and the one way to read them from the
//!   environment (`<PREFIX>_MAX_BYTES`, `_ALGO`, `_TIMEOUT_SECS`, `_AGREE_ON_HOST`, ...).
#![warn(missing_docs)]

pub mod algorithm;
mod calls;
mod chunks;
mod collectives;
mod comm;
mod communicator;
pub mod config;
mod copies;
mod fused;
mod grid;
mod group;
pub mod kernels;
pub mod layout;
mod progress;
mod registered;
mod residency;
mod scratch;
mod source;
mod status;
mod trace;
mod zero_copy;

pub use algorithm::Algorithm;
pub use collectives::{FLAGGED_FROM, PAIR_FLAGGED_FROM, flagged_from};
pub use comm::{COPIES_FROM, MakeSource, PeerComm, device_for, refuse_join};
pub use config::PeerConfig;
pub use group::{HOST_MARGIN, PeerGroup, Ready, init_buffer, init_region};
pub use kernels::KERNELS;
pub use registered::Registered;
pub use source::{PeerSource, device_table, sharing, uuid};
pub use zero_copy::PeerBuffer;
