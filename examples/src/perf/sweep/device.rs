//! The sweep on device memory, for backends that take only GPU buffers (NCCL).
//!
//! Inputs are made and results checked by kernels of ours
//! ([`PatternKernels`](comm_core::cuda::PatternKernels)), as nccl-tests does, so a sweep
//! to gigabytes never copies data to the host. Each timed call is framed by two CUDA
//! events on the stream; a size's time is the median of those per-call GPU times, taken
//! after the stream has drained (bounded by the bootstrap's timeout). Eager rows also time
//! the calls enqueued back to back between two events, as nccl-tests does, with the host's
//! enqueue time beside (JSON `back_to_back_us`, `host_us`). In graph mode the
//! events frame replays of a graph of the timed calls instead ([`super::graph`]). In place
//! means the send buffer is also the receive buffer. The check runs on fresh data with the
//! output poisoned (all bits set: NaN, -1 or 255; out of place only, since in place the
//! output is the input), and the fingerprint of the result is taken from one copy to the
//! host.

use std::time::{Duration, Instant};

use comm_core::cuda::cudarc::driver::CudaEvent;
use comm_core::cuda::stream::wait_stream;
use comm_core::cuda::{
    DeviceMemory, DeviceOwned, PatternKernels, device_count, driver_error, event_times,
    record_each, timing_events,
};
use comm_core::{Collective, MemoryLocation, Result};
use comm_select::Launch;

use super::graph::GRAPH_REPLAYS;
use super::{Measured, Point, Row, Run, iterations, median, per_call_us, warmup_calls};
use crate::perf::data::{fingerprint, mix64};

/// Kernels that ranks sharing one GPU in one process may have queued together. Beyond
/// some number the driver holds a rank's later launches back until earlier kernels finish,
/// and those wait for the held-back kernels of their peers: on an H200 (CUDA 13), graphs of
/// ranks x calls = 3200 ran and 4800 ended in the kernels' timeout.
const SHARED_GPU_QUEUED_KERNELS: usize = 2048;

