//! [`NcclComm`]: the [`Communicator`] over NCCL.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use comm_core::call::settle_through;
use comm_core::cuda::cudarc::driver::{CudaContext, CudaStream};
use comm_core::cuda::stream::wait_stream;
use comm_core::cuda::{DeviceBuffer, driver_error, probe, raw_stream};
use comm_core::env::Env;
use comm_core::{
    Bootstrap, BufferMut, BufferRef, CallDescriptor, Capabilities, Communicator, DType, Error,
    MemoryLocation, RawStream, ReduceOp, Result, TrafficPattern,
};

use crate::probe::require_nccl;
use crate::raw::{Op, RawComm, unique_id};
use crate::types::{nccl_dtype, nccl_op};

/// One rank of an NCCL communicator, bound to one CUDA device.
///
/// Collectives enqueue on the stream of the buffers' views and return at once; they do no
/// host synchronisation, so they can be captured into a CUDA graph. Host-side waits
/// ([`NcclComm::synchronize`], [`Communicator::barrier`]) are bounded: while they wait they
/// poll NCCL's asynchronous error, and on an error or at the timeout they abort the
/// communicator (`ncclCommAbort`) rather than hang; every later call returns
/// [`Error::Aborted`].
///
/// NCCL trusts its callers: ranks that disagree on a call's arguments make its kernels
/// wait for each other forever, or compute garbage. So, with more than one rank, every call
/// first settles the ranks' call descriptors through the bootstrap (one small all-gather on
/// the host): a call that is bad on any rank fails with a clear error on every rank, and
/// nothing is enqueued. [`NcclComm::set_validate`]`(false)` (or `COMM_NCCL_VALIDATE=0`)
/// drops that exchange for NCCL's own behaviour and speed (a bad call then ends in a
/// bounded wait's [`Error::Timeout`]). Inside a CUDA
/// graph the exchange happens once, at capture; replays pay nothing. `Avg` over several
/// ranks is not offered (NCCL's integer mean wraps, see [`ReduceOp`]). NCCL refuses two
/// ranks on one GPU.
pub struct NcclComm {
    raw: RawComm,
    bootstrap: Arc<dyn Bootstrap>,
    validate: bool,
    ctx: Arc<CudaContext>,
    rank: usize,
    world_size: usize,
    timeout: Duration,
    /// Barriers run a one-element all-reduce here, apart from the caller's streams.
    barrier_stream: Arc<CudaStream>,
    barrier_buf: DeviceBuffer,
    /// Computed on first use, then borrowed.
    caps: OnceLock<Capabilities>,
}

