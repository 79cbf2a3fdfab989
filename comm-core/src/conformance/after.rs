//! Ranks that disagree about a call, and ranks that arrive after their peers gave up.
//!
//! Both may leave a communicator unusable, so each case is its own entry point, run on a
//! communicator that nothing needs afterwards. What every backend must show: a call the
//! ranks disagree about fails with [`Error::Mismatch`] naming the calls, on every rank;
//! after a failed call the communicator is either still right on every rank or refuses
//! every later call with a fatal error ([`Error::is_fatal`]) on every rank; a peer's
//! contribution to a failed call is never taken for a later call's.
//!
//! Cross-rank consistency cannot be checked through a communicator that may be poisoned:
//! each rank returns its [`After`], and the harness compares them across ranks.

use std::time::{Duration, Instant};

use super::agree::encode_small;
use super::data::{Values, decode};
use super::memory::TestMemory;
use super::{Failure, failure};
use crate::communicator::{Collective, Communicator};
use crate::dtype::{DType, ReduceOp};
use crate::error::{Error, Result};

/// How the ranks disagree in [`check_disagreement`]: rank 0 makes one call, every other
/// rank another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Disagreement {
    /// All-reduces of a float dtype on rank 0 and an integer dtype elsewhere.
    Dtype,
    /// All-reduces of 8 elements on rank 0 and of 262144 (or the most that fits) elsewhere.
    Count,
    /// An all-gather on rank 0 and an all-reduce elsewhere.
    Collective,
}

impl Disagreement {
    /// Every kind.
    pub const ALL: [Disagreement; 3] = [
        Disagreement::Dtype,
        Disagreement::Count,
        Disagreement::Collective,
    ];
}

/// What a matching all-reduce did after a failed call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum After {
    /// It returned the right sum: the communicator stayed consistent.
    Usable,
    /// It failed with a fatal error: the communicator is poisoned.
    Poisoned,
    /// The case cannot run on this backend or world (one rank, one dtype, no all-gather).
    Skipped,
}

/// [`check_disagreement`] of every [`Disagreement`] in turn, on a backend that must stay
/// usable after each (every backend that settles calls across ranks itself).
pub fn check_disagreements_keep_usable(
    comm: &dyn Communicator,
    memory: &dyn TestMemory,
    bound: Duration,
) -> Result<(), Failure> {
    for kind in Disagreement::ALL {
        match check_disagreement(comm, memory, kind, bound)? {
            After::Usable | After::Skipped => {}
            After::Poisoned => {
                return Err(failure(
                    format!("ranks disagree ({kind:?})"),
                    "the communicator was poisoned by a mismatch it should have settled",
                ));
            }
        }
    }
    Ok(())
}

/// Combines every rank's result of [`check_disagreement`] (indexed by rank): the common
/// [`After`], or why the ranks failed or ended differently.
pub fn same_everywhere(
    results: impl IntoIterator<Item = Result<After, Failure>>,
) -> Result<After, String> {
    let mut seen: Option<After> = None;
    for (rank, r) in results.into_iter().enumerate() {
        let after = r.map_err(|f| format!("rank {rank}: {f}"))?;
        match seen {
            Some(first) if first != after => {
                return Err(format!(
                    "ranks ended differently: rank 0 {first:?}, rank {rank} {after:?}"
                ));
            }
            _ => seen = Some(after),
        }
    }
    seen.ok_or_else(|| "no ranks".to_string())
}

/// Elements each rank contributes to the matching all-reduce after a failure.
const AFTER_COUNT: usize = 8;
/// What each rank contributes to a failed call: a later call that consumed it would
/// come out wrong, since the good call sums `rank + 1`.
const STALE: u8 = 40;

/// One call of one rank.
struct Call {
    collective: Collective,
    dtype: DType,
    count: usize,
}

