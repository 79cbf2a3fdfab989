//! The backend registry: every communicator `allreduce-perf` can measure, by name.
//!
//! A [`Backend`] is a name, a one-line description, the launch modes it can run in and a
//! constructor. The constructor runs once per rank, on that rank's thread or process,
//! and turns the rank's [`RankContext`] (its bootstrap, and in-process its thread group)
//! into a `Box<dyn Communicator>`. Adding a backend is one entry in [`all`] and a
//! constructor of a few lines; backends behind cargo features add their entry under the
//! same `cfg`.

mod auto;
mod context;

use comm_core::{BootstrapComm, Communicator, Error, LocalComm, Result};

pub use auto::create_select;
pub use context::{RankContext, ThreadGroup};

use crate::launch::Mode;

/// Builds one rank's communicator.
pub type Constructor = fn(&RankContext) -> Result<Box<dyn Communicator>>;

/// One entry of the registry.
#[derive(Debug, Clone, Copy)]
pub struct Backend {
    /// The name users pass to `--backend`.
    pub name: &'static str,
    /// The name its communicator reports ([`Communicator::name`]), which tuning tables
    /// and the selector use; differs from `name` where two registry entries are two
    /// backings of one backend (`symm` and `symm-cuda`).
    pub comm_name: &'static str,
    /// One line for `--help`.
    pub about: &'static str,
    /// Launch modes the backend can run in.
    pub modes: &'static [Mode],
    /// Whether it is measured when no `--backend` is given (in the modes it supports).
    pub default: bool,
    /// Builds one rank's communicator.
    pub create: Constructor,
}

impl Backend {
    /// True when the backend can run in `mode`.
    pub fn runs_in(&self, mode: Mode) -> bool {
        self.modes.contains(&mode)
    }
}

/// Every backend compiled into this build, in the order they are measured by default.
pub fn all() -> Vec<Backend> {
    vec![
        Backend {
            name: "local",
            comm_name: "local",
            about: "threads of one process sharing memory (comm_core::LocalComm)",
            modes: &[Mode::Threads],
            default: true,
            create: create_local,
        },
        Backend {
            name: "bootstrap",
            comm_name: "bootstrap",
            about: "data through the job's bootstrap, any launch (comm_core::BootstrapComm)",
            modes: &[Mode::Threads, Mode::Env, Mode::Mpi],
            default: true,
            create: create_bootstrap,
        },
        Backend {
            name: "symm",
            comm_name: "symm",
            about: "host symmetric heap shared by the ranks of one node (comm_symm::SymmComm)",
            modes: &[Mode::Threads, Mode::Env, Mode::Mpi],
            default: true,
            create: create_symm,
        },
        Backend {
            name: "ipc",
            comm_name: "ipc",
            about: "CUDA-IPC custom all-reduce, device memory, ranks may share a GPU (comm_ipc::IpcComm)",
            modes: &Mode::ALL,
            // Needs a GPU: measured when asked for.
            default: false,
            create: create_ipc,
        },
        Backend {
            name: "nccl",
            comm_name: "nccl",
            about: "NCCL on device memory, one GPU per rank (comm_nccl::NcclComm)",
            modes: &Mode::ALL,
            // Needs a GPU and libnccl: measured when asked for.
            default: false,
            create: create_nccl,
        },
        Backend {
            name: "symm-cuda",
            comm_name: "symm",
            about: "symm's CUDA backing: symmetric device heap, ranks may share a GPU \
                    (comm_symm::cuda::CudaSymmComm)",
            modes: &Mode::ALL,
            // Needs a GPU: measured when asked for.
            default: false,
            create: create_symm_cuda,
        },
        Backend {
            name: "auto",
            comm_name: "auto",
            about: "picks a backend per call (comm_select::SelectComm over the GPU backends that \
                    start here and the mode's defaults; reads COMM_BACKEND, COMM_TUNING, \
                    COMM_TOPOLOGY)",
            modes: &[Mode::Threads, Mode::Env, Mode::Mpi],
            default: false,
            create: create_auto,
        },
        #[cfg(feature = "mpi")]
        Backend {
            name: "mpi",
            comm_name: "mpi",
            about: "MPI's own collectives, one rank per process (comm_core::MpiComm)",
            modes: &[Mode::Env, Mode::Mpi],
            default: true,
            create: create_mpi,
        },
    ]
}

