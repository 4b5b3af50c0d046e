//! The worker: what this node runs, in order, with its grants and timeouts, and the results it keeps until the coordinator acknowledges them.

use std::cell::OnceCell;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, VecDeque};
use std::sync::Arc;

use rustc_hash::FxHashMap;

use super::super::msg::*;
use super::super::pace::Pace;
use super::action::{Action, PeerEvent, Persist};
use super::election::Leader;
use super::out::Out;
use super::placement::{room, Prefetch, STEAL_PREFETCH_PERCENT};
use super::Node;
use crate::alloc::fits_before_walltime;
use crate::engine::{self, KillReason, Millis, Outcome, TaskResult};
use crate::farm::TaskRef;
use crate::observe::Latency;
use crate::pool::{Grant, Pool};
use crate::resources::{Amount, Resources, CPU, GPU};

/// Most runs whose start a peer remembers for [`Latency::StartToDone`].
const STARTED_KEPT: usize = 1 << 17;

struct Run {
    attempt: u32,
    started: Millis,
    grant: Grant,
    killed: Option<KillReason>,
}

/// Farm definitions this node knows, by id (shared by every role).
pub(super) type Specs = FxHashMap<FarmId, Arc<FarmSpec>>;

/// Keeps `spec` unless as late a generation of its farm is here already
/// (an open farm's copies cross on the network). True when kept.
pub(super) fn keep_spec(specs: &mut Specs, spec: &Arc<FarmSpec>) -> bool {
    match specs.get(&spec.id) {
        Some(have) if have.gen >= spec.gen => false,
        _ => {
            specs.insert(spec.id, spec.clone());
            true
        }
    }
}

/// Asks for `farm`'s spec, saying which generation of it is here: only
/// what was added since comes back.
pub(super) fn get_farm(specs: &Specs, farm: FarmId) -> Msg {
    Msg::GetFarm {
        farm,
        have: specs.get(&farm).map(|s| SpecHeld::of(s)),
    }
}

/// Whether the spec here says what `a` runs: a task of a stage added to
/// an open farm since needs its later generation.
fn spec_knows(specs: &Specs, a: &Assigned) -> bool {
    specs
        .get(&a.farm)
        .is_some_and(|s| (a.task.stage as usize) < s.def.stages.len())
}

/// A run this node started that is over, as the driver tells it: the
/// attempt, how it went, and the outputs it left here.
pub(super) struct Ended {
    pub(super) task: Assigned,
    pub(super) outcome: Outcome,
    pub(super) outputs: Vec<OutputFile>,
}

pub(super) struct Worker {
    pool: Pool,
    queue: VecDeque<Assigned>,
    running: FxHashMap<(FarmId, TaskRef), Run>,
    /// What the grants of `running` hold, counted as tasks start and end:
    /// held against the pool after every step that changed either.
    lent: Resources,
    /// The pool or `running` changed since the last per-step check: only
    /// then can what is free and what runs disagree.
    pool_changed: bool,
    /// What this node's beats say of its load (`used`, `started`), built
    /// at the first beat after a task started or ended here: a node beats
    /// several times a second and starts or ends tasks far less often
    /// (building both for every beat was 5% of a simulated long farm).
    load: OnceCell<(Arc<Resources>, Arc<[Started]>)>,
    timers: BinaryHeap<Reverse<(Millis, FarmId, TaskRef, u32)>>,
    awaiting_spec: FxHashMap<FarmId, Vec<Assigned>>,
    unacked: BTreeMap<(FarmId, TaskRef), Report>,
    /// Entries of `unacked` changed since they were last persisted;
    /// none are noted for a driver that keeps no store.
    unacked_dirty: BTreeSet<(FarmId, TaskRef)>,
    /// Reports of this step, sent as one message at its end.
    reports_out: Vec<Report>,
    /// Durations and round trips measured here, and the prefetch depth
    /// they give (see the `pace` module).
    pace: Pace,
    depth: u32,
    interrupted: bool,
    /// The batch job that started this node, and when it drains before
    /// its walltime (on this peer's clock).
    job: Option<String>,
    deadline: Option<Millis>,
}