impl std::fmt::Debug for NcclComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NcclComm")
            .field("rank", &self.rank)
            .field("world_size", &self.world_size)
            .field("device", &self.ctx.ordinal())
            .field("validate", &self.validate)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl NcclComm {
    /// Joins the communicator of every rank of `bootstrap`, on CUDA device `device`.
    ///
    /// Collective over the bootstrap. Every rank first checks that it can take part (the
    /// CUDA driver, `libnccl`, the device); if any rank cannot, all of them return an
    /// error instead of waiting for it. The unique id travels from rank 0 through the
    /// bootstrap. `ncclCommInitRank` itself then blocks until every rank has joined.
    pub fn new(bootstrap: Arc<dyn Bootstrap>, device: usize) -> Result<Self> {
        let local = Self::prepare(bootstrap.rank(), device);
        let mut mine = Vec::new();
        match &local {
            Ok((_, id)) => {
                mine.push(1u8);
                mine.extend_from_slice(id.as_ref().map_or(&[][..], |id| &id[..]));
            }
            Err(e) => {
                mine.push(0u8);
                mine.extend_from_slice(e.to_string().as_bytes());
            }
        }
        let all = bootstrap.all_gather_bytes(&mine)?;
        let (ctx, _) = local?;
        if let Some((rank, why)) = all.iter().enumerate().find(|(_, m)| m.first() != Some(&1)) {
            return Err(Error::Bootstrap(format!(
                "rank {rank} cannot join the NCCL communicator: {}",
                String::from_utf8_lossy(why.get(1..).unwrap_or_default())
            )));
        }
        let id: [u8; 128] = all[0]
            .get(1..)
            .and_then(|id| id.try_into().ok())
            .ok_or_else(|| Error::Bootstrap("rank 0 sent a malformed NCCL unique id".into()))?;
        ctx.bind_to_thread().map_err(driver_error)?;
        let raw = RawComm::init(bootstrap.world_size(), &id, bootstrap.rank())?;
        let barrier_stream = ctx.new_stream().map_err(driver_error)?;
        let barrier_buf = DeviceBuffer::alloc(&ctx, 4)?;
        Ok(NcclComm {
            raw,
            validate: validate_from_env()?,
            rank: bootstrap.rank(),
            world_size: bootstrap.world_size(),
            timeout: bootstrap.timeout(),
            bootstrap,
            ctx,
            barrier_stream,
            barrier_buf,
            caps: OnceLock::new(),
        })
    }

    /// Joins on device `local_rank % device_count`: one GPU per rank of a node.
    pub fn from_bootstrap(bootstrap: Arc<dyn Bootstrap>) -> Result<Self> {
        // Probe here too, so that a missing driver reaches every rank through `new`.
        let device = probe::device_count()
            .map(|n| bootstrap.local_rank() % n)
            .unwrap_or(0);
        Self::new(bootstrap, device)
    }

    /// What this rank needs before joining: its device's context and, on rank 0, the id.
    fn prepare(rank: usize, device: usize) -> Result<(Arc<CudaContext>, Option<[u8; 128]>)> {
        let ctx = probe::context(device)?;
        require_nccl()?;
        ctx.bind_to_thread().map_err(driver_error)?;
        let id = if rank == 0 { Some(unique_id()?) } else { None };
        Ok((ctx, id))
    }

    /// The CUDA context of this rank's device.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The bound on host-side waits (from the bootstrap).
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// With `false`, calls skip the exchange of call descriptors across ranks (see the type's
    /// docs): NCCL's speed and NCCL's trust in its callers. Every rank must choose alike.
    pub fn set_validate(&mut self, validate: bool) {
        self.validate = validate;
    }

    /// Sets the bound on host-side waits.
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    /// Waits for the work enqueued on `stream`, polling NCCL's asynchronous error. On an
    /// error or at the timeout the communicator is aborted and the error returned.
    pub fn synchronize(&self, stream: RawStream) -> Result<()> {
        self.live()?;
        let raw = &self.raw;
        let waited = wait_stream(&self.ctx, stream, self.timeout, || raw.async_error());
        if let Err(e) = &waited {
            // A driver error says nothing about the communicator; a timeout or an NCCL
            // error means a peer is gone or broken, and NCCL's kernels may spin forever.
            if matches!(
                e,
                Error::Timeout { .. }
                    | Error::Backend {
                        backend: "nccl",
                        ..
                    }
            ) {
                self.raw.abort();
            }
        }
        waited
    }

    fn live(&self) -> Result<()> {
        if self.raw.is_aborted() {
            Err(Error::Aborted(
                "the NCCL communicator was aborted after an earlier failure".into(),
            ))
        } else {
            Ok(())
        }
    }

    /// The stream of a device view of this rank's device.
    fn stream_of(&self, location: MemoryLocation) -> Result<RawStream> {
        match location {
            MemoryLocation::Device { ordinal, stream }
                if ordinal as usize == self.ctx.ordinal() =>
            {
                Ok(stream)
            }
            MemoryLocation::Device { ordinal, .. } => Err(Error::InvalidArgument(format!(
                "nccl: rank {} works on device {}, got a buffer of device {ordinal}",
                self.rank,
                self.ctx.ordinal()
            ))),
            _ => Err(Error::Unsupported(format!(
                "nccl works on device memory only, got {location:?}"
            ))),
        }
    }

    /// Checks a call on this rank, settles it with the other ranks (when validating) and
    /// enqueues it.
    fn run(
        &self,
        call: Result<CallDescriptor>,
        op: Result<Op>,
        send: (u64, MemoryLocation),
        recv: (u64, MemoryLocation),
        count: usize,
    ) -> Result<()> {
        self.live()?;
        let checked = call.and_then(|call| {
            let op = op?;
            self.capabilities().check(
                "nccl",
                call.collective,
                call.dtype,
                call.op,
                call.send_bytes(),
                recv.1,
            )?;
            let stream = self.stream_of(recv.1)?;
            if self.stream_of(send.1)? != stream {
                return Err(Error::InvalidArgument(
                    "nccl: send and recv views are on different streams".into(),
                ));
            }
            Ok((call, op, stream))
        });
        let (call, op, stream) = if self.validate && self.world_size > 1 {
            let verdict = checked
                .as_ref()
                .map(|(call, _, _)| *call)
                .map_err(|e| Error::InvalidArgument(e.to_string()));
            match settle_through(&*self.bootstrap, verdict) {
                Ok(_) => checked?,
                // This rank's own error, as it was.
                Err(_) if checked.is_err() => return checked.map(drop),
                Err(
                    e @ (Error::Mismatch(_) | Error::InvalidArgument(_) | Error::Unsupported(_)),
                ) => {
                    return Err(e);
                }
                // The exchange itself failed: the ranks may no longer agree on what was
                // enqueued, so nothing more may be.
                Err(e) => {
                    self.raw.abort();
                    return Err(e);
                }
            }
        } else {
            checked?
        };
        let dtype = nccl_dtype(call.dtype)?;
        self.ctx.bind_to_thread().map_err(driver_error)?;
        // SAFETY: both views are device memory of this device, sized for the call by the
        // CallDescriptor checks, and borrowed by the caller until the stream's work is
        // done (the views' contract); the stream belongs to this device.
        unsafe { self.raw.enqueue(op, send.0, recv.0, count, dtype, stream.0) }
    }
}

