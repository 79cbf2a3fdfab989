//! `launch-cost`: what enqueuing work costs on this machine (see `comm_examples::launch_cost`).
//!
//! ```text
//! launch-cost [--device N] [--calls N]
//! ```

use std::process::ExitCode;

use comm_examples::launch_cost::{concurrent, measure};

const USAGE: &str = "usage: launch-cost [--device N] [--calls N]";

fn main() -> ExitCode {
    let (mut device, mut calls) = (0usize, 10_000usize);
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let target = match flag.as_str() {
            "--device" => &mut device,
            "--calls" => &mut calls,
            "-h" | "--help" => {
                println!("{USAGE}");
                return ExitCode::SUCCESS;
            }
            other => {
                eprintln!("launch-cost: unknown argument {other}\n{USAGE}");
                return ExitCode::from(2);
            }
        };
        match args.next().map(|v| v.parse()) {
            Some(Ok(v)) if v > 0 => *target = v,
            _ => {
                eprintln!("launch-cost: {flag} takes a positive number\n{USAGE}");
                return ExitCode::from(2);
            }
        }
    }
    match measure(device, calls) {
        Ok(costs) => {
            println!("# launch-cost: GPU {device}, {calls} calls per probe (us per call)");
            println!(
                "{:<28} {:>8} {:>14} {:>8}",
                "probe", "host", "back to back", "framed"
            );
            for c in costs {
                println!(
                    "{:<28} {:>8.2} {:>14.2} {:>8.2}",
                    c.probe.name(),
                    c.host_us,
                    c.back_to_back_us,
                    c.framed_us
                );
            }
        }
        Err(e) => {
            eprintln!("launch-cost: {e}");
            return ExitCode::FAILURE;
        }
    }
    // The grids of a one-block call and of a 42 KB all-reduce of 8 ranks on one GPU.
    match concurrent(device, &[1, 2, 4, 8], 200, &[(1, 32), (6, 512)]) {
        Ok(rows) => {
            println!("# graphs of 200 empty kernels replayed on several streams at once (us)");
            println!(
                "{:>7} {:>12} {:>11} {:>12} {:>12}",
                "streams", "launch", "grid", "per round", "per kernel"
            );
            for r in rows {
                println!(
                    "{:>7} {:>12} {:>11} {:>12.2} {:>12.2}",
                    r.streams,
                    if r.overlapping {
                        "overlapping"
                    } else {
                        "plain"
                    },
                    format!("{}x{}", r.grid.0, r.grid.1),
                    r.per_round_us,
                    r.per_kernel_us
                );
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("launch-cost: {e}");
            ExitCode::FAILURE
        }
    }
}
