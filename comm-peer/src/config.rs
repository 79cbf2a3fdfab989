//! [`PeerConfig`]: what a peer-memory communicator is built with, and the one reading of
//! environment variables every backend of this layer shares (`<PREFIX>_MAX_BYTES`, ...,
//! one vocabulary for numbers, durations and switches).

use std::time::Duration;

use comm_core::Result;

use crate::algorithm::{Algorithm, parse_choice};

/// Staging size by default (bytes per rank): a decode step's activations in one launch
/// with room to spare, and small enough that eight ranks' regions fit easily on one GPU.
pub const DEFAULT_MAX_BYTES: usize = 8 << 20;
/// Threads per block.
pub const DEFAULT_THREADS: u32 = 512;

/// Settings of a peer-memory communicator. Every rank must use the same values (checked
/// when joining).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerConfig {
    /// Most bytes per rank one launch moves (an all-reduce's or a broadcast's message, an
    /// all-gather's input, a reduce-scatter's whole input): the size of each staging area
    /// of the region. Larger messages move in parts: in one launch (two-shot pull) or in
    /// several, in order on their stream.
    /// The region takes about 3 times this per rank, and a private scratch buffer (for
    /// all-gathers and reduce-scatters cut into launches) as much again.
    pub max_bytes: usize,
    /// Largest push (Lamport) message; bigger ones run the pull algorithm of the same
    /// shape, but a one-shot push over host memory, which goes by data and flags instead.
    /// The mailboxes take about `3 (world + 2)` times this per rank.
    pub lamport_max_bytes: usize,
    /// Algorithm for every all-reduce; `None` picks per call with [`Algorithm::auto`].
    pub algorithm: Option<Algorithm>,
    /// Bound of every spin-wait on the GPU (and of host waits, plus a margin); `None` uses
    /// the bootstrap's timeout. After it expires the communicator is unusable.
    pub timeout: Option<Duration>,
    /// Also agree on every call through the bootstrap before launching it: a debugging
    /// aid that costs a host round trip per call (about 20 us between processes). The
    /// kernels always compare every rank's call (collective, dtype, op, count, root,
    /// algorithm, zero-copy offset) on the device, with no host work: ranks that disagree
    /// stop before writing output and get `Error::Mismatch` naming both calls at their next
    /// call or `synchronize`, and the communicator is unusable afterwards (as after an
    /// NCCL asynchronous error). With agreement on the host, the disagreeing call itself
    /// fails, before anything is launched, and the communicator stays usable.
    pub agree_on_host: bool,
    /// Most blocks per launch; `None` = the device's SMs, at most 128; where ranks share
    /// a device, its SMs divided by those ranks (all their blocks must be resident at once),
    /// at most 36; 8 where the regions are host memory.
    pub max_blocks: Option<u32>,
    /// Threads per block (a multiple of 32, at most 512). Small one-shot all-reduces on
    /// device memory take fewer (128 or 256, never more than this) and more blocks, so
    /// that each SM has fewer warps to run after the wait.
    pub threads: u32,
}

impl Default for PeerConfig {
    fn default() -> Self {
        PeerConfig {
            max_bytes: DEFAULT_MAX_BYTES,
            lamport_max_bytes: DEFAULT_MAX_BYTES,
            algorithm: None,
            timeout: None,
            agree_on_host: false,
            max_blocks: None,
            threads: DEFAULT_THREADS,
        }
    }
}

impl PeerConfig {
    /// `self`, overridden by `<prefix>_MAX_BYTES`, `<prefix>_LAMPORT_MAX_BYTES` (bytes),
    /// `<prefix>_ALGO` (a name or `auto`), `<prefix>_TIMEOUT_SECS` (seconds, fractions
    /// allowed), `<prefix>_AGREE_ON_HOST` (`1`/`0`, `true`/`false`, `yes`/`no`, `on`/`off`),
    /// `<prefix>_MAX_BLOCKS` and `<prefix>_THREADS`.
    pub fn with_env(mut self, prefix: &str) -> Result<Self> {
        let env = Env(prefix);
        if let Some(v) = env.number("MAX_BYTES")? {
            self.max_bytes = v;
        }
        if let Some(v) = env.number("LAMPORT_MAX_BYTES")? {
            self.lamport_max_bytes = v;
        }
        if let Some(v) = env.var("ALGO") {
            self.algorithm = parse_choice(&v)?;
        }
        if let Some(v) = env.seconds("TIMEOUT_SECS")? {
            self.timeout = Some(v);
        }
        if let Some(v) = env.switch("AGREE_ON_HOST")? {
            self.agree_on_host = v;
        }
        if let Some(v) = env.number("MAX_BLOCKS")? {
            self.max_blocks = Some(v as u32);
        }
        if let Some(v) = env.number("THREADS")? {
            self.threads = v as u32;
        }
        Ok(self)
    }
}

pub use comm_core::env::Env;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_vocabulary_for_every_prefix() {
        // A prefix of its own, so that no other test's variables interfere.
        let p = "COMM_PEER_CONFIG_TEST";
        // SAFETY: only this test uses these names, and it sets them before reading.
        unsafe {
            std::env::set_var(format!("{p}_AGREE_ON_HOST"), "Yes");
            std::env::set_var(format!("{p}_ALGO"), "lamport");
            std::env::set_var(format!("{p}_TIMEOUT_SECS"), "2.5");
            std::env::set_var(format!("{p}_MAX_BYTES"), "1024");
        }
        let c = PeerConfig::default().with_env(p).unwrap();
        assert!(c.agree_on_host);
        assert_eq!(c.algorithm, Some(Algorithm::OneshotPush));
        assert_eq!(c.timeout, Some(Duration::from_millis(2500)));
        assert_eq!(c.max_bytes, 1024);
        // SAFETY: as above.
        unsafe { std::env::set_var(format!("{p}_AGREE_ON_HOST"), "maybe") };
        assert!(PeerConfig::default().with_env(p).is_err());
        for (v, want) in [("on", true), ("0", false), ("TRUE", true), ("off", false)] {
            // SAFETY: as above.
            unsafe { std::env::set_var(format!("{p}_AGREE_ON_HOST"), v) };
            assert_eq!(Env(p).switch("AGREE_ON_HOST").unwrap(), Some(want), "{v}");
        }
    }
}
