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

/// The NCCL op of `op` on `dtype`.
///
/// Integer `Avg` is refused: NCCL divides a wrapping sum, while the workspace defines the
/// integer mean as exact (see [`ReduceOp`]); they differ whenever the sum overflows.
pub(crate) fn nccl_op(op: ReduceOp, dtype: DType) -> Result<ncclRedOp_t, Error> {
    Ok(match op {
        ReduceOp::Sum => ncclRedOp_t::ncclSum,
        ReduceOp::Prod => ncclRedOp_t::ncclProd,
        ReduceOp::Min => ncclRedOp_t::ncclMin,
        ReduceOp::Max => ncclRedOp_t::ncclMax,
        ReduceOp::Avg if dtype.is_float() => ncclRedOp_t::ncclAvg,
        ReduceOp::Avg => {
            return Err(Error::Unsupported(format!(
                "nccl: avg on {dtype} (NCCL divides a wrapping sum; the exact integer mean is not available)"
            )));
        }
        other => return Err(Error::Unsupported(format!("nccl: op {other}"))),
    })
}
