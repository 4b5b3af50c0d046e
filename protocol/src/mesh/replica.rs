//! A farm's replicated state: what every holder of a farm keeps, and how copies merge.
//!
//! The coordinator appends an [`Entry`] to a farm's [`FarmLog`] for every
//! task that ends for good (done, with its content key and where its
//! outputs are; or failed, with the reason) and streams the log to the
//! farm's holders, who keep it durably. A holder's copy ([`Replica`]) is
//! enough for any node to take the farm over: a new coordinator rebuilds
//! the farm's engine from it, and a home that was down pulls the outputs
//! it names. Copies merge by union, a task's first done wins, and done
//! wins over failed, so the order in which holders hear things does not
//! matter.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use rustc_hash::{FxHashMap, FxHashSet};

use super::msg::{
    files_to_bring, Entry, FarmId, FarmProgress, FarmSpec, Home, NodeId, Ran, TaskRun,
};
use super::stage_counts::StageCounts;
use crate::engine::{Counts, Millis, Order, RecordState, Stop, TaskEnd, TaskRecord};
use crate::farm::{FarmDef, TaskRef};

/// Entries in the order they were added, with each task's latest one indexed.
#[derive(Clone, Debug, Default)]
pub struct FarmLog {
    entries: Vec<Entry>,
    /// Where each task's entry is in `entries`.
    index: TaskIndex,
    done: u64,
    /// Runs whose outputs were lost: never done again, whoever says so.
    redone: FxHashSet<TaskRun>,
    /// Tasks whose current entry is a failure, in task order (shown often;
    /// the log itself may be a million entries).
    failed: BTreeSet<TaskRef>,
}

/// Positions by task: a vector per stage for the tasks the farm declares,
/// which are looked up at nearly every message about a task and end in
/// about index order (hashed, they were a random memory access each, and
/// 12 bytes a task more); a map for any other.
#[derive(Clone, Debug, Default)]
struct TaskIndex {
    dense: Vec<Vec<u32>>,
    sparse: FxHashMap<TaskRef, u32>,
    /// One past the highest stage of any task indexed.
    top: u32,
}

/// No entry yet, in the dense part.
const NO_ENTRY: u32 = u32::MAX;

impl TaskIndex {
    fn get(&self, t: TaskRef) -> Option<u32> {
        match self
            .dense
            .get(t.stage as usize)
            .and_then(|v| v.get(t.index as usize))
        {
            Some(&NO_ENTRY) => None,
            Some(&i) => Some(i),
            None => self.sparse.get(&t).copied(),
        }
    }

    fn insert(&mut self, t: TaskRef, i: u32) {
        self.top = self.top.max(t.stage + 1);
        match self
            .dense
            .get_mut(t.stage as usize)
            .and_then(|v| v.get_mut(t.index as usize))
        {
            Some(slot) => *slot = i,
            None => {
                self.sparse.insert(t, i);
            }
        }
    }
}

impl FarmLog {
    /// The log of a farm: room for an entry per task (one each for a farm
    /// that runs to its end; grown by doubling instead, a million-task log
    /// copied itself 20 times), and its tasks indexed densely.
    pub fn for_farm(def: &FarmDef) -> FarmLog {
        let tasks = usize::try_from(def.task_count()).unwrap_or(usize::MAX);
        FarmLog {
            entries: Vec::with_capacity(tasks),
            index: TaskIndex {
                dense: def
                    .stages
                    .iter()
                    .map(|s| vec![NO_ENTRY; s.len() as usize])
                    .collect(),
                sparse: FxHashMap::default(),
                top: 0,
            },
            ..FarmLog::default()
        }
    }

