//! `gpu-bench`: kernel speed of every algorithm and of the fused op of a GPU backend.
//!
//! In-process mode (`--ranks N`, default 8): N virtual ranks in one process on GPU 0, one
//! stream each, so every kernel of every rank runs at once, as on N GPUs, except that every
//! byte goes through one GPU's memory. Process mode (`--procs`, under mpirun): one rank per
//! process (and GPU). Per algorithm: 42 KB bf16 (a decode step's all-reduce) and 64 MiB
//! bf16, checked first (device f64 reference, every rank bitwise equal), then timed by
//! replaying a CUDA graph of `batch` calls per rank (in-process: forked to the N streams and
//! joined): median over `iters` replays, divided by `batch`; a graph of one call is timed
//! too (it adds the graph launch). The fused all-reduce + residual + RMSNorm is timed the
//! same way at 3 x 7168 (42 KB) and 4096 x 8192 (64 MiB), push and pull exchange. Other
//! sizes and shapes: `Options::sizes` and `Options::fused`; from [`LARGE_BYTES`] a point
//! is timed by 30 replays of one call.

use std::sync::Arc;
use std::time::Duration;

use comm_core::cuda::cudarc::driver::{CudaContext, CudaStream, result, sys};
use comm_core::cuda::{
    DeviceBuffer, PatternKernels, context, driver_error, event_times, raw_stream, record_each,
    timing_events,
};
use comm_core::{Bootstrap, DType, Error, ReduceOp, Result, ThreadsBootstrap};
use comm_peer::{Algorithm, PeerComm, PeerConfig};
use comm_symm::cuda::Backing;

use super::data::fnv;
use super::{Backend, GpuComm, timeout_or};

/// What to measure.
#[derive(Debug, Clone)]
pub struct Options {
    /// The backend.
    pub backend: Backend,
    /// The algorithms.
    pub algos: Vec<Algorithm>,
    /// In-process ranks on GPU 0; `None`: one rank per process (the environment's bootstrap).
    pub ranks: Option<usize>,
    /// Timed replays per point.
    pub iters: usize,
    /// Calls per replay at the small sizes.
    pub batch: usize,
    /// symm-cuda's backing.
    pub backing: Backing,
    /// Threads per block.
    pub threads: u32,
    /// Most blocks per launch; `None`: the layer's default.
    pub max_blocks: Option<u32>,
    /// All-reduce sizes, bytes of bf16.
    pub sizes: Vec<usize>,
    /// Shapes of the fused op, (rows, hidden).
    pub fused: Vec<(usize, usize)>,
}

/// Default all-reduce sizes: a decode step's 42 KB and a bandwidth-bound 64 MiB.
pub const DEFAULT_SIZES: [usize; 2] = [42 * 1024, 64 << 20];
/// Default fused shapes: three rows of 7168 (42 KB) and 4096 rows of 8192 (64 MiB).
pub const DEFAULT_FUSED: [(usize, usize); 2] = [(3, 7168), (4096, 8192)];
/// Points of this many bytes and more are timed by 30 replays of one call (`iters` and
/// `batch` apply below).
pub const LARGE_BYTES: usize = 1 << 20;

/// Replays and calls per replay for a point of `bytes`.
fn replays(opts: &Options, bytes: usize) -> (usize, usize) {
    if bytes >= LARGE_BYTES {
        (30, 1)
    } else {
        (opts.iters, opts.batch)
    }
}

/// The ranks this process drives.
struct Ranks {
    comms: Vec<GpuComm>,
    streams: Vec<Arc<CudaStream>>,
    /// Global rank of each local one.
    ids: Vec<usize>,
    world: usize,
    /// Process mode: the bootstrap, to line the processes up and compare results.
    bootstrap: Option<Arc<dyn Bootstrap>>,
}

impl Ranks {
    fn peer(&self, i: usize) -> &PeerComm {
        self.comms[i].peer()
    }

    fn lead(&self) -> bool {
        self.ids[0] == 0
    }

    fn line_up(&self) -> Result<()> {
        self.bootstrap.as_ref().map_or(Ok(()), |b| b.barrier())
    }

