//! Finding `libnccl` without letting `cudarc` panic.

use std::sync::OnceLock;

use comm_core::Error;
use cudarc::nccl::{result, sys};

/// The file name `cudarc` opens. Where only `libnccl.so.2` exists (pip wheels, most
/// distributions), put a `libnccl.so` symlink to it in a folder on `LD_LIBRARY_PATH`.
pub const LIBNCCL: &str = "libnccl.so";

/// Succeeds when `libnccl` loads.
pub fn require_nccl() -> Result<(), Error> {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: only tries to open the library; no symbol of it is called.
    if *PRESENT.get_or_init(|| unsafe { sys::is_culib_present() }) {
        Ok(())
    } else {
        Err(Error::LibraryMissing {
            name: LIBNCCL.to_string(),
        })
    }
}

/// NCCL's version as `(major, minor, patch)`, e.g. `(2, 27, 3)`.
pub fn nccl_version() -> Result<(u32, u32, u32), Error> {
    require_nccl()?;
    let code = result::get_nccl_version()
        .map_err(|e| crate::raw::nccl_error(e.0, None))?
        .max(0) as u32;
    // Since 2.9 the code is major * 10000 + minor * 100 + patch.
    Ok((code / 10000, (code % 10000) / 100, code % 100))
}
