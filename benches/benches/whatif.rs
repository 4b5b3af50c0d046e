//! `mesh sim --workflow` at size: a 100,000-task trace made by repeating a real trace's shape, replayed on 1,000 nodes: wall time and peak memory of the command, and its makespan against the bound and the greedy baseline.
//!
//! The trace (`MESH_BENCH_WHATIF_TRACE`, a substring of a file name in
//! ../shared/workflows; default epigenomics, 445 tasks) is repeated until
//! it has `MESH_BENCH_WHATIF_TASKS` (100,000) tasks: each copy's tasks and
//! the files they make get their own ids, and every copy reads the same
//! input files (the same workflow run on the same data many times over),
//! so the graph is the trace's many times over and the farm's inputs stay
//! the trace's. The copy is written as WfFormat 1.5 in a temporary folder
//! and run as `mesh sim --workflow BIG.json --nodes N --json`
//! (`MESH_BENCH_WHATIF_NODES`, 1,000) in a fresh process: its wall time
//! (reading the trace, planning and checking the farm, the simulation),
//! that of reading and checking alone (a run with a deadline no count can
//! meet, refused before anything is simulated), and the peak resident
//! memory (the largest of the children waited for).
//!
//! `cargo bench -p mesh-cli --bench whatif`

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use mesh_benches::{knob, report, save};
use serde_json::{json, Value};

fn main() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/workflows");
    let want = std::env::var("MESH_BENCH_WHATIF_TRACE").unwrap_or_else(|_| "epigenomics".into());
    let Some(source) = std::fs::read_dir(&dir).ok().and_then(|entries| {
        entries.filter_map(|e| e.ok().map(|e| e.path())).find(|p| {
            let name = p.file_name().unwrap_or_default().to_string_lossy();
            name.contains(&want) && name.ends_with("-001.json")
        })
    }) else {
        println!("skipped: no trace matching `{want}` at {}", dir.display());
        return;
    };
    let tasks_wanted = knob("MESH_BENCH_WHATIF_TASKS", 100_000) as usize;
    let nodes = knob("MESH_BENCH_WHATIF_NODES", 1000);
    let trace: Value =
        serde_json::from_str(&std::fs::read_to_string(&source).expect("read the trace"))
            .expect("the trace is JSON");
    let (big, tasks) = repeat(&trace, tasks_wanted);
    let tmp = tempfile::tempdir().expect("a temporary folder");
    let path = tmp.path().join("big.json");
    std::fs::write(&path, serde_json::to_vec(&big).expect("JSON")).expect("write the trace");
    println!(
        "whatif: {} x {} = {tasks} tasks on {nodes} nodes",
        source.file_name().unwrap_or_default().to_string_lossy(),
        tasks / trace_tasks(&trace).len()
    );

    let mesh = env!("CARGO_BIN_EXE_mesh");
    // A deadline under the critical path is refused before anything is
    // simulated: this run is reading, planning and checking the trace alone.
    let start = Instant::now();
    let load = Command::new(mesh)
        .args(["sim", "--workflow"])
        .arg(&path)
        .args(["--deadline", "1ms"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("run mesh sim");
    let load_s = start.elapsed().as_secs_f64();
    assert_eq!(load.code(), Some(1), "refused, as no count can meet it");
    let start = Instant::now();
    let out = Command::new(mesh)
        .args(["sim", "--workflow"])
        .arg(&path)
        .args(["--nodes", &nodes.to_string(), "--json"])
        .stderr(Stdio::inherit())
        .output()
        .expect("run mesh sim");
    let wall = start.elapsed().as_secs_f64();
    assert!(out.status.success(), "mesh sim --workflow failed");
    let peak_kib = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_CHILDREN)
        .expect("getrusage")
        .max_rss();
    let v: Value = serde_json::from_slice(&out.stdout).expect("mesh sim --json");
    let run = &v["rows"][0]["runs"][0];
    let makespan = run["makespan_ms"].as_f64().expect("makespan");
    let greedy = run["greedy_ms"].as_f64().expect("greedy");
    let bound = run["lower_bound_ms"].as_f64().expect("bound");
    assert_eq!(run["tasks_done"].as_u64(), Some(tasks as u64));
    let results = vec![
        report("tasks", tasks as f64, "tasks", None),
        report("nodes", nodes as f64, "nodes", None),
        report(
            "wall time: reading and checking the trace",
            load_s,
            "s",
            None,
        ),
        report("wall time: the whole command", wall, "s", None),
        report("peak memory", peak_kib as f64 * 1024.0 / 1e9, "GB", None),
        report("virtual makespan", makespan / 1000.0, "s", None),
        report("makespan / lower bound", makespan / bound, "x", None),
        report("makespan / greedy", makespan / greedy, "x", None),
        report(
            "utilization",
            run["utilization"].as_f64().unwrap_or(0.0) * 100.0,
            "%",
            None,
        ),
    ];
    save("whatif", &results);
}

fn trace_tasks(v: &Value) -> &Vec<Value> {
    v["workflow"]["specification"]["tasks"]
        .as_array()
        .expect("a WfFormat 1.5 trace")
}

/// The trace repeated until it has at least `want` tasks: copy `k` names
/// its tasks and the files they make `ID~k`; files no task makes are
/// shared by every copy.
fn repeat(v: &Value, want: usize) -> (Value, usize) {
    let spec_tasks = trace_tasks(v);
    let copies = want.div_ceil(spec_tasks.len()).max(1);
    let made: std::collections::HashSet<&str> = spec_tasks
        .iter()
        .flat_map(|t| t["outputFiles"].as_array().into_iter().flatten())
        .filter_map(Value::as_str)
        .collect();
    let files = v["workflow"]["specification"]["files"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let exec = v["workflow"]["execution"]["tasks"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let rename = |s: &Value, k: usize| json!(format!("{}~{k}", s.as_str().unwrap_or("")));
    let file = |s: &Value, k: usize| {
        if made.contains(s.as_str().unwrap_or("")) {
            rename(s, k)
        } else {
            s.clone()
        }
    };
    let (mut t_out, mut e_out, mut f_out) = (Vec::new(), Vec::new(), Vec::new());
    for f in &files {
        if !made.contains(f["id"].as_str().unwrap_or("")) {
            f_out.push(f.clone());
        }
    }
    for k in 0..copies {
        for t in spec_tasks {
            let mut t = t.clone();
            for key in ["id", "name"] {
                t[key] = rename(&t[key], k);
            }
            for key in ["parents", "children"] {
                let list: Vec<Value> = t[key]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|p| rename(p, k))
                    .collect();
                t[key] = json!(list);
            }
            for key in ["inputFiles", "outputFiles"] {
                let list: Vec<Value> = t[key]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|f| file(f, k))
                    .collect();
                t[key] = json!(list);
            }
            t_out.push(t);
        }
        for e in &exec {
            let mut e = e.clone();
            e["id"] = rename(&e["id"], k);
            e_out.push(e);
        }
        for f in files
            .iter()
            .filter(|f| made.contains(f["id"].as_str().unwrap_or("")))
        {
            let mut f = f.clone();
            f["id"] = rename(&f["id"], k);
            f_out.push(f);
        }
    }
    let n = t_out.len();
    let mut big = v.clone();
    big["name"] = json!(format!(
        "{} x {copies}",
        v["name"].as_str().unwrap_or("trace")
    ));
    big["workflow"]["specification"]["tasks"] = json!(t_out);
    big["workflow"]["specification"]["files"] = json!(f_out);
    big["workflow"]["execution"]["tasks"] = json!(e_out);
    (big, n)
}
