//! A diagnostic, off unless `COMM_PEER_TRACE` names a file prefix: every kernel of a group
//! records, from its block 0, when it started, when its prologue was done (the previous
//! kernel finished, the call number read), when its own data was written, when it first saw
//! a peer's data or barrier flag, when its first wait for the peers ended (their data, or
//! the first barrier, and the comparison of the calls; 0 for kernels that do not wait) and
//! when it finished, read from `%globaltimer` (ns), into a ring of the last [`CALLS`] calls
//! in device memory.
//! When the group is dropped the ring is written to `PREFIX.rankR.csv`, one line per call.
//! It tells where a call's time goes (launch, prologue, waiting for peers, the rest) where
//! no profiler is at hand; it costs a clock read and a few stores per kernel.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;

use comm_core::Result;
use comm_core::cuda::cudarc::driver::CudaContext;
use comm_core::cuda::{DeviceBuffer, driver_error};

/// Records of the ring (the kernels' `PEER_TRACE_CALLS`).
pub const CALLS: usize = 4096;
/// Words of one record: call + 1, entry, prologue done, first wait done, end, blocks << 32 |
/// threads, own data sent, first peer seen (0 where a kernel has no such moment).
const WORDS: usize = 8;
const VARIABLE: &str = "COMM_PEER_TRACE";

/// The ring of one rank, written out on drop.
pub(crate) struct Trace {
    ring: DeviceBuffer,
    path: Option<PathBuf>,
}

impl std::fmt::Debug for Trace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Trace")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl Trace {
    /// A zeroed ring on `ctx` when `COMM_PEER_TRACE` is set; `None` otherwise.
    pub(crate) fn from_env(ctx: &Arc<CudaContext>) -> Result<Option<Self>> {
        if std::env::var_os(VARIABLE).is_none_or(|v| v.is_empty()) {
            return Ok(None);
        }
        let ring = crate::group::zeroed(ctx, CALLS * WORDS * 8)?;
        Ok(Some(Trace { ring, path: None }))
    }

    /// Names the file of `rank`: `PREFIX.rankR.csv`.
    pub(crate) fn for_rank(mut self, rank: usize) -> Self {
        self.path = std::env::var_os(VARIABLE).map(|prefix| {
            let mut name = prefix;
            name.push(format!(".rank{rank}.csv"));
            PathBuf::from(name)
        });
        self
    }

    /// The ring's address, for the kernels' arguments.
    pub(crate) fn device_ptr(&self) -> u64 {
        self.ring.device_ptr()
    }

    fn write_out(&self) -> Result<()> {
        let Some(path) = &self.path else {
            return Ok(());
        };
        let ctx = self.ring.context();
        ctx.synchronize().map_err(driver_error)?;
        let stream = ctx.new_stream().map_err(driver_error)?;
        let mut bytes = vec![0u8; self.ring.bytes()];
        self.ring.download_bytes(&stream, 0, &mut bytes)?;
        let text = csv(&bytes);
        std::fs::write(path, text)
            .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())).into())
    }
}

impl Drop for Trace {
    fn drop(&mut self) {
        if let Err(e) = self.write_out() {
            eprintln!("comm-peer: trace not written: {e}");
        }
    }
}

/// The ring's records as CSV, in call order, empty records left out.
fn csv(bytes: &[u8]) -> String {
    let words: Vec<u64> = bytes
        .chunks_exact(8)
        .map(|w| u64::from_le_bytes(w.try_into().expect("8 bytes")))
        .collect();
    let mut records: Vec<&[u64]> = words.chunks_exact(WORDS).filter(|r| r[0] != 0).collect();
    records.sort_by_key(|r| r[0]);
    let mut out =
        String::from("call,entry_ns,ready_ns,sent_ns,seen_ns,waited_ns,end_ns,blocks,threads\n");
    for r in records {
        let _ = writeln!(
            out,
            "{},{},{},{},{},{},{},{},{}",
            r[0] - 1,
            r[1],
            r[2],
            r[6],
            r[7],
            r[3],
            r[4],
            r[5] >> 32,
            r[5] & 0xffff_ffff
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(call: u64, t: u64) -> [u64; WORDS] {
        [
            call + 1,
            t,
            t + 100,
            t + 1500,
            t + 3000,
            6 << 32 | 512,
            t + 200,
            t + 1200,
        ]
    }

    #[test]
    fn records_come_out_in_call_order_without_the_empty_ones() {
        let mut ring = vec![[0u64; WORDS]; 4];
        ring[0] = record(8, 9_000);
        ring[2] = record(6, 1_000);
        let bytes: Vec<u8> = ring
            .iter()
            .flatten()
            .flat_map(|w| w.to_le_bytes())
            .collect();
        let text = csv(&bytes);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert_eq!(lines[1], "6,1000,1100,1200,2200,2500,4000,6,512");
        assert_eq!(lines[2], "8,9000,9100,9200,10200,10500,12000,6,512");
    }

    #[test]
    fn the_ring_matches_the_kernels() {
        let src = include_str!("../kernels/peer_sync.cuh");
        assert!(src.contains(&format!("#define PEER_TRACE_CALLS {CALLS}")));
        assert!(src.contains("(c.seq % PEER_TRACE_CALLS) * 8"));
        assert_eq!(WORDS, 8);
    }
}
