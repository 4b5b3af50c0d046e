//! A farm's per-task dependencies (keyed and listed, see [`DepOn`]) worked out from its sweeps into compact tables: for each edge, which upstream tasks each task waits for, and which tasks each upstream task lets go.
//!
//! A farm file says these dependencies by rule (a key of sweep variables,
//! a template naming parents), never edge by edge. They are expanded once
//! per farm into two index tables an edge (`Csr`: offsets and items,
//! 4 bytes each), so a million-task farm costs some megabytes, and the
//! engine asks "who does task i wait for" and "whom does task j release"
//! in constant time.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use serde::{Deserialize, Serialize};

use super::{FarmDef, RenderCx, StageDef, Stages, Sweep, TaskRef, Template};

/// A dependency on some of another stage's tasks, chosen per task.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Dep {
    /// The stage depended on.
    pub stage: u32,
    /// Which of its tasks each task of this stage waits for.
    pub on: DepOn,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
/// How a [`Dep`] chooses the upstream tasks each task waits for.
pub enum DepOn {
    /// The upstream tasks whose values of variables `up` equal this task's
    /// values of variables `down` (positions in each stage's sweep, pair by
    /// pair): fan-in and fan-out per key, their product, and pairs by key
    /// of stages of any sizes.
    Keyed {
        /// This stage's key variables, as places in its sweep.
        down: Vec<u32>,
        /// The upstream stage's key variables, as places in its sweep.
        up: Vec<u32>,
    },
    /// The upstream tasks named by the words (split at whitespace and
    /// commas) of `tasks` as rendered for this task: indices, or values of
    /// the upstream's variable `var`.
    Listed {
        /// Rendered for each task into the words that name its upstream tasks.
        tasks: Template,
        /// The upstream variable (its place in the sweep) whose values the
        /// words are; `None`: the words are task indices.
        var: Option<u32>,
    },
    /// Task `i` of a grown stage waits for the task it grew from, `i / per`
    /// (see [`super::Grown`]): the loader adds it, never the user.
    Grown {
        /// The places kept for each upstream task (see [`super::Grown`]).
        per: u32,
    },
}

/// A table of lists: list `i` is `items[offsets[i]..offsets[i + 1]]`.
#[derive(Clone, Debug, Default)]
pub struct Csr {
    offsets: Vec<u32>,
    items: Vec<u32>,
}

impl Csr {
    /// List `i`; empty past the last.
    pub fn get(&self, i: usize) -> &[u32] {
        match (self.offsets.get(i), self.offsets.get(i + 1)) {
            (Some(&a), Some(&b)) => &self.items[a as usize..b as usize],
            _ => &[],
        }
    }

    /// The lists made by `lists`, one per index `0..n`.
    fn build(n: usize, mut lists: impl FnMut(usize, &mut Vec<u32>)) -> Csr {
        let mut offsets = Vec::with_capacity(n + 1);
        let mut items = Vec::new();
        offsets.push(0);
        for i in 0..n {
            lists(i, &mut items);
            offsets.push(items.len() as u32);
        }
        Csr { offsets, items }
    }

    /// The same relation read the other way: for each of `m` targets, the
    /// sources that list it.
    fn transpose(&self, m: usize) -> Csr {
        let mut counts = vec![0u32; m + 1];
        for &t in &self.items {
            counts[t as usize + 1] += 1;
        }
        for k in 1..=m {
            counts[k] += counts[k - 1];
        }
        let mut items = vec![0u32; self.items.len()];
        let mut at = counts.clone();
        for src in 0..self.offsets.len().saturating_sub(1) {
            for &t in self.get(src) {
                items[at[t as usize] as usize] = src as u32;
                at[t as usize] += 1;
            }
        }
        Csr {
            offsets: counts,
            items,
        }
    }

    /// The memory the table holds, in bytes.
    pub fn bytes(&self) -> usize {
        (self.offsets.len() + self.items.len()) * 4
    }

    /// The number of items over all lists (edges, for a dependency).
    pub fn items_len(&self) -> usize {
        self.items.len()
    }
}

/// One expanded [`Dep`] of a stage.
#[derive(Clone, Debug, Default)]
pub struct Edge {
    /// The stage depended on.
    pub up_stage: u32,
    /// Per task of the stage: the upstream tasks it waits for.
    pub ups: Csr,
    /// Per upstream task: the tasks of the stage waiting for it.
    pub downs: Csr,
}

