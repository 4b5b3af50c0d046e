//! Turns a [`Trace`] into a farm: a stage per kind of task, each task an index of its stage's zip sweep, and every edge of the trace said in the most compact exact form (whole stage, element-wise, keyed or listed).
//!
//! Nothing here touches the disk: [`Plan::farm_toml`] is the farm file's
//! text, and [`Plan::input_files`] the files it reads from the farm
//! folder, with the sizes to write.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap, HashSet};
use std::fmt::Write as _;

use super::wfformat::Trace;

/// The folder, inside the farm folder, of the files no task of the trace makes.
pub const INPUTS_DIR: &str = "inputs";

/// How a stage waits for one upstream stage.
#[derive(Clone, Debug, PartialEq)]
pub enum Form {
    /// `after = ["u"]`: every task waits for every task of `u`.
    Whole,
    /// `after_each = "u"`: task i waits for task i of `u`.
    Each,
    /// `after = [{ stage = "u", by = { key_u = "key_s" } }]`: the relation
    /// is blocks of tasks that all wait for all of a block upstream; each
    /// task's block is a value of a variable on both sides.
    Keyed {
        /// Per task of the stage, its block (`None`: no parent upstream).
        down: Vec<Option<u32>>,
        /// Per task upstream, its block (`None`: no child here).
        up: Vec<Option<u32>>,
    },
    /// `after = [{ stage = "u", tasks = "{pa_u}" }]`: each task's parents
    /// as indices of `u`.
    Listed,
}

impl Form {
    pub fn word(&self) -> &'static str {
        match self {
            Form::Whole => "after",
            Form::Each => "after_each",
            Form::Keyed { .. } => "keyed",
            Form::Listed => "listed",
        }
    }
}

#[derive(Debug)]
pub struct Dep {
    /// The upstream stage's position in [`Plan::stages`].
    pub up: usize,
    pub form: Form,
    /// Per task of the stage, its parents in `up` (indices, sorted).
    pub ups: Vec<Vec<u32>>,
    pub edges: usize,
}

#[derive(Debug)]
pub struct Stage {
    pub name: String,
    /// What the tasks have in common in the trace (category, name or program).
    pub kind: String,
    /// Trace tasks, in index order.
    pub tasks: Vec<usize>,
    pub deps: Vec<Dep>,
    pub cpu: f64,
    /// Cores the trace recorded differ between the tasks: every task asks for the most.
    pub cpu_widened: bool,
    pub mem_bytes: Option<u64>,
    /// A variable-name form of `name`, unique in the farm.
    ident: String,
}

/// A farm made from a trace.
#[derive(Debug)]
pub struct Plan {
    /// In an order where every stage comes after those it waits for.
    pub stages: Vec<Stage>,
    /// Per trace task: its stage and index.
    pub place: Vec<(usize, u32)>,
    /// Per trace task: its input files read from the farm folder (paths
    /// under [`INPUTS_DIR`]) and those read from parents (paths under
    /// `{out}`); its outputs as (name, recorded size).
    io: Vec<TaskIo>,
    /// Files written into [`INPUTS_DIR`]: path inside it, recorded size.
    inputs: Vec<(String, u64)>,
    /// Inputs made by a task that is not a parent of the task reading them:
    /// read from the farm folder instead, where no edge makes them exist.
    pub inputs_not_from_parents: usize,
}

#[derive(Debug, Default)]
struct TaskIo {
    farm: Vec<String>,
    deps: Vec<String>,
    outs: Vec<(String, u64)>,
}

/// How the farm's tasks are scaled.
#[derive(Clone, Copy, Debug)]
pub struct Scale {
    pub time: f64,
    pub size: f64,
}

impl Scale {
    pub fn bytes(&self, recorded: u64) -> u64 {
        (recorded as f64 * self.size).round() as u64
    }
}

impl Plan {
    pub fn new(trace: &Trace) -> Plan {
        let (kinds, groups) = groups(trace);
        let stage_order = dependency_order(trace, &groups);
        let names = stage_names(&kinds, &groups, &stage_order);
        let mut stages: Vec<Stage> = Vec::with_capacity(groups.len());
        let mut place = vec![(0usize, 0u32); trace.tasks.len()];
        for (s, &g) in stage_order.iter().enumerate() {
            let Group {
                kind, tasks: ts, ..
            } = &groups[g];
            let cores: Vec<f64> = ts
                .iter()
                .map(|&t| trace.tasks[t].cores.unwrap_or(1.0))
                .collect();
            let cpu = cores.iter().copied().fold(0.0, f64::max);
            let mem_bytes = ts.iter().filter_map(|&t| trace.tasks[t].mem_bytes).max();
            stages.push(Stage {
                name: names[s].clone(),
                kind: kinds[*kind].clone(),
                tasks: ts.clone(),
                deps: Vec::new(),
                cpu,
                cpu_widened: cores.iter().any(|&c| c != cpu),
                mem_bytes,
                ident: String::new(),
            });
            for (i, &t) in ts.iter().enumerate() {
                place[t] = (s, i as u32);
            }
        }
        let mut plan = Plan {
            stages,
            place,
            io: Vec::new(),
            inputs: Vec::new(),
            inputs_not_from_parents: 0,
        };
        plan.align(trace);
        plan.link(trace);
        plan.name_vars();
        plan.files(trace);
        plan
    }

