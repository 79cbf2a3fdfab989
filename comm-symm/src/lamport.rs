//! Lamport-style one-shot all-reduce: data that announces its own arrival.
//!
//! Every rank owns two inboxes (alternate calls) with one slot per sender. A call writes
//! a small header (the call descriptor) and the input straight into slot `me` of every
//! peer's inbox, then waits until every slot of its own inbox is complete, reduces the
//! slots in rank order, and resets the inbox. No barrier: each reader waits only for the
//! senders' own slots. On the host the header's last word is stored with release after the
//! data, so a reader waits on that one word (acquire) instead of polling data lines the
//! writer is still filling; the sentinel check of every element then only confirms it.
//!
//! The sentinel is the all-ones bit pattern, a NaN in f16, bf16, f32 and f64 alike, so one
//! `memset(0xff)` resets an inbox for any dtype (a per-dtype sentinel such as -0.0 would
//! leave a reset inbox wrong for the next call's element width). Inputs holding exactly
//! that pattern are sent as the canonical quiet NaN instead: NaN stays NaN. Integers have
//! no spare value, so they use the one-shot path.
//!
//! The header also carries the sender's call number, which the reader checks against its
//! own: a slot written for another call is refused, never reduced. Calls that carry no
//! data here (integer dtypes, messages over the capacity, other collectives while
//! `lamport` is chosen) still meet through the headers first ([`Lamport::agree`]), so
//! ranks that disagree about the path get [`comm_core::Error::Mismatch`], not a hang.
//!
//! Reuse is safe with two inboxes: a peer writes into this rank's inbox for call `k + 2`
//! only after reading this rank's data of call `k + 1`, which this rank writes only after
//! it has read and reset its inbox of call `k` (release fence before writing, acquire
//! fence after observing).

use std::cell::Cell;
use std::sync::atomic::{AtomicU16, AtomicU32, AtomicU64, Ordering, fence};
use std::time::Instant;

use comm_core::call::{CallDescriptor, DESCRIPTOR_BYTES, decode_verdict, encode_verdict, settle};
use comm_core::reduce::reduce_host;
use comm_core::{Collective, DType, Result};

use crate::host::HostHeap;

/// Header: the descriptor and the call number as 16-bit halves, each tagged so that a
/// written word is never 0.
const HEADER_WORDS: usize = (DESCRIPTOR_BYTES + 8) / 2;
const HEADER_TAG: u32 = 0x0001_0000;
const HEADER_BYTES: usize = 64;

/// The Lamport inboxes inside a rank's data area.
#[derive(Debug)]
pub(crate) struct Lamport {
    base: usize,
    capacity: usize,
    world: usize,
    calls: Cell<u64>,
}

impl Lamport {
    /// Bytes of data area needed for `world` ranks and messages up to `capacity` bytes.
    pub(crate) fn area_bytes(world: usize, capacity: usize) -> usize {
        2 * world * (HEADER_BYTES + capacity.next_multiple_of(64))
    }

    /// Inboxes at `base` of the data area; resets this rank's own. Peers may write into
    /// them only after the caller's next barrier.
    pub(crate) fn new(heap: &HostHeap, base: usize, capacity: usize) -> Self {
        let lamport = Lamport {
            base,
            capacity: capacity.next_multiple_of(64),
            world: heap.world_size(),
            calls: Cell::new(0),
        };
        for inbox in 0..2 {
            for from in 0..lamport.world {
                lamport.reset(heap, inbox, from, lamport.capacity);
            }
        }
        lamport
    }

    /// Largest message.
    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    /// True when the Lamport path can carry `dtype`.
    pub(crate) fn supports(dtype: DType) -> bool {
        matches!(dtype, DType::F16 | DType::BF16 | DType::F32 | DType::F64)
    }

    /// True when a sender with this call writes its data into the inboxes (otherwise
    /// only its header). Every reader decides the same from the sender's header.
    pub(crate) fn carries(&self, call: &CallDescriptor) -> bool {
        call.collective == Collective::AllReduce
            && Lamport::supports(call.dtype)
            && call.send_bytes() <= self.capacity
    }

