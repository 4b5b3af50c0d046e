//! A client's function calls as data (`ControlRequest::Calls`): each call's key, function, arguments and dependencies, grouped here into the stages of its open farm, with no farm text written or parsed between (see `docs/api.md#calls`).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use mesh_protocol::farm::graph::{call_stage_place, Dep, DepOn, Graph, GraphCache};
use mesh_protocol::farm::{
    CommandTemplate, FarmDef, StageDef, Stages, Sweep, SweepMode, SweepVar, Template, Values,
};
use mesh_protocol::resources::{parse_amount, valid_resource_name, Amount, MEM};
use serde::{Deserialize, Serialize};

/// A batch of calls a client sends at once (a `map`, the `submit`s made
/// while the batch before was sent), with how its calls run.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CallBatch {
    /// The open farm, whose home is the node asked, that the calls join;
    /// `None`: a new open farm of them (`new`).
    #[serde(default)]
    pub farm: Option<String>,
    /// The farm to open, when `farm` is `None`.
    #[serde(default)]
    pub new: Option<NewFarm>,
    /// How every call of the batch runs.
    pub run: CallRun,
    pub calls: Vec<Call>,
    /// Run every call, reusing no result kept from an earlier farm.
    #[serde(default)]
    pub rerun: bool,
}

/// The open farm a first batch makes.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct NewFarm {
    pub name: String,
    /// Its folder (absolute), where the client writes its functions,
    /// arguments and worker, and each call runs.
    pub root: String,
    /// Its outputs' folder (absolute).
    pub out: String,
}

/// What runs a call: `python worker FUNCTION ARGS KEY OUT`, where ARGS is
/// the call's inline arguments or `@` and its arguments' file, and OUT is
/// `{out}` (a view of exactly its dependencies' outputs) for a call with
/// dependencies, `-` for one without.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CallRun {
    /// The interpreter (on each node, that path or the node's `--python`).
    pub python: String,
    /// Kept warm by each node (see `node/src/warm.rs`).
    #[serde(default)]
    pub warm: bool,
    /// The worker script, relative to the farm's folder.
    pub worker: String,
    /// Files every call reads besides its own (uploaded modules), after them.
    #[serde(default)]
    pub inputs: Vec<String>,
    /// Environment variables every call is given.
    #[serde(default)]
    pub env: Vec<(String, String)>,
    /// A call's arguments too big to ride inline: `{id}` is its key.
    pub args_file: String,
    /// The values of futures of other farms a call reads (`Call::vals`).
    pub vals_file: String,
    /// What a call writes: its value or its exception (`{id}`: its key).
    pub result: String,
}

/// One call: `{key, function, args, deps, resources, retries}`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Call {
    /// Its name in the farm, and what its content key is made from.
    pub key: String,
    /// Its function's file (by content hash, shared by every call of it).
    pub function: String,
    /// Its arguments, pickled and base64-encoded, when small; `None`: in
    /// `CallRun::args_file`.
    #[serde(default)]
    pub args: Option<String>,
    /// Calls of this batch before it that it waits for, by place.
    #[serde(default)]
    pub deps: Vec<u32>,
    /// Tasks of the farm (calls of earlier batches) it waits for, by name.
    #[serde(default)]
    pub after: Vec<String>,
    /// It reads `CallRun::vals_file`.
    #[serde(default)]
    pub vals: bool,
    /// Other files it reads (scattered data), relative to the farm's folder.
    #[serde(default)]
    pub inputs: Vec<String>,
    /// What it holds of a node while it runs (one cpu unless it says).
    #[serde(default)]
    pub resources: BTreeMap<String, serde_json::Value>,
    /// Failures allowed before it fails for good.
    #[serde(default)]
    pub retries: Option<u32>,
}

/// A call the node cannot run as sent: which, which field, what is wrong.
#[derive(Debug, thiserror::Error)]
#[error("call {key}: {field}: {why}")]
pub struct CallError {
    pub key: String,
    pub field: String,
    pub why: String,
}

