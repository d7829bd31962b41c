//! The service's PNG: requests/s (left) and p99 latency (right) against the
//! number of clients, one line per way, drawn with plotters as the trace
//! replay's plot is (same font search: `$TRACE_PLOT_FONT`, then DejaVu or
//! Liberation; without a font, lines and grid only).

use std::path::Path;

use plotters::prelude::*;

use super::LevelResult;
use crate::trace::plot::font_ready;

const COLORS: [RGBColor; 3] = [
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0x2c, 0xa0, 0x2c),
];

/// Draws `rows` (any ways, any client counts) into a 1400×600 PNG at
/// `path`. Returns whether text could be drawn.
///
/// # Errors
/// What plotters reports (a file that cannot be written, mostly), or no row.
pub fn write_png(path: &Path, title: &str, rows: &[LevelResult]) -> Result<bool, String> {
    if rows.is_empty() {
        return Err(format!("{}: no row to plot", path.display()));
    }
    let text = font_ready();
    let err = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    let mut ways: Vec<&str> = Vec::new();
    for r in rows {
        if !ways.contains(&r.way.as_str()) {
            ways.push(&r.way);
        }
    }
    let max_clients = rows.iter().map(|r| r.clients).max().unwrap_or(1).max(2) as f64;
    let root = BitMapBackend::new(path, (1400, 600)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let root = if text {
        root.titled(title, ("sans-serif", 24))
            .map_err(|e| err(&e))?
    } else {
        root
    };
    let panels = root.split_evenly((1, 2));
    type Metric = fn(&LevelResult) -> f64;
    let metrics: [(&str, Metric); 2] = [
        ("requests/s", |r| r.requests_per_s()),
        ("p99 latency (ms)", |r| r.p99.as_secs_f64() * 1e3),
    ];
    for (panel, (label, metric)) in panels.iter().zip(metrics) {
        let top = rows.iter().map(metric).fold(0.0f64, f64::max).max(1e-9) * 1.1;
        let mut builder = ChartBuilder::on(panel);
        builder.margin(20);
        if text {
            builder.x_label_area_size(40).y_label_area_size(80);
        }
        let mut chart = builder
            .build_cartesian_2d((1f64..max_clients * 1.2).log_scale(), 0f64..top)
            .map_err(|e| err(&e))?;
        let mut mesh = chart.configure_mesh();
        if text {
            mesh.x_desc("concurrent clients")
                .y_desc(label)
                .x_label_formatter(&|x| format!("{x:.0}"));
        } else {
            mesh.disable_x_axis().disable_y_axis();
        }
        mesh.draw().map_err(|e| err(&e))?;
        for (way, color) in ways.iter().zip(COLORS.iter().cycle()) {
            let mut points: Vec<(f64, f64)> = rows
                .iter()
                .filter(|r| r.way == *way)
                .map(|r| (r.clients as f64, metric(r)))
                .collect();
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            let color = *color;
            let line = chart
                .draw_series(LineSeries::new(points.clone(), color.stroke_width(3)))
                .map_err(|e| err(&e))?;
            if text {
                line.label(way.to_string()).legend(move |(x, y)| {
                    PathElement::new([(x, y), (x + 20, y)], color.stroke_width(3))
                });
            }
            chart
                .draw_series(points.iter().map(|&p| Circle::new(p, 4, color.filled())))
                .map_err(|e| err(&e))?;
        }
        if text {
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperLeft)
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .draw()
                .map_err(|e| err(&e))?;
        }
    }
    root.present().map_err(|e| err(&e))?;
    Ok(text)
}
