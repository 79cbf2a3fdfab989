//! The collectives of [`PeerComm`]: each checks its call and optionally agrees on it with
//! every rank, once, then enqueues one kernel of `kernels/peer_collectives.cu` per part of
//! the message that one launch holds (`chunks`), in order on the call's stream.

use comm_core::cuda::cudarc::driver::result;
use comm_core::cuda::stream::cu_stream;
use comm_core::cuda::{driver_error, raw_stream};
use comm_core::{BufferMut, BufferRef, CallDescriptor, RawStream, ReduceOp, Result};

use crate::algorithm::Algorithm;
use crate::chunks::{Cut, twoshot_part};
use crate::comm::PeerComm;
use crate::grid::{Streamed, all_reduce_work, blocks, by_block_size, spread_grid};
use crate::kernels::{PeerArgs, all_reduce_kernel, reduce_scatter_kernel, streamed_push_kernel};
use crate::layout::Layout;
use crate::scratch::Rows;
use crate::zero_copy::ZeroCopy;

/// How one all-reduce runs, decided by each rank and compared when validating.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Plan {
    algorithm: Algorithm,
    /// Zero-copy: where the input lies in a registered buffer.
    zero_copy: Option<ZeroCopy>,
}

impl Plan {
    /// Algorithm, zero-copy flag, input offset and buffer number: what the ranks compare
    /// besides the call (no allocation: this runs on every call).
    fn bytes(&self) -> [u8; 12] {
        let (zc, off, buffer) = self
            .zero_copy
            .map_or((0u8, 0u64, 0u16), |z| (1, z.offset, z.buffer));
        let mut out = [0u8; 12];
        out[0] = self.algorithm as u8;
        out[1] = zc;
        out[2..10].copy_from_slice(&off.to_le_bytes());
        out[10..].copy_from_slice(&buffer.to_le_bytes());
        out
    }
}

/// Whether an all-reduce's input and output (`bytes` each) share any byte: such a call
/// is in place to the algorithms, whatever views it was given.
fn shares_bytes(send: u64, recv: u64, bytes: usize) -> bool {
    let bytes = bytes as u64;
    bytes > 0 && send < recv + bytes && recv < send + bytes
}

/// Threads of the one block of a Lamport one-shot push over host memory with `work`
/// vectors, at most `threads`: a vector per thread in whole warps, but two warps at least
/// (warp 1 compares the calls while warp 0 polls). Fewer warps start, meet at the block's
/// barriers and end sooner. One H200, two ranks, graphs, medians of 3 (2026-12-04), by
/// threads per block 64 / 128 / 256 / 512: 8 B 3.89 / 3.93 / 4.01 / 4.08 us; 1 KiB (64
/// vectors) 4.88 / 4.87 / 4.72 / 5.01; a block too small for the message cost much more (4
/// KiB in 64 threads 10.9 us, in 128 8.6).
fn lamport_block(work: usize, threads: u32) -> u32 {
    let warps = work.div_ceil(32).max(2);
    (warps * 32).min(threads as usize) as u32
}

/// Threads of each block of a Lamport one-shot push over host memory between two ranks whose
/// message one block does not hold: a vector per thread, so that no thread polls two one
/// after another. One H200, two ranks, graphs, medians of 3 (2026-12-04), by threads per
/// block 512 / 256 / 128 (/ 64): 24 KiB 7.41 / 7.16 / 7.14; 42 KB 8.68 / 8.65 / 8.47, and
/// in another call 256 / 128 / 64: 8.59 / 8.52 / 8.51; 48 KiB 9.21 / 9.26 / 9.03; 64 KiB
/// 10.80 / 10.64 / 10.74 (256 / 128 / 64).
const PAIR_LAMPORT_THREADS: u32 = 128;

/// Threads of each block of a two-rank Lamport push over host memory whose message needs
/// more blocks of [`PAIR_LAMPORT_THREADS`] than stay resident beside the peer's (two ranks
/// sharing one GPU, above 88 KiB): still a vector per thread, in blocks twice as large. One
/// H200, two ranks sharing it, graphs, medians of 4 (2026-12-04), against the flags: 96 KiB
/// 12.96 / 13.51 us, 112 KiB 14.07 / 14.74, 128 KiB 15.62 / 14.77.
const PAIR_LAMPORT_WIDE_THREADS: u32 = 256;

