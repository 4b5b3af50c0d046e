//! A randomized oracle for "right results by construction" (TigerBeetle's VOPR, Jepsen): random farms, random histories of edits, runs, kills and submissions, each checked against a model computed from the farm alone.
//!
//! Every task runs one probe line that writes `id.txt` (its stage and
//! values) and `seen.txt` (every `id.txt` under its `{out}`, with the
//! path), and appends `start`/`end` lines to a run log. The model knows,
//! from the generated farm only, each task's values, its dependencies
//! (`after`, `after_each`, keyed `by`, unions), hence its exact
//! `seen.txt`, and its content key (stage name, values and repeat, the
//! command's version, the keys it depends on). It tracks which key each
//! `<out>/<stage>/<index>` folder holds (with the files' size and mtime),
//! so it knows which tasks must be reused and which must run.
//!
//! Everything comes from one seed; a failure prints the seed, the farm
//! files and the history, and `MESH_ORACLE_SEED=<n>` replays it.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;
use std::fs;
use std::hash::{Hash, Hasher};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::signal::Signal;

use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};

use crate::{Cluster, Run, Sandbox};

/// A seeded generator (rand's `SmallRng`): a seed replays a history.
#[derive(Clone, Debug)]
pub struct Rng(SmallRng);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(SmallRng::seed_from_u64(seed))
    }

    /// 0..n (n > 0).
    pub fn below(&mut self, n: usize) -> usize {
        self.0.random_range(0..n)
    }

    /// True with probability `p` percent.
    pub fn pct(&mut self, p: u32) -> bool {
        self.below(100) < p as usize
    }

    pub fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[self.below(xs.len())]
    }
}

/// Values are short and plain: nothing to quote or escape anywhere.
const POOL: [&str; 6] = ["a", "b", "c", "1", "2", "3"];
const VAR_NAMES: [&str; 3] = ["v", "w", "u"];
/// The parameter files a farm may sweep.
const FILES: usize = 2;
/// At most this many `--out` folders per history, so the four places
/// mesh keeps per key always cover every folder a key can be in.
const OUTS: usize = 3;

/// Where a sweep variable takes its values.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Src {
    /// `{ lines = "p<k>.txt" }`
    Lines(usize),
    List(Vec<String>),
    /// `{ range = "1..<n>" }`
    Range(u32),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Var {
    pub name: String,
    pub src: Src,
}

/// One stage as generated; dependencies name earlier stages by position in
/// `Farm::stages` (which is never the order in the file, see `Farm::order`).
#[derive(Clone, Debug)]
pub struct Stage {
    pub name: String,
    pub vars: Vec<Var>,
    pub zip: bool,
    pub after: Vec<usize>,
    pub after_each: Vec<usize>,
    pub keyed: Vec<(usize, Vec<String>)>,
    /// Bumped by a history's "change the command": `: v<n>;` in front.
    pub version: u32,
}

#[derive(Clone, Debug)]
pub struct Farm {
    pub name: String,
    pub stages: Vec<Stage>,
    /// The order the stages are written in the file.
    pub order: Vec<usize>,
    /// Lines of `p0.txt`, `p1.txt`.
    pub files: Vec<Vec<String>>,
}

/// A farm's tasks as the model sees them.
#[derive(Clone, Debug)]
pub struct Expanded {
    /// Per stage: its effective variable names.
    pub names: Vec<Vec<String>>,
    /// Per stage, per task.
    pub tasks: Vec<Vec<Task>>,
}

#[derive(Clone, Debug)]
pub struct Task {
    pub values: Vec<String>,
    pub deps: BTreeSet<(usize, usize)>,
    pub key: u64,
    pub id: String,
    /// The exact `seen.txt` of a run of this task in this farm.
    pub seen: String,
}

/// What the model may be told to get wrong, to show the oracle catches it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plant {
    None,
    /// Every task's last dependency is forgotten.
    ForgetDep,
    /// Every key counts as new: a reuse looks like a missing run.
    NothingReused,
}

fn hash_of(parts: &impl Hash) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    parts.hash(&mut h);
    h.finish()
}

/// Per variable's list of values, per value: which repeat of that value in
/// the list it is (0 for its first).
fn repeats(cols: &[Vec<String>]) -> Vec<Vec<usize>> {
    cols.iter()
        .map(|c| {
            let mut seen: HashMap<&String, usize> = HashMap::new();
            c.iter()
                .map(|x| {
                    let n = seen.entry(x).or_insert(0);
                    *n += 1;
                    *n - 1
                })
                .collect()
        })
        .collect()
}

fn gen_values(rng: &mut Rng, n: usize) -> Vec<String> {
    (0..n).map(|_| rng.pick(&POOL).to_string()).collect()
}

impl Farm {
    /// A random valid farm of 1 to 4 stages.
    pub fn generate(rng: &mut Rng, name: &str) -> Farm {
        loop {
            let mut f = Farm::try_generate(rng);
            f.name = name.to_string();
            if f.expand(Plant::None).is_ok() {
                return f;
            }
        }
    }