/// Every stage's expanded [`Dep`]s, in the order the stage lists them.
#[derive(Clone, Debug, Default)]
pub struct Graph {
    /// Per stage, in farm order: one [`Edge`] for each of its `deps`
    /// (shared with the graph of each later generation of an open farm).
    pub stages: imbl::Vector<Arc<[Edge]>>,
}

/// A farm's dependencies that do not expand: the stage, and what is wrong.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("stage `{stage}`: {why}")]
pub struct GraphError {
    /// The name of the stage whose `deps` do not expand.
    pub stage: String,
    /// What is wrong with them.
    pub why: DepError,
}

/// What is wrong with one of a stage's `deps`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DepError {
    /// A dependency names a stage index the farm does not have.
    #[error("it depends on a stage that is not there")]
    NoStage,
    /// A dependency keyed by sweep variables that does not expand.
    #[error("keyed on stage `{up}`: {why}")]
    Keyed {
        /// The upstream stage's name.
        up: String,
        /// Why the key does not expand.
        why: KeyedError,
    },
    /// A dependency listed per task that names tasks that are not there.
    #[error("listed from stage `{up}`: {why}")]
    Listed {
        /// The upstream stage's name.
        up: String,
        /// Why the list does not expand.
        why: ListedError,
    },
}

/// Why a dependency keyed by sweep variables does not expand.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum KeyedError {
    /// The key's variables have more combinations of values upstream than a
    /// 64-bit number can count.
    #[error("too many combinations of the key's values")]
    TooMany,
    /// No task of the stage has a key that a task upstream has (both stages
    /// having tasks).
    #[error("no task's key matches a task of that stage (do the values agree?)")]
    NoMatch,
}

/// Why a dependency listed per task does not expand.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ListedError {
    /// A word that is no value of the upstream variable.
    #[error("task {task} names `{word}`, which no task has")]
    NoSuchValue {
        /// The index of the task whose list has the word.
        task: usize,
        /// The word as rendered.
        word: String,
    },
    /// A word that is not the index of an upstream task.
    #[error("task {task} names `{word}`, not a task index (0 to {last})")]
    NotAnIndex {
        /// The index of the task whose list has the word.
        task: usize,
        /// The word as rendered.
        word: String,
        /// The upstream stage's last index.
        last: u32,
    },
}

impl Graph {
    /// Expands every stage's `deps`. An error names the stage and says what
    /// is wrong (a word that is no task, a key that matches nothing).
    pub fn build(def: &FarmDef) -> Result<Graph, GraphError> {
        Graph::build_parts(&def.name, &def.stages).map_err(|(s, _, why)| GraphError {
            stage: def.stages[s].name.clone(),
            why,
        })
    }

    /// As [`Graph::build`], from a farm's name and stages; an error gives
    /// the stage and which of its `deps` it is about.
    pub fn build_parts(name: &str, stages_def: &Stages) -> Result<Graph, (usize, usize, DepError)> {
        Graph::build_after(None, name, stages_def)
    }

    /// As [`Graph::build_parts`], taking the edges of the stages `before`
    /// has as they are: those of the generation an open farm grew from,
    /// whose stages come first unchanged (a stage's edges depend on it and
    /// the stages it waits for, all before it). A growth costs what it adds.
    pub fn build_after(
        before: Option<&Graph>,
        name: &str,
        stages_def: &Stages,
    ) -> Result<Graph, (usize, usize, DepError)> {
        // The edges before shared, not copied: a persistent vector's clone.
        let mut stages = before.map_or_else(imbl::Vector::new, |b| b.stages.clone());
        debug_assert!(stages.len() <= stages_def.len());
        stages.truncate(stages_def.len());
        let old = stages.len();
        for (s, stage) in super::from_on(stages_def, old) {
            let mut edges = Vec::with_capacity(stage.deps.len());
            for (n, dep) in stage.deps.iter().enumerate() {
                let Some(up) = stages_def.get(dep.stage as usize) else {
                    return Err((s, n, DepError::NoStage));
                };
                let ups = match &dep.on {
                    DepOn::Keyed { down, up: up_vars } => {
                        keyed(&stage.sweep, down, &up.sweep, up_vars).map_err(|why| {
                            let up = up.name.clone();
                            (s, n, DepError::Keyed { up, why })
                        })?
                    }
                    DepOn::Listed { tasks, var } => {
                        listed(name, stage, tasks, up, *var).map_err(|why| {
                            let up = up.name.clone();
                            (s, n, DepError::Listed { up, why })
                        })?
                    }
                    DepOn::Grown { per } => {
                        let per = (*per).max(1);
                        Csr::build(stage.len() as usize, |i, items| items.push(i as u32 / per))
                    }
                };
                let downs = ups.transpose(up.len() as usize);
                edges.push(Edge {
                    up_stage: dep.stage,
                    ups,
                    downs,
                });
            }
            stages.push_back(edges.into());
        }
        Ok(Graph { stages })
    }

