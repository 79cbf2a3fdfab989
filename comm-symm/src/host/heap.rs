//! The host symmetric heap: one shared segment per rank, mapped by every local rank.
//!
//! Each segment starts with the rank's signal pads and continues with its data area, at
//! the same offsets on every rank. Signals use no read-modify-write on peer memory: the
//! sender *stores* its running count for (channel, receiver) into its own slot of the
//! receiver's pad (release), and the receiver waits until that slot reaches the count it
//! expects (acquire). Counts only grow, so a fast peer that signals again before a slow one
//! has looked only moves the slot further past what the slow one waits for.
//!
//! A rank whose wait failed raises a flag in its own pad that every peer reads: peers
//! waiting for it give up at once, and peers that meet it later refuse the call, since
//! what it staged belongs to a call it abandoned.

use std::cell::{Cell, RefCell};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use comm_core::{Bootstrap, Error, Result};

use super::segment::Mapping;
use crate::fdpass::exchange_fds;

/// Bytes per signal slot: one cache line, so that writers never share a line.
const SLOT: usize = 64;

/// Spins before a waiter starts yielding its core, when every rank has a core of its own.
const SPINS_BEFORE_YIELD: u32 = 2_000;
/// The same when local ranks outnumber cores: the peer being waited for may need this
/// very core, so spinning only delays it.
const SPINS_BEFORE_YIELD_OVERSUBSCRIBED: u32 = 16;

/// A rank's view of the host symmetric heap.
#[derive(Debug)]
pub struct HostHeap {
    rank: usize,
    world: usize,
    channels: usize,
    pad_bytes: usize,
    data_bytes: usize,
    segments: Vec<Mapping>,
    sent: Vec<Cell<u64>>,
    seen: Vec<Cell<u64>>,
    timeout: Duration,
    spins_before_yield: u32,
    broken: RefCell<Option<String>>,
}

impl HostHeap {
    /// Collective: every local rank allocates `data_bytes` of shared memory plus signal pads
    /// for `channels` channels, and maps every peer's. Needs all ranks on this node.
    pub fn rendezvous(
        bootstrap: &dyn Bootstrap,
        data_bytes: usize,
        channels: usize,
    ) -> Result<Self> {
        let world = bootstrap.world_size();
        if bootstrap.local_world_size() != world {
            return Err(Error::Unsupported(format!(
                "host symmetric memory needs every rank on one node ({} of {world} are local)",
                bootstrap.local_world_size()
            )));
        }
        let channels = channels.max(1);
        // One more slot after the signals: this rank's failure flag.
        let pad_bytes = ((channels * world + 1) * SLOT).next_multiple_of(4096);
        let total = pad_bytes + data_bytes;
        // Each rank maps every peer's segment at its own size: sizes that differ would map
        // past a peer's file, so they are refused on every rank before anything is mapped.
        let totals = bootstrap.all_gather_bytes(&(total as u64).to_le_bytes())?;
        if let Some((rank, _)) = totals
            .iter()
            .enumerate()
            .find(|(_, t)| t.as_slice() != (total as u64).to_le_bytes())
        {
            return Err(Error::Mismatch(format!(
                "host symmetric memory: rank {me} asks for a heap of {total} bytes, rank {rank} \
                 for another size (every rank must pass the same sizes)",
                me = bootstrap.rank()
            )));
        }
        let (fd, own) = Mapping::create(total)?;
        let fds = exchange_fds(bootstrap, fd.as_fd())?;
        let me = bootstrap.rank();
        let mut segments = Vec::with_capacity(world);
        let mut own = Some(own);
        for (rank, peer_fd) in fds.iter().enumerate() {
            segments.push(if rank == me {
                own.take().expect("own segment once")
            } else {
                Mapping::map(peer_fd.as_fd(), total)?
            });
        }
        // Descriptors close here; the mappings keep the memory alive. Every rank must have
        // mapped before anyone starts using peers' memory.
        drop(fds);
        bootstrap.barrier()?;
        Ok(HostHeap {
            rank: me,
            world,
            channels,
            pad_bytes,
            data_bytes,
            segments,
            sent: (0..channels * world).map(|_| Cell::new(0)).collect(),
            seen: (0..channels * world).map(|_| Cell::new(0)).collect(),
            timeout: bootstrap.timeout(),
            spins_before_yield: spins_before_yield(bootstrap.local_world_size()),
            broken: RefCell::new(None),
        })
    }

