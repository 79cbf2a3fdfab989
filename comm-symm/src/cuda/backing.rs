//! [`Backing`]: how the device heap's segments are allocated and shared, and how the ranks
//! choose one together.
//!
//! Before anything is allocated, every rank tells the others what it can use (an
//! [`Offer`]): VMM with descriptor handles, host memory registered with its device, its
//! device's UUID, and for every device its process sees whether its own device can access
//! that device's memory (`cuDeviceCanAccessPeer`; ranks on one device always can). Every
//! rank derives the same choice from the same offers ([`choose`]), so the ranks never
//! disagree about it: `auto` takes host memory as soon as one pair of ranks' devices cannot
//! access each other (a device a process cannot see counts as reachable: the driver cannot
//! be asked about it, and the device backings keep working where isolation hides peers),
//! VMM where every rank has it, legacy CUDA IPC otherwise.

use comm_core::cuda::cudarc::driver::{CudaContext, result, sys};
use comm_core::{Error, Result};

use super::host_mapped;
use super::segment::vmm_supported;

/// How segments are allocated and shared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Backing {
    /// Host memory when some pair of ranks' devices cannot access each other; else VMM
    /// when every rank's device supports it, legacy CUDA IPC otherwise.
    Auto,
    /// `cuMemCreate` + POSIX file descriptors.
    Vmm,
    /// `cuMemAlloc` + CUDA IPC handles.
    LegacyIpc,
    /// Shared host memory (`memfd`) registered with every rank's device: kernels reach
    /// every rank's segment over PCIe, through the host, without peer access.
    HostMapped,
    /// Host memory from `cuMemCreate` on the host NUMA node nearest each rank's device,
    /// shared by file descriptors as [`Backing::Vmm`] shares device memory: reached like
    /// [`Backing::HostMapped`], without peer access, but mapped by the driver in large
    /// pages rather than registered page by page.
    HostVmm,
}

impl Backing {
    /// `auto`, `vmm`, `ipc`, `host` or `host-vmm`.
    pub fn parse(s: &str) -> Result<Self> {
        match s.trim() {
            "" | "auto" => Ok(Backing::Auto),
            "vmm" => Ok(Backing::Vmm),
            "ipc" | "legacy" => Ok(Backing::LegacyIpc),
            "host" | "host-mapped" => Ok(Backing::HostMapped),
            "host-vmm" => Ok(Backing::HostVmm),
            other => Err(Error::InvalidArgument(format!(
                "unknown symm backing `{other}` (auto, vmm, ipc, host or host-vmm)"
            ))),
        }
    }

    /// The word [`Backing::parse`] reads.
    pub const fn name(self) -> &'static str {
        match self {
            Backing::Auto => "auto",
            Backing::Vmm => "vmm",
            Backing::LegacyIpc => "ipc",
            Backing::HostMapped => "host",
            Backing::HostVmm => "host-vmm",
        }
    }
}

/// A device UUID.
type Uuid = [u8; 16];

/// What one rank can use, as it tells the others.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Offer {
    /// VMM with POSIX descriptor handles.
    pub(crate) vmm: bool,
    /// Host memory can be registered with and mapped into the device.
    pub(crate) host: bool,
    /// This rank's device.
    pub(crate) device: Uuid,
    /// Every device this rank's process sees, and whether this rank's device can access
    /// its memory.
    pub(crate) reach: Vec<(Uuid, bool)>,
}

impl Offer {
    /// What this rank's device (`ctx`) can use.
    pub(crate) fn local(ctx: &CudaContext) -> Self {
        Offer {
            vmm: vmm_supported(ctx),
            host: host_mapped::supported(ctx),
            device: comm_peer::uuid(ctx),
            reach: reach(ctx),
        }
    }

    /// `[vmm, host, device (16), n, n x (uuid (16), reachable)]`.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut m = vec![u8::from(self.vmm), u8::from(self.host)];
        m.extend_from_slice(&self.device);
        m.push(self.reach.len().min(usize::from(u8::MAX)) as u8);
        for (uuid, can) in self.reach.iter().take(usize::from(u8::MAX)) {
            m.extend_from_slice(uuid);
            m.push(u8::from(*can));
        }
        m
    }

    /// The inverse of [`Offer::encode`].
    pub(crate) fn decode(m: &[u8]) -> Result<Self> {
        let malformed = || Error::Bootstrap(format!("symm: malformed backing offer ({m:?})"));
        let (&[vmm, host], rest) = m.split_first_chunk::<2>().ok_or_else(malformed)?;
        let (device, rest) = rest.split_first_chunk::<16>().ok_or_else(malformed)?;
        let (&n, rest) = rest.split_first().ok_or_else(malformed)?;
        if rest.len() != usize::from(n) * 17 {
            return Err(malformed());
        }
        let reach = rest
            .chunks_exact(17)
            .map(|e| {
                let (uuid, can) = e.split_first_chunk::<16>().expect("17 bytes");
                (*uuid, can == [1])
            })
            .collect();
        Ok(Offer {
            vmm: vmm == 1,
            host: host == 1,
            device: *device,
            reach,
        })
    }

    /// Whether this rank's device can access the memory of `other`'s: `None` when
    /// `other`'s device is not visible to this rank's process.
    fn reaches(&self, other: &Offer) -> Option<bool> {
        if self.device == other.device {
            return Some(true);
        }
        self.reach
            .iter()
            .find(|(uuid, _)| *uuid == other.device)
            .map(|&(_, can)| can)
    }
}

