//! `auto`: a [`SelectComm`] over every backend that starts here, agreed across ranks.
//!
//! ```no_run
//! use std::sync::Arc;
//! use comm_core::{Communicator, CommunicatorExt, EnvBootstrap, ReduceOp};
//!
//! let comm = comm_select::auto(Arc::new(EnvBootstrap::from_env()?))?;
//! let mut x = vec![1.0f32; 4096];
//! comm.all_reduce_in_place_slice(&mut x, ReduceOp::Sum)?;
//! # Ok::<(), comm_core::Error>(())
//! ```
//!
//! The [`registry`] lists the backends of this build (cargo features `nccl`, `ipc`,
//! `symm`, `cuda`): GPU backends first, where every rank sees a GPU, then the host ones.
//! Each is started on every rank, and the ranks agree through the bootstrap on whether it
//! started everywhere: one that failed on any rank is left out on all of them (with a note
//! on rank 0's stderr), so the member lists stay identical. Backends that cannot be started
//! from a bootstrap alone (`LocalComm`'s in-process group, `MpiComm`) join through
//! [`Auto::with_member`]. The topology is [`probe`](crate::probe)d on the agreed device,
//! and `COMM_BACKEND`, `COMM_TUNING` and `COMM_TOPOLOGY` ([`SelectOptions::from_env`])
//! apply as usual.
//!
//! Adding a backend is its crate and one entry in [`registry`].

use std::fmt;
use std::sync::Arc;

use comm_core::{Bootstrap, BootstrapComm, Communicator, Error, Result};

use crate::backend::{BackendId, Memory};
use crate::select::{SelectComm, SelectOptions};

/// Starts one rank's communicator on `device` (the CUDA ordinal; `None` on host-only ranks).
type Start = fn(&Arc<dyn Bootstrap>, Option<usize>) -> Result<Box<dyn Communicator>>;

/// A backend [`auto`] can start.
#[derive(Clone, Copy)]
pub struct Registered {
    /// Which backend.
    pub id: BackendId,
    /// One line for help texts.
    pub about: &'static str,
    start: Start,
}

impl fmt::Debug for Registered {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registered").field("id", &self.id).finish()
    }
}

impl Registered {
    /// Collective: starts this rank's communicator. `device` is the CUDA ordinal for GPU
    /// backends (`None`: the one [`agreed_device`] picks).
    pub fn start(
        &self,
        bootstrap: &Arc<dyn Bootstrap>,
        device: Option<usize>,
    ) -> Result<Box<dyn Communicator>> {
        (self.start)(bootstrap, device)
    }
}

/// Every backend of this build that [`auto`] can start, in the selector's order (earlier
/// wins a tie): GPU backends, then host ones.
pub fn registry() -> &'static [Registered] {
    &[
        #[cfg(feature = "nccl")]
        Registered {
            id: BackendId::Nccl,
            about: "NCCL on device memory, one GPU per rank (comm_nccl::NcclComm)",
            start: gpu::nccl,
        },
        #[cfg(feature = "ipc")]
        Registered {
            id: BackendId::Ipc,
            about: "CUDA-IPC custom all-reduce, device memory, ranks may share a GPU \
                    (comm_ipc::IpcComm)",
            start: gpu::ipc,
        },
        #[cfg(all(feature = "symm", feature = "cuda"))]
        Registered {
            id: BackendId::SymmCuda,
            about: "symmetric device heap, ranks may share a GPU (comm_symm::SymmComm, CUDA)",
            start: gpu::symm_cuda,
        },
        #[cfg(feature = "symm")]
        Registered {
            id: BackendId::Symm,
            about: "host symmetric heap shared by the ranks of one node (comm_symm::SymmComm)",
            start: |bootstrap, _| Ok(Box::new(comm_symm::SymmComm::new(&**bootstrap)?)),
        },
        Registered {
            id: BackendId::Bootstrap,
            about: "data through the job's bootstrap, any launch (comm_core::BootstrapComm)",
            start: |bootstrap, _| Ok(Box::new(BootstrapComm::new(bootstrap.clone()))),
        },
    ]
}

/// Looks a backend of this build up.
pub fn find(id: BackendId) -> Option<&'static Registered> {
    registry().iter().find(|r| r.id == id)
}

/// Collective: a [`SelectComm`] over every registered backend that starts on every rank.
pub fn auto(bootstrap: Arc<dyn Bootstrap>) -> Result<SelectComm> {
    Auto::new(bootstrap).build()
}

