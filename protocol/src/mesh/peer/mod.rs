//! One node of the mesh as a sans-IO state machine: `Peer`, the dispatcher over its roles (membership, election, coordinator, worker, stealing, holder and home, allocation); steps that concern several roles are functions in the `on_*` files, named by their event, over the roles they borrow.
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
//! inputs to them:
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
//! This file holds the `Peer` and the routing of its inputs (the driver's
//! calls themselves are in `driver_api.rs`): each input
//! (a message in `dispatch_msg`, a timeout, a call of the driver) goes to
//! the role it concerns or, where one event reaches several roles, to a
//! function named by the event that borrows only the roles it touches
//! and says in which order they hear of it:
//!
//! - `on_members.rs`: a beat heard, members up or dead, a heartbeat, an
//!   election round, a coordinator followed or elected.
//! - `on_tasks.rs`: tasks assigned, a farm's definition arrived, a resend
//!   due, a steal asked or answered, and the coordinator's draining and
//!   placing.
//! - `on_farms.rs`: a farm submitted, offered, copied, cancelled or
//!   collected, a home taken, inputs arrived, kept outputs told, the
//!   allocation queues.
//! - `borrows.rs`: the views of several roles lent to those functions
//!   where one borrows many at once (`Roles`, for the steps that tell
//!   this node's beat, which speaks of every role).
//! - `driver_api.rs`: the driver's whole API (every `pub fn` of `Peer`),
//!   in the order of quinn's `Connection`: construction and setup, what
//!   the driver polls, what it feeds in, what it reads, and the checks.
//!
//! No step hands context to another through the peer's fields: what one
//! part of a step tells the next goes as an argument.
//!
//! Like the engine it does no I/O and reads no clock: the driver feeds it
//! messages, finished tasks and the time, and carries out its [`Action`]s in
//! order, making every `Persist` durable before any later action.

mod action;
mod allocation;
mod borrows;
mod config;
mod coordinator;
mod driver_api;
mod due;
mod election;
mod holder;
mod membership;
mod on_farms;
mod on_members;
mod on_tasks;
mod out;
mod placement;
mod steal;
mod worker;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};

use super::msg::*;
use super::replica::{FarmLog, Replica, StoredFarm};
use crate::alloc::book::{AllocBook, AllocCmd, Allocs};
use crate::alloc::{BatchSystem, JobState, QueueDef};
use crate::engine::{self, Millis, Outcome};
use crate::farm::TaskRef;
use crate::observe::{Latencies, Latency};
use crate::resources::Resources;
use crate::wire::PROTOCOL_VERSION;

pub use action::{Action, Fetched, PeerEvent, Persist, Quiet, QuietSwim};
pub use config::Config;
pub use due::{TimerKind, TimersDue};
pub use election::{ballot, term_round};
pub use membership::{member_hash, Member};
pub use out::Stats;

use borrows::{Coordinating, Roles, Told, Working};
use coordinator::{Coord, Echoes};
use election::{Election, Vote};
use holder::{FetchAnswered, Holdings};
use membership::{Membership, RosterHeard};
use out::Out;
use steal::{Answer, Stealing};
use worker::{keep_spec, Ended, Specs, Worker};

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

/// One node of a mesh as a state machine: its membership, election,
/// worker, holdings and (when elected) coordinator, driven by its driver's
/// calls and read back as actions.
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
    kept: Kept,
    said: Said,
    out: Out,
    /// The time of the latest input (for beats, which take none).
    clock: Millis,
    /// The wake `poll_promise` last answered, until the next input: a
    /// timer is due by `now` exactly when it is at or before `now`, as
    /// nothing has changed since (the simulator asks after every step).
    /// Spares the input's own look over every timer (`due_by`).
    polled: Option<Millis>,
}

/// Farms whose outputs this node found in its state when it started,
/// until their homes say they are collected, and when it next asks.
struct Kept {
    farms: BTreeSet<FarmId>,
    next_ask: Millis,
}

/// What this node tells of itself in its beats that no role owns.
struct Said {
    /// On the coordinator: the members with the most tasks queued, as
    /// of the last look at the members, told to every worker it answers.
    victims: Arc<[Victim]>,
    /// What `victims` were found from: the members' `loads`, and this
    /// node's own queue and prefetch depth.
    victims_of: Option<(u64, u32, u32)>,
    /// This node's open-file limit, as its driver says (0: not known).
    files_max: u64,
    /// This node's GPUs (id, model), as its driver found them.
    gpus: Vec<(String, String)>,
    /// This node's machine, as its driver last measured it.
    machine: Option<MachineLoad>,
}

