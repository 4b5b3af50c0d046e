//! `mesh export`: a farm of four stages run on a two-node mesh, and each of the six real WfCommons traces imported and run with `mesh run`, written as traces that WfFormat's own JSON schema accepts, with the farm's exact edges, runs that took at least their tasks' sleeps, the machines, the files at their sizes; `mesh import wfformat` of an export gives back the same graph; an unknown farm is an error.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, SystemTime};

use mesh_node::farmfile::{self, LoadOptions};
use mesh_protocol::farm::TaskRef;
use mesh_tests::{Cluster, Sandbox};
use serde_json::Value;

use crate::import::{import, recorded, tasks_by_id, traces, TRACES};
use crate::sandbox;

/// Four stages, each kind of dependency: `check` pairs with `make`
/// (after_each), `pair` names its `make` tasks (listed), `merge` waits for
/// every task of both (after). `make` reads a staged input.
const CHAIN: &str = r#"
[farm]
name = "chain"

[[stage]]
name = "make"
sweep.i = { range = "0..3" }
workdir = "w/make/{i}"
inputs = ["data/seed.txt"]
shell = 'cat data/seed.txt > /dev/null; sleep 0.4; head -c $(( ({i} + 1) * 100 )) /dev/zero > part.dat'
outputs = ["part.dat"]

[[stage]]
name = "check"
after_each = "make"
shell = 'sleep 0.2'

[[stage]]
name = "pair"
sweep.p = { list = ["0 1", "2 3", "1 3"] }
after = [{ stage = "make", tasks = "{p}" }]
shell = 'sleep 0.2'

[[stage]]
name = "merge"
after = ["make", "pair"]
workdir = "w/merge"
shell = 'sleep 0.3; cat {out}/make/*/part.dat > all.dat'
outputs = ["all.dat"]
"#;

/// The seed's size: the input the farm staged.
const SEED_BYTES: usize = 1234;

/// WfFormat's schema, from ../shared/workflows (`None`, said, without it).
pub(crate) fn schema() -> Option<jsonschema::Validator> {
    let dir = traces()?;
    let text = std::fs::read_to_string(dir.join("wfcommons-schema.json")).expect("read schema");
    let schema: Value = serde_json::from_str(&text).expect("the schema is JSON");
    Some(
        jsonschema::options()
            .should_validate_formats(true)
            .build(&schema)
            .expect("WfFormat's schema compiles"),
    )
}

pub(crate) fn assert_valid(v: &jsonschema::Validator, trace: &Value, what: &str) {
    let errors: Vec<String> = v
        .iter_errors(trace)
        .take(10)
        .map(|e| format!("{e} (at {})", e.instance_path()))
        .collect();
    assert!(errors.is_empty(), "{what}: not valid WfFormat: {errors:#?}");
}

/// Per task id: its parents' ids, from `workflow.specification`, checked
/// against the children each task lists.
fn graph(trace: &Value) -> BTreeMap<String, BTreeSet<String>> {
    let tasks = trace["workflow"]["specification"]["tasks"]
        .as_array()
        .expect("tasks");
    let strs = |v: &Value| -> BTreeSet<String> {
        v.as_array()
            .expect("a list")
            .iter()
            .map(|s| s.as_str().expect("an id").to_string())
            .collect()
    };
    let parents: BTreeMap<String, BTreeSet<String>> = tasks
        .iter()
        .map(|t| (t["id"].as_str().unwrap().to_string(), strs(&t["parents"])))
        .collect();
    assert_eq!(parents.len(), tasks.len(), "task ids are unique");
    let mut from_children: BTreeMap<String, BTreeSet<String>> = parents
        .keys()
        .map(|k| (k.clone(), BTreeSet::new()))
        .collect();
    for t in tasks {
        for c in strs(&t["children"]) {
            from_children
                .get_mut(&c)
                .expect("a child is a task")
                .insert(t["id"].as_str().unwrap().to_string());
        }
    }
    assert_eq!(parents, from_children, "parents and children agree");
    parents
}

fn edges(g: &BTreeMap<String, BTreeSet<String>>) -> usize {
    g.values().map(BTreeSet::len).sum()
}

/// Each task's recorded run in `workflow.execution`, by id.
fn runs(trace: &Value) -> HashMap<String, Value> {
    trace["workflow"]["execution"]["tasks"]
        .as_array()
        .map(|ts| {
            ts.iter()
                .map(|t| (t["id"].as_str().unwrap().to_string(), t.clone()))
                .collect()
        })
        .unwrap_or_default()
}

