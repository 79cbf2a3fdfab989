//! `auto` and every GPU backend on device memory (ignored without a GPU): the conformance
//! suite through the selector, in-process and under `mpirun`; ranks that disagree get
//! `Error::Mismatch` from `async_error` as soon as the stream has drained, through `auto`
//! and through each member alike; and a first call captured into a CUDA graph (capture
//! first, or eager first) replays right.
//!
//! Ranks are threads, one per GPU (two sharing it on a machine with one GPU); NCCL, which
//! refuses ranks sharing a GPU, runs one rank per GPU (a world of one on one GPU).

use std::sync::Arc;
use std::time::Duration;

use comm_core::conformance::ranks::{gpu_turn, on_threads};
use comm_core::conformance::{self, After, Config, Disagreement, mpirun};
use comm_core::cuda::cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use comm_core::cuda::cudarc::driver::{CudaGraph, CudaStream};
use comm_core::cuda::{DeviceMemory, device_count};
use comm_core::{Bootstrap, Communicator, EnvBootstrap, Error, ReduceOp, Result, bf16};
use comm_select::{BackendId, SelectComm};

/// Bound on every wait of a rank thread's bootstrap.
const TIMEOUT: Duration = Duration::from_secs(60);

/// The backends a capture test runs, by the names `auto` knows them by.
const GPU_BACKENDS: [BackendId; 3] = [BackendId::Nccl, BackendId::Ipc, BackendId::SymmCuda];

fn gpus() -> usize {
    device_count().expect("a GPU")
}

/// Ranks of the in-process tests: one per GPU, at least two.
fn world() -> usize {
    gpus().max(2)
}

fn device_of(bootstrap: &dyn Bootstrap) -> usize {
    bootstrap.local_rank() % gpus()
}

/// `auto` over the GPU backends that start on every rank. (With the host backends too,
/// its capabilities would be the union of both: ops such as `prod` that only host members
/// take, which device buffers are then refused.)
fn auto(bootstrap: Arc<dyn Bootstrap>) -> Result<SelectComm> {
    comm_select::Auto::new(bootstrap)
        .backends(&GPU_BACKENDS)
        .build()
}

/// Members' waits for peers end after this; the bootstrap, through which the selector
/// diagnoses a failed wait, waits longer ([`TIMEOUT`]), so that every rank's diagnosis
/// meets its peers'.
const MEMBER_TIMEOUT_SECS: &str = "5";

/// Sets the GPU members' bound on waits for peers: ranks that disagree and were routed to
/// different members learn it from that wait.
fn short_member_waits() {
    for prefix in ["COMM_IPC", "COMM_SYMM"] {
        // SAFETY: each test of this binary runs in a process of its own (nextest) or one
        // after another (`--test-threads 1`, the device suite), set before any rank
        // thread starts and before anything reads the environment.
        unsafe { std::env::set_var(format!("{prefix}_TIMEOUT_SECS"), MEMBER_TIMEOUT_SECS) };
    }
}

/// One backend alone, as `auto` starts it (`symm-cuda` as the `SymmComm` enum).
fn backend(id: BackendId, bootstrap: &Arc<dyn Bootstrap>) -> Result<Box<dyn Communicator>> {
    let entry = comm_select::find(id).expect("a backend of this build");
    entry.start(bootstrap, Some(device_of(&**bootstrap)))
}

#[test]
#[ignore = "needs a GPU"]
fn auto_passes_the_conformance_suite_in_process() {
    let _turn = gpu_turn();
    let reports = on_threads(world(), TIMEOUT, |b| {
        let b: Arc<dyn Bootstrap> = Arc::new(b);
        let comm = auto(b.clone())?;
        let memory = DeviceMemory::new(device_of(&*b))?;
        let suite = Config {
            random_cases: 24,
            large_count: Some(1 << 20),
            ..Config::default()
        };
        conformance::run_with_memory(&comm, &memory, &suite)
            .map_err(|f| Error::Mismatch(f.to_string()))
    });
    for r in reports {
        let report = r.unwrap_or_else(|e| panic!("{e}"));
        assert!(report.large_case, "the large all-reduce did not run");
    }
}

