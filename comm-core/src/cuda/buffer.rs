//! [`DeviceBuffer`]: device memory from `cuMemAlloc`, freed on drop.
//!
//! `cudarc`'s `stream.alloc*` takes memory from the stream-ordered pool
//! (`cuMemAllocAsync`), which `cuIpcGetMemHandle` rejects. Backends that share buffers
//! between processes (and tests that want plain memory) use this type instead. Copies to
//! and from the host are ordered on the caller's stream and wait for it, so that the host
//! slice is free again when they return.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaStream, result, sys};

use super::error::driver_error;
use super::stream::raw_stream;
use crate::buffer::{BufferMut, BufferRef};
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};

/// `bytes` bytes of device memory of one context, from `cuMemAlloc` ([`Self::alloc`]) or
/// from the stream-ordered pool ([`Self::alloc_on`]).
#[derive(Debug)]
pub struct DeviceBuffer {
    ptr: sys::CUdeviceptr,
    bytes: usize,
    ctx: Arc<CudaContext>,
    /// The stream a pool allocation is ordered on (and freed on); `None` for `cuMemAlloc`.
    pool: Option<Arc<CudaStream>>,
}

impl DeviceBuffer {
    /// Allocates `bytes` bytes (uninitialised) on `ctx`'s device. Zero bytes allocate one,
    /// so that the pointer is always a real allocation.
    pub fn alloc(ctx: &Arc<CudaContext>, bytes: usize) -> Result<Self> {
        ctx.bind_to_thread().map_err(driver_error)?;
        // SAFETY: the context is current; the size is non-zero.
        let ptr = unsafe { result::malloc_sync(bytes.max(1)) }.map_err(driver_error)?;
        Ok(DeviceBuffer {
            ptr,
            bytes,
            ctx: ctx.clone(),
            pool: None,
        })
    }

    /// Allocates `bytes` bytes (uninitialised) from the device's stream-ordered pool,
    /// ordered on `stream` and freed there on drop. Unlike `cuMemAlloc`/`cuMemFree`, which
    /// may wait for the whole device (and, with peer access enabled, for its peers),
    /// this never blocks behind a running kernel: with several ranks in one process, a
    /// rank that allocates while a peer's collective kernel spins waiting for it would
    /// otherwise deadlock. The memory cannot be shared through CUDA IPC.
    pub fn alloc_on(stream: &Arc<CudaStream>, bytes: usize) -> Result<Self> {
        let ctx = stream.context();
        ctx.bind_to_thread().map_err(driver_error)?;
        // SAFETY: the context is current; the size is non-zero; the stream is live.
        let ptr = unsafe { result::malloc_async(stream.cu_stream(), bytes.max(1)) }
            .map_err(driver_error)?;
        Ok(DeviceBuffer {
            ptr,
            bytes,
            ctx: ctx.clone(),
            pool: Some(stream.clone()),
        })
    }

    /// Device address of the first byte.
    pub fn device_ptr(&self) -> u64 {
        self.ptr
    }

    /// Size in bytes.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The context the memory belongs to.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// Copies `src` to byte `offset` of the buffer, ordered on `stream`; returns once done.
    pub fn upload_bytes(&mut self, stream: &CudaStream, offset: usize, src: &[u8]) -> Result<()> {
        self.check_range(offset, src.len())?;
        self.ctx.bind_to_thread().map_err(driver_error)?;
        // SAFETY: the range is inside the allocation; `src` outlives the copy because the
        // stream is synchronised before returning.
        unsafe {
            result::memcpy_htod_async(self.ptr + offset as u64, src, stream.cu_stream())
                .map_err(driver_error)?;
        }
        stream.synchronize().map_err(driver_error)
    }

    /// Copies byte `offset..offset + dst.len()` of the buffer into `dst`, ordered on
    /// `stream` (after the work already enqueued there); returns once done.
    pub fn download_bytes(&self, stream: &CudaStream, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.check_range(offset, dst.len())?;
        self.ctx.bind_to_thread().map_err(driver_error)?;
        // SAFETY: the range is inside the allocation; `dst` outlives the copy because the
        // stream is synchronised before returning.
        unsafe {
            result::memcpy_dtoh_async(dst, self.ptr + offset as u64, stream.cu_stream())
                .map_err(driver_error)?;
        }
        stream.synchronize().map_err(driver_error)
    }

