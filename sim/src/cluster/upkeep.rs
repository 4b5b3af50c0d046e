//! The farm's events sorted into upkeep and changes, for the speed line: how much of a run an exact skip over quiet stretches would jump, and which timers it would have to jump over.

use mesh_protocol::mesh::{Msg, TimerKind};

use super::*;
use crate::report::Upkeep;

/// Message kinds and timers, each a source of upkeep; and a wake for a
/// timer that had moved since.
const KINDS: usize = Msg::KINDS.len();
const SOURCES: usize = KINDS + TimerKind::ALL.len() + 2;
const SUPERSEDED: usize = SOURCES - 1;
const REPORTED: usize = SOURCES - 2;

/// What an event was, as the speed line counts it.
pub(super) enum Seen {
    /// The mesh's periodic work, from this source.
    Upkeep(usize),
    /// Something happened: the quiet stretch, if any, ends here.
    Change,
    /// Outside the farm, or the simulator's own (a look at the mesh).
    Neither,
}

/// The count as the run goes.
pub(super) struct Tally {
    of: u64,
    events: u64,
    by_source: [u64; SOURCES],
    last_change: Millis,
    /// Upkeep since the last change.
    since: u64,
    stretches: u64,
    stretch_ms: u64,
    longest_ms: u64,
    in_long: u64,
    /// What went without a wake or a step: workers' reports sent for them
    /// at their heartbeat (`Sim::promises`); membership acks taken by
    /// their probers when sent and quiet pings answered at their arrival
    /// (`Sim::acks_when_sent`); workers' reports their coordinator
    /// answered, and lists of claims it took, at their arrival
    /// (`Peer::take_quiet_message`, where `promises`), and its answers
    /// their workers took (`Peer::take_quiet_answer`).
    pub(super) reports_sent: u64,
    pub(super) acks: u64,
    pub(super) pings: u64,
    pub(super) reports_answered: u64,
    pub(super) claims: u64,
    pub(super) answers: u64,
}

/// A stretch this long or longer is one a skip could gain on: shorter
/// ones are over before a beat's round trip and a probe's have settled.
const LONG_MS: Millis = 1000;

impl Default for Tally {
    fn default() -> Tally {
        Tally {
            of: 0,
            events: 0,
            by_source: [0; SOURCES],
            last_change: 0,
            since: 0,
            stretches: 0,
            stretch_ms: 0,
            longest_ms: 0,
            in_long: 0,
            reports_sent: 0,
            acks: 0,
            pings: 0,
            reports_answered: 0,
            claims: 0,
            answers: 0,
        }
    }
}

impl Tally {
    pub(super) fn see(&mut self, now: Millis, seen: Seen) {
        match seen {
            Seen::Upkeep(source) => {
                self.of += 1;
                self.events += 1;
                self.since += 1;
                self.by_source[source] += 1;
            }
            Seen::Change => {
                self.of += 1;
                self.change(now);
            }
            Seen::Neither => {}
        }
    }

    /// Something happened at `now`: a stretch with upkeep in it ends.
    pub(super) fn change(&mut self, now: Millis) {
        if self.since > 0 {
            let ms = now.saturating_sub(self.last_change);
            self.stretches += 1;
            self.stretch_ms += ms;
            self.longest_ms = self.longest_ms.max(ms);
            if ms >= LONG_MS {
                self.in_long += self.since;
            }
            self.since = 0;
        }
        self.last_change = now;
    }

    pub(super) fn report(&self) -> Upkeep {
        let name = |i: usize| match i {
            SUPERSEDED => "superseded timer".to_string(),
            REPORTED => "report sent for its worker".to_string(),
            i if i < KINDS => Msg::KINDS[i].to_string(),
            i => format!("{} timer", TimerKind::ALL[i - KINDS].name()),
        };
        let mut by_source: Vec<(String, u64)> = (0..SOURCES)
            .filter(|&i| self.by_source[i] > 0)
            .map(|i| (name(i), self.by_source[i]))
            .collect();
        by_source.sort_by_key(|(_, n)| Reverse(*n));
        Upkeep {
            of: self.of,
            events: self.events,
            by_source,
            stretches: self.stretches,
            stretch_ms: self.stretch_ms,
            longest_ms: self.longest_ms,
            in_long_stretches: self.in_long,
            skipped: 0,
            reports_sent: self.reports_sent,
            acks_when_sent: self.acks,
            pings_answered: self.pings,
            reports_answered: self.reports_answered,
            claims_taken: self.claims,
            answers_taken: self.answers,
        }
    }
}

impl Sim<'_> {
    /// What `ev`, about to be handled, is for the speed line.
    pub(super) fn seen(&self, ev: &Ev) -> Seen {
        if self.finished || self.now < self.submitted_at {
            return Seen::Neither;
        }
        match ev {
            Ev::Deliver { msg, .. } | Ev::Arrived { msg, .. } | Ev::Served { msg, .. } => {
                match &**msg {
                    Msg::Beat(_) | Msg::Swim(_) | Msg::Claimed { .. } => Seen::Upkeep(msg.kind()),
                    _ => Seen::Change,
                }
            }
            Ev::QuietSwim { .. } => Seen::Upkeep(Msg::Swim(Vec::new()).kind()),
            Ev::Timer { node, gen } | Ev::Wake { node, gen } => {
                let live = match ev {
                    Ev::Timer { .. } => self.timer_armed(*node, *gen),
                    _ => self.nodes[*node as usize].gen == *gen,
                };
                let nd = &self.nodes[*node as usize];
                let peer = match &nd.peer {
                    Some(p) if live => p,
                    // Handled as nothing: the node is down, or its timer moved.
                    _ => return Seen::Upkeep(SUPERSEDED),
                };
                if nd.promised == Some(self.now) {
                    return Seen::Upkeep(REPORTED);
                }
                let due = peer.timers_due(self.now);
                match due.first() {
                    None => Seen::Upkeep(SUPERSEDED),
                    Some(t) if due.only_upkeep() => Seen::Upkeep(KINDS + t as usize),
                    Some(_) => Seen::Change,
                }
            }
            Ev::MeshCheck | Ev::Resume(_) => Seen::Neither,
            _ => Seen::Change,
        }
    }
}