/// File sizes by id.
fn sizes(trace: &Value) -> HashMap<String, u64> {
    trace["workflow"]["specification"]["files"]
        .as_array()
        .expect("files")
        .iter()
        .map(|f| {
            (
                f["id"].as_str().unwrap().to_string(),
                f["sizeInBytes"].as_u64().unwrap(),
            )
        })
        .collect()
}

fn at(s: &Value) -> SystemTime {
    humantime::parse_rfc3339(s.as_str().expect("a time")).expect("RFC 3339")
}

/// `mesh import wfformat` of a trace written to `file`: the farm it makes,
/// loaded, and per task its `id` (the trace's) with the ids of its
/// dependencies as mesh's loader reads them.
fn imported_graph(sb: &Sandbox, file: &str, dir: &str) -> BTreeMap<String, BTreeSet<String>> {
    let v = import(sb, &sb.path().join(file), dir, &[]);
    let def = farmfile::load(
        &sb.path().join(dir).join("farm.toml"),
        &LoadOptions::default(),
    )
    .expect("the imported farm loads");
    let by_id = tasks_by_id(&def);
    let id_of: HashMap<TaskRef, &String> = by_id.iter().map(|(id, t)| (*t, id)).collect();
    let g: BTreeMap<String, BTreeSet<String>> = by_id
        .iter()
        .map(|(id, &t)| {
            let deps = (0..)
                .map_while(|n| def.dependency(t, n))
                .map(|d| id_of[&d].clone())
                .collect();
            (id.clone(), deps)
        })
        .collect();
    assert_eq!(v["edges"].as_u64().unwrap() as usize, edges(&g), "{v}");
    g
}

