//! `ipc_bench`: kernel speed of every algorithm with N virtual ranks on one GPU.
//!
//! ```text
//! ipc_bench [--ranks 8] [--iters 1000] [--batch 20] [--threads 512] [--max-blocks N]
//! ```
//!
//! The ranks are `IpcComm`s of one process (threads bootstrap, all regions in one
//! context, one stream each), so no IPC is involved and all the kernels run at once, as
//! on N GPUs, except that every byte goes through this one GPU's memory. Per algorithm:
//! 42 KB bf16 (the seeds' decode all-reduce) and 64 MiB bf16, each checked first (device
//! f64 reference, every rank bitwise equal), then timed by replaying a CUDA graph that
//! forks to the N streams, runs `batch` all-reduces per rank, and joins: median over
//! `iters` replays, divided by `batch`; a graph of one all-reduce is timed too (it adds
//! the graph launch). Bandwidth counts the bytes each algorithm must move through memory
//! (all ranks together) and compares them with the device's copy bandwidth (cuMemcpyDtoD
//! of 1 GiB, bytes read plus written), measured first.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use comm_core::cuda::cudarc::driver::{CudaContext, CudaEvent, CudaStream, result, sys};
use comm_core::cuda::{DeviceBuffer, PatternKernels, context, driver_error};
use comm_core::{Communicator, DType, Error, ReduceOp, Result, ThreadsBootstrap};
use comm_ipc::{Algorithm, IpcComm, IpcConfig};

fn main() -> ExitCode {
    let mut ranks = 8usize;
    let mut iters = 1000usize;
    let mut batch = 20usize;
    let mut threads = comm_ipc::config::DEFAULT_THREADS;
    let mut max_blocks = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut num = |name: &str| -> std::result::Result<usize, String> {
            args.next()
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| format!("{name} needs a number"))
        };
        let got = match a.as_str() {
            "--ranks" => num("--ranks").map(|v| ranks = v),
            "--iters" => num("--iters").map(|v| iters = v),
            "--batch" => num("--batch").map(|v| batch = v.max(1)),
            "--threads" => num("--threads").map(|v| threads = v as u32),
            "--max-blocks" => num("--max-blocks").map(|v| max_blocks = Some(v as u32)),
            other => Err(format!("unknown argument `{other}`")),
        };
        if let Err(e) = got {
            eprintln!(
                "ipc_bench: {e}\nusage: ipc_bench [--ranks N] [--iters N] [--batch N] [--threads N] [--max-blocks N]"
            );
            return ExitCode::from(2);
        }
    }
    match run(ranks, iters, batch, threads, max_blocks) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("ipc_bench: error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(
    ranks: usize,
    iters: usize,
    batch: usize,
    threads: u32,
    max_blocks: Option<u32>,
) -> Result<bool> {
    let ctx = context(0)?;
    let copy_bw = copy_bandwidth(&ctx)?;
    println!(
        "# ipc_bench: {ranks} virtual ranks on one GPU; device copy bandwidth {:.0} GB/s (1 GiB cuMemcpyDtoD, read + write)",
        copy_bw / 1e9
    );
    let comms = make_comms(ranks, threads, max_blocks)?;
    println!(
        "# {} blocks max per rank, {} threads",
        comms[0].max_blocks(),
        comms[0].config().threads
    );
    let streams = (0..ranks)
        .map(|_| ctx.new_stream().map_err(driver_error))
        .collect::<Result<Vec<_>>>()?;
    let kernels = PatternKernels::load(&ctx)?;
    println!(
        "{:<13} {:>10} {:>6} {:>11} {:>11} {:>9} {:>9} {:>10} {:>7} {:>6}",
        "algorithm",
        "bytes",
        "batch",
        "time_us",
        "graph1_us",
        "algbw",
        "busbw",
        "mem_GB/s",
        "%copy",
        "wrong"
    );
    let mut ok = true;
    for algo in Algorithm::ALL {
        for (bytes, it, b) in [(42 * 1024usize, iters, batch), (64usize << 20, 30, 1)] {
            let count = bytes / 2;
            let r = measure(&comms, &streams, &kernels, algo, count, it, b)?;
            let moved = model_bytes(algo, bytes as f64, ranks as f64) * ranks as f64;
            let secs = r.per_call_us * 1e-6;
            let algbw = bytes as f64 / secs / 1e9;
            let busbw = algbw * 2.0 * (ranks as f64 - 1.0) / ranks as f64;
            let mem = moved / secs / 1e9;
            ok &= r.wrong == 0 && r.identical;
            println!(
                "{:<13} {:>10} {:>6} {:>11.2} {:>11.2} {:>9.1} {:>9.1} {:>10.0} {:>6.1}% {:>6}{}",
                algo.name(),
                bytes,
                b,
                r.per_call_us,
                r.graph1_us,
                algbw,
                busbw,
                mem,
                100.0 * mem * 1e9 / copy_bw,
                r.wrong,
                if r.identical {
                    ""
                } else {
                    "  RESULTS DIFFER ACROSS RANKS"
                }
            );
        }
    }
    Ok(ok)
}

