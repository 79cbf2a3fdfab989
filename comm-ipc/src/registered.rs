//! [`Registered`]: device memory that every rank can address.
//!
//! Each rank allocates with `cuMemAlloc` (pool memory cannot be exported), and the ranks
//! exchange `(pid, address, IPC handle)` through the bootstrap. A peer in another process
//! is opened with `cuIpcOpenMemHandle` (lazy peer access) and closed on drop; a peer in
//! this process (virtual ranks on one device, or one thread per GPU) is addressed directly,
//! since a process cannot open its own handles; for another device of this process, peer
//! access is enabled first. The table of every rank's address, as mapped here, is copied to
//! the device for the kernels. Both steps end with an exchange of verdicts, so that a
//! rank that fails makes every rank fail instead of leaving them waiting.

use std::sync::Arc;

use comm_core::cuda::cudarc::driver::{CudaContext, sys};
use comm_core::cuda::{DeviceBuffer, driver_error, enable_peer_access};
use comm_core::{Bootstrap, Error, Result};

use crate::layout::MAX_RANKS;

/// One allocation per rank, every rank's address known here.
#[derive(Debug)]
pub(crate) struct Registered {
    buf: DeviceBuffer,
    /// Every rank's address (base of its allocation) in this process.
    ptrs: Vec<u64>,
    /// Peers' allocations opened through IPC, closed on drop.
    opened: Vec<u64>,
    /// `ptrs` on the device, padded to [`MAX_RANKS`] (the kernels' `IpcTable`).
    table: DeviceBuffer,
    /// Most ranks that share one device (any device), the same on every rank.
    sharing: usize,
}

/// Verdict, pid, address, IPC handle, device UUID, device ordinal.
const MSG_BYTES: usize = 1 + 4 + 8 + 64 + 16 + 4;

impl Registered {
    /// Collective: allocates `bytes` on every rank, runs `init` on this rank's memory
    /// (it must have finished when it returns: peers may write as soon as this returns)
    /// and maps every rank's allocation here.
    pub(crate) fn new(
        ctx: &Arc<CudaContext>,
        bootstrap: &dyn Bootstrap,
        bytes: usize,
        init: impl FnOnce(&mut DeviceBuffer) -> Result<()>,
    ) -> Result<Self> {
        let local = Self::prepare(ctx, bytes, init);
        let msg = match &local {
            Ok((buf, handle, uuid)) => {
                let mut m = Vec::with_capacity(MSG_BYTES);
                m.push(1u8);
                m.extend_from_slice(&std::process::id().to_le_bytes());
                m.extend_from_slice(&buf.device_ptr().to_le_bytes());
                m.extend_from_slice(handle);
                m.extend_from_slice(uuid);
                m.extend_from_slice(&(ctx.ordinal() as u32).to_le_bytes());
                m
            }
            Err(e) => [&[0u8][..], e.to_string().as_bytes()].concat(),
        };
        let all = bootstrap.all_gather_bytes(&msg)?;
        let (buf, _, _) = local?;
        if let Some((rank, m)) = all
            .iter()
            .enumerate()
            .find(|(_, m)| m.first() != Some(&1) || m.len() != MSG_BYTES)
        {
            return Err(Error::Bootstrap(format!(
                "rank {rank} could not register its ipc buffer: {}",
                String::from_utf8_lossy(m.get(1..).unwrap_or_default())
            )));
        }
        let me = bootstrap.rank();
        let pid = std::process::id();
        let mut registered = Registered {
            ptrs: Vec::with_capacity(all.len()),
            opened: Vec::new(),
            table: DeviceBuffer::alloc(ctx, MAX_RANKS * 8)?,
            sharing: sharing(&all),
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
            let mut table = [0u64; MAX_RANKS];
            table[..registered.ptrs.len().min(MAX_RANKS)]
                .copy_from_slice(&registered.ptrs[..registered.ptrs.len().min(MAX_RANKS)]);
            let stream = ctx.default_stream();
            if let Err(e) =
                registered
                    .table
                    .upload_bytes(&stream, 0, &table.map(u64::to_le_bytes).concat())
            {
                failure = Some(e.to_string());
            }
        }
        // Everyone must know whether everyone could map everyone.
        let verdict = failure.as_deref().unwrap_or("").as_bytes();
        let verdicts = bootstrap.all_gather_bytes(verdict)?;
        if let Some((rank, why)) = verdicts.iter().enumerate().find(|(_, v)| !v.is_empty()) {
            return Err(Error::Bootstrap(format!(
                "rank {rank} could not map the ipc buffers: {}",
                String::from_utf8_lossy(why)
            )));
        }
        Ok(registered)
    }

    fn prepare(
        ctx: &Arc<CudaContext>,
        bytes: usize,
        init: impl FnOnce(&mut DeviceBuffer) -> Result<()>,
    ) -> Result<(DeviceBuffer, [u8; 64], [u8; 16])> {
        let mut buf = DeviceBuffer::alloc(ctx, bytes)?;
        init(&mut buf)?;
        let handle = buf.ipc_handle()?;
        let uuid = ctx.uuid().map_err(driver_error)?;
        Ok((buf, handle, uuid.bytes.map(|b| b as u8)))
    }

    /// This rank's allocation.
    pub(crate) fn buffer(&self) -> &DeviceBuffer {
        &self.buf
    }

    /// This rank's allocation, writable.
    pub(crate) fn buffer_mut(&mut self) -> &mut DeviceBuffer {
        &mut self.buf
    }

    /// The device table of every rank's address.
    pub(crate) fn table(&self) -> u64 {
        self.table.device_ptr()
    }

    /// Most ranks that share one device.
    pub(crate) fn sharing(&self) -> usize {
        self.sharing
    }
}

/// Most ranks with the same device UUID.
fn sharing(all: &[Vec<u8>]) -> usize {
    let uuids: Vec<&[u8]> = all.iter().map(|m| &m[77..93]).collect();
    uuids
        .iter()
        .map(|u| uuids.iter().filter(|v| *v == u).count())
        .max()
        .unwrap_or(1)
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
