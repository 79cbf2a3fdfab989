//! `IpcComm` with in-process ranks (threads bootstrap, one device): the clean-failure
//! path runs everywhere; the conformance suite per algorithm (with a staging area of a
//! launch, and with one so small that every call runs in several) and an all-reduce of
//! 64 MiB need a GPU (`--include-ignored` on a machine with one). The multi-process checks are `gpu-check --backend ipc` (comm-examples) under mpirun.

use std::sync::Arc;
use std::time::Duration;

use comm_core::conformance::{self, Config, Report};
use comm_core::cuda::DeviceMemory;
use comm_core::{Bootstrap, Communicator, Error, ThreadsBootstrap};
use comm_ipc::{Algorithm, IpcComm, IpcConfig};

/// Staging of the plain conformance runs: the suite's large all-reduce fits one launch.
const STAGING: usize = 1 << 20;
/// Staging so small that every collective of the suite runs as several launches: the
/// coverage cases (1001 elements) in 2 to 8, the random ones in up to hundreds, the large
/// all-reduce (1 MiB) in a thousand.
const CHUNKED_STAGING: usize = 1 << 10;

fn on_threads<R: Send + 'static>(
    world: usize,
    body: impl Fn(Arc<ThreadsBootstrap>) -> R + Send + Sync + 'static,
) -> Vec<R> {
    let body = Arc::new(body);
    let handles: Vec<_> = ThreadsBootstrap::with_timeout(world, Duration::from_secs(60))
        .into_iter()
        .map(|b| {
            let body = body.clone();
            std::thread::spawn(move || body(Arc::new(b)))
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

/// Device 1000 exists nowhere, so this runs the clean-failure path on every machine: no
/// driver, no GPU, or no such device all fail every rank with an error, never a panic or
/// a hang.
#[test]
fn joining_an_absent_device_fails_on_every_rank() {
    for result in on_threads(2, |b| IpcComm::new(b, 1000, IpcConfig::default()).map(drop)) {
        let err = result.unwrap_err();
        assert!(
            matches!(
                err,
                Error::Bootstrap(_) | Error::LibraryMissing { .. } | Error::NoDevice(_)
            ),
            "{err}"
        );
    }
}

/// One rank thread per GPU (two virtual ranks sharing it on a machine with one GPU).
#[test]
#[ignore = "needs a GPU"]
fn conformance_of_every_algorithm_on_in_process_ranks() {
    let _turn = comm_core::conformance::ranks::gpu_turn();
    let gpus = comm_core::cuda::device_count().expect("a GPU");
    conformance_of_every_algorithm(gpus.max(2), STAGING);
}

/// Every collective, every algorithm, cut into launches (see [`CHUNKED_STAGING`]).
#[test]
#[ignore = "needs a GPU"]
fn conformance_of_every_algorithm_in_chunks() {
    let _turn = comm_core::conformance::ranks::gpu_turn();
    let gpus = comm_core::cuda::device_count().expect("a GPU");
    conformance_of_every_algorithm(gpus.max(2), CHUNKED_STAGING);
}

/// 64 MiB per rank with the default configuration (eight launches of its 8 MiB), checked
/// against the reference like every case of the suite.
#[test]
#[ignore = "needs a GPU"]
fn all_reduce_of_64_mib_with_the_default_config() {
    let _turn = comm_core::conformance::ranks::gpu_turn();
    let gpus = comm_core::cuda::device_count().expect("a GPU");
    let reports = on_threads(gpus.max(2), move |b| {
        let device = b.rank() % gpus;
        let comm = IpcComm::new(b, device, IpcConfig::default())?;
        let suite = Config {
            random_cases: 0,
            // f32, the first dtype of the backend.
            large_count: Some((64 << 20) / 4),
            error_cases: false,
            ..Config::default()
        };
        run_suite(&comm, device, &suite)
    });
    for r in reports {
        let report = r.unwrap_or_else(|e| panic!("{e}"));
        assert!(report.large_case, "the 64 MiB all-reduce did not run");
    }
}

/// A kernel from the cache is loaded completely, not left for its first launch to finish
/// loading (which, under lazy loading, may wait for the whole context: behind a peer's
/// kernel that waits for this rank, on a device two ranks share).
#[test]
#[ignore = "needs a GPU"]
fn kernels_from_the_cache_are_loaded_before_their_first_launch() {
    let _turn = comm_core::conformance::ranks::gpu_turn();
    use comm_core::cuda::cudarc::driver::sys;
    use comm_core::cuda::{KernelCache, kernels::FILL_CHECK};
    let ctx = comm_core::cuda::context(0).expect("device 0");
    for (source, name) in [
        (&comm_peer::kernels::COLLECTIVES, "peer_all_gather"),
        (&FILL_CHECK, "comm_fill_f32"),
    ] {
        let function = KernelCache::global()
            .function(&ctx, source, name)
            .expect("kernel");
        let mut state = sys::CUfunctionLoadingState::CU_FUNCTION_LOADING_STATE_MAX;
        // SAFETY: a valid function handle and out-pointer.
        unsafe { sys::cuFuncIsLoaded(&mut state, function.cu_function()) }
            .result()
            .expect("cuFuncIsLoaded");
        assert_eq!(
            state,
            sys::CUfunctionLoadingState::CU_FUNCTION_LOADING_STATE_LOADED,
            "{name}"
        );
    }
}

/// One rank thread more than there are GPUs, so that two ranks share a GPU in one process
/// while the others drive their own.
#[test]
#[ignore = "needs 2 GPUs"]
fn conformance_of_every_algorithm_with_ranks_sharing_a_gpu() {
    let _turn = comm_core::conformance::ranks::gpu_turn();
    let gpus = comm_core::cuda::device_count().expect("a GPU");
    assert!(gpus >= 2, "needs 2 GPUs, found {gpus}");
    conformance_of_every_algorithm(gpus + 1, STAGING);
}

/// Ranks are threads spread over the GPUs (rank `r` on GPU `r % gpus`), staging
/// `max_bytes` per launch.
fn conformance_of_every_algorithm(world: usize, max_bytes: usize) {
    let gpus = comm_core::cuda::device_count().expect("a GPU");
    for algo in Algorithm::ALL {
        let reports = on_threads(world, move |b| {
            let config = IpcConfig {
                max_bytes,
                algorithm: Some(algo),
                ..IpcConfig::default()
            };
            let device = b.rank() % gpus;
            let comm = IpcComm::new(b, device, config)?;
            let suite = Config {
                random_cases: 16,
                large_count: Some(1 << 18),
                ..Config::default()
            };
            run_suite(&comm, device, &suite)
                // At once, not at the join: a rank that fails first says why the others wait.
                .inspect_err(|e| eprintln!("{algo}, world {world}, rank {}: {e}", comm.rank()))
        });
        for r in reports {
            let report = r.unwrap_or_else(|e| panic!("{algo} on {world} ranks: {e}"));
            assert!(
                report.large_case,
                "{algo}: the large all-reduce did not run"
            );
        }
    }
}

/// The suite on buffers of `device`, its failure as an error.
fn run_suite(comm: &IpcComm, device: usize, suite: &Config) -> Result<Report, Error> {
    let memory = DeviceMemory::new(device)?;
    conformance::run_with_memory(comm, &memory, suite).map_err(|f| Error::Mismatch(f.to_string()))
}

#[test]
#[ignore = "needs a GPU"]
fn disagreeing_ranks_get_a_mismatch_and_never_stale_data() {
    let _turn = comm_core::conformance::ranks::gpu_turn();
    use comm_core::conformance::{After, Disagreement};
    let timeout = Duration::from_secs(2);
    for algo in Algorithm::ALL {
        for kind in Disagreement::ALL {
            let results = on_threads(2, move |b| {
                let config = IpcConfig {
                    max_bytes: 2 << 20,
                    algorithm: Some(algo),
                    timeout: Some(timeout),
                    ..IpcConfig::default()
                };
                let comm = IpcComm::new(b, 0, config).expect("ipc on device 0");
                let memory = DeviceMemory::new(0).expect("device 0");
                conformance::check_disagreement(&comm, &memory, kind, timeout * 4)
            });
            let after = conformance::same_everywhere(results)
                .unwrap_or_else(|e| panic!("{algo} {kind:?}: {e}"));
            assert_ne!(after, After::Skipped, "{algo} {kind:?}");
        }
    }
}
