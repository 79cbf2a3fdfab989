//! A cost model: predicted time of a collective per (backend, algorithm, world, bytes).
//!
//! Every algorithm is one of a few data-movement [`TrafficPattern`]s, which each backend
//! declares for itself and each of its algorithms. A pattern costs a fixed
//! launch, some barriers, and transfers. A transfer is limited by the slower of two
//! things: each rank's own link (bytes it moves / its link bandwidth), and, on PCIe, the
//! switch all ranks share (bytes all ranks move / the switch's bandwidth). Remote *reads*
//! through a shared switch degrade with every concurrent reader (each read is a round
//! trip holding credits), posted *writes* do not: that is why one-shot pull, where all
//! `n` ranks read `n - 1` peers at once, lost 2x to NCCL on 8 PCIe GPUs (see the seeds),
//! while push and two-shot variants move fewer bytes or cheaper ones.
//!
//! The parameters are estimates for each [`Fabric`], calibrated so that the model
//! reproduces measured facts (NCCL ~200 us for 42 KB on 8 PCIe GPUs; custom one-shot pull
//! 2x slower there; one-shot ~4 us on NVLink). A tuning table measured on the host
//! always overrides the model.

use crate::topology::{Fabric, PciePath, Topology};
use comm_core::Collective;

/// How an algorithm moves data: declared by each backend in its
/// [`Capabilities`](comm_core::Capabilities), so that the model needs no backend names.
pub use comm_core::TrafficPattern;

/// The parameters of one fabric. Bandwidths in GB/s (1e9 bytes/s), times in µs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FabricParams {
    /// Fixed cost of one collective of our kernels (a graph node, or a host call).
    pub launch_us: f64,
    /// One all-to-all flag round.
    pub barrier_us: f64,
    /// Per-rank bandwidth of posted writes to peers.
    pub write_gbps: f64,
    /// Per-rank bandwidth of reads from peers, with no one else reading.
    pub read_gbps: f64,
    /// Bandwidth of a switch every rank's traffic crosses; `None`: non-blocking fabric.
    pub shared_gbps: Option<f64>,
    /// Read slowdown per additional concurrent reader through the shared switch.
    pub read_contention: f64,
    /// Fraction of link bandwidth our kernels reach.
    pub kernel_efficiency: f64,
    /// Fixed cost of one NCCL (or MPI) call.
    pub ring_launch_us: f64,
    /// Latency of one ring step.
    pub ring_step_us: f64,
    /// Fraction of link bandwidth the ring reaches.
    pub ring_efficiency: f64,
    /// Fixed cost of NCCL's bulk protocol, which it switches to for large messages: more
    /// set-up than its low-latency protocol (`ring_launch_us`), more of the link's bandwidth
    /// (`ring_bulk_efficiency`). A ring call costs the cheaper of the two.
    pub ring_bulk_launch_us: f64,
    /// Fraction of link bandwidth the bulk protocol reaches.
    pub ring_bulk_efficiency: f64,
}

impl FabricParams {
    /// GPUs without P2P whose PCIe paths are mostly `path`: [`NO_P2P`], but for GPUs behind
    /// one PCIe switch (PIX, PXB), whose traffic to and from host memory all crosses the
    /// switch's one uplink, where every rank's reads of host memory contend as reads of
    /// peers through a switch do ([`Fabric::Pcie`]'s switch and contention): so such GPUs
    /// pay more through host memory than with P2P through that switch.
    pub fn no_p2p(path: PciePath) -> Self {
        match path {
            PciePath::Pix | PciePath::Pxb => {
                let switch = FabricParams::for_fabric(Fabric::Pcie);
                FabricParams {
                    shared_gbps: switch.shared_gbps,
                    read_contention: switch.read_contention,
                    ..NO_P2P
                }
            }
            _ => NO_P2P,
        }
    }

