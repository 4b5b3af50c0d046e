//! Allocation queues in a mesh: the replicated book of queues, jobs and what happened to them, and the coordinator's loop that feeds [`crate::alloc::Scaler`] and asks the driver to carry out its decisions.
//!
//! The book is small and changes seldom (a submission, a job's new state),
//! so it travels whole: the coordinator numbers each version with its term,
//! keeps it durable, and sends it to every member whose beat shows an older
//! one; a member that holds a newer one than the coordinator's (a new
//! coordinator elected from a stale copy) sends it the other way. A new
//! coordinator waits a death timeout before it decides anything, so it
//! hears the newest book first and never submits twice what its
//! predecessor submitted. What the book cannot know (a job its
//! predecessor submitted and died before booking) the batch system does:
//! every job's name carries the mesh and its queue, and a new coordinator
//! lists this mesh's jobs and adopts those missing from the book before
//! it submits anything.

use std::collections::{BTreeSet, VecDeque};
use std::sync::Arc;

use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};

use crate::alloc::{Backlog, BatchSystem, Decision, Job, JobState, QueueDef, Scaler};
use crate::engine::Millis;

/// The most events the book keeps (the oldest go first).
const LOG_KEPT: usize = 500;
/// Ended jobs kept per queue, for `mesh alloc info`.
const ENDED_KEPT: usize = 50;
/// How often the coordinator looks at its queues, and asks the batch
/// systems where their jobs are.
pub const TICK_MS: Millis = 1_000;
/// How often the coordinator polls the batch systems for its jobs (and,
/// until a system's jobs are listed, lists them again).
pub const POLL_MS: Millis = 5_000;
/// The least time a running job's node has to join before the job is cancelled.
const JOIN_TIMEOUT_S: u64 = 120;

/// An allocation queue as the mesh keeps it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocQueue {
    /// What the queue's jobs ask for and how many it may have.
    pub def: QueueDef,
    /// Why submissions are stopped (`mesh alloc pause`, or failures in a row).
    pub paused: Option<String>,
    /// A queue with a deadline: what its latest plan said.
    pub plan: Option<DeadlinePlan>,
}

/// What a deadline queue's plan said (see `eta::plan`), for
/// `mesh alloc info`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeadlinePlan {
    /// When it was made.
    pub unix_ms: u64,
    /// Jobs beyond those whose nodes are in the mesh; None while no task
    /// has finished to draw runtimes from.
    pub extra: Option<u32>,
    /// Whether that many meet the deadline (if not: as many as `max` lets).
    pub meets: bool,
    /// When the work ends with them, as the plan's p90 says.
    pub end_unix_ms: Option<u64>,
}

/// A job a queue submitted, and what became of it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocJob {
    /// The job as the scaler sees it.
    pub job: Job,
    /// The batch system it was submitted to.
    pub system: BatchSystem,
    /// When it was submitted (or found), by the wall clock.
    pub submitted_unix_ms: u64,
    /// When it was seen to have ended, by the wall clock.
    pub ended_unix_ms: Option<u64>,
    /// A node started by this job joined the mesh, and when that was seen.
    pub joined: bool,
    /// When a node of the job was seen to join, by the wall clock.
    pub joined_unix_ms: Option<u64>,
}

impl AllocJob {
    /// A job just booked: submitted, or found (`unix_ms`: the wall clock at `now`).
    fn new(l: Listed, system: BatchSystem, now: Millis, unix_ms: u64) -> AllocJob {
        AllocJob {
            job: Job {
                id: l.id,
                queue: l.queue,
                state: l.state,
                submitted_at: now,
                idle_since: None,
            },
            system,
            submitted_unix_ms: unix_ms,
            ended_unix_ms: None,
            joined: false,
            joined_unix_ms: None,
        }
    }
}

/// One thing that happened to a queue, for `mesh alloc log`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocEvent {
    /// When it happened, by the coordinator's wall clock.
    pub unix_ms: u64,
    /// Which queue it happened to.
    pub queue: String,
    /// The job it concerns, if one.
    pub job: Option<String>,
    /// What happened, in words.
    pub text: String,
}

/// The mesh's allocation queues: replicated on every node.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocBook {
    /// The coordinator term that wrote it, and its count within that term.
    pub version: (u64, u64),
    /// The queues, in the order they were added.
    pub queues: Vec<AllocQueue>,
    /// Jobs the queues submitted or found: those live, and the last ended
    /// ones of each queue.
    pub jobs: Vec<AllocJob>,
    /// What happened to the queues, oldest first (the last 500).
    pub log: VecDeque<AllocEvent>,
}

