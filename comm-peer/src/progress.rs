//! Where the peer of a timed-out wait is: every collective kernel announces its call first
//! thing (its tag, call number + 1, in every word of its call slot in each peer's pad), so
//! once a wait for a peer has given up, this rank's pad says whether the peer's kernel for
//! this call ever started. That tells a peer that is gone or held back (a process that
//! died, a kernel queued behind another) from one that started and got stuck.

use std::sync::Arc;
use std::time::Duration;

use comm_core::cuda::cudarc::driver::{CudaContext, result};
use comm_core::cuda::stream::wait_stream;
use comm_core::cuda::{driver_error, raw_stream};
use comm_core::{Error, Result};

use crate::layout::{CALL_WORDS, CALLS_OFFSET, MAX_RANKS};

/// How long the copies of the two words may take: they move a few bytes, and nothing of
/// this rank runs any more after its kernel gave up.
const READ_BOUND: Duration = Duration::from_secs(1);

/// This call's tag (from `state`, this rank's `PeerState`, whose call counter the failed
/// kernel did not advance) and the latest tag `peer` announced in this rank's pad (at
/// `pad`, the start of this rank's region); 0 for none.
pub(crate) fn read(
    ctx: &Arc<CudaContext>,
    state: u64,
    pad: u64,
    peer: usize,
) -> Result<(u32, u32)> {
    if peer >= MAX_RANKS {
        return Err(Error::InvalidArgument(format!(
            "peer memory: no rank {peer}"
        )));
    }
    ctx.bind_to_thread().map_err(driver_error)?;
    let stream = ctx.new_stream().map_err(driver_error)?;
    let slot = |parity: usize| {
        pad + (CALLS_OFFSET + (parity * MAX_RANKS + peer) * (CALL_WORDS + 1) * 8) as u64
    };
    let mut seq = [0u32; 1];
    let mut words = [[0u64; 1]; 2];
    // SAFETY: `state` holds at least one u32 and each slot one u64 (layout), all alive as
    // long as the group is; the copies finish before the buffers go (waited for below).
    unsafe {
        result::memcpy_dtoh_async(&mut seq, state, stream.cu_stream()).map_err(driver_error)?;
        for (parity, word) in words.iter_mut().enumerate() {
            result::memcpy_dtoh_async(word, slot(parity), stream.cu_stream())
                .map_err(driver_error)?;
        }
    }
    wait_stream(ctx, raw_stream(&stream), READ_BOUND, || Ok(()))?;
    let tags = words.map(|[w]| (w >> 32) as u32);
    Ok((seq[0].wrapping_add(1), latest(tags)))
}

/// The later of two tags (tags grow and may wrap), ignoring 0 (no call).
fn latest([a, b]: [u32; 2]) -> u32 {
    match (a, b) {
        (0, t) | (t, 0) => t,
        (a, b) if (b.wrapping_sub(a) as i32) > 0 => b,
        (a, _) => a,
    }
}

/// A timed-out wait's message tail: this call's number against the latest call `peer`
/// announced (both tags: call number + 1; 0: none).
pub(crate) fn describe(peer: usize, this: u32, announced: u32) -> String {
    let at = format!(" (call {this} of this communicator; ");
    if announced == 0 {
        return format!("{at}rank {peer} has announced no call)");
    }
    match announced.wrapping_sub(this) as i32 {
        0 => format!("{at}rank {peer} started it, but its kernel never came this far)"),
        behind if behind < 0 => format!(
            "{at}rank {peer} last started call {announced}: its kernel for this call never started)"
        ),
        _ => format!("{at}rank {peer} is at call {announced}, ahead of this one)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_latest_announced_tag_wins_across_wrapping() {
        assert_eq!(latest([0, 0]), 0);
        assert_eq!(latest([0, 7]), 7);
        assert_eq!(latest([8, 7]), 8);
        assert_eq!(latest([7, 8]), 8);
        assert_eq!(latest([u32::MAX, 1]), 1);
    }

    #[test]
    fn a_timed_out_wait_says_whether_the_peer_started_the_call() {
        assert_eq!(
            describe(1, 9, 0),
            " (call 9 of this communicator; rank 1 has announced no call)"
        );
        assert!(describe(1, 9, 9).contains("rank 1 started it, but its kernel never came"));
        assert!(
            describe(3, 9, 8)
                .contains("rank 3 last started call 8: its kernel for this call never started")
        );
        assert!(describe(2, 9, 10).contains("rank 2 is at call 10, ahead"));
        assert!(describe(1, 2, u32::MAX).contains("never started"));
    }
}
