//! Stealing: which members have tasks queued (the victims), the one steal this node has in flight, and how its answer is matched.
//!
//! A thief asks only when it has nothing queued and the coordinator has
//! nothing left to hand out; every steal carries an id, and an answer to
//! any other is stale (its tasks go back to the coordinator). The victim's
//! side, giving up only what has not started, is the worker's
//! (`Worker::give_unstarted`).

use indexmap::IndexMap;
use rand::RngExt;
use rustc_hash::FxBuildHasher;

use super::super::msg::*;
use super::coordinator::Coord;
use super::worker::Worker;
use super::{Node, Working};
use crate::engine::Millis;
use crate::observe::Latency;

pub(super) struct Stealing {
    /// The steal in flight: its id, the victim, when it was asked.
    asked: Option<(u64, NodeId, Millis)>,
    next_id: u64,
    /// Members with tasks queued, as far as this node knows (their last
    /// beat, or none once a steal there came back empty): the steal victims.
    loaded: IndexMap<NodeId, u32, FxBuildHasher>,
    /// The members of `loaded` with more queued than a node of their size
    /// keeps as its prefetch: a thief with no free slot steals only there.
    overloaded: IndexMap<NodeId, u32, FxBuildHasher>,
    /// The coordinator's last word on the victims, while nothing else
    /// changed them since: the same word again (every beat of a steady
    /// farm) leaves them as they are rather than rebuilding both maps.
    said: Option<Vec<Victim>>,
}

/// How a thief takes a victim's answer.
pub(super) enum Answer {
    /// To the steal in flight, with tasks: they are this node's to run.
    Won,
    /// To the steal in flight, empty: try another victim.
    Empty,
    /// To a steal given up on, empty: nothing to do.
    Ignored,
    /// To a steal given up on, with tasks (or while interrupted): they go
    /// back to the coordinator rather than being dropped.
    Stale,
}

impl Stealing {
    /// Whom a thief asks: any member with a queue, or for a `full` one
    /// only the overloaded.
    fn victims(&self, full: bool) -> &IndexMap<NodeId, u32, FxBuildHasher> {
        if full {
            &self.overloaded
        } else {
            &self.loaded
        }
    }

    pub(super) fn new() -> Stealing {
        Stealing {
            asked: None,
            next_id: 1,
            loaded: IndexMap::default(),
            overloaded: IndexMap::default(),
            said: None,
        }
    }

    /// What this node believes `node` holds queued, beyond `spare` its own
    /// prefetch: keeps the two victim indices in step.
    pub(super) fn note_queued(&mut self, node: NodeId, queued: u32, spare: usize) {
        self.said = None;
        self.note(node, queued, spare);
    }

    fn note(&mut self, node: NodeId, queued: u32, spare: usize) {
        if queued > 0 {
            self.loaded.insert(node, queued);
        } else {
            self.loaded.swap_remove(&node);
        }
        if queued as usize > spare {
            self.overloaded.insert(node, queued);
        } else {
            self.overloaded.swap_remove(&node);
        }
    }

    /// The coordinator's word on who has tasks queued: the victims from
    /// now on (none but these), never this node itself.
    pub(super) fn set_victims(&mut self, me: NodeId, victims: &[Victim]) {
        if self.said.as_deref() == Some(victims) {
            return;
        }
        self.loaded.clear();
        self.overloaded.clear();
        for v in victims.iter().filter(|v| v.node != me) {
            self.note(v.node, v.queued, v.prefetch as usize);
        }
        let mut said = self.said.take().unwrap_or_default();
        said.clear();
        said.extend_from_slice(victims);
        self.said = Some(said);
    }

    /// No member is known to have tasks queued.
    pub(super) fn is_empty(&self) -> bool {
        self.loaded.is_empty()
    }

    /// `node` died: no steal waits on it, and it is no victim.
    pub(super) fn member_gone(&mut self, node: NodeId) {
        if let Some((_, victim, _)) = self.asked {
            if victim == node {
                self.asked = None;
            }
        }
        self.note_queued(node, 0, 0);
    }

    /// When the steal in flight is given up.
    pub(super) fn poll_timeout(&self, timeout_ms: Millis) -> Option<Millis> {
        self.asked.map(|(_, _, t)| t + timeout_ms)
    }

