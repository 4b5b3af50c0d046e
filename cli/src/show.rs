//! Everything the CLI draws: the progress bar, summaries, tables, logs.

use std::fs;
use std::io::{self, IsTerminal, Write};
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use crate::out::outln;
use anyhow::{bail, Result};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use mesh_node::farmfile::FarmWarning;
use mesh_node::runner::Observer;
use mesh_node::state::{unix_ms, FarmStatus, RunState, StateDir};
use mesh_protocol::engine::Counts;
use mesh_protocol::farm::{Command, FarmDef, TaskRef};

/// Without a terminal (batch jobs, CI logs), a progress line this often.
const PLAIN_PROGRESS_EVERY: Duration = Duration::from_secs(10);

pub fn state_word(s: RunState) -> &'static str {
    match s {
        RunState::Running => "running",
        RunState::Done => "done",
        RunState::Failed => "failed",
        RunState::Interrupted => "interrupted",
        RunState::Crashed => "crashed",
        RunState::Stopped => "stopped",
    }
}

fn counts_line(c: &Counts) -> String {
    format!(
        "{} done, {} running, {} failed, {} queued{}{}{}",
        c.done,
        c.running,
        c.failed,
        c.queued(),
        if c.skipped > 0 {
            format!(", {} skipped", c.skipped)
        } else {
            String::new()
        },
        if c.stopped > 0 {
            format!(", {} stopped", c.stopped)
        } else {
            String::new()
        },
        if c.cached > 0 {
            format!(" ({} cached)", c.cached)
        } else {
            String::new()
        },
    )
}

/// Draws a run: a progress bar on a terminal, periodic lines elsewhere.
pub struct Progress {
    bar: Option<ProgressBar>,
    /// Periodic progress lines (no terminal, not --json / --quiet).
    lines: bool,
    /// Failures and notices (all but --quiet).
    quiet: bool,
    plain_last: Option<Instant>,
    /// Stages whose stop was said as it happened.
    stops_said: usize,
}

impl Progress {
    /// `json`: stdout is for the result, so no bar or progress lines; messages still go to stderr.
    pub fn new(json: bool, quiet: bool, terminal: bool) -> Progress {
        let show_progress = !json && !quiet;
        let bar = (show_progress && terminal).then(|| {
            let b = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr_with_hz(10));
            b.set_style(
                ProgressStyle::with_template(
                    "{spinner} {elapsed_precise} [{bar:30}] {pos}/{len} {msg} · {per_sec} · ETA {eta}",
                )
                .expect("the template is valid")
                .progress_chars("=> "),
            );
            b
        });
        Progress {
            bar,
            lines: show_progress && !terminal,
            quiet,
            plain_last: None,
            stops_said: 0,
        }
    }

    /// Whether the stops of a run were said as they happened (not with
    /// --quiet): the summary then does not say them again.
    pub fn said_stops(&self) -> bool {
        !self.quiet && self.stops_said > 0
    }

    pub fn finish(&mut self) {
        if let Some(b) = self.bar.take() {
            b.finish_and_clear();
        }
    }

    fn say(&self, line: &str) {
        if self.quiet {
            return;
        }
        match &self.bar {
            Some(b) => b.println(line),
            None => eprintln!("{line}"),
        }
    }
}

impl Observer for Progress {
    fn started(&mut self, s: &FarmStatus) {
        let resumed = if s.counts.done > 0 || s.counts.failed > 0 {
            format!(", {} already done", s.counts.done)
        } else {
            String::new()
        };
        self.say(&format!(
            "farm {} (run {}): {} tasks{resumed}",
            s.id, s.run, s.counts.total
        ));
        if let Some(b) = &self.bar {
            b.set_length(s.counts.total);
        }
    }

    fn progress(&mut self, s: &FarmStatus) {
        let c = &s.counts;
        let finished = c.ended();
        let eta = s.eta.as_ref().map(|e| format!(" · {}", e.words(unix_ms())));
        if let Some(b) = &self.bar {
            b.set_position(finished);
            b.set_message(format!(
                "running {} · failed {} · queued {}{}",
                c.running,
                c.failed,
                c.queued(),
                eta.unwrap_or_default()
            ));
            return;
        }
        if !self.lines {
            return;
        }
        let due = self
            .plain_last
            .is_none_or(|t| t.elapsed() >= PLAIN_PROGRESS_EVERY);
        if due {
            self.plain_last = Some(Instant::now());
            eprintln!(
                "progress: {finished}/{} finished · {} · {:.0}s{}",
                c.total,
                counts_line(c),
                s.elapsed_ms as f64 / 1000.0,
                eta.unwrap_or_default()
            );
        }
    }

