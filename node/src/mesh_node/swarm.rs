//! The swarm: its events (connections, dialling, identify, gossip, pings), known peers redialled, and the request-response exchange with other nodes.

use std::collections::HashMap;
use std::time::Instant;

use libp2p::gossipsub;
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

use super::{Cmd, Node, NodeError, NodeOptions};
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
                self.listen_addrs.push(address);
                self.update_address();
            }
            SwarmEvent::ConnectionEstablished { peer_id, .. } => {
                self.dialing.remove(&peer_id);
                self.peers.insert(keys::node_id(&peer_id), peer_id);
                *joined = true;
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
            SwarmEvent::Behaviour(BehaviourEvent::Gossipsub(gossipsub::Event::Message {
                message,
                ..
            })) => {
                let Some(source) = message.source else {
                    return Ok(());
                };
                if let Some(msg @ Msg::Beat(_)) = net::decode_gossip(&message.data) {
                    let from = keys::node_id(&source);
                    if let Msg::Beat(b) = &msg {
                        self.maybe_dial(source, &b.addrs);
                        self.labels
                            .entry(from)
                            .or_insert_with(|| source.to_string());
                        if b.addrs.iter().any(|a| !self.known.0.contains(a)) {
                            // A member moved (restarted elsewhere): keep where it is now.
                            self.remember_peers();
                        }
                    }
                    let now = self.now();
                    self.peer.handle_message(now, from, msg);
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

    /// Gossip reaches this node through others: connect to its author directly.
    fn maybe_dial(&mut self, peer: PeerId, addrs: &[String]) {
        if self.swarm.is_connected(&peer) || self.dialing.contains(&peer) {
            return;
        }
        let addrs: Vec<Multiaddr> = addrs.iter().filter_map(|a| a.parse().ok()).collect();
        if addrs.is_empty() {
            return;
        }
        let opts = libp2p::swarm::dial_opts::DialOpts::peer_id(peer)
            .addresses(addrs)
            .build();
        if self.swarm.dial(opts).is_ok() {
            self.dialing.insert(peer);
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
        self.peer.set_address(id.to_string(), addrs);
    }

    /// Dials the known peers this node is not connected to.
    pub(super) fn redial_known(&mut self) {
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
            .flat_map(|m| m.beat.addrs.iter().cloned())
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
        if let Err(e) = self.store.write(vec![w]) {
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
            .or_else(|| self.labels.get(&n).cloned())
            .unwrap_or_else(|| n.to_string())
    }

    pub(super) fn send(
        &mut self,
        to: NodeId,
        req: Request,
        reply: Option<oneshot::Sender<Result<Response, String>>>,
    ) {
        let Some(pid) = self.peers.get(&to).copied() else {
            if let Some(r) = reply {
                let _ = r.send(Err(format!("node {to} is not connected")));
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
        let Some(pid) = self.peers.get(&to).copied() else {
            return;
        };
        self.recorder.counters.messages_sent += 1;
        self.links.send(to, pid, msg);
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
