//! A mesh commanded from a machine that runs no node (`mesh --mesh ADDR`, a cluster's login node): every command over the nodes' own authenticated connection.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use mesh_tests::{wait_until, Cluster, Run, Sandbox};

use crate::sandbox;

const TALK: &str = r#"
[farm]
name = "talk"

[[stage]]
name = "say"
sweep.i = { range = "0..6" }
workdir = "w/{i}"
shell = 'echo "out {i}"; echo {i} > r.txt; sleep 0.2'
outputs = ["r.txt"]
"#;

const SLOW: &str = r#"
[farm]
name = "slow"

[[stage]]
name = "wait"
sweep.i = { range = "0..8" }
shell = 'sleep 30'
"#;

/// The mesh key copied where a login node would keep it, owner-only.
fn login_key(sb: &Sandbox, c: &Cluster) -> String {
    let key = sb.path().join("login/mesh.key");
    fs::create_dir_all(key.parent().unwrap()).unwrap();
    fs::copy(c.nodes[0].state.join("mesh.key"), &key).unwrap();
    fs::set_permissions(&key, fs::Permissions::from_mode(0o600)).unwrap();
    key.to_string_lossy().into_owned()
}

/// `mesh --mesh ADDR --mesh-key KEY ARGS...`, run in the sandbox, whose
/// own state folder has no node.
fn remote(sb: &Sandbox, addr: &str, key: &str, args: &[&str]) -> Run {
    let mut all = vec!["--mesh", addr, "--mesh-key", key];
    all.extend_from_slice(args);
    sb.mesh(&all)
}

