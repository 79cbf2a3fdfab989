//! Views of `cudarc` device slices for the [`Communicator`](crate::Communicator) trait.
//!
//! A `CudaSlice` knows its stream; the view enqueues the collective on that stream, so it
//! is ordered after every earlier use of the slice there. `cudarc`'s event tracking makes
//! the stream wait for earlier writes from other streams; later users on other streams
//! must order themselves after the collective (record an event on the slice's stream).

use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, DeviceRepr};

use super::stream::raw_stream;
use crate::buffer::{BufferMut, BufferRef};
use crate::dtype::Element;

impl<'a, T: Element + DeviceRepr> From<&'a CudaSlice<T>> for BufferRef<'a> {
    fn from(slice: &'a CudaSlice<T>) -> Self {
        let stream = slice.stream();
        // The guard records a read event when dropped; the collective is enqueued later on
        // the same stream, so stream order covers it.
        let (ptr, _record) = slice.device_ptr(stream);
        // SAFETY: the slice holds `len` elements of `T` and is borrowed for `'a`.
        unsafe {
            BufferRef::from_device_ptr(
                ptr,
                slice.len(),
                T::DTYPE,
                slice.context().ordinal() as i32,
                raw_stream(stream),
            )
        }
    }
}

impl<'a, T: Element + DeviceRepr> From<&'a mut CudaSlice<T>> for BufferMut<'a> {
    fn from(slice: &'a mut CudaSlice<T>) -> Self {
        let stream = slice.stream().clone();
        let ordinal = slice.context().ordinal() as i32;
        let len = slice.len();
        let (ptr, _record) = slice.device_ptr_mut(&stream);
        // SAFETY: the slice holds `len` elements of `T` and is exclusively borrowed for `'a`.
        unsafe { BufferMut::from_device_ptr(ptr, len, T::DTYPE, ordinal, raw_stream(&stream)) }
    }
}
