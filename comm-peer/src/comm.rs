//! [`PeerComm`]: the communicator over a peer-memory source: joining, configuration
//! agreement, the per-call checks and the optional host agreement. The collectives are in
//! `collectives.rs`, the fused op in `fused.rs`.

use std::cell::Cell;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use comm_core::call::{DESCRIPTOR_BYTES, decode_verdict, encode_verdict, settle};
use comm_core::cuda::cudarc::driver::{CudaContext, CudaStream};
use comm_core::cuda::{driver_error, probe, raw_stream};
use comm_core::{
    Bootstrap, CallDescriptor, Capabilities, Collective, Disagreements, Error, MemoryLocation,
    RawStream, Result,
};

use crate::algorithm::{Algorithm, Memory, parse_choice};
use crate::calls::{self, CallWords};
use crate::config::PeerConfig;
use crate::copies::Copies;
use crate::grid::{BLOCK_SIZES, default_grid};
use crate::group::{PeerGroup, Ready};
use crate::kernels::{DTYPES, OPS, PeerArgs};
use crate::layout::{Layout, MAX_BLOCKS, MAX_THREADS};
use crate::registered::Registered;
use crate::residency::Residency;
use crate::scratch::Scratch;
use crate::source::PeerSource;
use crate::zero_copy::{PeerBuffer, Registry};

/// The smallest message that goes by copies where the regions are host memory and every
/// rank has a GPU of its own. On two H200s (2026-12-04, graphs) the copies lost to the
/// kernels at every size measured, up to 4 MiB (359 us against 155 for two-shot push;
/// [`crate::algorithm::HOST_PAIR_ONESHOT_MAX`] has the figures); on one H200 with two
/// ranks the kernels of 2026-12-01 took 8.0 ms at 64 MiB against the copies' 3.9. Between
/// 4 and 16 MiB not measured with a GPU per rank.
pub const COPIES_FROM: usize = 16 << 20;

/// One rank of a communicator over peer memory (see the crate docs).
///
/// Calls enqueue their kernels on the buffers' stream and return: one, or one per part of a
/// message larger than a launch holds (`max_bytes` of [`PeerConfig`]). Nothing
/// synchronises, so calls can be captured into CUDA graphs. [`PeerComm::synchronize`]
/// waits, bounded.
///
/// Dropping is collective, as destroying an NCCL communicator is: every rank first
/// synchronises the streams of its calls, then drops. The drop waits (bounded by the
/// bootstrap's timeout) until every rank has arrived before this rank's region is released,
/// since a peer's last kernel may still read or write it.
pub struct PeerComm {
    pub(crate) name: &'static str,
    pub(crate) group: PeerGroup,
    pub(crate) bootstrap: Arc<dyn Bootstrap>,
    pub(crate) config: PeerConfig,
    pub(crate) layout: Layout,
    pub(crate) max_blocks: u32,
    /// Work items each thread takes on before the grid grows (more where blocks are dear).
    pub(crate) items_per_thread: usize,
    /// Most blocks a small one-shot all-reduce spreads over (`grid::spread_grid`), for
    /// blocks of each of `grid::BLOCK_SIZES` threads; none on host memory, where each
    /// block costs more than it carries.
    pub(crate) spread_blocks: Option<[u32; 3]>,
    /// Most blocks of a streamed one-shot push over host memory (every block of every rank
    /// sharing the device resident at once, whatever launches are around it).
    pub(crate) stream_blocks: u32,
    pub(crate) algorithm: Cell<Option<Algorithm>>,
    pub(crate) capabilities: Capabilities,
    pub(crate) registry: Arc<Registry>,
    pub(crate) barrier_stream: Arc<CudaStream>,
    /// Where every rank's parts of a strided call cut into launches meet (`chunks`).
    pub(crate) scratch: Scratch,
    /// The stream, events and staging of all-reduces by copies (`copies`).
    pub(crate) copies: Copies,
}