    /// The memory the tables of every edge hold, in bytes.
    pub fn bytes(&self) -> usize {
        self.stages
            .iter()
            .flat_map(|s| s.iter())
            .map(|e| e.ups.bytes() + e.downs.bytes())
            .sum()
    }
}

/// A farm's tables derived from its definition, each built the first time
/// it is asked for and kept with the farm (never sent or stored: any node
/// builds the same ones): its [`Graph`], the [`Ordinals`] of its sweeps'
/// values, and which stages are grown. A later generation of an open farm
/// keeps the tables of the one it grew from, which its own are built on:
/// a generation costs what it adds.
#[derive(Clone, Default)]
pub struct GraphCache {
    graph: OnceLock<Arc<Graph>>,
    ordinals: OnceLock<Arc<Ordinals>>,
    /// Of the first `.0` stages, those grown (see [`super::Grown`]).
    grown: OnceLock<(usize, Arc<[u32]>)>,
    /// Of the first `.0` stages, those named as a client's calls name the
    /// stage at another place (see [`GraphCache::misnamed`]).
    misnamed: OnceLock<(usize, Arc<[u32]>)>,
    before: Option<Box<Before>>,
}

/// The tables of the generation a farm grew from, to build on.
#[derive(Clone)]
struct Before {
    graph: Option<Arc<Graph>>,
    grown: Option<(usize, Arc<[u32]>)>,
    misnamed: Option<(usize, Arc<[u32]>)>,
}

impl GraphCache {
    /// A cache holding `g` already (the loader built it to check the farm).
    pub fn ready(g: Graph) -> GraphCache {
        GraphCache {
            graph: OnceLock::from(Arc::new(g)),
            ..GraphCache::default()
        }
    }

    /// The cache of a later generation of the farm `before` is the cache
    /// of: nothing built, the tables before kept to build on.
    pub fn after(before: &GraphCache) -> GraphCache {
        GraphCache::default().built_on(before)
    }

    /// This cache of a later generation of the farm `before` is the cache
    /// of, keeping what it built and, for what it has not, the tables
    /// before (or those they were to be built on).
    pub fn built_on(self, before: &GraphCache) -> GraphCache {
        let was = before.before.as_deref();
        let graph = before.graph.get().or(was.and_then(|b| b.graph.as_ref()));
        let grown = before.grown.get().or(was.and_then(|b| b.grown.as_ref()));
        let misnamed = before
            .misnamed
            .get()
            .or(was.and_then(|b| b.misnamed.as_ref()));
        GraphCache {
            before: Some(Box::new(Before {
                graph: graph.cloned(),
                grown: grown.cloned(),
                misnamed: misnamed.cloned(),
            })),
            ..self
        }
    }

    /// Its graph is built, or will be built on one of a generation before.
    pub fn builds_on_some(&self) -> bool {
        self.graph.get().is_some() || self.before.as_ref().is_some_and(|b| b.graph.is_some())
    }

    /// The [`Graph`], when built already.
    pub fn built(&self) -> Option<&Arc<Graph>> {
        self.graph.get()
    }

    /// The stages of `def` (the farm holding this cache) that are grown,
    /// ascending.
    pub fn grown(&self, def: &FarmDef) -> &[u32] {
        let seed = self.before.as_ref().and_then(|b| b.grown.as_ref());
        kept_stages(&self.grown, seed, def, |_, st| st.sweep.grown().is_some())
    }