    /// Copies a typed slice to the start of the buffer.
    pub fn upload<T: Element>(&mut self, stream: &CudaStream, src: &[T]) -> Result<()> {
        self.upload_bytes(stream, 0, bytemuck::cast_slice(src))
    }

    /// Copies the start of the buffer into a typed slice.
    pub fn download<T: Element>(&self, stream: &CudaStream, dst: &mut [T]) -> Result<()> {
        self.download_bytes(stream, 0, bytemuck::cast_slice_mut(dst))
    }

    /// Sets every byte to `value`, ordered on `stream` (does not wait).
    pub fn fill_bytes(&mut self, stream: &CudaStream, value: u8) -> Result<()> {
        self.ctx.bind_to_thread().map_err(driver_error)?;
        // SAFETY: the whole allocation, on a stream of its context.
        unsafe { result::memset_d8_async(self.ptr, value, self.bytes, stream.cu_stream()) }
            .map_err(driver_error)
    }

    /// The whole buffer as `bytes / dtype.size()` elements of `dtype`, for a collective
    /// enqueued on `stream`.
    pub fn view(&self, dtype: DType, stream: &CudaStream) -> Result<BufferRef<'_>> {
        let len = self.elements(dtype)?;
        // SAFETY: the memory is allocated for the borrow's lifetime and holds `len`
        // elements; the shared borrow keeps our own host copies away.
        Ok(unsafe {
            BufferRef::from_device_ptr(
                self.ptr,
                len,
                dtype,
                self.ctx.ordinal() as i32,
                raw_stream(stream),
            )
        })
    }

    /// The whole buffer as writable elements of `dtype`, for a collective on `stream`.
    pub fn view_mut(&mut self, dtype: DType, stream: &CudaStream) -> Result<BufferMut<'_>> {
        let len = self.elements(dtype)?;
        // SAFETY: as in `view`; the exclusive borrow keeps every other user away.
        Ok(unsafe {
            BufferMut::from_device_ptr(
                self.ptr,
                len,
                dtype,
                self.ctx.ordinal() as i32,
                raw_stream(stream),
            )
        })
    }

    /// The CUDA IPC handle of this allocation (`cuIpcGetMemHandle`), for another process
    /// to open with `cuIpcOpenMemHandle`.
    pub fn ipc_handle(&self) -> Result<[u8; 64]> {
        if self.pool.is_some() {
            return Err(Error::Unsupported(
                "stream-ordered pool memory has no CUDA IPC handle".into(),
            ));
        }
        self.ctx.bind_to_thread().map_err(driver_error)?;
        let mut handle = sys::CUipcMemHandle { reserved: [0; 64] };
        // SAFETY: `ptr` is the base of a cuMemAlloc allocation of the current context.
        unsafe { sys::cuIpcGetMemHandle(&mut handle, self.ptr) }
            .result()
            .map_err(driver_error)?;
        Ok(handle.reserved.map(|b| b as u8))
    }

    fn elements(&self, dtype: DType) -> Result<usize> {
        if self.bytes % dtype.size() != 0 {
            return Err(Error::InvalidArgument(format!(
                "a buffer of {} bytes is not a whole number of {dtype} elements",
                self.bytes
            )));
        }
        Ok(self.bytes / dtype.size())
    }

    fn check_range(&self, offset: usize, len: usize) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.bytes => Ok(()),
            _ => Err(Error::InvalidArgument(format!(
                "bytes {offset}..{offset}+{len} are outside a buffer of {} bytes",
                self.bytes
            ))),
        }
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // A failure here (a context already torn down) leaves nothing to free, and drop
        // cannot report it; the memory goes with the context.
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: allocated in this context (by cuMemAlloc, or from the pool on
            // `stream`, after whose earlier work it is freed) and freed only here.
            let _ = unsafe {
                match &self.pool {
                    None => result::free_sync(self.ptr),
                    Some(stream) => result::free_async(self.ptr, stream.cu_stream()),
                }
            };
        }
    }
}