impl fmt::Debug for PeerComm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PeerComm")
            .field("name", &self.name)
            .field("group", &self.group)
            .field("config", &self.config)
            .field("layout", &self.layout)
            .field("max_blocks", &self.max_blocks)
            .field("spread_blocks", &self.spread_blocks)
            .field("stream_blocks", &self.stream_blocks)
            .finish_non_exhaustive()
    }
}

/// A call every rank makes alike (as far as this rank can tell before launching): the
/// call, its stream, and its words for the kernels' comparison.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Agreed {
    pub(crate) call: CallDescriptor,
    pub(crate) stream: RawStream,
    pub(crate) words: CallWords,
}

/// Makes this rank's peer memory for a layout, collectively (every rank calls it once).
pub type MakeSource<'a> = dyn FnOnce(&Ready, &Layout) -> Result<Box<dyn PeerSource>> + 'a;

impl PeerComm {
    /// Joins the communicator of every rank of `bootstrap` on CUDA device `device`, as the
    /// backend `name`, with memory from `source`.
    ///
    /// Collective. Every rank checks that it can take part (driver, NVRTC, device, kernels)
    /// and that all ranks use the same configuration (`config` and the backend's `extra`
    /// settings); then `source` makes and maps every rank's region. If any rank fails, all
    /// return an error.
    pub fn join(
        name: &'static str,
        bootstrap: Arc<dyn Bootstrap>,
        device: usize,
        config: PeerConfig,
        extra: &str,
        source: Box<MakeSource<'_>>,
    ) -> Result<Self> {
        let world = bootstrap.world_size();
        let layout = Layout::new(
            world,
            config.max_bytes,
            config.lamport_max_bytes.min(config.max_bytes),
        );
        let local = prepare(device, world, &config, &layout);
        let mut msg = match &local {
            Ok(prepared) => [&[1u8][..], &prepared.residency.to_bytes()].concat(),
            Err(e) => [&[0u8][..], e.to_string().as_bytes()].concat(),
        };
        msg.extend_from_slice(format!("{config:?} {extra}").as_bytes());
        let all = bootstrap.all_gather_bytes(&msg)?;
        let Prepared {
            ready,
            barrier_stream,
            scratch,
            copies,
            mut residency,
            ..
        } = local?;
        // The first byte says whether the rank is ready, the residency of its kernels
        // follows, then its configuration.
        const CONFIG: usize = 1 + Residency::BYTES;
        for (rank, m) in all.iter().enumerate() {
            if m.first() != Some(&1) || m.len() < CONFIG {
                return Err(Error::Bootstrap(format!(
                    "rank {rank} cannot join the {name} communicator: {}",
                    String::from_utf8_lossy(m.get(1..).unwrap_or_default())
                )));
            }
            if m[CONFIG..] != msg[CONFIG..] {
                return Err(Error::Mismatch(format!(
                    "{name}: rank {rank} has another configuration: {} (rank {}: {})",
                    String::from_utf8_lossy(&m[CONFIG..]),
                    bootstrap.rank(),
                    String::from_utf8_lossy(&msg[CONFIG..]),
                )));
            }
            let theirs = Residency::from_bytes(m[1..CONFIG].try_into().unwrap());
            residency = residency.min(theirs);
        }
        let memory = source(&ready, &layout)?;
        let (default_blocks, items_per_thread) =
            default_grid(residency.sms, memory.sharing(), memory.host_memory());
        let max_blocks = config
            .max_blocks
            .unwrap_or(default_blocks)
            .clamp(1, MAX_BLOCKS);
        let spread_blocks = (!memory.host_memory()).then(|| match memory.sharing() {
            1 => [max_blocks; 3],
            // Where ranks share a device, no more blocks than start early beside theirs.
            sharing => BLOCK_SIZES
                .map(|threads| max_blocks.min(residency.early_bound(threads, sharing).max(1))),
        });
        let stream_blocks = config
            .max_blocks
            .unwrap_or(MAX_BLOCKS)
            .min(residency.whole_sm_bound(memory.sharing()))
            .clamp(2, MAX_BLOCKS);
        let timeout = config.timeout.unwrap_or_else(|| bootstrap.timeout());
        Ok(PeerComm {
            name,
            group: PeerGroup::new(ready, bootstrap.rank(), world, memory, timeout),
            scratch,
            copies,
            barrier_stream,
            algorithm: Cell::new(config.algorithm),
            registry: Arc::new(Registry::default()),
            bootstrap,
            capabilities: capabilities(&config),
            config,
            layout,
            max_blocks,
            items_per_thread,
            spread_blocks,
            stream_blocks,
        })
    }

