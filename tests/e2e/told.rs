//! What users are told about failures and which farm a command picks: a failure's cause with its code, skipped tasks explained, names and defaults that find the farm meant.

use std::time::Duration;

use mesh_tests::{wait_until, Cluster};

use super::sandbox;

/// Task 3 of `solve` fails with a line on stderr; `plot` waits on each solve.
const DIVERGES: &str = r#"
[farm]
name = "pk"

[[stage]]
name = "solve"
shell = 'if [ {i} = 3 ]; then echo "solver diverged at step 17" >&2; echo more >&2; exit 1; fi; echo ok {i}'
sweep.i = { range = "0..4" }

[[stage]]
name = "plot"
after_each = ["solve"]
shell = "echo plot {index}"
"#;

const CAUSE: &str = "exit code 1: solver diverged at step 17";

#[test]
fn a_failure_says_its_first_stderr_line_in_mesh_run() {
    let s = sandbox();
    s.write("farm.toml", DIVERGES);
    let r = s.mesh(&["run", "farm.toml"]);
    r.expect_code(1);
    assert!(
        r.stderr
            .contains(&format!("failed solve/3 (attempt 1): {CAUSE}")),
        "the summary says the cause:\n{}",
        r.stderr
    );
    assert!(
        r.stderr.contains(
            "skipped 1 task: it depends on solve/3 (or on a task skipped for it), and runs once that succeeds"
        ),
        "the skipped plot is explained:\n{}",
        r.stderr
    );
    let v = s.mesh(&["status", "--json"]).json();
    assert_eq!(v["failed"][0]["reason"], CAUSE, "{v}");
    let r = s.mesh(&["status"]);
    assert!(r.stdout.contains(CAUSE), "{}", r.stdout);
}

#[test]
fn a_failure_says_its_first_stderr_line_on_a_mesh() {
    let sb = sandbox();
    sb.write("farm.toml", DIVERGES);
    let c = Cluster::start(&sb, &["cpu=2", "cpu=2"], &[]);
    let r = c.mesh(1, &["submit", "farm.toml"]);
    r.expect_code(0);
    let id = r.stdout.trim().to_string();
    let r = c.mesh(1, &["wait", &id]);
    r.expect_code(1);
    assert!(
        r.stderr.contains(CAUSE) || r.stdout.contains(CAUSE),
        "{r:?}"
    );
    assert!(
        r.stderr.contains("skipped 1 task: it depends on solve/3"),
        "{}",
        r.stderr
    );
    // `mesh watch` of the ended farm (plain lines, not on a terminal)
    // counts the skipped task in its stage's line.
    let w = c.mesh(1, &["watch", &id]);
    let said = format!("{}{}", w.stdout, w.stderr);
    assert!(
        said.contains("plot: 4/5 done, 0 running, 0 queued, 0 failed, 1 skipped"),
        "{said}"
    );
    // Every node says it, whichever ran the task: it crossed the wire.
    for i in 0..2 {
        let ok = wait_until(Duration::from_secs(10), || {
            let v = c.mesh(i, &["status", &id, "--json"]).json();
            v["failures"][0]
                .as_str()
                .is_some_and(|f| f.ends_with(CAUSE))
        });
        assert!(
            ok,
            "node {i}: {}",
            c.mesh(i, &["status", &id, "--json"]).stdout
        );
    }
    // `mesh status FARM` is asked for, so its answer is on stdout.
    let r = c.mesh(0, &["status", &id]);
    assert!(r.stdout.contains(CAUSE), "{}{}", r.stdout, r.stderr);
}

#[test]
fn a_name_two_farms_share_means_the_newest_and_logs_find_the_farm_on_a_node() {
    let sb = sandbox();
    sb.write(
        "farm.toml",
        "[farm]\nname = \"pk\"\n\n[[stage]]\nname = \"say\"\nshell = \"echo said {i}\"\nsweep.i = { range = \"0..1\" }\n",
    );
    let c = Cluster::start(&sb, &["cpu=2"], &[]);
    let first = c.mesh(0, &["submit", "farm.toml", "--wait"]);
    first.expect_code(0);
    // No --farm: the node's newest farm with a stage `say`.
    let r = c.mesh(0, &["logs", "say/1"]);
    r.expect_code(0);
    assert_eq!(r.stdout, "said 1\n", "{}", r.stderr);
    let a = c.mesh(0, &["submit", "farm.toml"]);
    a.expect_code(0);
    let b = c.mesh(0, &["submit", "farm.toml"]);
    b.expect_code(0);
    let newest = b.stdout.trim();
    assert_ne!(a.stdout.trim(), newest);
    for args in [&["status", "pk", "--json"][..], &["wait", "pk", "--json"]] {
        let r = c.mesh(0, args);
        r.expect_code(0);
        assert_eq!(r.json()["id"], newest, "{args:?}: {}", r.stdout);
    }
}

/// A farm whose tasks wait for `go` beside it (so a run can be killed
/// mid-way), or for the sandbox to go: a task the killed run had started
/// a moment before is no child of anything the test ends.
fn waiting_farm(sb: &mesh_tests::Sandbox, name: &str) -> String {
    let go = sb.path().join("go");
    format!(
        "[farm]\nname = \"{name}\"\n\n[[stage]]\nname = \"t\"\nshell = \"while [ ! -e {} ] && [ -d {} ]; do sleep 0.1; done\"\nsweep.i = {{ range = \"0..1\" }}\n",
        go.display(),
        sb.path().display()
    )
}

#[test]
fn plain_resume_takes_the_crashed_farm_of_this_folder_not_a_newer_one_elsewhere() {
    let sb = sandbox();
    sb.write("farm.toml", &waiting_farm(&sb, "here"));
    sb.write(
        "other/farm.toml",
        "[farm]\nname = \"there\"\n\n[[stage]]\nname = \"t\"\nshell = \"echo same >&2; exit 1\"\nsweep.i = { range = \"0..9\" }\nmax_fails = 2\n",
    );
    let run = sb.spawn(&["run", "farm.toml"]);
    let started = wait_until(Duration::from_secs(20), || {
        let v = sb.mesh(&["status", "here", "--json"]);
        v.code == Some(0) && v.json()["counts"]["running"].as_u64() > Some(0)
    });
    assert!(started, "the farm never started a task");
    // Killed and not yet reaped: its pid still answers, as a zombie.
    run.signal(nix::sys::signal::Signal::SIGKILL);
    let v = sb.mesh(&["status", "here", "--json"]).json();
    assert_eq!(v["state"], "crashed", "{v}");
    // A newer farm of another folder, stopped by max_fails.
    let r = sb.mesh(&["run", "other/farm.toml", "--json"]);
    assert_eq!(r.json()["state"], "stopped", "{}", r.stdout);
    sb.write("go", "");
    let r = sb.mesh(&["resume", "--json"]);
    r.expect_code(0);
    let v = r.json();
    assert_eq!(v["name"], "here", "{v}");
    assert_eq!(v["state"], "done", "{v}");
    drop(run);
    // Nothing of this folder left to resume: the other folder's farm is
    // named, not resumed.
    let r = sb.mesh(&["resume"]);
    assert_ne!(r.code, Some(0));
    assert!(r.stderr.contains("there-"), "{}", r.stderr);
    let v = sb.mesh(&["status", "there", "--json"]).json();
    assert_eq!(v["state"], "stopped", "{v}");
}
