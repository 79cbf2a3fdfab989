//! Host backends, always compiled (MPI behind feature `mpi`).

mod local;
#[cfg(feature = "mpi")]
mod mpi;

pub use local::LocalComm;
#[cfg(feature = "mpi")]
pub use mpi::MpiComm;