    /// The backend's name (`ipc`, `symm`).
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The group underneath: its signal primitives, peer table and status.
    pub fn group(&self) -> &PeerGroup {
        &self.group
    }

    /// The CUDA context of this rank's device.
    pub fn context(&self) -> &Arc<CudaContext> {
        self.group.context()
    }

    /// The configuration (as given; `max_blocks` as resolved is [`Self::max_blocks`]).
    pub fn config(&self) -> &PeerConfig {
        &self.config
    }

    /// Where everything lives in every rank's region.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Most blocks one launch uses.
    pub fn max_blocks(&self) -> u32 {
        self.max_blocks
    }

    /// The bound on GPU spin-waits.
    pub fn timeout(&self) -> Duration {
        self.group.timeout()
    }

    /// Sets the bound on waits for peers (kernels and host), for the following calls.
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.group.set_timeout(timeout);
    }

    /// What this communicator can do (computed once).
    pub fn capabilities(&self) -> &Capabilities {
        &self.capabilities
    }

    /// Uses `algorithm` for the following all-reduces, or the automatic choice for `None`.
    /// Every rank must choose alike (checked per call when validating).
    pub fn use_algorithm(&self, algorithm: Option<Algorithm>) {
        self.algorithm.set(algorithm);
    }

    /// [`Self::use_algorithm`] by name (`auto` for the automatic choice).
    pub fn set_algorithm(&self, algorithm: Option<&str>) -> Result<()> {
        let parsed = match algorithm {
            Some(name) => parse_choice(name)?,
            None => None,
        };
        self.use_algorithm(parsed);
        Ok(())
    }

    /// The algorithm an all-reduce of `bytes` per rank uses now: the chosen one, or the
    /// automatic choice for `None`; then the pull variant of a push message larger than the
    /// mailboxes, but for a one-shot push over host memory, which goes as data and flags past
    /// them, in launches of what a staging half holds ([`Layout::oneshot_push_bytes`]).
    ///
    /// The automatic choice is [`Algorithm::auto`], with two exceptions. Ranks that share a
    /// device run its pull variant, except at one-shot sizes where the ranks all share one
    /// device's memory, whose one-shot push writes each rank's data once, into its own slot
    /// (one H200, 42 KB in graphs: 2 ranks push 3.01 us, pull 3.53; 8 ranks 4.32 against
    /// 4.61), or where the regions are host memory, whose one-shot push moves every byte
    /// across the link once each way (one H200, 2 ranks, graphs: 42 KB 11.3-12.4 us against
    /// 13.2-13.6 for pull, 256 KiB 27.8-28.3 against 30.6-30.8 for two-shot pull; two such
    /// ranks push one shot at every size). And where the regions are host memory and every
    /// rank has a device of its own, two ranks push one shot only up to
    /// [`HOST_PAIR_ONESHOT_MAX`] bytes (two-shot beyond), and messages of [`COPIES_FROM`]
    /// bytes and more go by copies ([`Algorithm::OneshotCopy`]); not where ranks share a
    /// device, whose copies all meet in its copy engines and in CUDA graphs can wait on each
    /// other.
    ///
    /// [`HOST_PAIR_ONESHOT_MAX`]: crate::algorithm::HOST_PAIR_ONESHOT_MAX
    /// [`Layout::oneshot_push_bytes`]: crate::layout::Layout::oneshot_push_bytes
    pub fn algorithm_for(&self, bytes: usize) -> Algorithm {
        Algorithm::resolve(self.algorithm.get(), bytes, self.memory())
    }

    /// What the automatic choices need to know of this communicator's memory.
    pub(crate) fn memory(&self) -> Memory {
        Memory {
            world: self.group.world_size(),
            host: self.group.host_memory(),
            sharing: self.group.sharing(),
            mailbox: self.layout.lcap,
        }
    }

    /// Collective: allocates `bytes` of device memory that every rank can read, for
    /// zero-copy all-reduces (inputs in such a buffer are read by the peers where they
    /// are, instead of being copied into the communicator's own region first; pull
    /// algorithms). Every rank must use the same offsets in its buffer for a call.
    ///
    /// Peers read such a buffer in this device's memory directly, which needs peer access
    /// between the devices: where the regions are host memory (a source for devices without
    /// it), this is `Error::Unsupported`.
    pub fn alloc(&self, bytes: usize) -> Result<PeerBuffer> {
        self.group.live()?;
        if self.group.host_memory() {
            return Err(Error::Unsupported(format!(
                "{}: zero-copy buffers are device memory that peers read directly (peer \
                 access); this communicator's regions are host memory",
                self.name
            )));
        }
        let reg = Registered::new(self.context(), &*self.bootstrap, bytes, |_| Ok(()))?;
        Ok(PeerBuffer::new(
            self.name,
            reg,
            bytes,
            self.registry.clone(),
            self.bootstrap.clone(),
        ))
    }

    /// Waits for the work enqueued on `stream`, bounded by the timeout (plus a margin);
    /// returns [`Error::Timeout`] if a kernel gave up waiting for a peer. Must not be called
    /// while `stream` is being captured.
    pub fn synchronize(&self, stream: RawStream) -> Result<()> {
        self.group.synchronize(stream)
    }

    /// Checks where the buffers are; returns their (common) stream.
    pub(crate) fn stream_of(&self, locations: &[MemoryLocation]) -> Result<RawStream> {
        let name = self.name;
        let ordinal = self.context().ordinal();
        let mut stream = None;
        for &location in locations {
            let s = match location {
                MemoryLocation::Device { ordinal: o, stream } if o as usize == ordinal => stream,
                MemoryLocation::Device { ordinal: o, .. } => {
                    return Err(Error::InvalidArgument(format!(
                        "{name}: rank {} works on device {ordinal}, got a buffer of device {o}",
                        self.group.rank(),
                    )));
                }
                other => {
                    return Err(Error::Unsupported(format!(
                        "{name} works on device memory only, got {other:?}"
                    )));
                }
            };
            if *stream.get_or_insert(s) != s {
                return Err(Error::InvalidArgument(format!(
                    "{name}: the buffers are on different streams"
                )));
            }
        }
        stream.ok_or_else(|| Error::InvalidArgument(format!("{name}: no buffers")))
    }

    /// This rank's checks of a call: descriptor, capabilities, memory, stream.
    pub(crate) fn checked(
        &self,
        call: Result<CallDescriptor>,
        locations: &[MemoryLocation],
    ) -> Result<(CallDescriptor, RawStream)> {
        let call = self.capabilities.admit(self.name, call, locations)?;
        Ok((call, self.stream_of(locations)?))
    }

    /// Settles this rank's checked call (`mine`) and `plan` (what else it decided, bytes)
    /// with the other ranks; `locations` are the call's buffers. Every call, failed or not,
    /// takes part in the kernels' agreement: a rank that rejects its arguments launches
    /// [`Self::agree_only`], so that its peers fail at once rather than wait, and returns
    /// its own error. With `agree_on_host`, every rank's verdict and plan are first exchanged
    /// through the bootstrap, so that all fail or go on together before any launch.
    pub(crate) fn agree(
        &self,
        mine: Result<(CallDescriptor, RawStream)>,
        plan: &[u8],
        locations: &[MemoryLocation],
    ) -> Result<Agreed> {
        let mine = if self.config.agree_on_host && self.group.world_size() > 1 {
            self.agree_on_host(mine, plan)
        } else {
            mine
        };
        match mine {
            Ok((call, stream)) => Ok(Agreed {
                call,
                stream,
                words: calls::encode(&call, plan),
            }),
            Err(e) => {
                if !self.config.agree_on_host && self.group.world_size() > 1 {
                    let stream = self
                        .stream_of(locations)
                        .unwrap_or_else(|_| raw_stream(&self.barrier_stream));
                    if let Err(launch) = self.agree_only(calls::REJECTED, stream) {
                        return Err(self.group.fail(launch));
                    }
                }
                Err(e)
            }
        }
    }

    /// Enqueues what follows a call's agreement. A failure there is fatal: every peer goes
    /// on to its part of the call and waits for this rank's, which will not come
    /// ([`crate::PeerGroup::abandon`]).
    pub(crate) fn after_agreement(&self, enqueue: impl FnOnce() -> Result<()>) -> Result<()> {
        enqueue().map_err(|e| self.group.abandon(e))
    }

    /// Takes part in a call's agreement, moving nothing (`peer_agree_only`): for a call
    /// this rank rejected ([`calls::REJECTED`]) or one with nothing to move, so that peers
    /// making another call fail at once rather than wait.
    pub(crate) fn agree_only(&self, words: CallWords, stream: RawStream) -> Result<()> {
        if self.group.world_size() == 1 {
            return Ok(());
        }
        self.group.live()?;
        let args = PeerArgs {
            call: words,
            ..self.args()
        };
        self.group.launch("peer_agree_only", (1, 32), stream, &args)
    }

    /// The host agreement: every rank's verdict and plan, so that all fail or go on
    /// together; a local failure is reported as itself.
    fn agree_on_host(
        &self,
        mine: Result<(CallDescriptor, RawStream)>,
        plan: &[u8],
    ) -> Result<(CallDescriptor, RawStream)> {
        let verdict = mine
            .as_ref()
            .map(|m| m.0)
            .map_err(|e| Error::InvalidArgument(e.to_string()));
        let mut msg = encode_verdict(&verdict).to_vec();
        msg.extend_from_slice(plan);
        let agreed = (|| {
            let all = self
                .bootstrap
                .all_gather_bytes(&msg)
                .map_err(|e| self.group.fail(e))?;
            let verdicts = all
                .iter()
                .map(|m| decode_verdict(&m[..DESCRIPTOR_BYTES.min(m.len())]))
                .collect::<Result<Vec<_>>>()?;
            let call = settle(verdict, &verdicts)?;
            if let Some((rank, _)) = all
                .iter()
                .enumerate()
                .find(|(_, m)| m.get(DESCRIPTOR_BYTES..) != msg.get(DESCRIPTOR_BYTES..))
            {
                return Err(Error::Mismatch(format!(
                    "{}: rank {rank} plans {call} differently from rank {} (algorithm, \
                     zero-copy use, buffer offset or shape)",
                    self.name,
                    self.group.rank()
                )));
            }
            Ok(call)
        })();
        match (mine, agreed) {
            (Err(local), _) => Err(local),
            (Ok(_), Err(e)) => Err(e),
            (Ok((_, stream)), Ok(call)) => Ok((call, stream)),
        }
    }

    /// The kernel arguments of every collective launch.
    /// [`Self::args`] for a call that reads `count` from `input` and writes `output`;
    /// `aligned` says whether both allow 16-byte vector access.
    pub(crate) fn io_args(&self, call: &Agreed, input: u64, output: u64, count: u64) -> PeerArgs {
        PeerArgs {
            input,
            output,
            count,
            call: call.words,
            aligned: u32::from(input % 16 == 0 && output % 16 == 0),
            ..self.args()
        }
    }

    pub(crate) fn args(&self) -> PeerArgs {
        let l = &self.layout;
        PeerArgs {
            cap: l.cap as u64,
            lcap: l.lcap as u64,
            slice_cap: l.slice_cap as u64,
            off_data: l.off_data as u64,
            off_tmp: l.off_tmp as u64,
            off_push: l.off_push as u64,
            off_recv: l.off_recv as u64,
            off_result: l.off_result as u64,
            ..self.group.base_args()
        }
    }
}