    fn sync_all(&self) -> Result<()> {
        for (i, s) in self.streams.iter().enumerate() {
            self.peer(i).synchronize(raw_stream(s))?;
        }
        Ok(())
    }

    /// True when every rank's `bufs` hold the same bytes.
    fn identical(&self, bufs: &[DeviceBuffer], bytes: usize) -> Result<bool> {
        let mut digests = Vec::new();
        for (b, s) in bufs.iter().zip(&self.streams) {
            let mut host = vec![0u8; bytes];
            b.download_bytes(s, 0, &mut host)?;
            digests.push(fnv(&host).to_le_bytes().to_vec());
        }
        if let Some(b) = &self.bootstrap {
            digests = b.all_gather_bytes(&digests[0])?;
        }
        Ok(digests.iter().all(|d| *d == digests[0]))
    }
}

/// Runs the bench; false when a result was wrong.
pub fn run(opts: &Options) -> Result<bool> {
    let ranks = make_ranks(opts)?;
    let ctx = ranks.peer(0).context().clone();
    if ranks.lead() {
        println!(
            "# gpu-bench {}: {} ranks{}; device copy bandwidth {:.0} GB/s (1 GiB DtoD, read + write)",
            opts.backend.name(),
            ranks.world,
            if opts.ranks.is_some() {
                " in this process on GPU 0"
            } else {
                ", one per process"
            },
            copy_bandwidth(&ctx)? / 1e9
        );
        println!("# {}", ranks.comms[0].describe());
        println!(
            "{:<22} {:>10} {:>6} {:>10} {:>10} {:>9} {:>9} {:>6}",
            "op", "bytes", "batch", "time_us", "graph1_us", "algbw", "busbw", "wrong"
        );
    }
    let kernels = PatternKernels::load(&ctx)?;
    let mut ok = true;
    for &algo in &opts.algos {
        for &bytes in &opts.sizes {
            let (it, b) = replays(opts, bytes);
            let r = measure_all_reduce(&ranks, &kernels, algo, bytes / 2, it, b)?;
            ok &= r.wrong == 0 && r.identical;
            print_row(&ranks, algo.name(), bytes, b, &r);
        }
    }
    for push in [true, false] {
        for &(rows, hidden) in &opts.fused {
            let (it, b) = replays(opts, rows * hidden * 2);
            let r = measure_fused(&ranks, &kernels, push, rows, hidden, it, b)?;
            ok &= r.identical;
            let name = if push {
                "fused-oneshot-push"
            } else {
                "fused-oneshot-pull"
            };
            print_row(&ranks, name, rows * hidden * 2, b, &r);
        }
    }
    Ok(ok)
}

fn make_ranks(opts: &Options) -> Result<Ranks> {
    let config = PeerConfig {
        max_bytes: 64 << 20,
        lamport_max_bytes: 64 << 20,
        agree_on_host: false,
        timeout: Some(timeout_or(Duration::from_secs(10))),
        threads: opts.threads,
        max_blocks: opts.max_blocks,
        ..PeerConfig::default()
    };
    let (backend, backing) = (opts.backend, opts.backing);
    match opts.ranks {
        Some(n) => {
            let ctx = context(0)?;
            let handles: Vec<_> = ThreadsBootstrap::create(n)
                .into_iter()
                .map(|b| {
                    let config = config.clone();
                    std::thread::spawn(move || {
                        let b: Arc<dyn Bootstrap> = Arc::new(b);
                        GpuComm::join(backend, &b, 0, config, backing)
                    })
                })
                .collect();
            let comms = handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .map_err(|_| Error::Mismatch("a rank panicked".into()))?
                })
                .collect::<Result<Vec<_>>>()?;
            let streams = (0..n)
                .map(|_| ctx.new_stream().map_err(driver_error))
                .collect::<Result<Vec<_>>>()?;
            Ok(Ranks {
                comms,
                streams,
                ids: (0..n).collect(),
                world: n,
                bootstrap: None,
            })
        }
        None => {
            let b: Arc<dyn Bootstrap> = Arc::new(comm_core::EnvBootstrap::from_env()?);
            let device = comm_peer::device_for(&*b);
            let comm = GpuComm::join(backend, &b, device, config, backing)?;
            let stream = comm.peer().context().new_stream().map_err(driver_error)?;
            Ok(Ranks {
                ids: vec![b.rank()],
                world: b.world_size(),
                comms: vec![comm],
                streams: vec![stream],
                bootstrap: Some(b),
            })
        }
    }
}

