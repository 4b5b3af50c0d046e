//! Right results every time: a change upstream reruns what depends on it, earlier results are reused wherever they are wanted, staged scripts stay executable on every node, and a gather never reads a folder of outputs still coming.

use std::collections::HashSet;
use std::os::unix::fs::PermissionsExt;

use mesh_tests::{Cluster, Sandbox};

use crate::sandbox;

/// `run` over params.txt; `gather` reads every `run` output, `b` the one of its index.
const STALE: &str = r#"
[farm]
name = "stale"

[[stage]]
name = "run"
sweep.x = { lines = "params.txt" }
workdir = "w/{stage}/{index}"
shell = "echo {x} > r.txt"
outputs = ["r.txt"]

[[stage]]
name = "gather"
after = ["run"]
workdir = "w/{stage}"
shell = "cat {out}/run/*/r.txt | tr '\\n' ' ' > all.txt"
outputs = ["all.txt"]

[[stage]]
name = "b"
after_each = ["run"]
sweep.x = { lines = "params.txt" }
workdir = "w/{stage}/{index}"
shell = "cat {out}/run/{index}/r.txt > b.txt; echo {x} >> b.txt"
outputs = ["b.txt"]
"#;

/// What every dependent of STALE must hold when params.txt says `xs`.
fn assert_current(sb: &Sandbox, out: &str, xs: &[&str]) {
    let all: Vec<String> = xs.iter().map(|x| format!("{x} ")).collect();
    assert_eq!(sb.read(&format!("{out}/gather/0/all.txt")), all.concat());
    for (i, x) in xs.iter().enumerate() {
        assert_eq!(sb.read(&format!("{out}/run/{i}/r.txt")), format!("{x}\n"));
        assert_eq!(
            sb.read(&format!("{out}/b/{i}/b.txt")),
            format!("{x}\n{x}\n"),
            "b/{i} read the run output of its own index"
        );
    }
}

fn cached(r: &mesh_tests::Run) -> u64 {
    r.json()["counts"]["cached"]
        .as_u64()
        .expect("counts.cached")
}

#[test]
fn a_change_upstream_reruns_every_dependent_and_earlier_results_are_reused_in_any_folder() {
    let sb = sandbox();
    sb.write("farm.toml", STALE);
    sb.write("params.txt", "10\n20\n30\n");
    let run = |extra: &[&str]| {
        let mut args = vec!["run", "farm.toml", "--json"];
        args.extend_from_slice(extra);
        let r = sb.mesh(&args);
        r.expect_code(0);
        r
    };
    assert_eq!(cached(&run(&[])), 0);
    assert_current(&sb, "mesh-out/stale", &["10", "20", "30"]);

    // One line changed: that run task, the gather and its own b run again.
    sb.write("params.txt", "10\n20\n70\n");
    assert_eq!(
        cached(&run(&[])),
        4,
        "run/0, run/1, b/0 and b/1 are untouched"
    );
    assert_current(&sb, "mesh-out/stale", &["10", "20", "70"]);

    // Another --out: nothing runs, every output is put in the new folder.
    let other = sb.path().join("elsewhere");
    let other_s = other.to_string_lossy().to_string();
    assert_eq!(cached(&run(&["--out", &other_s])), 7);
    assert_current(&sb, "elsewhere", &["10", "20", "70"]);
    // And back: the first folder's results are still known.
    assert_eq!(cached(&run(&[])), 7);

    // An output deleted by hand in one folder is put back from another
    // that still holds it whole; deleted in both, that task runs again.
    std::fs::remove_file(sb.path().join("mesh-out/stale/run/1/r.txt")).unwrap();
    assert_eq!(cached(&run(&[])), 7);
    assert_current(&sb, "mesh-out/stale", &["10", "20", "70"]);
    std::fs::remove_file(sb.path().join("mesh-out/stale/run/1/r.txt")).unwrap();
    std::fs::remove_file(sb.path().join("elsewhere/run/1/r.txt")).unwrap();
    assert_eq!(cached(&run(&[])), 6);
    assert_current(&sb, "mesh-out/stale", &["10", "20", "70"]);

    // --rerun STAGE runs it and what depends on it; --rerun alone, all.
    assert_eq!(cached(&run(&["--rerun", "b"])), 4);
    assert_eq!(cached(&run(&["--rerun"])), 0);
    assert_current(&sb, "mesh-out/stale", &["10", "20", "70"]);
    let bad = sb.mesh(&["run", "farm.toml", "--rerun", "nope"]);
    bad.expect_code(2);
    assert!(
        bad.stderr.contains("stages: run, gather, b"),
        "{}",
        bad.stderr
    );

    // Going back to the first parameters reuses what was made for them
    // then, for the tasks whose outputs still stand.
    sb.write("params.txt", "10\n20\n30\n");
    run(&[]);
    assert_current(&sb, "mesh-out/stale", &["10", "20", "30"]);
}

