//! [`PeerGroup`]: the ranks of one peer-memory source and what runs on it: the kernels,
//! the host-mapped status, the bound on waits, the poisoned flag, bounded host waits, and
//! the signal primitives (`put_signal`, `wait_signal`, `barrier`) as one-block kernels.

use std::cell::{Cell, RefCell};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use comm_core::cuda::cudarc::driver::CudaContext;
use comm_core::cuda::stream::{poll_until, wait_stream};
use comm_core::cuda::{DeviceBuffer, driver_error, probe};
use comm_core::{Error, RawStream, Result};

use crate::kernels::{Kernels, PeerArgs};
use crate::layout::{
    ALL_CHANNELS, BARRIER_CHANNEL, CHANNELS, HEADER_BYTES, MAX_RANKS, STATE_BYTES,
};
use crate::progress;
use crate::residency::Residency;
use crate::source::PeerSource;
use crate::status::Status;
use crate::trace::Trace;

/// Host waits get this much longer than the kernels' own bound, so that a kernel that gives
/// up is reported as a kernel timeout rather than a host one.
pub const HOST_MARGIN: Duration = Duration::from_secs(5);

/// What a rank prepares before any memory is exchanged (kernels compiled and loaded, the
/// status allocated), so that a rank that cannot take part says so before the others
/// allocate.
#[derive(Debug)]
pub struct Ready {
    ctx: Arc<CudaContext>,
    kernels: Kernels,
    status: Status,
    state: DeviceBuffer,
    trace: Option<Trace>,
}

impl Ready {
    /// Checks the world size, NVRTC and the context; compiles and loads the kernels.
    pub fn new(ctx: &Arc<CudaContext>, world: usize) -> Result<Self> {
        if world > MAX_RANKS {
            return Err(Error::Unsupported(format!(
                "peer memory: at most {MAX_RANKS} ranks, got {world}"
            )));
        }
        probe::nvrtc()?;
        Ok(Ready {
            ctx: ctx.clone(),
            kernels: Kernels::load(ctx)?,
            status: Status::new(ctx)?,
            state: zeroed(ctx, STATE_BYTES)?,
            trace: Trace::from_env(ctx)?,
        })
    }

    /// The context it was prepared on.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// How many blocks of the kernels the device holds at once.
    pub(crate) fn residency(&self) -> Residency {
        self.kernels.residency()
    }
}

/// One rank's view of a peer-memory group (see the module docs).
pub struct PeerGroup {
    ctx: Arc<CudaContext>,
    rank: usize,
    world: usize,
    source: Box<dyn PeerSource>,
    kernels: Kernels,
    status: Status,
    state: DeviceBuffer,
    trace: Option<Trace>,
    timeout: Duration,
    dead: RefCell<Option<String>>,
    /// The ticket of the last barrier waited for here ([`Self::barrier_and_wait`]).
    barriers: Cell<u32>,
}

impl fmt::Debug for PeerGroup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PeerGroup")
            .field("rank", &self.rank)
            .field("world", &self.world)
            .field("device", &self.ctx.ordinal())
            .field("source", &self.source)
            .field("timeout", &self.timeout)
            .field("dead", &self.dead)
            .finish_non_exhaustive()
    }
}

impl PeerGroup {
    /// Rank `rank` of `world` over `source`, whose regions every rank has mapped.
    pub fn new(
        ready: Ready,
        rank: usize,
        world: usize,
        source: Box<dyn PeerSource>,
        timeout: Duration,
    ) -> Self {
        let kernels = ready.kernels.shared_by(source.sharing());
        PeerGroup {
            ctx: ready.ctx,
            rank,
            world,
            source,
            kernels,
            status: ready.status,
            state: ready.state,
            trace: ready.trace.map(|t| t.for_rank(rank)),
            timeout,
            dead: RefCell::new(None),
            barriers: Cell::new(0),
        }
    }

    /// The context the regions live in.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks.
    pub fn world_size(&self) -> usize {
        self.world
    }

    /// Most ranks sharing one device (all of them: the kernels need only `.gpu` scope,
    /// unless the regions are host memory).
    pub fn sharing(&self) -> usize {
        self.source.sharing()
    }