    /// Orders each stage's tasks like those of an upstream stage they pair
    /// with one to one, so the pairing is `after_each`.
    fn align(&mut self, trace: &Trace) {
        for s in 0..self.stages.len() {
            let n = self.stages[s].tasks.len();
            // Per upstream stage: each task's parents there, counted, and one of them.
            let mut cols: BTreeMap<usize, (Vec<u32>, Vec<u32>)> = BTreeMap::new();
            for (i, &t) in self.stages[s].tasks.iter().enumerate() {
                for &p in &trace.tasks[t].parents {
                    let (u, j) = self.place[p];
                    let (count, one) = cols.entry(u).or_insert_with(|| (vec![0; n], vec![0; n]));
                    count[i] += 1;
                    one[i] = j;
                }
            }
            let paired = cols.into_iter().find_map(|(u, (count, one))| {
                if self.stages[u].tasks.len() != n || count.iter().any(|&c| c != 1) {
                    return None;
                }
                let mut hit = vec![false; n];
                one.iter()
                    .all(|&j| !std::mem::replace(&mut hit[j as usize], true))
                    .then_some(one)
            });
            if let Some(one) = paired {
                let mut tasks = vec![0usize; n];
                for (i, &j) in one.iter().enumerate() {
                    tasks[j as usize] = self.stages[s].tasks[i];
                }
                for (i, &t) in tasks.iter().enumerate() {
                    self.place[t] = (s, i as u32);
                }
                self.stages[s].tasks = tasks;
            }
        }
    }

    /// Each stage's dependencies, each in the most compact exact form.
    fn link(&mut self, trace: &Trace) {
        for s in 0..self.stages.len() {
            let n = self.stages[s].tasks.len();
            let mut by_up: BTreeMap<usize, Vec<Vec<u32>>> = BTreeMap::new();
            for (i, &t) in self.stages[s].tasks.iter().enumerate() {
                for &p in &trace.tasks[t].parents {
                    let (u, j) = self.place[p];
                    by_up.entry(u).or_insert_with(|| vec![Vec::new(); n])[i].push(j);
                }
            }
            for (u, mut ups) in by_up {
                for l in &mut ups {
                    l.sort_unstable();
                }
                let m = self.stages[u].tasks.len();
                let edges: usize = ups.iter().map(Vec::len).sum();
                let form = if edges == n * m {
                    Form::Whole
                } else if n == m && ups.iter().enumerate().all(|(i, l)| l[..] == [i as u32]) {
                    Form::Each
                } else {
                    match blocks(&ups, m) {
                        // One key a task on both sides against a word per edge.
                        Some((down, up)) if n + m < edges => Form::Keyed { down, up },
                        _ => Form::Listed,
                    }
                };
                self.stages[s].deps.push(Dep {
                    up: u,
                    form,
                    ups,
                    edges,
                });
            }
        }
    }

