//! How close `mesh sim` comes to a real mesh: each WfCommons trace in ../shared/workflows imported as sleeps, run on 4 real nodes, exported with `mesh export`, and the export replayed by `mesh sim --workflow` on 4 simulated nodes of the same slots: simulated / real makespan.
//!
//! For each trace (`MESH_BENCH_ACCURACY_TRACES`, comma-separated
//! substrings of file names; default all six):
//! - the time scale makes its critical path (the longest chain of
//!   recorded runtimes) last `MESH_BENCH_ACCURACY_SECS` (20) seconds;
//! - 4 real nodes of K slots each, K the summed runtime over twice the
//!   critical path, over 4, at least 1 (so that slots, not the chain,
//!   decide), and `mem=4096GiB` (the memory the traces recorded is
//!   declared whatever this machine has; the simulated nodes get the same);
//! - `mesh submit --wait` of the imported farm on node 0, then
//!   `mesh export FARM -o trace.json` there, then `mesh sim --workflow
//!   trace.json --nodes 4 --cores-per-node K --mem-per-node 4096GiB
//!   --json` at time scale 1: the export's runtimes are the ones each node
//!   measured, already scaled (the sleep plus its shell, `cat` and `head`).
//!
//! Makespans, one definition on both sides: the real one is the export's
//! `makespanInSeconds`, from the first task's start to the last task's
//! end as the nodes recorded them; the simulated one is from the
//! submission to the last task's end, and the first task starts within a
//! few virtual milliseconds of the submission. Neither counts reading and
//! submitting the farm nor the last outputs coming home, which the wall
//! time of `mesh submit --wait` does (printed beside it). Target:
//! |simulated / real - 1| <= 0.05.
//!
//! Beside it, the trace itself simulated at the time scale with no
//! transfer time (`--time-scale S --bandwidth inf`): what a user asks
//! before running, with the recorded runtimes rather than the measured
//! ones; its gap to the export's is what a task costs beyond its sleep.
//!
//! Files apart (as root, where `unshare -m` works): the same with files
//! written at their recorded sizes scaled so that all of a trace's files
//! come to `MESH_BENCH_ACCURACY_MB` (50) MB, every node but the
//! submitter in a mount namespace of its own without the farm's and the
//! outputs' folders, so every byte a task reads comes over the network;
//! simulated with `--bandwidth MESH_BENCH_ACCURACY_BANDWIDTH` (200MB/s:
//! `--bench data` measured 215 MB/s node to node on this machine) and
//! `--latency MESH_BENCH_ACCURACY_LATENCY` (1ms, the simulator's least
//! message latency; a loopback round trip is 0.4 ms). Target within 10%.
//!
//! `MESH_BENCH_ACCURACY_KEEP=DIR` keeps each export there
//! (`NAME.json`, `NAME-apart.json`) for a closer look.
//!
//! `cargo bench -p mesh-cli --bench accuracy`

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use mesh_benches::{import_trace, knob, report, save, use_user_env, user_env, workflow_traces};
use mesh_tests::{apart_possible, Cluster, Sandbox};
use serde_json::Value;

/// Memory every node, real or simulated, declares.
const MEM: &str = "4096GiB";

