//! Grids of the peer-memory kernels: how many blocks of how many threads a launch takes,
//! the same on every rank (the per-block barriers pair blocks by index).

use comm_core::DType;

use crate::algorithm::Algorithm;
use crate::layout::MAX_BLOCKS;

/// Most blocks per launch and work items per thread, unless configured: on device memory
/// every SM of the device (at most [`MAX_BLOCKS`]), one item per thread; where ranks share
/// a device, their share of it and at most 36 (all their blocks must be resident at once,
/// beside whatever else runs there); on host memory mapped into the devices at most 8 blocks
/// of 4 items per thread, since there each block costs more than it carries. Measured on
/// 2 x H200 (benchmarks/history/2026-11-30.md, the grid step): one-shot push over NVLink
/// carries ~160 GB/s with 36 blocks and ~240 GB/s with 128; through host memory 42 KB takes
/// 20.7 us with 2 blocks and 33.9 us with 8.
pub(crate) fn default_grid(sms: u32, sharing: usize, host_memory: bool) -> (u32, usize) {
    if host_memory {
        (8, 4)
    } else if sharing > 1 {
        ((sms / sharing as u32).clamp(1, 36), 1)
    } else {
        (sms.clamp(1, MAX_BLOCKS), 1)
    }
}

/// Blocks for one launch over `work` items (one per thread), at most `max_blocks`. Every
/// rank computes the same number (the per-block barriers pair blocks by index).
pub(crate) fn blocks(work: usize, threads: u32, max_blocks: u32) -> u32 {
    work.div_ceil(threads as usize)
        .clamp(1, max_blocks.clamp(1, MAX_BLOCKS) as usize) as u32
}

/// Block sizes of a spread grid ([`spread_grid`]), and those whose residency
/// [`Residency`](crate::residency::Residency) knows.
pub(crate) const BLOCK_SIZES: [u32; 3] = [128, 256, 512];

/// The figure of `per_size` (one per [`BLOCK_SIZES`]) for blocks of `threads` threads: that
/// of the least size that is not smaller (a block of fewer threads needs no more room), or of
/// the largest.
pub(crate) fn by_block_size(per_size: [u32; 3], threads: u32) -> u32 {
    BLOCK_SIZES
        .iter()
        .zip(per_size)
        .find(|(size, _)| threads <= **size)
        .map_or(per_size[2], |(_, n)| n)
}

/// Grid of a one-shot all-reduce over `work` vectors (one per thread): blocks of the fewest
/// threads, a power of two from the least of [`BLOCK_SIZES`] up to `threads`, that hold
/// every vector in at most `spread(threads per block)` blocks; where none does, `threads`
/// per block and at most `max_blocks` blocks, as [`blocks`] gives. A small message then
/// runs on more SMs with fewer warps each: after its wait every thread reduces and stores
/// its vector, and with 16 warps on one SM they queue for its schedulers (on one H200, two
/// ranks, 42 KB in 21 blocks of 128 threads took 2.56 us against 2.98 in 6 of 512). Every
/// rank computes the same grid.
pub(crate) fn spread_grid(
    work: usize,
    threads: u32,
    spread: impl Fn(u32) -> u32,
    max_blocks: u32,
) -> (u32, u32) {
    match fewest_threads(threads, |t| work.div_ceil(t as usize) <= spread(t) as usize) {
        Some(t) => (blocks(work, t, spread(t)), t),
        None => (blocks(work, threads, max_blocks), threads),
    }
}

/// The fewest threads per block, a power of two from the least of [`BLOCK_SIZES`] up to
/// `threads` (which ends the list, a power of two or not), for which `fits`.
fn fewest_threads(threads: u32, fits: impl Fn(u32) -> bool) -> Option<u32> {
    let mut t = BLOCK_SIZES[0].min(threads).max(1);
    loop {
        if fits(t) {
            return Some(t);
        }
        if t >= threads {
            return None;
        }
        t = (t * 2).min(threads);
    }
}

