//! `mesh sim --workflow` on the six real WfCommons traces in ../shared/workflows: each replays on 4 nodes between its critical path and its serial sum, more nodes are never faster than the critical path, the same flags and seed give the same report, skipping idle timers or stepping them the same answer, a deadline finds the fewest nodes, the plot is drawn; a bad trace exits 2 naming the task and field, with nothing simulated.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use crate::sandbox;

const TRACES: [&str; 6] = [
    "1000genome-chameleon-4ch-100k-001",
    "epigenomics-chameleon-hep-3seq-50k-001",
    "montage-chameleon-dss-05d-001",
    "soykb-chameleon-10fastq-10ch-001",
    "sarek-dirt02-001",
    "blast-chameleon-small-001",
];

/// ../shared/workflows from the project's root, when this checkout has it.
fn traces() -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/workflows");
    if dir.join(format!("{}.json", TRACES[0])).is_file() {
        Some(dir)
    } else {
        eprintln!(
            "skipped: the WfCommons traces are not at {} (../shared/workflows from the project's root)",
            dir.display()
        );
        None
    }
}

/// The trace's critical path and summed runtime in ms, read here on its
/// own (schema 1.5: `parents` and `children` united, runtimes joined on id).
fn recorded(path: &Path) -> (u64, u64, usize) {
    let v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let spec = v["workflow"]["specification"]["tasks"].as_array().unwrap();
    let runtime: HashMap<&str, f64> = v["workflow"]["execution"]["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["id"].as_str().unwrap(),
                t["runtimeInSeconds"].as_f64().unwrap_or(0.0),
            )
        })
        .collect();
    let mut parents: HashMap<&str, Vec<&str>> = HashMap::new();
    for t in spec {
        let id = t["id"].as_str().unwrap();
        parents.entry(id).or_default();
        for p in t["parents"].as_array().unwrap() {
            parents.entry(id).or_default().push(p.as_str().unwrap());
        }
        for c in t["children"].as_array().unwrap() {
            parents.entry(c.as_str().unwrap()).or_default().push(id);
        }
    }
    fn finish<'a>(
        id: &'a str,
        parents: &HashMap<&'a str, Vec<&'a str>>,
        runtime: &HashMap<&str, f64>,
        memo: &mut HashMap<&'a str, f64>,
    ) -> f64 {
        if let Some(&f) = memo.get(id) {
            return f;
        }
        let start = parents[id]
            .iter()
            .map(|p| finish(p, parents, runtime, memo))
            .fold(0.0, f64::max);
        let f = start + runtime.get(id).copied().unwrap_or(0.0);
        memo.insert(id, f);
        f
    }
    let mut memo = HashMap::new();
    let cp = parents
        .keys()
        .map(|id| finish(id, &parents, &runtime, &mut memo))
        .fold(0.0, f64::max);
    let sum: f64 = runtime.values().sum();
    (
        (cp * 1000.0).round() as u64,
        (sum * 1000.0).round() as u64,
        spec.len(),
    )
}

#[test]
fn each_real_trace_replays_on_four_nodes_between_its_critical_path_and_serial_sum() {
    let Some(dir) = traces() else { return };
    let sb = sandbox();
    for name in TRACES {
        let path = dir.join(format!("{name}.json"));
        let (cp, sum, tasks) = recorded(&path);
        for scale in [1.0, 0.5] {
            let r = sb.mesh(&[
                "sim",
                "--workflow",
                &path.to_string_lossy(),
                "--nodes",
                "4",
                "--time-scale",
                &scale.to_string(),
                "--json",
            ]);
            r.expect_code(0);
            let v = r.json();
            assert_eq!(v["workflow"]["tasks"], tasks, "{name}");
            let row = &v["rows"][0];
            assert_eq!(row["nodes"], 4);
            assert_eq!(row["runs"][0]["tasks_done"], tasks, "{name}");
            let makespan = row["makespan_p50_ms"].as_u64().unwrap();
            let (cp, sum) = (cp as f64 * scale, sum as f64 * scale);
            // Rounding each runtime to a virtual ms may shorten the
            // chain by a ms a task.
            assert!(
                makespan as f64 >= cp - tasks as f64,
                "{name} x {scale}: makespan {makespan} ms under the critical path {cp}"
            );
            assert!(
                (makespan as f64) <= sum,
                "{name} x {scale}: makespan {makespan} ms over the serial sum {sum}"
            );
        }
    }
}

