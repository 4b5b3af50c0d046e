//! The mesh on loopback: scale-out over 1, 2 and 4 nodes, and dispatch latency percentiles.
//!
//! Scale-out: each node offers 2 slots (`--resources cpu=2`) and the farm has
//! `MESH_BENCH_PER_NODE` (100) tasks of `sleep 0.05` per node, submitted on
//! the last node to join (not the coordinator) and followed with `--wait`.
//! The ratio is N-node throughput over N times the 1-node throughput,
//! measured in the same run (target at least 0.9).
//!
//! Latency: `MESH_BENCH_LATENCY` (40) one-task farms, one after the other, on
//! a 2-node mesh, submitted on the non-coordinator. Submit-to-running is from
//! just before `mesh submit` starts to the task's first instruction;
//! running-to-recorded is from the task's last instruction to `mesh submit
//! --wait` hearing that the coordinator recorded it. Both include the CLI
//! process and the control socket, as a user sees them.
//!
//! `cargo bench -p mesh-cli --bench mesh`

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hdrhistogram::Histogram;
use mesh_benches::{knob, report, save};
use mesh_tests::{Cluster, Sandbox};

fn main() {
    let per_node = knob("MESH_BENCH_PER_NODE", 100);
    let mut results = Vec::new();
    println!("scale-out: {per_node} tasks of `sleep 0.05` per node, 2 slots per node");
    let mut base = 0.0;
    for n in [1usize, 2, 4] {
        let sb = Sandbox::new(env!("CARGO_BIN_EXE_mesh"));
        let cluster = Cluster::start(&sb, &vec!["cpu=2"; n], &[]);
        let tasks = per_node * n as u64;
        sb.write(
            "farm.toml",
            &format!(
                "[farm]\nname = \"scale\"\n[[stage]]\nname = \"s\"\nsweep.i = {{ range = \"1..{tasks}\" }}\ncommand = [\"sleep\", \"0.05\"]\n"
            ),
        );
        let start = Instant::now();
        let r = cluster.mesh(n - 1, &["submit", "farm.toml", "--wait"]);
        let took = start.elapsed();
        r.expect_code(0);
        let thr = tasks as f64 / took.as_secs_f64();
        println!(
            "  {n} node(s): {tasks} tasks in {:.2}s = {thr:.1} tasks/s",
            took.as_secs_f64()
        );
        if n == 1 {
            base = thr;
            results.push(report("scale-out 1 node (tasks/s)", thr, "tasks/s", None));
        } else {
            let ratio = thr / (n as f64 * base);
            results.push(report(
                &format!("scale-out {n} nodes / {n} x 1 node"),
                ratio,
                "ratio",
                Some((">=", 0.9, ratio >= 0.9)),
            ));
        }
    }

    let runs = knob("MESH_BENCH_LATENCY", 40);
    println!("dispatch latency: {runs} one-task farms on 2 nodes");
    let sb = Sandbox::new(env!("CARGO_BIN_EXE_mesh"));
    let cluster = Cluster::start(&sb, &["cpu=2", "cpu=2"], &[]);
    let stamps = sb.path().join("stamps");
    sb.write(
        "one.toml",
        &format!(
            "[farm]\nname = \"one\"\n[[stage]]\nname = \"t\"\nshell = 'date +%s%N >> {0}; date +%s%N >> {0}'\n",
            stamps.display()
        ),
    );
    let mut to_running = Histogram::<u64>::new(3).expect("histogram");
    let mut to_recorded = Histogram::<u64>::new(3).expect("histogram");
    for _ in 0..runs {
        let _ = std::fs::remove_file(&stamps);
        let submitted = unix_ns();
        let r = cluster.mesh(1, &["submit", "one.toml", "--wait"]);
        let heard = unix_ns();
        r.expect_code(0);
        let text = std::fs::read_to_string(&stamps).expect("the task wrote its stamps");
        let v: Vec<u64> = text.lines().filter_map(|l| l.trim().parse().ok()).collect();
        assert_eq!(v.len(), 2, "{text}");
        to_running
            .record((v[0].saturating_sub(submitted)) / 1000)
            .expect("record");
        to_recorded
            .record((heard.saturating_sub(v[1])) / 1000)
            .expect("record");
    }
    for (name, h) in [
        ("submit to running", &to_running),
        ("running to recorded done", &to_recorded),
    ] {
        for q in [50.0, 90.0, 99.0] {
            let ms = h.value_at_quantile(q / 100.0) as f64 / 1000.0;
            results.push(report(&format!("{name} p{q}"), ms, "ms", None));
        }
    }
    save("mesh", &results);
    drop(cluster);
    std::thread::sleep(Duration::from_millis(100));
}

fn unix_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}
