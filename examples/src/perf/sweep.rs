//! The sweep one rank runs: for each size, warm up, time, optionally check, and gather.
//!
//! Every rank runs [`run_rank`] with its own communicator. Per size and placement (out of
//! place, then in place, as nccl-tests does) it fills its input, runs the warm-up calls,
//! meets the others at a barrier, then times each call on its own clock and keeps the
//! median. A checked call follows on fresh data with poisoned outputs. The ranks then
//! exchange (median, #wrong, fingerprint) through the bootstrap, not through the
//! communicator under test (a GPU backend may not take host memory),
//! so every rank ends with the same [`Row`]: time is the slowest rank's median, #wrong
//! the sum over ranks, and the fingerprints must all agree.
//!
//! In graph mode (`--graph`, device backends) the timed calls of a size and placement are
//! captured into one CUDA graph after the warm-up, and its replays are timed instead
//! (`sweep/graph.rs`); `--tune` measures each backend in both modes, one table each.
//!
//! [`run_in_process`] starts the ranks as threads; under a launcher the binary calls
//! [`run_rank`] once per process.

mod device;
mod graph;

use std::time::{Duration, Instant};

use comm_core::{
    Bootstrap, BufferMut, BufferRef, Capabilities, Collective, Communicator, DType, Error,
    MemoryLocation, ReduceOp, Result, bf16, f16,
};

use super::data::{Inputs, Value, fingerprint, mix64, poison};
use super::launches::{Launches, capturable};
use comm_select::Launch;

use super::report::{Row, Timing, algbw, busbw};
use crate::backends::RankContext;
use crate::launch::run_threads;

/// Most timed iterations per size when the user gives no count (fast calls get this).
pub const DEFAULT_ITERS: usize = 20;
/// Most warm-up iterations per size when the user gives no count.
pub const DEFAULT_WARMUP: usize = 5;
/// Without `--iters`, a size gets as many timed calls as fit in this many seconds,
/// between [`MIN_AUTO_ITERS`] and [`DEFAULT_ITERS`]: a default sweep to 64 MiB then
/// takes seconds on a fast backend and well under a minute on a slow one.
const ITERS_BUDGET_S: f64 = 0.25;
/// Likewise for warm-up calls, between 1 and [`DEFAULT_WARMUP`].
const WARMUP_BUDGET_S: f64 = 0.05;
/// The fewest timed iterations the automatic count gives.
const MIN_AUTO_ITERS: usize = 3;
/// Most calls of the first size before anything is timed (see [`Run::settle`])...
const SETTLE_CALLS: usize = 500;
/// ... and the time they may take on the slowest rank: at 64 MiB one host call can take
/// half a second, and 500 of them made a one-size sweep look hung.
const SETTLE_BUDGET_S: f64 = 0.2;

/// What to sweep.
#[derive(Debug, Clone, PartialEq)]
pub struct SweepConfig {
    /// Message sizes in bytes.
    pub sizes: Vec<u64>,
    /// Element type.
    pub dtype: DType,
    /// Reduction operator.
    pub op: ReduceOp,
    /// Timed iterations per size; `None` fits them to a time budget (see [`iterations`]).
    pub iters: Option<usize>,
    /// Warm-up iterations per size; `None` fits them to a time budget.
    pub warmup: Option<usize>,
    /// Check results.
    pub check: bool,
    /// Measure out-of-place calls (separate send and receive buffers).
    pub out_of_place: bool,
    /// Measure in-place calls (one buffer); with `out_of_place`, both are measured.
    pub in_place: bool,
    /// Seed of the input data; every rank must use the same.
    pub seed: u64,
    /// Which of a backend's named algorithms to measure, one table each.
    pub algorithms: Algorithms,
    /// Eager calls, graph replays, or both (one table each).
    pub launches: Launches,
}

