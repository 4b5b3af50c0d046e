//! Farms through the roles, one function per event (a farm offered, submitted, copied, cancelled or collected, a home taken, inputs arrived, kept outputs told, the allocation queues changed), each over the roles it borrows, and the peer's side of the batch system's answers (the driver's calls that bring them are in `driver_api.rs`).

use super::*;

impl Peer {
    /// A batch system's answer, heard by the allocation queues in this
    /// term (only on the coordinator; elsewhere it is dropped unread).
    pub(super) fn batch_answered(
        &mut self,
        now: Millis,
        heard: impl FnOnce(&mut Allocs, u64) -> bool,
    ) {
        self.due_first(now);
        let term = self.node.election.term();
        if self.coord.is_some() && heard(&mut self.allocs, term) {
            self.allocs_changed();
        }
        self.pump(now);
    }

    pub(super) fn allocs_changed(&mut self) {
        allocs_changed(&self.node, &self.allocs, self.coord.as_mut(), &mut self.out);
    }
}

/// The coordinator changed the book: durable here, and sent to everyone.
pub(super) fn allocs_changed(
    node: &Node,
    allocs: &Allocs,
    coord: Option<&mut Coord>,
    out: &mut Out,
) {
    allocation::changed(allocs, &node.members, out);
    on_members::machines_changed(coord);
}

/// The allocation queues' loop is due on the coordinator.
pub(super) fn allocs_due(cx: &mut Coordinating, now: Millis) {
    if allocation::tick(cx, now) {
        allocs_changed(cx.node, cx.allocs, cx.coord.as_mut(), cx.out);
    }
}

/// A user's change to the allocation queues reached the coordinator.
pub(super) fn alloc_asked(
    now: Millis,
    cmd: AllocCmd,
    node: &Node,
    coord: Option<&mut Coord>,
    allocs: &mut Allocs,
    out: &mut Out,
) {
    if coord.is_some() {
        let (ops, changed) = allocs.command(now, node.election.term(), cmd);
        out.actions.extend(ops.into_iter().map(Action::Batch));
        if changed {
            allocs_changed(node, allocs, coord, out);
        }
    }
}

/// The coordinator's book of the allocation queues: adopted if newer.
pub(super) fn book_heard(
    book: Arc<AllocBook>,
    coord: Option<&mut Coord>,
    allocs: &mut Allocs,
    out: &mut Out,
) {
    if allocs.adopt(book) {
        out.persist(Persist::Allocs(allocs.book().clone()));
        on_members::machines_changed(coord);
    }
}

/// `Msg::Replicate` as [`copy_asked`] hears it: the coordinator that
/// asks, the farm, and the term it asks in.
pub(super) struct CopyAsked {
    pub(super) from: NodeId,
    pub(super) farm: Arc<FarmSpec>,
    pub(super) term: u64,
}

/// The coordinator asks this node to keep a copy of a farm: taken, and
/// said to be complete once the farm's inputs are here too.
pub(super) fn copy_asked(
    asked: CopyAsked,
    node: &Node,
    specs: &mut Specs,
    holdings: &mut Holdings,
    out: &mut Out,
) {
    let CopyAsked { from, farm, term } = asked;
    if term < node.election.term() {
        return;
    }
    let id = farm.id;
    if holdings.replicate(node.id, &farm) {
        keep_spec(specs, &farm);
        out.persist(Persist::Farm(farm.clone()));
    }
    if holdings.want_inputs(node.id, &farm, out) && !holdings.wants_inputs(id) {
        let gen = holdings.get(id).map_or(farm.gen, |r| r.spec.gen);
        out.send(from, Msg::Replicated { farm: id, gen });
    }
}

/// `Msg::ReplicateGrown` as [`copy_grown`] hears it.
pub(super) struct CopyGrown {
    pub(super) from: NodeId,
    pub(super) growth: Box<Growth>,
    pub(super) term: u64,
}

/// The coordinator asks this holder to keep a later generation, sent as
/// what it adds: taken as a whole copy is when it grows the copy here;
/// otherwise the coordinator hears which generation is here, and sends
/// the later one whole.
pub(super) fn copy_grown(
    asked: CopyGrown,
    node: &Node,
    specs: &mut Specs,
    holdings: &mut Holdings,
    out: &mut Out,
) {
    let CopyGrown { from, growth, term } = asked;
    let Some(here) = holdings.get(growth.farm).map(|r| r.spec.clone()) else {
        return;
    };
    match growth.apply(&here) {
        Some(next) => copy_asked(
            CopyAsked {
                from,
                farm: Arc::new(next),
                term,
            },
            node,
            specs,
            holdings,
            out,
        ),
        None if term >= node.election.term() => out.send(
            from,
            Msg::Replicated {
                farm: here.id,
                gen: here.gen,
            },
        ),
        None => {}
    }
}

