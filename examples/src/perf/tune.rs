//! `--tune`: the sweep's times as a `comm-select` tuning table.
//!
//! `SelectComm` (backend `auto`) routes each call to the fastest backend measured at the
//! nearest size; this writes what it reads (`COMM_TUNING=FILE`), in `comm-select`'s own
//! type so that the two cannot drift apart. Rows that failed the check are left out (a
//! fast wrong answer must never win), and so is `auto` itself, whose time is whatever it
//! picked. Each measurement keeps its row's launch mode (eager, or graph replay), which
//! the selector matches against the call's. The table's `fabric` is what comm-select's
//! topology probe finds between the GPUs the device rows ran on (`nvlink`, `pcie`...), or
//! `host` when no row ran on a GPU.

use comm_core::{Collective, Result};
use comm_select::{BackendId, Fabric, Measurement, Memory, TuningTable};

use super::report::Row;
use crate::backends::RankContext;
use crate::launch::run_threads;

/// The tuning table of `rows` (one world size: the first row's), measured over `fabric`
/// (a [`Fabric`] name), with `note` recording how it was measured.
pub fn tuning_table(rows: &[Row], fabric: &str, note: &str) -> TuningTable {
    let mut table = TuningTable::new(world_size(rows), fabric, note);
    table.measurements = tabled(rows)
        .filter_map(|r| Some((r, r.primary()?.time_us)))
        .map(|(r, time_us)| Measurement {
            collective: Collective::AllReduce.name().to_string(),
            dtype: r.dtype.clone(),
            bytes: r.bytes as usize,
            memory: memory(r),
            launch: r.launch,
            backend: r.backend.clone(),
            algorithm: r.algorithm.clone(),
            time_us,
        })
        .collect();
    table
}

/// The world size of a table of `rows`: the first row's.
fn world_size(rows: &[Row]) -> usize {
    rows.first().map_or(1, |r| r.ranks)
}

/// The rows a table keeps: checked right (or unchecked), of a real backend, of its world.
fn tabled(rows: &[Row]) -> impl Iterator<Item = &Row> {
    let world = world_size(rows);
    rows.iter()
        .filter(move |r| !r.failed() && r.backend != "auto" && r.ranks == world)
}

/// Where the row's backend takes its buffers; `None` for a backend the selector does not
/// know (a measurement of it then applies to either memory).
fn memory(row: &Row) -> Option<Memory> {
    row.backend.parse::<BackendId>().ok().map(BackendId::memory)
}

/// Collective (every rank, in-process ranks as `ranks` threads when `process` is `None`):
/// the fabric the table of `rows` was measured over. Every rank gets rank 0's answer.
pub fn fabric(process: Option<&RankContext>, ranks: usize, rows: &[Row]) -> Result<Fabric> {
    match process {
        Some(ctx) => probe_fabric(ctx, rows),
        None => run_threads(ranks, |ctx| probe_fabric(&ctx, rows))?
            .into_iter()
            .next()
            .unwrap_or(Ok(Fabric::Single)),
    }
}

/// Collective: the fabric between the ranks' GPUs (each rank's device by the GPU
/// backends' rule) when a device backend's rows are in the table, as comm-select probes
/// it for the selector; between host processes otherwise (`host` on one node).
pub fn probe_fabric(ctx: &RankContext, rows: &[Row]) -> Result<Fabric> {
    let on_gpus = tabled(rows).any(|r| memory(r) == Some(Memory::Device));
    let device = if on_gpus { ctx.device().ok() } else { None };
    Ok(comm_select::probe(&**ctx.bootstrap(), device)?.fabric())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::perf::report::Timing;
    use comm_core::DType;
    use comm_select::Launch;

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
                back_to_back_us: None,
                host_us: None,
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
        let table = tuning_table(&rows, "nvlink", "test");
        assert_eq!(table.world_size, 4);
        assert_eq!(table.fabric, "nvlink");
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
        let table = tuning_table(&rows, "host", "test");
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

    /// What `--tune` measures on a GPU: eager and graph tables of each device backend.
    #[test]
    fn eager_and_graph_rows_of_a_device_backend_answer_their_own_calls() {
        let mut rows = Vec::new();
        for (algorithm, eager_us, graph_us) in
            [("oneshot-push", 9.0, 6.0), ("oneshot-pull", 8.0, 7.0)]
        {
            rows.push(row("ipc", Some(algorithm), 43008, eager_us));
            let mut graph = row("ipc", Some(algorithm), 43008, graph_us);
            graph.launch = Launch::Graph;
            rows.push(graph);
        }
        let table = tuning_table(&rows, "nvlink", "test");
        assert_eq!(table.measurements.len(), 4);
        assert!(
            table
                .measurements
                .iter()
                .all(|m| m.memory == Some(Memory::Device))
        );
        assert_eq!(table.answering(Launch::Graph), Launch::Graph);
        let best = |launch| {
            TuningTable::from_json(&table.to_json())
                .unwrap()
                .best(
                    Collective::AllReduce,
                    DType::BF16,
                    43008,
                    Memory::Device,
                    launch,
                    |_, _| true,
                )
                .unwrap()
        };
        assert_eq!(
            best(Launch::Eager).algorithm.as_deref(),
            Some("oneshot-pull")
        );
        let graph = best(Launch::Graph);
        assert_eq!(
            (graph.algorithm.as_deref(), graph.time_us),
            (Some("oneshot-push"), 6.0)
        );
    }

    #[test]
    fn host_rows_were_measured_over_host_memory() {
        let rows = vec![row("symm", Some("oneshot"), 1024, 9.0)];
        let fabric = fabric(None, 3, &rows).unwrap();
        assert_eq!((fabric, fabric.name()), (Fabric::HostMemory, "host"));
        assert_eq!(tuning_table(&rows, fabric.name(), "test").fabric, "host");
    }

    #[test]
    fn device_rows_are_probed_on_the_gpus_where_there_are_some() {
        let rows = vec![row("nccl", None, 1024, 9.0)];
        let fabric = fabric(None, 2, &rows).unwrap();
        if comm_core::cuda::device_count().unwrap_or(0) == 0 {
            assert_eq!(fabric, Fabric::HostMemory);
        } else {
            assert_ne!(fabric, Fabric::MultiNode);
        }
    }
}