impl Worker {
    pub(super) fn new(total: Resources) -> Worker {
        Worker {
            depth: base_depth(&total),
            pool: Pool::new(total),
            queue: VecDeque::new(),
            running: FxHashMap::default(),
            lent: Resources::new(),
            pool_changed: true,
            load: OnceCell::new(),
            timers: BinaryHeap::new(),
            awaiting_spec: FxHashMap::default(),
            unacked: BTreeMap::new(),
            unacked_dirty: BTreeSet::new(),
            reports_out: Vec::new(),
            pace: Pace::default(),
            interrupted: false,
            job: None,
            deadline: None,
        }
    }

    // ----- what the other roles read -----

    pub(super) fn total(&self) -> &Resources {
        self.pool.total()
    }

    /// `total`, for a beat.
    pub(super) fn total_shared(&self) -> Arc<Resources> {
        self.pool.total_shared()
    }

    pub(super) fn used(&self) -> Arc<Resources> {
        self.load().0.clone()
    }

    fn load(&self) -> &(Arc<Resources>, Arc<[Started]>) {
        self.load
            .get_or_init(|| (Arc::new(self.pool.used()), self.count_started().into()))
    }

    /// A task started or ended here: what is free and what runs changed.
    fn pool_changed(&mut self) {
        self.pool_changed = true;
        self.load.take();
    }

    /// No whole core is free here.
    pub(super) fn full(&self) -> bool {
        self.pool.free().get(CPU) < Amount::units(1)
    }

    pub(super) fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Cores and GPUs of the tasks queued here that cannot start within
    /// [`LATE_MS`]: work the allocation queues should bring nodes for,
    /// though this node claimed it. A task's time is its stage's
    /// `expected`, else the mean measured here, else, for a running task,
    /// as long again as it has run (nothing else is known of a long stage
    /// before its first task ends) and, for a queued one, nothing.
    /// `room`: the longest a node of the queues of that kind (GPUs or
    /// not) lives; a task expected to run longer is not counted.
    pub(super) fn late(
        &self,
        now: Millis,
        specs: &Specs,
        room: impl Fn(bool) -> Millis,
    ) -> (u32, u32) {
        if self.queue.is_empty() {
            return (0, 0);
        }
        let stage_of = |farm: FarmId, task: TaskRef| {
            specs
                .get(&farm)
                .and_then(|s| s.def.stages.get(task.stage as usize))
        };
        let expected = |farm: FarmId, task: TaskRef| {
            stage_of(farm, task)
                .and_then(|st| st.expected_ms)
                .or_else(|| self.pace.mean_ms(farm, task.stage))
        };
        let units = |r: &Resources, kind: &str| r.get(kind).0.div_ceil(Amount::units(1).0);
        let mut out = [0u32; 2];
        for (slot, kind) in [CPU, GPU].into_iter().enumerate() {
            let gpus = kind == GPU;
            let running: Vec<(u64, Millis)> = self
                .running
                .iter()
                .filter(|(_, r)| (units(&r.grant.resources, GPU) > 0) == gpus)
                .map(|(&(farm, task), r)| {
                    let ran = now.saturating_sub(r.started);
                    let left = expected(farm, task).map_or(ran, |e| e.saturating_sub(ran));
                    (units(&r.grant.resources, kind).max(1), left)
                })
                .collect();
            let room = room(gpus);
            let queued: Vec<(u64, Millis, bool)> = self
                .queue
                .iter()
                .filter_map(|a| {
                    let st = stage_of(a.farm, a.task)?;
                    ((units(&st.resources, GPU) > 0) == gpus).then(|| {
                        let d = expected(a.farm, a.task).unwrap_or(0);
                        let fits = st.expected_ms.is_none_or(|e| e <= room);
                        (units(&st.resources, kind).max(1), d, fits)
                    })
                })
                .collect();
            let total = units(self.pool.total(), kind);
            out[slot] = late_units(total, &running, &queued, LATE_MS) as u32;
        }
        (out[0], out[1])
    }

    pub(super) fn running_count(&self) -> usize {
        self.running.len()
    }

    /// The tasks running here per farm's stage, for the beat: the most
    /// started first, at most `STARTED_MAX` stages, ties in farm and
    /// stage order so that a beat says the same of the same tasks.
    pub(super) fn started(&self) -> Arc<[Started]> {
        self.load().1.clone()
    }

