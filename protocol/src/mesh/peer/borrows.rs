//! The views the dispatcher lends to steps that borrow several roles at once, where naming each as an argument would say no more: what a beat tells (`Told`), every role for the steps that tell it (`Roles`), a worker's side (`Working`), and the coordinator's where it weighs the machines (`Coordinating`).

use super::*;

/// Everything a beat tells of this node, borrowed while one is built:
/// every role has its say in it.
pub(super) struct Told<'a> {
    pub(super) node: &'a Node,
    pub(super) coord: Option<&'a Coord>,
    pub(super) worker: &'a Worker,
    pub(super) specs: &'a Specs,
    pub(super) allocs: &'a Allocs,
    pub(super) said: &'a Said,
    pub(super) clock: Millis,
}

/// The borrows of the steps that change roles and tell other nodes this
/// node's beat as they go: a coordinator followed or elected, a beat
/// heard, a member up, an assignment, a resend, a home taken. A beat
/// speaks of every role (see `Told`) as of the moment it is sent, between
/// the changes of the step, so these steps borrow every role at once;
/// every other step borrows only the roles it names, or a worker's side
/// (`Working`), or the coordinator's (`Coordinating`).
pub(super) struct Roles<'a> {
    pub(super) node: &'a mut Node,
    pub(super) coord: &'a mut Option<Coord>,
    pub(super) worker: &'a mut Worker,
    pub(super) steal: &'a mut Stealing,
    pub(super) holdings: &'a mut Holdings,
    pub(super) allocs: &'a mut Allocs,
    pub(super) specs: &'a mut Specs,
    pub(super) rng: &'a mut SmallRng,
    pub(super) kept: &'a mut Kept,
    pub(super) said: &'a mut Said,
    /// The time of the latest input, which no step changes.
    pub(super) clock: Millis,
    pub(super) out: &'a mut Out,
}

impl Roles<'_> {
    pub(super) fn told(&self) -> Told<'_> {
        Told {
            node: self.node,
            coord: self.coord.as_ref(),
            worker: self.worker,
            specs: self.specs,
            allocs: self.allocs,
            said: self.said,
            clock: self.clock,
        }
    }

    pub(super) fn working(&mut self) -> Working<'_> {
        Working {
            node: self.node,
            coord: self.coord.as_ref(),
            specs: self.specs,
            worker: self.worker,
            steal: self.steal,
            rng: self.rng,
            out: self.out,
        }
    }
}

/// A worker's side of a step, its queue and its steals, with what they
/// read: the farms' definitions, whom it follows, and (on the
/// coordinator) the backlog a steal weighs.
pub(super) struct Working<'a> {
    pub(super) node: &'a Node,
    pub(super) coord: Option<&'a Coord>,
    pub(super) specs: &'a Specs,
    pub(super) worker: &'a mut Worker,
    pub(super) steal: &'a mut Stealing,
    pub(super) rng: &'a mut SmallRng,
    pub(super) out: &'a mut Out,
}

/// The coordinator's side of a step that weighs the machines there are
/// and those that may come: ready tasks placed, and the allocation
/// queues' loop. Both read this node's worker as one of the machines;
/// the loop changes the queues' book, and reads the farms' definitions
/// for the work queued here that cannot start soon.
pub(super) struct Coordinating<'a> {
    pub(super) node: &'a Node,
    pub(super) coord: &'a mut Option<Coord>,
    pub(super) allocs: &'a mut Allocs,
    pub(super) worker: &'a Worker,
    pub(super) specs: &'a Specs,
    pub(super) out: &'a mut Out,
}

impl Peer {
    /// Every role, borrowed for a step that tells this node's beat (see `Roles`).
    pub(super) fn roles(&mut self) -> Roles<'_> {
        Roles {
            node: &mut self.node,
            coord: &mut self.coord,
            worker: &mut self.worker,
            steal: &mut self.steal,
            holdings: &mut self.holdings,
            allocs: &mut self.allocs,
            specs: &mut self.specs,
            rng: &mut self.rng,
            kept: &mut self.kept,
            said: &mut self.said,
            clock: self.clock,
            out: &mut self.out,
        }
    }

    pub(super) fn told(&self) -> Told<'_> {
        Told {
            node: &self.node,
            coord: self.coord.as_ref(),
            worker: &self.worker,
            specs: &self.specs,
            allocs: &self.allocs,
            said: &self.said,
            clock: self.clock,
        }
    }

    pub(super) fn coordinating(&mut self) -> Coordinating<'_> {
        Coordinating {
            node: &self.node,
            coord: &mut self.coord,
            allocs: &mut self.allocs,
            worker: &self.worker,
            specs: &self.specs,
            out: &mut self.out,
        }
    }

    pub(super) fn working(&mut self) -> Working<'_> {
        Working {
            node: &self.node,
            coord: self.coord.as_ref(),
            specs: &self.specs,
            worker: &mut self.worker,
            steal: &mut self.steal,
            rng: &mut self.rng,
            out: &mut self.out,
        }
    }
}