/// The most blocks of a two-rank Lamport push over host memory, and their most threads: as
/// many blocks as stay resident beside the peer's (`resident`), of
/// [`PAIR_LAMPORT_WIDE_THREADS`] or the configured block size where smaller. Their product
/// is the most vectors it takes, one a thread.
fn pair_lamport_bound(resident: u32, threads: u32) -> (u32, u32) {
    (resident, PAIR_LAMPORT_WIDE_THREADS.min(threads))
}

/// The grid of a Lamport one-shot push over host memory of `work` vectors among `world`
/// ranks, given the usual grid of that work (its block size the configured one) and
/// [`pair_lamport_bound`]: one block holding every vector in the warps it needs
/// ([`lamport_block`]); else, between two ranks, a vector per thread within that bound, in
/// blocks of [`PAIR_LAMPORT_THREADS`] where as many stay resident, else of the bound's
/// threads; else the usual grid.
fn host_lamport_grid(work: usize, world: usize, pair: (u32, u32), usual: (u32, u32)) -> (u32, u32) {
    let (most, threads) = pair;
    match usual {
        (1, t) if work <= t as usize => (1, lamport_block(work, t)),
        _ if world == 2 && work <= (most * threads) as usize => {
            let narrow = PAIR_LAMPORT_THREADS.min(threads);
            let t = if work <= (most * narrow) as usize {
                narrow
            } else {
                threads
            };
            (blocks(work, t, most), t)
        }
        (1, t) => (1, lamport_block(work, t)),
        grid => grid,
    }
}

/// Over host memory, one-shot push messages of at least this many bytes go as data and then
/// flags rather than by Lamport mailboxes, at more than two ranks: a flag per block
/// (`peer_oneshot_flagged`), or, from four chunks of 16 KiB or more, a flag per chunk
/// (`peer_oneshot_streamed`). One H200, two ranks, graphs (2026-12-03): Lamport (four
/// vectors a thread) 6.3 us at 8 KiB and 9.0 at 12 KiB, the flag 7.5 and 8.1; at 4 and 8
/// ranks a vector a thread in blocks of 128 (2026-12-04) lost too: 42 KB 29.4 / 25.6 and
/// 134.4 / 95.3 us.
pub const FLAGGED_FROM: usize = 12 << 10;

/// [`FLAGGED_FROM`] between two ranks, whose Lamport push takes a vector per thread
/// (in blocks of 128 threads, or of 256 where those would not all stay resident). One H200, two ranks, graphs, medians of 3 (2026-12-04),
/// Lamport against the flags: 12 KiB 6.37 / 7.12 us, 16 KiB 6.66 / 7.42, 32 KiB 7.66 /
/// 8.60, 42 KB 8.47 / 9.35, 64 KiB 10.64 / 11.28 (streamed); since a large reset of the
/// mailboxes waits for the polls (medians of 4, the two ranks sharing the GPU, so from 96
/// KiB in blocks of 256), 96 KiB 12.96 / 13.51, 112 KiB 14.07 / 14.74, 128 KiB 15.62 / 14.77.
pub const PAIR_FLAGGED_FROM: usize = 120 << 10;

/// The least bytes a one-shot push over host memory among `world` ranks sends as data and
/// then flags (below, by Lamport mailboxes), where every block of a two-rank Lamport push
/// stays resident.
pub fn flagged_from(world: usize) -> usize {
    if world == 2 {
        PAIR_FLAGGED_FROM
    } else {
        FLAGGED_FROM
    }
}

/// [`flagged_from`] where a two-rank Lamport push can give at most the vectors of `pair`
/// ([`pair_lamport_bound`]) a thread each: of more it would poll several a thread, and then
/// the flags win.
fn flags_from(world: usize, pair: (u32, u32)) -> usize {
    let vectors = pair.0 as usize * pair.1 as usize;
    flagged_from(world).min((vectors * 16).max(FLAGGED_FROM))
}

