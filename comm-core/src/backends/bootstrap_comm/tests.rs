//! `BootstrapComm` over threads and over the TCP store on loopback, against a reference.

use std::time::Duration;

use half::{bf16, f16};

use super::*;
use crate::bootstrap::{EnvBootstrap, ThreadsBootstrap};
use crate::buffer::RawStream;
use crate::communicator::CommunicatorExt;
use crate::conformance::ranks;
use crate::dtype::{DType, Element};

/// Test values: small integers, exact in every dtype, so the reference is easy to state.
trait Value: Element {
    fn from_i64(v: i64) -> Self;
}

macro_rules! value {
    ($($t:ty: $conv:expr),* $(,)?) => {$(
        impl Value for $t {
            fn from_i64(v: i64) -> Self {
                $conv(v)
            }
        }
    )*};
}

value!(
    f32: |v| v as f32,
    f64: |v| v as f64,
    f16: |v| f16::from_f32(v as f32),
    bf16: |v| bf16::from_f32(v as f32),
    i32: |v| v as i32,
    i64: |v| v,
    u8: |v| v as u8,
);

/// Rank `rank`'s input: small values, negative ones too except for `u8`.
fn input(dtype: DType, rank: usize, len: usize) -> Vec<i64> {
    let shift = if dtype == DType::U8 { 0 } else { 4 };
    (0..len)
        .map(|i| ((rank * 7 + i * 3) % 9) as i64 - shift)
        .collect()
}

/// The reduction of every rank's input, computed the simple way in rank order, as bytes.
fn reference<T: Value>(op: ReduceOp, world: usize, len: usize) -> Vec<u8> {
    let inputs: Vec<Vec<i64>> = (0..world).map(|r| input(T::DTYPE, r, len)).collect();
    let out: Vec<T> = (0..len)
        .map(|i| {
            let column = inputs.iter().map(|v| v[i]);
            match T::DTYPE {
                DType::I32 | DType::I64 | DType::U8 => {
                    let c: Vec<i128> = column.map(i128::from).collect();
                    let v = match op {
                        ReduceOp::Sum => c.iter().sum(),
                        ReduceOp::Prod => c.iter().product(),
                        ReduceOp::Min => *c.iter().min().unwrap(),
                        ReduceOp::Max => *c.iter().max().unwrap(),
                        ReduceOp::Avg => c.iter().sum::<i128>() / world as i128,
                    };
                    // Wraps to the element type the way the backend documents.
                    T::from_i64(v as i64)
                }
                DType::F64 => {
                    let c: Vec<f64> = column.map(|v| v as f64).collect();
                    let v = fold_float(op, &c, world);
                    bytemuck::cast(v)
                }
                _ => {
                    // f32, and f16/bf16 accumulated in f32.
                    let c: Vec<f32> = column.map(|v| v as f32).collect();
                    let v = fold_float(op, &c, world);
                    match T::DTYPE {
                        DType::F32 => bytemuck::cast(v),
                        DType::F16 => bytemuck::cast(f16::from_f32(v)),
                        _ => bytemuck::cast(bf16::from_f32(v)),
                    }
                }
            }
        })
        .collect();
    bytemuck::cast_slice(&out).to_vec()
}

fn fold_float<F>(op: ReduceOp, c: &[F], world: usize) -> F
where
    F: Copy
        + std::ops::Add<Output = F>
        + std::ops::Mul<Output = F>
        + std::ops::Div<Output = F>
        + PartialOrd
        + From<u8>,
{
    let mut acc = c[0];
    for &x in &c[1..] {
        acc = match op {
            ReduceOp::Sum | ReduceOp::Avg => acc + x,
            ReduceOp::Prod => acc * x,
            ReduceOp::Min => {
                if x < acc {
                    x
                } else {
                    acc
                }
            }
            ReduceOp::Max => {
                if x > acc {
                    x
                } else {
                    acc
                }
            }
        };
    }
    if op == ReduceOp::Avg {
        acc / F::from(world as u8)
    } else {
        acc
    }
}

fn bytes<T: Element>(v: &[T]) -> &[u8] {
    bytemuck::cast_slice(v)
}