    fn task_failed(&mut self, task: &str, attempt: u32, reason: &str, retrying: bool) {
        let next = if retrying { "; retrying" } else { "" };
        self.say(&format!(
            "task {task} failed (attempt {attempt}): {reason}{next}"
        ));
    }

    fn unplaceable(&mut self, stage: &str, shortfall: &str) {
        self.say(&format!(
            "stage {stage} cannot run here: {shortfall} (offer more with --resources)"
        ));
    }

    fn stage_stopped(&mut self, line: &str) {
        self.stops_said += 1;
        self.say(line);
    }

    fn stage_resumed(&mut self, line: &str) {
        self.say(line);
    }

    fn set_aside(&mut self, line: &str) {
        self.say(line);
    }

    fn interrupting(&mut self) {
        self.say("stopping: killing running tasks (Ctrl-C again to kill at once)");
    }
}

/// The end-of-run summary on stderr; `stops_said`: the stopped stages'
/// lines were said during the run.
pub fn summary(s: &FarmStatus, out: &Path, stops_said: bool) {
    let c = &s.counts;
    let secs = s.elapsed_ms as f64 / 1000.0;
    let rate = if secs > 0.0 {
        format!(
            " ({:.0} tasks/s)",
            (c.done - c.cached + c.failed) as f64 / secs
        )
    } else {
        String::new()
    };
    eprintln!(
        "farm {}: {} — {} tasks in {:.1}s{rate}: {}",
        s.id,
        state_word(s.state),
        c.total,
        secs,
        counts_line(c)
    );
    let stopped: Vec<&str> = s
        .stages
        .iter()
        .filter(|st| st.stopped.is_some())
        .map(|st| st.name.as_str())
        .collect();
    if !stops_said {
        for line in s.stages.iter().filter_map(|st| st.stopped.as_deref()) {
            eprintln!("  {line}");
        }
    }
    for f in &s.failed {
        eprintln!("  failed {} (attempt {}): {}", f.task, f.attempt, f.reason);
    }
    if c.skipped > 0 {
        eprintln!(
            "  {}",
            skipped_line(c.skipped, s.failed.iter().map(|f| f.task.as_str()))
        );
    }
    if !s.failed.is_empty() {
        if let Some(first) = s.failed.iter().find(|f| f.attempt > 0) {
            eprintln!(
                "  see a task's output with `mesh logs {} --farm {}`",
                first.task, s.id
            );
        }
    }
    if out.exists() {
        eprintln!("outputs: {}", out.display());
    }
    match s.state {
        RunState::Interrupted => eprintln!("continue with `mesh resume {}`", s.id),
        RunState::Stopped => eprintln!(
            "once the cause is fixed, `mesh resume {}` runs {} again (if the fix is in the farm file, `mesh run` it again instead: what succeeded does not run twice)",
            s.id,
            match stopped.as_slice() {
                [one] => format!("stage `{one}`"),
                many => format!("stages {}", many.join(", ")),
            }
        ),
        RunState::Failed => eprintln!(
            "run the failed tasks again with `mesh resume {} --retry-failed`",
            s.id
        ),
        _ => {}
    }
}

/// Why tasks were skipped: what they depend on failed (or was skipped in
/// turn), naming the first failures.
pub fn skipped_line<'a>(n: u64, failed: impl Iterator<Item = &'a str>) -> String {
    let names: Vec<&str> = failed.take(3).collect();
    let which = if names.is_empty() {
        "a task that failed".to_string()
    } else {
        names.join(", ")
    };
    if n == 1 {
        format!("skipped 1 task: it depends on {which} (or on a task skipped for it), and runs once that succeeds")
    } else {
        format!("skipped {n} tasks: they depend on {which} (or on tasks skipped for it), and run once that succeeds")
    }
}

fn ago(ms: u64) -> String {
    let d = unix_ms().saturating_sub(ms) / 1000;
    match d {
        0..=59 => format!("{d}s ago"),
        60..=3599 => format!("{}m ago", d / 60),
        3600..=86399 => format!("{}h ago", d / 3600),
        _ => format!("{}d ago", d / 86400),
    }
}

