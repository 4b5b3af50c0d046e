//! The swarm: its events (connections, dialling, identify, gossip, pings), known peers redialled, and the request-response exchange with other nodes.

use std::collections::HashMap;
use std::time::Instant;

use libp2p::identify;
use libp2p::multiaddr::Protocol;
use libp2p::request_response::{self, OutboundRequestId};
use libp2p::swarm::SwarmEvent;
use libp2p::{ping, Multiaddr, PeerId};
use mesh_protocol::mesh::{Msg, NodeId};
use mesh_protocol::observe::Latency;
use mesh_protocol::wire::{Request, Response};
use tokio::sync::oneshot;

use super::refusals::{Answer, RequestError};
use super::{swim, Node, NodeError, NodeOptions};
use crate::keys;
use crate::net::{self, BehaviourEvent};

/// Kinds of throttled lines (see `Node::throttled`).
const THROTTLE_FILES: usize = 0;
const THROTTLE_REFUSED: usize = 100;

/// A request's answer, as its asker gets it.
/// Requests to other nodes waiting for their answers.
#[derive(Default)]
pub(super) struct Outbound {
    pending: HashMap<OutboundRequestId, Option<oneshot::Sender<Answer>>>,
    /// When each request to another node left, for its round trip.
    sent_at: HashMap<OutboundRequestId, Instant>,
}

