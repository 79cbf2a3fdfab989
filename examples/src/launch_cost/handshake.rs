//! Handshakes: the least a call of two ranks sharing a GPU costs over host memory. Each
//! rank's stream replays a graph of kernels that do nothing but hear from the peer once
//! (`launch_probe_handshake`: store this call's number into its own flag in host memory,
//! poll the peer's until it holds the same), launched as the peer kernels are, and both
//! streams replay at once. Every all-reduce between such ranks does at least that each
//! call: a kernel, and a write of its own seen by the other rank through host memory. So it
//! holds what an empty kernel and a ping-pong's half round, timed apart, leave out: the flag
//! written by a kernel just started, and the wait of each call for the slower rank.
//!
//! [`eager_handshakes`] calls the same kernel eagerly from two threads, as ranks that are
//! threads do, and times the calls as allreduce-perf times eager calls: each framed by
//! events, and back to back. What that adds to the graphs' time is what any eager call of
//! two such ranks pays, whatever its kernel does.

use std::ffi::c_void;
use std::sync::{Arc, Barrier};
use std::time::Duration;

use comm_core::cuda::cudarc::driver::{CudaContext, CudaEvent, CudaFunction, CudaStream};
use comm_core::cuda::{
    DeviceMemory, DeviceOwned, KernelCache, driver_error, event_times, launch_overlapping,
    record_each, timing_events,
};
use comm_core::{DType, Error, Result};

use super::streams::Replays;
use super::{LAUNCH_PROBE, ProbeArgs};
use crate::perf::sweep::median;

/// How long a kernel waits for the peer's flag before it gives up (far beyond any trip).
const PATIENCE: Duration = Duration::from_secs(2);

/// One measurement of [`handshakes`].
#[derive(Debug, Clone, Copy)]
pub struct Handshake {
    /// A system fence after each flag's store.
    pub fence: bool,
    /// GPU time of a round of replays divided by the kernels of one graph: one call of the
    /// two ranks, us.
    pub per_call_us: f64,
}