    /// Adds `e` unless it tells nothing new: a task's first done wins, a
    /// done replaces a failure or a redo (what it replaces stays in the log,
    /// history that merging holders resolve the same way), a failure never
    /// replaces anything, and a redo replaces only the done it names.
    pub fn add(&mut self, e: Entry) -> bool {
        let t = e.task();
        let current = self.index.get(t).map(|i| &self.entries[i as usize]);
        if let Entry::Done { node, attempt, .. } = &e {
            let run = TaskRun {
                task: t,
                node: *node,
                attempt: *attempt,
            };
            if self.redone.contains(&run) {
                return false;
            }
        }
        let takes = match (&e, current) {
            (_, None) => true,
            (Entry::Done { .. }, Some(c)) => !c.is_done(),
            (Entry::Failed { .. }, Some(_)) => false,
            (Entry::Redo { node, attempt, .. }, Some(c)) => matches!(
                c,
                Entry::Done { node: n, attempt: a, .. } if n == node && a == attempt
            ),
        };
        if let Entry::Redo { node, attempt, .. } = &e {
            // Remembered even when it changes nothing now: the run it names
            // may still be offered by a holder that has not heard of it.
            self.redone.insert(TaskRun {
                task: t,
                node: *node,
                attempt: *attempt,
            });
        }
        if !takes {
            return false;
        }
        if current.is_some_and(Entry::is_done) {
            self.done -= 1;
        }
        if e.is_done() {
            self.done += 1;
        }
        if e.is_failed() {
            self.failed.insert(t);
        } else {
            self.failed.remove(&t);
        }
        self.index.insert(t, self.entries.len() as u32);
        self.entries.push(e);
        true
    }

    /// Appends a task's current entry again, so holders that took another
    /// (a run whose outputs they found lost) hear of this one.
    pub fn repeat(&mut self, task: TaskRef) {
        if let Some(e) = self.get(task).cloned() {
            self.index.insert(task, self.entries.len() as u32);
            self.entries.push(e);
        }
    }

    /// A done entry for a run whose outputs were lost.
    pub fn redone(&self, e: &Entry) -> bool {
        match e {
            Entry::Done {
                task,
                node,
                attempt,
                ..
            } => self.redone.contains(&TaskRun {
                task: *task,
                node: *node,
                attempt: *attempt,
            }),
            _ => false,
        }
    }

    /// Entries from position `from`, at most `max`.
    pub fn slice(&self, from: u64, max: usize) -> &[Entry] {
        let from = (from as usize).min(self.entries.len());
        let to = from.saturating_add(max).min(self.entries.len());
        &self.entries[from..to]
    }

    /// How many entries were ever added (the position after the last).
    pub fn len(&self) -> u64 {
        self.entries.len() as u64
    }

    /// True when no entry was ever added.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// A task's current entry, if it has one.
    pub fn get(&self, task: TaskRef) -> Option<&Entry> {
        self.index.get(task).map(|i| &self.entries[i as usize])
    }

    /// Whether the task's current entry says it is done.
    pub fn is_done(&self, task: TaskRef) -> bool {
        self.get(task).is_some_and(Entry::is_done)
    }

    /// How many tasks are done.
    pub fn done_count(&self) -> u64 {
        self.done
    }

    /// Runs whose outputs were lost, and so ran again.
    pub fn redone_count(&self) -> u64 {
        self.redone.len() as u64
    }

    /// Each task's current entry, in the order they were added.
    pub fn current(&self) -> impl Iterator<Item = &Entry> {
        self.current_from(0)
    }

    /// The current entries of the tasks of stage `stage` and after: none,
    /// without a look at the log, past the highest stage any entry is of
    /// (a growth's new stages, but where a coordinator elected after them
    /// heard their ends first).
    pub fn current_from(&self, stage: u32) -> impl Iterator<Item = &Entry> {
        let n = if self.index.top > stage {
            self.entries.len()
        } else {
            0
        };
        self.entries[..n]
            .iter()
            .enumerate()
            .filter(move |(i, e)| {
                e.task().stage >= stage && self.index.get(e.task()) == Some(*i as u32)
            })
            .map(|(_, e)| e)
    }

    /// Tasks failed for good, with their entries, in task order.
    pub fn failures(&self) -> impl Iterator<Item = &Entry> {
        self.failed.iter().filter_map(|t| self.get(*t))
    }
}

/// Whether task `t`, of a grown stage, is no task after all: the task it
/// grows from is done and found fewer lines than `t`'s (see
/// [`crate::farm::Grown`]). What depends on it does not wait for it.
pub fn void_place(def: &FarmDef, log: &FarmLog, t: TaskRef) -> bool {
    let Some((up, _, line)) = def.grown_source(t) else {
        return false;
    };
    log.get(up)
        .and_then(|e| e.ran()?.grew)
        .is_some_and(|n| line >= n)
}

