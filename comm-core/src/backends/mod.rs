//! Host backends, always compiled (MPI behind feature `mpi`): [`LocalComm`] for threads of
//! one process, [`BootstrapComm`] for processes that share only a bootstrap.

mod bootstrap_comm;
mod local;
#[cfg(feature = "mpi")]
mod mpi;

pub use bootstrap_comm::BootstrapComm;
pub use local::LocalComm;
#[cfg(feature = "mpi")]
pub use mpi::MpiComm;