/// A holder's copy of `farm` is complete: a farm waiting for it may be accepted.
pub(super) fn copy_made(
    from: NodeId,
    farm: FarmId,
    gen: u32,
    node: &Node,
    mut coord: Option<&mut Coord>,
    out: &mut Out,
) {
    if let Some(c) = coord.as_deref_mut() {
        if let Some(spec) = c.has_copy(farm, from, gen) {
            // Its copy is of an earlier generation than the one here (a
            // growth that did not fit it): the later one, whole.
            let term = node.election.term();
            out.send(from, Msg::Replicate { term, farm: spec });
        }
    }
    accept_ready(node, coord, out);
}

/// A farm submitted here, which makes this node its home: kept, and
/// offered to the coordinator until accepted.
pub(super) fn farm_submitted(
    spec: FarmSpec,
    reused: Vec<Entry>,
    node: &Node,
    specs: &mut Specs,
    holdings: &mut Holdings,
    out: &mut Out,
) {
    let spec = Arc::new(spec);
    keep_spec(specs, &spec);
    out.persist(Persist::Farm(spec.clone()));
    let home = holdings.submitted(node.id, spec.clone());
    holdings.reused(node.id, spec.id, &reused, out);
    if let Some(c) = node.election.leader().node {
        // Not the coordinator yet: offered again until accepted, with
        // what the copy here knows (the reused tasks among it).
        coordinator::offer(out, c, spec, reused, home, None);
    }
}

/// A farm this node is home of grew: the later generation kept, and
/// offered to the coordinator until accepted. False when `spec` is not a
/// later generation of a farm whose home is here.
pub(super) fn farm_grew(
    spec: FarmSpec,
    reused: Vec<Entry>,
    node: &Node,
    specs: &mut Specs,
    holdings: &mut Holdings,
    out: &mut Out,
) -> bool {
    let spec = Arc::new(spec);
    let Some(home) = holdings.grew(spec.clone()) else {
        return false;
    };
    keep_spec(specs, &spec);
    out.persist(Persist::Farm(spec.clone()));
    holdings.reused(node.id, spec.id, &reused, out);
    if let Some(c) = node.election.leader().node {
        coordinator::offer(out, c, spec, reused, home, None);
    }
    true
}

/// This node claims a farm's home: its outputs are brought here, and the
/// claim goes out with the next offer, sent now.
pub(super) fn home_taken(r: &mut Roles, now: Millis, spec: Arc<FarmSpec>, dir: String) {
    let id = spec.id;
    if !r.holdings.keeps(id) {
        r.specs.insert(id, spec.clone());
        r.out.persist(Persist::Farm(spec.clone()));
    }
    r.holdings.claim_home(r.node.id, spec, dir, r.out);
    on_tasks::resend_due(r, now);
    // Its progress shown, and the end announced once every output is there.
    r.holdings.home_progress(id, r.node, r.out);
}

/// A copy of `farm` here is complete (its inputs came): the coordinator
/// counts it, here or when told, and a farm waiting for it may be accepted.
pub(super) fn inputs_arrived(
    farm: FarmId,
    node: &Node,
    holdings: &Holdings,
    mut coord: Option<&mut Coord>,
    out: &mut Out,
) {
    holdings.copy_complete(farm, out, node.election.leader());
    if let Some(c) = coord.as_deref_mut() {
        let gen = holdings.get(farm).map_or(0, |r| r.spec.gen);
        c.has_copy(farm, node.id, gen);
    }
    accept_ready(node, coord, out);
}

/// On the coordinator: farms held by too few nodes get copies made.
pub(super) fn ensure_holders(now: Millis, node: &Node, coord: Option<&mut Coord>, out: &mut Out) {
    if let Some(c) = coord {
        c.ensure_holders(now, node, out);
    }
}

/// On the coordinator: farms now kept by enough nodes are accepted.
pub(super) fn accept_ready(node: &Node, coord: Option<&mut Coord>, out: &mut Out) {
    if let Some(c) = coord {
        c.accept_ready(node, out);
    }
}

/// On the coordinator: each farm's log streamed to its holders (and,
/// with `progress`, its progress to its home).
pub(super) fn sync_holders(
    now: Millis,
    progress: bool,
    node: &Node,
    coord: Option<&mut Coord>,
    holdings: &Holdings,
    out: &mut Out,
) {
    if let Some(c) = coord {
        c.sync_holders(now, progress, |f| holdings.keeps(f), node, out);
    }
}