/// Collective: this rank's CUDA ordinal when every rank sees a GPU (`local_rank %
/// device_count`, the rule of the GPU backends), else `None` on every rank.
pub fn agreed_device(bootstrap: &dyn Bootstrap) -> Result<Option<usize>> {
    let device = gpu::device_count()
        .filter(|&n| n > 0)
        .map(|n| bootstrap.local_rank() % n);
    Ok(if agree(bootstrap, device.is_some())? {
        device
    } else {
        None
    })
}

/// A configurable [`auto`].
pub struct Auto {
    bootstrap: Arc<dyn Bootstrap>,
    backends: Option<Vec<BackendId>>,
    device: Option<Option<usize>>,
    members: Vec<Box<dyn Communicator>>,
    options: Option<SelectOptions>,
}

impl fmt::Debug for Auto {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Auto")
            .field("backends", &self.backends)
            .field("device", &self.device)
            .field("members", &self.members.len())
            .finish_non_exhaustive()
    }
}

impl Auto {
    /// Every registered backend, the agreed device, options from the environment.
    pub fn new(bootstrap: Arc<dyn Bootstrap>) -> Self {
        Auto {
            bootstrap,
            backends: None,
            device: None,
            members: Vec::new(),
            options: None,
        }
    }

    /// Tries only these backends (in registry order); unknown to this build: left out.
    pub fn backends(mut self, backends: &[BackendId]) -> Self {
        self.backends = Some(backends.to_vec());
        self
    }

    /// Uses CUDA device `device` (`None`: host backends only) instead of [`agreed_device`].
    /// Every rank must say whether it has one alike.
    pub fn device(mut self, device: Option<usize>) -> Self {
        self.device = Some(device);
        self
    }

    /// Adds a member started elsewhere (same kind, same order on every rank), after the
    /// GPU backends and before the host ones.
    pub fn with_member(mut self, member: Box<dyn Communicator>) -> Self {
        self.members.push(member);
        self
    }

    /// Uses `options` instead of [`SelectOptions::from_env`]; a missing topology is probed.
    pub fn options(mut self, options: SelectOptions) -> Self {
        self.options = Some(options);
        self
    }

    /// Collective: starts the backends, agrees on them, probes and builds the selector.
    pub fn build(self) -> Result<SelectComm> {
        let bootstrap = &self.bootstrap;
        let device = match self.device {
            Some(device) => device,
            None => agreed_device(&**bootstrap)?,
        };
        let wanted = |id: BackendId| self.backends.as_ref().is_none_or(|b| b.contains(&id));
        let mut gpu = Vec::new();
        let mut host = Vec::new();
        for entry in registry().iter().filter(|r| wanted(r.id)) {
            let on_device = entry.id.memory() == Memory::Device;
            if on_device && device.is_none() {
                continue;
            }
            let made = entry.start(bootstrap, device);
            if agree(&**bootstrap, made.is_ok())? {
                let members = if on_device { &mut gpu } else { &mut host };
                members.extend(made.ok());
            } else {
                let why = match made {
                    Err(e) => e.to_string(),
                    Ok(_) => "failed to start on another rank".into(),
                };
                note(&**bootstrap, entry.id, &format!("left out: {why}"));
            }
        }
        let members: Vec<Box<dyn Communicator>> =
            gpu.into_iter().chain(self.members).chain(host).collect();
        let options = match self.options {
            Some(options) => Ok(options),
            None => SelectOptions::from_env(),
        };
        // A rank whose options are refused must not leave its peers waiting in the probe.
        let mut options = match (agree(&**bootstrap, options.is_ok())?, options) {
            (true, Ok(options)) => options,
            (_, Err(e)) => return Err(e),
            (false, Ok(_)) => {
                return Err(Error::InvalidArgument(
                    "auto: another rank's selection options were refused (its error says why)"
                        .into(),
                ));
            }
        };
        // Probing is collective: every rank probes, whatever rank 0 then uses.
        let probed = crate::probe(&**bootstrap, device)?;
        options.topology.get_or_insert(probed);
        if members.is_empty() {
            return Err(Error::Unsupported(
                "auto: no backend started on every rank".into(),
            ));
        }
        SelectComm::new(self.bootstrap.clone(), members, options)
    }
}

/// Collective: true when `ok` is true on every rank.
fn agree(bootstrap: &dyn Bootstrap, ok: bool) -> Result<bool> {
    Ok(bootstrap
        .all_gather_bytes(&[u8::from(ok)])?
        .iter()
        .all(|b| b.as_slice() == [1]))
}

fn note(bootstrap: &dyn Bootstrap, backend: BackendId, message: &str) {
    if bootstrap.rank() == 0 {
        eprintln!("auto: {backend} {message}");
    }
}

