//! The coordinator's side of replication: which nodes keep a copy of each farm, its log streamed to them, farms accepted once durable on enough of them, and workers acknowledged once their results are.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use super::super::super::msg::*;
use super::super::super::replica::entry_record;
use super::super::out::Out;
use super::super::Node;
use super::{Coord, CoordFarm, Holder};
use crate::engine::{self, Front, Millis, Order};

/// Most entries in one `Sync`, and most sent to a holder ahead of its acknowledgement.
pub(in super::super) const SYNC_BATCH: usize = 4096;
pub(in super::super) const SYNC_WINDOW: u64 = 4 * SYNC_BATCH as u64;
/// Most entries in one `Submit` or `Offer` (an entry is tens of bytes, more with outputs).
pub(in super::super) const OFFER_MAX: usize = 16384;

/// Offers a farm and what is known of it, in messages of bounded size.
pub(in super::super) fn offer(
    out: &mut Out,
    to: NodeId,
    farm: Arc<FarmSpec>,
    entries: Vec<Entry>,
    home: Home,
    writer: Option<Writer>,
) {
    let id = farm.id;
    let mut chunks = entries.chunks(OFFER_MAX);
    let first = chunks.next().map(<[Entry]>::to_vec).unwrap_or_default();
    out.send(
        to,
        Msg::Submit {
            farm,
            entries: first,
            home,
            writer,
        },
    );
    for chunk in chunks {
        out.send(
            to,
            Msg::Offer {
                farm: id,
                entries: chunk.to_vec(),
            },
        );
    }
}

/// A farm's copies, and the places among them this node's side keeps,
/// since the side may be one of several that work the farm apart (see
/// `Order::apart`): a node that kept a copy was lost from sight, or this
/// node took the farm over from a copy whose writer it did not see.
///
/// A node is on one side only, so the places the sides keep never meet
/// when each keeps those of the copies it is sure it has: the writer's
/// side place 0 and the nodes it still hears from, a side that took the
/// farm over the nodes that offered it their copies (one still listed in
/// this node's membership may be on another side, not yet declared dead).
pub(super) struct Apart {
    /// The writer's first front, per stage.
    base: Vec<Front>,
    /// Per stage, the tasks done when the writer's work stopped, as far
    /// as this node knew.
    done: Vec<u32>,
    holders: Vec<NodeId>,
    owned: BTreeSet<u32>,
}

/// A farm offered to this node as coordinator (`Msg::Submit`), as the
/// event function, [`Coord::take_farm`] and [`Coord::resubmitted`] hear
/// it: when, by whom, and what the offer carries.
pub(in super::super) struct Offered {
    pub(in super::super) now: Millis,
    pub(in super::super) from: NodeId,
    pub(in super::super) farm: Arc<FarmSpec>,
    pub(in super::super) entries: Vec<Entry>,
    pub(in super::super) home: Home,
    pub(in super::super) writer: Option<Writer>,
}

/// `Msg::Synced` as [`Coord::on_synced`] hears it: the holder, the farm,
/// the first entry it does not have durably, and whether it knows every
/// task of the farm is over.
pub(in super::super) struct SyncAcked {
    pub(in super::super) from: NodeId,
    pub(in super::super) farm: FarmId,
    pub(in super::super) next: u64,
    pub(in super::super) over: bool,
    pub(in super::super) stages: u64,
}

impl Apart {
    /// `node`'s place among the copies, from 1.
    fn place(&self, node: NodeId) -> Option<u32> {
        let j = self.holders.iter().position(|&h| h == node)?;
        Some(j as u32 + 1)
    }

    fn orders(&self, def: &crate::farm::FarmDef) -> Vec<Order> {
        let k = self.holders.len() as u32;
        let owned: Vec<u32> = self.owned.iter().copied().collect();
        def.stages
            .iter()
            .enumerate()
            .map(|(s, stage)| {
                let base = self.base.get(s).copied().unwrap_or(Front::ASCENDING);
                let done = self.done.get(s).copied().unwrap_or(0);
                Order::apart(base, done, stage.len(), k, &owned)
            })
            .collect()
    }
}

