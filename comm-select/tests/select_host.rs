//! SelectComm over the host backends (LocalComm and SymmComm), ranks as threads.

use std::time::Duration;

use comm_core::conformance::{self, After, Config, Disagreement, HostMemory};
use comm_core::{
    Bootstrap, Communicator, CommunicatorExt, DType, Error, LocalComm, ReduceOp, ThreadsBootstrap,
};
use comm_select::{
    CallInfo, Launch, Measurement, Memory, SelectComm, SelectOptions, Source, TuningTable,
};
use comm_symm::SymmComm;

/// Runs `body` on `world` threads, each with a SelectComm over [local, symm] built with
/// the options `options(rank)`.
fn with_select<T: Send + 'static>(
    world: usize,
    options: impl Fn(usize) -> SelectOptions + Send + Sync + Clone + 'static,
    body: impl Fn(SelectComm) -> T + Send + Sync + Clone + 'static,
) -> Vec<T> {
    with_select_bounded(world, None, options, body)
}

/// [`with_select`] whose members give up on an absent peer after `member_timeout`
/// (`None`: the default timeout).
fn with_select_bounded<T: Send + 'static>(
    world: usize,
    member_timeout: Option<Duration>,
    options: impl Fn(usize) -> SelectOptions + Send + Sync + Clone + 'static,
    body: impl Fn(SelectComm) -> T + Send + Sync + Clone + 'static,
) -> Vec<T> {
    let bound = member_timeout.unwrap_or_else(comm_core::bootstrap::default_timeout);
    // The diagnosis after a failed call waits on the bootstrap: longer than the members.
    let handles: Vec<_> = ThreadsBootstrap::with_timeout(world, bound * 10)
        .into_iter()
        .zip(LocalComm::with_timeout(world, bound))
        .map(|(boot, local)| {
            let (options, body) = (options.clone(), body.clone());
            std::thread::spawn(move || {
                let mut symm = SymmComm::with_max_bytes(&boot, 1 << 20).unwrap();
                symm.set_timeout(bound);
                let backends: Vec<Box<dyn Communicator>> = vec![Box::new(local), Box::new(symm)];
                let options = options(boot.rank());
                body(SelectComm::new(boot, backends, options).unwrap())
            })
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().expect("rank panicked"))
        .collect()
}

#[test]
fn passes_the_conformance_suite() {
    let config = Config {
        random_cases: 32,
        large_count: Some(4 << 20),
        ..Config::default()
    };
    for r in with_select(
        3,
        |_| SelectOptions::default(),
        move |s| conformance::run(&s, &config),
    ) {
        r.unwrap();
    }
}

#[test]
fn every_rank_makes_rank_zeros_choice() {
    // Each rank asks for a different forced backend; rank 0's wins everywhere.
    let options = |rank: usize| SelectOptions {
        forced: Some(if rank == 0 { "symm:twoshot" } else { "local" }.into()),
        ..SelectOptions::default()
    };
    let choices = with_select(3, options, |s| {
        let call = CallInfo::all_reduce(DType::F32, ReduceOp::Sum, 1024, Memory::Host);
        let mut x = vec![1.0f32; 1024];
        s.all_reduce_in_place_slice(&mut x, ReduceOp::Sum).unwrap();
        assert!(x.iter().all(|&v| v == 3.0));
        s.choose(&call).unwrap()
    });
    for c in &choices {
        assert_eq!(c.label(), "symm:twoshot");
        assert_eq!(c.source, Source::Forced);
    }
}

#[test]
fn falls_back_when_the_forced_backend_cannot_do_the_call() {
    let options = |_| SelectOptions {
        forced: Some("symm".into()),
        ..SelectOptions::default()
    };
    let out = with_select(2, options, |s| {
        // 2 MiB exceed the symm heap of 1 MiB: local must take it.
        let big = CallInfo::all_reduce(DType::F32, ReduceOp::Sum, 512 << 10, Memory::Host);
        let choice = s.choose(&big).unwrap();
        let mut x = vec![0.5f32; 512 << 10];
        s.all_reduce_in_place_slice(&mut x, ReduceOp::Sum).unwrap();
        (choice, x[0], s.explain(&big))
    });
    for (choice, x0, explain) in out {
        assert_eq!(choice.backend, "local");
        assert_ne!(choice.source, Source::Forced);
        assert!(choice.reason.contains("cannot do this call"), "{choice}");
        assert_eq!(x0, 1.0);
        assert!(explain.contains("local"), "{explain}");
    }
}

#[test]
fn a_tuning_table_overrides_the_cost_model() {
    let options = |_| SelectOptions {
        tuning: Some(table_of(
            4096,
            &[
                (Launch::Eager, "local", None, 1.0),
                (Launch::Eager, "symm", Some("lamport"), 9.0),
            ],
        )),
        ..SelectOptions::default()
    };
    let out = with_select(2, options, |s| {
        let tuned = s
            .choose(&CallInfo::all_reduce(
                DType::F32,
                ReduceOp::Sum,
                1000,
                Memory::Host,
            ))
            .unwrap();
        let modelled = SelectOptions::default();
        drop(modelled);
        tuned
    });
    for c in out {
        assert_eq!(
            (c.backend.as_str(), c.source),
            ("local", Source::Tuning),
            "{c}"
        );
        assert!(c.reason.contains("measured 1.0 us"), "{c}");
    }
}

/// A table of `(launch, backend, algorithm, time_us)` rows, all-reduces of `bytes` of f32
/// in host memory.
fn table_of(bytes: usize, rows: &[(Launch, &str, Option<&str>, f64)]) -> TuningTable {
    let mut table = TuningTable::new(2, "host", "test");
    for &(launch, backend, algorithm, time_us) in rows {
        table.measurements.push(Measurement {
            collective: "all_reduce".into(),
            dtype: "f32".into(),
            bytes,
            memory: Some(Memory::Host),
            launch,
            backend: backend.into(),
            algorithm: algorithm.map(String::from),
            time_us,
        });
    }
    table
}

#[test]
fn each_launch_mode_is_routed_from_its_own_rows() {
    let options = |_| SelectOptions {
        tuning: Some(table_of(
            4096,
            &[
                (Launch::Eager, "local", None, 1.0),
                (Launch::Eager, "symm", Some("lamport"), 9.0),
                (Launch::Graph, "local", None, 8.0),
                (Launch::Graph, "symm", Some("lamport"), 2.0),
            ],
        )),
        ..SelectOptions::default()
    };
    let out = with_select(2, options, |s| {
        let eager = CallInfo::all_reduce(DType::F32, ReduceOp::Sum, 1000, Memory::Host);
        let graph = eager.with_launch(Launch::Graph);
        let choices = (s.choose(&eager).unwrap(), s.choose(&graph).unwrap());
        (choices, s.explain(&graph))
    });
    for ((eager, graph), explain) in out {
        assert_eq!(
            (eager.label().as_str(), eager.source, eager.launch),
            ("local", Source::Tuning, Launch::Eager),
            "{eager}"
        );
        assert!(eager.reason.contains("measured 1.0 us"), "{eager}");
        assert_eq!(
            (graph.label().as_str(), graph.source, graph.launch),
            ("symm:lamport", Source::Tuning, Launch::Graph),
            "{graph}"
        );
        assert!(graph.reason.contains("measured 2.0 us"), "{graph}");
        assert!(explain.contains("graph launch"), "{explain}");
        assert!(explain.contains("symm:lamport"), "{explain}");
    }
}

#[test]
fn a_table_without_graph_rows_answers_graph_calls_from_its_eager_rows() {
    let options = |_| SelectOptions {
        tuning: Some(table_of(
            43008,
            &[
                (Launch::Eager, "local", None, 1.0),
                (Launch::Eager, "symm", None, 9.0),
            ],
        )),
        ..SelectOptions::default()
    };
    let out = with_select(2, options, |s| {
        let graph = CallInfo::all_reduce(DType::F32, ReduceOp::Sum, 10752, Memory::Host)
            .with_launch(Launch::Graph);
        s.choose(&graph).unwrap()
    });
    for graph in out {
        assert_eq!(
            (graph.backend.as_str(), graph.source),
            ("local", Source::Tuning),
            "{graph}"
        );
        assert!(graph.reason.contains("no graph rows"), "{graph}");
    }
}

#[test]
fn a_graph_call_without_a_fitting_graph_row_goes_to_the_cost_model() {
    // Eager rows say local; the table's one graph row is of another collective; the cost
    // model says symm at this size.
    let options = |_| {
        let mut table = table_of(
            43008,
            &[
                (Launch::Eager, "local", None, 1.0),
                (Launch::Eager, "symm", None, 9.0),
                (Launch::Graph, "local", None, 1.0),
            ],
        );
        table.measurements[2].collective = "all_gather".into();
        SelectOptions {
            tuning: Some(table),
            ..SelectOptions::default()
        }
    };
    let out = with_select(2, options, |s| {
        let eager = CallInfo::all_reduce(DType::F32, ReduceOp::Sum, 10752, Memory::Host);
        let graph = eager.with_launch(Launch::Graph);
        (s.choose(&eager).unwrap(), s.choose(&graph).unwrap())
    });
    for (eager, graph) in out {
        assert_eq!(
            (eager.backend.as_str(), eager.source),
            ("local", Source::Tuning)
        );
        assert_eq!(graph.source, Source::CostModel, "{graph}");
        assert_eq!(graph.backend, "symm", "{graph}");
        assert!(graph.reason.contains("no graph measurement"), "{graph}");
    }
}

#[test]
fn the_cost_model_picks_shared_memory_over_thread_locks_for_small_messages() {
    let out = with_select(
        2,
        |_| SelectOptions::default(),
        |s| {
            s.choose(&CallInfo::all_reduce(
                DType::BF16,
                ReduceOp::Sum,
                21504,
                Memory::Host,
            ))
            .unwrap()
        },
    );
    for c in out {
        assert_eq!(c.source, Source::CostModel, "{c}");
        assert_eq!(c.backend, "symm", "{c}");
        // symm picks its algorithm per call: the model prices it by its cheapest and leaves
        // the pick to it.
        assert_eq!(c.algorithm, None, "{c}");
    }
}

#[test]
fn device_memory_with_host_backends_is_unsupported_not_a_crash() {
    let out = with_select(
        2,
        |_| SelectOptions::default(),
        |s| {
            s.choose(&CallInfo::all_reduce(
                DType::F32,
                ReduceOp::Sum,
                16,
                Memory::Device,
            ))
            .unwrap_err()
        },
    );
    for e in out {
        assert!(matches!(e, comm_core::Error::Unsupported(_)), "{e}");
    }
}

#[test]
fn different_backend_lists_are_a_mismatch() {
    let handles: Vec<_> = ThreadsBootstrap::create(2)
        .into_iter()
        .zip(LocalComm::create(2))
        .map(|(boot, local)| {
            std::thread::spawn(move || {
                let mut backends: Vec<Box<dyn Communicator>> = vec![Box::new(local)];
                let symm = SymmComm::with_max_bytes(&boot, 1 << 16).unwrap();
                if boot.rank() == 0 {
                    backends.push(Box::new(symm));
                }
                SelectComm::new(boot, backends, SelectOptions::default()).map(drop)
            })
        })
        .collect();
    for h in handles {
        assert!(matches!(
            h.join().unwrap(),
            Err(comm_core::Error::Mismatch(_))
        ));
    }
}

/// [`with_select_bounded`] with default options.
fn with_short_timeouts<T: Send + 'static>(
    world: usize,
    member_timeout: Duration,
    body: impl Fn(SelectComm) -> T + Send + Sync + Clone + 'static,
) -> Vec<T> {
    with_select_bounded(
        world,
        Some(member_timeout),
        |_| SelectOptions::default(),
        body,
    )
}

