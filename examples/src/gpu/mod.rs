//! The device checker (`gpu-check`) and bench (`gpu-bench`) of the GPU backends built on the
//! peer-memory layer: one program each drives every backend (`--backend ipc|symm-cuda`).

pub mod args;
pub mod bench;
pub mod check;
pub mod data;
mod registered;
mod zero_copy;

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use comm_core::{Bootstrap, Error, Result};
use comm_ipc::IpcComm;
use comm_peer::{PeerComm, PeerConfig};
use comm_symm::cuda::{Backing, CudaSymmComm, CudaSymmConfig};

/// A GPU backend over peer memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// comm-ipc: CUDA IPC handles of `cuMemAlloc` regions.
    Ipc,
    /// comm-symm's CUDA heap: VMM segments (or legacy IPC, or host memory).
    SymmCuda,
}

impl FromStr for Backend {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s.trim() {
            "ipc" => Ok(Backend::Ipc),
            "symm-cuda" | "symm" => Ok(Backend::SymmCuda),
            other => Err(Error::InvalidArgument(format!(
                "unknown GPU backend `{other}` (ipc or symm-cuda)"
            ))),
        }
    }
}

impl Backend {
    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Ipc => "ipc",
            Backend::SymmCuda => "symm-cuda",
        }
    }
}

/// A joined communicator of either backend.
#[derive(Debug)]
pub enum GpuComm {
    /// comm-ipc.
    Ipc(IpcComm),
    /// comm-symm (CUDA).
    Symm(CudaSymmComm),
}

impl GpuComm {
    /// Collective: joins `backend` on `device` with `config` (and `backing` for symm-cuda).
    pub fn join(
        backend: Backend,
        bootstrap: &Arc<dyn Bootstrap>,
        device: usize,
        config: PeerConfig,
        backing: Backing,
    ) -> Result<Self> {
        match backend {
            Backend::Ipc => IpcComm::new(bootstrap.clone(), device, config).map(GpuComm::Ipc),
            Backend::SymmCuda => CudaSymmComm::new(
                bootstrap.clone(),
                device,
                CudaSymmConfig {
                    peer: config,
                    backing,
                },
            )
            .map(GpuComm::Symm),
        }
    }

    /// Collective: joins `backend` as `comm_select`'s registry starts it: on the device of
    /// the rank's local rank, with the defaults overridden by `COMM_IPC_*` or `COMM_SYMM_*`.
    /// For programs that need the fused op, which the registry's boxed communicator hides.
    pub fn from_env(backend: Backend, bootstrap: &Arc<dyn Bootstrap>) -> Result<Self> {
        match backend {
            Backend::Ipc => IpcComm::from_bootstrap(bootstrap.clone()).map(GpuComm::Ipc),
            Backend::SymmCuda => CudaSymmComm::from_bootstrap(bootstrap.clone()).map(GpuComm::Symm),
        }
    }

    /// The layer's communicator: every collective, the fused op, zero-copy buffers.
    pub fn peer(&self) -> &PeerComm {
        match self {
            GpuComm::Ipc(c) => c,
            GpuComm::Symm(c) => c,
        }
    }

    /// The communicator as users hold it.
    pub fn as_dyn(&self) -> &dyn comm_core::Communicator {
        match self {
            GpuComm::Ipc(c) => c,
            GpuComm::Symm(c) => c,
        }
    }

    /// One line on how the memory was obtained.
    pub fn describe(&self) -> String {
        let p = self.peer();
        let memory = match self {
            GpuComm::Ipc(_) => "CUDA IPC regions".to_string(),
            GpuComm::Symm(c) => format!(
                "{} heap, segment {} MiB",
                match c.backing() {
                    Backing::Vmm => "VMM (cuMemCreate + fd)",
                    Backing::HostMapped => "host-mapped (memfd registered with every device)",
                    Backing::HostVmm => "host VMM (cuMemCreate on the host NUMA node + fd)",
                    _ => "legacy CUDA IPC",
                },
                c.segment_bytes() >> 20
            ),
        };
        format!(
            "{memory}, {} ranks share a device, {} blocks max, {} threads per block max",
            p.group().sharing(),
            p.max_blocks(),
            p.config().threads
        )
    }
}

/// The bound on waits of the programs: `COMM_TIMEOUT_SECS` when set, else `default`.
pub fn timeout_or(default: Duration) -> Duration {
    if std::env::var_os("COMM_TIMEOUT_SECS").is_some() {
        comm_core::bootstrap::default_timeout()
    } else {
        default
    }
}
