//! [`Staging`]: a symmetric window of the communicator's own, through which all-reduces of
//! unregistered buffers reach NCCL's symmetric kernels (algorithm `symmetric`): a copy
//! in, the all-reduce in place in the window, a copy out, all on the caller's stream (so
//! they can be captured into a graph).
//!
//! The window is one per communicator, so staged calls must not overlap: NCCL orders its
//! own kernels of one communicator, but not our copies. Calls on one stream are ordered by
//! it; a staged call on another stream first waits (an event) for the last staged call's
//! stream. Where that wait cannot be made (either stream is capturing a graph), the call
//! takes the plain path instead, which does not touch the window (ranks compare the path
//! they take, as the window they call on, when calls are validated). A graph that holds
//! staged calls uses the window when it is replayed: replay it on the stream of the
//! communicator's other staged calls, or wait for it before they run.

use std::cell::Cell;

use comm_core::cuda::cudarc::driver::{result, sys};
use comm_core::cuda::driver_error;
use comm_core::cuda::stream::{cu_stream, is_capturing};
use comm_core::{RawStream, Result};

use crate::raw::{Op, RawComm};
use crate::window::{Place, Window};

/// The staging window and the stream its last staged call ran on.
#[derive(Debug)]
pub(crate) struct Staging {
    window: Window,
    last_stream: Cell<Option<RawStream>>,
    /// Recorded on the last stream when a call arrives on another; created on first need.
    event: Cell<Option<sys::CUevent>>,
}

// SAFETY: the event is a driver handle usable from any thread with the context current;
// `Staging` is not `Sync`, so it is used from one thread at a time.
unsafe impl Send for Staging {}

impl Staging {
    pub(crate) fn new(window: Window) -> Self {
        Staging {
            window,
            last_stream: Cell::new(None),
            event: Cell::new(None),
        }
    }

    /// The window's size: the largest all-reduce that can be staged.
    pub(crate) fn bytes(&self) -> usize {
        self.window.bytes()
    }

    /// The window, where ranks compare it: a staged call's buffers are, to NCCL, this
    /// window at offset 0.
    pub(crate) fn place(&self) -> Place {
        Place::Window {
            id: self.window.id(),
            offset: 0,
        }
    }

    /// Whether an all-reduce of `bytes` on `stream` can be staged, ordering it after the
    /// last staged call when it can. `false` when it does not fit, or cannot be ordered
    /// (a stream is capturing): the call must not use the window.
    pub(crate) fn prepare(&self, bytes: usize, stream: RawStream) -> Result<bool> {
        if bytes > self.bytes() {
            return Ok(false);
        }
        self.order_after_last(stream)
    }

    fn order_after_last(&self, stream: RawStream) -> Result<bool> {
        let last = match self.last_stream.get() {
            Some(last) if last != stream => last,
            _ => return Ok(true),
        };
        if is_capturing(stream)? || is_capturing(last).unwrap_or(true) {
            return Ok(false);
        }
        let event = match self.event.get() {
            Some(event) => event,
            None => {
                let event = result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
                    .map_err(driver_error)?;
                self.event.set(Some(event));
                event
            }
        };
        // SAFETY: a live event of this context; both streams belong to it (checked by the
        // caller for the new one, by an earlier call for the last).
        unsafe {
            result::event::record(event, cu_stream(last)).map_err(driver_error)?;
            result::stream::wait_event(
                cu_stream(stream),
                event,
                sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
            )
            .map_err(driver_error)?;
        }
        Ok(true)
    }

    /// Enqueues the all-reduce `op` of `count` elements (`bytes` in all) from `send` to
    /// `recv` through the window, after [`Self::prepare`] said it can.
    ///
    /// # Safety
    /// As [`RawComm::enqueue`]; the context of the window is current; `prepare` returned
    /// `true` for this call.
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn all_reduce(
        &self,
        raw: &RawComm,
        op: Op,
        (send, recv): (u64, u64),
        count: usize,
        bytes: usize,
        dtype: cudarc::nccl::sys::ncclDataType_t,
        stream: RawStream,
    ) -> Result<()> {
        let stage = self.window.ptr();
        let st = cu_stream(stream);
        // SAFETY: `send` and `recv` hold `bytes` (the caller's contract); the window holds
        // at least `bytes`; everything is ordered on `stream`.
        unsafe {
            if bytes > 0 {
                result::memcpy_dtod_async(stage, send, bytes, st).map_err(driver_error)?;
            }
            raw.enqueue(op, stage, stage, count, dtype, stream.0)?;
            if bytes > 0 {
                result::memcpy_dtod_async(recv, stage, bytes, st).map_err(driver_error)?;
            }
        }
        self.last_stream.set(Some(stream));
        Ok(())
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if let Some(event) = self.event.take() {
            let _ = self.window.context().bind_to_thread();
            // SAFETY: created here, destroyed once; the streams that used it were drained
            // (the communicator's drop contract).
            let _ = unsafe { result::event::destroy(event) };
        }
    }
}