    /// Spins before a waiter yields its core: fewer when local ranks outnumber cores.
    pub fn spins_before_yield(&self) -> u32 {
        self.spins_before_yield
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks.
    pub fn world_size(&self) -> usize {
        self.world
    }

    /// Size of every rank's data area.
    pub fn data_bytes(&self) -> usize {
        self.data_bytes
    }

    /// Sets the bound on signal waits.
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    /// The bound on signal waits.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Start of `rank`'s data area, as mapped in this process.
    pub fn data(&self, rank: usize) -> *mut u8 {
        // SAFETY: every segment is `pad_bytes + data_bytes` long.
        unsafe { self.segments[rank].ptr().add(self.pad_bytes) }
    }

    fn slot(&self, owner: usize, channel: usize, from: usize) -> &AtomicU64 {
        assert!(
            channel < self.channels,
            "channel {channel} of {}",
            self.channels
        );
        let offset = (channel * self.world + from) * SLOT;
        // SAFETY: the pad area holds `channels * world` slots of SLOT bytes, 8-aligned
        // (mappings are page aligned); AtomicU64 has the layout of u64, and every access to
        // pad memory goes through atomics.
        unsafe { &*(self.segments[owner].ptr().add(offset) as *const AtomicU64) }
    }

    fn failure_flag(&self, owner: usize) -> &AtomicU64 {
        let offset = self.channels * self.world * SLOT;
        // SAFETY: the pad holds one slot past the signal slots (see `rendezvous`), 8-aligned;
        // it is only accessed through atomics.
        unsafe { &*(self.segments[owner].ptr().add(offset) as *const AtomicU64) }
    }

    /// Fails with the reason if an earlier wait timed out, here or on a peer.
    pub fn check_usable(&self) -> Result<()> {
        if let Some(why) = &*self.broken.borrow() {
            return Err(Error::Aborted(why.clone()));
        }
        self.check_peers()
    }

    /// Fails (and marks the heap unusable) if a peer has raised its failure flag.
    pub fn check_peers(&self) -> Result<()> {
        (0..self.world).try_for_each(|peer| self.check_peer(peer))
    }

    /// Fails (and marks the heap unusable) if `peer` has raised its failure flag: it will
    /// not signal again, and what it staged belongs to a call it gave up.
    pub fn check_peer(&self, peer: usize) -> Result<()> {
        if self.failure_flag(peer).load(Ordering::Acquire) == 0 {
            return Ok(());
        }
        Err(self.abort(format!("rank {peer} failed an earlier call")))
    }

    /// Marks the heap unusable on every rank: this one refuses later calls, and peers see
    /// the flag when they wait for or meet this rank. Returns [`Error::Aborted`].
    pub fn abort(&self, why: String) -> Error {
        self.failure_flag(self.rank).store(1, Ordering::Release);
        Error::Aborted(self.broken.borrow_mut().get_or_insert(why).clone())
    }

    /// Marks the heap unusable after a wait of `after` for `what` expired; returns the error.
    pub fn timed_out(&self, what: String, after: Duration) -> Error {
        self.abort(format!("timed out after {after:?} waiting for {what}"));
        Error::Timeout { what, after }
    }

    /// Sends `peer` the next signal on `channel`: everything this thread wrote before is
    /// visible to `peer` once its matching [`Self::wait_signal`] returns.
    pub fn put_signal(&self, peer: usize, channel: usize) {
        let count = &self.sent[channel * self.world + peer];
        count.set(count.get() + 1);
        self.slot(peer, channel, self.rank)
            .store(count.get(), Ordering::Release);
    }

    /// Waits for `peer`'s next signal on `channel`, at most `timeout`.
    pub fn wait_signal(&self, peer: usize, channel: usize, timeout: Duration) -> Result<()> {
        self.check_usable()?;
        let want = &self.seen[channel * self.world + peer];
        want.set(want.get() + 1);
        let slot = self.slot(self.rank, channel, peer);
        let mut spins = 0u32;
        let mut deadline = None;
        while slot.load(Ordering::Acquire) < want.get() {
            spins = spins.wrapping_add(1);
            if spins < self.spins_before_yield {
                std::hint::spin_loop();
                continue;
            }
            std::thread::yield_now();
            let deadline = *deadline.get_or_insert_with(|| Instant::now() + timeout);
            if spins % 64 == 0 {
                self.check_peer(peer)?;
                if Instant::now() >= deadline {
                    return Err(
                        self.timed_out(format!("rank {peer} on signal channel {channel}"), timeout)
                    );
                }
            }
        }
        Ok(())
    }

    /// Signals every peer on `channel` and waits for all of them. Fails if a peer has
    /// failed: its signal may be one it sent before giving up on an earlier call.
    pub fn barrier(&self, channel: usize) -> Result<()> {
        self.check_usable()?;
        for peer in (0..self.world).filter(|&p| p != self.rank) {
            self.put_signal(peer, channel);
        }
        for peer in (0..self.world).filter(|&p| p != self.rank) {
            self.wait_signal(peer, channel, self.timeout)?;
        }
        self.check_peers()
    }
}

/// How long a waiter spins before yielding, for `local_ranks` ranks on this machine.
fn spins_before_yield(local_ranks: usize) -> u32 {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if local_ranks > cores {
        SPINS_BEFORE_YIELD_OVERSUBSCRIBED
    } else {
        SPINS_BEFORE_YIELD
    }
}
