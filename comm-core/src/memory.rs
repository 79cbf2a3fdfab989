//! Owned buffers in some memory, behind object-safe traits.
//!
//! The conformance suite and the tools make, fill and read buffers without knowing where
//! they live: a [`Memory`] allocates [`OwnedBuffer`]s (host: [`HostMemory`]; device:
//! `comm_core::cuda::DeviceMemory`, feature `cuda`), whose views are handed to a
//! [`Communicator`](crate::Communicator). Reads are ordered after the work already
//! enqueued on the memory's stream and wait for it, so "call, then read" is always right.

use std::fmt;

use crate::buffer::{BufferMut, BufferRef, MemoryLocation};
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use half::{bf16, f16};

/// Where buffers are allocated (host, or one device and stream).
pub trait Memory: Send + Sync + fmt::Debug {
    /// The location of every buffer this memory allocates (for a device, with its stream).
    fn location(&self) -> MemoryLocation;

    /// Allocates `len` elements of `dtype` (contents unspecified).
    fn alloc(&self, dtype: DType, len: usize) -> Result<Box<dyn OwnedBuffer>>;

    /// Waits for the work enqueued on this memory's stream (nothing to do on the host).
    fn synchronize(&self) -> Result<()>;
}

/// A buffer owned by its [`Memory`].
pub trait OwnedBuffer: Send + fmt::Debug {
    /// Element type.
    fn dtype(&self) -> DType;

    /// Number of elements.
    fn len(&self) -> usize;

    /// True when the buffer holds no element.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Overwrites the whole buffer with `bytes` (exactly `len * dtype.size()` of them).
    fn write(&mut self, bytes: &[u8]) -> Result<()>;

    /// Copies the whole buffer into `out` (exactly `len * dtype.size()` bytes), after the
    /// work enqueued on its stream.
    fn read(&self, out: &mut [u8]) -> Result<()>;

    /// A read-only view for a collective.
    fn view(&self) -> BufferRef<'_>;

    /// A writable view for a collective.
    fn view_mut(&mut self) -> BufferMut<'_>;
}

/// Checks that `bytes` is exactly the size of `len` elements of `dtype`.
pub(crate) fn check_size(dtype: DType, len: usize, bytes: usize) -> Result<()> {
    if bytes == len * dtype.size() {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!(
            "a buffer of {len} x {dtype} takes {} bytes, got {bytes}",
            len * dtype.size()
        )))
    }
}

/// Host memory of this process.
#[derive(Debug, Clone, Copy, Default)]
pub struct HostMemory;

impl Memory for HostMemory {
    fn location(&self) -> MemoryLocation {
        MemoryLocation::Host
    }

    fn alloc(&self, dtype: DType, len: usize) -> Result<Box<dyn OwnedBuffer>> {
        Ok(Box::new(HostBuffer {
            // u64 words, so that every dtype is aligned.
            words: vec![0; (len * dtype.size()).div_ceil(8)],
            dtype,
            len,
        }))
    }

    fn synchronize(&self) -> Result<()> {
        Ok(())
    }
}

/// A host buffer of [`HostMemory`].
#[derive(Debug)]
struct HostBuffer {
    words: Vec<u64>,
    dtype: DType,
    len: usize,
}

impl HostBuffer {
    fn bytes(&self) -> &[u8] {
        &bytemuck::cast_slice(&self.words)[..self.len * self.dtype.size()]
    }
}

fn typed<T: Element>(words: &[u64], len: usize) -> &[T] {
    &bytemuck::cast_slice(words)[..len]
}

fn typed_mut<T: Element>(words: &mut [u64], len: usize) -> &mut [T] {
    &mut bytemuck::cast_slice_mut(words)[..len]
}

impl OwnedBuffer for HostBuffer {
    fn dtype(&self) -> DType {
        self.dtype
    }

    fn len(&self) -> usize {
        self.len
    }

    fn write(&mut self, bytes: &[u8]) -> Result<()> {
        check_size(self.dtype, self.len, bytes.len())?;
        bytemuck::cast_slice_mut::<u64, u8>(&mut self.words)[..bytes.len()].copy_from_slice(bytes);
        Ok(())
    }

    fn read(&self, out: &mut [u8]) -> Result<()> {
        check_size(self.dtype, self.len, out.len())?;
        out.copy_from_slice(self.bytes());
        Ok(())
    }

    fn view(&self) -> BufferRef<'_> {
        let (w, n) = (&self.words[..], self.len);
        match self.dtype {
            DType::F32 => BufferRef::host(typed::<f32>(w, n)),
            DType::F64 => BufferRef::host(typed::<f64>(w, n)),
            DType::F16 => BufferRef::host(typed::<f16>(w, n)),
            DType::BF16 => BufferRef::host(typed::<bf16>(w, n)),
            DType::I32 => BufferRef::host(typed::<i32>(w, n)),
            DType::I64 => BufferRef::host(typed::<i64>(w, n)),
            DType::U8 => BufferRef::host(typed::<u8>(w, n)),
        }
    }

    fn view_mut(&mut self) -> BufferMut<'_> {
        let (w, n) = (&mut self.words[..], self.len);
        match self.dtype {
            DType::F32 => BufferMut::host(typed_mut::<f32>(w, n)),
            DType::F64 => BufferMut::host(typed_mut::<f64>(w, n)),
            DType::F16 => BufferMut::host(typed_mut::<f16>(w, n)),
            DType::BF16 => BufferMut::host(typed_mut::<bf16>(w, n)),
            DType::I32 => BufferMut::host(typed_mut::<i32>(w, n)),
            DType::I64 => BufferMut::host(typed_mut::<i64>(w, n)),
            DType::U8 => BufferMut::host(typed_mut::<u8>(w, n)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_buffers_round_trip_and_view() {
        let mut buf = HostMemory.alloc(DType::F64, 3).unwrap();
        let data = [1.5f64, -2.0, 3.25];
        buf.write(bytemuck::cast_slice(&data)).unwrap();
        assert_eq!(buf.view().host_slice::<f64>().unwrap(), &data);
        buf.view_mut().host_slice_mut::<f64>().unwrap()[1] = 7.0;
        let mut out = [0f64; 3];
        buf.read(bytemuck::cast_slice_mut(&mut out)).unwrap();
        assert_eq!(out, [1.5, 7.0, 3.25]);
        assert!(buf.write(&[0u8; 5]).is_err());
        let odd = HostMemory.alloc(DType::U8, 5).unwrap();
        assert_eq!(odd.view().bytes(), 5);
    }
}
