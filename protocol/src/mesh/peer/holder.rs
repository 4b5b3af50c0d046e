//! The holder and the home: the copies of farms this node keeps (it submitted them, or keeps them for the mesh), each brought up to date from the coordinator's log, and on a farm's home the outputs brought here.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use super::super::msg::*;
use super::super::replica::{Replica, StoredFarm};
use super::action::{Action, Fetched, PeerEvent, Persist};
use super::coordinator::{offer, OFFER_MAX, SYNC_WINDOW};
use super::election::Leader;
use super::out::Out;
use super::Node;
use crate::engine::{self, Millis};
use crate::farm::TaskRef;

/// Most outputs a home fetches at once per farm, and after how many
/// resend periods an unanswered fetch is asked again.
const FETCHES_MAX: usize = 64;
const FETCH_RETRY_RESENDS: u64 = 30;

/// The driver's answer to an [`Action::Fetch`], as
/// [`Holdings::fetched`] hears it: the farm, the task whose outputs were
/// asked for, and whether they came.
pub(super) struct FetchAnswered {
    pub(super) farm: FarmId,
    pub(super) task: TaskRef,
    pub(super) got: Fetched,
}

#[derive(Default)]
pub(super) struct Holdings {
    /// Farms this node holds a copy of (it submitted them, or keeps them
    /// for the mesh).
    replicas: BTreeMap<FarmId, Replica>,
    /// Farms kept on this node's store, to coordinate if it is elected.
    stored: Vec<StoredFarm>,
    /// Farms whose inputs this node is bringing before its copy counts.
    inputs_wanted: BTreeSet<FarmId>,
    /// On a home: nodes keeping outputs it wants that it has not seen as
    /// members since it started, and since when it has wanted them.
    unseen: BTreeMap<NodeId, Millis>,
}

