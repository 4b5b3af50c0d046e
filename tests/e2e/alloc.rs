//! Nodes started by batch jobs: a node that knows its walltime drains before it, and no task is failed for it.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use mesh_tests::{wait_until, Cluster};

use crate::sandbox;

#[test]
fn a_node_with_a_walltime_drains_before_it_and_no_task_fails_for_it() {
    let sb = sandbox();
    let mut c = Cluster::start(&sb, &["cpu=2", "cpu=2"], &[]);
    // The batch job's node: 6 s of walltime, drained 1 s before.
    let state = sb.path().join("n-job");
    fs::create_dir_all(&state).expect("mkdir");
    let key = state.join("mesh.key");
    fs::copy(sb.path().join("n0/mesh.key"), &key).expect("copy key");
    fs::set_permissions(&key, fs::Permissions::from_mode(0o600)).expect("chmod");
    let first = c.nodes[0].address();
    c.add(
        &state,
        Some(&first),
        "cpu=2",
        &["--walltime", "6s", "--drain-margin", "1s"],
    );
    assert!(
        wait_until(Duration::from_secs(20), || c.status(0)["nodes"]
            .as_array()
            .is_some_and(|n| n.len() == 3)),
        "the job's node joined"
    );
    // No retries: a task failed for the drain would fail the farm.
    sb.write(
        "slow.toml",
        r#"
[farm]
name = "slow"

[[stage]]
name = "s"
sweep.i = { range = "0..29" }
workdir = "w/{i}"
shell = 'sleep 1; echo {i} > r.txt'
outputs = ["r.txt"]
retries = 0
"#,
    );
    let r = c.mesh(0, &["submit", "slow.toml", "--out", "slow-out"]);
    r.expect_code(0);
    let id = r.stdout.trim().to_string();
    assert!(
        wait_until(Duration::from_secs(20), || c.own_status(2)["running"]
            .as_u64()
            > Some(0)),
        "the job's node ran tasks"
    );
    // It stops by itself, before its walltime is over (started ~6 s ago at most).
    let code = c.nodes[2].wait_exit(Duration::from_secs(15));
    assert_eq!(code, Some(0), "{}", c.nodes[2].lines().join("\n"));
    assert!(
        c.nodes[2]
            .lines()
            .iter()
            .any(|l| l.contains("walltime near: draining")),
        "{}",
        c.nodes[2].lines().join("\n")
    );
    let r = c.mesh(0, &["wait", &id, "--json"]);
    r.expect_code(0);
    let v = r.json();
    assert_eq!(v["counts"]["done"], 30, "{v}");
    assert_eq!(v["counts"]["failed"], 0, "{v}");
    for i in 0..30 {
        assert_eq!(sb.read(&format!("slow-out/s/{i}/r.txt")), format!("{i}\n"));
    }
}
