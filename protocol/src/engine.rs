//! The scheduling engine: a sans-IO state machine deciding which task runs when.
//!
//! # Driving it
//!
//! Inputs: [`Engine::add_farm`], [`Engine::task_finished`],
//! [`Engine::handle_timeout`], [`Engine::cancel`], [`Engine::interrupt`].
//! Every input takes `now` (milliseconds on the driver's monotonic clock).
//!
//! Outputs: after any input, drain [`Engine::poll_action`] until it returns
//! `None`, then sleep until [`Engine::poll_timeout`] (or the next input).
//! Actions come in the order they must take effect. **Persist before act:**
//! the driver makes every `Persist` durable before it carries out any later
//! `Start`, `Kill` or `Emit`; a driver that drains all actions, writes and
//! flushes the persists as one group, then performs the rest in order keeps
//! this (and gets group commit for free).
//!
//! The engine never touches the store, the clock or processes: that is what
//! lets the simulator run the same code on a virtual clock.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::sync::Arc;

use crate::farm::graph::Graph;
use crate::farm::{FarmDef, StageDef, TaskRef};
pub use crate::pool::Grant;
use crate::pool::Pool;
use crate::resources::Resources;
use crate::tally::Tally;

mod checks;
mod fails;
mod grow;
mod hand_out;
mod order;
mod placeable;
mod state;
mod vocab;
pub use order::{Front, Order, Way};
use state::{
    doomed, each_done, per_task, ready_each, skip_pending, void_places, FarmState, StageState,
    CANCELLED, DONE, FAILED, HELD, PENDING, RUNNING, SKIPPED, VOID,
};
pub use vocab::{
    first_line, Action, AddOptions, Counts, Event, FarmSlot, KillReason, Outcome, Persist,
    RecordState, Stop, TaskEnd, TaskRecord, TaskResult, Usage, Verdict, CRASHES_MAX,
    STDERR_LINE_MAX,
};

/// Milliseconds on the driver's clock.
pub type Millis = u64;

/// How many of a stage's ready tasks are looked at for one whose inputs
/// are where it would go: a bounded cost per task handed out.
const NEAR_LOOK: usize = 32;

/// What a remote engine reports as its own resources.
static EMPTY: Resources = Resources::EMPTY;

struct Running {
    attempt: u32,
    grant: Grant,
    killed: Option<KillReason>,
}

/// Where the engine's tasks run.
/// Asked whether a ready task of (farm, stage) is handed out now: it may
/// reserve what it accepts (see `Engine::hand_out`).
type Take<'a> = dyn FnMut(&Placement, (FarmSlot, u32), &StageDef) -> bool + 'a;

enum Placement {
    /// On this machine: the engine grants resources from its pool and starts tasks.
    Local(Pool),
    /// On the nodes of a mesh: the coordinator hands tasks out with [`Engine::claim`];
    /// a stage is placeable when it fits one of these machines.
    Remote(Machines),
}

/// The machines of a mesh, and how many tasks of each request they run at once.
struct Machines {
    list: Vec<Resources>,
    /// Slot counts by request, computed when first asked for: cleared
    /// whenever the machines change.
    slots: Vec<(Resources, u64)>,
}

impl Machines {
    fn slots(&mut self, req: &Resources) -> u64 {
        if let Some((_, n)) = self.slots.iter().find(|(r, _)| r == req) {
            return *n;
        }
        let n = self.list.iter().map(|m| copies(m, req)).sum();
        self.slots.push((req.clone(), n));
        n
    }
}

/// The open, placeable stages of farms not cancelled that have tasks
/// ready and unclaimed, with how many: a free function so that a caller
/// may hold the engine's placement at the same time.
fn waiting_stages(farms: &[FarmState]) -> impl Iterator<Item = (&StageDef, u64)> {
    farms
        .iter()
        .filter(|f| !f.cancelled)
        .flat_map(live_stages)
        .filter_map(|(st, def)| {
            let q = st.ready_count(def);
            (st.open && !st.unplaceable && q > 0).then_some((def, q))
        })
}

/// The stages of `f` that may not be settled, with their definitions:
/// the others have nothing to hand out.
fn live_stages(f: &FarmState) -> impl Iterator<Item = (&StageState, &StageDef)> {
    f.live
        .iter()
        .map(move |&s| (&f.stages[s as usize], &*f.def.stages[s as usize]))
}

/// How many tasks asking for `req` a machine of `total` runs at once; a
/// request for nothing counts as one slot, so it never looks scarce.
pub fn copies(total: &Resources, req: &Resources) -> u64 {
    req.iter()
        .filter(|(_, v)| !v.is_zero())
        .map(|(k, v)| total.get(k).0 / v.0)
        .min()
        .unwrap_or(1)
}

