//! The kernels of `kernels/peer_collectives.cu` (with `peer_io.cuh`, `peer_sync.cuh` and
//! `peer_lamport.cuh` prepended): the source registration, the argument block, grid sizes, every function
//! loaded up front, and the one launch path every kernel goes through (so that launch attributes, such
//! as programmatic dependent launch, are set in one place).

use std::cell::Cell;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, OnceLock};

use comm_core::cuda::cudarc::driver::{CudaContext, CudaFunction, result, sys};
use comm_core::cuda::stream::cu_stream;
use comm_core::cuda::{KernelCache, KernelSource, driver_error, launch_overlapping};
use comm_core::{DType, Error, RawStream, ReduceOp, Result};

use crate::algorithm::Algorithm;
use crate::calls::CallWords;
use crate::layout::MAX_BLOCKS;

/// Every kernel of the layer as one NVRTC program: the headers are prepended, so no
/// include path is needed for them.
pub const COLLECTIVES: KernelSource = KernelSource {
    name: "peer_collectives.cu",
    source: concat!(
        include_str!("../kernels/peer_io.cuh"),
        include_str!("../kernels/peer_sync.cuh"),
        include_str!("../kernels/peer_lamport.cuh"),
        include_str!("../kernels/peer_collectives.cu")
    ),
};

/// Every kernel source of `comm-peer` (for the `kernels` builder).
pub const KERNELS: &[KernelSource] = &[COLLECTIVES];

/// Dtypes the kernels handle.
pub const DTYPES: [DType; 3] = [DType::F32, DType::F16, DType::BF16];
/// Ops the kernels handle.
pub const OPS: [ReduceOp; 4] = [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min];

/// The kernels' `PeerArgs`, field for field.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct PeerArgs {
    pub input: u64,
    pub output: u64,
    pub residual: u64,
    pub weight: u64,
    pub regions: u64,
    pub inputs: u64,
    pub status: u64,
    pub state: u64,
    pub trace: u64,
    pub in_off: u64,
    pub count: u64,
    pub part: u64,
    pub cap: u64,
    pub lcap: u64,
    pub slice_cap: u64,
    pub off_data: u64,
    pub off_tmp: u64,
    pub off_push: u64,
    pub off_recv: u64,
    pub off_result: u64,
    pub staged: u64,
    pub staged_pitch: u64,
    pub timeout_ns: u64,
    pub hidden: u64,
    pub eps: f32,
    pub rank: u32,
    pub world: u32,
    pub aligned: u32,
    pub gpu_scope: u32,
    pub root: u32,
    pub peer: u32,
    pub channel: u32,
    /// The call every rank must make alike ([`crate::calls`]), compared on the device.
    pub call: CallWords,
}

/// A reducing kernel, per dtype and op: an all-reduce of an algorithm, the one-shot push
/// where every rank's region is one device's memory (each rank writes its own slot and
/// reads its peers' instead of writing into every peer), or the reduce-scatter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Reducer {
    AllReduce(Algorithm),
    OneshotLocal,
    ReduceScatter,
}

impl Reducer {
    fn stem(self) -> &'static str {
        match self {
            Reducer::AllReduce(algorithm) => algorithm.kernel_stem(),
            Reducer::OneshotLocal => "oneshot_local",
            Reducer::ReduceScatter => "reduce_scatter",
        }
    }
}

/// The name of an all-reduce kernel, `peer_<algorithm>_<dtype>_<op>`; one-shot push where
/// every rank's region is one device's memory (`same_device`,
/// [`crate::PeerGroup::same_device`]) is `peer_oneshot_local_<dtype>_<op>`.
pub(crate) fn all_reduce_kernel(
    algorithm: Algorithm,
    dtype: DType,
    op: ReduceOp,
    same_device: bool,
) -> &'static str {
    let reducer = match algorithm {
        Algorithm::OneshotPush if same_device => Reducer::OneshotLocal,
        _ => Reducer::AllReduce(algorithm),
    };
    reducing_kernel(reducer, dtype, op)
}