/// The engine record that stands for an entry in a node's store, so a
/// node that becomes coordinator restores its engine from its copy.
pub fn entry_record(e: &Entry) -> TaskRecord {
    match e {
        Entry::Done {
            key, attempt, ran, ..
        } => TaskRecord {
            key: key.as_deref().copied(),
            attempt: *attempt,
            grew: ran.as_ref().and_then(|r| r.grew),
            usage: ran.as_ref().and_then(|r| r.usage).map(Box::new),
            // Attempt 0: never run in this farm, its result reused from an
            // earlier one (see `Peer::submit`), and counted as such.
            end: (*attempt == 0).then_some(TaskEnd::Cached),
            ..TaskRecord::known_done(1)
        },
        Entry::Failed {
            attempt,
            end,
            stderr_line,
            ran,
            ..
        } => TaskRecord {
            state: RecordState::Failed,
            attempt: *attempt,
            end: Some((**end).clone()),
            stderr_line: stderr_line.as_deref().map(|l| Box::new(l.to_string())),
            usage: ran.as_ref().and_then(|r| r.usage).map(Box::new),
            ..TaskRecord::known_done(1)
        },
        // The attempt stays counted, so the run again is a later attempt
        // (a late report of the lost run cannot pass for it).
        Entry::Redo { attempt, .. } => TaskRecord {
            state: RecordState::Interrupted,
            attempt: *attempt,
            ..TaskRecord::known_done(1)
        },
    }
}

/// The entry a stored record stands for, when it ended for good; `node` and
/// `outputs` come from what was stored beside it (see [`Entry`]).
pub fn record_entry(task: TaskRef, r: &TaskRecord) -> Option<Entry> {
    match r.state {
        RecordState::Done => Some(Entry::Done {
            task,
            key: r.key.map(Box::new),
            node: NodeId(0),
            attempt: r.attempt,
            outputs: Arc::default(),
            // What it grew decides which tasks of a grown stage exist;
            // what it used is shown.
            ran: stored_ran(r),
        }),
        RecordState::Failed => Some(Entry::Failed {
            task,
            attempt: r.attempt,
            node: NodeId(0),
            end: Box::new(
                r.end
                    .clone()
                    .unwrap_or(TaskEnd::Error("no reason was recorded".into())),
            ),
            ran: stored_ran(r),
            stderr_line: r.stderr_line.as_deref().map(|l| Box::from(l.as_str())),
        }),
        _ => None,
    }
}

/// What a stored record keeps of its run: what it grew and used.
fn stored_ran(r: &TaskRecord) -> Option<Box<Ran>> {
    (r.grew.is_some() || r.usage.is_some()).then(|| {
        Box::new(Ran {
            ended_ms: 0,
            duration_ms: r.duration_ms,
            exit_code: None,
            grew: r.grew,
            usage: r.usage.as_deref().copied(),
        })
    })
}

/// A farm as a node keeps it from its store, to hold it again after a restart.
#[derive(Clone, Debug)]
pub struct StoredFarm {
    /// The farm as it was submitted.
    pub spec: Arc<FarmSpec>,
    /// Every task record this node wrote for the farm (as coordinator or holder).
    pub records: Vec<(TaskRef, TaskRecord)>,
    /// What this node knows ended for good, with the outputs' locations.
    pub entries: Vec<Entry>,
    /// On the home: tasks whose outputs are here, verified.
    pub collected: Vec<TaskRef>,
    /// The farm's home as this node last knew it, and where this node puts
    /// the outputs when it took the farm over.
    pub home: Option<(Home, Option<String>)>,
}

