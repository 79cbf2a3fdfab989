//! Graph mode of the device sweep (`--graph`, nccl-tests' `-G`).
//!
//! Per size and placement the warm-up calls run eagerly (backends set up at first use,
//! which a capture cannot hold), then the `-n` timed calls are captured into one CUDA graph
//! on the buffers' stream ([`crate::graph::capture`]) and uploaded; once every rank is that
//! far, it is replayed once untimed, then [`GRAPH_REPLAYS`] times between CUDA events; the
//! reported time of one all-reduce is the median replay's time divided by the calls in it.
//!
//! `--check` checks the result of a replay on fresh data, against the same reference as
//! in eager mode: that of one all-reduce of the inputs.

use comm_core::Result;
use comm_core::cuda::cudarc::driver::{CudaEvent, CudaGraph};
use comm_core::cuda::{DeviceMemory, driver_error};

use super::{Run, per_call_us};

/// Timed replays of a size's graph; the median is reported. Each replay holds `-n` calls,
/// so a handful is enough for a stable median without multiplying the sweep's time.
pub(super) const GRAPH_REPLAYS: usize = 5;

impl Run<'_> {
    /// Microseconds per call of `graph`, which holds `calls` calls: one untimed replay,
    /// then one replay between each two consecutive `events`; the ranks line up in
    /// between, as before eager timing.
    pub(super) fn time_graph(
        &self,
        memory: &DeviceMemory,
        events: &[CudaEvent],
        graph: &CudaGraph,
        calls: usize,
    ) -> Result<f64> {
        self.line_up_to_launch(memory, graph)?;
        graph.launch().map_err(driver_error)?;
        self.drain(memory)?;
        self.comm.barrier()?;
        let replay = self.median_each(memory, events, || graph.launch().map_err(driver_error))?;
        Ok(per_call_us(replay, calls))
    }

    /// Enqueues the checked call of a graph-mode placement on the data now in the buffers.
    /// Out of place it is a replay of the `timed` graph itself: each of its calls writes
    /// the same result. In place each call would reduce the result of the one before, and
    /// the reference is that of one all-reduce (as the eager check makes one call), so it
    /// is a replay of a graph of the one call that `enqueue_one` enqueues. Returns the
    /// graphs, for [`Run::retire_graphs`] once the replay has drained.
    pub(super) fn replay_checked(
        &self,
        memory: &DeviceMemory,
        timed: CudaGraph,
        in_place: bool,
        enqueue_one: impl FnOnce() -> Result<()>,
    ) -> Result<Vec<CudaGraph>> {
        let mut graphs = vec![timed];
        if in_place {
            let one = crate::graph::capture(memory.stream(), enqueue_one)?;
            self.line_up_to_launch(memory, &one)?;
            graphs.push(one);
        }
        let checked = graphs.last().expect("the timed graph at least");
        checked.launch().map_err(driver_error)?;
        Ok(graphs)
    }

    fn line_up_to_launch(&self, memory: &DeviceMemory, graph: &CudaGraph) -> Result<()> {
        crate::graph::line_up_to_launch(graph, memory, self.ctl)
    }

    /// Destroys `graphs`, whose replays this rank has drained, while no rank has work on
    /// the device. `cuGraphExecDestroy` can wait for the device and meanwhile hold a driver
    /// lock that every launch of the process needs: ranks that are threads sharing a GPU
    /// then deadlock, one destroying while a peer's kernel spins for a call that the other
    /// thread cannot enqueue. Hence a host barrier on each side of the destruction.
    pub(super) fn retire_graphs(&self, graphs: Vec<CudaGraph>) -> Result<()> {
        self.ctl.barrier()?;
        drop(graphs);
        self.ctl.barrier()
    }
}
