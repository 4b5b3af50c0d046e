//! How well `mesh sim --farm` says when a running farm will end: a WfCommons trace from ../shared/workflows imported as sleeps, run on 4 real nodes, simulated from where it stands at 25%, 50% and 75% of its tasks done; predicted / real time left.
//!
//! For each trace (`MESH_BENCH_ETA_TRACES`, comma-separated substrings of
//! file names; default epigenomics and 1000genome):
//! - the time scale makes its critical path last `MESH_BENCH_ETA_SECS`
//!   (30) seconds; 4 real nodes of K slots each (K as in `--bench
//!   accuracy`: slots, not the chain, decide), `mem=4096GiB`;
//! - `mesh submit --wait` of the imported farm on node 0; while it runs,
//!   `mesh status FARM --json` every 100 ms, and at the first look with
//!   25%, 50% and 75% of its tasks done, `mesh sim --farm FARM --json`
//!   (the mesh's own nodes), which reads the farm's state then;
//! - once it ends, the real end is the last task's end in `mesh export`.
//!
//! The figure is (predicted end minus the time the state was read) / (real
//! end minus that time), the p50 of one simulation. Target: within 5%. The same
//! figure for the quick estimate `mesh status` shows (`eta.rs` in the
//! node, from the status read then), and that estimate's own cost on a
//! farm of a million tasks left (two stages of 500,000 on 512 slots):
//! target under a second, and against a same-run baseline, sorting a
//! million runtimes.
//!
//! `cargo bench -p mesh-cli --bench eta`

use std::path::Path;
use std::time::{Duration, Instant, UNIX_EPOCH};

use mesh_benches::{import_trace, knob, report, save, use_user_env, workflow_traces};
use mesh_tests::{Cluster, Sandbox};
use serde_json::Value;

/// Real nodes in every run, and the memory each declares.
const NODES: usize = 4;
const MEM: &str = "4096GiB";
/// The shares of tasks done at which the farm is simulated.
const AT: [f64; 3] = [0.25, 0.50, 0.75];

fn main() {
    use_user_env();
    let mesh = env!("CARGO_BIN_EXE_mesh");
    let cp_secs = knob("MESH_BENCH_ETA_SECS", 30) as f64;
    let mut results = cost();
    let mut traces = workflow_traces("MESH_BENCH_ETA_TRACES").unwrap_or_default();
    if std::env::var("MESH_BENCH_ETA_TRACES").is_err() {
        traces.retain(|p| {
            let p = p.to_string_lossy();
            p.contains("epigenomics") || p.contains("1000genome")
        });
    }
    for path in &traces {
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        for (share, ratio, quick) in eta(mesh, path, cp_secs) {
            results.push(report(
                &format!(
                    "{name}: predicted / real time left, from {:.0}% done",
                    share * 100.0
                ),
                ratio,
                "ratio",
                Some(("|r - 1| <=", 0.05, (ratio - 1.0).abs() <= 0.05)),
            ));
            if let Some(q) = quick {
                results.push(report(
                    &format!(
                        "{name}: status's quick estimate / real time left, from {:.0}% done",
                        share * 100.0
                    ),
                    q,
                    "ratio",
                    None,
                ));
            }
        }
    }
    save("eta", &results);
}

/// The quick estimate's cost on a million tasks left, in ms, and its
/// ratio to sorting a million runtimes in the same run.
fn cost() -> Vec<serde_json::Value> {
    use mesh_node::eta::{estimate, StageLeft};
    let runtimes: Vec<f64> = (0..4096)
        .map(|i| 1000.0 + (i * 7919 % 4096) as f64)
        .collect();
    let stage = |after: Vec<usize>| StageLeft {
        slots: 512,
        after,
        after_each: Vec::new(),
        waiting: 500_000,
        running: 0,
        elapsed: Vec::new(),
        runtimes: runtimes.clone(),
    };
    let stages = [stage(Vec::new()), stage(vec![0])];
    let best = |f: &mut dyn FnMut()| {
        (0..3)
            .map(|_| {
                let t = Instant::now();
                f();
                t.elapsed().as_secs_f64() * 1000.0
            })
            .fold(f64::INFINITY, f64::min)
    };
    let mut runs = 0;
    let took = best(&mut || {
        let e = estimate(&stages, ["a", "b"].into_iter(), 0, 1).expect("an estimate");
        runs = e.runs;
    });
    let sort = best(&mut || {
        let mut v: Vec<f64> = (0..1_000_000u64)
            .map(|i| (i * 2654435761 % 1_000_003) as f64)
            .collect();
        v.sort_by(f64::total_cmp);
        std::hint::black_box(&v);
    });
    println!("quick estimate of 1,000,000 tasks left: {took:.0} ms ({runs} runs); sorting 1,000,000 runtimes: {sort:.0} ms");
    // A deadline queue's plan of 100,000 tasks left that no count of jobs
    // meets: the whole search, to --max 64.
    let small: Vec<StageLeft> = stages
        .iter()
        .map(|s| StageLeft {
            waiting: 50_000,
            slots: 64,
            ..s.clone()
        })
        .collect();
    let one = mesh_protocol::resources::parse_resources("cpu=1").expect("cpu=1");
    let shape = mesh_node::eta::JobShape {
        node: mesh_protocol::resources::parse_resources("cpu=32").expect("cpu=32"),
        nodes_per_job: 1,
        wait_ms: 60_000,
    };
    let nodes = vec![mesh_protocol::resources::parse_resources("cpu=64").expect("cpu=64")];
    let plan_ms = best(&mut || {
        let requests = [one.clone(), one.clone()];
        let work = mesh_node::eta::WorkLeft {
            stages: &small,
            requests: &requests,
            nodes: &nodes,
        };
        let p = mesh_node::eta::plan(work, &shape, 1_000, 64, 1);
        std::hint::black_box(p);
    });
    println!("a deadline plan of 100,000 tasks left, searched to 64 jobs: {plan_ms:.0} ms");
    vec![
        report(
            "the quick estimate of 1,000,000 tasks left",
            took,
            "ms",
            Some(("<", 1000.0, took < 1000.0)),
        ),
        report(
            "the quick estimate / sorting 1,000,000 runtimes",
            took / sort,
            "ratio",
            None,
        ),
        report(
            "a deadline plan of 100,000 tasks left, searched to 64 jobs",
            plan_ms,
            "ms",
            None,
        ),
    ]
}