/// A holder offers a farm: taken over if it is new here, merged if not.
/// (The machines the coordinator places on are brought up to date by the
/// dispatcher first.)
pub(super) fn farm_offered(
    offered: coordinator::Offered,
    node: &Node,
    coord: Option<&mut Coord>,
    specs: &mut Specs,
    holdings: &mut Holdings,
    out: &mut Out,
) {
    let Some(c) = coord else {
        // Not (or no longer) the coordinator: the holder resends to the right one.
        return;
    };
    let coordinator::Offered {
        now, from, farm, ..
    } = &offered;
    let (now, from, farm) = (*now, *from, farm.clone());
    if c.has_farm(farm.id) {
        let grew = c.grow(now, from, &farm, node, out);
        if grew {
            keep_spec(specs, &farm);
            out.persist(Persist::Farm(farm.clone()));
        }
        c.resubmitted(offered, grew, out);
        c.accept_ready(node, out);
        return;
    }
    specs.insert(farm.id, farm.clone());
    out.persist(Persist::Farm(farm.clone()));
    if out.persists() {
        out.persist_entries(farm.id, offered.entries.clone(), true);
    }
    let spec = farm;
    let keep = c.take_farm(offered, node);
    c.report_early(now, spec.id, node, out);
    if keep && holdings.want_inputs(node.id, &spec, out) {
        inputs_arrived(spec.id, node, holdings, Some(&mut *c), out);
    }
    c.drain(out);
    c.ensure_holders(now, node, out);
    c.accept_ready(node, out);
}

/// The coordinator, or this node itself, stops a farm: its engine and
/// the tasks queued or running here.
pub(super) fn farm_cancelled(
    from: NodeId,
    farm: FarmId,
    node: &Node,
    coord: Option<&mut Coord>,
    worker: &mut Worker,
    out: &mut Out,
) {
    if let Some(c) = coord {
        c.cancel(farm, out);
    }
    if node.election.coordinator() == Some(from) || from == node.id {
        worker.cancel(farm, out);
    }
}

/// `Msg::CancelTask` as [`task_cancelled`] hears it: who stops the
/// task (the coordinator, or this node itself), and which.
pub(super) struct CancelAsked {
    pub(super) from: NodeId,
    pub(super) farm: FarmId,
    pub(super) task: TaskRef,
}

/// The coordinator, or this node itself, stops one task.
pub(super) fn task_cancelled(
    asked: CancelAsked,
    node: &Node,
    coord: Option<&mut Coord>,
    worker: &mut Worker,
    out: &mut Out,
) {
    let CancelAsked { from, farm, task } = asked;
    if let Some(c) = coord {
        c.cancel_task(farm, task, out);
    }
    if node.election.coordinator() == Some(from) || from == node.id {
        worker.cancel_task(farm, task, out);
    }
}

/// The home of a farm whose outputs this node keeps has them all: the
/// driver may let them go.
pub(super) fn farm_collected(farm: FarmId, kept: &mut Kept, out: &mut Out) {
    kept.farms.remove(&farm);
    out.push(Action::Forget { farm });
}

/// `node` keeps outputs of `farms`: a home tells it which it may let
/// go; the coordinator, asked by the node itself, passes the rest on to
/// their homes (once: a home that is not one any more drops them).
/// `Msg::Keeps` as [`keeps_told`] hears it: from whom, of which node's
/// outputs, and whether this node coordinates.
pub(super) struct KeepsTold {
    pub(super) from: NodeId,
    pub(super) node: NodeId,
    pub(super) farms: Vec<FarmId>,
    pub(super) coordinating: bool,
}

pub(super) fn keeps_told(
    told: KeepsTold,
    cx: &Node,
    holdings: &Holdings,
    specs: &Specs,
    kept: &mut Kept,
    out: &mut Out,
) {
    let KeepsTold {
        from,
        node,
        farms,
        coordinating,
    } = told;
    let me = cx.id;
    let mut homes: BTreeMap<NodeId, Vec<FarmId>> = BTreeMap::new();
    for farm in farms {
        let home = match holdings.get(farm) {
            Some(r) if r.home => {
                if r.announced {
                    if node == me {
                        farm_collected(farm, kept, out);
                    } else {
                        out.send(node, Msg::Collected { farm });
                    }
                }
                continue;
            }
            Some(r) => Some(r.home_of.node),
            None => specs.get(&farm).map(|s| s.origin),
        };
        if let Some(h) = home.filter(|&h| h != me && from == node && coordinating) {
            homes.entry(h).or_default().push(farm);
        }
    }
    for (home, farms) in homes {
        out.send(home, Msg::Keeps { node, farms });
    }
}