/// Whether a one-shot push launch of `bytes` over host memory goes as data and then a flag
/// rather than by Lamport mailboxes: from [`flags_from`] bytes, and wherever the mailboxes
/// (`lcap` bytes a sender) cannot hold it, as long as every peer's copy fits a staging half
/// (a launch never holds more than one of the two: [`Layout::oneshot_push_bytes`]).
///
/// [`Layout::oneshot_push_bytes`]: crate::layout::Layout::oneshot_push_bytes
fn host_push_flagged(bytes: usize, world: usize, pair: (u32, u32), layout: &Layout) -> bool {
    (bytes >= flags_from(world, pair) || bytes > layout.lcap)
        && bytes <= layout.flagged_push_bytes()
}

impl PeerComm {
    /// Whether a one-shot push launch of `bytes` goes as data and then a flag: over host
    /// memory, as [`host_push_flagged`] says.
    fn pushes_flagged(&self, bytes: usize) -> bool {
        self.group.host_memory()
            && host_push_flagged(
                bytes,
                self.group.world_size(),
                self.pair_lamport_bound(),
                &self.layout,
            )
    }

    /// One vector per thread, at most `max_blocks` blocks: the grid of a one-shot push by
    /// data and a flag, where only block 0 polls host memory and more blocks read the
    /// message sooner. One H200, two ranks, graphs (2026-12-04), against 4 vectors per
    /// thread: 16 KiB 7.45 us / 7.87, 32 KiB 8.67 / 9.64, 42 KB 9.40 / 9.69, 48 KiB 9.78 /
    /// 10.28.
    fn grid_of_vectors(&self, work: usize) -> (u32, u32) {
        (
            blocks(work, self.config.threads, self.max_blocks),
            self.config.threads,
        )
    }

    /// [`pair_lamport_bound`] of this communicator: the streamed push's resident blocks.
    fn pair_lamport_bound(&self) -> (u32, u32) {
        pair_lamport_bound(self.stream_blocks, self.config.threads)
    }

    fn grid(&self, work: usize) -> (u32, u32) {
        self.grid_of_vectors(work.div_ceil(self.items_per_thread))
    }

    /// An all-reduce's grid (of a launch not pushed as data and flags): a one-shot's spreads
    /// a small message over more SMs; over host memory, a one-shot push by Lamport mailboxes
    /// whose one block holds every vector takes only the warps that hold them
    /// ([`lamport_block`]), and between two ranks a larger one takes a vector per thread in
    /// as many blocks as stay resident beside the peer's ([`host_lamport_grid`]).
    fn all_reduce_grid(&self, algorithm: Algorithm, work: usize) -> (u32, u32) {
        match (algorithm, self.spread_blocks) {
            (Algorithm::OneshotPush | Algorithm::OneshotPull, Some(spread)) => {
                let most = |threads| by_block_size(spread, threads);
                spread_grid(work, self.config.threads, most, self.max_blocks)
            }
            (Algorithm::OneshotPush, None) if self.group.host_memory() => host_lamport_grid(
                work,
                self.group.world_size(),
                self.pair_lamport_bound(),
                self.grid(work),
            ),
            _ => self.grid(work),
        }
    }

    fn plan(&self, bytes: usize, send: u64, in_place: bool) -> Plan {
        let algorithm = self.algorithm_for(bytes);
        // An input in a registered buffer is read where it lies by the pull algorithms
        // (zero-copy): with no algorithm chosen, it gets the pull variant of the default.
        let candidate = match self.algorithm.get() {
            None => algorithm.pull(),
            Some(_) => algorithm,
        };
        let reads_in_place = match candidate {
            // One-shot pull in place would overwrite an input that peers are still reading.
            Algorithm::OneshotPull => !in_place,
            Algorithm::TwoshotPull => true,
            Algorithm::OneshotPush | Algorithm::TwoshotPush | Algorithm::OneshotCopy => false,
        };
        let zero_copy = reads_in_place
            .then(|| self.registry.find(send, bytes))
            .flatten();
        Plan {
            algorithm: if zero_copy.is_some() {
                candidate
            } else {
                algorithm
            },
            zero_copy,
        }
    }

