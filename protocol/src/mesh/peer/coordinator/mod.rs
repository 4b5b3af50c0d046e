//! The coordinator: only the elected node has one. Each farm's engine (in remote mode), who holds which claim, and what the engine's decisions mean for the mesh.
//!
//! Placement (which node gets which ready task) is in `placement.rs`;
//! streaming each farm's log to the nodes that keep copies of it, and
//! acknowledging workers once their results are durable on enough of
//! them, in `replication.rs`.

mod grow;
mod placement;
mod replication;
mod shown;
mod victims;

use std::collections::{BTreeSet, VecDeque};
use std::sync::Arc;

use rustc_hash::{FxHashMap, FxHashSet};

use super::super::msg::*;
use super::super::replica::FarmLog;
use super::action::Persist;
use super::out::Out;
use super::Node;
use crate::engine::{
    self, AddOptions, Engine, FarmSlot, KillReason, Millis, Order, Outcome, TaskRecord, TaskResult,
    Verdict,
};
use crate::eta::StageLeft;
use crate::farm::{deps_digest, has_deps, key_with_deps, stage_digest, TaskRef};
use crate::observe::Latency;
use crate::resources::Resources;
use crate::tally::Tally;

pub(super) use placement::{Echoes, Local};
pub(super) use replication::{offer, Offered, SyncAcked, OFFER_MAX, SYNC_WINDOW};

/// A node that holds a copy of a farm, as the coordinator streams it the farm's log.
struct Holder {
    node: NodeId,
    /// The farm's definition and its inputs are durable there.
    has_spec: bool,
    /// Entries sent, and entries it said are durable there.
    sent: u64,
    acked: u64,
    /// When entries were last sent.
    at: Millis,
    /// It said it knows the farm is over.
    over: bool,
    /// The version of the stages' counts it said it has (see `Shown`).
    stages_acked: u64,
}

impl Holder {
    fn new(node: NodeId, has_spec: bool) -> Holder {
        Holder {
            node,
            has_spec,
            sent: 0,
            acked: 0,
            at: 0,
            over: false,
            stages_acked: 0,
        }
    }
}

struct CoordFarm {
    slot: FarmSlot,
    /// When this coordinator took the farm.
    since: Millis,
    spec: Arc<FarmSpec>,
    /// The tasks `spec` has, counted as it comes and grows: every stage
    /// summed at each growth of an open farm of thousands of batches was
    /// a twentieth of its cost.
    tasks: u64,
    /// Accepted: durable on enough nodes (see `Config::replicas`).
    accepted: bool,
    /// Every task that ended for good, in order: streamed to the holders.
    log: FarmLog,
    holders: Vec<Holder>,
    /// Reports whose entry is not yet durable on enough holders: the
    /// worker is acknowledged (and forgets its copy) once it is.
    waiting: VecDeque<(u64, NodeId, Assigned)>,
    /// The farm's home: the highest claim the coordinator heard.
    home: Home,
    /// The counts last sent to the holders, and whether the end was.
    counts_sent: Option<engine::Counts>,
    /// The counts the holders are shown, per stage and summed.
    shown: shown::Shown,
    /// Stages that fit no node, and why (those that fit again are dropped
    /// when sent).
    unplaceable: Vec<(u32, String)>,
    /// Runs that completed a task already done by another run (each
    /// counted once, however often it is offered again).
    duplicates: u64,
    extra_runs: FxHashSet<TaskRun>,
    finished_sent: bool,
    /// The order each stage's tasks are handed out in (see `Writer`;
    /// stages missing go from the first index up).
    order: Vec<Order>,
    /// Since a node that kept a copy was lost from sight, or since this
    /// node took the farm over from a copy whose writer it did not see.
    apart: Option<replication::Apart>,
    /// The digest of each `after` stage's keys its dependents' keys were
    /// made with (see `farm::deps_digest`), until the log changes in that stage.
    stage_digests: FxHashMap<u32, [u8; 32]>,
    /// The latest generation of the spec said `Accepted`, the holders
    /// that said they keep the generation after it (see `grow.rs`), and
    /// when that generation was last sent to the holders lacking it.
    gen_accepted: u32,
    grown_copies: BTreeSet<NodeId>,
    grown_at: Millis,
    /// Per stage, whether another stage depends on it (rebuilt when the
    /// farm grows): a task of such a stage that ends may let another start,
    /// which on the home waits for its entry there.
    feeds: Vec<bool>,
    /// An entry some task may wait for is in the log since the last sync:
    /// the holders get it with this step, not with the next progress round.
    sync_soon: bool,
}

impl CoordFarm {
    /// Whether another stage depends on stage `s`.
    fn feeds(&mut self, s: u32) -> bool {
        let def = &self.spec.def;
        if self.feeds.len() != def.stages.len() {
            // Stages are only added at the end, each waiting for stages
            // there already or added with it: a growth marks what it adds.
            let old = self.feeds.len();
            let from = if old < def.stages.len() { old } else { 0 };
            self.feeds.truncate(from);
            self.feeds.resize(def.stages.len(), false);
            for st in crate::farm::stages_from(&def.stages, from) {
                for u in st.upstream() {
                    self.feeds[u as usize] = true;
                }
            }
        }
        self.feeds[s as usize]
    }
}