    /// The stages of `def` (the farm holding this cache) named `c<n>`, as
    /// a client's calls name the stage at place `n`, at another place than
    /// `n`: those a growth of calls would give a second stage of their name.
    /// Found once per stage, as the farm grows, not at each growth.
    pub fn misnamed(&self, def: &FarmDef) -> &[u32] {
        let seed = self.before.as_ref().and_then(|b| b.misnamed.as_ref());
        kept_stages(&self.misnamed, seed, def, |s, st| {
            call_stage_place(&st.name).is_some_and(|n| n != s)
        })
    }

    /// The [`Ordinals`] of `def` (the farm holding this cache), built on first
    /// use.
    pub fn ordinals(&self, def: &FarmDef) -> &Arc<Ordinals> {
        self.ordinals.get_or_init(|| Arc::new(Ordinals::build(def)))
    }

    /// The [`Graph`] of `def` (the farm holding this cache), built on first
    /// use; panics if its dependencies do not expand, which a loaded farm's
    /// always do.
    pub fn get_or_build(&self, def: &FarmDef) -> &Arc<Graph> {
        self.graph.get_or_init(|| {
            // The loader built it once to check it: a farm that got this far
            // builds, and an error here is a farm made by hand (tests).
            let before = self.before.as_ref().and_then(|b| b.graph.as_deref());
            let g = Graph::build_after(before, &def.name, &def.stages);
            Arc::new(g.unwrap_or_else(|(s, _, why)| {
                let stage = def.stages[s].name.clone();
                panic!("a farm's dependencies: {}", GraphError { stage, why })
            }))
        })
    }
}

/// The place a client's calls give the stage of this name (`c<n>`: `n`);
/// `None` for a name they do not make.
pub fn call_stage_place(name: &str) -> Option<usize> {
    name.strip_prefix('c')?.parse().ok()
}

/// The stages of `def` that `keep` keeps, ascending, in `cell`: those of
/// the generation before (`seed`, the list and how many stages it looked
/// at) and those after it, each looked at once.
fn kept_stages<'a>(
    cell: &'a OnceLock<(usize, Arc<[u32]>)>,
    seed: Option<&(usize, Arc<[u32]>)>,
    def: &FarmDef,
    keep: impl Fn(usize, &StageDef) -> bool,
) -> &'a [u32] {
    let (_, list) = cell.get_or_init(|| {
        let (from, mut list) = seed.map_or((0, Vec::new()), |(n, l)| (*n, l.to_vec()));
        for (s, st) in super::from_on(&def.stages, from) {
            if keep(s, st) {
                list.push(s as u32);
            }
        }
        (def.stages.len(), list.into())
    });
    list
}

/// For each sweep variable that repeats a value, which repeat of its value
/// each position is (0 for the first `x`, 1 for the second...): what tells
/// two tasks of equal values apart in their content keys, without their
/// index (see `FarmDef::task_identity`). A variable whose values are all
/// different (every range, most lists) keeps nothing.
#[derive(Debug, Default)]
pub struct Ordinals {
    stages: Vec<Vec<Option<Box<[u32]>>>>,
}

impl Ordinals {
    /// Counts the repeats of every list and lines variable of `def`.
    pub fn build(def: &FarmDef) -> Ordinals {
        let stages = def
            .stages
            .iter()
            .map(|st| {
                st.sweep
                    .vars
                    .iter()
                    .map(|v| match v.values {
                        super::Values::List(_) | super::Values::Lines { .. } => {
                            let mut seen: HashMap<String, u32> = HashMap::new();
                            let mut ords = Vec::with_capacity(v.values.len() as usize);
                            let mut repeats = false;
                            v.values.for_each(|x| {
                                let n = seen.entry(x.to_string()).or_insert(0);
                                repeats |= *n > 0;
                                ords.push(*n);
                                *n += 1;
                            });
                            repeats.then(|| ords.into_boxed_slice())
                        }
                        _ => None,
                    })
                    .collect()
            })
            .collect();
        Ordinals { stages }
    }

    /// Which repeat of its value position `at` of variable `var` of stage
    /// `s` is.
    pub fn of(&self, s: u32, var: usize, at: u64) -> u32 {
        self.stages
            .get(s as usize)
            .and_then(|vars| vars.get(var))
            .and_then(|o| o.as_ref())
            .and_then(|o| o.get(at as usize).copied())
            .unwrap_or(0)
    }
}

