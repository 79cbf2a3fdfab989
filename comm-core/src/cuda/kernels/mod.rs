//! Kernels: the `.cu` registry, NVRTC compilation and the cache.
//!
//! Every crate that launches kernels keeps them as `.cu` files in its `kernels/` folder
//! and lists them as [`KernelSource`]s (`comm_core::cuda::kernels::KERNELS` here); the
//! `kernels` program of `comm-examples` walks those lists and builds each for every arch,
//! which is how CI proves they compile without a GPU. At run time [`KernelCache`] compiles
//! a source for the running device's arch at first use (cubin from `sm_XX`), keeps the
//! image in memory and on disk, and loads it once per context.
//!
//! Sources may `#include` the [`HEADERS`] by name (NVRTC gets them in memory), so no
//! CUDA include folder is needed. bf16/f16 conversions live in `comm_dtypes.cuh`, block-wide
//! sums in `comm_reduce.cuh`. [`resources`] reports what each kernel uses per thread
//! (registers, stack, spills), so that tests can keep hot kernels out of local memory.

mod cache;
mod nvrtc;
mod resources;

pub use cache::{KernelCache, cache_key};
pub use nvrtc::{Image, compile, nvrtc_version, supported_archs};
pub use resources::{KernelResources, resources};

/// One `.cu` file of a crate, by file name and text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelSource {
    /// File name (`fill_check.cu`); names the program in NVRTC logs and the disk cache.
    pub name: &'static str,
    /// The CUDA C++ text.
    pub source: &'static str,
}

/// Headers that every source may include by name.
pub const HEADERS: &[KernelSource] = &[
    KernelSource {
        name: "comm_dtypes.cuh",
        source: include_str!("../../../kernels/comm_dtypes.cuh"),
    },
    KernelSource {
        name: "comm_reduce.cuh",
        source: include_str!("../../../kernels/comm_reduce.cuh"),
    },
];

/// Fill and check kernels for test data on the device (see [`crate::cuda::pattern`]).
pub const FILL_CHECK: KernelSource = KernelSource {
    name: "fill_check.cu",
    source: include_str!("../../../kernels/fill_check.cu"),
};

/// Every kernel source of `comm-core`.
pub const KERNELS: &[KernelSource] = &[FILL_CHECK];

/// 64-bit FNV-1a: a stable hash for cache keys (std's hasher may change between releases).
pub(crate) fn fnv1a64(parts: &[&[u8]]) -> u64 {
    let mut hash = 0xcbf2_9ce4_8422_2325u64;
    for part in parts {
        for &b in *part {
            hash ^= u64::from(b);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
        // Separate the parts, so that ("ab", "c") and ("a", "bc") differ.
        hash ^= 0xff;
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_include_names_a_registered_header() {
        for src in KERNELS {
            for line in src.source.lines() {
                if let Some(rest) = line.trim().strip_prefix("#include") {
                    let name = rest
                        .trim()
                        .trim_matches(|c| c == '"' || c == '<' || c == '>');
                    assert!(
                        HEADERS.iter().any(|h| h.name == name),
                        "{} includes {name}, which is not in HEADERS",
                        src.name
                    );
                }
            }
        }
    }

    #[test]
    fn fnv_separates_parts() {
        assert_ne!(fnv1a64(&[b"ab", b"c"]), fnv1a64(&[b"a", b"bc"]));
        assert_eq!(fnv1a64(&[b"x"]), fnv1a64(&[b"x"]));
    }
}