    fn name_vars(&mut self) {
        let mut taken: HashSet<String> = HashSet::new();
        for s in 0..self.stages.len() {
            let base: String = self.stages[s]
                .name
                .chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || c == '_' {
                        c
                    } else {
                        '_'
                    }
                })
                .collect();
            let mut ident = base.clone();
            let mut n = 2;
            while !taken.insert(ident.clone()) {
                ident = format!("{base}_{n}");
                n += 1;
            }
            self.stages[s].ident = ident;
        }
    }

    /// Where each task reads its inputs and what it names its outputs.
    fn files(&mut self, trace: &Trace) {
        let mut producer: HashMap<usize, usize> = HashMap::new();
        for (t, task) in trace.tasks.iter().enumerate() {
            for &f in &task.outputs {
                producer.entry(f).or_insert(t);
            }
        }
        // Output names, unique per task (its outputs share a folder).
        let mut out_name: HashMap<(usize, usize), String> = HashMap::new();
        let mut io: Vec<TaskIo> = Vec::with_capacity(trace.tasks.len());
        for (t, task) in trace.tasks.iter().enumerate() {
            let mut used: HashSet<String> = HashSet::from([INPUTS_DIR.to_string()]);
            let mut outs = Vec::new();
            for &f in &task.outputs {
                if out_name.contains_key(&(t, f)) {
                    continue;
                }
                let file = &trace.files[f];
                let base = safe_name(file.id.rsplit('/').find(|c| !c.is_empty()).unwrap_or(""));
                let name = unique(&base, '.', &mut used);
                out_name.insert((t, f), name.clone());
                outs.push((name, file.size));
            }
            io.push(TaskIo {
                outs,
                ..TaskIo::default()
            });
        }
        let mut farm_path: HashMap<usize, String> = HashMap::new();
        let mut used: HashSet<String> = HashSet::new();
        let mut not_parents = 0;
        for (t, task) in trace.tasks.iter().enumerate() {
            let mut farm = Vec::new();
            let mut deps = Vec::new();
            for &f in &task.inputs {
                match producer.get(&f) {
                    Some(&p) if task.parents.binary_search(&p).is_ok() => {
                        let (s, i) = self.place[p];
                        deps.push(format!("{}/{i}/{}", self.stages[s].name, out_name[&(p, f)]));
                    }
                    made => {
                        if made.is_some() {
                            not_parents += 1;
                        }
                        let path = farm_path.entry(f).or_insert_with(|| {
                            let path = input_path(&trace.files[f].id, &mut used);
                            self.inputs.push((path.clone(), trace.files[f].size));
                            path
                        });
                        farm.push(path.clone());
                    }
                }
            }
            farm.sort();
            farm.dedup();
            // In the trace's order, each once.
            let mut seen = HashSet::new();
            deps.retain(|d| seen.insert(d.clone()));
            io[t].farm = farm;
            io[t].deps = deps;
        }
        self.io = io;
        self.inputs_not_from_parents = not_parents;
    }

    pub fn tasks(&self) -> usize {
        self.place.len()
    }

    pub fn edges(&self) -> usize {
        self.stages
            .iter()
            .flat_map(|s| &s.deps)
            .map(|d| d.edges)
            .sum()
    }

    /// Files the farm reads from its folder: path under [`INPUTS_DIR`], recorded size.
    pub fn input_files(&self) -> &[(String, u64)] {
        &self.inputs
    }

    /// The farm file.
    pub fn farm_toml(&self, trace: &Trace, farm_name: &str, source: &str, scale: Scale) -> String {
        self.toml(trace, farm_name, source, Some(scale))
    }

    /// The same farm with only its graph and resources: each task runs
    /// `true` and touches no file. What `mesh sim --workflow` simulates,
    /// which takes runtimes and sizes from the trace itself; loadable
    /// without the farm folder's input files.
    pub fn graph_toml(&self, trace: &Trace, farm_name: &str, source: &str) -> String {
        self.toml(trace, farm_name, source, None)
    }

    fn toml(&self, trace: &Trace, farm_name: &str, source: &str, run: Option<Scale>) -> String {
        let mut o = String::new();
        let system = trace
            .system
            .as_deref()
            .map(|s| format!(", run by {s}"))
            .unwrap_or_default();
        let _ = writeln!(o, "# Imported by `mesh import wfformat` from {source}");
        let _ = writeln!(
            o,
            "# (WfFormat {}, {}{system}): {} tasks, {} edges, as in the trace.",
            trace.schema,
            toml_str(&trace.name),
            self.tasks(),
            self.edges()
        );
        if let Some(scale) = run {
            let _ = writeln!(
                o,
                "# Each task sleeps its recorded runtime x {} (--time-scale), reads its input",
                scale.time
            );
            let _ = writeln!(
                o,
                "# files and writes its output files at their recorded sizes x {} (--size-scale).",
                scale.size
            );
            let _ = writeln!(
                o,
                "# Variable `id` is each task's id in the trace; {INPUTS_DIR}/ holds the files no task makes."
            );
        } else {
            let _ = writeln!(
                o,
                "# The graph alone: each task runs `true`; variable `id` is its id in the trace."
            );
        }
        let _ = writeln!(o, "\n[farm]\nname = {}", toml_str(farm_name));
        // Keys variables of upstream stages, per stage: (variable, values).
        let mut keys_up: Vec<Vec<(String, Vec<String>)>> = vec![Vec::new(); self.stages.len()];
        for stage in &self.stages {
            for d in &stage.deps {
                if let Form::Keyed { up, .. } = &d.form {
                    let values = up.iter().map(|b| key_word(*b, "unused")).collect();
                    keys_up[d.up].push((format!("key_{}", stage.ident), values));
                }
            }
        }
        for (s, stage) in self.stages.iter().enumerate() {
            self.stage_toml(&mut o, trace, stage, &keys_up[s], run);
        }
        o
    }

    /// One stage; with `run` `None`, its graph and resources alone.
    fn stage_toml(
        &self,
        o: &mut String,
        trace: &Trace,
        stage: &Stage,
        keys_up: &[(String, Vec<String>)],
        run: Option<Scale>,
    ) {
        self.stage_header(o, stage);
        let io: Vec<&TaskIo> = stage.tasks.iter().map(|&t| &self.io[t]).collect();
        sweep_var(
            o,
            "id",
            stage.tasks.iter().map(|&t| trace.tasks[t].id.clone()),
        );
        let files = run.is_some();
        let scale = run.unwrap_or(Scale {
            time: 1.0,
            size: 1.0,
        });
        if files {
            sweep_var(
                o,
                "secs",
                stage
                    .tasks
                    .iter()
                    .map(|&t| secs(trace.tasks[t].runtime_s * scale.time)),
            );
        }
        let input_entries = if files {
            farm_inputs(o, &io)
        } else {
            Vec::new()
        };
        let reads = files && io.iter().any(|x| !x.deps.is_empty());
        if reads {
            sweep_var(o, "reads", io.iter().map(|x| x.deps.join(" ")));
        }
        let writes = files && io.iter().any(|x| !x.outs.is_empty());
        if writes {
            sweep_var(
                o,
                "names",
                io.iter().map(|x| {
                    x.outs
                        .iter()
                        .map(|(n, _)| n.as_str())
                        .collect::<Vec<_>>()
                        .join(" ")
                }),
            );
            sweep_var(
                o,
                "sizes",
                io.iter().map(|x| {
                    x.outs
                        .iter()
                        .map(|(_, b)| scale.bytes(*b).to_string())
                        .collect::<Vec<_>>()
                        .join(" ")
                }),
            );
        }
        let (after, after_each) = self.waits(o, stage);
        for (name, values) in keys_up {
            sweep_var(o, name, values.iter().cloned());
        }
        if !after.is_empty() {
            let _ = writeln!(o, "after = [{}]", after.join(", "));
        }
        if !after_each.is_empty() {
            let _ = writeln!(o, "after_each = [{}]", after_each.join(", "));
        }
        if files {
            let _ = writeln!(o, "workdir = \"runs/{{stage}}/{{index}}\"");
        }
        if !input_entries.is_empty() {
            let list: Vec<String> = input_entries.iter().map(|e| toml_str(e)).collect();
            let _ = writeln!(o, "inputs = [{}]", list.join(", "));
        }
        if writes {
            // Outputs are written at the top of the task's folder, and the
            // staged inputs below it: `*` takes the outputs alone.
            let _ = writeln!(o, "outputs = [\"*\"]");
        }
        let mut res = format!("cpu = {}", decimal(stage.cpu, 3));
        if let Some(m) = stage.mem_bytes {
            let _ = write!(res, ", mem = \"{m}B\"");
        }
        let _ = writeln!(o, "resources = {{ {res} }}");
        if !files {
            let _ = writeln!(o, "command = [\"true\"]");
            return;
        }
        let sh = shell(reads, &input_entries, writes);
        let _ = writeln!(o, "shell = '''\n{sh}'''");
    }

    /// A stage's table header, and a comment on its tasks and what they
    /// wait for.
    fn stage_header(&self, o: &mut String, stage: &Stage) {
        let _ = writeln!(o, "\n[[stage]]\nname = {}", toml_str(&stage.name));
        let waits: Vec<String> = stage
            .deps
            .iter()
            .map(|d| {
                format!(
                    "{} {} ({} edges)",
                    d.form.word(),
                    self.stages[d.up].name,
                    d.edges
                )
            })
            .collect();
        let _ = writeln!(
            o,
            "# {} task{} of kind `{}`{}",
            stage.tasks.len(),
            if stage.tasks.len() == 1 { "" } else { "s" },
            stage.kind,
            if waits.is_empty() {
                String::new()
            } else {
                format!("; {}", waits.join(", "))
            }
        );
        let _ = writeln!(o, "sweep_mode = \"zip\"");
    }

    /// What a stage waits for: its `after` and `after_each` entries, with
    /// the variables a listed or keyed dependency reads written to `o`.
    fn waits(&self, o: &mut String, stage: &Stage) -> (Vec<String>, Vec<String>) {
        let mut after = Vec::new();
        let mut after_each = Vec::new();
        for d in &stage.deps {
            let up = &self.stages[d.up];
            match &d.form {
                Form::Whole => after.push(toml_str(&up.name)),
                Form::Each => after_each.push(toml_str(&up.name)),
                Form::Listed => {
                    let name = format!("pa_{}", up.ident);
                    sweep_var(
                        o,
                        &name,
                        d.ups
                            .iter()
                            .map(|l| l.iter().map(u32::to_string).collect::<Vec<_>>().join(" ")),
                    );
                    after.push(format!(
                        "{{ stage = {}, tasks = \"{{{name}}}\" }}",
                        toml_str(&up.name)
                    ));
                }
                Form::Keyed { down, .. } => {
                    let mine = format!("key_{}", up.ident);
                    let theirs = format!("key_{}", stage.ident);
                    sweep_var(o, &mine, down.iter().map(|b| key_word(*b, "none")));
                    after.push(format!(
                        "{{ stage = {}, by = {{ {mine} = \"{theirs}\" }} }}",
                        toml_str(&up.name)
                    ));
                }
            }
        }
        (after, after_each)
    }

    /// Whether a stage reads the empty file (a task with no farm-folder
    /// input in a stage whose other tasks have some).
    pub fn needs_none_input(&self) -> bool {
        self.stages.iter().any(|st| {
            let counts: Vec<usize> = st.tasks.iter().map(|&t| self.io[t].farm.len()).collect();
            counts.contains(&0) && counts.iter().any(|&c| c > 0)
        })
    }
}