    /// One all-reduce; `send: None` is in place.
    pub fn reduce(
        &self,
        send: Option<BufferRef<'_>>,
        recv: BufferMut<'_>,
        op: ReduceOp,
    ) -> Result<()> {
        self.group.live()?;
        let (described, send_addr, locations) = match &send {
            Some(s) => (
                CallDescriptor::all_reduce(s, &recv, op),
                s.addr() as u64,
                [s.location(), recv.location()],
            ),
            None => (
                CallDescriptor::all_reduce_in_place(&recv, op),
                recv.addr() as u64,
                [recv.location(), recv.location()],
            ),
        };
        let in_place = send.is_none() || shares_bytes(send_addr, recv.addr() as u64, recv.bytes());
        let plan = self.plan(recv.bytes(), send_addr, in_place);
        let mine = self
            .checked(described, &locations)
            .and_then(|(call, stream)| {
                if plan.algorithm == Algorithm::OneshotCopy {
                    self.admit_copies(stream)?;
                }
                Ok((call, stream))
            });
        let agreed = self.agree(mine, &plan.bytes(), &locations)?;
        self.after_agreement(|| {
            let (call, stream) = (agreed.call, agreed.stream);
            let bytes = call.send_bytes();
            if bytes == 0 {
                return self.agree_only(agreed.words, stream);
            }
            let recv_addr = recv.addr() as u64;
            let world = self.group.world_size();
            if world == 1 {
                if send_addr != recv_addr {
                    self.context().bind_to_thread().map_err(driver_error)?;
                    // SAFETY: both views hold `send_bytes` bytes of this device (the view
                    // constructors' contracts); the copy is ordered on their stream.
                    unsafe {
                        result::memcpy_dtod_async(recv_addr, send_addr, bytes, cu_stream(stream))
                    }
                    .map_err(driver_error)?;
                }
                return Ok(());
            }
            if plan.algorithm == Algorithm::OneshotCopy {
                return self.reduce_by_copies(&agreed, send_addr, recv_addr, bytes);
            }
            let op = call.op.unwrap_or(ReduceOp::Sum);
            let kernel =
                all_reduce_kernel(plan.algorithm, call.dtype, op, self.group.same_device());
            let cut = Cut::all_reduce(
                &self.layout,
                plan.algorithm,
                plan.zero_copy.is_some(),
                self.group.host_memory(),
            );
            // Two-shot pull moves a launch part after part; the grid is that of one part.
            let part = match plan.algorithm {
                Algorithm::TwoshotPull => twoshot_part(&self.layout, plan.zero_copy.is_some()),
                _ => bytes,
            };
            for chunk in cut.chunks(bytes) {
                let at = chunk.offset as u64;
                let count = chunk.bytes / call.dtype.size();
                let args = PeerArgs {
                    inputs: plan.zero_copy.map_or(0, |z| z.table),
                    in_off: plan.zero_copy.map_or(0, |z| z.offset + at),
                    part: part as u64,
                    ..self.io_args(&agreed, send_addr + at, recv_addr + at, count as u64)
                };
                let flagged =
                    plan.algorithm == Algorithm::OneshotPush && self.pushes_flagged(chunk.bytes);
                let streamed = if flagged {
                    Streamed::of(chunk.bytes, self.stream_blocks)
                } else {
                    None
                };
                let (kernel, grid, args) = match streamed {
                    // Chunk after chunk, each with its flag, read while later ones are written.
                    Some(streamed) => {
                        let (taper_vecs, taper_big) = streamed.taper_args();
                        (
                            streamed_push_kernel(call.dtype, op, &streamed, chunk.bytes),
                            (streamed.blocks(), self.config.threads),
                            PeerArgs {
                                part: streamed.chunk as u64,
                                writers: streamed.writers,
                                taper_vecs,
                                taper_big,
                                late_chunk: streamed.late_chunk(
                                    chunk.bytes,
                                    world,
                                    self.group.sharing() > 1,
                                ),
                                ..args
                            },
                        )
                    }
                    None => {
                        let work = all_reduce_work(
                            plan.algorithm,
                            call.dtype,
                            count.min(part / call.dtype.size()),
                            world,
                        );
                        // Data then a flag in one chunk over the grid: every block writes and
                        // reads, a vector per thread (only block 0 polls host memory).
                        let grid = if flagged {
                            self.grid_of_vectors(work)
                        } else {
                            self.all_reduce_grid(plan.algorithm, work)
                        };
                        let writers = if flagged { grid.0 } else { 0 };
                        (kernel, grid, PeerArgs { writers, ..args })
                    }
                };
                self.group.launch(kernel, grid, stream, &args)?;
            }
            Ok(())
        })
    }

