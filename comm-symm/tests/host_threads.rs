//! SymmComm on the host backing, ranks as threads of this process (the mpirun runs of the
//! same suite live in the multi-process tests).

use std::time::Duration;

use comm_core::Bootstrap;
use comm_core::conformance::ranks::on_threads;
use comm_core::conformance::{self, Config};
use comm_symm::{Algorithm, HostHeap, SymmComm};

fn conformance_with(world: usize, algorithm: Algorithm, config: Config) {
    let reports = on_threads(world, Duration::from_secs(60), move |b| {
        let comm = SymmComm::with_max_bytes(&b, 4 << 20).unwrap();
        comm.use_algorithm(algorithm);
        conformance::run(&comm, &config)
    });
    for (rank, r) in reports.into_iter().enumerate() {
        let report = r.unwrap_or_else(|f| panic!("{algorithm} world {world} rank {rank}: {f}"));
        assert!(report.coverage_cases > 100);
    }
}

#[test]
fn conformance_every_algorithm() {
    let config = Config {
        large_count: Some(1 << 20),
        random_cases: 32,
        ..Config::default()
    };
    for world in [1, 2, 3, 4] {
        for algorithm in [Algorithm::OneShot, Algorithm::TwoShot, Algorithm::Lamport] {
            conformance_with(world, algorithm, config.clone());
        }
    }
}

#[test]
fn conformance_auto_at_eight_ranks() {
    let config = Config {
        large_count: None,
        random_cases: 16,
        ..Config::default()
    };
    conformance_with(8, Algorithm::Auto, config);
}

#[test]
fn ranks_asking_for_other_sizes_get_a_mismatch_at_once() {
    let started = std::time::Instant::now();
    let results = on_threads(3, Duration::from_secs(20), |b| {
        let max_bytes = if b.rank() == 2 { 1 << 20 } else { 1 << 16 };
        SymmComm::with_max_bytes(&b, max_bytes).map(|_| ())
    });
    for (rank, r) in results.into_iter().enumerate() {
        match r {
            Err(comm_core::Error::Mismatch(why)) => assert!(why.contains("rank"), "{why}"),
            other => panic!("rank {rank}: expected a mismatch, got {other:?}"),
        }
    }
    // Refused when the sizes are compared, not after the bootstrap's bound.
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[test]
fn absent_rank_is_a_timeout() {
    let bound = Duration::from_millis(300);
    let results = on_threads(3, Duration::from_secs(10), move |b| {
        let mut comm = SymmComm::with_max_bytes(&b, 1 << 16).unwrap();
        comm.set_timeout(bound);
        conformance::check_timeout(&comm, 1, bound * 10)
    });
    for r in results {
        r.unwrap();
    }
}

#[test]
fn signals_pair_up_per_peer_and_channel() {
    // Rank 0 signals rank 1 three times on channel 1; rank 1 must see exactly three, in
    // order with the data written before each signal.
    let results = on_threads(2, Duration::from_secs(10), |b| {
        let heap = HostHeap::rendezvous(&b, 64, 2).unwrap();
        let t = Duration::from_secs(5);
        if b.rank() == 0 {
            for i in 1..=3u8 {
                // SAFETY: rank 0 writes its own area; rank 1 reads it only after the signal,
                // and rank 0 waits for rank 1's acknowledgement before writing again.
                unsafe { *heap.data(0) = i };
                heap.put_signal(1, 1);
                heap.wait_signal(1, 0, t).unwrap();
            }
            Vec::new()
        } else {
            let mut seen = Vec::new();
            for _ in 0..3 {
                heap.wait_signal(0, 1, t).unwrap();
                // SAFETY: rank 0 wrote the byte before signalling and waits for our ack.
                seen.push(unsafe { *heap.data(0) });
                heap.put_signal(0, 0);
            }
            seen
        }
    });
    assert_eq!(results[1], vec![1, 2, 3]);
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

#[test]
fn a_thousand_rendezvous_cycles_leak_no_descriptors() {
    let before = open_fds();
    on_threads(2, Duration::from_secs(20), |b| {
        for _ in 0..1000 {
            let heap = HostHeap::rendezvous(&b, 1 << 12, 1).unwrap();
            heap.barrier(0).unwrap();
        }
    });
    let after = open_fds();
    assert!(
        after <= before + 2,
        "descriptors grew from {before} to {after}"
    );
}

#[test]
fn lamport_carries_the_sentinel_pattern_as_nan() {
    use comm_core::{Communicator, CommunicatorExt, ReduceOp};
    let results = on_threads(3, Duration::from_secs(10), |b| {
        let comm = SymmComm::with_max_bytes(&b, 1 << 16).unwrap();
        comm.use_algorithm(Algorithm::Lamport);
        let mut out = Vec::new();
        for round in 0..5 {
            let mut x = vec![1.5f32 + comm.rank() as f32 + round as f32; 37];
            if comm.rank() == 1 {
                x[3] = f32::from_bits(u32::MAX);
                x[4] = -0.0;
            }
            comm.all_reduce_in_place_slice(&mut x, ReduceOp::Sum)
                .unwrap();
            out.push(x);
        }
        out
    });
    for (round, x) in results[0].iter().enumerate() {
        let want = 4.5 + 3.0 * round as f32 + 3.0;
        assert!(x[3].is_nan(), "round {round}: {}", x[3]);
        assert_eq!(x[4], want - (2.5 + round as f32), "round {round}");
        assert_eq!(x[0], want, "round {round}");
        for r in &results {
            assert_eq!(r[round][0].to_bits(), x[0].to_bits());
        }
    }
}

#[test]
fn disagreeing_ranks_get_a_mismatch_on_every_algorithm() {
    use comm_core::conformance::{After, Disagreement, HostMemory};
    let bound = Duration::from_secs(5);
    for algorithm in [
        Algorithm::Auto,
        Algorithm::OneShot,
        Algorithm::TwoShot,
        Algorithm::Lamport,
    ] {
        for kind in Disagreement::ALL {
            let results = on_threads(3, bound, move |b| {
                let mut comm = SymmComm::with_max_bytes(&b, 2 << 20).unwrap();
                comm.set_timeout(bound);
                comm.use_algorithm(algorithm);
                conformance::check_disagreement(&comm, &HostMemory, kind, bound)
            });
            assert_eq!(
                conformance::same_everywhere(results),
                Ok(After::Usable),
                "{algorithm} {kind:?}"
            );
        }
    }
}

#[test]
fn a_late_rank_never_gets_stale_data() {
    use comm_core::conformance::HostMemory;
    let bound = Duration::from_millis(200);
    for algorithm in [Algorithm::OneShot, Algorithm::TwoShot, Algorithm::Lamport] {
        let results = on_threads(3, Duration::from_secs(10), move |b| {
            let mut comm = SymmComm::with_max_bytes(&b, 1 << 16).unwrap();
            comm.set_timeout(bound);
            comm.use_algorithm(algorithm);
            conformance::check_late_rank(&comm, &HostMemory, 1, bound * 10, bound * 20)
        });
        for r in results {
            r.unwrap_or_else(|f| panic!("{algorithm}: {f}"));
        }
    }
}