impl AllocBook {
    /// The queue of that name, if the book has it.
    pub fn queue(&self, name: &str) -> Option<&AllocQueue> {
        self.queues.iter().find(|q| q.def.name == name)
    }

    /// Jobs that have not ended.
    pub fn live(&self) -> impl Iterator<Item = &AllocJob> {
        self.jobs.iter().filter(|j| j.job.state != JobState::Ended)
    }
}

/// What a user asks of the queues (`mesh alloc ...`), sent to the coordinator.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum AllocCmd {
    /// Adds a queue (`mesh alloc add`); a name the book has already is left
    /// as it is.
    Add(QueueDef),
    /// Cancels the queue's jobs (their nodes hand their tasks back) and forgets it.
    Remove {
        /// The queue's name.
        queue: String,
    },
    /// Stops the queue's submissions until resumed (`mesh alloc pause`).
    Pause {
        /// The queue's name.
        queue: String,
    },
    /// Lets a paused queue submit again, at once (`mesh alloc resume`).
    Resume {
        /// The queue's name.
        queue: String,
    },
}

/// What the coordinator's driver asks the batch system; it answers with
/// [`crate::mesh::Peer::batch_submitted`], `batch_polled` and `batch_cancelled`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BatchOp {
    /// `jobs` jobs of this queue (one array where there are several).
    /// Boxed: every action would pay its size.
    Submit {
        /// The queue: what each job asks for.
        queue: Box<QueueDef>,
        /// How many jobs.
        jobs: u32,
    },
    /// Where these jobs are now; answered with `batch_polled`.
    Poll {
        /// The batch system they were submitted to.
        system: BatchSystem,
        /// Their ids.
        jobs: Vec<String>,
    },
    /// Cancel this job; answered with `batch_cancelled`.
    Cancel {
        /// The batch system it was submitted to.
        system: BatchSystem,
        /// Its id.
        job: String,
    },
    /// Every job of this mesh the batch system knows, whatever the book
    /// says (the driver finds them by name: the mesh's tag and the queue).
    /// `gen` comes back with the answer.
    List {
        /// Which batch system to list.
        system: BatchSystem,
        /// Which coordination asked: an answer to an older one is dropped.
        gen: u64,
    },
}

/// A job of this mesh as the batch system lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listed {
    /// The batch system's job id.
    pub id: String,
    /// Where it is now.
    pub state: JobState,
    /// The queue its name says it was submitted for.
    pub queue: String,
}

impl Listed {
    /// A job as listed: its id, state and queue.
    pub fn new(id: &str, state: JobState, queue: &str) -> Listed {
        Listed {
            id: id.to_string(),
            state,
            queue: queue.to_string(),
        }
    }
}

/// A node's part in allocation: its copy of the book and, on the
/// coordinator, the scaling loop.
#[derive(Debug, Default)]
pub struct Allocs {
    book: Arc<AllocBook>,
    /// The unix time, in ms, at the driver's clock zero (for the log).
    pub wall_base: u64,
    /// Since when this node coordinates (None: it does not).
    since: Option<Millis>,
    scaler: Scaler,
    next_tick: Millis,
    next_poll: Millis,
    polls_out: usize,
    /// Since when each running job's nodes have run nothing.
    idle: FxHashMap<String, Millis>,
    /// Jobs asked to be cancelled (not decided again while they end).
    cancelling: BTreeSet<String>,
    /// The batch systems whose jobs this coordinator has listed (and
    /// adopted); it submits nothing before, and lists those not yet.
    listed: BTreeSet<BatchSystem>,
    lists_out: usize,
    next_list: Millis,
    /// Which coordination asked: an answer to an older one is dropped.
    list_gen: u64,
    /// Jobs named by nodes' beats and missing from the book, listed for once.
    relisted: BTreeSet<String>,
    /// Adopted jobs of queues the book no longer has, to cancel.
    orphans: Vec<(BatchSystem, String)>,
    /// Each deadline queue's latest plan, and when the next is due.
    plans: FxHashMap<String, Option<crate::alloc::Plan>>,
    next_plan: Millis,
}

/// A deadline queue's plan is made again this often: the work left and
/// its runtimes change as the farms run.
pub const PLAN_EVERY_MS: Millis = 10_000;
/// How long a job is taken to wait before its node joins, until one of
/// the queue's jobs has.
const WAIT_GUESS_MS: Millis = 60_000;

