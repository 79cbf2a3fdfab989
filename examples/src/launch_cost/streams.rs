//! Concurrent graphs: what a kernel costs the GPU when several streams replay graphs of
//! kernels at once, as ranks that are threads sharing one GPU do (each replays its own
//! graph of all-reduces on its own stream). Each stream replays a graph of `kernels` empty
//! kernels; all replays start together (the streams wait for an event of the first) and the
//! first stream waits for every other before the closing event. If the per-round time
//! grows with the streams while the kernels do nothing, the GPU's launching of kernels, not
//! the kernels, bounds such ranks.

use std::ffi::c_void;
use std::sync::Arc;

use comm_core::Result;
use comm_core::cuda::cudarc::driver::{
    CudaContext, CudaEvent, CudaFunction, CudaGraph, CudaStream, result,
};
use comm_core::cuda::{
    DeviceMemory, KernelCache, device_count, driver_error, event_times, launch_overlapping,
    record_each, timing_events,
};

use super::{LAUNCH_PROBE, ProbeArgs};
use crate::perf::sweep::median;

/// Timed rounds of replays per measurement; the median is reported.
const REPLAYS: usize = 5;

/// One measurement: `streams` streams each replaying a graph of kernels of one grid.
#[derive(Debug, Clone, Copy)]
pub struct Concurrent {
    /// Streams replaying at once.
    pub streams: usize,
    /// Launched with programmatic stream serialization (as the peer kernels are).
    pub overlapping: bool,
    /// Blocks and threads per block of every kernel.
    pub grid: (u32, u32),
    /// GPU time of a round of replays divided by the kernels of one graph: what one call
    /// of every stream costs together, in microseconds.
    pub per_round_us: f64,
    /// The same divided by the streams too: one kernel, in microseconds.
    pub per_kernel_us: f64,
}

/// Measures every count of `streams` (at most 32), plain and overlapping, for each grid,
/// with graphs of `kernels` kernels, on GPU `ordinal`.
pub fn concurrent(
    ordinal: usize,
    streams: &[usize],
    kernels: usize,
    grids: &[(u32, u32)],
) -> Result<Vec<Concurrent>> {
    let ordinal = ordinal % device_count()?;
    let memory = DeviceMemory::new(ordinal)?;
    let ctx = memory.context().clone();
    ctx.bind_to_thread().map_err(driver_error)?;
    let cache = KernelCache::global();
    let plain = cache.function(&ctx, &LAUNCH_PROBE, "launch_probe_plain")?;
    let overlap = cache.function(&ctx, &LAUNCH_PROBE, "launch_probe_overlap")?;
    let most = streams.iter().copied().max().unwrap_or(1).clamp(1, 32);
    let pool = (0..most)
        .map(|_| ctx.new_stream().map_err(driver_error))
        .collect::<Result<Vec<_>>>()?;
    let replays = Replays::new(&ctx)?;
    let mut out = Vec::new();
    for &grid in grids {
        for overlapping in [false, true] {
            let f = if overlapping { &overlap } else { &plain };
            for &n in streams {
                let active = &pool[..n.clamp(1, most)];
                let graphs = active
                    .iter()
                    .map(|s| crate::graph::capture(s, || enqueue(f, overlapping, grid, kernels, s)))
                    .collect::<Result<Vec<_>>>()?;
                let per_round_us = replays.per_kernel_us(active, &graphs, kernels)?;
                out.push(Concurrent {
                    streams: active.len(),
                    overlapping,
                    grid,
                    per_round_us,
                    per_kernel_us: per_round_us / active.len() as f64,
                });
            }
        }
    }
    Ok(out)
}

/// Events around timed rounds of replays.
pub(super) struct Replays {
    events: Vec<CudaEvent>,
}

impl Replays {
    pub(super) fn new(ctx: &Arc<CudaContext>) -> Result<Self> {
        Ok(Replays {
            events: timing_events(ctx, REPLAYS + 1)?,
        })
    }

    /// Replays `graphs` (one a stream, of `kernels` kernels each) in [`REPLAYS`] timed rounds
    /// after one that uploads them, and returns the median round's GPU time per kernel of a
    /// graph, us. Every stream's work is done when it returns.
    pub(super) fn per_kernel_us(
        &self,
        streams: &[Arc<CudaStream>],
        graphs: &[CudaGraph],
        kernels: usize,
    ) -> Result<f64> {
        round(streams, graphs)?;
        let s0 = &streams[0];
        record_each(s0, &self.events, || round(streams, graphs))?;
        s0.synchronize().map_err(driver_error)?;
        let round_time = median(&mut event_times(&self.events)?);
        Ok(round_time.as_secs_f64() * 1e6 / kernels.max(1) as f64)
    }
}

/// Every stream replays its graph, all starting after the first stream's work so far; the
/// first stream then waits for the others.
fn round(streams: &[Arc<CudaStream>], graphs: &[CudaGraph]) -> Result<()> {
    let (s0, others) = streams.split_first().expect("at least one stream");
    for s in others {
        s.join(s0).map_err(driver_error)?;
    }
    for g in graphs {
        g.launch().map_err(driver_error)?;
    }
    for s in others {
        s0.join(s).map_err(driver_error)?;
    }
    Ok(())
}

/// `kernels` empty kernels of `grid` on `stream` (being captured).
fn enqueue(
    f: &CudaFunction,
    overlapping: bool,
    (blocks, threads): (u32, u32),
    kernels: usize,
    stream: &Arc<CudaStream>,
) -> Result<()> {
    let mut args = ProbeArgs { words: [7; 32] };
    for _ in 0..kernels {
        let mut params = [&mut args as *mut ProbeArgs as *mut c_void];
        if overlapping {
            // SAFETY: the kernel's one parameter is a LaunchProbeArgs, which ProbeArgs
            // mirrors; it waits for the kernel before it (griddepcontrol.wait).
            unsafe {
                launch_overlapping(
                    f.cu_function(),
                    (blocks, threads),
                    stream.cu_stream(),
                    &mut params,
                )?
            };
        } else {
            // SAFETY: as above; the driver copies the parameters before returning.
            unsafe {
                result::launch_kernel(
                    f.cu_function(),
                    (blocks, 1, 1),
                    (threads, 1, 1),
                    0,
                    stream.cu_stream(),
                    &mut params,
                )
            }
            .map_err(driver_error)?;
        }
    }
    Ok(())
}
