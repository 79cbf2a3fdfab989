//! Where everything lives in a rank's device segment; mirrors the top of
//! `kernels/symm.cuh` and `kernels/symm_collectives.cu` (keep them in step).
//!
//! The header holds the signal pads (written by peers) and this rank's own counters; the
//! data areas follow: two staging halves (by call parity), the two-shot result slice and
//! the Lamport inboxes (three rotating inboxes of one slot per sender). Every area starts
//! on a 256-byte boundary, so every 16-byte vector access is aligned.

/// Most ranks (signal slots and pointer tables are sized for it).
pub const MAX_RANKS: usize = 8;
/// Most blocks per collective launch (barrier slots per set).
pub const MAX_BLOCKS: u32 = 64;
/// Most threads per block (the kernels' `__launch_bounds__`).
pub const MAX_THREADS: u32 = 512;
/// User signal channels of the heap primitives.
pub const CHANNELS: usize = 4;
/// Bytes of the pads peers write: `coll[2][MAX_BLOCKS][MAX_RANKS]` + `chan[CHANNELS][MAX_RANKS]`.
pub const PAD_BYTES: usize = (2 * MAX_BLOCKS as usize * MAX_RANKS + CHANNELS * MAX_RANKS) * 4;
/// Offset of this rank's own counters (`SymmState`).
pub const STATE_OFFSET: usize = 8192;
/// Bytes of `SymmState`: 4 u32, 3 u64, 2 x CHANNELS x MAX_RANKS u32.
pub const STATE_BYTES: usize = 16 + 24 + 2 * CHANNELS * MAX_RANKS * 4;
/// Bytes before the data areas.
pub const HEADER_BYTES: usize = 16 << 10;
/// Lamport inboxes that rotate.
pub const LAMPORT_INBOXES: usize = 3;

const ALIGN: usize = 256;

/// Offsets (bytes from the segment's start) of the data areas, the same on every rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// Ranks.
    pub world: usize,
    /// Bytes of one staging half (the largest message, rounded up).
    pub cap: usize,
    /// Bytes of one Lamport sender slot (the largest Lamport message, rounded up).
    pub lcap: usize,
    /// Two staging halves.
    pub off_data: usize,
    /// Two-shot result slice (`cap`).
    pub off_tmp: usize,
    /// Lamport inboxes (`3 * world * lcap`).
    pub off_lamport: usize,
    /// Size of the whole segment.
    pub total: usize,
}

impl Layout {
    /// The layout for `world` ranks, messages up to `max_bytes`, Lamport messages up to
    /// `lamport_bytes`.
    pub fn new(world: usize, max_bytes: usize, lamport_bytes: usize) -> Layout {
        let world = world.max(1);
        let cap = max_bytes.max(16).next_multiple_of(ALIGN);
        let lcap = lamport_bytes.max(16).next_multiple_of(ALIGN);
        let off_data = HEADER_BYTES;
        let off_tmp = off_data + 2 * cap;
        let off_lamport = off_tmp + cap;
        let total = off_lamport + LAMPORT_INBOXES * world * lcap;
        Layout {
            world,
            cap,
            lcap,
            off_data,
            off_tmp,
            off_lamport,
            total,
        }
    }

    /// The bytes that start as the Lamport sentinel (all bits set).
    pub fn lamport_range(&self) -> std::ops::Range<usize> {
        self.off_lamport..self.total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_holds_pads_and_state() {
        const { assert!(PAD_BYTES <= STATE_OFFSET) };
        const { assert!(STATE_OFFSET + STATE_BYTES <= HEADER_BYTES) };
    }

    #[test]
    fn areas_are_aligned_and_disjoint() {
        for world in 1..=MAX_RANKS {
            for (max, lam) in [(1, 1), (42 * 1024, 1 << 20), ((8 << 20) + 2, 3)] {
                let l = Layout::new(world, max, lam);
                assert!(l.cap >= max && l.lcap >= lam);
                for off in [l.off_data, l.off_tmp, l.off_lamport] {
                    assert_eq!(off % ALIGN, 0);
                }
                assert!(l.off_data >= HEADER_BYTES);
                assert!(l.off_data + 2 * l.cap <= l.off_tmp);
                assert!(l.off_tmp + l.cap <= l.off_lamport);
                assert_eq!(l.lamport_range().len(), 3 * world * l.lcap);
            }
        }
    }

    #[test]
    fn constants_match_the_kernel_header() {
        let h = include_str!("../../kernels/symm.cuh");
        for (name, v) in [
            ("SYMM_MAX_RANKS", MAX_RANKS),
            ("SYMM_MAX_BLOCKS", MAX_BLOCKS as usize),
            ("SYMM_MAX_THREADS", MAX_THREADS as usize),
            ("SYMM_CHANNELS", CHANNELS),
            ("SYMM_STATE_OFFSET", STATE_OFFSET),
        ] {
            assert!(h.contains(&format!("#define {name} {v}\n")), "{name} {v}");
        }
    }
}