impl Holdings {
    pub(super) fn get(&self, farm: FarmId) -> Option<&Replica> {
        self.replicas.get(&farm)
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = &Replica> {
        self.replicas.values()
    }

    pub(super) fn keeps(&self, farm: FarmId) -> bool {
        self.replicas.contains_key(&farm)
    }

    /// Farms kept on this node's store, handed to the coordinator this
    /// node has become (once).
    pub(super) fn take_stored(&mut self) -> Vec<StoredFarm> {
        std::mem::take(&mut self.stored)
    }

    /// A farm found in this node's store at startup: held again (and
    /// offered to the coordinator until it is over), and coordinated here
    /// if this node is elected. `finished`: it was over here, with these counts.
    pub(super) fn restore(
        &mut self,
        me: NodeId,
        stored: StoredFarm,
        finished: Option<(engine::Counts, Vec<engine::Counts>)>,
    ) {
        let spec = stored.spec.clone();
        let mut r = Replica::new(spec.clone(), me);
        if let Some((home, out)) = &stored.home {
            r.home_of = *home;
            r.home = home.node == me;
            r.out = out.clone();
        }
        r.collected.extend(stored.collected.iter().copied());
        for e in &stored.entries {
            r.add(e.clone());
        }
        if let Some((counts, stages)) = finished {
            r.counts = counts;
            for (s, c) in stages.into_iter().enumerate() {
                r.stages.set(s, c);
            }
            r.over = true;
            r.announced = true;
            r.accepted = true;
        } else {
            r.stages_from_log();
        }
        self.replicas.insert(spec.id, r);
        self.stored.push(stored);
    }

    /// A farm submitted on this node, which becomes its home: the claim it starts with.
    pub(super) fn submitted(&mut self, me: NodeId, spec: Arc<FarmSpec>) -> Home {
        let r = Replica::new(spec.clone(), me);
        let home = r.home_of;
        self.replicas.insert(spec.id, r);
        home
    }

    /// On the home of a farm just submitted: these tasks were done before.
    /// The outputs of those this node (`me`) kept are in place here
    /// already; those of the others are brought from them as any output.
    pub(super) fn reused(&mut self, me: NodeId, farm: FarmId, entries: &[Entry], out: &mut Out) {
        let Some(r) = self.replicas.get_mut(&farm) else {
            return;
        };
        let mut here = Vec::with_capacity(entries.len());
        for e in entries {
            let mine = matches!(e, Entry::Done { node, .. } if *node == me);
            if r.add(e.clone()) && mine {
                r.collect(e.task());
                here.push(e.task());
            }
        }
        if out.persists() {
            out.persist_entries(farm, entries.to_vec(), true);
        }
        if !here.is_empty() {
            out.persist(Persist::Collected {
                farm,
                home: r.home_of,
                tasks: here,
            });
        }
    }

    /// This node becomes the farm's home: a claim above the last, every
    /// output brought to `dir` again (a copy is made here if there was none).
    pub(super) fn claim_home(
        &mut self,
        me: NodeId,
        spec: Arc<FarmSpec>,
        dir: String,
        out: &mut Out,
    ) {
        let id = spec.id;
        let r = self
            .replicas
            .entry(id)
            .or_insert_with(|| Replica::new(spec, me));
        r.home_of = Home {
            epoch: r.home_of.epoch + 1,
            node: me,
        };
        r.home = true;
        r.out = Some(dir);
        r.collected.clear();
        r.clear_fetches();
        r.recount();
        r.announced = false;
        r.accepted = false;
        out.persist(Persist::Home {
            farm: id,
            home: r.home_of,
            out: r.out.clone(),
        });
    }

    /// The coordinator asks this node to keep a copy of `farm`. True when
    /// the copy is new here, or a later generation of the one here.
    pub(super) fn replicate(&mut self, me: NodeId, farm: &Arc<FarmSpec>) -> bool {
        if let Some(r) = self.replicas.get_mut(&farm.id) {
            return r.grow(farm.clone());
        }
        let mut r = Replica::new(farm.clone(), me);
        // The coordinator that asked for the copy has it.
        r.accepted = true;
        self.replicas.insert(farm.id, r);
        true
    }

    /// A farm submitted here grew (see [`FarmSpec::grows_into`]): its
    /// copy here takes the new generation, unaccepted until the
    /// coordinator has it. The claim to offer it with, or `None` when
    /// `spec` is not a later generation of a farm this node is home of.
    pub(super) fn grew(&mut self, spec: Arc<FarmSpec>) -> Option<Home> {
        let r = self.replicas.get_mut(&spec.id).filter(|r| r.home)?;
        if !r.grow(spec) {
            return None;
        }
        r.accepted = false;
        Some(r.home_of)
    }

    pub(super) fn on_accepted(&mut self, farm: FarmId, tasks: u64, out: &mut Out) {
        if let Some(r) = self.replicas.get_mut(&farm) {
            if !r.accepted {
                r.accepted = true;
                if r.home {
                    out.emit(PeerEvent::Accepted { farm, tasks });
                }
            }
        }
    }

    pub(super) fn on_refused(&mut self, farm: FarmId, reason: String, out: &mut Out) {
        if self.replicas.get(&farm).is_some_and(|r| r.home) {
            self.replicas.remove(&farm);
            out.emit(PeerEvent::Refused { farm, reason });
        }
    }

    /// A new coordinator may not know this node's farms: they are offered
    /// again with what is known of them (it answers at once for farms it has).
    pub(super) fn offer_again(&mut self) {
        for r in self.replicas.values_mut() {
            // Not only unfinished farms: a home still bringing outputs or
            // waiting for a redone task needs a coordinator that has it.
            if !r.finished() {
                r.accepted = false;
            }
        }
    }

    // ----- inputs -----

    /// This node keeps a copy of `spec`: its inputs come here first
    /// (see `Peer::inputs_ready`). True when there are none to bring.
    pub(super) fn want_inputs(&mut self, me: NodeId, spec: &FarmSpec, out: &mut Out) -> bool {
        if spec.inputs.is_empty() || spec.origin == me {
            return true;
        }
        if self.inputs_wanted.insert(spec.id) {
            out.push(Action::FetchInputs { farm: spec.id });
        }
        false
    }

    pub(super) fn wants_inputs(&self, farm: FarmId) -> bool {
        self.inputs_wanted.contains(&farm)
    }

    /// The inputs of `farm` are here. True if they were wanted.
    pub(super) fn inputs_came(&mut self, farm: FarmId) -> bool {
        self.inputs_wanted.remove(&farm)
    }

    /// This node's copy (not the home's) counts now: the coordinator hears.
    pub(super) fn copy_complete(&self, farm: FarmId, out: &mut Out, leader: Leader) {
        if let Some(r) = self.replicas.get(&farm).filter(|r| !r.home) {
            let gen = r.spec.gen;
            leader.send(out, |_| Msg::Replicated { farm, gen });
        }
    }

    // ----- the coordinator's log -----

    /// The coordinator's log of a farm this node holds.
    pub(super) fn on_sync(
        &mut self,
        now: Millis,
        from: NodeId,
        m: SyncMsg,
        cx: &Node,
        out: &mut Out,
    ) {
        if m.term < cx.leader().term {
            return;
        }
        let me = cx.id;
        let Some(r) = self.replicas.get_mut(&m.farm) else {
            return;
        };
        if r.source != Some((from, m.log)) {
            r.source = Some((from, m.log));
            r.next = 0;
            r.seen = 0;
            r.stages_version = 0;
            r.end_len = None;
            r.ahead.clear();
        }
        if m.from > r.next {
            // Overtook an earlier sync: kept until the gap fills (bounded;
            // beyond that the coordinator sends it again from `next`).
            let held: usize = r.ahead.values().map(Vec::len).sum();
            if held + m.entries.len() <= SYNC_WINDOW as usize {
                r.ahead.insert(m.from, m.entries);
            }
        } else {
            r.ahead.insert(m.from, m.entries);
        }
        // What was added goes to the store too, where there is one: a
        // copy only then (each clone of an entry touches its outputs'
        // count, cold in the cache, at every holder of every task).
        let keeps = out.persists();
        let mut added = Vec::new();
        let had_redo = !r.redo.is_empty();
        while let Some(from) = r.ahead.keys().next().copied().filter(|f| *f <= r.next) {
            let entries = r.ahead.remove(&from).expect("just seen");
            let skip = (r.next - from) as usize;
            for e in entries.into_iter().skip(skip) {
                r.next += 1;
                let (done, task) = (e.is_done(), e.task());
                let copy = keeps.then(|| e.clone());
                if r.add(e) {
                    if done {
                        r.redo.remove(&task);
                    }
                    added.extend(copy);
                }
            }
        }
        if had_redo {
            // A redone task counts as back once this copy has a done run
            // of it other than the lost one.
            let log = &r.log;
            r.redo.retain(|t, run| match log.get(*t) {
                Some(Entry::Done { node, attempt, .. }) => {
                    (*node, *attempt) == (run.node, run.attempt)
                }
                _ => true,
            });
        }
        out.persist_entries(m.farm, added, from != me);
        if m.home > r.home_of {
            // Another node took the farm over (or this one did, and the
            // coordinator now knows): the highest claim is the home.
            r.home_of = m.home;
            r.home = m.home.node == me;
            if !r.home {
                r.clear_fetches();
            }
            out.persist(Persist::Home {
                farm: m.farm,
                home: r.home_of,
                out: r.out.clone(),
            });
        }
        if m.seq > r.seen {
            // Where the farm stands, from the newest message only.
            r.seen = m.seq;
            if r.home {
                for (stage, reason) in &m.unplaceable {
                    if !r.unplaceable.iter().any(|(s, _)| s == stage) {
                        out.emit(PeerEvent::Unplaceable {
                            farm: m.farm,
                            stage: *stage,
                            reason: reason.clone(),
                        });
                    }
                }
            }
            r.take_stages(m.stages_base, m.stages_version, &m.stages);
            r.unplaceable = m.unplaceable;
            r.stopped = m.stopped;
            r.order = m.order;
            r.holders = m.holders;
            r.counts = m.counts;
            r.duplicates = r.duplicates.max(m.duplicates);
            r.end_len = m.finished.then_some(m.len);
            if r.home && r.announced && !m.finished {
                // The coordinator reopened a farm whose end this home had
                // told (a done won over a failure after a partition healed,
                // and what that failure skipped runs now): the new outputs
                // are brought here, and the new end told again.
                r.announced = false;
            }
        }
        let was_over = r.over;
        // Over once every task is and this copy has every entry.
        r.over = r.end_len.is_some_and(|len| r.next >= len);
        let next = r.next;
        let home = r.home;
        if r.over && !was_over && !home {
            out.persist(Persist::Finished {
                farm: m.farm,
                counts: r.counts.clone(),
                stages: r.stages.to_vec(),
            });
        }
        let over = r.over;
        let stages = r.stages_version;
        out.send(
            from,
            Msg::Synced {
                farm: m.farm,
                next,
                over,
                stages,
            },
        );
        if home {
            self.fetch_missing(now, m.farm, cx, out);
            self.home_progress(m.farm, cx, out);
        }
    }

    // ----- the home -----

    /// On the home: the outputs of `task` asked for by [`Action::Fetch`]
    /// are here and verified, or could not be brought (tried again later).
    pub(super) fn fetched(
        &mut self,
        now: Millis,
        answered: FetchAnswered,
        cx: &Node,
        out: &mut Out,
    ) -> bool {
        let FetchAnswered { farm, task, got } = answered;
        let Some(r) = self.replicas.get_mut(&farm) else {
            return false;
        };
        if r.fetching.remove(&task).is_none() && got != Fetched::Here {
            return false;
        }
        match got {
            Fetched::Here => {
                if r.collect(task) {
                    out.persist(Persist::Collected {
                        farm,
                        home: r.home_of,
                        tasks: vec![task],
                    });
                }
            }
            Fetched::Later => r.queue.push_back(task),
            Fetched::Gone => {
                // The node is there but the outputs are not (its folder was
                // wiped, or it ran the task as the home before this node
                // took over): the task runs again.
                if let Some(Entry::Done { node, attempt, .. }) = r.log.get(task) {
                    let tasks = vec![TaskRun {
                        task,
                        node: *node,
                        attempt: *attempt,
                    }];
                    self.lost_outputs(farm, tasks, out, cx.leader());
                }
            }
        }
        self.fetch_missing(now, farm, cx, out);
        self.home_progress(farm, cx, out);
        true
    }

    /// On the home: asks the driver for outputs not here yet, from live
    /// nodes that keep them, a bounded number at a time; an ask that got
    /// no answer for a while is asked again.
    fn fetch_missing(&mut self, now: Millis, farm: FarmId, cx: &Node, out: &mut Out) {
        let retry = cx.cfg.resend_ms * FETCH_RETRY_RESENDS;
        let Some(r) = self.replicas.get_mut(&farm) else {
            return;
        };
        if !r.home {
            return;
        }
        // Asks that got no answer for long go back in line.
        for t in r.unanswered(now, retry) {
            r.queue.push_back(t);
        }
        let mut asks = Vec::new();
        // A bounded look down the line: outputs on nodes that are down wait
        // at its end.
        let mut looked = 0;
        while r.fetching.len() + asks.len() < FETCHES_MAX && looked < 2 * FETCHES_MAX {
            let Some(task) = r.queue.pop_front() else {
                break;
            };
            looked += 1;
            if !r.is_missing(task) || r.fetching.contains_key(&task) {
                continue;
            }
            let Some(Entry::Done { node, outputs, .. }) = r.log.get(task) else {
                continue;
            };
            if *node != cx.id && !cx.members.contains(*node) {
                r.queue.push_back(task);
                continue;
            }
            asks.push((task, *node, outputs.clone()));
        }
        for (task, from, outputs) in asks {
            r.ask_fetch(task, now);
            out.push(Action::Fetch {
                farm,
                task,
                from,
                outputs,
            });
        }
    }

    /// On the home: outputs kept by nodes gone longer than
    /// `outputs_wait_ms` (or not seen since this node started, for that
    /// long since it wanted them) are lost; the coordinator runs those
    /// tasks again.
    fn redo_lost(&mut self, now: Millis, cx: &Node, out: &mut Out) {
        let wait = cx.cfg.outputs_wait_ms;
        // Waited for from when first wanted, not from this node's start: a
        // node of a mesh met late (or of a healed partition's other side)
        // is learned of over seconds, and its runs are not lost meanwhile.
        let unseen = |n: NodeId| !cx.live(n) && cx.members.gone_since(n).is_none();
        self.unseen.retain(|n, _| unseen(*n));
        for r in self.replicas.values().filter(|r| r.home && !r.announced) {
            for n in r.missing_on().filter(|n| unseen(*n)) {
                self.unseen.entry(n).or_insert(now);
            }
        }
        let since = |n: &NodeId| {
            cx.members
                .gone_since(*n)
                .or_else(|| self.unseen.get(n).copied())
                .unwrap_or(cx.started_at)
        };
        let mut lost_all = Vec::new();
        for r in self.replicas.values().filter(|r| r.home && !r.announced) {
            if r.missing_on().all(|n| cx.live(n)) {
                continue;
            }
            let lost: Vec<TaskRun> = r
                .missing()
                .filter_map(|e| match e {
                    Entry::Done {
                        task,
                        node,
                        attempt,
                        ..
                    } if !cx.live(*node) => Some(TaskRun {
                        task: *task,
                        node: *node,
                        attempt: *attempt,
                    }),
                    _ => None,
                })
                .filter(|r| now >= since(&r.node) + wait)
                .take(OFFER_MAX)
                .collect();
            if !lost.is_empty() {
                lost_all.push((r.id(), lost));
            }
        }
        for (farm, tasks) in lost_all {
            self.lost_outputs(farm, tasks, out, cx.leader());
        }
    }

    /// On the home: these runs' outputs are lost. The home's own copy
    /// forgets them first (so whichever run the coordinator counts as done
    /// instead is taken when it comes), then the coordinator is told.
    fn lost_outputs(&mut self, farm: FarmId, tasks: Vec<TaskRun>, out: &mut Out, leader: Leader) {
        let Some(r) = self.replicas.get_mut(&farm) else {
            return;
        };
        let mut entries = Vec::new();
        for run in &tasks {
            let e = Entry::Redo {
                task: run.task,
                node: run.node,
                attempt: run.attempt,
            };
            if r.add(e.clone()) {
                r.redo.insert(run.task, *run);
                entries.push(e);
            }
        }
        out.persist_entries(farm, entries, true);
        leader.send(out, |_| Msg::Redo { farm, tasks });
    }

    /// On the home: shows the farm's progress, and once every task is over
    /// and every output here, records the end and tells every node that
    /// what it kept for the farm may go.
    pub(super) fn home_progress(&mut self, farm: FarmId, cx: &Node, out: &mut Out) {
        let Some(r) = self.replicas.get_mut(&farm) else {
            return;
        };
        if r.finished() && !r.announced {
            r.announced = true;
            out.persist(Persist::Finished {
                farm,
                counts: r.counts.clone(),
                stages: r.stages.to_vec(),
            });
            let to: Vec<NodeId> = cx.members.ids().chain([cx.id]).collect();
            for n in to {
                out.send(n, Msg::Collected { farm });
            }
        }
        out.emit(PeerEvent::Progress(farm));
    }

    // ----- resending -----

    /// Whether `resend` would do nothing whenever it came, this state
    /// kept: not the home of a farm, no node's outputs waited for, no
    /// inputs wanted.
    pub(super) fn resends_nothing(&self) -> bool {
        self.unseen.is_empty()
            && self.inputs_wanted.is_empty()
            && self.replicas.values().all(|r| !r.home)
    }

    /// The holder's and home's part of a resend: fetches of outputs, lost
    /// outputs redone, inputs still wanted.
    pub(super) fn resend(&mut self, now: Millis, cx: &Node, out: &mut Out) {
        let farms: Vec<FarmId> = self
            .replicas
            .values()
            .filter(|r| r.home && !r.announced)
            .map(|r| r.id())
            .collect();
        for farm in farms {
            self.fetch_missing(now, farm, cx, out);
        }
        self.redo_lost(now, cx, out);
        let redo: Vec<(FarmId, Vec<TaskRun>)> = self
            .replicas
            .values()
            .filter(|r| r.home && !r.redo.is_empty())
            .map(|r| (r.id(), r.redo.values().copied().take(OFFER_MAX).collect()))
            .collect();
        for (farm, tasks) in redo {
            cx.leader().send(out, |_| Msg::Redo { farm, tasks });
        }
        for farm in &self.inputs_wanted {
            out.push(Action::FetchInputs { farm: *farm });
        }
    }

    /// Farms the coordinator has not accepted, offered to it again with
    /// what is known of them: unfinished ones, and those whose home still
    /// brings outputs.
    pub(super) fn offer_unaccepted(&self, to: NodeId, out: &mut Out) {
        // Not while its inputs are still coming: an offer makes this node a
        // holder of the farm to the coordinator, and the farm could be
        // accepted (durable, its submitter free to go) on a copy without
        // them (the inputs of such a farm were found on no live node once
        // its submitter was killed).
        let unaccepted = self.replicas.values().filter(|r| {
            !r.accepted
                && (!r.over || (r.home && !r.announced))
                && !self.inputs_wanted.contains(&r.spec.id)
        });
        for r in unaccepted {
            let writer = r.source.map(|(node, _)| Writer {
                node,
                order: r.order.clone(),
                holders: r.holders.clone(),
            });
            let entries = r.log.current().cloned().collect();
            offer(out, to, r.spec.clone(), entries, r.home_of, writer);
        }
    }
}
