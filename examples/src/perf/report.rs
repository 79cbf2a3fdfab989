//! Results: one [`Row`] per (backend, size) with its out-of-place and in-place
//! [`Timing`]s, printed as an nccl-tests-style table and written as JSON or CSV.

use std::fmt::Write as _;
use std::io::{self, Write};
use std::path::Path;

use serde::{Deserialize, Serialize};

use comm_select::Launch;

use super::meta::RunInfo;

/// The measurement of one size on one backend: out of place and in place, as nccl-tests
/// prints them side by side.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Row {
    /// Backend name.
    pub backend: String,
    /// The backend's algorithm, when one was asked for (`None`: its own choice).
    pub algorithm: Option<String>,
    /// How the ranks met (`threads`, `env`, `mpi`).
    pub bootstrap: String,
    /// Number of ranks.
    pub ranks: usize,
    /// Element type.
    pub dtype: String,
    /// Reduction operator.
    pub op: String,
    /// Message size in bytes (`count * dtype size`).
    pub bytes: u64,
    /// Elements per rank.
    pub count: u64,
    /// Timed iterations of each placement.
    pub iters: usize,
    /// How the timed calls were launched; files written before graph timing: eager.
    #[serde(default)]
    pub launch: Launch,
    /// Separate send and receive buffers; `None` when not measured (`--in-place`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub out_of_place: Option<Timing>,
    /// One buffer for input and result; `None` when not measured (`--out-of-place`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_place: Option<Timing>,
    /// What `auto` routed this size to: `backend[:algorithm] (Source)`; `None` for
    /// every other backend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub choice: Option<String>,
}

/// One placement's measurement of a size.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Timing {
    /// Median time of one call on each rank, maximum over ranks, in microseconds.
    pub time_us: f64,
    /// Algorithm bandwidth, `bytes / time`, in GB/s (10^9 bytes per second).
    pub algbw: f64,
    /// Bus bandwidth, `algbw * 2(n-1)/n`, in GB/s.
    pub busbw: f64,
    /// Wrong elements summed over ranks; `None` when not checked.
    pub wrong: Option<u64>,
    /// Whether every rank's result had the same bits; `None` when not checked.
    pub identical: Option<bool>,
    /// Eager GPU-memory rows: time per call of the timed calls enqueued back to back
    /// between two events (nccl-tests' way: consecutive calls may overlap, e.g. by
    /// programmatic dependent launch), maximum over ranks; `time_us` frames each call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub back_to_back_us: Option<f64>,
    /// The host's share of those: wall time per call to enqueue them, maximum over ranks.
    /// Close to `back_to_back_us`, the calls are bound by the host, not the GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_us: Option<f64>,
}

impl Timing {
    /// True when checked and found wrong (elements, or ranks disagreeing).
    pub fn failed(&self) -> bool {
        self.wrong.is_some_and(|w| w > 0) || self.identical == Some(false)
    }
}

impl Row {
    /// `backend` or `backend:algorithm`.
    pub fn label(&self) -> String {
        match &self.algorithm {
            Some(a) => format!("{}:{a}", self.backend),
            None => self.backend.clone(),
        }
    }

    /// The placements measured, out of place first, with `in_place` as the flag.
    pub fn timings(&self) -> impl Iterator<Item = (bool, &Timing)> {
        [(false, &self.out_of_place), (true, &self.in_place)]
            .into_iter()
            .filter_map(|(in_place, t)| t.as_ref().map(|t| (in_place, t)))
    }

    /// The placement that stands for the row in a plot or a tuning table: out of place
    /// when measured (the call most code makes), else in place.
    pub fn primary(&self) -> Option<&Timing> {
        self.out_of_place.as_ref().or(self.in_place.as_ref())
    }

    /// True when a placement was checked and found wrong.
    pub fn failed(&self) -> bool {
        self.timings().any(|(_, t)| t.failed())
    }
}

/// Algorithm bandwidth in GB/s of `bytes` moved in `time_us` microseconds.
pub fn algbw(bytes: u64, time_us: f64) -> f64 {
    if time_us > 0.0 {
        bytes as f64 / time_us / 1e3
    } else {
        0.0
    }
}

/// Bus bandwidth of an all-reduce over `ranks` ranks: `algbw * 2(n-1)/n`. A ring
/// all-reduce sends and receives `2(n-1)/n` times the message on each link, so this is
/// what the links carried, comparable across rank counts (nccl-tests' definition).
pub fn busbw(algbw: f64, ranks: usize) -> f64 {
    if ranks == 0 {
        return 0.0;
    }
    let n = ranks as f64;
    algbw * 2.0 * (n - 1.0) / n
}