/// A sweep variable of the stage: `sweep.<name> = { list = [...] }`.
fn sweep_var(o: &mut String, name: &str, values: impl Iterator<Item = String>) {
    let vs: Vec<String> = values.map(|v| toml_str(&v)).collect();
    let _ = writeln!(o, "sweep.{name} = {{ list = [{}] }}", vs.join(", "));
}

/// The stage's farm-folder inputs (of its tasks' `io`): one `inputs` entry
/// per slot; a slot the same for every task is written out, the others
/// are variables, written to `o`.
fn farm_inputs(o: &mut String, io: &[&TaskIo]) -> Vec<String> {
    let slots = io.iter().map(|x| x.farm.len()).max().unwrap_or(0);
    let mut input_entries = Vec::new();
    for k in 0..slots {
        let values: Vec<&str> = io
            .iter()
            .map(|x| {
                // A task with fewer files reads its last one again, or
                // the empty file when it has none.
                x.farm
                    .get(k)
                    .or(x.farm.last())
                    .map_or(NONE_INPUT, String::as_str)
            })
            .collect();
        if values.iter().all(|v| *v == values[0]) {
            input_entries.push(format!("{INPUTS_DIR}/{}", values[0]));
        } else {
            let name = format!("in{k}");
            sweep_var(o, &name, values.iter().map(|v| v.to_string()));
            input_entries.push(format!("{INPUTS_DIR}/{{{name}}}"));
        }
    }
    input_entries
}

