//! `mesh sim --farm FARM`: a farm of the mesh simulated from where it stands. Its graph comes as `mesh export` writes it; what is done is left out, a running task goes on for what is left of a runtime drawn longer than it has run, and a waiting task takes a runtime drawn from its stage's finished tasks.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::io::Write as _;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use mesh_node::control::{ControlRequest, ControlResponse, Target, TaskEvent};
use mesh_node::eta::Runtimes;
use mesh_node::mesh_node::farm_display_id;
use mesh_node::view::{FarmView, Observed};
use mesh_protocol::resources::{parse_resources, CPU, MEM};
use rand::rngs::SmallRng;
use rand::SeedableRng;
use serde_json::{json, Value};

use super::Standing;
use crate::mesh_cmds::ask_once;
use crate::sim_args::SimArgs;

pub fn run(args: &SimArgs, to: &Target, farm: &str) -> Result<ExitCode> {
    let view = match ask_once(to, &ControlRequest::Farm { farm: farm.into() })? {
        ControlResponse::Farm(v) => *v,
        other => bail!("unexpected answer from the node: {other:?}"),
    };
    let trace = match ask_once(
        to,
        &ControlRequest::Export {
            farm: view.id.clone(),
        },
    )? {
        ControlResponse::Trace(t) => *t,
        other => bail!("unexpected answer from the node: {other:?}"),
    };
    let whole = args.tasks.is_some();
    // From a fresh start (`--tasks`), what runs now and what each node has
    // ended since do not count: the mesh is asked for the farm alone.
    let (tasks, observed) = if whole {
        (Vec::new(), None)
    } else {
        let req = ControlRequest::Tasks {
            farm: view.id.clone(),
            state: None,
            limit: None,
        };
        let tasks = match ask_once(to, &req)? {
            ControlResponse::Tasks(t) => t,
            other => bail!("unexpected answer from the node: {other:?}"),
        };
        let req = ControlRequest::Observe {
            since: HashMap::new(),
        };
        match ask_once(to, &req)? {
            ControlResponse::Observed(o) => (tasks, Some(*o)),
            other => bail!("unexpected answer from the node: {other:?}"),
        }
    };
    let now_ms = mesh_node::state::unix_ms();
    let mut rng = SmallRng::seed_from_u64(args.seed.unwrap_or(1));
    let told = Told {
        view: &view,
        trace: &trace,
        tasks: &tasks,
        observed: observed.as_ref(),
    };
    let left = what_is_left(&told, &mut rng, whole, args.asks_used)?;
    if left.tasks == 0 {
        bail!(
            "{} has nothing left to run: {} done, {} failed (see `mesh status {}`)",
            view.id,
            view.counts.done,
            view.counts.failed,
            view.id
        );
    }
    let mut file = tempfile::Builder::new()
        .prefix(&format!("{}.", view.id))
        .suffix(".json")
        .tempfile()
        .context("cannot write the farm's trace for the simulator")?;
    serde_json::to_writer(&mut file, &left.trace)?;
    file.flush()?;
    if let Some(n) = args.tasks {
        // Tasks like this farm's, N of them, from a fresh start.
        let seed = args.seed.unwrap_or(1);
        let mut loaded =
            super::load::load_scaled(file.path(), args.time_scale, Some((n as usize, seed)))?;
        loaded.source = format!(
            "{} scaled to about {n} tasks{}",
            view.id,
            asks_note(args, &view)
        );
        return super::answer(args, loaded, None);
    }
    let mut loaded = super::load::load(file.path(), args.time_scale)?;
    loaded.source = format!("{} (what is left of it)", view.id);
    let (nodes, cores, mem) = observed.as_ref().map_or((0, 1, 0), mesh_shape);
    let standing = Standing {
        farm: view.id.clone(),
        now_ms,
        done: left.done,
        running: left.running,
        waiting: left.tasks - left.running,
        nodes,
        cores,
        mem,
        guessed: left.guessed,
    };
    super::answer(args, loaded, Some(standing))
}

/// What is left of a farm, as a trace the what-if reads.
struct Left {
    trace: Value,
    tasks: usize,
    done: usize,
    running: usize,
    /// Stages none of whose tasks has finished.
    guessed: Vec<String>,
}

