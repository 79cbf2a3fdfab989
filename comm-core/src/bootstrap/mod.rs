//! Bootstraps: how the ranks of a job find each other and exchange small messages.
//!
//! A [`Bootstrap`] moves the few bytes that set up a communicator (NCCL unique ids, IPC
//! handles, tuning decisions, call descriptors). It is not a data path. Implementations:
//! [`ThreadsBootstrap`] (ranks are threads of one process), [`EnvBootstrap`] (environment
//! variables + a TCP store, the torchrun convention; also reads OpenMPI's variables so that
//! `mpirun` works without MPI linked in) and, with feature `mpi`, `MpiBootstrap`.

mod env_tcp;
#[cfg(feature = "mpi")]
pub(crate) mod mpi;
mod threads;

use std::time::Duration;

use crate::error::Result;

#[cfg(feature = "mpi")]
pub use self::mpi::MpiBootstrap;
pub use env_tcp::{EnvBootstrap, LaunchInfo};
pub use threads::ThreadsBootstrap;

/// Default bound on every wait of a bootstrap or host backend, unless `COMM_TIMEOUT_SECS`
/// says otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);

/// The bound on waits: `COMM_TIMEOUT_SECS` (seconds, fractions allowed) or [`DEFAULT_TIMEOUT`].
pub fn default_timeout() -> Duration {
    std::env::var("COMM_TIMEOUT_SECS")
        .ok()
        .and_then(|s| s.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s > 0.0)
        .map(Duration::from_secs_f64)
        .unwrap_or(DEFAULT_TIMEOUT)
}

/// Rank discovery and small-message exchange between the ranks of a job.
///
/// All methods except the accessors are collective: every rank must call them in the same
/// order. Every wait is bounded by [`Bootstrap::timeout`].
pub trait Bootstrap: Send + Sync {
    /// This rank, in `0..world_size()`.
    fn rank(&self) -> usize;
    /// Number of ranks in the job.
    fn world_size(&self) -> usize;
    /// This rank's index among the ranks of its node.
    fn local_rank(&self) -> usize;
    /// Number of ranks on this node.
    fn local_world_size(&self) -> usize;
    /// The bound on every wait.
    fn timeout(&self) -> Duration;

    /// Gathers every rank's `data` (lengths may differ), indexed by rank.
    fn all_gather_bytes(&self, data: &[u8]) -> Result<Vec<Vec<u8>>>;

    /// Returns the `data` of rank `root` on every rank (other ranks' `data` is ignored).
    fn broadcast_bytes(&self, data: &[u8], root: usize) -> Result<Vec<u8>>;

    /// Returns once every rank has called it.
    fn barrier(&self) -> Result<()> {
        self.all_gather_bytes(&[]).map(drop)
    }
}

/// Implements [`Bootstrap`] for pointers to one, forwarding every method.
macro_rules! forward_bootstrap {
    ($($ty:ty),*) => {$(
        impl<B: Bootstrap + ?Sized> Bootstrap for $ty {
            fn rank(&self) -> usize {
                (**self).rank()
            }
            fn world_size(&self) -> usize {
                (**self).world_size()
            }
            fn local_rank(&self) -> usize {
                (**self).local_rank()
            }
            fn local_world_size(&self) -> usize {
                (**self).local_world_size()
            }
            fn timeout(&self) -> Duration {
                (**self).timeout()
            }
            fn all_gather_bytes(&self, data: &[u8]) -> Result<Vec<Vec<u8>>> {
                (**self).all_gather_bytes(data)
            }
            fn broadcast_bytes(&self, data: &[u8], root: usize) -> Result<Vec<u8>> {
                (**self).broadcast_bytes(data, root)
            }
            fn barrier(&self) -> Result<()> {
                (**self).barrier()
            }
        }
    )*};
}

// One bootstrap usually serves several communicators (and the program itself): these let
// a constructor that takes `B: Bootstrap` by value be handed a shared or borrowed one.
forward_bootstrap!(&B, std::sync::Arc<B>, Box<B>);
