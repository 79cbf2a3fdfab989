//! `copy-probe`: what the copy engines carry between device and host memory and between
//! two GPUs (see `comm_examples::copy_probe`).
//!
//! ```text
//! copy-probe [--device N] [--sizes 16M,64M,256M] [--chunks 1,4,16] [--reps 10]
//! ```
//!
//! Exits 1 when the two-shot all-reduce (two GPUs) got an element wrong.

use std::process::ExitCode;

use comm_examples::copy_probe::{measure, two_shot};
use comm_examples::gpu::args;
use comm_examples::perf::args::parse_sizes;

const USAGE: &str = "usage: copy-probe [--device N] [--sizes LIST] [--chunks LIST] [--reps N]";

struct Options {
    device: usize,
    sizes: Vec<usize>,
    chunks: Vec<usize>,
    reps: usize,
}

fn parse() -> Result<Option<Options>, String> {
    use lexopt::prelude::*;
    let mut o = Options {
        device: 0,
        sizes: vec![16 << 20, 64 << 20, 256 << 20],
        chunks: vec![1, 4, 16],
        reps: 10,
    };
    let mut parser = lexopt::Parser::from_env();
    while let Some(arg) = parser.next().map_err(|e| e.to_string())? {
        match arg {
            Long("device") => o.device = args::number(&mut parser, "--device")?,
            Long("reps") => o.reps = args::number(&mut parser, "--reps")?.max(1),
            Long("sizes") => {
                o.sizes = parse_sizes(&args::value(&mut parser)?, None)
                    .map_err(|e| e.to_string())?
                    .into_iter()
                    .map(|b| b as usize)
                    .collect()
            }
            Long("chunks") => {
                o.chunks = args::value(&mut parser)?
                    .split(',')
                    .map(|c| c.parse::<usize>().map(|n| n.max(1)))
                    .collect::<Result<_, _>>()
                    .map_err(|e| format!("--chunks: {e}"))?
            }
            Short('h') | Long("help") => return Ok(None),
            other => return Err(other.unexpected().to_string()),
        }
    }
    Ok(Some(o))
}

fn main() -> ExitCode {
    let o = match comm_examples::usage::options_or_exit("copy-probe", USAGE, parse()) {
        Ok(options) => options,
        Err(code) => return code,
    };
    let rates = match measure(o.device, &o.sizes, o.reps) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("copy-probe: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!(
        "# copy-probe: GPU {}, cuMemcpyAsync, wall time, medians of {}",
        o.device, o.reps
    );
    println!(
        "{:<36} {:>11} {:>10} {:>16}",
        "copy", "bytes", "us", "GB/s each way"
    );
    for r in rates {
        println!(
            "{:<36} {:>11} {:>10.1} {:>16.1}",
            r.what,
            r.bytes,
            r.us,
            r.gbps()
        );
    }
    let (mut ok, mut header) = (true, false);
    for &bytes in &o.sizes {
        for &chunks in &o.chunks {
            match two_shot(o.device, bytes, chunks, o.reps) {
                Ok(Some(t)) => {
                    if !header {
                        header = true;
                        println!(
                            "# two-shot all-reduce whose bytes move by copies (f32 sum, GPU {} and the next)",
                            o.device
                        );
                        println!(
                            "{:>11} {:>7} {:>10} {:>12} {:>7}",
                            "bytes", "pieces", "us", "busbw GB/s", "wrong"
                        );
                    }
                    ok &= t.wrong == 0;
                    println!(
                        "{:>11} {:>7} {:>10.1} {:>12.1} {:>7}",
                        t.bytes,
                        t.chunks,
                        t.us,
                        t.busbw(),
                        t.wrong
                    );
                }
                Ok(None) => {
                    println!(
                        "# two-shot all-reduce by copies: skipped (needs two GPUs with peer access)"
                    );
                    return ExitCode::SUCCESS;
                }
                Err(e) => {
                    eprintln!("copy-probe: two-shot of {bytes} B in {chunks} pieces: {e}");
                    return ExitCode::FAILURE;
                }
            }
        }
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        eprintln!("copy-probe: FAILED: the two-shot all-reduce got elements wrong");
        ExitCode::FAILURE
    }
}
