//! Tuning tables: collective times measured on this host, the selector's first source of
//! truth after a forced choice.
//!
//! `allreduce-perf --tune FILE` writes one (JSON, documented in the README):
//!
//! ```json
//! { "version": 3, "world_size": 8, "fabric": "nvlink", "note": "...",
//!   "measurements": [
//!     { "collective": "all_reduce", "dtype": "bf16", "bytes": 43008, "memory": "device",
//!       "launch": "graph", "backend": "ipc", "algorithm": "oneshot-push", "time_us": 4.1 } ] }
//! ```
//!
//! Version 1 tables (no `memory`) still load; their measurements apply to either memory.
//! Versions 1 and 2 (no `launch`) were measured with eager calls only, so their rows are
//! [`Launch::Eager`].
//!
//! A lookup takes the measured size nearest to the call's (in log scale) and, among the
//! candidates the caller accepts, the fastest measured there. It only looks at rows of the
//! call's launch mode: the fastest backend of a graph replay is often not the fastest of an
//! eager call (launch and host work are paid once per graph, not per call), so an eager time
//! is no evidence for a graph call, nor the other way round.

use std::path::Path;

use comm_core::{Collective, DType, Error, Result};
use serde::{Deserialize, Serialize};

use crate::backend::Memory;

/// Format version written by this crate.
pub const TUNING_VERSION: u32 = 3;

/// How a measured (or routed) call was launched.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Launch {
    /// Called from the host and run as it is enqueued.
    #[default]
    Eager,
    /// Captured into a CUDA graph and run by its replays.
    Graph,
}

impl Launch {
    /// `eager` or `graph`.
    pub const fn name(self) -> &'static str {
        match self {
            Launch::Eager => "eager",
            Launch::Graph => "graph",
        }
    }
}

