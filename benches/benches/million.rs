//! A million-task range sweep, and a million tasks with keyed dependencies
//! (a merge per key of that key's tasks): time from start to the first task
//! running, and peak memory per task, each against a one-task farm measured
//! in the same run.
//!
//! The peak covers start-up and the first tasks (the expansion, the stores,
//! the per-task state) and the growth while tasks complete; the store's cache
//! is capped (32 MiB), so memory stops growing with completed tasks.
//!
//! `cargo bench -p mesh-cli --bench million`; knobs: MESH_BENCH_TASKS (1000000),
//! MESH_BENCH_RUN_SECS (30, how long the big farm runs before it is stopped).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use mesh_benches::{knob, report, save, write_keyed_farm, write_range_farm};
use mesh_sim::peak_rss_bytes;

/// Starts a farm whose tasks mark `first` once, lets it run for `run_for`;
/// returns (time to first task, peak RSS, tasks done by then).
fn probe(mesh: &str, dir: &Path, n: u64, keyed: bool, run_for: Duration) -> (Duration, u64, u64) {
    let mark = "[\"sh\", \"-c\", \"[ -e first ] || : > first\"]";
    let farm = if keyed {
        write_keyed_farm(dir, n, mark)
    } else {
        write_range_farm(dir, n, mark)
    };
    let start = Instant::now();
    let mut child = mesh_benches::user_env(&mut Command::new(mesh))
        .args(["run", farm.to_str().unwrap(), "--quiet"])
        .env("MESH_STATE_DIR", dir.join("state"))
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start mesh");
    let first = dir.join("first");
    let deadline = start + Duration::from_secs(120);
    while !first.exists() {
        assert!(Instant::now() < deadline, "no task started within 120 s");
        assert!(
            child.try_wait().unwrap().is_none(),
            "mesh exited before any task ran"
        );
        std::thread::sleep(Duration::from_micros(500));
    }
    let to_first = start.elapsed();
    let mut peak = 0;
    let until = Instant::now() + run_for;
    while Instant::now() < until && child.try_wait().unwrap().is_none() {
        peak = peak.max(peak_rss_bytes(Some(child.id())).unwrap_or(0));
        std::thread::sleep(Duration::from_millis(50));
    }
    peak = peak.max(peak_rss_bytes(Some(child.id())).unwrap_or(0));
    // The status snapshot is at most a second old; good enough for a rate.
    let status = mesh_benches::user_env(&mut Command::new(mesh))
        .args(["status", "--json"])
        .env("MESH_STATE_DIR", dir.join("state"))
        .output()
        .expect("mesh status");
    let done = serde_json::from_slice::<serde_json::Value>(&status.stdout)
        .ok()
        .and_then(|v| v["counts"]["done"].as_u64())
        .unwrap_or(0);
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    );
    let _ = child.wait();
    (to_first, peak, done)
}

fn main() {
    let n = knob("MESH_BENCH_TASKS", 1_000_000);
    let run_secs = knob("MESH_BENCH_RUN_SECS", 30);
    let mesh = env!("CARGO_BIN_EXE_mesh");
    println!("million: a {n}-task range sweep, run for {run_secs}s, against a 1-task farm");
    let small_dir = tempfile::tempdir().expect("temp dir");
    let (small_first, small_peak, _) =
        probe(mesh, small_dir.path(), 1, false, Duration::from_secs(1));
    let big_dir = tempfile::tempdir().expect("temp dir");
    let (big_first, big_peak, big_done) = probe(
        mesh,
        big_dir.path(),
        n,
        false,
        Duration::from_secs(run_secs),
    );
    let keyed_dir = tempfile::tempdir().expect("temp dir");
    let (keyed_first, keyed_peak, _) = probe(
        mesh,
        keyed_dir.path(),
        n,
        true,
        Duration::from_secs(run_secs.min(10)),
    );
    let keyed_per_task = keyed_peak as f64 / n as f64;
    let per_task = big_peak as f64 / n as f64;
    let marginal = big_peak.saturating_sub(small_peak) as f64 / n as f64;
    let results = vec![
        report(
            "1-task farm: start to first task",
            small_first.as_secs_f64(),
            "s",
            None,
        ),
        report(
            &format!("{n}-task farm: start to first task"),
            big_first.as_secs_f64(),
            "s",
            Some(("<=", 2.0, big_first.as_secs_f64() <= 2.0)),
        ),
        report(
            "first-task latency ratio (big / 1-task)",
            big_first.as_secs_f64() / small_first.as_secs_f64(),
            "",
            None,
        ),
        report(
            "1-task farm: peak RSS",
            small_peak as f64 / (1 << 20) as f64,
            "MiB",
            None,
        ),
        report(
            &format!("{n}-task farm: peak RSS"),
            big_peak as f64 / (1 << 20) as f64,
            "MiB",
            None,
        ),
        report(
            "peak RSS per task",
            per_task,
            "bytes",
            Some(("<=", 200.0, per_task <= 200.0)),
        ),
        report(
            "marginal RSS per task (over 1-task farm)",
            marginal,
            "bytes",
            None,
        ),
        report(
            &format!("tasks completed in the {run_secs}s window"),
            big_done as f64,
            "tasks",
            None,
        ),
        report(
            &format!("{n} tasks, keyed dependencies: start to first task"),
            keyed_first.as_secs_f64(),
            "s",
            Some(("<=", 2.0, keyed_first.as_secs_f64() <= 2.0)),
        ),
        report(
            "keyed: peak RSS per task",
            keyed_per_task,
            "bytes",
            Some(("<=", 200.0, keyed_per_task <= 200.0)),
        ),
    ];
    save("million", &results);
}
