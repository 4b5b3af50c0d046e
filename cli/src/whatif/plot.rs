//! `--plot FILE.svg`: makespan and utilization against nodes, and which node was busy when in one run, drawn with plotters' SVG backend.

use anyhow::{anyhow, Result};
use mesh_sim::SimReport;
use plotters::coord::Shift;
use plotters::prelude::*;

use super::{span, View};

const WIDTH: u32 = 1100;
const HEIGHT: u32 = 900;
/// Most rows of the node chart: more nodes are drawn in bands, each the mean of its nodes.
const ROWS_MAX: usize = 128;

/// The picture, as SVG text.
pub(super) fn svg(view: &View<'_>, drawn: Option<(usize, &SimReport)>) -> Result<String> {
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (WIDTH, HEIGHT)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| anyhow!("{e}"))?;
        let (top, bottom) = root.split_vertically(HEIGHT / 2 - 40);
        let (left, right) = top.split_horizontally(WIDTH / 2);
        counts(view, &left, &right).map_err(|e| anyhow!("{e}"))?;
        if let Some((n, r)) = drawn {
            busy(view, n, r, &bottom).map_err(|e| anyhow!("{e}"))?;
        }
        root.present().map_err(|e| anyhow!("{e}"))?;
    }
    Ok(out)
}

type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;
type Drawn = std::result::Result<(), Box<dyn std::error::Error>>;

/// Makespan (p50, p90 with repeats, and the critical path under it) and
/// utilization, against the node counts, on a log scale of nodes.
fn counts(view: &View<'_>, left: &Area<'_>, right: &Area<'_>) -> Drawn {
    let rows = view.all_rows();
    if rows.is_empty() {
        return Ok(());
    }
    let hours = |ms: u64| ms as f64 / 3_600_000.0;
    let lo = rows.first().map_or(1, |r| r.nodes) as f64;
    let hi = rows.last().map_or(1, |r| r.nodes) as f64;
    let (lo, hi) = if hi > lo {
        (lo / 1.2, hi * 1.2)
    } else {
        (lo / 2.0, hi * 2.0)
    };
    // Ticks at the counts simulated, not at a log scale's round numbers.
    let ticks: Vec<f64> = rows.iter().map(|r| r.nodes as f64).collect();
    let cp = hours(view.loaded.workload.critical_path_ms());
    let top = rows
        .iter()
        .map(|r| hours(r.makespan_p90_ms))
        .fold(cp, f64::max)
        * 1.1;
    let unit = if top < 1.0 { "minutes" } else { "hours" };
    let scale = if top < 1.0 { 60.0 } else { 1.0 };
    let mut chart = ChartBuilder::on(left)
        .caption("makespan against nodes", ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(55)
        .build_cartesian_2d(
            (lo..hi).log_scale().with_key_points(ticks.clone()),
            0.0..top * scale,
        )?;
    chart
        .configure_mesh()
        .x_desc("nodes")
        .y_desc(format!("makespan ({unit})"))
        .x_label_formatter(&|x| format!("{x:.0}"))
        .draw()?;
    let p50: Vec<(f64, f64)> = rows
        .iter()
        .map(|r| (r.nodes as f64, hours(r.makespan_p50_ms) * scale))
        .collect();
    chart
        .draw_series(LineSeries::new(p50.clone(), BLUE.stroke_width(2)))?
        .label(if view.repeat > 1 { "p50" } else { "makespan" })
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLUE.stroke_width(2)));
    chart.draw_series(p50.iter().map(|&p| Circle::new(p, 3, BLUE.filled())))?;
    if view.repeat > 1 {
        let p90: Vec<(f64, f64)> = rows
            .iter()
            .map(|r| (r.nodes as f64, hours(r.makespan_p90_ms) * scale))
            .collect();
        chart
            .draw_series(LineSeries::new(p90, BLUE.mix(0.5)))?
            .label("p90")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLUE.mix(0.5)));
    }
    chart
        .draw_series(LineSeries::new(
            vec![(lo, cp * scale), (hi, cp * scale)],
            RED.stroke_width(1),
        ))?
        .label("critical path")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RED));
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;

    let mut chart = ChartBuilder::on(right)
        .caption("utilization against nodes", ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(55)
        .build_cartesian_2d((lo..hi).log_scale().with_key_points(ticks), 0.0..100.0)?;
    chart
        .configure_mesh()
        .x_desc("nodes")
        .y_desc("cores busy (%)")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .draw()?;
    let util: Vec<(f64, f64)> = rows
        .iter()
        .map(|r| (r.nodes as f64, r.utilization * 100.0))
        .collect();
    chart.draw_series(LineSeries::new(util.clone(), GREEN.stroke_width(2)))?;
    chart.draw_series(util.iter().map(|&p| Circle::new(p, 3, GREEN.filled())))?;
    Ok(())
}

/// One run: a row per node (or band of nodes), its share of cores busy
/// in each slice of time, from white (idle) to dark blue (every core).
fn busy(view: &View<'_>, nodes: usize, r: &SimReport, area: &Area<'_>) -> Drawn {
    let t = &r.timeline;
    let buckets = t.busy.iter().map(Vec::len).max().unwrap_or(0);
    if buckets == 0 || t.cpus.is_empty() {
        return Ok(());
    }
    let n = t.cpus.len();
    let band = n.div_ceil(ROWS_MAX);
    let rows = n.div_ceil(band);
    let end_h = (buckets as u64 * t.bucket_ms) as f64 / 3_600_000.0;
    let (unit, scale) = if end_h < 1.0 {
        ("minutes", 60.0)
    } else {
        ("hours", 1.0)
    };
    let caption = format!(
        "cores busy on each node, {nodes} nodes, seed {} (makespan {})",
        view.base.seed,
        span(r.makespan)
    );
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(55)
        .build_cartesian_2d(0.0..end_h * scale, 0.0..rows as f64)?;
    chart
        .configure_mesh()
        .disable_mesh()
        .x_desc(format!("time ({unit})"))
        .y_desc(if band > 1 {
            format!("node ({band} a row)")
        } else {
            "node".into()
        })
        // Ticks where rows start, each naming the row above it; none between.
        .y_labels((rows + 1).min(17))
        .y_label_formatter(&|y| {
            if y.fract() == 0.0 && (*y as usize) < rows {
                format!("{}", *y as usize * band)
            } else {
                String::new()
            }
        })
        .draw()?;
    let w = t.bucket_ms as f64 / 3_600_000.0 * scale;
    let mut cells = Vec::new();
    for row in 0..rows {
        let members: Vec<usize> = (row * band..((row + 1) * band).min(n)).collect();
        for b in 0..buckets {
            let full: f64 = members.iter().map(|&i| t.cpus[i]).sum::<f64>() * t.bucket_ms as f64;
            let used: f64 = members
                .iter()
                .map(|&i| t.busy[i].get(b).copied().unwrap_or(0.0))
                .sum();
            let share = if full > 0.0 {
                (used / full).clamp(0.0, 1.0)
            } else {
                0.0
            };
            if share <= 0.0 {
                continue;
            }
            let shade = |c: u8| (255.0 - share * (255.0 - f64::from(c))) as u8;
            let colour = RGBColor(shade(20), shade(60), shade(160));
            let x = b as f64 * w;
            cells.push(Rectangle::new(
                [(x, row as f64), (x + w, row as f64 + 1.0)],
                colour.filled(),
            ));
        }
    }
    chart.draw_series(cells)?;
    Ok(())
}
