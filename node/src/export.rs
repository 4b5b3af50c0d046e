//! A farm written as a WfCommons trace (WfFormat 1.5): its task graph from its definition, each task's run as mesh recorded it, and the machines that ran them (`mesh export`).
//!
//! Both kinds of farm come here as [`FarmFacts`]: a mesh farm from a
//! node's copy of its replicated log (`mesh_node/home/export.rs`), a `mesh run`
//! farm from its store ([`crate::runner::export`]). Nothing is made up:
//! what was not recorded (the run of a task reused from an earlier farm, a
//! file whose size this node cannot see) is left out where WfFormat lets a
//! field be absent. docs/export.md says what each field holds.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, UNIX_EPOCH};

use mesh_protocol::engine::Usage;
use mesh_protocol::farm::{Command, FarmDef, TaskRef, TaskSpec};
use mesh_protocol::resources::{Resources, CPU, MEM, MILLI};
use serde_json::{json, Map, Value};

/// The WfFormat version written.
pub const SCHEMA_VERSION: &str = "1.5";

/// Where a task stands in the farm.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Ended {
    /// Not ended for good yet (or never started).
    #[default]
    Not,
    Done,
    Failed,
}

/// What was recorded of one task: of the run that counts, for an ended one.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TaskFacts {
    pub ended: Ended,
    /// The machine that ran it: a node's peer id, or for `mesh run` the host.
    pub node: Option<String>,
    /// Which attempt; 0 for a result reused from an earlier farm.
    pub attempt: u32,
    /// When it started, Unix ms, by the clock of the machine that ran it.
    pub start_ms: Option<u64>,
    /// How long it ran, where that was measured.
    pub runtime_ms: Option<u64>,
    pub exit_code: Option<i32>,
    /// Why it failed for good, in the words of `mesh status`.
    pub reason: Option<String>,
    /// Its outputs: the path in its output folder, and the size.
    pub outputs: Vec<(String, u64)>,
    /// The lines it found for the stages grown from it (see
    /// `mesh_protocol::farm::Grown`): which of their places are tasks.
    pub grew: Option<u32>,
    /// What the run that counts used, where its machine measured it.
    pub usage: Option<Usage>,
}

/// A machine that ran tasks, with what it offered the farm.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Machine {
    pub name: String,
    pub cores: Option<u64>,
    pub mem_bytes: Option<u64>,
}

impl Machine {
    /// From the resources a node offers: its cores where they are a whole
    /// number (WfFormat counts cores in integers), its memory where it says.
    pub fn of(name: &str, total: &Resources) -> Machine {
        let cpu = total.get(CPU).0;
        let mem = total.get(MEM).whole();
        Machine {
            name: name.to_string(),
            cores: (cpu >= MILLI && cpu.is_multiple_of(MILLI)).then_some(cpu / MILLI),
            mem_bytes: (mem > 0).then_some(mem),
        }
    }
}

/// Everything a trace is written from.
#[derive(Clone, Debug)]
pub struct FarmFacts {
    pub def: FarmDef,
    /// The farm's id as users see it (`sweep-1a2b3c4d`).
    pub id: String,
    /// Per stage, per task index.
    pub tasks: Vec<Vec<TaskFacts>>,
    /// The size of each input file of the farm that is known here, by its
    /// path in the farm's folder.
    pub input_sizes: HashMap<String, u64>,
    pub machines: Vec<Machine>,
    /// When the farm's run began and how long it took (Unix ms, ms), for a
    /// farm whose tasks' start times were not kept (`mesh run`).
    pub span: Option<(u64, u64)>,
    /// When the trace is written (Unix ms).
    pub now_ms: u64,
}

impl FarmFacts {
    /// Facts with every task not ended, for `def`.
    pub fn new(def: FarmDef, id: String, now_ms: u64) -> FarmFacts {
        let tasks = def
            .stages
            .iter()
            .map(|s| vec![TaskFacts::default(); s.len() as usize])
            .collect();
        FarmFacts {
            def,
            id,
            tasks,
            input_sizes: HashMap::new(),
            machines: Vec::new(),
            span: None,
            now_ms,
        }
    }

    fn task(&self, t: TaskRef) -> &TaskFacts {
        &self.tasks[t.stage as usize][t.index as usize]
    }
}

/// What a trace holds, counted (for the command's summary).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Written {
    pub tasks: u64,
    pub edges: u64,
    /// Tasks with a recorded run (in `workflow.execution`).
    pub timed: u64,
    pub files: u64,
    /// Files left out of `workflow.specification.files`: size not known here.
    pub no_size: u64,
    pub machines: u64,
}

