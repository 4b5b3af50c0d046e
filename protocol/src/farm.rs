//! The farm model: stages, sweeps and templates, expanded into tasks lazily.
//!
//! A farm is kept as its definition, never as a list of tasks: task `i` of a
//! stage is computed from the sweep on demand (mixed-radix digits for a
//! product, one shared index for a zip). A million-task range sweep therefore
//! costs a few bytes until its tasks run. The loader that reads farm files
//! (with files, line numbers and error messages) lives in `mesh-node`; this
//! module is pure data and arithmetic.

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::resources::Resources;

pub mod graph;

/// The most tasks one stage may expand into.
pub const STAGE_TASKS_MAX: u64 = u32::MAX as u64;

/// A stage's `max_fails` unless its farm file says otherwise: enough
/// alike failures to be sure of a cause shared by every task, few enough
/// that it costs seconds, not a stage's worth of failed attempts.
pub const MAX_FAILS_DEFAULT: u32 = 5;

pub use crate::ids::TaskRef;

/// A farm's stages: a persistent vector, so that each generation of an open
/// farm shares the stages of the one before and a growth costs what it adds,
/// not a copy of every stage's handle.
pub type Stages = imbl::Vector<Arc<StageDef>>;

/// The stages from `from` on (a growth's own), found in O(log n) rather
/// than walked to.
pub fn stages_from(stages: &Stages, from: usize) -> impl Iterator<Item = &Arc<StageDef>> {
    from_on(stages, from).map(|(_, s)| s)
}

/// Whether `b` starts with the stages of `a`, compared by value where
/// they are not shared: a stretch both share (one generation built on the
/// other) is passed over a chunk at a time, not walked.
pub fn stages_start(a: &Stages, b: &Stages) -> bool {
    if a.len() > b.len() {
        return false;
    }
    let (mut fa, mut fb) = (a.focus(), b.focus());
    let mut i = 0;
    while i < a.len() {
        let (ra, sa) = fa.chunk_at(i);
        let (rb, sb) = fb.chunk_at(i);
        if ra == rb && std::ptr::eq(sa, sb) {
            i = ra.end;
            continue;
        }
        let end = ra.end.min(rb.end);
        let (sa, sb) = (
            &sa[i - ra.start..end - ra.start],
            &sb[i - rb.start..end - rb.start],
        );
        if !sa.iter().zip(sb).all(|(x, y)| Arc::ptr_eq(x, y) || x == y) {
            return false;
        }
        i = end;
    }
    true
}

/// The items of `v` from `from` on, each with its place, found in
/// O(log n): a persistent vector's iterator skips by walking.
pub fn from_on<A: Clone>(v: &imbl::Vector<A>, from: usize) -> impl Iterator<Item = (usize, &A)> {
    let from = from.min(v.len());
    let rest = v.focus().narrow(from..).into_iter();
    rest.enumerate().map(move |(i, a)| (from + i, a))
}

/// A farm, resolved: every sweep's values are known, every path checked.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FarmDef {
    /// The farm's name: what `{farm}` and `MESH_FARM` give a task, and the
    /// default output folder, `mesh-out/<name>`.
    pub name: String,
    /// Absolute folder of the farm file; relative paths start here.
    pub root: String,
    /// Absolute output folder (`{out}`).
    pub out: String,
    /// The stages in the farm file's order; a [`TaskRef`]'s `stage` is a place
    /// in this list.
    pub stages: Stages,
    /// The per-task dependencies expanded, once asked for.
    #[serde(skip)]
    pub graph: graph::GraphCache,
}