    /// Estimates for `fabric`.
    pub fn for_fabric(fabric: Fabric) -> Self {
        match fabric {
            // H100/H200 SXM: 18 NVLink4 links, ~450 GB/s per direction, NVSwitch non-blocking.
            // Calibrated on 2 x H200 (benchmarks/history/2026-11-30.md, "... 128-block
            // grids, recalibrated cost model"), CUDA graphs, bf16: our one-shot push takes
            // 3.7 us up to 42 KB and carries ~240 GB/s from 16 MiB (128 blocks); NCCL takes
            // 5.8 us for small messages, 13.7 at 1 MiB (low-latency protocol), then 31.9 at
            // 4 MiB .. 250 at 64 MiB (bulk).
            Fabric::NvLink => FabricParams {
                launch_us: 4.0,
                barrier_us: 1.5,
                write_gbps: 450.0,
                read_gbps: 450.0,
                shared_gbps: None,
                read_contention: 0.0,
                kernel_efficiency: 0.53,
                ring_launch_us: 3.4,
                ring_step_us: 1.2,
                ring_efficiency: 0.3,
                ring_bulk_launch_us: 15.0,
                ring_bulk_efficiency: 0.64,
            },
            // Every rank on one GPU: peers' buffers are local HBM, and every rank's kernels
            // share its bandwidth: a pattern costs the bytes all ranks' kernels read and
            // write (`same_device_traffic`) over `shared_gbps`. Calibrated on one H200, 2
            // ranks, graphs, bf16: one-shot push 70.1 us at 16 MiB and 280.5 at 64 MiB,
            // two-shot pull 57.1 and 217.6 (~3.6 TB/s of the ~4.8 of HBM).
            Fabric::SameDevice => FabricParams {
                launch_us: 2.5,
                barrier_us: 1.5,
                write_gbps: 2000.0,
                read_gbps: 2000.0,
                shared_gbps: Some(4000.0),
                read_contention: 0.0,
                kernel_efficiency: 0.9,
                ring_launch_us: 6.0,
                ring_step_us: 1.2,
                ring_efficiency: 0.85,
                ring_bulk_launch_us: 6.0,
                ring_bulk_efficiency: 0.85,
            },
            // PCIe Gen5 x16 GPUs behind one switch; NCCL ~200 us at 42 KB on 8 GPUs (seeds).
            Fabric::Pcie => FabricParams {
                launch_us: 4.0,
                barrier_us: 4.0,
                write_gbps: 40.0,
                read_gbps: 20.0,
                shared_gbps: Some(48.0),
                read_contention: 1.0,
                kernel_efficiency: 0.8,
                ring_launch_us: 10.0,
                ring_step_us: 13.5,
                ring_efficiency: 0.9,
                ring_bulk_launch_us: 10.0,
                ring_bulk_efficiency: 0.9,
            },
            Fabric::NoP2p => NO_P2P,
            // CPU processes sharing memory: memcpy-class bandwidth, sub-µs flags.
            Fabric::HostMemory | Fabric::Single => FabricParams {
                launch_us: 0.3,
                barrier_us: 0.4,
                write_gbps: 8.0,
                read_gbps: 8.0,
                shared_gbps: Some(20.0),
                read_contention: 0.1,
                kernel_efficiency: 1.0,
                ring_launch_us: 1.0,
                ring_step_us: 0.6,
                ring_efficiency: 1.0,
                ring_bulk_launch_us: 1.0,
                ring_bulk_efficiency: 1.0,
            },
            // Between nodes only the ring (NCCL, MPI) applies; ~25 GB/s, ~5 µs per step.
            Fabric::MultiNode => FabricParams {
                launch_us: 4.0,
                barrier_us: 10.0,
                write_gbps: 25.0,
                read_gbps: 25.0,
                shared_gbps: None,
                read_contention: 0.0,
                kernel_efficiency: 0.8,
                ring_launch_us: 10.0,
                ring_step_us: 5.0,
                ring_efficiency: 0.9,
                ring_bulk_launch_us: 10.0,
                ring_bulk_efficiency: 0.9,
            },
        }
    }
}

