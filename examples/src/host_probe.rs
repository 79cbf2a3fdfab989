//! `host-probe`: what a GPU pays to reach pinned host memory mapped into it, the memory
//! comm-symm's host backing runs on where GPUs have no peer access.
//!
//! Six measurements, from the kernels of `host_probe.cu`, each timed on the GPU
//! (`%globaltimer`), so that no launch is counted:
//! - **chase**: one thread follows a chain of dependent loads through host memory (and,
//!   for comparison, through device memory): the round trip of one load;
//! - **move**: a grid of `blocks` x 512 threads reads, or writes, a message of host memory
//!   in 16-byte vectors, as a one-shot all-reduce reads its peers' data: the span from the
//!   first block's start to the last block's end, median over fresh parts of a buffer
//!   larger than L2 (nothing is read twice); and two such grids in one launch, a message
//!   each, both reading, both writing, or one writing while the other reads, as the two
//!   ranks of an all-reduce on one GPU share its one link; and both ranks' traffic of a
//!   protocol that reads while it writes (two messages written while two are read, the
//!   fastest of three splits of the grid);
//! - **ping-pong**: a flag bounced through host memory between two GPUs, or with one GPU
//!   between two kernels on two streams of it; half a round is what a write takes to be seen
//!   by the other side, the least any exchange through host memory can cost. It runs in
//!   memory allocated by the driver, in a shared-memory file registered with it (as
//!   comm-symm's host backing maps its heap) and in VMM host memory (`cuMemCreate` on the
//!   host NUMA node), each with and without a system fence after
//!   each write, on one page or on a new page each round (as rotating mailboxes are); and
//!   with waits that keep several polls in flight, spaced over a load's round trip, on one
//!   word or each on a copy of the flag of its own, the flag stored plainly, fenced or
//!   written through L2 (`probe_pingpong_staggered`);
//! - **bursts**: one thread issues 1-8 independent loads of host memory before it uses any,
//!   of each kind (volatile, relaxed.sys, weak `.cv`, weak, acquire.sys): do they travel
//!   together (one round trip) or one after another (on one H200: together, but for
//!   acquire loads, each a round trip of its own)?
//! - **load after writes**: one load of host memory right after one block stored a message
//!   into host (or device) memory, as a push all-reduce polls its mailbox after pushing: if
//!   the GPU's reads wait behind its own writes to host memory, the load grows with them;
//! - **kernel**: an empty kernel in graph replay, launched as the peer kernels are, on one
//!   stream and on each of two streams at once (`launch-cost`'s concurrent graphs): what a
//!   call's kernel costs by itself, which no move above counts;
//! - **handshake**: graphs of kernels that do nothing but hear from the other stream once
//!   through host memory (`launch-cost`'s handshakes), on two streams replaying at once:
//!   the least a call of two ranks sharing the GPU costs, kernel and flag together; and the
//!   same kernel launched eagerly by two threads, framed by events and back to back.

use std::ffi::c_void;
use std::sync::Arc;

use comm_core::cuda::cudarc::driver::{CudaContext, CudaFunction, result, sys};
use comm_core::cuda::stream::cu_stream;
use comm_core::cuda::{DeviceMemory, KernelCache, KernelSource, device_count, driver_error};
use comm_core::{Error, Result};
use comm_symm::cuda::VmmMapping;
use serde::{Deserialize, Serialize};

/// The probe kernels.
pub const HOST_PROBE: KernelSource = KernelSource {
    name: "host_probe.cu",
    source: include_str!("../kernels/host_probe.cu"),
};

const THREADS: u32 = 512;
/// The buffer the move probe walks through: larger than any L2, so every read misses.
const WALK_BYTES: usize = 512 << 20;
/// Bytes one block writes before the timed load (0: the load alone).
const AFTER_WRITES: [usize; 6] = [0, 4096, 16384, 43008, 86016, 262144];

/// Pages the rotating ping-pong walks (16 MiB of 4 KiB pages, more than any TLB maps).
const ROTATING_PAGES: usize = 4096;
const PAGE: usize = 4096;

/// Chain links, one per 4 KiB page and then some, so that no two share a line.
const CHAIN_LINKS: usize = 4096;
const CHAIN_STRIDE_WORDS: usize = 4160 / 8;

/// Pinned host memory mapped into every context (portable), zeroed, freed on drop.
pub(crate) struct Pinned {
    ctx: Arc<CudaContext>,
    host: *mut u64,
    bytes: usize,
    registered: bool,
}

/// Where a ping-pong's flags live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostMemory {
    /// `cuMemHostAlloc` (portable, device-mapped).
    Allocated,
    /// A `memfd` mapped shared and registered with `cuMemHostRegister` (portable,
    /// device-mapped), as comm-symm's host backing maps its heap.
    Registered,
    /// `cuMemCreate` on the host NUMA node, exportable as a file descriptor, mapped into
    /// the devices (what a host heap shared between processes could be instead).
    Vmm,
}

impl HostMemory {
    /// Its name in the report.
    pub fn name(self) -> &'static str {
        match self {
            HostMemory::Allocated => "cuMemHostAlloc",
            HostMemory::Registered => "memfd + cuMemHostRegister",
            HostMemory::Vmm => "cuMemCreate, host NUMA",
        }
    }
}

