//! GPU ranks as threads of the bench process, kept alive across criterion's samples.
//!
//! [`Ranks::start`] starts one thread per rank; each joins the backend as `allreduce-perf`
//! starts it (the examples crate's registry, or the concrete peer-memory communicator where
//! the fused op is benched) on the device of its rank (`rank % GPUs`: one GPU each, or
//! ranks sharing one). [`Ranks::time`] hands every rank the same [`Job`]; each rank times
//! its calls between two CUDA events on its own stream, and the job's time is the slowest
//! rank's: what a caller waiting for every rank would see.
//!
//! A job's buffers (and graph) are made once and reused while criterion asks for more of
//! the same job. Before first use the inputs are filled, one eager call is made on every
//! rank (backends set up at first use, which a capture cannot hold) and an all-reduce's
//! result is checked on the device against the pattern's reference: a bench of a wrong
//! result stops with an error instead of printing a figure.

use std::sync::Arc;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::thread::JoinHandle;
use std::time::Duration;

use comm_core::cuda::cudarc::driver::{CudaGraph, CudaStream, sys};
use comm_core::cuda::{
    DeviceBuffer, DeviceMemory, PatternKernels, context, device_count, driver_error,
};
use comm_core::{Bootstrap, Communicator, DType, Error, ReduceOp, Result, ThreadsBootstrap};
use comm_examples::backends::{self, RankContext, ThreadGroup};
use comm_examples::gpu::GpuComm;
use comm_examples::step::fused::peer_backend;

/// Kernels that ranks sharing one GPU in one process may queue together before the driver
/// holds later launches back behind kernels that spin for them (the examples' sweep bounds
/// the same; an H200 ran 3200 and hung at 4800). Split among the ranks sharing the GPU.
const SHARED_GPU_QUEUED_KERNELS: u64 = 2048;

/// The norm's epsilon in the fused op.
const EPS: f32 = 1e-6;

/// What one call does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// An out-of-place bf16 sum all-reduce of `count` elements.
    AllReduce {
        /// Elements.
        count: usize,
    },
    /// The fused all-reduce + residual add + RMSNorm of `rows` x `hidden` bf16.
    Fused {
        /// Rows.
        rows: usize,
        /// Elements per row.
        hidden: usize,
    },
}

impl Op {
    /// Bytes each rank reduces per call.
    pub fn bytes(self) -> usize {
        match self {
            Op::AllReduce { count } => count * 2,
            Op::Fused { rows, hidden } => rows * hidden * 2,
        }
    }
}

/// How calls reach the GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Calls {
    /// One call of the API each.
    Eager,
    /// Replays of a CUDA graph of one call.
    Graph,
}

/// Work for every rank: `iters` calls of `op`, made as `calls` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Job {
    /// The call.
    pub op: Op,
    /// Eager or replayed.
    pub calls: Calls,
    /// Calls to time.
    pub iters: u64,
}

/// Where the ranks run, for bench names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    /// Ranks.
    pub ranks: usize,
    /// GPUs they run on.
    pub gpus: usize,
}

impl Placement {
    /// One rank per GPU where there are two or more; else two ranks sharing the one GPU.
    /// `None` without a GPU or a CUDA driver.
    pub fn detect() -> Option<Placement> {
        match device_count() {
            Ok(0) | Err(_) => None,
            Ok(1) => Some(Placement { ranks: 2, gpus: 1 }),
            Ok(n) => Some(Placement { ranks: n, gpus: n }),
        }
    }

    /// Ranks per GPU (the most on any).
    pub fn sharing(self) -> usize {
        self.ranks.div_ceil(self.gpus.max(1))
    }

    /// "2 ranks on 2 GPUs" or "2 ranks sharing 1 GPU".
    pub fn describe(self) -> String {
        if self.sharing() > 1 {
            format!("{} ranks sharing {} GPU", self.ranks, self.gpus)
        } else {
            format!("{} ranks on {} GPUs", self.ranks, self.gpus)
        }
    }
}

/// Rank threads of one backend.
#[derive(Debug)]
pub struct Ranks {
    jobs: Vec<Sender<Job>>,
    times: Receiver<Result<Duration>>,
    threads: Vec<JoinHandle<()>>,
}