pub fn list(all: &[FarmStatus], json: bool) -> Result<()> {
    let mut out = crate::out::stdout();
    if json {
        writeln!(out, "{}", serde_json::to_string_pretty(all)?)?;
        return Ok(());
    }
    if all.is_empty() {
        writeln!(out, "no farms yet (start one with `mesh run farm.toml`)")?;
        return Ok(());
    }
    let mut t = table(
        &["FARM", "STATE", "RUN", "DONE/TOTAL", "FAILED", "UPDATED"],
        2,
    );
    for s in all {
        t.add_row(vec![
            s.id.clone(),
            state_word(s.state).to_string(),
            s.run.to_string(),
            format!("{}/{}", s.counts.done, s.counts.total),
            s.counts.failed.to_string(),
            ago(s.updated_at_ms),
        ]);
    }
    writeln!(out, "{}", lines(&t))?;
    Ok(())
}

pub fn status(s: &FarmStatus, json: bool) -> Result<()> {
    let mut out = crate::out::stdout();
    if json {
        writeln!(out, "{}", serde_json::to_string_pretty(s)?)?;
        return Ok(());
    }
    let how = match s.state {
        RunState::Running => format!("running (pid {} on {})", s.pid, s.host),
        RunState::Crashed => "crashed (its process died); continue with `mesh resume`".into(),
        RunState::Interrupted => "interrupted; continue with `mesh resume`".into(),
        RunState::Stopped => "stopped; once the cause is fixed, continue with `mesh resume`".into(),
        other => state_word(other).into(),
    };
    writeln!(out, "farm    {} ({})", s.id, s.name)?;
    writeln!(
        out,
        "state   {how}, run {}, updated {}",
        s.run,
        ago(s.updated_at_ms)
    )?;
    writeln!(out, "file    {}", s.file)?;
    writeln!(out, "out     {}", s.out)?;
    writeln!(
        out,
        "tasks   {} total: {}",
        s.counts.total,
        counts_line(&s.counts)
    )?;
    if let Some(e) = s.eta.as_ref().filter(|_| s.state == RunState::Running) {
        writeln!(out, "end     {}", e.words(unix_ms()))?;
    }
    writeln!(out)?;
    let mut t = table(
        &[
            "STAGE", "TOTAL", "DONE", "RUNNING", "FAILED", "SKIPPED", "QUEUED", "STOPPED",
        ],
        1,
    );
    for st in &s.stages {
        let c = &st.counts;
        t.add_row(vec![
            st.name.clone(),
            c.total.to_string(),
            c.done.to_string(),
            c.running.to_string(),
            c.failed.to_string(),
            c.skipped.to_string(),
            c.queued().to_string(),
            c.stopped.to_string(),
        ]);
    }
    writeln!(out, "{}", lines(&t))?;
    let stops: Vec<&str> = s
        .stages
        .iter()
        .filter_map(|st| st.stopped.as_deref())
        .collect();
    if !stops.is_empty() {
        writeln!(out)?;
        for line in stops {
            writeln!(out, "{line}")?;
        }
    }
    if !s.failed.is_empty() {
        writeln!(out)?;
        for f in &s.failed {
            writeln!(
                out,
                "failed  {} (attempt {}): {}",
                f.task, f.attempt, f.reason
            )?;
        }
    }
    let used = used_lines(&s.used);
    if !used.is_empty() {
        writeln!(out)?;
        for line in used {
            writeln!(out, "{line}")?;
        }
    }
    Ok(())
}

/// What each stage's tasks used, a line a stage, then what that says of
/// their asks (see `mesh_node::used`): `mesh status FARM`, here or on a mesh.
pub fn used_lines(used: &[mesh_node::used::StageUse]) -> Vec<String> {
    let mut lines: Vec<String> = used
        .iter()
        .map(|u| format!("used    {}: {}", u.stage, u.words()))
        .collect();
    lines.extend(
        used.iter()
            .flat_map(|u| u.hints())
            .map(|h| format!("hint    {h}")),
    );
    lines
}

