//! [`IpcComm`]: the [`Communicator`] over CUDA IPC.

use std::cell::{Cell, RefCell};
use std::fmt;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use comm_core::call::{DESCRIPTOR_BYTES, decode_verdict, encode_verdict, settle};
use comm_core::cuda::cudarc::driver::{CudaContext, result, sys};
use comm_core::cuda::stream::{cu_stream, wait_stream};
use comm_core::cuda::{DeviceBuffer, driver_error, probe};
use comm_core::{
    Bootstrap, BufferMut, BufferRef, CallDescriptor, Capabilities, Collective, Communicator, Error,
    MemoryLocation, RawStream, ReduceOp, Result, TrafficPattern,
};

use crate::algo::Algorithm;
use crate::config::IpcConfig;
use crate::launch::{DTYPES, KernelArgs, Kernels, OPS, grid};
use crate::layout::{HEADER_BYTES, Layout, MAX_RANKS, MAX_THREADS};
use crate::registered::Registered;
use crate::status::Status;
use crate::zero_copy::{IpcBuffer, Registry};

/// Host waits get this much longer than the kernels' own bound, so that a kernel that gives
/// up is seen as a kernel timeout rather than a host one.
const HOST_MARGIN: Duration = Duration::from_secs(5);

/// One rank of a CUDA-IPC all-reduce communicator (see the crate docs).
///
/// Calls enqueue one kernel on the buffers' stream and return; nothing synchronises, so
/// calls can be captured into CUDA graphs. [`IpcComm::synchronize`] waits, bounded.
pub struct IpcComm {
    ctx: Arc<CudaContext>,
    bootstrap: Arc<dyn Bootstrap>,
    rank: usize,
    world: usize,
    config: IpcConfig,
    layout: Layout,
    region: Registered,
    kernels: Kernels,
    status: Status,
    max_blocks: u32,
    timeout: Duration,
    algorithm: Cell<Option<Algorithm>>,
    dead: RefCell<Option<String>>,
    registry: Arc<Registry>,
    /// Computed on first use, then borrowed.
    caps: OnceLock<Capabilities>,
}

impl fmt::Debug for IpcComm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IpcComm")
            .field("rank", &self.rank)
            .field("world", &self.world)
            .field("device", &self.ctx.ordinal())
            .field("config", &self.config)
            .field("max_blocks", &self.max_blocks)
            .field("dead", &self.dead)
            .finish_non_exhaustive()
    }
}

/// How one call runs, decided by each rank and compared when validating.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Plan {
    algorithm: Algorithm,
    /// Zero-copy: the registered buffer's device table and the input's offset in it.
    zero_copy: Option<(u64, u64)>,
}

impl IpcComm {
    /// Joins the communicator of every rank of `bootstrap`, on CUDA device `device`.
    ///
    /// Collective. Every rank checks that it can take part (driver, NVRTC, device, kernels)
    /// and that all ranks use the same [`IpcConfig`]; then every rank allocates its region,
    /// and the regions are exchanged and mapped. If any rank fails, all return an error.
    pub fn new(bootstrap: Arc<dyn Bootstrap>, device: usize, config: IpcConfig) -> Result<Self> {
        let world = bootstrap.world_size();
        let local = Self::prepare(device, world, &config);
        let mut msg = match &local {
            Ok((_, _, _, sms)) => [&[1u8][..], &sms.to_le_bytes()].concat(),
            Err(e) => [&[0u8][..], e.to_string().as_bytes()].concat(),
        };
        msg.extend_from_slice(format!("{config:?}").as_bytes());
        let all = bootstrap.all_gather_bytes(&msg)?;
        let (ctx, kernels, status, _) = local?;
        let mut sms = u32::MAX;
        for (rank, m) in all.iter().enumerate() {
            if m.first() != Some(&1) || m.len() < 5 {
                return Err(Error::Bootstrap(format!(
                    "rank {rank} cannot join the ipc communicator: {}",
                    String::from_utf8_lossy(m.get(1..).unwrap_or_default())
                )));
            }
            if m[5..] != msg[5..] {
                return Err(Error::Mismatch(format!(
                    "ipc: rank {rank} has another configuration: {} (rank {}: {config:?})",
                    String::from_utf8_lossy(&m[5..]),
                    bootstrap.rank()
                )));
            }
            sms = sms.min(u32::from_le_bytes(m[1..5].try_into().unwrap()));
        }
        let layout = Layout::new(world, config.max_bytes);
        let region = Registered::new(&ctx, &*bootstrap, layout.total, |buf| {
            init_region(buf, &layout)
        })?;
        let max_blocks = config
            .max_blocks
            .unwrap_or_else(|| (sms / region.sharing().max(1) as u32).clamp(1, 36));
        let timeout = config.timeout.unwrap_or_else(|| bootstrap.timeout());
        Ok(IpcComm {
            rank: bootstrap.rank(),
            world,
            algorithm: Cell::new(config.algorithm),
            config,
            layout,
            region,
            kernels,
            status,
            max_blocks,
            timeout,
            dead: RefCell::new(None),
            registry: Arc::new(Registry::default()),
            caps: OnceLock::new(),
            ctx,
            bootstrap,
        })
    }

