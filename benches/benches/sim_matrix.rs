//! The simulator's matrix of thin and skewed work: mesh against the greedy baseline measured in the same run.
//!
//! 100 nodes x 100,000 tasks and 1,000 nodes x 1,000,000 tasks (knobs
//! `MESH_BENCH_MATRIX_SMALL` and `MESH_BENCH_MATRIX_LARGE`, nodes; tasks are
//! a thousand per node), at the command line's defaults (latency 1-3 ms,
//! membership by SWIM, every peer checked after every step), for each duration
//! law `uniform:1..5`, `exp:10`, `zipf:1.2,50`, `zipf:1.2` and
//! `bimodal:10,500,0.1`, on homogeneous nodes (`cpu=4`) and on a mixed
//! mesh (80% `cpu=4,mem=16GiB`, 15% `cpu=16,mem=64GiB`, 5%
//! `cpu=8,mem=32GiB,gpu=2`; tasks ask `cpu=1,mem=1GiB`). Each row is
//! mesh's makespan over the greedy baseline's (list scheduling with no
//! latency that, like mesh, does not know durations): at most 1.05, and at
//! most 1.02 for the 1,000-node homogeneous `zipf:1.2` row, whose events
//! per second (the command line's `mesh sim --nodes 1000 --tasks 1000000
//! --durations zipf:1.2`) are reported too (target at least 1,000,000).
//!
//! `cargo bench -p mesh-cli --bench sim_matrix`

use mesh_benches::{knob, report, save};
use mesh_sim::{NodeGroup, SimConfig};

/// The allocator `mesh sim` runs with, so events per second are the command's.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const LAWS: [&str; 5] = [
    "uniform:1..5",
    "exp:10",
    "zipf:1.2,50",
    "zipf:1.2",
    "bimodal:10,500,0.1",
];

fn config(nodes: usize, law: &str, mixed: bool) -> SimConfig {
    // As `mesh sim` builds it with no scenario.
    let mut cfg = SimConfig::simple(7, nodes, "cpu=4", nodes as u64 * 1000, law);
    if mixed {
        let big = nodes * 15 / 100;
        let gpu = nodes * 5 / 100;
        cfg.nodes = vec![
            NodeGroup {
                count: nodes - big - gpu,
                resources: "cpu=4,mem=16GiB".into(),
                join_at_ms: 0,
            },
            NodeGroup {
                count: big,
                resources: "cpu=16,mem=64GiB".into(),
                join_at_ms: 0,
            },
            NodeGroup {
                count: gpu,
                resources: "cpu=8,mem=32GiB,gpu=2".into(),
                join_at_ms: 0,
            },
        ];
        cfg.stages[0].resources = "cpu=1,mem=1GiB".into();
    }
    cfg
}

fn main() {
    let sizes = [
        knob("MESH_BENCH_MATRIX_SMALL", 100) as usize,
        knob("MESH_BENCH_MATRIX_LARGE", 1000) as usize,
    ];
    let mut results = Vec::new();
    for nodes in sizes {
        for mixed in [false, true] {
            for law in LAWS {
                let cfg = config(nodes, law, mixed);
                let r = mesh_sim::run(&cfg).unwrap_or_else(|e| panic!("simulation failed: {e}"));
                let ratio = r.makespan as f64 / r.greedy as f64;
                let mut sorted = r.prefetch.clone();
                sorted.sort_unstable();
                let label = format!(
                    "{nodes} nodes {}, {} tasks, {law}: mesh / greedy",
                    if mixed { "mixed" } else { "cpu=4" },
                    r.tasks
                );
                println!(
                    "  makespan {} ms, greedy {} ms, bound {} ms, utilization {:.1}%, prefetch median {}, {:.0} events/s",
                    r.makespan,
                    r.greedy,
                    r.lower_bound,
                    r.utilization * 100.0,
                    sorted.get(sorted.len() / 2).copied().unwrap_or(0),
                    r.events_per_sec
                );
                let target = if nodes == sizes[1] && !mixed && law == "zipf:1.2" {
                    1.02
                } else {
                    1.05
                };
                results.push(report(
                    &label,
                    ratio,
                    "ratio",
                    Some(("<=", target, ratio <= target)),
                ));
                if nodes == sizes[1] && !mixed && law == "zipf:1.2" {
                    results.push(report(
                        &format!(
                            "{nodes} nodes, {} tasks, {law}: events per second, defaults",
                            r.tasks
                        ),
                        r.events_per_sec,
                        "events/s",
                        Some((">=", 1e6, r.events_per_sec >= 1e6)),
                    ));
                }
            }
        }
    }
    save("sim_matrix", &results);
}
