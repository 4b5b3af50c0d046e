//! What the engine knows of each farm and stage: one status byte per task with its counters kept in step, the fronts a stage's order walks, and who waits on whom.
//!
//! The engine's steps read and change this state; the questions asked of
//! it task by task (is it ready, can it ever run, which places of a grown
//! stage hold no task) are answered here, from the state alone.

use std::cmp::Reverse;
use std::collections::{BTreeSet, VecDeque};
use std::sync::Arc;

use super::{fails, Counts, Order, Stop};
use crate::farm::graph::DepOn;
use crate::farm::{FarmDef, StageDef, TaskRef};

// Task status codes, one byte per task so a million-task farm costs ~3 MB.
pub(super) const PENDING: u8 = 0;
pub(super) const RUNNING: u8 = 1;
pub(super) const DONE: u8 = 2;
pub(super) const FAILED: u8 = 3;
pub(super) const SKIPPED: u8 = 4;
pub(super) const CANCELLED: u8 = 5;
/// Held by a stage that stopped (`max_fails`); pending again on resume.
pub(super) const HELD: u8 = 6;
/// A place of a grown stage that its source task's file left empty: no
/// task, counted nowhere (the stage's total drops by one).
pub(super) const VOID: u8 = 7;

/// One stage of a farm, task by task.
pub(super) struct StageState {
    pub(super) status: Vec<u8>,
    /// Attempts started so far (saturating at 255 in memory; the record has the full count).
    pub(super) attempts: Vec<u32>,
    pub(super) failures: Vec<u8>,
    pub(super) crashes: Vec<u8>,
    /// Stages with no element-wise dependencies hand out indices along
    /// the fronts of this order once open (see `Engine::reorder`).
    pub(super) order: Order,
    /// Per front: how many positions of it were passed, and how many
    /// tasks it handed out.
    pub(super) walked: Vec<(u32, u64)>,
    /// Indices ready to run out of cursor order: retries and element-wise readiness.
    pub(super) ready: VecDeque<u32>,
    /// Whole-stage dependencies not yet complete.
    pub(super) waiting_on: u32,
    /// Per task, the tasks it waits for by a keyed or listed dependency
    /// that are not done (empty for a stage with none).
    pub(super) waiting: Vec<u32>,
    /// Whole-stage dependencies all complete (and none failed).
    pub(super) open: bool,
    /// Every task was done once: the stages waiting on it were told (a
    /// task redone later does not tell them twice).
    pub(super) complete: bool,
    pub(super) unplaceable: bool,
    pub(super) counts: Counts,
    /// Its ended attempts so far, as `max_fails` judges them.
    pub(super) streak: fails::Streak,
    /// Why it stopped, while it is stopped.
    pub(super) stopped: Option<Stop>,
    /// Found settled and passed over (see [`FarmState::live`]): no task of
    /// it changes before the farm takes it back ([`FarmState::touch`]).
    pub(super) passed: bool,
}

impl StageState {
    /// A stage's state before any record is restored: every task pending.
    pub(super) fn new(s: &StageDef) -> StageState {
        let len = s.len() as usize;
        StageState {
            status: vec![PENDING; len],
            attempts: vec![0; len],
            failures: vec![0; len],
            crashes: vec![0; len],
            order: Order::default(),
            walked: vec![(0, 0)],
            ready: VecDeque::new(),
            waiting_on: s.after.len() as u32,
            waiting: Vec::new(),
            open: false,
            complete: false,
            unplaceable: false,
            counts: Counts {
                total: len as u64,
                ..Counts::default()
            },
            streak: fails::Streak::default(),
            stopped: None,
            passed: false,
        }
    }
    /// The stage's order, its fronts from their starts again (what they
    /// passed may be pending again).
    pub(super) fn set_order(&mut self, order: Order) {
        self.walked = vec![(0, 0); order.fronts().len()];
        self.order = order;
    }

    pub(super) fn rewind(&mut self) {
        for w in &mut self.walked {
            w.0 = 0;
        }
    }