impl PartialEq for GraphCache {
    /// Derived from the farm: two equal farms have equal graphs.
    fn eq(&self, _: &GraphCache) -> bool {
        true
    }
}

impl std::fmt::Debug for GraphCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GraphCache")
    }
}

impl Sweep {
    /// The position of task `index`'s value of variable `var` in that
    /// variable's values.
    pub fn value_index(&self, index: u32, var: usize) -> u64 {
        match self.mode {
            super::SweepMode::Zip => index as u64,
            super::SweepMode::Product => {
                let below: u64 = self.vars[var + 1..]
                    .iter()
                    .map(|v| v.values.len().max(1))
                    .product();
                (index as u64 / below) % self.vars[var].values.len().max(1)
            }
        }
    }
}

/// Each value of a variable, by its text, to its first position; and per
/// position, the first position of the same text (a zip or a lines file
/// may repeat a value, and tasks with equal values share a key).
fn positions(sweep: &Sweep, var: usize) -> (HashMap<String, u64>, Vec<u64>) {
    let values = &sweep.vars[var].values;
    let mut m = HashMap::with_capacity(values.len() as usize);
    let mut first = Vec::with_capacity(values.len() as usize);
    for i in 0..values.len() {
        first.push(*m.entry(values.get(i)).or_insert(i));
    }
    (m, first)
}

fn keyed(down: &Sweep, down_vars: &[u32], up: &Sweep, up_vars: &[u32]) -> Result<Csr, KeyedError> {
    // A key is the upstream positions of the values, in mixed radix: each
    // side's task is keyed without making a string per task.
    let radix: Vec<u64> = up_vars
        .iter()
        .map(|&v| up.vars[v as usize].values.len().max(1))
        .collect();
    if radix
        .iter()
        .try_fold(1u64, |a, &r| a.checked_mul(r))
        .is_none()
    {
        return Err(KeyedError::TooMany);
    }
    // Per variable of the key: the upstream's first position of each of its
    // values, and this stage's values as such positions (None: a value
    // upstream has not).
    let (firsts, mapped): (Vec<Vec<u64>>, Vec<Vec<Option<u64>>>) = down_vars
        .iter()
        .zip(up_vars)
        .map(|(&dv, &uv)| {
            let (at, first) = positions(up, uv as usize);
            let values = &down.vars[dv as usize].values;
            let mapped = (0..values.len())
                .map(|i| at.get(&values.get(i)).copied())
                .collect();
            (first, mapped)
        })
        .unzip();
    let up_n = up.len() as u32;
    let mut by_key: Vec<(u64, u32)> = (0..up_n)
        .map(|j| {
            let mut key = 0u64;
            for (k, &uv) in up_vars.iter().enumerate() {
                key = key * radix[k] + firsts[k][up.value_index(j, uv as usize) as usize];
            }
            (key, j)
        })
        .collect();
    by_key.sort_unstable();
    let down_n = down.len() as usize;
    let mut matched = false;
    let csr = Csr::build(down_n, |i, items| {
        let mut key = 0u64;
        for (k, &dv) in down_vars.iter().enumerate() {
            match mapped[k][down.value_index(i as u32, dv as usize) as usize] {
                Some(p) => key = key * radix[k] + p,
                None => return,
            }
        }
        let from = by_key.partition_point(|&(k, _)| k < key);
        let to = by_key.partition_point(|&(k, _)| k <= key);
        items.extend(by_key[from..to].iter().map(|&(_, j)| j));
        matched |= to > from;
    });
    if !matched && down_n > 0 && up_n > 0 {
        return Err(KeyedError::NoMatch);
    }
    Ok(csr)
}