/// Every collective on one dtype, every op, against the reference.
fn check_dtype<T: Value, C: Communicator>(comm: &C, len: usize) {
    let world = comm.world_size();
    let me = comm.rank();
    let mine: Vec<T> = input(T::DTYPE, me, len)
        .into_iter()
        .map(T::from_i64)
        .collect();
    for op in ReduceOp::ALL {
        let want = reference::<T>(op, world, len);
        let what = format!("{} {op} x {len} on rank {me} of {world}", T::DTYPE);
        let mut out = vec![T::zeroed(); len];
        comm.all_reduce_slice(&mine, &mut out, op).unwrap();
        assert_eq!(bytes(&out), &want[..], "all_reduce {what}");
        let mut buf = mine.clone();
        comm.all_reduce_in_place_slice(&mut buf, op).unwrap();
        assert_eq!(bytes(&buf), &want[..], "all_reduce_in_place {what}");
        // Reduce-scatter of every rank's input repeated `world` times... shaped so that
        // rank r's share is the whole reference.
        let mut send = Vec::with_capacity(len * world);
        for _ in 0..world {
            send.extend_from_slice(&mine);
        }
        let got = comm.reduce_scatter_vec(&send, op).unwrap();
        assert_eq!(bytes(&got), &want[..], "reduce_scatter {what}");
    }
    let gathered = comm.all_gather_vec(&mine).unwrap();
    for r in 0..world {
        let theirs: Vec<T> = input(T::DTYPE, r, len)
            .into_iter()
            .map(T::from_i64)
            .collect();
        assert_eq!(
            &gathered[r * len..(r + 1) * len],
            &theirs[..],
            "all_gather from {r}"
        );
    }
    for root in 0..world {
        let mut buf = if me == root {
            mine.clone()
        } else {
            vec![T::zeroed(); len]
        };
        comm.broadcast_slice(&mut buf, root).unwrap();
        let theirs: Vec<T> = input(T::DTYPE, root, len)
            .into_iter()
            .map(T::from_i64)
            .collect();
        assert_eq!(buf, theirs, "broadcast from {root}");
    }
    comm.barrier().unwrap();
}

fn check_everything<C: Communicator>(comm: &C) {
    for len in [0, 1, 7, 1030] {
        check_dtype::<f32, _>(comm, len);
        check_dtype::<f64, _>(comm, len);
        check_dtype::<f16, _>(comm, len);
        check_dtype::<bf16, _>(comm, len);
        check_dtype::<i32, _>(comm, len);
        check_dtype::<i64, _>(comm, len);
        check_dtype::<u8, _>(comm, len);
    }
}

/// Runs `body` on every rank of a threads-bootstrap group of `n`.
fn on_threads<T: Send + 'static>(
    n: usize,
    timeout: Duration,
    body: impl Fn(BootstrapComm<ThreadsBootstrap>) -> T + Send + Sync + Clone + 'static,
) -> Vec<T> {
    ranks::on_threads(n, timeout, move |boot| body(BootstrapComm::new(boot)))
}

/// Runs `body` on every rank of a TCP-store group of `n` on loopback.
fn on_tcp<T: Send + 'static>(
    n: usize,
    timeout: Duration,
    body: impl Fn(BootstrapComm<EnvBootstrap>) -> T + Send + Sync + Clone + 'static,
) -> Vec<T> {
    ranks::on_loopback(n, timeout, move |boot| body(BootstrapComm::new(boot)))
}

const LONG: Duration = Duration::from_secs(60);

#[test]
fn every_collective_dtype_and_op_over_threads() {
    for n in 1..=4 {
        on_threads(n, LONG, |comm| {
            assert_eq!(comm.name(), "bootstrap");
            check_everything(&comm)
        });
    }
}

#[test]
fn every_collective_dtype_and_op_over_tcp() {
    on_tcp(3, LONG, |comm| check_everything(&comm));
}

