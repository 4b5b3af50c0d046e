//! `mesh import wfformat` on the six real WfCommons traces in ../shared/workflows: each becomes a farm with the trace's tasks and exactly its edges (compared task by task through mesh's own loader), `mesh check` accepts it, and `mesh run` runs every task with every output home; a bad trace exits 2, naming the task and field, and writes nothing.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use mesh_node::farmfile::{self, LoadOptions};
use mesh_protocol::farm::TaskRef;
use mesh_tests::Sandbox;
use serde_json::{json, Value};

use crate::sandbox;

/// The traces, with the tasks and edges their README counts.
pub(crate) const TRACES: [(&str, usize, usize); 6] = [
    ("1000genome-chameleon-4ch-100k-001", 104, 152),
    ("epigenomics-chameleon-hep-3seq-50k-001", 445, 550),
    ("montage-chameleon-dss-05d-001", 58, 114),
    ("soykb-chameleon-10fastq-10ch-001", 96, 194),
    ("sarek-dirt02-001", 26, 50),
    ("blast-chameleon-small-001", 43, 120),
];

/// ../shared/workflows from the project's root, when this checkout has it.
pub(crate) fn traces() -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/workflows");
    if dir.join(format!("{}.json", TRACES[0].0)).is_file() {
        Some(dir)
    } else {
        eprintln!(
            "skipped: the WfCommons traces are not at {} (../shared/workflows from the project's root)",
            dir.display()
        );
        None
    }
}

/// What the trace says, read here on its own (schema 1.5): per task id,
/// its parents' ids (`parents` and `children` united, as the importer
/// reads them) and its output files' sizes.
pub(crate) struct Recorded {
    pub(crate) ids: Vec<String>,
    pub(crate) parents: HashMap<String, HashSet<String>>,
    pub(crate) outputs: HashMap<String, Vec<u64>>,
}

pub(crate) fn recorded(path: &Path) -> Recorded {
    let v: Value = serde_json::from_str(&std::fs::read_to_string(path).expect("read trace"))
        .expect("trace is JSON");
    let spec = &v["workflow"]["specification"];
    let size: HashMap<&str, u64> = spec["files"]
        .as_array()
        .expect("files")
        .iter()
        .map(|f| {
            (
                f["id"].as_str().unwrap(),
                f["sizeInBytes"].as_u64().unwrap(),
            )
        })
        .collect();
    let mut r = Recorded {
        ids: Vec::new(),
        parents: HashMap::new(),
        outputs: HashMap::new(),
    };
    let strs = |v: &Value| -> Vec<String> {
        v.as_array()
            .map(|a| a.iter().map(|s| s.as_str().unwrap().to_string()).collect())
            .unwrap_or_default()
    };
    for t in spec["tasks"].as_array().expect("tasks") {
        let id = t["id"].as_str().unwrap().to_string();
        r.ids.push(id.clone());
        r.parents
            .entry(id.clone())
            .or_default()
            .extend(strs(&t["parents"]));
        for c in strs(&t["children"]) {
            r.parents.entry(c).or_default().insert(id.clone());
        }
        let outs: HashSet<String> = strs(&t["outputFiles"]).into_iter().collect();
        r.outputs
            .insert(id, outs.iter().map(|f| size[f.as_str()]).collect());
    }
    r
}

pub(crate) fn import(sb: &Sandbox, trace: &Path, dir: &str, extra: &[&str]) -> Value {
    let trace = trace.to_string_lossy();
    let mut args = vec!["import", "wfformat", &trace, "-o", dir, "--json"];
    args.extend_from_slice(extra);
    let r = sb.mesh(&args);
    r.expect_code(0);
    r.json()
}

/// Each task of the farm in `dir`, by the trace id its `id` variable holds.
pub(crate) fn tasks_by_id(def: &mesh_protocol::farm::FarmDef) -> HashMap<String, TaskRef> {
    let mut by_id = HashMap::new();
    for (s, stage) in def.stages.iter().enumerate() {
        for i in 0..stage.len() {
            let t = TaskRef::new(s as u32, i);
            let id = def
                .binding(t)
                .into_iter()
                .find(|(k, _)| k == "id")
                .map(|(_, v)| v)
                .expect("every task has an id");
            assert!(by_id.insert(id, t).is_none(), "two tasks of one id");
        }
    }
    by_id
}

#[test]
fn each_real_trace_imports_with_its_tasks_and_exactly_its_edges() {
    let Some(dir) = traces() else { return };
    let sb = sandbox();
    for (name, tasks, edges) in TRACES {
        let path = dir.join(format!("{name}.json"));
        let v = import(&sb, &path, name, &[]);
        assert_eq!(v["tasks"], tasks, "{name}: {v}");
        assert_eq!(v["edges"], edges, "{name}: {v}");
        let by_form: u64 = ["after", "after_each", "keyed", "listed"]
            .iter()
            .map(|f| v["forms"][f]["edges"].as_u64().unwrap())
            .sum();
        assert_eq!(by_form, edges as u64, "{name}: every edge in one form");
        assert_eq!(v["widened"], json!([]), "{name}");
        sb.mesh(&["check", &format!("{name}/farm.toml")])
            .expect_code(0);

        // The farm's dependencies, through mesh's loader, against the trace.
        let def = farmfile::load(
            &sb.path().join(name).join("farm.toml"),
            &LoadOptions::default(),
        )
        .expect("the farm loads");
        let rec = recorded(&path);
        let by_id = tasks_by_id(&def);
        assert_eq!(by_id.len(), tasks, "{name}");
        let mut seen = 0;
        for id in &rec.ids {
            let t = by_id[id];
            let mut got: Vec<TaskRef> = (0..).map_while(|n| def.dependency(t, n)).collect();
            got.sort_unstable();
            let mut want: Vec<TaskRef> = rec.parents[id].iter().map(|p| by_id[p]).collect();
            want.sort_unstable();
            assert_eq!(got, want, "{name}: task {id} ({})", def.task_name(t));
            seen += got.len();
        }
        assert_eq!(seen, edges, "{name}");
    }
}