impl Peer {
    // ----- what every input does first -----

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
    pub(super) fn woke(&mut self, now: Millis) {
        self.clock = self.clock.max(now);
        let Some(last_beat) = self.silent_since(now) else {
            return;
        };
        self.node.members.refresh(now, self.node.cfg.heartbeat_ms);
        self.worker
            .give_back_silent(now - last_beat, &mut self.out, self.node.election.leader());
    }

    /// The heartbeat before this node's silence, where an input at `now`
    /// finds it silent for half the death timeout or more (see `woke`).
    pub(super) fn silent_since(&self, now: Millis) -> Option<Millis> {
        let last_beat = self
            .node
            .members
            .next_beat()
            .saturating_sub(self.node.cfg.heartbeat_ms);
        (now > last_beat + self.node.cfg.dead_after_ms / 2).then_some(last_beat)
    }

    // ----- the message loop -----

    /// Members that came up or went down since the last look are handled
    /// now, in the step that learnt of them.
    fn settle_members(&mut self, now: Millis) {
        let watch = on_members::watch(&self.node, self.clock);
        if self.node.members.has_news() || self.node.members.watch_changed(watch) {
            on_members::members_changed(&mut self.roles(), now);
        }
    }

    /// Handles messages (including those this node sent itself) until none is left.
    pub(super) fn pump(&mut self, now: Millis) {
        self.pump_with(now, |_| {});
    }

    /// `pump`, with `first` handled where the inbox's first message is: an
    /// input that is not a message (a membership packet in closed form).
    pub(super) fn pump_with(&mut self, now: Millis, first: impl FnOnce(&mut Self)) {
        self.settle_members(now);
        self.worker.send_reports(
            now,
            self.node.cfg.batch_max,
            &mut self.out,
            self.node.election.leader(),
        );
        first(self);
        // Local to the step, so that no report's clock outlives it.
        let mut echo = Echoes::default();
        while let Some((from, msg)) = self.out.inbox.pop_front() {
            self.dispatch_msg(now, from, msg, &mut echo);
        }
        // A beat or a roster may have brought a member, or its end.
        self.settle_members(now);
        let reporters: Vec<NodeId> = match &self.coord {
            Some(c) if !echo.is_empty() && c.backlog() == 0 => echo.keys().copied().collect(),
            _ => Vec::new(),
        };
        self.drain_and_assign(now, std::mem::take(&mut echo));
        on_tasks::point_thieves(&mut self.roles(), now, reporters);
        // Assignments to this node itself arrive through the inbox.
        while let Some((from, msg)) = self.out.inbox.pop_front() {
            self.dispatch_msg(now, from, msg, &mut echo);
            self.drain_and_assign(now, std::mem::take(&mut echo));
        }
        on_farms::sync_holders(
            now,
            false,
            &self.node,
            self.coord.as_mut(),
            &self.holdings,
            &mut self.out,
        );
        // Holders' answers to this node itself (no reports to echo: a
        // coordinator's own are not).
        while let Some((from, msg)) = self.out.inbox.pop_front() {
            self.dispatch_msg(now, from, msg, &mut echo);
        }
        self.worker.persist_unacked(&mut self.out);
    }

    /// On the coordinator: what its engines decided goes out, then ready
    /// tasks go to nodes with room.
    fn drain_and_assign(&mut self, now: Millis, echo: Echoes) {
        on_tasks::drain(self.coord.as_mut(), &mut self.out);
        on_tasks::assign(&mut self.coordinating(), now, echo);
    }

    /// One message from `from`, to the roles it is for: membership and the
    /// allocation queues, farms (submission, copies, cancels), or tasks
    /// (assignments, reports, steals), a worker's report's clock added to
    /// `echo`, this step's (see [`Echoes`]). Each kind is named here, so a
    /// new message is routed on purpose.
    pub(super) fn dispatch_msg(&mut self, now: Millis, from: NodeId, msg: Msg, echo: &mut Echoes) {
        match msg {
            m @ (Msg::Beat(_)
            | Msg::Swim(_)
            | Msg::Roster { .. }
            | Msg::Alloc(_)
            | Msg::Allocs(_)) => self.members_msg(now, from, m),
            m @ (Msg::Submit { .. }
            | Msg::Offer { .. }
            | Msg::Accepted { .. }
            | Msg::Refused { .. }
            | Msg::Replicate { .. }
            | Msg::ReplicateGrown { .. }
            | Msg::Replicated { .. }
            | Msg::Sync(_)
            | Msg::Redo { .. }
            | Msg::Synced { .. }
            | Msg::Collected { .. }
            | Msg::Keeps { .. }
            | Msg::GetFarm { .. }
            | Msg::Farm(_)
            | Msg::Grown(_)
            | Msg::Cancel { .. }
            | Msg::CancelTask { .. }) => self.farm_msg(now, from, m),
            m @ (Msg::Assign { .. }
            | Msg::Report { .. }
            | Msg::Ack { .. }
            | Msg::Release { .. }
            | Msg::Claimed { .. }
            | Msg::Steal { .. }
            | Msg::Stolen { .. }
            | Msg::Moved { .. }
            | Msg::Failure(_)) => self.task_msg(now, from, m, echo),
        }
    }

