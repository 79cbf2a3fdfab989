//! `HostSymmComm`: collectives over the host symmetric heap.
//!
//! Every call stages this rank's input in its own data area, next to its call descriptor,
//! and meets the peers at one signal barrier; after it, every rank reads the peers' areas
//! directly (they are mapped into its address space). The areas come in two halves used by
//! alternate calls, so no second barrier is needed: a rank can only overwrite a half two
//! calls later, after every peer has reached the next call's barrier, which it does only
//! once it has finished reading. Results are reduced in rank order from the same bytes on
//! every rank, so they are bitwise identical everywhere. Next to the descriptor each rank
//! stages its call number; a reader refuses a peer whose number differs from its own, so
//! bytes staged for an abandoned call are never taken for a later one.
//!
//! Algorithms for all-reduce ([`Algorithm`]; `lamport` lives in its own module):
//! - `oneshot`: every rank reduces the whole message from all peers' areas;
//! - `twoshot`: rank `r` reduces the `r`-th chunk into its result area, then, after a
//!   second barrier, every rank copies the other chunks from the peers' result areas.
//!   Each byte is reduced once instead of `n` times: better for large messages.

use std::cell::Cell;

use comm_core::call::{CallDescriptor, DESCRIPTOR_BYTES, decode_verdict, encode_verdict, settle};
use comm_core::reduce::reduce_host;
use comm_core::{
    Bootstrap, BufferMut, BufferRef, Capabilities, Communicator, MemoryLocation, ReduceOp, Result,
};

use crate::algorithm::Algorithm;
use crate::host::HostHeap;
use crate::lamport::Lamport;

/// Default largest message per rank and call.
pub const DEFAULT_MAX_BYTES: usize = 64 << 20;

/// Messages up to this size use `oneshot` under [`Algorithm::Auto`]. On the host `lamport`
/// never won (2 processes, 2-core VM, benchmarks/history/2026-11-29.md): writing into a
/// peer's inbox moves every cache line to the writer's core and back to the reader's, where
/// a pull moves it once; it stays available by name.
const ONESHOT_MAX_BYTES: usize = 16 << 10;
/// Largest Lamport message; larger ones fall back to `oneshot`/`twoshot`.
const LAMPORT_CAPACITY: usize = 1 << 20;

/// Alignment of every area: a cache line.
const ALIGN: usize = 64;

const PHASE_CHANNEL: usize = 0;
const RESULT_CHANNEL: usize = 1;

/// Offsets inside one half of a rank's data area.
#[derive(Debug, Clone, Copy)]
struct Layout {
    max_bytes: usize,
    half: usize,
}

impl Layout {
    fn new(max_bytes: usize) -> Self {
        let max_bytes = max_bytes.next_multiple_of(ALIGN);
        Layout {
            max_bytes,
            half: ALIGN + 2 * max_bytes,
        }
    }
    fn verdict(&self, half: usize) -> usize {
        half * self.half
    }
    fn input(&self, half: usize) -> usize {
        half * self.half + ALIGN
    }
    fn result(&self, half: usize) -> usize {
        half * self.half + ALIGN + self.max_bytes
    }
}

/// A communicator over host symmetric memory. Ranks must share one node.
#[derive(Debug)]
pub struct HostSymmComm {
    heap: HostHeap,
    layout: Layout,
    lamport: Lamport,
    algorithm: Cell<Algorithm>,
    calls: Cell<u64>,
    caps: Capabilities,
}

impl HostSymmComm {
    /// Collective: sets up the heap for messages up to [`DEFAULT_MAX_BYTES`] per rank.
    pub fn new(bootstrap: &dyn Bootstrap) -> Result<Self> {
        Self::with_max_bytes(bootstrap, DEFAULT_MAX_BYTES)
    }

