//! [`PeerSource`]: how a backend hands its peer memory to the layer, and the helpers every
//! source shares (the device table of addresses, the count of ranks per device).

use std::fmt;
use std::sync::Arc;

use comm_core::Result;
use comm_core::cuda::DeviceBuffer;
use comm_core::cuda::cudarc::driver::CudaContext;

use crate::layout::MAX_RANKS;

/// Memory every rank can address: one region per rank, mapped in this process. The source
/// owns the mappings (and unmaps them on drop); the layer only reads the addresses.
pub trait PeerSource: fmt::Debug + Send {
    /// Every rank's region as mapped here, by rank.
    fn ptrs(&self) -> &[u64];
    /// The device array of [`Self::ptrs`] ([`MAX_RANKS`] entries), for the kernels.
    fn table(&self) -> u64;
    /// Most ranks that share one device (any device), the same on every rank.
    fn sharing(&self) -> usize;
    /// True when the regions are host memory mapped into the devices (no peer access
    /// between them): the kernels then order their flags at system scope even when every
    /// rank shares one device, since the memory lies outside the device, and the peers'
    /// device memory (zero-copy buffers) is out of reach.
    fn host_memory(&self) -> bool {
        false
    }
}

/// `ptrs` on the device, padded to [`MAX_RANKS`] entries (the kernels' `PeerTable`).
pub fn device_table(ctx: &Arc<CudaContext>, ptrs: &[u64]) -> Result<DeviceBuffer> {
    let mut table = DeviceBuffer::alloc(ctx, MAX_RANKS * 8)?;
    let mut padded = [0u64; MAX_RANKS];
    let n = ptrs.len().min(MAX_RANKS);
    padded[..n].copy_from_slice(&ptrs[..n]);
    table.upload_bytes(
        &ctx.default_stream(),
        0,
        &padded.map(u64::to_le_bytes).concat(),
    )?;
    Ok(table)
}

/// Most ranks with the same device UUID, from every rank's UUID.
pub fn sharing<'a>(uuids: impl IntoIterator<Item = &'a [u8]>) -> usize {
    let uuids: Vec<&[u8]> = uuids.into_iter().collect();
    uuids
        .iter()
        .map(|u| uuids.iter().filter(|v| *v == u).count())
        .max()
        .unwrap_or(1)
}

/// This context's device UUID, as bytes.
pub fn uuid(ctx: &CudaContext) -> [u8; 16] {
    ctx.uuid()
        .map(|u| u.bytes.map(|b| b as u8))
        .unwrap_or([0; 16])
}

#[cfg(test)]
mod tests {
    #[test]
    fn sharing_counts_the_most_ranks_per_device() {
        let (a, b) = ([1u8; 16], [2u8; 16]);
        assert_eq!(super::sharing([&a[..], &b, &a]), 2);
        assert_eq!(super::sharing([&a[..]]), 1);
        assert_eq!(super::sharing([&a[..], &a, &a, &a]), 4);
    }
}
