//! Buffer views: what a collective reads and writes.
//!
//! A view is a pointer, an element count, a [`DType`] and a [`MemoryLocation`]. Host views
//! are built safely from slices; device views come from the `cuda` side (or, unsafely,
//! from a raw device pointer and stream, the way NCCL takes them). Backends check the
//! location and return [`Error::Unsupported`] for memory they cannot touch.

use std::marker::PhantomData;

use crate::dtype::{DType, Element};
use crate::error::{Error, Result};

/// A CUDA stream handle (`CUstream`/`cudaStream_t`) as an address. `0` is the legacy
/// default stream. Kept as an integer so that `comm-core` needs no CUDA types.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RawStream(pub usize);

/// Where the memory of a view lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum MemoryLocation {
    /// Ordinary host memory of this process.
    Host,
    /// Device memory of CUDA device `ordinal`; work on it is ordered on `stream`.
    Device {
        /// CUDA device ordinal.
        ordinal: i32,
        /// Stream the collective is enqueued on.
        stream: RawStream,
    },
}

impl MemoryLocation {
    /// True for [`MemoryLocation::Host`].
    pub fn is_host(&self) -> bool {
        matches!(self, MemoryLocation::Host)
    }
}

/// A read-only view of `len` elements of `dtype`.
#[derive(Debug, Clone, Copy)]
pub struct BufferRef<'a> {
    addr: usize,
    len: usize,
    dtype: DType,
    location: MemoryLocation,
    _borrow: PhantomData<&'a [u8]>,
}

/// A writable view of `len` elements of `dtype`.
#[derive(Debug)]
pub struct BufferMut<'a> {
    addr: usize,
    len: usize,
    dtype: DType,
    location: MemoryLocation,
    _borrow: PhantomData<&'a mut [u8]>,
}

/// The accessors both views share (they differ only in what they let one do with the
/// memory).
macro_rules! view_accessors {
    () => {
        /// Element type.
        pub fn dtype(&self) -> DType {
            self.dtype
        }

        /// Number of elements.
        pub fn len(&self) -> usize {
            self.len
        }

        /// True when the view holds no element.
        pub fn is_empty(&self) -> bool {
            self.len == 0
        }

        /// Size in bytes.
        pub fn bytes(&self) -> usize {
            self.len * self.dtype.size()
        }

        /// Where the memory lives.
        pub fn location(&self) -> MemoryLocation {
            self.location
        }

        /// Address of the first element (host or device address, see [`Self::location`]).
        pub fn addr(&self) -> usize {
            self.addr
        }
    };
}

impl<'a> BufferRef<'a> {
    /// Views a host slice.
    pub fn host<T: Element>(data: &'a [T]) -> Self {
        BufferRef {
            addr: data.as_ptr() as usize,
            len: data.len(),
            dtype: T::DTYPE,
            location: MemoryLocation::Host,
            _borrow: PhantomData,
        }
    }

    /// Views host bytes as elements of `dtype`; the bytes must be aligned for `dtype` and a
    /// whole number of elements.
    pub fn from_host_bytes(bytes: &'a [u8], dtype: DType) -> Result<Self> {
        check_host_bytes(bytes.as_ptr() as usize, bytes.len(), dtype)?;
        Ok(BufferRef {
            addr: bytes.as_ptr() as usize,
            len: bytes.len() / dtype.size(),
            dtype,
            location: MemoryLocation::Host,
            _borrow: PhantomData,
        })
    }

    /// Views `len` elements of `dtype` at device address `ptr`.
    ///
    /// # Safety
    /// `ptr` must point to at least `len * dtype.size()` bytes of device memory that stay
    /// allocated and unwritten by others for `'a` and until the work enqueued on `stream`
    /// by the collective has finished.
    pub unsafe fn from_device_ptr(
        ptr: u64,
        len: usize,
        dtype: DType,
        ordinal: i32,
        stream: RawStream,
    ) -> Self {
        BufferRef {
            addr: ptr as usize,
            len,
            dtype,
            location: MemoryLocation::Device { ordinal, stream },
            _borrow: PhantomData,
        }
    }

    view_accessors!();

    /// The bytes of a host view; `None` for device memory.
    pub fn host_bytes(&self) -> Option<&'a [u8]> {
        match self.location {
            MemoryLocation::Host => {
                // SAFETY: host views are only built from a live `&'a [T]` of `bytes()` bytes.
                let bytes =
                    unsafe { std::slice::from_raw_parts(self.addr as *const u8, self.bytes()) };
                Some(bytes)
            }
            MemoryLocation::Device { .. } => None,
        }
    }

    /// The typed slice of a host view; `None` for device memory or another dtype.
    pub fn host_slice<T: Element>(&self) -> Option<&'a [T]> {
        if T::DTYPE != self.dtype || !self.location.is_host() {
            return None;
        }
        // SAFETY: built from a live `&'a [T]` with this dtype, so aligned and initialised.
        Some(unsafe { std::slice::from_raw_parts(self.addr as *const T, self.len) })
    }

    /// Returns an error unless this is host memory.
    pub fn require_host(&self, backend: &str) -> Result<&'a [u8]> {
        self.host_bytes().ok_or_else(|| {
            Error::Unsupported(format!(
                "{backend} works on host memory only, got {:?}",
                self.location
            ))
        })
    }
}