/// A deadline queue to plan for: its definition, the jobs whose nodes are
/// in the mesh, how long its jobs waited to join, and the time left.
#[derive(Clone, Debug)]
pub struct ToPlan {
    /// The queue's definition, deadline included.
    pub def: QueueDef,
    /// Its live jobs whose nodes are in the mesh.
    pub joined: u32,
    /// How long its jobs waited from submission to joining (the median; a
    /// guess of a minute until one has joined).
    pub wait_ms: Millis,
    /// The time left until the deadline.
    pub left_ms: Millis,
}

impl Allocs {
    /// This node's copy of the book.
    pub fn book(&self) -> &Arc<AllocBook> {
        &self.book
    }

    /// The version of this node's copy (see [`AllocBook::version`]).
    pub fn version(&self) -> (u64, u64) {
        self.book.version
    }

    /// The book found in the store at startup.
    pub fn restore(&mut self, book: AllocBook) {
        self.book = Arc::new(book);
    }

    /// A book from another node: kept if newer. True when it was.
    pub fn adopt(&mut self, book: Arc<AllocBook>) -> bool {
        if book.version <= self.book.version {
            return false;
        }
        self.book = book;
        self.sync_paused();
        true
    }

    /// This node was elected (or is no longer, with `None`).
    pub fn coordinating(&mut self, since: Option<Millis>) {
        self.since = since;
        self.idle.clear();
        self.cancelling.clear();
        self.polls_out = 0;
        self.listed.clear();
        self.lists_out = 0;
        self.next_list = 0;
        self.list_gen += 1;
        self.relisted.clear();
        self.orphans.clear();
        self.scaler = Scaler::default();
        self.sync_paused();
    }

    /// When the loop next wants a tick (coordinator with queues only).
    pub fn poll_timeout(&self) -> Option<Millis> {
        (self.since.is_some() && !self.book.queues.is_empty()).then_some(self.next_tick)
    }

    fn sync_paused(&mut self) {
        for q in &self.book.queues {
            if q.paused.is_some() {
                self.scaler.pause(&q.def.name);
            } else if self.scaler.is_paused(&q.def.name) {
                self.scaler.resume(&q.def.name);
            }
        }
    }

    /// Changes the book as the coordinator of `term`; the caller persists
    /// and sends the new version.
    fn edit(&mut self, term: u64, f: impl FnOnce(&mut AllocBook)) {
        let b = Arc::make_mut(&mut self.book);
        f(b);
        b.version = if b.version.0 == term {
            (term, b.version.1 + 1)
        } else {
            (term, 1)
        };
        while b.log.len() > LOG_KEPT {
            b.log.pop_front();
        }
    }

    fn event(&self, now: Millis, queue: &str, job: Option<&str>, text: String) -> AllocEvent {
        AllocEvent {
            unix_ms: self.wall_base + now,
            queue: queue.to_string(),
            job: job.map(str::to_string),
            text,
        }
    }

    /// A user's command, on the coordinator. Returns the batch operations
    /// it needs, and whether the book changed.
    pub fn command(&mut self, now: Millis, term: u64, cmd: AllocCmd) -> (Vec<BatchOp>, bool) {
        let mut ops = Vec::new();
        let name = match &cmd {
            AllocCmd::Add(d) => d.name.clone(),
            AllocCmd::Remove { queue } | AllocCmd::Pause { queue } | AllocCmd::Resume { queue } => {
                queue.clone()
            }
        };
        let exists = self.book.queue(&name).is_some();
        let ev = |s: &Self, text: &str| s.event(now, &name, None, text.to_string());
        match cmd {
            AllocCmd::Add(def) => {
                if exists {
                    return (ops, false);
                }
                let e = ev(self, "added");
                self.edit(term, |b| {
                    b.queues.push(AllocQueue {
                        def,
                        paused: None,
                        plan: None,
                    });
                    b.log.push_back(e);
                });
                self.scaler.resume(&name);
            }
            AllocCmd::Remove { .. } => {
                if !exists {
                    return (ops, false);
                }
                for j in self.book.live().filter(|j| j.job.queue == name) {
                    ops.push(BatchOp::Cancel {
                        system: j.system,
                        job: j.job.id.clone(),
                    });
                }
                let e = ev(
                    self,
                    &format!("removed; {} live job(s) cancelled", ops.len()),
                );
                self.edit(term, |b| {
                    b.queues.retain(|q| q.def.name != name);
                    b.jobs.retain(|j| j.job.queue != name);
                    b.log.push_back(e);
                });
            }
            AllocCmd::Pause { .. } => {
                if !exists || self.book.queue(&name).is_some_and(|q| q.paused.is_some()) {
                    return (ops, false);
                }
                let e = ev(self, "paused by the user");
                self.edit(term, |b| {
                    if let Some(q) = b.queues.iter_mut().find(|q| q.def.name == name) {
                        q.paused = Some("paused by the user".into());
                    }
                    b.log.push_back(e);
                });
                self.scaler.pause(&name);
            }
            AllocCmd::Resume { .. } => {
                if self.book.queue(&name).is_none_or(|q| q.paused.is_none()) {
                    return (ops, false);
                }
                let e = ev(self, "resumed");
                self.edit(term, |b| {
                    if let Some(q) = b.queues.iter_mut().find(|q| q.def.name == name) {
                        q.paused = None;
                    }
                    b.log.push_back(e);
                });
                self.scaler.resume(&name);
            }
        }
        (ops, true)
    }

