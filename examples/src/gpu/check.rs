//! `gpu-check`: proves a GPU backend of the peer-memory layer correct on real GPUs.
//!
//! Per algorithm: the comm-core conformance suite on device memory (eager) and on zero-copy
//! buffers from `PeerComm::alloc`; a sweep (1 element to the maximum, odd counts, every
//! dtype and op, eager and zero-copy, in place) on fresh random data against an f64 host
//! reference, outputs poisoned first, results compared bit for bit across ranks; the fused
//! all-reduce + residual + RMSNorm against its f64 reference; a CUDA graph of an eager
//! all-reduce, a zero-copy all-reduce and a fused op, replayed on new data; a zero-copy
//! out-of-place call given one range as input and output. Then zero-copy buffers that differ
//! by rank at one offset (every rank must get `Error::Mismatch`), pushes past
//! mailboxes smaller than a flagged push (they go by data and flags over host memory, by pull
//! on device memory), the signal primitives, the timeout check (the last rank stays away: the
//! others must get `Error::Timeout`, then `Error::Aborted`), counts that differ by rank in a
//! launch of many blocks (every rank must get `Error::Mismatch` naming both, and no output),
//! and registration cycles (symm-cuda: heap rendezvous; ipc: zero-copy buffers) with no
//! growth of device memory, descriptors, /dev/shm entries, heap segment mappings or pinned
//! host memory. Each check prints PASS or FAIL; any failure makes the exit status 1. Where
//! the regions are host memory (symm-cuda's host backing, for GPUs without peer access)
//! there are no zero-copy buffers: the zero-copy conformance run is left out, the sweep's
//! and the graph's zero-copy cases run on device memory, and their detail lines say so.

use std::sync::Arc;
use std::time::{Duration, Instant};

use comm_core::conformance::{self, TestMemory};
use comm_core::cuda::cudarc::driver::result;
use comm_core::cuda::{DeviceMemory, DeviceOwned, device_count, driver_error, probe, raw_stream};
use comm_core::{Bootstrap, DType, Error, ReduceOp, Result};
use comm_peer::layout::CHANNELS;
use comm_peer::{Algorithm, PeerConfig};
use comm_symm::cuda::{Backing, DeviceHeap};

use super::data::{all_inputs, count_wrong, decode, fnv, fused_reference, relative_error};
use super::registered;
use super::zero_copy::ZeroCopyMemory;
use super::{Backend, GpuComm, timeout_or};

/// Staging of the checks (bytes per rank one launch moves; push messages too). The sweep
/// and the large conformance case go past it, so that calls run in several launches.
const STAGING_BYTES: usize = 4 << 20;

/// What to check.
#[derive(Debug, Clone)]
pub struct Options {
    /// The backend.
    pub backend: Backend,
    /// The algorithms, each checked in turn.
    pub algos: Vec<Algorithm>,
    /// Fewer cases (a couple of minutes on one GPU).
    pub quick: bool,
    /// Registration cycles of the leak check.
    pub cycles: usize,
    /// symm-cuda's backing.
    pub backing: Backing,
}

