//! What a mesh of N real idle nodes costs each node on this machine (CPU, memory, connections), how soon all see all, and a farm of `sleep 1` on the largest mesh.
//!
//! For each size in `MESH_BENCH_IDLE_SIZES` (`20,50,100,200`), N `mesh`
//! processes of one slot each (`--resources cpu=1`) on 127.0.0.1 join the
//! first, all launched at once. Measured:
//! - all see all: from the last launch until every node has printed
//!   `mesh node … joined` for each of the N-1 others (target: 30 s);
//! - idle CPU per node: user + system CPU of all nodes over
//!   `MESH_BENCH_IDLE_SECS` (20) s, 5 s after all see all, per node per
//!   second; the ratio of each size to the smallest, measured in the same
//!   run (target: at most 1.5), and the largest size's figure (target:
//!   under 3 ms/s);
//! - memory per node: RSS, and PSS (each shared page divided among the
//!   processes that map it: the binary's pages are shared by every node),
//!   split into anonymous (heap, stacks) and file-backed;
//! - TCP connections per node (both ends of each loopback connection
//!   counted, from /proc/net/tcp), and "is gone" lines (no node is killed,
//!   so every one is a false death).
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

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use mesh_benches::{knob, report, save, user_env};
use mesh_tests::sees;

struct Node {
    child: Child,
    log: PathBuf,
    state: PathBuf,
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn main() {
    mesh_benches::use_user_env();
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_mesh"));
    let sizes: Vec<usize> = std::env::var("MESH_BENCH_IDLE_SIZES")
        .unwrap_or_else(|_| "20,50,100,200".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let secs = knob("MESH_BENCH_IDLE_SECS", 20);
    // /proc's clock ticks per second (USER_HZ: 100 on every Linux we run on).
    let hz = Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .trim()
                .parse::<f64>()
                .ok()
        })
        .unwrap_or(100.0);
    let mut results = Vec::new();
    let mut base_cpu = None;
    let last = *sizes.last().expect("a size");
    for &n in &sizes {
        let dir = tempfile::tempdir().expect("temp dir");
        let nodes = start(&bin, dir.path(), n);
        let launched = Instant::now();
        let seen = wait_all_see_all(&nodes, Duration::from_secs(240));
        let converged = launched.elapsed().as_secs_f64();
        match &seen {
            Ok(()) => println!("{n} nodes: all see all {converged:.1} s after the last launch"),
            Err(e) => println!("{n} nodes: NOT all see all after {converged:.0} s: {e}"),
        }
        std::thread::sleep(Duration::from_secs(5));
        let pids: Vec<u32> = nodes.iter().map(|nd| nd.child.id()).collect();
        let t0 = cpu_ticks(&pids);
        let start_at = Instant::now();
        std::thread::sleep(Duration::from_secs(secs));
        let t1 = cpu_ticks(&pids);
        let wall = start_at.elapsed().as_secs_f64();
        let cpu = (t1 - t0) as f64 / hz * 1000.0 / wall / n as f64;
        let mem = pids.iter().map(|&p| memory(p)).fold([0u64; 4], |a, m| {
            [a[0] + m[0], a[1] + m[1], a[2] + m[2], a[3] + m[3]]
        });
        let mb = |kib: u64| kib as f64 / 1024.0 / n as f64;
        let conns = loopback_connections() as f64 / n as f64;
        let gone: usize = nodes
            .iter()
            .map(|nd| {
                fs::read_to_string(&nd.log)
                    .unwrap_or_default()
                    .matches(" is gone")
                    .count()
            })
            .sum();
        println!(
            "  idle CPU {cpu:.2} ms/s per node; RSS {:.1} MB, PSS {:.1} MB (anonymous {:.1} MB, file {:.1} MB) per node; {conns:.2} connection ends per node; {gone} 'is gone' lines",
            mb(mem[0]),
            mb(mem[1]),
            mb(mem[2]),
            mb(mem[3])
        );
        results.push(report(
            &format!("{n} nodes: all see all (s)"),
            if seen.is_ok() {
                converged
            } else {
                f64::INFINITY
            },
            "s",
            Some(("<=", 30.0, seen.is_ok() && converged <= 30.0)),
        ));
        let cpu_target = (n == last).then_some(("<", 3.0, cpu < 3.0));
        results.push(report(
            &format!("{n} nodes: idle CPU per node"),
            cpu,
            "ms/s",
            cpu_target,
        ));
        match base_cpu {
            None => base_cpu = Some((n, cpu)),
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
            mb(mem[0]),
            "MB",
            None,
        ));
        results.push(report(
            &format!("{n} nodes: PSS per node"),
            mb(mem[1]),
            "MB",
            None,
        ));
        results.push(report(
            &format!("{n} nodes: connection ends per node"),
            conns,
            "conns",
            None,
        ));
        results.push(report(
            &format!("{n} nodes: 'is gone' lines, idle"),
            gone as f64,
            "lines",
            Some(("<=", 0.0, gone == 0)),
        ));
        if n == last && seen.is_ok() {
            let per = 10;
            let tasks = n as u64 * per;
            let farm = dir.path().join("farm.toml");
            fs::write(
                &farm,
                format!(
                    "[farm]\nname = \"sleep1\"\n[[stage]]\nname = \"s\"\nsweep.i = {{ range = \"1..{tasks}\" }}\ncommand = [\"sleep\", \"1\"]\n"
                ),
            )
            .expect("write farm");
            let began = Instant::now();
            let out = user_env(&mut Command::new(&bin))
                .args(["submit", farm.to_str().expect("path"), "--wait"])
                .env("MESH_STATE_DIR", &nodes[n - 1].state)
                .current_dir(dir.path())
                .stdin(Stdio::null())
                .output()
                .expect("mesh submit");
            let took = began.elapsed().as_secs_f64();
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
        drop(nodes);
        if std::env::var_os("MESH_BENCH_IDLE_KEEP").is_some() {
            println!("  the nodes' logs are kept in {}", dir.keep().display());
        }
    }
    save("idle", &results);
}

