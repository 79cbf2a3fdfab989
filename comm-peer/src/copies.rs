//! One-shot all-reduce by copies ([`Algorithm::OneshotCopy`]): the copy engines move every
//! byte; kernels only signal and sum.
//!
//! The message is cut into parts (`Cut::copies`); part `k` uses slot `k % COPY_SLOTS` of
//! each rank's staging area. On the call's stream, this rank copies its part into its slot
//! and a barrier kernel (own channel [`STAGED`]) waits until every rank's part is there. On
//! the communicator's copy stream, which waits for that, every peer's part is copied from
//! the peer's slot into this rank's device staging buffer, a kernel reduces all parts in
//! rank order (this rank's straight from its input, as one-shot pull does, so every rank
//! holds the same bits), and a barrier kernel (own channel [`READ`]) waits until every rank
//! has copied that slot, which may then be written again `COPY_SLOTS` parts later. So part
//! `k + 1` goes out while part `k` comes in and is summed.
//!
//! The call starts with the device comparison of the call (`peer_agree_only`), which also
//! shows that every peer has finished its previous call, whose kernels may still have read
//! the staging area; the copy stream forks from the call's stream after it and joins it at
//! the end, so CUDA graphs capture both. Every wait is a bounded barrier kernel: a dead peer
//! ends in `Error::Timeout` as for the other algorithms.
//!
//! Why: where the regions are host memory (GPUs without peer access), a kernel's loads
//! from it are slow and take SMs, while one GPU's copy engines carry ~55 GB/s each way to
//! host memory, both ways at once (benchmarks/history/2026-12-01.md, copy-probe).

use std::sync::Arc;

use comm_core::cuda::cudarc::driver::{CudaContext, CudaEvent, CudaStream, result, sys};
use comm_core::cuda::stream::{cu_stream, is_capturing};
use comm_core::cuda::{DeviceBuffer, driver_error, raw_stream};
use comm_core::{Error, RawStream, Result};

use crate::algorithm::Algorithm;
use crate::chunks::{COPY_SLOTS, Cut, copy_slot};
use crate::comm::{Agreed, PeerComm};
use crate::grid::{all_reduce_work, blocks};
use crate::kernels::{PeerArgs, all_reduce_kernel};
use crate::layout::{Layout, MAX_BLOCKS};

/// The communicator's own channel on which every rank says its part is staged.
const STAGED: usize = 0;
/// The one on which every rank says it has copied the peers' parts of a slot.
const READ: usize = 1;

/// What the copy algorithm keeps per communicator: its stream, events and device staging.
#[derive(Debug)]
pub(crate) struct Copies {
    /// Copies peers' parts in and sums them; forked from and joined to the call's stream.
    stream: Arc<CudaStream>,
    /// Recorded on the call's stream once the call is agreed: the copy stream starts there.
    fork: CudaEvent,
    /// Recorded on the call's stream after each part's staged barrier.
    staged: CudaEvent,
    /// Recorded on the copy stream after each part's read barrier, one per slot.
    read: [CudaEvent; COPY_SLOTS],
    /// Recorded on the copy stream at the end: the call's stream waits for it.
    join: CudaEvent,
    /// Every rank's part of one launch, `slot` bytes apart (this rank's own stays unused).
    staging: DeviceBuffer,
    slot: usize,
    /// Most blocks of the summing kernel: it reads and writes this device's memory only,
    /// so it may use the whole device (the others' grids are sized for the link).
    sum_blocks: u32,
}

impl Copies {
    /// The stream, events and `world` parts of staging for `layout`, on `ctx` (a device of
    /// `sms` multiprocessors); the staging comes from the pool on `stream` (which it waits for).
    pub(crate) fn new(
        ctx: &Arc<CudaContext>,
        stream: &Arc<CudaStream>,
        layout: &Layout,
        sms: u32,
    ) -> Result<Self> {
        let slot = copy_slot(layout);
        let staging = DeviceBuffer::alloc_on(stream, layout.world * slot)?;
        stream.synchronize().map_err(driver_error)?;
        let event = || ctx.new_event(None).map_err(driver_error);
        Ok(Copies {
            stream: ctx.new_stream().map_err(driver_error)?,
            fork: event()?,
            staged: event()?,
            read: [event()?, event()?, event()?, event()?],
            join: event()?,
            staging,
            slot,
            sum_blocks: sms.clamp(1, MAX_BLOCKS),
        })
    }
}

