//! Pipelines on nodes that share no file system: each node but the submitter in a mount namespace of its own, where the submitter's farm and output folders are empty; every stage still reads what it depends on, and every output comes home, through a node's death too.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use mesh_tests::{apart_possible, wait_until, Cluster, Sandbox};

fn sandbox() -> Sandbox {
    Sandbox::new(env!("CARGO_BIN_EXE_mesh"))
}

/// Starts `n` nodes, all but the first without the sandbox's `farm` and
/// `out` folders; None (and says so) where namespaces cannot be made.
fn apart(sb: &Sandbox, n: usize, resources: &str) -> Option<Cluster> {
    if !apart_possible() {
        eprintln!("skipped: needs root and `unshare -m` for nodes that share no file system");
        return None;
    }
    let (farm, out) = (sb.path().join("farm"), sb.path().join("out"));
    let hidden: [&Path; 2] = [&farm, &out];
    Some(Cluster::start_apart(sb, &vec![resources; n], &[], &hidden))
}

/// The nodes that ran a stage's tasks, as the tasks wrote them down.
fn nodes_of(sb: &Sandbox, stage: &str, n: u32) -> BTreeSet<String> {
    (0..n)
        .map(|i| {
            sb.read(&format!("out/{stage}/{i}/node.txt"))
                .trim()
                .to_string()
        })
        .collect()
}

#[test]
fn the_example_pipeline_comes_home_whole_from_three_nodes_that_share_no_file_system() {
    let sb = sandbox();
    let Some(c) = apart(&sb, 3, "cpu=2") else {
        return;
    };
    let example = include_str!("../../examples/pipeline/farm.toml");
    sb.write("farm/farm.toml", example);
    let out = sb.path().join("out").to_string_lossy().to_string();
    for _ in 0..2 {
        let r = c.mesh(
            0,
            &[
                "submit",
                "farm/farm.toml",
                "--out",
                &out,
                "--wait",
                "--rerun",
            ],
        );
        r.expect_code(0);
        let summary = sb.read("out/report/0/summary.txt");
        let want: Vec<String> = (1..=6u64)
            .map(|n| format!("n={n} sum_of_squares={}", n * (n + 1) * (2 * n + 1) / 6))
            .collect();
        assert_eq!(summary.lines().collect::<Vec<_>>(), want, "{}", r.stderr);
    }
}

/// Three stages: `a` makes a file per task, `b` reads its `a` task's,
/// `c` reads every `b`'s; each task writes down the node it ran on.
fn chain(n: u32, secs: &str) -> String {
    format!(
        r#"
[farm]
name = "chain"

[defaults]
workdir = "runs/{{stage}}/{{index}}"

[[stage]]
name = "a"
sweep.i = {{ range = "0..{last}" }}
shell = "sleep {secs}; echo a{{i}} > x.txt; echo $MESH_NODE > node.txt"
outputs = ["x.txt", "node.txt"]

[[stage]]
name = "b"
sweep.i = {{ range = "0..{last}" }}
after_each = "a"
shell = "sleep {secs}; echo $(cat {{out}}/a/{{index}}/x.txt)b > y.txt; echo $MESH_NODE > node.txt"
outputs = ["y.txt", "node.txt"]

[[stage]]
name = "c"
after = ["b"]
shell = "cat {{out}}/b/*/y.txt | sort > all.txt; echo $MESH_NODE > node.txt"
outputs = ["all.txt", "node.txt"]
"#,
        last = n - 1
    )
}

fn chain_result(n: u32) -> String {
    let mut want: Vec<String> = (0..n).map(|i| format!("a{i}b")).collect();
    want.sort();
    want.join("\n") + "\n"
}

#[test]
fn a_chain_runs_its_dependent_stages_off_the_home_and_reads_every_output() {
    let sb = sandbox();
    let Some(c) = apart(&sb, 3, "cpu=2") else {
        return;
    };
    let n = 12;
    sb.write("farm/farm.toml", &chain(n, "0.3"));
    let out = sb.path().join("out").to_string_lossy().to_string();
    let r = c.mesh(0, &["submit", "farm/farm.toml", "--out", &out, "--wait"]);
    r.expect_code(0);
    assert_eq!(sb.read("out/c/0/all.txt"), chain_result(n), "{}", r.stderr);
    let home = c.nodes[0].peer_id();
    let b_nodes = nodes_of(&sb, "b", n);
    assert!(
        b_nodes.iter().any(|b| *b != home),
        "every `b` ran on the home ({b_nodes:?}): nothing read its inputs off it"
    );
    // The folders a node kept for the farm go when it is over.
    let gone = wait_until(Duration::from_secs(30), || {
        (1..3).all(|i| {
            std::fs::read_dir(c.nodes[i].state.join("work"))
                .map_or(true, |mut d| d.next().is_none())
        })
    });
    assert!(gone, "a node kept its folder for the farm after its end");
}