    /// The next pending task of the front whose turn it is (the one that
    /// handed out fewest for its weight), passing those that are not:
    /// `take` false only looks. None once every front has gone round.
    pub(super) fn next_by_fronts(&mut self, take: bool) -> Option<u32> {
        let len = self.status.len() as u32;
        let fronts = self.order.fronts();
        loop {
            let mut turn: Option<usize> = None;
            for (n, &(pos, handed)) in self.walked.iter().enumerate() {
                if pos >= len {
                    continue;
                }
                let weight = |n: usize| u128::from(fronts[n].weight.max(1));
                let fewer = |t: usize| {
                    u128::from(handed) * weight(t) < u128::from(self.walked[t].1) * weight(n)
                };
                if turn.is_none_or(fewer) {
                    turn = Some(n);
                }
            }
            let n = turn?;
            let (front, w) = (fronts[n], &mut self.walked[n]);
            while w.0 < len {
                let i = front.at(w.0, len);
                if self.status[i as usize] == PENDING {
                    if take {
                        w.0 += 1;
                        w.1 += 1;
                    }
                    return Some(i);
                }
                w.0 += 1;
            }
        }
    }

    /// Moves task `i` to `to`. Every status change goes through here, so the
    /// counters agree with the statuses by construction: checking that
    /// after every step would cost a scan of every task.
    pub(super) fn set(&mut self, i: usize, to: u8) {
        debug_assert!(
            !self.passed,
            "a task of a stage passed over as settled changes: touch the stage first"
        );
        let from = std::mem::replace(&mut self.status[i], to);
        if let Some(c) = self.counter(from) {
            *c -= 1;
        }
        if let Some(c) = self.counter(to) {
            *c += 1;
        }
    }

    /// Place `i`, still waiting, holds no task after all (see [`VOID`]).
    pub(super) fn void(&mut self, i: usize) -> bool {
        if self.status.get(i) != Some(&PENDING) {
            return false;
        }
        self.status[i] = VOID;
        self.counts.total -= 1;
        true
    }

    /// Every task has ended for good (done, failed, skipped or cancelled):
    /// its counts stay as they are until one is made to run again.
    pub(super) fn settled(&self) -> bool {
        let c = &self.counts;
        c.done + c.failed + c.skipped + c.cancelled == c.total
    }

    /// Its tasks that could be handed out now. Of a stage readied task by
    /// task, only those its ready list holds (at most): the others wait
    /// for their dependencies, and counting them kept a coordinator from
    /// ever finding its backlog empty while any later task of a workflow
    /// waited, so idle nodes were never told of newly ready work, nor
    /// stole queued work.
    pub(super) fn ready_count(&self, def: &StageDef) -> u64 {
        let queued = self.counts.queued();
        if per_task(def) {
            queued.min(self.ready.len() as u64)
        } else {
            queued
        }
    }

    pub(super) fn counter(&mut self, status: u8) -> Option<&mut u64> {
        let c = &mut self.counts;
        match status {
            RUNNING => Some(&mut c.running),
            DONE => Some(&mut c.done),
            FAILED => Some(&mut c.failed),
            SKIPPED => Some(&mut c.skipped),
            CANCELLED => Some(&mut c.cancelled),
            HELD => Some(&mut c.stopped),
            _ => None,
        }
    }
}

