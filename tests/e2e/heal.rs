//! A mesh that heals itself: a paused seed loses none of its joiners, two meshes of one key that meet become one, a node restarted on a new port finds its mesh through the members it remembered, nodes on ports the system picked find each other after all restart, and a wrong key is told on both sides.

use std::time::{Duration, Instant};

use mesh_tests::{
    describe_statuses, follows, one_mesh_of, slow_farm, wait_until, Cluster, NodeProc,
};
use nix::sys::signal::Signal;

use crate::sandbox;

/// The answers of every node of `c` (but those in `except`) to `mesh status --json`.
fn statuses(c: &Cluster, except: &[usize]) -> Vec<serde_json::Value> {
    (0..c.nodes.len())
        .filter(|i| !except.contains(i))
        .map(|i| c.status(i))
        .collect()
}

/// Every node of `c` (but those in `except`) follows the same coordinator,
/// which hears them all: asked of the nodes.
fn one_mesh(c: &Cluster, except: &[usize]) -> bool {
    let s = statuses(c, except);
    one_mesh_of(&s, s.len())
}

/// What each node (but those in `except`) says, for a failure's message.
fn describe(c: &Cluster, except: &[usize]) -> String {
    describe_statuses(&statuses(c, except))
}

#[test]
fn a_seed_paused_for_45_s_while_twenty_nodes_join_loses_none_of_them() {
    // A cluster's first node stalls (SIGSTOP, a swapping or overloaded
    // host) while a job array's nodes start: they used to exit after 10 s
    // blaming the mesh key, and were lost for the rest of the allocation.
    let sb = sandbox();
    let mut c = Cluster::start(&sb, &["cpu=1"], &[]);
    let seed = c.nodes[0].address();
    c.nodes[0].signal(Signal::SIGSTOP);
    let stopped = Instant::now();
    for _ in 0..20 {
        c.add_joiner(Some(&seed), "cpu=1", &[]);
    }
    std::thread::sleep(Duration::from_secs(45).saturating_sub(stopped.elapsed()));
    for i in 1..=20 {
        assert_eq!(
            c.nodes[i].wait_exit(Duration::ZERO),
            None,
            "joiner {i} exited while the seed was paused:\n{}",
            c.nodes[i].lines().join("\n")
        );
    }
    // They say what is happening, and none ran alone meanwhile.
    let told = c.nodes[1].lines().join("\n");
    assert!(told.contains("no answer from"), "{told}");
    assert!(!told.contains("mesh.key"), "{told}");
    for i in 1..=20 {
        assert_eq!(follows(&c.nodes[i].lines()), None, "joiner {i} elected");
    }
    c.nodes[0].signal(Signal::SIGCONT);
    let healed = wait_until(Duration::from_secs(60), || one_mesh(&c, &[]));
    assert!(
        healed,
        "not one mesh 60 s after the seed woke:\n{}",
        describe(&c, &[])
    );
    for i in 1..=20 {
        assert_eq!(
            c.nodes[i].wait_exit(Duration::ZERO),
            None,
            "joiner {i} exited"
        );
    }
}