/// The first pair of ranks `(a, b)` whose devices are known not to reach each other (in
/// either direction).
pub(crate) fn blocked_pair(offers: &[Offer]) -> Option<(usize, usize)> {
    (0..offers.len())
        .flat_map(|a| (0..offers.len()).map(move |b| (a, b)))
        .find(|&(a, b)| a != b && offers[a].reaches(&offers[b]) == Some(false))
}

/// The backing every rank uses: the same on every rank, given the same offers.
pub(crate) fn choose(requested: Backing, offers: &[Offer]) -> Result<Backing> {
    let blocked = blocked_pair(offers);
    let without = |what: &str, has: fn(&Offer) -> bool| {
        offers.iter().position(|o| !has(o)).map(|r| {
            Error::Unsupported(format!(
                "symm: rank {r}'s device cannot use {what} (backing {})",
                requested.name()
            ))
        })
    };
    let host = || match without("host memory mapped into it", |o| o.host) {
        Some(e) => Err(e),
        None => Ok(Backing::HostMapped),
    };
    let peer_access = |chosen: Backing| match blocked {
        Some((a, b)) => Err(Error::Unsupported(format!(
            "symm: rank {a}'s device cannot access rank {b}'s (no peer access): the {} \
             backing needs it; the host backing does not (COMM_SYMM_BACKING=host)",
            chosen.name()
        ))),
        None => Ok(chosen),
    };
    match requested {
        Backing::HostMapped => host(),
        Backing::Auto if blocked.is_some() => host(),
        Backing::Auto if offers.iter().all(|o| o.vmm) => Ok(Backing::Vmm),
        Backing::Auto | Backing::LegacyIpc => peer_access(Backing::LegacyIpc),
        Backing::Vmm => match without("VMM with descriptor handles", |o| o.vmm) {
            Some(e) => Err(e),
            None => peer_access(Backing::Vmm),
        },
        // Host memory: no peer access needed.
        Backing::HostVmm => match without("VMM with descriptor handles", |o| o.vmm) {
            Some(e) => Err(e),
            None => Ok(Backing::HostVmm),
        },
    }
}