fn listed(
    farm: &str,
    stage: &StageDef,
    tasks: &Template,
    up: &StageDef,
    var: Option<u32>,
) -> Result<Csr, ListedError> {
    let by_value: Option<HashMap<String, Vec<u32>>> = var.map(|v| {
        let mut m: HashMap<String, Vec<u32>> = HashMap::new();
        for j in 0..up.len() {
            let value = up.sweep.vars[v as usize]
                .values
                .get(up.sweep.value_index(j, v as usize));
            m.entry(value).or_default().push(j);
        }
        m
    });
    let mut err = None;
    let csr = Csr::build(stage.len() as usize, |i, items| {
        if err.is_some() {
            return;
        }
        let binding = stage.sweep.binding(i as u32);
        let cx = RenderCx {
            farm,
            stage: &stage.name,
            out: "",
            index: Some(i as u32),
            binding: &binding,
        };
        let words = tasks.render(&cx);
        let start = items.len();
        for w in words
            .split(|c: char| c.is_whitespace() || c == ',')
            .filter(|w| !w.is_empty())
        {
            match &by_value {
                Some(m) => match m.get(w) {
                    Some(js) => items.extend(js),
                    None => {
                        err = Some(ListedError::NoSuchValue {
                            task: i,
                            word: w.to_string(),
                        });
                        return;
                    }
                },
                None => match w.parse::<u32>() {
                    Ok(j) if j < up.len() => items.push(j),
                    _ => {
                        err = Some(ListedError::NotAnIndex {
                            task: i,
                            word: w.to_string(),
                            last: up.len().saturating_sub(1),
                        });
                        return;
                    }
                },
            }
        }
        items[start..].sort_unstable();
        let mut k = start;
        for r in start..items.len() {
            if r == start || items[r] != items[k - 1] {
                items[k] = items[r];
                k += 1;
            }
        }
        items.truncate(k);
    });
    match err {
        Some(e) => Err(e),
        None => Ok(csr),
    }
}

impl FarmDef {
    /// The farm's expanded per-task dependencies (see [`Graph`]).
    pub fn graph(&self) -> &Arc<Graph> {
        self.graph.get_or_build(self)
    }

