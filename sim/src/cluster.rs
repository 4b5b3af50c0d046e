//! The event loop: many real mesh peers on one virtual clock, with a network, task runs and faults between them.
//!
//! Every input a peer gets goes through its real API (`handle_message`,
//! `handle_timeout`, `submit`, `task_finished`, `interrupt`,
//! `restore_farm`), and every action it asks for is carried out here:
//! persists go to the node's [`MemStore`] and are flushed before anything
//! else of the same step happens, messages become deliveries after a drawn
//! latency (unless lost or cut off by a partition), starts become task ends
//! after the task's drawn duration. Events are ordered by (virtual time,
//! sequence number), and every random draw comes from the scenario's seed,
//! so a run replays exactly.
//!
//! After every step the stepped peer's invariants are checked on what the
//! step changed (`Peer::check_step`), the same as a pass over its tasks
//! every `check_every`-th step if asked, and everything, with the scan of
//! every task's status that backs the progress counters, at the end. Plus
//! the simulator's own: a start fits what is free on
//! its node, no task runs to completion twice in a run without faults, and
//! at the end no task that should succeed is missing. A violation stops the
//! run with an error naming the seed.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::sync::Arc;
use std::time::Instant;

use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use rustc_hash::{FxHashMap, FxHashSet};

use mesh_protocol::engine::{Millis, Outcome, TaskResult};
use mesh_protocol::farm::{CommandTemplate, FarmDef, StageDef, Sweep, Template};
use mesh_protocol::mesh::{
    void_place, Action, Assigned, Config, FarmId, FarmSpec, Fetched, Msg, NodeId, OutputFile, Peer,
    PeerEvent, QuietSwim,
};
use mesh_protocol::resources::{parse_resources, CPU};
use mesh_protocol::{Resources, TaskRef};
use mesh_store::{MemStore, MeshState, Store};

mod batch;
mod ev;
mod events;
mod heal;
mod plan;
mod runs;
mod upkeep;

use ev::Ev;
use plan::Plan;

use crate::dist::{parse_durations, Dist};
use crate::queue::Calendar;
use crate::report::{Execution, SimReport, Timeline, Traffic};
use crate::scenario::SimConfig;
use crate::workflow::{Links, Read, Replay, Workload};
use crate::SimError;

/// The simulated farm's id.
const FARM: FarmId = FarmId(1);
/// Most executions kept for the picture.
const SAMPLE_MAX: usize = 2000;
/// The stream of per-task draws of a workflow's runtimes (see `mix`).
const JITTER: u64 = 0x6a17;
/// How many events a run bounded in wall-clock time steps between looks at the clock.
const WALL_EVERY: u64 = 1 << 14;
/// No node ran the task (yet).
const NOWHERE: u32 = u32::MAX;

/// Whether a stage asking `req` fits a machine of `total` at all.
fn fits(total: &Resources, req: &Resources) -> bool {
    mesh_protocol::pool::Pool::never_fits(total, req).is_empty()
}

/// Keeps messages' draws apart from the other streams `mix` seeds.
const MESSAGE_SALT: u64 = 0x6d65_7373_6167_6573;

/// A hash of the seed and a few numbers, for per-task draws that do not
/// depend on the order the run happens to take.
fn mix(seed: u64, a: u64, b: u64) -> u64 {
    let mut x =
        seed ^ a.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ b.wrapping_mul(0xc2b2_ae3d_27d4_eb4f);
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x
}

/// Runs a scenario to its end and reports what happened.
pub fn run(cfg: &SimConfig) -> Result<SimReport, SimError> {
    cfg.validate()?;
    run_planned(cfg, Plan::new)
}

/// Runs a scenario as [`run`] does, but gives up once its farm is still
/// running `past_ms` after its submission: None then. What a deadline's
/// search asks of a node count, which a run past the deadline has
/// answered (a count too few would otherwise run its whole long farm).
pub fn run_within(cfg: &SimConfig, past_ms: Millis) -> Result<Option<SimReport>, SimError> {
    Ok(match run_bounded(cfg, past_ms, None)? {
        Within::Ended(r) => Some(*r),
        Within::Past { .. } | Within::OutOfTime { .. } => None,
    })
}

/// How a run bounded by [`run_bounded`] ended.
#[derive(Debug)]
pub enum Within {
    /// Its farm ended in time: the whole run, report for report as [`run`].
    Ended(Box<SimReport>),
    /// Its farm was still running past the time given: it ends later,
    /// about `projected_ms` at its pace so far (see `OutOfTime`).
    Past { projected_ms: Option<Millis> },
    /// The wall-clock time given ran out first, this far into the
    /// run's virtual time (counted from the farm's submission): the
    /// answer is not known. `projected_ms`: where the farm would end
    /// at its pace so far (see `Sim::projected`), once a task has.
    OutOfTime {
        at_ms: Millis,
        projected_ms: Option<Millis>,
    },
}

/// [`run_within`], and stopped once the wall clock reaches `stop`: a
/// search with a time to answer in says which count it could not finish
/// rather than overrunning it.
pub fn run_bounded(
    cfg: &SimConfig,
    past_ms: Millis,
    stop: Option<Instant>,
) -> Result<Within, SimError> {
    cfg.validate()?;
    let mut sim = Sim::new(cfg, Plan::new(cfg)?.with_baselines());
    sim.give_up_past = Some(past_ms);
    sim.stop_wall = stop;
    sim.schedule_scenario();
    let wall = Instant::now();
    match sim.run_loop() {
        Ok(()) => Ok(Within::Ended(Box::new(
            sim.report(wall.elapsed().as_secs_f64()),
        ))),
        Err(_) if sim.out_of_time => Ok(Within::OutOfTime {
            at_ms: sim.now.saturating_sub(sim.submitted_at),
            projected_ms: sim.projected(),
        }),
        Err(_) if sim.gave_up => Ok(Within::Past {
            projected_ms: sim.projected(),
        }),
        Err(e) => Err(e),
    }
}

/// The baselines of a scenario's farm on its nodes, without running it:
/// the lower bound and greedy list scheduling's makespan (see
/// [`SimReport::greedy`]), each a pass over the planned tasks. A deadline's
/// search starts where greedy meets it: the mesh comes within a few
/// percent of greedy, and each simulation of a long farm costs minutes.
pub fn baselines(cfg: &SimConfig) -> Result<(Millis, Millis), SimError> {
    cfg.validate()?;
    let plan = Plan::new(cfg)?;
    Ok((plan.lower_bound, plan.greedy(false)))
}

/// [`baselines`] of a recorded workflow on a checked scenario's cluster
/// (greedy over its graph), without running it.
pub(crate) fn workload_baselines(
    cfg: &SimConfig,
    wl: &Workload,
    replay: &Replay,
) -> Result<(Millis, Millis), SimError> {
    let plan = Plan::for_workload(cfg, wl, replay)?;
    Ok((plan.lower_bound, plan.greedy(false)))
}

