//! [`DeviceHeap`]: the device symmetric heap of the local ranks.
//!
//! [`DeviceHeap::rendezvous`] is collective: every rank allocates a segment of the same
//! size (header + data, see [`super::layout`]), the ranks agree on the backing (VMM when
//! every rank can, else legacy CUDA IPC), exchange descriptors or handles, and map every
//! peer's segment. Each rank ends with its own segment, every peer's address in this
//! process (host side, and as a device table for kernels) and the signal pads at the same
//! offset everywhere. Every step ends with an exchange of verdicts, so that a rank that
//! fails makes every rank fail instead of leaving them waiting.
//!
//! The primitives ([`DeviceHeap::put_signal`], [`DeviceHeap::wait_signal`],
//! [`DeviceHeap::barrier`]) enqueue one-block kernels on a stream: stores of growing counts
//! (no peer atomics), waits bounded by `%globaltimer`. [`DeviceHeap::synchronize`] waits
//! for a stream, bounded, and reports a kernel's timeout as [`Error::Timeout`]; after one,
//! the heap refuses work.

use std::cell::RefCell;
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::Duration;

use comm_core::cuda::cudarc::driver::{CudaContext, result};
use comm_core::cuda::stream::wait_stream;
use comm_core::cuda::{DeviceBuffer, driver_error, probe};
use comm_core::{Bootstrap, Error, RawStream, Result};

use super::kernels::{Kernels, SymmArgs};
use super::layout::{CHANNELS, HEADER_BYTES, MAX_RANKS};
use super::segment::{Backing, IpcMapping, Own, Peer, VmmMapping, vmm_size, vmm_supported};
use super::status::Status;
use crate::fdpass::exchange_fds;

/// Host waits get this much longer than the kernels' own bound, so that a kernel that
/// gives up is reported as a kernel timeout rather than a host one.
pub(crate) const HOST_MARGIN: Duration = Duration::from_secs(5);

/// One rank's view of the device symmetric heap (see the module docs).
#[derive(Debug)]
pub struct DeviceHeap {
    ctx: Arc<CudaContext>,
    rank: usize,
    world: usize,
    size: usize,
    vmm: bool,
    sharing: usize,
    // Held for their Drop only; peers before own, so mappings go before what they map.
    _peers: Vec<Peer>,
    _own: Own,
    ptrs: Vec<u64>,
    table: DeviceBuffer,
    pub(crate) kernels: Kernels,
    pub(crate) status: Status,
    timeout: Duration,
    dead: RefCell<Option<String>>,
}

/// What one rank sends in the mapping exchange.
const MSG_BYTES: usize = 1 + 4 + 8 + 8 + 64 + 16;

