//! How a call larger than one launch is cut into launches of the same kernels.
//!
//! A launch can move only what the region's staging areas hold (`cap` bytes per half,
//! `lcap` per Lamport slot), so a larger call runs as consecutive launches on its stream,
//! each over a part of every rank's message; but two-shot pull, whose kernel moves the
//! parts one after another in one launch ([`twoshot_part`]). Where the parts lie follows
//! from the call's size and the layout alone, so every rank cuts alike, and every part
//! starts on a 16-byte boundary of the message, so an aligned buffer stays aligned.
//!
//! All-gather and reduce-scatter messages are strided: rank `r`'s part `k` lies at
//! `r * bytes + offset`, while the kernels place rank `r`'s share of a launch at
//! `r * (that launch's bytes)`. When such a call needs several launches (and there are
//! several ranks), each launch goes through a private scratch buffer of `cap` bytes, which
//! a strided copy fills from, or empties into, the caller's buffer.

use crate::algorithm::Algorithm;
use crate::layout::Layout;

/// A limit that never cuts: the largest multiple of 16.
const WHOLE: usize = usize::MAX & !15;

/// Slots the copy algorithm cuts the staging area (`2 * cap`) into: a slot is written
/// again `COPY_SLOTS` parts later, once every rank has copied it.
pub(crate) const COPY_SLOTS: usize = 4;

/// The smallest part of an all-reduce by copies that is cut further.
const MIN_COPY_PART: usize = 1 << 20;

/// The largest slot of the copy algorithm: larger parts would not copy faster, and every
/// rank keeps `world` slots of device memory for its peers' parts.
const MAX_COPY_SLOT: usize = 4 << 20;

/// Bytes of one slot of the copy algorithm (a multiple of 16).
pub(crate) fn copy_slot(layout: &Layout) -> usize {
    (2 * layout.cap / COPY_SLOTS).min(MAX_COPY_SLOT) & !15
}

/// Bytes of one part of a two-shot pull, which its kernel moves one after another in one
/// launch (a multiple of 16). Staged, each rank receives `world - 1` slices of
/// `ceil(vectors / world)` vectors in one staging half of `cap / 16` vectors: that holds for
/// a whole half unless the half is tiny against `world`, and then the part is cut to `world`
/// equal slices that fit. Zero-copy, each rank holds only its reduced slice, `1 / world`
/// of the part, in a buffer of `cap` bytes.
pub(crate) fn twoshot_part(layout: &Layout, zero_copy: bool) -> usize {
    let (half, world) = (layout.cap / 16, layout.world.max(1));
    if zero_copy {
        half * world * 16
    } else if (world - 1) * half.div_ceil(world) <= half {
        half * 16
    } else {
        half / world * world * 16
    }
}

/// One launch's part of a call: bytes `offset .. offset + bytes` of every rank's message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Chunk {
    /// Where the part starts in each rank's message (a multiple of 16).
    pub offset: usize,
    /// Its length.
    pub bytes: usize,
}

/// How one call is cut: parts of at most `limit` bytes (a positive multiple of 16, hence
/// of every element size), and whether they go through the scratch buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Cut {
    /// Most bytes of every rank's message one launch moves.
    pub limit: usize,
    /// The parts are strided in the caller's buffer and go through the scratch buffer.
    pub via_scratch: bool,
}

impl Cut {
    /// An all-reduce by `algorithm`. Staged one-shot pull copies the part into a staging
    /// half; push writes it into Lamport slots (`lcap`; the two-shot slices fit `slice_cap`
    /// then), or over host memory (`host`) a one-shot push also as data and flags into a
    /// staging half ([`Layout::oneshot_push_bytes`]). Zero-copy one-shot pull stages nothing
    /// and reads the peers' buffers in place. Two-shot pull runs whole in one launch, which
    /// moves it part after part ([`twoshot_part`]).
    pub(crate) fn all_reduce(
        layout: &Layout,
        algorithm: Algorithm,
        zero_copy: bool,
        host: bool,
    ) -> Cut {
        let limit = match (algorithm, zero_copy) {
            (Algorithm::OneshotPush, _) => layout.oneshot_push_bytes(host),
            (Algorithm::TwoshotPush, _) => layout.lcap,
            (Algorithm::OneshotPull, false) => layout.cap,
            (Algorithm::OneshotPull, true) | (Algorithm::TwoshotPull, _) => WHOLE,
            (Algorithm::OneshotCopy, _) => copy_slot(layout),
        };
        Cut::contiguous(limit)
    }

