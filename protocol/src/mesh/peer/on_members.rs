//! Membership and election as they reach the other roles, one function per event (a beat heard, members up or dead, a coordinator followed or elected), each over the roles it borrows.

use std::sync::LazyLock;

use super::*;

/// A worker's beat names no victims: one empty list, shared.
pub(super) static NO_VICTIMS: LazyLock<Arc<[Victim]>> = LazyLock::new(|| Arc::new([]));

impl Told<'_> {
    /// This node's report to the coordinator it follows: its beat with
    /// the claims it holds, where its reports come as often as its resend
    /// round (`on_tasks::lists_with_reports`; past that the round sends
    /// them as `Claimed`), and none where it is idle (the beat says so).
    pub(super) fn report(&self) -> Beat {
        let mut beat = self.beat();
        beat.ask = true;
        if !beat.idle && on_tasks::lists_with_reports(self.node, self.clock) {
            beat.claimed = self.worker.claimed();
        }
        beat
    }

    /// This node's beat as of now.
    pub(super) fn beat(&self) -> Beat {
        let (node, worker, said, clock) = (self.node, self.worker, self.said, self.clock);
        // Only allocation queues read it: a mesh without any pays nothing.
        let (late_cores, late_gpus) = if self.allocs.book().queues.is_empty() {
            (0, 0)
        } else {
            worker.late(clock, self.specs, |gpus| {
                allocation::room(self.allocs, gpus)
            })
        };
        Beat {
            version: PROTOCOL_VERSION,
            label: node.members.label().to_owned(),
            addrs: node.members.addrs().to_vec(),
            term: node.election.term(),
            coordinator: node.election.coordinator(),
            total: worker.total_shared(),
            used: worker.used(),
            queued: worker.queued() as u32,
            running: worker.running_count() as u32,
            started: worker.started(),
            backlog: self.coord.map_or(0, Coord::backlog),
            prefetch: worker.depth(),
            job: worker.job().cloned(),
            ends_in_ms: worker.deadline().map(|d| d.saturating_sub(clock)),
            allocs: self.allocs.version(),
            ask: false,
            interval_ms: if self.coord.is_some() {
                report_interval(node, clock)
            } else {
                0
            },
            victims: if self.coord.is_some() {
                said.victims.clone()
            } else {
                NO_VICTIMS.clone()
            },
            roster: node.members.digest(),
            health: node.members.health(),
            late_cores,
            late_gpus,
            files_max: said.files_max,
            idle: worker.claims_nothing(),
            claimed: Vec::new(),
            clock,
            seen: node.election.seen(),
            gpus: said.gpus.clone(),
            machine: said.machine,
        }
    }
}

/// How often the workers report to this coordinator in a mesh of this
/// size; as a worker, how often this node reports to its coordinator
/// (as the coordinator said; every heartbeat for the node that would
/// succeed it, so a dead coordinator is found fast at any size).
pub(super) fn report_interval(node: &Node, clock: Millis) -> Millis {
    let cfg = &node.cfg;
    let mine = membership::report_interval(cfg, node.members.len() + 1);
    match node.election.coordinator() {
        Some(c) if c == node.id => mine,
        Some(c) if successor(node, clock, c) => cfg.heartbeat_ms,
        Some(c) => node
            .members
            .beat_of(c)
            .map_or(mine, |b| b.interval_ms.max(cfg.heartbeat_ms)),
        None => cfg.heartbeat_ms,
    }
}

