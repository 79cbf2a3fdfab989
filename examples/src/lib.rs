//! `comm-examples`: the programs a user of `comm` runs first, and the pieces they share.
//!
//! The main program is `allreduce-perf`, an all-reduce size sweep modelled on nccl-tests'
//! `all_reduce_perf` (see [`perf`]). It runs every backend named in the [`backends`]
//! registry, either as threads of one process ("in-process ranks") or, under `mpirun` or
//! `torchrun`, one rank per process; [`launch`] decides which and starts the ranks.
//! `hello` (in `examples/`) is the smallest program that uses the API.

#![warn(missing_docs)]

pub mod backends;
pub mod launch;
pub mod perf;
