//! A step on device memory: the all-reduces and the dependent kernel between them,
//! captured once into a CUDA graph and replayed; each replay is framed by events.
//!
//! One eager step comes first (backends set up lazily, which a capture cannot hold);
//! then the graph is captured, replayed once from the initial data and checked against
//! the f64 reference, warmed up and timed.

use std::ffi::c_void;
use std::sync::Arc;
use std::time::Duration;

use comm_core::cuda::cudarc::driver::{CudaContext, CudaFunction, CudaGraph, result, sys};
use comm_core::cuda::{
    DeviceMemory, DeviceOwned, KernelCache, KernelSource, device_count, driver_error, event_times,
    launch_overlapping, record_each, timing_events,
};
use comm_core::{Bootstrap, Communicator, DType, Error, ReduceOp, Result, bf16, f16};

use super::chain;
use super::{Config, How, Timing};

/// The dependent kernel.
pub const STEP_CHAIN: KernelSource = KernelSource {
    name: "step_chain.cu",
    source: include_str!("../../kernels/step_chain.cu"),
};

const THREADS: u32 = 256;

/// A kernel of this crate's `.cu` files, loaded in one device's context.
pub(super) struct StepKernel {
    ctx: Arc<CudaContext>,
    function: CudaFunction,
}

impl StepKernel {
    /// Function `name` of `source`, compiled for `ctx`'s device (cached).
    pub(super) fn load(ctx: &Arc<CudaContext>, source: &KernelSource, name: &str) -> Result<Self> {
        Ok(StepKernel {
            ctx: ctx.clone(),
            function: KernelCache::global().function(ctx, source, name)?,
        })
    }

    /// Enqueues the kernel on `stream`, `blocks` x `threads`.
    ///
    /// # Safety
    /// `params` must point to one value of each of the kernel's parameters, of its type,
    /// and the memory they address must hold what this grid reads and writes.
    pub(super) unsafe fn launch(
        &self,
        blocks: u32,
        threads: u32,
        stream: sys::CUstream,
        params: &mut [*mut c_void],
    ) -> Result<()> {
        // SAFETY: the caller's contract is this one's.
        unsafe { self.launch_as(false, blocks, threads, stream, params) }
    }

    /// [`Self::launch`], with programmatic stream serialization where `overlapping`: the
    /// kernel may then start while the previous kernel of `stream` finishes.
    ///
    /// # Safety
    /// As [`Self::launch`]; and where `overlapping`, the kernel must wait for that previous
    /// kernel (`griddepcontrol.wait`) before it touches memory that kernel may write or read.
    unsafe fn launch_as(
        &self,
        overlapping: bool,
        blocks: u32,
        threads: u32,
        stream: sys::CUstream,
        params: &mut [*mut c_void],
    ) -> Result<()> {
        self.ctx.bind_to_thread().map_err(driver_error)?;
        let function = self.function.cu_function();
        // SAFETY: the function is loaded in this context, which is bound; the caller
        // vouches for the parameters, which the call copies, and for the kernel's wait.
        unsafe {
            if overlapping {
                launch_overlapping(function, (blocks, threads), stream, params)
            } else {
                result::launch_kernel(function, (blocks, 1, 1), (threads, 1, 1), 0, stream, params)
                    .map_err(driver_error)
            }
        }
    }
}

/// `x = y / div + add` of `step_chain.cu`, for one dtype on one device.
struct ChainKernel {
    kernel: StepKernel,
    /// Launched to overlap the all-reduce before it (see [`overlaps`]).
    overlap: bool,
}

impl ChainKernel {
    fn load(ctx: &Arc<CudaContext>, dtype: DType, overlap: bool) -> Result<Self> {
        let name = format!("comm_step_chain_{}", dtype.name());
        Ok(ChainKernel {
            kernel: StepKernel::load(ctx, &STEP_CHAIN, &name)?,
            overlap,
        })
    }

    fn launch(
        &self,
        x: &mut DeviceOwned,
        y: &DeviceOwned,
        div: f32,
        add: f32,
        stream: sys::CUstream,
    ) -> Result<()> {
        let (mut xp, mut yp) = (x.buffer().device_ptr(), y.buffer().device_ptr());
        let mut n = x.len().min(y.len()) as u64;
        let (mut div, mut add) = (div, add);
        let mut params = comm_core::kernel_params![xp, yp, n, div, add];
        // A few blocks per SM at most: the kernel is tiny, its launch is what costs.
        let blocks = n.div_ceil(u64::from(THREADS)).clamp(1, 1024) as u32;
        // SAFETY: the parameters match the kernel's (u64 x, u64 y, u64 n, float div,
        // float add); both buffers hold at least `n` elements; on sm_90+ the kernel waits
        // for the previous one before it reads (step_chain.cu).
        unsafe {
            self.kernel
                .launch_as(self.overlap, blocks, THREADS, stream, &mut params)
        }
    }
}

