//! The swarm: its events (connections, dialling, identify, gossip, pings), known peers redialled, and the request-response exchange with other nodes.

use std::collections::HashMap;
use std::time::Instant;

use libp2p::identify;
use libp2p::multiaddr::Protocol;
use libp2p::request_response::{self, OutboundRequestId};
use libp2p::swarm::SwarmEvent;
use libp2p::{ping, Multiaddr, PeerId};
use mesh_protocol::mesh::{Msg, NodeId};
use mesh_protocol::wire::{Request, Response};
use tokio::sync::oneshot;

use super::{swim, Members, Net, NetOut};
use crate::keys;
use crate::mesh_node::refusals::{Answer, RequestError};
use crate::mesh_node::{NodeError, NodeOptions};
use crate::net::{self, BehaviourEvent};

/// Kinds of throttled lines (see `Net::throttled`).
const THROTTLE_FILES: usize = 0;
const THROTTLE_REFUSED: usize = 100;

/// Requests to other nodes waiting for their answers.
#[derive(Default)]
pub(super) struct Outbound {
    pending: HashMap<OutboundRequestId, Option<oneshot::Sender<Answer>>>,
    /// When each request to another node left, for its round trip.
    sent_at: HashMap<OutboundRequestId, Instant>,
}

impl Net {
    /// Acts on one of the swarm's events; what the peer, the store or the
    /// user must hear of it waits in [`Net::poll`].
    pub(in crate::mesh_node) fn on_swarm(
        &mut self,
        ev: SwarmEvent<BehaviourEvent>,
        opts: &NodeOptions,
        members: &dyn Members,
    ) -> Result<(), NodeError> {
        match ev {
            SwarmEvent::NewListenAddr { address, .. } => {
                let id = *self.swarm.local_peer_id();
                self.say(format!("mesh node {id} listening on {address}"));
                if self.listen_addrs.is_empty() {
                    if let Some(port) = net::tcp_port(&address) {
                        self.remember_port(port);
                    }
                }
                self.bind_swim(&address, opts);
                self.listen_addrs.push(address);
                self.update_address();
            }
            SwarmEvent::ConnectionEstablished {
                peer_id, endpoint, ..
            } => {
                self.dialing.remove(&peer_id);
                let node = keys::node_id(&peer_id);
                self.peers.insert(node, peer_id);
                // Named by its peer id once it is gone too (a node that
                // dialed this one was never dialed, so never named).
                self.labels
                    .entry(node)
                    .or_insert_with(|| peer_id.to_string());
                let seed =
                    endpoint.is_dialer() && self.reached(peer_id, endpoint.get_remote_address());
                if endpoint.is_dialer() && members.address_of(node).is_none() {
                    // A node this one dialled to join (an address the user
                    // gave, a peer it knew): membership announces itself there.
                    let mut addr = endpoint.get_remote_address().clone();
                    if !matches!(addr.iter().last(), Some(Protocol::P2p(_))) {
                        addr.push(Protocol::P2p(peer_id));
                    }
                    self.out.push_back(NetOut::Introduce {
                        node,
                        label: peer_id.to_string(),
                        addrs: vec![addr.to_string()],
                    });
                } else if seed {
                    // Reached at last, but known already from another
                    // member's gossip (its first handshake failed while the
                    // whole mesh restarted): it is still the node this one
                    // joins through. Not told so, a `mesh join` node waited
                    // for its answer for ever, and as the lowest id it was
                    // the one to elect: no coordinator anywhere.
                    self.out.push_back(NetOut::SeedReached(node));
                }
            }
            SwarmEvent::ConnectionClosed {
                peer_id,
                num_established: 0,
                ..
            } => {
                // Membership decides who is dead (beats stop); the connection
                // is redialled from the next beat if the node is still there.
                self.peers.remove(&keys::node_id(&peer_id));
            }
            SwarmEvent::OutgoingConnectionError { peer_id, error, .. } => {
                if let Some(p) = peer_id {
                    self.dialing.remove(&p);
                }
                self.dial_failed(&error)?;
            }
            SwarmEvent::IncomingConnectionError {
                send_back_addr,
                error,
                ..
            } => {
                // Whoever runs this node hears of a node of another mesh
                // key or version trying to join it, as that node does.
                if let Some((fault, why)) = net::listen_fault(&error) {
                    let line = format!("refused a connection from {send_back_addr}: {why}");
                    self.throttled(THROTTLE_REFUSED + fault as usize, &line);
                }
            }
            SwarmEvent::ListenerError { error, .. } => self.listener_error(&error),
            SwarmEvent::Behaviour(BehaviourEvent::Identify(identify::Event::Received {
                peer_id,
                info,
                ..
            })) => {
                if let Err(e) = net::check_identified(&mut self.swarm, peer_id, &info) {
                    self.say(format!("refused {e}"));
                    if !self.reach.joined() {
                        return Err(join_failed(opts, e));
                    }
                }
            }
            SwarmEvent::Behaviour(BehaviourEvent::Rr(ev)) => self.on_rr(ev),
            // Messages to peers no longer have answers to time; the
            // connection's own pings say what a round trip costs.
            SwarmEvent::Behaviour(BehaviourEvent::Ping(ping::Event {
                result: Ok(rtt), ..
            })) => {
                self.out.push_back(NetOut::Rtt(rtt.as_micros() as u64));
            }
            #[cfg(feature = "mdns")]
            SwarmEvent::Behaviour(BehaviourEvent::Mdns(libp2p::mdns::Event::Discovered(found))) => {
                for (peer, addr) in found {
                    if !self.swarm.is_connected(&peer) && self.dialing.insert(peer) {
                        let opts = libp2p::swarm::dial_opts::DialOpts::peer_id(peer)
                            .addresses(vec![addr])
                            .build();
                        if self.swarm.dial(opts).is_err() {
                            self.dialing.remove(&peer);
                        }
                    }
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// Says `line` unless a line of its kind was said lately.
    fn throttled(&mut self, kind: usize, line: &str) {
        if let Some(text) = self.throttle.line(kind, Instant::now(), line) {
            self.say(text);
        }
    }

    /// A listener could not take a connection. Out of descriptors, the
    /// node says so (rate-limited): the connection waits in the kernel's
    /// queue and its node sees a handshake that does not answer.
    fn listener_error(&mut self, error: &std::io::Error) {
        if crate::limits::out_of_files(error) {
            let in_use = crate::limits::open_files_in_use().unwrap_or(0);
            let line = format!(
                "cannot take a connection: out of open files ({in_use} open, limit {}); \
                 the node that tried will try again. Raise the limit (`ulimit -Hn`, or \
                 LimitNOFILE= in a systemd unit)",
                self.files_limit
            );
            self.throttled(THROTTLE_FILES, &line);
        } else {
            tracing::info!("cannot take a connection: {error}");
        }
    }

    fn update_address(&mut self) {
        let id = *self.swarm.local_peer_id();
        let addrs: Vec<String> = self
            .listen_addrs
            .iter()
            .filter(|a| {
                // 0.0.0.0 is where we listen, not where anyone can reach us.
                !a.iter()
                    .any(|p| matches!(p, Protocol::Ip4(ip) if ip.is_unspecified()))
            })
            .map(|a| a.clone().with(Protocol::P2p(id)).to_string())
            .collect();
        self.out.push_back(NetOut::Address {
            label: id.to_string(),
            addrs,
        });
    }

    /// Membership packets are taken on the UDP port of the same number as
    /// the first TCP port this node listens on (so a member's address says
    /// both), on the IP it was asked to listen on.
    fn bind_swim(&mut self, address: &Multiaddr, opts: &NodeOptions) {
        if self.swim.is_some() {
            return;
        }
        let Some(at) = swim::udp_target(&[address.to_string()]) else {
            return;
        };
        let ip = opts
            .listen
            .iter()
            .find_map(|a| swim::udp_target(&[a.to_string()]))
            .map_or(at.ip(), |l| l.ip());
        let bind = std::net::SocketAddr::new(ip, at.port());
        let seed = format!("{} {} {}", self.me, self.life, std::process::id());
        match swim::SwimSocket::bind(
            bind,
            self.swim_cipher.clone(),
            seed.as_bytes(),
            self.handle.clone(),
        ) {
            Ok(s) => self.swim = Some(s),
            Err(e) => self.say(format!(
                "cannot take membership packets on UDP {bind}: {e}; \
                 members reach this node only over its connections"
            )),
        }
    }

    /// How users know node `n`: its peer id.
    pub(in crate::mesh_node) fn label_of(&self, n: NodeId, members: &dyn Members) -> String {
        if n == self.me {
            return self.me_label.clone();
        }
        self.peers
            .get(&n)
            .map(|p| p.to_string())
            .or_else(|| members.address_of(n).map(|(l, _)| l.to_owned()))
            .filter(|l| !l.is_empty())
            .or_else(|| self.labels.get(&n).cloned())
            .unwrap_or_else(|| n.to_string())
    }

    /// Sends `req` to node `to`; its answer (or why there is none) goes
    /// to `reply`.
    pub(in crate::mesh_node) fn send(
        &mut self,
        to: NodeId,
        req: Request,
        reply: Option<oneshot::Sender<Answer>>,
        members: &dyn Members,
    ) {
        let Some(pid) = self
            .peers
            .get(&to)
            .copied()
            .or_else(|| self.dial_member(to, members))
        else {
            if let Some(r) = reply {
                let _ = r.send(Err(RequestError::NotMember(to)));
            }
            return;
        };
        let id = self.swarm.behaviour_mut().rr.send_request(&pid, req);
        self.request_sent(id);
        self.outbound.pending.insert(id, reply);
    }

    /// A message for a peer's engine, on this node's stream to it: what a
    /// step has for one peer goes as one frame. A beat goes as a packet,
    /// as membership's do, when it fits one (see `swim.rs`): a coordinator
    /// then keeps no connection open to an idle member.
    pub(in crate::mesh_node) fn send_msg(&mut self, to: NodeId, msg: Msg, members: &dyn Members) {
        if matches!(msg, Msg::Beat(_)) {
            let at = members
                .address_of(to)
                .and_then(|(_, addrs)| swim::udp_target(addrs));
            if let (Some(s), Some(at)) = (&mut self.swim, at) {
                if s.send_msg(at, self.me, &msg) {
                    self.sent += 1;
                    return;
                }
            }
        }
        let pid = match self.peers.get(&to).copied() {
            Some(pid) => pid,
            None => match self.dial_member(to, members) {
                Some(pid) => pid,
                None => return,
            },
        };
        self.sent += 1;
        self.links.send(to, pid, msg);
    }

    /// Connects to a member this node has no connection to, at the
    /// addresses membership knows for it; its peer id, when it has one.
    /// Messages for it wait in its link until the connection is up.
    fn dial_member(&mut self, to: NodeId, members: &dyn Members) -> Option<PeerId> {
        let (label, addrs) = members.address_of(to)?;
        let pid: PeerId = label.parse().ok()?;
        let addrs: Vec<Multiaddr> = addrs.iter().filter_map(|a| a.parse().ok()).collect();
        if addrs.is_empty() {
            return None;
        }
        self.labels.entry(to).or_insert_with(|| pid.to_string());
        if !self.swarm.is_connected(&pid) && !self.dialing.contains(&pid) {
            let opts = libp2p::swarm::dial_opts::DialOpts::peer_id(pid)
                .addresses(addrs)
                .build();
            if self.swarm.dial(opts).is_ok() {
                self.dialing.insert(pid);
            }
        }
        Some(pid)
    }

    /// The peer id of node `to`, for a transfer, dialling it if need be.
    pub(in crate::mesh_node) fn peer_of(
        &mut self,
        to: NodeId,
        members: &dyn Members,
    ) -> Option<PeerId> {
        self.peers
            .get(&to)
            .copied()
            .or_else(|| self.dial_member(to, members))
    }

    fn request_sent(&mut self, id: OutboundRequestId) {
        self.sent += 1;
        self.outbound.sent_at.insert(id, Instant::now());
    }

    fn on_rr(&mut self, ev: request_response::Event<Request, Response>) {
        match ev {
            request_response::Event::Message { peer, message, .. } => match message {
                request_response::Message::Request {
                    request, channel, ..
                } => {
                    let from = keys::node_id(&peer);
                    self.peers.insert(from, peer);
                    self.out.push_back(NetOut::Request(request, channel));
                }
                request_response::Message::Response {
                    request_id,
                    response,
                } => {
                    if let Some(at) = self.outbound.sent_at.remove(&request_id) {
                        let us = at.elapsed().as_micros() as u64;
                        self.out.push_back(NetOut::Rtt(us));
                    }
                    if let Some(Some(reply)) = self.outbound.pending.remove(&request_id) {
                        let _ = reply.send(Ok(response));
                    }
                }
            },
            request_response::Event::OutboundFailure {
                request_id, error, ..
            } => {
                self.outbound.sent_at.remove(&request_id);
                if let Some(Some(reply)) = self.outbound.pending.remove(&request_id) {
                    let _ = reply.send(Err(error.into()));
                }
            }
            _ => {}
        }
    }
}

/// The node could not join the mesh it was pointed at.
fn join_failed(opts: &NodeOptions, why: String) -> NodeError {
    let addr = opts
        .join
        .iter()
        .map(|a| a.to_string())
        .collect::<Vec<_>>()
        .join(",");
    NodeError::Join { addr, why }
}
