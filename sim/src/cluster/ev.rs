//! The simulator's events, and the order of those of one millisecond: by what they are, not by when they were scheduled.

use mesh_protocol::mesh::{Assigned, FarmId, Msg, QuietSwim};
use mesh_protocol::TaskRef;

use super::batch;

/// What the simulator schedules: a node's wake, a message, a task's end, a fault.
pub(super) enum Ev {
    /// A node comes up (at the start, or joining late).
    Up(u32),
    /// Messages are boxed, here and below: an event is copied into its
    /// bucket of the queue and out again, mostly into memory not touched
    /// for a while, and a message inline made every event 120 bytes.
    Deliver {
        to: u32,
        from: u32,
        msg: Box<Msg>,
    },
    /// A membership packet in closed form (`Action::QuietSwim`), ordered
    /// as the packet it stands for: taken so where it can be, else built.
    QuietSwim {
        to: u32,
        from: u32,
        q: Box<QuietSwim>,
    },
    /// The node's next `handle_timeout`; stale unless it is still the one asked for.
    Timer {
        node: u32,
        gen: u32,
    },
    TaskEnd {
        node: u32,
        gen: u32,
        task: Assigned,
        token: u64,
    },
    Submit,
    Crash(u32),
    Restart(u32),
    Leave(u32),
    /// A leaving node, its tasks handed back, stops.
    Gone(u32),
    /// A node has brought a farm's inputs (the simulated farm has none,
    /// so they are there a round trip after it asks).
    InputsReady {
        node: u32,
        gen: u32,
        farm: FarmId,
    },
    /// The home's fetch of a task's outputs from the node that keeps them
    /// has had time to get there and back.
    Fetched {
        home: u32,
        gen: u32,
        from: u32,
        task: TaskRef,
    },
    /// `mesh alloc add` of the scenario's queue (again, until it is there).
    AllocAdd(u32),
    /// The batch system's answer to what a node asked.
    BatchAnswer {
        node: u32,
        gen: u32,
        answer: Box<batch::Answer>,
    },
    /// A batch job leaves the queue and starts its nodes.
    JobStart(u32),
    /// A running job ends: its nodes drain before the walltime, or it was cancelled.
    JobEnd {
        job: u32,
        cancelled: bool,
    },
    /// A job's walltime: the batch system kills what is still there.
    JobKill(u32),
    /// A stalled node goes on: what came for it meanwhile is handled now.
    Resume(u32),
    /// A message that reached the node (it passed the network), to be
    /// handled once the node gets to it (stalled, or slow: `Served`).
    Arrived {
        to: u32,
        gen: u32,
        from: u32,
        msg: Box<Msg>,
    },
    /// A slow node has got through the messages queued before this one.
    Served {
        to: u32,
        gen: u32,
        from: u32,
        msg: Box<Msg>,
    },
    /// The node's timer came due while it was stalled.
    Wake {
        node: u32,
        gen: u32,
    },
    /// `node` is introduced to another (`[[introduce]]`).
    Introduce {
        node: u32,
        to: u32,
    },
    /// A look at whether the mesh is one (`one_mesh`), every virtual second.
    MeshCheck,
}

/// The key's node for events that are for no one node: after all of them.
const ANY_NODE: u32 = (1 << 28) - 1;

impl Ev {
    /// Orders the events of one millisecond by what they are, not by when
    /// they were scheduled (see `queue`): by the node they are for, then
    /// a node's wake before what it is handed (a peer fires what is due
    /// before an input anyway), then by kind and sender. A run that leaves
    /// out a wake which would have done nothing takes the rest of that
    /// millisecond in the same order as a run that steps it. Events for
    /// no one node come after every node's.
    pub(super) fn key(&self) -> u64 {
        let (node, rank, by) = match self {
            Ev::Timer { node, .. } | Ev::Wake { node, .. } => (*node, 0, 0),
            Ev::Up(n) | Ev::Restart(n) => (*n, 1, 0),
            Ev::Resume(n) => (*n, 2, 0),
            Ev::Introduce { node, to } => (*node, 3, *to),
            Ev::Deliver { to, from, .. } | Ev::QuietSwim { to, from, .. } => (*to, 4, *from),
            Ev::Arrived { to, from, .. } => (*to, 5, *from),
            Ev::Served { to, from, .. } => (*to, 6, *from),
            Ev::TaskEnd { node, task, .. } => (*node, 7, task.task.index),
            Ev::Fetched { home, from, .. } => (*home, 8, *from),
            Ev::InputsReady { node, .. } => (*node, 9, 0),
            Ev::BatchAnswer { node, .. } => (*node, 10, 0),
            Ev::Leave(n) => (*n, 11, 0),
            Ev::Gone(n) => (*n, 12, 0),
            Ev::Crash(n) => (*n, 13, 0),
            Ev::Submit => (ANY_NODE, 0, 0),
            Ev::AllocAdd(q) => (ANY_NODE, 1, *q),
            Ev::JobStart(j) => (ANY_NODE, 2, *j),
            Ev::JobEnd { job, .. } => (ANY_NODE, 3, *job),
            Ev::JobKill(j) => (ANY_NODE, 4, *j),
            Ev::MeshCheck => (ANY_NODE, 5, 0),
        };
        (u64::from(node) << 36) | (rank << 32) | u64::from(by)
    }
}
