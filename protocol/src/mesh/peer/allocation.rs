//! The peer's side of allocation queues (`mesh alloc`): what the coordinator tells the queues (backlog by kind, which jobs' nodes have work), and the book's copies kept in step.
//!
//! The decisions themselves are `Allocs`' (`alloc/book.rs`) and
//! `alloc::Scaler`'s; this room gathers their inputs from the other roles.

use super::super::msg::*;
use super::action::{Action, Persist};
use super::coordinator::Coord;
use super::election::Leader;
use super::membership::Membership;
use super::out::Out;
use super::Coordinating;
use crate::alloc::book::Allocs;
use crate::alloc::Backlog;
use crate::engine::Millis;
use crate::eta::{self, JobShape, WorkLeft};
use crate::resources::{Amount, Resources, CPU, GPU};

/// The coordinator's look at its allocation queues: the backlog by
/// kind, which nodes the jobs started and whether they have work. True
/// when the book changed (never on a node that does not coordinate).
pub(super) fn tick(cx: &mut Coordinating, now: Millis) -> bool {
    let Some(coord) = cx.coord.as_ref() else {
        return false;
    };
    let (members, worker, specs) = (&cx.node.members, cx.worker, cx.specs);
    let (allocs, out) = (&mut *cx.allocs, &mut *cx.out);
    let term = cx.node.election.term();
    // How long a new coordinator listens before it decides.
    let grace = cx.node.cfg.dead_after_ms;
    let mut backlog = backlog(allocs, coord);
    // Work nodes claimed that cannot start within a minute where it is
    // queued: the new nodes steal it once they are up.
    let room = |gpus: bool| room(allocs, gpus);
    let own = worker.late(now, specs, room);
    for (cores, gpus) in members
        .iter()
        .map(|m| (m.beat().late_cores, m.beat().late_gpus))
        .chain([own])
    {
        backlog.cores += u64::from(cores);
        backlog.gpus += u64::from(gpus);
    }
    let mut activity: Vec<(String, bool)> = members
        .iter()
        .filter_map(|m| {
            let b = m.beat();
            b.job.clone().map(|j| (j, b.running + b.queued > 0))
        })
        .collect();
    if let Some(j) = worker.job() {
        activity.push((j.clone(), worker.running_count() > 0 || worker.queued() > 0));
    }
    // Stages whose tasks are expected to take longer than a queue's
    // jobs live would wait for ever on its nodes: said once, in the log.
    let long = coord.expected_stages();
    let mut changed = allocs.warn_expected(now, term, &long);
    let due = allocs.to_plan(now);
    if !due.is_empty() {
        let nodes: Vec<Resources> = std::iter::once(worker.total().clone())
            .chain(members.iter().map(|m| (*m.beat().total).clone()))
            .collect();
        let (stages, requests) = coord.stages_left(&nodes);
        let work = WorkLeft {
            stages: &stages,
            requests: &requests,
            nodes: &nodes,
        };
        let plans = due
            .into_iter()
            .map(|q| {
                let shape = JobShape {
                    node: q.def.node_resources(),
                    nodes_per_job: q.def.nodes_per_job,
                    wait_ms: q.wait_ms,
                };
                let most = q.def.max.saturating_sub(q.joined);
                let plan = eta::plan(work, &shape, q.left_ms, most, now);
                (q, plan)
            })
            .collect();
        changed |= allocs.planned(now, term, plans);
    }
    let (ops, ticked) = allocs.tick(now, term, grace, backlog, &activity);
    changed |= ticked;
    out.actions.extend(ops.into_iter().map(Action::Batch));
    changed
}

/// Ready work no node has claimed, in whole cores (tasks without GPUs)
/// and GPUs (tasks with): what allocation queues of each kind are for
/// (with the claimed work that waits, counted in `tick`).
fn backlog(allocs: &Allocs, coord: &Coord) -> Backlog {
    let mut b = Backlog::default();
    // Work no queue's nodes live long enough for (its `expected` is
    // longer) asks for no job: they would idle, and never be cancelled
    // while it waits.
    let (cpu_ms, gpu_ms) = (room(allocs, false), room(allocs, true));
    for (stage, n) in coord.engine().waiting_stages() {
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

/// The longest a node of the queues for GPU work (or for the rest) lives
/// to run tasks: work expected to take longer asks for no job.
pub(super) fn room(allocs: &Allocs, gpus: bool) -> Millis {
    allocs
        .book()
        .queues
        .iter()
        .filter(|q| q.def.for_gpus() == gpus)
        .map(|q| q.def.usable_ms())
        .max()
        .unwrap_or(0)
}

/// The coordinator changed the book: durable here, and sent to everyone.
pub(super) fn changed(allocs: &Allocs, members: &Membership, out: &mut Out) {
    let book = allocs.book().clone();
    out.persist(Persist::Allocs(book.clone()));
    for n in members.ids() {
        out.send(n, Msg::Allocs(book.clone()));
    }
}

/// Whether a member's `resend` would send the book to no one: there is
/// none, or the coordinator's beat says it holds this version or a
/// later one.
pub(super) fn in_step(allocs: &Allocs, leader: Leader, members: &Membership) -> bool {
    let v = allocs.version();
    v == (0, 0)
        || leader
            .node
            .and_then(|c| members.get(c))
            .is_none_or(|m| m.beat().allocs >= v)
}

/// Brings the book's copies in step: the coordinator sends it to
/// members whose beat shows an older one, a member to a coordinator
/// that has an older one than its own.
pub(super) fn resend(
    allocs: &Allocs,
    coordinating: bool,
    leader: Leader,
    members: &Membership,
    out: &mut Out,
) {
    let v = allocs.version();
    if v == (0, 0) {
        return;
    }
    let to: Vec<NodeId> = if coordinating {
        members
            .iter()
            .filter(|m| m.beat().allocs < v)
            .map(|m| m.id)
            .collect()
    } else if in_step(allocs, leader, members) {
        return;
    } else {
        leader.node.into_iter().collect()
    };
    for n in to {
        let book = allocs.book().clone();
        out.send(n, Msg::Allocs(book));
    }
}

/// The machines a stage must fit one of: this node, the members, and a
/// node of each allocation queue that may still submit (its jobs would
/// come for the work, so it is not failed as unplaceable).
pub(super) fn machines(allocs: &Allocs, own: &Resources, members: &Membership) -> Vec<Resources> {
    std::iter::once(own.clone())
        .chain(members.iter().map(|m| (*m.beat().total).clone()))
        .chain(
            allocs
                .book()
                .queues
                .iter()
                .filter(|q| q.paused.is_none() && q.def.max > 0)
                .map(|q| q.def.node_resources()),
        )
        .collect()
}
