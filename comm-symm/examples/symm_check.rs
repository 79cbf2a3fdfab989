//! `symm_check`: proves the CUDA backing of comm-symm on real GPUs, one rank per process.
//!
//! ```text
//! mpirun -np 4 symm_check [--algos oneshot,twoshot,lamport] [--cycles 1000] [--quick]
//! ```
//!
//! Per algorithm: the comm-core conformance suite on device memory; the fused all-reduce,
//! residual add and RMSNorm against an f64 host reference on fresh random data, outputs
//! poisoned first, results compared bit for bit across ranks; a CUDA graph of an
//! all-reduce and a fused op, replayed on new data. Then the heap primitives (signal ring,
//! barrier), the timeout check (the last rank stays away: the others must get
//! `Error::Timeout`, then `Error::Aborted`), and rendezvous/free cycles measuring device
//! memory (cuMemGetInfo), open descriptors and /dev/shm entries. Several processes may
//! share one GPU (they time-slice). Exits non-zero on any failure.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use comm_core::conformance;
use comm_core::cuda::cudarc::driver::{result, sys};
use comm_core::cuda::{DeviceMemory, device_count, driver_error, probe};
use comm_core::{Bootstrap, Communicator, DType, EnvBootstrap, Error, ReduceOp, Result, bf16, f16};
use comm_symm::Algorithm;
use comm_symm::cuda::{Backing, CudaSymmComm, CudaSymmConfig, DeviceHeap};

const MAX_BYTES: usize = 4 << 20;

fn main() -> ExitCode {
    let mut algos = vec![Algorithm::OneShot, Algorithm::TwoShot, Algorithm::Lamport];
    let mut cycles = 1000usize;
    let mut quick = false;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--algos" => {
                let v = args.next().unwrap_or_default();
                match v.split(',').map(str::parse).collect::<Result<Vec<_>>>() {
                    Ok(list) => algos = list,
                    Err(e) => return usage(&e.to_string()),
                }
            }
            "--cycles" => match args.next().and_then(|v| v.parse().ok()) {
                Some(n) => cycles = n,
                None => return usage("--cycles needs a number"),
            },
            "--quick" => quick = true,
            other => return usage(&format!("unknown argument `{other}`")),
        }
    }
    let bootstrap: Arc<dyn Bootstrap> = match EnvBootstrap::from_env() {
        Ok(b) => Arc::new(b),
        Err(e) => {
            eprintln!("symm_check: bootstrap: {e}");
            return ExitCode::FAILURE;
        }
    };
    let rank = bootstrap.rank();
    let world = bootstrap.world_size();
    let say = |msg: &str| {
        if rank == 0 {
            println!("{msg}");
        }
    };
    say(&format!(
        "# symm_check: {world} ranks, max {MAX_BYTES} bytes"
    ));
    let mut failures = 0usize;
    let mut report = |name: &str, started: Instant, mine: Result<String>| {
        let ok = agree(&*bootstrap, mine.is_ok());
        let secs = started.elapsed().as_secs_f64();
        match (&mine, ok) {
            (Ok(detail), true) => say(&format!("PASS  {name:<34} {secs:6.1}s  {detail}")),
            (Err(e), _) => {
                println!("FAIL  {name:<34} rank {rank}: {e}");
                failures += 1;
            }
            (Ok(_), false) => {
                failures += 1;
                say(&format!("FAIL  {name:<34} (on another rank)"));
            }
        }
    };
    for &algo in &algos {
        let started = Instant::now();
        let check = match Check::new(&bootstrap, algo, quick) {
            Ok(c) => c,
            Err(e) => {
                report(&format!("{algo} setup"), started, Err(e));
                continue;
            }
        };
        if algo == algos[0] {
            let h = check.comm.heap();
            say(&format!(
                "# heap: {} backing, segment {} bytes, {} ranks share a device, {} blocks max",
                if h.is_vmm() {
                    "VMM (cuMemCreate + fd)"
                } else {
                    "legacy CUDA IPC"
                },
                h.segment_bytes(),
                h.sharing(),
                check.comm.max_blocks()
            ));
        }
        let steps: [(&str, Step); 3] = [
            ("conformance", Check::conformance),
            ("fused rmsnorm vs f64", Check::fused),
            ("cuda graph replay", Check::graph),
        ];
        for (name, step) in steps {
            let started = Instant::now();
            report(&format!("{algo} {name}"), started, step(&check));
        }
    }
    let started = Instant::now();
    report("heap primitives", started, primitives(&bootstrap));
    if world > 1 {
        for algo in [Algorithm::OneShot, Algorithm::Lamport] {
            let started = Instant::now();
            report(
                &format!("{algo} timeout"),
                started,
                timeout_check(&bootstrap, algo),
            );
        }
    }
    let started = Instant::now();
    report(
        &format!("{cycles} rendezvous/free cycles"),
        started,
        cycles_check(&bootstrap, cycles),
    );
    let total = bootstrap
        .all_gather_bytes(&[u8::from(failures > 0)])
        .map(|all| all.iter().filter(|v| v.first() == Some(&1)).count())
        .unwrap_or(1);
    if total == 0 {
        say(&format!("# symm_check: all passed on {world} ranks"));
        ExitCode::SUCCESS
    } else {
        say(&format!("# symm_check: failures on {total} rank(s)"));
        ExitCode::FAILURE
    }
}

