//! The simulator as the mesh grows: speed at the command line's defaults, and, per size, a node's traffic, the makespan against greedy, wall time and peak memory per member pair.
//!
//! Every run is `mesh sim` in a fresh process (the binary users run, with
//! its allocator), so its wall time and peak resident memory (which it
//! reports) are the command's own:
//!
//! 1. `mesh sim --nodes 1000 --tasks 1000000 --durations zipf:1.2` at the
//!    defaults (every invariant checked after every step), each run a
//!    fresh process, `MESH_BENCH_SIM_REPEAT` (3) times: the median events
//!    per second (target at least 1,000,000), wall time (at most 8 s) and
//!    peak memory. The runs replay the same events; only the machine's
//!    speed differs between them (a shared machine's changes from minute
//!    to minute, which a single run mixed into the figure).
//! 2. Each size of `MESH_BENCH_SCALE_NODES` (`100,1000,2000,4000,10000`):
//!    `cpu=4` nodes, a thousand `zipf:1.2` tasks per node up to a million,
//!    submitted at 90 s of virtual time, once the mesh has formed (10,000
//!    nodes take some 50 s), so the farm's figures are those of a formed
//!    mesh at work. Per node per
//!    second of the farm: messages, bytes, and membership messages (SWIM
//!    and rosters), each as a ratio to the smallest size (target at most
//!    1.5); mesh's makespan over the greedy baseline (at most 1.03); wall
//!    time (10,000 nodes: at most 10 minutes); peak memory (10,000 nodes:
//!    at most 12 GB), that peak over N², and what a member pair costs:
//!    the growth of the peak over the first size of a million tasks, per
//!    pair added (every simulated node holds every other as a member).
//! 3. `sim/scenarios/mass-crash.toml` at its 10,000 nodes: a mass start,
//!    2,000 tasks at 60 s and the coordinator killed for good at 62 s.
//!    Every task home, one mesh at the end around another coordinator
//!    (asserted, as sim/tests/scale.rs does at 2,000 nodes in CI); wall
//!    time and peak memory. Memory-bound (10⁸ members), so its wall time
//!    follows what the machine's neighbours do to its caches: 7.5 to 33
//!    minutes seen on this 2-core machine. `MESH_BENCH_MASS_CRASH=0`
//!    leaves it out.
//!
//! `cargo bench -p mesh-cli --bench sim_scale`

use std::process::{Command, Stdio};
use std::time::Instant;

use mesh_benches::{knob, report, save};
use serde_json::Value;

/// Runs `mesh sim` with `args`, returning its JSON report, its wall time
/// in seconds and its peak resident memory in bytes (as it reports it).
fn sim(args: &[&str]) -> (Value, f64, u64) {
    let mesh = env!("CARGO_BIN_EXE_mesh");
    let start = Instant::now();
    let out = Command::new(mesh)
        .arg("sim")
        .args(args)
        .arg("--json")
        .stderr(Stdio::inherit())
        .output()
        .expect("run mesh sim");
    let wall = start.elapsed().as_secs_f64();
    assert!(out.status.success(), "mesh sim {args:?} failed");
    let r: Value = serde_json::from_slice(&out.stdout).expect("mesh sim --json");
    let peak = r["peak_rss_bytes"]
        .as_u64()
        .expect("mesh sim reports its peak memory (Linux)");
    (r, wall, peak)
}

fn f(v: &Value, key: &str) -> f64 {
    v[key]
        .as_f64()
        .unwrap_or_else(|| panic!("no {key} in the report"))
}

fn per_node_per_s(traffic: &Value, key: &str, nodes: usize) -> f64 {
    f(traffic, key) / nodes as f64 / (f(traffic, "span_ms").max(1.0) / 1000.0)
}

fn main() {
    let mut results = Vec::new();
    at_the_defaults(&mut results);
    as_the_mesh_grows(&mut results);
    if knob("MESH_BENCH_MASS_CRASH", 1) != 0 {
        mass_crash(&mut results);
    }
    save("sim_scale", &results);
}

