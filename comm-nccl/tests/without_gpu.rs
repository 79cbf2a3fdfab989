//! Joining fails on every rank with a clear error, with no panic and no hang, where the
//! device cannot be used: no driver, no GPU, no libnccl, or (on every machine) a device
//! ordinal that does not exist.

use std::sync::Arc;

use comm_core::{Error, ThreadsBootstrap};
use comm_nccl::NcclComm;

#[test]
fn joining_an_absent_device_fails_on_every_rank() {
    let handles: Vec<_> = ThreadsBootstrap::create(3)
        .into_iter()
        .map(|b| std::thread::spawn(move || NcclComm::new(Arc::new(b), 1000).map(|_| ())))
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
