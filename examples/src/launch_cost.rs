//! `launch-cost`: what enqueuing work costs on this machine, the floor under every eager call.
//!
//! An eager all-reduce of a few kilobytes is bound by the host: the GPU finishes each kernel
//! before the host has enqueued the next. This program times the pieces such a call is made
//! of, each on one GPU, with no peers: an empty kernel (`launch_probe.cu`, with a parameter
//! block as large as the peer kernels') launched plainly and with programmatic stream
//! serialization, an event record (what allreduce-perf puts between eager calls), and the
//! capture query `SelectComm` makes per call. For each it reports the host's time per call,
//! the GPU's time per call when `calls` are enqueued back to back, and the median GPU time
//! of one call framed by two events. [`concurrent`] adds what a kernel costs when several
//! streams replay graphs at once, as ranks that are threads sharing a GPU do, and
//! [`handshakes`] what a call costs that also hears from the other stream once through host
//! memory (`host-probe` runs it).

use std::ffi::c_void;
use std::time::{Duration, Instant};

use comm_core::cuda::cudarc::driver::{CudaEvent, CudaFunction, result, sys};
use comm_core::cuda::stream::{cu_stream, is_capturing};
use comm_core::cuda::{
    DeviceMemory, KernelCache, KernelSource, device_count, driver_error, event_times,
    launch_overlapping, record_each, timing_event, timing_events,
};
use comm_core::{RawStream, Result};

mod handshake;
mod streams;
pub use handshake::{EagerHandshake, Handshake, eager_handshakes, handshakes};
pub use streams::{Concurrent, concurrent};

/// The empty kernels.
pub const LAUNCH_PROBE: KernelSource = KernelSource {
    name: "launch_probe.cu",
    source: include_str!("../kernels/launch_probe.cu"),
};

/// The parameter block of the probe kernels (`LaunchProbeArgs`), as large as `PeerArgs`.
#[repr(C)]
#[derive(Clone, Copy)]
struct ProbeArgs {
    words: [u64; 32],
}

/// One thing enqueued per call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Probe {
    /// `cuLaunchKernel` of the plain empty kernel, one block of 32 threads.
    Plain,
    /// `cuLaunchKernelEx` of the overlapping empty kernel with programmatic stream
    /// serialization allowed (how the peer kernels are launched on sm_90+).
    Overlap,
    /// `cuEventRecord`.
    Event,
    /// `cuStreamIsCapturing` (enqueues nothing).
    CaptureQuery,
}

impl Probe {
    /// Every probe, in report order.
    pub const ALL: [Probe; 4] = [
        Probe::Plain,
        Probe::Overlap,
        Probe::Event,
        Probe::CaptureQuery,
    ];

    /// The probe's name in the report.
    pub fn name(self) -> &'static str {
        match self {
            Probe::Plain => "kernel, plain launch",
            Probe::Overlap => "kernel, overlapping launch",
            Probe::Event => "event record",
            Probe::CaptureQuery => "capture query",
        }
    }
}

/// What one probe costs, in microseconds per call.
#[derive(Debug, Clone, Copy)]
pub struct Cost {
    /// The probe.
    pub probe: Probe,
    /// Host time to enqueue one call.
    pub host_us: f64,
    /// GPU time per call, `calls` enqueued back to back between two events.
    pub back_to_back_us: f64,
    /// Median GPU time of one call between two events recorded around it.
    pub framed_us: f64,
}

/// The empty kernels and a stream of one GPU.
struct Launcher {
    raw: RawStream,
    stream: sys::CUstream,
    plain: CudaFunction,
    overlap: CudaFunction,
    args: ProbeArgs,
}

impl Launcher {
    fn enqueue(&mut self, probe: Probe, event: &CudaEvent) -> Result<()> {
        let mut params = [&mut self.args as *mut ProbeArgs as *mut c_void];
        match probe {
            // SAFETY: the kernel's one parameter is a LaunchProbeArgs, which ProbeArgs
            // mirrors; the driver copies it before returning.
            Probe::Plain => unsafe {
                result::launch_kernel(
                    self.plain.cu_function(),
                    (1, 1, 1),
                    (32, 1, 1),
                    0,
                    self.stream,
                    &mut params,
                )
            }
            .map_err(driver_error),
            // SAFETY: as above; the kernel waits for the previous one (griddepcontrol.wait).
            Probe::Overlap => unsafe {
                launch_overlapping(
                    self.overlap.cu_function(),
                    (1, 32),
                    self.stream,
                    &mut params,
                )
            },
            // SAFETY: the event and the stream belong to this context.
            Probe::Event => unsafe { result::event::record(event.cu_event(), self.stream) }
                .map_err(driver_error),
            Probe::CaptureQuery => is_capturing(self.raw).map(|capturing| {
                std::hint::black_box(capturing);
            }),
        }
    }
}

/// Times every probe on GPU `ordinal`: `calls` calls each (after as many to warm up).
pub fn measure(ordinal: usize, calls: usize) -> Result<Vec<Cost>> {
    let ordinal = ordinal % device_count()?;
    let memory = DeviceMemory::new(ordinal)?;
    let ctx = memory.context().clone();
    ctx.bind_to_thread().map_err(driver_error)?;
    let cache = KernelCache::global();
    let mut launcher = Launcher {
        raw: memory.raw_stream(),
        stream: cu_stream(memory.raw_stream()),
        plain: cache.function(&ctx, &LAUNCH_PROBE, "launch_probe_plain")?,
        overlap: cache.function(&ctx, &LAUNCH_PROBE, "launch_probe_overlap")?,
        args: ProbeArgs { words: [7; 32] },
    };
    let scratch = timing_event(&ctx)?;
    let framed = timing_events(&ctx, calls + 1)?;
    let mut costs = Vec::new();
    for probe in Probe::ALL {
        for _ in 0..calls {
            launcher.enqueue(probe, &scratch)?;
        }
        memory.synchronize()?;
        // Back to back, with the host's time to enqueue them.
        framed[0].record(memory.stream()).map_err(driver_error)?;
        let start = Instant::now();
        for _ in 0..calls {
            launcher.enqueue(probe, &scratch)?;
        }
        let host = start.elapsed();
        framed[1].record(memory.stream()).map_err(driver_error)?;
        memory.synchronize()?;
        let back_to_back = event_times(&framed[..2])?[0];
        // Framed: an event after every call.
        record_each(memory.stream(), &framed, || {
            launcher.enqueue(probe, &scratch)
        })?;
        memory.synchronize()?;
        let mut each = event_times(&framed)?;
        each.sort();
        costs.push(Cost {
            probe,
            host_us: per_call(host, calls),
            back_to_back_us: per_call(back_to_back, calls),
            framed_us: per_call(each[each.len() / 2], 1),
        });
    }
    Ok(costs)
}

fn per_call(d: Duration, calls: usize) -> f64 {
    d.as_secs_f64() * 1e6 / calls.max(1) as f64
}
