//! Peer links: this node's messages for other nodes' engines, one long-lived stream per peer and direction.
//!
//! A task per peer ([`link`]) writes what waited together as one frame; a
//! stream found closed is opened again once for the same frame, and a
//! frame that cannot be written is lost, as to a node that died; so is a
//! message for a peer whose queue is full (`LINK_QUEUE_MAX`).

use std::collections::{HashMap, VecDeque};
use std::io;

use futures::StreamExt;
use libp2p::{PeerId, StreamProtocol};
use mesh_protocol::mesh::{Msg, NodeId};
use mesh_protocol::wire::PEER_PROTOCOL;
use tokio::sync::mpsc;

use crate::mesh_node::{Event, LoopHandle};
use crate::net;

/// This node's streams of messages to other nodes' engines.
pub(super) struct Links {
    /// Opens those streams.
    streams: libp2p_stream::Control,
    /// Messages for each peer's engine, to the task that writes them on
    /// this node's stream to that peer (see [`link`]).
    writers: HashMap<NodeId, mpsc::Sender<Msg>>,
}

impl Links {
    pub(super) fn new(streams: libp2p_stream::Control) -> Links {
        Links {
            streams,
            writers: HashMap::new(),
        }
    }

    /// Hands `msg` to the writer of the stream to `to` (`pid`), starting
    /// one when there is none or it has stopped.
    pub(super) fn send(&mut self, to: NodeId, pid: PeerId, msg: Msg) {
        let msg = match self.writers.get(&to) {
            Some(l) => match l.try_send(msg) {
                Ok(()) => return,
                // The loop cannot wait: a peer that takes nothing in for
                // this long loses the message, as a frame that cannot be
                // written is lost, and the protocol resends what matters.
                Err(mpsc::error::TrySendError::Full(_)) => {
                    tracing::debug!(%pid, "a message lost: {LINK_QUEUE_MAX} wait for that stream");
                    return;
                }
                Err(mpsc::error::TrySendError::Closed(m)) => m,
            },
            None => msg,
        };
        let (ltx, lrx) = mpsc::channel(LINK_QUEUE_MAX);
        let _ = ltx.try_send(msg);
        tokio::spawn(link(self.streams.clone(), pid, lrx));
        self.writers.insert(to, ltx);
    }

    pub(super) fn forget(&mut self, n: NodeId) {
        self.writers.remove(&n);
    }
}

/// How long opening a stream to a peer may take (dialling it if need be),
/// and writing a frame on it (as long as a request was given): past that
/// the frame is given up as lost, and the protocol resends what matters,
/// as it does for a peer that is gone.
const LINK_OPEN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(
    net::CONNECT_TIMEOUT.as_secs() + net::HANDSHAKE_TIMEOUT.as_secs(),
);
const LINK_WRITE_TIMEOUT: std::time::Duration = net::DEFAULT_REQUEST_TIMEOUT;
/// A stream with nothing to write for this long is closed, so that a
/// connection nobody uses goes idle and closes (`net::DEFAULT_IDLE_TIMEOUT`):
/// a node keeps connections only to those it talks to now.
const LINK_IDLE: std::time::Duration = std::time::Duration::from_secs(5);
/// At most this many messages in one frame.
const LINK_BATCH: usize = 4096;
/// Messages waiting for one peer's stream: many full frames, more than a
/// coordinator's busiest steps send one node, so only a stream that takes
/// nothing in for a long time (a peer stuck, a write timing out) fills it.
const LINK_QUEUE_MAX: usize = 16 * LINK_BATCH;

/// Writes this node's messages for one peer's engine on a stream to it, in
/// order, one frame for what waited together. A stream per peer for the
/// life of the connection costs a muxer frame per batch, where a request
/// cost a new stream, its protocol negotiation, an answer and two
/// closes (five writes to the socket between two nodes, and timers).
/// A frame that cannot be written is lost, like a message to a node that
/// died; the stream is opened again for the next.
async fn link(mut control: libp2p_stream::Control, peer: PeerId, mut rx: mpsc::Receiver<Msg>) {
    let mut stream: Option<libp2p::Stream> = None;
    let mut frames: VecDeque<Vec<Msg>> = VecDeque::new();
    loop {
        let first = match tokio::time::timeout(LINK_IDLE, rx.recv()).await {
            Ok(Some(m)) => m,
            Ok(None) => return,
            Err(_) => {
                if let Some(mut s) = stream.take() {
                    let _ = futures::AsyncWriteExt::close(&mut s).await;
                }
                continue;
            }
        };
        let mut batch = vec![first];
        while batch.len() < LINK_BATCH {
            match rx.try_recv() {
                Ok(m) => batch.push(m),
                Err(_) => break,
            }
        }
        frames.push_back(batch);
        while let Some(batch) = frames.pop_front() {
            match write_link(&mut control, peer, &mut stream, &batch).await {
                // Over the frame limit, nothing was written: in halves.
                Err(e) if e.kind() == io::ErrorKind::InvalidData && batch.len() > 1 => {
                    let mut first = batch;
                    let second = first.split_off(first.len() / 2);
                    frames.push_front(second);
                    frames.push_front(first);
                }
                Err(e) => tracing::debug!(%peer, "messages lost: {e}"),
                Ok(()) => {}
            }
        }
    }
}