/// The scheduling state machine of one node, or of a mesh's coordinator.
pub struct Engine {
    placement: Placement,
    farms: Vec<FarmState>,
    /// Hashed with Fx: looked up at every start and end, keyed by small
    /// integers. Counted per stage, for the incremental checks.
    running: Tally<(FarmSlot, TaskRef), Running, (FarmSlot, u32)>,
    timers: BinaryHeap<Reverse<(Millis, FarmSlot, TaskRef, u32)>>,
    actions: VecDeque<Action>,
    interrupted: bool,
}

impl Engine {
    /// An engine for a node with these resources; `gpu = n` declares devices `0..n`.
    pub fn new(total: Resources) -> Engine {
        Engine::with_placement(Placement::Local(Pool::new(total)))
    }

    /// An engine that only decides what is ready: tasks leave it through
    /// [`Engine::claim`] to run elsewhere. `machines` are the resource totals
    /// a stage must fit one of (see [`Engine::set_machines`]).
    pub fn remote(machines: Vec<Resources>) -> Engine {
        Engine::with_placement(Placement::Remote(Machines {
            list: machines,
            slots: Vec::new(),
        }))
    }

    fn with_placement(placement: Placement) -> Engine {
        Engine {
            placement,
            farms: Vec::new(),
            running: Tally::new(|(f, t), _| (*f, t.stage)),
            timers: BinaryHeap::new(),
            actions: VecDeque::new(),
            interrupted: false,
        }
    }

    /// A farm's stages hand out their tasks in `orders` (one a stage,
    /// those missing from the first index up), and tasks that become
    /// ready together in the same order, rather than from the first index
    /// up. Coordinators on the sides of a partition that each hold the
    /// farm then work apart (see [`Order::apart`]), and meet (run a task
    /// twice) only once they have done about all of it between them.
    /// Retries and re-queued tasks still go first (those waiting now are
    /// put in the new order too).
    pub fn reorder(&mut self, farm: FarmSlot, orders: &[Order]) {
        let f = &mut self.farms[farm.0 as usize];
        for (s, st) in f.stages.iter_mut().enumerate() {
            st.set_order(orders.get(s).cloned().unwrap_or_default());
            let len = st.status.len() as u32;
            let order = &st.order;
            st.ready
                .make_contiguous()
                .sort_by_key(|&i| order.rank(i, len));
        }
    }

    /// The machines a remote engine's stages must fit, as the membership now has them.
    pub fn set_machines(&mut self, machines: Vec<Resources>) {
        if let Placement::Remote(m) = &mut self.placement {
            m.list = machines;
            m.slots.clear();
        }
        self.recheck_unplaceable();
    }

    /// Tasks skipped because `stage` (task `index`, or all of it) would not
    /// finish wait again, wherever nothing else they need failed: a done
    /// that won over a failure (the other side of a partition finished
    /// it), or a stage that fits a machine again.
    fn revive_dependents(&mut self, farm: FarmSlot, stage: u32, index: Option<u32>) {
        let f = &mut self.farms[farm.0 as usize];
        if f.cancelled {
            return;
        }
        let mut work = vec![(stage, index)];
        while let Some((s, idx)) = work.pop() {
            let whole = f.dependents[s as usize].iter().map(|&d| (d, None));
            let each = f.dependents_each[s as usize].iter().map(|&d| (d, idx));
            let mut deps: Vec<(u32, Option<u32>)> = whole.chain(each).collect();
            if !f.dependents_by[s as usize].is_empty() {
                let g = f.def.graph().clone();
                for &(d, e) in &f.dependents_by[s as usize] {
                    match idx {
                        Some(j) => deps.extend(
                            g.stages[d as usize][e]
                                .downs
                                .get(j as usize)
                                .iter()
                                .map(|&k| (d, Some(k))),
                        ),
                        None => deps.push((d, None)),
                    }
                }
            }
            for (d, at) in deps {
                let ds = d as usize;
                let range = match at {
                    Some(i) => i as usize..i as usize + 1,
                    None => 0..f.stages[ds].status.len(),
                };
                let back: Vec<usize> = range
                    .filter(|&i| f.stages[ds].status[i] == SKIPPED && !doomed(f, ds, i))
                    .collect();
                if back.is_empty() {
                    continue;
                }
                f.touch(d);
                for &i in &back {
                    f.stages[ds].set(i, PENDING);
                }
                if f.stages[ds].open {
                    if !per_task(&f.def.stages[ds]) {
                        f.stages[ds].rewind();
                    } else {
                        let ready = ready_each(f, ds, back.into_iter());
                        f.stages[ds].ready.extend(ready);
                    }
                }
                work.push((d, at));
            }
        }
    }

    /// This machine's resources (empty for a remote engine, which owns none).
    pub fn total(&self) -> &Resources {
        match &self.placement {
            Placement::Local(pool) => pool.total(),
            Placement::Remote(_) => &EMPTY,
        }
    }

