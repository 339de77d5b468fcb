//! The chart of the run: durable steps/s against concurrency for procflow's executor on
//! the WAL (workload 2), the raw write+fdatasync loop (workload 1's baseline) and the
//! same machine hand-rolled on redb (workload 3), as an SVG.

use plotters::prelude::*;
use std::path::{Path, PathBuf};

/// The figures the chart draws, all in steps/s.
pub struct Throughput {
    /// (concurrent clients, steps/s) of the executor on the durable WAL.
    pub procflow: Vec<(u64, f64)>,
    /// (concurrent clients, steps/s) of the hand-rolled loop on redb.
    pub redb: Vec<(u64, f64)>,
    /// The raw single-writer loop's writes/s (one step per write), whatever the clients.
    pub raw: f64,
}

/// Where the chart goes: next to docs/BENCHMARKS.md for a full run; for a quick run, the
/// target dir's bench scratch directory (it outlives the run's own temporary directory).
pub fn path(quick: bool) -> PathBuf {
    if quick {
        Path::new(env!("CARGO_TARGET_TMPDIR")).join("benchmarks-throughput.svg")
    } else {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/benchmarks-throughput.svg")
    }
}

/// Writes the chart to [`path`] and prints where.
pub fn write(quick: bool, figures: &Throughput) {
    let path = path(quick);
    let mode = if quick { "quick" } else { "full" };
    match draw(&path, mode, figures) {
        Ok(()) => println!("chart: {}", path.display()),
        Err(error) => println!("chart: cannot write {}: {error}", path.display()),
    }
}

/// Line colours: procflow stands out, the baselines are muted.
const PROCFLOW: RGBColor = RGBColor(0x1f, 0x6f, 0xb4);
const REDB: RGBColor = RGBColor(0xc0, 0x39, 0x2b);
const RAW: RGBColor = RGBColor(0x55, 0x55, 0x55);

/// Draws the three series on log-log axes, with a legend, into an SVG at `path`.
fn draw(path: &Path, mode: &str, figures: &Throughput) -> Result<(), Box<dyn std::error::Error>> {
    let root = SVGBackend::new(path, (880, 540)).into_drawing_area();
    root.fill(&WHITE)?;
    let clients = figures.procflow.iter().map(|&(c, _)| c as f64);
    let (x_min, x_max) = (0.8, clients.fold(1.0, f64::max) * 1.25);
    let values = figures
        .procflow
        .iter()
        .chain(&figures.redb)
        .map(|&(_, v)| v)
        .chain([figures.raw]);
    let (y_min, y_max) = values.fold((f64::MAX, 0.0_f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("Durable steps/s vs concurrency (cargo bench --bench compare, {mode} run)"),
            ("sans-serif", 20),
        )
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(76)
        .build_cartesian_2d(
            (x_min..x_max).log_scale(),
            (y_min / 2.0..y_max * 2.0).log_scale(),
        )?;
    chart
        .configure_mesh()
        .x_desc("concurrent procedures (closed-loop clients)")
        .y_desc("steps/s (log scale)")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|&y| thousands(y))
        .draw()?;

    let procflow: Vec<(f64, f64)> = figures
        .procflow
        .iter()
        .map(|&(c, v)| (c as f64, v))
        .collect();
    let redb: Vec<(f64, f64)> = figures.redb.iter().map(|&(c, v)| (c as f64, v)).collect();
    for (points, colour, label) in [
        (&procflow, PROCFLOW, "procflow executor, durable WalStore"),
        (&redb, REDB, "hand-rolled, a redb commit per step"),
    ] {
        chart
            .draw_series(LineSeries::new(
                points.iter().copied(),
                colour.stroke_width(2),
            ))?
            .label(label)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 24, y)], colour.stroke_width(2)));
        chart.draw_series(
            points
                .iter()
                .map(|&point| Circle::new(point, 4, colour.filled())),
        )?;
    }
    chart
        .draw_series(LineSeries::new(
            [(x_min, figures.raw), (x_max, figures.raw)],
            RAW.stroke_width(2),
        ))?
        .label("raw write+fdatasync loop, one writer (one step per write)")
        .legend(|(x, y)| PathElement::new([(x, y), (x + 24, y)], RAW.stroke_width(2)));
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .draw()?;
    root.present()?;
    Ok(())
}

/// 250000 as `250k`, 1500000 as `1.5M`: short tick labels.
fn thousands(value: f64) -> String {
    let (scaled, unit) = match value {
        v if v >= 1e6 => (v / 1e6, "M"),
        v if v >= 1e3 => (v / 1e3, "k"),
        v => (v, ""),
    };
    let text = format!("{scaled:.1}");
    format!("{}{unit}", text.trim_end_matches(".0"))
}
