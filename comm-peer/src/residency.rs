//! How many blocks of the kernels a device holds at once, and which launches may start
//! early (programmatic dependent launch) where ranks share a device: a kernel started early
//! holds room while it waits, and a peer's kernel that this rank's waits for must still find
//! some.

use std::cell::Cell;

use comm_core::cuda::cudarc::driver::{CudaFunction, result};
use comm_core::cuda::driver_error;
use comm_core::{RawStream, Result};

use crate::grid::{BLOCK_SIZES, by_block_size};

/// Which launches may start while the previous kernel of their stream finishes
/// (programmatic stream serialization, sm_90+; every kernel waits for that kernel in its
/// prologue before it reads anything).
#[derive(Debug)]
pub(crate) enum Overlap {
    /// None: the device predates sm_90.
    Never,
    /// Every launch: this rank is the only one on its device.
    Always,
    /// `sharing` ranks share the device. A kernel started early stays resident while it
    /// waits, and holds room that a peer's kernel, which this rank's current one waits for,
    /// may need. So a launch starts early only when it and the kernel it would overlap are
    /// both small (see [`Residency::early_bound`]): `last` is this rank's previous launch
    /// (stream, blocks, threads per block), and after a launch on another stream the kernel
    /// before this one on its own stream is not known, so it does not start early.
    Bounded {
        residency: Residency,
        sharing: usize,
        last: Cell<Option<(RawStream, u32, u32)>>,
    },
}

impl Overlap {
    /// Every launch on a device of compute capability `major` (programmatic dependent launch
    /// needs sm_90).
    pub(crate) fn for_capability(major: i32) -> Self {
        if major >= 9 {
            Overlap::Always
        } else {
            Overlap::Never
        }
    }

    /// The same where `sharing` ranks share the device: only launches small enough.
    pub(crate) fn shared_by(self, residency: Residency, sharing: usize) -> Self {
        match self {
            Overlap::Never => Overlap::Never,
            _ if sharing <= 1 => self,
            _ => Overlap::Bounded {
                residency,
                sharing,
                last: Cell::new(None),
            },
        }
    }

    /// Whether the next launch, of `blocks` blocks of `threads` threads on `stream`, may
    /// start early (it is noted as the previous launch of the next question).
    pub(crate) fn admits(&self, stream: RawStream, blocks: u32, threads: u32) -> bool {
        match self {
            Overlap::Never => false,
            Overlap::Always => true,
            Overlap::Bounded {
                residency,
                sharing,
                last,
            } => {
                let Some((last_stream, last_blocks, last_threads)) =
                    last.replace(Some((stream, blocks, threads)))
                else {
                    return false;
                };
                let within = |most: u32| blocks <= most && last_blocks <= most;
                last_stream == stream
                    && (within(residency.whole_sm_bound(*sharing))
                        || (threads == last_threads
                            && within(residency.early_bound(threads, *sharing))))
            }
        }
    }
}

/// How many blocks of the module's kernels a device holds at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Residency {
    /// The device's multiprocessors. Every kernel fits one block of up to 512 threads on
    /// one of them.
    pub(crate) sms: u32,
    /// For each of [`BLOCK_SIZES`]: blocks of that many threads, of any kernels of the module
    /// mixed, that one SM holds at once. That is the fewest any one kernel fits alone: each
    /// limit of an SM (registers, warps, shared memory, blocks) is a sum over its blocks, so
    /// blocks that each fit n times alone fit n together.
    pub(crate) per_sm: [u32; 3],
}