fn usage(why: &str) -> ExitCode {
    eprintln!("symm_check: {why}\nusage: symm_check [--algos NAME,...] [--cycles N] [--quick]");
    ExitCode::from(2)
}

/// True when every rank says true.
fn agree(bootstrap: &dyn Bootstrap, ok: bool) -> bool {
    bootstrap
        .all_gather_bytes(&[u8::from(ok)])
        .map(|all| all.iter().all(|v| v.first() == Some(&1)))
        .unwrap_or(false)
}

type Step = fn(&Check) -> Result<String>;

struct Check {
    comm: CudaSymmComm,
    memory: DeviceMemory,
    bootstrap: Arc<dyn Bootstrap>,
    quick: bool,
}

fn device_of(bootstrap: &dyn Bootstrap) -> Result<usize> {
    Ok(bootstrap.local_rank() % device_count()?)
}

fn backing() -> Backing {
    std::env::var("COMM_SYMM_BACKING")
        .ok()
        .and_then(|v| Backing::parse(&v).ok())
        .unwrap_or(Backing::Auto)
}

impl Check {
    fn new(bootstrap: &Arc<dyn Bootstrap>, algo: Algorithm, quick: bool) -> Result<Self> {
        let config = CudaSymmConfig {
            max_bytes: MAX_BYTES,
            algorithm: algo,
            // Processes sharing a GPU time-slice: spins must outlast other ranks' slices.
            timeout: Some(Duration::from_secs(60)),
            validate: true,
            backing: backing(),
            ..CudaSymmConfig::default()
        };
        let comm = CudaSymmComm::new(bootstrap.clone(), device_of(&**bootstrap)?, config)?;
        let memory = DeviceMemory::with_stream(comm.context().new_stream().map_err(driver_error)?);
        Ok(Check {
            comm,
            memory,
            bootstrap: bootstrap.clone(),
            quick,
        })
    }