/// Every kind of disagreement, through `auto`: `Mismatch` on every rank (the suite reads
/// `async_error` right after the stream drained), then a poisoned or still right selector.
#[test]
#[ignore = "needs a GPU"]
fn auto_reports_disagreements_on_every_rank() {
    let _turn = gpu_turn();
    short_member_waits();
    for kind in Disagreement::ALL {
        let results = on_threads(world(), TIMEOUT, move |b| {
            let b: Arc<dyn Bootstrap> = Arc::new(b);
            let comm = auto(b.clone()).expect("auto");
            let memory = DeviceMemory::new(device_of(&*b)).expect("device memory");
            conformance::check_disagreement(&comm, &memory, kind, TIMEOUT)
        });
        let after =
            conformance::same_everywhere(results).unwrap_or_else(|e| panic!("{kind:?}: {e}"));
        assert_ne!(after, After::Skipped, "{kind:?}");
    }
}

/// The case a user found: rank 0 reduces 1000 f32, the others 1001. The call returns `Ok`
/// (the kernels compare the calls), and once the stream has drained `async_error` says
/// `Mismatch` on every rank, through `auto` and through each member on its own; the output
/// is untouched.
#[test]
#[ignore = "needs a GPU"]
fn a_mismatched_call_is_reported_once_the_stream_drains() {
    let _turn = gpu_turn();
    type Make = fn(&Arc<dyn Bootstrap>) -> Result<Box<dyn Communicator>>;
    let makers: [(&str, Make); 3] = [
        ("auto", |b| Ok(Box::new(auto(b.clone())?))),
        ("ipc", |b| backend(BackendId::Ipc, b)),
        ("symm-cuda", |b| backend(BackendId::SymmCuda, b)),
    ];
    for (name, make) in makers {
        let results = on_threads(world(), TIMEOUT, move |b| -> Result<()> {
            let b: Arc<dyn Bootstrap> = Arc::new(b);
            let comm = make(&b)?;
            let memory = DeviceMemory::new(device_of(&*b))?;
            let count = if b.rank() == 0 { 1000 } else { 1001 };
            let input = memory.alloc(comm_core::DType::F32, count)?;
            let mut output = memory.alloc(comm_core::DType::F32, count)?;
            output.poison(0x5a)?;
            comm.all_reduce(
                input.view(0, count)?,
                output.view_mut(0, count)?,
                ReduceOp::Sum,
            )?;
            memory.synchronize()?;
            match comm.async_error() {
                Err(Error::Mismatch(m)) if m.contains("1000") && m.contains("1001") => {}
                other => {
                    return Err(Error::InvalidArgument(format!(
                        "{name}: async_error after the drain: {other:?}"
                    )));
                }
            }
            if output.read()?.iter().any(|&byte| byte != 0x5a) {
                return Err(Error::InvalidArgument(format!(
                    "{name}: the mismatched call wrote output"
                )));
            }
            Ok(())
        });
        for (rank, r) in results.into_iter().enumerate() {
            r.unwrap_or_else(|e| panic!("rank {rank}: {e}"));
        }
    }
}

/// `auto` as processes: the suite and one disagreement, two ranks under `mpirun` (sharing
/// the GPU where there is one).
#[test]
#[ignore = "needs a GPU"]
fn auto_under_mpirun_np2() {
    mpirun::on_mpirun("auto_under_mpirun_np2", 2, || {
        short_member_waits();
        let b: Arc<dyn Bootstrap> = Arc::new(EnvBootstrap::from_env().expect("the mpirun job"));
        let memory = DeviceMemory::new(device_of(&*b)).expect("device memory");
        let comm = auto(b.clone()).expect("auto");
        let suite = Config {
            random_cases: 8,
            large_count: Some(1 << 18),
            ..Config::default()
        };
        conformance::run_with_memory(&comm, &memory, &suite).unwrap_or_else(|f| panic!("{f}"));
        let fresh = auto(b.clone()).expect("auto");
        let after = conformance::check_disagreement(&fresh, &memory, Disagreement::Count, TIMEOUT)
            .unwrap_or_else(|f| panic!("{f}"));
        assert_ne!(after, After::Skipped);
    });
}

/// Whether a capture test captures the communicator's very first call, or makes one eager
/// call first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Order {
    CaptureFirst,
    EagerFirst,
}

