//! `mesh import`: writes a runnable farm folder from a recorded workflow (a WfCommons trace), so mesh is tried on real workflows' graphs, runtimes and data.
//!
//! The farm is checked before it is put in place: it is loaded with the
//! same loader `mesh run` uses, and every task's dependencies are compared
//! with its parents in the trace. Bad input writes nothing.

pub(crate) mod plan;
pub(crate) mod wfformat;

#[cfg(test)]
mod tests;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use mesh_node::farmfile::{self, LoadOptions};
use mesh_protocol::farm::{FarmDef, TaskRef};
use serde_json::json;

use crate::args;
use crate::out::outln;
use plan::{Form, Plan, Scale, INPUTS_DIR, NONE_INPUT};
use wfformat::Trace;

#[derive(clap::Subcommand)]
pub enum ImportFrom {
    /// A WfCommons trace (WfFormat schema 1.4, 1.5 or 1.6): a stage per kind of
    /// task, each task sleeping its recorded runtime and reading and writing
    /// files of the recorded sizes, with the trace's exact dependencies.
    Wfformat(WfArgs),
}

#[derive(clap::Args)]
pub struct WfArgs {
    /// The trace (JSON).
    #[arg(value_parser = args::path)]
    trace: PathBuf,
    /// The farm folder to write (default ./<trace file name without .json>): a new or empty one.
    #[arg(short = 'o', long = "out", value_name = "DIR", value_parser = args::path)]
    dir: Option<PathBuf>,
    /// Each task sleeps its recorded runtime times this.
    #[arg(long, value_name = "S", default_value_t = 1.0, value_parser = scale)]
    time_scale: f64,
    /// Each file is written at its recorded size times this.
    #[arg(long, value_name = "Z", default_value_t = 1.0, value_parser = scale)]
    size_scale: f64,
    /// Print what was written as JSON.
    #[arg(long)]
    json: bool,
}

fn scale(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err(format!(
            "expected a number zero or more, e.g. 0.01 or 1e-6, got `{s}`"
        )),
    }
}

pub fn import(from: &ImportFrom) -> Result<ExitCode> {
    match from {
        ImportFrom::Wfformat(a) => wfformat_cmd(a),
    }
}

fn wfformat_cmd(a: &WfArgs) -> Result<ExitCode> {
    let trace = wfformat::read(&a.trace)?;
    let stem = a
        .trace
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "trace".into());
    let dir = a.dir.clone().unwrap_or_else(|| PathBuf::from(&stem));
    let scale = Scale {
        time: a.time_scale,
        size: a.size_scale,
    };
    let plan = Plan::new(&trace);
    let name = farm_name(&stem);
    let source = a
        .trace
        .file_name()
        .map_or_else(|| stem.clone(), |f| f.to_string_lossy().into_owned());
    let toml = plan.farm_toml(&trace, &name, &source, scale);
    write_folder(&dir, &plan, &toml, scale, |farm| {
        let def = farmfile::load(farm, &LoadOptions::default())
            .context("the farm written does not load (a bug in mesh import)")?;
        verify(&def, &trace, &plan)
            .context("the farm written does not match the trace (a bug in mesh import)")
    })?;
    let report = Report {
        trace: &trace,
        plan: &plan,
        scale,
        dir: &dir,
        source: &a.trace,
    };
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&report.json())?);
    } else {
        report.print();
    }
    Ok(ExitCode::SUCCESS)
}

/// A farm name from the trace's file name: letters, digits, `_`, `.`, `-`.
pub(crate) fn farm_name(stem: &str) -> String {
    plan::safe_name(stem).replace('+', "_")
}

