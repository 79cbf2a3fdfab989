//! `copy-probe`: what the copy engines carry, the path of an all-reduce that moves its bytes
//! with `cuMemcpyAsync` instead of kernel loads and stores.
//!
//! Every measurement copies between buffers larger than any L2: device memory to pinned
//! host memory, host to device, and both at once (one stream each); with two GPUs in the
//! process, device to the other device (peer access enabled: their link), one way and both
//! ways at once. Host-timed: every stream drained, the copies enqueued, every stream drained
//! again; the median of `reps`, after one untimed round.

use std::ffi::c_void;
use std::sync::Arc;
use std::time::Instant;

use comm_core::cuda::cudarc::driver::{CudaContext, CudaStream, sys};
use comm_core::cuda::stream::cu_stream;
use comm_core::cuda::stream::raw_stream;
use comm_core::cuda::{DeviceBuffer, context, device_count, driver_error, enable_peer_access};
use comm_core::{Error, Result};

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

/// Pinned host memory that every context can use, freed on drop.
struct Pinned {
    ctx: Arc<CudaContext>,
    ptr: *mut c_void,
}

impl Pinned {
    fn new(ctx: &Arc<CudaContext>, bytes: usize) -> Result<Self> {
        ctx.bind_to_thread().map_err(driver_error)?;
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: valid out-pointer; `bytes` of pinned memory, portable to every context.
        unsafe { sys::cuMemHostAlloc(&mut ptr, bytes, sys::CU_MEMHOSTALLOC_PORTABLE) }
            .result()
            .map_err(driver_error)?;
        Ok(Pinned {
            ctx: ctx.clone(),
            ptr,
        })
    }

    /// The address copies take (unified addressing: the host pointer itself).
    fn addr(&self, offset: usize) -> u64 {
        self.ptr as u64 + offset as u64
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: allocated by cuMemHostAlloc, freed once.
            let _ = unsafe { sys::cuMemFreeHost(self.ptr) };
        }
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
