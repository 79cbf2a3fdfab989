//! NCCL's symmetric windows on a real GPU: registered buffers ([`NcclComm::alloc`]) and
//! the staged path (algorithm `symmetric`) against an f64 host reference on fresh data
//! with poisoned outputs, eager and in CUDA graphs; the conformance suite over the staged
//! path; calls past a window's end; 1000 registrations with device memory and file
//! descriptors flat. Ignored without a GPU (`--include-ignored` on the device machine).
//!
//! NCCL refuses two ranks on one GPU: one GPU runs a world of one (correctness and cost,
//! not the symmetric kernels' speed, which needs peers); the `two_gpus_*` tests need two
//! GPUs and fail on fewer (the device runner runs them only where there are two).

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use comm_core::RegisteredBuffer;
use comm_core::conformance::{self, Config};
use comm_core::cuda::cudarc::driver::result::mem_get_info;
use comm_core::cuda::cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use comm_core::cuda::pattern::all_reduce_reference;
use comm_core::cuda::{DeviceMemory, DeviceOwned, PatternKernels, driver_error};
use comm_core::{
    BufferMut, Communicator, DType, Error, ReduceOp, Result, ThreadsBootstrap, bf16, f16,
};
use comm_nccl::{NcclBuffer, NcclComm, SYMMETRIC_SINCE, nccl_version};

fn fresh_seed() -> u64 {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let seed = nanos ^ u64::from(std::process::id()).rotate_left(32);
    eprintln!("seed {seed:#x}");
    seed
}

/// A world of one whose NCCL must have windows: the tests below are about them, and a
/// GPU machine with an NCCL older than 2.27 fails them with the reason rather than pass.
fn single() -> (NcclComm, DeviceMemory) {
    let bootstrap = ThreadsBootstrap::create(1).remove(0);
    let comm = NcclComm::new(Arc::new(bootstrap), 0).unwrap();
    let memory = DeviceMemory::new(0).unwrap();
    let version = nccl_version().unwrap();
    assert!(
        version >= SYMMETRIC_SINCE,
        "NCCL {version:?} is older than {SYMMETRIC_SINCE:?}: {:?}",
        comm.symmetric_unavailable()
    );
    assert_eq!(comm.symmetric_unavailable(), None, "NCCL {version:?}");
    (comm, memory)
}

fn element(dtype: DType, bytes: &[u8], i: usize) -> f64 {
    let s = dtype.size();
    let b = &bytes[i * s..(i + 1) * s];
    match dtype {
        DType::F32 => f64::from(f32::from_ne_bytes(b.try_into().unwrap())),
        DType::F16 => f16::from_ne_bytes(b.try_into().unwrap()).to_f64(),
        DType::BF16 => bf16::from_ne_bytes(b.try_into().unwrap()).to_f64(),
        other => panic!("not used here: {other}"),
    }
}

/// Elements of `bytes` that miss the f64 reference of an all-reduce over `world` ranks.
fn wrong_on_host(dtype: DType, op: ReduceOp, seed: u64, world: u32, bytes: &[u8]) -> usize {
    (0..bytes.len() / dtype.size())
        .filter(|&i| {
            let (want, tol) = all_reduce_reference(dtype, op, seed, world, i as u64);
            let ok = (element(dtype, bytes, i) - want).abs() <= tol;
            !ok
        })
        .count()
}

/// Sets every byte of elements `offset .. offset + len` of `buf` to 0xff (NaN, -1).
fn poison(buf: &mut NcclBuffer, memory: &DeviceMemory, dtype: DType, offset: usize, len: usize) {
    let bytes = vec![0xffu8; len * dtype.size()];
    buf.upload(memory.stream(), offset * dtype.size(), &bytes)
        .unwrap();
}

fn download(
    buf: &NcclBuffer,
    memory: &DeviceMemory,
    dtype: DType,
    offset: usize,
    len: usize,
) -> Vec<u8> {
    let mut out = vec![0u8; len * dtype.size()];
    buf.download(memory.stream(), offset * dtype.size(), &mut out)
        .unwrap();
    out
}