fn main() {
    use_user_env();
    let mesh = env!("CARGO_BIN_EXE_mesh");
    let cp_secs = knob("MESH_BENCH_ACCURACY_SECS", 20) as f64;
    let mb = knob("MESH_BENCH_ACCURACY_MB", 50) as f64;
    let bandwidth =
        std::env::var("MESH_BENCH_ACCURACY_BANDWIDTH").unwrap_or_else(|_| "200MB/s".into());
    let latency = std::env::var("MESH_BENCH_ACCURACY_LATENCY").unwrap_or_else(|_| "1ms".into());
    let Some(traces) = workflow_traces("MESH_BENCH_ACCURACY_TRACES") else {
        return;
    };
    let apart = apart_possible();
    if !apart {
        println!("files apart: skipped (needs root and `unshare -m`)");
    }
    let links = ["--bandwidth", &bandwidth, "--latency", &latency];
    let mut results = Vec::new();
    for path in &traces {
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        let shape = Shape::of(mesh, path, cp_secs);
        println!(
            "\n{name}: {} tasks, critical path {:.1} s recorded, x {:.5}; {} nodes of {} slots",
            shape.tasks, shape.cp_s, shape.scale, NODES, shape.slots
        );
        let one = accuracy(mesh, path, &shape, None, &links);
        let trace_sim = simulate(
            mesh,
            path,
            shape.slots,
            &[
                "--time-scale",
                &shape.scale.to_string(),
                "--bandwidth",
                "inf",
            ],
        );
        println!(
            "  the trace itself simulated at x {:.5}: {trace_sim:.2} s, {:.3} of the real",
            shape.scale,
            trace_sim / one.real
        );
        results.push(report(
            &format!(
                "{name}: simulated / real makespan, {NODES} x {}",
                shape.slots
            ),
            one.ratio(),
            "ratio",
            Some(("|r - 1| <=", 0.05, (one.ratio() - 1.0).abs() <= 0.05)),
        ));
        results.push(report(
            &format!("{name}: the trace simulated / real makespan"),
            trace_sim / one.real,
            "ratio",
            None,
        ));
        results.push(report(
            &format!("{name}: measured / recorded runtime, summed"),
            one.runtime_s / (shape.work_s * shape.scale),
            "ratio",
            None,
        ));
        if apart {
            let size_scale = mb * 1e6 / shape.bytes.max(1.0);
            let two = accuracy(mesh, path, &shape, Some(size_scale), &links);
            results.push(report(
                &format!(
                    "{name}: simulated / real makespan, files apart, {NODES} x {}",
                    shape.slots
                ),
                two.ratio(),
                "ratio",
                Some(("|r - 1| <=", 0.10, (two.ratio() - 1.0).abs() <= 0.10)),
            ));
        }
    }
    save("accuracy", &results);
}

/// Real nodes in every run.
const NODES: usize = 4;

/// What the bench needs of a trace: its size, and the scales and slots
/// chosen for it.
struct Shape {
    tasks: u64,
    /// Critical path and summed runtime as recorded, in seconds.
    cp_s: f64,
    work_s: f64,
    /// The bytes of all its files, as recorded.
    bytes: f64,
    /// The time scale that makes the critical path last the bench's seconds.
    scale: f64,
    /// Slots per node.
    slots: usize,
}

impl Shape {
    fn of(mesh: &str, path: &Path, cp_secs: f64) -> Shape {
        // `mesh import --json` works out the critical path and summed
        // runtime as the farm has them (an empty farm, thrown away).
        let tmp = tempfile::tempdir().expect("a temporary folder");
        let v = import_trace(mesh, path, &tmp.path().join("farm"), 1.0, 0.0);
        let cp_s = v["critical_path_s"]["recorded"].as_f64().expect("cp");
        let work_s = v["runtime_s"]["recorded"].as_f64().expect("runtime");
        let trace: Value =
            serde_json::from_str(&std::fs::read_to_string(path).expect("read the trace"))
                .expect("the trace is JSON");
        let bytes = trace["workflow"]["specification"]["files"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|f| f["sizeInBytes"].as_f64())
            .sum();
        let slots = ((work_s / (2.0 * cp_s) / NODES as f64).ceil() as usize).max(1);
        Shape {
            tasks: v["tasks"].as_u64().expect("tasks"),
            cp_s,
            work_s,
            bytes,
            scale: cp_secs / cp_s,
            slots,
        }
    }
}

/// One real run and its simulation.
struct Measured {
    /// The export's makespan, seconds.
    real: f64,
    /// The simulation of the export, seconds.
    sim: f64,
    /// The runtimes the nodes measured, summed.
    runtime_s: f64,
}

impl Measured {
    fn ratio(&self) -> f64 {
        self.sim / self.real
    }
}

