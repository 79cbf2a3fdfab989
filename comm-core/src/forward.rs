//! [`Forward`]: the one way a type hands its [`Communicator`] to another.
//!
//! A handle (`Box`, `Arc`, `&`), an enum over backings or a backend built around a shared
//! core implements [`Forward`] and gets every method of [`Communicator`] from the blanket
//! impl below. A method added to the trait is forwarded here once, for all of them: no
//! wrapper can drop one (an `async_error` left at its default `Ok` hid the inner
//! communicator's asynchronous errors). `conformance::forwarding` checks that an error of
//! the inner communicator reaches the caller of the outer one, method by method.

use std::sync::Arc;

use crate::buffer::{BufferMut, BufferRef};
use crate::communicator::{Capabilities, Communicator};
use crate::dtype::ReduceOp;
use crate::error::Result;
use crate::registered::RegisteredBuffer;

/// A type whose [`Communicator`] is another one's, method for method.
///
/// ```
/// use comm_core::{Communicator, Forward, LocalComm};
///
/// struct Named(LocalComm);
/// impl Forward for Named {
///     type Target = LocalComm;
///     fn target(&self) -> &LocalComm {
///         &self.0
///     }
/// }
/// let comm = Named(LocalComm::create(1).pop().unwrap());
/// assert_eq!(comm.world_size(), 1);
/// ```
pub trait Forward: Send {
    /// The communicator every call goes to.
    type Target: Communicator + ?Sized;

    /// The communicator this one is.
    fn target(&self) -> &Self::Target;
}

impl<C: Communicator + ?Sized> Forward for Box<C> {
    type Target = C;
    fn target(&self) -> &C {
        self
    }
}

impl<C: Communicator + Sync + ?Sized> Forward for Arc<C> {
    type Target = C;
    fn target(&self) -> &C {
        self
    }
}

impl<C: Communicator + Sync + ?Sized> Forward for &C {
    type Target = C;
    fn target(&self) -> &C {
        self
    }
}

impl<F: Forward> Communicator for F {
    fn name(&self) -> &str {
        self.target().name()
    }
    fn rank(&self) -> usize {
        self.target().rank()
    }
    fn world_size(&self) -> usize {
        self.target().world_size()
    }
    fn capabilities(&self) -> &Capabilities {
        self.target().capabilities()
    }
    fn all_reduce(&self, send: BufferRef<'_>, recv: BufferMut<'_>, op: ReduceOp) -> Result<()> {
        self.target().all_reduce(send, recv, op)
    }
    fn all_reduce_in_place(&self, buf: BufferMut<'_>, op: ReduceOp) -> Result<()> {
        self.target().all_reduce_in_place(buf, op)
    }
    fn all_gather(&self, send: BufferRef<'_>, recv: BufferMut<'_>) -> Result<()> {
        self.target().all_gather(send, recv)
    }
    fn reduce_scatter(&self, send: BufferRef<'_>, recv: BufferMut<'_>, op: ReduceOp) -> Result<()> {
        self.target().reduce_scatter(send, recv, op)
    }
    fn broadcast(&self, buf: BufferMut<'_>, root: usize) -> Result<()> {
        self.target().broadcast(buf, root)
    }
    fn barrier(&self) -> Result<()> {
        self.target().barrier()
    }
    fn async_error(&self) -> Result<()> {
        self.target().async_error()
    }
    fn set_algorithm(&self, algorithm: Option<&str>) -> Result<()> {
        self.target().set_algorithm(algorithm)
    }
    fn alloc_registered(&self, bytes: usize) -> Result<Box<dyn RegisteredBuffer>> {
        self.target().alloc_registered(bytes)
    }
}
