//! What a mesh of N real idle nodes costs each node on this machine (CPU, memory, connections), how soon all see all, and a farm of `sleep 1` on the largest mesh.
//!
//! For each size in `MESH_BENCH_IDLE_SIZES` (`20,50,100,200`), N `mesh`
//! processes of one slot each (`--resources cpu=1`) on 127.0.0.1 join the
//! first, all launched at once. Measured:
//! - all see all: from the last launch until every node has printed
//!   `mesh node … joined` for each of the N-1 others (target: 30 s);
//! - idle CPU per node: the CPU time all nodes' threads spent (the
//!   scheduler's count, in nanoseconds) over
//!   `MESH_BENCH_IDLE_SECS` (20) s, 5 s after all see all, per node per
//!   second; the ratio of each size to the smallest, measured in the same
//!   run (target: at most 1.5), and the largest size's figure (target:
//!   under 3 ms/s); and per process: the coordinator's, and the median
//!   and 90th percentile of the others', so a cost that grows with the
//!   mesh shows where it grows;
//! - memory per node: RSS, and PSS (each shared page divided among the
//!   processes that map it: the binary's pages are shared by every node),
//!   split into anonymous (heap, stacks) and file-backed;
//! - TCP connections per node (both ends of each loopback connection
//!   counted, from /proc/net/tcp), the coordinator's sockets (idle, and
//!   in the middle of the farm below), and "is gone" lines (no node is
//!   killed, so every one is a false death).
//!
//! Then, on the largest mesh, a farm of `sleep 1` tasks, ten per slot,
//! submitted on the last node with `--wait`: makespan over its lower bound
//! (ten seconds; target at most 1.15).
//!
//! With `MESH_BENCH_IDLE_KEEP` set, each size's folder (a log per node) is
//! kept and named.
//!
//! `cargo bench -p mesh-cli --bench idle` (a 200-node mesh wants about
//! 3 GB of memory and `ulimit -n` of a few thousand).

use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use mesh_benches::procs::{self, Node};
use mesh_benches::{knob, report, save, user_env};

