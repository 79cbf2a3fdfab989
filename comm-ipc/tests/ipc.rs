//! `IpcComm` with in-process ranks (threads bootstrap, one device): the clean-failure
//! path runs everywhere; the conformance suite per algorithm needs a GPU (`--include-ignored`
//! on a machine with one). The multi-process checks are `gpu-check --backend ipc` (comm-examples) under mpirun.

use std::sync::Arc;
use std::time::Duration;

use comm_core::conformance::{self, Config};
use comm_core::cuda::DeviceMemory;
use comm_core::{Bootstrap, Communicator, Error, ThreadsBootstrap};
use comm_ipc::{Algorithm, IpcComm, IpcConfig};

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
    let gpus = comm_core::cuda::device_count().expect("a GPU");
    conformance_of_every_algorithm(gpus.max(2));
}

/// One rank thread more than there are GPUs, so that two ranks share a GPU in one process
/// while the others drive their own.
#[test]
#[ignore = "needs 2 GPUs"]
fn conformance_of_every_algorithm_with_ranks_sharing_a_gpu() {
    let gpus = comm_core::cuda::device_count().expect("a GPU");
    assert!(gpus >= 2, "needs 2 GPUs, found {gpus}");
    conformance_of_every_algorithm(gpus + 1);
}

/// Ranks are threads spread over the GPUs (rank `r` on GPU `r % gpus`).
fn conformance_of_every_algorithm(world: usize) {
    let gpus = comm_core::cuda::device_count().expect("a GPU");
    for algo in Algorithm::ALL {
        let reports = on_threads(world, move |b| {
            let config = IpcConfig {
                max_bytes: 1 << 20,
                algorithm: Some(algo),
                ..IpcConfig::default()
            };
            let device = b.rank() % gpus;
            let comm = IpcComm::new(b, device, config)?;
            let memory = DeviceMemory::new(device)?;
            let suite = Config {
                random_cases: 16,
                large_count: Some(1 << 18),
                ..Config::default()
            };
            conformance::run_with_memory(&comm, &memory, &suite)
                .map_err(|f| Error::Mismatch(f.to_string()))
                // At once, not at the join: a rank that fails first says why the others wait.
                .inspect_err(|e| eprintln!("{algo}, world {world}, rank {}: {e}", comm.rank()))
        });
        for r in reports {
            r.unwrap_or_else(|e| panic!("{algo} on {world} ranks: {e}"));
        }
    }
}

#[test]
#[ignore = "needs a GPU"]
fn disagreeing_ranks_get_a_mismatch_and_never_stale_data() {
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
