//! The messages peers exchange, as the engine sees them.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::engine::{Counts, TaskEnd, TaskResult, Verdict};
use crate::farm::{FarmDef, TaskRef};
use crate::resources::Resources;

/// A node, by a number derived from its network identity. The lowest live id coordinates.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct NodeId(pub u64);

impl std::fmt::Display for NodeId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// A submitted farm, mesh-wide.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct FarmId(pub u64);

impl std::fmt::Display for FarmId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// A farm as it travels: the definition, who submitted it, and the hashes
/// of its input files (the submitter serves them by hash).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FarmSpec {
    pub id: FarmId,
    pub origin: NodeId,
    pub def: FarmDef,
    /// Input path (relative to the farm's root, as the task names it) and its blake3.
    pub inputs: Vec<(String, [u8; 32])>,
}

/// What every node gossips about itself, several times a second.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Beat {
    pub version: u32,
    /// How the node is known on the network (its peer id) and where to reach it;
    /// set by the driver, opaque to the protocol.
    pub label: String,
    pub addrs: Vec<String>,
    /// The highest coordinator term this node knows, and who holds it.
    pub term: u64,
    pub coordinator: Option<NodeId>,
    pub total: Resources,
    /// Resources held by running tasks.
    pub used: Resources,
    /// Tasks assigned here and not started: what a thief may take.
    pub queued: u32,
    pub running: u32,
    /// On the coordinator: tasks ready and not yet handed to anyone.
    pub backlog: u64,
}

/// One task handed to a node to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Assigned {
    pub farm: FarmId,
    pub task: TaskRef,
    pub attempt: u32,
}

/// How a task's attempt ended on the node that ran it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Report {
    pub task: Assigned,
    pub result: TaskResult,
    pub key: Option<[u8; 32]>,
    pub duration_ms: u64,
}

/// A farm's progress, sent by the coordinator to the node that submitted it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FarmProgress {
    pub farm: FarmId,
    pub counts: Counts,
    pub stages: Vec<Counts>,
    pub finished: bool,
    /// Tasks done since the last progress message: the submitter keeps them,
    /// so a new coordinator can take the farm over without re-running them.
    pub done: Vec<TaskRef>,
}

/// A task that failed (or will be retried), for the submitter to show.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Failure {
    pub farm: FarmId,
    pub task: TaskRef,
    pub attempt: u32,
    pub node: NodeId,
    pub end: TaskEnd,
    pub verdict: Verdict,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Msg {
    /// Gossip: who I am, what I hold, whom I follow. Shared, because one
    /// beat goes to many members.
    Beat(Arc<Beat>),
    /// Submitter to coordinator; sent again to a new coordinator with the
    /// tasks the submitter knows are done, which it keeps durably.
    Submit {
        farm: Arc<FarmSpec>,
        done: Vec<TaskRef>,
    },
    /// Coordinator to submitter: the farm is durable on two nodes (one in a mesh of one).
    Accepted { farm: FarmId, tasks: u64 },
    /// Coordinator to submitter: the farm cannot be taken.
    Refused { farm: FarmId, reason: String },
    /// Coordinator to its backup: keep a copy of this farm.
    Replicate { term: u64, farm: Arc<FarmSpec> },
    /// Backup to coordinator: the copy is durable.
    Replicated { farm: FarmId },
    /// Coordinator to worker: run these.
    Assign { term: u64, tasks: Vec<Assigned> },
    /// Worker to coordinator: these attempts are over.
    Report { term: u64, reports: Vec<Report> },
    /// Coordinator to worker: these reports are recorded; forget them.
    Ack { tasks: Vec<Assigned> },
    /// Worker to coordinator: I will not run these after all (queue them again).
    Release { term: u64, tasks: Vec<Assigned> },
    /// Worker to coordinator, after a new coordinator is elected: what I hold.
    Holding { term: u64, tasks: Vec<Assigned> },
    /// Worker to coordinator: I was assigned tasks of a farm I do not know.
    GetFarm { farm: FarmId },
    /// Coordinator to worker: the farm asked for.
    Farm(Arc<FarmSpec>),
    /// Thief to victim: give me unstarted tasks, at most `max`, as many as
    /// a node of `total` resources already holding `load` may be handed
    /// (the coordinator's rule: about 1.1x its capacity, one beyond full).
    Steal {
        id: u64,
        total: Resources,
        load: Resources,
        max: u32,
    },
    /// Victim to thief: the tasks given up (maybe none).
    Stolen { id: u64, tasks: Vec<Assigned> },
    /// Victim to coordinator: these tasks of mine now belong to `to`.
    Moved {
        term: u64,
        to: NodeId,
        tasks: Vec<Assigned>,
    },
    /// Anyone to coordinator, and coordinator to workers: stop this farm.
    Cancel { farm: FarmId },
    /// Coordinator to submitter. Boxed: it is the largest message, and
    /// every other message would pay its size.
    Progress(Box<FarmProgress>),
    /// Coordinator to submitter.
    Failure(Failure),
    /// Coordinator to submitter: a stage fits no node of the mesh; its tasks are failed.
    Unplaceable {
        farm: FarmId,
        stage: u32,
        reason: String,
    },
}