impl Pinned {
    /// `bytes` of shared memory from a `memfd`, registered with the driver, zeroed.
    fn registered(ctx: &Arc<CudaContext>, bytes: usize) -> Result<Self> {
        let os = |what: &str| {
            let e = std::io::Error::last_os_error();
            Error::Io(std::io::Error::new(e.kind(), format!("{what}: {e}")))
        };
        let name = c"host-probe";
        // SAFETY: a valid C string.
        let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(os("memfd_create"));
        }
        // SAFETY: `fd` is ours; the mapping keeps the memory after the descriptor closes.
        let host = unsafe {
            let ok = libc::ftruncate(fd, bytes as libc::off_t) == 0;
            let ptr = if ok {
                libc::mmap(
                    std::ptr::null_mut(),
                    bytes,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED,
                    fd,
                    0,
                )
            } else {
                libc::MAP_FAILED
            };
            libc::close(fd);
            ptr
        };
        if host == libc::MAP_FAILED {
            return Err(os("ftruncate/mmap"));
        }
        ctx.bind_to_thread().map_err(driver_error)?;
        let flags = sys::CU_MEMHOSTREGISTER_DEVICEMAP | sys::CU_MEMHOSTREGISTER_PORTABLE;
        // SAFETY: `bytes` of our mapping, page-aligned.
        if let Err(e) = unsafe { sys::cuMemHostRegister_v2(host, bytes, flags) }.result() {
            // SAFETY: our mapping, unmapped once.
            unsafe { libc::munmap(host, bytes) };
            return Err(driver_error(e));
        }
        Ok(Pinned {
            ctx: ctx.clone(),
            host: host.cast(),
            bytes,
            registered: true,
        })
    }

    pub(crate) fn new(ctx: &Arc<CudaContext>, bytes: usize) -> Result<Self> {
        ctx.bind_to_thread().map_err(driver_error)?;
        let mut host: *mut c_void = std::ptr::null_mut();
        let flags = sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE;
        // SAFETY: valid out-pointer; `bytes` of pinned, mapped memory.
        unsafe { sys::cuMemHostAlloc(&mut host, bytes, flags) }
            .result()
            .map_err(driver_error)?;
        let pinned = Pinned {
            ctx: ctx.clone(),
            host: host.cast(),
            bytes,
            registered: false,
        };
        // SAFETY: `bytes` bytes of our allocation.
        unsafe { std::ptr::write_bytes(pinned.host.cast::<u8>(), 0, bytes) };
        Ok(pinned)
    }

    /// The host address of byte `offset`, which copies take as it is (unified addressing).
    pub(crate) fn addr(&self, offset: usize) -> u64 {
        assert!(offset <= self.bytes);
        self.host as u64 + offset as u64
    }

    /// The allocation's address in `ctx`'s device.
    fn device(&self, ctx: &Arc<CudaContext>) -> Result<u64> {
        ctx.bind_to_thread().map_err(driver_error)?;
        let mut device = 0;
        // SAFETY: valid out-pointer; allocated portable and device-mapped.
        unsafe { sys::cuMemHostGetDevicePointer_v2(&mut device, self.host.cast(), 0) }
            .result()
            .map_err(driver_error)?;
        Ok(device)
    }

    fn word(&self, i: usize) -> u64 {
        assert!(i < self.bytes / 8);
        // SAFETY: in bounds (checked); written by kernels that have finished.
        unsafe { self.host.add(i).read_volatile() }
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        if self.registered {
            if self.ctx.bind_to_thread().is_ok() {
                // SAFETY: registered in `registered`, unregistered once.
                let _ = unsafe { sys::cuMemHostUnregister(self.host.cast()) };
            }
            // SAFETY: our mapping of `bytes`, unmapped once.
            unsafe { libc::munmap(self.host.cast(), self.bytes) };
        } else if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: allocated by cuMemHostAlloc, freed once.
            let _ = unsafe { sys::cuMemFreeHost(self.host.cast()) };
        }
    }
}

/// One GPU with the probe kernels.
struct Gpu {
    memory: DeviceMemory,
    chase: CudaFunction,
    moves: CudaFunction,
    move_pair: CudaFunction,
    pingpong: CudaFunction,
    pingpong_staggered: CudaFunction,
    load_after_writes: CudaFunction,
    burst: CudaFunction,
}

impl Gpu {
    fn new(ordinal: usize) -> Result<Self> {
        let memory = DeviceMemory::new(ordinal)?;
        let ctx = memory.context();
        let cache = KernelCache::global();
        Ok(Gpu {
            chase: cache.function(ctx, &HOST_PROBE, "host_probe_chase")?,
            moves: cache.function(ctx, &HOST_PROBE, "host_probe_move")?,
            move_pair: cache.function(ctx, &HOST_PROBE, "host_probe_move_pair")?,
            pingpong: cache.function(ctx, &HOST_PROBE, "host_probe_pingpong")?,
            pingpong_staggered: cache.function(
                ctx,
                &HOST_PROBE,
                "host_probe_pingpong_staggered",
            )?,
            load_after_writes: cache.function(ctx, &HOST_PROBE, "host_probe_load_after_writes")?,
            burst: cache.function(ctx, &HOST_PROBE, "host_probe_burst")?,
            memory,
        })
    }

    fn ctx(&self) -> &Arc<CudaContext> {
        self.memory.context()
    }

    /// Enqueues `f` with `blocks` x `threads`.
    ///
    /// # Safety
    /// `params` must match the kernel's parameters, and the memory they address must hold
    /// what the grid touches.
    unsafe fn launch(
        &self,
        f: &CudaFunction,
        blocks: u32,
        threads: u32,
        params: &mut [*mut c_void],
    ) -> Result<()> {
        self.ctx().bind_to_thread().map_err(driver_error)?;
        // SAFETY: the caller vouches for the parameters; the function is of this context.
        unsafe {
            result::launch_kernel(
                f.cu_function(),
                (blocks, 1, 1),
                (threads, 1, 1),
                0,
                cu_stream(self.memory.raw_stream()),
                params,
            )
        }
        .map_err(driver_error)
    }
}

/// Nanoseconds per load of a chain of `CHAIN_LINKS` dependent loads at `chain` (device
/// address; the words are already linked), timed into `times`.
fn chase(gpu: &Gpu, chain: u64, times: &Pinned) -> Result<f64> {
    let mut chain = chain;
    let mut steps = CHAIN_LINKS as u64 - 1;
    let mut out = times.device(gpu.ctx())?;
    let mut params = comm_core::kernel_params![chain, steps, out];
    // SAFETY: (u64* chain, u64 steps, u64* times): the chain has CHAIN_LINKS linked words;
    // times has two words.
    unsafe { gpu.launch(&gpu.chase, 1, 32, &mut params)? };
    gpu.memory.synchronize()?;
    Ok(times.word(0) as f64 / (CHAIN_LINKS - 1) as f64)
}

/// Links word `i * CHAIN_STRIDE_WORDS` to the next such word, in an order that jumps.
fn chain_links() -> Vec<(usize, u64)> {
    // A fixed odd multiplier visits every link once, far from the one before.
    let order: Vec<usize> = (0..CHAIN_LINKS).map(|i| (i * 2897) % CHAIN_LINKS).collect();
    order
        .windows(2)
        .map(|w| {
            (
                w[0] * CHAIN_STRIDE_WORDS,
                (w[1] * CHAIN_STRIDE_WORDS) as u64,
            )
        })
        .collect()
}

/// One move measurement: GPU time (us) of reading or writing `bytes` with `blocks`.
#[derive(Debug, Clone, Copy)]
pub struct Move {
    /// Message bytes.
    pub bytes: usize,
    /// Blocks of 512 threads.
    pub blocks: u32,
    /// Median span of a read by volatile loads, us.
    pub read_us: f64,
    /// Median span of a read by weak loads that fetch again (`.cv`), us.
    pub read_cv_us: f64,
    /// Median span of a write, us.
    pub write_us: f64,
    /// Median span of two such grids at once (`host_probe_move_pair`), each reading a
    /// message of its own, as the two ranks of an all-reduce on one GPU read over its one
    /// link, us.
    pub pair_read_us: f64,
    /// The same, both grids writing, us.
    pub pair_write_us: f64,
    /// The same, one grid writing while the other reads (is the link full duplex?), us.
    pub duplex_us: f64,
    /// Both ranks' traffic at once: part of a grid of `4 * blocks` (twice the pairs') writes
    /// two messages' bytes while the rest reads two messages' bytes, as the link of one GPU
    /// carries an all-reduce of two ranks that reads while it writes; the fastest split, us.
    pub both_ways_us: f64,
    /// The writing blocks of that fastest split (of `4 * blocks`).
    pub both_ways_writers: u32,
}

