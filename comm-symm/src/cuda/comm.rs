//! [`CudaSymmComm`]: the [`Communicator`](comm_core::Communicator) over the device
//! symmetric heap.

use std::cell::Cell;
use std::sync::Arc;

use comm_core::{Bootstrap, Result};
use comm_peer::config::Env;
use comm_peer::{PeerComm, PeerConfig, device_for, refuse_join};

use super::backing::Backing;
use super::heap::map_segments;

/// The prefix of this backend's environment variables.
pub const ENV_PREFIX: &str = "COMM_SYMM";

/// Settings of a [`CudaSymmComm`]; every rank must use the same (checked when joining).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaSymmConfig {
    /// The peer-memory layer's settings (sizes, algorithm, timeout, validation, grid).
    pub peer: PeerConfig,
    /// VMM, legacy IPC, host memory, or [`Backing::Auto`]: host memory where some pair of
    /// ranks' devices cannot access each other, else the device memory every rank can use.
    pub backing: Backing,
}

impl Default for CudaSymmConfig {
    fn default() -> Self {
        CudaSymmConfig {
            // Push mailboxes take 3 (world + 2) times this per rank; one-shot push is a
            // latency path, so the heap keeps them small.
            peer: PeerConfig {
                lamport_max_bytes: 1 << 20,
                ..PeerConfig::default()
            },
            backing: Backing::Auto,
        }
    }
}

impl CudaSymmConfig {
    /// The defaults, overridden by the `COMM_SYMM_*` variables of [`PeerConfig::with_env`]
    /// and `COMM_SYMM_BACKING` (`auto`, `vmm`, `ipc`, `host` or `host-vmm`).
    pub fn from_env() -> Result<Self> {
        let d = CudaSymmConfig::default();
        let backing = match Env(ENV_PREFIX).var("BACKING") {
            Some(v) => Backing::parse(&v)?,
            None => d.backing,
        };
        Ok(CudaSymmConfig {
            peer: d.peer.with_env(ENV_PREFIX)?,
            backing,
        })
    }
}

/// One rank of a symmetric-memory communicator on a CUDA device.
///
/// Calls check their arguments, optionally agree on them with every rank (one bootstrap
/// exchange), and enqueue their kernels on the buffers' stream (one per launch: a message
/// larger than `max_bytes` runs as several); nothing synchronises, so calls can be
/// captured into CUDA graphs. `synchronize` (of the `PeerComm` it derefs to) waits, bounded,
/// and reports a kernel that gave up waiting for a peer as `Error::Timeout`; the
/// communicator refuses work after that.
#[derive(Debug)]
pub struct CudaSymmComm {
    inner: PeerComm,
    backing: Backing,
    segment_bytes: usize,
}

impl comm_core::Forward for CudaSymmComm {
    type Target = PeerComm;
    fn target(&self) -> &PeerComm {
        &self.inner
    }
}

impl CudaSymmComm {
    /// Collective: joins every rank of `bootstrap` (all on this node) on CUDA device
    /// `device`, and sets up the heap. If any rank fails, all return an error.
    pub fn new(
        bootstrap: Arc<dyn Bootstrap>,
        device: usize,
        config: CudaSymmConfig,
    ) -> Result<Self> {
        let b = bootstrap.clone();
        let shape = Cell::new((Backing::Auto, 0usize));
        let backing = config.backing;
        let inner = PeerComm::join(
            "symm-cuda",
            bootstrap,
            device,
            config.peer,
            &format!("{backing:?}"),
            Box::new(|ready, layout| {
                let mapped = map_segments(
                    &*b,
                    ready.context(),
                    layout.total,
                    backing,
                    layout.lamport_range(),
                    Ok(()),
                )?;
                shape.set((mapped.backing, mapped.size));
                Ok(mapped.source)
            }),
        )?;
        let (backing, segment_bytes) = shape.get();
        Ok(CudaSymmComm {
            inner,
            backing,
            segment_bytes,
        })
    }

    /// Joins on device `local_rank % device_count`, with [`CudaSymmConfig::from_env`].
    pub fn from_bootstrap(bootstrap: Arc<dyn Bootstrap>) -> Result<Self> {
        let device = device_for(&*bootstrap);
        match CudaSymmConfig::from_env() {
            Ok(config) => Self::new(bootstrap, device, config),
            Err(e) => Err(refuse_join(&*bootstrap, e)),
        }
    }

    /// True for VMM segments (of device or host memory).
    pub fn is_vmm(&self) -> bool {
        matches!(self.backing, Backing::Vmm | Backing::HostVmm)
    }

    /// The backing the ranks chose (never [`Backing::Auto`]).
    pub fn backing(&self) -> Backing {
        self.backing
    }

    /// Bytes of every rank's segment (header included, rounded up to the granularity).
    pub fn segment_bytes(&self) -> usize {
        self.segment_bytes
    }

    /// Sets the bound on waits for peers (kernels and host).
    pub fn set_timeout(&mut self, timeout: std::time::Duration) {
        self.inner.set_timeout(timeout);
    }
}

/// Everything of the shared layer's communicator: `synchronize`, `use_algorithm`,
/// `algorithm_for`, the fused `all_reduce_residual_rmsnorm`, the group's primitives.
impl std::ops::Deref for CudaSymmComm {
    type Target = PeerComm;

    fn deref(&self) -> &PeerComm {
        &self.inner
    }
}