/// The calls of `batch` as the stages added after `before` (the farm's
/// stages so far; `misnamed`, those of them named as calls name another
/// place, see `GraphCache::misnamed`), and each call's task name
/// (`stage/index`), in the batch's order. Calls alike (level in the batch, function, how they
/// take their arguments, what else they read, resources, retries) share a
/// stage, their values in its sweep: a stage per call would cost the
/// engine a stage's bookkeeping per call.
pub fn stages(
    before: &Stages,
    misnamed: &[u32],
    batch: &CallBatch,
) -> Result<(Vec<StageDef>, Vec<String>), CallError> {
    let calls = &batch.calls;
    checked_run(&batch.run, calls.first())?;
    let mut level = Vec::with_capacity(calls.len());
    let mut groups: HashMap<Alike<'_>, usize> = HashMap::new();
    let mut members: Vec<Group> = Vec::new();
    for (i, c) in calls.iter().enumerate() {
        checked_call(c)?;
        let mut l = 0u32;
        for &d in &c.deps {
            let Some(&dl) = level.get(d as usize) else {
                return Err(fail(
                    c,
                    "deps",
                    format!("{d} is no call before it in the batch"),
                ));
            };
            l = l.max(dl + 1);
        }
        level.push(l);
        let alike = Alike {
            level: l,
            function: &c.function,
            inline: c.args.is_some(),
            vals: c.vals,
            waits: !c.deps.is_empty() || !c.after.is_empty(),
            inputs: &c.inputs,
            resources: resources(c)?,
            retries: c.retries,
        };
        let g = match groups.get(&alike) {
            Some(&g) => g,
            None => {
                members.push(Group {
                    level: l,
                    calls: Vec::new(),
                    resources: alike.resources.clone(),
                });
                groups.insert(alike, members.len() - 1);
                members.len() - 1
            }
        };
        members[g].calls.push(i);
    }
    // A stage waits only for stages before it: a level's stages after
    // the levels it waits for.
    let mut order: Vec<usize> = (0..members.len()).collect();
    order.sort_by_key(|&g| members[g].level);
    // Named by place, `c<n>`: a farm whose other stages took such a name
    // (grown from farm text) would have two stages of one name.
    let taken = misnamed
        .iter()
        .map(|&s| &before[s as usize])
        .find(|st| call_stage_place(&st.name).is_some_and(|n| n >= before.len()));
    if let Some(st) = taken {
        let first = calls.first().map_or("", |c| c.key.as_str());
        return Err(CallError {
            key: first.to_string(),
            field: "farm".into(),
            why: format!(
                "the farm has a stage `{}` of its own: calls grow a farm of calls only",
                st.name
            ),
        });
    }
    let mut stage_of_group = vec![0u32; members.len()];
    for (n, &g) in order.iter().enumerate() {
        stage_of_group[g] = u32::try_from(before.len() + n).expect("stages fit in u32");
    }
    // Each call's place: its stage and its index there.
    let mut place = vec![(0u32, 0u32); calls.len()];
    for (g, group) in members.iter().enumerate() {
        for (k, &i) in group.calls.iter().enumerate() {
            place[i] = (stage_of_group[g], k as u32);
        }
    }
    let mut by_name: HashMap<&str, u32> = HashMap::new();
    let mut stages = Vec::with_capacity(order.len());
    for &g in &order {
        let list = &members[g].calls;
        let s = stage_of_group[g];
        // The tasks each call waits for, by upstream stage: the words of
        // a listed dependency, task indices.
        let mut ups: BTreeMap<u32, Vec<String>> = BTreeMap::new();
        for (k, &i) in list.iter().enumerate() {
            let c = &calls[i];
            let mut on = Vec::with_capacity(c.deps.len() + c.after.len());
            for &d in &c.deps {
                on.push(place[d as usize]);
            }
            for name in &c.after {
                on.push(named(before, &mut by_name, c, name)?);
            }
            for (up, idx) in on {
                let words = ups
                    .entry(up)
                    .or_insert_with(|| vec![String::new(); list.len()]);
                let w = &mut words[k];
                if !w.is_empty() {
                    w.push(' ');
                }
                w.push_str(&idx.to_string());
            }
        }
        stages.push(stage(&batch.run, s, &members[g], calls, ups)?);
    }
    let names = place
        .iter()
        .map(|&(s, k)| {
            let name = match (s as usize).checked_sub(before.len()) {
                Some(n) => &stages[n].name,
                None => &before[s as usize].name,
            };
            format!("{name}/{k}")
        })
        .collect();
    Ok((stages, names))
}