#[test]
fn a_change_upstream_reaches_every_dependent_on_a_mesh() {
    let sb = sandbox();
    let c = Cluster::start(&sb, &["cpu=2"; 3], &[]);
    sb.write("farm/farm.toml", STALE);
    sb.write("farm/params.txt", "10\n20\n30\n");
    let out = sb.path().join("out").to_string_lossy().to_string();
    let submit = || {
        c.mesh(1, &["submit", "farm/farm.toml", "--out", &out, "--wait"])
            .expect_code(0);
    };
    submit();
    assert_current(&sb, "out", &["10", "20", "30"]);
    sb.write("farm/params.txt", "10\n20\n70\n");
    submit();
    assert_current(&sb, "out", &["10", "20", "70"]);
}

/// Seed 004's pattern: a wrapper staged as an input and run as `./wrapper.sh`,
/// and a script made by a task, collected as an output.
const WRAPPER: &str = r#"
[farm]
name = "wrapped"

[[stage]]
name = "solve"
sweep.i = { range = "0..11" }
workdir = "runs/{index}"
inputs = ["wrapper.sh"]
command = ["./wrapper.sh", "{i}"]
outputs = ["result.txt", "again.sh"]
"#;

#[test]
fn a_staged_wrapper_stays_executable_on_every_node_and_so_does_an_executable_output() {
    let sb = sandbox();
    let c = Cluster::start(&sb, &["cpu=2"; 3], &[]);
    sb.write("farm/farm.toml", WRAPPER);
    sb.write(
        "farm/wrapper.sh",
        "#!/bin/sh\necho \"$1 $MESH_NODE\" > result.txt\nprintf '#!/bin/sh\\necho %s\\n' \"$1\" > again.sh\nchmod 750 again.sh\nsleep 0.3\n",
    );
    let out = sb.path().join("out").to_string_lossy().to_string();
    c.mesh(2, &["submit", "farm/farm.toml", "--out", &out, "--wait"])
        .expect_code(0);
    let mut nodes = HashSet::new();
    for i in 0..12 {
        let text = sb.read(&format!("out/solve/{i}/result.txt"));
        let (n, node) = text.trim().split_once(' ').expect("`i node`");
        assert_eq!(n, i.to_string());
        nodes.insert(node.to_string());
        let again = sb.path().join(format!("out/solve/{i}/again.sh"));
        let mode = std::fs::metadata(&again).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o750, "solve/{i}'s again.sh came home with its mode");
    }
    assert!(
        nodes.len() >= 2,
        "12 tasks of 0.3 s on 3 nodes ran on {nodes:?} only"
    );
}

/// Twenty tasks whose outputs come home from wherever they ran, and a
/// gather that counts them.
const GATHER: &str = r#"
[farm]
name = "gather"

[[stage]]
name = "make"
sweep.i = { range = "0..19" }
workdir = "w/{stage}/{index}"
shell = "sleep 0.05; echo {i} $MESH_NODE > r.txt"
outputs = ["r.txt"]

[[stage]]
name = "gather"
after = ["make"]
workdir = "w/{stage}"
shell = "cat {out}/make/*/r.txt | wc -l > count.txt; echo $MESH_NODE >> count.txt"
outputs = ["count.txt"]
"#;

#[test]
fn a_gather_on_a_mesh_reads_every_output_every_time() {
    let sb = sandbox();
    let c = Cluster::start(&sb, &["cpu=2"; 3], &[]);
    sb.write("farm/farm.toml", GATHER);
    let runs = 20;
    let mut ids = Vec::new();
    for k in 0..runs {
        let out = sb
            .path()
            .join(format!("out{k}"))
            .to_string_lossy()
            .to_string();
        let r = c.mesh(0, &["submit", "farm/farm.toml", "--out", &out]);
        r.expect_code(0);
        ids.push(r.stdout.trim().to_string());
    }
    for id in &ids {
        c.mesh(0, &["wait", id]).expect_code(0);
    }
    let mut nodes = HashSet::new();
    for k in 0..runs {
        assert_eq!(
            sb.read(&format!("out{k}/gather/0/count.txt"))
                .lines()
                .next()
                .unwrap_or(""),
            "20",
            "run {k}: the gather read every output: {:?}",
            sb.read(&format!("out{k}/gather/0/count.txt"))
        );
        for i in 0..20 {
            let text = sb.read(&format!("out{k}/make/{i}/r.txt"));
            nodes.insert(text.split_whitespace().nth(1).unwrap_or("").to_string());
        }
    }
    assert!(nodes.len() >= 2, "the outputs were all made on {nodes:?}");
}