    /// Resources not held by running tasks (empty for a remote engine).
    pub fn free(&self) -> &Resources {
        match &self.placement {
            Placement::Local(pool) => pool.free(),
            Placement::Remote(_) => &EMPTY,
        }
    }

    /// Resources held by running tasks (empty for a remote engine).
    pub fn used(&self) -> Resources {
        match &self.placement {
            Placement::Local(pool) => pool.used(),
            Placement::Remote(_) => Resources::new(),
        }
    }

    /// The number of farms added so far.
    pub fn farm_count(&self) -> usize {
        self.farms.len()
    }

    /// The definition of the farm in `slot`.
    pub fn farm(&self, slot: FarmSlot) -> &Arc<FarmDef> {
        &self.farms[slot.0 as usize].def
    }

    /// Adds a farm, restoring what its durable records say. Returns its slot.
    pub fn add_farm(
        &mut self,
        now: Millis,
        def: Arc<FarmDef>,
        restored: impl IntoIterator<Item = (TaskRef, TaskRecord)>,
        opts: &AddOptions,
    ) -> FarmSlot {
        let slot = FarmSlot(self.farms.len() as u32);
        let graph = if def.stages.iter().any(|s| !s.deps.is_empty()) {
            Some(def.graph().clone())
        } else {
            None
        };
        let mut state = FarmState::new(def, opts.run);
        state.open = opts.open;
        self.farms.push(state);
        // Restore records first, then derive readiness from the whole picture.
        let (failed, grew) = self.restore_records(slot, restored, opts);
        self.ready_farm(now, slot, graph.as_deref(), grew, failed);
        slot
    }

    /// Its tasks' records as the store kept them (of this run only): done
    /// and failed ones as they were, and one that was running when the
    /// node stopped counted as a crash, failing at `CRASHES_MAX`. Returns
    /// the tasks failed, and the done ones that grew stages (with their lines).
    fn restore_records(
        &mut self,
        slot: FarmSlot,
        restored: impl IntoIterator<Item = (TaskRef, TaskRecord)>,
        opts: &AddOptions,
    ) -> (Vec<TaskRef>, Vec<(TaskRef, u32)>) {
        let mut failed = Vec::new();
        let mut grew = Vec::new();
        for (t, rec) in restored {
            if rec.run != opts.run {
                continue;
            }
            let Some(st) = self.farms[slot.0 as usize].stages.get_mut(t.stage as usize) else {
                continue;
            };
            let i = t.index as usize;
            if i >= st.status.len() {
                continue;
            }
            st.attempts[i] = rec.attempt;
            st.failures[i] = rec.failures.min(255) as u8;
            st.crashes[i] = rec.crashes.min(255) as u8;
            match rec.state {
                RecordState::Done => {
                    st.set(i, DONE);
                    if rec.end == Some(TaskEnd::Cached) {
                        st.counts.cached += 1;
                    }
                    if let Some(lines) = rec.grew {
                        grew.push((t, lines));
                    }
                }
                RecordState::Failed
                    if !opts.retry_failed && !opts.retry_stages.contains(&t.stage) =>
                {
                    st.set(i, FAILED);
                    failed.push(t);
                }
                RecordState::Failed => st.failures[i] = 0,
                RecordState::Running => {
                    let crashes = rec.crashes + 1;
                    st.crashes[i] = crashes.min(255) as u8;
                    if crashes >= CRASHES_MAX {
                        st.set(i, FAILED);
                        failed.push(t);
                        let attempt = rec.attempt;
                        let record = TaskRecord {
                            state: RecordState::Failed,
                            crashes,
                            end: Some(TaskEnd::CrashLimit),
                            ..rec
                        };
                        self.actions.push_back(Action::Persist(Persist::Task {
                            farm: slot,
                            task: t,
                            record,
                        }));
                        // Said like any other failure, so whoever shows
                        // failures has its reason.
                        self.actions.push_back(Action::Emit(Event::TaskFinished {
                            farm: slot,
                            task: t,
                            attempt,
                            end: TaskEnd::CrashLimit,
                            stderr_line: None,
                            verdict: Verdict::Failed,
                        }));
                    } else {
                        // Record the crash now so that a second crash counts twice.
                        let record = TaskRecord {
                            state: RecordState::Interrupted,
                            crashes,
                            ..rec
                        };
                        self.actions.push_back(Action::Persist(Persist::Task {
                            farm: slot,
                            task: t,
                            record,
                        }));
                    }
                }
                RecordState::Interrupted | RecordState::Cancelled => {}
            }
        }
        (failed, grew)
    }

