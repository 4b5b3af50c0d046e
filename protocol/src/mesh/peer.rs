//! One node of the mesh as a sans-IO state machine: membership, election, the coordinator's placement and the worker's queue.
//!
//! Every node runs a [`Peer`]. It gossips a [`Beat`] (its resources, load
//! and whom it follows), notices dead members when their beats stop, and
//! agrees on a coordinator with terms. The coordinator holds each farm's
//! [`Engine`] (in remote mode), so scheduling decisions stay in one place:
//! it claims ready tasks for nodes with room (about 1.1x their capacity, so a
//! node always has its next task queued), re-queues the tasks of dead nodes
//! without spending their retries, and reports progress to the submitter.
//! Workers start what they are given in order, enforce timeouts, report
//! results until acknowledged, and steal unstarted tasks from overloaded
//! peers when they run dry.
//!
//! Like the engine it does no I/O and reads no clock: the driver feeds it
//! messages, finished tasks and the time, and carries out its [`Action`]s in
//! order, making every `Persist` durable before any later action.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, VecDeque};
use std::sync::Arc;

use indexmap::IndexMap;
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use rustc_hash::{FxHashMap, FxHashSet};

use super::allocs::{AllocBook, AllocCmd, Allocs, BatchOp};
use super::msg::*;
use super::replica::{entry_record, FarmLog, Replica, StoredFarm};
use crate::alloc::{fits_before_walltime, Backlog, BatchSystem, JobState, QueueDef};
use crate::engine::{
    self, AddOptions, Engine, FarmSlot, KillReason, Millis, Outcome, TaskRecord, TaskResult,
    Verdict,
};
use crate::farm::TaskRef;
use crate::pool::{Grant, Pool};
use crate::resources::{Amount, Resources, CPU, GPU};
use crate::tally::Tally;
use crate::wire::PROTOCOL_VERSION;

use super::pace::Pace;
use crate::observe::{Latencies, Latency};

/// Knobs of the mesh protocol; the defaults suit a LAN.
#[derive(Clone, Debug)]
pub struct Config {
    /// How often a node gossips its beat.
    pub heartbeat_ms: u64,
    /// A member silent this long is dead: its tasks run elsewhere.
    pub dead_after_ms: u64,
    /// A node that joins an existing mesh waits this long to hear the
    /// coordinator before it may elect itself.
    pub join_wait_ms: u64,
    /// Take unstarted tasks from overloaded peers when this node runs dry.
    pub steal: bool,
    /// `None` (the default): each node asks for as many queued tasks as
    /// cover a round trip to the coordinator at the rate it runs them (see
    /// the `pace` module). `Some(p)`: the fixed rule instead, a node is
    /// handed tasks until its claimed resources reach `p`% of its capacity
    /// (and always one task beyond a full node).
    pub prefetch_percent: Option<u64>,
    /// Most tasks one node may hold claimed (queued or running) at once;
    /// `None`: twice its cpus plus two. Raised together with
    /// `prefetch_percent`, it places work badly on purpose (the simulator's
    /// skew scenarios: everything on the first node, the rest must steal).
    pub node_claims_max: Option<usize>,
    /// Most tasks in one assignment, report or steal.
    pub batch_max: usize,
    /// Most tasks a node queues (not yet started) at once.
    pub queue_max: usize,
    /// Unacknowledged reports, submissions and replications are sent again this often.
    pub resend_ms: u64,
    /// The coordinator tells submitters about progress this often.
    pub progress_ms: u64,
    /// A steal with no answer after this long is given up.
    pub steal_timeout_ms: u64,
    /// A farm's state (definition, done set, where outputs are) is durable
    /// on this many nodes before anything about it is acknowledged (fewer
    /// only while the mesh has fewer nodes).
    pub replicas: usize,
    /// The home waits this long for a node that keeps outputs it misses to
    /// come back; then those tasks run again elsewhere.
    pub outputs_wait_ms: u64,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            heartbeat_ms: 250,
            dead_after_ms: 2000,
            join_wait_ms: 1500,
            steal: true,
            prefetch_percent: None,
            node_claims_max: None,
            batch_max: 256,
            queue_max: 4096,
            resend_ms: 1000,
            progress_ms: 200,
            steal_timeout_ms: 1000,
            replicas: 2,
            outputs_wait_ms: 30_000,
        }
    }
}

/// What the driver must make durable before acting on anything after it.
#[derive(Clone, Debug, PartialEq)]
pub enum Persist {
    /// A farm this node coordinates, keeps a copy of, or submitted.
    Farm(Arc<FarmSpec>),
    /// The coordinator's record of one task.
    Task {
        farm: FarmId,
        task: TaskRef,
        record: TaskRecord,
    },
    /// Entries of a farm this node holds. With `records`, each also as the
    /// task's record (a copy from elsewhere); without, the coordinator's
    /// own records already say it, and only where outputs are and why a
    /// task failed is kept beside them.
    Entries {
        farm: FarmId,
        entries: Vec<Entry>,
        records: bool,
    },
    /// On the home (by this claim): these tasks' outputs are here, verified.
    Collected {
        farm: FarmId,
        home: Home,
        tasks: Vec<TaskRef>,
    },
    /// The farm's home as this node knows it, and where this node puts the
    /// outputs when that is itself after a takeover.
    Home {
        farm: FarmId,
        home: Home,
        out: Option<String>,
    },
    /// The farm is over for this holder, with its final counts.
    Finished {
        farm: FarmId,
        counts: engine::Counts,
        stages: Vec<engine::Counts>,
    },
    /// Results this node reported and the coordinator has not yet
    /// acknowledged as replicated: those added or changed (`reports`), and
    /// those acknowledged since the last (`gone`).
    Held {
        reports: Vec<Report>,
        gone: Vec<(FarmId, TaskRef)>,
    },
    /// The mesh's allocation queues, as this node last heard of them.
    Allocs(Arc<AllocBook>),
}

/// What happened that the driver may want to show.
#[derive(Clone, Debug, PartialEq)]
pub enum PeerEvent {
    MemberUp(NodeId),
    MemberDown(NodeId),
    Coordinator {
        term: u64,
        node: NodeId,
    },
    Accepted {
        farm: FarmId,
        tasks: u64,
    },
    Refused {
        farm: FarmId,
        reason: String,
    },
    Progress(FarmProgress),
    Failure(Failure),
    Unplaceable {
        farm: FarmId,
        stage: u32,
        reason: String,
    },
    /// This node was silent this long (stopped, or starved of CPU) and gave
    /// back what it had queued.
    Silent {
        ms: u64,
        released: usize,
    },
}

#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    Send {
        to: NodeId,
        msg: Msg,
    },
    /// Gossip to every member.
    Broadcast(Msg),
    Persist(Persist),
    Start {
        task: Assigned,
        grant: Grant,
    },
    Kill {
        task: Assigned,
        reason: KillReason,
    },
    /// On the home: bring these outputs of a finished task from the node
    /// that keeps them, verify them, and call [`Peer::fetched`].
    Fetch {
        farm: FarmId,
        task: TaskRef,
        from: NodeId,
        outputs: Arc<[OutputFile]>,
    },
    /// Every output of this farm is home: what this node kept of it may go.
    Forget {
        farm: FarmId,
    },
    /// Bring every input of this farm here (from its submitter or any
    /// node that has them) and call [`Peer::inputs_ready`].
    FetchInputs {
        farm: FarmId,
    },
    /// On the coordinator: ask the batch system (`mesh alloc`), and answer
    /// with [`Peer::batch_submitted`], `batch_polled` or `batch_cancelled`.
    Batch(BatchOp),
    Emit(PeerEvent),
}

/// How a home's fetch of a task's outputs ([`Action::Fetch`]) ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fetched {
    /// Every output is here, verified.
    Here,
    /// Not now (the node did not answer): asked again later.
    Later,
    /// The node answered that it does not have them.
    Gone,
}

/// Counters for the simulator and `mesh status`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub messages: u64,
    pub steals_asked: u64,
    pub steals_won: u64,
    pub tasks_stolen: u64,
    pub tasks_given: u64,
}

/// A member as this node last heard of it.
#[derive(Clone, Debug)]
pub struct Member {
    pub id: NodeId,
    pub beat: Arc<Beat>,
    pub last_seen: Millis,
}

/// What a peer measures for its observers.
#[derive(Default)]
struct Observed {
    latency: Latencies,
    /// When each queued task arrived here, and when each run started
    /// (until its result is acknowledged).
    arrived: FxHashMap<(FarmId, TaskRef), Millis>,
    started: FxHashMap<(FarmId, TaskRef), Millis>,
    failovers: u64,
}

/// Most runs whose start a peer remembers for [`Latency::StartToDone`].
const STARTED_KEPT: usize = 1 << 17;

struct Run {
    attempt: u32,
    grant: Grant,
    killed: Option<KillReason>,
}

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
}

struct CoordFarm {
    slot: FarmSlot,
    /// When this coordinator took the farm.
    since: Millis,
    spec: Arc<FarmSpec>,
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
    /// Stages that fit no node, and why (those that fit again are dropped
    /// when sent).
    unplaceable: Vec<(u32, String)>,
    /// Runs that completed a task already done by another run (each
    /// counted once, however often it is offered again).
    duplicates: u64,
    extra_runs: FxHashSet<TaskRun>,
    finished_sent: bool,
}

/// The coordinator's state: only the elected node has one.
struct Coord {
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
    /// Each node's prefetch depth, as it last said (reports and beats).
    depth: FxHashMap<NodeId, u32>,
    /// The clock of each node's report handled in this step, echoed back
    /// with the assignment that answers it.
    echo: FxHashMap<NodeId, Millis>,
    /// The node whose report the engine is handling, to name it in
    /// failures, and the outputs it reported.
    reporter: Option<NodeId>,
    outputs: Arc<[OutputFile]>,
    /// The record the engine just wrote for a task, for the entry that follows.
    last_key: Option<[u8; 32]>,
    /// Tells holders apart this coordinator's log from any other's (a
    /// restarted coordinator's log restarts at 0), and numbers its syncs.
    log_id: u64,
    sync_seq: u64,
    next_progress: Millis,
}

pub struct Peer {
    id: NodeId,
    label: String,
    addrs: Vec<String>,
    cfg: Config,
    rng: SmallRng,
    started_at: Millis,
    joining: bool,
    members: BTreeMap<NodeId, Member>,
    term: u64,
    coordinator: Option<NodeId>,
    coord: Option<Coord>,
    pool: Pool,
    queue: VecDeque<Assigned>,
    running: FxHashMap<(FarmId, TaskRef), Run>,
    /// What the grants of `running` hold, counted as tasks start and end:
    /// held against the pool after every step that changed either.
    lent: Resources,
    /// The pool or `running` changed since the last per-step check: only
    /// then can what is free and what runs disagree.
    pool_changed: bool,
    timers: BinaryHeap<Reverse<(Millis, FarmId, TaskRef, u32)>>,
    specs: FxHashMap<FarmId, Arc<FarmSpec>>,
    awaiting_spec: FxHashMap<FarmId, Vec<Assigned>>,
    unacked: BTreeMap<(FarmId, TaskRef), Report>,
    /// Entries of `unacked` changed since they were last persisted.
    held_dirty: BTreeSet<(FarmId, TaskRef)>,
    /// Reports of this step, sent as one message at its end.
    reports_out: Vec<Report>,
    /// Durations and round trips measured here, and the prefetch depth
    /// they give (see the `pace` module).
    pace: Pace,
    depth: u32,
    /// Farms this node holds a copy of (it submitted them, or keeps them
    /// for the mesh).
    replicas: BTreeMap<FarmId, Replica>,
    /// Farms kept on this node's store, to coordinate if it is elected.
    stored: Vec<StoredFarm>,
    /// Members declared dead, and since when (the home waits for those
    /// that keep its outputs).
    gone: FxHashMap<NodeId, Millis>,
    /// Farms whose inputs this node is bringing before its copy counts.
    inputs_wanted: BTreeSet<FarmId>,
    steal: Option<(u64, NodeId, Millis)>,
    next_steal_id: u64,
    /// Members with tasks queued, as far as this node knows (their last
    /// beat, or none once a steal there came back empty): the steal victims.
    loaded: IndexMap<NodeId, u32>,
    /// Members joined or died since the coordinator's engine last saw the machines.
    machines_dirty: bool,
    /// The members of `loaded` with more queued than a node of their size
    /// keeps as its prefetch: a thief with no free slot steals only there.
    overloaded: IndexMap<NodeId, u32>,
    /// The queue length this node last gossiped.
    advertised: u32,
    next_beat: Millis,
    /// No member can have been silent too long before this: the oldest
    /// `last_seen` at the last scan plus the limit (a beat only moves a
    /// `last_seen` later), so most heartbeats skip the scan of every member.
    quiet_until: Millis,
    next_resend: Millis,
    inbox: VecDeque<(NodeId, Msg)>,
    actions: VecDeque<Action>,
    stats: Stats,
    /// Latencies, when the driver asks for them (`Peer::observe`): the
    /// simulator's thousand peers do without.
    observed: Option<Box<Observed>>,
    interrupted: bool,
    /// Allocation queues: this node's copy, and the coordinator's loop.
    allocs: Allocs,
    /// The batch job that started this node, and when it drains before
    /// its walltime (on this peer's clock).
    job: Option<String>,
    deadline: Option<Millis>,
    /// The time of the latest input (for beats, which take none).
    clock: Millis,
}