    /// Membership and the allocation queues.
    fn members_msg(&mut self, now: Millis, from: NodeId, msg: Msg) {
        match msg {
            Msg::Beat(b) => on_members::beat_heard(&mut self.roles(), now, from, b),
            Msg::Swim(data) => {
                self.node.members.handle_swim(now, &data, &mut self.out);
                on_members::members_changed(&mut self.roles(), now);
            }
            Msg::Roster {
                kind,
                digest,
                members,
            } => {
                let heard = RosterHeard {
                    from,
                    kind,
                    digest,
                    members,
                };
                self.node.members.on_roster(now, heard, &mut self.out);
                on_members::members_changed(&mut self.roles(), now);
            }
            Msg::Alloc(cmd) => on_farms::alloc_asked(
                now,
                *cmd,
                &self.node,
                self.coord.as_mut(),
                &mut self.allocs,
                &mut self.out,
            ),
            Msg::Allocs(book) => {
                on_farms::book_heard(book, self.coord.as_mut(), &mut self.allocs, &mut self.out)
            }
            _ => unreachable!("dispatch_msg routes only membership messages here"),
        }
    }

    /// A farm's spec asked for and sent, whole or as what it added.
    fn spec_msg(&mut self, now: Millis, from: NodeId, msg: Msg) {
        match msg {
            Msg::GetFarm { farm, have } => {
                if let Some(spec) = self.specs.get(&farm) {
                    let grown = have.and_then(|h| Growth::since(h, spec));
                    let msg = match grown {
                        Some(g) => Msg::Grown(Box::new(g)),
                        None => Msg::Farm(spec.clone()),
                    };
                    self.out.send(from, msg);
                }
            }
            Msg::Farm(spec) => {
                let id = spec.id;
                keep_spec(&mut self.specs, &spec);
                on_tasks::spec_arrived(&mut self.working(), now, id);
            }
            Msg::Grown(g) => {
                let id = g.farm;
                match self.specs.get(&id).and_then(|was| g.apply(was)) {
                    Some(next) => {
                        keep_spec(&mut self.specs, &Arc::new(next));
                        on_tasks::spec_arrived(&mut self.working(), now, id);
                    }
                    // Not what it grows (a later copy came first, or the one
                    // here is gone): the whole spec, unless one as late is here.
                    None => {
                        if self.specs.get(&id).is_none_or(|s| s.gen < g.gen) {
                            self.out.send(
                                from,
                                Msg::GetFarm {
                                    farm: id,
                                    have: None,
                                },
                            );
                        }
                    }
                }
            }
            _ => unreachable!("farm_msg routes only spec messages here"),
        }
    }