/// The trace, and what it holds.
pub fn trace(f: &FarmFacts) -> (Value, Written) {
    let def = &f.def;
    let mut w = Written::default();
    // A place of a grown stage is a task once the task it grows from found
    // its line.
    let exists = |t: TaskRef| match def.grown_source(t) {
        Some((up, _, line)) => f.task(up).grew.is_some_and(|n| line < n),
        None => true,
    };
    let all: Vec<TaskRef> = def
        .stages
        .iter()
        .enumerate()
        .flat_map(|(s, st)| (0..st.len()).map(move |i| TaskRef::new(s as u32, i)))
        .filter(|&t| exists(t))
        .collect();
    let ids: Vec<Vec<String>> = def
        .stages
        .iter()
        .map(|st| {
            let stage = escape(&st.name, TASK_ID_CHARS);
            (0..st.len()).map(|i| format!("{stage}.{i}")).collect()
        })
        .collect();
    let id = |t: TaskRef| ids[t.stage as usize][t.index as usize].as_str();

    let parents: Vec<Vec<TaskRef>> = all
        .iter()
        .map(|&t| {
            let mut ps: Vec<TaskRef> = (0..)
                .map_while(|n| def.dependency(t, n))
                .filter(|&p| exists(p))
                .collect();
            // A stage named twice (in `after` and by a rule) is one edge.
            ps.sort_unstable();
            ps.dedup();
            ps
        })
        .collect();
    let mut children: HashMap<TaskRef, Vec<TaskRef>> = HashMap::new();
    for (&t, ps) in all.iter().zip(&parents) {
        for &p in ps {
            children.entry(p).or_default().push(t);
        }
    }

    let specs: Vec<_> = all.iter().map(|&t| def.expand(t)).collect();
    let files = Files::of(f, &all, &specs, &mut w);

    let mut spec_tasks = Vec::with_capacity(all.len());
    let mut exec_tasks = Vec::new();
    let mut ran_on: HashSet<&str> = HashSet::new();
    let (mut first, mut last) = (u64::MAX, 0u64);
    for ((&t, ps), spec) in all.iter().zip(&parents).zip(&specs) {
        let facts = f.task(t);
        let kids = children.get(&t).map_or(&[][..], Vec::as_slice);
        w.edges += ps.len() as u64;
        spec_tasks.push(json!({
            "name": def.task_name(t),
            "id": id(t),
            "category": def.stage(t).name,
            "parents": ps.iter().map(|&p| id(p)).collect::<Vec<_>>(),
            "children": kids.iter().map(|&c| id(c)).collect::<Vec<_>>(),
            "inputFiles": files.inputs_of(f, spec, ps),
            "outputFiles": facts.outputs.iter().map(|(path, _)| output_id(def, t, path)).collect::<Vec<_>>(),
        }));
        let Some(runtime_ms) = facts.runtime_ms else {
            continue;
        };
        if let Some(start) = facts.start_ms {
            first = first.min(start);
            last = last.max(start + runtime_ms);
        }
        if let Some(node) = &facts.node {
            ran_on.insert(node);
        }
        let run = Run {
            id: id(t),
            facts,
            runtime_ms,
            command: &spec.command,
            asked: &def.stage(t).resources,
        };
        exec_tasks.push(run.to_json());
    }
    w.tasks = all.len() as u64;
    w.timed = exec_tasks.len() as u64;

    let mut workflow = Map::new();
    let mut specification = json!({"tasks": spec_tasks});
    if !files.list.is_empty() {
        specification["files"] = Value::Array(files.list);
    }
    workflow.insert("specification".into(), specification);
    // A makespan and a start are required of an execution: a farm none of
    // whose tasks has a recorded run has none.
    let span = if first <= last {
        Some((first, last - first))
    } else {
        f.span
    };
    if let (false, Some((start, span_ms))) = (exec_tasks.is_empty(), span) {
        let machines = machines(f, &ran_on);
        w.machines = machines.len() as u64;
        let mut execution = json!({
            "makespanInSeconds": span_ms as f64 / 1000.0,
            "executedAt": timestamp(start),
            "tasks": exec_tasks,
        });
        if !machines.is_empty() {
            execution["machines"] = Value::Array(machines);
        }
        workflow.insert("execution".into(), execution);
    }

    let trace = json!({
        "name": def.name,
        "description": description(f, &all),
        "createdAt": timestamp(f.now_ms),
        "schemaVersion": SCHEMA_VERSION,
        "runtimeSystem": {
            "name": "mesh",
            "version": env!("CARGO_PKG_VERSION"),
        },
        "workflow": workflow,
    });
    (trace, w)
}