    /// An all-reduce by copies of `bytes` per rank: parts of a quarter of the message, so
    /// that copies out and in overlap, but at least [`MIN_COPY_PART`] (each part costs two
    /// barriers, a copy per peer and a kernel) and at most a slot.
    pub(crate) fn copies(layout: &Layout, bytes: usize) -> Cut {
        let slot = copy_slot(layout);
        Cut::contiguous(
            bytes
                .div_ceil(COPY_SLOTS)
                .max(MIN_COPY_PART)
                .next_multiple_of(16)
                .min(slot),
        )
    }

    /// A broadcast: the root stages its part in a staging half.
    pub(crate) fn broadcast(layout: &Layout) -> Cut {
        Cut::contiguous(layout.cap)
    }

    /// An all-gather of `bytes` per rank: one launch stages this rank's input whole
    /// while it fits a staging half; beyond, every rank's part of a launch meets in the
    /// scratch buffer.
    pub(crate) fn all_gather(layout: &Layout, bytes: usize) -> Cut {
        if bytes <= layout.cap {
            Cut::contiguous(layout.cap)
        } else {
            Cut::strided(layout, bytes)
        }
    }

    /// A reduce-scatter of `bytes` per rank (its output): every launch stages every rank's
    /// slice of it, each rounded up to 16 bytes, in one staging half.
    pub(crate) fn reduce_scatter(layout: &Layout, bytes: usize) -> Cut {
        Cut::strided(layout, bytes)
    }

    fn contiguous(limit: usize) -> Cut {
        Cut {
            limit,
            via_scratch: false,
        }
    }

    /// Parts of which every rank's share together fills at most one staging half. With
    /// one rank, or in one launch, a part lies where the kernel puts it.
    fn strided(layout: &Layout, bytes: usize) -> Cut {
        let limit = layout.cap / (16 * layout.world) * 16;
        Cut {
            limit,
            via_scratch: layout.world > 1 && bytes > limit,
        }
    }