/// What the node told of a farm: its view, its trace, its tasks' events
/// and what the mesh observed (neither of those from a fresh start).
struct Told<'a> {
    view: &'a FarmView,
    trace: &'a Value,
    tasks: &'a [TaskEvent],
    observed: Option<&'a Observed>,
}

/// `whole`: every task of the farm, as if it started now: a task that ran
/// keeps its own runtime, the others draw theirs (for `--tasks`).
fn what_is_left(told: &Told<'_>, rng: &mut SmallRng, whole: bool, asks_used: bool) -> Result<Left> {
    let Told {
        view,
        trace,
        tasks,
        observed,
    } = *told;
    let spec = trace["workflow"]["specification"]["tasks"]
        .as_array()
        .context("the farm's trace has no tasks")?;
    let exec: Vec<Value> = trace["workflow"]["execution"]["tasks"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let mut recorded = Recorded::of(spec, &exec);
    recorded.asks = asks(view, asks_used);
    let mut progress = Progress::of(tasks);
    let stage_names: Vec<&str> = view.stages.iter().map(|(n, _)| n.as_str()).collect();
    progress.observe(view, &stage_names, observed, &mut recorded);
    let Progress {
        ended,
        done,
        running,
    } = progress;
    let runtimes = &recorded.runtimes;
    // Each stage's runtimes from its finished tasks and, as lower bounds,
    // its running ones: early finishers alone would say a stage is shorter
    // than it is.
    let mut ran_so_far: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for ((stage, _), &ran) in &running {
        ran_so_far.entry(stage.clone()).or_default().push(ran);
    }
    let none = Vec::new();
    let estimate = |stage: &str| {
        Runtimes::estimate(
            runtimes.get(stage).unwrap_or(&none),
            ran_so_far.get(stage).unwrap_or(&none),
        )
    };
    let all_done: Vec<f64> = runtimes.values().flatten().copied().collect();
    let all_running: Vec<f64> = ran_so_far.values().flatten().copied().collect();
    let Some(all) = Runtimes::estimate(&all_done, &all_running) else {
        bail!(
            "no task of {} has finished yet: there is no runtime to draw the rest from; \
             ask again once some have",
            view.id
        );
    };
    let by_stage: BTreeMap<&str, Runtimes> = stage_names
        .iter()
        .filter_map(|s| Some((*s, estimate(s)?)))
        .collect();
    let kept: Vec<&Value> = spec
        .iter()
        .filter(|t| place(t).is_some_and(|p| !ended.contains(&p)))
        .collect();
    let kept_ids: HashSet<&str> = kept.iter().filter_map(|t| t["id"].as_str()).collect();
    let mut guessed = BTreeSet::new();
    let mut new_spec = Vec::with_capacity(kept.len());
    let mut new_exec = Vec::with_capacity(kept.len());
    let mut produced: HashSet<String> = HashSet::new();
    for t in &kept {
        for f in t["outputFiles"].as_array().into_iter().flatten() {
            produced.extend(f.as_str().map(String::from));
        }
    }
    let mut is_running = 0;
    for t in kept {
        let (stage, index) = place(t).expect("kept by place");
        let pool = match by_stage.get(stage.as_str()) {
            Some(r) => r,
            None => {
                guessed.insert(stage.clone());
                &all
            }
        };
        let runtime = match running.get(&(stage.clone(), index)) {
            // What is left of a runtime longer than it has run so far.
            Some(&ran) => {
                is_running += 1;
                pool.draw(rng, Some(ran)) - ran
            }
            None => match t["id"].as_str().and_then(|id| recorded.own.get(id)) {
                Some(&r) if whole => r,
                _ => pool.draw(rng, None),
            },
        };
        new_spec.push(spec_left(t, &kept_ids, &produced));
        let mut e = recorded
            .asks
            .get(&stage)
            .cloned()
            .unwrap_or_else(|| json!({}));
        e["id"] = t["id"].clone();
        e["runtimeInSeconds"] = json!(runtime);
        new_exec.push(e);
    }
    let files: Vec<Value> = trace["workflow"]["specification"]["files"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|f| f["id"].as_str().is_some_and(|id| produced.contains(id)))
        .cloned()
        .collect();
    let tasks_left = new_spec.len();
    let mut out = trace.clone();
    out["workflow"] = json!({
        "specification": {"tasks": new_spec, "files": files},
        "execution": {
            "makespanInSeconds": 0.0,
            "executedAt": trace["createdAt"].clone(),
            "tasks": new_exec,
        },
    });
    Ok(Left {
        trace: out,
        tasks: tasks_left,
        done,
        running: is_running,
        guessed: guessed.into_iter().collect(),
    })
}

/// What each stage's tasks ask for, as the simulator reads a trace's
/// runs (`coreCount`, `memoryInBytes`): the farm's asks, or with
/// `used` the most memory a measured task of the stage held (the trace's
/// `memoryInBytes` is what each run used, not what it asked).
fn asks(view: &FarmView, used: bool) -> HashMap<String, Value> {
    view.asks
        .iter()
        .map(|a| {
            let mut ask = json!({});
            if a.cpu >= 1.0 {
                ask["coreCount"] = json!(a.cpu);
            }
            let held = view
                .used
                .iter()
                .find(|u| u.stage == a.stage && u.peak_max > 0)
                .map(|u| u.peak_max);
            let mem = match held {
                Some(m) if used => m,
                _ => a.mem,
            };
            if mem > 0 {
                ask["memoryInBytes"] = json!(mem);
            }
            (a.stage.clone(), ask)
        })
        .collect()
}

/// With `--asks-used`, what the asks became, for the report's first line.
fn asks_note(args: &SimArgs, view: &FarmView) -> String {
    if !args.asks_used {
        return String::new();
    }
    let words = asks_used_words(view);
    if words.is_empty() {
        "; its own asks: no task has a measured peak memory yet".into()
    } else {
        format!(
            "; memory asks set to what the tasks used: {}",
            words.join(", ")
        )
    }
}

/// The asks `--asks-used` puts in place of the farm's, in words: `solve
/// 310.4 MiB (asks 4.0 GiB)`; stages with no measured run keep theirs.
fn asks_used_words(view: &FarmView) -> Vec<String> {
    let bytes = mesh_node::view::bytes;
    view.asks
        .iter()
        .filter_map(|a| {
            let u = view
                .used
                .iter()
                .find(|u| u.stage == a.stage && u.peak_max > 0)?;
            let asked = if a.mem > 0 {
                format!("asks {}", bytes(a.mem))
            } else {
                "asks no memory".to_string()
            };
            Some(format!("{} {} ({asked})", a.stage, bytes(u.peak_max)))
        })
        .collect()
}

/// A task by its stage and index, as the trace's id ends (`stage.3`).
fn place(t: &Value) -> Option<(String, u32)> {
    let id = t["id"].as_str()?;
    let index = id.rsplit('.').next()?.parse().ok()?;
    Some((t["category"].as_str()?.to_string(), index))
}

/// A task left, as the trace specifies it: its parents and children
/// among the tasks left (`kept`), and of its inputs those that tasks left
/// make (`produced`). Files made by what is done are where they are; those
/// to be made move as the trace says.
fn spec_left(t: &Value, kept: &HashSet<&str>, produced: &HashSet<String>) -> Value {
    let keep_id = |v: &Value| v.as_str().is_some_and(|id| kept.contains(id));
    let mut s = t.clone();
    for k in ["parents", "children"] {
        let ids: Vec<Value> = t[k]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|v| keep_id(v))
            .cloned()
            .collect();
        s[k] = Value::Array(ids);
    }
    let inputs: Vec<Value> = t["inputFiles"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|f| f.as_str().is_some_and(|f| produced.contains(f)))
        .cloned()
        .collect();
    s["inputFiles"] = Value::Array(inputs);
    s
}

