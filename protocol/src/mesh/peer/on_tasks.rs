//! Work through the roles, one function per event (tasks assigned, a farm's definition arrived, a resend due, a queue piled up, a steal asked or answered), each over the roles it borrows; and the coordinator's draining and placing.

use super::*;

/// On the coordinator: the members with the most tasks queued (itself
/// included), largest first, for the workers to steal from.
pub(super) fn find_victims(node: &Node, worker: &Worker) -> Arc<[Victim]> {
    const VICTIMS_MAX: usize = 8;
    let me = Victim {
        node: node.id,
        queued: worker.queued() as u32,
        prefetch: worker.depth(),
    };
    let mut v: Vec<Victim> = node
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
    v.into()
}

/// The coordinator's victims found again (`find_victims`) where what
/// they are found from changed since the last look: the look at every
/// heartbeat went over every member's beat, 2.4% of a quiet farm's run
/// at 20 nodes.
pub(super) fn victims_again(said: &mut Said, node: &Node, worker: &Worker) {
    let of = (node.members.loads(), worker.queued() as u32, worker.depth());
    if said.victims_of != Some(of) {
        said.victims = find_victims(node, worker);
        said.victims_of = Some(of);
    }
    debug_assert_eq!(said.victims, find_victims(node, worker), "victims as found");
}

/// On the coordinator, once it has nothing left to hand out: the nodes
/// whose reports this step answered and that have room are told at once
/// whom to steal from (its beat, with the victims), rather than at their
/// next report, which comes every N / `reports_per_s` seconds in a mesh
/// of N nodes: longer than the end of a farm of short tasks lasts.
pub(super) fn point_thieves(r: &mut Roles, now: Millis, mut reporters: Vec<NodeId>) {
    let Some(c) = r.coord.as_mut() else { return };
    if reporters.is_empty() || c.backlog() > 0 || !r.node.cfg.steal {
        return;
    }
    // A member's resources as its beat said; none known for one heard only by SWIM.
    let members = &r.node.members;
    let total = |id: NodeId| {
        members
            .get(id)
            .map(|m| &*m.beat().total)
            .filter(|t| !t.is_empty())
    };
    reporters.sort_unstable();
    reporters.retain(|&n| total(n).is_some_and(|t| c.has_room(n, t)));
    let me = Victim {
        node: r.node.id,
        queued: r.worker.queued() as u32,
        prefetch: r.worker.depth(),
    };
    let dealt: Vec<(NodeId, Vec<Victim>)> = reporters
        .into_iter()
        .map(|n| (n, c.deal(now, me, total)))
        .filter(|(n, v)| v.iter().any(|v| v.node != *n))
        .collect();
    if dealt.is_empty() {
        return;
    }
    let said = std::mem::take(&mut r.said.victims);
    for (n, victims) in dealt {
        r.said.victims = victims.into();
        on_members::tell(r, [n]);
    }
    r.said.victims = said;
}

/// A queue grown well past what the last report said (work piled onto
/// this node) is reported at once, so the coordinator names it as a
/// victim within a message's time instead of a report's. The queue
/// must at least double for another such report.
fn queue_grew(r: &mut Roles) {
    let spare = r.worker.depth() as usize;
    if r.worker.queued() > spare.max(2 * r.node.members.advertised() as usize) {
        match r.node.election.coordinator() {
            Some(c) if c != r.node.id => on_members::ask_beat(r, c),
            _ => {
                r.node.members.advertise(r.worker.queued() as u32);
                victims_again(r.said, r.node, r.worker);
            }
        }
    }
}

// ----- the coordinator's steps -----

/// The coordinator's engine decisions turned into entries and messages.
pub(super) fn drain(coord: Option<&mut Coord>, out: &mut Out) {
    if let Some(c) = coord {
        c.drain(out);
    }
}

/// On the coordinator: ready tasks handed to nodes with room, once the
/// members have said what they hold. A coordinator still settling assigns
/// nothing, and this step's `echo` goes with the step.
pub(super) fn assign(cx: &mut Coordinating, now: Millis, echo: coordinator::Echoes) {
    let Some(c) = cx.coord.as_mut() else { return };
    on_members::sync_machines(Some(&mut *c), cx.allocs, cx.worker, &cx.node.members);
    if c.settling(now) {
        return;
    }
    let me = coordinator::Local {
        total: cx.worker.total(),
        depth: cx.worker.depth(),
        deadline: cx.worker.deadline(),
    };
    c.assign(now, cx.node, me, echo, cx.out);
}

/// Whether this node's reports to its coordinator come at least as
/// often as its resend round, so the claims they list need no list of
/// their own (up to 200 nodes, where a report goes every second or
/// more often).
pub(super) fn lists_with_reports(node: &Node, clock: Millis) -> bool {
    on_members::report_interval(node, clock) <= node.cfg.resend_ms
}

