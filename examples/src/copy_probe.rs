//! `copy-probe`: what the copy engines carry, the path of an all-reduce that moves its bytes
//! with `cuMemcpyAsync` instead of kernel loads and stores.
//!
//! Every measurement copies between buffers larger than any L2: device memory to pinned
//! host memory, host to device, and both at once (one stream each); with two GPUs in the
//! process, device to the other device (peer access enabled: their link), one way and both
//! ways at once. Host-timed: every stream drained, the copies enqueued, every stream drained
//! again; the median of `reps`, after one untimed round.
//!
//! With two GPUs it also runs a whole all-reduce that way ([`two_shot`]): copies move every
//! byte between the GPUs and one small kernel sums, piece by piece, on three streams per GPU
//! so that copies and sums overlap. It tells what such an algorithm could reach before one
//! is built into the peer layer.

use std::sync::Arc;
use std::time::Instant;

use comm_core::cuda::cudarc::driver::{
    CudaContext, CudaEvent, CudaFunction, CudaStream, result, sys,
};
use comm_core::cuda::stream::{cu_stream, raw_stream};
use comm_core::cuda::{
    DeviceBuffer, KernelCache, KernelSource, context, device_count, driver_error,
    enable_peer_access,
};
use comm_core::{Error, Result};

use crate::host_probe::Pinned;

/// One measured copy.
#[derive(Debug, Clone)]
pub struct Rate {
    /// What moved where (`device -> host`, `GPU 0 <-> GPU 1`, ...).
    pub what: String,
    /// Bytes each direction carried.
    pub bytes: usize,
    /// Median wall time, us.
    pub us: f64,
}

impl Rate {
    /// GB/s in each direction.
    pub fn gbps(&self) -> f64 {
        self.bytes as f64 / self.us / 1e3
    }
}

/// One GPU's side: a stream per direction and a source and a destination buffer.
struct Side {
    ctx: Arc<CudaContext>,
    streams: [Arc<CudaStream>; 2],
    src: DeviceBuffer,
    dst: DeviceBuffer,
}

impl Side {
    fn new(ordinal: usize, bytes: usize) -> Result<Self> {
        let ctx = context(ordinal)?;
        let stream = || ctx.new_stream().map_err(driver_error);
        Ok(Side {
            streams: [stream()?, stream()?],
            src: DeviceBuffer::alloc(&ctx, bytes)?,
            dst: DeviceBuffer::alloc(&ctx, bytes)?,
            ctx,
        })
    }
}

/// A copy of `bytes` from `src` to `dst` (unified addresses) on `stream`.
fn copy(ctx: &CudaContext, stream: &CudaStream, dst: u64, src: u64, bytes: usize) -> Result<()> {
    ctx.bind_to_thread().map_err(driver_error)?;
    // SAFETY: both ranges lie in live allocations of at least `bytes` bytes that this
    // context can reach (own memory, pinned portable host memory, or a peer's memory with
    // peer access enabled); the stream belongs to the context.
    unsafe { sys::cuMemcpyAsync(dst, src, bytes, cu_stream(raw_stream(stream))) }
        .result()
        .map_err(driver_error)
}

