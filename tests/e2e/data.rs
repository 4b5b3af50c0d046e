//! Files between real nodes: a big output home intact in bounded memory, a transfer cut by the home's SIGKILL going on where it stopped, outputs taken in place on a shared file system.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use mesh_tests::{wait_until, Cluster, Sandbox};

use crate::sandbox;

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

/// One task writing `bytes` of a known pattern (not all one byte) as
/// `w/out.bin`, asking for 2 cores: on a mesh of a node of 2 and a home of
/// 1, it runs on the other node and its output comes home.
fn big_farm(sb: &Sandbox, bytes: u64) {
    sb.write(
        "farm/farm.toml",
        &format!(
            r#"[farm]
name = "big"
[[stage]]
name = "w"
workdir = "w"
resources = {{ cpu = 2 }}
shell = '{} > out.bin'
outputs = ["out.bin"]
"#,
            pattern(bytes)
        ),
    );
}

/// A shell pipeline writing `bytes` of a pattern on its standard output.
fn pattern(bytes: u64) -> String {
    format!("yes 0123456789abcdefghijklmnopqrstuvwxyz | head -c {bytes}")
}

/// Whether `file` holds exactly the pattern of `bytes` (compared as it streams).
fn holds_pattern(file: &Path, bytes: u64) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!(
            "{} | cmp -s - '{}'",
            pattern(bytes),
            file.display()
        ))
        .status()
        .is_ok_and(|s| s.success())
}

