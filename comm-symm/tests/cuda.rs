//! In-process tests of the CUDA backing: without a GPU, joining fails with an error (no
//! panic); with one (`--include-ignored`), the conformance suite and the fused op run on
//! two virtual ranks of device 0. The multi-process checks are `gpu-check --backend symm-cuda` (comm-examples).
#![cfg(feature = "cuda")]

use std::sync::Arc;
use std::time::Duration;

use comm_core::conformance;
use comm_core::cuda::DeviceMemory;
use comm_core::{Bootstrap, Error, ThreadsBootstrap};
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

#[test]
fn without_a_gpu_joining_fails_cleanly() {
    if comm_core::cuda::device_count().is_ok() {
        return; // a GPU is present: the ignored tests cover it
    }
    for r in on_ranks(2, |b| CudaSymmComm::new(b, 0, config()).map(drop)) {
        match r {
            Err(Error::LibraryMissing { .. } | Error::NoDevice(_) | Error::Bootstrap(_)) => {}
            other => panic!("expected a clean failure, got {other:?}"),
        }
    }
}

// On the H200 (2026-11-29) this in-process run did not finish within 100 s, while the
// same suite passes in separate processes (`symm_check` under mpirun -np 2/4/8) and the
// 8-virtual-rank bench runs with validation off. Suspected: a synchronous copy of one rank
// thread waiting behind the other rank's spinning kernel in the shared context (legacy
// default-stream semantics). Kept ignored until that is fixed and re-run.
#[test]
#[ignore = "needs a GPU; hangs in-process with 2 virtual ranks on one GPU (see comment)"]
fn conformance_on_two_virtual_ranks() {
    for r in on_ranks(2, |b| {
        let comm = CudaSymmComm::new(b, 0, config())?;
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
    }) {
        r.expect("conformance");
    }
}