/// The fused all-reduce + RMSNorm's kernel: its Lamport exchange (`push`) writes only this
/// rank's own slot where every rank's region is one device's memory, as the all-reduce's
/// one-shot push does ([`all_reduce_kernel`]).
pub(crate) fn fused_rmsnorm_kernel(push: bool, same_device: bool) -> &'static str {
    match (push, same_device) {
        (true, true) => "peer_fused_rmsnorm_local",
        (true, false) => "peer_fused_rmsnorm_push",
        (false, _) => "peer_fused_rmsnorm_pull",
    }
}

/// The name of a reduce-scatter kernel: `peer_reduce_scatter_<dtype>_<op>`.
pub(crate) fn reduce_scatter_kernel(dtype: DType, op: ReduceOp) -> &'static str {
    reducing_kernel(Reducer::ReduceScatter, dtype, op)
}

/// A reducing kernel's name (made once: this runs on every call).
fn reducing_kernel(reducer: Reducer, dtype: DType, op: ReduceOp) -> &'static str {
    static NAMES: OnceLock<HashMap<(Reducer, DType, ReduceOp), String>> = OnceLock::new();
    let names = NAMES.get_or_init(|| {
        every_reducing_kernel()
            .map(|(reducer, dtype, op)| ((reducer, dtype, op), name(reducer, dtype, op)))
            .collect()
    });
    names
        .get(&(reducer, dtype, op))
        .map_or(UNKNOWN, String::as_str)
}

/// What a launch of a dtype or op the kernels lack looks up (and does not find).
const UNKNOWN: &str = "peer_no_such_kernel";

/// Every reducing kernel, per dtype and op.
fn every_reducing_kernel() -> impl Iterator<Item = (Reducer, DType, ReduceOp)> {
    DTYPES.into_iter().flat_map(|dtype| {
        OPS.into_iter().flat_map(move |op| {
            Algorithm::ALL
                .map(Reducer::AllReduce)
                .into_iter()
                .chain([Reducer::OneshotLocal, Reducer::ReduceScatter])
                .map(move |reducer| (reducer, dtype, op))
        })
    })
}

/// `peer_<stem>_<dtype>_<op>`.
fn name(reducer: Reducer, dtype: DType, op: ReduceOp) -> String {
    format!("peer_{}_{}_{}", reducer.stem(), dtype.name(), op.name())
}

/// Most blocks per launch and work items per thread, unless configured: on device memory
/// every SM of the device (at most [`MAX_BLOCKS`]), one item per thread; where ranks share
/// a device, their share of it and at most 36 (all their blocks must be resident at once,
/// beside whatever else runs there); on host memory mapped into the devices at most 8 blocks
/// of 4 items per thread, since there each block costs more than it carries. Measured on
/// 2 x H200 (BENCHMARKS.md, the grid step): one-shot push over NVLink carries ~160 GB/s with
/// 36 blocks and ~240 GB/s with 128; through host memory 42 KB takes 20.7 us with 2 blocks
/// and 33.9 us with 8.
pub(crate) fn default_grid(sms: u32, sharing: usize, host_memory: bool) -> (u32, usize) {
    if host_memory {
        (8, 4)
    } else if sharing > 1 {
        ((sms / sharing as u32).clamp(1, 36), 1)
    } else {
        (sms.clamp(1, MAX_BLOCKS), 1)
    }
}

/// Blocks for one launch over `work` items (one per thread), at most `max_blocks`. Every
/// rank computes the same number (the per-block barriers pair blocks by index).
pub(crate) fn blocks(work: usize, threads: u32, max_blocks: u32) -> u32 {
    work.div_ceil(threads as usize)
        .clamp(1, max_blocks.clamp(1, MAX_BLOCKS) as usize) as u32
}

/// Block sizes of a spread grid ([`spread_grid`]), and those whose residency [`Residency`]
/// knows.
pub(crate) const BLOCK_SIZES: [u32; 3] = [128, 256, 512];

/// The figure of `per_size` (one per [`BLOCK_SIZES`]) for blocks of `threads` threads: that
/// of the least size that is not smaller (a block of fewer threads needs no more room), or of
/// the largest.
pub(crate) fn by_block_size(per_size: [u32; 3], threads: u32) -> u32 {
    BLOCK_SIZES
        .iter()
        .zip(per_size)
        .find(|(size, _)| threads <= **size)
        .map_or(per_size[2], |(_, n)| n)
}