impl Residency {
    /// Asks the driver how many blocks of each of `functions` one of the `sms`
    /// multiprocessors of their device holds, at each of [`BLOCK_SIZES`].
    pub(crate) fn of<'a>(
        sms: u32,
        functions: impl IntoIterator<Item = &'a CudaFunction>,
    ) -> Result<Residency> {
        let mut per_sm = [u32::MAX; 3];
        for f in functions {
            for (most, threads) in per_sm.iter_mut().zip(BLOCK_SIZES) {
                // SAFETY: a function of a loaded module; no dynamic shared memory (none of
                // the kernels takes any).
                let fit = unsafe {
                    result::occupancy::max_active_block_per_multiprocessor(
                        f.cu_function(),
                        threads as i32,
                        0,
                    )
                }
                .map_err(driver_error)?;
                *most = (*most).min(fit.max(0) as u32);
            }
        }
        Ok(Residency {
            sms: sms.max(1),
            per_sm: per_sm.map(|n| n.max(1)),
        })
    }

    /// Bytes of [`Self::to_bytes`].
    pub(crate) const BYTES: usize = 16;

    /// The least of each figure of two devices' residencies (ranks must agree on grids).
    pub(crate) fn min(self, other: Residency) -> Residency {
        let mut per_sm = self.per_sm;
        for (a, b) in per_sm.iter_mut().zip(other.per_sm) {
            *a = (*a).min(b);
        }
        Residency {
            sms: self.sms.min(other.sms),
            per_sm,
        }
    }

    pub(crate) fn to_bytes(self) -> [u8; Self::BYTES] {
        let mut out = [0u8; Self::BYTES];
        for (chunk, v) in out
            .chunks_exact_mut(4)
            .zip(std::iter::once(self.sms).chain(self.per_sm))
        {
            chunk.copy_from_slice(&v.to_le_bytes());
        }
        out
    }

    pub(crate) fn from_bytes(bytes: &[u8; Self::BYTES]) -> Residency {
        let word = |i: usize| u32::from_le_bytes(bytes[4 * i..4 * i + 4].try_into().unwrap());
        Residency {
            sms: word(0),
            per_sm: [word(1), word(2), word(3)],
        }
    }

    /// Blocks of `threads` threads (of any kernels mixed) the device holds at once.
    pub(crate) fn blocks(&self, threads: u32) -> u32 {
        by_block_size(self.per_sm, threads)
            .max(1)
            .saturating_mul(self.sms)
    }

    /// The largest grid whose launches may start early where `sharing` ranks share the
    /// device, counting each block as a whole SM: it holds whatever the launches around it
    /// are ([`overlap_bound`]).
    pub(crate) fn whole_sm_bound(&self, sharing: usize) -> u32 {
        overlap_bound(self.sms, sharing)
    }

    /// The largest grid of `threads` per block whose launches may start early where
    /// `sharing` ranks share the device, after a launch of as many threads per block.
    ///
    /// Suppose a rank's kernel k (at most `b` blocks) is not resident yet. The kernels of
    /// the other `sharing - 1` ranks that wait for it are their kernels k and, started
    /// early, k + 1 (a kernel lets the next start only after its own wait for the one
    /// before): `2 b` blocks each, all of this size, since every rank makes the same calls.
    /// Older kernels wait only for older ones and finish. While no SM takes one more block,
    /// each holds [`Self::blocks`]` / sms` of them; so kernel k finds room when
    /// `(sharing - 1) 2 b + b <= blocks`. Where a launch and the one before differ in size,
    /// only [`Self::whole_sm_bound`] holds, since blocks of one size can sit on every SM and
    /// leave no room for a larger one.
    pub(crate) fn early_bound(&self, threads: u32, sharing: usize) -> u32 {
        overlap_bound(self.blocks(threads), sharing)
    }
}

