//! `comm-benches`: criterion benchmarks of the comm crates.
//!
//! The benchmarks are in `benches/` (`cargo bench -p comm-benches`): host backends
//! (`local_allreduce`, `select_overhead`) and every GPU backend (`gpu_allreduce`). This
//! library holds what the GPU benches share: [`gpu`] keeps ranks as threads of the bench
//! process, one per GPU or several sharing one, and times their calls by CUDA events.

#![warn(missing_docs)]

pub mod gpu;