/// Each stage's first front.
fn bases(order: &[Order], stages: usize) -> Vec<Front> {
    (0..stages)
        .map(|s| order.get(s).map_or(Front::ASCENDING, |o| o.fronts()[0]))
        .collect()
}

/// What every `Sync` of a farm says besides its entries.
struct SyncHead {
    log: u64,
    farm: FarmId,
    len: u64,
    home: Home,
    duplicates: u64,
    unplaceable: Vec<(u32, String)>,
    stopped: Vec<(u32, engine::Stop)>,
    counts: engine::Counts,
    /// Every task is over and no more will come (an open farm is never).
    finished: bool,
    order: Vec<Order>,
    holders: Vec<NodeId>,
}

impl SyncHead {
    fn msg(&self, from: u64, entries: Vec<Entry>, stages: &StagesSent) -> SyncMsg {
        SyncMsg {
            term: 0,
            seq: 0,
            log: self.log,
            farm: self.farm,
            from,
            entries,
            len: self.len,
            home: self.home,
            finished: self.finished,
            counts: self.counts.clone(),
            stages: stages.changed.clone(),
            stages_base: stages.base,
            stages_version: stages.version,
            duplicates: self.duplicates,
            unplaceable: self.unplaceable.clone(),
            stopped: self.stopped.clone(),
            order: self.order.clone(),
            holders: self.holders.clone(),
        }
    }
}

/// The stages' counts one holder is sent: those changed after the
/// version it has (`base`), up to `version`.
struct StagesSent {
    base: u64,
    version: u64,
    changed: Vec<(u32, engine::Counts)>,
}

/// Where the log streamed to a holder whose offer is merged starts again.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Stream {
    /// From its first entry: the holder (re)started or lost track.
    Anew,
    /// From where it was: the holder offers a later generation it made.
    Keep,
}

impl Coord {
    /// A holder offers a farm the coordinator has: a higher home claim is
    /// taken, and what the holder knows is merged. `grew`: the offer was
    /// a later generation, which the holder that made it offers as it
    /// grows, not because it restarted or lost track of the log.
    pub(in super::super) fn resubmitted(&mut self, offered: Offered, grew: bool, out: &mut Out) {
        let Offered {
            now,
            from,
            farm,
            entries,
            home,
            ..
        } = offered;
        let farm = farm.id;
        self.awaited.remove(&(farm, from));
        let f = self.farms.get_mut(&farm).expect("checked by the caller");
        if let Some(apart) = &mut f.apart {
            // Another copy on this side: its place is this side's too.
            if apart.place(from).is_some_and(|j| apart.owned.insert(j)) {
                f.order = apart.orders(&f.spec.def);
                self.engine.reorder(f.slot, &f.order);
            }
        }
        if home > f.home {
            // Taken over: every holder hears of the new home with the next progress.
            f.home = home;
            f.counts_sent = None;
            f.finished_sent = false;
        }
        let stream = if grew { Stream::Keep } else { Stream::Anew };
        self.merge(now, from, farm, entries, stream, out);
    }

