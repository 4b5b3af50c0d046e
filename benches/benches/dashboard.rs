//! The cost of watching: `mesh run` of N `true` tasks serving the dashboard with one client on its event stream, over the same run without; the size of one update of a million-task farm, and its page's first render in a headless browser.
//!
//! The client is `curl -N` on `/api/events`: it takes every update as a
//! page would, without a browser's own CPU on this machine's cores.
//!
//! `cargo bench -p mesh-cli --bench dashboard`; knobs: MESH_BENCH_TASKS
//! (10000), MESH_BENCH_REPEAT (5), MESH_BENCH_WATCH_S (10, how long the
//! million-task farm is sampled).

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use mesh_benches::{knob, median, ncpu, report, save, user_env, write_range_farm};

#[path = "../../tests/e2e/browser.rs"]
#[allow(dead_code)]
mod browser;

/// Starts `mesh run` on `farm` (with `--http` when `http`); returns the
/// child and, with `--http`, the dashboard's address once printed.
fn start(dir: &Path, farm: &Path, http: bool) -> (Child, Option<String>) {
    let mesh = env!("CARGO_BIN_EXE_mesh");
    let mut cmd = Command::new(mesh);
    user_env(&mut cmd)
        .args([
            "run",
            farm.to_str().expect("utf-8 path"),
            "--quiet",
            "--resources",
            &format!("cpu={}", ncpu()),
        ])
        .env("MESH_STATE_DIR", dir.join("state"))
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if http {
        cmd.args(["--http", "127.0.0.1:0"]);
    }
    let mut child = cmd.spawn().expect("start mesh run");
    let stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(url) = line.strip_prefix("dashboard: ") {
                let _ = tx.send(url.to_string());
            }
        }
    });
    let url = http.then(|| {
        rx.recv_timeout(Duration::from_secs(30))
            .expect("mesh run printed its dashboard address")
    });
    (child, url)
}

fn curl(args: &[&str]) -> Command {
    let mut c = Command::new("curl");
    c.args(args).stdin(Stdio::null()).stderr(Stdio::null());
    c
}

/// One `mesh run` of the farm, timed from start to exit; with a client on
/// the event stream when `watched`.
fn one_run(n: u64, watched: bool) -> Duration {
    let dir = tempfile::tempdir().expect("temp dir");
    let farm = write_range_farm(dir.path(), n, "[\"true\"]");
    let t = Instant::now();
    let (mut child, url) = start(dir.path(), &farm, watched);
    let client = url.map(|u| {
        curl(&["-sN", &format!("{u}api/events")])
            .stdout(Stdio::null())
            .spawn()
            .expect("start curl")
    });
    let status = child.wait().expect("mesh run ends");
    let took = t.elapsed();
    if let Some(mut c) = client {
        let _ = c.kill();
        let _ = c.wait();
    }
    assert!(status.success(), "mesh run failed");
    took
}

fn main() {
    let n = knob("MESH_BENCH_TASKS", 10_000);
    let repeat = knob("MESH_BENCH_REPEAT", 5) as usize;
    let watch_s = knob("MESH_BENCH_WATCH_S", 10);
    if Command::new("curl").arg("--version").output().is_err() {
        eprintln!("the dashboard bench needs curl as its client");
        std::process::exit(1);
    }
    println!("dashboard: {n} tasks of `true`, served and watched or not, median of {repeat}");

    // Alternated, so drift on the machine falls on both alike.
    let (mut plain, mut watched) = (Vec::new(), Vec::new());
    for _ in 0..repeat {
        plain.push(one_run(n, false));
        watched.push(one_run(n, true));
        println!(
            "  sample: plain {:.3}s watched {:.3}s",
            plain.last().expect("one").as_secs_f64(),
            watched.last().expect("one").as_secs_f64()
        );
    }
    let (p, w) = (median(plain), median(watched));
    let ratio = w.as_secs_f64() / p.as_secs_f64();

    // A million-task farm, sampled while it runs.
    let dir = tempfile::tempdir().expect("temp dir");
    let farm = write_range_farm(dir.path(), 1_000_000, "[\"true\"]");
    let (mut child, url) = start(dir.path(), &farm, true);
    let url = url.expect("an address");
    // The page's first render, on the farm's busiest moment (its start),
    // where chromium is installed: the 1 s a user waits at most.
    let first_render = browser::installed().map(|(chromium, driver)| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
            .block_on(async {
                let b = browser::Browser::start(&chromium, &driver).await;
                b.open(&url).await
            })
    });
    let mut sizes = Vec::new();
    let until = Instant::now() + Duration::from_secs(watch_s);
    while Instant::now() < until {
        std::thread::sleep(Duration::from_secs(1));
        let out = curl(&["-s", &format!("{url}api/status")])
            .output()
            .expect("curl");
        sizes.push(out.stdout.len());
    }
    let metrics = curl(&["-s", &format!("{url}metrics")])
        .output()
        .expect("curl");
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    );
    let _ = child.wait();
    let biggest = sizes.iter().copied().max().unwrap_or(0) as f64 / 1024.0;
    println!(
        "  million-task farm: {} updates, {:.1}..{:.1} KiB; /metrics {:.1} KiB",
        sizes.len(),
        sizes.iter().copied().min().unwrap_or(0) as f64 / 1024.0,
        biggest,
        metrics.stdout.len() as f64 / 1024.0
    );

    let mut results = vec![
        report("mesh run wall, no dashboard", p.as_secs_f64(), "s", None),
        report(
            "mesh run wall, dashboard watched",
            w.as_secs_f64(),
            "s",
            None,
        ),
        report(
            "watched / plain wall ratio",
            ratio,
            "",
            Some(("<=", 1.03, ratio <= 1.03)),
        ),
        report(
            "largest update, 1M-task farm",
            biggest,
            "KiB",
            Some(("<=", 64.0, biggest <= 64.0 && !sizes.is_empty())),
        ),
    ];
    if let Some(ms) = first_render {
        println!("  million-task farm: first render in a headless browser {ms} ms");
        results.push(report(
            "page first render, 1M-task farm",
            ms as f64,
            "ms",
            Some(("<=", 1000.0, ms <= 1000)),
        ));
    }
    save("dashboard", &results);
}
