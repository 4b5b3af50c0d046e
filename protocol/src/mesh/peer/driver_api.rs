//! What a peer's driver and the status pages read of it (members, farms, counters, latencies), the knobs they set, and its invariant checks.

use super::*;

impl Peer {
    /// This node's machine as measured now, told in its beats.
    pub fn set_machine(&mut self, machine: Option<MachineLoad>) {
        self.said.machine = machine;
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
        self.said.gpus = gpus;
    }

    /// This node's open-file limit, told in its beats.
    pub fn set_files_max(&mut self, limit: u64) {
        self.said.files_max = limit;
    }

    /// This node was started to join a mesh at an address the user gave:
    /// until a node there says whom it follows, it never runs alone (see
    /// `Election`).
    pub fn joins_by_address(&mut self) {
        self.node.election.joins_by_address();
    }

    /// A node this one joins through (an address the user gave, a peer it
    /// remembered) is connected, though membership knew it already: it
    /// counts as introduced, so its beat answers the join (see
    /// [`Peer::introduce`]).
    pub fn seed_reached(&mut self, now: Millis, id: NodeId) {
        self.woke(now);
        self.node.election.introduced(id);
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

    /// A sum over the members this node knows alive of
    /// [`member_hash`]`(id)`: two nodes whose sums plus their own
    /// `member_hash` are equal know the same nodes (a check of a whole
    /// mesh at O(N), not O(N²)).
    pub fn members_sum(&self) -> u64 {
        self.node.members.sum()
    }

    /// Which node this is.
    pub fn id(&self) -> NodeId {
        self.node.id
    }

    /// The highest coordinator term this node knows.
    pub fn term(&self) -> u64 {
        self.node.election.term()
    }

    /// The coordinator this node follows (itself when it coordinates), if it knows one.
    pub fn coordinator(&self) -> Option<NodeId> {
        self.node.election.coordinator()
    }

    /// True while this node is the elected coordinator.
    pub fn is_coordinator(&self) -> bool {
        self.coord.is_some()
    }

    /// The members this node knows alive, in id order, itself not among them.
    pub fn members(&self) -> impl Iterator<Item = Member<'_>> {
        self.node.members.iter()
    }

    /// How many tasks this node wants queued beyond those it runs now.
    pub fn prefetch_depth(&self) -> u32 {
        self.worker.depth()
    }

    /// A farm's definition, when this node knows it.
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

    /// Counters of what this node sent and stole, for the simulator and `mesh status`.
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

    /// How many tasks wait in this node's queue, assigned and not started.
    pub fn queued(&self) -> usize {
        self.worker.queued()
    }

    /// How many tasks run on this node now.
    pub fn running_count(&self) -> usize {
        self.worker.running_count()
    }

    /// True when nothing runs here and nothing waits to be reported.
    pub fn idle(&self) -> bool {
        self.worker.idle()
    }

    // ----- allocation queues (`mesh alloc`) -----

    /// The allocation queues and their jobs, as this node last heard.
    pub fn alloc_book(&self) -> &Arc<AllocBook> {
        self.allocs.book()
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

    // ----- checks -----

    /// Checks the peer's invariants that are cheap enough for every step of
    /// the simulator (no pass over tasks): nothing free beyond its total,
    /// and as coordinator, the engine's cheap checks and one claim per task
    /// the engine counts as running.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.worker
            .check_bounds()
            .and_then(|()| self.node.members.check())
            .map_err(|e| format!("node {}: {e}", self.node.id))?;
        self.check_coord_counts()
    }

    pub(super) fn check_coord_counts(&self) -> Result<(), String> {
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
