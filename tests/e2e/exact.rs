//! Right results by construction, on the paths a user takes first: a task sees exactly what it depends on under `{out}` (a natural glob included), the farm's folder holds the farm as it is now, a reused output is a file of its own, every submission is its own farm, and `mesh node &` then a command at once reaches the node.

use std::os::unix::fs::MetadataExt;
use std::time::{Duration, Instant};

use mesh_tests::{apart_possible, Cluster, Sandbox};
use nix::sys::signal::Signal;

use crate::sandbox;

/// Four samples of three reps each; a merge per sample waits for its own
/// three (`by`) and reads them with the glob a user writes first. The
/// sims take unequal times, so with `{out}` the farm's folder a merge saw
/// whatever had finished (4, 7, 10 and 12 lines once).
const KEYED: &str = r#"
[farm]
name = "keyed"

[[stage]]
name = "sim"
sweep.sample = { list = ["a", "b", "c", "d"] }
sweep.rep = { list = ["1", "2", "3"] }
workdir = "w/{stage}/{index}"
shell = "sleep 0.{rep}; echo {sample}-{rep} > part.txt"
outputs = ["part.txt"]

[[stage]]
name = "merge"
sweep.sample = { list = ["a", "b", "c", "d"] }
after = [{ stage = "sim", by = ["sample"] }]
workdir = "w/{stage}/{index}"
shell = "cat {out}/sim/*/part.txt | sort > merged.txt; find {out} -name part.txt | wc -l > seen.txt"
outputs = ["merged.txt", "seen.txt"]
"#;

fn assert_keyed(sb: &Sandbox, out: &str) {
    for (i, s) in ["a", "b", "c", "d"].iter().enumerate() {
        assert_eq!(
            sb.read(&format!("{out}/merge/{i}/merged.txt")),
            format!("{s}-1\n{s}-2\n{s}-3\n"),
            "merge/{i} sees its own sample's three parts and nothing else"
        );
        assert_eq!(sb.read(&format!("{out}/merge/{i}/seen.txt")).trim(), "3");
    }
}

#[test]
fn a_keyed_merge_with_a_natural_glob_sees_exactly_what_it_depends_on() {
    let sb = sandbox();
    sb.write("farm.toml", KEYED);
    sb.mesh(&["run", "farm.toml"]).expect_code(0);
    assert_keyed(&sb, "mesh-out/keyed");
}

#[test]
fn a_keyed_merge_sees_exactly_what_it_depends_on_on_three_nodes_apart() {
    if !apart_possible() {
        eprintln!("skipped: needs root and `unshare -m` for nodes that share no file system");
        return;
    }
    let sb = sandbox();
    let (farm, out) = (sb.path().join("farm"), sb.path().join("out"));
    let c = Cluster::start_apart(&sb, &["cpu=1"; 3], &[], &[&farm, &out]);
    sb.write("farm/farm.toml", KEYED);
    let out_s = out.to_string_lossy().to_string();
    // Twice: the second farm's merges run where the first one's fetched
    // other samples' parts into the node's folder for the farm.
    for _ in 0..2 {
        c.mesh(
            0,
            &[
                "submit",
                "farm/farm.toml",
                "--out",
                &out_s,
                "--wait",
                "--rerun",
            ],
        )
        .expect_code(0);
        assert_keyed(&sb, "out");
    }
}

/// `sim` over params.txt; `merge` for n = 1 and 2 reads only the lines of
/// its own n, carefully: a key-filtered read.
const FILTERED: &str = r#"
[farm]
name = "filtered"

[[stage]]
name = "sim"
sweep.n = { lines = "params.txt" }
workdir = "w/{stage}/{index}"
shell = "sleep 0.3; echo n={n} > part.txt"
outputs = ["part.txt"]

[[stage]]
name = "merge"
sweep.n = { list = ["1", "2"] }
after = [{ stage = "sim", by = ["n"] }]
workdir = "w/{stage}/{index}"
shell = "grep -hx 'n={n}' {out}/sim/*/part.txt > merged.txt || true"
outputs = ["merged.txt"]
"#;

