//! One node of the mesh as a sans-IO state machine: a thin dispatcher over its roles (membership, election, coordinator, worker, stealing, holder and home, allocation).
//!
//! Every node runs a [`Peer`]. It gossips a [`Beat`] (its resources, load
//! and whom it follows), notices dead members when their beats stop, and
//! agrees on a coordinator with terms. The coordinator holds each farm's
//! [`Engine`](crate::engine::Engine) (in remote mode), so scheduling
//! decisions stay in one place: it claims ready tasks for nodes with room
//! (up to each node's prefetch depth), re-queues the tasks of dead nodes
//! without spending their retries, and reports progress to the submitter.
//! Workers start what they are given in order, enforce timeouts, report
//! results until acknowledged, and steal unstarted tasks from overloaded
//! peers when they run dry.
//!
//! Each role is a module that owns the state only it uses; `Peer` routes
//! inputs to them, and where one event concerns several roles (a member
//! dies, a coordinator is elected, a farm is submitted) says here in which
//! order they hear of it:
//!
//! - `membership.rs`: who is alive (members, their last beat, who died).
//! - `election.rs`: whom this node follows, in which term.
//! - `coordinator/`: the elected node's engine, claims and placement, and
//!   its side of replication.
//! - `worker.rs`: the queue, running tasks, timeouts, reports until acknowledged.
//! - `steal.rs`: victims and the steal in flight.
//! - `holder.rs`: copies of farms kept here, and the home's outputs.
//! - `allocation.rs`: inputs to the allocation queues, and the book's copies.
//! - `out.rs`: what a step produces (actions, messages to itself, counters).
//!
//! Like the engine it does no I/O and reads no clock: the driver feeds it
//! messages, finished tasks and the time, and carries out its [`Action`]s in
//! order, making every `Persist` durable before any later action.

mod action;
mod allocation;
mod config;
mod coordinator;
mod election;
mod holder;
mod membership;
mod out;
mod placement;
mod steal;
mod worker;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};

use super::allocs::{AllocBook, AllocCmd, Allocs};
use super::msg::*;
use super::replica::{FarmLog, Replica, StoredFarm};
use crate::alloc::{BatchSystem, JobState, QueueDef};
use crate::engine::{self, Millis, Outcome};
use crate::farm::TaskRef;
use crate::observe::{Latencies, Latency};
use crate::resources::Resources;
use crate::wire::PROTOCOL_VERSION;

pub use action::{Action, Fetched, PeerEvent, Persist};
pub use config::Config;
pub use election::{ballot, term_round};
pub use membership::Member;
pub use out::Stats;

use coordinator::Coord;
use election::{Election, Vote};
use holder::Holdings;
use membership::Membership;
use out::Out;
use steal::{Answer, Stealing};
use worker::{Specs, Worker};

/// How long a node restarted on its state folder waits for the members it
/// remembers to say whom they follow before it may elect itself (see
/// `Election`; a node `mesh join` pointed at a mesh waits for ever).
const JOIN_ALONE_MS: Millis = 30_000;

/// How often a node that found outputs in its state at start asks whether
/// their farms' homes have them all (a farm still running answers only
/// when it ends, so the ask repeats, but seldom).
const KEEPS_EVERY_MS: Millis = 30_000;

/// What every role reads of this node: who it is, its knobs, who is
/// alive and whom it follows. Only the dispatcher changes the last two.
struct Node {
    id: NodeId,
    cfg: Config,
    /// When this node started: a node never seen since counts as gone from then.
    started_at: Millis,
    members: Membership,
    election: Election,
}

impl Node {
    fn term(&self) -> u64 {
        self.election.term()
    }

    fn leader(&self) -> election::Leader {
        self.election.leader()
    }

    /// Nodes other than this one that could hold a copy, and how many must.
    fn holders_needed(&self) -> usize {
        self.cfg.replicas.saturating_sub(1).min(self.members.len())
    }

    fn live(&self, node: NodeId) -> bool {
        node == self.id || self.members.contains(node)
    }
}

