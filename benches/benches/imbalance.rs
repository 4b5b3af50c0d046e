//! Load imbalance: the real 4-node case and the 1000-node simulation, each against its lower bound.
//!
//! Real: 4 `mesh` nodes on loopback with 2 slots each, a farm of 20 tasks of
//! 0.5 s and 180 of 0.01 s (11.8 s of work, lower bound 1.475 s) placed on one
//! node on purpose (a huge prefetch); the others must steal. Reported as
//! makespan over the lower bound, with stealing (median of
//! `MESH_BENCH_REPEAT`, 3) and without (target at most 1.05 with stealing).
//!
//! Simulated: `MESH_BENCH_SIM_NODES` (1000) nodes of mixed resource vectors
//! and `MESH_BENCH_SIM_TASKS` (1,000,000) tasks with zipf durations: makespan
//! over the lower bound (target at most 1.05) and events per second (target
//! at least 1,000,000; the median of `MESH_BENCH_SIM_REPEAT`, 3, runs, which
//! replay the same events), and those events per second over the same
//! runs with the full pass over every task added every 1,000th step (what
//! this benchmark measured before every step was checked on what it
//! changed). Also reported, from the same run: the greedy
//! baseline (list scheduling with no latency that, like mesh, does not know
//! durations) over the bound, which shows how much of the ratio not knowing
//! durations costs by itself; the same scheduler knowing durations, longest
//! first, over the bound (about 1: the bound is tight); and mesh's makespan
//! over the greedy baseline.
//!
//! `cargo bench -p mesh-cli --bench imbalance`

use mesh_benches::{knob, report, save};
use mesh_sim::{NodeGroup, SimConfig};
use mesh_tests::{imbalanced_makespan, Sandbox};

/// The allocator `mesh sim` runs with, so events per second are the command's.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const LOWER_BOUND_S: f64 = 1.475;

fn main() {
    let mut results = Vec::new();
    let repeat = knob("MESH_BENCH_REPEAT", 3) as usize;
    let sandbox = || Sandbox::new(env!("CARGO_BIN_EXE_mesh"));
    let mut with: Vec<f64> = (0..repeat)
        .map(|_| imbalanced_makespan(&sandbox(), true))
        .collect();
    with.sort_by(f64::total_cmp);
    let without = imbalanced_makespan(&sandbox(), false);
    println!("real 4 nodes: with stealing {with:.2?} s, without {without:.2} s");
    let r = with[with.len() / 2] / LOWER_BOUND_S;
    results.push(report(
        "real 4 nodes, stealing: makespan / bound",
        r,
        "ratio",
        Some(("<=", 1.05, r <= 1.05)),
    ));
    results.push(report(
        "real 4 nodes, no stealing: makespan / bound",
        without / LOWER_BOUND_S,
        "ratio",
        None,
    ));

    let nodes = knob("MESH_BENCH_SIM_NODES", 1000) as usize;
    let tasks = knob("MESH_BENCH_SIM_TASKS", 1_000_000);
    let mut cfg = SimConfig::simple(42, nodes, "cpu=4", tasks, "zipf:1.2");
    cfg.nodes = vec![
        NodeGroup {
            count: nodes * 8 / 10,
            resources: "cpu=4,mem=16GiB".into(),
            join_at_ms: 0,
        },
        NodeGroup {
            count: nodes * 15 / 100,
            resources: "cpu=16,mem=64GiB".into(),
            join_at_ms: 0,
        },
        NodeGroup {
            count: nodes - nodes * 8 / 10 - nodes * 15 / 100,
            resources: "cpu=8,mem=32GiB,gpu=2".into(),
            join_at_ms: 0,
        },
    ];
    cfg.stages[0].resources = "cpu=1,mem=1GiB".into();
    // Scheduling alone, as before farms' outputs were simulated: the home
    // fetching a million outputs is not what this measures.
    cfg.outputs = false;
    // The GPU nodes are known before the farm arrives.
    cfg.submit_at_ms = 1000;
    println!("simulated: {nodes} nodes, {tasks} tasks, zipf:1.2");
    let sim_repeat = knob("MESH_BENCH_SIM_REPEAT", 3).max(1) as usize;
    // Each run alternates with one that adds the full pass over every task
    // every 1,000th step, as this benchmark ran before every step was
    // checked on what it changed: what checking everything costs, measured
    // side by side (a process's first run is slower: its memory is new).
    let mut sparse = cfg.clone();
    sparse.check_every = 1000;
    let mut sparse_rates = Vec::new();
    let runs: Result<Vec<_>, mesh_sim::SimError> = (0..sim_repeat)
        .map(|_| {
            let r = mesh_sim::run(&cfg)?;
            sparse_rates.push(mesh_sim::run(&sparse)?.events_per_sec);
            Ok(r)
        })
        .collect();
    match runs {
        Ok(runs) => {
            // A run replays exactly: only the wall time differs between them.
            let mut rates: Vec<f64> = runs.iter().map(|r| r.events_per_sec).collect();
            rates.sort_by(f64::total_cmp);
            let events_per_sec = rates[rates.len() / 2];
            let rep = &runs[0];
            print!("{}", rep.summary());
            println!("events per second over {sim_repeat} runs: {rates:.0?}");
            results.push(report(
                "sim makespan / lower bound",
                rep.ratio,
                "ratio",
                Some(("<=", 1.05, rep.ratio <= 1.05)),
            ));
            results.push(report(
                "sim greedy baseline (no latency, durations unknown) / lower bound",
                rep.greedy_ratio,
                "ratio",
                None,
            ));
            results.push(report(
                "sim longest first, knowing durations (no latency) / lower bound",
                rep.longest_first_ratio,
                "ratio",
                None,
            ));
            results.push(report(
                "sim makespan / greedy baseline",
                rep.makespan as f64 / rep.greedy as f64,
                "ratio",
                None,
            ));
            results.push(report(
                "sim events per second",
                events_per_sec,
                "events/s",
                Some((">=", 1e6, events_per_sec >= 1e6)),
            ));
            sparse_rates.sort_by(f64::total_cmp);
            println!("with the full pass every 1000th step: {sparse_rates:.0?}");
            results.push(report(
                "sim events per second, every step checked / full pass every 1000th step",
                events_per_sec / sparse_rates[sparse_rates.len() / 2],
                "ratio",
                None,
            ));
        }
        Err(e) => panic!("simulation failed: {e}"),
    }
    save("imbalance", &results);
}
