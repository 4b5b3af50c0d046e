//! What surviving a node costs: coordinator failover time, and the throughput cost of replicating each farm's state.
//!
//! Failover: `MESH_BENCH_FAILOVER` (10) times, a 3-node mesh at the default
//! settings (a member is dead after 2 s of silence) runs a farm of 0.1 s
//! tasks, each node holding one task at a time (`--claims-max 1`, one
//! slot), so every start after the first 0.1 s following the kill was
//! placed by the new coordinator. The coordinator is SIGKILLed; the time
//! from the kill to the first such start, as percentiles (target: at most
//! 3 s).
//!
//! At size: for each size in `MESH_BENCH_FAILOVER_SIZES` (`50,200`), one
//! mesh of that many nodes of one slot (`--claims-max 1`) runs a farm of
//! 1 s tasks, and its coordinator, whichever node that is by then, is
//! SIGKILLed `MESH_BENCH_FAILOVER_KILLS` (5) times, 8 s apart: the time
//! from each kill to the first start after the kill plus 1.2 s (every
//! node's one task then was placed by the new coordinator), as p50 and
//! p99 (target: p50 at most 3 s at every size).
//!
//! Replication: 4 nodes of 2 slots, `MESH_BENCH_REPL_TASKS` (800) tasks of
//! `true` submitted on the last node with `--wait`, with `--replicas 1` and
//! `--replicas 2` (the default: every completion durable on a second node
//! before the worker forgets it), `MESH_BENCH_REPEAT` (3) times each
//! alternately; the ratio of the medians' throughputs, replicas 2 over 1.
//!
//! `cargo bench -p mesh-cli --bench failover`

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hdrhistogram::Histogram;
use mesh_benches::{knob, median, report, save};
use mesh_tests::{wait_until, Cluster, Sandbox};
use nix::sys::signal::Signal;

fn main() {
    let mut results = Vec::new();
    let runs = knob("MESH_BENCH_FAILOVER", 10);
    println!("failover: {runs} coordinator kills on 3 nodes, default death timeout (2 s)");
    let mut h = Histogram::<u64>::new(3).expect("histogram");
    for k in 0..runs {
        let ms = failover_once();
        println!("  run {k}: {ms} ms from the kill to the first task the new coordinator placed");
        h.record(ms).expect("record");
    }
    for q in [50.0, 90.0, 99.0] {
        let ms = h.value_at_quantile(q / 100.0) as f64;
        let check = (q == 99.0).then_some(("<=", 3000.0, ms <= 3000.0));
        results.push(report(&format!("failover p{q}"), ms, "ms", check));
    }
    results.push(report("failover max", h.max() as f64, "ms", None));

    let kills = knob("MESH_BENCH_FAILOVER_KILLS", 5) as usize;
    let sizes = std::env::var("MESH_BENCH_FAILOVER_SIZES").unwrap_or_else(|_| "50,200".into());
    for n in sizes
        .split(',')
        .filter_map(|s| s.trim().parse::<usize>().ok())
    {
        println!("failover at size: {n} nodes of one slot, {kills} coordinator kills");
        let mut h = Histogram::<u64>::new(3).expect("histogram");
        for (k, ms) in failover_at_size(n, kills).into_iter().enumerate() {
            println!("  kill {k}: {ms} ms to the first task the new coordinator placed");
            h.record(ms).expect("record");
        }
        let p50 = h.value_at_quantile(0.5) as f64;
        results.push(report(
            &format!("failover p50, {n} nodes"),
            p50,
            "ms",
            Some(("<=", 3000.0, p50 <= 3000.0)),
        ));
        results.push(report(
            &format!("failover p99, {n} nodes"),
            h.value_at_quantile(0.99) as f64,
            "ms",
            None,
        ));
    }

    let tasks = knob("MESH_BENCH_REPL_TASKS", 800);
    let repeat = knob("MESH_BENCH_REPEAT", 3);
    println!(
        "replication: {tasks} tasks of `true` on 4 nodes, replicas 1 and 2, {repeat} times each"
    );
    let (mut one, mut two) = (Vec::new(), Vec::new());
    for _ in 0..repeat {
        for (replicas, into) in [("1", &mut one), ("2", &mut two)] {
            let took = throughput_run(tasks, replicas);
            println!(
                "  replicas {replicas}: {:.2}s = {:.0} tasks/s",
                took.as_secs_f64(),
                tasks as f64 / took.as_secs_f64()
            );
            into.push(took);
        }
    }
    let (t1, t2) = (median(one), median(two));
    results.push(report(
        "4-node throughput, replicas 1 (tasks/s)",
        tasks as f64 / t1.as_secs_f64(),
        "tasks/s",
        None,
    ));
    results.push(report(
        "4-node throughput, replicas 2 / replicas 1",
        t1.as_secs_f64() / t2.as_secs_f64(),
        "ratio",
        None,
    ));
    save("failover", &results);
}

