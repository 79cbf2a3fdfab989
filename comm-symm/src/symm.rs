//! `SymmComm`: one communicator over either backing of the symmetric heap.
//!
//! The algorithms (`oneshot`, `twoshot`, `lamport`, chosen by [`Algorithm`]) and their
//! guarantees are the same on both backings; only where the heap lives differs. Host
//! memory ([`HostSymmComm`]) serves CPU ranks and multi-process tests without a GPU;
//! device memory (`CudaSymmComm`, feature `cuda`) serves GPU ranks and adds the fused
//! all-reduce + residual add + RMSNorm. Code that does not care holds a `SymmComm`.

use std::time::Duration;

use comm_core::{Bootstrap, Communicator, Forward, Result};

use crate::algorithm::Algorithm;
use crate::comm::HostSymmComm;
#[cfg(feature = "cuda")]
use crate::cuda::{CudaSymmComm, CudaSymmConfig};

/// A symmetric-memory communicator on the host or on a CUDA device.
#[derive(Debug)]
#[non_exhaustive]
pub enum SymmComm {
    /// Host shared memory.
    Host(Box<HostSymmComm>),
    /// CUDA device memory.
    #[cfg(feature = "cuda")]
    Cuda(Box<CudaSymmComm>),
}

macro_rules! each {
    ($self:expr, $c:ident => $e:expr) => {
        match $self {
            SymmComm::Host($c) => $e,
            #[cfg(feature = "cuda")]
            SymmComm::Cuda($c) => $e,
        }
    };
}

impl SymmComm {
    /// Collective: a host heap for messages up to [`crate::DEFAULT_MAX_BYTES`] per rank.
    pub fn new(bootstrap: &dyn Bootstrap) -> Result<Self> {
        HostSymmComm::new(bootstrap).map(|c| SymmComm::Host(Box::new(c)))
    }

    /// Collective: a host heap for messages up to `max_bytes` per rank.
    pub fn with_max_bytes(bootstrap: &dyn Bootstrap, max_bytes: usize) -> Result<Self> {
        HostSymmComm::with_max_bytes(bootstrap, max_bytes).map(|c| SymmComm::Host(Box::new(c)))
    }

    /// Collective: a device heap on CUDA device `device`.
    #[cfg(feature = "cuda")]
    pub fn cuda(
        bootstrap: std::sync::Arc<dyn Bootstrap>,
        device: usize,
        config: CudaSymmConfig,
    ) -> Result<Self> {
        CudaSymmComm::new(bootstrap, device, config).map(|c| SymmComm::Cuda(Box::new(c)))
    }

    /// `"host"` or `"cuda"`.
    pub fn backing(&self) -> &'static str {
        match self {
            SymmComm::Host(_) => "host",
            #[cfg(feature = "cuda")]
            SymmComm::Cuda(_) => "cuda",
        }
    }

    /// Chooses the all-reduce algorithm (every rank must choose the same). On the device,
    /// `oneshot`/`twoshot` are the pull algorithms and `lamport` is one-shot push.
    pub fn use_algorithm(&self, algorithm: Algorithm) {
        match self {
            SymmComm::Host(c) => c.use_algorithm(algorithm),
            #[cfg(feature = "cuda")]
            SymmComm::Cuda(c) => c.use_algorithm(match algorithm {
                Algorithm::OneShot => Some(crate::cuda::Algorithm::OneshotPull),
                Algorithm::TwoShot => Some(crate::cuda::Algorithm::TwoshotPull),
                Algorithm::Lamport => Some(crate::cuda::Algorithm::OneshotPush),
                _ => None,
            }),
        }
    }

    /// Sets the bound on waits for peers.
    pub fn set_timeout(&mut self, timeout: Duration) {
        each!(self, c => c.set_timeout(timeout))
    }

    /// The host communicator, if this is one.
    pub fn as_host(&self) -> Option<&HostSymmComm> {
        match self {
            SymmComm::Host(c) => Some(&**c),
            #[cfg(feature = "cuda")]
            SymmComm::Cuda(_) => None,
        }
    }

    /// The CUDA communicator (with the fused all-reduce + RMSNorm), if this is one.
    #[cfg(feature = "cuda")]
    pub fn as_cuda(&self) -> Option<&CudaSymmComm> {
        match self {
            SymmComm::Cuda(c) => Some(&**c),
            SymmComm::Host(_) => None,
        }
    }
}

/// Every method goes to the backing's communicator, `async_error` included: a CUDA heap's
/// kernels report disagreements after the call returned.
impl Forward for SymmComm {
    type Target = dyn Communicator + 'static;
    fn target(&self) -> &(dyn Communicator + 'static) {
        each!(self, c => &**c)
    }
}
