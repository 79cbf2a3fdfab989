//! `symm_bench`: kernel speed of every algorithm and of the fused op with N virtual ranks
//! on one GPU.
//!
//! ```text
//! symm_bench [--ranks 8] [--iters 1000] [--batch 20] [--backing auto|vmm|ipc]
//! ```
//!
//! The ranks are `CudaSymmComm`s of one process (threads bootstrap, one stream each), so
//! every kernel of every rank runs at once, as on N GPUs, except that every byte goes
//! through this one GPU's memory. Per algorithm: 42 KB bf16 (a decode step's all-reduce)
//! and 64 MiB bf16, checked first (device f64 reference, every rank bitwise equal), then
//! timed by replaying a CUDA graph that forks to the N streams, runs `batch` calls per rank
//! and joins: median over `iters` replays, divided by `batch`; a graph of one call is timed
//! too (it adds the graph launch). The fused all-reduce + residual + RMSNorm is timed the
//! same way at 3 x 7168 (42 KB) and 4096 x 8192 (64 MiB), Lamport and oneshot exchange.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use comm_core::cuda::cudarc::driver::{CudaContext, CudaStream, result, sys};
use comm_core::cuda::{DeviceBuffer, PatternKernels, context, driver_error, raw_stream};
use comm_core::{Communicator, DType, Error, ReduceOp, Result, ThreadsBootstrap};
use comm_symm::Algorithm;
use comm_symm::cuda::{Backing, CudaSymmComm, CudaSymmConfig};

fn main() -> ExitCode {
    let mut ranks = 8usize;
    let mut iters = 1000usize;
    let mut batch = 20usize;
    let mut backing = Backing::Auto;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || args.next().ok_or_else(|| format!("{a} needs a value"));
        let got = match a.as_str() {
            "--ranks" => val()
                .and_then(|v| v.parse().map_err(|_| v))
                .map(|v| ranks = v),
            "--iters" => val()
                .and_then(|v| v.parse().map_err(|_| v))
                .map(|v| iters = v),
            "--batch" => val()
                .and_then(|v| v.parse().map_err(|_| v))
                .map(|v: usize| batch = v.max(1)),
            "--backing" => val()
                .and_then(|v| Backing::parse(&v).map_err(|e| e.to_string()))
                .map(|b| backing = b),
            other => Err(format!("unknown argument `{other}`")),
        };
        if let Err(e) = got {
            eprintln!(
                "symm_bench: {e}\nusage: symm_bench [--ranks N] [--iters N] [--batch N] [--backing auto|vmm|ipc]"
            );
            return ExitCode::from(2);
        }
    }
    match run(ranks, iters, batch, backing) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("symm_bench: error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(ranks: usize, iters: usize, batch: usize, backing: Backing) -> Result<bool> {
    let ctx = context(0)?;
    let copy_bw = copy_bandwidth(&ctx)?;
    println!(
        "# symm_bench: {ranks} virtual ranks on one GPU; device copy bandwidth {:.0} GB/s (1 GiB DtoD, read + write)",
        copy_bw / 1e9
    );
    let comms = make_comms(ranks, backing)?;
    println!(
        "# heap: {}, segment {} MiB per rank, {} blocks max per rank, {} threads",
        if comms[0].heap().is_vmm() {
            "VMM (cuMemCreate + fd passing)"
        } else {
            "legacy CUDA IPC"
        },
        comms[0].heap().segment_bytes() >> 20,
        comms[0].max_blocks(),
        comms[0].config().threads
    );
    let streams = (0..ranks)
        .map(|_| ctx.new_stream().map_err(driver_error))
        .collect::<Result<Vec<_>>>()?;
    let kernels = PatternKernels::load(&ctx)?;
    println!(
        "{:<16} {:>10} {:>6} {:>10} {:>10} {:>9} {:>9} {:>6}",
        "op", "bytes", "batch", "time_us", "graph1_us", "algbw", "busbw", "wrong"
    );
    let mut ok = true;
    for algo in [Algorithm::OneShot, Algorithm::TwoShot, Algorithm::Lamport] {
        for (bytes, it, b) in [(42 * 1024usize, iters, batch), (64usize << 20, 30, 1)] {
            let count = bytes / 2;
            let r = measure_all_reduce(&comms, &streams, &kernels, algo, count, it, b)?;
            ok &= r.wrong == 0 && r.identical;
            print_row(algo.name(), bytes, b, &r, ranks);
        }
    }
    for algo in [Algorithm::Lamport, Algorithm::OneShot] {
        for (rows, hidden, it, b) in [(3usize, 7168usize, iters, batch), (4096, 8192, 30, 1)] {
            let r = measure_fused(&comms, &streams, &kernels, algo, rows, hidden, it, b)?;
            ok &= r.identical;
            print_row(
                &format!("fused-{}", algo.name()),
                rows * hidden * 2,
                b,
                &r,
                ranks,
            );
        }
    }
    Ok(ok)
}