/// Runs every check on this rank; returns true when every rank passed everything.
pub fn run_rank(bootstrap: Arc<dyn Bootstrap>, opts: &Options) -> bool {
    let rank = bootstrap.rank();
    let world = bootstrap.world_size();
    let say = |msg: &str| {
        if rank == 0 {
            println!("{msg}");
        }
    };
    say(&format!(
        "# gpu-check {}: {world} ranks, staging {STAGING_BYTES} bytes{}",
        opts.backend.name(),
        if opts.quick { ", quick" } else { "" }
    ));
    let mut failures = 0usize;
    let mut report = |name: &str, started: Instant, mine: Result<String>| {
        let ok = agree(&*bootstrap, mine.is_ok());
        let secs = started.elapsed().as_secs_f64();
        match (&mine, ok) {
            (Ok(detail), true) => say(&format!("PASS  {name:<40} {secs:6.1}s  {detail}")),
            (Err(e), _) => {
                println!("FAIL  {name:<40} rank {rank}: {e}");
                failures += 1;
            }
            (Ok(_), false) => {
                failures += 1;
                say(&format!("FAIL  {name:<40} (on another rank)"));
            }
        }
    };
    for &algo in &opts.algos {
        let started = Instant::now();
        let check = match Check::new(&bootstrap, opts, algo) {
            Ok(c) => c,
            Err(e) => {
                report(&format!("{algo} setup"), started, Err(e));
                continue;
            }
        };
        if algo == opts.algos[0] {
            say(&format!("# {}", check.comm.describe()));
        }
        let mut steps: Vec<(&str, Step)> = vec![("conformance (eager)", Check::conformance_eager)];
        if !opts.quick && check.zero_copy {
            steps.push(("conformance (zero-copy)", Check::conformance_zero_copy));
        }
        if check.zero_copy {
            steps.push(("zero-copy, input as output", Check::aliased));
        }
        if algo == Algorithm::OneshotPush {
            steps.push(("changing sizes over 770 calls", Check::changing_sizes));
        }
        steps.extend([
            ("sweep vs f64 (eager + zero-copy)", Check::sweep as Step),
            ("fused rmsnorm vs f64", Check::fused),
            ("cuda graph replay", Check::graph),
        ]);
        for (name, step) in steps {
            let started = Instant::now();
            report(&format!("{algo} {name}"), started, step(&check));
        }
    }
    for algo in [Algorithm::OneshotPush, Algorithm::TwoshotPush] {
        let started = Instant::now();
        report(
            &format!("{algo} past small mailboxes"),
            started,
            small_mailboxes(&bootstrap, opts, algo),
        );
    }
    let started = Instant::now();
    report("signal primitives", started, primitives(&bootstrap, opts));
    if world > 1 {
        let started = Instant::now();
        report(
            "zero-copy buffers that differ by rank",
            started,
            registered::other_buffers(&bootstrap, opts),
        );
        for algo in [
            Algorithm::OneshotPull,
            Algorithm::OneshotPush,
            Algorithm::TwoshotPush,
            Algorithm::OneshotCopy,
        ] {
            let started = Instant::now();
            report(
                &format!("{algo} timeout"),
                started,
                timeout_check(&bootstrap, opts, algo),
            );
        }
        for algo in [
            Algorithm::OneshotPull,
            Algorithm::OneshotPush,
            Algorithm::TwoshotPush,
        ] {
            let started = Instant::now();
            report(
                &format!("{algo} counts differ, many blocks"),
                started,
                disagreement_check(&bootstrap, opts, algo),
            );
        }
    }
    let started = Instant::now();
    report(
        &format!("{} registration cycles", opts.cycles),
        started,
        cycles_check(&bootstrap, opts),
    );
    let total = bootstrap
        .all_gather_bytes(&[u8::from(failures > 0)])
        .map(|all| all.iter().filter(|v| v.first() == Some(&1)).count())
        .unwrap_or(1);
    if total == 0 {
        say(&format!(
            "# gpu-check {}: all passed on {world} ranks",
            opts.backend.name()
        ));
        true
    } else {
        say(&format!(
            "# gpu-check {}: FAILED on {total} rank(s)",
            opts.backend.name()
        ));
        false
    }
}

/// True when every rank says true.
fn agree(bootstrap: &dyn Bootstrap, ok: bool) -> bool {
    bootstrap
        .all_gather_bytes(&[u8::from(ok)])
        .map(|all| all.iter().all(|v| v.first() == Some(&1)))
        .unwrap_or(false)
}

/// The GPU of this rank: local ranks spread over the visible devices.
pub(super) fn device_of(bootstrap: &dyn Bootstrap) -> Result<usize> {
    Ok(bootstrap.local_rank() % device_count()?)
}

/// One check of one algorithm: a detail line, or why it failed.
type Step = fn(&Check) -> Result<String>;

struct Check {
    comm: GpuComm,
    memory: DeviceMemory,
    bootstrap: Arc<dyn Bootstrap>,
    quick: bool,
    /// Zero-copy buffers exist: not where the regions are host memory.
    zero_copy: bool,
}

impl Check {
    fn new(bootstrap: &Arc<dyn Bootstrap>, opts: &Options, algo: Algorithm) -> Result<Self> {
        Check::with_mailboxes(bootstrap, opts, algo, STAGING_BYTES)
    }

    /// A check whose push mailboxes hold `mailbox` bytes a sender.
    fn with_mailboxes(
        bootstrap: &Arc<dyn Bootstrap>,
        opts: &Options,
        algo: Algorithm,
        mailbox: usize,
    ) -> Result<Self> {
        let config = PeerConfig {
            max_bytes: STAGING_BYTES,
            lamport_max_bytes: mailbox,
            algorithm: Some(algo),
            // Processes sharing a GPU time-slice: spins must outlast other ranks' slices.
            timeout: Some(timeout_or(Duration::from_secs(60))),
            agree_on_host: true,
            ..PeerConfig::default()
        };
        let device = device_of(&**bootstrap)?;
        let comm = GpuComm::join(opts.backend, bootstrap, device, config, opts.backing)?;
        let memory =
            DeviceMemory::with_stream(comm.peer().context().new_stream().map_err(driver_error)?);
        Ok(Check {
            zero_copy: !comm.peer().group().host_memory(),
            comm,
            memory,
            bootstrap: bootstrap.clone(),
            quick: opts.quick,
        })
    }

