//! What a node's share of the mesh costs as the mesh grows, in the simulator: messages and bytes per node per second at 100, 1,000 and 2,000 nodes.
//!
//! Each size runs the membership (SWIM) and the peers the real node runs,
//! at the command line's defaults, `cpu=4` nodes and a thousand
//! `zipf:1.2` tasks per node up to a million in all (from 1,000 nodes on,
//! a million tasks, as the 10,000-node target has it). The nodes all start at 0 and the farm is
//! submitted at 30 s of virtual time, once the mesh has formed, so the
//! figures are those of a formed mesh at work: every message a node sends
//! during the farm (task traffic, reports, membership), per node per
//! second of the farm, with its postcard size. The ratio to the smallest
//! size, measured in the same run, is the target (at most 1.5), as is
//! mesh's makespan over the greedy baseline (at most 1.03).
//!
//! The sizes are `MESH_BENCH_SCALE_NODES` (`100,1000,2000`; 4,000 takes
//! 6 minutes and 7.5 GB here). 10,000 does not fit this machine: every
//! simulated node holds the whole membership, and foca's member table is a
//! vector searched once per update, so the simulator (all N nodes in one
//! process) pays N² memory (some 470 bytes per pair: 47 GB at 10,000) and
//! between N² and N³ work while the mesh forms; see ARCHITECTURE.md.
//!
//! `cargo bench -p mesh-cli --bench sim_scale`

use mesh_benches::{report, save};
use mesh_sim::SimConfig;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    let sizes: Vec<usize> = std::env::var("MESH_BENCH_SCALE_NODES")
        .unwrap_or_else(|_| "100,1000,2000".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let mut results = Vec::new();
    let mut base: Option<(f64, f64, f64)> = None;
    for &nodes in &sizes {
        let tasks = (nodes as u64 * 1000).min(1_000_000);
        let mut cfg = SimConfig::simple(7, nodes, "cpu=4", tasks, "zipf:1.2");
        cfg.submit_at_ms = 30_000;
        let r = mesh_sim::run(&cfg).unwrap_or_else(|e| panic!("simulation failed: {e}"));
        let t = &r.traffic_farm;
        let msgs = t.per_node_per_s(t.messages, nodes);
        let bytes = t.per_node_per_s(t.bytes, nodes);
        let swim = t.per_node_per_s(t.swim_messages, nodes);
        println!(
            "  {nodes} nodes: makespan {} ms, greedy {} ms; per node per s: {msgs:.1} messages, {bytes:.0} bytes, of them membership {swim:.2} ({:.0} bytes); {:.1} s wall",
            r.makespan,
            r.greedy,
            t.per_node_per_s(t.swim_bytes, nodes),
            r.wall_ms / 1000.0
        );
        let ratio = r.makespan as f64 / r.greedy as f64;
        results.push(report(
            &format!("{nodes} nodes: mesh / greedy"),
            ratio,
            "ratio",
            Some(("<=", 1.03, ratio <= 1.03)),
        ));
        results.push(report(
            &format!("{nodes} nodes: messages per node per s"),
            msgs,
            "msg/s",
            None,
        ));
        results.push(report(
            &format!("{nodes} nodes: bytes per node per s"),
            bytes,
            "B/s",
            None,
        ));
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
    save("sim_scale", &results);
}
