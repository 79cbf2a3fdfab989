//! The conformance suite: the behaviour every backend must show.
//!
//! Every rank calls [`run`] (or [`run_with_memory`] for device memory) with the same
//! [`Config`]; the suite then drives the backend through
//!
//! 1. a coverage sweep: every collective the backend claims, every dtype, every op, in
//!    place and out of place, at an odd count with unaligned views;
//! 2. random cases drawn by proptest (counts 0, 1, odd, up to [`Config::max_count`], random
//!    offsets, roots, dtypes, ops), from a seed every rank shares;
//! 3. one large all-reduce ([`Config::large_count`], 16 Mi elements by default);
//! 4. error cases: mismatched counts or dtypes across ranks, a wrong-size output, a
//!    reduce-scatter count not divisible by the world size, a bad root, an unsupported
//!    dtype/op: each must fail with a clear error on *every* rank and leave the
//!    communicator usable.
//!
//! Each rank generates every rank's input from the seed, so it checks its own output
//! against an f64 (or exact integer) reference computed locally. Outputs are poisoned
//! before each call and framed by guard elements. After each case the ranks agree on the
//! verdict and compare digests of their outputs (results must be bitwise identical on
//! every rank) through a sum all-reduce of the backend itself; a failure anywhere fails
//! every rank, so the ranks never fall out of step.
//!
//! [`check_timeout`], [`check_disagreement`] and [`check_late_rank`] are separate because
//! they may leave the communicator unusable.

mod after;
mod agree;
mod cases;
mod data;
mod errors;
pub mod forwarding;
mod memory;
pub mod mpirun;
pub mod ranks;

use std::cell::{Cell, RefCell};
use std::fmt;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use proptest::test_runner::{
    Config as RunnerConfig, RngAlgorithm, TestCaseError, TestRng, TestRunner,
};

use crate::communicator::{Collective, Communicator};
use crate::dtype::{DType, ReduceOp};
use crate::error::Error;
pub use after::{
    After, Disagreement, check_disagreement, check_disagreements_keep_usable, check_late_rank,
    same_everywhere,
};
use agree::Agreement;
use cases::Case;
pub use memory::{HostMemory, TestBuffer, TestMemory};

/// What the suite runs.
#[derive(Debug, Clone)]
pub struct Config {
    /// Seed of every random choice; must be equal on every rank.
    pub seed: u64,
    /// Random cases drawn by proptest.
    pub random_cases: u32,
    /// Largest per-rank element count of a random case (also bounded by the backend's
    /// `max_bytes`).
    pub max_count: usize,
    /// Element count of the one large all-reduce; `None` skips it.
    pub large_count: Option<usize>,
    /// Run the error cases.
    pub error_cases: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            seed: 0x00c0_ffee,
            random_cases: 64,
            max_count: 1 << 16,
            large_count: Some(16 << 20),
            error_cases: true,
        }
    }
}

/// What passed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// Cases of the coverage sweep.
    pub coverage_cases: usize,
    /// Random cases.
    pub random_cases: usize,
    /// Whether the large case ran.
    pub large_case: bool,
    /// Error cases that ran.
    pub error_cases: usize,
    /// Error cases skipped, with the reason (e.g. the backend supports every dtype).
    pub skipped: Vec<String>,
}

/// Why the suite failed (the same on every rank, except `message` may add local detail).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The case that failed.
    pub case: String,
    /// What went wrong.
    pub message: String,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "conformance failure in `{}`: {}",
            self.case, self.message
        )
    }
}

impl std::error::Error for Failure {}

fn failure(case: impl fmt::Display, message: impl fmt::Display) -> Failure {
    Failure {
        case: case.to_string(),
        message: message.to_string(),
    }
}

/// Runs the suite on host memory. Every rank must call it with the same `config`.
pub fn run(comm: &dyn Communicator, config: &Config) -> Result<Report, Failure> {
    run_with_memory(comm, &HostMemory, config)
}