/// What the table header says about a table.
#[derive(Debug, Clone)]
pub struct TableHeader<'a> {
    /// Backend name.
    pub backend: &'a str,
    /// Algorithm, when one was set.
    pub algorithm: Option<&'a str>,
    /// Eager calls, or CUDA-graph replays of them.
    pub launch: Launch,
    /// How the ranks met.
    pub bootstrap: &'a str,
    /// Number of ranks.
    pub ranks: usize,
    /// Element type.
    pub dtype: &'a str,
    /// Reduction operator.
    pub op: &'a str,
    /// Whether results are checked.
    pub check: bool,
    /// Whether out-of-place calls are measured.
    pub out_of_place: bool,
    /// Whether in-place calls are measured.
    pub in_place: bool,
}

/// Width of the columns before the placements: `#`, size, count, type, redop.
const LEAD: usize = 40;
/// Width of one placement's columns: time, algbw, busbw, #wrong.
const GROUP: usize = 40;

fn lead(size: &str, count: &str, ty: &str, op: &str) -> String {
    format!("{size:>12} {count:>12} {ty:>6} {op:>6}")
}

fn group(time: &str, algbw: &str, busbw: &str, wrong: &str) -> String {
    format!(" {time:>11} {algbw:>9} {busbw:>9} {wrong:>7}")
}

/// The lines above a table: what runs, then nccl-tests' columns, one group of time,
/// algbw, busbw and #wrong per placement.
pub fn header(h: &TableHeader<'_>) -> String {
    let placements: Vec<&str> = [(h.out_of_place, "out-of-place"), (h.in_place, "in-place")]
        .into_iter()
        .filter_map(|(on, name)| on.then_some(name))
        .collect();
    let backend = match h.algorithm {
        Some(a) => format!("{} (algorithm {a})", h.backend),
        None => h.backend.to_string(),
    };
    let mut s = String::new();
    let launch = match h.launch {
        Launch::Eager => "eager",
        Launch::Graph => "graph (time = replay of iters calls / iters)",
    };
    let _ = writeln!(
        s,
        "# backend: {backend}  ranks: {} ({})  dtype: {}  op: {}  launch: {launch}  check: {}",
        h.ranks,
        h.bootstrap,
        h.dtype,
        h.op,
        if h.check { "on" } else { "off" }
    );
    let mut titles = format!("#{:w$}", "", w = LEAD - 1);
    for name in &placements {
        let _ = write!(titles, "{name:^GROUP$}");
    }
    s.push_str(titles.trim_end());
    let mut names = format!("#{}", lead("size", "count", "type", "redop"));
    let mut units = format!("#{}", lead("(B)", "(elements)", "", ""));
    for _ in &placements {
        names.push_str(&group("time", "algbw", "busbw", "#wrong"));
        units.push_str(&group("(us)", "(GB/s)", "(GB/s)", ""));
    }
    let _ = write!(s, "\n{}\n{}", names.trim_end(), units.trim_end());
    s
}

/// One table line.
pub fn format_row(row: &Row) -> String {
    let mut line = format!(
        " {}",
        lead(
            &row.bytes.to_string(),
            &row.count.to_string(),
            &row.dtype,
            &row.op
        )
    );
    for (_, t) in row.timings() {
        let wrong = match (t.wrong, t.identical) {
            (None, _) => "N/A".to_string(),
            (Some(w), Some(false)) => format!("{w}!"),
            (Some(w), _) => w.to_string(),
        };
        line.push_str(&group(
            &format_time(t.time_us),
            &format!("{:.2}", t.algbw),
            &format!("{:.2}", t.busbw),
            &wrong,
        ));
    }
    // `auto`'s choice as a last column, so that the columns before it stay nccl-tests'.
    if let Some(choice) = &row.choice {
        let _ = write!(line, "  -> {choice}");
    }
    line
}

fn format_time(us: f64) -> String {
    if us < 1e5 {
        format!("{us:.2}")
    } else {
        format!("{us:.0}")
    }
}

