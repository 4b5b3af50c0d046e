//! `mesh watch`: a live view of farms in the terminal (per-stage bars with rate and ETA, nodes with their load, recent failures), or plain lines when not on a terminal.

use std::collections::HashMap;
use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use console::{Style, Term};
use mesh_node::control::{Client, ControlError, ControlRequest, ControlResponse, Target};
use mesh_node::state::StateDir;
use mesh_node::view::{eta_s, short_id, StageRates};
use mesh_node::view::{FarmView, MeshStatus};
use mesh_protocol::engine::Counts;

use crate::EXIT_FAILED_TASKS;

/// A stage's rate is measured over this long (ms).
const RATE_WINDOW_MS: u64 = 15_000;
const BAR_WIDTH: usize = 30;
const FAILURES_SHOWN: usize = 5;
const FARMS_SHOWN: usize = 8;

/// One update's worth: the mesh (when a node runs here) and the farms.
struct Frame {
    mesh: Option<MeshStatus>,
    farms: Vec<FarmView>,
}

pub fn watch(
    state: &StateDir,
    to: &Target,
    farm: Option<&str>,
    every: f64,
    until_done: bool,
) -> Result<ExitCode> {
    if !(every > 0.0 && every.is_finite()) {
        bail!("--every {every}: expected a number of seconds above 0, e.g. 0.5");
    }
    let term = Term::stdout();
    let tty = term.is_term() && std::io::stdout().is_terminal();
    let color = tty && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let mut rates = StageRates::new(RATE_WINDOW_MS);
    // Rates are timed on a monotonic clock.
    let start = Instant::now();
    let mut last_lines: HashMap<String, String> = HashMap::new();
    loop {
        let frame = read(state, to, farm)?;
        let now = start.elapsed().as_millis() as u64;
        if tty {
            let (rows, cols) = term.size();
            let text = render(
                &frame,
                &mut rates,
                now,
                color,
                usize::from(cols),
                usize::from(rows),
            );
            term.clear_screen()?;
            let mut out = crate::out::stdout();
            out.write_all(text.as_bytes())?;
            out.flush()?;
        } else {
            // Plain lines, each stage's only when it changed: a log to keep.
            let mut out = crate::out::stdout();
            for f in &frame.farms {
                for (stage, c) in &f.stages {
                    let rate = rates.rate(&f.id, stage, c.ended(), now);
                    let line = plain_line(f, stage, c, rate);
                    let key = format!("{}/{stage}", f.id);
                    if last_lines.get(&key) != Some(&line) {
                        writeln!(out, "{} {line}", clock())?;
                        last_lines.insert(key, line);
                    }
                }
            }
            out.flush()?;
        }
        let all_done = !frame.farms.is_empty() && frame.farms.iter().all(|f| f.finished);
        if (until_done || farm.is_some()) && all_done {
            let failed = frame.farms.iter().any(|f| f.counts.failed > 0);
            return Ok(if failed {
                ExitCode::from(EXIT_FAILED_TASKS)
            } else {
                ExitCode::SUCCESS
            });
        }
        std::thread::sleep(Duration::from_secs_f64(every));
    }
}

/// From the node running here, or else from the farm's snapshot on disk (`mesh run`).
fn read(state: &StateDir, to: &Target, farm: Option<&str>) -> Result<Frame> {
    match ask(to, &ControlRequest::Status) {
        Ok(Some(ControlResponse::Status(mesh))) => {
            let farms = mesh_farms(to, farm)?;
            Ok(Frame {
                mesh: Some(*mesh),
                farms,
            })
        }
        Ok(Some(ControlResponse::Error { message, .. })) => bail!("{message}"),
        Ok(_) => bail!("the node sent no status"),
        Err(ControlError::NoNode(_)) => {
            let s = state.find(farm)?;
            Ok(Frame {
                mesh: None,
                farms: vec![FarmView::from_status(&s)],
            })
        }
        Err(e) => Err(e.into()),
    }
}

fn ask(to: &Target, req: &ControlRequest) -> Result<Option<ControlResponse>, ControlError> {
    let mut c = Client::request(to, req)?;
    c.recv().transpose()
}

/// The farm asked for, or the mesh's farms (running first) with their stages.
fn mesh_farms(to: &Target, farm: Option<&str>) -> Result<Vec<FarmView>> {
    let one = |q: &str| -> Result<FarmView> {
        match ask(to, &ControlRequest::Farm { farm: q.into() })? {
            Some(ControlResponse::Farm(v)) => Ok(*v),
            Some(ControlResponse::Error { message, .. }) => bail!("{message}"),
            _ => bail!("the node sent no farm"),
        }
    };
    if let Some(q) = farm {
        return Ok(vec![one(q)?]);
    }
    let mut list = match ask(to, &ControlRequest::List)? {
        Some(ControlResponse::List(v)) => v,
        Some(ControlResponse::Error { message, .. }) => bail!("{message}"),
        _ => bail!("the node sent no list"),
    };
    list.sort_by_key(|f| f.finished);
    list.truncate(FARMS_SHOWN);
    list.iter()
        .map(|f| {
            if f.finished {
                Ok(f.clone())
            } else {
                one(&f.id)
            }
        })
        .collect()
}

