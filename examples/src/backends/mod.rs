//! The backend registry: every communicator `allreduce-perf` can measure, by name.
//!
//! A [`Backend`] is a name, a one-line description, the launch modes it can run in and a
//! way to build it, once per rank, on that rank's thread or process, from the rank's
//! [`RankContext`] (its bootstrap, and in-process its thread group). Most come from
//! `comm_select`'s registry, which `auto` starts too: adding a backend there is enough.
//! Backends that need more than a bootstrap (`local`, `mpi`) and `auto` itself have an
//! entry and a constructor here.

mod auto;
mod context;

use comm_core::{Communicator, Error, LocalComm, Result};
use comm_select::BackendId;

pub use auto::create_select;
pub use context::{RankContext, ThreadGroup};

use crate::launch::Mode;

/// Builds one rank's communicator.
pub type Constructor = fn(&RankContext) -> Result<Box<dyn Communicator>>;

/// One entry of the registry.
#[derive(Debug, Clone, Copy)]
pub struct Backend {
    /// The name users pass to `--backend`; also what its communicator's
    /// [`Communicator::name`] returns, which tuning tables and the selector use.
    pub name: &'static str,
    /// One line for `--help`.
    pub about: &'static str,
    /// Launch modes the backend can run in.
    pub modes: &'static [Mode],
    /// Whether it is measured when no `--backend` is given (in the modes it supports).
    pub default: bool,
    create: Create,
}

/// Where a backend comes from.
#[derive(Debug, Clone, Copy)]
enum Create {
    /// `comm_select`'s registry, which `auto` starts too.
    Library(BackendId),
    /// A constructor of this crate, for backends that need more than a bootstrap.
    Here(Constructor),
}

impl Backend {
    /// True when the backend can run in `mode`.
    pub fn runs_in(&self, mode: Mode) -> bool {
        self.modes.contains(&mode)
    }

    /// Collective: builds this rank's communicator.
    pub fn create(&self, ctx: &RankContext) -> Result<Box<dyn Communicator>> {
        match self.create {
            Create::Library(id) => {
                let registered = comm_select::find(id)
                    .ok_or_else(|| Error::Unsupported(format!("{id}: not in this build")))?;
                let device = match id.memory() {
                    comm_select::Memory::Device => Some(ctx.device()?),
                    comm_select::Memory::Host => None,
                };
                registered.start(ctx.bootstrap(), device)
            }
            Create::Here(make) => make(ctx),
        }
    }

    /// True for a backend `comm_select::auto` starts itself.
    pub fn in_library(&self) -> bool {
        matches!(self.create, Create::Library(_))
    }
}

/// Every backend compiled into this build, in the order they are measured by default:
/// `local`, then `comm_select`'s registry with its host backends first, then `auto` (and
/// `mpi` with feature `mpi`).
pub fn all() -> Vec<Backend> {
    let local = Backend {
        name: "local",
        about: "threads of one process sharing memory (comm_core::LocalComm)",
        modes: &[Mode::Threads],
        default: true,
        create: Create::Here(create_local),
    };
    let library = comm_select::registry().iter().rev().map(|r| {
        let host = r.id.memory() == comm_select::Memory::Host;
        Backend {
            name: r.id.name(),
            about: r.about,
            modes: &Mode::ALL,
            // GPU backends need a GPU: measured when asked for.
            default: host,
            create: Create::Library(r.id),
        }
    });
    let auto = Backend {
        name: "auto",
        about: "picks a backend per call (comm_select::auto: the backends above that start \
                on every rank, and local or mpi where they run; reads COMM_BACKEND, \
                COMM_TUNING, COMM_TOPOLOGY)",
        modes: &Mode::ALL,
        default: false,
        create: Create::Here(create_auto),
    };
    let mut out: Vec<Backend> = std::iter::once(local).chain(library).collect();
    out.push(auto);
    #[cfg(feature = "mpi")]
    out.push(Backend {
        name: "mpi",
        about: "MPI's own collectives, one rank per process (comm_core::MpiComm)",
        modes: &[Mode::Env, Mode::Mpi],
        default: true,
        create: Create::Here(create_mpi),
    });
    out
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
                backend.create(&ctx).map(|c| c.name().to_string())
            })
            .unwrap();
            for name in names {
                match name {
                    Ok(name) => assert_eq!(name, backend.name),
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
