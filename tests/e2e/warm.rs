//! `python` stages: a script run in a Python worker the node keeps warm, with the exit codes, logs, outputs, environment and kills of a process of its own; small outputs it hands back ride with the task's report and are files only where a task reads them.

use std::time::Duration;

use base64::Engine as _;
use mesh_tests::{wait_until, Cluster};
use serde_json::{json, Value};

use super::sandbox;

/// `n` counts the runs this worker made (a module-level value kept between
/// runs in `sys.modules`), so a reused worker shows as a count above 1.
const SCRIPT: &str = r#"
import os, sys, time
runs = sys.modules.setdefault("mesh_test_runs", type(sys)("mesh_test_runs"))
runs.n = getattr(runs, "n", 0) + 1
i = int(sys.argv[1])
print("task", i, "pid", os.getpid(), "run", runs.n, "cwd", os.path.basename(os.getcwd()), "farm", os.environ["MESH_FARM"],
      "leak", os.environ.get("MESH_TEST_LEAK", "none"))
# What a run changes in its environment is not the next run's.
os.environ["MESH_TEST_LEAK"] = str(i)
os.environ["MESH_FARM"] = "changed"
if i == 3:
    print("bad input 3", file=sys.stderr)
    sys.exit(4)
if i == 5:
    time.sleep(60)
if i == 6:
    raise ValueError("six")
with open("out.txt", "w") as f:
    f.write("%d\n" % (i * i))
"#;