    /// The coordinator's periodic look at its queues. `grace`: how long a
    /// new coordinator listens before deciding; `backlog`: ready work the
    /// nodes there are cannot start; `activity`: each node that a job
    /// started, by job id, and whether it has work.
    pub fn tick(
        &mut self,
        now: Millis,
        term: u64,
        grace: Millis,
        backlog: Backlog,
        activity: &[(String, bool)],
    ) -> (Vec<BatchOp>, bool) {
        let mut ops = Vec::new();
        let Some(since) = self.since else {
            return (ops, false);
        };
        if now < self.next_tick || self.book.queues.is_empty() {
            return (ops, false);
        }
        self.next_tick = now + TICK_MS;
        let mut changed = self.note_activity(now, term, activity);
        if now < since + grace {
            // Nothing is decided, nor changed, before the newest book had
            // time to come: an edit now would outrank it.
            return (ops, changed);
        }

        // What the book may miss: the jobs a predecessor submitted and died
        // before it booked them (listed once a coordination), and, when a
        // node says it was started by a job the book does not have (a
        // deposed coordinator's, after a partition), once more.
        for (job, _) in activity {
            if !self.book.jobs.iter().any(|j| &j.job.id == job) && self.relisted.insert(job.clone())
            {
                self.listed.clear();
            }
        }
        let unlisted: BTreeSet<BatchSystem> = self
            .book
            .queues
            .iter()
            .map(|q| q.def.system)
            .filter(|s| !self.listed.contains(s))
            .collect();
        if !unlisted.is_empty() && self.lists_out == 0 && now >= self.next_list {
            self.next_list = now + POLL_MS;
            for system in &unlisted {
                self.lists_out += 1;
                ops.push(BatchOp::List {
                    system: *system,
                    gen: self.list_gen,
                });
            }
        }

        for (system, job) in std::mem::take(&mut self.orphans) {
            self.cancelling.insert(job.clone());
            ops.push(BatchOp::Cancel { system, job });
        }

        let live: Vec<AllocJob> = self.book.live().cloned().collect();
        if self.polls_out == 0 && now >= self.next_poll && !live.is_empty() {
            self.next_poll = now + POLL_MS;
            for system in [BatchSystem::Slurm, BatchSystem::Pbs] {
                let jobs: Vec<String> = live
                    .iter()
                    .filter(|j| j.system == system)
                    .map(|j| j.job.id.clone())
                    .collect();
                if !jobs.is_empty() {
                    self.polls_out += 1;
                    ops.push(BatchOp::Poll { system, jobs });
                }
            }
        }

        let mut events = Vec::new();
        let (lost, said) = self.cancel_lost(now, &live);
        ops.extend(lost);
        events.extend(said);

        // A queue of a batch system not listed yet decides nothing (its
        // jobs may be there already); the others go on.
        let defs: Vec<QueueDef> = self
            .book
            .queues
            .iter()
            .filter(|q| !unlisted.contains(&q.def.system))
            .map(|q| q.def.clone())
            .collect();
        let jobs: Vec<Job> = live
            .iter()
            .filter(|j| !self.cancelling.contains(&j.job.id))
            .filter(|j| defs.iter().any(|d| d.name == j.job.queue))
            .map(|j| Job {
                idle_since: self.idle.get(&j.job.id).copied(),
                ..j.job.clone()
            })
            .collect();
        // A deadline queue has the jobs its plan asks for beyond those
        // whose nodes are here (none beyond `min` before a plan).
        let targets: Vec<(String, u32)> = defs
            .iter()
            .filter(|d| d.deadline_ms.is_some())
            .map(|d| {
                let extra = self
                    .plans
                    .get(&d.name)
                    .cloned()
                    .flatten()
                    .map_or(0, |p| p.extra);
                (d.name.clone(), self.joined(&d.name) + extra)
            })
            .collect();
        for d in self
            .scaler
            .decide_with(now, &defs, backlog, &jobs, &targets)
        {
            match d {
                Decision::Submit { queue, jobs } => {
                    let Some(q) = self.book.queue(&queue) else {
                        continue;
                    };
                    events.push(self.event(now, &queue, None, format!("submitting {jobs} job(s)")));
                    ops.push(BatchOp::Submit {
                        queue: Box::new(q.def.clone()),
                        jobs,
                    });
                }
                Decision::Cancel { job, why } => {
                    let q = self.job_queue(&job);
                    let system = self
                        .book
                        .queue(&q)
                        .map_or(BatchSystem::Slurm, |q| q.def.system);
                    events.push(self.event(now, &q, Some(&job), format!("cancelling: {why}")));
                    self.cancelling.insert(job.clone());
                    ops.push(BatchOp::Cancel { system, job });
                }
                Decision::Pause { .. } => {}
            }
        }
        if !events.is_empty() {
            self.edit(term, |b| b.log.extend(events));
            changed = true;
        }
        (ops, changed)
    }

