//! NcclComm on a real GPU: the conformance suite, every collective and dtype against an
//! f64 host reference, the fill/check kernels against their host mirror, and a CUDA graph
//! of 122 all-reduces (on a stream that reports its capture) replayed 100 times. Ignored
//! without a GPU; run them on the device machine with `--include-ignored`
//! (scripts/gpu-bundle prints the command).
//!
//! NCCL refuses two ranks on one GPU, so the one-GPU tests run a world of one; the
//! `two_gpus_*` tests need two GPUs and fail on fewer (the device runner skips them by
//! name there, and says so).

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use comm_core::conformance::{self, Config};
use comm_core::cuda::cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use comm_core::cuda::pattern::{all_reduce_reference, fill_host, value};
use comm_core::cuda::stream::is_capturing;
use comm_core::cuda::{DeviceMemory, DeviceOwned, PatternKernels, driver_error, raw_stream};
use comm_core::{Communicator, DType, Error, ReduceOp, Result, ThreadsBootstrap, bf16, f16};
use comm_nccl::NcclComm;

/// A seed nobody chose: fresh data on every run.
fn fresh_seed() -> u64 {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let seed = nanos ^ u64::from(std::process::id()).rotate_left(32);
    eprintln!("seed {seed:#x}");
    seed
}

fn single() -> Result<(NcclComm, DeviceMemory)> {
    let bootstrap = ThreadsBootstrap::create(1).remove(0);
    let comm = NcclComm::new(Arc::new(bootstrap), 0)?;
    let memory = DeviceMemory::new(0)?;
    Ok((comm, memory))
}

/// Element `i` of a downloaded buffer, widened to f64.
fn element(dtype: DType, bytes: &[u8], i: usize) -> f64 {
    let s = dtype.size();
    let b = &bytes[i * s..(i + 1) * s];
    match dtype {
        DType::F32 => f64::from(f32::from_ne_bytes(b.try_into().unwrap())),
        DType::F64 => f64::from_ne_bytes(b.try_into().unwrap()),
        DType::F16 => f16::from_ne_bytes(b.try_into().unwrap()).to_f64(),
        DType::BF16 => bf16::from_ne_bytes(b.try_into().unwrap()).to_f64(),
        DType::I32 => f64::from(i32::from_ne_bytes(b.try_into().unwrap())),
        DType::I64 => i64::from_ne_bytes(b.try_into().unwrap()) as f64,
        _ => f64::from(b[0]),
    }
}

/// Counts elements of `bytes` (rank 0's view of an all-reduce over `world` ranks of the
/// pattern under `seed`) that miss the host reference.
fn wrong_on_host(dtype: DType, op: ReduceOp, seed: u64, world: u32, bytes: &[u8]) -> usize {
    let n = bytes.len() / dtype.size();
    let wrong: Vec<usize> = (0..n)
        .filter(|&i| {
            let got = element(dtype, bytes, i);
            let (want, tol) = all_reduce_reference(dtype, op, seed, world, i as u64);
            // Written so that NaN never passes.
            let ok = (got - want).abs() <= tol;
            !ok
        })
        .collect();
    for &i in wrong.iter().take(4) {
        let (want, tol) = all_reduce_reference(dtype, op, seed, world, i as u64);
        let s = dtype.size();
        eprintln!(
            "{dtype} {op}: element {i} of {n} is {:e} (bytes {:02x?}), want {want:e} +- {tol:e}",
            element(dtype, bytes, i),
            &bytes[i * s..(i + 1) * s]
        );
    }
    wrong.len()
}

#[test]
#[ignore = "needs a GPU"]
fn conformance_suite_world_of_one() {
    let _turn = comm_core::conformance::ranks::gpu_turn();
    let (comm, memory) = single().unwrap();
    let config = Config {
        seed: fresh_seed(),
        ..Config::default()
    };
    let report = conformance::run_with_memory(&comm, &memory, &config).unwrap();
    eprintln!("{report:?}");
    assert!(report.coverage_cases > 50, "{report:?}");
    assert!(report.large_case);
}