    /// The tasks of `edge`'s upstream stage that task `t` waits for.
    pub fn ups(&self, t: TaskRef, edge: usize) -> (u32, &[u32]) {
        let e = &self.graph().stages[t.stage as usize][edge];
        (e.up_stage, e.ups.get(t.index as usize))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::farm::{CommandTemplate, StageDef, SweepMode, SweepVar, Values};

    fn list(vals: &[&str]) -> Values {
        Values::List(vals.iter().map(|v| v.to_string()).collect())
    }

    fn sweep(vars: &[(&str, &[&str])]) -> Sweep {
        Sweep {
            vars: vars
                .iter()
                .map(|(n, v)| SweepVar {
                    name: n.to_string(),
                    values: list(v),
                })
                .collect(),
            mode: SweepMode::Product,
        }
    }

    fn farm(stages: Vec<StageDef>) -> FarmDef {
        FarmDef {
            name: "f".into(),
            root: "/".into(),
            out: "/out".into(),
            stages: stages.into_iter().map(std::sync::Arc::new).collect(),
            graph: GraphCache::default(),
        }
    }

    fn stage(name: &str, sw: Sweep) -> StageDef {
        StageDef::new(name, CommandTemplate::Shell(Template::literal("true")), sw)
    }

    #[test]
    fn a_keyed_gather_waits_for_its_own_key_only_and_a_transpose_for_its_cell() {
        // split: sample x chrom; merge: one per chrom; cell: sample x chrom
        // of another order, keyed on both.
        let split = stage(
            "split",
            sweep(&[("sample", &["s1", "s2", "s3"]), ("chrom", &["1", "2"])]),
        );
        let mut merge = stage("merge", sweep(&[("chrom", &["2", "1"])]));
        merge.deps.push(Dep {
            stage: 0,
            on: DepOn::Keyed {
                down: vec![0],
                up: vec![1],
            },
        });
        let mut cell = stage(
            "cell",
            sweep(&[("chrom", &["1", "2"]), ("sample", &["s3", "s1", "s2"])]),
        );
        cell.deps.push(Dep {
            stage: 0,
            on: DepOn::Keyed {
                down: vec![0, 1],
                up: vec![1, 0],
            },
        });
        let f = farm(vec![split, merge, cell]);
        // merge/0 is chrom 2: split tasks 1, 3, 5.
        assert_eq!(f.ups(TaskRef::new(1, 0), 0), (0, &[1, 3, 5][..]));
        assert_eq!(f.ups(TaskRef::new(1, 1), 0), (0, &[0, 2, 4][..]));
        // cell/1 is chrom 1, sample s1: split task 0.
        assert_eq!(f.ups(TaskRef::new(2, 1), 0).1, &[0]);
        // cell/3 is chrom 2, sample s3: split task 5.
        assert_eq!(f.ups(TaskRef::new(2, 3), 0).1, &[5]);
        let g = f.graph();
        assert_eq!(g.stages[1][0].downs.get(3), &[0]);
        assert_eq!(g.stages[2][0].downs.get(0), &[1]);
        // Grown stage by stage, each generation's edges taken as they
        // were: the same tables, the earlier ones shared, not rebuilt.
        let mut grown = Graph::build_parts(&f.name, &f.stages.take(1)).expect("one stage");
        for n in 2..=3 {
            grown = Graph::build_after(Some(&grown), &f.name, &f.stages.take(n)).expect("grown");
        }
        assert_eq!(format!("{grown:?}"), format!("{g:?}"));
        let again = Graph::build_after(Some(&grown), &f.name, &f.stages).expect("same");
        assert!(Arc::ptr_eq(&again.stages[2], &grown.stages[2]));
    }

    #[test]
    fn a_listed_dependency_reads_indices_or_values_and_a_bad_word_is_an_error() {
        let img = stage("project", sweep(&[("img", &["a", "b", "c"])]));
        let mut diff = stage(
            "diff",
            Sweep {
                vars: vec![
                    SweepVar {
                        name: "l".into(),
                        values: list(&["a", "b"]),
                    },
                    SweepVar {
                        name: "r".into(),
                        values: list(&["b", "c"]),
                    },
                ],
                mode: SweepMode::Zip,
            },
        );
        diff.deps.push(Dep {
            stage: 0,
            on: DepOn::Listed {
                tasks: Template::parse("{l} {r}", &["l", "r"]).unwrap(),
                var: Some(0),
            },
        });
        let mut by_index = stage("sum", sweep(&[("k", &["x"])]));
        by_index.deps.push(Dep {
            stage: 0,
            on: DepOn::Listed {
                tasks: Template::literal("2, 0 2"),
                var: None,
            },
        });
        let f = farm(vec![img.clone(), diff, by_index]);
        assert_eq!(f.ups(TaskRef::new(1, 0), 0).1, &[0, 1]);
        assert_eq!(f.ups(TaskRef::new(1, 1), 0).1, &[1, 2]);
        assert_eq!(f.ups(TaskRef::new(2, 0), 0).1, &[0, 2]);
        let mut bad = stage("bad", sweep(&[]));
        bad.deps.push(Dep {
            stage: 0,
            on: DepOn::Listed {
                tasks: Template::literal("3"),
                var: None,
            },
        });
        let e = Graph::build(&farm(vec![img, bad])).unwrap_err();
        assert!(
            e.to_string()
                .ends_with("task 0 names `3`, not a task index (0 to 2)"),
            "{e}"
        );
    }

    #[test]
    fn a_key_repeated_in_a_zip_matches_every_task_that_has_it() {
        // A zip (or a lines file) may repeat a value: every task with it is
        // of that key, not only the first.
        let mut a = stage(
            "a",
            sweep(&[("x", &["1", "1", "2"]), ("y", &["a", "b", "c"])]),
        );
        a.sweep.mode = SweepMode::Zip;
        let mut b = stage("b", sweep(&[("x", &["2", "1", "1"])]));
        b.deps.push(Dep {
            stage: 0,
            on: DepOn::Keyed {
                down: vec![0],
                up: vec![0],
            },
        });
        let f = farm(vec![a, b]);
        assert_eq!(f.ups(TaskRef::new(1, 0), 0).1, &[2]);
        assert_eq!(f.ups(TaskRef::new(1, 1), 0).1, &[0, 1]);
        assert_eq!(f.ups(TaskRef::new(1, 2), 0).1, &[0, 1]);
        assert_eq!(f.graph().stages[1][0].downs.get(1), &[1, 2]);
    }

    #[test]
    fn a_key_that_matches_nothing_is_an_error() {
        let a = stage("a", sweep(&[("x", &["1", "2"])]));
        let mut b = stage("b", sweep(&[("x", &["3"])]));
        b.deps.push(Dep {
            stage: 0,
            on: DepOn::Keyed {
                down: vec![0],
                up: vec![0],
            },
        });
        let e = Graph::build(&farm(vec![a, b])).unwrap_err();
        assert_eq!(
            e.why,
            DepError::Keyed {
                up: "a".into(),
                why: KeyedError::NoMatch
            }
        );
    }
}