/// Whether the dependent kernel takes part in programmatic dependent launch, as a serving
/// engine's kernels do on sm_90+: it may start while the all-reduce before it finishes, and
/// lets the next one start early (a backend whose kernels wait for their predecessor, as
/// ours do, overlaps its launch with it; NCCL's are launched plainly and do not). Not where
/// ranks share a device: an early kernel holds its SMs while it waits, and could keep a
/// peer's all-reduce, which this rank's waits for, from starting.
fn overlaps(ctx: &CudaContext, ctl: &dyn Bootstrap) -> Result<bool> {
    let (major, _) = ctx.compute_capability().map_err(driver_error)?;
    Ok(major >= 9 && ctl.local_world_size() <= device_count()?)
}

/// Runs the step of `comm` on this rank's GPU as a graph: checked once, then timed.
pub fn run(comm: &dyn Communicator, ctl: &dyn Bootstrap, cfg: &Config) -> Result<Timing> {
    let (rank, world) = (comm.rank(), comm.world_size());
    let memory = DeviceMemory::new(ctl.local_rank() % device_count()?)?;
    let kernel = ChainKernel::load(
        memory.context(),
        cfg.dtype,
        overlaps(memory.context(), ctl)?,
    )?;
    let init = encode(cfg.dtype, &chain::input(rank, world, cfg.count))?;
    let mut x = memory.alloc(cfg.dtype, cfg.count)?;
    let mut y = memory.alloc(cfg.dtype, cfg.count)?;
    let stream = memory.stream().clone();
    let raw = stream.cu_stream();
    let div = world as f32;
    let step = |x: &mut DeviceOwned, y: &mut DeviceOwned| -> Result<()> {
        for k in 0..cfg.calls {
            comm.all_reduce(
                x.view(0, cfg.count)?,
                y.view_mut(0, cfg.count)?,
                ReduceOp::Sum,
            )?;
            kernel.launch(x, y, div, chain::add(k), raw)?;
        }
        Ok(())
    };
    x.write(&init)?;
    // Every rank has loaded its kernel and allocated before any collective starts: a rank
    // doing either while a peer's kernel spins for it on a shared device would wait for it.
    ctl.barrier()?;
    step(&mut x, &mut y)?;
    memory.synchronize()?;
    ctl.barrier()?;

    let graph = crate::graph::capture(&stream, || step(&mut x, &mut y))?;
    crate::graph::line_up_to_launch(&graph, &memory, ctl)?;

    x.write(&init)?;
    graph.launch().map_err(driver_error)?;
    let got = decode(cfg.dtype, &x.read()?)?;
    let wrong = chain::count_wrong(&got, &chain::reference(world, cfg.count, cfg.calls));

    Ok(Timing {
        step: time_replays(&graph, &memory, ctl, cfg)?,
        wrong,
        how: How::Graph,
    })
}

/// Replays `graph` (captured on `memory`'s stream) `cfg.warmup` times, then `cfg.steps`
/// times between events; returns the median replay. Collective: every rank starts the
/// timed replays together.
pub(super) fn time_replays(
    graph: &CudaGraph,
    memory: &DeviceMemory,
    ctl: &dyn Bootstrap,
    cfg: &Config,
) -> Result<Duration> {
    // Made before the ranks line up, so that no rank starts its clock late.
    let events = timing_events(memory.context(), cfg.steps + 1)?;
    for _ in 0..cfg.warmup {
        graph.launch().map_err(driver_error)?;
    }
    memory.synchronize()?;
    ctl.barrier()?;
    record_each(memory.stream(), &events, || {
        graph.launch().map_err(driver_error)
    })?;
    memory.synchronize()?;
    let mut times = event_times(&events)?;
    Ok(crate::perf::sweep::median(&mut times))
}

fn encode(dtype: DType, values: &[f64]) -> Result<Vec<u8>> {
    Ok(match dtype {
        DType::F32 => values
            .iter()
            .flat_map(|&v| (v as f32).to_le_bytes())
            .collect(),
        DType::F16 => values
            .iter()
            .flat_map(|&v| f16::from_f64(v).to_le_bytes())
            .collect(),
        DType::BF16 => values
            .iter()
            .flat_map(|&v| bf16::from_f64(v).to_le_bytes())
            .collect(),
        other => return Err(unsupported(other)),
    })
}

fn decode(dtype: DType, bytes: &[u8]) -> Result<Vec<f64>> {
    let size = dtype.size();
    let words = bytes.chunks_exact(size);
    Ok(match dtype {
        DType::F32 => words
            .map(|w| f64::from(f32::from_le_bytes(w.try_into().expect("4 bytes"))))
            .collect(),
        DType::F16 => words
            .map(|w| f16::from_le_bytes(w.try_into().expect("2 bytes")).to_f64())
            .collect(),
        DType::BF16 => words
            .map(|w| bf16::from_le_bytes(w.try_into().expect("2 bytes")).to_f64())
            .collect(),
        other => return Err(unsupported(other)),
    })
}

/// The dtypes of `step_chain.cu`.
pub fn unsupported(dtype: DType) -> Error {
    Error::Unsupported(format!("verify-step takes f32, f16 or bf16, not {dtype}"))
}
