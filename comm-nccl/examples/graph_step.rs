//! `graph_step`: the decode step of the seed case, timed: 122 all-reduces of 3 x 7168
//! bf16 (42 KB) on one rank, issued eagerly and as one replayed CUDA graph.
//!
//! ```text
//! cargo run --release -p comm-nccl --example graph_step [-- --replays N]
//! ```
//!
//! Prints the median time of a whole step and per all-reduce, both ways. Times are GPU
//! times between events around each step, after warm-up; results are checked once.

use std::sync::Arc;
use std::time::Duration;

use comm_core::cuda::cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use comm_core::cuda::{
    DeviceMemory, DeviceOwned, PatternKernels, driver_error, event_times, record_each,
    timing_events,
};
use comm_core::{Communicator, DType, Error, ReduceOp, Result, ThreadsBootstrap};
use comm_nccl::NcclComm;

const CALLS: usize = 122;
const COUNT: usize = 3 * 7168;

const USAGE: &str = "usage: graph_step [--replays N | N]  (default 200)";

fn main() {
    let replays = match parse_args() {
        Ok(Some(n)) => n,
        Ok(None) => {
            println!("{USAGE}");
            return;
        }
        Err(e) => {
            eprintln!("graph_step: {e}\n{USAGE}");
            std::process::exit(2);
        }
    };
    if let Err(e) = run(replays) {
        eprintln!("graph_step: {e}");
        std::process::exit(1);
    }
}

/// Timed replays (`--replays N`, or N alone as the bundle's runner passes it); `None`
/// for `--help`.
fn parse_args() -> std::result::Result<Option<usize>, lexopt::Error> {
    use lexopt::prelude::*;

    let mut replays = 200;
    let mut parser = lexopt::Parser::from_env();
    while let Some(arg) = parser.next()? {
        match arg {
            Long("replays") => replays = parser.value()?.parse()?,
            Value(n) => replays = n.parse()?,
            Short('h') | Long("help") => return Ok(None),
            _ => return Err(arg.unexpected()),
        }
    }
    Ok(Some(replays))
}

fn run(replays: usize) -> Result<()> {
    let bootstrap = ThreadsBootstrap::create(1).remove(0);
    let comm = NcclComm::new(Arc::new(bootstrap), 0)?;
    let memory = DeviceMemory::new(0)?;
    let kernels = PatternKernels::load(memory.context())?;
    let stream = memory.stream().clone();
    let sends: Vec<DeviceOwned> = (0..CALLS)
        .map(|_| memory.alloc(DType::BF16, COUNT))
        .collect::<Result<_>>()?;
    let mut recvs: Vec<DeviceOwned> = (0..CALLS)
        .map(|_| memory.alloc(DType::BF16, COUNT))
        .collect::<Result<_>>()?;
    let mut sends = sends;
    for (i, s) in sends.iter_mut().enumerate() {
        kernels.fill(s.view_mut(0, COUNT)?, 0x5eed ^ i as u64, 0)?;
    }
    let step = |recvs: &mut [DeviceOwned]| -> Result<()> {
        for (s, r) in sends.iter().zip(recvs.iter_mut()) {
            comm.all_reduce(s.view(0, COUNT)?, r.view_mut(0, COUNT)?, ReduceOp::Sum)?;
        }
        Ok(())
    };
    // Eager: warm up, then time each step.
    for _ in 0..10 {
        step(&mut recvs)?;
    }
    comm.synchronize(memory.raw_stream())?;
    let eager = time_steps(&memory, replays, || step(&mut recvs))?;
    comm.synchronize(memory.raw_stream())?;

    stream
        .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .map_err(driver_error)?;
    let captured = step(&mut recvs);
    let graph = stream
        .end_capture(CUgraphInstantiate_flags(0))
        .map_err(driver_error)?
        .ok_or_else(|| Error::Backend {
            backend: "cuda",
            source: "the capture recorded no graph".into(),
        })?;
    captured?;
    for _ in 0..10 {
        graph.launch().map_err(driver_error)?;
    }
    comm.synchronize(memory.raw_stream())?;
    for r in recvs.iter_mut() {
        r.poison(0xff)?;
    }
    let graphed = time_steps(&memory, replays, || graph.launch().map_err(driver_error))?;
    comm.synchronize(memory.raw_stream())?;
    let mut wrong = 0;
    for (i, r) in recvs.iter().enumerate() {
        wrong +=
            kernels.check_all_reduce(r.view(0, COUNT)?, ReduceOp::Sum, 0x5eed ^ i as u64, 1)?;
    }
    println!(
        "# {CALLS} all-reduces of {COUNT} bf16 ({} B) per step, world 1, {replays} steps",
        COUNT * 2
    );
    for (name, t) in [("eager", eager), ("graph", graphed)] {
        println!(
            "{name:>6}: step {:>9.1} us   per all-reduce {:>7.2} us",
            t.as_secs_f64() * 1e6,
            t.as_secs_f64() * 1e6 / CALLS as f64
        );
    }
    println!("#wrong after graph replays: {wrong}");
    if wrong > 0 {
        return Err(Error::Backend {
            backend: "nccl",
            source: format!("{wrong} wrong elements").into(),
        });
    }
    Ok(())
}

/// Median GPU time of `replays` steps, each framed by events on the memory's stream.
fn time_steps(
    memory: &DeviceMemory,
    replays: usize,
    step: impl FnMut() -> Result<()>,
) -> Result<Duration> {
    let events = timing_events(memory.context(), replays + 1)?;
    record_each(memory.stream(), &events, step)?;
    memory.synchronize()?;
    let mut times = event_times(&events)?;
    times.sort_unstable();
    Ok(times[times.len() / 2])
}
