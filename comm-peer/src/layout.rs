//! Where everything lives inside one rank's region; mirrors the top of
//! `kernels/peer_sync.cuh` (keep the two in step).
//!
//! A header (barrier flags, signal slots and call slots that peers write),
//! the staged inputs (two, by call parity; two-shot pull stages there the slices its
//! peers write), the two-shot pull's reduced slice, and the
//! Lamport mailboxes (three rotating buffers each). Every area starts on a 256-byte
//! boundary, so every 16-byte vector access is aligned.

/// Most ranks the kernels handle (flag slots and pointer tables are sized for it).
pub const MAX_RANKS: usize = 8;
/// Most blocks per launch (flag slots per barrier set).
pub const MAX_BLOCKS: u32 = 128;
/// Most threads per block (the kernels' `__launch_bounds__`).
pub const MAX_THREADS: u32 = 512;
/// User signal channels of the primitives.
pub const CHANNELS: usize = 4;
/// Channels the communicator keeps for itself, after the user's: the copy algorithm's
/// (`copies`: parts staged, parts read) and the communicator's barrier's
/// ([`BARRIER_CHANNEL`]), so that none counts a user's signals as its own.
pub const OWN_CHANNELS: usize = 3;
/// The own channel (counted after the user's) of `Communicator::barrier`.
pub const BARRIER_CHANNEL: usize = 2;
/// Every channel of the pads and signal counters.
pub const ALL_CHANNELS: usize = CHANNELS + OWN_CHANNELS;
/// Words of a call descriptor the kernels compare (`PeerCall`: the words and a tag).
pub const CALL_WORDS: usize = 7;
/// Where the pad's call slots start: after `flags[2][MAX_BLOCKS][MAX_RANKS]` and
/// `chan[ALL_CHANNELS][MAX_RANKS]` (u32).
pub const CALLS_OFFSET: usize =
    (2 * MAX_BLOCKS as usize * MAX_RANKS + ALL_CHANNELS * MAX_RANKS) * 4;
/// Where the pad's call digests start: after `calls[2][MAX_RANKS]` of `CALL_WORDS + 1` u64
/// (each word tagged with its call), on a 128-byte boundary.
pub const DIGESTS_OFFSET: usize =
    (CALLS_OFFSET + 2 * MAX_RANKS * (CALL_WORDS + 1) * 8).next_multiple_of(128);
/// Bytes of the pad peers write: the flags and channels, the calls, then
/// `digests[2][MAX_RANKS]` of 16 bytes (a digest of the call beside its tag).
pub const PAD_BYTES: usize = DIGESTS_OFFSET + 2 * MAX_RANKS * 16;
/// Bytes of `PeerState`, this rank's own bookkeeping (MAX_BLOCKS + 2 u32, 3 x 3 u64,
/// 2 x ALL_CHANNELS x MAX_RANKS u32, MAX_BLOCKS u64, 2 x MAX_BLOCKS u32), kept in device
/// memory beside the region, not in it.
pub const STATE_BYTES: usize = (MAX_BLOCKS as usize + 2) * 4
    + 72
    + 2 * ALL_CHANNELS * MAX_RANKS * 4
    + MAX_BLOCKS as usize * 8
    + 2 * MAX_BLOCKS as usize * 4;
/// Bytes before the first data area (the pad, rounded up).
pub const HEADER_BYTES: usize = 12 << 10;
/// Lamport buffers that rotate.
pub const LAMPORT_BUFFERS: usize = 3;

const ALIGN: usize = 256;

/// Offsets (bytes) of the areas of one region, the same on every rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// Ranks.
    pub world: usize,
    /// Bytes of one staging half: the largest message, rounded up.
    pub cap: usize,
    /// Bytes of one Lamport sender slot: the largest push message, rounded up.
    pub lcap: usize,
    /// Bytes of one two-shot push slice slot (`lcap / world`, rounded up to 16).
    pub slice_cap: usize,
    /// Two staged inputs (`2 * cap`).
    pub off_data: usize,
    /// Two-shot pull's reduced slice (`cap`).
    pub off_tmp: usize,
    /// One-shot push mailboxes (`3 * world * lcap`).
    pub off_push: usize,
    /// Two-shot push slice mailboxes (`3 * world * slice_cap`).
    pub off_recv: usize,
    /// Two-shot push result mailboxes (`3 * lcap`).
    pub off_result: usize,
    /// Size of the whole region.
    pub total: usize,
}

impl Layout {
    /// The layout for `world` ranks, messages of up to `max_bytes` and push (Lamport)
    /// messages of up to `lamport_bytes`.
    pub fn new(world: usize, max_bytes: usize, lamport_bytes: usize) -> Layout {
        let world = world.max(1);
        let cap = max_bytes.max(16).next_multiple_of(ALIGN);
        let lcap = lamport_bytes.max(16).next_multiple_of(ALIGN);
        let slice_cap = (lcap / 16).div_ceil(world) * 16;
        let mut at = HEADER_BYTES;
        let mut area = |bytes: usize| {
            let start = at;
            at = (at + bytes).next_multiple_of(ALIGN);
            start
        };
        let off_data = area(2 * cap);
        let off_tmp = area(cap);
        let off_push = area(LAMPORT_BUFFERS * world * lcap);
        let off_recv = area(LAMPORT_BUFFERS * world * slice_cap);
        let off_result = area(LAMPORT_BUFFERS * lcap);
        Layout {
            world,
            cap,
            lcap,
            slice_cap,
            off_data,
            off_tmp,
            off_push,
            off_recv,
            off_result,
            total: at,
        }
    }

