//! The report's pictures, drawn with plotters' SVG backend: the timeline per node and slot, per-stage distributions against the asks, and the history of the end's estimates.

use std::collections::BTreeMap;

use anyhow::{anyhow, Result};
use mesh_node::eta::Estimated;
use mesh_node::used::StageUse;
use plotters::prelude::*;

use super::model::{Model, Run};

const WIDTH: u32 = 1100;
/// Most slot rows the timeline draws; more are said, not drawn.
pub const ROWS_MAX: usize = 400;
const ROW_PX: u32 = 7;

type Drawn = std::result::Result<(), Box<dyn std::error::Error>>;

/// A picture drawn into SVG text by `draw`.
fn svg(
    height: u32,
    draw: impl FnOnce(&DrawingArea<SVGBackend<'_>, plotters::coord::Shift>) -> Drawn,
) -> Result<String> {
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (WIDTH, height)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| anyhow!("{e}"))?;
        draw(&root).map_err(|e| anyhow!("{e}"))?;
        root.present().map_err(|e| anyhow!("{e}"))?;
    }
    Ok(out)
}

/// The dashboard's stage colours (Tableau 10 without its red, which
/// marks failures), so a stage looks the same in both.
const PALETTE: [RGBColor; 9] = [
    RGBColor(0x4e, 0x79, 0xa7),
    RGBColor(0xf2, 0x8e, 0x2b),
    RGBColor(0x76, 0xb7, 0xb2),
    RGBColor(0x59, 0xa1, 0x4f),
    RGBColor(0xed, 0xc9, 0x48),
    RGBColor(0xb0, 0x7a, 0xa1),
    RGBColor(0xff, 0x9d, 0xa7),
    RGBColor(0x9c, 0x75, 0x5f),
    RGBColor(0x17, 0xbe, 0xcf),
];

/// A stage's colour, the same in every picture.
fn color(stage: usize) -> RGBColor {
    PALETTE[stage % PALETTE.len()]
}

/// A stage's colour as CSS, for the page's legend.
pub fn css_color(stage: usize) -> String {
    let c = color(stage);
    format!("#{:02x}{:02x}{:02x}", c.0, c.1, c.2)
}

const LABELS: (&str, u32) = ("sans-serif", 13);

/// A bar of the timeline: one run, or runs of one stage back to back on
/// one slot closer than a pixel apart (a 100,000-task farm's timeline is
/// then as big as what can be seen of it).
struct Bar {
    row: usize,
    stage: usize,
    from: u64,
    to: u64,
    failed: bool,
}

/// Each timed run's slot on its node: the first slot free when it
/// started. Rows are `node #slot`, nodes by name.
pub fn slots(model: &Model) -> (Vec<String>, Vec<(usize, &Run)>) {
    let mut by_node: BTreeMap<&str, Vec<&Run>> = BTreeMap::new();
    for r in &model.runs {
        if r.start_ms.is_some() {
            by_node
                .entry(r.machine.as_deref().unwrap_or("?"))
                .or_default()
                .push(r);
        }
    }
    let mut rows = Vec::new();
    let mut placed = Vec::new();
    for (node, mut runs) in by_node {
        runs.sort_by_key(|r| (r.start_ms, r.runtime_ms));
        let mut ends: Vec<u64> = Vec::new();
        let first = rows.len();
        for r in runs {
            let start = r.start_ms.unwrap_or(0);
            let slot = match ends.iter().position(|&e| e <= start) {
                Some(i) => i,
                None => {
                    ends.push(0);
                    rows.push(format!("{} #{}", short(node), ends.len()));
                    ends.len() - 1
                }
            };
            ends[slot] = start + r.runtime_ms;
            placed.push((first + slot, r));
        }
    }
    (rows, placed)
}

/// A peer id is long; its tail tells nodes apart, as `mesh status` does.
fn short(node: &str) -> &str {
    let n = node.len();
    if n > 12 && node.is_ascii() {
        &node[n - 8..]
    } else {
        node
    }
}