/// Submits a chain of `n` (see [`chain`]) on node 0, the home, and
/// returns its id once `done` of its tasks are done.
fn chain_going(sb: &Sandbox, c: &Cluster, n: u32, done: u64) -> String {
    sb.write("farm/farm.toml", &chain(n, "0.5"));
    let out = sb.path().join("out").to_string_lossy().to_string();
    let r = c.mesh(0, &["submit", "farm/farm.toml", "--out", &out]);
    r.expect_code(0);
    let id = r.stdout.trim().to_string();
    let going = wait_until(Duration::from_secs(60), || {
        c.mesh(0, &["status", &id, "--json"]).json()["counts"]["done"]
            .as_u64()
            .unwrap_or(0)
            >= done
    });
    assert!(going, "the farm did not get going");
    id
}

#[test]
fn a_node_killed_while_it_holds_outputs_others_need_costs_reruns_not_results() {
    let sb = sandbox();
    let Some(mut c) = apart(&sb, 4, "cpu=2") else {
        return;
    };
    let n = 24;
    let id = chain_going(&sb, &c, n, 8);
    // A node that ran some of `a` (and keeps what it made until the home
    // has it) dies with its tasks and its outputs.
    c.kill(1);
    let ended = wait_until(Duration::from_secs(180), || {
        c.mesh(0, &["status", &id, "--json"]).json()["finished"] == true
    });
    assert!(ended, "{}", c.mesh(0, &["status", &id]).stdout);
    let w = c.mesh(0, &["wait", &id, "--json"]);
    w.expect_code(0);
    assert_eq!(w.json()["counts"]["done"], 2 * n + 1, "{}", w.stdout);
    assert_eq!(sb.read("out/c/0/all.txt"), chain_result(n));
    for i in 0..n {
        assert_eq!(sb.read(&format!("out/b/{i}/y.txt")), format!("a{i}b\n"));
    }
    // Whatever the dead node alone had was made again, and said so.
    let redone = w.json()["redone"].as_u64();
    assert!(redone.is_some(), "no count of reruns: {}", w.stdout);
    eprintln!("redone after the kill: {redone:?}");
}

#[test]
fn the_submitter_killed_mid_graph_and_the_farm_resumed_on_another_node_brings_every_output_there() {
    let sb = sandbox();
    let Some(mut c) = apart(&sb, 3, "cpu=2") else {
        return;
    };
    let n = 16;
    let id = chain_going(&sb, &c, n, 6);
    c.kill(0);
    // Another node, which never saw the farm's folder, takes it over into
    // a folder of its own.
    let resumed = sb.path().join("resumed").to_string_lossy().to_string();
    c.mesh(1, &["resume", &id, "--out", &resumed])
        .expect_code(0);
    let r = c.mesh(1, &["wait", &id]);
    r.expect_code(0);
    assert_eq!(
        sb.read("resumed/c/0/all.txt"),
        chain_result(n),
        "{}",
        r.stderr
    );
    for i in 0..n {
        assert_eq!(sb.read(&format!("resumed/a/{i}/x.txt")), format!("a{i}\n"));
        assert_eq!(sb.read(&format!("resumed/b/{i}/y.txt")), format!("a{i}b\n"));
    }
}

/// Three stages by key: a piece per (chrom, part), a merge per chrom of
/// that chrom's pieces, and a check per merge that takes its sweep.
const KEYED: &str = r#"
[farm]
name = "keyed"

[defaults]
workdir = "runs/{stage}/{index}"

[[stage]]
name = "split"
sweep.chrom = { list = ["1", "2", "3", "4"] }
sweep.part = { range = "0..4" }
shell = "sleep 0.2; echo {chrom}.{part} > piece.txt; echo $MESH_NODE > node.txt"
outputs = ["piece.txt", "node.txt"]

[[stage]]
name = "merge"
sweep.chrom = { list = ["4", "3", "2", "1"] }
after = [{ stage = "split", by = ["chrom"] }]
shell = "cat {out}/split/*/piece.txt | grep '^{chrom}[.]' | sort > merged.txt; echo $MESH_NODE > node.txt"
outputs = ["merged.txt", "node.txt"]

[[stage]]
name = "check"
after_each = "merge"
shell = "echo {chrom} $(wc -l < {out}/merge/{index}/merged.txt) > n.txt; echo $MESH_NODE > node.txt"
outputs = ["n.txt", "node.txt"]
"#;

#[test]
fn a_keyed_graph_comes_home_whole_from_nodes_that_share_no_file_system() {
    let sb = sandbox();
    let Some(c) = apart(&sb, 3, "cpu=2") else {
        return;
    };
    sb.write("farm/farm.toml", KEYED);
    let out = sb.path().join("out").to_string_lossy().to_string();
    let r = c.mesh(0, &["submit", "farm/farm.toml", "--out", &out, "--wait"]);
    r.expect_code(0);
    for (i, chrom) in ["4", "3", "2", "1"].iter().enumerate() {
        let want: String = (0..=4).map(|p| format!("{chrom}.{p}\n")).collect();
        assert_eq!(
            sb.read(&format!("out/merge/{i}/merged.txt")),
            want,
            "{}",
            r.stderr
        );
        assert_eq!(
            sb.read(&format!("out/check/{i}/n.txt")),
            format!("{chrom} 5\n")
        );
    }
    let ran: BTreeSet<String> = nodes_of(&sb, "merge", 4)
        .into_iter()
        .chain(nodes_of(&sb, "check", 4))
        .collect();
    eprintln!("merge and check ran on {} nodes", ran.len());
}