/// Each task writes its output and counts its runs in `runs/<stage>.<index>`
/// (one file system here, so every node's runs land in one folder).
fn reuse_farm(runs: &std::path::Path) -> String {
    format!(
        r#"
[farm]
name = "reuse"

[[stage]]
name = "make"
sweep.i = {{ range = "0..11" }}
workdir = "w/{{stage}}/{{index}}"
shell = "echo {{i}} > r.txt; echo run >> {runs}/make.{{index}}; sleep 0.1"
outputs = ["r.txt"]

[[stage]]
name = "sum"
after = ["make"]
workdir = "w/{{stage}}"
shell = "cat {{out}}/make/*/r.txt | wc -l > n.txt; echo run >> {runs}/sum.0"
outputs = ["n.txt"]
"#,
        runs = runs.display()
    )
}

fn runs(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|f| std::fs::read_to_string(f.path()).unwrap().lines().count())
                .sum()
        })
        .unwrap_or(0)
}

#[test]
fn a_farm_submitted_again_on_a_mesh_reuses_every_result_into_its_new_folder() {
    let sb = sandbox();
    let c = Cluster::start(&sb, &["cpu=2"; 3], &[]);
    let runs_dir = sb.path().join("runs");
    std::fs::create_dir_all(&runs_dir).unwrap();
    sb.write("farm/farm.toml", &reuse_farm(&runs_dir));
    let submit = |out: &str, extra: &[&str]| {
        let out = sb.path().join(out).to_string_lossy().to_string();
        let mut args = vec!["submit", "farm/farm.toml", "--out", &out, "--wait"];
        args.extend_from_slice(extra);
        c.mesh(1, &args).expect_code(0);
    };
    let assert_whole = |out: &str| {
        for i in 0..12 {
            assert_eq!(sb.read(&format!("{out}/make/{i}/r.txt")), format!("{i}\n"));
        }
        assert_eq!(sb.read(&format!("{out}/sum/0/n.txt")).trim(), "12");
    };
    submit("a", &[]);
    assert_whole("a");
    assert_eq!(runs(&runs_dir), 13);

    // The same farm again, into the same folder and into another: nothing runs.
    submit("a", &[]);
    submit("b", &[]);
    assert_eq!(runs(&runs_dir), 13, "no task ran again");
    assert_whole("b");
    let st = c.mesh(1, &["status", "--json"]);
    st.expect_code(0);
    let farms = st.json()["farms"].clone();
    let reused: Vec<u64> = farms
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["counts"]["cached"].as_u64().unwrap_or(0))
        .collect();
    assert!(reused.contains(&13), "a farm says 13 reused: {farms}");

    // From another node: the earlier farm's home gives what it keeps.
    let out = sb.path().join("d").to_string_lossy().to_string();
    let r = c.mesh(2, &["submit", "farm/farm.toml", "--out", &out, "--wait"]);
    r.expect_code(0);
    assert!(r.stderr.contains("(13 reused"), "{}", r.stderr);
    assert_eq!(runs(&runs_dir), 13, "no task ran again on another node");
    assert_whole("d");

    // --rerun: every task runs.
    submit("c", &["--rerun"]);
    assert_eq!(runs(&runs_dir), 26);
    assert_whole("c");
}

/// examples/pipeline's shape: `analyze/i` reads `simulate/i`'s output.
const PIPELINE: &str = r#"
[farm]
name = "pipe"

[defaults]
workdir = "runs/{stage}/{index}"

[[stage]]
name = "simulate"
sweep.n = { range = "1..6" }
shell = "sleep 0.3; echo $(({n} * {n})) > sim.dat"
outputs = ["sim.dat"]

[[stage]]
name = "analyze"
sweep.n = { range = "1..6" }
after_each = "simulate"
shell = "echo n={n} sq=$(cat {out}/simulate/{index}/sim.dat) > stats.txt"
outputs = ["stats.txt"]

[[stage]]
name = "report"
after = ["analyze"]
shell = "cat {out}/analyze/*/stats.txt > summary.txt"
outputs = ["summary.txt"]
"#;

#[test]
fn a_pipeline_on_a_mesh_ends_every_time_with_every_stage_reading_what_it_depends_on() {
    let sb = sandbox();
    let c = Cluster::start(&sb, &["cpu=2"; 3], &[]);
    sb.write("farm/farm.toml", PIPELINE);
    // The home's tasks that read outputs run there; the home must be
    // offered them even when the other nodes took every upstream task and
    // the home had nothing to do (once, a farm in four waited for ever).
    for k in 0..5 {
        let out = sb
            .path()
            .join(format!("out{k}"))
            .to_string_lossy()
            .to_string();
        c.mesh(
            0,
            &[
                "submit",
                "farm/farm.toml",
                "--out",
                &out,
                "--wait",
                "--rerun",
            ],
        )
        .expect_code(0);
        let summary = sb.read(&format!("out{k}/report/0/summary.txt"));
        let want: String = (1..=6).map(|n| format!("n={n} sq={}\n", n * n)).collect();
        assert_eq!(summary, want, "farm {k}");
    }
}