    /// Gives up a steal with no answer after `timeout_ms`.
    pub(super) fn expire(&mut self, now: Millis, timeout_ms: Millis) {
        if let Some((_, _, at)) = self.asked {
            if now >= at + timeout_ms {
                self.asked = None;
            }
        }
    }
}

/// Whether [`Working::try_steal`] would ask anyone now: it has nothing
/// queued, no steal in flight, the coordinator nothing left to hand out,
/// and there are victims to ask (overloaded ones for a full node).
pub(super) fn would_steal(
    node: &Node,
    coord: Option<&Coord>,
    worker: &Worker,
    steal: &Stealing,
) -> bool {
    if !node.cfg.steal || worker.interrupted() || steal.asked.is_some() || worker.has_waiting() {
        // Tasks waiting for their farm's spec are queued too: stealing
        // more before they start would hoard.
        return false;
    }
    // Victims first: asked at every poll, and the backlog, a look up of
    // the coordinator's beat, is the dearer of the two.
    if steal.victims(worker.full()).is_empty() {
        return false;
    }
    // The coordinator still has work to hand out; it will.
    backlog(node, coord) == 0
}

/// What the coordinator has left to hand out: its engine's, on the
/// coordinator, or what its last beat said.
fn backlog(node: &Node, coord: Option<&Coord>) -> u64 {
    match (coord, node.election.leader().node) {
        (Some(c), _) => c.backlog(),
        (None, Some(c)) => node.members.beat_of(c).map_or(0, |b| b.backlog),
        (None, None) => 0,
    }
}

/// A thief's side of a steal, which reads the worker it steals for and
/// whom it follows.
impl Working<'_> {
    /// Asks a loaded member for queued tasks when this node has nothing
    /// queued (its own queue runs first) and the coordinator nothing left
    /// to hand out (`backlog`, asked only then). A node with a free slot
    /// asks any member with a queue; a full one asks only overloaded
    /// members, for its next task, so the ordinary one-task prefetch does
    /// not hop from full node to full node.
    pub(super) fn try_steal(&mut self, now: Millis) {
        if !would_steal(self.node, self.coord, self.worker, self.steal) {
            return;
        }
        let cfg = &self.node.cfg;
        let victims = self.steal.victims(self.worker.full());
        let n = victims.len();
        // Two random choices: nearly as good as asking the most loaded, and
        // thieves do not all pile onto the same victim.
        let (i, j) = (self.rng.random_range(0..n), self.rng.random_range(0..n));
        let (a, b) = (
            victims.get_index(i).expect("in range"),
            victims.get_index(j).expect("in range"),
        );
        let victim = if b.1 > a.1 { *b.0 } else { *a.0 };
        let id = self.steal.next_id;
        self.steal.next_id += 1;
        self.steal.asked = Some((id, victim, now));
        self.out.stats.steals_asked += 1;
        let total = self.worker.total().clone();
        // Nothing is queued here (checked above): the load is what runs.
        let load = (*self.worker.used()).clone();
        let max = cfg.batch_max as u32;
        self.out.send(
            victim,
            Msg::Steal {
                id,
                total,
                load,
                max,
            },
        );
    }

    /// How this thief takes the answer of `from` to steal `id`, with `tasks`.
    pub(super) fn take_answer(
        &mut self,
        now: Millis,
        from: NodeId,
        id: u64,
        tasks: &[Assigned],
    ) -> Answer {
        let steal = &mut *self.steal;
        let out = &mut *self.out;
        let current = matches!(steal.asked, Some((sid, v, _)) if sid == id && v == from);
        if current {
            if let (Some(o), Some((_, _, asked))) = (out.observed(), steal.asked) {
                o.latency
                    .record_ms(Latency::StealRtt, now.saturating_sub(asked));
            }
            steal.asked = None;
        }
        if tasks.is_empty() {
            if current {
                // Nothing to take there until its next beat says otherwise.
                steal.note_queued(from, 0, 0);
                return Answer::Empty;
            }
            return Answer::Ignored;
        }
        if !current || self.worker.interrupted() {
            return Answer::Stale;
        }
        out.stats.steals_won += 1;
        out.stats.tasks_stolen += tasks.len() as u64;
        Answer::Won
    }
}