/// One farm: its stages' state, and who waits on each stage.
pub(super) struct FarmState {
    pub(super) def: Arc<FarmDef>,
    pub(super) run: u32,
    pub(super) stages: Vec<StageState>,
    /// Each stage's deepest chain of stages it waits for (see `extend_depths`).
    depth: Vec<u32>,
    /// For each stage, the stages that wait on it as a whole / element-wise.
    pub(super) dependents: Vec<Vec<u32>>,
    pub(super) dependents_each: Vec<Vec<u32>>,
    /// For each stage, the (stage, edge) pairs that wait on some of its
    /// tasks by a keyed or listed dependency.
    pub(super) dependents_by: Vec<Vec<(u32, usize)>>,
    pub(super) cancelled: bool,
    /// The stages that may not be settled (see [`StageState::settled`]):
    /// every stage is, from when it is added until a pass finds it settled,
    /// and again when a task of it is made to run again. A pass over the
    /// farm's counts, or over its ready work, goes over these only: an
    /// open farm grown by thousands of batches has as many stages, nearly
    /// all settled, and such passes ran at every step.
    pub(super) live: BTreeSet<u32>,
    /// The stages of `live` in the order they are offered slots: deepest
    /// chain first (see `extend_depths`), so results flow, ties by index.
    /// A settled stage has no task to offer: leaving it out changes no
    /// hand-out, and a hand-out costs the stages still running, not the
    /// farm's.
    pub(super) ranked: BTreeSet<(Reverse<u32>, u32)>,
    /// How many of its stages are stopped (see `Engine::stop_stage`).
    pub(super) stops: u32,
    pub(super) finished_emitted: bool,
    /// More stages may come (see `Engine::extend_farm`): not finished
    /// while its tasks are, until closed.
    pub(super) open: bool,
}

impl FarmState {
    /// A farm's state before any record is restored: every task pending,
    /// and who depends on each stage, by kind.
    pub(super) fn new(def: Arc<FarmDef>, run: u32) -> FarmState {
        let mut f = FarmState {
            def: def.clone(),
            run,
            stages: def.stages.iter().map(|s| StageState::new(s)).collect(),
            depth: Vec::new(),
            dependents: Vec::new(),
            dependents_each: Vec::new(),
            dependents_by: Vec::new(),
            cancelled: false,
            live: BTreeSet::new(),
            ranked: BTreeSet::new(),
            stops: 0,
            finished_emitted: false,
            open: false,
        };
        f.link(def);
        f
    }

    /// A task of stage `s` is about to change: the passes over the farm's
    /// counts and ready work look at the stage again (a settled stage
    /// passed over may run again: redone, revived after a failure lost to
    /// a done, or placeable again).
    pub(super) fn touch(&mut self, s: u32) {
        self.stages[s as usize].passed = false;
        if self.live.insert(s) {
            self.ranked.insert((Reverse(self.depth[s as usize]), s));
        }
    }

    /// Stage `s` is settled: passed over until [`FarmState::touch`]ed.
    pub(super) fn pass_over(&mut self, s: u32) {
        self.stages[s as usize].passed = true;
        if self.live.remove(&s) {
            self.ranked.remove(&(Reverse(self.depth[s as usize]), s));
        }
    }

    /// No stage will be added: closed, or cancelled (what an open farm
    /// takes after that is cancelled too).
    pub(super) fn takes_no_more(&self) -> bool {
        !self.open || self.cancelled
    }

    /// Takes `def` as the farm's definition (the one it has, or one that
    /// grew from it): who depends on each stage, by kind, and the order
    /// the stages are offered slots in, worked out for the stages it adds
    /// (a stage there already waits on none of them, so what was worked
    /// out for it stands: a growth costs what it adds, not the farm).
    pub(super) fn link(&mut self, def: Arc<FarmDef>) {
        let (old, n) = (self.dependents.len(), def.stages.len());
        debug_assert!(old <= n);
        self.dependents.resize(n, Vec::new());
        self.dependents_each.resize(n, Vec::new());
        self.dependents_by.resize(n, Vec::new());
        for (i, s) in crate::farm::from_on(&def.stages, old) {
            for &d in &s.after {
                self.dependents[d as usize].push(i as u32);
            }
            for &d in &s.after_each {
                self.dependents_each[d as usize].push(i as u32);
            }
            for (e, dep) in s.deps.iter().enumerate() {
                self.dependents_by[dep.stage as usize].push((i as u32, e));
            }
        }
        extend_depths(&def, &mut self.depth);
        for s in old as u32..n as u32 {
            self.live.insert(s);
            self.ranked.insert((Reverse(self.depth[s as usize]), s));
        }
        self.def = def;
    }
}