    /// What each task waits for and which stages are complete or open,
    /// from the records restored; then the failed tasks' dependents fail,
    /// and what is ready starts.
    fn ready_farm(
        &mut self,
        now: Millis,
        slot: FarmSlot,
        graph: Option<&Graph>,
        grew: Vec<(TaskRef, u32)>,
        failed: Vec<TaskRef>,
    ) {
        for (t, lines) in grew {
            // Which places of the stages grown from it hold tasks, before
            // anything is counted complete.
            void_places(&mut self.farms[slot.0 as usize], t, lines);
        }
        if let Some(g) = graph {
            grow::count_waiting(&mut self.farms[slot.0 as usize], g, 0);
        }
        self.check_placeable(slot, 0);
        let nstages = self.farms[slot.0 as usize].stages.len();
        for s in 0..nstages as u32 {
            let f = &mut self.farms[slot.0 as usize];
            let st = &mut f.stages[s as usize];
            let complete = st.counts.done == st.counts.total;
            st.complete = complete;
            if st.counts.done > 0 {
                // It succeeded before: its failures are its tasks' own.
                st.streak.break_off();
            }
            if complete {
                for d in f.dependents[s as usize].clone() {
                    f.stages[d as usize].waiting_on -= 1;
                }
            }
        }
        for s in 0..nstages as u32 {
            if self.farms[slot.0 as usize].stages[s as usize].waiting_on == 0 {
                self.open_stage(slot, s);
            }
        }
        for t in failed {
            self.fail_dependents(slot, t.stage, Some(t.index));
        }
        self.fill(now);
        self.check_finished(slot);
    }

    /// A stage whose whole-stage dependencies are complete starts handing out tasks.
    fn open_stage(&mut self, slot: FarmSlot, s: u32) {
        let f = &mut self.farms[slot.0 as usize];
        if f.stages[s as usize].open {
            return;
        }
        f.stages[s as usize].open = true;
        if !per_task(&f.def.stages[s as usize]) {
            return;
        }
        let ready = ready_each(f, s as usize, 0..f.stages[s as usize].status.len());
        f.stages[s as usize].ready.extend(ready);
    }

    /// Reports that an attempt is over (its process has exited, or it never started).
    pub fn task_finished(
        &mut self,
        now: Millis,
        farm: FarmSlot,
        task: TaskRef,
        attempt: u32,
        outcome: Outcome,
    ) {
        let Some(run) = self.running.remove(&(farm, task)) else {
            return;
        };
        if run.attempt != attempt {
            // An older attempt's report; the current one is still live.
            self.running.insert((farm, task), run);
            return;
        }
        if let Placement::Local(pool) = &mut self.placement {
            pool.release(&run.grant);
        }
        let f = &mut self.farms[farm.0 as usize];
        let stage_def = &f.def.stages[task.stage as usize];
        let retries = stage_def.retries;
        let timeout_ms = stage_def.timeout_ms.unwrap_or(0);
        let ok_codes = &stage_def.success_codes;
        let st = &mut f.stages[task.stage as usize];
        let i = task.index as usize;

        let end = match (&run.killed, &outcome.result) {
            (Some(KillReason::Timeout), _) => TaskEnd::TimedOut {
                after_ms: timeout_ms,
            },
            (Some(KillReason::Cancel), _) => TaskEnd::Cancelled,
            (_, TaskResult::Exited(c)) => TaskEnd::Exited(*c),
            (_, TaskResult::Signaled(s)) => TaskEnd::Signaled(*s),
            (_, TaskResult::Cached) => TaskEnd::Cached,
            (_, TaskResult::Error(e)) => TaskEnd::Error(e.clone()),
            (_, TaskResult::TimedOut) => TaskEnd::TimedOut {
                after_ms: timeout_ms,
            },
        };
        let success = match &end {
            TaskEnd::Exited(c) => ok_codes.contains(c),
            TaskEnd::Cached => true,
            _ => false,
        };
        let mut stop = None;
        let (state, verdict) = if success {
            (RecordState::Done, Verdict::Done)
        } else if run.killed == Some(KillReason::Interrupt) {
            (RecordState::Interrupted, Verdict::Interrupted)
        } else if run.killed == Some(KillReason::Cancel) || f.cancelled {
            (RecordState::Cancelled, Verdict::Cancelled)
        } else {
            let failures = st.failures[i] as u32 + 1;
            st.failures[i] = failures.min(255) as u8;
            let retry = failures <= retries && !self.interrupted;
            let line = outcome.stderr_line.as_deref();
            stop = fails::judge(st, stage_def, task, &end, line, retry);
            if retry && (stop.is_some() || st.stopped.is_some()) {
                // Its retry would fail as the others did: it waits with
                // the stage's tasks that did not start.
                (RecordState::Interrupted, Verdict::Stopped)
            } else if retry {
                (RecordState::Interrupted, Verdict::Retry)
            } else {
                (RecordState::Failed, Verdict::Failed)
            }
        };
        // A success's stderr says no cause: only a failure keeps its line.
        let stderr_line = if success {
            None
        } else {
            outcome.stderr_line.clone()
        };
        let record = TaskRecord {
            run: f.run,
            state,
            attempt,
            failures: st.failures[i] as u32,
            crashes: st.crashes[i] as u32,
            end: Some(end.clone()),
            key: outcome.key,
            duration_ms: outcome.duration_ms,
            logs: outcome.logs,
            grew: outcome.grew,
            stderr_line: stderr_line.clone().map(Box::new),
            usage: outcome.usage.map(Box::new),
        };
        self.actions
            .push_back(Action::Persist(Persist::Task { farm, task, record }));
        self.actions.push_back(Action::Emit(Event::TaskFinished {
            farm,
            task,
            attempt,
            end,
            stderr_line,
            verdict,
        }));
        match verdict {
            Verdict::Done => {
                st.set(i, DONE);
                if outcome.result == TaskResult::Cached {
                    st.counts.cached += 1;
                }
                self.void_grown(farm, task, outcome.grew);
                self.on_done(farm, task);
            }
            Verdict::Retry => {
                st.set(i, PENDING);
                st.ready.push_front(task.index);
            }
            Verdict::Interrupted => st.set(i, PENDING),
            Verdict::Stopped => st.set(i, HELD),
            Verdict::Failed => {
                st.set(i, FAILED);
                self.fail_dependents(farm, task.stage, Some(task.index));
            }
            Verdict::Cancelled => {
                st.set(i, CANCELLED);
                // One task cancelled, not its farm: what waits for it
                // would wait for ever.
                if !self.farms[farm.0 as usize].cancelled {
                    self.fail_dependents(farm, task.stage, Some(task.index));
                }
            }
        }
        if let Some(stop) = stop {
            self.stop_stage(farm, task.stage, stop);
        }
        self.fill(now);
        self.check_finished(farm);
    }