impl Node {
    pub(super) fn on_swarm(
        &mut self,
        ev: SwarmEvent<BehaviourEvent>,
        opts: &NodeOptions,
    ) -> Result<(), NodeError> {
        match ev {
            SwarmEvent::NewListenAddr { address, .. } => {
                let id = *self.net.swarm.local_peer_id();
                self.say(&format!("mesh node {id} listening on {address}"));
                if self.net.listen_addrs.is_empty() {
                    if let Some(port) = net::tcp_port(&address) {
                        self.remember_port(port);
                    }
                }
                self.bind_swim(&address, opts);
                self.net.listen_addrs.push(address);
                self.update_address();
            }
            SwarmEvent::ConnectionEstablished {
                peer_id, endpoint, ..
            } => {
                self.net.dialing.remove(&peer_id);
                let node = keys::node_id(&peer_id);
                self.net.peers.insert(node, peer_id);
                // Named by its peer id once it is gone too (a node that
                // dialed this one was never dialed, so never named).
                self.net
                    .labels
                    .entry(node)
                    .or_insert_with(|| peer_id.to_string());
                let seed =
                    endpoint.is_dialer() && self.reached(peer_id, endpoint.get_remote_address());
                let now = self.now();
                if endpoint.is_dialer() && self.peer.address_of(node).is_none() {
                    // A node this one dialled to join (an address the user
                    // gave, a peer it knew): membership announces itself there.
                    let mut addr = endpoint.get_remote_address().clone();
                    if !matches!(addr.iter().last(), Some(Protocol::P2p(_))) {
                        addr.push(Protocol::P2p(peer_id));
                    }
                    self.peer
                        .introduce(now, node, peer_id.to_string(), vec![addr.to_string()]);
                } else if seed {
                    // Reached at last, but known already from another
                    // member's gossip (its first handshake failed while the
                    // whole mesh restarted): it is still the node this one
                    // joins through. Not told so, a `mesh join` node waited
                    // for its answer for ever, and as the lowest id it was
                    // the one to elect: no coordinator anywhere.
                    self.peer.seed_reached(now, node);
                }
            }
            SwarmEvent::ConnectionClosed {
                peer_id,
                num_established: 0,
                ..
            } => {
                // Membership decides who is dead (beats stop); the connection
                // is redialled from the next beat if the node is still there.
                self.net.peers.remove(&keys::node_id(&peer_id));
            }
            SwarmEvent::OutgoingConnectionError { peer_id, error, .. } => {
                if let Some(p) = peer_id {
                    self.net.dialing.remove(&p);
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
                if let Err(e) = net::check_identified(&mut self.net.swarm, peer_id, &info) {
                    self.say(&format!("refused {e}"));
                    if !self.net.reach.joined() {
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
                self.peer
                    .record_latency(Latency::MessageRtt, rtt.as_micros() as u64);
            }
            #[cfg(feature = "mdns")]
            SwarmEvent::Behaviour(BehaviourEvent::Mdns(libp2p::mdns::Event::Discovered(found))) => {
                for (peer, addr) in found {
                    if !self.net.swarm.is_connected(&peer) && self.net.dialing.insert(peer) {
                        let opts = libp2p::swarm::dial_opts::DialOpts::peer_id(peer)
                            .addresses(vec![addr])
                            .build();
                        if self.net.swarm.dial(opts).is_err() {
                            self.net.dialing.remove(&peer);
                        }
                    }
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// Says `line` unless a line of its kind was said lately.
    pub(super) fn throttled(&mut self, kind: usize, line: &str) {
        if let Some(text) = self.user.throttle.line(kind, Instant::now(), line) {
            self.say(&text);
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
                self.user.files.limit
            );
            self.throttled(THROTTLE_FILES, &line);
        } else {
            tracing::info!("cannot take a connection: {error}");
        }
    }

    fn update_address(&mut self) {
        let id = *self.net.swarm.local_peer_id();
        let addrs: Vec<String> = self
            .net
            .listen_addrs
            .iter()
            .filter(|a| {
                // 0.0.0.0 is where we listen, not where anyone can reach us.
                !a.iter()
                    .any(|p| matches!(p, Protocol::Ip4(ip) if ip.is_unspecified()))
            })
            .map(|a| a.clone().with(Protocol::P2p(id)).to_string())
            .collect();
        let now = self.now();
        self.peer.set_address(now, id.to_string(), addrs, self.life);
    }

    /// Membership packets are taken on the UDP port of the same number as
    /// the first TCP port this node listens on (so a member's address says
    /// both), on the IP it was asked to listen on.
    fn bind_swim(&mut self, address: &Multiaddr, opts: &NodeOptions) {
        if self.net.swim.is_some() {
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
            self.net.swim_cipher.clone(),
            seed.as_bytes(),
            self.handle.clone(),
        ) {
            Ok(s) => self.net.swim = Some(s),
            Err(e) => self.say(&format!(
                "cannot take membership packets on UDP {bind}: {e}; \
                 members reach this node only over its connections"
            )),
        }
    }

    pub(super) fn label_of(&self, n: NodeId) -> String {
        if n == self.me {
            return self.net.me_label.clone();
        }
        self.net
            .peers
            .get(&n)
            .map(|p| p.to_string())
            .or_else(|| self.peer.address_of(n).map(|(l, _)| l.to_owned()))
            .filter(|l| !l.is_empty())
            .or_else(|| self.net.labels.get(&n).cloned())
            .unwrap_or_else(|| n.to_string())
    }

    pub(super) fn send(
        &mut self,
        to: NodeId,
        req: Request,
        reply: Option<oneshot::Sender<Answer>>,
    ) {
        let Some(pid) = self
            .net
            .peers
            .get(&to)
            .copied()
            .or_else(|| self.dial_member(to))
        else {
            if let Some(r) = reply {
                let _ = r.send(Err(RequestError::NotMember(to)));
            }
            return;
        };
        let id = self.net.swarm.behaviour_mut().rr.send_request(&pid, req);
        self.sent(id);
        self.net.outbound.pending.insert(id, reply);
    }

    /// A message for a peer's engine, on this node's stream to it: what a
    /// step has for one peer goes as one frame. A beat goes as a packet,
    /// as membership's do, when it fits one (see `swim.rs`): a coordinator
    /// then keeps no connection open to an idle member.
    pub(super) fn send_msg(&mut self, to: NodeId, msg: Msg) {
        if matches!(msg, Msg::Beat(_)) {
            let at = self
                .peer
                .address_of(to)
                .and_then(|(_, addrs)| swim::udp_target(addrs));
            if let (Some(s), Some(at)) = (&mut self.net.swim, at) {
                if s.send_msg(at, self.me, &msg) {
                    self.recorder.counters.messages_sent += 1;
                    return;
                }
            }
        }
        let pid = match self.net.peers.get(&to).copied() {
            Some(pid) => pid,
            None => match self.dial_member(to) {
                Some(pid) => pid,
                None => return,
            },
        };
        self.recorder.counters.messages_sent += 1;
        self.net.links.send(to, pid, msg);
    }

    /// Connects to a member this node has no connection to, at the
    /// addresses membership knows for it; its peer id, when it has one.
    /// Messages for it wait in its link until the connection is up.
    pub(super) fn dial_member(&mut self, to: NodeId) -> Option<PeerId> {
        let (label, addrs) = self.peer.address_of(to)?;
        let pid: PeerId = label.parse().ok()?;
        let addrs: Vec<Multiaddr> = addrs.iter().filter_map(|a| a.parse().ok()).collect();
        if addrs.is_empty() {
            return None;
        }
        self.net.labels.entry(to).or_insert_with(|| pid.to_string());
        if !self.net.swarm.is_connected(&pid) && !self.net.dialing.contains(&pid) {
            let opts = libp2p::swarm::dial_opts::DialOpts::peer_id(pid)
                .addresses(addrs)
                .build();
            if self.net.swarm.dial(opts).is_ok() {
                self.net.dialing.insert(pid);
            }
        }
        Some(pid)
    }

    fn sent(&mut self, id: OutboundRequestId) {
        self.recorder.counters.messages_sent += 1;
        self.net.outbound.sent_at.insert(id, Instant::now());
    }

    fn on_rr(&mut self, ev: request_response::Event<Request, Response>) {
        match ev {
            request_response::Event::Message { peer, message, .. } => match message {
                request_response::Message::Request {
                    request, channel, ..
                } => {
                    let from = keys::node_id(&peer);
                    self.net.peers.insert(from, peer);
                    self.on_request(request, channel);
                }
                request_response::Message::Response {
                    request_id,
                    response,
                } => {
                    if let Some(at) = self.net.outbound.sent_at.remove(&request_id) {
                        let us = at.elapsed().as_micros() as u64;
                        self.peer.record_latency(Latency::MessageRtt, us);
                    }
                    if let Some(Some(reply)) = self.net.outbound.pending.remove(&request_id) {
                        let _ = reply.send(Ok(response));
                    }
                }
            },
            request_response::Event::OutboundFailure {
                request_id, error, ..
            } => {
                self.net.outbound.sent_at.remove(&request_id);
                if let Some(Some(reply)) = self.net.outbound.pending.remove(&request_id) {
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
