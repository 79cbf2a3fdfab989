//! Where there is no GPU (or no libnccl), joining fails on every rank with a clear error:
//! no panic, no hang. On a GPU machine this test has nothing to prove and says so.

use comm_core::cuda::device_count;
use comm_core::{Error, ThreadsBootstrap};
use comm_nccl::{NcclComm, require_nccl};

#[test]
fn joining_without_a_gpu_fails_on_every_rank() {
    if device_count().is_ok() && require_nccl().is_ok() {
        eprintln!("skipped: this machine has a GPU and libnccl (tests/gpu.rs covers it)");
        return;
    }
    let handles: Vec<_> = ThreadsBootstrap::create(3)
        .into_iter()
        .map(|b| std::thread::spawn(move || NcclComm::from_bootstrap(&b).map(|_| ())))
        .collect();
    for (rank, h) in handles.into_iter().enumerate() {
        let err = h.join().expect("no panic").unwrap_err();
        assert!(
            matches!(
                err,
                Error::LibraryMissing { .. } | Error::NoDevice(_) | Error::Bootstrap(_)
            ),
            "rank {rank}: {err}"
        );
    }
}