impl SweepConfig {
    /// The placements to measure, as `in_place` flags, out of place first; out of place
    /// alone when the config names neither.
    pub fn placements(&self) -> Vec<bool> {
        match (self.out_of_place, self.in_place) {
            (_, false) => vec![false],
            (false, true) => vec![true],
            (true, true) => vec![false, true],
        }
    }
}

/// Which of a backend's named algorithms ([`Capabilities::algorithms`]) to measure.
///
/// [`Capabilities::algorithms`]: comm_core::Capabilities::algorithms
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Algorithms {
    /// The backend's own choice only.
    #[default]
    Default,
    /// Every named algorithm (the backend's own choice for backends without any).
    All,
    /// These, where the backend has them; backends without named algorithms run their
    /// own choice.
    Named(Vec<String>),
}

/// One size of the sweep, as run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Point {
    /// Bytes per rank (`count * dtype size`).
    pub bytes: u64,
    /// Elements per rank.
    pub count: usize,
}

/// The sizes as element counts: sizes are rounded down to whole elements, and those that
/// hold none or repeat an earlier count are dropped (an f64 sweep from 1 byte starts at 8).
pub fn plan(cfg: &SweepConfig) -> Vec<Point> {
    let elem = cfg.dtype.size() as u64;
    let mut points: Vec<Point> = Vec::new();
    for &size in &cfg.sizes {
        let count = size / elem;
        if count == 0 || points.last().is_some_and(|p| p.count as u64 >= count) {
            continue;
        }
        points.push(Point {
            bytes: count * elem,
            count: count as usize,
        });
    }
    points
}

/// (warm-up, timed) iteration counts for a call that takes `call_s` seconds on the
/// slowest rank: the user's counts where given, else as many as fit the time budgets.
/// The warm-up count includes the call that measured `call_s`, so it is at least 1.
pub fn iterations(call_s: f64, warmup: Option<usize>, iters: Option<usize>) -> (usize, usize) {
    let fit = |budget: f64, least: usize, most: usize| {
        ((budget / call_s.max(1e-9)).round() as usize).clamp(least, most)
    };
    let iters = iters.unwrap_or_else(|| fit(ITERS_BUDGET_S, MIN_AUTO_ITERS, DEFAULT_ITERS));
    let warmup = warmup
        .unwrap_or_else(|| fit(WARMUP_BUDGET_S, 1, DEFAULT_WARMUP))
        .max(1);
    (warmup, iters)
}

/// Warm-up calls of placement `index` of a size whose first placement got `first`: the
/// call that fitted the counts was that one's first warm-up call, the others get all.
fn warmup_calls(cfg: &SweepConfig, index: usize, first: usize) -> usize {
    match (index, cfg.warmup) {
        (0, _) => first,
        (_, Some(given)) => given,
        (_, None) => first + 1,
    }
}