    /// Which jobs' nodes are here (`activity`: a node's job, and whether it
    /// has work): those that just joined are booked so, and each running
    /// job's idle time is kept. True when the book changed.
    fn note_activity(&mut self, now: Millis, term: u64, activity: &[(String, bool)]) -> bool {
        let mut changed = false;
        let mut busy: FxHashMap<&str, bool> = FxHashMap::default();
        for (job, b) in activity {
            *busy.entry(job.as_str()).or_default() |= *b;
        }
        let joined: Vec<String> = self
            .book
            .live()
            .filter(|j| !j.joined && busy.contains_key(j.job.id.as_str()))
            .map(|j| j.job.id.clone())
            .collect();
        if !joined.is_empty() {
            let wall = self.wall_base + now;
            let events: Vec<AllocEvent> = joined
                .iter()
                .map(|id| {
                    let q = self.job_queue(id);
                    self.event(now, &q, Some(id), "its node joined the mesh".into())
                })
                .collect();
            self.edit(term, |b| {
                for j in b.jobs.iter_mut().filter(|j| joined.contains(&j.job.id)) {
                    j.joined = true;
                    j.joined_unix_ms = Some(wall);
                    // Its node is up: the job runs, whatever the last poll said.
                    j.job.state = JobState::Running;
                }
                b.log.extend(events);
            });
            changed = true;
        }
        for j in self.book.live() {
            let id = j.job.id.as_str();
            if j.job.state == JobState::Running && !busy.get(id).copied().unwrap_or(false) {
                self.idle.entry(id.to_string()).or_insert(now);
            } else {
                self.idle.remove(id);
            }
        }

        changed
    }

    /// Running jobs whose node never joined (the address it joins is gone,
    /// the node cannot start): they hold an allocation for nothing, work
    /// waiting or not, and are cancelled after the idle timeout (or
    /// `JOIN_TIMEOUT_S`, if longer).
    fn cancel_lost(&mut self, now: Millis, live: &[AllocJob]) -> (Vec<BatchOp>, Vec<AllocEvent>) {
        let (mut ops, mut events) = (Vec::new(), Vec::new());
        let lost: Vec<(String, String, BatchSystem, u64)> = live
            .iter()
            .filter(|j| !j.joined && !self.cancelling.contains(&j.job.id))
            .filter_map(|j| {
                let since = *self.idle.get(&j.job.id)?;
                // At least two minutes: a node starting from a slow shared
                // filesystem takes a while to be heard.
                let timeout = self
                    .book
                    .queue(&j.job.queue)?
                    .def
                    .idle_timeout_s
                    .max(JOIN_TIMEOUT_S);
                (now.saturating_sub(since) >= timeout * 1000)
                    .then(|| (j.job.id.clone(), j.job.queue.clone(), j.system, timeout))
            })
            .collect();
        for (job, queue, system, timeout) in lost {
            events.push(self.event(
                now,
                &queue,
                Some(&job),
                format!("cancelling: running for {timeout} s and its node never joined"),
            ));
            self.cancelling.insert(job.clone());
            ops.push(BatchOp::Cancel { system, job });
        }
        (ops, events)
    }