impl Drop for PeerComm {
    fn drop(&mut self) {
        // Without this, a rank that frees its region while a peer's kernel still reads it
        // faults that peer's context (ranks of one process address each other's regions
        // directly); and a rank whose free waits for its device to idle would sit behind
        // a kernel of a new communicator spinning for it on the same device.
        if self.group.world_size() > 1 {
            let _ = self.bootstrap.barrier();
        }
    }
}

/// The device of a rank that joins from its bootstrap: `local_rank % device_count` (one
/// GPU per rank of a node; several ranks per GPU when there are more ranks than GPUs).
pub fn device_for(bootstrap: &dyn Bootstrap) -> usize {
    probe::device_count()
        .map(|n| bootstrap.local_rank() % n)
        .unwrap_or(0)
}

/// Takes part in the first exchange of [`PeerComm::join`] with a failure, so that the other
/// ranks fail rather than wait; returns `e`.
pub fn refuse_join(bootstrap: &dyn Bootstrap, e: Error) -> Error {
    let _ = bootstrap.all_gather_bytes(&[0u8]);
    e
}

/// What a rank sets up on its own before joining, so that a failure reaches every rank
/// through the first exchange.
struct Prepared {
    ready: Ready,
    /// How many blocks of the kernels the device holds at once.
    residency: Residency,
    barrier_stream: Arc<CudaStream>,
    scratch: Scratch,
    copies: Copies,
}

