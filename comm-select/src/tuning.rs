//! Tuning tables: collective times measured on this host, the selector's first source of
//! truth after a forced choice.
//!
//! `allreduce-perf --tune FILE` writes one (JSON, documented in the README):
//!
//! ```json
//! { "version": 2, "world_size": 8, "fabric": "nvlink", "note": "...",
//!   "measurements": [
//!     { "collective": "all_reduce", "dtype": "bf16", "bytes": 43008, "memory": "device",
//!       "backend": "ipc", "algorithm": "oneshot-push", "time_us": 4.1 } ] }
//! ```
//!
//! Version 1 tables (no `memory`) still load; their measurements apply to either memory.
//!
//! A lookup takes the measured size nearest to the call's (in log scale) and, among the
//! candidates the caller accepts, the fastest measured there.

use std::path::Path;

use comm_core::{Collective, DType, Error, Result};
use serde::{Deserialize, Serialize};

use crate::backend::Memory;

/// Format version written by this crate.
pub const TUNING_VERSION: u32 = 2;

/// One measured time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Measurement {
    /// Collective name (`all_reduce`, ...).
    pub collective: String,
    /// Dtype name (`bf16`, ...).
    pub dtype: String,
    /// Bytes per rank.
    pub bytes: usize,
    /// Where the buffers lived; `None` (version 1 tables): applies to either.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<Memory>,
    /// Backend name.
    pub backend: String,
    /// Algorithm name, if the backend has several.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub algorithm: Option<String>,
    /// Median time of one call, µs.
    pub time_us: f64,
}

/// Measured times of one host and world size.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TuningTable {
    /// Format version ([`TUNING_VERSION`]).
    pub version: u32,
    /// World size measured.
    pub world_size: usize,
    /// Fabric measured (free text: `nvlink`, `pcie`, `host`...).
    #[serde(default)]
    pub fabric: String,
    /// Free text: machine, date, command.
    #[serde(default)]
    pub note: String,
    /// The measurements.
    pub measurements: Vec<Measurement>,
}

/// The winner of a lookup and the times it was compared with.
#[derive(Debug, Clone, PartialEq)]
pub struct TunedChoice {
    /// Backend name.
    pub backend: String,
    /// Algorithm name.
    pub algorithm: Option<String>,
    /// Its measured time, µs.
    pub time_us: f64,
    /// The measured size used.
    pub measured_bytes: usize,
    /// Runner-up `(backend[:algorithm], time_us)`, if any.
    pub runner_up: Option<(String, f64)>,
}

impl TuningTable {
    /// An empty table for `world_size` ranks.
    pub fn new(world_size: usize, fabric: &str, note: &str) -> Self {
        TuningTable {
            version: TUNING_VERSION,
            world_size,
            fabric: fabric.to_string(),
            note: note.to_string(),
            measurements: Vec::new(),
        }
    }

    /// Reads a table written by [`TuningTable::save`].
    pub fn load(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        Self::from_json(&std::fs::read_to_string(path)?)
            .map_err(|e| Error::InvalidArgument(format!("tuning table {}: {e}", path.display())))
    }

    /// Parses JSON.
    pub fn from_json(text: &str) -> Result<Self> {
        let table: TuningTable = serde_json::from_str(text)
            .map_err(|e| Error::InvalidArgument(format!("malformed tuning table: {e}")))?;
        if !(1..=TUNING_VERSION).contains(&table.version) {
            return Err(Error::InvalidArgument(format!(
                "tuning table version {} (this build reads {TUNING_VERSION})",
                table.version
            )));
        }
        Ok(table)
    }