    /// Joins on device `local_rank % device_count` (one GPU per rank of a node; several
    /// ranks per GPU when there are more ranks than GPUs), with [`IpcConfig::from_env`].
    pub fn from_bootstrap(bootstrap: Arc<dyn Bootstrap>) -> Result<Self> {
        let device = probe::device_count()
            .map(|n| bootstrap.local_rank() % n)
            .unwrap_or(0);
        let config = IpcConfig::from_env();
        match config {
            Ok(config) => Self::new(bootstrap, device, config),
            // Still join the exchange, so that the other ranks fail rather than wait.
            Err(e) => {
                let _ = bootstrap.all_gather_bytes(&[0u8]);
                Err(e)
            }
        }
    }

    fn prepare(
        device: usize,
        world: usize,
        config: &IpcConfig,
    ) -> Result<(Arc<CudaContext>, Kernels, Status, u32)> {
        if world > MAX_RANKS {
            return Err(Error::Unsupported(format!(
                "ipc: at most {MAX_RANKS} ranks, got {world}"
            )));
        }
        if config.threads == 0 || config.threads > MAX_THREADS || config.threads % 32 != 0 {
            return Err(Error::InvalidArgument(format!(
                "ipc: threads must be a multiple of 32 in 32..={MAX_THREADS}, got {}",
                config.threads
            )));
        }
        let ctx = probe::context(device)?;
        probe::nvrtc()?;
        let kernels = Kernels::load(&ctx)?;
        let status = Status::new(&ctx)?;
        let sms = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(driver_error)?;
        Ok((ctx, kernels, status, sms.max(1) as u32))
    }

    /// The CUDA context of this rank's device.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The configuration (as given; `max_blocks` as resolved is [`Self::max_blocks`]).
    pub fn config(&self) -> &IpcConfig {
        &self.config
    }

    /// Most blocks one launch uses.
    pub fn max_blocks(&self) -> u32 {
        self.max_blocks
    }

    /// The bound on GPU spin-waits.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Uses `algorithm` (a name of [`Algorithm`]) for the following calls, or the automatic
    /// choice for `None`. Every rank must choose alike (checked per call when validating).
    pub fn set_algorithm(&self, algorithm: Option<&str>) -> Result<()> {
        let parsed = algorithm.map(str::parse).transpose()?;
        self.algorithm.set(parsed);
        Ok(())
    }

    /// The algorithm a call of `bytes` per rank uses now.
    pub fn algorithm_for(&self, bytes: usize) -> Algorithm {
        self.algorithm
            .get()
            .unwrap_or_else(|| Algorithm::auto(self.world, bytes))
    }

    /// Collective: allocates `bytes` of device memory that every rank can read, for
    /// zero-copy all-reduces (inputs in such a buffer are read by the peers where they
    /// are, instead of being copied into the communicator's own buffer first). Every rank
    /// must use the same offsets in its buffer for a call.
    pub fn alloc(&self, bytes: usize) -> Result<IpcBuffer> {
        self.live()?;
        let reg = Registered::new(&self.ctx, &*self.bootstrap, bytes, |_| Ok(()))?;
        Ok(IpcBuffer::new(reg, bytes, self.registry.clone()))
    }

    /// Waits for the work enqueued on `stream`, bounded by the timeout (plus a margin);
    /// returns [`Error::Timeout`] if a kernel gave up waiting for a peer. Must not be called
    /// while `stream` is being captured.
    pub fn synchronize(&self, stream: RawStream) -> Result<()> {
        self.live()?;
        let status = &self.status;
        let timeout = self.timeout;
        let waited = wait_stream(&self.ctx, stream, timeout + HOST_MARGIN, || {
            status.check(timeout)
        })
        .and_then(|()| status.check(timeout));
        waited.map_err(|e| self.fail(e))
    }

    fn live(&self) -> Result<()> {
        match &*self.dead.borrow() {
            Some(why) => Err(Error::Aborted(format!("ipc communicator: {why}"))),
            None => Ok(()),
        }
    }

    /// Marks the communicator unusable after a fatal error; returns the error.
    fn fail(&self, e: Error) -> Error {
        if e.is_fatal() {
            self.dead.borrow_mut().get_or_insert_with(|| e.to_string());
        }
        e
    }

