//! The node's net room: the swarm, the nodes it knows, its streams to their engines, membership packets and how it reaches its mesh, behind [`Net`]'s methods.
//!
//! The room owns its state; the loop reaches it only through those
//! methods. It reads membership through [`Members`] (the peer's address
//! book, read-only) and says what the loop must do with the peer, the
//! store or the user as [`NetOut`] values, taken with [`Net::poll`] as
//! the peer's actions are: the room never touches the `Peer`.

mod links;
mod reach;
mod swarm;
mod swim;

use std::collections::{HashMap, HashSet, VecDeque};

use libp2p::request_response::ResponseChannel;
use libp2p::swarm::SwarmEvent;
use libp2p::{Multiaddr, PeerId, Swarm};
use mesh_protocol::mesh::{Msg, NodeId};
use mesh_protocol::wire::{Request, Response};
use mesh_store::Write;

use super::LoopHandle;
use crate::net::{Behaviour, BehaviourEvent};
pub(super) use links::accept_links;
pub(super) use reach::{reuse_port, Reach, REACH_TICK};
pub(super) use swim::cipher as swim_cipher;

/// What the net room reads of membership: who is a member, and where.
pub(super) trait Members {
    /// A member's label (its peer id) and addresses, if it is one.
    fn address_of(&self, n: NodeId) -> Option<(&str, &[String])>;
    /// Every member's addresses.
    fn addresses(&self) -> Vec<String>;
}

/// What the net room wants done outside it, in the order it arose.
pub(super) enum NetOut {
    /// A line for the person running the node.
    Say(String),
    /// Written to the store and flushed; `what` names it should that fail.
    Keep { write: Write, what: &'static str },
    /// A node this one dialled to join answered: membership announces
    /// this node there.
    Introduce {
        node: NodeId,
        label: String,
        addrs: Vec<String>,
    },
    /// A join address's node, known already from gossip, was reached.
    SeedReached(NodeId),
    /// A round trip to another node, in microseconds.
    Rtt(u64),
    /// Where this node can be reached now.
    Address { label: String, addrs: Vec<String> },
    /// Another node's request, for the loop to answer (see `inbound.rs`).
    Request(Request, ResponseChannel<Response>),
}

/// What the net room is made of when the node opens.
pub(super) struct NetParts {
    pub(super) swarm: Swarm<Behaviour>,
    pub(super) streams: libp2p_stream::Control,
    pub(super) swim_cipher: chacha20poly1305::XChaCha20Poly1305,
    pub(super) reach: Reach,
    pub(super) me: NodeId,
    pub(super) life: u64,
    pub(super) handle: LoopHandle,
    /// This process's open-file limit, said when connections run out of it.
    pub(super) files_limit: u64,
    pub(super) throttle: crate::limits::Throttle,
}

/// A node's place in the network: its swarm, the nodes it knows and how
/// it reaches them.
pub(super) struct Net {
    swarm: Swarm<Behaviour>,
    me: NodeId,
    life: u64,
    handle: LoopHandle,
    /// This node's peer id as text, said with every task it runs (base58
    /// each time was a percent of a thin call's cost).
    me_label: String,
    peers: HashMap<NodeId, PeerId>,
    dialing: HashSet<PeerId>,
    /// Peer ids by node, remembered from beats so a node that is gone still has a name.
    labels: HashMap<NodeId, String>,
    /// Membership packets: the socket, once this node listens, and their key.
    swim: Option<swim::SwimSocket>,
    swim_cipher: chacha20poly1305::XChaCha20Poly1305,
    /// Requests to other nodes waiting for their answers.
    outbound: swarm::Outbound,
    /// This node's streams to other nodes' engines.
    links: links::Links,
    listen_addrs: Vec<Multiaddr>,
    /// The join addresses and remembered members, tried until they answer.
    reach: Reach,
    files_limit: u64,
    /// Lines about what others do to this node (connections refused), at
    /// most one of a kind so often.
    throttle: crate::limits::Throttle,
    /// Messages and requests sent, for the node's counters.
    sent: u64,
    out: VecDeque<NetOut>,
}

impl Net {
    pub(super) fn new(p: NetParts) -> Net {
        Net {
            me_label: p.swarm.local_peer_id().to_string(),
            swarm: p.swarm,
            me: p.me,
            life: p.life,
            handle: p.handle,
            peers: HashMap::new(),
            dialing: HashSet::new(),
            labels: HashMap::new(),
            swim: None,
            swim_cipher: p.swim_cipher,
            outbound: swarm::Outbound::default(),
            links: links::Links::new(p.streams),
            listen_addrs: Vec::new(),
            reach: p.reach,
            files_limit: p.files_limit,
            throttle: p.throttle,
            sent: 0,
            out: VecDeque::new(),
        }
    }

    /// The next thing the room wants done, oldest first.
    pub(super) fn poll(&mut self) -> Option<NetOut> {
        self.out.pop_front()
    }

    /// The swarm's next event, for the loop's `select!` (cancel-safe: an
    /// event is taken only when the future completes).
    pub(super) async fn next_event(&mut self) -> SwarmEvent<BehaviourEvent> {
        use futures::StreamExt;
        self.swarm.select_next_some().await
    }

    /// This node's peer id as text.
    pub(super) fn me_label(&self) -> &str {
        &self.me_label
    }

    /// Whether this node remembers members to rejoin through.
    pub(super) fn remembers_any(&self) -> bool {
        self.reach.remembers_any()
    }

    /// Messages and requests this node sent so far.
    pub(super) fn sent(&self) -> u64 {
        self.sent
    }

    /// `peer` (node `from`) spoke to this node: it is reached by that id.
    pub(super) fn heard(&mut self, from: NodeId, peer: PeerId) {
        self.peers.insert(from, peer);
    }

    /// A member is gone: its stream's writer goes with it, and a node
    /// that comes back gets a new one with the next message.
    pub(super) fn forget(&mut self, n: NodeId) {
        self.links.forget(n);
    }

    /// A membership packet for `to`, at its addresses `addrs`: as a packet
    /// when this node has its socket and `to` a port, else on a connection
    /// if there is one.
    pub(super) fn swim(
        &mut self,
        to: NodeId,
        addrs: &[String],
        data: Vec<u8>,
        members: &dyn Members,
    ) {
        match (&mut self.swim, swim::udp_target(addrs)) {
            (Some(s), Some(addr)) => s.send(addr, &data),
            _ => {
                if self.peers.contains_key(&to) {
                    self.send_msg(to, Msg::Swim(data), members);
                }
            }
        }
    }

    /// Answers another node's request; the answer to one that has gone
    /// meanwhile is dropped, as it would be on the way.
    pub(super) fn respond(&mut self, channel: ResponseChannel<Response>, resp: Response) {
        let _ = self.swarm.behaviour_mut().rr.send_response(channel, resp);
    }

    fn say(&mut self, line: String) {
        self.out.push_back(NetOut::Say(line));
    }
}
