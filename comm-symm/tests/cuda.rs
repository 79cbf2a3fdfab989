//! In-process tests of the CUDA backing: joining an absent device fails with an error (no
//! panic, on every machine); on a GPU (`--include-ignored`) the conformance suite runs on
//! ranks that are threads of this process, spread over the GPUs: with a staging area of a
//! launch, with one so small that every call of every algorithm runs in several, and as an
//! all-reduce of 64 MiB. The multi-process checks
//! are `gpu-check --backend symm-cuda` (comm-examples).
#![cfg(feature = "cuda")]

use std::sync::Arc;
use std::time::Duration;

use comm_core::conformance;
use comm_core::cuda::DeviceMemory;
use comm_core::{Bootstrap, Communicator, Error, ThreadsBootstrap};
use comm_symm::cuda::{Algorithm, CudaSymmComm, CudaSymmConfig};

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
    let gpus = comm_core::cuda::device_count().expect("a GPU");
    conformance_on_threads(gpus.max(2), config(STAGING), &[None], &small_suite());
}

/// One rank thread more than there are GPUs, so that two ranks share a GPU in one process.
#[test]
#[ignore = "needs 2 GPUs"]
fn conformance_with_ranks_sharing_a_gpu() {
    let gpus = comm_core::cuda::device_count().expect("a GPU");
    assert!(gpus >= 2, "needs 2 GPUs, found {gpus}");
    conformance_on_threads(gpus + 1, config(STAGING), &[None], &small_suite());
}

/// Every collective, every algorithm, cut into launches (see [`CHUNKED_STAGING`]).
#[test]
#[ignore = "needs a GPU"]
fn conformance_of_every_algorithm_in_chunks() {
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
            let comm = CudaSymmComm::new(b.clone(), device, config)?;
            let memory = DeviceMemory::with_stream(
                comm.context()
                    .new_stream()
                    .map_err(comm_core::cuda::driver_error)?,
            );
            let name = algorithm.map_or("auto", Algorithm::name);
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