    /// Live jobs of `queue` whose nodes are in the mesh.
    fn joined(&self, queue: &str) -> u32 {
        self.book
            .live()
            .filter(|j| j.job.queue == queue && j.joined)
            .count() as u32
    }

    /// On the coordinator, when plans are due (every `PLAN_EVERY_MS`): the
    /// deadline queues to plan for.
    pub fn to_plan(&mut self, now: Millis) -> Vec<ToPlan> {
        if self.since.is_none() || now < self.next_plan {
            return Vec::new();
        }
        self.next_plan = now + PLAN_EVERY_MS;
        let wall = self.wall_base + now;
        self.book
            .queues
            .iter()
            .filter_map(|q| {
                let deadline = q.def.deadline_ms?;
                let mut waits: Vec<u64> = self
                    .book
                    .jobs
                    .iter()
                    .filter(|j| j.job.queue == q.def.name)
                    .filter_map(|j| Some(j.joined_unix_ms?.saturating_sub(j.submitted_unix_ms)))
                    .collect();
                waits.sort_unstable();
                Some(ToPlan {
                    def: q.def.clone(),
                    joined: self.joined(&q.def.name),
                    wait_ms: waits.get(waits.len() / 2).copied().unwrap_or(WAIT_GUESS_MS),
                    left_ms: deadline.saturating_sub(wall),
                })
            })
            .collect()
    }

    /// The plans made for [`Allocs::to_plan`]'s queues: kept for the next
    /// decisions, and said in the book (and its log) when what they ask
    /// changes. True when the book changed.
    pub fn planned(
        &mut self,
        now: Millis,
        term: u64,
        plans: Vec<(ToPlan, Option<crate::alloc::Plan>)>,
    ) -> bool {
        let wall = self.wall_base + now;
        let mut said = Vec::new();
        for (q, plan) in plans {
            let name = q.def.name.clone();
            let asks = |p: &Option<crate::alloc::Plan>| p.as_ref().map(|p| (p.extra, p.meets));
            let before = self.plans.get(&name).map(asks);
            if before != Some(asks(&plan)) {
                let text = match &plan {
                    None => "deadline: no task has finished yet to tell how long the work left \
                             takes; no job beyond --min until one has"
                        .to_string(),
                    Some(p) if p.meets => format!(
                        "deadline in {} s: {} job(s) beyond the {} whose nodes are here meet it \
                         (the work ends in about {} s, p90)",
                        q.left_ms / 1000,
                        p.extra,
                        q.joined,
                        p.end_ms / 1000
                    ),
                    Some(p) => format!(
                        "deadline in {} s cannot be met within --max {}: with {} more job(s) \
                         the work ends in about {} s (p90)",
                        q.left_ms / 1000,
                        q.def.max,
                        p.extra,
                        p.end_ms / 1000
                    ),
                };
                said.push(self.event(now, &name, None, text));
            }
            let note = DeadlinePlan {
                unix_ms: wall,
                extra: plan.as_ref().map(|p| p.extra),
                meets: plan.as_ref().is_some_and(|p| p.meets),
                end_unix_ms: plan.as_ref().map(|p| wall + p.end_ms),
            };
            self.plans.insert(name.clone(), plan);
            if self.book.queue(&name).is_some_and(|aq| {
                aq.plan.as_ref().map(|p| (p.extra, p.meets)) != Some((note.extra, note.meets))
            }) {
                let n = name.clone();
                self.edit(term, move |b| {
                    if let Some(aq) = b.queues.iter_mut().find(|aq| aq.def.name == n) {
                        aq.plan = Some(note);
                    }
                });
            }
        }
        let changed = !said.is_empty();
        if changed {
            self.edit(term, |b| b.log.extend(said));
        }
        changed
    }