#[test]
#[ignore = "needs a GPU"]
fn fill_kernel_matches_its_host_mirror_and_check_kernel_counts_errors() {
    let _turn = comm_core::conformance::ranks::gpu_turn();
    let (_, memory) = single().unwrap();
    let kernels = PatternKernels::load(memory.context()).unwrap();
    let seed = fresh_seed();
    let n = 100_003;
    for dtype in DType::ALL {
        let mut buf = memory.alloc(dtype, n).unwrap();
        buf.poison(0xff).unwrap();
        kernels.fill(buf.view_mut(0, n).unwrap(), seed, 3).unwrap();
        let got = buf.read().unwrap();
        let mut want = vec![0u8; n * dtype.size()];
        fill_host(dtype, seed, 3, &mut want);
        assert!(
            got == want,
            "{dtype}: the fill kernel differs from the host pattern"
        );
        // Rank 0's data is the all-reduce of a world of one: nothing is wrong...
        kernels.fill(buf.view_mut(0, n).unwrap(), seed, 0).unwrap();
        let wrong = kernels
            .check_all_reduce(buf.view(0, n).unwrap(), ReduceOp::Sum, seed, 1)
            .unwrap();
        assert_eq!(wrong, 0, "{dtype}");
        // ...and against a world of two, nearly everything is.
        let wrong = kernels
            .check_all_reduce(buf.view(0, n).unwrap(), ReduceOp::Sum, seed, 2)
            .unwrap();
        assert!(wrong as usize > n / 2, "{dtype}: only {wrong} flagged");
        // Poison is always wrong.
        buf.poison(0xff).unwrap();
        let wrong = kernels
            .check_all_reduce(buf.view(0, n).unwrap(), ReduceOp::Max, seed, 1)
            .unwrap();
        let poisoned_ok = dtype == DType::U8 || dtype.is_float();
        if poisoned_ok {
            assert!(
                wrong as usize >= n - n / 100,
                "{dtype}: only {wrong} flagged"
            );
        }
    }
    assert!(value(DType::F32, seed, 0, 0).abs() < 1.0);
}

/// Runs `f`, then waits for the stream through the communicator (bounded, aborting).
fn settle(comm: &NcclComm, memory: &DeviceMemory, f: impl FnOnce() -> Result<()>) -> Result<()> {
    f()?;
    comm.synchronize(memory.raw_stream())
}

#[test]
#[ignore = "needs a GPU"]
fn every_collective_and_dtype_matches_the_host_reference() {
    let _turn = comm_core::conformance::ranks::gpu_turn();
    let (comm, memory) = single().unwrap();
    let kernels = PatternKernels::load(memory.context()).unwrap();
    let seed = fresh_seed();
    let n = 4099;
    for dtype in DType::ALL {
        let mut send = memory.alloc(dtype, n).unwrap();
        let mut recv = memory.alloc(dtype, n).unwrap();
        for op in ReduceOp::ALL {
            let s = seed ^ (op as u64) << 8 ^ (dtype as u64);
            kernels.fill(send.view_mut(0, n).unwrap(), s, 0).unwrap();
            recv.poison(0xff).unwrap();
            settle(&comm, &memory, || {
                comm.all_reduce(send.view(0, n)?, recv.view_mut(0, n)?, op)
            })
            .unwrap();
            let out = recv.read().unwrap();
            assert_eq!(wrong_on_host(dtype, op, s, 1, &out), 0, "{dtype} {op}");
            // In place.
            settle(&comm, &memory, || {
                comm.all_reduce_in_place(send.view_mut(0, n)?, op)
            })
            .unwrap();
            let out = send.read().unwrap();
            assert_eq!(
                wrong_on_host(dtype, op, s, 1, &out),
                0,
                "{dtype} {op} in place"
            );
            let out = recv.read().unwrap();
            assert_eq!(
                wrong_on_host(dtype, op, s, 1, &out),
                0,
                "{dtype} {op} recv kept"
            );
        }
        // all_gather / reduce_scatter / broadcast of a world of one copy the input.
        let s = seed ^ 0x5eed ^ dtype as u64;
        kernels.fill(send.view_mut(0, n).unwrap(), s, 0).unwrap();
        let input = send.read().unwrap();
        recv.poison(0xff).unwrap();
        settle(&comm, &memory, || {
            comm.all_gather(send.view(0, n)?, recv.view_mut(0, n)?)
        })
        .unwrap();
        assert!(recv.read().unwrap() == input, "{dtype} all_gather");
        recv.poison(0xff).unwrap();
        settle(&comm, &memory, || {
            comm.reduce_scatter(send.view(0, n)?, recv.view_mut(0, n)?, ReduceOp::Sum)
        })
        .unwrap();
        assert!(recv.read().unwrap() == input, "{dtype} reduce_scatter");
        settle(&comm, &memory, || comm.broadcast(send.view_mut(0, n)?, 0)).unwrap();
        assert!(send.read().unwrap() == input, "{dtype} broadcast");
    }
    comm.barrier().unwrap();
    // Host memory and bad roots are refused, not crashed on.
    let mut host = vec![1f32; 4];
    let err = comm
        .all_reduce_in_place(comm_core::BufferMut::host(&mut host), ReduceOp::Sum)
        .unwrap_err();
    assert!(matches!(err, Error::Unsupported(_)), "{err}");
    let mut buf = memory.alloc(DType::F32, 4).unwrap();
    let err = comm.broadcast(buf.view_mut(0, 4).unwrap(), 1).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
}