/// Writes the farm into a folder beside `dir`, lets `check` load it, and
/// only then puts it in place: a farm that fails leaves nothing behind.
fn write_folder(
    dir: &Path,
    plan: &Plan,
    toml: &str,
    scale: Scale,
    check: impl FnOnce(&Path) -> Result<()>,
) -> Result<()> {
    if let Ok(mut entries) = fs::read_dir(dir) {
        if entries.next().is_some() {
            bail!(
                "{} already exists and is not empty: remove it, or give another folder with -o",
                dir.display()
            );
        }
    } else if dir.exists() {
        bail!("{} exists and is not a folder", dir.display());
    }
    let parent = match dir.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    fs::create_dir_all(&parent).with_context(|| format!("cannot create {}", parent.display()))?;
    let base = dir
        .file_name()
        .map_or_else(|| "farm".into(), |n| n.to_string_lossy().into_owned());
    let tmp = parent.join(format!(".{base}.importing-{}", std::process::id()));
    let _ = fs::remove_dir_all(&tmp);
    let made = (|| -> Result<()> {
        fs::create_dir_all(&tmp).with_context(|| format!("cannot create {}", tmp.display()))?;
        let mut files: Vec<(String, u64)> = plan.input_files().to_vec();
        if plan.needs_none_input() {
            files.push((NONE_INPUT.to_string(), 0));
        }
        for (rel, size) in files {
            let p = tmp.join(INPUTS_DIR).join(&rel);
            if let Some(d) = p.parent() {
                fs::create_dir_all(d).with_context(|| format!("cannot create {}", d.display()))?;
            }
            // Sparse: a file of a few gigabytes costs no disk until read.
            let f =
                fs::File::create(&p).with_context(|| format!("cannot write {}", p.display()))?;
            f.set_len(scale.bytes(size))
                .with_context(|| format!("cannot write {}", p.display()))?;
        }
        let farm = tmp.join("farm.toml");
        mesh_node::state::write_atomic(&farm, |w| std::io::Write::write_all(w, toml.as_bytes()))
            .with_context(|| format!("cannot write {}", farm.display()))?;
        check(&farm)?;
        if dir.exists() {
            fs::remove_dir(dir).with_context(|| format!("cannot replace {}", dir.display()))?;
        }
        fs::rename(&tmp, dir).with_context(|| format!("cannot move the farm to {}", dir.display()))
    })();
    if made.is_err() {
        let _ = fs::remove_dir_all(&tmp);
    }
    made
}

/// Every task of the loaded farm is the trace's task the plan put there
/// (by its `id`), and waits for exactly that task's parents.
pub(crate) fn verify(def: &FarmDef, trace: &Trace, plan: &Plan) -> Result<()> {
    if def.stages.len() != plan.stages.len() {
        bail!("{} stages, {} planned", def.stages.len(), plan.stages.len());
    }
    for (s, (stage, want)) in def.stages.iter().zip(&plan.stages).enumerate() {
        if stage.len() as usize != want.tasks.len() {
            bail!(
                "stage `{}` has {} tasks, {} planned",
                stage.name,
                stage.len(),
                want.tasks.len()
            );
        }
        for (i, &t) in want.tasks.iter().enumerate() {
            let at = TaskRef::new(s as u32, i as u32);
            let id = stage
                .sweep
                .binding(i as u32)
                .into_iter()
                .next()
                .unwrap_or_default();
            if id != trace.tasks[t].id {
                bail!(
                    "{} is `{id}`, not `{}`",
                    def.task_name(at),
                    trace.tasks[t].id
                );
            }
            let mut got: Vec<TaskRef> = (0..).map_while(|n| def.dependency(at, n)).collect();
            got.sort_unstable();
            let mut wanted: Vec<TaskRef> = trace.tasks[t]
                .parents
                .iter()
                .map(|&p| {
                    let (s, i) = plan.place[p];
                    TaskRef::new(s as u32, i)
                })
                .collect();
            wanted.sort_unstable();
            if got != wanted {
                let names = |v: &[TaskRef]| {
                    v.iter()
                        .map(|r| def.task_name(*r))
                        .collect::<Vec<_>>()
                        .join(", ")
                };
                bail!(
                    "{} (`{}`) waits for [{}], its parents are [{}]",
                    def.task_name(at),
                    trace.tasks[t].id,
                    names(&got),
                    names(&wanted)
                );
            }
        }
    }
    Ok(())
}

/// What an import wrote, said to people or as JSON.
struct Report<'a> {
    trace: &'a Trace,
    plan: &'a Plan,
    scale: Scale,
    dir: &'a Path,
    source: &'a Path,
}

