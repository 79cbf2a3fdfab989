//! [`Env`]: the environment variables of one prefix (`COMM_IPC`, `COMM_NCCL`, ...), read
//! one way by every crate: one vocabulary for numbers, durations and switches, and a clear
//! error naming the variable for a value that does not parse.

use std::time::Duration;

use crate::error::{Error, Result};

/// The environment variables of one prefix (`COMM_IPC`, `COMM_SYMM`, `COMM_NCCL`), read one way.
#[derive(Debug, Clone, Copy)]
pub struct Env<'a>(pub &'a str);

impl Env<'_> {
    fn name(&self, key: &str) -> String {
        format!("{}_{key}", self.0)
    }

    fn bad(&self, key: &str, v: &str, want: &str) -> Error {
        Error::InvalidArgument(format!("{}: cannot use `{v}` ({want})", self.name(key)))
    }

    /// The value of `<prefix>_<key>`, trimmed; `None` when unset or blank.
    pub fn var(&self, key: &str) -> Option<String> {
        std::env::var(self.name(key))
            .ok()
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
    }

    /// A non-negative integer.
    pub fn number(&self, key: &str) -> Result<Option<usize>> {
        self.var(key)
            .map(|v| v.parse().map_err(|_| self.bad(key, &v, "a number")))
            .transpose()
    }

    /// A positive, finite number of seconds.
    pub fn seconds(&self, key: &str) -> Result<Option<Duration>> {
        self.var(key)
            .map(|v| match v.parse::<f64>() {
                Ok(s) if s.is_finite() && s > 0.0 => Ok(Duration::from_secs_f64(s)),
                _ => Err(self.bad(key, &v, "seconds > 0")),
            })
            .transpose()
    }

    /// A switch: `1`/`0`, `true`/`false`, `yes`/`no`, `on`/`off` (any case).
    pub fn switch(&self, key: &str) -> Result<Option<bool>> {
        self.var(key)
            .map(|v| match v.to_ascii_lowercase().as_str() {
                "1" | "true" | "yes" | "on" => Ok(true),
                "0" | "false" | "no" | "off" => Ok(false),
                _ => Err(self.bad(key, &v, "1/0, true/false, yes/no or on/off")),
            })
            .transpose()
    }
}