impl DeviceHeap {
    /// Collective over every rank of `bootstrap` (all on this node): allocates a segment of
    /// [`HEADER_BYTES`] + `data_bytes` on `ctx`'s device, fills `sentinel` (a range of
    /// segment offsets) with `0xff` and the header with zeros, and maps every rank's segment.
    pub fn rendezvous(
        bootstrap: &dyn Bootstrap,
        ctx: &Arc<CudaContext>,
        data_bytes: usize,
        backing: Backing,
        sentinel: std::ops::Range<usize>,
    ) -> Result<Self> {
        let world = bootstrap.world_size();
        let me = bootstrap.rank();
        // Step 1: can everyone take part, and can everyone use VMM?
        let ready = Self::ready(bootstrap, ctx, world);
        let msg = match &ready {
            Ok(_) => vec![
                1u8,
                u8::from(backing != Backing::LegacyIpc && vmm_supported(ctx)),
            ],
            Err(e) => [&[0u8][..], e.to_string().as_bytes()].concat(),
        };
        let all = bootstrap.all_gather_bytes(&msg)?;
        let (kernels, status) = ready?;
        if let Some((r, m)) = all.iter().enumerate().find(|(_, m)| m.first() != Some(&1)) {
            return Err(Error::Bootstrap(format!(
                "rank {r} cannot join the symm heap: {}",
                String::from_utf8_lossy(m.get(1..).unwrap_or_default())
            )));
        }
        let vmm = all.iter().all(|m| m.get(1) == Some(&1));
        if backing == Backing::Vmm && !vmm {
            return Err(Error::Unsupported(
                "symm: VMM with descriptor handles is not available on every rank".into(),
            ));
        }
        // Step 2: allocate and initialise this rank's segment.
        let wanted = HEADER_BYTES + data_bytes;
        let local = Self::allocate(ctx, wanted, vmm, &sentinel);
        let msg = match &local {
            Ok((own, size, handle)) => {
                let mut m = Vec::with_capacity(MSG_BYTES);
                m.push(1u8);
                m.extend_from_slice(&std::process::id().to_le_bytes());
                m.extend_from_slice(&own.ptr().to_le_bytes());
                m.extend_from_slice(&(*size as u64).to_le_bytes());
                m.extend_from_slice(handle);
                m.extend_from_slice(
                    &ctx.uuid()
                        .map(|u| u.bytes.map(|b| b as u8))
                        .unwrap_or([0; 16]),
                );
                m
            }
            Err(e) => [&[0u8][..], e.to_string().as_bytes()].concat(),
        };
        let all = bootstrap.all_gather_bytes(&msg)?;
        if let Some((r, m)) = all
            .iter()
            .enumerate()
            .find(|(_, m)| m.first() != Some(&1) || m.len() != MSG_BYTES)
        {
            // Keep the fd exchange in step: a failed rank takes no part in it, so nobody does.
            return Err(Error::Bootstrap(format!(
                "rank {r} could not allocate its symm segment: {}",
                String::from_utf8_lossy(m.get(1..).unwrap_or_default())
            )));
        }
        let (own, size, _) = local?;
        let field = |m: &[u8], at: usize| u64::from_le_bytes(m[at..at + 8].try_into().unwrap());
        if let Some((r, _)) = all
            .iter()
            .enumerate()
            .find(|(_, m)| field(m, 13) as usize != size)
        {
            return Err(Error::Mismatch(format!(
                "symm: rank {r}'s segment size differs from rank {me}'s {size} (same data_bytes everywhere?)"
            )));
        }
        // Step 3: map every peer.
        let mapped = Self::map_peers(bootstrap, ctx, &own, size, vmm, &all);
        let verdict = match &mapped {
            Ok(_) => Vec::new(),
            Err(e) => e.to_string().into_bytes(),
        };
        let verdicts = bootstrap.all_gather_bytes(&verdict)?;
        let peers = mapped?;
        if let Some((r, why)) = verdicts.iter().enumerate().find(|(_, v)| !v.is_empty()) {
            return Err(Error::Bootstrap(format!(
                "rank {r} could not map the symm segments: {}",
                String::from_utf8_lossy(why)
            )));
        }
        let mut ptrs = Vec::with_capacity(world);
        let mut peer_iter = peers.iter();
        for r in 0..world {
            ptrs.push(if r == me {
                own.ptr()
            } else {
                peer_iter.next().map(Peer::ptr).unwrap_or(0)
            });
        }
        let mut table = DeviceBuffer::alloc(ctx, MAX_RANKS * 8)?;
        let mut padded = [0u64; MAX_RANKS];
        padded[..world].copy_from_slice(&ptrs);
        table.upload_bytes(
            &ctx.default_stream(),
            0,
            &padded.map(u64::to_le_bytes).concat(),
        )?;
        let uuids: Vec<&[u8]> = all.iter().map(|m| &m[MSG_BYTES - 16..]).collect();
        let sharing = uuids
            .iter()
            .map(|u| uuids.iter().filter(|v| *v == u).count())
            .max()
            .unwrap_or(1);
        // Nobody touches a peer's segment before every rank has mapped (and initialised) all.
        bootstrap.barrier()?;
        Ok(DeviceHeap {
            ctx: ctx.clone(),
            rank: me,
            world,
            size,
            vmm,
            sharing,
            _peers: peers,
            _own: own,
            ptrs,
            table,
            kernels,
            status,
            timeout: bootstrap.timeout(),
            dead: RefCell::new(None),
        })
    }

