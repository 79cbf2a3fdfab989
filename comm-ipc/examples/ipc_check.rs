//! `ipc_check`: proves `IpcComm` correct on real GPUs, one rank per process.
//!
//! ```text
//! mpirun -np 4 ipc_check [--algos oneshot-pull,...] [--quick]
//! ```
//!
//! For every algorithm: the comm-core conformance suite on device memory (eager mode)
//! and on zero-copy buffers from `IpcComm::alloc`; a size sweep (1 element to the
//! maximum, odd counts, every dtype and op) on fresh random data against an f64 host
//! reference, with results compared bit for bit across ranks; the same through a CUDA
//! graph captured once and replayed on new data; and then, per barrier kind, the timeout
//! check (the last rank stays away: everyone else must get `Error::Timeout`, and the
//! communicator must refuse further work). Several processes may share one GPU (CUDA IPC
//! works between them; the kernels then time-slice). Exits non-zero on any failure.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use comm_core::conformance::{self, TestBuffer, TestMemory};
use comm_core::cuda::cudarc::driver::{CudaStream, sys};
use comm_core::cuda::{DeviceMemory, device_count};
use comm_core::{
    Bootstrap, BufferMut, BufferRef, Communicator, DType, EnvBootstrap, Error, ReduceOp, Result,
    bf16, f16,
};
use comm_ipc::{Algorithm, IpcBuffer, IpcComm, IpcConfig};

const MAX_BYTES: usize = 8 << 20;

fn main() -> ExitCode {
    let mut algos: Vec<Algorithm> = Algorithm::ALL.to_vec();
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
            "--quick" => quick = true,
            other => return usage(&format!("unknown argument `{other}`")),
        }
    }
    let bootstrap: Arc<dyn Bootstrap> = match EnvBootstrap::from_env() {
        Ok(b) => Arc::new(b),
        Err(e) => {
            eprintln!("ipc_check: bootstrap: {e}");
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
        "# ipc_check: {world} ranks, max {MAX_BYTES} bytes"
    ));
    let mut failures = 0usize;
    for &algo in &algos {
        let steps: [(&str, Step); 4] = [
            ("conformance (eager)", Check::conformance_eager),
            ("conformance (zero-copy)", Check::conformance_zero_copy),
            ("sweep (eager + zero-copy)", Check::sweep),
            ("cuda graph (eager + zero-copy)", Check::graph),
        ];
        let check = match Check::new(&bootstrap, algo, quick) {
            Ok(c) => c,
            Err(e) => {
                say(&format!("FAIL  {algo:<13} setup: {e}"));
                failures += 1;
                continue;
            }
        };
        for (name, step) in steps {
            if quick && name.contains("zero-copy)") && name.starts_with("conformance") {
                continue;
            }
            let started = Instant::now();
            let mine = step(&check);
            let ok = agree(&*bootstrap, mine.is_ok());
            let secs = started.elapsed().as_secs_f64();
            match (&mine, ok) {
                (Ok(detail), true) => say(&format!(
                    "PASS  {algo:<13} {name:<30} {secs:6.1}s  {detail}"
                )),
                (Err(e), _) => {
                    println!("FAIL  {algo:<13} {name:<30} rank {rank}: {e}");
                    failures += 1;
                }
                (Ok(_), false) => {
                    failures += 1;
                    say(&format!("FAIL  {algo:<13} {name:<30} (on another rank)"));
                }
            }
        }
    }
    if world > 1 {
        for algo in [
            Algorithm::OneshotPull,
            Algorithm::OneshotPush,
            Algorithm::TwoshotPush,
        ] {
            let started = Instant::now();
            let mine = timeout_check(&bootstrap, algo);
            let ok = agree(&*bootstrap, mine.is_ok());
            let secs = started.elapsed().as_secs_f64();
            match (&mine, ok) {
                (Ok(detail), true) => say(&format!(
                    "PASS  {algo:<13} {:<30} {secs:6.1}s  {detail}",
                    "timeout"
                )),
                (Err(e), _) => {
                    println!("FAIL  {algo:<13} timeout rank {rank}: {e}");
                    failures += 1;
                }
                (Ok(_), false) => failures += 1,
            }
        }
    }
    let total = bootstrap
        .all_gather_bytes(&[u8::from(failures > 0)])
        .map(|all| all.iter().filter(|v| v.first() == Some(&1)).count())
        .unwrap_or(1);
    if total == 0 {
        say(&format!("# ipc_check: all passed on {world} ranks"));
        ExitCode::SUCCESS
    } else {
        say(&format!("# ipc_check: failures on {total} rank(s)"));
        ExitCode::FAILURE
    }
}

