//! `plot-figures`: recorded figures (a CSV of time by message size, one column per line)
//! drawn as one log-log latency plot, with the same axes and style as `allreduce-perf
//! --plot`. BENCHMARKS.md's plots of figures measured by other runs come from here.
//!
//! The CSV: `#` lines are comments; the first other line names the columns (`bytes`, then
//! one name per line of the plot); each row is a message size in bytes and a value per
//! line, an empty cell where that line has no figure.

use std::path::Path;

use plotters::prelude::*;

use crate::perf::plot::{Series, panel};

/// Pixel size of the figure.
const SIZE: (u32, u32) = (900, 560);

/// The lines of a CSV of figures (see the module docs).
pub fn parse_csv(text: &str) -> Result<Series, String> {
    let mut rows = text
        .lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l.trim()))
        .filter(|(_, l)| !l.is_empty() && !l.starts_with('#'));
    let (_, header) = rows.next().ok_or("no header line")?;
    let names: Vec<&str> = header.split(',').map(str::trim).collect();
    if names.len() < 2 || names[0] != "bytes" {
        return Err(format!(
            "the header must be `bytes,NAME,...`, not `{header}`"
        ));
    }
    let mut series: Series = names[1..]
        .iter()
        .map(|n| (n.to_string(), Vec::new()))
        .collect();
    for (line, row) in rows {
        let cells: Vec<&str> = row.split(',').map(str::trim).collect();
        if cells.len() != names.len() {
            return Err(format!(
                "line {line}: {} cells, the header has {}",
                cells.len(),
                names.len()
            ));
        }
        let number = |cell: &str| -> Result<f64, String> {
            match cell.parse::<f64>() {
                Ok(v) if v > 0.0 && v.is_finite() => Ok(v),
                _ => Err(format!("line {line}: `{cell}` is not a positive number")),
            }
        };
        let bytes = number(cells[0])?;
        for (cell, (_, points)) in cells[1..].iter().zip(series.iter_mut()) {
            if !cell.is_empty() {
                points.push((bytes, number(cell)?));
            }
        }
    }
    Ok(series)
}

/// Draws `series` (time in microseconds by message size) into the SVG `path`.
pub fn write_svg(path: &Path, title: &str, series: &Series) -> std::io::Result<()> {
    let draw = || -> Result<(), Box<dyn std::error::Error>> {
        let root = SVGBackend::new(path, SIZE).into_drawing_area();
        root.fill(&WHITE)?;
        let root = root.titled(title, ("sans-serif", 20))?;
        panel(&root, "latency", "time (us)", series)?;
        root.present()?;
        Ok(())
    };
    draw().map_err(|e| std::io::Error::other(format!("plot: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_become_lines_and_empty_cells_are_skipped() {
        let csv = "# from a run\nbytes, nccl, auto\n64,5.7,3.2\n\n43008,7.5,\n";
        let series = parse_csv(csv).unwrap();
        assert_eq!(series.len(), 2);
        assert_eq!(
            series[0],
            ("nccl".into(), vec![(64.0, 5.7), (43008.0, 7.5)])
        );
        assert_eq!(series[1], ("auto".into(), vec![(64.0, 3.2)]));
    }

    #[test]
    fn bad_tables_say_where() {
        assert!(parse_csv("").unwrap_err().contains("header"));
        assert!(parse_csv("size,a\n1,2").unwrap_err().contains("bytes"));
        assert!(parse_csv("bytes,a\n1,2,3").unwrap_err().contains("line 2"));
        assert!(parse_csv("bytes,a\n1,-2").unwrap_err().contains("line 2"));
    }

    #[test]
    fn a_plot_is_written() {
        let dir = std::env::temp_dir().join(format!("figures-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.svg");
        let series = parse_csv("bytes,a,b\n8,1,2\n1024,1.5,2.5\n").unwrap();
        write_svg(&path, "test", &series).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("test"), "{svg}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