/// So a holder of a farm's definition, bare or in a submission, can lend it
/// where only the definition is read (a task's view of `{out}`).
impl AsRef<FarmDef> for FarmDef {
    fn as_ref(&self) -> &FarmDef {
        self
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
/// One stage of a farm: a command run once for each task of its sweep,
/// with what its tasks read, write, take and wait for.
pub struct StageDef {
    /// Unique in its farm: what `{stage}` gives, and the first part of a
    /// task's id (`<stage>/<index>`).
    pub name: String,
    /// What names a task for its content key in place of its stage's name
    /// and its values (see [`FarmDef::task_identity`]): a template of its
    /// values, for tasks whose stage is named by when it was made (an open
    /// farm's growths: a Python client's calls), so that the same task
    /// made in another growth has the same key.
    pub key: Option<Template>,
    /// What each task runs, before its placeholders are filled in.
    pub command: CommandTemplate,
    /// The variables its tasks vary over, and how they combine into tasks.
    pub sweep: Sweep,
    /// Per-task working folder relative to `root`; `None` runs in `root`.
    pub workdir: Option<Template>,
    /// Files (relative to `root`) copied into the workdir before the task runs.
    pub inputs: Vec<Template>,
    /// Files or glob patterns (relative to the workdir) collected after success.
    pub outputs: Vec<Template>,
    /// Environment variables set for each task, each value a template.
    pub env: Vec<(String, Template)>,
    /// What each task holds of a node while it runs (one cpu unless the
    /// farm file says otherwise).
    pub resources: Resources,
    /// Failures allowed before the task is failed for good.
    pub retries: u32,
    /// The stage stops starting tasks once this many of its first ended
    /// attempts all failed the same way, none succeeding (a program that
    /// cannot start, a missing module): its other tasks wait for a resume
    /// instead of each failing alike. 0 turns this off.
    pub max_fails: u32,
    /// How long one attempt may run before it is killed and counts as a
    /// failure; `None` sets no limit.
    pub timeout_ms: Option<u64>,
    /// How long a task is expected to run (`expected = "10m"`): a node
    /// whose batch job ends sooner does not start it.
    pub expected_ms: Option<u64>,
    /// Exit codes that count as success (default `[0]`).
    pub success_codes: Vec<i32>,
    /// Whole-stage dependencies: every task of these stages must succeed first.
    pub after: Vec<u32>,
    /// Element-wise dependencies: task `i` waits for task `i` of these stages.
    pub after_each: Vec<u32>,
    /// Per-task dependencies by rule: keyed or listed (see [`graph`]).
    pub deps: Vec<graph::Dep>,
}

impl StageDef {
    /// A stage with the defaults a farm file gives: one cpu, no retries,
    /// [`MAX_FAILS_DEFAULT`], no timeout, success on exit 0, no folders,
    /// no dependencies.
    pub fn new(name: &str, command: CommandTemplate, sweep: Sweep) -> StageDef {
        let mut resources = Resources::new();
        resources.set(crate::resources::CPU, crate::resources::Amount::units(1));
        StageDef {
            name: name.to_string(),
            key: None,
            command,
            sweep,
            workdir: None,
            inputs: vec![],
            outputs: vec![],
            env: vec![],
            resources,
            retries: 0,
            max_fails: MAX_FAILS_DEFAULT,
            timeout_ms: None,
            expected_ms: None,
            success_codes: vec![0],
            after: vec![],
            after_each: vec![],
            deps: vec![],
        }
    }

    /// The number of tasks in the stage.
    pub fn len(&self) -> u32 {
        self.sweep.len() as u32
    }

    /// Whether a task of this stage can see `{out}`: its command or an
    /// environment value names it. Only such a task is given a folder that
    /// shows what it depends on.
    pub fn reads_out(&self) -> bool {
        let names_out = |t: &Template| t.parts.contains(&Part::Var(Var::Out));
        let command = match &self.command {
            CommandTemplate::Argv(args) => args.iter().any(names_out),
            CommandTemplate::Shell(line) => names_out(line),
            CommandTemplate::Python(args) => args.iter().any(names_out),
        };
        command || self.env.iter().any(|(_, v)| names_out(v))
    }

    /// Every stage this one depends on in any way (a stage may appear twice).
    pub fn upstream(&self) -> impl Iterator<Item = u32> + '_ {
        self.after
            .iter()
            .chain(&self.after_each)
            .copied()
            .chain(self.deps.iter().map(|d| d.stage))
    }

    /// Whether the stage has no tasks.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
/// A stage's command as the farm file gives it, with placeholders; a
/// task's, filled in, is a [`Command`].
pub enum CommandTemplate {
    /// Executed directly, no shell.
    Argv(Vec<Template>),
    /// Run with `/bin/sh -c`.
    Shell(Template),
    /// A Python interpreter, a script and its arguments, run as `Argv`
    /// would be, by a warm worker of that interpreter where the node keeps
    /// one (see `node/src/warm.rs`).
    Python(Vec<Template>),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
/// How a sweep's variables combine into tasks.
pub enum SweepMode {
    /// Every combination; the first variable varies slowest.
    Product,
    /// The i-th value of every variable together; all have the same length.
    Zip,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
/// The variables a stage is swept over and how they combine into its
/// tasks; task `i`'s values are computed from `i` when asked for.
pub struct Sweep {
    /// In the order the farm file gives them; templates name them by place
    /// ([`Var::Sweep`]). A grown variable comes last.
    pub vars: Vec<SweepVar>,
    /// Whether the variables combine as a product or a zip.
    pub mode: SweepMode,
}

impl Sweep {
    /// One variable over the integers `0..count`.
    pub fn range(var: &str, count: u64) -> Sweep {
        Sweep {
            vars: vec![SweepVar {
                name: var.to_string(),
                values: Values::Range {
                    start: 0,
                    step: 1,
                    count,
                    decimals: 0,
                },
            }],
            mode: SweepMode::Product,
        }
    }

    /// A stage without a sweep is one task.
    pub fn single() -> Sweep {
        Sweep {
            vars: Vec::new(),
            mode: SweepMode::Product,
        }
    }

    /// Number of tasks; saturates above `STAGE_TASKS_MAX` so callers can reject it.
    /// A grown sweep counts `per` places for each task of its source stage.
    pub fn len(&self) -> u64 {
        let (vars, per) = self.split_grown();
        let fixed = match self.mode {
            SweepMode::Product => vars.iter().fold(1u64, |acc, v| {
                acc.saturating_mul(v.values.len()).min(STAGE_TASKS_MAX + 1)
            }),
            SweepMode::Zip => vars.first().map(|v| v.values.len()).unwrap_or(1),
        };
        fixed.saturating_mul(per).min(STAGE_TASKS_MAX + 1)
    }

    /// The grown variable, when this sweep has one (always last).
    pub fn grown(&self) -> Option<&Grown> {
        match &self.vars.last()?.values {
            Values::Grown(g) => Some(g),
            _ => None,
        }
    }

    /// The variables known before the farm runs, and how many tasks each
    /// of their combinations stands for (1, or a grown sweep's `per`).
    fn split_grown(&self) -> (&[SweepVar], u64) {
        match self.grown() {
            Some(g) => (&self.vars[..self.vars.len() - 1], u64::from(g.per)),
            None => (&self.vars, 1),
        }
    }

    /// Whether the sweep makes no tasks.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The value of each variable for task `index`, in variable order. A
    /// grown variable's value is known only where the task runs: here it
    /// is its line's number (`<line 3 of found.txt>`); see
    /// [`FarmDef::expand_line_in`].
    pub fn binding(&self, index: u32) -> Vec<String> {
        let mut out = vec![String::new(); self.vars.len()];
        let (vars, per) = self.split_grown();
        let index = match self.grown() {
            Some(_) => {
                let line = u64::from(index) % per;
                out[vars.len()] = self.vars[vars.len()].values.get(line);
                (u64::from(index) / per) as u32
            }
            None => index,
        };
        match self.mode {
            SweepMode::Zip => {
                for (slot, var) in out.iter_mut().zip(vars) {
                    *slot = var.values.get(index as u64);
                }
            }
            SweepMode::Product => {
                let mut rest = index as u64;
                for (slot, var) in out.iter_mut().zip(vars).rev() {
                    let n = var.values.len().max(1);
                    *slot = var.values.get(rest % n);
                    rest /= n;
                }
            }
        }
        out
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
/// One variable of a sweep: its name and the values it takes.
pub struct SweepVar {
    /// What templates call it (`{name}`).
    pub name: String,
    /// Its values, in order.
    pub values: Values,
}

/// A sweep variable whose values are the lines of a file that each task
/// of another stage writes: that task's tasks here, one per line, made
/// when it ends (run-time fan-out). The stage has the other stage's
/// variables too, each task those of the task it grew from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grown {
    /// The stage whose tasks write the file.
    pub from: u32,
    /// The file, relative to such a task's folder (one of its outputs).
    pub file: String,
    /// Places kept for each task of `from`: its file has at most this many
    /// lines. Task `i` is line `i % per` of task `i / per`'s file.
    pub per: u32,
}

/// The values of one sweep variable.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Values {
    /// Values written out in the farm file, as text, in order.
    List(Vec<String>),
    /// Lines of a parameter file, kept as one string and line end offsets
    /// (a million lines cost 4 bytes each plus their text).
    Lines {
        /// The non-blank lines, trimmed, end to end without separators.
        text: String,
        /// Where each line ends in `text`, in bytes.
        ends: Vec<u32>,
    },
    /// `start + i * step` for `i` in `0..count`, written with `decimals`
    /// decimals; `start` and `step` are scaled by `10^decimals`.
    Range {
        /// The first value, times `10^decimals`.
        start: i64,
        /// The difference between neighbouring values, times `10^decimals`.
        step: i64,
        /// How many values.
        count: u64,
        /// Digits written after the decimal point.
        decimals: u32,
    },
    /// Lines found as the farm runs (see [`Grown`]); always a sweep's last
    /// variable.
    Grown(Grown),
}

impl Values {
    /// Builds `Lines` from a file's text: one value per non-blank line, with
    /// surrounding whitespace (and a CR of CRLF files) removed.
    pub fn lines(text: &str) -> Values {
        let mut kept = String::with_capacity(text.len());
        let mut ends = Vec::new();
        for line in text.lines() {
            let line = line.trim();
            if line.is_empty() {
                continue;
            }
            kept.push_str(line);
            ends.push(kept.len() as u32);
        }
        kept.shrink_to_fit();
        Values::Lines { text: kept, ends }
    }

    /// How many values there are; for a grown variable, its `per` places.
    pub fn len(&self) -> u64 {
        match self {
            Values::List(v) => v.len() as u64,
            Values::Lines { ends, .. } => ends.len() as u64,
            Values::Range { count, .. } => *count,
            Values::Grown(g) => u64::from(g.per),
        }
    }

    /// Whether there are no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Value `i` (below [`Values::len`]) as text; a grown variable's is its
    /// line's place (`<line 3 of found.txt>`).
    pub fn get(&self, i: u64) -> String {
        match self {
            Values::List(v) => v[i as usize].clone(),
            Values::Lines { text, ends } => {
                let i = i as usize;
                let start = if i == 0 { 0 } else { ends[i - 1] as usize };
                text[start..ends[i] as usize].to_string()
            }
            Values::Range {
                start,
                step,
                decimals,
                ..
            } => format_scaled(start + step * i as i64, *decimals),
            Values::Grown(g) => format!("<line {} of {}>", i + 1, g.file),
        }
    }

    /// Calls `f` with each value; for checks that must see every value once.
    pub fn for_each(&self, mut f: impl FnMut(&str)) {
        match self {
            Values::List(v) => v.iter().for_each(|s| f(s)),
            Values::Lines { text, ends } => {
                let mut start = 0usize;
                for &e in ends {
                    f(&text[start..e as usize]);
                    start = e as usize;
                }
            }
            Values::Range { .. } => {
                // Numbers never contain path separators or `..`; nothing to visit.
            }
            Values::Grown(_) => {
                // Not known before the farm runs: a line is checked where
                // its task runs (see `FarmDef::expand_line_in`).
            }
        }
    }
}

fn format_scaled(v: i64, decimals: u32) -> String {
    if decimals == 0 {
        return v.to_string();
    }
    let scale = 10i64.pow(decimals);
    let sign = if v < 0 { "-" } else { "" };
    let a = v.unsigned_abs();
    let s = scale as u64;
    format!(
        "{sign}{}.{:0width$}",
        a / s,
        a % s,
        width = decimals as usize
    )
}

/// What a placeholder stands for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Var {
    /// `{index}`: the task's index in its stage.
    Index,
    /// `{stage}`: the stage's name.
    Stage,
    /// `{farm}`: the farm's name.
    Farm,
    /// `{out}`: the farm's output folder, or where the node running the task
    /// has put what it depends on (see [`FarmDef::expand_in`]).
    Out,
    /// A sweep variable, by position in the stage's sweep.
    Sweep(usize),
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
/// One piece of a template.
pub enum Part {
    /// Text kept as it is (`{{` and `}}` already read as braces).
    Lit(String),
    /// A placeholder, filled in when the template is rendered.
    Var(Var),
}

/// A string with `{placeholders}`; `{{` and `}}` stand for literal braces.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Template {
    /// Its text and placeholders, in order.
    pub parts: Vec<Part>,
}

/// Why a template could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    /// A placeholder that names neither a built-in nor a sweep variable of
    /// the stage.
    // Braces in a shell line (`awk '{print $1}'`, `${HOME}`) are read as
    // a placeholder too; the escape, spelt out, is what the author needs.
    #[error("unknown placeholder `{{{name}}}` (known here: {known}); if the braces are meant literally, write `{{{{{name}}}}}`")]
    Unknown {
        /// The name as written between the braces.
        name: String,
        /// The names known there, comma-separated.
        known: String,
    },
    /// A `{` with no `}` after it.
    #[error("unclosed `{{`; if the brace is meant literally, write `{{{{`")]
    Unclosed,
    /// A single `}` outside a placeholder.
    #[error("stray `}}`; if the brace is meant literally, write `}}}}`")]
    Stray,
}

impl Template {
    /// A template of plain text: braces in `s` are kept, not read as
    /// placeholders.
    pub fn literal(s: &str) -> Template {
        Template {
            parts: vec![Part::Lit(s.to_string())],
        }
    }

    /// Parses `text`, resolving names against the built-ins and `sweep_vars`.
    pub fn parse(text: &str, sweep_vars: &[&str]) -> Result<Template, TemplateError> {
        let mut parts = Vec::new();
        let mut lit = String::new();
        let mut chars = text.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '{' if chars.peek() == Some(&'{') => {
                    chars.next();
                    lit.push('{');
                }
                '}' if chars.peek() == Some(&'}') => {
                    chars.next();
                    lit.push('}');
                }
                '}' => return Err(TemplateError::Stray),
                '{' => {
                    let mut name = String::new();
                    loop {
                        match chars.next() {
                            Some('}') => break,
                            Some(c) => name.push(c),
                            None => return Err(TemplateError::Unclosed),
                        }
                    }
                    let var = match name.trim() {
                        "index" => Var::Index,
                        "stage" => Var::Stage,
                        "farm" => Var::Farm,
                        "out" => Var::Out,
                        other => match sweep_vars.iter().position(|v| *v == other) {
                            Some(i) => Var::Sweep(i),
                            None => {
                                let mut known = vec!["index", "stage", "farm", "out"];
                                known.extend(sweep_vars.iter().copied());
                                return Err(TemplateError::Unknown {
                                    name: name.clone(),
                                    known: known.join(", "),
                                });
                            }
                        },
                    };
                    if !lit.is_empty() {
                        parts.push(Part::Lit(std::mem::take(&mut lit)));
                    }
                    parts.push(Part::Var(var));
                }
                c => lit.push(c),
            }
        }
        if !lit.is_empty() {
            parts.push(Part::Lit(lit));
        }
        Ok(Template { parts })
    }

