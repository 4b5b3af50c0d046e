//! Victims for the thieves the coordinator points at the end of a farm, found from its own count of claims, not the members' beats.
//!
//! A worker reports to a mesh of N nodes every N / `reports_per_s`
//! seconds (50 s at 10,000 nodes), so at that size the `queued` of its
//! last beat is older than a farm of a few seconds: the victims named
//! from beats alone were nodes long emptied (80,000 steals asked, none
//! won), while a task queued behind a node's long runs waited a third
//! of a second for a slot there with slots idle elsewhere (mesh 1.106
//! of greedy). The coordinator knows each node's claims at once (it
//! hands them out and hears each end and each move): a node holding
//! more claims than its resources run at once has the rest queued. Once
//! it has nothing left to hand out, each node whose report it answers
//! and that has room is told a few such victims at once
//! (`on_tasks::point_thieves`), dealt in turn so thieves do not all ask
//! the same node, those that ended no task for longest first: their
//! queues wait behind long runs, where a node turning its slots over
//! starts its queue soon anyway. The beats' victims stay as they were:
//! in a small mesh they are fresh, and a skewed farm (all work on one
//! node) balanced worse on the claims' estimate (1.10 of greedy against
//! 1.01).

use std::cmp::Reverse;

use rustc_hash::FxHashMap;

use super::super::super::msg::{NodeId, Victim};
use super::Coord;
use crate::engine::Millis;
use crate::resources::Resources;

/// The most victims a beat names: it stays a packet.
const VICTIMS_MAX: usize = 8;
/// The most victims found at once, dealt out a few to each thief.
const FOUND_MAX: usize = 256;
/// How many victims each thief pointed to at once is dealt.
const DEALT: usize = 3;

/// How many of `count` claims holding `load` a node of `total` runs at
/// once, taking the claims as alike (a farm's tasks mostly are): the
/// rest are queued. And whether it has room for one more such claim.
pub(in super::super) fn split(total: &Resources, load: &Resources, count: usize) -> (usize, bool) {
    if count == 0 {
        return (0, true);
    }
    // The share of its claims the node can hold, by its scarcest resource.
    let mut share = f64::INFINITY;
    for (name, held) in load.iter() {
        if held.is_zero() {
            continue;
        }
        share = share.min(total.get(name).as_f64() / held.as_f64());
    }
    if !share.is_finite() {
        // Claims that ask for nothing all run.
        return (0, true);
    }
    let runs = ((count as f64 * share + 1e-9).floor() as usize).min(count);
    let room = count as f64 * share >= count as f64 + 1.0 - 1e-9;
    (count - runs, room)
}

/// When each node last reported a task's end to this coordinator.
#[derive(Default)]
pub(in super::super) struct Ends {
    at: FxHashMap<NodeId, Millis>,
    /// The victims last found, and when: a step with many reports finds
    /// them once.
    named: Option<(Millis, Vec<Victim>)>,
    /// Where the next thief's victims start in that list: thieves told in
    /// turn are dealt different victims rather than all asking the first.
    deal: usize,
}

impl Ends {
    pub(in super::super) fn ended(&mut self, node: NodeId, now: Millis) {
        self.at.insert(node, now);
    }

    pub(in super::super) fn forget(&mut self, node: NodeId) {
        self.at.remove(&node);
        self.named = None;
    }
}

impl Coord {
    /// Victims for the next thief. While work is piled on some nodes
    /// (queued past their prefetch), those, most first, as a beat names
    /// them: every thief should take from there. Otherwise (the end of a
    /// farm: every node queues at most its prefetch) the next few of the
    /// list, so thieves told in turn ask different nodes.
    pub(in super::super) fn deal<'t>(
        &mut self,
        now: Millis,
        me: Victim,
        total: impl Fn(NodeId) -> Option<&'t Resources>,
    ) -> Vec<Victim> {
        let deal = self.ends.deal;
        let found = self.found(now, me, total);
        let Some(top) = found.first() else {
            return Vec::new();
        };
        if top.queued > top.prefetch {
            return found[..found.len().min(VICTIMS_MAX)].to_vec();
        }
        let n = found.len();
        let take = DEALT.min(n);
        let start = deal % n;
        let v = (0..take).map(|i| found[(start + i) % n]).collect();
        self.ends.deal = (start + take) % n;
        v
    }

    /// The nodes with tasks queued beyond what they run: those queued past
    /// their prefetch first, most first, then the others, longest without
    /// an end first; at most [`FOUND_MAX`]. `total` says a node's
    /// resources (none: not known yet, left out); `me` is this node's
    /// own queue, which it knows exactly. Found once a millisecond.
    fn found<'t>(
        &mut self,
        now: Millis,
        me: Victim,
        total: impl Fn(NodeId) -> Option<&'t Resources>,
    ) -> &[Victim] {
        if self.ends.named.as_ref().is_some_and(|(at, _)| *at == now) {
            return &self.ends.named.as_ref().expect("checked").1;
        }
        let mut found: Vec<(Millis, Victim)> = Vec::new();
        for (&node, (load, count)) in &self.load {
            if node == me.node {
                continue;
            }
            let Some(total) = total(node) else { continue };
            let (queued, _) = split(total, load, *count);
            if queued == 0 {
                continue;
            }
            let since = self.ends.at.get(&node).copied().unwrap_or(0);
            let prefetch = self.depth.get(&node).copied().unwrap_or(1);
            found.push((
                since,
                Victim {
                    node,
                    queued: queued as u32,
                    prefetch,
                },
            ));
        }
        if me.queued > 0 {
            let since = self.ends.at.get(&me.node).copied().unwrap_or(0);
            found.push((since, me));
        }
        // Hashed, so sorted whole: the order must not depend on the map's.
        // A node queued past its prefetch (work piled on it) first, most
        // first: every thief should take from there; then the others.
        found.sort_unstable_by_key(|(since, v)| {
            let over = v.queued.saturating_sub(v.prefetch);
            (Reverse(over), *since, Reverse(v.queued), v.node)
        });
        found.truncate(FOUND_MAX);
        let v: Vec<Victim> = found.into_iter().map(|(_, v)| v).collect();
        &self.ends.named.insert((now, v)).1
    }

    /// Whether `node` has room for another of the claims it holds (or
    /// holds none), by the coordinator's count.
    pub(in super::super) fn has_room(&self, node: NodeId, total: &Resources) -> bool {
        self.load
            .get(&node)
            .is_none_or(|(load, count)| split(total, load, *count).1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::parse_resources;

    #[test]
    fn claims_beyond_what_the_node_runs_are_queued() {
        let total = parse_resources("cpu=4").unwrap();
        let load = |s| parse_resources(s).unwrap();
        assert_eq!(split(&total, &load("cpu=6"), 6), (2, false));
        assert_eq!(split(&total, &load("cpu=4"), 4), (0, false));
        assert_eq!(split(&total, &load("cpu=3"), 3), (0, true));
        assert_eq!(
            split(&total, &load("cpu=2"), 1),
            (0, true),
            "a 2-core claim fits twice"
        );
        assert_eq!(
            split(&total, &load("cpu=6"), 2),
            (1, false),
            "3 cores each: one runs"
        );
        assert_eq!(split(&total, &Resources::new(), 0), (0, true));
        let gpus = parse_resources("cpu=8,gpu=1").unwrap();
        assert_eq!(
            split(&gpus, &load("cpu=3,gpu=3"), 3),
            (2, false),
            "the scarcest resource decides"
        );
    }
}