#[test]
fn more_nodes_are_never_faster_than_the_critical_path() {
    let Some(dir) = traces() else { return };
    let sb = sandbox();
    let path = dir.join("epigenomics-chameleon-hep-3seq-50k-001.json");
    let (cp, ..) = recorded(&path);
    let r = sb.mesh(&[
        "sim",
        "--workflow",
        &path.to_string_lossy(),
        "--nodes",
        "1,4,16,64",
        "--json",
    ]);
    r.expect_code(0);
    let rows = r.json()["rows"].as_array().unwrap().clone();
    let makespans: Vec<u64> = rows
        .iter()
        .map(|r| r["makespan_p50_ms"].as_u64().unwrap())
        .collect();
    for (row, &m) in rows.iter().zip(&makespans) {
        assert!(m + 1000 >= cp, "{row}");
        let share = row["critical_share"].as_f64().unwrap();
        assert!(share > 0.0 && share <= 1.01, "{row}");
        let hours = row["node_hours"].as_f64().unwrap();
        let n = row["nodes"].as_f64().unwrap();
        assert!((hours - n * m as f64 / 3.6e6).abs() < 1e-6, "{row}");
    }
    // A wide graph (445 tasks): 16 nodes well under 1, 64 no slower than
    // 16 by more than the noise of placement.
    assert!(makespans[2] * 3 < makespans[0], "{makespans:?}");
    assert!(
        makespans[3] <= makespans[2] + makespans[2] / 10,
        "{makespans:?}"
    );
    // The table for people: a header and a row per count.
    let r = sb.mesh(&[
        "sim",
        "--workflow",
        &path.to_string_lossy(),
        "--nodes",
        "4,8",
    ]);
    r.expect_code(0);
    assert!(r.stdout.contains("critical share"), "{}", r.stdout);
    let rows: Vec<&str> = r
        .stdout
        .lines()
        .filter(|l| l.trim_start().starts_with("4 ") || l.trim_start().starts_with("8 "))
        .collect();
    assert_eq!(rows.len(), 2, "{}", r.stdout);
}

#[test]
fn each_real_trace_gives_the_same_answer_skipped_or_stepped() {
    // `--step` wakes every simulated node for every periodic timer, even
    // those that do nothing; skipping those (the default) must not move
    // a single number of the answer.
    let Some(dir) = traces() else { return };
    let sb = sandbox();
    for name in TRACES {
        let path = dir.join(format!("{name}.json"));
        let path = path.to_string_lossy();
        let run = |step: bool| {
            let mut a = vec!["sim", "--workflow", &path, "--nodes", "4,16", "--json"];
            if step {
                a.push("--step");
            }
            let r = sb.mesh(&a);
            r.expect_code(0);
            r.stdout
        };
        let skipped = run(false);
        assert!(skipped.contains("makespan_p50_ms"), "{name}: {skipped}");
        assert_eq!(skipped, run(true), "{name}: skipped and stepped differ");
    }
}

#[test]
fn the_same_trace_flags_and_seed_replay_the_same_report() {
    let Some(dir) = traces() else { return };
    let sb = sandbox();
    let path = dir.join("montage-chameleon-dss-05d-001.json");
    let args = |seed: &str| {
        vec![
            "sim".to_string(),
            "--workflow".into(),
            path.to_string_lossy().into_owned(),
            "--nodes".into(),
            "4,8".into(),
            "--repeat".into(),
            "5".into(),
            "--jitter".into(),
            "0.2".into(),
            "--seed".into(),
            seed.into(),
            "--json".into(),
        ]
    };
    let run = |seed: &str| {
        let a = args(seed);
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        let r = sb.mesh(&a);
        r.expect_code(0);
        assert!(
            r.stderr.starts_with(&format!("mesh sim: seed {seed}")),
            "{}",
            r.stderr
        );
        r.stdout
    };
    let first = run("7");
    assert_eq!(first, run("7"), "same trace, flags and seed");
    let v: Value = serde_json::from_str(&first).unwrap();
    for row in v["rows"].as_array().unwrap() {
        let runs = row["runs"].as_array().unwrap();
        assert_eq!(runs.len(), 5);
        let seeds: Vec<u64> = runs.iter().map(|r| r["seed"].as_u64().unwrap()).collect();
        assert_eq!(seeds, vec![7, 8, 9, 10, 11]);
        assert!(row["makespan_p50_ms"].as_u64() <= row["makespan_p90_ms"].as_u64());
        let spread: Vec<u64> = runs
            .iter()
            .map(|r| r["makespan_ms"].as_u64().unwrap())
            .collect();
        assert!(
            spread.iter().any(|&m| m != spread[0]),
            "jitter spreads the makespans: {spread:?}"
        );
    }
    assert_ne!(first, run("8"), "another seed, other draws");
}