struct Measured {
    per_call_us: f64,
    graph1_us: f64,
    wrong: u64,
    identical: bool,
}

fn print_row(ranks: &Ranks, name: &str, bytes: usize, batch: usize, r: &Measured) {
    if !ranks.lead() {
        return;
    }
    let n = ranks.world as f64;
    let algbw = bytes as f64 / (r.per_call_us * 1e-6) / 1e9;
    let busbw = algbw * 2.0 * (n - 1.0) / n;
    println!(
        "{name:<22} {bytes:>10} {batch:>6} {:>10.2} {:>10.2} {algbw:>9.1} {busbw:>9.1} {:>6}{}",
        r.per_call_us,
        r.graph1_us,
        r.wrong,
        if r.identical {
            ""
        } else {
            "  RESULTS DIFFER ACROSS RANKS"
        }
    );
}

fn copy_bandwidth(ctx: &Arc<CudaContext>) -> Result<f64> {
    let bytes = 1usize << 30;
    let a = DeviceBuffer::alloc(ctx, bytes)?;
    let b = DeviceBuffer::alloc(ctx, bytes)?;
    let stream = ctx.new_stream().map_err(driver_error)?;
    let mut times = Vec::new();
    for i in 0..13 {
        let start = stream
            .record_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(driver_error)?;
        // SAFETY: two allocations of `bytes` bytes of this context.
        unsafe {
            result::memcpy_dtod_async(b.device_ptr(), a.device_ptr(), bytes, stream.cu_stream())
        }
        .map_err(driver_error)?;
        let end = stream
            .record_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(driver_error)?;
        end.synchronize().map_err(driver_error)?;
        if i >= 3 {
            times.push(start.elapsed_ms(&end).map_err(driver_error)? as f64 * 1e-3);
        }
    }
    Ok(2.0 * bytes as f64 / median(&mut times))
}

/// Times `enqueue` (every local rank's call on its stream) by graph replay: median per call.
fn time_graph(
    ranks: &Ranks,
    batch: usize,
    iters: usize,
    enqueue: &mut dyn FnMut() -> Result<()>,
) -> Result<f64> {
    let streams = &ranks.streams;
    let s0 = &streams[0];
    let graph = crate::graph::capture(s0, || {
        for s in &streams[1..] {
            s.join(s0).map_err(driver_error)?;
        }
        for _ in 0..batch {
            enqueue()?;
        }
        for s in &streams[1..] {
            s0.join(s).map_err(driver_error)?;
        }
        Ok(())
    })?;
    graph.upload().map_err(driver_error)?;
    let events = timing_events(ranks.peer(0).context(), iters + 1)?;
    ranks.line_up()?;
    for _ in 0..20.min(iters) {
        graph.launch().map_err(driver_error)?;
    }
    record_each(s0, &events, || graph.launch().map_err(driver_error))?;
    ranks.peer(0).synchronize(raw_stream(s0))?;
    let mut times: Vec<f64> = event_times(&events)?
        .iter()
        .map(|t| t.as_secs_f64() * 1e6)
        .collect();
    ranks.line_up()?;
    Ok(median(&mut times) / batch as f64)
}