/// One holder's copy of a farm.
#[derive(Debug)]
pub struct Replica {
    /// The farm as it was submitted.
    pub spec: Arc<FarmSpec>,
    /// What this copy knows ended for good (see [`FarmLog`]).
    pub log: FarmLog,
    /// This node is the farm's home: outputs come here.
    pub home: bool,
    /// The farm's home as this copy knows it.
    pub home_of: Home,
    /// Where outputs go when this node took the farm over (else the farm's `out`).
    pub out: Option<String>,
    /// The coordinator has this copy (it answered `Accepted`).
    pub accepted: bool,
    /// Which coordinator's log `next` counts in, and how far it is applied here.
    pub source: Option<(NodeId, u64)>,
    /// The order that coordinator hands out the farm's tasks in, and the
    /// other nodes it has keep a copy, as its newest sync says (not kept
    /// on disk: a copy restored says ascending, and none, until a sync).
    pub order: Vec<Order>,
    /// See `order`: those other nodes, in id order.
    pub holders: Vec<NodeId>,
    /// How far this copy has applied that coordinator's log: the position
    /// of the next entry it needs.
    pub next: u64,
    /// The newest `Sync` of that log heard, and the log's length when it
    /// said every task was over (over here once `next` reaches it).
    pub seen: u64,
    /// The log's length when its coordinator said every task was over:
    /// this copy is over once `next` reaches it.
    pub end_len: Option<u64>,
    /// Entries that arrived ahead of `next` (syncs overtake each other on
    /// the network), by position, applied once the gap before them fills.
    pub ahead: BTreeMap<u64, Vec<Entry>>,
    /// The coordinator's last word on progress.
    pub counts: Counts,
    /// The same counts per stage, in the farm's stage order, with the
    /// order they changed here in: a view of the farm takes what changed
    /// since it last looked, not every stage.
    pub stages: StageCounts,
    /// The version of them this copy has of its source's (see
    /// [`super::SyncMsg::stages`]): 0 until it hears from one.
    pub stages_version: u64,
    /// The coordinator says every task is over.
    pub over: bool,
    /// Runs that completed a task already done, as the coordinator counts them.
    pub duplicates: u64,
    /// Stages that fit no node, and why, as the coordinator says.
    pub unplaceable: Vec<(u32, String)>,
    /// Stages stopped (`max_fails`), and why, as the coordinator says.
    pub stopped: Vec<(u32, Stop)>,
    /// On the home: tasks whose outputs are here.
    pub collected: FxHashSet<TaskRef>,
    /// On the home: done tasks whose outputs are not here yet, and the order
    /// to fetch them in (kept as entries come, so a farm of a million
    /// outputs is not scanned whole at every message).
    missing: FxHashMap<TaskRef, NodeId>,
    /// How many of the missing outputs each node holds: the home looks for
    /// outputs lost with a node only when a node it misses is down, not over
    /// every missing output at every resend.
    missing_on: FxHashMap<NodeId, usize>,
    /// On the home: done tasks whose outputs are still to be asked for, in
    /// the order to fetch them.
    pub queue: VecDeque<TaskRef>,
    /// On the home: outputs asked of the driver, and when.
    pub fetching: FxHashMap<TaskRef, Millis>,
    /// The same asks in the order they were made, answered ones left until
    /// they reach the front: finding the asks gone unanswered looks at the
    /// oldest only, not at every ask on every message (6% of a 1,000-node
    /// simulation went to that scan).
    fetch_order: VecDeque<(TaskRef, Millis)>,
    /// On the home: the end was announced (outputs may be let go everywhere).
    pub announced: bool,
    /// On the home: runs found lost and told to the coordinator, until a
    /// done run of each task comes back (told again until then).
    pub redo: FxHashMap<TaskRef, TaskRun>,
}

impl Replica {
    /// A copy of a farm whose home is its submitter.
    pub fn new(spec: Arc<FarmSpec>, me: NodeId) -> Replica {
        let home_of = Home {
            epoch: 0,
            node: spec.origin,
        };
        let def = &spec.def;
        let stages: Vec<Counts> = def
            .stages
            .iter()
            .map(|s| Counts {
                total: s.len() as u64,
                ..Counts::default()
            })
            .collect();
        Replica {
            counts: Counts {
                total: def.task_count(),
                ..Counts::default()
            },
            stages: StageCounts::new(stages),
            stages_version: 0,
            home: home_of.node == me,
            home_of,
            out: None,
            log: FarmLog::for_farm(&spec.def),
            spec,
            accepted: false,
            source: None,
            order: Vec::new(),
            holders: Vec::new(),
            next: 0,
            seen: 0,
            end_len: None,
            ahead: BTreeMap::new(),
            over: false,
            duplicates: 0,
            unplaceable: Vec::new(),
            stopped: Vec::new(),
            collected: FxHashSet::default(),
            missing: FxHashMap::default(),
            missing_on: FxHashMap::default(),
            queue: VecDeque::new(),
            fetching: FxHashMap::default(),
            fetch_order: VecDeque::new(),
            announced: false,
            redo: FxHashMap::default(),
        }
    }

    /// Which farm this is a copy of.
    pub fn id(&self) -> FarmId {
        self.spec.id
    }

