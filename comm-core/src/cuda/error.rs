//! Conversions from `cudarc`'s errors into the workspace's [`Error`].

use cudarc::driver::DriverError;
use cudarc::nvrtc::result::NvrtcError;

use crate::error::Error;

/// A CUDA driver error, as [`Error::Backend`] of backend `cuda`.
pub fn driver_error(e: DriverError) -> Error {
    Error::backend("cuda", e)
}

/// An NVRTC error, as [`Error::Backend`] of backend `nvrtc`.
pub fn nvrtc_error(e: NvrtcError) -> Error {
    Error::backend("nvrtc", e)
}

/// `?` on a cudarc driver call inside code that returns the workspace's `Result`.
impl From<DriverError> for Error {
    fn from(e: DriverError) -> Self {
        driver_error(e)
    }
}

/// `?` on a cudarc NVRTC call inside code that returns the workspace's `Result`.
impl From<NvrtcError> for Error {
    fn from(e: NvrtcError) -> Self {
        nvrtc_error(e)
    }
}