/// A task's shell script: it reads what its parents made (`reads`) and its
/// farm-folder inputs (`input_entries`), sleeps its runtime, and writes its
/// outputs at their sizes (`writes`).
fn shell(reads: bool, input_entries: &[String], writes: bool) -> String {
    let mut sh = String::from("set -e\n");
    if reads {
        // One `cat` for them all, however many: a process costs more
        // than reading the bytes of a scaled-down file.
        sh.push_str("(cd \"{out}\" && exec cat {reads} /dev/null) > /dev/null\n");
    }
    if !input_entries.is_empty() {
        let _ = writeln!(sh, "cat {} > /dev/null", input_entries.join(" "));
    }
    sh.push_str("sleep {secs}\n");
    if writes {
        sh.push_str("set -- {sizes}\n");
        sh.push_str("for f in {names}; do head -c \"$1\" /dev/zero > \"$f\"; shift; done\n");
    }
    sh
}

/// The file read by a task that has no farm-folder input, in a stage whose
/// other tasks have some (a stage's `inputs` has one entry per slot).
pub const NONE_INPUT: &str = ".none";

/// A stage to be: the tasks of one kind, or for a kind whose tasks wait
/// for each other (a stage cannot wait for itself), of one kind at one
/// level of the graph.
struct Group {
    kind: usize,
    level: usize,
    tasks: Vec<usize>,
}

/// The kinds, and the tasks grouped into stages to be, in the trace's order.
fn groups(trace: &Trace) -> (Vec<String>, Vec<Group>) {
    let mut level = vec![0usize; trace.tasks.len()];
    for t in topo_order(trace) {
        for &p in &trace.tasks[t].parents {
            level[t] = level[t].max(level[p] + 1);
        }
    }
    let (kinds, kind_of) = kinds(trace);
    let split = cyclic_kinds(trace, &kind_of, kinds.len());
    let mut at: HashMap<(usize, usize), usize> = HashMap::new();
    let mut groups: Vec<Group> = Vec::new();
    for (t, &kind) in kind_of.iter().enumerate() {
        let level = if split[kind] { level[t] } else { 0 };
        let g = *at.entry((kind, level)).or_insert_with(|| {
            groups.push(Group {
                kind,
                level,
                tasks: Vec::new(),
            });
            groups.len() - 1
        });
        groups[g].tasks.push(t);
    }
    (kinds, groups)
}