    fn try_generate(rng: &mut Rng) -> Farm {
        let files = (0..FILES)
            .map(|_| {
                let n = 1 + rng.below(5);
                gen_values(rng, n)
            })
            .collect();
        let n = 1 + rng.below(4);
        let mut f = Farm {
            name: String::new(),
            stages: Vec::new(),
            order: Vec::new(),
            files,
        };
        for k in 0..n {
            let mut st = Stage {
                name: format!("s{k}"),
                vars: Vec::new(),
                zip: false,
                after: Vec::new(),
                after_each: Vec::new(),
                keyed: Vec::new(),
                version: 0,
            };
            // after_each first: it may give the stage its sweep.
            if k > 0 && rng.pct(35) {
                let t = rng.below(k);
                st.after_each.push(t);
                if rng.pct(30) {
                    // A second one of the same length: a stage that takes t's sweep.
                    if let Some(u) = (0..k).find(|&u| {
                        u != t
                            && f.stages[u].after_each.first() == Some(&t)
                            && f.stages[u].vars.is_empty()
                    }) {
                        st.after_each.push(u);
                    }
                }
                let teff = f.effective_vars(t);
                if rng.pct(30) && teff.len() == 1 {
                    if let Src::Lines(file) = teff[0].src {
                        // Its own sweep over the same file: equal lengths always.
                        let name = if rng.pct(50) {
                            teff[0].name.clone()
                        } else {
                            rng.pick(&VAR_NAMES).to_string()
                        };
                        st.vars.push(Var {
                            name,
                            src: Src::Lines(file),
                        });
                    }
                }
            } else {
                let nv = match rng.below(100) {
                    0..=14 => 0,
                    15..=69 => 1,
                    _ => 2,
                };
                let mut names: Vec<&str> = VAR_NAMES.to_vec();
                for _ in 0..nv {
                    let name = names.remove(rng.below(names.len()));
                    let src = match rng.below(100) {
                        0..=44 => Src::Lines(rng.below(FILES)),
                        45..=74 => {
                            let n = 1 + rng.below(4);
                            Src::List(gen_values(rng, n))
                        }
                        _ => Src::Range(1 + rng.below(3) as u32),
                    };
                    st.vars.push(Var {
                        name: name.to_string(),
                        src,
                    });
                }
                if nv == 2 && rng.pct(40) {
                    st.zip = true;
                    // Equal lengths that edits keep equal: both over one file, or lists.
                    if rng.pct(50) {
                        let file = rng.below(FILES);
                        for v in &mut st.vars {
                            v.src = Src::Lines(file);
                        }
                    } else {
                        let n = 1 + rng.below(4);
                        for v in &mut st.vars {
                            v.src = Src::List(gen_values(rng, n));
                        }
                    }
                }
            }
            f.stages.push(st);
            let own: Vec<String> = f.effective_vars(k).iter().map(|v| v.name.clone()).collect();
            for j in 0..k {
                if f.stages[k].after_each.contains(&j) {
                    continue;
                }
                let jn: Vec<String> = f.effective_vars(j).iter().map(|v| v.name.clone()).collect();
                let shared: Vec<String> = own.iter().filter(|n| jn.contains(n)).cloned().collect();
                let r = rng.below(100);
                if r < 30 {
                    f.stages[k].after.push(j);
                } else if r < 65 && !shared.is_empty() {
                    let by = if shared.len() > 1 && rng.pct(40) {
                        shared.clone()
                    } else {
                        vec![rng.pick(&shared).clone()]
                    };
                    f.stages[k].keyed.push((j, by));
                }
            }
        }
        f.order = (0..n).collect();
        // Stages in any order in the file: dependencies say the order.
        for i in (1..n).rev() {
            let j = rng.below(i + 1);
            f.order.swap(i, j);
        }
        f
    }

    /// A stage's sweep: its own, else (with `after_each`) the first one's.
    pub fn effective_vars(&self, s: usize) -> Vec<Var> {
        let st = &self.stages[s];
        if st.vars.is_empty() {
            if let Some(&t) = st.after_each.first() {
                return self.effective_vars(t);
            }
        }
        st.vars.clone()
    }

    fn values_of(&self, src: &Src) -> Vec<String> {
        match src {
            Src::Lines(k) => self.files[*k].clone(),
            Src::List(l) => l.clone(),
            Src::Range(n) => (1..=*n).map(|i| i.to_string()).collect(),
        }
    }

    fn zip_of(&self, s: usize) -> bool {
        let st = &self.stages[s];
        if st.vars.is_empty() {
            if let Some(&t) = st.after_each.first() {
                return self.zip_of(t);
            }
        }
        st.zip
    }

    /// Each task of stage `s` as the position of its value in each
    /// variable's list (`cols`): a zip pairs them, else every combination;
    /// an error where mesh must refuse the sweep.
    fn positions(&self, s: usize, cols: &[Vec<String>]) -> Result<Vec<Vec<usize>>, String> {
        if cols.is_empty() {
            return Ok(vec![Vec::new()]);
        }
        if self.zip_of(s) && cols.len() > 1 {
            if cols.iter().any(|c| c.len() != cols[0].len()) {
                return Err(format!("{}: zip of unequal lengths", self.stages[s].name));
            }
            return Ok((0..cols[0].len()).map(|i| vec![i; cols.len()]).collect());
        }
        let mut at = vec![Vec::new()];
        for c in cols {
            at = at
                .into_iter()
                .flat_map(|r: Vec<usize>| {
                    (0..c.len()).map(move |x| {
                        let mut r = r.clone();
                        r.push(x);
                        r
                    })
                })
                .collect();
        }
        Ok(at)
    }

    /// Every task with its values, dependencies, key and what it must see;
    /// an error where mesh must refuse the farm.
    pub fn expand(&self, plant: Plant) -> Result<Expanded, String> {
        let mut ex = Expanded {
            names: Vec::new(),
            tasks: Vec::new(),
        };
        for s in 0..self.stages.len() {
            let st = &self.stages[s];
            let vars = self.effective_vars(s);
            let cols: Vec<Vec<String>> = vars.iter().map(|v| self.values_of(&v.src)).collect();
            if cols.iter().any(|c| c.is_empty()) {
                return Err(format!("{}: a sweep with no values", st.name));
            }
            // A task is known by its values, each with which repeat of that
            // value in its variable's list it is.
            let at = self.positions(s, &cols)?;
            let col_reps = repeats(&cols);
            let rows: Vec<Vec<String>> = at
                .iter()
                .map(|r| {
                    r.iter()
                        .enumerate()
                        .map(|(v, &p)| cols[v][p].clone())
                        .collect()
                })
                .collect();
            for &t in &st.after_each {
                if ex.tasks[t].len() != rows.len() {
                    return Err(format!("{}: after_each of unequal lengths", st.name));
                }
            }
            let names: Vec<String> = vars.iter().map(|v| v.name.clone()).collect();
            let mut tasks = Vec::new();
            let mut keyed_edges = vec![0usize; st.keyed.len()];
            for (i, values) in rows.iter().enumerate() {
                let repeat: Vec<usize> = at[i]
                    .iter()
                    .enumerate()
                    .map(|(v, &p)| col_reps[v][p])
                    .collect();
                let mut deps = BTreeSet::new();
                let mut dep_key: Vec<(String, String, Vec<u64>)> = Vec::new();
                for &t in &st.after {
                    let keys = ex.tasks[t].iter().map(|x: &Task| x.key).collect();
                    dep_key.push(("after".into(), self.stages[t].name.clone(), keys));
                    deps.extend((0..ex.tasks[t].len()).map(|j| (t, j)));
                }
                for &t in &st.after_each {
                    dep_key.push((
                        "each".into(),
                        self.stages[t].name.clone(),
                        vec![ex.tasks[t][i].key],
                    ));
                    deps.insert((t, i));
                }
                for (ki, (t, by)) in st.keyed.iter().enumerate() {
                    let tn = &ex.names[*t];
                    let mut keys = Vec::new();
                    for (j, up) in ex.tasks[*t].iter().enumerate() {
                        let matches = by.iter().all(|v| {
                            let a = names.iter().position(|n| n == v).map(|p| &values[p]);
                            let b = tn.iter().position(|n| n == v).map(|p| &up.values[p]);
                            a.is_some() && a == b
                        });
                        if matches {
                            keys.push(up.key);
                            deps.insert((*t, j));
                            keyed_edges[ki] += 1;
                        }
                    }
                    dep_key.push(("by".into(), self.stages[*t].name.clone(), keys));
                }
                let own = (&st.name, &names, values, repeat, st.version);
                let key = hash_of(&(own, &dep_key));
                let mut id = st.name.clone();
                for (n, v) in names.iter().zip(values) {
                    let _ = write!(id, " {n}={v}");
                }
                tasks.push(Task {
                    values: values.clone(),
                    deps,
                    key,
                    id,
                    seen: String::new(),
                });
            }
            for (ki, e) in keyed_edges.iter().enumerate() {
                if *e == 0 {
                    return Err(format!(
                        "{}: keyed on {} matches nothing",
                        st.name, self.stages[st.keyed[ki].0].name
                    ));
                }
            }
            for t in &mut tasks {
                let mut deps: Vec<(usize, usize)> = t.deps.iter().copied().collect();
                if plant == Plant::ForgetDep {
                    deps.pop();
                }
                let mut lines: Vec<String> = deps
                    .iter()
                    .map(|&(ds, di)| {
                        format!(
                            "./{}/{di}/id.txt {}",
                            self.stages[ds].name, ex.tasks[ds][di].id
                        )
                    })
                    .collect();
                lines.sort();
                t.seen = lines.iter().map(|l| format!("{l}\n")).collect();
            }
            ex.names.push(names);
            ex.tasks.push(tasks);
        }
        Ok(ex)
    }

