//! Unit tests of `mesh import`: traces in, farms out (loaded with mesh's own loader and checked edge by edge), and the errors bad traces get.

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use super::plan::{self, Form, Plan, Scale};
use super::wfformat::{self, Trace};
use super::{verify, write_folder};

/// A schema 1.5 trace: tasks as (id, parents, runtime), each named as its
/// id, running the program its id starts with, reading the outputs of its
/// parents and writing `<id>.out`.
fn trace15(tasks: &[(&str, &[&str], f64)]) -> Value {
    let mut spec = Vec::new();
    let mut exec = Vec::new();
    let mut files = Vec::new();
    for (id, parents, rt) in tasks {
        spec.push(json!({
            "name": id, "id": id, "parents": parents, "children": [],
            "inputFiles": parents.iter().map(|p| format!("{p}.out")).collect::<Vec<_>>(),
            "outputFiles": [format!("{id}.out")],
        }));
        let program = id.split("_ID").next().unwrap_or(id);
        exec.push(json!({"id": id, "runtimeInSeconds": rt, "command": {"program": program}}));
        files.push(json!({"id": format!("{id}.out"), "sizeInBytes": 1000}));
    }
    json!({
        "name": "t", "schemaVersion": "1.5",
        "workflow": {
            "specification": {"tasks": spec, "files": files},
            "execution": {"makespanInSeconds": 1, "executedAt": "x", "tasks": exec},
        }
    })
}

/// Imports `trace` into a fresh folder, the farm checked against the trace
/// as `mesh import` checks it; returns the folder with the plan.
fn import(trace: &Value) -> (tempfile::TempDir, Trace, Plan) {
    let trace = wfformat::parse(&trace.to_string()).expect("a good trace");
    let plan = Plan::new(&trace);
    let dir = tempfile::tempdir().expect("temp dir");
    let scale = Scale {
        time: 0.01,
        size: 0.5,
    };
    let toml = plan.farm_toml(&trace, "t", "t.json", scale);
    write_folder(&dir.path().join("farm"), &plan, &toml, scale, |farm| {
        let def = mesh_node::farmfile::load(farm, &Default::default())?;
        verify(&def, &trace, &plan)
    })
    .unwrap_or_else(|e| panic!("{e:#}\n{toml}"));
    (dir, trace, plan)
}

fn stage<'p>(plan: &'p Plan, name: &str) -> &'p plan::Stage {
    plan.stages
        .iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("no stage {name}"))
}

fn forms(plan: &Plan, name: &str) -> Vec<(String, &'static str)> {
    stage(plan, name)
        .deps
        .iter()
        .map(|d| (plan.stages[d.up].name.clone(), d.form.word()))
        .collect()
}

fn err(trace: &Value) -> String {
    format!("{:#}", wfformat::parse(&trace.to_string()).unwrap_err())
}

#[test]
fn a_fan_out_a_pipeline_and_a_gather_take_the_compact_forms() {
    let (_d, trace, plan) = import(&trace15(&[
        ("split_ID01", &[], 1.0),
        ("work_ID02", &["split_ID01"], 2.0),
        ("work_ID03", &["split_ID01"], 3.0),
        ("post_ID04", &["work_ID03"], 1.0),
        ("post_ID05", &["work_ID02"], 1.0),
        ("gather_ID06", &["post_ID04", "post_ID05"], 1.0),
    ]));
    assert_eq!(plan.tasks(), 6);
    assert_eq!(plan.edges(), trace.edges());
    let names: Vec<&str> = plan.stages.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["split", "work", "post", "gather"]);
    assert_eq!(forms(&plan, "work"), [("split".into(), "after")]);
    // Listed in the other order in the trace: put in work's order.
    assert_eq!(forms(&plan, "post"), [("work".into(), "after_each")]);
    assert_eq!(forms(&plan, "gather"), [("post".into(), "after")]);
    assert_eq!(plan::critical_path(&trace), 1.0 + 3.0 + 1.0 + 1.0);
}