/// The id of an output of task `t`: its path under the task's folder, as
/// in the home's output folder.
fn output_id(def: &FarmDef, t: TaskRef, path: &str) -> String {
    escape(
        &format!("{}/{}/{path}", def.stage(t).name, t.index),
        FILE_ID_CHARS,
    )
}

/// The trace's files: each output under its task's folder, each farm
/// input by its path in the farm's folder.
struct Files<'a> {
    /// The inputs whose size is known here, then the outputs.
    list: Vec<Value>,
    /// Each input's id, by its path in the farm's folder.
    input_ids: HashMap<&'a str, String>,
}

impl<'a> Files<'a> {
    /// Of the tasks `all`, expanded in `specs`; counted in `w`.
    fn of(f: &FarmFacts, all: &[TaskRef], specs: &'a [TaskSpec], w: &mut Written) -> Files<'a> {
        let mut output_ids: HashSet<String> = HashSet::new();
        let mut outputs: Vec<Value> = Vec::new();
        for &t in all {
            for (path, size) in &f.task(t).outputs {
                let fid = output_id(&f.def, t, path);
                if output_ids.insert(fid.clone()) {
                    outputs.push(json!({"id": fid, "sizeInBytes": size}));
                }
            }
        }
        let mut input_ids: HashMap<&str, String> = HashMap::new();
        let mut list: Vec<Value> = Vec::new();
        for spec in specs {
            for path in &spec.inputs {
                if input_ids.contains_key(path.as_str()) {
                    continue;
                }
                let mut fid = escape(path, FILE_ID_CHARS);
                if output_ids.contains(&fid) {
                    // An input whose path in the farm's folder is also a task's
                    // output folder and name: kept apart.
                    fid.push_str("#input");
                }
                match f.input_sizes.get(path) {
                    Some(size) => list.push(json!({"id": fid, "sizeInBytes": size})),
                    None => w.no_size += 1,
                }
                input_ids.insert(path, fid);
            }
        }
        w.files = (input_ids.len() + output_ids.len()) as u64;
        list.append(&mut outputs);
        Files { list, input_ids }
    }

    /// The ids of a task's input files: its farm inputs (in `spec`), then
    /// what mesh puts in place for it, every output of the tasks it waits
    /// for (`parents`); each once.
    fn inputs_of(&self, f: &FarmFacts, spec: &TaskSpec, parents: &[TaskRef]) -> Vec<String> {
        let mut inputs: Vec<String> = spec
            .inputs
            .iter()
            .map(|p| self.input_ids[p.as_str()].clone())
            .collect();
        for &p in parents {
            inputs.extend(
                f.task(p)
                    .outputs
                    .iter()
                    .map(|(path, _)| output_id(&f.def, p, path)),
            );
        }
        let mut seen = HashSet::new();
        inputs.retain(|i| seen.insert(i.clone()));
        inputs
    }
}

/// A task's recorded run.
struct Run<'a> {
    /// The task's id in the trace.
    id: &'a str,
    facts: &'a TaskFacts,
    runtime_ms: u64,
    command: &'a Command,
    /// What its stage asks for.
    asked: &'a Resources,
}

impl Run<'_> {
    /// As WfFormat's execution has it.
    fn to_json(&self) -> Value {
        let facts = self.facts;
        let mut e = Map::new();
        e.insert("id".into(), self.id.into());
        e.insert(
            "runtimeInSeconds".into(),
            json!(self.runtime_ms as f64 / 1000.0),
        );
        if let Some(start) = facts.start_ms {
            e.insert("executedAt".into(), timestamp(start).into());
            e.insert("endedAt".into(), timestamp(start + self.runtime_ms).into());
        }
        e.insert("command".into(), command(self.command));
        let cpu = self.asked.get(CPU).0;
        // WfFormat's least is one core: a fraction of one is left unsaid.
        if cpu >= MILLI {
            e.insert("coreCount".into(), json!(cpu as f64 / MILLI as f64));
        }
        // WfFormat's memory, CPU and bytes are what the task used, as
        // measured; a task no one measured says none of them (its ask is
        // not what it used).
        if let Some(u) = facts.usage {
            if u.peak_rss > 0 {
                e.insert("memoryInBytes".into(), json!(u.peak_rss));
            }
            if self.runtime_ms > 0 {
                let pct = u.cpu_ms as f64 * 100.0 / self.runtime_ms as f64;
                e.insert("avgCPU".into(), json!((pct * 10.0).round() / 10.0));
            }
            e.insert("readBytes".into(), json!(u.read_bytes));
            e.insert("writtenBytes".into(), json!(u.written_bytes));
        }
        if let Some(node) = &facts.node {
            e.insert("machines".into(), json!([node]));
        }
        if let Some(c) = facts.exit_code {
            e.insert("exitCode".into(), c.into());
        }
        if facts.ended == Ended::Failed {
            let why = facts.reason.clone().unwrap_or_else(|| "failed".into());
            e.insert("failed".into(), why.into());
        }
        Value::Object(e)
    }
}