/// Grid of a one-shot all-reduce over `work` vectors (one per thread): blocks of the fewest
/// threads, a power of two from the least of [`BLOCK_SIZES`] up to `threads`, that hold
/// every vector in at most `spread(threads per block)` blocks; where none does, `threads`
/// per block and at most `max_blocks` blocks, as [`blocks`] gives. A small message then
/// runs on more SMs with fewer warps each: after its wait every thread reduces and stores
/// its vector, and with 16 warps on one SM they queue for its schedulers (on one H200, two
/// ranks, 42 KB in 21 blocks of 128 threads took 2.56 us against 2.98 in 6 of 512). Every
/// rank computes the same grid.
pub(crate) fn spread_grid(
    work: usize,
    threads: u32,
    spread: impl Fn(u32) -> u32,
    max_blocks: u32,
) -> (u32, u32) {
    let fits = |t: u32| work.div_ceil(t as usize) <= spread(t) as usize;
    let mut t = BLOCK_SIZES[0].min(threads).max(1);
    while t < threads && !fits(t) {
        t = (t * 2).min(threads);
    }
    if fits(t) {
        (blocks(work, t, spread(t)), t)
    } else {
        (blocks(work, threads, max_blocks), threads)
    }
}

/// Work items (16-byte vectors per thread) of an all-reduce of `count` elements.
pub(crate) fn all_reduce_work(
    algorithm: Algorithm,
    dtype: DType,
    count: usize,
    world: usize,
) -> usize {
    let nvec = count.div_ceil(16 / dtype.size());
    match algorithm {
        Algorithm::OneshotPull | Algorithm::OneshotPush | Algorithm::OneshotCopy => nvec,
        Algorithm::TwoshotPull | Algorithm::TwoshotPush => nvec.div_ceil(world.max(1)),
    }
}

/// Every kernel of [`COLLECTIVES`], by name.
fn every_kernel_name() -> Vec<String> {
    let mut names: Vec<String> = [
        "peer_all_gather",
        "peer_broadcast",
        "peer_fused_rmsnorm_push",
        "peer_fused_rmsnorm_local",
        "peer_fused_rmsnorm_pull",
        "peer_barrier_kernel",
        "peer_put_signal_kernel",
        "peer_wait_signal_kernel",
        "peer_agree_only",
    ]
    .map(String::from)
    .to_vec();
    names.extend(every_reducing_kernel().map(|(reducer, dtype, op)| name(reducer, dtype, op)));
    names
}

/// Which launches may start while the previous kernel of their stream finishes
/// (programmatic stream serialization, sm_90+; every kernel waits for that kernel in its
/// prologue before it reads anything).
#[derive(Debug)]
enum Overlap {
    /// None: the device predates sm_90.
    Never,
    /// Every launch: this rank is the only one on its device.
    Always,
    /// `sharing` ranks share the device. A kernel started early stays resident while it
    /// waits, and holds room that a peer's kernel, which this rank's current one waits for,
    /// may need. So a launch starts early only when it and the kernel it would overlap are
    /// both small (see [`Residency::early_bound`]): `last` is this rank's previous launch
    /// (stream, blocks, threads per block), and after a launch on another stream the kernel
    /// before this one on its own stream is not known, so it does not start early.
    Bounded {
        residency: Residency,
        sharing: usize,
        last: Cell<Option<(RawStream, u32, u32)>>,
    },
}

impl Overlap {
    /// Whether the next launch, of `blocks` blocks of `threads` threads on `stream`, may
    /// start early (it is noted as the previous launch of the next question).
    fn admits(&self, stream: RawStream, blocks: u32, threads: u32) -> bool {
        match self {
            Overlap::Never => false,
            Overlap::Always => true,
            Overlap::Bounded {
                residency,
                sharing,
                last,
            } => {
                let Some((last_stream, last_blocks, last_threads)) =
                    last.replace(Some((stream, blocks, threads)))
                else {
                    return false;
                };
                let within = |most: u32| blocks <= most && last_blocks <= most;
                last_stream == stream
                    && (within(residency.whole_sm_bound(*sharing))
                        || (threads == last_threads
                            && within(residency.early_bound(threads, *sharing))))
            }
        }
    }
}

