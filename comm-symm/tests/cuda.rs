//! In-process tests of the CUDA backing: joining an absent device fails with an error (no
//! panic, on every machine); on a GPU (`--include-ignored`) the conformance suite runs on
//! ranks that are threads of this process, spread over the GPUs: with a staging area of a
//! launch, with one so small that every call of every algorithm runs in several, and as an
//! all-reduce of 64 MiB; and on the host-mapped backing (GPUs without peer access; forced
//! here, so that it runs on any GPU): every algorithm's conformance, a CUDA graph replayed
//! on new data, waits for an absent rank that time out, and 100 joins and drops that give
//! every descriptor, mapping and byte of memory back. The multi-process checks are
//! `gpu-check --backend symm-cuda [--backing host]` (comm-examples).
#![cfg(feature = "cuda")]

use std::sync::Arc;
use std::time::Duration;

use comm_core::conformance;
use comm_core::cuda::cudarc::driver::sys;
use comm_core::cuda::{DeviceMemory, driver_error};
use comm_core::{Bootstrap, Communicator, DType, Error, ReduceOp, ThreadsBootstrap};
use comm_symm::cuda::{Algorithm, Backing, CudaSymmComm, CudaSymmConfig};

/// The default configuration with bounded waits and `max_bytes` of staging per launch.
fn config(max_bytes: usize) -> CudaSymmConfig {
    let mut c = CudaSymmConfig::default();
    c.peer.max_bytes = max_bytes;
    c.peer.timeout = Some(Duration::from_secs(20));
    c
}

/// Staging of the plain conformance runs.
const STAGING: usize = 1 << 20;
/// Staging so small that every collective of the suite runs as several launches: the
/// coverage cases (1001 elements) in 2 to 8, the random ones in up to hundreds, the large
/// all-reduce (1 MiB) in a thousand.
const CHUNKED_STAGING: usize = 1 << 10;

/// `f` on `n` ranks that are scoped threads of this process.
fn on_ranks<T: Send>(n: usize, f: impl Fn(Arc<dyn Bootstrap>) -> T + Sync) -> Vec<T> {
    std::thread::scope(|scope| {
        let f = &f;
        let handles: Vec<_> = ThreadsBootstrap::create(n)
            .into_iter()
            .map(|b| scope.spawn(move || f(Arc::new(b))))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("rank panicked"))
            .collect()
    })
}

/// Device 1000 exists nowhere, so this runs the clean-failure path on every machine.
#[test]
fn joining_an_absent_device_fails_on_every_rank() {
    for r in on_ranks(2, |b| CudaSymmComm::new(b, 1000, config(STAGING)).map(drop)) {
        match r {
            Err(Error::LibraryMissing { .. } | Error::NoDevice(_) | Error::Bootstrap(_)) => {}
            other => panic!("expected a clean failure, got {other:?}"),
        }
    }
}

/// The suite of the plain runs: small cases only.
fn small_suite() -> conformance::Config {
    conformance::Config {
        random_cases: 8,
        max_count: 1 << 12,
        large_count: None,
        ..conformance::Config::default()
    }
}

/// One rank thread per GPU (two virtual ranks sharing it on a machine with one GPU).
#[test]
#[ignore = "needs a GPU"]
fn conformance_on_in_process_ranks() {
    let _turn = comm_core::conformance::ranks::gpu_turn();
    let gpus = comm_core::cuda::device_count().expect("a GPU");
    conformance_on_threads(gpus.max(2), config(STAGING), &[None], &small_suite());
}

/// One rank thread more than there are GPUs, so that two ranks share a GPU in one process.
#[test]
#[ignore = "needs 2 GPUs"]
fn conformance_with_ranks_sharing_a_gpu() {
    let _turn = comm_core::conformance::ranks::gpu_turn();
    let gpus = comm_core::cuda::device_count().expect("a GPU");
    assert!(gpus >= 2, "needs 2 GPUs, found {gpus}");
    conformance_on_threads(gpus + 1, config(STAGING), &[None], &small_suite());
}

/// Every collective, every algorithm, cut into launches (see [`CHUNKED_STAGING`]).
#[test]
#[ignore = "needs a GPU"]
fn conformance_of_every_algorithm_in_chunks() {
    let _turn = comm_core::conformance::ranks::gpu_turn();
    let gpus = comm_core::cuda::device_count().expect("a GPU");
    let every = Algorithm::ALL.map(Some);
    let suite = conformance::Config {
        random_cases: 16,
        large_count: Some(1 << 18),
        ..conformance::Config::default()
    };
    conformance_on_threads(gpus.max(2), config(CHUNKED_STAGING), &every, &suite);
}

