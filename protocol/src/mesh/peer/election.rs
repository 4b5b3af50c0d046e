//! Whom this node follows, in which term: elections by ballot terms, fencing of deposed coordinators.
//!
//! The lowest live node elects itself with a ballot one round above the
//! highest term it knew; a higher term wins everywhere, and on a tie the
//! lower id, so the two sides of a healed partition settle on one.

use super::super::msg::{Msg, NodeId};
use super::membership::Membership;
use super::out::Out;
use crate::engine::Millis;

/// Terms are ballots: an election round in the high half and the
/// electing node in the low half, so two nodes that elect themselves in
/// the same round (the two sides of a healing partition) never share a
/// term, and the higher one wins everywhere at once.
pub fn ballot(round: u64, node: NodeId) -> u64 {
    (round << 32) | (node.0 & 0xffff_ffff)
}

/// The election round of a term, as users see it.
pub fn term_round(term: u64) -> u64 {
    term >> 32
}

/// The coordinator this node follows and its term, as the other roles
/// address it (a copy: no role changes whom the node follows).
#[derive(Clone, Copy, Debug)]
pub(super) struct Leader {
    pub(super) node: Option<NodeId>,
    pub(super) term: u64,
}

impl Leader {
    /// Sends to the coordinator, when there is one; `msg` gets its term.
    pub(super) fn send(self, out: &mut Out, msg: impl FnOnce(u64) -> Msg) {
        if let Some(c) = self.node {
            out.send(c, msg(self.term));
        }
    }
}

pub(super) struct Election {
    term: u64,
    coordinator: Option<NodeId>,
    /// Pointed at an existing mesh: it waits this long to hear a
    /// coordinator before it may elect itself.
    joining: bool,
    join_until: Millis,
    /// Restarted on its state folder and pointed at the members it
    /// remembers, none of which has yet said whom it follows, a node
    /// waits this long before it may elect itself (they may all be gone,
    /// or all restarting too). Electing itself sooner, as the lowest of
    /// the few members it knows so far, would take the mesh from its
    /// coordinator (a claim of a lower id wins a tie of terms), or make a
    /// mesh of one that the real mesh must absorb later.
    alone_until: Millis,
    /// The nodes this one was introduced to while joining (the last is
    /// asked whom it follows), and whether one of them has answered.
    seeds: Vec<NodeId>,
    seed_answered: bool,
    /// The user named the mesh to join (`mesh join`): until a node there
    /// has said whom it follows, this node never runs alone, however long
    /// that takes (the seed may be paused, swamped by hundreds of
    /// joiners, or not started yet): a node that elected itself would be
    /// a mesh of one, which its users did not ask for.
    by_address: bool,
    /// The coordinator this node followed before the one it follows now,
    /// and until when it is passed over when the next in line is worked
    /// out (`passed_over`). A successor takes over when the coordinator
    /// goes silent, and most workers then still list the dead one until
    /// SWIM declares it down (some 10 s at 200 nodes): were the new
    /// coordinator to die within that time too, the node next in line
    /// would think the dead one next, and nobody would watch.
    deposed: Option<(NodeId, Millis)>,
    /// The latest clock of a beat of the coordinator this node follows,
    /// in its term (`Beat::seen`): 0 until one comes.
    seen: Millis,
}

/// How long a replaced coordinator is passed over (longer than SWIM
/// takes to declare a dead node down at any size we run).
const DEPOSED_MS: Millis = 30_000;

/// What an election round decided.
pub(super) enum Vote {
    /// The node that would be elected already coordinates: follow it.
    Follow { term: u64, node: NodeId },
    /// This node is the lowest live one: it coordinates in this term.
    Elect(u64),
}

impl Election {
    pub(super) fn new(joining: bool, join_until: Millis, alone_until: Millis) -> Election {
        Election {
            term: 0,
            coordinator: None,
            joining,
            join_until,
            alone_until,
            seeds: Vec::new(),
            seed_answered: false,
            by_address: false,
            deposed: None,
            seen: 0,
        }
    }

    /// A coordinator replaced by another lately: neither next in line nor
    /// elected while it may be the dead one SWIM has not yet declared down.
    pub(super) fn passed_over(&self, now: Millis) -> Option<NodeId> {
        self.deposed
            .filter(|&(_, until)| now < until)
            .map(|(node, _)| node)
    }

    /// The user named the mesh to join (a node restarted on its state
    /// folder only tries the peers it knew, and runs alone sooner).
    pub(super) fn joins_by_address(&mut self) {
        self.by_address = self.joining;
    }

    /// While joining: the node to ask whom it follows, until one answers
    /// (the last introduced: the node that connected last is up).
    pub(super) fn seed(&self) -> Option<NodeId> {
        self.seeds
            .last()
            .copied()
            .filter(|_| self.joining && !self.seed_answered)
    }

    /// This node joins through `node` (a join address that answered, or a
    /// member it remembered).
    pub(super) fn introduced(&mut self, node: NodeId) {
        if self.joining && !self.seed_answered {
            self.seeds.retain(|&s| s != node);
            self.seeds.push(node);
        }
    }

    /// A beat from `node`: if it is a seed, the mesh has said whom it follows.
    pub(super) fn answered_by(&mut self, node: NodeId) {
        if self.seeds.contains(&node) {
            self.seed_answered = true;
        }
    }

    pub(super) fn term(&self) -> u64 {
        self.term
    }

    pub(super) fn coordinator(&self) -> Option<NodeId> {
        self.coordinator
    }

    pub(super) fn leader(&self) -> Leader {
        Leader {
            node: self.coordinator,
            term: self.term,
        }
    }