/// One kill of the coordinator; milliseconds to the first task it did not place.
fn failover_once() -> u64 {
    let sb = Sandbox::new(env!("CARGO_BIN_EXE_mesh"));
    let c = Cluster::start(&sb, &["cpu=1"; 3], &["--claims-max", "1"]);
    write_start_farm(&sb, 99_999, "0.1");
    c.mesh(2, &["submit", "farm.toml"]).expect_code(0);
    let going = wait_until(Duration::from_secs(30), || sb.lines("starts").len() > 10);
    assert!(going, "the farm did not start");
    let killed = unix_ns();
    c.nodes[0].signal(Signal::SIGKILL);
    let took = ms_to_first_start(&sb, killed, 200_000_000, "the coordinator");
    drop(c);
    took
}

/// `farm.toml` in `sb`: `n` tasks of `secs` seconds, each writing its
/// start time (unix ns) to `starts` first.
fn write_start_farm(sb: &Sandbox, n: u64, secs: &str) {
    let starts = sb.path().join("starts");
    sb.write(
        "farm.toml",
        &format!(
            "[farm]\nname = \"fo\"\n[[stage]]\nname = \"s\"\nsweep.i = {{ range = \"0..{n}\" }}\nshell = 'date +%s%N >> {}; sleep {secs}'\n",
            starts.display()
        ),
    );
}

/// Milliseconds from `killed` (unix ns) to the first start logged more
/// than `placed_after` ns after it: a task the next coordinator placed.
fn ms_to_first_start(sb: &Sandbox, killed: u64, placed_after: u64, what: &str) -> u64 {
    let after = killed + placed_after;
    let mut first = None;
    let placed = wait_until(Duration::from_secs(30), || {
        first = sb
            .lines("starts")
            .iter()
            .filter_map(|l| l.trim().parse::<u64>().ok())
            .filter(|&t| t > after)
            .min();
        first.is_some()
    });
    assert!(placed, "no task started after {what} died");
    (first.expect("found") - killed) / 1_000_000
}

/// Kills the coordinator of one mesh of `n` nodes `kills` times while it
/// runs 1 s tasks; milliseconds from each kill to the first task the next
/// coordinator placed.
fn failover_at_size(n: usize, kills: usize) -> Vec<u64> {
    let sb = Sandbox::new(env!("CARGO_BIN_EXE_mesh"));
    let mut c = Cluster::start_many(&sb, n, "cpu=1", &["--claims-max", "1"]);
    write_start_farm(&sb, 999_999, "1");
    // Submitted on the last node, which is never killed below before the
    // others: the lowest nodes are the coordinator's likely successors.
    c.mesh(n - 1, &["submit", "farm.toml"]).expect_code(0);
    let going = wait_until(Duration::from_secs(60), || sb.lines("starts").len() > n);
    assert!(going, "the farm did not start on {n} nodes");
    let mut took = Vec::new();
    let mut dead = Vec::new();
    for _ in 0..kills {
        std::thread::sleep(Duration::from_secs(8));
        let asker = (0..n)
            .rev()
            .find(|i| !dead.contains(i))
            .expect("a live node");
        let coordinator = c.mesh(asker, &["status", "--json"]).json()["coordinator"]
            .as_str()
            .map(str::to_string);
        let Some(ci) = coordinator
            .and_then(|p| (0..n).find(|&i| !dead.contains(&i) && c.nodes[i].peer_id() == p))
        else {
            println!("  no coordinator known to node {asker}; stopping at this size");
            break;
        };
        let killed = unix_ns();
        c.kill(ci);
        dead.push(ci);
        let what = format!("the coordinator of {n}");
        took.push(ms_to_first_start(&sb, killed, 1_200_000_000, &what));
    }
    took
}

/// One `submit --wait` of `tasks` trivial tasks on 4 nodes with these replicas.
fn throughput_run(tasks: u64, replicas: &str) -> Duration {
    let sb = Sandbox::new(env!("CARGO_BIN_EXE_mesh"));
    let c = Cluster::start(&sb, &["cpu=2"; 4], &["--replicas", replicas]);
    sb.write(
        "farm.toml",
        &format!(
            "[farm]\nname = \"repl\"\n[[stage]]\nname = \"s\"\nsweep.i = {{ range = \"1..{tasks}\" }}\ncommand = [\"true\"]\n"
        ),
    );
    let start = Instant::now();
    c.mesh(3, &["submit", "farm.toml", "--wait"]).expect_code(0);
    start.elapsed()
}

fn unix_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}