/// Looks a backend up by name; the error lists the known names.
pub fn find(name: &str) -> std::result::Result<Backend, String> {
    let backends = all();
    backends
        .iter()
        .find(|b| b.name.eq_ignore_ascii_case(name))
        .copied()
        .ok_or_else(|| {
            let known: Vec<&str> = backends.iter().map(|b| b.name).collect();
            format!(
                "unknown backend `{name}` (this build has: {})",
                known.join(", ")
            )
        })
}

/// The backends measured in `mode` when the user names none.
pub fn defaults(mode: Mode) -> Vec<Backend> {
    all()
        .into_iter()
        .filter(|b| b.default && b.runs_in(mode))
        .collect()
}

fn create_local(ctx: &RankContext) -> Result<Box<dyn Communicator>> {
    let group = ctx.thread_group().ok_or_else(|| {
        Error::Unsupported(
            "local: needs in-process ranks (run without a launcher, or use --bootstrap threads)"
                .into(),
        )
    })?;
    let comm = group.take("local", ctx.rank(), LocalComm::create);
    Ok(Box::new(comm))
}

fn create_bootstrap(ctx: &RankContext) -> Result<Box<dyn Communicator>> {
    Ok(Box::new(BootstrapComm::new(ctx.bootstrap().clone())))
}

fn create_symm(ctx: &RankContext) -> Result<Box<dyn Communicator>> {
    Ok(Box::new(comm_symm::SymmComm::new(&**ctx.bootstrap())?))
}

fn create_auto(ctx: &RankContext) -> Result<Box<dyn Communicator>> {
    Ok(Box::new(create_select(ctx)?))
}

/// MPI is initialised once per process and reused, so this works under either
/// multi-process bootstrap; under a launcher that is not MPI's, MPI sees a world of one
/// and the sweep refuses the mismatch.
#[cfg(feature = "mpi")]
fn create_mpi(_ctx: &RankContext) -> Result<Box<dyn Communicator>> {
    let bootstrap = comm_core::MpiBootstrap::init()?;
    Ok(Box::new(comm_core::MpiComm::new(&bootstrap)?))
}

fn create_ipc(ctx: &RankContext) -> Result<Box<dyn Communicator>> {
    Ok(Box::new(comm_ipc::IpcComm::from_bootstrap(
        ctx.bootstrap().clone(),
    )?))
}

fn create_symm_cuda(ctx: &RankContext) -> Result<Box<dyn Communicator>> {
    Ok(Box::new(comm_symm::cuda::CudaSymmComm::from_bootstrap(
        ctx.bootstrap().clone(),
    )?))
}

fn create_nccl(ctx: &RankContext) -> Result<Box<dyn Communicator>> {
    Ok(Box::new(comm_nccl::NcclComm::from_bootstrap(
        &**ctx.bootstrap(),
    )?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_found() {
        let backends = all();
        for b in &backends {
            assert_eq!(find(b.name).unwrap().name, b.name);
            assert_eq!(backends.iter().filter(|o| o.name == b.name).count(), 1);
        }
        let err = find("carrier-pigeon").unwrap_err();
        assert!(err.contains("local"), "{err}");
    }

    /// Tuning tables and the selector name backends by `Communicator::name`: the
    /// registry must know those names.
    #[test]
    fn registry_names_are_the_communicators_names() {
        for backend in all().into_iter().filter(|b| b.runs_in(Mode::Threads)) {
            let names = crate::launch::run_threads(2, |ctx| {
                (backend.create)(&ctx).map(|c| c.name().to_string())
            })
            .unwrap();
            for name in names {
                match name {
                    Ok(name) => assert_eq!(name, backend.comm_name),
                    // GPU backends on a machine without GPU or driver: nothing to compare.
                    Err(Error::NoDevice(_) | Error::LibraryMissing { .. }) => {}
                    Err(e) => panic!("{}: {e}", backend.name),
                }
            }
        }
    }

    #[test]
    fn every_mode_with_defaults_runs_them() {
        assert!(defaults(Mode::Threads).iter().any(|b| b.name == "local"));
        assert!(defaults(Mode::Env).iter().any(|b| b.name == "bootstrap"));
        for mode in [Mode::Threads, Mode::Env, Mode::Mpi] {
            assert!(defaults(mode).iter().all(|b| b.runs_in(mode)));
        }
    }
}
