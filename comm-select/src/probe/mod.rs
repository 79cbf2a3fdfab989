//! Probing the topology: which ranks share a node, a GPU, NVLink or a PCIe switch.
//!
//! Every rank contributes its identity (host name, and with feature `cuda` its GPU's PCI
//! bus id); then each rank classifies its links to every peer from its own point of view,
//! through CUDA (peer access, native peer atomics) and NVML (NVLink, PCIe path class), and
//! the rows are exchanged so that every rank holds the same matrix
//! ([`Topology::agree`]). GPUs that cannot access each other's memory (P2P) make the
//! fabric `no-p2p`. Nothing here panics without a GPU or without the libraries: what cannot
//! be probed is reported as unknown or as plain host memory.

#[cfg(feature = "cuda")]
mod nvml;

use comm_core::{Bootstrap, Error, Result};
use serde::{Deserialize, Serialize};

use crate::topology::{Link, Topology};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Identity {
    host: String,
    bus_id: Option<String>,
    /// Why this rank's GPU could not be named: every rank fails after the exchange, rather
    /// than this one leaving before it while its peers wait there.
    failure: Option<String>,
}

/// Collective: probes the links between every pair of ranks. `device` is the CUDA ordinal
/// this rank uses (`None`: a host-only rank).
pub fn probe(bootstrap: &dyn Bootstrap, device: Option<usize>) -> Result<Topology> {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .or_else(|_| std::env::var("HOSTNAME"))
        .unwrap_or_else(|_| "localhost".into());
    let (bus_id, failed) = match device.map(gpu::bus_id) {
        Some(Ok(bus_id)) => (bus_id, None),
        Some(Err(e)) => (None, Some(e)),
        None => (None, None),
    };
    let failure = failed.as_ref().map(ToString::to_string);
    let me = Identity {
        host,
        bus_id,
        failure,
    };
    let all: Vec<Identity> = bootstrap
        .all_gather_bytes(&serde_json::to_vec(&me).expect("identity serialises"))?
        .iter()
        .map(|b| serde_json::from_slice(b))
        .collect::<Result<_, _>>()
        .map_err(|e| Error::Bootstrap(format!("malformed topology identity: {e}")))?;
    if let Some(e) = failed {
        return Err(e);
    }
    let failure = all
        .iter()
        .enumerate()
        .find_map(|(rank, id)| Some((rank, id.failure.as_ref()?)));
    if let Some((rank, why)) = failure {
        return Err(Error::Unsupported(format!(
            "probe: rank {rank} could not name its GPU: {why}"
        )));
    }
    let node = |id: &Identity| all.iter().position(|o| o.host == id.host).expect("present");
    let row = all
        .iter()
        .map(|peer| {
            if peer.host != me.host {
                return Link::REMOTE;
            }
            match (&me.bus_id, &peer.bus_id, device) {
                (Some(a), Some(b), _) if a == b => Link::SAME_DEVICE,
                (Some(a), Some(b), Some(ordinal)) => gpu::link(ordinal, a, b),
                _ => Link::HOST,
            }
        })
        .collect();
    Topology::agree(bootstrap, node(&me), row)
}

#[cfg(feature = "cuda")]
mod gpu {
    use std::ffi::{CStr, c_char};

    use comm_core::cuda::cudarc::driver::{result, sys};
    use comm_core::cuda::{driver_error, probe};
    use comm_core::{Error, Result};

    use super::nvml;
    use crate::topology::{Link, PciePath};

    /// The PCI bus id of CUDA device `ordinal` (`0000:18:00.0`).
    pub(super) fn bus_id(ordinal: usize) -> Result<Option<String>> {
        probe::driver()?;
        let dev = result::device::get(ordinal as i32).map_err(driver_error)?;
        let mut buf = [0 as c_char; 32];
        // SAFETY: the buffer holds 32 bytes, as passed; the driver NUL-terminates.
        let r = unsafe { sys::cuDeviceGetPCIBusId(buf.as_mut_ptr(), buf.len() as i32, dev) };
        if r != sys::CUresult::CUDA_SUCCESS {
            return Err(Error::backend(
                "cuda",
                format!("cuDeviceGetPCIBusId: {r:?}"),
            ));
        }
        // SAFETY: NUL-terminated by the driver.
        let id = unsafe { CStr::from_ptr(buf.as_ptr()) };
        Ok(Some(id.to_string_lossy().to_lowercase()))
    }