    /// The sweep variables (by position) this template mentions.
    pub fn sweep_vars(&self) -> impl Iterator<Item = usize> + '_ {
        self.parts.iter().filter_map(|p| match p {
            Part::Var(Var::Sweep(i)) => Some(*i),
            _ => None,
        })
    }

    /// The literal text, ignoring placeholders (for static checks).
    pub fn literal_text(&self) -> String {
        let mut s = String::new();
        for p in &self.parts {
            match p {
                Part::Lit(l) => s.push_str(l),
                Part::Var(_) => s.push('x'),
            }
        }
        s
    }

    /// Whether it has no placeholders, so every task gets the same text.
    pub fn is_static(&self) -> bool {
        self.parts.iter().all(|p| matches!(p, Part::Lit(_)))
    }

    /// The text for the task `cx` describes, each placeholder replaced by
    /// its value.
    pub fn render(&self, cx: &RenderCx<'_>) -> String {
        let mut s = String::new();
        for p in &self.parts {
            match p {
                Part::Lit(l) => s.push_str(l),
                Part::Var(Var::Index) => match cx.index {
                    Some(i) => s.push_str(&i.to_string()),
                    None => s.push_str("{index}"),
                },
                Part::Var(Var::Stage) => s.push_str(cx.stage),
                Part::Var(Var::Farm) => s.push_str(cx.farm),
                Part::Var(Var::Out) => s.push_str(cx.out),
                Part::Var(Var::Sweep(i)) => s.push_str(&cx.binding[*i]),
            }
        }
        s
    }
}