/// Bytes one rank's call moves through device memory (eager mode, message of `m` bytes,
/// `n` ranks): reads plus writes, Lamport resets included.
fn model_bytes(algo: Algorithm, m: f64, n: f64) -> f64 {
    match algo {
        // copy in (r+w), read n copies, write the result.
        Algorithm::OneshotPull => 2.0 * m + n * m + m,
        // copy in (r+w); reduce-scatter: read n slices, write one; all-gather: read n
        // slices, write them.
        Algorithm::TwoshotPull => 2.0 * m + m + m / n + m + m,
        // read input, write it to n-1 peers, read n-1 mailboxes + own input, write the
        // result, reset n-1 slots.
        Algorithm::OneshotPush => m + (n - 1.0) * m + (n - 1.0) * m + m + m + (n - 1.0) * m,
        // push n-1 slices (r+w), read n-1 slots + own slice, write the result to n-1
        // peers and here, read n-1 result slices and write them, reset n-1 slots and
        // the result mailbox.
        Algorithm::TwoshotPush => {
            let s = m / n;
            2.0 * (n - 1.0) * s + n * s + n * s + 2.0 * (n - 1.0) * s + (n - 1.0) * s + m
        }
        _ => f64::NAN,
    }
}

fn copy_bandwidth(ctx: &Arc<CudaContext>) -> Result<f64> {
    let bytes = 1usize << 30;
    let a = DeviceBuffer::alloc(ctx, bytes)?;
    let b = DeviceBuffer::alloc(ctx, bytes)?;
    let stream = ctx.new_stream().map_err(driver_error)?;
    let mut times = Vec::new();
    for i in 0..13 {
        let start = event(&stream)?;
        // SAFETY: two allocations of `bytes` bytes of this context.
        unsafe {
            result::memcpy_dtod_async(b.device_ptr(), a.device_ptr(), bytes, stream.cu_stream())
        }
        .map_err(driver_error)?;
        let end = event(&stream)?;
        end.synchronize().map_err(driver_error)?;
        if i >= 3 {
            times.push(start.elapsed_ms(&end).map_err(driver_error)? as f64 * 1e-3);
        }
    }
    Ok(2.0 * bytes as f64 / median(&mut times))
}

fn make_comms(ranks: usize, threads: u32, max_blocks: Option<u32>) -> Result<Vec<IpcComm>> {
    let config = IpcConfig {
        threads,
        max_blocks,
        max_bytes: 64 << 20,
        validate: false,
        timeout: Some(Duration::from_secs(10)),
        ..IpcConfig::default()
    };
    let handles: Vec<_> = ThreadsBootstrap::create(ranks)
        .into_iter()
        .map(|b| {
            let config = config.clone();
            std::thread::spawn(move || IpcComm::new(Arc::new(b), 0, config))
        })
        .collect();
    handles
        .into_iter()
        .map(|h| {
            h.join()
                .map_err(|_| Error::Mismatch("a rank panicked".into()))?
        })
        .collect()
}

struct Measured {
    per_call_us: f64,
    graph1_us: f64,
    wrong: u64,
    identical: bool,
}

