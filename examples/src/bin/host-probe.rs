//! `host-probe`: what a GPU pays to reach mapped host memory (see
//! `comm_examples::host_probe`).
//!
//! ```text
//! host-probe [--device N] [--sizes 8K,43008,256K,1M] [--blocks 1,2,4,8,16,32,64,128] [--reps 50]
//!            [--json FILE]
//! ```
//!
//! `--json` also writes the floors the figures give (`comm_examples::host_probe::Floors`:
//! one load, the fastest flag trip, a fence, the fastest read and write of each size, an
//! empty kernel in graph replay),
//! which `host-floor` sets beside all-reduce figures of the same run.

use std::process::ExitCode;

use comm_examples::host_probe::{BURST_LOADS, Floors, LOAD_KINDS, measure};
use comm_examples::perf::args::parse_sizes;

const USAGE: &str =
    "usage: host-probe [--device N] [--sizes LIST] [--blocks LIST] [--reps N] [--json FILE]";

struct Options {
    device: usize,
    sizes: Vec<usize>,
    blocks: Vec<u32>,
    reps: usize,
    json: Option<std::path::PathBuf>,
}

fn parse() -> Result<Option<Options>, String> {
    let mut o = Options {
        device: 0,
        sizes: vec![8 << 10, 43008, 256 << 10, 1 << 20],
        blocks: vec![1, 2, 4, 8, 16, 32, 64, 128],
        reps: 50,
        json: None,
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
            "--json" => o.json = Some(value.into()),
            "--sizes" => {
                o.sizes = parse_sizes(&value, None)
                    .map_err(|e| e.to_string())?
                    .into_iter()
                    .map(|b| b as usize)
                    .collect()
            }
            "--blocks" => {
                o.blocks = value
                    .split(',')
                    .map(|b| number(b).map(|n| n as u32))
                    .collect::<Result<_, _>>()?
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(Some(o))
}

fn main() -> ExitCode {
    let o = match comm_examples::usage::options_or_exit("host-probe", USAGE, parse()) {
        Ok(options) => options,
        Err(code) => return code,
    };
    let report = match measure(o.device, &o.sizes, &o.blocks, o.reps) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("host-probe: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Some(path) = &o.json {
        let written = Floors::from_report(&report).and_then(|floors| {
            let text = serde_json::to_string_pretty(&floors).map_err(std::io::Error::other)?;
            std::fs::write(path, text + "\n").map_err(comm_core::Error::from)
        });
        if let Err(e) = written {
            eprintln!("host-probe: {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
    }
    println!(
        "# host-probe: GPU {}, pinned host memory mapped into it; GPU times, medians of {}",
        o.device, o.reps
    );
    println!(
        "one dependent load: host memory {:.0} ns, device memory {:.0} ns",
        report.host_load_ns, report.device_load_ns
    );
    println!(
        "an empty kernel in graph replay, launched as the peer kernels are: {:.2} us on one \
         stream, {:.2} us each with two streams replaying at once",
        report.kernel_us, report.kernel_pair_us
    );
    match &report.handshakes {
        Ok(h) => {
            for h in h {
                println!(
                    "a call of two streams that hear from each other once through host memory \
                     (graphs, {} fence after the flag): {:.2} us",
                    if h.fence { "a" } else { "no" },
                    h.per_call_us
                );
            }
        }
        Err(e) => println!("handshake: {e}"),
    }
    match &report.eager_handshake {
        Ok(e) => println!(
            "the same call launched eagerly by two threads: {:.2} us framed by events, {:.2} us \
             back to back",
            e.framed_us, e.back_to_back_us
        ),
        Err(e) => println!("eager handshake: {e}"),
    }
    for p in &report.pingpongs {
        let between = if p.two_gpus {
            "two GPUs"
        } else {
            "two streams of one GPU"
        };
        let fence = if p.fence { "fenced" } else { "no fence" };
        let pages = if p.pages == 1 {
            "one page".to_string()
        } else {
            format!("a new page of {} each round", p.pages)
        };
        let what = format!(
            "a flag between {between} through host memory ({}, {fence}, {pages})",
            p.memory.name()
        );
        match &p.one_way_ns {
            Ok(ns) => println!("{what}: {ns:.0} ns (half a round)"),
            Err(e) => println!("{what}: failed: {e}"),
        }
    }
    for p in &report.staggered {
        let what = format!(
            "a flag stored {} with {} polls in flight, {} cycles apart, {}",
            p.store.name(),
            p.polls,
            p.gap_cycles,
            if p.spread {
                "each on a copy of its own"
            } else {
                "all on one word"
            }
        );
        match &p.one_way_ns {
            Ok(ns) => println!("{what}: {ns:.0} ns (half a round)"),
            Err(e) => println!("{what}: failed: {e}"),
        }
    }
    println!("one host load after one block's stores (512 threads):");
    println!(
        "{:>10} {:>12} {:>9} {:>9} {:>9}",
        "bytes", "stored into", "fence", "load ns", "issue ns"
    );
    for w in &report.after_writes {
        println!(
            "{:>10} {:>12} {:>9} {:>9.0} {:>9.0}",
            w.bytes,
            if w.into_host { "host" } else { "device" },
            if w.fence { "yes" } else { "no" },
            w.load_ns,
            w.issue_ns
        );
    }
    println!("one thread's independent 16-byte loads of host memory, all issued first (ns):");
    print!("{:>12}", "loads");
    for n in BURST_LOADS {
        print!(" {n:>8}");
    }
    println!();
    for (kind, name) in LOAD_KINDS.iter().enumerate() {
        print!("{name:>12}");
        for b in report.bursts.iter().filter(|b| b.kind == kind) {
            print!(" {:>8.0}", b.ns);
        }
        println!();
    }
    println!(
        "reads and writes of a message by one grid, and by two grids at once (a message each, \
         as two ranks of one GPU share its link; duplex: one writes while the other reads; both \
         ways: two messages written while two are read, by 4 x blocks, the fastest split and \
         its writing blocks), us:"
    );
    println!(
        "{:>10} {:>7} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8}",
        "bytes",
        "blocks",
        "read",
        "read .cv",
        "write",
        "read GB/s",
        "write GB/s",
        "2 read",
        "2 write",
        "duplex",
        "both ways",
        "writers"
    );
    for m in report.moves {
        let gbs = |us: f64| m.bytes as f64 / us / 1e3;
        println!(
            "{:>10} {:>7} {:>9.2} {:>9.2} {:>9.2} {:>9.1} {:>9.1} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>8}",
            m.bytes,
            m.blocks,
            m.read_us,
            m.read_cv_us,
            m.write_us,
            gbs(m.read_us.min(m.read_cv_us)),
            gbs(m.write_us),
            m.pair_read_us,
            m.pair_write_us,
            m.duplex_us,
            m.both_ways_us,
            m.both_ways_writers
        );
    }
    ExitCode::SUCCESS
}
