//! Real workflows on one node: each WfCommons trace in ../shared/workflows imported with `mesh import wfformat` as sleeps with its exact graph, run with `mesh run`, against the graph's critical path, a greedy list schedule of it, and Dask given the same graph.
//!
//! For each trace, the time scale is chosen so that its critical path
//! (the longest chain of recorded runtimes) lasts `MESH_BENCH_TRACES_SECS`
//! (15) seconds; files are written empty (`--size-scale 0`), so what is
//! measured is the graph and the tasks, not the disk. Two runs:
//! - enough slots (`--resources cpu=N`, N the number of tasks): makespan
//!   over the critical path (target at most 1.02);
//! - fewer slots, as many as make the work, not the chain, decide:
//!   the summed runtime over twice the critical path, at least 1. Makespan
//!   over a greedy list schedule of the same graph at those slots,
//!   simulated here with the engine's order (the deepest stage first,
//!   then the order tasks became ready; target at most 1.02). The same
//!   simulation in plain ready order (FIFO), and upstream tasks first
//!   (by their depth in the graph, as Dask's order of submission does),
//!   are printed beside it.
//!
//! Makespans are the wall time of `mesh run` (start to exit, the farm's
//! loading included). The graph is the farm's, loaded with mesh's loader
//! (`mesh import` checked it against the trace edge by edge); the critical
//! path is also worked out from the trace itself and must agree.
//!
//! Dask: when a Python with `distributed` is found (`MESH_BENCH_DASK_PYTHON`,
//! else /tmp/daskvenv/bin/python3, else python3), `scripts/dask_trace.py`
//! runs the same sleeps with `client.submit` and the parents' futures on a
//! LocalCluster of the same slots, timed from the first submit to the last
//! result (the cluster's start not counted).
//!
//! Four nodes (as root, where `unshare -m` works): each trace again with
//! its files, written at their recorded sizes scaled so that all of a
//! trace's files come to `MESH_BENCH_TRACES_MB` (100) MB, on 4 nodes of
//! `ceil(few / 4)` slots each, every node but the submitter in a mount
//! namespace of its own without the farm's and the outputs' folders (so
//! every byte a task reads off the home comes over the network), against
//! the same farm on one node of 4 times the slots (target at most 1.15).
//! Both are `mesh submit --wait` to a running node, timed to its exit;
//! beside it, the bytes the nodes received (`mesh status --latency`)
//! against the bytes of every output the farm made (which must come home)
//! and of the workflow's input files (which each node running a task that
//! reads one fetches once).
//!
//! `MESH_BENCH_TRACES` (a comma-separated list of substrings) picks traces;
//! `MESH_BENCH_TRACES_PART` = `one` or `four` runs one part alone.
//!
//! `cargo bench -p mesh-cli --bench traces`

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap, HashMap, HashSet};
use std::path::Path;
use std::process::Command;
use std::time::Instant;

use mesh_benches::{import_trace, knob, report, save, use_user_env, user_env, workflow_traces};
use mesh_node::farmfile::{self, LoadOptions};
use mesh_protocol::farm::{FarmDef, TaskRef};
use mesh_tests::{apart_possible, Cluster, Sandbox};
use serde_json::Value;

