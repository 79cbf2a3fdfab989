//! Zero-copy buffers: device memory allocated from the communicator, so that peers read
//! an input where it is instead of from a copy in the communicator's own region (the idea
//! of symmetric allocation, and of vLLM's registered graph buffers).

use std::sync::{Arc, Mutex};

use comm_core::cuda::cudarc::driver::CudaStream;
use comm_core::cuda::stream::raw_stream;
use comm_core::{Bootstrap, BufferMut, BufferRef, DType, Result};

use crate::registered::Registered;
use crate::source::PeerSource;

/// Where a zero-copy input lies: its buffer's device table of every rank's address, the
/// input's byte offset in it, and the buffer's registration number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ZeroCopy {
    pub(crate) table: u64,
    pub(crate) offset: u64,
    /// Counts this communicator's registrations, which every rank makes in the same order:
    /// ranks that name different buffers at one offset disagree here (modulo 2^16).
    pub(crate) buffer: u16,
}

/// One registered buffer: its base address, size, device table and number.
#[derive(Debug, Clone, Copy)]
struct Entry {
    base: u64,
    bytes: usize,
    table: u64,
    number: u16,
}

/// The registered buffers of one communicator, and the number of the next.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    entries: Mutex<(Vec<Entry>, u16)>,
}

impl Registry {
    /// Where `bytes` at `addr` lie in a registered buffer, if they do.
    pub(crate) fn find(&self, addr: u64, bytes: usize) -> Option<ZeroCopy> {
        let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries
            .0
            .iter()
            .find(|e| addr >= e.base && addr + bytes as u64 <= e.base + e.bytes as u64)
            .map(|e| ZeroCopy {
                table: e.table,
                offset: addr - e.base,
                buffer: e.number,
            })
    }

    fn insert(&self, base: u64, bytes: usize, table: u64) {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let number = entries.1;
        entries.0.push(Entry {
            base,
            bytes,
            table,
            number,
        });
        entries.1 = number.wrapping_add(1);
    }

    fn remove(&self, base: u64) {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries.0.retain(|e| e.base != base);
    }
}

/// Device memory registered with every rank of an [`PeerComm`](crate::PeerComm), from
/// [`PeerComm::alloc`](crate::PeerComm::alloc). All-reduces whose input lies in such a buffer
/// skip the copy into the communicator's region (pull algorithms).
///
/// Dropping is collective, as dropping the communicator is: every rank synchronises the
/// streams that used the buffer, then drops it; the drop waits (bounded) for every rank
/// before the memory goes, since a peer may read this rank's buffer until its own kernel
/// has completed.
pub struct PeerBuffer {
    backend: &'static str,
    reg: Registered,
    bytes: usize,
    registry: Arc<Registry>,
    bootstrap: Arc<dyn Bootstrap>,
}

impl std::fmt::Debug for PeerBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerBuffer")
            .field("reg", &self.reg)
            .field("bytes", &self.bytes)
            .finish_non_exhaustive()
    }
}

impl PeerBuffer {
    pub(crate) fn new(
        backend: &'static str,
        reg: Registered,
        bytes: usize,
        registry: Arc<Registry>,
        bootstrap: Arc<dyn Bootstrap>,
    ) -> Self {
        registry.insert(reg.buffer().device_ptr(), bytes, reg.table());
        PeerBuffer {
            backend,
            reg,
            bytes,
            registry,
            bootstrap,
        }
    }

    /// Device address of the first byte.
    pub fn device_ptr(&self) -> u64 {
        self.reg.buffer().device_ptr()
    }

    /// Size in bytes.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Elements `offset .. offset + len` of `dtype`, for a collective on `stream`.
    pub fn view(
        &self,
        dtype: DType,
        offset: usize,
        len: usize,
        stream: &CudaStream,
    ) -> Result<BufferRef<'_>> {
        let addr = self.range(dtype, offset, len)?;
        // SAFETY: the range lies inside the allocation, which the view borrows.
        Ok(unsafe {
            BufferRef::from_device_ptr(addr, len, dtype, self.ordinal(), raw_stream(stream))
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
        let addr = self.range(dtype, offset, len)?;
        // SAFETY: the range lies inside the allocation, which the view borrows exclusively.
        Ok(unsafe {
            BufferMut::from_device_ptr(addr, len, dtype, self.ordinal(), raw_stream(stream))
        })
    }

    /// Copies host bytes to byte `offset`, ordered on `stream`; returns once done.
    pub fn upload(&mut self, stream: &CudaStream, offset: usize, src: &[u8]) -> Result<()> {
        self.reg.buffer_mut().upload_bytes(stream, offset, src)
    }

    /// Copies bytes from byte `offset` into `dst`, after the work on `stream`; returns once done.
    pub fn download(&self, stream: &CudaStream, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.reg.buffer().download_bytes(stream, offset, dst)
    }

    fn ordinal(&self) -> i32 {
        self.reg.buffer().context().ordinal() as i32
    }

    fn range(&self, dtype: DType, offset: usize, len: usize) -> Result<u64> {
        // One checked computation for every registered buffer: products that wrap are refused.
        comm_core::registered::byte_range(self, dtype, offset, len)
    }
}

impl comm_core::RegisteredBuffer for PeerBuffer {
    fn backend(&self) -> &str {
        self.backend
    }

    fn device_ptr(&self) -> u64 {
        PeerBuffer::device_ptr(self)
    }

    fn bytes(&self) -> usize {
        self.bytes
    }

    fn ordinal(&self) -> usize {
        self.reg.buffer().context().ordinal()
    }
}

impl Drop for PeerBuffer {
    fn drop(&mut self) {
        self.registry.remove(self.device_ptr());
        if self.bootstrap.world_size() > 1 {
            let _ = self.bootstrap.barrier();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_finds_ranges_inside_buffers_only() {
        let r = Registry::default();
        r.insert(0x1000, 256, 0xaa);
        r.insert(0x4000, 64, 0xbb);
        let at = |table, offset, buffer| {
            Some(ZeroCopy {
                table,
                offset,
                buffer,
            })
        };
        assert_eq!(r.find(0x1000, 256), at(0xaa, 0, 0));
        assert_eq!(r.find(0x1010, 16), at(0xaa, 0x10, 0));
        assert_eq!(r.find(0x1010, 256), None);
        assert_eq!(r.find(0x4020, 32), at(0xbb, 0x20, 1));
        assert_eq!(r.find(0x3000, 4), None);
        r.remove(0x1000);
        assert_eq!(r.find(0x1000, 4), None);
        // A later registration at a freed address is another buffer.
        r.insert(0x1000, 256, 0xcc);
        assert_eq!(r.find(0x1000, 4), at(0xcc, 0, 2));
    }
}