impl Run<'_> {
    /// The most calls a rank may enqueue before it waits for them (timed iterations, the
    /// calls of one graph): unbounded unless ranks share a GPU in this process.
    fn queued_calls_bound(&self) -> Result<usize> {
        if self.bootstrap != crate::launch::Mode::Threads.name() {
            return Ok(usize::MAX);
        }
        let sharing = self.comm.world_size().div_ceil(device_count()?.max(1));
        Ok(if sharing > 1 {
            SHARED_GPU_QUEUED_KERNELS / sharing
        } else {
            usize::MAX
        })
    }

    /// [`Run::sweep`] for device-memory backends.
    pub(super) fn sweep_device(&self, points: Vec<Point>) -> Result<Vec<Row>> {
        let cfg = self.cfg;
        // The device rule of the GPU backends: one GPU per rank of a node.
        let ordinal = self.ctl.local_rank() % device_count()?;
        let memory = DeviceMemory::new(ordinal)?;
        self.comm.capabilities().check(
            self.backend,
            Collective::AllReduce,
            cfg.dtype,
            Some(cfg.op),
            points.first().map_or(0, |p| p.bytes as usize),
            MemoryLocation::Device {
                ordinal: ordinal as i32,
                stream: memory.raw_stream(),
            },
        )?;
        let kernels = PatternKernels::load(memory.context())?;
        let largest = points.iter().map(|p| p.count).max().unwrap_or(0);
        let mut send = memory.alloc(cfg.dtype, largest)?;
        let mut recv = memory.alloc(cfg.dtype, if cfg.out_of_place { largest } else { 0 })?;
        let mut rows = Vec::with_capacity(points.len());
        for (index, point) in points.iter().enumerate() {
            (self.observe)(super::Event::Starting {
                backend: self.backend,
                index,
                total: points.len(),
                bytes: point.bytes,
            });
            let (iters, mine) =
                self.measure_device(point, index, &memory, &kernels, &mut send, &mut recv)?;
            let row = self.gather(point, iters, &mine, true)?;
            (self.observe)(super::Event::Finished(&row));
            rows.push(row);
        }
        Ok(rows)
    }

    fn measure_device(
        &self,
        point: &Point,
        index: usize,
        memory: &DeviceMemory,
        kernels: &PatternKernels,
        send: &mut DeviceOwned,
        recv: &mut DeviceOwned,
    ) -> Result<(usize, Vec<Measured>)> {
        let (cfg, rank, ranks) = (self.cfg, self.comm.rank(), self.comm.world_size());
        let seed = |purpose: u64| mix64(cfg.seed ^ mix64((index as u64) << 8 | purpose));
        let n = point.count;
        let placements = cfg.placements();
        kernels.fill(send.view_mut(0, n)?, seed(1), rank as u32)?;
        let (warmup, iters) = match (cfg.warmup, cfg.iters) {
            (Some(warmup), Some(iters)) => (warmup, iters),
            // As on the host: the first warm-up call, drained, sets the counts that fit
            // the time budget, agreed on the slowest rank.
            (warmup, iters) => {
                self.drain(memory)?;
                let start = Instant::now();
                self.call_device(placements[0], send, recv, n)?;
                self.drain(memory)?;
                let slowest = self.slowest(start.elapsed().as_secs_f64())?;
                let (warmup, iters) = iterations(slowest, warmup, iters);
                (warmup - 1, iters)
            }
        };
        let iters = iters.min(self.queued_calls_bound()?);
        // Made before the ranks line up, so that no rank starts its clock late: one event
        // per timed call, or per timed replay, and one before the first.
        let timed = match self.launch {
            Launch::Eager => iters,
            Launch::Graph => GRAPH_REPLAYS,
        };
        let events = timing_events(memory.context(), timed + 1)?;
        // A capture cannot hold a backend's first-use setup: each placement is called
        // eagerly at least once before its graph is captured.
        let least_warmup = usize::from(self.launch == Launch::Graph);
        let mut measured = Vec::with_capacity(placements.len());
        for (i, &in_place) in placements.iter().enumerate() {
            for _ in 0..warmup_calls(cfg, i, warmup).max(least_warmup) {
                self.call_device(in_place, send, recv, n)?;
            }
            self.drain(memory)?;
            self.comm.barrier()?;
            let calls = |send: &mut DeviceOwned, recv: &mut DeviceOwned, count: usize| {
                (0..count).try_for_each(|_| self.call_device(in_place, send, recv, n))
            };
            let mut back_to_back = (f64::NAN, f64::NAN);
            let (median_us, graph) = match self.launch {
                Launch::Eager => {
                    let call = self.median_each(memory, &events, || calls(send, recv, 1))?;
                    back_to_back =
                        self.back_to_back(memory, &events, iters, || calls(send, recv, iters))?;
                    (per_call_us(call, 1), None)
                }
                Launch::Graph => {
                    let graph =
                        crate::graph::capture(memory.stream(), || calls(send, recv, iters))?;
                    (
                        self.time_graph(memory, &events, &graph, iters)?,
                        Some(graph),
                    )
                }
            };
            let timed = Measured {
                back_to_back_us: back_to_back.0,
                host_us: back_to_back.1,
                ..Measured::unchecked(median_us)
            };
            if !cfg.check {
                if let Some(graph) = graph {
                    self.retire_graphs(vec![graph])?;
                }
                measured.push(timed);
                continue;
            }
            kernels.fill(send.view_mut(0, n)?, seed(2), rank as u32)?;
            if !in_place {
                recv.poison(0xff)?;
            }
            let graphs = match graph {
                None => {
                    calls(send, recv, 1)?;
                    Vec::new()
                }
                Some(timed) => {
                    self.replay_checked(memory, timed, in_place, || calls(send, recv, 1))?
                }
            };
            self.drain(memory)?;
            if !graphs.is_empty() {
                self.retire_graphs(graphs)?;
            }
            let out = if in_place { &*send } else { &*recv };
            let wrong = kernels.check_all_reduce(out.view(0, n)?, cfg.op, seed(2), ranks as u32)?;
            let bytes = out.read()?;
            measured.push(Measured {
                wrong,
                fingerprint: fingerprint(&bytes[..n * cfg.dtype.size()]),
                ..timed
            });
        }
        Ok((iters, measured))
    }

    fn call_device(
        &self,
        in_place: bool,
        send: &mut DeviceOwned,
        recv: &mut DeviceOwned,
        n: usize,
    ) -> Result<()> {
        if in_place {
            self.comm
                .all_reduce_in_place(send.view_mut(0, n)?, self.cfg.op)
        } else {
            self.comm
                .all_reduce(send.view(0, n)?, recv.view_mut(0, n)?, self.cfg.op)
        }
    }

    /// The median GPU time of one `enqueue` (one call, or one graph replay): it runs
    /// between each two consecutive `events` (at least two), recorded on the stream, and
    /// is timed once the stream has drained.
    pub(super) fn median_each(
        &self,
        memory: &DeviceMemory,
        events: &[CudaEvent],
        enqueue: impl FnMut() -> Result<()>,
    ) -> Result<Duration> {
        record_each(memory.stream(), events, enqueue)?;
        self.drain(memory)?;
        Ok(median(&mut event_times(events)?))
    }

    /// `iters` calls enqueued back to back between two of `events` (nccl-tests' way), after
    /// the ranks line up: (GPU µs per call, host µs per call to enqueue them).
    fn back_to_back(
        &self,
        memory: &DeviceMemory,
        events: &[CudaEvent],
        iters: usize,
        enqueue: impl FnOnce() -> Result<()>,
    ) -> Result<(f64, f64)> {
        self.drain(memory)?;
        self.comm.barrier()?;
        let stream = memory.stream();
        events[0].record(stream).map_err(driver_error)?;
        let start = Instant::now();
        enqueue()?;
        let host = start.elapsed();
        events[1].record(stream).map_err(driver_error)?;
        self.drain(memory)?;
        let gpu = event_times(&events[..2])?[0];
        Ok((per_call_us(gpu, iters), per_call_us(host, iters)))
    }

    /// Waits for the stream, bounded like every other wait of the job.
    pub(super) fn drain(&self, memory: &DeviceMemory) -> Result<()> {
        wait_stream(
            memory.context(),
            memory.raw_stream(),
            self.ctl.timeout(),
            || Ok(()),
        )
    }
}
