//! Whether NCCL's symmetric kernels can be had here, and why not.
//!
//! Since 2.27, NCCL runs low-latency kernels on buffers that every rank registered as a
//! symmetric window (`ncclMemAlloc` + `ncclCommWindowRegister` with
//! `NCCL_WIN_COLL_SYMMETRIC`). Older libraries lack the entry points, and `cudarc` panics
//! on a missing symbol, so the version is asked first (`ncclGetVersion`) and the symbols
//! looked up before any is called. Where they cannot be had, the communicator keeps the
//! plain path and says why ([`comm_core::Capabilities::unavailable`]).

use comm_core::Result;
use comm_core::env::Env;

use crate::probe::nccl_version;
use crate::raw::has_symbol;

/// The oldest NCCL with symmetric windows.
pub const SYMMETRIC_SINCE: (u32, u32, u32) = (2, 27, 0);

/// Entry points the windows need.
const SYMBOLS: [&str; 4] = [
    "ncclMemAlloc",
    "ncclMemFree",
    "ncclCommWindowRegister",
    "ncclCommWindowDeregister",
];

/// Default size of the staging window (`COMM_NCCL_SYMMETRIC_BYTES`): all-reduces of
/// unregistered buffers up to this size can run through it.
pub const STAGING_BYTES: usize = 4 << 20;

/// The algorithm that stages unregistered buffers through a symmetric window.
pub(crate) const SYMMETRIC: &str = "symmetric";
/// NCCL on the buffers as given (registered ones in their windows).
pub(crate) const PLAIN: &str = "plain";

/// What the environment asks of the windows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SymmetricSettings {
    /// `COMM_NCCL_SYMMETRIC` (a switch; on when unset).
    pub enabled: bool,
    /// `COMM_NCCL_SYMMETRIC_BYTES`: the staging window's size; 0 registers none.
    pub staging_bytes: usize,
}

impl SymmetricSettings {
    pub(crate) fn from_env() -> Result<Self> {
        let env = Env("COMM_NCCL");
        Ok(SymmetricSettings {
            enabled: env.switch("SYMMETRIC")?.unwrap_or(true),
            staging_bytes: env.number("SYMMETRIC_BYTES")?.unwrap_or(STAGING_BYTES),
        })
    }
}

/// `Ok` when this rank's NCCL can register symmetric windows, else the reason.
pub(crate) fn support(settings: SymmetricSettings) -> std::result::Result<(), String> {
    if !settings.enabled {
        return Err("turned off by COMM_NCCL_SYMMETRIC=0".into());
    }
    let version = nccl_version().map_err(|e| e.to_string())?;
    gate(version)?;
    match SYMBOLS.iter().find(|s| !has_symbol(s)) {
        Some(missing) => Err(format!("libnccl {} lacks {missing}", show(version))),
        None => Ok(()),
    }
}

/// The version rule alone.
pub(crate) fn gate(version: (u32, u32, u32)) -> std::result::Result<(), String> {
    if version < SYMMETRIC_SINCE {
        Err(format!(
            "NCCL {} has no symmetric windows (they need {} or newer)",
            show(version),
            show(SYMMETRIC_SINCE)
        ))
    } else {
        Ok(())
    }
}

fn show((major, minor, patch): (u32, u32, u32)) -> String {
    format!("{major}.{minor}.{patch}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_before_2_27_are_refused_with_the_version_named() {
        let why = gate((2, 26, 6)).unwrap_err();
        assert!(why.contains("2.26.6") && why.contains("2.27.0"), "{why}");
        assert!(gate((2, 27, 0)).is_ok());
        assert!(gate((2, 28, 3)).is_ok());
        assert!(gate((3, 0, 0)).is_ok());
        assert!(gate((1, 99, 0)).is_err());
    }

    #[test]
    fn turned_off_says_so_before_asking_the_library() {
        let off = SymmetricSettings {
            enabled: false,
            staging_bytes: STAGING_BYTES,
        };
        assert!(support(off).unwrap_err().contains("COMM_NCCL_SYMMETRIC=0"));
    }
}