/// Runs a recorded workflow on the cluster of a checked scenario.
pub(crate) fn run_workload(
    cfg: &SimConfig,
    wl: &Workload,
    replay: &Replay,
) -> Result<SimReport, SimError> {
    run_planned(cfg, |cfg| Plan::for_workload(cfg, wl, replay))
}

/// Runs the farm `plan` makes of a checked scenario.
fn run_planned(
    cfg: &SimConfig,
    plan: impl FnOnce(&SimConfig) -> Result<Plan, SimError>,
) -> Result<SimReport, SimError> {
    let plan = Arc::new(plan(cfg)?);
    // The baselines are list schedules of every task (a tenth of a second
    // for a million): computed on another core while the run goes.
    std::thread::scope(|s| {
        let beside = Arc::clone(&plan);
        let baselines = s.spawn(move || beside.baselines());
        let mut sim = Sim::new(cfg, plan);
        sim.schedule_scenario();
        let wall = Instant::now();
        let ran = sim.run_loop();
        let (greedy, longest_first) = baselines.join().expect("a list schedule cannot panic");
        ran?;
        let wall_s = wall.elapsed().as_secs_f64();
        let plan = Arc::get_mut(&mut sim.plan).expect("the baselines' copy is dropped");
        (plan.greedy, plan.longest_first) = (greedy, longest_first);
        Ok(sim.report(wall_s))
    })
}

/// How often the simulator looks at whether the mesh is one.
const MESH_CHECK_MS: Millis = 1000;

/// A task running on a node, as the simulator sees it.
struct Run {
    attempt: u32,
    token: u64,
    res: Resources,
    start: Millis,
    killed: bool,
}

struct Node {
    id: NodeId,
    total: Resources,
    cpus: f64,
    peer: Option<Peer>,
    /// Incarnation: raised by a crash, so events of the dead one are ignored.
    gen: u32,
    store: MemStore,
    /// Whether the scenario restarts this node: only a restart reads the
    /// store back, so a node that never restarts skips writing it (at
    /// 1,000 nodes the stores were a third of the run's memory and a tenth
    /// of its time, for nothing that could be read).
    durable: bool,
    /// How the peer's persists map to the store (the node's own mapping).
    book: MeshState,
    timer: Option<Millis>,
    runs: FxHashMap<TaskRef, Run>,
    /// What the runs here hold: checked against `total` at every start.
    used: Resources,
    up_since: Option<Millis>,
    up_ms: u64,
    steps: u64,
    /// The peer's prefetch depth when a task last ended here.
    depth: u32,
    /// The batch job (an allocation queue's) that started this node, and
    /// when it drains: told to its peer before its first step, so even
    /// its first beat carries them.
    job: Option<(String, Millis)>,
    /// While stalled: what came for it, in order, handled when it resumes.
    held: Vec<Ev>,
    /// While slow: until when (virtual microseconds) it is busy with the
    /// messages that reached it, one after another.
    busy_until_us: u64,
    /// On a workflow's home: tasks started here that wait, holding their
    /// resources, until the outputs they depend on are here, as a real
    /// home waits (`deps_here` in the node); with how many of their
    /// dependencies were found here so far.
    /// And since when they hold them.
    waiting: Vec<(Assigned, Resources, u64, Millis)>,
    /// Leaving (interrupted, or its batch job draining) since then: it
    /// goes once its peer may stop, as a real node does (`may_stop`).
    leaving: Option<Millis>,
    /// Until when it sends a file the home asked of it.
    serving_until: Millis,
    /// The heartbeat whose report the simulator sends for the peer at its
    /// timer (`Peer::poll_promise`), as the peer's last step promised it,
    /// and the wake the peer needs after it.
    promised: Option<Millis>,
    after_promise: Option<Millis>,
}

impl Node {
    fn new(i: usize, total: Resources) -> Node {
        Node {
            id: NodeId(i as u64 + 1),
            cpus: total.get(CPU).as_f64(),
            total,
            peer: None,
            gen: 0,
            store: MemStore::new(),
            durable: false,
            book: MeshState::default(),
            timer: None,
            runs: FxHashMap::default(),
            used: Resources::new(),
            up_since: None,
            up_ms: 0,
            steps: 0,
            depth: 0,
            job: None,
            held: Vec::new(),
            busy_until_us: 0,
            waiting: Vec::new(),
            leaving: None,
            serving_until: 0,
            promised: None,
            after_promise: None,
        }
    }
}

struct Sim<'a> {
    cfg: &'a SimConfig,
    plan: Arc<Plan>,
    faults: bool,
    now: Millis,
    /// Events by time and then order of scheduling.
    queue: Calendar<Ev>,
    /// Draws not tied to one message: the round trips of fetches.
    rng: SmallRng,
    /// This millisecond's messages so far, by link and kind: a message's
    /// latency and loss are drawn from the seed, its link, kind, moment
    /// and this count alone (see `message_draws`).
    link_sent: FxHashMap<(u32, u32, usize), u32>,
    link_ms: Millis,
    nodes: Vec<Node>,
    /// Indices of nodes that are up, ascending.
    alive: Vec<u32>,
    next_token: u64,
    /// Per task: executions that ran to completion, and executions live now.
    completions: Vec<u16>,
    live: Vec<u16>,
    ok_done: Vec<bool>,
    executions: u64,
    duplicates: u64,
    makespan: Millis,
    busy_cpu_ms: f64,
    /// Every message, by kind, with its size on the wire.
    traffic: Traffic,
    /// `traffic` when the farm was submitted (what joining and idling
    /// cost), and when it finished.
    traffic_before: Traffic,
    traffic_end: Option<(Millis, Traffic)>,
    lost: u64,
    events: u64,
    /// The farm's events, upkeep or change, for the speed line.
    upkeep: upkeep::Tally,
    finished: bool,
    /// When the farm was submitted (`submit_at_ms`, or once its queues are there).
    submitted_at: Millis,
    /// See [`run_within`]; `gave_up` once it has.
    give_up_past: Option<Millis>,
    gave_up: bool,
    /// See [`run_bounded`]; `out_of_time` once it came, looked at every
    /// `WALL_EVERY` events (a look at the clock costs more than an event).
    stop_wall: Option<Instant>,
    out_of_time: bool,
    /// Tasks not in `ok_done` yet: while any is left past the time given,
    /// its end (and so the makespan) comes later.
    ok_left: usize,
    unplaceable: Vec<String>,
    timeline: Timeline,
    sample: Vec<Execution>,
    sample_stride: usize,
    /// Tasks failed by the crash limit (see `SimReport::crash_limited`).
    crash_limited: u64,
    /// The last node seen coordinating in each term.
    coords: FxHashMap<u64, u32>,
    /// The submitting node crashes and never comes back: the farm ends at
    /// the coordinator, with no home to bring outputs to.
    home_lost: bool,
    /// Counters of peers that crashed or left, so their steals still count.
    gone_stats: mesh_protocol::mesh::Stats,
    /// The stepped peer's actions, carried out after its persists.
    actions: VecDeque<Action>,
    /// The batch system behind the scenario's allocation queues.
    batch: batch::Batch,
    /// `MESH_SIM_TRACE`, read once: the environment is not cheap to ask per message.
    trace: Option<u32>,
    /// Every node that ever coordinated.
    coordinators: std::collections::BTreeSet<u32>,
    /// Since when the mesh has been one at every look (`one_mesh`), and
    /// when the last look found it so; why not, when it did not.
    one_mesh_since: Option<Millis>,
    one_mesh_at: Option<Millis>,
    not_one_mesh: Option<String>,
    /// The longest a message waited in a slow node's queue.
    slow_wait_ms: Millis,
    /// Per task: the node whose run of it first succeeded (where its
    /// files are), for a workflow's transfers.
    ran_on: Vec<u32>,
    /// (node, file) of a workflow's files each node has brought: a node
    /// brings a file once.
    brought: FxHashSet<(u32, u32)>,
    /// Per node: when a workflow's inputs are there (`None`: not asked yet).
    inputs_at: FxHashMap<u32, Millis>,
    moved_bytes: u64,
    stage_in_ms: u64,
    /// The latest end of a task run begun so far, and of the scenario's
    /// scripted events: without a time limit, a run with work left is
    /// stuck once [`crate::QUIET_MS`] pass beyond both.
    busy_until: Millis,
    scripted_until: Millis,
    /// Workers' reports are sent for them, without a wake, where nothing
    /// else is due (quiet timers skipped, no node stalled or slow, whose
    /// wakes and messages wait); their coordinator takes what tells it
    /// nothing new without a step in the same runs.
    promises: bool,
    /// A membership ack in closed form is taken when it is sent (see
    /// `send_quiet`): nothing can come between it and its arrival (no
    /// fault, no node that joins late by a dial), and quiet timers are
    /// skipped; quiet pings are answered at their arrival without a step.
    acks_when_sent: bool,
}