    fn suite(&self) -> conformance::Config {
        conformance::Config {
            seed: 0x1bc0_ffee,
            random_cases: if self.quick { 12 } else { 48 },
            max_count: 1 << 16,
            // f32: just over twice the staging, three launches, the last of one element.
            large_count: Some(STAGING_BYTES / 2 + 1),
            error_cases: true,
        }
    }

    fn conformance_eager(&self) -> Result<String> {
        let r = conformance::run_with_memory(self.comm.as_dyn(), &self.memory, &self.suite())
            .map_err(|f| Error::Mismatch(f.to_string()))?;
        Ok(format!(
            "{} coverage, {} random, large {}, {} error cases",
            r.coverage_cases, r.random_cases, r.large_case, r.error_cases
        ))
    }

    fn aliased(&self) -> Result<String> {
        // bf16: within a launch, just past one, and three launches.
        let counts = [4097, 21504, STAGING_BYTES / 2 + 1, STAGING_BYTES + 5];
        registered::aliased(
            self.comm.peer(),
            &*self.bootstrap,
            &self.memory,
            &counts,
            900,
        )
    }

    fn conformance_zero_copy(&self) -> Result<String> {
        let memory = ZeroCopyMemory {
            comm: self.comm.peer(),
            stream: self.memory.stream().clone(),
        };
        let mut suite = self.suite();
        suite.random_cases = 16;
        let r = conformance::run_with_memory(self.comm.as_dyn(), &memory, &suite)
            .map_err(|f| Error::Mismatch(f.to_string()))?;
        Ok(format!(
            "{} coverage, {} random, large {}, {} error cases",
            r.coverage_cases, r.random_cases, r.large_case, r.error_cases
        ))
    }

    /// Sizes from 1 element to past the staging, odd ones included, every dtype and op: one
    /// launch's worth, and two launches' and a part vector more.
    fn sweep(&self) -> Result<String> {
        let mut counts: Vec<usize> = vec![1, 2, 3, 7, 8, 9, 15, 17, 63, 65, 1001, 4097, 21504];
        if !self.quick {
            counts.extend([65537, (1 << 20) + 3]);
        }
        let largest = |dtype: DType| 2 * (STAGING_BYTES / dtype.size()) + 5;
        let mut cases = 0;
        let mut seed = 17u64;
        for dtype in [DType::BF16, DType::F16, DType::F32] {
            let staged = STAGING_BYTES / dtype.size();
            for &count in counts.iter().chain([&staged, &largest(dtype)]) {
                for op in [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min] {
                    // Big cases once per dtype with sum only: they cost seconds time-sliced.
                    if count > 65537 && op != ReduceOp::Sum {
                        continue;
                    }
                    for &zero_copy in self.modes() {
                        seed += 1;
                        self.one_case(dtype, op, count, seed, zero_copy, false)?;
                        cases += 1;
                    }
                }
            }
        }
        // In place, both modes, at odd sizes of one launch and of three.
        for count in [21503, largest(DType::BF16)] {
            for &zero_copy in self.modes() {
                seed += 1;
                self.one_case(DType::BF16, ReduceOp::Sum, count, seed, zero_copy, true)?;
                cases += 1;
            }
        }
        Ok(format!(
            "{cases} cases, counts 1..={}{}",
            largest(DType::BF16),
            self.eager_only()
        ))
    }

    /// 770 calls whose sizes change from call to call, each against the f64 reference and
    /// every fifth in place: a push mailbox keeps the words of earlier, larger calls beyond
    /// the reach of the smaller ones since, and those must never pass for new data.
    fn changing_sizes(&self) -> Result<String> {
        // bf16 elements: 100 KB, 8 B, one vector and an element, 2 B, 42 KB, 122 KB. Six
        // sizes over three mailbox buffers: each buffer sees every size after every other.
        const COUNTS: [usize; 6] = [51_200, 4, 4097, 1, 21_504, 61_000];
        const CALLS: usize = 770;
        for i in 0..CALLS {
            let count = COUNTS[i % COUNTS.len()];
            self.one_case(
                DType::BF16,
                ReduceOp::Sum,
                count,
                9_000 + i as u64,
                false,
                i % 5 == 4,
            )?;
        }
        Ok(format!("{CALLS} calls of 1..={} bf16", COUNTS[5]))
    }