/// Unix ms of an RFC 3339 time.
fn unix_ms(at: &str) -> u64 {
    humantime::parse_rfc3339(at)
        .expect("an RFC 3339 time")
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_millis() as u64
}

/// A look at the farm: the share done, when `mesh sim --farm` read it and
/// its p50 from then, and the quick estimate `mesh status` showed then
/// (when it was made, and its p50 from then).
type Asked = (f64, u64, u64, Option<(u64, u64)>);

/// The trace run on 4 real nodes, simulated at each share of [`AT`]: each
/// share with its predicted / real time left, and the quick estimate's.
fn eta(mesh: &str, path: &Path, cp_secs: f64) -> Vec<(f64, f64, Option<f64>)> {
    let sb = Sandbox::new(mesh);
    let probe = tempfile::tempdir().expect("a temporary folder");
    let v = import_trace(mesh, path, &probe.path().join("farm"), 1.0, 0.0);
    let cp_s = v["critical_path_s"]["recorded"].as_f64().expect("cp");
    let work_s = v["runtime_s"]["recorded"].as_f64().expect("runtime");
    let tasks = v["tasks"].as_u64().expect("tasks") as f64;
    let scale = cp_secs / cp_s;
    let slots = ((work_s / (2.0 * cp_s) / NODES as f64).ceil() as usize).max(1);
    let farm_dir = sb.path().join("farm");
    import_trace(mesh, path, &farm_dir, scale, 0.0);
    let res = format!("cpu={slots},mem={MEM}");
    let c = Cluster::start(&sb, &[res.as_str(); NODES], &[]);
    let farm = farm_dir.join("farm.toml");
    let out = sb.path().join("out");
    // `mesh import` names the farm after the trace's file.
    let name = path.file_stem().unwrap().to_string_lossy().into_owned();
    println!(
        "\n{}: {tasks} tasks, critical path {cp_s:.1} s x {scale:.5}; {NODES} nodes of {slots} slots",
        path.file_name().unwrap().to_string_lossy()
    );
    let run = c.mesh_start(
        0,
        &[
            "submit",
            &farm.to_string_lossy(),
            "--out",
            &out.to_string_lossy(),
            "--wait",
        ],
    );
    let started = Instant::now();
    let mut asked: Vec<Asked> = Vec::new();
    let mut next = 0;
    while next < AT.len() && started.elapsed() < Duration::from_secs(600) {
        std::thread::sleep(Duration::from_millis(100));
        let s = c.mesh(0, &["status", &name, "--json"]);
        let Ok(st) = serde_json::from_str::<Value>(&s.stdout) else {
            continue;
        };
        let done = st["counts"]["done"].as_f64().unwrap_or(0.0);
        if done / tasks < AT[next] {
            continue;
        }
        let r = c.mesh(0, &["sim", "--farm", &name, "--json"]);
        r.expect_code(0);
        let v: Value = serde_json::from_str(&r.stdout).expect("mesh sim --json");
        let now = v["farm"]["now_ms"].as_u64().expect("now");
        let left = v["farm"]["rows"][0]["finish_p50_ms"].as_u64().expect("p50");
        println!(
            "  at {:.0}% ({done} done): {} to go, predicted {:.2} s",
            AT[next] * 100.0,
            v["farm"]["waiting"],
            left as f64 / 1000.0
        );
        let quick = st["eta"]["at_ms"]
            .as_u64()
            .zip(st["eta"]["p50_ms"].as_u64());
        asked.push((AT[next], now, left, quick));
        next += 1;
    }
    run.wait().expect_code(0);
    let r = c.mesh(0, &["export", &name]);
    r.expect_code(0);
    let trace: Value = serde_json::from_str(&r.stdout).expect("the export");
    let end = trace["workflow"]["execution"]["tasks"]
        .as_array()
        .expect("runs")
        .iter()
        .filter_map(|t| t["endedAt"].as_str())
        .map(unix_ms)
        .max()
        .expect("an end");
    asked
        .into_iter()
        .map(|(share, now, left, quick)| {
            let real = end.saturating_sub(now) as f64;
            let ratio = left as f64 / real;
            let quick = quick.map(|(at, p50)| p50 as f64 / end.saturating_sub(at) as f64);
            println!(
                "  from {:.0}%: predicted {:.2} s, real {:.2} s: {ratio:.3}; status's quick estimate: {}",
                share * 100.0,
                left as f64 / 1000.0,
                real / 1000.0,
                quick.map_or("none".into(), |q| format!("{q:.3}"))
            );
            (share, ratio, quick)
        })
        .collect()
}