/// What `measure` found.
#[derive(Debug)]
pub struct Report {
    /// One dependent load of host memory, ns.
    pub host_load_ns: f64,
    /// One dependent load of device memory, ns.
    pub device_load_ns: f64,
    /// Reads and writes of host memory by message size and grid.
    pub moves: Vec<Move>,
    /// Flags bounced through host memory.
    pub pingpongs: Vec<PingPong>,
    /// Flags bounced through host memory, seen by several polls in flight at once.
    pub staggered: Vec<Staggered>,
    /// One host load after a block's writes, by bytes, memory written and fence.
    pub after_writes: Vec<LoadAfterWrites>,
    /// One thread's independent loads of host memory, by kind and number.
    pub bursts: Vec<Burst>,
    /// An empty kernel in CUDA-graph replay, launched as the peer kernels are: us per
    /// kernel of one stream alone, and per kernel of each of two streams replaying at once
    /// (two ranks sharing the GPU).
    pub kernel_us: f64,
    /// See `kernel_us`.
    pub kernel_pair_us: f64,
    /// A call of two streams that hear from each other once through host memory, in graph
    /// replay, without and with a fence after each flag (per call of the two, us); or why
    /// it failed.
    pub handshakes: Result<Vec<crate::launch_cost::Handshake>>,
    /// The same call launched eagerly by two threads, framed by events and back to back; or
    /// why it failed.
    pub eager_handshake: Result<crate::launch_cost::EagerHandshake>,
}

/// The loads of [`Burst`] (`probe_ld4_as` in `host_probe.cu`).
pub const LOAD_KINDS: [&str; 5] = ["volatile", "relaxed.sys", "weak .cv", "weak", "acquire.sys"];
const LOAD_VOLATILE: i32 = 0;
const LOAD_CV: i32 = 2;
/// Loads one thread issues together in a burst.
pub const BURST_LOADS: [u64; 4] = [1, 2, 4, 8];

/// One thread's `loads` independent 16-byte loads of host memory of kind `kind` (an index
/// of [`LOAD_KINDS`]), all issued before any is used: do they complete together, or one
/// after another?
#[derive(Debug, Clone, Copy)]
pub struct Burst {
    /// Index into [`LOAD_KINDS`].
    pub kind: usize,
    /// Loads in the burst.
    pub loads: u64,
    /// Median ns from the first issue until all are in.
    pub ns: f64,
}

/// One load of host memory timed right after one block of 512 threads stored `bytes`.
#[derive(Debug, Clone, Copy)]
pub struct LoadAfterWrites {
    /// Bytes stored before the load.
    pub bytes: usize,
    /// The stores went to host memory (else to device memory).
    pub into_host: bool,
    /// A system fence between the stores and the load.
    pub fence: bool,
    /// Median time of the load, ns.
    pub load_ns: f64,
    /// Median time from the first store to the load, ns (the stores' issue, and the fence).
    pub issue_ns: f64,
}

/// One ping-pong: where, in which memory, fenced or not, and what half a round took.
#[derive(Debug)]
pub struct PingPong {
    /// True between two GPUs, false between two streams of one GPU.
    pub two_gpus: bool,
    /// Where the flags live.
    pub memory: HostMemory,
    /// A system fence after each write.
    pub fence: bool,
    /// Pages the flags rotate through, a new one each round (1: always the same).
    pub pages: usize,
    /// Half a round, ns; or why it failed (a side that never saw the other's write).
    pub one_way_ns: Result<f64>,
}

/// A ping-pong (shared-file host memory, one page) whose waits keep `polls` loads
/// of the flag in flight, issued `gap_cycles` SM clocks apart and each issued again as soon
/// as it returns (`probe_wait_staggered`): a write lands between two polls' arrivals rather
/// than up to a round trip before the next one.
#[derive(Debug)]
pub struct Staggered {
    /// Loads in flight at once.
    pub polls: u64,
    /// Poll i reads a copy of the flag of its own (a line each, all written by the sender),
    /// not the one word every poll reads.
    pub spread: bool,
    /// SM clocks between two polls' issues.
    pub gap_cycles: u64,
    /// How the flag is written.
    pub store: FlagStore,
    /// Half a round, ns (median of 5 runs); or why it failed.
    pub one_way_ns: Result<f64>,
}