/// Rank 0 and the other ranks make calls that disagree as `kind` says. Every rank must
/// get [`Error::Mismatch`] naming both calls within `bound`; then a matching sum
/// all-reduce of `rank + 1` must give the right sum or a fatal error (never other data)
/// within `bound`. Every rank must call it; compare the returned [`After`] across ranks.
pub fn check_disagreement(
    comm: &dyn Communicator,
    memory: &dyn TestMemory,
    kind: Disagreement,
    bound: Duration,
) -> Result<After, Failure> {
    let case = format!("ranks disagree ({kind:?})");
    let caps = comm.capabilities();
    let supports = |d: DType| caps.dtypes.contains(&d);
    let float = [DType::F32, DType::F64, DType::BF16, DType::F16]
        .into_iter()
        .find(|&d| supports(d))
        .unwrap_or(caps.dtypes[0]);
    let all_reduce = |dtype, count| Call {
        collective: Collective::AllReduce,
        dtype,
        count,
    };
    let (mine, theirs) = match kind {
        Disagreement::Dtype => {
            let Some(int) = [DType::I32, DType::I64, DType::U8]
                .into_iter()
                .chain(caps.dtypes.iter().copied())
                .find(|&d| d != float && supports(d))
            else {
                return Ok(After::Skipped);
            };
            (all_reduce(float, 8), all_reduce(int, 8))
        }
        Disagreement::Count => {
            let large = caps
                .max_bytes
                .map_or(262_144, |max| (max / float.size()).min(262_144));
            if large <= 8 {
                return Ok(After::Skipped);
            }
            (all_reduce(float, 8), all_reduce(float, large))
        }
        Disagreement::Collective => {
            if !caps.collectives.contains(&Collective::AllGather) {
                return Ok(After::Skipped);
            }
            let gather = Call {
                collective: Collective::AllGather,
                ..all_reduce(float, 8)
            };
            (gather, all_reduce(float, 8))
        }
    };
    if comm.world_size() < 2 {
        return Ok(After::Skipped);
    }
    comm.barrier().map_err(|e| failure(&case, e))?;
    let call = if comm.rank() == 0 { &mine } else { &theirs };
    let started = Instant::now();
    let result = issue(comm, memory, call);
    let waited = started.elapsed();
    let names = |c: &Call| match kind {
        Disagreement::Dtype => c.dtype.name().to_string(),
        Disagreement::Count => format!("{} x", c.count),
        Disagreement::Collective => c.collective.name().to_string(),
    };
    match result {
        Err(Error::Mismatch(m)) if m.contains(&names(&mine)) && m.contains(&names(&theirs)) => {}
        Err(Error::Mismatch(m)) => {
            return Err(failure(
                &case,
                format!(
                    "rank {}: the mismatch names neither `{}` nor `{}`: {m}",
                    comm.rank(),
                    names(&mine),
                    names(&theirs)
                ),
            ));
        }
        other => {
            return Err(failure(
                &case,
                format!(
                    "rank {}: expected Error::Mismatch, got {other:?} after {waited:?}",
                    comm.rank()
                ),
            ));
        }
    }
    if waited > bound {
        return Err(failure(
            &case,
            format!("rank {}: the mismatch took {waited:?}", comm.rank()),
        ));
    }
    after(comm, memory, &case, float, bound)
}