    fn conformance(&self) -> Result<String> {
        let config = conformance::Config {
            seed: 0x5e77_c0de,
            random_cases: if self.quick { 12 } else { 32 },
            max_count: 1 << 15,
            large_count: Some(MAX_BYTES / 4),
            error_cases: true,
        };
        let r = conformance::run_with_memory(&self.comm, &self.memory, &config)
            .map_err(|f| Error::Mismatch(f.to_string()))?;
        Ok(format!(
            "{} coverage, {} random, large {}, {} error cases",
            r.coverage_cases, r.random_cases, r.large_case, r.error_cases
        ))
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
            let err = self.fused_case(rows, hidden, 77 + i as u64)?;
            worst = worst.max(err);
        }
        Ok(format!(
            "{} shapes up to 200 x 5120, worst rel. error {worst:.2e}",
            shapes.len()
        ))
    }

    fn fused_case(&self, rows: usize, hidden: usize, seed: u64) -> Result<f64> {
        let n = rows * hidden;
        let world = self.comm.world_size();
        let xs = all_inputs(DType::BF16, n, seed, world);
        let res0 = all_inputs(DType::BF16, n, seed ^ 0xabc, 1).remove(0);
        let w = all_inputs(DType::BF16, hidden, seed ^ 0xdef, 1).remove(0);
        let eps = 1e-6f32;
        let mut x = self.memory.alloc(DType::BF16, n)?;
        let mut res = self.memory.alloc(DType::BF16, n)?;
        let mut out = self.memory.alloc(DType::BF16, n)?;
        let mut weight = self.memory.alloc(DType::BF16, hidden)?;
        x.write(&xs[self.comm.rank()])?;
        res.write(&res0)?;
        weight.write(&w)?;
        out.poison(0xff)?;
        self.comm.all_reduce_residual_rmsnorm(
            x.view(0, n)?,
            res.view_mut(0, n)?,
            out.view_mut(0, n)?,
            weight.view(0, hidden)?,
            eps,
        )?;
        self.comm.synchronize(self.memory.raw_stream())?;
        let (got_res, got_out) = (res.read()?, out.read()?);
        let (ref_res, ref_out) = fused_reference(&xs, &res0, &w, rows, hidden, eps);
        let err = |got: &[u8], want: &[f64]| -> f64 {
            let (mut num, mut den) = (0f64, 0f64);
            for (i, &r) in want.iter().enumerate() {
                let g = decode(DType::BF16, got, i);
                num += (g - r) * (g - r);
                den += r * r;
            }
            if num.is_nan() {
                f64::INFINITY
            } else {
                (num / den.max(1e-300)).sqrt()
            }
        };
        let (e_res, e_out) = (err(&got_res, &ref_res), err(&got_out, &ref_out));
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

    /// A graph of a 42 KB bf16 all-reduce and a fused op (3 x 7168), replayed on new data.
    fn graph(&self) -> Result<String> {
        let stream = self.memory.stream();
        let world = self.comm.world_size();
        let (n, hidden) = (21504usize, 7168usize);
        let mut a_in = self.memory.alloc(DType::BF16, n)?;
        let mut a_out = self.memory.alloc(DType::BF16, n)?;
        let mut x = self.memory.alloc(DType::BF16, n)?;
        let mut res = self.memory.alloc(DType::BF16, n)?;
        let mut out = self.memory.alloc(DType::BF16, n)?;
        let mut weight = self.memory.alloc(DType::BF16, hidden)?;
        let enqueue = |a_in: &comm_core::cuda::DeviceOwned,
                       a_out: &mut comm_core::cuda::DeviceOwned,
                       x: &comm_core::cuda::DeviceOwned,
                       res: &mut comm_core::cuda::DeviceOwned,
                       out: &mut comm_core::cuda::DeviceOwned,
                       weight: &comm_core::cuda::DeviceOwned|
         -> Result<()> {
            self.comm
                .all_reduce(a_in.view(0, n)?, a_out.view_mut(0, n)?, ReduceOp::Sum)?;
            self.comm.all_reduce_residual_rmsnorm(
                x.view(0, n)?,
                res.view_mut(0, n)?,
                out.view_mut(0, n)?,
                weight.view(0, hidden)?,
                1e-6,
            )
        };
        // Warm up outside capture.
        enqueue(&a_in, &mut a_out, &x, &mut res, &mut out, &weight)?;
        self.comm.synchronize(self.memory.raw_stream())?;
        stream
            .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(driver_error)?;
        let captured = enqueue(&a_in, &mut a_out, &x, &mut res, &mut out, &weight);
        let graph = stream
            .end_capture(sys::CUgraphInstantiate_flags(0))
            .map_err(driver_error)?;
        captured?;
        let graph = graph.ok_or_else(|| Error::Mismatch("capture produced no graph".into()))?;
        for replay in 0..3u64 {
            let a = all_inputs(DType::BF16, n, 1000 + replay, world);
            let xs = all_inputs(DType::BF16, n, 2000 + replay, world);
            let r0 = all_inputs(DType::BF16, n, 3000 + replay, 1).remove(0);
            let w = all_inputs(DType::BF16, hidden, 4000 + replay, 1).remove(0);
            a_in.write(&a[self.comm.rank()])?;
            x.write(&xs[self.comm.rank()])?;
            res.write(&r0)?;
            weight.write(&w)?;
            a_out.poison(0xff)?;
            out.poison(0xff)?;
            self.bootstrap.barrier()?;
            graph.launch().map_err(driver_error)?;
            self.comm.synchronize(self.memory.raw_stream())?;
            let wrong = count_wrong(DType::BF16, ReduceOp::Sum, &a, &a_out.read()?, n);
            if wrong > 0 {
                return Err(Error::Mismatch(format!(
                    "replay {replay}: {wrong} of {n} all-reduce elements wrong"
                )));
            }
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
        Ok("all-reduce + fused op captured, 3 replays on new data".into())
    }
}

/// The fused op in f64, following the kernel's rounding points: the all-reduce's bf16
/// result, the bf16 residual, then the norm of that residual.
fn fused_reference(
    xs: &[Vec<u8>],
    res: &[u8],
    w: &[u8],
    rows: usize,
    hidden: usize,
    eps: f32,
) -> (Vec<f64>, Vec<f64>) {
    let mut new_res = vec![0f64; rows * hidden];
    let mut out = vec![0f64; rows * hidden];
    for r in 0..rows {
        let mut sumsq = 0f64;
        for j in 0..hidden {
            let i = r * hidden + j;
            let a: f64 = xs.iter().map(|x| decode(DType::BF16, x, i)).sum();
            let a = bf16::from_f64(a).to_f64();
            let h = bf16::from_f64(a + decode(DType::BF16, res, i)).to_f64();
            new_res[i] = h;
            sumsq += h * h;
        }
        let scale = 1.0 / (sumsq / hidden as f64 + eps as f64).sqrt();
        for j in 0..hidden {
            let i = r * hidden + j;
            out[i] = new_res[i] * scale * decode(DType::BF16, w, j);
        }
    }
    (new_res, out)
}

/// Signals around a ring (rank r to r+1, waits for r-1), then a barrier, on each channel.
fn primitives(bootstrap: &Arc<dyn Bootstrap>) -> Result<String> {
    let ctx = probe::context(device_of(&**bootstrap)?)?;
    let heap = DeviceHeap::rendezvous(&**bootstrap, &ctx, 1 << 20, backing(), 0..0)?;
    let (me, n) = (heap.rank(), heap.world_size());
    let stream = ctx.new_stream().map_err(driver_error)?;
    let s = comm_core::cuda::raw_stream(&stream);
    if n > 1 {
        for round in 0..50 {
            let channel = round % comm_symm::cuda::layout::CHANNELS;
            heap.put_signal(s, (me + 1) % n, channel)?;
            heap.wait_signal(s, (me + n - 1) % n, channel, Duration::from_secs(30))?;
            heap.barrier(s, channel)?;
        }
    }
    heap.synchronize(s)?;
    bootstrap.barrier()?;
    Ok(format!(
        "50 rounds of ring signal + barrier over {} channels",
        comm_symm::cuda::layout::CHANNELS
    ))
}

/// The last rank stays away: the others must time out, then refuse work.
fn timeout_check(bootstrap: &Arc<dyn Bootstrap>, algo: Algorithm) -> Result<String> {
    let bound = Duration::from_secs(2);
    let config = CudaSymmConfig {
        max_bytes: 1 << 20,
        algorithm: algo,
        timeout: Some(bound),
        validate: false,
        backing: backing(),
        ..CudaSymmConfig::default()
    };
    let comm = CudaSymmComm::new(bootstrap.clone(), device_of(&**bootstrap)?, config)?;
    let memory = DeviceMemory::with_stream(comm.context().new_stream().map_err(driver_error)?);
    let absent = comm.world_size() - 1;
    let mut detail = String::from("absent rank");
    if comm.rank() != absent {
        let count = 4097;
        let mut buf = memory.alloc(DType::BF16, count)?;
        buf.write(&vec![0x3fu8; count * 2])?;
        let started = Instant::now();
        comm.all_reduce_in_place(buf.view_mut(0, count)?, ReduceOp::Sum)?;
        let result = comm.synchronize(memory.raw_stream());
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
        match comm.all_reduce_in_place(buf.view_mut(0, count)?, ReduceOp::Sum) {
            Err(Error::Aborted(_)) => {}
            other => {
                return Err(Error::Mismatch(format!(
                    "a timed-out communicator accepted work: {other:?}"
                )));
            }
        }
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

fn free_device_memory() -> Result<usize> {
    result::mem_get_info()
        .map(|(free, _)| free)
        .map_err(driver_error)
}

/// Rendezvous + free, `cycles` times (after 10 to warm up): no growth in device memory,
/// descriptors or shm entries.
fn cycles_check(bootstrap: &Arc<dyn Bootstrap>, cycles: usize) -> Result<String> {
    let ctx = probe::context(device_of(&**bootstrap)?)?;
    ctx.bind_to_thread().map_err(driver_error)?;
    let one = |i: usize| -> Result<()> {
        let heap = DeviceHeap::rendezvous(
            &**bootstrap,
            &ctx,
            (2 << 20) + i % 3 * 4096,
            backing(),
            0..4096,
        )?;
        // Peers must be done with this segment's mapping before it goes.
        bootstrap.barrier()?;
        drop(heap);
        Ok(())
    };
    for i in 0..10 {
        one(i)?;
    }
    bootstrap.barrier()?;
    let (mem0, fd0, shm0) = (free_device_memory()?, fd_count(), shm_count());
    let started = Instant::now();
    for i in 0..cycles {
        one(i)?;
    }
    bootstrap.barrier()?;
    let (mem1, fd1, shm1) = (free_device_memory()?, fd_count(), shm_count());
    let per = started.elapsed().as_secs_f64() * 1e3 / cycles.max(1) as f64;
    let grown = mem0.saturating_sub(mem1);
    let detail = format!(
        "{per:.2} ms/cycle; free device memory {} -> {} MiB, fds {fd0} -> {fd1}, /dev/shm {shm0} -> {shm1}",
        mem0 >> 20,
        mem1 >> 20
    );
    // Device memory is per GPU (every rank's, at the same barrier); allow one granule of
    // driver bookkeeping.
    if grown > 2 << 20 || fd1 > fd0 || shm1 > shm0 {
        return Err(Error::Mismatch(format!("resources grew: {detail}")));
    }
    Ok(detail)
}

/// Every rank's input bytes for a case, from the seed: random values in [-1, 1).
fn all_inputs(dtype: DType, count: usize, seed: u64, world: usize) -> Vec<Vec<u8>> {
    (0..world)
        .map(|r| {
            let mut s = seed ^ ((r as u64 + 1) << 48);
            (0..count)
                .flat_map(|_| {
                    s = splitmix(s);
                    let v = ((s >> 40) as f64 / (1u64 << 24) as f64) * 2.0 - 1.0;
                    match dtype {
                        DType::BF16 => bf16::from_f64(v).to_le_bytes().to_vec(),
                        DType::F16 => f16::from_f64(v).to_le_bytes().to_vec(),
                        _ => (v as f32).to_le_bytes().to_vec(),
                    }
                })
                .collect()
        })
        .collect()
}

fn decode(dtype: DType, bytes: &[u8], i: usize) -> f64 {
    let s = dtype.size();
    let b = &bytes[i * s..(i + 1) * s];
    match dtype {
        DType::BF16 => bf16::from_le_bytes([b[0], b[1]]).to_f64(),
        DType::F16 => f16::from_le_bytes([b[0], b[1]]).to_f64(),
        _ => f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64,
    }
}

/// Elements outside tolerance of the f64 reference (output rounding plus f32
/// accumulation); NaN or an unwritten (poisoned) element fails.
fn count_wrong(dtype: DType, op: ReduceOp, inputs: &[Vec<u8>], got: &[u8], count: usize) -> usize {
    let n = inputs.len();
    let eps = match dtype {
        DType::BF16 => 2f64.powi(-8),
        DType::F16 => 2f64.powi(-11),
        _ => 2f64.powi(-24),
    };
    (0..count)
        .filter(|&i| {
            let xs: Vec<f64> = inputs.iter().map(|x| decode(dtype, x, i)).collect();
            let sum_abs: f64 = xs.iter().map(|x| x.abs()).sum();
            let reference = match op {
                ReduceOp::Sum => xs.iter().sum(),
                ReduceOp::Avg => xs.iter().sum::<f64>() / n as f64,
                ReduceOp::Max => xs.iter().copied().fold(f64::MIN, f64::max),
                _ => xs.iter().copied().fold(f64::MAX, f64::min),
            };
            let g = decode(dtype, got, i);
            let tol = eps * reference.abs() + n as f64 * 2f64.powi(-23) * sum_abs + 1e-30;
            (g - reference).abs().partial_cmp(&tol) != Some(std::cmp::Ordering::Less)
        })
        .count()
}

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}