/// GPUs without P2P (comm-symm's host-mapped backing; NCCL's shared-memory transport), each
/// on its own root port (PCIe paths PHB, NODE, SYS, or not known): every byte crosses PCIe
/// twice, its sender's kernel writing it into host memory, its receiver's kernel reading it
/// back over its own link; GPUs behind one PCIe switch share its uplink for both
/// ([`FabricParams::no_p2p`]).
///
/// Calibrated on two H200s, one rank each, P2P off, CUDA graphs, bf16 (2026-12-04;
/// BENCHMARKS.md, "Without peer access, two H200s"), in the same run: NCCL (its
/// shared-memory transport, `NCCL_P2P_DISABLE=1`) 9.4 us at 8 B, 14.3 at 42 KB, 34.9 at 256
/// KiB, 62.2 at 1 MiB, 167.1 at 4 MiB (598 at 16 MiB on 2026-11-30); ours,
/// one-shot push 4.0 us at 8 B, 6.6 at 42 KB, 19.6 at 256 KiB, 29.6 at 512 KiB, 47.7 at 1 MiB,
/// two-shot pull (where a push message outgrows symm-cuda's 1 MiB mailboxes) 82.1 at 2 MiB
/// and 154.7 at 4 MiB. So the model takes our kernels up to 4 MiB at two ranks (where the
/// two measured 7% apart and it has them within 2%) and NCCL beyond. At two ranks each
/// rank's own link is the limit (the host's side carried both ranks' traffic at once
/// without slowing either). More ranks were not measured without P2P; a tuning table
/// measured on the machine beats the model anyway.
pub const NO_P2P: FabricParams = FabricParams {
    // One-shot push of a few bytes: 3.8-4.0 us (graphs); one-shot pull (a barrier more) was
    // ~1.9 us slower on one H200.
    launch_us: 4.5,
    barrier_us: 1.9,
    // What PCIe through host memory carries: NCCL's bulk protocol from 1 MiB, and our
    // two-shot pull at 4 MiB (28.6 GB/s past its launch and barriers).
    write_gbps: 28.0,
    read_gbps: 28.0,
    // Where every rank's bytes meet on the host (root complex, memory, the sockets' link):
    // not measured beyond two ranks, which it does not limit. Each rank reads over its own
    // root port, so readers are not taken to slow each other there.
    shared_gbps: Some(60.0),
    read_contention: 0.0,
    // One-shot push, 42 KB to 1 MiB past the launch: 21 GB/s at 42 KB, 17 at 256 KiB (chunks
    // written and read in turn: the first one's write, fence and read are not overlapped,
    // which this linear model has not), 24 at 1 MiB; two-shot pull 28 at 2 and 4
    // MiB. 0.9 (25.2 GB/s) keeps 8 B to 4 MiB within -24%..+13%.
    kernel_efficiency: 0.9,
    // Two ranks, low-latency protocol: 5.5 + 2 steps x 2.0 = 9.5 us, then ~9.8 GB/s (13.9 us
    // at 42 KB, ~36 at 256 KiB).
    ring_launch_us: 5.5,
    ring_step_us: 2.0,
    ring_efficiency: 0.35,
    // Bulk protocol: 24 us + the link's 28 GB/s (61 us at 1 MiB, 174 at 4, 623 at 16).
    ring_bulk_launch_us: 24.0,
    ring_bulk_efficiency: 1.0,
};

