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
/// 2 x H200 (BENCHMARKS.md, the grid step): one-shot push over NVLink carries ~160 GB/s with
/// 36 blocks and ~240 GB/s with 128; through host memory 42 KB takes 20.7 us with 2 blocks
/// and 33.9 us with 8.
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
    let fits = |t: u32| work.div_ceil(t as usize) <= spread(t) as usize;
    let mut t = BLOCK_SIZES[0].min(threads).max(1);
    while t < threads && !fits(t) {
        t = (t * 2).min(threads);
    }
    if fits(t) {
        (blocks(work, t, spread(t)), t)
    } else {
        (blocks(work, threads, max_blocks), threads)
    }
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
    fn grids_are_bounded_and_cover_small_messages_with_one_block() {
        let g = |a, count| blocks(all_reduce_work(a, DType::BF16, count, 8), 512, 16);
        assert_eq!(g(Algorithm::OneshotPull, 1), 1);
        assert_eq!(g(Algorithm::OneshotPull, 21504), 6); // 42 KB bf16: 2688 vectors
        assert_eq!(g(Algorithm::TwoshotPull, 21504), 1);
        assert_eq!(g(Algorithm::TwoshotPush, 32 << 20), 16);
        assert_eq!(blocks(1 << 30, 512, 1000), MAX_BLOCKS);
    }
}