    /// The farm file.
    pub fn toml(&self, runlog: &Path) -> String {
        let mut t = format!("[farm]\nname = \"{}\"\n", self.name);
        for &s in &self.order {
            let st = &self.stages[s];
            let _ = write!(t, "\n[[stage]]\nname = \"{}\"\n", st.name);
            for v in &st.vars {
                let src = match &v.src {
                    Src::Lines(k) => format!("{{ lines = \"p{k}.txt\" }}"),
                    Src::List(l) => {
                        let q: Vec<String> = l.iter().map(|x| format!("\"{x}\"")).collect();
                        format!("{{ list = [{}] }}", q.join(", "))
                    }
                    Src::Range(n) => format!("{{ range = \"1..{n}\" }}"),
                };
                let _ = writeln!(t, "sweep.{} = {src}", v.name);
            }
            if st.zip {
                t.push_str("sweep_mode = \"zip\"\n");
            }
            let mut after: Vec<String> = st
                .after
                .iter()
                .map(|&a| format!("\"{}\"", self.stages[a].name))
                .collect();
            for (k, by) in &st.keyed {
                let by: Vec<String> = by.iter().map(|b| format!("\"{b}\"")).collect();
                after.push(format!(
                    "{{ stage = \"{}\", by = [{}] }}",
                    self.stages[*k].name,
                    by.join(", ")
                ));
            }
            if !after.is_empty() {
                let _ = writeln!(t, "after = [{}]", after.join(", "));
            }
            if !st.after_each.is_empty() {
                let e: Vec<String> = st
                    .after_each
                    .iter()
                    .map(|&a| format!("\"{}\"", self.stages[a].name))
                    .collect();
                let _ = writeln!(t, "after_each = [{}]", e.join(", "));
            }
            let mut id = String::from("{stage}");
            for v in self.effective_vars(s) {
                let _ = write!(id, " {0}={{{0}}}", v.name);
            }
            let prefix = if st.version > 0 {
                format!(": v{}; ", st.version)
            } else {
                String::new()
            };
            let _ = write!(
                t,
                "workdir = \"w/{{stage}}/{{index}}\"\noutputs = [\"id.txt\", \"seen.txt\"]\n\
                 env = {{ RUNLOG = \"{}\" }}\n\
                 shell = '''{prefix}echo 'start {{stage}} {{index}}' >> $RUNLOG; echo '{id}' > id.txt; \
                 (cd {{out}} && find . -name id.txt | LC_ALL=C sort | while read f; do echo \"$f $(cat $f)\"; done) > seen.txt; \
                 echo 'end {{stage}} {{index}}' >> $RUNLOG'''\n",
                runlog.display()
            );
        }
        t
    }

    /// Writes the farm file and its parameter files into `dir`.
    pub fn write(&self, dir: &Path, runlog: &Path) {
        fs::create_dir_all(dir).expect("mkdir farm");
        fs::write(dir.join("farm.toml"), self.toml(runlog)).expect("write farm");
        for (k, lines) in self.files.iter().enumerate() {
            let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
            fs::write(dir.join(format!("p{k}.txt")), text).expect("write params");
        }
    }

    /// The files as text, for a report.
    pub fn describe(&self, runlog: &Path) -> String {
        let mut s = format!("--- farm.toml\n{}", self.toml(runlog));
        for (k, l) in self.files.iter().enumerate() {
            let _ = writeln!(s, "--- p{k}.txt: {}", l.join(" "));
        }
        s
    }
}

/// One step of a history.
#[derive(Clone, Debug)]
pub enum Op {
    /// A line of a parameter file: changed, inserted or deleted.
    SetLine {
        file: usize,
        at: usize,
        value: String,
    },
    InsertLine {
        file: usize,
        at: usize,
        value: String,
    },
    DeleteLine {
        file: usize,
        at: usize,
    },
    /// A stage's list variable (or both of a zip) made to these values.
    SetList {
        stage: usize,
        values: Vec<Vec<String>>,
    },
    SetRange {
        stage: usize,
        var: usize,
        end: u32,
    },
    /// `: v<n>;` in front of a stage's command: its key changes.
    Bump {
        stage: usize,
    },
    /// The stages written in another order: no key changes.
    Reorder {
        order: Vec<usize>,
    },
    /// A line appended to an output in an `--out`, as a user editing it.
    Tamper {
        out: usize,
        stage: usize,
        index: usize,
    },
    /// `mesh run` into an out (one node), or `mesh submit --wait` (mesh).
    Run {
        out: usize,
    },
    /// `mesh run` killed (SIGKILL) after `ms`, then `mesh resume` or `mesh run` again.
    Kill {
        out: usize,
        ms: u64,
        resume: bool,
    },
    /// Two submissions of the same file at once, into two outs (mesh).
    Parallel {
        outs: [usize; 2],
    },
}

impl Op {
    fn runs(&self) -> bool {
        matches!(self, Op::Run { .. } | Op::Kill { .. } | Op::Parallel { .. })
    }
}

/// What the model knows of one `<out>/<stage>/<index>` folder.
#[derive(Clone, Debug)]
struct Held {
    key: u64,
    /// (file, size, mtime ns, text) of id.txt and seen.txt as last checked.
    files: Vec<(String, u64, i64, String)>,
}

