//! A PNG of the bytes a trace had live against the bytes each stack held,
//! over the trace, drawn in Rust (plotters' bitmap backend: no Python, no
//! system library).
//!
//! Text needs a TrueType font, which plotters reads through `ab_glyph` from
//! bytes we hand it (not through fontconfig): the first of
//! `$TRACE_PLOT_FONT` and a few usual DejaVu/Liberation paths that exists.
//! Without one the plot is drawn without text (lines and grid only), and
//! [`write_png`] says so in its return value.

use std::path::Path;

use plotters::prelude::*;
use plotters::style::FontStyle;

use super::requested::Requested;

/// Where a sans-serif TrueType font usually is.
const FONT_PATHS: [&str; 5] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/liberation-sans/LiberationSans-Regular.ttf",
];

/// Registers a font with plotters once per process; whether one is there.
pub(crate) fn font_ready() -> bool {
    static READY: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *READY.get_or_init(|| {
        let candidates = std::env::var("TRACE_PLOT_FONT")
            .ok()
            .into_iter()
            .chain(FONT_PATHS.iter().map(|p| p.to_string()));
        for path in candidates {
            if let Ok(bytes) = std::fs::read(&path) {
                // Plotters keeps the font for the whole process.
                let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                if plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok() {
                    return true;
                }
            }
        }
        false
    })
}

/// One held-bytes line: a label and `(operations done, bytes held)` samples.
pub struct HeldSeries<'a> {
    /// Legend text (the stack's name and figures).
    pub label: String,
    /// Samples, in operation order.
    pub samples: &'a [(usize, usize)],
}

const MIB: f64 = (1u64 << 20) as f64;
const COLORS: [RGBColor; 4] = [
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0x94, 0x67, 0xbd),
];

// Lines are one pixel wide: plotters joins wider polylines with mitres,
// which draw spikes past the data where the line turns back sharply (a
// trace's live bytes do, all the time).

/// Draws the live requested bytes of the trace (black) and each series of
/// held bytes (in colour) into a 1200×700 PNG at `path`. Returns whether
/// text (title, axes, legend) could be drawn.
///
/// # Errors
/// What plotters reports (a file that cannot be written, mostly).
pub fn write_png(
    path: &Path,
    title: &str,
    requested: &Requested,
    held: &[HeldSeries<'_>],
) -> Result<bool, String> {
    let text = font_ready();
    let err = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    let ops = requested.after.len().max(1);
    let top = held
        .iter()
        .flat_map(|s| s.samples.iter().map(|&(_, b)| b))
        .chain([requested.peak])
        .max()
        .unwrap_or(0) as f64
        / MIB
        * 1.05;
    let root = BitMapBackend::new(path, (1200, 700)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let mut builder = ChartBuilder::on(&root);
    builder.margin(20);
    if text {
        builder
            .caption(title, ("sans-serif", 24))
            .x_label_area_size(40)
            .y_label_area_size(70);
    }
    let mut chart = builder
        .build_cartesian_2d(0f64..ops as f64, 0f64..top.max(1.0))
        .map_err(|e| err(&e))?;
    let mut mesh = chart.configure_mesh();
    if text {
        mesh.x_desc("operations")
            .y_desc("MiB")
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_label_formatter(&|y| format!("{y:.0}"));
    } else {
        mesh.disable_x_axis().disable_y_axis();
    }
    mesh.draw().map_err(|e| err(&e))?;

    for (series, color) in held.iter().zip(COLORS.iter().cycle()) {
        let points = series
            .samples
            .iter()
            .map(|&(op, bytes)| (op as f64, bytes as f64 / MIB));
        let color = *color;
        let line = chart
            .draw_series(LineSeries::new(points, color.stroke_width(1)))
            .map_err(|e| err(&e))?;
        if text {
            line.label(series.label.clone()).legend(move |(x, y)| {
                PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2))
            });
        }
    }
    // The requested line, drawn over the held ones, at most ~4000 points (the most bytes in each
    // stretch, so that no peak is lost).
    let stride = ops.div_ceil(4000).max(1);
    let points = requested
        .after
        .chunks(stride)
        .enumerate()
        .map(|(i, chunk)| {
            let most = chunk.iter().copied().max().unwrap_or(0);
            ((i * stride + chunk.len()) as f64, most as f64 / MIB)
        });
    let line = chart
        .draw_series(LineSeries::new(points, BLACK.stroke_width(1)))
        .map_err(|e| err(&e))?;
    if text {
        line.label(format!(
            "live requested (peak {:.0} MiB)",
            requested.peak as f64 / MIB
        ))
        .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], BLACK.stroke_width(2)));
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
    root.present().map_err(|e| err(&e))?;
    Ok(text)
}