/// The machines that ran the farm's tasks (`ran_on`): each named once, with
/// what it offered where that is known, the others by name alone.
fn machines(f: &FarmFacts, ran_on: &HashSet<&str>) -> Vec<Value> {
    let mut machines: Vec<Value> = Vec::new();
    let mut named: HashSet<&str> = HashSet::new();
    for m in f
        .machines
        .iter()
        .filter(|m| ran_on.contains(m.name.as_str()))
    {
        if !named.insert(&m.name) {
            continue;
        }
        let mut v = json!({"nodeName": m.name});
        if let Some(c) = m.cores {
            v["cpu"] = json!({"coreCount": c});
        }
        if let Some(b) = m.mem_bytes {
            v["memoryInBytes"] = json!(b);
        }
        machines.push(v);
    }
    let mut rest: Vec<&str> = ran_on.difference(&named).copied().collect();
    rest.sort_unstable();
    machines.extend(rest.into_iter().map(|n| json!({"nodeName": n})));
    machines
}

/// The trace's description: the farm, and its tasks (`all`) counted by
/// how they stand.
fn description(f: &FarmFacts, all: &[TaskRef]) -> String {
    let count = |ended: Ended| all.iter().filter(|&&t| f.task(t).ended == ended).count();
    let (done, failed, unfinished) = (count(Ended::Done), count(Ended::Failed), count(Ended::Not));
    let reused = all
        .iter()
        .filter(|&&t| f.task(t).ended == Ended::Done && f.task(t).attempt == 0)
        .count();
    format!(
        "mesh farm {}: {} tasks in {} stages; {done} done ({reused} of them reused from an earlier run, with no run of their own here), {failed} failed, {unfinished} unfinished. Exported by mesh export.",
        f.id,
        all.len(),
        f.def.stages.len(),
    )
}

/// What WfFormat lets a task id hold (it names parents and children).
const TASK_ID_CHARS: &str = "-_.";
/// What it lets a file id hold.
const FILE_ID_CHARS: &str = "-_./:";

/// `s` with every character WfFormat does not let an id hold written as
/// `#` and its UTF-8 bytes in hex (`a b` is `a#20b`; `#` itself `#23`), so
/// two names stay two ids.
fn escape(s: &str, allowed: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        if c.is_ascii_alphanumeric() || allowed.contains(c) {
            o.push(c);
        } else {
            let mut b = [0u8; 4];
            for byte in c.encode_utf8(&mut b).bytes() {
                o.push_str(&format!("#{byte:02X}"));
            }
        }
    }
    o
}

/// A command as WfFormat has it: the program and its arguments, a shell
/// command as `/bin/sh -c` and its text. WfFormat has no empty argument.
fn command(c: &Command) -> Value {
    let (program, args): (&str, Vec<&str>) = match c {
        Command::Argv(argv) => match argv.split_first() {
            Some((p, rest)) => (p, rest.iter().map(String::as_str).collect()),
            None => return json!({}),
        },
        Command::Shell(text) => ("/bin/sh", vec!["-c", text]),
        Command::Python(argv) => match argv.split_first() {
            Some((p, rest)) => (p.as_str(), rest.iter().map(String::as_str).collect()),
            None => return json!({}),
        },
    };
    let mut v = json!({
        "arguments": args.into_iter().filter(|a| !a.is_empty()).collect::<Vec<_>>(),
    });
    if !program.is_empty() {
        v["program"] = program.into();
    }
    v
}

