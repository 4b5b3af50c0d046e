//! Reads a WfCommons trace (WfFormat schema 1.4, 1.5 and 1.6) into a [`Trace`]: its tasks with their parents, runtimes, cores, memory and files, checked (every parent a task, no cycle, nothing negative).
//!
//! Schema 1.5 splits a trace in two, joined on the task `id`:
//! `workflow.specification` (the graph, and the files by id) and
//! `workflow.execution` (what each task took). 1.4 and before keep it all
//! under `workflow.tasks` (`workflow.jobs` before 1.3), name parents by task
//! `name`, and list each task's files with `link = "input" | "output"`.
//! 1.6 only adds optional fields to 1.5 (WfFormat's own migration script
//! changes nothing but the version), so it is read as 1.5.

use std::collections::HashMap;
use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use serde::Deserialize;

/// A workflow as recorded: tasks in the trace's order, parents by position.
#[derive(Debug)]
pub struct Trace {
    /// The trace's own `name`.
    pub name: String,
    pub schema: String,
    /// The workflow system that ran it (`runtimeSystem.name`, `wms.name`).
    pub system: Option<String>,
    pub tasks: Vec<Task>,
    pub files: Vec<File>,
}

#[derive(Debug)]
pub struct Task {
    pub id: String,
    pub name: String,
    /// The kind of task when the trace says it (`category`, 1.4 and some generators).
    pub category: Option<String>,
    /// `command.program`.
    pub program: Option<String>,
    /// Positions in [`Trace::tasks`], sorted, each once.
    pub parents: Vec<usize>,
    pub runtime_s: f64,
    /// Whether the trace recorded a runtime (a 1.5 trace may leave out `execution`).
    pub timed: bool,
    pub cores: Option<f64>,
    pub mem_bytes: Option<u64>,
    /// Positions in [`Trace::files`].
    pub inputs: Vec<usize>,
    pub outputs: Vec<usize>,
}

#[derive(Debug)]
pub struct File {
    pub id: String,
    pub size: u64,
    /// Whether the trace gave its size.
    pub sized: bool,
}

impl Trace {
    /// The trace's edges: one per (task, parent).
    pub fn edges(&self) -> usize {
        self.tasks.iter().map(|t| t.parents.len()).sum()
    }
}

/// Reads and checks the trace at `path`.
pub fn read(path: &Path) -> Result<Trace> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    parse(&text).with_context(|| path.display().to_string())
}

#[derive(Deserialize)]
struct Head {
    #[serde(rename = "schemaVersion")]
    schema_version: Option<serde_json::Value>,
}

/// Reads and checks a trace given as text.
pub fn parse(text: &str) -> Result<Trace> {
    let head: Head = serde_json::from_str(text).map_err(|e| {
        if e.is_data() {
            anyhow!("not a WfFormat trace (expected a JSON object with `schemaVersion`): {e}")
        } else {
            anyhow!("not JSON: {e}")
        }
    })?;
    let version = match head.schema_version {
        Some(serde_json::Value::String(v)) => v,
        Some(other) => {
            bail!("field `schemaVersion`: expected a string such as \"1.5\", got {other}")
        }
        None => {
            bail!("no `schemaVersion`: not a WfFormat trace (mesh reads schema 1.4, 1.5 and 1.6)")
        }
    };
    let bad = |e: serde_json::Error| anyhow!("not a WfFormat {version} trace: {e}");
    let trace = match version.as_str() {
        "1.5" | "1.6" => from_15(serde_json::from_str(text).map_err(bad)?, &version)?,
        "1.4" => from_14(serde_json::from_str(text).map_err(bad)?, &version)?,
        other => bail!(
            "field `schemaVersion`: unknown version `{other}` (mesh reads WfFormat 1.4, 1.5 and 1.6; WfFormat's wfcommons-migrate-instance.py brings older traces to 1.5)"
        ),
    };
    check_acyclic(&trace)?;
    Ok(trace)
}

