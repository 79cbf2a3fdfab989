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