/// Runs every probe on GPU `ordinal` (and the ping-pong with the next GPU, if any):
/// `sizes` bytes x `grids` blocks, `reps` times each.
pub fn measure(ordinal: usize, sizes: &[usize], grids: &[u32], reps: usize) -> Result<Report> {
    let gpus = device_count()?;
    let gpu = Gpu::new(ordinal % gpus)?;
    let ctx = gpu.ctx().clone();
    // Start and end of every block of the largest launch (4 x 512 blocks).
    let times = Pinned::new(&ctx, 8 * 2 * 2048)?;
    // Chase through host memory, then through device memory.
    let host_chain = Pinned::new(&ctx, CHAIN_LINKS * CHAIN_STRIDE_WORDS * 8)?;
    let links = chain_links();
    for &(at, next) in &links {
        // SAFETY: in bounds of the allocation (CHAIN_LINKS * CHAIN_STRIDE_WORDS words).
        unsafe { host_chain.host.add(at).write(next) };
    }
    // The chain starts at word 0, which links[0] names.
    let host_load_ns = chase(&gpu, host_chain.device(&ctx)?, &times)?;
    let mut words = vec![0u64; CHAIN_LINKS * CHAIN_STRIDE_WORDS];
    for &(at, next) in &links {
        words[at] = next;
    }
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    let mut device_chain = gpu.memory.alloc(comm_core::DType::U8, bytes.len())?;
    device_chain.write(&bytes)?;
    let device_load_ns = chase(&gpu, device_chain.buffer().device_ptr(), &times)?;

    let walk = Pinned::new(&ctx, WALK_BYTES)?;
    let walk_dev = walk.device(&ctx)?;
    let sink = gpu.memory.alloc(comm_core::DType::U8, 16)?;
    let (times_dev, sink_dev) = (times.device(&ctx)?, sink.buffer().device_ptr());
    let mut cursor = 0usize;
    let mut moves = Vec::new();
    for &bytes in sizes {
        if bytes > WALK_BYTES / 4 || bytes % 16 != 0 {
            return Err(Error::InvalidArgument(format!(
                "host-probe: {bytes} B: sizes must be multiples of 16 up to {} B",
                WALK_BYTES / 4
            )));
        }
        for &blocks in grids {
            let blocks = blocks.clamp(1, 512);
            let mut spans = [Vec::new(), Vec::new(), Vec::new()];
            let mut pair_spans = [Vec::new(), Vec::new(), Vec::new()];
            let mut both_ways_spans: [Vec<f64>; BOTH_WAYS_SPLITS] = Default::default();
            for _ in 0..reps {
                // read (volatile), write, read (.cv)
                for (kind, span) in spans.iter_mut().enumerate() {
                    let (write, mut flavor) =
                        (kind == 1, if kind == 2 { LOAD_CV } else { LOAD_VOLATILE });
                    let mut buf = fresh_part(&mut cursor, walk_dev, bytes);
                    let mut nvec = (bytes / 16) as u64;
                    let mut write = i32::from(write);
                    let (mut out, mut sink_ptr) = (times_dev, sink_dev);
                    let mut params =
                        comm_core::kernel_params![buf, nvec, write, out, sink_ptr, flavor];
                    // SAFETY: (uint4* buf, u64 nvec, int write, u64* times, uint4* sink, int
                    // flavor): buf holds nvec vectors of the walk, times 2 * blocks words, sink one.
                    unsafe { gpu.launch(&gpu.moves, blocks, THREADS, &mut params)? };
                    gpu.memory.synchronize()?;
                    span.push(grid_span(&times, blocks as usize));
                }
                // both read, both write, one writes while the other reads
                for (kind, span) in pair_spans.iter_mut().enumerate() {
                    let (write_a, write_b) = [(false, false), (true, true), (true, false)][kind];
                    let two = TwoMoves {
                        buf_a: fresh_part(&mut cursor, walk_dev, bytes),
                        buf_b: fresh_part(&mut cursor, walk_dev, bytes),
                        bytes,
                        write_a,
                        write_b,
                        first_blocks: blocks,
                        blocks: 2 * blocks,
                    };
                    span.push(two.span(&gpu, &times, times_dev, sink_dev)?);
                }
                // both ranks' writes while both ranks' reads
                for (split, span) in both_ways_spans.iter_mut().enumerate() {
                    let two = TwoMoves {
                        buf_a: fresh_part(&mut cursor, walk_dev, 2 * bytes),
                        buf_b: fresh_part(&mut cursor, walk_dev, 2 * bytes),
                        bytes: 2 * bytes,
                        write_a: true,
                        write_b: false,
                        first_blocks: both_ways_writers(blocks, split),
                        blocks: 4 * blocks,
                    };
                    span.push(two.span(&gpu, &times, times_dev, sink_dev)?);
                }
            }
            let [read, write, read_cv] = spans.map(median);
            let [pair_read, pair_write, duplex] = pair_spans.map(median);
            let (both_ways_split, both_ways) = both_ways_spans
                .map(median)
                .into_iter()
                .enumerate()
                .min_by(|a, b| a.1.total_cmp(&b.1))
                .unwrap_or((0, f64::NAN));
            moves.push(Move {
                bytes,
                blocks,
                read_us: read,
                read_cv_us: read_cv,
                write_us: write,
                pair_read_us: pair_read,
                pair_write_us: pair_write,
                duplex_us: duplex,
                both_ways_us: both_ways,
                both_ways_writers: both_ways_writers(blocks, both_ways_split),
            });
        }
    }
    let after_writes = loads_after_writes(&gpu, &walk, reps)?;
    let bursts = bursts(&gpu, &walk, &mut cursor, reps)?;
    // With one GPU the other side is a second stream of it (another DeviceMemory).
    let two_gpus = gpus > 1;
    let other = Gpu::new((ordinal + usize::from(two_gpus)) % gpus)?;
    let mut pingpongs = Vec::new();
    for memory in [
        HostMemory::Allocated,
        HostMemory::Registered,
        HostMemory::Vmm,
    ] {
        for fence in [true, false] {
            for pages in [1, ROTATING_PAGES] {
                let one_way_ns = pingpong(&gpu, &other, 10_000, memory, fence, pages, None);
                pingpongs.push(PingPong {
                    two_gpus,
                    memory,
                    fence,
                    pages,
                    one_way_ns,
                });
            }
        }
    }
    // Polls spaced so that `polls` of them cover one load's round trip.
    let clock_khz = ctx
        .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CLOCK_RATE)
        .map_err(driver_error)? as f64;
    let round_trip_cycles = host_load_ns * clock_khz / 1e6;
    let mut staggered = Vec::new();
    for (store, polls, spread) in [
        (FlagStore::Volatile, 1, false),
        (FlagStore::Volatile, 2, false),
        (FlagStore::Volatile, 2, true),
        (FlagStore::Volatile, 4, true),
        (FlagStore::Fenced, 1, false),
        (FlagStore::Fenced, 2, true),
        (FlagStore::WriteThrough, 1, false),
    ] {
        let poll = Poll {
            polls,
            spread,
            gap_cycles: (round_trip_cycles / polls as f64).round() as u64,
            store,
        };
        let runs: Result<Vec<f64>> = (0..5)
            .map(|_| {
                pingpong(
                    &gpu,
                    &other,
                    2_000,
                    HostMemory::Registered,
                    false,
                    1,
                    Some(&poll),
                )
            })
            .collect();
        staggered.push(Staggered {
            polls,
            spread,
            gap_cycles: poll.gap_cycles,
            store,
            one_way_ns: runs.map(median),
        });
    }
    let (kernel_us, kernel_pair_us) = empty_kernels(ordinal)?;
    let flags = Pinned::registered(gpu.ctx(), PAGE)?;
    let (handshakes, eager_handshake) = handshakes(&gpu, &flags);
    Ok(Report {
        host_load_ns,
        device_load_ns,
        moves,
        pingpongs,
        staggered,
        after_writes,
        bursts,
        kernel_us,
        kernel_pair_us,
        handshakes,
        eager_handshake,
    })
}

/// [`crate::launch_cost::handshakes`] and [`crate::launch_cost::eager_handshakes`] with
/// flags in `flags`, a shared-memory file registered with the driver as comm-symm's host
/// backing maps its heap: a line each, the two ranks' half a page apart.
fn handshakes(
    gpu: &Gpu,
    flags: &Pinned,
) -> (
    Result<Vec<crate::launch_cost::Handshake>>,
    Result<crate::launch_cost::EagerHandshake>,
) {
    let at = match flags.device(gpu.ctx()) {
        Ok(at) => at,
        Err(e) => {
            let eager = Err(Error::Aborted(format!("the handshake's flags: {e}")));
            return (Err(e), eager);
        }
    };
    let ordinal = gpu.ctx().ordinal();
    let (grid, half) = ((1, THREADS), PAGE as u64 / 2);
    // Graphs use the first two lines of each half (without and with a fence), eager calls
    // the third.
    let graphs = crate::launch_cost::handshakes(ordinal, [at, at + half], 200, grid);
    let eager =
        crate::launch_cost::eager_handshakes(ordinal, [at + 128, at + half + 128], 200, grid);
    (graphs, eager)
}

/// What an all-reduce's kernel costs by itself in graph replay: an empty kernel of one
/// block, launched with programmatic serialization as the peer kernels are, on one stream
/// and on two streams replaying at once (us per kernel of a stream; 0 where not measured,
/// as [`Floors`] reads it).
fn empty_kernels(ordinal: usize) -> Result<(f64, f64)> {
    let runs = crate::launch_cost::concurrent(ordinal, &[1, 2], 200, &[(1, 512)])?;
    let of = |streams: usize| {
        runs.iter()
            .find(|r| r.overlapping && r.streams == streams)
            .map_or(0.0, |r| r.per_round_us)
    };
    Ok((of(1), of(2)))
}

/// Two moves in one launch of `host_probe_move_pair`: the first `first_blocks` of `blocks`
/// blocks move `buf_a`, the others `buf_b`, `bytes` each (reads, or writes where asked).
struct TwoMoves {
    buf_a: u64,
    buf_b: u64,
    bytes: usize,
    write_a: bool,
    write_b: bool,
    first_blocks: u32,
    blocks: u32,
}