    /// A farm's submission, copies, sync and cancels.
    fn farm_msg(&mut self, now: Millis, from: NodeId, msg: Msg) {
        match msg {
            Msg::Submit {
                farm,
                entries,
                home,
                writer,
            } => {
                on_members::sync_machines(
                    self.coord.as_mut(),
                    &self.allocs,
                    &self.worker,
                    &self.node.members,
                );
                let offered = coordinator::Offered {
                    now,
                    from,
                    farm,
                    entries,
                    home,
                    writer,
                };
                on_farms::farm_offered(
                    offered,
                    &self.node,
                    self.coord.as_mut(),
                    &mut self.specs,
                    &mut self.holdings,
                    &mut self.out,
                )
            }
            Msg::Offer { farm, entries } => {
                if let Some(c) = &mut self.coord {
                    c.on_offer(now, from, farm, entries, &mut self.out);
                }
            }
            Msg::Accepted { farm, tasks } => self.holdings.on_accepted(farm, tasks, &mut self.out),
            Msg::Refused { farm, reason } => self.holdings.on_refused(farm, reason, &mut self.out),
            Msg::Replicate { farm, term } => on_farms::copy_asked(
                on_farms::CopyAsked { from, farm, term },
                &self.node,
                &mut self.specs,
                &mut self.holdings,
                &mut self.out,
            ),
            Msg::ReplicateGrown { term, growth } => on_farms::copy_grown(
                on_farms::CopyGrown { from, growth, term },
                &self.node,
                &mut self.specs,
                &mut self.holdings,
                &mut self.out,
            ),
            Msg::Replicated { farm, gen } => on_farms::copy_made(
                from,
                farm,
                gen,
                &self.node,
                self.coord.as_mut(),
                &mut self.out,
            ),
            Msg::Sync(m) => {
                self.holdings
                    .on_sync(now, from, *m, &self.node, &mut self.out);
            }
            Msg::Redo { farm, tasks } => {
                if let Some(c) = &mut self.coord {
                    c.on_redo(farm, tasks, &mut self.out);
                }
            }
            Msg::Synced {
                farm,
                next,
                over,
                stages,
            } => {
                if let Some(c) = &mut self.coord {
                    let acked = coordinator::SyncAcked {
                        from,
                        farm,
                        next,
                        over,
                        stages,
                    };
                    c.on_synced(acked, &self.node, &mut self.out);
                }
            }
            Msg::Collected { farm } => {
                on_farms::farm_collected(farm, &mut self.kept, &mut self.out)
            }
            Msg::Keeps { node, farms } => on_farms::keeps_told(
                on_farms::KeepsTold {
                    from,
                    node,
                    farms,
                    coordinating: self.coord.is_some(),
                },
                &self.node,
                &self.holdings,
                &self.specs,
                &mut self.kept,
                &mut self.out,
            ),
            m @ (Msg::GetFarm { .. } | Msg::Farm(_) | Msg::Grown(_)) => self.spec_msg(now, from, m),
            Msg::Cancel { farm } => on_farms::farm_cancelled(
                from,
                farm,
                &self.node,
                self.coord.as_mut(),
                &mut self.worker,
                &mut self.out,
            ),
            Msg::CancelTask { farm, task } => on_farms::task_cancelled(
                on_farms::CancelAsked { from, farm, task },
                &self.node,
                self.coord.as_mut(),
                &mut self.worker,
                &mut self.out,
            ),
            _ => unreachable!("dispatch_msg routes only farm messages here"),
        }
    }

    /// Tasks: assignments, reports and their acks, claims, steals.
    fn task_msg(&mut self, now: Millis, from: NodeId, msg: Msg, echo: &mut Echoes) {
        match msg {
            Msg::Assign {
                term,
                tasks,
                echo,
                clock,
            } => {
                on_tasks::tasks_assigned(&mut self.roles(), now, from, term, tasks, echo);
                self.node.election.saw(from, term, clock);
            }
            Msg::Report {
                reports,
                at,
                prefetch,
                ..
            } => {
                if let Some(c) = &mut self.coord {
                    if from != self.node.id {
                        c.note_report(now, from, prefetch);
                        echo.insert(from, at);
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
            Msg::Claimed { term, tasks, seen } => {
                if let Some(c) = &mut self.coord {
                    let seen = self.node.election.seen_in(term, seen);
                    c.on_claims_listed(now, from, &tasks, self.node.cfg.resend_ms, seen);
                }
            }
            Msg::Steal {
                id,
                total,
                load,
                max,
            } => on_tasks::steal_asked(
                on_tasks::StealAsked {
                    from,
                    id,
                    total,
                    load,
                    max,
                },
                &mut self.worker,
                &self.specs,
                self.node.election.leader(),
                &mut self.out,
            ),
            Msg::Stolen { id, tasks } => {
                on_tasks::steal_answered(&mut self.working(), now, from, id, tasks)
            }
            Msg::Moved { to, tasks, .. } => {
                if let Some(c) = &mut self.coord {
                    c.on_moved(now, from, to, tasks);
                }
            }
            Msg::Failure(f) => self.out.emit(PeerEvent::Failure(f)),
            _ => unreachable!("dispatch_msg routes only task messages here"),
        }
    }
}

/// Where a farm's log says a task ended: the node, and not running.
fn ended_on(log: &FarmLog, task: TaskRef) -> Option<(NodeId, bool)> {
    match log.get(task) {
        Some(Entry::Done { node, .. } | Entry::Failed { node, .. }) => Some((*node, false)),
        _ => None,
    }
}