    /// Checks what this rank can check alone; returns the stream.
    fn check(&self, call: &CallDescriptor, locations: [MemoryLocation; 2]) -> Result<RawStream> {
        self.capabilities().check(
            "ipc",
            call.collective,
            call.dtype,
            call.op,
            call.send_bytes(),
            locations[1],
        )?;
        let mut streams = [RawStream(0); 2];
        for (slot, location) in streams.iter_mut().zip(locations) {
            *slot = match location {
                MemoryLocation::Device { ordinal, stream }
                    if ordinal as usize == self.ctx.ordinal() =>
                {
                    stream
                }
                MemoryLocation::Device { ordinal, .. } => {
                    return Err(Error::InvalidArgument(format!(
                        "ipc: rank {} works on device {}, got a buffer of device {ordinal}",
                        self.rank,
                        self.ctx.ordinal()
                    )));
                }
                other => {
                    return Err(Error::Unsupported(format!(
                        "ipc works on device memory only, got {other:?}"
                    )));
                }
            };
        }
        if streams[0] != streams[1] {
            return Err(Error::InvalidArgument(
                "ipc: send and recv views are on different streams".into(),
            ));
        }
        Ok(streams[1])
    }

    fn plan(&self, call: &CallDescriptor, send: u64, in_place: bool) -> Plan {
        let algorithm = self.algorithm_for(call.send_bytes());
        let zero_copy = match algorithm {
            // One-shot pull in place would overwrite an input that peers are still reading.
            Algorithm::OneshotPull if in_place => None,
            Algorithm::OneshotPull | Algorithm::TwoshotPull => {
                self.registry.find(send, call.send_bytes())
            }
            _ => None,
        };
        Plan {
            algorithm,
            zero_copy,
        }
    }

    /// With `validate`: exchanges every rank's verdict and plan, so that every rank fails
    /// (or goes on) together.
    fn agree(
        &self,
        mine: Result<(CallDescriptor, Plan, RawStream)>,
    ) -> Result<(CallDescriptor, Plan, RawStream)> {
        if !self.config.validate || self.world == 1 {
            return mine;
        }
        let verdict = mine.as_ref().map(|(d, _, _)| *d).map_err(clone_error);
        let mut msg = encode_verdict(&verdict).to_vec();
        if let Ok((_, plan, _)) = &mine {
            msg.push(plan.algorithm as u8);
            let (zc, off) = plan.zero_copy.map_or((0u8, 0u64), |(_, off)| (1, off));
            msg.push(zc);
            msg.extend_from_slice(&off.to_le_bytes());
        }
        let all = self
            .bootstrap
            .all_gather_bytes(&msg)
            .map_err(|e| self.fail(e))?;
        let verdicts = all
            .iter()
            .map(|m| decode_verdict(&m[..DESCRIPTOR_BYTES.min(m.len())]))
            .collect::<Result<Vec<_>>>()?;
        let (_, plan, stream) = mine?;
        let call = settle(verdict, &verdicts)?;
        if let Some((rank, _)) = all
            .iter()
            .enumerate()
            .find(|(_, m)| m[DESCRIPTOR_BYTES..] != msg[DESCRIPTOR_BYTES..])
        {
            return Err(Error::Mismatch(format!(
                "ipc: rank {rank} plans {} differently from rank {} ({:?}, zero-copy {}): \
                 algorithm, zero-copy use or buffer offset differ",
                call,
                self.rank,
                plan.algorithm,
                plan.zero_copy.is_some()
            )));
        }
        Ok((call, plan, stream))
    }

    /// One all-reduce; `send: None` is in place.
    fn reduce(&self, send: Option<BufferRef<'_>>, recv: BufferMut<'_>, op: ReduceOp) -> Result<()> {
        self.live()?;
        self.status.check(self.timeout).map_err(|e| self.fail(e))?;
        let in_place = send.is_none();
        let (described, send_addr, send_location) = match &send {
            Some(send) => (
                CallDescriptor::all_reduce(send, &recv, op),
                send.addr() as u64,
                send.location(),
            ),
            None => (
                CallDescriptor::all_reduce_in_place(&recv, op),
                recv.addr() as u64,
                recv.location(),
            ),
        };
        let mine = described.and_then(|call| {
            let stream = self.check(&call, [send_location, recv.location()])?;
            Ok((call, self.plan(&call, send_addr, in_place), stream))
        });
        let (call, plan, stream) = self.agree(mine)?;
        self.enqueue(&call, plan, send_addr, recv.addr() as u64, stream)
    }