impl TwoMoves {
    /// The launch's span (us) from the first block's start to the last block's end.
    fn span(&self, gpu: &Gpu, times: &Pinned, times_dev: u64, sink_dev: u64) -> Result<f64> {
        let (mut buf_a, mut buf_b) = (self.buf_a, self.buf_b);
        let (mut nvec, mut flavor) = ((self.bytes / 16) as u64, LOAD_VOLATILE);
        let (mut write_a, mut write_b) = (i32::from(self.write_a), i32::from(self.write_b));
        let (mut out, mut sink_ptr, mut first_blocks) = (times_dev, sink_dev, self.first_blocks);
        let mut params = comm_core::kernel_params![
            buf_a,
            buf_b,
            nvec,
            write_a,
            write_b,
            out,
            sink_ptr,
            flavor,
            first_blocks
        ];
        // SAFETY: (uint4* buf_a, uint4* buf_b, u64 nvec, int write_a, int write_b, u64*
        // times, uint4* sink, int flavor, unsigned first_blocks): each buffer holds nvec
        // vectors of the walk (fresh_part), times 2 words for each of up to 2048 blocks
        // (4 x 512), sink one.
        unsafe { gpu.launch(&gpu.move_pair, self.blocks, THREADS, &mut params)? };
        gpu.memory.synchronize()?;
        Ok(grid_span(times, self.blocks as usize))
    }
}

/// Splits of the both-ways probe: a quarter, half or three quarters of the grid write.
const BOTH_WAYS_SPLITS: usize = 3;

/// The writing blocks of split `split` of the both-ways probe's `4 * blocks`.
fn both_ways_writers(blocks: u32, split: usize) -> u32 {
    blocks * (split as u32 + 1)
}

/// The device address of the next `bytes` of the walk (from `cursor`, on a page of their
/// own, wrapping at its end), so that no probe finds its lines cached.
fn fresh_part(cursor: &mut usize, walk_dev: u64, bytes: usize) -> u64 {
    if *cursor + bytes > WALK_BYTES {
        *cursor = 0;
    }
    let at = walk_dev + *cursor as u64;
    *cursor += bytes.next_multiple_of(4096);
    at
}

/// The span (us) from the first block's start to the last block's end, as `blocks` blocks
/// recorded them in `times` (start, end per block, ns).
fn grid_span(times: &Pinned, blocks: usize) -> f64 {
    let first = (0..blocks).map(|b| times.word(2 * b)).min();
    let last = (0..blocks).map(|b| times.word(2 * b + 1)).max();
    last.unwrap_or(0).saturating_sub(first.unwrap_or(0)) as f64 / 1e3
}

/// Every [`Burst`] of every load kind, `reps` times each, on fresh pages of `walk` (from
/// `cursor` on), so that no load finds its line cached.
fn bursts(gpu: &Gpu, walk: &Pinned, cursor: &mut usize, reps: usize) -> Result<Vec<Burst>> {
    let ctx = gpu.ctx();
    let times = Pinned::new(ctx, 64)?;
    let sink = gpu.memory.alloc(comm_core::DType::U8, 16)?;
    let walk_dev = walk.device(ctx)?;
    let pitch_bytes = 4096 + 256;
    let mut out = Vec::new();
    for kind in 0..LOAD_KINDS.len() {
        for loads in BURST_LOADS {
            let mut spans = Vec::new();
            for _ in 0..reps {
                let mut buf = fresh_part(cursor, walk_dev, loads as usize * pitch_bytes);
                let (mut k, mut pitch, mut flavor) =
                    (loads, (pitch_bytes / 16) as u64, kind as i32);
                let (mut t, mut s) = (times.device(ctx)?, sink.buffer().device_ptr());
                let mut params = comm_core::kernel_params![buf, k, pitch, flavor, t, s];
                // SAFETY: (const uint4* buf, u64 k, u64 pitch, int flavor, u64* times, uint4*
                // sink): buf holds k vectors `pitch` apart, times one word, sink one vector.
                unsafe { gpu.launch(&gpu.burst, 1, 32, &mut params)? };
                gpu.memory.synchronize()?;
                spans.push(times.word(0) as f64);
            }
            out.push(Burst {
                kind,
                loads,
                ns: median(spans),
            });
        }
    }
    Ok(out)
}

/// One host load after each of `AFTER_WRITES` bytes of stores into host memory (the start
/// of `walk`) and into device memory, with and without a fence, `reps` times each.
fn loads_after_writes(gpu: &Gpu, walk: &Pinned, reps: usize) -> Result<Vec<LoadAfterWrites>> {
    let ctx = gpu.ctx();
    let most = AFTER_WRITES.iter().copied().max().unwrap_or(0);
    let device = gpu.memory.alloc(comm_core::DType::U8, most.max(16))?;
    // The loaded word is alone on its page, away from every store.
    let probe = Pinned::new(ctx, 4096)?;
    let times = Pinned::new(ctx, 64)?;
    let (probe_dev, times_dev) = (probe.device(ctx)?, times.device(ctx)?);
    let mut out = Vec::new();
    for into_host in [true, false] {
        let target = if into_host {
            walk.device(ctx)?
        } else {
            device.buffer().device_ptr()
        };
        for fence in [false, true] {
            for bytes in AFTER_WRITES {
                let (mut loads, mut issues) = (Vec::new(), Vec::new());
                for _ in 0..reps {
                    let (mut wbuf, mut nvec, mut fenced) =
                        (target, (bytes / 16) as u64, i32::from(fence));
                    let (mut word, mut t) = (probe_dev, times_dev);
                    let mut params = comm_core::kernel_params![wbuf, nvec, fenced, word, t];
                    // SAFETY: (uint4* wbuf, u64 nvec, int fence, const u64* probe, u64* times):
                    // wbuf holds nvec vectors (the walk, or `device`), probe one word, times three.
                    unsafe { gpu.launch(&gpu.load_after_writes, 1, THREADS, &mut params)? };
                    gpu.memory.synchronize()?;
                    loads.push(times.word(0) as f64);
                    issues.push(times.word(1) as f64);
                }
                out.push(LoadAfterWrites {
                    bytes,
                    into_host,
                    fence,
                    load_ns: median(loads),
                    issue_ns: median(issues),
                });
            }
        }
    }
    Ok(out)
}

/// How a staggered ping-pong's flag is stored (`probe_st_as`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlagStore {
    /// `st.volatile`, as the all-reduce kernels push.
    Volatile,
    /// `st.volatile` and a system fence.
    Fenced,
    /// `st.global.wt`: written through L2 to system memory.
    WriteThrough,
}

impl FlagStore {
    /// `probe_st_as`'s flavor.
    fn flavor(self) -> i32 {
        match self {
            FlagStore::Volatile => 0,
            FlagStore::Fenced => 1,
            FlagStore::WriteThrough => 2,
        }
    }

    /// As the tables print it.
    pub fn name(self) -> &'static str {
        match self {
            FlagStore::Volatile => "volatile",
            FlagStore::Fenced => "volatile + fence",
            FlagStore::WriteThrough => "write-through",
        }
    }
}

/// How a staggered ping-pong polls and writes (see [`Staggered`]).
struct Poll {
    polls: u64,
    spread: bool,
    gap_cycles: u64,
    store: FlagStore,
}