fn measure(
    comms: &[IpcComm],
    streams: &[Arc<CudaStream>],
    kernels: &PatternKernels,
    algo: Algorithm,
    count: usize,
    iters: usize,
    batch: usize,
) -> Result<Measured> {
    let ctx = comms[0].context();
    let n = comms.len();
    let bytes = count * 2;
    let mut ins = Vec::new();
    let mut outs = Vec::new();
    for (r, (comm, stream)) in comms.iter().zip(streams).enumerate() {
        comm.set_algorithm(Some(algo.name()))?;
        let mut i = DeviceBuffer::alloc(ctx, bytes)?;
        kernels.fill(
            i.view_mut(DType::BF16, stream)?,
            0x5eed ^ bytes as u64,
            r as u32,
        )?;
        ins.push(i);
        outs.push(DeviceBuffer::alloc(ctx, bytes)?);
    }
    let enqueue = |outs: &mut [DeviceBuffer]| -> Result<()> {
        for r in 0..n {
            comms[r].all_reduce(
                ins[r].view(DType::BF16, &streams[r])?,
                outs[r].view_mut(DType::BF16, &streams[r])?,
                ReduceOp::Sum,
            )?;
        }
        Ok(())
    };
    // Check: all ranks at once, then the device reference and bitwise equality.
    for s in streams {
        s.synchronize().map_err(driver_error)?;
    }
    enqueue(&mut outs)?;
    for (comm, s) in comms.iter().zip(streams) {
        comm.synchronize(comm_core::cuda::raw_stream(s))?;
    }
    let mut wrong = 0;
    let mut first: Option<Vec<u8>> = None;
    let mut identical = true;
    for (out, s) in outs.iter().zip(streams) {
        wrong += kernels.check_all_reduce(
            out.view(DType::BF16, s)?,
            ReduceOp::Sum,
            0x5eed ^ bytes as u64,
            n as u32,
        )?;
        let mut host = vec![0u8; bytes];
        out.download_bytes(s, 0, &mut host)?;
        match &first {
            None => first = Some(host),
            Some(f) => identical &= *f == host,
        }
    }
    let time = |batch: usize, iters: usize, outs: &mut [DeviceBuffer]| -> Result<f64> {
        let s0 = &streams[0];
        s0.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(driver_error)?;
        let captured = (|| -> Result<()> {
            for s in &streams[1..] {
                s.join(s0).map_err(driver_error)?;
            }
            for _ in 0..batch {
                enqueue(outs)?;
            }
            for s in &streams[1..] {
                s0.join(s).map_err(driver_error)?;
            }
            Ok(())
        })();
        let graph = s0
            .end_capture(sys::CUgraphInstantiate_flags(0))
            .map_err(driver_error)?;
        captured?;
        let graph = graph.ok_or_else(|| Error::Mismatch("empty capture".into()))?;
        graph.upload().map_err(driver_error)?;
        for _ in 0..20.min(iters) {
            graph.launch().map_err(driver_error)?;
        }
        let mut times = Vec::with_capacity(iters);
        let events = (0..=iters)
            .map(|_| {
                ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
                    .map_err(driver_error)
            })
            .collect::<Result<Vec<_>>>()?;
        events[0].record(s0).map_err(driver_error)?;
        for e in &events[1..] {
            graph.launch().map_err(driver_error)?;
            e.record(s0).map_err(driver_error)?;
        }
        comms[0].synchronize(comm_core::cuda::raw_stream(s0))?;
        for w in events.windows(2) {
            times.push(w[0].elapsed_ms(&w[1]).map_err(driver_error)? as f64 * 1e3);
        }
        Ok(median(&mut times) / batch as f64)
    };
    let per_call_us = time(batch, iters, &mut outs)?;
    let graph1_us = if batch > 1 {
        time(1, iters, &mut outs)?
    } else {
        per_call_us
    };
    for c in comms {
        c.set_algorithm(None)?;
    }
    Ok(Measured {
        per_call_us,
        graph1_us,
        wrong,
        identical,
    })
}

fn event(stream: &Arc<CudaStream>) -> Result<CudaEvent> {
    stream
        .record_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
        .map_err(driver_error)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}