/// Every device this process sees, and whether `ctx`'s device can access its memory. A
/// device the driver cannot answer about is left out (it counts as unknown).
fn reach(ctx: &CudaContext) -> Vec<(Uuid, bool)> {
    let own = ctx.cu_device();
    let count = result::device::get_count().unwrap_or(0).max(0);
    (0..count)
        .filter_map(|ordinal| {
            let dev = result::device::get(ordinal).ok()?;
            let uuid = result::device::get_uuid(dev).ok()?.bytes.map(|b| b as u8);
            if dev == own {
                return Some((uuid, true));
            }
            let mut can = 0;
            // SAFETY: valid out-pointer; both handles come from the driver.
            let asked = unsafe { sys::cuDeviceCanAccessPeer(&mut can, own, dev) };
            (asked == sys::CUresult::CUDA_SUCCESS).then_some((uuid, can != 0))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ranks on devices `devices[r]` of one process, where `p2p[i][j]` says whether
    /// device i can access device j.
    fn offers(devices: &[u8], p2p: &[&[bool]], vmm: bool) -> Vec<Offer> {
        let uuid = |d: u8| [d + 1; 16];
        devices
            .iter()
            .map(|&d| Offer {
                vmm,
                host: true,
                device: uuid(d),
                reach: p2p[usize::from(d)]
                    .iter()
                    .enumerate()
                    .map(|(j, &can)| (uuid(j as u8), can || usize::from(d) == j))
                    .collect(),
            })
            .collect()
    }

    const ALL: &[&[bool]] = &[&[true, true], &[true, true]];
    const NONE: &[&[bool]] = &[&[false, false], &[false, false]];
    const ONE_WAY: &[&[bool]] = &[&[true, true], &[false, true]];

    #[test]
    fn parse_reads_every_name() {
        for b in [
            Backing::Auto,
            Backing::Vmm,
            Backing::LegacyIpc,
            Backing::HostMapped,
            Backing::HostVmm,
        ] {
            assert_eq!(Backing::parse(b.name()).unwrap(), b);
        }
        assert_eq!(Backing::parse("").unwrap(), Backing::Auto);
        assert_eq!(
            Backing::parse(" host-mapped ").unwrap(),
            Backing::HostMapped
        );
        assert_eq!(Backing::parse("legacy").unwrap(), Backing::LegacyIpc);
        assert!(Backing::parse("nvshmem").is_err());
    }

    #[test]
    fn offers_round_trip_and_reject_garbage() {
        for offer in offers(&[0, 1], ONE_WAY, true).into_iter().chain([Offer {
            vmm: false,
            host: false,
            device: [7; 16],
            reach: Vec::new(),
        }]) {
            assert_eq!(Offer::decode(&offer.encode()).unwrap(), offer);
        }
        let good = offers(&[0], ALL, true)[0].encode();
        for bad in [&good[..1], &good[..18], &good[..good.len() - 1]] {
            assert!(Offer::decode(bad).is_err());
        }
    }

    #[test]
    fn auto_takes_host_memory_when_some_pair_has_no_peer_access() {
        assert_eq!(
            choose(Backing::Auto, &offers(&[0, 1], NONE, true)).unwrap(),
            Backing::HostMapped
        );
        // One direction suffices: a kernel of either rank reaches into the other's memory.
        assert_eq!(blocked_pair(&offers(&[0, 1], ONE_WAY, true)), Some((1, 0)));
        assert_eq!(
            choose(Backing::Auto, &offers(&[0, 1], ONE_WAY, true)).unwrap(),
            Backing::HostMapped
        );
    }

    #[test]
    fn host_vmm_needs_vmm_everywhere_but_no_peer_access() {
        assert_eq!(
            choose(Backing::HostVmm, &offers(&[0, 1], NONE, true)).unwrap(),
            Backing::HostVmm
        );
        let err = choose(Backing::HostVmm, &offers(&[0, 1], NONE, false)).unwrap_err();
        assert!(matches!(err, Error::Unsupported(_)), "{err}");
        // Never chosen unless asked for: auto keeps registered host memory.
        assert_eq!(
            choose(Backing::Auto, &offers(&[0, 1], NONE, true)).unwrap(),
            Backing::HostMapped
        );
    }

    #[test]
    fn auto_keeps_device_memory_where_every_pair_has_peer_access() {
        assert_eq!(
            choose(Backing::Auto, &offers(&[0, 1], ALL, true)).unwrap(),
            Backing::Vmm
        );
        assert_eq!(
            choose(Backing::Auto, &offers(&[0, 1], ALL, false)).unwrap(),
            Backing::LegacyIpc
        );
        // Ranks on one device always reach each other, whatever the matrix says of others.
        assert_eq!(
            choose(Backing::Auto, &offers(&[1, 1, 1], NONE, true)).unwrap(),
            Backing::Vmm
        );
        // A peer device this process cannot see (isolated ranks) is not held against it.
        let mut hidden = offers(&[0, 1], NONE, true);
        hidden
            .iter_mut()
            .for_each(|o| o.reach.retain(|e| e.0 == o.device));
        assert_eq!(blocked_pair(&hidden), None);
        assert_eq!(choose(Backing::Auto, &hidden).unwrap(), Backing::Vmm);
    }

    #[test]
    fn forced_backings_are_honoured_or_refused_clearly() {
        let p2p = offers(&[0, 1], ALL, true);
        let none = offers(&[0, 1], NONE, true);
        assert_eq!(
            choose(Backing::HostMapped, &p2p).unwrap(),
            Backing::HostMapped
        );
        assert_eq!(
            choose(Backing::LegacyIpc, &p2p).unwrap(),
            Backing::LegacyIpc
        );
        assert_eq!(choose(Backing::Vmm, &p2p).unwrap(), Backing::Vmm);
        for forced in [Backing::Vmm, Backing::LegacyIpc] {
            let e = choose(forced, &none).unwrap_err().to_string();
            assert!(e.contains("no peer access") && e.contains("host"), "{e}");
        }
        let e = choose(Backing::Vmm, &offers(&[0, 1], ALL, false)).unwrap_err();
        assert!(e.to_string().contains("VMM"), "{e}");
        let mut no_host = none.clone();
        no_host[1].host = false;
        for requested in [Backing::Auto, Backing::HostMapped] {
            let e = choose(requested, &no_host).unwrap_err().to_string();
            assert!(e.contains("rank 1") && e.contains("host memory"), "{e}");
        }
    }
}