/// What the farm's trace recorded of its runs.
struct Recorded<'a> {
    /// Each stage's finished runtimes.
    runtimes: BTreeMap<String, Vec<f64>>,
    /// What each stage's tasks ask for (cores, memory).
    asks: HashMap<String, Value>,
    /// Each finished task's own runtime, by its id.
    own: HashMap<&'a str, f64>,
    /// The tasks with a recorded run, by stage and index.
    timed: HashSet<(String, u32)>,
}

impl<'a> Recorded<'a> {
    /// From the trace's specification (`spec`, for each task's stage) and
    /// execution (`exec`).
    fn of(spec: &[Value], exec: &'a [Value]) -> Recorded<'a> {
        let category: HashMap<&str, &str> = spec
            .iter()
            .filter_map(|t| Some((t["id"].as_str()?, t["category"].as_str()?)))
            .collect();
        let mut runtimes: BTreeMap<String, Vec<f64>> = BTreeMap::new();
        for e in exec {
            let Some(stage) = e["id"].as_str().and_then(|id| category.get(id)) else {
                continue;
            };
            if e.get("failed").is_none() {
                if let Some(r) = e["runtimeInSeconds"].as_f64() {
                    runtimes.entry(stage.to_string()).or_default().push(r);
                }
            }
        }
        let own = exec
            .iter()
            .filter(|e| e.get("failed").is_none())
            .filter_map(|e| Some((e["id"].as_str()?, e["runtimeInSeconds"].as_f64()?)))
            .collect();
        let timed = exec
            .iter()
            .filter_map(|e| {
                let id = e["id"].as_str()?;
                Some((
                    category.get(id)?.to_string(),
                    id.rsplit('.').next()?.parse().ok()?,
                ))
            })
            .collect();
        Recorded {
            runtimes,
            asks: HashMap::new(),
            own,
            timed,
        }
    }
}

/// Where the farm's tasks stand now, by stage and index.
struct Progress {
    /// Those ended (done or failed for good).
    ended: HashSet<(String, u32)>,
    /// How many of them are done.
    done: usize,
    /// Those running here now, each with how long it has run (by its
    /// node's clock).
    running: HashMap<(String, u32), f64>,
}

impl Progress {
    /// As the farm's log has them.
    fn of(tasks: &[TaskEvent]) -> Progress {
        Progress {
            ended: tasks
                .iter()
                .filter(|t| t.state != "unfinished")
                .map(|t| (t.stage.clone(), t.index))
                .collect(),
            done: tasks.iter().filter(|t| t.state == "done").count(),
            running: HashMap::new(),
        }
    }