#[test]
fn a_python_stage_runs_in_warm_workers_as_a_process_would() {
    let s = sandbox();
    s.write("job.py", SCRIPT);
    s.write(
        "farm.toml",
        r#"
[farm]
name = "warm"

[[stage]]
name = "py"
python = ["python3", "job.py", "{i}"]
sweep.i = { range = "0..11" }
workdir = "w/{index}"
inputs = ["job.py"]
outputs = ["out.txt"]
timeout = "3s"
max_fails = 0
"#,
    );
    let r = s.mesh(&["run", "farm.toml", "--resources", "cpu=1"]);
    r.expect_code(1);
    let mut pids = std::collections::BTreeSet::new();
    let mut reused = 0;
    for i in [0u32, 1, 2, 4, 7, 8, 9, 10] {
        assert_eq!(
            s.read(&format!("mesh-out/warm/py/{i}/out.txt")),
            format!("{}\n", i * i)
        );
        let log = s.mesh(&["logs", &format!("py/{i}")]);
        let words: Vec<&str> = log.stdout.split_whitespace().collect();
        assert_eq!(words[..2], ["task", &i.to_string()[..]], "{}", log.stdout);
        // In its own folder, with its farm's environment, as a process.
        assert_eq!(words[7], i.to_string(), "{}", log.stdout);
        assert_eq!(words[9], "warm", "{}", log.stdout);
        assert_eq!(words[11], "none", "{}", log.stdout);
        pids.insert(words[3].to_string());
        if words[5] != "1" {
            reused += 1;
        }
    }
    assert!(
        reused > 0,
        "later tasks ran in a worker that ran one before"
    );
    // Task 5 ran out of time: its worker was killed with it, and the tasks
    // after it ran in another.
    assert!(pids.len() >= 2, "a fresh worker after the kill: {pids:?}");
    let v = s.mesh(&["status", "--json"]).json();
    let failed: Vec<(String, String)> = v["failed"]
        .as_array()
        .expect("failed tasks")
        .iter()
        .map(|t| {
            (
                t["task"].as_str().unwrap_or("").to_string(),
                t["reason"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    let reason = |t: &str| {
        failed
            .iter()
            .find(|(n, _)| n == t)
            .map(|(_, r)| r.clone())
            .unwrap_or_default()
    };
    assert_eq!(reason("py/3"), "exit code 4: bad input 3", "{v}");
    assert!(reason("py/5").contains("timed out"), "{v}");
    assert!(reason("py/6").starts_with("exit code 1: Traceback"), "{v}");
    let log = s.mesh(&["logs", "py/6"]);
    assert!(log.stderr.contains("ValueError: six"), "{}", log.stderr);
    // A task that said nothing on stderr leaves no empty log behind.
    assert!(s.mesh(&["logs", "py/0"]).stdout.contains("task 0"));
}

/// Counts the times its file is run in this worker, and says so through
/// `mesh_warm.again` that a later run of it calls `main` instead.
const AGAIN: &str = r#"
import os, sys
warm = sys.modules["mesh_warm"]
warm.loads = getattr(warm, "loads", 0) + 1
def main(argv):
    print(argv[1], "pid", os.getpid(), "loads", warm.loads, "given", os.environ.get("TEST_GIVEN", "none"))
warm.again = main
main(sys.argv)
"#;

#[test]
fn a_warm_run_sees_only_its_own_tasks_environment_and_a_script_may_be_run_again_by_its_main() {
    let s = sandbox();
    s.write("again.py", AGAIN);
    s.write(
        "farm.toml",
        r#"
[farm]
name = "again"

[[stage]]
name = "a"
python = ["python3", "again.py", "a{i}"]
sweep.i = { range = "0..2" }
env = { TEST_GIVEN = "a{i}" }
inputs = ["again.py"]

[[stage]]
name = "b"
after = ["a"]
python = ["python3", "again.py", "b{i}"]
sweep.i = { range = "0..2" }
inputs = ["again.py"]
"#,
    );
    s.mesh(&["run", "farm.toml", "--resources", "cpu=1"])
        .expect_code(0);
    let words = |t: &str| -> Vec<String> {
        let log = s.mesh(&["logs", t]);
        log.stdout.split_whitespace().map(String::from).collect()
    };
    let a0 = words("a/0");
    let mut loads = Vec::new();
    for (t, given) in [
        ("a/0", "a0"),
        ("a/1", "a1"),
        ("b/0", "none"),
        ("b/1", "none"),
    ] {
        let w = words(t);
        assert_eq!(w.len(), 7, "{t}: {w:?}");
        // A key the task before was given and this one was not is unset.
        assert_eq!(w[6], given, "{t}: {w:?}");
        assert_eq!(w[2], a0[2], "one warm worker ran them all: {t}: {w:?}");
        loads.push(w[4].clone());
    }
    // Its file ran once; every later run was its main, in that module.
    assert_eq!(loads, ["1", "1", "1", "1"]);
}

/// Hands its value back where it can (`mesh_warm`, as the Python client's
/// calls do), else writes it; task 5's is too big to ride.
const HAND: &str = r#"
import sys, time
import mesh_warm
i = int(sys.argv[1])
time.sleep(0.3)
data = b"x" * 5000 if i == 5 else b"value %d\n" % i
if not mesh_warm.hand("v.txt", data):
    with open("v.txt", "wb") as f:
        f.write(data)
"#;

const HAND_FARM: &str = r#"
[farm]
name = "hand"

[[stage]]
name = "a"
python = ["python3", "hand.py", "{i}"]
sweep.i = { range = "0..5" }
workdir = "w/{index}"
inputs = ["hand.py"]
outputs = ["v.txt"]

[[stage]]
name = "b"
after = ["a"]
workdir = "w/b"
shell = "cat {out}/a/*/v.txt > all.txt"
outputs = ["all.txt"]
"#;

/// The done tasks of `farm` as node 1, its home, answers the control
/// API's `Tasks`; None while it does not answer them.
fn done_tasks(c: &Cluster, farm: &str) -> Option<Vec<Value>> {
    c.control(
        1,
        &json!({"Tasks": {"farm": farm, "state": "done", "limit": null}}),
    )
    .iter()
    .find_map(|a| a.get("Tasks"))
    .and_then(Value::as_array)
    .cloned()
}

#[test]
fn small_values_handed_back_ride_with_the_report_and_are_files_where_a_task_reads_them() {
    let sb = sandbox();
    sb.write("hand.py", HAND);
    sb.write("farm.toml", HAND_FARM);
    let mut c = Cluster::start(&sb, &["cpu=1", "cpu=1"], &[]);
    let out = sb.path().join("out");
    let r = c.mesh(1, &["submit", "farm.toml", "--out", &out.to_string_lossy()]);
    r.expect_code(0);
    let id = r.stdout.lines().next().unwrap_or_default().to_string();
    c.mesh(1, &["wait", &id]).expect_code(0);
    let mut want = String::new();
    for i in 0..5 {
        want.push_str(&format!("value {i}\n"));
    }
    want.push_str(&"x".repeat(5000));
    let all = sb.read("out/b/0/all.txt");
    assert!(
        all == want,
        "the gather read every value: {} bytes, {:?}...{:?}",
        all.len(),
        &all[..all.len().min(60)],
        &all[all.len().saturating_sub(20)..]
    );
    let tasks = done_tasks(&c, &id).expect("the farm's done tasks");
    let mut nodes = std::collections::BTreeSet::new();
    for t in tasks.iter().filter(|t| t["stage"] == "a") {
        let i = t["index"].as_u64().expect("index");
        nodes.insert(t["node"].as_str().unwrap_or("").to_string());
        if i == 5 {
            assert_eq!(t["outputs"].as_array().map(Vec::len), Some(1), "{t}");
            assert!(t.get("values").is_none(), "too big to ride: {t}");
            continue;
        }
        assert_eq!(t["outputs"], json!([]), "no file on the home: {t}");
        let v = t["values"]["v.txt"]
            .as_str()
            .unwrap_or_else(|| panic!("{t}"));
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(v)
            .expect("base64");
        assert_eq!(bytes, format!("value {i}\n").into_bytes(), "{t}");
    }
    assert_eq!(nodes.len(), 2, "values came from both nodes: {nodes:?}");
    // Kept by the coordinator's log: after the home restarts, still there.
    c.kill(1);
    c.restart(1, "cpu=1", &[]);
    let back = wait_until(Duration::from_secs(30), || {
        done_tasks(&c, &id).is_some_and(|ts| {
            ts.iter()
                .any(|t| t["task"] == "a/3" && t["values"]["v.txt"].as_str().is_some())
        })
    });
    assert!(back, "the home restarted without the values it had");
}

/// One kind of use per task, by its argument. `ballast` leaves 100 MiB
/// held in its worker (in `sys.modules`, as a module's cache would), so
/// the tasks after it run in a worker that holds it already.
const USE: &str = r#"
import os, subprocess, sys, time
what = sys.argv[1]
print("ballast" if "mesh_test_ballast" in sys.modules else "fresh")
if what == "ballast":
    m = sys.modules.setdefault("mesh_test_ballast", type(sys)("mesh_test_ballast"))
    m.held = b"\1" * (100 << 20)
elif what == "hold" or what == "hog":
    x = bytearray((200 if what == "hold" else 300) << 20)
    x[::4096] = bytes(len(x) // 4096)
    time.sleep(0 if what == "hold" else 5)
elif what == "spin":
    t0 = time.process_time()
    while time.process_time() - t0 < 1.0:
        pass
elif what == "forever":
    # Says the CPU it has spent so far, every 50 ms of it, until killed.
    t0 = time.process_time()
    said = 0.0
    while True:
        spent = time.process_time() - t0
        if spent - said >= 0.05:
            # Renamed into place: a kill between the open and the write
            # must not leave the file empty.
            with open("spent.tmp", "w") as f:
                f.write("%.3f" % spent)
            os.replace("spent.tmp", "spent.txt")
            said = spent
elif what == "write":
    with open("big.bin", "wb") as f:
        for _ in range(50):
            f.write(b"\0" * (1 << 20))
    os.remove("big.bin")
elif what == "child":
    subprocess.run([sys.executable, "-c", "import time; x = bytearray(200 << 20); x[::4096] = bytes(len(x) // 4096); time.sleep(1)"], check=True)
"#;

const USE_FARM: &str = r#"
[farm]
name = "use"

[[stage]]
name = "ballast"
python = ["python3", "use.py", "ballast"]
inputs = ["use.py"]

[[stage]]
name = "use"
after = ["ballast"]
python = ["python3", "use.py", "{what}"]
sweep.what = { list = ["hold", "spin", "write", "child"] }
workdir = "w/{index}"
inputs = ["use.py"]

[[stage]]
name = "late"
after = ["use"]
python = ["python3", "use.py", "forever"]
workdir = "w/late"
inputs = ["use.py"]
timeout = "2s"
max_fails = 0

[[stage]]
name = "hog"
after = ["use"]
python = ["python3", "use.py", "hog"]
inputs = ["use.py"]
resources = { mem = "100MiB" }
max_fails = 0
"#;

#[test]
fn a_python_task_says_what_it_used_apart_from_what_its_warm_worker_held_before_it() {
    let s = sandbox();
    s.write("use.py", USE);
    s.write("farm.toml", USE_FARM);
    // One at a time: every task runs in the worker the first one started
    // (but for the one after a kill). Asks are held to, as SLURM does.
    let r = s
        .spawn_env(
            &["run", "farm.toml", "--resources", "cpu=1,mem=1GiB"],
            &[("MESH_ENFORCE_MEM", "1")],
        )
        .wait();
    r.expect_code(1);
    for i in 0..4 {
        let log = s.mesh(&["logs", &format!("use/{i}")]);
        assert_eq!(
            log.stdout.trim(),
            "ballast",
            "use/{i} ran in the worker that holds 100 MiB"
        );
    }
    s.mesh(&["export", "use", "-o", "use.json"]).expect_code(0);
    let trace: Value = serde_json::from_str(&s.read("use.json")).expect("JSON");
    let runs = trace["workflow"]["execution"]["tasks"]
        .as_array()
        .expect("the runs")
        .clone();
    let run = |id: &str| -> Value {
        runs.iter()
            .find(|t| t["id"] == id)
            .unwrap_or_else(|| panic!("{id} in {runs:?}"))
            .clone()
    };
    let mib =
        |t: &Value, k: &str| t[k].as_f64().unwrap_or_else(|| panic!("{k} in {t}")) / 1048576.0;
    let cpu_s =
        |t: &Value| t["avgCPU"].as_f64().unwrap() / 100.0 * t["runtimeInSeconds"].as_f64().unwrap();
    // 200 MiB above the worker's 100, within a tenth.
    let hold = mib(&run("use.0"), "memoryInBytes");
    assert!((180.0..=220.0).contains(&hold), "hold: {hold} MiB");
    let spin = cpu_s(&run("use.1"));
    assert!((0.8..=1.3).contains(&spin), "spin: {spin} s of CPU");
    let wrote = mib(&run("use.2"), "writtenBytes");
    assert!((50.0..51.0).contains(&wrote), "write: {wrote} MiB");
    // The child's 200 MiB and its interpreter, looked at by the node.
    let child = mib(&run("use.3"), "memoryInBytes");
    assert!((200.0..=240.0).contains(&child), "child: {child} MiB");
    // Killed by its timeout with its worker: counted from the dead worker,
    // less what the worker had used before.
    let late = run("late.0");
    assert!(
        late["failed"].as_str().unwrap_or("").contains("timed out"),
        "{late}"
    );
    // What it last said it spent, to 50 ms: not the second and more its
    // worker had spent before (a loaded machine stretches its run, not
    // what it spent). Below what it said by at most 30 ms: the node reads
    // the worker's CPU from /proc in clock ticks (10 ms) before and after,
    // and the figure's percentage is rounded (1.934 s measured against
    // 1.950 said was seen).
    let said: f64 = s.read("w/late/spent.txt").parse().expect("seconds");
    let spun = cpu_s(&late);
    assert!(
        said >= 0.05 && said - 0.03 <= spun && spun <= said + 0.3,
        "late: {spun} s of CPU, {said} s said ({late})"
    );
    // Past its ask: killed with its worker, saying so.
    let hog = run("hog.0");
    let why = hog["failed"].as_str().unwrap_or("");
    assert!(
        why.contains("out of memory: it held")
            && why.contains("more than the 100.0 MiB it asked for (mem)"),
        "{hog}"
    );
}