    /// Collective: sets up the heap for messages up to `max_bytes` per rank.
    pub fn with_max_bytes(bootstrap: &dyn Bootstrap, max_bytes: usize) -> Result<Self> {
        let layout = Layout::new(max_bytes);
        let capacity = LAMPORT_CAPACITY.min(layout.max_bytes);
        let lamport_bytes = Lamport::area_bytes(bootstrap.world_size(), capacity);
        let heap = HostHeap::rendezvous(bootstrap, 2 * layout.half + lamport_bytes, 2)?;
        let lamport = Lamport::new(&heap, 2 * layout.half, capacity);
        // Peers may write into this rank's Lamport inboxes only once they are reset.
        heap.barrier(PHASE_CHANNEL)?;
        let mut caps = Capabilities::host_complete()
            .with_algorithms(&Algorithm::NAMES)
            .with_algorithm_patterns(&Algorithm::PATTERNS);
        caps.max_bytes = Some(layout.max_bytes);
        Ok(HostSymmComm {
            heap,
            layout,
            lamport,
            algorithm: Cell::new(Algorithm::Auto),
            calls: Cell::new(0),
            caps,
        })
    }

    /// Chooses the all-reduce algorithm (every rank must choose the same).
    pub fn use_algorithm(&self, algorithm: Algorithm) {
        self.algorithm.set(algorithm);
    }

    /// The all-reduce algorithm in use.
    pub fn algorithm(&self) -> Algorithm {
        self.algorithm.get()
    }

    /// The bound on waits for peers.
    pub fn set_timeout(&mut self, timeout: std::time::Duration) {
        self.heap.set_timeout(timeout);
    }

    fn area(&self, rank: usize, offset: usize) -> *mut u8 {
        // SAFETY: every offset produced by `Layout` is inside the data area.
        unsafe { self.heap.data(rank).add(offset) }
    }

    /// A peer's staged bytes, valid between the phase barrier and the next call's.
    ///
    /// # Safety
    /// Only between this call's phase barrier and the end of the call.
    unsafe fn peer_bytes(&self, rank: usize, offset: usize, len: usize) -> &[u8] {
        // SAFETY: in bounds by the layout; the peer wrote these bytes before the barrier
        // and will not write them again until this rank has reached the next barrier.
        unsafe { std::slice::from_raw_parts(self.area(rank, offset), len) }
    }

    /// This rank's verdict on its call, including what the backend supports.
    fn checked(
        &self,
        verdict: Result<CallDescriptor>,
        locations: &[MemoryLocation],
    ) -> Result<CallDescriptor> {
        self.capabilities().admit("symm", verdict, locations)
    }

    /// The all-reduce algorithm for `bytes` of `dtype` (the same on every rank that agrees
    /// on the call).
    fn choose(&self, dtype: comm_core::DType, bytes: usize) -> Algorithm {
        let lamport_ok = Lamport::supports(dtype) && bytes <= self.lamport.capacity();
        match self.algorithm.get() {
            Algorithm::Auto if bytes <= ONESHOT_MAX_BYTES => Algorithm::OneShot,
            Algorithm::Auto => Algorithm::TwoShot,
            Algorithm::Lamport if !lamport_ok => Algorithm::OneShot,
            chosen => chosen,
        }
    }