fn prepare(device: usize, world: usize, config: &PeerConfig, layout: &Layout) -> Result<Prepared> {
    if config.threads < 32 || config.threads > MAX_THREADS || config.threads % 32 != 0 {
        return Err(Error::InvalidArgument(format!(
            "peer memory: threads must be a multiple of 32 in 32..={MAX_THREADS}, got {}",
            config.threads
        )));
    }
    let ctx = probe::context(device)?;
    let ready = Ready::new(&ctx, world)?;
    let residency = ready.residency();
    let barrier_stream = ctx.new_stream().map_err(driver_error)?;
    let scratch = Scratch::new(&barrier_stream, layout.cap)?;
    let copies = Copies::new(&ctx, &barrier_stream, layout, residency.sms)?;
    Ok(Prepared {
        ready,
        residency,
        barrier_stream,
        scratch,
        copies,
    })
}

fn capabilities(config: &PeerConfig) -> Capabilities {
    let patterns = Algorithm::ALL.map(|a| (a.name(), a.pattern()));
    let mut caps = Capabilities::host_complete()
        .with_algorithms(&Algorithm::NAMES)
        .with_algorithm_patterns(&patterns);
    caps.collectives = vec![
        Collective::AllReduce,
        Collective::AllGather,
        Collective::ReduceScatter,
        Collective::Broadcast,
        Collective::Barrier,
    ];
    caps.dtypes = DTYPES.to_vec();
    caps.ops = OPS.to_vec();
    caps.host_memory = false;
    caps.device_memory = true;
    // Larger messages move in parts (chunks).
    caps.max_bytes = None;
    // Changing state lives on the device; agreement on the host happens at capture only.
    caps.graph_capture_safe = true;
    caps.disagreements = if config.agree_on_host {
        Disagreements::Settled
    } else {
        Disagreements::Poison
    };
    caps
}