/// A new open farm of `batch`'s calls (its `new`), its graph built.
pub fn farm(batch: &CallBatch) -> Result<(FarmDef, Vec<String>), CallError> {
    let new = batch.new.as_ref().ok_or_else(|| CallError {
        key: batch
            .calls
            .first()
            .map_or_else(String::new, |c| c.key.clone()),
        field: "new".into(),
        why: "a batch for no farm opens one: its name, root and out".into(),
    })?;
    let (stages, names) = stages(&Stages::new(), &[], batch)?;
    let stages: Stages = stages.into_iter().map(Arc::new).collect();
    let graph = built(None, &new.name, &stages, batch)?;
    let def = FarmDef {
        name: new.name.clone(),
        root: new.root.clone(),
        out: new.out.clone(),
        stages,
        graph: GraphCache::ready(graph),
    };
    Ok((def, names))
}

/// `def` (a generation of an open farm) with `batch`'s calls added as
/// stages and their edges built on those of the generation before; each
/// call's task name.
pub fn grow(def: &mut FarmDef, batch: &CallBatch) -> Result<Vec<String>, CallError> {
    let (stages, names) = stages(&def.stages, def.graph.misnamed(def), batch)?;
    let before = def.graph.built().cloned();
    let old = def.stages.len();
    def.stages.extend(stages.into_iter().map(Arc::new));
    match built(before.as_deref(), &def.name, &def.stages, batch) {
        Ok(graph) => {
            def.graph = GraphCache::ready(graph).built_on(&def.graph);
            Ok(names)
        }
        Err(e) => {
            def.stages.truncate(old);
            Err(e)
        }
    }
}

/// The farm's graph with the new stages' edges; a dependency that does
/// not expand (a task index past its stage) is the batch's mistake.
fn built(
    before: Option<&Graph>,
    name: &str,
    stages: &Stages,
    batch: &CallBatch,
) -> Result<Graph, CallError> {
    Graph::build_after(before, name, stages).map_err(|(s, _, e)| CallError {
        key: batch
            .calls
            .first()
            .map_or_else(String::new, |c| c.key.clone()),
        field: "after".into(),
        why: format!("stage {}: {e}", stages[s].name),
    })
}

/// The calls of one stage: their level in the batch, their places in
/// it, and the resources each holds.
struct Group {
    level: u32,
    calls: Vec<usize>,
    resources: Vec<(String, Amount)>,
}

/// What calls share a stage by.
#[derive(PartialEq, Eq, Hash)]
struct Alike<'a> {
    level: u32,
    function: &'a str,
    inline: bool,
    vals: bool,
    waits: bool,
    inputs: &'a [String],
    resources: Vec<(String, Amount)>,
    retries: Option<u32>,
}

/// A call's resources read as a farm file's are: a number, or a string
/// such as `"4GiB"`; `mem` with a unit.
fn resources(c: &Call) -> Result<Vec<(String, Amount)>, CallError> {
    let mut out = Vec::with_capacity(c.resources.len());
    for (name, v) in &c.resources {
        let field = format!("resources.{name}");
        if !valid_resource_name(name) {
            return Err(fail(
                c,
                &field,
                "not a resource name (letters, digits, `_`, `-`)",
            ));
        }
        let text = match v {
            serde_json::Value::String(s) => s.clone(),
            serde_json::Value::Number(n) => n.to_string(),
            other => {
                return Err(fail(
                    c,
                    &field,
                    format!("expected a number, or a string such as \"512MiB\", not {other}"),
                ))
            }
        };
        // As the loader reads `mem = 256`: bytes no task means.
        let t = text.trim();
        let bare = t.bytes().any(|b| b.is_ascii_digit())
            && t.bytes().all(|b| b.is_ascii_digit() || b == b'.');
        if name == MEM && bare && t.parse::<f64>() != Ok(0.0) {
            return Err(fail(
                c,
                &field,
                format!("{text} bytes: give the unit, e.g. \"{text}MiB\" or \"{text}GiB\""),
            ));
        }
        let amount = parse_amount(name, &text).map_err(|e| fail(c, &field, e.to_string()))?;
        out.push((name.clone(), amount));
    }
    Ok(out)
}

