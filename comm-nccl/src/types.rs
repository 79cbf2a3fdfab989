//! Our dtypes and ops in NCCL's terms.

use comm_core::{DType, Error, ReduceOp};
use cudarc::nccl::sys::{ncclDataType_t, ncclRedOp_t};

/// The NCCL type of `dtype`.
pub(crate) fn nccl_dtype(dtype: DType) -> Result<ncclDataType_t, Error> {
    Ok(match dtype {
        DType::F32 => ncclDataType_t::ncclFloat32,
        DType::F64 => ncclDataType_t::ncclFloat64,
        DType::F16 => ncclDataType_t::ncclFloat16,
        DType::BF16 => ncclDataType_t::ncclBfloat16,
        DType::I32 => ncclDataType_t::ncclInt32,
        DType::I64 => ncclDataType_t::ncclInt64,
        DType::U8 => ncclDataType_t::ncclUint8,
        other => return Err(Error::Unsupported(format!("nccl: dtype {other}"))),
    })
}

/// The NCCL op of `op` on `dtype` in a world of `world_size` ranks.
///
/// `Avg` across several ranks is refused for now: on integers NCCL divides a wrapping
/// sum, while the workspace defines the integer mean as exact (see [`ReduceOp`]), and
/// [`Capabilities`](comm_core::Capabilities) cannot say "avg on floats only". With one
/// rank the mean is the value itself.
pub(crate) fn nccl_op(op: ReduceOp, dtype: DType, world_size: usize) -> Result<ncclRedOp_t, Error> {
    Ok(match op {
        ReduceOp::Sum => ncclRedOp_t::ncclSum,
        ReduceOp::Prod => ncclRedOp_t::ncclProd,
        ReduceOp::Min => ncclRedOp_t::ncclMin,
        ReduceOp::Max => ncclRedOp_t::ncclMax,
        // The mean of one value is that value: NCCL's sum of one rank is the same copy.
        // Not ncclAvg: NCCL 2.28.3's single-rank average left the last element of an
        // out-of-place f64 call of 4099 elements unwritten (seen on an H200, 2026-11-29).
        ReduceOp::Avg if world_size == 1 => ncclRedOp_t::ncclSum,
        ReduceOp::Avg => {
            return Err(Error::Unsupported(format!(
                "nccl: avg on {dtype} across ranks (NCCL's integer mean wraps; use sum and scale)"
            )));
        }
        other => return Err(Error::Unsupported(format!("nccl: op {other}"))),
    })
}
