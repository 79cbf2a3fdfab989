//! The collectives of [`PeerComm`]: each checks its call, optionally agrees on it with every
//! rank, and enqueues one kernel of `kernels/peer_collectives.cu`.

use comm_core::cuda::cudarc::driver::result;
use comm_core::cuda::stream::cu_stream;
use comm_core::cuda::{driver_error, raw_stream};
use comm_core::{BufferMut, BufferRef, CallDescriptor, RawStream, ReduceOp, Result};

use crate::algorithm::Algorithm;
use crate::comm::PeerComm;
use crate::kernels::{PeerArgs, all_reduce_kernel, all_reduce_work, blocks, reduce_scatter_kernel};

/// How one all-reduce runs, decided by each rank and compared when validating.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Plan {
    algorithm: Algorithm,
    /// Zero-copy: the registered buffer's device table and the input's offset in it.
    zero_copy: Option<(u64, u64)>,
}

impl Plan {
    fn bytes(&self) -> Vec<u8> {
        let (zc, off) = self.zero_copy.map_or((0u8, 0u64), |(_, off)| (1, off));
        [&[self.algorithm as u8, zc][..], &off.to_le_bytes()].concat()
    }
}

impl PeerComm {
    fn grid(&self, work: usize) -> (u32, u32) {
        (
            blocks(work, self.config.threads, self.max_blocks),
            self.config.threads,
        )
    }

    fn plan(&self, bytes: usize, send: u64, in_place: bool) -> Plan {
        let algorithm = self.algorithm_for(bytes);
        let zero_copy = match algorithm {
            // One-shot pull in place would overwrite an input that peers are still reading.
            Algorithm::OneshotPull if in_place => None,
            Algorithm::OneshotPull | Algorithm::TwoshotPull => self.registry.find(send, bytes),
            _ => None,
        };
        Plan {
            algorithm,
            zero_copy,
        }
    }

    /// One all-reduce; `send: None` is in place.
    pub fn reduce(
        &self,
        send: Option<BufferRef<'_>>,
        recv: BufferMut<'_>,
        op: ReduceOp,
    ) -> Result<()> {
        self.group.live()?;
        let (described, send_addr, locations) = match &send {
            Some(s) => (
                CallDescriptor::all_reduce(s, &recv, op),
                s.addr() as u64,
                [s.location(), recv.location()],
            ),
            None => (
                CallDescriptor::all_reduce_in_place(&recv, op),
                recv.addr() as u64,
                [recv.location(), recv.location()],
            ),
        };
        let plan = self.plan(recv.bytes(), send_addr, send.is_none());
        let mine = self.checked(described, &locations);
        let (call, stream) = self.agree(mine, &plan.bytes())?;
        let count = call.count as usize;
        if count == 0 {
            return Ok(());
        }
        let recv_addr = recv.addr() as u64;
        let world = self.group.world_size();
        if world == 1 {
            if send_addr != recv_addr {
                self.context().bind_to_thread().map_err(driver_error)?;
                // SAFETY: both views hold `send_bytes` bytes of this device (the view
                // constructors' contracts); the copy is ordered on their stream.
                unsafe {
                    result::memcpy_dtod_async(
                        recv_addr,
                        send_addr,
                        call.send_bytes(),
                        cu_stream(stream),
                    )
                }
                .map_err(driver_error)?;
            }
            return Ok(());
        }
        let (inputs, in_off) = plan.zero_copy.unwrap_or((0, 0));
        let args = PeerArgs {
            inputs,
            in_off,
            ..self.io_args(send_addr, recv_addr, count as u64)
        };
        let op = call.op.unwrap_or(ReduceOp::Sum);
        self.group.launch(
            &all_reduce_kernel(plan.algorithm, call.dtype, op),
            self.grid(all_reduce_work(plan.algorithm, call.dtype, count, world)),
            stream,
            &args,
        )
    }

    /// Every rank's `send` (bytes) into its place in `recv`.
    pub fn gather(&self, send: BufferRef<'_>, recv: BufferMut<'_>) -> Result<()> {
        self.group.live()?;
        let world = self.group.world_size();
        let mine = self.checked(
            CallDescriptor::all_gather(&send, &recv, world),
            &[send.location(), recv.location()],
        );
        let (call, stream) = self.agree(mine, &[])?;
        let bytes = call.send_bytes();
        if bytes == 0 {
            return Ok(());
        }
        let args = self.io_args(send.addr() as u64, recv.addr() as u64, bytes as u64);
        self.group.launch(
            "peer_all_gather",
            self.grid(bytes.div_ceil(16)),
            stream,
            &args,
        )
    }

    /// Slice `rank` of the reduction of every rank's `send` into `recv`.
    pub fn scatter_reduced(
        &self,
        send: BufferRef<'_>,
        recv: BufferMut<'_>,
        op: ReduceOp,
    ) -> Result<()> {
        self.group.live()?;
        let world = self.group.world_size();
        let mine = self.checked(
            CallDescriptor::reduce_scatter(&send, &recv, op, world),
            &[send.location(), recv.location()],
        );
        let (call, stream) = self.agree(mine, &[])?;
        let count = call.count as usize / world;
        if count == 0 {
            return Ok(());
        }
        let args = self.io_args(send.addr() as u64, recv.addr() as u64, count as u64);
        let work = count.div_ceil(16 / call.dtype.size());
        self.group.launch(
            &reduce_scatter_kernel(call.dtype, op),
            self.grid(work),
            stream,
            &args,
        )
    }

    /// Rank `root`'s `buf` into every rank's `buf`.
    pub fn bcast(&self, buf: BufferMut<'_>, root: usize) -> Result<()> {
        self.group.live()?;
        let world = self.group.world_size();
        let mine = self.checked(
            CallDescriptor::broadcast(&buf, root, world),
            &[buf.location()],
        );
        let (call, stream) = self.agree(mine, &[])?;
        let bytes = call.send_bytes();
        if bytes == 0 || world == 1 {
            return Ok(());
        }
        let addr = buf.addr() as u64;
        let args = PeerArgs {
            root: root as u32,
            ..self.io_args(addr, addr, bytes as u64)
        };
        self.group.launch(
            "peer_broadcast",
            self.grid(bytes.div_ceil(16)),
            stream,
            &args,
        )
    }

    /// A device barrier of every rank (signals on channel 0), waited for here.
    pub fn device_barrier(&self) -> Result<()> {
        self.group.live()?;
        let stream: RawStream = raw_stream(&self.barrier_stream);
        self.group.barrier(stream, 0)?;
        self.group.synchronize(stream)
    }
}
