//! What a step produces, shared by every role: actions for the driver, messages a node sends itself, and counters and latencies for observers.
//!
//! Every role writes here and nowhere else, so the order of what the
//! driver carries out is the order in which the roles asked for it.

use std::collections::VecDeque;

use rustc_hash::FxHashMap;

use super::super::msg::*;
use super::action::{Action, PeerEvent, Persist};
use crate::engine::Millis;
use crate::farm::TaskRef;
use crate::observe::Latencies;

/// Counters for the simulator and `mesh status`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Messages this node sent, to itself included.
    pub messages: u64,
    /// Membership packets sent, and their bytes.
    pub swim_packets: u64,
    /// The bytes of those packets.
    pub swim_bytes: u64,
    /// Steals this node asked of a victim.
    pub steals_asked: u64,
    /// Steals answered with tasks that this node took.
    pub steals_won: u64,
    /// Tasks this node took by its steals won.
    pub tasks_stolen: u64,
    /// Tasks this node gave up to thieves.
    pub tasks_given: u64,
    /// SWIM's timers that would do nothing (a gossip tick with nothing
    /// to tell, the indirect probe of a member that answered) fired with
    /// whatever came to the node next, not with a wake of their own.
    pub quiet_timers: u64,
}

/// What a peer measures for its observers.
#[derive(Default)]
pub(super) struct Observed {
    pub(super) latency: Latencies,
    /// When each queued task arrived here, and when each run started
    /// (until its result is acknowledged).
    pub(super) arrived: FxHashMap<(FarmId, TaskRef), Millis>,
    pub(super) started: FxHashMap<(FarmId, TaskRef), Millis>,
    pub(super) failovers: u64,
}

pub(super) struct Out {
    /// This node: a message to itself goes to the inbox, not the network.
    id: NodeId,
    pub(super) actions: VecDeque<Action>,
    pub(super) inbox: VecDeque<(NodeId, Msg)>,
    pub(super) stats: Stats,
    /// Latencies, when the driver asks for them (`Peer::observe`): the
    /// simulator's thousand peers do without.
    pub(super) observed: Option<Box<Observed>>,
    /// The driver writes persists down (`Peer::keep_no_store` clears
    /// it): the simulator's nodes that never restart read nothing back,
    /// and building what they would write was 3% of a 1,000-node run.
    keeps: bool,
}

impl Out {
    pub(super) fn new(id: NodeId) -> Out {
        Out {
            id,
            actions: VecDeque::new(),
            inbox: VecDeque::new(),
            stats: Stats::default(),
            observed: None,
            keeps: true,
        }
    }

    /// See [`Out::keeps`].
    pub(super) fn keep_nothing(&mut self) {
        self.keeps = false;
    }

    /// Whether persists go to the driver: where not, what only a persist
    /// would carry need not be built.
    pub(super) const fn persists(&self) -> bool {
        self.keeps
    }

    pub(super) fn send(&mut self, to: NodeId, msg: Msg) {
        self.stats.messages += 1;
        if to == self.id {
            self.inbox.push_back((to, msg));
        } else {
            self.actions.push_back(Action::Send { to, msg });
        }
    }

    pub(super) fn push(&mut self, action: Action) {
        self.actions.push_back(action);
    }

    /// A membership packet in closed form, counted as any packet.
    pub(super) fn quiet_swim(&mut self, q: super::action::QuietSwim) {
        self.stats.swim_packets += 1;
        self.stats.swim_bytes += q.len as u64;
        self.actions.push_back(Action::QuietSwim(q));
    }

    pub(super) fn persist(&mut self, p: Persist) {
        if self.keeps {
            self.actions.push_back(Action::Persist(p));
        }
    }

    pub(super) fn emit(&mut self, ev: PeerEvent) {
        self.actions.push_back(Action::Emit(ev));
    }

    /// Entries of a farm this node holds, made durable (see [`Persist::Entries`]).
    pub(super) fn persist_entries(&mut self, farm: FarmId, entries: Vec<Entry>, records: bool) {
        if !entries.is_empty() {
            self.persist(Persist::Entries {
                farm,
                entries,
                records,
            });
        }
    }

    /// The latencies' record, when the driver asked for one.
    pub(super) fn observed(&mut self) -> Option<&mut Observed> {
        self.observed.as_deref_mut()
    }
}
