//! The swarm: its events (connections, dialling, identify, gossip, pings), known peers redialled, and the request-response exchange with other nodes.

use std::collections::HashMap;
use std::time::Instant;

use libp2p::identify;
use libp2p::multiaddr::Protocol;
use libp2p::request_response::{self, OutboundRequestId, ResponseChannel};
use libp2p::swarm::SwarmEvent;
use libp2p::{ping, Multiaddr, PeerId};
use mesh_protocol::mesh::{Msg, NodeId};
use mesh_protocol::observe::Latency;
use mesh_protocol::wire::{Request, Response};
use mesh_store::mesh::NODE_KEY;
use mesh_store::{Store, Write};
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot};

use super::{swim, Cmd, Node, NodeError, NodeOptions};
use crate::keys;
use crate::net::{self, BehaviourEvent};

/// The peers this node knew, by address, so a restarted node finds the mesh again.
pub(super) const META_PEERS: &str = "peers";

/// A `mesh join` that cannot reach its peer tries again, waiting at most this long between tries.
const JOIN_RETRY_MAX_S: u64 = 30;

/// The addresses of the peers this node has known, kept so that a
/// restarted node rejoins them.
#[derive(Default, Serialize, Deserialize)]
pub(super) struct KnownPeers(pub(super) Vec<String>);

/// Requests to other nodes waiting for their answers.
#[derive(Default)]
pub(super) struct Outbound {
    pending: HashMap<OutboundRequestId, Option<oneshot::Sender<Result<Response, String>>>>,
    /// When each request to another node left, for its round trip.
    sent_at: HashMap<OutboundRequestId, Instant>,
}

impl Node {
    pub(super) fn on_swarm(
        &mut self,
        ev: SwarmEvent<BehaviourEvent>,
        opts: &NodeOptions,
        joined: &mut bool,
    ) -> Result<(), NodeError> {
        match ev {
            SwarmEvent::NewListenAddr { address, .. } => {
                let id = *self.swarm.local_peer_id();
                self.say(&format!("mesh node {id} listening on {address}"));
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
                *joined = true;
                if endpoint.is_dialer() && self.peer.address_of(node).is_none() {
                    // A node this one dialled to join (an address the user
                    // gave, a peer it knew): membership announces itself there.
                    let mut addr = endpoint.get_remote_address().clone();
                    if !matches!(addr.iter().last(), Some(Protocol::P2p(_))) {
                        addr.push(Protocol::P2p(peer_id));
                    }
                    let now = self.now();
                    self.peer
                        .introduce(now, node, peer_id.to_string(), vec![addr.to_string()]);
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
                let why = net::explain_dial_error(&error);
                if !*joined {
                    if why.contains("mesh.key") {
                        return Err(join_failed(opts, why));
                    }
                    if !opts.join.is_empty() && !self.redial_pending {
                        // The peer may not be up yet (a cluster's first node
                        // starting late): try again, waiting longer each time.
                        self.redial_pending = true;
                        let wait = self.join_retry_s;
                        self.join_retry_s = (wait * 2).min(JOIN_RETRY_MAX_S);
                        self.say(&format!(
                            "cannot reach the mesh yet ({why}); trying again in {wait} s"
                        ));
                        let tx = self.tx.clone();
                        tokio::spawn(async move {
                            tokio::time::sleep(std::time::Duration::from_secs(wait)).await;
                            let _ = tx.send(Cmd::Redial);
                        });
                    }
                }
                tracing::info!("dial failed: {why}");
            }
            SwarmEvent::Behaviour(BehaviourEvent::Identify(identify::Event::Received {
                peer_id,
                info,
                ..
            })) => {
                if let Err(e) = net::check_identified(&mut self.swarm, peer_id, &info) {
                    self.say(&format!("refused {e}"));
                    if !*joined {
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
                    if !self.swarm.is_connected(&peer) && self.dialing.insert(peer) {
                        let opts = libp2p::swarm::dial_opts::DialOpts::peer_id(peer)
                            .addresses(vec![addr])
                            .build();
                        if self.swarm.dial(opts).is_err() {
                            self.dialing.remove(&peer);
                        }
                    }
                }
                *joined = true;
            }
            _ => {}
        }
        Ok(())
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
        let now = self.now();
        self.peer.set_address(now, id.to_string(), addrs, self.life);
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
            self.tx.clone(),
        ) {
            Ok(s) => self.swim = Some(s),
            Err(e) => self.say(&format!(
                "cannot take membership packets on UDP {bind}: {e}; \
                 members reach this node only over its connections"
            )),
        }
    }

    /// Dials the known peers this node is not connected to, while it knows
    /// no member (after a restart, or cut off): once it is in the mesh,
    /// membership finds the rest.
    pub(super) fn redial_known(&mut self) {
        if self.peer.member_count() > 0 {
            return;
        }
        for addr in &self.known.0 {
            let Ok(a) = addr.parse::<Multiaddr>() else {
                continue;
            };
            let Some(Protocol::P2p(pid)) = a.iter().last() else {
                continue;
            };
            if self.swarm.is_connected(&pid) || self.dialing.contains(&pid) {
                continue;
            }
            let opts = libp2p::swarm::dial_opts::DialOpts::peer_id(pid)
                .addresses(vec![a.clone()])
                .build();
            if self.swarm.dial(opts).is_ok() {
                self.dialing.insert(pid);
            }
        }
    }

    /// Keeps the addresses of every member, so a restart finds them again.
    pub(super) fn remember_peers(&mut self) {
        let mut addrs: Vec<String> = self
            .peer
            .members()
            .flat_map(|m| m.addrs().iter().cloned())
            .collect();
        addrs.sort();
        addrs.dedup();
        for a in std::mem::take(&mut self.known.0) {
            if !addrs.contains(&a) && addrs.len() < 64 {
                addrs.push(a);
            }
        }
        self.known.0 = addrs;
        let w = Write::Meta {
            farm: NODE_KEY,
            name: META_PEERS.into(),
            value: postcard::to_stdvec(&self.known).unwrap_or_default(),
        };
        // Flushed now: an idle node persists nothing else, and one killed
        // before its next flush would start again knowing no peer (on a
        // new port, as `mesh node` listens by default, as a mesh of one).
        if let Err(e) = self.store.write(vec![w]).and_then(|()| self.store.flush()) {
            tracing::warn!("cannot keep the peers' addresses: {e}");
        }
    }

    pub(super) fn label_of(&self, n: NodeId) -> String {
        if n == self.me {
            return self.swarm.local_peer_id().to_string();
        }
        self.peers
            .get(&n)
            .map(|p| p.to_string())
            .or_else(|| self.peer.address_of(n).map(|(l, _)| l.to_owned()))
            .filter(|l| !l.is_empty())
            .or_else(|| self.labels.get(&n).cloned())
            .unwrap_or_else(|| n.to_string())
    }

    pub(super) fn send(
        &mut self,
        to: NodeId,
        req: Request,
        reply: Option<oneshot::Sender<Result<Response, String>>>,
    ) {
        let Some(pid) = self
            .peers
            .get(&to)
            .copied()
            .or_else(|| self.dial_member(to))
        else {
            if let Some(r) = reply {
                let _ = r.send(Err(format!("node {to} is not a member this node knows")));
            }
            return;
        };
        let id = self.swarm.behaviour_mut().rr.send_request(&pid, req);
        self.sent(id);
        self.outbound.pending.insert(id, reply);
    }

    /// A message for a peer's engine, on this node's stream to it: what a
    /// step has for one peer goes as one frame.
    pub(super) fn send_msg(&mut self, to: NodeId, msg: Msg) {
        let pid = match self.peers.get(&to).copied() {
            Some(pid) => pid,
            None => match self.dial_member(to) {
                Some(pid) => pid,
                None => return,
            },
        };
        self.recorder.counters.messages_sent += 1;
        self.links.send(to, pid, msg);
    }

    /// Connects to a member this node has no connection to, at the
    /// addresses membership knows for it; its peer id, when it has one.
    /// Messages for it wait in its link until the connection is up.
    fn dial_member(&mut self, to: NodeId) -> Option<PeerId> {
        let (label, addrs) = self.peer.address_of(to)?;
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

    fn sent(&mut self, id: OutboundRequestId) {
        self.recorder.counters.messages_sent += 1;
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
                    self.on_request(request, channel);
                }
                request_response::Message::Response {
                    request_id,
                    response,
                } => {
                    if let Some(at) = self.outbound.sent_at.remove(&request_id) {
                        let us = at.elapsed().as_micros() as u64;
                        self.peer.record_latency(Latency::MessageRtt, us);
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
                    let _ = reply.send(Err(error.to_string()));
                }
            }
            _ => {}
        }
    }