    /// Headers only: the ranks agree on a call that moves its data elsewhere.
    pub(crate) fn agree(
        &self,
        heap: &HostHeap,
        verdict: Result<CallDescriptor>,
    ) -> Result<CallDescriptor> {
        let inbox = self.post(heap, &verdict, &[])?;
        self.collect(heap, verdict, inbox, &mut [])
    }

    fn slot(&self, heap: &HostHeap, owner: usize, inbox: usize, from: usize) -> *mut u8 {
        let slot_bytes = HEADER_BYTES + self.capacity;
        // SAFETY: the caller sized the data area with `area_bytes`.
        unsafe {
            heap.data(owner)
                .add(self.base + (inbox * self.world + from) * slot_bytes)
        }
    }

    fn reset(&self, heap: &HostHeap, inbox: usize, from: usize, bytes: usize) {
        let slot = self.slot(heap, heap.rank(), inbox, from);
        for word in 0..HEADER_WORDS {
            header_word(slot, word).store(0, Ordering::Relaxed);
        }
        // SAFETY: own inbox; no peer writes it until it has seen data this rank sends
        // after the release fence of its next call.
        unsafe { std::ptr::write_bytes(slot.add(HEADER_BYTES), 0xff, bytes) };
    }

    /// First half of an all-reduce: writes this rank's verdict and `input` into every
    /// peer's inbox. Returns the inbox of this call, for [`Self::collect`].
    pub(crate) fn post(
        &self,
        heap: &HostHeap,
        verdict: &Result<CallDescriptor>,
        input: &[u8],
    ) -> Result<usize> {
        heap.check_usable()?;
        let call_number = self.calls.get();
        let inbox = (call_number % 2) as usize;
        self.calls.set(call_number + 1);
        let me = heap.rank();
        let mut header = [0u8; 2 * HEADER_WORDS];
        header[..DESCRIPTOR_BYTES].copy_from_slice(&encode_verdict(verdict));
        header[DESCRIPTOR_BYTES..].copy_from_slice(&call_number.to_le_bytes());
        let data = verdict.as_ref().ok().filter(|call| self.carries(call));
        // Order this rank's earlier resets before any peer can see this call's data.
        fence(Ordering::Release);
        for peer in 0..self.world {
            let slot = self.slot(heap, peer, inbox, me);
            if let Some(call) = data {
                write_data(slot, call.dtype, input);
            }
            for (word, pair) in header.chunks_exact(2).enumerate() {
                let value = HEADER_TAG | u32::from(u16::from_le_bytes([pair[0], pair[1]]));
                // The last header word is the release point of the whole slot.
                let order = if word + 1 == HEADER_WORDS {
                    Ordering::Release
                } else {
                    Ordering::Relaxed
                };
                header_word(slot, word).store(value, order);
            }
        }
        Ok(inbox)
    }

