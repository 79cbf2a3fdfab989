//! The all-reduce algorithms, by name, and the automatic choice per (world size, bytes).

use std::fmt;
use std::str::FromStr;

use comm_core::{Error, Result, TrafficPattern};

use crate::comm::COPIES_FROM;

/// The largest all-reduce that two ranks with a GPU each send by one-shot push where the
/// regions are host memory; larger ones go by two-shot push, or, beyond the mailboxes (1 MiB
/// in symm-cuda), pull. Two H200s, host-mapped regions, graphs, bf16, 2 runs (2026-12-04),
/// one-shot push / two-shot push / copies, us: 256 KiB 19.4 / 25.5 / 83.4, 512 KiB 29.6 /
/// 41.0 / 92.5, 1 MiB 47.7 / 74.3 / 110.3; beyond the mailboxes one-shot push ran as one-shot
/// pull and two-shot push as two-shot pull: 2 MiB 129.0 / 82.1 / 217.0, 4 MiB 251.0 / 154.7 /
/// 359.2 (eager 50.7-51.5 / 78.9-79.2 / 79.7-81.1 at 1 MiB, 255.1 / 158.5-159.4 / 207.0-208.0
/// at 4 MiB). Ranks that share a GPU push one shot at every size (measured there).
pub const HOST_PAIR_ONESHOT_MAX: usize = 1 << 20;

/// One all-reduce algorithm over peer memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Algorithm {
    /// Barrier, then every rank reads every rank's buffer and reduces (rank order).
    /// Fewest steps: best for small messages when reads are cheap (NVLink).
    OneshotPull,
    /// Reduce-scatter (every rank writes slice r of its input into rank r's staging, or,
    /// zero-copy, rank r reads it in place; rank r reduces it), barrier, all-gather (every
    /// rank reads every reduced slice). Moves `2 (n-1)/n` of the message per rank: large
    /// messages.
    TwoshotPull,
    /// Lamport: every rank writes its data into every peer's mailbox (a sentinel marks
    /// what has not arrived), then reduces its own mailbox. No barrier; posted writes only.
    /// Where every rank's region is one device's memory (ranks sharing a GPU), each rank
    /// writes its data once, into its own mailbox, and reads its peers' there: a peer's
    /// memory is as near as its own, and the stores are `1/(n-1)` of pushing.
    OneshotPush,
    /// Lamport two-shot: slice j goes to rank j, which reduces it and pushes the result to
    /// every rank.
    TwoshotPush,
    /// One-shot by the copy engines (`copies`): every rank's input is copied into its
    /// region, every peer's from there into this rank's device memory, and a kernel reduces
    /// all of it (rank order), part after part, copies out and in overlapping. Kernels
    /// move no data across the link: for regions in host memory (GPUs without peer access),
    /// where loads by kernels are slow and copies run at the link's rate, and large messages.
    OneshotCopy,
}

impl Algorithm {
    /// Every algorithm, in a stable order.
    pub const ALL: [Algorithm; 5] = [
        Algorithm::OneshotPull,
        Algorithm::TwoshotPull,
        Algorithm::OneshotPush,
        Algorithm::TwoshotPush,
        Algorithm::OneshotCopy,
    ];

    /// Every name [`Algorithm::ALL`] goes by, in the same order.
    pub const NAMES: [&'static str; 5] = [
        "oneshot-pull",
        "twoshot-pull",
        "oneshot-push",
        "twoshot-push",
        "oneshot-copy",
    ];