fn usage(why: &str) -> ExitCode {
    eprintln!("ipc_check: {why}\nusage: ipc_check [--algos NAME,...] [--quick]");
    ExitCode::from(2)
}

/// True when every rank says true.
fn agree(bootstrap: &dyn Bootstrap, ok: bool) -> bool {
    bootstrap
        .all_gather_bytes(&[u8::from(ok)])
        .map(|all| all.iter().all(|v| v.first() == Some(&1)))
        .unwrap_or(false)
}

/// One check of one algorithm: a detail line, or why it failed.
type Step = fn(&Check) -> Result<String>;

struct Check {
    comm: IpcComm,
    memory: DeviceMemory,
    bootstrap: Arc<dyn Bootstrap>,
    quick: bool,
}

impl Check {
    fn new(bootstrap: &Arc<dyn Bootstrap>, algo: Algorithm, quick: bool) -> Result<Self> {
        let device = bootstrap.local_rank() % device_count()?;
        let config = IpcConfig {
            max_bytes: MAX_BYTES,
            algorithm: Some(algo),
            // Processes sharing a GPU time-slice: spins must outlast other ranks' slices.
            timeout: Some(Duration::from_secs(60)),
            validate: true,
            ..IpcConfig::default()
        };
        let comm = IpcComm::new(bootstrap.clone(), device, config)?;
        let memory = DeviceMemory::with_stream(
            comm.context()
                .new_stream()
                .map_err(comm_core::cuda::driver_error)?,
        );
        Ok(Check {
            comm,
            memory,
            bootstrap: bootstrap.clone(),
            quick,
        })
    }

    fn config(&self) -> conformance::Config {
        conformance::Config {
            seed: 0x1bc0_ffee,
            random_cases: if self.quick { 16 } else { 48 },
            max_count: 1 << 16,
            large_count: Some(MAX_BYTES / 4),
            error_cases: true,
        }
    }

    fn conformance_eager(&self) -> Result<String> {
        let r = conformance::run_with_memory(&self.comm, &self.memory, &self.config())
            .map_err(|f| Error::Mismatch(f.to_string()))?;
        Ok(format!(
            "{} coverage, {} random, large {}, {} error cases",
            r.coverage_cases, r.random_cases, r.large_case, r.error_cases
        ))
    }

    fn conformance_zero_copy(&self) -> Result<String> {
        let memory = ZeroCopyMemory {
            comm: &self.comm,
            stream: self.memory.stream().clone(),
        };
        let mut config = self.config();
        config.random_cases = 16;
        let r = conformance::run_with_memory(&self.comm, &memory, &config)
            .map_err(|f| Error::Mismatch(f.to_string()))?;
        Ok(format!(
            "{} coverage, {} random, large {}, {} error cases",
            r.coverage_cases, r.random_cases, r.large_case, r.error_cases
        ))
    }