#[derive(Deserialize)]
struct Doc15 {
    name: String,
    #[serde(rename = "runtimeSystem")]
    runtime_system: Option<System>,
    workflow: Workflow15,
}

#[derive(Deserialize)]
struct System {
    name: Option<String>,
}

#[derive(Deserialize)]
struct Workflow15 {
    specification: Spec15,
    execution: Option<Exec15>,
}

#[derive(Deserialize)]
struct Spec15 {
    tasks: Vec<SpecTask>,
    #[serde(default)]
    files: Vec<SpecFile>,
}

#[derive(Deserialize)]
struct SpecTask {
    name: String,
    id: String,
    category: Option<String>,
    #[serde(default)]
    parents: Vec<String>,
    #[serde(default)]
    children: Vec<String>,
    #[serde(default, rename = "inputFiles")]
    input_files: Vec<String>,
    #[serde(default, rename = "outputFiles")]
    output_files: Vec<String>,
}

#[derive(Deserialize)]
struct SpecFile {
    id: String,
    #[serde(rename = "sizeInBytes")]
    size: Option<f64>,
}

#[derive(Deserialize)]
struct Exec15 {
    #[serde(default)]
    tasks: Vec<ExecTask>,
}

#[derive(Deserialize)]
struct ExecTask {
    id: String,
    #[serde(rename = "runtimeInSeconds")]
    runtime: Option<f64>,
    command: Option<Command>,
    #[serde(rename = "coreCount")]
    cores: Option<f64>,
    #[serde(rename = "memoryInBytes")]
    mem: Option<f64>,
}

#[derive(Deserialize)]
struct Command {
    program: Option<String>,
}

/// Files by id, each once, in the order first met.
#[derive(Default)]
struct Files {
    list: Vec<File>,
    by_id: HashMap<String, usize>,
}

impl Files {
    fn add(&mut self, id: &str, size: Option<f64>, owner: &str) -> Result<usize> {
        let size = match size {
            Some(s) if s < 0.0 => {
                bail!("{owner}, field `sizeInBytes`: {s} is negative")
            }
            s => s,
        };
        if let Some(&i) = self.by_id.get(id) {
            let f = &mut self.list[i];
            if !f.sized {
                if let Some(s) = size {
                    f.size = s.round() as u64;
                    f.sized = true;
                }
            }
            return Ok(i);
        }
        self.by_id.insert(id.to_string(), self.list.len());
        self.list.push(File {
            id: id.to_string(),
            size: size.map(|s| s.round() as u64).unwrap_or(0),
            sized: size.is_some(),
        });
        Ok(self.list.len() - 1)
    }
}