/// How many blocks of the module's kernels a device holds at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Residency {
    /// The device's multiprocessors. Every kernel fits one block of up to 512 threads on
    /// one of them.
    pub(crate) sms: u32,
    /// For each of [`BLOCK_SIZES`]: blocks of that many threads, of any kernels of the module
    /// mixed, that one SM holds at once. That is the fewest any one kernel fits alone: each
    /// limit of an SM (registers, warps, shared memory, blocks) is a sum over its blocks, so
    /// blocks that each fit n times alone fit n together.
    pub(crate) per_sm: [u32; 3],
}

impl Residency {
    /// Bytes of [`Self::to_bytes`].
    pub(crate) const BYTES: usize = 16;

    /// The least of each figure of two devices' residencies (ranks must agree on grids).
    pub(crate) fn min(self, other: Residency) -> Residency {
        let mut per_sm = self.per_sm;
        for (a, b) in per_sm.iter_mut().zip(other.per_sm) {
            *a = (*a).min(b);
        }
        Residency {
            sms: self.sms.min(other.sms),
            per_sm,
        }
    }

    pub(crate) fn to_bytes(self) -> [u8; Self::BYTES] {
        let mut out = [0u8; Self::BYTES];
        for (chunk, v) in out
            .chunks_exact_mut(4)
            .zip(std::iter::once(self.sms).chain(self.per_sm))
        {
            chunk.copy_from_slice(&v.to_le_bytes());
        }
        out
    }

    pub(crate) fn from_bytes(bytes: &[u8; Self::BYTES]) -> Residency {
        let word = |i: usize| u32::from_le_bytes(bytes[4 * i..4 * i + 4].try_into().unwrap());
        Residency {
            sms: word(0),
            per_sm: [word(1), word(2), word(3)],
        }
    }

    /// Blocks of `threads` threads (of any kernels mixed) the device holds at once.
    pub(crate) fn blocks(&self, threads: u32) -> u32 {
        by_block_size(self.per_sm, threads)
            .max(1)
            .saturating_mul(self.sms)
    }

    /// The largest grid whose launches may start early where `sharing` ranks share the
    /// device, counting each block as a whole SM: it holds whatever the launches around it
    /// are ([`overlap_bound`]).
    pub(crate) fn whole_sm_bound(&self, sharing: usize) -> u32 {
        overlap_bound(self.sms, sharing)
    }

    /// The largest grid of `threads` per block whose launches may start early where
    /// `sharing` ranks share the device, after a launch of as many threads per block.
    ///
    /// Suppose a rank's kernel k (at most `b` blocks) is not resident yet. The kernels of
    /// the other `sharing - 1` ranks that wait for it are their kernels k and, started
    /// early, k + 1 (a kernel lets the next start only after its own wait for the one
    /// before): `2 b` blocks each, all of this size, since every rank makes the same calls.
    /// Older kernels wait only for older ones and finish. While no SM takes one more block,
    /// each holds [`Self::blocks`]` / sms` of them; so kernel k finds room when
    /// `(sharing - 1) 2 b + b <= blocks`. Where a launch and the one before differ in size,
    /// only [`Self::whole_sm_bound`] holds, since blocks of one size can sit on every SM and
    /// leave no room for a larger one.
    pub(crate) fn early_bound(&self, threads: u32, sharing: usize) -> u32 {
        let sharing = u32::try_from(sharing).unwrap_or(u32::MAX).max(1);
        self.blocks(threads) / (2 * sharing - 1)
    }
}

/// The largest grid whose launches may start early where `sharing` ranks share a device of
/// `sms` multiprocessors, each block counted as an SM: `(sharing - 1) 2 b + b <= sms` (see
/// [`Residency::early_bound`]).
pub(crate) fn overlap_bound(sms: u32, sharing: usize) -> u32 {
    let sharing = u32::try_from(sharing).unwrap_or(u32::MAX).max(1);
    sms / (2 * sharing - 1)
}

/// The module of one context and every function of it.
#[derive(Debug)]
pub(crate) struct Kernels {
    ctx: Arc<CudaContext>,
    functions: HashMap<String, CudaFunction>,
    residency: Residency,
    overlap: Overlap,
}

