//! [`NcclBuffer`]: device memory registered with every rank as a symmetric window, from
//! [`NcclComm::alloc`](crate::NcclComm::alloc).

use comm_core::cuda::cudarc::driver::CudaStream;
use comm_core::cuda::cudarc::driver::result;
use comm_core::cuda::{driver_error, raw_stream};
use comm_core::registered::byte_range;
use comm_core::{BufferMut, BufferRef, DType, RegisteredBuffer, Result};

use crate::window::Window;

/// Memory from `ncclMemAlloc`, registered with every rank as a symmetric window: NCCL
/// (2.27 or newer) runs its low-latency symmetric kernels on calls whose buffers all lie in
/// such windows, at the same offsets on every rank. The same contract as comm-ipc's
/// zero-copy buffers: allocating is collective (same size, same order on every rank), a
/// call uses the same offsets on every rank (ranks that do not get [`comm_core::Error::Mismatch`]
/// when calls are validated), and dropping is collective: synchronise the streams that used
/// the buffer on every rank, then drop it there; the drop waits (bounded) for every rank
/// and deregisters the window.
#[derive(Debug)]
pub struct NcclBuffer {
    window: Window,
}

impl NcclBuffer {
    pub(crate) fn new(window: Window) -> Self {
        NcclBuffer { window }
    }

    /// Elements `offset .. offset + len` of `dtype`, for a collective on `stream`.
    pub fn view(
        &self,
        dtype: DType,
        offset: usize,
        len: usize,
        stream: &CudaStream,
    ) -> Result<BufferRef<'_>> {
        let addr = byte_range(self, dtype, offset, len)?;
        // SAFETY: the range lies inside the window's memory, which the view borrows.
        Ok(unsafe {
            BufferRef::from_device_ptr(addr, len, dtype, self.ordinal() as i32, raw_stream(stream))
        })
    }

    /// Writable elements `offset .. offset + len` of `dtype`, for a collective on `stream`.
    pub fn view_mut(
        &mut self,
        dtype: DType,
        offset: usize,
        len: usize,
        stream: &CudaStream,
    ) -> Result<BufferMut<'_>> {
        let addr = byte_range(self, dtype, offset, len)?;
        // SAFETY: the range lies inside the window's memory, borrowed exclusively.
        Ok(unsafe {
            BufferMut::from_device_ptr(addr, len, dtype, self.ordinal() as i32, raw_stream(stream))
        })
    }

    /// Copies host bytes to byte `offset`, ordered on `stream`; returns once done.
    pub fn upload(&mut self, stream: &CudaStream, offset: usize, src: &[u8]) -> Result<()> {
        let at = byte_range(self, DType::U8, offset, src.len())?;
        self.window
            .context()
            .bind_to_thread()
            .map_err(driver_error)?;
        // SAFETY: the range lies inside the window; the copy completes before returning,
        // so `src` outlives it.
        unsafe { result::memcpy_htod_async(at, src, stream.cu_stream()) }.map_err(driver_error)?;
        stream.synchronize().map_err(driver_error)
    }

    /// Copies bytes from byte `offset` into `dst`, after the work on `stream`; returns once done.
    pub fn download(&self, stream: &CudaStream, offset: usize, dst: &mut [u8]) -> Result<()> {
        let at = byte_range(self, DType::U8, offset, dst.len())?;
        self.window
            .context()
            .bind_to_thread()
            .map_err(driver_error)?;
        // SAFETY: as in `upload`.
        unsafe { result::memcpy_dtoh_async(dst, at, stream.cu_stream()) }.map_err(driver_error)?;
        stream.synchronize().map_err(driver_error)
    }
}

impl RegisteredBuffer for NcclBuffer {
    fn backend(&self) -> &str {
        "nccl"
    }

    fn device_ptr(&self) -> u64 {
        self.window.ptr()
    }

    fn bytes(&self) -> usize {
        self.window.bytes()
    }

    fn ordinal(&self) -> usize {
        self.window.context().ordinal()
    }
}