#[test]
fn blocks_waiting_for_blocks_are_keyed_and_a_fan_in_is_listed() {
    // Two chromosomes, each split 3 ways and checked 3 ways, every check
    // of one waiting for all its splits: blocks of 3 by 3, 9 edges a
    // block where keys cost 6 words.
    let mut tasks: Vec<(String, Vec<String>)> = Vec::new();
    for c in 0..2 {
        for k in 0..3 {
            tasks.push((format!("split_ID{c}{k}"), vec![]));
        }
    }
    for c in 0..2 {
        for k in 0..3 {
            let ps = (0..3).map(|j| format!("split_ID{c}{j}")).collect();
            tasks.push((format!("check_ID{c}{k}"), ps));
        }
    }
    tasks.push((
        "sum_ID99".into(),
        vec!["check_ID00".into(), "check_ID11".into()],
    ));
    let refs: Vec<Vec<&str>> = tasks
        .iter()
        .map(|(_, p)| p.iter().map(String::as_str).collect())
        .collect();
    let list: Vec<(&str, &[&str], f64)> = tasks
        .iter()
        .zip(&refs)
        .map(|((id, _), p)| (id.as_str(), p.as_slice(), 1.0))
        .collect();
    let (dir, _, plan) = import(&trace15(&list));
    assert_eq!(plan.edges(), 18 + 2);
    assert!(matches!(
        stage(&plan, "check").deps[0].form,
        Form::Keyed { .. }
    ));
    assert_eq!(forms(&plan, "sum"), [("check".into(), "listed")]);
    let text = std::fs::read_to_string(dir.path().join("farm/farm.toml")).unwrap();
    assert!(
        text.contains(r#"after = [{ stage = "split", by = { key_split = "key_check" } }]"#),
        "{text}"
    );
}

#[test]
fn a_kind_that_waits_for_itself_is_split_by_level() {
    // Epigenomics: a merge per lane, then a merge of the merges.
    let (_d, _, plan) = import(&trace15(&[
        ("map_ID1", &[], 1.0),
        ("map_ID2", &[], 1.0),
        ("mapMerge_ID3", &["map_ID1"], 1.0),
        ("mapMerge_ID4", &["map_ID2"], 1.0),
        ("mapMerge_ID5", &["mapMerge_ID3", "mapMerge_ID4"], 1.0),
        ("chr21_ID6", &["mapMerge_ID5"], 1.0),
    ]));
    assert_eq!(stage(&plan, "mapMerge").tasks.len(), 2);
    assert_eq!(forms(&plan, "mapMerge-2"), [("mapMerge".into(), "after")]);
    assert_eq!(forms(&plan, "chr21"), [("mapMerge-2".into(), "after")]);
}

#[test]
fn kinds_come_from_names_or_else_programs_and_a_shared_dotted_prefix_goes() {
    // Every name its own, as in Epigenomics: the program groups them.
    let mut t = trace15(&[
        ("fast2bfq_lane_1_ID1", &[], 1.0),
        ("fast2bfq_lane_2_ID2", &[], 1.0),
        ("map_lane_1_ID3", &["fast2bfq_lane_1_ID1"], 1.0),
        ("map_lane_2_ID4", &["fast2bfq_lane_2_ID2"], 1.0),
    ]);
    for (i, p) in ["fast2bfq", "fast2bfq", "/usr/bin/map", "/usr/bin/map"]
        .iter()
        .enumerate()
    {
        t["workflow"]["execution"]["tasks"][i]["command"]["program"] = json!(p);
    }
    let (_d, _, plan) = import(&t);
    let names: Vec<&str> = plan.stages.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["fast2bfq", "map"]);
    // Nextflow: the name is the process, the id the name and a number.
    let mut t = trace15(&[("a", &[], 1.0), ("b", &["a"], 1.0), ("c", &["a"], 1.0)]);
    let procs = [
        "NF.SAREK.PREP.INDEX",
        "NF.SAREK.QC.MOSDEPTH",
        "NF.SAREK.RECAL.MOSDEPTH",
    ];
    for (i, p) in procs.iter().enumerate() {
        t["workflow"]["specification"]["tasks"][i]["name"] = json!(p);
        t["workflow"]["execution"]["tasks"][i]["command"]["program"] =
            json!("mosdepth \\\n --threads 1");
    }
    let (_d, _, plan) = import(&t);
    let names: Vec<&str> = plan.stages.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["PREP.INDEX", "QC.MOSDEPTH", "RECAL.MOSDEPTH"]);
}