    fn count_started(&self) -> Vec<Started> {
        // A node runs a few stages at once: a scan of a short list costs
        // less than a map built and dropped for every beat (3% of a long
        // simulated farm).
        let mut out: Vec<Started> = Vec::new();
        for (farm, task) in self.running.keys() {
            match out
                .iter_mut()
                .find(|s| s.farm == *farm && s.stage == task.stage)
            {
                Some(s) => s.tasks += 1,
                None => out.push(Started {
                    farm: *farm,
                    stage: task.stage,
                    tasks: 1,
                }),
            }
        }
        out.sort_unstable_by_key(|s| (Reverse(s.tasks), s.farm, s.stage));
        out.truncate(STARTED_MAX);
        out
    }

    pub(super) fn runs(&self, farm: FarmId, task: TaskRef) -> bool {
        self.running.contains_key(&(farm, task))
    }

    /// True when nothing runs here and nothing waits to be reported.
    pub(super) fn idle(&self) -> bool {
        self.reported() && self.queue.is_empty()
    }

    /// True when nothing runs here and every result has been acknowledged
    /// (tasks may still be queued here).
    pub(super) fn reported(&self) -> bool {
        self.running.is_empty() && self.unacked.is_empty()
    }

    /// Something is queued here or waits for its farm's spec: stealing
    /// more before it starts would hoard.
    pub(super) fn has_waiting(&self) -> bool {
        !self.queue.is_empty() || !self.awaiting_spec.is_empty()
    }

    pub(super) fn interrupted(&self) -> bool {
        self.interrupted
    }

    pub(super) fn depth(&self) -> u32 {
        self.depth
    }

    pub(super) fn job(&self) -> Option<&String> {
        self.job.as_ref()
    }

    pub(super) fn deadline(&self) -> Option<Millis> {
        self.deadline
    }

    pub(super) fn set_batch_job(&mut self, job: Option<String>, deadline: Option<Millis>) {
        self.job = job;
        self.deadline = deadline;
    }

    /// Results reported before a restart and not acknowledged: kept, and reported again.
    pub(super) fn restore_unacked(&mut self, reports: Vec<Report>) {
        for r in reports {
            self.unacked.insert((r.task.farm, r.task.task), r);
        }
    }

    /// Farms whose spec this node waits for, in order.
    pub(super) fn awaited_specs(&self) -> Vec<FarmId> {
        let mut waiting: Vec<FarmId> = self.awaiting_spec.keys().copied().collect();
        waiting.sort();
        waiting
    }

    // ----- the queue -----

    /// Queues a task given by `from` (the coordinator, or a victim of a
    /// steal), asking `from` for the farm's spec when it is not known here.
    pub(super) fn enqueue(
        &mut self,
        now: Millis,
        from: NodeId,
        a: Assigned,
        specs: &Specs,
        out: &mut Out,
    ) {
        if let Some(o) = out.observed() {
            o.arrived.insert((a.farm, a.task), now);
        }
        if spec_knows(specs, &a) {
            self.queue.push_back(a);
        } else {
            let first = !self.awaiting_spec.contains_key(&a.farm);
            self.awaiting_spec.entry(a.farm).or_default().push(a);
            if first {
                out.send(from, get_farm(specs, a.farm));
            }
        }
    }

    /// The spec of `farm` came: what waited for it is queued, but for
    /// tasks of stages it does not have yet (an older generation overtook
    /// the one asked for), which wait on. True if anything was queued.
    pub(super) fn spec_arrived(&mut self, farm: FarmId, specs: &Specs) -> bool {
        let Some(waiting) = self.awaiting_spec.remove(&farm) else {
            return false;
        };
        let (known, still): (Vec<Assigned>, Vec<Assigned>) =
            waiting.into_iter().partition(|a| spec_knows(specs, a));
        if !still.is_empty() {
            self.awaiting_spec.insert(farm, still);
        }
        let any = !known.is_empty();
        self.queue.extend(known);
        any
    }