/// Ranks sharing one device: the bytes one rank's kernels read and write in HBM, in units
/// of the message, and the synchronisation rounds of each peer-memory pattern of `n` ranks.
/// Fitted to one H200 with 2 ranks, graphs, bf16, 256 KiB .. 64 MiB (one-shot pull and push
/// ~7.5 messages per rank, two-shot ~5.7; a two-shot call ~3 us more at 256 KiB) and to 8
/// ranks at 42 KB (one-shot push ~4 us; two-shot ~12 us more in verify-step). A link model
/// would price one-shot push, which has no barrier, below two-shot at every size; on one
/// device the `n` copies it writes and reads cost more than two-shot's rounds from a few
/// MiB at 2 ranks.
fn same_device_traffic(pattern: TrafficPattern, n: f64) -> Option<(f64, f64)> {
    Some(match pattern {
        // Input read and written into `n` mailboxes (or staged for `n` readers), `n`
        // copies read, the output written.
        TrafficPattern::OneShotPush => (2.0 * n + 3.0, 0.0),
        TrafficPattern::OneShotPull => (2.0 * n + 3.0, 0.1),
        // Slices staged at their owners, each owner reads `n` slices and writes its sum,
        // every rank reads the `n` sums and writes its output; two rounds, each a wait for
        // every peer, which ranks time-slicing one device pay per peer.
        TrafficPattern::TwoShotPull | TrafficPattern::TwoShotPush => (5.0 + 1.0 / n, 2.0),
        _ => return None,
    })
}

/// The fixed cost of one device-to-device copy on the call's stream, µs: staging an
/// unregistered buffer into a symmetric window and out again costs two.
pub const STAGING_COPY_US: f64 = 2.0;
/// What such a copy carries within one GPU's memory, GB/s.
pub const STAGING_COPY_GBPS: f64 = 1000.0;

/// Predicts collective times on one topology.
#[derive(Debug, Clone)]
pub struct CostModel {
    fabric: Fabric,
    params: FabricParams,
    world: usize,
}

#[derive(Clone, Copy)]
enum Access {
    Read { concurrent: usize },
    Write,
}

impl CostModel {
    /// A model of `topology` with the estimates of its fabric (without P2P, of its
    /// dominant PCIe path: [`FabricParams::no_p2p`]).
    pub fn new(topology: &Topology) -> Self {
        let fabric = topology.fabric();
        let params = match fabric {
            Fabric::NoP2p => FabricParams::no_p2p(topology.dominant_pcie_path()),
            other => FabricParams::for_fabric(other),
        };
        CostModel {
            fabric,
            params,
            world: topology.world_size(),
        }
    }

    /// A model with explicit parameters.
    pub fn with_params(topology: &Topology, params: FabricParams) -> Self {
        CostModel {
            params,
            ..CostModel::new(topology)
        }
    }

    /// The fabric modelled.
    pub fn fabric(&self) -> Fabric {
        self.fabric
    }

    /// Predicted µs of an all-reduce of `bytes` per rank moved as `pattern`, or `None` when
    /// it cannot run on this fabric (peer memory across nodes).
    pub fn all_reduce_us(&self, pattern: TrafficPattern, bytes: usize) -> Option<f64> {
        self.predict(pattern, bytes)
    }

    /// Predicted µs of `collective` (all-reduce is modelled in detail; the others by the
    /// bytes they move through the same pattern).
    pub fn predict_collective(
        &self,
        collective: Collective,
        pattern: TrafficPattern,
        bytes: usize,
    ) -> Option<f64> {
        match collective {
            Collective::AllReduce => self.predict(pattern, bytes),
            // Half the traffic of an all-reduce of the same size.
            Collective::AllGather | Collective::ReduceScatter => {
                let p = &self.params;
                let full = self.predict(pattern, bytes)?;
                Some(p.launch_us + (full - p.launch_us) / 2.0)
            }
            _ => self.predict(pattern, bytes),
        }
    }

