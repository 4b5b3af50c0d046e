//! An open farm on real nodes, through the control API as any client sends it: grown while it runs, its coordinator SIGKILLed between growths, not over while open, then closed; every output home and right.

use std::time::Duration;

use mesh_tests::{wait_until, Cluster};
use nix::sys::signal::Signal;
use serde_json::{json, Value};

use super::sandbox;

const FIRST: &str = r#"
[farm]
name = "grow"

[[stage]]
name = "a"
sweep.i = { range = "0..4" }
workdir = "w/{stage}/{index}"
shell = "sleep 0.3; echo {i} > r.txt"
outputs = ["r.txt"]
"#;

/// Added once `a` runs: each task reads the output of `a`'s of its index.
const SECOND: &str = r#"
[[stage]]
name = "b"
sweep.i = { range = "0..4" }
after = [{ stage = "a", tasks = "{i}", match = "i" }]
workdir = "w/{stage}/{index}"
shell = "echo $(cat {out}/a/{index}/r.txt) {i} > r.txt"
outputs = ["r.txt"]
"#;

/// Added after the coordinator is gone: a gather of every `b`.
const THIRD: &str = r#"
[[stage]]
name = "c"
after = ["b"]
workdir = "w/{stage}"
shell = "cat {out}/b/*/r.txt | sort -n > all.txt"
outputs = ["all.txt"]
"#;

/// The `Submitted` answer among a request's answers: the farm's id and its task count.
fn submitted(answers: &[Value]) -> (String, u64) {
    let s = answers
        .iter()
        .find_map(|a| a.get("Submitted"))
        .unwrap_or_else(|| panic!("not submitted: {answers:?}"));
    (
        s["farm"].as_str().expect("farm").to_string(),
        s["tasks"].as_u64().expect("tasks"),
    )
}

#[test]
fn an_open_farm_grows_across_a_coordinator_kill_and_ends_once_closed() {
    let sb = sandbox();
    let c = Cluster::start(
        &sb,
        &["cpu=2", "cpu=2", "cpu=2"],
        &["--dead-after-ms", "1500"],
    );
    let coordinator = c.status(0)["coordinator"].as_str().unwrap().to_string();
    assert_eq!(
        coordinator,
        c.nodes[0].peer_id(),
        "the first node coordinates"
    );
    let file = |name: &str| sb.path().join(name).to_string_lossy().into_owned();
    let cwd = sb.path().to_string_lossy().into_owned();
    let (id, tasks) = submitted(&c.control(
        2,
        &json!({"SubmitFarm": {"toml": FIRST, "file": file("first.toml"), "out": "grow-out", "cwd": cwd, "open": true}}),
    ));
    assert_eq!(tasks, 5);
    let (_, tasks) = submitted(&c.control(
        2,
        &json!({"Grow": {"farm": id, "toml": SECOND, "file": file("second.toml")}}),
    ));
    assert_eq!(tasks, 10, "a's and b's");
    c.nodes[0].signal(Signal::SIGKILL);
    // Durable once a new coordinator has it.
    let (_, tasks) = submitted(&c.control(
        2,
        &json!({"Grow": {"farm": id, "toml": THIRD, "file": file("third.toml")}}),
    ));
    assert_eq!(tasks, 11);
    let farm = || c.mesh(2, &["status", &id, "--json"]).json();
    let ran = wait_until(Duration::from_secs(60), || {
        farm()["counts"]["done"].as_u64() == Some(11)
    });
    assert!(ran, "every task done: {}", farm());
    let f = farm();
    assert_eq!(
        (f["open"].as_bool(), f["finished"].as_bool()),
        (Some(true), Some(false)),
        "open: not over: {f}"
    );
    // A stage name it has is refused, and nothing changes.
    let again = c.control(
        2,
        &json!({"Grow": {"farm": id, "toml": THIRD, "file": file("third.toml")}}),
    );
    assert!(
        again.iter().all(|a| a.get("Submitted").is_none()),
        "{again:?}"
    );
    c.mesh(2, &["close", &id]).expect_code(0);
    c.mesh(2, &["wait", &id]).expect_code(0);
    for i in 0..5 {
        assert_eq!(sb.read(&format!("grow-out/a/{i}/r.txt")), format!("{i}\n"));
        assert_eq!(
            sb.read(&format!("grow-out/b/{i}/r.txt")),
            format!("{i} {i}\n")
        );
    }
    // Which task is which, written for the stages added too.
    let manifest: String = std::iter::once("index\ti\n".to_string())
        .chain((0..5).map(|i| format!("{i}\t{i}\n")))
        .collect();
    assert_eq!(sb.read("grow-out/b/tasks.tsv"), manifest);
    let all: String = (0..5).map(|i| format!("{i} {i}\n")).collect();
    assert_eq!(sb.read("grow-out/c/0/all.txt"), all);
    assert_ne!(
        c.status(2)["coordinator"].as_str(),
        Some(coordinator.as_str())
    );
}

/// Issue 65: `mesh logs` of an open farm on a running node said "no farm
/// has run in … yet". Its tasks' logs, named every way a user names
/// them; a task no farm has is said so by the node.
#[test]
fn the_logs_of_an_open_farm_are_read_from_its_running_node() {
    let sb = sandbox();
    let c = Cluster::start(&sb, &["cpu=2"], &[]);
    let file = |name: &str| sb.path().join(name).to_string_lossy().into_owned();
    let cwd = sb.path().to_string_lossy().into_owned();
    let toml = "[farm]\nname = \"talk\"\n[[stage]]\nname = \"say\"\n\
                sweep.i = { range = \"0..1\" }\nshell = \"echo said {i}; echo warned {i} >&2\"\n";
    let (id, _) = submitted(&c.control(
        0,
        &json!({"SubmitFarm": {"toml": toml, "file": file("talk.toml"), "cwd": cwd, "open": true}}),
    ));
    let farm = || c.mesh(0, &["status", &id, "--json"]).json();
    let ran = wait_until(Duration::from_secs(60), || {
        farm()["counts"]["done"].as_u64() == Some(2)
    });
    assert!(ran, "{}", farm());
    assert_eq!(farm()["open"].as_bool(), Some(true), "still open");
    for args in [
        &["logs", &id, "say/1"][..],
        &["logs", "talk", "say/1"],
        &["logs", "say/1", "--farm", &id],
        &["logs", "say/1"],
    ] {
        let r = c.mesh(0, args);
        r.expect_code(0);
        assert_eq!(
            (r.stdout.as_str(), r.stderr.lines().next()),
            ("said 1\n", Some("warned 1")),
            "mesh {args:?}"
        );
    }
    // A task of no farm the node knows: the node says so, and that it is
    // not a `mesh run` farm of this machine either.
    let r = c.mesh(0, &["logs", "nope/0"]);
    r.expect_code(2);
    assert!(
        r.stderr.contains("no farm known here has a task nope/0"),
        "{}",
        r.stderr
    );
    assert!(!r.stderr.contains("no farm has run"), "{}", r.stderr);
    let r = c.mesh(0, &["logs", "nope-0123abcd", "say/1"]);
    r.expect_code(2);
    assert!(
        r.stderr.contains("no farm `nope-0123abcd` is known"),
        "{}",
        r.stderr
    );
}