/// The trace on [`NODES`] real nodes (files empty, or at `size_scale` on
/// nodes apart), exported and simulated.
fn accuracy(
    mesh: &str,
    path: &Path,
    shape: &Shape,
    size_scale: Option<f64>,
    links: &[&str],
) -> Measured {
    let sb = Sandbox::new(mesh);
    let farm_dir = sb.path().join("farm");
    import_trace(
        mesh,
        path,
        &farm_dir,
        shape.scale,
        size_scale.unwrap_or(0.0),
    );
    let farm = farm_dir.join("farm.toml");
    let out = sb.path().join("out");
    let res = format!("cpu={},mem={MEM}", shape.slots);
    let c = match size_scale {
        None => Cluster::start(&sb, &[res.as_str(); NODES], &[]),
        Some(_) => {
            let hidden: [&Path; 2] = [&farm_dir, &out];
            Cluster::start_apart(&sb, &[res.as_str(); NODES], &[], &hidden)
        }
    };
    let start = Instant::now();
    let r = c.mesh(
        0,
        &[
            "submit",
            &farm.to_string_lossy(),
            "--out",
            &out.to_string_lossy(),
            "--wait",
            "--json",
        ],
    );
    let wall = start.elapsed().as_secs_f64();
    r.expect_code(0);
    // The submission's line (the farm's id), then the farm's end.
    let (first, rest) = r.stdout.split_once('\n').expect("two documents");
    let id = serde_json::from_str::<Value>(first).expect("the submission's line")["farm"]
        .as_str()
        .expect("a farm id")
        .to_string();
    let end: Value = serde_json::from_str(rest).unwrap_or(Value::Null);
    assert_eq!(end["counts"]["done"].as_u64(), Some(shape.tasks), "{rest}");
    let exported = sb.path().join("export.json");
    c.mesh(0, &["export", &id, "-o", &exported.to_string_lossy()])
        .expect_code(0);
    let v: Value =
        serde_json::from_str(&std::fs::read_to_string(&exported).expect("read the export"))
            .expect("the export is JSON");
    let exec = &v["workflow"]["execution"];
    let real = exec["makespanInSeconds"].as_f64().expect("a makespan");
    let runs = exec["tasks"].as_array().expect("runs");
    assert_eq!(runs.len() as u64, shape.tasks, "every task has its run");
    let runtime_s = runs
        .iter()
        .map(|t| t["runtimeInSeconds"].as_f64().unwrap_or(0.0))
        .sum();
    let sim = simulate(mesh, &exported, shape.slots, links);
    if let Ok(keep) = std::env::var("MESH_BENCH_ACCURACY_KEEP") {
        let name = path.file_stem().unwrap().to_string_lossy();
        let tail = if size_scale.is_some() { "-apart" } else { "" };
        std::fs::create_dir_all(&keep).expect("make MESH_BENCH_ACCURACY_KEEP");
        std::fs::copy(
            &exported,
            Path::new(&keep).join(format!("{name}{tail}.json")),
        )
        .expect("keep the export");
    }
    let what = match size_scale {
        None => "files empty".to_string(),
        Some(z) => format!("files x {z:.2e}, nodes apart"),
    };
    println!(
        "  {what}: real {real:.2} s (submit --wait {wall:.2} s), simulated {sim:.2} s: {:.3}; runtimes measured {runtime_s:.1} s of {:.1} s slept",
        sim / real,
        shape.work_s * shape.scale
    );
    Measured {
        real,
        sim,
        runtime_s,
    }
}

/// `mesh sim --workflow TRACE` on [`NODES`] nodes of `slots`: its makespan
/// in seconds.
fn simulate(mesh: &str, trace: &Path, slots: usize, extra: &[&str]) -> f64 {
    let o = user_env(&mut Command::new(mesh))
        .args(["sim", "--workflow"])
        .arg(trace)
        .args([
            "--nodes",
            &NODES.to_string(),
            "--cores-per-node",
            &slots.to_string(),
            "--mem-per-node",
            MEM,
            "--json",
        ])
        .args(extra)
        .output()
        .expect("run mesh sim");
    assert!(
        o.status.success(),
        "mesh sim --workflow {}: {}",
        trace.display(),
        String::from_utf8_lossy(&o.stderr)
    );
    let v: Value = serde_json::from_slice(&o.stdout).expect("mesh sim --json");
    v["rows"][0]["runs"][0]["makespan_ms"]
        .as_f64()
        .expect("a makespan")
        / 1000.0
}