/// A call's key names its files (`calls/{id}.pkl`, its result) and its
/// files are the farm folder's: as the Python client's keys and a farm
/// file's paths are checked.
fn checked_call(c: &Call) -> Result<(), CallError> {
    let key_ok = c
        .key
        .bytes()
        .next()
        .is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_')
        && c.key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
        && !c.key.contains("..");
    if !key_ok {
        return Err(fail(
            c,
            "key",
            "letters, digits, `_`, `.` and `-` (no `..`), first a letter, digit or `_`",
        ));
    }
    inside(c, "function", &c.function)?;
    for p in &c.inputs {
        inside(c, "inputs", p)?;
    }
    Ok(())
}

/// The batch's own paths, each in the farm's folder (a refusal names
/// the batch's first call).
fn checked_run(run: &CallRun, first: Option<&Call>) -> Result<(), CallError> {
    let Some(c) = first else {
        return Ok(());
    };
    let paths = [
        ("run.worker", &run.worker),
        ("run.args_file", &run.args_file),
        ("run.vals_file", &run.vals_file),
        ("run.result", &run.result),
    ];
    for (field, p) in paths {
        inside(c, field, p)?;
    }
    for p in &run.inputs {
        inside(c, "run.inputs", p)?;
    }
    for (k, _) in &run.env {
        let ok = k
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
            && k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        if !ok || k.starts_with("MESH_") {
            return Err(fail(
                c,
                "run.env",
                format!("`{k}` is not a variable a call may set"),
            ));
        }
    }
    Ok(())
}

fn inside(c: &Call, field: &str, path: &str) -> Result<(), CallError> {
    if path.trim().is_empty() || !mesh_protocol::farm::path_stays_inside(path) {
        return Err(fail(
            c,
            field,
            format!("`{path}` is not a path inside the farm's folder"),
        ));
    }
    Ok(())
}

/// The stage and index of task `name` (`stage/index`) of the farm so far.
fn named<'a>(
    before: &'a Stages,
    by_name: &mut HashMap<&'a str, u32>,
    c: &Call,
    name: &str,
) -> Result<(u32, u32), CallError> {
    let bad = || fail(c, "after", format!("`{name}` names no task of the farm"));
    let (stage, idx) = name.rsplit_once('/').ok_or_else(bad)?;
    let idx: u32 = idx.parse().map_err(|_| bad())?;
    let s = match by_name.get(stage) {
        Some(&s) => s,
        None => {
            // A stage of calls is where its name says; another, mostly of
            // the last batches.
            let s = call_stage_place(stage)
                .filter(|&n| before.get(n).is_some_and(|st| st.name == stage))
                .or_else(|| before.iter().rposition(|st| st.name == stage))
                .ok_or_else(bad)?;
            let s = u32::try_from(s).expect("stages fit in u32");
            by_name.insert(before[s as usize].name.as_str(), s);
            s
        }
    };
    if idx >= before[s as usize].len() {
        return Err(bad());
    }
    Ok((s, idx))
}

