//! Farms through the roles: submissions, copies kept and restored, the home's outputs, cancels, and the allocation queues' batch answers.

use super::*;

impl Peer {
    /// The book kept in this node's store, at startup.
    pub fn restore_allocs(&mut self, book: AllocBook) {
        self.allocs.restore(book);
        self.machines_changed();
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

    /// The batch system's answer to [`BatchOp::Submit`](super::super::BatchOp::Submit): the job ids.
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

    /// The batch system's answer to [`BatchOp::Poll`](super::super::BatchOp::Poll): the state of each
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

    /// The batch system's answer to [`BatchOp::List`](super::super::BatchOp::List):
    /// every job of this mesh it knows.
    pub fn batch_listed(
        &mut self,
        now: Millis,
        system: BatchSystem,
        gen: u64,
        result: Result<Vec<super::super::Listed>, String>,
    ) {
        self.woke(now);
        let term = self.node.election.term();
        if self.coord.is_some() && self.allocs.listed(now, term, system, gen, result) {
            self.allocs_changed();
        }
        self.pump(now);
    }

    /// The batch system's answer to [`BatchOp::Cancel`](super::super::BatchOp::Cancel).
    pub fn batch_cancelled(&mut self, now: Millis, job: &str, result: Result<(), String>) {
        self.woke(now);
        let term = self.node.election.term();
        if self.coord.is_some() && self.allocs.cancelled(now, term, job, result) {
            self.allocs_changed();
        }
        self.pump(now);
    }

    /// The coordinator changed the book: durable here, and sent to everyone.
    pub(super) fn allocs_changed(&mut self) {
        allocation::changed(&self.allocs, &self.node.members, &mut self.out);
        self.machines_changed();
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

    /// A farm submitted on this node, which becomes its home. `reused`:
    /// its tasks done before (in an earlier farm, with the same content
    /// key): they are done from the start. Those whose entry names this
    /// node have their outputs in place here already (the driver put them
    /// there); those of other nodes are brought from them.
    pub fn submit(&mut self, now: Millis, spec: FarmSpec, reused: Vec<Entry>) {
        let spec = Arc::new(spec);
        self.specs.insert(spec.id, spec.clone());
        self.out.persist(Persist::Farm(spec.clone()));
        let home = self.holdings.submitted(self.node.id, spec.clone());
        self.holdings
            .reused(self.node.id, spec.id, &reused, &mut self.out);
        if let Some(c) = self.node.election.leader().node {
            // Not the coordinator yet: offered again until accepted, with
            // what the copy here knows (the reused tasks among it).
            coordinator::offer(&mut self.out, c, spec, reused, home, None);
        }
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

    pub(super) fn inputs_here(&mut self, farm: FarmId) {
        self.holdings
            .copy_complete(farm, &mut self.out, self.node.election.leader());
        if let Some(c) = &mut self.coord {
            c.has_copy(farm, self.node.id);
        }
        self.accept_ready();
    }

    pub(super) fn alloc_tick(&mut self, now: Millis) {
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

    pub(super) fn ensure_holders(&mut self, now: Millis) {
        if let Some(c) = &mut self.coord {
            c.ensure_holders(now, &self.node, &mut self.out);
        }
    }

    pub(super) fn accept_ready(&mut self) {
        if let Some(c) = &mut self.coord {
            c.accept_ready(&self.node, &mut self.out);
        }
    }

    pub(super) fn sync_holders(&mut self, now: Millis, progress: bool) {
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
    pub(super) fn on_submit(
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
    pub(super) fn home_progress(&mut self, farm: FarmId) {
        self.holdings.home_progress(farm, &self.node, &mut self.out);
    }

    pub(super) fn on_cancel(&mut self, from: NodeId, farm: FarmId) {
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
    pub(super) fn on_keeps(&mut self, from: NodeId, node: NodeId, farms: Vec<FarmId>) {
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
}