/// Grid of the fused all-reduce + residual add + RMSNorm over `rows` rows of `rvec` vectors:
/// each row cut into parts of one vector per thread, in blocks of the fewest threads (as
/// [`spread_grid`]) for which `rows x parts` blocks fit `spread(threads per block)`, the
/// kernel launching exactly that many; where none fits, a block per row (at most
/// `max_blocks`, which then take several rows each) of `threads` at most. A row in one block
/// of 512 threads left a 42 KB layer (3 x 7168) on 3 SMs, two vectors per thread, each
/// waited for in turn. Every rank computes the same grid (the kernel derives the parts from
/// it).
pub(crate) fn fused_grid(
    rows: usize,
    rvec: usize,
    threads: u32,
    spread: impl Fn(u32) -> u32,
    max_blocks: u32,
) -> (u32, u32) {
    let (rows, rvec) = (rows.max(1), rvec.max(1));
    let parts = |t: u32| rvec.div_ceil(t as usize);
    // A part's thread i reads part i's sum: parts <= threads.
    let fits = |t: u32| {
        rows * parts(t) <= spread(t).clamp(1, MAX_BLOCKS) as usize && parts(t) <= t as usize
    };
    let warps = |t: u32| (rvec.next_multiple_of(32) as u32).clamp(32, t);
    match fewest_threads(threads, fits) {
        Some(t) if parts(t) == 1 => (rows as u32, warps(t)),
        Some(t) => ((rows * parts(t)) as u32, t),
        None => (blocks(rows, 1, max_blocks), warps(threads)),
    }
}

/// Where two ranks share one link, the chunk of the first writer whose flag lets the later
/// writer start (with chunks of 128 KiB it ends 576 KiB in). At 1 MiB a wait for chunk 2
/// gained less, and for chunks 5 and 7 it lost 1% and 9% (BENCHMARKS.md, "turns").
const TURN_AFTER_CHUNK: usize = 4;
/// The least message that takes turns ([`Streamed::late_chunk`]).
const TURNS_FROM: usize = 1 << 20;

/// How a streamed one-shot push over host memory (the kernel's `peer_oneshot_streamed`)
/// runs one launch: the message cut into chunks of `chunk` bytes (a multiple of 16), which
/// `writers` blocks store into the peers, each chunk followed by its flag, and `readers`
/// blocks (one to three per chunk, one of them polling) reduce as each chunk's flags come.
/// Every rank computes the same.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Streamed {
    pub chunk: usize,
    pub writers: u32,
    pub readers: u32,
    /// Small first and last chunks: their bytes and the chunks of `chunk` bytes between the
    /// first and the last ones (None: every chunk `chunk` bytes).
    pub taper: Option<(usize, u32)>,
}

impl Streamed {
    /// Whether a message of `bytes` has two or more readers a chunk (the kernel then reads
    /// each chunk with a group of blocks: `peer_oneshot_grouped_*`).
    pub(crate) fn grouped(&self, bytes: usize) -> bool {
        self.taper.is_none() && self.readers as usize >= 2 * bytes.div_ceil(self.chunk)
    }