impl fmt::Display for Template {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for p in &self.parts {
            match p {
                Part::Lit(l) => f.write_str(&l.replace('{', "{{").replace('}', "}}"))?,
                Part::Var(Var::Index) => f.write_str("{index}")?,
                Part::Var(Var::Stage) => f.write_str("{stage}")?,
                Part::Var(Var::Farm) => f.write_str("{farm}")?,
                Part::Var(Var::Out) => f.write_str("{out}")?,
                Part::Var(Var::Sweep(i)) => write!(f, "{{#{i}}}")?,
            }
        }
        Ok(())
    }
}

/// What a template is rendered against: one task of one stage.
pub struct RenderCx<'a> {
    /// What `{farm}` becomes.
    pub farm: &'a str,
    /// What `{stage}` becomes.
    pub stage: &'a str,
    /// What `{out}` becomes.
    pub out: &'a str,
    /// None renders `{index}` as written (a content key: see
    /// [`FarmDef::expand_for_key`]).
    pub index: Option<u32>,
    /// The task's sweep values in variable order (see [`Sweep::binding`]).
    pub binding: &'a [String],
}

/// The command of one task, fully expanded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// A program and its arguments, run without a shell.
    Argv(Vec<String>),
    /// A line run with `/bin/sh -c`.
    Shell(String),
    /// See [`CommandTemplate::Python`].
    Python(Vec<String>),
}

/// One task, expanded from its stage: everything needed to run it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskSpec {
    /// What to run.
    pub command: Command,
    /// Environment variables set for it.
    pub env: Vec<(String, String)>,
    /// Relative to the farm root; `None` runs in the root.
    pub workdir: Option<String>,
    /// Files (relative to the farm root) copied into the workdir before it runs.
    pub inputs: Vec<String>,
    /// Files or glob patterns (relative to the workdir) collected after success.
    pub outputs: Vec<String>,
}

impl FarmDef {
    /// The stage task `t` belongs to.
    pub fn stage(&self, t: TaskRef) -> &StageDef {
        &self.stages[t.stage as usize]
    }

    /// The place in [`FarmDef::stages`] of the stage called `name`, if any.
    pub fn stage_index(&self, name: &str) -> Option<u32> {
        self.stages
            .iter()
            .position(|s| s.name == name)
            .map(|i| i as u32)
    }

    /// The task's user-facing id, `<stage>/<index>`.
    pub fn task_name(&self, t: TaskRef) -> String {
        format!("{}/{}", self.stage(t).name, t.index)
    }

