//! Where everything lives inside one rank's registered region.
//!
//! Mirrors the comment at the top of `kernels/ipc_allreduce.cu`: a header (barrier flags
//! that peers write, then this rank's own state), the eager data buffers (two, by call
//! parity), the two-shot tmp buffer, and the Lamport mailboxes of the push algorithms
//! (three rotating buffers each). Every area starts on a 256-byte boundary, so every
//! 16-byte vector access is aligned.

/// Most ranks the kernels handle (flag slots and pointer tables are sized for it).
pub const MAX_RANKS: usize = 8;
/// Most blocks per launch (flag slots per barrier set).
pub const MAX_BLOCKS: u32 = 128;
/// Most threads per block (the kernels' `__launch_bounds__`).
pub const MAX_THREADS: u32 = 512;
/// Bytes of the barrier flags: `u32 flags[2][MAX_BLOCKS][MAX_RANKS]`.
pub const SIGNAL_BYTES: usize = 2 * MAX_BLOCKS as usize * MAX_RANKS * 4;
/// Offset of this rank's own state (call counter, Lamport sizes).
pub const STATE_OFFSET: usize = SIGNAL_BYTES;
/// Bytes before the first data area (flags and state, rounded up).
pub const HEADER_BYTES: usize = 16 << 10;
/// Lamport buffers that rotate.
pub const LAMPORT_BUFFERS: usize = 3;

const ALIGN: usize = 256;

/// Offsets (bytes) of the areas of one region, the same on every rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// Ranks.
    pub world: usize,
    /// Bytes of one message slot: the largest message, rounded up to 16.
    pub cap: usize,
    /// Bytes of one two-shot push slice slot (`cap / world`, rounded up to 16).
    pub slice_cap: usize,
    /// Two eager input copies (`2 * cap`).
    pub off_data: usize,
    /// Two-shot pull's reduced slice (`cap`).
    pub off_tmp: usize,
    /// One-shot push mailboxes (`3 * world * cap`).
    pub off_push: usize,
    /// Two-shot push slice mailboxes (`3 * world * slice_cap`).
    pub off_recv: usize,
    /// Two-shot push result mailboxes (`3 * cap`).
    pub off_result: usize,
    /// Size of the whole region.
    pub total: usize,
}

impl Layout {
    /// The layout for `world` ranks and messages of up to `max_bytes` bytes.
    pub fn new(world: usize, max_bytes: usize) -> Layout {
        let world = world.max(1);
        let cap = max_bytes.max(16).next_multiple_of(16);
        let slice_cap = (cap / 16).div_ceil(world) * 16;
        let mut at = HEADER_BYTES;
        let mut area = |bytes: usize| {
            let start = at;
            at = (at + bytes).next_multiple_of(ALIGN);
            start
        };
        let off_data = area(2 * cap);
        let off_tmp = area(cap);
        let off_push = area(LAMPORT_BUFFERS * world * cap);
        let off_recv = area(LAMPORT_BUFFERS * world * slice_cap);
        let off_result = area(LAMPORT_BUFFERS * cap);
        Layout {
            world,
            cap,
            slice_cap,
            off_data,
            off_tmp,
            off_push,
            off_recv,
            off_result,
            total: at,
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
            for max in [1, 15, 16, 42 * 1024, 8 << 20, (8 << 20) + 2] {
                let l = Layout::new(world, max);
                assert!(l.cap >= max && l.cap % 16 == 0);
                assert!(l.slice_cap * world >= l.cap && l.slice_cap % 16 == 0);
                let starts = [l.off_data, l.off_tmp, l.off_push, l.off_recv, l.off_result];
                let sizes = [
                    2 * l.cap,
                    l.cap,
                    3 * world * l.cap,
                    3 * world * l.slice_cap,
                    3 * l.cap,
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
    fn header_holds_flags_and_state() {
        // State: seq, done, abort, pad (4 x u32) + used[3][3] u64 = 88 bytes.
        const { assert!(STATE_OFFSET + 88 <= HEADER_BYTES) };
        // The kernel's IPC_STATE_OFFSET.
        const { assert!(SIGNAL_BYTES == 8192) };
    }
}