    /// What a detail line adds where the zero-copy cases ran on device memory.
    fn eager_only(&self) -> &'static str {
        if self.zero_copy {
            ""
        } else {
            ", no zero-copy (regions in host memory)"
        }
    }

    /// Whether the sweep's cases run zero-copy: both ways, or eager only where there are no
    /// zero-copy buffers.
    fn modes(&self) -> &'static [bool] {
        if self.zero_copy {
            &[false, true]
        } else {
            &[false]
        }
    }

    /// One call on fresh data, checked against the f64 reference and across ranks.
    fn one_case(
        &self,
        dtype: DType,
        op: ReduceOp,
        count: usize,
        seed: u64,
        zero_copy: bool,
        in_place: bool,
    ) -> Result<()> {
        let comm = self.comm.peer();
        let c = self.comm.as_dyn();
        let stream = self.memory.stream();
        let inputs = all_inputs(dtype, count, seed, c.world_size());
        let mine = &inputs[c.rank()];
        let bytes = count * dtype.size();
        let mut out = self.memory.alloc(dtype, count)?;
        out.poison(0xff)?;
        let got = if zero_copy {
            let mut send = comm.alloc(bytes)?;
            send.upload(stream, 0, mine)?;
            if in_place {
                c.all_reduce_in_place(send.view_mut(dtype, 0, count, stream)?, op)?;
            } else {
                c.all_reduce(
                    send.view(dtype, 0, count, stream)?,
                    out.view_mut(0, count)?,
                    op,
                )?;
            }
            comm.synchronize(self.memory.raw_stream())?;
            let got = if in_place {
                let mut v = vec![0u8; bytes];
                send.download(stream, 0, &mut v)?;
                v
            } else {
                out.read()?
            };
            // Every rank must be done reading this rank's buffer before it is freed.
            self.bootstrap.barrier()?;
            drop(send);
            got
        } else {
            let mut send = self.memory.alloc(dtype, count)?;
            send.write(mine)?;
            if in_place {
                c.all_reduce_in_place(send.view_mut(0, count)?, op)?;
            } else {
                c.all_reduce(send.view(0, count)?, out.view_mut(0, count)?, op)?;
            }
            comm.synchronize(self.memory.raw_stream())?;
            if in_place { send.read()? } else { out.read()? }
        };
        self.verify(dtype, op, &inputs, &got, count).map_err(|e| {
            Error::Mismatch(format!(
                "{dtype} {op} x {count} (zero-copy {zero_copy}, in place {in_place}): {e}"
            ))
        })
    }

    fn verify(
        &self,
        dtype: DType,
        op: ReduceOp,
        inputs: &[Vec<u8>],
        got: &[u8],
        count: usize,
    ) -> Result<()> {
        let wrong = count_wrong(dtype, op, inputs, got, count);
        let digests = self.bootstrap.all_gather_bytes(&fnv(got).to_le_bytes())?;
        if wrong > 0 {
            return Err(Error::Mismatch(format!(
                "{wrong} of {count} elements wrong"
            )));
        }
        if digests.iter().any(|d| d != &digests[0]) {
            return Err(Error::Mismatch("results differ across ranks".into()));
        }
        Ok(())
    }

    /// The fused op on fresh random data at several shapes, against the f64 reference.
    fn fused(&self) -> Result<String> {
        let shapes: &[(usize, usize)] = if self.quick {
            &[(1, 4096), (3, 7168), (64, 8192)]
        } else {
            &[
                (1, 8),
                (1, 4096),
                (3, 7168),
                (5, 2056),
                (64, 8192),
                (200, 5120),
            ]
        };
        let mut worst = 0f64;
        for (i, &(rows, hidden)) in shapes.iter().enumerate() {
            worst = worst.max(self.fused_case(rows, hidden, 77 + i as u64)?);
        }
        Ok(format!(
            "{} shapes, worst rel. error {worst:.2e}",
            shapes.len()
        ))
    }

    fn fused_case(&self, rows: usize, hidden: usize, seed: u64) -> Result<f64> {
        let comm = self.comm.peer();
        let n = rows * hidden;
        let (rank, world) = (self.bootstrap.rank(), self.bootstrap.world_size());
        let xs = all_inputs(DType::BF16, n, seed, world);
        let res0 = all_inputs(DType::BF16, n, seed ^ 0xabc, 1).remove(0);
        let w = all_inputs(DType::BF16, hidden, seed ^ 0xdef, 1).remove(0);
        let eps = 1e-6f32;
        let mut x = self.memory.alloc(DType::BF16, n)?;
        let mut res = self.memory.alloc(DType::BF16, n)?;
        let mut out = self.memory.alloc(DType::BF16, n)?;
        let mut weight = self.memory.alloc(DType::BF16, hidden)?;
        x.write(&xs[rank])?;
        res.write(&res0)?;
        weight.write(&w)?;
        out.poison(0xff)?;
        comm.all_reduce_residual_rmsnorm(
            x.view(0, n)?,
            res.view_mut(0, n)?,
            out.view_mut(0, n)?,
            weight.view(0, hidden)?,
            eps,
        )?;
        comm.synchronize(self.memory.raw_stream())?;
        let (got_res, got_out) = (res.read()?, out.read()?);
        let (ref_res, ref_out) = fused_reference(&xs, &res0, &w, rows, hidden, eps);
        let (e_res, e_out) = (
            relative_error(&got_res, &ref_res),
            relative_error(&got_out, &ref_out),
        );
        let digests = self
            .bootstrap
            .all_gather_bytes(&fnv(&[got_res.as_slice(), &got_out].concat()).to_le_bytes())?;
        // bf16 outputs: a few bf16 ulps (2^-8) of rounding, relative in the l2 sense.
        if !(e_res < 1e-2 && e_out < 1e-2) {
            return Err(Error::Mismatch(format!(
                "fused {rows} x {hidden}: relative error residual {e_res:.3e}, out {e_out:.3e}"
            )));
        }
        if digests.iter().any(|d| d != &digests[0]) {
            return Err(Error::Mismatch(format!(
                "fused {rows} x {hidden}: results differ across ranks"
            )));
        }
        Ok(e_res.max(e_out))
    }

    /// One graph of three calls: 42 KB bf16 all-reduce (eager), an odd f32 avg all-reduce
    /// on a zero-copy buffer (device memory where there are none), a fused op (3 x 7168);
    /// replayed on new data three times.
    fn graph(&self) -> Result<String> {
        let comm = self.comm.peer();
        let c = self.comm.as_dyn();
        let stream = self.memory.stream();
        let (rank, world) = (c.rank(), c.world_size());
        let (n, n2, hidden) = (21504usize, 1001usize, 7168usize);
        let mut a_in = self.memory.alloc(DType::BF16, n)?;
        let mut a_out = self.memory.alloc(DType::BF16, n)?;
        let zero_copy = ZeroCopyMemory {
            comm,
            stream: stream.clone(),
        };
        let b_memory: &dyn TestMemory = if self.zero_copy {
            &zero_copy
        } else {
            &self.memory
        };
        let mut b_in = b_memory.alloc(DType::F32, n2)?;
        let mut b_out = self.memory.alloc(DType::F32, n2)?;
        let mut x = self.memory.alloc(DType::BF16, n)?;
        let mut res = self.memory.alloc(DType::BF16, n)?;
        let mut out = self.memory.alloc(DType::BF16, n)?;
        let mut weight = self.memory.alloc(DType::BF16, hidden)?;
        let enqueue = |a_out: &mut DeviceOwned,
                       b_out: &mut DeviceOwned,
                       res: &mut DeviceOwned,
                       out: &mut DeviceOwned|
         -> Result<()> {
            c.all_reduce(a_in.view(0, n)?, a_out.view_mut(0, n)?, ReduceOp::Sum)?;
            c.all_reduce(b_in.view(0, n2), b_out.view_mut(0, n2)?, ReduceOp::Avg)?;
            comm.all_reduce_residual_rmsnorm(
                x.view(0, n)?,
                res.view_mut(0, n)?,
                out.view_mut(0, n)?,
                weight.view(0, hidden)?,
                1e-6,
            )
        };
        // Warm up outside capture (module load, first touch).
        enqueue(&mut a_out, &mut b_out, &mut res, &mut out)?;
        comm.synchronize(self.memory.raw_stream())?;
        let captured = crate::graph::capture(stream, || {
            enqueue(&mut a_out, &mut b_out, &mut res, &mut out)
        });
        let group = comm.group();
        if comm.algorithm_for(n * 2) == Algorithm::OneshotCopy
            && group.host_memory()
            && group.sharing() > 1
        {
            // Copies of ranks that share a device cannot be captured (`admit_copies`).
            return match captured {
                Err(Error::Unsupported(e)) => {
                    comm.synchronize(self.memory.raw_stream())?;
                    Ok(format!("refused, as ranks share a device: {e}"))
                }
                Err(e) => Err(e),
                Ok(_) => Err(Error::Mismatch(
                    "copies captured in a graph while ranks share a device (host memory)".into(),
                )),
            };
        }
        let graph = captured?;
        crate::graph::line_up_to_launch(&graph, &self.memory, &*self.bootstrap)?;
        for replay in 0..3u64 {
            let a = all_inputs(DType::BF16, n, 1000 + replay, world);
            let b = all_inputs(DType::F32, n2, 2000 + replay, world);
            let xs = all_inputs(DType::BF16, n, 3000 + replay, world);
            let r0 = all_inputs(DType::BF16, n, 4000 + replay, 1).remove(0);
            let w = all_inputs(DType::BF16, hidden, 5000 + replay, 1).remove(0);
            a_in.write(&a[rank])?;
            b_in.write(&b[rank])?;
            x.write(&xs[rank])?;
            res.write(&r0)?;
            weight.write(&w)?;
            a_out.poison(0xff)?;
            b_out.poison(0xff)?;
            out.poison(0xff)?;
            // Peers must have their new inputs in place before anyone replays.
            self.bootstrap.barrier()?;
            graph.launch().map_err(driver_error)?;
            comm.synchronize(self.memory.raw_stream())?;
            self.verify(DType::BF16, ReduceOp::Sum, &a, &a_out.read()?, n)
                .map_err(|e| Error::Mismatch(format!("replay {replay}, bf16: {e}")))?;
            self.verify(DType::F32, ReduceOp::Avg, &b, &b_out.read()?, n2)
                .map_err(|e| Error::Mismatch(format!("replay {replay}, f32 avg: {e}")))?;
            let (_, ref_out) = fused_reference(&xs, &r0, &w, n / hidden, hidden, 1e-6);
            let got = out.read()?;
            let bad = ref_out
                .iter()
                .enumerate()
                .filter(|&(i, r)| {
                    let g = decode(DType::BF16, &got, i);
                    (g - r).abs().partial_cmp(&(0.02 * r.abs() + 0.02))
                        != Some(std::cmp::Ordering::Less)
                })
                .count();
            if bad > 0 {
                return Err(Error::Mismatch(format!(
                    "replay {replay}: {bad} of {n} fused outputs wrong"
                )));
            }
            self.bootstrap.barrier()?;
        }
        drop(graph);
        // Every rank must be done reading this rank's zero-copy buffer before it is freed.
        self.bootstrap.barrier()?;
        Ok(format!(
            "eager + zero-copy all-reduce + fused op captured, 3 replays on new data{}",
            self.eager_only()
        ))
    }
}

