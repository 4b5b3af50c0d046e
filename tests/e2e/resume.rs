//! Durability: SIGKILL and resume, Ctrl-C and resume, re-runs skipping work by content key.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::sandbox;
use mesh_tests::{wait_until, Sandbox};
use nix::sys::signal::Signal;

const TASKS: usize = 40;
const SLOTS: usize = 4;

/// Each task writes `start <attempt>` then, 0.2 s later, `end <attempt>` to eff/<index>.
fn side_effect_farm(s: &Sandbox) {
    std::fs::create_dir_all(s.path().join("eff")).unwrap();
    s.write(
        "farm.toml",
        &format!(
            r#"
[[stage]]
name = "work"
shell = "echo start $MESH_ATTEMPT >> eff/{{index}}; sleep 0.2; echo end $MESH_ATTEMPT >> eff/{{index}}"
sweep.i = {{ range = "1..{TASKS}" }}
"#
        ),
    );
}

/// Per task: (attempts of its start lines, number of end lines).
fn effects(s: &Sandbox) -> BTreeMap<usize, (Vec<u32>, usize)> {
    (0..TASKS)
        .map(|i| {
            let lines = s.lines(&format!("eff/{i}"));
            let starts = lines
                .iter()
                .filter_map(|l| l.strip_prefix("start "))
                .map(|a| a.parse().unwrap())
                .collect();
            let ends = lines.iter().filter(|l| l.starts_with("end ")).count();
            (i, (starts, ends))
        })
        .collect()
}

fn ended(s: &Sandbox) -> usize {
    effects(s).values().filter(|(_, e)| *e > 0).count()
}

#[test]
fn sigkill_then_resume_runs_each_finished_task_once() {
    let s = sandbox();
    side_effect_farm(&s);
    let resources = format!("cpu={SLOTS}");
    let bg = s.spawn(&["run", "farm.toml", "--resources", &resources]);
    assert!(
        wait_until(Duration::from_secs(60), || ended(&s) >= 10),
        "tasks did not progress"
    );
    bg.signal(Signal::SIGKILL);
    let killed = bg.wait();
    assert_eq!(killed.code, None, "mesh died by the signal");
    assert!(ended(&s) < TASKS, "the kill came too late to test anything");

    let st = s.mesh(&["status", "--json"]).json();
    assert_eq!(st["state"], "crashed");

    // Let the orphaned tasks of the dead run finish their sleep before resuming.
    std::thread::sleep(Duration::from_millis(400));
    let r = s.mesh(&["resume", "--resources", &resources, "--json"]);
    r.expect_code(0);
    assert_eq!(r.json()["counts"]["done"], TASKS as u64);

    let mut rerun = 0;
    for (i, (starts, ends)) in effects(&s) {
        assert!(ends >= 1, "task {i} never finished");
        if starts.len() == 1 {
            assert_eq!(ends, 1, "task {i} ran once but ended {ends} times");
        } else {
            // Only a task that was running at the kill runs again, with a raised attempt.
            rerun += 1;
            assert_eq!(starts.len(), 2, "task {i} started {starts:?}");
            assert!(
                starts[1] > starts[0],
                "task {i} was rerun without a raised attempt: {starts:?}"
            );
        }
    }
    assert!(
        rerun <= SLOTS,
        "{rerun} tasks ran twice, but only {SLOTS} can run at once"
    );
}

#[test]
fn ctrl_c_stops_cleanly_and_resume_finishes_without_repeating_work() {
    let s = sandbox();
    side_effect_farm(&s);
    let bg = s.spawn(&["run", "farm.toml", "--resources", "cpu=2"]);
    assert!(
        wait_until(Duration::from_secs(60), || ended(&s) >= 4),
        "tasks did not progress"
    );
    bg.signal(Signal::SIGINT);
    let r = bg.wait();
    r.expect_code(130);
    assert!(
        r.stderr.contains("mesh resume"),
        "tells how to continue: {}",
        r.stderr
    );
    let st = s.mesh(&["status", "--json"]).json();
    assert_eq!(st["state"], "interrupted");
    assert_eq!(st["counts"]["running"], 0);

    s.mesh(&["resume", "--resources", "cpu=2"]).expect_code(0);
    for (i, (starts, ends)) in effects(&s) {
        assert_eq!(ends, 1, "task {i} ended {ends} times (starts {starts:?})");
    }
}

#[test]
fn rerunning_an_unchanged_farm_skips_tasks_whose_content_key_succeeded() {
    let s = sandbox();
    s.write("input.txt", "v1");
    let farm = |extra: &str| {
        format!(
            "[[stage]]\nname = \"a\"\nshell = \"echo {{x}}{extra} >> ran.txt\"\nsweep.x = {{ range = \"1..5\" }}\ninputs = [\"input.txt\"]\n"
        )
    };
    s.write("farm.toml", &farm(""));
    s.mesh(&["run", "farm.toml"]).expect_code(0);
    assert_eq!(s.lines("ran.txt").len(), 5);

    let again = s.mesh(&["run", "farm.toml", "--json"]);
    again.expect_code(0);
    assert_eq!(again.json()["counts"]["cached"], 5);
    assert_eq!(s.lines("ran.txt").len(), 5, "nothing ran again");

    // An input's contents are part of every task's key.
    s.write("input.txt", "v2");
    let changed = s.mesh(&["run", "farm.toml", "--json"]);
    assert_eq!(changed.json()["counts"]["cached"], 0);
    assert_eq!(s.lines("ran.txt").len(), 10);
}