fn eta(c: &Counts, rate: f64) -> String {
    match eta_s(c, rate) {
        _ if c.ended() >= c.total => "done".into(),
        Some(s) => format!(
            "ETA {}",
            humantime::format_duration(Duration::from_secs(s.ceil() as u64))
        ),
        None => "ETA —".into(),
    }
}

fn plain_line(f: &FarmView, stage: &str, c: &Counts, rate: f64) -> String {
    let skipped = match c.skipped {
        0 => String::new(),
        n => format!(", {n} skipped"),
    };
    format!(
        "{}/{stage}: {}/{} done, {} running, {} queued, {} failed{skipped}, {rate:.1}/s, {}",
        f.id,
        c.done,
        c.total,
        c.running,
        c.queued(),
        c.failed,
        eta(c, rate)
    )
}

fn clock() -> String {
    let secs = mesh_node::state::unix_ms() / 1000;
    format!(
        "{:02}:{:02}:{:02}",
        (secs / 3600) % 24,
        (secs / 60) % 60,
        secs % 60
    )
}

/// A whole screen for a terminal of `cols` x `rows`: the header, the farms
/// while they fit (each stage a line, the bar as wide as the line
/// allows), and the mesh at a glance at the bottom, a few lines whatever
/// its size. Nothing wider than the terminal, nothing below its last line.
fn render(
    frame: &Frame,
    rates: &mut StageRates,
    now: u64,
    color: bool,
    cols: usize,
    rows: usize,
) -> String {
    let pal = Palette::new(color);
    let (red, dim, bold) = (&pal.red, &pal.dim, &pal.bold);
    let cols = cols.max(40);
    // Lines with what they show when plain: each is cut to the width.
    let mut lines: Vec<(String, String)> = Vec::new();
    let mut push = |styled: String, plain: String| lines.push((styled, plain));
    let head = match &frame.mesh {
        Some(m) => format!(
            "mesh · coordinator {} (term {}) · {} nodes · {} UTC",
            m.coordinator.as_deref().map_or("not elected", short_id),
            m.term,
            m.nodes.len(),
            clock()
        ),
        None => format!("mesh run · this machine · {} UTC", clock()),
    };
    push(bold.apply_to(&head).to_string(), head);
    push(String::new(), String::new());
    let mesh_lines = if frame.mesh.is_some() { 4 } else { 0 };
    let room = rows.saturating_sub(lines.len() + mesh_lines);
    let mut body: Vec<(String, String)> = Vec::new();
    if frame.farms.is_empty() {
        let t = "no farms yet: `mesh submit FARM.toml`".to_string();
        body.push((t.clone(), t));
    }
    let mut hidden = 0;
    for f in &frame.farms {
        let stages = f.stages.len() + 1 + f.failures.len().min(FAILURES_SHOWN);
        if body.len() + stages.min(2) > room {
            hidden += 1;
            continue;
        }
        let state = f.state_word();
        let skipped = match f.counts.skipped {
            0 => String::new(),
            n => format!(", {n} skipped"),
        };
        let text = format!(
            "farm {} {state}  {}/{} done, {} failed{skipped}",
            f.id, f.counts.done, f.counts.total, f.counts.failed
        );
        body.push((
            format!(
                "{} {}  {}/{} done, {} failed{skipped}",
                bold.apply_to(format!("farm {}", f.id)),
                dim.apply_to(state),
                f.counts.done,
                f.counts.total,
                f.counts.failed
            ),
            text,
        ));
        let width = f
            .stages
            .iter()
            .map(|(n, _)| n.len())
            .max()
            .unwrap_or(0)
            .min(24);
        for (stage, c) in &f.stages {
            let rate = rates.rate(&f.id, stage, c.ended(), now);
            if body.len() >= room {
                continue;
            }
            body.push(stage_line(&pal, stage, c, rate, width, cols));
        }
        if let Some(words) = f.eta_words(mesh_node::state::unix_ms()) {
            if body.len() < room {
                let t = format!("  {words}");
                body.push((dim.apply_to(&t).to_string(), t));
            }
        }
        if let Some(words) = f.data.words() {
            if body.len() < room {
                let t = format!("  {words}");
                body.push((dim.apply_to(&t).to_string(), t));
            }
        }
        for line in f.failures.iter().take(FAILURES_SHOWN) {
            if body.len() < room {
                body.push((
                    format!("  {} {line}", red.apply_to("✗")),
                    format!("  ✗ {line}"),
                ));
            }
        }
        if f.counts.skipped > 0 && body.len() < room {
            // A failure reads `solve/3 (attempt 1 on ...): ...`: its task first.
            let names = f
                .failures
                .iter()
                .filter_map(|l| l.split_whitespace().next());
            let t = format!("  {}", crate::show::skipped_line(f.counts.skipped, names));
            body.push((dim.apply_to(&t).to_string(), t));
        }
    }
    if hidden > 0 && body.len() < room {
        let t = format!("{hidden} more farm(s): `mesh watch FARM` for one");
        body.push((dim.apply_to(&t).to_string(), t));
    }
    lines.extend(body);
    if let Some(m) = &frame.mesh {
        lines.extend(glance_lines(&pal, m));
    }
    let mut o = String::new();
    // The last row stays free: a newline there would scroll the screen.
    for (styled, plain) in lines.iter().take(rows.saturating_sub(1)) {
        // Cut to the width: on the plain text, as styles add no cells.
        if plain.chars().count() > cols {
            let cut: String = plain.chars().take(cols.saturating_sub(1)).collect();
            o.push_str(&cut);
            o.push('…');
        } else {
            o.push_str(styled);
        }
        o.push('\n');
    }
    o
}