/// Mailboxes of the small-mailbox check: below the sizes where pushes over host memory
/// start to go as data and flags, so that messages between the two take the other path.
const SMALL_MAILBOX_BYTES: usize = 4 << 10;

/// A push with mailboxes of [`SMALL_MAILBOX_BYTES`]: messages up to them, just past them
/// and far past them (by data and flags over host memory, by the pull of the same shape on
/// device memory), against the f64 reference.
fn small_mailboxes(
    bootstrap: &Arc<dyn Bootstrap>,
    opts: &Options,
    algo: Algorithm,
) -> Result<String> {
    let check = Check::with_mailboxes(bootstrap, opts, algo, SMALL_MAILBOX_BYTES)?;
    let mut cases = 0;
    let mut seed = 4242u64;
    for dtype in [DType::BF16, DType::F32] {
        let fits = SMALL_MAILBOX_BYTES / dtype.size();
        for count in [fits - 1, fits, fits + 1, 3 * fits + 5, 21504, 65537] {
            for op in [ReduceOp::Sum, ReduceOp::Max] {
                seed += 1;
                check.one_case(dtype, op, count, seed, false, false)?;
                cases += 1;
            }
        }
    }
    seed += 1;
    check.one_case(DType::BF16, ReduceOp::Sum, 21503, seed, false, true)?;
    cases += 1;
    Ok(format!(
        "{cases} cases, mailboxes of {SMALL_MAILBOX_BYTES} bytes"
    ))
}