/// Half a round (ns) of a flag bounced `rounds` times between `a` and `b` (which may be
/// two streams of one GPU: both kernels run at once) through `memory`, round r on page
/// r % `pages`; with `poll`, by the staggered kernel (one page; `fence` gives way to how
/// `poll` stores the flag).
fn pingpong(
    a: &Gpu,
    b: &Gpu,
    rounds: u64,
    memory: HostMemory,
    fence: bool,
    pages: usize,
    poll: Option<&Poll>,
) -> Result<f64> {
    // Two flags a cache line apart on each page, and each side's two result words.
    let flags = Flags::new(memory, a, b, pages * PAGE)?;
    let times = [Pinned::new(a.ctx(), 16)?, Pinned::new(a.ctx(), 16)?];
    let limit_ns: u64 = 2_000_000_000;
    for (side, gpu) in [a, b].into_iter().enumerate() {
        let base = flags.device(gpu.ctx())?;
        // A staggered side's copies of its flag take 8 lines.
        let apart = if poll.is_some() { 8 * 128 } else { 128 };
        let (mut out, mut inp) = if side == 0 {
            (base, base + apart)
        } else {
            (base + apart, base)
        };
        let (mut rounds, mut first, mut limit) = (rounds, i32::from(side == 0), limit_ns);
        let mut fence = i32::from(fence);
        let (mut pages, mut page_words) = (pages as u64, (PAGE / 8) as u64);
        let mut t = times[side].device(gpu.ctx())?;
        if let Some(poll) = poll {
            let (mut k, mut gap) = (poll.polls, poll.gap_cycles);
            let (mut spread, mut store) = (i32::from(poll.spread), poll.store.flavor());
            let mut params =
                comm_core::kernel_params![out, inp, rounds, first, limit, k, spread, gap, store, t];
            // SAFETY: (u64* out, const u64* in, u64 rounds, int first, u64 limit_ns, u64 k,
            // int spread, u64 gap, int store, u64* times): both flags' copies (at most 8 lines each,
            // within the first page) and both result words are mapped host memory.
            unsafe { gpu.launch(&gpu.pingpong_staggered, 1, 32, &mut params)? };
            continue;
        }
        let mut params =
            comm_core::kernel_params![out, inp, rounds, first, limit, fence, pages, page_words, t];
        // SAFETY: (u64* out, const u64* in, u64 rounds, int first, u64 limit_ns, int fence,
        // u64 pages, u64 page_words, u64* times): both flags of every page and both result
        // words are mapped host memory.
        unsafe { gpu.launch(&gpu.pingpong, 1, 32, &mut params)? };
    }
    a.memory.synchronize()?;
    b.memory.synchronize()?;
    if let Some(side) = times.iter().position(|t| t.word(1) != 0) {
        return Err(Error::Timeout {
            what: format!(
                "host-probe: the ping-pong's side {side}, in round {}",
                times[side].word(1)
            ),
            after: std::time::Duration::from_nanos(limit_ns),
        });
    }
    Ok(times[0].word(0) as f64 / rounds as f64 / 2.0)
}

/// The flags of one ping-pong, in the memory under test.
enum Flags {
    Pinned(Pinned),
    Vmm(VmmMapping),
}

impl Flags {
    /// `bytes` of `memory`, reachable from the devices of `a` and `b`.
    fn new(memory: HostMemory, a: &Gpu, b: &Gpu, bytes: usize) -> Result<Self> {
        Ok(match memory {
            HostMemory::Allocated => Flags::Pinned(Pinned::new(a.ctx(), bytes)?),
            HostMemory::Registered => Flags::Pinned(Pinned::registered(a.ctx(), bytes)?),
            HostMemory::Vmm => {
                let mut devices = vec![a.ctx()];
                if b.ctx().ordinal() != a.ctx().ordinal() {
                    devices.push(b.ctx());
                }
                Flags::Vmm(VmmMapping::create_in_host(&devices, bytes)?)
            }
        })
    }

    /// The flags' address in `ctx`'s device.
    fn device(&self, ctx: &Arc<CudaContext>) -> Result<u64> {
        match self {
            Flags::Pinned(p) => p.device(ctx),
            Flags::Vmm(v) => Ok(v.ptr()),
        }
    }
}

/// The floors under an all-reduce through host memory, from one run of the probes: what
/// `host-probe --json` writes and `host-floor` reads.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Floors {
    /// One dependent load of host memory, ns.
    pub host_load_ns: f64,
    /// A flag's trip through host memory: the least half round of the ping-pongs, ns.
    pub flag_ns: f64,
    /// A system fence with nothing to drain (its issue after no stores), ns.
    pub fence_ns: f64,
    /// By message size, ascending: the fastest read and fenced write over the grids.
    pub moves: Vec<FloorMove>,
    /// An empty kernel in graph replay on one stream, us (0: not measured).
    #[serde(default)]
    pub kernel_us: f64,
    /// The same with two streams replaying at once, per kernel of each, us (0: not measured).
    #[serde(default)]
    pub kernel_pair_us: f64,
    /// A call of two streams that hear from each other once through host memory (graphs,
    /// the faster of without and with a fence), us (0: not measured).
    #[serde(default)]
    pub handshake_us: f64,
    /// That call launched eagerly by two threads, each framed by events (the median), us (0:
    /// not measured).
    #[serde(default)]
    pub handshake_framed_us: f64,
    /// The same, calls enqueued back to back, per call, us (0: not measured).
    #[serde(default)]
    pub handshake_back_to_back_us: f64,
}

/// The fastest read and write of one message size (us).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct FloorMove {
    /// Message bytes.
    pub bytes: usize,
    /// Fastest read over the grids, us.
    pub read_us: f64,
    /// Fastest write (ended by a system fence) over the grids, us.
    pub write_us: f64,
    /// Fastest read by two grids at once, a message each (both ranks of one GPU), us; 0
    /// where not measured.
    #[serde(default)]
    pub pair_read_us: f64,
    /// Fastest fenced write by two grids at once, a message each, us; 0 where not measured.
    #[serde(default)]
    pub pair_write_us: f64,
    /// Fastest write of two messages while two are read (both ranks of one GPU, reading
    /// while they write), us; 0 where not measured.
    #[serde(default)]
    pub both_ways_us: f64,
}

/// The floor of one all-reduce of a size, in the pieces it adds up from (us).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FloorTerms {
    /// Writing the message into host memory, fenced (0 where the data is its own flag).
    pub write_us: f64,
    /// The flag's trip.
    pub flag_us: f64,
    /// Reading the peers' message back (beyond the first load, where the flag trip holds it).
    pub read_us: f64,
}

impl FloorTerms {
    /// The floor: the pieces one after another.
    pub fn total(&self) -> f64 {
        self.write_us + self.flag_us + self.read_us
    }

    /// The least any protocol that overlaps the writes with the reads (streaming chunks,
    /// the link carrying both directions at once) could take: the flag's trip and the
    /// longer of the two.
    pub fn overlapped(&self) -> f64 {
        self.flag_us + self.write_us.max(self.read_us)
    }
}

