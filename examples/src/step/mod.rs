//! `verify-step`: the seeds' decode-step workload, timed per backend.
//!
//! A step is `--calls` all-reduces (sum) of `--count` elements, each followed by a small
//! op that depends on its result and feeds the next call ([`chain`]). On a GPU backend
//! the whole step is captured into one CUDA graph and replayed ([`gpu`]); on a host
//! backend it is a plain loop ([`host`]). Each backend's step is checked once against
//! the f64 reference, then timed: the median over `--steps` steps, slowest rank. Ranks
//! are threads of this process (`--ranks`), or processes under `mpirun`/`torchrun`.
//!
//! With `--fused` each call is a layer of a model instead: all-reduce, residual add and
//! RMSNorm over rows of `--hidden`, fused where the backend can ([`fused`]).

pub mod chain;
pub mod fused;
pub mod gpu;
pub mod host;

use std::process::ExitCode;
use std::time::Duration;

use comm_core::{Communicator, DType, Error, Result};

use crate::backends::{self, RankContext};
use crate::launch::{Mode, launched, process_context, run_threads};

const USAGE: &str = "\
usage: verify-step [--calls N] [--count N] [--dtype bf16|f16|f32] [--steps N] [--warmup N]
                   [--ranks N] [--backend NAME,...|all|auto] [--fused [--hidden N]]

  --calls N      all-reduces per step (default 122, the seeds' decode step)
  --count N      elements per all-reduce (default 21504: 42 KB of bf16)
  --dtype T      bf16 (default), f16 or f32
  --steps N      timed steps (default 200); the median is reported
  --warmup N     untimed steps first (default 10)
  --ranks N      in-process ranks when no launcher started us (default: one per GPU,
                 4 without a GPU)
  --backend L    comma-separated registry names, `all` (every backend of the launch
                 mode that starts here) or `auto` (default: all,auto)
  --fused        each call is a layer: all-reduce + residual add + RMSNorm (bf16, rows
                 of --hidden), checked against an f64 reference; `how` says graph+fused
                 (the backend's fused kernel: ipc, symm-cuda) or graph+norm (its
                 all-reduce, then an add + RMSNorm kernel); GPU backends only
  --hidden N     row length of --fused (default 7168; --count must be whole rows)
";

/// What to run.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// All-reduces per step.
    pub calls: usize,
    /// Elements per all-reduce.
    pub count: usize,
    /// Element type.
    pub dtype: DType,
    /// Timed steps.
    pub steps: usize,
    /// Untimed steps before.
    pub warmup: usize,
    /// In-process ranks.
    pub ranks: usize,
    /// Backends, as given (`all` expands at run time).
    pub backends: Vec<String>,
    /// Each call is all-reduce + residual add + RMSNorm ([`fused`]).
    pub fused: bool,
    /// Row length of the fused step's RMSNorm.
    pub hidden: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            calls: 122,
            // 3 tokens of hidden size 7168: the seeds' verify pass.
            count: 3 * 7168,
            dtype: DType::BF16,
            steps: 200,
            warmup: 10,
            ranks: default_ranks(),
            backends: vec!["all".into(), "auto".into()],
            fused: false,
            hidden: 7168,
        }
    }
}

/// One rank's result for one backend.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timing {
    /// Median step time.
    pub step: Duration,
    /// Elements that missed the reference in the checked step.
    pub wrong: usize,
    /// How the step ran.
    pub how: How,
}

/// How a step ran: the table's `how` column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum How {
    /// A plain loop on the host.
    Loop,
    /// One CUDA graph of the all-reduces and the dependent kernel.
    Graph,
    /// One CUDA graph of the backend's fused all-reduce + residual add + RMSNorm.
    GraphFused,
    /// One CUDA graph of all-reduces, each followed by our residual add + RMSNorm kernel.
    GraphNorm,
}

impl How {
    /// The word in the table.
    pub fn label(self) -> &'static str {
        match self {
            How::Loop => "loop",
            How::Graph => "graph",
            How::GraphFused => "graph+fused",
            How::GraphNorm => "graph+norm",
        }
    }

    /// True when the step ran as a CUDA graph (the selector then routes from its graph
    /// rows).
    pub fn is_graph(self) -> bool {
        !matches!(self, How::Loop)
    }
}