    /// The plan for `bytes` in at most `most_blocks` blocks (at least 2); `None` for a
    /// message of three chunks or fewer, which goes as one chunk over the whole grid, each
    /// block writing its share, then reading it (`peer_oneshot_flagged`: 42 KB in 9.4-9.6
    /// us, against 9.8-10.0 for three chunks written and read by the same three blocks and
    /// 10.3-10.5 for two chunks in two writers and two readers).
    ///
    /// A writer's flag waits for its stores to reach host memory (its fence took ~2.2 us a
    /// chunk on one H200, whatever the chunk's size), and the GPU's reads of host memory wait
    /// behind its writes there: so few writers of large chunks, which leave reads of early
    /// chunks room to cross while later ones are written. One H200, two ranks, graphs, us
    /// (chunk, writers, readers), 2026-12-03: 128 KiB 15.0 with 32 KiB x 2 (18.0-18.4 with 16
    /// KiB x 2); 256 KiB 22.7-23.1 with 64 KiB x 2 (24.2 with 32 KiB); 512 KiB 36.4-36.8 with
    /// 64 KiB x 2 (42.2-43.1 with 128 KiB); 1 MiB 63.6-63.8 with 128 KiB x 2 (65.6-66.4 with
    /// 64 KiB, 70.1-70.8 with one writer, 73.6-73.9 with 16 writers). Readers per chunk, one
    /// polling host memory for the others (2026-12-04; 1 / 2 / 3 / 4 / 6), 4 chunks: 128 KiB
    /// 15.1 / 14.8 / 14.7 / 14.9 / 14.8; 256 KiB 22.7 / 21.4 / 21.0 / 20.9 / 20.8; 384 KiB
    /// (96 KiB chunks) - / 28.7 / 31.8 / 31.0 / 31.0, against 30.8 in 8 chunks of one reader;
    /// 512 KiB (128 KiB chunks) - / 36.6 / 37.3 / 41.4 / 41.0, against 36.8 in 8 (and 36.9
    /// against 36.0 in another run, so 512 KiB keeps 8 chunks); 8 chunks of
    /// 2 readers: 512 KiB 39.5, 1 MiB 66.6; 1 MiB in 4 chunks of 256 KiB, 2 / 3 readers: 66.1
    /// / 64.2, against 63.8 in 8 of one.
    ///
    /// Chunks of 96 KiB and more taper: the first is half a chunk, so that its flag comes
    /// early, and so are the last three or more, so that little is left to read once the last
    /// flag has come (`taper`). One H100, two ranks, graphs, 6 rounds alternated, medians
    /// (ranges), us, 2026-12-05: 768 KiB 51.00 (50.56-51.59) against 51.73 (50.01-53.02); 1
    /// MiB 64.52 (63.83-64.61) against 69.84 (64.50-75.86: some runs fell into a slow mode
    /// that the tapered cut did not show); 1.5 MiB 95.11 against 99.77; 2 MiB 123.50 against
    /// 125.31; 4 MiB 228.12 against 230.64; 8 MiB 441.58 against 444.24. At 512 KiB (64 KiB
    /// chunks) it was slower in each of the 6 rounds (37.91 against 37.40), so smaller chunks
    /// keep their even cut. With the tapered kernels of their own (`peer_oneshot_tapered_*`),
    /// 4 rounds ABBA against main: 1 MiB 63.81 (63.24-63.92) against 69.11 (63.98-74.48), 1.5
    /// MiB 93.15 against 99.21, 2 MiB 122.19 against 124.50, 4 MiB 226.06 against 229.66, 8
    /// MiB 438.87 against 442.70, 768 KiB 50.55 against 50.43.
    pub(crate) fn of(bytes: usize, most_blocks: u32) -> Option<Streamed> {
        const KIB: usize = 1 << 10;
        let most = most_blocks.clamp(2, MAX_BLOCKS);
        let parts = if bytes <= 384 * KIB { 4 } else { 8 };
        // A flag slot per chunk: at most MAX_BLOCKS of them.
        let chunk = (bytes / parts)
            .clamp(16 * KIB, 128 * KIB)
            .max(bytes.div_ceil(MAX_BLOCKS as usize))
            .next_multiple_of(16);
        let chunks = bytes.div_ceil(chunk).max(1) as u32;
        if chunks <= 3 {
            return None;
        }
        // Small chunks in parallel, a writer each; large ones by two writers in turn.
        let writers = if chunk >= 32 * KIB { 2 } else { chunks };
        let writers = writers.min(most / 2);
        // Four large chunks get three readers each up to 256 KiB (one of them polls), two
        // up to 384 KiB; eight chunks keep one each, since more readers then slowed them.
        let per_chunk = match chunks {
            4 if chunk >= 32 * KIB && bytes <= 256 * KIB => 3,
            4 if chunk >= 32 * KIB => 2,
            _ => 1,
        };
        let readers = (chunks * per_chunk).min(most - writers);
        // Eight or more chunks of 96 KiB and more, a reader each, taper (see above).
        if per_chunk == 1 && chunk >= 96 * KIB {
            let (small, big, tail) = taper(bytes, chunk);
            let chunks = 1 + big + tail;
            if chunks <= MAX_BLOCKS as usize {
                return Some(Streamed {
                    chunk,
                    writers,
                    readers: chunks.min((most - writers) as usize) as u32,
                    taper: Some((small, big as u32)),
                });
            }
        }
        Some(Streamed {
            chunk,
            writers,
            readers,
            taper: None,
        })
    }

