//! Membership and election as the dispatcher ties them to the other roles: beats heard and sent, members up and down, whom to follow, becoming coordinator.

use super::*;

impl Peer {
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
    pub(super) fn report_interval(&self) -> Millis {
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
    pub(super) fn successor(&self, c: NodeId) -> bool {
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
    pub(super) fn watch(&self) -> membership::Watch {
        let cfg = &self.node.cfg;
        let health = u64::from(self.node.members.health()) + 1;
        match self.node.election.coordinator() {
            Some(c) if c == self.node.id => {
                let limit = cfg.dead_after_ms.max(3 * self.report_interval());
                membership::Watch::Direct(limit * health)
            }
            // Only while it knows the members the coordinator knows: a node
            // that knows a few of them, all above it (one of hundreds
            // joining at once), is not the successor, whatever it thinks,
            // and its claim would take the mesh from a coordinator that is
            // only slow to answer.
            Some(c) if self.successor(c) && self.node.members.agrees() => {
                membership::Watch::One(c, cfg.dead_after_ms * health)
            }
            _ => membership::Watch::None,
        }
    }

    /// Membership or the allocation queues changed: the coordinator's
    /// view of the machines is rebuilt before it next needs it.
    pub(super) fn machines_changed(&mut self) {
        if let Some(c) = &mut self.coord {
            c.machines_changed();
        }
    }

    pub(super) fn sync_machines(&mut self) {
        if let Some(c) = &mut self.coord {
            let (allocs, total, members) = (&self.allocs, self.worker.total(), &self.node.members);
            c.sync_machines(|| allocation::machines(allocs, total, members));
        }
    }

    // ----- membership and election -----

    pub(super) fn on_beat(&mut self, now: Millis, from: NodeId, b: Arc<Beat>) {
        if b.version != PROTOCOL_VERSION || from == self.node.id {
            return;
        }
        let claims = b.coordinator == Some(from);
        let (term, ask, follows) = (b.term, b.ask, b.coordinator);
        self.node.election.answered_by(from);
        if let Some(c) = &mut self.coord {
            c.note_depth(from, b.prefetch);
            if b.idle && follows == Some(self.node.id) {
                // The empty `Claimed` its node does not send. The node was
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
        } else if claims && term < self.node.election.term() {
            // A coordinator in an older term (the other side of a healed
            // partition, a mesh met late), whose claim this node's
            // coordinator may never send it: a coordinator that hears its
            // claims counts it as a member that reports there. Told whom
            // this node follows, it asks there (below).
            self.tell([from]);
        }
        let mine = self.node.election.coordinator();
        if !claims && term > self.node.election.term() {
            if let Some(c) = follows.filter(|&c| c != from && c != self.node.id && Some(c) != mine)
            {
                // It follows a coordinator in a newer term: ask there, and
                // follow the claim that answers.
                self.ask(c);
            }
        }
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
    pub(super) fn member_changes(&mut self, now: Millis) {
        for id in self.node.members.take_fresh() {
            self.member_up(now, id);
        }
        self.check_members(now);
    }

    pub(super) fn member_up(&mut self, now: Millis, id: NodeId) {
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
    pub(super) fn tell(&mut self, to: impl IntoIterator<Item = NodeId>) {
        let beat = Arc::new(self.beat());
        for id in to {
            self.out.send(id, Msg::Beat(beat.clone()));
        }
    }

    /// This node's beat, sent to `to` with a request for its beat back.
    pub(super) fn ask(&mut self, to: NodeId) {
        let mut beat = self.beat();
        beat.ask = true;
        self.node.members.advertise(beat.queued);
        self.out.send(to, Msg::Beat(Arc::new(beat)));
    }

    /// Reports to the coordinator; with none, asks the node that would be
    /// elected whom it follows (the answer is how a joining node finds
    /// the coordinator). The coordinator itself reports to nobody.
    pub(super) fn report(&mut self) {
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

    /// Members silent too long are dead: each in turn, with the others
    /// still alive, is forgotten by every role, and its claims re-queued.
    pub(super) fn check_members(&mut self, now: Millis) {
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

    pub(super) fn elect(&mut self, now: Millis) {
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

    pub(super) fn follow(&mut self, now: Millis, term: u64, node: NodeId) {
        let before = self.node.election.coordinator();
        if let Some(o) = self.out.observed() {
            if before.is_some_and(|c| c != node) {
                o.failovers += 1;
            }
        }
        if before != Some(node) {
            self.node.members.new_coordinator();
        }
        self.node.election.followed(now, term, node);
        let mut deposed = false;
        if node != self.node.id {
            if let Some(old) = self.coord.take() {
                old.hand_over(self.node.id, node, &mut self.out);
                self.allocs.coordinating(None);
                // Workers it declared dead for their silence to it alone
                // (they may have followed the new coordinator first) are
                // SWIM's to judge again.
                self.node.members.unhide();
                deposed = true;
            }
        }
        if deposed {
            // Its workers hear whom it follows now, not at their next
            // report: the winner places nothing until they say what they hold.
            let all: Vec<NodeId> = self.node.members.ids().filter(|&m| m != node).collect();
            self.tell(all);
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
                Msg::Claimed {
                    term,
                    tasks: holding,
                },
            );
        }
        self.holdings.offer_again();
        self.resend(now);
    }

    pub(super) fn become_coordinator(&mut self, now: Millis, term: u64) {
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
}