impl CoordFarm {
    /// The nodes other than `me` that keep a copy and `live` says are
    /// alive, in id order.
    fn copies(&self, me: NodeId, live: impl Fn(NodeId) -> bool) -> Vec<NodeId> {
        let mut copies: Vec<NodeId> = self
            .holders
            .iter()
            .filter(|h| h.has_spec && h.node != me && live(h.node))
            .map(|h| h.node)
            .collect();
        copies.sort_unstable();
        copies.dedup();
        copies
    }

    /// Adds an entry to the log (see [`FarmLog::add`]).
    fn add_entry(&mut self, e: Entry) -> bool {
        let stage = e.task().stage;
        let added = self.log.add(e);
        if added {
            self.stage_digests.remove(&stage);
        }
        added
    }

    /// The key of task `t`, whose own key the node that ran it made, with
    /// the keys this log has of the tasks it depends on.
    fn key_with_deps(&mut self, t: TaskRef, own: &[u8; 32]) -> [u8; 32] {
        let def = &self.spec.def;
        let key_of = |log: &FarmLog, d: TaskRef| match log.get(d) {
            Some(Entry::Done { key, .. }) => key.as_deref().copied(),
            _ => None,
        };
        for &s in &def.stages[t.stage as usize].after {
            if !self.stage_digests.contains_key(&s) {
                let d = stage_digest(def, s, |d| key_of(&self.log, d));
                self.stage_digests.insert(s, d);
            }
        }
        let deps = deps_digest(def, t, |s| self.stage_digests[&s], |d| key_of(&self.log, d));
        key_with_deps(own, &deps)
    }

    fn extra_run(&mut self, task: TaskRef, node: NodeId, attempt: u32) {
        if self.extra_runs.insert(TaskRun {
            task,
            node,
            attempt,
        }) {
            self.duplicates += 1;
        }
    }
}

pub(super) struct Coord {
    engine: Engine,
    farms: FxHashMap<FarmId, CoordFarm>,
    slots: Vec<FarmId>,
    /// Who holds each claimed task, which attempt, and since when;
    /// counted per node, for the incremental checks.
    claims: Tally<(FarmSlot, TaskRef), (NodeId, u32, Millis), NodeId>,
    /// Resources of the tasks claimed by each node (queued or running there).
    load: FxHashMap<NodeId, (Resources, usize)>,
    /// Nodes that may take more work, in id order (the order they are
    /// offered work). Ordered rather than hashed also because it once held
    /// every member: a hash set keeps that capacity and would walk it on
    /// every assignment.
    hungry: BTreeSet<NodeId>,
    /// The backlog after the last assignment: when it grows, every node may take more.
    last_backlog: u64,
    /// Just elected: until every member has said what it holds (each does
    /// when it follows, within a round trip), or until the time given,
    /// nothing is placed. The tasks workers run are pending in this
    /// coordinator's engine until their `Claimed` adopts them, and
    /// placement hands out the first pending tasks: those very ones.
    settle: Option<(Millis, FxHashSet<NodeId>)>,
    /// While settling, nodes in sight that keep a copy of a farm taken over
    /// apart from its writer, and have not offered it: each would give this
    /// side a place of its own (see `replication::Apart`).
    awaited: FxHashSet<(FarmId, NodeId)>,
    /// What each member's last `Claimed` listed of farms this coordinator
    /// does not have yet, adopted when the farm comes. A coordinator just
    /// elected that kept no copy of a farm has it only once a holder's
    /// offer arrives, often after the members' `Claimed`: dropping those
    /// claims, and counting the members as heard, handed out the tasks
    /// they ran or had finished and not yet had acknowledged.
    held_early: FxHashMap<NodeId, Vec<Assigned>>,
    /// Reports of farms not here yet, counted when the farm comes (until
    /// then their node holds the claim, see `held_early`, and the worker
    /// would send them again only a second later).
    reports_early: FxHashMap<(NodeId, Assigned), Report>,
    /// Each node's prefetch depth, as it last said (reports and beats).
    depth: FxHashMap<NodeId, u32>,
    /// What runs on each node, as its last beat said.
    started: StartedTally,
    /// When each node last reported an end, for the victims.
    ends: victims::Ends,
    /// Tells holders apart this coordinator's log from any other's (a
    /// restarted coordinator's log restarts at 0), and numbers its syncs.
    log_id: u64,
    sync_seq: u64,
    next_progress: Millis,
    /// Members joined or died since the engine last saw the machines.
    machines_dirty: bool,
}

/// The tasks each node runs per farm's stage, as its last beat said
/// (`Beat::started`), and their sums, kept as beats come so that a
/// farm's counts read them in a lookup per stage.
#[derive(Default)]
struct StartedTally {
    by_node: FxHashMap<NodeId, Vec<Started>>,
    sums: FxHashMap<(FarmId, u32), u64>,
}

impl StartedTally {
    /// `node` runs `started` now (nothing: it runs nothing, or is dead).
    fn note(&mut self, node: NodeId, started: &[Started]) {
        let was = self.by_node.get(&node).map_or(&[][..], Vec::as_slice);
        if was == started {
            // Most beats: a node's tasks are those of its last beat.
            return;
        }
        for s in self.by_node.remove(&node).into_iter().flatten() {
            let key = (s.farm, s.stage);
            let left = self.sums.get(&key).map_or(0, |n| n - u64::from(s.tasks));
            if left == 0 {
                self.sums.remove(&key);
            } else {
                self.sums.insert(key, left);
            }
        }
        for s in started {
            *self.sums.entry((s.farm, s.stage)).or_default() += u64::from(s.tasks);
        }
        if !started.is_empty() {
            self.by_node.insert(node, started.to_vec());
        }
    }