    /// Starts queued tasks, in order, while they fit.
    pub(super) fn start_queued(
        &mut self,
        now: Millis,
        specs: &Specs,
        out: &mut Out,
        leader: Leader,
    ) {
        if self.interrupted {
            return;
        }
        let mut i = 0;
        let mut late = Vec::new();
        // The stage whose request did not fit: nothing is given back during
        // the scan, so its other tasks will not fit either. A full node
        // (most of them, most of the time) scans its whole queue at every
        // end and assignment, each task looked up and tried.
        let mut no_room: Option<(FarmId, u32)> = None;
        // Skipping a task that does not fit now lets smaller ones behind it
        // run; the scan is bounded so a long queue costs little.
        while i < self.queue.len() && i < 64 {
            let a = self.queue[i];
            // With a deadline, a task that would end too late leaves the
            // queue whether or not it fits: then each is looked at.
            if self.deadline.is_none() && no_room == Some((a.farm, a.task.stage)) {
                i += 1;
                continue;
            }
            if self.running.contains_key(&(a.farm, a.task)) {
                // Handed here again while another attempt runs (two
                // coordinators across a partition): it waits for that run,
                // whose result answers for it too (see `task_finished`).
                i += 1;
                continue;
            }
            let Some(spec) = specs.get(&a.farm) else {
                i += 1;
                continue;
            };
            let stage = &spec.def.stages[a.task.stage as usize];
            let timeout = stage.timeout_ms;
            if self
                .deadline
                .is_some_and(|d| !fits_before_walltime(now, d, stage.expected_ms, 0))
            {
                // It would not end before this node's walltime: another node runs it.
                self.queue.remove(i);
                late.push(a);
                continue;
            }
            let Some(grant) = self.pool.grant(&stage.resources) else {
                no_room = Some((a.farm, a.task.stage));
                i += 1;
                continue;
            };
            self.queue.remove(i);
            self.lent.give(&grant.resources);
            self.pool_changed();
            if let Some(ms) = timeout {
                self.timers
                    .push(Reverse((now.saturating_add(ms), a.farm, a.task, a.attempt)));
            }
            self.running.insert(
                (a.farm, a.task),
                Run {
                    attempt: a.attempt,
                    started: now,
                    grant: grant.clone(),
                    killed: None,
                },
            );
            if let Some(o) = out.observed() {
                if let Some(at) = o.arrived.remove(&(a.farm, a.task)) {
                    o.latency
                        .record_ms(Latency::QueueWait, now.saturating_sub(at));
                }
                if o.started.len() > STARTED_KEPT {
                    // Runs whose result was never acknowledged here (handed
                    // back on an interrupt, a coordinator gone): forgotten.
                    o.started.clear();
                }
                o.started.insert((a.farm, a.task), now);
            }
            out.push(Action::Start { task: a, grant });
        }
        if !late.is_empty() {
            leader.send(out, |term| Msg::Release { term, tasks: late });
        }
    }

    /// A victim's side of a steal: gives what has not started, oldest
    /// first, as much as the thief may hold by the coordinator's own rule:
    /// the thief can start it sooner than this node, and tasks keep
    /// starting in about the order they were handed out (a long task
    /// queued early does not end up last). At most half the queue; to a
    /// thief with no free slot only what exceeds this node's own prefetch.
    pub(super) fn give_unstarted(
        &mut self,
        total: &Resources,
        mut load: Resources,
        max: u32,
        specs: &Specs,
        out: &mut Out,
    ) -> Vec<Assigned> {
        let thief_full = total.get(CPU).0 < load.get(CPU).0 + Amount::units(1).0;
        let spare = if thief_full {
            self.queue.len().saturating_sub(self.depth as usize)
        } else {
            self.queue.len()
        };
        let give_max = (max as usize).min(spare.div_ceil(2));
        let mut given = Vec::new();
        let mut i = 0;
        while i < self.queue.len() && given.len() < give_max {
            let a = self.queue[i];
            let Some(spec) = specs.get(&a.farm) else {
                i += 1;
                continue;
            };
            let req = &spec.def.stages[a.task.stage as usize].resources;
            if !room(total, &load, req, Prefetch::Percent(STEAL_PREFETCH_PERCENT)) {
                i += 1;
                continue;
            }
            load.give(req);
            self.queue.remove(i);
            if let Some(o) = out.observed() {
                o.arrived.remove(&(a.farm, a.task));
            }
            given.push(a);
        }
        given
    }

    // ----- runs -----

