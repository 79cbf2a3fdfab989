//! Command-line flags of `allreduce-perf`, parsed with `lexopt`.
//!
//! Parsing never panics and never exits: it returns [`Parsed`] or an [`ArgError`] whose
//! message names the flag and the bad value; the binary prints it and exits with 2.
//! Flag spellings follow nccl-tests where one exists (`-b/-e/-f/-n/-w/-d/-o`).

use std::ffi::OsString;
use std::fmt;
use std::path::PathBuf;

use comm_core::{DType, ReduceOp};

use super::launches::Launches;
use super::sweep::Algorithms;
use crate::launch::Mode;

/// Sizes swept when `--sizes` is not given.
pub const DEFAULT_SIZES: &str = "8:64M";

/// Largest number of sizes one sweep may have: a typo in `--factor` should not mean
/// a sweep that never ends.
const MAX_SIZES: usize = 4096;

/// The help text.
pub const USAGE: &str = "\
allreduce-perf: all-reduce latency and bandwidth over a sweep of message sizes.

USAGE:
    allreduce-perf [OPTIONS]
    mpirun -np N allreduce-perf [OPTIONS]     (one rank per process)

OPTIONS:
    --sizes SPEC         sizes in bytes: MIN:MAX (grown by --factor), MIN:MAX:FACTOR,
                         or a comma list;
                         suffixes K, M, G (powers of 1024) [default: 8:64M]
    -b, --minbytes N     MIN of the range (with -e)
    -e, --maxbytes N     MAX of the range (with -b)
    -f, --factor F       growth factor of a MIN:MAX range, > 1 [default: 2]
    -d, --dtype T        f32, f64, f16, bf16, i32, i64, u8 [default: f32]
    -o, --op OP          sum, prod, min, max, avg [default: sum]
    -n, --iters N        timed iterations per size and placement [default: as many as
                         fit in 0.25 s, 3 to 20, from the slowest rank's first call];
                         device backends with ranks sharing a GPU in this process: at
                         most 2048 / (ranks per GPU), which they can queue together
    -w, --warmup N       untimed iterations per size and placement [default: as many as
                         fit in 0.05 s, 1 to 5]; the first size also gets up to 500
                         untimed calls, at most 0.2 s, before anything is timed
    --backend NAME       backend to measure; repeat or comma-separate for several
                         (one table each) [default: every default backend of the mode]
    --algo NAME          algorithm of the backend to measure (e.g. symm: oneshot, twoshot,
                         lamport; ipc: oneshot-pull, twoshot-pull, oneshot-push,
                         twoshot-push); repeat or comma-separate for several, one table
                         each; `all` for every one [default: the backend's own choice;
                         all with --tune]
    --list-backends      print the backends of this build and exit
    --ranks N            in-process ranks when not under a launcher [default: 4]
    --bootstrap MODE     threads, env or mpi [default: detected: env or mpi under
                         mpirun/torchrun, else threads]
    --out-of-place       measure only out-of-place calls (separate send and receive
                         buffers) [default: out of place and in place, side by side]
    --in-place           measure only in-place calls (one buffer for input and result)
    --graph              device backends: capture each size's -n timed calls in one CUDA
                         graph (after the eager warm-up) and time its replays; time is a
                         replay's median / n (nccl-tests' -G) [default: eager calls; with
                         --tune both, one table each]
    --check              check every rank's result against an f64 host reference on fresh
                         random data, and that all ranks' results are bitwise identical;
                         exit 1 if any element is wrong
    --seed N             seed of the checked data [default: from the clock, printed]
    --json FILE          write the results as JSON: {\"run\": {machine, version, command,
                         date, parameters}, \"results\": [...]}
    --csv FILE           write the results as CSV
    --plot FILE.svg      plot latency and bus bandwidth against size (SVG)
    --tune FILE          write the times as a comm-select tuning table (JSON), which
                         SelectComm (backend `auto`) reads from COMM_TUNING; eager and graph
                         rows (graph ones of device backends), graph ones only with --graph
    -h, --help           print this help

Columns: time is the median over iterations of each rank's time, then the maximum over
ranks; algbw = size / time; busbw = algbw * 2(n-1)/n, the bandwidth each rank's links need
in a ring, comparable across rank counts (as in nccl-tests).
";

