//! `python` stages: a script run in a Python worker the node keeps warm, with the exit codes, logs, outputs and kills of a process of its own.

use super::sandbox;

/// `n` counts the runs this worker made (a module-level value kept between
/// runs in `sys.modules`), so a reused worker shows as a count above 1.
const SCRIPT: &str = r#"
import os, sys, time
runs = sys.modules.setdefault("mesh_test_runs", type(sys)("mesh_test_runs"))
runs.n = getattr(runs, "n", 0) + 1
i = int(sys.argv[1])
print("task", i, "pid", os.getpid(), "run", runs.n, "cwd", os.path.basename(os.getcwd()), "farm", os.environ["MESH_FARM"])
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
