//! Bad input: every rank must get a clear error, nothing may hang, and the communicator
//! must stay usable. Backends whose kernels find disagreements themselves
//! ([`Disagreements::Poison`]) are unusable after ranks disagree: for them the cases where
//! all ranks fail alike run first, then one case where a single rank rejects its
//! arguments, last (count and dtype disagreements are `check_disagreement`'s, on fresh
//! communicators).

use super::cases::Case;
use super::{Failure, Report, Suite, failure};
use crate::communicator::{Collective, Disagreements};
use crate::dtype::{DType, ReduceOp};
use crate::error::{Error, Result};

/// One rank's arguments for an error case: lengths and dtype of send and recv.
#[derive(Clone, Copy)]
struct BadCall {
    name: &'static str,
    collective: Collective,
    dtype: DType,
    op: ReduceOp,
    send_len: usize,
    recv_len: usize,
    root: usize,
    /// Present the send buffer as device memory (it is host memory, so a backend that
    /// wrongly dereferences it cannot crash, but must still refuse it).
    device_send: bool,
    /// Only some ranks make this call (or make it alike): the ranks disagree.
    disagreeing: bool,
}

pub(super) fn run(suite: &Suite<'_>, report: &mut Report) -> Result<(), Failure> {
    let n = suite.comm.world_size();
    let rank = suite.comm.rank();
    let last = n - 1;
    let dtype = suite.dtypes[0];
    let has = |c| suite.collectives.contains(&c);
    let mut calls = Vec::new();
    let all_reduce = |name, dtype, send_len, recv_len| BadCall {
        name,
        collective: Collective::AllReduce,
        dtype,
        op: ReduceOp::Sum,
        send_len,
        recv_len,
        root: 0,
        device_send: false,
        disagreeing: false,
    };

    if n > 1 {
        let len = if rank == 0 { 9 } else { 8 };
        calls.push(BadCall {
            disagreeing: true,
            ..all_reduce("counts differ across ranks", dtype, len, len)
        });
    } else {
        report
            .skipped
            .push("count mismatch: needs two ranks".into());
    }
    let recv_len = if rank == last { 7 } else { 8 };
    let one_rank_rejects = BadCall {
        disagreeing: n > 1,
        ..all_reduce(
            "output buffer too small on the last rank",
            dtype,
            8,
            recv_len,
        )
    };
    match (n > 1, suite.dtypes.get(1)) {
        (true, Some(&other)) => {
            let d = if rank == 0 { other } else { dtype };
            calls.push(BadCall {
                disagreeing: true,
                ..all_reduce("dtypes differ across ranks", d, 8, 8)
            });
        }
        _ => report
            .skipped
            .push("dtype mismatch: needs two ranks and two dtypes".into()),
    }
    if has(Collective::ReduceScatter) && n > 1 {
        calls.push(BadCall {
            name: "reduce_scatter count not divisible by world size",
            collective: Collective::ReduceScatter,
            dtype,
            op: ReduceOp::Sum,
            send_len: 4 * n + 1,
            recv_len: 4,
            root: 0,
            device_send: false,
            disagreeing: false,
        });
    }
    if has(Collective::Broadcast) {
        calls.push(BadCall {
            name: "broadcast root outside the world",
            collective: Collective::Broadcast,
            dtype,
            op: ReduceOp::Sum,
            send_len: 8,
            recv_len: 8,
            root: n,
            device_send: false,
            disagreeing: false,
        });
    }
    match DType::ALL.into_iter().find(|d| !suite.dtypes.contains(d)) {
        Some(unsupported) => calls.push(all_reduce("unsupported dtype", unsupported, 8, 8)),
        None => report
            .skipped
            .push("unsupported dtype: the backend supports every dtype".into()),
    }
    match ReduceOp::ALL.into_iter().find(|o| !suite.ops.contains(o)) {
        Some(op) => calls.push(BadCall {
            op,
            ..all_reduce("unsupported op", dtype, 8, 8)
        }),
        None => report
            .skipped
            .push("unsupported op: the backend supports every op".into()),
    }

    if !suite.device_memory {
        calls.push(BadCall {
            device_send: true,
            ..all_reduce("device memory on a host-only backend", dtype, 8, 8)
        });
    }

    let poisons = suite.comm.capabilities().disagreements == Disagreements::Poison;
    if !poisons {
        calls.push(one_rank_rejects);
    }
    for call in &calls {
        if poisons && call.disagreeing {
            report.skipped.push(format!(
                "{}: checked by check_disagreement (it leaves the communicator unusable)",
                call.name
            ));
            continue;
        }
        expect_error_everywhere(suite, call)?;
        report.error_cases += 1;
    }
    // The communicator must still work after all of that.
    let sane = Case {
        collective: Collective::AllReduce,
        dtype,
        op: ReduceOp::Sum,
        count: 33,
        in_place: false,
        offset: 0,
        root: 0,
        seed: suite.next_seed(),
    };
    suite
        .check(&sane)
        .map_err(|f| failure("a good call after the error cases", f))?;
    if poisons {
        // Last: the communicator is unusable afterwards, so each rank judges its own error
        // (the harness compares the ranks' reports).
        let call = &one_rank_rejects;
        match issue(suite, call) {
            Err(Error::InvalidArgument(_) | Error::Mismatch(_) | Error::Unsupported(_)) => {}
            other => {
                return Err(failure(
                    call.name,
                    format!(
                        "rank {}: expected a clear error, got {other:?}",
                        suite.comm.rank()
                    ),
                ));
            }
        }
        report.error_cases += 1;
    }
    Ok(())
}