/// Signals around a ring (rank r to r+1, waits for r-1), then a barrier, on each channel.
fn primitives(bootstrap: &Arc<dyn Bootstrap>, opts: &Options) -> Result<String> {
    let ctx = probe::context(device_of(&**bootstrap)?)?;
    let joined;
    let heap;
    let group = match opts.backend {
        Backend::SymmCuda => {
            heap = DeviceHeap::rendezvous(&**bootstrap, &ctx, 1 << 20, opts.backing, 0..0)?;
            heap.group()
        }
        Backend::Ipc => {
            let config = PeerConfig {
                max_bytes: 1 << 20,
                timeout: Some(timeout_or(Duration::from_secs(60))),
                ..PeerConfig::default()
            };
            joined = GpuComm::join(opts.backend, bootstrap, ctx.ordinal(), config, opts.backing)?;
            joined.peer().group()
        }
    };
    let (me, n) = (group.rank(), group.world_size());
    let stream = ctx.new_stream().map_err(driver_error)?;
    let s = raw_stream(&stream);
    if n > 1 {
        for round in 0..50 {
            let channel = round % CHANNELS;
            group.put_signal(s, (me + 1) % n, channel)?;
            group.wait_signal(s, (me + n - 1) % n, channel, group.timeout())?;
            group.barrier(s, channel)?;
        }
    }
    group.synchronize(s)?;
    bootstrap.barrier()?;
    Ok(format!(
        "50 rounds of ring signal + barrier over {CHANNELS} channels"
    ))
}

