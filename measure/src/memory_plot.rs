//! A PNG of the memory each tag held over time, from the memory history
//! (`streamalloc::record_memory_history`): one line per tag, the bytes its callers held
//! (allocated and not yet handed back) after each event, drawn with
//! plotters beside the trace plots (`trace::plot`, same font handling).

use std::path::Path;

use plotters::prelude::*;
use streamalloc::{MemoryAction, MemoryEvent};

const MIB: f64 = (1u64 << 20) as f64;
const COLORS: [RGBColor; 6] = [
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x8c, 0x56, 0x4b),
];

/// A tag's line: `(milliseconds since the first event, bytes held)`.
pub type Samples = Vec<(f64, usize)>;

/// Bytes held per tag after each allocation and free of `events`:
/// `(tag, [(milliseconds since the first event, bytes)])`, tags in the
/// order they first appear.
pub fn bytes_by_tag(events: &[MemoryEvent]) -> Vec<(&'static str, Samples)> {
    let start = events.first().map_or(0, |e| e.time_us);
    // (tag, bytes held now, its samples)
    let mut tags: Vec<(&'static str, usize, Samples)> = Vec::new();
    for e in events {
        let grow = match e.action {
            MemoryAction::Alloc => true,
            MemoryAction::FreeRequested => false,
            _ => continue,
        };
        let ms = (e.time_us - start) as f64 / 1e3;
        let i = match tags.iter().position(|t| t.0 == e.tag) {
            Some(i) => i,
            None => {
                tags.push((e.tag, 0, vec![(ms, 0)]));
                tags.len() - 1
            }
        };
        let held = &mut tags[i].1;
        *held = if grow {
            *held + e.size
        } else {
            held.saturating_sub(e.size)
        };
        let now = *held;
        tags[i].2.push((ms, now));
    }
    tags.into_iter().map(|(t, _, s)| (t, s)).collect()
}

/// Draws [`bytes_by_tag`] of `events` into a 1200×600 PNG at `path`, one
/// step line per tag. Returns whether text could be drawn (see
/// `trace::plot`).
///
/// # Errors
/// What plotters reports (a file that cannot be written, mostly).
pub fn write_png(path: &Path, title: &str, events: &[MemoryEvent]) -> Result<bool, String> {
    let text = crate::trace::plot::font_ready();
    let err = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    let series = bytes_by_tag(events);
    let end = series
        .iter()
        .flat_map(|(_, s)| s.last().map(|p| p.0))
        .fold(0f64, f64::max)
        .max(1e-3);
    let top = series
        .iter()
        .flat_map(|(_, s)| s.iter().map(|p| p.1))
        .max()
        .unwrap_or(0) as f64
        / MIB
        * 1.1;
    let root = BitMapBackend::new(path, (1200, 600)).into_drawing_area();
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
        .build_cartesian_2d(0f64..end, 0f64..top.max(1.0))
        .map_err(|e| err(&e))?;
    let mut mesh = chart.configure_mesh();
    if text {
        mesh.x_desc("ms").y_desc("MiB held");
    } else {
        mesh.disable_x_axis().disable_y_axis();
    }
    mesh.draw().map_err(|e| err(&e))?;
    for ((tag, samples), color) in series.iter().zip(COLORS.iter().cycle()) {
        // A step line: the level holds until the next event.
        let mut points = Vec::with_capacity(samples.len() * 2);
        for w in samples.windows(2) {
            points.push((w[0].0, w[0].1 as f64 / MIB));
            points.push((w[1].0, w[0].1 as f64 / MIB));
        }
        if let Some(&(t, b)) = samples.last() {
            points.push((t, b as f64 / MIB));
            points.push((end, b as f64 / MIB));
        }
        let color = *color;
        let line = chart
            .draw_series(LineSeries::new(points, color.stroke_width(1)))
            .map_err(|e| err(&e))?;
        if text {
            line.label(tag.to_string()).legend(move |(x, y)| {
                PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2))
            });
        }
    }
    if text {
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(|e| err(&e))?;
    }
    root.present().map_err(|e| err(&e))?;
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(action: MemoryAction, tag: &'static str, size: usize, time_us: u64) -> MemoryEvent {
        MemoryEvent {
            seq: 0,
            time_us,
            action,
            device: 0,
            stream: Some(0),
            addr: 0,
            size,
            tag,
            free: 0,
            backtrace: None,
        }
    }

    #[test]
    fn each_tag_holds_what_it_allocated_until_handed_back() {
        let events = [
            event(MemoryAction::Alloc, "w", 100, 1_000),
            event(MemoryAction::Alloc, "a", 10, 2_000),
            event(MemoryAction::FreeCompleted, "a", 10, 2_500),
            event(MemoryAction::Alloc, "a", 20, 3_000),
            event(MemoryAction::FreeRequested, "a", 10, 4_000),
        ];
        let series = bytes_by_tag(&events);
        assert_eq!(series.len(), 2);
        assert_eq!(series[0], ("w", vec![(0.0, 0), (0.0, 100)]));
        assert_eq!(
            series[1],
            ("a", vec![(1.0, 0), (1.0, 10), (2.0, 30), (3.0, 20)])
        );
    }
}