impl<'a> Sim<'a> {
    fn new(cfg: &'a SimConfig, plan: impl Into<Arc<Plan>>) -> Sim<'a> {
        let plan = plan.into();
        let nodes: Vec<Node> = plan
            .totals
            .iter()
            .enumerate()
            .map(|(i, t)| Node::new(i, t.clone()))
            .collect();
        let tasks = plan.durations.len();
        let timeline = Timeline::new(nodes.iter().map(|n| n.cpus).collect());
        let faults = cfg.has_faults();
        Sim {
            cfg,
            faults,
            coords: FxHashMap::default(),
            crash_limited: 0,
            home_lost: cfg
                .crashes
                .iter()
                .any(|c| c.node == cfg.submit_node && c.restart_after_ms.is_none()),
            now: 0,
            queue: Calendar::new(),
            rng: SmallRng::seed_from_u64(mix(cfg.seed, 0, 0)),
            link_sent: FxHashMap::default(),
            link_ms: 0,
            nodes,
            alive: Vec::new(),
            next_token: 1,
            completions: vec![0; tasks],
            live: vec![0; tasks],
            ok_done: vec![false; tasks],
            executions: 0,
            duplicates: 0,
            makespan: 0,
            busy_cpu_ms: 0.0,
            traffic: Traffic::default(),
            traffic_before: Traffic::default(),
            traffic_end: None,
            lost: 0,
            events: 0,
            upkeep: upkeep::Tally::default(),
            finished: false,
            submitted_at: cfg.submit_at_ms,
            give_up_past: None,
            gave_up: false,
            stop_wall: None,
            out_of_time: false,
            ok_left: tasks,
            unplaceable: Vec::new(),
            timeline,
            sample: Vec::new(),
            sample_stride: (tasks / (SAMPLE_MAX / 2)).max(1),
            gone_stats: Default::default(),
            actions: VecDeque::new(),
            trace: trace_task(),
            coordinators: Default::default(),
            one_mesh_since: None,
            one_mesh_at: None,
            not_one_mesh: None,
            slow_wait_ms: 0,
            ran_on: if plan.io.is_some() {
                vec![NOWHERE; tasks]
            } else {
                Vec::new()
            },
            brought: FxHashSet::default(),
            inputs_at: FxHashMap::default(),
            moved_bytes: 0,
            stage_in_ms: 0,
            busy_until: 0,
            scripted_until: scripted_until(cfg),
            promises: !cfg.step && cfg.stall.is_empty() && cfg.slow.is_empty(),
            acks_when_sent: !cfg.step && !faults && cfg.introduce.is_empty(),
            batch: batch::Batch::new(cfg),
            plan,
        }
    }

    fn push(&mut self, at: Millis, ev: Ev) {
        self.queue.push(at, ev.key(), ev);
    }

    fn schedule_scenario(&mut self) {
        let mut order: Vec<(u64, usize)> = Vec::new();
        let mut i = 0;
        for g in &self.cfg.nodes {
            for _ in 0..g.count {
                order.push((g.join_at_ms, i));
                i += 1;
            }
        }
        for (at, n) in order {
            self.push(at, Ev::Up(n as u32));
        }
        // `mesh alloc add` before `mesh submit` when both come at once, as
        // a user would: the farm then finds the queues' shapes among the
        // machines it may wait for.
        self.schedule_alloc();
        self.push(self.cfg.submit_at_ms, Ev::Submit);
        for c in &self.cfg.crashes {
            self.push(c.at_ms, Ev::Crash(c.node as u32));
            if let Some(after) = c.restart_after_ms {
                self.nodes[c.node].durable = true;
                self.push(c.at_ms + after, Ev::Restart(c.node as u32));
            }
        }
        for l in &self.cfg.leaves {
            self.push(l.at_ms, Ev::Leave(l.node as u32));
        }
        for s in &self.cfg.stall {
            self.push(s.until_ms, Ev::Resume(s.node as u32));
        }
        for i in &self.cfg.introduce {
            self.push(
                i.at_ms,
                Ev::Introduce {
                    node: i.node as u32,
                    to: i.to as u32,
                },
            );
        }
        if self.cfg.one_mesh {
            self.push(MESH_CHECK_MS, Ev::MeshCheck);
        }
    }

    /// One more node, of batch job `job` which drains at `deadline`.
    fn add_node(&mut self, total: Resources, job: String, deadline: Millis) -> usize {
        let n = self.nodes.len();
        let mut nd = Node::new(n, total);
        nd.job = Some((job, deadline));
        self.timeline.cpus.push(nd.cpus);
        self.timeline.busy.push(Vec::new());
        self.nodes.push(nd);
        n
    }

    fn violation(&self, message: String) -> SimError {
        SimError::Invariant {
            seed: self.cfg.seed,
            at_ms: self.now,
            message,
        }
    }

    fn run_loop(&mut self) -> Result<(), SimError> {
        while let Some((at, ev)) = self.queue.pop() {
            let limit = self
                .cfg
                .max_time_ms
                .unwrap_or_else(|| self.busy_until.max(self.scripted_until) + crate::QUIET_MS);
            if at > limit {
                if self.finished && (!self.cfg.one_mesh || self.one_mesh_at.is_some()) {
                    // Done; only batch jobs were still to give back.
                    return Ok(());
                }
                break;
            }
            if self
                .give_up_past
                .is_some_and(|past| self.ok_left > 0 && at > self.submitted_at + past)
            {
                self.gave_up = true;
                break;
            }
            if self.events.is_multiple_of(WALL_EVERY)
                && self.stop_wall.is_some_and(|s| Instant::now() >= s)
            {
                self.out_of_time = true;
                break;
            }
            self.now = at;
            self.events += 1;
            let seen = self.seen(&ev);
            self.upkeep.see(at, seen);
            self.handle(ev)?;
            // With allocation queues, the run goes on until the jobs the
            // farm no longer needs are given back: the scale in; with
            // `one_mesh`, until a look finds the mesh one.
            if self.finished && self.alloc_settled() && self.one_mesh_now() {
                return Ok(());
            }
        }
        Err(SimError::Stuck {
            seed: self.cfg.seed,
            at_ms: self.now,
            message: self.stuck_reason(),
        })
    }

    /// Whether the look just taken found the mesh one (or none is asked for).
    fn one_mesh_now(&self) -> bool {
        !self.cfg.one_mesh || self.one_mesh_at == Some(self.now)
    }

    fn stuck_reason(&self) -> String {
        let why = match self.cfg.max_time_ms {
            Some(ms) => format!("the scenario's time limit (max_time_ms = {ms}) came with"),
            None => format!(
                "nothing started or ended for {} with",
                crate::report::duration(crate::QUIET_MS)
            ),
        };
        if self.finished {
            return format!(
                "{why} the farm over but the mesh not one: {}",
                self.not_one_mesh.as_deref().unwrap_or("not looked at")
            );
        }
        let left: Vec<usize> = (0..self.ok_done.len())
            .filter(|&g| self.plan.expect_ok[g] && !self.ok_done[g])
            .collect();
        let mut words = format!(
            "{why} {} of {} tasks not done (the first: {})",
            left.len(),
            self.ok_done.len(),
            left.iter()
                .take(3)
                .map(|&g| self.plan.task_name(g))
                .collect::<Vec<_>>()
                .join(", ")
        );
        let coord = self.alive.iter().find_map(|&n| {
            let p = self.nodes[n as usize].peer.as_ref()?;
            Some((p.id(), p.coordinated_progress(FARM)?))
        });
        match coord {
            Some((id, c)) => words += &format!(
                "; its coordinator, node {}, counts {} done, {} running, {} waiting, {} failed, {} skipped",
                id.0,
                c.done,
                c.running,
                c.queued(),
                c.failed,
                c.skipped
            ),
            None => words += "; no live node coordinates it",
        }
        if let Some(r) = self.nodes[self.cfg.submit_node]
            .peer
            .as_ref()
            .and_then(|p| p.replica(FARM))
        {
            words += &format!(
                "; its home has {} of its log, {} outputs missing, {} being fetched, {} runs redone and not back",
                r.next,
                r.missing_count(),
                r.fetching.len(),
                r.redo.len(),
            );
        }
        if !self.unplaceable.is_empty() {
            words += &format!("; {}", self.unplaceable.join("; "));
        }
        words
    }

    fn handle(&mut self, ev: Ev) -> Result<(), SimError> {
        let now = self.now;
        let ev = match self.for_stalled(ev) {
            Some(ev) => ev,
            None => return Ok(()),
        };
        match ev {
            Ev::Up(n) => self.start_node(n as usize, false),
            Ev::Restart(n) => {
                if self.nodes[n as usize].peer.is_none() {
                    self.start_node(n as usize, true)?;
                }
                Ok(())
            }
            Ev::Deliver { to, from, msg } => {
                if !self.reaches(from as usize, to as usize) {
                    return Ok(());
                }
                let gen = self.nodes[to as usize].gen;
                self.arrived(to as usize, gen, from, msg)
            }
            Ev::Arrived { to, gen, from, msg } => self.arrived(to as usize, gen, from, msg),
            Ev::QuietSwim { to, from, q } => self.quiet_arrived(to as usize, from as usize, *q),
            Ev::Served { to, gen, from, msg } => {
                if self.nodes[to as usize].gen != gen {
                    return Ok(());
                }
                let from = self.nodes[from as usize].id;
                self.step(to as usize, |p| p.handle_message(now, from, *msg))
            }
            Ev::Resume(n) => {
                for ev in std::mem::take(&mut self.nodes[n as usize].held) {
                    self.handle(ev)?;
                }
                Ok(())
            }
            Ev::Wake { node, gen } => {
                if self.nodes[node as usize].gen != gen {
                    return Ok(());
                }
                self.step(node as usize, |p| p.handle_timeout(now))
            }
            Ev::Introduce { node, to } => {
                let (n, t) = (node as usize, to as usize);
                // A dial that cannot get through introduces no one.
                if self.nodes[t].peer.is_none() || self.partitioned(n, t) {
                    return Ok(());
                }
                let id = self.nodes[t].id;
                self.step(n, |p| p.introduce(now, id, String::new(), Vec::new()))
            }
            Ev::MeshCheck => self.check_one_mesh(),
            Ev::Timer { node, gen } => {
                if !self.timer_armed(node, gen) {
                    return Ok(());
                }
                let nd = &mut self.nodes[node as usize];
                nd.timer = None;
                if nd.promised == Some(now) {
                    self.report_promised(node as usize);
                    return Ok(());
                }
                self.step(node as usize, |p| p.handle_timeout(now))
            }
            Ev::TaskEnd {
                node,
                gen,
                task,
                token,
            } => self.task_end(node as usize, gen, task, token),
            Ev::Submit => self.submit_farm(),
            Ev::Crash(n) => {
                self.stop_node(n as usize, true);
                Ok(())
            }
            Ev::Leave(n) => {
                if self.nodes[n as usize].peer.is_some() {
                    self.step(n as usize, |p| p.interrupt(now))?;
                    // The kills end at `now`; the node goes once its
                    // releases are out and the home has its outputs.
                    self.nodes[n as usize].leaving.get_or_insert(now);
                    self.push(now + 1, Ev::Gone(n));
                }
                Ok(())
            }
            Ev::Gone(n) => {
                // A look for a leave that is over: the node crashed meanwhile
                // (and may be up again, in a life of its own).
                if self.nodes[n as usize].leaving.is_none() {
                    return Ok(());
                }
                match self.may_go(n as usize) {
                    Some(later) => self.push(later, Ev::Gone(n)),
                    None => self.stop_node(n as usize, false),
                }
                Ok(())
            }
            Ev::AllocAdd(q) => self.alloc_add(q as usize),
            Ev::BatchAnswer { node, gen, answer } => self.batch_answer(node as usize, gen, *answer),
            Ev::JobStart(j) => self.job_start(j as usize),
            Ev::JobEnd { job, cancelled } => {
                self.job_end(job as usize, cancelled);
                Ok(())
            }
            Ev::JobKill(j) => {
                self.job_kill(j as usize);
                Ok(())
            }
            Ev::InputsReady { node, gen, farm } => {
                if self.nodes[node as usize].gen != gen {
                    return Ok(());
                }
                self.step(node as usize, |p| p.inputs_ready(now, farm, true))
            }
            Ev::Fetched {
                home,
                gen,
                from,
                task,
            } => self.fetched_home(home, gen, from, task),
        }
    }

    fn partitioned(&self, a: usize, b: usize) -> bool {
        self.cfg.partitions.iter().any(|p| {
            (p.from_ms..p.until_ms).contains(&self.now)
                && p.nodes.contains(&a) != p.nodes.contains(&b)
        })
    }

    fn start_node(&mut self, n: usize, restart: bool) -> Result<(), SimError> {
        let now = self.now;
        // As a user joins a node to the mesh: through another, here the
        // lowest one up that it can reach (membership finds the rest). The
        // first up on its side founds a mesh; a restarted node rejoins the
        // peers it knew, and first listens for their coordinator too.
        let via = self
            .alive
            .iter()
            .find(|&&a| a as usize != n && !self.partitioned(n, a as usize))
            .map(|&a| self.nodes[a as usize].id);
        let joining = restart || via.is_some();
        let nd = &mut self.nodes[n];
        let seed = mix(self.cfg.seed, n as u64 + 1, nd.gen as u64 + 1);
        let mut peer = Peer::new(
            now,
            nd.id,
            nd.total.clone(),
            self.plan.peer_cfg.clone(),
            seed,
            joining,
        );
        if !nd.durable {
            peer.keep_no_store();
        }
        if let Some((job, deadline)) = &nd.job {
            peer.set_batch_job(Some(job.clone()), Some(*deadline));
        }
        // Each restart's life above any its last life renewed itself to
        // (once each time it was declared dead and came back).
        peer.set_address(now, String::new(), Vec::new(), (nd.gen as u64 + 1) << 32);
        if via.is_some() && !restart {
            // `mesh join`: never alone before a node there says whom it follows.
            peer.joins_by_address();
        }
        if let Some(via) = via {
            peer.introduce(now, via, String::new(), Vec::new());
        }
        if restart {
            // Whatever this node made durable before it died, read back as the node reads it.
            let (book, farms, held) = MeshState::load(&nd.store)?;
            nd.book = book;
            for (stored, finished) in farms {
                peer.restore_farm(stored, finished);
            }
            peer.restore_unacked(held);
            if let Some(b) = MeshState::load_allocs(&nd.store)? {
                peer.restore_allocs(b);
            }
        }
        nd.peer = Some(peer);
        nd.up_since = Some(now);
        if let Err(i) = self.alive.binary_search(&(n as u32)) {
            self.alive.insert(i, n as u32);
        }
        self.after_step(n)
    }

    /// Whether leaving node `n` may go now (None), as the node's driver
    /// judges it: once nothing runs there, its results are acknowledged
    /// and it has sent no file for `linger_quiet_ms`, or `linger_max_ms`
    /// after it began to leave; at once when it is alone. Else when to
    /// look again.
    fn may_go(&self, n: usize) -> Option<Millis> {
        let nd = &self.nodes[n];
        let (Some(since), Some(peer)) = (nd.leaving, nd.peer.as_ref()) else {
            return None;
        };
        let cfg = peer.config();
        let until = since + cfg.linger_max_ms;
        if self.now >= until || peer.member_count() == 0 && peer.reported() {
            return None;
        }
        let quiet = nd.serving_until.max(since) + cfg.linger_quiet_ms;
        if peer.idle() && self.now >= quiet {
            return None;
        }
        // Not idle yet: looked at again as its driver looks, a heartbeat on.
        let next = if peer.idle() {
            quiet
        } else {
            self.now + cfg.heartbeat_ms
        };
        Some(next.min(until))
    }

    /// A crash (the store loses its unflushed tail) or the end of a leave.
    fn stop_node(&mut self, n: usize, crash: bool) {
        let now = self.now;
        let nd = &mut self.nodes[n];
        nd.leaving = None;
        let Some(peer) = nd.peer.take() else { return };
        let s = peer.stats();
        self.gone_stats.steals_asked += s.steals_asked;
        self.gone_stats.steals_won += s.steals_won;
        self.gone_stats.tasks_stolen += s.tasks_stolen;
        self.gone_stats.quiet_timers += s.quiet_timers;
        nd.gen += 1;
        nd.timer = None;
        nd.promised = None;
        nd.after_promise = None;
        if crash {
            nd.store.crash();
        }
        if let Some(since) = nd.up_since.take() {
            nd.up_ms += now - since;
        }
        let runs: Vec<(TaskRef, Run)> = nd.runs.drain().collect();
        nd.used = Resources::new();
        // What waited for a stalled process, or in a slow one's queue, goes with it.
        nd.held.clear();
        nd.busy_until_us = 0;
        nd.waiting.clear();
        for (t, r) in runs {
            self.end_run(n, t, &r, false);
        }
        if let Ok(i) = self.alive.binary_search(&(n as u32)) {
            self.alive.remove(i);
        }
    }

    /// Books a run that is over (completed, killed, or gone with its node).
    fn end_run(&mut self, n: usize, t: TaskRef, r: &Run, completed: bool) {
        let g = self.plan.global(t);
        self.live[g] = self.live[g].saturating_sub(1);
        let cpu = r.res.get(CPU).as_f64();
        self.busy_cpu_ms += cpu * (self.now - r.start) as f64;
        if self.nodes[n].job.is_some() {
            self.batch.busy_cpu_ms += cpu * (self.now - r.start) as f64;
        }
        self.timeline.add(n, r.start, self.now, cpu);
        if (t.index as usize).is_multiple_of(self.sample_stride) && self.sample.len() < SAMPLE_MAX {
            self.sample.push(Execution {
                node: n as u32,
                stage: t.stage,
                index: t.index,
                start: r.start,
                end: self.now,
                completed,
            });
        }
    }

    /// Feeds one input to a peer, then carries out its actions and checks.
    /// A node's timer event is the one it armed last, in its life now, and
    /// it is up: the wake is due (others were superseded).
    pub(super) fn timer_armed(&self, node: u32, gen: u32) -> bool {
        let nd = &self.nodes[node as usize];
        nd.gen == gen && nd.timer == Some(self.now) && nd.peer.is_some()
    }

    fn step(&mut self, n: usize, input: impl FnOnce(&mut Peer)) -> Result<(), SimError> {
        let Some(peer) = self.nodes[n].peer.as_mut() else {
            return Ok(());
        };
        input(peer);
        self.after_step(n)
    }

    fn after_step(&mut self, n: usize) -> Result<(), SimError> {
        // The step may have brought what a waiting task depends on (the
        // log's sync, an output fetched home), as the node looks at every step.
        if !self.nodes[n].waiting.is_empty() {
            self.start_waiting(n);
        }
        // Reused from step to step, swapped with the peer's own queue:
        // taking the actions one by one copied each (160 bytes) twice.
        let mut rest = std::mem::take(&mut self.actions);
        {
            let nd = &mut self.nodes[n];
            let peer = nd.peer.as_mut().expect("stepped peers are up");
            peer.take_actions(&mut rest);
            if nd.durable {
                // Persist before act: the batch is durable before any action after it.
                let mut writes = Vec::new();
                let mut acts = VecDeque::with_capacity(rest.len());
                for a in rest.drain(..) {
                    match a {
                        Action::Persist(p) => nd.book.writes(p, &mut writes),
                        other => acts.push_back(other),
                    }
                }
                rest = acts;
                if !writes.is_empty() {
                    nd.store
                        .write(writes)
                        .expect("the memory store cannot fail");
                    nd.store.flush().expect("the memory store cannot fail");
                }
            }
        }
        for a in rest.drain(..) {
            match a {
                Action::Send { to, msg } => self.send(n, to, msg),
                Action::Swim { to, data } => self.send(n, to.id, Msg::Swim(data)),
                Action::QuietSwim(q) => self.send_quiet(n, q),
                Action::Start { task, grant } => {
                    self.upkeep.change(self.now);
                    self.start_task(n, task, grant.resources)?
                }
                Action::Kill { task, .. } => self.kill(n, task),
                Action::Fetch { task, from, .. } => {
                    let from = (from.0 - 1) as u32;
                    let at = self.round_trip();
                    let source = &mut self.nodes[from as usize];
                    source.serving_until = source.serving_until.max(at);
                    let gen = self.nodes[n].gen;
                    self.push(
                        at,
                        Ev::Fetched {
                            home: n as u32,
                            gen,
                            from,
                            task,
                        },
                    );
                }
                Action::Forget { .. } => {}
                Action::Batch(op) => self.batch(n, op),
                Action::FetchInputs { farm } => {
                    let at = self.round_trip();
                    let gen = self.nodes[n].gen;
                    self.push(
                        at,
                        Ev::InputsReady {
                            node: n as u32,
                            gen,
                            farm,
                        },
                    );
                }
                Action::Emit(ev) => {
                    if let PeerEvent::Unplaceable { stage, reason, .. } = ev {
                        self.unplaceable.push(format!(
                            "{}: {reason}",
                            self.plan.spec.def.stages[stage as usize].name
                        ));
                    }
                }
                // Written above where the node keeps a store; nothing
                // reads one back elsewhere.
                Action::Persist(_) => {}
            }
        }
        if rest.capacity() > 64 {
            // A burst (a mesh forming) would otherwise leave its capacity
            // in the buffer that goes round every peer.
            rest = VecDeque::new();
        }
        self.actions = rest;
        let nd = &mut self.nodes[n];
        let peer = nd.peer.as_mut().expect("stepped peers are up");
        nd.steps += 1;
        let every = self.cfg.check_every;
        let checked = peer.check_step().and_then(|()| {
            if every > 0 && nd.steps.is_multiple_of(every) {
                peer.check_tasks()
            } else {
                Ok(())
            }
        });
        checked.map_err(|e| SimError::Invariant {
            seed: self.cfg.seed,
            at_ms: self.now,
            message: e,
        })?;
        self.note_coordinator(n)?;
        self.next_wake(n);
        let nd = &self.nodes[n];
        let peer = nd.peer.as_ref().expect("stepped peers are up");
        // The farm ends at its home, once every task is over and every
        // output is there; at the coordinator only when the home never
        // comes back. Judged once: the run goes on past it only to give
        // batch jobs back or to find the mesh one, and the judgement is a
        // pass over every task and every peer (judged again at every step
        // of the home until then, it was a third of a 100-node run).
        let end = if self.finished {
            None
        } else if self.home_lost {
            peer.coordinated_progress(FARM).filter(|c| c.finished())
        } else if n == self.cfg.submit_node {
            // Asked of the copy first: the progress it builds is copied
            // out, and the home steps a million times.
            peer.replica(FARM)
                .filter(|r| r.finished())
                .map(|r| r.progress().counts)
        } else {
            None
        };
        if let Some(c) = end {
            self.check_end(c)?;
        }
        Ok(())
    }

    /// When node `n`, just stepped, next needs a wake, or the report it
    /// promises if it does (`Peer::poll_promise`); scheduled as one timer,
    /// unless it already is. A promise keeps the wake after it for when
    /// the report is sent: the node's next step (the coordinator's answer)
    /// most often moves it, and a wake scheduled for nothing is an event.
    pub(super) fn next_wake(&mut self, n: usize) {
        let now = self.now;
        let nd = &mut self.nodes[n];
        let peer = nd.peer.as_mut().expect("stepped peers are up");
        let (timeout, promise) = if self.promises {
            peer.poll_promise(now)
        } else {
            (peer.poll_timeout(), None)
        };
        nd.promised = promise;
        nd.after_promise = promise.and(timeout);
        self.set_timer(n, promise.or(timeout));
    }

    /// Node `n`'s one timer at `at` (none: no wake), scheduled unless it is.
    fn set_timer(&mut self, n: usize, at: Option<Millis>) {
        let Some(at) = at.map(|t| t.max(self.now)) else {
            return;
        };
        let nd = &mut self.nodes[n];
        if nd.timer != Some(at) {
            nd.timer = Some(at);
            let (node, gen) = (n as u32, nd.gen);
            self.push(at, Ev::Timer { node, gen });
        }
    }

    /// Node `n`'s timer came at the heartbeat whose report it promised,
    /// nothing having come since: the report goes as the beat's wake would
    /// have sent it, without a step (the beat fires with the node's next
    /// input), and the node's timer is the wake after it.
    fn report_promised(&mut self, n: usize) {
        let now = self.now;
        let nd = &mut self.nodes[n];
        nd.promised = None;
        let after = nd.after_promise.take();
        let report = nd.peer.as_ref().and_then(|p| p.promised_report(now));
        if let Some((to, msg)) = report {
            self.upkeep.reports_sent += 1;
            self.send(n, to, msg);
        }
        self.set_timer(n, after);
    }

    /// Node `n` coordinates after its step: noted, and at most one
    /// coordinator per term among nodes that can reach each other.
    fn note_coordinator(&mut self, n: usize) -> Result<(), SimError> {
        let Some(term) = self.nodes[n]
            .peer
            .as_ref()
            .filter(|p| p.is_coordinator())
            .map(|p| p.term())
        else {
            return Ok(());
        };
        let noted = self.coords.get(&term).copied();
        if noted == Some(n as u32) {
            // Noted at an earlier step of this term (the coordinator steps
            // at every report: a set's insert each time showed up in runs).
            return Ok(());
        }
        self.coordinators.insert(n as u32);
        if let Some(m) = noted {
            let other = self.nodes[m as usize].peer.as_ref();
            // Another node (this one returned above).
            if other.is_some_and(|o| o.is_coordinator() && o.term() == term)
                && !self.partitioned(n, m as usize)
            {
                return Err(self.violation(format!(
                    "nodes {m} and {n} both coordinate in term {term} and can reach each other"
                )));
            }
        }
        self.coords.insert(term, n as u32);
        Ok(())
    }

    /// The farm is over: every task that should have succeeded did, and
    /// (unless the home is gone for good) the home knows each one done
    /// with its outputs there.
    fn check_end(&mut self, c: mesh_protocol::engine::Counts) -> Result<(), SimError> {
        let task_of = |g: usize| {
            let s = self.plan.offsets.partition_point(|&o| o <= g) - 1;
            TaskRef::new(s as u32, (g - self.plan.offsets[s]) as u32)
        };
        // A task whose node was lost under it each time fails by the crash
        // limit, as it should; the coordinator's word on that is final.
        // Gathered from the logs' failures, so the scans below look a task
        // up only where some failed that way (the end of a run is checked
        // whole; a lookup per task and log was 3% of a 1,000-node run).
        let coord = self.alive.iter().find_map(|&n| {
            let p = self.nodes[n as usize].peer.as_ref()?;
            p.coordinated_progress(FARM).map(|_| p)
        });
        let home = self.nodes[self.cfg.submit_node].peer.as_ref();
        let limited: FxHashSet<TaskRef> = [
            home.and_then(|p| p.replica(FARM)).map(|r| &r.log),
            coord.and_then(|p| p.coordinated_log(FARM)),
        ]
        .into_iter()
        .flatten()
        .flat_map(|log| log.failures())
        .filter_map(|e| match e {
            mesh_protocol::mesh::Entry::Failed { task, end, .. }
                if matches!(**end, mesh_protocol::engine::TaskEnd::CrashLimit) =>
            {
                Some(*task)
            }
            _ => None,
        })
        .collect();
        let crash_limited = |g: usize| !limited.is_empty() && limited.contains(&task_of(g));
        self.crash_limited = (0..self.ok_done.len())
            .filter(|&g| self.plan.expect_ok[g] && crash_limited(g))
            .count() as u64;
        if !self.home_lost {
            let r = home.and_then(|p| p.replica(FARM));
            let unknown = (0..self.ok_done.len()).find(|&g| {
                self.plan.expect_ok[g]
                    && !crash_limited(g)
                    && !r.is_some_and(|r| r.log.is_done(task_of(g)))
            });
            if let Some(g) = unknown {
                return Err(self.violation(format!(
                    "the home says the farm is over ({c:?}) but does not know task {g} done: {:?}",
                    r.and_then(|r| r.log.get(task_of(g)))
                )));
            }
        }
        let missing = (0..self.ok_done.len())
            .find(|&g| self.plan.expect_ok[g] && !self.ok_done[g] && !crash_limited(g));
        if let Some(g) = missing {
            let s = self.plan.offsets.partition_point(|&o| o <= g) - 1;
            return Err(self.violation(format!(
                "the coordinator finished the farm ({c:?}) but task {s}/{} never succeeded",
                g - self.plan.offsets[s]
            )));
        }
        // The counters are kept in step by construction; scan once that they are.
        for &n in &self.alive {
            if let Some(p) = &self.nodes[n as usize].peer {
                p.audit().map_err(|e| self.violation(e))?;
            }
        }
        self.finished = true;
        self.traffic_end = Some((self.now, self.traffic));
        Ok(())
    }

    /// Where a run stopped early would end at its pace so far: greedy
    /// list scheduling's makespan, stretched by how much later than
    /// greedy this run finished as many tasks. None before any has.
    fn projected(&self) -> Option<Millis> {
        let done = self.ok_done.len() - self.ok_left;
        let greedy_at = *self.plan.greedy_ends.get(done.checked_sub(1)?)?;
        let at = self.makespan.saturating_sub(self.submitted_at);
        let pace = at as f64 / greedy_at.max(1) as f64;
        Some((self.plan.greedy as f64 * pace).round() as Millis)
    }

    fn latency(&mut self) -> Millis {
        self.plan.latency.sample(&mut self.rng)
    }

    /// When an answer to a request sent now comes back.
    fn round_trip(&mut self) -> Millis {
        self.now + self.latency() + self.latency()
    }

    /// The random draws of one message: its own, not the next of one
    /// stream, so a message the simulator does not step (a beat whose
    /// every effect is accounted for in closed form) moves no other
    /// message's latency. The n-th message of a kind on a link within a
    /// millisecond draws the same in every run of the seed.
    fn message_draws(&mut self, from: usize, to: usize, kind: usize) -> SmallRng {
        if self.link_ms != self.now {
            self.link_ms = self.now;
            self.link_sent.clear();
        }
        let n = self
            .link_sent
            .entry((from as u32, to as u32, kind))
            .or_insert(0);
        let key = (from as u64) << 32 | to as u64;
        let at = self.now << 24 | (kind as u64) << 16 | u64::from(*n);
        *n += 1;
        SmallRng::seed_from_u64(mix(self.cfg.seed ^ MESSAGE_SALT, key, at))
    }

    fn deliver(&mut self, from: usize, to: usize, msg: Msg) {
        self.traffic.count(&msg);
        if let Some(t) = self.trace {
            let tasks: Vec<Assigned> = match &msg {
                Msg::Assign { tasks, .. }
                | Msg::Release { tasks, .. }
                | Msg::Claimed { tasks, .. }
                | Msg::Stolen { tasks, .. }
                | Msg::Moved { tasks, .. }
                | Msg::Ack { tasks } => tasks.clone(),
                Msg::Report { reports, .. } => reports.iter().map(|r| r.task).collect(),
                _ => vec![],
            };
            if tasks.iter().any(|a| a.task.index == t) {
                eprintln!("{} ms: {from} -> {to}: {msg:?}", self.now);
            }
        }
        if let Some(at) = self.arrival(from, to, msg.kind()) {
            self.push(
                at,
                Ev::Deliver {
                    to: to as u32,
                    from: from as u32,
                    msg: Box::new(msg),
                },
            );
        }
    }

    /// When a message of `kind` sent now from `from` reaches `to`, by its
    /// own draws; `None`: lost on the way.
    pub(super) fn arrival(&mut self, from: usize, to: usize, kind: usize) -> Option<Millis> {
        let mut draws = self.message_draws(from, to, kind);
        if self.cfg.loss > 0.0 && draws.random::<f64>() < self.cfg.loss {
            self.lost += 1;
            return None;
        }
        Some(self.now + self.plan.latency.sample(&mut draws))
    }

    /// Whether a message from `from` gets to node `to` now: not if the
    /// node is down, nor across a partition (lost).
    pub(super) fn reaches(&mut self, from: usize, to: usize) -> bool {
        if self.nodes[to].peer.is_none() {
            return false;
        }
        if self.partitioned(from, to) {
            self.lost += 1;
            return false;
        }
        true
    }

    fn send(&mut self, from: usize, to: NodeId, msg: Msg) {
        let to = (to.0 - 1) as usize;
        if to < self.nodes.len() {
            self.deliver(from, to, msg);
        }
    }

    fn report(&mut self, wall_s: f64) -> SimReport {
        // Measured from the submission: before it there is nothing to do.
        let start = self.submitted_at;
        let makespan = self.makespan.saturating_sub(start);
        let end = self.makespan.max(1);
        let mut cap = 0.0;
        let mut stats = self.gone_stats.clone();
        for nd in &self.nodes {
            let up = nd.up_ms + nd.up_since.map_or(0, |s| self.now.saturating_sub(s));
            cap += nd.cpus * up.min(end - start.min(end)) as f64;
            if let Some(p) = &nd.peer {
                let s = p.stats();
                stats.steals_asked += s.steals_asked;
                stats.steals_won += s.steals_won;
                stats.tasks_stolen += s.tasks_stolen;
                stats.quiet_timers += s.quiet_timers;
            }
        }
        let done = self.ok_done.iter().filter(|&&d| d).count() as u64;
        let tasks = self.plan.durations.len() as u64;
        SimReport {
            name: self.cfg.name.clone(),
            seed: self.cfg.seed,
            nodes: self.nodes.len(),
            node_shapes: node_shapes(self.nodes.iter().map(|n| &n.total)),
            tasks,
            makespan,
            lower_bound: self.plan.lower_bound,
            ratio: makespan as f64 / self.plan.lower_bound as f64,
            greedy: self.plan.greedy,
            greedy_ratio: self.plan.greedy as f64 / self.plan.lower_bound as f64,
            longest_first: self.plan.longest_first,
            longest_first_ratio: self.plan.longest_first as f64 / self.plan.lower_bound as f64,
            utilization: if cap > 0.0 {
                self.busy_cpu_ms / cap
            } else {
                0.0
            },
            steals: stats.steals_won,
            steals_asked: stats.steals_asked,
            tasks_stolen: stats.tasks_stolen,
            messages: self.traffic.messages,
            traffic_idle: Traffic {
                span_ms: start,
                ..self.traffic_before
            },
            traffic_farm: {
                let (end, t) = self.traffic_end.unwrap_or((self.now, self.traffic));
                Traffic {
                    span_ms: end.saturating_sub(start),
                    ..t.minus(&self.traffic_before)
                }
            },
            messages_lost: self.lost,
            duplicates: self.duplicates,
            executions: self.executions,
            tasks_done: done,
            tasks_failed: tasks - done,
            crash_limited: self.crash_limited,
            unplaceable: self.unplaceable.clone(),
            prefetch: self.nodes.iter().map(|n| n.depth).collect(),
            events: self.events,
            upkeep: crate::report::Upkeep {
                skipped: stats.quiet_timers,
                ..self.upkeep.report()
            },
            events_per_sec: self.events as f64 / wall_s.max(1e-9),
            wall_ms: wall_s * 1000.0,
            peak_rss_bytes: crate::peak_rss_bytes(None),
            alloc: self.alloc_report(),
            one_mesh_ms: self.one_mesh_since,
            coordinators: self.coordinators.iter().copied().collect(),
            slow_wait_ms: self.slow_wait_ms,
            moved_bytes: self.moved_bytes,
            stage_in_ms: self.stage_in_ms,
            timeline: std::mem::take(&mut self.timeline),
            sample: std::mem::take(&mut self.sample),
        }
    }
}

/// Debugging aid: `MESH_SIM_TRACE=<task index>` prints every message about that task.
fn trace_task() -> Option<u32> {
    std::env::var("MESH_SIM_TRACE").ok()?.parse().ok()
}

/// A scenario's own nodes by what each offers, as its report's
/// `node_shapes` says them, without running it.
pub fn shapes_of(cfg: &SimConfig) -> Result<Vec<(usize, String)>, SimError> {
    Ok(node_shapes(plan::machines(cfg)?.0.iter()))
}

/// How many nodes offer each set of resources, in the order first seen.
fn node_shapes<'r>(totals: impl Iterator<Item = &'r Resources>) -> Vec<(usize, String)> {
    let mut shapes: Vec<(usize, String)> = Vec::new();
    for t in totals {
        let r = t.to_string();
        match shapes.iter_mut().find(|(_, s)| *s == r) {
            Some((n, _)) => *n += 1,
            None => shapes.push((1, r)),
        }
    }
    shapes
}