impl Ranks {
    /// Collective start of `backend` (a name of the examples' registry: `nccl`, `ipc`,
    /// `symm-cuda`, `auto`) on `placement`'s ranks; the first rank's error when any fails.
    pub fn start(backend: &str, placement: Placement) -> Result<Ranks> {
        let (ready_tx, ready) = channel();
        let (time_tx, times) = channel();
        let group = ThreadGroup::new(placement.ranks);
        let mut jobs = Vec::new();
        let mut threads = Vec::new();
        for (r, bootstrap) in ThreadsBootstrap::create(placement.ranks)
            .into_iter()
            .enumerate()
        {
            let ctx = RankContext::threads(Arc::new(bootstrap), group.clone());
            let (job_tx, job_rx) = channel::<Job>();
            let (ready_tx, time_tx) = (ready_tx.clone(), time_tx.clone());
            let name = backend.to_string();
            let bound = SHARED_GPU_QUEUED_KERNELS / placement.sharing() as u64;
            let unbounded = placement.sharing() == 1;
            jobs.push(job_tx);
            threads.push(
                std::thread::Builder::new()
                    .name(format!("rank-{r}"))
                    .spawn(move || {
                        let rank = Rank::join(&name, ctx, if unbounded { u64::MAX } else { bound });
                        let mut rank = match rank {
                            Ok(rank) => {
                                let _ = ready_tx.send(Ok(()));
                                rank
                            }
                            Err(e) => {
                                let _ = ready_tx.send(Err(e));
                                return;
                            }
                        };
                        for job in job_rx {
                            if time_tx.send(rank.run(job)).is_err() {
                                break;
                            }
                        }
                        rank.retire();
                    })
                    .map_err(Error::from)?,
            );
        }
        let mut first_error = None;
        for _ in 0..placement.ranks {
            match ready.recv() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    first_error.get_or_insert(e);
                }
                Err(_) => {
                    first_error.get_or_insert(Error::Mismatch("a rank thread panicked".into()));
                }
            }
        }
        let ranks = Ranks {
            jobs,
            times,
            threads,
        };
        match first_error {
            None => Ok(ranks),
            Some(e) => {
                ranks.stop();
                Err(e)
            }
        }
    }

    /// Runs `job` on every rank: the slowest rank's time, or the first rank's error.
    pub fn time(&self, job: Job) -> Result<Duration> {
        for tx in &self.jobs {
            tx.send(job)
                .map_err(|_| Error::Mismatch("a rank thread ended".into()))?;
        }
        let mut slowest = Ok(Duration::ZERO);
        for _ in 0..self.jobs.len() {
            let time = self
                .times
                .recv()
                .map_err(|_| Error::Mismatch("a rank thread ended".into()))
                .and_then(|t| t);
            slowest = match (slowest, time) {
                (Ok(a), Ok(b)) => Ok(a.max(b)),
                (Err(e), _) | (_, Err(e)) => Err(e),
            };
        }
        slowest
    }

    /// Ends the rank threads (each drops its buffers and communicator).
    pub fn stop(self) {
        drop(self.jobs);
        for t in self.threads {
            let _ = t.join();
        }
    }
}

/// The communicator of one rank.
enum Comm {
    /// As the registry starts it.
    Plain(Box<dyn Communicator>),
    /// The concrete peer-memory communicator, which has the fused op.
    Peer(Box<GpuComm>),
}

impl Comm {
    fn as_dyn(&self) -> &dyn Communicator {
        match self {
            Comm::Plain(c) => c.as_ref(),
            Comm::Peer(c) => c.as_dyn(),
        }
    }
}

/// One rank: its communicator, stream and the current job's buffers.
struct Rank {
    comm: Comm,
    ctl: Arc<dyn Bootstrap>,
    stream: Arc<CudaStream>,
    kernels: PatternKernels,
    /// Calls enqueued before the rank waits for them.
    bound: u64,
    prepared: Option<Prepared>,
}