    /// What the nodes say of their runs of the farm: those running, and
    /// those ended well that the log may not have yet (their runtimes go
    /// to `recorded`).
    fn observe(
        &mut self,
        view: &FarmView,
        stage_names: &[&str],
        observed: Option<&Observed>,
        recorded: &mut Recorded,
    ) {
        for (_, o) in observed.iter().flat_map(|o| &o.nodes) {
            for r in &o.runs {
                if farm_display_id(&view.name, r.farm) != view.id {
                    continue;
                }
                let Some(stage) = stage_names.get(r.task.stage as usize) else {
                    continue;
                };
                let at = (stage.to_string(), r.task.index);
                match r.end {
                    None => {
                        let ran = o.unix_ms.saturating_sub(r.start) as f64 / 1000.0;
                        self.running.insert(at, ran);
                    }
                    // Ended well where it ran, and perhaps not yet in the copy
                    // of the log asked: done all the same, and its runtime counts.
                    Some(end) if !r.failed => {
                        if !recorded.timed.contains(&at) {
                            let ran = end.saturating_sub(r.start) as f64 / 1000.0;
                            recorded.runtimes.entry(at.0.clone()).or_default().push(ran);
                        }
                        if self.ended.insert(at) {
                            self.done += 1;
                        }
                    }
                    Some(_) => {}
                }
            }
        }
    }
}

/// How many nodes the mesh has now, and the cores and memory of the
/// commonest kind among them.
fn mesh_shape(observed: &Observed) -> (usize, u32, u64) {
    let mut kinds: BTreeMap<(u32, u64), usize> = BTreeMap::new();
    for n in &observed.status.nodes {
        let Ok(r) = parse_resources(&n.resources.total) else {
            continue;
        };
        let cores = r.get(CPU).whole().max(1) as u32;
        *kinds.entry((cores, r.get(MEM).whole())).or_default() += 1;
    }
    let ((cores, mem), _) = kinds
        .iter()
        .max_by_key(|(_, n)| **n)
        .map(|(k, n)| (*k, *n))
        .unwrap_or(((1, 0), 0));
    (observed.status.nodes.len(), cores, mem)
}