/// Everything the user asked for.
#[derive(Debug, Clone, PartialEq)]
pub struct Args {
    /// Message sizes in bytes, increasing, without repeats.
    pub sizes: Vec<u64>,
    /// Element type.
    pub dtype: DType,
    /// Reduction operator.
    pub op: ReduceOp,
    /// Timed iterations per size; `None` scales with size.
    pub iters: Option<usize>,
    /// Warm-up iterations per size; `None` scales with size.
    pub warmup: Option<usize>,
    /// Backends by name, in the order given; empty means the defaults of the mode.
    pub backends: Vec<String>,
    /// Print the registry and exit.
    pub list_backends: bool,
    /// Algorithms to measure; `None` means the backend's own choice (all with `--tune`).
    pub algorithms: Option<Algorithms>,
    /// In-process ranks; `None` means the default (4).
    pub ranks: Option<usize>,
    /// How ranks meet; `None` means detected.
    pub bootstrap: Option<Mode>,
    /// `--out-of-place`: measure out-of-place calls (alone, unless `in_place` too).
    pub out_of_place: bool,
    /// `--in-place`: measure in-place calls (alone, unless `out_of_place` too).
    pub in_place: bool,
    /// `--graph`: time CUDA-graph replays of the calls instead of eager calls.
    pub graph: bool,
    /// Check results.
    pub check: bool,
    /// Seed of the input data; `None` picks one.
    pub seed: Option<u64>,
    /// JSON output file.
    pub json: Option<PathBuf>,
    /// CSV output file.
    pub csv: Option<PathBuf>,
    /// SVG plot file.
    pub plot: Option<PathBuf>,
    /// Tuning-table file.
    pub tune: Option<PathBuf>,
}

/// What the command line asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum Parsed {
    /// Run a sweep.
    Run(Box<Args>),
    /// Print [`USAGE`] and exit successfully.
    Help,
}

/// A command line that cannot be run, with a message for the user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArgError(pub String);

impl fmt::Display for ArgError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ArgError {}

impl Args {
    /// The launch modes to measure: graph replays with `--graph`, both modes for a tuning
    /// table (the selector keeps them apart), eager calls otherwise.
    pub fn launches(&self) -> Launches {
        match (self.graph, &self.tune) {
            (true, _) => Launches::Graph,
            (false, Some(_)) => Launches::Both,
            (false, None) => Launches::Eager,
        }
    }
}

impl From<lexopt::Error> for ArgError {
    fn from(e: lexopt::Error) -> Self {
        ArgError(e.to_string())
    }
}

fn err<T>(msg: impl Into<String>) -> Result<T, ArgError> {
    Err(ArgError(msg.into()))
}

