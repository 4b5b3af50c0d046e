//! What a peer asks of its driver: actions to carry out in order, what to make durable, and events to show.

use std::sync::Arc;

use super::super::msg::*;
use crate::alloc::book::{AllocBook, BatchOp};
use crate::engine::{self, KillReason, TaskRecord};
use crate::farm::TaskRef;
use crate::pool::Grant;

/// What the driver must make durable before acting on anything after it.
#[derive(Clone, Debug, PartialEq)]
pub enum Persist {
    /// A farm this node coordinates, keeps a copy of, or submitted.
    Farm(Arc<FarmSpec>),
    /// The coordinator's record of one task.
    Task {
        farm: FarmId,
        task: TaskRef,
        record: TaskRecord,
    },
    /// Entries of a farm this node holds. With `records`, each also as the
    /// task's record (a copy from elsewhere); without, the coordinator's
    /// own records already say it, and only where outputs are and why a
    /// task failed is kept beside them.
    Entries {
        farm: FarmId,
        entries: Vec<Entry>,
        records: bool,
    },
    /// On the home (by this claim): these tasks' outputs are here, verified.
    Collected {
        farm: FarmId,
        home: Home,
        tasks: Vec<TaskRef>,
    },
    /// The farm's home as this node knows it, and where this node puts the
    /// outputs when that is itself after a takeover.
    Home {
        farm: FarmId,
        home: Home,
        out: Option<String>,
    },
    /// The farm is over for this holder, with its final counts.
    Finished {
        farm: FarmId,
        counts: engine::Counts,
        stages: Vec<engine::Counts>,
    },
    /// Results this node reported and the coordinator has not yet
    /// acknowledged as replicated: those added or changed (`reports`), and
    /// those acknowledged since the last (`gone`).
    Unacked {
        reports: Vec<Report>,
        gone: Vec<(FarmId, TaskRef)>,
    },
    /// The mesh's allocation queues, as this node last heard of them.
    Allocs(Arc<AllocBook>),
}

/// What happened that the driver may want to show.
#[derive(Clone, Debug, PartialEq)]
pub enum PeerEvent {
    MemberUp(NodeId),
    MemberDown(NodeId),
    Coordinator {
        term: u64,
        node: NodeId,
    },
    Accepted {
        farm: FarmId,
        tasks: u64,
    },
    Refused {
        farm: FarmId,
        reason: String,
    },
    /// Boxed: unboxed it was the largest thing a peer says (168 bytes),
    /// and made every [`Action`] that large, each moved several times
    /// between the peer and its driver.
    Progress(Box<FarmProgress>),
    Failure(Failure),
    Unplaceable {
        farm: FarmId,
        stage: u32,
        reason: String,
    },
    /// This node was silent this long (stopped, or starved of CPU) and gave
    /// back what it had queued.
    Silent {
        ms: u64,
        released: usize,
    },
}

#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    Send {
        to: NodeId,
        msg: Msg,
    },
    /// A membership packet for `to` (a datagram: it may be lost, and the
    /// protocol expects that), handed back through [`Peer::handle_swim`].
    Swim {
        to: Ident,
        data: Vec<u8>,
    },
    Persist(Persist),
    Start {
        task: Assigned,
        grant: Grant,
    },
    Kill {
        task: Assigned,
        reason: KillReason,
    },
    /// On the home: bring these outputs of a finished task from the node
    /// that keeps them, verify them, and call [`Peer::fetched`].
    Fetch {
        farm: FarmId,
        task: TaskRef,
        from: NodeId,
        outputs: Arc<[OutputFile]>,
    },
    /// Every output of this farm is home: what this node kept of it may go.
    Forget {
        farm: FarmId,
    },
    /// Bring every input of this farm here (from its submitter or any
    /// node that has them) and call [`Peer::inputs_ready`].
    FetchInputs {
        farm: FarmId,
    },
    /// On the coordinator: ask the batch system (`mesh alloc`), and answer
    /// with [`Peer::batch_submitted`], `batch_polled` or `batch_cancelled`.
    Batch(BatchOp),
    Emit(PeerEvent),
}

// Every action is moved from the peer's queue to its driver: what keeps
// it small is what it boxes (see `PeerEvent::Progress`).
const _: () = assert!(std::mem::size_of::<Action>() <= 120);

/// How a home's fetch of a task's outputs ([`Action::Fetch`]) ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fetched {
    /// Every output is here, verified.
    Here,
    /// Not now (the node did not answer): asked again later.
    Later,
    /// The node answered that it does not have them.
    Gone,
}
