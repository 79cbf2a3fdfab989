//! [`DeviceHeap`]: the device symmetric heap of the local ranks.
//!
//! [`DeviceHeap::rendezvous`] is collective: every rank allocates a segment of the same
//! size (header + data, see `comm_peer::layout`), the ranks agree on the backing (see
//! `backing`: host memory where some pair of devices cannot access each other, else VMM
//! when every rank can, else legacy CUDA IPC), exchange descriptors or handles, and map
//! every peer's segment. Each rank ends with its own segment, every peer's address in this
//! process (host side, and as a device table for kernels) and the signal pads at the same
//! offset everywhere. Every step ends with an exchange of verdicts, so that a rank that
//! fails makes every rank fail instead of leaving them waiting.
//!
//! The heap is a source of peer memory for `comm-peer`, whose [`PeerGroup`] (reached
//! through `Deref`) provides the primitives (`put_signal`, `wait_signal`, `barrier`:
//! one-block kernels, stores of growing counts, no peer atomics, waits bounded by
//! `%globaltimer`) and the bounded `synchronize`.

use std::os::fd::AsFd;
use std::sync::Arc;

use comm_core::cuda::DeviceBuffer;
use comm_core::cuda::cudarc::driver::CudaContext;
use comm_core::{Bootstrap, Error, Result};
use comm_peer::layout::HEADER_BYTES;
use comm_peer::{
    PeerGroup, PeerSource, Ready, Registered, device_table, init_buffer, init_region, sharing,
};

use super::backing::{Backing, Offer, choose};
use super::host_mapped;
use super::segment::{VmmMapping, vmm_host_size, vmm_size};
use crate::fdpass::exchange_fds;

/// One rank's view of the device symmetric heap (see the module docs).
#[derive(Debug)]
pub struct DeviceHeap {
    group: PeerGroup,
    size: usize,
    backing: Backing,
}

/// Every rank's segment mapped here, by rank, after a rendezvous.
pub(crate) struct Mapped {
    pub(crate) source: Box<dyn PeerSource>,
    pub(crate) size: usize,
    /// The backing the ranks chose (never `Auto`).
    pub(crate) backing: Backing,
}

impl DeviceHeap {
    /// Collective over every rank of `bootstrap` (all on this node): allocates a segment of
    /// [`HEADER_BYTES`] + `data_bytes` on `ctx`'s device, fills `sentinel` (a range of
    /// segment offsets) with `0xff` and the header with zeros, and maps every rank's segment.
    pub fn rendezvous(
        bootstrap: &dyn Bootstrap,
        ctx: &Arc<CudaContext>,
        data_bytes: usize,
        backing: Backing,
        sentinel: std::ops::Range<usize>,
    ) -> Result<Self> {
        let ready = Ready::new(ctx, bootstrap.world_size());
        let local = ready
            .as_ref()
            .map(drop)
            .map_err(|e| Error::Bootstrap(e.to_string()));
        let mapped = map_segments(
            bootstrap,
            ctx,
            HEADER_BYTES + data_bytes,
            backing,
            sentinel,
            local,
        );
        let (ready, mapped) = match (ready, mapped) {
            (Err(e), _) => return Err(e),
            (Ok(_), Err(e)) => return Err(e),
            (Ok(r), Ok(m)) => (r, m),
        };
        Ok(DeviceHeap {
            group: PeerGroup::new(
                ready,
                bootstrap.rank(),
                bootstrap.world_size(),
                mapped.source,
                bootstrap.timeout(),
            ),
            size: mapped.size,
            backing: mapped.backing,
        })
    }

    /// Bytes of every rank's segment (header included, rounded up to the granularity).
    pub fn segment_bytes(&self) -> usize {
        self.size
    }

    /// Offset of the data area in every segment.
    pub fn data_offset(&self) -> usize {
        HEADER_BYTES
    }

    /// True for VMM segments (of device or host memory).
    pub fn is_vmm(&self) -> bool {
        matches!(self.backing, Backing::Vmm | Backing::HostVmm)
    }

    /// The backing the ranks chose (never [`Backing::Auto`]).
    pub fn backing(&self) -> Backing {
        self.backing
    }

