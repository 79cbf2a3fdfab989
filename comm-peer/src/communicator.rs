//! [`Communicator`] for [`PeerComm`]. The backends' own types built around one implement
//! [`comm_core::Forward`], so that the trait is implemented in one place.

use comm_core::{
    BufferMut, BufferRef, Capabilities, Communicator, ReduceOp, RegisteredBuffer, Result,
};

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

    /// [`PeerComm::alloc`], boxed: a zero-copy buffer.
    fn alloc_registered(&self, bytes: usize) -> Result<Box<dyn RegisteredBuffer>> {
        Ok(Box::new(self.alloc(bytes)?))
    }
}