fn print_row(name: &str, bytes: usize, batch: usize, r: &Measured, ranks: usize) {
    let secs = r.per_call_us * 1e-6;
    let algbw = bytes as f64 / secs / 1e9;
    let busbw = algbw * 2.0 * (ranks as f64 - 1.0) / ranks as f64;
    println!(
        "{name:<16} {bytes:>10} {batch:>6} {:>10.2} {:>10.2} {algbw:>9.1} {busbw:>9.1} {:>6}{}",
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

fn make_comms(ranks: usize, backing: Backing) -> Result<Vec<CudaSymmComm>> {
    let config = CudaSymmConfig {
        max_bytes: 64 << 20,
        lamport_max_bytes: 64 << 20,
        validate: false,
        timeout: Some(Duration::from_secs(10)),
        backing,
        ..CudaSymmConfig::default()
    };
    let handles: Vec<_> = ThreadsBootstrap::create(ranks)
        .into_iter()
        .map(|b| {
            let config = config.clone();
            std::thread::spawn(move || CudaSymmComm::new(Arc::new(b), 0, config))
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

/// Times `enqueue` (every rank's call on its stream) by graph replay: median per call.
fn time_graph(
    comms: &[CudaSymmComm],
    streams: &[Arc<CudaStream>],
    batch: usize,
    iters: usize,
    enqueue: &mut dyn FnMut() -> Result<()>,
) -> Result<f64> {
    let s0 = &streams[0];
    s0.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .map_err(driver_error)?;
    let captured = (|| -> Result<()> {
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
    let ctx = comms[0].context();
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
    comms[0].synchronize(raw_stream(s0))?;
    let mut times: Vec<f64> = events
        .windows(2)
        .map(|w| {
            w[0].elapsed_ms(&w[1])
                .map(|ms| ms as f64 * 1e3)
                .map_err(driver_error)
        })
        .collect::<Result<_>>()?;
    Ok(median(&mut times) / batch as f64)
}

fn sync_all(comms: &[CudaSymmComm], streams: &[Arc<CudaStream>]) -> Result<()> {
    for (c, s) in comms.iter().zip(streams) {
        c.synchronize(raw_stream(s))?;
    }
    Ok(())
}

fn identical(bufs: &[DeviceBuffer], streams: &[Arc<CudaStream>], bytes: usize) -> Result<bool> {
    let mut first: Option<Vec<u8>> = None;
    let mut same = true;
    for (b, s) in bufs.iter().zip(streams) {
        let mut host = vec![0u8; bytes];
        b.download_bytes(s, 0, &mut host)?;
        match &first {
            None => first = Some(host),
            Some(f) => same &= *f == host,
        }
    }
    Ok(same)
}

fn measure_all_reduce(
    comms: &[CudaSymmComm],
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
    let seed = 0x5eed ^ bytes as u64;
    let mut ins = Vec::new();
    let mut outs = Vec::new();
    for (r, (comm, stream)) in comms.iter().zip(streams).enumerate() {
        comm.use_algorithm(algo);
        let mut i = DeviceBuffer::alloc(ctx, bytes)?;
        kernels.fill(i.view_mut(DType::BF16, stream)?, seed, r as u32)?;
        ins.push(i);
        outs.push(DeviceBuffer::alloc(ctx, bytes)?);
    }
    for s in streams {
        s.synchronize().map_err(driver_error)?;
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
    enqueue(&mut outs)?;
    sync_all(comms, streams)?;
    let mut wrong = 0;
    for (out, s) in outs.iter().zip(streams) {
        wrong +=
            kernels.check_all_reduce(out.view(DType::BF16, s)?, ReduceOp::Sum, seed, n as u32)?;
    }
    let identical = identical(&outs, streams, bytes)?;
    let per_call_us = time_graph(comms, streams, batch, iters, &mut || enqueue(&mut outs))?;
    let graph1_us = if batch > 1 {
        time_graph(comms, streams, 1, iters, &mut || enqueue(&mut outs))?
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

#[allow(clippy::too_many_arguments)]
fn measure_fused(
    comms: &[CudaSymmComm],
    streams: &[Arc<CudaStream>],
    kernels: &PatternKernels,
    algo: Algorithm,
    rows: usize,
    hidden: usize,
    iters: usize,
    batch: usize,
) -> Result<Measured> {
    let ctx = comms[0].context();
    let n = comms.len();
    let bytes = rows * hidden * 2;
    let (mut ins, mut res, mut outs, mut ws) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (r, (comm, stream)) in comms.iter().zip(streams).enumerate() {
        comm.use_algorithm(algo);
        let mut i = DeviceBuffer::alloc(ctx, bytes)?;
        kernels.fill(i.view_mut(DType::BF16, stream)?, 0xf00d, r as u32)?;
        let mut rr = DeviceBuffer::alloc(ctx, bytes)?;
        kernels.fill(rr.view_mut(DType::BF16, stream)?, 0xbeef, 0)?;
        let mut w = DeviceBuffer::alloc(ctx, hidden * 2)?;
        kernels.fill(w.view_mut(DType::BF16, stream)?, 0xcafe, 0)?;
        ins.push(i);
        res.push(rr);
        outs.push(DeviceBuffer::alloc(ctx, bytes)?);
        ws.push(w);
    }
    for s in streams {
        s.synchronize().map_err(driver_error)?;
    }
    let enqueue = |res: &mut [DeviceBuffer], outs: &mut [DeviceBuffer]| -> Result<()> {
        for r in 0..n {
            comms[r].all_reduce_residual_rmsnorm(
                ins[r].view(DType::BF16, &streams[r])?,
                res[r].view_mut(DType::BF16, &streams[r])?,
                outs[r].view_mut(DType::BF16, &streams[r])?,
                ws[r].view(DType::BF16, &streams[r])?,
                1e-6,
            )?;
        }
        Ok(())
    };
    enqueue(&mut res, &mut outs)?;
    sync_all(comms, streams)?;
    let identical = identical(&outs, streams, bytes)? && identical(&res, streams, bytes)?;
    // Replays keep adding into the residual: harmless for timing (values stay finite
    // for the few thousand replays here, and the kernel's work does not depend on them).
    let per_call_us = time_graph(comms, streams, batch, iters, &mut || {
        enqueue(&mut res, &mut outs)
    })?;
    let graph1_us = if batch > 1 {
        time_graph(comms, streams, 1, iters, &mut || {
            enqueue(&mut res, &mut outs)
        })?
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