    fn predict(&self, pattern: TrafficPattern, bytes: usize) -> Option<f64> {
        let p = &self.params;
        let n = self.world as f64;
        let s = bytes as f64;
        // NCCL's symmetric kernels, reached through a staging window (a registered buffer
        // skips the copies, but a call does not say where its buffer lies): priced as a
        // one-shot or two-shot of writes at NCCL's call cost, where peers' memory is one
        // NVLink domain, the only place NCCL runs them.
        let staging = 2.0 * (STAGING_COPY_US + s / (STAGING_COPY_GBPS * 1e3));
        let symmetric_fabric = matches!(self.fabric, Fabric::NvLink | Fabric::Single);
        if self.world <= 1 {
            return Some(match pattern {
                TrafficPattern::Ring => p.ring_launch_us,
                TrafficPattern::SymmetricWindow => p.ring_launch_us + staging,
                TrafficPattern::GatherAll => 30.0,
                _ => p.launch_us,
            });
        }
        if self.fabric == Fabric::SameDevice {
            if let Some((traffic, rounds)) = same_device_traffic(pattern, n) {
                let hbm = p.shared_gbps.unwrap_or(p.write_gbps) * p.kernel_efficiency * 1e3;
                let sync = rounds * p.barrier_us * (n - 1.0);
                return Some(p.launch_us + sync + n * traffic * s / hbm);
            }
        }
        let peer_memory = !matches!(self.fabric, Fabric::MultiNode);
        let ranks = self.world;
        // Without P2P what a rank pushes reaches its peer only once the peer's kernel reads
        // it back from host memory.
        let pushed = match self.fabric {
            Fabric::NoP2p => Access::Read { concurrent: ranks },
            _ => Access::Write,
        };
        Some(match pattern {
            TrafficPattern::OneShotPull if peer_memory => {
                p.launch_us
                    + p.barrier_us
                    + self.transfer(
                        (n - 1.0) * s,
                        n * (n - 1.0) * s,
                        Access::Read { concurrent: ranks },
                    )
            }
            TrafficPattern::TwoShotPull if peer_memory => {
                let per_rank = 2.0 * (n - 1.0) / n * s;
                p.launch_us
                    + 2.0 * p.barrier_us
                    + self.transfer(
                        per_rank,
                        2.0 * (n - 1.0) * s,
                        Access::Read { concurrent: ranks },
                    )
            }
            TrafficPattern::OneShotPush if peer_memory => {
                p.launch_us + self.transfer((n - 1.0) * s, n * (n - 1.0) * s, pushed)
            }
            TrafficPattern::TwoShotPush if peer_memory => {
                let half = self.transfer((n - 1.0) / n * s, (n - 1.0) * s, pushed);
                p.launch_us + p.barrier_us + 2.0 * half
            }
            TrafficPattern::Ring => {
                let steps = 2.0 * (n - 1.0);
                let ring = |launch_us: f64, efficiency: f64| {
                    launch_us
                        + steps * p.ring_step_us
                        + steps / n * s / (p.write_gbps * efficiency * 1e3)
                };
                ring(p.ring_launch_us, p.ring_efficiency)
                    .min(ring(p.ring_bulk_launch_us, p.ring_bulk_efficiency))
            }
            TrafficPattern::SymmetricWindow if symmetric_fabric => {
                let one_shot = self.transfer((n - 1.0) * s, n * (n - 1.0) * s, Access::Write);
                let half = self.transfer((n - 1.0) / n * s, (n - 1.0) * s, Access::Write);
                p.ring_launch_us + one_shot.min(p.barrier_us + 2.0 * half) + staging
            }
            TrafficPattern::HostThreads => 2.0 + 2.0 * 3.0 + s / (p.write_gbps * 1e3),
            TrafficPattern::GatherAll => 30.0 * n + n * s / (1.0 * 1e3),
            _ => return None,
        })
    }