/// Runs the suite with buffers from `memory` (e.g. a GPU backend's device memory).
pub fn run_with_memory(
    comm: &dyn Communicator,
    memory: &dyn TestMemory,
    config: &Config,
) -> Result<Report, Failure> {
    let suite = Suite::new(comm, memory, config)?;
    let mut report = Report::default();
    let plain = Collective::Barrier;
    comm.barrier().map_err(|e| failure(plain, e))?;
    for case in suite.coverage() {
        suite.check(&case)?;
        report.coverage_cases += 1;
    }
    report.random_cases = suite.random()?;
    if let Some(count) = config.large_count {
        let count = suite.clamp(count, 1);
        let case = Case {
            collective: Collective::AllReduce,
            dtype: suite.dtypes[0],
            op: ReduceOp::Sum,
            count,
            in_place: false,
            offset: 0,
            root: 0,
            seed: config.seed ^ 0x1a5e,
        };
        suite.check(&case)?;
        report.large_case = true;
    }
    if config.error_cases {
        errors::run(&suite, &mut report)?;
    }
    Ok(report)
}

/// Checks that a rank which skips a call makes every other rank fail with
/// [`Error::Timeout`] (and not hang). Rank `absent` returns at once without calling.
/// The communicator must have a short timeout; it is unusable afterwards.
pub fn check_timeout(
    comm: &dyn Communicator,
    absent: usize,
    bound: Duration,
) -> Result<Duration, Failure> {
    let case = format!("timeout with rank {absent} absent");
    if comm.rank() == absent {
        return Ok(Duration::ZERO);
    }
    let mut x = vec![1.0f32; 16];
    let started = Instant::now();
    let result = comm.all_reduce_in_place(crate::buffer::BufferMut::host(&mut x), ReduceOp::Sum);
    let waited = started.elapsed();
    match result {
        Err(Error::Timeout { .. }) if waited <= bound => {}
        Err(Error::Timeout { .. }) => {
            return Err(failure(&case, format!("timed out only after {waited:?}")));
        }
        other => {
            return Err(failure(
                &case,
                format!("expected Error::Timeout, got {other:?}"),
            ));
        }
    }
    match comm.barrier() {
        Err(_) => Ok(waited),
        Ok(()) => Err(failure(
            &case,
            "the communicator kept working after a timeout",
        )),
    }
}

/// Shared state of one run.
pub(crate) struct Suite<'a> {
    pub(crate) comm: &'a dyn Communicator,
    pub(crate) memory: &'a dyn TestMemory,
    pub(crate) config: &'a Config,
    pub(crate) agreement: Agreement,
    pub(crate) collectives: Vec<Collective>,
    pub(crate) dtypes: Vec<DType>,
    pub(crate) ops: Vec<ReduceOp>,
    pub(crate) device_memory: bool,
    max_bytes: Option<usize>,
    seq: Cell<u64>,
}

impl<'a> Suite<'a> {
    fn new(
        comm: &'a dyn Communicator,
        memory: &'a dyn TestMemory,
        config: &'a Config,
    ) -> Result<Self, Failure> {
        let caps = comm.capabilities();
        let agreement = Agreement::pick(caps).map_err(|e| failure("setup", e))?;
        let collectives = caps
            .collectives
            .iter()
            .copied()
            .filter(|c| *c != Collective::Barrier)
            .collect();
        Ok(Suite {
            comm,
            memory,
            config,
            agreement,
            collectives,
            dtypes: caps.dtypes.clone(),
            ops: caps.ops.clone(),
            device_memory: caps.device_memory,
            max_bytes: caps.max_bytes,
            seq: Cell::new(0),
        })
    }

    /// A fresh seed per case, the same on every rank.
    fn next_seed(&self) -> u64 {
        let s = self.seq.get() + 1;
        self.seq.set(s);
        data::SplitMix::new(self.config.seed ^ s.wrapping_mul(0x9e37_79b9)).next_u64()
    }

    /// Largest count not above `count` whose biggest buffer (`factor` x count) fits.
    fn clamp(&self, count: usize, factor: usize) -> usize {
        let widest = self.dtypes.iter().map(|d| d.size()).max().unwrap_or(8);
        match self.max_bytes {
            Some(max) => count.min(max / (widest * factor.max(1))),
            None => count,
        }
    }