    /// The name users and `comm-select` pass (`oneshot-pull`, ...).
    pub const fn name(self) -> &'static str {
        Self::NAMES[self as usize]
    }

    /// How it moves data, for cost models.
    pub const fn pattern(self) -> TrafficPattern {
        match self {
            Algorithm::OneshotPull => TrafficPattern::OneShotPull,
            Algorithm::TwoshotPull => TrafficPattern::TwoShotPull,
            Algorithm::OneshotPush => TrafficPattern::OneShotPush,
            Algorithm::TwoshotPush => TrafficPattern::TwoShotPush,
            // What crosses the link is what one-shot pull reads.
            Algorithm::OneshotCopy => TrafficPattern::OneShotPull,
        }
    }

    /// The kernel-name stem (`oneshot_pull`, ...).
    pub(crate) const fn kernel_stem(self) -> &'static str {
        match self {
            Algorithm::OneshotPull => "oneshot_pull",
            Algorithm::TwoshotPull => "twoshot_pull",
            Algorithm::OneshotPush => "oneshot_push",
            Algorithm::TwoshotPush => "twoshot_push",
            Algorithm::OneshotCopy => "oneshot_copy",
        }
    }

    /// The default for `world` ranks and `bytes` per rank: one-shot while the message is
    /// small enough that latency (one pass) dominates, two-shot beyond, where each rank moves
    /// `2 (n-1)/n` of the message instead of `n - 1` times it. The cut-offs are vLLM's (512
    /// KiB for 2 ranks, 256 KiB for 4, 128 KiB for 8); at 2 ranks they match ours (2 x H200:
    /// one-shot push 6.4 us against two-shot push 6.6 at 512 KiB, 11.3 against 9.1 at 1 MiB,
    /// in graphs). Push (Lamport: no barrier, the data is its own flag) at every size, since it
    /// was measured faster than pull wherever both run: over NVLink 4.2 against 5.7 us at 32
    /// KiB, 9.1 against 10.7 at 1 MiB; through host memory 9.8 against 12.7 at 8 KiB. A
    /// message larger than the mailboxes, or ranks that share a device (but at one-shot sizes
    /// for ranks that all share one device's memory, or whose regions are host memory), run
    /// the pull variant
    /// ([`PeerComm::algorithm_for`]), and so does an input in a registered buffer
    /// ([`PeerComm::alloc`]), which the pull variants read where it lies.
    ///
    /// [`PeerComm::algorithm_for`]: crate::PeerComm::algorithm_for
    /// [`PeerComm::alloc`]: crate::PeerComm::alloc
    pub fn auto(world: usize, bytes: usize) -> Algorithm {
        let oneshot_limit = match world {
            0..=2 => 512 << 10,
            3..=4 => 256 << 10,
            _ => 128 << 10,
        };
        if bytes <= oneshot_limit {
            Algorithm::OneshotPush
        } else {
            Algorithm::TwoshotPush
        }
    }

    /// What an all-reduce of `bytes` per rank runs: `chosen`, or the automatic choice for
    /// `None`, over `memory` ([`PeerComm::algorithm_for`] says why).
    ///
    /// [`PeerComm::algorithm_for`]: crate::PeerComm::algorithm_for
    pub(crate) fn resolve(chosen: Option<Algorithm>, bytes: usize, memory: Memory) -> Algorithm {
        let chosen = chosen.unwrap_or_else(|| {
            let auto = Algorithm::auto(memory.world, bytes);
            if memory.host && memory.sharing == 1 && bytes >= COPIES_FROM {
                Algorithm::OneshotCopy
            } else if memory.host
                && memory.world == 2
                && (memory.sharing > 1 || bytes <= HOST_PAIR_ONESHOT_MAX)
            {
                // Two ranks move the same bytes in one shot as in two, and one-shot push
                // over host memory streams them with one flag trip, past the mailboxes and
                // a staging half too (one H200, two ranks, graphs, medians of 3, against
                // two-shot pull: 1 MiB 63.6 us / 74.8, 2 MiB 121.3 / 140.4, 4 MiB 232.2 /
                // 271.1, 8 MiB 443.4 / 532.1, 16 MiB 891.6 / 1056.1, 64 MiB 3578.5 / 4081.0).
                Algorithm::OneshotPush
            } else if memory.sharing > 1
                && !(auto == Algorithm::OneshotPush && (memory.one_device() || memory.host))
            {
                auto.pull()
            } else {
                auto
            }
        });
        // Over host memory a one-shot push needs no mailbox: past them it goes as data and
        // flags, in launches of what a staging half holds.
        let fits = match chosen {
            Algorithm::OneshotPush => memory.host || bytes <= memory.mailbox,
            Algorithm::TwoshotPush => bytes <= memory.mailbox,
            _ => true,
        };
        if fits { chosen } else { chosen.pull() }
    }

    /// True for the Lamport (write-into-peers) algorithms.
    pub const fn is_push(self) -> bool {
        matches!(self, Algorithm::OneshotPush | Algorithm::TwoshotPush)
    }

    /// The pull algorithm of the same shape (for push messages too big for the mailboxes).
    pub const fn pull(self) -> Algorithm {
        match self {
            Algorithm::OneshotPush => Algorithm::OneshotPull,
            Algorithm::TwoshotPush => Algorithm::TwoshotPull,
            other => other,
        }
    }
}

/// What [`Algorithm::resolve`] needs to know of a communicator's memory.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Memory {
    /// Ranks of the communicator.
    pub world: usize,
    /// The regions are host memory mapped into the devices.
    pub host: bool,
    /// Most ranks that share one device.
    pub sharing: usize,
    /// Bytes per rank that a push message may hold (the mailboxes).
    pub mailbox: usize,
}

