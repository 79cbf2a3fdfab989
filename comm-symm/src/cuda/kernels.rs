//! The kernels of `kernels/symm.cuh` + `kernels/symm_collectives.cu`: the source
//! registration, the argument block, lazy loading by name and the launch.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Arc;

use comm_core::cuda::cudarc::driver::{CudaContext, CudaFunction, result};
use comm_core::cuda::stream::cu_stream;
use comm_core::cuda::{KernelCache, KernelSource, driver_error};
use comm_core::{DType, Error, RawStream, ReduceOp, Result};

/// Every kernel of the CUDA backing: the heap's header (`symm.cuh`) and the collectives,
/// as one NVRTC program (the header is prepended, so no include path is needed).
pub const COLLECTIVES: KernelSource = KernelSource {
    name: "symm_collectives.cu",
    source: concat!(
        include_str!("../../kernels/symm.cuh"),
        include_str!("../../kernels/symm_collectives.cu")
    ),
};

/// Every kernel source of `comm-symm` (for the `kernels` builder).
pub const KERNELS: &[KernelSource] = &[COLLECTIVES];

/// Dtypes the device collectives handle.
pub const DTYPES: [DType; 3] = [DType::F32, DType::F16, DType::BF16];
/// Ops the device collectives handle.
pub const OPS: [ReduceOp; 4] = [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min];

/// The kernels' `SymmArgs`, field for field.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct SymmArgs {
    pub input: u64,
    pub output: u64,
    pub residual: u64,
    pub weight: u64,
    pub peers: u64,
    pub status: u64,
    pub count: u64,
    pub cap: u64,
    pub lcap: u64,
    pub off_data: u64,
    pub off_tmp: u64,
    pub off_lamport: u64,
    pub timeout_ns: u64,
    pub hidden: u64,
    pub eps: f32,
    pub rank: u32,
    pub world: u32,
    pub aligned: u32,
    pub gpu_scope: u32,
    pub root: u32,
    pub peer: u32,
    pub channel: u32,
}

/// The module of one context and every function of it.
#[derive(Debug)]
pub(crate) struct Kernels {
    ctx: Arc<CudaContext>,
    functions: HashMap<String, CudaFunction>,
}

/// Every kernel of [`COLLECTIVES`], by name.
fn every_kernel_name() -> Vec<String> {
    let mut names: Vec<String> = [
        "all_gather",
        "broadcast",
        "fused_rmsnorm_lamport",
        "fused_rmsnorm_oneshot",
        "barrier_kernel",
        "put_signal_kernel",
        "wait_signal_kernel",
    ]
    .iter()
    .map(|k| format!("symm_{k}"))
    .collect();
    for stem in ["oneshot", "twoshot", "lamport", "reduce_scatter"] {
        for dtype in DTYPES {
            for op in OPS {
                names.push(kernel_name(stem, dtype, op));
            }
        }
    }
    names
}

impl Kernels {
    /// Compiles (or finds in the cache) and loads the module and every function of it.
    ///
    /// All of them now, not at first use: under CUDA's lazy loading, getting a function
    /// loads it and may wait for the whole context, and a rank that did so while a peer's
    /// kernel spins on the same device waiting for this rank would never return.
    pub(crate) fn load(ctx: &Arc<CudaContext>) -> Result<Self> {
        let cache = KernelCache::global();
        let functions = every_kernel_name()
            .into_iter()
            .map(|name| {
                let f = cache.function(ctx, &COLLECTIVES, &name)?;
                Ok((name, f))
            })
            .collect::<Result<_>>()?;
        Ok(Kernels {
            ctx: ctx.clone(),
            functions,
        })
    }

    fn function(&self, name: &str) -> Result<&CudaFunction> {
        self.functions.get(name).ok_or_else(|| Error::Backend {
            backend: "cuda",
            source: format!("symm: no kernel named {name}").into(),
        })
    }

    /// Enqueues kernel `name` on `stream` with `(blocks, threads)`.
    pub(crate) fn launch(
        &self,
        name: &str,
        (blocks, threads): (u32, u32),
        stream: RawStream,
        args: &SymmArgs,
    ) -> Result<()> {
        let f = self.function(name)?;
        self.ctx.bind_to_thread().map_err(driver_error)?;
        let mut args = *args;
        let mut params = [&mut args as *mut SymmArgs as *mut c_void];
        // SAFETY: the function comes from a module loaded into this context; its one
        // parameter is `SymmArgs`, mirrored here (#[repr(C)]); the driver copies the
        // parameter before returning.
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

/// The name of an all-reduce or reduce-scatter kernel: `symm_<stem>_<dtype>_<op>`.
pub(crate) fn kernel_name(stem: &str, dtype: DType, op: ReduceOp) -> String {
    format!("symm_{stem}_{}_{}", dtype.name(), op.name())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn args_match_the_kernel_struct() {
        // 14 u64, one f32, 7 u32: no padding.
        assert_eq!(std::mem::size_of::<SymmArgs>(), 14 * 8 + 8 * 4);
        assert_eq!(std::mem::align_of::<SymmArgs>(), 8);
    }

    #[test]
    fn every_kernel_name_is_built_by_the_source() {
        let src = COLLECTIVES.source;
        for stem in ["oneshot", "twoshot", "lamport"] {
            assert!(src.contains(&format!(", {stem}, DT")), "{stem}");
        }
        for d in DTYPES {
            assert!(src.contains(&format!(
                "SYMM_DTYPE(COMM_{}, {})",
                d.name().to_uppercase(),
                d.name()
            )));
        }
        for o in OPS {
            assert!(src.contains(&format!(", {})", o.name())), "{o}");
        }
        for k in [
            "symm_all_gather(",
            "symm_broadcast(",
            "symm_fused_rmsnorm_lamport(",
            "symm_fused_rmsnorm_oneshot(",
            "symm_barrier_kernel(",
            "symm_put_signal_kernel(",
            "symm_wait_signal_kernel(",
            "symm_reduce_scatter_##DNAME",
        ] {
            assert!(src.contains(k), "{k}");
        }
        assert!(!src.contains("#include \"symm.cuh\""));
    }
}