/// 64 MiB per rank with the default staging (eight launches of its 8 MiB), checked
/// against the reference like every case of the suite.
#[test]
#[ignore = "needs a GPU"]
fn all_reduce_of_64_mib_with_the_default_config() {
    let _turn = comm_core::conformance::ranks::gpu_turn();
    let gpus = comm_core::cuda::device_count().expect("a GPU");
    let default = CudaSymmConfig::default().peer.max_bytes;
    let suite = conformance::Config {
        random_cases: 0,
        // f32, the first dtype of the backend.
        large_count: Some((64 << 20) / 4),
        error_cases: false,
        ..conformance::Config::default()
    };
    conformance_on_threads(gpus.max(2), config(default), &[None], &suite);
}

/// Ranks are threads spread over the GPUs (rank `r` on GPU `r % gpus`); the suite runs
/// once per algorithm of `algorithms` (`None`: the automatic choice), each on a
/// communicator of its own: the suite's last error case (one rank rejecting its
/// arguments) leaves the communicator unusable, as kernels that find ranks disagreeing do.
fn conformance_on_threads(
    world: usize,
    config: CudaSymmConfig,
    algorithms: &[Option<Algorithm>],
    suite: &conformance::Config,
) {
    let gpus = comm_core::cuda::device_count().expect("a GPU");
    let results = on_ranks(world, |b| {
        let device = b.rank() % gpus;
        for &algorithm in algorithms {
            let mut config = config.clone();
            config.peer.algorithm = algorithm;
            let comm = CudaSymmComm::new(b.clone(), device, config.clone())?;
            let backing = config_backing(&config, &comm)?;
            let memory =
                DeviceMemory::with_stream(comm.context().new_stream().map_err(driver_error)?);
            let name = format!(
                "{} on {backing:?}",
                algorithm.map_or("auto", Algorithm::name)
            );
            let report = conformance::run_with_memory(&comm, &memory, suite)
                .map_err(|f| Error::Mismatch(format!("{name}: {f}")))
                // At once, not at the join: a rank that fails first says why the others wait.
                .inspect_err(|e| eprintln!("rank {}: {e}", comm.rank()))?;
            if suite.large_count.is_some() && !report.large_case {
                return Err(Error::Mismatch(format!(
                    "{name}: the large case did not run"
                )));
            }
        }
        Ok(())
    });
    for r in results {
        r.unwrap_or_else(|e| panic!("{world} ranks: {e}"));
    }
}

/// The backing `comm` got: the one `config` forced, or any where it left the choice.
fn config_backing(config: &CudaSymmConfig, comm: &CudaSymmComm) -> Result<Backing, Error> {
    match (config.backing, comm.backing()) {
        (Backing::Auto, got) => Ok(got),
        (wanted, got) if wanted == got => Ok(got),
        (wanted, got) => Err(Error::Mismatch(format!(
            "asked for the {wanted:?} backing, got {got:?}"
        ))),
    }
}

/// [`config`] on the host-mapped backing (forced: these GPUs may well have peer access).
fn host_config(max_bytes: usize) -> CudaSymmConfig {
    CudaSymmConfig {
        backing: Backing::HostMapped,
        ..config(max_bytes)
    }
}

/// Every collective of every algorithm through host memory, two in-process ranks (on two
/// GPUs where there are two), each algorithm on a communicator of its own; the large case
/// runs in three launches.
#[test]
#[ignore = "needs a GPU"]
fn host_mapped_conformance_of_every_algorithm() {
    let _turn = comm_core::conformance::ranks::gpu_turn();
    let suite = conformance::Config {
        large_count: Some(2 * (STAGING / 4) + 1),
        ..small_suite()
    };
    conformance_on_threads(2, host_config(STAGING), &Algorithm::ALL.map(Some), &suite);
}

