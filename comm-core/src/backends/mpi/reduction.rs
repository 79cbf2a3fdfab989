//! How each (dtype, op) of a reduction maps onto MPI, so that results follow
//! [`ReduceOp`]'s definitions on every dtype.
//!
//! | dtype, op | on the wire |
//! |---|---|
//! | f32, f64: sum, prod, min, max | MPI's own op on `MPI_FLOAT`/`MPI_DOUBLE` |
//! | f32, f64: avg | `MPI_SUM`, then each element divided by the world size |
//! | i32, i64: sum, prod | `MPI_SUM`/`MPI_PROD` on `MPI_UINT32_T`/`MPI_UINT64_T`: wrapping, as defined, with no signed overflow in C |
//! | i32, i64, u8: min, max | MPI's own op on the integer type |
//! | u8: sum, prod | widened to `MPI_UINT32_T`, reduced (wrapping mod 2^32, hence mod 2^8), truncated: Open MPI 4.1's AVX reduction component *saturates* 8-bit sums |
//! | i32, u8: avg | widened to i64, `MPI_SUM` (cannot overflow), divided toward zero |
//! | i64: avg | each value split into a signed high and an unsigned low 32-bit half, both summed as i64 (cannot overflow below 2^31 ranks), recombined in i128 and divided toward zero: the exact mean |
//! | f16, bf16: any | widened to f32, reduced in f32 (avg: summed, then divided in f32), rounded once to the dtype |
//!
//! MPI combines contributions in an order of its choosing, so float sums may differ in the
//! last bits from a rank-order reduction; every rank still gets the same bits, because
//! MPI computes each reduced element once and distributes it (Open MPI and MPICH do, for
//! commutative operators), which the tests check. Min/max with NaN follow MPI (C `<`).

use std::ffi::{c_int, c_void};

use ::mpi::ffi;
use half::{bf16, f16};

use crate::dtype::{DType, ReduceOp};
use crate::error::{Error, Result};
use crate::mpi_process::{Handle, MpiProcess};

/// How one reduction travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Plan {
    /// MPI reduces the elements as they are; `divide` for float avg.
    Native { divide: bool },
    /// f16/bf16 through f32.
    ViaF32,
    /// i32/u8 avg through an i64 sum.
    WideSum,
    /// u8 sum/prod through u32.
    Wide32,
    /// i64 avg through (high, low) i64 pairs.
    SplitSum,
}

fn plan(dtype: DType, op: ReduceOp) -> Plan {
    match (dtype, op) {
        (DType::F16 | DType::BF16, _) => Plan::ViaF32,
        (DType::I32 | DType::U8, ReduceOp::Avg) => Plan::WideSum,
        (DType::U8, ReduceOp::Sum | ReduceOp::Prod) => Plan::Wide32,
        (DType::I64, ReduceOp::Avg) => Plan::SplitSum,
        (_, op) => Plan::Native {
            divide: op == ReduceOp::Avg,
        },
    }
}

/// Elements on the wire for `count` elements of `dtype`.
pub(super) fn wire_count(dtype: DType, op: ReduceOp, count: usize) -> usize {
    match plan(dtype, op) {
        Plan::SplitSum => count.saturating_mul(2),
        _ => count,
    }
}

/// Whether a reduction leaves every rank the whole result or its share.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Shape {
    /// `MPI_Allreduce`.
    All,
    /// `MPI_Reduce_scatter_block`: each rank receives `out.len()` of the result.
    Scatter,
}

/// Runs reductions on one communicator.
pub(super) struct Reducer<'a> {
    pub(super) mpi: &'a MpiProcess,
    pub(super) comm: Handle<ffi::MPI_Comm>,
    pub(super) world_size: usize,
}