#[test]
fn resume_retry_failed_reruns_only_what_failed() {
    let s = sandbox();
    s.write(
        "farm.toml",
        "[[stage]]\nname = \"a\"\nshell = \"echo {x} >> ran.txt; [ {x} -ne 3 ] || [ -e fixed ]\"\nsweep.x = { range = \"1..4\" }\n",
    );
    s.mesh(&["run", "farm.toml"]).expect_code(1);
    s.write("fixed", "");
    let plain = s.mesh(&["resume"]);
    assert!(plain.stderr.contains("--retry-failed"), "{}", plain.stderr);
    s.mesh(&["resume", "--retry-failed"]).expect_code(0);
    let mut ran = s.lines("ran.txt");
    ran.sort();
    assert_eq!(ran, vec!["1", "2", "3", "3", "4"]);
}

/// The farm of the issue that brought `max_fails`: `wrapper.sh` without
/// `./`, and not on PATH, so no task of the stage can start.
const CANNOT_START: &str = r#"
[[stage]]
name = "solve"
command = ["wrapper.sh", "{i}"]
sweep.i = { range = "0..19" }
retries = 1

[[stage]]
name = "report"
after = ["solve"]
shell = "ls ran | wc -l > count.txt"
"#;

/// Runs the farm of [`CANNOT_START`] to its stop: one line says why,
/// and the stage starts no more than its first five attempts.
fn run_to_stop(s: &Sandbox) {
    s.write("farm.toml", CANNOT_START);
    s.write("wrapper.sh", "#!/bin/sh\nmkdir -p ran && touch ran/$1\n");
    let r = s.mesh(&["run", "farm.toml", "--resources", "cpu=1", "--json"]);
    r.expect_code(1);
    let v = r.json();
    assert_eq!(v["state"], "stopped", "{v}");
    // Two tasks failed twice, the third once: five attempts, then nothing.
    let c = &v["stages"][0]["counts"];
    assert_eq!(
        (c["failed"].as_u64(), c["stopped"].as_u64()),
        (Some(2), Some(18)),
        "{v}"
    );
    assert_eq!(v["stages"][1]["counts"]["skipped"], 1, "{v}");
    let why = v["stages"][0]["stopped"].as_str().unwrap_or_default();
    assert!(
        why.starts_with("stage `solve` stopped after its first 5 attempts (3 tasks) failed the same way: could not start `wrapper.sh`")
            && why.ends_with("(set max_fails to change this)"),
        "{why}"
    );
    // Warned of before it ran; then said once, and no task's failure besides.
    let (warned, said): (Vec<&str>, Vec<&str>) = r
        .stderr
        .lines()
        .filter(|l| l.contains("wrapper.sh"))
        .partition(|l| l.starts_with("warning: "));
    assert_eq!(said, [why], "{}", r.stderr);
    assert_eq!(warned.len(), 1, "{}", r.stderr);
    assert!(warned[0].ends_with("run as `./wrapper.sh`"), "{}", r.stderr);
    assert!(!r.stderr.contains("task solve/"), "{}", r.stderr);
}

#[test]
fn a_stage_that_cannot_start_stops_with_one_line_and_runs_whole_once_fixed() {
    let s = sandbox();
    run_to_stop(&s);
    let status = s.mesh(&["status"]);
    status.expect_code(0);
    assert!(
        status.stdout.contains("state   stopped"),
        "{}",
        status.stdout
    );
    assert!(
        status
            .stdout
            .contains("stage `solve` stopped after its first 5 attempts"),
        "{}",
        status.stdout
    );
    // Fixed outside the farm file (the program put on PATH): a plain
    // resume runs the stage whole, the two tasks that failed included.
    let path = format!(
        "{}:{}",
        s.path().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let r = s
        .spawn_env(&["resume", "--json"], &[("PATH", &path)])
        .wait();
    r.expect_code(0);
    let v = r.json();
    assert_eq!(
        (v["state"].as_str(), v["counts"]["done"].as_u64()),
        (Some("done"), Some(21)),
        "{v}"
    );
    assert_eq!(s.read("count.txt").trim(), "20");

    // Fixed in the farm file: running it again runs everything.
    let s = sandbox();
    run_to_stop(&s);
    s.write(
        "farm.toml",
        &CANNOT_START.replace("\"wrapper.sh\"", "\"./wrapper.sh\""),
    );
    let r = s.mesh(&["run", "farm.toml", "--json"]);
    r.expect_code(0);
    assert!(!r.stderr.contains("warning:"), "{}", r.stderr);
    assert_eq!(r.json()["counts"]["done"], 21);
    assert_eq!(s.read("count.txt").trim(), "20");
}