impl Kernels {
    /// Compiles (or finds in the cache) and loads the module and every function of it.
    ///
    /// All of them now, completely (see [`KernelCache::function`]), not at first use: under
    /// CUDA's lazy loading, loading a function may wait for the whole context, and a rank
    /// that did so while a peer's kernel spins on the same device waiting for this rank
    /// would wait until the peer timed out.
    pub(crate) fn load(ctx: &Arc<CudaContext>) -> Result<Self> {
        let cache = KernelCache::global();
        let functions: HashMap<String, CudaFunction> = every_kernel_name()
            .into_iter()
            .map(|name| {
                let f = cache.function(ctx, &COLLECTIVES, &name)?;
                Ok((name, f))
            })
            .collect::<Result<_>>()?;
        let (major, _) = ctx.compute_capability().map_err(driver_error)?;
        let sms = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(driver_error)?;
        let mut per_sm = [u32::MAX; 3];
        for f in functions.values() {
            for (most, threads) in per_sm.iter_mut().zip(BLOCK_SIZES) {
                // SAFETY: a function of a module loaded into this context, no dynamic
                // shared memory (none of the kernels takes any).
                let fit = unsafe {
                    result::occupancy::max_active_block_per_multiprocessor(
                        f.cu_function(),
                        threads as i32,
                        0,
                    )
                }
                .map_err(driver_error)?;
                *most = (*most).min(fit.max(0) as u32);
            }
        }
        Ok(Kernels {
            ctx: ctx.clone(),
            functions,
            residency: Residency {
                sms: sms.max(1) as u32,
                per_sm: per_sm.map(|n| n.clamp(1, u32::MAX)),
            },
            overlap: if major >= 9 {
                Overlap::Always
            } else {
                Overlap::Never
            },
        })
    }

    /// How many blocks of these kernels the device holds at once (asked once, at load).
    pub(crate) fn residency(&self) -> Residency {
        self.residency
    }

    /// The same kernels for a rank whose device `sharing` ranks drive: launches start early
    /// only while they are small enough ([`Residency::early_bound`]).
    pub(crate) fn shared_by(mut self, sharing: usize) -> Self {
        if sharing > 1 && !matches!(self.overlap, Overlap::Never) {
            self.overlap = Overlap::Bounded {
                residency: self.residency,
                sharing,
                last: Cell::new(None),
            };
        }
        self
    }

    fn function(&self, name: &str) -> Result<&CudaFunction> {
        self.functions.get(name).ok_or_else(|| Error::Backend {
            backend: "cuda",
            source: format!("peer memory: no kernel named {name}").into(),
        })
    }