    /// How many tasks of the farm's stage the nodes said they run.
    fn of(&self, farm: FarmId, stage: u32) -> u64 {
        self.sums.get(&(farm, stage)).copied().unwrap_or(0)
    }
}

/// What a report (or a death) tells the entries its input makes: the node
/// to name, the outputs it reported, and its run's start and end.
#[derive(Default)]
struct Reported {
    node: Option<NodeId>,
    outputs: Arc<[OutputFile]>,
    ran: Option<Box<Ran>>,
}

impl Coord {
    /// A coordinator over `machines`, offering work to `nodes` first.
    pub(super) fn new(
        now: Millis,
        machines: Vec<Resources>,
        nodes: impl Iterator<Item = NodeId>,
        log_id: u64,
    ) -> Coord {
        Coord {
            engine: Engine::remote(machines),
            farms: FxHashMap::default(),
            slots: Vec::new(),
            claims: Tally::new(|_, (node, ..)| *node),
            load: FxHashMap::default(),
            hungry: nodes.collect(),
            last_backlog: 0,
            settle: None,
            awaited: FxHashSet::default(),
            held_early: FxHashMap::default(),
            reports_early: FxHashMap::default(),
            depth: FxHashMap::default(),
            started: StartedTally::default(),
            ends: victims::Ends::default(),
            log_id,
            sync_seq: 0,
            next_progress: now,
            machines_dirty: false,
        }
    }

    /// A farm kept in this node's store, coordinated from what it recorded.
    pub(super) fn restore(&mut self, now: Millis, me: NodeId, stored: super::StoredFarm) {
        let origin = stored.spec.origin;
        let home = stored.home.as_ref().map(|(h, _)| *h);
        // The order it was handed out in is not kept: a farm restored runs
        // from the first index up.
        let f = self.add_farm(now, stored.spec, stored.records, stored.entries, Vec::new());
        f.accepted = true;
        f.gen_accepted = f.spec.gen;
        if let Some(h) = home {
            f.home = f.home.max(h);
        }
        f.holders.push(Holder::new(origin, true));
        if origin != me {
            // Kept here (with its inputs) since it first came.
            f.holders.push(Holder::new(me, true));
        }
    }

    /// Adds a farm to the engine from what is known of it.
    fn add_farm(
        &mut self,
        now: Millis,
        spec: Arc<FarmSpec>,
        records: Vec<(TaskRef, TaskRecord)>,
        entries: Vec<Entry>,
        order: Vec<Order>,
    ) -> &mut CoordFarm {
        let def = spec.def.clone();
        let slot = self.engine.add_farm(
            now,
            def,
            records,
            &AddOptions {
                run: 1,
                open: spec.open,
                ..AddOptions::default()
            },
        );
        if !order.is_empty() {
            self.engine.reorder(slot, &order);
        }
        let mut log = FarmLog::for_farm(&spec.def);
        for e in entries {
            log.add(e);
        }
        self.slots.push(spec.id);
        let home = Home {
            epoch: 0,
            node: spec.origin,
        };
        self.farms.entry(spec.id).or_insert(CoordFarm {
            since: now,
            home,
            slot,
            tasks: spec.def.task_count(),
            spec,
            accepted: false,
            log,
            holders: Vec::new(),
            waiting: VecDeque::new(),
            counts_sent: None,
            shown: shown::Shown::default(),
            finished_sent: false,
            duplicates: 0,
            extra_runs: FxHashSet::default(),
            unplaceable: Vec::new(),
            order,
            apart: None,
            stage_digests: FxHashMap::default(),
            gen_accepted: 0,
            grown_copies: BTreeSet::new(),
            grown_at: 0,
            feeds: Vec::new(),
            sync_soon: false,
        })
    }

    /// Membership changed: the engine's view of the machines is rebuilt
    /// before it next needs it, once for a burst of joins rather than
    /// once per join (each rebuild clones every member's resources).
    pub(super) fn machines_changed(&mut self) {
        self.machines_dirty = true;
    }

    pub(super) fn sync_machines(&mut self, machines: impl FnOnce() -> Vec<Resources>) {
        if !self.machines_dirty {
            return;
        }
        self.machines_dirty = false;
        self.engine.set_machines(machines());
    }

    // ----- what the rest of the peer reads -----

    pub(super) fn backlog(&self) -> u64 {
        self.engine.backlog()
    }

    pub(super) fn engine(&self) -> &Engine {
        &self.engine
    }

    pub(super) fn has_farm(&self, farm: FarmId) -> bool {
        self.farms.contains_key(&farm)
    }

    /// Farms it coordinates, in the order they came.
    pub(super) fn slots(&self) -> &[FarmId] {
        &self.slots
    }

    /// Stages of unfinished farms whose tasks are expected to take this
    /// long, named `farm/stage`.
    pub(super) fn expected_stages(&self) -> Vec<(String, u64)> {
        let mut long = Vec::new();
        for f in self.farms.values().filter(|f| !f.finished_sent) {
            for st in &f.spec.def.stages {
                if let Some(e) = st.expected_ms {
                    long.push((format!("{}/{}", f.spec.def.name, st.name), e));
                }
            }
        }
        long
    }

