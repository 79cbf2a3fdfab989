//! What connects the ranks: per-pair links, nodes, and how to share that picture.
//!
//! A [`Topology`] is a square matrix of [`Link`]s plus the node of every rank. Every rank
//! must hold the same topology (decisions are derived from it), so it travels through the
//! bootstrap ([`Topology::agree`]). Machines that cannot be probed (or tests) describe
//! theirs in a JSON file ([`Topology::load`]/[`Topology::save`]).

use std::path::Path;

use comm_core::{Bootstrap, Error, Result};
use serde::{Deserialize, Serialize};

/// How a PCIe path between two GPUs runs (the classes of `nvidia-smi topo -m`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum PciePath {
    /// At most one PCIe bridge (one switch).
    Pix,
    /// Several PCIe bridges, without the host bridge.
    Pxb,
    /// Through a PCIe host bridge (the CPU).
    Phb,
    /// Across host bridges within one NUMA node.
    Node,
    /// Across the CPUs' interconnect (another NUMA node).
    Sys,
    /// Not known.
    Unknown,
}

/// The connection between two ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Link {
    /// Both ranks run on the same node.
    pub same_node: bool,
    /// Both ranks drive the same GPU (multi-process testing on one device).
    pub same_device: bool,
    /// NVLink links between the two GPUs (0: none).
    pub nvlinks: u32,
    /// The PCIe path class.
    pub pcie: PciePath,
    /// The GPUs can access each other's memory directly (P2P).
    pub p2p: bool,
    /// Native atomics work across the link.
    pub peer_atomics: bool,
    /// Both ranks drive a GPU: with `p2p` false, GPUs that reach each other only through
    /// host memory. False between host-only ranks (and in topology files written before
    /// the field existed, which read as host memory, as they did then).
    #[serde(default)]
    pub gpus: bool,
}

impl Link {
    /// Host memory of one node, no GPU: shared-memory backends reach the peer.
    pub const HOST: Link = Link {
        same_node: true,
        same_device: false,
        nvlinks: 0,
        pcie: PciePath::Unknown,
        p2p: false,
        peer_atomics: true,
        gpus: false,
    };

    /// Two GPUs of one node joined by `nvlinks` NVLinks (H100/H200 SXM boards: 18).
    pub const fn nvlink(nvlinks: u32) -> Link {
        Link {
            same_node: true,
            same_device: false,
            nvlinks,
            pcie: PciePath::Unknown,
            p2p: true,
            peer_atomics: true,
            gpus: true,
        }
    }

    /// Two GPUs of one node on PCIe only, with P2P access along `path`.
    pub const fn pcie(path: PciePath) -> Link {
        Link {
            same_node: true,
            same_device: false,
            nvlinks: 0,
            pcie: path,
            p2p: true,
            peer_atomics: false,
            gpus: true,
        }
    }

    /// Two GPUs of one node along `path` that cannot access each other's memory
    /// (`cuDeviceCanAccessPeer` false: consumer cards, PCIe across sockets, virtual
    /// machines): peer-memory kernels reach each other only through mapped host memory.
    pub const fn no_p2p(path: PciePath) -> Link {
        Link {
            p2p: false,
            ..Link::pcie(path)
        }
    }

    /// Two ranks driving the same GPU.
    pub const SAME_DEVICE: Link = Link {
        same_node: true,
        same_device: true,
        nvlinks: 0,
        pcie: PciePath::Unknown,
        p2p: true,
        peer_atomics: true,
        gpus: true,
    };

    /// Ranks on different nodes.
    pub const REMOTE: Link = Link {
        same_node: false,
        same_device: false,
        nvlinks: 0,
        pcie: PciePath::Unknown,
        p2p: false,
        peer_atomics: false,
        gpus: false,
    };
}

/// The links between every pair of ranks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Topology {
    /// Node index of every rank.
    pub nodes: Vec<usize>,
    /// `links[i][j]`: the link from rank `i` to rank `j` (`links[i][i]` is unused).
    pub links: Vec<Vec<Link>>,
}

