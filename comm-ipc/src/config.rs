//! [`IpcConfig`]: what a communicator is built with.

use std::time::Duration;

use comm_core::Result;

use crate::algo::{Algorithm, parse_choice};

/// Largest message by default (bytes per rank): a decode step's activations with room to
/// spare, and small enough that eight ranks' regions fit easily on one GPU.
pub const DEFAULT_MAX_BYTES: usize = 8 << 20;
/// Threads per block.
pub const DEFAULT_THREADS: u32 = 512;

/// Settings of an [`IpcComm`](crate::IpcComm). Every rank must use the same values (the
/// constructor checks).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpcConfig {
    /// Largest all-reduce, in bytes per rank; sizes the registered regions
    /// (`(3 n + 9)` times this per rank, for the Lamport mailboxes of the push algorithms).
    pub max_bytes: usize,
    /// Algorithm for every call; `None` picks per call with [`Algorithm::auto`].
    pub algorithm: Option<Algorithm>,
    /// Bound of every spin-wait on the GPU (and of host waits, plus a margin); `None` uses
    /// the bootstrap's timeout. After it expires the communicator is unusable.
    pub timeout: Option<Duration>,
    /// Compare every call's arguments across ranks (a host exchange through the bootstrap
    /// per call), so that mismatched calls fail with `Error::Mismatch` on every rank instead
    /// of timing out. Off for production and benchmarks: it costs a round trip per call.
    pub validate: bool,
    /// Most blocks per launch; `None` = the device's SMs divided by the ranks that share
    /// this device (all ranks' blocks must be resident at once), at most 36.
    pub max_blocks: Option<u32>,
    /// Threads per block (at most 512).
    pub threads: u32,
}

impl Default for IpcConfig {
    fn default() -> Self {
        IpcConfig {
            max_bytes: DEFAULT_MAX_BYTES,
            algorithm: None,
            timeout: None,
            validate: true,
            max_blocks: None,
            threads: DEFAULT_THREADS,
        }
    }
}

impl IpcConfig {
    /// The defaults, overridden by `COMM_IPC_MAX_BYTES` (bytes), `COMM_IPC_ALGO` (a name or
    /// `auto`), `COMM_IPC_TIMEOUT_SECS`, `COMM_IPC_VALIDATE` (`0`/`1`) and
    /// `COMM_IPC_MAX_BLOCKS`.
    pub fn from_env() -> Result<Self> {
        let mut c = IpcConfig::default();
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let bad = |name: &str, v: &str| {
            comm_core::Error::InvalidArgument(format!("{name}: cannot use `{v}`"))
        };
        if let Some(v) = var("COMM_IPC_MAX_BYTES") {
            c.max_bytes = v
                .trim()
                .parse()
                .map_err(|_| bad("COMM_IPC_MAX_BYTES", &v))?;
        }
        if let Some(v) = var("COMM_IPC_ALGO") {
            c.algorithm = parse_choice(&v)?;
        }
        if let Some(v) = var("COMM_IPC_TIMEOUT_SECS") {
            let secs: f64 = v
                .trim()
                .parse()
                .map_err(|_| bad("COMM_IPC_TIMEOUT_SECS", &v))?;
            if !(secs.is_finite() && secs > 0.0) {
                return Err(bad("COMM_IPC_TIMEOUT_SECS", &v));
            }
            c.timeout = Some(Duration::from_secs_f64(secs));
        }
        if let Some(v) = var("COMM_IPC_VALIDATE") {
            c.validate = match v.trim() {
                "1" | "true" | "yes" => true,
                "0" | "false" | "no" => false,
                _ => return Err(bad("COMM_IPC_VALIDATE", &v)),
            };
        }
        if let Some(v) = var("COMM_IPC_MAX_BLOCKS") {
            c.max_blocks = Some(
                v.trim()
                    .parse()
                    .map_err(|_| bad("COMM_IPC_MAX_BLOCKS", &v))?,
            );
        }
        Ok(c)
    }
}