    /// What is left of every unfinished farm, stage by stage (a farm's
    /// stages after the farms before it), as the estimates of their end
    /// see it on `nodes`; and what each stage's tasks ask for.
    pub(super) fn stages_left(&self, nodes: &[Resources]) -> (Vec<StageLeft>, Vec<Resources>) {
        let (mut stages, mut requests) = (Vec::new(), Vec::new());
        let mut farms: Vec<&CoordFarm> = self
            .farms
            .values()
            .filter(|f| f.accepted && !f.finished_sent)
            .collect();
        farms.sort_by_key(|f| f.slot.0);
        for f in farms {
            let def = &f.spec.def;
            let base = stages.len();
            let counts = self.engine.stage_progress(f.slot);
            let runtimes = crate::eta::runtimes(def, f.log.current());
            for mut s in crate::eta::stages_left(def, &counts, runtimes, nodes) {
                for u in s.after.iter_mut().chain(s.after_each.iter_mut()) {
                    *u += base;
                }
                stages.push(s);
            }
            requests.extend(def.stages.iter().map(|s| s.resources.clone()));
        }
        (stages, requests)
    }

    /// When the holders next hear of the farms' progress, while any is unfinished.
    pub(super) fn poll_timeout(&self) -> Option<Millis> {
        self.farms
            .values()
            .any(|f| !f.finished_sent)
            .then_some(self.next_progress)
    }

    /// Only while a round is wanted (see `poll_timeout`): a coordinator
    /// with nothing to tell keeps its round's time as it was rather than
    /// moving it to whichever wake came after it, so the first round of
    /// its next farm is at that farm, whatever woke the node meanwhile.
    pub(super) fn progress_due(&self, now: Millis) -> bool {
        self.poll_timeout().is_some_and(|t| now >= t)
    }

    /// A member's prefetch depth, as its beat says.
    pub(super) fn note_depth(&mut self, node: NodeId, depth: u32) {
        self.depth.insert(node, depth);
    }

    /// What runs on a member now, as its beat says (this node's own, as
    /// the beat it sends says).
    pub(super) fn note_started(&mut self, node: NodeId, started: &[Started]) {
        self.started.note(node, started);
    }

    /// Whether `note_started(node, started)` would change nothing.
    pub(super) fn notes_started(&self, node: NodeId, started: &[Started]) -> bool {
        self.started
            .by_node
            .get(&node)
            .map_or(&[][..], Vec::as_slice)
            == started
    }

    /// A farm's counts as users read them, summed and per stage: of the
    /// tasks handed to nodes, those the nodes' beats say run are running,
    /// the rest queued there. (The engine's own counts, and what the
    /// coordinator decides by, count every task handed out as running.)
    pub(super) fn shown_counts(
        &self,
        farm: FarmId,
        slot: FarmSlot,
    ) -> (engine::Counts, Vec<engine::Counts>) {
        let mut stages = self.engine.stage_progress(slot);
        let mut sum = engine::Counts::default();
        for (stage, c) in stages.iter_mut().enumerate() {
            c.split_started(self.started.of(farm, stage as u32));
            sum.add(c);
        }
        (sum, stages)
    }

    /// A node that joined may take work.
    pub(super) fn joined(&mut self, node: NodeId) {
        self.hungry.insert(node);
    }

    /// A worker's report: its depth. Its clock is the step's to echo (see
    /// [`Echoes`]), not the coordinator's to keep.
    pub(super) fn note_report(&mut self, now: Millis, from: NodeId, prefetch: u32) {
        self.depth.insert(from, prefetch);
        self.ends.ended(from, now);
    }

    pub(super) fn progress(&self, farm: FarmId) -> Option<engine::Counts> {
        Some(self.engine.progress(self.farms.get(&farm)?.slot))
    }

    /// A farm as the coordinator knows it: its home, progress and first
    /// `failures_max` failures.
    pub(super) fn farm_view(
        &self,
        farm: FarmId,
        failures_max: usize,
    ) -> Option<(Home, FarmProgress, Vec<Entry>)> {
        let f = self.farms.get(&farm)?;
        let (counts, stages) = self.shown_counts(farm, f.slot);
        let p = FarmProgress {
            farm,
            duplicates: f.duplicates,
            redone: f.log.redone_count(),
            unplaceable: f
                .unplaceable
                .iter()
                .filter(|(s, _)| self.engine.unplaceable(f.slot, *s))
                .cloned()
                .collect(),
            stopped: self.engine.stage_stops(f.slot),
            finished: self.engine.over(f.slot, &counts),
            counts,
            stages,
        };
        let failures = f.log.failures().take(failures_max).cloned().collect();
        Some((f.home, p, failures))
    }

    pub(super) fn log(&self, farm: FarmId) -> Option<&FarmLog> {
        Some(&self.farms.get(&farm)?.log)
    }

    /// Who holds the claim on a task now, or ran it to its end.
    pub(super) fn where_ran(&self, farm: FarmId, task: TaskRef) -> Option<(NodeId, bool)> {
        let f = self.farms.get(&farm)?;
        if let Some((node, ..)) = self.claims.get(&(f.slot, task)) {
            return Some((*node, true));
        }
        super::ended_on(&f.log, task)
    }

    /// A coordinator that lost an election gives its farms to the winner,
    /// with the tasks it knows are done.
    pub(super) fn hand_over(self, me: NodeId, to: NodeId, out: &mut Out) {
        for fid in &self.slots {
            let f = &self.farms[fid];
            let entries = f.log.current().cloned().collect();
            // The winner goes on in this order, whatever it is told of the
            // copies: it sees this node, which has stopped.
            let writer = Writer {
                node: me,
                order: f.order.clone(),
                holders: f.copies(me, |_| true),
            };
            offer(out, to, f.spec.clone(), entries, f.home, Some(writer));
        }
    }

    // ----- the engine's decisions -----