/// This node is the one elected should coordinator `c` die: the lowest
/// live node but `c`.
fn successor(node: &Node, clock: Millis, c: NodeId) -> bool {
    node.members
        .lowest_but(c, node.election.passed_over(clock))
        .is_none_or(|l| node.id < l)
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
pub(super) fn watch(node: &Node, clock: Millis) -> membership::Watch {
    let cfg = &node.cfg;
    let health = u64::from(node.members.health()) + 1;
    match node.election.coordinator() {
        Some(c) if c == node.id => {
            let limit = membership::silence_limit(cfg, node.members.len() + 1);
            membership::Watch::Direct(limit * health)
        }
        // Only while it knows the members the coordinator knows: a node
        // that knows a few of them, all above it (one of hundreds
        // joining at once), is not the successor, whatever it thinks,
        // and its claim would take the mesh from a coordinator that is
        // only slow to answer.
        Some(c) if successor(node, clock, c) && node.members.agrees() => {
            membership::Watch::One(c, cfg.dead_after_ms * health)
        }
        _ => membership::Watch::None,
    }
}

/// Membership or the allocation queues changed: the coordinator's
/// view of the machines is rebuilt before it next needs it.
pub(super) fn machines_changed(coord: Option<&mut Coord>) {
    if let Some(c) = coord {
        c.machines_changed();
    }
}

/// The coordinator's view of the machines, rebuilt if they changed.
pub(super) fn sync_machines(
    coord: Option<&mut Coord>,
    allocs: &Allocs,
    worker: &Worker,
    members: &Membership,
) {
    if let Some(c) = coord {
        c.sync_machines(|| allocation::machines(allocs, worker.total(), members));
    }
}

/// A member's beat: its word on whom it follows, its load and its view
/// of the members, heard by every role that reads it.
pub(super) fn beat_heard(r: &mut Roles, now: Millis, from: NodeId, b: Arc<Beat>) {
    hear(r, now, from, b, true);
}

/// A report whose list of claims the coordinator has found to change
/// nothing (`Coord::lists_nothing_new`): heard as `beat_heard` hears it,
/// without going over the list again.
pub(super) fn quiet_report_heard(r: &mut Roles, now: Millis, from: NodeId, b: Arc<Beat>) {
    hear(r, now, from, b, false);
}

fn hear(r: &mut Roles, now: Millis, from: NodeId, b: Arc<Beat>, list: bool) {
    let me = r.node.id;
    if b.version != PROTOCOL_VERSION || from == me {
        return;
    }
    let claims = b.coordinator == Some(from);
    let (term, ask, follows) = (b.term, b.ask, b.coordinator);
    let (clock, seen) = (b.clock, b.seen);
    r.node.election.answered_by(from);
    if let Some(c) = r.coord {
        c.note_depth(from, b.prefetch);
        c.note_started(from, &b.started);
        if b.idle && follows == Some(me) {
            // The empty `Claimed` its node does not send. The node was
            // idle, so the first `Assign` to it opens a connection:
            // claims that young may still be on their way (placement
            // on a loaded machine of 300 nodes handed the same tasks
            // from node to node, and 1 of 300 ran any).
            let grace = r.node.cfg.resend_ms.max(r.node.cfg.connect_ms);
            let seen = r.node.election.seen_in(term, seen);
            c.on_claims_listed(now, from, &[], grace, seen);
        } else if list && !b.claimed.is_empty() && follows == Some(me) {
            // A report lists what its node holds, as `Claimed` does.
            let seen = r.node.election.seen_in(term, seen);
            c.on_claims_listed(now, from, &b.claimed, r.node.cfg.resend_ms, seen);
        }
    }
    if claims && r.node.election.coordinator() == Some(from) {
        // The coordinator's answer: whom to steal from.
        r.steal.set_victims(me, &b.victims);
        if r.node.members.roster_unlike(now, b.roster) {
            let digest = r.node.members.digest();
            r.out.send(
                from,
                Msg::Roster {
                    kind: RosterKind::Ask,
                    digest,
                    members: Vec::new(),
                },
            );
        }
    }
    match r.node.members.heard(now, from, b) {
        membership::Heard::New => member_up(r, now, from),
        // Its resources, where it had only SWIM's word until now.
        membership::Heard::Resized => {
            machines_changed(r.coord.as_mut());
            if let Some(c) = r.coord {
                c.joined(from);
            }
        }
        membership::Heard::Again => {}
    }
    let coordinating = r.coord.is_some();
    if let Some(term) = r.node.election.heard(from, claims, term, coordinating) {
        coordinator_followed(r, now, term, from);
    } else if claims && term < r.node.election.term() {
        // A coordinator in an older term (the other side of a healed
        // partition, a mesh met late), whose claim this node's
        // coordinator may never send it: a coordinator that hears its
        // claims counts it as a member that reports there. Told whom
        // this node follows, it asks there (below).
        tell(r, [from]);
    }
    if claims {
        r.node.election.saw(from, term, clock);
    }
    let mine = r.node.election.coordinator();
    if !claims && term > r.node.election.term() {
        if let Some(c) = follows.filter(|&c| c != from && c != me && Some(c) != mine) {
            // It follows a coordinator in a newer term: ask there, and
            // follow the claim that answers.
            ask_beat(r, c);
        }
    }
    if ask && (r.coord.is_some() || follows != mine || mine.is_none()) {
        // A worker's report, or a question from a node that follows
        // another coordinator or none (a joining node waits for its
        // seed's word, even that it follows no one): answered with
        // whom this one follows.
        tell(r, [from]);
    } else if mine.is_none() {
        if let Some(c) = follows.filter(|&c| c != from && c != me) {
            // It follows a coordinator this node does not know of: ask there.
            ask_beat(r, c);
        }
    }
    if !r.steal.is_empty() {
        // Work appeared somewhere: a dry node takes some now rather than at its next beat.
        r.working().try_steal(now);
    }
}

/// A heartbeat is due: members judged, an election round, the
/// coordinator's victims found again, a report if one is due, a steal.
pub(super) fn heartbeat_due(r: &mut Roles, now: Millis) {
    // Stages that stopped running here stop counting.
    r.worker.update_depth(now, r.node.cfg.queue_max);
    r.node.members.upkeep(now, r.out);
    members_changed(r, now);
    election_due(r, now);
    if let Some(c) = r.coord.as_mut() {
        on_tasks::victims_again(r.said, r.node, r.worker);
        // Its own tasks, which no beat brings it.
        c.note_started(r.node.id, &r.worker.started());
    }
    let interval = report_interval(r.node, r.clock);
    if r.node.members.report_due(now, interval) {
        report_due(r);
    }
    r.working().try_steal(now);
}

/// Members that came up since the last look (SWIM told, or a first
/// beat), and those silent too long: every role hears of each.
pub(super) fn members_changed(r: &mut Roles, now: Millis) {
    for id in r.node.members.take_fresh() {
        member_up(r, now, id);
    }
    members_died(now, r.node, r.clock, r.steal, r.coord.as_mut(), r.out);
}

/// A member came up: the coordinator counts it, tells it whom to follow,
/// and gives it copies of farms held by too few.
fn member_up(r: &mut Roles, now: Millis, id: NodeId) {
    r.out.emit(PeerEvent::MemberUp(id));
    machines_changed(r.coord.as_mut());
    if let Some(c) = r.coord {
        c.joined(id);
        // Tell it whom to follow now rather than when SWIM's gossip
        // brings it word of the coordinator.
        tell(r, [id]);
    }
    // A farm held by too few nodes (a mesh of one until now) gets a copy there.
    on_farms::ensure_holders(now, r.node, r.coord.as_mut(), r.out);
}

/// Members silent too long are dead: each in turn, with the others
/// still alive, is forgotten by every role, and its claims re-queued.
fn members_died(
    now: Millis,
    node: &mut Node,
    clock: Millis,
    steal: &mut Stealing,
    mut coord: Option<&mut Coord>,
    out: &mut Out,
) {
    let watch = watch(node, clock);
    let dead = node.members.expired(now, watch);
    let died = !dead.is_empty();
    for id in dead {
        node.members.remove(now, id);
        out.emit(PeerEvent::MemberDown(id));
        node.election.lost(id);
        steal.member_gone(id);
        if let Some(c) = coord.as_deref_mut() {
            c.reclaim(now, id, node, out);
        }
    }
    if died {
        machines_changed(coord);
    }
}

/// This node's beat (as coordinator, its claim, backlog and victims),
/// sent to each of `to`, asking for nothing back.
pub(super) fn tell(r: &mut Roles, to: impl IntoIterator<Item = NodeId>) {
    let beat = Arc::new(r.told().beat());
    for id in to {
        r.out.send(id, Msg::Beat(beat.clone()));
    }
}

/// This node's beat, sent to `to` with a request for its beat back.
pub(super) fn ask_beat(r: &mut Roles, to: NodeId) {
    let beat = r.told().beat();
    send_asking(r, to, beat);
}

/// `beat` sent to `to`, asking for its beat back.
fn send_asking(r: &mut Roles, to: NodeId, mut beat: Beat) {
    beat.ask = true;
    r.node.members.advertise(beat.queued);
    r.out.send(to, Msg::Beat(Arc::new(beat)));
}

/// A report is due: to the coordinator; with none, a question to the
/// node that would be elected, whom it follows (the answer is how a
/// joining node finds the coordinator). The coordinator itself reports
/// to nobody.
pub(super) fn report_due(r: &mut Roles) {
    if let Some(seed) = r.node.election.seed() {
        // Joining: whom does the mesh follow? The seed says.
        ask_beat(r, seed);
    }
    let (me, election) = (r.node.id, &r.node.election);
    let to = match election.coordinator() {
        Some(c) if c == me => return,
        Some(c) => c,
        None => match r.node.members.lowest() {
            Some(l) if l < me && Some(l) != election.seed() => l,
            _ => return,
        },
    };
    let beat = if election.coordinator() == Some(to) {
        r.told().report()
    } else {
        r.told().beat()
    };
    send_asking(r, to, beat);
}

/// An election round is due: this node follows the winner, or is it.
pub(super) fn election_due(r: &mut Roles, now: Millis) {
    match r.node.election.round(now, r.node.id, &r.node.members) {
        Some(Vote::Follow { term, node }) => coordinator_followed(r, now, term, node),
        Some(Vote::Elect(term)) => coordinator_elected(r, now, term),
        None => {}
    }
}

/// This node follows `node` in `term`: a deposed coordinator hands its
/// work over, and the new one hears what this node holds.
pub(super) fn coordinator_followed(r: &mut Roles, now: Millis, term: u64, node: NodeId) {
    let me = r.node.id;
    let before = r.node.election.coordinator();
    if let Some(o) = r.out.observed() {
        if before.is_some_and(|c| c != node) {
            o.failovers += 1;
        }
    }
    if before != Some(node) {
        r.node.members.new_coordinator();
    }
    r.node.election.followed(now, term, node);
    let mut deposed = false;
    if node != me {
        if let Some(old) = r.coord.take() {
            old.hand_over(me, node, r.out);
            r.allocs.coordinating(None);
            // Workers it declared dead for their silence to it alone
            // (they may have followed the new coordinator first) are
            // SWIM's to judge again.
            r.node.members.unhide();
            deposed = true;
        }
    }
    if deposed {
        // Its workers hear whom it follows now, not at their next
        // report: the winner places nothing until they say what they hold.
        let all: Vec<NodeId> = r.node.members.ids().filter(|&m| m != node).collect();
        tell(r, all);
    }
    r.out.emit(PeerEvent::Coordinator { term, node });
    if node != me {
        // Introduce this node to the coordinator now rather than at its
        // next report: it hands work only to members it knows.
        ask_beat(r, node);
    }
    // Whatever the old coordinator knew, tell the new one.
    let holding = r.worker.claimed();
    if !holding.is_empty() {
        r.out.send(
            node,
            Msg::Claimed {
                term,
                tasks: holding,
                // Nothing heard of it yet: the list adopts claims and drops none.
                seen: r.node.election.seen(),
            },
        );
    }
    r.holdings.offer_again();
    on_tasks::resend_due(r, now);
}

/// This node won the election for `term`: it takes up the farms it
/// holds, and every member hears its claim.
pub(super) fn coordinator_elected(r: &mut Roles, now: Millis, term: u64) {
    let me = r.node.id;
    let machines = allocation::machines(r.allocs, r.worker.total(), &r.node.members);
    let nodes = r.node.members.ids().chain([me]);
    let mut c = Coord::new(now, machines, nodes, r.rng.random());
    for stored in r.holdings.take_stored() {
        c.restore(now, me, stored);
    }
    // Every member says what it holds as soon as it follows (a round
    // trip after the claim below): work it runs is not handed out again.
    c.settle(now + r.node.cfg.resend_ms, r.node.members.ids());
    *r.coord = Some(c);
    r.allocs.coordinating(Some(now));
    r.node.members.unwatch_all();
    on_tasks::drain(r.coord.as_mut(), r.out);
    on_farms::ensure_holders(now, r.node, r.coord.as_mut(), r.out);
    coordinator_followed(r, now, term, me);
    // Every member hears the claim at once (not from gossip), so the
    // mesh changes over within a message's time at any size.
    on_tasks::victims_again(r.said, r.node, r.worker);
    let all: Vec<NodeId> = r.node.members.ids().collect();
    tell(r, all);
}
