//! `plot-figures`: draws a CSV of recorded figures as an SVG latency plot (see
//! `comm_examples::figures`).
//!
//! ```text
//! cargo run -p comm-examples --bin plot-figures -- TABLE.csv OUT.svg "TITLE"
//! ```

use std::path::PathBuf;
use std::process::ExitCode;

use comm_examples::figures::{parse_csv, write_svg};

const USAGE: &str = "usage: plot-figures TABLE.csv OUT.svg TITLE";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let parsed = match args.as_slice() {
        [h] if h == "-h" || h == "--help" => Ok(None),
        [csv, svg, title] => Ok(Some((
            PathBuf::from(csv),
            PathBuf::from(svg),
            title.clone(),
        ))),
        _ => Err("expected three arguments"),
    };
    let (csv, svg, title) =
        match comm_examples::usage::options_or_exit("plot-figures", USAGE, parsed) {
            Ok(options) => options,
            Err(code) => return code,
        };
    let result = std::fs::read_to_string(&csv)
        .map_err(|e| format!("{}: {e}", csv.display()))
        .and_then(|text| parse_csv(&text).map_err(|e| format!("{}: {e}", csv.display())))
        .and_then(|series| write_svg(&svg, &title, &series).map_err(|e| e.to_string()));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("plot-figures: {e}");
            ExitCode::FAILURE
        }
    }
}
