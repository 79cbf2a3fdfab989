//! `LocalComm`: ranks are threads of one process, data moves through shared memory.
//!
//! Each call has two synchronisation points. First every rank posts its call descriptor
//! and buffer addresses; the ranks check that the descriptors agree. Then each rank does
//! its share of the work directly on the other ranks' buffers (for all-reduce, rank `r`
//! reduces the `r`-th chunk of every rank's input, in rank order, and writes it into every
//! rank's output), and finally waits until every rank has finished, because until then
//! peers may still be reading or writing its buffers. No data goes through channels.

use std::cell::Cell;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use crate::bootstrap::default_timeout;
use crate::buffer::{BufferMut, BufferRef, MemoryLocation};
use crate::call::{CallDescriptor, settle};
use crate::communicator::{Capabilities, Collective, Communicator, TrafficPattern};
use crate::dtype::ReduceOp;
use crate::error::Result;
use crate::exchange::Exchange;
use crate::reduce::reduce_into;

/// Chunks handed to ranks are multiples of this many bytes, so that two ranks never write
/// the same cache line.
const CHUNK_ALIGN_BYTES: usize = 128;

/// One rank of an in-process group. Create the group with [`LocalComm::create`] and move
/// each handle into its own thread.
#[derive(Debug)]
pub struct LocalComm {
    rank: usize,
    world_size: usize,
    exchange: Arc<Exchange<Posting>>,
    round: Cell<u64>,
    timeout: Duration,
}

/// What a rank posts at the start of a call.
#[derive(Debug, Clone)]
struct Posting {
    verdict: Option<CallDescriptor>,
    send: usize,
    recv: usize,
}

impl LocalComm {
    /// Creates `world_size` ranks (rank `i` at index `i`) with the default timeout
    /// ([`default_timeout`]).
    pub fn create(world_size: usize) -> Vec<LocalComm> {
        Self::with_timeout(world_size, default_timeout())
    }

    /// Creates `world_size` ranks whose waits for absent peers give up after `timeout`.
    pub fn with_timeout(world_size: usize, timeout: Duration) -> Vec<LocalComm> {
        assert!(world_size > 0, "a group needs at least one rank");
        let exchange = Exchange::new(world_size);
        (0..world_size)
            .map(|rank| LocalComm {
                rank,
                world_size,
                exchange: exchange.clone(),
                round: Cell::new(0),
                timeout,
            })
            .collect()
    }

    fn next_round(&self) -> u64 {
        let round = self.round.get();
        self.round.set(round + 1);
        round
    }

    /// Posts this rank's call, settles it with the peers, runs `work` on the agreed call
    /// and waits for every rank's work to finish.
    fn run(
        &self,
        verdict: Result<CallDescriptor>,
        (send, recv): (usize, usize),
        locations: &[MemoryLocation],
        work: impl FnOnce(&CallDescriptor, &[Posting]),
    ) -> Result<()> {
        let verdict = self.capabilities().admit("local", verdict, locations);
        let posting = Posting {
            verdict: verdict.as_ref().ok().copied(),
            send,
            recv,
        };
        let what = verdict
            .as_ref()
            .map_or_else(|_| "a collective".to_string(), |d| d.to_string());
        let postings = self.exchange.exchange(
            self.rank,
            self.next_round(),
            posting,
            Some(self.timeout),
            &what,
        )?;
        let verdicts: Vec<_> = postings.iter().map(|p| p.verdict).collect();
        let call = settle(verdict, &verdicts)?;
        if call.collective == Collective::Barrier {
            return Ok(());
        }
        work(&call, &postings);
        // Peers may still be using this rank's buffers: no bound here, every peer is
        // known to be present and working.
        self.exchange
            .exchange(self.rank, self.next_round(), posting_done(), None, "finish")?;
        Ok(())
    }

    /// This rank's share `[start, end)` of `len` elements of `elem_size` bytes.
    fn my_chunk(&self, len: usize, elem_size: usize) -> (usize, usize) {
        let align = (CHUNK_ALIGN_BYTES / elem_size).max(1);
        let per_rank = len.div_ceil(self.world_size).div_ceil(align) * align;
        let start = (per_rank * self.rank).min(len);
        let end = (start + per_rank).min(len);
        (start, end)
    }
}

fn posting_done() -> Posting {
    Posting {
        verdict: None,
        send: 0,
        recv: 0,
    }
}

