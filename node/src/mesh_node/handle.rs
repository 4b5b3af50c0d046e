//! The handle to the node's loop that spawned work, transfers and connections hold instead of its raw channel, as rust-libp2p's file-sharing example gives its `Client`: calls that wait for the loop's answer, and events that tell it what ended.
//!
//! Whatever holds one learns nothing of the loop's state: it asks (a
//! request to a node, to the coordinator, a peer id, a control request)
//! or it tells (an [`Event`]). The loop answers calls in its own turn.

use libp2p::PeerId;
use mesh_protocol::mesh::NodeId;
use mesh_protocol::wire::{Request, Response};
use tokio::sync::{mpsc, oneshot};

use super::refusals::{Answer, RequestError};
use super::reply::Reply;
use super::{Call, Cmd, Event};
use crate::control::{ControlRequest, ControlResponse};

/// A way into the node's loop; cloned by each piece of work it spawns.
#[derive(Clone)]
pub(super) struct LoopHandle {
    tx: mpsc::Sender<Cmd>,
    /// The node the loop is: what work done off it (a submission made
    /// ready) names as its home.
    me: NodeId,
}

/// The loop has stopped: nothing sent reaches it any more.
#[derive(Debug)]
pub(super) struct LoopGone;

impl LoopHandle {
    /// A handle and the loop's end of it, holding at most `max` commands:
    /// a sender waits when it is full (every sender is spawned work, never
    /// the loop), so a slow loop slows what feeds it.
    pub(super) fn new(max: usize, me: NodeId) -> (LoopHandle, mpsc::Receiver<Cmd>) {
        let (tx, rx) = mpsc::channel(max);
        (LoopHandle { tx, me }, rx)
    }

    /// The node whose loop this is.
    pub(super) fn me(&self) -> NodeId {
        self.me
    }

    /// Tells the loop that something ended or arrived, waiting for room:
    /// a task's end is never dropped, as its resources wait for it.
    pub(super) async fn tell(&self, ev: Event) -> Result<(), LoopGone> {
        self.tx.send(Cmd::Event(ev)).await.map_err(|_| LoopGone)
    }

    /// [`tell`](Self::tell), from a thread that is not the runtime's
    /// (`spawn_blocking`).
    pub(super) fn tell_blocking(&self, ev: Event) -> Result<(), LoopGone> {
        self.tx.blocking_send(Cmd::Event(ev)).map_err(|_| LoopGone)
    }

    /// Tells the loop of progress that a later event says again: dropped
    /// when the loop is full, never waited for.
    pub(super) fn hint(&self, ev: Event) {
        let _ = self.tx.try_send(Cmd::Event(ev));
    }

    async fn call(&self, call: Call) -> Result<(), LoopGone> {
        self.tx.send(Cmd::Call(call)).await.map_err(|_| LoopGone)
    }

    /// Asks node `to` (this node's own loop when it is this node), and
    /// waits for its answer; its refusal is [`RequestError::Refused`].
    pub(super) async fn request(&self, to: NodeId, req: Request) -> Answer {
        let (reply, rx) = oneshot::channel();
        self.call(Call::Request { to, req, reply })
            .await
            .map_err(|_| RequestError::Stopping)?;
        refused(rx.await)
    }

    /// Asks whichever node coordinates now ([`RequestError::NoCoordinator`]
    /// while none is elected).
    pub(super) async fn ask_coordinator(&self, req: Request) -> Answer {
        let (reply, rx) = oneshot::channel();
        self.call(Call::AskCoordinator { req, reply })
            .await
            .map_err(|_| RequestError::Stopping)?;
        refused(rx.await)
    }

    /// The peer id of node `node`, dialled if need be; None when it is no
    /// member this node knows.
    pub(super) async fn peer_of(&self, node: NodeId) -> Result<Option<PeerId>, LoopGone> {
        let (reply, rx) = oneshot::channel();
        self.call(Call::PeerOf(node, reply)).await?;
        rx.await.map_err(|_| LoopGone)
    }

    /// A control request, as a client's connection sends it: its answers
    /// come on the receiver, which ends after the last.
    pub(super) async fn control(
        &self,
        req: ControlRequest,
    ) -> Result<mpsc::Receiver<ControlResponse>, LoopGone> {
        let (reply, rx) = Reply::channel();
        self.control_to(req, reply).await?;
        Ok(rx)
    }

    /// A control request whose answers go to `reply`, which the caller made.
    pub(super) async fn control_to(
        &self,
        req: ControlRequest,
        reply: Reply,
    ) -> Result<(), LoopGone> {
        self.call(Call::Control(req, reply)).await
    }
}

/// An answer that came back: a node's refusal is an error, and no answer
/// (the loop dropped the reply) means it is stopping.
fn refused(got: Result<Answer, oneshot::error::RecvError>) -> Answer {
    match got {
        Ok(Ok(Response::Error(e))) => Err(RequestError::Refused(e)),
        Ok(r) => r,
        Err(_) => Err(RequestError::Stopping),
    }
}