/// Parses the arguments after the program name.
pub fn parse<I>(args: I) -> Result<Parsed, ArgError>
where
    I: IntoIterator,
    I::Item: Into<OsString>,
{
    use lexopt::prelude::*;

    let mut parser = lexopt::Parser::from_args(args);
    let mut sizes: Option<String> = None;
    let (mut min, mut max, mut factor) = (None, None, None);
    let mut out = Args {
        sizes: Vec::new(),
        dtype: DType::F32,
        op: ReduceOp::Sum,
        iters: None,
        warmup: None,
        backends: Vec::new(),
        algorithms: None,
        list_backends: false,
        ranks: None,
        bootstrap: None,
        out_of_place: false,
        in_place: false,
        graph: false,
        check: false,
        seed: None,
        json: None,
        csv: None,
        plot: None,
        tune: None,
    };
    while let Some(arg) = parser.next()? {
        match arg {
            Short('h') | Long("help") => return Ok(Parsed::Help),
            Long("sizes") => sizes = Some(string(&mut parser, "--sizes")?),
            Short('b') | Long("minbytes") => min = Some(parse_bytes(&string(&mut parser, "-b")?)?),
            Short('e') | Long("maxbytes") => max = Some(parse_bytes(&string(&mut parser, "-e")?)?),
            Short('f') | Long("factor") => {
                factor = Some(parse_factor(&string(&mut parser, "-f")?)?)
            }
            Short('d') | Long("dtype") => {
                let v = string(&mut parser, "--dtype")?;
                out.dtype = v.parse().map_err(|_| {
                    ArgError(format!(
                        "--dtype: unknown type `{v}` (expected f32, f64, f16, bf16, i32, i64 or u8)"
                    ))
                })?;
            }
            Short('o') | Long("op") => {
                let v = string(&mut parser, "--op")?;
                out.op = v.parse().map_err(|_| {
                    ArgError(format!(
                        "--op: unknown operator `{v}` (expected sum, prod, min, max or avg)"
                    ))
                })?;
            }
            Short('n') | Long("iters") => out.iters = Some(count(&mut parser, "--iters", 1)?),
            Short('w') | Long("warmup") => out.warmup = Some(count(&mut parser, "--warmup", 0)?),
            Long("backend") => {
                let v = string(&mut parser, "--backend")?;
                for name in v.split(',').map(str::trim) {
                    if name.is_empty() {
                        return err(format!("--backend: empty name in `{v}`"));
                    }
                    if !out.backends.iter().any(|b| b == name) {
                        out.backends.push(name.to_string());
                    }
                }
            }
            Long("algo") => {
                let v = string(&mut parser, "--algo")?;
                out.algorithms = Some(add_algorithms(out.algorithms.take(), &v)?);
            }
            Long("list-backends") => out.list_backends = true,
            Long("ranks") => out.ranks = Some(count(&mut parser, "--ranks", 1)?),
            Long("bootstrap") => {
                out.bootstrap = Some(
                    string(&mut parser, "--bootstrap")?
                        .parse()
                        .map_err(|e: String| ArgError(format!("--bootstrap: {e}")))?,
                );
            }
            Long("out-of-place") => out.out_of_place = true,
            Long("in-place") => out.in_place = true,
            Long("graph") => out.graph = true,
            Long("check") => out.check = true,
            Long("seed") => {
                let v = string(&mut parser, "--seed")?;
                out.seed = Some(
                    v.trim()
                        .parse()
                        .map_err(|_| ArgError(format!("--seed: `{v}` is not a whole number")))?,
                );
            }
            Long("json") => out.json = Some(parser.value()?.into()),
            Long("csv") => out.csv = Some(parser.value()?.into()),
            Long("plot") => out.plot = Some(parser.value()?.into()),
            Long("tune") => out.tune = Some(parser.value()?.into()),
            _ => return Err(arg.unexpected().into()),
        }
    }
    out.sizes = resolve_sizes(sizes.as_deref(), min, max, factor)?;
    Ok(Parsed::Run(Box::new(out)))
}

/// Adds the comma list `v` to the algorithms asked for so far; `all` wins over names.
fn add_algorithms(sofar: Option<Algorithms>, v: &str) -> Result<Algorithms, ArgError> {
    let mut names = match sofar {
        Some(Algorithms::All) => return Ok(Algorithms::All),
        Some(Algorithms::Named(names)) => names,
        Some(Algorithms::Default) | None => Vec::new(),
    };
    for name in v.split(',').map(str::trim) {
        match name {
            "" => return err(format!("--algo: empty name in `{v}`")),
            "all" => return Ok(Algorithms::All),
            name if !names.iter().any(|n| n == name) => names.push(name.to_string()),
            _ => {}
        }
    }
    Ok(Algorithms::Named(names))
}

fn string(parser: &mut lexopt::Parser, flag: &str) -> Result<String, ArgError> {
    parser.value()?.into_string().map_err(|v| {
        ArgError(format!(
            "{flag}: `{}` is not valid UTF-8",
            v.to_string_lossy()
        ))
    })
}

fn count(parser: &mut lexopt::Parser, flag: &str, least: usize) -> Result<usize, ArgError> {
    let v = string(parser, flag)?;
    match v.trim().parse::<usize>() {
        Ok(n) if n >= least => Ok(n),
        Ok(_) => err(format!("{flag}: must be at least {least}, got {v}")),
        Err(_) => err(format!("{flag}: `{v}` is not a whole number")),
    }
}

fn parse_factor(v: &str) -> Result<f64, ArgError> {
    match v.trim().parse::<f64>() {
        Ok(f) if f.is_finite() && f > 1.0 => Ok(f),
        _ => err(format!("--factor: `{v}` is not a number greater than 1")),
    }
}