impl std::fmt::Display for Launch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

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
    /// How the timed calls were launched; absent (versions 1 and 2): eager.
    #[serde(default)]
    pub launch: Launch,
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
    /// Fabric measured: a [`Fabric`](crate::Fabric) name (`nvlink`, `pcie`, `host`...);
    /// free text to the selector, which does not read it.
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

    /// The mode whose rows answer a call launched as `launch`: its own, except that a table
    /// without a single graph row (measured eagerly only, as every table of versions 1 and 2)
    /// answers graph calls from its eager rows, as it did before tables knew modes.
    pub fn answering(&self, launch: Launch) -> Launch {
        let has_graph_rows = self.measurements.iter().any(|m| m.launch == Launch::Graph);
        if launch == Launch::Graph && !has_graph_rows {
            Launch::Eager
        } else {
            launch
        }
    }

    /// The fastest accepted candidate at the measured size nearest to `bytes`, among
    /// measurements of `memory` launched as `launch`. Prefers measurements of the same
    /// dtype; falls back to any dtype, never to the other launch mode.
    pub fn best(
        &self,
        collective: Collective,
        dtype: DType,
        bytes: usize,
        memory: Memory,
        launch: Launch,
        accept: impl Fn(&str, Option<&str>) -> bool,
    ) -> Option<TunedChoice> {
        let usable = |m: &&Measurement| {
            m.collective == collective.name()
                && m.memory.is_none_or(|k| k == memory)
                && m.launch == launch
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
            launch: Launch::Eager,
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
                Launch::Eager,
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
                Launch::Eager,
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
                Launch::Eager,
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
                Launch::Eager,
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
                Launch::Eager,
                |_, _| true
            )
            .is_none()
        );
    }

    #[test]
    fn json_round_trip_and_version_check() {
        let t = table();
        assert_eq!(TuningTable::from_json(&t.to_json()).unwrap(), t);
        let current = format!("\"version\": {TUNING_VERSION}");
        assert!(t.to_json().contains(&current));
        let future = t.to_json().replace(&current, "\"version\": 99");
        assert!(TuningTable::from_json(&future).is_err());
        assert!(TuningTable::from_json("{").is_err());
    }

    fn best_of(t: &TuningTable, launch: Launch) -> Option<TunedChoice> {
        t.best(
            Collective::AllReduce,
            DType::BF16,
            42 << 10,
            Memory::Device,
            launch,
            |_, _| true,
        )
    }

    /// Eager: nccl wins; in a graph, where launch cost is paid once per replay, ipc does.
    fn two_modes() -> TuningTable {
        let mut t = TuningTable::new(2, "nvlink", "test");
        let graph = |mut m: Measurement| {
            m.launch = Launch::Graph;
            m
        };
        t.measurements = vec![
            m(42 << 10, "nccl", None, 12.0),
            m(42 << 10, "ipc", Some("oneshot-push"), 30.0),
            graph(m(42 << 10, "nccl", None, 8.8)),
            graph(m(42 << 10, "ipc", Some("oneshot-push"), 4.0)),
        ];
        t
    }

    #[test]
    fn each_launch_mode_reads_only_its_own_rows() {
        let t = two_modes();
        let eager = best_of(&t, Launch::Eager).unwrap();
        assert_eq!((eager.backend.as_str(), eager.time_us), ("nccl", 12.0));
        assert_eq!(eager.runner_up, Some(("ipc:oneshot-push".into(), 30.0)));
        let graph = best_of(&t, Launch::Graph).unwrap();
        assert_eq!((graph.backend.as_str(), graph.time_us), ("ipc", 4.0));
        assert_eq!(graph.runner_up, Some(("nccl".into(), 8.8)));
    }

    #[test]
    fn a_graph_call_never_reads_eager_rows() {
        // Eager rows at every size, graph rows of another collective only.
        let mut t = table();
        let mut gather = m(42 << 10, "ipc", None, 1.0);
        gather.collective = "all_gather".into();
        gather.launch = Launch::Graph;
        t.measurements.push(gather);
        assert!(best_of(&t, Launch::Eager).is_some());
        assert!(best_of(&t, Launch::Graph).is_none());
        assert_eq!(t.answering(Launch::Graph), Launch::Graph);
    }

    #[test]
    fn versions_1_and_2_load_as_eager() {
        let row = |memory: &str| {
            format!(
                r#"{{ "collective": "all_reduce", "dtype": "bf16", "bytes": 43008, {memory}
                   "backend": "nccl", "time_us": 11.0 }}"#
            )
        };
        for (version, memory) in [(1, ""), (2, r#""memory": "device","#)] {
            let text = format!(
                r#"{{ "version": {version}, "world_size": 2, "measurements": [{}] }}"#,
                row(memory)
            );
            let t = TuningTable::from_json(&text).unwrap();
            assert_eq!(t.measurements[0].launch, Launch::Eager, "version {version}");
            assert_eq!(best_of(&t, Launch::Eager).unwrap().backend, "nccl");
            assert!(best_of(&t, Launch::Graph).is_none(), "version {version}");
            // Without graph rows, graph calls are answered from the eager ones.
            assert_eq!(
                t.answering(Launch::Graph),
                Launch::Eager,
                "version {version}"
            );
        }
    }

    #[test]
    fn a_table_of_both_modes_survives_save_and_load() {
        let t = two_modes();
        let path = std::env::temp_dir().join(format!(
            "comm-select-tuning-{}-{:?}.json",
            std::process::id(),
            std::thread::current().id()
        ));
        t.save(&path).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let loaded = TuningTable::load(&path);
        std::fs::remove_file(&path).unwrap();
        assert_eq!(loaded.unwrap(), t);
        // Eager rows say so: a reader need not know the default.
        assert_eq!(text.matches("\"launch\": \"eager\"").count(), 2, "{text}");
        assert_eq!(text.matches("\"launch\": \"graph\"").count(), 2, "{text}");
    }
}

#[cfg(test)]
mod shipped_tables {
    use super::*;

    /// The tables measured on the device machine load, and name backends as their
    /// communicators do; a table of version 3 or later holds both launch modes.
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
            let graph_rows = table
                .measurements
                .iter()
                .filter(|m| m.launch == Launch::Graph);
            assert_eq!(
                graph_rows.count() > 0,
                table.version >= 3,
                "{}",
                path.display()
            );
        }
    }
}