/// The styles a screen is drawn in (none when `color` is off).
struct Palette {
    green: Style,
    red: Style,
    blue: Style,
    dim: Style,
    bold: Style,
}

impl Palette {
    fn new(color: bool) -> Palette {
        let st = |s: Style| s.force_styling(color);
        Palette {
            green: st(Style::new().green()),
            red: st(Style::new().red()),
            blue: st(Style::new().blue()),
            dim: st(Style::new().dim()),
            bold: st(Style::new().bold()),
        }
    }
}

/// A stage's line: its name in `width`, a bar as wide as a line of `cols`
/// leaves (done, failed, running, left), and its numbers; styled, and plain.
fn stage_line(
    pal: &Palette,
    stage: &str,
    c: &Counts,
    rate: f64,
    width: usize,
    cols: usize,
) -> (String, String) {
    let (green, red, blue, dim) = (&pal.green, &pal.red, &pal.blue, &pal.dim);
    let total = c.total.max(1) as f64;
    let pct = format!("{:>3.0}%", 100.0 * c.ended() as f64 / total);
    let numbers = format!(
        "{}/{} {}r {}q {}f {rate:.1}/s {}",
        c.done,
        c.total,
        c.running,
        c.queued(),
        c.failed,
        eta(c, rate)
    );
    let name: String = stage.chars().take(width).collect();
    // The bar takes what the line leaves, between 8 and 30 cells.
    let fixed = 2 + width + 1 + 1 + pct.len() + 2 + numbers.len();
    let bar = cols.saturating_sub(fixed).clamp(8, BAR_WIDTH);
    let cells = |n: u64| ((n as f64 / total) * bar as f64).round() as usize;
    let (d, x, r) = (cells(c.done), cells(c.failed), cells(c.running));
    let rest = bar.saturating_sub(d + x + r);
    let plain = format!(
        "  {name:<width$} {}{}{}{} {pct}  {numbers}",
        "█".repeat(d),
        "█".repeat(x),
        "█".repeat(r),
        "░".repeat(rest)
    );
    (
        format!(
            "  {name:<width$} {}{}{}{} {pct}  {numbers}",
            green.apply_to("█".repeat(d)),
            red.apply_to("█".repeat(x)),
            blue.apply_to("█".repeat(r)),
            dim.apply_to("░".repeat(rest)),
        ),
        plain,
    )
}

/// The mesh at a glance, a few lines at any size (a line per node filled
/// the screen from 20 nodes on).
fn glance_lines(pal: &Palette, m: &mesh_node::view::MeshStatus) -> Vec<(String, String)> {
    let (bold, dim) = (&pal.bold, &pal.dim);
    let mut lines = Vec::new();
    let g = m.glance();
    let mut t = format!("nodes {}", g.states_words());
    if g.behind > 0 {
        t.push_str(&format!(" · {} behind", g.behind));
    }
    lines.push((String::new(), String::new()));
    lines.push((bold.apply_to(&t).to_string(), t));
    let used: Vec<String> = g
        .resources
        .iter()
        .filter(|r| r.kind != mesh_protocol::resources::MEM)
        .map(|r| format!("{} {:.0}/{:.0}", r.kind, r.used, r.total))
        .collect();
    let (least, median, most) = g.tasks_spread;
    let mut t = format!(
        "  in use {} · tasks per node {least}/{median}/{most}",
        used.join(" · ")
    );
    if let Some((_, median, most)) = g.load_spread {
        t.push_str(&format!(" · load {median:.1}/{most:.1}"));
    }
    lines.push((t.clone(), t));
    if !g.busiest.is_empty() {
        let t = format!("  busiest {}", g.busiest_words());
        lines.push((dim.apply_to(&t).to_string(), t));
    }
    lines
}