/// A communicator for a check whose calls fail: `algo` forced, waits bounded by `bound`,
/// calls compared on the device alone; and memory on a stream of its own.
fn failing_comm(
    bootstrap: &Arc<dyn Bootstrap>,
    opts: &Options,
    algo: Algorithm,
    bound: Duration,
) -> Result<(GpuComm, DeviceMemory)> {
    let config = PeerConfig {
        max_bytes: 1 << 20,
        lamport_max_bytes: 1 << 20,
        algorithm: Some(algo),
        timeout: Some(bound),
        agree_on_host: false,
        ..PeerConfig::default()
    };
    let device = device_of(&**bootstrap)?;
    let comm = GpuComm::join(opts.backend, bootstrap, device, config, opts.backing)?;
    let memory =
        DeviceMemory::with_stream(comm.peer().context().new_stream().map_err(driver_error)?);
    Ok((comm, memory))
}

/// The last rank stays away: the others must time out, then refuse work.
fn timeout_check(
    bootstrap: &Arc<dyn Bootstrap>,
    opts: &Options,
    algo: Algorithm,
) -> Result<String> {
    let bound = Duration::from_secs(2);
    let (comm, memory) = failing_comm(bootstrap, opts, algo, bound)?;
    let c = comm.as_dyn();
    let absent = c.world_size() - 1;
    let mut detail = String::from("absent rank");
    if c.rank() != absent {
        let count = 4097;
        let mut buf = memory.alloc(DType::BF16, count)?;
        buf.write(&vec![0x3fu8; count * 2])?;
        let started = Instant::now();
        c.all_reduce_in_place(buf.view_mut(0, count)?, ReduceOp::Sum)?;
        let result = comm.peer().synchronize(memory.raw_stream());
        let waited = started.elapsed();
        match result {
            Err(Error::Timeout { what, .. }) if waited < bound + Duration::from_secs(10) => {
                detail = format!("timed out after {:.2}s: {what}", waited.as_secs_f64());
            }
            other => {
                return Err(Error::Mismatch(format!(
                    "expected a timeout within the bound, got {other:?} after {waited:?}"
                )));
            }
        }
        match c.all_reduce_in_place(buf.view_mut(0, count)?, ReduceOp::Sum) {
            Err(Error::Aborted(_)) => {}
            other => {
                return Err(Error::Mismatch(format!(
                    "a timed-out communicator accepted work: {other:?}"
                )));
            }
        }
        if c.barrier().is_ok() {
            return Err(Error::Mismatch("barrier worked after a timeout".into()));
        }
    }
    // The absent rank keeps its region mapped until everyone is done.
    bootstrap.barrier()?;
    Ok(detail)
}

/// Rank 0 all-reduces 21504 bf16 (42 KB), every other rank 21440: a launch of many blocks,
/// where over host memory one block compares the calls for all. Every rank must report
/// `Error::Mismatch` naming both counts, well within the bound (the comparison, not a
/// timeout), and write nothing into the output.
fn disagreement_check(
    bootstrap: &Arc<dyn Bootstrap>,
    opts: &Options,
    algo: Algorithm,
) -> Result<String> {
    let bound = Duration::from_secs(10);
    let (comm, memory) = failing_comm(bootstrap, opts, algo, bound)?;
    let c = comm.as_dyn();
    let (mine, theirs) = if c.rank() == 0 {
        (21504, 21440)
    } else {
        (21440, 21504)
    };
    let mut input = memory.alloc(DType::BF16, mine)?;
    input.write(&vec![0x3fu8; mine * 2])?;
    let mut output = memory.alloc(DType::BF16, mine)?;
    let poison = vec![0x7bu8; mine * 2];
    output.write(&poison)?;
    let started = Instant::now();
    let result = c
        .all_reduce(
            input.view(0, mine)?,
            output.view_mut(0, mine)?,
            ReduceOp::Sum,
        )
        .and_then(|()| comm.peer().synchronize(memory.raw_stream()));
    let waited = started.elapsed();
    let detail = match result {
        Err(Error::Mismatch(what))
            if waited < bound / 2
                && what.contains(&mine.to_string())
                && what.contains(&theirs.to_string()) =>
        {
            format!("{:.3}s: {what}", waited.as_secs_f64())
        }
        other => {
            return Err(Error::Mismatch(format!(
                "expected a mismatch naming {mine} and {theirs}, got {other:?} after {waited:?}"
            )));
        }
    };
    if output.read()? != poison {
        return Err(Error::Mismatch(
            "a call the ranks disagree about wrote output".into(),
        ));
    }
    bootstrap.barrier()?;
    Ok(detail)
}