/// How a history is run.
pub enum Mode<'a> {
    One(&'a Sandbox),
    Mesh(&'a Sandbox, &'a Cluster),
}

/// A history's figures.
#[derive(Clone, Debug, Default)]
pub struct Figures {
    pub steps: usize,
    pub tasks_checked: usize,
    pub runs: usize,
    pub reused: usize,
    /// Kills that came before the run was written down.
    pub early_kills: usize,
}

/// A wrong result: the kind, and everything needed to see it and replay it.
#[derive(Clone, Debug)]
pub struct Failure {
    pub kinds: BTreeSet<&'static str>,
    pub report: String,
}

/// The history runner: one farm folder, a run log, up to three outs.
pub struct History<'a> {
    mode: Mode<'a>,
    seed: u64,
    rng: Rng,
    plant: Plant,
    farm: Farm,
    root: PathBuf,
    farm_dir: PathBuf,
    runlog: PathBuf,
    outs: Vec<PathBuf>,
    /// (out, stage name, index) -> what it holds.
    held: BTreeMap<(usize, String, usize), Held>,
    /// Folders of tasks no longer in the farm, set aside under
    /// `<out>/.mesh-set-aside/`: still their keys' results while whole (a
    /// sweep grown back takes them).
    aside: Vec<(PathBuf, Held)>,
    /// Which outs were run, and with which farm (stage names and task counts).
    shape: BTreeMap<usize, BTreeMap<String, usize>>,
    /// Every `seen.txt` a run of a key produced.
    contents: HashMap<u64, BTreeSet<String>>,
    done: Vec<String>,
    /// The number of the farm's last run that mesh wrote down (`--json`'s
    /// `run`): a resume that reports it again resumed that run, as the
    /// killed one was not written down yet.
    last_run: u64,
    pub figures: Figures,
}

