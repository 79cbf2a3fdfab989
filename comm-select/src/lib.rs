//! `comm-select`: the fastest backend per call, without the user knowing the machine.
//!
//! The right all-reduce flips with topology (NVLink or PCIe, one switch or two), world
//! size and message size, and a wrong guess cost 2x on the machine in the seeds. This
//! crate holds the pieces of that decision:
//!
//! - [`Topology`]: per-pair links (NVLink, PCIe class, P2P, peer atomics), shared by every
//!   rank through the bootstrap, loadable from a file for machines that cannot be probed;
//! - [`CostModel`]: latency + bandwidth + switch contention per algorithm pattern;
//! - [`TuningTable`]: times measured on this host (`allreduce-perf --tune`), which beat
//!   the model;
//! - [`SelectComm`]: a [`comm_core::Communicator`] over several backends that routes each
//!   call (forced choice > tuning table > cost model > first capable backend), makes the
//!   same choice on every rank, and [`explains`](SelectComm::explain) it.

#![warn(missing_docs)]

pub mod cost;
mod select;
pub mod topology;
pub mod tuning;

pub use cost::CostModel;
pub use select::{CallInfo, Choice, SelectComm, SelectOptions, Source};
pub use topology::{Fabric, Link, PciePath, Topology};
pub use tuning::{Measurement, TuningTable};