/// Rank `late` makes a sum all-reduce `delay` after its peers (longer than the
/// communicator's timeout): its peers must fail with a fatal error within `bound`; the late
/// rank's own call must give the right sum or a fatal error, never other data; and a
/// following all-reduce must fail with a fatal error on every rank, within `bound`.
pub fn check_late_rank(
    comm: &dyn Communicator,
    memory: &dyn TestMemory,
    late: usize,
    delay: Duration,
    bound: Duration,
) -> Result<(), Failure> {
    let case = format!("rank {late} arrives {delay:?} late");
    let caps = comm.capabilities();
    let dtype = [DType::F32, DType::F64, DType::I32]
        .into_iter()
        .find(|d| caps.dtypes.contains(d))
        .unwrap_or(caps.dtypes[0]);
    comm.barrier().map_err(|e| failure(&case, e))?;
    let me = comm.rank();
    if me == late {
        std::thread::sleep(delay);
    }
    let started = Instant::now();
    let result = sum_of_ranks(comm, memory, dtype);
    let waited = started.elapsed();
    match result {
        Err(e) if e.is_fatal() && waited <= bound => {}
        Ok(Some(got)) if me == late => {
            // The late rank met every peer's contribution to this very call: right, or bust.
            if got != expected_sum(comm.world_size()) {
                return Err(failure(
                    &case,
                    format!("the late rank got {got}, not the sum of this call"),
                ));
            }
        }
        other => {
            return Err(failure(
                &case,
                format!("rank {me}: expected a fatal error, got {other:?} after {waited:?}"),
            ));
        }
    }
    let started = Instant::now();
    match sum_of_ranks(comm, memory, dtype) {
        Err(e) if e.is_fatal() && started.elapsed() <= bound => Ok(()),
        other => Err(failure(
            &case,
            format!(
                "rank {me}: the call after the failure should be refused, got {other:?} after {:?}",
                started.elapsed()
            ),
        )),
    }
}

/// The matching all-reduce after a failed call.
fn after(
    comm: &dyn Communicator,
    memory: &dyn TestMemory,
    case: &str,
    dtype: DType,
    bound: Duration,
) -> Result<After, Failure> {
    let started = Instant::now();
    let result = sum_of_ranks(comm, memory, dtype);
    let waited = started.elapsed();
    let rank = comm.rank();
    match result {
        _ if waited > bound => Err(failure(
            case,
            format!("rank {rank}: the call after the failure took {waited:?}"),
        )),
        Ok(Some(got)) if got == expected_sum(comm.world_size()) => Ok(After::Usable),
        Ok(got) => Err(failure(
            case,
            format!(
                "rank {rank}: the call after the failure returned wrong data ({got:?}, want {})",
                expected_sum(comm.world_size())
            ),
        )),
        Err(e) if e.is_fatal() => Ok(After::Poisoned),
        Err(e) => Err(failure(
            case,
            format!("rank {rank}: the call after the failure failed without poisoning: {e}"),
        )),
    }
}

fn expected_sum(world: usize) -> f64 {
    (world * (world + 1) / 2) as f64
}

/// A sum all-reduce of `rank + 1` over [`AFTER_COUNT`] elements; `Some(value)` when every
/// element holds the same value, `None` when they differ.
fn sum_of_ranks(
    comm: &dyn Communicator,
    memory: &dyn TestMemory,
    dtype: DType,
) -> Result<Option<f64>> {
    let mut buf = memory.alloc(dtype, AFTER_COUNT)?;
    let value = encode_small(dtype, comm.rank() as u8 + 1);
    buf.write(&value.repeat(AFTER_COUNT))?;
    comm.all_reduce_in_place(buf.view_mut(0, AFTER_COUNT), ReduceOp::Sum)?;
    let values: Vec<f64> = match decode(dtype, &buf.read()?) {
        Values::Float(v) => v,
        Values::Int(v) => v.into_iter().map(|x| x as f64).collect(),
    };
    Ok(values.iter().all(|v| *v == values[0]).then(|| values[0]))
}

/// Issues `call` with every element [`STALE`]; device errors may surface once it was
/// waited for.
fn issue(comm: &dyn Communicator, memory: &dyn TestMemory, call: &Call) -> Result<()> {
    let recv_len = match call.collective {
        Collective::AllGather => call.count * comm.world_size(),
        _ => call.count,
    };
    let mut send = memory.alloc(call.dtype, call.count)?;
    let mut recv = memory.alloc(call.dtype, recv_len)?;
    send.write(&encode_small(call.dtype, STALE).repeat(call.count))?;
    recv.write(&vec![0; recv_len * call.dtype.size()])?;
    let (src, dst) = (send.view(0, call.count), recv.view_mut(0, recv_len));
    match call.collective {
        Collective::AllGather => comm.all_gather(src, dst)?,
        _ => comm.all_reduce(src, dst, ReduceOp::Sum)?,
    }
    recv.read()?;
    comm.async_error()
}