impl<'a> History<'a> {
    /// A history of seed `seed`; `base` is a folder of the sandbox of its own.
    pub fn new(mode: Mode<'a>, seed: u64, plant: Plant) -> History<'a> {
        let sb = match &mode {
            Mode::One(sb) | Mode::Mesh(sb, _) => *sb,
        };
        let root = sb.path().join(format!("h{seed}"));
        fs::create_dir_all(&root).expect("mkdir history");
        let mut rng = Rng::new(seed);
        let farm = Farm::generate(&mut rng, &format!("orc{seed}"));
        // On a mesh, the farm and outs are the hidden folders' children.
        let (farm_dir, outs) = match &mode {
            Mode::One(_) => (
                root.join("farm"),
                (0..OUTS).map(|k| root.join(format!("out{k}"))).collect(),
            ),
            Mode::Mesh(sb, _) => (
                sb.path().join("farm").join(format!("h{seed}")),
                (0..OUTS)
                    .map(|k| sb.path().join("out").join(format!("h{seed}-{k}")))
                    .collect(),
            ),
        };
        let runlog = root.join("runlog");
        History {
            mode,
            seed,
            rng,
            plant,
            farm,
            root,
            farm_dir,
            runlog,
            outs,
            held: BTreeMap::new(),
            aside: Vec::new(),
            shape: BTreeMap::new(),
            contents: HashMap::new(),
            done: Vec::new(),
            last_run: 0,
            figures: Figures::default(),
        }
    }

    fn mesh_mode(&self) -> bool {
        matches!(self.mode, Mode::Mesh(..))
    }

    /// Runs `steps` run-steps (each after 0 to 2 edits); the first failure ends it.
    pub fn run(&mut self, steps: usize) -> Result<(), Failure> {
        self.farm.write(&self.farm_dir, &self.runlog);
        for step in 0..steps {
            if step > 0 {
                for _ in 0..self.rng.below(3) {
                    if let Some(op) = self.gen_edit() {
                        self.apply(&op)?;
                    }
                }
            }
            let op = self.gen_run(step == 0);
            self.apply(&op)?;
        }
        Ok(())
    }

    /// An edit that leaves the farm valid, or none after a few tries.
    fn gen_edit(&mut self) -> Option<Op> {
        for _ in 0..20 {
            let op = self.random_edit();
            let mut f = self.farm.clone();
            if Self::edit(&mut f, &op) && f.expand(Plant::None).is_ok() {
                return Some(op);
            }
        }
        None
    }

    fn random_edit(&mut self) -> Op {
        let r = &mut self.rng;
        let file = r.below(FILES);
        let len = self.farm.files[file].len();
        let value = r.pick(&POOL).to_string();
        let stage = r.below(self.farm.stages.len());
        match r.below(100) {
            0..=19 => Op::SetLine {
                file,
                at: r.below(len),
                value,
            },
            20..=39 => Op::InsertLine {
                file,
                at: r.below(len + 1),
                value,
            },
            40..=59 => Op::DeleteLine {
                file,
                at: r.below(len),
            },
            60..=69 => {
                let st = &self.farm.stages[stage];
                let n = 1 + r.below(4);
                let at = r.below(4);
                let values = st
                    .vars
                    .iter()
                    .map(|v| match &v.src {
                        Src::List(l) => {
                            let mut l = l.clone();
                            // Grown, shrunk or one value changed, the same for a zip's lists.
                            if n == l.len() {
                                l[at % n] = value.clone();
                            } else {
                                l.resize(n, value.clone());
                            }
                            l
                        }
                        _ => Vec::new(),
                    })
                    .collect();
                Op::SetList { stage, values }
            }
            70..=74 => Op::SetRange {
                stage,
                var: r.below(2),
                end: 1 + r.below(4) as u32,
            },
            75..=87 => Op::Bump { stage },
            88..=93 => {
                let mut order = self.farm.order.clone();
                for i in (1..order.len()).rev() {
                    let j = r.below(i + 1);
                    order.swap(i, j);
                }
                Op::Reorder { order }
            }
            _ => {
                let run: Vec<&(usize, String, usize)> = self.held.keys().collect();
                if run.is_empty() {
                    return Op::Bump { stage };
                }
                let (out, name, index) = (*r.pick(&run)).clone();
                let stage = self
                    .farm
                    .stages
                    .iter()
                    .position(|s| s.name == name)
                    .unwrap_or(0);
                Op::Tamper { out, stage, index }
            }
        }
    }

    /// Applies an edit to a farm; false when it does not apply.
    fn edit(f: &mut Farm, op: &Op) -> bool {
        match op {
            Op::SetLine { file, at, value } => {
                let Some(l) = f.files[*file].get_mut(*at) else {
                    return false;
                };
                if l == value {
                    return false;
                }
                *l = value.clone();
            }
            Op::InsertLine { file, at, value } => f.files[*file].insert(*at, value.clone()),
            Op::DeleteLine { file, at } => {
                if f.files[*file].len() < 2 || *at >= f.files[*file].len() {
                    return false;
                }
                f.files[*file].remove(*at);
            }
            Op::SetList { stage, values } => {
                let st = &mut f.stages[*stage];
                let mut any = false;
                for (v, new) in st.vars.iter_mut().zip(values) {
                    if let Src::List(l) = &mut v.src {
                        if l != new {
                            *l = new.clone();
                            any = true;
                        }
                    }
                }
                return any;
            }
            Op::SetRange { stage, var, end } => {
                let Some(v) = f.stages[*stage].vars.get_mut(*var) else {
                    return false;
                };
                match &mut v.src {
                    Src::Range(n) if *n != *end => *n = *end,
                    _ => return false,
                }
            }
            Op::Bump { stage } => f.stages[*stage].version += 1,
            Op::Reorder { order } => {
                if *order == f.order {
                    return false;
                }
                f.order = order.clone();
            }
            Op::Tamper { .. } => {}
            _ => return false,
        }
        true
    }

    fn gen_run(&mut self, first: bool) -> Op {
        let run_outs: Vec<usize> = self.shape.keys().copied().collect();
        let r = &mut self.rng;
        // Mostly the outs already used, sometimes a new one.
        let out = if first || run_outs.is_empty() {
            0
        } else if r.pct(70) {
            *r.pick(&run_outs)
        } else {
            r.below(OUTS)
        };
        if matches!(self.mode, Mode::Mesh(..)) {
            if !first && r.pct(25) {
                let other = (out + 1 + r.below(OUTS - 1)) % OUTS;
                return Op::Parallel { outs: [out, other] };
            }
            return Op::Run { out };
        }
        if !first && r.pct(25) {
            return Op::Kill {
                out,
                ms: 20 + r.below(200) as u64,
                resume: r.pct(60),
            };
        }
        Op::Run { out }
    }

    fn apply(&mut self, op: &Op) -> Result<(), Failure> {
        self.done.push(format!("{op:?}"));
        if std::env::var_os("MESH_ORACLE_VERBOSE").is_some() {
            eprintln!("op: {op:?}");
        }
        if let Op::Tamper { out, stage, index } = op {
            let name = self.farm.stages[*stage].name.clone();
            let p = self.outs[*out]
                .join(&name)
                .join(index.to_string())
                .join("seen.txt");
            let mut text = fs::read_to_string(&p).unwrap_or_default();
            text.push_str("tampered\n");
            // A user's edit, a moment later than what mesh wrote.
            std::thread::sleep(Duration::from_millis(5));
            fs::write(&p, &text).expect("tamper");
            if let Some(h) = self.held.get_mut(&(*out, name, *index)) {
                for f in &mut h.files {
                    if f.0 == "seen.txt" {
                        f.3 = text.clone();
                    }
                }
            }
            return Ok(());
        }
        if !op.runs() {
            let ok = Self::edit(&mut self.farm, op);
            assert!(ok, "an edit generated valid does not apply: {op:?}");
            self.farm.write(&self.farm_dir, &self.runlog);
            return Ok(());
        }
        self.step(op)
    }

    /// One run step and every check after it.
    fn step(&mut self, op: &Op) -> Result<(), Failure> {
        self.figures.steps += 1;
        let ex = self
            .farm
            .expand(self.plant)
            .expect("a farm the model accepts");
        let mut errors: Vec<(&'static str, String)> = Vec::new();
        // Which keys some folder still holds untouched, before the step.
        let intact_before = self.intact_keys();
        let log_before = fs::read_to_string(&self.runlog).unwrap_or_default().len();
        let targets: Vec<usize> = match op {
            Op::Run { out } | Op::Kill { out, .. } => vec![*out],
            Op::Parallel { outs } => outs.to_vec(),
            _ => unreachable!(),
        };
        let mut killed_part = None;
        let mut intact_after_kill = None;
        let mut cached: Option<u64> = None;
        match (op, &self.mode) {
            (Op::Run { out }, Mode::One(sb)) => {
                let r = sb.mesh(&refs(&self.run_args(*out)));
                if r.code != Some(0) {
                    errors.push(("mesh failed", format!("{}\n{}", r.stdout, r.stderr)));
                } else {
                    cached = counted(&r);
                    self.last_run = run_of(&r).unwrap_or(self.last_run);
                }
            }
            (Op::Kill { out, ms, resume }, Mode::One(sb)) => {
                let bg = sb.spawn(&refs(&self.run_args(*out)));
                std::thread::sleep(Duration::from_millis(*ms));
                bg.signal(Signal::SIGKILL);
                let k = bg.wait();
                // Tasks left running by the killed mesh finish their line.
                std::thread::sleep(Duration::from_millis(100));
                killed_part = Some(fs::read_to_string(&self.runlog).unwrap_or_default().len());
                intact_after_kill = Some(self.intact_keys());
                if k.code != Some(0) {
                    let mut r = if *resume {
                        sb.mesh(&["resume", &self.farm.name, "--json"])
                    } else {
                        sb.mesh(&refs(&self.run_args(*out)))
                    };
                    let went = serde_json::from_str::<serde_json::Value>(&r.stdout)
                        .ok()
                        .and_then(|j| j["out"].as_str().map(PathBuf::from));
                    let same_run = run_of(&r).is_some_and(|n| n <= self.last_run);
                    if *resume
                        && r.code == Some(0)
                        && (went.as_deref() != Some(&*self.outs[*out]) || same_run)
                    {
                        // Killed before the run was written down: resume
                        // finds the last run, finished; run it again.
                        if std::env::var_os("MESH_ORACLE_VERBOSE").is_some() {
                            eprintln!("resume went to {went:?}:\n{}\n{}", r.stdout, r.stderr);
                        }
                        self.figures.early_kills += 1;
                        r = sb.mesh(&refs(&self.run_args(*out)));
                    }
                    if r.code != Some(0) {
                        errors.push((
                            "mesh failed",
                            format!("after the kill: {}\n{}", r.stdout, r.stderr),
                        ));
                    } else {
                        self.last_run = run_of(&r).unwrap_or(self.last_run);
                    }
                } else {
                    killed_part = None;
                    intact_after_kill = None;
                    cached = counted(&k);
                    self.last_run = run_of(&k).unwrap_or(self.last_run);
                }
            }
            (Op::Run { out }, Mode::Mesh(_, c)) => {
                let r = c.mesh(0, &refs(&self.submit_args(*out)));
                if r.code != Some(0) {
                    errors.push(("mesh failed", format!("{}\n{}", r.stdout, r.stderr)));
                }
            }
            (Op::Parallel { outs }, Mode::Mesh(_, c)) => {
                let a = c.mesh_start(0, &refs(&self.submit_args(outs[0])));
                let b = c.mesh_start(0, &refs(&self.submit_args(outs[1])));
                for (r, o) in [(a.wait(), outs[0]), (b.wait(), outs[1])] {
                    if r.code != Some(0) {
                        errors.push((
                            "mesh failed",
                            format!("into out{o}: {}\n{}", r.stdout, r.stderr),
                        ));
                    }
                }
            }
            _ => unreachable!("{op:?} in this mode"),
        }
        let log = fs::read_to_string(&self.runlog).unwrap_or_default();
        let (ends_all, ends_killed, ends_after) = {
            let part = |a: usize, b: usize| ends(log.get(a..b).unwrap_or(""));
            let k = killed_part.unwrap_or(log_before);
            (
                part(log_before, log.len()),
                part(log_before, k),
                part(k, log.len()),
            )
        };
        if std::env::var_os("MESH_ORACLE_VERBOSE").is_some() {
            self.say_what_ran(&ex, &ends_all, &ends_killed);
        }
        let starts_killed = killed_part.map_or(BTreeSet::new(), |k| {
            starts(log.get(log_before..k).unwrap_or(""))
        });
        if errors.is_empty() {
            let seen = Seen {
                intact_before: &intact_before,
                intact_after_kill: &intact_after_kill,
                ends_all: &ends_all,
                ends_killed: &ends_killed,
                ends_after: &ends_after,
                starts_killed: &starts_killed,
                cached,
            };
            self.check_step(&ex, &targets, op, &seen, &mut errors);
        }
        if errors.is_empty() {
            return Ok(());
        }
        Err(self.failure(&errors))
    }

    /// The farm, what each task ran, and each task's key, for
    /// `MESH_ORACLE_VERBOSE`.
    fn say_what_ran(
        &self,
        ex: &Expanded,
        ends_all: &BTreeMap<(String, usize), usize>,
        ends_killed: &BTreeMap<(String, usize), usize>,
    ) {
        eprintln!(
            "{}ran: {:?}\nkilled part: {:?}",
            self.farm.describe(&self.runlog),
            ends_all,
            ends_killed
        );
        for (s, tasks) in ex.tasks.iter().enumerate() {
            for (i, t) in tasks.iter().enumerate() {
                eprintln!(
                    "  {}/{i} key {:016x} {}",
                    self.farm.stages[s].name, t.key, t.id
                );
            }
        }
    }

    /// The step's wrong results, with all it takes to see and replay them.
    fn failure(&self, errors: &[(&'static str, String)]) -> Failure {
        let kinds = errors.iter().map(|e| e.0).collect();
        let mut report = format!(
            "oracle: seed {} ({}) failed at step {} after: {}\n",
            self.seed,
            if self.mesh_mode() { "mesh" } else { "one node" },
            self.figures.steps,
            self.done.join("; ")
        );
        for (k, e) in errors.iter().take(12) {
            let _ = writeln!(report, "  {k}: {e}");
        }
        if errors.len() > 12 {
            let _ = writeln!(report, "  ... {} more", errors.len() - 12);
        }
        report.push_str(&self.farm.describe(&self.runlog));
        let _ = writeln!(
            report,
            "replay: MESH_ORACLE_SEED={} cargo test -p mesh-cli --test e2e oracle -- --nocapture",
            self.seed
        );
        Failure { kinds, report }
    }

    fn run_args(&self, out: usize) -> Vec<String> {
        self.args("run", out, "--json")
    }

    fn submit_args(&self, out: usize) -> Vec<String> {
        self.args("submit", out, "--wait")
    }

    /// `mesh VERB <farm file> --out <out> LAST`.
    fn args(&self, verb: &str, out: usize, last: &str) -> Vec<String> {
        let farm = self.farm_dir.join("farm.toml");
        let out = &self.outs[out];
        [
            verb,
            &*farm.to_string_lossy(),
            "--out",
            &*out.to_string_lossy(),
            last,
        ]
        .map(String::from)
        .to_vec()
    }

    /// Keys some remembered folder holds with its files unchanged on disk.
    fn intact_keys(&self) -> BTreeSet<u64> {
        let held = self.held.iter().map(|((out, stage, index), h)| {
            (self.outs[*out].join(stage).join(index.to_string()), h)
        });
        let aside = self.aside.iter().map(|(dir, h)| (dir.clone(), h));
        held.chain(aside)
            .filter(|(dir, h)| whole(dir, h))
            .map(|(_, h)| h.key)
            .collect()
    }

    fn check_step(
        &mut self,
        ex: &Expanded,
        targets: &[usize],
        op: &Op,
        seen: &Seen,
        errors: &mut Vec<(&'static str, String)>,
    ) {
        let Seen {
            intact_before,
            intact_after_kill,
            ends_all,
            ends_killed,
            ends_after,
            starts_killed,
            cached,
        } = *seen;
        let parallel = targets.len() > 1;
        let mut not_run = 0u64;
        // Reruns and runs, once per task (not per out).
        for (s, tasks) in ex.tasks.iter().enumerate() {
            let name = &self.farm.stages[s].name;
            for (i, t) in tasks.iter().enumerate() {
                let id = (name.clone(), i);
                let n = ends_all.get(&id).copied().unwrap_or(0);
                let reusable = self.plant != Plant::NothingReused && intact_before.contains(&t.key);
                if n == 0 {
                    not_run += 1;
                }
                match intact_after_kill {
                    None => {
                        if reusable && n > 0 {
                            errors.push(("needless rerun", format!("{name}/{i} ({}) ran {n} time(s), though its key's outputs were intact", t.id)));
                        }
                        if !reusable && n == 0 {
                            errors.push((
                                "missing run",
                                format!(
                                    "{name}/{i} ({}) has a key no folder holds, yet it did not run",
                                    t.id
                                ),
                            ));
                        }
                        if n > targets.len() {
                            errors.push((
                                "ran twice",
                                format!("{name}/{i} ({}) ran {n} times", t.id),
                            ));
                        }
                    }
                    Some(after_kill) => {
                        let k = ends_killed.get(&id).copied().unwrap_or(0);
                        let a = ends_after.get(&id).copied().unwrap_or(0);
                        if reusable && k > 0 {
                            errors.push(("needless rerun", format!("{name}/{i} ({}) ran before the kill, though its key's outputs were intact", t.id)));
                        }
                        // After the kill: at least once, and again only if
                        // it was running then or the kill cost its outputs.
                        let still = after_kill.contains(&t.key);
                        if a > 0 && still && !starts_killed.contains(&id) && reusable {
                            errors.push(("needless rerun", format!("{name}/{i} ({}) ran after the kill, though its key's outputs were intact and it was not running", t.id)));
                        }
                        if !reusable && n == 0 {
                            errors.push((
                                "missing run",
                                format!("{name}/{i} ({}) has a new key, yet it did not run", t.id),
                            ));
                        }
                    }
                }
                if n > 0 {
                    self.figures.runs += 1;
                } else {
                    self.figures.reused += 1;
                }
            }
        }
        if let Some(c) = cached {
            if !parallel && c != not_run && errors.is_empty() {
                errors.push((
                    "wrong count",
                    format!("--json says {c} cached, {not_run} tasks did not run"),
                ));
            }
        }
        let _ = op;
        for &out in targets {
            self.check_out(ex, out, intact_before, ends_all, errors);
        }
        // The other outs are as they were left.
        for (&out, _) in self.shape.clone().iter() {
            if !targets.contains(&out) {
                self.check_untouched(out, errors);
            }
        }
    }

    /// `out` holds exactly the current farm, every file as the model says.
    fn check_out(
        &mut self,
        ex: &Expanded,
        out: usize,
        intact_before: &BTreeSet<u64>,
        ends_all: &BTreeMap<(String, usize), usize>,
        errors: &mut Vec<(&'static str, String)>,
    ) {
        let dir = self.outs[out].clone();
        let mut want: BTreeMap<String, usize> = BTreeMap::new();
        for (s, tasks) in ex.tasks.iter().enumerate() {
            want.insert(self.farm.stages[s].name.clone(), tasks.len());
        }
        self.check_folders(ex, out, &want, errors);
        self.follow_set_aside(out, &want);
        self.held.retain(|(o, ..), _| *o != out);
        // The files: id.txt exactly; seen.txt exactly for a key that had to
        // run, else one this key's runs wrote, the same up to indices.
        for (s, tasks) in ex.tasks.iter().enumerate() {
            let name = self.farm.stages[s].name.clone();
            for (i, t) in tasks.iter().enumerate() {
                self.figures.tasks_checked += 1;
                let tdir = dir.join(&name).join(i.to_string());
                let id = fs::read_to_string(tdir.join("id.txt"));
                let seen = fs::read_to_string(tdir.join("seen.txt"));
                let (Ok(id), Ok(seen)) = (id, seen) else {
                    errors.push((
                        "missing output",
                        format!("out{out}/{name}/{i} ({}) lacks id.txt or seen.txt", t.id),
                    ));
                    continue;
                };
                if id != format!("{}\n", t.id) {
                    errors.push((
                        "wrong value",
                        format!(
                            "out{out}/{name}/{i}/id.txt says {:?}, the task is {:?}",
                            id.trim_end(),
                            t.id
                        ),
                    ));
                }
                let old = intact_before.contains(&t.key);
                let ran = ends_all.contains_key(&(name.clone(), i));
                let known = self.contents.entry(t.key).or_default();
                // A new key must see exactly the model's view; one that ran
                // again may also see what a run of its key saw before.
                let fresh = !old || known.is_empty();
                if fresh || ran {
                    if seen != t.seen && (fresh || !known.contains(&seen)) {
                        errors.push((
                            "wrong view",
                            format!(
                                "out{out}/{name}/{i} ({}) saw:\n{}    wanted:\n{}",
                                t.id,
                                indent(&seen),
                                indent(&t.seen)
                            ),
                        ));
                    }
                } else if strip(&seen) != strip(&t.seen) || !known.contains(&seen) {
                    errors.push(("wrong view", format!("out{out}/{name}/{i} ({}) reused, saw:\n{}    wanted (up to indices):\n{}", t.id, indent(&seen), indent(&t.seen))));
                }
                known.insert(seen.clone());
                let files = [("id.txt", id), ("seen.txt", seen)]
                    .into_iter()
                    .map(|(f, text)| {
                        let m = fs::metadata(tdir.join(f)).expect("read just now");
                        (
                            f.to_string(),
                            m.len(),
                            m.mtime() * 1_000_000_000 + m.mtime_nsec(),
                            text,
                        )
                    })
                    .collect();
                self.held
                    .insert((out, name.clone(), i), Held { key: t.key, files });
            }
        }
        self.shape.insert(out, want);
    }

    /// The folders of `out`: exactly the current tasks' (`want`: each
    /// stage's task count), each with its two files alone, and each
    /// stage's `tasks.tsv` as the model lists its tasks.
    fn check_folders(
        &self,
        ex: &Expanded,
        out: usize,
        want: &BTreeMap<String, usize>,
        errors: &mut Vec<(&'static str, String)>,
    ) {
        let dir = &self.outs[out];
        let mut stages_found = BTreeSet::new();
        for e in fs::read_dir(dir).into_iter().flatten().flatten() {
            let n = e.file_name().to_string_lossy().into_owned();
            if n == ".mesh-set-aside" {
                continue;
            }
            if !want.contains_key(&n) {
                errors.push((
                    "stale folder",
                    format!("out{out} has `{n}`, no stage of the farm"),
                ));
                continue;
            }
            stages_found.insert(n.clone());
            let count = want[&n];
            for t in fs::read_dir(e.path()).into_iter().flatten().flatten() {
                let tn = t.file_name().to_string_lossy().into_owned();
                if tn == "tasks.tsv" {
                    let sidx = self
                        .farm
                        .stages
                        .iter()
                        .position(|x| x.name == n)
                        .expect("a stage");
                    let text = fs::read_to_string(t.path()).unwrap_or_default();
                    let want_tsv = manifest(&ex.names[sidx], &ex.tasks[sidx]);
                    if text != want_tsv {
                        errors.push((
                            "wrong manifest",
                            format!("out{out}/{n}/tasks.tsv is {text:?}, wanted {want_tsv:?}"),
                        ));
                    }
                    continue;
                }
                match tn.parse::<usize>() {
                    Ok(i) if i < count && tn == i.to_string() => {
                        let mut files: Vec<String> = fs::read_dir(t.path())
                            .into_iter()
                            .flatten()
                            .flatten()
                            .map(|f| {
                                let kind = match f.file_type() {
                                    Ok(k) if k.is_file() => "",
                                    Ok(k) if k.is_symlink() => " (a link)",
                                    _ => " (not a file)",
                                };
                                format!("{}{kind}", f.file_name().to_string_lossy())
                            })
                            .collect();
                        files.sort();
                        if files != ["id.txt", "seen.txt"] {
                            errors
                                .push(("stale files", format!("out{out}/{n}/{i} holds {files:?}")));
                        }
                    }
                    _ => errors.push((
                        "stale folder",
                        format!("out{out}/{n}/{tn} is no task of the farm ({count} tasks)"),
                    )),
                }
            }
        }
        for n in want.keys() {
            if !stages_found.contains(n) {
                errors.push((
                    "missing output",
                    format!("out{out} has no folder for stage {n}"),
                ));
            }
        }
    }

    /// Folders of `out`'s tasks the farm no longer has (`want`: each
    /// stage's task count) went to the newest `.mesh-set-aside/<when>/`
    /// that has them: what they hold is remembered there.
    fn follow_set_aside(&mut self, out: usize, want: &BTreeMap<String, usize>) {
        let mut whens: Vec<PathBuf> = fs::read_dir(self.outs[out].join(".mesh-set-aside"))
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .collect();
        whens.sort();
        for ((o, stage, index), h) in &self.held {
            let gone = want.get(stage).is_none_or(|n| index >= n);
            if *o != out || !gone {
                continue;
            }
            let rel = Path::new(stage).join(index.to_string());
            if let Some(at) = whens
                .iter()
                .rev()
                .map(|w| w.join(&rel))
                .find(|p| p.is_dir())
            {
                self.aside.push((at, h.clone()));
            }
        }
    }

    /// An out no step wrote to holds what it held.
    fn check_untouched(&self, out: usize, errors: &mut Vec<(&'static str, String)>) {
        for ((o, stage, index), h) in &self.held {
            if *o != out {
                continue;
            }
            let tdir = self.outs[out].join(stage).join(index.to_string());
            for (f, _, _, text) in &h.files {
                let now = fs::read_to_string(tdir.join(f)).unwrap_or_else(|e| format!("<{e}>"));
                if now != *text {
                    errors.push(("other out changed", format!("out{out}/{stage}/{index}/{f} changed though no step ran there: {now:?}, was {text:?}")));
                }
            }
        }
    }
}

/// A stage's `tasks.tsv`: a header of its variables (`names`), then each
/// task's index and values.
fn manifest(names: &[String], tasks: &[Task]) -> String {
    let mut tsv = "index".to_string();
    for v in names {
        let _ = write!(tsv, "\t{v}");
    }
    tsv.push('\n');
    for (i, task) in tasks.iter().enumerate() {
        let _ = write!(tsv, "{i}");
        for v in &task.values {
            let _ = write!(tsv, "\t{v}");
        }
        tsv.push('\n');
    }
    tsv
}

/// Whether `dir` still holds the files of `h` untouched (size and
/// modification time, the test mesh makes).
fn whole(dir: &Path, h: &Held) -> bool {
    h.files.iter().all(|(f, size, mtime, _)| {
        fs::metadata(dir.join(f))
            .is_ok_and(|m| m.len() == *size && m.mtime() * 1_000_000_000 + m.mtime_nsec() == *mtime)
    })
}

fn refs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// The run number `--json` reports.
fn run_of(r: &Run) -> Option<u64> {
    serde_json::from_str::<serde_json::Value>(&r.stdout)
        .ok()
        .and_then(|j| j["run"].as_u64())
}

fn counted(r: &Run) -> Option<u64> {
    serde_json::from_str::<serde_json::Value>(&r.stdout)
        .ok()
        .and_then(|j| j["counts"]["cached"].as_u64())
}

fn log_lines<'b>(log: &'b str, word: &str) -> impl Iterator<Item = (String, usize)> + 'b {
    let word = format!("{word} ");
    log.lines().filter_map(move |l| {
        let rest = l.strip_prefix(&word)?;
        let (s, i) = rest.split_once(' ')?;
        Some((s.to_string(), i.parse().ok()?))
    })
}

fn ends(log: &str) -> BTreeMap<(String, usize), usize> {
    let mut m = BTreeMap::new();
    for k in log_lines(log, "end") {
        *m.entry(k).or_insert(0) += 1;
    }
    m
}

fn starts(log: &str) -> BTreeSet<(String, usize)> {
    log_lines(log, "start").collect()
}

/// A `seen.txt` with the indices taken out, sorted.
fn strip(seen: &str) -> Vec<String> {
    let mut v: Vec<String> = seen
        .lines()
        .map(|l| {
            let mut parts = l.splitn(4, '/');
            let (dot, stage, _index, rest) =
                (parts.next(), parts.next(), parts.next(), parts.next());
            format!(
                "{}/{}/#/{}",
                dot.unwrap_or(""),
                stage.unwrap_or(""),
                rest.unwrap_or("")
            )
        })
        .collect();
    v.sort();
    v
}

fn indent(s: &str) -> String {
    if s.is_empty() {
        return "      (nothing)\n".into();
    }
    s.lines().map(|l| format!("      {l}\n")).collect()
}

/// Runs `histories` histories of `steps` run-steps from seed `first` on:
/// the figures summed, and every failure.
pub fn run_many(
    mode_of: &mut dyn FnMut() -> Option<(Sandbox, Option<Cluster>)>,
    seeds: &[u64],
    steps: usize,
    plant: Plant,
) -> (Figures, usize, Vec<Failure>) {
    let mut total = Figures::default();
    let mut fails = Vec::new();
    let mut ran = 0;
    let mut env: Option<(Sandbox, Option<Cluster>)> = None;
    for &seed in seeds {
        if env.is_none() {
            env = mode_of();
        }
        let Some((sb, c)) = &env else {
            break;
        };
        let mode = match c {
            Some(c) => Mode::Mesh(sb, c),
            None => Mode::One(sb),
        };
        let mut h = History::new(mode, seed, plant);
        let r = h.run(steps);
        ran += 1;
        total.steps += h.figures.steps;
        total.tasks_checked += h.figures.tasks_checked;
        total.runs += h.figures.runs;
        total.reused += h.figures.reused;
        total.early_kills += h.figures.early_kills;
        if let Err(f) = r {
            fails.push(f);
        }
        let _ = fs::remove_dir_all(&h.root);
        // One-node histories share nothing: a fresh state folder every 25.
        if c.is_none() && ran % 25 == 0 {
            env = None;
        }
    }
    (total, ran, fails)
}

/// What one step of a history left to check: the keys whose outputs were
/// intact before it (and after a kill in it), each task's runs (in all,
/// before a kill, after it), the runs a kill cut short, and how many tasks
/// the run said it reused.
struct Seen<'a> {
    intact_before: &'a BTreeSet<u64>,
    intact_after_kill: &'a Option<BTreeSet<u64>>,
    ends_all: &'a BTreeMap<(String, usize), usize>,
    ends_killed: &'a BTreeMap<(String, usize), usize>,
    ends_after: &'a BTreeMap<(String, usize), usize>,
    starts_killed: &'a BTreeSet<(String, usize)>,
    cached: Option<u64>,
}
