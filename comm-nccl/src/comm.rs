//! [`NcclComm`]: the [`Communicator`] over NCCL.

use std::cell::Cell;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use comm_core::call::{DESCRIPTOR_BYTES, decode_verdict, encode_verdict, settle};
use comm_core::cuda::cudarc::driver::{CudaContext, CudaStream};
use comm_core::cuda::stream::wait_stream;
use comm_core::cuda::{DeviceBuffer, driver_error, probe, raw_stream};
use comm_core::env::Env;
use comm_core::{
    Bootstrap, BufferMut, BufferRef, CallDescriptor, Capabilities, Collective, Communicator, DType,
    Error, MemoryLocation, RawStream, ReduceOp, RegisteredBuffer, Result, TrafficPattern,
};

use crate::buffer::NcclBuffer;
use crate::probe::require_nccl;
use crate::raw::{Op, RawComm, unique_id};
use crate::staging::Staging;
use crate::symmetric::{PLAIN, SYMMETRIC, SymmetricSettings, support};
use crate::types::{nccl_dtype, nccl_op};
use crate::window::{Place, Registry, Window};

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
///
/// **Symmetric windows** (NCCL 2.27 or newer): [`NcclComm::alloc`] hands out memory that
/// every rank registered as a symmetric window ([`NcclBuffer`]); NCCL runs its
/// low-latency symmetric kernels on calls whose buffers all lie in windows. The
/// communicator also registers a staging window of its own at join
/// (`COMM_NCCL_SYMMETRIC_BYTES`, 4 MiB by default): with the algorithm `symmetric`,
/// all-reduces of unregistered buffers up to that size are copied into it, reduced there
/// and copied out (see `staging`). The algorithm `plain` (the default) runs NCCL on the
/// buffers as given. Where NCCL is older, or registration fails on any rank, or
/// `COMM_NCCL_SYMMETRIC=0`, every rank keeps the plain path and
/// [`Capabilities::unavailable`] says why. When calls are validated, the ranks also
/// compare where their buffers lie (which window, at which offset): a buffer registered on
/// some ranks only, or at other offsets, fails with [`Error::Mismatch`] on every rank.
pub struct NcclComm {
    // Dropped first: windows deregister while the communicator is alive (they also keep it).
    staging: Option<Staging>,
    raw: Arc<RawComm>,
    registry: Arc<Registry>,
    /// Why symmetric windows cannot be had here (alike on every rank), if they cannot.
    symmetric_unavailable: Option<String>,
    /// Whether all-reduces of unregistered buffers go through the staging window.
    staged: Cell<bool>,
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
            .field("symmetric_unavailable", &self.symmetric_unavailable)
            .field("staged", &self.staged.get())
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
        let raw = Arc::new(RawComm::init(
            bootstrap.world_size(),
            &id,
            bootstrap.rank(),
        )?);
        let barrier_stream = ctx.new_stream().map_err(driver_error)?;
        let barrier_buf = DeviceBuffer::alloc(&ctx, 4)?;
        let registry = Arc::new(Registry::default());
        let (staging, symmetric_unavailable) =
            Self::join_windows(&raw, &ctx, &bootstrap, &registry)?;
        Ok(NcclComm {
            staging,
            raw,
            registry,
            symmetric_unavailable,
            staged: Cell::new(false),
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

    /// Collective, at join: the staging window, or why symmetric windows cannot be had.
    /// Every rank ends with the same answer (the registration agrees through the bootstrap).
    fn join_windows(
        raw: &Arc<RawComm>,
        ctx: &Arc<CudaContext>,
        bootstrap: &Arc<dyn Bootstrap>,
        registry: &Arc<Registry>,
    ) -> Result<(Option<Staging>, Option<String>)> {
        let settings = SymmetricSettings::from_env();
        let mine = match &settings {
            Ok(settings) => support(*settings).err(),
            Err(e) => Some(e.to_string()),
        };
        let bytes = settings.as_ref().map_or(1, |s| s.staging_bytes);
        if bytes == 0 {
            // No staging window: agree on the rest alone, with the size every rank asked.
            let all = bootstrap.all_gather_bytes(mine.as_deref().unwrap_or("").as_bytes())?;
            let why = all
                .iter()
                .enumerate()
                .find(|(_, m)| !m.is_empty())
                .map(|(r, m)| {
                    format!(
                        "rank {r} cannot register symmetric windows: {}",
                        String::from_utf8_lossy(m)
                    )
                });
            return Ok((None, why));
        }
        match Window::register(raw, ctx, bootstrap, registry, bytes, mine.as_deref()) {
            Ok(window) => Ok((Some(Staging::new(window)), None)),
            Err(e @ Error::Bootstrap(_)) => Err(e),
            Err(e) => Ok((None, Some(e.to_string()))),
        }
    }

    /// Collective: `bytes` of device memory registered with every rank as a symmetric
    /// window (`ncclMemAlloc` + `ncclCommWindowRegister`), for calls whose buffers lie in
    /// it (see [`NcclBuffer`]). Every rank asks for the same size, in the same order; where
    /// windows cannot be had (NCCL older than 2.27, a registration that failed), every
    /// rank gets [`Error::Unsupported`] with the reason.
    pub fn alloc(&self, bytes: usize) -> Result<NcclBuffer> {
        self.live()?;
        let window = Window::register(
            &self.raw,
            &self.ctx,
            &self.bootstrap,
            &self.registry,
            bytes,
            self.symmetric_unavailable.as_deref(),
        )?;
        Ok(NcclBuffer::new(window))
    }

    /// Why NCCL's symmetric windows cannot be used here (`None`: they can).
    pub fn symmetric_unavailable(&self) -> Option<&str> {
        self.symmetric_unavailable.as_deref()
    }

    /// Symmetric windows registered now: the staging window and every live [`NcclBuffer`].
    pub fn windows(&self) -> usize {
        self.registry.len()
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
    /// enqueues it: through the staging window where asked for and possible, else on the
    /// buffers as given.
    fn run(
        &self,
        call: Result<CallDescriptor>,
        op: Result<Op>,
        send: Span,
        recv: Span,
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
                recv.location,
            )?;
            let stream = self.stream_of(recv.location)?;
            if self.stream_of(send.location)? != stream {
                return Err(Error::InvalidArgument(
                    "nccl: send and recv views are on different streams".into(),
                ));
            }
            let mut places = [
                self.registry.place(send.addr, send.bytes)?,
                self.registry.place(recv.addr, recv.bytes)?,
            ];
            let staged = match &self.staging {
                Some(staging)
                    if self.staged.get()
                        && call.collective == Collective::AllReduce
                        && !places.iter().all(|p| p.is_window()) =>
                {
                    self.ctx.bind_to_thread().map_err(driver_error)?;
                    staging.prepare(call.send_bytes(), stream)?
                }
                _ => false,
            };
            if let (true, Some(staging)) = (staged, &self.staging) {
                // What NCCL is called on, for the ranks to compare.
                places = [staging.place(); 2];
            }
            Ok((call, op, stream, places, staged))
        });
        let (call, op, stream, _, staged) = if self.validate && self.world_size > 1 {
            let verdict = checked
                .as_ref()
                .map(|(call, ..)| *call)
                .map_err(|e| Error::InvalidArgument(e.to_string()));
            let places = checked
                .as_ref()
                .map_or([Place::Plain; 2], |(_, _, _, places, _)| *places);
            match self.settle_with_places(verdict, places) {
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
        if let (true, Some(staging)) = (staged, &self.staging) {
            // SAFETY: as below; the context is current; `prepare` accepted the call.
            return unsafe {
                staging.all_reduce(
                    &self.raw,
                    op,
                    (send.addr, recv.addr),
                    count,
                    call.send_bytes(),
                    dtype,
                    stream,
                )
            };
        }
        // SAFETY: both views are device memory of this device, sized for the call by the
        // CallDescriptor checks, and borrowed by the caller until the stream's work is
        // done (the views' contract); the stream belongs to this device.
        unsafe {
            self.raw
                .enqueue(op, send.addr, recv.addr, count, dtype, stream.0)
        }
    }

    /// Settles this rank's verdict with every rank's, and then where their buffers lie:
    /// NCCL picks its kernels from that, and ranks that picked different ones would wait
    /// for each other forever. Every rank gets the same outcome.
    fn settle_with_places(
        &self,
        verdict: Result<CallDescriptor>,
        places: [Place; 2],
    ) -> Result<CallDescriptor> {
        let mut mine = encode_verdict(&verdict).to_vec();
        for p in places {
            mine.extend_from_slice(&p.to_bytes());
        }
        let all = self.bootstrap.all_gather_bytes(&mine)?;
        let verdicts = all
            .iter()
            .map(|m| decode_verdict(m.get(..DESCRIPTOR_BYTES).unwrap_or_default()))
            .collect::<Result<Vec<_>>>()?;
        let call = settle(verdict, &verdicts)?;
        let place_of = |m: &[u8], i: usize| {
            let at = DESCRIPTOR_BYTES + i * Place::BYTES;
            m.get(at..at + Place::BYTES).and_then(Place::from_bytes)
        };
        for (rank, m) in all.iter().enumerate() {
            for (i, what) in ["send", "recv"].into_iter().enumerate() {
                match place_of(m, i) {
                    Some(theirs) if theirs == places[i] => {}
                    theirs => {
                        return Err(Error::Mismatch(format!(
                            "nccl: {call}: the {what} buffer of rank {rank} is in {}, of rank {} in {} \
                             (a buffer used for collectives must be registered on every rank, \
                             used at the same offsets)",
                            theirs.map_or("?".into(), |p| p.to_string()),
                            self.rank,
                            places[i]
                        )));
                    }
                }
            }
        }
        Ok(call)
    }
}

/// A view's address, location and size in bytes.
#[derive(Debug, Clone, Copy)]
struct Span {
    addr: u64,
    location: MemoryLocation,
    bytes: usize,
}

fn span_of(addr: usize, location: MemoryLocation, len: usize, dtype: DType) -> Span {
    Span {
        addr: addr as u64,
        location,
        bytes: len.saturating_mul(dtype.size()),
    }
}

macro_rules! span {
    ($view:expr) => {
        span_of($view.addr(), $view.location(), $view.len(), $view.dtype())
    };
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
            let mut algorithms = vec![PLAIN];
            match &self.symmetric_unavailable {
                None if self.staging.is_some() => algorithms.push(SYMMETRIC),
                None => caps.unavailable.push((
                    SYMMETRIC.into(),
                    "no staging window (COMM_NCCL_SYMMETRIC_BYTES=0)".into(),
                )),
                Some(why) => caps.unavailable.push((SYMMETRIC.into(), why.clone())),
            }
            caps.with_algorithms(&algorithms).with_algorithm_patterns(&[
                (PLAIN, TrafficPattern::Ring),
                (SYMMETRIC, TrafficPattern::SymmetricWindow),
            ])
        })
    }

    /// `plain` (or `None`): NCCL on the buffers as given; `symmetric`: all-reduces of
    /// unregistered buffers up to the staging window's size go through it. Buffers in
    /// windows ([`NcclComm::alloc`]) reach the symmetric kernels either way.
    fn set_algorithm(&self, algorithm: Option<&str>) -> Result<()> {
        match algorithm {
            None | Some(PLAIN) => self.staged.set(false),
            Some(SYMMETRIC)
                if self
                    .capabilities()
                    .algorithms
                    .iter()
                    .any(|a| a == SYMMETRIC) =>
            {
                self.staged.set(true)
            }
            Some(name) => {
                let why = self
                    .capabilities()
                    .unavailable
                    .iter()
                    .find(|(a, _)| a == name)
                    .map_or("it has plain and symmetric".to_string(), |(_, why)| {
                        why.clone()
                    });
                return Err(Error::Unsupported(format!(
                    "nccl: no algorithm `{name}` here: {why}"
                )));
            }
        }
        Ok(())
    }

    /// [`NcclComm::alloc`], boxed.
    fn alloc_registered(&self, bytes: usize) -> Result<Box<dyn RegisteredBuffer>> {
        Ok(Box::new(self.alloc(bytes)?))
    }

    fn all_reduce(&self, send: BufferRef<'_>, recv: BufferMut<'_>, op: ReduceOp) -> Result<()> {
        let call = CallDescriptor::all_reduce(&send, &recv, op);
        let op = nccl_op(op, send.dtype(), self.world_size).map(|op| Op::AllReduce { op });
        self.run(call, op, span!(send), span!(recv), send.len())
    }

    fn all_reduce_in_place(&self, buf: BufferMut<'_>, op: ReduceOp) -> Result<()> {
        let call = CallDescriptor::all_reduce_in_place(&buf, op);
        let op = nccl_op(op, buf.dtype(), self.world_size).map(|op| Op::AllReduce { op });
        let at = span!(buf);
        self.run(call, op, at, at, buf.len())
    }

    fn all_gather(&self, send: BufferRef<'_>, recv: BufferMut<'_>) -> Result<()> {
        let call = CallDescriptor::all_gather(&send, &recv, self.world_size);
        self.run(
            call,
            Ok(Op::AllGather),
            span!(send),
            span!(recv),
            send.len(),
        )
    }

    fn reduce_scatter(&self, send: BufferRef<'_>, recv: BufferMut<'_>, op: ReduceOp) -> Result<()> {
        let call = CallDescriptor::reduce_scatter(&send, &recv, op, self.world_size);
        let op = nccl_op(op, send.dtype(), self.world_size).map(|op| Op::ReduceScatter { op });
        self.run(call, op, span!(send), span!(recv), recv.len())
    }

    fn broadcast(&self, buf: BufferMut<'_>, root: usize) -> Result<()> {
        let call = CallDescriptor::broadcast(&buf, root, self.world_size);
        let at = span!(buf);
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