    /// The number of tasks over all stages.
    pub fn task_count(&self) -> u64 {
        self.stages.iter().map(|s| s.len() as u64).sum()
    }

    /// The sweep values of task `t`, by variable name.
    pub fn binding(&self, t: TaskRef) -> Vec<(String, String)> {
        let stage = self.stage(t);
        stage
            .sweep
            .vars
            .iter()
            .map(|v| v.name.clone())
            .zip(stage.sweep.binding(t.index))
            .collect()
    }

    /// Task `t` as the farm's home runs it, `{out}` being [`FarmDef::out`].
    pub fn expand(&self, t: TaskRef) -> TaskSpec {
        self.expand_in(t, &self.out)
    }

    /// The task as its content key sees it: `{out}` left as written, so the
    /// same work sent to another `--out` folder has the same key (what a task
    /// reads there is its dependencies' outputs, which the key covers by
    /// their own keys); and `{index}` left as written, so a task known by
    /// its values (see [`FarmDef::task_identity`]) is the same work at
    /// another index (a line deleted above it): what it reads at
    /// `{out}/<stage>/{index}` is its `after_each` pair's outputs, whose
    /// key the key covers, and its outputs move with it. A grown stage's
    /// tasks are known by index, which then counts.
    pub fn expand_for_key(&self, t: TaskRef) -> TaskSpec {
        let binding = self.stage(t).sweep.binding(t.index);
        let index = self.stage(t).sweep.grown().map(|_| t.index);
        self.expand_at(t, OUT_IN_KEY, &binding, index)
    }

    /// Task `t`'s own content key (see [`content_key`]), with the blake3 of
    /// each of its inputs given: what the node that runs it and a home
    /// looking for earlier results both make. A task with dependencies adds
    /// theirs ([`key_with_deps`]).
    pub fn own_key(&self, t: TaskRef, input_hashes: &[[u8; 32]]) -> [u8; 32] {
        content_key(
            &self.name,
            &self.task_identity(t),
            &self.expand_for_key(t),
            &self.stage(t).resources,
            input_hashes,
        )
    }

    /// What a task is, for its content key: its stage's name and its
    /// values, each with which repeat of that value it is (see
    /// [`graph::Ordinals`]), not its index or its stage's place in
    /// the file, as Snakemake keys a job on its wildcards. So a line
    /// inserted or deleted above it, or a stage moved or added, changes
    /// nothing of it; what uses `{index}` sees it in its command, which
    /// the key covers too. A grown stage's values are known only where it
    /// runs: its tasks are known by index.
    pub fn task_identity(&self, t: TaskRef) -> String {
        use std::fmt::Write as _;
        let stage = self.stage(t);
        let mut id = String::new();
        let mut part = |tag: &str, text: &str| {
            let _ = write!(id, "{tag}{}:{text};", text.len());
        };
        if let Some(key) = &stage.key {
            // Named by the farm itself: neither the stage's name nor the
            // names of its variables count, its command and inputs do.
            let binding = stage.sweep.binding(t.index);
            let cx = RenderCx {
                farm: &self.name,
                stage: &stage.name,
                out: "{out}",
                index: None,
                binding: &binding,
            };
            part("key", &key.render(&cx));
            return id;
        }
        part("stage", &stage.name);
        if stage.sweep.grown().is_some() {
            part("index", &t.index.to_string());
            return id;
        }
        let ordinals = self.graph.ordinals(self);
        for (v, (var, value)) in stage
            .sweep
            .vars
            .iter()
            .zip(stage.sweep.binding(t.index))
            .enumerate()
        {
            part("var", &var.name);
            part("value", &value);
            let at = stage.sweep.value_index(t.index, v);
            part("repeat", &ordinals.of(t.stage, v, at).to_string());
        }
        id
    }

    /// Task `t` with `{out}` standing for `out`: a node other than the
    /// farm's home runs it in a folder of its own, where it has put the
    /// outputs the task depends on.
    pub fn expand_in(&self, t: TaskRef, out: &str) -> TaskSpec {
        self.expand_bound(t, out, &self.stage(t).sweep.binding(t.index))
    }

    /// Task `t` of a grown stage with its line's text, `line`, read where
    /// it runs from the file of the task it grew from (see [`Grown`]).
    pub fn expand_line_in(&self, t: TaskRef, out: &str, line: &str) -> TaskSpec {
        let mut binding = self.stage(t).sweep.binding(t.index);
        if let Some(last) = binding.last_mut() {
            *last = line.to_string();
        }
        self.expand_bound(t, out, &binding)
    }

    /// Where task `t` of a grown stage finds its value: the task it grew
    /// from, the file (relative to that task's folder under `{out}`) and
    /// which line of it (from 0).
    pub fn grown_source(&self, t: TaskRef) -> Option<(TaskRef, &str, u32)> {
        let g = self.stage(t).sweep.grown()?;
        let up = TaskRef::new(g.from, t.index / g.per);
        Some((up, g.file.as_str(), t.index % g.per))
    }

    /// The file whose lines grow another stage from each task of stage
    /// `s`, and the most lines it may have (the loader makes every stage
    /// grown from `s` name the same file).
    pub fn grows(&self, s: u32) -> Option<(&str, u32)> {
        // The grown stages are listed once per generation: asked at every
        // task's end, going over every stage cost an open farm's size.
        self.graph
            .grown(self)
            .iter()
            .filter_map(|&g| self.stages[g as usize].sweep.grown())
            .filter(|g| g.from == s)
            .map(|g| (g.file.as_str(), g.per))
            .reduce(|a, b| (a.0, a.1.min(b.1)))
    }

    fn expand_bound(&self, t: TaskRef, out: &str, binding: &[String]) -> TaskSpec {
        self.expand_at(t, out, binding, Some(t.index))
    }