impl Memory {
    /// Whether every rank's region is one device's memory. Of ranks that share a device,
    /// only these run the all-reduce's one-shot push by default (each rank writes its data
    /// once, into its own slot, and reads its peers' there). One H200, 8 ranks, graphs per
    /// rank, push against pull: 3.45 / 4.18 us at 8 B, 4.32 / 4.61 at 42 KB, 4.43 / 4.68 at
    /// 64 KiB, 6.18 / 6.56 at 128 KiB (the largest one-shot size at 8 ranks); 2 ranks 3.01 /
    /// 3.53 at 42 KB.
    pub(crate) fn one_device(&self) -> bool {
        crate::group::gpu_scope(self.sharing, self.world, self.host)
    }

    /// Whether the fused op's automatic exchange is push: only where every rank has its own
    /// device. Ranks on one H200, 3 x 7168 bf16 in one graph for all ranks, push (each rank's
    /// own slot) against pull: 4 ranks 8.32 / 7.72 us, 8 ranks 9.52 / 8.56 (2 ranks not
    /// measured).
    pub(crate) fn fused_pushes(&self) -> bool {
        self.sharing == 1
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Algorithm {
    type Err = Error;

    /// Accepts the names, any case, `_` for `-`, and the older short names `oneshot`,
    /// `twoshot` (pull) and `lamport` (one-shot push).
    fn from_str(s: &str) -> Result<Self> {
        let wanted = s.trim().to_ascii_lowercase().replace('_', "-");
        let found = match wanted.as_str() {
            "oneshot" | "one-shot" => Some(Algorithm::OneshotPull),
            "twoshot" | "two-shot" => Some(Algorithm::TwoshotPull),
            "lamport" => Some(Algorithm::OneshotPush),
            name => Algorithm::ALL.into_iter().find(|a| a.name() == name),
        };
        found.ok_or_else(|| {
            Error::InvalidArgument(format!(
                "unknown peer-memory algorithm `{s}` (known: {}, or auto)",
                Algorithm::NAMES.join(", ")
            ))
        })
    }
}

/// Parses `auto` (or an empty string) as `None`, anything else as an [`Algorithm`].
pub fn parse_choice(s: &str) -> Result<Option<Algorithm>> {
    match s.trim() {
        "" | "auto" => Ok(None),
        name => name.parse().map(Some),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for a in Algorithm::ALL {
            assert_eq!(a.name().parse::<Algorithm>().unwrap(), a);
            assert_eq!(a.kernel_stem().replace('_', "-"), a.name());
        }
        assert_eq!(
            "TWOSHOT_PUSH".parse::<Algorithm>().unwrap(),
            Algorithm::TwoshotPush
        );
        assert_eq!(
            "lamport".parse::<Algorithm>().unwrap(),
            Algorithm::OneshotPush
        );
        assert_eq!(
            "oneshot".parse::<Algorithm>().unwrap(),
            Algorithm::OneshotPull
        );
        let err = "threeshot".parse::<Algorithm>().unwrap_err();
        assert!(err.to_string().contains("oneshot-pull"), "{err}");
        assert_eq!(parse_choice("auto").unwrap(), None);
    }

    #[test]
    fn auto_is_oneshot_small_and_twoshot_large() {
        assert_eq!(Algorithm::auto(8, 42 << 10), Algorithm::OneshotPush);
        assert_eq!(Algorithm::auto(8, 64 << 20), Algorithm::TwoshotPush);
        assert_eq!(Algorithm::auto(2, 512 << 10), Algorithm::OneshotPush);
        assert_eq!(Algorithm::auto(4, 512 << 10), Algorithm::TwoshotPush);
        for world in 1..=8 {
            assert_eq!(Algorithm::auto(world, 0), Algorithm::OneshotPush);
        }
    }

    const MIB: usize = 1 << 20;

    fn memory(host: bool, sharing: usize) -> Memory {
        Memory {
            world: 2,
            host,
            sharing,
            mailbox: 8 * MIB,
        }
    }

    #[test]
    fn copies_carry_large_host_messages_only_where_every_rank_has_its_device() {
        let resolve = |bytes, host, sharing| Algorithm::resolve(None, bytes, memory(host, sharing));
        assert_eq!(resolve(COPIES_FROM, true, 1), Algorithm::OneshotCopy);
        assert_eq!(resolve(64 * MIB, true, 1), Algorithm::OneshotCopy);
        // Below the copies, a GPU each: one-shot push, then two-shot push, then pull.
        assert_eq!(resolve(COPIES_FROM - 16, true, 1), Algorithm::TwoshotPull);
        assert_eq!(resolve(8 * MIB, true, 1), Algorithm::TwoshotPush);
        assert_eq!(
            resolve(HOST_PAIR_ONESHOT_MAX + 16, true, 1),
            Algorithm::TwoshotPush
        );
        assert_eq!(
            resolve(HOST_PAIR_ONESHOT_MAX, true, 1),
            Algorithm::OneshotPush
        );
        assert_eq!(resolve(42 << 10, true, 1), Algorithm::OneshotPush);
        // Ranks sharing a device through host memory: one-shot push at every size, never
        // copies.
        assert_eq!(resolve(64 * MIB, true, 2), Algorithm::OneshotPush);
        assert_eq!(resolve(MIB, true, 2), Algorithm::OneshotPush);
        assert_eq!(resolve(8 * MIB + 16, true, 2), Algorithm::OneshotPush);
        assert_eq!(resolve(42 << 10, true, 2), Algorithm::OneshotPush);
        assert_eq!(resolve(8, true, 2), Algorithm::OneshotPush);
        // Device memory: never copies by default.
        assert_eq!(resolve(64 * MIB, false, 1), Algorithm::TwoshotPull);
        assert_eq!(resolve(4 * MIB, false, 1), Algorithm::TwoshotPush);
    }

    #[test]
    fn ranks_on_one_device_push_one_shot_and_other_sharing_ranks_pull() {
        let on = |world, sharing, host| Memory {
            world,
            host,
            sharing,
            mailbox: 8 * MIB,
        };
        let resolve = |bytes, m| Algorithm::resolve(None, bytes, m);
        for world in [2, 4, 8] {
            let one_device = on(world, world, false);
            assert_eq!(resolve(42 << 10, one_device), Algorithm::OneshotPush);
            assert_eq!(resolve(8, one_device), Algorithm::OneshotPush);
            // Two-shot sizes: pull (the local kernel is one-shot only).
            assert_eq!(resolve(4 * MIB, one_device), Algorithm::TwoshotPull);
        }
        // Some ranks share a device, but not all one: the regions are not one memory.
        assert_eq!(resolve(42 << 10, on(4, 2, false)), Algorithm::OneshotPull);
        // One device's ranks over host memory: push at one-shot sizes.
        assert_eq!(resolve(42 << 10, on(2, 2, true)), Algorithm::OneshotPush);
        assert_eq!(resolve(4 * MIB, on(2, 2, true)), Algorithm::OneshotPush);
        assert_eq!(resolve(4 * MIB, on(4, 4, true)), Algorithm::TwoshotPull);
        // Push too large for the mailboxes still pulls.
        let small_mailbox = Memory {
            mailbox: 16 << 10,
            ..on(2, 2, false)
        };
        assert_eq!(resolve(42 << 10, small_mailbox), Algorithm::OneshotPull);
        // The fused op's automatic exchange pushes only where every rank has its device.
        assert!(on(2, 1, false).fused_pushes());
        assert!(on(2, 1, true).fused_pushes());
        for sharing in [(2, 2), (4, 4), (8, 8), (4, 2)] {
            assert!(!on(sharing.0, sharing.1, false).fused_pushes());
        }
        assert!(!on(2, 2, true).fused_pushes());
    }

    #[test]
    fn over_host_memory_one_shot_push_outgrows_the_mailboxes_by_data_and_flags() {
        // symm-cuda's defaults: 1 MiB mailboxes.
        let host = |sharing| Memory {
            world: 2,
            host: true,
            sharing,
            mailbox: MIB,
        };
        let resolve = |chosen, bytes, m| Algorithm::resolve(chosen, bytes, m);
        // Two ranks on one GPU: one shot at every size (in launches of a staging half).
        for bytes in [MIB, 2 * MIB, 8 * MIB, 64 * MIB] {
            assert_eq!(resolve(None, bytes, host(2)), Algorithm::OneshotPush);
        }
        // A GPU each: one shot to HOST_PAIR_ONESHOT_MAX, then two-shot (pull past the
        // mailboxes).
        assert_eq!(resolve(None, 2 * MIB, host(1)), Algorithm::TwoshotPull);
        // A chosen one-shot push fits; a chosen two-shot push does not.
        let push = Some(Algorithm::OneshotPush);
        assert_eq!(resolve(push, 4 * MIB, host(1)), Algorithm::OneshotPush);
        let twoshot = Some(Algorithm::TwoshotPush);
        assert_eq!(resolve(twoshot, 4 * MIB, host(1)), Algorithm::TwoshotPull);
    }

    #[test]
    fn a_chosen_push_too_large_for_the_mailboxes_pulls() {
        let m = memory(false, 1);
        let push = Some(Algorithm::OneshotPush);
        assert_eq!(Algorithm::resolve(push, 8 * MIB, m), Algorithm::OneshotPush);
        assert_eq!(
            Algorithm::resolve(push, 8 * MIB + 16, m),
            Algorithm::OneshotPull
        );
        let copy = Some(Algorithm::OneshotCopy);
        assert_eq!(
            Algorithm::resolve(copy, 64 * MIB, memory(true, 2)),
            Algorithm::OneshotCopy
        );
    }
}