fn place(view_addr: usize, location: MemoryLocation) -> (u64, MemoryLocation) {
    (view_addr as u64, location)
}

impl Communicator for NcclComm {
    fn name(&self) -> &str {
        "nccl"
    }

    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world_size
    }

    fn capabilities(&self) -> &Capabilities {
        self.caps.get_or_init(|| {
            // Every dtype and op, as on the host.
            let mut caps = Capabilities::host_complete().with_pattern(TrafficPattern::Ring);
            if self.world_size > 1 {
                // See `nccl_op`: NCCL's average is not the workspace's across ranks.
                caps.ops.retain(|op| *op != ReduceOp::Avg);
            }
            caps.host_memory = false;
            caps.device_memory = true;
            caps.graph_capture_safe = true;
            caps
        })
    }

    fn all_reduce(&self, send: BufferRef<'_>, recv: BufferMut<'_>, op: ReduceOp) -> Result<()> {
        let call = CallDescriptor::all_reduce(&send, &recv, op);
        let op = nccl_op(op, send.dtype(), self.world_size).map(|op| Op::AllReduce { op });
        self.run(
            call,
            op,
            place(send.addr(), send.location()),
            place(recv.addr(), recv.location()),
            send.len(),
        )
    }

    fn all_reduce_in_place(&self, buf: BufferMut<'_>, op: ReduceOp) -> Result<()> {
        let call = CallDescriptor::all_reduce_in_place(&buf, op);
        let op = nccl_op(op, buf.dtype(), self.world_size).map(|op| Op::AllReduce { op });
        let at = place(buf.addr(), buf.location());
        self.run(call, op, at, at, buf.len())
    }

    fn all_gather(&self, send: BufferRef<'_>, recv: BufferMut<'_>) -> Result<()> {
        let call = CallDescriptor::all_gather(&send, &recv, self.world_size);
        self.run(
            call,
            Ok(Op::AllGather),
            place(send.addr(), send.location()),
            place(recv.addr(), recv.location()),
            send.len(),
        )
    }

    fn reduce_scatter(&self, send: BufferRef<'_>, recv: BufferMut<'_>, op: ReduceOp) -> Result<()> {
        let call = CallDescriptor::reduce_scatter(&send, &recv, op, self.world_size);
        let op = nccl_op(op, send.dtype(), self.world_size).map(|op| Op::ReduceScatter { op });
        self.run(
            call,
            op,
            place(send.addr(), send.location()),
            place(recv.addr(), recv.location()),
            recv.len(),
        )
    }

    fn broadcast(&self, buf: BufferMut<'_>, root: usize) -> Result<()> {
        let call = CallDescriptor::broadcast(&buf, root, self.world_size);
        let at = place(buf.addr(), buf.location());
        self.run(
            call,
            Ok(Op::Broadcast { root: root as i32 }),
            at,
            at,
            buf.len(),
        )
    }

    /// A one-element all-reduce on an internal stream, waited for as
    /// [`NcclComm::synchronize`] waits (bounded, aborting on failure).
    fn barrier(&self) -> Result<()> {
        self.live()?;
        let stream = raw_stream(&self.barrier_stream);
        let ptr = self.barrier_buf.device_ptr();
        self.ctx.bind_to_thread().map_err(driver_error)?;
        let sum = nccl_op(ReduceOp::Sum, DType::F32, self.world_size)?;
        // SAFETY: a 4-byte buffer of this device, owned by self, on our own stream.
        unsafe {
            self.raw.enqueue(
                Op::AllReduce { op: sum },
                ptr,
                ptr,
                1,
                nccl_dtype(DType::F32)?,
                stream.0,
            )?;
        }
        self.synchronize(stream)
    }

    /// NCCL's asynchronous error (`ncclCommGetAsyncError`: a peer failed, a network
    /// error...). An error aborts the communicator, as a failed wait does: NCCL's kernels
    /// may be spinning for a peer that will not come.
    fn async_error(&self) -> Result<()> {
        self.live()?;
        let state = self.raw.async_error();
        if state.is_err() {
            self.raw.abort();
        }
        state
    }
}

/// `COMM_NCCL_VALIDATE` (a switch, see [`Env::switch`]; on when unset).
fn validate_from_env() -> Result<bool> {
    Ok(Env("COMM_NCCL").switch("VALIDATE")?.unwrap_or(true))
}
