//! The kernels of `kernels/peer_collectives.cu` (with `peer_io.cuh`, `peer_sync.cuh` and
//! `peer_lamport.cuh` prepended): the source registration, the argument block, the kernels'
//! names, every function loaded up front, and the one launch path every kernel goes through
//! (so that launch attributes, such as programmatic dependent launch, are set in one place).
//! Grids are in `grid.rs`, which launches may start early in `residency.rs`.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, OnceLock};

use comm_core::cuda::cudarc::driver::{CudaContext, CudaFunction, result, sys};
use comm_core::cuda::stream::cu_stream;
use comm_core::cuda::{KernelCache, KernelSource, driver_error, launch_overlapping};
use comm_core::{DType, Error, RawStream, ReduceOp, Result};

use crate::algorithm::Algorithm;
use crate::calls::{self, CallWords};
use crate::grid::Streamed;
use crate::residency::{Overlap, Residency};

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
    pub host: u32,
    /// One-shot push over host memory by data and flags: its writer blocks (every block of
    /// `peer_oneshot_push`, the last ones of `peer_oneshot_stream`); 0: Lamport mailboxes.
    pub writers: u32,
    /// The call every rank must make alike ([`crate::calls`]), compared on the device.
    pub call: CallWords,
    /// Its digest ([`crate::calls::digest`]), set by [`Kernels::launch`]: what peers
    /// compare first, so that no thread of the kernel hashes the call.
    pub call_digest: u64,
    /// A tapered streamed one-shot push's small chunks, first and last: their vectors
    /// ([`Streamed::taper`]; 0 for every other kernel, which reads neither field).
    pub taper_vecs: u32,
    /// Its chunks of `part` bytes between the first small one and the last ones.
    pub taper_big: u32,
    /// Two ranks on one link: 1 + the peer's chunk whose flag the call's later writer
    /// waits for ([`Streamed::late_chunk`]; 0: none).
    pub late_chunk: u32,
    /// Unused: keeps the struct free of padding.
    pub spare: u32,
}

/// A reducing kernel, per dtype and op: an all-reduce of an algorithm, the one-shot push
/// where every rank's region is one device's memory (each rank writes its own slot and
/// reads its peers' instead of writing into every peer), or the reduce-scatter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Reducer {
    AllReduce(Algorithm),
    OneshotLocal,
    OneshotStream,
    OneshotGrouped,
    OneshotTapered,
    ReduceScatter,
}

impl Reducer {
    fn stem(self) -> &'static str {
        match self {
            Reducer::AllReduce(algorithm) => algorithm.kernel_stem(),
            Reducer::OneshotLocal => "oneshot_local",
            Reducer::OneshotStream => "oneshot_stream",
            Reducer::OneshotGrouped => "oneshot_grouped",
            Reducer::OneshotTapered => "oneshot_tapered",
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

/// The kernel of a one-shot push over host memory streamed in chunks,
/// `peer_oneshot_stream_<dtype>_<op>` (a kernel of its own, so that the smaller messages'
/// `peer_oneshot_push` carries none of its code), or with `grouped` readers (several a chunk)
/// `peer_oneshot_grouped_<dtype>_<op>`: a third kernel, since the groups' code in the
/// streamed kernel cost messages of one reader a chunk ~1 us at 448 KiB-1 MiB (one H200,
/// two ranks, graphs); or, where its chunks taper ([`Streamed::taper`]),
/// `peer_oneshot_tapered_<dtype>_<op>`, whose code in the other two cost 256-512 KiB 0.3-1.1
/// us (one H100, two ranks, graphs).
pub(crate) fn streamed_push_kernel(
    dtype: DType,
    op: ReduceOp,
    plan: &Streamed,
    bytes: usize,
) -> &'static str {
    let reducer = if plan.taper.is_some() {
        Reducer::OneshotTapered
    } else if plan.grouped(bytes) {
        Reducer::OneshotGrouped
    } else {
        Reducer::OneshotStream
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
                .chain([
                    Reducer::OneshotLocal,
                    Reducer::OneshotStream,
                    Reducer::OneshotGrouped,
                    Reducer::OneshotTapered,
                    Reducer::ReduceScatter,
                ])
                .map(move |reducer| (reducer, dtype, op))
        })
    })
}

/// Which launches a two-rank kernel stands in for ([`pair_stands_in`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PairUse {
    /// Launches of one block over host memory.
    OneBlockOverHost,
    /// Every launch over host memory.
    OverHost,
    /// Launches of one block (one-shot local runs only where the ranks share one device's
    /// memory).
    OneBlock,
}

