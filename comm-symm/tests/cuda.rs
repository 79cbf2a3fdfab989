//! In-process tests of the CUDA backing: joining an absent device fails with an error (no
//! panic, on every machine); on a GPU (`--include-ignored`) the conformance suite runs on
//! ranks that are threads of this process, spread over the GPUs. The multi-process checks
//! are `gpu-check --backend symm-cuda` (comm-examples).
#![cfg(feature = "cuda")]

use std::sync::Arc;
use std::time::Duration;

use comm_core::conformance;
use comm_core::cuda::DeviceMemory;
use comm_core::{Bootstrap, Communicator, Error, ThreadsBootstrap};
use comm_symm::cuda::{CudaSymmComm, CudaSymmConfig};

fn config() -> CudaSymmConfig {
    let mut c = CudaSymmConfig::default();
    c.peer.max_bytes = 1 << 20;
    c.peer.timeout = Some(Duration::from_secs(20));
    c
}

fn on_ranks<T: Send + 'static>(n: usize, f: fn(Arc<dyn Bootstrap>) -> T) -> Vec<T> {
    let handles: Vec<_> = ThreadsBootstrap::create(n)
        .into_iter()
        .map(|b| std::thread::spawn(move || f(Arc::new(b))))
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().expect("rank panicked"))
        .collect()
}

/// Device 1000 exists nowhere, so this runs the clean-failure path on every machine.
#[test]
fn joining_an_absent_device_fails_on_every_rank() {
    for r in on_ranks(2, |b| CudaSymmComm::new(b, 1000, config()).map(drop)) {
        match r {
            Err(Error::LibraryMissing { .. } | Error::NoDevice(_) | Error::Bootstrap(_)) => {}
            other => panic!("expected a clean failure, got {other:?}"),
        }
    }
}

/// One rank thread per GPU (two virtual ranks sharing it on a machine with one GPU).
#[test]
#[ignore = "needs a GPU"]
fn conformance_on_in_process_ranks() {
    let gpus = comm_core::cuda::device_count().expect("a GPU");
    conformance_on_threads(gpus.max(2));
}

/// One rank thread more than there are GPUs, so that two ranks share a GPU in one process.
#[test]
#[ignore = "needs 2 GPUs"]
fn conformance_with_ranks_sharing_a_gpu() {
    let gpus = comm_core::cuda::device_count().expect("a GPU");
    assert!(gpus >= 2, "needs 2 GPUs, found {gpus}");
    conformance_on_threads(gpus + 1);
}

/// Ranks are threads spread over the GPUs (rank `r` on GPU `r % gpus`).
fn conformance_on_threads(world: usize) {
    for r in on_ranks(world, |b| {
        let device = b.rank() % comm_core::cuda::device_count()?;
        let comm = CudaSymmComm::new(b, device, config())?;
        let memory = DeviceMemory::with_stream(
            comm.context()
                .new_stream()
                .map_err(comm_core::cuda::driver_error)?,
        );
        let cfg = conformance::Config {
            random_cases: 8,
            max_count: 1 << 12,
            large_count: None,
            ..conformance::Config::default()
        };
        conformance::run_with_memory(&comm, &memory, &cfg)
            .map(drop)
            .map_err(|f| Error::Mismatch(f.to_string()))
            // At once, not at the join: a rank that fails first says why the others wait.
            .inspect_err(|e| eprintln!("rank {}: {e}", comm.rank()))
    }) {
        r.unwrap_or_else(|e| panic!("{world} ranks: {e}"));
    }
}
