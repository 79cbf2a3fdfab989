//! GPU time between events on a stream: how the benches, examples and probes time calls.
//!
//! Events are made before the timed work (so that making them never falls inside a timed
//! span, nor delays one rank's first call behind its peers'), recorded around each call with
//! [`record_each`], and read with [`event_times`] once the stream has passed the last of
//! them. Waiting for the stream is the caller's, so that each caller bounds it its
//! own way.

use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::{CudaContext, CudaEvent, CudaStream, sys};

use super::driver_error;
use crate::Result;

/// An event that keeps GPU time (`CU_EVENT_DEFAULT`: timing on, waits spin).
pub fn timing_event(ctx: &Arc<CudaContext>) -> Result<CudaEvent> {
    ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
        .map_err(driver_error)
}

/// `count` timing events: for `count - 1` calls, one before the first and one after each.
pub fn timing_events(ctx: &Arc<CudaContext>, count: usize) -> Result<Vec<CudaEvent>> {
    (0..count).map(|_| timing_event(ctx)).collect()
}

/// Records `events[0]` on `stream`, then once per further event runs `enqueue` (work on
/// `stream`, or on streams that `stream` joins) and records that event after it.
pub fn record_each(
    stream: &CudaStream,
    events: &[CudaEvent],
    mut enqueue: impl FnMut() -> Result<()>,
) -> Result<()> {
    let Some((first, rest)) = events.split_first() else {
        return Ok(());
    };
    first.record(stream).map_err(driver_error)?;
    for event in rest {
        enqueue()?;
        event.record(stream).map_err(driver_error)?;
    }
    Ok(())
}

/// The GPU times between consecutive `events`; every one must have been recorded and
/// passed by its stream.
pub fn event_times(events: &[CudaEvent]) -> Result<Vec<Duration>> {
    events
        .windows(2)
        .map(|w| {
            w[0].elapsed_ms(&w[1])
                .map(|ms| Duration::from_secs_f64(f64::from(ms) / 1e3))
                .map_err(driver_error)
        })
        .collect()
}