    /// A farm new here, offered by `from`: coordinated from what it knows.
    /// True when this node must keep a copy too, once it has the farm's
    /// inputs.
    pub(in super::super) fn take_farm(&mut self, offered: Offered, cx: &Node) -> bool {
        let Offered {
            now,
            from,
            farm,
            entries,
            home,
            writer,
        } = offered;
        let me = cx.id;
        let stages = farm.def.stages.len();
        let another = writer.as_ref().is_some_and(|w| w.node != me);
        let (order, apart) = match writer {
            None => (Vec::new(), None),
            // One that hands its farm over (it offers it itself), or that
            // this node sees (it will hear of this one and hand over), has
            // stopped: going on its way keeps this one next to its work
            // and away from that of any side it never saw, which went
            // apart from it.
            Some(w) if w.node == from || cx.live(w.node) => (w.order, None),
            // Out of sight, it may still hand the farm's tasks out on the
            // far side of a partition, and other sides may have taken it
            // over from the other copies.
            Some(w) => {
                let mut apart = Apart {
                    base: bases(&w.order, stages),
                    done: Vec::new(),
                    owned: BTreeSet::new(),
                    holders: w.holders,
                };
                // A copy that does not list the node that offered it
                // (written before it had one) leaves this side the far end.
                let k = apart.holders.len().max(1) as u32;
                apart.owned.insert(apart.place(from).unwrap_or(k));
                if self.settle.is_some() {
                    // Those on this side offer theirs as they follow,
                    // within a round trip, and bring their places.
                    let others = apart.holders.iter().filter(|&&h| h != from && cx.live(h));
                    self.awaited.extend(others.map(|&h| (farm.id, h)));
                }
                (Vec::new(), Some(apart))
            }
        };
        let records = entries
            .iter()
            .map(|e| (e.task(), entry_record(e)))
            .collect();
        let (origin, id) = (farm.origin, farm.id);
        let slot = self.add_farm(now, farm, records, entries, order).slot;
        if let Some(mut apart) = apart {
            let progress = self.engine.stage_progress(slot);
            apart.done = progress.iter().map(|c| c.done as u32).collect();
            let f = self.farms.get_mut(&id).expect("just added");
            f.order = apart.orders(&f.spec.def);
            self.engine.reorder(slot, &f.order);
            f.apart = Some(apart);
        }
        let f = self.farms.get_mut(&id).expect("just added");
        f.home = f.home.max(home);
        // The home keeps it durably, and so does the holder that offered it
        // and this node, once it has the inputs.
        f.holders.push(Holder::new(origin, true));
        if from != origin {
            f.holders.push(Holder::new(from, true));
        }
        let here = me != origin && me != from;
        if here {
            f.holders.push(Holder::new(me, false));
        }
        if another {
            // Another coordinator's workers may be running its tasks, all
            // pending here: placed now, they would run twice.
            self.settle_again(now + cx.cfg.resend_ms, cx.members.ids());
        }
        self.adopt_early(now, id);
        here
    }

    /// `dead` is out of sight: where it kept a copy of a farm, it may be on
    /// another side of a partition that took the farm over from it, and
    /// this side keeps only the places of those it still hears from.
    pub(super) fn copy_lost(&mut self, now: Millis, dead: NodeId, cx: &Node) {
        // Those cut off with `dead` have been silent about as long, and are
        // declared dead one at a time, each after its own suspicion: a
        // place kept for one of them would be worked on two sides. One
        // that reports to this node is heard at least twice a limit (three
        // of its reports, at least `dead_after_ms`): half of it has heard
        // one, however its reports stretch with the mesh.
        let half = super::super::membership::silence_limit(&cx.cfg, cx.members.len() + 1) / 2;
        let heard = |h: NodeId| {
            cx.members
                .get(h)
                .is_some_and(|m| now.saturating_sub(m.last_seen()) <= half)
        };
        for fid in &self.slots {
            let f = self.farms.get_mut(fid).expect("slots and farms agree");
            let changed = match &mut f.apart {
                // A side keeps working the places it had, if it has none left.
                Some(apart) => {
                    apart.place(dead).is_some_and(|j| apart.owned.remove(&j))
                        && !apart.owned.is_empty()
                }
                None => {
                    // The copies its syncs listed, as the other sides have them.
                    let holders = f.copies(cx.id, |n| n == dead || cx.members.contains(n));
                    if !holders.contains(&dead) {
                        continue;
                    }
                    let progress = self.engine.stage_progress(f.slot);
                    let mut apart = Apart {
                        base: bases(&f.order, f.spec.def.stages.len()),
                        done: progress.iter().map(|c| c.done as u32).collect(),
                        owned: BTreeSet::from([0]),
                        holders,
                    };
                    let seen = apart.holders.iter().filter(|&&h| heard(h));
                    let places: Vec<u32> = seen.filter_map(|&h| apart.place(h)).collect();
                    apart.owned.extend(places);
                    // Place 0 alone is the writer's way as it was: no
                    // farm's order changes with a dead node at two replicas.
                    f.apart.insert(apart).owned.len() > 1
                }
            };
            if changed {
                let apart = f.apart.as_ref().expect("set above");
                f.order = apart.orders(&f.spec.def);
                self.engine.reorder(f.slot, &f.order);
            }
        }
    }

