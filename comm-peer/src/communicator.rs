//! [`Communicator`] for [`PeerComm`], and [`forward_communicator!`](crate::forward_communicator)
//! for the backends' own types, so that the trait is implemented in one place.

use comm_core::{BufferMut, BufferRef, Capabilities, Communicator, ReduceOp, Result};

use crate::comm::PeerComm;

impl Communicator for PeerComm {
    fn name(&self) -> &str {
        self.name
    }

    fn rank(&self) -> usize {
        self.group.rank()
    }

    fn world_size(&self) -> usize {
        self.group.world_size()
    }

    fn capabilities(&self) -> &Capabilities {
        &self.capabilities
    }

    fn all_reduce(&self, send: BufferRef<'_>, recv: BufferMut<'_>, op: ReduceOp) -> Result<()> {
        self.reduce(Some(send), recv, op)
    }

    fn all_reduce_in_place(&self, buf: BufferMut<'_>, op: ReduceOp) -> Result<()> {
        self.reduce(None, buf, op)
    }

    fn all_gather(&self, send: BufferRef<'_>, recv: BufferMut<'_>) -> Result<()> {
        self.gather(send, recv)
    }

    fn reduce_scatter(&self, send: BufferRef<'_>, recv: BufferMut<'_>, op: ReduceOp) -> Result<()> {
        self.scatter_reduced(send, recv, op)
    }

    fn broadcast(&self, buf: BufferMut<'_>, root: usize) -> Result<()> {
        self.bcast(buf, root)
    }

    fn barrier(&self) -> Result<()> {
        self.device_barrier()
    }

    fn async_error(&self) -> Result<()> {
        self.group.live()
    }

    fn set_algorithm(&self, algorithm: Option<&str>) -> Result<()> {
        PeerComm::set_algorithm(self, algorithm)
    }
}

/// Implements [`Communicator`] for a backend type that holds a [`PeerComm`] (reached
/// through the expression after the type, on `self`), by delegating every method to it.
#[macro_export]
macro_rules! forward_communicator {
    ($ty:ty, |$s:ident| $inner:expr) => {
        impl $crate::__core::Communicator for $ty {
            fn name(&self) -> &str {
                let $s = self;
                $crate::__core::Communicator::name($inner)
            }

            fn rank(&self) -> usize {
                let $s = self;
                $crate::__core::Communicator::rank($inner)
            }

            fn world_size(&self) -> usize {
                let $s = self;
                $crate::__core::Communicator::world_size($inner)
            }

            fn capabilities(&self) -> &$crate::__core::Capabilities {
                let $s = self;
                $crate::__core::Communicator::capabilities($inner)
            }

            fn all_reduce(
                &self,
                send: $crate::__core::BufferRef<'_>,
                recv: $crate::__core::BufferMut<'_>,
                op: $crate::__core::ReduceOp,
            ) -> $crate::__core::Result<()> {
                let $s = self;
                $crate::__core::Communicator::all_reduce($inner, send, recv, op)
            }

            fn all_reduce_in_place(
                &self,
                buf: $crate::__core::BufferMut<'_>,
                op: $crate::__core::ReduceOp,
            ) -> $crate::__core::Result<()> {
                let $s = self;
                $crate::__core::Communicator::all_reduce_in_place($inner, buf, op)
            }

            fn all_gather(
                &self,
                send: $crate::__core::BufferRef<'_>,
                recv: $crate::__core::BufferMut<'_>,
            ) -> $crate::__core::Result<()> {
                let $s = self;
                $crate::__core::Communicator::all_gather($inner, send, recv)
            }

            fn reduce_scatter(
                &self,
                send: $crate::__core::BufferRef<'_>,
                recv: $crate::__core::BufferMut<'_>,
                op: $crate::__core::ReduceOp,
            ) -> $crate::__core::Result<()> {
                let $s = self;
                $crate::__core::Communicator::reduce_scatter($inner, send, recv, op)
            }

            fn broadcast(
                &self,
                buf: $crate::__core::BufferMut<'_>,
                root: usize,
            ) -> $crate::__core::Result<()> {
                let $s = self;
                $crate::__core::Communicator::broadcast($inner, buf, root)
            }

            fn barrier(&self) -> $crate::__core::Result<()> {
                let $s = self;
                $crate::__core::Communicator::barrier($inner)
            }

            fn async_error(&self) -> $crate::__core::Result<()> {
                let $s = self;
                $crate::__core::Communicator::async_error($inner)
            }

            fn set_algorithm(&self, algorithm: Option<&str>) -> $crate::__core::Result<()> {
                let $s = self;
                $crate::__core::Communicator::set_algorithm($inner, algorithm)
            }
        }
    };
}
