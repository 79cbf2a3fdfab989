//! [`Registered`]: device memory that every rank can address through CUDA IPC.
//!
//! Each rank allocates with `cuMemAlloc` (pool memory cannot be exported), and the ranks
//! exchange `(pid, address, IPC handle, device UUID, ordinal)` through the bootstrap. A peer
//! in another process is opened with `cuIpcOpenMemHandle` (lazy peer access) and closed on
//! drop; a peer in this process (virtual ranks on one device, or one thread per GPU) is
//! addressed directly, since a process cannot open its own handles; for another device of
//! this process, peer access is enabled first. Both steps end with an exchange of verdicts, so that a rank
//! that fails makes every rank fail instead of leaving them waiting. comm-ipc builds its
//! regions and zero-copy buffers from this, comm-symm its heap where VMM is missing.

use std::sync::Arc;

use comm_core::cuda::cudarc::driver::{CudaContext, sys};
use comm_core::cuda::{DeviceBuffer, enable_peer_access};
use comm_core::{Bootstrap, Error, Result};

use crate::source::{PeerSource, device_table, sharing, uuid};

/// One allocation per rank, every rank's address known here.
#[derive(Debug)]
pub struct Registered {
    buf: DeviceBuffer,
    /// Every rank's address (base of its allocation) in this process.
    ptrs: Vec<u64>,
    /// Peers' allocations opened through IPC, closed on drop.
    opened: Vec<u64>,
    /// `ptrs` on the device.
    table: Option<DeviceBuffer>,
    /// Most ranks that share one device (any device), the same on every rank.
    sharing: usize,
}

/// Verdict, pid, address, IPC handle, device UUID, device ordinal, bytes allocated.
const MSG_BYTES: usize = 1 + 4 + 8 + 64 + 16 + 4 + 8;

impl Registered {
    /// Collective: allocates `bytes` on every rank, runs `init` on this rank's memory
    /// (it must have finished when it returns: peers may write as soon as this returns)
    /// and maps every rank's allocation here.
    pub fn new(
        ctx: &Arc<CudaContext>,
        bootstrap: &dyn Bootstrap,
        bytes: usize,
        init: impl FnOnce(&mut DeviceBuffer) -> Result<()>,
    ) -> Result<Self> {
        let local = Self::prepare(ctx, bytes, init);
        let msg = match &local {
            Ok((buf, handle)) => {
                let mut m = Vec::with_capacity(MSG_BYTES);
                m.push(1u8);
                m.extend_from_slice(&std::process::id().to_le_bytes());
                m.extend_from_slice(&buf.device_ptr().to_le_bytes());
                m.extend_from_slice(handle);
                m.extend_from_slice(&uuid(ctx));
                m.extend_from_slice(&(ctx.ordinal() as u32).to_le_bytes());
                m.extend_from_slice(&(bytes as u64).to_le_bytes());
                m
            }
            Err(e) => [&[0u8][..], e.to_string().as_bytes()].concat(),
        };
        let all = bootstrap.all_gather_bytes(&msg)?;
        let (buf, _) = local?;
        if let Some((rank, m)) = all
            .iter()
            .enumerate()
            .find(|(_, m)| m.first() != Some(&1) || m.len() != MSG_BYTES)
        {
            return Err(Error::Bootstrap(format!(
                "rank {rank} could not register its peer buffer: {}",
                String::from_utf8_lossy(m.get(1..).unwrap_or_default())
            )));
        }
        // Peers address every rank's allocation as if it were their own size.
        if let Some(why) = size_mismatch(all.iter().map(|m| &m[97..105])) {
            return Err(Error::Mismatch(format!("peer buffers: {why}")));
        }
        let me = bootstrap.rank();
        let pid = std::process::id();
        let mut registered = Registered {
            ptrs: Vec::with_capacity(all.len()),
            opened: Vec::new(),
            table: None,
            sharing: sharing(all.iter().map(|m| &m[77..93])),
            buf,
        };
        let mut failure = None;
        for (rank, m) in all.iter().enumerate() {
            let peer_pid = u32::from_le_bytes(m[1..5].try_into().unwrap());
            let addr = u64::from_le_bytes(m[5..13].try_into().unwrap());
            if rank == me || peer_pid == pid {
                // A rank of this process on another device: its address is valid here
                // (one address space), but only reachable with peer access enabled.
                let peer_device = u32::from_le_bytes(m[93..97].try_into().unwrap()) as usize;
                if let Err(e) = enable_peer_access(ctx, peer_device) {
                    failure = Some(format!("reaching rank {rank}'s device: {e}"));
                    break;
                }
                registered.ptrs.push(addr);
                continue;
            }
            let mut handle = sys::CUipcMemHandle { reserved: [0; 64] };
            for (dst, &src) in handle.reserved.iter_mut().zip(&m[13..77]) {
                *dst = src as _;
            }
            let mut mapped = 0;
            // SAFETY: a handle exported by another process of this node; the mapping is
            // closed on drop (or below, on failure).
            let opened = unsafe {
                sys::cuIpcOpenMemHandle_v2(
                    &mut mapped,
                    handle,
                    sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32,
                )
            }
            .result();
            match opened {
                Ok(()) => {
                    registered.opened.push(mapped);
                    registered.ptrs.push(mapped);
                }
                Err(e) => {
                    failure = Some(format!("opening rank {rank}'s ipc handle: {e}"));
                    break;
                }
            }
        }
        if failure.is_none() {
            match device_table(ctx, &registered.ptrs) {
                Ok(t) => registered.table = Some(t),
                Err(e) => failure = Some(e.to_string()),
            }
        }
        // Everyone must know whether everyone could map everyone.
        let verdict = failure.as_deref().unwrap_or("").as_bytes();
        let verdicts = bootstrap.all_gather_bytes(verdict)?;
        if let Some((rank, why)) = verdicts.iter().enumerate().find(|(_, v)| !v.is_empty()) {
            return Err(Error::Bootstrap(format!(
                "rank {rank} could not map the peer buffers: {}",
                String::from_utf8_lossy(why)
            )));
        }
        Ok(registered)
    }

