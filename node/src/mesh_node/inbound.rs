//! Requests from other nodes, answered here: at once from what the node knows (its status, farms, kept results, a farm's place), or off the loop where files must be read (logs, where a task ran, what a task depends on), the answer coming back as an event.

use libp2p::request_response::ResponseChannel;
use mesh_protocol::wire::{Request, Response};
use tokio::sync::oneshot;

use super::refusals::{Answer, QueryError};
use super::{Event, Node};

impl Node {
    pub(super) fn on_request(&mut self, req: Request, channel: ResponseChannel<Response>) {
        self.runs.count_received(1);
        match req {
            Request::Observe { since } => {
                let resp = Response::Observed(Box::new(self.observation(since)));
                self.net.respond(channel, resp);
            }
            Request::WhereRan { .. } | Request::TaskLog { .. } | Request::DepOutputs { .. } => {
                let handle = self.handle.clone();
                match self.local_answer(req) {
                    Ok(r) => {
                        self.net.respond(channel, r);
                    }
                    Err(rx) => {
                        tokio::spawn(async move {
                            let r = rx
                                .await
                                .unwrap_or(Response::Error("the node is stopping".into()));
                            let _ = handle.tell(Event::Answered(channel, r)).await;
                        });
                    }
                }
            }
            Request::Nodes => {
                let resp = Response::Nodes(self.peer.node_beats());
                self.net.respond(channel, resp);
            }
            Request::ListFarms => {
                let resp = Response::Farms(self.summaries());
                self.net.respond(channel, resp);
            }
            Request::Kept { keys } => {
                let (kept, mut lent) = self.lent();
                let resp = Response::Kept(kept.kept_here(&mut lent, &keys));
                self.net.respond(channel, resp);
            }
            Request::FindFarm { query } => {
                let resp = match self.find_known(&query).map(|f| self.found(f)) {
                    Ok(Some(f)) => Response::Farm(Box::new(f)),
                    Ok(None) | Err(_) => {
                        Response::Error(QueryError::UnknownToMesh(query).to_string())
                    }
                };
                self.net.respond(channel, resp);
            }
        }
    }

    /// A request this node made of itself (`mesh logs` of a task run
    /// here), answered as another node's would be.
    pub(super) fn answer_own(&mut self, req: Request, reply: oneshot::Sender<Answer>) {
        match self.local_answer(req) {
            Ok(r) => {
                let _ = reply.send(Ok(r));
            }
            Err(rx) => {
                tokio::spawn(async move {
                    let r = rx
                        .await
                        .unwrap_or(Response::Error("the node is stopping".into()));
                    let _ = reply.send(Ok(r));
                });
            }
        }
    }
}
