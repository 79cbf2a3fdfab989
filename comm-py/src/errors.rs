//! `comm_core::Error` as Python exceptions: one class per variant, named after it, all
//! subclasses of `CommError` (itself a `RuntimeError`), carrying the error's message.

use comm_core::Error;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::{PyErr, create_exception};

create_exception!(
    comm_rs,
    CommError,
    PyRuntimeError,
    "Any error of a communicator."
);
create_exception!(
    comm_rs,
    Unsupported,
    CommError,
    "The backend cannot perform this call (dtype, op, collective, size or memory kind)."
);
create_exception!(
    comm_rs,
    InvalidArgument,
    CommError,
    "This rank's arguments are invalid on their own."
);
create_exception!(
    comm_rs,
    Mismatch,
    CommError,
    "The ranks called the same collective with arguments that do not agree."
);
create_exception!(
    comm_rs,
    Timeout,
    CommError,
    "A peer did not arrive within the bound; the communicator is unusable afterwards."
);
create_exception!(
    comm_rs,
    Aborted,
    CommError,
    "An earlier failure made this communicator unusable."
);
create_exception!(
    comm_rs,
    Bootstrap,
    CommError,
    "Rank discovery or the byte exchange between processes failed."
);
create_exception!(comm_rs, NoDevice, CommError, "No usable GPU was found.");
create_exception!(
    comm_rs,
    LibraryMissing,
    CommError,
    "A shared library the backend loads at run time is missing."
);
create_exception!(
    comm_rs,
    Backend,
    CommError,
    "An error reported by a backend's underlying library."
);
create_exception!(
    comm_rs,
    Io,
    CommError,
    "An operating-system error (sockets, shared memory, files)."
);

/// The Python exception of `e`, with `e`'s message.
pub fn to_py(e: Error) -> PyErr {
    let message = e.to_string();
    match e {
        Error::Unsupported(_) => Unsupported::new_err(message),
        Error::InvalidArgument(_) => InvalidArgument::new_err(message),
        Error::Mismatch(_) => Mismatch::new_err(message),
        Error::Timeout { .. } => Timeout::new_err(message),
        Error::Aborted(_) => Aborted::new_err(message),
        Error::Bootstrap(_) => Bootstrap::new_err(message),
        Error::NoDevice(_) => NoDevice::new_err(message),
        Error::LibraryMissing { .. } => LibraryMissing::new_err(message),
        Error::Backend { .. } => Backend::new_err(message),
        Error::Io(_) => Io::new_err(message),
        // A variant added later still reaches Python, as the base class.
        _ => CommError::new_err(message),
    }
}

/// An [`InvalidArgument`] raised by this module's own checks of a Python argument.
pub fn invalid(message: impl Into<String>) -> PyErr {
    InvalidArgument::new_err(format!("invalid argument: {}", message.into()))
}

/// Adds the exception classes to module `m`.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("CommError", py.get_type::<CommError>())?;
    m.add("Unsupported", py.get_type::<Unsupported>())?;
    m.add("InvalidArgument", py.get_type::<InvalidArgument>())?;
    m.add("Mismatch", py.get_type::<Mismatch>())?;
    m.add("Timeout", py.get_type::<Timeout>())?;
    m.add("Aborted", py.get_type::<Aborted>())?;
    m.add("Bootstrap", py.get_type::<Bootstrap>())?;
    m.add("NoDevice", py.get_type::<NoDevice>())?;
    m.add("LibraryMissing", py.get_type::<LibraryMissing>())?;
    m.add("Backend", py.get_type::<Backend>())?;
    m.add("Io", py.get_type::<Io>())?;
    Ok(())
}
