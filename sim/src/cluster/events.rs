//! The simulator's larger events, each a function of its own: a check that the nodes are one mesh, the farm's submission, and outputs fetched home.

use super::*;

impl Sim<'_> {
    /// Whether the live nodes are one mesh now, and since when: what the
    /// checks at the end and the heal scenarios read.
    pub(super) fn check_one_mesh(&mut self) -> Result<(), SimError> {
        let now = self.now;
        match self.one_mesh() {
            Ok(()) => {
                self.one_mesh_since.get_or_insert(now);
                self.one_mesh_at = Some(now);
                self.not_one_mesh = None;
            }
            Err(why) => {
                self.one_mesh_since = None;
                self.one_mesh_at = None;
                self.not_one_mesh = Some(why);
            }
        }
        self.push(now + MESH_CHECK_MS, Ev::MeshCheck);
        Ok(())
    }

    /// The farm submitted on its node, once the allocation queues it
    /// needs are in the node's book.
    pub(super) fn submit_farm(&mut self) -> Result<(), SimError> {
        let now = self.now;
        let n = self.cfg.submit_node;
        let spec = (*self.plan.spec).clone();
        let Some(peer) = &self.nodes[n].peer else {
            return Err(self.violation("the submitting node is down at submit time".into()));
        };
        // A script runs `mesh alloc add` to its answer (the node's
        // book shows the queue), then `mesh submit`: a farm never
        // finds its queues missing, and fails no stage they fit.
        let book = peer.alloc_book();
        if self
            .cfg
            .alloc
            .iter()
            .any(|a| a.add_at_ms <= self.cfg.submit_at_ms && book.queue(&a.name).is_none())
        {
            self.push(now + 100, Ev::Submit);
            return Ok(());
        }
        self.submitted_at = now;
        self.traffic_before = self.traffic;
        self.step(n, |p| p.submit(now, spec, Vec::new()))
    }

    /// The home fetched a task's outputs from node `from`: they came if
    /// that node was up, not stalled, and reachable the whole way.
    pub(super) fn fetched_home(
        &mut self,
        home: u32,
        gen: u32,
        from: u32,
        task: TaskRef,
    ) -> Result<(), SimError> {
        let now = self.now;
        if self.nodes[home as usize].gen != gen {
            return Ok(());
        }
        let got = if self.nodes[from as usize].peer.is_some()
            && !self.stalled(from as usize)
            && !self.partitioned(home as usize, from as usize)
        {
            Fetched::Here
        } else {
            Fetched::Later
        };
        self.step(home as usize, |p| p.fetched(now, FARM, task, got))
    }
}