/// After a task's logs, where a person reads them (stderr is a terminal,
/// so a redirected stderr holds the task's alone): what its run used.
pub fn task_used(
    task: &str,
    attempt: Option<u32>,
    node: Option<&str>,
    used: Option<&mesh_node::used::TaskUsed>,
) {
    let Some(u) = used else { return };
    if !io::stderr().is_terminal() {
        return;
    }
    let on = node.map(|n| format!(" on {n}")).unwrap_or_default();
    let attempt = attempt
        .map(|a| format!(", attempt {a}"))
        .unwrap_or_default();
    eprintln!("── {task}{attempt}{on}: {}", u.words());
}

/// `mesh check`: what a farm file expands to.
/// Prints a farm file's warnings on stderr, one a line.
pub fn warn(warnings: &[FarmWarning]) {
    for w in warnings {
        eprintln!("warning: {w}");
    }
}

pub fn check(def: &FarmDef, warnings: &[FarmWarning], show: u32, json: bool) -> Result<()> {
    let mut out = crate::out::stdout();
    let sample = |s: u32| -> Vec<String> {
        let n = def.stages[s as usize].len().min(show);
        (0..n)
            .map(|i| match def.expand(TaskRef::new(s, i)).command {
                Command::Argv(a) => a.join(" "),
                Command::Shell(sh) => format!("sh -c {sh:?}"),
                Command::Python(a) => a.join(" "),
            })
            .collect()
    };
    if json {
        let stages: Vec<_> = def
            .stages
            .iter()
            .enumerate()
            .map(|(i, s)| {
                serde_json::json!({
                    "name": s.name,
                    "tasks": s.len(),
                    "resources": s.resources.to_string(),
                    "sample": sample(i as u32),
                })
            })
            .collect();
        let warnings: Vec<_> = warnings
            .iter()
            .map(|w| serde_json::json!({"file": w.file, "line": w.line, "field": w.field, "message": w.message}))
            .collect();
        let v = serde_json::json!({"farm": def.name, "tasks": def.task_count(), "out": def.out, "stages": stages, "warnings": warnings});
        writeln!(out, "{}", serde_json::to_string_pretty(&v)?)?;
        return Ok(());
    }
    let up_to = if def.stages.iter().any(|s| s.sweep.grown().is_some()) {
        "up to "
    } else {
        ""
    };
    writeln!(
        out,
        "farm {}: {up_to}{} tasks, outputs in {}",
        def.name,
        def.task_count(),
        def.out
    )?;
    for (i, s) in def.stages.iter().enumerate() {
        let mut deps = Vec::new();
        for &a in &s.after {
            deps.push(format!("after {}", def.stages[a as usize].name));
        }
        for &a in &s.after_each {
            deps.push(format!("after each {}", def.stages[a as usize].name));
        }
        for (e, d) in s.deps.iter().enumerate() {
            let up = &def.stages[d.stage as usize];
            let how = match &d.on {
                mesh_protocol::graph::DepOn::Keyed { down, .. } => {
                    let names: Vec<&str> = down
                        .iter()
                        .map(|&v| s.sweep.vars[v as usize].name.as_str())
                        .collect();
                    format!("by {}", names.join(", "))
                }
                mesh_protocol::graph::DepOn::Listed { .. } => "as listed".to_string(),
                mesh_protocol::graph::DepOn::Grown { per } => {
                    let file = s.sweep.grown().map_or("", |g| g.file.as_str());
                    deps.push(format!(
                        "grown from each {} task: a task per line of its {file} (at most {per})",
                        up.name
                    ));
                    continue;
                }
            };
            let edges = def.graph().stages[i][e].ups.items_len();
            deps.push(format!("after {} {how} ({edges} edges)", up.name));
        }
        let deps = if deps.is_empty() {
            String::new()
        } else {
            format!(", {}", deps.join(", "))
        };
        let tasks = match s.sweep.grown() {
            Some(_) => format!("up to {} tasks", s.len()),
            None => format!("{} tasks", s.len()),
        };
        writeln!(out, "  stage {}: {tasks}, {}{deps}", s.name, s.resources)?;
        for (j, cmd) in sample(i as u32).iter().enumerate() {
            writeln!(out, "    {}/{j}: {cmd}", s.name)?;
        }
    }
    Ok(())
}

