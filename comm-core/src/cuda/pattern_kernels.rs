//! [`PatternKernels`]: the fill and check kernels of `fill_check.cu`, loaded for one device.
//!
//! `fill` writes a rank's [`pattern`](super::pattern) into a device view;
//! `check_all_reduce` counts the elements of an all-reduce result that miss the f64
//! reference, on the device, and returns the count. Both run on the view's stream.

use std::ffi::c_void;
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaContext, CudaFunction, result, sys};

use super::error::driver_error;
use super::kernels::{FILL_CHECK, KernelCache};
use super::pattern::{dtype_code, op_code};
use super::stream::cu_stream;
use crate::buffer::{BufferMut, BufferRef, MemoryLocation, RawStream};
use crate::dtype::{DType, ReduceOp};
use crate::error::{Error, Result};

const THREADS: u32 = 256;

/// The fill/check kernels of one device.
#[derive(Debug)]
pub struct PatternKernels {
    ctx: Arc<CudaContext>,
    fill: Vec<CudaFunction>,
    check: Vec<CudaFunction>,
    max_blocks: u32,
    /// The check's count of wrong elements. Kept for the kernels' life: a `cuMemFree` waits
    /// for the whole device, so a buffer freed per check deadlocks ranks that share the
    /// device in one process (the free waits for a peer's kernel, which waits for this
    /// rank's next call; the driver's lock held by the free also stops the peer's enqueues).
    counter: Mutex<super::DeviceBuffer>,
}

impl PatternKernels {
    /// Compiles (or finds in the cache) and loads the kernels into `ctx`.
    pub fn load(ctx: &Arc<CudaContext>) -> Result<Self> {
        let cache = KernelCache::global();
        let load = |prefix: &str| {
            DType::ALL
                .iter()
                .map(|d| cache.function(ctx, &FILL_CHECK, &format!("{prefix}_{}", d.name())))
                .collect::<Result<Vec<_>>>()
        };
        let sms = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(driver_error)?;
        Ok(PatternKernels {
            ctx: ctx.clone(),
            fill: load("comm_fill")?,
            check: load("comm_check_all_reduce")?,
            max_blocks: (sms.max(1) as u32) * 8,
            counter: Mutex::new(super::DeviceBuffer::alloc(ctx, 8)?),
        })
    }

    /// Writes `rank`'s pattern under `seed` into `buf`, on its stream (does not wait).
    pub fn fill(&self, buf: BufferMut<'_>, seed: u64, rank: u32) -> Result<()> {
        let stream = self.stream_of(buf.location())?;
        if buf.is_empty() {
            return Ok(());
        }
        let mut ptr = buf.addr() as u64;
        let mut count = buf.len() as u64;
        let (mut seed, mut rank) = (seed, rank);
        let mut params = crate::kernel_params![ptr, count, seed, rank];
        let f = &self.fill[dtype_code(buf.dtype()) as usize];
        self.launch(f, buf.len(), stream, &mut params)
    }

    /// Counts the elements of `buf` that differ from the all-reduce (`op`) of the patterns
    /// of ranks `0..world` under `seed`. Runs on the view's stream and waits for it.
    pub fn check_all_reduce(
        &self,
        buf: BufferRef<'_>,
        op: ReduceOp,
        seed: u64,
        world: u32,
    ) -> Result<u64> {
        let stream = self.stream_of(buf.location())?;
        if buf.is_empty() {
            return Ok(0);
        }
        // Held until the count is read: checks from several threads take turns.
        let counter = self.counter.lock().unwrap_or_else(|e| e.into_inner());
        self.ctx.bind_to_thread().map_err(driver_error)?;
        let raw = cu_stream(stream);
        // SAFETY: an 8-byte allocation of this context, on a stream of it.
        unsafe { result::memset_d8_async(counter.device_ptr(), 0, 8, raw) }
            .map_err(driver_error)?;
        let mut ptr = buf.addr() as u64;
        let mut count = buf.len() as u64;
        let (mut seed, mut world, mut op) = (seed, world, op_code(op));
        let mut wrong = counter.device_ptr();
        let mut params = crate::kernel_params![ptr, count, seed, world, op, wrong];
        let f = &self.check[dtype_code(buf.dtype()) as usize];
        self.launch(f, buf.len(), stream, &mut params)?;
        let mut out = [0u64; 1];
        // SAFETY: the counter holds 8 bytes; the stream is synchronised before `out` is read.
        unsafe {
            result::memcpy_dtoh_async(&mut out, counter.device_ptr(), raw).map_err(driver_error)?;
            result::stream::synchronize(raw).map_err(driver_error)?;
        }
        Ok(out[0])
    }

    fn stream_of(&self, location: MemoryLocation) -> Result<RawStream> {
        match location {
            MemoryLocation::Device { ordinal, stream }
                if ordinal as usize == self.ctx.ordinal() =>
            {
                Ok(stream)
            }
            other => Err(Error::InvalidArgument(format!(
                "pattern kernels of device {} got a buffer in {other:?}",
                self.ctx.ordinal()
            ))),
        }
    }

    fn launch(
        &self,
        f: &CudaFunction,
        len: usize,
        stream: RawStream,
        params: &mut [*mut c_void],
    ) -> Result<()> {
        self.ctx.bind_to_thread().map_err(driver_error)?;
        let blocks = (len as u64)
            .div_ceil(u64::from(THREADS))
            .min(u64::from(self.max_blocks)) as u32;
        // SAFETY: the function comes from a loaded module of this context; `params` match
        // the kernel's signature (pointers and counts as u64, rank/world/op as u32) and
        // live until cuLaunchKernel has copied them.
        unsafe {
            result::launch_kernel(
                f.cu_function(),
                (blocks, 1, 1),
                (THREADS, 1, 1),
                0,
                cu_stream(stream),
                params,
            )
        }
        .map_err(driver_error)
    }
}