fn measure_all_reduce(
    ranks: &Ranks,
    kernels: &PatternKernels,
    algo: Algorithm,
    count: usize,
    iters: usize,
    batch: usize,
) -> Result<Measured> {
    let ctx = ranks.peer(0).context();
    let bytes = count * 2;
    let seed = 0x5eed ^ bytes as u64;
    let mut ins = Vec::new();
    let mut outs = Vec::new();
    for (i, stream) in ranks.streams.iter().enumerate() {
        ranks.peer(i).use_algorithm(Some(algo));
        let mut input = DeviceBuffer::alloc(ctx, bytes)?;
        kernels.fill(
            input.view_mut(DType::BF16, stream)?,
            seed,
            ranks.ids[i] as u32,
        )?;
        ins.push(input);
        outs.push(DeviceBuffer::alloc(ctx, bytes)?);
    }
    for s in &ranks.streams {
        s.synchronize().map_err(driver_error)?;
    }
    ranks.line_up()?;
    let enqueue = |outs: &mut [DeviceBuffer]| -> Result<()> {
        for (i, s) in ranks.streams.iter().enumerate() {
            ranks.comms[i].as_dyn().all_reduce(
                ins[i].view(DType::BF16, s)?,
                outs[i].view_mut(DType::BF16, s)?,
                ReduceOp::Sum,
            )?;
        }
        Ok(())
    };
    enqueue(&mut outs)?;
    ranks.sync_all()?;
    let mut wrong = 0;
    for (out, s) in outs.iter().zip(&ranks.streams) {
        wrong += kernels.check_all_reduce(
            out.view(DType::BF16, s)?,
            ReduceOp::Sum,
            seed,
            ranks.world as u32,
        )?;
    }
    let identical = ranks.identical(&outs, bytes)?;
    let per_call_us = time_graph(ranks, batch, iters, &mut || enqueue(&mut outs))?;
    let graph1_us = if batch > 1 {
        time_graph(ranks, 1, iters, &mut || enqueue(&mut outs))?
    } else {
        per_call_us
    };
    Ok(Measured {
        per_call_us,
        graph1_us,
        wrong,
        identical,
    })
}

fn measure_fused(
    ranks: &Ranks,
    kernels: &PatternKernels,
    push: bool,
    rows: usize,
    hidden: usize,
    iters: usize,
    batch: usize,
) -> Result<Measured> {
    let ctx = ranks.peer(0).context();
    let bytes = rows * hidden * 2;
    let (mut ins, mut res, mut outs, mut ws) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let algo = if push {
        Algorithm::OneshotPush
    } else {
        Algorithm::OneshotPull
    };
    for (i, stream) in ranks.streams.iter().enumerate() {
        ranks.peer(i).use_algorithm(Some(algo));
        let mut input = DeviceBuffer::alloc(ctx, bytes)?;
        kernels.fill(
            input.view_mut(DType::BF16, stream)?,
            0xf00d,
            ranks.ids[i] as u32,
        )?;
        let mut r = DeviceBuffer::alloc(ctx, bytes)?;
        kernels.fill(r.view_mut(DType::BF16, stream)?, 0xbeef, 0)?;
        let mut w = DeviceBuffer::alloc(ctx, hidden * 2)?;
        kernels.fill(w.view_mut(DType::BF16, stream)?, 0xcafe, 0)?;
        ins.push(input);
        res.push(r);
        outs.push(DeviceBuffer::alloc(ctx, bytes)?);
        ws.push(w);
    }
    for s in &ranks.streams {
        s.synchronize().map_err(driver_error)?;
    }
    ranks.line_up()?;
    let enqueue = |res: &mut [DeviceBuffer], outs: &mut [DeviceBuffer]| -> Result<()> {
        for (i, s) in ranks.streams.iter().enumerate() {
            ranks.peer(i).all_reduce_residual_rmsnorm(
                ins[i].view(DType::BF16, s)?,
                res[i].view_mut(DType::BF16, s)?,
                outs[i].view_mut(DType::BF16, s)?,
                ws[i].view(DType::BF16, s)?,
                1e-6,
            )?;
        }
        Ok(())
    };
    enqueue(&mut res, &mut outs)?;
    ranks.sync_all()?;
    let identical = ranks.identical(&outs, bytes)? && ranks.identical(&res, bytes)?;
    // Replays keep adding into the residual: harmless for timing (values stay finite for
    // the few thousand replays here, and the kernel's work does not depend on them).
    let per_call_us = time_graph(ranks, batch, iters, &mut || enqueue(&mut res, &mut outs))?;
    let graph1_us = if batch > 1 {
        time_graph(ranks, 1, iters, &mut || enqueue(&mut res, &mut outs))?
    } else {
        per_call_us
    };
    Ok(Measured {
        per_call_us,
        graph1_us,
        wrong: 0,
        identical,
    })
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}
