//! How the simulator plays a start that goes wrong and a mesh that must heal: stalled (SIGSTOPped) and swamped nodes, messages reaching them (membership packets in closed form too), and the look at whether every group of nodes that can reach each other is one mesh.

use super::*;
use mesh_protocol::mesh::member_hash;

impl Sim<'_> {
    /// A message has reached node `to`: it is handled now, or once the
    /// node gets to it (stalled: when it resumes; slow: after those before it).
    pub(super) fn arrived(
        &mut self,
        to: usize,
        gen: u32,
        from: u32,
        msg: Box<Msg>,
    ) -> Result<(), SimError> {
        let now = self.now;
        let nd = &mut self.nodes[to];
        if nd.gen != gen || nd.peer.is_none() {
            return Ok(());
        }
        if self
            .cfg
            .stall
            .iter()
            .any(|s| s.node == to && (s.from_ms..s.until_ms).contains(&now))
        {
            let (to, from) = (to as u32, from);
            nd.held.push(Ev::Arrived { to, gen, from, msg });
            return Ok(());
        }
        let slow = self
            .cfg
            .slow
            .iter()
            .find(|s| s.node == to && (s.from_ms..s.until_ms).contains(&now));
        if let Some(s) = slow {
            // Served in turn: a burst of messages is answered late, as a
            // swamped node's are.
            let start = nd.busy_until_us.max(now * 1000);
            nd.busy_until_us = start + s.per_msg_us;
            let at = nd.busy_until_us.div_ceil(1000);
            self.slow_wait_ms = self.slow_wait_ms.max(at.saturating_sub(now));
            if at > now {
                let to = to as u32;
                self.push(at, Ev::Served { to, gen, from, msg });
                return Ok(());
            }
        }
        let from = self.nodes[from as usize].id;
        let quiet_kind = matches!(*msg, Msg::Beat(_) | Msg::Claimed { .. });
        if self.promises && quiet_kind && self.nodes[to].waiting.is_empty() {
            // A worker's report or list of claims that tells its
            // coordinator nothing new, or the coordinator's answer that
            // tells its worker nothing new, where the step would do
            // nothing else: taken without it, what it asks sent as the
            // step would send it; the coordinator's wake stands, the
            // worker's is polled again, as after its step.
            let peer = self.nodes[to].peer.as_mut().expect("up");
            let polls = if peer.take_quiet_message(now, from, &msg) {
                match *msg {
                    Msg::Beat(_) => self.upkeep.reports_answered += 1,
                    _ => self.upkeep.claims += 1,
                }
                false
            } else if peer.take_quiet_answer(now, from, &msg) {
                self.upkeep.answers += 1;
                true
            } else {
                return self.step(to, |p| p.handle_message(now, from, *msg));
            };
            let mut acts = std::mem::take(&mut self.actions);
            self.nodes[to]
                .peer
                .as_mut()
                .expect("up")
                .take_actions(&mut acts);
            for a in acts.drain(..) {
                match a {
                    Action::Send { to: peer, msg } => self.send(to, peer, msg),
                    other => unreachable!("a quiet beat asks only messages: {other:?}"),
                }
            }
            self.actions = acts;
            if polls {
                self.next_wake(to);
            }
            return Ok(());
        }
        self.step(to, |p| p.handle_message(now, from, *msg))
    }

    /// A membership packet in closed form, sent as `deliver` sends the
    /// packet it stands for: counted, its draws, lost as it would be.
    pub(super) fn send_quiet(&mut self, from: usize, q: QuietSwim) {
        let to = (q.to.id.0 - 1) as usize;
        if to >= self.nodes.len() {
            return;
        }
        self.traffic.count_swim(q.len);
        // Drawn even where nothing waits on the draw: the rank of the
        // link's next packet in this millisecond counts this one.
        let Some(at) = self.arrival(from, to, Msg::Swim(Vec::new()).kind()) else {
            return;
        };
        if self.acks_when_sent {
            // An ack's prober takes it now rather than at its arrival, a
            // few milliseconds on (`Peer::take_quiet_ack`, which leaves a
            // ping to arrive), and looks again at when it next wakes, as
            // after the ack's step.
            let now = self.now;
            let taken = self.nodes[to]
                .peer
                .as_mut()
                .is_some_and(|p| p.take_quiet_ack(now, &q));
            if taken {
                self.upkeep.acks += 1;
                self.next_wake(to);
                return;
            }
        }
        let (to, from) = (to as u32, from as u32);
        self.push(
            at,
            Ev::QuietSwim {
                to,
                from,
                q: Box::new(q),
            },
        );
    }

    /// A membership packet in closed form reaches node `to`: taken so
    /// where the node can (nothing else is in the way: a stall, a slow
    /// node's queue), else built and handed in as the packet.
    pub(super) fn quiet_arrived(
        &mut self,
        to: usize,
        from: usize,
        q: QuietSwim,
    ) -> Result<(), SimError> {
        let now = self.now;
        if !self.reaches(from, to) {
            return Ok(());
        }
        if !self.cfg.stall.is_empty() || !self.cfg.slow.is_empty() {
            let gen = self.nodes[to].gen;
            let peer = self.nodes[to].peer.as_mut().expect("up");
            let msg = Box::new(Msg::Swim(peer.quiet_packet(&q)));
            return self.arrived(to, gen, from as u32, msg);
        }
        if self.acks_when_sent && q.is_ping() {
            // Answered without the rest of a step: its ack goes out as the
            // step would send it, and the node's wake stands.
            let peer = self.nodes[to].peer.as_mut().expect("up");
            if peer.answer_quiet_ping(now, &q) {
                self.upkeep.pings += 1;
                let mut acts = std::mem::take(&mut self.actions);
                peer.take_actions(&mut acts);
                for a in acts.drain(..) {
                    match a {
                        Action::QuietSwim(ack) => self.send_quiet(to, ack),
                        other => unreachable!("a quiet ping's answer asks only its ack: {other:?}"),
                    }
                }
                self.actions = acts;
                return Ok(());
            }
        }
        let from = self.nodes[from].id;
        self.step(to, |p| {
            p.handle_quiet_swim(now, from, &q);
        })
    }

    pub(super) fn stalled(&self, n: usize) -> bool {
        self.cfg
            .stall
            .iter()
            .any(|s| s.node == n && (s.from_ms..s.until_ms).contains(&self.now))
    }

    /// An event a stalled node would handle is kept for when it resumes
    /// (None); any other is handled now. Messages are kept once they have
    /// passed the network (`arrived`); a timer due is kept as a `Wake`.
    pub(super) fn for_stalled(&mut self, ev: Ev) -> Option<Ev> {
        if self.cfg.stall.is_empty() {
            return Some(ev);
        }
        let n = match &ev {
            Ev::Timer { node, .. }
            | Ev::Wake { node, .. }
            | Ev::TaskEnd { node, .. }
            | Ev::InputsReady { node, .. }
            | Ev::BatchAnswer { node, .. }
            | Ev::Introduce { node, .. } => *node as usize,
            Ev::Served { to, .. } => *to as usize,
            Ev::Fetched { home, .. } => *home as usize,
            Ev::Leave(n) => *n as usize,
            Ev::Submit => self.cfg.submit_node,
            _ => return Some(ev),
        };
        if !self.stalled(n) {
            return Some(ev);
        }
        let ev = match ev {
            Ev::Timer { node, gen } => {
                if !self.timer_armed(node, gen) {
                    return None;
                }
                self.nodes[n].timer = None;
                Ev::Wake { node, gen }
            }
            other => other,
        };
        self.nodes[n].held.push(ev);
        None
    }

    /// Every group of live nodes that can reach each other (cut off by the
    /// same partitions, none stalled) is one mesh: they follow one of them,
    /// which coordinates, in one term, and each knows every other as a member.
    pub(super) fn one_mesh(&self) -> Result<(), String> {
        let cuts: Vec<&crate::scenario::PartitionSpec> = self
            .cfg
            .partitions
            .iter()
            .filter(|p| (p.from_ms..p.until_ms).contains(&self.now))
            .collect();
        let reach = self.alive.iter().copied();
        let mut groups: Vec<Vec<u32>> = if cuts.is_empty() {
            // No partition: one group, without a key per node (this look
            // comes every second of a farm that may last weeks).
            vec![reach.filter(|&n| !self.stalled(n as usize)).collect()]
        } else {
            let mut groups: FxHashMap<Vec<bool>, Vec<u32>> = FxHashMap::default();
            for n in reach.filter(|&n| !self.stalled(n as usize)) {
                let side = cuts
                    .iter()
                    .map(|p| p.nodes.contains(&(n as usize)))
                    .collect();
                groups.entry(side).or_default().push(n);
            }
            groups.into_values().collect()
        };
        groups.retain(|g| !g.is_empty());
        groups.sort();
        let peer = |n: u32| self.nodes[n as usize].peer.as_ref().expect("alive");
        let index = |id: NodeId| (id.0 - 1) as u32;
        for g in &groups {
            let first = peer(g[0]);
            let Some(c) = first.coordinator() else {
                return Err(format!("node {} follows no one", g[0]));
            };
            let (c, term) = (index(c), first.term());
            if g.binary_search(&c).is_err() || !peer(c).is_coordinator() {
                return Err(format!(
                    "node {} follows node {c}, which is not a coordinator it can reach",
                    g[0]
                ));
            }
            for &n in g {
                let p = peer(n);
                if p.coordinator().map(index) != Some(c) || p.term() != term {
                    return Err(format!(
                        "node {n} follows {:?} in term {}, node {} follows node {c} in term {term}",
                        p.coordinator().map(index),
                        p.term(),
                        g[0]
                    ));
                }
            }
            // A node whose members are the group's other nodes, by count and
            // by sum, knows each of them (the walk below is for the rest,
            // and for the words: at 10,000 nodes it is 10⁸ steps a look).
            let sum = g
                .iter()
                .map(|&n| member_hash(peer(n).id()))
                .fold(0u64, u64::wrapping_add);
            for &n in g {
                let p = peer(n);
                if p.member_count() + 1 == g.len()
                    && p.members_sum().wrapping_add(member_hash(p.id())) == sum
                {
                    continue;
                }
                if p.member_count() + 1 < g.len() {
                    return Err(format!(
                        "node {n} knows {} members, {} nodes can reach it",
                        p.member_count(),
                        g.len() - 1
                    ));
                }
                // Both in id order: one pass.
                let mut known = p.members().map(|m| index(m.id)).peekable();
                for &o in g.iter().filter(|&&o| o != n) {
                    while known.next_if(|&k| k < o).is_some() {}
                    if known.next_if_eq(&o).is_none() {
                        return Err(format!("node {n} does not know node {o} as a member"));
                    }
                }
            }
        }
        Ok(())
    }
}