    /// True when the regions are host memory mapped into the devices (see
    /// [`PeerSource::host_memory`]).
    pub fn host_memory(&self) -> bool {
        self.source.host_memory()
    }

    /// True when every rank's region is the memory of this one device: the kernels' flags
    /// then need only `.gpu` scope, and a peer's memory is as near as this rank's own.
    pub fn same_device(&self) -> bool {
        gpu_scope(self.source.sharing(), self.world, self.source.host_memory())
    }

    /// Every rank's region as mapped in this process (device addresses), by rank.
    pub fn peer_ptrs(&self) -> &[u64] {
        self.source.ptrs()
    }

    /// The device array of every rank's region address ([`MAX_RANKS`] entries).
    pub fn device_table(&self) -> u64 {
        self.source.table()
    }

    /// The bound on waits (kernels and host).
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Sets the bound on waits.
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    /// `Err(Aborted)` once a kernel has recorded a failure (or another fatal error
    /// happened); the first time, the failure itself: `Err(Timeout)` for a wait that gave
    /// up, `Err(Mismatch)` for ranks that disagree about a call. Either leaves the group
    /// unusable: the kernels stopped halfway, on every rank.
    pub fn live(&self) -> Result<()> {
        if let Some(why) = &*self.dead.borrow() {
            return Err(Error::Aborted(format!("peer memory: {why}")));
        }
        self.recorded()
    }

    /// What a kernel recorded, poisoning the group when it recorded anything.
    fn recorded(&self) -> Result<()> {
        self.status
            .check(self.timeout)
            .map_err(|e| self.with_peer_progress(e))
            .inspect_err(|e| {
                self.dead.borrow_mut().get_or_insert_with(|| e.to_string());
            })
    }

    /// A recorded timeout, the first time it is seen, with where the missing peer is
    /// (`progress`); as it was when that cannot be read.
    fn with_peer_progress(&self, e: Error) -> Error {
        if self.dead.borrow().is_some() {
            return e;
        }
        let (Error::Timeout { what, after }, Some(peer)) = (&e, self.status.waited_for()) else {
            return e;
        };
        let pad = self.source.ptrs()[self.rank];
        match progress::read(&self.ctx, self.state.device_ptr(), pad, peer) {
            Ok((this, announced)) => Error::Timeout {
                what: format!("{what}{}", progress::describe(peer, this, announced)),
                after: *after,
            },
            Err(_) => e,
        }
    }

    /// Marks the group unusable after a fatal error; returns the error.
    pub fn fail(&self, e: Error) -> Error {
        if e.is_fatal() {
            self.dead.borrow_mut().get_or_insert_with(|| e.to_string());
        }
        e
    }

    /// A call every rank agreed on that this rank could not enqueue in full (`e`): its
    /// peers wait for the rest, so the communicator is unusable from here on, and `e` comes
    /// back as the fatal [`Error::Aborted`]. One rank alone loses nothing and keeps `e`.
    pub fn abandon(&self, e: Error) -> Error {
        if self.world == 1 || e.is_fatal() {
            return self.fail(e);
        }
        let why = format!("a call every rank agreed on could not be enqueued here: {e}");
        self.fail(Error::Aborted(why))
    }

    /// Waits for the work enqueued on `stream`, bounded by the timeout (plus a margin);
    /// `Error::Timeout` if a kernel gave up waiting for a peer. Not while `stream` is being
    /// captured. Polls rather than blocks, so that it never sits behind another in-process
    /// rank's spinning kernel.
    pub fn synchronize(&self, stream: RawStream) -> Result<()> {
        if let Some(why) = &*self.dead.borrow() {
            return Err(Error::Aborted(format!("peer memory: {why}")));
        }
        let (status, timeout) = (&self.status, self.timeout);
        let waited = wait_stream(&self.ctx, stream, timeout + HOST_MARGIN, || {
            status.check(timeout)
        });
        // What a kernel recorded explains a failed wait best.
        self.recorded().and(waited.map_err(|e| self.fail(e)))
    }