#[test]
#[ignore = "needs a GPU"]
fn every_gpu_backend_and_auto_capture_their_first_call() {
    let _turn = gpu_turn();
    for order in [Order::CaptureFirst, Order::EagerFirst] {
        for id in GPU_BACKENDS {
            // NCCL refuses ranks sharing a GPU: one rank per GPU.
            let world = if id == BackendId::Nccl {
                gpus()
            } else {
                world()
            };
            let results = on_threads(world, TIMEOUT, move |b| {
                let b: Arc<dyn Bootstrap> = Arc::new(b);
                let comm = backend(id, &b)?;
                capture_round_trip(&*comm, &*b, order)
            });
            for (rank, r) in results.into_iter().enumerate() {
                r.unwrap_or_else(|e| panic!("{} {order:?}, rank {rank}: {e}", id.name()));
            }
        }
        let results = on_threads(world(), TIMEOUT, move |b| {
            let b: Arc<dyn Bootstrap> = Arc::new(b);
            let comm = auto(b.clone())?;
            capture_round_trip(&comm, &*b, order)
        });
        for (rank, r) in results.into_iter().enumerate() {
            r.unwrap_or_else(|e| panic!("auto {order:?}, rank {rank}: {e}"));
        }
    }
}

/// Elements of the captured all-reduce: the seeds' 42 KB of bf16.
const COUNT: usize = 3 * 7168;

/// Rank `rank`'s input of round `round`: small integers, so that every sum is exact in bf16.
fn input(rank: usize, round: usize) -> Vec<bf16> {
    (0..COUNT)
        .map(|i| bf16::from_f32(((rank + 1) * (i % 5 + round + 1)) as f32))
        .collect()
}

fn expected(world: usize, round: usize) -> Vec<bf16> {
    (0..COUNT)
        .map(|i| bf16::from_f32((world * (world + 1) / 2 * (i % 5 + round + 1)) as f32))
        .collect()
}

/// On this rank's own stream: (an eager call, checked, then) a capture of one in-place
/// all-reduce and three replays of it, each on fresh inputs, checked.
fn capture_round_trip(comm: &dyn Communicator, b: &dyn Bootstrap, order: Order) -> Result<()> {
    let (rank, world) = (comm.rank(), comm.world_size());
    let stream = comm_core::cuda::context(device_of(b))?.new_stream()?;
    let mut x = stream.alloc_zeros::<bf16>(COUNT)?;
    let check = |stream: &Arc<CudaStream>, x: &_, round: usize| -> Result<()> {
        let got: Vec<bf16> = stream.clone_dtoh(x)?;
        comm.async_error()?;
        let want = expected(world, round);
        match got.iter().zip(&want).position(|(g, w)| g != w) {
            None => Ok(()),
            Some(i) => Err(Error::InvalidArgument(format!(
                "round {round}: element {i} is {}, want {}",
                got[i], want[i]
            ))),
        }
    };
    b.barrier()?;
    if order == Order::EagerFirst {
        stream.memcpy_htod(&input(rank, 0), &mut x)?;
        comm.all_reduce_in_place((&mut x).into(), ReduceOp::Sum)?;
        check(&stream, &x, 0)?;
    }
    let graph = capture(&stream, || {
        comm.all_reduce_in_place((&mut x).into(), ReduceOp::Sum)
    })?;
    // A peer may still be capturing or uploading while this rank's replay spins for it.
    graph.upload()?;
    stream.synchronize()?;
    b.barrier()?;
    for round in 1..=3 {
        stream.memcpy_htod(&input(rank, round), &mut x)?;
        graph.launch()?;
        check(&stream, &x, round)?;
    }
    Ok(())
}

/// What `enqueue` puts on `stream`, as a graph; the capture ends whatever happens.
fn capture(stream: &Arc<CudaStream>, enqueue: impl FnOnce() -> Result<()>) -> Result<CudaGraph> {
    stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
    let enqueued = enqueue();
    let ended = stream.end_capture(CUgraphInstantiate_flags(0));
    enqueued?;
    ended?.ok_or_else(|| Error::backend("cuda", "the capture recorded no graph"))
}
