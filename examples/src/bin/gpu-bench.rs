//! `gpu-bench`: graph-replay timings of every algorithm and of the fused op of a GPU
//! backend over peer memory (see `comm_examples::gpu::bench`).
//!
//! ```text
//! gpu-bench --backend ipc|symm-cuda [--ranks 8] [--algo NAME,...] [--iters 1000] [--batch 20]
//!           [--threads 512] [--max-blocks N] [--backing auto|vmm|ipc|host|host-vmm]
//!           [--sizes 42K,64M] [--fused 3x7168,4096x8192]
//! mpirun -np 2 gpu-bench --backend ipc --procs     # one rank per process (and GPU)
//! ```
//!
//! Exits 1 when a checked result was wrong, 2 on a usage error. `COMM_TIMEOUT_SECS` bounds
//! every wait.

use std::process::ExitCode;

use comm_examples::gpu::args;
use comm_examples::gpu::bench::{Options, run};
use comm_peer::Algorithm;
use comm_symm::cuda::Backing;

const USAGE: &str = "usage: gpu-bench --backend ipc|symm-cuda [--ranks N | --procs] \
                     [--algo NAME,...] [--iters N] [--batch N] [--threads N] [--max-blocks N] \
                     [--backing auto|vmm|ipc|host|host-vmm] [--sizes BYTES,...] \
                     [--fused ROWSxHIDDEN,...]";

fn main() -> ExitCode {
    comm_examples::launch::prefer_more_hardware_queues();
    let opts = match comm_examples::usage::options_or_exit("gpu-bench", USAGE, parse()) {
        Ok(options) => options,
        Err(code) => return code,
    };
    match run(&opts) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("gpu-bench: FAILED: a result was wrong or differed across ranks");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("gpu-bench: error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn parse() -> Result<Option<Options>, String> {
    use lexopt::prelude::*;
    let mut backend = None;
    let mut opts = Options {
        backend: comm_examples::gpu::Backend::Ipc,
        algos: Algorithm::ALL.to_vec(),
        ranks: Some(8),
        iters: 1000,
        batch: 20,
        backing: Backing::Auto,
        threads: comm_peer::config::DEFAULT_THREADS,
        max_blocks: None,
        sizes: comm_examples::gpu::bench::DEFAULT_SIZES.to_vec(),
        fused: comm_examples::gpu::bench::DEFAULT_FUSED.to_vec(),
    };
    let mut parser = lexopt::Parser::from_env();
    while let Some(arg) = parser.next().map_err(|e| e.to_string())? {
        match arg {
            Long("backend") => backend = Some(args::backend(&mut parser)?),
            Long("algo") | Long("algos") => opts.algos = args::algorithms(&mut parser)?,
            Long("ranks") => opts.ranks = Some(args::number(&mut parser, "--ranks")?),
            Long("procs") => opts.ranks = None,
            Long("iters") => opts.iters = args::number(&mut parser, "--iters")?.max(1),
            Long("batch") => opts.batch = args::number(&mut parser, "--batch")?.max(1),
            Long("threads") => opts.threads = args::number(&mut parser, "--threads")? as u32,
            Long("max-blocks") => {
                opts.max_blocks = Some(args::number(&mut parser, "--max-blocks")? as u32)
            }
            Long("backing") => opts.backing = args::backing(&mut parser)?,
            Long("sizes") => opts.sizes = args::sizes(&mut parser)?,
            Long("fused") => opts.fused = args::shapes(&mut parser)?,
            Short('h') | Long("help") => return Ok(None),
            other => return Err(other.unexpected().to_string()),
        }
    }
    opts.backend = backend.ok_or("--backend is required")?;
    Ok(Some(opts))
}
