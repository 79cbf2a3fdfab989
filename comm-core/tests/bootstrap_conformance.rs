//! `BootstrapComm` runs the conformance suite over threads (`ThreadsBootstrap`) and over
//! the TCP store on loopback (`EnvBootstrap`, one thread per rank). Real processes under
//! `mpirun` are in `mpirun_bootstrap.rs`.

use std::time::Duration;

use comm_core::conformance::ranks::{on_loopback, on_threads};
use comm_core::conformance::{self, After, Config, Disagreement, HostMemory, Report};
use comm_core::{BootstrapComm, Communicator};

fn check(reports: Vec<Result<Report, conformance::Failure>>, config: &Config) {
    for (rank, r) in reports.into_iter().enumerate() {
        let report = r.unwrap_or_else(|f| panic!("rank {rank}: {f}"));
        assert!(report.coverage_cases > 100, "{report:?}");
        assert_eq!(report.random_cases, config.random_cases as usize);
        assert_eq!(report.large_case, config.large_count.is_some());
    }
}

const LONG: Duration = Duration::from_secs(120);

#[test]
fn conformance_over_threads() {
    for n in [1, 2, 3, 4] {
        let config = Config {
            // The data path copies every rank's data to every rank: keep the large case
            // large, but not 16 Mi elements x 4 ranks x 4 copies.
            large_count: (n == 4).then_some(1 << 20),
            ..Config::default()
        };
        let c = config.clone();
        check(
            on_threads(n, LONG, move |b| {
                conformance::run(&BootstrapComm::new(b), &c)
            }),
            &config,
        );
    }
}

#[test]
fn conformance_over_tcp() {
    let config = Config {
        random_cases: 32,
        large_count: Some(1 << 18),
        ..Config::default()
    };
    let c = config.clone();
    check(
        on_loopback(3, LONG, move |b| {
            conformance::run(&BootstrapComm::new(b), &c)
        }),
        &config,
    );
}

#[test]
fn absent_rank_times_out_everywhere_else_over_threads() {
    let bound = Duration::from_millis(200);
    for waited in on_threads(4, bound, move |b| {
        let comm = BootstrapComm::new(b);
        conformance::check_timeout(&comm, 2, bound * 5)
    }) {
        assert!(waited.unwrap() < bound * 5);
    }
}

#[test]
fn absent_rank_times_out_everywhere_else_over_tcp() {
    let bound = Duration::from_millis(300);
    for waited in on_loopback(4, bound, move |b| {
        let comm = BootstrapComm::new(b);
        let waited = conformance::check_timeout(&comm, 2, bound * 5);
        if comm.rank() == 2 {
            // Stay connected until the others have timed out: leaving would be noticed
            // at once, as a closed connection rather than a timeout.
            std::thread::sleep(bound * 4);
        }
        waited
    }) {
        assert!(waited.unwrap() < bound * 5);
    }
}

#[test]
fn disagreeing_ranks_get_a_mismatch_and_stay_usable() {
    let bound = Duration::from_secs(5);
    for kind in Disagreement::ALL {
        let threads = on_threads(3, bound, move |b| {
            conformance::check_disagreement(&BootstrapComm::new(b), &HostMemory, kind, bound)
        });
        let tcp = on_loopback(3, bound, move |b| {
            conformance::check_disagreement(&BootstrapComm::new(b), &HostMemory, kind, bound)
        });
        for results in [threads, tcp] {
            assert_eq!(
                conformance::same_everywhere(results),
                Ok(After::Usable),
                "{kind:?}"
            );
        }
    }
}

#[test]
fn a_late_rank_never_gets_stale_data() {
    let bound = Duration::from_millis(200);
    let check = move |comm: &dyn Communicator| {
        conformance::check_late_rank(comm, &HostMemory, 1, bound * 10, bound * 20)
    };
    for r in on_threads(3, bound, move |b| check(&BootstrapComm::new(b))) {
        r.unwrap();
    }
    for r in on_loopback(3, bound, move |b| check(&BootstrapComm::new(b))) {
        r.unwrap();
    }
}

#[test]
fn one_bootstrap_serves_several_communicators_by_reference_and_by_arc() {
    use comm_core::{Bootstrap, CommunicatorExt, ReduceOp};
    use std::sync::Arc;
    let sums = on_threads(2, LONG, |b| {
        let shared = Arc::new(b);
        let by_arc = BootstrapComm::new(shared.clone());
        let by_ref = BootstrapComm::new(&*shared);
        let mut x = [1.0f32; 4];
        by_arc
            .all_reduce_in_place_slice(&mut x, ReduceOp::Sum)
            .unwrap();
        by_ref
            .all_reduce_in_place_slice(&mut x, ReduceOp::Sum)
            .unwrap();
        shared.barrier().unwrap();
        x[0]
    });
    assert_eq!(sums, vec![4.0, 4.0]);
}