    /// Sets the bound on waits.
    pub fn set_timeout(&mut self, timeout: std::time::Duration) {
        self.group.set_timeout(timeout);
    }

    /// The group the heap's primitives run on.
    pub fn group(&self) -> &PeerGroup {
        &self.group
    }
}

/// The group's accessors and primitives: `rank`, `world_size`, `sharing`, `peer_ptrs`,
/// `device_table`, `timeout`, `live`, `put_signal`, `wait_signal`, `barrier`, `synchronize`.
impl std::ops::Deref for DeviceHeap {
    type Target = PeerGroup;

    fn deref(&self) -> &PeerGroup {
        &self.group
    }
}

/// Every rank's segment mapped here, whatever the backing: `_held` keeps the mappings
/// (released on drop), `ptrs` are their addresses for this rank's device, by rank.
#[derive(Debug)]
pub(super) struct Segments<M> {
    pub(super) _held: M,
    pub(super) ptrs: Vec<u64>,
    pub(super) table: DeviceBuffer,
    pub(super) sharing: usize,
    pub(super) host_memory: bool,
}

impl<M: std::fmt::Debug + Send> PeerSource for Segments<M> {
    fn ptrs(&self) -> &[u64] {
        &self.ptrs
    }

    fn table(&self) -> u64 {
        self.table.device_ptr()
    }

    fn sharing(&self) -> usize {
        self.sharing
    }

    fn host_memory(&self) -> bool {
        self.host_memory
    }
}

/// Collective: agrees on the backing, allocates and initialises this rank's segment of
/// `wanted` bytes (header zeroed, `sentinel` filled) and maps every rank's. `local` is this
/// rank's verdict on what it prepared before; a failure anywhere fails every rank.
pub(crate) fn map_segments(
    bootstrap: &dyn Bootstrap,
    ctx: &Arc<CudaContext>,
    wanted: usize,
    backing: Backing,
    sentinel: std::ops::Range<usize>,
    local: Result<()>,
) -> Result<Mapped> {
    let world = bootstrap.world_size();
    let local = local.and_then(|()| {
        if bootstrap.local_world_size() != world {
            return Err(Error::Unsupported(format!(
                "symm: every rank must be on this node ({} of {world} are local)",
                bootstrap.local_world_size()
            )));
        }
        Ok(())
    });
    // Step 1: can everyone take part, and what can everyone use?
    let msg = match &local {
        Ok(()) => [&[1u8][..], &Offer::local(ctx).encode()].concat(),
        Err(e) => [&[0u8][..], e.to_string().as_bytes()].concat(),
    };
    let all = bootstrap.all_gather_bytes(&msg)?;
    local?;
    if let Some((r, m)) = all.iter().enumerate().find(|(_, m)| m.first() != Some(&1)) {
        return Err(Error::Bootstrap(format!(
            "rank {r} cannot join the symm heap: {}",
            String::from_utf8_lossy(m.get(1..).unwrap_or_default())
        )));
    }
    // Every rank decides alike from the same offers: no further exchange is needed.
    let offers = all
        .iter()
        .map(|m| Offer::decode(&m[1..]))
        .collect::<Result<Vec<_>>>()?;
    let sharing = sharing(offers.iter().map(|o| &o.device[..]));
    match choose(backing, &offers)? {
        Backing::LegacyIpc => {
            let region = Registered::new(ctx, bootstrap, wanted, |buf| init_buffer(buf, sentinel))?;
            Ok(Mapped {
                source: Box::new(region),
                size: wanted,
                backing: Backing::LegacyIpc,
            })
        }
        Backing::HostMapped => {
            let (source, size) = host_mapped::map(bootstrap, ctx, wanted, sentinel, sharing)?;
            Ok(Mapped {
                source,
                size,
                backing: Backing::HostMapped,
            })
        }
        Backing::HostVmm => map_vmm(bootstrap, ctx, wanted, sentinel, sharing, true),
        _ => map_vmm(bootstrap, ctx, wanted, sentinel, sharing, false),
    }
}

