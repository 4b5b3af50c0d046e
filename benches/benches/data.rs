//! Data at wire speed: outputs coming home on a 4-node mesh against one node, one file node to node against a plain TCP copy, and the round trips between two nodes while a transfer runs.
//!
//! Farms: tasks that each write one output of random bytes
//! (`head -c SIZE /dev/urandom`), 10 x 100 MiB and 100 x 10 MiB, with
//! `mesh run` on one node of 2 slots, and on a mesh of 4 nodes of 2 slots
//! submitted on the last (its outputs come home to it from the others) as
//! a user does it, `mesh submit` then `mesh wait`: mesh / one, targets <=
//! 1.5 and <= 2. `MESH_BENCH_ROUNDS` (default 1) takes the best of as many.
//!
//! Node to node: a 2-node mesh where one task writes a 1 GiB file on the
//! node that is not the home (it alone has the 2 cores the task asks
//! for); the transfer is timed from its `.part` file showing on the home
//! to the file taking its name (checked as it came). Against it, in the
//! same run: 1 GiB sent over a plain TCP connection on loopback, memory
//! to memory (target: mesh at least 1/4 of its rate). The nodes are asked
//! nothing while that transfer runs, as the TCP copy runs alone.
//!
//! Round trips: while a second 1 GiB transfer runs (and, on another fresh
//! mesh, while nothing does), `mesh status` is asked of the home over and
//! over, and each asks the other node what it measures of itself over
//! their connection (`Request::Observe`): the home's own measure of those
//! round trips, p50 and p99 (`message_rtt`, read with `--latency`).
//!
//! `MESH_BENCH_BIN` runs another build the same way (the one before).
//! `cargo bench -p mesh-cli --bench data`