    /// The farm grew (see [`FarmSpec::grows_into`]): its later generation
    /// taken, with counts for its new stages. False (nothing changed) when
    /// `spec` is not a later generation of this copy's.
    pub fn grow(&mut self, spec: Arc<FarmSpec>) -> bool {
        if !self.spec.grows_into(&spec) {
            return false;
        }
        let old = self.spec.def.stages.len();
        for (i, s) in crate::farm::from_on(&spec.def.stages, old) {
            let total = u64::from(s.len());
            // A sync may have brought its counts before the growth came.
            if i >= self.stages.len() {
                let c = Counts {
                    total,
                    ..Counts::default()
                };
                self.stages.set(i, c);
            }
            self.counts.total += total;
        }
        if spec.def.stages.len() > old || spec.open {
            // More to run: over only when a coordinator says so again.
            self.over = false;
            self.end_len = None;
            self.announced = false;
        }
        self.spec = spec;
        true
    }

    /// The stages' counts a sync brings, where this copy has the version
    /// they were sent against (or a later one); otherwise it keeps its
    /// own and says which version it has, and gets what it lacks again.
    pub fn take_stages(&mut self, base: u64, version: u64, stages: &[(u32, Counts)]) {
        if base > self.stages_version {
            return;
        }
        for (s, c) in stages {
            self.stages.set(*s as usize, c.clone());
        }
        self.stages_version = version;
    }

    /// Each stage's counts as this copy's log says them (done, and failed
    /// for good): what it shows after a restart until its coordinator's
    /// come, as its summed counts are (a home restarted mid-farm said every
    /// stage at 0 done, and the farm at its log's count, for a moment).
    pub fn stages_from_log(&mut self) {
        let n = self.stages.len();
        let (mut done, mut failed) = (vec![0u64; n], vec![0u64; n]);
        for e in self.log.current() {
            let s = e.task().stage as usize;
            match e {
                Entry::Done { .. } if s < n => done[s] += 1,
                Entry::Failed { .. } if s < n => failed[s] += 1,
                _ => {}
            }
        }
        for s in 0..n {
            let mut c = self.stages[s].clone();
            c.done = done[s].min(c.total);
            c.failed = failed[s].min(c.total - c.done);
            self.stages.set(s, c);
        }
    }

    /// Where this node puts the farm's outputs when it is the home.
    pub fn out_dir(&self) -> &str {
        self.out.as_deref().unwrap_or(&self.spec.def.out)
    }

    /// Adds an entry to this copy (see [`FarmLog::add`]), keeping track of
    /// the outputs still to come.
    pub fn add(&mut self, e: Entry) -> bool {
        let task = e.task();
        if !self.log.add(e) {
            return false;
        }
        self.unmiss(task);
        self.note(task);
        true
    }

    fn note(&mut self, task: TaskRef) {
        if let Some(Entry::Done { outputs, node, .. }) = self.log.get(task) {
            if files_to_bring(outputs)
                && !self.collected.contains(&task)
                && self.missing.insert(task, *node).is_none()
            {
                *self.missing_on.entry(*node).or_default() += 1;
                self.queue.push_back(task);
            }
        }
    }

    fn unmiss(&mut self, task: TaskRef) {
        let Some(node) = self.missing.remove(&task) else {
            return;
        };
        if let Some(n) = self.missing_on.get_mut(&node) {
            *n -= 1;
            if *n == 0 {
                self.missing_on.remove(&node);
            }
        }
    }

    /// A task's outputs are here.
    /// On the home: `task` is known done here and its outputs are here,
    /// verified (or it made none), so a task that reads them may start.
    pub fn outputs_here(&self, task: TaskRef) -> bool {
        match self.log.get(task) {
            Some(Entry::Done { outputs, .. }) => {
                !files_to_bring(outputs) || self.collected.contains(&task)
            }
            _ => false,
        }
    }

    /// On the home: the outputs of `task` are here; true if they were not before.
    pub fn collect(&mut self, task: TaskRef) -> bool {
        self.unmiss(task);
        self.collected.insert(task)
    }

    /// Works out again which outputs are still to come (after a restart,
    /// or when this node becomes the home).
    pub fn recount(&mut self) {
        self.missing.clear();
        self.missing_on.clear();
        self.queue.clear();
        let tasks: Vec<TaskRef> = self.log.current().map(Entry::task).collect();
        for t in tasks {
            self.note(t);
        }
    }