    /// Kills the runs whose timeout passed.
    pub(super) fn fire_timers(&mut self, now: Millis, out: &mut Out) {
        while let Some(Reverse((at, farm, task, attempt))) = self.timers.peek().copied() {
            if at > now {
                break;
            }
            self.timers.pop();
            if let Some(r) = self.running.get_mut(&(farm, task)) {
                if r.attempt == attempt && r.killed.is_none() {
                    r.killed = Some(KillReason::Timeout);
                    out.push(Action::Kill {
                        task: Assigned {
                            farm,
                            task,
                            attempt,
                        },
                        reason: KillReason::Timeout,
                    });
                }
            }
        }
    }

    /// When the next timeout passes.
    pub(super) fn next_timer(&self) -> Option<Millis> {
        self.timers.peek().map(|Reverse((t, ..))| *t)
    }

    /// See `Peer::give_back`: its end, when reported, releases it.
    pub(super) fn give_back(&mut self, task: Assigned) {
        if let Some(r) = self.running.get_mut(&(task.farm, task.task)) {
            if r.attempt == task.attempt && r.killed.is_none() {
                r.killed = Some(KillReason::Interrupt);
            }
        }
    }

    /// Stops this node's tasks (Ctrl-C): running ones are killed, queued ones given back.
    pub(super) fn interrupt(&mut self, now: Millis, out: &mut Out, leader: Leader) {
        self.interrupted = true;
        // Its time is up: the coordinator places nothing more here (it
        // reads the deadline from this node's beats, and its own).
        self.deadline = Some(self.deadline.map_or(now, |d| d.min(now)));
        let queued: Vec<Assigned> = self.queue.drain(..).collect();
        if !queued.is_empty() {
            leader.send(out, |term| Msg::Release {
                term,
                tasks: queued,
            });
        }
        let mut kill: Vec<Assigned> = Vec::new();
        for ((farm, task), r) in &mut self.running {
            if r.killed.is_none() {
                r.killed = Some(KillReason::Interrupt);
                kill.push(Assigned {
                    farm: *farm,
                    task: *task,
                    attempt: r.attempt,
                });
            }
        }
        kill.sort_by_key(|a| (a.farm, a.task));
        for task in kill {
            out.push(Action::Kill {
                task,
                reason: KillReason::Interrupt,
            });
        }
    }

    /// The coordinator cancelled one task: dropped if it waits here,
    /// killed if it runs. The engine hears of it as of a cancelled farm's.
    pub(super) fn cancel_task(&mut self, farm: FarmId, task: TaskRef, out: &mut Out) {
        self.cancel_where(|f, t| f == farm && t == task, out);
    }

    /// The coordinator cancelled `farm`: drops what waits here and kills
    /// what runs. The engine hears of each.
    pub(super) fn cancel(&mut self, farm: FarmId, out: &mut Out) {
        self.cancel_where(|f, _| f == farm, out);
    }

    /// Drops the tasks `pick` names that wait here and kills those that run.
    fn cancel_where(&mut self, pick: impl Fn(FarmId, TaskRef) -> bool, out: &mut Out) {
        let (gone, keep): (Vec<Assigned>, Vec<Assigned>) =
            self.queue.drain(..).partition(|a| pick(a.farm, a.task));
        self.queue = keep.into();
        for a in gone {
            self.report(
                Report {
                    task: a,
                    result: TaskResult::Error("cancelled".into()),
                    key: None,
                    duration_ms: 0,
                    ended_ms: 0,
                    grew: None,
                    outputs: Vec::new(),
                    stderr_line: None,
                    usage: None,
                },
                out,
            );
        }
        let mut kill = Vec::new();
        for ((f, t), r) in &mut self.running {
            if pick(*f, *t) && r.killed.is_none() {
                r.killed = Some(KillReason::Cancel);
                kill.push(Assigned {
                    farm: *f,
                    task: *t,
                    attempt: r.attempt,
                });
            }
        }
        for task in kill {
            out.push(Action::Kill {
                task,
                reason: KillReason::Cancel,
            });
        }
    }