fn main() {
    mesh_benches::use_user_env();
    let bin = procs::mesh_bin(env!("CARGO_BIN_EXE_mesh"));
    let sizes: Vec<usize> = std::env::var("MESH_BENCH_IDLE_SIZES")
        .unwrap_or_else(|_| "20,50,100,200".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let secs = knob("MESH_BENCH_IDLE_SECS", 20);
    let mut results = Vec::new();
    let mut base_cpu = None;
    let last = *sizes.last().expect("a size");
    for &n in &sizes {
        let dir = tempfile::tempdir().expect("temp dir");
        let (nodes, launched) = procs::start(&bin, dir.path(), n);
        let idle = measure_idle(&nodes, n, launched, secs);
        idle.report(n == last, &mut base_cpu, &mut results);
        if n == last && idle.seen {
            sleep_farm(&bin, dir.path(), &nodes, &idle, &mut results);
        }
        drop(nodes);
        if std::env::var_os("MESH_BENCH_IDLE_KEEP").is_some() {
            println!("  the nodes' logs are kept in {}", dir.keep().display());
        }
    }
    save("idle", &results);
}

/// What a mesh of idle nodes cost, as measured: per node unless named.
struct Idle {
    n: usize,
    /// Whether all saw all, and when, after the last launch.
    seen: bool,
    converged_s: f64,
    /// Idle CPU, ms/s: per node, the coordinator's, and the others'.
    cpu: f64,
    coord_cpu: f64,
    median: f64,
    p90: f64,
    coord_sockets: usize,
    /// RSS, PSS, anonymous and file-backed, KiB over all nodes.
    mem_kib: [u64; 4],
    conns: f64,
    gone: usize,
    /// The coordinator, as the first node's log names it.
    coord_pid: Option<u32>,
}

/// Waits for the `n` nodes to see each other, then measures them idle for
/// `secs` s.
fn measure_idle(nodes: &[Node], n: usize, launched: Instant, secs: u64) -> Idle {
    let seen = procs::wait_all_see_all(nodes, Duration::from_secs(240), false);
    let converged = launched.elapsed().as_secs_f64();
    match &seen {
        Ok(()) => println!("{n} nodes: all see all {converged:.1} s after the last launch"),
        Err(e) => println!("{n} nodes: NOT all see all after {converged:.0} s: {e}"),
    }
    std::thread::sleep(Duration::from_secs(5));
    let pids: Vec<u32> = nodes.iter().map(Node::pid).collect();
    let t0: Vec<u64> = pids.iter().map(|&p| procs::cpu_ns(p)).collect();
    let start_at = Instant::now();
    std::thread::sleep(Duration::from_secs(secs));
    let t1: Vec<u64> = pids.iter().map(|&p| procs::cpu_ns(p)).collect();
    let wall = start_at.elapsed().as_secs_f64();
    let ms = |ns: u64| ns as f64 / 1e6 / wall;
    let each: Vec<f64> = t0.iter().zip(&t1).map(|(a, b)| ms(b - a)).collect();
    let cpu = each.iter().sum::<f64>() / n as f64;
    let first_log = nodes[0].log_text();
    let coord = procs::follows(&first_log).and_then(|c| {
        nodes
            .iter()
            .position(|nd| procs::peer_id(&nd.log_text()) == Some(c.as_str()))
    });
    let mut others: Vec<f64> = each
        .iter()
        .enumerate()
        .filter(|(i, _)| Some(*i) != coord)
        .map(|(_, c)| *c)
        .collect();
    others.sort_by(f64::total_cmp);
    let coord_cpu = coord.map_or(0.0, |i| each[i]);
    let coord_sockets = coord.map_or(0, |i| procs::sockets(pids[i]));
    let (median, p90) = (procs::quantile(&others, 0.5), procs::quantile(&others, 0.9));
    let mem = pids
        .iter()
        .map(|&p| procs::memory(p))
        .fold([0u64; 4], |a, m| {
            [a[0] + m[0], a[1] + m[1], a[2] + m[2], a[3] + m[3]]
        });
    let mb = |kib: u64| kib as f64 / 1024.0 / n as f64;
    let conns = procs::loopback_connections() as f64 / n as f64;
    let gone: usize = nodes
        .iter()
        .map(|nd| nd.log_text().matches(" is gone").count())
        .sum();
    println!(
        "  idle CPU {cpu:.2} ms/s per node (coordinator {coord_cpu:.1}, others median {median:.2}, p90 {p90:.2}); RSS {:.1} MB, PSS {:.1} MB (anonymous {:.1} MB, file {:.1} MB) per node; {conns:.2} connection ends per node, {coord_sockets} sockets at the coordinator; {gone} 'is gone' lines",
        mb(mem[0]),
        mb(mem[1]),
        mb(mem[2]),
        mb(mem[3])
    );
    Idle {
        n,
        seen: seen.is_ok(),
        converged_s: converged,
        cpu,
        coord_cpu,
        median,
        p90,
        coord_sockets,
        mem_kib: mem,
        conns,
        gone,
        coord_pid: coord.map(|i| pids[i]),
    }
}

impl Idle {
    /// The figures as results; `base_cpu` is the first size's idle CPU,
    /// which each later size's is a ratio to, and `largest` holds this size
    /// to the per-node CPU target.
    fn report(
        &self,
        largest: bool,
        base_cpu: &mut Option<(usize, f64)>,
        results: &mut Vec<serde_json::Value>,
    ) {
        let (n, seen, converged, cpu) = (self.n, self.seen, self.converged_s, self.cpu);
        let mb = |kib: u64| kib as f64 / 1024.0 / n as f64;
        results.push(report(
            &format!("{n} nodes: all see all (s)"),
            if seen { converged } else { f64::INFINITY },
            "s",
            Some(("<=", 30.0, seen && converged <= 30.0)),
        ));
        let cpu_target = largest.then_some(("<", 3.0, cpu < 3.0));
        results.push(report(
            &format!("{n} nodes: idle CPU per node"),
            cpu,
            "ms/s",
            cpu_target,
        ));
        results.push(report(
            &format!("{n} nodes: idle CPU, the coordinator"),
            self.coord_cpu,
            "ms/s",
            None,
        ));
        results.push(report(
            &format!("{n} nodes: idle CPU, others' median"),
            self.median,
            "ms/s",
            None,
        ));
        results.push(report(
            &format!("{n} nodes: idle CPU, others' p90"),
            self.p90,
            "ms/s",
            None,
        ));
        results.push(report(
            &format!("{n} nodes: sockets at the coordinator"),
            self.coord_sockets as f64,
            "sockets",
            None,
        ));
        match *base_cpu {
            None => *base_cpu = Some((n, cpu)),
            Some((n0, c0)) => {
                let ratio = cpu / c0;
                results.push(report(
                    &format!("idle CPU per node, {n} / {n0} nodes"),
                    ratio,
                    "ratio",
                    Some(("<=", 1.5, ratio <= 1.5)),
                ));
            }
        }
        results.push(report(
            &format!("{n} nodes: RSS per node"),
            mb(self.mem_kib[0]),
            "MB",
            None,
        ));
        results.push(report(
            &format!("{n} nodes: PSS per node"),
            mb(self.mem_kib[1]),
            "MB",
            None,
        ));
        results.push(report(
            &format!("{n} nodes: connection ends per node"),
            self.conns,
            "conns",
            None,
        ));
        results.push(report(
            &format!("{n} nodes: 'is gone' lines, idle"),
            self.gone as f64,
            "lines",
            Some(("<=", 0.0, self.gone == 0)),
        ));
    }
}

/// A farm of `sleep 1`, ten per slot, submitted on the last node with
/// `--wait`: its makespan over the lower bound, and the coordinator's
/// sockets mid-farm.
fn sleep_farm(
    bin: &Path,
    dir: &Path,
    nodes: &[Node],
    idle: &Idle,
    results: &mut Vec<serde_json::Value>,
) {
    let n = idle.n;
    let per = 10;
    let tasks = n as u64 * per;
    let farm = dir.join("farm.toml");
    fs::write(
        &farm,
        format!(
            "[farm]\nname = \"sleep1\"\n[[stage]]\nname = \"s\"\nsweep.i = {{ range = \"1..{tasks}\" }}\ncommand = [\"sleep\", \"1\"]\n"
        ),
    )
    .expect("write farm");
    let began = Instant::now();
    let submit = user_env(&mut Command::new(bin))
        .args(["submit", farm.to_str().expect("path"), "--wait"])
        .env("MESH_STATE_DIR", &nodes[n - 1].state)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("mesh submit");
    // Mid-farm, every node busy: the coordinator talks to each.
    std::thread::sleep(Duration::from_secs(per / 2));
    let busy_sockets = idle.coord_pid.map_or(0, procs::sockets);
    let out = submit.wait_with_output().expect("mesh submit");
    let took = began.elapsed().as_secs_f64();
    println!("  sockets at the coordinator mid-farm: {busy_sockets}");
    results.push(report(
        &format!("{n} nodes: sockets at the coordinator mid-farm"),
        busy_sockets as f64,
        "sockets",
        None,
    ));
    assert!(
        out.status.success(),
        "the farm failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ratio = took / per as f64;
    println!("  {tasks} x sleep 1 on {n} slots: {took:.1} s, lower bound {per} s");
    results.push(report(
        &format!("{n} nodes, {tasks} x sleep 1: makespan / lower bound"),
        ratio,
        "ratio",
        Some(("<=", 1.15, ratio <= 1.15)),
    ));
}