    /// Turns the engine's actions into persists, messages and events.
    pub(super) fn drain(&mut self, out: &mut Out) {
        self.drain_for(&mut Reported::default(), out);
    }

    /// Drains the engine's actions after an input that came with a
    /// report, or a death (`by`): the entries it makes name that node, its
    /// outputs and its run.
    fn drain_for(&mut self, by: &mut Reported, out: &mut Out) {
        let mut sends = Vec::new();
        // The record the engine just wrote for a task, for the entry that follows.
        let mut last_key = None;
        while let Some(a) = self.engine.poll_action() {
            match a {
                // A mesh farm is not resumed stage by stage: a coordinator
                // that takes it up from the log (where a stop leaves no
                // entry) runs the held tasks, which stop their stage again
                // if they fail alike.
                engine::Action::Persist(engine::Persist::Stage { .. }) => {}
                engine::Action::Persist(engine::Persist::Task { farm, task, record }) => {
                    let fid = self.slots[farm.0 as usize];
                    last_key = record.key;
                    out.persist(Persist::Task {
                        farm: fid,
                        task,
                        record,
                    });
                }
                engine::Action::Kill {
                    farm, task, reason, ..
                } => {
                    if reason == KillReason::Cancel {
                        if let Some((node, ..)) = self.claims.get(&(farm, task)) {
                            let fid = self.slots[farm.0 as usize];
                            let msg = if self.engine.cancelled(farm) {
                                Msg::Cancel { farm: fid }
                            } else {
                                Msg::CancelTask { farm: fid, task }
                            };
                            sends.push((*node, msg));
                        }
                    }
                }
                engine::Action::Start { .. } => unreachable!("a remote engine starts nothing"),
                engine::Action::Emit(ev) => match ev {
                    engine::Event::TaskFinished {
                        farm,
                        task,
                        attempt,
                        end,
                        stderr_line,
                        verdict,
                    } => {
                        let fid = self.slots[farm.0 as usize];
                        let node = by.node.unwrap_or(NodeId(0));
                        let f = self.farms.get_mut(&fid).expect("slots and farms agree");
                        let entry = match verdict {
                            Verdict::Done => Some(Entry::Done {
                                task,
                                key: last_key.map(Box::new),
                                node,
                                attempt,
                                outputs: std::mem::take(&mut by.outputs),
                                ran: by.ran.take(),
                            }),
                            Verdict::Failed => Some(Entry::Failed {
                                task,
                                attempt,
                                node,
                                end: Box::new(end),
                                ran: by.ran.take(),
                                stderr_line: stderr_line.map(String::into_boxed_str),
                            }),
                            Verdict::Retry => {
                                sends.push((
                                    f.home.node,
                                    Msg::Failure(Failure {
                                        farm: fid,
                                        task,
                                        attempt,
                                        node,
                                        end,
                                        verdict,
                                    }),
                                ));
                                None
                            }
                            Verdict::Cancelled | Verdict::Interrupted | Verdict::Stopped => None,
                        };
                        if let Some(e) = entry {
                            if e.is_done() && f.log.redone(&e) {
                                // A late report of a run whose outputs were
                                // lost: the task still runs again.
                                self.engine.redo(farm, task);
                                continue;
                            }
                            // Where outputs are and why a task failed is
                            // kept beside the engine's own record.
                            let keep = out.persists()
                                && (matches!(&e, Entry::Done { outputs, .. } if !outputs.is_empty())
                                    || !e.is_done());
                            if !keep {
                                f.add_entry(e);
                            } else if f.add_entry(e.clone()) {
                                out.persist(Persist::Entries {
                                    farm: fid,
                                    entries: vec![e],
                                    records: false,
                                });
                            }
                        }
                    }
                    engine::Event::Unplaceable {
                        farm,
                        stage,
                        shortfall,
                        offered,
                    } => {
                        let fid = self.slots[farm.0 as usize];
                        let reason = crate::resources::shortfall_words(
                            &shortfall,
                            &offered,
                            "on the largest node",
                        );
                        // Part of the farm's state the holders hear with its progress.
                        let f = self.farms.get_mut(&fid).expect("slots and farms agree");
                        f.unplaceable.retain(|(s, _)| *s != stage);
                        f.unplaceable.push((stage, reason));
                        f.counts_sent = None;
                    }
                    engine::Event::FarmFinished { .. } => {}
                    // The stage's held tasks are counted as stopped in the
                    // progress every holder hears.
                    engine::Event::StageStopped { .. } | engine::Event::StageResumed { .. } => {}
                },
            }
        }
        sends.dedup();
        for (to, msg) in sends {
            out.send(to, msg);
        }
    }

    // ----- claims -----

