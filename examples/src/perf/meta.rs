//! What a run was: machine, program, command line, date and parameters. Printed above the
//! tables and stored in the JSON, so that a result file still says where it came from
//! when it is compared with another one months later.

use std::fmt::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::launches::Launches;
use super::plot::bytes_label;

/// The parameters and circumstances of one `allreduce-perf` run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunInfo {
    /// `allreduce-perf`.
    pub program: String,
    /// The crate version of the program.
    pub version: String,
    /// Host name of rank 0's machine.
    pub hostname: String,
    /// The command line, program name first.
    pub command: Vec<String>,
    /// Start of the run, UTC, ISO 8601 (`2026-11-29T10:22:05Z`).
    pub date: String,
    /// Number of ranks.
    pub world_size: usize,
    /// How the ranks met (`threads`, `env`, `mpi`).
    pub bootstrap: String,
    /// GPUs visible on rank 0's machine (0 without a GPU or without the CUDA driver).
    pub gpus: usize,
    /// Element type.
    pub dtype: String,
    /// Reduction operator.
    pub op: String,
    /// Message sizes asked for, in bytes.
    pub sizes: Vec<u64>,
    /// Timed iterations per size and placement; `None`: fitted to a time budget per size.
    pub iters: Option<usize>,
    /// Warm-up iterations per size and placement; `None`: fitted to a time budget.
    pub warmup: Option<usize>,
    /// Whether results were checked against a reference.
    pub check: bool,
    /// Seed of the checked data.
    pub seed: u64,
    /// Whether out-of-place calls were measured.
    pub out_of_place: bool,
    /// Whether in-place calls were measured.
    pub in_place: bool,
    /// Eager calls, CUDA-graph replays, or both; files written before graph mode: eager.
    #[serde(default)]
    pub launch: Launches,
}

impl RunInfo {
    /// The header lines printed before the first table (each starts with `#`).
    pub fn header(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "# comm {} {} on {}, {}",
            self.program, self.version, self.hostname, self.date
        );
        let _ = writeln!(s, "# command: {}", self.command.join(" "));
        let sizes = match (self.sizes.first(), self.sizes.last()) {
            (Some(&lo), Some(&hi)) => format!(
                "{}..{} ({})",
                bytes_label(lo as f64),
                bytes_label(hi as f64),
                self.sizes.len()
            ),
            _ => "none".to_string(),
        };
        let _ = writeln!(
            s,
            "# ranks: {} ({})  GPUs: {}  dtype: {}  op: {}  sizes: {sizes}",
            self.world_size, self.bootstrap, self.gpus, self.dtype, self.op
        );
        let count = |n: Option<usize>| n.map_or_else(|| "auto".to_string(), |n| n.to_string());
        let placements: Vec<&str> = [
            (self.out_of_place, "out-of-place"),
            (self.in_place, "in-place"),
        ]
        .into_iter()
        .filter_map(|(on, name)| on.then_some(name))
        .collect();
        let _ = write!(
            s,
            "# iters: {}  warm-up: {}  check: {}  placements: {}  launch: {}",
            count(self.iters),
            count(self.warmup),
            if self.check { "on" } else { "off" },
            placements.join(", "),
            self.launch
        );
        if self.check {
            let _ = write!(
                s,
                "\n# seed: {0} (--seed {0} reproduces the checked data)",
                self.seed
            );
        }
        s
    }
}

/// This machine's host name, from the kernel; `unknown` where it cannot be read.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown".to_string())
}

/// `time` as UTC ISO 8601 to the second, e.g. `2026-11-29T10:22:05Z`.
pub fn utc_iso8601(time: SystemTime) -> String {
    let secs = time.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, of_day) = (secs / 86_400, secs % 86_400);
    let (year, month, day) = civil_from_days(days as i64);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        of_day / 3600,
        of_day % 3600 / 60,
        of_day % 60
    )
}

/// (year, month, day) of the day `days` after 1970-01-01 in the proleptic Gregorian
/// calendar (H. Hinnant's `civil_from_days`: eras of 400 years, years starting in March
/// so that the leap day comes last).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn dates_are_utc_iso8601() {
        let at = |secs: u64| utc_iso8601(UNIX_EPOCH + Duration::from_secs(secs));
        assert_eq!(at(0), "1970-01-01T00:00:00Z");
        assert_eq!(at(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(at(1_709_251_199), "2024-02-29T23:59:59Z");
        assert_eq!(at(4_107_542_400), "2100-03-01T00:00:00Z");
        assert_eq!(at(1_796_000_000), "2026-11-30T00:53:20Z");
    }

    #[test]
    fn hostname_is_never_empty() {
        assert!(!hostname().is_empty());
    }
}