    fn enqueue(
        &self,
        call: &CallDescriptor,
        plan: Plan,
        send: u64,
        recv: u64,
        stream: RawStream,
    ) -> Result<()> {
        let count = call.count as usize;
        if count == 0 {
            return Ok(());
        }
        self.ctx.bind_to_thread().map_err(driver_error)?;
        if self.world == 1 {
            if send != recv {
                // SAFETY: both views hold `send_bytes` bytes of this device (checked by the
                // view constructors' contracts); the copy is ordered on their stream.
                unsafe {
                    result::memcpy_dtod_async(recv, send, call.send_bytes(), cu_stream(stream))
                }
                .map_err(driver_error)?;
            }
            return Ok(());
        }
        let l = &self.layout;
        let (inputs, in_off) = plan.zero_copy.unwrap_or((0, 0));
        let args = KernelArgs {
            input: send,
            output: recv,
            regions: self.region.table(),
            inputs,
            status: self.status.device_ptr(),
            in_off,
            count: count as u64,
            cap: l.cap as u64,
            slice_cap: l.slice_cap as u64,
            off_data: l.off_data as u64,
            off_tmp: l.off_tmp as u64,
            off_push: l.off_push as u64,
            off_recv: l.off_recv as u64,
            off_result: l.off_result as u64,
            timeout_ns: self.timeout.as_nanos().min(u128::from(u64::MAX)) as u64,
            rank: self.rank as u32,
            world: self.world as u32,
            aligned: u32::from(send % 16 == 0 && recv % 16 == 0),
            gpu_scope: u32::from(self.region.sharing() == self.world),
        };
        let blocks = grid(
            plan.algorithm,
            call.dtype,
            count,
            self.world,
            self.config.threads,
            self.max_blocks,
        );
        let op = call.op.unwrap_or(ReduceOp::Sum);
        self.kernels.launch(
            (plan.algorithm, call.dtype, op),
            (blocks, self.config.threads),
            stream,
            &args,
        )
    }
}

/// A copy of a local error for the exchange (only its kind matters there).
fn clone_error(e: &Error) -> Error {
    Error::InvalidArgument(e.to_string())
}

/// Zeroes the header (flags, counters) and fills the Lamport mailboxes with the sentinel;
/// returns once done, before any peer can see the region.
fn init_region(buf: &mut DeviceBuffer, layout: &Layout) -> Result<()> {
    let ctx = buf.context().clone();
    let stream = ctx.default_stream();
    let base = buf.device_ptr();
    let lamport = layout.lamport_range();
    // SAFETY: both ranges are inside the allocation (Layout::total bytes); the stream is
    // synchronised before returning.
    unsafe {
        result::memset_d8_async(base, 0, HEADER_BYTES, stream.cu_stream()).map_err(driver_error)?;
        result::memset_d8_async(
            base + lamport.start as u64,
            0xff,
            lamport.len(),
            stream.cu_stream(),
        )
        .map_err(driver_error)?;
    }
    stream.synchronize().map_err(driver_error)
}

impl Communicator for IpcComm {
    fn name(&self) -> &str {
        "ipc"
    }

    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world
    }

    /// The inherent [`IpcComm::set_algorithm`]: without this, calls through
    /// `dyn Communicator` (allreduce-perf's `--algo`, `comm-select`) got the trait's
    /// default, which knows no algorithm.
    fn set_algorithm(&self, algorithm: Option<&str>) -> Result<()> {
        IpcComm::set_algorithm(self, algorithm)
    }

    fn capabilities(&self) -> &Capabilities {
        self.caps.get_or_init(|| {
            let names: Vec<&str> = Algorithm::ALL.iter().map(|a| a.name()).collect();
            let patterns: Vec<(&str, TrafficPattern)> = Algorithm::ALL
                .iter()
                .map(|a| (a.name(), a.pattern()))
                .collect();
            let mut caps = Capabilities::host_complete()
                .with_algorithms(&names)
                .with_algorithm_patterns(&patterns);
            caps.collectives = vec![Collective::AllReduce, Collective::Barrier];
            caps.dtypes = DTYPES.to_vec();
            caps.ops = OPS.to_vec();
            caps.host_memory = false;
            caps.device_memory = true;
            caps.max_bytes = Some(self.config.max_bytes);
            caps.graph_capture_safe = true;
            caps
        })
    }

    fn all_reduce(&self, send: BufferRef<'_>, recv: BufferMut<'_>, op: ReduceOp) -> Result<()> {
        self.reduce(Some(send), recv, op)
    }

    fn all_reduce_in_place(&self, buf: BufferMut<'_>, op: ReduceOp) -> Result<()> {
        self.reduce(None, buf, op)
    }

    fn barrier(&self) -> Result<()> {
        self.live()?;
        self.status.check(self.timeout).map_err(|e| self.fail(e))?;
        self.bootstrap.barrier().map_err(|e| self.fail(e))
    }
}