impl Floors {
    /// The floors of `report`; an error where no ping-pong succeeded or no size was moved.
    pub fn from_report(report: &Report) -> Result<Self> {
        let flag_ns = report
            .pingpongs
            .iter()
            .filter_map(|p| p.one_way_ns.as_ref().ok().copied())
            .min_by(f64::total_cmp)
            .ok_or_else(|| Error::InvalidArgument("host-probe: no ping-pong succeeded".into()))?;
        let fence_ns = report
            .after_writes
            .iter()
            .find(|w| w.into_host && w.fence && w.bytes == 0)
            .map_or(0.0, |w| w.issue_ns);
        let mut sizes: Vec<usize> = report.moves.iter().map(|m| m.bytes).collect();
        sizes.sort_unstable();
        sizes.dedup();
        if sizes.is_empty() {
            return Err(Error::InvalidArgument(
                "host-probe: no size was moved".into(),
            ));
        }
        let best = |bytes: usize, f: fn(&Move) -> f64| {
            report
                .moves
                .iter()
                .filter(|m| m.bytes == bytes)
                .map(f)
                .min_by(f64::total_cmp)
                .unwrap_or(f64::NAN)
        };
        let moves = sizes
            .into_iter()
            .map(|bytes| FloorMove {
                bytes,
                read_us: best(bytes, |m| m.read_us.min(m.read_cv_us)),
                write_us: best(bytes, |m| m.write_us),
                pair_read_us: best(bytes, |m| m.pair_read_us),
                pair_write_us: best(bytes, |m| m.pair_write_us),
                both_ways_us: best(bytes, |m| m.both_ways_us),
            })
            .collect();
        Ok(Floors {
            host_load_ns: report.host_load_ns,
            flag_ns,
            fence_ns,
            moves,
            kernel_us: report.kernel_us,
            kernel_pair_us: report.kernel_pair_us,
            handshake_us: report.handshakes.as_ref().map_or(0.0, |h| {
                h.iter()
                    .map(|h| h.per_call_us)
                    .min_by(f64::total_cmp)
                    .unwrap_or(0.0)
            }),
            handshake_framed_us: report.eager_handshake.as_ref().map_or(0.0, |e| e.framed_us),
            handshake_back_to_back_us: report
                .eager_handshake
                .as_ref()
                .map_or(0.0, |e| e.back_to_back_us),
        })
    }

    /// The floor of a one-shot all-reduce of `bytes` per rank through host memory, as the
    /// kernels move it: below `flagged_from` bytes the data is its own flag (Lamport: the
    /// flag's trip, then whatever of the read one load does not cover); from there the
    /// data, a fence, a flag, then the read. Reads and writes of sizes between the probed
    /// ones are interpolated linearly (from one load and one fence at 0 bytes), beyond the
    /// largest extended along its last segment. The reads and writes are one grid's alone:
    /// the floor of ranks on GPUs of their own.
    pub fn one_shot(&self, bytes: usize, flagged_from: usize) -> FloorTerms {
        self.terms(bytes, flagged_from, |m| (m.read_us, m.write_us))
    }

    /// [`one_shot`](Self::one_shot) with the reads and writes of two grids at once: the
    /// floor of two ranks on one GPU, whose bytes share its one link. `None` where the probe
    /// did not measure pairs.
    pub fn one_shot_shared(&self, bytes: usize, flagged_from: usize) -> Option<FloorTerms> {
        self.pairs_probed()
            .then(|| self.terms(bytes, flagged_from, |m| (m.pair_read_us, m.pair_write_us)))
    }

    /// The least any protocol could take with both ranks of one GPU reading while they
    /// write: a flag's trip and the link carrying both ranks' writes and reads at once, as
    /// measured (where [`FloorTerms::overlapped`] assumes the two directions do not slow
    /// each other). `None` where the probe did not measure it, and below `flagged_from`
    /// bytes, where the data is its own flag: the probe's writes end with a fence that
    /// those messages do not pay, so it would be no floor of theirs.
    pub fn both_ways(&self, bytes: usize, flagged_from: usize) -> Option<f64> {
        (self.both_ways_probed() && bytes >= flagged_from).then(|| {
            let moved = interpolate(
                bytes,
                self.host_load_ns / 1e3,
                self.moves.iter().map(|m| (m.bytes, m.both_ways_us)),
            );
            self.flag_ns / 1e3 + moved
        })
    }

    /// Whether the probe moved both ranks' traffic at once at every size.
    pub fn both_ways_probed(&self) -> bool {
        !self.moves.is_empty() && self.moves.iter().all(|m| m.both_ways_us > 0.0)
    }

    /// Whether the probe moved two messages at once at every size.
    pub fn pairs_probed(&self) -> bool {
        !self.moves.is_empty()
            && self
                .moves
                .iter()
                .all(|m| m.pair_read_us > 0.0 && m.pair_write_us > 0.0)
    }

    fn terms(
        &self,
        bytes: usize,
        flagged_from: usize,
        read_write: impl Fn(&FloorMove) -> (f64, f64),
    ) -> FloorTerms {
        let load_us = self.host_load_ns / 1e3;
        let read = interpolate(
            bytes,
            load_us,
            self.moves.iter().map(|m| (m.bytes, read_write(m).0)),
        );
        let flag_us = self.flag_ns / 1e3;
        if bytes < flagged_from {
            return FloorTerms {
                write_us: 0.0,
                flag_us,
                read_us: (read - load_us).max(0.0),
            };
        }
        let write = interpolate(
            bytes,
            self.fence_ns / 1e3,
            self.moves.iter().map(|m| (m.bytes, read_write(m).1)),
        );
        FloorTerms {
            write_us: write,
            flag_us,
            read_us: read,
        }
    }
}

