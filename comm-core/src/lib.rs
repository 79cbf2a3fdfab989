//! `comm-core`: the small core that every `comm` backend builds on.
//!
//! A backend implements one object-safe trait, [`Communicator`]: all-reduce (in place and
//! out of place), all-gather, reduce-scatter, broadcast and barrier over [`BufferRef`] /
//! [`BufferMut`] views that carry a [`DType`], a length and a [`MemoryLocation`] (host, or a
//! CUDA device pointer and stream). Typed slice methods come free from [`CommunicatorExt`].
//! Calls are validated twice: locally ([`CallDescriptor`]) and across ranks, so mismatched
//! arguments fail on every rank with [`Error::Mismatch`] rather than hang. Every wait is
//! bounded and ends in [`Error::Timeout`].
//!
//! Ranks find each other through a [`Bootstrap`]: threads of one process
//! ([`ThreadsBootstrap`]), environment variables plus a TCP store ([`EnvBootstrap`], which
//! also understands `mpirun`), or MPI (feature `mpi`). Two host backends are always here:
//! [`LocalComm`] (threads sharing memory) and [`BootstrapComm`] (processes; data through
//! the bootstrap, reduced in rank order); with feature `mpi`, `MpiComm` runs MPI's own
//! collectives. The conformance suite (feature `conformance`) is the behaviour every
//! backend must pass; a GPU backend runs it on `cuda::DeviceMemory`.
//!
//! Feature `cuda` adds `cuda`: device probing that never panics, device buffers and
//! views, bounded stream waits and the NVRTC kernel loader shared by the GPU backends.

#![warn(missing_docs)]

pub mod backends;
pub mod bootstrap;
pub mod buffer;
pub mod call;
pub mod communicator;
#[cfg(feature = "conformance")]
pub mod conformance;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod dtype;
pub mod env;
pub mod error;
mod exchange;
pub mod forward;
#[cfg(feature = "mpi")]
mod mpi_process;
pub mod reduce;
pub mod registered;

#[cfg(feature = "mpi")]
pub use backends::MpiComm;
pub use backends::{BootstrapComm, LocalComm};
#[cfg(feature = "mpi")]
pub use bootstrap::MpiBootstrap;
pub use bootstrap::{Bootstrap, EnvBootstrap, LaunchInfo, ThreadsBootstrap};
pub use buffer::{BufferMut, BufferRef, MemoryLocation, RawStream};
pub use call::CallDescriptor;
pub use communicator::{
    Capabilities, Collective, Communicator, CommunicatorExt, Disagreements, TrafficPattern,
};
pub use dtype::{DType, Element, ReduceOp};
pub use error::{BoxError, Error, Result};
pub use forward::Forward;
pub use half::{bf16, f16};
pub use registered::RegisteredBuffer;