    /// Second half: waits for every peer's slot of `inbox`, agrees on the call, reduces
    /// into `out` (when the call carries data here) and resets the inbox.
    pub(crate) fn collect(
        &self,
        heap: &HostHeap,
        verdict: Result<CallDescriptor>,
        inbox: usize,
        out: &mut [u8],
    ) -> Result<CallDescriptor> {
        let me = heap.rank();
        let deadline = Instant::now() + heap.timeout();
        let call_number = self.calls.get() - 1;
        let mut verdicts = Vec::with_capacity(self.world);
        for from in 0..self.world {
            let slot = self.slot(heap, me, inbox, from);
            let (verdict, number) = self.wait_header(heap, slot, from, deadline)?;
            if number != call_number {
                return Err(heap.abort(format!(
                    "rank {from} wrote lamport call {number} where this rank expects {call_number}"
                )));
            }
            verdicts.push(verdict);
        }
        // A peer that failed may have written its header before giving up.
        heap.check_peers()?;
        // Data each sender wrote (its own count), to wait for and to reset afterwards.
        let sent_bytes: Vec<usize> = verdicts
            .iter()
            .map(|v| v.filter(|d| self.carries(d)).map_or(0, |d| d.send_bytes()))
            .collect();
        let settled = settle(verdict, &verdicts);
        if let Some(call) = settled.as_ref().ok().filter(|call| self.carries(call)) {
            for (from, &bytes) in sent_bytes.iter().enumerate() {
                let slot = self.slot(heap, me, inbox, from);
                wait_data(heap, slot, call.dtype, bytes, from, deadline)?;
            }
            fence(Ordering::Acquire);
            let sources: Vec<&[u8]> = (0..self.world)
                .map(|from| {
                    let data = self.slot(heap, me, inbox, from).wrapping_add(HEADER_BYTES);
                    // SAFETY: every sender finished writing this slot (no sentinel left,
                    // acquire fence above) and writes it again only after this rank's next call.
                    unsafe { std::slice::from_raw_parts(data, out.len()) }
                })
                .collect();
            reduce_host(
                call.dtype,
                call.op.expect("all_reduce has an op"),
                &sources,
                out,
            );
        } else {
            // Senders that accepted their call are still writing: wait, so the reset below
            // cannot race with their stores.
            for (from, v) in verdicts.iter().enumerate() {
                if let Some(d) = v {
                    if sent_bytes[from] > 0 {
                        wait_data(
                            heap,
                            self.slot(heap, me, inbox, from),
                            d.dtype,
                            sent_bytes[from],
                            from,
                            deadline,
                        )?;
                    }
                }
            }
        }
        for (from, &bytes) in sent_bytes.iter().enumerate() {
            self.reset(heap, inbox, from, bytes);
        }
        settled
    }

    fn wait_header(
        &self,
        heap: &HostHeap,
        slot: *mut u8,
        from: usize,
        deadline: Instant,
    ) -> Result<(Option<CallDescriptor>, u64)> {
        // Wait on the last header word only: it is stored with release after the data and
        // the other words, so once it is seen (acquire) the whole slot is. Polling every
        // element instead would make the reader pull cache lines the writer is still
        // filling, and each line would cross between cores several times.
        let last = HEADER_WORDS - 1;
        spin_until(heap, from, deadline, || {
            (header_word(slot, last).load(Ordering::Acquire) != 0).then_some(())
        })?;
        let mut bytes = [0u8; 2 * HEADER_WORDS];
        for word in 0..HEADER_WORDS {
            let value = header_word(slot, word).load(Ordering::Relaxed);
            if value == 0 {
                return Err(heap.abort(format!(
                    "rank {from}'s lamport header is incomplete after its release point"
                )));
            }
            bytes[2 * word..2 * word + 2].copy_from_slice(&(value as u16).to_le_bytes());
        }
        let (descriptor, number) = bytes.split_at(DESCRIPTOR_BYTES);
        let number = u64::from_le_bytes(number.try_into().expect("8 bytes"));
        Ok((decode_verdict(descriptor)?, number))
    }
}

fn header_word<'a>(slot: *mut u8, word: usize) -> &'a AtomicU32 {
    // SAFETY: the header holds HEADER_WORDS u32 words at a 64-byte-aligned slot start, and
    // all header accesses are atomic.
    unsafe { &*(slot as *const AtomicU32).add(word) }
}

/// Writes `input` into a peer's slot, element by element, never writing the sentinel.
fn write_data(slot: *mut u8, dtype: DType, input: &[u8]) {
    // SAFETY: the slot's data area holds `capacity` >= input.len() bytes, 64-byte aligned;
    // readers look at it only after the header's release store that follows.
    unsafe {
        let data = slot.add(HEADER_BYTES);
        match dtype.size() {
            2 => store_words::<u16>(data, input, 0x7e00),
            4 => store_words::<u32>(data, input, 0x7fc0_0000),
            _ => store_words::<u64>(data, input, 0x7ff8 << 48),
        }
    }
}

trait Word: bytemuck::Pod + Eq {
    const SENTINEL: Self;
}

impl Word for u16 {
    const SENTINEL: u16 = u16::MAX;
}
impl Word for u32 {
    const SENTINEL: u32 = u32::MAX;
}
impl Word for u64 {
    const SENTINEL: u64 = u64::MAX;
}