    fn prepare(
        ctx: &Arc<CudaContext>,
        bytes: usize,
        init: impl FnOnce(&mut DeviceBuffer) -> Result<()>,
    ) -> Result<(DeviceBuffer, [u8; 64])> {
        let mut buf = DeviceBuffer::alloc(ctx, bytes)?;
        init(&mut buf)?;
        let handle = buf.ipc_handle()?;
        Ok((buf, handle))
    }

    /// This rank's allocation.
    pub fn buffer(&self) -> &DeviceBuffer {
        &self.buf
    }

    /// This rank's allocation, writable.
    pub fn buffer_mut(&mut self) -> &mut DeviceBuffer {
        &mut self.buf
    }
}

impl PeerSource for Registered {
    fn ptrs(&self) -> &[u64] {
        &self.ptrs
    }

    fn table(&self) -> u64 {
        self.table.as_ref().map_or(0, DeviceBuffer::device_ptr)
    }

    fn sharing(&self) -> usize {
        self.sharing
    }
}

/// Why the ranks' allocation sizes (little-endian u64 each, in rank order) differ, if they do.
fn size_mismatch<'a>(sizes: impl Iterator<Item = &'a [u8]>) -> Option<String> {
    let sizes: Vec<u64> = sizes
        .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
        .collect();
    let first = *sizes.first()?;
    let (rank, size) = sizes.iter().enumerate().find(|&(_, &s)| s != first)?;
    Some(format!(
        "rank 0 allocates {first} bytes, rank {rank} {size}"
    ))
}

impl Drop for Registered {
    fn drop(&mut self) {
        if self.buf.context().bind_to_thread().is_err() {
            return;
        }
        for &ptr in &self.opened {
            // SAFETY: opened by cuIpcOpenMemHandle in `new`, closed once.
            let _ = unsafe { sys::cuIpcCloseMemHandle(ptr) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::size_mismatch;

    #[test]
    fn ranks_allocating_other_sizes_are_named() {
        let sizes = |all: &[u64]| all.iter().map(|s| s.to_le_bytes()).collect::<Vec<_>>();
        let same = sizes(&[4096, 4096, 4096]);
        assert_eq!(size_mismatch(same.iter().map(|b| &b[..])), None);
        let other = sizes(&[4096, 4096, 8192]);
        let why = size_mismatch(other.iter().map(|b| &b[..])).unwrap();
        assert!(why.contains("rank 2") && why.contains("8192"), "{why}");
    }
}