#[test]
fn a_task_never_reads_an_output_about_to_be_remade_and_no_wrong_result_is_kept() {
    let sb = sandbox();
    sb.write("farm.toml", FILTERED);
    sb.write("params.txt", "1\n2\n");
    sb.mesh(&["run", "farm.toml"]).expect_code(0);
    assert_eq!(sb.read("mesh-out/filtered/merge/0/merged.txt"), "n=1\n");
    // No sim has n=1 now: merge/0 depends on nothing, and once started at
    // once and read sim/0's previous output, `n=1`, kept for good.
    sb.write("params.txt", "3\n2\n");
    for _ in 0..2 {
        sb.mesh(&["run", "farm.toml"]).expect_code(0);
        assert_eq!(sb.read("mesh-out/filtered/merge/0/merged.txt"), "");
        assert_eq!(sb.read("mesh-out/filtered/merge/1/merged.txt"), "n=2\n");
        assert_eq!(sb.read("mesh-out/filtered/sim/0/part.txt"), "n=3\n");
    }
}

/// README's sweep, shortened: a parameter a line, and a table of them all.
const SWEEP: &str = r#"
[farm]
name = "sweep"

[[stage]]
name = "solve"
sweep.x = { lines = "params.txt" }
workdir = "runs/{stage}/{index}"
shell = "echo {x} > result.dat"
outputs = ["result.dat"]

[[stage]]
name = "collect"
after = ["solve"]
workdir = "runs/{stage}"
shell = "cat {out}/solve/*/result.dat | sort -n > table.txt"
outputs = ["table.txt"]
"#;

#[test]
fn a_shrunk_sweep_sets_its_old_outputs_aside_and_the_gather_reads_only_the_farm() {
    let sb = sandbox();
    sb.write("farm.toml", SWEEP);
    sb.write("params.txt", "1\n2\n3\n4\n5\n6\n7\n8\n");
    sb.mesh(&["run", "farm.toml"]).expect_code(0);
    sb.write("params.txt", "1\n2\n3\n4\n5\n6\n");
    let r = sb.mesh(&["run", "farm.toml"]);
    r.expect_code(0);
    assert!(
        r.stderr
            .contains("moved the outputs of 2 tasks no longer in the farm to"),
        "{}",
        r.stderr
    );
    assert_eq!(
        sb.read("mesh-out/sweep/collect/0/table.txt"),
        "1\n2\n3\n4\n5\n6\n"
    );
    assert!(!sb.exists("mesh-out/sweep/solve/6"));
    assert!(!sb.exists("mesh-out/sweep/solve/7"));
    // Set aside, never deleted: where the line says.
    let aside = sb.path().join("mesh-out/sweep/.mesh-set-aside");
    let runs: Vec<_> = std::fs::read_dir(&aside).unwrap().flatten().collect();
    assert_eq!(runs.len(), 1);
    let kept = runs[0].path().join("solve/7/result.dat");
    assert_eq!(std::fs::read_to_string(&kept).unwrap(), "8\n");
}

/// docs/farm-file.md's 1000Genome pattern: a file per chromosome, collected
/// by a pattern, and a merge per chromosome reading them by name.
const GENOME: &str = r#"
[farm]
name = "genome"

[[stage]]
name = "individuals"
sweep.chrom = { lines = "chroms.txt" }
workdir = "w/{stage}/{index}"
shell = "echo part-of-{chrom} > chr{chrom}.txt"
outputs = ["chr*.txt"]

[[stage]]
name = "merge"
sweep.chrom = { range = "1..3" }
after = [{ stage = "individuals", by = ["chrom"] }]
workdir = "w/{stage}/{index}"
shell = "cat {out}/individuals/*/chr{chrom}.txt > merged.txt 2>/dev/null || true"
outputs = ["merged.txt"]
"#;

