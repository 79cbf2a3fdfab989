//! Runnable programs of the `comm` crates (see `src/bin`).
//!
//! [`all_kernel_sources`] is the workspace's kernel registry: every crate that keeps
//! `.cu` files exports them as a list of [`KernelSource`]s, and this gathers the lists so
//! that the `kernels` program can build each one for each arch.
#![warn(missing_docs)]

use comm_core::cuda::KernelSource;

/// Every kernel source of the workspace, with the crate it belongs to.
pub fn all_kernel_sources() -> Vec<(&'static str, KernelSource)> {
    let lists: [(&str, &[KernelSource]); 2] = [
        ("comm-core", comm_core::cuda::kernels::KERNELS),
        ("comm-nccl", comm_nccl::KERNELS),
    ];
    lists
        .into_iter()
        .flat_map(|(krate, list)| list.iter().map(move |k| (krate, *k)))
        .collect()
}
