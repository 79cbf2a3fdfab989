//! [`DeviceMemory`]: one device and one stream behind [`Memory`].

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaStream};

use super::buffer::DeviceBuffer;
use super::error::driver_error;
use super::probe;
use super::stream::raw_stream;
use crate::buffer::{BufferMut, BufferRef, MemoryLocation};
use crate::dtype::DType;
use crate::error::Result;
use crate::memory::{Memory, OwnedBuffer, check_size};

/// Buffers on one device (from `cuMemAlloc`), with collectives and copies on one stream.
#[derive(Debug, Clone)]
pub struct DeviceMemory {
    stream: Arc<CudaStream>,
}

impl DeviceMemory {
    /// A new stream on device `ordinal`, after probing the driver.
    pub fn new(ordinal: usize) -> Result<Self> {
        let ctx = probe::context(ordinal)?;
        let stream = ctx.new_stream().map_err(driver_error)?;
        Ok(DeviceMemory { stream })
    }

    /// Buffers used with `stream`.
    pub fn with_stream(stream: Arc<CudaStream>) -> Self {
        DeviceMemory { stream }
    }

    /// The stream collectives on these buffers are enqueued on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The context of the device.
    pub fn context(&self) -> &Arc<CudaContext> {
        self.stream.context()
    }

    /// Allocates a concrete device buffer (as [`Memory::alloc`], without the box).
    pub fn alloc_device(&self, dtype: DType, len: usize) -> Result<DeviceOwned> {
        Ok(DeviceOwned {
            buf: DeviceBuffer::alloc(self.context(), len * dtype.size())?,
            dtype,
            len,
            stream: self.stream.clone(),
        })
    }
}

impl Memory for DeviceMemory {
    fn location(&self) -> MemoryLocation {
        MemoryLocation::Device {
            ordinal: self.context().ordinal() as i32,
            stream: raw_stream(&self.stream),
        }
    }

    fn alloc(&self, dtype: DType, len: usize) -> Result<Box<dyn OwnedBuffer>> {
        Ok(Box::new(self.alloc_device(dtype, len)?))
    }

    fn synchronize(&self) -> Result<()> {
        self.stream.synchronize().map_err(driver_error)
    }
}

/// A typed device buffer of a [`DeviceMemory`], tied to its stream.
#[derive(Debug)]
pub struct DeviceOwned {
    buf: DeviceBuffer,
    dtype: DType,
    len: usize,
    stream: Arc<CudaStream>,
}

impl DeviceOwned {
    /// The underlying allocation.
    pub fn buffer(&self) -> &DeviceBuffer {
        &self.buf
    }

    /// Sets every byte to `value` on the stream (does not wait): poison before a run.
    pub fn poison(&mut self, value: u8) -> Result<()> {
        self.buf.fill_bytes(&self.stream, value)
    }
}

impl OwnedBuffer for DeviceOwned {
    fn dtype(&self) -> DType {
        self.dtype
    }

    fn len(&self) -> usize {
        self.len
    }

    fn write(&mut self, bytes: &[u8]) -> Result<()> {
        check_size(self.dtype, self.len, bytes.len())?;
        self.buf.upload_bytes(&self.stream, 0, bytes)
    }

    fn read(&self, out: &mut [u8]) -> Result<()> {
        check_size(self.dtype, self.len, out.len())?;
        self.buf.download_bytes(&self.stream, 0, out)
    }

    fn view(&self) -> BufferRef<'_> {
        // SAFETY: the allocation holds `len` elements of `dtype` and is borrowed with the view.
        unsafe {
            BufferRef::from_device_ptr(
                self.buf.device_ptr(),
                self.len,
                self.dtype,
                self.buf.context().ordinal() as i32,
                raw_stream(&self.stream),
            )
        }
    }

    fn view_mut(&mut self) -> BufferMut<'_> {
        // SAFETY: as in `view`, exclusively borrowed.
        unsafe {
            BufferMut::from_device_ptr(
                self.buf.device_ptr(),
                self.len,
                self.dtype,
                self.buf.context().ordinal() as i32,
                raw_stream(&self.stream),
            )
        }
    }
}
