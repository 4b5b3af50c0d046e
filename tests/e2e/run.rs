//! Running farms: outputs, dependencies, retries, timeouts, failures, resources, environment.

use std::time::Duration;

use crate::sandbox;
use mesh_tests::{alive, wait_until};

#[test]
fn sweep_collects_outputs_into_the_tree_and_keeps_logs() {
    let s = sandbox();
    s.write("params.txt", "alpha\nbeta\n\ngamma\n");
    s.write("wrapper.sh", "#!/bin/sh\necho \"$1-$2\" > result.dat\nmkdir -p logs\necho log-$2 > logs/run.log\necho said $1 $2\necho warned $1 >&2\n");
    s.write(
        "farm.toml",
        r#"
[farm]
name = "sweep"

[[stage]]
name = "solve"
command = ["./wrapper.sh", "{x}", "{seed}"]
sweep.x = { lines = "params.txt" }
sweep.seed = { range = "1..2" }
workdir = "runs/{stage}/{index}"
inputs = ["wrapper.sh"]
outputs = ["result.dat", "logs/*.log"]
"#,
    );
    let r = s.mesh(&["run", "farm.toml", "--out", "results"]);
    r.expect_code(0);
    // 3 lines x 2 seeds, first variable slowest: index 3 is beta/2.
    for (i, want) in [
        "alpha-1", "alpha-2", "beta-1", "beta-2", "gamma-1", "gamma-2",
    ]
    .iter()
    .enumerate()
    {
        assert_eq!(
            s.read(&format!("results/solve/{i}/result.dat")).trim(),
            *want
        );
        assert!(s.exists(&format!("results/solve/{i}/logs/run.log")));
    }
    let logs = s.mesh(&["logs", "solve/3"]);
    logs.expect_code(0);
    assert_eq!(logs.stdout.trim(), "said beta 2");
    assert_eq!(logs.stderr.trim(), "warned beta");
    let st = s.mesh(&["status", "--json"]);
    let v = st.json();
    assert_eq!(v["state"], "done");
    assert_eq!(v["counts"]["done"], 6);
    let list = s.mesh(&["list", "--json"]).json();
    assert_eq!(list.as_array().unwrap().len(), 1);
    assert_eq!(list[0]["name"], "sweep");
}

#[test]
fn tasks_without_output_make_no_log_files_and_no_folders() {
    let s = sandbox();
    s.write(
        "farm.toml",
        "[[stage]]\nname = \"quiet\"\ncommand = [\"true\"]\nsweep.i = { range = \"1..20\" }\n",
    );
    s.mesh(&["run", "farm.toml"]).expect_code(0);
    let logs = s.state().join("farms");
    let farm = std::fs::read_dir(&logs)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    assert!(
        !farm.join("logs").exists(),
        "tasks that print nothing leave no log files"
    );
    assert!(
        !s.exists("mesh-out"),
        "no outputs asked, no output folders made"
    );
}

#[test]
fn pipeline_dependencies_run_in_order() {
    let s = sandbox();
    s.write(
        "farm.toml",
        r#"
[[stage]]
name = "simulate"
shell = "echo $(( {n} * 10 )) > value.txt"
sweep.n = { range = "1..4" }
workdir = "work/sim/{index}"
outputs = ["value.txt"]

[[stage]]
name = "analyze"
after_each = "simulate"
shell = "echo $(( $(cat {out}/simulate/{index}/value.txt) + 1 )) > analyzed.txt"
sweep.n = { range = "1..4" }
workdir = "work/ana/{index}"
outputs = ["analyzed.txt"]

[[stage]]
name = "report"
after = ["analyze"]
shell = "cat {out}/analyze/*/analyzed.txt | sort -n | tr '\n' ' ' > summary.txt"
outputs = ["summary.txt"]
"#,
    );
    s.mesh(&["run", "farm.toml", "--out", "o"]).expect_code(0);
    assert_eq!(s.read("o/report/0/summary.txt").trim(), "11 21 31 41");
}

#[test]
fn retries_use_attempts_and_exhausted_tasks_fail_their_dependents() {
    let s = sandbox();
    s.write(
        "farm.toml",
        r#"
[[stage]]
name = "flaky"
# Fails on its first attempt, succeeds on the second.
shell = "echo attempt $MESH_ATTEMPT >> flaky-{index}.txt; [ $MESH_ATTEMPT -ge 2 ]"
sweep.i = { range = "0..1" }
retries = 1

[[stage]]
name = "broken"
shell = "echo boom >&2; exit 3"
retries = 2

[[stage]]
name = "downstream"
after = ["broken"]
command = ["true"]
"#,
    );
    let r = s.mesh(&["run", "farm.toml", "--json"]);
    r.expect_code(1);
    let v = r.json();
    assert_eq!(v["state"], "failed");
    assert_eq!(v["counts"]["done"], 2, "both flaky tasks succeed on retry");
    assert_eq!(v["counts"]["failed"], 1);
    assert_eq!(
        v["counts"]["skipped"], 1,
        "downstream of a failed stage does not run"
    );
    assert_eq!(s.lines("flaky-0.txt"), vec!["attempt 1", "attempt 2"]);
    assert_eq!(v["failed"][0]["task"], "broken/0");
    assert_eq!(
        v["failed"][0]["attempt"], 3,
        "two retries after the first failure"
    );
    assert!(v["failed"][0]["reason"]
        .as_str()
        .unwrap()
        .contains("exit code 3"));
    let logs = s.mesh(&["logs", "broken/0"]);
    assert_eq!(logs.stderr.trim(), "boom");
    assert!(
        r.stderr.contains("task broken/0 failed"),
        "failures are reported as they happen:\n{}",
        r.stderr
    );
}