impl Reducer<'_> {
    /// Reduces `send` (or, when `None`, `out` itself, in place) into `out`.
    pub(super) fn reduce(
        &self,
        shape: Shape,
        dtype: DType,
        op: ReduceOp,
        send: Option<&[u8]>,
        out: &mut [u8],
    ) -> Result<()> {
        let n = self.world_size;
        match plan(dtype, op) {
            Plan::Native { divide } => {
                let (datatype, mpi_op) = native(dtype, op);
                let elems = out.len() / dtype.size();
                self.run(shape, datatype, mpi_op, send, out, elems)?;
                if divide {
                    match dtype {
                        DType::F32 => cast_mut::<f32>(out)?
                            .iter_mut()
                            .for_each(|x| *x /= n as f32),
                        _ => cast_mut::<f64>(out)?
                            .iter_mut()
                            .for_each(|x| *x /= n as f64),
                    }
                }
                Ok(())
            }
            Plan::ViaF32 => {
                let input = send.unwrap_or(out);
                let wide: Vec<f32> = match dtype {
                    DType::F16 => cast::<f16>(input)?.iter().map(|x| x.to_f32()).collect(),
                    _ => cast::<bf16>(input)?.iter().map(|x| x.to_f32()).collect(),
                };
                let mut result = vec![0f32; out.len() / 2];
                let wire_op = if op == ReduceOp::Avg {
                    ReduceOp::Sum
                } else {
                    op
                };
                let (datatype, mpi_op) = native(DType::F32, wire_op);
                let len = result.len();
                self.run(
                    shape,
                    datatype,
                    mpi_op,
                    Some(bytemuck::cast_slice(&wide)),
                    bytemuck::cast_slice_mut(&mut result),
                    len,
                )?;
                let finish = |x: f32| if op == ReduceOp::Avg { x / n as f32 } else { x };
                match dtype {
                    DType::F16 => cast_mut::<f16>(out)?
                        .iter_mut()
                        .zip(&result)
                        .for_each(|(o, &x)| *o = f16::from_f32(finish(x))),
                    _ => cast_mut::<bf16>(out)?
                        .iter_mut()
                        .zip(&result)
                        .for_each(|(o, &x)| *o = bf16::from_f32(finish(x))),
                }
                Ok(())
            }
            Plan::WideSum => {
                let input = send.unwrap_or(out);
                let wide: Vec<i64> = match dtype {
                    DType::I32 => cast::<i32>(input)?.iter().map(|&x| i64::from(x)).collect(),
                    _ => input.iter().map(|&x| i64::from(x)).collect(),
                };
                let elems = out.len() / dtype.size();
                let sums = self.sum_i64(shape, &wide, elems)?;
                match dtype {
                    DType::I32 => cast_mut::<i32>(out)?
                        .iter_mut()
                        .zip(&sums)
                        .for_each(|(o, &s)| *o = (s / n as i64) as i32),
                    _ => out
                        .iter_mut()
                        .zip(&sums)
                        .for_each(|(o, &s)| *o = (s / n as i64) as u8),
                }
                Ok(())
            }
            Plan::Wide32 => {
                let input = send.unwrap_or(out);
                let wide: Vec<u32> = input.iter().map(|&x| u32::from(x)).collect();
                let mut result = vec![0u32; out.len()];
                // SAFETY: reading an immutable handle exported by the MPI shim.
                let datatype = unsafe { ffi::RSMPI_UINT32_T };
                let (_, mpi_op) = native(DType::U8, op);
                let len = result.len();
                self.run(
                    shape,
                    datatype,
                    mpi_op,
                    Some(bytemuck::cast_slice(&wide)),
                    bytemuck::cast_slice_mut(&mut result),
                    len,
                )?;
                out.iter_mut().zip(&result).for_each(|(o, &x)| *o = x as u8);
                Ok(())
            }
            Plan::SplitSum => {
                let input = send.unwrap_or(out);
                let halves: Vec<i64> = cast::<i64>(input)?
                    .iter()
                    .flat_map(|&x| [x >> 32, x & 0xffff_ffff])
                    .collect();
                let elems = out.len() / 8;
                let sums = self.sum_i64(shape, &halves, 2 * elems)?;
                cast_mut::<i64>(out)?
                    .iter_mut()
                    .zip(sums.chunks_exact(2))
                    .for_each(|(o, s)| {
                        let total = (i128::from(s[0]) << 32) + i128::from(s[1]);
                        *o = (total / n as i128) as i64;
                    });
                Ok(())
            }
        }
    }

    /// Sums i64 `input` into a new vector of `out_elems`.
    fn sum_i64(&self, shape: Shape, input: &[i64], out_elems: usize) -> Result<Vec<i64>> {
        let mut sums = vec![0i64; out_elems];
        // SAFETY: reading immutable handles exported by the MPI shim.
        let (datatype, op) = unsafe { (ffi::RSMPI_INT64_T, ffi::RSMPI_SUM) };
        self.run(
            shape,
            datatype,
            op,
            Some(bytemuck::cast_slice(input)),
            bytemuck::cast_slice_mut(&mut sums),
            out_elems,
        )?;
        Ok(sums)
    }

    /// One MPI reduction of `send` (or `out` in place) into `out_elems` elements of `out`.
    fn run(
        &self,
        shape: Shape,
        datatype: ffi::MPI_Datatype,
        op: ffi::MPI_Op,
        send: Option<&[u8]>,
        out: &mut [u8],
        out_elems: usize,
    ) -> Result<()> {
        let recv_count = c_int::try_from(out_elems)
            .map_err(|_| Error::Unsupported(format!("mpi: {out_elems} elements in one call")))?;
        // In place without a known MPI_IN_PLACE: reduce from a copy.
        let copy;
        let send_ptr: *const c_void = match (send, self.mpi.in_place()) {
            (Some(s), _) => s.as_ptr().cast(),
            (None, Some(in_place)) => in_place,
            (None, None) => {
                copy = out.to_vec();
                copy.as_ptr().cast()
            }
        };
        let recv_ptr: *mut c_void = out.as_mut_ptr().cast();
        let comm = self.comm.0;
        match shape {
            Shape::All => self.mpi.call("MPI_Allreduce", || {
                // SAFETY: send holds `out_elems` elements of `datatype` (or is MPI_IN_PLACE)
                // and `out` as many; both stay borrowed for the (blocking) call.
                unsafe { ffi::MPI_Allreduce(send_ptr, recv_ptr, recv_count, datatype, op, comm) }
            }),
            Shape::Scatter => self.mpi.call("MPI_Reduce_scatter_block", || {
                // SAFETY: send holds world_size * `out_elems` elements of `datatype`, `out`
                // holds `out_elems`; both stay borrowed for the (blocking) call.
                unsafe {
                    ffi::MPI_Reduce_scatter_block(
                        send_ptr, recv_ptr, recv_count, datatype, op, comm,
                    )
                }
            }),
        }
    }
}