/// Stage `s`, of the calls of `group` (places in `calls`), which wait for
/// the tasks `ups` lists (by upstream stage, a word list per call).
fn stage(
    run: &CallRun,
    s: u32,
    group: &Group,
    calls: &[Call],
    ups: BTreeMap<u32, Vec<String>>,
) -> Result<StageDef, CallError> {
    let list = &group.calls;
    let first = &calls[list[0]];
    let inline = first.args.is_some();
    let mut vars = vec![SweepVar {
        name: "id".into(),
        values: packed(list.iter().map(|&i| calls[i].key.as_str())),
    }];
    if inline {
        let args = list
            .iter()
            .map(|&i| calls[i].args.as_deref().unwrap_or_default());
        vars.push(SweepVar {
            name: "args".into(),
            values: packed(args),
        });
    }
    let mut deps = Vec::with_capacity(ups.len());
    for (up, words) in ups {
        let var = format!("on_{up}");
        vars.push(SweepVar {
            name: var.clone(),
            values: packed(words.iter().map(String::as_str)),
        });
        deps.push((up, var));
    }
    let names: Vec<String> = vars.iter().map(|v| v.name.clone()).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let t = |text: &str, field: &str| {
        Template::parse(text, &names).map_err(|e| fail(first, field, e.to_string()))
    };
    let lit = Template::literal;
    let mut argv = vec![lit(&run.python), lit(&run.worker), lit(&first.function)];
    argv.push(if inline {
        t("{args}", "args")?
    } else {
        t(&format!("@{}", run.args_file), "args_file")?
    });
    argv.push(t("{id}", "key")?);
    let waits = !first.deps.is_empty() || !first.after.is_empty();
    argv.push(if waits { t("{out}", "deps")? } else { lit("-") });
    let command = if run.warm {
        CommandTemplate::Python(argv)
    } else {
        CommandTemplate::Argv(argv)
    };
    let mode = if vars.len() > 1 {
        SweepMode::Zip
    } else {
        SweepMode::Product
    };
    let mut st = StageDef::new(&format!("c{s}"), command, Sweep { vars, mode });
    // A call is named by its key, not by the batch it came in: the same
    // call in another growth (or a run resumed) is the same task.
    st.key = Some(t("{id}", "key")?);
    st.inputs = vec![lit(&run.worker), lit(&first.function)];
    if !inline {
        st.inputs.push(t(&run.args_file, "args_file")?);
    }
    if first.vals {
        st.inputs.push(t(&run.vals_file, "vals_file")?);
    }
    st.inputs.extend(first.inputs.iter().map(|p| lit(p)));
    st.inputs.extend(run.inputs.iter().map(|p| lit(p)));
    st.outputs = vec![t(&run.result, "result")?];
    st.env = run.env.iter().map(|(k, v)| (k.clone(), lit(v))).collect();
    // One cpu (`StageDef::new`'s) unless the call says.
    for (k, a) in &group.resources {
        st.resources.set(k, *a);
    }
    st.retries = first.retries.unwrap_or(0);
    let on: Vec<Dep> = deps
        .iter()
        .map(|(up, var)| Dep {
            stage: *up,
            on: DepOn::Listed {
                tasks: Template::parse(&format!("{{{var}}}"), &names)
                    .expect("a sweep variable's placeholder parses"),
                var: None,
            },
        })
        .collect();
    st.deps = on;
    Ok(st)
}

/// Values end to end in one string, as a file of lines is kept (a string
/// each would cost its own allocation and 24 bytes more a call at every
/// holder of the farm).
fn packed<'a>(values: impl Iterator<Item = &'a str>) -> Values {
    let mut text = String::new();
    let mut ends = Vec::new();
    for v in values {
        text.push_str(v);
        ends.push(u32::try_from(text.len()).expect("a stage's values under 4 GiB"));
    }
    text.shrink_to_fit();
    Values::Lines { text, ends }
}

