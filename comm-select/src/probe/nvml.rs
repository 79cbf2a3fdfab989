//! The few NVML queries topology needs, through `nvml-wrapper` (which opens
//! `libnvidia-ml.so.1` at run time).
//!
//! NVML tells what CUDA does not: whether two GPUs talk over NVLink (directly or through
//! NVSwitch), how many links a GPU has up, and the PCIe path between two GPUs (the classes
//! of `nvidia-smi topo -m`). A missing library or a failing call only means "unknown":
//! probing never fails because of NVML.

use std::sync::OnceLock;

use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::{P2pCapabilitiesIndex, P2pStatus, TopologyLevel};

use crate::topology::PciePath;

/// Links NVML is asked about; GPUs have at most this many (H100/H200: 18).
const MAX_LINKS: u32 = 18;

/// NVML, initialised once per process; `None` where the library or the driver is missing.
fn nvml() -> Option<&'static Nvml> {
    static NVML: OnceLock<Option<Nvml>> = OnceLock::new();
    NVML.get_or_init(|| Nvml::init().ok()).as_ref()
}

/// What NVML says about the pair of GPUs with these PCI bus ids; `None` without NVML.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PairInfo {
    /// Active NVLinks of the first GPU when the pair can use NVLink P2P (through NVSwitch
    /// every link of the GPU serves every peer), else 0.
    pub nvlinks: u32,
    /// The PCIe path class.
    pub pcie: PciePath,
    /// Whether the first GPU can read the second's memory (P2P), `None` where NVML cannot
    /// tell: CUDA's answer where both GPUs are visible, this where one is hidden from the
    /// process (`CUDA_VISIBLE_DEVICES`), as NCCL does.
    pub p2p: Option<bool>,
}

/// Queries NVML about two GPUs given by PCI bus id (`0000:18:00.0`).
pub fn pair(bus_a: &str, bus_b: &str) -> Option<PairInfo> {
    let nvml = nvml()?;
    let a = nvml.device_by_pci_bus_id(bus_a).ok()?;
    let b = nvml.device_by_pci_bus_id(bus_b).ok()?;
    let nvlink_p2p = matches!(
        a.p2p_status(&b, P2pCapabilitiesIndex::NvLink),
        Ok(P2pStatus::Ok)
    );
    let nvlinks = if nvlink_p2p {
        // Links beyond the GPU's count answer with an error: not active.
        (0..MAX_LINKS)
            .filter(|&link| a.link_wrapper_for(link).is_active().unwrap_or(false))
            .count() as u32
    } else {
        0
    };
    let p2p = a
        .p2p_status(&b, P2pCapabilitiesIndex::Read)
        .ok()
        .map(|status| status == P2pStatus::Ok);
    let pcie = match a.topology_common_ancestor(b) {
        Ok(TopologyLevel::Internal | TopologyLevel::Single) => PciePath::Pix,
        Ok(TopologyLevel::Multiple) => PciePath::Pxb,
        Ok(TopologyLevel::HostBridge) => PciePath::Phb,
        Ok(TopologyLevel::Node) => PciePath::Node,
        Ok(TopologyLevel::System) => PciePath::Sys,
        _ => PciePath::Unknown,
    };
    Some(PairInfo { nvlinks, pcie, p2p })
}