trait AtomicWord<W> {
    fn load_relaxed(&self) -> W;
}

macro_rules! atomic_word {
    ($a:ty, $w:ty) => {
        impl AtomicWord<$w> for $a {
            fn load_relaxed(&self) -> $w {
                self.load(Ordering::Relaxed)
            }
        }
    };
}
atomic_word!(AtomicU16, u16);
atomic_word!(AtomicU32, u32);
atomic_word!(AtomicU64, u64);

/// Copies `input` as words, replacing the sentinel pattern by the canonical NaN.
///
/// # Safety
/// `data` must be aligned for `W`, hold `input.len()` bytes, and not be read concurrently.
unsafe fn store_words<W: Word>(data: *mut u8, input: &[u8], canonical: W) {
    let count = input.len() / size_of::<W>();
    // SAFETY: per the caller.
    let out = unsafe { std::slice::from_raw_parts_mut(data as *mut W, count) };
    let fix = |w: W| if w == W::SENTINEL { canonical } else { w };
    match bytemuck::try_cast_slice::<u8, W>(input) {
        Ok(words) => out.iter_mut().zip(words).for_each(|(o, &w)| *o = fix(w)),
        Err(_) => out
            .iter_mut()
            .zip(input.chunks_exact(size_of::<W>()))
            .for_each(|(o, c)| *o = fix(bytemuck::pod_read_unaligned(c))),
    }
}

/// Waits until the first `bytes` of a slot's data hold no sentinel.
fn wait_data(
    heap: &HostHeap,
    slot: *mut u8,
    dtype: DType,
    bytes: usize,
    from: usize,
    deadline: Instant,
) -> Result<()> {
    // SAFETY: the slot's data area holds at least `bytes`, aligned; accesses are atomic.
    unsafe {
        let data = slot.add(HEADER_BYTES);
        match dtype.size() {
            2 => wait_words::<AtomicU16, u16>(heap, data, bytes / 2, from, deadline),
            4 => wait_words::<AtomicU32, u32>(heap, data, bytes / 4, from, deadline),
            _ => wait_words::<AtomicU64, u64>(heap, data, bytes / 8, from, deadline),
        }
    }
}

/// # Safety
/// `data` must be aligned for `A` and hold `count` words.
unsafe fn wait_words<A: AtomicWord<W>, W: Word>(
    heap: &HostHeap,
    data: *mut u8,
    count: usize,
    from: usize,
    deadline: Instant,
) -> Result<()> {
    // After the header's acquire the writer's stores are visible and it writes this slot
    // no more this call: a plain (vectorisable) scan finds no sentinel. Only if one is
    // found (a writer that broke the protocol) poll that word onwards.
    // SAFETY: in bounds and aligned per the caller; no concurrent writer (see above).
    let words = unsafe { std::slice::from_raw_parts(data as *const W, count) };
    let Some(first) = words.iter().position(|&w| w == W::SENTINEL) else {
        return Ok(());
    };
    for i in first..count {
        // SAFETY: in bounds and aligned per the caller.
        let cell = unsafe { &*(data as *const A).add(i) };
        spin_until(heap, from, deadline, || {
            (cell.load_relaxed() != W::SENTINEL).then_some(())
        })?;
    }
    Ok(())
}

/// Polls `ready` until it yields, spinning first and yielding the core later.
fn spin_until<T>(
    heap: &HostHeap,
    from: usize,
    deadline: Instant,
    mut ready: impl FnMut() -> Option<T>,
) -> Result<T> {
    let mut spins = 0u32;
    loop {
        if let Some(v) = ready() {
            return Ok(v);
        }
        spins = spins.wrapping_add(1);
        if spins < heap.spins_before_yield() {
            std::hint::spin_loop();
            continue;
        }
        std::thread::yield_now();
        if spins % 64 == 0 {
            heap.check_peer(from)?;
            if Instant::now() >= deadline {
                return Err(heap.timed_out(format!("rank {from}'s data (lamport)"), heap.timeout()));
            }
        }
    }
}