fn rss_kib(pid: i32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// The node's own counters (`mesh status --json`).
fn counter(c: &Cluster, i: usize, name: &str) -> u64 {
    c.own_status(i)["counters"][name].as_u64().unwrap_or(0)
}

fn submit(c: &Cluster, sb: &Sandbox, home: usize) -> String {
    let out = sb.path().join("out");
    let r = c.mesh(
        home,
        &["submit", "farm/farm.toml", "--out", &out.to_string_lossy()],
    );
    r.expect_code(0);
    r.stdout.lines().next().unwrap_or_default().to_string()
}

#[test]
fn a_6_gib_output_comes_home_intact_while_the_sender_stays_within_64_mib_of_idle() {
    let sb = sandbox();
    let c = Cluster::start(&sb, &["cpu=2", "cpu=1"], &[]);
    let sender = c.nodes[0].pid().as_raw();
    std::thread::sleep(Duration::from_secs(1));
    let idle = rss_kib(sender);
    let size = 6 * GIB;
    big_farm(&sb, size);
    let id = submit(&c, &sb, 1);
    let mut peak = idle;
    let out = sb.path().join("out/w/0/out.bin");
    let part = sb.path().join("out/w/0/.out.bin.part");
    // What `mesh wait`, `mesh watch` and the dashboard show while it comes.
    let mut shown = serde_json::Value::Null;
    let mut last_look = Instant::now();
    let home = wait_until(Duration::from_secs(600), || {
        peak = peak.max(rss_kib(sender));
        if shown.is_null() && part.exists() && last_look.elapsed() > Duration::from_secs(3) {
            last_look = Instant::now();
            let data = c.status(1)["farms"][0]["data"].clone();
            if data["rate_bps"].as_f64().unwrap_or(0.0) > 0.0 {
                shown = data;
            }
        }
        out.exists()
    });
    assert!(home, "the output did not come home: {}", c.status(1));
    let (got, to_come) = (
        shown["home_bytes"].as_u64(),
        shown["to_come_bytes"].as_u64(),
    );
    assert!(
        got.is_some_and(|b| b > 0 && b < size) && to_come.is_some_and(|b| b > 0 && b < size),
        "no bytes coming home were shown: {shown}"
    );
    c.mesh(1, &["wait", &id]).expect_code(0);
    assert_eq!(std::fs::metadata(&out).unwrap().len(), size);
    assert!(holds_pattern(&out, size), "the output came home changed");
    let sent = counter(&c, 0, "bytes_sent");
    assert!(sent >= size, "it came over the mesh: {sent} bytes sent");
    let grew = peak.saturating_sub(idle) / 1024;
    println!("sender: idle {} MiB, peak {} MiB", idle / 1024, peak / 1024);
    assert!(
        grew <= 64,
        "the sender grew by {grew} MiB while it sent 6 GiB (idle {} MiB)",
        idle / 1024
    );
    let _ = std::fs::remove_file(&out);
}

#[test]
fn the_home_killed_halfway_through_a_2_gib_output_goes_on_from_where_it_stopped() {
    let sb = sandbox();
    let mut c = Cluster::start(&sb, &["cpu=2", "cpu=1"], &["--dead-after-ms", "1500"]);
    let size = 2 * GIB;
    big_farm(&sb, size);
    let id = submit(&c, &sb, 1);
    let dir = sb.path().join("out/w/0");
    let part = dir.join(".out.bin.part");
    let len = |p: &Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
    assert!(
        wait_until(Duration::from_secs(300), || len(&part) >= size / 2),
        "the transfer never got halfway: {}",
        c.status(1)
    );
    c.kill(1);
    let had = len(&part);
    let sent_before = counter(&c, 0, "bytes_sent");
    assert!(had < size, "it was whole before the kill");
    let restarted = Instant::now();
    c.restart(1, "cpu=1", &["--dead-after-ms", "1500"]);
    let r = c.mesh(1, &["wait", &id, "--json"]);
    r.expect_code(0);
    let out = dir.join("out.bin");
    assert_eq!(len(&out), size);
    assert!(holds_pattern(&out, size), "the output came home changed");
    assert!(!part.exists(), "the part is left behind");
    let sent = counter(&c, 0, "bytes_sent");
    // Sent in all, less the whole file once: what went twice.
    let twice = sent.saturating_sub(size);
    println!(
        "killed with {} MiB of {} MiB home ({} MiB sent by then); the sender sent {} MiB in all, {} MiB twice; home {:.1}s after the restart",
        had / MIB,
        size / MIB,
        sent_before / MIB,
        sent / MIB,
        twice / MIB,
        restarted.elapsed().as_secs_f64()
    );
    assert!(
        twice < size / 4,
        "{} MiB of the 2 GiB went twice",
        twice / MIB
    );
    let _ = std::fs::remove_file(&out);
}

#[test]
fn on_a_shared_file_system_outputs_are_taken_in_place_not_sent() {
    let sb = sandbox();
    // Every node's state folder is in the sandbox, which every node sees:
    // a cluster's shared file system, said with --shared-fs.
    let c = Cluster::start(&sb, &["cpu=2", "cpu=2", "cpu=1"], &["--shared-fs"]);
    let n = 6u64;
    sb.write(
        "farm/farm.toml",
        &format!(
            r#"[farm]
name = "shared"
[[stage]]
name = "w"
sweep.i = {{ range = "0..{}" }}
workdir = "w/{{i}}"
resources = {{ cpu = 2 }}
shell = '{} > out.bin; echo {{i}} >> out.bin'
outputs = ["out.bin"]
"#,
            n - 1,
            pattern(3 * MIB)
        ),
    );
    let id = submit(&c, &sb, 2);
    c.mesh(2, &["wait", &id]).expect_code(0);
    let mut bytes = 0;
    for i in 0..n {
        let f = sb.path().join(format!("out/w/{i}/out.bin"));
        let text = std::fs::read(&f).unwrap();
        assert!(text.ends_with(format!("{i}\n").as_bytes()), "{i}");
        bytes += text.len() as u64;
    }
    let sent = counter(&c, 0, "bytes_sent") + counter(&c, 1, "bytes_sent");
    let in_place = counter(&c, 2, "bytes_in_place");
    println!("{bytes} bytes of outputs: {sent} sent over the mesh, {in_place} taken in place");
    assert_eq!(sent, 0, "outputs went over the mesh");
    assert_eq!(in_place, bytes);
}
