//! SymmComm on the host backing as real processes under `mpirun` (default build: ranks meet
//! through `EnvBootstrap`): the conformance suite for every algorithm, then the timeout.

use std::time::Duration;

use comm_core::EnvBootstrap;
use comm_core::conformance::{self, Config, mpirun};
use comm_symm::{Algorithm, SymmComm};

fn body() {
    let boot = EnvBootstrap::from_env().expect("joining the mpirun job");
    let config = Config {
        random_cases: 24,
        large_count: Some(4 << 20),
        ..Config::default()
    };
    for algorithm in [
        Algorithm::Auto,
        Algorithm::OneShot,
        Algorithm::TwoShot,
        Algorithm::Lamport,
    ] {
        let comm = SymmComm::with_max_bytes(&boot, 16 << 20).expect("symmetric heap");
        comm.use_algorithm(algorithm);
        let report =
            conformance::run(&comm, &config).unwrap_or_else(|f| panic!("{algorithm}: {f}"));
        assert!(
            report.coverage_cases > 100 && report.large_case,
            "{algorithm}: {report:?}"
        );
    }
    let mut comm = SymmComm::with_max_bytes(&boot, 1 << 16).expect("symmetric heap");
    let bound = Duration::from_millis(500);
    comm.set_timeout(bound);
    conformance::check_timeout(&comm, 1, bound * 10).expect("timeout check");
}

#[test]
fn symm_host_under_mpirun_np2() {
    mpirun::on_mpirun("symm_host_under_mpirun_np2", 2, body);
}

#[test]
fn symm_host_under_mpirun_np4() {
    mpirun::on_mpirun("symm_host_under_mpirun_np4", 4, body);
}