/// Median wall time (us) of `enqueue` over `reps` rounds, every stream of `sides` drained
/// before and after each.
fn time(sides: &[&Side], reps: usize, enqueue: &dyn Fn() -> Result<()>) -> Result<f64> {
    let drain = || -> Result<()> {
        for s in sides.iter().flat_map(|s| &s.streams) {
            s.synchronize().map_err(driver_error)?;
        }
        Ok(())
    };
    drain()?;
    enqueue()?;
    drain()?;
    let mut times = Vec::with_capacity(reps);
    for _ in 0..reps {
        let start = Instant::now();
        enqueue()?;
        drain()?;
        times.push(start.elapsed().as_secs_f64() * 1e6);
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

/// Every copy of `sizes` bytes from GPU `ordinal` (and between it and the next GPU, if the
/// process has two and they can reach each other), `reps` times each.
pub fn measure(ordinal: usize, sizes: &[usize], reps: usize) -> Result<Vec<Rate>> {
    let most = sizes.iter().copied().max().unwrap_or(0);
    if most == 0 {
        return Err(Error::InvalidArgument("copy-probe: no size to copy".into()));
    }
    let gpus = device_count()?;
    let a = Side::new(ordinal % gpus, most)?;
    let host = Pinned::new(&a.ctx, 2 * most)?;
    let b = if gpus > 1 {
        let peer = (ordinal + 1) % gpus;
        match enable_peer_access(&a.ctx, peer) {
            Ok(()) => {
                let b = Side::new(peer, most)?;
                enable_peer_access(&b.ctx, a.ctx.ordinal())?;
                Some(b)
            }
            Err(Error::Unsupported(_)) => None,
            Err(e) => return Err(e),
        }
    } else {
        None
    };
    let mut rates = Vec::new();
    for &bytes in sizes {
        let (src, dst) = (a.src.device_ptr(), a.dst.device_ptr());
        let (to_host, from_host) = (host.addr(0), host.addr(most));
        let [s0, s1] = &a.streams;
        let mut push = |what: String, us: f64| rates.push(Rate { what, bytes, us });
        let d2h = || copy(&a.ctx, s0, to_host, src, bytes);
        let h2d = || copy(&a.ctx, s1, dst, from_host, bytes);
        push("device -> host".into(), time(&[&a], reps, &d2h)?);
        push("host -> device".into(), time(&[&a], reps, &h2d)?);
        push(
            "device <-> host, both at once".into(),
            time(&[&a], reps, &|| d2h().and_then(|()| h2d()))?,
        );
        if let Some(b) = &b {
            let (i, j) = (a.ctx.ordinal(), b.ctx.ordinal());
            let there = || copy(&a.ctx, s0, b.dst.device_ptr(), src, bytes);
            let back = || copy(&b.ctx, &b.streams[0], dst, b.src.device_ptr(), bytes);
            push(format!("GPU {i} -> GPU {j}"), time(&[&a, b], reps, &there)?);
            push(
                format!("GPU {i} <-> GPU {j}, both at once"),
                time(&[&a, b], reps, &|| there().and_then(|()| back()))?,
            );
        }
    }
    Ok(rates)
}

/// The kernel of [`two_shot`].
pub const COPY_PROBE: KernelSource = KernelSource {
    name: "copy_probe.cu",
    source: include_str!("../kernels/copy_probe.cu"),
};

/// One measured two-shot all-reduce ([`two_shot`]).
#[derive(Debug, Clone)]
pub struct TwoShot {
    /// Message bytes (f32).
    pub bytes: usize,
    /// Pieces each GPU's half is cut into, so that copies and sums overlap.
    pub chunks: usize,
    /// Median wall time of one all-reduce, us (drained before and after).
    pub us: f64,
    /// Elements of either GPU's result that differ from the sum of both inputs.
    pub wrong: usize,
}

impl TwoShot {
    /// Bus bandwidth as nccl-tests counts it (two ranks: the algorithm bandwidth), GB/s.
    pub fn busbw(&self) -> f64 {
        self.bytes as f64 / self.us / 1e3
    }
}

/// One GPU of the two-shot: three streams (sending, summing, returning results), its
/// input, output and the scratch where the peer's half arrives, and the sum kernel.
struct Half {
    ctx: Arc<CudaContext>,
    streams: [Arc<CudaStream>; 3],
    input: DeviceBuffer,
    output: DeviceBuffer,
    scratch: DeviceBuffer,
    add: CudaFunction,
    sms: u32,
}

impl Half {
    fn new(ordinal: usize, bytes: usize) -> Result<Self> {
        let ctx = context(ordinal)?;
        let stream = || ctx.new_stream().map_err(driver_error);
        let sms = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(driver_error)?;
        Ok(Half {
            streams: [stream()?, stream()?, stream()?],
            input: DeviceBuffer::alloc(&ctx, bytes)?,
            output: DeviceBuffer::alloc(&ctx, bytes)?,
            scratch: DeviceBuffer::alloc(&ctx, bytes / 2)?,
            add: KernelCache::global().function(&ctx, &COPY_PROBE, "copy_probe_add_f32")?,
            sms: sms.max(1) as u32,
            ctx,
        })
    }

    /// Enqueues `out = a + b` over `bytes` (a multiple of 16) on `stream`.
    fn add(&self, stream: &CudaStream, out: u64, a: u64, b: u64, bytes: usize) -> Result<()> {
        let (mut out, mut a, mut b) = (out, a, b);
        let mut n4 = (bytes / 16) as u64;
        let blocks = n4.div_ceil(256).clamp(1, u64::from(self.sms) * 4) as u32;
        let mut params = comm_core::kernel_params![out, a, b, n4];
        self.ctx.bind_to_thread().map_err(driver_error)?;
        // SAFETY: (float4* out, const float4* a, const float4* b, u64 n4): the three ranges
        // hold `bytes` bytes of this device's memory, 16-byte aligned; the function is of
        // this context.
        unsafe {
            result::launch_kernel(
                self.add.cu_function(),
                (blocks, 1, 1),
                (256, 1, 1),
                0,
                cu_stream(raw_stream(stream)),
                &mut params,
            )
        }
        .map_err(driver_error)
    }
}

/// A two-shot all-reduce (sum) of `bytes` of f32 between GPU `ordinal` and the next, whose
/// bytes all move by copy engines: each GPU copies the half the other owns into that GPU's
/// scratch, sums its own half, and copies the sum into the other's output, piece by piece
/// (`chunks` per half) on separate streams, so that copies of one piece overlap the sum of
/// another. Checked once against the sum of both inputs (outputs poisoned first), then timed
/// `reps` times. `None` with fewer than two GPUs or without peer access between them.
pub fn two_shot(
    ordinal: usize,
    bytes: usize,
    chunks: usize,
    reps: usize,
) -> Result<Option<TwoShot>> {
    let gpus = device_count()?;
    if gpus < 2 {
        return Ok(None);
    }
    let chunks = chunks.max(1);
    if bytes == 0 || bytes % (32 * chunks) != 0 {
        return Err(Error::InvalidArgument(format!(
            "copy-probe: {bytes} B does not cut into 2 x {chunks} pieces of 16-byte vectors"
        )));
    }
    let (i, j) = (ordinal % gpus, (ordinal + 1) % gpus);
    let mut halves = [Half::new(i, bytes)?, Half::new(j, bytes)?];
    for (g, h) in [(0, 1), (1, 0)] {
        match enable_peer_access(&halves[g].ctx, halves[h].ctx.ordinal()) {
            Ok(()) => {}
            Err(Error::Unsupported(_)) => return Ok(None),
            Err(e) => return Err(e),
        }
    }
    // Small integers: every sum is exact in f32, so the check is bitwise.
    let count = bytes / 4;
    let input = |g: usize| -> Vec<f32> {
        (0..count)
            .map(|k| ((k % 251) as f32 + 1.0) * (g as f32 + 1.0))
            .collect()
    };
    for (g, half) in halves.iter_mut().enumerate() {
        let stream = half.streams[0].clone();
        half.input.upload(&stream, &input(g))?;
    }
    let events = Events::new(&halves, chunks)?;
    // Checked once, on poisoned outputs (0xff bytes: NaN).
    for half in halves.iter_mut() {
        let stream = half.streams[0].clone();
        half.output.fill_bytes(&stream, 0xff)?;
    }
    drain(&halves)?;
    enqueue(&halves, &events, bytes, chunks)?;
    drain(&halves)?;
    let want: Vec<f32> = input(0).iter().zip(input(1)).map(|(a, b)| a + b).collect();
    let mut wrong = 0;
    for half in &halves {
        let mut got = vec![0f32; count];
        half.output.download(&half.streams[0], &mut got)?;
        wrong += got
            .iter()
            .zip(&want)
            .filter(|(g, w)| g.to_bits() != w.to_bits())
            .count();
    }
    let mut times = Vec::with_capacity(reps.max(1));
    for _ in 0..reps.max(1) {
        let start = Instant::now();
        enqueue(&halves, &events, bytes, chunks)?;
        drain(&halves)?;
        times.push(start.elapsed().as_secs_f64() * 1e6);
    }
    times.sort_by(f64::total_cmp);
    Ok(Some(TwoShot {
        bytes,
        chunks,
        us: times[times.len() / 2],
        wrong,
    }))
}

/// Every stream of both GPUs drained.
fn drain(halves: &[Half; 2]) -> Result<()> {
    for s in halves.iter().flat_map(|h| &h.streams) {
        s.synchronize().map_err(driver_error)?;
    }
    Ok(())
}

/// The events that order the pieces across streams and GPUs: per GPU and piece, its copy
/// into the peer's scratch done, and its sum done.
struct Events {
    sent: [Vec<CudaEvent>; 2],
    summed: [Vec<CudaEvent>; 2],
}

impl Events {
    fn new(halves: &[Half; 2], chunks: usize) -> Result<Self> {
        let make = |g: usize| -> Result<Vec<CudaEvent>> {
            (0..chunks)
                .map(|_| halves[g].ctx.new_event(None).map_err(driver_error))
                .collect()
        };
        Ok(Events {
            sent: [make(0)?, make(1)?],
            summed: [make(0)?, make(1)?],
        })
    }
}

/// One all-reduce, enqueued: GPU g owns half g of the message. Per piece c of each half,
/// GPU g's send stream copies its input of the other half's piece into the other GPU's
/// scratch; its sum stream waits for the other GPU's copy of piece c of half g and sums;
/// its return stream copies that sum into the other GPU's output.
fn enqueue(halves: &[Half; 2], events: &Events, bytes: usize, chunks: usize) -> Result<()> {
    let half = bytes / 2;
    let piece = half / chunks;
    for c in 0..chunks {
        let at = (c * piece) as u64;
        for (g, h) in [(0, 1), (1, 0)] {
            let (me, peer) = (&halves[g], &halves[h]);
            let theirs = me.input.device_ptr() + (h * half) as u64 + at;
            copy(
                &me.ctx,
                &me.streams[0],
                peer.scratch.device_ptr() + at,
                theirs,
                piece,
            )?;
            events.sent[g][c]
                .record(&me.streams[0])
                .map_err(driver_error)?;
        }
    }
    for c in 0..chunks {
        let at = (c * piece) as u64;
        for (g, h) in [(0, 1), (1, 0)] {
            let (me, peer) = (&halves[g], &halves[h]);
            let mine = (g * half) as u64 + at;
            me.streams[1]
                .wait(&events.sent[h][c])
                .map_err(driver_error)?;
            me.add(
                &me.streams[1],
                me.output.device_ptr() + mine,
                me.input.device_ptr() + mine,
                me.scratch.device_ptr() + at,
                piece,
            )?;
            events.summed[g][c]
                .record(&me.streams[1])
                .map_err(driver_error)?;
            me.streams[2]
                .wait(&events.summed[g][c])
                .map_err(driver_error)?;
            copy(
                &me.ctx,
                &me.streams[2],
                peer.output.device_ptr() + mine,
                me.output.device_ptr() + mine,
                piece,
            )?;
        }
    }
    Ok(())
}