    /// A run is over: its grant goes back, its duration counts toward the
    /// depth, and its result is reported (or the task given back, if it was
    /// stopped on purpose).
    pub(super) fn finish_one(
        &mut self,
        now: Millis,
        ended: Ended,
        cx: &Node,
        specs: &Specs,
        out: &mut Out,
    ) {
        let Ended {
            task,
            outcome,
            outputs,
        } = ended;
        let key = (task.farm, task.task);
        match self.running.get(&key) {
            Some(r) if r.attempt == task.attempt => {}
            _ => return,
        }
        let run = self.running.remove(&key).expect("checked above");
        self.pool.release(&run.grant);
        self.lent.take_saturating(&run.grant.resources);
        self.pool_changed();
        if let Some(spec) = specs.get(&task.farm) {
            let stage = task.task.stage;
            let slots = engine::copies(
                self.pool.total(),
                &spec.def.stages[stage as usize].resources,
            );
            self.pace
                .finished(now, task.farm, stage, slots, outcome.duration_ms);
            self.update_depth(now, cx.cfg.queue_max);
        }
        if run.killed == Some(KillReason::Interrupt) {
            // Stopped on purpose, not failed: it goes back to the queue,
            // and no retry is spent on it.
            cx.leader().send(out, |term| Msg::Release {
                term,
                tasks: vec![task],
            });
            return;
        }
        let result = match run.killed {
            Some(KillReason::Timeout) => TaskResult::TimedOut,
            _ => outcome.result,
        };
        let ok = matches!(result, TaskResult::Exited(c) if specs.get(&task.farm)
            .is_some_and(|s| s.def.stages[task.task.stage as usize].success_codes.contains(&c)));
        let report = Report {
            task,
            result,
            key: outcome.key,
            duration_ms: outcome.duration_ms,
            ended_ms: outcome.ended_ms,
            grew: outcome.grew,
            outputs,
            stderr_line: outcome.stderr_line,
            usage: outcome.usage,
        };
        let same_task = |a: &Assigned| a.farm == task.farm && a.task == task.task;
        // Looked for before the queue is rebuilt: nearly always there is none.
        if ok && self.queue.iter().any(same_task) {
            // Other attempts of this task queued here meanwhile are done by this run.
            let (same, rest): (Vec<Assigned>, Vec<Assigned>) =
                self.queue.drain(..).partition(same_task);
            self.queue = rest.into();
            for a in same {
                self.report(
                    Report {
                        task: a,
                        ..report.clone()
                    },
                    out,
                );
            }
        }
        self.report(report, out);
    }

    /// Recomputes the prefetch depth from what was measured.
    pub(super) fn update_depth(&mut self, now: Millis, queue_max: usize) {
        let base = base_depth(self.pool.total());
        self.depth = self.pace.depth(now, base, queue_max as u32);
    }

    /// Until when `update_depth` would leave the depth as it is, if
    /// nothing is measured first (None: not known, something was).
    pub(super) fn depth_holds_until(&self, queue_max: usize) -> Option<Millis> {
        let base = base_depth(self.pool.total());
        self.pace.holds_until(base, queue_max as u32)
    }

    /// The round trip from a report to the assignment that answered it.
    pub(super) fn round_trip(&mut self, now: Millis, rtt: Millis, queue_max: usize) {
        self.pace.round_trip(rtt);
        self.update_depth(now, queue_max);
    }

    // ----- reports -----

    /// A result for the coordinator, kept until it is acknowledged (and resent until then).
    fn report(&mut self, report: Report, out: &Out) {
        let key = (report.task.farm, report.task.task);
        self.unacked.insert(key, report.clone());
        if out.persists() {
            self.unacked_dirty.insert(key);
        }
        self.reports_out.push(report);
    }

    /// Sends this step's reports as one message (in `batch_max` chunks).
    pub(super) fn send_reports(
        &mut self,
        now: Millis,
        batch_max: usize,
        out: &mut Out,
        leader: Leader,
    ) {
        if self.reports_out.is_empty() {
            return;
        }
        let reports = std::mem::take(&mut self.reports_out);
        let prefetch = self.depth;
        if reports.len() <= batch_max {
            // One message, as nearly always: the reports move into it
            // rather than being copied (each holds its outputs' list).
            leader.send(out, |term| Msg::Report {
                term,
                reports,
                at: now,
                prefetch,
            });
            return;
        }
        for chunk in reports.chunks(batch_max) {
            leader.send(out, |term| Msg::Report {
                term,
                reports: chunk.to_vec(),
                at: now,
                prefetch,
            });
        }
    }