    pub(super) fn on_report(
        &mut self,
        now: Millis,
        from: NodeId,
        reports: Vec<Report>,
        cx: &Node,
        out: &mut Out,
    ) {
        let mut acks = Vec::new();
        for r in reports {
            let Some(f) = self.farms.get(&r.task.farm) else {
                // Its farm may be on its way from a holder: see `reports_early`.
                self.reports_early.insert((from, r.task), r);
                continue;
            };
            let slot = f.slot;
            let spec = f.spec.clone();
            let t = r.task.task;
            if let Some(o) = out.observed() {
                let started = now.saturating_sub(r.duration_ms);
                o.latency
                    .record_ms(Latency::SubmitToStart, started.saturating_sub(f.since));
            }
            let ok_codes = &spec.def.stages[t.stage as usize].success_codes;
            let succeeded =
                matches!(r.result, TaskResult::Exited(code) if ok_codes.contains(&code));
            if succeeded {
                // A success of a task pending here (its report came before
                // the node's `Claimed` to a coordinator just elected) is the
                // node's claim: counted, rather than the task run again.
                self.owns_claim(now, from, r.task);
            }
            if let Some((owner, attempt, _)) = self.claims.get(&(slot, t)).copied() {
                if attempt == r.task.attempt {
                    self.claims.remove(&(slot, t));
                    self.unload(owner, &spec.def.stages[t.stage as usize].resources);
                }
            }
            let f = &self.farms[&r.task.farm];
            let before = f.log.len();
            let ran_before = matches!(f.log.get(t), Some(Entry::Done { node, attempt, .. })
                if (*node, *attempt) != (from, r.task.attempt));
            if succeeded && ran_before {
                let f = self.farms.get_mut(&r.task.farm).expect("checked");
                f.extra_run(t, from, r.task.attempt);
            }
            let key = match r.key {
                Some(own) if has_deps(&spec.def, t.stage) => {
                    let f = self.farms.get_mut(&r.task.farm).expect("checked");
                    Some(f.key_with_deps(t, &own))
                }
                k => k,
            };
            let mut by = Reported {
                node: Some(from),
                ran: Ran::of(&r),
                outputs: r.outputs.into(),
            };
            self.engine.task_finished(
                now,
                slot,
                t,
                r.task.attempt,
                Outcome {
                    result: r.result,
                    key,
                    duration_ms: r.duration_ms,
                    ended_ms: 0,
                    grew: r.grew,
                    logs: 0,
                    stderr_line: r.stderr_line,
                    usage: r.usage,
                },
            );
            // The entry (and the record's Persist before it) comes out now,
            // naming the reporter, its outputs and its run.
            self.drain_for(&mut by, out);
            let f = self.farms.get_mut(&r.task.farm).expect("checked above");
            if succeeded && f.log.len() > before && f.feeds(t.stage) {
                // A task that waits for it may start once the home has its
                // entry (a chain's next link waited for the progress round).
                f.sync_soon = true;
            }
            if f.log.len() > before {
                // Acknowledged once the entry is durable on enough holders:
                // until then the worker keeps its copy.
                f.waiting.push_back((f.log.len(), from, r.task));
            } else {
                // Acknowledged whether or not it counted: a report for an
                // attempt that was already re-claimed is stale, and the
                // worker should forget it.
                acks.push(r.task);
            }
        }
        self.hungry.insert(from);
        if !acks.is_empty() {
            // The acknowledgement follows the record's Persist in the action order.
            out.send(from, Msg::Ack { tasks: acks });
        }
        self.release_acks(cx, out);
    }

    pub(super) fn on_release(&mut self, now: Millis, tasks: Vec<Assigned>) {
        for a in tasks {
            let Some(f) = self.farms.get(&a.farm) else {
                continue;
            };
            let slot = f.slot;
            let spec = f.spec.clone();
            if let Some((owner, attempt, _)) = self.claims.get(&(slot, a.task)).copied() {
                if attempt == a.attempt {
                    self.claims.remove(&(slot, a.task));
                    self.unload(owner, &spec.def.stages[a.task.stage as usize].resources);
                    self.hungry.insert(owner);
                    self.engine.unclaim(now, slot, a.task, a.attempt);
                }
            }
        }
    }

    /// Places nothing until `until`, or until each of `members` has said
    /// what it holds (`on_claims_listed`).
    pub(super) fn settle(&mut self, until: Millis, members: impl IntoIterator<Item = NodeId>) {
        let waiting: FxHashSet<NodeId> = members.into_iter().collect();
        self.settle = (!waiting.is_empty()).then_some((until, waiting));
    }

    /// As `settle`, once more: a farm taken over from another coordinator's
    /// copy while this one coordinates (a mesh it met, the other side of a
    /// healed partition). Waits as long as either asks, for all they name.
    pub(super) fn settle_again(
        &mut self,
        until: Millis,
        members: impl IntoIterator<Item = NodeId>,
    ) {
        match &mut self.settle {
            Some((u, waiting)) => {
                *u = (*u).max(until);
                waiting.extend(members);
            }
            None => self.settle(until, members),
        }
    }

    /// When the wait to hear what the members hold ends at the latest:
    /// placing resumes then, at a wake of its own rather than at
    /// whichever came after it.
    pub(super) fn settle_timeout(&self) -> Option<Millis> {
        self.settle.as_ref().map(|(until, _)| *until)
    }

    /// Whether a step that brings this coordinator nothing (no work, no
    /// member, no claim or report) would leave it as it was: nothing the
    /// engine decided to drain, no machines to hand it, no settling to
    /// end, nothing to place (the backlog as the last placing left it,
    /// and no node that may take more of it), nothing to stream to a
    /// holder outside a progress round.
    pub(super) fn steps_quietly(&self) -> bool {
        let backlog = self.engine.backlog();
        !self.engine.has_actions()
            && !self.machines_dirty
            && self.settle.is_none()
            && self.awaited.is_empty()
            && backlog == self.last_backlog
            && (backlog == 0 || self.hungry.is_empty())
            && self.syncs_nothing()
    }

    /// Still waiting to hear what the members hold (and the copies
    /// `awaited`) before placing work.
    pub(super) fn settling(&mut self, now: Millis) -> bool {
        match &self.settle {
            Some((until, waiting))
                if now < *until && !(waiting.is_empty() && self.awaited.is_empty()) =>
            {
                true
            }
            _ => {
                self.settle = None;
                self.awaited.clear();
                false
            }
        }
    }