    /// The parts of a message of `bytes` per rank, in order; none for an empty one.
    pub(crate) fn chunks(self, bytes: usize) -> impl Iterator<Item = Chunk> {
        (0..bytes).step_by(self.limit).map(move |offset| Chunk {
            offset,
            bytes: self.limit.min(bytes - offset),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::MAX_RANKS;

    const SIZES: [usize; 4] = [1, 2, 4, 8];

    fn layouts() -> impl Iterator<Item = Layout> {
        (1..=MAX_RANKS).flat_map(|world| {
            [
                (1, 1),
                (1000, 300),
                (64 << 10, 64 << 10),
                (8 << 20, 1 << 20),
            ]
            .map(|(max, lamport)| Layout::new(world, max, lamport.min(max)))
        })
    }

    /// Message sizes at and around every limit of `layout`, odd ones included.
    fn sizes(layout: &Layout, size: usize) -> Vec<usize> {
        let mut out = vec![size, 3 * size, 15 * size, 17 * size, 1001 * size];
        for limit in [layout.cap, layout.lcap, layout.cap / layout.world] {
            for n in [1, 2, 3] {
                for delta in [-2isize, -1, 0, 1, 2] {
                    let elements = (n * limit / size) as isize + delta;
                    out.push(elements.max(1) as usize * size);
                }
            }
        }
        out
    }

    /// The cut covers the message exactly once, in order, in whole elements, from 16-byte
    /// boundaries; returns its parts.
    fn check_cover(cut: Cut, bytes: usize, size: usize) -> Vec<Chunk> {
        assert!(cut.limit > 0 && cut.limit % 16 == 0, "{cut:?}");
        let parts: Vec<Chunk> = cut.chunks(bytes).collect();
        let mut next = 0;
        for c in &parts {
            assert_eq!(
                c.offset, next,
                "{cut:?} over {bytes} B: a gap or an overlap"
            );
            assert_eq!(c.offset % 16, 0, "{c:?}");
            assert!(c.bytes > 0 && c.bytes <= cut.limit, "{c:?} of {cut:?}");
            assert_eq!(c.bytes % size, 0, "{c:?} splits an element of {size} B");
            next += c.bytes;
        }
        assert_eq!(next, bytes, "{cut:?} covers {next} of {bytes} B");
        parts
    }

    /// Vectors of 16 bytes the kernels move for `bytes`.
    fn vectors(bytes: usize) -> usize {
        bytes.div_ceil(16)
    }

    #[test]
    fn all_reduce_launches_fit_the_staging_and_the_mailboxes() {
        for layout in layouts() {
            for (algorithm, host) in Algorithm::ALL
                .into_iter()
                .flat_map(|a| [(a, false), (a, true)])
            {
                for zero_copy in [false, true] {
                    let cut = Cut::all_reduce(&layout, algorithm, zero_copy, host);
                    assert!(!cut.via_scratch);
                    for size in SIZES {
                        for bytes in sizes(&layout, size) {
                            for c in check_cover(cut, bytes, size) {
                                let nvec = vectors(c.bytes);
                                let slice = nvec.div_ceil(layout.world);
                                match (algorithm, zero_copy) {
                                    (Algorithm::OneshotPull, false) => {
                                        assert!(nvec * 16 <= layout.cap)
                                    }
                                    (Algorithm::OneshotPull, true)
                                    | (Algorithm::TwoshotPull, _) => {
                                        assert_eq!(c.bytes, bytes)
                                    }
                                    // Over host memory beyond the mailboxes, data and
                                    // flags: every peer's copy in a staging half.
                                    (Algorithm::OneshotPush, _) => assert!(
                                        nvec * 16 <= layout.lcap
                                            || host && (layout.world - 1) * nvec * 16 <= layout.cap
                                    ),
                                    (Algorithm::TwoshotPush, _) => {
                                        assert!(nvec * 16 <= layout.lcap);
                                        assert!(slice * 16 <= layout.slice_cap);
                                    }
                                    (Algorithm::OneshotCopy, _) => {
                                        assert!(nvec * 16 <= copy_slot(&layout))
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn two_shot_parts_fit_the_staging_and_fill_a_half_unless_it_is_tiny() {
        for layout in layouts() {
            let staged = twoshot_part(&layout, false);
            if layout.cap >= 16 * layout.world * layout.world {
                assert_eq!(staged, layout.cap, "{layout:?}");
            }
            // Any part up to this size, the last one included, fits.
            for bytes in [16, staged / 2, staged - 16, staged] {
                let slice = (bytes / 16).div_ceil(layout.world);
                assert!(
                    (layout.world - 1) * slice * 16 <= layout.cap,
                    "{layout:?} {bytes}"
                );
            }
            let zero_copy = twoshot_part(&layout, true);
            assert!((zero_copy / 16).div_ceil(layout.world) * 16 <= layout.cap);
            assert!(staged % 16 == 0 && zero_copy % 16 == 0 && staged > 0);
        }
        // 256 B halves (16 vectors) at 7 ranks: 6 slices of 3 vectors would not fit.
        let tiny = Layout::new(7, 1, 1);
        assert_eq!(twoshot_part(&tiny, false), 14 * 16);
    }

    #[test]
    fn messages_that_fit_run_in_one_launch() {
        for layout in layouts() {
            for algorithm in Algorithm::ALL {
                let limit = if algorithm.is_push() {
                    layout.lcap
                } else if algorithm == Algorithm::OneshotCopy {
                    copy_slot(&layout)
                } else {
                    layout.cap
                };
                let cut = Cut::all_reduce(&layout, algorithm, false, false);
                assert_eq!(cut.chunks(limit).count(), 1, "{algorithm}");
                let more = if algorithm == Algorithm::TwoshotPull {
                    1
                } else {
                    2
                };
                assert_eq!(cut.chunks(limit + 2).count(), more, "{algorithm}");
            }
            // Over host memory a one-shot push also goes as data and flags.
            let most = layout.oneshot_push_bytes(true);
            assert!(most >= layout.lcap);
            let host = Cut::all_reduce(&layout, Algorithm::OneshotPush, false, true);
            assert_eq!(host.chunks(most).count(), 1);
            assert_eq!(host.chunks(most + 16).count(), 2);
            assert_eq!(Cut::broadcast(&layout).chunks(layout.cap).count(), 1);
            assert_eq!(Cut::broadcast(&layout).chunks(layout.cap + 1).count(), 2);
            let gather = Cut::all_gather(&layout, layout.cap);
            assert_eq!(gather.chunks(layout.cap).count(), 1);
            assert!(!gather.via_scratch);
            // The most a reduce-scatter stages at once: every rank's slice in one half.
            let whole = layout.cap / layout.world / 16 * 16;
            let scatter = Cut::reduce_scatter(&layout, whole);
            assert_eq!(scatter.chunks(whole).count(), 1);
            assert!(!scatter.via_scratch);
            assert!(
                Cut::reduce_scatter(&layout, whole + 2)
                    .chunks(whole + 2)
                    .count()
                    == 2
            );
        }
    }

    #[test]
    fn broadcast_launches_fit_a_staging_half() {
        for layout in layouts() {
            let cut = Cut::broadcast(&layout);
            assert!(!cut.via_scratch);
            for size in SIZES {
                for bytes in sizes(&layout, size) {
                    for c in check_cover(cut, bytes, size) {
                        assert!(vectors(c.bytes) * 16 <= layout.cap);
                    }
                }
            }
        }
    }

    #[test]
    fn strided_launches_fit_a_staging_half_and_the_scratch_buffer() {
        for layout in layouts() {
            let world = layout.world;
            for size in SIZES {
                for bytes in sizes(&layout, size) {
                    let gather = Cut::all_gather(&layout, bytes);
                    let scatter = Cut::reduce_scatter(&layout, bytes);
                    for (name, cut) in [("all-gather", gather), ("reduce-scatter", scatter)] {
                        let parts = check_cover(cut, bytes, size);
                        // Parts placed where the kernel puts them are right only when
                        // rank r's part lands at r * bytes + offset: one rank, or one part.
                        assert_eq!(
                            cut.via_scratch,
                            world > 1 && parts.len() > 1,
                            "{name} of {bytes} B on {world} ranks"
                        );
                        for c in parts {
                            // This rank's staged part (all-gather), every rank's
                            // (reduce-scatter), and the scratch buffer's rows.
                            assert!(vectors(c.bytes) * 16 <= layout.cap);
                            if name == "reduce-scatter" {
                                assert!(world * vectors(c.bytes) * 16 <= layout.cap);
                            }
                            if cut.via_scratch {
                                assert!(world * c.bytes <= layout.cap);
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn copies_come_in_quarters_of_at_least_a_mebibyte_within_a_slot() {
        for layout in layouts() {
            let slot = copy_slot(&layout);
            assert!(slot % 16 == 0 && COPY_SLOTS * slot <= 2 * layout.cap);
            for size in SIZES {
                for bytes in sizes(&layout, size).into_iter().chain([64 << 20, 3 << 20]) {
                    let cut = Cut::copies(&layout, bytes);
                    for c in check_cover(cut, bytes, size) {
                        assert!(c.bytes <= slot, "{c:?} of a {slot} B slot");
                    }
                }
            }
        }
        let layout = Layout::new(2, 8 << 20, 1 << 20);
        // 64 MiB: parts of a slot (4 MiB, also with larger staging); 3 MiB: four of 768 KiB
        // would be under the smallest part, so three of 1 MiB; 512 KiB: one.
        assert_eq!(Cut::copies(&layout, 64 << 20).limit, 4 << 20);
        let larger = Layout::new(8, 64 << 20, 1 << 20);
        assert_eq!(Cut::copies(&larger, 64 << 20).limit, 4 << 20);
        assert_eq!(Cut::copies(&layout, 3 << 20).chunks(3 << 20).count(), 3);
        assert_eq!(Cut::copies(&layout, 512 << 10).chunks(512 << 10).count(), 1);
    }

    #[test]
    fn every_rank_cuts_alike_from_the_call_and_the_layout() {
        let layout = Layout::new(8, 1 << 20, 1 << 16);
        let cut = Cut::all_reduce(&layout, Algorithm::OneshotPull, false, false);
        let parts: Vec<Chunk> = cut.chunks((5 << 20) + 6).collect();
        assert_eq!(parts.len(), 6);
        assert_eq!(
            parts[5],
            Chunk {
                offset: 5 << 20,
                bytes: 6
            }
        );
        assert_eq!(parts, cut.chunks((5 << 20) + 6).collect::<Vec<_>>());
        assert_eq!(cut.chunks(0).count(), 0);
        // 8 ranks' parts of 128 KiB fill one 1 MiB half.
        let scatter = Cut::reduce_scatter(&layout, 1 << 20);
        assert_eq!(scatter.limit, 128 << 10);
        assert!(scatter.via_scratch);
    }
}