    /// Notes in the log, once each, the stages (`farm/stage`, expected ms)
    /// whose tasks no job of a queue lives long enough to start: its nodes
    /// drain before such a task would end. True when the book changed.
    pub fn warn_expected(&mut self, now: Millis, term: u64, stages: &[(String, u64)]) -> bool {
        let mut events: Vec<AllocEvent> = Vec::new();
        for q in &self.book.queues {
            let usable = q.def.usable_ms();
            for (stage, expected) in stages.iter().filter(|(_, e)| *e > usable) {
                let text = format!(
                    "stage {stage} expects tasks of up to {} s, more than this queue's nodes have before they drain ({} s): they will not run them",
                    expected / 1000,
                    usable / 1000
                );
                let known = self
                    .book
                    .log
                    .iter()
                    .chain(&events)
                    .any(|e| e.queue == q.def.name && e.text == text);
                if !known {
                    events.push(self.event(now, &q.def.name, None, text));
                }
            }
        }
        if events.is_empty() {
            return false;
        }
        self.edit(term, |b| b.log.extend(events));
        true
    }

    fn job_queue(&self, id: &str) -> String {
        self.book
            .jobs
            .iter()
            .find(|j| j.job.id == id)
            .map_or_else(String::new, |j| j.job.queue.clone())
    }

    /// The batch system's answer to a submission: the job ids, or why not.
    pub fn submitted(
        &mut self,
        now: Millis,
        term: u64,
        queue: &QueueDef,
        result: Result<Vec<String>, String>,
    ) -> bool {
        if self.book.queue(&queue.name).is_none() {
            return false;
        }
        let wall = self.wall_base + now;
        match result {
            Ok(ids) => {
                self.scaler.submitted(now, &queue.name, true);
                let e = self.event(
                    now,
                    &queue.name,
                    None,
                    format!("submitted: {}", ids.join(" ")),
                );
                let system = queue.system;
                let name = queue.name.clone();
                self.edit(term, |b| {
                    for id in ids {
                        // Adopted already (a list answered before this).
                        if b.jobs.iter().any(|j| j.job.id == id) {
                            continue;
                        }
                        b.jobs.push(AllocJob::new(
                            Listed::new(&id, JobState::Queued, &name),
                            system,
                            now,
                            wall,
                        ));
                    }
                    b.log.push_back(e);
                });
            }
            Err(why) => self.failed(
                now,
                term,
                &queue.name,
                None,
                format!("submission failed: {why}"),
            ),
        }
        true
    }

    /// A failure of a queue's (submission, or a job that ended before its
    /// node joined): the queue backs off, and pauses after several in a row.
    fn failed(&mut self, now: Millis, term: u64, queue: &str, job: Option<&str>, text: String) {
        let mut events = vec![self.event(now, queue, job, text)];
        let pause = self.scaler.submitted(now, queue, false);
        let why = match pause {
            Some(Decision::Pause { why, .. }) => {
                events.push(self.event(now, queue, None, format!("paused: {why}")));
                Some(why)
            }
            _ => None,
        };
        self.edit(term, |b| {
            if let Some(why) = why {
                if let Some(q) = b.queues.iter_mut().find(|q| q.def.name == queue) {
                    q.paused = Some(why);
                }
            }
            b.log.extend(events);
        });
    }

    /// Where the batch system says its jobs are. A job it no longer lists
    /// has ended.
    pub fn polled(
        &mut self,
        now: Millis,
        term: u64,
        system: BatchSystem,
        result: Result<Vec<(String, JobState)>, String>,
    ) -> bool {
        self.polls_out = self.polls_out.saturating_sub(1);
        let states = match result {
            Ok(s) => s,
            Err(why) => {
                return self.batch_error(now, term, format!("cannot ask the batch system: {why}"))
            }
        };
        let states: FxHashMap<&str, JobState> =
            states.iter().map(|(id, s)| (id.as_str(), *s)).collect();
        let changes: Vec<(String, String, JobState, bool)> = self
            .book
            .live()
            .filter(|j| j.system == system)
            .filter_map(|j| {
                let s = states
                    .get(j.job.id.as_str())
                    .copied()
                    .unwrap_or(JobState::Ended);
                (s != j.job.state).then(|| (j.job.id.clone(), j.job.queue.clone(), s, j.joined))
            })
            .collect();
        if changes.is_empty() {
            return false;
        }
        let wall = self.wall_base + now;
        let mut events = Vec::new();
        let mut never_joined = Vec::new();
        for (id, queue, s, joined) in &changes {
            let text = match s {
                JobState::Queued => "queued".to_string(),
                JobState::Running => "running".to_string(),
                JobState::Ended if *joined => "ended".to_string(),
                JobState::Ended => {
                    never_joined.push((queue.clone(), id.clone()));
                    continue;
                }
            };
            events.push(self.event(now, queue, Some(id), text));
            if *s == JobState::Ended {
                self.cancelling.remove(id);
                self.idle.remove(id);
            }
        }
        self.edit(term, |b| {
            for (id, _, s, _) in &changes {
                if let Some(j) = b.jobs.iter_mut().find(|j| &j.job.id == id) {
                    j.job.state = *s;
                    if *s == JobState::Ended {
                        j.ended_unix_ms = Some(wall);
                    }
                }
            }
            b.log.extend(events);
            trim_ended(b);
        });
        for (queue, id) in never_joined {
            let cancelled = self.cancelling.remove(&id);
            self.idle.remove(&id);
            if cancelled {
                let e = self.event(now, &queue, Some(&id), "ended (cancelled)".into());
                self.edit(term, |b| b.log.push_back(e));
            } else {
                self.failed(
                    now,
                    term,
                    &queue,
                    Some(&id),
                    "ended before its node joined the mesh (see the job's output)".into(),
                );
            }
        }
        true
    }