/// The decode step of the seed case: 3 tokens x 7168 bf16 per all-reduce, 122 per step.
const CALLS: usize = 122;
const COUNT: usize = 3 * 7168;
const REPLAYS: usize = 100;

#[test]
#[ignore = "needs a GPU"]
fn graph_of_122_bf16_all_reduces_replays_100_times_correctly() {
    let _turn = comm_core::conformance::ranks::gpu_turn();
    let (comm, memory) = single().unwrap();
    let kernels = PatternKernels::load(memory.context()).unwrap();
    let stream = memory.stream().clone();
    let alloc = || memory.alloc(DType::BF16, COUNT);
    let mut sends: Vec<DeviceOwned> = (0..CALLS).map(|_| alloc()).collect::<Result<_>>().unwrap();
    let mut recvs: Vec<DeviceOwned> = (0..CALLS).map(|_| alloc()).collect::<Result<_>>().unwrap();
    // Warm up outside the capture, so NCCL's lazy setup is not captured.
    settle(&comm, &memory, || {
        comm.all_reduce(
            sends[0].view(0, COUNT)?,
            recvs[0].view_mut(0, COUNT)?,
            ReduceOp::Sum,
        )
    })
    .unwrap();

    // What a selector asks to route a call from eager or graph measurements.
    let capturing = || is_capturing(raw_stream(&stream)).unwrap();
    assert!(!capturing());
    stream
        .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .map_err(driver_error)
        .unwrap();
    assert!(capturing());
    let captured: Result<()> = sends.iter().zip(recvs.iter_mut()).try_for_each(|(s, r)| {
        comm.all_reduce(s.view(0, COUNT)?, r.view_mut(0, COUNT)?, ReduceOp::Sum)
    });
    let graph = stream
        .end_capture(CUgraphInstantiate_flags(0))
        .map_err(driver_error)
        .unwrap()
        .expect("the capture recorded a graph");
    captured.unwrap();
    assert!(!capturing());

    let base = fresh_seed();
    let mut bad_host = 0;
    let mut bad_device = 0u64;
    for replay in 0..REPLAYS {
        // Fresh inputs and poisoned outputs before every replay: the graph must read the
        // buffers' current contents and write every element.
        let seed = |i: usize| base ^ ((replay * CALLS + i) as u64).wrapping_mul(0x9E37_79B9);
        for (i, (s, r)) in sends.iter_mut().zip(recvs.iter_mut()).enumerate() {
            kernels
                .fill(s.view_mut(0, COUNT).unwrap(), seed(i), 0)
                .unwrap();
            r.poison(0xff).unwrap();
        }
        graph.launch().map_err(driver_error).unwrap();
        comm.synchronize(memory.raw_stream()).unwrap();
        for (i, r) in recvs.iter().enumerate() {
            bad_device += kernels
                .check_all_reduce(r.view(0, COUNT).unwrap(), ReduceOp::Sum, seed(i), 1)
                .unwrap();
            bad_host += wrong_on_host(DType::BF16, ReduceOp::Sum, seed(i), 1, &r.read().unwrap());
        }
    }
    eprintln!(
        "graph: {CALLS} all-reduces of {} bytes, {REPLAYS} replays: {bad_host} wrong (host), {bad_device} wrong (device)",
        COUNT * 2
    );
    assert_eq!(bad_host, 0);
    assert_eq!(bad_device, 0);
}

/// Fails the test unless this machine has two GPUs: a two-GPU test that cannot run must
/// not pass (the device runner runs these only where two GPUs are present).
fn require_two_gpus() {
    let found = comm_core::cuda::device_count().unwrap_or(0);
    assert!(found >= 2, "needs 2 GPUs, found {found}");
}

fn two_gpu_group(
    timeout: Duration,
) -> Vec<std::thread::JoinHandle<Result<(NcclComm, DeviceMemory)>>> {
    ThreadsBootstrap::with_timeout(2, timeout)
        .into_iter()
        .map(|b| {
            std::thread::spawn(move || {
                let comm = NcclComm::from_bootstrap(Arc::new(b))?;
                let memory = DeviceMemory::new(comm.context().ordinal())?;
                Ok((comm, memory))
            })
        })
        .collect()
}