/// In-process ranks when `--ranks` is not given: one per GPU (GPU backends take one GPU
/// per rank), else as many as `allreduce-perf` starts, so that a host run communicates.
pub fn default_ranks() -> usize {
    match comm_core::cuda::device_count() {
        Ok(gpus) if gpus > 0 => gpus,
        _ => crate::perf::cli::DEFAULT_RANKS,
    }
}

/// Parses the command line (without the program name); `None` asks for the help text.
pub fn parse<I>(args: I) -> std::result::Result<Option<Config>, String>
where
    I: IntoIterator,
    I::Item: Into<std::ffi::OsString>,
{
    use lexopt::prelude::*;

    let mut cfg = Config::default();
    let mut parser = lexopt::Parser::from_args(args);
    let text = |parser: &mut lexopt::Parser, flag: &str| -> std::result::Result<String, String> {
        parser
            .value()
            .map_err(|e| e.to_string())?
            .into_string()
            .map_err(|v| format!("{flag}: `{}` is not valid UTF-8", v.to_string_lossy()))
    };
    let number = |parser: &mut lexopt::Parser, flag: &str| -> std::result::Result<usize, String> {
        let v = text(parser, flag)?;
        v.parse()
            .map_err(|_| format!("{flag}: `{v}` is not a number"))
    };
    while let Some(arg) = parser.next().map_err(|e| e.to_string())? {
        match arg {
            Short('h') | Long("help") => return Ok(None),
            Long("calls") => cfg.calls = number(&mut parser, "--calls")?,
            Long("count") => cfg.count = number(&mut parser, "--count")?,
            Long("steps") => cfg.steps = number(&mut parser, "--steps")?.max(1),
            Long("warmup") => cfg.warmup = number(&mut parser, "--warmup")?,
            Long("ranks") => cfg.ranks = number(&mut parser, "--ranks")?.max(1),
            Long("hidden") => cfg.hidden = number(&mut parser, "--hidden")?,
            Long("fused") => cfg.fused = true,
            Long("dtype") => {
                let v = text(&mut parser, "--dtype")?;
                cfg.dtype = v.parse().map_err(|e| format!("--dtype: {e}"))?;
                if !matches!(cfg.dtype, DType::BF16 | DType::F16 | DType::F32) {
                    return Err(gpu::unsupported(cfg.dtype).to_string());
                }
            }
            Long("backend") => {
                cfg.backends = text(&mut parser, "--backend")?
                    .split(',')
                    .map(|s| s.trim().to_string())
                    .filter(|s| !s.is_empty())
                    .collect()
            }
            _ => return Err(arg.unexpected().to_string()),
        }
    }
    if cfg.fused {
        fused::Shape::of(&cfg)?;
    }
    Ok(Some(cfg))
}