#[test]
fn two_meshes_of_one_key_become_one_when_a_node_of_one_joins_the_other_and_its_farm_comes_home() {
    let sb = sandbox();
    // Mesh A: nodes 0, 1, 2.
    let mut c = Cluster::start(&sb, &["cpu=2"; 3], &[]);
    // Mesh B, formed apart with the same key: nodes 3, 4, 5.
    c.add_joiner(None, "cpu=2", &[]);
    let b = c.nodes[3].address();
    c.add_joiner(Some(&b), "cpu=2", &[]);
    c.add_joiner(Some(&b), "cpu=2", &[]);
    let formed = wait_until(Duration::from_secs(30), || {
        one_mesh_of(&statuses(&c, &[0, 1, 2]), 3) && one_mesh_of(&statuses(&c, &[3, 4, 5]), 3)
    });
    assert!(formed, "mesh B did not form:\n{}", describe(&c, &[]));
    assert_ne!(
        c.status(0)["coordinator"],
        c.status(3)["coordinator"],
        "two meshes, two coordinators"
    );
    let tasks = 300;
    sb.write("farm.toml", &slow_farm(tasks, "0.3"));
    let r = c.mesh(1, &["submit", "farm.toml", "--out", "out"]);
    r.expect_code(0);
    let id = r.stdout.trim().to_string();
    let going = wait_until(Duration::from_secs(60), || {
        c.mesh(1, &["status", &id, "--json"]).json()["counts"]["done"]
            .as_u64()
            .unwrap_or(0)
            >= 30
    });
    assert!(going, "{}", c.mesh(1, &["status", &id]).stdout);
    // Node 2 of A stops and starts again joining B, as a job script would
    // that names another mesh's node; its state remembers A's members, and
    // no other node is told anything.
    c.nodes[2].signal(Signal::SIGTERM);
    assert_eq!(c.nodes[2].wait_exit(Duration::from_secs(30)), Some(0));
    let state = c.nodes[2].state.clone();
    c.nodes[2] = NodeProc::start(
        std::path::Path::new(env!("CARGO_BIN_EXE_mesh")),
        sb.path(),
        &state,
        &[
            "join",
            &b,
            "--listen",
            "/ip4/127.0.0.1/tcp/0",
            "--resources",
            "cpu=2",
        ],
    );
    let merged = wait_until(Duration::from_secs(60), || one_mesh(&c, &[]));
    assert!(
        merged,
        "A and B are not one mesh after 60 s:\n{}",
        describe(&c, &[])
    );
    let r = c.mesh(1, &["wait", &id, "--json"]);
    r.expect_code(0);
    assert_eq!(r.json()["counts"]["done"], tasks, "{}", r.stdout);
    mesh_tests::assert_outputs_home(&sb, "out", tasks);
}

#[test]
fn a_node_restarted_on_a_new_port_finds_its_mesh_through_the_members_it_remembered_with_its_seed_gone(
) {
    let sb = sandbox();
    let mut c = Cluster::start(&sb, &["cpu=1"; 4], &[]);
    let seed = c.nodes[0].address();
    // A node writes down the members it has seen at its next tick (every
    // 0.5 s, later on a loaded machine), not at each one: node 3 has been
    // in the mesh a little while before it dies.
    std::thread::sleep(Duration::from_secs(3));
    // The seed is gone for good; node 3 is killed and started again with
    // the same command line (a job script's), and something else took its
    // port meanwhile: it listens on a new one.
    let was = c.nodes[3].address();
    c.kill(0);
    c.kill(3);
    let _taken = mesh_tests::hold_port(&was);
    let state = c.nodes[3].state.clone();
    c.nodes[3] = NodeProc::start(
        std::path::Path::new(env!("CARGO_BIN_EXE_mesh")),
        sb.path(),
        &state,
        &["join", &seed, "--listen", "/ip4/127.0.0.1/tcp/0"],
    );
    let back = wait_until(Duration::from_secs(60), || one_mesh(&c, &[0]));
    assert!(
        back,
        "node 3 did not find its mesh again:\n{}\n{}",
        describe(&c, &[0]),
        c.nodes[3].lines().join("\n")
    );
    assert_eq!(c.nodes[3].wait_exit(Duration::ZERO), None);
}

#[test]
fn a_joiner_with_another_mesh_key_stops_with_exit_2_naming_the_key_and_the_seed_names_it() {
    let sb = sandbox();
    let c = Cluster::start(&sb, &["cpu=1"], &[]);
    let other = sb.path().join("other");
    sb.mesh(&["--state-dir", &other.to_string_lossy(), "init"])
        .expect_code(0);
    let mut intruder = NodeProc::start(
        std::path::Path::new(env!("CARGO_BIN_EXE_mesh")),
        sb.path(),
        &other,
        &[
            "join",
            &c.nodes[0].address(),
            "--listen",
            "/ip4/127.0.0.1/tcp/0",
        ],
    );
    let code = intruder.wait_exit(Duration::from_secs(120));
    assert_eq!(code, Some(2), "{}", intruder.lines().join("\n"));
    let said = intruder.lines().join("\n");
    assert!(
        said.contains("another mesh key") && said.contains("mesh.key"),
        "{said}"
    );
    let seen = wait_until(Duration::from_secs(10), || {
        c.nodes[0].lines().iter().any(|l| {
            l.contains("refused a connection from /ip4/127.0.0.1/")
                && l.contains("another mesh key")
        })
    });
    assert!(
        seen,
        "the seed says nothing:\n{}",
        c.nodes[0].lines().join("\n")
    );
    assert_eq!(c.status(0)["nodes"].as_array().unwrap().len(), 1);
}

