//! The private scratch buffer of all-gathers and reduce-scatters cut into several launches
//! (see `chunks`), and the strided copies between it and the caller's buffer.

use std::sync::Arc;

use comm_core::cuda::DeviceBuffer;
use comm_core::cuda::cudarc::driver::{CudaContext, CudaStream, result, sys};
use comm_core::cuda::driver_error;
use comm_core::cuda::stream::cu_stream;
use comm_core::{RawStream, Result};

/// The largest row pitch one 2D copy takes (`CU_DEVICE_ATTRIBUTE_MAX_PITCH` of current
/// devices); rows further apart are copied one by one.
const MAX_PITCH: usize = i32::MAX as usize;

/// Device memory of this rank alone, never mapped by peers.
#[derive(Debug)]
pub(crate) struct Scratch {
    buffer: DeviceBuffer,
}

impl Scratch {
    /// `bytes` from the stream-ordered pool, ordered on `stream` and freed there: unlike
    /// `cuMemAlloc`/`cuMemFree`, neither waits behind a peer's spinning kernel on this
    /// device. Ready for every stream once this returns.
    pub(crate) fn new(stream: &Arc<CudaStream>, bytes: usize) -> Result<Self> {
        let buffer = DeviceBuffer::alloc_on(stream, bytes)?;
        stream.synchronize().map_err(driver_error)?;
        Ok(Scratch { buffer })
    }

    /// Device address of the first byte (a pool allocation: 256-byte aligned at least).
    pub(crate) fn addr(&self) -> u64 {
        self.buffer.device_ptr()
    }
}

/// `rows` rows of `width` bytes, from rows `src_pitch` apart at `src` to rows `dst_pitch`
/// apart at `dst`, all of one device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Rows {
    pub dst: u64,
    pub dst_pitch: usize,
    pub src: u64,
    pub src_pitch: usize,
    pub width: usize,
    pub rows: usize,
}

impl Rows {
    /// Enqueues the copy on `stream`: one 2D copy, or one copy per row where a pitch is
    /// beyond what a 2D copy takes.
    pub(crate) fn copy(&self, ctx: &CudaContext, stream: RawStream) -> Result<()> {
        ctx.bind_to_thread().map_err(driver_error)?;
        let stream = cu_stream(stream);
        if self.src_pitch.max(self.dst_pitch) <= MAX_PITCH {
            let copy = sys::CUDA_MEMCPY2D {
                srcXInBytes: 0,
                srcY: 0,
                srcMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
                srcHost: std::ptr::null(),
                srcDevice: self.src,
                srcArray: std::ptr::null_mut(),
                srcPitch: self.src_pitch,
                dstXInBytes: 0,
                dstY: 0,
                dstMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
                dstHost: std::ptr::null_mut(),
                dstDevice: self.dst,
                dstArray: std::ptr::null_mut(),
                dstPitch: self.dst_pitch,
                WidthInBytes: self.width,
                Height: self.rows,
            };
            // SAFETY: both ranges are device memory of the current context that the
            // caller's views (or the scratch buffer) hold; the driver reads the
            // descriptor before returning, and orders the copy on the stream.
            return unsafe { sys::cuMemcpy2DAsync_v2(&copy, stream) }
                .result()
                .map_err(driver_error);
        }
        for row in 0..self.rows as u64 {
            // SAFETY: as above, row by row.
            unsafe {
                result::memcpy_dtod_async(
                    self.dst + row * self.dst_pitch as u64,
                    self.src + row * self.src_pitch as u64,
                    self.width,
                    stream,
                )
            }
            .map_err(driver_error)?;
        }
        Ok(())
    }
}
