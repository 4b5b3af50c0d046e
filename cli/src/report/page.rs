//! The report as one self-contained HTML page (inline SVG and CSS, no script, nothing fetched), written with maud's templates.

use anyhow::Result;
use maud::{html, Markup, PreEscaped, DOCTYPE};
use mesh_node::used::StageUse;

use super::draw;
use super::model::Model;
use super::About;

const STYLE: &str = "
body { font-family: sans-serif; margin: 2em; color: #222; max-width: 1150px; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; }
th, td { border-bottom: 1px solid #ddd; padding: 0.25em 0.7em; text-align: right; white-space: nowrap; }
.legend span { margin-right: 1.2em; white-space: nowrap; }
.legend i { display: inline-block; width: 0.9em; height: 0.9em; margin-right: 0.3em; vertical-align: middle; }
th:first-child, td:first-child { text-align: left; }
.note { color: #666; }
code { background: #f4f4f4; padding: 0 0.2em; }
svg { display: block; margin: 0.5em 0; max-width: 100%; height: auto; }
.wide { overflow-x: auto; }
";

fn bytes(n: u64) -> String {
    mesh_node::view::bytes(n)
}

use mesh_node::used::secs;

/// The page for a farm.
pub fn render(about: &About, model: &Model, made_at: &str) -> Result<String> {
    let timeline = draw::timeline(model)?;
    let rows = draw::slots(model).0.len();
    let spreads = draw::distributions(model, &about.used)?;
    let estimates = draw::estimates(&about.eta_history, model.span, about.finished)?;
    let c = &about.counts;
    let page = html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                title { "mesh report: " (about.name) " (" (about.id) ")" }
                style { (PreEscaped(STYLE)) }
            }
            body {
                h1 { "Farm " (about.name) }
                p #summary data-total=(c.total) data-done=(c.done) data-failed=(c.failed) {
                    code { (about.id) } ", " (about.state) ": "
                    (c.done) " of " (c.total) " tasks done (" (c.cached) " reused), "
                    (c.failed) " failed, " (c.skipped) " skipped, " (c.running) " running"
                    @if let Some((a, b)) = model.span { "; its runs span " (secs(b - a)) }
                    "."
                    @if let Some(h) = &about.home { " Home: " code { (h) } "." }
                    br;
                    span.note { "Made by " code { "mesh report" } " at " (made_at) "." }
                }
                (stages(&about.used))
                h2 { "Timeline" }
                @match &timeline {
                    Some(svg) => {
                        p.note { "Each node's slots, a bar a run, coloured by stage; failed runs in red. "
                            @if rows > draw::ROWS_MAX { "The first " (draw::ROWS_MAX) " of " (rows) " slots are drawn." } }
                        p.legend {
                            @for (i, name) in model.stages.iter().enumerate() {
                                span { i style={ "background:" (draw::css_color(i)) } {} (name) }
                            }
                            span { i style="background:#ff0000" {} "failed" }
                        }
                        (PreEscaped(svg))
                    }
                    None => p.note { "No run of this farm kept when it started (a " code { "mesh run" } " farm's records keep how long each ran, not when), so there is no timeline." },
                }
                h2 { "Runtime, CPU and memory per stage" }
                @if spreads.is_empty() {
                    p.note { "No task of this farm has a measured run yet." }
                } @else {
                    p.note { "A box per stage: the middle half of its tasks, the line at the median, whiskers to 1.5 times the box; the dot is the largest." }
                    @for svg in &spreads { (PreEscaped(svg)) }
                }
                (failures(&about.failures))
                (moved(model, about.home_bytes))
                h2 { "The end as estimated" }
                @match &estimates {
                    Some(svg) => (PreEscaped(svg)),
                    None => p.note { "No estimate of the end was recorded (its home keeps them while it runs; a farm that ended before its first estimate, or whose home restarted since, has none)." },
                }
            }
        }
    };
    Ok(page.into_string())
}

/// What each stage used against its asks, as `mesh status FARM` says it;
/// each row keeps the exact figures in data attributes.
fn stages(used: &[StageUse]) -> Markup {
    html! {
        h2 { "What each stage used" }
        @if used.is_empty() {
            p.note { "No task of this farm has a measured run yet." }
        } @else {
            div.wide { table #stages {
                tr {
                    th { "stage" } th { "runs" } th { "runtime p50" } th { "p90" } th { "CPU" }
                    th { "peak p50" } th { "p99" } th { "max" } th { "memory asked" } th { "cores asked" }
                    th { "read" } th { "written" } th { "killed for memory" }
                }
                @for u in used {
                    tr data-stage=(u.stage) data-runs=(u.runs)
                        data-runtime-p50-ms=(u.runtime_p50_ms) data-runtime-p90-ms=(u.runtime_p90_ms)
                        data-cpu-pct=(format!("{:.3}", u.cpu_pct))
                        data-peak-p50=(u.peak_p50) data-peak-p99=(u.peak_p99) data-peak-max=(u.peak_max)
                        data-mem-asked=(u.mem_asked) data-read-bytes=(u.read_bytes)
                        data-written-bytes=(u.written_bytes) data-oom=(u.oom) {
                        td { (u.stage) } td { (u.runs) }
                        td { (secs(u.runtime_p50_ms)) } td { (secs(u.runtime_p90_ms)) }
                        td { (format!("{:.0}%", u.cpu_pct)) }
                        @if u.peak_max > 0 {
                            td { (bytes(u.peak_p50)) } td { (bytes(u.peak_p99)) } td { (bytes(u.peak_max)) }
                        } @else {
                            // Its tasks ended before their first look (see usage.rs).
                            td colspan="3" title="its tasks ended before the first look, 10 ms in" { "not seen" }
                        }
                        td { @if u.mem_asked > 0 { (bytes(u.mem_asked)) } @else { "—" } }
                        td { (u.cpu_asked) }
                        td { (bytes(u.read_bytes)) } td { (bytes(u.written_bytes)) } td { (u.oom) }
                    }
                }
            } }
            @let hints: Vec<String> = used.iter().flat_map(StageUse::hints).collect();
            @if !hints.is_empty() {
                ul #hints { @for h in &hints { li { (h) } } }
            }
        }
    }
}

fn failures(failures: &[String]) -> Markup {
    html! {
        h2 { "Failures" }
        @if failures.is_empty() {
            p.note { "None." }
        } @else {
            ul #failures { @for f in failures { li { code { (f) } } } }
        }
    }
}

/// Outputs that tasks took from other nodes, and that came home.
fn moved(model: &Model, home_bytes: u64) -> Markup {
    let total: u64 = model.moved.iter().map(|m| m.bytes).sum();
    html! {
        h2 { "Data moved between nodes" }
        p #moved-total data-bytes=(total) {
            (bytes(total)) " of dependencies' outputs went to tasks on other nodes"
            @if home_bytes > 0 { "; " (bytes(home_bytes)) " of outputs came home" }
            "."
        }
        @if !model.moved.is_empty() {
            table #moved {
                tr { th { "from" } th { "to" } th { "bytes" } }
                @for m in model.moved.iter().take(30) {
                    tr { td { code { (m.from) } } td { code { (m.to) } } td { (bytes(m.bytes)) } }
                }
            }
            @if model.moved.len() > 30 { p.note { "The 30 largest of " (model.moved.len()) " pairs." } }
        }
    }
}