/// The scenario: three ranks, rank 0's call differs from the others' (f32 vs i32,
/// 8 vs 262144 elements, all_gather vs all_reduce), then a matching call. Every rank gets
/// Mismatch naming both calls; the matching call gives the right sum everywhere or
/// Aborted everywhere, never another rank's stale contribution.
#[test]
fn disagreeing_ranks_get_a_mismatch_and_never_stale_data() {
    let member_timeout = Duration::from_millis(300);
    for kind in Disagreement::ALL {
        let results = with_short_timeouts(3, member_timeout, move |s| {
            let after = conformance::check_disagreement(&s, &HostMemory, kind, member_timeout * 8)?;
            // Poisoned means poisoned for good, and says so.
            if after == After::Poisoned {
                let again = s.barrier();
                assert!(matches!(again, Err(Error::Aborted(_))), "{again:?}");
            }
            Ok(after)
        });
        let after =
            conformance::same_everywhere(results).unwrap_or_else(|e| panic!("{kind:?}: {e}"));
        assert_ne!(after, After::Skipped, "{kind:?}");
    }
}

#[test]
fn routes_of_mismatched_calls_are_named_in_the_mismatch() {
    let member_timeout = Duration::from_millis(200);
    let errors = with_short_timeouts(2, member_timeout, |s| {
        s.barrier().unwrap();
        // 16 KiB of f32 on rank 0 (symm), 64 MiB on rank 1 (only local holds that).
        let count = if s.rank() == 0 { 4096 } else { 16 << 20 };
        let mut x = vec![1.0f32; count];
        s.all_reduce_in_place_slice(&mut x, ReduceOp::Sum)
            .unwrap_err()
    });
    for e in errors {
        match e {
            Error::Mismatch(m) => {
                assert!(
                    m.contains("4096 x f32") && m.contains("16777216 x f32"),
                    "{m}"
                );
                assert!(m.contains("on symm") && m.contains("on local"), "{m}");
            }
            other => panic!("expected a mismatch, got {other}"),
        }
    }
}