fn from_15(doc: Doc15, version: &str) -> Result<Trace> {
    let spec = doc.workflow.specification;
    let mut files = Files::default();
    for f in &spec.files {
        files.add(&f.id, f.size, &format!("file `{}`", f.id))?;
    }
    let mut by_id: HashMap<&str, usize> = HashMap::with_capacity(spec.tasks.len());
    for (i, t) in spec.tasks.iter().enumerate() {
        if by_id.insert(t.id.as_str(), i).is_some() {
            bail!("task `{}`, field `id`: two tasks have this id", t.id);
        }
    }
    let mut exec: HashMap<&str, &ExecTask> = HashMap::new();
    if let Some(e) = &doc.workflow.execution {
        for t in &e.tasks {
            if !by_id.contains_key(t.id.as_str()) {
                bail!(
                    "workflow.execution.tasks: task `{}` is not one of workflow.specification.tasks",
                    t.id
                );
            }
            if exec.insert(t.id.as_str(), t).is_some() {
                bail!("workflow.execution.tasks: task `{}` is there twice", t.id);
            }
        }
    }
    let mut parents: Vec<Vec<usize>> = vec![Vec::new(); spec.tasks.len()];
    for (i, t) in spec.tasks.iter().enumerate() {
        for p in &t.parents {
            let Some(&j) = by_id.get(p.as_str()) else {
                bail!(
                    "task `{}`, field `parents`: `{p}` is no task of the trace",
                    t.id
                );
            };
            parents[i].push(j);
        }
        // A trace lists each edge at both ends; a child named only by its
        // parent is still an edge (WfFormat's migration script unites them).
        for c in &t.children {
            let Some(&j) = by_id.get(c.as_str()) else {
                bail!(
                    "task `{}`, field `children`: `{c}` is no task of the trace",
                    t.id
                );
            };
            parents[j].push(i);
        }
    }
    let mut tasks = Vec::with_capacity(spec.tasks.len());
    for (t, mut ps) in spec.tasks.into_iter().zip(parents) {
        ps.sort_unstable();
        ps.dedup();
        let e = exec.get(t.id.as_str());
        let owner = format!("task `{}`", t.id);
        let runtime = e.and_then(|e| e.runtime);
        let mut inputs = Vec::with_capacity(t.input_files.len());
        for f in &t.input_files {
            inputs.push(files.add(f, None, &owner)?);
        }
        let mut outputs = Vec::with_capacity(t.output_files.len());
        for f in &t.output_files {
            outputs.push(files.add(f, None, &owner)?);
        }
        tasks.push(Task {
            runtime_s: runtime_of(&owner, runtime)?,
            timed: runtime.is_some(),
            cores: cores_of(&owner, e.and_then(|e| e.cores))?,
            mem_bytes: mem_of(&owner, e.and_then(|e| e.mem))?,
            program: e.and_then(|e| e.command.as_ref()?.program.clone()),
            id: t.id,
            name: t.name,
            category: t.category,
            parents: ps,
            inputs,
            outputs,
        });
    }
    Ok(Trace {
        name: doc.name,
        schema: version.to_string(),
        system: doc.runtime_system.and_then(|s| s.name),
        tasks,
        files: files.list,
    })
}

#[derive(Deserialize)]
struct Doc14 {
    name: String,
    wms: Option<System>,
    workflow: Workflow14,
}

#[derive(Deserialize)]
struct Workflow14 {
    #[serde(alias = "jobs")]
    tasks: Vec<Task14>,
}

#[derive(Deserialize)]
struct Task14 {
    name: String,
    category: Option<String>,
    #[serde(default)]
    parents: Vec<String>,
    #[serde(default)]
    children: Vec<String>,
    #[serde(default)]
    files: Vec<File14>,
    #[serde(rename = "runtimeInSeconds", alias = "runtime")]
    runtime: Option<f64>,
    cores: Option<f64>,
    #[serde(rename = "memoryInBytes")]
    mem: Option<f64>,
    command: Option<Command>,
}

#[derive(Deserialize)]
struct File14 {
    name: String,
    path: Option<String>,
    link: Option<String>,
    #[serde(rename = "sizeInBytes", alias = "size")]
    size: Option<f64>,
}