    /// Every rank's `send` (bytes) into its place in `recv`.
    pub fn gather(&self, send: BufferRef<'_>, recv: BufferMut<'_>) -> Result<()> {
        self.group.live()?;
        let world = self.group.world_size();
        let locations = [send.location(), recv.location()];
        let mine = self.checked(CallDescriptor::all_gather(&send, &recv, world), &locations);
        let agreed = self.agree(mine, &[], &locations)?;
        self.after_agreement(|| {
            let (call, stream) = (agreed.call, agreed.stream);
            let bytes = call.send_bytes();
            if bytes == 0 {
                return self.agree_only(agreed.words, stream);
            }
            let (send, recv) = (send.addr() as u64, recv.addr() as u64);
            let scratch = self.scratch.addr();
            let cut = Cut::all_gather(&self.layout, bytes);
            for part in cut.chunks(bytes) {
                let at = part.offset as u64;
                let output = if cut.via_scratch { scratch } else { recv + at };
                let args = self.io_args(&agreed, send + at, output, part.bytes as u64);
                let grid = self.grid(part.bytes.div_ceil(16));
                self.group.launch("peer_all_gather", grid, stream, &args)?;
                if cut.via_scratch {
                    let rows = Rows {
                        dst: recv + at,
                        dst_pitch: bytes,
                        src: scratch,
                        src_pitch: part.bytes,
                        width: part.bytes,
                        rows: world,
                    };
                    rows.copy(self.context(), stream)?;
                }
            }
            Ok(())
        })
    }

    /// Slice `rank` of the reduction of every rank's `send` into `recv`.
    pub fn scatter_reduced(
        &self,
        send: BufferRef<'_>,
        recv: BufferMut<'_>,
        op: ReduceOp,
    ) -> Result<()> {
        self.group.live()?;
        let world = self.group.world_size();
        let locations = [send.location(), recv.location()];
        let mine = self.checked(
            CallDescriptor::reduce_scatter(&send, &recv, op, world),
            &locations,
        );
        let agreed = self.agree(mine, &[], &locations)?;
        self.after_agreement(|| {
            let (call, stream) = (agreed.call, agreed.stream);
            let size = call.dtype.size();
            let bytes = call.count as usize / world * size;
            if bytes == 0 {
                return self.agree_only(agreed.words, stream);
            }
            let (send, recv) = (send.addr() as u64, recv.addr() as u64);
            let scratch = self.scratch.addr();
            let kernel = reduce_scatter_kernel(call.dtype, op);
            let cut = Cut::reduce_scatter(&self.layout, bytes);
            for part in cut.chunks(bytes) {
                let at = part.offset as u64;
                let input = if cut.via_scratch {
                    let rows = Rows {
                        dst: scratch,
                        dst_pitch: part.bytes,
                        src: send + at,
                        src_pitch: bytes,
                        width: part.bytes,
                        rows: world,
                    };
                    rows.copy(self.context(), stream)?;
                    scratch
                } else {
                    send + at
                };
                let count = part.bytes / size;
                let args = self.io_args(&agreed, input, recv + at, count as u64);
                let grid = self.grid(count.div_ceil(16 / size));
                self.group.launch(kernel, grid, stream, &args)?;
            }
            Ok(())
        })
    }

