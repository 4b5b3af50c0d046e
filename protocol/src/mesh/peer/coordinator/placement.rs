//! Placement: the coordinator hands ready tasks to nodes with room, each up to its prefetch depth and its share of what is left.

use super::super::super::msg::*;
use super::super::out::Out;
use super::super::placement::{claims_cap, room, Prefetch};
use super::super::Node;
use super::Coord;
use crate::alloc::fits_before_walltime;
use crate::engine::Millis;
use crate::farm::{reads_outputs, TaskRef};
use crate::resources::Resources;

/// How many of a task's dependencies placement looks at to find the node
/// that made them (an element-wise pair is the first; a gather's are many,
/// and made everywhere).
const NEAR_DEPS: u64 = 4;

/// The clock of each worker's report handled in one step, echoed back with
/// the assignment that answers it. A step's own: an assignment in a later
/// step (after a new coordinator settles, say) did not answer that report,
/// and echoing it would count the wait between as the report's round trip.
pub(in super::super) type Echoes = rustc_hash::FxHashMap<NodeId, Millis>;

/// The coordinator's own node, which it places work on like any other.
pub(in super::super) struct Local<'a> {
    pub(in super::super) total: &'a Resources,
    pub(in super::super) depth: u32,
    pub(in super::super) deadline: Option<Millis>,
}

impl Coord {
    /// Hands ready tasks to nodes with room, each answering its node's
    /// report of this step with that report's clock (`echo`).
    pub(in super::super) fn assign(
        &mut self,
        now: Millis,
        cx: &Node,
        me: Local,
        mut echo: Echoes,
        out: &mut Out,
    ) {
        let cfg = &cx.cfg;
        let (fixed, claims_max) = (cfg.prefetch_percent, cfg.node_claims_max);
        let (batch_max, queue_max) = (cfg.batch_max, cfg.queue_max);
        let nodes: Vec<NodeId> = {
            let backlog = self.engine.backlog();
            if backlog > self.last_backlog {
                // New work (a submission, a stage opening, a task re-queued):
                // nodes that had nothing fitting may have now.
                self.hungry.extend(cx.members.ids());
                self.hungry.insert(cx.id);
            }
            self.last_backlog = backlog;
            if backlog == 0 {
                return;
            }
            self.hungry.iter().copied().collect()
        };
        if nodes.is_empty() {
            // Most steps of a busy coordinator (a home's fetches, beats,
            // its own runs) leave no node hungry: nothing to weigh.
            self.drain(out);
            return;
        }
        // Near the end of some work, a task queued behind a busy node's
        // running ones may wait for a long one while a slot idles elsewhere:
        // such tasks go only to free slots. Before that, no node queues
        // more than its share of what is left, so the end spreads.
        let waiting = self.engine.waiting();
        let nodes_n = cx.members.len() as u64 + 1;
        let term = cx.term();
        for node in nodes {
            let member = if node == cx.id {
                None
            } else {
                cx.members.get(node)
            };
            let depth = if node == cx.id {
                me.depth
            } else {
                self.depth
                    .get(&node)
                    .copied()
                    .unwrap_or_else(|| member.map_or(1, |m| m.beat().prefetch))
            };
            // Borrowed field by field, so the coordinator's state can change
            // meanwhile without cloning the node's resources. A node that
            // drains before its walltime takes only what it is expected to
            // finish first.
            let (total, deadline) = if node == cx.id {
                (Some(me.total), me.deadline)
            } else {
                (
                    member.map(|m| &*m.beat().total),
                    member.and_then(|m| {
                        m.beat()
                            .ends_in_ms
                            .map(|left| m.last_seen().saturating_add(left))
                    }),
                )
            };
            let Some(total) = total else {
                self.hungry.remove(&node);
                continue;
            };
            if self.engine.backlog() == 0 {
                return;
            }
            let (load, count) = self.load.entry(node).or_default();
            let cap =
                queue_max.min(claims_max.unwrap_or_else(|| claims_cap(total) + depth as usize));
            let (farms, slots) = (&self.farms, &self.slots);
            // A task whose dependencies' outputs this node made goes to it
            // before others: they are there already, nothing is fetched.
            let mut near = |slot: crate::engine::FarmSlot, t: TaskRef| {
                let f = &farms[&slots[slot.0 as usize]];
                let def = &f.spec.def;
                reads_outputs(def, t.stage)
                    && (0..NEAR_DEPS).map_while(|n| def.dependency(t, n)).any(
                        |d| matches!(f.log.get(d), Some(Entry::Done { node: n, .. }) if *n == node),
                    )
            };
            let claimed = self.engine.claim_near(
                now,
                batch_max.min(cap.saturating_sub(*count)),
                &mut |_, stage| {
                    if deadline.is_some_and(|d| !fits_before_walltime(now, d, stage.expected_ms, 0))
                    {
                        return false;
                    }
                    let req = &stage.resources;
                    let (queued, draining) = waiting
                        .iter()
                        .find(|(r, ..)| r == req)
                        .map_or((0, true), |(_, q, d)| (*q, *d));
                    let prefetch = match fixed {
                        _ if draining => Prefetch::None,
                        Some(pct) => Prefetch::Percent(pct),
                        None => {
                            Prefetch::Depth((depth as u64).min(queued.div_ceil(nodes_n)).max(1))
                        }
                    };
                    if !room(total, load, req, prefetch) {
                        return false;
                    }
                    load.give(req);
                    true
                },
                &mut near,
            );
            *count += claimed.len();
            let full = *count >= cap || claimed.is_empty();
            let mut taken = Vec::with_capacity(claimed.len());
            for (slot, task, attempt) in claimed {
                self.claims.insert((slot, task), (node, attempt, now));
                taken.push(Assigned {
                    farm: self.slots[slot.0 as usize],
                    task,
                    attempt,
                });
            }
            if full {
                self.hungry.remove(&node);
            }
            if !taken.is_empty() {
                let echo = echo.remove(&node);
                out.send(
                    node,
                    Msg::Assign {
                        term,
                        tasks: taken,
                        echo,
                        clock: now,
                    },
                );
            }
        }
        self.last_backlog = self.engine.backlog();
        self.drain(out);
    }
}
