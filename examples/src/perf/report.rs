//! Results: one [`Row`] per (backend, size), printed as an nccl-tests-style table and
//! written as JSON or CSV.

use std::fmt::Write as _;
use std::io::{self, Write};
use std::path::Path;

use serde::{Deserialize, Serialize};

/// The measurement of one size on one backend.
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
    /// Whether the reduction ran in place.
    pub in_place: bool,
    /// Message size in bytes (`count * dtype size`).
    pub bytes: u64,
    /// Elements per rank.
    pub count: u64,
    /// Timed iterations.
    pub iters: usize,
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
    /// What `auto` routed this size to: `backend[:algorithm] (Source)`; `None` for
    /// every other backend (and absent from older JSON).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub choice: Option<String>,
}

impl Row {
    /// `backend` or `backend:algorithm`.
    pub fn label(&self) -> String {
        match &self.algorithm {
            Some(a) => format!("{}:{a}", self.backend),
            None => self.backend.clone(),
        }
    }

    /// True when the row was checked and found wrong (elements, or ranks disagreeing).
    pub fn failed(&self) -> bool {
        self.wrong.is_some_and(|w| w > 0) || self.identical == Some(false)
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

/// What the table header says about a run.
#[derive(Debug, Clone)]
pub struct TableHeader<'a> {
    /// Backend name.
    pub backend: &'a str,
    /// Algorithm, when one was set.
    pub algorithm: Option<&'a str>,
    /// How the ranks met.
    pub bootstrap: &'a str,
    /// Number of ranks.
    pub ranks: usize,
    /// Element type.
    pub dtype: &'a str,
    /// Reduction operator.
    pub op: &'a str,
    /// In place or not.
    pub in_place: bool,
    /// Whether results are checked.
    pub check: bool,
}

/// The lines above a table.
pub fn header(h: &TableHeader<'_>) -> String {
    let place = if h.in_place {
        "in-place"
    } else {
        "out-of-place"
    };
    let check = if h.check { "on" } else { "off" };
    let mut s = String::new();
    let backend = match h.algorithm {
        Some(a) => format!("{} (algorithm {a})", h.backend),
        None => h.backend.to_string(),
    };
    let _ = writeln!(
        s,
        "# backend: {backend}  ranks: {} ({})  dtype: {}  op: {}  {place}  check: {check}",
        h.ranks, h.bootstrap, h.dtype, h.op
    );
    let _ = writeln!(
        s,
        "#{:>12} {:>12} {:>6} {:>6} {:>11} {:>9} {:>9} {:>7}",
        "size", "count", "type", "redop", "time", "algbw", "busbw", "#wrong"
    );
    let _ = write!(
        s,
        "#{:>12} {:>12} {:>6} {:>6} {:>11} {:>9} {:>9} {:>7}",
        "(B)", "(elements)", "", "", "(us)", "(GB/s)", "(GB/s)", ""
    );
    s
}

/// One table line.
pub fn format_row(row: &Row) -> String {
    let wrong = match (row.wrong, row.identical) {
        (None, _) => "N/A".to_string(),
        (Some(w), Some(false)) => format!("{w}!"),
        (Some(w), _) => w.to_string(),
    };
    let mut line = format!(
        " {:>12} {:>12} {:>6} {:>6} {:>11} {:>9.2} {:>9.2} {:>7}",
        row.bytes,
        row.count,
        row.dtype,
        row.op,
        format_time(row.time_us),
        row.algbw,
        row.busbw,
        wrong
    );
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

/// The lines below a table: mean bus bandwidth (as nccl-tests prints it) and the verdict.
pub fn footer(rows: &[Row]) -> String {
    let mean = if rows.is_empty() {
        0.0
    } else {
        rows.iter().map(|r| r.busbw).sum::<f64>() / rows.len() as f64
    };
    let mut s = format!("# Avg bus bandwidth: {mean:.3} GB/s");
    if rows.iter().any(|r| r.wrong.is_some()) {
        let wrong: u64 = rows.iter().filter_map(|r| r.wrong).sum();
        let split = rows.iter().filter(|r| r.identical == Some(false)).count();
        let _ = write!(s, "\n# Wrong elements: {wrong}");
        if split > 0 {
            let _ = write!(s, "; ranks' results differ at {split} size(s) (marked !)");
        }
        s.push_str(if wrong == 0 && split == 0 {
            "  OK"
        } else {
            "  FAILED"
        });
    }
    s
}

/// The JSON document: `{"results": [...]}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Results {
    /// One entry per (backend, size).
    pub results: Vec<Row>,
}

/// Writes `rows` as JSON.
pub fn write_json(path: &Path, rows: &[Row]) -> io::Result<()> {
    let doc = Results {
        results: rows.to_vec(),
    };
    let mut text = serde_json::to_string_pretty(&doc).map_err(io::Error::other)?;
    text.push('\n');
    std::fs::write(path, text)
}

/// The CSV header line.
/// (`choice` came last, so that readers of the older columns by position still work.)
pub const CSV_HEADER: &str = "backend,algorithm,bootstrap,ranks,dtype,op,in_place,bytes,count,iters,time_us,algbw,busbw,wrong,identical,choice";

/// Writes `rows` as CSV (empty fields where a value is absent).
pub fn write_csv(path: &Path, rows: &[Row]) -> io::Result<()> {
    let mut out = io::BufWriter::new(std::fs::File::create(path)?);
    writeln!(out, "{CSV_HEADER}")?;
    let opt = |v: Option<String>| v.unwrap_or_default();
    for r in rows {
        writeln!(
            out,
            "{},{},{},{},{},{},{},{},{},{},{:.3},{:.4},{:.4},{},{},{}",
            csv_field(&r.backend),
            csv_field(r.algorithm.as_deref().unwrap_or_default()),
            csv_field(&r.bootstrap),
            r.ranks,
            r.dtype,
            r.op,
            r.in_place,
            r.bytes,
            r.count,
            r.iters,
            r.time_us,
            r.algbw,
            r.busbw,
            opt(r.wrong.map(|w| w.to_string())),
            opt(r.identical.map(|i| i.to_string())),
            csv_field(r.choice.as_deref().unwrap_or_default()),
        )?;
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

    #[test]
    fn csv_fields_are_quoted_when_needed() {
        assert_eq!(csv_field("local"), "local");
        assert_eq!(csv_field("a,b"), "\"a,b\"");
        assert_eq!(csv_field("a\"b"), "\"a\"\"b\"");
    }
}