/// When the last event the scenario scripts happens: nodes joining, the
/// submit, crashes and restarts, leaves, partitions, stalls, slow spells
/// and introductions. A quiet stretch before it is the script's, not a
/// stuck run's.
fn scripted_until(cfg: &SimConfig) -> Millis {
    let joins = cfg.nodes.iter().map(|g| g.join_at_ms);
    let crashes = cfg
        .crashes
        .iter()
        .map(|c| c.at_ms + c.restart_after_ms.unwrap_or(0));
    let leaves = cfg.leaves.iter().map(|l| l.at_ms);
    let partitions = cfg.partitions.iter().map(|p| p.until_ms);
    let stalls = cfg.stall.iter().map(|s| s.until_ms);
    let slow = cfg.slow.iter().map(|s| s.until_ms);
    let introduce = cfg.introduce.iter().map(|i| i.at_ms);
    joins
        .chain(crashes)
        .chain(leaves)
        .chain(partitions)
        .chain(stalls)
        .chain(slow)
        .chain(introduce)
        .chain([cfg.submit_at_ms])
        .max()
        .unwrap_or(0)
        + alloc_grace(cfg)
}

/// With allocation queues, a farm may wait with nothing running while a
/// job sits in the batch queue, or until an idle job is given back.
fn alloc_grace(cfg: &SimConfig) -> Millis {
    cfg.alloc
        .iter()
        .map(|a| {
            let delay = crate::parse_durations(&a.start_delay).map_or(0, |d| d.max());
            delay + a.idle_timeout_ms
        })
        .max()
        .unwrap_or(0)
}
