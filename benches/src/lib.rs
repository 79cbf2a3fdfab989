//! Benchmarks of the comm crates live in `benches/`; this library is empty.