#[test]
#[ignore = "needs a GPU"]
fn windows_are_offered_and_explained() {
    let _turn = conformance::ranks::gpu_turn();
    let (comm, _memory) = single();
    let caps = comm.capabilities();
    assert_eq!(caps.algorithms, ["plain", "symmetric"]);
    assert!(caps.unavailable.is_empty(), "{:?}", caps.unavailable);
    // The staging window.
    assert_eq!(comm.windows(), 1);
    comm.set_algorithm(Some("symmetric")).unwrap();
    comm.set_algorithm(Some("plain")).unwrap();
    let err = comm.set_algorithm(Some("ring")).unwrap_err();
    assert!(matches!(err, Error::Unsupported(_)), "{err}");
    // Turned off, every rank says why, and the plain path stays.
    // SAFETY: read only at join, by this thread (the tests of this binary take turns).
    unsafe { std::env::set_var("COMM_NCCL_SYMMETRIC", "0") };
    let off = NcclComm::new(Arc::new(ThreadsBootstrap::create(1).remove(0)), 0);
    // SAFETY: as above.
    unsafe { std::env::remove_var("COMM_NCCL_SYMMETRIC") };
    let off = off.unwrap();
    let why = off.symmetric_unavailable().unwrap().to_string();
    assert!(why.contains("COMM_NCCL_SYMMETRIC=0"), "{why}");
    assert_eq!(off.capabilities().algorithms, ["plain"]);
    assert_eq!(off.capabilities().unavailable[0].0, "symmetric");
    let err = off.set_algorithm(Some("symmetric")).unwrap_err();
    assert!(err.to_string().contains("COMM_NCCL_SYMMETRIC=0"), "{err}");
    let err = off.alloc(4096).unwrap_err();
    assert!(matches!(err, Error::Unsupported(_)), "{err}");
}

#[test]
#[ignore = "needs a GPU"]
fn conformance_suite_over_the_staged_path_world_of_one() {
    let _turn = conformance::ranks::gpu_turn();
    let (comm, memory) = single();
    comm.set_algorithm(Some("symmetric")).unwrap();
    let config = Config {
        seed: fresh_seed(),
        ..Config::default()
    };
    let report = conformance::run_with_memory(&comm, &memory, &config).unwrap();
    assert!(report.coverage_cases > 50, "{report:?}");
}

/// Out of place (send at elements 0.., recv at `n`..) and in place, in one window.
#[test]
#[ignore = "needs a GPU"]
fn registered_buffers_match_the_host_reference_eager() {
    let _turn = conformance::ranks::gpu_turn();
    let (comm, memory) = single();
    let kernels = PatternKernels::load(memory.context()).unwrap();
    let stream = memory.stream().clone();
    let base = fresh_seed();
    for dtype in [DType::BF16, DType::F16, DType::F32] {
        for n in [1, 7, 4099, 3 * 7168, 1 << 20] {
            let mut buf = comm.alloc(2 * n * dtype.size()).unwrap();
            assert_eq!(comm.windows(), 2);
            for op in [ReduceOp::Sum, ReduceOp::Max] {
                let seed = base ^ (n as u64) << 16 ^ (op as u64) << 8 ^ dtype as u64;
                kernels
                    .fill(buf.view_mut(dtype, 0, n, &stream).unwrap(), seed, 0)
                    .unwrap();
                poison(&mut buf, &memory, dtype, n, n);
                {
                    let (send, recv) = (
                        buf.device_ptr(),
                        buf.device_ptr() + (n * dtype.size()) as u64,
                    );
                    // SAFETY: both halves lie in `buf`, which outlives the synchronised call.
                    let (send, recv) = unsafe {
                        (
                            comm_core::BufferRef::from_device_ptr(
                                send,
                                n,
                                dtype,
                                0,
                                memory.raw_stream(),
                            ),
                            BufferMut::from_device_ptr(recv, n, dtype, 0, memory.raw_stream()),
                        )
                    };
                    comm.all_reduce(send, recv, op).unwrap();
                }
                comm.synchronize(memory.raw_stream()).unwrap();
                let out = download(&buf, &memory, dtype, n, n);
                assert_eq!(
                    wrong_on_host(dtype, op, seed, 1, &out),
                    0,
                    "{dtype} {op} n={n}"
                );
                let on_device = kernels
                    .check_all_reduce(buf.view(dtype, n, n, &stream).unwrap(), op, seed, 1)
                    .unwrap();
                assert_eq!(on_device, 0, "{dtype} {op} n={n}");
                // In place.
                comm.all_reduce_in_place(buf.view_mut(dtype, 0, n, &stream).unwrap(), op)
                    .unwrap();
                comm.synchronize(memory.raw_stream()).unwrap();
                let out = download(&buf, &memory, dtype, 0, n);
                assert_eq!(
                    wrong_on_host(dtype, op, seed, 1, &out),
                    0,
                    "{dtype} {op} n={n} in place"
                );
            }
            drop(buf);
            assert_eq!(comm.windows(), 1);
        }
    }
}

