//! The `allreduce-perf` program: parse the flags, pick the launch mode and backends,
//! sweep each backend, print the tables and write the requested files.
//!
//! Exit status: 0 when every backend ran (and, with `--check`, every result was right),
//! 1 when a backend failed or a result was wrong, 2 when the command line is bad. Only
//! rank 0 prints and writes files; the other ranks of a multi-process run stay quiet.

use std::process::ExitCode;
use std::time::{SystemTime, UNIX_EPOCH};

use super::meta::{self, RunInfo};

use super::args::{self, Args, Parsed, USAGE};
use super::data::{checkable, mix64};
use super::progress::Progress;
use super::report::{self, Row, TableHeader};
use super::sweep::{Algorithms, Event, SweepConfig, run_in_process, run_rank};
use super::{plot, tune};
use crate::backends::{self, Backend, RankContext};
use crate::launch::{Mode, launcher_rank, process_context};

/// `println!` that ignores a closed stdout (`allreduce-perf | head`): the sweep goes on
/// and still writes the files asked for, instead of panicking on a rank's thread.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout().lock(), $($arg)*);
    }};
}

/// In-process ranks when `--ranks` is not given.
pub const DEFAULT_RANKS: usize = 4;

/// Why the program stops early.
#[derive(Debug)]
pub enum CliError {
    /// The command line cannot be run (exit 2).
    Usage(String),
    /// Something failed while running (exit 1).
    Run(String),
}

/// Runs the program on the process's arguments.
pub fn main() -> ExitCode {
    let args = match args::parse(std::env::args_os().skip(1)) {
        Ok(Parsed::Help) => {
            out!("{}", USAGE.trim_end());
            return ExitCode::SUCCESS;
        }
        Ok(Parsed::Run(args)) => args,
        Err(e) => return usage_error(&e.0),
    };
    match run(&args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(CliError::Usage(msg)) => usage_error(&msg),
        Err(CliError::Run(msg)) => {
            eprintln!("allreduce-perf: error: {msg}");
            ExitCode::FAILURE
        }
    }
}

fn usage_error(msg: &str) -> ExitCode {
    // Under a launcher every rank finds the same fault: one message is enough.
    if launcher_rank() == 0 {
        eprintln!("allreduce-perf: {msg}\n(see allreduce-perf --help)");
    }
    ExitCode::from(2)
}