    /// More of what a holder knows of a farm the coordinator has.
    pub(in super::super) fn on_offer(
        &mut self,
        now: Millis,
        from: NodeId,
        farm: FarmId,
        entries: Vec<Entry>,
        out: &mut Out,
    ) {
        if self.farms.contains_key(&farm) {
            self.merge(now, from, farm, entries, Stream::Anew, out);
        }
    }

    /// Folds a holder's entries into a farm the coordinator has (what it
    /// did not know is recorded and streamed to the others) and answers it;
    /// `stream` says where the log streamed to it starts again.
    fn merge(
        &mut self,
        now: Millis,
        from: NodeId,
        farm: FarmId,
        entries: Vec<Entry>,
        stream: Stream,
        out: &mut Out,
    ) {
        let f = self.farms.get_mut(&farm).expect("checked by the caller");
        let mut new = Vec::new();
        for e in entries {
            if let Entry::Done {
                task,
                node,
                attempt,
                ..
            } = &e
            {
                if f.log.is_done(*task) && f.log.get(*task) != Some(&e) {
                    // Both sides of a partition (or a node thought dead) ran it.
                    f.extra_run(*task, *node, *attempt);
                }
            }
            if f.add_entry(e.clone()) {
                match &e {
                    Entry::Done { .. } => {
                        let grew = e.ran().and_then(|r| r.grew);
                        self.engine.mark_done(now, f.slot, e.task(), grew);
                    }
                    Entry::Redo { .. } => {
                        self.engine.redo(f.slot, e.task());
                    }
                    Entry::Failed { .. } => {}
                }
                new.push(e);
            }
        }
        match f.holders.iter_mut().find(|h| h.node == from) {
            // A growth: the log streams on from where it was (sent again
            // whole, each growth cost the square of the farm's growths).
            // A holder that lost its copy says so by what it acknowledges.
            Some(h) if stream == Stream::Keep => h.has_spec = true,
            _ => {
                // A holder offers a farm the coordinator has when it
                // (re)started or lost track: it gets the whole log again,
                // and the progress.
                f.holders.retain(|h| h.node != from);
                f.holders.push(Holder::new(from, true));
                f.counts_sent = None;
                f.finished_sent = false;
            }
        }
        // A growth is said durable once its own copies are (accept_grown),
        // not because the generation before it was.
        let (accepted, tasks) = (f.accepted && f.gen_accepted >= f.spec.gen, f.tasks);
        out.persist_entries(farm, new, true);
        self.drain(out);
        if accepted {
            out.send(from, Msg::Accepted { farm, tasks });
        }
    }

    /// The home says these outputs are lost: the tasks run again.
    pub(in super::super) fn on_redo(&mut self, farm: FarmId, tasks: Vec<TaskRun>, out: &mut Out) {
        let Some(f) = self.farms.get_mut(&farm) else {
            return;
        };
        let mut redone = Vec::new();
        for run in tasks {
            let e = Entry::Redo {
                task: run.task,
                node: run.node,
                attempt: run.attempt,
            };
            if !f.add_entry(e.clone()) {
                if f.log.is_done(run.task) {
                    // Another run is the one that counts here: the home, which
                    // took the lost one, hears of this one again.
                    f.log.repeat(run.task);
                }
                continue;
            }
            self.engine.redo(f.slot, run.task);
            redone.push(e);
        }
        if !redone.is_empty() {
            // Unfinished again: its holders hear of it at the rounds
            // until it is over again (`poll_timeout`).
            f.finished_sent = false;
        }
        out.persist_entries(farm, redone, true);
        self.drain(out);
    }

    /// `node` keeps the farm's definition and inputs durably.
    /// `node` says its copy of `farm` is durable at generation `gen`; the
    /// spec to send it whole when that is older than the one here.
    pub(in super::super) fn has_copy(
        &mut self,
        farm: FarmId,
        node: NodeId,
        gen: u32,
    ) -> Option<Arc<FarmSpec>> {
        let f = self.farms.get_mut(&farm)?;
        let h = f.holders.iter_mut().find(|h| h.node == node);
        let holder = h.is_some();
        if let Some(h) = h {
            h.has_spec = true;
        }
        if gen >= f.spec.gen {
            f.grown_copies.insert(node);
            return None;
        }
        holder.then(|| f.spec.clone())
    }