#[test]
fn a_machine_without_a_node_submits_follows_and_cancels_farms_through_any_node() {
    let sb = sandbox();
    let c = Cluster::start(&sb, &["cpu=2", "cpu=2"], &[]);
    let key = login_key(&sb, &c);
    // Node 1's address: any node will do, the coordinator or not.
    let addr = c.nodes[1].address();
    let out = sb.path().join("results");
    sb.write("farm/farm.toml", TALK);

    // Nothing runs in the sandbox's own state folder: without --mesh there is no node.
    sb.mesh(&["submit", "farm/farm.toml"]).expect_code(2);

    let r = remote(
        &sb,
        &addr,
        &key,
        &[
            "submit",
            "farm/farm.toml",
            "--out",
            &out.to_string_lossy(),
            "--wait",
        ],
    );
    r.expect_code(0);
    let id = r.stdout.lines().next().unwrap().to_string();
    assert!(id.starts_with("talk-"), "{}", r.stdout);
    // A range's ends are both in: seven tasks.
    for i in 0..=6 {
        assert_eq!(sb.read(&format!("results/say/{i}/r.txt")), format!("{i}\n"));
    }

    let v = remote(&sb, &addr, &key, &["status", "--json"]).json();
    assert_eq!(v["nodes"].as_array().map(Vec::len), Some(2), "{v}");
    let local: Vec<&serde_json::Value> = v["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| n["local"] == true)
        .collect();
    assert_eq!(
        local[0]["id"].as_str(),
        Some(c.nodes[1].peer_id().as_str()),
        "the node that answers is the one at --mesh: {v}"
    );
    let text = remote(&sb, &addr, &key, &["status"]);
    let at = c.nodes[1].peer_id();
    assert!(
        text.stdout.contains(&format!(
            "the node at --mesh …{}",
            mesh_node::view::short_id(&at)
        )),
        "{}",
        text.stdout
    );

    let v = remote(&sb, &addr, &key, &["status", &id, "--json"]).json();
    assert_eq!(v["counts"]["done"], 7, "{v}");
    assert_eq!(v["finished"], true, "{v}");

    let v = remote(&sb, &addr, &key, &["list", "--json"]).json();
    assert_eq!(v["mesh"][0]["id"], id.as_str(), "{v}");
    assert_eq!(v["local"].as_array().map(Vec::len), Some(0), "{v}");

    let r = remote(&sb, &addr, &key, &["logs", "say/4", "--farm", &id]);
    r.expect_code(0);
    assert_eq!(r.stdout, "out 4\n");

    // Commands at once: a node takes a protocol's streams one at a time and
    // resets one that comes meanwhile; the command line asks again.
    let many: Vec<_> = (0..8)
        .map(|_| sb.spawn(&["--mesh", &addr, "--mesh-key", &key, "list", "--json"]))
        .collect();
    for b in many {
        let r = b.wait();
        r.expect_code(0);
        assert_eq!(r.json()["mesh"][0]["id"], id.as_str(), "{}", r.stdout);
    }

    let v = remote(&sb, &addr, &key, &["alloc", "list", "--json"]).json();
    assert_eq!(v["queues"].as_array().map(Vec::len), Some(0), "{v}");

    // Environment variables do as the flags do.
    sb.write("farm/slow.toml", SLOW);
    let r = sb
        .spawn_env(
            &["submit", "farm/slow.toml"],
            &[("MESH_ADDR", addr.as_str()), ("MESH_KEY", key.as_str())],
        )
        .wait();
    r.expect_code(0);
    let slow = r.stdout.trim().to_string();
    let running = wait_until(Duration::from_secs(20), || {
        remote(&sb, &addr, &key, &["status", &slow, "--json"]).json()["counts"]["running"].as_u64()
            > Some(0)
    });
    assert!(running, "the slow farm never started");
    let waiter = sb.spawn(&["--mesh", &addr, "--mesh-key", &key, "wait", &slow]);
    let r = remote(&sb, &addr, &key, &["cancel", &slow]);
    r.expect_code(0);
    assert!(r.stdout.contains("cancelled"), "{}", r.stdout);
    let w = waiter.wait();
    w.expect_code(1);
    assert!(w.stderr.contains("0 of 9 done"), "{}", w.stderr);
}

#[test]
fn a_wrong_key_an_unreachable_address_or_a_local_command_is_refused_with_the_reason() {
    let sb = sandbox();
    let c = Cluster::start(&sb, &["cpu=1"], &[]);
    let addr = c.nodes[0].address();
    let other = Sandbox::new(env!("CARGO_BIN_EXE_mesh"));
    other.mesh(&["init"]).expect_code(0);
    let wrong = other.state().join("mesh.key");

    let r = remote(&sb, &addr, &wrong.to_string_lossy(), &["status"]);
    r.expect_code(2);
    assert!(
        r.stderr.contains("cannot reach the mesh") && r.stderr.contains("mesh.key"),
        "{}",
        r.stderr
    );

    let key = login_key(&sb, &c);
    let r = remote(&sb, "/ip4/127.0.0.1/tcp/1", &key, &["status"]);
    r.expect_code(2);
    assert!(
        r.stderr
            .contains("cannot reach the mesh at /ip4/127.0.0.1/tcp/1"),
        "{}",
        r.stderr
    );

    let r = remote(
        &sb,
        &addr,
        &sb.path().join("nope.key").to_string_lossy(),
        &["list"],
    );
    r.expect_code(2);
    assert!(r.stderr.contains("nope.key"), "{}", r.stderr);

    sb.write("farm.toml", TALK);
    let r = remote(&sb, &addr, &key, &["run", "farm.toml"]);
    r.expect_code(2);
    assert!(r.stderr.contains("`mesh run` runs here"), "{}", r.stderr);
    // MESH_ADDR exported in a login shell (or inherited by a job) does not
    // stop what runs here.
    let r = sb
        .spawn_env(
            &["run", "farm.toml", "--quiet"],
            &[("MESH_ADDR", addr.as_str())],
        )
        .wait();
    r.expect_code(0);

    let r = remote(&sb, &addr, &key, &["status", "no-such-farm"]);
    r.expect_code(2);
    assert!(r.stderr.contains("no farm `no-such-farm`"), "{}", r.stderr);
    assert!(!Path::new(&sb.state()).join("node.sock").exists());
}