    fn on_done(&mut self, farm: FarmSlot, task: TaskRef) {
        let f = &mut self.farms[farm.0 as usize];
        let s = task.stage as usize;
        let i = task.index as usize;
        for d in f.dependents_each[s].clone() {
            let ds = d as usize;
            if f.stages[ds].open && f.stages[ds].status[i] == PENDING && each_done(f, ds, i) {
                f.stages[ds].ready.push_back(task.index);
            }
        }
        if !f.dependents_by[s].is_empty() {
            let g = f.def.graph().clone();
            for &(d, e) in &f.dependents_by[s] {
                let ds = d as usize;
                for &k in g.stages[ds][e].downs.get(i) {
                    let w = &mut f.stages[ds].waiting[k as usize];
                    *w = w.saturating_sub(1);
                    if *w == 0
                        && f.stages[ds].open
                        && f.stages[ds].status[k as usize] == PENDING
                        && each_done(f, ds, k as usize)
                    {
                        f.stages[ds].ready.push_back(k);
                    }
                }
            }
        }
        self.check_complete(farm, task.stage);
        self.succeeded(farm, task);
    }

    /// Stage `s` is complete once every task it has is done: the stages
    /// waiting for all of it open.
    fn check_complete(&mut self, farm: FarmSlot, s: u32) {
        let f = &mut self.farms[farm.0 as usize];
        let st = &mut f.stages[s as usize];
        let complete = st.counts.done == st.counts.total;
        if complete && !std::mem::replace(&mut st.complete, true) {
            for d in f.dependents[s as usize].clone() {
                let st = &mut self.farms[farm.0 as usize].stages[d as usize];
                st.waiting_on -= 1;
                if st.waiting_on == 0 {
                    self.open_stage(farm, d);
                }
            }
        }
    }

    /// `task` ended for good, and its file holds `lines` lines (none: not
    /// counted, or it failed): the places of each stage grown from it past
    /// its last line hold no task. Before its dependents are let go, so no
    /// such place is ever handed out.
    fn void_grown(&mut self, farm: FarmSlot, task: TaskRef, lines: Option<u32>) {
        // Not counted (a run that could not say): every place stays, and
        // one past the file's end fails saying so where it runs.
        let Some(lines) = lines else {
            return;
        };
        let changed = void_places(&mut self.farms[farm.0 as usize], task, lines);
        for d in &changed {
            self.check_complete(farm, *d);
        }
        if !changed.is_empty() {
            self.check_finished(farm);
        }
    }
    /// Marks what can no longer run because `stage` (task `index`, or all of it) failed.
    fn fail_dependents(&mut self, farm: FarmSlot, stage: u32, index: Option<u32>) {
        let mut work = vec![(stage, index)];
        while let Some((s, idx)) = work.pop() {
            let f = &mut self.farms[farm.0 as usize];
            for d in f.dependents[s as usize].clone() {
                if skip_pending(&mut f.stages[d as usize], None) {
                    work.push((d, None));
                }
            }
            for d in f.dependents_each[s as usize].clone() {
                if skip_pending(&mut f.stages[d as usize], idx) {
                    work.push((d, idx));
                }
            }
            if f.dependents_by[s as usize].is_empty() {
                continue;
            }
            let g = f.def.graph().clone();
            for (d, e) in f.dependents_by[s as usize].clone() {
                match idx {
                    Some(j) => {
                        for &k in g.stages[d as usize][e].downs.get(j as usize) {
                            if skip_pending(&mut f.stages[d as usize], Some(k)) {
                                work.push((d, Some(k)));
                            }
                        }
                    }
                    None => {
                        if skip_pending(&mut f.stages[d as usize], None) {
                            work.push((d, None));
                        }
                    }
                }
            }
        }
    }