/// Of `indices` of stage `s`, those pending whose element-wise
/// dependencies are all done: ready once the stage is open.
/// In the stage's order (see `Engine::reorder`), given `indices` ascending.
pub(super) fn ready_each(
    f: &FarmState,
    s: usize,
    indices: impl Iterator<Item = usize>,
) -> Vec<u32> {
    let mut ready: Vec<u32> = indices
        .filter(|&i| f.stages[s].status[i] == PENDING && each_done(f, s, i))
        .map(|i| i as u32)
        .collect();
    let (order, len) = (&f.stages[s].order, f.stages[s].status.len() as u32);
    if !order.fronts.is_empty() {
        ready.sort_unstable_by_key(|&i| order.rank(i, len));
    }
    ready
}

/// Whether a stage's tasks become ready one by one (element-wise, keyed or
/// listed dependencies), rather than all at once when the stage opens.
pub(super) fn per_task(def: &StageDef) -> bool {
    !def.after_each.is_empty() || !def.deps.is_empty()
}

/// Whether what task `i` of stage `s` waits for task by task is done: its
/// element-wise pairs, and its keyed and listed dependencies.
pub(super) fn each_done(f: &FarmState, s: usize, i: usize) -> bool {
    f.def.stages[s]
        .after_each
        .iter()
        .all(|&e| f.stages[e as usize].status[i] == DONE)
        && f.stages[s].waiting.get(i).is_none_or(|&w| w == 0)
}

/// Task `i` of stage `s` can never run: a stage it waits on whole has a
/// task that failed, was skipped, cancelled or held by a stop, or the
/// task it waits on element-wise did.
pub(super) fn doomed(f: &FarmState, s: usize, i: usize) -> bool {
    let def = &f.def.stages[s];
    let lost = |c: &Counts| c.failed + c.skipped + c.cancelled + c.stopped > 0;
    def.after
        .iter()
        .any(|&e| lost(&f.stages[e as usize].counts))
        || def.after_each.iter().any(|&e| {
            matches!(
                f.stages[e as usize].status[i],
                FAILED | SKIPPED | CANCELLED | HELD
            )
        })
        || (!def.deps.is_empty()
            && f.def.graph().stages[s].iter().any(|e| {
                e.ups.get(i).iter().any(|&j| {
                    matches!(
                        f.stages[e.up_stage as usize].status[j as usize],
                        FAILED | SKIPPED | CANCELLED | HELD
                    )
                })
            }))
}

/// The places of each stage grown from task `t` past the `lines` lines its
/// file has hold no task (see [`VOID`]); the stages where any did.
pub(super) fn void_places(f: &mut FarmState, t: TaskRef, lines: u32) -> Vec<u32> {
    let mut changed = Vec::new();
    for &(d, e) in &f.dependents_by[t.stage as usize] {
        let DepOn::Grown { per } = f.def.stages[d as usize].deps[e].on else {
            continue;
        };
        let first = u64::from(t.index) * u64::from(per);
        let st = &mut f.stages[d as usize];
        let mut any = false;
        for i in first + u64::from(lines.min(per))..first + u64::from(per) {
            any |= st.void(i as usize);
        }
        if any {
            changed.push(d);
        }
    }
    changed
}

/// Skips the pending tasks of a stage (one index, or all). True when any changed.
pub(super) fn skip_pending(st: &mut StageState, index: Option<u32>) -> bool {
    let mut changed = false;
    let range = match index {
        Some(i) => i as usize..i as usize + 1,
        None => 0..st.status.len(),
    };
    for i in range {
        if st.status.get(i) == Some(&PENDING) {
            st.set(i, SKIPPED);
            changed = true;
        }
    }
    changed
}