    /// Every farm the coordinator has is held by enough live nodes: the
    /// lowest live members not yet holding one are asked to.
    pub(in super::super) fn ensure_holders(&mut self, now: Millis, cx: &Node, out: &mut Out) {
        let need = cx.holders_needed();
        let mut asks = Vec::new();
        for fid in &self.slots {
            let f = &self.farms[fid];
            let live = |n: &NodeId| *n != cx.id && cx.members.contains(*n);
            let have = f.holders.iter().filter(|h| live(&h.node)).count();
            let extra = cx
                .members
                .ids()
                .filter(|n| !f.holders.iter().any(|h| h.node == *n))
                .take(need.saturating_sub(have));
            for n in extra {
                asks.push((*fid, n));
            }
        }
        let term = cx.term();
        for (fid, n) in asks {
            let f = self.farms.get_mut(&fid).expect("listed above");
            let mut h = Holder::new(n, false);
            h.at = now;
            f.holders.push(h);
            let spec = f.spec.clone();
            out.send(n, Msg::Replicate { term, farm: spec });
        }
    }

    /// Acknowledges every farm whose definition and inputs are durable on
    /// enough nodes (this one included).
    pub(in super::super) fn accept_ready(&mut self, cx: &Node, out: &mut Out) {
        let need = cx.holders_needed() + 1;
        let mut ready = Vec::new();
        for fid in &self.slots {
            let f = &self.farms[fid];
            let have = f
                .holders
                .iter()
                .filter(|h| h.has_spec && cx.live(h.node))
                .count();
            if !f.accepted && have >= need {
                ready.push(*fid);
            }
        }
        self.accept_grown(cx, out);
        for fid in ready {
            let f = self.farms.get_mut(&fid).expect("listed above");
            f.accepted = true;
            f.gen_accepted = f.spec.gen;
            let tasks = f.tasks;
            let to: Vec<NodeId> = f
                .holders
                .iter()
                .filter(|h| h.has_spec || h.node == cx.id)
                .map(|h| h.node)
                .collect();
            for n in to {
                out.send(n, Msg::Accepted { farm: fid, tasks });
            }
        }
    }

    /// How far a farm's log is durable on enough holders other than this node.
    fn replicated(f: &CoordFarm, cx: &Node) -> u64 {
        let need = cx.holders_needed();
        if need == 0 {
            return f.log.len();
        }
        let mut acked: Vec<u64> = f
            .holders
            .iter()
            .filter(|h| h.node != cx.id && cx.members.contains(h.node))
            .map(|h| h.acked)
            .collect();
        acked.sort_unstable_by(|a, b| b.cmp(a));
        acked.get(need - 1).copied().unwrap_or(0)
    }

    /// Acknowledges the reports whose entries are now durable on enough holders.
    pub(in super::super) fn release_acks(&mut self, cx: &Node, out: &mut Out) {
        let mut acks: BTreeMap<NodeId, Vec<Assigned>> = BTreeMap::new();
        for fid in &self.slots {
            let f = self.farms.get_mut(fid).expect("slots and farms agree");
            let Some(&(first, ..)) = f.waiting.front() else {
                continue;
            };
            // Asked after every report, and nearly always answered no until
            // the holders acknowledge the next sync: no holder has the
            // first entry waiting (no member looked up for that).
            if cx.holders_needed() > 0 && f.holders.iter().all(|h| h.acked < first) {
                continue;
            }
            let upto = Coord::replicated(f, cx);
            while f.waiting.front().is_some_and(|(seq, ..)| *seq <= upto) {
                let (_, node, a) = f.waiting.pop_front().expect("checked");
                acks.entry(node).or_default().push(a);
            }
        }
        for (node, tasks) in acks {
            out.send(node, Msg::Ack { tasks });
        }
    }