fn expect_error_everywhere(suite: &Suite<'_>, call: &BadCall) -> Result<(), Failure> {
    let outcome = issue(suite, call);
    let (status, detail) = match &outcome {
        Err(Error::InvalidArgument(_) | Error::Mismatch(_) | Error::Unsupported(_)) => {
            (0u64, String::new())
        }
        Err(e) if e.is_fatal() => {
            return Err(failure(
                call.name,
                format!("expected a clear error, got {e}"),
            ));
        }
        Err(e) => (
            1,
            format!("expected InvalidArgument, Mismatch or Unsupported, got {e}"),
        ),
        Ok(()) => (1, "the call succeeded".to_string()),
    };
    let all = suite
        .agreement
        .share(suite.comm, suite.memory, &[status])
        .map_err(|e| failure(call.name, format!("agreeing on the verdict failed: {e}")))?;
    if status != 0 {
        return Err(failure(
            call.name,
            format!("rank {}: {detail}", suite.comm.rank()),
        ));
    }
    match all.iter().position(|w| w[0] != 0) {
        Some(bad) => Err(failure(
            call.name,
            format!("rank {bad} did not get a clear error"),
        )),
        None => Ok(()),
    }
}

fn issue(suite: &Suite<'_>, call: &BadCall) -> Result<()> {
    let mut send = suite.memory.alloc(call.dtype, call.send_len)?;
    let mut recv = suite.memory.alloc(call.dtype, call.recv_len)?;
    send.write(&vec![1; call.send_len * call.dtype.size()])?;
    recv.write(&vec![1; call.recv_len * call.dtype.size()])?;
    let out = recv.view_mut(0, call.recv_len);
    let comm = suite.comm;
    if call.device_send {
        let host = send.view(0, call.send_len);
        // SAFETY: the address is live host memory of the stated size, so even a backend
        // that wrongly dereferences it reads valid bytes.
        let fake = unsafe {
            crate::buffer::BufferRef::from_device_ptr(
                host.addr() as u64,
                call.send_len,
                call.dtype,
                0,
                crate::buffer::RawStream::default(),
            )
        };
        return comm.all_reduce(fake, out, call.op);
    }
    let result = match call.collective {
        Collective::AllReduce => comm.all_reduce(send.view(0, call.send_len), out, call.op),
        Collective::ReduceScatter => comm.reduce_scatter(send.view(0, call.send_len), out, call.op),
        Collective::Broadcast => comm.broadcast(out, call.root),
        Collective::AllGather => comm.all_gather(send.view(0, call.send_len), out),
        Collective::Barrier => comm.barrier(),
    };
    // Device backends may report errors of enqueued work only once it has been waited for.
    result
        .and_then(|()| recv.read().map(drop))
        .and_then(|()| comm.async_error())
}