    /// What a worker holds (queued, running, waiting for a spec, reported
    /// and not acknowledged): sent after an election, so the new coordinator
    /// adopts those claims, and every `resend_ms`, so claims whose `Assign`
    /// or `Stolen` was lost go back to the queue. Only claims older than
    /// `grace` are given up: younger ones may still be on their way; and
    /// only those made before `seen` on this node's clock (the worker had
    /// heard a beat or an assignment of this coordinator sent after them): a list that
    /// waited behind them in this node's queue speaks of an older time.
    pub(super) fn on_claims_listed(
        &mut self,
        now: Millis,
        from: NodeId,
        tasks: &[Assigned],
        grace: Millis,
        seen: Millis,
    ) {
        if let Some((_, waiting)) = &mut self.settle {
            waiting.remove(&from);
        }
        // Each `Claimed` lists all a node holds: what it listed before is stale.
        self.held_early.remove(&from);
        let mut early = Vec::new();
        let mut held = 0;
        for a in tasks {
            if !self.farms.contains_key(&a.farm) {
                early.push(*a);
            } else if self.owns_claim(now, from, *a) {
                held += 1;
            }
        }
        if !early.is_empty() {
            self.held_early.insert(from, early);
        }
        if !self.reports_early.is_empty() {
            let early = self.held_early.get(&from);
            // A report its node no longer lists was acknowledged: dropped.
            self.reports_early
                .retain(|(n, a), _| *n != from || early.is_some_and(|e| e.contains(a)));
        }
        if self.load.get(&from).is_none_or(|(_, k)| *k <= held) {
            // Every claim of this node is accounted for: the common case, no scan.
            return;
        }
        let listed: FxHashSet<(FarmId, TaskRef, u32)> =
            tasks.iter().map(|a| (a.farm, a.task, a.attempt)).collect();
        let mut gone: Vec<(FarmSlot, TaskRef, u32)> = self
            .claims
            .iter()
            .filter(|((s, t), (n, a, at))| {
                *n == from
                    && at.saturating_add(grace) < now
                    && *at < seen
                    && !listed.contains(&(self.slots[s.0 as usize], *t, *a))
            })
            .map(|((s, t), (_, a, _))| (*s, *t, *a))
            .collect();
        gone.sort();
        for (s, t, a) in gone {
            let req = self.engine.farm(s).stages[t.stage as usize]
                .resources
                .clone();
            self.claims.remove(&(s, t));
            self.unload(from, &req);
            self.engine.unclaim(now, s, t, a);
        }
    }

    /// Whether `from`'s list of what it holds would change nothing here:
    /// every task on it a claim of `from`'s in this very attempt, and no
    /// claim recorded for it that the list leaves out (the common case
    /// of `on_claims_listed`), with nothing waiting on its word (no
    /// settling, nothing it listed before its farm came, no early report).
    pub(super) fn lists_nothing_new(&self, from: NodeId, tasks: &[Assigned]) -> bool {
        self.settle.is_none()
            && self.reports_early.is_empty()
            && !self.held_early.contains_key(&from)
            && self.load.get(&from).is_none_or(|(_, k)| *k <= tasks.len())
            && tasks.iter().all(|a| {
                self.farms.get(&a.farm).is_some_and(|f| {
                    self.claims
                        .get(&(f.slot, a.task))
                        .is_some_and(|(owner, attempt, _)| *owner == from && *attempt == a.attempt)
                })
            })
    }

    /// Whether `from` holds the claim on `a` now: it did, or the engine,
    /// which had the task pending, lets it adopt the claim.
    fn owns_claim(&mut self, now: Millis, from: NodeId, a: Assigned) -> bool {
        let Some(f) = self.farms.get(&a.farm) else {
            return false;
        };
        let slot = f.slot;
        if let Some((owner, attempt, _)) = self.claims.get(&(slot, a.task)) {
            return *owner == from && *attempt == a.attempt;
        }
        if !self.engine.adopt_claim(slot, a.task, a.attempt) {
            return false;
        }
        self.claims.insert((slot, a.task), (from, a.attempt, now));
        let (load, count) = self.load.entry(from).or_default();
        load.give(&f.spec.def.stages[a.task.stage as usize].resources);
        *count += 1;
        true
    }

    /// A farm has come: the claims members listed for it before it did are theirs.
    fn adopt_early(&mut self, now: Millis, farm: FarmId) {
        let mut nodes: Vec<NodeId> = self.held_early.keys().copied().collect();
        nodes.sort();
        for node in nodes {
            let list = self.held_early.remove(&node).expect("listed above");
            let (now_known, rest): (Vec<Assigned>, Vec<Assigned>) =
                list.into_iter().partition(|a| a.farm == farm);
            for a in now_known {
                self.owns_claim(now, node, a);
            }
            if !rest.is_empty() {
                self.held_early.insert(node, rest);
            }
        }
    }

    /// A farm has come: the reports of it that came first are counted.
    pub(super) fn report_early(&mut self, now: Millis, farm: FarmId, cx: &Node, out: &mut Out) {
        let mut early: Vec<(NodeId, Assigned)> = self
            .reports_early
            .keys()
            .filter(|(_, a)| a.farm == farm)
            .copied()
            .collect();
        early.sort_by_key(|(n, a)| (*n, a.task, a.attempt));
        for (node, a) in early {
            let r = self.reports_early.remove(&(node, a)).expect("listed above");
            self.on_report(now, node, vec![r], cx, out);
        }
    }