/// Parses a byte count: digits, then optionally `K`, `M` or `G` (powers of 1024, any case,
/// optionally followed by `iB` or `B`), or a plain `B`.
pub fn parse_bytes(text: &str) -> Result<u64, ArgError> {
    let t = text.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (number, suffix) = t.split_at(digits);
    let bad = || ArgError(format!("`{text}` is not a size (examples: 8, 4K, 64M, 1G)"));
    let number: u64 = number.parse().map_err(|_| bad())?;
    let shift = match suffix.to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        _ => return Err(bad()),
    };
    let bytes = number
        .checked_mul(1u64 << shift)
        .ok_or_else(|| ArgError(format!("`{text}` is too large")))?;
    if bytes == 0 {
        return err(format!("size `{text}` must be at least 1 byte"));
    }
    Ok(bytes)
}

/// Parses a size spec: `MIN:MAX` (with `factor`, default 2), `MIN:MAX:FACTOR`, or a
/// comma list.
pub fn parse_sizes(spec: &str, factor: Option<f64>) -> Result<Vec<u64>, ArgError> {
    let spec = spec.trim();
    let parts: Vec<&str> = spec.split(':').collect();
    match parts[..] {
        [lo, hi] => return geometric(parse_bytes(lo)?, parse_bytes(hi)?, factor.unwrap_or(2.0)),
        [lo, hi, f] => {
            if factor.is_some() {
                return err(format!("`{spec}` has a factor already; drop --factor"));
            }
            return geometric(parse_bytes(lo)?, parse_bytes(hi)?, parse_factor(f)?);
        }
        [_] => {}
        _ => return err(format!("`{spec}` is not MIN:MAX, MIN:MAX:FACTOR or a list")),
    }
    if factor.is_some() {
        return err("--factor applies to a MIN:MAX range, not to a list of sizes");
    }
    let mut sizes = spec
        .split(',')
        .map(parse_bytes)
        .collect::<Result<Vec<_>, _>>()?;
    sizes.sort_unstable();
    sizes.dedup();
    Ok(sizes)
}

fn resolve_sizes(
    spec: Option<&str>,
    min: Option<u64>,
    max: Option<u64>,
    factor: Option<f64>,
) -> Result<Vec<u64>, ArgError> {
    match (spec, min, max) {
        (Some(_), Some(_), _) | (Some(_), _, Some(_)) => {
            err("give either --sizes or -b/-e, not both")
        }
        (Some(spec), None, None) => parse_sizes(spec, factor),
        (None, None, None) => parse_sizes(DEFAULT_SIZES, factor),
        (None, min, max) => {
            let default = parse_sizes(DEFAULT_SIZES, None)?;
            let lo = min.unwrap_or(default[0]);
            let hi = max.unwrap_or(*default.last().unwrap_or(&lo)).max(lo);
            geometric(lo, hi, factor.unwrap_or(2.0))
        }
    }
}