#[test]
fn a_late_rank_never_gets_stale_data() {
    let member_timeout = Duration::from_millis(200);
    let results = with_short_timeouts(3, member_timeout, move |s| {
        conformance::check_late_rank(&s, &HostMemory, 1, member_timeout * 10, member_timeout * 20)
    });
    for r in results {
        r.unwrap();
    }
}

/// Errors of a member reach the selector's caller from every method, `async_error`
/// included (a member's asynchronous error once looked like success through `auto`), and
/// an asynchronous error poisons the selector.
#[test]
fn a_members_errors_reach_the_caller() {
    use comm_core::conformance::forwarding::{Failing, Forwarding, check_forwarding};
    let out = ThreadsBootstrap::create(2)
        .into_iter()
        .map(|b| {
            std::thread::spawn(move || {
                let member: Box<dyn Communicator> = Box::new(Failing::new(b.rank(), 2));
                let s = SelectComm::new(b, vec![member], SelectOptions::default()).unwrap();
                let forwarded = check_forwarding(&s, Forwarding::Errors);
                (forwarded, s.barrier())
            })
        })
        .collect::<Vec<_>>();
    for h in out {
        let (forwarded, after) = h.join().unwrap();
        forwarded.unwrap();
        assert!(matches!(after, Err(Error::Aborted(_))), "{after:?}");
    }
}