fn bars(placed: &[(usize, &Run)], start: u64, px_ms: u64) -> Vec<Bar> {
    let mut sorted: Vec<&(usize, &Run)> = placed.iter().collect();
    sorted.sort_by_key(|(row, r)| (*row, r.start_ms));
    let mut out: Vec<Bar> = Vec::new();
    for &&(row, r) in &sorted {
        let from = r.start_ms.unwrap_or(start) - start;
        let to = from + r.runtime_ms.max(1);
        let failed = r.failed.is_some();
        match out.last_mut() {
            Some(b)
                if b.row == row
                    && b.stage == r.stage
                    && !failed
                    && !b.failed
                    && from <= b.to + px_ms =>
            {
                b.to = b.to.max(to);
            }
            _ => out.push(Bar {
                row,
                stage: r.stage,
                from,
                to,
                failed,
            }),
        }
    }
    out
}

/// Seconds, minutes or hours, whichever reads best for a span.
fn unit(span_ms: u64) -> (&'static str, f64) {
    if span_ms < 180_000 {
        ("s", 1000.0)
    } else if span_ms < 3 * 3_600_000 {
        ("min", 60_000.0)
    } else {
        ("h", 3_600_000.0)
    }
}

/// Which run held which slot of which node when, coloured by stage
/// (failed runs in red); `None` where no run kept its start.
pub fn timeline(model: &Model) -> Result<Option<String>> {
    let Some((start, end)) = model.span else {
        return Ok(None);
    };
    let (rows, placed) = slots(model);
    let drawn_rows = rows.len().min(ROWS_MAX);
    let span = (end - start).max(1);
    let plot_px = u64::from(WIDTH - 200);
    let bars = bars(&placed, start, span / plot_px);
    let (unit, per) = unit(span);
    let height = 120 + ROW_PX * drawn_rows as u32;
    svg(height, |root| {
        // Few rows: a label at the middle of each (plotters puts labels at
        // round numbers: halves, asked for twice as many as rows). Many: at
        // about 40 of them, a row each.
        let labels = if drawn_rows <= 40 {
            2 * drawn_rows + 1
        } else {
            40
        };
        let mut chart = ChartBuilder::on(root)
            .margin(10)
            .x_label_area_size(35)
            .y_label_area_size(150)
            .build_cartesian_2d(0f64..span as f64 / per, 0f64..drawn_rows as f64)?;
        chart
            .configure_mesh()
            .label_style(LABELS)
            .disable_y_mesh()
            .x_desc(format!("time since the first start ({unit})"))
            .y_labels(labels)
            .y_label_formatter(&|y| {
                let mid = (y.fract() - 0.5).abs() < 1e-6;
                if drawn_rows <= 40 && !mid {
                    return String::new();
                }
                let row = (drawn_rows as f64 - y).floor().max(0.0) as usize;
                rows.get(row).cloned().unwrap_or_default()
            })
            .draw()?;
        chart.draw_series(bars.iter().filter(|b| b.row < drawn_rows).map(|b| {
            let top = (drawn_rows - b.row) as f64;
            let style = if b.failed {
                RED.filled()
            } else {
                color(b.stage).filled()
            };
            Rectangle::new(
                [
                    (b.from as f64 / per, top - 0.1),
                    (b.to as f64 / per, top - 0.9),
                ],
                style,
            )
        }))?;
        Ok(())
    })
    .map(Some)
}

/// One distribution chart: a horizontal box per stage of `values`, the
/// largest value a dot, the ask (where there is one) a red bar.
struct Spread<'a> {
    title: &'a str,
    unit: &'a str,
    values: Vec<Vec<f64>>,
    asks: Vec<Option<f64>>,
}