/// Part 1: a thousand nodes and a million tasks at the command line's
/// defaults, in fresh processes: events per second, wall time, peak memory.
fn at_the_defaults(results: &mut Vec<Value>) {
    println!("sim_scale: mesh sim --nodes 1000 --tasks 1000000 --durations zipf:1.2, defaults");
    let repeat = knob("MESH_BENCH_SIM_REPEAT", 3).max(1) as usize;
    let mut runs: Vec<(f64, f64, u64)> = Vec::new();
    for _ in 0..repeat {
        let (r, wall, peak) = sim(&[
            "--nodes",
            "1000",
            "--tasks",
            "1000000",
            "--durations",
            "zipf:1.2",
            "--seed",
            "7",
        ]);
        let rate = f(&r, "events_per_sec");
        println!(
            "  {} events, makespan {} ms, greedy {} ms: {rate:.0} events/s, {wall:.1} s, peak {:.2} GB",
            r["events"],
            r["makespan"],
            r["greedy"],
            peak as f64 / 1e9
        );
        runs.push((rate, wall, peak));
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let rate = median(runs.iter().map(|r| r.0).collect());
    let wall = median(runs.iter().map(|r| r.1).collect());
    let peak = runs.iter().map(|r| r.2).max().unwrap_or(0);
    results.push(report(
        "1000 x 1M defaults: events per second (median of fresh runs)",
        rate,
        "events/s",
        Some((">=", 1e6, rate >= 1e6)),
    ));
    results.push(report(
        "1000 x 1M defaults: wall time (median)",
        wall,
        "s",
        Some(("<=", 8.0, wall <= 8.0)),
    ));
    results.push(report(
        "1000 x 1M defaults: peak memory",
        peak as f64 / 1e6,
        "MB",
        None,
    ));
}

/// Part 2: each size of `MESH_BENCH_SCALE_NODES`, a formed mesh at work: a
/// node's traffic against the smallest size's, the makespan against
/// greedy, wall time, and peak memory per member pair.
fn as_the_mesh_grows(results: &mut Vec<Value>) {
    let sizes: Vec<usize> = std::env::var("MESH_BENCH_SCALE_NODES")
        .unwrap_or_else(|_| "100,1000,2000,4000,10000".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let dir = tempfile::tempdir().expect("temp dir");
    let mut base: Option<(f64, f64, f64)> = None;
    // The first size that runs the full million tasks: what a member pair
    // costs is the growth in peak memory over it, per pair added (the
    // farm's own state is the same at every size from there on).
    let mut million: Option<(usize, u64)> = None;
    for &nodes in &sizes {
        let tasks = (nodes as u64 * 1000).min(1_000_000);
        let scenario = dir.path().join(format!("scale-{nodes}.toml"));
        std::fs::write(
            &scenario,
            format!(
                "seed = 7\nsubmit_at_ms = 90000\n[[nodes]]\ncount = {nodes}\nresources = \"cpu=4\"\n\
                 [[stages]]\nname = \"work\"\ntasks = {tasks}\ndurations = \"zipf:1.2\"\n"
            ),
        )
        .expect("write scenario");
        let (r, wall, peak) = sim(&[scenario.to_str().expect("utf-8 path")]);
        let t = &r["traffic_farm"];
        let msgs = per_node_per_s(t, "messages", nodes);
        let bytes = per_node_per_s(t, "bytes", nodes);
        let swim = per_node_per_s(t, "swim_messages", nodes);
        let ratio = f(&r, "makespan") / f(&r, "greedy");
        let pair = peak as f64 / (nodes as f64 * nodes as f64);
        println!(
            "  {nodes} nodes x {tasks} tasks: {wall:.1} s, peak {:.2} GB ({pair:.0} bytes a member pair); \
             per node per s: {msgs:.1} messages, {bytes:.0} bytes, of them membership {swim:.2}; \
             makespan / greedy {ratio:.3}; {} events",
            peak as f64 / 1e9,
            r["events"]
        );
        results.push(report(
            &format!("{nodes} nodes: mesh / greedy"),
            ratio,
            "ratio",
            Some(("<=", 1.03, ratio <= 1.03)),
        ));
        let big = nodes >= 10_000;
        results.push(report(
            &format!("{nodes} nodes: wall time"),
            wall,
            "s",
            big.then_some(("<=", 600.0, wall <= 600.0)),
        ));
        results.push(report(
            &format!("{nodes} nodes: peak memory"),
            peak as f64 / 1e9,
            "GB",
            big.then_some(("<=", 12.0, peak as f64 <= 12e9)),
        ));
        if nodes >= 1000 {
            results.push(report(
                &format!("{nodes} nodes: peak memory / N²"),
                pair,
                "B",
                None,
            ));
        }
        match million {
            None if tasks == 1_000_000 => million = Some((nodes, peak)),
            Some((n0, p0)) => {
                let added = (nodes * nodes - n0 * n0) as f64;
                results.push(report(
                    &format!("{nodes} nodes: memory per member pair, over {n0} nodes"),
                    peak.saturating_sub(p0) as f64 / added,
                    "B",
                    None,
                ));
            }
            None => {}
        }
        results.push(report(
            &format!("{nodes} nodes: membership messages per node per s"),
            swim,
            "msg/s",
            None,
        ));
        match base {
            None => base = Some((msgs, bytes, swim)),
            Some((m0, b0, s0)) => {
                let first = sizes[0];
                for (what, v, v0) in [
                    ("messages", msgs, m0),
                    ("bytes", bytes, b0),
                    ("membership messages", swim, s0),
                ] {
                    let ratio = v / v0;
                    results.push(report(
                        &format!("{what} per node per s, {nodes} / {first} nodes"),
                        ratio,
                        "ratio",
                        Some(("<=", 1.5, ratio <= 1.5)),
                    ));
                }
            }
        }
    }
}

/// Part 3: the mass start that loses its coordinator, at the scenario's
/// 10,000 nodes, in a fresh process.
fn mass_crash(results: &mut Vec<Value>) {
    let scenario = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../sim/scenarios/mass-crash.toml"
    );
    println!("sim_scale: mesh sim sim/scenarios/mass-crash.toml (10,000 nodes)");
    let (r, wall, peak) = sim(&[scenario]);
    let coordinators: Vec<u64> = r["coordinators"]
        .as_array()
        .expect("coordinators in the report")
        .iter()
        .filter_map(Value::as_u64)
        .collect();
    println!(
        "  {} events, {wall:.0} s, peak {:.2} GB; {} of 2000 tasks done, one mesh since {} ms, coordinated by {coordinators:?}",
        r["events"],
        peak as f64 / 1e9,
        r["tasks_done"],
        r["one_mesh_ms"]
    );
    assert_eq!(r["tasks_done"].as_u64(), Some(2000), "every task home");
    assert!(r["one_mesh_ms"].is_u64(), "one mesh at the end");
    assert!(
        coordinators.contains(&0) && coordinators.iter().any(|&c| c != 0),
        "node 0 coordinated, and another after it died: {coordinators:?}"
    );
    results.push(report(
        "mass crash, 10,000 nodes: wall time",
        wall,
        "s",
        None,
    ));
    results.push(report(
        "mass crash, 10,000 nodes: peak memory",
        peak as f64 / 1e9,
        "GB",
        None,
    ));
}
