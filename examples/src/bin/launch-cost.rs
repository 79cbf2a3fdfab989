//! `launch-cost`: what enqueuing work costs on this machine (see `comm_examples::launch_cost`).
//!
//! ```text
//! launch-cost [--device N] [--calls N]
//! ```

use std::process::ExitCode;

use comm_examples::launch_cost::measure;

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
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("launch-cost: {e}");
            ExitCode::FAILURE
        }
    }
}
