//! Requests from other nodes, answered here: at once from what the node knows (its status, farms, kept results, a farm's place), or off the loop where files must be read (logs, where a task ran, what a task depends on), the answer coming back as an event.

use libp2p::request_response::ResponseChannel;
use mesh_protocol::wire::{Request, Response};
use tokio::sync::oneshot;

use super::refusals::{Answer, QueryError};
use super::{home, Event, Node};

impl Node {
    pub(super) fn on_request(&mut self, req: Request, channel: ResponseChannel<Response>) {
        self.runs.count_received(1);
        match req {
            Request::Observe { since } => {
                let resp =
                    Response::Observed(Box::new(self.at_home(|_, m| home::observation(m, since))));
                self.net.respond(channel, resp);
            }
            Request::WhereRan { .. } | Request::TaskLog { .. } | Request::DepOutputs { .. } => {
                let handle = self.handle.clone();
                match self.at_home(|_, m| home::local_answer(m, req)) {
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
                let resp = Response::Nodes(self.at_home(|_, m| m.mesh.node_beats()));
                self.net.respond(channel, resp);
            }
            Request::ListFarms => {
                let resp = Response::Farms(self.at_home(|_, m| home::summaries(m)));
                self.net.respond(channel, resp);
            }
            Request::Kept { keys } => {
                let kept = self.at_home(|_, m| {
                    let (kept, mut lent) = home::kept_lent(m);
                    kept.kept_here(&mut lent, &keys)
                });
                let resp = Response::Kept(kept);
                self.net.respond(channel, resp);
            }
            Request::FindFarm { query } => {
                let found =
                    self.at_home(|_, m| home::find_known(m, &query).map(|f| home::found(m, f)));
                let resp = match found {
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
        match self.at_home(|_, m| home::local_answer(m, req)) {
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
