//! What the loop's handle brings, handled in the loop's turn: events that ended or arrived off the loop (tasks' ends taken together as one step of the peer), and calls answered on the channel they carry.

use libp2p::PeerId;
use mesh_protocol::mesh::{Fetched, NodeId};
use mesh_protocol::wire::Request;
use tokio::sync::oneshot;

use super::kept::Submitting;
use super::refusals::{Answer, RequestError};
use super::runs::FetchError;
use super::{Call, Cmd, Event, Node};
use crate::alloc::batch;
use crate::control::{ControlResponse, ErrorKind};
use crate::keys;

impl Node {
    /// Asks the coordinator, whichever node it is now.
    fn ask_of_coordinator(&mut self, req: Request, reply: oneshot::Sender<Answer>) {
        match self.peer.coordinator() {
            Some(to) => self.on_call(Call::Request { to, req, reply }),
            None => {
                let _ = reply.send(Err(RequestError::NoCoordinator));
            }
        }
    }

    /// The peer id of a node a transfer asks, dialling it if need be.
    fn peer_of(&mut self, to: NodeId) -> Option<PeerId> {
        self.net.peer_of(to, &self.peer)
    }

    /// Commands that were ready together; the tasks among them that
    /// ended reach the peer as one step.
    pub(super) fn on_cmds(&mut self, cmds: Vec<Cmd>) {
        let mut ended = Vec::new();
        for cmd in cmds {
            match cmd {
                Cmd::Event(Event::Finished(task, outcome, outputs)) => {
                    self.runs.ended(&task, &outcome, &outputs, &self.peer);
                    ended.push((task, outcome, outputs));
                }
                Cmd::Event(ev) => self.on_event(ev),
                Cmd::Call(call) => self.on_call(call),
            }
        }
        if !ended.is_empty() {
            let now = self.now();
            self.peer.tasks_finished(now, ended);
        }
    }

    /// What ended or arrived off the loop.
    fn on_event(&mut self, ev: Event) {
        match ev {
            Event::Finished(..) => unreachable!("ended tasks are taken together by on_cmds"),
            Event::Peer(peer, msgs) => {
                let from = keys::node_id(&peer);
                self.net.heard(from, peer);
                self.runs.count_received(msgs.len() as u64);
                let now = self.now();
                for msg in msgs {
                    self.peer.handle_message(now, from, msg);
                }
            }
            Event::Fetched(farm, task, r) => {
                if let Err(e) = &r {
                    tracing::info!(%farm, ?task, "outputs not brought home yet: {e}");
                }
                if r.is_ok() {
                    let outputs = self.peer.replica(farm).and_then(|r| match r.log.get(task) {
                        Some(mesh_protocol::mesh::Entry::Done { outputs, .. }) => {
                            Some(outputs.clone())
                        }
                        _ => None,
                    });
                    if let Some(o) = outputs {
                        self.runs.serve_outputs(farm, task, &o, &self.peer);
                    }
                }
                let got = match &r {
                    Ok(()) => Fetched::Here,
                    Err(FetchError::Missing) => Fetched::Gone,
                    Err(_) => Fetched::Later,
                };
                let now = self.now();
                self.peer.fetched(now, farm, task, got);
                self.at_home(|h, m| h.feed(m, farm, Some(task)));
            }
            Event::InputsFetched(farm, r) => {
                if let Err(e) = &r {
                    tracing::info!(%farm, "inputs not here yet: {e}");
                }
                let now = self.now();
                self.peer.inputs_ready(now, farm, r.is_ok());
            }
            Event::Found(r, asked) => self.at_home(|h, m| h.answer(m, *r, asked)),
            Event::Swim(data) => {
                let now = self.now();
                self.peer.handle_swim(now, &data);
            }
            Event::Packet(from, msg) => {
                self.runs.count_received(1);
                let now = self.now();
                self.peer.handle_message(now, from, msg);
            }
            Event::Launched(task, live) => self.runs.launched(task, live),
            Event::GiveBack(task) => self.peer.give_back(task),
            Event::Answered(channel, resp) => {
                self.net.respond(channel, resp);
            }
            Event::Moved(farm) => self.at_home(|h, m| h.refresh_view(m, farm)),
            Event::Estimated(farm, estimate, took) => self.home.estimated(farm, estimate, took),
            Event::Grow(spec, reply) => self.at_home(|h, m| h.grown(m, spec, reply)),
            Event::Submit(spec, rerun, reply) => match spec {
                Err(e) => {
                    let _ = reply.send(ControlResponse::error(ErrorKind::Refused, e.to_string()));
                }
                Ok((spec, keys)) => {
                    self.runs.serve_inputs(&spec);
                    let farm = Submitting {
                        spec,
                        keys,
                        rerun,
                        reply,
                    };
                    self.at_home(|h, m| h.submit_reusing(m, farm));
                }
            },
            Event::SubmitReused(spec, reused, reply) => {
                self.at_home(|h, _| h.submit_now(*spec, reused, reply))
            }
            Event::Feed(farm) => self.at_home(|h, m| h.feed(m, farm, None)),
            Event::Batch(done) => {
                let now = self.now();
                // The book records a failure in words; the peer acts on
                // success or failure alone.
                match done {
                    batch::Done::Submitted(q, r) => {
                        if let Err(e) = &r {
                            self.say(&format!("mesh alloc: queue `{}`: {e}", q.name));
                        }
                        self.peer
                            .batch_submitted(now, &q, r.map_err(|e| e.to_string()));
                    }
                    batch::Done::Polled(system, r) => {
                        self.peer
                            .batch_polled(now, system, r.map_err(|e| e.to_string()))
                    }
                    batch::Done::Cancelled(job, r) => {
                        self.peer
                            .batch_cancelled(now, &job, r.map_err(|e| e.to_string()))
                    }
                    batch::Done::Listed(system, gen, r) => {
                        self.peer
                            .batch_listed(now, system, gen, r.map_err(|e| e.to_string()))
                    }
                }
                self.at_home(|h, m| h.allocs.answer_waits(m));
            }
        }
    }

    /// A call through the handle, answered on the channel it carries.
    pub(super) fn on_call(&mut self, call: Call) {
        match call {
            Call::Request { to, req, reply } if to == self.me => self.answer_own(req, reply),
            Call::Request { to, req, reply } => self.net.send(to, req, Some(reply), &self.peer),
            Call::AskCoordinator { req, reply } => self.ask_of_coordinator(req, reply),
            Call::PeerOf(node, reply) => {
                let _ = reply.send(self.peer_of(node));
            }
            Call::Control(req, reply) => self.at_home(|h, m| h.on_control(m, req, reply)),
        }
    }
}
