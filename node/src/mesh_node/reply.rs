//! Answers to one control connection: a bounded queue from the loop, which must never wait, to the task that writes them out.
//!
//! The loop cannot wait for a slow reader, and a queue without a bound
//! would grow with it. So the last free place is kept for a last answer:
//! a reader that falls [`REPLY_MAX`] answers behind gets `lagged` as its
//! last answer instead of what did not fit, and hears nothing more (as
//! `tokio::sync::broadcast` tells a receiver that lagged). What a later
//! answer says again (a `Progress`) is dropped instead, and tasks that
//! may wait for room (a log followed) do.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::sync::mpsc;

use crate::control::{ControlResponse, ErrorKind};

/// Answers waiting for one connection's writer: far more than a reader
/// that keeps up ever has waiting (the writer sends each as it comes),
/// few enough that a reader that stopped holds little of the node.
pub(crate) const REPLY_MAX: usize = 1024;

/// How often a task waiting for room in a queue looks.
const ROOM_LOOK: std::time::Duration = std::time::Duration::from_millis(5);

/// The connection is gone, or was cut off for lagging.
#[derive(Debug)]
pub(super) struct Gone;

/// The sending side of one connection's answers.
#[derive(Clone)]
pub(super) struct Reply {
    tx: mpsc::Sender<ControlResponse>,
    /// Told it lagged: nothing more goes to this reader.
    cut: Arc<AtomicBool>,
}

impl Reply {
    pub(super) fn channel() -> (Reply, mpsc::Receiver<ControlResponse>) {
        let (tx, rx) = mpsc::channel(REPLY_MAX);
        let cut = Arc::new(AtomicBool::new(false));
        (Reply { tx, cut }, rx)
    }

    /// Sends `r` without waiting. With one place left, only a last answer
    /// takes it; anything else cuts the reader off as lagged.
    pub(super) fn send(&self, r: ControlResponse) -> Result<(), Gone> {
        if self.cut.load(Ordering::Relaxed) {
            return Err(Gone);
        }
        let r = if self.tx.capacity() <= 1 && !r.is_last() {
            self.cut.store(true, Ordering::Relaxed);
            ControlResponse::error(ErrorKind::Lagged, format!(
                "lagged: this reader fell {REPLY_MAX} answers behind the node and was cut off; ask again"
            ))
        } else {
            r
        };
        match self.tx.try_send(r) {
            Ok(()) if !self.cut.load(Ordering::Relaxed) => Ok(()),
            Ok(()) => Err(Gone),
            Err(_) => {
                self.cut.store(true, Ordering::Relaxed);
                Err(Gone)
            }
        }
    }

    /// Sends `r`, which a later answer says again, unless the queue is
    /// nearly full: then it is dropped, and the reader is not cut off.
    pub(super) fn offer(&self, r: ControlResponse) -> Result<(), Gone> {
        if self.is_closed() {
            return Err(Gone);
        }
        if self.tx.capacity() <= 1 {
            return Ok(());
        }
        self.send(r)
    }

    /// Sends `r` from a task, which may wait for room.
    pub(super) async fn send_wait(&self, r: ControlResponse) -> Result<(), Gone> {
        if self.cut.load(Ordering::Relaxed) {
            return Err(Gone);
        }
        self.tx.send(r).await.map_err(|_| Gone)
    }

    /// Places free in the queue now.
    pub(super) fn room(&self) -> usize {
        self.tx.capacity()
    }

    /// Waits until at least `n` places are free (at most [`REPLY_MAX`]).
    /// It looks now and then rather than reserving them: places reserved
    /// by a waiter would be full to the loop, which would cut the reader
    /// off.
    pub(super) async fn wait_room(&self, n: usize) -> Result<(), Gone> {
        while self.room() < n.clamp(1, REPLY_MAX) {
            if self.is_closed() {
                return Err(Gone);
            }
            tokio::time::sleep(ROOM_LOOK).await;
        }
        Ok(())
    }

    pub(super) fn is_closed(&self) -> bool {
        self.cut.load(Ordering::Relaxed) || self.tx.is_closed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn progress() -> ControlResponse {
        ControlResponse::Warning("w".into())
    }

    #[test]
    fn a_reader_that_falls_behind_is_told_it_lagged_last() {
        let (reply, mut rx) = Reply::channel();
        for _ in 0..REPLY_MAX - 1 {
            reply.send(progress()).unwrap();
        }
        assert!(reply.send(progress()).is_err());
        assert!(reply.send(progress()).is_err());
        let mut last = None;
        let mut n = 0;
        while let Ok(r) = rx.try_recv() {
            n += 1;
            last = Some(r);
        }
        assert_eq!(n, REPLY_MAX);
        assert!(matches!(
            last,
            Some(ControlResponse::Error {
                kind: ErrorKind::Lagged,
                ..
            })
        ));
        // Drained, it still hears nothing more: the lagged notice was last.
        assert!(reply.send(progress()).is_err());
        assert!(reply.is_closed());
    }

    #[test]
    fn a_last_answer_takes_the_last_place_and_a_dropped_progress_cuts_nobody() {
        let (reply, mut rx) = Reply::channel();
        for _ in 0..REPLY_MAX - 1 {
            reply.send(progress()).unwrap();
        }
        reply
            .offer(ControlResponse::Warning("dropped".into()))
            .unwrap();
        assert!(!reply.is_closed());
        reply
            .send(ControlResponse::Cancelled { farm: "f".into() })
            .unwrap();
        let mut last = None;
        while let Ok(r) = rx.try_recv() {
            last = Some(r);
        }
        assert!(matches!(last, Some(ControlResponse::Cancelled { .. })));
    }
}