#[cfg(feature = "cuda")]
mod gpu {
    #[cfg(any(feature = "nccl", feature = "ipc", feature = "symm"))]
    use std::sync::Arc;

    #[cfg(any(feature = "nccl", feature = "ipc", feature = "symm"))]
    use comm_core::{Bootstrap, Communicator, Error, Result};

    pub(super) fn device_count() -> Option<usize> {
        comm_core::cuda::device_count().ok()
    }

    #[cfg(any(feature = "nccl", feature = "ipc", feature = "symm"))]
    fn device(device: Option<usize>) -> Result<usize> {
        device.ok_or_else(|| Error::NoDevice("no CUDA device chosen".into()))
    }

    /// A backend's configuration from the environment; when it is malformed, this rank
    /// still joins the backend's first exchange, so that the others fail rather than wait.
    #[cfg(any(feature = "ipc", feature = "symm"))]
    fn config_or_join<C>(bootstrap: &dyn Bootstrap, config: Result<C>) -> Result<C> {
        config.inspect_err(|_| {
            let _ = bootstrap.all_gather_bytes(&[0u8]);
        })
    }

    #[cfg(feature = "nccl")]
    pub(super) fn nccl(
        bootstrap: &Arc<dyn Bootstrap>,
        ordinal: Option<usize>,
    ) -> Result<Box<dyn Communicator>> {
        let count = device_count().unwrap_or(1);
        // NCCL refuses two ranks on one GPU, and may hang rather than fail: not tried.
        if bootstrap.world_size() > 1 && bootstrap.local_world_size() > count {
            return Err(Error::Unsupported(
                "NCCL needs one GPU per rank of a node".into(),
            ));
        }
        Ok(Box::new(comm_nccl::NcclComm::new(
            bootstrap.clone(),
            device(ordinal)?,
        )?))
    }

    #[cfg(feature = "ipc")]
    pub(super) fn ipc(
        bootstrap: &Arc<dyn Bootstrap>,
        ordinal: Option<usize>,
    ) -> Result<Box<dyn Communicator>> {
        let config = config_or_join(
            &**bootstrap,
            comm_ipc::IpcConfig::default().with_env(comm_ipc::ENV_PREFIX),
        )?;
        Ok(Box::new(comm_ipc::IpcComm::new(
            bootstrap.clone(),
            device(ordinal)?,
            config,
        )?))
    }

    #[cfg(feature = "symm")]
    pub(super) fn symm_cuda(
        bootstrap: &Arc<dyn Bootstrap>,
        ordinal: Option<usize>,
    ) -> Result<Box<dyn Communicator>> {
        let config = config_or_join(&**bootstrap, comm_symm::cuda::CudaSymmConfig::from_env())?;
        Ok(Box::new(comm_symm::SymmComm::cuda(
            bootstrap.clone(),
            device(ordinal)?,
            config,
        )?))
    }
}

#[cfg(not(feature = "cuda"))]
mod gpu {
    pub(super) fn device_count() -> Option<usize> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_names_are_unique_and_host_backends_come_last() {
        let all = registry();
        for (i, r) in all.iter().enumerate() {
            assert_eq!(all.iter().filter(|o| o.id == r.id).count(), 1);
            if r.id.memory() == Memory::Device {
                assert!(all[..i].iter().all(|o| o.id.memory() == Memory::Device));
            }
        }
        assert!(find(BackendId::Bootstrap).is_some());
    }

    #[test]
    fn auto_on_host_ranks_starts_what_it_can_and_runs() {
        use comm_core::{CommunicatorExt, ReduceOp, ThreadsBootstrap};
        let handles: Vec<_> = ThreadsBootstrap::create(3)
            .into_iter()
            .map(|b| {
                std::thread::spawn(move || {
                    let options = SelectOptions::default();
                    let comm = Auto::new(Arc::new(b))
                        .device(None)
                        .options(options)
                        .build()
                        .unwrap();
                    let mut x = vec![comm.rank() as f32; 100];
                    comm.all_reduce_in_place_slice(&mut x, ReduceOp::Sum)
                        .unwrap();
                    (x[0], comm.backend_names())
                })
            })
            .collect();
        for h in handles {
            let (sum, names) = h.join().unwrap();
            assert_eq!(sum, 3.0);
            assert!(names.contains(&"bootstrap".to_string()), "{names:?}");
            for name in &names {
                let id: BackendId = name.parse().unwrap();
                assert_eq!(id.memory(), Memory::Host, "{names:?}");
            }
        }
    }
}