/// The kind of fabric every pair of ranks shares, as far as selection cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fabric {
    /// One rank only.
    Single,
    /// Every rank drives the same GPU (multi-process testing on one device).
    SameDevice,
    /// GPUs of one node, all pairs joined by NVLink.
    NvLink,
    /// GPUs of one node, PCIe only, P2P possible between all pairs.
    Pcie,
    /// GPUs of one node, some pair without P2P: peer memory only through host memory
    /// mapped into the GPUs (comm-symm's host-mapped backing), NCCL through its shared-
    /// memory transport.
    NoP2p,
    /// Host ranks of one node (no GPUs): shared host memory.
    HostMemory,
    /// Ranks span several nodes.
    MultiNode,
}

impl Fabric {
    /// The word a tuning table's `fabric` holds: `single`, `same-device`, `nvlink`, `pcie`,
    /// `no-p2p`, `host` or `multi-node`.
    pub const fn name(self) -> &'static str {
        match self {
            Fabric::Single => "single",
            Fabric::SameDevice => "same-device",
            Fabric::NvLink => "nvlink",
            Fabric::Pcie => "pcie",
            Fabric::NoP2p => "no-p2p",
            Fabric::HostMemory => "host",
            Fabric::MultiNode => "multi-node",
        }
    }
}

impl std::fmt::Display for Fabric {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl Topology {
    /// `world` ranks, every pair joined by `link`, all on node 0 unless `link` is remote.
    pub fn uniform(world: usize, link: Link) -> Self {
        let nodes = if link.same_node {
            vec![0; world]
        } else {
            (0..world).collect()
        };
        Topology {
            nodes,
            links: vec![vec![link; world]; world],
        }
    }

    /// Number of ranks.
    pub fn world_size(&self) -> usize {
        self.nodes.len()
    }

    /// Ranks on the node with the most ranks.
    pub fn max_ranks_per_node(&self) -> usize {
        let mut counts = std::collections::BTreeMap::new();
        for n in &self.nodes {
            *counts.entry(n).or_insert(0usize) += 1;
        }
        counts.values().copied().max().unwrap_or(0)
    }

    /// Checks that the matrix is square and matches the node list.
    pub fn validate(&self) -> Result<()> {
        let n = self.nodes.len();
        if self.links.len() != n || self.links.iter().any(|row| row.len() != n) {
            return Err(Error::InvalidArgument(format!(
                "topology: links must be a {n} x {n} matrix"
            )));
        }
        for i in 0..n {
            for j in 0..n {
                if i != j && self.links[i][j].same_node != (self.nodes[i] == self.nodes[j]) {
                    return Err(Error::InvalidArgument(format!(
                        "topology: link {i}->{j} disagrees with the node list"
                    )));
                }
            }
        }
        Ok(())
    }

    /// What all pairs have in common, for the cost model.
    pub fn fabric(&self) -> Fabric {
        let n = self.world_size();
        if n <= 1 {
            return Fabric::Single;
        }
        let pairs =
            || (0..n).flat_map(move |i| (0..n).filter(move |&j| j != i).map(move |j| (i, j)));
        let links = |f: fn(&Link) -> bool| pairs().all(|(i, j)| f(&self.links[i][j]));
        if !links(|l| l.same_node) {
            Fabric::MultiNode
        } else if links(|l| l.same_device) {
            Fabric::SameDevice
        } else if links(|l| l.nvlinks > 0) {
            Fabric::NvLink
        } else if links(|l| l.p2p) {
            Fabric::Pcie
        } else if links(|l| l.gpus) {
            Fabric::NoP2p
        } else {
            Fabric::HostMemory
        }
    }

    /// The PCIe class that most pairs share (for contention: one switch or several).
    pub fn dominant_pcie_path(&self) -> PciePath {
        let n = self.world_size();
        let mut counts = std::collections::HashMap::new();
        for i in 0..n {
            for j in (0..n).filter(|&j| j != i) {
                *counts.entry(self.links[i][j].pcie).or_insert(0usize) += 1;
            }
        }
        counts
            .into_iter()
            .max_by_key(|&(path, c)| (c, path as u8))
            .map_or(PciePath::Unknown, |(path, _)| path)
    }

