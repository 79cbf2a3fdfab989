//! `comm-symm`: symmetric memory without multicast or peer atomics.
//!
//! A *symmetric heap* is memory that every rank of a node allocates collectively
//! ([`HostHeap::rendezvous`]) and that every rank can address directly: each rank gets a
//! pointer to its own area and to every peer's, at the same offsets, plus *signal pads*.
//! Signals need no atomic read-modify-write on peer memory (which PCIe does not offer):
//! a sender stores a growing count into its slot of the receiver's pad, the receiver
//! waits for the count with acquire loads, and every wait is bounded.
//!
//! The host backing shares `memfd` segments between the processes (or threads) of one node,
//! passing descriptors over Unix sockets (SCM_RIGHTS); nothing is named, so nothing is
//! left behind when a process dies. [`HostSymmComm`] implements
//! [`comm_core::Communicator`] on top of it, with one-shot, two-shot and Lamport
//! (barrier-free) all-reduce; [`SymmComm`] is the one type over either backing.
//!
//! With feature `cuda`, module `cuda` holds the device backing: a `cuda::DeviceHeap` of GPU
//! memory (`cuMemCreate` segments exported as POSIX file descriptors, passed with
//! [`fdpass`] and mapped by every local rank; legacy CUDA IPC where VMM is missing; where
//! some pair of GPUs cannot access each other, memfd segments of host memory registered
//! with every rank's device), its
//! signal and barrier primitives as kernels, and `cuda::CudaSymmComm`, the same
//! algorithms on device memory plus the fused all-reduce + residual add + RMSNorm.

#![warn(missing_docs)]

mod algorithm;
mod comm;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod fdpass;
pub mod host;
mod lamport;
mod symm;

pub use algorithm::Algorithm;
pub use comm::{DEFAULT_MAX_BYTES, HostSymmComm};
pub use host::HostHeap;
pub use symm::SymmComm;