/// Collective, once every rank chose VMM (of device memory, or of `host` memory):
/// allocates and initialises this rank's segment and maps every rank's.
fn map_vmm(
    bootstrap: &dyn Bootstrap,
    ctx: &Arc<CudaContext>,
    wanted: usize,
    sentinel: std::ops::Range<usize>,
    sharing: usize,
    host: bool,
) -> Result<Mapped> {
    let world = bootstrap.world_size();
    // Step 2: allocate and initialise this rank's segment; compare sizes.
    let sized = if host {
        vmm_host_size(ctx, wanted)
    } else {
        vmm_size(ctx, wanted)
    };
    let own = sized.and_then(|size| {
        let own = if host {
            VmmMapping::create_in_host(&[ctx], size)?
        } else {
            VmmMapping::create(ctx, size)?
        };
        init_region(ctx, own.ptr(), size, sentinel)?;
        Ok((own, size))
    });
    let msg = match &own {
        Ok((_, size)) => [&[1u8][..], &(*size as u64).to_le_bytes()].concat(),
        Err(e) => [&[0u8][..], e.to_string().as_bytes()].concat(),
    };
    let all = bootstrap.all_gather_bytes(&msg)?;
    if let Some((r, m)) = all
        .iter()
        .enumerate()
        .find(|(_, m)| m.first() != Some(&1) || m.len() != 9)
    {
        // Keep the fd exchange in step: a failed rank takes no part in it, so nobody does.
        return Err(Error::Bootstrap(format!(
            "rank {r} could not allocate its symm segment: {}",
            String::from_utf8_lossy(m.get(1..).unwrap_or_default())
        )));
    }
    let (own, size) = own?;
    let me = bootstrap.rank();
    if let Some((r, _)) = all
        .iter()
        .enumerate()
        .find(|(_, m)| m[1..9] != (size as u64).to_le_bytes())
    {
        return Err(Error::Mismatch(format!(
            "symm: rank {r}'s segment size differs from rank {me}'s {size} (same data_bytes everywhere?)"
        )));
    }
    // Step 3: map every peer. Every rank takes part in the descriptor exchange even if a
    // later import fails here (the verdict exchange after this reports it).
    let peers = own.export().and_then(|fd| {
        let fds = exchange_fds(bootstrap, fd.as_fd())?;
        drop(fd);
        // `fds` (and our exported descriptor) close here: the mappings hold the memory.
        (0..world)
            .filter(|&r| r != me)
            .map(|r| VmmMapping::import(ctx, &fds[r], size))
            .collect::<Result<Vec<_>>>()
    });
    let peers = every_rank(bootstrap, peers, "map the symm segments")?;
    let mut others = peers.iter();
    let ptrs: Vec<u64> = (0..world)
        .map(|r| {
            if r == me {
                own.ptr()
            } else {
                others.next().map_or(0, VmmMapping::ptr)
            }
        })
        .collect();
    let table = device_table(ctx, &ptrs)?;
    // Nobody touches a peer's segment before every rank has mapped (and initialised) all.
    bootstrap.barrier()?;
    Ok(Mapped {
        source: Box::new(Segments {
            // Peers before own, so that mappings go before what they map.
            _held: (peers, own),
            ptrs,
            table,
            sharing,
            host_memory: host,
        }),
        size,
        backing: if host { Backing::HostVmm } else { Backing::Vmm },
    })
}

/// Collective: `mine` where every rank's step succeeded, else an error naming a rank that
/// failed, on every rank (so that a rank that fails makes every rank fail instead of
/// leaving them waiting). `what` says what the step does.
pub(super) fn every_rank<T>(bootstrap: &dyn Bootstrap, mine: Result<T>, what: &str) -> Result<T> {
    let verdict = match &mine {
        Ok(_) => Vec::new(),
        Err(e) => e.to_string().into_bytes(),
    };
    let verdicts = bootstrap.all_gather_bytes(&verdict)?;
    let mine = mine?;
    match verdicts.iter().enumerate().find(|(_, v)| !v.is_empty()) {
        Some((r, why)) => Err(Error::Bootstrap(format!(
            "rank {r} could not {what}: {}",
            String::from_utf8_lossy(why)
        ))),
        None => Ok(mine),
    }
}
