//! `kernels`: compiles every `.cu` of the workspace with NVRTC for the given archs.
//!
//! ```text
//! cargo run -p comm-examples --bin kernels -- --arch sm_80,sm_90,sm_100,sm_120
//! ```
//!
//! Prints one line per kernel and arch with the image size, and exits non-zero if any
//! compilation fails. Needs only `libnvrtc` (and its builtins) on `LD_LIBRARY_PATH`, no
//! GPU: this is how CI proves that every kernel builds for every arch we ship.
//!
//! `--resources` also lists, per entry of each `sm_XX` image, the registers, stack frame and
//! spills per thread (ptxas's report), marking the entries that use local memory.
//!
//! `--fill-cache` compiles through the kernel cache instead, so that the images land in its
//! folder (`COMM_KERNEL_CACHE`, ...): a GPU machine given that folder loads them at once.

use std::process::ExitCode;

use std::sync::Arc;

use comm_core::cuda::kernels::{Image, KernelCache, compile, nvrtc_version, resources};

const DEFAULT_ARCHS: &str = "sm_80,sm_90,sm_100,sm_120";
const USAGE: &str = "usage: kernels [--arch sm_80,sm_90,...] [--resources] [--fill-cache]  (default sm_80,sm_90,sm_100,sm_120)";

fn main() -> ExitCode {
    let (archs, show_resources, fill_cache) =
        match comm_examples::usage::options_or_exit("kernels", USAGE, parse_args()) {
            Ok(options) => options,
            Err(code) => return code,
        };
    match nvrtc_version() {
        Ok((major, minor)) => println!("nvrtc {major}.{minor}"),
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    }
    let mut failures = 0;
    for (krate, source) in comm_examples::all_kernel_sources() {
        for arch in archs.split(',').map(str::trim).filter(|a| !a.is_empty()) {
            let image = if fill_cache {
                KernelCache::global().image(&source, arch)
            } else {
                compile(&source, arch).map(Arc::new)
            };
            match image {
                Ok(image) => {
                    let kind = match *image {
                        Image::Cubin(_) => "cubin",
                        Image::Ptx(_) => "ptx",
                    };
                    println!(
                        "ok    {krate}/{:<24} {arch:<8} {kind:<5} {:>9} bytes",
                        source.name,
                        image.bytes().len()
                    );
                    if show_resources && arch.starts_with("sm_") {
                        failures += print_resources(&source, arch);
                    }
                }
                Err(e) => {
                    failures += 1;
                    println!("FAIL  {krate}/{:<24} {arch:<8} {e}", source.name);
                }
            }
        }
    }
    if failures > 0 {
        eprintln!("{failures} compilation(s) failed");
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// Each entry's registers, stack and spills per thread; 1 if ptxas's report failed.
fn print_resources(source: &comm_core::cuda::KernelSource, arch: &str) -> usize {
    match resources(source, arch) {
        Ok(entries) => {
            for k in entries {
                println!(
                    "      {:<40} {:>4} regs {:>5} B stack {:>5} B spilled {:>5} B reloaded{}",
                    k.name,
                    k.registers,
                    k.stack_bytes,
                    k.spill_store_bytes,
                    k.spill_load_bytes,
                    if k.no_local_memory() {
                        ""
                    } else {
                        "  <- local memory"
                    }
                );
            }
            0
        }
        Err(e) => {
            println!("FAIL  resources of {} for {arch}: {e}", source.name);
            1
        }
    }
}

/// `--arch LIST` and `--resources`, or `None` for `--help`.
fn parse_args() -> Result<Option<(String, bool, bool)>, lexopt::Error> {
    use lexopt::prelude::*;

    let mut archs = DEFAULT_ARCHS.to_string();
    let mut show_resources = false;
    let mut fill_cache = false;
    let mut parser = lexopt::Parser::from_env();
    while let Some(arg) = parser.next()? {
        match arg {
            Long("arch") => archs = parser.value()?.string()?,
            Long("resources") => show_resources = true,
            Long("fill-cache") => fill_cache = true,
            Short('h') | Long("help") => return Ok(None),
            _ => return Err(arg.unexpected()),
        }
    }
    Ok(Some((archs, show_resources, fill_cache)))
}