    fn expand_at(&self, t: TaskRef, out: &str, binding: &[String], index: Option<u32>) -> TaskSpec {
        let stage = self.stage(t);
        let cx = RenderCx {
            farm: &self.name,
            stage: &stage.name,
            out,
            index,
            binding,
        };
        let command = match &stage.command {
            CommandTemplate::Argv(args) => {
                Command::Argv(args.iter().map(|a| a.render(&cx)).collect())
            }
            CommandTemplate::Shell(s) => Command::Shell(s.render(&cx)),
            CommandTemplate::Python(args) => {
                Command::Python(args.iter().map(|a| a.render(&cx)).collect())
            }
        };
        TaskSpec {
            command,
            env: stage
                .env
                .iter()
                .map(|(k, v)| (k.clone(), v.render(&cx)))
                .collect(),
            workdir: stage.workdir.as_ref().map(|w| w.render(&cx)),
            inputs: stage.inputs.iter().map(|i| i.render(&cx)).collect(),
            outputs: stage.outputs.iter().map(|o| o.render(&cx)).collect(),
        }
    }
}

/// What `{out}` expands to in the spec a content key is made of.
const OUT_IN_KEY: &str = "{out}";

impl FarmDef {
    /// The `n`-th of the tasks `t` waits for: every task of each `after`
    /// stage, then task `t.index` of each `after_each` stage, then those of
    /// each keyed or listed dependency, in the order the farm names them;
    /// None past the last. Indexed rather than iterated, so a caller that
    /// waits for them can go on from where it was.
    pub fn dependency(&self, t: TaskRef, mut n: u64) -> Option<TaskRef> {
        let stage = self.stage(t);
        for &s in &stage.after {
            let len = u64::from(self.stages[s as usize].len());
            if n < len {
                return Some(TaskRef::new(s, n as u32));
            }
            n -= len;
        }
        if let Some(&s) = stage.after_each.get(usize::try_from(n).ok()?) {
            return Some(TaskRef::new(s, t.index));
        }
        n -= stage.after_each.len() as u64;
        for e in 0..stage.deps.len() {
            let (s, ups) = self.ups(t, e);
            if n < ups.len() as u64 {
                return Some(TaskRef::new(s, ups[n as usize]));
            }
            n -= ups.len() as u64;
        }
        None
    }
}

/// What a task's content key takes of the tasks it depends on: for each
/// `after` stage the digest of all its tasks' keys (`stage_digest`, which a
/// caller keeps once per stage), and for each `after_each` stage the key of
/// the task it pairs with (`key_of`). Their keys cover their own inputs and
/// dependencies in turn, so a change anywhere upstream changes the key of
/// every task downstream of it, and of no other.
pub fn deps_digest(
    def: &FarmDef,
    t: TaskRef,
    mut stage_digest: impl FnMut(u32) -> [u8; 32],
    mut key_of: impl FnMut(TaskRef) -> Option<[u8; 32]>,
) -> [u8; 32] {
    let stage = def.stage(t);
    let mut h = blake3::Hasher::new();
    // Stages by name, not by their place in the file: a stage moved or
    // added above changes no key. A stage whose tasks are named by their
    // own `key` (see `StageDef::key`) is not named by its stage: which
    // growth made a dependency changes nothing of what depends on it.
    let name = |h: &mut blake3::Hasher, s: u32| {
        let st = &def.stages[s as usize];
        let n = if st.key.is_some() {
            &b"{key}"[..]
        } else {
            st.name.as_bytes()
        };
        h.update(&(n.len() as u64).to_le_bytes());
        h.update(n);
    };
    for &s in &stage.after {
        h.update(b"after");
        name(&mut h, s);
        h.update(&stage_digest(s));
    }
    for &s in &stage.after_each {
        h.update(b"each");
        name(&mut h, s);
        // A dependency done with no key of its own (known done from elsewhere)
        // counts as such, not as any particular result.
        h.update(&key_of(TaskRef::new(s, t.index)).unwrap_or([0; 32]));
    }
    for e in 0..stage.deps.len() {
        let (s, ups) = def.ups(t, e);
        h.update(b"by");
        name(&mut h, s);
        h.update(&(ups.len() as u64).to_le_bytes());
        for &j in ups {
            h.update(&key_of(TaskRef::new(s, j)).unwrap_or([0; 32]));
        }
    }
    *h.finalize().as_bytes()
}

/// The key of a task whose own key (see [`content_key`]) is `own` and which
/// depends on what `deps` digests (see [`deps_digest`]). Made apart from the
/// task's own key because in a mesh the node that runs a task makes the one
/// and the coordinator, which knows the keys of what it depends on, the other.
pub fn key_with_deps(own: &[u8; 32], deps: &[u8; 32]) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    h.update(b"with deps");
    h.update(own);
    h.update(deps);
    *h.finalize().as_bytes()
}

/// True when tasks of stage `s` depend on others, and so have a key made by [`key_with_deps`].
pub fn has_deps(def: &FarmDef, s: u32) -> bool {
    def.stages[s as usize].upstream().next().is_some()
}

/// True when tasks of stage `s` depend on tasks that leave outputs, which
/// they read from the farm's home (`{out}`): in a mesh they run there, once
/// those outputs are (see `Coord::assign`).
pub fn reads_outputs(def: &FarmDef, s: u32) -> bool {
    let st = &def.stages[s as usize];
    st.upstream()
        .any(|d| !def.stages[d as usize].outputs.is_empty())
}

/// The digest of every task's key of stage `s`, in index order (see [`deps_digest`]).
pub fn stage_digest(
    def: &FarmDef,
    s: u32,
    mut key_of: impl FnMut(TaskRef) -> Option<[u8; 32]>,
) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    for i in 0..def.stages[s as usize].len() {
        h.update(&key_of(TaskRef::new(s, i)).unwrap_or([0; 32]));
    }
    *h.finalize().as_bytes()
}