/// The largest grid whose launches may start early where `sharing` ranks share a device
/// that holds `slots` blocks at once: `(sharing - 1) 2 b + b <= slots` (see
/// [`Residency::early_bound`]). With each block counted as an SM, `slots` is the SMs.
pub(crate) fn overlap_bound(slots: u32, sharing: usize) -> u32 {
    let sharing = u32::try_from(sharing).unwrap_or(u32::MAX).max(1);
    slots / sharing.saturating_mul(2).saturating_sub(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    const STREAM: RawStream = RawStream(0x1000);

    /// An H200's 132 SMs, where each kernel fits 4 blocks of 128 threads, 2 of 256, 1 of 512.
    const H200: Residency = Residency {
        sms: 132,
        per_sm: [4, 2, 1],
    };

    #[test]
    fn ranks_sharing_a_device_start_only_small_launches_early() {
        // 132 SMs: 8 ranks may each hold two launches of 8 blocks and still leave room
        // for the one that is not resident yet (7 x 16 + 8 = 120); 2 ranks, 44.
        assert_eq!(overlap_bound(132, 8), 8);
        assert_eq!(overlap_bound(132, 2), 44);
        assert_eq!(overlap_bound(132, 1), 132);
        assert_eq!(H200.whole_sm_bound(8), 8);
        let bounded = Overlap::Bounded {
            residency: H200,
            sharing: 8,
            last: Cell::new(None),
        };
        // Not the first launch (whatever ran before is unknown), then small after small,
        // never a large one, nor a small one right after a large one.
        let admitted: Vec<bool> = [6, 6, 6, 16, 6, 6]
            .map(|b| bounded.admits(STREAM, b, 512))
            .to_vec();
        assert_eq!(admitted, [false, true, true, false, false, true]);
        // After a launch on another stream, the kernel this one would overlap is unknown.
        let other = RawStream(STREAM.0 + 1);
        let admitted: Vec<bool> = [(other, 1), (STREAM, 6), (STREAM, 6)]
            .map(|(s, b)| bounded.admits(s, b, 512))
            .to_vec();
        assert_eq!(admitted, [false, false, true]);
        assert!(Overlap::Always.admits(STREAM, 128, 512));
        assert!(!Overlap::Never.admits(STREAM, 1, 128));
    }

    #[test]
    fn blocks_of_one_size_start_early_up_to_what_the_device_holds_of_them() {
        // 8 ranks on 132 SMs holding 4 blocks of 128 threads each: 7 x 2 x 35 + 35 = 525
        // <= 528 blocks of 128 threads; of 256 threads, 17 (255 <= 264).
        assert_eq!(H200.blocks(128), 528);
        assert_eq!(H200.blocks(64), 528);
        assert_eq!(H200.blocks(384), 132);
        assert_eq!(H200.early_bound(128, 8), 35);
        assert_eq!(H200.early_bound(256, 8), 17);
        assert_eq!(H200.early_bound(512, 8), 8);
        assert_eq!(H200.early_bound(128, 2), 176);
        let bounded = Overlap::Bounded {
            residency: H200,
            sharing: 8,
            last: Cell::new(None),
        };
        let admitted: Vec<bool> = [
            (21, 128),
            (21, 128), // same size, within 35
            (35, 128),
            (36, 128), // beyond 35
            (21, 128), // after a launch beyond it
            (11, 256), // another size, more than 8 blocks
            (11, 256), // same size, within 17
            (6, 512),  // another size, after 11 blocks: more than 8 whole SMs
            (6, 128),  // another size, both within 8 whole SMs
            (21, 128),
        ]
        .map(|(b, t)| bounded.admits(STREAM, b, t))
        .to_vec();
        assert_eq!(
            admitted,
            [
                false, true, true, false, false, false, true, false, true, true
            ]
        );
    }

    #[test]
    fn residencies_travel_as_bytes_and_combine_by_their_least() {
        let other = Residency {
            sms: 170,
            per_sm: [3, 2, 1],
        };
        assert_eq!(Residency::from_bytes(&H200.to_bytes()), H200);
        assert_eq!(
            H200.min(other),
            Residency {
                sms: 132,
                per_sm: [3, 2, 1]
            }
        );
        assert_eq!(by_block_size([35, 17, 8], 96), 35);
        assert_eq!(by_block_size([35, 17, 8], 256), 17);
        assert_eq!(by_block_size([35, 17, 8], 384), 8);
    }
}
