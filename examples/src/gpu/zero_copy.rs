//! Conformance buffers from `PeerComm::alloc`: every input is a zero-copy input.

use std::sync::Arc;

use comm_core::conformance::{TestBuffer, TestMemory};
use comm_core::cuda::cudarc::driver::CudaStream;
use comm_core::{BufferMut, BufferRef, DType, Result};
use comm_peer::{PeerBuffer, PeerComm};

/// Allocates every test buffer registered with every rank.
pub struct ZeroCopyMemory<'a> {
    /// The communicator the buffers are registered with.
    pub comm: &'a PeerComm,
    /// The stream of every view.
    pub stream: Arc<CudaStream>,
}

struct ZeroCopyBuffer {
    buf: PeerBuffer,
    dtype: DType,
    len: usize,
    stream: Arc<CudaStream>,
}

impl TestMemory for ZeroCopyMemory<'_> {
    fn describe(&self) -> String {
        format!("{} zero-copy", self.comm.name())
    }

    fn alloc(&self, dtype: DType, len: usize) -> Result<Box<dyn TestBuffer + '_>> {
        Ok(Box::new(ZeroCopyBuffer {
            buf: self.comm.alloc((len * dtype.size()).max(16))?,
            dtype,
            len,
            stream: self.stream.clone(),
        }))
    }
}

impl TestBuffer for ZeroCopyBuffer {
    fn write(&mut self, bytes: &[u8]) -> Result<()> {
        self.buf.upload(&self.stream, 0, bytes)
    }

    fn read(&mut self) -> Result<Vec<u8>> {
        let mut v = vec![0u8; self.len * self.dtype.size()];
        self.buf.download(&self.stream, 0, &mut v)?;
        Ok(v)
    }

    fn view(&self, offset: usize, len: usize) -> BufferRef<'_> {
        self.buf
            .view(self.dtype, offset, len, &self.stream)
            .expect("the suite asks for ranges inside its buffers")
    }

    fn view_mut(&mut self, offset: usize, len: usize) -> BufferMut<'_> {
        let (dtype, stream) = (self.dtype, self.stream.clone());
        self.buf
            .view_mut(dtype, offset, len, &stream)
            .expect("the suite asks for ranges inside its buffers")
    }
}