fn spread(stages: &[String], s: &Spread<'_>) -> Result<String> {
    let n = stages.len().max(1);
    let top = s
        .values
        .iter()
        .flatten()
        .copied()
        .chain(s.asks.iter().flatten().copied())
        .fold(0.0f64, f64::max)
        .max(1e-9)
        * 1.08;
    let height = 90 + 34 * n as u32;
    svg(height, |root| {
        let mut chart = ChartBuilder::on(root)
            .caption(s.title, ("sans-serif", 18))
            .margin(10)
            .x_label_area_size(35)
            .y_label_area_size(150)
            .build_cartesian_2d(0f32..top as f32, (0..n as i32).into_segmented())?;
        chart
            .configure_mesh()
            .label_style(LABELS)
            .x_desc(s.unit)
            .y_labels(n)
            .y_label_formatter(&|v| match v {
                SegmentValue::CenterOf(i) => stages.get(*i as usize).cloned().unwrap_or_default(),
                _ => String::new(),
            })
            .light_line_style(WHITE)
            .draw()?;
        for (i, v) in s.values.iter().enumerate().filter(|(_, v)| !v.is_empty()) {
            let q = Quartiles::new(v);
            let key = SegmentValue::CenterOf(i as i32);
            chart.draw_series(std::iter::once(
                Boxplot::new_horizontal(key, &q)
                    .width(16)
                    .whisker_width(0.6)
                    .style(color(i)),
            ))?;
            let max = v.iter().copied().fold(f64::MIN, f64::max);
            chart.draw_series(std::iter::once(Circle::new(
                (max as f32, SegmentValue::CenterOf(i as i32)),
                3,
                color(i).filled(),
            )))?;
        }
        // The ask: a red bar across the stage's row, as tall as its box.
        chart.draw_series(s.asks.iter().enumerate().filter_map(|(i, ask)| {
            let at = (
                ask.as_ref().copied()? as f32,
                SegmentValue::CenterOf(i as i32),
            );
            Some(
                EmptyElement::at(at)
                    + PathElement::new(vec![(0, -12), (0, 12)], RED.stroke_width(2)),
            )
        }))?;
        Ok(())
    })
}

/// Runtime, CPU and peak memory per stage, against the asks.
pub fn distributions(model: &Model, used: &[StageUse]) -> Result<Vec<String>> {
    let n = model.stages.len();
    let per_stage = |f: &dyn Fn(&Run) -> Option<f64>| {
        let mut v = vec![Vec::new(); n];
        for r in &model.runs {
            if let Some(x) = f(r) {
                v[r.stage].push(x);
            }
        }
        v
    };
    let ask = |f: &dyn Fn(&StageUse) -> f64| -> Vec<Option<f64>> {
        model
            .stages
            .iter()
            .map(|s| {
                used.iter()
                    .find(|u| &u.stage == s)
                    .map(f)
                    .filter(|&a| a > 0.0)
            })
            .collect()
    };
    let mib = (1u64 << 20) as f64;
    let runtime = per_stage(&|r| Some(r.runtime_ms as f64 / 1000.0));
    let longest = runtime.iter().flatten().copied().fold(0.0, f64::max) * 1000.0;
    let (unit, per) = unit(longest as u64);
    let charts = [
        Spread {
            title: "runtime per task",
            unit: &format!("runtime ({unit})"),
            values: runtime
                .iter()
                .map(|v| v.iter().map(|s| s * 1000.0 / per).collect())
                .collect(),
            asks: vec![None; n],
        },
        Spread {
            title: "CPU per task (red: cores asked)",
            unit: "CPU (% of one core)",
            values: per_stage(&|r| r.cpu_pct),
            asks: ask(&|u| u.cpu_asked * 100.0),
        },
        Spread {
            title: "peak memory per task (red: memory asked)",
            unit: "peak resident memory (MiB)",
            values: per_stage(&|r| r.peak.map(|b| b as f64 / mib)),
            asks: ask(&|u| u.mem_asked as f64 / mib),
        },
    ];
    charts
        .iter()
        .filter(|c| c.values.iter().any(|v| !v.is_empty()))
        .map(|c| spread(&model.stages, c))
        .collect()
}