    /// The largest one-shot push that can go as data and flags (over host memory, where
    /// no Lamport mailbox is needed): every peer's copy in one staging half, a multiple of 16.
    pub fn flagged_push_bytes(&self) -> usize {
        self.cap / (self.world - 1).max(1) / 16 * 16
    }

    /// The largest one-shot push launch: the Lamport mailboxes, or over host memory (`host`)
    /// also what data and flags carry ([`Layout::flagged_push_bytes`]).
    pub fn oneshot_push_bytes(&self, host: bool) -> usize {
        if host {
            self.lcap.max(self.flagged_push_bytes())
        } else {
            self.lcap
        }
    }

    /// The byte range that must start as the Lamport sentinel (all bits set).
    pub fn lamport_range(&self) -> std::ops::Range<usize> {
        self.off_push..self.total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn areas_are_aligned_disjoint_and_large_enough() {
        for world in 1..=MAX_RANKS {
            for (max, lam) in [
                (1, 1),
                (15, 15),
                (42 * 1024, 1 << 20),
                ((8 << 20) + 2, 8 << 20),
            ] {
                let l = Layout::new(world, max, lam);
                assert!(l.cap >= max && l.cap % 16 == 0);
                assert!(l.lcap >= lam && l.lcap % 16 == 0);
                assert!(l.slice_cap * world >= l.lcap && l.slice_cap % 16 == 0);
                let starts = [l.off_data, l.off_tmp, l.off_push, l.off_recv, l.off_result];
                let sizes = [
                    2 * l.cap,
                    l.cap,
                    3 * world * l.lcap,
                    3 * world * l.slice_cap,
                    3 * l.lcap,
                ];
                assert!(starts[0] >= HEADER_BYTES);
                for i in 0..starts.len() {
                    assert_eq!(starts[i] % ALIGN, 0);
                    let end = starts[i] + sizes[i];
                    let next = starts.get(i + 1).copied().unwrap_or(l.total);
                    assert!(end <= next, "world {world} max {max} area {i}");
                }
            }
        }
    }

    #[test]
    fn a_flagged_push_puts_every_peers_copy_in_one_staging_half() {
        let pair = Layout::new(2, 8 << 20, 1 << 20);
        assert_eq!(pair.flagged_push_bytes(), 8 << 20);
        assert_eq!(pair.oneshot_push_bytes(true), 8 << 20);
        assert_eq!(pair.oneshot_push_bytes(false), 1 << 20);
        for world in 2..=MAX_RANKS {
            let l = Layout::new(world, (1 << 20) + 48, 1 << 20);
            let most = l.flagged_push_bytes();
            assert!(most % 16 == 0 && (world - 1) * most <= l.cap, "{world}");
            assert!((world - 1) * (most + 16) > l.cap, "{world}");
            assert_eq!(l.oneshot_push_bytes(true), most.max(l.lcap));
        }
    }

    #[test]
    fn header_holds_the_pad() {
        const { assert!(PAD_BYTES <= HEADER_BYTES) };
        const { assert!(HEADER_BYTES % ALIGN == 0) };
    }

    #[test]
    fn the_call_slots_follow_the_flags_and_channels_as_in_the_kernel_pad() {
        // The host reads peers' call slots at CALLS_OFFSET (crate::progress): the kernel's
        // PeerPad must hold the same fields in the same order, with no padding before calls.
        let h = include_str!("../kernels/peer_sync.cuh");
        assert!(h.contains(
            "struct PeerPad {\n    uint32_t flags[2][PEER_MAX_BLOCKS][PEER_MAX_RANKS];\n    \
             uint32_t chan[PEER_CHANNELS][PEER_MAX_RANKS];\n    PeerCall calls[2][PEER_MAX_RANKS];\n"
        ));
        // Then the digests, on the next 128-byte boundary.
        assert!(h.contains("    alignas(128) uint4 digests[2][PEER_MAX_RANKS];\n};"));
        assert_eq!(DIGESTS_OFFSET, 9472);
        assert_eq!(CALLS_OFFSET % 8, 0);
        assert_eq!(CALLS_OFFSET, (2 * 128 * 8 + 7 * 8) * 4);
    }

    #[test]
    fn constants_match_the_kernel_header() {
        let h = include_str!("../kernels/peer_sync.cuh");
        for (name, v) in [
            ("PEER_MAX_RANKS", MAX_RANKS),
            ("PEER_MAX_BLOCKS", MAX_BLOCKS as usize),
            ("PEER_MAX_THREADS", MAX_THREADS as usize),
            ("PEER_CHANNELS", ALL_CHANNELS),
            ("PEER_CALL_WORDS", CALL_WORDS),
        ] {
            assert!(h.contains(&format!("#define {name} {v}\n")), "{name} {v}");
        }
    }
}