/// The lines below a table: mean bus bandwidth over every size and placement (as
/// nccl-tests prints it) and the verdict.
pub fn footer(rows: &[Row]) -> String {
    let timings: Vec<&Timing> = rows
        .iter()
        .flat_map(|r| r.timings().map(|(_, t)| t))
        .collect();
    let mean = if timings.is_empty() {
        0.0
    } else {
        timings.iter().map(|t| t.busbw).sum::<f64>() / timings.len() as f64
    };
    let mut s = format!("# Avg bus bandwidth: {mean:.3} GB/s");
    if timings.iter().any(|t| t.wrong.is_some()) {
        let wrong: u64 = timings.iter().filter_map(|t| t.wrong).sum();
        let split = timings
            .iter()
            .filter(|t| t.identical == Some(false))
            .count();
        let _ = write!(s, "\n# Wrong elements: {wrong}");
        if split > 0 {
            let _ = write!(
                s,
                "; ranks' results differ in {split} measurement(s) (marked !)"
            );
        }
        s.push_str(if wrong == 0 && split == 0 {
            "  OK"
        } else {
            "  FAILED"
        });
    }
    s
}

/// The JSON document: `{"run": {...}, "results": [...]}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Results {
    /// The run's machine, command line, date and parameters.
    pub run: RunInfo,
    /// One entry per (backend, algorithm, size).
    pub results: Vec<Row>,
}

/// Writes `rows` as JSON, with `run` describing where they came from.
pub fn write_json(path: &Path, run: &RunInfo, rows: &[Row]) -> io::Result<()> {
    let doc = Results {
        run: run.clone(),
        results: rows.to_vec(),
    };
    let mut text = serde_json::to_string_pretty(&doc).map_err(io::Error::other)?;
    text.push('\n');
    std::fs::write(path, text)
}

/// The CSV header line: one line per (backend, algorithm, size, placement), so that each
/// column holds one quantity.
pub const CSV_HEADER: &str = "backend,algorithm,bootstrap,ranks,dtype,op,launch,in_place,bytes,count,iters,time_us,algbw,busbw,wrong,identical,choice";

/// Writes `rows` as CSV (empty fields where a value is absent).
pub fn write_csv(path: &Path, rows: &[Row]) -> io::Result<()> {
    let mut out = io::BufWriter::new(std::fs::File::create(path)?);
    writeln!(out, "{CSV_HEADER}")?;
    let opt = |v: Option<String>| v.unwrap_or_default();
    for r in rows {
        for (in_place, t) in r.timings() {
            writeln!(
                out,
                "{},{},{},{},{},{},{},{},{},{},{},{:.3},{:.4},{:.4},{},{},{}",
                csv_field(&r.backend),
                csv_field(r.algorithm.as_deref().unwrap_or_default()),
                csv_field(&r.bootstrap),
                r.ranks,
                r.dtype,
                r.op,
                r.launch,
                in_place,
                r.bytes,
                r.count,
                r.iters,
                t.time_us,
                t.algbw,
                t.busbw,
                opt(t.wrong.map(|w| w.to_string())),
                opt(t.identical.map(|i| i.to_string())),
                csv_field(r.choice.as_deref().unwrap_or_default()),
            )?;
        }
    }
    out.flush()
}

/// Quotes a field that holds a separator or a quote.
fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_bandwidth_is_two_n_minus_one_over_n() {
        assert_eq!(busbw(10.0, 1), 0.0);
        assert_eq!(busbw(10.0, 2), 10.0);
        assert_eq!(busbw(10.0, 4), 15.0);
        assert!((busbw(8.0, 8) - 14.0).abs() < 1e-12);
        // 1 MB in 1000 us is 1 GB/s.
        assert!((algbw(1_000_000, 1000.0) - 1.0).abs() < 1e-12);
        assert_eq!(algbw(8, 0.0), 0.0);
    }

    fn table_header(launch: Launch) -> String {
        header(&TableHeader {
            backend: "nccl",
            algorithm: None,
            launch,
            bootstrap: "threads",
            ranks: 2,
            dtype: "bf16",
            op: "sum",
            check: true,
            out_of_place: true,
            in_place: true,
        })
    }

    #[test]
    fn the_table_header_says_the_launch_mode() {
        let eager = table_header(Launch::Eager);
        assert!(
            eager.lines().next().unwrap().contains("launch: eager"),
            "{eager}"
        );
        let graph = table_header(Launch::Graph);
        assert!(
            graph.lines().next().unwrap().contains("launch: graph"),
            "{graph}"
        );
        assert!(!graph.contains("launch: eager"), "{graph}");
    }

    #[test]
    fn csv_fields_are_quoted_when_needed() {
        assert_eq!(csv_field("local"), "local");
        assert_eq!(csv_field("a,b"), "\"a,b\"");
        assert_eq!(csv_field("a\"b"), "\"a\"\"b\"");
    }
}