#[test]
fn a_deadline_finds_the_fewest_nodes_and_the_plot_is_drawn() {
    let Some(dir) = traces() else { return };
    let sb = sandbox();
    let path = dir.join("epigenomics-chameleon-hep-3seq-50k-001.json");
    let svg = sb.path().join("whatif.svg");
    let r = sb.mesh(&[
        "sim",
        "--workflow",
        &path.to_string_lossy(),
        "--deadline",
        "5m",
        "--plot",
        &svg.to_string_lossy(),
        "--json",
    ]);
    r.expect_code(0);
    let d = &r.json()["deadline"];
    let n = d["nodes"].as_u64().expect("5 minutes can be met") as usize;
    let tried = d["tried"].as_array().unwrap();
    let at = |k: usize| {
        tried
            .iter()
            .find(|r| r["nodes"] == k)
            .map(|r| r["makespan_p90_ms"].as_u64().unwrap())
    };
    assert!(at(n).unwrap() <= 300_000, "{d}");
    // The count below missed, or could not hold the work by then (and
    // then was not simulated, nor any under it).
    let least = d["least"].as_u64().expect("the bound is said") as usize;
    assert!(
        at(n - 1).is_some_and(|m| m > 300_000) || n - 1 < least,
        "{d}"
    );
    assert!(
        tried
            .iter()
            .all(|r| r["nodes"].as_u64().unwrap() as usize >= least),
        "{d}"
    );
    let picture = std::fs::read_to_string(&svg).unwrap();
    assert!(picture.starts_with("<svg"), "{}", &picture[..100]);
    for words in [
        "makespan against nodes",
        "utilization against nodes",
        "cores busy on each node",
    ] {
        assert!(picture.contains(words), "no `{words}` in the plot");
    }
    // Under the critical path (164 s): no count can meet it, nothing is
    // simulated, and the exit says so.
    let r = sb.mesh(&[
        "sim",
        "--workflow",
        &path.to_string_lossy(),
        "--deadline",
        "2m",
    ]);
    r.expect_code(1);
    assert!(r.stdout.contains("critical path alone"), "{}", r.stdout);
}

#[test]
fn a_bad_trace_exits_2_naming_the_task_and_field_and_nothing_is_simulated() {
    let sb = sandbox();
    let trace = |tasks: Value, b_runtime: f64, b_cores: f64| {
        json!({
            "name": "bad", "schemaVersion": "1.5",
            "workflow": {
                "specification": {"tasks": tasks, "files": []},
                "execution": {"makespanInSeconds": 1, "executedAt": "x", "tasks": [
                    {"id": "a", "runtimeInSeconds": 1.0},
                    {"id": "b", "runtimeInSeconds": b_runtime, "coreCount": b_cores},
                ]},
            }
        })
        .to_string()
    };
    let task = |id: &str, parents: &[&str]| json!({"name": id, "id": id, "parents": parents, "children": []});
    let good = || trace(json!([task("a", &[]), task("b", &["a"])]), 1.0, 1.0);
    let version = good().replace("\"1.5\"", "\"2.0\"");
    let cases = [
        (version, "field `schemaVersion`: unknown version `2.0`"),
        (
            trace(json!([task("a", &[]), task("b", &["ghost"])]), 1.0, 1.0),
            "task `b`, field `parents`: `ghost` is no task of the trace",
        ),
        (
            trace(json!([task("a", &["b"]), task("b", &["a"])]), 1.0, 1.0),
            "field `parents`: the dependencies form a cycle: a -> b -> a",
        ),
        (
            trace(json!([task("a", &[]), task("b", &["a"])]), -1.0, 1.0),
            "task `b`, field `runtimeInSeconds`: -1 is negative",
        ),
        (
            trace(json!([task("a", &[]), task("b", &["a"])]), 1.0, 8.0),
            "task `b`, field `coreCount`: 8 cores, more than a node has (4, --cores-per-node)",
        ),
    ];
    for (text, said) in cases {
        sb.write("bad.json", &text);
        let r = sb.mesh(&["sim", "--workflow", "bad.json", "--plot", "bad.svg"]);
        r.expect_code(2);
        assert!(r.stderr.contains(said), "wanted `{said}` in: {}", r.stderr);
        assert!(
            r.stderr.contains("bad.json"),
            "the file is named: {}",
            r.stderr
        );
        assert!(
            !r.stderr.contains("seed") && r.stdout.is_empty() && !sb.exists("bad.svg"),
            "nothing simulated: {} / {}",
            r.stdout,
            r.stderr
        );
    }
    sb.write("good.json", &good());
    let r = sb.mesh(&["sim", "--workflow", "good.json", "--nodes", "2", "--json"]);
    r.expect_code(0);
    let m = r.json()["rows"][0]["makespan_p50_ms"].as_u64().unwrap();
    assert!((2000..2100).contains(&m), "a then b, a second each: {m}");
}

