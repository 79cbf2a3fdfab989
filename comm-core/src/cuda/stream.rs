//! Stream handles and bounded waits.
//!
//! GPU collectives only enqueue; a host that waits for them must not wait forever when a
//! peer is gone. [`wait_stream`] polls an event recorded on the stream and calls a check
//! between polls (NCCL looks at its asynchronous error there), giving up with
//! [`Error::Timeout`] when the bound expires.

use std::time::{Duration, Instant};

use cudarc::driver::{CudaContext, CudaStream, result, sys};

use super::error::driver_error;
use crate::buffer::RawStream;
use crate::error::{Error, Result};

/// The raw handle of a `cudarc` stream, as the buffer views carry it.
pub fn raw_stream(stream: &CudaStream) -> RawStream {
    RawStream(stream.cu_stream() as usize)
}

/// The `CUstream` of a [`RawStream`].
pub fn cu_stream(stream: RawStream) -> sys::CUstream {
    stream.0 as sys::CUstream
}

/// Whether `stream` is being captured into a CUDA graph, so that work enqueued on it now
/// runs at each replay of the graph instead.
///
/// An invalidated capture counts as capturing: the stream stays in capture mode until the
/// capture ends, and what is enqueued meanwhile belongs to the (failed) graph, not to an
/// eager call. An error when the driver is missing or the handle is not a stream.
pub fn is_capturing(stream: RawStream) -> Result<bool> {
    super::probe::driver()?;
    // SAFETY: the driver is loaded; the query only reads the stream's capture state.
    let status =
        unsafe { result::stream::is_capturing(cu_stream(stream)) }.map_err(driver_error)?;
    Ok(status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
}

/// Waits until the work enqueued on `stream` so far has finished, or `timeout` passes.
///
/// `check` runs between polls; its error ends the wait. Must not be called while the
/// stream is being captured into a graph.
pub fn wait_stream(
    ctx: &CudaContext,
    stream: RawStream,
    timeout: Duration,
    mut check: impl FnMut() -> Result<()>,
) -> Result<()> {
    ctx.bind_to_thread().map_err(driver_error)?;
    let event = Event::new()?;
    // SAFETY: both handles are live; the event belongs to the current context.
    unsafe { result::event::record(event.0, cu_stream(stream)) }.map_err(driver_error)?;
    poll_until(timeout, "GPU work on the stream", || {
        // SAFETY: the event is live for the whole wait.
        match unsafe { result::event::query(event.0) } {
            Ok(()) => Ok(true),
            Err(e) if e.0 == sys::CUresult::CUDA_ERROR_NOT_READY => check().map(|()| false),
            Err(e) => Err(driver_error(e)),
        }
    })
}

/// Polls `ready` until it says yes (`Ok(true)`) or fails, at most `timeout`, after which
/// the wait gives up with [`Error::Timeout`] naming `what`. Spins at first, so that a short
/// wait returns at once, then sleeps 50 us between polls, so that a long one costs no core.
pub fn poll_until(
    timeout: Duration,
    what: &str,
    mut ready: impl FnMut() -> Result<bool>,
) -> Result<()> {
    let start = Instant::now();
    let mut spins = 0u32;
    loop {
        if ready()? {
            return Ok(());
        }
        if start.elapsed() >= timeout {
            return Err(Error::Timeout {
                what: what.into(),
                after: timeout,
            });
        }
        spins += 1;
        if spins < 1000 {
            std::hint::spin_loop();
        } else {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
}

/// An event without timing, destroyed on drop.
struct Event(sys::CUevent);

impl Event {
    fn new() -> Result<Self> {
        result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
            .map(Event)
            .map_err(driver_error)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: created by `new`, destroyed once; failure leaves nothing to do.
        let _ = unsafe { result::event::destroy(self.0) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_poll_ends_when_ready_fails_or_times_out() {
        let mut polls = 0;
        poll_until(Duration::from_secs(5), "ready on the third poll", || {
            polls += 1;
            Ok(polls == 3)
        })
        .unwrap();
        assert_eq!(polls, 3);

        let failed = poll_until(Duration::from_secs(5), "fails", || {
            Err(Error::Aborted("a peer gave up".into()))
        });
        assert!(matches!(failed, Err(Error::Aborted(_))), "{failed:?}");

        let bound = Duration::from_millis(30);
        let started = Instant::now();
        let never = poll_until(bound, "never ready", || Ok(false));
        assert!(started.elapsed() >= bound);
        match never {
            Err(Error::Timeout { what, after }) => {
                assert_eq!(what, "never ready");
                assert_eq!(after, bound);
            }
            other => panic!("expected a timeout, got {other:?}"),
        }
    }
}