fn geometric(min: u64, max: u64, factor: f64) -> Result<Vec<u64>, ArgError> {
    if min > max {
        return err(format!("size range {min}:{max} is empty (MIN > MAX)"));
    }
    let mut sizes = vec![min];
    let mut exact = min as f64;
    while let Some(&last) = sizes.last() {
        exact *= factor;
        // Small sizes with a small factor would repeat after rounding: always grow.
        let next = (exact.round() as u64).max(last + 1);
        if next > max {
            break;
        }
        if sizes.len() == MAX_SIZES {
            return err(format!(
                "{min}:{max} with factor {factor} gives more than {MAX_SIZES} sizes"
            ));
        }
        sizes.push(next);
    }
    Ok(sizes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(args: &[&str]) -> Result<Args, ArgError> {
        match parse(args.iter().copied())? {
            Parsed::Run(a) => Ok(*a),
            Parsed::Help => panic!("unexpected help"),
        }
    }

    #[test]
    fn sizes_with_suffixes_and_factors() {
        assert_eq!(parse_bytes("64M").unwrap(), 64 << 20);
        assert_eq!(parse_bytes("4kib").unwrap(), 4096);
        assert_eq!(parse_bytes("1G").unwrap(), 1 << 30);
        assert_eq!(parse_sizes("8:64", None).unwrap(), vec![8, 16, 32, 64]);
        assert_eq!(
            parse_sizes("1K:64K", Some(4.0)).unwrap(),
            vec![1024, 4096, 16384, 65536]
        );
        assert_eq!(parse_sizes("1M,4K,4K", None).unwrap(), vec![4096, 1 << 20]);
        assert_eq!(parse_sizes("1:3", Some(1.1)).unwrap(), vec![1, 2, 3]);
        assert_eq!(
            parse_sizes("1K:64K:8", None).unwrap(),
            vec![1024, 8192, 65536]
        );
        let default = parse_sizes(DEFAULT_SIZES, None).unwrap();
        assert_eq!((default[0], *default.last().unwrap()), (8, 64 << 20));
    }

    #[test]
    fn bad_sizes_are_errors() {
        for bad in [
            "",
            "x",
            "8Q",
            "0",
            "-8",
            "64M:8",
            "1:1G:x",
            "1:2:3:4",
            "1:8:1",
            "99999999999999G",
            "4,,8",
        ] {
            assert!(parse_sizes(bad, None).is_err(), "{bad}");
        }
        assert!(parse_sizes("1:1G", Some(1.0000001)).is_err());
        assert!(parse_sizes("1,2", Some(2.0)).is_err());
        assert!(parse_sizes("1:8:2", Some(2.0)).is_err());
    }

    #[test]
    fn flags_parse() {
        let a = run(&[
            "--sizes",
            "1K:4K",
            "--dtype",
            "bf16",
            "--op",
            "max",
            "-n",
            "3",
            "--warmup",
            "0",
            "--backend",
            "local,bootstrap",
            "--backend",
            "local",
            "--ranks",
            "2",
            "--check",
            "--in-place",
            "--json",
            "/tmp/a.json",
            "--bootstrap",
            "threads",
            "--algo",
            "oneshot,twoshot",
            "--algo",
            "oneshot",
            "--tune",
            "/tmp/t.json",
            "--graph",
        ])
        .unwrap();
        assert_eq!(a.sizes, vec![1024, 2048, 4096]);
        assert_eq!(a.dtype, DType::BF16);
        assert_eq!(a.op, ReduceOp::Max);
        assert_eq!((a.iters, a.warmup, a.ranks), (Some(3), Some(0), Some(2)));
        assert_eq!(a.backends, vec!["local", "bootstrap"]);
        assert_eq!(a.bootstrap, Some(Mode::Threads));
        assert!(a.check && a.in_place && a.graph);
        assert!(!run(&[]).unwrap().graph);
        assert_eq!(a.json, Some(PathBuf::from("/tmp/a.json")));
        assert_eq!(a.tune, Some(PathBuf::from("/tmp/t.json")));
        assert_eq!(
            a.algorithms,
            Some(Algorithms::Named(vec!["oneshot".into(), "twoshot".into()]))
        );
        let a = run(&["--algo", "oneshot", "--algo", "all"]).unwrap();
        assert_eq!(a.algorithms, Some(Algorithms::All));
        assert_eq!(run(&[]).unwrap().algorithms, None);
        let a = run(&["-b", "1K", "-e", "8K", "-f", "8"]).unwrap();
        assert_eq!(a.sizes, vec![1024, 8192]);
        assert_eq!(parse(["--help"]).unwrap(), Parsed::Help);
    }

    #[test]
    fn graph_and_tune_choose_the_launch_modes() {
        assert_eq!(run(&[]).unwrap().launches(), Launches::Eager);
        assert_eq!(run(&["--graph"]).unwrap().launches(), Launches::Graph);
        assert_eq!(
            run(&["--tune", "t.json"]).unwrap().launches(),
            Launches::Both
        );
        assert_eq!(
            run(&["--tune", "t.json", "--graph"]).unwrap().launches(),
            Launches::Graph
        );
    }

    #[test]
    fn bad_flags_are_errors() {
        for bad in [
            &["--frobnicate"][..],
            &["--dtype", "f8"],
            &["--op", "xor"],
            &["--iters", "0"],
            &["--iters", "many"],
            &["--ranks", "0"],
            &["--bootstrap", "smoke-signals"],
            &["--sizes"],
            &["--sizes", "8:1K", "-b", "8"],
            &["--factor", "1"],
            &["--backend", "local,,x"],
            &["--algo", ","],
            &["--tune"],
            &["--graph=yes"],
            &["stray"],
        ] {
            assert!(run(bad).is_err(), "{bad:?} should be rejected");
        }
        let msg = run(&["--dtype", "f8"]).unwrap_err().to_string();
        assert!(msg.contains("f8") && msg.contains("bf16"), "{msg}");
    }
}
