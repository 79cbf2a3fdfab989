//! Backends by name, as `allreduce-perf --backend` names them: `auto`, `local`, and every
//! backend of `comm_select`'s registry, started by the library's own constructors.
//!
//! `ipc` and `symm-cuda` are kept as their own types rather than as `dyn Communicator`:
//! the fused all-reduce + residual + RMSNorm is a method of the peer layer they share.

use std::sync::Arc;

use comm_core::{Bootstrap, Communicator, Error, LocalComm, Result};
use comm_ipc::IpcComm;
use comm_peer::{PeerComm, refuse_join};
use comm_select::{Auto, BackendId, Memory, SelectComm};
use comm_symm::SymmComm;
use comm_symm::cuda::CudaSymmConfig;

/// One rank's communicator.
pub enum Inner {
    /// `auto`: a backend per call.
    Select(Box<SelectComm>),
    /// `ipc`.
    Ipc(Box<IpcComm>),
    /// `symm-cuda`.
    Symm(SymmComm),
    /// Any other backend.
    Plain(Box<dyn Communicator>),
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Inner").field(&self.comm().name()).finish()
    }
}

impl Inner {
    /// The communicator.
    pub fn comm(&self) -> &dyn Communicator {
        match self {
            Inner::Select(c) => &**c,
            Inner::Ipc(c) => &**c,
            Inner::Symm(c) => c,
            Inner::Plain(c) => &**c,
        }
    }

    /// The peer layer, for the fused op, where the backend is one of it.
    pub fn peer(&self) -> Option<&PeerComm> {
        match self {
            Inner::Ipc(c) => Some(&***c),
            Inner::Symm(c) => c.as_cuda().map(|c| &**c),
            Inner::Select(_) | Inner::Plain(_) => None,
        }
    }
}

/// Every name [`start`] takes: what `allreduce-perf --list-backends` shows of this build.
pub fn names() -> Vec<&'static str> {
    let mut names = vec!["local"];
    names.extend(comm_select::registry().iter().rev().map(|r| r.id.name()));
    names.push("auto");
    names
}

/// Refuses a name [`start`] does not take, before any peer is involved.
pub fn check_name(name: &str) -> Result<()> {
    if names().iter().any(|n| n.eq_ignore_ascii_case(name)) {
        return Ok(());
    }
    Err(Error::InvalidArgument(format!(
        "unknown backend `{name}` (this build has: {})",
        names().join(", ")
    )))
}

/// Collective: starts backend `name` for this rank, on CUDA device `device` (`None`:
/// `local_rank % device_count` for GPU backends; for `auto`, that device where every rank
/// has one, else host backends only). Returns the communicator and its device.
pub fn start(
    name: &str,
    bootstrap: Arc<dyn Bootstrap>,
    device: Option<usize>,
) -> Result<(Inner, Option<usize>)> {
    if name.eq_ignore_ascii_case("auto") {
        let device = match device {
            Some(d) => Some(d),
            None => comm_select::agreed_device(&*bootstrap)?,
        };
        let select = Auto::new(bootstrap).device(device).build()?;
        return Ok((Inner::Select(Box::new(select)), device));
    }
    if name.eq_ignore_ascii_case("local") {
        if bootstrap.world_size() != 1 {
            return Err(Error::Unsupported(
                "local: ranks are threads of one process; a Python process is one rank of \
                 many here (use bootstrap, symm or auto)"
                    .into(),
            ));
        }
        let comm = LocalComm::create(1).pop().expect("one rank");
        return Ok((Inner::Plain(Box::new(comm)), None));
    }
    let id: BackendId = name.parse()?;
    let registered = comm_select::find(id)
        .ok_or_else(|| Error::Unsupported(format!("{id}: not in this build")))?;
    if id.memory() == Memory::Host {
        return Ok((Inner::Plain(registered.start(&bootstrap, None)?), None));
    }
    let device = device.unwrap_or_else(|| comm_peer::device_for(&*bootstrap));
    let inner = match id {
        BackendId::Ipc => {
            let config = comm_ipc::IpcConfig::default()
                .with_env(comm_ipc::ENV_PREFIX)
                .map_err(|e| refuse_join(&*bootstrap, e))?;
            Inner::Ipc(Box::new(IpcComm::new(bootstrap, device, config)?))
        }
        BackendId::SymmCuda => {
            let config = CudaSymmConfig::from_env().map_err(|e| refuse_join(&*bootstrap, e))?;
            Inner::Symm(SymmComm::cuda(bootstrap, device, config)?)
        }
        _ => Inner::Plain(registered.start(&bootstrap, Some(device))?),
    };
    Ok((inner, Some(device)))
}