    /// Every task of a farm that is done.
    pub fn done_tasks(&self, farm: FarmSlot) -> Vec<TaskRef> {
        let mut out = Vec::new();
        for (s, st) in self.farms[farm.0 as usize].stages.iter().enumerate() {
            for (i, &status) in st.status.iter().enumerate() {
                if status == DONE {
                    out.push(TaskRef::new(s as u32, i as u32));
                }
            }
        }
        out
    }

    /// A task that a holder of the farm knows is done (the coordinator that
    /// recorded it is gone): done here too, when it is waiting to run.
    /// False when it is claimed or has ended: then the claim's report, or
    /// what is recorded, stands.
    /// `grew`: what its run found for the stages grown from it (see
    /// [`Outcome::grew`]).
    pub fn mark_done(
        &mut self,
        now: Millis,
        farm: FarmSlot,
        task: TaskRef,
        grew: Option<u32>,
    ) -> bool {
        let f = &mut self.farms[farm.0 as usize];
        let Some(st) = f.stages.get(task.stage as usize) else {
            return false;
        };
        let i = task.index as usize;
        // Done wins over a failure recorded on the other side of a partition.
        let failed = match st.status.get(i) {
            Some(&PENDING | &HELD) => false,
            Some(&FAILED) => true,
            _ => return false,
        };
        f.touch(task.stage);
        let st = &mut f.stages[task.stage as usize];
        st.set(i, DONE);
        if failed {
            // What was skipped because it failed runs after all.
            self.revive_dependents(farm, task.stage, Some(task.index));
        }
        self.void_grown(farm, task, grew);
        self.on_done(farm, task);
        self.fill(now);
        self.check_finished(farm);
        true
    }

    /// A new coordinator learns that a node already holds this attempt: it
    /// counts as claimed. False when the task is no longer waiting to run.
    pub fn adopt_claim(&mut self, farm: FarmSlot, task: TaskRef, attempt: u32) -> bool {
        let f = &mut self.farms[farm.0 as usize];
        let Some(st) = f.stages.get_mut(task.stage as usize) else {
            return false;
        };
        let i = task.index as usize;
        if st.status.get(i) != Some(&PENDING) || f.cancelled {
            return false;
        }
        st.set(i, RUNNING);
        st.attempts[i] = st.attempts[i].max(attempt);
        self.running.insert(
            (farm, task),
            Running {
                attempt,
                grant: Grant::default(),
                killed: None,
            },
        );
        true
    }

    /// Whether a stage fits no machine (its tasks are failed until one does).
    pub fn unplaceable(&self, farm: FarmSlot, stage: u32) -> bool {
        self.farms[farm.0 as usize]
            .stages
            .get(stage as usize)
            .is_some_and(|st| st.unplaceable)
    }

    /// Tasks ready to be handed out and not yet claimed, over every open stage.
    pub fn backlog(&self) -> u64 {
        self.farms
            .iter()
            .filter(|f| !f.cancelled)
            .flat_map(live_stages)
            .filter(|(st, _)| st.open && !st.unplaceable)
            .map(|(st, def)| st.ready_count(def))
            .sum()
    }

    /// Per distinct request of open stages: how many tasks asking for it
    /// are ready and unclaimed, and whether they would not fill every slot
    /// the machines have for them (the end of that work, where a task
    /// queued behind a node's busy slots can only wait longer than on a
    /// free slot elsewhere). Empty for a local engine.
    pub fn waiting(&mut self) -> Vec<(Resources, u64, bool)> {
        let Placement::Remote(machines) = &mut self.placement else {
            return Vec::new();
        };
        let mut waiting: Vec<(&Resources, u64)> = Vec::new();
        for (def, q) in waiting_stages(&self.farms) {
            match waiting.iter_mut().find(|(r, _)| *r == &def.resources) {
                Some((_, n)) => *n += q,
                None => waiting.push((&def.resources, q)),
            }
        }
        waiting
            .into_iter()
            .map(|(req, q)| (req.clone(), q, q < machines.slots(req)))
            .collect()
    }

    /// Per open stage with tasks ready and unclaimed: the stage and how many.
    pub fn waiting_stages(&self) -> impl Iterator<Item = (&StageDef, u64)> {
        waiting_stages(&self.farms)
    }

    /// A claimed task's node died: the task is queued again with a crash
    /// counted and no retry spent; after [`CRASHES_MAX`] crashes it fails.
    pub fn lost(&mut self, now: Millis, farm: FarmSlot, task: TaskRef, attempt: u32) {
        self.requeue(now, farm, task, attempt, true);
    }