/// Sends again what has not been acknowledged: reports, offers of
/// farms, requests for farm specs, log entries to holders, fetches of
/// outputs; lists what this node holds where its reports do not come as
/// often; as the coordinator, checks its own claims on itself.
pub(super) fn resend_due(r: &mut Roles, now: Millis) {
    let leader = r.node.election.leader();
    allocation::resend(r.allocs, r.coord.is_some(), leader, &r.node.members, r.out);
    r.holdings.resend(now, r.node, r.out);
    if let Some(c) = r.coord.as_mut() {
        c.resend_holders(now, r.node, r.out);
    }
    if r.coord.is_some() {
        // Members that do not report here follow another coordinator
        // (the other side of a healed partition) or none yet: the claim
        // again, until they do.
        let strays: Vec<NodeId> = r
            .node
            .members
            .iter()
            .filter(|m| !m.direct())
            .map(|m| m.id)
            .collect();
        if !strays.is_empty() {
            on_members::tell(r, strays);
        }
    }
    let Some(c) = leader.node else { return };
    let me = r.node.id;
    if !r.kept.farms.is_empty() && now >= r.kept.next_ask {
        r.kept.next_ask = now + KEEPS_EVERY_MS;
        let farms = r.kept.farms.iter().copied().collect();
        if c == me {
            let told = on_farms::KeepsTold {
                from: me,
                node: me,
                farms,
                coordinating: r.coord.is_some(),
            };
            on_farms::keeps_told(told, r.node, r.holdings, r.specs, r.kept, r.out);
        } else {
            r.out.send(c, Msg::Keeps { node: me, farms });
        }
    }
    // A worker's reports list what it holds (`Beat::claimed`); where
    // they come further apart than this round, it lists them here too,
    // so a lost assignment costs a busy worker about a second at any
    // size. The coordinator checks its own claims on itself the same
    // way: a steal whose answer to it was lost leaves a claim nobody
    // holds.
    if c == me {
        if let Some(coord) = r.coord.as_mut() {
            let tasks = r.worker.claimed();
            coord.on_claims_listed(now, c, &tasks, r.node.cfg.resend_ms, now);
        }
    } else if !lists_with_reports(r.node, now) {
        let tasks = r.worker.claimed();
        if !tasks.is_empty() {
            // Holding nothing, this node's beats say so (`Beat::idle`).
            let (term, seen) = (leader.term, r.node.election.seen());
            r.out.send(c, Msg::Claimed { term, tasks, seen });
        }
    }
    for farm in r.worker.awaited_specs() {
        r.out.send(c, worker::get_farm(r.specs, farm));
    }
    // Not yet acknowledged, so maybe lost: sent again (the coordinator
    // counts each once).
    r.worker.report_unacked_again();
    r.worker
        .send_reports(now, r.node.cfg.batch_max, r.out, leader);
    r.holdings.offer_unaccepted(c, r.out);
}

// ----- the worker's steps -----

/// The coordinator in `term` assigned `tasks` to this node.
pub(super) fn tasks_assigned(
    r: &mut Roles,
    now: Millis,
    from: NodeId,
    term: u64,
    tasks: Vec<Assigned>,
    echo: Option<Millis>,
) {
    if r.node.election.overtaken_by(from, term) {
        // The assignment overtook the new coordinator's first beat.
        on_members::coordinator_followed(r, now, term, from);
    }
    if !r.node.election.current(from, term) {
        // A deposed coordinator: fenced off. It learns of the new term from beats.
        return;
    }
    if let Some(at) = echo {
        r.worker
            .round_trip(now, now.saturating_sub(at), r.node.cfg.queue_max);
    }
    if r.worker.interrupted() {
        // Stopping (Ctrl-C, a batch job's drain): handed back at once, as
        // what was queued here was. Queued, they kept the node from going
        // until its linger ran out, and waited for it there.
        r.node
            .election
            .leader()
            .send(r.out, |term| Msg::Release { term, tasks });
        return;
    }
    for a in tasks {
        r.worker.enqueue(now, from, a, r.specs, r.out);
    }
    r.working().start_queued(now);
    queue_grew(r);
}

impl Working<'_> {
    /// Queued tasks started while they fit.
    pub(super) fn start_queued(&mut self, now: Millis) {
        self.worker
            .start_queued(now, self.specs, self.out, self.node.election.leader());
    }
}

/// A farm's definition this node asked for came: tasks that waited for
/// it may start, and a node still dry steals.
pub(super) fn spec_arrived(w: &mut Working, now: Millis, farm: FarmId) {
    if w.worker.spec_arrived(farm, w.specs) {
        w.start_queued(now);
        w.try_steal(now);
    }
}

/// A thief asks for unstarted tasks: what fits it is given, and the
/// coordinator told where they went.
/// `Msg::Steal` as [`steal_asked`] hears it: the thief, its ask's id, what
/// it offers and has in use, and the most tasks it takes.
pub(super) struct StealAsked {
    pub(super) from: NodeId,
    pub(super) id: u64,
    pub(super) total: Resources,
    pub(super) load: Resources,
    pub(super) max: u32,
}

pub(super) fn steal_asked(
    asked: StealAsked,
    worker: &mut Worker,
    specs: &Specs,
    leader: election::Leader,
    out: &mut Out,
) {
    let StealAsked {
        from,
        id,
        total,
        load,
        max,
    } = asked;
    let given = worker.give_unstarted(&total, load, max, specs, out);
    out.stats.tasks_given += given.len() as u64;
    if !given.is_empty() {
        let tasks = given.clone();
        leader.send(out, |term| Msg::Moved {
            term,
            to: from,
            tasks,
        });
    }
    out.send(from, Msg::Stolen { id, tasks: given });
}

/// A victim answered this node's steal.
pub(super) fn steal_answered(
    w: &mut Working,
    now: Millis,
    from: NodeId,
    id: u64,
    tasks: Vec<Assigned>,
) {
    match w.take_answer(now, from, id, &tasks) {
        Answer::Ignored => {}
        // Try another.
        Answer::Empty => w.try_steal(now),
        Answer::Stale => {
            // Stale: the tasks are this node's now, but it gave up
            // waiting. Hand them back to the coordinator rather than drop them.
            w.node
                .election
                .leader()
                .send(w.out, |term| Msg::Release { term, tasks });
        }
        Answer::Won => {
            for a in tasks {
                w.worker.enqueue(now, from, a, w.specs, w.out);
            }
            w.start_queued(now);
            w.try_steal(now);
        }
    }
}
