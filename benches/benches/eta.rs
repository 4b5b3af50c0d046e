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
//! The figure is (predicted end - the time the state was read) / (real end
//! - that time), the p50 of one simulation. Target: within 5%.
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
    let Some(mut traces) = workflow_traces("MESH_BENCH_ETA_TRACES") else {
        return;
    };
    if std::env::var("MESH_BENCH_ETA_TRACES").is_err() {
        traces.retain(|p| {
            let p = p.to_string_lossy();
            p.contains("epigenomics") || p.contains("1000genome")
        });
    }
    let mut results = Vec::new();
    for path in &traces {
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        for (share, ratio) in eta(mesh, path, cp_secs) {
            results.push(report(
                &format!(
                    "{name}: predicted / real time left, from {:.0}% done",
                    share * 100.0
                ),
                ratio,
                "ratio",
                Some(("|r - 1| <=", 0.05, (ratio - 1.0).abs() <= 0.05)),
            ));
        }
    }
    save("eta", &results);
}

/// Unix ms of an RFC 3339 time.
fn unix_ms(at: &str) -> u64 {
    humantime::parse_rfc3339(at)
        .expect("an RFC 3339 time")
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_millis() as u64
}

/// The trace run on 4 real nodes, simulated at each share of [`AT`]: each
/// share with its predicted / real time left.
fn eta(mesh: &str, path: &Path, cp_secs: f64) -> Vec<(f64, f64)> {
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
    let mut asked: Vec<(f64, u64, u64)> = Vec::new();
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
        asked.push((AT[next], now, left));
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
        .map(|(share, now, left)| {
            let real = end.saturating_sub(now) as f64;
            let ratio = left as f64 / real;
            println!(
                "  from {:.0}%: predicted {:.2} s, real {:.2} s: {ratio:.3}",
                share * 100.0,
                left as f64 / 1000.0,
                real / 1000.0
            );
            (share, ratio)
        })
        .collect()
}