/// `f32` elements as bytes.
fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// An all-reduce captured into a CUDA graph on the host-mapped backing and replayed three
/// times on new data: every replay's sum is exact (small integers in f32).
#[test]
#[ignore = "needs a GPU"]
fn host_mapped_all_reduce_replays_from_a_cuda_graph() {
    let _turn = comm_core::conformance::ranks::gpu_turn();
    let gpus = comm_core::cuda::device_count().expect("a GPU");
    let n = 21504usize;
    let input_of = |rank: usize, replay: usize| -> Vec<f32> {
        (0..n)
            .map(|i| ((i % 97) * (rank + 1) + replay) as f32)
            .collect()
    };
    let results = on_ranks(2, |b| -> Result<(), Error> {
        let rank = b.rank();
        let comm = CudaSymmComm::new(b.clone(), rank % gpus, host_config(STAGING))?;
        config_backing(&host_config(STAGING), &comm)?;
        let memory = DeviceMemory::with_stream(comm.context().new_stream().map_err(driver_error)?);
        let mut input = memory.alloc(DType::F32, n)?;
        input.write(&f32_bytes(&input_of(rank, 0)))?;
        let mut output = memory.alloc(DType::F32, n)?;
        let mut enqueue =
            || comm.all_reduce(input.view(0, n)?, output.view_mut(0, n)?, ReduceOp::Sum);
        // Outside capture first: kernels loaded, first touch done.
        enqueue()?;
        comm.synchronize(memory.raw_stream())?;
        let stream = memory.stream();
        stream
            .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(driver_error)?;
        let captured = enqueue();
        // The capture ends whatever the call did; the call's error explains best.
        let ended = stream.end_capture(sys::CUgraphInstantiate_flags(0));
        captured?;
        let graph = ended
            .map_err(driver_error)?
            .ok_or_else(|| Error::backend("cuda", "the capture recorded no graph"))?;
        for replay in 1..=3 {
            input.write(&f32_bytes(&input_of(rank, replay)))?;
            output.poison(0xff)?;
            graph.launch().map_err(driver_error)?;
            comm.synchronize(memory.raw_stream())?;
            let got = output.read()?;
            let want = f32_bytes(
                &(0..n)
                    .map(|i| ((i % 97) * 3 + 2 * replay) as f32)
                    .collect::<Vec<_>>(),
            );
            if got != want {
                return Err(Error::Mismatch(format!(
                    "rank {rank}, replay {replay}: the graph's all-reduce differs from the sum"
                )));
            }
        }
        Ok(())
    });
    for r in results {
        r.unwrap_or_else(|e| panic!("{e}"));
    }
}

/// Rank 1 joins but never calls: rank 0's kernel must give up within the bound (a flag
/// barrier for pull, Lamport polling for push, both over host memory), report
/// `Error::Timeout`, and refuse work afterwards.
#[test]
#[ignore = "needs a GPU"]
fn host_mapped_waits_for_an_absent_rank_time_out() {
    let _turn = comm_core::conformance::ranks::gpu_turn();
    let gpus = comm_core::cuda::device_count().expect("a GPU");
    let bound = Duration::from_secs(2);
    for algorithm in [Algorithm::OneshotPull, Algorithm::OneshotPush] {
        let results = on_ranks(2, |b| -> Result<(), Error> {
            let mut config = host_config(STAGING);
            config.peer.timeout = Some(bound);
            config.peer.algorithm = Some(algorithm);
            let comm = CudaSymmComm::new(b.clone(), b.rank() % gpus, config)?;
            let outcome = if b.rank() == 0 {
                time_out_alone(&comm, bound)
            } else {
                Ok(())
            };
            // The absent rank keeps its segment mapped until the other is done with it.
            b.barrier()?;
            outcome
        });
        for r in results {
            r.unwrap_or_else(|e| panic!("{algorithm}: {e}"));
        }
    }
}

/// One all-reduce that no peer joins: a timeout within `bound` (plus the host's margin),
/// then `Error::Aborted` for the next call.
fn time_out_alone(comm: &CudaSymmComm, bound: Duration) -> Result<(), Error> {
    let memory = DeviceMemory::with_stream(comm.context().new_stream().map_err(driver_error)?);
    let count = 4097;
    let mut buf = memory.alloc(DType::BF16, count)?;
    buf.write(&vec![0x3f; count * 2])?;
    let started = std::time::Instant::now();
    comm.all_reduce_in_place(buf.view_mut(0, count)?, ReduceOp::Sum)?;
    let waited = comm.synchronize(memory.raw_stream());
    let took = started.elapsed();
    match waited {
        Err(Error::Timeout { .. }) if took < bound + Duration::from_secs(10) => {}
        other => {
            return Err(Error::Mismatch(format!(
                "expected a timeout within {bound:?}, got {other:?} after {took:?}"
            )));
        }
    }
    match comm.all_reduce_in_place(buf.view_mut(0, count)?, ReduceOp::Sum) {
        Err(Error::Aborted(_)) => Ok(()),
        other => Err(Error::Mismatch(format!(
            "a timed-out communicator accepted work: {other:?}"
        ))),
    }
}

