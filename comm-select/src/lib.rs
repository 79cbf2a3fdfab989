//! `comm-select`: the fastest backend per call, without the user knowing the machine.
//!
//! The right all-reduce flips with topology (NVLink or PCIe, one switch or two), world
//! size and message size, and a wrong guess cost 2x on the machine in the seeds. This
//! crate holds the pieces of that decision:
//!
//! - [`Topology`]: per-pair links (NVLink, PCIe class, P2P, peer atomics), [`probe`]d
//!   through CUDA and NVML (feature `cuda`) and shared by every rank through the bootstrap,
//!   or loaded from a file for machines that cannot be probed;
//! - [`CostModel`]: latency + bandwidth + switch contention per algorithm pattern;
//! - [`TuningTable`]: times measured on this host (`allreduce-perf --tune`), eager and
//!   graph-replay times apart ([`Launch`]), which beat the model;
//! - [`SelectComm`]: a [`comm_core::Communicator`] over several backends that routes each
//!   call (forced choice > tuning table > cost model > first capable backend), makes the
//!   same choice on every rank, and [`explains`](SelectComm::explain) it; a forced choice or
//!   a table may name a backend's algorithm, the model picks a backend that chooses its
//!   own per call and leaves that choice to it;
//! - [`auto`]: the factory that starts every backend of the build (features `nccl`, `ipc`,
//!   `symm`, `cuda`) that starts on every rank, probes the topology and builds the selector.

#![warn(missing_docs)]

mod auto;
mod backend;
pub mod cost;
mod probe;
mod select;
pub mod topology;
pub mod tuning;

pub use auto::{Auto, Registered, agreed_device, auto, find, registry};
pub use backend::{BackendId, Memory};
pub use cost::CostModel;
pub use probe::probe;
pub use select::{CallInfo, Choice, SelectComm, SelectOptions, Source};
pub use topology::{Fabric, Link, PciePath, Topology};
pub use tuning::{Launch, Measurement, TuningTable};