/// Runs the sweeps `args` asks for. `Ok(false)` when a backend failed or a checked
/// result was wrong.
pub fn run(args: &Args) -> Result<bool, CliError> {
    if args.list_backends {
        for b in backends::all() {
            let modes: Vec<&str> = b.modes.iter().map(|m| m.name()).collect();
            out!("{:<12} {} [{}]", b.name, b.about, modes.join(", "));
        }
        return Ok(true);
    }
    let mode = args
        .bootstrap
        .unwrap_or_else(|| Mode::detect(&args.backends));
    let selected = select(&args.backends, mode)?;
    if args.check && !checkable(args.op) {
        return Err(CliError::Usage(format!(
            "--check does not know op {}",
            args.op
        )));
    }
    let process = if mode.is_multi_process() {
        Some(process_context(mode).map_err(|e| CliError::Run(format!("{mode} bootstrap: {e}")))?)
    } else {
        None
    };
    let root = process.as_ref().is_none_or(|ctx| ctx.rank() == 0);
    let ranks = match &process {
        Some(ctx) => {
            if root && args.ranks.is_some_and(|r| r != ctx.world_size()) {
                eprintln!(
                    "allreduce-perf: --ranks ignored: the launcher started {} ranks",
                    ctx.world_size()
                );
            }
            ctx.world_size()
        }
        None => args.ranks.unwrap_or(DEFAULT_RANKS),
    };
    let seed = match (&process, args.seed) {
        (_, Some(seed)) => seed,
        (None, None) => clock_seed(),
        // Every rank must draw the same data: rank 0's clock decides.
        (Some(ctx), None) => {
            let mine = clock_seed().to_le_bytes();
            let got = ctx
                .bootstrap()
                .broadcast_bytes(&mine, 0)
                .map_err(|e| CliError::Run(format!("sharing the seed: {e}")))?;
            u64::from_le_bytes(got.as_slice().try_into().unwrap_or(mine))
        }
    };
    let cfg = SweepConfig {
        sizes: args.sizes.clone(),
        dtype: args.dtype,
        op: args.op,
        iters: args.iters,
        warmup: args.warmup,
        check: args.check,
        // Both unless one is asked for alone, as nccl-tests prints them side by side.
        out_of_place: args.out_of_place || !args.in_place,
        in_place: args.in_place || !args.out_of_place,
        seed,
        // Tuning is about choosing among algorithms too: measure them all unless told.
        algorithms: match (&args.algorithms, &args.tune) {
            (Some(algorithms), _) => algorithms.clone(),
            (None, Some(_)) => Algorithms::All,
            (None, None) => Algorithms::Default,
        },
        launches: args.launches(),
    };
    let progress = Progress::stderr();
    let observe = |event: Event<'_>| {
        if !root {
            return;
        }
        match event {
            Event::Begin {
                backend,
                algorithm,
                launch,
            } => {
                out!("#");
                out!(
                    "{}",
                    report::header(&TableHeader {
                        backend,
                        algorithm,
                        launch,
                        bootstrap: mode.name(),
                        ranks,
                        dtype: args.dtype.name(),
                        op: args.op.name(),
                        check: args.check,
                        out_of_place: cfg.out_of_place,
                        in_place: cfg.in_place,
                    })
                );
            }
            Event::End(rows) => {
                progress.clear();
                out!("{}", report::footer(rows));
            }
            Event::Starting {
                backend,
                index,
                total,
                bytes,
            } => progress.starting(backend, index, total, bytes),
            Event::Note { backend, message } => {
                progress.clear();
                eprintln!("allreduce-perf: {backend}: {message}");
            }
            Event::Finished(row) => {
                progress.clear();
                out!("{}", report::format_row(row));
            }
        }
    };
    let info = RunInfo {
        program: "allreduce-perf".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        hostname: meta::hostname(),
        command: std::env::args().collect(),
        date: meta::utc_iso8601(SystemTime::now()),
        world_size: ranks,
        bootstrap: mode.name().into(),
        gpus: comm_core::cuda::device_count().unwrap_or(0),
        dtype: args.dtype.name().into(),
        op: args.op.name().into(),
        sizes: args.sizes.clone(),
        iters: args.iters,
        warmup: args.warmup,
        check: args.check,
        seed,
        out_of_place: cfg.out_of_place,
        in_place: cfg.in_place,
        launch: cfg.launches,
    };
    if root {
        out!("{}", info.header());
    }
    let mut rows: Vec<Row> = Vec::new();
    let mut ok = true;
    for backend in &selected {
        let create = |ctx: &RankContext| backend.create(ctx);
        let result = match &process {
            None => run_in_process(backend.name, &create, ranks, &cfg, &observe),
            Some(ctx) => run_rank(ctx, backend.name, &create, &cfg, &observe),
        };
        progress.clear();
        match result {
            Ok(got) => {
                ok &= !got.iter().any(Row::failed);
                rows.extend(got);
            }
            Err(e) => {
                if root {
                    eprintln!("allreduce-perf: backend {}: {e}", backend.name);
                }
                ok = false;
            }
        }
    }
    // Every rank takes part in the probe; only rank 0 writes.
    let fabric = args
        .tune
        .as_ref()
        .map(|_| tune::fabric(process.as_ref(), ranks, &rows));
    if root {
        if let Some(Err(e)) = &fabric {
            eprintln!("allreduce-perf: tuning table: fabric unknown: {e}");
        }
        let fabric = match fabric {
            Some(Ok(fabric)) => fabric.name(),
            _ => "unknown",
        };
        ok &= write_outputs(args, &info, &rows, fabric);
    }
    Ok(ok)
}

/// The backends to run: those named (in order), or the mode's defaults.
fn select(names: &[String], mode: Mode) -> Result<Vec<Backend>, CliError> {
    if names.is_empty() {
        let defaults = backends::defaults(mode);
        if defaults.is_empty() {
            return Err(CliError::Usage(format!(
                "this build has no default backend for --bootstrap {mode}; name one with --backend"
            )));
        }
        return Ok(defaults);
    }
    names
        .iter()
        .map(|name| {
            let b = backends::find(name).map_err(CliError::Usage)?;
            if !b.runs_in(mode) {
                let modes: Vec<&str> = b.modes.iter().map(|m| m.name()).collect();
                return Err(CliError::Usage(format!(
                    "backend {} cannot run with --bootstrap {mode} (it runs with: {})",
                    b.name,
                    modes.join(", ")
                )));
            }
            Ok(b)
        })
        .collect()
}

/// Writes JSON, CSV, the plot and the tuning table (measured over `fabric`) as asked;
/// false if any could not be written.
fn write_outputs(args: &Args, info: &RunInfo, rows: &[Row], fabric: &str) -> bool {
    let mut ok = true;
    let mut report = |what: &str, path: &std::path::Path, r: std::io::Result<()>| match r {
        Ok(()) => eprintln!("allreduce-perf: wrote {what} to {}", path.display()),
        Err(e) => {
            eprintln!(
                "allreduce-perf: cannot write {what} to {}: {e}",
                path.display()
            );
            ok = false;
        }
    };
    if let Some(path) = &args.json {
        report("JSON", path, report::write_json(path, info, rows));
    }
    if let Some(path) = &args.csv {
        report("CSV", path, report::write_csv(path, rows));
    }
    if let Some(path) = &args.plot {
        report("plot", path, plot::write_svg(path, rows));
    }
    if let Some(path) = &args.tune {
        let note = format!(
            "{} (on {}, {})",
            info.command.join(" "),
            info.hostname,
            info.date
        );
        let table = tune::tuning_table(rows, fabric, &note);
        report(
            "tuning table",
            path,
            table.save(path).map_err(std::io::Error::other),
        );
    }
    ok
}

fn clock_seed() -> u64 {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    mix64(now ^ u64::from(std::process::id()))
}