/// Unix ms as RFC 3339, UTC, to the millisecond.
pub fn timestamp(ms: u64) -> String {
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(ms)).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use mesh_protocol::farm::{CommandTemplate, StageDef, Sweep, Template};

    fn farm() -> FarmDef {
        let stage = |name: &str, n: u64| {
            StageDef::new(
                name,
                CommandTemplate::Argv(vec![
                    Template::literal("sleep"),
                    Template::literal("1"),
                    Template::literal(""),
                ]),
                Sweep::range("i", n),
            )
        };
        let a = stage("make it", 2);
        let mut b = stage("gather", 1);
        b.after = vec![0];
        let mut c = stage("each", 2);
        c.after_each = vec![0];
        // Named twice: still one edge each.
        c.after.push(0);
        FarmDef {
            name: "f".into(),
            root: "/farm".into(),
            out: "/out".into(),
            stages: vec![a.into(), b.into(), c.into()].into(),
            graph: Default::default(),
        }
    }

    #[test]
    fn ids_keep_apart_what_they_escape() {
        assert_eq!(escape("make it", TASK_ID_CHARS), "make#20it");
        assert_eq!(escape("a#20b", TASK_ID_CHARS), "a#2320b");
        assert_eq!(escape("x/é.dat", FILE_ID_CHARS), "x/#C3#A9.dat");
        assert_eq!(escape("run-1_a.b", TASK_ID_CHARS), "run-1_a.b");
    }

    #[test]
    fn edges_are_the_farms_each_once_and_only_recorded_runs_are_executed() {
        let mut f = FarmFacts::new(farm(), "f-1".into(), 0);
        f.tasks[0][0] = TaskFacts {
            ended: Ended::Done,
            node: Some("n1".into()),
            attempt: 1,
            start_ms: Some(1_000),
            runtime_ms: Some(1_500),
            exit_code: Some(0),
            outputs: vec![("o.txt".into(), 7)],
            ..TaskFacts::default()
        };
        // Reused from an earlier farm: no run of its own.
        f.tasks[0][1] = TaskFacts {
            ended: Ended::Done,
            node: Some("n2".into()),
            outputs: vec![("o.txt".into(), 9)],
            ..TaskFacts::default()
        };
        f.tasks[1][0] = TaskFacts {
            ended: Ended::Failed,
            node: Some("n3".into()),
            attempt: 2,
            start_ms: Some(2_000),
            runtime_ms: Some(100),
            exit_code: Some(3),
            reason: Some("exit code 3".into()),
            ..TaskFacts::default()
        };
        f.machines = vec![Machine::of(
            "n1",
            &mesh_protocol::resources::parse_resources("cpu=2.5,mem=1KiB").unwrap(),
        )];
        let (v, w) = trace(&f);
        assert_eq!(w.tasks, 5);
        assert_eq!(w.edges, 2 + 2 * 2);
        assert_eq!(w.timed, 2);
        let tasks = v["workflow"]["specification"]["tasks"].as_array().unwrap();
        assert_eq!(tasks[2]["id"], "gather.0");
        assert_eq!(tasks[2]["parents"], json!(["make#20it.0", "make#20it.1"]));
        assert_eq!(
            tasks[2]["inputFiles"],
            json!(["make it/0/o.txt", "make it/1/o.txt"].map(|s| escape(s, FILE_ID_CHARS)))
        );
        assert_eq!(tasks[3]["parents"], json!(["make#20it.0", "make#20it.1"]));
        assert_eq!(
            tasks[0]["children"],
            json!(["gather.0", "each.0", "each.1"])
        );
        let e = &v["workflow"]["execution"];
        // From the first start to the last end, the failure's included.
        assert_eq!(e["makespanInSeconds"], 1.5);
        let failed = &e["tasks"][1];
        assert_eq!(failed["id"], "gather.0");
        assert_eq!(failed["exitCode"], 3);
        assert_eq!(failed["failed"], "exit code 3");
        assert!(e["tasks"][0].get("failed").is_none());
        assert_eq!(e["executedAt"], "1970-01-01T00:00:01.000Z");
        assert_eq!(e["tasks"][0]["endedAt"], "1970-01-01T00:00:02.500Z");
        assert_eq!(
            e["tasks"][0]["command"],
            json!({"program": "sleep", "arguments": ["1"]})
        );
        assert_eq!(e["tasks"][0]["coreCount"], 1.0);
        // 2.5 cores is no whole number of cores.
        // n3 is not among the machines given: its name alone.
        assert_eq!(
            e["machines"],
            json!([{"nodeName": "n1", "memoryInBytes": 1024}, {"nodeName": "n3"}])
        );
        let whole = Machine::of(
            "m",
            &mesh_protocol::resources::parse_resources("cpu=4").unwrap(),
        );
        assert_eq!((whole.cores, whole.mem_bytes), (Some(4), None));
        let said = v["description"].as_str().unwrap();
        assert!(
            said.contains("2 done (1 of them reused from an earlier run, with no run of their own here), 1 failed, 2 unfinished"),
            "{said}"
        );
    }

    #[test]
    fn a_farm_with_no_recorded_run_has_no_execution() {
        let f = FarmFacts::new(farm(), "f-1".into(), 0);
        let (v, w) = trace(&f);
        assert!(v["workflow"].get("execution").is_none(), "{v}");
        assert_eq!(w.timed, 0);
        assert!(v["workflow"]["specification"].get("files").is_none());
    }
}
