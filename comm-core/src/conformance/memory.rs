//! Where the suite puts its buffers: host memory here, device memory from GPU crates.

use crate::buffer::{BufferMut, BufferRef};
use crate::dtype::DType;
use crate::error::Result;

/// Allocates the buffers the suite hands to the backend under test. Host backends use
/// [`HostMemory`]; a device backend passes an implementation over its device memory.
pub trait TestMemory {
    /// A short description for failure messages (`host`, `cuda:0`, ...).
    fn describe(&self) -> String;

    /// Allocates `len` elements of `dtype`; contents unspecified.
    fn alloc(&self, dtype: DType, len: usize) -> Result<Box<dyn TestBuffer + '_>>;
}

/// One buffer of a [`TestMemory`].
pub trait TestBuffer {
    /// Overwrites the whole buffer with `bytes` (exactly its size).
    fn write(&mut self, bytes: &[u8]) -> Result<()>;

    /// Waits for work enqueued on the buffer (if any) and returns its whole contents.
    fn read(&mut self) -> Result<Vec<u8>>;

    /// A view of elements `offset .. offset + len`.
    fn view(&self, offset: usize, len: usize) -> BufferRef<'_>;

    /// A writable view of elements `offset .. offset + len`.
    fn view_mut(&mut self, offset: usize, len: usize) -> BufferMut<'_>;
}

/// Ordinary host memory, 16-byte aligned.
#[derive(Debug, Default, Clone, Copy)]
pub struct HostMemory;

#[derive(Debug)]
struct HostBuffer {
    storage: Vec<u128>,
    dtype: DType,
    len: usize,
}

impl HostBuffer {
    fn bytes(&self) -> &[u8] {
        &bytemuck::cast_slice(&self.storage)[..self.len * self.dtype.size()]
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        let n = self.len * self.dtype.size();
        &mut bytemuck::cast_slice_mut(&mut self.storage)[..n]
    }

    fn range(&self, offset: usize, len: usize) -> std::ops::Range<usize> {
        assert!(
            offset + len <= self.len,
            "view {offset}+{len} outside a buffer of {}",
            self.len
        );
        let size = self.dtype.size();
        offset * size..(offset + len) * size
    }
}

impl TestMemory for HostMemory {
    fn describe(&self) -> String {
        "host".into()
    }

    fn alloc(&self, dtype: DType, len: usize) -> Result<Box<dyn TestBuffer + '_>> {
        let words = (len * dtype.size()).div_ceil(16);
        Ok(Box::new(HostBuffer {
            storage: vec![0; words],
            dtype,
            len,
        }))
    }
}

impl TestBuffer for HostBuffer {
    fn write(&mut self, bytes: &[u8]) -> Result<()> {
        self.bytes_mut().copy_from_slice(bytes);
        Ok(())
    }

    fn read(&mut self) -> Result<Vec<u8>> {
        Ok(self.bytes().to_vec())
    }

    fn view(&self, offset: usize, len: usize) -> BufferRef<'_> {
        let range = self.range(offset, len);
        BufferRef::from_host_bytes(&self.bytes()[range], self.dtype)
            .expect("aligned by construction")
    }

    fn view_mut(&mut self, offset: usize, len: usize) -> BufferMut<'_> {
        let range = self.range(offset, len);
        let dtype = self.dtype;
        BufferMut::from_host_bytes(&mut self.bytes_mut()[range], dtype)
            .expect("aligned by construction")
    }
}