    /// Rank `root`'s `buf` into every rank's `buf`.
    pub fn bcast(&self, buf: BufferMut<'_>, root: usize) -> Result<()> {
        self.group.live()?;
        let world = self.group.world_size();
        let locations = [buf.location()];
        let mine = self.checked(CallDescriptor::broadcast(&buf, root, world), &locations);
        let agreed = self.agree(mine, &[], &locations)?;
        self.after_agreement(|| {
            let (call, stream) = (agreed.call, agreed.stream);
            let bytes = call.send_bytes();
            if bytes == 0 || world == 1 {
                return self.agree_only(agreed.words, stream);
            }
            let addr = buf.addr() as u64;
            for part in Cut::broadcast(&self.layout).chunks(bytes) {
                let at = addr + part.offset as u64;
                let args = PeerArgs {
                    root: root as u32,
                    ..self.io_args(&agreed, at, at, part.bytes as u64)
                };
                let grid = self.grid(part.bytes.div_ceil(16));
                self.group.launch("peer_broadcast", grid, stream, &args)?;
            }
            Ok(())
        })
    }

    /// A device barrier of every rank (signals on the communicator's own channel, apart
    /// from the user's), waited for here ([`crate::PeerGroup::barrier_and_wait`]).
    pub fn device_barrier(&self) -> Result<()> {
        let stream: RawStream = raw_stream(&self.barrier_stream);
        self.group.barrier_and_wait(stream)
    }
}

#[cfg(test)]
mod tests {
    use super::{
        FLAGGED_FROM, PAIR_FLAGGED_FROM, PAIR_LAMPORT_THREADS, flags_from, host_lamport_grid,
        host_push_flagged, lamport_block, pair_lamport_bound,
    };
    use crate::algorithm::Algorithm;
    use crate::chunks::Cut;
    use crate::layout::Layout;

    #[test]
    fn views_sharing_bytes_are_in_place() {
        use super::shares_bytes;
        assert!(shares_bytes(0x1000, 0x1000, 64));
        assert!(shares_bytes(0x1000, 0x103e, 64));
        assert!(shares_bytes(0x103e, 0x1000, 64));
        assert!(!shares_bytes(0x1000, 0x1040, 64));
        assert!(!shares_bytes(0x1040, 0x1000, 64));
        assert!(!shares_bytes(0x1000, 0x1000, 0));
    }

    #[test]
    fn plans_name_the_registered_buffer() {
        use super::{Plan, ZeroCopy};
        let plan = |buffer| Plan {
            algorithm: Algorithm::OneshotPull,
            zero_copy: Some(ZeroCopy {
                table: 0xdead_0000 + u64::from(buffer),
                offset: 4096,
                buffer,
            }),
        };
        // Tables are this rank's addresses and are not compared; buffers and offsets are.
        assert_ne!(plan(0).bytes(), plan(1).bytes());
        let staged = Plan {
            algorithm: Algorithm::OneshotPull,
            zero_copy: None,
        };
        assert_ne!(plan(0).bytes(), staged.bytes());
        assert_eq!(staged.bytes()[1..], [0; 11]);
    }

    #[test]
    fn a_lamport_block_takes_the_warps_its_vectors_need_but_two_at_least() {
        assert_eq!(lamport_block(1, 512), 64);
        assert_eq!(lamport_block(64, 512), 64);
        assert_eq!(lamport_block(65, 512), 96);
        assert_eq!(lamport_block(256, 512), 256);
        assert_eq!(lamport_block(768, 512), 512);
        // A configured block size stays the bound.
        assert_eq!(lamport_block(1, 32), 32);
        assert_eq!(lamport_block(200, 128), 128);
    }