/// Starts `n` nodes: the first alone, the others joining it, all at once.
fn start(bin: &Path, dir: &Path, n: usize) -> Vec<Node> {
    let first = dir.join("n0");
    let ok = Command::new(bin)
        .args(["--state-dir", first.to_str().expect("path"), "init"])
        .stdout(Stdio::null())
        .status()
        .expect("mesh init");
    assert!(ok.success(), "mesh init failed");
    let mut nodes = vec![spawn(bin, dir, 0, None)];
    let addr = address(&nodes[0].log);
    for i in 1..n {
        let state = dir.join(format!("n{i}"));
        fs::create_dir_all(&state).expect("mkdir");
        fs::copy(first.join("mesh.key"), state.join("mesh.key")).expect("copy key");
        nodes.push(spawn(bin, dir, i, Some(&addr)));
    }
    nodes
}

fn spawn(bin: &Path, dir: &Path, i: usize, join: Option<&str>) -> Node {
    let state = dir.join(format!("n{i}"));
    let log = dir.join(format!("n{i}.log"));
    let out = File::create(&log).expect("log file");
    let mut cmd = Command::new(bin);
    user_env(&mut cmd).env("MESH_STATE_DIR", &state);
    match join {
        Some(a) => cmd.args(["join", a]),
        None => cmd.arg("node"),
    };
    let child = cmd
        .args(["--listen", "/ip4/127.0.0.1/tcp/0", "--resources", "cpu=1"])
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(out.try_clone().expect("log file"))
        .stderr(out)
        .spawn()
        .expect("start mesh node");
    Node { child, log, state }
}

/// The address a node printed, waiting for it.
fn address(log: &Path) -> String {
    for _ in 0..300 {
        let text = fs::read_to_string(log).unwrap_or_default();
        if let Some(a) = text.lines().find_map(|l| l.split(" listening on ").nth(1)) {
            return a.trim().to_string();
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("the first node printed no address");
}

/// Waits until every node has printed `joined` for every other (and no
/// `is gone` since for any of them).
fn wait_all_see_all(nodes: &[Node], limit: Duration) -> Result<(), String> {
    let n = nodes.len();
    let deadline = Instant::now() + limit;
    let mut done = vec![n == 1; n];
    loop {
        for (i, nd) in nodes.iter().enumerate() {
            if !done[i] {
                let log = fs::read_to_string(&nd.log).unwrap_or_default();
                done[i] = sees(&log.lines().collect::<Vec<_>>()) >= n - 1;
            }
        }
        let behind = done.iter().filter(|d| !**d).count();
        if behind == 0 {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("{behind} of {n} nodes do not see all"));
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// User + system clock ticks of these processes.
fn cpu_ticks(pids: &[u32]) -> u64 {
    pids.iter()
        .filter_map(|p| fs::read_to_string(format!("/proc/{p}/stat")).ok())
        .map(|s| {
            // Fields after the command name, which may hold spaces.
            let rest = s.rsplit(')').next().unwrap_or("");
            let f: Vec<&str> = rest.split_whitespace().collect();
            f.get(11).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
                + f.get(12).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
        })
        .sum()
}

/// [RSS, PSS, anonymous, file-backed (PSS)] of a process, in KiB.
fn memory(pid: u32) -> [u64; 4] {
    let text = fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap_or_default();
    let field = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let pss = field("Pss:");
    let anon = field("Pss_Anon:");
    [field("Rss:"), pss, anon, pss.saturating_sub(anon)]
}

/// Established TCP connections with both ends on 127.0.0.1 (each counted
/// at both ends, as two lines of /proc/net/tcp).
fn loopback_connections() -> usize {
    let text = fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    text.lines()
        .skip(1)
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() > 3
                && f[3] == "01"
                && f[1].starts_with("0100007F")
                && f[2].starts_with("0100007F")
        })
        .count()
}