impl<'a> BufferMut<'a> {
    /// Views a mutable host slice.
    pub fn host<T: Element>(data: &'a mut [T]) -> Self {
        BufferMut {
            addr: data.as_mut_ptr() as usize,
            len: data.len(),
            dtype: T::DTYPE,
            location: MemoryLocation::Host,
            _borrow: PhantomData,
        }
    }

    /// Views mutable host bytes as elements of `dtype`; the bytes must be aligned for
    /// `dtype` and a whole number of elements.
    pub fn from_host_bytes(bytes: &'a mut [u8], dtype: DType) -> Result<Self> {
        check_host_bytes(bytes.as_ptr() as usize, bytes.len(), dtype)?;
        Ok(BufferMut {
            addr: bytes.as_mut_ptr() as usize,
            len: bytes.len() / dtype.size(),
            dtype,
            location: MemoryLocation::Host,
            _borrow: PhantomData,
        })
    }

    /// Views `len` writable elements of `dtype` at device address `ptr`.
    ///
    /// # Safety
    /// As [`BufferRef::from_device_ptr`], and nothing else may read or write the memory
    /// until the enqueued work has finished.
    pub unsafe fn from_device_ptr(
        ptr: u64,
        len: usize,
        dtype: DType,
        ordinal: i32,
        stream: RawStream,
    ) -> Self {
        BufferMut {
            addr: ptr as usize,
            len,
            dtype,
            location: MemoryLocation::Device { ordinal, stream },
            _borrow: PhantomData,
        }
    }

    view_accessors!();

    /// A shorter-lived copy of this view, so that it can be passed on and used again.
    pub fn reborrow(&mut self) -> BufferMut<'_> {
        BufferMut {
            addr: self.addr,
            len: self.len,
            dtype: self.dtype,
            location: self.location,
            _borrow: PhantomData,
        }
    }

    /// A read-only view of the same memory.
    pub fn as_ref(&self) -> BufferRef<'_> {
        BufferRef {
            addr: self.addr,
            len: self.len,
            dtype: self.dtype,
            location: self.location,
            _borrow: PhantomData,
        }
    }

    /// The bytes of a host view; `None` for device memory.
    pub fn host_bytes_mut(&mut self) -> Option<&mut [u8]> {
        match self.location {
            MemoryLocation::Host => {
                // SAFETY: host views are only built from a live `&'a mut [T]` of `bytes()` bytes.
                let bytes =
                    unsafe { std::slice::from_raw_parts_mut(self.addr as *mut u8, self.bytes()) };
                Some(bytes)
            }
            MemoryLocation::Device { .. } => None,
        }
    }

    /// The typed slice of a host view; `None` for device memory or another dtype.
    pub fn host_slice_mut<T: Element>(&mut self) -> Option<&mut [T]> {
        if T::DTYPE != self.dtype || !self.location.is_host() {
            return None;
        }
        // SAFETY: built from a live `&'a mut [T]` with this dtype, so aligned and initialised.
        Some(unsafe { std::slice::from_raw_parts_mut(self.addr as *mut T, self.len) })
    }

    /// Returns an error unless this is host memory.
    pub fn require_host(&mut self, backend: &str) -> Result<&mut [u8]> {
        let location = self.location;
        self.host_bytes_mut().ok_or_else(|| {
            Error::Unsupported(format!(
                "{backend} works on host memory only, got {location:?}"
            ))
        })
    }
}

fn check_host_bytes(addr: usize, len: usize, dtype: DType) -> Result<()> {
    if addr % dtype.size() != 0 || len % dtype.size() != 0 {
        return Err(Error::InvalidArgument(format!(
            "{len} bytes at {addr:#x} are not a whole, aligned number of {dtype} elements"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::bf16;

    #[test]
    fn host_views_report_their_shape() {
        let mut data = vec![bf16::from_f32(1.0); 5];
        let mut view = BufferMut::host(&mut data);
        assert_eq!(view.dtype(), DType::BF16);
        assert_eq!(view.len(), 5);
        assert_eq!(view.bytes(), 10);
        assert!(view.host_slice_mut::<f32>().is_none());
        view.host_slice_mut::<bf16>().unwrap()[4] = bf16::from_f32(2.0);
        let read = view.as_ref();
        assert_eq!(read.host_slice::<bf16>().unwrap()[4].to_f32(), 2.0);
        assert_eq!(data[4].to_f32(), 2.0);
    }

    #[test]
    fn device_views_refuse_host_access() {
        // SAFETY: the view is never dereferenced.
        let view = unsafe { BufferRef::from_device_ptr(0x1000, 4, DType::F32, 0, RawStream(0)) };
        assert!(view.host_bytes().is_none());
        assert!(matches!(
            view.require_host("test"),
            Err(Error::Unsupported(_))
        ));
    }
}