fn main() {
    use_user_env();
    let mesh = env!("CARGO_BIN_EXE_mesh");
    let cp_secs = knob("MESH_BENCH_TRACES_SECS", 15) as f64;
    let Some(traces) = workflow_traces("MESH_BENCH_TRACES") else {
        return;
    };
    let dask = dask_python();
    match &dask {
        Some(py) => println!("Dask: {py}"),
        None => println!("Dask: skipped (no Python with `distributed`; see scripts/dask_trace.py)"),
    }
    let mut results = Vec::new();
    // `MESH_BENCH_TRACES_PART`: `one` (one node) or `four` (four nodes
    // apart) alone; both by default.
    let part = std::env::var("MESH_BENCH_TRACES_PART").unwrap_or_default();
    for path in traces.iter().filter(|_| part != "four") {
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        let trace = Trace::read(path);
        let scale = cp_secs / trace.critical_path(1.0);
        let work = trace.runtime.iter().sum::<f64>() * scale;
        let tmp = tempfile::tempdir().expect("temp dir");
        let farm_dir = tmp.path().join("farm");
        let imported = import_trace(mesh, path, &farm_dir, scale, 0.0);
        let farm = farm_dir.join("farm.toml");
        let def = farmfile::load(&farm, &LoadOptions::default()).expect("the farm loads");
        let sim = Sim::new(&def);
        let cp = sim.critical_path();
        assert!(
            (cp - trace.critical_path(scale)).abs() < 0.01,
            "{name}: the farm's critical path {cp} is the trace's {}",
            trace.critical_path(scale)
        );
        let tasks = sim.len();
        let few = ((work / (2.0 * cp)).ceil() as usize).max(1);
        let greedy = sim.greedy(few, Order::DeepestStage);
        let fifo = sim.greedy(few, Order::Ready);
        let upstream = sim.greedy(few, Order::Upstream);
        println!(
            "\n{name}: {tasks} tasks, {} edges, x {scale:.5}: critical path {cp:.2} s, {work:.1} s of work; at {few} slots greedy {greedy:.2} s (FIFO {fifo:.2} s, upstream first {upstream:.2} s)",
            imported["edges"]
        );
        for (slots, bound, what, target) in [
            (tasks, cp, "critical path", "enough slots"),
            (few, greedy, "greedy (deepest stage first)", "fewer slots"),
        ] {
            let took = run(mesh, &farm, tmp.path(), slots, tasks);
            let ratio = took / bound;
            println!("  mesh run, {slots} slots: {took:.2} s, {ratio:.3} of the {what}");
            results.push(report(
                &format!("{name}: mesh / {what}, {slots} slots ({target})"),
                ratio,
                "ratio",
                Some(("<=", 1.02, ratio <= 1.02)),
            ));
            if let Some(py) = &dask {
                match run_dask(py, path, scale, slots) {
                    Ok(d) => {
                        println!(
                            "  Dask, {slots} slots: {d:.2} s, {:.3} of the {what}",
                            d / bound
                        );
                        results.push(report(
                            &format!("{name}: Dask / {what}, {slots} slots"),
                            d / bound,
                            "ratio",
                            None,
                        ));
                    }
                    Err(e) => println!("  Dask failed: {e}"),
                }
            }
        }
    }
    if part != "one" && apart_possible() {
        for path in &traces {
            results.extend(four_nodes(mesh, path, cp_secs));
        }
    } else if part != "one" {
        println!("\nfour nodes apart: skipped (needs root and `unshare -m`)");
    }
    save("traces", &results);
}