#[test]
fn a_schema_1_4_trace_replays_too() {
    let sb = sandbox();
    let file =
        |name: &str, link: &str, size: u64| json!({"name": name, "link": link, "size": size});
    let text = json!({
        "name": "old", "schemaVersion": "1.4",
        "workflow": {"tasks": [
            {"name": "a", "parents": [], "children": ["b", "c"], "runtimeInSeconds": 10,
             "files": [file("x", "output", 250_000_000)]},
            {"name": "b", "parents": ["a"], "runtimeInSeconds": 20, "cores": 2,
             "files": [file("x", "input", 250_000_000)]},
            {"name": "c", "parents": ["a"], "runtimeInSeconds": 30,
             "files": [file("x", "input", 250_000_000)]},
        ]}
    })
    .to_string();
    sb.write("old.json", &text);
    let r = sb.mesh(&[
        "sim",
        "--workflow",
        "old.json",
        "--nodes",
        "1,2",
        "--cores-per-node",
        "2",
        "--json",
    ]);
    r.expect_code(0);
    let v = r.json();
    assert_eq!(v["workflow"]["schema"], "1.4");
    assert_eq!(v["workflow"]["critical_path_ms"], 40_000);
    let rows = v["rows"].as_array().unwrap();
    // One node of 2 cores: b (2 cores) and c run one after the other.
    let one = rows[0]["makespan_p50_ms"].as_u64().unwrap();
    assert!((60_000..60_100).contains(&one), "{one}");
    // Two nodes: b and c at once, and whichever runs away from a first
    // brings its 250 MB at 1 Gbit/s (2 s, and a round trip).
    let two = rows[1]["makespan_p50_ms"].as_u64().unwrap();
    assert!((40_000..=42_100).contains(&two), "{two}");
}

#[test]
fn a_scenario_with_an_allocation_queue_is_the_cluster() {
    let Some(dir) = traces() else { return };
    let sb = sandbox();
    let path = dir.join("epigenomics-chameleon-hep-3seq-50k-001.json");
    let scenario = format!(
        "{}/../sim/scenarios/cluster.toml",
        env!("CARGO_MANIFEST_DIR")
    );
    let r = sb.mesh(&[
        "sim",
        &scenario,
        "--workflow",
        &path.to_string_lossy(),
        "--json",
    ]);
    r.expect_code(0);
    let v = r.json();
    assert_eq!(v["cluster"]["alloc"], 1);
    let row = &v["rows"][0];
    assert_eq!(row["nodes"], 1, "the scenario's one node");
    assert_eq!(row["runs"][0]["tasks_done"], 445);
    assert!(
        row["runs"][0]["batch_node_hours"].as_f64().unwrap() > 0.0,
        "{row}"
    );
    // The scenario says what each node has.
    let r = sb.mesh(&[
        "sim",
        &scenario,
        "--workflow",
        &path.to_string_lossy(),
        "--cores-per-node",
        "8",
    ]);
    r.expect_code(2);
    assert!(r.stderr.contains("--cores-per-node"), "{}", r.stderr);
}