/// `mesh logs`: a task's stdout to stdout and stderr to stderr.
pub fn logs(
    state: &StateDir,
    s: &FarmStatus,
    task: &str,
    attempt: Option<u32>,
    json: bool,
) -> Result<ExitCode> {
    let Some((stage, index)) = task.rsplit_once('/') else {
        bail!("`{task}` is not a task id (expected <stage>/<index>, e.g. solve/3)");
    };
    let Ok(index) = index.parse::<u32>() else {
        bail!("`{task}` is not a task id: `{index}` is not an index");
    };
    let Some(st) = s.stages.iter().find(|st| st.name == stage) else {
        let names: Vec<_> = s.stages.iter().map(|st| st.name.as_str()).collect();
        bail!(
            "farm {} has no stage `{stage}` (stages: {})",
            s.id,
            names.join(", ")
        );
    };
    if index as u64 >= st.counts.total {
        bail!(
            "stage {stage} has tasks 0 to {}; there is no {task}",
            st.counts.total.saturating_sub(1)
        );
    }
    let dir = state.logs_dir(&s.id).join(stage);
    let given = attempt;
    let attempt = match attempt {
        Some(a) => Some(a),
        None => mesh_node::executor::latest_attempt(&dir, index),
    };
    let read = |stream: &str| -> Option<Vec<u8>> {
        let a = attempt?;
        fs::read(dir.join(format!("{index}.{a}.{stream}"))).ok()
    };
    let (stdout, stderr) = (read("out"), read("err"));
    // What the run that counts used, where the store can be read (not
    // while the run holds it); for the latest attempt only.
    let used = match mesh_node::runner::task_used(state, &s.id, stage, index) {
        Ok(u) if given.is_none() => u,
        _ => None,
    };
    if json {
        let v = serde_json::json!({
            "farm": s.id,
            "task": task,
            "attempt": attempt,
            "stdout": stdout.as_deref().map(String::from_utf8_lossy),
            "stderr": stderr.as_deref().map(String::from_utf8_lossy),
            "used": used,
        });
        outln!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(ExitCode::SUCCESS);
    }
    if stdout.is_none() && stderr.is_none() {
        match attempt {
            Some(a) => eprintln!("{task} wrote no output in attempt {a}"),
            None => eprintln!("{task} has written no output"),
        }
        return Ok(ExitCode::SUCCESS);
    }
    if let Some(o) = stdout {
        crate::out::stdout().write_all(&o)?;
    }
    if let Some(e) = stderr {
        io::stderr().write_all(&e)?;
    }
    task_used(task, attempt, None, used.as_ref());
    Ok(ExitCode::SUCCESS)
}

/// Latency percentiles as a table, one kind per line.
pub fn latency_table(rows: &[mesh_protocol::observe::LatencySummary], indent: &str) {
    let mut t = table(&["", "count", "p50", "p90", "p99", "max"], 1);
    for r in rows {
        t.add_row(vec![
            r.name.clone(),
            r.count.to_string(),
            ms(r.p50_ms),
            ms(r.p90_ms),
            ms(r.p99_ms),
            ms(r.max_ms),
        ]);
    }
    for line in lines(&t).lines() {
        outln!("{indent}{line}");
    }
}

/// A plain table, each column as wide as its widest cell (a long farm or
/// stage name widens its column instead of pushing the rest out of
/// line), columns from `right` on aligned right, as numbers are.
fn table(header: &[&str], right: usize) -> comfy_table::Table {
    let mut t = comfy_table::Table::new();
    t.load_style(comfy_table::presets::NOTHING)
        .set_content_arrangement(comfy_table::ContentArrangement::Disabled)
        .set_header(header.to_vec());
    let last = header.len().saturating_sub(1);
    for (i, c) in t.column_iter_mut().enumerate() {
        c.set_padding((0, if i < last { 2 } else { 0 }));
        if i >= right {
            c.set_cell_alignment(comfy_table::CellAlignment::Right);
        }
    }
    t
}

/// A table's lines without the blanks its cells leave at their ends.
fn lines(t: &comfy_table::Table) -> String {
    t.lines()
        .map(|l| l.trim_end().to_string())
        .collect::<Vec<_>>()
        .join("\n")
}

/// Milliseconds for people: `0.42 ms`, `12.3 ms`, `2.31 s`.
fn ms(v: f64) -> String {
    if v >= 1000.0 {
        format!("{:.2} s", v / 1000.0)
    } else if v >= 10.0 {
        format!("{v:.1} ms")
    } else {
        format!("{v:.2} ms")
    }
}