    /// Streams each farm's log to its live holders, at most a window ahead
    /// of what they acknowledged; with `progress`, also tells them the
    /// counts when they changed (and always the end). `keeps_here`: whether
    /// this node keeps a copy of a farm (it streams to itself only then).
    pub(in super::super) fn sync_holders(
        &mut self,
        now: Millis,
        progress: bool,
        keeps_here: impl Fn(FarmId) -> bool,
        cx: &Node,
        out: &mut Out,
    ) {
        let mut syncs = Vec::new();
        let mut told = false;
        for fid in &self.slots {
            let f = self.farms.get_mut(fid).expect("slots and farms agree");
            let started = &self.started;
            f.shown
                .refresh(&mut self.engine, f.slot, |s| started.of(*fid, s));
            let counts = f.shown.sum().clone();
            let finished = self.engine.over(f.slot, &counts);
            // Nothing runs or waits: what ended goes out at once, not with
            // the next round, over or not (an open farm's client waits on
            // it: a lone call's value came 200 ms late, at the round).
            let settled = counts.finished();
            let news = (progress || settled) && f.counts_sent.as_ref() != Some(&counts);
            if news {
                f.counts_sent = Some(counts.clone());
                f.finished_sent = finished;
                told = true;
            }
            let mut head = None;
            let len = f.log.len();
            for i in 0..f.holders.len() {
                let h = &f.holders[i];
                // Between progress rounds most steps have nothing for a
                // holder: asked first, before whether it is live (a member
                // lookup at every step of a busy coordinator).
                if !(progress
                    || settled
                    || f.sync_soon
                    || len.saturating_sub(h.sent) >= SYNC_BATCH as u64)
                {
                    continue;
                }
                // This node streams to itself only where it keeps a copy.
                let live = if h.node == cx.id {
                    keeps_here(*fid)
                } else {
                    cx.members.contains(h.node)
                };
                if !live || !h.has_spec {
                    continue;
                }
                let head = head.get_or_insert_with(|| {
                    let mut unplaceable = f.unplaceable.clone();
                    unplaceable.retain(|(s, _)| self.engine.unplaceable(f.slot, *s));
                    SyncHead {
                        log: self.log_id,
                        farm: *fid,
                        len: f.log.len(),
                        home: f.home,
                        duplicates: f.duplicates,
                        unplaceable,
                        stopped: self.engine.stage_stops(f.slot),
                        counts: counts.clone(),
                        finished,
                        order: f.order.clone(),
                        holders: f.copies(cx.id, |n| cx.members.contains(n)),
                    }
                });
                let h = &mut f.holders[i];
                // Entries go out with the progress round, or at once when a
                // batch is full or nothing is left to run: one sync per round
                // rather than one per completion (each costs a message and
                // an answer; only the workers' acknowledgements wait for it).
                let due =
                    progress || settled || f.sync_soon || f.log.len() - h.sent >= SYNC_BATCH as u64;
                if !(news || due && h.sent < f.log.len()) {
                    continue;
                }
                let mut sent_any = false;
                // The stages' counts that changed since the holder's version
                // of them: a growth's few, not the farm's thousands.
                let stages = StagesSent {
                    base: h.stages_acked,
                    version: f.shown.version(),
                    changed: f.shown.since(h.stages_acked),
                };
                while due && h.sent < f.log.len() && h.sent - h.acked.min(h.sent) < SYNC_WINDOW {
                    let entries = f.log.slice(h.sent, SYNC_BATCH).to_vec();
                    let from = h.sent;
                    h.sent += entries.len() as u64;
                    h.at = now;
                    sent_any = true;
                    syncs.push((h.node, head.msg(from, entries, &stages)));
                }
                if news && !sent_any {
                    syncs.push((h.node, head.msg(h.sent, Vec::new(), &stages)));
                }
            }
            f.sync_soon = false;
        }
        if progress {
            let (every, due) = (cx.cfg.progress_ms.max(1), self.next_progress);
            self.next_progress = if told || !syncs.is_empty() || now <= due {
                now + every
            } else {
                // A round with nothing to tell, fired late (it woke no
                // one, see `progress_quiet`): the next keeps the phase.
                let passed = (now - due) / every + 1;
                if cx.members.skips_quiet() {
                    out.stats.quiet_timers += passed;
                }
                due + every * passed
            };
        }
        for (to, mut m) in syncs {
            m.term = cx.term();
            self.sync_seq += 1;
            m.seq = self.sync_seq;
            out.send(to, Msg::Sync(Box::new(m)));
        }
    }