/// Groups in an order where each comes after those it waits for, ties by
/// where their first task is in the trace.
fn dependency_order(trace: &Trace, groups: &[Group]) -> Vec<usize> {
    let mut group_of = vec![0usize; trace.tasks.len()];
    for (g, group) in groups.iter().enumerate() {
        for &t in &group.tasks {
            group_of[t] = g;
        }
    }
    let mut ups: Vec<HashSet<usize>> = vec![HashSet::new(); groups.len()];
    for (t, task) in trace.tasks.iter().enumerate() {
        for &p in &task.parents {
            ups[group_of[t]].insert(group_of[p]);
        }
    }
    let mut downs: Vec<Vec<usize>> = vec![Vec::new(); groups.len()];
    let mut waiting: Vec<usize> = ups.iter().map(HashSet::len).collect();
    for (g, u) in ups.iter().enumerate() {
        for &x in u {
            downs[x].push(g);
        }
    }
    let mut heap: BinaryHeap<Reverse<(usize, usize)>> = (0..groups.len())
        .filter(|&g| waiting[g] == 0)
        .map(|g| Reverse((groups[g].tasks[0], g)))
        .collect();
    let mut order = Vec::with_capacity(groups.len());
    while let Some(Reverse((_, g))) = heap.pop() {
        order.push(g);
        for &d in &downs[g] {
            waiting[d] -= 1;
            if waiting[d] == 0 {
                heap.push(Reverse((groups[d].tasks[0], d)));
            }
        }
    }
    // Kinds that wait for each other were split by level, so the groups
    // form no cycle.
    debug_assert_eq!(order.len(), groups.len(), "the groups form no cycle");
    order
}

/// Tasks in an order where each comes after its parents (the trace is
/// acyclic), ties in the trace's order.
fn topo_order(trace: &Trace) -> Vec<usize> {
    let n = trace.tasks.len();
    let mut children: Vec<Vec<usize>> = vec![Vec::new(); n];
    let mut waiting: Vec<usize> = vec![0; n];
    for (t, task) in trace.tasks.iter().enumerate() {
        waiting[t] = task.parents.len();
        for &p in &task.parents {
            children[p].push(t);
        }
    }
    let mut heap: BinaryHeap<Reverse<usize>> =
        (0..n).filter(|&t| waiting[t] == 0).map(Reverse).collect();
    let mut order = Vec::with_capacity(n);
    while let Some(Reverse(t)) = heap.pop() {
        order.push(t);
        for &c in &children[t] {
            waiting[c] -= 1;
            if waiting[c] == 0 {
                heap.push(Reverse(c));
            }
        }
    }
    order
}

/// The longest chain of runtimes through the graph, in seconds.
pub fn critical_path(trace: &Trace) -> f64 {
    let mut finish = vec![0.0f64; trace.tasks.len()];
    for t in topo_order(trace) {
        let start = trace.tasks[t]
            .parents
            .iter()
            .map(|&p| finish[p])
            .fold(0.0, f64::max);
        finish[t] = start + trace.tasks[t].runtime_s;
    }
    finish.into_iter().fold(0.0, f64::max)
}

/// Each task's kind, and the kinds: the trace's `category` where every task
/// has one; else the task name without its `_ID0000001` suffix (Pegasus;
/// Nextflow names a task by its process), unless that is every task's own
/// (Pegasus' Epigenomics puts the data in the name): then the program each
/// ran, where it is one word (a Nextflow program is a script).
fn kinds(trace: &Trace) -> (Vec<String>, Vec<usize>) {
    let by_category: Option<Vec<String>> = trace
        .tasks
        .iter()
        .map(|t| t.category.clone().filter(|c| !c.trim().is_empty()))
        .collect();
    let by_name: Vec<String> = trace
        .tasks
        .iter()
        .map(|t| strip_id(&t.name).to_string())
        .collect();
    let keys = match by_category {
        Some(k) => k,
        None => {
            let distinct: HashSet<&String> = by_name.iter().collect();
            if distinct.len() < trace.tasks.len() {
                by_name
            } else {
                trace
                    .tasks
                    .iter()
                    .zip(by_name)
                    .map(|(t, name)| t.program.as_deref().and_then(plain_program).unwrap_or(name))
                    .collect()
            }
        }
    };
    let mut kinds: Vec<String> = Vec::new();
    let mut at: HashMap<String, usize> = HashMap::new();
    let kind_of = keys
        .into_iter()
        .map(|k| {
            *at.entry(k.clone()).or_insert_with(|| {
                kinds.push(k);
                kinds.len() - 1
            })
        })
        .collect();
    (kinds, kind_of)
}

