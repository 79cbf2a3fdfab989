//! The TCP store with its ranks as threads of this process, on loopback.

use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::*;

pub(super) fn info(rank: usize, world_size: usize) -> LaunchInfo {
    LaunchInfo {
        rank,
        world_size,
        local_rank: rank,
        local_world_size: world_size,
        launcher: "test",
    }
}

/// Runs `body` on every rank of a loopback job of `n` ranks, rank 0 on an ephemeral port.
pub(crate) fn run_group<T: Send + 'static>(
    n: usize,
    timeout: Duration,
    body: impl Fn(Result<EnvBootstrap>) -> T + Send + Sync + Clone + 'static,
) -> Vec<T> {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let mut listener = Some(listener);
    let handles: Vec<JoinHandle<T>> = (0..n)
        .map(|rank| {
            let body = body.clone();
            let listener = if rank == 0 { listener.take() } else { None };
            std::thread::spawn(move || {
                let boot = match listener {
                    Some(l) => EnvBootstrap::with_listener(l, info(0, n), timeout),
                    None => EnvBootstrap::connect(info(rank, n), addr, timeout),
                };
                body(boot)
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

#[test]
fn gathers_broadcasts_and_barriers_with_variable_lengths() {
    run_group(4, Duration::from_secs(20), |boot| {
        let boot = boot.unwrap();
        let me = boot.rank();
        for round in 0..100usize {
            let mine = vec![(me + round) as u8; (me * 7 + round) % 13];
            let all = boot.all_gather_bytes(&mine).unwrap();
            assert_eq!(all.len(), 4);
            for (r, d) in all.iter().enumerate() {
                assert_eq!(d, &vec![(r + round) as u8; (r * 7 + round) % 13]);
            }
            let root = round % 4;
            let got = boot
                .broadcast_bytes(format!("from {me} in {round}").as_bytes(), root)
                .unwrap();
            assert_eq!(got, format!("from {root} in {round}").as_bytes());
            boot.barrier().unwrap();
        }
        // A payload larger than one socket buffer, and an empty one.
        let big = vec![me as u8; 3 << 20];
        let all = boot.all_gather_bytes(&big).unwrap();
        for (r, d) in all.iter().enumerate() {
            assert!(d.len() == 3 << 20 && d.iter().all(|&b| b == r as u8));
        }
        assert_eq!(
            boot.all_gather_bytes(&[]).unwrap(),
            vec![Vec::<u8>::new(); 4]
        );
        assert!(matches!(
            boot.broadcast_bytes(b"x", 4),
            Err(Error::InvalidArgument(_))
        ));
        boot.barrier().unwrap();
    });
}

#[test]
fn a_job_of_one_needs_no_network() {
    let boot = EnvBootstrap::connect(
        info(0, 1),
        "127.0.0.1:1".parse().unwrap(),
        Duration::from_secs(1),
    )
    .unwrap();
    assert_eq!(boot.all_gather_bytes(b"me").unwrap(), vec![b"me".to_vec()]);
    assert_eq!(boot.broadcast_bytes(b"me", 0).unwrap(), b"me");
    boot.barrier().unwrap();
}

#[test]
fn thousands_of_small_rounds_per_second() {
    let rates = run_group(4, Duration::from_secs(20), |boot| {
        let boot = boot.unwrap();
        let start = Instant::now();
        let rounds = 2000;
        for _ in 0..rounds {
            boot.all_gather_bytes(&[boot.rank() as u8; 16]).unwrap();
        }
        rounds as f64 / start.elapsed().as_secs_f64()
    });
    eprintln!("small all_gather_bytes rounds per second, 4 ranks: {rates:.0?}");
    // Loose on purpose (shared CI machines); a Nagle stall would give ~25 per second.
    assert!(rates.iter().all(|&r| r > 500.0), "{rates:?} rounds/s");
}

#[test]
fn a_rank_that_never_connects_is_a_timeout_within_the_bound() {
    let bound = Duration::from_millis(400);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let start = Instant::now();
    // Rank 2 of 3 never shows up.
    let one = std::thread::spawn(move || EnvBootstrap::connect(info(1, 3), addr, bound).map(drop));
    let zero = EnvBootstrap::with_listener(listener, info(0, 3), bound).map(drop);
    let one = one.join().unwrap();
    let elapsed = start.elapsed();
    assert!(elapsed < bound + Duration::from_secs(2), "{elapsed:?}");
    assert!(
        matches!(&zero, Err(Error::Timeout { what, .. }) if what.contains("rank(s) 2")),
        "{zero:?}"
    );
    // Rank 1 had connected; it times out as well (or hears so from rank 0).
    assert!(matches!(&one, Err(Error::Timeout { .. })), "{one:?}");
}

#[test]
fn connecting_before_rank_0_listens_is_retried() {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let late_root = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        let boot = EnvBootstrap::connect(info(0, 2), addr, Duration::from_secs(10)).unwrap();
        boot.broadcast_bytes(b"late", 0).unwrap()
    });
    let boot = EnvBootstrap::connect(info(1, 2), addr, Duration::from_secs(10)).unwrap();
    assert_eq!(boot.broadcast_bytes(&[], 0).unwrap(), b"late");
    assert_eq!(late_root.join().unwrap(), b"late");
}

#[test]
fn nobody_listening_is_a_timeout() {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let start = Instant::now();
    let err = EnvBootstrap::connect(info(1, 2), addr, Duration::from_millis(300)).unwrap_err();
    assert!(
        matches!(&err, Error::Timeout { what, .. } if what.contains("store")),
        "{err}"
    );
    assert!(start.elapsed() < Duration::from_secs(3));
}

#[test]
fn a_rank_that_skips_a_call_times_everyone_out_then_the_store_is_aborted() {
    let bound = Duration::from_millis(300);
    let results = run_group(3, bound, move |boot| {
        let boot = boot.unwrap();
        boot.barrier().unwrap();
        let skipped = if boot.rank() == 2 {
            None
        } else {
            Some(boot.all_gather_bytes(b"x"))
        };
        // Let rank 2 outlive the others' timeout, so its connection is still open.
        std::thread::sleep(bound * 3);
        let later = boot.barrier();
        (skipped, later)
    });
    for (rank, (skipped, later)) in results.iter().enumerate().take(2) {
        assert!(
            matches!(skipped, Some(Err(Error::Timeout { .. }))),
            "rank {rank}: {skipped:?}"
        );
        assert!(
            matches!(later, Err(Error::Aborted(_))),
            "rank {rank}: {later:?}"
        );
    }
    // Rank 2 learns at its next call that the store is gone.
    assert!(results[2].1.is_err(), "{:?}", results[2].1);
}

#[test]
fn ranks_making_different_calls_all_get_a_mismatch() {
    let results = run_group(3, Duration::from_secs(10), |boot| {
        let boot = boot.unwrap();
        if boot.rank() == 1 {
            boot.broadcast_bytes(b"", 0).map(drop)
        } else {
            boot.all_gather_bytes(b"").map(drop)
        }
    });
    for (rank, r) in results.iter().enumerate() {
        assert!(
            matches!(r, Err(Error::Mismatch(m)) if m.contains("rank 1 called broadcast_bytes")),
            "rank {rank}: {r:?}"
        );
    }
}

#[test]
fn stray_and_foreign_connections_are_refused_without_harm() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let root = std::thread::spawn(move || {
        let boot =
            EnvBootstrap::with_listener(listener, info(0, 2), Duration::from_secs(10)).unwrap();
        boot.all_gather_bytes(b"zero").unwrap()
    });
    // Garbage, then a rank of another job (different key), then a wrong world size.
    let mut junk = TcpStream::connect(addr).unwrap();
    junk.write_all(b"GET / HTTP/1.0\r\n\r\n-------------")
        .unwrap();
    let foreign = StoreConfig {
        addr,
        job_key: 42,
        port_source: "test".into(),
    };
    let err = EnvBootstrap::dial(info(1, 2), &foreign, Duration::from_secs(5)).unwrap_err();
    assert!(
        matches!(&err, Error::Bootstrap(m) if m.contains("another job")),
        "{err}"
    );
    let err = EnvBootstrap::connect(info(1, 3), addr, Duration::from_secs(5)).unwrap_err();
    assert!(
        matches!(&err, Error::Bootstrap(m) if m.contains("3 ranks")),
        "{err}"
    );
    let boot = EnvBootstrap::connect(info(1, 2), addr, Duration::from_secs(5)).unwrap();
    let all = boot.all_gather_bytes(b"one").unwrap();
    assert_eq!(all, vec![b"zero".to_vec(), b"one".to_vec()]);
    assert_eq!(root.join().unwrap(), all);
}

#[test]
fn a_peer_that_exits_fails_the_others_promptly() {
    let bound = Duration::from_secs(30);
    let start = Instant::now();
    let results = run_group(3, bound, |boot| {
        let boot = boot.unwrap();
        boot.barrier().unwrap();
        if boot.rank() == 1 {
            drop(boot);
            return Ok(());
        }
        boot.barrier()
    });
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "{:?}",
        start.elapsed()
    );
    assert!(
        matches!(&results[0], Err(Error::Bootstrap(m)) if m.contains("rank 1")),
        "{:?}",
        results[0]
    );
    assert!(results[2].is_err(), "{:?}", results[2]);
}
