//! The coordinator's side of replication: which nodes keep a copy of each farm, its log streamed to them, farms accepted once durable on enough of them, and workers acknowledged once their results are.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::super::super::msg::*;
use super::super::super::replica::entry_record;
use super::super::out::Out;
use super::super::Node;
use super::{Coord, CoordFarm, Holder};
use crate::engine::{self, Front, Millis, Order, Way};

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

/// What every `Sync` of a farm says besides its entries.
struct SyncHead {
    log: u64,
    farm: FarmId,
    len: u64,
    home: Home,
    duplicates: u64,
    unplaceable: Vec<(u32, String)>,
    counts: engine::Counts,
    stages: Vec<engine::Counts>,
    order: Vec<Order>,
}

impl SyncHead {
    fn msg(&self, from: u64, entries: Vec<Entry>) -> SyncMsg {
        SyncMsg {
            term: 0,
            seq: 0,
            log: self.log,
            farm: self.farm,
            from,
            entries,
            len: self.len,
            home: self.home,
            finished: self.counts.finished(),
            counts: self.counts.clone(),
            stages: self.stages.clone(),
            duplicates: self.duplicates,
            unplaceable: self.unplaceable.clone(),
            order: self.order.clone(),
        }
    }
}

impl Coord {
    /// A holder offers a farm the coordinator has: a higher home claim is
    /// taken, and what the holder knows is merged.
    pub(in super::super) fn resubmitted(
        &mut self,
        now: Millis,
        from: NodeId,
        farm: FarmId,
        entries: Vec<Entry>,
        home: Home,
        out: &mut Out,
    ) {
        let f = self.farms.get_mut(&farm).expect("checked by the caller");
        if home > f.home {
            // Taken over: every holder hears of the new home with the next progress.
            f.home = home;
            f.counts_sent = None;
            f.finished_sent = false;
        }
        self.merge(now, from, farm, entries, out);
    }

    /// A farm new here, offered by `from`: coordinated from what it knows.
    /// True when this node must keep a copy too, once it has the farm's
    /// inputs.
    #[allow(clippy::too_many_arguments)]
    pub(in super::super) fn take_farm(
        &mut self,
        now: Millis,
        from: NodeId,
        farm: Arc<FarmSpec>,
        entries: Vec<Entry>,
        home: Home,
        writer: Option<Writer>,
        cx: &Node,
    ) -> bool {
        let me = cx.id;
        // The coordinator that wrote this copy, out of this node's sight,
        // may still be handing out the farm's tasks from its end of the
        // order, on the far side of a partition: this one starts from the
        // other end, so the two run a task twice only once they have done
        // all between them. One that hands its farm over (it offers it
        // itself), or that this node sees (it will hear of this one and
        // hand over), has stopped: going on the same way keeps this one
        // next to its work and away from that of any side it never saw,
        // which took the farm over from the other end.
        let order = match writer {
            None => Vec::new(),
            Some(w) if w.node == from || cx.live(w.node) => w.order,
            Some(w) => (0..farm.def.stages.len())
                .map(|s| {
                    let o = w.order.get(s).cloned().unwrap_or_default();
                    let fronts = o.fronts().iter().map(|&f| Front {
                        way: match f.way {
                            Way::Up => Way::Down,
                            Way::Down => Way::Up,
                        },
                        ..f
                    });
                    Order {
                        fronts: fronts.collect(),
                    }
                })
                .collect(),
        };
        let records = entries
            .iter()
            .map(|e| (e.task(), entry_record(e)))
            .collect();
        let (origin, id) = (farm.origin, farm.id);
        let f = self.add_farm(now, farm, records, entries, order);
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
        self.adopt_early(now, id);
        here
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
            self.merge(now, from, farm, entries, out);
        }
    }

    /// Folds a holder's entries into a farm the coordinator has (what it
    /// did not know is recorded and streamed to the others) and answers it.
    fn merge(
        &mut self,
        now: Millis,
        from: NodeId,
        farm: FarmId,
        entries: Vec<Entry>,
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
            if f.log.add(e.clone()) {
                match &e {
                    Entry::Done { .. } => {
                        self.engine.mark_done(now, f.slot, e.task());
                    }
                    Entry::Redo { .. } => {
                        self.engine.redo(f.slot, e.task());
                    }
                    Entry::Failed { .. } => {}
                }
                new.push(e);
            }
        }
        // A holder offers a farm the coordinator has when it (re)started
        // or lost track: it gets the whole log again, and the progress.
        f.holders.retain(|h| h.node != from);
        f.holders.push(Holder::new(from, true));
        f.counts_sent = None;
        f.finished_sent = false;
        let (accepted, tasks) = (f.accepted, f.spec.def.task_count());
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
            if !f.log.add(e.clone()) {
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
        out.persist_entries(farm, redone, true);
        self.drain(out);
    }

    /// `node` keeps the farm's definition and inputs durably.
    pub(in super::super) fn has_copy(&mut self, farm: FarmId, node: NodeId) {
        if let Some(f) = self.farms.get_mut(&farm) {
            if let Some(h) = f.holders.iter_mut().find(|h| h.node == node) {
                h.has_spec = true;
            }
        }
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
        for fid in ready {
            let f = self.farms.get_mut(&fid).expect("listed above");
            f.accepted = true;
            let tasks = f.spec.def.task_count();
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
        let upto: Vec<(FarmId, u64)> = self
            .slots
            .iter()
            .map(|fid| (*fid, Coord::replicated(&self.farms[fid], cx)))
            .collect();
        for (fid, upto) in upto {
            let f = self.farms.get_mut(&fid).expect("slots and farms agree");
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
        if progress {
            self.next_progress = now + cx.cfg.progress_ms;
        }
        let mut syncs = Vec::new();
        for fid in &self.slots {
            let f = self.farms.get_mut(fid).expect("slots and farms agree");
            let counts = self.engine.progress(f.slot);
            let finished = counts.finished();
            let news = (progress || finished) && f.counts_sent.as_ref() != Some(&counts);
            if news {
                f.counts_sent = Some(counts.clone());
                f.finished_sent = finished;
            }
            let mut head = None;
            for h in &mut f.holders {
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
                        counts: counts.clone(),
                        stages: self.engine.stage_progress(f.slot),
                        order: f.order.clone(),
                    }
                });
                // Entries go out with the progress round, or at once when a
                // batch is full or the farm is over: one sync per round
                // rather than one per completion (each costs a message and
                // an answer; only the workers' acknowledgements wait for it).
                let due = progress || finished || f.log.len() - h.sent >= SYNC_BATCH as u64;
                let mut sent_any = false;
                while due && h.sent < f.log.len() && h.sent - h.acked.min(h.sent) < SYNC_WINDOW {
                    let entries = f.log.slice(h.sent, SYNC_BATCH).to_vec();
                    let from = h.sent;
                    h.sent += entries.len() as u64;
                    h.at = now;
                    sent_any = true;
                    syncs.push((h.node, head.msg(from, entries)));
                }
                if news && !sent_any {
                    syncs.push((h.node, head.msg(h.sent, Vec::new())));
                }
            }
        }
        for (to, mut m) in syncs {
            m.term = cx.term();
            self.sync_seq += 1;
            m.seq = self.sync_seq;
            out.send(to, Msg::Sync(Box::new(m)));
        }
    }

    /// A holder has every entry before `next` durably.
    pub(in super::super) fn on_synced(
        &mut self,
        from: NodeId,
        farm: FarmId,
        next: u64,
        over: bool,
        cx: &Node,
        out: &mut Out,
    ) {
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