/// A task's content key: blake3 over everything the task can observe: its
/// identity (the farm's name, which it sees as MESH_FARM, and what
/// [`FarmDef::task_identity`] says: its stage and values), expanded command (with `{out}` as written: see
/// [`FarmDef::expand_for_key`]), environment, workdir, resources and the
/// contents of its inputs (given as their blake3 hashes, in the order of
/// `spec.inputs`). What it depends on is added by [`key_with_deps`]. Equal
/// keys mean the same work with the same results; two tasks of a sweep never
/// share one, even with equal commands.
pub fn content_key(
    farm: &str,
    identity: &str,
    spec: &TaskSpec,
    resources: &Resources,
    input_hashes: &[[u8; 32]],
) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    let mut field = |tag: &[u8], bytes: &[u8]| {
        // Length-prefixed so that no two different tasks hash the same bytes.
        h.update(tag);
        h.update(&(bytes.len() as u64).to_le_bytes());
        h.update(bytes);
    };
    field(b"farm", farm.as_bytes());
    field(b"task", identity.as_bytes());
    if let Some(w) = &spec.workdir {
        field(b"wd", w.as_bytes());
    }
    match &spec.command {
        Command::Argv(args) => {
            for a in args {
                field(b"arg", a.as_bytes());
            }
        }
        Command::Shell(s) => field(b"sh", s.as_bytes()),
        // The interpreter is where it is on each machine: the script, its
        // arguments and its inputs are what the result is of.
        Command::Python(args) => {
            for a in args.iter().skip(1) {
                field(b"py", a.as_bytes());
            }
        }
    }
    let mut env: Vec<_> = spec.env.iter().collect();
    env.sort();
    for (k, v) in env {
        field(b"envk", k.as_bytes());
        field(b"envv", v.as_bytes());
    }
    for (k, v) in resources.iter() {
        field(b"res", k.as_bytes());
        field(b"amt", &v.0.to_le_bytes());
    }
    for (path, hash) in spec.inputs.iter().zip(input_hashes) {
        field(b"inp", path.as_bytes());
        field(b"inh", hash);
    }
    for o in &spec.outputs {
        field(b"out", o.as_bytes());
    }
    *h.finalize().as_bytes()
}