    /// A done task runs again: what it made is lost (its outputs went with
    /// a node that never came back). Work downstream that already ran stays
    /// done. The coordinator hands it out again; a local engine never redoes.
    pub fn redo(&mut self, farm: FarmSlot, task: TaskRef) -> bool {
        let f = &mut self.farms[farm.0 as usize];
        let Some(st) = f.stages.get(task.stage as usize) else {
            return false;
        };
        let i = task.index as usize;
        if st.status.get(i) != Some(&DONE) || f.cancelled {
            return false;
        }
        f.touch(task.stage);
        let st = &mut f.stages[task.stage as usize];
        st.set(i, PENDING);
        st.ready.push_front(task.index);
        if !f.dependents_by[task.stage as usize].is_empty() {
            // Done again later, it lets them go again (see `on_done`).
            let g = f.def.graph().clone();
            for &(d, e) in &f.dependents_by[task.stage as usize] {
                for &k in g.stages[d as usize][e].downs.get(i) {
                    f.stages[d as usize].waiting[k as usize] += 1;
                }
            }
        }
        true
    }

    /// A claimed task was given back unstarted: it is queued again, nothing counted.
    pub fn unclaim(&mut self, now: Millis, farm: FarmSlot, task: TaskRef, attempt: u32) {
        self.requeue(now, farm, task, attempt, false);
    }

    fn requeue(&mut self, now: Millis, farm: FarmSlot, task: TaskRef, attempt: u32, crash: bool) {
        match self.running.get(&(farm, task)) {
            Some(r) if r.attempt == attempt => {}
            _ => return,
        }
        let run = self.running.remove(&(farm, task)).expect("checked above");
        if let Placement::Local(pool) = &mut self.placement {
            pool.release(&run.grant);
        }
        let f = &mut self.farms[farm.0 as usize];
        let st = &mut f.stages[task.stage as usize];
        let i = task.index as usize;
        let crashes = st.crashes[i] as u32 + u32::from(crash);
        st.crashes[i] = crashes.min(255) as u8;
        let (state, end) = if crashes >= CRASHES_MAX {
            (RecordState::Failed, Some(TaskEnd::CrashLimit))
        } else if f.cancelled || run.killed == Some(KillReason::Cancel) {
            (RecordState::Cancelled, Some(TaskEnd::Cancelled))
        } else {
            (RecordState::Interrupted, None)
        };
        let record = TaskRecord {
            run: f.run,
            state,
            attempt,
            failures: st.failures[i] as u32,
            crashes,
            end,
            key: None,
            duration_ms: 0,
            logs: 0,
            grew: None,
            stderr_line: None,
            usage: None,
        };
        self.actions
            .push_back(Action::Persist(Persist::Task { farm, task, record }));
        match state {
            RecordState::Failed => {
                st.set(i, FAILED);
                self.actions.push_back(Action::Emit(Event::TaskFinished {
                    farm,
                    task,
                    attempt,
                    end: TaskEnd::CrashLimit,
                    stderr_line: None,
                    verdict: Verdict::Failed,
                }));
                self.fail_dependents(farm, task.stage, Some(task.index));
            }
            RecordState::Cancelled => {
                st.set(i, CANCELLED);
            }
            _ if st.stopped.is_some() => st.set(i, HELD),
            _ => {
                st.set(i, PENDING);
                // Back once what it waits for is done again, if something
                // it depends on is being made again (see `on_done`).
                if each_done(f, task.stage as usize, i) {
                    f.stages[task.stage as usize].ready.push_front(task.index);
                }
            }
        }
        self.fill(now);
        self.check_finished(farm);
    }

    /// Fires timers that are due: tasks past their timeout are killed.
    pub fn handle_timeout(&mut self, now: Millis) {
        while let Some(Reverse((at, farm, task, attempt))) = self.timers.peek().copied() {
            if at > now {
                break;
            }
            self.timers.pop();
            let kill = self.running.update(&(farm, task), |run| {
                let kill = run.attempt == attempt && run.killed.is_none();
                if kill {
                    run.killed = Some(KillReason::Timeout);
                }
                kill
            });
            if kill == Some(true) {
                self.actions.push_back(Action::Kill {
                    farm,
                    task,
                    attempt,
                    reason: KillReason::Timeout,
                });
            }
        }
    }

