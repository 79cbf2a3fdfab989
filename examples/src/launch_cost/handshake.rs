//! Handshakes: the least a call of two ranks sharing a GPU costs over host memory. Each
//! rank's stream replays a graph of kernels that do nothing but hear from the peer once
//! (`launch_probe_handshake`: store this call's number into its own flag in host memory,
//! poll the peer's until it holds the same), launched as the peer kernels are, and both
//! streams replay at once. Every all-reduce between such ranks does at least that each
//! call: a kernel, and a write of its own seen by the other rank through host memory. So it
//! holds what an empty kernel and a ping-pong's half round, timed apart, leave out: the flag
//! written by a kernel just started, and the wait of each call for the slower rank.

use std::ffi::c_void;
use std::sync::Arc;
use std::time::Duration;

use comm_core::cuda::cudarc::driver::{CudaFunction, CudaStream};
use comm_core::cuda::{DeviceMemory, KernelCache, driver_error, launch_overlapping};
use comm_core::{DType, Error, Result};

use super::streams::Replays;
use super::{LAUNCH_PROBE, ProbeArgs};

/// How long a kernel waits for the peer's flag before it gives up (far beyond any trip).
const PATIENCE: Duration = Duration::from_secs(2);

/// One measurement of [`handshakes`].
#[derive(Debug, Clone, Copy)]
pub struct Handshake {
    /// A system fence after each flag's store.
    pub fence: bool,
    /// GPU time of a round of replays divided by the kernels of one graph: one call of the
    /// two ranks, us.
    pub per_call_us: f64,
}

/// Times graphs of `kernels` handshakes of `(blocks, threads)` on two streams of GPU
/// `ordinal`, the flags at device addresses `flags` (host memory mapped into the GPU, a
/// line each, zeroed), without and with a fence after each store. An error where a kernel
/// gave up waiting for the other.
pub fn handshakes(
    ordinal: usize,
    flags: [u64; 2],
    kernels: usize,
    grid: (u32, u32),
) -> Result<Vec<Handshake>> {
    let memory = DeviceMemory::new(ordinal)?;
    let ctx = memory.context().clone();
    ctx.bind_to_thread().map_err(driver_error)?;
    let f = KernelCache::global().function(&ctx, &LAUNCH_PROBE, "launch_probe_handshake")?;
    let streams = [0, 1]
        .map(|_| ctx.new_stream().map_err(driver_error))
        .into_iter()
        .collect::<Result<Vec<_>>>()?;
    let replays = Replays::new(&ctx)?;
    let mut out = Vec::new();
    for fence in [false, true] {
        // Each measurement counts its calls from zero, in flags of its own.
        let mut calls = memory.alloc(DType::I64, 4)?;
        calls.write(&[0u8; 32])?;
        let base = calls.buffer().device_ptr();
        let flag_line = if fence { 64 } else { 0 };
        let graphs = (0..2)
            .map(|r| {
                let args = ProbeArgs {
                    words: words(
                        base + 16 * r as u64,
                        flags[r] + flag_line,
                        flags[1 - r] + flag_line,
                        fence,
                    ),
                };
                crate::graph::capture(&streams[r], || {
                    enqueue(&f, args, grid, kernels, &streams[r])
                })
            })
            .collect::<Result<Vec<_>>>()?;
        memory.synchronize()?;
        let per_call_us = replays.per_kernel_us(&streams, &graphs, kernels)?;
        let words = calls.read()?;
        let word = |i: usize| u64::from_le_bytes(words[8 * i..8 * i + 8].try_into().expect("8"));
        if word(1) != 0 || word(3) != 0 {
            return Err(Error::Timeout {
                what: "the handshake probe's flag of the other stream".into(),
                after: PATIENCE,
            });
        }
        out.push(Handshake { fence, per_call_us });
    }
    Ok(out)
}

/// The kernel's words: its call counter, its flag, the peer's flag, the fence, the patience.
fn words(calls: u64, mine: u64, peer: u64, fence: bool) -> [u64; 32] {
    let mut w = [0u64; 32];
    w[..5].copy_from_slice(&[
        calls,
        mine,
        peer,
        u64::from(fence),
        PATIENCE.as_nanos() as u64,
    ]);
    w
}

/// `kernels` handshakes on `stream` (being captured).
fn enqueue(
    f: &CudaFunction,
    mut args: ProbeArgs,
    grid: (u32, u32),
    kernels: usize,
    stream: &Arc<CudaStream>,
) -> Result<()> {
    for _ in 0..kernels {
        let mut params = [&mut args as *mut ProbeArgs as *mut c_void];
        // SAFETY: the kernel's one parameter is a LaunchProbeArgs, which ProbeArgs mirrors;
        // its words address the counters and flags allocated by the caller, which outlive
        // the graphs' replays (the caller synchronizes before they are freed).
        unsafe { launch_overlapping(f.cu_function(), grid, stream.cu_stream(), &mut params)? };
    }
    Ok(())
}