    /// This node follows `node` in `term` from now on.
    pub(super) fn followed(&mut self, now: Millis, term: u64, node: NodeId) {
        if let Some(old) = self.coordinator.filter(|&c| c != node) {
            self.deposed = Some((old, now + DEPOSED_MS));
        }
        if self.term != term || self.coordinator != Some(node) {
            // Another coordinator's clock (or another life's of the same node).
            self.seen = 0;
        }
        self.term = term;
        self.coordinator = Some(node);
        self.joining = false;
    }

    /// `node` was declared dead.
    pub(super) fn lost(&mut self, node: NodeId) {
        if self.coordinator == Some(node) {
            self.coordinator = None;
        }
    }

    /// A member's beat: whether it claims to coordinate, in which term.
    /// Returns the term to follow it in, when it should be followed.
    /// `coordinating`: this node coordinates itself.
    pub(super) fn heard(
        &mut self,
        from: NodeId,
        claims: bool,
        term: u64,
        coordinating: bool,
    ) -> Option<u64> {
        if !claims && self.coordinator == Some(from) && !coordinating {
            // The coordinator this node follows says it no longer is (it
            // followed someone since, who died): this node looks for one
            // again, as if it had died, rather than wait on it for ever
            // while it waits for an election among its followers.
            self.coordinator = None;
        }
        if !claims {
            return None;
        }
        // Higher term wins; on a tie the lower id, so two halves that both
        // elected themselves settle on one.
        let better =
            term > self.term || (term == self.term && self.coordinator.is_none_or(|c| from < c));
        if better && self.coordinator != Some(from) {
            return Some(term);
        } else if better {
            if term != self.term {
                self.seen = 0;
            }
            self.term = term;
        }
        None
    }

    /// A beat of `from` in `term`, built at `clock` on its clock: if it is
    /// the coordinator this node follows, what this node says it holds
    /// from now on speaks for its assignments up to then.
    pub(super) fn saw(&mut self, from: NodeId, term: u64, clock: Millis) {
        if term == self.term && self.coordinator == Some(from) {
            self.seen = self.seen.max(clock);
        }
    }

    /// See [`Election::saw`].
    pub(super) fn seen(&self) -> Millis {
        self.seen
    }

    /// A worker's `seen` in `term`, as this node, its coordinator, reads
    /// it: nothing when the term is not this node's (another
    /// coordinator's clock says nothing of this one's claims).
    pub(super) fn seen_in(&self, term: u64, seen: Millis) -> Millis {
        if term == self.term {
            seen
        } else {
            0
        }
    }

    /// An assignment from `from` in `term` overtook that node's first beat
    /// as coordinator: follow it.
    pub(super) fn overtaken_by(&self, from: NodeId, term: u64) -> bool {
        self.coordinator != Some(from)
            && (term > self.term || (term == self.term && self.coordinator.is_none()))
    }

    /// Work from `from` in `term` is this node's coordinator's: a deposed
    /// coordinator is fenced off (it learns of the new term from beats).
    pub(super) fn current(&self, from: NodeId, term: u64) -> bool {
        term >= self.term && self.coordinator == Some(from)
    }

    /// With no coordinator, once any join wait is over: the lowest live
    /// node elects itself; a node that is not lowest follows the lowest
    /// when that one already coordinates, and otherwise waits for its beat.
    pub(super) fn round(&self, now: Millis, me: NodeId, members: &Membership) -> Option<Vote> {
        if self.coordinator.is_some() {
            return None;
        }
        let unanswered = !self.seed_answered && (self.by_address || !self.seeds.is_empty());
        let waiting = unanswered && (self.by_address || now < self.alone_until);
        if self.joining && (now < self.join_until || waiting) {
            return None;
        }
        let passed = self.passed_over(now);
        let lowest = members
            .ids()
            .find(|&m| Some(m) != passed)
            .map_or(me, |l| l.min(me));
        if let Some(m) = members.get(lowest) {
            if lowest < me && m.beat().coordinator == Some(lowest) {
                // The node that would be elected already coordinates, in a
                // lower term than this node last knew (that term's
                // coordinator died, and nodes restarted since count from
                // the start): it waits for no election, so follow it. A
                // higher term coming back still wins.
                return Some(Vote::Follow {
                    term: m.beat().term,
                    node: lowest,
                });
            }
        }
        // Otherwise the lowest live node elects itself and its beat says so.
        (me <= lowest).then(|| Vote::Elect(ballot(term_round(self.term) + 1, me)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn joiner_by_address() -> (Election, Membership) {
        let mut e = Election::new(true, 1_000, 30_000);
        e.joins_by_address();
        (e, Membership::new(0, NodeId(1), 7, 10_000, false))
    }

    #[test]
    fn a_mesh_join_node_waits_for_its_seed_however_long_and_elects_once_it_answers() {
        let (mut e, members) = joiner_by_address();
        let seed = NodeId(9);
        assert!(e.round(5_000, NodeId(1), &members).is_none());
        // Heard from a node it was never told it joins through: the beat
        // of a node that follows nobody yet does not answer the join.
        e.answered_by(seed);
        assert!(e.round(3_600_000, NodeId(1), &members).is_none());
        // The driver says the seed is reached (also when membership's
        // gossip had named it first): its beat answers.
        e.introduced(seed);
        assert_eq!(e.seed(), Some(seed));
        e.answered_by(seed);
        assert_eq!(e.seed(), None);
        assert!(matches!(
            e.round(3_600_000, NodeId(1), &members),
            Some(Vote::Elect(_))
        ));
    }
}