impl Report<'_> {
    /// Per form: dependencies written that way, and their edges.
    fn forms(&self) -> [(&'static str, usize, usize); 4] {
        let mut out = [
            ("after", 0, 0),
            ("after_each", 0, 0),
            ("keyed", 0, 0),
            ("listed", 0, 0),
        ];
        for d in self.plan.stages.iter().flat_map(|s| &s.deps) {
            let k = match d.form {
                Form::Whole => 0,
                Form::Each => 1,
                Form::Keyed { .. } => 2,
                Form::Listed => 3,
            };
            out[k].1 += 1;
            out[k].2 += d.edges;
        }
        out
    }

    /// What is worth knowing about how the farm differs from the trace.
    fn notes(&self) -> Vec<String> {
        let mut notes = Vec::new();
        for s in self.plan.stages.iter().filter(|s| s.cpu_widened) {
            notes.push(format!(
                "stage `{}`: its tasks recorded different core counts; each asks for the most, {}",
                s.name, s.cpu
            ));
        }
        let untimed = self.trace.tasks.iter().filter(|t| !t.timed).count();
        if untimed > 0 {
            notes.push(format!(
                "{untimed} tasks have no recorded runtime: they sleep 0 s"
            ));
        }
        let no_size = self.trace.files.iter().filter(|f| !f.sized).count();
        if no_size > 0 {
            notes.push(format!(
                "{no_size} files have no recorded size: they are written empty"
            ));
        }
        if self.plan.inputs_not_from_parents > 0 {
            notes.push(format!(
                "{} inputs are made by a task that is not a parent of the task reading them: it reads them from {INPUTS_DIR}/ instead",
                self.plan.inputs_not_from_parents
            ));
        }
        notes
    }

    fn inputs_bytes(&self) -> (u64, u64) {
        let files = self.plan.input_files();
        (
            files.iter().map(|(_, b)| b).sum(),
            files.iter().map(|(_, b)| self.scale.bytes(*b)).sum(),
        )
    }

    fn json(&self) -> serde_json::Value {
        let (recorded, written) = self.inputs_bytes();
        let runtime: f64 = self.trace.tasks.iter().map(|t| t.runtime_s).sum();
        let cp = plan::critical_path(self.trace);
        let forms: serde_json::Map<String, serde_json::Value> = self
            .forms()
            .iter()
            .map(|(f, deps, edges)| (f.to_string(), json!({"deps": deps, "edges": edges})))
            .collect();
        let stages: Vec<serde_json::Value> = self
            .plan
            .stages
            .iter()
            .map(|s| {
                json!({
                    "name": s.name,
                    "kind": s.kind,
                    "tasks": s.tasks.len(),
                    "cpu": s.cpu,
                    "mem_bytes": s.mem_bytes,
                    "after": s.deps.iter().map(|d| json!({
                        "stage": self.plan.stages[d.up].name,
                        "form": d.form.word(),
                        "edges": d.edges,
                    })).collect::<Vec<_>>(),
                })
            })
            .collect();
        json!({
            "trace": self.source.display().to_string(),
            "name": self.trace.name,
            "schema": self.trace.schema,
            "system": self.trace.system,
            "dir": self.dir.display().to_string(),
            "farm": self.dir.join("farm.toml").display().to_string(),
            "tasks": self.plan.tasks(),
            "edges": self.plan.edges(),
            "trace_tasks": self.trace.tasks.len(),
            "trace_edges": self.trace.edges(),
            "forms": forms,
            "widened": [],
            "stages": stages,
            "time_scale": self.scale.time,
            "size_scale": self.scale.size,
            "runtime_s": {"recorded": runtime, "scaled": runtime * self.scale.time},
            "critical_path_s": {"recorded": cp, "scaled": cp * self.scale.time},
            "inputs": {
                "files": self.plan.input_files().len(),
                "recorded_bytes": recorded,
                "bytes": written,
            },
            "notes": self.notes(),
        })
    }

    fn print(&self) {
        let t = self.trace;
        let system = t
            .system
            .as_deref()
            .map(|s| format!(", {s}"))
            .unwrap_or_default();
        outln!(
            "imported {} (WfFormat {}{system}) into {}",
            self.source.display(),
            t.schema,
            self.dir.display()
        );
        outln!(
            "  {} tasks and {} edges, as in the trace, in {} stages",
            self.plan.tasks(),
            self.plan.edges(),
            self.plan.stages.len()
        );
        let forms: Vec<String> = self
            .forms()
            .iter()
            .map(|(f, _, edges)| format!("{edges} {f}"))
            .collect();
        outln!("  edges by form: {}; none widened", forms.join(", "));
        let width = self
            .plan
            .stages
            .iter()
            .map(|s| s.name.len())
            .max()
            .unwrap_or(5)
            .max(5);
        outln!("  {:<width$}  {:>5}  waits for", "stage", "tasks");
        for s in &self.plan.stages {
            let waits: Vec<String> = s
                .deps
                .iter()
                .map(|d| {
                    format!(
                        "{} ({}, {} edges)",
                        self.plan.stages[d.up].name,
                        d.form.word(),
                        d.edges
                    )
                })
                .collect();
            outln!(
                "  {:<width$}  {:>5}  {}",
                s.name,
                s.tasks.len(),
                waits.join(", ")
            );
        }
        let (recorded, written) = self.inputs_bytes();
        let bytes = mesh_node::view::bytes;
        outln!(
            "  {} files no task makes, in {INPUTS_DIR}/: {} recorded, x {} = {}",
            self.plan.input_files().len(),
            bytes(recorded),
            self.scale.size,
            bytes(written)
        );
        let runtime: f64 = t.tasks.iter().map(|t| t.runtime_s).sum();
        let cp = plan::critical_path(t);
        outln!(
            "  runtimes: {runtime:.0} s in all, critical path {cp:.1} s; x {} = {:.2} s and {:.2} s",
            self.scale.time,
            runtime * self.scale.time,
            cp * self.scale.time
        );
        for n in self.notes() {
            outln!("  note: {n}");
        }
        outln!(
            "run it with: mesh run {}",
            self.dir.join("farm.toml").display()
        );
    }
}