/// When the farm's home thought it would end, against when it did.
pub fn estimates(
    history: &[Estimated],
    span: Option<(u64, u64)>,
    ended: bool,
) -> Result<Option<String>> {
    let (Some(first), Some(start)) = (history.first(), span.map(|s| s.0)) else {
        return Ok(None);
    };
    let start = start.min(first.at_ms);
    let end = span.map(|s| s.1).filter(|_| ended);
    let last = history
        .iter()
        .map(|e| e.p90_end_ms.max(e.at_ms))
        .chain(end)
        .max()
        .unwrap_or(start);
    let (unit, per) = unit(last - start);
    let x = |ms: u64| (ms.saturating_sub(start)) as f64 / per;
    let top = x(last).max(1e-9) * 1.08;
    let right = history
        .last()
        .map_or(0.0, |e| x(e.at_ms))
        .max(end.map_or(0.0, x))
        .max(1e-9)
        * 1.02;
    svg(380, |root| {
        let mut chart = ChartBuilder::on(root)
            .caption(
                "the end as estimated, when it was estimated",
                ("sans-serif", 18),
            )
            .margin(10)
            .x_label_area_size(35)
            .y_label_area_size(60)
            .build_cartesian_2d(0f64..right, 0f64..top)?;
        chart
            .configure_mesh()
            .label_style(LABELS)
            .light_line_style(WHITE)
            .x_desc(format!("estimated at ({unit} since the start)"))
            .y_desc(format!("estimated end ({unit} since the start)"))
            .draw()?;
        let line = |f: fn(&Estimated) -> u64| -> Vec<(f64, f64)> {
            history.iter().map(|e| (x(e.at_ms), x(f(e)))).collect()
        };
        chart
            .draw_series(LineSeries::new(
                line(|e| e.p50_end_ms),
                BLUE.stroke_width(2),
            ))?
            .label("p50")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLUE.stroke_width(2)));
        chart
            .draw_series(LineSeries::new(line(|e| e.p90_end_ms), BLUE.mix(0.4)))?
            .label("p90")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLUE.mix(0.4)));
        // A dot per estimate: a farm estimated once has no line to draw.
        chart.draw_series(
            line(|e| e.p50_end_ms)
                .into_iter()
                .map(|p| Circle::new(p, 2, BLUE.filled())),
        )?;
        if let Some(e) = end {
            chart
                .draw_series(LineSeries::new(
                    vec![(0.0, x(e)), (right, x(e))],
                    RED.stroke_width(1),
                ))?
                .label("the real end")
                .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RED));
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()?;
        Ok(())
    })
    .map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stage: usize, machine: &str, start: u64, ms: u64) -> Run {
        Run {
            stage,
            task: format!("s{stage}.{start}"),
            machine: Some(machine.into()),
            start_ms: Some(start),
            runtime_ms: ms,
            cpu_pct: None,
            peak: None,
            failed: None,
        }
    }

    #[test]
    fn runs_at_once_on_a_node_take_slots_of_their_own() {
        let m = Model {
            stages: vec!["a".into()],
            runs: vec![
                run(0, "n1", 0, 10),
                run(0, "n1", 5, 10),
                run(0, "n1", 10, 10),
                run(0, "n2", 0, 10),
            ],
            ..Model::default()
        };
        let (rows, placed) = slots(&m);
        assert_eq!(rows, ["n1 #1", "n1 #2", "n2 #1"]);
        let rows_of: Vec<usize> = placed.iter().map(|p| p.0).collect();
        // The third run starts when the first ends: its slot again.
        assert_eq!(rows_of, [0, 1, 0, 2]);
    }

    #[test]
    fn back_to_back_runs_closer_than_a_pixel_are_one_bar() {
        let m = Model {
            stages: vec!["a".into(), "b".into()],
            runs: vec![
                run(0, "n1", 0, 10),
                run(0, "n1", 11, 10),
                run(1, "n1", 21, 10),
                run(1, "n1", 100, 10),
            ],
            ..Model::default()
        };
        let (_, placed) = slots(&m);
        let b = bars(&placed, 0, 2);
        let spans: Vec<(usize, u64, u64)> = b.iter().map(|b| (b.stage, b.from, b.to)).collect();
        assert_eq!(spans, [(0, 0, 21), (1, 21, 31), (1, 100, 110)]);
    }
}