#[test]
fn file_names_from_a_trace_stay_inside_the_farm() {
    assert_eq!(plan::safe_path("/c7/ff/genome.dict"), "c7/ff/genome.dict");
    assert_eq!(plan::safe_path("../../etc/passwd"), "._/._/etc/passwd");
    assert_eq!(plan::safe_path("a/./b//c"), "a/b/c");
    assert_eq!(plan::safe_name("a..b"), "a._b");
    assert_eq!(plan::safe_name("-rf x;`y`"), "_-rf_x__y_");
    assert_eq!(plan::safe_name("..."), "._.");
    assert_eq!(plan::safe_name(""), "_");
    // A trace whose files would climb out, clash or start with a dash.
    let mut t = trace15(&[("a", &[], 1.0), ("b", &["a"], 1.0)]);
    let tasks = &mut t["workflow"]["specification"]["tasks"];
    tasks[0]["inputFiles"] = json!(["../../etc/passwd", "x/y", "x"]);
    tasks[0]["outputFiles"] = json!(["/w/1/-o", "/w/2/-o", "inputs"]);
    tasks[1]["inputFiles"] = json!(["/w/1/-o", "/w/2/-o", "inputs"]);
    let (dir, _, _) = import(&t);
    let farm = dir.path().join("farm");
    assert!(farm.join("inputs/._/._/etc/passwd").is_file());
    assert!(farm.join("inputs/x/y").is_file());
    assert!(farm.join("inputs/x.2").is_file());
    let text = std::fs::read_to_string(farm.join("farm.toml")).unwrap();
    assert!(
        text.contains(r#"sweep.names = { list = ["_-o _-o.2 inputs.2"] }"#),
        "{text}"
    );
    assert!(text.contains("a/0/_-o a/0/_-o.2 a/0/inputs.2"), "{text}");
}

#[test]
fn schema_1_4_reads_as_its_1_5_form_does() {
    let t15 = trace15(&[
        ("split_ID01", &[], 1.5),
        ("work_ID02", &["split_ID01"], 2.0),
        ("work_ID03", &["split_ID01"], 3.0),
        ("gather_ID04", &["work_ID02", "work_ID03"], 1.0),
    ]);
    let t14 = to_14(&t15);
    let a = wfformat::parse(&t15.to_string()).unwrap();
    let b = wfformat::parse(&t14.to_string()).unwrap();
    assert_eq!(b.schema, "1.4");
    assert_eq!(summary(&a), summary(&b));
    // `jobs` and `runtime` (1.3's names) are read too.
    let mut t13 = t14.clone();
    let w = t13["workflow"].as_object_mut().unwrap();
    let tasks = w.remove("tasks").unwrap();
    w.insert("jobs".into(), tasks);
    for j in t13["workflow"]["jobs"].as_array_mut().unwrap() {
        let rt = j
            .as_object_mut()
            .unwrap()
            .remove("runtimeInSeconds")
            .unwrap();
        j["runtime"] = rt;
    }
    let c = wfformat::parse(&t13.to_string()).unwrap();
    assert_eq!(summary(&a), summary(&c));
}

/// What a trace says of each task: name, parents' names, runtime, files
/// with sizes (by name: 1.4 has no ids, and the names of these traces are
/// unique).
fn summary(t: &Trace) -> Vec<String> {
    let files = |fs: &[usize]| -> Vec<(String, u64)> {
        fs.iter()
            .map(|&f| (t.files[f].id.clone(), t.files[f].size))
            .collect()
    };
    t.tasks
        .iter()
        .map(|task| {
            let parents: Vec<&str> = task
                .parents
                .iter()
                .map(|&p| t.tasks[p].name.as_str())
                .collect();
            format!(
                "{} {parents:?} {} {:?} {:?}",
                task.name,
                task.runtime_s,
                files(&task.inputs),
                files(&task.outputs)
            )
        })
        .collect()
}

/// A 1.5 trace written as 1.4: everything under `workflow.tasks`, parents by
/// name, files per task with `link`.
fn to_14(t: &Value) -> Value {
    let w = &t["workflow"];
    let size: std::collections::HashMap<String, Value> = w["specification"]["files"]
        .as_array()
        .map(|fs| {
            fs.iter()
                .map(|f| {
                    (
                        f["id"].as_str().unwrap().to_string(),
                        f["sizeInBytes"].clone(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    let exec: std::collections::HashMap<String, &Value> = w["execution"]["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["id"].as_str().unwrap().to_string(), e))
        .collect();
    let name_of: std::collections::HashMap<String, String> = w["specification"]["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["id"].as_str().unwrap().to_string(),
                s["name"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let tasks: Vec<Value> = w["specification"]["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let id = s["id"].as_str().unwrap();
            let e = exec[id];
            let link = |key: &str, link: &str| -> Vec<Value> {
                s[key]
                    .as_array()
                    .map(|fs| {
                        fs.iter()
                            .map(|f| json!({"name": f, "link": link, "sizeInBytes": size.get(f.as_str().unwrap()).cloned().unwrap_or(json!(0))}))
                            .collect()
                    })
                    .unwrap_or_default()
            };
            let mut files = link("inputFiles", "input");
            files.extend(link("outputFiles", "output"));
            let parents: Vec<&str> = s["parents"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| name_of[p.as_str().unwrap()].as_str())
                .collect();
            let mut task = json!({
                "name": s["name"], "type": "compute", "parents": parents, "files": files,
                "runtimeInSeconds": e["runtimeInSeconds"], "command": e["command"],
            });
            if let Some(c) = e.get("coreCount") {
                task["cores"] = c.clone();
            }
            if let Some(m) = e.get("memoryInBytes") {
                task["memoryInBytes"] = m.clone();
            }
            task
        })
        .collect();
    json!({"name": t["name"], "schemaVersion": "1.4", "workflow": {"makespanInSeconds": 1, "executedAt": "x", "tasks": tasks}})
}

fn traces() -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/workflows");
    if dir.is_dir() {
        Some(dir)
    } else {
        eprintln!("skipped: no WfCommons traces at {}", dir.display());
        None
    }
}

#[test]
fn the_real_traces_written_as_1_4_import_as_they_do_as_1_5() {
    let Some(dir) = traces() else { return };
    let mut seen = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "json") || path.ends_with("wfcommons-schema.json") {
            continue;
        }
        let t15: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let a = wfformat::parse(&t15.to_string()).unwrap();
        let b = wfformat::parse(&to_14(&t15).to_string()).unwrap();
        assert_eq!(summary(&a), summary(&b), "{}", path.display());
        let (pa, pb) = (Plan::new(&a), Plan::new(&b));
        let shape = |p: &Plan| -> Vec<String> {
            p.stages
                .iter()
                .map(|s| {
                    let deps: Vec<_> = s
                        .deps
                        .iter()
                        .map(|d| (d.up, d.form.word(), d.edges))
                        .collect();
                    format!("{} {:?} {deps:?}", s.name, s.tasks)
                })
                .collect()
        };
        assert_eq!(shape(&pa), shape(&pb), "{}", path.display());
        seen += 1;
    }
    assert!(seen >= 6, "{seen} traces");
}

#[test]
fn bad_traces_are_refused_naming_the_task_and_field() {
    assert!(err(&json!("x")).contains("not a WfFormat trace"));
    let e = format!(
        "{:#}",
        wfformat::parse("{\"schemaVersion\": \"1.5\", ").unwrap_err()
    );
    assert!(e.starts_with("not JSON"), "{e}");
    let mut t = trace15(&[("a", &[], 1.0)]);
    t["schemaVersion"] = json!("0.9");
    assert!(
        err(&t).contains("field `schemaVersion`: unknown version `0.9`"),
        "{}",
        err(&t)
    );
    t.as_object_mut().unwrap().remove("schemaVersion");
    assert!(err(&t).contains("no `schemaVersion`"), "{}", err(&t));

    let t = trace15(&[("a", &[], 1.0), ("b", &["nope"], 1.0)]);
    assert!(
        err(&t).contains("task `b`, field `parents`: `nope` is no task of the trace"),
        "{}",
        err(&t)
    );
    let t = trace15(&[("a", &["c"], 1.0), ("b", &["a"], 1.0), ("c", &["b"], 1.0)]);
    let e = err(&t);
    assert!(
        e.contains("field `parents`: the dependencies form a cycle: a -> c -> b -> a"),
        "{e}"
    );
    let t = trace15(&[("a", &["a"], 1.0)]);
    assert!(err(&t).contains("a -> a"), "{}", err(&t));
    let t = trace15(&[("a", &[], 1.0), ("b", &["a"], -2.5)]);
    assert!(
        err(&t).contains("task `b`, field `runtimeInSeconds`: -2.5 is negative"),
        "{}",
        err(&t)
    );
    let t = trace15(&[("a", &[], 1.0), ("a", &[], 1.0)]);
    assert!(
        err(&t).contains("task `a`, field `id`: two tasks have this id"),
        "{}",
        err(&t)
    );
    let mut t = trace15(&[("a", &[], 1.0)]);
    t["workflow"]["specification"]["files"][0]["sizeInBytes"] = json!(-1);
    assert!(
        err(&t).contains("file `a.out`, field `sizeInBytes`: -1 is negative"),
        "{}",
        err(&t)
    );
    let mut t = trace15(&[("a", &[], 1.0)]);
    t["workflow"]["specification"]["tasks"][0]["children"] = json!(["z"]);
    assert!(
        err(&t).contains("task `a`, field `children`: `z` is no task"),
        "{}",
        err(&t)
    );
    let mut t = trace15(&[("a", &[], 1.0)]);
    t["workflow"]["execution"]["tasks"][0]["runtimeInSeconds"] = json!("soon");
    assert!(
        err(&t).contains("invalid type: string \"soon\""),
        "{}",
        err(&t)
    );
    let t14 = to_14(&trace15(&[("a", &[], 1.0), ("b", &["a"], -1.0)]));
    assert!(
        err(&t14).contains("task `b`, field `runtimeInSeconds`: -1 is negative"),
        "{}",
        err(&t14)
    );
}

#[test]
fn a_failed_check_and_a_folder_in_use_leave_nothing_behind() {
    let trace = wfformat::parse(&trace15(&[("a", &[], 1.0)]).to_string()).unwrap();
    let plan = Plan::new(&trace);
    let scale = Scale {
        time: 1.0,
        size: 1.0,
    };
    let toml = plan.farm_toml(&trace, "t", "t.json", scale);
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("farm");
    let e = write_folder(&dir, &plan, &toml, scale, |_| anyhow::bail!("no")).unwrap_err();
    assert_eq!(e.to_string(), "no");
    assert_eq!(
        std::fs::read_dir(root.path()).unwrap().count(),
        0,
        "nothing left"
    );
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("x"), "").unwrap();
    let e = write_folder(&dir, &plan, &toml, scale, |_| Ok(())).unwrap_err();
    assert!(
        e.to_string().contains("already exists and is not empty"),
        "{e}"
    );
    // An empty folder is taken.
    std::fs::remove_file(dir.join("x")).unwrap();
    write_folder(&dir, &plan, &toml, scale, |_| Ok(())).unwrap();
    assert!(dir.join("farm.toml").is_file());
    assert_eq!(std::fs::read_dir(root.path()).unwrap().count(), 1);
}