    /// When the engine next needs `handle_timeout`.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Millis> {
        self.timers.peek().map(|Reverse((at, ..))| *at)
    }

    /// True while actions are waiting to be polled.
    pub fn has_actions(&self) -> bool {
        !self.actions.is_empty()
    }

    /// The next action for the driver to carry out, in order; None when
    /// the engine has nothing more until the next event.
    #[must_use]
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// Cancels a farm: nothing new starts, running tasks are killed.
    pub fn cancel(&mut self, farm: FarmSlot) {
        let f = &mut self.farms[farm.0 as usize];
        if f.cancelled {
            return;
        }
        f.cancelled = true;
        for st in &mut f.stages {
            for i in 0..st.status.len() {
                if matches!(st.status[i], PENDING | HELD) {
                    st.set(i, CANCELLED);
                }
            }
            st.ready.clear();
        }
        self.kill_where(|f, _| f == farm, KillReason::Cancel);
        self.check_finished(farm);
    }

    /// Whether the whole farm was cancelled.
    pub fn cancelled(&self, farm: FarmSlot) -> bool {
        self.farms.get(farm.0 as usize).is_some_and(|f| f.cancelled)
    }

    /// Cancels one task: it does not start, or, running, is killed; the
    /// tasks that depend on it are skipped, as after a failure. A task
    /// that ended already is left as it is.
    pub fn cancel_task(&mut self, farm: FarmSlot, task: TaskRef) {
        let Some(f) = self.farms.get_mut(farm.0 as usize) else {
            return;
        };
        let Some(st) = f.stages.get_mut(task.stage as usize) else {
            return;
        };
        let i = task.index as usize;
        match st.status.get(i).copied() {
            Some(PENDING | HELD) => {
                st.set(i, CANCELLED);
                st.ready.retain(|&x| x != task.index);
                self.fail_dependents(farm, task.stage, Some(task.index));
            }
            Some(RUNNING) => self.kill_where(|f, t| f == farm && t == task, KillReason::Cancel),
            _ => {}
        }
        self.check_finished(farm);
    }

    /// Stops everything so the farms can be resumed later: running tasks are
    /// killed and recorded as interrupted, nothing new starts.
    pub fn interrupt(&mut self) {
        self.interrupted = true;
        self.kill_where(|_, _| true, KillReason::Interrupt);
    }

    /// Kills the running tasks `pick` names that no kill was sent yet.
    fn kill_where(&mut self, pick: impl Fn(FarmSlot, TaskRef) -> bool, reason: KillReason) {
        let mut victims: Vec<_> = self
            .running
            .iter_mut()
            .filter(|((f, t), r)| pick(*f, *t) && r.killed.is_none())
            .map(|((f, t), r)| {
                r.killed = Some(reason);
                (*f, *t, r.attempt)
            })
            .collect();
        victims.sort();
        for (farm, task, attempt) in victims {
            self.actions.push_back(Action::Kill {
                farm,
                task,
                attempt,
                reason,
            });
        }
    }

    fn check_finished(&mut self, farm: FarmSlot) {
        // An open farm is not over whatever its counts (summing them went
        // over every stage of a farm grown by thousands of batches).
        let over =
            self.farms[farm.0 as usize].takes_no_more() && self.over(farm, &self.progress(farm));
        let f = &mut self.farms[farm.0 as usize];
        if !f.finished_emitted && over {
            f.finished_emitted = true;
            self.actions
                .push_back(Action::Emit(Event::FarmFinished { farm }));
        }
    }

    /// True when nothing is running anywhere.
    pub fn idle(&self) -> bool {
        self.running.is_empty()
    }

    /// How many task attempts are running now, over every farm.
    pub fn running_count(&self) -> usize {
        self.running.len()
    }

    /// Each stage's counts of tasks by state, in the farm's stage order.
    pub fn stage_progress(&self, farm: FarmSlot) -> Vec<Counts> {
        self.farms[farm.0 as usize]
            .stages
            .iter()
            .map(|s| s.counts.clone())
            .collect()
    }

    /// Each stage of `farm` that may not be settled, with its counts, in
    /// stage order; those settled are then passed by later calls (and by
    /// the passes over ready work) until a task of theirs runs again. A
    /// stage's last counts are visited once it has settled.
    pub fn live_counts(&mut self, farm: FarmSlot, mut visit: impl FnMut(u32, &Counts)) {
        let f = &mut self.farms[farm.0 as usize];
        let mut settled = Vec::new();
        for &s in &f.live {
            let st = &f.stages[s as usize];
            visit(s, &st.counts);
            if st.settled() {
                settled.push(s);
            }
        }
        for s in settled {
            f.pass_over(s);
        }
    }

    /// The stages of `farm` passed over as settled, with their counts: for checks.
    pub fn settled_counts(&self, farm: FarmSlot) -> impl Iterator<Item = (u32, &Counts)> {
        let f = &self.farms[farm.0 as usize];
        (0..f.stages.len() as u32)
            .filter(|s| !f.live.contains(s))
            .map(|s| (s, &f.stages[s as usize].counts))
    }

    /// The farm's counts of tasks by state, over all its stages.
    pub fn progress(&self, farm: FarmSlot) -> Counts {
        let mut c = Counts::default();
        for s in &self.farms[farm.0 as usize].stages {
            c.add(&s.counts);
        }
        c
    }
}

#[cfg(test)]
mod tests;