#[test]
fn a_farm_run_on_two_nodes_exports_as_a_valid_trace_with_its_edges_runs_machines_and_files() {
    let sb = sandbox();
    let validator = schema();
    let c = Cluster::start(&sb, &["cpu=2", "cpu=2"], &[]);
    let peers: BTreeSet<String> = c.nodes.iter().map(|n| n.peer_id()).collect();
    sb.write("farm/data/seed.txt", &"s".repeat(SEED_BYTES));
    sb.write("farm/farm.toml", CHAIN);
    let out = sb.path().join("results");
    let r = c.mesh(
        0,
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

    // From the home to a file, and from the other node (which keeps a
    // copy of the farm's log) to standard output: the same trace.
    let r = c.mesh(0, &["export", &id, "-o", "chain.json"]);
    r.expect_code(0);
    assert!(
        r.stderr
            .contains("12 tasks (12 with a recorded run), 17 edges"),
        "{}",
        r.stderr
    );
    let trace: Value = serde_json::from_str(&sb.read("chain.json")).expect("JSON");
    let r = c.mesh(1, &["export", "chain"]);
    r.expect_code(0);
    let other: Value = serde_json::from_str(&r.stdout).expect("JSON on stdout");
    if let Some(v) = &validator {
        for t in [&trace, &other] {
            assert_valid(v, t, "the export");
        }
        // The validator is no rubber stamp: an id WfFormat does not allow
        // in a parent, another version, a machine with no name fail...
        let mut bad = trace.clone();
        bad["workflow"]["specification"]["tasks"][4]["parents"][0] = "make/0".into();
        assert!(!v.is_valid(&bad));
        let mut bad = trace.clone();
        bad["schemaVersion"] = "1.4".into();
        assert!(!v.is_valid(&bad));
        let mut bad = trace.clone();
        bad["workflow"]["execution"]["machines"][0]["nodeName"] = "".into();
        assert!(!v.is_valid(&bad));
        // ... and a `-`, which stage names may have, is allowed.
        let mut good = trace.clone();
        good["workflow"]["specification"]["tasks"][4]["parents"][0] = "make-x.0".into();
        assert_valid(v, &good, "an id with a dash");
    }
    assert_eq!(
        trace["workflow"]["specification"],
        other["workflow"]["specification"]
    );
    assert_eq!(trace["schemaVersion"], "1.5");
    assert_eq!(trace["name"], "chain");
    assert_eq!(trace["runtimeSystem"]["name"], "mesh");

    // Exactly the farm's edges.
    let g = graph(&trace);
    let want: BTreeMap<String, BTreeSet<String>> = [
        ("make.0", vec![]),
        ("make.1", vec![]),
        ("make.2", vec![]),
        ("make.3", vec![]),
        ("check.0", vec!["make.0"]),
        ("check.1", vec!["make.1"]),
        ("check.2", vec!["make.2"]),
        ("check.3", vec!["make.3"]),
        ("pair.0", vec!["make.0", "make.1"]),
        ("pair.1", vec!["make.2", "make.3"]),
        ("pair.2", vec!["make.1", "make.3"]),
        (
            "merge.0",
            vec![
                "make.0", "make.1", "make.2", "make.3", "pair.0", "pair.1", "pair.2",
            ],
        ),
    ]
    .into_iter()
    .map(|(t, ps)| (t.to_string(), ps.into_iter().map(String::from).collect()))
    .collect();
    assert_eq!(g, want);
    let spec = trace["workflow"]["specification"]["tasks"]
        .as_array()
        .unwrap();
    for t in spec {
        let id = t["id"].as_str().unwrap();
        let stage = id.split('.').next().unwrap();
        assert_eq!(t["category"], stage, "the stage is the kind: {t}");
        assert_eq!(t["name"], id.replace('.', "/"), "{t}");
    }

    // Each run: at least its sleep, after its parents ended, on a node of
    // the mesh, asking one core.
    let ran = runs(&trace);
    assert_eq!(ran.len(), 12);
    let sleeps = [("make", 0.4), ("check", 0.2), ("pair", 0.2), ("merge", 0.3)];
    let slack = Duration::from_millis(5);
    for (task, e) in &ran {
        let stage = task.split('.').next().unwrap();
        let sleep = sleeps.iter().find(|(s, _)| *s == stage).unwrap().1;
        let secs = e["runtimeInSeconds"].as_f64().unwrap();
        assert!(secs >= sleep, "{task} ran {secs} s, slept {sleep} s");
        let (start, end) = (at(&e["executedAt"]), at(&e["endedAt"]));
        let took = end.duration_since(start).unwrap().as_secs_f64();
        assert!((took - secs).abs() < 0.002, "{e}");
        for p in &g[task] {
            let parent_end = at(&ran[p]["endedAt"]);
            assert!(
                start + slack >= parent_end,
                "{task} started before {p} ended"
            );
        }
        let machine = e["machines"][0].as_str().unwrap();
        assert!(peers.contains(machine), "{machine} is no node of {peers:?}");
        assert_eq!(e["exitCode"], 0);
        assert_eq!(e["coreCount"], 1.0);
        assert_eq!(e["command"]["program"], "/bin/sh");
        assert_eq!(e["command"]["arguments"][0], "-c");
    }
    let exec = &trace["workflow"]["execution"];
    let makespan = exec["makespanInSeconds"].as_f64().unwrap();
    assert!(makespan >= 0.4 + 0.2 + 0.3, "the critical path: {makespan}");
    let first = ran.values().map(|e| at(&e["executedAt"])).min().unwrap();
    assert_eq!(at(&exec["executedAt"]), first);

    // The machines that ran tasks, with the cores they offered.
    let machines = exec["machines"].as_array().unwrap();
    let used: BTreeSet<&str> = ran
        .values()
        .map(|e| e["machines"][0].as_str().unwrap())
        .collect();
    let listed: BTreeSet<&str> = machines
        .iter()
        .map(|m| m["nodeName"].as_str().unwrap())
        .collect();
    assert_eq!(listed, used);
    for m in machines {
        assert_eq!(m["cpu"]["coreCount"], 2, "{m}");
        assert!(m["memoryInBytes"].as_u64().unwrap() > 0, "{m}");
    }

    // Files: the staged input and every output, at their sizes, linked.
    let files = sizes(&trace);
    assert_eq!(files["data/seed.txt"], SEED_BYTES as u64);
    for i in 0..4u64 {
        assert_eq!(files[&format!("make/{i}/part.dat")], (i + 1) * 100);
    }
    assert_eq!(files["merge/0/all.dat"], 1000);
    assert_eq!(files.len(), 6);
    let task = |id: &str| spec.iter().find(|t| t["id"] == id).unwrap().clone();
    assert_eq!(
        task("make.2")["inputFiles"],
        serde_json::json!(["data/seed.txt"])
    );
    assert_eq!(
        task("make.2")["outputFiles"],
        serde_json::json!(["make/2/part.dat"])
    );
    assert_eq!(
        task("pair.2")["inputFiles"],
        serde_json::json!(["make/1/part.dat", "make/3/part.dat"])
    );
    assert_eq!(
        task("merge.0")["outputFiles"],
        serde_json::json!(["merge/0/all.dat"])
    );

    // `mesh import wfformat` of the export: the same tasks and edges, the
    // stages named as before.
    let back = imported_graph(&sb, "chain.json", "again");
    assert_eq!(back, want);
    let farm = sb.read("again/farm.toml");
    for s in ["make", "check", "pair", "merge"] {
        assert!(farm.contains(&format!("name = \"{s}\"")), "{farm}");
    }

    // The same farm again: every result reused, no task runs. Its tasks,
    // edges and files are there; no run is made up.
    let r = c.mesh(
        0,
        &[
            "submit",
            "farm/farm.toml",
            "--out",
            &out.to_string_lossy(),
            "--wait",
        ],
    );
    r.expect_code(0);
    let again = r.stdout.lines().next().unwrap().to_string();
    assert_ne!(again, id);
    let r = c.mesh(0, &["export", &again]);
    r.expect_code(0);
    let reused: Value = serde_json::from_str(&r.stdout).expect("JSON on stdout");
    if let Some(v) = &validator {
        assert_valid(v, &reused, "the export of a farm that ran nothing");
    }
    assert_eq!(graph(&reused), want);
    assert!(
        reused["workflow"].get("execution").is_none(),
        "nothing ran: {}",
        reused["workflow"]
    );
    assert_eq!(sizes(&reused), files);
    let said = reused["description"].as_str().unwrap();
    assert!(said.contains("12 done (12 of them reused"), "{said}");

    // A farm no node and no run of this machine knows.
    let r = c.mesh(0, &["export", "nosuch"]);
    r.expect_code(2);
    assert!(r.stderr.contains("no farm"), "{}", r.stderr);
    assert!(r.stderr.contains("nosuch"), "{}", r.stderr);
}

#[test]
fn each_real_trace_imported_run_and_exported_is_valid_and_imports_back_to_the_traces_graph() {
    let Some(dir) = traces() else { return };
    let validator = schema().expect("the schema is beside the traces");
    let sb = sandbox();
    let size_scale = 1e-6;
    for (name, tasks, edge_count) in TRACES {
        let path = dir.join(format!("{name}.json"));
        import(
            &sb,
            &path,
            name,
            &["--time-scale", "0.0002", "--size-scale", "1e-6"],
        );
        sb.mesh(&[
            "run",
            &format!("{name}/farm.toml"),
            "--json",
            "--quiet",
            "--resources",
            "cpu=8,mem=64GiB",
        ])
        .expect_code(0);
        let file = format!("{name}.export.json");
        sb.mesh(&["export", name, "-o", &file]).expect_code(0);
        let trace: Value = serde_json::from_str(&sb.read(&file)).expect("JSON");
        assert_valid(&validator, &trace, name);

        // The export's tasks, by the id the trace gave each (the farm's
        // `id` variable): the trace's own edges.
        let def = farmfile::load(
            &sb.path().join(name).join("farm.toml"),
            &LoadOptions::default(),
        )
        .expect("the farm loads");
        let trace_id: HashMap<String, String> = tasks_by_id(&def)
            .into_iter()
            .map(|(id, t)| {
                (
                    format!("{}.{}", def.stages[t.stage as usize].name, t.index),
                    id,
                )
            })
            .collect();
        let g = graph(&trace);
        assert_eq!(g.len(), tasks, "{name}");
        assert_eq!(edges(&g), edge_count, "{name}");
        let rec = recorded(&path);
        for (t, ps) in &g {
            let mapped: BTreeSet<&String> = ps.iter().map(|p| &trace_id[p]).collect();
            let want: BTreeSet<&String> = rec.parents[&trace_id[t]].iter().collect();
            assert_eq!(mapped, want, "{name}: task {t} ({})", trace_id[t]);
        }

        // Every task ran here, on this machine, for a measured time; its
        // outputs at the sizes the import gave them.
        let ran = runs(&trace);
        assert_eq!(ran.len(), tasks, "{name}");
        let machines = trace["workflow"]["execution"]["machines"]
            .as_array()
            .unwrap();
        assert_eq!(machines.len(), 1, "{name}");
        assert_eq!(machines[0]["cpu"]["coreCount"], 8, "{name}");
        let files = sizes(&trace);
        for t in trace["workflow"]["specification"]["tasks"]
            .as_array()
            .unwrap()
        {
            let id = t["id"].as_str().unwrap();
            assert!(ran[id]["runtimeInSeconds"].as_f64().unwrap() >= 0.0);
            let mut got: Vec<u64> = t["outputFiles"]
                .as_array()
                .unwrap()
                .iter()
                .map(|f| files[f.as_str().unwrap()])
                .collect();
            let mut want: Vec<u64> = rec.outputs[&trace_id[id]]
                .iter()
                .map(|&b| (b as f64 * size_scale).round() as u64)
                .collect();
            got.sort_unstable();
            want.sort_unstable();
            assert_eq!(got, want, "{name}: outputs of {id}");
        }

        // And back: the export imported is the export's graph.
        let back = imported_graph(&sb, &file, &format!("{name}-again"));
        assert_eq!(back, g, "{name}: the round trip");
    }
}