#[test]
fn a_task_run_again_leaves_nothing_of_its_earlier_run_in_its_folder() {
    let sb = sandbox();
    sb.write("farm.toml", GENOME);
    sb.write("chroms.txt", "1\n2\n");
    sb.mesh(&["run", "farm.toml"]).expect_code(0);
    assert_eq!(sb.read("mesh-out/genome/merge/1/merged.txt"), "part-of-2\n");
    sb.write("chroms.txt", "1\n3\n");
    sb.mesh(&["run", "farm.toml"]).expect_code(0);
    let mut files: Vec<String> = std::fs::read_dir(sb.path().join("mesh-out/genome/individuals/1"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    // The workdir still has the old chr2.txt (the user's folder); the new
    // run did not make it, so it is not its output.
    assert!(sb.exists("w/individuals/1/chr2.txt"));
    assert_eq!(files, ["chr3.txt"]);
    assert_eq!(sb.read("mesh-out/genome/merge/1/merged.txt"), "");
    assert_eq!(sb.read("mesh-out/genome/merge/2/merged.txt"), "part-of-3\n");
}

#[test]
fn a_reused_output_is_a_file_of_its_own_that_an_edit_elsewhere_leaves_alone() {
    let sb = sandbox();
    sb.write("farm.toml", SWEEP);
    sb.write("params.txt", "1\n2\n");
    sb.mesh(&["run", "farm.toml", "--out", "e1"]).expect_code(0);
    let r = sb.mesh(&["run", "farm.toml", "--out", "e2", "--json"]);
    r.expect_code(0);
    assert_eq!(r.json()["counts"]["cached"], 3, "all reused into e2");
    let (e1, e2) = (
        sb.path().join("e1/solve/0/result.dat"),
        sb.path().join("e2/solve/0/result.dat"),
    );
    assert_eq!(std::fs::metadata(&e1).unwrap().nlink(), 1);
    assert_eq!(std::fs::metadata(&e2).unwrap().nlink(), 1);
    // A user post-processing one run's results in place.
    let mut f = std::fs::OpenOptions::new().append(true).open(&e1).unwrap();
    std::io::Write::write_all(&mut f, b"tampered\n").unwrap();
    drop(f);
    assert_eq!(sb.read("e2/solve/0/result.dat"), "1\n");
    // The edited folder is not trusted again; the other one still is.
    sb.mesh(&["run", "farm.toml", "--out", "e1"]).expect_code(0);
    assert_eq!(sb.read("e1/solve/0/result.dat"), "1\n");
    let r = sb.mesh(&["run", "farm.toml", "--out", "e2", "--json"]);
    assert_eq!(r.json()["counts"]["cached"], 3);
    assert_eq!(sb.read("e2/solve/0/result.dat"), "1\n");
}

/// Four tasks, each writing its index after a pause, collected.
const FOUR: &str = r#"
[farm]
name = "four"

[[stage]]
name = "t"
sweep.i = { range = "0..3" }
workdir = "w/{stage}/{index}"
shell = "sleep 0.2; echo {i} > o.txt"
outputs = ["o.txt"]
"#;

/// Each task writes where its farm shows it `{out}` (a folder named by
/// the farm's id), pauses, and reads it back: in a workdir two farms share,
/// another farm's task writing meanwhile is seen.
const OWN: &str = r#"
[farm]
name = "own"

[[stage]]
name = "t"
sweep.i = { range = "0..3" }
workdir = "w/{stage}/{index}"
shell = "echo {out} > o.txt; sleep 0.2; cat o.txt > p.txt"
outputs = ["p.txt"]
"#;

#[test]
fn parallel_submissions_of_one_file_are_each_their_own_farm_with_all_their_outputs() {
    let sb = sandbox();
    sb.mesh(&["init"]).expect_code(0);
    sb.write("farm.toml", OWN);
    let node = mesh_tests::NodeProc::start(
        std::path::Path::new(env!("CARGO_BIN_EXE_mesh")),
        sb.path(),
        &sb.state(),
        // Room for every farm's task of an index at once.
        &[
            "node",
            "--listen",
            "/ip4/127.0.0.1/tcp/0",
            "--resources",
            "cpu=8",
        ],
    );
    let subs: Vec<_> = (0..8)
        .map(|k| sb.spawn(&["submit", "farm.toml", "--out", &format!("out{k}"), "--wait"]))
        .collect();
    let mut ids = std::collections::HashSet::new();
    for (k, s) in subs.into_iter().enumerate() {
        let r = s.wait();
        r.expect_code(0);
        let id = r.stdout.lines().next().unwrap_or_default().to_string();
        // `own-1a2b3c4d`: the start of the farm's id, which names its folder.
        let hex = id.rsplit('-').next().unwrap_or_default().to_string();
        for i in 0..4 {
            let p = sb.read(&format!("out{k}/t/{i}/p.txt"));
            assert!(
                p.contains(&format!("/work/{hex}")),
                "out{k}/t/{i} is its own farm's ({id}), not another's: {p}"
            );
        }
        ids.insert(id);
    }
    assert_eq!(ids.len(), 8, "eight farms: {ids:?}");
    drop(node);
}

#[test]
fn the_quick_start_reaches_its_node_every_time_and_no_node_is_said_at_once() {
    let sb = sandbox();
    sb.mesh(&["init"]).expect_code(0);
    sb.write("farm.toml", FOUR);
    // No node at all: said at once, not after waiting for one.
    let asked = Instant::now();
    let r = sb.mesh(&["submit", "farm.toml"]);
    r.expect_code(2);
    assert!(r.stderr.contains("no mesh node is running"), "{}", r.stderr);
    assert!(
        asked.elapsed() < Duration::from_secs(5),
        "{:?}",
        asked.elapsed()
    );
    // README's `mesh node ... &` then `mesh submit --wait` at once.
    for i in 0..20 {
        let node = sb.spawn(&["node", "--listen", "/ip4/127.0.0.1/tcp/0"]);
        let r = sb.mesh(&["submit", "farm.toml", "--wait"]);
        node.signal(Signal::SIGTERM);
        let _ = node.wait();
        assert_eq!(r.code, Some(0), "try {i}: {}", r.stderr);
    }
}

/// A parameter a line, a gather of them all, and a check per parameter.
const BY_VALUE: &str = r#"
[farm]
name = "byvalue"

[[stage]]
name = "a"
sweep.x = { lines = "params.txt" }
workdir = "w/{stage}/{index}"
shell = "echo {x} > r.txt"
outputs = ["r.txt"]

[[stage]]
name = "check"
after_each = ["a"]
workdir = "w/{stage}/{index}"
shell = "cat {out}/a/{index}/r.txt > c.txt"
outputs = ["c.txt"]

[[stage]]
name = "gather"
after = ["a"]
workdir = "w/{stage}"
shell = "cat {out}/a/*/r.txt | sort -n | tr '\\n' ' ' > all.txt"
outputs = ["all.txt"]
"#;

fn counts(r: &mesh_tests::Run) -> (u64, u64) {
    let j = r.json();
    (
        j["counts"]["done"].as_u64().expect("done"),
        j["counts"]["cached"].as_u64().expect("cached"),
    )
}

#[test]
fn a_task_is_known_by_its_values_so_a_deleted_line_or_a_moved_stage_reruns_only_what_changed() {
    let sb = sandbox();
    sb.write("farm.toml", BY_VALUE);
    let lines: Vec<String> = (1..=20).map(|i| format!("{i}\n")).collect();
    sb.write("params.txt", &lines.concat());
    let run = || {
        let r = sb.mesh(&["run", "farm.toml", "--json"]);
        r.expect_code(0);
        counts(&r)
    };
    assert_eq!(run(), (41, 0));
    // The first line deleted: 19 values unchanged, each `a` and `check`
    // reused where its value now is; only the gather reads something new.
    sb.write("params.txt", &lines[1..].concat());
    assert_eq!(run(), (39, 38));
    for i in 0..19 {
        assert_eq!(
            sb.read(&format!("mesh-out/byvalue/a/{i}/r.txt")),
            format!("{}\n", i + 2)
        );
        assert_eq!(
            sb.read(&format!("mesh-out/byvalue/check/{i}/c.txt")),
            format!("{}\n", i + 2)
        );
    }
    let all: Vec<String> = (2..=20).map(|i| format!("{i} ")).collect();
    assert_eq!(sb.read("mesh-out/byvalue/gather/0/all.txt"), all.concat());
    // A line inserted at the top: every other task moves up one index,
    // each taking its earlier result with it.
    sb.write("params.txt", &format!("0\n{}", lines[1..].concat()));
    assert_eq!(run(), (41, 38));
    for i in 1..20 {
        assert_eq!(
            sb.read(&format!("mesh-out/byvalue/a/{i}/r.txt")),
            format!("{}\n", i + 1)
        );
        assert_eq!(
            sb.read(&format!("mesh-out/byvalue/check/{i}/c.txt")),
            format!("{}\n", i + 1)
        );
    }
    assert_eq!(sb.read("mesh-out/byvalue/a/0/r.txt"), "0\n");
    // Stages moved, and one added above them: nothing of theirs runs.
    let moved = BY_VALUE.replace("[farm]\nname = \"byvalue\"\n", "");
    let (head, a_stage) = moved.split_at(moved.find("[[stage]]\nname = \"check\"").unwrap());
    let reordered = format!(
        "[farm]\nname = \"byvalue\"\n\n[[stage]]\nname = \"new\"\nshell = \"true\"\n\n{a_stage}\n{head}"
    );
    sb.write("farm.toml", &reordered);
    assert_eq!(run(), (42, 41), "only the new stage runs");
}

#[test]
fn on_a_mesh_too_a_deleted_or_inserted_line_reruns_only_what_changed() {
    let sb = sandbox();
    let c = Cluster::start(&sb, &["cpu=2"; 2], &[]);
    sb.write("farm/farm.toml", BY_VALUE);
    let lines: Vec<String> = (1..=20).map(|i| format!("{i}\n")).collect();
    sb.write("farm/params.txt", &lines.concat());
    let out = sb.path().join("out").to_string_lossy().to_string();
    let submit = || -> u64 {
        let r = c.mesh(
            0,
            &[
                "submit",
                "farm/farm.toml",
                "--out",
                &out,
                "--wait",
                "--json",
            ],
        );
        r.expect_code(0);
        // The farm's id, then its end: the last of the JSON values.
        let v = serde_json::Deserializer::from_str(&r.stdout)
            .into_iter::<serde_json::Value>()
            .filter_map(Result::ok)
            .last()
            .unwrap_or_else(|| panic!("no JSON: {}", r.stdout));
        v["counts"]["cached"]
            .as_u64()
            .unwrap_or_else(|| panic!("counts.cached: {v}"))
    };
    assert_eq!(submit(), 0);
    sb.write("farm/params.txt", &lines[1..].concat());
    assert_eq!(
        submit(),
        38,
        "19 a and 19 check reused where their values are now"
    );
    sb.write("farm/params.txt", &format!("0\n{}", lines[1..].concat()));
    assert_eq!(submit(), 38, "the same after a line inserted at the top");
    for i in 1..20 {
        assert_eq!(sb.read(&format!("out/a/{i}/r.txt")), format!("{}\n", i + 1));
        assert_eq!(
            sb.read(&format!("out/check/{i}/c.txt")),
            format!("{}\n", i + 1)
        );
    }
    let all: Vec<String> = (0..=20)
        .filter(|i| *i != 1)
        .map(|i| format!("{i} "))
        .collect();
    assert_eq!(sb.read("out/gather/0/all.txt"), all.concat());
}

/// The oracle's seed 36 on three nodes: a stage shrunk by a line, a task of
/// another moved to a new index and reused there, and dependents off the
/// home that fetch its outputs from the home.
fn seed36(order: &[&str], bump: bool) -> String {
    let probe = |ids: &str, pre: &str| {
        format!(
            "{pre}echo '{{stage}} {ids}' > id.txt; (cd {{out}} && find . -name id.txt | LC_ALL=C sort | while read f; do echo \"$f $(cat $f)\"; done) > seen.txt"
        )
    };
    let stage = |name: &str| -> String {
        let (sweep, after, shell) = match name {
            "s1" => (
                "sweep.v = { lines = \"p0.txt\" }",
                "after = [\"s0\"]",
                probe("v={v}", ""),
            ),
            "s2" => (
                "sweep.w = { lines = \"p1.txt\" }",
                "after = [\"s0\"]",
                probe("w={w}", ""),
            ),
            "s3" => (
                "sweep.w = { range = \"1..1\" }\nsweep.v = { lines = \"p1.txt\" }",
                "after = [\"s1\", { stage = \"s2\", by = [\"w\"] }]",
                probe("w={w} v={v}", ""),
            ),
            _ => (
                "sweep.w = { list = [\"a\", \"3\"] }\nsweep.u = { range = \"1..2\" }",
                "",
                probe("w={w} u={u}", if bump { ": v1; " } else { "" }),
            ),
        };
        format!(
            "[[stage]]\nname = \"{name}\"\n{sweep}\n{after}\nworkdir = \"w/{{stage}}/{{index}}\"\noutputs = [\"id.txt\", \"seen.txt\"]\nshell = '''{shell}'''\n"
        )
    };
    let stages: Vec<String> = order.iter().map(|s| stage(s)).collect();
    format!("[farm]\nname = \"orc36\"\n\n{}", stages.join("\n"))
}

#[test]
fn a_task_moved_to_a_new_index_serves_its_outputs_to_dependents_off_the_home() {
    let sb = sandbox();
    let c = Cluster::start(&sb, &["cpu=2"; 3], &[]);
    sb.write("farm/p0.txt", "b\n2\nc\n1\nc\n");
    sb.write("farm/p1.txt", "2\nb\n2\n1\n");
    let out = sb.path().join("out").to_string_lossy().to_string();
    let submit = || {
        c.mesh(0, &["submit", "farm/farm.toml", "--out", &out, "--wait"])
            .expect_code(0);
    };
    sb.write("farm/farm.toml", &seed36(&["s0", "s1", "s2", "s3"], false));
    submit();
    sb.write("farm/farm.toml", &seed36(&["s1", "s2", "s3", "s0"], false));
    submit();
    sb.write("farm/farm.toml", &seed36(&["s1", "s2", "s3", "s0"], true));
    submit();
    sb.write("farm/p0.txt", "b\nc\n1\nc\n");
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(sb.path().join("out/s3/0/id.txt"))
        .unwrap();
    std::io::Write::write_all(&mut f, b"x\n").unwrap();
    drop(f);
    // Once, its dependents waited for ever for a file served from the
    // folder the task had left.
    submit();
    for (i, v) in ["b", "c", "1", "c"].iter().enumerate() {
        assert_eq!(
            sb.read(&format!("out/s1/{i}/id.txt")),
            format!("s1 v={v}\n")
        );
    }
    let seen = sb.read("out/s3/0/seen.txt");
    assert_eq!(
        seen.lines().filter(|l| l.contains("./s1/")).count(),
        4,
        "{seen}"
    );
}

#[test]
fn on_a_mesh_a_folder_set_aside_is_still_its_result_when_the_value_comes_back() {
    let sb = sandbox();
    let c = Cluster::start(&sb, &["cpu=2"], &[]);
    sb.write(
        "farm/farm.toml",
        "[farm]\nname = \"back\"\n[[stage]]\nname = \"s1\"\nsweep.u = { lines = \"p0.txt\" }\nworkdir = \"w/{stage}/{index}\"\nshell = \"echo {u} > r.txt\"\noutputs = [\"r.txt\"]\n",
    );
    let submit = |out: &str| -> String {
        let out = sb.path().join(out).to_string_lossy().to_string();
        let r = c.mesh(0, &["submit", "farm/farm.toml", "--out", &out, "--wait"]);
        r.expect_code(0);
        r.stderr
    };
    sb.write("farm/p0.txt", "c\nb\n3\n");
    submit("o0");
    sb.write("farm/p0.txt", "c\nb\n");
    assert!(submit("o0").contains("moved the outputs of 1 task no longer in the farm"));
    // `3` is back, first: its result is the one set aside in o0.
    sb.write("farm/p0.txt", "3\nb\n");
    let said = submit("o1");
    assert!(said.contains("(2 reused"), "{said}");
    assert_eq!(sb.read("o1/s1/0/r.txt"), "3\n");
}
