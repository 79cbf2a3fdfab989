//! `symmetric_latency`: what NCCL's symmetric windows cost and give on one rank: joining
//! with and without the staging window, registering and freeing a window, and the median
//! time of one bf16 all-reduce per path - `plain` (NCCL on plain buffers), `staged`
//! (algorithm `symmetric`: copied through the staging window) and `registered` (buffers in
//! a window) - eager (events around each call) and in a CUDA graph of 100 calls (per call).
//!
//! ```text
//! cargo run --release -p comm-nccl --example symmetric_latency
//! ```
//!
//! A world of one measures cost and overhead, not the symmetric kernels, which need peers:
//! `allreduce-perf --backend nccl --algo plain,symmetric` measures those on every GPU.

use std::sync::Arc;
use std::time::Instant;

use comm_core::cuda::cudarc::driver::CudaStream;
use comm_core::cuda::cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use comm_core::cuda::{
    DeviceMemory, PatternKernels, driver_error, event_times, record_each, timing_events,
};
use comm_core::{
    BufferMut, BufferRef, Communicator, DType, Error, ReduceOp, RegisteredBuffer, Result,
    ThreadsBootstrap,
};
use comm_nccl::NcclComm;

const ITERS: usize = 200;
const GRAPH_CALLS: usize = 100;
const REPLAYS: usize = 20;

fn main() {
    if let Err(e) = run() {
        eprintln!("symmetric_latency: {e}");
        std::process::exit(1);
    }
}

fn join() -> Result<NcclComm> {
    NcclComm::new(Arc::new(ThreadsBootstrap::create(1).remove(0)), 0)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn run() -> Result<()> {
    println!(
        "# NCCL {:?}, world 1, bf16 sum, medians",
        comm_nccl::nccl_version()?
    );
    // Joining: with the staging window, and without any.
    let mut with = Vec::new();
    let mut without = Vec::new();
    for _ in 0..3 {
        let t = Instant::now();
        drop(join()?);
        with.push(t.elapsed().as_secs_f64() * 1e3);
        // SAFETY: this program's only thread reads the environment at join.
        unsafe { std::env::set_var("COMM_NCCL_SYMMETRIC", "0") };
        let t = Instant::now();
        drop(join()?);
        without.push(t.elapsed().as_secs_f64() * 1e3);
        // SAFETY: as above.
        unsafe { std::env::remove_var("COMM_NCCL_SYMMETRIC") };
    }
    println!(
        "join + destroy: {:.1} ms with the staging window, {:.1} ms without",
        median(with),
        median(without)
    );
    let comm = join()?;
    if let Some(why) = comm.symmetric_unavailable() {
        return Err(Error::Unsupported(why.to_string()));
    }
    let memory = DeviceMemory::new(0)?;
    let stream = memory.stream().clone();
    for bytes in [1usize << 20, 64 << 20] {
        let mut times = Vec::new();
        for _ in 0..20 {
            let t = Instant::now();
            let buf = comm.alloc(bytes)?;
            let registered = t.elapsed().as_secs_f64() * 1e6;
            let t = Instant::now();
            drop(buf);
            times.push((registered, t.elapsed().as_secs_f64() * 1e6));
        }
        let alloc = median(times.iter().map(|t| t.0).collect());
        let free = median(times.iter().map(|t| t.1).collect());
        println!(
            "window of {} MiB: alloc + register {alloc:.0} us, deregister + free {free:.0} us",
            bytes >> 20
        );
    }
    let kernels = PatternKernels::load(memory.context())?;
    println!(
        "{:>9} {:>11} {:>9} {:>9}",
        "bytes", "path", "eager_us", "graph_us"
    );
    for count in [4usize, 512, 3 * 7168, 1 << 19] {
        let dtype = DType::BF16;
        let mut window = comm.alloc(2 * count * dtype.size())?;
        let mut send = memory.alloc(dtype, count)?;
        let mut recv = memory.alloc(dtype, count)?;
        kernels.fill(send.view_mut(0, count)?, 7, 0)?;
        kernels.fill(window.view_mut(dtype, 0, count, &stream)?, 7, 0)?;
        for path in ["plain", "staged", "registered"] {
            comm.set_algorithm(Some(if path == "staged" {
                "symmetric"
            } else {
                "plain"
            }))?;
            let base = window.device_ptr();
            let raw = memory.raw_stream();
            let mut call = || -> Result<()> {
                if path == "registered" {
                    // SAFETY: both halves lie in the window, which outlives the calls.
                    let (s, r) = unsafe {
                        (
                            BufferRef::from_device_ptr(base, count, dtype, 0, raw),
                            BufferMut::from_device_ptr(
                                base + (count * dtype.size()) as u64,
                                count,
                                dtype,
                                0,
                                raw,
                            ),
                        )
                    };
                    comm.all_reduce(s, r, ReduceOp::Sum)
                } else {
                    comm.all_reduce(
                        send.view(0, count)?,
                        recv.view_mut(0, count)?,
                        ReduceOp::Sum,
                    )
                }
            };
            for _ in 0..20 {
                call()?;
            }
            comm.synchronize(raw)?;
            let eager = time_each(&stream, ITERS, &mut call)?;
            stream
                .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
                .map_err(driver_error)?;
            let captured = (0..GRAPH_CALLS).try_for_each(|_| call());
            let graph = stream
                .end_capture(CUgraphInstantiate_flags(0))
                .map_err(driver_error)?
                .ok_or_else(|| Error::InvalidArgument("the capture recorded no graph".into()))?;
            captured?;
            graph.launch().map_err(driver_error)?;
            comm.synchronize(raw)?;
            let replay = || graph.launch().map_err(driver_error);
            let graphed = time_each(&stream, REPLAYS, replay)? / GRAPH_CALLS as f64;
            comm.synchronize(raw)?;
            drop(graph);
            let wrong = if path == "registered" {
                kernels.check_all_reduce(
                    window.view(dtype, count, count, &stream)?,
                    ReduceOp::Sum,
                    7,
                    1,
                )?
            } else {
                kernels.check_all_reduce(recv.view(0, count)?, ReduceOp::Sum, 7, 1)?
            };
            if wrong > 0 {
                return Err(Error::Backend {
                    backend: "nccl",
                    source: format!("{path}, {count} elements: {wrong} wrong").into(),
                });
            }
            println!(
                "{:>9} {path:>11} {eager:>9.2} {graphed:>9.2}",
                count * dtype.size()
            );
        }
        comm.set_algorithm(None)?;
        comm.synchronize(memory.raw_stream())?;
    }
    Ok(())
}

/// Median GPU time, µs, of `n` runs of `f`, each framed by events on `stream`.
fn time_each(stream: &Arc<CudaStream>, n: usize, f: impl FnMut() -> Result<()>) -> Result<f64> {
    let events = timing_events(stream.context(), n + 1)?;
    record_each(stream, &events, f)?;
    stream.synchronize().map_err(driver_error)?;
    let times = event_times(&events)?;
    Ok(median(
        times.iter().map(|t| t.as_secs_f64() * 1e6).collect(),
    ))
}