#[test]
#[ignore = "needs 2 GPUs"]
fn two_gpus_conformance_with_threads() {
    let _turn = comm_core::conformance::ranks::gpu_turn();
    require_two_gpus();
    let handles: Vec<_> = two_gpu_group(Duration::from_secs(60))
        .into_iter()
        .map(|h| h.join().unwrap().unwrap())
        .map(|(comm, memory)| {
            std::thread::spawn(move || {
                let config = Config {
                    large_count: Some(1 << 22),
                    ..Config::default()
                };
                conformance::run_with_memory(&comm, &memory, &config)
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap().unwrap();
    }
}

#[test]
#[ignore = "needs 2 GPUs"]
fn two_gpus_an_absent_rank_times_out_and_aborts() {
    let _turn = comm_core::conformance::ranks::gpu_turn();
    absent_rank_times_out_and_aborts(true);
}

#[test]
#[ignore = "needs 2 GPUs"]
fn two_gpus_an_absent_rank_times_out_and_aborts_without_validation() {
    let _turn = comm_core::conformance::ranks::gpu_turn();
    absent_rank_times_out_and_aborts(false);
}

/// Rank 1 stops calling. Validating, rank 0's next call times out in the exchange of call
/// descriptors; without, it enqueues and the bounded wait times out behind NCCL's kernel.
/// Either way the communicator is aborted afterwards.
fn absent_rank_times_out_and_aborts(validate: bool) {
    require_two_gpus();
    let bound = Duration::from_secs(2);
    // Both ranks run one all-reduce first: NCCL connects peers lazily, inside the first
    // call, and a peer that never made any call blocks that enqueue itself. The case this
    // test is about is a peer that stops answering in the middle of a job.
    let ranks: Vec<_> = two_gpu_group(bound)
        .into_iter()
        .map(|h| h.join().unwrap().unwrap())
        .map(|(mut comm, memory)| {
            std::thread::spawn(move || {
                comm.set_validate(validate);
                let mut buf = memory.alloc(DType::F32, 1024)?;
                buf.poison(0)?;
                comm.all_reduce_in_place(buf.view_mut(0, 1024)?, ReduceOp::Sum)?;
                comm.synchronize(memory.raw_stream())?;
                Ok::<_, Error>((comm, memory, buf))
            })
        })
        .collect();
    let mut ranks: Vec<_> = ranks
        .into_iter()
        .map(|h| h.join().unwrap().unwrap())
        .collect();
    let (comm, memory, mut buf) = ranks.remove(0);
    // Rank 1 never calls again. Leak it: destroying a communicator whose peer is stuck
    // could wait on that peer, which is not what this test is about.
    std::mem::forget(ranks);
    let called = comm.all_reduce_in_place(buf.view_mut(0, 1024).unwrap(), ReduceOp::Sum);
    assert_eq!(called.is_err(), validate, "{called:?}");
    let err = match called {
        Err(e) => e,
        Ok(()) => comm.synchronize(memory.raw_stream()).unwrap_err(),
    };
    assert!(matches!(err, Error::Timeout { .. }), "{err}");
    let err = comm.barrier().unwrap_err();
    assert!(matches!(err, Error::Aborted(_)), "{err}");
    // The aborted communicator and its buffers go last, after the stream is dead.
    std::mem::forget((comm, buf));
}

#[test]
#[ignore = "needs 2 GPUs"]
fn two_gpus_disagreeing_ranks_get_a_mismatch_and_never_stale_data() {
    let _turn = comm_core::conformance::ranks::gpu_turn();
    use comm_core::conformance::{After, Disagreement};
    require_two_gpus();
    let bound = Duration::from_secs(2);
    for kind in Disagreement::ALL {
        let handles: Vec<_> = two_gpu_group(bound)
            .into_iter()
            .map(|h| h.join().unwrap().unwrap())
            .map(|(comm, memory)| {
                std::thread::spawn(move || {
                    let after = conformance::check_disagreement(&comm, &memory, kind, bound * 4);
                    // A poisoned NCCL communicator may wait on its peer when destroyed.
                    if !matches!(after, Ok(After::Usable)) {
                        std::mem::forget((comm, memory));
                    }
                    after
                })
            })
            .collect();
        let results = handles.into_iter().map(|h| h.join().unwrap());
        let after =
            conformance::same_everywhere(results).unwrap_or_else(|e| panic!("{kind:?}: {e}"));
        assert_ne!(after, After::Skipped, "{kind:?}");
    }
}