    fn on_request(&mut self, req: Request, channel: ResponseChannel<Response>) {
        self.recorder.counters.messages_received += 1;
        match req {
            Request::Observe { since } => {
                let resp = Response::Observed(Box::new(self.observation(since)));
                let _ = self.swarm.behaviour_mut().rr.send_response(channel, resp);
            }
            Request::WhereRan { .. } | Request::TaskLog { .. } => {
                let tx = self.tx.clone();
                match self.local_answer(req) {
                    Ok(r) => {
                        let _ = self.swarm.behaviour_mut().rr.send_response(channel, r);
                    }
                    Err(rx) => {
                        tokio::spawn(async move {
                            let r = rx
                                .await
                                .unwrap_or(Response::Error("the node is stopping".into()));
                            let _ = tx.send(Cmd::Respond(channel, r));
                        });
                    }
                }
            }
            Request::ListFarms => {
                let resp = Response::Farms(self.summaries());
                let _ = self.swarm.behaviour_mut().rr.send_response(channel, resp);
            }
            Request::FindFarm { query } => {
                let resp = match self.find_known(&query).map(|f| self.found(f)) {
                    Ok(Some(f)) => Response::Farm(Box::new(f)),
                    Ok(None) | Err(_) => {
                        Response::Error(format!("no farm `{query}` is known to this mesh"))
                    }
                };
                let _ = self.swarm.behaviour_mut().rr.send_response(channel, resp);
            }
            Request::GetBlob { farm, hash, offset } => self.serve_blob(farm, hash, offset, channel),
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

pub(super) async fn request(
    tx: &mpsc::UnboundedSender<Cmd>,
    to: NodeId,
    req: Request,
) -> Result<Response, String> {
    let (reply, rx) = oneshot::channel();
    tx.send(Cmd::Request { to, req, reply })
        .map_err(|_| "the node is stopping".to_string())?;
    match rx.await {
        Ok(Ok(Response::Error(e))) => Err(e),
        Ok(r) => r,
        Err(_) => Err("the node is stopping".into()),
    }
}
