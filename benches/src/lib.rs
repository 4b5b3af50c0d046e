//! Support for mesh's benchmarks: timing commands, a minimal spawn loop as the floor, peak memory, reports.

pub mod procs;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// An environment knob with a default.
pub fn knob(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

pub fn ncpu() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

/// Removes what cargo adds to a benchmark's environment (LD_LIBRARY_PATH,
/// CARGO_*, RUST*), so every contender runs tasks in a user's environment:
/// cargo's LD_LIBRARY_PATH alone adds ~50 us to every exec of a task.
pub fn user_env(cmd: &mut Command) -> &mut Command {
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy();
        if k == "LD_LIBRARY_PATH" || k.starts_with("CARGO") || k.starts_with("RUST") {
            cmd.env_remove(k.as_ref());
        }
    }
    cmd
}

/// [`user_env`] for this process itself, so that everything it starts
/// (mesh nodes started by the test harness included, which take no
/// environment of their own) runs tasks in a user's environment. Call it
/// first, before any thread starts.
pub fn use_user_env() {
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy().into_owned();
        if k == "LD_LIBRARY_PATH" || k.starts_with("CARGO") || k.starts_with("RUST") {
            std::env::remove_var(k);
        }
    }
}

/// Runs a command to the end and returns its wall time; panics if it fails.
pub fn time(cmd: &mut Command) -> Duration {
    let start = Instant::now();
    let out = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .expect("start benchmark command");
    let took = start.elapsed();
    assert!(
        out.status.success(),
        "benchmark command failed: {:?}\n{}",
        cmd,
        String::from_utf8_lossy(&out.stderr)
    );
    took
}

/// The floor: spawn `n` `true` processes, `parallel` at a time, each in its own
/// process group through std (posix_spawn), reaping with a blocking wait.
pub fn spawn_loop(n: usize, parallel: usize) -> Duration {
    let start = Instant::now();
    let mut live = 0;
    let mut started = 0;
    while started < n || live > 0 {
        while live < parallel && started < n {
            let child = user_env(&mut Command::new("true"))
                .process_group(0)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn true");
            // Reaped below by waiting for any child; dropping a Child does not kill or wait.
            drop(child);
            live += 1;
            started += 1;
        }
        nix::sys::wait::wait().expect("wait for a child");
        live -= 1;
    }
    start.elapsed()
}

use std::os::unix::process::CommandExt;

/// CPU this process has used so far (user + system, its children not
/// counted).
pub fn self_cpu() -> Duration {
    use nix::sys::resource::{getrusage, UsageWho};
    let u = getrusage(UsageWho::RUSAGE_SELF).expect("getrusage");
    let d = |t: nix::sys::time::TimeVal| {
        Duration::from_secs(t.tv_sec() as u64) + Duration::from_micros(t.tv_usec() as u64)
    };
    d(u.user_time()) + d(u.system_time())
}

/// Median of a few samples.
pub fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// Writes a farm of `n` tasks running `command` (TOML array text) into `dir`.
pub fn write_range_farm(dir: &Path, n: u64, command: &str) -> std::path::PathBuf {
    let p = dir.join("farm.toml");
    std::fs::write(
        &p,
        format!("[farm]\nname = \"bench\"\n\n[[stage]]\nname = \"t\"\ncommand = {command}\nsweep.i = {{ range = \"1..{n}\" }}\n"),
    )
    .expect("write farm");
    p
}

/// A farm of about `n` tasks with keyed dependencies: `split` is
/// 1,000 keys × the rest, `merge` one task per key waiting for that key's
/// tasks of `split` (1000Genome's shape, at size).
pub fn write_keyed_farm(dir: &Path, n: u64, command: &str) -> std::path::PathBuf {
    let keys = 1000.min(n.max(2) / 2);
    let parts = (n.saturating_sub(keys) / keys).max(1);
    let p = dir.join("farm.toml");
    std::fs::write(
        &p,
        format!(
            "[farm]\nname = \"bench\"\n\n[[stage]]\nname = \"split\"\ncommand = {command}\n\
             sweep.key = {{ range = \"1..{keys}\" }}\nsweep.part = {{ range = \"1..{parts}\" }}\n\n\
             [[stage]]\nname = \"merge\"\ncommand = [\"true\"]\nsweep.key = {{ range = \"1..{keys}\" }}\n\
             after = [{{ stage = \"split\", by = [\"key\"] }}]\n"
        ),
    )
    .expect("write farm");
    p
}

/// Prints one result line and returns it as JSON for the summary.
pub fn report(
    name: &str,
    value: f64,
    unit: &str,
    target: Option<(&str, f64, bool)>,
) -> serde_json::Value {
    let verdict = match target {
        Some((op, t, met)) => format!(
            "  (target {op} {t}: {})",
            if met { "met" } else { "MISSED" }
        ),
        None => String::new(),
    };
    println!("{name:<44} {value:>12.3} {unit}{verdict}");
    serde_json::json!({"name": name, "value": value, "unit": unit, "target": target.map(|(op, t, met)| serde_json::json!({"op": op, "value": t, "met": met}))})
}

/// Saves results under target/bench-results/<bench>.json.
pub fn save(bench: &str, results: &[serde_json::Value]) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/bench-results");
    let _ = std::fs::create_dir_all(&dir);
    let path = dir.join(format!("{bench}.json"));
    if std::fs::write(
        &path,
        serde_json::to_vec_pretty(results).unwrap_or_default(),
    )
    .is_ok()
    {
        println!("results saved to {}", path.display());
    }
}

/// The WfCommons traces in `../shared/workflows` (from the project's root),
/// sorted: those whose path contains one of the comma-separated words of
/// the environment variable `pick`, or all. None, said, when the folder is
/// not there.
pub fn workflow_traces(pick: &str) -> Option<Vec<PathBuf>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/workflows");
    let words: Vec<String> = std::env::var(pick)
        .unwrap_or_default()
        .split(',')
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect();
    let Ok(entries) = std::fs::read_dir(&dir) else {
        println!("skipped: no WfCommons traces at {}", dir.display());
        return None;
    };
    let mut traces: Vec<PathBuf> = entries
        .map(|e| e.expect("read the traces' folder").path())
        .filter(|p| {
            p.extension().is_some_and(|e| e == "json")
                && !p.ends_with("wfcommons-schema.json")
                && (words.is_empty() || words.iter().any(|s| p.to_string_lossy().contains(s)))
        })
        .collect();
    traces.sort();
    Some(traces)
}

/// `mesh import wfformat` of `trace` into `dir`, runtimes x `time` and
/// sizes x `size`: its `--json` summary.
pub fn import_trace(
    mesh: &str,
    trace: &Path,
    dir: &Path,
    time: f64,
    size: f64,
) -> serde_json::Value {
    let o = user_env(&mut Command::new(mesh))
        .args(["import", "wfformat"])
        .arg(trace)
        .arg("-o")
        .arg(dir)
        .args([
            "--time-scale",
            &time.to_string(),
            "--size-scale",
            &size.to_string(),
            "--json",
        ])
        .output()
        .expect("run mesh import");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).expect("mesh import --json")
}