#[test]
fn a_timeout_kills_the_whole_process_group() {
    let s = sandbox();
    s.write(
        "farm.toml",
        r#"
[[stage]]
name = "slow"
# A background grandchild records its pid; the timeout must kill it too.
shell = "sleep 60 & echo $! > grandchild.pid; wait"
timeout = "1s"
"#,
    );
    let r = s.mesh(&["run", "farm.toml", "--json"]);
    r.expect_code(1);
    let v = r.json();
    assert!(
        v["failed"][0]["reason"]
            .as_str()
            .unwrap()
            .contains("timed out after 1s"),
        "{v}"
    );
    let pid: i32 = s.read("grandchild.pid").trim().parse().unwrap();
    assert!(
        wait_until(Duration::from_secs(5), || !alive(pid)),
        "the task's background child {pid} survived the timeout"
    );
}

#[test]
fn a_task_is_over_when_it_exits_whoever_holds_its_pipes() {
    let s = sandbox();
    s.write(
        "farm.toml",
        r#"
[[stage]]
name = "detached"
# Its background child keeps the task's stdout open long after it exits.
shell = "sleep 60 & echo $! > bg.pid; echo started"

[[stage]]
name = "closed"
# It closes its output, then runs on: its exit code still counts.
shell = "echo before; exec >&- 2>&-; sleep 0.3; exit 7"
"#,
    );
    let started = std::time::Instant::now();
    let r = s.mesh(&["run", "farm.toml", "--json"]);
    let took = started.elapsed();
    let pid: i32 = s.read("bg.pid").trim().parse().unwrap();
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    );
    r.expect_code(1);
    assert!(
        took < Duration::from_secs(30),
        "the farm waited for the task's background child ({took:?})"
    );
    let v = r.json();
    assert_eq!(v["counts"]["done"], 1, "{v}");
    assert_eq!(v["failed"][0]["task"], "closed/0", "{v}");
    assert!(
        v["failed"][0]["reason"].as_str().unwrap().contains('7'),
        "{v}"
    );
    assert_eq!(s.mesh(&["logs", "detached/0"]).stdout.trim(), "started");
    assert_eq!(s.mesh(&["logs", "closed/0"]).stdout.trim(), "before");
}

#[test]
fn success_codes_and_missing_outputs_decide_success() {
    let s = sandbox();
    s.write(
        "farm.toml",
        r#"
[[stage]]
name = "grep-style"
shell = "exit 1"
success_codes = [0, 1]

[[stage]]
name = "forgetful"
shell = "echo no result"
outputs = ["result.dat"]
"#,
    );
    let v = s.mesh(&["run", "farm.toml", "--json"]).json();
    assert_eq!(v["counts"]["done"], 1);
    assert_eq!(v["failed"][0]["task"], "forgetful/0");
    assert!(v["failed"][0]["reason"]
        .as_str()
        .unwrap()
        .contains("output `result.dat` was not produced"));
}

#[test]
fn tasks_see_their_identity_and_granted_resources() {
    let s = sandbox();
    s.write(
        "farm.toml",
        r#"
[farm]
name = "envy"

[[stage]]
name = "gpu"
shell = "echo $MESH_FARM $MESH_TASK_ID $MESH_ATTEMPT $MESH_RESOURCE_CPU $MESH_RESOURCE_GPU $CUDA_VISIBLE_DEVICES $(basename $MESH_WORKDIR) > env.txt"
sweep.i = { range = "0..1" }
workdir = "w/{index}"
resources = { cpu = 1, gpu = 1 }
outputs = ["env.txt"]

[[stage]]
name = "cpu"
shell = "echo [$CUDA_VISIBLE_DEVICES] > env.txt"
workdir = "c"
outputs = ["env.txt"]
"#,
    );
    s.mesh(&[
        "run",
        "farm.toml",
        "--out",
        "o",
        "--resources",
        "cpu=4,gpu=2",
    ])
    .expect_code(0);
    let a = s.read("o/gpu/0/env.txt");
    let b = s.read("o/gpu/1/env.txt");
    let fields = |t: &str| t.split_whitespace().map(str::to_string).collect::<Vec<_>>();
    let (a, b) = (fields(&a), fields(&b));
    assert_eq!(&a[..5], &["envy", "gpu/0", "1", "1", "1"]);
    assert_eq!(a[6], "0");
    assert_eq!(b[1], "gpu/1");
    let mut devices = vec![a[5].clone(), b[5].clone()];
    devices.sort();
    assert_eq!(devices, vec!["0", "1"], "each gpu task gets its own device");
    assert_eq!(
        s.read("o/cpu/0/env.txt").trim(),
        "[]",
        "tasks that ask no gpu see none"
    );
}