/// Extends `depth`, each stage's deepest chain of stages it waits for,
/// known for the stages before, to every stage of `def`. The stages added
/// wait for any before them and for each other in any file order: Kahn's
/// order over those, linear in what was added (relaxing n times over every
/// stage cost the square of an open farm's stages at each of its growths).
fn extend_depths(def: &FarmDef, depth: &mut Vec<u32>) {
    let (old, n) = (depth.len(), def.stages.len());
    depth.resize(n, 0);
    let mut waits = vec![0u32; n - old];
    let mut downstream = vec![Vec::new(); n - old];
    for (i, s) in crate::farm::from_on(&def.stages, old) {
        for d in s.upstream() {
            let d = d as usize;
            if d < old {
                depth[i] = depth[i].max(depth[d] + 1);
            } else {
                waits[i - old] += 1;
                downstream[d - old].push(i);
            }
        }
    }
    let mut ready: Vec<usize> = (old..n).filter(|&i| waits[i - old] == 0).collect();
    while let Some(u) = ready.pop() {
        for &i in &downstream[u - old] {
            depth[i] = depth[i].max(depth[u] + 1);
            waits[i - old] -= 1;
            if waits[i - old] == 0 {
                ready.push(i);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::FarmState;
    use crate::engine::tests::farm;
    use crate::farm::{CommandTemplate, StageDef, Sweep, Template};
    use proptest::prelude::*;

    /// Each stage's deepest chain of stages it waits for, the long way.
    fn depths(ups: &[Vec<u32>]) -> Vec<usize> {
        let mut depth = vec![0usize; ups.len()];
        for _ in 0..ups.len() {
            for (i, us) in ups.iter().enumerate() {
                for &u in us {
                    depth[i] = depth[i].max(depth[u as usize] + 1);
                }
            }
        }
        depth
    }

    proptest! {
        /// Stages in any file order, each waiting for any earlier-ranked
        /// ones: deepest first, ties by index, as the chains say; and the
        /// same when the farm grew to them in pieces (cut before each
        /// stage in `cuts`, a stage waiting on none that came after it).
        #[test]
        fn stages_go_deepest_chain_first_grown_or_whole(
            (rank, edges, cuts) in (1usize..40).prop_flat_map(|n| (
                Just((0..n).collect::<Vec<usize>>()).prop_shuffle(),
                prop::collection::vec((0..n, 0..n), 0..120),
                prop::collection::btree_set(1..n.max(2), 0..5),
            )),
        ) {
            // A random rank per stage makes the graph acyclic whatever the
            // file order: an edge goes from lower rank to higher.
            let n = rank.len();
            let cuts: Vec<usize> = cuts.into_iter().filter(|&c| c < n).collect();
            let piece = |i: usize| cuts.iter().filter(|&&c| c <= i).count();
            let mut ups = vec![Vec::new(); n];
            for (a, b) in edges {
                if rank[a] < rank[b] && piece(a) <= piece(b) {
                    ups[b].push(a as u32);
                }
            }
            let stages: Vec<StageDef> = ups
                .iter()
                .enumerate()
                .map(|(i, us)| StageDef {
                    after: us.clone(),
                    ..StageDef::new(
                        &format!("s{i}"),
                        CommandTemplate::Argv(vec![Template::literal("true")]),
                        Sweep::range("i", 1),
                    )
                })
                .collect();
            let depth = depths(&ups);
            let mut want: Vec<u32> = (0..n as u32).collect();
            want.sort_by_key(|&i| (std::cmp::Reverse(depth[i as usize]), i));
            let ranked = |f: &FarmState| f.ranked.iter().map(|&(_, s)| s).collect::<Vec<u32>>();
            let def = |end: usize| farm(stages[..end].to_vec());
            prop_assert_eq!(&ranked(&FarmState::new(def(n), 0)), &want);
            let mut grown = FarmState::new(def(cuts.first().copied().unwrap_or(n)), 0);
            for end in cuts.iter().copied().skip(1).chain([n]) {
                grown.link(def(end));
            }
            prop_assert_eq!(ranked(&grown), want);
        }
    }
}
