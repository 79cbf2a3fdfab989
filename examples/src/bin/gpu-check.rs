//! `gpu-check`: the device checks of a GPU backend over peer memory (see
//! `comm_examples::gpu::check`).
//!
//! ```text
//! mpirun -np 2 gpu-check --backend ipc|symm-cuda [--algo NAME,...] [--quick] [--cycles N]
//!                        [--backing auto|vmm|ipc|host|host-vmm]
//! gpu-check --backend ipc --ranks 2      # in-process ranks, one thread each
//! ```
//!
//! One rank per process (mpirun, or the RANK/WORLD_SIZE environment), or `--ranks N`
//! threads of this process (rank r on GPU r % devices). Prints PASS/FAIL per check; exits
//! 1 on any failure, 2 on a usage error. `COMM_TIMEOUT_SECS` bounds every wait.

use std::process::ExitCode;
use std::sync::Arc;

use comm_core::{Bootstrap, EnvBootstrap, ThreadsBootstrap};
use comm_examples::gpu::args;
use comm_examples::gpu::check::{Options, run_rank};
use comm_peer::Algorithm;
use comm_symm::cuda::Backing;

const USAGE: &str = "usage: gpu-check --backend ipc|symm-cuda [--algo NAME,...] [--quick] \
                     [--cycles N] [--backing auto|vmm|ipc|host|host-vmm] [--ranks N]";

fn main() -> ExitCode {
    comm_examples::launch::prefer_more_hardware_queues();
    let (opts, ranks) = match comm_examples::usage::options_or_exit("gpu-check", USAGE, parse()) {
        Ok(options) => options,
        Err(code) => return code,
    };
    let passed = match ranks {
        Some(n) => {
            let handles: Vec<_> = ThreadsBootstrap::create(n)
                .into_iter()
                .map(|b| {
                    let opts = opts.clone();
                    std::thread::spawn(move || run_rank(Arc::new(b), &opts))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or(false))
                .fold(true, |a, b| a & b)
        }
        None => match EnvBootstrap::from_env() {
            Ok(b) => run_rank(Arc::new(b) as Arc<dyn Bootstrap>, &opts),
            Err(e) => {
                eprintln!("gpu-check: bootstrap: {e}");
                false
            }
        },
    };
    if passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn parse() -> Result<Option<(Options, Option<usize>)>, String> {
    use lexopt::prelude::*;
    let mut backend = None;
    let mut opts = Options {
        backend: comm_examples::gpu::Backend::Ipc,
        algos: Algorithm::ALL.to_vec(),
        quick: false,
        cycles: 1000,
        backing: Backing::Auto,
    };
    let mut cycles = None;
    let mut ranks = None;
    let mut parser = lexopt::Parser::from_env();
    while let Some(arg) = parser.next().map_err(|e| e.to_string())? {
        match arg {
            Long("backend") => backend = Some(args::backend(&mut parser)?),
            Long("algo") | Long("algos") => opts.algos = args::algorithms(&mut parser)?,
            Long("quick") => opts.quick = true,
            Long("cycles") => cycles = Some(args::number(&mut parser, "--cycles")?),
            Long("backing") => opts.backing = args::backing(&mut parser)?,
            Long("ranks") => ranks = Some(args::number(&mut parser, "--ranks")?),
            Short('h') | Long("help") => return Ok(None),
            other => return Err(other.unexpected().to_string()),
        }
    }
    opts.backend = backend.ok_or("--backend is required")?;
    opts.cycles = cycles.unwrap_or(if opts.quick { 100 } else { 1000 });
    Ok(Some((opts, ranks)))
}