    fn ready(
        bootstrap: &dyn Bootstrap,
        ctx: &Arc<CudaContext>,
        world: usize,
    ) -> Result<(Kernels, Status)> {
        if world > MAX_RANKS {
            return Err(Error::Unsupported(format!(
                "symm: at most {MAX_RANKS} ranks, got {world}"
            )));
        }
        if bootstrap.local_world_size() != world {
            return Err(Error::Unsupported(format!(
                "symm: every rank must be on this node ({} of {world} are local)",
                bootstrap.local_world_size()
            )));
        }
        probe::nvrtc()?;
        Ok((Kernels::load(ctx)?, Status::new(ctx)?))
    }

    /// Allocates and initialises the segment; returns it, its size and its IPC handle
    /// (zeros for VMM, whose descriptors travel separately).
    fn allocate(
        ctx: &Arc<CudaContext>,
        wanted: usize,
        vmm: bool,
        sentinel: &std::ops::Range<usize>,
    ) -> Result<(Own, usize, [u8; 64])> {
        let (own, size, handle) = if vmm {
            let size = vmm_size(ctx, wanted)?;
            (Own::Vmm(VmmMapping::create(ctx, size)?), size, [0u8; 64])
        } else {
            let buf = DeviceBuffer::alloc(ctx, wanted)?;
            let handle = buf.ipc_handle()?;
            (Own::Legacy(buf), wanted, handle)
        };
        if sentinel.start > sentinel.end || sentinel.end > size {
            return Err(Error::InvalidArgument(format!(
                "symm: sentinel range {sentinel:?} outside a segment of {size} bytes"
            )));
        }
        let stream = ctx.default_stream();
        let base = own.ptr();
        // SAFETY: both ranges lie inside the segment (checked above; the header is the
        // first HEADER_BYTES of it); the stream is synchronised before returning.
        unsafe {
            result::memset_d8_async(base, 0, HEADER_BYTES, stream.cu_stream())
                .map_err(driver_error)?;
            result::memset_d8_async(
                base + sentinel.start as u64,
                0xff,
                sentinel.len(),
                stream.cu_stream(),
            )
            .map_err(driver_error)?;
        }
        stream.synchronize().map_err(driver_error)?;
        Ok((own, size, handle))
    }

    fn map_peers(
        bootstrap: &dyn Bootstrap,
        ctx: &Arc<CudaContext>,
        own: &Own,
        size: usize,
        vmm: bool,
        all: &[Vec<u8>],
    ) -> Result<Vec<Peer>> {
        let me = bootstrap.rank();
        let mut peers = Vec::with_capacity(all.len().saturating_sub(1));
        if vmm {
            let Own::Vmm(mapping) = own else {
                return Err(Error::Backend {
                    backend: "cuda",
                    source: "symm: VMM agreed but the segment is not VMM".into(),
                });
            };
            let fd = mapping.export()?;
            // Every rank takes part even if a later import fails here (the verdict
            // exchange after this reports it), so the exchange itself never hangs.
            let fds = exchange_fds(bootstrap, fd.as_fd())?;
            drop(fd);
            for (r, peer_fd) in fds.iter().enumerate() {
                if r != me {
                    peers.push(Peer::Vmm(VmmMapping::import(ctx, peer_fd, size)?));
                }
            }
            // `fds` (and our exported descriptor) close here: the mappings hold the memory.
            return Ok(peers);
        }
        let pid = std::process::id();
        for (r, m) in all.iter().enumerate() {
            if r == me {
                continue;
            }
            let peer_pid = u32::from_le_bytes(m[1..5].try_into().unwrap());
            let addr = u64::from_le_bytes(m[5..13].try_into().unwrap());
            peers.push(if peer_pid == pid {
                Peer::Direct(addr)
            } else {
                let handle: [u8; 64] = m[21..85].try_into().unwrap();
                Peer::Ipc(IpcMapping::open(ctx, &handle)?)
            });
        }
        Ok(peers)
    }

    /// The context the heap lives in.
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

    /// Bytes of every rank's segment (header included, rounded up to the granularity).
    pub fn segment_bytes(&self) -> usize {
        self.size
    }

    /// Offset of the data area in every segment.
    pub fn data_offset(&self) -> usize {
        HEADER_BYTES
    }