#[test]
fn a_farm_half_done_on_two_nodes_is_simulated_from_where_it_stands_to_within_a_tenth() {
    use mesh_tests::{wait_until, Cluster};
    use std::time::Duration;
    let sb = sandbox();
    let c = Cluster::start(&sb, &["cpu=2", "cpu=2"], &[]);
    // 8 tasks of 1 s, then 12 of 3 s on 4 slots: 2 s, then three rounds of 3 s.
    sb.write(
        "two.toml",
        r#"
[farm]
name = "two"

[[stage]]
name = "short"
sweep.i = { range = "0..7" }
shell = "sleep 1"

[[stage]]
name = "long"
after = ["short"]
sweep.i = { range = "0..11" }
shell = "sleep 3"
"#,
    );
    let started = c.mesh_start(0, &["submit", "two.toml", "--out", "two-out", "--wait"]);
    let done_of = |stage: &str| -> u64 {
        let r = c.mesh(0, &["status", "two", "--json"]);
        let v: Value = serde_json::from_str(&r.stdout).unwrap_or(json!({}));
        v["stages"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|s| s[0] == stage)
            .map_or(0, |s| s[1]["done"].as_u64().unwrap_or(0))
    };
    // Half done: the short stage and the first round of the long one.
    assert!(
        wait_until(Duration::from_secs(60), || done_of("long") >= 4),
        "the first round of the long stage did not end"
    );
    let r = c.mesh(0, &["sim", "--farm", "two", "--json"]);
    r.expect_code(0);
    let v = r.json();
    let farm = &v["farm"];
    assert_eq!(farm["nodes"], 2, "{v}");
    assert!(farm["done"].as_u64().unwrap() >= 12, "{v}");
    assert!(farm["stages_guessed"].as_array().unwrap().is_empty(), "{v}");
    let now = farm["now_ms"].as_u64().unwrap();
    let predicted = farm["rows"][0]["finish_p50_ms"].as_u64().unwrap();
    // The home's own quick estimate, as `mesh status` shows it, once it
    // has taken in the long stage's first round: its counts can be a few
    // ms ahead of the estimate that follows them (made off the loop).
    let eta_now = || {
        let status = c.mesh(0, &["status", "two", "--json"]);
        serde_json::from_str::<Value>(&status.stdout).unwrap_or(json!({}))["eta"].clone()
    };
    let mut eta = eta_now();
    assert!(
        wait_until(Duration::from_secs(10), || {
            eta = eta_now();
            eta["guessed"].as_array().is_some_and(|g| g.is_empty())
        }),
        "the estimate still guesses a stage 4 of whose tasks are done: {eta}"
    );
    let said = c.mesh(0, &["status", "two"]).stdout;
    started.wait().expect_code(0);
    // The real finish: the last task's end, as the farm's log has it.
    let r = c.mesh(0, &["export", "two"]);
    r.expect_code(0);
    let trace: Value = serde_json::from_str(&r.stdout).unwrap();
    let last = trace["workflow"]["execution"]["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["endedAt"].as_str())
        .map(|at| {
            humantime::parse_rfc3339(at)
                .unwrap()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_millis() as u64
        })
        .max()
        .unwrap();
    let real = last.saturating_sub(now);
    let off = (predicted as f64 - real as f64).abs() / real as f64;
    eprintln!("from half done: predicted {predicted} ms, took {real} ms");
    let (at, p50, p90) = (
        eta["at_ms"].as_u64().expect("an estimate while it ran"),
        eta["p50_ms"].as_u64().unwrap(),
        eta["p90_ms"].as_u64().unwrap(),
    );
    assert!(p50 <= p90, "{eta}");
    assert!(said.contains("ends in about"), "{said}");
    // Quick, and blind to when the running tasks started: looser than the
    // simulation of the real peers, and right in size.
    let left = last.saturating_sub(at) as f64;
    eprintln!("status: ends in {p50} ms (p90 {p90}), took {left} ms");
    assert!(
        (p50 as f64 - left).abs() <= 0.3 * left,
        "status estimated {p50} ms, took {left} ms: {eta}"
    );
    // Tasks like this farm's, twice as many, from a fresh start: both
    // stages scaled, and longer than the farm itself took.
    let r = c.mesh(0, &["sim", "--farm", "two", "--tasks", "40", "--json"]);
    r.expect_code(0);
    let twice = r.json();
    assert_eq!(twice["workflow"]["tasks"], 40, "{twice}");
    assert_eq!(twice["workflow"]["stages"], 2, "{twice}");
    assert!(twice["farm"].is_null(), "{twice}");
    let unknown = c.mesh(0, &["sim", "--farm", "no-such-farm"]);
    unknown.expect_code(2);
    assert!(
        unknown.stderr.contains("no-such-farm"),
        "{}",
        unknown.stderr
    );
    assert!(
        off <= 0.10,
        "predicted {predicted} ms from now, took {real} ms ({:.1}% off): {v}",
        off * 100.0
    );
}

#[test]
fn tasks_scale_a_traces_sweeps_in_proportion_and_keep_its_merges_single() {
    let Some(dir) = traces() else { return };
    let sb = sandbox();
    let path = dir.join("1000genome-chameleon-4ch-100k-001.json");
    let p = path.to_string_lossy();
    let base = &[
        "sim",
        "--workflow",
        &p,
        "--nodes",
        "4",
        "--time-scale",
        "0.01",
        "--json",
    ];
    let one = sb.mesh(base);
    one.expect_code(0);
    let one = one.json();
    let scaled = sb.mesh(&[&base[..], &["--tasks", "1000"]].concat());
    scaled.expect_code(0);
    let v = scaled.json();
    let (n, n0) = (
        v["workflow"]["tasks"].as_u64().unwrap(),
        one["workflow"]["tasks"].as_u64().unwrap(),
    );
    assert!((990..=1010).contains(&n), "{n} tasks");
    // The same stages; work in proportion to the tasks (runtimes drawn).
    assert_eq!(v["workflow"]["stages"], one["workflow"]["stages"]);
    let (w, w0) = (
        v["workflow"]["work_ms"].as_f64().unwrap(),
        one["workflow"]["work_ms"].as_f64().unwrap(),
    );
    let ratio = (w / w0) / (n as f64 / n0 as f64);
    assert!(
        (0.8..1.25).contains(&ratio),
        "work x{:.2} for tasks x{:.2}",
        w / w0,
        n as f64 / n0 as f64
    );
    // More work on the same nodes takes longer.
    assert!(
        v["rows"][0]["makespan_p50_ms"].as_u64() > one["rows"][0]["makespan_p50_ms"].as_u64(),
        "{v}"
    );
    // Seeded: the same again.
    let again = sb.mesh(&[&base[..], &["--tasks", "1000"]].concat()).json();
    assert_eq!(again["rows"], v["rows"]);
}

#[test]
fn asks_set_to_what_was_used_run_more_at_once_in_the_what_if() {
    use mesh_tests::Cluster;
    let sb = sandbox();
    let c = Cluster::start(&sb, &["cpu=4,mem=2GiB"], &[]);
    // Each task asks 1 GiB and holds a few MiB: two at once where four
    // cores could run four.
    sb.write(
        "asks.toml",
        r#"
[farm]
name = "asks"

[[stage]]
name = "work"
sweep.i = { range = "0..5" }
resources = { mem = "1GiB" }
shell = "sleep 1"
"#,
    );
    c.mesh(0, &["submit", "asks.toml", "--wait"]).expect_code(0);
    let sim = |extra: &[&str]| -> Value {
        let mut args = vec![
            "sim",
            "--farm",
            "asks",
            "--tasks",
            "24",
            "--nodes",
            "2",
            "--cores-per-node",
            "4",
            "--mem-per-node",
            "2GiB",
            "--json",
        ];
        args.extend_from_slice(extra);
        let r = c.mesh(0, &args);
        r.expect_code(0);
        r.json()
    };
    let makespan = |v: &Value| {
        v["rows"][0]["makespan_p50_ms"]
            .as_u64()
            .expect("a makespan")
    };
    let (asked, used) = (sim(&[]), sim(&["--asks-used"]));
    eprintln!(
        "24 tasks on 2 nodes: {} ms as asked, {} ms as used",
        makespan(&asked),
        makespan(&used)
    );
    // Six rounds of two at once a node as asked; three of four as used.
    assert!(
        (makespan(&used) as f64) < 0.7 * makespan(&asked) as f64,
        "as used {used}, as asked {asked}"
    );
    // The report says what the asks became.
    let r = c.mesh(0, &["sim", "--farm", "asks", "--asks-used", "--tasks", "8"]);
    r.expect_code(0);
    assert!(
        r.stdout
            .contains("memory asks set to what the tasks used: work ")
            && r.stdout.contains("MiB (asks 1.0 GiB)"),
        "{}",
        r.stdout
    );
}
