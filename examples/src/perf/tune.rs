//! `--tune`: the sweep's times as a `comm-select` tuning table.
//!
//! `SelectComm` (backend `auto`) routes each call to the fastest backend measured at the
//! nearest size; this writes what it reads (`COMM_TUNING=FILE`), in `comm-select`'s own
//! type so that the two cannot drift apart. Rows that failed the check are left out (a
//! fast wrong answer must never win), and so is `auto` itself, whose time is whatever it
//! picked. Each measurement keeps its row's launch mode (eager, or graph replay), which
//! the selector matches against the call's.

use comm_core::Collective;
use comm_select::{BackendId, Measurement, TuningTable};

use super::report::Row;

/// The tuning table of `rows` (one world size: the first row's), with `note` recording
/// how it was measured.
pub fn tuning_table(rows: &[Row], note: &str) -> TuningTable {
    let world = rows.first().map_or(1, |r| r.ranks);
    let mut table = TuningTable::new(world, "host", note);
    table.measurements = rows
        .iter()
        .filter(|r| !r.failed() && r.backend != "auto" && r.ranks == world)
        .filter_map(|r| Some((r, r.primary()?.time_us)))
        .map(|(r, time_us)| Measurement {
            collective: Collective::AllReduce.name().to_string(),
            dtype: r.dtype.clone(),
            bytes: r.bytes as usize,
            memory: r.backend.parse::<BackendId>().ok().map(BackendId::memory),
            launch: r.launch,
            backend: r.backend.clone(),
            algorithm: r.algorithm.clone(),
            time_us,
        })
        .collect();
    table
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::perf::report::Timing;
    use comm_core::DType;
    use comm_select::{Launch, Memory};

    fn row(backend: &str, algorithm: Option<&str>, bytes: u64, time_us: f64) -> Row {
        Row {
            backend: backend.into(),
            algorithm: algorithm.map(String::from),
            bootstrap: "threads".into(),
            ranks: 4,
            dtype: "bf16".into(),
            op: "sum".into(),
            bytes,
            count: bytes / 2,
            iters: 20,
            launch: Launch::Eager,
            out_of_place: Some(Timing {
                time_us,
                algbw: 0.0,
                busbw: 0.0,
                wrong: None,
                identical: None,
            }),
            in_place: None,
            choice: None,
        }
    }

    #[test]
    fn selector_reads_what_tune_writes() {
        let mut wrong = row("symm", Some("lamport"), 1024, 1.0);
        wrong.in_place = wrong.out_of_place.map(|t| Timing {
            wrong: Some(3),
            ..t
        });
        let rows = vec![
            row("local", None, 1024, 20.0),
            row("symm", Some("oneshot"), 1024, 9.0),
            wrong,
            row("auto", None, 1024, 0.5),
        ];
        let table = tuning_table(&rows, "test");
        assert_eq!(table.world_size, 4);
        assert_eq!(table.measurements.len(), 2);
        let parsed = TuningTable::from_json(&table.to_json()).unwrap();
        let best = parsed
            .best(
                Collective::AllReduce,
                DType::BF16,
                1000,
                Memory::Host,
                Launch::Eager,
                |_, _| true,
            )
            .unwrap();
        assert_eq!(best.backend, "symm");
        assert_eq!(best.algorithm.as_deref(), Some("oneshot"));
        // Host measurements say nothing about device calls.
        let device = parsed.best(
            Collective::AllReduce,
            DType::BF16,
            1000,
            Memory::Device,
            Launch::Eager,
            |_, _| true,
        );
        assert!(device.is_none());
    }

    #[test]
    fn the_launch_mode_comes_from_the_row() {
        let mut graph = row("symm", Some("lamport"), 1024, 2.0);
        graph.launch = Launch::Graph;
        let rows = vec![row("symm", Some("oneshot"), 1024, 9.0), graph];
        let table = tuning_table(&rows, "test");
        let launches: Vec<Launch> = table.measurements.iter().map(|m| m.launch).collect();
        assert_eq!(launches, [Launch::Eager, Launch::Graph]);
        let best = |launch| {
            table
                .best(
                    Collective::AllReduce,
                    DType::BF16,
                    1024,
                    Memory::Host,
                    launch,
                    |_, _| true,
                )
                .unwrap()
                .algorithm
        };
        assert_eq!(best(Launch::Eager).as_deref(), Some("oneshot"));
        assert_eq!(best(Launch::Graph).as_deref(), Some("lamport"));
    }
}
