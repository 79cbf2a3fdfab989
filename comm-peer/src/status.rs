//! The error record kernels write when a spin-wait gives up or ranks disagree about a
//! call: words of host-mapped memory (`cuMemHostAlloc` with `DEVICEMAP`), readable by the
//! host at any time without synchronising, even while the kernel that wrote it is still
//! winding down.

use std::sync::Arc;
use std::time::Duration;

use comm_core::cuda::cudarc::driver::{CudaContext, sys};
use comm_core::cuda::driver_error;
use comm_core::{Error, Result};

use crate::calls::describe;
use crate::layout::CALL_WORDS;

/// Codes of word 0 (the kernels' `PEER_*`).
const OK: u32 = 0;
const TIMEOUT_BARRIER: u32 = 1;
const TIMEOUT_LAMPORT: u32 = 2;
const TIMEOUT_SIGNAL: u32 = 3;
const MISMATCH: u32 = 4;
const TIMEOUT_CALL: u32 = 5;

/// Words of the record: `[code, rank, phase, peer]`, then (for a mismatch) this rank's call
/// and the peer's, `CALL_WORDS` each.
const WORDS: usize = 4 + 2 * CALL_WORDS;
/// The word after the record: the ticket of the last barrier the host waits for whose
/// kernel saw every rank arrive (the kernels' `PEER_STATUS_BARRIER`).
const BARRIER_WORD: usize = WORDS;
/// Words allocated: the record and the barrier word.
const ALLOCATED: usize = WORDS + 1;

/// The host-mapped record (see [`WORDS`]).
#[derive(Debug)]
pub(crate) struct Status {
    host: *mut u32,
    device: u64,
    ctx: Arc<CudaContext>,
}

// SAFETY: the pointer is pinned host memory owned by this value; it is read and written
// with volatile accesses only, and freed once, on drop.
unsafe impl Send for Status {}
// SAFETY: as above; concurrent volatile reads of words the device writes are benign.
unsafe impl Sync for Status {}

impl Status {
    pub(crate) fn new(ctx: &Arc<CudaContext>) -> Result<Self> {
        ctx.bind_to_thread().map_err(driver_error)?;
        let mut host: *mut std::ffi::c_void = std::ptr::null_mut();
        // SAFETY: valid out-pointer; ALLOCATED words of pinned, device-mapped memory.
        unsafe { sys::cuMemHostAlloc(&mut host, 4 * ALLOCATED, sys::CU_MEMHOSTALLOC_DEVICEMAP) }
            .result()
            .map_err(driver_error)?;
        let mut device = 0;
        // SAFETY: `host` was just allocated with DEVICEMAP in this context.
        let got = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut device, host, 0) }.result();
        let status = Status {
            host: host.cast(),
            device,
            ctx: ctx.clone(),
        };
        got.map_err(driver_error)?;
        for i in 0..ALLOCATED {
            // SAFETY: words of our allocation.
            unsafe { status.host.add(i).write_volatile(0) };
        }
        Ok(status)
    }

    /// The address kernels write to.
    pub(crate) fn device_ptr(&self) -> u64 {
        self.device
    }

    /// The ticket of the last waited-for barrier whose kernel saw every rank (0: none yet).
    pub(crate) fn barrier_passed(&self) -> u32 {
        // SAFETY: a word of our allocation, written by kernels only.
        unsafe { self.host.add(BARRIER_WORD).read_volatile() }
    }

    /// The peer a collective's recorded wait gave up on (not a signal's, not a mismatch).
    pub(crate) fn waited_for(&self) -> Option<usize> {
        // SAFETY: words of our allocation; kernels write word 0 last.
        let (code, peer) = unsafe { (self.host.read_volatile(), self.host.add(3).read_volatile()) };
        matches!(code, TIMEOUT_BARRIER | TIMEOUT_LAMPORT | TIMEOUT_CALL).then_some(peer as usize)
    }

    /// `Err(Timeout)` once a kernel has recorded a failed wait, `Err(Mismatch)` naming both
    /// calls once one has found a peer making another call.
    pub(crate) fn check(&self, timeout: Duration) -> Result<()> {
        // Every call asks: one word when nothing happened. SAFETY: word 0 of our allocation.
        if unsafe { self.host.read_volatile() } == OK {
            return Ok(());
        }
        // SAFETY: words of our allocation; kernels write word 0 last.
        let w: [u32; WORDS] = std::array::from_fn(|i| unsafe { self.host.add(i).read_volatile() });
        let what = match w[0] {
            OK => return Ok(()),
            TIMEOUT_BARRIER => format!(
                "rank {} at barrier {} of a peer-memory collective: rank {} never arrived",
                w[1], w[2], w[3]
            ),
            TIMEOUT_LAMPORT => format!(
                "rank {} in step {} of a push (Lamport) exchange: data of rank {} never arrived",
                w[1], w[2], w[3]
            ),
            TIMEOUT_SIGNAL => format!(
                "rank {} waiting for a signal of rank {} on channel {}",
                w[1], w[3], w[2]
            ),
            TIMEOUT_CALL => format!(
                "rank {} waiting for the call of rank {}: it made none",
                w[1], w[3]
            ),
            MISMATCH => {
                let (mine, theirs) = w[4..].split_at(CALL_WORDS);
                return Err(Error::Mismatch(format!(
                    "ranks disagree about a call: rank {} makes {}, rank {} makes {}",
                    w[1],
                    describe(mine),
                    w[3],
                    describe(theirs)
                )));
            }
            code => format!("a peer-memory kernel reported unknown failure {code}"),
        };
        Err(Error::Timeout {
            what,
            after: timeout,
        })
    }
}

impl Drop for Status {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: allocated by cuMemHostAlloc, freed once.
            let _ = unsafe { sys::cuMemFreeHost(self.host.cast()) };
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn codes_match_the_kernel_header() {
        let h = include_str!("../kernels/peer_sync.cuh");
        for (name, v) in [
            ("PEER_OK", super::OK),
            ("PEER_TIMEOUT_BARRIER", super::TIMEOUT_BARRIER),
            ("PEER_TIMEOUT_LAMPORT", super::TIMEOUT_LAMPORT),
            ("PEER_TIMEOUT_SIGNAL", super::TIMEOUT_SIGNAL),
            ("PEER_MISMATCH", super::MISMATCH),
            ("PEER_TIMEOUT_CALL", super::TIMEOUT_CALL),
            ("PEER_STATUS_BARRIER", super::BARRIER_WORD as u32),
        ] {
            assert!(h.contains(&format!("#define {name} {v}\n")), "{name}");
        }
    }
}