    /// Reads a topology written by [`Topology::save`].
    pub fn load(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path)?;
        let topology: Topology = serde_json::from_str(&text).map_err(|e| {
            Error::InvalidArgument(format!("topology file {}: {e}", path.display()))
        })?;
        topology.validate()?;
        Ok(topology)
    }

    /// Writes the topology as JSON.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        std::fs::write(path, self.to_json())?;
        Ok(())
    }

    /// Pretty JSON, as [`Topology::save`] writes it.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("topology serialises")
    }

    /// Builds the full picture from every rank's own row: rank `r` contributes its node id
    /// and its links to every rank; every rank returns the same matrix.
    pub fn agree(bootstrap: &dyn Bootstrap, node: usize, row: Vec<Link>) -> Result<Self> {
        let world = bootstrap.world_size();
        if row.len() != world {
            return Err(Error::InvalidArgument(format!(
                "topology row has {} links, world is {world}",
                row.len()
            )));
        }
        let mine = serde_json::to_vec(&(node, row)).expect("row serialises");
        let mut nodes = Vec::with_capacity(world);
        let mut links = Vec::with_capacity(world);
        for bytes in bootstrap.all_gather_bytes(&mine)? {
            let (node, row): (usize, Vec<Link>) = serde_json::from_slice(&bytes)
                .map_err(|e| Error::Bootstrap(format!("malformed topology row: {e}")))?;
            nodes.push(node);
            links.push(row);
        }
        let topology = Topology { nodes, links };
        topology.validate()?;
        Ok(topology)
    }
}

