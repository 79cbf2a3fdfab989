//! `comm-examples`: the programs a user of `comm` runs first, and the pieces they share.
//!
//! The main program is `allreduce-perf`, an all-reduce size sweep modelled on nccl-tests'
//! `all_reduce_perf` (see [`perf`]). It runs every backend named in the [`backends`]
//! registry, either as threads of one process ("in-process ranks") or, under `mpirun` or
//! `torchrun`, one rank per process; [`launch`] decides which and starts the ranks.
//! `hello` (in `examples/`) is the smallest program that uses the API.
//!
//! `verify-step` times the seeds' decode step (122 dependent all-reduces of 42 KB) per
//! backend, as one CUDA graph on a GPU (see [`step`]).
//!
//! `plot-figures` draws recorded figures (a CSV) as an SVG latency plot ([`figures`]).
//!
//! `kernels` builds every `.cu` of the workspace with NVRTC for a list of archs;
//! [`all_kernel_sources`] is the registry it walks: every crate that keeps `.cu` files
//! exports them as a list of [`KernelSource`]s, gathered here.

#![warn(missing_docs)]

pub mod backends;
pub mod copy_probe;
pub mod figures;
pub mod gpu;
pub mod graph;
pub mod host_floor;
pub mod host_probe;
pub mod launch;
pub mod launch_cost;
pub mod perf;
pub mod step;
pub mod usage;

use comm_core::cuda::KernelSource;

/// Every kernel source of the workspace, with the crate it belongs to.
pub fn all_kernel_sources() -> Vec<(&'static str, KernelSource)> {
    let lists: [(&str, &[KernelSource]); 4] = [
        ("comm-core", comm_core::cuda::kernels::KERNELS),
        ("comm-nccl", comm_nccl::KERNELS),
        ("comm-peer", comm_peer::KERNELS),
        (
            "comm-examples",
            &[
                step::gpu::STEP_CHAIN,
                step::fused::ADD_RMSNORM,
                launch_cost::LAUNCH_PROBE,
                host_probe::HOST_PROBE,
                copy_probe::COPY_PROBE,
            ],
        ),
    ];
    lists
        .into_iter()
        .flat_map(|(krate, list)| list.iter().map(move |k| (krate, *k)))
        .collect()
}