#[test]
fn each_real_trace_runs_to_the_end_with_every_output_home() {
    let Some(dir) = traces() else { return };
    let sb = sandbox();
    let size_scale = 1e-6;
    for (name, tasks, _) in TRACES {
        let path = dir.join(format!("{name}.json"));
        import(
            &sb,
            &path,
            name,
            &["--time-scale", "0.0002", "--size-scale", "1e-6"],
        );
        // Sleeps use no core: more slots than cores keeps the run short.
        // The memory the traces recorded is declared too, whatever this
        // machine has.
        let r = sb.mesh(&[
            "run",
            &format!("{name}/farm.toml"),
            "--json",
            "--quiet",
            "--resources",
            "cpu=8,mem=64GiB",
        ]);
        r.expect_code(0);
        let v = r.json();
        assert_eq!(v["counts"]["done"], tasks, "{name}: {v}");
        assert_eq!(v["counts"]["failed"], 0, "{name}: {v}");
        let def = farmfile::load(
            &sb.path().join(name).join("farm.toml"),
            &LoadOptions::default(),
        )
        .expect("the farm loads");
        let rec = recorded(&path);
        for (id, t) in tasks_by_id(&def) {
            let home = sb
                .path()
                .join("mesh-out")
                .join(name)
                .join(&def.stages[t.stage as usize].name)
                .join(t.index.to_string());
            let mut sizes: Vec<u64> = std::fs::read_dir(&home)
                .map(|d| d.map(|e| e.unwrap().metadata().unwrap().len()).collect())
                .unwrap_or_default();
            let mut want: Vec<u64> = rec.outputs[&id]
                .iter()
                .map(|&b| (b as f64 * size_scale).round() as u64)
                .collect();
            sizes.sort_unstable();
            want.sort_unstable();
            assert_eq!(sizes, want, "{name}: outputs of {id} in {}", home.display());
        }
    }
}

#[test]
fn a_bad_trace_exits_2_naming_the_task_and_field_and_writes_nothing() {
    let sb = sandbox();
    let trace = |tasks: Value, b_runtime: f64| {
        json!({
            "name": "bad", "schemaVersion": "1.5",
            "workflow": {
                "specification": {"tasks": tasks, "files": []},
                "execution": {"makespanInSeconds": 1, "executedAt": "x", "tasks": [
                    {"id": "a", "runtimeInSeconds": 1.0},
                    {"id": "b", "runtimeInSeconds": b_runtime},
                ]},
            }
        })
        .to_string()
    };
    let task = |id: &str, parents: &[&str]| json!({"name": id, "id": id, "parents": parents, "children": []});
    let good = || trace(json!([task("a", &[]), task("b", &["a"])]), 1.0);
    let version = good().replace("\"1.5\"", "\"2.0\"");
    let cases = [
        ("{\"name\": ", "not JSON"),
        (
            version.as_str(),
            "field `schemaVersion`: unknown version `2.0`",
        ),
        (
            &trace(json!([task("a", &[]), task("b", &["ghost"])]), 1.0),
            "task `b`, field `parents`: `ghost` is no task of the trace",
        ),
        (
            &trace(json!([task("a", &["b"]), task("b", &["a"])]), 1.0),
            "field `parents`: the dependencies form a cycle: a -> b -> a",
        ),
        (
            &trace(json!([task("a", &[]), task("b", &["a"])]), -1.0),
            "task `b`, field `runtimeInSeconds`: -1 is negative",
        ),
    ];
    for (text, said) in cases {
        sb.write("bad.json", text);
        let r = sb.mesh(&["import", "wfformat", "bad.json", "-o", "farm"]);
        r.expect_code(2);
        assert!(r.stderr.contains(said), "wanted `{said}` in: {}", r.stderr);
        assert!(
            r.stderr.contains("bad.json"),
            "the file is named: {}",
            r.stderr
        );
        assert!(!sb.exists("farm"), "nothing written");
        let left: Vec<String> = std::fs::read_dir(sb.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains("importing"))
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }
    // A folder in use is left as it is.
    sb.write("farm/notes.txt", "mine");
    sb.write("good.json", &good());
    let r = sb.mesh(&["import", "wfformat", "good.json", "-o", "farm"]);
    r.expect_code(2);
    assert!(
        r.stderr.contains("already exists and is not empty"),
        "{}",
        r.stderr
    );
    assert_eq!(sb.read("farm/notes.txt"), "mine");
    assert!(!sb.exists("farm/farm.toml"));
    sb.mesh(&["import", "wfformat", "good.json"]).expect_code(0);
    assert!(
        sb.exists("good/farm.toml"),
        "the default folder is the trace's name"
    );
}