    /// A batch command that failed, in the log once however often it
    /// fails the same way (it is asked again every poll). True when the
    /// book changed.
    fn batch_error(&mut self, now: Millis, term: u64, text: String) -> bool {
        if self.book.log.back().is_some_and(|e| e.text == text) {
            return false;
        }
        let e = self.event(now, "", None, text);
        self.edit(term, |b| b.log.push_back(e));
        true
    }

    /// This mesh's jobs, as the batch system lists them: those the book
    /// does not have are adopted (a job of a queue removed since is
    /// cancelled at the next tick). True when the book changed.
    pub fn listed(
        &mut self,
        now: Millis,
        term: u64,
        system: BatchSystem,
        gen: u64,
        result: Result<Vec<Listed>, String>,
    ) -> bool {
        if gen != self.list_gen || self.since.is_none() {
            // Asked by an earlier coordination of this node's.
            return false;
        }
        self.lists_out = self.lists_out.saturating_sub(1);
        let jobs = match result {
            Ok(j) => j,
            Err(why) => {
                // Asked again a poll later; this system's queues decide nothing meanwhile.
                return self.batch_error(
                    now,
                    term,
                    format!("cannot list this mesh's jobs (its queues submit nothing until it can): {why}"),
                );
            }
        };
        self.listed.insert(system);
        let wall = self.wall_base + now;
        let mut adopted = Vec::new();
        let mut events = Vec::new();
        for l in jobs {
            if l.state == JobState::Ended || self.book.jobs.iter().any(|j| j.job.id == l.id) {
                continue;
            }
            if self.book.queue(&l.queue).is_none() {
                events.push(self.event(
                    now,
                    &l.queue,
                    Some(&l.id),
                    "found, of a queue this mesh no longer has: cancelling".into(),
                ));
                self.orphans.push((system, l.id));
                continue;
            }
            events.push(
                self.event(
                    now,
                    &l.queue,
                    Some(&l.id),
                    "adopted: submitted before this coordinator was elected, and not in the book"
                        .into(),
                ),
            );
            adopted.push(AllocJob::new(l, system, now, wall));
        }
        if events.is_empty() {
            return false;
        }
        self.edit(term, |b| {
            b.jobs.extend(adopted);
            b.log.extend(events);
        });
        true
    }

    /// The answer to a cancellation.
    pub fn cancelled(
        &mut self,
        now: Millis,
        term: u64,
        job: &str,
        result: Result<(), String>,
    ) -> bool {
        let q = self.job_queue(job);
        let text = match result {
            Ok(()) => "cancelled".to_string(),
            Err(why) => {
                self.cancelling.remove(job);
                format!("cannot cancel: {why}")
            }
        };
        let e = self.event(now, &q, Some(job), text);
        self.edit(term, |b| b.log.push_back(e));
        true
    }
}

/// Drops the oldest ended jobs of each queue beyond [`ENDED_KEPT`].
fn trim_ended(b: &mut AllocBook) {
    let mut ended: FxHashMap<String, usize> = FxHashMap::default();
    for j in &b.jobs {
        if j.job.state == JobState::Ended {
            *ended.entry(j.job.queue.clone()).or_default() += 1;
        }
    }
    b.jobs.retain(|j| {
        if j.job.state != JobState::Ended {
            return true;
        }
        let n = ended.get_mut(&j.job.queue).expect("counted");
        if *n > ENDED_KEPT {
            *n -= 1;
            false
        } else {
            true
        }
    });
}

#[cfg(test)]
mod tests;