    /// The link from this rank's GPU to the GPU with bus id `peer`, as seen from here:
    /// NVLink and PCIe class from NVML, P2P and native atomics from CUDA (from NVML where
    /// the peer's GPU is hidden from this process; without P2P where neither can tell).
    pub(super) fn link(ordinal: usize, mine: &str, peer: &str) -> Link {
        let info = nvml::pair(mine, peer);
        let mut link = Link::no_p2p(info.map_or(PciePath::Unknown, |i| i.pcie));
        link.nvlinks = info.map_or(0, |i| i.nvlinks);
        match access(ordinal, peer) {
            Some((p2p, atomics)) => (link.p2p, link.peer_atomics) = (p2p, atomics),
            None => link.p2p = info.and_then(|i| i.p2p).unwrap_or(false),
        }
        link
    }

    /// Whether CUDA device `ordinal` can access the memory of the GPU with bus id `peer`,
    /// and use native atomics on it; `None` when the peer's GPU is invisible to this
    /// process (`CUDA_VISIBLE_DEVICES`) or the driver cannot tell.
    fn access(ordinal: usize, peer: &str) -> Option<(bool, bool)> {
        let c_peer = std::ffi::CString::new(peer).ok()?;
        let me = result::device::get(ordinal as i32).ok()?;
        let mut other = 0 as sys::CUdevice;
        // SAFETY: valid C string and out-pointer.
        if unsafe { sys::cuDeviceGetByPCIBusId(&mut other, c_peer.as_ptr()) }
            != sys::CUresult::CUDA_SUCCESS
        {
            return None;
        }
        let attribute = |attr| {
            let mut value = 0;
            // SAFETY: valid devices and out-pointer.
            let r = unsafe { sys::cuDeviceGetP2PAttribute(&mut value, attr, me, other) };
            (r == sys::CUresult::CUDA_SUCCESS).then_some(value == 1)
        };
        Some((
            attribute(sys::CUdevice_P2PAttribute::CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED)?,
            attribute(sys::CUdevice_P2PAttribute::CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED)
                .unwrap_or(false),
        ))
    }
}

#[cfg(not(feature = "cuda"))]
mod gpu {
    use comm_core::{Error, Result};

    use crate::topology::Link;

    pub(super) fn bus_id(_ordinal: usize) -> Result<Option<String>> {
        Err(Error::Unsupported(
            "probing GPUs needs comm-select's feature `cuda`".into(),
        ))
    }

    pub(super) fn link(_ordinal: usize, _mine: &str, _peer: &str) -> Link {
        Link::HOST
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::Fabric;

    #[test]
    fn a_gpu_that_cannot_be_named_fails_every_rank_at_once() {
        let started = std::time::Instant::now();
        let bound = std::time::Duration::from_secs(20);
        let handles: Vec<_> = comm_core::ThreadsBootstrap::with_timeout(3, bound)
            .into_iter()
            .map(|b| {
                // No machine has a GPU of ordinal 999 (nor a build without `cuda` any).
                let device = (b.rank() == 1).then_some(999);
                std::thread::spawn(move || probe(&b, device))
            })
            .collect();
        for (rank, h) in handles.into_iter().enumerate() {
            match h.join().unwrap() {
                Err(Error::Bootstrap(e)) => panic!("rank {rank} waited: {e}"),
                Err(e) if rank != 1 => assert!(e.to_string().contains("rank 1"), "{e}"),
                Err(_) => {}
                Ok(t) => panic!("rank {rank} probed {t:?}"),
            }
        }
        assert!(started.elapsed() < bound / 2);
    }

    #[test]
    fn host_ranks_of_one_machine_share_host_memory() {
        let handles: Vec<_> = comm_core::ThreadsBootstrap::create(3)
            .into_iter()
            .map(|b| std::thread::spawn(move || probe(&b, None).unwrap()))
            .collect();
        let all: Vec<Topology> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        assert!(all.iter().all(|t| *t == all[0]));
        assert_eq!(all[0].fabric(), Fabric::HostMemory);
        assert_eq!(all[0].nodes, vec![0, 0, 0]);
    }
}