impl Peer {
    /// A node with these resources. `joining`: it was pointed at an existing
    /// mesh, so it waits to hear a coordinator before electing itself.
    pub fn new(
        now: Millis,
        id: NodeId,
        total: Resources,
        cfg: Config,
        seed: u64,
        joining: bool,
    ) -> Peer {
        let depth = base_depth(&total);
        Peer {
            id,
            label: String::new(),
            addrs: Vec::new(),
            rng: SmallRng::seed_from_u64(seed ^ id.0),
            started_at: now,
            joining,
            members: BTreeMap::new(),
            term: 0,
            coordinator: None,
            coord: None,
            pool: Pool::new(total),
            queue: VecDeque::new(),
            running: FxHashMap::default(),
            lent: Resources::new(),
            pool_changed: true,
            timers: BinaryHeap::new(),
            specs: FxHashMap::default(),
            awaiting_spec: FxHashMap::default(),
            unacked: BTreeMap::new(),
            held_dirty: BTreeSet::new(),
            reports_out: Vec::new(),
            pace: Pace::default(),
            depth,
            replicas: BTreeMap::new(),
            stored: Vec::new(),
            gone: FxHashMap::default(),
            inputs_wanted: BTreeSet::new(),
            steal: None,
            next_steal_id: 1,
            loaded: IndexMap::new(),
            overloaded: IndexMap::new(),
            machines_dirty: false,
            advertised: 0,
            next_beat: now,
            quiet_until: 0,
            next_resend: now + cfg.resend_ms,
            inbox: VecDeque::new(),
            actions: VecDeque::new(),
            stats: Stats::default(),
            observed: None,
            interrupted: false,
            allocs: Allocs::default(),
            job: None,
            deadline: None,
            clock: now,
            cfg,
        }
    }

    // ----- what the driver and status pages read -----

    /// How this node is known on the network, gossiped in its beats.
    pub fn set_address(&mut self, label: String, addrs: Vec<String>) {
        self.label = label;
        self.addrs = addrs;
    }

    pub fn id(&self) -> NodeId {
        self.id
    }

    pub fn term(&self) -> u64 {
        self.term
    }

    pub fn coordinator(&self) -> Option<NodeId> {
        self.coordinator
    }

    pub fn is_coordinator(&self) -> bool {
        self.coord.is_some()
    }

    pub fn members(&self) -> impl Iterator<Item = &Member> {
        self.members.values()
    }

    /// This node's own beat, as it would gossip it now.
    pub fn beat(&self) -> Beat {
        Beat {
            version: PROTOCOL_VERSION,
            label: self.label.clone(),
            addrs: self.addrs.clone(),
            term: self.term,
            coordinator: self.coordinator,
            total: self.pool.total().clone(),
            used: self.pool.used(),
            queued: self.queue.len() as u32,
            running: self.running.len() as u32,
            backlog: self.coord.as_ref().map_or(0, |c| c.engine.backlog()),
            prefetch: self.depth,
            job: self.job.clone(),
            ends_in_ms: self.deadline.map(|d| d.saturating_sub(self.clock)),
            allocs: self.allocs.version(),
        }
    }

    /// How many tasks this node wants queued beyond those it runs now.
    pub fn prefetch_depth(&self) -> u32 {
        self.depth
    }

    pub fn spec(&self, farm: FarmId) -> Option<&Arc<FarmSpec>> {
        self.specs.get(&farm)
    }

    /// The progress of a farm this node holds, as it would show it.
    pub fn progress(&self, farm: FarmId) -> Option<FarmProgress> {
        self.replicas.get(&farm).map(|r| r.progress())
    }

    /// A farm this node holds a copy of.
    pub fn replica(&self, farm: FarmId) -> Option<&Replica> {
        self.replicas.get(&farm)
    }

    /// Every farm this node holds a copy of.
    pub fn replicas(&self) -> impl Iterator<Item = &Replica> {
        self.replicas.values()
    }

    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Starts measuring latencies (see [`Latency`]).
    pub fn observe(&mut self) {
        self.observed.get_or_insert_with(Box::default);
    }

    /// The latencies measured since `observe`, and the coordinator
    /// changes seen.
    pub fn latencies(&self) -> Option<(&Latencies, u64)> {
        self.observed.as_deref().map(|o| (&o.latency, o.failovers))
    }

    /// Records a latency measured by the driver (a message's round trip).
    pub fn record_latency(&mut self, kind: Latency, micros: u64) {
        if let Some(o) = &mut self.observed {
            o.latency.record(kind, micros);
        }
    }

    // ----- allocation queues (`mesh alloc`) -----

    /// The allocation queues and their jobs, as this node last heard.
    pub fn alloc_book(&self) -> &Arc<AllocBook> {
        self.allocs.book()
    }

    /// The book kept in this node's store, at startup.
    pub fn restore_allocs(&mut self, book: AllocBook) {
        self.allocs.restore(book);
        self.machines_changed();
    }

    /// The unix time, in ms, at this peer's clock zero: the times of the
    /// allocation log (the peer reads no clock).
    pub fn set_wall_base(&mut self, unix_ms: u64) {
        self.allocs.wall_base = unix_ms;
    }

    /// This node runs in batch job `job` (`mesh join --alloc-job`), and
    /// drains at `deadline` (its walltime less a margin): it starts only
    /// tasks expected to end before then, and the coordinator hands it no
    /// others.
    pub fn set_batch_job(&mut self, job: Option<String>, deadline: Option<Millis>) {
        self.job = job;
        self.deadline = deadline;
    }

    /// A user's change to the allocation queues, sent to the coordinator.
    pub fn alloc_command(&mut self, now: Millis, cmd: AllocCmd) {
        self.woke(now);
        self.send_coordinator(|_| Msg::Alloc(Box::new(cmd)));
        self.pump(now);
    }

    /// The batch system's answer to [`BatchOp::Submit`]: the job ids.
    pub fn batch_submitted(
        &mut self,
        now: Millis,
        queue: &QueueDef,
        result: Result<Vec<String>, String>,
    ) {
        self.woke(now);
        if self.coord.is_some() && self.allocs.submitted(now, self.term, queue, result) {
            self.allocs_changed();
        }
        self.pump(now);
    }

    /// The batch system's answer to [`BatchOp::Poll`]: the state of each
    /// job it still lists.
    pub fn batch_polled(
        &mut self,
        now: Millis,
        system: BatchSystem,
        result: Result<Vec<(String, JobState)>, String>,
    ) {
        self.woke(now);
        if self.coord.is_some() && self.allocs.polled(now, self.term, system, result) {
            self.allocs_changed();
        }
        self.pump(now);
    }

    /// The batch system's answer to [`BatchOp::Cancel`].
    pub fn batch_cancelled(&mut self, now: Millis, job: &str, result: Result<(), String>) {
        self.woke(now);
        if self.coord.is_some() && self.allocs.cancelled(now, self.term, job, result) {
            self.allocs_changed();
        }
        self.pump(now);
    }

    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    pub fn running_count(&self) -> usize {
        self.running.len()
    }

    /// True when nothing runs here and nothing waits to be reported.
    pub fn idle(&self) -> bool {
        self.running.is_empty() && self.queue.is_empty() && self.unacked.is_empty()
    }

    #[must_use]
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    pub fn has_actions(&self) -> bool {
        !self.actions.is_empty()
    }

    /// When the peer next needs [`Peer::handle_timeout`].
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Millis> {
        let mut at = self.next_beat.min(self.next_resend);
        if let Some(Reverse((t, ..))) = self.timers.peek() {
            at = at.min(*t);
        }
        if let Some((_, _, t)) = self.steal {
            at = at.min(t + self.cfg.steal_timeout_ms);
        }
        if let Some(c) = &self.coord {
            if c.farms.values().any(|f| !f.finished_sent) {
                at = at.min(c.next_progress);
            }
            if let Some(t) = self.allocs.poll_timeout() {
                at = at.min(t);
            }
        }
        Some(at)
    }

    // ----- inputs -----

    /// A farm found in this node's store at startup: held again (and
    /// offered to the coordinator until it is over), and coordinated here
    /// if this node is elected. `finished`: it was over here, with these counts.
    pub fn restore_farm(
        &mut self,
        stored: StoredFarm,
        finished: Option<(engine::Counts, Vec<engine::Counts>)>,
    ) {
        let spec = stored.spec.clone();
        self.specs.insert(spec.id, spec.clone());
        let mut r = Replica::new(spec.clone(), self.id);
        if let Some((home, out)) = &stored.home {
            r.home_of = *home;
            r.home = home.node == self.id;
            r.out = out.clone();
        }
        r.collected.extend(stored.collected.iter().copied());
        for e in &stored.entries {
            r.add(e.clone());
        }
        if let Some((counts, stages)) = finished {
            r.counts = counts;
            r.stages = stages;
            r.over = true;
            r.announced = true;
            r.accepted = true;
        }
        self.replicas.insert(spec.id, r);
        self.stored.push(stored);
    }

    /// Results this node reported before it stopped and that were not
    /// acknowledged: kept, and reported again.
    pub fn restore_held(&mut self, reports: Vec<Report>) {
        for r in reports {
            self.unacked.insert((r.task.farm, r.task.task), r);
        }
    }

    /// A farm submitted on this node, which becomes its home.
    pub fn submit(&mut self, now: Millis, spec: FarmSpec) {
        let spec = Arc::new(spec);
        self.specs.insert(spec.id, spec.clone());
        self.actions
            .push_back(Action::Persist(Persist::Farm(spec.clone())));
        let r = Replica::new(spec.clone(), self.id);
        let home = r.home_of;
        self.replicas.insert(spec.id, r);
        self.send_coordinator(|_| Msg::Submit {
            farm: spec,
            entries: Vec::new(),
            home,
        });
        self.pump(now);
    }

    /// This node becomes the farm's home (its old home is gone, or the
    /// user wants the outputs elsewhere): every output is brought to
    /// `out`, and the farm is offered to the coordinator with the new claim.
    pub fn take_home(&mut self, now: Millis, spec: Arc<FarmSpec>, out: String) {
        let id = spec.id;
        if !self.replicas.contains_key(&id) {
            self.specs.insert(id, spec.clone());
            self.actions
                .push_back(Action::Persist(Persist::Farm(spec.clone())));
            self.replicas.insert(id, Replica::new(spec, self.id));
        }
        let me = self.id;
        let r = self.replicas.get_mut(&id).expect("inserted above");
        r.home_of = Home {
            epoch: r.home_of.epoch + 1,
            node: me,
        };
        r.home = true;
        r.out = Some(out);
        r.collected.clear();
        r.clear_fetches();
        r.recount();
        r.announced = false;
        r.accepted = false;
        self.actions.push_back(Action::Persist(Persist::Home {
            farm: id,
            home: r.home_of,
            out: r.out.clone(),
        }));
        self.resend(now);
        self.home_progress(id);
        self.pump(now);
    }

    /// On the home: the outputs of `task` asked for by [`Action::Fetch`]
    /// are here and verified, or could not be brought (tried again later).
    pub fn fetched(&mut self, now: Millis, farm: FarmId, task: TaskRef, got: Fetched) {
        let Some(r) = self.replicas.get_mut(&farm) else {
            return;
        };
        if r.fetching.remove(&task).is_none() && got != Fetched::Here {
            return;
        }
        match got {
            Fetched::Here => {
                if r.collect(task) {
                    self.actions.push_back(Action::Persist(Persist::Collected {
                        farm,
                        home: r.home_of,
                        tasks: vec![task],
                    }));
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
                    self.lost_outputs(farm, tasks);
                }
            }
        }
        self.fetch_missing(now, farm);
        self.home_progress(farm);
        self.pump(now);
    }

    /// Asks the coordinator to stop a farm.
    pub fn cancel(&mut self, now: Millis, farm: FarmId) {
        self.send_coordinator(|_| Msg::Cancel { farm });
        self.pump(now);
    }