/// `individuals_ID0000001` is of kind `individuals`.
fn strip_id(name: &str) -> &str {
    match name.rfind("_ID") {
        Some(i)
            if i > 0 && name.len() > i + 3 && name[i + 3..].bytes().all(|b| b.is_ascii_digit()) =>
        {
            &name[..i]
        }
        _ => name,
    }
}

/// A program named by one word (or a path to one), not a script.
fn plain_program(p: &str) -> Option<String> {
    let p = p.trim();
    if p.is_empty() || p.len() > 100 || p.chars().any(char::is_whitespace) {
        return None;
    }
    let base = p.rsplit('/').find(|c| !c.is_empty())?;
    base.chars()
        .all(|c| c.is_ascii_alphanumeric() || "_.+-".contains(c))
        .then(|| base.to_string())
}

/// Per kind: whether its tasks wait for each other, directly or through
/// other kinds (a cycle of kinds, or a kind waiting for itself).
fn cyclic_kinds(trace: &Trace, kind_of: &[usize], n: usize) -> Vec<bool> {
    let mut edges: Vec<HashSet<usize>> = vec![HashSet::new(); n];
    let mut split = vec![false; n];
    for (t, task) in trace.tasks.iter().enumerate() {
        for &p in &task.parents {
            if kind_of[p] == kind_of[t] {
                split[kind_of[t]] = true;
            } else {
                edges[kind_of[t]].insert(kind_of[p]);
            }
        }
    }
    let edges: Vec<Vec<usize>> = edges.into_iter().map(|e| e.into_iter().collect()).collect();
    for comp in strongly_connected(&edges) {
        if comp.len() > 1 {
            for k in comp {
                split[k] = true;
            }
        }
    }
    split
}

/// Tarjan's strongly connected components, iteratively.
fn strongly_connected(edges: &[Vec<usize>]) -> Vec<Vec<usize>> {
    let n = edges.len();
    let mut index = vec![usize::MAX; n];
    let mut low = vec![0usize; n];
    let mut on_stack = vec![false; n];
    let mut stack = Vec::new();
    let mut comps = Vec::new();
    let mut next = 0;
    for root in 0..n {
        if index[root] != usize::MAX {
            continue;
        }
        let mut work: Vec<(usize, usize)> = vec![(root, 0)];
        index[root] = next;
        low[root] = next;
        next += 1;
        stack.push(root);
        on_stack[root] = true;
        while let Some(&mut (v, ref mut i)) = work.last_mut() {
            if *i < edges[v].len() {
                let w = edges[v][*i];
                *i += 1;
                if index[w] == usize::MAX {
                    index[w] = next;
                    low[w] = next;
                    next += 1;
                    stack.push(w);
                    on_stack[w] = true;
                    work.push((w, 0));
                } else if on_stack[w] {
                    low[v] = low[v].min(index[w]);
                }
                continue;
            }
            work.pop();
            if let Some(&(parent, _)) = work.last() {
                low[parent] = low[parent].min(low[v]);
            }
            if low[v] == index[v] {
                let mut comp = Vec::new();
                while let Some(w) = stack.pop() {
                    on_stack[w] = false;
                    comp.push(w);
                    if w == v {
                        break;
                    }
                }
                comps.push(comp);
            }
        }
    }
    comps
}

/// Stage names: the kind made safe, without a dotted prefix every kind
/// shares (Nextflow's `NFCORE_SAREK.SAREK.`), `-2`, `-3` for the later
/// levels of a kind split by level, each unique.
fn stage_names(kinds: &[String], groups: &[Group], order: &[usize]) -> Vec<String> {
    let safe: Vec<String> = kinds.iter().map(|k| safe_name(k)).collect();
    let cut = common_dotted_prefix(&safe);
    let short: Vec<String> = safe.iter().map(|s| safe_name(&s[cut..])).collect();
    let mut used: HashSet<String> = HashSet::new();
    let mut parts: HashMap<usize, usize> = HashMap::new();
    // The parts of a kind split by level are numbered in level order.
    let mut by_level: Vec<usize> = order.to_vec();
    by_level.sort_by_key(|&g| (groups[g].kind, groups[g].level));
    let mut name_of: HashMap<usize, String> = HashMap::new();
    for &g in &by_level {
        let k = groups[g].kind;
        let n = parts.entry(k).or_insert(0);
        *n += 1;
        let want = if *n == 1 {
            short[k].clone()
        } else {
            format!("{}-{n}", short[k])
        };
        name_of.insert(g, unique(&want, '-', &mut used));
    }
    order
        .iter()
        .map(|g| name_of.remove(g).expect("every stage named"))
        .collect()
}