/// Buffers (and the graph) of a job, kept while the same op and calls are asked for.
struct Prepared {
    op: Op,
    calls: Calls,
    input: DeviceBuffer,
    output: DeviceBuffer,
    residual: Option<DeviceBuffer>,
    weight: Option<DeviceBuffer>,
    graph: Option<CudaGraph>,
}

impl Rank {
    fn join(backend: &str, ctx: RankContext, bound: u64) -> Result<Rank> {
        let ordinal = ctx.device()?;
        let comm = match peer_backend(backend, &ctx)? {
            Some(peer) => Comm::Peer(Box::new(peer)),
            None => Comm::Plain(
                backends::find(backend)
                    .map_err(Error::InvalidArgument)?
                    .create(&ctx)?,
            ),
        };
        let cuda = context(ordinal)?;
        let stream = cuda.new_stream().map_err(driver_error)?;
        let kernels = PatternKernels::load(&cuda)?;
        // Ranks sharing a GPU share its context, where loading a module can wait for every
        // kernel on the device: no rank's collective starts before every rank has loaded.
        ctx.bootstrap().barrier()?;
        Ok(Rank {
            comm,
            ctl: ctx.bootstrap().clone(),
            stream,
            kernels,
            bound,
            prepared: None,
        })
    }

    fn run(&mut self, job: Job) -> Result<Duration> {
        let same = self
            .prepared
            .as_ref()
            .is_some_and(|p| p.op == job.op && p.calls == job.calls);
        if !same {
            self.retire();
            self.prepare(job.op, job.calls)?;
        }
        let Rank {
            comm,
            ctl,
            stream,
            bound,
            prepared,
            ..
        } = self;
        let p = prepared.as_mut().expect("prepared above");
        let flags = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
        ctl.barrier()?;
        let start = stream.record_event(flags).map_err(driver_error)?;
        // A large call may run as several launches (messages beyond the staging area go in
        // parts): bound the calls so that their kernels, counted as one per MiB, stay within
        // what ranks sharing a GPU can queue.
        let per_chunk = (*bound / job.op.bytes().div_ceil(1 << 20) as u64).max(1);
        let mut left = job.iters;
        while left > 0 {
            let n = left.min(per_chunk);
            for _ in 0..n {
                match &p.graph {
                    Some(g) => g.launch().map_err(driver_error)?,
                    None => enqueue(comm, stream, p)?,
                }
            }
            left -= n;
            if left > 0 {
                stream.synchronize().map_err(driver_error)?;
            }
        }
        let end = stream.record_event(flags).map_err(driver_error)?;
        end.synchronize().map_err(driver_error)?;
        // What the kernels found (a call that disagreed across ranks writes nothing): an
        // error, never a figure.
        comm.as_dyn().async_error()?;
        let ms = start.elapsed_ms(&end).map_err(driver_error)?;
        Ok(Duration::from_secs_f64(f64::from(ms) * 1e-3))
    }

