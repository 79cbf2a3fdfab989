//! The one error type of the workspace.

use std::time::Duration;

/// Result alias used throughout the workspace.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Boxed source error of a backend or library.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Everything that can go wrong in a collective, a bootstrap or a backend.
///
/// Variants are semantic: callers match on *what* went wrong (a peer timed out, the ranks
/// disagree, the backend cannot do this) rather than on which library said so.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The backend cannot perform this call (dtype, op, collective, size or memory kind).
    #[error("unsupported: {0}")]
    Unsupported(String),

    /// The arguments of this rank's call are invalid on their own (wrong buffer size, bad root...).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// The ranks called the same collective with arguments that do not agree.
    #[error("ranks disagree: {0}")]
    Mismatch(String),

    /// A peer did not arrive within the bound. The communicator is unusable afterwards.
    #[error("timed out after {after:?} waiting for {what}")]
    Timeout {
        /// What was being waited for.
        what: String,
        /// The bound that expired.
        after: Duration,
    },

    /// An earlier failure (a timeout, a peer that left) made this communicator unusable.
    #[error("communicator is unusable: {0}")]
    Aborted(String),

    /// The bootstrap (rank discovery, byte exchange between processes) failed; fatal
    /// ([`Error::is_fatal`]).
    #[error("bootstrap: {0}")]
    Bootstrap(String),

    /// No usable GPU was found.
    #[error("no device: {0}")]
    NoDevice(String),

    /// A shared library that this backend loads at run time is missing.
    #[error("library `{name}` is not available")]
    LibraryMissing {
        /// The library's file name, e.g. `libnccl.so`.
        name: String,
    },

    /// An error reported by a backend's underlying library.
    #[error("{backend}: {source}")]
    Backend {
        /// Which backend failed (`mpi`, `nccl`, ...).
        backend: &'static str,
        /// The library's error.
        #[source]
        source: BoxError,
    },

    /// An operating-system error (sockets, shared memory, files).
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
}

impl Error {
    /// Wraps a library error of `backend`.
    pub fn backend(backend: &'static str, source: impl Into<BoxError>) -> Self {
        Error::Backend {
            backend,
            source: source.into(),
        }
    }

    /// True when this error leaves the communicator unusable: its next call returns
    /// [`Error::Aborted`]. A failed bootstrap counts: once a peer has gone or a message
    /// was lost, the ranks no longer agree on where they are in the sequence of calls.
    pub fn is_fatal(&self) -> bool {
        matches!(
            self,
            Error::Timeout { .. } | Error::Aborted(_) | Error::Bootstrap(_)
        )
    }
}
