//! CUDA graphs for the programs that time replays (`allreduce-perf --graph`, `verify-step`,
//! `gpu-check`, `gpu-bench`): [`capture`] records a stream's work into one graph and
//! always ends the capture, so that a failed call never leaves the stream capturing.

use std::sync::Arc;

use comm_core::cuda::cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use comm_core::cuda::cudarc::driver::{CudaGraph, CudaStream, DriverError};
use comm_core::cuda::driver_error;
use comm_core::{Error, Result};

/// Captures what `enqueue` puts on `stream` (and on streams it joins to it) into a graph,
/// instantiated and launched on `stream` by [`CudaGraph::launch`].
///
/// The capture is thread-local: other threads (in-process ranks capturing their own
/// streams) may go on calling CUDA meanwhile. It ends whatever `enqueue` does, panics
/// included. `enqueue`'s error is returned before the driver's: a failed call is what
/// invalidates a capture, and the driver would only say that it was invalidated.
pub fn capture(
    stream: &Arc<CudaStream>,
    enqueue: impl FnOnce() -> Result<()>,
) -> Result<CudaGraph> {
    stream
        .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .map_err(driver_error)?;
    let mut capturing = Capturing(Some(stream));
    let enqueued = enqueue();
    let ended = capturing.end();
    enqueued?;
    ended
        .map_err(driver_error)?
        .ok_or_else(|| Error::backend("cuda", "the capture recorded no graph"))
}

/// A stream in capture mode; dropping it (on a panic in the capture) ends the capture and
/// throws the graph away.
struct Capturing<'a>(Option<&'a Arc<CudaStream>>);

impl Capturing<'_> {
    fn end(&mut self) -> std::result::Result<Option<CudaGraph>, DriverError> {
        match self.0.take() {
            Some(stream) => stream.end_capture(CUgraphInstantiate_flags(0)),
            None => Ok(None),
        }
    }
}

impl Drop for Capturing<'_> {
    fn drop(&mut self) {
        // Nothing to report to: the thread is unwinding already.
        let _ = self.end();
    }
}

/// Uploads a graph just captured on `memory`'s stream and waits for the upload (bounded by
/// the bootstrap's timeout), then for every rank to be as far, before its first replay. A
/// rank's replayed kernels spin for their peers; where ranks are threads sharing a GPU, a
/// peer may still be capturing, instantiating or uploading its own graph, which can wait
/// for the device, and so for the spinning kernels: both would wait until a timeout.
pub fn line_up_to_launch(
    graph: &CudaGraph,
    memory: &comm_core::cuda::DeviceMemory,
    ctl: &dyn comm_core::Bootstrap,
) -> Result<()> {
    graph.upload().map_err(driver_error)?;
    comm_core::cuda::stream::wait_stream(
        memory.context(),
        memory.raw_stream(),
        ctl.timeout(),
        || Ok(()),
    )?;
    ctl.barrier()
}