    /// Pretty JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("tuning table serialises")
    }

    /// Writes the table as JSON.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        std::fs::write(path, self.to_json())?;
        Ok(())
    }

    /// The fastest accepted candidate at the measured size nearest to `bytes`, among
    /// measurements of `memory`. Prefers measurements of the same dtype; falls back to any
    /// dtype.
    pub fn best(
        &self,
        collective: Collective,
        dtype: DType,
        bytes: usize,
        memory: Memory,
        accept: impl Fn(&str, Option<&str>) -> bool,
    ) -> Option<TunedChoice> {
        let usable = |m: &&Measurement| {
            m.collective == collective.name()
                && m.memory.is_none_or(|k| k == memory)
                && accept(&m.backend, m.algorithm.as_deref())
                && m.time_us.is_finite()
        };
        let same_dtype: Vec<&Measurement> = self
            .measurements
            .iter()
            .filter(usable)
            .filter(|m| m.dtype == dtype.name())
            .collect();
        let pool = if same_dtype.is_empty() {
            self.measurements.iter().filter(usable).collect()
        } else {
            same_dtype
        };
        let distance = |m: &Measurement| (log2(m.bytes) - log2(bytes)).abs();
        let nearest = pool.iter().map(|m| distance(m)).min_by(f64::total_cmp)?;
        let mut at_size: Vec<&Measurement> = pool
            .into_iter()
            .filter(|m| distance(m) == nearest)
            .collect();
        // The smaller measured size wins ties, for a deterministic choice.
        let size = at_size.iter().map(|m| m.bytes).min()?;
        at_size.retain(|m| m.bytes == size);
        at_size.sort_by(|a, b| {
            a.time_us
                .total_cmp(&b.time_us)
                .then_with(|| label(a).cmp(&label(b)))
        });
        let best = at_size[0];
        Some(TunedChoice {
            backend: best.backend.clone(),
            algorithm: best.algorithm.clone(),
            time_us: best.time_us,
            measured_bytes: best.bytes,
            runner_up: at_size.get(1).map(|m| (label(m), m.time_us)),
        })
    }
}

fn label(m: &Measurement) -> String {
    match &m.algorithm {
        Some(a) => format!("{}:{a}", m.backend),
        None => m.backend.clone(),
    }
}

fn log2(bytes: usize) -> f64 {
    (bytes.max(1) as f64).log2()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(bytes: usize, backend: &str, algorithm: Option<&str>, time_us: f64) -> Measurement {
        Measurement {
            collective: "all_reduce".into(),
            dtype: "bf16".into(),
            bytes,
            memory: Some(Memory::Device),
            backend: backend.into(),
            algorithm: algorithm.map(String::from),
            time_us,
        }
    }

    fn table() -> TuningTable {
        let mut t = TuningTable::new(8, "nvlink", "test");
        t.measurements = vec![
            m(32 << 10, "nccl", None, 20.0),
            m(32 << 10, "ipc", Some("oneshot-push"), 4.0),
            m(64 << 20, "nccl", None, 400.0),
            m(64 << 20, "ipc", Some("twoshot-pull"), 520.0),
        ];
        t
    }

    #[test]
    fn nearest_size_and_fastest_candidate() {
        let t = table();
        let small = t
            .best(
                Collective::AllReduce,
                DType::BF16,
                42 << 10,
                Memory::Device,
                |_, _| true,
            )
            .unwrap();
        assert_eq!(
            (small.backend.as_str(), small.algorithm.as_deref()),
            ("ipc", Some("oneshot-push"))
        );
        assert_eq!(small.runner_up, Some(("nccl".into(), 20.0)));
        let large = t
            .best(
                Collective::AllReduce,
                DType::F32,
                128 << 20,
                Memory::Device,
                |_, _| true,
            )
            .unwrap();
        assert_eq!(large.backend, "nccl");
        let no_ipc = t
            .best(
                Collective::AllReduce,
                DType::BF16,
                42 << 10,
                Memory::Device,
                |b, _| b != "ipc",
            )
            .unwrap();
        assert_eq!(no_ipc.backend, "nccl");
        assert!(
            t.best(
                Collective::AllGather,
                DType::BF16,
                1,
                Memory::Device,
                |_, _| true
            )
            .is_none()
        );
        // Device measurements say nothing about host calls.
        assert!(
            t.best(
                Collective::AllReduce,
                DType::BF16,
                1,
                Memory::Host,
                |_, _| true
            )
            .is_none()
        );
    }

    #[test]
    fn json_round_trip_and_version_check() {
        let t = table();
        assert_eq!(TuningTable::from_json(&t.to_json()).unwrap(), t);
        let future = t.to_json().replace("\"version\": 2", "\"version\": 99");
        assert!(TuningTable::from_json(&future).is_err());
        assert!(TuningTable::from_json("{").is_err());
    }
}

#[cfg(test)]
mod shipped_tables {
    use super::*;

    /// The tables measured on the device machine load, and name backends as their
    /// communicators do.
    #[test]
    fn load_and_name_known_backends() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tables");
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let table = TuningTable::load(&path).unwrap();
            for m in &table.measurements {
                let id: crate::BackendId = m.backend.parse().unwrap();
                assert_eq!(m.memory, Some(id.memory()), "{}", path.display());
            }
        }
    }
}
