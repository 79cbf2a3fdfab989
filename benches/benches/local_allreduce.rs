//! LocalComm all-reduce (f32, sum, 4 ranks) at a few sizes.
//!
//! The 4 rank threads live for the whole bench: each size's `iter_custom` hands them an
//! iteration count through a channel, every rank runs that many all-reduces after a
//! barrier and times itself, and the bench takes the slowest rank's time. Spawning threads
//! per sample would measure thread start-up, not the collective.

use std::sync::mpsc::{Receiver, Sender, channel};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use comm_core::{Communicator, CommunicatorExt, LocalComm, ReduceOp};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};

const RANKS: usize = 4;
const SIZES: [usize; 4] = [1 << 10, 64 << 10, 1 << 20, 16 << 20];

/// A job for the ranks: run `iters` all-reduces of `count` elements.
#[derive(Debug, Clone, Copy)]
struct Job {
    count: usize,
    iters: u64,
}

/// Rank threads kept alive across samples.
struct Ranks {
    jobs: Vec<Sender<Job>>,
    times: Receiver<Duration>,
    threads: Vec<JoinHandle<()>>,
}

impl Ranks {
    fn start(n: usize) -> Self {
        let (time_tx, times) = channel();
        let mut jobs = Vec::new();
        let mut threads = Vec::new();
        for comm in LocalComm::create(n) {
            let (job_tx, job_rx) = channel::<Job>();
            let time_tx = time_tx.clone();
            jobs.push(job_tx);
            threads.push(std::thread::spawn(move || rank(comm, job_rx, time_tx)));
        }
        Ranks {
            jobs,
            times,
            threads,
        }
    }

    /// Runs `job` on every rank; the slowest rank's time.
    fn run(&self, job: Job) -> Duration {
        for tx in &self.jobs {
            tx.send(job).expect("rank thread alive");
        }
        (0..self.jobs.len())
            .map(|_| self.times.recv().expect("rank thread alive"))
            .max()
            .unwrap_or_default()
    }

    fn stop(self) {
        drop(self.jobs);
        for t in self.threads {
            t.join().expect("rank thread panicked");
        }
    }
}

fn rank(comm: LocalComm, jobs: Receiver<Job>, times: Sender<Duration>) {
    let mut send = Vec::new();
    let mut recv = Vec::new();
    for job in jobs {
        // Buffers are sized outside the timed region, and reused across samples.
        if send.len() != job.count {
            send = vec![comm.rank() as f32 + 1.0; job.count];
            recv = vec![0f32; job.count];
        }
        comm.barrier().expect("barrier");
        let start = Instant::now();
        for _ in 0..job.iters {
            comm.all_reduce_slice(&send, &mut recv, ReduceOp::Sum)
                .expect("all_reduce");
        }
        times.send(start.elapsed()).expect("bench alive");
    }
}

fn local_allreduce(c: &mut Criterion) {
    let ranks = Ranks::start(RANKS);
    let mut group = c.benchmark_group("local_allreduce_f32_sum_4ranks");
    for bytes in SIZES {
        let count = bytes / size_of::<f32>();
        group.throughput(Throughput::Bytes(bytes as u64));
        group.bench_with_input(BenchmarkId::from_parameter(bytes), &count, |b, &count| {
            b.iter_custom(|iters| ranks.run(Job { count, iters }));
        });
    }
    group.finish();
    ranks.stop();
}

criterion_group! {
    name = benches;
    // Large sizes take milliseconds per call on a small host: fewer samples keep the
    // default run short; --quick shortens it further.
    config = Criterion::default().sample_size(20).warm_up_time(Duration::from_millis(500));
    targets = local_allreduce
}
criterion_main!(benches);
