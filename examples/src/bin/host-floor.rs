//! `host-floor`: all-reduce figures through host memory beside the floor model of the same
//! run's `host-probe --json` (see `comm_examples::host_floor`).
//!
//! ```text
//! host-floor --probe floors.json --graph ours-r1.json --graph ours-r2.json ...
//!            [--eager FILE]... [--nccl FILE]... [--backend symm-cuda]
//! ```
//!
//! `--graph` and `--eager`: `allreduce-perf --json` files of our backend in CUDA-graph
//! replays and eager calls; `--nccl`: NCCL without peer access in graph replays. Medians over
//! the files of each kind.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use comm_examples::host_floor::{Inputs, PerfFile, back_to_back_medians, medians, table};
use comm_examples::host_probe::Floors;
use comm_examples::perf::Row;

const USAGE: &str = "usage: host-floor --probe FILE --graph FILE... [--eager FILE]... [--nccl FILE]... [--backend NAME]";

struct Options {
    probe: PathBuf,
    graph: Vec<PathBuf>,
    eager: Vec<PathBuf>,
    nccl: Vec<PathBuf>,
    backend: String,
}

fn parse() -> Result<Option<Options>, String> {
    let (mut probe, mut graph, mut eager, mut nccl) = (None, Vec::new(), Vec::new(), Vec::new());
    let mut backend = "symm-cuda".to_string();
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        if flag == "-h" || flag == "--help" {
            return Ok(None);
        }
        let value = args.next().ok_or(format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--probe" => probe = Some(PathBuf::from(value)),
            "--graph" => graph.push(value.into()),
            "--eager" => eager.push(value.into()),
            "--nccl" => nccl.push(value.into()),
            "--backend" => backend = value,
            other => return Err(format!("unknown argument {other}")),
        }
    }
    let probe = probe.ok_or("--probe is required")?;
    if graph.is_empty() {
        return Err("at least one --graph file is required".into());
    }
    Ok(Some(Options {
        probe,
        graph,
        eager,
        nccl,
        backend,
    }))
}

fn files(paths: &[PathBuf]) -> Result<Vec<PerfFile>, String> {
    paths
        .iter()
        .map(|p| serde_json::from_str(&read(p)?).map_err(|e| format!("{}: {e}", p.display())))
        .collect()
}

fn rows(paths: &[PathBuf]) -> Result<Vec<Vec<Row>>, String> {
    Ok(files(paths)?.into_iter().map(|f| f.results).collect())
}

fn read(path: &Path) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))
}

fn run(o: &Options) -> Result<String, String> {
    let floors: Floors = serde_json::from_str(&read(&o.probe)?)
        .map_err(|e| format!("{}: {e}", o.probe.display()))?;
    let graph_files = files(&o.graph)?;
    // Files without the run's description (older ones) count as ranks sharing one GPU,
    // the setting host-floor's table was made for.
    let ranks_share_a_gpu = graph_files
        .iter()
        .all(|f| f.run.is_none_or(|r| r.ranks_share_a_gpu()));
    let graph_rows: Vec<Vec<Row>> = graph_files.into_iter().map(|f| f.results).collect();
    let graph = medians(&graph_rows, &o.backend);
    if graph.is_empty() {
        return Err(format!(
            "no out-of-place rows of {} in the --graph files",
            o.backend
        ));
    }
    let eager_rows = rows(&o.eager)?;
    let eager = medians(&eager_rows, &o.backend);
    let back_to_back = back_to_back_medians(&eager_rows, &o.backend);
    let nccl = medians(&rows(&o.nccl)?, "nccl");
    Ok(table(&Inputs {
        floors: &floors,
        flagged_from: comm_peer::flagged_from(2),
        graph: &graph,
        eager: &eager,
        back_to_back: &back_to_back,
        nccl: &nccl,
        ranks_share_a_gpu,
    }))
}

fn main() -> ExitCode {
    let o = match comm_examples::usage::options_or_exit("host-floor", USAGE, parse()) {
        Ok(options) => options,
        Err(code) => return code,
    };
    match run(&o) {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("host-floor: {e}");
            ExitCode::FAILURE
        }
    }
}