/// The program: exit 0 when every backend ran and matched the reference.
pub fn main() -> ExitCode {
    let cfg = match crate::usage::options_or_exit(
        "verify-step",
        USAGE,
        parse(std::env::args_os().skip(1)),
    ) {
        Ok(options) => options,
        Err(code) => return code,
    };
    let mode = if launched() { Mode::Env } else { Mode::Threads };
    let names = expand(&cfg.backends, mode);
    let ok = match mode {
        // Each backend gets fresh threads: in-process groups are built once per run.
        Mode::Threads => names
            .iter()
            .enumerate()
            .map(|(i, name)| {
                run_threads(cfg.ranks, |ctx| run_rank(&ctx, &cfg, &names[i..=i], i == 0))
                    .map_err(|e| Error::backend("verify-step", format!("{name}: {e}")))
            })
            .collect::<Result<Vec<_>>>()
            .map(|all| all.concat()),
        _ => process_context(mode).map(|ctx| vec![run_rank(&ctx, &cfg, &names, true)]),
    };
    match ok {
        Ok(all) if all.iter().all(|&ok| ok) => ExitCode::SUCCESS,
        Ok(_) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("verify-step: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `all` becomes every registry backend of `mode` but `auto`, in registry order.
fn expand(names: &[String], mode: Mode) -> Vec<String> {
    let mut out = Vec::new();
    for name in names {
        if name == "all" {
            out.extend(
                backends::all()
                    .into_iter()
                    .filter(|b| b.runs_in(mode) && b.name != "auto")
                    .map(|b| b.name.to_string()),
            );
        } else {
            out.push(name.clone());
        }
    }
    out
}

/// Collective: runs every backend on this rank; true when all were right. Rank 0 prints.
fn run_rank(ctx: &RankContext, cfg: &Config, names: &[String], header: bool) -> bool {
    let root = ctx.rank() == 0;
    if root && header {
        let what = if cfg.fused {
            format!(
                "layers (all-reduce + residual add + RMSNorm over rows of {})",
                cfg.hidden
            )
        } else {
            "all-reduces".into()
        };
        println!(
            "# verify-step: {} {what} of {} {} ({} B) per step, {} ranks ({}), {} steps",
            cfg.calls,
            cfg.count,
            cfg.dtype,
            cfg.count * cfg.dtype.size(),
            ctx.world_size(),
            ctx.mode(),
            cfg.steps
        );
        println!(
            "# {:<10} {:>11} {:>12} {:>14} {:>7}  choice",
            "backend", "how", "step (us)", "per call (us)", "#wrong"
        );
    }
    let mut ok = true;
    for name in names {
        match run_backend(ctx, cfg, name) {
            Ok((t, choice)) => {
                ok &= t.wrong == 0;
                if root {
                    let us = t.step.as_secs_f64() * 1e6;
                    println!(
                        "  {:<10} {:>11} {:>12.1} {:>14.2} {:>7}  {}",
                        name,
                        t.how.label(),
                        us,
                        us / cfg.calls.max(1) as f64,
                        t.wrong,
                        choice.unwrap_or_default()
                    );
                }
            }
            // A GPU backend on a machine without one is not a failure of the step.
            Err(Error::NoDevice(_) | Error::LibraryMissing { .. }) if !cfg!(test) => {
                if root {
                    println!("  {name:<10} skipped: no GPU or library here");
                }
            }
            // `all` means every backend that can run here (NCCL refuses ranks sharing a
            // GPU); a backend named on its own must run.
            Err(Error::Unsupported(why)) if !cfg.backends.contains(name) => {
                if root {
                    println!("  {name:<10} skipped: {why}");
                }
            }
            Err(e) => {
                ok = false;
                if root {
                    println!("  {name:<10} FAILED: {e}");
                }
            }
        }
    }
    ok
}

/// One backend on this rank: its timing (slowest rank's median, wrong summed over ranks)
/// and, for `auto`, what it chose.
fn run_backend(ctx: &RankContext, cfg: &Config, name: &str) -> Result<(Timing, Option<String>)> {
    let backend = backends::find(name).map_err(Error::InvalidArgument)?;
    let ctl = &**ctx.bootstrap();
    // `auto` is built as its concrete type, so that it can say what it chose.
    let selector = if name == "auto" {
        Some(backends::create_select(ctx)?)
    } else {
        None
    };
    // The fused op is no part of the trait: backends that have it are built as their type.
    let peer = match &selector {
        None if cfg.fused => fused::peer_backend(backend.name, ctx)?,
        _ => None,
    };
    let boxed;
    let comm: &dyn Communicator = match (&selector, &peer) {
        (Some(s), _) => s,
        (None, Some(p)) => p.as_dyn(),
        (None, None) => {
            boxed = backend.create(ctx)?;
            &*boxed
        }
    };
    let caps = comm.capabilities();
    let has_gpu = comm_core::cuda::device_count().is_ok_and(|n| n > 0);
    let on_device = caps.device_memory && (!caps.host_memory || has_gpu);
    let mine = if cfg.fused {
        match &peer {
            Some(p) => fused::run(fused::Layer::Fused(p.peer()), ctl, cfg),
            None if on_device => fused::run(fused::Layer::Separate(comm), ctl, cfg),
            None => Err(fused::refuse(name, has_gpu)),
        }
    } else if on_device {
        gpu::run(comm, ctl, cfg)
    } else {
        match cfg.dtype {
            DType::BF16 => host::run::<comm_core::bf16>(comm, ctl, cfg),
            DType::F16 => host::run::<comm_core::f16>(comm, ctl, cfg),
            DType::F32 => host::run::<f32>(comm, ctl, cfg),
            other => Err(gpu::unsupported(other)),
        }
    };
    // Every rank reports, failed or not, so that none waits for a rank that gave up.
    let record = match &mine {
        Ok(t) => [t.step.as_secs_f64(), t.wrong as f64, 1.0],
        Err(_) => [0.0, 0.0, 0.0],
    };
    let bytes: Vec<u8> = record.iter().flat_map(|v| v.to_le_bytes()).collect();
    let all = ctl.all_gather_bytes(&bytes)?;
    let timing = mine?;
    let field = |b: &[u8], i: usize| f64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().expect("8"));
    if let Some(r) = all.iter().position(|b| b.len() != 24 || field(b, 2) != 1.0) {
        return Err(Error::backend("verify-step", format!("rank {r} failed")));
    }
    let slowest = all.iter().map(|b| field(b, 0)).fold(0.0, f64::max);
    let wrong: f64 = all.iter().map(|b| field(b, 1)).sum();
    let choice = selector.map(|s| {
        // Inside the step's graph the selector routes from the graph rows: report that.
        let launch = if timing.how.is_graph() {
            comm_select::Launch::Graph
        } else {
            comm_select::Launch::Eager
        };
        let call = comm_select::CallInfo::all_reduce(
            cfg.dtype,
            comm_core::ReduceOp::Sum,
            cfg.count,
            if on_device {
                comm_select::Memory::Device
            } else {
                comm_select::Memory::Host
            },
        )
        .with_launch(launch);
        match s.choose(&call) {
            Ok(c) => format!("{} ({:?})", c.label(), c.source),
            Err(e) => format!("none ({e})"),
        }
    });
    Ok((
        Timing {
            step: Duration::from_secs_f64(slowest),
            wrong: wrong as usize,
            how: timing.how,
        },
        choice,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_parse_and_the_host_step_matches_the_reference() {
        let cfg = parse(
            "--calls 7 --count=33 --dtype f32 --steps 3 --warmup 1 --ranks 3 --backend local,bootstrap"
                .split(' ')
                .map(String::from),
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            (cfg.calls, cfg.count, cfg.dtype, cfg.ranks),
            (7, 33, DType::F32, 3)
        );
        assert!(parse(["--dtype", "i32"]).is_err());
        assert!(parse(["--calls"]).is_err());
        assert!(parse(["--frobnicate"]).is_err());
        assert!(parse(["stray"]).is_err());
        assert_eq!(parse(["--help"]), Ok(None));
        // Without a GPU the host backends run on several ranks, so that they communicate.
        if comm_core::cuda::device_count().is_ok_and(|n| n == 0) {
            let defaults = parse(Vec::<String>::new()).unwrap().unwrap();
            assert_eq!(defaults.ranks, crate::perf::cli::DEFAULT_RANKS);
        }
        for (i, name) in expand(&cfg.backends, Mode::Threads).iter().enumerate() {
            let names = std::slice::from_ref(name);
            let ok = run_threads(cfg.ranks, |ctx| run_rank(&ctx, &cfg, names, i == 0)).unwrap();
            assert!(ok.iter().all(|&ok| ok), "{name}");
        }
    }

    #[test]
    fn fused_flags_parse_and_host_backends_are_refused() {
        let parsed = |line: &str| parse(line.split(' ').map(String::from));
        let cfg = parsed("--fused --backend local").unwrap().unwrap();
        assert!(cfg.fused);
        assert_eq!((cfg.calls, cfg.count, cfg.hidden), (122, 21504, 7168));
        let cfg2 = parsed("--fused --hidden 4096 --count 8192")
            .unwrap()
            .unwrap();
        assert_eq!((cfg2.count, cfg2.hidden), (8192, 4096));
        // Each is refused with the reason, whatever the order of the flags.
        for (line, says) in [
            ("--fused --dtype f32", "bf16"),
            ("--dtype f16 --fused", "bf16"),
            ("--fused --hidden 7", "multiple of 8"),
            ("--fused --count 100", "rows"),
            ("--count 7000 --fused", "rows"),
            ("--fused --calls 0", "--calls"),
            ("--fused --hidden", "--hidden"),
        ] {
            let e = parsed(line).unwrap_err();
            assert!(e.contains(says), "{line}: {e}");
        }
        // Without --fused the row length does not matter.
        assert!(parsed("--hidden 7 --count 100").is_ok());

        let has_gpu = comm_core::cuda::device_count().is_ok_and(|n| n > 0);
        let errors = run_threads(2, |ctx| run_backend(&ctx, &cfg, "local").err()).unwrap();
        for e in errors {
            match e {
                Some(Error::Unsupported(why)) if has_gpu => assert!(why.contains("--fused")),
                Some(Error::NoDevice(why)) if !has_gpu => assert!(why.contains("--fused")),
                other => panic!("local with --fused: {other:?}"),
            }
        }
    }
}