fn fail(c: &Call, field: &str, why: impl Into<String>) -> CallError {
    CallError {
        key: c.key.clone(),
        field: field.to_string(),
        why: why.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mesh_protocol::farm::Command;
    use mesh_protocol::ids::TaskRef;

    fn run() -> CallRun {
        CallRun {
            python: "/usr/bin/python3".into(),
            warm: true,
            worker: "mesh_worker.py".into(),
            inputs: vec!["uploads/m.py".into()],
            env: vec![("MESHPY_UPLOADS".into(), "m.py=ab".into())],
            args_file: "calls/{id}.pkl".into(),
            vals_file: "calls/{id}.vals".into(),
            result: "result-{id}.pkl".into(),
        }
    }

    fn call(key: &str, function: &str, deps: &[u32], after: &[&str]) -> Call {
        Call {
            key: key.into(),
            function: function.into(),
            args: Some(format!("ARGS{key}")),
            deps: deps.to_vec(),
            after: after.iter().map(|s| s.to_string()).collect(),
            vals: false,
            inputs: vec![],
            resources: BTreeMap::new(),
            retries: None,
        }
    }

    fn batch(farm: Option<&str>, calls: Vec<Call>) -> CallBatch {
        CallBatch {
            farm: farm.map(str::to_string),
            new: Some(NewFarm {
                name: "python".into(),
                root: "/tmp/r".into(),
                out: "/tmp/r/out".into(),
            }),
            run: run(),
            calls,
            rerun: true,
        }
    }

    /// Every task `t` waits for, as task names.
    fn waits(def: &FarmDef, t: &str) -> Vec<String> {
        let (s, i) = t.split_once('/').unwrap();
        let t = TaskRef::new(def.stage_index(s).unwrap(), i.parse().unwrap());
        (0..)
            .map_while(|n| def.dependency(t, n))
            .map(|d| def.task_name(d))
            .collect()
    }

    fn task(def: &FarmDef, name: &str) -> mesh_protocol::farm::TaskSpec {
        let (s, i) = name.split_once('/').unwrap();
        def.expand(TaskRef::new(
            def.stage_index(s).unwrap(),
            i.parse().unwrap(),
        ))
    }

    #[test]
    fn a_map_and_its_sum_are_two_stages_the_sum_waiting_for_exactly_the_map() {
        let calls = vec![
            call("inc-1", "fns/a.pkl", &[], &[]),
            call("inc-2", "fns/a.pkl", &[], &[]),
            call("inc-3", "fns/a.pkl", &[], &[]),
            call("sum-1", "fns/b.pkl", &[0, 2], &[]),
        ];
        let (def, names) = farm(&batch(None, calls)).unwrap();
        assert_eq!(names, ["c0/0", "c0/1", "c0/2", "c1/0"]);
        assert_eq!(def.task_count(), 4);
        assert_eq!(waits(&def, "c1/0"), ["c0/0", "c0/2"]);
        assert!(waits(&def, "c0/1").is_empty());
        let t = task(&def, "c0/1");
        assert_eq!(
            t.command,
            Command::Python(vec![
                "/usr/bin/python3".into(),
                "mesh_worker.py".into(),
                "fns/a.pkl".into(),
                "ARGSinc-2".into(),
                "inc-2".into(),
                "-".into(),
            ])
        );
        assert_eq!(t.inputs, ["mesh_worker.py", "fns/a.pkl", "uploads/m.py"]);
        assert_eq!(t.outputs, ["result-inc-2.pkl"]);
        assert_eq!(
            t.env,
            [("MESHPY_UPLOADS".to_string(), "m.py=ab".to_string())]
        );
        // A call with dependencies reads their outputs through `{out}`.
        let Command::Python(argv) = task(&def, "c1/0").command else {
            panic!("a warm call")
        };
        assert_eq!(argv[3..5], ["ARGSsum-1", "sum-1"]);
        assert_ne!(argv[5], "-");
        // The key is the call's, not its stage's: the same call in another
        // batch (another stage) is the same task.
        let k = |d: &FarmDef, n: &str| {
            let (s, i) = n.split_once('/').unwrap();
            d.task_identity(TaskRef::new(d.stage_index(s).unwrap(), i.parse().unwrap()))
        };
        let again = vec![
            call("x", "fns/z.pkl", &[], &[]),
            call("inc-2", "fns/a.pkl", &[], &[]),
        ];
        let (again, names) = farm(&batch(None, again)).unwrap();
        assert_eq!(names[1], "c1/0");
        assert_eq!(k(&def, "c0/1"), k(&again, "c1/0"));
        assert_ne!(k(&def, "c0/1"), k(&def, "c0/0"));
    }

    #[test]
    fn a_growth_waits_for_calls_of_earlier_batches_by_name_and_builds_on_their_graph() {
        let (mut def, _) = farm(&batch(
            None,
            vec![
                call("a", "fns/a.pkl", &[], &[]),
                call("b", "fns/a.pkl", &[], &[]),
            ],
        ))
        .unwrap();
        let names = grow(
            &mut def,
            &batch(
                Some("python-1"),
                vec![
                    call("c", "fns/c.pkl", &[], &["c0/1"]),
                    call("d", "fns/c.pkl", &[0], &["c0/0"]),
                ],
            ),
        )
        .unwrap();
        assert_eq!(names, ["c1/0", "c2/0"]);
        assert_eq!(waits(&def, "c1/0"), ["c0/1"]);
        assert_eq!(waits(&def, "c2/0"), ["c0/0", "c1/0"]);
        assert_eq!(def.graph.get_or_build(&def).stages.len(), 3);
    }

    #[test]
    fn calls_alike_share_a_stage_and_a_stage_comes_after_those_it_waits_for() {
        let mut gpu = call("g", "fns/a.pkl", &[], &[]);
        gpu.resources.insert("gpu".into(), serde_json::json!(1));
        let mut big = call("big", "fns/a.pkl", &[], &[]);
        big.args = None;
        let calls = vec![
            call("a", "fns/f.pkl", &[], &[]),
            call("b", "fns/g.pkl", &[0], &[]),
            call("c", "fns/h.pkl", &[], &[]),
            call("d", "fns/g.pkl", &[2], &[]),
            gpu,
            big,
            call("e", "fns/f.pkl", &[], &[]),
        ];
        let (def, names) = farm(&batch(None, calls)).unwrap();
        // f (a, e), h, gpu, big at level 0; g (b, d) at level 1, after them.
        assert_eq!(
            names,
            ["c0/0", "c4/0", "c1/0", "c4/1", "c2/0", "c3/0", "c0/1"]
        );
        assert_eq!(waits(&def, "c4/1"), ["c1/0"]);
        assert_eq!(def.stages[2].resources.get("gpu"), Amount::units(1));
        let t = task(&def, "c3/0");
        assert!(
            t.inputs.contains(&"calls/big.pkl".to_string()),
            "{:?}",
            t.inputs
        );
        let Command::Python(argv) = t.command else {
            panic!("a warm call")
        };
        assert_eq!(argv[3], "@calls/big.pkl");
    }

    #[test]
    fn a_call_that_cannot_run_as_sent_is_refused_with_its_key_and_field() {
        let e = farm(&batch(None, vec![call("a", "fns/a.pkl", &[0], &[])])).unwrap_err();
        assert_eq!((e.key.as_str(), e.field.as_str()), ("a", "deps"));
        let (mut def, _) = farm(&batch(None, vec![call("a", "fns/a.pkl", &[], &[])])).unwrap();
        for bad in ["c0/1", "c9/0", "c0"] {
            let e = grow(
                &mut def,
                &batch(Some("p"), vec![call("b", "fns/a.pkl", &[], &[bad])]),
            )
            .unwrap_err();
            assert_eq!(e.field, "after", "{bad}");
            assert!(e.to_string().contains(bad), "{e}");
        }
        let mut mem = call("m", "fns/a.pkl", &[], &[]);
        mem.resources.insert("mem".into(), serde_json::json!(512));
        let e = farm(&batch(None, vec![mem])).unwrap_err();
        assert_eq!(e.field, "resources.mem");
        assert!(e.to_string().contains("512MiB"), "{e}");
        assert_eq!(def.stages.len(), 1, "a refused growth adds nothing");
        for (bad, field) in [("../x", "key"), ("a/b", "key"), ("", "key")] {
            let e = farm(&batch(None, vec![call(bad, "fns/a.pkl", &[], &[])])).unwrap_err();
            assert_eq!(e.field, field, "{bad:?}");
        }
        for path in ["/etc/passwd", "../up.pkl", "fns/../../x"] {
            let e = farm(&batch(None, vec![call("a", path, &[], &[])])).unwrap_err();
            assert_eq!(e.field, "function", "{path}");
            let mut b = batch(None, vec![call("a", "fns/a.pkl", &[], &[])]);
            b.run.result = path.into();
            assert_eq!(farm(&b).unwrap_err().field, "run.result", "{path}");
        }
        let mut b = batch(None, vec![call("a", "fns/a.pkl", &[], &[])]);
        b.run.env.push(("MESH_FARM".into(), "x".into()));
        assert_eq!(farm(&b).unwrap_err().field, "run.env");
    }

    #[test]
    fn calls_do_not_grow_a_farm_whose_own_stage_has_the_name_they_would_take() {
        let (mut def, _) = farm(&batch(None, vec![call("a", "fns/a.pkl", &[], &[])])).unwrap();
        let mut own = (*def.stages[0]).clone();
        own.name = "c2".into();
        def.stages.push_back(Arc::new(own));
        def.graph = GraphCache::ready(Graph::build_parts(&def.name, &def.stages).unwrap());
        let e = grow(
            &mut def,
            &batch(Some("p"), vec![call("b", "fns/a.pkl", &[], &[])]),
        )
        .unwrap_err();
        assert_eq!(e.field, "farm");
        assert!(e.to_string().contains("`c2`"), "{e}");
    }
}