    /// Whether the outputs of `task` are still to come.
    pub fn is_missing(&self, task: TaskRef) -> bool {
        self.missing.contains_key(&task)
    }

    /// Outputs still to come home: done tasks with outputs not collected
    /// (those this node ran are checked too: it may have run them before
    /// it was the home, keeping them apart).
    pub fn missing(&self) -> impl Iterator<Item = &Entry> {
        self.missing.keys().filter_map(|t| self.log.get(*t))
    }

    /// The nodes that hold outputs still to come home.
    pub fn missing_on(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.missing_on.keys().copied()
    }

    /// How many done tasks' outputs are still to come home.
    pub fn missing_count(&self) -> usize {
        self.missing.len()
    }

    /// On the home: the outputs of `task` are asked of the driver at `now`.
    pub fn ask_fetch(&mut self, task: TaskRef, now: Millis) {
        self.fetching.insert(task, now);
        self.fetch_order.push_back((task, now));
    }

    /// On the home: the asks made `retry` or longer before `now` and not
    /// answered, oldest first; they are no longer being fetched.
    pub fn unanswered(&mut self, now: Millis, retry: Millis) -> Vec<TaskRef> {
        let mut out = Vec::new();
        while let Some(&(task, at)) = self.fetch_order.front() {
            let current = self.fetching.get(&task) == Some(&at);
            if current && now < at + retry {
                break;
            }
            self.fetch_order.pop_front();
            if current {
                self.fetching.remove(&task);
                out.push(task);
            }
        }
        out
    }

    /// Every ask forgotten (this node is no longer the home, or starts over as it).
    pub fn clear_fetches(&mut self) {
        self.fetching.clear();
        self.fetch_order.clear();
    }

    /// Over for this holder: every task is, and on the home every output is here.
    pub fn finished(&self) -> bool {
        self.over && (!self.home || (self.redo.is_empty() && self.missing.is_empty()))
    }

    /// The progress to show: the coordinator's counts, or before any
    /// coordinator spoke (after a restart) what this copy knows.
    pub fn progress(&self) -> FarmProgress {
        FarmProgress {
            stages: self.stages.to_vec(),
            ..self.progress_summed()
        }
    }