impl std::fmt::Display for Topology {
    /// A matrix like `nvidia-smi topo -m`: NV# for NVLink, the PCIe class, NOP2P for GPUs
    /// without peer access, SHM for host memory, NET across nodes, X on the diagonal.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = self.world_size();
        write!(f, "      ")?;
        for j in 0..n {
            write!(f, "{:>6}", format!("r{j}"))?;
        }
        writeln!(f)?;
        for i in 0..n {
            write!(f, "{:<6}", format!("r{i}"))?;
            for j in 0..n {
                let l = &self.links[i][j];
                let cell = if i == j {
                    "X".to_string()
                } else if !l.same_node {
                    "NET".to_string()
                } else if l.same_device {
                    "SAME".to_string()
                } else if l.nvlinks > 0 {
                    format!("NV{}", l.nvlinks)
                } else if l.p2p {
                    format!("{:?}", l.pcie).to_uppercase()
                } else if l.gpus {
                    "NOP2P".to_string()
                } else {
                    "SHM".to_string()
                };
                write!(f, "{cell:>6}")?;
            }
            writeln!(f)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fabric_classification() {
        assert_eq!(Topology::uniform(1, Link::HOST).fabric(), Fabric::Single);
        assert_eq!(
            Topology::uniform(8, Link::nvlink(18)).fabric(),
            Fabric::NvLink
        );
        assert_eq!(
            Topology::uniform(8, Link::pcie(PciePath::Pxb)).fabric(),
            Fabric::Pcie
        );
        assert_eq!(
            Topology::uniform(4, Link::HOST).fabric(),
            Fabric::HostMemory
        );
        assert_eq!(
            Topology::uniform(4, Link::REMOTE).fabric(),
            Fabric::MultiNode
        );
        assert_eq!(
            Topology::uniform(4, Link::no_p2p(PciePath::Sys)).fabric(),
            Fabric::NoP2p
        );
        assert_eq!(Fabric::NvLink.to_string(), "nvlink");
        assert_eq!(Fabric::HostMemory.name(), "host");
        assert_eq!(Fabric::NoP2p.name(), "no-p2p");
    }

    /// `n` GPUs of one node whose pair `(i, j)` has P2P where `p2p(i, j)` says so (what the
    /// probe asks `cuDeviceCanAccessPeer`).
    fn gpus_with_p2p(n: usize, p2p: impl Fn(usize, usize) -> bool) -> Topology {
        let link = |i, j| {
            if p2p(i, j) {
                Link::pcie(PciePath::Node)
            } else {
                Link::no_p2p(PciePath::Sys)
            }
        };
        Topology {
            nodes: vec![0; n],
            links: (0..n)
                .map(|i| (0..n).map(|j| link(i, j)).collect())
                .collect(),
        }
    }

    #[test]
    fn one_pair_without_p2p_makes_the_fabric_no_p2p() {
        assert_eq!(gpus_with_p2p(4, |_, _| true).fabric(), Fabric::Pcie);
        // Two sockets, P2P within each, none across.
        let two_sockets = gpus_with_p2p(4, |i, j| i / 2 == j / 2);
        assert_eq!(two_sockets.fabric(), Fabric::NoP2p);
        assert!(two_sockets.to_string().contains("NOP2P"));
        // One direction missing is enough: a kernel of that rank cannot reach its peer.
        assert_eq!(
            gpus_with_p2p(2, |i, j| !(i == 1 && j == 0)).fabric(),
            Fabric::NoP2p
        );
        // NVLink-bridged pairs without P2P between them, and ranks sharing a GPU beside
        // GPUs that cannot reach it: still some pair without P2P.
        let mut bridged = gpus_with_p2p(3, |i, j| i < 2 && j < 2);
        bridged.links[0][1] = Link::nvlink(4);
        bridged.links[1][0] = Link::nvlink(4);
        assert_eq!(bridged.fabric(), Fabric::NoP2p);
        let mut shared = gpus_with_p2p(3, |_, _| false);
        shared.links[0][1] = Link::SAME_DEVICE;
        shared.links[1][0] = Link::SAME_DEVICE;
        assert_eq!(shared.fabric(), Fabric::NoP2p);
    }

    #[test]
    fn topology_files_without_the_gpus_field_read_as_before() {
        let old = r#"{"nodes":[0,0],"links":[[
            {"same_node":true,"same_device":false,"nvlinks":0,"pcie":"SYS","p2p":false,"peer_atomics":false},
            {"same_node":true,"same_device":false,"nvlinks":0,"pcie":"SYS","p2p":false,"peer_atomics":false}],[
            {"same_node":true,"same_device":false,"nvlinks":0,"pcie":"SYS","p2p":false,"peer_atomics":false},
            {"same_node":true,"same_device":false,"nvlinks":0,"pcie":"SYS","p2p":false,"peer_atomics":false}]]}"#;
        let t: Topology = serde_json::from_str(old).unwrap();
        assert_eq!(t.fabric(), Fabric::HostMemory);
        let t = Topology::uniform(2, Link::no_p2p(PciePath::Sys));
        let back: Topology = serde_json::from_str(&t.to_json()).unwrap();
        assert_eq!((back.fabric(), back), (Fabric::NoP2p, t));
    }

    #[test]
    fn json_round_trip_and_validation() {
        let t = Topology::uniform(3, Link::pcie(PciePath::Pix));
        let back: Topology = serde_json::from_str(&t.to_json()).unwrap();
        assert_eq!(back, t);
        assert!(t.to_json().contains("\"PIX\""));
        let mut bad = t.clone();
        bad.links.pop();
        assert!(bad.validate().is_err());
        assert!(t.to_string().contains("PIX"));
    }

    #[test]
    fn every_rank_agrees_on_the_same_picture() {
        let handles: Vec<_> = comm_core::ThreadsBootstrap::create(3)
            .into_iter()
            .map(|b| {
                std::thread::spawn(move || {
                    let row = (0..3)
                        .map(|j| {
                            if j == b.rank() {
                                Link::HOST
                            } else {
                                Link::nvlink(b.rank() as u32 + 1)
                            }
                        })
                        .collect();
                    Topology::agree(&b, 0, row).unwrap()
                })
            })
            .collect();
        let all: Vec<Topology> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        assert!(all.iter().all(|t| *t == all[0]));
        assert_eq!(all[0].links[2][0].nvlinks, 3);
    }
}