    /// Vectors of the small chunks and the large chunks between them, as the kernel's
    /// `taper_vecs` and `taper_big` take them.
    pub(crate) fn taper_args(&self) -> (u32, u32) {
        self.taper
            .map_or((0, 0), |(small, big)| ((small / 16) as u32, big))
    }

    /// Where two ranks share one link (their GPU's), the tapered push's turns: on every
    /// other call a rank holds its writers back until the peer has flagged its chunk
    /// [`TURN_AFTER_CHUNK`] (the kernel's `late_chunk` is one more; 0: no turns).
    /// Meanwhile its readers take in the peer's first chunks, which then cross the link
    /// alone. From 1 MiB: at 768 KiB (chunks of 96 KiB) the turns lost 2% on an H200 as
    /// they gained 3% on an H100.
    pub(crate) fn late_chunk(&self, bytes: usize, world: usize, one_link: bool) -> u32 {
        match self.taper {
            Some((_, big))
                if world == 2
                    && one_link
                    && bytes >= TURNS_FROM
                    && TURN_AFTER_CHUNK < big as usize =>
            {
                TURN_AFTER_CHUNK as u32 + 1
            }
            _ => 0,
        }
    }

    /// Blocks of the launch.
    pub(crate) fn blocks(&self) -> u32 {
        self.writers + self.readers
    }
}

/// A tapered cut of `bytes` in chunks of `chunk` (see [`Streamed::of`]): (small, big, tail),
/// one chunk of `small` bytes (half a chunk), `big` chunks of `chunk` bytes, then `tail`
/// chunks of `small` bytes, the last one shorter where `bytes` ends within it. The tail
/// holds three small chunks at least.
fn taper(bytes: usize, chunk: usize) -> (usize, usize, usize) {
    let small = chunk / 2 / 16 * 16;
    let big = bytes.saturating_sub(4 * small) / chunk;
    let rest = bytes.saturating_sub(small + big * chunk);
    (small, big, rest.div_ceil(small))
}

