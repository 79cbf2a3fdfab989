//! The SVG plot: latency and bus bandwidth against message size, one line per backend.
//!
//! Two panels side by side, both with logarithmic axes, one line per backend (and
//! algorithm, and launch mode when eager and graph rows are mixed) of its out-of-place
//! times (in-place ones when only those were measured); the title says the launch mode of
//! all the lines, or each line's name does. Drawn with `plotters`' SVG
//! backend (no fonts loaded: the SVG names a font family and the viewer renders it).
//! Points that a log axis cannot show (zero bandwidth, as with one rank) are left out.

use std::path::Path;

use plotters::prelude::*;

use comm_select::Launch;

use super::report::{Row, Timing};

/// Pixel size of the whole figure.
const SIZE: (u32, u32) = (1280, 520);

/// Draws the plot of `rows` into `path`.
pub fn write_svg(path: &Path, rows: &[Row]) -> std::io::Result<()> {
    draw(path, rows).map_err(|e| std::io::Error::other(format!("plot: {e}")))
}

/// The launch mode of every row; `None` when eager and graph rows are mixed (or none).
fn common_launch(rows: &[Row]) -> Option<Launch> {
    let first = rows.first()?.launch;
    rows.iter().all(|r| r.launch == first).then_some(first)
}

/// The rows of each line: backend (and algorithm, and with `by_launch` the launch mode),
/// in the order they first appear.
fn lines(rows: &[Row], by_launch: bool) -> Vec<(String, Vec<&Row>)> {
    let mut groups: Vec<(String, Vec<&Row>)> = Vec::new();
    for row in rows {
        let label = if by_launch {
            format!("{} ({})", row.label(), row.launch)
        } else {
            row.label()
        };
        match groups.iter_mut().find(|(name, _)| *name == label) {
            Some((_, group)) => group.push(row),
            None => groups.push((label, vec![row])),
        }
    }
    groups
}

/// Named lines of (x, y) points.
pub(crate) type Series = Vec<(String, Vec<(f64, f64)>)>;

fn draw(path: &Path, rows: &[Row]) -> Result<(), Box<dyn std::error::Error>> {
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE)?;
    let launch = common_launch(rows);
    let title = match rows.first() {
        Some(r) => format!(
            "all-reduce {} {}, {} ranks, {}, {}",
            r.dtype,
            r.op,
            r.ranks,
            if r.out_of_place.is_some() {
                "out of place"
            } else {
                "in place"
            },
            match launch {
                Some(Launch::Eager) => "eager calls",
                Some(Launch::Graph) => "CUDA-graph replays",
                None => "eager and graph",
            }
        ),
        None => "all-reduce (no results)".to_string(),
    };
    let root = root.titled(&title, ("sans-serif", 22))?;
    let panels = root.split_evenly((1, 2));
    let groups = lines(rows, launch.is_none());
    let series = |value: fn(&Timing) -> f64| -> Series {
        groups
            .iter()
            .map(|(name, rows)| {
                let points = rows
                    .iter()
                    .filter_map(|r| Some((r.bytes as f64, value(r.primary()?))))
                    .filter(|&(_, y)| y > 0.0 && y.is_finite())
                    .collect();
                (name.clone(), points)
            })
            .collect()
    };
    panel(&panels[0], "latency", "time (us)", &series(|r| r.time_us))?;
    panel(
        &panels[1],
        "bus bandwidth",
        "busbw (GB/s)",
        &series(|r| r.busbw),
    )?;
    root.present()?;
    Ok(())
}