    /// Makes `op`'s buffers, makes one checked eager call and, for graph replays, captures
    /// one call; every rank in step.
    fn prepare(&mut self, op: Op, calls: Calls) -> Result<()> {
        let cuda = self.stream.context().clone();
        let s = &self.stream;
        let bytes = op.bytes();
        let rank = self.ctl.rank() as u32;
        let seed = 0x5eed ^ bytes as u64;
        let mut input = DeviceBuffer::alloc(&cuda, bytes)?;
        self.kernels
            .fill(input.view_mut(DType::BF16, s)?, seed, rank)?;
        let mut output = DeviceBuffer::alloc(&cuda, bytes)?;
        output.fill_bytes(s, 0xff)?;
        let (residual, weight) = match op {
            Op::AllReduce { .. } => (None, None),
            Op::Fused { hidden, .. } => {
                let mut r = DeviceBuffer::alloc(&cuda, bytes)?;
                self.kernels.fill(r.view_mut(DType::BF16, s)?, 0xbeef, 0)?;
                let mut w = DeviceBuffer::alloc(&cuda, hidden * 2)?;
                self.kernels.fill(w.view_mut(DType::BF16, s)?, 0xcafe, 0)?;
                (Some(r), Some(w))
            }
        };
        let mut p = Prepared {
            op,
            calls,
            input,
            output,
            residual,
            weight,
            graph: None,
        };
        s.synchronize().map_err(driver_error)?;
        self.ctl.barrier()?;
        enqueue(&self.comm, s, &mut p)?;
        s.synchronize().map_err(driver_error)?;
        if let Op::AllReduce { .. } = op {
            let world = self.ctl.world_size() as u32;
            let out = p.output.view(DType::BF16, s)?;
            let wrong = self
                .kernels
                .check_all_reduce(out, ReduceOp::Sum, seed, world)?;
            if wrong > 0 {
                return Err(Error::Mismatch(format!(
                    "{}: {wrong} wrong elements of {} B on rank {rank}",
                    self.comm.as_dyn().name(),
                    bytes
                )));
            }
        }
        self.ctl.barrier()?;
        if calls == Calls::Graph {
            let graph = comm_examples::graph::capture(s, || enqueue(&self.comm, s, &mut p))?;
            let memory = DeviceMemory::with_stream(s.clone());
            comm_examples::graph::line_up_to_launch(&graph, &memory, &*self.ctl)?;
            graph.launch().map_err(driver_error)?;
            s.synchronize().map_err(driver_error)?;
            p.graph = Some(graph);
        }
        self.ctl.barrier()?;
        self.prepared = Some(p);
        Ok(())
    }

    /// Drops the current job's buffers and graph while no rank has work on the device:
    /// destroying a graph can wait for the device under a driver lock that a peer sharing
    /// the GPU needs to launch the kernel this rank's last replay waits for.
    fn retire(&mut self) {
        if self.prepared.is_some() {
            let _ = self.ctl.barrier();
            self.prepared = None;
            let _ = self.ctl.barrier();
        }
    }
}

/// Enqueues one call of `p`'s op on `stream`.
fn enqueue(comm: &Comm, stream: &CudaStream, p: &mut Prepared) -> Result<()> {
    let Prepared {
        op,
        input,
        output,
        residual,
        weight,
        ..
    } = p;
    match op {
        Op::AllReduce { .. } => comm.as_dyn().all_reduce(
            input.view(DType::BF16, stream)?,
            output.view_mut(DType::BF16, stream)?,
            ReduceOp::Sum,
        ),
        Op::Fused { .. } => {
            let Comm::Peer(peer) = comm else {
                return Err(Error::Unsupported(format!(
                    "{}: no fused all-reduce + RMSNorm",
                    comm.as_dyn().name()
                )));
            };
            let (Some(residual), Some(weight)) = (residual.as_mut(), weight.as_ref()) else {
                return Err(Error::InvalidArgument(
                    "fused op without its buffers".into(),
                ));
            };
            // Replays keep adding into the residual: harmless for timing (the kernel's
            // work does not depend on the values, which stay finite).
            peer.peer().all_reduce_residual_rmsnorm(
                input.view(DType::BF16, stream)?,
                residual.view_mut(DType::BF16, stream)?,
                output.view_mut(DType::BF16, stream)?,
                weight.view(DType::BF16, stream)?,
                EPS,
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bench_names_say_whether_ranks_share_a_gpu() {
        let shared = Placement { ranks: 2, gpus: 1 };
        assert_eq!(shared.sharing(), 2);
        assert_eq!(shared.describe(), "2 ranks sharing 1 GPU");
        let own = Placement { ranks: 4, gpus: 4 };
        assert_eq!(own.sharing(), 1);
        assert_eq!(own.describe(), "4 ranks on 4 GPUs");
    }

    #[test]
    fn ops_count_bf16_bytes() {
        assert_eq!(Op::AllReduce { count: 21504 }.bytes(), 43008);
        assert_eq!(
            Op::Fused {
                rows: 3,
                hidden: 7168
            }
            .bytes(),
            43008
        );
    }

    #[test]
    fn no_gpu_means_no_placement() {
        // Where CUDA reports devices, the placement follows them; elsewhere the benches skip.
        match device_count() {
            Ok(n) if n > 0 => assert!(Placement::detect().is_some()),
            _ => assert_eq!(Placement::detect(), None),
        }
    }
}