/// Writes one frame; a stream found closed (the peer restarted, the
/// connection was replaced) is opened again once for it.
async fn write_link(
    control: &mut libp2p_stream::Control,
    peer: PeerId,
    stream: &mut Option<libp2p::Stream>,
    batch: &[Msg],
) -> io::Result<()> {
    let mut last = io::Error::other("no stream");
    for _ in 0..2 {
        if stream.is_none() {
            *stream = open_link(control, peer).await;
        }
        let Some(s) = stream.as_mut() else {
            break;
        };
        match tokio::time::timeout(LINK_WRITE_TIMEOUT, net::write_frame(s, &batch)).await {
            Ok(Ok(())) => return Ok(()),
            // Refused before anything was written: the stream is fine.
            Ok(Err(e)) if e.kind() == io::ErrorKind::InvalidData => return Err(e),
            Ok(Err(e)) => last = e,
            Err(_) => {
                last = io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the stream did not take them in time",
                )
            }
        }
        *stream = None;
    }
    Err(last)
}

async fn open_link(control: &mut libp2p_stream::Control, peer: PeerId) -> Option<libp2p::Stream> {
    let open = control.open_stream(peer, StreamProtocol::new(PEER_PROTOCOL));
    match tokio::time::timeout(LINK_OPEN_TIMEOUT, open).await {
        Ok(Ok(s)) => Some(s),
        Ok(Err(e)) => {
            tracing::debug!(%peer, "no stream for messages: {e}");
            None
        }
        Err(_) => {
            tracing::debug!(%peer, "no stream for messages in time");
            None
        }
    }
}

/// Takes every peer's stream of messages for this node's engine.
pub(in crate::mesh_node) async fn accept_links(
    mut incoming: libp2p_stream::IncomingStreams,
    handle: LoopHandle,
) {
    while let Some((peer, stream)) = incoming.next().await {
        tokio::spawn(read_link(peer, stream, handle.clone()));
    }
}

/// Hands each frame of a peer's stream to the engine, until the stream ends.
async fn read_link(peer: PeerId, mut stream: libp2p::Stream, handle: LoopHandle) {
    loop {
        match net::read_frame::<_, Vec<Msg>>(&mut stream).await {
            Ok(msgs) => {
                if handle.tell(Event::Peer(peer, msgs)).await.is_err() {
                    return;
                }
            }
            Err(e) => {
                if e.kind() != io::ErrorKind::UnexpectedEof {
                    tracing::debug!(%peer, "stream of messages ended: {e}");
                }
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use mesh_protocol::mesh::FarmId;
    use mesh_protocol::wire::MESSAGE_MAX;
    use tokio::time::timeout;

    use super::*;
    use crate::mesh_node::Cmd;

    const WAIT: Duration = Duration::from_secs(60);

    #[tokio::test(flavor = "current_thread")]
    async fn messages_over_the_frame_limit_together_go_in_halves_and_all_arrive_in_order() {
        let p = net::tests::linked_pair().await;
        let (tx, mut rx) = LoopHandle::new(16, mesh_protocol::mesh::NodeId(1));
        tokio::spawn(accept_links(p.b_incoming, tx));
        let (ltx, lrx) = mpsc::channel(16);
        // Four messages of a third of the limit each: no frame can carry
        // them all, two can.
        let big = "x".repeat(MESSAGE_MAX / 3);
        for i in 0..4 {
            ltx.try_send(Msg::Refused {
                farm: FarmId(i),
                reason: big.clone(),
            })
            .unwrap();
        }
        tokio::spawn(link(p.a_control, p.b, lrx));
        let (mut farms, mut frames) = (Vec::new(), 0);
        timeout(WAIT, async {
            while farms.len() < 4 {
                if let Some(Cmd::Event(Event::Peer(_, msgs))) = rx.recv().await {
                    frames += 1;
                    for m in msgs {
                        match m {
                            Msg::Refused { farm, reason } if reason.len() == big.len() => {
                                farms.push(farm.0)
                            }
                            other => panic!("not what was sent: {other:?}"),
                        }
                    }
                }
            }
        })
        .await
        .expect("not every message arrived in time");
        p.swarms.abort();
        assert_eq!(farms, [0, 1, 2, 3]);
        assert_eq!(frames, 2);
    }
}
