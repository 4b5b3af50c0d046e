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
use crate::import::wfformat::{self, File, Task, Trace};
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
    load_scaled(path, time_scale, None)
}

/// [`load`], with each stage of more than one task scaled in proportion
/// so that the workflow has about `tasks` tasks (`(tasks, seed)`; see
/// [`scale`]).
pub fn load_scaled(path: &Path, time_scale: f64, tasks: Option<(usize, u64)>) -> Result<Loaded> {
    let mut trace = wfformat::read(path)?;
    if let Some((n, seed)) = tasks {
        trace = scale(&trace, &Plan::new(&trace), n, seed);
    }
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
        &LoadOptions::to(Some(folder.join("mesh-out"))),
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

/// The workflow with about `n` tasks, as if each of its sweeps had run
/// over more (or fewer) values: every stage of more than one task gets
/// its count times one factor, a stage of one task (a merge, a final
/// step) stays one. A stage's task `i` is copy `i / k` of its task
/// `i % k` (`k` the stage's recorded count): its parents are the same
/// copy of each parent in a scaled stage, and every copy of each parent
/// in a scaled stage for a task of a stage of one; files made by a copy
/// are files of their own. Copies take runtimes drawn (seeded) from
/// their stage's recorded ones; the recorded tasks keep theirs.
pub fn scale(trace: &Trace, plan: &Plan, n: usize, seed: u64) -> Trace {
    use rand::{RngExt, SeedableRng};
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
    let stage_of = |t: usize| plan.place[t].0;
    let index_of = |t: usize| plan.place[t].1 as usize;
    let (k, m) = stage_counts(plan, n);
    // Copies of task t: r with index + k * r below the stage's new count.
    let copies = |t: usize| {
        let (s, i) = (stage_of(t), index_of(t));
        if i >= m[s] {
            0
        } else {
            (m[s] - i).div_ceil(k[s])
        }
    };
    let runtimes: Vec<Vec<f64>> = plan
        .stages
        .iter()
        .map(|st| st.tasks.iter().map(|&t| trace.tasks[t].runtime_s).collect())
        .collect();
    let mut producer: HashMap<usize, usize> = HashMap::new();
    for (t, task) in trace.tasks.iter().enumerate() {
        for &f in &task.outputs {
            producer.entry(f).or_insert(t);
        }
    }
    let (at, order) = positions(trace.tasks.len(), copies);
    let mut files: Vec<File> = trace
        .files
        .iter()
        .map(|f| File {
            id: f.id.clone(),
            size: f.size,
            sized: f.sized,
        })
        .collect();
    let mut copied: HashMap<(usize, usize), usize> = HashMap::new();
    let mut file_of = |f: usize, r: usize, files: &mut Vec<File>| -> usize {
        if r == 0 {
            return f;
        }
        *copied.entry((f, r)).or_insert_with(|| {
            files.push(File {
                id: format!("{}~{r}", trace.files[f].id),
                size: trace.files[f].size,
                sized: trace.files[f].sized,
            });
            files.len() - 1
        })
    };
    let scaled = |t: usize| k[stage_of(t)] > 1;
    let mut tasks = Vec::with_capacity(order.len());
    for &(t, r) in &order {
        let src = &trace.tasks[t];
        let mut parents: Vec<usize> = Vec::new();
        for &p in &src.parents {
            if !scaled(p) {
                parents.extend(at.get(&(p, 0)));
            } else if !scaled(t) {
                parents.extend((0..copies(p)).filter_map(|q| at.get(&(p, q))));
            } else {
                parents.extend(at.get(&(p, r)).or_else(|| at.get(&(p, 0))));
            }
        }
        parents.sort_unstable();
        parents.dedup();
        // A file made by a scaled parent is its copy's; others are shared.
        let copy_of_input = |f: usize| match producer.get(&f) {
            Some(&p) if scaled(p) && scaled(t) && at.contains_key(&(p, r)) => r,
            _ => 0,
        };
        let inputs: Vec<usize> = src
            .inputs
            .iter()
            .map(|&f| {
                let q = copy_of_input(f);
                file_of(f, q, &mut files)
            })
            .collect();
        let outputs: Vec<usize> = src
            .outputs
            .iter()
            .map(|&f| file_of(f, r, &mut files))
            .collect();
        let pool = &runtimes[stage_of(t)];
        let runtime_s = if r == 0 || pool.is_empty() {
            src.runtime_s
        } else {
            pool[rng.random_range(0..pool.len())]
        };
        let suffix = |s: &str| {
            if r == 0 {
                s.to_string()
            } else {
                format!("{s}~{r}")
            }
        };
        tasks.push(Task {
            id: suffix(&src.id),
            name: suffix(&src.name),
            category: Some(plan.stages[stage_of(t)].kind.clone()),
            program: src.program.clone(),
            parents,
            runtime_s,
            timed: src.timed,
            cores: src.cores,
            mem_bytes: src.mem_bytes,
            inputs,
            outputs,
        });
    }
    Trace {
        name: trace.name.clone(),
        schema: trace.schema.clone(),
        system: trace.system.clone(),
        tasks,
        files,
    }
}

/// Each stage's task count now (`k`) and scaled (`m`): sweeps in
/// proportion, so the farm has about `n` tasks; single tasks (merges)
/// stay single.
fn stage_counts(plan: &Plan, n: usize) -> (Vec<usize>, Vec<usize>) {
    let k: Vec<usize> = plan.stages.iter().map(|s| s.tasks.len()).collect();
    let singles: usize = k.iter().filter(|&&c| c == 1).count();
    let sweeps: usize = k.iter().filter(|&&c| c > 1).sum();
    let factor = n.saturating_sub(singles) as f64 / sweeps.max(1) as f64;
    let m = k
        .iter()
        .map(|&c| {
            if c > 1 {
                ((c as f64 * factor).round() as usize).max(1)
            } else {
                1
            }
        })
        .collect();
    (k, m)
}

/// Where each copy `(task, r)` stands in the scaled trace, and the copies
/// in that order.
type Positions = (HashMap<(usize, usize), usize>, Vec<(usize, usize)>);

/// The scaled trace's tasks in order, copy by copy (copy `r` of each of the
/// `tasks` that has that many), and each one's position.
fn positions(tasks: usize, copies: impl Fn(usize) -> usize) -> Positions {
    let mut at: HashMap<(usize, usize), usize> = HashMap::new();
    let mut order: Vec<(usize, usize)> = Vec::new();
    for r in 0.. {
        let before = order.len();
        for t in 0..tasks {
            if r < copies(t) {
                at.insert((t, r), order.len());
                order.push((t, r));
            }
        }
        if order.len() == before {
            break;
        }
    }
    (at, order)
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
            std::sync::Arc::make_mut(st).expected_ms =
                Some(((longest as f64 * factor).ceil() as u64).max(1));
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