/// The reducing kernels with a two-rank version, `<name>_pair` (`PEER_AR_PAIR`: the world a
/// constant, so that the code for more peers drops out; sm_90, bf16 sum: one-shot push 172
/// KB of code, its pair 112 KB; tapered 90 KB, its pair 59 KB), and the launches it stands
/// in for. One H100, two ranks as threads, graphs, medians of 3 rounds against the generic
/// kernels in the same run (2026-12-06): over host memory, one-shot push of one block 8 B
/// 3.66 us / 3.96, 1 KiB 3.47 / 3.84, 8 KiB 4.26 / 4.58, where one warp's chain of steps is
/// the call; of several blocks it was slower in an earlier run (42 KB 7.04 / 6.87, 64 KiB
/// 8.88 / 8.46), so those keep the generic kernel. Tapered 768 KiB 49.78 / 51.13, 1 MiB
/// 63.34 / 64.66, 4 MiB 226.80 / 228.54. On one device's memory, one-shot local of one block
/// 8 B 2.63 / 2.75, 1 KiB 2.54 / 2.73 (8-64 KiB, several blocks: equal). The other streamed
/// kernels' pairs were not all faster (grouped, 256 KiB, that earlier run: 23.71 / 21.45),
/// so they have none.
fn every_pair_kernel() -> impl Iterator<Item = ((Reducer, DType, ReduceOp), PairUse)> {
    every_reducing_kernel().filter_map(|kernel| match kernel.0 {
        Reducer::AllReduce(Algorithm::OneshotPush) => Some((kernel, PairUse::OneBlockOverHost)),
        Reducer::OneshotTapered => Some((kernel, PairUse::OverHost)),
        Reducer::OneshotLocal => Some((kernel, PairUse::OneBlock)),
        _ => None,
    })
}

/// Whether a two-rank kernel of `pair_use` stands in for a launch of `blocks` among `world`
/// ranks whose regions are host memory (`host`) or not. The push kernels' pairs stand in
/// only over host memory: that is where they were measured and checked (one GPU); over
/// device memory between two GPUs they have not run yet.
fn pair_stands_in(pair_use: PairUse, world: u32, blocks: u32, host: bool) -> bool {
    world == 2
        && match pair_use {
            PairUse::OneBlockOverHost => host && blocks == 1,
            PairUse::OverHost => host,
            PairUse::OneBlock => blocks == 1,
        }
}