use std::io::{Read, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mesh_benches::procs::mesh_bin;
use mesh_benches::{knob, report, save, use_user_env};
use mesh_tests::{wait_until, Cluster, Sandbox};

const MIB: u64 = 1 << 20;

fn main() {
    use_user_env();
    let bin = mesh_bin(env!("CARGO_BIN_EXE_mesh"));
    let bin = bin.to_str().expect("a path in UTF-8");
    let mut results = Vec::new();
    let rounds = knob("MESH_BENCH_ROUNDS", 1);

    for (tasks, mib, target) in [(10u64, 100u64, 1.5), (100, 10, 2.0)] {
        let (mut one, mut mesh) = (f64::MAX, f64::MAX);
        for _ in 0..rounds {
            one = one.min(farm_one(bin, tasks, mib));
            mesh = mesh.min(farm_mesh(bin, tasks, mib));
        }
        let ratio = mesh / one;
        println!("  {tasks} x {mib} MiB: one node {one:.2}s, 4-node mesh {mesh:.2}s");
        results.push(report(
            &format!("{tasks} x {mib} MiB: one node (s)"),
            one,
            "s",
            None,
        ));
        results.push(report(
            &format!("{tasks} x {mib} MiB: 4-node mesh (s)"),
            mesh,
            "s",
            None,
        ));
        results.push(report(
            &format!("{tasks} x {mib} MiB: mesh / one"),
            ratio,
            "ratio",
            Some(("<=", target, ratio <= target)),
        ));
    }

    let gib = knob("MESH_BENCH_FILE_MIB", 1024) * MIB;
    let tcp = tcp_copy(gib);
    let (idle_p50, idle_p99) = round_trips(bin, None);
    let mut node = 0f64;
    let mut asked = 0f64;
    let mut busy = (0.0, 0.0);
    for _ in 0..rounds {
        node = node.max(node_to_node(bin, gib));
        let (rate, p50, p99) = two_nodes(bin, Some(gib), true);
        if rate > asked {
            asked = rate;
            busy = (p50, p99);
        }
    }
    let share = node / tcp;
    println!(
        "  {} MiB: plain TCP {:.0} MB/s, node to node {:.0} MB/s",
        gib / MIB,
        tcp / 1e6,
        node / 1e6
    );
    results.push(report(
        "plain TCP copy on loopback (MB/s)",
        tcp / 1e6,
        "MB/s",
        None,
    ));
    results.push(report("node to node (MB/s)", node / 1e6, "MB/s", None));
    results.push(report(
        "node to node, status asked meanwhile (MB/s)",
        asked / 1e6,
        "MB/s",
        None,
    ));
    results.push(report(
        "node to node / plain TCP",
        share,
        "ratio",
        Some((">=", 0.25, share >= 0.25)),
    ));
    results.push(report("round trip p50, idle (ms)", idle_p50, "ms", None));
    results.push(report("round trip p99, idle (ms)", idle_p99, "ms", None));
    results.push(report(
        "round trip p50, during the transfer (ms)",
        busy.0,
        "ms",
        None,
    ));
    results.push(report(
        "round trip p99, during the transfer (ms)",
        busy.1,
        "ms",
        None,
    ));
    save("data", &results);
}

fn farm_toml(tasks: u64, mib: u64, cpu: u32) -> String {
    format!(
        r#"[farm]
name = "data"
[[stage]]
name = "w"
sweep.i = {{ range = "0..{}" }}
workdir = "w/{{i}}"
resources = {{ cpu = {cpu} }}
shell = 'head -c {} /dev/urandom > out.bin'
outputs = ["out.bin"]
"#,
        tasks - 1,
        mib * MIB
    )
}

/// Seconds `mesh run` takes on one node of 2 slots.
fn farm_one(bin: &str, tasks: u64, mib: u64) -> f64 {
    let sb = Sandbox::new(bin);
    sb.write("farm/farm.toml", &farm_toml(tasks, mib, 1));
    let out = sb.path().join("out");
    let start = Instant::now();
    sb.mesh(&[
        "run",
        "farm/farm.toml",
        "--json",
        "--resources",
        "cpu=2",
        "--out",
        &out.to_string_lossy(),
    ])
    .expect_code(0);
    let took = start.elapsed().as_secs_f64();
    check_outputs(&out, tasks, mib);
    took
}

/// Seconds a 4-node mesh takes, the user's way: `mesh submit` on the
/// last node, then `mesh wait` there, from the submit to the wait's end.
fn farm_mesh(bin: &str, tasks: u64, mib: u64) -> f64 {
    let sb = Sandbox::new(bin);
    let c = Cluster::start(&sb, &["cpu=2"; 4], &[]);
    sb.write("farm/farm.toml", &farm_toml(tasks, mib, 1));
    let out = sb.path().join("out");
    let start = Instant::now();
    c.mesh(
        3,
        &["submit", "farm/farm.toml", "--out", &out.to_string_lossy()],
    )
    .expect_code(0);
    c.mesh(3, &["wait", "data"]).expect_code(0);
    let took = start.elapsed().as_secs_f64();
    check_outputs(&out, tasks, mib);
    took
}

fn check_outputs(out: &Path, tasks: u64, mib: u64) {
    for i in 0..tasks {
        let f = out.join(format!("w/{i}/out.bin"));
        let len = std::fs::metadata(&f).map(|m| m.len()).unwrap_or(0);
        assert_eq!(len, mib * MIB, "{} is not whole", f.display());
    }
}

/// Bytes a second over a plain TCP connection on loopback, memory to memory.
fn tcp_copy(bytes: u64) -> f64 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr");
    let reader = std::thread::spawn(move || {
        let (mut s, _) = l.accept().expect("accept");
        let mut buf = vec![0u8; 256 << 10];
        let mut got = 0u64;
        loop {
            let n = s.read(&mut buf).expect("read");
            if n == 0 {
                return got;
            }
            got += n as u64;
        }
    });
    let buf = vec![7u8; 256 << 10];
    let start = Instant::now();
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    let mut left = bytes;
    while left > 0 {
        let n = (buf.len() as u64).min(left) as usize;
        s.write_all(&buf[..n]).expect("write");
        left -= n as u64;
    }
    drop(s);
    let got = reader.join().expect("reader");
    let took = start.elapsed().as_secs_f64();
    assert_eq!(got, bytes);
    bytes as f64 / took
}