/// The trace with its files on 4 nodes that share no file system, against
/// one node of as many slots: the reports.
fn four_nodes(mesh: &str, path: &Path, cp_secs: f64) -> Vec<Value> {
    let name = path.file_stem().unwrap().to_string_lossy().into_owned();
    let trace = Trace::read(path);
    let scale = cp_secs / trace.critical_path(1.0);
    let work = trace.runtime.iter().sum::<f64>() * scale;
    let few = ((work / (2.0 * trace.critical_path(scale))).ceil() as usize).max(4);
    let per_node = few.div_ceil(4);
    let size_scale = knob("MESH_BENCH_TRACES_MB", 100) as f64 * 1e6 / trace.bytes.max(1.0);
    // Each run in a sandbox of its own: a node that kept the other run's
    // results would reuse them.
    let import = || {
        let sb = Sandbox::new(mesh);
        let farm_dir = sb.path().join("farm");
        import_trace(mesh, path, &farm_dir, scale, size_scale);
        (sb, farm_dir)
    };
    let tasks = trace.runtime.len();
    // The memory the traces recorded is declared, whatever this machine has.
    let one = {
        let (sb, farm_dir) = import();
        let res = format!("cpu={},mem=4096GiB", 4 * per_node);
        let c = Cluster::start(&sb, &[res.as_str()], &[]);
        let (took, _) = submit_wait(&sb, &c, &farm_dir.join("farm.toml"), "out", tasks);
        took
    };
    let (sb, farm_dir) = import();
    let out = sb.path().join("out");
    let hidden: [&Path; 2] = [&farm_dir, &out];
    let res = format!("cpu={per_node},mem=4096GiB");
    let c = Cluster::start_apart(&sb, &[res.as_str(); 4], &[], &hidden);
    let (four, status) = submit_wait(&sb, &c, &farm_dir.join("farm.toml"), "out", tasks);
    let moved: u64 = status["nodes"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|n| n["counters"]["bytes_received"].as_u64().unwrap_or(0))
        .sum();
    let made = folder_bytes(&out);
    // The workflow's own input files, which a node fetches once for the
    // tasks it runs that read them.
    let inputs = folder_bytes(&farm_dir.join("inputs"));
    let ratio = four / one;
    println!(
        "\n{name} with its files ({:.1} MB of outputs, {:.1} MB of inputs), 4 nodes of {per_node} slots apart: {four:.2} s; \
         1 node of {} slots: {one:.2} s; {ratio:.3}; received over the network {:.1} MB ({:.2} of outputs and inputs)",
        made as f64 / 1e6,
        inputs as f64 / 1e6,
        4 * per_node,
        moved as f64 / 1e6,
        moved as f64 / (made + inputs).max(1) as f64
    );
    vec![
        report(
            &format!(
                "{name}: 4 nodes apart / 1 node, {} slots, with files",
                4 * per_node
            ),
            ratio,
            "ratio",
            Some(("<=", 1.15, ratio <= 1.15)),
        ),
        report(
            &format!("{name}: bytes received by the 4 nodes / bytes of outputs and inputs"),
            moved as f64 / (made + inputs).max(1) as f64,
            "ratio",
            None,
        ),
    ]
}

/// `mesh submit --wait` of `farm` on node 0 of `c` into `out`: its wall
/// time, and node 0's `mesh status --latency --json` after.
fn submit_wait(sb: &Sandbox, c: &Cluster, farm: &Path, out: &str, tasks: usize) -> (f64, Value) {
    let out = sb.path().join(out).to_string_lossy().into_owned();
    let start = Instant::now();
    let r = c.mesh(
        0,
        &[
            "submit",
            &farm.to_string_lossy(),
            "--out",
            &out,
            "--wait",
            "--json",
        ],
    );
    let took = start.elapsed().as_secs_f64();
    r.expect_code(0);
    // The submission's line, then the farm's end as one JSON document.
    let end: Value = r
        .stdout
        .split_once('\n')
        .and_then(|(_, rest)| serde_json::from_str(rest).ok())
        .unwrap_or(Value::Null);
    let done = end["counts"]["done"].as_u64().unwrap_or(0);
    assert_eq!(done, tasks as u64, "{}", r.stdout);
    (took, c.mesh(0, &["status", "--latency", "--json"]).json())
}

/// The bytes of every file under `dir`.
fn folder_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => folder_bytes(&e.path()),
            Ok(t) if t.is_file() => e.metadata().map_or(0, |m| m.len()),
            _ => 0,
        })
        .sum()
}