    /// µs to move `per_rank` bytes per rank, `total` bytes over all ranks.
    fn transfer(&self, per_rank: f64, total: f64, access: Access) -> f64 {
        let p = &self.params;
        let (link, shared_efficiency) = match access {
            Access::Write => (p.write_gbps, 1.0),
            Access::Read { concurrent } => (
                p.read_gbps,
                1.0 / (1.0 + p.read_contention * (concurrent as f64 - 1.0)),
            ),
        };
        let own = per_rank / (link * p.kernel_efficiency * 1e3);
        let shared = p.shared_gbps.map_or(0.0, |bw| {
            total / (bw * shared_efficiency * p.kernel_efficiency * 1e3)
        });
        own.max(shared)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::{Link, PciePath};

    const KB42: usize = 3 * 7168 * 2;
    const MB256: usize = 256 << 20;

    use TrafficPattern::*;

    fn us(model: &CostModel, pattern: TrafficPattern, bytes: usize) -> f64 {
        model.all_reduce_us(pattern, bytes).unwrap()
    }

    #[test]
    fn seeds_pcie_one_shot_pull_loses_to_nccl_but_push_and_two_shot_win() {
        let model = CostModel::new(&Topology::uniform(8, Link::pcie(PciePath::Pxb)));
        let nccl = us(&model, Ring, KB42);
        assert!(
            (150.0..260.0).contains(&nccl),
            "NCCL at 42 KB on 8 PCIe GPUs: {nccl} us"
        );
        let pull = us(&model, OneShotPull, KB42);
        assert!(pull > 1.5 * nccl, "one-shot pull {pull} vs NCCL {nccl}");
        for pattern in [OneShotPush, TwoShotPush, TwoShotPull] {
            let t = us(&model, pattern, KB42);
            assert!(t < nccl, "{pattern:?}: {t} us vs NCCL {nccl} us");
        }
    }

    /// Two H200s over NVLink, CUDA graphs, bf16 (benchmarks/history/2026-11-30.md): (bytes,
    /// NCCL us, our best kernel us).
    const NVLINK_2: [(usize, f64, f64); 7] = [
        (8192, 6.7, 3.7),
        (KB42, 7.5, 3.8),
        (1 << 20, 13.7, 6.8),
        (4 << 20, 31.9, 19.4),
        (16 << 20, 76.1, 69.9),
        (64 << 20, 249.8, 280.0),
        (MB256, 888.3, 1119.8),
    ];

    #[test]
    fn nvlink_two_ranks_choose_as_measured() {
        let model = CostModel::new(&Topology::uniform(2, Link::nvlink(18)));
        for (bytes, nccl, ours) in NVLINK_2 {
            let (predicted, which) = best_peer_pattern(&model, bytes);
            let ring = us(&model, Ring, bytes);
            assert_eq!(
                predicted < ring,
                ours < nccl,
                "{bytes} B: model {which:?} {predicted:.1} vs NCCL {ring:.1} us; \
                 measured {ours} vs {nccl} us"
            );
            for (model, measured) in [(ring, nccl), (predicted, ours)] {
                let off = model / measured;
                assert!(
                    (0.6..1.6).contains(&off),
                    "{bytes} B: model {model:.1} us vs measured {measured} us"
                );
            }
        }
    }

    #[test]
    fn nvlink_eight_ranks_one_shot_wins_small_and_nccl_wins_large() {
        let model = CostModel::new(&Topology::uniform(8, Link::nvlink(18)));
        let (small, which) = best_peer_pattern(&model, KB42);
        assert!(matches!(which, OneShotPull | OneShotPush), "{which:?}");
        assert!(small < us(&model, Ring, KB42) / 2.0);
        let (large, _) = best_peer_pattern(&model, MB256);
        assert!(us(&model, Ring, MB256) < large, "NCCL must win at 256 MiB");
    }

    /// The best of the four peer-memory patterns, and its time.
    fn best_peer_pattern(model: &CostModel, bytes: usize) -> (f64, TrafficPattern) {
        [OneShotPull, TwoShotPull, OneShotPush, TwoShotPush]
            .iter()
            .map(|&p| (us(model, p, bytes), p))
            .min_by(|a, b| a.0.total_cmp(&b.0))
            .unwrap()
    }

    /// Two H200s, one rank each, P2P off, CUDA graphs, bf16, 2026-12-04 (BENCHMARKS.md,
    /// "Without peer access, two H200s"; 16 MiB NCCL of 2026-11-30): (pattern, bytes, us).
    const NO_P2P_2: [(TrafficPattern, usize, f64); 14] = [
        (Ring, 8, 9.4),
        (Ring, KB42, 14.3),
        (Ring, 256 << 10, 34.9),
        (Ring, 1 << 20, 62.2),
        (Ring, 4 << 20, 167.1),
        (Ring, 16 << 20, 598.0),
        (OneShotPush, 8, 3.97),
        (OneShotPush, KB42, 6.56),
        (OneShotPush, 64 << 10, 7.31),
        (OneShotPush, 256 << 10, 19.59),
        (OneShotPush, 512 << 10, 29.6),
        (OneShotPush, 1 << 20, 47.7),
        (TwoShotPull, 2 << 20, 82.1),
        (TwoShotPull, 4 << 20, 154.7),
    ];

    #[test]
    fn without_p2p_two_ranks_take_ours_up_to_4_mib_and_nccl_beyond_as_measured() {
        let model = CostModel::new(&Topology::uniform(2, Link::no_p2p(PciePath::Sys)));
        assert_eq!(model.fabric(), Fabric::NoP2p);
        // The model stays within 25% of what each pattern measured where it is our
        // default (one-shot push to 1 MiB, two-shot pull beyond), NCCL everywhere.
        for (pattern, bytes, measured) in NO_P2P_2 {
            let predicted = us(&model, pattern, bytes);
            assert!(
                (predicted / measured - 1.0).abs() < 0.25,
                "{pattern:?} {bytes} B: predicted {predicted:.1} us, measured {measured}"
            );
        }
        // Ours wherever it measured ahead (to 4 MiB), NCCL from 16 MiB.
        for bytes in [8, KB42, 256 << 10, 1 << 20, 2 << 20, 4 << 20] {
            let (ours, which) = best_peer_pattern(&model, bytes);
            let nccl = us(&model, Ring, bytes);
            assert!(
                ours < nccl,
                "{bytes} B: {which:?} {ours:.1} us vs NCCL {nccl:.1} us"
            );
        }
        for bytes in [16 << 20, MB256] {
            let (ours, which) = best_peer_pattern(&model, bytes);
            let nccl = us(&model, Ring, bytes);
            assert!(
                nccl < ours,
                "{bytes} B: NCCL {nccl:.1} us vs {which:?} {ours:.1} us"
            );
        }
    }

    #[test]
    fn without_p2p_gpus_behind_one_switch_share_its_uplink() {
        let model = |path, world| CostModel::new(&Topology::uniform(world, Link::no_p2p(path)));
        for world in [2, 8] {
            for bytes in [KB42, 1 << 20, 16 << 20] {
                let (own_ports, _) = best_peer_pattern(&model(PciePath::Node, world), bytes);
                let (switched, _) = best_peer_pattern(&model(PciePath::Pxb, world), bytes);
                assert!(
                    own_ports < switched,
                    "{world} ranks, {bytes} B: {own_ports:.1} vs {switched:.1} us"
                );
            }
        }
    }

    #[test]
    fn host_memory_costs_more_than_p2p_over_pcie() {
        let pcie = |world| CostModel::new(&Topology::uniform(world, Link::pcie(PciePath::Pxb)));
        let host = |world| CostModel::new(&Topology::uniform(world, Link::no_p2p(PciePath::Pxb)));
        // Two GPUs (the common consumer box): the best pattern of our kernels on each, every
        // size (pull over PCIe, the seeds' slow case, may cost more than through host memory).
        for bytes in [1024, KB42, 16 << 20, MB256] {
            let ((p2p, a), (via_host, b)) = (
                best_peer_pattern(&pcie(2), bytes),
                best_peer_pattern(&host(2), bytes),
            );
            assert!(
                p2p < via_host,
                "{bytes} B: {a:?} {p2p} vs {b:?} {via_host} us"
            );
        }
        // Eight: the write patterns (pull through one PCIe switch is the seeds' worst case,
        // which host memory's controller may serve better).
        for pattern in [OneShotPush, TwoShotPush] {
            for bytes in [KB42, 16 << 20] {
                let (p2p, via_host) = (us(&pcie(8), pattern, bytes), us(&host(8), pattern, bytes));
                assert!(
                    p2p < via_host,
                    "{pattern:?} {bytes} B: {p2p} vs {via_host} us"
                );
            }
        }
    }

    /// One H200, 2 ranks sharing it, graphs, bf16, 2026-12-02 (`allreduce-perf --ranks 2
    /// --backend ipc --algo all --graph`): (bytes, one-shot push us, two-shot pull us).
    /// `auto` took one-shot push at 16 and 64 MiB.
    const SAME_DEVICE_2: [(usize, f64, f64); 4] = [
        (256 << 10, 3.70, 6.29),
        (4 << 20, 18.0, 14.96),
        (16 << 20, 70.19, 56.32),
        (64 << 20, 280.05, 213.92),
    ];

    #[test]
    fn ranks_sharing_a_device_choose_as_measured() {
        let model = CostModel::new(&Topology::uniform(2, Link::SAME_DEVICE));
        assert_eq!(model.fabric(), Fabric::SameDevice);
        for (bytes, push, two_shot) in SAME_DEVICE_2 {
            let (best, which) = best_peer_pattern(&model, bytes);
            let want = if push < two_shot {
                OneShotPush
            } else {
                TwoShotPull
            };
            assert!(
                which == want || (want == TwoShotPull && which == TwoShotPush),
                "{bytes} B: {which:?} {best:.1} us, measured best {want:?}"
            );
            for (pattern, measured) in [(OneShotPush, push), (TwoShotPull, two_shot)] {
                let off = us(&model, pattern, bytes) / measured;
                assert!(
                    (0.8..1.25).contains(&off),
                    "{pattern:?} {bytes} B: {off:.2}x"
                );
            }
        }
        // Eight ranks sharing, 42 KB: one-shot (push ~4 us); two-shot's rounds cost more.
        let eight = CostModel::new(&Topology::uniform(8, Link::SAME_DEVICE));
        assert_eq!(best_peer_pattern(&eight, KB42).1, OneShotPush);
        assert!(us(&eight, OneShotPush, KB42) < 5.0);
        assert!(matches!(
            best_peer_pattern(&eight, 16 << 20).1,
            TwoShotPull | TwoShotPush
        ));
    }

    #[test]
    fn staged_symmetric_windows_need_a_measurement_to_beat_nccl_and_only_run_on_nvlink() {
        // Unmeasured, the copies in and out keep the staged path behind NCCL's plain one
        // on one or two GPUs, and behind our kernels everywhere: auto picks it from a
        // tuning table only.
        for world in [1, 2, 8] {
            let model = CostModel::new(&Topology::uniform(world, Link::nvlink(18)));
            for bytes in [8, KB42, 1 << 20] {
                let staged = us(&model, SymmetricWindow, bytes);
                let ring = us(&model, Ring, bytes);
                if world <= 2 {
                    assert!(
                        ring < staged,
                        "{world} ranks, {bytes} B: {ring} vs {staged}"
                    );
                }
                if world > 1 {
                    let (ours, which) = best_peer_pattern(&model, bytes);
                    assert!(ours < staged, "{world} ranks, {bytes} B: {which:?} {ours}");
                }
            }
        }
        for link in [
            Link::pcie(PciePath::Pxb),
            Link::no_p2p(PciePath::Sys),
            Link::REMOTE,
        ] {
            let model = CostModel::new(&Topology::uniform(2, link));
            assert!(model.all_reduce_us(SymmetricWindow, KB42).is_none());
        }
    }

    #[test]
    fn peer_memory_patterns_do_not_cross_nodes() {
        let model = CostModel::new(&Topology::uniform(4, Link::REMOTE));
        assert!(model.all_reduce_us(OneShotPull, 1024).is_none());
        assert!(model.all_reduce_us(Ring, 1024).is_some());
    }
}