/// A 2-node mesh (node 1, the home, has too few cores for the task); a
/// farm of one task writing `bytes` on node 0, submitted on node 1 when
/// `bytes` is given. The home's round trips to node 0 while the file comes
/// home (or, without one, over as many asks): p50 and p99 in ms, and the
/// transfer's rate.
fn round_trips(bin: &str, bytes: Option<u64>) -> (f64, f64) {
    let (_, p50, p99) = two_nodes(bin, bytes, true);
    (p50, p99)
}

/// The transfer's rate with nothing else asked of the nodes meanwhile, as
/// the TCP copy it is held against runs alone: the asks of `mesh status`
/// (a process each, back to back) take a good part of a core of two.
fn node_to_node(bin: &str, bytes: u64) -> f64 {
    two_nodes(bin, Some(bytes), false).0
}

fn two_nodes(bin: &str, bytes: Option<u64>, asks: bool) -> (f64, f64, f64) {
    let sb = Sandbox::new(bin);
    let c = Arc::new(Cluster::start(&sb, &["cpu=2", "cpu=1"], &[]));
    let out = sb.path().join("out");
    let asking = Arc::new(AtomicBool::new(true));
    let ask = || {
        let (c, asking) = (c.clone(), asking.clone());
        std::thread::spawn(move || {
            let mut n = 0;
            while asking.load(Ordering::Relaxed) {
                c.mesh(1, &["status", "--json"]).expect_code(0);
                n += 1;
            }
            n
        })
    };
    let mut rate = 0.0;
    let asks = if let Some(bytes) = bytes {
        sb.write(
            "farm/farm.toml",
            &format!(
                r#"[farm]
name = "one"
[[stage]]
name = "w"
workdir = "w"
resources = {{ cpu = 2 }}
shell = 'head -c {bytes} /dev/zero > out.bin'
outputs = ["out.bin"]
"#
            ),
        );
        c.mesh(
            1,
            &["submit", "farm/farm.toml", "--out", &out.to_string_lossy()],
        )
        .expect_code(0);
        let dir = out.join("w/0");
        let part = |d: &Path| {
            std::fs::read_dir(d).is_ok_and(|es| {
                es.flatten()
                    .any(|e| e.file_name().to_string_lossy().starts_with(".out.bin."))
            })
        };
        let done = dir.join("out.bin");
        assert!(
            wait_until(Duration::from_secs(300), || part(&dir) || done.exists()),
            "no transfer began"
        );
        let start = Instant::now();
        let asker = asks.then(ask);
        assert!(
            wait_until(Duration::from_secs(300), || done.exists()),
            "the file did not come home"
        );
        rate = bytes as f64 / start.elapsed().as_secs_f64();
        asking.store(false, Ordering::Relaxed);
        let _ = std::fs::remove_file(&done);
        asker.map_or(0, |a| a.join().expect("asker"))
    } else {
        let asker = ask();
        std::thread::sleep(Duration::from_secs(3));
        asking.store(false, Ordering::Relaxed);
        asker.join().expect("asker")
    };
    let st = c.mesh(1, &["status", "--json", "--latency"]);
    let v = st.json();
    let home = v["nodes"]
        .as_array()
        .and_then(|ns| ns.iter().find(|n| n["local"] == true))
        .cloned()
        .unwrap_or_default();
    let rtt = home["latency"]
        .as_array()
        .and_then(|ls| ls.iter().find(|l| l["name"] == "message_rtt"))
        .cloned()
        .unwrap_or_default();
    println!(
        "  round trips ({asks} asks, {} measured{}): p50 {} ms, p99 {} ms",
        rtt["count"],
        if bytes.is_some() {
            ", during the transfer"
        } else {
            ", idle"
        },
        rtt["p50_ms"],
        rtt["p99_ms"]
    );
    (
        rate,
        rtt["p50_ms"].as_f64().unwrap_or(f64::NAN),
        rtt["p99_ms"].as_f64().unwrap_or(f64::NAN),
    )
}