const CALLS: usize = 20;
const COUNT: usize = 3 * 7168;
const REPLAYS: usize = 20;

/// A graph of bf16 all-reduces replayed on fresh data, each replay checked: over buffers
/// in a window, and over plain buffers staged through the communicator's window.
#[test]
#[ignore = "needs a GPU"]
// One index addresses the window's slots and both vectors of plain buffers.
#[allow(clippy::needless_range_loop)]
fn graphs_of_registered_and_staged_all_reduces_replay_correctly() {
    let _turn = conformance::ranks::gpu_turn();
    let (comm, memory) = single();
    let kernels = PatternKernels::load(memory.context()).unwrap();
    let stream = memory.stream().clone();
    let dtype = DType::BF16;
    let mut window = comm.alloc(2 * CALLS * COUNT * dtype.size()).unwrap();
    let mut plain_send: Vec<DeviceOwned> = (0..CALLS)
        .map(|_| memory.alloc(dtype, COUNT).unwrap())
        .collect();
    let mut plain_recv: Vec<DeviceOwned> = (0..CALLS)
        .map(|_| memory.alloc(dtype, COUNT).unwrap())
        .collect();
    let capture = |f: &mut dyn FnMut() -> Result<()>| {
        // Warm up outside the capture: NCCL's lazy setup must not be captured.
        f().unwrap();
        comm.synchronize(memory.raw_stream()).unwrap();
        stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(driver_error)
            .unwrap();
        let captured = f();
        let graph = stream
            .end_capture(CUgraphInstantiate_flags(0))
            .map_err(driver_error)
            .unwrap()
            .expect("a graph");
        captured.unwrap();
        graph
    };
    let send_at = |i: usize| i * COUNT;
    let recv_at = |i: usize| (CALLS + i) * COUNT;
    let registered = capture(&mut || {
        (0..CALLS).try_for_each(|i| {
            let base = window.device_ptr();
            // SAFETY: both ranges lie in the window, which outlives the graph's replays.
            let (s, r) = unsafe {
                (
                    comm_core::BufferRef::from_device_ptr(
                        base + (send_at(i) * 2) as u64,
                        COUNT,
                        dtype,
                        0,
                        memory.raw_stream(),
                    ),
                    BufferMut::from_device_ptr(
                        base + (recv_at(i) * 2) as u64,
                        COUNT,
                        dtype,
                        0,
                        memory.raw_stream(),
                    ),
                )
            };
            comm.all_reduce(s, r, ReduceOp::Sum)
        })
    });
    comm.set_algorithm(Some("symmetric")).unwrap();
    let staged = capture(&mut || {
        plain_send
            .iter()
            .zip(plain_recv.iter_mut())
            .try_for_each(|(s, r)| {
                comm.all_reduce(s.view(0, COUNT)?, r.view_mut(0, COUNT)?, ReduceOp::Sum)
            })
    });
    comm.set_algorithm(None).unwrap();
    let base = fresh_seed();
    let (mut bad_registered, mut bad_staged) = (0, 0);
    for replay in 0..REPLAYS {
        let seed = |i: usize| base ^ ((replay * CALLS + i) as u64).wrapping_mul(0x9E37_79B9);
        for i in 0..CALLS {
            kernels
                .fill(
                    window.view_mut(dtype, send_at(i), COUNT, &stream).unwrap(),
                    seed(i),
                    0,
                )
                .unwrap();
            poison(&mut window, &memory, dtype, recv_at(i), COUNT);
            kernels
                .fill(plain_send[i].view_mut(0, COUNT).unwrap(), !seed(i), 0)
                .unwrap();
            plain_recv[i].poison(0xff).unwrap();
        }
        registered.launch().map_err(driver_error).unwrap();
        staged.launch().map_err(driver_error).unwrap();
        comm.synchronize(memory.raw_stream()).unwrap();
        for i in 0..CALLS {
            let out = download(&window, &memory, dtype, recv_at(i), COUNT);
            bad_registered += wrong_on_host(dtype, ReduceOp::Sum, seed(i), 1, &out);
            let out = plain_recv[i].read().unwrap();
            bad_staged += wrong_on_host(dtype, ReduceOp::Sum, !seed(i), 1, &out);
        }
    }
    assert_eq!((bad_registered, bad_staged), (0, 0));
    drop((registered, staged));
    comm.synchronize(memory.raw_stream()).unwrap();
}