pub struct Peer {
    node: Node,
    rng: SmallRng,
    /// Farm definitions this node knows: every role reads them.
    specs: Specs,
    /// Only the elected node has one.
    coord: Option<Coord>,
    worker: Worker,
    steal: Stealing,
    holdings: Holdings,
    /// Allocation queues: this node's copy, and the coordinator's loop.
    allocs: Allocs,
    next_resend: Millis,
    /// Farms whose outputs this node found in its state when it started,
    /// until their homes say they are collected, and when it next asks.
    kept: BTreeSet<FarmId>,
    next_keeps: Millis,
    /// On the coordinator: the members with the most tasks queued, as
    /// of the last look at the members, told to every worker it answers.
    victims: Vec<Victim>,
    out: Out,
    /// The time of the latest input (for beats, which take none).
    clock: Millis,
    /// This node's open-file limit, as its driver says (0: not known).
    files_max: u64,
    /// This node's GPUs (id, model), as its driver found them.
    gpus: Vec<(String, String)>,
    /// This node's machine, as its driver last measured it.
    machine: Option<MachineLoad>,
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
        Peer {
            rng: SmallRng::seed_from_u64(seed ^ id.0),
            specs: Specs::default(),
            coord: None,
            worker: Worker::new(total),
            steal: Stealing::new(),
            holdings: Holdings::default(),
            allocs: Allocs::default(),
            next_resend: now + cfg.resend_ms,
            kept: BTreeSet::new(),
            next_keeps: now,
            victims: Vec::new(),
            out: Out::new(id),
            clock: now,
            files_max: 0,
            gpus: Vec::new(),
            machine: None,
            node: Node {
                id,
                started_at: now,
                members: Membership::new(now, id, seed ^ id.0.rotate_left(17), cfg.dead_after_ms),
                election: Election::new(
                    joining,
                    now + cfg.join_wait_ms,
                    now + cfg.join_wait_ms.max(JOIN_ALONE_MS),
                ),
                cfg,
            },
        }
    }

    // ----- what the driver and status pages read -----

    /// How this node is known on the network (in its membership packets
    /// and beats), and which life of it this is: later than any before it
    /// on this node (the wall clock at start does).
    pub fn set_address(&mut self, now: Millis, label: String, addrs: Vec<String>, life: u64) {
        self.woke(now);
        self.node
            .members
            .set_address(now, label, addrs, life, &mut self.out);
        self.pump(now);
    }

    /// This node's machine as measured now, told in its beats.
    pub fn set_machine(&mut self, machine: Option<MachineLoad>) {
        self.machine = machine;
    }

    /// Every member as this node last heard it (its beat; an empty one for
    /// a member known only by SWIM), with its label; this node first. On
    /// the coordinator, every worker's own report.
    pub fn node_beats(&self) -> Vec<(String, Arc<Beat>)> {
        let own = (self.node.members.label().to_owned(), Arc::new(self.beat()));
        std::iter::once(own)
            .chain(
                self.node
                    .members
                    .iter()
                    .map(|m| (m.label().to_owned(), m.beat_arc())),
            )
            .collect()
    }

    /// This node's GPUs (how tasks name each, and its model), told in its beats.
    pub fn set_gpus(&mut self, gpus: Vec<(String, String)>) {
        self.gpus = gpus;
    }

    /// This node's open-file limit, told in its beats.
    pub fn set_files_max(&mut self, limit: u64) {
        self.files_max = limit;
    }

    /// This node was started to join a mesh at an address the user gave:
    /// until a node there says whom it follows, it never runs alone (see
    /// `Election`).
    pub fn joins_by_address(&mut self) {
        self.node.election.joins_by_address();
    }

    /// A node to join the mesh through (an address the user gave, or a
    /// peer this node knew before it restarted): this node announces
    /// itself there and learns the members from it.
    pub fn introduce(&mut self, now: Millis, id: NodeId, label: String, addrs: Vec<String>) {
        self.woke(now);
        self.node
            .members
            .introduce(now, id, label, addrs, &mut self.out);
        self.node.election.introduced(id);
        self.member_changes(now);
        self.pump(now);
    }

    /// A membership packet ([`Action::Swim`]) from another node.
    pub fn handle_swim(&mut self, now: Millis, data: &[u8]) {
        self.woke(now);
        self.node.members.handle_swim(now, data, &mut self.out);
        self.member_changes(now);
        self.pump(now);
    }

    /// How a member is reached: its label and addresses, as set by its
    /// driver (see [`Peer::set_address`]).
    pub fn address_of(&self, id: NodeId) -> Option<(&str, &[String])> {
        self.node.members.address_of(id)
    }

    /// How many members this node knows alive.
    pub fn member_count(&self) -> usize {
        self.node.members.len()
    }

    pub fn id(&self) -> NodeId {
        self.node.id
    }

    pub fn term(&self) -> u64 {
        self.node.election.term()
    }

    pub fn coordinator(&self) -> Option<NodeId> {
        self.node.election.coordinator()
    }

    pub fn is_coordinator(&self) -> bool {
        self.coord.is_some()
    }

    pub fn members(&self) -> impl Iterator<Item = &Member> {
        self.node.members.iter()
    }

    /// This node's own beat, as it would gossip it now.
    pub fn beat(&self) -> Beat {
        // Only allocation queues read it: a mesh without any pays nothing.
        let (late_cores, late_gpus) = if self.allocs.book().queues.is_empty() {
            (0, 0)
        } else {
            self.worker.late(self.clock, &self.specs, |gpus| {
                allocation::room(&self.allocs, gpus)
            })
        };
        Beat {
            version: PROTOCOL_VERSION,
            label: self.node.members.label().to_owned(),
            addrs: self.node.members.addrs().to_vec(),
            term: self.node.election.term(),
            coordinator: self.node.election.coordinator(),
            total: self.worker.total().clone(),
            used: self.worker.used(),
            queued: self.worker.queued() as u32,
            running: self.worker.running_count() as u32,
            backlog: self.coord.as_ref().map_or(0, Coord::backlog),
            prefetch: self.worker.depth(),
            job: self.worker.job().cloned(),
            ends_in_ms: self.worker.deadline().map(|d| d.saturating_sub(self.clock)),
            allocs: self.allocs.version(),
            ask: false,
            interval_ms: if self.coord.is_some() {
                self.report_interval()
            } else {
                0
            },
            victims: if self.coord.is_some() {
                self.victims.clone()
            } else {
                Vec::new()
            },
            roster: self.node.members.digest(),
            health: self.node.members.health(),
            late_cores,
            late_gpus,
            files_max: self.files_max,
            idle: self.worker.holds_nothing(),
            gpus: self.gpus.clone(),
            machine: self.machine,
        }
    }

    /// How often the workers report to this coordinator in a mesh of this
    /// size; as a worker, how often this node reports to its coordinator
    /// (as the coordinator said; every heartbeat for the node that would
    /// succeed it, so a dead coordinator is found fast at any size).
    fn report_interval(&self) -> Millis {
        let cfg = &self.node.cfg;
        let mine = membership::report_interval(cfg, self.node.members.len() + 1);
        match self.node.election.coordinator() {
            Some(c) if c == self.node.id => mine,
            Some(c) if self.successor(c) => cfg.heartbeat_ms,
            Some(c) => self
                .node
                .members
                .get(c)
                .map_or(mine, |m| m.beat().interval_ms.max(cfg.heartbeat_ms)),
            None => cfg.heartbeat_ms,
        }
    }

    /// This node is the one elected should coordinator `c` die: the lowest
    /// live node but `c`.
    fn successor(&self, c: NodeId) -> bool {
        self.node
            .members
            .lowest_but(c, self.node.election.passed_over(self.clock))
            .is_none_or(|l| self.node.id < l)
    }

    /// Whose silence this node takes as a death, and after how long: the
    /// coordinator its workers' (three report intervals, at least
    /// `dead_after_ms`), the successor the coordinator's (`dead_after_ms`:
    /// it reports every heartbeat, so failover does not stretch with the
    /// mesh). Both stretched by this node's local health: a node that is
    /// itself behind, as in a storm of hundreds of nodes starting on a few
    /// cores, waits longer before it calls a silence a death (a false
    /// death of the coordinator moves the whole mesh). Other workers leave
    /// the coordinator's death to its successor, whose claim they follow,
    /// and to SWIM: a stall of the coordinator then costs no one but the
    /// successor a judgement.
    fn watch(&self) -> membership::Watch {
        let cfg = &self.node.cfg;
        let health = u64::from(self.node.members.health()) + 1;
        match self.node.election.coordinator() {
            Some(c) if c == self.node.id => {
                let limit = cfg.dead_after_ms.max(3 * self.report_interval());
                membership::Watch::Direct(limit * health)
            }
            Some(c) if self.successor(c) => membership::Watch::One(c, cfg.dead_after_ms * health),
            _ => membership::Watch::None,
        }
    }

    /// How many tasks this node wants queued beyond those it runs now.
    pub fn prefetch_depth(&self) -> u32 {
        self.worker.depth()
    }

    pub fn spec(&self, farm: FarmId) -> Option<&Arc<FarmSpec>> {
        self.specs.get(&farm)
    }

    /// The progress of a farm this node holds, as it would show it.
    pub fn progress(&self, farm: FarmId) -> Option<FarmProgress> {
        self.holdings.get(farm).map(|r| r.progress())
    }

    /// A farm this node holds a copy of.
    pub fn replica(&self, farm: FarmId) -> Option<&Replica> {
        self.holdings.get(farm)
    }

    /// Every farm this node holds a copy of.
    pub fn replicas(&self) -> impl Iterator<Item = &Replica> {
        self.holdings.iter()
    }

    pub fn stats(&self) -> &Stats {
        &self.out.stats
    }

    /// Starts measuring latencies (see [`Latency`]).
    pub fn observe(&mut self) {
        self.out.observed.get_or_insert_with(Box::default);
    }

    /// The latencies measured since `observe`, and the coordinator
    /// changes seen.
    pub fn latencies(&self) -> Option<(&Latencies, u64)> {
        self.out
            .observed
            .as_deref()
            .map(|o| (&o.latency, o.failovers))
    }

    /// Records a latency measured by the driver (a message's round trip).
    pub fn record_latency(&mut self, kind: Latency, micros: u64) {
        if let Some(o) = self.out.observed() {
            o.latency.record(kind, micros);
        }
    }

    pub fn queued(&self) -> usize {
        self.worker.queued()
    }

    pub fn running_count(&self) -> usize {
        self.worker.running_count()
    }

    /// True when nothing runs here and nothing waits to be reported.
    pub fn idle(&self) -> bool {
        self.worker.idle()
    }

    #[must_use]
    pub fn poll_action(&mut self) -> Option<Action> {
        self.out.actions.pop_front()
    }

    pub fn has_actions(&self) -> bool {
        !self.out.actions.is_empty()
    }

    /// When the peer next needs [`Peer::handle_timeout`].
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Millis> {
        let mut at = self.node.members.next_beat().min(self.next_resend);
        if let Some(t) = self.node.members.next_timer() {
            at = at.min(t);
        }
        if let Some(t) = self.worker.next_timer() {
            at = at.min(t);
        }
        if let Some(t) = self.steal.poll_timeout(self.node.cfg.steal_timeout_ms) {
            at = at.min(t);
        }
        if let Some(c) = &self.coord {
            if let Some(t) = c.poll_timeout() {
                at = at.min(t);
            }
            if let Some(t) = self.allocs.poll_timeout() {
                at = at.min(t);
            }
        }
        Some(at)
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
        self.worker.set_batch_job(job, deadline);
    }

    /// A user's change to the allocation queues, sent to the coordinator.
    pub fn alloc_command(&mut self, now: Millis, cmd: AllocCmd) {
        self.woke(now);
        self.node
            .election
            .leader()
            .send(&mut self.out, |_| Msg::Alloc(Box::new(cmd)));
        self.pump(now);
    }

    /// The batch system's answer to [`BatchOp::Submit`](super::BatchOp::Submit): the job ids.
    pub fn batch_submitted(
        &mut self,
        now: Millis,
        queue: &QueueDef,
        result: Result<Vec<String>, String>,
    ) {
        self.woke(now);
        let term = self.node.election.term();
        if self.coord.is_some() && self.allocs.submitted(now, term, queue, result) {
            self.allocs_changed();
        }
        self.pump(now);
    }

    /// The batch system's answer to [`BatchOp::Poll`](super::BatchOp::Poll): the state of each
    /// job it still lists.
    pub fn batch_polled(
        &mut self,
        now: Millis,
        system: BatchSystem,
        result: Result<Vec<(String, JobState)>, String>,
    ) {
        self.woke(now);
        let term = self.node.election.term();
        if self.coord.is_some() && self.allocs.polled(now, term, system, result) {
            self.allocs_changed();
        }
        self.pump(now);
    }

    /// The batch system's answer to [`BatchOp::List`](super::BatchOp::List):
    /// every job of this mesh it knows.
    pub fn batch_listed(
        &mut self,
        now: Millis,
        system: BatchSystem,
        gen: u64,
        result: Result<Vec<super::Listed>, String>,
    ) {
        self.woke(now);
        let term = self.node.election.term();
        if self.coord.is_some() && self.allocs.listed(now, term, system, gen, result) {
            self.allocs_changed();
        }
        self.pump(now);
    }

    /// The batch system's answer to [`BatchOp::Cancel`](super::BatchOp::Cancel).
    pub fn batch_cancelled(&mut self, now: Millis, job: &str, result: Result<(), String>) {
        self.woke(now);
        let term = self.node.election.term();
        if self.coord.is_some() && self.allocs.cancelled(now, term, job, result) {
            self.allocs_changed();
        }
        self.pump(now);
    }

    /// The coordinator changed the book: durable here, and sent to everyone.
    fn allocs_changed(&mut self) {
        allocation::changed(&self.allocs, &self.node.members, &mut self.out);
        self.machines_changed();
    }

    /// Membership or the allocation queues changed: the coordinator's
    /// view of the machines is rebuilt before it next needs it.
    fn machines_changed(&mut self) {
        if let Some(c) = &mut self.coord {
            c.machines_changed();
        }
    }

    fn sync_machines(&mut self) {
        if let Some(c) = &mut self.coord {
            let (allocs, total, members) = (&self.allocs, self.worker.total(), &self.node.members);
            c.sync_machines(|| allocation::machines(allocs, total, members));
        }
    }

    // ----- farms -----

    /// A farm found in this node's store at startup: held again (and
    /// offered to the coordinator until it is over), and coordinated here
    /// if this node is elected. `finished`: it was over here, with these counts.
    pub fn restore_farm(
        &mut self,
        stored: StoredFarm,
        finished: Option<(engine::Counts, Vec<engine::Counts>)>,
    ) {
        self.specs.insert(stored.spec.id, stored.spec.clone());
        self.holdings.restore(self.node.id, stored, finished);
    }

    /// Results this node reported before it stopped and that were not
    /// acknowledged: kept, and reported again.
    pub fn restore_held(&mut self, reports: Vec<Report>) {
        self.worker.restore_held(reports);
    }

    /// Farms whose outputs this node keeps, found in its state at start,
    /// or when it follows a new coordinator (it may have been cut off from
    /// the rest): their ends may have been told while it was down or
    /// away, so it asks their homes (through its coordinator), at its
    /// next resend and then every `KEEPS_EVERY_MS`, until each says so.
    pub fn restore_kept(&mut self, farms: impl IntoIterator<Item = FarmId>) {
        let before = self.kept.len();
        self.kept.extend(farms);
        if self.kept.len() > before {
            self.next_keeps = 0;
        }
    }

    /// A farm submitted on this node, which becomes its home.
    pub fn submit(&mut self, now: Millis, spec: FarmSpec) {
        let spec = Arc::new(spec);
        self.specs.insert(spec.id, spec.clone());
        self.out.persist(Persist::Farm(spec.clone()));
        let home = self.holdings.submitted(self.node.id, spec.clone());
        self.node
            .election
            .leader()
            .send(&mut self.out, |_| Msg::Submit {
                farm: spec,
                entries: Vec::new(),
                home,
                writer: None,
            });
        self.pump(now);
    }

    /// This node becomes the farm's home (its old home is gone, or the
    /// user wants the outputs elsewhere): every output is brought to
    /// `out`, and the farm is offered to the coordinator with the new claim.
    pub fn take_home(&mut self, now: Millis, spec: Arc<FarmSpec>, out: String) {
        let id = spec.id;
        if !self.holdings.keeps(id) {
            self.specs.insert(id, spec.clone());
            self.out.persist(Persist::Farm(spec.clone()));
        }
        self.holdings
            .claim_home(self.node.id, spec, out, &mut self.out);
        self.resend(now);
        self.home_progress(id);
        self.pump(now);
    }

    /// On the home: the outputs of `task` asked for by [`Action::Fetch`]
    /// are here and verified, or could not be brought (tried again later).
    pub fn fetched(&mut self, now: Millis, farm: FarmId, task: TaskRef, got: Fetched) {
        if self
            .holdings
            .fetched(now, farm, task, got, &self.node, &mut self.out)
        {
            self.pump(now);
        }
    }

    /// Asks the coordinator to stop a farm.
    pub fn cancel(&mut self, now: Millis, farm: FarmId) {
        self.node
            .election
            .leader()
            .send(&mut self.out, |_| Msg::Cancel { farm });
        self.pump(now);
    }

    /// The farm's inputs (none, or every one) are here: a copy held here
    /// now counts, and a farm waiting for that may be accepted.
    pub fn inputs_ready(&mut self, now: Millis, farm: FarmId, ok: bool) {
        // When not, asked again at the next resend, from whoever has them then.
        if ok && self.holdings.inputs_came(farm) {
            self.inputs_here(farm);
            self.pump(now);
        }
    }

    fn inputs_here(&mut self, farm: FarmId) {
        self.holdings
            .copy_complete(farm, &mut self.out, self.node.election.leader());
        if let Some(c) = &mut self.coord {
            c.has_copy(farm, self.node.id);
        }
        self.accept_ready();
    }

    // ----- the driver's inputs -----

    /// Stops this node's tasks (Ctrl-C): running ones are killed, queued ones given back.
    pub fn interrupt(&mut self, now: Millis) {
        self.worker
            .interrupt(&mut self.out, self.node.election.leader());
        self.pump(now);
    }

    pub fn handle_message(&mut self, now: Millis, from: NodeId, msg: Msg) {
        self.woke(now);
        self.out.inbox.push_back((from, msg));
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
        let leader = self.node.election.leader();
        for one in ended {
            self.worker.finish_one(
                now,
                one,
                &self.specs,
                self.node.cfg.queue_max,
                &mut self.out,
                leader,
            );
        }
        self.start_queued(now);
        // Running dry: steal now rather than at the next beat.
        self.try_steal(now);
        self.pump(now);
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
        let last_beat = self
            .node
            .members
            .next_beat()
            .saturating_sub(self.node.cfg.heartbeat_ms);
        if now <= last_beat + self.node.cfg.dead_after_ms / 2 {
            return;
        }
        self.node.members.refresh(now, self.node.cfg.heartbeat_ms);
        self.worker
            .give_back_silent(now - last_beat, &mut self.out, self.node.election.leader());
    }

    pub fn handle_timeout(&mut self, now: Millis) {
        self.woke(now);
        self.worker.fire_timers(now, &mut self.out);
        self.node.members.fire_timers(now, &mut self.out);
        self.member_changes(now);
        if self.node.members.beat_due(now, self.node.cfg.heartbeat_ms) {
            // Stages that stopped running here stop counting.
            self.worker.update_depth(now, self.node.cfg.queue_max);
            self.node.members.upkeep(now, &mut self.out);
            self.member_changes(now);
            self.elect(now);
            if self.coord.is_some() {
                self.victims = self.find_victims();
            }
            let interval = self.report_interval();
            if self.node.members.report_due(now, interval) {
                self.report();
            }
            self.try_steal(now);
        }
        if now >= self.next_resend {
            self.next_resend = now + self.node.cfg.resend_ms;
            self.resend(now);
        }
        self.steal.expire(now, self.node.cfg.steal_timeout_ms);
        if self.coord.as_ref().is_some_and(|c| c.progress_due(now)) {
            self.sync_holders(now, true);
        }
        if self.coord.is_some() && self.allocs.poll_timeout().is_some_and(|t| now >= t) {
            self.alloc_tick(now);
        }
        self.pump(now);
    }

    // ----- the message loop -----

    /// Handles messages (including those this node sent itself) until none is left.
    fn pump(&mut self, now: Millis) {
        self.worker.send_reports(
            now,
            self.node.cfg.batch_max,
            &mut self.out,
            self.node.election.leader(),
        );
        while let Some((from, msg)) = self.out.inbox.pop_front() {
            self.dispatch_msg(now, from, msg);
        }
        self.coord_drain();
        self.assign(now);
        // Assignments to this node itself arrive through the inbox.
        while let Some((from, msg)) = self.out.inbox.pop_front() {
            self.dispatch_msg(now, from, msg);
            self.coord_drain();
            self.assign(now);
        }
        self.sync_holders(now, false);
        // Holders' answers to this node itself.
        while let Some((from, msg)) = self.out.inbox.pop_front() {
            self.dispatch_msg(now, from, msg);
        }
        self.worker.persist_held(&mut self.out);
    }

    fn dispatch_msg(&mut self, now: Millis, from: NodeId, msg: Msg) {
        match msg {
            Msg::Beat(b) => self.on_beat(now, from, b),
            Msg::Swim(data) => {
                self.node.members.handle_swim(now, &data, &mut self.out);
                self.member_changes(now);
            }
            Msg::Roster {
                kind,
                digest,
                members,
            } => {
                self.node
                    .members
                    .on_roster(now, from, kind, digest, members, &mut self.out);
                self.member_changes(now);
            }
            Msg::Alloc(cmd) => {
                if self.coord.is_some() {
                    let term = self.node.election.term();
                    let (ops, changed) = self.allocs.command(now, term, *cmd);
                    self.out.actions.extend(ops.into_iter().map(Action::Batch));
                    if changed {
                        self.allocs_changed();
                    }
                }
            }
            Msg::Allocs(book) => {
                if self.allocs.adopt(book) {
                    let book = self.allocs.book().clone();
                    self.out.persist(Persist::Allocs(book));
                    self.machines_changed();
                }
            }
            Msg::Submit {
                farm,
                entries,
                home,
                writer,
            } => self.on_submit(now, from, farm, entries, home, writer),
            Msg::Offer { farm, entries } => {
                if let Some(c) = &mut self.coord {
                    c.on_offer(now, from, farm, entries, &mut self.out);
                }
            }
            Msg::Accepted { farm, tasks } => self.holdings.on_accepted(farm, tasks, &mut self.out),
            Msg::Refused { farm, reason } => self.holdings.on_refused(farm, reason, &mut self.out),
            Msg::Replicate { farm, term } => {
                if term < self.node.election.term() {
                    return;
                }
                let id = farm.id;
                if self.holdings.replicate(self.node.id, &farm) {
                    self.specs.insert(id, farm.clone());
                    self.out.persist(Persist::Farm(farm.clone()));
                }
                // The copy counts once the farm's inputs are here too.
                if self
                    .holdings
                    .want_inputs(self.node.id, &farm, &mut self.out)
                    && !self.holdings.wants_inputs(id)
                {
                    self.out.send(from, Msg::Replicated { farm: id });
                }
            }
            Msg::Replicated { farm } => {
                if let Some(c) = &mut self.coord {
                    c.has_copy(farm, from);
                }
                self.accept_ready();
            }
            Msg::Sync(m) => {
                self.holdings
                    .on_sync(now, from, *m, &self.node, &mut self.out);
            }
            Msg::Redo { farm, tasks } => {
                if let Some(c) = &mut self.coord {
                    c.on_redo(farm, tasks, &mut self.out);
                }
            }
            Msg::Synced { farm, next, over } => {
                if let Some(c) = &mut self.coord {
                    c.on_synced(from, farm, next, over, &self.node, &mut self.out);
                }
            }
            Msg::Collected { farm } => {
                self.kept.remove(&farm);
                self.out.push(Action::Forget { farm });
            }
            Msg::Keeps { node, farms } => self.on_keeps(from, node, farms),
            Msg::Assign { term, tasks, echo } => self.on_assign(now, from, term, tasks, echo),
            Msg::Report {
                reports,
                at,
                prefetch,
                ..
            } => {
                if let Some(c) = &mut self.coord {
                    if from != self.node.id {
                        c.note_report(from, prefetch, at);
                    }
                    c.on_report(now, from, reports, &self.node, &mut self.out);
                }
            }
            Msg::Ack { tasks } => self.worker.acked(now, tasks, &mut self.out),
            Msg::Release { tasks, .. } => {
                if let Some(c) = &mut self.coord {
                    c.on_release(now, tasks);
                }
            }
            Msg::Holding { tasks, .. } => {
                if let Some(c) = &mut self.coord {
                    c.on_holding(now, from, tasks, self.node.cfg.resend_ms);
                }
            }
            Msg::GetFarm { farm } => {
                if let Some(spec) = self.specs.get(&farm).cloned() {
                    self.out.send(from, Msg::Farm(spec));
                }
            }
            Msg::Farm(spec) => {
                let id = spec.id;
                self.specs.insert(id, spec);
                if self.worker.spec_arrived(id) {
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
            Msg::Moved { to, tasks, .. } => {
                if let Some(c) = &mut self.coord {
                    c.on_moved(now, from, to, tasks);
                }
            }
            Msg::Cancel { farm } => self.on_cancel(from, farm),
            Msg::Failure(f) => self.out.emit(PeerEvent::Failure(f)),
        }
    }

    // ----- membership and election -----

    fn on_beat(&mut self, now: Millis, from: NodeId, b: Arc<Beat>) {
        if b.version != PROTOCOL_VERSION || from == self.node.id {
            return;
        }
        let claims = b.coordinator == Some(from);
        let (term, ask, follows) = (b.term, b.ask, b.coordinator);
        self.node.election.answered_by(from);
        if let Some(c) = &mut self.coord {
            c.note_depth(from, b.prefetch);
            if b.idle && follows == Some(self.node.id) {
                // The empty `Holding` its node does not send. The node was
                // idle, so the first `Assign` to it opens a connection:
                // claims that young may still be on their way (placement
                // on a loaded machine of 300 nodes handed the same tasks
                // from node to node, and 1 of 300 ran any).
                let grace = self.node.cfg.resend_ms.max(self.node.cfg.connect_ms);
                c.on_holding(now, from, Vec::new(), grace);
            }
        }
        if claims && self.node.election.coordinator() == Some(from) {
            // The coordinator's answer: whom to steal from.
            self.steal.set_victims(self.node.id, &b.victims);
            if self.node.members.roster_unlike(now, b.roster) {
                let digest = self.node.members.digest();
                self.out.send(
                    from,
                    Msg::Roster {
                        kind: RosterKind::Ask,
                        digest,
                        members: Vec::new(),
                    },
                );
            }
        }
        match self.node.members.heard(now, from, b) {
            membership::Heard::New => self.member_up(now, from),
            // Its resources, where it had only SWIM's word until now.
            membership::Heard::Resized => {
                self.machines_changed();
                if let Some(c) = &mut self.coord {
                    c.joined(from);
                }
            }
            membership::Heard::Again => {}
        }
        let coordinating = self.coord.is_some();
        if let Some(term) = self.node.election.heard(from, claims, term, coordinating) {
            self.follow(now, term, from);
        }
        let mine = self.node.election.coordinator();
        if ask && (self.coord.is_some() || follows != mine || mine.is_none()) {
            // A worker's report, or a question from a node that follows
            // another coordinator or none (a joining node waits for its
            // seed's word, even that it follows no one): answered with
            // whom this one follows.
            self.tell([from]);
        } else if mine.is_none() {
            if let Some(c) = follows.filter(|&c| c != from && c != self.node.id) {
                // It follows a coordinator this node does not know of: ask there.
                self.ask(c);
            }
        }
        if !self.steal.is_empty() {
            // Work appeared somewhere: a dry node takes some now rather than at its next beat.
            self.try_steal(now);
        }
    }

    /// Members that came up since the last look (SWIM told, or a first
    /// beat): every role hears of each.
    fn member_changes(&mut self, now: Millis) {
        for id in self.node.members.take_fresh() {
            self.member_up(now, id);
        }
        self.check_members(now);
    }

    fn member_up(&mut self, now: Millis, id: NodeId) {
        self.out.emit(PeerEvent::MemberUp(id));
        self.machines_changed();
        if let Some(c) = &mut self.coord {
            c.joined(id);
            // Tell it whom to follow now rather than when SWIM's gossip
            // brings it word of the coordinator.
            self.tell([id]);
        }
        // A farm held by too few nodes (a mesh of one until now) gets a copy there.
        self.ensure_holders(now);
    }

    /// This node's beat (as coordinator, its claim, backlog and victims),
    /// sent to each of `to`, asking for nothing back.
    fn tell(&mut self, to: impl IntoIterator<Item = NodeId>) {
        let beat = Arc::new(self.beat());
        for id in to {
            self.out.send(id, Msg::Beat(beat.clone()));
        }
    }

    /// This node's beat, sent to `to` with a request for its beat back.
    fn ask(&mut self, to: NodeId) {
        let mut beat = self.beat();
        beat.ask = true;
        self.node.members.advertise(beat.queued);
        self.out.send(to, Msg::Beat(Arc::new(beat)));
    }

    /// Reports to the coordinator; with none, asks the node that would be
    /// elected whom it follows (the answer is how a joining node finds
    /// the coordinator). The coordinator itself reports to nobody.
    fn report(&mut self) {
        if let Some(seed) = self.node.election.seed() {
            // Joining: whom does the mesh follow? The seed says.
            self.ask(seed);
        }
        let to = match self.node.election.coordinator() {
            Some(c) if c == self.node.id => return,
            Some(c) => c,
            None => match self.node.members.lowest() {
                Some(l) if l < self.node.id && Some(l) != self.node.election.seed() => l,
                _ => return,
            },
        };
        self.ask(to);
    }

    /// On the coordinator: the members with the most tasks queued (itself
    /// included), largest first, for the workers to steal from.
    fn find_victims(&self) -> Vec<Victim> {
        const VICTIMS_MAX: usize = 8;
        let me = Victim {
            node: self.node.id,
            queued: self.worker.queued() as u32,
            prefetch: self.worker.depth(),
        };
        let mut v: Vec<Victim> = self
            .node
            .members
            .iter()
            .filter(|m| m.beat().queued > 0)
            .map(|m| Victim {
                node: m.id,
                queued: m.beat().queued,
                prefetch: m.beat().prefetch,
            })
            .chain((me.queued > 0).then_some(me))
            .collect();
        v.sort_by(|a, b| b.queued.cmp(&a.queued).then(a.node.cmp(&b.node)));
        v.truncate(VICTIMS_MAX);
        v
    }

    /// A queue grown well past what the last report said (work piled onto
    /// this node) is reported at once, so the coordinator names it as a
    /// victim within a message's time instead of a report's. The queue
    /// must at least double for another such report.
    fn beat_if_piled_up(&mut self) {
        let spare = self.worker.depth() as usize;
        if self.worker.queued() > spare.max(2 * self.node.members.advertised() as usize) {
            match self.node.election.coordinator() {
                Some(c) if c != self.node.id => self.ask(c),
                _ => {
                    self.node.members.advertise(self.worker.queued() as u32);
                    self.victims = self.find_victims();
                }
            }
        }
    }

    /// Members silent too long are dead: each in turn, with the others
    /// still alive, is forgotten by every role, and its claims re-queued.
    fn check_members(&mut self, now: Millis) {
        let watch = self.watch();
        let dead = self.node.members.expired(now, watch);
        let died = !dead.is_empty();
        for id in dead {
            self.node.members.remove(now, id);
            self.out.emit(PeerEvent::MemberDown(id));
            self.node.election.lost(id);
            self.steal.member_gone(id);
            if let Some(c) = &mut self.coord {
                c.reclaim(now, id, &self.node, &mut self.out);
            }
        }
        if died {
            self.machines_changed();
        }
    }

    fn elect(&mut self, now: Millis) {
        match self
            .node
            .election
            .round(now, self.node.id, &self.node.members)
        {
            Some(Vote::Follow { term, node }) => self.follow(now, term, node),
            Some(Vote::Elect(term)) => self.become_coordinator(now, term),
            None => {}
        }
    }

    fn follow(&mut self, now: Millis, term: u64, node: NodeId) {
        let before = self.node.election.coordinator();
        if let Some(o) = self.out.observed() {
            if before.is_some_and(|c| c != node) {
                o.failovers += 1;
            }
        }
        self.node.election.followed(now, term, node);
        if node != self.node.id {
            if let Some(old) = self.coord.take() {
                old.hand_over(self.node.id, node, &mut self.out);
                self.allocs.coordinating(None);
                // Workers it declared dead for their silence to it alone
                // (they may have followed the new coordinator first) are
                // SWIM's to judge again.
                self.node.members.unhide(now);
            }
        }
        self.out.emit(PeerEvent::Coordinator { term, node });
        if node != self.node.id {
            // Introduce this node to the coordinator now rather than at its
            // next report: it hands work only to members it knows.
            self.ask(node);
        }
        // Whatever the old coordinator knew, tell the new one.
        let holding = self.worker.holding();
        if !holding.is_empty() {
            self.out.send(
                node,
                Msg::Holding {
                    term,
                    tasks: holding,
                },
            );
        }
        self.holdings.offer_again();
        self.resend(now);
    }

    fn become_coordinator(&mut self, now: Millis, term: u64) {
        let machines = allocation::machines(&self.allocs, self.worker.total(), &self.node.members);
        let nodes = self.node.members.ids().chain([self.node.id]);
        let mut c = Coord::new(now, machines, nodes, self.rng.random());
        for stored in self.holdings.take_stored() {
            c.restore(now, self.node.id, stored);
        }
        // Every member says what it holds as soon as it follows (a round
        // trip after the claim below): work it runs is not handed out again.
        c.settle(now + self.node.cfg.resend_ms, self.node.members.ids());
        self.coord = Some(c);
        self.allocs.coordinating(Some(now));
        self.node.members.unwatch_all();
        self.coord_drain();
        self.ensure_holders(now);
        self.follow(now, term, self.node.id);
        // Every member hears the claim at once (not from gossip), so the
        // mesh changes over within a message's time at any size.
        self.victims = self.find_victims();
        let all: Vec<NodeId> = self.node.members.ids().collect();
        self.tell(all);
    }

    fn alloc_tick(&mut self, now: Millis) {
        let Some(c) = &self.coord else { return };
        let changed = allocation::tick(
            &mut self.allocs,
            now,
            self.node.election.term(),
            self.node.cfg.dead_after_ms,
            (c, &self.node.members, &self.worker, &self.specs),
            &mut self.out,
        );
        if changed {
            self.allocs_changed();
        }
    }

    // ----- the coordinator's steps -----

    fn coord_drain(&mut self) {
        if let Some(c) = &mut self.coord {
            c.drain(&mut self.out);
        }
    }

    fn assign(&mut self, now: Millis) {
        if self.coord.is_none() {
            return;
        }
        self.sync_machines();
        let Some(c) = &mut self.coord else { return };
        if c.settling(now) {
            return;
        }
        let me = coordinator::Local {
            total: self.worker.total(),
            depth: self.worker.depth(),
            deadline: self.worker.deadline(),
        };
        c.assign(now, &self.node, me, &mut self.out);
    }

    fn ensure_holders(&mut self, now: Millis) {
        if let Some(c) = &mut self.coord {
            c.ensure_holders(now, &self.node, &mut self.out);
        }
    }

    fn accept_ready(&mut self) {
        if let Some(c) = &mut self.coord {
            c.accept_ready(&self.node, &mut self.out);
        }
    }

    fn sync_holders(&mut self, now: Millis, progress: bool) {
        if let Some(c) = &mut self.coord {
            let holdings = &self.holdings;
            c.sync_holders(
                now,
                progress,
                |f| holdings.keeps(f),
                &self.node,
                &mut self.out,
            );
        }
    }

    /// A holder offers a farm: taken over if it is new here, merged if not.
    fn on_submit(
        &mut self,
        now: Millis,
        from: NodeId,
        farm: Arc<FarmSpec>,
        entries: Vec<Entry>,
        home: Home,
        writer: Option<Writer>,
    ) {
        self.sync_machines();
        let Some(c) = &mut self.coord else {
            // Not (or no longer) the coordinator: the holder resends to the right one.
            return;
        };
        if c.has_farm(farm.id) {
            c.resubmitted(now, from, farm.id, entries, home, &mut self.out);
            return;
        }
        self.specs.insert(farm.id, farm.clone());
        self.out.persist(Persist::Farm(farm.clone()));
        self.out.persist_entries(farm.id, entries.clone(), true);
        let spec = farm.clone();
        let keep = c.take_farm(now, from, farm, entries, home, writer, &self.node);
        c.report_early(now, spec.id, &self.node, &mut self.out);
        if keep
            && self
                .holdings
                .want_inputs(self.node.id, &spec, &mut self.out)
        {
            self.inputs_here(spec.id);
        }
        self.coord_drain();
        self.ensure_holders(now);
        self.accept_ready();
    }

    /// The home's claim of a farm and what it redid: its progress shown,
    /// and the end announced once every output is there.
    fn home_progress(&mut self, farm: FarmId) {
        self.holdings.home_progress(farm, &self.node, &mut self.out);
    }

    fn on_cancel(&mut self, from: NodeId, farm: FarmId) {
        if let Some(c) = &mut self.coord {
            c.cancel(farm, &mut self.out);
        }
        if self.node.election.coordinator() == Some(from) || from == self.node.id {
            self.worker.cancel(farm, &mut self.out);
        }
    }

    /// Sends again what has not been acknowledged: reports, offers of
    /// farms, requests for farm specs, log entries to holders, fetches of
    /// outputs; and tells the coordinator what this node holds, so claims
    /// whose messages were lost are found.
    /// `node` keeps outputs of `farms`: a home tells it which it may let
    /// go; the coordinator, asked by the node itself, passes the rest on to
    /// their homes (once: a home that is not one any more drops them).
    fn on_keeps(&mut self, from: NodeId, node: NodeId, farms: Vec<FarmId>) {
        let me = self.node.id;
        let mut homes: BTreeMap<NodeId, Vec<FarmId>> = BTreeMap::new();
        for farm in farms {
            let home = match self.holdings.get(farm) {
                Some(r) if r.home => {
                    if r.announced {
                        if node == me {
                            self.kept.remove(&farm);
                            self.out.push(Action::Forget { farm });
                        } else {
                            self.out.send(node, Msg::Collected { farm });
                        }
                    }
                    continue;
                }
                Some(r) => Some(r.home_of.node),
                None => self.specs.get(&farm).map(|s| s.origin),
            };
            if let Some(h) = home.filter(|&h| h != me && from == node && self.coord.is_some()) {
                homes.entry(h).or_default().push(farm);
            }
        }
        for (home, farms) in homes {
            self.out.send(home, Msg::Keeps { node, farms });
        }
    }

    fn resend(&mut self, now: Millis) {
        let leader = self.node.election.leader();
        allocation::resend(
            &self.allocs,
            self.coord.is_some(),
            leader,
            &self.node.members,
            &mut self.out,
        );
        self.holdings.resend(now, &self.node, &mut self.out);
        if let Some(c) = &mut self.coord {
            c.resend_holders(now, &self.node, &mut self.out);
        }
        if self.coord.is_some() {
            // Members that do not report here follow another coordinator
            // (the other side of a healed partition) or none yet: the claim
            // again, until they do.
            let strays: Vec<NodeId> = self
                .node
                .members
                .iter()
                .filter(|m| !m.direct)
                .map(|m| m.id)
                .collect();
            if !strays.is_empty() {
                self.tell(strays);
            }
        }
        let Some(c) = leader.node else { return };
        if !self.kept.is_empty() && now >= self.next_keeps {
            self.next_keeps = now + KEEPS_EVERY_MS;
            let (me, farms) = (self.node.id, self.kept.iter().copied().collect());
            if c == me {
                self.on_keeps(me, me, farms);
            } else {
                self.out.send(c, Msg::Keeps { node: me, farms });
            }
        }
        let term = leader.term;
        let tasks = self.worker.holding();
        if c == self.node.id {
            // The coordinator checks its own claims on itself the same way:
            // a steal whose answer to it was lost leaves a claim nobody holds.
            if let Some(coord) = &mut self.coord {
                coord.on_holding(now, c, tasks, self.node.cfg.resend_ms);
            }
        } else if !tasks.is_empty() {
            // Holding nothing, this node's beats say so (`Beat::idle`).
            self.out.send(c, Msg::Holding { term, tasks });
        }
        for farm in self.worker.awaited_specs() {
            self.out.send(c, Msg::GetFarm { farm });
        }
        // Not yet acknowledged, so maybe lost: sent again (the coordinator
        // counts each once).
        self.worker.report_unacked_again();
        self.worker
            .send_reports(now, self.node.cfg.batch_max, &mut self.out, leader);
        self.holdings.offer_unaccepted(c, &mut self.out);
    }

    // ----- the worker's steps -----

    fn on_assign(
        &mut self,
        now: Millis,
        from: NodeId,
        term: u64,
        tasks: Vec<Assigned>,
        echo: Option<Millis>,
    ) {
        if self.node.election.overtaken_by(from, term) {
            // The assignment overtook the new coordinator's first beat.
            self.follow(now, term, from);
        }
        if !self.node.election.current(from, term) {
            // A deposed coordinator: fenced off. It learns of the new term from beats.
            return;
        }
        if let Some(at) = echo {
            self.worker
                .round_trip(now, now.saturating_sub(at), self.node.cfg.queue_max);
        }
        for a in tasks {
            self.worker
                .enqueue(now, from, a, &self.specs, &mut self.out);
        }
        self.start_queued(now);
        self.beat_if_piled_up();
    }

    fn start_queued(&mut self, now: Millis) {
        self.worker
            .start_queued(now, &self.specs, &mut self.out, self.node.election.leader());
    }

    fn try_steal(&mut self, now: Millis) {
        let (coord, members, leader) =
            (&self.coord, &self.node.members, self.node.election.leader());
        let backlog = || match (coord, leader.node) {
            (Some(c), _) => c.backlog(),
            (None, Some(c)) => members.get(c).map_or(0, |m| m.beat().backlog),
            (None, None) => 0,
        };
        self.steal.try_steal(
            now,
            &self.node.cfg,
            &mut self.rng,
            &self.worker,
            backlog,
            &mut self.out,
        );
    }

    fn on_steal(&mut self, from: NodeId, id: u64, total: Resources, load: Resources, max: u32) {
        let given = self
            .worker
            .give_unstarted(&total, load, max, &self.specs, &mut self.out);
        self.out.stats.tasks_given += given.len() as u64;
        if !given.is_empty() {
            let tasks = given.clone();
            self.node
                .election
                .leader()
                .send(&mut self.out, |term| Msg::Moved {
                    term,
                    to: from,
                    tasks,
                });
        }
        self.out.send(from, Msg::Stolen { id, tasks: given });
    }

    fn on_stolen(&mut self, now: Millis, from: NodeId, id: u64, tasks: Vec<Assigned>) {
        let interrupted = self.worker.interrupted();
        match self
            .steal
            .answered(now, from, id, &tasks, interrupted, &mut self.out)
        {
            Answer::Ignored => {}
            // Try another.
            Answer::Empty => self.try_steal(now),
            Answer::Stale => {
                // Stale: the tasks are this node's now, but it gave up
                // waiting. Hand them back to the coordinator rather than drop them.
                self.node
                    .election
                    .leader()
                    .send(&mut self.out, |term| Msg::Release { term, tasks });
            }
            Answer::Won => {
                for a in tasks {
                    self.worker
                        .enqueue(now, from, a, &self.specs, &mut self.out);
                }
                self.start_queued(now);
                self.try_steal(now);
            }
        }
    }

    // ----- checks -----

    /// Checks the peer's invariants that are cheap enough for every step of
    /// the simulator (no pass over tasks): nothing free beyond its total,
    /// and as coordinator, the engine's cheap checks and one claim per task
    /// the engine counts as running.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.worker
            .check_bounds()
            .map_err(|e| format!("node {}: {e}", self.node.id))?;
        self.check_coord_counts()
    }

    fn check_coord_counts(&self) -> Result<(), String> {
        match &self.coord {
            Some(c) => c.check_counts(self.node.id),
            None => Ok(()),
        }
    }

    /// The checks of [`Peer::check_tasks`] on what changed since the last
    /// call (the pool against the grants counted as tasks started and ended here, the
    /// nodes whose claims changed, the stages whose runs did), after every
    /// step at a cost that does not grow with the mesh.
    pub fn check_step(&mut self) -> Result<(), String> {
        self.worker
            .check_step()
            .map_err(|e| format!("node {}: {e}", self.node.id))?;
        self.check_coord_counts()?;
        match &mut self.coord {
            Some(c) => c.check_step(self.node.id),
            None => Ok(()),
        }
    }

    /// The deeper checks, a pass over the peer's tasks: what its pool has
    /// lent matches its running tasks' grants; as coordinator (thousands of
    /// claims), the engine's runs per stage and each node's claims against
    /// the load the coordinator books for it.
    pub fn check_tasks(&self) -> Result<(), String> {
        self.worker
            .check_tasks()
            .map_err(|e| format!("node {}: {e}", self.node.id))?;
        match &self.coord {
            Some(c) => c.check_tasks(self.node.id),
            None => Ok(()),
        }
    }

    /// Every check, the coordinator's counters against a scan of every
    /// task included (see `Engine::audit`): for tests and the end of a
    /// simulation.
    pub fn audit(&self) -> Result<(), String> {
        self.check_invariants()?;
        self.check_tasks()?;
        match &self.coord {
            Some(c) => c.engine().audit(),
            None => Ok(()),
        }
    }

    // ----- what a node answers about farms -----

    /// The coordinator's view of a farm's progress, when this node coordinates it.
    pub fn coordinated_progress(&self, farm: FarmId) -> Option<engine::Counts> {
        self.coord.as_ref()?.progress(farm)
    }

    /// Which node runs a task now (true), or ran it to its end, as far as
    /// this node knows (as coordinator, or from its copy of the farm).
    pub fn where_ran(&self, farm: FarmId, task: TaskRef) -> Option<(NodeId, bool)> {
        if self.worker.runs(farm, task) {
            return Some((self.node.id, true));
        }
        if let Some(r) = self.coord.as_ref().and_then(|c| c.where_ran(farm, task)) {
            return Some(r);
        }
        self.holdings.get(farm).and_then(|r| ended_on(&r.log, task))
    }

    /// Whether this node runs the task now.
    pub fn runs(&self, farm: FarmId, task: TaskRef) -> bool {
        self.worker.runs(farm, task)
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
        self.coord.as_ref()?.farm_view(farm, failures_max)
    }

    /// The log of a farm this node coordinates.
    pub fn coordinated_log(&self, farm: FarmId) -> Option<&FarmLog> {
        self.coord.as_ref()?.log(farm)
    }

    /// Farms this node coordinates.
    pub fn coordinated(&self) -> Vec<FarmId> {
        self.coord
            .as_ref()
            .map_or(Vec::new(), |c| c.slots().to_vec())
    }
}

/// Where a farm's log says a task ended: the node, and not running.
fn ended_on(log: &FarmLog, task: TaskRef) -> Option<(NodeId, bool)> {
    match log.get(task) {
        Some(Entry::Done { node, .. } | Entry::Failed { node, .. }) => Some((*node, false)),
        _ => None,
    }
}
