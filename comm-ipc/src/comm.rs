//! [`IpcComm`]: the [`Communicator`](comm_core::Communicator) over CUDA-IPC regions.

use std::sync::Arc;

use comm_core::{Bootstrap, Result};
use comm_peer::{
    PeerComm, PeerConfig, PeerSource, Registered, device_for, init_buffer, refuse_join,
};

/// One rank of a CUDA-IPC communicator (see the crate docs).
///
/// Calls enqueue their kernels on the buffers' stream and return (one per launch: a message
/// larger than `max_bytes` runs as several); nothing synchronises, so calls can be
/// captured into CUDA graphs. `synchronize` (of the `PeerComm` it derefs to)
/// waits, bounded.
#[derive(Debug)]
pub struct IpcComm {
    inner: PeerComm,
}

impl comm_core::Forward for IpcComm {
    type Target = PeerComm;
    fn target(&self) -> &PeerComm {
        &self.inner
    }
}

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
}

/// Everything of the shared layer's communicator: `synchronize`, `alloc` (zero-copy
/// buffers), `set_algorithm`, `algorithm_for`, the fused op, the group's primitives.
impl std::ops::Deref for IpcComm {
    type Target = PeerComm;

    fn deref(&self) -> &PeerComm {
        &self.inner
    }
}
