//! LocalComm runs the conformance suite at every world size from 1 to 8.

use std::time::Duration;

use comm_core::conformance::{self, After, Config, Disagreement, HostMemory};
use comm_core::{Communicator, LocalComm};

fn run_group(world_size: usize, config: Config) {
    let handles: Vec<_> = LocalComm::create(world_size)
        .into_iter()
        .map(|comm| {
            let config = config.clone();
            std::thread::spawn(move || conformance::run(&comm, &config))
        })
        .collect();
    for (rank, h) in handles.into_iter().enumerate() {
        let report = h
            .join()
            .expect("rank panicked")
            .unwrap_or_else(|f| panic!("rank {rank}: {f}"));
        assert!(report.coverage_cases > 100, "{report:?}");
        assert_eq!(report.random_cases, config.random_cases as usize);
        assert_eq!(report.large_case, config.large_count.is_some());
        assert!(
            report.error_cases >= if world_size > 1 { 4 } else { 2 },
            "{report:?}"
        );
    }
}

#[test]
fn conformance_small_worlds() {
    for n in [1, 2, 3] {
        run_group(
            n,
            Config {
                large_count: None,
                ..Config::default()
            },
        );
    }
}

#[test]
fn conformance_four_ranks_with_large_case() {
    run_group(4, Config::default());
}

#[test]
fn conformance_up_to_eight_ranks() {
    for n in [5, 8] {
        run_group(
            n,
            Config {
                large_count: None,
                random_cases: 24,
                ..Config::default()
            },
        );
    }
}

#[test]
fn absent_rank_times_out_everywhere_else() {
    let bound = Duration::from_millis(200);
    let handles: Vec<_> = LocalComm::with_timeout(4, bound)
        .into_iter()
        .map(|comm| std::thread::spawn(move || conformance::check_timeout(&comm, 2, bound * 5)))
        .collect();
    for h in handles {
        let waited = h.join().unwrap().unwrap();
        assert!(waited < bound * 5);
    }
}

#[test]
fn the_doc_example_runs_through_trait_objects() {
    let comms: Vec<Box<dyn Communicator>> = LocalComm::create(2)
        .into_iter()
        .map(|c| Box::new(c) as Box<dyn Communicator>)
        .collect();
    let handles: Vec<_> = comms
        .into_iter()
        .map(|c| {
            std::thread::spawn(move || {
                conformance::run(
                    &c,
                    &Config {
                        random_cases: 4,
                        large_count: None,
                        ..Config::default()
                    },
                )
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap().unwrap();
    }
}

#[test]
fn disagreeing_ranks_get_a_mismatch_and_stay_usable() {
    let bound = Duration::from_secs(5);
    for kind in Disagreement::ALL {
        let handles: Vec<_> = LocalComm::with_timeout(3, bound)
            .into_iter()
            .map(|c| {
                std::thread::spawn(move || {
                    conformance::check_disagreement(&c, &HostMemory, kind, bound)
                })
            })
            .collect();
        let results = handles.into_iter().map(|h| h.join().unwrap());
        assert_eq!(
            conformance::same_everywhere(results),
            Ok(After::Usable),
            "{kind:?}"
        );
    }
}

#[test]
fn a_late_rank_never_gets_stale_data() {
    let bound = Duration::from_millis(200);
    let handles: Vec<_> = LocalComm::with_timeout(3, bound)
        .into_iter()
        .map(|c| {
            std::thread::spawn(move || {
                conformance::check_late_rank(&c, &HostMemory, 1, bound * 10, bound * 20)
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap().unwrap();
    }
}
