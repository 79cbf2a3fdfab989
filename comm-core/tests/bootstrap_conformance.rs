//! `BootstrapComm` runs the conformance suite over threads (`ThreadsBootstrap`) and over
//! the TCP store on loopback (`EnvBootstrap`, one thread per rank). Real processes under
//! `mpirun` are in `mpirun_bootstrap.rs`.

use std::net::TcpListener;
use std::time::Duration;

use comm_core::conformance::{self, Config, Report};
use comm_core::{BootstrapComm, Communicator, EnvBootstrap, LaunchInfo, ThreadsBootstrap};

fn on_threads<T: Send + 'static>(
    n: usize,
    timeout: Duration,
    body: impl Fn(BootstrapComm<ThreadsBootstrap>) -> T + Send + Sync + Clone + 'static,
) -> Vec<T> {
    let handles: Vec<_> = ThreadsBootstrap::with_timeout(n, timeout)
        .into_iter()
        .map(|boot| {
            let body = body.clone();
            std::thread::spawn(move || body(BootstrapComm::new(boot)))
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

fn on_tcp<T: Send + 'static>(
    n: usize,
    timeout: Duration,
    body: impl Fn(BootstrapComm<EnvBootstrap>) -> T + Send + Sync + Clone + 'static,
) -> Vec<T> {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
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
                body(BootstrapComm::new(boot.unwrap()))
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

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
            on_threads(n, LONG, move |comm| conformance::run(&comm, &c)),
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
        on_tcp(3, LONG, move |comm| conformance::run(&comm, &c)),
        &config,
    );
}

#[test]
fn absent_rank_times_out_everywhere_else_over_threads() {
    let bound = Duration::from_millis(200);
    for waited in on_threads(4, bound, move |comm| {
        conformance::check_timeout(&comm, 2, bound * 5)
    }) {
        assert!(waited.unwrap() < bound * 5);
    }
}

#[test]
fn absent_rank_times_out_everywhere_else_over_tcp() {
    let bound = Duration::from_millis(300);
    for waited in on_tcp(4, bound, move |comm| {
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