    /// Enqueues kernel `name` on `stream` with `(blocks, threads)`.
    pub(crate) fn launch(
        &self,
        name: &str,
        (blocks, threads): (u32, u32),
        stream: RawStream,
        args: &PeerArgs,
    ) -> Result<()> {
        let f = self.function(name)?;
        self.ctx.bind_to_thread().map_err(driver_error)?;
        let mut args = *args;
        let mut params = [&mut args as *mut PeerArgs as *mut c_void];
        if !self.overlap.admits(stream, blocks, threads) {
            // SAFETY: the function comes from a module loaded into this context; its one
            // parameter is `PeerArgs`, which `PeerArgs` here mirrors (#[repr(C)]); the
            // driver copies the parameter before returning.
            return unsafe {
                result::launch_kernel(
                    f.cu_function(),
                    (blocks, 1, 1),
                    (threads, 1, 1),
                    0,
                    cu_stream(stream),
                    &mut params,
                )
            }
            .map_err(driver_error);
        }
        // SAFETY: as above; every kernel of the module waits for its stream's previous
        // kernel (griddepcontrol.wait) before reading what that kernel may have written.
        unsafe {
            launch_overlapping(
                f.cu_function(),
                (blocks, threads),
                cu_stream(stream),
                &mut params,
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::CALL_WORDS;

    /// The fields of `struct NAME { ... }` in `src` (C or Rust), in order, with their
    /// sizes in bytes: pointers and 64-bit integers 8, 32-bit ones 4, arrays of them times
    /// their length (`[u32; CALL_WORDS + 1]`, `uint32_t x[PEER_CALL_WORDS + 1]`).
    fn fields(src: &str, head: &str) -> Vec<(String, usize)> {
        let body = &src[src.find(head).expect(head) + head.len()..];
        let body = &body[..body.find("\n}").expect("end of struct")];
        let words = CALL_WORDS + 1;
        let mut out = Vec::new();
        for line in body.lines() {
            let code = line.split("//").next().unwrap().trim();
            if code.is_empty() || code.starts_with('#') {
                continue;
            }
            if let Some(rust) = code.strip_prefix("pub ") {
                let (name, ty) = rust.trim_end_matches(',').split_once(": ").unwrap();
                let bytes = match ty {
                    "u64" => 8,
                    "u32" | "f32" => 4,
                    "CallWords" => 4 * words,
                    other => panic!("field {name}: type {other}"),
                };
                out.push((name.to_string(), bytes));
                continue;
            }
            let decl = code.trim_end_matches(';');
            let (decl, n) = match decl.split_once('[') {
                Some((d, _)) => (d, words),
                None => (decl, 1),
            };
            // `uint64_t a, b, c`: the type, then names separated by commas.
            let first = decl.find(',').unwrap_or(decl.len());
            let (ty, name) = decl[..first].trim().rsplit_once(' ').unwrap();
            let size = if ty.contains('*') || ty.ends_with("uint64_t") {
                8
            } else if ty.ends_with("uint32_t") || ty == "float" {
                4
            } else {
                panic!("field {name}: type {ty}")
            };
            let names = std::iter::once(name).chain(decl[first..].split(',').skip(1));
            for name in names {
                let name = name.trim().trim_start_matches('*');
                out.push((name.to_string(), size * n));
            }
        }
        out
    }

    #[test]
    fn args_match_the_kernel_struct_field_for_field() {
        let kernel = fields(
            include_str!("../kernels/peer_sync.cuh"),
            "struct PeerArgs {",
        );
        let rust = fields(include_str!("kernels.rs"), "pub(crate) struct PeerArgs {");
        assert_eq!(kernel, rust);
        // No padding: the kernel reads the bytes the host writes.
        let bytes: usize = rust.iter().map(|f| f.1).sum();
        assert_eq!(std::mem::size_of::<PeerArgs>(), bytes);
        assert_eq!(std::mem::align_of::<PeerArgs>(), 8);
    }

    const STREAM: RawStream = RawStream(0x1000);

    /// An H200's 132 SMs, where each kernel fits 4 blocks of 128 threads, 2 of 256, 1 of 512.
    const H200: Residency = Residency {
        sms: 132,
        per_sm: [4, 2, 1],
    };

    #[test]
    fn ranks_sharing_a_device_start_only_small_launches_early() {
        // 132 SMs: 8 ranks may each hold two launches of 8 blocks and still leave room
        // for the one that is not resident yet (7 x 16 + 8 = 120); 2 ranks, 44.
        assert_eq!(overlap_bound(132, 8), 8);
        assert_eq!(overlap_bound(132, 2), 44);
        assert_eq!(overlap_bound(132, 1), 132);
        assert_eq!(H200.whole_sm_bound(8), 8);
        let bounded = Overlap::Bounded {
            residency: H200,
            sharing: 8,
            last: Cell::new(None),
        };
        // Not the first launch (whatever ran before is unknown), then small after small,
        // never a large one, nor a small one right after a large one.
        let admitted: Vec<bool> = [6, 6, 6, 16, 6, 6]
            .map(|b| bounded.admits(STREAM, b, 512))
            .to_vec();
        assert_eq!(admitted, [false, true, true, false, false, true]);
        // After a launch on another stream, the kernel this one would overlap is unknown.
        let other = RawStream(STREAM.0 + 1);
        let admitted: Vec<bool> = [(other, 1), (STREAM, 6), (STREAM, 6)]
            .map(|(s, b)| bounded.admits(s, b, 512))
            .to_vec();
        assert_eq!(admitted, [false, false, true]);
        assert!(Overlap::Always.admits(STREAM, 128, 512));
        assert!(!Overlap::Never.admits(STREAM, 1, 128));
    }

    #[test]
    fn blocks_of_one_size_start_early_up_to_what_the_device_holds_of_them() {
        // 8 ranks on 132 SMs holding 4 blocks of 128 threads each: 7 x 2 x 35 + 35 = 525
        // <= 528 blocks of 128 threads; of 256 threads, 17 (255 <= 264).
        assert_eq!(H200.blocks(128), 528);
        assert_eq!(H200.blocks(64), 528);
        assert_eq!(H200.blocks(384), 132);
        assert_eq!(H200.early_bound(128, 8), 35);
        assert_eq!(H200.early_bound(256, 8), 17);
        assert_eq!(H200.early_bound(512, 8), 8);
        assert_eq!(H200.early_bound(128, 2), 176);
        let bounded = Overlap::Bounded {
            residency: H200,
            sharing: 8,
            last: Cell::new(None),
        };
        let admitted: Vec<bool> = [
            (21, 128),
            (21, 128), // same size, within 35
            (35, 128),
            (36, 128), // beyond 35
            (21, 128), // after a launch beyond it
            (11, 256), // another size, more than 8 blocks
            (11, 256), // same size, within 17
            (6, 512),  // another size, after 11 blocks: more than 8 whole SMs
            (6, 128),  // another size, both within 8 whole SMs
            (21, 128),
        ]
        .map(|(b, t)| bounded.admits(STREAM, b, t))
        .to_vec();
        assert_eq!(
            admitted,
            [
                false, true, true, false, false, false, true, false, true, true
            ]
        );
    }

    #[test]
    fn residencies_travel_as_bytes_and_combine_by_their_least() {
        let other = Residency {
            sms: 170,
            per_sm: [3, 2, 1],
        };
        assert_eq!(Residency::from_bytes(&H200.to_bytes()), H200);
        assert_eq!(
            H200.min(other),
            Residency {
                sms: 132,
                per_sm: [3, 2, 1]
            }
        );
        assert_eq!(by_block_size([35, 17, 8], 96), 35);
        assert_eq!(by_block_size([35, 17, 8], 256), 17);
        assert_eq!(by_block_size([35, 17, 8], 384), 8);
    }

    #[test]
    fn default_grids_use_the_device_or_few_blocks_on_host_memory() {
        assert_eq!(default_grid(132, 1, false), (MAX_BLOCKS, 1));
        assert_eq!(default_grid(132, 2, false), (36, 1));
        assert_eq!(default_grid(132, 8, false), (16, 1));
        assert_eq!(default_grid(0, 1, false), (1, 1));
        let (most, per_thread) = default_grid(132, 1, true);
        assert_eq!((most, per_thread), (8, 4));
        // 42 KB of bf16 (2688 vectors) through host memory: two blocks of 512 threads.
        assert_eq!(blocks(2688usize.div_ceil(per_thread), 512, most), 2);
    }

    #[test]
    fn spread_grids_take_the_fewest_threads_that_fit_the_spread() {
        let most = |n: u32| move |_: u32| n;
        // 42 KB of bf16 (2688 vectors) on a device of its own: 21 blocks of 128 threads.
        assert_eq!(spread_grid(2688, 512, most(128), 128), (21, 128));
        // A spread of 36 blocks: 128 KiB in 32 blocks of 256 threads.
        assert_eq!(spread_grid(8192, 512, most(36), 36), (32, 256));
        // Eight ranks sharing an H200 (16 blocks each; 35 of 128 threads, 17 of 256 or 8 of
        // 512 start early): 42 KB in 11 blocks of 256 threads, 64 KiB in 16; 128 KiB is too
        // large for 16 x 256 and 8 x 512.
        let shared = |t| by_block_size([16, 16, 8], t);
        assert_eq!(spread_grid(2688, 512, shared, 16), (11, 256));
        assert_eq!(spread_grid(4096, 512, shared, 16), (16, 256));
        assert_eq!(spread_grid(8192, 512, shared, 16), (16, 512));
        assert_eq!(spread_grid(1, 512, shared, 16), (1, 128));
        // Where only 8 blocks of any size may start: 42 KB keeps 6 blocks of 512.
        assert_eq!(spread_grid(2688, 512, most(8), 16), (6, 512));
        // Beyond the spread: the most threads, up to the most blocks, as before.
        assert_eq!(spread_grid(65536, 512, most(36), 36), (36, 512));
        assert_eq!(spread_grid(1 << 20, 512, most(128), 128), (128, 512));
        // Configured blocks of fewer threads than the spread's least stay as configured.
        assert_eq!(spread_grid(2688, 64, most(128), 128), (42, 64));
        assert_eq!(spread_grid(2688, 384, most(4), 4), (4, 384));
    }

    #[test]
    fn grids_are_bounded_and_cover_small_messages_with_one_block() {
        let g = |a, count| blocks(all_reduce_work(a, DType::BF16, count, 8), 512, 16);
        assert_eq!(g(Algorithm::OneshotPull, 1), 1);
        assert_eq!(g(Algorithm::OneshotPull, 21504), 6); // 42 KB bf16: 2688 vectors
        assert_eq!(g(Algorithm::TwoshotPull, 21504), 1);
        assert_eq!(g(Algorithm::TwoshotPush, 32 << 20), 16);
        assert_eq!(blocks(1 << 30, 512, 1000), MAX_BLOCKS);
    }

    #[test]
    fn every_loaded_name_is_a_kernel_of_the_source() {
        let names = every_kernel_name();
        // 9 kernels by name, and per dtype (3) and op (4): 5 all-reduces, the one-shot local
        // all-reduce, 1 reduce-scatter.
        assert_eq!(names.len(), 9 + 3 * 4 * 7);
        for n in names
            .iter()
            .filter(|n| !n.contains("_f32_") && !n.contains("_f16_") && !n.contains("_bf16_"))
        {
            assert!(COLLECTIVES.source.contains(&format!("{n}(")), "{n}");
        }
    }

    #[test]
    fn per_call_names_are_the_loaded_ones() {
        let loaded = every_kernel_name();
        assert_eq!(
            all_reduce_kernel(Algorithm::OneshotPush, DType::BF16, ReduceOp::Sum, false),
            "peer_oneshot_push_bf16_sum"
        );
        // Ranks whose regions are all one device's memory write their own slots.
        assert_eq!(
            all_reduce_kernel(Algorithm::OneshotPush, DType::BF16, ReduceOp::Sum, true),
            "peer_oneshot_local_bf16_sum"
        );
        assert_eq!(
            all_reduce_kernel(Algorithm::OneshotPull, DType::BF16, ReduceOp::Sum, true),
            "peer_oneshot_pull_bf16_sum"
        );
        assert_eq!(
            reduce_scatter_kernel(DType::F32, ReduceOp::Max),
            "peer_reduce_scatter_f32_max"
        );
        for dtype in DTYPES {
            for op in OPS {
                for a in Algorithm::ALL {
                    for same_device in [false, true] {
                        let n = all_reduce_kernel(a, dtype, op, same_device);
                        assert!(loaded.iter().any(|l| l == n), "{n}");
                    }
                }
                let n = reduce_scatter_kernel(dtype, op);
                assert!(loaded.iter().any(|l| l == n), "{n}");
            }
        }
        assert_eq!(fused_rmsnorm_kernel(true, false), "peer_fused_rmsnorm_push");
        assert_eq!(fused_rmsnorm_kernel(true, true), "peer_fused_rmsnorm_local");
        assert_eq!(fused_rmsnorm_kernel(false, true), "peer_fused_rmsnorm_pull");
        for push in [false, true] {
            for same_device in [false, true] {
                let n = fused_rmsnorm_kernel(push, same_device);
                assert!(loaded.iter().any(|l| l == n), "{n}");
            }
        }
        // A dtype the kernels lack names nothing that is loaded.
        let missing = all_reduce_kernel(Algorithm::OneshotPull, DType::I32, ReduceOp::Sum, false);
        assert!(!loaded.iter().any(|l| l == missing));
    }

    #[test]
    fn every_kernel_name_is_built_by_the_source() {
        let src = COLLECTIVES.source;
        for a in Algorithm::ALL {
            assert!(
                src.contains(&format!(", {}, DT, DNAME", a.kernel_stem())),
                "{a}"
            );
        }
        for d in DTYPES {
            assert!(src.contains(&format!(
                "PEER_DTYPE(COMM_{}, {})",
                d.name().to_uppercase(),
                d.name()
            )));
        }
        for o in OPS {
            assert!(src.contains(&format!(", {})", o.name())), "{o}");
        }
        for k in [
            "peer_all_gather(",
            "peer_broadcast(",
            "peer_fused_rmsnorm_push(",
            "peer_fused_rmsnorm_local(",
            "peer_fused_rmsnorm_pull(",
            "peer_barrier_kernel(",
            "peer_put_signal_kernel(",
            "peer_wait_signal_kernel(",
            "peer_agree_only(",
            "peer_reduce_scatter_##DNAME",
        ] {
            assert!(src.contains(k), "{k}");
        }
        // The headers are prepended, never included.
        assert!(!src.contains("#include \"peer_"));
    }
}