    /// Whether a resend has nothing of this worker's to send again: no
    /// report unacknowledged, no farm's spec awaited.
    pub(super) fn resends_nothing(&self) -> bool {
        self.unacked.is_empty() && self.awaiting_spec.is_empty()
    }

    /// Not yet acknowledged, so maybe lost: sent again with this step's
    /// reports (the coordinator counts each once).
    pub(super) fn report_unacked_again(&mut self) {
        self.reports_out.extend(self.unacked.values().cloned());
    }

    /// The coordinator has these results durably: forgotten here.
    pub(super) fn acked(&mut self, now: Millis, tasks: Vec<Assigned>, out: &mut Out) {
        for a in tasks {
            if self
                .unacked
                .get(&(a.farm, a.task))
                .is_some_and(|r| r.task.attempt == a.attempt)
            {
                self.unacked.remove(&(a.farm, a.task));
                if out.persists() {
                    self.unacked_dirty.insert((a.farm, a.task));
                }
                if let Some(o) = out.observed() {
                    if let Some(at) = o.started.remove(&(a.farm, a.task)) {
                        o.latency
                            .record_ms(Latency::StartToDone, now.saturating_sub(at));
                    }
                }
            }
        }
    }

    /// Whether a step's `send_reports` and `persist_unacked` would do
    /// nothing: no report to send, no unacknowledged one changed.
    pub(super) fn sends_nothing(&self) -> bool {
        self.reports_out.is_empty() && self.unacked_dirty.is_empty()
    }

    /// What changed among the unacknowledged results, made durable.
    pub(super) fn persist_unacked(&mut self, out: &mut Out) {
        if self.unacked_dirty.is_empty() {
            return;
        }
        let mut reports = Vec::new();
        let mut gone = Vec::new();
        for key in std::mem::take(&mut self.unacked_dirty) {
            match self.unacked.get(&key) {
                Some(r) => reports.push(r.clone()),
                None => gone.push(key),
            }
        }
        out.persist(Persist::Unacked { reports, gone });
    }

    /// Nothing [`claimed`](Self::claimed) would list.
    pub(super) fn claims_nothing(&self) -> bool {
        self.queue.is_empty()
            && self.running.is_empty()
            && self.awaiting_spec.is_empty()
            && self.unacked.is_empty()
    }

    /// Every task this node holds a claim on for the coordinator, in a
    /// stable order: queued, running, waiting for its farm's spec, reported
    /// and not acknowledged.
    pub(super) fn claimed(&self) -> Vec<Assigned> {
        // Sized once and filled part by part: every report of a busy
        // worker lists them, and the chained iterator cost twice this.
        let waiting: usize = self.awaiting_spec.values().map(Vec::len).sum();
        let mut v = Vec::with_capacity(
            self.queue.len() + self.running.len() + waiting + self.unacked.len(),
        );
        v.extend(self.queue.iter().copied());
        v.extend(self.running.iter().map(|((farm, task), r)| Assigned {
            farm: *farm,
            task: *task,
            attempt: r.attempt,
        }));
        for tasks in self.awaiting_spec.values() {
            v.extend_from_slice(tasks);
        }
        v.extend(self.unacked.values().map(|r| r.task));
        // Equal keys are equal claims: their order cannot show.
        v.sort_unstable_by_key(|a| (a.farm, a.task, a.attempt));
        v
    }

    /// Called first by every input when this node was silent for about the
    /// death timeout: its queue may have been run elsewhere, so it goes
    /// back (see `Peer::woke`).
    pub(super) fn give_back_silent(&mut self, silent_ms: Millis, out: &mut Out, leader: Leader) {
        if self.queue.is_empty() {
            return;
        }
        if let Some(o) = out.observed() {
            o.arrived.clear();
        }
        let tasks: Vec<Assigned> = self.queue.drain(..).collect();
        out.emit(PeerEvent::Silent {
            ms: silent_ms,
            released: tasks.len(),
        });
        leader.send(out, |term| Msg::Release { term, tasks });
    }

    // ----- checks -----

    /// After a step that started or ended a task here: the pool within
    /// bounds, and what it has lent equal to what the running grants hold.
    pub(super) fn check_step(&mut self) -> Result<(), String> {
        // Most steps start and end nothing here (messages, beats), and the
        // grants are counted as they come and go: a pass over them after
        // every step was a tenth of a 1,000-node run.
        if std::mem::take(&mut self.pool_changed) {
            self.pool
                .check_bounds()
                .and_then(|()| self.pool.check_lent(&self.lent))?;
        }
        Ok(())
    }