/// Copies `bytes` bytes from `src` to `dst`.
///
/// # Safety
/// Both ranges must be valid and must not overlap, and no other thread may write them.
unsafe fn copy_bytes(src: usize, dst: usize, bytes: usize) {
    // SAFETY: forwarded from the caller.
    unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, bytes) }
}

impl Communicator for LocalComm {
    fn name(&self) -> &str {
        "local"
    }

    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world_size
    }

    fn capabilities(&self) -> &Capabilities {
        static CAPS: LazyLock<Capabilities> = LazyLock::new(|| {
            Capabilities::host_complete().with_pattern(TrafficPattern::HostThreads)
        });
        &CAPS
    }

    fn all_reduce(&self, send: BufferRef<'_>, recv: BufferMut<'_>, op: ReduceOp) -> Result<()> {
        let verdict = CallDescriptor::all_reduce(&send, &recv, op);
        self.run(
            verdict,
            (send.addr(), recv.addr()),
            &[send.location(), recv.location()],
            |call, posts| self.reduce_my_chunk(call, posts),
        )
    }

    fn all_reduce_in_place(&self, buf: BufferMut<'_>, op: ReduceOp) -> Result<()> {
        let verdict = CallDescriptor::all_reduce_in_place(&buf, op);
        self.run(
            verdict,
            (buf.addr(), buf.addr()),
            &[buf.location()],
            |call, posts| self.reduce_my_chunk(call, posts),
        )
    }

    fn all_gather(&self, send: BufferRef<'_>, recv: BufferMut<'_>) -> Result<()> {
        let verdict = CallDescriptor::all_gather(&send, &recv, self.world_size);
        self.run(
            verdict,
            (send.addr(), recv.addr()),
            &[send.location(), recv.location()],
            |call, posts| {
                let bytes = call.send_bytes();
                let mine = posts[self.rank].recv;
                for (peer, post) in posts.iter().enumerate() {
                    // SAFETY: the peer's send holds `bytes` bytes and is only read during the
                    // call; this rank's recv holds `world_size * bytes` and only this rank
                    // writes it; send and recv of one rank are distinct borrows.
                    unsafe { copy_bytes(post.send, mine + peer * bytes, bytes) }
                }
            },
        )
    }

    fn reduce_scatter(&self, send: BufferRef<'_>, recv: BufferMut<'_>, op: ReduceOp) -> Result<()> {
        let verdict = CallDescriptor::reduce_scatter(&send, &recv, op, self.world_size);
        self.run(
            verdict,
            (send.addr(), recv.addr()),
            &[send.location(), recv.location()],
            |call, posts| {
                let size = call.dtype.size();
                let share = call.count as usize / self.world_size;
                let offset = self.rank * share * size;
                let sources: Vec<usize> = posts.iter().map(|p| p.send + offset).collect();
                let op = call.op.expect("reduce_scatter has an op");
                // SAFETY: every send holds `world_size * share` elements, so `share` elements
                // from `offset` are in bounds; only this rank writes its recv of `share`.
                unsafe { reduce_into(call.dtype, op, &sources, &[posts[self.rank].recv], share) }
            },
        )
    }

    fn broadcast(&self, buf: BufferMut<'_>, root: usize) -> Result<()> {
        let verdict = CallDescriptor::broadcast(&buf, root, self.world_size);
        self.run(
            verdict,
            (buf.addr(), buf.addr()),
            &[buf.location()],
            |call, posts| {
                if self.rank != root {
                    // SAFETY: the root's buffer is only read during the call, this rank's only
                    // written by this rank; both hold `send_bytes` bytes.
                    unsafe {
                        copy_bytes(posts[root].recv, posts[self.rank].recv, call.send_bytes())
                    }
                }
            },
        )
    }

    fn barrier(&self) -> Result<()> {
        self.run(Ok(CallDescriptor::barrier()), (0, 0), &[], |_, _| {})
    }
}

impl LocalComm {
    fn reduce_my_chunk(&self, call: &CallDescriptor, posts: &[Posting]) {
        let size = call.dtype.size();
        let (start, end) = self.my_chunk(call.count as usize, size);
        if start == end {
            return;
        }
        let sources: Vec<usize> = posts.iter().map(|p| p.send + start * size).collect();
        let destinations: Vec<usize> = posts.iter().map(|p| p.recv + start * size).collect();
        let op = call.op.expect("all_reduce has an op");
        // SAFETY: every rank's buffers hold `count` elements and `start..end` is within it;
        // chunks of different ranks do not overlap, so only this rank touches these
        // elements of any buffer until the closing barrier.
        unsafe { reduce_into(call.dtype, op, &sources, &destinations, end - start) }
    }
}