/// The length of the longest prefix ending in `.` that every name has,
/// each with something after it.
fn common_dotted_prefix(names: &[String]) -> usize {
    let Some(first) = names.first().filter(|_| names.len() > 1) else {
        return 0;
    };
    for (i, _) in first.match_indices('.').rev() {
        let p = &first[..=i];
        if names.iter().all(|n| n.len() > p.len() && n.starts_with(p)) {
            return i + 1;
        }
    }
    0
}

/// Per task downstream and per task upstream, its block (`None`: in none).
type Blocks = (Vec<Option<u32>>, Vec<Option<u32>>);

/// The blocks of a relation that is a union of complete bipartite blocks
/// (tasks with the same parents, parents shared by no other block).
fn blocks(ups: &[Vec<u32>], m: usize) -> Option<Blocks> {
    let mut block_of: HashMap<&[u32], u32> = HashMap::new();
    let mut up = vec![None; m];
    let mut down = Vec::with_capacity(ups.len());
    for l in ups {
        if l.is_empty() {
            down.push(None);
            continue;
        }
        let next = block_of.len() as u32;
        let b = *block_of.entry(l.as_slice()).or_insert(next);
        if b == next {
            for &j in l {
                if up[j as usize].is_some() {
                    return None;
                }
                up[j as usize] = Some(b);
            }
        }
        down.push(Some(b));
    }
    Some((down, up))
}

fn key_word(b: Option<u32>, none: &str) -> String {
    b.map_or(none.to_string(), |b| b.to_string())
}

/// Seconds as `sleep` takes them: up to microseconds, no trailing zeros.
pub fn secs(s: f64) -> String {
    decimal(s, 6)
}

fn decimal(x: f64, places: usize) -> String {
    let t = format!("{x:.places$}");
    let t = if t.contains('.') {
        t.trim_end_matches('0').trim_end_matches('.')
    } else {
        &t
    };
    if t.is_empty() || t == "-0" {
        "0".into()
    } else {
        t.to_string()
    }
}

/// A name from a trace made safe for a file name and a farm: letters,
/// digits and `._+-`, no `..`, not starting with `-`, not empty.
pub fn safe_name(s: &str) -> String {
    let mut n: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._+-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    while n.contains("..") {
        n = n.replace("..", "._");
    }
    if n.starts_with('-') {
        n.insert(0, '_');
    }
    if n.chars().all(|c| c == '.') {
        n = n.replace('.', "_");
    }
    if n.is_empty() {
        n.push('_');
    }
    n
}

/// A file id (a path in Nextflow traces) as a relative path: its
/// components made safe, empty, `.` and `..` ones dropped or escaped.
pub fn safe_path(id: &str) -> String {
    let parts: Vec<String> = id
        .split('/')
        .filter(|c| !c.is_empty() && *c != ".")
        .map(safe_name)
        .collect();
    if parts.is_empty() {
        "_".into()
    } else {
        parts.join("/")
    }
}

/// `want`, or `want<sep>2`, `want<sep>3`..., whichever is not yet used.
fn unique(want: &str, sep: char, used: &mut HashSet<String>) -> String {
    let mut name = want.to_string();
    let mut n = 2;
    while used.contains(&name) || name == NONE_INPUT {
        name = format!("{want}{sep}{n}");
        n += 1;
    }
    used.insert(name.clone());
    name
}

/// A TOML basic string.
pub fn toml_str(s: &str) -> String {
    let mut o = String::with_capacity(s.len() + 2);
    o.push('"');
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            '\n' => o.push_str("\\n"),
            '\t' => o.push_str("\\t"),
            '\r' => o.push_str("\\r"),
            c if c.is_control() => {
                let _ = write!(o, "\\u{:04X}", c as u32);
            }
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

/// Where a file no task makes is kept under [`INPUTS_DIR`]: its id as a
/// safe relative path, unique, and never both a file and a folder (else
/// flattened into one name).
fn input_path(id: &str, used: &mut HashSet<String>) -> String {
    let path = safe_path(id);
    let clashes = |p: &str, used: &HashSet<String>| {
        used.iter().any(|u| {
            u.len() > p.len() && u.starts_with(p) && u.as_bytes()[p.len()] == b'/'
                || p.len() > u.len() && p.starts_with(u.as_str()) && p.as_bytes()[u.len()] == b'/'
        })
    };
    let want = if clashes(&path, used) {
        path.replace('/', "_")
    } else {
        path
    };
    let mut name = want.clone();
    let mut n = 2;
    while used.contains(&name) || name == NONE_INPUT || clashes(&name, used) {
        name = format!("{want}.{n}");
        n += 1;
    }
    used.insert(name.clone());
    name
}