/// Times graphs of `kernels` handshakes of `(blocks, threads)` on two streams of GPU
/// `ordinal`, the flags at device addresses `flags` (host memory mapped into the GPU, a
/// line each, zeroed), without and with a fence after each store. An error where a kernel
/// gave up waiting for the other.
pub fn handshakes(
    ordinal: usize,
    flags: [u64; 2],
    kernels: usize,
    grid: (u32, u32),
) -> Result<Vec<Handshake>> {
    let Probe { memory, ctx, f } = Probe::new(ordinal)?;
    let streams = [0, 1]
        .map(|_| ctx.new_stream().map_err(driver_error))
        .into_iter()
        .collect::<Result<Vec<_>>>()?;
    let replays = Replays::new(&ctx)?;
    let mut out = Vec::new();
    for fence in [false, true] {
        // Each measurement counts its calls from zero, in flags of its own.
        let (counters, base) = zeroed_counters(&memory)?;
        let flag_line = if fence { 64 } else { 0 };
        let graphs = (0..2)
            .map(|r| {
                let args = ProbeArgs {
                    words: words(
                        base + 16 * r as u64,
                        flags[r] + flag_line,
                        flags[1 - r] + flag_line,
                        fence,
                    ),
                };
                crate::graph::capture(&streams[r], || {
                    enqueue(&f, args, grid, kernels, &streams[r])
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let per_call_us = replays.per_kernel_us(&streams, &graphs, kernels)?;
        check_counters(&counters, "the handshake probe's flag of the other stream")?;
        out.push(Handshake { fence, per_call_us });
    }
    Ok(out)
}

/// A handshake called eagerly by two threads (see [`eager_handshakes`]), us per call, the
/// slower thread's.
#[derive(Debug, Clone, Copy)]
pub struct EagerHandshake {
    /// The median GPU time between two events recorded around each call.
    pub framed_us: f64,
    /// Calls enqueued back to back between two events, per call.
    pub back_to_back_us: f64,
}

/// Calls before the timed ones, so that both threads' first calls are behind them.
const EAGER_WARMUP: usize = 20;

/// Times `calls` handshakes of `(blocks, threads)` (no fence), each launched eagerly by one
/// of two threads on a stream of its own, on GPU `ordinal`, the flags at device addresses
/// `flags` (host memory mapped into the GPU, a line each, zeroed): first each call framed by
/// events (an event between every two calls, as allreduce-perf's eager rows), then `calls`
/// enqueued back to back between two events. An error where a kernel gave up waiting.
pub fn eager_handshakes(
    ordinal: usize,
    flags: [u64; 2],
    calls: usize,
    grid: (u32, u32),
) -> Result<EagerHandshake> {
    let Probe { memory, ctx, f } = Probe::new(ordinal)?;
    let (counters, base) = zeroed_counters(&memory)?;
    let calls = calls.max(1);
    // Everything that may fail before the threads meet is made here, so that neither waits
    // at the barrier for a thread that has already failed.
    let ranks = (0..2)
        .map(|r| {
            let stream = ctx.new_stream().map_err(driver_error)?;
            let events = timing_events(&ctx, calls + 1)?;
            let args = ProbeArgs {
                words: words(base + 16 * r as u64, flags[r], flags[1 - r], false),
            };
            Ok((stream, events, args))
        })
        .collect::<Result<Vec<_>>>()?;
    let barrier = Barrier::new(2);
    let timed: Vec<Result<(f64, f64)>> = std::thread::scope(|s| {
        let threads: Vec<_> = ranks
            .iter()
            .map(|(stream, events, args)| {
                let (ctx, f, barrier) = (&ctx, &f, &barrier);
                s.spawn(move || {
                    let me = EagerCalls {
                        f,
                        args: *args,
                        grid,
                        stream,
                    };
                    let ready = ctx
                        .bind_to_thread()
                        .map_err(driver_error)
                        .and_then(|()| me.enqueue(EAGER_WARMUP))
                        .and_then(|()| stream.synchronize().map_err(driver_error));
                    barrier.wait();
                    let framed = ready.and_then(|()| me.framed(events));
                    barrier.wait();
                    framed.and_then(|framed| {
                        me.back_to_back(&events[0], &events[1], calls)
                            .map(|b| (framed, b))
                    })
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| {
                t.join()
                    .unwrap_or_else(|_| Err(Error::Aborted("a handshake thread panicked".into())))
            })
            .collect()
    });
    let timed = timed.into_iter().collect::<Result<Vec<_>>>()?;
    check_counters(
        &counters,
        "the eager handshake probe's flag of the other thread",
    )?;
    let slower = |pick: fn(&(f64, f64)) -> f64| timed.iter().map(pick).fold(0.0, f64::max);
    Ok(EagerHandshake {
        framed_us: slower(|t| t.0),
        back_to_back_us: slower(|t| t.1),
    })
}

/// One thread's eager calls of the handshake.
struct EagerCalls<'a> {
    f: &'a CudaFunction,
    args: ProbeArgs,
    grid: (u32, u32),
    stream: &'a Arc<CudaStream>,
}

impl EagerCalls<'_> {
    /// One call between each two of `events`: the median GPU time of one, us.
    fn framed(&self, events: &[CudaEvent]) -> Result<f64> {
        record_each(self.stream, events, || self.enqueue(1))?;
        self.stream.synchronize().map_err(driver_error)?;
        Ok(median(&mut event_times(events)?).as_secs_f64() * 1e6)
    }

    /// `calls` calls between `start` and `end`: GPU time per call, us.
    fn back_to_back(&self, start: &CudaEvent, end: &CudaEvent, calls: usize) -> Result<f64> {
        start.record(self.stream).map_err(driver_error)?;
        self.enqueue(calls)?;
        end.record(self.stream).map_err(driver_error)?;
        self.stream.synchronize().map_err(driver_error)?;
        let ms = start.elapsed_ms(end).map_err(driver_error)?;
        Ok(f64::from(ms) * 1e3 / calls as f64)
    }

    fn enqueue(&self, calls: usize) -> Result<()> {
        enqueue(self.f, self.args, self.grid, calls, self.stream)
    }
}

/// The handshake kernel on GPU `ordinal`, its context bound to this thread.
struct Probe {
    memory: DeviceMemory,
    ctx: Arc<CudaContext>,
    f: CudaFunction,
}

impl Probe {
    fn new(ordinal: usize) -> Result<Self> {
        let memory = DeviceMemory::new(ordinal)?;
        let ctx = memory.context().clone();
        ctx.bind_to_thread().map_err(driver_error)?;
        let f = KernelCache::global().function(&ctx, &LAUNCH_PROBE, "launch_probe_handshake")?;
        Ok(Probe { memory, ctx, f })
    }
}

/// The two ranks' call counters (two words each: calls, gave up), zeroed before any
/// kernel reads them, and their device address.
fn zeroed_counters(memory: &DeviceMemory) -> Result<(DeviceOwned, u64)> {
    let mut counters = memory.alloc(DType::I64, 4)?;
    counters.write(&[0u8; 32])?;
    memory.synchronize()?;
    let base = counters.buffer().device_ptr();
    Ok((counters, base))
}

/// `Err(Timeout)` waiting for `what` where a kernel counting its calls in `counters` (two
/// words a rank: calls, gave up) gave up.
fn check_counters(counters: &DeviceOwned, what: &str) -> Result<()> {
    let words = counters.read()?;
    let word = |i: usize| u64::from_le_bytes(words[8 * i..8 * i + 8].try_into().expect("8"));
    if word(1) != 0 || word(3) != 0 {
        return Err(Error::Timeout {
            what: what.into(),
            after: PATIENCE,
        });
    }
    Ok(())
}

/// The kernel's words: its call counter, its flag, the peer's flag, the fence, the patience.
fn words(calls: u64, mine: u64, peer: u64, fence: bool) -> [u64; 32] {
    let mut w = [0u64; 32];
    w[..5].copy_from_slice(&[
        calls,
        mine,
        peer,
        u64::from(fence),
        PATIENCE.as_nanos() as u64,
    ]);
    w
}

/// `kernels` handshakes on `stream` (eagerly, or into the graph it is capturing).
fn enqueue(
    f: &CudaFunction,
    mut args: ProbeArgs,
    grid: (u32, u32),
    kernels: usize,
    stream: &Arc<CudaStream>,
) -> Result<()> {
    for _ in 0..kernels {
        let mut params = [&mut args as *mut ProbeArgs as *mut c_void];
        // SAFETY: the kernel's one parameter is a LaunchProbeArgs, which ProbeArgs mirrors;
        // its words address the counters and flags allocated by the caller, which outlive
        // the graphs' replays (the caller synchronizes before they are freed).
        unsafe { launch_overlapping(f.cu_function(), grid, stream.cu_stream(), &mut params)? };
    }
    Ok(())
}