#[test]
fn a_counted_resource_limits_concurrency_and_a_task_that_fits_nowhere_is_reported() {
    let s = sandbox();
    s.write(
        "farm.toml",
        r#"
[[stage]]
name = "licensed"
# Each task holds the one license token: never two inside at once.
shell = "if [ -e inside ]; then echo overlap >> overlaps; fi; touch inside; sleep 0.1; rm inside"
sweep.i = { range = "1..6" }
resources = { cpu = 1, token = 1 }

[[stage]]
name = "huge"
command = ["true"]
resources = { cpu = 1, mem = "100TiB" }
"#,
    );
    let r = s.mesh(&["run", "farm.toml", "--resources", "cpu=4,token=1", "--json"]);
    r.expect_code(1);
    assert!(
        !s.exists("overlaps"),
        "two tasks held the single token at once"
    );
    let v = r.json();
    assert_eq!(v["counts"]["done"], 6);
    assert_eq!(v["counts"]["failed"], 1);
    assert!(
        r.stderr
            .contains("stage huge cannot run here: mem=100TiB asked"),
        "{}",
        r.stderr
    );
}

#[test]
fn every_example_farm_runs() {
    let examples = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    for entry in std::fs::read_dir(&examples).unwrap() {
        let dir = entry.unwrap().path();
        if !dir.join("farm.toml").exists() {
            continue;
        }
        let s = sandbox();
        for f in std::fs::read_dir(&dir).unwrap() {
            let f = f.unwrap().path();
            if f.is_file() {
                let name = f.file_name().unwrap().to_str().unwrap().to_string();
                s.write(&name, &std::fs::read_to_string(&f).unwrap());
            }
        }
        let r = s.mesh(&["run", "farm.toml", "--resources", "token=2", "--json"]);
        r.expect_code(0);
        let v = r.json();
        assert_eq!(
            v["counts"]["done"],
            v["counts"]["total"],
            "{}: {v}",
            dir.display()
        );
    }
}

#[test]
fn mesh_status_says_when_a_running_farm_ends_from_its_own_runtimes() {
    let s = sandbox();
    // 4 tasks of 0.4 s, then 4 of 1.2 s, one at a time: 6.4 s.
    s.write(
        "farm.toml",
        r#"
[[stage]]
name = "short"
sweep.i = { range = "1..4" }
shell = "sleep 0.4"

[[stage]]
name = "long"
after = ["short"]
sweep.i = { range = "1..4" }
shell = "sleep 1.2"
"#,
    );
    let run = s.spawn(&["run", "farm.toml", "--resources", "cpu=1"]);
    // Null until `mesh run` has written its first snapshot.
    let status = || {
        let r = s.mesh(&["status", "--json"]);
        serde_json::from_str::<serde_json::Value>(&r.stdout).unwrap_or_default()
    };
    // Once a long task has run, the estimate is the farm's own.
    let mut seen = None;
    assert!(
        wait_until(Duration::from_secs(30), || {
            let v = status();
            let long_done = v["stages"][1]["counts"]["done"].as_u64().unwrap_or(0);
            if long_done >= 1 && v["eta"]["guessed"].as_array().is_some_and(|g| g.is_empty()) {
                seen = Some(v);
            }
            seen.is_some()
        }),
        "no estimate of the end while it ran"
    );
    let said = s.mesh(&["status"]).stdout;
    run.wait().expect_code(0);
    let v = seen.unwrap();
    let eta = &v["eta"];
    let (at, p50, p90) = (
        eta["at_ms"].as_u64().unwrap(),
        eta["p50_ms"].as_u64().unwrap(),
        eta["p90_ms"].as_u64().unwrap(),
    );
    assert!(p50 <= p90, "{eta}");
    let ended = status()["updated_at_ms"].as_u64().unwrap();
    let left = ended.saturating_sub(at) as f64;
    eprintln!("mesh run: estimated {p50} ms (p90 {p90}), ended {left} ms later");
    // The long stage's tasks, each known to run 1.2 s, and the one running
    // known to have run so long: right to within a second.
    assert!(
        (p50 as f64 - left).abs() <= 1000.0,
        "estimated {p50} ms from {at}, ended {left} ms later: {eta}"
    );
    assert!(
        said.contains("ends in about") || said.contains("ends any moment"),
        "{said}"
    );
    assert!(status()["eta"].is_null(), "an ended farm has no estimate");
}