    /// True for VMM segments, false for legacy CUDA IPC.
    pub fn is_vmm(&self) -> bool {
        self.vmm
    }

    /// Most ranks sharing one device (all of them: the kernels need only `.gpu` scope).
    pub fn sharing(&self) -> usize {
        self.sharing
    }

    /// Every rank's segment as mapped in this process (device addresses), by rank.
    pub fn peer_ptrs(&self) -> &[u64] {
        &self.ptrs
    }

    /// The device array of every rank's segment address (`MAX_RANKS` entries).
    pub fn device_table(&self) -> u64 {
        self.table.device_ptr()
    }

    /// The bound on waits (kernels and host).
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Sets the bound on waits.
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    /// Fails once a wait has timed out (or another fatal error happened).
    pub fn live(&self) -> Result<()> {
        match &*self.dead.borrow() {
            Some(why) => Err(Error::Aborted(format!("symm heap: {why}"))),
            None => Ok(()),
        }
    }

    /// Marks the heap unusable after a fatal error; returns the error.
    pub(crate) fn fail(&self, e: Error) -> Error {
        if e.is_fatal() {
            self.dead.borrow_mut().get_or_insert_with(|| e.to_string());
        }
        e
    }

    /// The kernel arguments every launch shares.
    pub(crate) fn base_args(&self, timeout: Duration) -> SymmArgs {
        SymmArgs {
            peers: self.table.device_ptr(),
            status: self.status.device_ptr(),
            timeout_ns: timeout.as_nanos().min(u128::from(u64::MAX)) as u64,
            rank: self.rank as u32,
            world: self.world as u32,
            gpu_scope: u32::from(self.sharing == self.world),
            ..SymmArgs::default()
        }
    }

    fn primitive(
        &self,
        kernel: &str,
        stream: RawStream,
        peer: usize,
        channel: usize,
        timeout: Duration,
    ) -> Result<()> {
        self.live()?;
        self.status.check(self.timeout).map_err(|e| self.fail(e))?;
        if channel >= CHANNELS {
            return Err(Error::InvalidArgument(format!(
                "symm: channel {channel} of {CHANNELS}"
            )));
        }
        if peer >= self.world || (peer == self.rank && kernel != "symm_barrier_kernel") {
            return Err(Error::InvalidArgument(format!(
                "symm: peer {peer} (rank {} of {})",
                self.rank, self.world
            )));
        }
        let args = SymmArgs {
            peer: peer as u32,
            channel: channel as u32,
            ..self.base_args(timeout)
        };
        self.kernels.launch(kernel, (1, 32), stream, &args)
    }

    /// Enqueues on `stream`: the next signal to `peer` on `channel` (everything this
    /// rank's stream wrote before is visible to `peer` once its matching wait returns).
    pub fn put_signal(&self, stream: RawStream, peer: usize, channel: usize) -> Result<()> {
        self.primitive(
            "symm_put_signal_kernel",
            stream,
            peer,
            channel,
            self.timeout,
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
        self.primitive("symm_wait_signal_kernel", stream, peer, channel, timeout)
    }

    /// Enqueues on `stream`: a signal to every peer on `channel`, then a wait for all.
    pub fn barrier(&self, stream: RawStream, channel: usize) -> Result<()> {
        self.primitive(
            "symm_barrier_kernel",
            stream,
            self.rank,
            channel,
            self.timeout,
        )
    }

    /// Waits for the work enqueued on `stream`, bounded by the timeout (plus a margin);
    /// `Error::Timeout` if a kernel gave up waiting for a peer. Not while capturing.
    pub fn synchronize(&self, stream: RawStream) -> Result<()> {
        self.live()?;
        let (status, timeout) = (&self.status, self.timeout);
        wait_stream(&self.ctx, stream, timeout + HOST_MARGIN, || {
            status.check(timeout)
        })
        .and_then(|()| status.check(timeout))
        .map_err(|e| self.fail(e))
    }

    /// The context's default stream, as the primitives take it.
    pub fn default_stream(&self) -> RawStream {
        comm_core::cuda::raw_stream(&self.ctx.default_stream())
    }
}
