//! Work through the roles: assignments, what workers hold and send again, starts, and steals.

use super::*;

impl Peer {
    /// On the coordinator: the members with the most tasks queued (itself
    /// included), largest first, for the workers to steal from.
    pub(super) fn find_victims(&self) -> Vec<Victim> {
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
    pub(super) fn beat_if_piled_up(&mut self) {
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

    // ----- the coordinator's steps -----

    pub(super) fn coord_drain(&mut self) {
        if let Some(c) = &mut self.coord {
            c.drain(&mut self.out);
        }
    }

    pub(super) fn assign(&mut self, now: Millis) {
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

    pub(super) fn resend(&mut self, now: Millis) {
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
                .filter(|m| !m.direct())
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
            self.out.send(c, Msg::Claimed { term, tasks });
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

    pub(super) fn on_assign(
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

    pub(super) fn start_queued(&mut self, now: Millis) {
        self.worker
            .start_queued(now, &self.specs, &mut self.out, self.node.election.leader());
    }

    pub(super) fn try_steal(&mut self, now: Millis) {
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

    pub(super) fn on_steal(
        &mut self,
        from: NodeId,
        id: u64,
        total: Resources,
        load: Resources,
        max: u32,
    ) {
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

    pub(super) fn on_stolen(&mut self, now: Millis, from: NodeId, id: u64, tasks: Vec<Assigned>) {
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
}
