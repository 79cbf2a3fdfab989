//! Every GPU backend (`nccl`, `ipc`, `symm-cuda`) and `auto`: bf16 sum all-reduces at 8 B,
//! 42 KB (a decode step's all-reduce), 1 MiB and 64 MiB, as eager calls and as replays of
//! a CUDA graph of one call; and the fused all-reduce + residual add + RMSNorm of the
//! backends that have it (`ipc`, `symm-cuda`) at 3 x 7168 and 64 x 8192.
//!
//! Ranks are threads of this process (see `comm_benches::gpu`): one per GPU where there
//! are two or more, else two sharing the one GPU; each group's name says which. Two ranks
//! on one GPU share its memory bandwidth and SMs, so their figures are not those of two
//! GPUs, and NCCL, which refuses two ranks on one GPU, is skipped there. Each iteration's
//! time is taken by CUDA events on every rank's stream (criterion's `iter_custom`), the
//! slowest rank's counting.
//!
//! Without a GPU or a CUDA driver the bench says it was skipped and exits 0.

use std::process::ExitCode;
use std::time::Duration;

use comm_benches::gpu::{Calls, Job, Op, Placement, Ranks};
use criterion::{BenchmarkId, Criterion, Throughput};

const BACKENDS: [&str; 4] = ["nccl", "ipc", "symm-cuda", "auto"];
const SIZES: [(&str, usize); 4] = [
    ("8B", 8),
    ("42KB", 42 * 1024),
    ("1MiB", 1 << 20),
    ("64MiB", 64 << 20),
];
/// Rows x hidden of the fused op: a decode step's (42 KB) and a 1 MiB batch.
const FUSED: [(&str, usize, usize); 2] = [("3x7168", 3, 7168), ("64x8192", 64, 8192)];
/// Backends with the fused op.
const FUSED_BACKENDS: [&str; 2] = ["ipc", "symm-cuda"];

fn main() -> ExitCode {
    comm_examples::launch::prefer_more_hardware_queues();
    let Some(placement) = Placement::detect() else {
        println!("gpu_allreduce: skipped: no CUDA device or driver on this machine");
        return ExitCode::SUCCESS;
    };
    // Short samples: a GPU call takes microseconds, and the device suite runs every
    // backend in a few minutes (`--quick` shortens further).
    let mut c = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .configure_from_args();
    let mut failed = false;
    for backend in BACKENDS {
        failed |= !bench_backend(&mut c, backend, placement);
    }
    c.final_summary();
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// Benches `backend`; false when it failed to start.
fn bench_backend(c: &mut Criterion, backend: &str, placement: Placement) -> bool {
    let place = placement.describe();
    if backend == "nccl" && placement.sharing() > 1 {
        println!("gpu_allreduce {backend}: skipped: NCCL needs a GPU per rank ({place})");
        return true;
    }
    let ranks = match Ranks::start(backend, placement) {
        Ok(ranks) => ranks,
        Err(e) => {
            eprintln!("gpu_allreduce {backend}: failed to start ({place}): {e}");
            return false;
        }
    };
    let mut group = c.benchmark_group(format!("{backend} all_reduce bf16, {place}"));
    for calls in [Calls::Eager, Calls::Graph] {
        for (label, bytes) in SIZES {
            let op = Op::AllReduce { count: bytes / 2 };
            bench_op(&mut group, &ranks, label, op, calls);
        }
    }
    group.finish();
    if FUSED_BACKENDS.contains(&backend) {
        let mut group = c.benchmark_group(format!(
            "{backend} fused all_reduce+residual+rmsnorm bf16, {place}"
        ));
        for calls in [Calls::Eager, Calls::Graph] {
            for (label, rows, hidden) in FUSED {
                bench_op(&mut group, &ranks, label, Op::Fused { rows, hidden }, calls);
            }
        }
        group.finish();
    } else {
        println!(
            "gpu_allreduce {backend}: no fused all-reduce + RMSNorm (ipc and symm-cuda have it)"
        );
    }
    ranks.stop();
    true
}

fn bench_op(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    ranks: &Ranks,
    label: &str,
    op: Op,
    calls: Calls,
) {
    let mode = match calls {
        Calls::Eager => "eager",
        Calls::Graph => "graph",
    };
    group.throughput(Throughput::Bytes(op.bytes() as u64));
    group.bench_function(BenchmarkId::new(mode, label), |b| {
        b.iter_custom(|iters| {
            ranks
                .time(Job { op, calls, iters })
                // A wrong result or a failed call stops the bench: no figure of it.
                .unwrap_or_else(|e| panic!("{mode} {label}: {e}"))
        })
    });
}