#[test]
fn four_nodes_on_ports_the_system_picked_all_killed_and_restarted_are_one_mesh_again_and_the_farm_comes_home(
) {
    // Without --listen a node takes a port the system picks: when every
    // node restarted at once, nobody's remembered address was valid and
    // they came back as meshes of one. Now each asks for its last port.
    let sb = sandbox();
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_mesh"));
    let states: Vec<std::path::PathBuf> = (0..4).map(|i| sb.path().join(format!("n{i}"))).collect();
    sb.mesh(&["--state-dir", &states[0].to_string_lossy(), "init"])
        .expect_code(0);
    for s in &states[1..] {
        std::fs::create_dir_all(s).unwrap();
        std::fs::copy(states[0].join("mesh.key"), s.join("mesh.key")).unwrap();
    }
    let start = |i: usize, seed: &str| {
        let args: Vec<&str> = if i == 0 {
            vec!["node", "--resources", "cpu=2"]
        } else {
            vec!["join", seed, "--resources", "cpu=2"]
        };
        NodeProc::start(bin, sb.path(), &states[i], &args)
    };
    let first = start(0, "");
    let seed = first.address();
    let mut nodes = vec![first];
    for i in 1..4 {
        nodes.push(start(i, &seed));
    }
    // Asked of the nodes: after all restart, a node may follow the
    // coordinator its store remembers without printing a line about it.
    let statuses = || -> Vec<serde_json::Value> {
        states
            .iter()
            .map(|s| {
                let r = sb.mesh(&["--state-dir", &s.to_string_lossy(), "status", "--json"]);
                serde_json::from_str(&r.stdout).unwrap_or(serde_json::Value::Null)
            })
            .collect()
    };
    let formed = || one_mesh_of(&statuses(), 4);
    assert!(wait_until(Duration::from_secs(60), formed));
    let tasks = 200;
    sb.write("farm.toml", &slow_farm(tasks, "0.2"));
    let submit = sb.mesh(&[
        "--state-dir",
        &states[3].to_string_lossy(),
        "submit",
        "farm.toml",
        "--out",
        "out",
    ]);
    submit.expect_code(0);
    let id = submit.stdout.trim().to_string();
    let going = wait_until(Duration::from_secs(60), || {
        (0..tasks)
            .filter(|i| sb.exists(&format!("out/s/{i}/r.txt")))
            .count()
            >= 20
    });
    assert!(going, "the farm did not get going");
    for n in &nodes {
        n.signal(Signal::SIGKILL);
    }
    for n in &mut nodes {
        // Killed by a signal: no exit code to see.
        let _ = n.wait_exit(Duration::from_secs(10));
    }
    let mut nodes: Vec<NodeProc> = (0..4).map(|i| start(i, &seed)).collect();
    assert_eq!(nodes[0].address(), seed, "the first node's port changed");
    let again = wait_until(Duration::from_secs(60), formed);
    let said: Vec<String> = nodes.iter().map(|n| n.lines().join("\n")).collect();
    assert!(
        again,
        "not one mesh again: {}\n{}",
        describe_statuses(&statuses()),
        said.join("\n---\n")
    );
    let r = sb.mesh(&[
        "--state-dir",
        &states[3].to_string_lossy(),
        "wait",
        &id,
        "--json",
    ]);
    r.expect_code(0);
    assert_eq!(r.json()["counts"]["done"], tasks, "{}", r.stdout);
    mesh_tests::assert_outputs_home(&sb, "out", tasks);
    for n in &mut nodes {
        assert_eq!(n.wait_exit(Duration::ZERO), None);
    }
}
