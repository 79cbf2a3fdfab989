//! Views of `cudarc` device memory for the [`Communicator`](crate::Communicator) trait:
//! whole slices (`&CudaSlice`, `&mut CudaSlice`) and parts of them (`CudaView`,
//! `CudaViewMut`, from `slice(..)` / `slice_mut(..)`), so that reducing part of a buffer
//! needs no `unsafe`.
//!
//! cudarc memory knows its stream; the view enqueues the collective on that stream, so it
//! is ordered after every earlier use of the memory there. `cudarc`'s event tracking makes
//! the stream wait for earlier writes from other streams; later users on other streams
//! must order themselves after the collective (record an event on the memory's stream).

use cudarc::driver::{
    CudaSlice, CudaView, CudaViewMut, DevicePtr, DevicePtrMut, DeviceRepr, DeviceSlice,
};

use super::stream::raw_stream;
use crate::buffer::{BufferMut, BufferRef};
use crate::dtype::Element;

/// A read view of `memory`, borrowed for `'a` by the caller.
fn read_view<'a, T, M>(memory: &M) -> BufferRef<'a>
where
    T: Element + DeviceRepr,
    M: DeviceSlice<T> + DevicePtr<T>,
{
    let stream = memory.stream();
    // The guard records a read event when dropped; the collective is enqueued later on
    // the same stream, so stream order covers it.
    let (ptr, _record) = memory.device_ptr(stream);
    // SAFETY: `memory` holds `len` elements of `T`, and every caller ties `'a` to a borrow
    // of the memory (a shared borrow of a slice, or a view that is one).
    unsafe {
        BufferRef::from_device_ptr(
            ptr,
            memory.len(),
            T::DTYPE,
            stream.context().ordinal() as i32,
            raw_stream(stream),
        )
    }
}

/// A write view of `memory`, exclusively borrowed for `'a` by the caller.
fn write_view<'a, T, M>(memory: &mut M) -> BufferMut<'a>
where
    T: Element + DeviceRepr,
    M: DeviceSlice<T> + DevicePtrMut<T>,
{
    let stream = memory.stream().clone();
    let len = memory.len();
    let (ptr, _record) = memory.device_ptr_mut(&stream);
    let ordinal = stream.context().ordinal() as i32;
    // SAFETY: `memory` holds `len` elements of `T`, and every caller ties `'a` to an
    // exclusive borrow of the memory (of a slice, or a mutable view that is one).
    unsafe { BufferMut::from_device_ptr(ptr, len, T::DTYPE, ordinal, raw_stream(&stream)) }
}

impl<'a, T: Element + DeviceRepr> From<&'a CudaSlice<T>> for BufferRef<'a> {
    fn from(slice: &'a CudaSlice<T>) -> Self {
        read_view(slice)
    }
}

impl<'a, T: Element + DeviceRepr> From<&'a mut CudaSlice<T>> for BufferMut<'a> {
    fn from(slice: &'a mut CudaSlice<T>) -> Self {
        write_view(slice)
    }
}

/// A part of a slice: `(&x).slice(a..b).into()`. The view borrows the slice for `'a`.
impl<'a, T: Element + DeviceRepr> From<CudaView<'a, T>> for BufferRef<'a> {
    fn from(view: CudaView<'a, T>) -> Self {
        read_view(&view)
    }
}

/// A part of a slice: `x.slice_mut(a..b).into()`. The view borrows the slice exclusively
/// for `'a`.
impl<'a, T: Element + DeviceRepr> From<CudaViewMut<'a, T>> for BufferMut<'a> {
    fn from(mut view: CudaViewMut<'a, T>) -> Self {
        write_view(&mut view)
    }
}

/// A mutable part of a slice, read: `(&view).into()` keeps the view for later.
impl<'a, 'b: 'a, T: Element + DeviceRepr> From<&'a CudaViewMut<'b, T>> for BufferRef<'a> {
    fn from(view: &'a CudaViewMut<'b, T>) -> Self {
        read_view(view)
    }
}

/// A mutable part of a slice, written: `(&mut view).into()` keeps the view for later.
impl<'a, 'b: 'a, T: Element + DeviceRepr> From<&'a mut CudaViewMut<'b, T>> for BufferMut<'a> {
    fn from(view: &'a mut CudaViewMut<'b, T>) -> Self {
        write_view(view)
    }
}
