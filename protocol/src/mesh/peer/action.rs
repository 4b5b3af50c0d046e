//! What a peer asks of its driver: actions to carry out in order, what to make durable, and events to show.

use std::sync::Arc;

use super::super::msg::*;
pub use super::membership::{Quiet, QuietSwim};
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
        /// Which farm the task belongs to.
        farm: FarmId,
        /// Which task of the farm (its stage and index).
        task: TaskRef,
        /// What the coordinator's engine records of it: where it restarts from.
        record: TaskRecord,
    },
    /// Entries of a farm this node holds. With `records`, each also as the
    /// task's record (a copy from elsewhere); without, the coordinator's
    /// own records already say it, and only where outputs are and why a
    /// task failed is kept beside them.
    Entries {
        /// Which farm the entries are of.
        farm: FarmId,
        /// The entries to keep, in the order this node took them.
        entries: Vec<Entry>,
        /// Each entry is also to be kept as the task's record (see above).
        records: bool,
    },
    /// On the home (by this claim): these tasks' outputs are here, verified.
    Collected {
        /// Which farm the outputs are of.
        farm: FarmId,
        /// The home's claim they were brought under: a node that takes the farm
        /// over starts with nothing collected.
        home: Home,
        /// The tasks whose outputs are here now.
        tasks: Vec<TaskRef>,
    },
    /// The farm's home as this node knows it, and where this node puts the
    /// outputs when that is itself after a takeover.
    Home {
        /// Which farm this is of.
        farm: FarmId,
        /// Which node is the home, and since which claim.
        home: Home,
        /// Where this node writes the outputs when it took the farm over
        /// (`mesh resume FARM --out DIR`); none otherwise.
        out: Option<String>,
    },
    /// The farm is over for this holder, with its final counts.
    Finished {
        /// Which farm is over.
        farm: FarmId,
        /// The farm's counts at its end, summed over its stages.
        counts: engine::Counts,
        /// The same counts per stage, in the farm's stage order.
        stages: Vec<engine::Counts>,
    },
    /// Results this node reported and the coordinator has not yet
    /// acknowledged as replicated: those added or changed (`reports`), and
    /// those acknowledged since the last (`gone`).
    Unacked {
        /// Reports added or changed since the last persist, to be kept until acknowledged.
        reports: Vec<Report>,
        /// Reports acknowledged since the last persist: what was kept of them may go.
        gone: Vec<(FarmId, TaskRef)>,
    },
    /// The mesh's allocation queues, as this node last heard of them.
    Allocs(Arc<AllocBook>),
}

/// What happened that the driver may want to show.
#[derive(Clone, Debug, PartialEq)]
pub enum PeerEvent {
    /// A member came up: SWIM told of it, or its first beat arrived.
    MemberUp(NodeId),
    /// A member was silent too long and is taken for dead.
    MemberDown(NodeId),
    /// This node follows a coordinator, a new one or itself once elected.
    Coordinator {
        /// The term the coordinator was elected in.
        term: u64,
        /// Which node coordinates.
        node: NodeId,
    },
    /// On the farm's home: the coordinator took the farm, now durable on as
    /// many nodes as it must be.
    Accepted {
        /// Which farm was taken.
        farm: FarmId,
        /// How many tasks the farm has.
        tasks: u64,
    },
    /// On the farm's home: the coordinator will not take the farm.
    Refused {
        /// Which farm was refused.
        farm: FarmId,
        /// Why, in words for the user.
        reason: String,
    },
    /// On the home: the farm's progress changed ([`Peer::progress`](super::Peer::progress)
    /// says it). Only its id: the progress of an open farm grown by
    /// thousands of batches is long, and the driver reads it when it
    /// shows it.
    Progress(FarmId),
    /// On the home: an attempt failed and will be retried.
    Failure(Failure),
    /// On the home: a stage fits no node of the mesh, so its tasks are failed.
    Unplaceable {
        /// Which farm the stage is of.
        farm: FarmId,
        /// Which stage, by its place in the farm (from 0).
        stage: u32,
        /// Why it fits nowhere, in words for the user.
        reason: String,
    },
    /// This node was silent this long (stopped, or starved of CPU) and gave
    /// back what it had queued.
    Silent {
        /// How long this node was silent, in ms.
        ms: u64,
        /// How many queued tasks it gave back to the coordinator.
        released: usize,
    },
}

/// What a peer asks its driver to do, in the order the driver must do it.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Send a message to another node.
    Send {
        /// The node to send it to; never this one (a message to itself stays
        /// inside the peer).
        to: NodeId,
        /// The message.
        msg: Msg,
    },
    /// A membership packet for `to` (a datagram: it may be lost, and the
    /// protocol expects that), handed back through [`Peer::handle_swim`](super::Peer::handle_swim).
    Swim {
        /// Who the packet is for.
        to: Ident,
        /// The packet, as SWIM encoded it.
        data: Vec<u8>,
    },
    /// A membership packet the simulator delivers in closed form
    /// (`Config::quiet_swim`): a ping or an ack that carries nothing but
    /// itself, not built. A driver that delivers packets builds it
    /// ([`Peer::quiet_packet`](super::Peer::quiet_packet)) and sends it as
    /// [`Action::Swim`].
    QuietSwim(QuietSwim),
    /// Make this durable before acting on anything that follows.
    Persist(Persist),
    /// Start a task this node was given, with the resources granted to it.
    Start {
        /// The task's attempt to start.
        task: Assigned,
        /// The resources and GPUs it may use.
        grant: Grant,
    },
    /// Kill a running task.
    Kill {
        /// The task's attempt to kill.
        task: Assigned,
        /// Why: a timeout, a cancel or an interrupt.
        reason: KillReason,
    },
    /// On the home: bring these outputs of a finished task from the node
    /// that keeps them, verify them, and call [`Peer::fetched`](super::Peer::fetched).
    Fetch {
        /// Which farm the task is of.
        farm: FarmId,
        /// The task whose outputs to bring.
        task: TaskRef,
        /// The node that ran it and keeps its outputs.
        from: NodeId,
        /// The files to bring, each with its hash to check it by.
        outputs: Arc<[OutputFile]>,
    },
    /// Every output of this farm is home: what this node kept of it may go.
    Forget {
        /// Which farm is over.
        farm: FarmId,
    },
    /// Bring every input of this farm here (from its submitter or any
    /// node that has them) and call [`Peer::inputs_ready`](super::Peer::inputs_ready).
    FetchInputs {
        /// Which farm's inputs to bring.
        farm: FarmId,
    },
    /// On the coordinator: ask the batch system (`mesh alloc`), and answer
    /// with [`Peer::batch_submitted`](super::Peer::batch_submitted), `batch_polled` or `batch_cancelled`.
    Batch(BatchOp),
    /// Show an event to the user (or log it).
    Emit(PeerEvent),
}

// Every action is moved from the peer's queue to its driver: what keeps
// it small is what it boxes or leaves to be read (see `PeerEvent::Progress`). A task's record
// (the largest, in `Persist::Task`) boxes its stderr line and its usage.
const _: () = assert!(std::mem::size_of::<Action>() <= 128);

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