/// Work items (16-byte vectors per thread) of an all-reduce of `count` elements.
pub(crate) fn all_reduce_work(
    algorithm: Algorithm,
    dtype: DType,
    count: usize,
    world: usize,
) -> usize {
    let nvec = count.div_ceil(16 / dtype.size());
    match algorithm {
        Algorithm::OneshotPull | Algorithm::OneshotPush | Algorithm::OneshotCopy => nvec,
        Algorithm::TwoshotPull | Algorithm::TwoshotPush => nvec.div_ceil(world.max(1)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_grids_use_the_device_or_few_blocks_on_host_memory() {
        assert_eq!(default_grid(132, 1, false), (MAX_BLOCKS, 1));
        assert_eq!(default_grid(132, 2, false), (36, 1));
        assert_eq!(default_grid(132, 8, false), (16, 1));
        assert_eq!(default_grid(0, 1, false), (1, 1));
        let (most, per_thread) = default_grid(132, 1, true);
        assert_eq!((most, per_thread), (8, 4));
        // 42 KB of bf16 (2688 vectors) through host memory: two blocks of 512 threads.
        assert_eq!(blocks(2688usize.div_ceil(per_thread), 512, most), 2);
    }

    #[test]
    fn two_ranks_on_one_link_take_turns_after_the_peers_first_chunks() {
        const KIB: usize = 1 << 10;
        let late = |bytes, world, one_link| {
            Streamed::of(bytes, 44)
                .unwrap()
                .late_chunk(bytes, world, one_link)
        };
        // From 1 MiB (64 KiB, then 128 KiB chunks): the later writer waits for the peer's
        // chunk TURN_AFTER_CHUNK, which ends 576 KiB in.
        let turn = TURN_AFTER_CHUNK as u32 + 1;
        for bytes in [1 << 20, 3 << 19, 2 << 20, 4 << 20, 8 << 20] {
            assert_eq!(late(bytes, 2, true), turn, "{bytes}");
        }
        // Below 1 MiB, a GPU per rank, more ranks, or chunks of one size: no turns.
        assert_eq!(late(768 * KIB, 2, true), 0);
        assert_eq!(late(1 << 20, 2, false), 0);
        assert_eq!(late(1 << 20, 3, true), 0);
        assert_eq!(late(512 * KIB, 2, true), 0);
    }

    #[test]
    fn streamed_pushes_cut_few_large_chunks_for_few_writers() {
        const KIB: usize = 1 << 10;
        let plan = |bytes| Streamed::of(bytes, 44).map(|s| (s.chunk, s.writers, s.readers));
        // Three chunks or fewer: one chunk over the grid.
        assert_eq!(plan(12 * KIB), None);
        assert_eq!(plan(48 * KIB), None);
        assert_eq!(plan(64 * KIB), Some((16 * KIB, 4, 4)));
        assert_eq!(plan(128 * KIB), Some((32 * KIB, 2, 12)));
        assert_eq!(plan(256 * KIB), Some((64 * KIB, 2, 12)));
        assert_eq!(plan(384 * KIB), Some((96 * KIB, 2, 8)));
        assert_eq!(plan(512 * KIB), Some((64 * KIB, 2, 8)));
        // Tapered from 96 KiB chunks: a small chunk, six whole ones, three small ones.
        assert_eq!(plan(768 * KIB), Some((96 * KIB, 2, 10)));
        let grouped = |bytes| Streamed::of(bytes, 44).unwrap().grouped(bytes);
        assert!(grouped(128 * KIB) && grouped(384 * KIB));
        assert!(!grouped(64 * KIB) && !grouped(512 * KIB) && !grouped(1 << 20));
        assert_eq!(plan(1 << 20), Some((128 * KIB, 2, 10)));
        let taper = |bytes| Streamed::of(bytes, 44).unwrap().taper;
        assert_eq!(taper(512 * KIB), None);
        assert_eq!(taper(384 * KIB), None, "two readers a chunk: grouped, even");
        assert_eq!(taper(768 * KIB), Some((48 * KIB, 6)));
        assert_eq!(taper(1 << 20), Some((64 * KIB, 6)));
        // At most one flag slot per chunk, and the blocks within the bound.
        let big = Streamed::of(64 << 20, 44).unwrap();
        assert_eq!(big.chunk, (64 << 20) / MAX_BLOCKS as usize);
        assert_eq!((big.writers, big.readers), (2, 42));
        let tight = Streamed::of(64 * KIB, 4).unwrap();
        assert_eq!((tight.writers, tight.readers), (2, 2));
        let tight = Streamed::of(256 * KIB, 8).unwrap();
        assert_eq!((tight.writers, tight.readers), (2, 6));
        assert!(
            !tight.grouped(256 * KIB),
            "six readers for four chunks: one a chunk"
        );
        assert_eq!(Streamed::of(1 << 20, 0).unwrap().blocks(), 2);
    }

    /// The kernel's chunks (`peer_tapered_start` and `peer_tapered_count`; k * part for the
    /// even cut), as `PeerArgs` carries a plan.
    fn kernel_chunks(plan: &Streamed, nvec: u64) -> Vec<(u64, u64)> {
        let cv = plan.chunk as u64 / 16;
        let (cs, big) = plan.taper_args();
        let (cs, big) = (cs as u64, big as u64);
        let start = |k: u64| match (cs, k) {
            (0, k) => k * cv,
            (_, 0) => 0,
            (_, k) if k <= big + 1 => cs + (k - 1) * cv,
            (_, k) => cs + big * cv + (k - 1 - big) * cs,
        };
        let count = if cs == 0 {
            nvec.div_ceil(cv)
        } else {
            let head = cs + big * cv;
            1 + big + nvec.saturating_sub(head).div_ceil(cs)
        };
        (0..count)
            .map(|k| (start(k), start(k + 1).min(nvec)))
            .collect()
    }

    #[test]
    fn tapered_chunks_cover_the_message_once_each_within_the_flag_slots() {
        const KIB: usize = 1 << 10;
        for bytes in [
            768 * KIB,
            (1 << 20) - 16,
            1 << 20,
            (1 << 20) + 16,
            (1 << 20) + 64 * KIB + 48,
            3 << 20,
            (8 << 20) + 16,
            15 << 20,
        ] {
            let plan = Streamed::of(bytes, 44).unwrap();
            let (small, big) = plan.taper.expect("tapered");
            let chunks = kernel_chunks(&plan, bytes as u64 / 16);
            assert!(
                chunks.len() <= MAX_BLOCKS as usize,
                "{bytes}: a flag slot a chunk"
            );
            assert_eq!(
                chunks[0],
                (0, small as u64 / 16),
                "{bytes}: a small first chunk"
            );
            let mut next = 0;
            for (i, &(from, to)) in chunks.iter().enumerate() {
                assert_eq!(from, next, "{bytes}: chunk {i} starts where the last ended");
                assert!(to > from, "{bytes}: chunk {i} is empty");
                next = to;
            }
            assert_eq!(
                next,
                bytes as u64 / 16,
                "{bytes}: the chunks end with the message"
            );
            let tail = &chunks[1 + big as usize..];
            assert!(tail.len() >= 3, "{bytes}: three small chunks at the end");
            assert!(tail.iter().all(|(f, t)| t - f <= small as u64 / 16));
        }
        // Too many chunks for the flag slots (from about 16 MiB): an even cut.
        for bytes in [16 << 20, 64 << 20] {
            let even = Streamed::of(bytes, 44).unwrap();
            assert_eq!(even.taper, None, "{bytes}");
            assert_eq!(
                kernel_chunks(&even, bytes as u64 / 16).len(),
                MAX_BLOCKS as usize
            );
        }
    }

    #[test]
    fn spread_grids_take_the_fewest_threads_that_fit_the_spread() {
        let most = |n: u32| move |_: u32| n;
        // 42 KB of bf16 (2688 vectors) on a device of its own: 21 blocks of 128 threads.
        assert_eq!(spread_grid(2688, 512, most(128), 128), (21, 128));
        // A spread of 36 blocks: 128 KiB in 32 blocks of 256 threads.
        assert_eq!(spread_grid(8192, 512, most(36), 36), (32, 256));
        // Eight ranks sharing an H200 (16 blocks each; 35 of 128 threads, 17 of 256 or 8 of
        // 512 start early): 42 KB in 11 blocks of 256 threads, 64 KiB in 16; 128 KiB is too
        // large for 16 x 256 and 8 x 512.
        let shared = |t| by_block_size([16, 16, 8], t);
        assert_eq!(spread_grid(2688, 512, shared, 16), (11, 256));
        assert_eq!(spread_grid(4096, 512, shared, 16), (16, 256));
        assert_eq!(spread_grid(8192, 512, shared, 16), (16, 512));
        assert_eq!(spread_grid(1, 512, shared, 16), (1, 128));
        // Where only 8 blocks of any size may start: 42 KB keeps 6 blocks of 512.
        assert_eq!(spread_grid(2688, 512, most(8), 16), (6, 512));
        // Beyond the spread: the most threads, up to the most blocks, as before.
        assert_eq!(spread_grid(65536, 512, most(36), 36), (36, 512));
        assert_eq!(spread_grid(1 << 20, 512, most(128), 128), (128, 512));
        // Configured blocks of fewer threads than the spread's least stay as configured.
        assert_eq!(spread_grid(2688, 64, most(128), 128), (42, 64));
        assert_eq!(spread_grid(2688, 384, most(4), 4), (4, 384));
    }

    #[test]
    fn fused_grids_cut_rows_into_parts_of_a_vector_per_thread() {
        let most = |n: u32| move |_: u32| n;
        // 42 KB of bf16 as 3 rows of 7168 (896 vectors each) on a device of its own: 7 parts
        // of 128 threads per row.
        assert_eq!(fused_grid(3, 896, 512, most(128), 128), (21, 128));
        // Eight ranks sharing an H200: 16 blocks of 128 or 256 threads, 8 of 512.
        let shared = |t| by_block_size([16, 16, 8], t);
        assert_eq!(fused_grid(3, 896, 512, shared, 16), (12, 256));
        // 64 rows of 8192: two parts of 512 threads per row, 128 blocks.
        assert_eq!(fused_grid(64, 1024, 512, most(128), 128), (128, 512));
        // A row of one part keeps the warps it needs.
        assert_eq!(fused_grid(1, 1, 512, most(128), 128), (1, 32));
        assert_eq!(fused_grid(5, 257, 512, most(128), 128), (15, 128));
        // Too many rows for a part each: a block per row, at most the most blocks, as before.
        assert_eq!(fused_grid(200, 640, 512, most(128), 128), (128, 512));
        assert_eq!(fused_grid(200, 640, 512, most(8), 16), (16, 512));
        assert_eq!(fused_grid(3, 896, 512, most(2), 2), (2, 512));
        assert_eq!(fused_grid(2, 4, 512, most(1), 1), (1, 32));
        // Configured blocks of 32 threads: no more parts per row than threads.
        assert_eq!(fused_grid(1, 2048, 32, most(128), 128), (1, 32));
        assert_eq!(fused_grid(1, 1024, 32, most(128), 128), (32, 32));
    }

    /// What the fused kernel assumes of its grid (`peer_rows`): either at most a block per
    /// row, or exactly `rows x parts` blocks whose parts cover a row with one vector per
    /// thread, no more parts than threads.
    #[test]
    fn fused_grids_are_what_the_kernel_derives_its_parts_from() {
        for rows in [1usize, 2, 3, 7, 64, 200, 1000] {
            for rvec in [1usize, 31, 32, 257, 896, 1024, 4096] {
                for (threads, most, max_blocks) in
                    [(512, 128, 128), (512, 16, 16), (256, 36, 36), (64, 8, 8)]
                {
                    let (blocks, t) = fused_grid(rows, rvec, threads, |_| most, max_blocks);
                    let case = format!("{rows} x {rvec}, {threads} threads, {most} blocks");
                    assert!(t <= threads && t % 32 == 0 && blocks >= 1, "{case}");
                    assert!(blocks <= max_blocks.max(most), "{case}");
                    let blocks = blocks as usize;
                    if blocks > rows {
                        let parts = blocks / rows;
                        assert_eq!(blocks, rows * parts, "{case}");
                        assert!(parts <= t as usize, "{case}");
                        assert!(parts * t as usize >= rvec, "{case}: a vector per thread");
                        assert!((parts - 1) * (t as usize) < rvec, "{case}: no empty part");
                    }
                }
            }
        }
    }

    #[test]
    fn grids_are_bounded_and_cover_small_messages_with_one_block() {
        let g = |a, count| blocks(all_reduce_work(a, DType::BF16, count, 8), 512, 16);
        assert_eq!(g(Algorithm::OneshotPull, 1), 1);
        assert_eq!(g(Algorithm::OneshotPull, 21504), 6); // 42 KB bf16: 2688 vectors
        assert_eq!(g(Algorithm::TwoshotPull, 21504), 1);
        assert_eq!(g(Algorithm::TwoshotPush, 32 << 20), 16);
        assert_eq!(blocks(1 << 30, 512, 1000), MAX_BLOCKS);
    }
}
