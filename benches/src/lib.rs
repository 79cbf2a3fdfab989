//! `comm-benches`: criterion benchmarks of the comm crates.
//!
//! The benchmarks are in `benches/` (`cargo bench -p comm-benches`); this library is
//! empty and exists because a package needs a library or binary target.

#![warn(missing_docs)]
