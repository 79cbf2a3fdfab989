//! [`IpcComm`]: the [`Communicator`](comm_core::Communicator) over CUDA-IPC regions.

use std::sync::Arc;
use std::time::Duration;

use comm_core::cuda::cudarc::driver::CudaContext;
use comm_core::{Bootstrap, RawStream, Result};
use comm_peer::{
    Algorithm, PeerBuffer, PeerComm, PeerConfig, PeerSource, Registered, device_for, init_buffer,
    refuse_join,
};

/// One rank of a CUDA-IPC communicator (see the crate docs).
///
/// Calls enqueue one kernel on the buffers' stream and return; nothing synchronises, so
/// calls can be captured into CUDA graphs. [`IpcComm::synchronize`] waits, bounded.
#[derive(Debug)]
pub struct IpcComm {
    inner: PeerComm,
}

comm_peer::forward_communicator!(IpcComm, |c| &c.inner);

impl IpcComm {
    /// Joins the communicator of every rank of `bootstrap`, on CUDA device `device`.
    ///
    /// Collective. Every rank checks that it can take part (driver, NVRTC, device, kernels)
    /// and that all ranks use the same [`PeerConfig`]; then every rank allocates its region,
    /// and the regions are exchanged and mapped. If any rank fails, all return an error.
    pub fn new(bootstrap: Arc<dyn Bootstrap>, device: usize, config: PeerConfig) -> Result<Self> {
        let b = bootstrap.clone();
        let inner = PeerComm::join(
            "ipc",
            bootstrap,
            device,
            config,
            "",
            Box::new(move |ready, layout| {
                let sentinel = layout.lamport_range();
                let region = Registered::new(ready.context(), &*b, layout.total, |buf| {
                    init_buffer(buf, sentinel)
                })?;
                Ok(Box::new(region) as Box<dyn PeerSource>)
            }),
        )?;
        Ok(IpcComm { inner })
    }

    /// Joins on device `local_rank % device_count`, with the defaults overridden by the
    /// `COMM_IPC_*` environment variables.
    pub fn from_bootstrap(bootstrap: Arc<dyn Bootstrap>) -> Result<Self> {
        let device = device_for(&*bootstrap);
        match PeerConfig::default().with_env(crate::ENV_PREFIX) {
            Ok(config) => Self::new(bootstrap, device, config),
            Err(e) => Err(refuse_join(&*bootstrap, e)),
        }
    }

    /// The shared layer's communicator underneath (the fused op, the signal primitives).
    pub fn peer(&self) -> &PeerComm {
        &self.inner
    }

    /// The CUDA context of this rank's device.
    pub fn context(&self) -> &Arc<CudaContext> {
        self.inner.context()
    }

    /// The configuration (as given; `max_blocks` as resolved is [`Self::max_blocks`]).
    pub fn config(&self) -> &PeerConfig {
        self.inner.config()
    }

    /// Most blocks one launch uses.
    pub fn max_blocks(&self) -> u32 {
        self.inner.max_blocks()
    }

    /// The bound on GPU spin-waits.
    pub fn timeout(&self) -> Duration {
        self.inner.timeout()
    }

    /// Uses `algorithm` (a name of [`Algorithm`], or `auto`) for the following calls, or
    /// the automatic choice for `None`. Every rank must choose alike.
    pub fn set_algorithm(&self, algorithm: Option<&str>) -> Result<()> {
        self.inner.set_algorithm(algorithm)
    }

    /// The algorithm a call of `bytes` per rank uses now.
    pub fn algorithm_for(&self, bytes: usize) -> Algorithm {
        self.inner.algorithm_for(bytes)
    }

    /// Collective: device memory every rank can read, for zero-copy all-reduces (see
    /// [`PeerComm::alloc`]).
    pub fn alloc(&self, bytes: usize) -> Result<PeerBuffer> {
        self.inner.alloc(bytes)
    }

    /// Waits for the work enqueued on `stream`, bounded; `Error::Timeout` if a kernel gave
    /// up waiting for a peer. Must not be called while `stream` is being captured.
    pub fn synchronize(&self, stream: RawStream) -> Result<()> {
        self.inner.synchronize(stream)
    }
}