fn from_14(doc: Doc14, version: &str) -> Result<Trace> {
    let list = doc.workflow.tasks;
    let mut by_name: HashMap<&str, usize> = HashMap::with_capacity(list.len());
    for (i, t) in list.iter().enumerate() {
        if by_name.insert(t.name.as_str(), i).is_some() {
            bail!(
                "task `{}`, field `name`: two tasks have this name (schema 1.4 names parents by task name)",
                t.name
            );
        }
    }
    let mut parents: Vec<Vec<usize>> = vec![Vec::new(); list.len()];
    for (i, t) in list.iter().enumerate() {
        for p in &t.parents {
            let Some(&j) = by_name.get(p.as_str()) else {
                bail!(
                    "task `{}`, field `parents`: `{p}` is no task of the trace",
                    t.name
                );
            };
            parents[i].push(j);
        }
        for c in &t.children {
            let Some(&j) = by_name.get(c.as_str()) else {
                bail!(
                    "task `{}`, field `children`: `{c}` is no task of the trace",
                    t.name
                );
            };
            parents[j].push(i);
        }
    }
    let mut files = Files::default();
    let mut tasks = Vec::with_capacity(list.len());
    for (t, mut ps) in list.into_iter().zip(parents) {
        ps.sort_unstable();
        ps.dedup();
        let owner = format!("task `{}`", t.name);
        let (mut inputs, mut outputs) = (Vec::new(), Vec::new());
        for f in &t.files {
            let id = match &f.path {
                Some(p) => format!("{p}{}", f.name),
                None => f.name.clone(),
            };
            let i = files.add(&id, f.size, &format!("{owner}, file `{id}`"))?;
            match f.link.as_deref().map(str::to_ascii_lowercase).as_deref() {
                Some("input") => inputs.push(i),
                Some("output") => outputs.push(i),
                other => bail!(
                    "{owner}, file `{id}`, field `link`: expected \"input\" or \"output\", got {}",
                    other.map_or("nothing".to_string(), |o| format!("`{o}`"))
                ),
            }
        }
        tasks.push(Task {
            runtime_s: runtime_of(&owner, t.runtime)?,
            timed: t.runtime.is_some(),
            cores: cores_of(&owner, t.cores)?,
            mem_bytes: mem_of(&owner, t.mem)?,
            program: t.command.and_then(|c| c.program),
            id: t.name.clone(),
            name: t.name,
            category: t.category,
            parents: ps,
            inputs,
            outputs,
        });
    }
    Ok(Trace {
        name: doc.name,
        schema: version.to_string(),
        system: doc.wms.and_then(|s| s.name),
        tasks,
        files: files.list,
    })
}

fn runtime_of(owner: &str, r: Option<f64>) -> Result<f64> {
    match r {
        Some(r) if r < 0.0 => bail!("{owner}, field `runtimeInSeconds`: {r} is negative"),
        Some(r) => Ok(r),
        None => Ok(0.0),
    }
}

fn cores_of(owner: &str, c: Option<f64>) -> Result<Option<f64>> {
    match c {
        Some(c) if c <= 0.0 => {
            bail!("{owner}, field `coreCount`: {c} is not a positive number of cores")
        }
        c => Ok(c),
    }
}

fn mem_of(owner: &str, m: Option<f64>) -> Result<Option<u64>> {
    match m {
        Some(m) if m < 0.0 => bail!("{owner}, field `memoryInBytes`: {m} is negative"),
        Some(0.0) => Ok(None),
        m => Ok(m.map(|m| m.round() as u64)),
    }
}

/// Fails with the cycle's tasks when the dependencies are not a DAG.
fn check_acyclic(trace: &Trace) -> Result<()> {
    const WHITE: u8 = 0;
    const GREY: u8 = 1;
    const BLACK: u8 = 2;
    let n = trace.tasks.len();
    let mut colour = vec![WHITE; n];
    for start in 0..n {
        if colour[start] != WHITE {
            continue;
        }
        // Iterative, so a long chain cannot overflow the stack.
        let mut stack: Vec<(usize, usize)> = vec![(start, 0)];
        colour[start] = GREY;
        while let Some(top) = stack.last_mut() {
            let (t, next) = *top;
            let ps = &trace.tasks[t].parents;
            if next == ps.len() {
                colour[t] = BLACK;
                stack.pop();
                continue;
            }
            top.1 += 1;
            let p = ps[next];
            match colour[p] {
                WHITE => {
                    colour[p] = GREY;
                    stack.push((p, 0));
                }
                GREY => {
                    let from = stack.iter().position(|(s, _)| *s == p).unwrap_or(0);
                    let mut path: Vec<&str> = stack[from..]
                        .iter()
                        .map(|(s, _)| trace.tasks[*s].id.as_str())
                        .collect();
                    path.push(&trace.tasks[p].id);
                    bail!(
                        "task `{}`, field `parents`: the dependencies form a cycle: {} (`a -> b` means a waits for b)",
                        trace.tasks[stack[from].0].id,
                        path.join(" -> ")
                    );
                }
                _ => {}
            }
        }
    }
    Ok(())
}
