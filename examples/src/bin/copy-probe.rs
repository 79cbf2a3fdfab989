//! `copy-probe`: what the copy engines carry between device and host memory and between
//! two GPUs (see `comm_examples::copy_probe`).
//!
//! ```text
//! copy-probe [--device N] [--sizes 16M,64M,256M] [--reps 10]
//! ```

use std::process::ExitCode;

use comm_examples::copy_probe::measure;
use comm_examples::perf::args::parse_sizes;

const USAGE: &str = "usage: copy-probe [--device N] [--sizes LIST] [--reps N]";

struct Options {
    device: usize,
    sizes: Vec<usize>,
    reps: usize,
}

fn parse() -> Result<Option<Options>, String> {
    let mut o = Options {
        device: 0,
        sizes: vec![16 << 20, 64 << 20, 256 << 20],
        reps: 10,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        if flag == "-h" || flag == "--help" {
            return Ok(None);
        }
        let value = args.next().ok_or(format!("{flag} needs a value"))?;
        let number = |v: &str| {
            v.parse::<usize>()
                .map_err(|_| format!("{flag}: `{v}` is not a number"))
        };
        match flag.as_str() {
            "--device" => o.device = number(&value)?,
            "--reps" => o.reps = number(&value)?.max(1),
            "--sizes" => {
                o.sizes = parse_sizes(&value, None)
                    .map_err(|e| e.to_string())?
                    .into_iter()
                    .map(|b| b as usize)
                    .collect()
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(Some(o))
}

fn main() -> ExitCode {
    let o = match parse() {
        Ok(Some(o)) => o,
        Ok(None) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("copy-probe: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
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
    ExitCode::SUCCESS
}