/// Enqueues a record of `event` on `stream`.
fn record(event: &CudaEvent, stream: RawStream) -> Result<()> {
    // SAFETY: both handles are live and of the current context (bound by the caller).
    unsafe { result::event::record(event.cu_event(), cu_stream(stream)) }.map_err(driver_error)
}

/// Makes `stream` wait for the last record of `event`.
fn wait(stream: RawStream, event: &CudaEvent) -> Result<()> {
    // SAFETY: as in `record`.
    unsafe {
        result::stream::wait_event(
            cu_stream(stream),
            event.cu_event(),
            sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
        )
    }
    .map_err(driver_error)
}

/// Enqueues a copy of `bytes` from `src` to `dst` (device addresses of this process, any
/// memory they map) on `stream`.
fn copy(dst: u64, src: u64, bytes: usize, stream: RawStream) -> Result<()> {
    // SAFETY: the callers pass ranges inside live allocations (the caller's buffers, the
    // mapped regions, the staging buffer); the copy is ordered on `stream`. Unified
    // addressing: the driver finds where each side lies (device or host memory).
    unsafe { sys::cuMemcpyAsync(dst, src, bytes, cu_stream(stream)).result() }.map_err(driver_error)
}

impl PeerComm {
    /// Refuses an all-reduce by copies on `stream` where it could wait on itself: in a
    /// CUDA graph while ranks share a device and the regions are host memory. There every
    /// rank's copies go through the one device's copy engines, where a copy that waits for a
    /// peer can hold up the peer's copy that it waits for. Measured on one H200 with two
    /// ranks in one process: a graph of one call ran, a graph of 20 calls (512 KiB, 2 MiB)
    /// waited until the timeout, eager calls and device-memory regions ran.
    pub(crate) fn admit_copies(&self, stream: RawStream) -> Result<()> {
        if self.group.host_memory() && self.group.sharing() > 1 && is_capturing(stream)? {
            return Err(Error::Unsupported(format!(
                "{}: an all-reduce by copies (oneshot-copy) cannot be captured in a CUDA \
                 graph while ranks share a device and the regions are host memory (their \
                 copies can wait on each other in the device's copy engines); use a kernel \
                 algorithm such as oneshot-push or twoshot-push",
                self.name
            )));
        }
        Ok(())
    }

    /// An agreed all-reduce of `bytes` per rank by copies (see the module docs), from
    /// `send` into `recv` (equal for in place), on the call's stream.
    pub(crate) fn reduce_by_copies(
        &self,
        agreed: &Agreed,
        send: u64,
        recv: u64,
        bytes: usize,
    ) -> Result<()> {
        let copies = &self.copies;
        let (call, stream) = (agreed.call, agreed.stream);
        let (rank, world) = (self.group.rank(), self.group.world_size());
        let side = raw_stream(&copies.stream);
        let regions = self.group.peer_ptrs();
        self.agree_only(agreed.words, stream)?;
        self.context().bind_to_thread().map_err(driver_error)?;
        record(&copies.fork, stream)?;
        wait(side, &copies.fork)?;
        let kernel = all_reduce_kernel(
            Algorithm::OneshotCopy,
            call.dtype,
            call.op.unwrap_or(comm_core::ReduceOp::Sum),
            false,
        );
        for (k, part) in Cut::copies(&self.layout, bytes).chunks(bytes).enumerate() {
            let s = k % COPY_SLOTS;
            let at = self.layout.off_data as u64 + (s * copies.slot) as u64;
            if k >= COPY_SLOTS {
                wait(stream, &copies.read[s])?;
            }
            let offset = part.offset as u64;
            copy(regions[rank] + at, send + offset, part.bytes, stream)?;
            self.group.own_barrier(stream, STAGED)?;
            record(&copies.staged, stream)?;
            wait(side, &copies.staged)?;
            for p in (1..world).map(|i| (rank + i) % world) {
                let into = copies.staging.device_ptr() + (p * copies.slot) as u64;
                copy(into, regions[p] + at, part.bytes, side)?;
            }
            let count = part.bytes / call.dtype.size();
            let args = PeerArgs {
                staged: copies.staging.device_ptr(),
                staged_pitch: copies.slot as u64,
                ..self.io_args(agreed, send + offset, recv + offset, count as u64)
            };
            let work = all_reduce_work(Algorithm::OneshotCopy, call.dtype, count, world);
            let threads = self.config.threads;
            let grid = (blocks(work, threads, copies.sum_blocks), threads);
            self.group.launch(kernel, grid, side, &args)?;
            self.group.own_barrier(side, READ)?;
            record(&copies.read[s], side)?;
        }
        record(&copies.join, side)?;
        wait(stream, &copies.join)
    }
}