/// `mesh run` of the farm on `slots` cores; its wall time.
fn run(mesh: &str, farm: &Path, tmp: &Path, slots: usize, tasks: usize) -> f64 {
    let state = tmp.join(format!("state-{slots}"));
    let out = tmp.join(format!("out-{slots}"));
    let start = Instant::now();
    let o = user_env(&mut Command::new(mesh))
        .arg("run")
        .arg(farm)
        .arg("--out")
        .arg(&out)
        .args(["--json", "--quiet", "--resources"])
        // The memory the traces recorded is declared, whatever this machine has.
        .arg(format!("cpu={slots},mem=4096GiB"))
        .env("MESH_STATE_DIR", &state)
        .output()
        .expect("run mesh");
    let took = start.elapsed().as_secs_f64();
    assert!(
        o.status.success(),
        "mesh run failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let v: Value = serde_json::from_slice(&o.stdout).expect("--json");
    assert_eq!(v["counts"]["done"], tasks, "{v}");
    took
}

fn dask_python() -> Option<String> {
    let mut tries: Vec<String> = std::env::var("MESH_BENCH_DASK_PYTHON")
        .into_iter()
        .collect();
    tries.push("/tmp/daskvenv/bin/python3".into());
    tries.push("python3".into());
    tries.into_iter().find(|py| {
        user_env(&mut Command::new(py))
            .args(["-c", "import distributed"])
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

fn run_dask(py: &str, trace: &Path, scale: f64, slots: usize) -> Result<f64, String> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../benches/scripts/dask_trace.py");
    let o = user_env(&mut Command::new(py))
        .arg(script)
        .arg(trace)
        .arg(scale.to_string())
        .arg(slots.to_string())
        .output()
        .map_err(|e| e.to_string())?;
    if !o.status.success() {
        return Err(String::from_utf8_lossy(&o.stderr).into_owned());
    }
    let line = String::from_utf8_lossy(&o.stdout);
    let v: Value =
        serde_json::from_str(line.lines().last().unwrap_or("")).map_err(|e| e.to_string())?;
    v["makespan_s"]
        .as_f64()
        .ok_or_else(|| format!("no makespan in {line}"))
}

/// The trace itself (schema 1.5), read here apart from `mesh import`:
/// runtimes and parents, for its critical path.
struct Trace {
    runtime: Vec<f64>,
    parents: Vec<Vec<usize>>,
    /// The bytes of all its files.
    bytes: f64,
}

impl Trace {
    fn read(path: &Path) -> Trace {
        let v: Value = serde_json::from_str(&std::fs::read_to_string(path).expect("read trace"))
            .expect("trace is JSON");
        let spec = v["workflow"]["specification"]["tasks"]
            .as_array()
            .expect("tasks");
        let at: HashMap<&str, usize> = spec
            .iter()
            .enumerate()
            .map(|(i, t)| (t["id"].as_str().unwrap(), i))
            .collect();
        let mut runtime = vec![0.0; spec.len()];
        for e in v["workflow"]["execution"]["tasks"]
            .as_array()
            .expect("execution")
        {
            runtime[at[e["id"].as_str().unwrap()]] = e["runtimeInSeconds"].as_f64().unwrap_or(0.0);
        }
        let mut parents: Vec<HashSet<usize>> = vec![HashSet::new(); spec.len()];
        for (i, t) in spec.iter().enumerate() {
            for p in t["parents"].as_array().into_iter().flatten() {
                parents[i].insert(at[p.as_str().unwrap()]);
            }
            for c in t["children"].as_array().into_iter().flatten() {
                parents[at[c.as_str().unwrap()]].insert(i);
            }
        }
        let bytes = v["workflow"]["specification"]["files"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|f| f["sizeInBytes"].as_f64())
            .sum();
        Trace {
            runtime,
            bytes,
            parents: parents
                .into_iter()
                .map(|p| p.into_iter().collect())
                .collect(),
        }
    }

    /// The longest chain of runtimes x `scale`.
    fn critical_path(&self, scale: f64) -> f64 {
        let n = self.runtime.len();
        let mut finish: Vec<Option<f64>> = vec![None; n];
        // Relaxed until every task is placed: the trace is a DAG.
        while finish.iter().any(Option::is_none) {
            for t in 0..n {
                if finish[t].is_some() {
                    continue;
                }
                let ps: Option<Vec<f64>> = self.parents[t].iter().map(|&p| finish[p]).collect();
                if let Some(ps) = ps {
                    let rounded = (self.runtime[t] * scale * 1e6).round() / 1e6;
                    finish[t] = Some(ps.into_iter().fold(0.0, f64::max) + rounded);
                }
            }
        }
        finish.into_iter().flatten().fold(0.0, f64::max)
    }
}

/// Which ready task a list schedule starts first.
#[derive(Clone, Copy)]
enum Order {
    /// The engine's: the stage with the deepest chain of stages above it,
    /// then the order tasks became ready.
    DeepestStage,
    /// The order tasks became ready.
    Ready,
    /// The task with the shortest chain of tasks above it.
    Upstream,
}

/// The farm's graph as a list of tasks with durations, for list schedules.
struct Sim {
    secs: Vec<f64>,
    parents: Vec<Vec<usize>>,
    children: Vec<Vec<usize>>,
    /// The engine's order of stages: the deepest dependency chain first.
    rank: Vec<(Reverse<usize>, u32)>,
    /// Per task, the longest chain of tasks above it.
    level: Vec<usize>,
}

impl Sim {
    fn new(def: &FarmDef) -> Sim {
        let mut at: HashMap<TaskRef, usize> = HashMap::new();
        let mut refs = Vec::new();
        for (s, st) in def.stages.iter().enumerate() {
            for i in 0..st.len() {
                at.insert(TaskRef::new(s as u32, i), refs.len());
                refs.push(TaskRef::new(s as u32, i));
            }
        }
        let mut depth = vec![0usize; def.stages.len()];
        for _ in 0..def.stages.len() {
            for (i, s) in def.stages.iter().enumerate() {
                for d in s.upstream() {
                    depth[i] = depth[i].max(depth[d as usize] + 1);
                }
            }
        }
        let secs = refs
            .iter()
            .map(|&t| {
                let (_, v) = def
                    .binding(t)
                    .into_iter()
                    .find(|(k, _)| k == "secs")
                    .expect("every task has secs");
                v.parse().expect("secs is a number")
            })
            .collect();
        let parents: Vec<Vec<usize>> = refs
            .iter()
            .map(|&t| {
                (0..)
                    .map_while(|n| def.dependency(t, n))
                    .map(|d| at[&d])
                    .collect()
            })
            .collect();
        let mut children = vec![Vec::new(); refs.len()];
        for (t, ps) in parents.iter().enumerate() {
            for &p in ps {
                children[p].push(t);
            }
        }
        // Tasks come stage by stage, and stages after those they wait for.
        let mut level = vec![0usize; refs.len()];
        for t in 0..refs.len() {
            for &p in &parents[t] {
                level[t] = level[t].max(level[p] + 1);
            }
        }
        Sim {
            secs,
            parents,
            children,
            level,
            rank: refs
                .iter()
                .map(|t| (Reverse(depth[t.stage as usize]), t.stage))
                .collect(),
        }
    }

    fn len(&self) -> usize {
        self.secs.len()
    }

    fn critical_path(&self) -> f64 {
        self.greedy(self.len(), Order::Ready)
    }

    /// A greedy list schedule on `slots` slots: whenever a slot is free,
    /// the first ready task in `order` starts. The makespan, in seconds.
    fn greedy(&self, slots: usize, order: Order) -> f64 {
        let n = self.len();
        let mut waiting: Vec<usize> = self.parents.iter().map(Vec::len).collect();
        let mut ready: BTreeSet<((Reverse<usize>, usize), u64, usize)> = BTreeSet::new();
        let mut seq = 0u64;
        let key = |t: usize| match order {
            Order::DeepestStage => (self.rank[t].0, self.rank[t].1 as usize),
            Order::Ready => (Reverse(0), 0),
            Order::Upstream => (Reverse(0), self.level[t]),
        };
        for t in (0..n).filter(|&t| waiting[t] == 0) {
            ready.insert((key(t), seq, t));
            seq += 1;
        }
        // Running tasks by end time, in microseconds to order them exactly.
        let mut running: BinaryHeap<Reverse<(u64, usize)>> = BinaryHeap::new();
        let mut now = 0u64;
        let mut done = 0;
        while done < n {
            while running.len() < slots {
                let Some(first) = ready.pop_first() else {
                    break;
                };
                let t = first.2;
                running.push(Reverse((now + (self.secs[t] * 1e6).round() as u64, t)));
            }
            let Reverse((end, t)) = running.pop().expect("a task runs while any waits");
            now = end;
            done += 1;
            for &c in &self.children[t] {
                waiting[c] -= 1;
                if waiting[c] == 0 {
                    ready.insert((key(c), seq, c));
                    seq += 1;
                }
            }
        }
        now as f64 / 1e6
    }
}