/// What rank 0 reports while it sweeps.
#[derive(Debug)]
pub enum Event<'a> {
    /// A table (one backend, one algorithm, one launch mode) begins.
    Begin {
        /// Backend name.
        backend: &'a str,
        /// Algorithm, when one was set.
        algorithm: Option<&'a str>,
        /// Eager calls or graph replays.
        launch: Launch,
    },
    /// Size `index` of `total` (counted from 0) is starting.
    Starting {
        /// Backend name.
        backend: &'a str,
        /// Index of the size.
        index: usize,
        /// Number of sizes.
        total: usize,
        /// Its bytes.
        bytes: u64,
    },
    /// A size is done.
    Finished(&'a Row),
    /// A table is done; these are its rows.
    End(&'a [Row]),
    /// Something the user should know (sizes the backend cannot take, ...).
    Note {
        /// Backend name.
        backend: &'a str,
        /// What happened.
        message: String,
    },
}

/// Builds one rank's communicator (a registry constructor, or a test's).
pub type Create<'a> = dyn Fn(&RankContext) -> Result<Box<dyn Communicator>> + Sync + 'a;

/// Runs the sweep of `backend` on `ranks` threads of this process; returns the rows.
/// `observe` sees rank 0's events.
pub fn run_in_process(
    backend: &str,
    create: &Create<'_>,
    ranks: usize,
    cfg: &SweepConfig,
    observe: &(dyn Fn(Event<'_>) + Sync),
) -> Result<Vec<Row>> {
    let quiet = |_: Event<'_>| {};
    let results = run_threads(ranks, |ctx| {
        let observe: &(dyn Fn(Event<'_>) + Sync) = if ctx.rank() == 0 { observe } else { &quiet };
        run_rank(&ctx, backend, create, cfg, observe)
    })?;
    // Every rank ends with the same rows; an error on any rank fails the run.
    let mut rows = None;
    for result in results {
        let r = result?;
        rows.get_or_insert(r);
    }
    Ok(rows.unwrap_or_default())
}

/// Runs the sweep of `backend` as the rank of `ctx`: builds its communicator with
/// `create`, then measures every size, once per algorithm asked for. Collective: every
/// rank must call it.
pub fn run_rank(
    ctx: &RankContext,
    backend: &str,
    create: &Create<'_>,
    cfg: &SweepConfig,
    observe: &(dyn Fn(Event<'_>) + Sync),
) -> Result<Vec<Row>> {
    // `auto` is built as its concrete type, so that each row can say what it chose.
    let selector = if backend == "auto" {
        Some(crate::backends::create_select(ctx)?)
    } else {
        None
    };
    let boxed;
    let comm: &dyn Communicator = match &selector {
        Some(s) => s,
        None => {
            boxed = create(ctx)?;
            &*boxed
        }
    };
    if comm.world_size() != ctx.world_size() || comm.rank() != ctx.rank() {
        return Err(Error::Mismatch(format!(
            "{backend}: communicator is rank {} of {}, bootstrap says rank {} of {}",
            comm.rank(),
            comm.world_size(),
            ctx.rank(),
            ctx.world_size()
        )));
    }
    let launches = launch_modes(comm, backend, selector.is_some(), cfg.launches, observe)?;
    let mut rows = Vec::new();
    for algorithm in algorithms(comm, backend, &cfg.algorithms, observe)? {
        comm.set_algorithm(algorithm.as_deref())?;
        for &launch in &launches {
            let run = Run {
                comm,
                selector: selector.as_ref(),
                ctl: &**ctx.bootstrap(),
                backend,
                algorithm: algorithm.as_deref(),
                launch,
                bootstrap: ctx.mode().name(),
                cfg,
                observe,
            };
            observe(Event::Begin {
                backend,
                algorithm: run.algorithm,
                launch,
            });
            let table = run.sweep_dtype();
            let table = match agree_on_table(ctx, &cfg.algorithms, table)? {
                Table::Rows(table) => table,
                Table::Skipped(why) => {
                    observe(Event::Note {
                        backend,
                        message: format!(
                            "{} in {launch} mode: skipped: {why}",
                            run.algorithm.unwrap_or("its own choice")
                        ),
                    });
                    continue;
                }
            };
            observe(Event::End(&table));
            rows.extend(table);
        }
    }
    Ok(rows)
}

/// A table's outcome as every rank sees it (see [`agree_on_table`]).
enum Table {
    Rows(Vec<Row>),
    /// Refused as unsupported on every rank, for this reason.
    Skipped(String),
}

/// A table's outcome as every rank sees it: its rows, or - where every algorithm was asked
/// for (`--algo all`) and every rank's table was refused as unsupported (an algorithm a
/// configuration cannot run, such as copies captured on a shared device) - skipped, so that
/// the sweep goes on with the next table. Any other error ends the sweep. Collective: the
/// ranks agree through the bootstrap, so none goes on while another stops.
fn agree_on_table(
    ctx: &RankContext,
    wanted: &Algorithms,
    table: Result<Vec<Row>>,
) -> Result<Table> {
    const OK: u8 = 0;
    const UNSUPPORTED: u8 = 1;
    const FAILED: u8 = 2;
    let mine = match &table {
        Ok(_) => OK,
        Err(Error::Unsupported(_)) if *wanted == Algorithms::All => UNSUPPORTED,
        Err(_) => FAILED,
    };
    // Where the exchange itself fails (a peer gone), the table's own error says more.
    let all = match ctx.bootstrap().all_gather_bytes(&[mine]) {
        Ok(all) => all,
        Err(e) => return Err(table.err().unwrap_or(e)),
    };
    let every = |code: u8| all.iter().all(|v| v.first() == Some(&code));
    match table {
        Err(Error::Unsupported(why)) if every(UNSUPPORTED) => Ok(Table::Skipped(why)),
        Err(e) => Err(e),
        Ok(_) if !every(OK) => Err(Error::Mismatch(
            "another rank's table of this algorithm failed".into(),
        )),
        Ok(rows) => Ok(Table::Rows(rows)),
    }
}

/// The launch modes to measure `comm` in; a note when `--tune` cannot have its graph rows.
fn launch_modes(
    comm: &dyn Communicator,
    backend: &str,
    selects: bool,
    wanted: Launches,
    observe: &(dyn Fn(Event<'_>) + Sync),
) -> Result<Vec<Launch>> {
    let caps = comm.capabilities();
    let on_device = on_device(caps);
    let capturable = capturable(caps, on_device, selects);
    if let (Launches::Both, true, Err(why)) = (wanted, on_device, &capturable) {
        observe(Event::Note {
            backend,
            message: format!("{why}: eager rows only"),
        });
    }
    wanted.of_backend(backend, capturable)
}

/// Whether a backend with `caps` is measured on device memory: one that takes only device
/// memory, or one that takes both (`auto` over GPU and host backends) where there is a
/// GPU, since that is what it is for.
fn on_device(caps: &Capabilities) -> bool {
    let has_gpu = || comm_core::cuda::device_count().is_ok_and(|n| n > 0);
    caps.device_memory && (!caps.host_memory || has_gpu())
}

/// The algorithms to measure on `comm`, `None` standing for the backend's own choice.
fn algorithms(
    comm: &dyn Communicator,
    backend: &str,
    wanted: &Algorithms,
    observe: &(dyn Fn(Event<'_>) + Sync),
) -> Result<Vec<Option<String>>> {
    let has = &comm.capabilities().algorithms;
    match wanted {
        Algorithms::Default => Ok(vec![None]),
        _ if has.is_empty() => {
            if matches!(wanted, Algorithms::Named(_)) {
                observe(Event::Note {
                    backend,
                    message: "has no named algorithms: measuring its own choice".into(),
                });
            }
            Ok(vec![None])
        }
        Algorithms::All => Ok(has.iter().cloned().map(Some).collect()),
        Algorithms::Named(names) => {
            let (known, unknown): (Vec<&String>, Vec<&String>) =
                names.iter().partition(|n| has.contains(n));
            if known.is_empty() {
                return Err(Error::Unsupported(format!(
                    "{backend} has none of the algorithms {} (it has: {})",
                    names.join(", "),
                    has.join(", ")
                )));
            }
            if !unknown.is_empty() {
                let unknown: Vec<&str> = unknown.iter().map(|s| s.as_str()).collect();
                observe(Event::Note {
                    backend,
                    message: format!(
                        "has no algorithm {} (it has: {})",
                        unknown.join(", "),
                        has.join(", ")
                    ),
                });
            }
            Ok(known.into_iter().map(|n| Some(n.clone())).collect())
        }
    }
}

/// One rank's sweep of one backend with one algorithm.
struct Run<'a> {
    comm: &'a dyn Communicator,
    /// The selector behind `comm` when the backend is `auto`.
    selector: Option<&'a comm_select::SelectComm>,
    ctl: &'a dyn Bootstrap,
    backend: &'a str,
    algorithm: Option<&'a str>,
    /// Eager calls, or replays of a graph of them (device memory only).
    launch: Launch,
    bootstrap: &'a str,
    cfg: &'a SweepConfig,
    observe: &'a (dyn Fn(Event<'_>) + Sync),
}

impl Run<'_> {
    fn sweep_dtype(&self) -> Result<Vec<Row>> {
        let run = self;
        match self.cfg.dtype {
            DType::F32 => run.sweep::<f32>(),
            DType::F64 => run.sweep::<f64>(),
            DType::F16 => run.sweep::<f16>(),
            DType::BF16 => run.sweep::<bf16>(),
            DType::I32 => run.sweep::<i32>(),
            DType::I64 => run.sweep::<i64>(),
            DType::U8 => run.sweep::<u8>(),
            other => Err(Error::Unsupported(format!(
                "allreduce-perf does not know dtype {other} yet"
            ))),
        }
    }
}

/// What each rank contributes to a row.
struct Measured {
    median_us: f64,
    wrong: u64,
    fingerprint: u64,
    /// Eager device rows: per call back to back, and the host's enqueue time per call
    /// (NaN: not measured).
    back_to_back_us: f64,
    host_us: f64,
}

impl Measured {
    const BYTES: usize = 40;

    fn unchecked(median_us: f64) -> Self {
        Measured {
            median_us,
            wrong: 0,
            fingerprint: 0,
            back_to_back_us: f64::NAN,
            host_us: f64::NAN,
        }
    }

    fn encode(&self) -> [u8; Self::BYTES] {
        let mut out = [0; Self::BYTES];
        out[..8].copy_from_slice(&self.median_us.to_le_bytes());
        out[8..16].copy_from_slice(&self.wrong.to_le_bytes());
        out[16..24].copy_from_slice(&self.fingerprint.to_le_bytes());
        out[24..32].copy_from_slice(&self.back_to_back_us.to_le_bytes());
        out[32..].copy_from_slice(&self.host_us.to_le_bytes());
        out
    }

    fn decode(bytes: &[u8]) -> Result<Self> {
        let word = |i: usize| -> Result<[u8; 8]> {
            bytes
                .get(i * 8..i * 8 + 8)
                .and_then(|w| w.try_into().ok())
                .ok_or_else(|| {
                    Error::Bootstrap(format!("bad timing record of {} bytes", bytes.len()))
                })
        };
        Ok(Measured {
            median_us: f64::from_le_bytes(word(0)?),
            wrong: u64::from_le_bytes(word(1)?),
            fingerprint: u64::from_le_bytes(word(2)?),
            back_to_back_us: f64::from_le_bytes(word(3)?),
            host_us: f64::from_le_bytes(word(4)?),
        })
    }
}

impl Run<'_> {
    fn sweep<T: Value>(&self) -> Result<Vec<Row>> {
        let cfg = self.cfg;
        let caps = self.comm.capabilities();
        let mut points = plan(cfg);
        if let Some(max) = caps.max_bytes {
            let before = points.len();
            points.retain(|p| p.bytes as usize <= max);
            if points.len() < before {
                (self.observe)(Event::Note {
                    backend: self.backend,
                    message: format!(
                        "skipping {} size(s) above its maximum of {max} bytes",
                        before - points.len()
                    ),
                });
            }
        }
        if on_device(caps) {
            return self.sweep_device(points);
        }
        let smallest = points.first().map_or(0, |p| p.bytes as usize);
        caps.check(
            self.backend,
            Collective::AllReduce,
            cfg.dtype,
            Some(cfg.op),
            smallest,
            MemoryLocation::Host,
        )?;
        let use_comm_barrier = caps.collectives.contains(&Collective::Barrier);
        let largest = points.iter().map(|p| p.count).max().unwrap_or(0);
        let recv_len = |count: usize| if cfg.out_of_place { count } else { 0 };
        let mut send = vec![T::poison(); largest];
        let mut recv = vec![T::poison(); recv_len(largest)];
        // Threads that are still starting would make the first size's first call look
        // slow, and the iteration count fitted to it too small.
        self.sync(use_comm_barrier)?;
        let first = points.first().map_or(0, |p| p.count);
        let in_place = cfg.placements()[0];
        self.settle(|| self.call(in_place, &mut send[..first], &mut recv[..recv_len(first)]))?;
        let mut rows = Vec::with_capacity(points.len());
        for (index, point) in points.iter().enumerate() {
            (self.observe)(Event::Starting {
                backend: self.backend,
                index,
                total: points.len(),
                bytes: point.bytes,
            });
            let send = &mut send[..point.count];
            let recv = &mut recv[..recv_len(point.count)];
            let (iters, mine) = self.measure(index, send, recv, use_comm_barrier)?;
            let row = self.gather(point, iters, &mine, false)?;
            (self.observe)(Event::Finished(&row));
            rows.push(row);
        }
        Ok(rows)
    }

    /// Runs calls of the first size before anything is timed: right after start-up,
    /// processes are still faulting pages in and being placed on cores, and the first
    /// table of a run came out several times slower than later ones. Batches grow by
    /// doubling until [`SETTLE_CALLS`] calls are made or [`SETTLE_BUDGET_S`] has passed on
    /// the slowest rank; the ranks agree after each batch, so all make the same calls.
    fn settle(&self, mut call: impl FnMut() -> Result<()>) -> Result<()> {
        let start = Instant::now();
        let (mut done, mut batch) = (0, 1);
        while done < SETTLE_CALLS {
            for _ in 0..batch {
                call()?;
            }
            done += batch;
            if self.slowest(start.elapsed().as_secs_f64())? >= SETTLE_BUDGET_S {
                break;
            }
            batch = (2 * batch).min(SETTLE_CALLS - done);
        }
        Ok(())
    }

    /// Times one size in each placement, then checks it if asked; returns the timed
    /// iteration count and one measurement per placement.
    fn measure<T: Value>(
        &self,
        index: usize,
        send: &mut [T],
        recv: &mut [T],
        use_comm_barrier: bool,
    ) -> Result<(usize, Vec<Measured>)> {
        let (cfg, rank, ranks) = (self.cfg, self.comm.rank(), self.comm.world_size());
        let seed = |purpose: u64| mix64(cfg.seed ^ mix64((index as u64) << 8 | purpose));
        let placements = cfg.placements();
        Inputs::new::<T>(seed(1), cfg.op, ranks).fill(rank, send);
        let (warmup, iters) = match (cfg.warmup, cfg.iters) {
            (Some(warmup), Some(iters)) => (warmup, iters),
            // Counts that fit a time budget: the first warm-up call measures, and the
            // ranks agree on the slowest one's time, so that all make the same calls.
            (warmup, iters) => {
                let start = Instant::now();
                self.call(placements[0], send, recv)?;
                let slowest = self.slowest(start.elapsed().as_secs_f64())?;
                let (warmup, iters) = iterations(slowest, warmup, iters);
                (warmup - 1, iters)
            }
        };
        let mut measured = Vec::with_capacity(placements.len());
        for (i, &in_place) in placements.iter().enumerate() {
            for _ in 0..warmup_calls(cfg, i, warmup) {
                self.call(in_place, send, recv)?;
            }
            self.sync(use_comm_barrier)?;
            let mut times = Vec::with_capacity(iters);
            for _ in 0..iters {
                let start = Instant::now();
                self.call(in_place, send, recv)?;
                times.push(start.elapsed());
            }
            let median_us = per_call_us(median(&mut times), 1);
            if !cfg.check {
                measured.push(Measured::unchecked(median_us));
                continue;
            }
            let inputs = Inputs::new::<T>(seed(2), cfg.op, ranks);
            inputs.fill(rank, send);
            poison(recv);
            self.call(in_place, send, recv)?;
            let out: &[T] = if in_place { send } else { recv };
            measured.push(Measured {
                wrong: inputs.count_wrong(out),
                fingerprint: fingerprint(BufferRef::host(out).host_bytes().unwrap_or_default()),
                ..Measured::unchecked(median_us)
            });
        }
        Ok((iters, measured))
    }

    /// Waits for every rank: on the communicator under test when it has a barrier.
    fn sync(&self, use_comm_barrier: bool) -> Result<()> {
        if use_comm_barrier {
            self.comm.barrier()
        } else {
            self.ctl.barrier()
        }
    }

    fn call<T: Value>(&self, in_place: bool, send: &mut [T], recv: &mut [T]) -> Result<()> {
        if in_place {
            self.comm
                .all_reduce_in_place(BufferMut::host(send), self.cfg.op)
        } else {
            self.comm
                .all_reduce(BufferRef::host(send), BufferMut::host(recv), self.cfg.op)
        }
    }

    /// The largest of every rank's `seconds`.
    fn slowest(&self, seconds: f64) -> Result<f64> {
        let all = self.ctl.all_gather_bytes(&seconds.to_le_bytes())?;
        all.iter()
            .map(|b| {
                b.as_slice()
                    .try_into()
                    .map(f64::from_le_bytes)
                    .map_err(|_| Error::Bootstrap(format!("bad time record of {} bytes", b.len())))
            })
            .try_fold(0.0, |max, t| t.map(|t| f64::max(max, t)))
    }

    /// Exchanges every rank's measurements (one per placement) and builds the row (the
    /// same on every rank).
    fn gather(&self, point: &Point, iters: usize, mine: &[Measured], device: bool) -> Result<Row> {
        let record: Vec<u8> = mine.iter().flat_map(Measured::encode).collect();
        let all = self
            .ctl
            .all_gather_bytes(&record)?
            .iter()
            .map(|b| {
                b.chunks(Measured::BYTES)
                    .map(Measured::decode)
                    .collect::<Result<Vec<_>>>()
            })
            .collect::<Result<Vec<_>>>()?;
        let ranks = all.len();
        let checked = self.cfg.check;
        let timing = |slot: usize| -> Result<Timing> {
            let got = all
                .iter()
                .map(|m| {
                    m.get(slot).ok_or_else(|| {
                        Error::Bootstrap(format!("a rank sent {} measurement(s)", m.len()))
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            let time_us = got.iter().map(|m| m.median_us).fold(0.0, f64::max);
            // NaN (not measured) on any rank leaves the figure out.
            let slowest = |f: fn(&Measured) -> f64| {
                got.iter()
                    .map(|m| f(m))
                    .try_fold(0.0, |most: f64, x: f64| x.is_finite().then(|| most.max(x)))
            };
            let alg = algbw(point.bytes, time_us);
            Ok(Timing {
                time_us,
                algbw: alg,
                busbw: busbw(alg, ranks),
                wrong: checked.then(|| got.iter().map(|m| m.wrong).sum()),
                identical: checked.then(|| got.iter().all(|m| m.fingerprint == got[0].fingerprint)),
                back_to_back_us: slowest(|m| m.back_to_back_us),
                host_us: slowest(|m| m.host_us),
            })
        };
        let (mut out_of_place, mut in_place) = (None, None);
        for (slot, placed) in self.cfg.placements().into_iter().enumerate() {
            *(if placed {
                &mut in_place
            } else {
                &mut out_of_place
            }) = Some(timing(slot)?);
        }
        Ok(Row {
            backend: self.backend.to_string(),
            algorithm: self.algorithm.map(str::to_string),
            bootstrap: self.bootstrap.to_string(),
            ranks,
            dtype: self.cfg.dtype.name().to_string(),
            op: self.cfg.op.name().to_string(),
            bytes: point.bytes,
            count: point.count as u64,
            iters,
            launch: self.launch,
            out_of_place,
            in_place,
            choice: self.selector.map(|s| {
                let call = comm_select::CallInfo::all_reduce(
                    self.cfg.dtype,
                    self.cfg.op,
                    point.count,
                    if device {
                        comm_select::Memory::Device
                    } else {
                        comm_select::Memory::Host
                    },
                )
                .with_launch(self.launch);
                match s.choose(&call) {
                    Ok(c) => format!("{} ({:?})", c.label(), c.source),
                    Err(e) => format!("none ({e})"),
                }
            }),
        })
    }
}

/// Microseconds per call of `calls` calls that took `time` together, to the nanosecond:
/// the clock's resolution (more digits would be noise).
pub fn per_call_us(time: Duration, calls: usize) -> f64 {
    (time.as_secs_f64() / calls.max(1) as f64 * 1e9).round() / 1e3
}

/// The median of `times` (the mean of the middle two for an even count); zero if empty.
pub fn median(times: &mut [Duration]) -> Duration {
    if times.is_empty() {
        return Duration::ZERO;
    }
    times.sort_unstable();
    let mid = times.len() / 2;
    if times.len() % 2 == 1 {
        times[mid]
    } else {
        (times[mid - 1] + times[mid]) / 2
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(sizes: &[u64], dtype: DType) -> SweepConfig {
        SweepConfig {
            sizes: sizes.to_vec(),
            dtype,
            op: ReduceOp::Sum,
            iters: None,
            warmup: None,
            check: false,
            out_of_place: true,
            in_place: true,
            seed: 1,
            algorithms: Algorithms::Default,
            launches: Launches::Eager,
        }
    }

    #[test]
    fn plan_rounds_to_elements_and_iterations_fit_the_budget() {
        let p = plan(&cfg(&[1, 4, 6, 8, 16, 64 << 20], DType::F64));
        let counts: Vec<usize> = p.iter().map(|p| p.count).collect();
        assert_eq!(counts, vec![1, 2, 8 << 20]);
        assert_eq!(p[0].bytes, 8);
        // Fast calls get the most iterations, slow ones the fewest; given counts stand.
        assert_eq!(
            iterations(1e-5, None, None),
            (DEFAULT_WARMUP, DEFAULT_ITERS)
        );
        assert_eq!(iterations(2.0, None, None), (1, MIN_AUTO_ITERS));
        assert_eq!(iterations(0.025, None, None), (2, 10));
        assert_eq!(iterations(0.0, Some(0), Some(7)), (1, 7));
        assert_eq!(iterations(5.0, Some(3), None), (3, MIN_AUTO_ITERS));
    }

    #[test]
    fn median_of_odd_and_even() {
        let ms = Duration::from_millis;
        assert_eq!(median(&mut [ms(3), ms(1), ms(2)]), ms(2));
        assert_eq!(
            median(&mut [ms(4), ms(1), ms(2), ms(3)]),
            Duration::from_micros(2500)
        );
        assert_eq!(median(&mut []), Duration::ZERO);
    }

    #[test]
    fn a_graph_replay_of_n_calls_is_reported_per_call() {
        let us = Duration::from_micros;
        assert_eq!(per_call_us(us(7), 1), 7.0);
        // 20 calls in one replay of 90 us: 4.5 us each.
        assert_eq!(per_call_us(us(90), 20), 4.5);
        assert_eq!(per_call_us(Duration::from_nanos(1001), 3), 0.334);
        assert_eq!(per_call_us(us(5), 0), 5.0);
    }

    #[test]
    fn measurements_travel_whole_and_unmeasured_figures_stay_unmeasured() {
        let m = Measured {
            median_us: 8.25,
            wrong: 3,
            fingerprint: 0xfeed,
            back_to_back_us: 4.5,
            host_us: 2.125,
        };
        let back = Measured::decode(&m.encode()).unwrap();
        assert_eq!(
            (
                back.median_us,
                back.wrong,
                back.fingerprint,
                back.back_to_back_us,
                back.host_us
            ),
            (8.25, 3, 0xfeed, 4.5, 2.125)
        );
        let plain = Measured::decode(&Measured::unchecked(1.0).encode()).unwrap();
        assert!(plain.back_to_back_us.is_nan() && plain.host_us.is_nan());
        assert!(Measured::decode(&m.encode()[..24]).is_err());
    }
}