/// `peer_<stem>_<dtype>_<op>`.
fn name(reducer: Reducer, dtype: DType, op: ReduceOp) -> String {
    format!("peer_{}_{}_{}", reducer.stem(), dtype.name(), op.name())
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

/// A kernel of the module, and its two-rank version where it has one.
#[derive(Debug)]
struct Entry {
    generic: CudaFunction,
    /// `<name>_pair`, and the launches it stands in for ([`every_pair_kernel`]).
    pair: Option<(CudaFunction, PairUse)>,
}

/// The module of one context and every function of it.
#[derive(Debug)]
pub(crate) struct Kernels {
    ctx: Arc<CudaContext>,
    /// Every kernel by name: one lookup a launch.
    kernels: HashMap<String, Entry>,
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
        let mut kernels: HashMap<String, Entry> = every_kernel_name()
            .into_iter()
            .map(|name| {
                let generic = cache.function(ctx, &COLLECTIVES, &name)?;
                Ok((
                    name,
                    Entry {
                        generic,
                        pair: None,
                    },
                ))
            })
            .collect::<Result<_>>()?;
        for ((reducer, dtype, op), pair_use) in every_pair_kernel() {
            let name = name(reducer, dtype, op);
            let entry = kernels.get_mut(&name).ok_or_else(|| Error::Backend {
                backend: "cuda",
                source: format!("peer memory: {name}_pair stands in for no kernel").into(),
            })?;
            entry.pair = Some((
                cache.function(ctx, &COLLECTIVES, &format!("{name}_pair"))?,
                pair_use,
            ));
        }
        let (major, _) = ctx.compute_capability().map_err(driver_error)?;
        let sms = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(driver_error)?;
        let residency = Residency::of(
            u32::try_from(sms).unwrap_or(1),
            kernels
                .values()
                .flat_map(|e| std::iter::once(&e.generic).chain(e.pair.as_ref().map(|(f, _)| f))),
        )?;
        Ok(Kernels {
            ctx: ctx.clone(),
            kernels,
            residency,
            overlap: Overlap::for_capability(major),
        })
    }

    /// How many blocks of these kernels the device holds at once (asked once, at load).
    pub(crate) fn residency(&self) -> Residency {
        self.residency
    }

    /// The same kernels for a rank whose device `sharing` ranks drive: launches start early
    /// only while they are small enough ([`Residency::early_bound`]).
    pub(crate) fn shared_by(mut self, sharing: usize) -> Self {
        self.overlap = self.overlap.shared_by(self.residency, sharing);
        self
    }

    /// Kernel `name`, or for a launch of `blocks` with `args` its two-rank version where it
    /// has one for such a launch ([`pair_stands_in`]).
    fn function(&self, name: &str, args: &PeerArgs, blocks: u32) -> Result<&CudaFunction> {
        let entry = self.kernels.get(name).ok_or_else(|| Error::Backend {
            backend: "cuda",
            source: format!("peer memory: no kernel named {name}").into(),
        })?;
        Ok(match &entry.pair {
            Some((pair, pair_use))
                if pair_stands_in(*pair_use, args.world, blocks, args.host != 0) =>
            {
                pair
            }
            _ => &entry.generic,
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
        let f = self.function(name, args, blocks)?;
        self.ctx.bind_to_thread().map_err(driver_error)?;
        let mut args = PeerArgs {
            call_digest: calls::digest(&args.call),
            ..*args
        };
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

    #[test]
    fn the_warmed_fields_touch_every_line_of_the_parameters() {
        // peer_warm_args names a field in each 64-byte line of PeerArgs (some lines more
        // than one); a struct that grows past them leaves its last line cold. Offsets are
        // the sums of the sizes before: PeerArgs has no padding (its `spare` field).
        let src = include_str!("../kernels/peer_sync.cuh");
        let kernel = fields(src, "struct PeerArgs {");
        let body = &src[src.find("void peer_warm_args(").expect("peer_warm_args")..];
        let body = &body[..body.find("\n}").expect("end of peer_warm_args")];
        let mut offsets = std::collections::HashMap::new();
        let mut at = 0;
        for (name, bytes) in &kernel {
            offsets.insert(name.as_str(), at);
            at += bytes;
        }
        let mut lines = std::collections::BTreeSet::new();
        for touch in body.split("a.").skip(1) {
            let name: String = touch
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            let index = touch[name.len()..]
                .strip_prefix('[')
                .map_or(0, |i| i[..i.find(']').unwrap()].parse::<usize>().unwrap());
            // Only `call` is an array: of 32-bit words.
            lines.insert((offsets[name.as_str()] + 4 * index) / 64);
        }
        assert_eq!(lines, (0..at.div_ceil(64)).collect());
    }

    #[test]
    fn every_loaded_name_is_a_kernel_of_the_source() {
        let names = every_kernel_name();
        // 9 kernels by name, and per dtype (3) and op (4): 5 all-reduces, the one-shot local
        // and the three streamed one-shot push all-reduces, 1 reduce-scatter.
        assert_eq!(names.len(), 9 + 3 * 4 * 10);
        assert!(
            COLLECTIVES
                .source
                .contains("PEER_AR(PEER_ONESHOT_STREAM, oneshot_stream,")
        );
        assert!(
            COLLECTIVES
                .source
                .contains("PEER_AR(PEER_ONESHOT_GROUPED, oneshot_grouped,")
        );
        assert!(
            COLLECTIVES
                .source
                .contains("PEER_AR(PEER_ONESHOT_TAPERED, oneshot_tapered,")
        );
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
    fn two_rank_kernels_stand_in_for_their_launches_only() {
        let pairs: Vec<_> = every_pair_kernel().collect();
        assert_eq!(pairs.len(), 3 * DTYPES.len() * OPS.len());
        for ((reducer, dtype, op), pair_use) in pairs {
            // Each is built by the source, and stands in for a kernel that is loaded.
            assert!(
                COLLECTIVES.source.contains(&format!(
                    "PEER_AR_PAIR(PEER_{}, {},",
                    reducer.stem().to_uppercase(),
                    reducer.stem()
                )),
                "{reducer:?}"
            );
            assert!(every_kernel_name().contains(&name(reducer, dtype, op)));
            let expected = match reducer {
                Reducer::AllReduce(Algorithm::OneshotPush) => PairUse::OneBlockOverHost,
                Reducer::OneshotTapered => PairUse::OverHost,
                _ => PairUse::OneBlock,
            };
            assert_eq!(pair_use, expected, "{reducer:?}");
        }
        use PairUse::*;
        assert!(pair_stands_in(OneBlockOverHost, 2, 1, true));
        assert!(!pair_stands_in(OneBlockOverHost, 2, 4, true));
        assert!(pair_stands_in(OverHost, 2, 4, true));
        assert!(pair_stands_in(OneBlock, 2, 1, false));
        assert!(!pair_stands_in(OneBlock, 2, 4, false));
        for world in [1, 3, 4, 8] {
            for pair_use in [OneBlockOverHost, OverHost, OneBlock] {
                assert!(!pair_stands_in(pair_use, world, 1, true), "{world}");
                assert!(!pair_stands_in(pair_use, world, 1, false), "{world}");
            }
        }
        // The push kernels' pairs: not measured over device memory yet.
        assert!(!pair_stands_in(OneBlockOverHost, 2, 1, false));
        assert!(!pair_stands_in(OverHost, 2, 4, false));
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