/// MPI's datatype and operator for a natively reduced pair.
fn native(dtype: DType, op: ReduceOp) -> (ffi::MPI_Datatype, ffi::MPI_Op) {
    // SAFETY: reading immutable handles exported by the MPI shim.
    unsafe {
        let wrapping = matches!(op, ReduceOp::Sum | ReduceOp::Prod);
        let datatype = match dtype {
            DType::F32 | DType::F16 | DType::BF16 => ffi::RSMPI_FLOAT,
            DType::F64 => ffi::RSMPI_DOUBLE,
            DType::I32 if wrapping => ffi::RSMPI_UINT32_T,
            DType::I32 => ffi::RSMPI_INT32_T,
            DType::I64 if wrapping => ffi::RSMPI_UINT64_T,
            DType::I64 => ffi::RSMPI_INT64_T,
            DType::U8 => ffi::RSMPI_UINT8_T,
        };
        let op = match op {
            ReduceOp::Sum | ReduceOp::Avg => ffi::RSMPI_SUM,
            ReduceOp::Prod => ffi::RSMPI_PROD,
            ReduceOp::Min => ffi::RSMPI_MIN,
            ReduceOp::Max => ffi::RSMPI_MAX,
        };
        (datatype, op)
    }
}

fn cast<T: bytemuck::Pod>(bytes: &[u8]) -> Result<&[T]> {
    bytemuck::try_cast_slice(bytes).map_err(|e| {
        Error::InvalidArgument(format!("mpi: buffer is not a slice of its dtype: {e}"))
    })
}

fn cast_mut<T: bytemuck::Pod>(bytes: &mut [u8]) -> Result<&mut [T]> {
    bytemuck::try_cast_slice_mut(bytes).map_err(|e| {
        Error::InvalidArgument(format!("mpi: buffer is not a slice of its dtype: {e}"))
    })
}
