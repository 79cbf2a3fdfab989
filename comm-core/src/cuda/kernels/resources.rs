//! What each kernel of a compiled source uses per thread (registers, stack, spills), from
//! ptxas's verbose report: a kernel that grows a stack frame or spills keeps values in
//! local memory, which small latency-bound collectives pay for on every call.

use super::KernelSource;
use super::nvrtc::compile_with;
use crate::error::{Error, Result};

/// The per-thread resources of one kernel (an `extern "C" __global__` entry).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelResources {
    /// The entry's name.
    pub name: String,
    /// Registers per thread.
    pub registers: u32,
    /// Bytes of stack frame per thread (local memory).
    pub stack_bytes: u32,
    /// Bytes of registers spilled to local memory per thread.
    pub spill_store_bytes: u32,
    /// Bytes reloaded from those spills per thread.
    pub spill_load_bytes: u32,
}

impl KernelResources {
    /// True when the kernel keeps nothing in local memory.
    pub fn no_local_memory(&self) -> bool {
        self.stack_bytes == 0 && self.spill_store_bytes == 0 && self.spill_load_bytes == 0
    }
}

/// Compiles `source` for `arch` (an `sm_XX`) and returns every entry's resources, in the
/// order ptxas reports them.
pub fn resources(source: &KernelSource, arch: &str) -> Result<Vec<KernelResources>> {
    if !arch.starts_with("sm_") {
        return Err(Error::InvalidArgument(format!(
            "kernel resources need a real arch (sm_XX), got {arch}"
        )));
    }
    let (_, log) = compile_with(source, arch, &["--ptxas-options=--verbose"])?;
    Ok(parse(&log))
}

/// Reads ptxas's verbose report: `Compiling entry function 'NAME'`, then the line with
/// `N bytes stack frame, N bytes spill stores, N bytes spill loads`, then `Used N registers`.
fn parse(log: &str) -> Vec<KernelResources> {
    let mut out = Vec::new();
    let mut current: Option<KernelResources> = None;
    for line in log.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            let name = rest.split('\'').next().unwrap_or_default().to_string();
            current = Some(KernelResources {
                name,
                registers: 0,
                stack_bytes: 0,
                spill_store_bytes: 0,
                spill_load_bytes: 0,
            });
        } else if let Some(k) = current.as_mut() {
            if line.contains("bytes stack frame") {
                k.stack_bytes = number_before(line, "bytes stack frame");
                k.spill_store_bytes = number_before(line, "bytes spill stores");
                k.spill_load_bytes = number_before(line, "bytes spill loads");
            } else if line.contains("registers") && line.contains("Used") {
                k.registers = number_before(line, "registers");
                out.extend(current.take());
            }
        }
    }
    out
}

/// The number just before `label` in `line` (0 if none).
fn number_before(line: &str, label: &str) -> u32 {
    line.split(label)
        .next()
        .and_then(|head| head.split_whitespace().last())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_every_entry_of_a_ptxas_report() {
        let log = "\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'peer_oneshot_push_bf16_sum' for 'sm_90'
ptxas info    : Function properties for peer_oneshot_push_bf16_sum
ptxas         .     32 bytes stack frame, 4 bytes spill stores, 8 bytes spill loads
ptxas info    : Used 126 registers, used 1 barriers, 32 bytes cumulative stack size, 232 bytes smem
ptxas info    : Compiling entry function 'peer_oneshot_pull_bf16_sum' for 'sm_90'
ptxas info    : Function properties for peer_oneshot_pull_bf16_sum
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 64 registers, used 1 barriers, 232 bytes smem
";
        let got = parse(log);
        assert_eq!(
            got,
            vec![
                KernelResources {
                    name: "peer_oneshot_push_bf16_sum".into(),
                    registers: 126,
                    stack_bytes: 32,
                    spill_store_bytes: 4,
                    spill_load_bytes: 8,
                },
                KernelResources {
                    name: "peer_oneshot_pull_bf16_sum".into(),
                    registers: 64,
                    stack_bytes: 0,
                    spill_store_bytes: 0,
                    spill_load_bytes: 0,
                },
            ]
        );
        assert!(!got[0].no_local_memory());
        assert!(got[1].no_local_memory());
    }

    #[test]
    fn a_virtual_arch_is_refused() {
        let e = resources(&super::super::FILL_CHECK, "compute_90").unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    }
}