    pub(super) fn check_bounds(&self) -> Result<(), String> {
        self.pool.check_bounds()
    }

    /// The pool against a sum of the running tasks' grants.
    pub(super) fn check_tasks(&self) -> Result<(), String> {
        if let Some((used, started)) = self.load.get() {
            if **used != self.pool.used() || **started != *self.count_started() {
                return Err(format!(
                    "its beats say {used} used and {started:?} started, but {} is used and {:?} runs",
                    self.pool.used(),
                    self.count_started()
                ));
            }
        }
        self.pool.check(self.running.values().map(|r| &r.grant))
    }
}

/// Queued work that cannot start within this long counts toward the
/// allocation queues' backlog.
pub(super) const LATE_MS: Millis = 60_000;

/// Of `queued` (units each needs, how long it runs, whether it counts),
/// started in order as units of `total` free up, the units of those that
/// count and cannot start within `within`: `running` holds units until
/// they are left (units, time left).
/// A task that needs more than `total` never starts here and is not
/// counted (the coordinator knows it fits nowhere else either, or places
/// it there). Units beyond the first few thousand are not told apart.
fn late_units(
    total: u64,
    running: &[(u64, Millis)],
    queued: &[(u64, Millis, bool)],
    within: Millis,
) -> u64 {
    let total = total.min(4096) as usize;
    if total == 0 {
        return 0;
    }
    // When each unit is free next.
    let mut free = vec![0; total];
    let mut held = running
        .iter()
        .flat_map(|&(u, left)| (0..u).map(move |_| left));
    for f in free.iter_mut() {
        match held.next() {
            Some(left) => *f = left,
            None => break,
        }
    }
    let mut late = 0;
    for &(units, runs, counts) in queued {
        let units = units as usize;
        if units > total {
            continue;
        }
        free.sort_unstable();
        let start = free[units - 1];
        if counts && start > within {
            late += units as u64;
        }
        for f in &mut free[..units] {
            *f = start.saturating_add(runs);
        }
    }
    late
}

/// The prefetch depth of a node that has measured nothing yet: the old
/// fixed rule's (the steal prefetch), a tenth of its cpus and one.
fn base_depth(total: &Resources) -> u32 {
    (total.get(CPU).whole() * (STEAL_PREFETCH_PERCENT - 100) / 100) as u32 + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: Millis = 60_000;

    #[test]
    fn queued_work_behind_long_runs_is_late_and_work_that_starts_soon_is_not() {
        // Six one-hour tasks on two cores, two running for ten minutes: the
        // other four wait at least fifty minutes more.
        let running = [(1, 50 * MIN), (1, 50 * MIN)];
        let queued = [(1, 60 * MIN, true); 4];
        assert_eq!(late_units(2, &running, &queued, MIN), 4);
        // Two running tasks that end within the minute: the next two start
        // in time, the two after them an hour later.
        let soon = [(1, 30_000), (1, 30_000)];
        assert_eq!(late_units(2, &soon, &queued, MIN), 2);
        // A free core starts the first at once.
        assert_eq!(late_units(3, &running, &queued, MIN), 3);
        // Thin tasks behind thin tasks are never late.
        assert_eq!(
            late_units(2, &[(1, 100), (1, 100)], &[(1, 100, true); 50], MIN),
            0
        );
    }

    #[test]
    fn a_task_wider_than_the_node_is_not_counted_and_units_are_whole_tasks() {
        // A 4-core task on 2 cores never starts here.
        assert_eq!(late_units(2, &[], &[(4, MIN, true)], MIN), 0);
        // A 2-core task behind a 2-core run of an hour is late, both cores.
        assert_eq!(late_units(2, &[(2, 60 * MIN)], &[(2, MIN, true)], MIN), 2);
        // One no queue's node would live long enough for waits its turn
        // but is not counted.
        let queued = [(1, MIN, false), (1, MIN, true)];
        assert_eq!(late_units(1, &[(1, 60 * MIN)], &queued, MIN), 1);
        // No cores at all: nothing to say.
        assert_eq!(late_units(0, &[], &[(1, MIN, true)], MIN), 0);
    }
}