/// The value at `x` of the piecewise-linear curve through (0, `at_zero`) and `points`
/// (ascending), extended beyond the last point along the last segment.
fn interpolate(x: usize, at_zero: f64, points: impl Iterator<Item = (usize, f64)>) -> f64 {
    let mut prev = (0usize, at_zero);
    let mut last_slope = 0.0;
    for (px, py) in points {
        if px == prev.0 {
            prev = (px, py);
            continue;
        }
        let slope = (py - prev.1) / (px - prev.0) as f64;
        if x <= px {
            return prev.1 + slope * (x - prev.0) as f64;
        }
        last_slope = slope;
        prev = (px, py);
    }
    prev.1 + last_slope * (x - prev.0) as f64
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn floors() -> Floors {
        Floors {
            host_load_ns: 1000.0,
            flag_ns: 2000.0,
            fence_ns: 1000.0,
            moves: vec![
                FloorMove {
                    bytes: 40_000,
                    read_us: 3.0,
                    write_us: 2.0,
                    pair_read_us: 4.0,
                    pair_write_us: 3.0,
                    both_ways_us: 5.0,
                },
                FloorMove {
                    bytes: 1_000_000,
                    read_us: 21.0,
                    write_us: 20.0,
                    pair_read_us: 41.0,
                    pair_write_us: 39.0,
                    both_ways_us: 61.0,
                },
            ],
            kernel_us: 0.0,
            kernel_pair_us: 0.0,
            handshake_us: 0.0,
            handshake_framed_us: 0.0,
            handshake_back_to_back_us: 0.0,
        }
    }

    #[test]
    fn reads_and_writes_between_probed_sizes_are_interpolated() {
        let f = floors();
        // At a probed size: write + flag + read.
        let at = f.one_shot(40_000, 16_384);
        assert_eq!((at.write_us, at.flag_us, at.read_us), (2.0, 2.0, 3.0));
        assert_eq!(at.total(), 7.0);
        // Half way between 0 and the first size: from one fence and one load.
        let half = f.one_shot(20_000, 16_384);
        assert!((half.write_us - 1.5).abs() < 1e-9 && (half.read_us - 2.0).abs() < 1e-9);
        // Beyond the largest, along the last segment.
        let beyond = f.one_shot(1_960_000, 16_384);
        assert!((beyond.read_us - 39.0).abs() < 1e-9, "{beyond:?}");
        assert!((beyond.write_us - 38.0).abs() < 1e-9, "{beyond:?}");
    }

    #[test]
    fn the_shared_floor_takes_the_pairs_and_needs_them() {
        let mut f = floors();
        let shared = f.one_shot_shared(40_000, 16_384).unwrap();
        let near = |x: f64, y: f64| (x - y).abs() < 1e-9;
        assert!(
            near(shared.write_us, 3.0) && near(shared.flag_us, 2.0) && near(shared.read_us, 4.0),
            "{shared:?}"
        );
        let half = f.one_shot_shared(520_000, 16_384).unwrap();
        assert!((half.read_us - 22.5).abs() < 1e-9, "{half:?}");
        assert!((shared.overlapped() - 6.0).abs() < 1e-9, "{shared:?}");
        f.moves[1].pair_read_us = 0.0;
        assert_eq!(f.one_shot_shared(40_000, 16_384), None);
    }

    #[test]
    fn both_ways_is_the_flag_and_the_measured_traffic() {
        let mut f = floors();
        let near = |x: Option<f64>, y: f64| x.is_some_and(|x| (x - y).abs() < 1e-9);
        let both_ways = |f: &Floors, bytes| f.both_ways(bytes, 16_384);
        assert!(
            near(both_ways(&f, 40_000), 7.0),
            "{:?}",
            both_ways(&f, 40_000)
        );
        // Half way between the probed sizes: 5 + (61 - 5) / 2, plus the flag.
        assert!(
            near(both_ways(&f, 520_000), 35.0),
            "{:?}",
            both_ways(&f, 520_000)
        );
        // Not below the overlapped bound, which assumes the directions do not interfere.
        let shared = f.one_shot_shared(1_000_000, 16_384).unwrap();
        assert!(both_ways(&f, 1_000_000).unwrap() >= shared.overlapped());
        // Below the flagged size the data is its own flag, and no fenced write bounds it.
        assert_eq!(both_ways(&f, 8_192), None);
        f.moves[0].both_ways_us = 0.0;
        assert_eq!(both_ways(&f, 40_000), None);
    }

    #[test]
    fn small_messages_are_their_own_flag() {
        let f = floors();
        let tiny = f.one_shot(8, 16_384);
        assert_eq!(tiny.write_us, 0.0);
        assert_eq!(tiny.flag_us, 2.0);
        assert!(tiny.read_us < 1e-3, "{tiny:?}");
        assert!(f.one_shot(16_384, 16_384).write_us > 0.0);
    }

    #[test]
    fn floors_take_the_best_grid_and_the_fastest_flag() {
        let pingpong = |ns: Result<f64>| PingPong {
            two_gpus: false,
            memory: HostMemory::Allocated,
            fence: true,
            pages: 1,
            one_way_ns: ns,
        };
        let report = Report {
            host_load_ns: 1100.0,
            device_load_ns: 190.0,
            moves: vec![
                Move {
                    bytes: 43008,
                    blocks: 2,
                    read_us: 5.0,
                    read_cv_us: 4.9,
                    write_us: 1.9,
                    pair_read_us: 6.0,
                    pair_write_us: 2.9,
                    duplex_us: 5.0,
                    both_ways_us: 6.5,
                    both_ways_writers: 4,
                },
                Move {
                    bytes: 43008,
                    blocks: 16,
                    read_us: 2.6,
                    read_cv_us: 2.7,
                    write_us: 2.0,
                    pair_read_us: 3.5,
                    pair_write_us: 3.1,
                    duplex_us: 3.3,
                    both_ways_us: 5.5,
                    both_ways_writers: 16,
                },
            ],
            pingpongs: vec![
                pingpong(Ok(2100.0)),
                pingpong(Err(Error::InvalidArgument("lost".into()))),
                pingpong(Ok(1800.0)),
            ],
            staggered: Vec::new(),
            after_writes: vec![LoadAfterWrites {
                bytes: 0,
                into_host: true,
                fence: true,
                load_ns: 1150.0,
                issue_ns: 990.0,
            }],
            bursts: Vec::new(),
            kernel_us: 1.6,
            kernel_pair_us: 2.2,
            handshakes: Ok(vec![
                crate::launch_cost::Handshake {
                    fence: false,
                    per_call_us: 3.1,
                },
                crate::launch_cost::Handshake {
                    fence: true,
                    per_call_us: 2.9,
                },
            ]),
            eager_handshake: Ok(crate::launch_cost::EagerHandshake {
                framed_us: 8.0,
                back_to_back_us: 4.0,
            }),
        };
        let f = Floors::from_report(&report).unwrap();
        assert_eq!(f.flag_ns, 1800.0);
        assert_eq!((f.kernel_us, f.kernel_pair_us), (1.6, 2.2));
        assert_eq!(f.handshake_us, 2.9, "the faster handshake");
        assert_eq!(
            (f.handshake_framed_us, f.handshake_back_to_back_us),
            (8.0, 4.0)
        );
        assert_eq!(f.fence_ns, 990.0);
        assert_eq!(f.moves.len(), 1);
        assert_eq!((f.moves[0].read_us, f.moves[0].write_us), (2.6, 1.9));
        assert_eq!(
            (f.moves[0].pair_read_us, f.moves[0].pair_write_us),
            (3.5, 2.9)
        );
        assert_eq!(f.moves[0].both_ways_us, 5.5);
        let no_flag = Report {
            pingpongs: vec![pingpong(Err(Error::InvalidArgument("lost".into())))],
            staggered: Vec::new(),
            ..report
        };
        assert!(Floors::from_report(&no_flag).is_err());
    }

    #[test]
    fn the_chain_visits_every_link_once_from_word_zero() {
        let links = chain_links();
        assert_eq!(links.len(), CHAIN_LINKS - 1);
        assert_eq!(links[0].0, 0, "the chase starts at word 0");
        let mut seen = vec![false; CHAIN_LINKS];
        seen[0] = true;
        let mut at = 0usize;
        for &(from, next) in &links {
            assert_eq!(from, at, "each link starts where the one before led");
            let next = next as usize;
            assert_eq!(next % CHAIN_STRIDE_WORDS, 0);
            let link = next / CHAIN_STRIDE_WORDS;
            assert!(!seen[link], "link {link} visited twice");
            seen[link] = true;
            // Consecutive loads never share a 4 KiB page.
            assert_ne!(from * 8 / 4096, next * 8 / 4096);
            at = next;
        }
        assert!(seen.iter().all(|&s| s));
    }
}
