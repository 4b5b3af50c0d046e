//! A WfCommons trace made into the simulator's [`Workload`]: the farm `mesh import` would submit (its graph checked against the trace edge by edge), each task's runtime, and the files each task reads from its parents.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use mesh_node::farmfile::{self, LoadOptions};
use mesh_protocol::resources::{CPU, MEM};
use mesh_protocol::Resources;
use mesh_sim::workflow::Read;
use mesh_sim::Workload;

use crate::import::plan::Plan;
use crate::import::wfformat::{self, Trace};
use crate::import::{farm_name, verify};

/// A trace, read, checked and made into a workload.
pub struct Loaded {
    pub trace: Trace,
    pub workload: Workload,
    /// The trace's file name, for people.
    pub source: String,
    pub edges: usize,
    pub stages: usize,
    /// Bytes the tasks read from their parents, over the whole workflow.
    pub read_bytes: u64,
    /// Tasks with no recorded runtime (they take no time).
    pub untimed: usize,
}

/// Reads the trace at `path`; runtimes are multiplied by `time_scale`.
/// A trace with a cycle, a parent that is no task, a negative runtime or
/// an unknown schema is refused here, naming the task and the field.
pub fn load(path: &Path, time_scale: f64) -> Result<Loaded> {
    let trace = wfformat::read(path)?;
    let plan = Plan::new(&trace);
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "trace".into());
    let source = path
        .file_name()
        .map_or_else(|| stem.clone(), |f| f.to_string_lossy().into_owned());
    let toml = plan.graph_toml(&trace, &farm_name(&stem), &source);
    // The loader names this file in its messages and takes its folder as
    // the farm's root; nothing is written there.
    let folder = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let farm = folder.join(format!("{stem}.farm.toml"));
    let def = farmfile::load_str(
        &farm,
        &toml,
        &LoadOptions {
            out: Some(folder.join("mesh-out")),
        },
    )
    .context("the farm made of the trace does not load (a bug in mesh sim)")?;
    verify(&def, &trace, &plan)
        .context("the farm made of the trace does not match it (a bug in mesh sim)")?;

    let mut offsets = Vec::with_capacity(plan.stages.len());
    let mut at = 0;
    for st in &plan.stages {
        offsets.push(at);
        at += st.tasks.len();
    }
    let global = |t: usize| {
        let (s, i) = plan.place[t];
        offsets[s] + i as usize
    };
    let mut producer: HashMap<usize, usize> = HashMap::new();
    for (t, task) in trace.tasks.iter().enumerate() {
        for &f in &task.outputs {
            producer.entry(f).or_insert(t);
        }
    }
    let n = trace.tasks.len();
    let mut runtime_ms = vec![0u64; n];
    let mut parents: Vec<Vec<u32>> = vec![Vec::new(); n];
    let mut reads: Vec<Vec<Read>> = vec![Vec::new(); n];
    let mut read_bytes = 0;
    for (t, task) in trace.tasks.iter().enumerate() {
        let g = global(t);
        runtime_ms[g] = (task.runtime_s * time_scale * 1000.0).round() as u64;
        let mut ps: Vec<u32> = task.parents.iter().map(|&p| global(p) as u32).collect();
        ps.sort_unstable();
        parents[g] = ps;
        // As the imported farm reads them: a file made by a parent comes
        // from that parent's node; any other comes with the farm's inputs.
        let mut rs: Vec<Read> = Vec::new();
        for &f in &task.inputs {
            let Some(&p) = producer.get(&f) else { continue };
            if task.parents.binary_search(&p).is_err() || rs.iter().any(|r| r.file == f as u32) {
                continue;
            }
            let bytes = trace.files[f].size;
            read_bytes += bytes;
            rs.push(Read {
                from: global(p) as u32,
                file: f as u32,
                bytes,
            });
        }
        reads[g] = rs;
    }
    let workload = Workload {
        def,
        runtime_ms,
        parents,
        reads,
        input_bytes: plan.input_files().iter().map(|(_, b)| b).sum(),
    };
    workload
        .check()
        .map_err(|e| anyhow::anyhow!("{e} (a bug in mesh sim)"))?;
    Ok(Loaded {
        edges: trace.edges(),
        stages: plan.stages.len(),
        untimed: trace.tasks.iter().filter(|t| !t.timed).count(),
        trace,
        workload,
        source,
        read_bytes,
    })
}

impl Loaded {
    /// Refuses nodes that some task does not fit, naming the task that
    /// asks the most: no simulation could place it.
    pub fn check_fits(&self, cores: u32, mem_bytes: u64) -> Result<()> {
        let most_cores = self
            .trace
            .tasks
            .iter()
            .filter_map(|t| Some((t.cores?, t)))
            .max_by(|a, b| a.0.total_cmp(&b.0));
        if let Some((c, t)) = most_cores {
            if c > f64::from(cores) {
                bail!(
                    "{}: task `{}`, field `coreCount`: {c} cores, more than a node has ({cores}, --cores-per-node)",
                    self.source,
                    t.id
                );
            }
        }
        let most_mem = self
            .trace
            .tasks
            .iter()
            .filter_map(|t| Some((t.mem_bytes?, t)))
            .max_by_key(|(m, _)| *m);
        if let Some((m, t)) = most_mem {
            if m > mem_bytes {
                bail!(
                    "{}: task `{}`, field `memoryInBytes`: {m} bytes, more than a node has ({mem_bytes}, --mem-per-node)",
                    self.source,
                    t.id
                );
            }
        }
        Ok(())
    }

    /// Refuses a cluster where some task fits no node (nor any queue's).
    pub fn check_fits_any(&self, machines: &[Resources]) -> Result<()> {
        for t in &self.trace.tasks {
            let cores = t.cores.unwrap_or(1.0);
            let fits = machines.iter().any(|m| {
                m.get(CPU).0 as f64 >= cores * 1000.0
                    && t.mem_bytes.is_none_or(|b| m.get(MEM).whole() >= b)
            });
            if !fits {
                bail!(
                    "{}: task `{}` ({cores} cores{}) fits no node of the scenario, nor any queue's",
                    self.source,
                    t.id,
                    t.mem_bytes
                        .map(|b| format!(", {b} bytes of memory"))
                        .unwrap_or_default()
                );
            }
        }
        Ok(())
    }

    /// Each stage's `expected`: its longest task's runtime times `factor`.
    pub fn expect_longest(&mut self, factor: f64) {
        let wl = &mut self.workload;
        let offsets = wl.offsets();
        for (s, st) in wl.def.stages.iter_mut().enumerate() {
            let o = offsets[s];
            let longest = wl.runtime_ms[o..o + st.len() as usize]
                .iter()
                .copied()
                .max()
                .unwrap_or(0);
            st.expected_ms = Some(((longest as f64 * factor).ceil() as u64).max(1));
        }
    }

    /// The most memory a task recorded.
    pub fn most_mem(&self) -> u64 {
        self.trace
            .tasks
            .iter()
            .filter_map(|t| t.mem_bytes)
            .max()
            .unwrap_or(0)
    }
}
