//! [`RegisteredBuffer`]: device memory a communicator allocated and registered with every
//! rank, the one way to tell a backend "this buffer is used for collectives".
//!
//! Backends that can do more with memory they know in advance hand such buffers out from
//! [`Communicator::alloc_registered`](crate::Communicator::alloc_registered): comm-ipc's
//! zero-copy buffers (peers read an input where it lies), comm-nccl's symmetric windows
//! (NCCL's low-latency kernels for registered memory). Calls take views of them like any
//! other device memory; a backend that does not know the buffer treats it as plain memory.
//!
//! Allocating and dropping are collective: every rank allocates the same size in the same
//! order, and synchronises the streams that used a buffer before dropping it; the drop waits
//! (bounded) for every rank, since a peer may read this rank's memory until its own work
//! has completed.

use std::fmt;

use crate::buffer::{BufferMut, BufferRef, RawStream};
use crate::dtype::DType;
use crate::error::{Error, Result};

/// Device memory registered with every rank of the communicator that allocated it.
pub trait RegisteredBuffer: Send + fmt::Debug {
    /// The backend that registered it (its communicator's name).
    fn backend(&self) -> &str;

    /// Device address of the first byte.
    fn device_ptr(&self) -> u64;

    /// Size in bytes.
    fn bytes(&self) -> usize;

    /// The CUDA ordinal of the device it lives on.
    fn ordinal(&self) -> usize;
}

impl dyn RegisteredBuffer {
    /// Elements `offset .. offset + len` of `dtype`, for a collective on `stream`.
    pub fn view(
        &self,
        dtype: DType,
        offset: usize,
        len: usize,
        stream: RawStream,
    ) -> Result<BufferRef<'_>> {
        let addr = byte_range(self, dtype, offset, len)?;
        // SAFETY: the range lies inside the allocation, which the view borrows.
        Ok(unsafe { BufferRef::from_device_ptr(addr, len, dtype, self.ordinal() as i32, stream) })
    }

    /// Writable elements `offset .. offset + len` of `dtype`, for a collective on `stream`.
    pub fn view_mut(
        &mut self,
        dtype: DType,
        offset: usize,
        len: usize,
        stream: RawStream,
    ) -> Result<BufferMut<'_>> {
        let addr = byte_range(self, dtype, offset, len)?;
        // SAFETY: the range lies inside the allocation, which the view borrows exclusively.
        Ok(unsafe { BufferMut::from_device_ptr(addr, len, dtype, self.ordinal() as i32, stream) })
    }
}

/// The device address of elements `offset .. offset + len` of `dtype` in `buffer`, or an
/// error naming the buffer's size when they do not lie inside it.
pub fn byte_range(
    buffer: &(impl RegisteredBuffer + ?Sized),
    dtype: DType,
    offset: usize,
    len: usize,
) -> Result<u64> {
    let end = offset
        .checked_add(len)
        .and_then(|n| n.checked_mul(dtype.size()));
    match end {
        Some(end) if end <= buffer.bytes() => {
            Ok(buffer.device_ptr() + (offset * dtype.size()) as u64)
        }
        _ => Err(Error::InvalidArgument(format!(
            "elements {offset}+{len} of {dtype} are outside a {} buffer of {} bytes",
            buffer.backend(),
            buffer.bytes()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Fake;

    impl RegisteredBuffer for Fake {
        fn backend(&self) -> &str {
            "fake"
        }
        fn device_ptr(&self) -> u64 {
            0x1000
        }
        fn bytes(&self) -> usize {
            64
        }
        fn ordinal(&self) -> usize {
            0
        }
    }

    #[test]
    fn views_stay_inside_the_buffer() {
        let b: Box<dyn RegisteredBuffer> = Box::new(Fake);
        let v = b.view(DType::F32, 4, 12, RawStream::default()).unwrap();
        assert_eq!((v.addr(), v.len()), (0x1010, 12));
        let err = b.view(DType::F32, 4, 13, RawStream::default()).unwrap_err();
        assert!(err.to_string().contains("64 bytes"), "{err}");
        assert!(
            b.view(DType::F64, usize::MAX, 2, RawStream::default())
                .is_err()
        );
        // Offsets and lengths whose byte counts wrap are outside too, not views at small addresses.
        for (offset, len) in [
            (usize::MAX / 4, 1),
            (0, usize::MAX / 4 + 1),
            (1 << 61, 1 << 61),
        ] {
            assert!(
                b.view(DType::F64, offset, len, RawStream::default())
                    .is_err(),
                "{offset}+{len}"
            );
        }
    }
}
