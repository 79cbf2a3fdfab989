//! [`DeviceMemory`]: one device and one stream, where tests and tools allocate buffers.
//!
//! With feature `conformance` it is the suite's
//! [`TestMemory`](crate::conformance::TestMemory): `conformance::run_with_memory(&comm,
//! &DeviceMemory::new(0)?, &config)` runs every case on device buffers, collectives on
//! the memory's stream, reads ordered after them.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaStream};

use super::buffer::DeviceBuffer;
use super::error::driver_error;
use super::probe;
use super::stream::raw_stream;
use crate::buffer::{BufferMut, BufferRef, RawStream};
use crate::dtype::DType;
use crate::error::{Error, Result};

/// Buffers on one device (from its stream-ordered pool), with collectives and copies on
/// one stream.
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

    /// The stream as the buffer views carry it.
    pub fn raw_stream(&self) -> RawStream {
        raw_stream(&self.stream)
    }

    /// The context of the device.
    pub fn context(&self) -> &Arc<CudaContext> {
        self.stream.context()
    }

    /// Waits for the work enqueued on the stream.
    pub fn synchronize(&self) -> Result<()> {
        self.stream.synchronize().map_err(driver_error)
    }

    /// Allocates `len` elements of `dtype` (contents unspecified), from the stream-ordered
    /// pool on the memory's stream (see [`DeviceBuffer::alloc_on`]: allocating and freeing
    /// never wait behind another rank's kernel).
    pub fn alloc(&self, dtype: DType, len: usize) -> Result<DeviceOwned> {
        Ok(DeviceOwned {
            buf: DeviceBuffer::alloc_on(&self.stream, len * dtype.size())?,
            dtype,
            len,
            stream: self.stream.clone(),
        })
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

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the buffer holds no element.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Sets every byte to `value` on the stream (does not wait): poison before a run.
    pub fn poison(&mut self, value: u8) -> Result<()> {
        self.buf.fill_bytes(&self.stream, value)
    }

    /// Overwrites the whole buffer with `bytes` (exactly its size); returns once copied.
    pub fn write(&mut self, bytes: &[u8]) -> Result<()> {
        self.check_size(bytes.len())?;
        self.buf.upload_bytes(&self.stream, 0, bytes)
    }

    /// The whole buffer, after the work enqueued on the stream.
    pub fn read(&self) -> Result<Vec<u8>> {
        let mut out = vec![0u8; self.len * self.dtype.size()];
        self.buf.download_bytes(&self.stream, 0, &mut out)?;
        Ok(out)
    }

    /// A view of elements `offset .. offset + len`.
    pub fn view(&self, offset: usize, len: usize) -> Result<BufferRef<'_>> {
        let addr = self.range(offset, len)?;
        // SAFETY: the range is inside the allocation, which the view borrows.
        Ok(
            unsafe {
                BufferRef::from_device_ptr(addr, len, self.dtype, self.ordinal(), self.raw())
            },
        )
    }

    /// A writable view of elements `offset .. offset + len`.
    pub fn view_mut(&mut self, offset: usize, len: usize) -> Result<BufferMut<'_>> {
        let addr = self.range(offset, len)?;
        // SAFETY: the range is inside the allocation, which the view borrows exclusively.
        Ok(
            unsafe {
                BufferMut::from_device_ptr(addr, len, self.dtype, self.ordinal(), self.raw())
            },
        )
    }

    fn ordinal(&self) -> i32 {
        self.buf.context().ordinal() as i32
    }

    fn raw(&self) -> RawStream {
        raw_stream(&self.stream)
    }

    fn range(&self, offset: usize, len: usize) -> Result<u64> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => {
                Ok(self.buf.device_ptr() + (offset * self.dtype.size()) as u64)
            }
            _ => Err(Error::InvalidArgument(format!(
                "view {offset}+{len} outside a buffer of {} elements",
                self.len
            ))),
        }
    }

    fn check_size(&self, bytes: usize) -> Result<()> {
        let want = self.len * self.dtype.size();
        if bytes == want {
            Ok(())
        } else {
            Err(Error::InvalidArgument(format!(
                "a buffer of {} x {} takes {want} bytes, got {bytes}",
                self.len, self.dtype
            )))
        }
    }
}

#[cfg(feature = "conformance")]
mod conformance_memory {
    use super::{DeviceMemory, DeviceOwned};
    use crate::buffer::{BufferMut, BufferRef};
    use crate::conformance::{TestBuffer, TestMemory};
    use crate::dtype::DType;
    use crate::error::Result;

    impl TestMemory for DeviceMemory {
        fn describe(&self) -> String {
            format!("cuda:{}", self.context().ordinal())
        }

        fn alloc(&self, dtype: DType, len: usize) -> Result<Box<dyn TestBuffer + '_>> {
            Ok(Box::new(DeviceMemory::alloc(self, dtype, len)?))
        }
    }

    // The suite asks only for ranges inside the buffer; an out-of-range request is a bug
    // of the suite, reported by an empty view at the buffer's start rather than a panic.
    impl TestBuffer for DeviceOwned {
        fn write(&mut self, bytes: &[u8]) -> Result<()> {
            DeviceOwned::write(self, bytes)
        }

        fn read(&mut self) -> Result<Vec<u8>> {
            DeviceOwned::read(self)
        }

        fn view(&self, offset: usize, len: usize) -> BufferRef<'_> {
            DeviceOwned::view(self, offset, len)
                .or_else(|_| DeviceOwned::view(self, 0, 0))
                .unwrap_or_else(|_| unreachable!("an empty view is always in range"))
        }

        fn view_mut(&mut self, offset: usize, len: usize) -> BufferMut<'_> {
            if DeviceOwned::view(self, offset, len).is_err() {
                return DeviceOwned::view_mut(self, 0, 0)
                    .unwrap_or_else(|_| unreachable!("an empty view is always in range"));
            }
            DeviceOwned::view_mut(self, offset, len)
                .unwrap_or_else(|_| unreachable!("checked just above"))
        }
    }
}