    #[test]
    fn a_lamport_push_between_two_ranks_takes_a_vector_per_thread() {
        // Work, world, resident blocks, the usual grid (its block size the configured one).
        let grid = |work, world, resident, usual: (u32, u32)| {
            host_lamport_grid(work, world, pair_lamport_bound(resident, usual.1), usual)
        };
        // 8 KiB of bf16 (512 vectors): one block of 512 threads, as at any world.
        assert_eq!(grid(512, 2, 44, (1, 512)), (1, 512));
        assert_eq!(grid(512, 4, 44, (1, 512)), (1, 512));
        // 42 KB (2688 vectors): 21 blocks of 128 between two ranks; more ranks keep the
        // usual grid (two blocks of 512, four vectors a thread).
        assert_eq!(PAIR_LAMPORT_THREADS, 128);
        assert_eq!(grid(2688, 2, 44, (2, 512)), (21, 128));
        assert_eq!(grid(2688, 4, 44, (2, 512)), (2, 512));
        // 12 KiB (768 vectors): six blocks between two, one block of 512 at four ranks.
        assert_eq!(grid(768, 2, 44, (1, 512)), (6, 128));
        assert_eq!(grid(768, 4, 44, (1, 512)), (1, 512));
        // 96 KiB (6144 vectors): blocks of 128 where 48 stay resident, else of 256.
        assert_eq!(grid(6144, 2, 128, (3, 512)), (48, 128));
        assert_eq!(grid(6144, 2, 44, (3, 512)), (24, 256));
        // Too many blocks of 256 to stay resident: the usual grid.
        assert_eq!(grid(12288, 2, 44, (6, 512)), (6, 512));
        // A configured block smaller than 128 threads stays the bound.
        assert_eq!(grid(2688, 2, 44, (42, 64)), (42, 64));
    }

    #[test]
    fn two_ranks_push_by_lamport_while_a_vector_per_thread_stays_resident() {
        // Separate GPUs (128 blocks of 128 threads): up to the measured crossing.
        assert_eq!(
            flags_from(2, pair_lamport_bound(128, 512)),
            PAIR_FLAGGED_FROM
        );
        // Two ranks sharing a GPU (44 resident blocks of up to 256 threads): 11264 vectors,
        // beyond the crossing.
        assert_eq!(
            flags_from(2, pair_lamport_bound(44, 512)),
            PAIR_FLAGGED_FROM
        );
        // Fewer resident blocks: 20 of 256 threads, 80 KiB.
        assert_eq!(flags_from(2, pair_lamport_bound(20, 512)), 80 << 10);
        // Never below where the flags start at more ranks.
        assert_eq!(flags_from(2, pair_lamport_bound(1, 4)), FLAGGED_FROM);
        assert_eq!(flags_from(4, pair_lamport_bound(128, 512)), FLAGGED_FROM);
        assert_eq!(flags_from(8, pair_lamport_bound(44, 512)), FLAGGED_FROM);
    }

    #[test]
    fn a_host_push_goes_by_lamport_only_where_the_mailboxes_hold_it() {
        // Mailboxes of the default 1 MiB down to a few KiB, smaller than where flags start.
        for world in [2, 3, 4, 8] {
            for lamport in [256, 4 << 10, 8 << 10, 64 << 10, 100 << 10, 1 << 20] {
                let layout = Layout::new(world, 4 << 20, lamport);
                let cut = Cut::all_reduce(&layout, Algorithm::OneshotPush, false, true);
                for resident in [1, 20, 44, 128] {
                    let pair = pair_lamport_bound(resident, 512);
                    for bytes in (16..=cut.limit).step_by(16 * 97).chain([cut.limit]) {
                        let flagged = host_push_flagged(bytes, world, pair, &layout);
                        let what = format!("world {world}, lcap {}, {bytes} bytes", layout.lcap);
                        if flagged {
                            assert!(bytes <= layout.flagged_push_bytes(), "{what}");
                        } else {
                            assert!(bytes <= layout.lcap, "{what}");
                        }
                    }
                }
            }
        }
        // The default mailboxes hold every message below where the flags start.
        let layout = Layout::new(2, 8 << 20, 1 << 20);
        let pair = pair_lamport_bound(44, 512);
        assert!(!host_push_flagged(PAIR_FLAGGED_FROM - 16, 2, pair, &layout));
        assert!(host_push_flagged(PAIR_FLAGGED_FROM, 2, pair, &layout));
        // Mailboxes of 64 KiB: a 100 KiB push goes by flags, though the flags start later.
        let small = Layout::new(2, 8 << 20, 64 << 10);
        assert!(!host_push_flagged(64 << 10, 2, pair, &small));
        assert!(host_push_flagged(100 << 10, 2, pair, &small));
    }
}