/// Mismatched calls and invalid arguments fail on every rank, and the group goes on.
fn bad_calls_fail_everywhere<C: Communicator>(comm: &C) {
    let me = comm.rank();
    // Rank 1 sends a different count.
    let mut x = vec![1.0f32; if me == 1 { 5 } else { 4 }];
    let err = comm
        .all_reduce_in_place_slice(&mut x, ReduceOp::Sum)
        .unwrap_err();
    assert!(
        matches!(&err, Error::Mismatch(m) if m.contains("rank 1")),
        "rank {me}: {err}"
    );
    // Rank 0 asks for a different op.
    let op = if me == 0 {
        ReduceOp::Max
    } else {
        ReduceOp::Min
    };
    let err = comm
        .all_reduce_in_place_slice(&mut [1i32; 3], op)
        .unwrap_err();
    assert!(matches!(err, Error::Mismatch(_)), "rank {me}: {err}");
    // Rank 2 passes a recv buffer of the wrong size: it gets InvalidArgument, the others
    // a Mismatch naming it.
    let send = [1u8; 4];
    let mut recv = vec![0u8; if me == 2 { 3 } else { 4 }];
    let err = comm
        .all_reduce_slice(&send, &mut recv, ReduceOp::Sum)
        .unwrap_err();
    if me == 2 {
        assert!(matches!(err, Error::InvalidArgument(_)), "rank {me}: {err}");
    } else {
        assert!(
            matches!(&err, Error::Mismatch(m) if m.contains("rank 2")),
            "rank {me}: {err}"
        );
    }
    // A broadcast root outside the world, and a barrier against a broadcast.
    let err = comm.broadcast_slice(&mut [0f64; 2], 7).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "rank {me}: {err}");
    let err = if me == 0 {
        comm.barrier()
    } else {
        comm.broadcast_slice(&mut [0f64; 2], 0)
    }
    .unwrap_err();
    assert!(matches!(err, Error::Mismatch(_)), "rank {me}: {err}");
    // Device memory is refused on every rank.
    // SAFETY: the view is never dereferenced: the backend refuses device memory.
    let dev = unsafe { BufferMut::from_device_ptr(0x1000, 4, DType::F32, 0, RawStream(0)) };
    let err = comm.all_reduce_in_place(dev, ReduceOp::Sum).unwrap_err();
    assert!(matches!(err, Error::Unsupported(_)), "rank {me}: {err}");
    // After all that, the group still works.
    let mut ok = [me as i64 + 1];
    comm.all_reduce_in_place_slice(&mut ok, ReduceOp::Sum)
        .unwrap();
    assert_eq!(ok[0], 6);
}

#[test]
fn bad_calls_fail_on_every_rank_over_threads() {
    on_threads(3, LONG, |comm| bad_calls_fail_everywhere(&comm));
}

#[test]
fn bad_calls_fail_on_every_rank_over_tcp() {
    on_tcp(3, LONG, |comm| bad_calls_fail_everywhere(&comm));
}

/// Rank 1 skips an all-reduce: the others time out, and later calls are refused.
fn a_skipped_call_times_out<C: Communicator>(comm: &C, bound: Duration) -> Option<Error> {
    comm.barrier().unwrap();
    if comm.rank() == 1 {
        // Outlive the others' timeout, holding the connection open.
        std::thread::sleep(bound * 3);
        return None;
    }
    let start = std::time::Instant::now();
    let err = comm
        .all_reduce_in_place_slice(&mut [1f32; 8], ReduceOp::Sum)
        .unwrap_err();
    assert!(
        start.elapsed() < bound + Duration::from_secs(3),
        "{:?}",
        start.elapsed()
    );
    assert!(err.is_fatal(), "rank {}: {err}", comm.rank());
    let later = comm.barrier().unwrap_err();
    assert!(
        matches!(later, Error::Aborted(_)),
        "rank {}: {later}",
        comm.rank()
    );
    Some(err)
}

#[test]
fn a_rank_that_skips_a_call_is_a_timeout_over_threads() {
    let bound = Duration::from_millis(300);
    let errs = on_threads(3, bound, move |comm| a_skipped_call_times_out(&comm, bound));
    assert!(
        errs.iter()
            .flatten()
            .any(|e| matches!(e, Error::Timeout { .. })),
        "{errs:?}"
    );
}

#[test]
fn a_rank_that_skips_a_call_is_a_timeout_over_tcp() {
    let bound = Duration::from_millis(300);
    let errs = on_tcp(3, bound, move |comm| a_skipped_call_times_out(&comm, bound));
    for e in errs.iter().flatten() {
        assert!(matches!(e, Error::Timeout { .. }), "{e}");
    }
}