    /// The kernel arguments every launch shares.
    pub(crate) fn base_args(&self) -> PeerArgs {
        PeerArgs {
            regions: self.source.table(),
            status: self.status.device_ptr(),
            state: self.state.device_ptr(),
            trace: self.trace.as_ref().map_or(0, Trace::device_ptr),
            timeout_ns: self.timeout.as_nanos().min(u128::from(u64::MAX)) as u64,
            rank: self.rank as u32,
            world: self.world as u32,
            gpu_scope: u32::from(self.same_device()),
            host: u32::from(self.host_memory()),
            ..PeerArgs::default()
        }
    }

    /// Enqueues kernel `name` with `(blocks, threads)` on `stream`.
    pub(crate) fn launch(
        &self,
        name: &str,
        grid: (u32, u32),
        stream: RawStream,
        args: &PeerArgs,
    ) -> Result<()> {
        self.kernels.launch(name, grid, stream, args)
    }

    fn primitive(
        &self,
        kernel: &str,
        stream: RawStream,
        peer: usize,
        channel: usize,
        timeout: Duration,
        ticket: u32,
    ) -> Result<()> {
        self.live()?;
        if channel >= ALL_CHANNELS {
            return Err(Error::InvalidArgument(format!(
                "peer memory: channel {channel} of {ALL_CHANNELS}"
            )));
        }
        if peer >= self.world || (peer == self.rank && kernel != "peer_barrier_kernel") {
            return Err(Error::InvalidArgument(format!(
                "peer memory: peer {peer} (rank {} of {})",
                self.rank, self.world
            )));
        }
        let args = PeerArgs {
            peer: peer as u32,
            channel: channel as u32,
            timeout_ns: timeout.as_nanos().min(u128::from(u64::MAX)) as u64,
            count: u64::from(ticket),
            ..self.base_args()
        };
        self.launch(kernel, (1, 32), stream, &args)
    }

    /// Enqueues on `stream`: the next signal to `peer` on `channel` (everything this
    /// rank's stream wrote before is visible to `peer` once its matching wait returns).
    pub fn put_signal(&self, stream: RawStream, peer: usize, channel: usize) -> Result<()> {
        user_channel(channel)?;
        self.primitive(
            "peer_put_signal_kernel",
            stream,
            peer,
            channel,
            self.timeout,
            0,
        )
    }

    /// Enqueues on `stream`: a wait for `peer`'s next signal on `channel`, at most
    /// `timeout`; [`Self::synchronize`] reports a wait that gave up as `Error::Timeout`.
    pub fn wait_signal(
        &self,
        stream: RawStream,
        peer: usize,
        channel: usize,
        timeout: Duration,
    ) -> Result<()> {
        user_channel(channel)?;
        self.primitive("peer_wait_signal_kernel", stream, peer, channel, timeout, 0)
    }

    /// Enqueues on `stream`: a signal to every peer on `channel`, then a wait for all.
    pub fn barrier(&self, stream: RawStream, channel: usize) -> Result<()> {
        user_channel(channel)?;
        self.barrier_with_ticket(stream, channel, 0)
    }

    /// [`Self::barrier`] on one of the communicator's own channels (after the user's).
    pub(crate) fn own_barrier(&self, stream: RawStream, own: usize) -> Result<()> {
        self.barrier_with_ticket(stream, CHANNELS + own, 0)
    }

    /// The barrier kernel; a non-zero `ticket` is handed to the status once every rank
    /// has arrived.
    fn barrier_with_ticket(&self, stream: RawStream, channel: usize, ticket: u32) -> Result<()> {
        self.primitive(
            "peer_barrier_kernel",
            stream,
            self.rank,
            channel,
            self.timeout,
            ticket,
        )
    }