    pub(super) fn on_moved(&mut self, now: Millis, from: NodeId, to: NodeId, tasks: Vec<Assigned>) {
        for a in tasks {
            let Some(f) = self.farms.get(&a.farm) else {
                continue;
            };
            let slot = f.slot;
            let req = &f.spec.def.stages[a.task.stage as usize].resources;
            let moved = self.claims.update(&(slot, a.task), |claim| {
                let ours = (claim.0, claim.1) == (from, a.attempt);
                if ours {
                    // The thief holds it from now: its next `Claimed` must list it.
                    *claim = (to, a.attempt, now);
                }
                ours
            });
            if moved == Some(true) {
                let (load, count) = self.load.entry(from).or_default();
                load.take_saturating(req);
                *count = count.saturating_sub(1);
                let (load, count) = self.load.entry(to).or_default();
                load.give(req);
                *count += 1;
            }
        }
        self.hungry.insert(from);
    }

    /// A node died: every task it held goes back to the queue, and its
    /// copies of farms are made elsewhere.
    pub(super) fn reclaim(&mut self, now: Millis, dead: NodeId, cx: &Node, out: &mut Out) {
        let mut lost: Vec<(FarmSlot, TaskRef, u32)> = self
            .claims
            .iter()
            .filter(|(_, (n, ..))| *n == dead)
            .map(|((s, t), (_, a, _))| (*s, *t, *a))
            .collect();
        lost.sort();
        // A task that reaches the crash limit here failed on the dead node.
        let mut by = Reported {
            node: Some(dead),
            ..Reported::default()
        };
        for (s, t, a) in lost {
            self.claims.remove(&(s, t));
            self.engine.lost(now, s, t, a);
            self.drain_for(&mut by, out);
        }
        self.copy_lost(now, dead, cx);
        self.held_early.remove(&dead);
        self.reports_early.retain(|(n, _), _| *n != dead);
        self.load.remove(&dead);
        self.ends.forget(dead);
        self.hungry.remove(&dead);
        self.started.note(dead, &[]);
        // A holder is gone: another live node takes a copy.
        self.ensure_holders(now, cx, out);
        self.accept_ready(cx, out);
        self.release_acks(cx, out);
    }

    /// Stops a farm: the engine kills what runs (each claim's node is told).
    pub(super) fn cancel(&mut self, farm: FarmId, out: &mut Out) {
        if let Some(f) = self.farms.get(&farm) {
            let slot = f.slot;
            self.engine.cancel(slot);
            self.drain(out);
        }
    }

    /// Stops one task of a farm: the engine kills it where it runs, or
    /// drops it from what waits.
    pub(super) fn cancel_task(&mut self, farm: FarmId, task: TaskRef, out: &mut Out) {
        if let Some(f) = self.farms.get(&farm) {
            let slot = f.slot;
            self.engine.cancel_task(slot, task);
            self.drain(out);
        }
    }

    fn unload(&mut self, node: NodeId, req: &Resources) {
        let (load, count) = self.load.entry(node).or_default();
        load.take_saturating(req);
        *count = count.saturating_sub(1);
        self.hungry.insert(node);
    }

    // ----- checks -----

    /// The engine's cheap checks, and one claim per task the engine counts as running.
    pub(super) fn check_counts(&self, me: NodeId) -> Result<(), String> {
        self.engine.check_invariants()?;
        if self.claims.len() != self.engine.live_runs() {
            return Err(format!(
                "coordinator {me}: {} claims, {} tasks running",
                self.claims.len(),
                self.engine.live_runs()
            ));
        }
        Ok(())
    }

    /// The stages whose runs changed and the nodes whose claims did, since the last call.
    pub(super) fn check_step(&mut self, me: NodeId) -> Result<(), String> {
        self.engine.check_changed_runs()?;
        let mut touched = self.claims.take_touched();
        touched.sort_unstable();
        touched.dedup();
        for &n in &touched {
            let claimed = self.claims.in_group(&n);
            let booked = self.load.get(&n).map_or(0, |(_, k)| *k);
            if claimed != booked {
                return Err(format!(
                    "coordinator {me}: node {n} has {claimed} claims, load says {booked}"
                ));
            }
        }
        self.claims.recycle_touched(touched);
        Ok(())
    }

    /// The engine's runs per stage and each node's claims against the load
    /// booked for it, by a pass over every claim.
    pub(super) fn check_tasks(&self, me: NodeId) -> Result<(), String> {
        self.engine.check_runs()?;
        self.claims.recount()?;
        let mut counts: FxHashMap<NodeId, usize> = FxHashMap::default();
        for (n, ..) in self.claims.values() {
            *counts.entry(*n).or_default() += 1;
        }
        for (n, (_, k)) in &self.load {
            let claimed = counts.get(n).copied().unwrap_or(0);
            if claimed != *k {
                return Err(format!(
                    "coordinator {me}: node {n} has {claimed} claims, load says {k}"
                ));
            }
        }
        for (fid, f) in &self.farms {
            // A stage passed over as settled is shown as it settled.
            for (s, c) in self.engine.settled_counts(f.slot) {
                if f.shown.stages().get(s as usize) != Some(c) {
                    return Err(format!(
                        "coordinator {me}: farm {fid} stage {s} settled at {c:?}, shown as {:?}",
                        f.shown.stages().get(s as usize)
                    ));
                }
            }
        }
        Ok(())
    }
}
