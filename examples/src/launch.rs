//! How the ranks of a run are started: threads of this process, or one process each.
//!
//! Without a launcher, [`run_threads`] starts N ranks as threads that meet through a
//! `ThreadsBootstrap`. Under `mpirun` or `torchrun` every process is one rank, and
//! [`process_context`] builds its bootstrap from the environment (or from MPI, in a
//! build with feature `mpi`). [`Mode::detect`] picks the mode when the user does not.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use comm_core::bootstrap::LaunchInfo;
use comm_core::{Bootstrap, EnvBootstrap, Error, Result, ThreadsBootstrap};

use crate::backends::{RankContext, ThreadGroup};

/// How ranks find each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    /// Ranks are threads of this process.
    Threads,
    /// Each process is a rank; environment variables + TCP store (torchrun, or mpirun's
    /// variables without MPI linked in).
    Env,
    /// Each process is a rank; MPI (build with feature `mpi`).
    Mpi,
}

impl Mode {
    /// Every mode, in `--help` order.
    pub const ALL: [Mode; 3] = [Mode::Threads, Mode::Env, Mode::Mpi];

    /// The name accepted by `--bootstrap`.
    pub const fn name(self) -> &'static str {
        match self {
            Mode::Threads => "threads",
            Mode::Env => "env",
            Mode::Mpi => "mpi",
        }
    }

    /// True when each rank is its own process.
    pub const fn is_multi_process(self) -> bool {
        !matches!(self, Mode::Threads)
    }

    /// The mode to use when the user names none: threads unless a launcher started us;
    /// under one, MPI when this build has it and `mpi` is among the `backends` asked for
    /// (or none were named), else the environment.
    pub fn detect(backends: &[String]) -> Mode {
        if !launched() {
            return Mode::Threads;
        }
        let wants_mpi = backends.is_empty() || backends.iter().any(|b| b == "mpi");
        if cfg!(feature = "mpi") && wants_mpi {
            Mode::Mpi
        } else {
            Mode::Env
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Mode {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        Mode::ALL
            .into_iter()
            .find(|m| m.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| format!("unknown bootstrap `{s}` (expected threads, env or mpi)"))
    }
}

/// True when a launcher (mpirun, torchrun, a PMI launcher) started this process.
pub fn launched() -> bool {
    // Variables that are set but inconsistent still mean a launcher: the env bootstrap
    // then reports what is wrong with them, rather than the run quietly using threads.
    !matches!(LaunchInfo::detect(), Ok(None))
}

/// This process's rank as its launcher announced it; 0 without a launcher, or when the
/// launcher's variables cannot be read (the bootstrap reports those).
pub fn launcher_rank() -> usize {
    LaunchInfo::detect()
        .ok()
        .flatten()
        .map_or(0, |info| info.rank)
}

/// Builds this process's rank context in a multi-process `mode`.
pub fn process_context(mode: Mode) -> Result<RankContext> {
    Ok(RankContext::process(mode, process_bootstrap(mode)?))
}

fn process_bootstrap(mode: Mode) -> Result<Arc<dyn Bootstrap>> {
    match mode {
        Mode::Threads => Err(Error::InvalidArgument(
            "in-process ranks are started with run_threads".into(),
        )),
        Mode::Env => Ok(Arc::new(EnvBootstrap::from_env()?)),
        #[cfg(feature = "mpi")]
        Mode::Mpi => Ok(Arc::new(comm_core::MpiBootstrap::init()?)),
        #[cfg(not(feature = "mpi"))]
        Mode::Mpi => Err(Error::Unsupported(
            "this build has no MPI (rebuild with --features mpi)".into(),
        )),
    }
}

/// Runs `body` on `ranks` threads, each with its rank's context, and returns their
/// results in rank order. A panic on any rank is resumed here.
pub fn run_threads<R: Send>(
    ranks: usize,
    body: impl Fn(RankContext) -> R + Sync,
) -> Result<Vec<R>> {
    if ranks == 0 {
        return Err(Error::InvalidArgument("need at least one rank".into()));
    }
    let group = ThreadGroup::new(ranks);
    let body = &body;
    std::thread::scope(|scope| {
        let mut handles = Vec::with_capacity(ranks);
        for (rank, bootstrap) in ThreadsBootstrap::create(ranks).into_iter().enumerate() {
            let ctx = RankContext::threads(Arc::new(bootstrap), group.clone());
            let handle = std::thread::Builder::new()
                .name(format!("rank-{rank}"))
                .spawn_scoped(scope, move || body(ctx))?;
            handles.push(handle);
        }
        Ok(handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect())
    })
}

/// Asks CUDA for 32 hardware work queues per device instead of 8, unless the user chose.
/// Call first thing in `main`, before any thread or CUDA call.
///
/// Why: CUDA maps streams onto a device's hardware queues, several streams per queue when
/// there are more streams than queues, and work behind a running kernel in one queue waits
/// for it. Ranks that are threads sharing one GPU each spin in a kernel until their peers'
/// kernels arrive; a peer's kernel queued behind that spin would wait for the whole
/// timeout. More queues make that rare (it cannot be ruled out with many streams).
pub fn prefer_more_hardware_queues() {
    const VAR: &str = "CUDA_DEVICE_MAX_CONNECTIONS";
    if std::env::var_os(VAR).is_none() {
        // SAFETY: called at the start of `main`, before this program starts any thread.
        unsafe { std::env::set_var(VAR, "32") };
    }
}