#[test]
#[ignore = "needs a GPU"]
fn calls_past_the_end_of_a_window_fail_clearly() {
    let _turn = conformance::ranks::gpu_turn();
    let (comm, memory) = single();
    let stream = memory.stream().clone();
    let mut buf = comm.alloc(4096).unwrap();
    let err = buf.view_mut(DType::F32, 512, 1024, &stream).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
    // A view made by hand that starts in the window and runs past its end.
    // SAFETY: never enqueued: the call is refused before NCCL sees it.
    let past = unsafe {
        BufferMut::from_device_ptr(
            buf.device_ptr() + 2048,
            1024,
            DType::F32,
            0,
            memory.raw_stream(),
        )
    };
    let err = comm.all_reduce_in_place(past, ReduceOp::Sum).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
    assert!(err.to_string().contains("past its end"), "{err}");
    // The communicator is still usable.
    comm.all_reduce_in_place(
        buf.view_mut(DType::F32, 0, 1024, &stream).unwrap(),
        ReduceOp::Sum,
    )
    .unwrap();
    comm.synchronize(memory.raw_stream()).unwrap();
    // Registration refuses nothing to register.
    assert!(comm.alloc(0).is_err());
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

#[test]
#[ignore = "needs a GPU"]
fn a_thousand_registrations_leave_device_memory_and_fds_flat() {
    let _turn = conformance::ranks::gpu_turn();
    let (comm, memory) = single();
    let stream = memory.stream().clone();
    let bytes = 1 << 20;
    let cycle = |call: bool| {
        let mut buf = comm.alloc(bytes).unwrap();
        if call {
            comm.all_reduce_in_place(
                buf.view_mut(DType::F32, 0, bytes / 4, &stream).unwrap(),
                ReduceOp::Sum,
            )
            .unwrap();
            comm.synchronize(memory.raw_stream()).unwrap();
        }
    };
    // NCCL sets up its symmetric runtime at the first registrations: count from after them.
    for i in 0..10 {
        cycle(i % 2 == 0);
    }
    memory.context().bind_to_thread().unwrap();
    let (free_before, _) = mem_get_info().unwrap();
    let fds_before = open_fds();
    let start = Instant::now();
    for i in 0..1000 {
        cycle(i % 100 == 0);
    }
    let per_cycle = start.elapsed() / 1000;
    memory.context().bind_to_thread().unwrap();
    let (free_after, _) = mem_get_info().unwrap();
    let fds_after = open_fds();
    eprintln!(
        "1000 x (ncclMemAlloc + register + deregister + ncclMemFree) of {bytes} B: {per_cycle:?} each; \
         free device memory {free_before} -> {free_after} B, fds {fds_before} -> {fds_after}"
    );
    assert!(
        free_after + (4 << 20) >= free_before,
        "device memory shrank by {} B",
        free_before - free_after
    );
    assert!(
        fds_after <= fds_before + 2,
        "fds {fds_before} -> {fds_after}"
    );
    assert_eq!(comm.windows(), 1);
    assert!(per_cycle < Duration::from_millis(100), "{per_cycle:?}");
}

/// Fails the test unless this machine has two GPUs.
fn require_two_gpus() {
    let found = comm_core::cuda::device_count().unwrap_or(0);
    assert!(found >= 2, "needs 2 GPUs, found {found}");
}

fn two_ranks<T: Send + 'static>(
    f: impl Fn(NcclComm, DeviceMemory) -> T + Send + Sync + 'static,
) -> Vec<T> {
    let f = Arc::new(f);
    let handles: Vec<_> = ThreadsBootstrap::with_timeout(2, Duration::from_secs(30))
        .into_iter()
        .map(|b| {
            let f = f.clone();
            std::thread::spawn(move || {
                let comm = NcclComm::from_bootstrap(Arc::new(b)).unwrap();
                assert_eq!(comm.symmetric_unavailable(), None);
                let memory = DeviceMemory::new(comm.context().ordinal()).unwrap();
                f(comm, memory)
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

#[test]
#[ignore = "needs 2 GPUs"]
fn two_gpus_conformance_over_the_staged_path() {
    let _turn = conformance::ranks::gpu_turn();
    require_two_gpus();
    for report in two_ranks(|comm, memory| {
        comm.set_algorithm(Some("symmetric")).unwrap();
        let config = Config {
            large_count: Some(1 << 20),
            ..Config::default()
        };
        conformance::run_with_memory(&comm, &memory, &config).map(|r| r.coverage_cases)
    }) {
        assert!(report.unwrap() > 50);
    }
}

#[test]
#[ignore = "needs 2 GPUs"]
fn two_gpus_registered_buffers_sum_and_a_buffer_registered_on_one_rank_only_is_refused() {
    let _turn = conformance::ranks::gpu_turn();
    require_two_gpus();
    let seed = fresh_seed();
    let results = two_ranks(move |comm, memory| {
        let kernels = PatternKernels::load(memory.context()).unwrap();
        let stream = memory.stream().clone();
        let (dtype, n) = (DType::BF16, COUNT);
        let rank = comm.rank() as u32;
        let mut buf = comm.alloc(n * dtype.size()).unwrap();
        kernels
            .fill(buf.view_mut(dtype, 0, n, &stream).unwrap(), seed, rank)
            .unwrap();
        comm.all_reduce_in_place(buf.view_mut(dtype, 0, n, &stream).unwrap(), ReduceOp::Sum)
            .unwrap();
        comm.synchronize(memory.raw_stream()).unwrap();
        let wrong = wrong_on_host(
            dtype,
            ReduceOp::Sum,
            seed,
            2,
            &download(&buf, &memory, dtype, 0, n),
        );
        // Rank 0 calls on its window, rank 1 on plain memory: refused on both.
        let mut plain = memory.alloc(dtype, n).unwrap();
        let refused = if rank == 0 {
            comm.all_reduce_in_place(buf.view_mut(dtype, 0, n, &stream).unwrap(), ReduceOp::Sum)
        } else {
            comm.all_reduce_in_place(plain.view_mut(0, n).unwrap(), ReduceOp::Sum)
        };
        // Other offsets on the two ranks: refused too.
        let offset = rank as usize;
        let shifted = comm.all_reduce_in_place(
            buf.view_mut(dtype, offset, n - 1, &stream).unwrap(),
            ReduceOp::Sum,
        );
        // Past the end on rank 1 only: every rank gets an error.
        let len = if rank == 1 { n + 1 } else { n };
        // SAFETY: refused before anything is enqueued (rank 1's range is checked first).
        let past = unsafe {
            BufferMut::from_device_ptr(
                buf.device_ptr(),
                len,
                dtype,
                comm.context().ordinal() as i32,
                memory.raw_stream(),
            )
        };
        let past = comm.all_reduce_in_place(past, ReduceOp::Sum);
        // Still usable.
        let after = comm.barrier();
        (wrong, refused, shifted, past, after)
    });
    for (rank, (wrong, refused, shifted, past, after)) in results.into_iter().enumerate() {
        assert_eq!(wrong, 0, "rank {rank}");
        assert!(
            matches!(refused, Err(Error::Mismatch(_))),
            "rank {rank}: {refused:?}"
        );
        assert!(
            matches!(shifted, Err(Error::Mismatch(_))),
            "rank {rank}: {shifted:?}"
        );
        assert!(past.is_err(), "rank {rank}: {past:?}");
        after.unwrap();
    }
}