/// True when a relative path (after expansion) stays inside its base folder:
/// not absolute, and no `..` component.
pub fn path_stays_inside(path: &str) -> bool {
    !path.starts_with('/') && !path.split('/').any(|c| c == "..")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn list(vals: &[&str]) -> Values {
        Values::List(vals.iter().map(|s| s.to_string()).collect())
    }

    fn sweep(mode: SweepMode, vars: Vec<Values>) -> Sweep {
        Sweep {
            vars: vars
                .into_iter()
                .enumerate()
                .map(|(i, values)| SweepVar {
                    name: format!("v{i}"),
                    values,
                })
                .collect(),
            mode,
        }
    }

    #[test]
    fn a_stage_with_a_key_names_its_tasks_by_it_not_by_its_name() {
        let farm = |stage: &str, var: &str, key: Option<&str>| {
            let mut st = StageDef::new(
                stage,
                CommandTemplate::Argv(vec![Template::literal("true")]),
                Sweep {
                    vars: vec![SweepVar {
                        name: var.into(),
                        values: list(&["call-1a2b"]),
                    }],
                    mode: SweepMode::Product,
                },
            );
            st.key = key.map(|k| Template::parse(k, &[var]).expect("a template"));
            FarmDef {
                name: "python".into(),
                root: "/".into(),
                out: "/out".into(),
                stages: vec![Arc::new(st)].into(),
                graph: Default::default(),
            }
        };
        let t = TaskRef::new(0, 0);
        let key = |f: FarmDef| f.own_key(t, &[]);
        // Made in two growths: the same call, the same key.
        assert_eq!(
            key(farm("f3-0", "id", Some("{id}"))),
            key(farm("f7-1", "id", Some("{id}")))
        );
        // Without it, a stage's name is part of its tasks' keys.
        assert_ne!(key(farm("f3-0", "id", None)), key(farm("f7-1", "id", None)));
        // Another value, another key.
        assert_ne!(
            key(farm("f3-0", "id", Some("{id}"))),
            key(farm("f3-0", "id", Some("{id}-2")))
        );
    }

    #[test]
    fn a_stage_list_starts_another_it_grew_into_or_equal_to_it_by_value() {
        let stage = |n: usize| {
            Arc::new(StageDef::new(
                &format!("c{n}"),
                CommandTemplate::Argv(vec![Template::literal("true")]),
                Sweep::range("i", 1 + n as u64 % 3),
            ))
        };
        // Generations of an open farm, each built on the one before: every
        // length around the persistent vector's chunk edges.
        let mut gens: Vec<Stages> = vec![Stages::new()];
        for n in 0..300 {
            let mut next = gens[n].clone();
            next.push_back(stage(n));
            gens.push(next);
        }
        for (a, b) in [
            (0, 5),
            (63, 64),
            (64, 65),
            (100, 300),
            (299, 300),
            (300, 300),
        ] {
            assert!(stages_start(&gens[a], &gens[b]), "{a} starts {b}");
            assert_eq!(stages_start(&gens[b], &gens[a]), a == b, "{b} starts {a}");
        }
        // A copy from elsewhere (its own handles) compares by value.
        let copy: Stages = (0..200).map(stage).collect();
        assert!(stages_start(&copy, &gens[300]));
        assert!(stages_start(&gens[150], &copy));
        // One stage unlike: a farm that is not this one's later generation.
        let mut other = gens[250].clone();
        other.set(70, stage(71));
        assert!(!stages_start(&other, &gens[300]));
        assert!(!stages_start(&gens[100], &other));
        assert!(stages_start(&gens[70], &other));
    }

    #[test]
    fn product_first_variable_varies_slowest() {
        let s = sweep(
            SweepMode::Product,
            vec![list(&["a", "b"]), list(&["1", "2", "3"])],
        );
        assert_eq!(s.len(), 6);
        let all: Vec<_> = (0..6).map(|i| s.binding(i).join("")).collect();
        assert_eq!(all, ["a1", "a2", "a3", "b1", "b2", "b3"]);
    }

    #[test]
    fn ranges_are_inclusive_with_steps_and_decimals() {
        // 1..100 is 100 values; 0..100:10 is 11; 0.0..1.0:0.25 is 5.
        let r = Values::Range {
            start: 0,
            step: 25,
            count: 5,
            decimals: 2,
        };
        let v: Vec<_> = (0..5).map(|i| r.get(i)).collect();
        assert_eq!(v, ["0.00", "0.25", "0.50", "0.75", "1.00"]);
        let neg = Values::Range {
            start: -15,
            step: 10,
            count: 3,
            decimals: 1,
        };
        assert_eq!(neg.get(0), "-1.5");
        assert_eq!(neg.get(1), "-0.5");
        assert_eq!(neg.get(2), "0.5");
    }

    #[test]
    fn lines_skip_blanks_and_trim() {
        let v = Values::lines("a b\r\n\n  c\n\n");
        assert_eq!(v.len(), 2);
        assert_eq!(v.get(0), "a b");
        assert_eq!(v.get(1), "c");
    }

    #[test]
    fn templates_parse_and_render() {
        let t = Template::parse("runs/{stage}/{index}/{x}-{{lit}}", &["x"]).unwrap();
        let b = vec!["7".to_string()];
        let cx = RenderCx {
            farm: "f",
            stage: "solve",
            out: "/o",
            index: Some(3),
            binding: &b,
        };
        assert_eq!(t.render(&cx), "runs/solve/3/7-{lit}");
        assert!(matches!(
            Template::parse("{y}", &["x"]),
            Err(TemplateError::Unknown { .. })
        ));
        let e = Template::parse("awk '{print $1}' {x}", &["x"]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "unknown placeholder `{print $1}` (known here: index, stage, farm, out, x); \
             if the braces are meant literally, write `{{print $1}}`"
        );
        // The escape it suggests gives the braces to the command.
        let t = Template::parse("awk '{{print $1}}' {x}", &["x"]).unwrap();
        assert_eq!(t.render(&cx), "awk '{print $1}' 7");
        assert_eq!(Template::parse("{x", &["x"]), Err(TemplateError::Unclosed));
        assert_eq!(Template::parse("x}", &["x"]), Err(TemplateError::Stray));
    }

    #[test]
    fn path_escapes_are_seen() {
        assert!(path_stays_inside("runs/a/b"));
        assert!(path_stays_inside("a..b/c"));
        assert!(!path_stays_inside("../x"));
        assert!(!path_stays_inside("a/../../x"));
        assert!(!path_stays_inside("/etc/passwd"));
    }

    fn values_strategy() -> impl Strategy<Value = Values> {
        prop_oneof![
            proptest::collection::vec("[a-z0-9]{0,4}", 1..5).prop_map(Values::List),
            (-50i64..50, 1i64..7, 1u64..6, 0u32..3).prop_map(|(start, step, count, decimals)| {
                Values::Range {
                    start,
                    step,
                    count,
                    decimals,
                }
            }),
        ]
    }

    proptest! {
        /// A product sweep visits every combination exactly once, in the
        /// order of nested loops over the variables as declared.
        #[test]
        fn product_is_nested_loops(vars in proptest::collection::vec(values_strategy(), 0..4)) {
            let s = sweep(SweepMode::Product, vars.clone());
            let mut expected: Vec<Vec<String>> = vec![vec![]];
            for v in &vars {
                let mut next = Vec::new();
                for prefix in &expected {
                    for i in 0..v.len() {
                        let mut p = prefix.clone();
                        p.push(v.get(i));
                        next.push(p);
                    }
                }
                expected = next;
            }
            prop_assert_eq!(s.len(), expected.len() as u64);
            for (i, want) in expected.iter().enumerate() {
                prop_assert_eq!(&s.binding(i as u32), want);
            }
        }

        /// A zip sweep pairs the i-th values.
        #[test]
        fn zip_pairs_positions(n in 1usize..6, k in 1usize..4) {
            let vars: Vec<Values> = (0..k)
                .map(|j| Values::List((0..n).map(|i| format!("{j}:{i}")).collect()))
                .collect();
            let s = sweep(SweepMode::Zip, vars);
            prop_assert_eq!(s.len(), n as u64);
            for i in 0..n {
                let want: Vec<String> = (0..k).map(|j| format!("{j}:{i}")).collect();
                prop_assert_eq!(s.binding(i as u32), want);
            }
        }

        /// Range values are start + i*step, exactly, at any scale.
        #[test]
        fn range_values_are_exact(start in -1000i64..1000, step in 1i64..100, count in 1u64..50, decimals in 0u32..4) {
            let r = Values::Range { start, step, count, decimals };
            for i in 0..count {
                let v = r.get(i);
                let scale = 10f64.powi(decimals as i32);
                let parsed: f64 = v.parse().unwrap();
                let want = (start + step * i as i64) as f64 / scale;
                prop_assert!((parsed - want).abs() < 1e-9, "{} vs {}", v, want);
            }
        }

        /// Distinct commands give distinct keys; the same command the same key.
        #[test]
        fn content_keys_separate_tasks(a in proptest::collection::vec("[a-c]{0,3}", 0..4), b in proptest::collection::vec("[a-c]{0,3}", 0..4)) {
            let spec = |args: &Vec<String>| TaskSpec {
                command: Command::Argv(args.clone()),
                env: vec![], workdir: None, inputs: vec![], outputs: vec![],
            };
            let r = Resources::new();
            let ka = content_key("f", "s/0", &spec(&a), &r, &[]);
            let kb = content_key("f", "s/0", &spec(&b), &r, &[]);
            prop_assert_eq!(ka == kb, a == b);
            // The same command as another task of the sweep is still other work.
            prop_assert_ne!(ka, content_key("f", "s/1", &spec(&a), &r, &[]));
        }
    }
}