    /// A barrier as [`Self::barrier`] on `stream`, on the communicator's own channel (a
    /// user's signals on theirs are not counted as its own), then a bounded wait here until
    /// its kernel has seen every rank arrive.
    ///
    /// The kernel says so in the host-mapped status; the host does not wait for `stream`.
    /// Where ranks share a device in one process, the first rank's barrier stream was
    /// measured to complete (as the host sees it) only once a peer's next kernel, spinning
    /// until this rank's next call, had given up: as if the two streams shared a hardware
    /// queue. Work enqueued on `stream` after the barrier still follows it.
    pub fn barrier_and_wait(&self, stream: RawStream) -> Result<()> {
        self.live()?;
        let ticket = self.barriers.get().wrapping_add(1).max(1);
        self.barriers.set(ticket);
        self.barrier_with_ticket(stream, CHANNELS + BARRIER_CHANNEL, ticket)?;
        let (status, timeout) = (&self.status, self.timeout);
        let waited = poll_until(timeout + HOST_MARGIN, "a peer-memory barrier", || {
            if status.barrier_passed() == ticket {
                return Ok(true);
            }
            status.check(timeout).map(|()| false)
        });
        self.recorded().and(waited.map_err(|e| self.fail(e)))
    }
}

/// A channel the user may signal on: one of the first [`CHANNELS`].
fn user_channel(channel: usize) -> Result<()> {
    if channel < CHANNELS {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!(
            "peer memory: channel {channel} of {CHANNELS}"
        )))
    }
}

/// `bytes` of zeroed device memory on `ctx` (this rank's `PeerState`, the trace ring):
/// from the stream-ordered pool and zeroed on a stream of its own, so that neither waits
/// behind a kernel spinning on this device (where the regions are host memory too).
pub(crate) fn zeroed(ctx: &Arc<CudaContext>, bytes: usize) -> Result<DeviceBuffer> {
    let stream = ctx.new_stream().map_err(driver_error)?;
    let mut buffer = DeviceBuffer::alloc_on(&stream, bytes)?;
    buffer.fill_bytes(&stream, 0)?;
    stream.synchronize().map_err(driver_error)?;
    Ok(buffer)
}

/// Whether the kernels' flags may use `.gpu` scope: only when every rank drives the same
/// device (`sharing == world`) and the regions are that device's memory. Host memory mapped
/// into the device needs `.sys` scope whoever shares the device.
pub(crate) fn gpu_scope(sharing: usize, world: usize, host_memory: bool) -> bool {
    sharing == world && !host_memory
}

/// Zeroes the header (flags, signal and call slots) of the region at `base` and fills
/// `sentinel` (a range of region offsets) with the Lamport sentinel; returns once done,
/// before any peer can see the region.
pub fn init_region(
    ctx: &Arc<CudaContext>,
    base: u64,
    size: usize,
    sentinel: std::ops::Range<usize>,
) -> Result<()> {
    use comm_core::cuda::cudarc::driver::result;
    if sentinel.start > sentinel.end || sentinel.end > size || size < HEADER_BYTES {
        return Err(Error::InvalidArgument(format!(
            "peer memory: sentinel range {sentinel:?} outside a region of {size} bytes"
        )));
    }
    ctx.bind_to_thread().map_err(driver_error)?;
    let stream = ctx.default_stream();
    // SAFETY: both ranges lie inside the region (checked above; the header is its first
    // HEADER_BYTES); the stream is synchronised before returning.
    unsafe {
        result::memset_d8_async(base, 0, HEADER_BYTES, stream.cu_stream()).map_err(driver_error)?;
        result::memset_d8_async(
            base + sentinel.start as u64,
            0xff,
            sentinel.len(),
            stream.cu_stream(),
        )
        .map_err(driver_error)?;
    }
    stream.synchronize().map_err(driver_error)
}

/// A region's own buffer initialised by [`init_region`] (for [`crate::Registered::new`]).
pub fn init_buffer(buf: &mut DeviceBuffer, sentinel: std::ops::Range<usize>) -> Result<()> {
    let ctx = buf.context().clone();
    init_region(&ctx, buf.device_ptr(), buf.bytes(), sentinel)
}

#[cfg(test)]
mod tests {
    use super::gpu_scope;

    #[test]
    fn gpu_scope_only_for_device_memory_of_one_device() {
        assert!(gpu_scope(2, 2, false));
        assert!(gpu_scope(1, 1, false));
        // Ranks on several devices: system scope.
        assert!(!gpu_scope(1, 2, false));
        assert!(!gpu_scope(2, 4, false));
        // Host memory: system scope even when every rank shares the device.
        assert!(!gpu_scope(2, 2, true));
        assert!(!gpu_scope(1, 2, true));
    }
}
