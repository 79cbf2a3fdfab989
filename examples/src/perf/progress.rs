//! A one-line progress indicator on stderr, shown only when stderr is a terminal.
//!
//! The results themselves go to stdout line by line; this line tells which size is
//! running, which matters when one size takes seconds. It is erased before each result
//! line so that a terminal showing both streams stays readable.

use std::io::{IsTerminal, Write};

use super::plot::bytes_label;

/// Writes progress to stderr, or nothing when stderr is not a terminal.
#[derive(Debug)]
pub struct Progress {
    enabled: bool,
}

impl Progress {
    /// A progress line on stderr if it is a terminal.
    pub fn stderr() -> Self {
        Progress {
            enabled: std::io::stderr().is_terminal(),
        }
    }

    /// Shows that size `index` (of `total`) of `backend` is running.
    pub fn starting(&self, backend: &str, index: usize, total: usize, bytes: u64) {
        if self.enabled {
            let mut err = std::io::stderr().lock();
            let _ = write!(
                err,
                "\r\x1b[2K[{backend}] size {}/{total}: {}B ...",
                index + 1,
                bytes_label(bytes as f64)
            );
            let _ = err.flush();
        }
    }

    /// Erases the line.
    pub fn clear(&self) {
        if self.enabled {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[2K");
            let _ = err.flush();
        }
    }
}