    /// Whether a progress round now would tell the holders nothing: every
    /// farm's counts as last sent and its log all sent, nothing to sync
    /// soon. Then its timer wakes no one (where quiet timers are skipped)
    /// and the round fires first with the node's next step, keeping its
    /// phase. The counts it reads are those the last step's sync
    /// refreshed (see `syncs_nothing`).
    pub(in super::super) fn progress_quiet(&self) -> bool {
        self.farms.values().all(|f| {
            let len = f.log.len();
            !f.sync_soon
                && f.counts_sent.as_ref() == Some(f.shown.sum())
                && f.holders.iter().all(|h| h.sent >= len)
        })
    }

    /// Whether [`sync_holders`](Self::sync_holders) outside a progress
    /// round would send nothing and change nothing now: no farm to sync
    /// soon, no holder a batch behind, and every settled farm's counts
    /// and entries already out. The counts it reads are those the last
    /// step's sync refreshed: only a step changes the engine, and every
    /// step ends with a sync.
    pub(in super::super) fn syncs_nothing(&self) -> bool {
        self.farms.values().all(|f| {
            let len = f.log.len();
            let counts = f.shown.sum();
            !f.sync_soon
                && f.holders
                    .iter()
                    .all(|h| len.saturating_sub(h.sent) < SYNC_BATCH as u64)
                && (!counts.finished()
                    || f.counts_sent.as_ref() == Some(counts)
                        && f.holders.iter().all(|h| h.sent >= len))
        })
    }

    /// A holder has every entry before `next` durably.
    pub(in super::super) fn on_synced(&mut self, acked: SyncAcked, cx: &Node, out: &mut Out) {
        let SyncAcked {
            from,
            farm,
            next,
            over,
            stages,
        } = acked;
        let Some(f) = self.farms.get_mut(&farm) else {
            return;
        };
        let Some(h) = f.holders.iter_mut().find(|h| h.node == from) else {
            return;
        };
        if next < h.acked {
            // It lost its copy of this log (restarted): from there again.
            h.sent = next;
        }
        h.acked = next;
        h.sent = h.sent.max(next);
        if stages < h.stages_acked {
            // It lost its stages' counts (restarted) or could not take the
            // last changes: all it lacks go with the next progress round,
            // which a farm whose counts no longer change would not send.
            f.counts_sent = None;
        }
        h.stages_acked = stages;
        h.has_spec = true;
        h.over = over;
        self.release_acks(cx, out);
    }

    /// Sends again what holders did not acknowledge: log entries lost on
    /// the way, an end not heard, a request to keep a copy not answered.
    pub(in super::super) fn resend_holders(&mut self, now: Millis, cx: &Node, out: &mut Out) {
        let mut asks = Vec::new();
        let grace = cx.cfg.resend_ms;
        for f in self.farms.values_mut() {
            for h in &mut f.holders {
                if h.acked < h.sent && now >= h.at + grace {
                    // Lost on the way (or the holder was down): again from
                    // what it has.
                    h.sent = h.acked;
                }
                if f.finished_sent && !h.over && now >= h.at + grace {
                    // The end went out and was not heard: say it again
                    // (with the next progress round).
                    h.at = now;
                    f.counts_sent = None;
                }
                if !h.has_spec
                    && h.node != cx.id
                    && cx.members.contains(h.node)
                    && now >= h.at + grace
                {
                    // Asked to keep a copy and not heard from: again.
                    h.at = now;
                    asks.push((h.node, f.spec.clone()));
                }
            }
            if f.accepted && f.gen_accepted < f.spec.gen && now >= f.grown_at + grace {
                // A growth not said kept by a holder that keeps the farm
                // (lost on the way, or the holder was down): the farm
                // whole, as the holder's generation is not known here.
                f.grown_at = now;
                for h in &f.holders {
                    if h.has_spec
                        && h.node != cx.id
                        && cx.members.contains(h.node)
                        && !f.grown_copies.contains(&h.node)
                    {
                        asks.push((h.node, f.spec.clone()));
                    }
                }
            }
        }
        for (to, farm) in asks {
            out.send(
                to,
                Msg::Replicate {
                    term: cx.term(),
                    farm,
                },
            );
        }
    }
}
