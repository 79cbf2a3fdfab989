//! The kernels of `kernels/ipc_allreduce.cu`: loading, the argument block, grid sizes and
//! the launch.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Arc;

use comm_core::cuda::cudarc::driver::{CudaContext, CudaFunction, result};
use comm_core::cuda::stream::cu_stream;
use comm_core::cuda::{KernelCache, KernelSource, driver_error};
use comm_core::{DType, Error, RawStream, ReduceOp, Result};

use crate::algo::Algorithm;
use crate::layout::MAX_BLOCKS;

/// The all-reduce kernels (`ipc_<algorithm>_<dtype>_<op>`).
pub const ALLREDUCE: KernelSource = KernelSource {
    name: "ipc_allreduce.cu",
    source: include_str!("../kernels/ipc_allreduce.cu"),
};

/// Dtypes the kernels handle.
pub const DTYPES: [DType; 3] = [DType::F32, DType::F16, DType::BF16];
/// Ops the kernels handle.
pub const OPS: [ReduceOp; 4] = [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min];

/// The kernels' `IpcArgs`, field for field.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct KernelArgs {
    pub input: u64,
    pub output: u64,
    pub regions: u64,
    pub inputs: u64,
    pub status: u64,
    pub in_off: u64,
    pub count: u64,
    pub cap: u64,
    pub slice_cap: u64,
    pub off_data: u64,
    pub off_tmp: u64,
    pub off_push: u64,
    pub off_recv: u64,
    pub off_result: u64,
    pub timeout_ns: u64,
    pub rank: u32,
    pub world: u32,
    pub aligned: u32,
    pub gpu_scope: u32,
}

/// Elements in one 16-byte vector.
pub(crate) fn vec_elems(dtype: DType) -> usize {
    16 / dtype.size()
}

/// Blocks for one call: enough for one vector per thread, at most `max_blocks`. Every rank
/// computes the same number (the per-block barriers pair blocks by index).
pub(crate) fn grid(
    algorithm: Algorithm,
    dtype: DType,
    count: usize,
    world: usize,
    threads: u32,
    max_blocks: u32,
) -> u32 {
    let nvec = count.div_ceil(vec_elems(dtype));
    let work = match algorithm {
        Algorithm::OneshotPull | Algorithm::OneshotPush => nvec,
        Algorithm::TwoshotPull | Algorithm::TwoshotPush => nvec.div_ceil(world.max(1)),
    };
    work.div_ceil(threads as usize)
        .clamp(1, max_blocks.clamp(1, MAX_BLOCKS) as usize) as u32
}

/// Every all-reduce kernel, loaded into one context.
#[derive(Debug)]
pub(crate) struct Kernels {
    ctx: Arc<CudaContext>,
    functions: HashMap<(Algorithm, DType, ReduceOp), CudaFunction>,
}

impl Kernels {
    /// Compiles (or finds in the cache) and loads every kernel.
    pub(crate) fn load(ctx: &Arc<CudaContext>) -> Result<Self> {
        let cache = KernelCache::global();
        let mut functions = HashMap::new();
        for algorithm in Algorithm::ALL {
            for dtype in DTYPES {
                for op in OPS {
                    let name = format!(
                        "ipc_{}_{}_{}",
                        algorithm.kernel_stem(),
                        dtype.name(),
                        op.name()
                    );
                    functions.insert(
                        (algorithm, dtype, op),
                        cache.function(ctx, &ALLREDUCE, &name)?,
                    );
                }
            }
        }
        Ok(Kernels {
            ctx: ctx.clone(),
            functions,
        })
    }

    /// Enqueues the kernel of `(algorithm, dtype, op)` on `stream` with `(blocks,
    /// threads)`.
    pub(crate) fn launch(
        &self,
        kernel: (Algorithm, DType, ReduceOp),
        (blocks, threads): (u32, u32),
        stream: RawStream,
        args: &KernelArgs,
    ) -> Result<()> {
        let (algorithm, dtype, op) = kernel;
        let f = self.functions.get(&kernel).ok_or_else(|| {
            Error::Unsupported(format!("ipc: no kernel for {algorithm} {dtype} {op}"))
        })?;
        self.ctx.bind_to_thread().map_err(driver_error)?;
        let mut args = *args;
        let mut params = [&mut args as *mut KernelArgs as *mut c_void];
        // SAFETY: the function comes from a module loaded into this context; its one
        // parameter is `IpcArgs`, which `KernelArgs` mirrors (#[repr(C)]); the driver
        // copies the parameter before returning.
        unsafe {
            result::launch_kernel(
                f.cu_function(),
                (blocks, 1, 1),
                (threads, 1, 1),
                0,
                cu_stream(stream),
                &mut params,
            )
        }
        .map_err(driver_error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn args_match_the_kernel_struct() {
        // 15 u64 + 4 u32, no padding: the kernel's IpcArgs.
        assert_eq!(std::mem::size_of::<KernelArgs>(), 15 * 8 + 4 * 4);
        assert_eq!(std::mem::align_of::<KernelArgs>(), 8);
    }

    #[test]
    fn grids_are_bounded_and_cover_small_messages_with_one_block() {
        let g = |a, count| grid(a, DType::BF16, count, 8, 512, 16);
        assert_eq!(g(Algorithm::OneshotPull, 1), 1);
        assert_eq!(g(Algorithm::OneshotPull, 21504), 6); // 42 KB bf16: 2688 vectors
        assert_eq!(g(Algorithm::TwoshotPull, 21504), 1);
        assert_eq!(g(Algorithm::TwoshotPush, 32 << 20), 16);
        assert_eq!(
            grid(Algorithm::OneshotPush, DType::F32, 1 << 30, 2, 512, 1000),
            MAX_BLOCKS
        );
    }

    #[test]
    fn every_kernel_name_is_in_the_source() {
        // The names come from macros; check the stems and suffixes they are built from.
        for a in Algorithm::ALL {
            assert!(
                ALLREDUCE
                    .source
                    .contains(&format!(", {})", a.kernel_stem()))
            );
        }
        for d in DTYPES {
            assert!(ALLREDUCE.source.contains(&format!(", {})", d.name())));
        }
        for o in OPS {
            assert!(ALLREDUCE.source.contains(&format!(", {})", o.name())));
        }
    }
}
