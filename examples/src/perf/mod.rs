//! `allreduce-perf`: an all-reduce size sweep in the manner of nccl-tests' `all_reduce_perf`.
//!
//! For every backend asked for (or every default backend of the launch mode) it runs
//! each message size a few times untimed, then times each call on every rank, out of
//! place and in place, and prints one line per size: size, count, type, op, then per
//! placement time (median over iterations, maximum over ranks), algorithm and bus
//! bandwidth, and with `--check` the number of wrong elements. The pieces: [`args`]
//! (flags), [`sweep`] (what each rank does), [`data`] (inputs and the reference check),
//! [`meta`] (the run's header and JSON metadata), [`report`] (table, JSON, CSV), [`plot`]
//! (SVG), [`progress`] (stderr), [`launches`] (eager calls, CUDA-graph replays or both),
//! [`tune`] (a comm-select tuning table), and [`cli`], which ties them together for the
//! binary.

pub mod args;
pub mod cli;
pub mod data;
pub mod launches;
pub mod meta;
pub mod plot;
pub mod progress;
pub mod report;
pub mod sweep;
pub mod tune;

pub use report::Row;
pub use sweep::{Algorithms, SweepConfig, run_in_process, run_rank};