    /// Stages `input`, meets every rank, agrees on the call. Returns the half in use.
    /// `skip`: a byte range of `input` no peer reads (this rank's own two-shot chunk,
    /// which it reads from the caller's buffer), left out of the staging copy.
    fn begin(
        &self,
        verdict: Result<CallDescriptor>,
        input: Option<&[u8]>,
        skip: Option<(usize, usize)>,
        locations: &[MemoryLocation],
    ) -> Result<(usize, CallDescriptor)> {
        self.heap.check_usable()?;
        let mut verdict = self.checked(verdict, locations);
        if self.algorithm.get() == Algorithm::Lamport {
            // Peers may be on the Lamport path with this call: meet them there first.
            verdict = Ok(self.lamport.agree(&self.heap, verdict)?);
        }
        let call_number = self.calls.get();
        let half = (call_number % 2) as usize;
        self.calls.set(call_number + 1);
        let me = self.heap.rank();
        // SAFETY: this rank's own area; peers read it only after the barrier below.
        unsafe {
            let slot = std::slice::from_raw_parts_mut(
                self.area(me, self.layout.verdict(half)),
                DESCRIPTOR_BYTES + 8,
            );
            slot[..DESCRIPTOR_BYTES].copy_from_slice(&encode_verdict(&verdict));
            slot[DESCRIPTOR_BYTES..].copy_from_slice(&call_number.to_le_bytes());
            if let (Ok(_), Some(input)) = (&verdict, input) {
                let area = self.area(me, self.layout.input(half));
                let (s, e) = skip.unwrap_or((input.len(), input.len()));
                std::ptr::copy_nonoverlapping(input.as_ptr(), area, s);
                std::ptr::copy_nonoverlapping(input[e..].as_ptr(), area.add(e), input.len() - e);
            }
        }
        self.heap.barrier(PHASE_CHANNEL)?;
        let all = (0..self.heap.world_size())
            .map(|r| {
                // SAFETY: after the barrier, peers' verdicts are complete and stable.
                let bytes =
                    unsafe { self.peer_bytes(r, self.layout.verdict(half), DESCRIPTOR_BYTES + 8) };
                let (descriptor, number) = bytes.split_at(DESCRIPTOR_BYTES);
                let number = u64::from_le_bytes(number.try_into().expect("8 bytes"));
                if number != call_number {
                    return Err(self.heap.abort(format!(
                        "rank {r} staged call {number} where this rank expects {call_number}"
                    )));
                }
                decode_verdict(descriptor)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok((half, settle(verdict, &all)?))
    }

    fn inputs(&self, half: usize, offset: usize, len: usize) -> Vec<&[u8]> {
        (0..self.heap.world_size())
            // SAFETY: called between the phase barrier and the end of the call.
            .map(|r| unsafe { self.peer_bytes(r, self.layout.input(half) + offset, len) })
            .collect()
    }

    /// `own`: this rank's input when it is a separate buffer (out of place); its two-shot
    /// chunk is then read from there rather than from the staging area.
    fn reduce_all(
        &self,
        half: usize,
        call: &CallDescriptor,
        own: Option<&[u8]>,
        out: &mut [u8],
    ) -> Result<()> {
        let op = call.op.expect("reducing call");
        let algorithm = self.choose(call.dtype, out.len());
        let world = self.heap.world_size();
        if algorithm == Algorithm::OneShot || world == 1 {
            reduce_host(call.dtype, op, &self.inputs(half, 0, out.len()), out);
            return Ok(());
        }
        let chunks = chunk_bounds(call.count as usize, world, call.dtype.size());
        let me = self.heap.rank();
        let (start, end) = chunks[me];
        let mut sources = self.inputs(half, start, end - start);
        if let Some(own) = own {
            sources[me] = &own[start..end];
        }
        reduce_host(call.dtype, op, &sources, &mut out[start..end]);
        // SAFETY: own result area, read by peers only after the result barrier.
        unsafe {
            std::ptr::copy_nonoverlapping(
                out[start..end].as_ptr(),
                self.area(me, self.layout.result(half) + start),
                end - start,
            );
        }
        self.heap.barrier(RESULT_CHANNEL)?;
        for (peer, &(s, e)) in chunks.iter().enumerate().filter(|(p, _)| *p != me) {
            // SAFETY: the peer wrote its chunk before the result barrier.
            out[s..e].copy_from_slice(unsafe {
                self.peer_bytes(peer, self.layout.result(half) + s, e - s)
            });
        }
        Ok(())
    }
}

/// Byte ranges of each rank's chunk of `count` elements, cache-line aligned.
fn chunk_bounds(count: usize, world: usize, size: usize) -> Vec<(usize, usize)> {
    let per = (count.div_ceil(world) * size).next_multiple_of(ALIGN.max(size));
    let total = count * size;
    (0..world)
        .map(|r| ((r * per).min(total), ((r + 1) * per).min(total)))
        .collect()
}

impl Communicator for HostSymmComm {
    fn name(&self) -> &str {
        "symm"
    }

    fn rank(&self) -> usize {
        self.heap.rank()
    }

    fn world_size(&self) -> usize {
        self.heap.world_size()
    }

    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    fn all_reduce(&self, send: BufferRef<'_>, mut recv: BufferMut<'_>, op: ReduceOp) -> Result<()> {
        let verdict = CallDescriptor::all_reduce(&send, &recv, op);
        let locations = [send.location(), recv.location()];
        if self.choose(send.dtype(), send.bytes()) == Algorithm::Lamport {
            let verdict = self.checked(verdict, &locations);
            let inbox =
                self.lamport
                    .post(&self.heap, &verdict, send.host_bytes().unwrap_or_default())?;
            let out = recv.host_bytes_mut().unwrap_or_default();
            return self
                .lamport
                .collect(&self.heap, verdict, inbox, out)
                .map(drop);
        }
        let world = self.world_size();
        let two_shot = world > 1 && self.choose(send.dtype(), send.bytes()) == Algorithm::TwoShot;
        let skip =
            two_shot.then(|| chunk_bounds(send.len(), world, send.dtype().size())[self.rank()]);
        let (half, call) = self.begin(verdict, send.host_bytes(), skip, &locations)?;
        let own = send.host_bytes().filter(|_| two_shot);
        self.reduce_all(half, &call, own, recv.require_host("symm")?)
    }

    fn all_reduce_in_place(&self, mut buf: BufferMut<'_>, op: ReduceOp) -> Result<()> {
        let verdict = CallDescriptor::all_reduce_in_place(&buf, op);
        if self.choose(buf.dtype(), buf.bytes()) == Algorithm::Lamport {
            let verdict = self.checked(verdict, &[buf.location()]);
            let inbox = self.lamport.post(
                &self.heap,
                &verdict,
                buf.as_ref().host_bytes().unwrap_or_default(),
            )?;
            let out = buf.host_bytes_mut().unwrap_or_default();
            return self
                .lamport
                .collect(&self.heap, verdict, inbox, out)
                .map(drop);
        }
        let (half, call) =
            self.begin(verdict, buf.as_ref().host_bytes(), None, &[buf.location()])?;
        self.reduce_all(half, &call, None, buf.require_host("symm")?)
    }

    fn all_gather(&self, send: BufferRef<'_>, mut recv: BufferMut<'_>) -> Result<()> {
        let verdict = CallDescriptor::all_gather(&send, &recv, self.world_size());
        let locations = [send.location(), recv.location()];
        let (half, call) = self.begin(verdict, send.host_bytes(), None, &locations)?;
        let bytes = call.send_bytes();
        let out = recv.require_host("symm")?;
        for (rank, input) in self.inputs(half, 0, bytes).into_iter().enumerate() {
            out[rank * bytes..(rank + 1) * bytes].copy_from_slice(input);
        }
        Ok(())
    }

    fn reduce_scatter(
        &self,
        send: BufferRef<'_>,
        mut recv: BufferMut<'_>,
        op: ReduceOp,
    ) -> Result<()> {
        let verdict = CallDescriptor::reduce_scatter(&send, &recv, op, self.world_size());
        let locations = [send.location(), recv.location()];
        let (half, call) = self.begin(verdict, send.host_bytes(), None, &locations)?;
        let share = call.send_bytes() / self.world_size();
        let inputs = self.inputs(half, self.rank() * share, share);
        reduce_host(call.dtype, op, &inputs, recv.require_host("symm")?);
        Ok(())
    }

    fn broadcast(&self, mut buf: BufferMut<'_>, root: usize) -> Result<()> {
        let verdict = CallDescriptor::broadcast(&buf, root, self.world_size());
        let staged = if self.rank() == root {
            buf.as_ref().host_bytes()
        } else {
            None
        };
        let (half, call) = self.begin(verdict, staged, None, &[buf.location()])?;
        if self.rank() != root {
            let bytes = call.send_bytes();
            // SAFETY: between the phase barrier and the end of the call.
            let source = unsafe { self.peer_bytes(root, self.layout.input(half), bytes) };
            buf.require_host("symm")?.copy_from_slice(source);
        }
        Ok(())
    }

    fn barrier(&self) -> Result<()> {
        self.begin(Ok(CallDescriptor::barrier()), None, None, &[])
            .map(drop)
    }

    fn set_algorithm(&self, algorithm: Option<&str>) -> Result<()> {
        self.use_algorithm(algorithm.map_or(Ok(Algorithm::Auto), str::parse)?);
        Ok(())
    }
}