    /// Sizes from 1 element to the maximum, odd ones included, every dtype and op.
    fn sweep(&self) -> Result<String> {
        let mut counts: Vec<usize> =
            vec![1, 2, 3, 7, 8, 9, 15, 17, 63, 65, 1001, 4097, 21504, 65537];
        if !self.quick {
            counts.extend([(1 << 20) + 3, (3 << 20) - 1]);
        }
        let mut cases = 0;
        let mut seed = 17u64;
        for dtype in [DType::BF16, DType::F16, DType::F32] {
            let max_count = MAX_BYTES / dtype.size();
            for &count in counts.iter().chain([&max_count]) {
                let count = count.min(max_count);
                for op in [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min] {
                    // Big cases once per dtype with sum only: they cost seconds time-sliced.
                    if count > 65537 && op != ReduceOp::Sum {
                        continue;
                    }
                    for zero_copy in [false, true] {
                        seed += 1;
                        self.one_case(dtype, op, count, seed, zero_copy, false)?;
                        cases += 1;
                    }
                }
            }
        }
        // In place, both modes, at an odd size.
        for zero_copy in [false, true] {
            seed += 1;
            self.one_case(DType::BF16, ReduceOp::Sum, 21503, seed, zero_copy, true)?;
            cases += 1;
        }
        Ok(format!("{cases} cases, counts 1..={}", MAX_BYTES / 2))
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
        let stream = self.memory.stream();
        let inputs = all_inputs(dtype, count, seed, self.comm.world_size());
        let mine = &inputs[self.comm.rank()];
        let bytes = count * dtype.size();
        let mut out = self.memory.alloc(dtype, count)?;
        out.poison(0xff)?;
        if zero_copy {
            let mut send = self.comm.alloc(bytes)?;
            send.upload(stream, 0, mine)?;
            if in_place {
                self.comm
                    .all_reduce_in_place(send.view_mut(dtype, 0, count, stream)?, op)?;
            } else {
                self.comm.all_reduce(
                    send.view(dtype, 0, count, stream)?,
                    out.view_mut(0, count)?,
                    op,
                )?;
            }
            self.comm.synchronize(self.memory.raw_stream())?;
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
            self.verify(dtype, op, &inputs, &got, count)
        } else {
            let mut send = self.memory.alloc(dtype, count)?;
            send.write(mine)?;
            if in_place {
                self.comm
                    .all_reduce_in_place(send.view_mut(0, count)?, op)?;
            } else {
                self.comm
                    .all_reduce(send.view(0, count)?, out.view_mut(0, count)?, op)?;
            }
            self.comm.synchronize(self.memory.raw_stream())?;
            let got = if in_place { send.read()? } else { out.read()? };
            self.verify(dtype, op, &inputs, &got, count)
        }
        .map_err(|e| {
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

    /// Captures two all-reduces (42 KB bf16 and an odd f32 count; eager and zero-copy)
    /// into one graph, then replays it on new data three times.
    fn graph(&self) -> Result<String> {
        let stream = self.memory.stream();
        let world = self.comm.world_size();
        let (n1, n2) = (21504usize, 1001usize);
        let mut a_in = self.memory.alloc(DType::BF16, n1)?;
        let mut a_out = self.memory.alloc(DType::BF16, n1)?;
        let mut zc_in = self.comm.alloc(n2 * 4)?;
        let mut b_out = self.memory.alloc(DType::F32, n2)?;
        // Warm up outside capture (module load, first-touch).
        self.comm
            .all_reduce(a_in.view(0, n1)?, a_out.view_mut(0, n1)?, ReduceOp::Sum)?;
        self.comm.synchronize(self.memory.raw_stream())?;
        stream
            .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(comm_core::cuda::driver_error)?;
        let captured = (|| -> Result<()> {
            self.comm
                .all_reduce(a_in.view(0, n1)?, a_out.view_mut(0, n1)?, ReduceOp::Sum)?;
            self.comm.all_reduce(
                zc_in.view(DType::F32, 0, n2, stream)?,
                b_out.view_mut(0, n2)?,
                ReduceOp::Avg,
            )?;
            Ok(())
        })();
        let graph = stream
            .end_capture(sys::CUgraphInstantiate_flags(0))
            .map_err(comm_core::cuda::driver_error)?;
        captured?;
        let graph = graph.ok_or_else(|| Error::Mismatch("capture produced no graph".into()))?;
        for replay in 0..3u64 {
            let a = all_inputs(DType::BF16, n1, 1000 + replay, world);
            let b = all_inputs(DType::F32, n2, 2000 + replay, world);
            a_in.write(&a[self.comm.rank()])?;
            zc_in.upload(stream, 0, &b[self.comm.rank()])?;
            a_out.poison(0xff)?;
            b_out.poison(0xff)?;
            // Peers must have their new inputs in place before anyone replays.
            self.bootstrap.barrier()?;
            graph.launch().map_err(comm_core::cuda::driver_error)?;
            self.comm.synchronize(self.memory.raw_stream())?;
            self.verify(DType::BF16, ReduceOp::Sum, &a, &a_out.read()?, n1)
                .map_err(|e| Error::Mismatch(format!("replay {replay}, bf16: {e}")))?;
            self.verify(DType::F32, ReduceOp::Avg, &b, &b_out.read()?, n2)
                .map_err(|e| Error::Mismatch(format!("replay {replay}, f32 zero-copy: {e}")))?;
            self.bootstrap.barrier()?;
        }
        drop(graph);
        Ok("2 captured all-reduces, 3 replays on new data".into())
    }
}

/// The last rank stays away: the others must time out, then refuse work.
fn timeout_check(bootstrap: &Arc<dyn Bootstrap>, algo: Algorithm) -> Result<String> {
    let bound = Duration::from_secs(2);
    let device = bootstrap.local_rank() % device_count()?;
    let config = IpcConfig {
        max_bytes: 1 << 20,
        algorithm: Some(algo),
        timeout: Some(bound),
        validate: false,
        ..IpcConfig::default()
    };
    let comm = IpcComm::new(bootstrap.clone(), device, config)?;
    let memory = DeviceMemory::with_stream(
        comm.context()
            .new_stream()
            .map_err(comm_core::cuda::driver_error)?,
    );
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
        if comm.barrier().is_ok() {
            return Err(Error::Mismatch("barrier worked after a timeout".into()));
        }
    }
    // The absent rank keeps its region mapped until everyone is done.
    bootstrap.barrier()?;
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
        _ => f32::from_le_bytes(b.try_into().unwrap()) as f64,
    }
}

/// Elements outside tolerance of the f64 reference: the output's rounding plus f32
/// accumulation over the ranks.
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
            // NaN (or an unwritten, poisoned element) fails too.
            (g - reference).abs().partial_cmp(&tol) != Some(std::cmp::Ordering::Less)
                && (g - reference).abs() != tol
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

/// Conformance buffers from `IpcComm::alloc`: every input is a zero-copy input.
struct ZeroCopyMemory<'a> {
    comm: &'a IpcComm,
    stream: Arc<CudaStream>,
}