/// One log-log panel of `series`, y against message size, with a legend.
pub(crate) fn panel(
    area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    caption: &str,
    y_label: &str,
    series: &Series,
) -> Result<(), Box<dyn std::error::Error>> {
    let all = series.iter().flat_map(|(_, points)| points.iter());
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(x, y) in all {
        (x0, x1, y0, y1) = (x0.min(x), x1.max(x), y0.min(y), y1.max(y));
    }
    if x0 > x1 {
        // Nothing to show; an empty frame still tells the reader so.
        (x0, x1, y0, y1) = (1.0, 2.0, 1.0, 2.0);
    }
    // Pad the ranges so that points do not sit on the frame.
    let (x0, x1, y0, y1) = (x0 / 1.5, x1 * 1.5, y0 / 2.0, y1 * 2.0);
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        // Sizes are swept by powers of two: ticks there read as 1K, 4M rather than 9.8K.
        .build_cartesian_2d((x0..x1).log_scale().base(2.0), (y0..y1).log_scale())?;
    chart
        .configure_mesh()
        .x_desc("message size (bytes)")
        .y_desc(y_label)
        .x_label_formatter(&|x| bytes_label(*x))
        .y_label_formatter(&|y| number_label(*y))
        .light_line_style(WHITE.mix(0.0))
        .draw()?;
    for (i, (name, points)) in series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(
                points.iter().copied(),
                color.stroke_width(2),
            ))?
            .label(name.as_str())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        chart.draw_series(points.iter().map(|&p| Circle::new(p, 3, color.filled())))?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()?;
    Ok(())
}

/// `1024` -> `1K`, `3145728` -> `3M`; other values with one decimal.
pub fn bytes_label(x: f64) -> String {
    let units = [(1u64 << 30, "G"), (1 << 20, "M"), (1 << 10, "K")];
    for (scale, unit) in units {
        let v = x / scale as f64;
        if v >= 1.0 {
            return trim(v, unit);
        }
    }
    trim(x, "")
}

fn trim(v: f64, unit: &str) -> String {
    if (v - v.round()).abs() < 0.05 {
        format!("{}{unit}", v.round())
    } else {
        format!("{v:.1}{unit}")
    }
}

/// `1000`, `2.5`, `0.01`: enough decimals for the first significant digit.
fn number_label(y: f64) -> String {
    if y >= 100.0 || y == y.round() {
        format!("{y:.0}")
    } else if y >= 1.0 {
        format!("{y:.1}")
    } else if y > 0.0 {
        let decimals = (-y.log10()).ceil() as usize;
        format!("{y:.decimals$}")
    } else {
        format!("{y}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(backend: &str, launch: Launch) -> Row {
        Row {
            backend: backend.into(),
            algorithm: None,
            bootstrap: "threads".into(),
            ranks: 2,
            dtype: "bf16".into(),
            op: "sum".into(),
            bytes: 1024,
            count: 512,
            iters: 5,
            launch,
            out_of_place: None,
            in_place: None,
            choice: None,
        }
    }

    #[test]
    fn lines_name_the_launch_mode_only_when_modes_are_mixed() {
        let names = |rows: &[Row]| -> Vec<String> {
            lines(rows, common_launch(rows).is_none())
                .into_iter()
                .map(|(name, _)| name)
                .collect()
        };
        let graph = [row("nccl", Launch::Graph), row("ipc", Launch::Graph)];
        assert_eq!(common_launch(&graph), Some(Launch::Graph));
        assert_eq!(names(&graph), ["nccl", "ipc"]);
        let mixed = [
            row("nccl", Launch::Eager),
            row("nccl", Launch::Graph),
            row("nccl", Launch::Eager),
        ];
        assert_eq!(common_launch(&mixed), None);
        assert_eq!(names(&mixed), ["nccl (eager)", "nccl (graph)"]);
    }

    #[test]
    fn byte_labels() {
        assert_eq!(bytes_label(8.0), "8");
        assert_eq!(bytes_label(1024.0), "1K");
        assert_eq!(bytes_label(1536.0), "1.5K");
        assert_eq!(bytes_label((64u64 << 20) as f64), "64M");
        assert_eq!(number_label(0.01), "0.01");
        assert_eq!(number_label(0.1), "0.1");
        assert_eq!(number_label(2.5), "2.5");
    }
}