    fn coverage(&self) -> Vec<Case> {
        let n = self.comm.world_size();
        let mut out = Vec::new();
        for &collective in &self.collectives {
            for &dtype in &self.dtypes {
                let reducing = matches!(
                    collective,
                    Collective::AllReduce | Collective::ReduceScatter
                );
                let ops: Vec<ReduceOp> = if reducing {
                    self.ops.clone()
                } else {
                    vec![ReduceOp::Sum]
                };
                let placements: &[bool] = if collective == Collective::AllReduce {
                    &[false, true]
                } else {
                    &[false]
                };
                for &op in &ops {
                    for &in_place in placements {
                        out.push(Case {
                            collective,
                            dtype,
                            op,
                            count: self.clamp(1001, n),
                            in_place,
                            offset: 1,
                            root: n - 1,
                            seed: self.next_seed(),
                        });
                    }
                }
            }
        }
        out
    }

    fn random(&self) -> Result<usize, Failure> {
        if self.config.random_cases == 0 {
            return Ok(0);
        }
        let n = self.comm.world_size();
        let max = self.clamp(self.config.max_count, n).max(2);
        let counts = prop_oneof![
            1 => Just(0usize),
            1 => Just(1usize),
            3 => 2usize..64,
            3 => 64usize..=max,
        ];
        let strategy = (
            0..self.collectives.len(),
            0..self.dtypes.len(),
            0..self.ops.len(),
            counts,
            any::<bool>(),
            0usize..4,
            0..n,
            any::<u64>(),
        );
        let mut seed = [0u8; 32];
        seed[..8].copy_from_slice(&self.config.seed.to_le_bytes());
        let runner_config = RunnerConfig {
            cases: self.config.random_cases,
            failure_persistence: None,
            // Shrinking stays in step across ranks (verdicts are agreed), but keep it short.
            max_shrink_iters: 64,
            ..RunnerConfig::default()
        };
        let mut runner = TestRunner::new_with_rng(
            runner_config,
            TestRng::from_seed(RngAlgorithm::ChaCha, &seed),
        );
        let ran = Cell::new(0usize);
        let first_failure = RefCell::new(None);
        let result = runner.run(
            &strategy,
            |(c, d, o, count, in_place, offset, root, seed)| {
                let case = Case {
                    collective: self.collectives[c],
                    dtype: self.dtypes[d],
                    op: self.ops[o],
                    count: count.min(max),
                    in_place: in_place && self.collectives[c] == Collective::AllReduce,
                    offset,
                    root,
                    seed,
                };
                ran.set(ran.get() + 1);
                self.check(&case).map_err(|f| {
                    first_failure.borrow_mut().get_or_insert(f.clone());
                    TestCaseError::fail(f.to_string())
                })
            },
        );
        match result {
            Ok(()) => Ok(ran.get()),
            Err(e) => Err(first_failure
                .into_inner()
                .unwrap_or_else(|| failure("random cases", e))),
        }
    }

    /// Runs `case` on this rank, then agrees on the verdict with every rank.
    pub(crate) fn check(&self, case: &Case) -> Result<(), Failure> {
        let (status, digest, local) = match case.run(self.comm, self.memory) {
            Ok(o) if o.wrong > 0 => (1, o.digest, format!("{} wrong elements", o.wrong)),
            Ok(o) if o.guard_damage > 0 => (
                2,
                o.digest,
                format!("{} guard elements overwritten", o.guard_damage),
            ),
            Ok(o) => (0, o.digest, String::new()),
            Err(e) if e.is_fatal() => return Err(failure(case, e)),
            Err(e) => (3, 0, format!("error: {e}")),
        };
        let all = self
            .agreement
            .share(self.comm, self.memory, &[status, digest])
            .map_err(|e| failure(case, format!("agreeing on the verdict failed: {e}")))?;
        if status != 0 {
            return Err(failure(case, format!("rank {}: {local}", self.comm.rank())));
        }
        if let Some(bad) = all.iter().position(|w| w[0] != 0) {
            return Err(failure(case, format!("rank {bad} failed this case")));
        }
        if all.iter().any(|w| w[1] != all[0][1]) {
            let digests: Vec<String> = all.iter().map(|w| format!("{:#x}", w[1])).collect();
            return Err(failure(
                case,
                format!("results differ across ranks: {}", digests.join(" ")),
            ));
        }
        Ok(())
    }
}
