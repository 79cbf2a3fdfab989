//! Groups of in-process ranks for tests: every rank a thread, meeting through threads
//! ([`on_threads`]) or through the TCP store on loopback ([`on_loopback`]), as real
//! processes would.

use std::net::TcpListener;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use crate::bootstrap::{EnvBootstrap, LaunchInfo, ThreadsBootstrap};

/// This process's turn on its GPUs, until the guard drops: a GPU test takes it first, so
/// that the tests of one binary, which the test harness runs on parallel threads, run one
/// after another. Ranks of two tests spinning on one GPU at once can keep each other's
/// kernels from being scheduled, and time out. (Test runners that start a process per test
/// serialize through their own configuration: `.config/nextest.toml`.)
pub fn gpu_turn() -> MutexGuard<'static, ()> {
    static GPU: Mutex<()> = Mutex::new(());
    // A test that panicked holding the turn has finished with the GPU all the same.
    GPU.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Runs `body` on `n` threads, each with its rank of a [`ThreadsBootstrap`] group whose
/// waits give up after `timeout`; returns the results by rank. A panicking rank panics here.
pub fn on_threads<T: Send + 'static>(
    n: usize,
    timeout: Duration,
    body: impl Fn(ThreadsBootstrap) -> T + Send + Sync + Clone + 'static,
) -> Vec<T> {
    let handles: Vec<_> = ThreadsBootstrap::with_timeout(n, timeout)
        .into_iter()
        .map(|boot| {
            let body = body.clone();
            std::thread::spawn(move || body(boot))
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().expect("rank panicked"))
        .collect()
}

/// Runs `body` on `n` threads, each with its rank of an [`EnvBootstrap`] group on a fresh
/// loopback port (rank 0 serves the store); returns the results by rank.
pub fn on_loopback<T: Send + 'static>(
    n: usize,
    timeout: Duration,
    body: impl Fn(EnvBootstrap) -> T + Send + Sync + Clone + 'static,
) -> Vec<T> {
    let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback port");
    let addr = listener.local_addr().expect("its address");
    let mut listener = Some(listener);
    let handles: Vec<_> = (0..n)
        .map(|rank| {
            let body = body.clone();
            let listener = if rank == 0 { listener.take() } else { None };
            std::thread::spawn(move || {
                let info = LaunchInfo {
                    rank,
                    world_size: n,
                    local_rank: rank,
                    local_world_size: n,
                    launcher: "test",
                };
                let boot = match listener {
                    Some(l) => EnvBootstrap::with_listener(l, info, timeout),
                    None => EnvBootstrap::connect(info, addr, timeout),
                };
                body(boot.expect("joining the loopback store"))
            })
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().expect("rank panicked"))
        .collect()
}