/// What a join holds while it lives, process-wide: descriptors, mappings of the heap's
/// memfd segments, host memory (pinned segments) and the free memory of the ranks' devices.
#[derive(Debug, Clone, PartialEq)]
struct Held {
    fds: usize,
    segment_maps: usize,
    available_mib: u64,
    device_free_mib: Vec<u64>,
}

impl Held {
    /// Measured now; `devices` are the ranks' devices (`0..devices`).
    fn now(devices: usize) -> Result<Self, Error> {
        let maps = std::fs::read_to_string("/proc/self/maps")?;
        let meminfo = std::fs::read_to_string("/proc/meminfo")?;
        let available_kib = meminfo
            .lines()
            .find_map(|l| l.strip_prefix("MemAvailable:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .ok_or_else(|| Error::Mismatch("no MemAvailable in /proc/meminfo".into()))?;
        let device_free_mib = (0..devices)
            .map(|d| {
                comm_core::cuda::context(d)?
                    .bind_to_thread()
                    .map_err(driver_error)?;
                let (free, _) = comm_core::cuda::cudarc::driver::result::mem_get_info()
                    .map_err(driver_error)?;
                Ok(free as u64 >> 20)
            })
            .collect::<Result<_, Error>>()?;
        Ok(Held {
            fds: std::fs::read_dir("/proc/self/fd")?.count(),
            segment_maps: maps
                .lines()
                .filter(|l| l.contains("memfd:comm-symm"))
                .count(),
            available_mib: available_kib >> 10,
            device_free_mib,
        })
    }

    /// What grew from `before` to `self` beyond noise: a leak.
    fn grown_from(&self, before: &Held) -> Option<String> {
        let device = before
            .device_free_mib
            .iter()
            .zip(&self.device_free_mib)
            .any(|(b, a)| b.saturating_sub(*a) > 64);
        // Each join pins two segments of about 24 MiB: 100 leaked joins would hold GiBs.
        let host = before.available_mib.saturating_sub(self.available_mib) > 1024;
        (self.fds > before.fds || self.segment_maps > before.segment_maps || host || device)
            .then(|| format!("{before:?} -> {self:?}"))
    }
}

/// 100 joins and drops of a host-mapped communicator on two in-process ranks (after 5 to
/// warm up): descriptors, segment mappings, host memory and device memory end where they
/// started.
#[test]
#[ignore = "needs a GPU"]
fn host_mapped_joins_and_drops_give_everything_back() {
    let _turn = comm_core::conformance::ranks::gpu_turn();
    const CYCLES: usize = 100;
    let gpus = comm_core::cuda::device_count().expect("a GPU");
    let results = on_ranks(2, |b| -> Result<Option<String>, Error> {
        let join_and_drop = || -> Result<(), Error> {
            let config = host_config(4 << 20);
            let comm = CudaSymmComm::new(b.clone(), b.rank() % gpus, config.clone())?;
            config_backing(&config, &comm)?;
            // Dropping is collective: every rank arrives before a segment goes.
            drop(comm);
            Ok(())
        };
        for _ in 0..5 {
            join_and_drop()?;
        }
        // Rank 0 measures the process while rank 1 waits.
        let measure = || -> Result<Option<Held>, Error> {
            b.barrier()?;
            let held = (b.rank() == 0)
                .then(|| Held::now(gpus.min(2)))
                .transpose()?;
            b.barrier()?;
            Ok(held)
        };
        let before = measure()?;
        for _ in 0..CYCLES {
            join_and_drop()?;
        }
        let after = measure()?;
        Ok(before
            .zip(after)
            .and_then(|(before, after)| after.grown_from(&before)))
    });
    for r in results {
        if let Some(grown) = r.unwrap_or_else(|e| panic!("{e}")) {
            panic!("{CYCLES} joins and drops leaked: {grown}");
        }
    }
}
