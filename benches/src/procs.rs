//! Meshes of many real node processes for the benchmarks: started at once against one seed, watched through their logs, and measured from /proc (CPU per process, memory, sockets).

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use mesh_tests::sees;

use crate::user_env;

/// One node process, its log and its state folder; killed when dropped.
pub struct Node {
    pub child: Child,
    pub log: PathBuf,
    pub state: PathBuf,
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Node {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// Starts `n` nodes of one slot on 127.0.0.1: the first alone, the others
/// joining it, all launched as fast as this process can start them (as a
/// batch system's job array starts them). Returns the nodes and when the
/// last was launched.
pub fn start(bin: &Path, dir: &Path, n: usize) -> (Vec<Node>, Instant) {
    let first = dir.join("n0");
    let ok = Command::new(bin)
        .args(["--state-dir", first.to_str().expect("path"), "init"])
        .stdout(Stdio::null())
        .status()
        .expect("mesh init");
    assert!(ok.success(), "mesh init failed");
    let mut nodes = vec![spawn(bin, dir, 0, None)];
    let addr = address(&nodes[0].log);
    // Folders and keys first, so the launches follow each other closely.
    for i in 1..n {
        let state = dir.join(format!("n{i}"));
        fs::create_dir_all(&state).expect("mkdir");
        fs::copy(first.join("mesh.key"), state.join("mesh.key")).expect("copy key");
    }
    for i in 1..n {
        nodes.push(spawn(bin, dir, i, Some(&addr)));
    }
    (nodes, Instant::now())
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
pub fn address(log: &Path) -> String {
    for _ in 0..300 {
        let text = fs::read_to_string(log).unwrap_or_default();
        if let Some(a) = text.lines().find_map(|l| l.split(" listening on ").nth(1)) {
            return a.trim().to_string();
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("the first node printed no address");
}

/// The node's peer id, as it printed it.
pub fn peer_id(log: &str) -> Option<&str> {
    log.lines().find_map(|l| {
        l.strip_prefix("mesh node ")
            .filter(|r| r.contains(" listening on "))
            .and_then(|r| r.split(' ').next())
    })
}

/// Whom a node's log says it follows now (its last `coordinator is` line).
pub fn follows(log: &str) -> Option<String> {
    mesh_tests::follows(&log.lines().collect::<Vec<_>>())
}

/// How many meshes the nodes make as their logs tell: the distinct
/// coordinators they follow, a node that follows none counting as a mesh
/// of its own.
pub fn meshes(nodes: &[Node]) -> usize {
    let said: Vec<Option<String>> = nodes.iter().map(|n| follows(&n.log_text())).collect();
    let none = said.iter().filter(|c| c.is_none()).count();
    let mut coords: Vec<String> = said.into_iter().flatten().collect();
    coords.sort_unstable();
    coords.dedup();
    coords.len() + none
}

/// Waits until every node has printed `joined` for every other (and no
/// `is gone` since for any of them), and, with `one_coordinator`, all
/// follow the same coordinator.
pub fn wait_all_see_all(
    nodes: &[Node],
    limit: Duration,
    one_coordinator: bool,
) -> Result<(), String> {
    let n = nodes.len();
    let deadline = Instant::now() + limit;
    let mut done = vec![n == 1; n];
    loop {
        for (i, nd) in nodes.iter().enumerate() {
            if !done[i] {
                let log = nd.log_text();
                done[i] = sees(&log.lines().collect::<Vec<_>>()) >= n - 1;
            }
        }
        let behind = done.iter().filter(|d| !**d).count();
        let meshes = if one_coordinator && behind == 0 {
            meshes(nodes)
        } else {
            1
        };
        if behind == 0 && meshes == 1 {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!(
                "{behind} of {n} nodes do not see all; {meshes} coordinators"
            ));
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// The binary the mesh benchmarks run: `MESH_BENCH_BIN` when set (to
/// measure another build, an older one, in the same way), else `built`.
pub fn mesh_bin(built: &str) -> PathBuf {
    std::env::var_os("MESH_BENCH_BIN").map_or_else(|| PathBuf::from(built), PathBuf::from)
}

/// Nanoseconds one process has spent on a CPU, all its threads together
/// (the scheduler's own count: /proc's clock ticks are 10 ms, too coarse
/// for a node that idles at a millisecond a second). Threads that ended
/// are not counted.
pub fn cpu_ns(pid: u32) -> u64 {
    let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .filter_map(Result::ok)
        .filter_map(|t| fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// [RSS, PSS, anonymous, file-backed (PSS)] of a process, in KiB.
pub fn memory(pid: u32) -> [u64; 4] {
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

/// Sockets a process has open (TCP and UDP, listening or not).
pub fn sockets(pid: u32) -> usize {
    fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| {
                    fs::read_link(e.path())
                        .is_ok_and(|t| t.to_string_lossy().starts_with("socket:"))
                })
                .count()
        })
        .unwrap_or(0)
}

/// Established TCP connections with both ends on 127.0.0.1 (each counted
/// at both ends, as two lines of /proc/net/tcp).
pub fn loopback_connections() -> usize {
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

/// The value at fraction `q` (0 to 1) of sorted `v`.
pub fn quantile(v: &[f64], q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let i = ((v.len() - 1) as f64 * q).round() as usize;
    v[i]
}