    /// The same, its counts per stage left out (read them from `stages`,
    /// those changed from `stages.since`): an open farm grown by thousands
    /// of batches has as many stages, and its view was refreshed with each.
    pub fn progress_summed(&self) -> FarmProgress {
        let mut counts = self.counts.clone();
        if self.source.is_none() {
            counts.done = self.log.done_count().min(counts.total);
            counts.failed = (self.log.failures().count() as u64).min(counts.total - counts.done);
            counts.running = 0;
            counts.queued_on_nodes = 0;
        }
        FarmProgress {
            farm: self.id(),
            counts,
            stages: Vec::new(),
            finished: self.finished(),
            duplicates: self.duplicates,
            redone: self.log.redone_count(),
            unplaceable: self.unplaceable.clone(),
            stopped: self.stopped.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::farm::{CommandTemplate, FarmDef, StageDef, Sweep, Template};
    use crate::mesh::OutputFile;

    const HOME: NodeId = NodeId(1);

    fn replica() -> Replica {
        let def = FarmDef {
            graph: Default::default(),
            name: "f".into(),
            root: "/".into(),
            out: "/out".into(),
            stages: vec![Arc::new(StageDef::new(
                "s",
                CommandTemplate::Argv(vec![Template::literal("true")]),
                Sweep::range("i", 10),
            ))]
            .into(),
        };
        Replica::new(
            Arc::new(FarmSpec {
                id: FarmId(7),
                origin: HOME,
                def: Arc::new(def),
                inputs: vec![],
                submitted_ms: 0,
                gen: 0,
                open: false,
            }),
            HOME,
        )
    }

    fn done(index: u32, node: u64, attempt: u32) -> Entry {
        Entry::Done {
            task: TaskRef::new(0, index),
            key: None,
            node: NodeId(node),
            attempt,
            outputs: Arc::new([OutputFile {
                path: "o.txt".into(),
                hash: [index as u8; 32],
                size: 1,
                mode: 0o644,
                data: None,
            }]),
            ran: None,
        }
    }

    /// A sync brings the counts of the stages changed since the version
    /// this copy said it has; one sent against a version it has not (it
    /// restarted, or missed one) changes nothing. What changed here is
    /// what a view of the farm takes, and a stage whose counts came before
    /// its growth keeps them when the growth comes.
    #[test]
    fn a_copy_takes_stage_counts_sent_against_the_version_it_has() {
        let mut r = replica();
        let c = |total, done| Counts {
            total,
            done,
            ..Counts::default()
        };
        let t0 = r.stages.version();
        assert_eq!(r.stages.since(0).count(), 0);
        r.take_stages(0, 3, &[(0, c(10, 4))]);
        assert_eq!((r.stages[0].done, r.stages_version), (4, 3));
        let t1 = r.stages.version();
        assert_eq!(r.stages.since(t0).collect::<Vec<_>>(), vec![0]);

        r.take_stages(5, 7, &[(0, c(10, 9))]);
        assert_eq!((r.stages[0].done, r.stages_version), (4, 3));
        assert_eq!(r.stages.since(t1).count(), 0);

        r.take_stages(3, 4, &[(1, c(2, 2))]);
        assert_eq!(r.stages.since(t1).collect::<Vec<_>>(), vec![1]);
        let mut def = (*r.spec.def).clone();
        def.stages.push_back(Arc::new(StageDef::new(
            "t",
            CommandTemplate::Argv(vec![Template::literal("true")]),
            Sweep::range("i", 2),
        )));
        let next = FarmSpec {
            def: Arc::new(def),
            gen: 1,
            ..(*r.spec).clone()
        };
        assert!(r.grow(Arc::new(next)));
        assert_eq!(*r.stages, [c(10, 4), c(2, 2)]);
        assert_eq!(r.counts.total, 12);
    }

    /// A copy read back at a restart shows each stage as its log says,
    /// before its coordinator's counts come.
    #[test]
    fn a_copy_restored_counts_each_stage_from_its_log() {
        let mut r = replica();
        for i in [0, 3, 4] {
            r.add(done(i, 2, 1));
        }
        r.stages_from_log();
        assert_eq!((r.stages[0].done, r.stages[0].total), (3, 10));
        assert_eq!(r.stages.since(0).collect::<Vec<_>>(), vec![0]);
    }

    /// The entries of stages a farm grows by, which a coordinator may
    /// hear before the growth: found past the stages declared, none past
    /// the highest stage any entry is of.
    #[test]
    fn the_current_entries_from_a_stage_on_are_those_of_its_tasks_and_later() {
        let mut log = FarmLog::for_farm(&replica().spec.def);
        for (stage, index) in [(0, 1), (2, 0), (2, 0), (3, 4)] {
            let mut e = done(index, 2, 1);
            if let Entry::Done { task, .. } = &mut e {
                task.stage = stage;
            }
            log.add(e);
        }
        let from = |s: u32| -> Vec<TaskRef> { log.current_from(s).map(Entry::task).collect() };
        assert_eq!(from(0).len(), 3);
        assert_eq!(from(1), [TaskRef::new(2, 0), TaskRef::new(3, 4)]);
        assert_eq!(from(3), [TaskRef::new(3, 4)]);
        assert!(from(4).is_empty());
    }

    fn holders(r: &Replica) -> Vec<u64> {
        let mut v: Vec<u64> = r.missing_on().map(|n| n.0).collect();
        v.sort_unstable();
        v
    }

    #[test]
    fn the_home_knows_which_nodes_hold_the_outputs_still_to_come() {
        let mut r = replica();
        assert!(r.add(done(0, 2, 1)));
        assert!(r.add(done(1, 2, 1)));
        assert!(r.add(done(2, 3, 1)));
        assert_eq!(holders(&r), [2, 3]);
        assert_eq!(r.missing_count(), 3);

        // Node 3's only output came home: it holds nothing the home waits for.
        assert!(r.collect(TaskRef::new(0, 2)));
        assert_eq!(holders(&r), [2]);

        // Task 1's outputs were lost with node 2, and it ran again on node 4.
        assert!(r.add(Entry::Redo {
            task: TaskRef::new(0, 1),
            node: NodeId(2),
            attempt: 1,
        }));
        assert!(r.add(done(1, 4, 2)));
        assert_eq!(holders(&r), [2, 4]);

        // Worked out again from the log (as after a restart), the same.
        r.recount();
        assert_eq!(holders(&r), [2, 4]);
        assert!(r.collect(TaskRef::new(0, 0)));
        assert!(r.collect(TaskRef::new(0, 1)));
        assert_eq!(holders(&r), Vec::<u64>::new());
        assert_eq!(r.missing_count(), 0);
    }

    #[test]
    fn outputs_that_ride_with_the_log_are_home_with_their_entry() {
        let mut r = replica();
        let mut riding = done(0, 2, 1);
        if let Entry::Done { outputs, .. } = &mut riding {
            let mut o = outputs[0].clone();
            o.data = Some(b"7".to_vec().into_boxed_slice());
            *outputs = Arc::new([o]);
        }
        assert!(r.add(riding));
        assert!(r.add(done(1, 2, 1)));
        // The one whose value rode: nothing to bring, a task reading it
        // may start; the other waits for its file.
        assert!(r.outputs_here(TaskRef::new(0, 0)));
        assert!(!r.outputs_here(TaskRef::new(0, 1)));
        assert_eq!(r.missing_count(), 1);
        r.recount();
        assert_eq!(r.missing_count(), 1, "the same once worked out again");
        assert_eq!(holders(&r), [2]);
    }

    #[test]
    fn a_log_finds_each_tasks_current_entry_inside_and_outside_the_declared_tasks() {
        let mut r = replica();
        // Task 3 is one of the farm's ten; 12 and stage 2 are not (a stray
        // entry is kept, not dropped or mistaken for another task's).
        assert!(r.log.add(done(3, 2, 1)));
        assert!(r.log.add(done(12, 2, 1)));
        let stray = Entry::Redo {
            task: TaskRef::new(2, 0),
            node: NodeId(5),
            attempt: 1,
        };
        assert!(r.log.add(stray.clone()));
        assert_eq!(r.log.get(TaskRef::new(0, 3)), Some(&done(3, 2, 1)));
        assert_eq!(r.log.get(TaskRef::new(0, 12)), Some(&done(12, 2, 1)));
        assert_eq!(r.log.get(TaskRef::new(2, 0)), Some(&stray));
        assert_eq!(r.log.get(TaskRef::new(0, 4)), None);
        assert_eq!(r.log.get(TaskRef::new(1, 3)), None);
        // A later run of task 3 replaces it as the current entry; the first
        // stays in the log's history.
        assert!(r.log.add(Entry::Redo {
            task: TaskRef::new(0, 3),
            node: NodeId(2),
            attempt: 1,
        }));
        assert!(r.log.add(done(3, 4, 2)));
        assert_eq!(r.log.get(TaskRef::new(0, 3)), Some(&done(3, 4, 2)));
        assert_eq!(r.log.len(), 5);
        let current: Vec<TaskRef> = r.log.current().map(Entry::task).collect();
        assert_eq!(
            current,
            [TaskRef::new(0, 12), TaskRef::new(2, 0), TaskRef::new(0, 3)]
        );
        assert_eq!(r.log.done_count(), 2);
    }

    #[test]
    fn asks_unanswered_for_the_retry_time_come_back_oldest_first_and_answered_ones_never() {
        let mut r = replica();
        let t = |i| TaskRef::new(0, i);
        r.ask_fetch(t(0), 0);
        r.ask_fetch(t(1), 5);
        r.ask_fetch(t(2), 10);
        // Task 0's outputs came.
        assert_eq!(r.fetching.remove(&t(0)), Some(0));
        assert_eq!(r.unanswered(14, 10), Vec::<TaskRef>::new());
        assert_eq!(r.unanswered(16, 10), [t(1)]);
        assert_eq!(r.fetching.len(), 1);
        // Asked again later, task 1 waits its full time again.
        r.ask_fetch(t(1), 16);
        assert_eq!(r.unanswered(25, 10), [t(2)]);
        assert_eq!(r.unanswered(25, 10), Vec::<TaskRef>::new());
        assert_eq!(r.unanswered(26, 10), [t(1)]);
        assert!(r.fetching.is_empty());
        // A home that starts over forgets every ask.
        r.ask_fetch(t(3), 30);
        r.clear_fetches();
        assert_eq!(r.unanswered(100, 10), Vec::<TaskRef>::new());
    }
}
