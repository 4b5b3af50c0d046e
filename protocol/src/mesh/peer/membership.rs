//! Who is alive: the members this node hears beats from, when each was last heard, and who was declared dead.
//!
//! The rest of the peer sees only this interface: the live members with
//! their last beat (resources, load, whom they follow), members that came
//! up (`heard` says fresh) and members that went silent (`expired`, then
//! `remove`). How liveness is learnt (today every member's beat; a
//! probing protocol later) stays inside.

use std::collections::BTreeMap;
use std::sync::Arc;

use rustc_hash::FxHashMap;

use super::super::msg::{Beat, NodeId};
use crate::engine::Millis;

/// A member as this node last heard of it.
#[derive(Clone, Debug)]
pub struct Member {
    pub id: NodeId,
    pub beat: Arc<Beat>,
    pub last_seen: Millis,
}

pub(super) struct Membership {
    /// How this node is known on the network, gossiped in its beats.
    label: String,
    addrs: Vec<String>,
    members: BTreeMap<NodeId, Member>,
    /// Members declared dead, and since when (the home waits for those
    /// that keep its outputs).
    gone: FxHashMap<NodeId, Millis>,
    /// No member can have been silent too long before this: the oldest
    /// `last_seen` at the last scan plus the limit (a beat only moves a
    /// `last_seen` later), so most heartbeats skip the scan of every member.
    quiet_until: Millis,
    /// When this node next gossips its beat.
    next_beat: Millis,
    /// The queue length this node last gossiped.
    advertised: u32,
}

impl Membership {
    pub(super) fn new(now: Millis) -> Membership {
        Membership {
            label: String::new(),
            addrs: Vec::new(),
            members: BTreeMap::new(),
            gone: FxHashMap::default(),
            quiet_until: 0,
            next_beat: now,
            advertised: 0,
        }
    }

    pub(super) fn set_address(&mut self, label: String, addrs: Vec<String>) {
        self.label = label;
        self.addrs = addrs;
    }

    pub(super) fn label(&self) -> &str {
        &self.label
    }

    pub(super) fn addrs(&self) -> &[String] {
        &self.addrs
    }

    /// The live members, in id order.
    pub(super) fn iter(&self) -> impl Iterator<Item = &Member> {
        self.members.values()
    }

    /// The live members' ids, in order.
    pub(super) fn ids(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.members.keys().copied()
    }

    pub(super) fn get(&self, id: NodeId) -> Option<&Member> {
        self.members.get(&id)
    }

    pub(super) fn contains(&self, id: NodeId) -> bool {
        self.members.contains_key(&id)
    }

    pub(super) fn len(&self) -> usize {
        self.members.len()
    }

    pub(super) fn lowest(&self) -> Option<NodeId> {
        self.members.keys().next().copied()
    }

    /// When `id` was declared dead, if it was and has not come back.
    pub(super) fn gone_since(&self, id: NodeId) -> Option<Millis> {
        self.gone.get(&id).copied()
    }

    /// A member's beat. True when it is new here (it joined, or came back).
    pub(super) fn heard(&mut self, now: Millis, from: NodeId, beat: Arc<Beat>) -> bool {
        let fresh = !self.members.contains_key(&from);
        if fresh {
            self.gone.remove(&from);
        }
        self.members.insert(
            from,
            Member {
                id: from,
                beat,
                last_seen: now,
            },
        );
        fresh
    }

    /// Members silent longer than `limit`: still listed until `remove`d,
    /// one at a time, so each death is handled with the others alive.
    pub(super) fn expired(&mut self, now: Millis, limit: Millis) -> Vec<NodeId> {
        if now <= self.quiet_until {
            return Vec::new();
        }
        let mut dead = Vec::new();
        let mut oldest = now;
        for m in self.members.values() {
            if now.saturating_sub(m.last_seen) > limit {
                dead.push(m.id);
            } else {
                oldest = oldest.min(m.last_seen);
            }
        }
        self.quiet_until = oldest + limit;
        dead
    }

    /// `id` is dead from `now`.
    pub(super) fn remove(&mut self, now: Millis, id: NodeId) {
        self.members.remove(&id);
        self.gone.insert(id, now);
    }

    /// This node was not listening (stopped, or starved of CPU): every
    /// member counts as heard a heartbeat before `now`.
    pub(super) fn refresh(&mut self, now: Millis, heartbeat_ms: Millis) {
        for m in self.members.values_mut() {
            m.last_seen = m.last_seen.max(now.saturating_sub(heartbeat_ms));
        }
    }

    pub(super) fn next_beat(&self) -> Millis {
        self.next_beat
    }

    /// A heartbeat is due at `now`: the next one is set.
    pub(super) fn beat_due(&mut self, now: Millis, heartbeat_ms: Millis) -> bool {
        if now < self.next_beat {
            return false;
        }
        self.next_beat = now + heartbeat_ms;
        true
    }

    pub(super) fn advertised(&self) -> u32 {
        self.advertised
    }

    pub(super) fn advertise(&mut self, queued: u32) {
        self.advertised = queued;
    }
}