fn fd_count() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count())
        .unwrap_or(0)
}

fn shm_count() -> usize {
    std::fs::read_dir("/dev/shm")
        .map(|d| d.count())
        .unwrap_or(0)
}

/// Mappings of the heap's memfd segments in this process (symm-cuda's host backing).
fn segment_maps() -> usize {
    std::fs::read_to_string("/proc/self/maps")
        .map(|m| m.lines().filter(|l| l.contains("memfd:comm-symm")).count())
        .unwrap_or(0)
}

/// The host's available memory in MiB (pinned segments that leak lower it), 0 if unknown.
fn available_host_mib() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemAvailable:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kib| kib >> 10)
}

fn free_device_memory() -> Result<usize> {
    result::mem_get_info()
        .map(|(free, _)| free)
        .map_err(driver_error)
}

/// Registration + free, `cycles` times (after 10 to warm up): no growth in device memory,
/// descriptors, shm entries or heap segment mappings, no loss of host memory (the host
/// backing pins its segments). symm-cuda: heap rendezvous; ipc: zero-copy buffers.
fn cycles_check(bootstrap: &Arc<dyn Bootstrap>, opts: &Options) -> Result<String> {
    let device = device_of(&**bootstrap)?;
    let ctx = probe::context(device)?;
    ctx.bind_to_thread().map_err(driver_error)?;
    let comm = match opts.backend {
        Backend::Ipc => Some(GpuComm::join(
            opts.backend,
            bootstrap,
            device,
            PeerConfig {
                max_bytes: 1 << 16,
                lamport_max_bytes: 1 << 16,
                timeout: Some(timeout_or(Duration::from_secs(60))),
                ..PeerConfig::default()
            },
            opts.backing,
        )?),
        Backend::SymmCuda => None,
    };
    let one = |i: usize| -> Result<()> {
        let bytes = (2 << 20) + i % 3 * 4096;
        match &comm {
            Some(comm) => {
                let buf = comm.peer().alloc(bytes)?;
                // Peers must be done with this buffer's mapping before it goes.
                bootstrap.barrier()?;
                drop(buf);
            }
            None => {
                let heap =
                    DeviceHeap::rendezvous(&**bootstrap, &ctx, bytes, opts.backing, 0..4096)?;
                bootstrap.barrier()?;
                drop(heap);
            }
        }
        Ok(())
    };
    for i in 0..10 {
        one(i)?;
    }
    bootstrap.barrier()?;
    let (mem0, fd0, shm0) = (free_device_memory()?, fd_count(), shm_count());
    let (maps0, host0) = (segment_maps(), available_host_mib());
    let started = Instant::now();
    for i in 0..opts.cycles {
        one(i)?;
    }
    bootstrap.barrier()?;
    let (mem1, fd1, shm1) = (free_device_memory()?, fd_count(), shm_count());
    let (maps1, host1) = (segment_maps(), available_host_mib());
    let per = started.elapsed().as_secs_f64() * 1e3 / opts.cycles.max(1) as f64;
    let grown = mem0.saturating_sub(mem1);
    let detail = format!(
        "{per:.2} ms/cycle; free device memory {} -> {} MiB, fds {fd0} -> {fd1}, /dev/shm \
         {shm0} -> {shm1}, segment maps {maps0} -> {maps1}, available host memory {host0} -> \
         {host1} MiB",
        mem0 >> 20,
        mem1 >> 20
    );
    // Device memory is per GPU (every rank's, at the same barrier); allow one granule of
    // driver bookkeeping. Host memory is the machine's: allow other processes some noise.
    // The driver opens handles of its own now and then: a few per process, more with more
    // ranks in it (8 threads once opened 3 during 100 cycles); a leak grows with the cycles.
    let fds_leaked = fd1 > fd0 + 2 + bootstrap.local_world_size();
    if grown > 2 << 20 || fds_leaked || shm1 > shm0 || maps1 > maps0 || host0 > host1 + 256 {
        return Err(Error::Mismatch(format!("resources grew: {detail}")));
    }
    Ok(detail)
}