struct ZeroCopyBuffer {
    buf: IpcBuffer,
    dtype: DType,
    len: usize,
    stream: Arc<CudaStream>,
}

impl TestMemory for ZeroCopyMemory<'_> {
    fn describe(&self) -> String {
        "ipc zero-copy".into()
    }

    fn alloc(&self, dtype: DType, len: usize) -> Result<Box<dyn TestBuffer + '_>> {
        Ok(Box::new(ZeroCopyBuffer {
            buf: self.comm.alloc((len * dtype.size()).max(16))?,
            dtype,
            len,
            stream: self.stream.clone(),
        }))
    }
}

impl TestBuffer for ZeroCopyBuffer {
    fn write(&mut self, bytes: &[u8]) -> Result<()> {
        self.buf.upload(&self.stream, 0, bytes)
    }

    fn read(&mut self) -> Result<Vec<u8>> {
        let mut v = vec![0u8; self.len * self.dtype.size()];
        self.buf.download(&self.stream, 0, &mut v)?;
        Ok(v)
    }

    fn view(&self, offset: usize, len: usize) -> BufferRef<'_> {
        self.buf
            .view(self.dtype, offset, len, &self.stream)
            .expect("the suite asks for ranges inside its buffers")
    }

    fn view_mut(&mut self, offset: usize, len: usize) -> BufferMut<'_> {
        let (dtype, stream) = (self.dtype, self.stream.clone());
        self.buf
            .view_mut(dtype, offset, len, &stream)
            .expect("the suite asks for ranges inside its buffers")
    }
}
