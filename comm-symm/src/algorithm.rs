//! The all-reduce algorithms of `SymmComm`, selectable by name.

use std::fmt;
use std::str::FromStr;

use comm_core::{Error, Result, TrafficPattern};

/// An all-reduce algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Algorithm {
    /// `oneshot` up to 16 KiB, `twoshot` above (host; measured, see
    /// benchmarks/history/2026-11-29.md).
    Auto,
    /// Every rank reduces the whole message.
    OneShot,
    /// Reduce-scatter through the heap, then all-gather.
    TwoShot,
    /// Every rank pushes its data into every peer's inbox; arrival is detected in the data
    /// itself (a -0.0 sentinel), with no barrier. Float dtypes only; integer dtypes use
    /// `OneShot`.
    Lamport,
}

impl Algorithm {
    /// Every algorithm name, as accepted by [`FromStr`].
    pub const NAMES: [&'static str; 4] = ["auto", "oneshot", "twoshot", "lamport"];

    /// How each named algorithm moves data, for cost models (`auto` depends on the size).
    pub const PATTERNS: [(&'static str, TrafficPattern); 3] = [
        ("oneshot", TrafficPattern::OneShotPull),
        ("twoshot", TrafficPattern::TwoShotPull),
        ("lamport", TrafficPattern::OneShotPush),
    ];

    /// The algorithm's name.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Auto => "auto",
            Algorithm::OneShot => "oneshot",
            Algorithm::TwoShot => "twoshot",
            Algorithm::Lamport => "lamport",
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Algorithm {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "auto" => Ok(Algorithm::Auto),
            "oneshot" | "one-shot" => Ok(Algorithm::OneShot),
            "twoshot" | "two-shot" => Ok(Algorithm::TwoShot),
            "lamport" => Ok(Algorithm::Lamport),
            other => Err(Error::InvalidArgument(format!(
                "unknown symm algorithm `{other}` (one of {})",
                Algorithm::NAMES.join(", ")
            ))),
        }
    }
}
