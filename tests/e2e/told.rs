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
    let r = c.mesh(0, &["status", &id]);
    assert!(r.stderr.contains(CAUSE), "{}{}", r.stdout, r.stderr);
}