    /// Stops this node's tasks (Ctrl-C): running ones are killed, queued ones given back.
    pub fn interrupt(&mut self, now: Millis) {
        self.interrupted = true;
        let queued: Vec<Assigned> = self.queue.drain(..).collect();
        if !queued.is_empty() {
            self.send_coordinator(|term| Msg::Release {
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
            self.actions.push_back(Action::Kill {
                task,
                reason: KillReason::Interrupt,
            });
        }
        self.pump(now);
    }

    pub fn handle_message(&mut self, now: Millis, from: NodeId, msg: Msg) {
        self.woke(now);
        self.inbox.push_back((from, msg));
        self.pump(now);
    }

    /// A task this node started is over (its process exited, or it never
    /// started). `outputs`: what a successful attempt left, kept here until
    /// the farm's home has it.
    pub fn task_finished(
        &mut self,
        now: Millis,
        task: Assigned,
        outcome: Outcome,
        outputs: Vec<OutputFile>,
    ) {
        self.tasks_finished(now, vec![(task, outcome, outputs)]);
    }

    /// Tasks that ended at about the same time, as one step: their results
    /// go to the coordinator as one report, and its answer is one assignment.
    pub fn tasks_finished(
        &mut self,
        now: Millis,
        ended: Vec<(Assigned, Outcome, Vec<OutputFile>)>,
    ) {
        self.woke(now);
        for (task, outcome, outputs) in ended {
            self.finish_one(now, task, outcome, outputs);
        }
        self.start_queued(now);
        // Running dry: steal now rather than at the next beat.
        self.try_steal(now);
        self.pump(now);
    }

    fn finish_one(
        &mut self,
        now: Millis,
        task: Assigned,
        outcome: Outcome,
        outputs: Vec<OutputFile>,
    ) {
        let key = (task.farm, task.task);
        match self.running.get(&key) {
            Some(r) if r.attempt == task.attempt => {}
            _ => return,
        }
        let run = self.running.remove(&key).expect("checked above");
        self.pool.release(&run.grant);
        self.lent.take_saturating(&run.grant.resources);
        self.pool_changed = true;
        if let Some(spec) = self.specs.get(&task.farm) {
            let stage = task.task.stage;
            let slots = engine::copies(
                self.pool.total(),
                &spec.def.stages[stage as usize].resources,
            );
            self.pace
                .finished(now, task.farm, stage, slots, outcome.duration_ms);
            self.update_depth(now);
        }
        if run.killed == Some(KillReason::Interrupt) {
            // Stopped on purpose, not failed: it goes back to the queue,
            // and no retry is spent on it.
            self.send_coordinator(|term| Msg::Release {
                term,
                tasks: vec![task],
            });
            return;
        }
        let result = match run.killed {
            Some(KillReason::Timeout) => TaskResult::TimedOut,
            _ => outcome.result,
        };
        let ok = matches!(result, TaskResult::Exited(c) if self.specs.get(&task.farm)
            .is_some_and(|s| s.def.stages[task.task.stage as usize].success_codes.contains(&c)));
        let report = Report {
            task,
            result,
            key: outcome.key,
            duration_ms: outcome.duration_ms,
            outputs,
        };
        if ok {
            // Other attempts of this task queued here meanwhile are done by this run.
            let (same, rest): (Vec<Assigned>, Vec<Assigned>) = self
                .queue
                .drain(..)
                .partition(|a| a.farm == task.farm && a.task == task.task);
            self.queue = rest.into();
            for a in same {
                self.report(Report {
                    task: a,
                    ..report.clone()
                });
            }
        }
        self.report(report);
    }

    /// Called first by every input: a node silent for about the death
    /// timeout (stopped, or starved of CPU) may have been declared dead by
    /// the others, and its queue run elsewhere; starting it here too would
    /// run it twice, so it goes back. Half the timeout counts as that long:
    /// giving back too early costs a round trip, too late a duplicate.
    ///
    /// Its own silence also made every member look silent: they get a
    /// fresh chance to be heard rather than being declared dead by a node
    /// that was not listening (which would then elect itself and take the
    /// mesh over).
    fn woke(&mut self, now: Millis) {
        self.clock = self.clock.max(now);
        let last_beat = self.next_beat.saturating_sub(self.cfg.heartbeat_ms);
        if now <= last_beat + self.cfg.dead_after_ms / 2 {
            return;
        }
        for m in self.members.values_mut() {
            m.last_seen = m.last_seen.max(now.saturating_sub(self.cfg.heartbeat_ms));
        }
        if !self.queue.is_empty() {
            if let Some(o) = &mut self.observed {
                o.arrived.clear();
            }
            let tasks: Vec<Assigned> = self.queue.drain(..).collect();
            self.actions.push_back(Action::Emit(PeerEvent::Silent {
                ms: now - last_beat,
                released: tasks.len(),
            }));
            self.send_coordinator(|term| Msg::Release { term, tasks });
        }
    }

    pub fn handle_timeout(&mut self, now: Millis) {
        self.woke(now);
        while let Some(Reverse((at, farm, task, attempt))) = self.timers.peek().copied() {
            if at > now {
                break;
            }
            self.timers.pop();
            if let Some(r) = self.running.get_mut(&(farm, task)) {
                if r.attempt == attempt && r.killed.is_none() {
                    r.killed = Some(KillReason::Timeout);
                    self.actions.push_back(Action::Kill {
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
        if now >= self.next_beat {
            self.next_beat = now + self.cfg.heartbeat_ms;
            // Stages that stopped running here stop counting.
            self.update_depth(now);
            self.check_members(now);
            self.elect(now);
            self.send_beat();
            self.try_steal(now);
        }
        if now >= self.next_resend {
            self.next_resend = now + self.cfg.resend_ms;
            self.resend(now);
        }
        if let Some((_, _, at)) = self.steal {
            if now >= at + self.cfg.steal_timeout_ms {
                self.steal = None;
            }
        }
        if self.coord.as_ref().is_some_and(|c| now >= c.next_progress) {
            self.sync_holders(now, true);
        }
        if self.coord.is_some() && self.allocs.poll_timeout().is_some_and(|t| now >= t) {
            self.alloc_tick(now);
        }
        self.pump(now);
    }

    // ----- the message loop -----

    /// Sends to the coordinator, when there is one; `msg` gets the current term.
    fn send_coordinator(&mut self, msg: impl FnOnce(u64) -> Msg) {
        if let Some(c) = self.coordinator {
            let m = msg(self.term);
            self.send(c, m);
        }
    }

    /// A result for the coordinator, kept until it is acknowledged (and resent until then).
    fn report(&mut self, report: Report) {
        let key = (report.task.farm, report.task.task);
        self.unacked.insert(key, report.clone());
        self.held_dirty.insert(key);
        self.reports_out.push(report);
    }

    /// Sends this step's reports as one message (in `batch_max` chunks).
    fn send_reports(&mut self, now: Millis) {
        if self.reports_out.is_empty() {
            return;
        }
        let reports = std::mem::take(&mut self.reports_out);
        let prefetch = self.depth;
        for chunk in reports.chunks(self.cfg.batch_max) {
            self.send_coordinator(|term| Msg::Report {
                term,
                reports: chunk.to_vec(),
                at: now,
                prefetch,
            });
        }
    }

    /// Recomputes the prefetch depth from what was measured.
    fn update_depth(&mut self, now: Millis) {
        let base = base_depth(self.pool.total());
        self.depth = self.pace.depth(now, base, self.cfg.queue_max as u32);
    }

    fn send(&mut self, to: NodeId, msg: Msg) {
        self.stats.messages += 1;
        if to == self.id {
            self.inbox.push_back((to, msg));
        } else {
            self.actions.push_back(Action::Send { to, msg });
        }
    }

    /// Handles messages (including those this node sent itself) until none is left.
    fn pump(&mut self, now: Millis) {
        self.send_reports(now);
        while let Some((from, msg)) = self.inbox.pop_front() {
            self.dispatch_msg(now, from, msg);
        }
        self.coord_drain();
        self.assign(now);
        // Assignments to this node itself arrive through the inbox.
        while let Some((from, msg)) = self.inbox.pop_front() {
            self.dispatch_msg(now, from, msg);
            self.coord_drain();
            self.assign(now);
        }
        self.sync_holders(now, false);
        // Holders' answers to this node itself.
        while let Some((from, msg)) = self.inbox.pop_front() {
            self.dispatch_msg(now, from, msg);
        }
        if !self.held_dirty.is_empty() {
            let mut reports = Vec::new();
            let mut gone = Vec::new();
            for key in std::mem::take(&mut self.held_dirty) {
                match self.unacked.get(&key) {
                    Some(r) => reports.push(r.clone()),
                    None => gone.push(key),
                }
            }
            self.actions
                .push_back(Action::Persist(Persist::Held { reports, gone }));
        }
    }

    fn dispatch_msg(&mut self, now: Millis, from: NodeId, msg: Msg) {
        match msg {
            Msg::Beat(b) => self.on_beat(now, from, b),
            Msg::Alloc(cmd) => {
                if self.coord.is_some() {
                    let (ops, changed) = self.allocs.command(now, self.term, *cmd);
                    self.batch(ops);
                    if changed {
                        self.allocs_changed();
                    }
                }
            }
            Msg::Allocs(book) => {
                if self.allocs.adopt(book) {
                    let book = self.allocs.book().clone();
                    self.actions
                        .push_back(Action::Persist(Persist::Allocs(book)));
                    self.machines_changed();
                }
            }
            Msg::Submit {
                farm,
                entries,
                home,
            } => self.on_submit(now, from, farm, entries, home),
            Msg::Offer { farm, entries } => self.on_offer(now, from, farm, entries),
            Msg::Accepted { farm, tasks } => {
                if let Some(r) = self.replicas.get_mut(&farm) {
                    if !r.accepted {
                        r.accepted = true;
                        if r.home {
                            self.actions
                                .push_back(Action::Emit(PeerEvent::Accepted { farm, tasks }));
                        }
                    }
                }
            }
            Msg::Refused { farm, reason } => {
                if self.replicas.get(&farm).is_some_and(|r| r.home) {
                    self.replicas.remove(&farm);
                    self.actions
                        .push_back(Action::Emit(PeerEvent::Refused { farm, reason }));
                }
            }
            Msg::Replicate { farm, term } => {
                if term < self.term {
                    return;
                }
                let id = farm.id;
                if !self.replicas.contains_key(&id) {
                    self.specs.insert(id, farm.clone());
                    self.actions
                        .push_back(Action::Persist(Persist::Farm(farm.clone())));
                    let mut r = Replica::new(farm.clone(), self.id);
                    // The coordinator that asked for the copy has it.
                    r.accepted = true;
                    self.replicas.insert(id, r);
                }
                // The copy counts once the farm's inputs are here too.
                if self.want_inputs(&farm) && !self.inputs_wanted.contains(&id) {
                    self.send(from, Msg::Replicated { farm: id });
                }
            }
            Msg::Replicated { farm } => {
                if let Some(f) = self.coord.as_mut().and_then(|c| c.farms.get_mut(&farm)) {
                    if let Some(h) = f.holders.iter_mut().find(|h| h.node == from) {
                        h.has_spec = true;
                    }
                }
                self.accept_ready();
            }
            Msg::Sync(m) => self.on_sync(now, from, *m),
            Msg::Redo { farm, tasks } => self.on_redo(farm, tasks),
            Msg::Synced { farm, next, over } => self.on_synced(from, farm, next, over),
            Msg::Collected { farm } => {
                self.actions.push_back(Action::Forget { farm });
            }
            Msg::Assign { term, tasks, echo } => self.on_assign(now, from, term, tasks, echo),
            Msg::Report {
                reports,
                at,
                prefetch,
                ..
            } => {
                if let Some(c) = &mut self.coord {
                    if from != self.id {
                        c.depth.insert(from, prefetch);
                        c.echo.insert(from, at);
                    }
                }
                self.on_report(now, from, reports)
            }
            Msg::Ack { tasks } => {
                for a in tasks {
                    if self
                        .unacked
                        .get(&(a.farm, a.task))
                        .is_some_and(|r| r.task.attempt == a.attempt)
                    {
                        self.unacked.remove(&(a.farm, a.task));
                        self.held_dirty.insert((a.farm, a.task));
                        if let Some(o) = &mut self.observed {
                            if let Some(at) = o.started.remove(&(a.farm, a.task)) {
                                o.latency
                                    .record_ms(Latency::StartToDone, now.saturating_sub(at));
                            }
                        }
                    }
                }
            }
            Msg::Release { tasks, .. } => self.on_release(now, tasks),
            Msg::Holding { tasks, .. } => self.on_holding(now, from, tasks),
            Msg::GetFarm { farm } => {
                if let Some(spec) = self.specs.get(&farm).cloned() {
                    self.send(from, Msg::Farm(spec));
                }
            }
            Msg::Farm(spec) => {
                self.specs.insert(spec.id, spec.clone());
                if let Some(waiting) = self.awaiting_spec.remove(&spec.id) {
                    self.queue.extend(waiting);
                    self.start_queued(now);
                    self.try_steal(now);
                }
            }
            Msg::Steal {
                id,
                total,
                load,
                max,
            } => self.on_steal(from, id, total, load, max),
            Msg::Stolen { id, tasks } => self.on_stolen(now, from, id, tasks),
            Msg::Moved { to, tasks, .. } => self.on_moved(now, from, to, tasks),
            Msg::Cancel { farm } => self.on_cancel(from, farm),
            Msg::Failure(f) => self.actions.push_back(Action::Emit(PeerEvent::Failure(f))),
        }
    }

    // ----- membership and election -----

    fn on_beat(&mut self, now: Millis, from: NodeId, b: Arc<Beat>) {
        if b.version != PROTOCOL_VERSION || from == self.id {
            return;
        }
        let claims = b.coordinator == Some(from);
        let term = b.term;
        let queued = b.queued;
        self.note_queued(from, queued, b.prefetch as usize);
        if let Some(c) = &mut self.coord {
            c.depth.insert(from, b.prefetch);
        }
        let fresh = !self.members.contains_key(&from);
        if fresh {
            self.gone.remove(&from);
        }
        self.members.insert(
            from,
            Member {
                id: from,
                beat: b,
                last_seen: now,
            },
        );
        if fresh {
            self.actions
                .push_back(Action::Emit(PeerEvent::MemberUp(from)));
            self.machines_changed();
            if let Some(c) = &mut self.coord {
                c.hungry.insert(from);
            }
            // A farm held by too few nodes (a mesh of one until now) gets a copy there.
            self.ensure_holders(now);
        }
        if !claims && self.coordinator == Some(from) && self.coord.is_none() {
            // The coordinator this node follows says it no longer is (it
            // followed someone since, who died): this node looks for one
            // again, as if it had died, rather than wait on it for ever
            // while it waits for an election among its followers.
            self.coordinator = None;
        }
        if claims {
            // Higher term wins; on a tie the lower id, so two halves that both
            // elected themselves settle on one.
            let better = term > self.term
                || (term == self.term && self.coordinator.is_none_or(|c| from < c));
            if better && self.coordinator != Some(from) {
                self.follow(now, term, from);
            } else if better {
                self.term = term;
            }
        }
        if queued > 0 {
            // Work appeared there: a dry node takes some now rather than at its next beat.
            self.try_steal(now);
        }
    }

    /// What this node believes `node` holds queued, beyond `spare` its own
    /// prefetch: keeps the two victim indices in step.
    fn note_queued(&mut self, node: NodeId, queued: u32, spare: usize) {
        if queued > 0 {
            self.loaded.insert(node, queued);
        } else {
            self.loaded.swap_remove(&node);
        }
        if queued as usize > spare {
            self.overloaded.insert(node, queued);
        } else {
            self.overloaded.swap_remove(&node);
        }
    }

    /// Gossips this node's beat now.
    fn send_beat(&mut self) {
        let beat = self.beat();
        self.advertised = beat.queued;
        self.stats.messages += 1;
        self.actions
            .push_back(Action::Broadcast(Msg::Beat(Arc::new(beat))));
    }

    /// A queue grown well past what the last beat said (work piled onto
    /// this node) is gossiped at once, so dry nodes come for it within a
    /// message's time instead of a heartbeat's. The queue must at least
    /// double for another such beat, so there are few between two heartbeats.
    fn beat_if_piled_up(&mut self) {
        let spare = self.depth as usize;
        if self.queue.len() > spare.max(2 * self.advertised as usize) {
            self.send_beat();
        }
    }

    fn check_members(&mut self, now: Millis) {
        if now <= self.quiet_until {
            return;
        }
        let limit = self.cfg.dead_after_ms;
        let mut dead = Vec::new();
        let mut oldest = now;
        for m in self.members.values() {
            if now.saturating_sub(m.last_seen) > limit {
                dead.push(m.id);
            } else {
                oldest = oldest.min(m.last_seen);
            }
        }
        self.quiet_until = oldest + limit;
        let mut died = false;
        for id in dead {
            self.members.remove(&id);
            self.gone.insert(id, now);
            self.actions
                .push_back(Action::Emit(PeerEvent::MemberDown(id)));
            if self.coordinator == Some(id) {
                self.coordinator = None;
            }
            if let Some((_, victim, _)) = self.steal {
                if victim == id {
                    self.steal = None;
                }
            }
            self.note_queued(id, 0, 0);
            self.reclaim(now, id);
            died = true;
        }
        if died {
            self.machines_changed();
        }
    }

    fn elect(&mut self, now: Millis) {
        if self.coordinator.is_some() {
            return;
        }
        if self.joining && now < self.started_at + self.cfg.join_wait_ms {
            return;
        }
        let lowest = self.members.keys().next().copied().unwrap_or(self.id);
        if let Some(m) = self.members.get(&lowest) {
            if lowest < self.id && m.beat.coordinator == Some(lowest) {
                // The node that would be elected already coordinates, in a
                // lower term than this node last knew (that term's
                // coordinator died, and nodes restarted since count from
                // the start): it waits for no election, so follow it. A
                // higher term coming back still wins.
                let term = m.beat.term;
                self.follow(now, term, lowest);
                return;
            }
        }
        if self.id <= lowest {
            let term = ballot(term_round(self.term) + 1, self.id);
            self.become_coordinator(now, term);
        }
        // Otherwise the lowest live node elects itself and its beat says so.
    }

    fn follow(&mut self, now: Millis, term: u64, node: NodeId) {
        if let Some(o) = &mut self.observed {
            if self.coordinator.is_some_and(|c| c != node) {
                o.failovers += 1;
            }
        }
        self.term = term;
        self.coordinator = Some(node);
        self.joining = false;
        if node != self.id {
            if let Some(old) = self.coord.take() {
                self.hand_over(old);
                self.allocs.coordinating(None);
            }
        }
        self.actions
            .push_back(Action::Emit(PeerEvent::Coordinator { term, node }));
        if node != self.id {
            // Introduce this node to the coordinator now rather than at the
            // next heartbeat (a gossiped beat may not reach it at all): it
            // hands work only to members it knows.
            let beat = Arc::new(self.beat());
            self.send(node, Msg::Beat(beat));
        }
        // Whatever the old coordinator knew, tell the new one.
        let holding = self.holding();
        if !holding.is_empty() {
            self.send(
                node,
                Msg::Holding {
                    term,
                    tasks: holding,
                },
            );
        }
        // A new coordinator may not know this node's farms: offer them again
        // with what is known of them (it answers at once for farms it has).
        for r in self.replicas.values_mut() {
            // Not only unfinished farms: a home still bringing outputs or
            // waiting for a redone task needs a coordinator that has it.
            if !r.finished() {
                r.accepted = false;
            }
        }
        self.resend(now);
    }

    /// The coordinator's look at its allocation queues: the backlog by
    /// kind, which nodes the jobs started and whether they have work.
    fn alloc_tick(&mut self, now: Millis) {
        let backlog = self.alloc_backlog();
        let mut activity: Vec<(String, bool)> = self
            .members
            .values()
            .filter_map(|m| {
                let b = &m.beat;
                b.job.clone().map(|j| (j, b.running + b.queued > 0))
            })
            .collect();
        if let Some(j) = &self.job {
            activity.push((
                j.clone(),
                !self.running.is_empty() || !self.queue.is_empty(),
            ));
        }
        // Stages whose tasks are expected to take longer than a queue's
        // jobs live would wait for ever on its nodes: said once, in the log.
        let mut long: Vec<(String, u64)> = Vec::new();
        if let Some(c) = &self.coord {
            for f in c.farms.values().filter(|f| !f.finished_sent) {
                for st in &f.spec.def.stages {
                    if let Some(e) = st.expected_ms {
                        long.push((format!("{}/{}", f.spec.def.name, st.name), e));
                    }
                }
            }
        }
        let mut changed = self.allocs.warn_expected(now, self.term, &long);
        let grace = self.cfg.dead_after_ms;
        let (ops, ticked) = self.allocs.tick(now, self.term, grace, backlog, &activity);
        changed |= ticked;
        self.batch(ops);
        if changed {
            self.allocs_changed();
        }
    }

    /// Ready work no node has claimed, in whole cores (tasks without GPUs)
    /// and GPUs (tasks with): what allocation queues of each kind are for.
    fn alloc_backlog(&mut self) -> Backlog {
        let mut b = Backlog::default();
        let Some(c) = &self.coord else {
            return b;
        };
        // Work no queue's nodes live long enough for (its `expected` is
        // longer) asks for no job: they would idle, and never be cancelled
        // while it waits.
        let usable = |gpus: bool| {
            self.allocs
                .book()
                .queues
                .iter()
                .filter(|q| q.def.for_gpus() == gpus)
                .map(|q| q.def.usable_ms())
                .max()
                .unwrap_or(0)
        };
        let (cpu_ms, gpu_ms) = (usable(false), usable(true));
        for (stage, n) in c.engine.waiting_stages() {
            let req = &stage.resources;
            let gpu = req.get(GPU).0;
            let room = if gpu > 0 { gpu_ms } else { cpu_ms };
            if stage.expected_ms.is_some_and(|e| e > room) {
                continue;
            }
            if gpu > 0 {
                b.gpus += gpu.saturating_mul(n).div_ceil(Amount::units(1).0);
            } else {
                b.cores += req
                    .get(CPU)
                    .0
                    .saturating_mul(n)
                    .div_ceil(Amount::units(1).0);
            }
        }
        b
    }

    fn batch(&mut self, ops: Vec<BatchOp>) {
        self.actions.extend(ops.into_iter().map(Action::Batch));
    }

    /// The coordinator changed the book: durable here, and sent to everyone.
    fn allocs_changed(&mut self) {
        let book = self.allocs.book().clone();
        self.actions
            .push_back(Action::Persist(Persist::Allocs(book.clone())));
        let to: Vec<NodeId> = self.members.keys().copied().collect();
        for n in to {
            self.send(n, Msg::Allocs(book.clone()));
        }
        self.machines_changed();
    }

    /// Brings the book's copies in step: the coordinator sends it to
    /// members whose beat shows an older one, a member to a coordinator
    /// that has an older one than its own.
    fn resend_allocs(&mut self) {
        let v = self.allocs.version();
        if v == (0, 0) {
            return;
        }
        let to: Vec<NodeId> = if self.coord.is_some() {
            self.members
                .values()
                .filter(|m| m.beat.allocs < v)
                .map(|m| m.id)
                .collect()
        } else {
            self.coordinator
                .and_then(|c| self.members.get(&c))
                .filter(|m| m.beat.allocs < v)
                .map(|m| m.id)
                .into_iter()
                .collect()
        };
        for n in to {
            let book = self.allocs.book().clone();
            self.send(n, Msg::Allocs(book));
        }
    }

    fn become_coordinator(&mut self, now: Millis, term: u64) {
        let machines = self.machines();
        self.machines_dirty = false;
        let mut c = Coord {
            engine: Engine::remote(machines),
            farms: FxHashMap::default(),
            slots: Vec::new(),
            claims: Tally::new(|_, (node, ..)| *node),
            load: FxHashMap::default(),
            hungry: self.members.keys().copied().chain([self.id]).collect(),
            last_backlog: 0,
            depth: FxHashMap::default(),
            echo: FxHashMap::default(),
            reporter: None,
            outputs: Arc::default(),
            last_key: None,
            log_id: self.rng.random(),
            sync_seq: 0,
            next_progress: now,
        };
        for stored in std::mem::take(&mut self.stored) {
            let origin = stored.spec.origin;
            let home = stored.home.as_ref().map(|(h, _)| *h);
            let f = add_farm(&mut c, now, stored.spec, stored.records, stored.entries);
            f.accepted = true;
            if let Some(h) = home {
                f.home = f.home.max(h);
            }
            f.holders.push(Holder::new(origin, true));
            if origin != self.id {
                // Kept here (with its inputs) since it first came.
                f.holders.push(Holder::new(self.id, true));
            }
        }
        self.coord = Some(c);
        self.allocs.coordinating(Some(now));
        self.coord_drain();
        self.ensure_holders(now);
        self.follow(now, term, self.id);
    }

    /// A coordinator that lost an election gives its farms to the winner,
    /// with the tasks it knows are done.
    fn hand_over(&mut self, old: Coord) {
        let Some(to) = self.coordinator else { return };
        for fid in &old.slots {
            let f = &old.farms[fid];
            let entries = f.log.current().cloned().collect();
            self.offer(to, f.spec.clone(), entries, f.home);
        }
    }

    /// The machines a stage must fit one of: the members, and a node of
    /// each allocation queue that may still submit (its jobs would come
    /// for the work, so it is not failed as unplaceable).
    fn machines(&self) -> Vec<Resources> {
        std::iter::once(self.pool.total().clone())
            .chain(self.members.values().map(|m| m.beat.total.clone()))
            .chain(
                self.allocs
                    .book()
                    .queues
                    .iter()
                    .filter(|q| q.paused.is_none() && q.def.max > 0)
                    .map(|q| q.def.node_resources()),
            )
            .collect()
    }

    /// Membership changed: the coordinator's view of the machines is
    /// rebuilt before it next needs it, once for a burst of joins rather
    /// than once per join (each rebuild clones every member's resources).
    fn machines_changed(&mut self) {
        self.machines_dirty = true;
    }

    fn sync_machines(&mut self) {
        if !self.machines_dirty || self.coord.is_none() {
            return;
        }
        self.machines_dirty = false;
        let machines = self.machines();
        if let Some(c) = &mut self.coord {
            c.engine.set_machines(machines);
        }
    }

    // ----- coordinator -----

    /// A holder offers a farm: taken over if it is new here, merged if not.
    fn on_submit(
        &mut self,
        now: Millis,
        from: NodeId,
        farm: Arc<FarmSpec>,
        entries: Vec<Entry>,
        home: Home,
    ) {
        self.sync_machines();
        let id = self.id;
        let Some(c) = &mut self.coord else {
            // Not (or no longer) the coordinator: the holder resends to the right one.
            return;
        };
        if let Some(f) = c.farms.get_mut(&farm.id) {
            if home > f.home {
                // Taken over: every holder hears of the new home with the next progress.
                f.home = home;
                f.counts_sent = None;
                f.finished_sent = false;
            }
            self.merge(now, from, farm.id, entries);
            return;
        }
        self.specs.insert(farm.id, farm.clone());
        self.actions
            .push_back(Action::Persist(Persist::Farm(farm.clone())));
        persist_entries(&mut self.actions, farm.id, entries.clone(), true);
        let records = entries
            .iter()
            .map(|e| (e.task(), entry_record(e)))
            .collect();
        let origin = farm.origin;
        let spec = farm.clone();
        let f = add_farm(c, now, farm, records, entries);
        f.home = f.home.max(home);
        // The home keeps it durably, and so does the holder that offered it
        // and this node, once it has the inputs.
        f.holders.push(Holder::new(origin, true));
        if from != origin {
            f.holders.push(Holder::new(from, true));
        }
        if id != origin && id != from {
            f.holders.push(Holder::new(id, false));
            if self.want_inputs(&spec) {
                self.inputs_here(spec.id);
            }
        }
        self.coord_drain();
        self.ensure_holders(now);
        self.accept_ready();
    }

    /// More of what a holder knows of a farm the coordinator has.
    fn on_offer(&mut self, now: Millis, from: NodeId, farm: FarmId, entries: Vec<Entry>) {
        if self
            .coord
            .as_ref()
            .is_some_and(|c| c.farms.contains_key(&farm))
        {
            self.merge(now, from, farm, entries);
        }
    }

    /// Folds a holder's entries into a farm the coordinator has (what it
    /// did not know is recorded and streamed to the others) and answers it.
    fn merge(&mut self, now: Millis, from: NodeId, farm: FarmId, entries: Vec<Entry>) {
        let Some(c) = &mut self.coord else { return };
        let f = c.farms.get_mut(&farm).expect("checked by the caller");
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
                        c.engine.mark_done(now, f.slot, e.task());
                    }
                    Entry::Redo { .. } => {
                        c.engine.redo(f.slot, e.task());
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
        persist_entries(&mut self.actions, farm, new, true);
        self.coord_drain();
        if accepted {
            self.send(from, Msg::Accepted { farm, tasks });
        }
    }

    /// Nodes other than this one that could hold a copy, and how many must.
    fn holders_needed(&self) -> usize {
        self.cfg.replicas.saturating_sub(1).min(self.members.len())
    }

    fn live(&self, node: NodeId) -> bool {
        node == self.id || self.members.contains_key(&node)
    }

    /// The farm's inputs (none, or every one) are here: a copy held here
    /// now counts, and a farm waiting for that may be accepted.
    pub fn inputs_ready(&mut self, now: Millis, farm: FarmId, ok: bool) {
        // When not, asked again at the next resend, from whoever has them then.
        if ok && self.inputs_wanted.remove(&farm) {
            self.inputs_here(farm);
            self.pump(now);
        }
    }

    fn inputs_here(&mut self, farm: FarmId) {
        if self.replicas.get(&farm).is_some_and(|r| !r.home) {
            self.send_coordinator(|_| Msg::Replicated { farm });
        }
        let me = self.id;
        if let Some(f) = self.coord.as_mut().and_then(|c| c.farms.get_mut(&farm)) {
            if let Some(h) = f.holders.iter_mut().find(|h| h.node == me) {
                h.has_spec = true;
            }
        }
        self.accept_ready();
    }

    /// This node keeps a copy of `spec`: its inputs come here first
    /// (see [`Peer::inputs_ready`]). True when there are none to bring.
    fn want_inputs(&mut self, spec: &FarmSpec) -> bool {
        if spec.inputs.is_empty() || spec.origin == self.id {
            return true;
        }
        if self.inputs_wanted.insert(spec.id) {
            self.actions
                .push_back(Action::FetchInputs { farm: spec.id });
        }
        false
    }

    /// Every farm the coordinator has is held by enough live nodes: the
    /// lowest live members not yet holding one are asked to.
    fn ensure_holders(&mut self, now: Millis) {
        let need = self.holders_needed();
        let Some(c) = &self.coord else { return };
        let mut asks = Vec::new();
        for fid in &c.slots {
            let f = &c.farms[fid];
            let live = |n: &NodeId| *n != self.id && self.members.contains_key(n);
            let have = f.holders.iter().filter(|h| live(&h.node)).count();
            let extra = self
                .members
                .keys()
                .filter(|n| !f.holders.iter().any(|h| h.node == **n))
                .take(need.saturating_sub(have));
            for n in extra {
                asks.push((*fid, *n));
            }
        }
        let term = self.term;
        for (fid, n) in asks {
            let c = self.coord.as_mut().expect("checked");
            let f = c.farms.get_mut(&fid).expect("listed above");
            let mut h = Holder::new(n, false);
            h.at = now;
            f.holders.push(h);
            let spec = f.spec.clone();
            self.send(n, Msg::Replicate { term, farm: spec });
        }
    }

    /// Acknowledges every farm whose definition and inputs are durable on
    /// enough nodes (this one included).
    fn accept_ready(&mut self) {
        let need = self.holders_needed() + 1;
        let me = self.id;
        let Some(c) = &self.coord else { return };
        let mut out = Vec::new();
        for fid in &c.slots {
            let f = &c.farms[fid];
            let have = f
                .holders
                .iter()
                .filter(|h| h.has_spec && self.live(h.node))
                .count();
            if !f.accepted && have >= need {
                out.push(*fid);
            }
        }
        for fid in out {
            let c = self.coord.as_mut().expect("checked");
            let f = c.farms.get_mut(&fid).expect("listed above");
            f.accepted = true;
            let tasks = f.spec.def.task_count();
            let to: Vec<NodeId> = f
                .holders
                .iter()
                .filter(|h| h.has_spec || h.node == me)
                .map(|h| h.node)
                .collect();
            for n in to {
                self.send(n, Msg::Accepted { farm: fid, tasks });
            }
        }
    }

    /// How far a farm's log is durable on enough holders other than this node.
    fn replicated(&self, f: &CoordFarm) -> u64 {
        let need = self.holders_needed();
        if need == 0 {
            return f.log.len();
        }
        let mut acked: Vec<u64> = f
            .holders
            .iter()
            .filter(|h| h.node != self.id && self.members.contains_key(&h.node))
            .map(|h| h.acked)
            .collect();
        acked.sort_unstable_by(|a, b| b.cmp(a));
        acked.get(need - 1).copied().unwrap_or(0)
    }

    /// Acknowledges the reports whose entries are now durable on enough holders.
    fn release_acks(&mut self) {
        let Some(c) = &self.coord else { return };
        let mut acks: BTreeMap<NodeId, Vec<Assigned>> = BTreeMap::new();
        let upto: Vec<(FarmId, u64)> = c
            .slots
            .iter()
            .map(|fid| (*fid, self.replicated(&c.farms[fid])))
            .collect();
        let c = self.coord.as_mut().expect("checked");
        for (fid, upto) in upto {
            let f = c.farms.get_mut(&fid).expect("slots and farms agree");
            while f.waiting.front().is_some_and(|(seq, ..)| *seq <= upto) {
                let (_, node, a) = f.waiting.pop_front().expect("checked");
                acks.entry(node).or_default().push(a);
            }
        }
        for (node, tasks) in acks {
            self.send(node, Msg::Ack { tasks });
        }
    }

    /// Streams each farm's log to its live holders, at most a window ahead
    /// of what they acknowledged; with `progress`, also tells them the
    /// counts when they changed (and always the end).
    fn sync_holders(&mut self, now: Millis, progress: bool) {
        let Some(c) = &mut self.coord else { return };
        if progress {
            c.next_progress = now + self.cfg.progress_ms;
        }
        let mut out = Vec::new();
        for fid in &c.slots {
            let f = c.farms.get_mut(fid).expect("slots and farms agree");
            let counts = c.engine.progress(f.slot);
            let finished = counts.finished();
            let news = (progress || finished) && f.counts_sent.as_ref() != Some(&counts);
            if news {
                f.counts_sent = Some(counts.clone());
                f.finished_sent = finished;
            }
            let mut head = None;
            for h in &mut f.holders {
                // This node streams to itself only where it keeps a copy.
                let live = if h.node == self.id {
                    self.replicas.contains_key(fid)
                } else {
                    self.members.contains_key(&h.node)
                };
                if !live || !h.has_spec {
                    continue;
                }
                let head = head.get_or_insert_with(|| {
                    let mut unplaceable = f.unplaceable.clone();
                    unplaceable.retain(|(s, _)| c.engine.unplaceable(f.slot, *s));
                    SyncHead {
                        log: c.log_id,
                        farm: *fid,
                        len: f.log.len(),
                        home: f.home,
                        duplicates: f.duplicates,
                        unplaceable,
                        counts: counts.clone(),
                        stages: c.engine.stage_progress(f.slot),
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
                    out.push((h.node, head.msg(from, entries)));
                }
                if news && !sent_any {
                    out.push((h.node, head.msg(h.sent, Vec::new())));
                }
            }
        }
        let term = self.term;
        for (to, mut m) in out {
            m.term = term;
            let c = self.coord.as_mut().expect("checked above");
            c.sync_seq += 1;
            m.seq = c.sync_seq;
            self.send(to, Msg::Sync(Box::new(m)));
        }
    }

    /// A holder has every entry before `next` durably.
    fn on_synced(&mut self, from: NodeId, farm: FarmId, next: u64, over: bool) {
        let Some(f) = self.coord.as_mut().and_then(|c| c.farms.get_mut(&farm)) else {
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
        self.release_acks();
    }

    // ----- holder -----

    /// The coordinator's log of a farm this node holds.
    fn on_sync(&mut self, now: Millis, from: NodeId, m: SyncMsg) {
        if m.term < self.term {
            return;
        }
        let me = self.id;
        let Some(r) = self.replicas.get_mut(&m.farm) else {
            return;
        };
        if r.source != Some((from, m.log)) {
            r.source = Some((from, m.log));
            r.next = 0;
            r.seen = 0;
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
        let mut added = Vec::new();
        let had_redo = !r.redo.is_empty();
        while let Some(from) = r.ahead.keys().next().copied().filter(|f| *f <= r.next) {
            let entries = r.ahead.remove(&from).expect("just seen");
            let skip = (r.next - from) as usize;
            for e in entries.into_iter().skip(skip) {
                r.next += 1;
                if r.add(e.clone()) {
                    if e.is_done() {
                        r.redo.remove(&e.task());
                    }
                    added.push(e);
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
        persist_entries(&mut self.actions, m.farm, added, from != me);
        if m.home > r.home_of {
            // Another node took the farm over (or this one did, and the
            // coordinator now knows): the highest claim is the home.
            r.home_of = m.home;
            r.home = m.home.node == me;
            if !r.home {
                r.clear_fetches();
            }
            self.actions.push_back(Action::Persist(Persist::Home {
                farm: m.farm,
                home: r.home_of,
                out: r.out.clone(),
            }));
        }
        if m.seq > r.seen {
            // Where the farm stands, from the newest message only.
            r.seen = m.seq;
            if r.home {
                for (stage, reason) in &m.unplaceable {
                    if !r.unplaceable.iter().any(|(s, _)| s == stage) {
                        self.actions.push_back(Action::Emit(PeerEvent::Unplaceable {
                            farm: m.farm,
                            stage: *stage,
                            reason: reason.clone(),
                        }));
                    }
                }
            }
            r.unplaceable = m.unplaceable;
            r.counts = m.counts;
            r.stages = m.stages;
            r.duplicates = r.duplicates.max(m.duplicates);
            r.end_len = m.finished.then_some(m.len);
        }
        let was_over = r.over;
        // Over once every task is and this copy has every entry.
        r.over = r.end_len.is_some_and(|len| r.next >= len);
        let next = r.next;
        let home = r.home;
        if r.over && !was_over && !home {
            self.actions.push_back(Action::Persist(Persist::Finished {
                farm: m.farm,
                counts: r.counts.clone(),
                stages: r.stages.clone(),
            }));
        }
        let over = r.over;
        self.send(
            from,
            Msg::Synced {
                farm: m.farm,
                next,
                over,
            },
        );
        if home {
            self.fetch_missing(now, m.farm);
            self.home_progress(m.farm);
        }
    }

    /// On the home: asks the driver for outputs not here yet, from live
    /// nodes that keep them, a bounded number at a time; an ask that got
    /// no answer for a while is asked again.
    fn fetch_missing(&mut self, now: Millis, farm: FarmId) {
        let retry = self.cfg.resend_ms * FETCH_RETRY_RESENDS;
        let Some(r) = self.replicas.get(&farm) else {
            return;
        };
        if !r.home {
            return;
        }
        let r = self.replicas.get_mut(&farm).expect("checked");
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
            if *node != self.id && !self.members.contains_key(node) {
                r.queue.push_back(task);
                continue;
            }
            asks.push((task, *node, outputs.clone()));
        }
        for (task, from, outputs) in asks {
            r.ask_fetch(task, now);
            self.actions.push_back(Action::Fetch {
                farm,
                task,
                from,
                outputs,
            });
        }
    }

    /// On the home: outputs kept by nodes gone longer than
    /// `outputs_wait_ms` (or never seen since this node started) are lost;
    /// the coordinator runs those tasks again.
    fn redo_lost(&mut self, now: Millis) {
        let wait = self.cfg.outputs_wait_ms;
        let since = |n: &NodeId| self.gone.get(n).copied().unwrap_or(self.started_at);
        let mut out = Vec::new();
        for r in self.replicas.values().filter(|r| r.home && !r.announced) {
            if r.missing_on().all(|n| self.live(n)) {
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
                    } if !self.live(*node) => Some(TaskRun {
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
                out.push((r.id(), lost));
            }
        }
        for (farm, tasks) in out {
            self.lost_outputs(farm, tasks);
        }
    }

    /// On the home: these runs' outputs are lost. The home's own copy
    /// forgets them first (so whichever run the coordinator counts as done
    /// instead is taken when it comes), then the coordinator is told.
    fn lost_outputs(&mut self, farm: FarmId, tasks: Vec<TaskRun>) {
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
        persist_entries(&mut self.actions, farm, entries, true);
        self.send_coordinator(|_| Msg::Redo { farm, tasks });
    }

    /// The home says these outputs are lost: the tasks run again.
    fn on_redo(&mut self, farm: FarmId, tasks: Vec<TaskRun>) {
        let Some(c) = &mut self.coord else { return };
        let Some(f) = c.farms.get_mut(&farm) else {
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
            c.engine.redo(f.slot, run.task);
            redone.push(e);
        }
        persist_entries(&mut self.actions, farm, redone, true);
        self.coord_drain();
    }

    /// On the home: shows the farm's progress, and once every task is over
    /// and every output here, records the end and tells every node that
    /// what it kept for the farm may go.
    fn home_progress(&mut self, farm: FarmId) {
        let me = self.id;
        let Some(r) = self.replicas.get_mut(&farm) else {
            return;
        };
        let p = r.progress();
        if p.finished && !r.announced {
            r.announced = true;
            self.actions.push_back(Action::Persist(Persist::Finished {
                farm,
                counts: r.counts.clone(),
                stages: r.stages.clone(),
            }));
            let to: Vec<NodeId> = self.members.keys().copied().chain([me]).collect();
            for n in to {
                self.send(n, Msg::Collected { farm });
            }
        }
        self.actions.push_back(Action::Emit(PeerEvent::Progress(p)));
    }

    /// Turns the engine's actions into persists, messages and events.
    fn coord_drain(&mut self) {
        let Some(c) = &mut self.coord else { return };
        let mut out = Vec::new();
        while let Some(a) = c.engine.poll_action() {
            match a {
                engine::Action::Persist(engine::Persist::Task { farm, task, record }) => {
                    let fid = c.slots[farm.0 as usize];
                    c.last_key = record.key;
                    self.actions.push_back(Action::Persist(Persist::Task {
                        farm: fid,
                        task,
                        record,
                    }));
                }
                engine::Action::Kill {
                    farm, task, reason, ..
                } => {
                    if reason == KillReason::Cancel {
                        if let Some((node, ..)) = c.claims.get(&(farm, task)) {
                            out.push((
                                *node,
                                Msg::Cancel {
                                    farm: c.slots[farm.0 as usize],
                                },
                            ));
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
                        verdict,
                    } => {
                        let fid = c.slots[farm.0 as usize];
                        let node = c.reporter.unwrap_or(NodeId(0));
                        let f = c.farms.get_mut(&fid).expect("slots and farms agree");
                        let entry = match verdict {
                            Verdict::Done => Some(Entry::Done {
                                task,
                                key: c.last_key.map(Box::new),
                                node,
                                attempt,
                                outputs: std::mem::take(&mut c.outputs),
                            }),
                            Verdict::Failed => Some(Entry::Failed {
                                task,
                                attempt,
                                node,
                                end: Box::new(end),
                            }),
                            Verdict::Retry => {
                                out.push((
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
                            Verdict::Cancelled | Verdict::Interrupted => None,
                        };
                        if let Some(e) = entry {
                            if e.is_done() && f.log.redone(&e) {
                                // A late report of a run whose outputs were
                                // lost: the task still runs again.
                                c.engine.redo(farm, task);
                                continue;
                            }
                            // Where outputs are and why a task failed is
                            // kept beside the engine's own record.
                            let keep = matches!(&e, Entry::Done { outputs, .. } if !outputs.is_empty())
                                || !e.is_done();
                            if f.log.add(e.clone()) && keep {
                                self.actions.push_back(Action::Persist(Persist::Entries {
                                    farm: fid,
                                    entries: vec![e],
                                    records: false,
                                }));
                            }
                        }
                    }
                    engine::Event::Unplaceable {
                        farm,
                        stage,
                        shortfall,
                    } => {
                        let fid = c.slots[farm.0 as usize];
                        let reason = shortfall
                            .iter()
                            .map(|(k, want, have)| {
                                format!(
                                    "{k}={} asked, {} on the largest node",
                                    want.display(k),
                                    have.display(k)
                                )
                            })
                            .collect::<Vec<_>>()
                            .join(", ");
                        // Part of the farm's state the holders hear with its progress.
                        let f = c.farms.get_mut(&fid).expect("slots and farms agree");
                        f.unplaceable.retain(|(s, _)| *s != stage);
                        f.unplaceable.push((stage, reason));
                        f.counts_sent = None;
                    }
                    engine::Event::FarmFinished { .. } => {}
                },
            }
        }
        out.dedup();
        for (to, msg) in out {
            self.send(to, msg);
        }
    }

    /// Hands ready tasks to nodes with room.
    fn assign(&mut self, now: Millis) {
        if self.coord.is_none() {
            return;
        }
        let fixed = self.cfg.prefetch_percent;
        // Echoes are for this step's assignments only: an assignment
        // that comes later did not answer that report.
        let mut echo = std::mem::take(&mut self.coord.as_mut().expect("checked").echo);
        let batch_max = self.cfg.batch_max;
        let queue_max = self.cfg.queue_max;
        let claims_max = self.cfg.node_claims_max;
        self.sync_machines();
        let nodes: Vec<NodeId> = {
            let me = self.id;
            let c = self.coord.as_mut().expect("checked");
            let backlog = c.engine.backlog();
            if backlog > c.last_backlog {
                // New work (a submission, a stage opening, a task re-queued):
                // nodes that had nothing fitting may have now.
                c.hungry.extend(self.members.keys().copied());
                c.hungry.insert(me);
            }
            c.last_backlog = backlog;
            if backlog == 0 {
                return;
            }
            c.hungry.iter().copied().collect::<Vec<NodeId>>()
        };
        // Near the end of some work, a task queued behind a busy node's
        // running ones may wait for a long one while a slot idles elsewhere:
        // such tasks go only to free slots. Before that, no node queues
        // more than its share of what is left, so the end spreads.
        let waiting = self.coord.as_mut().expect("checked").engine.waiting();
        let nodes_n = self.members.len() as u64 + 1;
        let term = self.term;
        for node in nodes {
            let member = if node == self.id {
                None
            } else {
                self.members.get(&node)
            };
            let depth = if node == self.id {
                self.depth
            } else {
                let c = self.coord.as_ref().expect("checked");
                c.depth
                    .get(&node)
                    .copied()
                    .unwrap_or_else(|| member.map_or(1, |m| m.beat.prefetch))
            };
            // Borrowed field by field, so the coordinator's state can change
            // meanwhile without cloning the node's resources. A node that
            // drains before its walltime takes only what it is expected to
            // finish first.
            let (total, deadline) = if node == self.id {
                (Some(self.pool.total()), self.deadline)
            } else {
                (
                    member.map(|m| &m.beat.total),
                    member.and_then(|m| {
                        m.beat
                            .ends_in_ms
                            .map(|left| m.last_seen.saturating_add(left))
                    }),
                )
            };
            let c = self.coord.as_mut().expect("checked");
            let Some(total) = total else {
                c.hungry.remove(&node);
                continue;
            };
            if c.engine.backlog() == 0 {
                return;
            }
            let (load, count) = c.load.entry(node).or_default();
            let cap =
                queue_max.min(claims_max.unwrap_or_else(|| claims_cap(total) + depth as usize));
            let mut taken = Vec::new();
            let claimed = c.engine.claim(
                now,
                batch_max.min(cap.saturating_sub(*count)),
                &mut |stage| {
                    if deadline.is_some_and(|d| !fits_before_walltime(now, d, stage.expected_ms, 0))
                    {
                        return false;
                    }
                    let req = &stage.resources;
                    let (queued, draining) = waiting
                        .iter()
                        .find(|(r, ..)| r == req)
                        .map_or((0, true), |(_, q, d)| (*q, *d));
                    let prefetch = match fixed {
                        _ if draining => Prefetch::None,
                        Some(pct) => Prefetch::Percent(pct),
                        None => {
                            Prefetch::Depth((depth as u64).min(queued.div_ceil(nodes_n)).max(1))
                        }
                    };
                    if !room(total, load, req, prefetch) {
                        return false;
                    }
                    load.give(req);
                    true
                },
            );
            *count += claimed.len();
            let full = *count >= cap || claimed.is_empty();
            for (slot, task, attempt) in claimed {
                c.claims.insert((slot, task), (node, attempt, now));
                taken.push(Assigned {
                    farm: c.slots[slot.0 as usize],
                    task,
                    attempt,
                });
            }
            if full {
                c.hungry.remove(&node);
            }
            if !taken.is_empty() {
                let echo = echo.remove(&node);
                self.send(
                    node,
                    Msg::Assign {
                        term,
                        tasks: taken,
                        echo,
                    },
                );
            }
        }
        let c = self.coord.as_mut().expect("checked");
        c.last_backlog = c.engine.backlog();
        self.coord_drain();
    }

    fn on_report(&mut self, now: Millis, from: NodeId, reports: Vec<Report>) {
        let mut acks = Vec::new();
        for r in reports {
            let Some(c) = &mut self.coord else { return };
            let Some(f) = c.farms.get(&r.task.farm) else {
                continue;
            };
            let slot = f.slot;
            let spec = f.spec.clone();
            let t = r.task.task;
            if let Some(o) = &mut self.observed {
                let started = now.saturating_sub(r.duration_ms);
                o.latency
                    .record_ms(Latency::SubmitToStart, started.saturating_sub(f.since));
            }
            if let Some((owner, attempt, _)) = c.claims.get(&(slot, t)).copied() {
                if attempt == r.task.attempt {
                    c.claims.remove(&(slot, t));
                    unload(c, owner, &spec.def.stages[t.stage as usize].resources);
                }
            }
            let f = &c.farms[&r.task.farm];
            let before = f.log.len();
            let ok_codes = &spec.def.stages[t.stage as usize].success_codes;
            let succeeded =
                matches!(r.result, TaskResult::Exited(code) if ok_codes.contains(&code));
            let ran_before = matches!(f.log.get(t), Some(Entry::Done { node, attempt, .. })
                if (*node, *attempt) != (from, r.task.attempt));
            if succeeded && ran_before {
                let f = c.farms.get_mut(&r.task.farm).expect("checked");
                f.extra_run(t, from, r.task.attempt);
            }
            c.reporter = Some(from);
            c.outputs = r.outputs.into();
            c.engine.task_finished(
                now,
                slot,
                t,
                r.task.attempt,
                Outcome {
                    result: r.result,
                    key: r.key,
                    duration_ms: r.duration_ms,
                    logs: 0,
                },
            );
            // The entry (and the record's Persist before it) comes out now,
            // while the reporter and its outputs are the ones set.
            self.coord_drain();
            let c = self.coord.as_mut().expect("checked above");
            c.reporter = None;
            c.outputs = Arc::default();
            let f = c.farms.get_mut(&r.task.farm).expect("checked above");
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
        if let Some(c) = &mut self.coord {
            c.hungry.insert(from);
        }
        if !acks.is_empty() {
            // The acknowledgement follows the record's Persist in the action order.
            self.send(from, Msg::Ack { tasks: acks });
        }
        self.release_acks();
    }

    fn on_release(&mut self, now: Millis, tasks: Vec<Assigned>) {
        let Some(c) = &mut self.coord else { return };
        for a in tasks {
            let Some(f) = c.farms.get(&a.farm) else {
                continue;
            };
            let slot = f.slot;
            let spec = f.spec.clone();
            if let Some((owner, attempt, _)) = c.claims.get(&(slot, a.task)).copied() {
                if attempt == a.attempt {
                    c.claims.remove(&(slot, a.task));
                    unload(c, owner, &spec.def.stages[a.task.stage as usize].resources);
                    c.hungry.insert(owner);
                    c.engine.unclaim(now, slot, a.task, a.attempt);
                }
            }
        }
    }

    /// What a worker holds (queued, running, waiting for a spec, reported
    /// and not acknowledged): sent after an election, so the new coordinator
    /// adopts those claims, and every `resend_ms`, so claims whose `Assign`
    /// or `Stolen` was lost go back to the queue. Only claims older than
    /// `resend_ms` are given up: younger ones may still be on their way.
    fn on_holding(&mut self, now: Millis, from: NodeId, tasks: Vec<Assigned>) {
        let grace = self.cfg.resend_ms;
        let Some(c) = &mut self.coord else { return };
        let mut held = 0;
        for a in &tasks {
            let Some(f) = c.farms.get(&a.farm) else {
                continue;
            };
            let slot = f.slot;
            if let Some((owner, attempt, _)) = c.claims.get(&(slot, a.task)) {
                if *owner == from && *attempt == a.attempt {
                    held += 1;
                }
                continue;
            }
            if c.engine.adopt_claim(slot, a.task, a.attempt) {
                c.claims.insert((slot, a.task), (from, a.attempt, now));
                let (load, count) = c.load.entry(from).or_default();
                load.give(&f.spec.def.stages[a.task.stage as usize].resources);
                *count += 1;
                held += 1;
            }
        }
        if c.load.get(&from).is_none_or(|(_, k)| *k <= held) {
            // Every claim of this node is accounted for: the common case, no scan.
            return;
        }
        let listed: FxHashSet<(FarmId, TaskRef, u32)> =
            tasks.iter().map(|a| (a.farm, a.task, a.attempt)).collect();
        let mut gone: Vec<(FarmSlot, TaskRef, u32)> = c
            .claims
            .iter()
            .filter(|((s, t), (n, a, at))| {
                *n == from
                    && at.saturating_add(grace) < now
                    && !listed.contains(&(c.slots[s.0 as usize], *t, *a))
            })
            .map(|((s, t), (_, a, _))| (*s, *t, *a))
            .collect();
        gone.sort();
        for (s, t, a) in gone {
            let req = c.engine.farm(s).stages[t.stage as usize].resources.clone();
            c.claims.remove(&(s, t));
            unload(c, from, &req);
            c.engine.unclaim(now, s, t, a);
        }
    }

    fn on_moved(&mut self, now: Millis, from: NodeId, to: NodeId, tasks: Vec<Assigned>) {
        let Some(c) = &mut self.coord else { return };
        for a in tasks {
            let Some(f) = c.farms.get(&a.farm) else {
                continue;
            };
            let slot = f.slot;
            let req = &f.spec.def.stages[a.task.stage as usize].resources;
            let moved = c.claims.update(&(slot, a.task), |claim| {
                let ours = (claim.0, claim.1) == (from, a.attempt);
                if ours {
                    // The thief holds it from now: its next Holding must list it.
                    *claim = (to, a.attempt, now);
                }
                ours
            });
            if moved == Some(true) {
                let (load, count) = c.load.entry(from).or_default();
                load.take_saturating(req);
                *count = count.saturating_sub(1);
                let (load, count) = c.load.entry(to).or_default();
                load.give(req);
                *count += 1;
            }
        }
        c.hungry.insert(from);
    }

    /// A node died: every task it held goes back to the queue.
    fn reclaim(&mut self, now: Millis, dead: NodeId) {
        let Some(c) = &mut self.coord else { return };
        let mut lost: Vec<(FarmSlot, TaskRef, u32)> = c
            .claims
            .iter()
            .filter(|(_, (n, ..))| *n == dead)
            .map(|((s, t), (_, a, _))| (*s, *t, *a))
            .collect();
        lost.sort();
        // A task that reaches the crash limit here failed on the dead node.
        c.reporter = Some(dead);
        for (s, t, a) in lost {
            let c = self.coord.as_mut().expect("checked");
            c.claims.remove(&(s, t));
            c.engine.lost(now, s, t, a);
            self.coord_drain();
        }
        let Some(c) = &mut self.coord else { return };
        c.reporter = None;
        c.load.remove(&dead);
        c.hungry.remove(&dead);
        // A holder is gone: another live node takes a copy.
        self.ensure_holders(now);
        self.accept_ready();
        self.release_acks();
    }

    fn on_cancel(&mut self, from: NodeId, farm: FarmId) {
        if let Some(c) = &mut self.coord {
            if let Some(f) = c.farms.get(&farm) {
                let slot = f.slot;
                c.engine.cancel(slot);
                self.coord_drain();
            }
        }
        if self.coordinator == Some(from) || from == self.id {
            // Drop what waits here; kill what runs. The engine hears of each.
            let (gone, keep): (Vec<Assigned>, Vec<Assigned>) =
                self.queue.drain(..).partition(|a| a.farm == farm);
            self.queue = keep.into();
            for a in gone {
                self.report(Report {
                    task: a,
                    result: TaskResult::Error("cancelled".into()),
                    key: None,
                    duration_ms: 0,
                    outputs: Vec::new(),
                });
            }
            let mut kill = Vec::new();
            for ((f, t), r) in &mut self.running {
                if *f == farm && r.killed.is_none() {
                    r.killed = Some(KillReason::Cancel);
                    kill.push(Assigned {
                        farm: *f,
                        task: *t,
                        attempt: r.attempt,
                    });
                }
            }
            for task in kill {
                self.actions.push_back(Action::Kill {
                    task,
                    reason: KillReason::Cancel,
                });
            }
        }
    }

    /// Every task this node holds for the coordinator, in a stable order:
    /// queued, running, waiting for its farm's spec, reported and not acknowledged.
    fn holding(&self) -> Vec<Assigned> {
        let mut v: Vec<Assigned> = self
            .queue
            .iter()
            .copied()
            .chain(self.running.iter().map(|((farm, task), r)| Assigned {
                farm: *farm,
                task: *task,
                attempt: r.attempt,
            }))
            .chain(self.awaiting_spec.values().flatten().copied())
            .chain(self.unacked.values().map(|r| r.task))
            .collect();
        v.sort_by_key(|a| (a.farm, a.task, a.attempt));
        v
    }

    /// Sends again what has not been acknowledged: reports, offers of
    /// farms, requests for farm specs, log entries to holders, fetches of
    /// outputs; and tells the coordinator what this node holds, so claims
    /// whose messages were lost are found.
    fn resend(&mut self, now: Millis) {
        self.resend_allocs();
        let farms: Vec<FarmId> = self
            .replicas
            .values()
            .filter(|r| r.home && !r.announced)
            .map(|r| r.id())
            .collect();
        for farm in farms {
            self.fetch_missing(now, farm);
        }
        self.redo_lost(now);
        let redo: Vec<(FarmId, Vec<TaskRun>)> = self
            .replicas
            .values()
            .filter(|r| r.home && !r.redo.is_empty())
            .map(|r| (r.id(), r.redo.values().copied().take(OFFER_MAX).collect()))
            .collect();
        for (farm, tasks) in redo {
            self.send_coordinator(|_| Msg::Redo { farm, tasks });
        }
        let wanted: Vec<FarmId> = self.inputs_wanted.iter().copied().collect();
        for farm in wanted {
            self.actions.push_back(Action::FetchInputs { farm });
        }
        let term = self.term;
        let mut asks = Vec::new();
        if let Some(c) = &mut self.coord {
            let grace = self.cfg.resend_ms;
            for f in c.farms.values_mut() {
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
                        && h.node != self.id
                        && self.members.contains_key(&h.node)
                        && now >= h.at + grace
                    {
                        // Asked to keep a copy and not heard from: again.
                        h.at = now;
                        asks.push((h.node, f.spec.clone()));
                    }
                }
            }
        }
        for (to, farm) in asks {
            self.send(to, Msg::Replicate { term, farm });
        }
        let Some(c) = self.coordinator else { return };
        let term = self.term;
        let tasks = self.holding();
        if c == self.id {
            // The coordinator checks its own claims on itself the same way:
            // a steal whose answer to it was lost leaves a claim nobody holds.
            self.on_holding(now, c, tasks);
        } else {
            self.send(c, Msg::Holding { term, tasks });
        }
        let mut waiting: Vec<FarmId> = self.awaiting_spec.keys().copied().collect();
        waiting.sort();
        for farm in waiting {
            self.send(c, Msg::GetFarm { farm });
        }
        // Not yet acknowledged, so maybe lost: sent again (the coordinator
        // counts each once).
        self.reports_out.extend(self.unacked.values().cloned());
        self.send_reports(now);
        let offers: Vec<(Arc<FarmSpec>, Vec<Entry>, Home)> = self
            .replicas
            .values()
            .filter(|r| !r.accepted && (!r.over || (r.home && !r.announced)))
            .map(|r| {
                (
                    r.spec.clone(),
                    r.log.current().cloned().collect(),
                    r.home_of,
                )
            })
            .collect();
        for (farm, entries, home) in offers {
            self.offer(c, farm, entries, home);
        }
    }

    /// Offers a farm and what is known of it, in messages of bounded size.
    fn offer(&mut self, to: NodeId, farm: Arc<FarmSpec>, entries: Vec<Entry>, home: Home) {
        let id = farm.id;
        let mut chunks = entries.chunks(OFFER_MAX);
        let first = chunks.next().map(<[Entry]>::to_vec).unwrap_or_default();
        self.send(
            to,
            Msg::Submit {
                farm,
                entries: first,
                home,
            },
        );
        for chunk in chunks {
            self.send(
                to,
                Msg::Offer {
                    farm: id,
                    entries: chunk.to_vec(),
                },
            );
        }
    }

    // ----- worker -----

    fn on_assign(
        &mut self,
        now: Millis,
        from: NodeId,
        term: u64,
        tasks: Vec<Assigned>,
        echo: Option<Millis>,
    ) {
        if self.coordinator != Some(from)
            && (term > self.term || (term == self.term && self.coordinator.is_none()))
        {
            // The assignment overtook the new coordinator's first beat.
            self.follow(now, term, from);
        }
        if term < self.term || self.coordinator != Some(from) {
            // A deposed coordinator: fenced off. It learns of the new term from beats.
            return;
        }
        if let Some(at) = echo {
            self.pace.round_trip(now.saturating_sub(at));
            self.update_depth(now);
        }
        for a in tasks {
            self.enqueue(now, from, a);
        }
        self.start_queued(now);
        self.beat_if_piled_up();
    }

    /// Queues a task given by `from` (the coordinator, or a victim of a
    /// steal), asking `from` for the farm's spec when it is not known here.
    fn enqueue(&mut self, now: Millis, from: NodeId, a: Assigned) {
        if let Some(o) = &mut self.observed {
            o.arrived.insert((a.farm, a.task), now);
        }
        if self.specs.contains_key(&a.farm) {
            self.queue.push_back(a);
        } else {
            let first = !self.awaiting_spec.contains_key(&a.farm);
            self.awaiting_spec.entry(a.farm).or_default().push(a);
            if first {
                self.send(from, Msg::GetFarm { farm: a.farm });
            }
        }
    }

    /// Starts queued tasks, in order, while they fit.
    fn start_queued(&mut self, now: Millis) {
        if self.interrupted {
            return;
        }
        let mut i = 0;
        let mut late = Vec::new();
        // Skipping a task that does not fit now lets smaller ones behind it
        // run; the scan is bounded so a long queue costs little.
        while i < self.queue.len() && i < 64 {
            let a = self.queue[i];
            if self.running.contains_key(&(a.farm, a.task)) {
                // Handed here again while another attempt runs (two
                // coordinators across a partition): it waits for that run,
                // whose result answers for it too (see `task_finished`).
                i += 1;
                continue;
            }
            let Some(spec) = self.specs.get(&a.farm) else {
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
                i += 1;
                continue;
            };
            self.queue.remove(i);
            self.lent.give(&grant.resources);
            self.pool_changed = true;
            if let Some(ms) = timeout {
                self.timers
                    .push(Reverse((now.saturating_add(ms), a.farm, a.task, a.attempt)));
            }
            self.running.insert(
                (a.farm, a.task),
                Run {
                    attempt: a.attempt,
                    grant: grant.clone(),
                    killed: None,
                },
            );
            if let Some(o) = &mut self.observed {
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
            self.actions.push_back(Action::Start { task: a, grant });
        }
        if !late.is_empty() {
            self.send_coordinator(|term| Msg::Release { term, tasks: late });
        }
    }

    /// Asks a loaded member for queued tasks when this node has nothing
    /// queued (its own queue runs first) and the coordinator nothing left
    /// to hand out. A node with a free slot asks any member with a queue; a
    /// full one asks only overloaded members, for its next task, so the
    /// ordinary one-task prefetch does not hop from full node to full node.
    fn try_steal(&mut self, now: Millis) {
        if !self.cfg.steal
            || self.interrupted
            || self.steal.is_some()
            || !self.queue.is_empty()
            || !self.awaiting_spec.is_empty()
        {
            // Tasks waiting for their farm's spec are queued too: stealing
            // more before they start would hoard.
            return;
        }
        let backlog = match (&self.coord, self.coordinator) {
            (Some(c), _) => c.engine.backlog(),
            (None, Some(c)) => self.members.get(&c).map_or(0, |m| m.beat.backlog),
            (None, None) => 0,
        };
        if backlog > 0 {
            // The coordinator still has work to hand out; it will.
            return;
        }
        let full = self.pool.free().get(CPU) < Amount::units(1);
        let victims = if full { &self.overloaded } else { &self.loaded };
        let n = victims.len();
        if n == 0 {
            return;
        }
        // Two random choices: nearly as good as asking the most loaded, and
        // thieves do not all pile onto the same victim.
        let (i, j) = (self.rng.random_range(0..n), self.rng.random_range(0..n));
        let (a, b) = (
            victims.get_index(i).expect("in range"),
            victims.get_index(j).expect("in range"),
        );
        let victim = if b.1 > a.1 { *b.0 } else { *a.0 };
        let id = self.next_steal_id;
        self.next_steal_id += 1;
        self.steal = Some((id, victim, now));
        self.stats.steals_asked += 1;
        let total = self.pool.total().clone();
        // Nothing is queued here (checked above): the load is what runs.
        let load = self.pool.used();
        let max = self.cfg.batch_max as u32;
        self.send(
            victim,
            Msg::Steal {
                id,
                total,
                load,
                max,
            },
        );
    }

    fn on_steal(&mut self, from: NodeId, id: u64, total: Resources, mut load: Resources, max: u32) {
        // Give what has not started, oldest first, as much as the thief may
        // hold by the coordinator's own rule: the thief can start it sooner
        // than this node, and tasks keep starting in about the order they
        // were handed out (a long task queued early does not end up last).
        // At most half the queue; to a thief with no free slot only what
        // exceeds this node's own prefetch.
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
            let Some(spec) = self.specs.get(&a.farm) else {
                i += 1;
                continue;
            };
            let req = &spec.def.stages[a.task.stage as usize].resources;
            if !room(
                &total,
                &load,
                req,
                Prefetch::Percent(STEAL_PREFETCH_PERCENT),
            ) {
                i += 1;
                continue;
            }
            load.give(req);
            self.queue.remove(i);
            if let Some(o) = &mut self.observed {
                o.arrived.remove(&(a.farm, a.task));
            }
            given.push(a);
        }
        self.stats.tasks_given += given.len() as u64;
        if !given.is_empty() {
            let tasks = given.clone();
            self.send_coordinator(|term| Msg::Moved {
                term,
                to: from,
                tasks,
            });
        }
        self.send(from, Msg::Stolen { id, tasks: given });
    }

    fn on_stolen(&mut self, now: Millis, from: NodeId, id: u64, tasks: Vec<Assigned>) {
        let current = matches!(self.steal, Some((sid, v, _)) if sid == id && v == from);
        if current {
            if let (Some(o), Some((_, _, asked))) = (&mut self.observed, self.steal) {
                o.latency
                    .record_ms(Latency::StealRtt, now.saturating_sub(asked));
            }
            self.steal = None;
        }
        if tasks.is_empty() {
            if current {
                // Nothing to take there until its next beat says otherwise; try another.
                self.note_queued(from, 0, 0);
                self.try_steal(now);
            }
            return;
        }
        if !current || self.interrupted {
            // Stale: the tasks are this node's now, but it gave up waiting.
            // Hand them back to the coordinator rather than drop them.
            self.send_coordinator(|term| Msg::Release { term, tasks });
            return;
        }
        self.stats.steals_won += 1;
        self.stats.tasks_stolen += tasks.len() as u64;
        for a in tasks {
            self.enqueue(now, from, a);
        }
        self.start_queued(now);
        self.try_steal(now);
    }

    /// Checks the peer's invariants that are cheap enough for every step of
    /// the simulator (no pass over tasks): nothing free beyond its total,
    /// and as coordinator, the engine's cheap checks and one claim per task
    /// the engine counts as running.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.pool
            .check_bounds()
            .map_err(|e| format!("node {}: {e}", self.id))?;
        self.check_coord_counts()
    }

    fn check_coord_counts(&self) -> Result<(), String> {
        if let Some(c) = &self.coord {
            c.engine.check_invariants()?;
            if c.claims.len() != c.engine.live_runs() {
                return Err(format!(
                    "coordinator {}: {} claims, {} tasks running",
                    self.id,
                    c.claims.len(),
                    c.engine.live_runs()
                ));
            }
        }
        Ok(())
    }

    /// The checks of [`Peer::check_tasks`] on what changed since the last
    /// call (the pool against the grants counted as tasks started and ended here, the
    /// nodes whose claims changed, the stages whose runs did), after every
    /// step at a cost that does not grow with the mesh.
    pub fn check_step(&mut self) -> Result<(), String> {
        // Most steps start and end nothing here (messages, beats), and the
        // grants are counted as they come and go: a pass over them after
        // every step was a tenth of a 1,000-node run.
        if std::mem::take(&mut self.pool_changed) {
            self.pool
                .check_bounds()
                .and_then(|()| self.pool.check_lent(&self.lent))
                .map_err(|e| format!("node {}: {e}", self.id))?;
        }
        self.check_coord_counts()?;
        let Some(c) = &mut self.coord else {
            return Ok(());
        };
        c.engine.check_changed_runs()?;
        let mut touched = c.claims.take_touched();
        touched.sort_unstable();
        touched.dedup();
        for n in touched {
            let claimed = c.claims.in_group(&n);
            let booked = c.load.get(&n).map_or(0, |(_, k)| *k);
            if claimed != booked {
                return Err(format!(
                    "coordinator {}: node {n} has {claimed} claims, load says {booked}",
                    self.id
                ));
            }
        }
        Ok(())
    }

    /// The deeper checks, a pass over the peer's tasks: what its pool has
    /// lent matches its running tasks' grants; as coordinator (thousands of
    /// claims), the engine's runs per stage and each node's claims against
    /// the load the coordinator books for it.
    pub fn check_tasks(&self) -> Result<(), String> {
        self.pool
            .check(self.running.values().map(|r| &r.grant))
            .map_err(|e| format!("node {}: {e}", self.id))?;
        let Some(c) = &self.coord else {
            return Ok(());
        };
        c.engine.check_runs()?;
        c.claims.recount()?;
        let mut counts: FxHashMap<NodeId, usize> = FxHashMap::default();
        for (n, ..) in c.claims.values() {
            *counts.entry(*n).or_default() += 1;
        }
        for (n, (_, k)) in &c.load {
            let claimed = counts.get(n).copied().unwrap_or(0);
            if claimed != *k {
                return Err(format!(
                    "coordinator {}: node {n} has {claimed} claims, load says {k}",
                    self.id
                ));
            }
        }
        Ok(())
    }

    /// Every check, the coordinator's counters against a scan of every
    /// task included (see `Engine::audit`): for tests and the end of a
    /// simulation.
    pub fn audit(&self) -> Result<(), String> {
        self.check_invariants()?;
        self.check_tasks()?;
        match &self.coord {
            Some(c) => c.engine.audit(),
            None => Ok(()),
        }
    }

    /// The coordinator's view of a farm's progress, when this node coordinates it.
    pub fn coordinated_progress(&self, farm: FarmId) -> Option<engine::Counts> {
        let c = self.coord.as_ref()?;
        Some(c.engine.progress(c.farms.get(&farm)?.slot))
    }

    /// Which node runs a task now (true), or ran it to its end, as far as
    /// this node knows (as coordinator, or from its copy of the farm).
    pub fn where_ran(&self, farm: FarmId, task: TaskRef) -> Option<(NodeId, bool)> {
        if self.running.contains_key(&(farm, task)) {
            return Some((self.id, true));
        }
        let entry = |log: &FarmLog| match log.get(task) {
            Some(Entry::Done { node, .. } | Entry::Failed { node, .. }) => Some((*node, false)),
            _ => None,
        };
        if let Some(c) = &self.coord {
            if let Some(f) = c.farms.get(&farm) {
                if let Some((node, ..)) = c.claims.get(&(f.slot, task)) {
                    return Some((*node, true));
                }
                if let Some(r) = entry(&f.log) {
                    return Some(r);
                }
            }
        }
        self.replicas.get(&farm).and_then(|r| entry(&r.log))
    }

    /// Whether this node runs the task now.
    pub fn runs(&self, farm: FarmId, task: TaskRef) -> bool {
        self.running.contains_key(&(farm, task))
    }

    /// Every farm whose definition this node has.
    pub fn specs(&self) -> impl Iterator<Item = &Arc<FarmSpec>> {
        self.specs.values()
    }

    /// A farm this node coordinates, as the coordinator knows it: its home,
    /// progress and first `failures_max` failures.
    pub fn coordinated_farm(
        &self,
        farm: FarmId,
        failures_max: usize,
    ) -> Option<(Home, FarmProgress, Vec<Entry>)> {
        let c = self.coord.as_ref()?;
        let f = c.farms.get(&farm)?;
        let counts = c.engine.progress(f.slot);
        let p = FarmProgress {
            farm,
            duplicates: f.duplicates,
            unplaceable: f
                .unplaceable
                .iter()
                .filter(|(s, _)| c.engine.unplaceable(f.slot, *s))
                .cloned()
                .collect(),
            finished: counts.finished(),
            counts,
            stages: c.engine.stage_progress(f.slot),
        };
        let failures = f.log.failures().take(failures_max).cloned().collect();
        Some((f.home, p, failures))
    }

    /// The log of a farm this node coordinates.
    pub fn coordinated_log(&self, farm: FarmId) -> Option<&FarmLog> {
        let c = self.coord.as_ref()?;
        Some(&c.farms.get(&farm)?.log)
    }

    /// Farms this node coordinates.
    pub fn coordinated(&self) -> Vec<FarmId> {
        self.coord.as_ref().map_or(Vec::new(), |c| c.slots.clone())
    }
}

impl CoordFarm {
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

impl Holder {
    fn new(node: NodeId, has_spec: bool) -> Holder {
        Holder {
            node,
            has_spec,
            sent: 0,
            acked: 0,
            at: 0,
            over: false,
        }
    }
}

/// Most entries in one `Sync`, and most sent to a holder ahead of its acknowledgement.
const SYNC_BATCH: usize = 4096;
const SYNC_WINDOW: u64 = 4 * SYNC_BATCH as u64;
/// Most entries in one `Submit` or `Offer` (an entry is tens of bytes, more with outputs).
const OFFER_MAX: usize = 16384;
/// Most outputs a home fetches at once per farm, and after how many
/// resend periods an unanswered fetch is asked again.
const FETCHES_MAX: usize = 64;
const FETCH_RETRY_RESENDS: u64 = 30;

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
        }
    }
}

/// Entries of a farm this node holds, made durable (see [`Persist::Entries`]).
/// Takes the action queue alone, so callers may hold other parts of the peer.
fn persist_entries(
    actions: &mut VecDeque<Action>,
    farm: FarmId,
    entries: Vec<Entry>,
    records: bool,
) {
    if !entries.is_empty() {
        actions.push_back(Action::Persist(Persist::Entries {
            farm,
            entries,
            records,
        }));
    }
}

/// Adds a farm to the coordinator's engine from what is known of it.
fn add_farm(
    c: &mut Coord,
    now: Millis,
    spec: Arc<FarmSpec>,
    records: Vec<(TaskRef, TaskRecord)>,
    entries: Vec<Entry>,
) -> &mut CoordFarm {
    let def = Arc::new(spec.def.clone());
    let slot = c.engine.add_farm(
        now,
        def,
        records,
        &AddOptions {
            run: 1,
            retry_failed: false,
        },
    );
    let mut log = FarmLog::for_farm(&spec.def);
    for e in entries {
        log.add(e);
    }
    c.slots.push(spec.id);
    let home = Home {
        epoch: 0,
        node: spec.origin,
    };
    c.farms.entry(spec.id).or_insert(CoordFarm {
        since: now,
        home,
        slot,
        spec,
        accepted: false,
        log,
        holders: Vec::new(),
        waiting: VecDeque::new(),
        counts_sent: None,
        finished_sent: false,
        duplicates: 0,
        extra_runs: FxHashSet::default(),
        unplaceable: Vec::new(),
    })
}

fn unload(c: &mut Coord, node: NodeId, req: &Resources) {
    let (load, count) = c.load.entry(node).or_default();
    load.take_saturating(req);
    *count = count.saturating_sub(1);
    c.hungry.insert(node);
}

/// Terms are ballots: an election round in the high half and the
/// electing node in the low half, so two nodes that elect themselves in
/// the same round (the two sides of a healing partition) never share a
/// term, and the higher one wins everywhere at once.
pub fn ballot(round: u64, node: NodeId) -> u64 {
    (round << 32) | (node.0 & 0xffff_ffff)
}

/// The election round of a term, as users see it.
pub fn term_round(term: u64) -> u64 {
    term >> 32
}

/// A thief asks for what fits its free resources with this prefetch (and
/// one task beyond full), whatever `Config::prefetch_percent` says: that
/// knob shapes the coordinator's placement (tests raise it to place work
/// badly on purpose), while a steal should move only what the thief will
/// start soon, leaving the rest for other thieves.
const STEAL_PREFETCH_PERCENT: u64 = 110;

/// At most this many tasks claimed by one node at once: bounds a node's queue
/// even for tasks that ask for no resources.
fn claims_cap(total: &Resources) -> usize {
    (total.get(CPU).whole() as usize * 2).max(1) + 2
}

/// How far beyond its capacity a node may be handed tasks.
#[derive(Clone, Copy, Debug)]
enum Prefetch {
    /// Only what fits what is free (the end of some work).
    None,
    /// Up to this percentage of each resource, and always one task beyond
    /// a full node (`--prefetch-percent`, and what a thief may take).
    Percent(u64),
    /// This many tasks beyond those that run at once (the node's measured
    /// depth, see the `pace` module).
    Depth(u64),
}

/// May a node with `total`, already holding `load`, be given one more task
/// asking for `req`, with this much `prefetch`?
fn room(total: &Resources, load: &Resources, req: &Resources, prefetch: Prefetch) -> bool {
    if !Pool::ever_fits(total, req) {
        return false;
    }
    // For a depth: the node runs `slots` such tasks at once, and may hold
    // `slots + depth` of them, on every resource they use.
    let slots = match prefetch {
        Prefetch::Depth(_) => engine::copies(total, req).max(1),
        _ => 1,
    };
    req.iter().all(|(k, v)| {
        let t = total.get(k).0;
        let l = load.get(k).0;
        match prefetch {
            Prefetch::None => l + v.0 <= t,
            Prefetch::Percent(pct) => l + v.0 <= t * pct / 100 || l <= t,
            Prefetch::Depth(d) => {
                l + v.0 <= (t as u128 * (slots + d) as u128 / slots as u128) as u64
            }
        }
    })
}

/// The prefetch depth of a node that has measured nothing yet: the old
/// fixed rule's (the steal prefetch), a tenth of its cpus and one.
fn base_depth(total: &Resources) -> u32 {
    (total.get(CPU).whole() * (STEAL_PREFETCH_PERCENT - 100) / 100) as u32 + 1
}
