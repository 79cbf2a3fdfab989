//! Who a backend is: [`BackendId`], and the [`Memory`] its buffers live in.

use std::fmt;
use std::str::FromStr;

use comm_core::{Error, Result};
use serde::{Deserialize, Serialize};

/// Where a call's buffers live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Memory {
    /// Host memory.
    Host,
    /// CUDA device memory.
    Device,
}

impl Memory {
    /// `host` or `device`.
    pub const fn name(self) -> &'static str {
        match self {
            Memory::Host => "host",
            Memory::Device => "device",
        }
    }
}

/// A backend of the workspace. [`BackendId::name`] is what its communicator's
/// [`name`](comm_core::Communicator::name) returns, and what tuning tables, `COMM_BACKEND`
/// and `allreduce-perf --backend` call it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum BackendId {
    /// `comm_core::LocalComm`: threads of one process.
    Local,
    /// `comm_core::BootstrapComm`: data through the bootstrap.
    Bootstrap,
    /// `comm_core::MpiComm`: MPI's collectives.
    Mpi,
    /// `comm_symm::SymmComm` on host shared memory.
    Symm,
    /// `comm_symm::SymmComm` on a CUDA device heap.
    SymmCuda,
    /// `comm_nccl::NcclComm`.
    Nccl,
    /// `comm_ipc::IpcComm`.
    Ipc,
}

impl BackendId {
    /// Every backend.
    pub const ALL: [BackendId; 7] = [
        BackendId::Local,
        BackendId::Bootstrap,
        BackendId::Mpi,
        BackendId::Symm,
        BackendId::SymmCuda,
        BackendId::Nccl,
        BackendId::Ipc,
    ];

    /// The communicator's name.
    pub const fn name(self) -> &'static str {
        match self {
            BackendId::Local => "local",
            BackendId::Bootstrap => "bootstrap",
            BackendId::Mpi => "mpi",
            BackendId::Symm => "symm",
            BackendId::SymmCuda => "symm-cuda",
            BackendId::Nccl => "nccl",
            BackendId::Ipc => "ipc",
        }
    }

    /// The memory its buffers live in.
    pub const fn memory(self) -> Memory {
        match self {
            BackendId::Local | BackendId::Bootstrap | BackendId::Mpi | BackendId::Symm => {
                Memory::Host
            }
            BackendId::SymmCuda | BackendId::Nccl | BackendId::Ipc => Memory::Device,
        }
    }
}

impl fmt::Display for BackendId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for BackendId {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        BackendId::ALL
            .into_iter()
            .find(|b| b.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| {
                let names: Vec<&str> = BackendId::ALL.iter().map(|b| b.name()).collect();
                Error::InvalidArgument(format!(
                    "unknown backend `{s}` (one of {})",
                    names.join(", ")
                ))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_are_unique() {
        for b in BackendId::ALL {
            assert_eq!(b.name().parse::<BackendId>().unwrap(), b);
            assert_eq!(
                BackendId::ALL
                    .iter()
                    .filter(|o| o.name() == b.name())
                    .count(),
                1
            );
        }
        assert!("carrier-pigeon".parse::<BackendId>().is_err());
    }
}
