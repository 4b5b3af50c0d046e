//! What nodes say to each other over the network, and the limits on it.
//!
//! Everything is encoded with postcard. Messages for the receiver's
//! [`crate::mesh::Peer`] travel as frames of `Vec<Msg>` on one long-lived
//! stream per pair of nodes and direction ([`PEER_PROTOCOL`]); requests
//! ask a node for what it serves itself (logs, what it knows of a farm);
//! a file moves as one flow on a stream of its own ([`DATA_PROTOCOL`]:
//! [`DataAsk`], [`DataHead`], [`DataFrom`], then the bytes). Membership
//! packets travel on UDP beside them, sealed with the mesh key, as
//! [`crate::mesh::Action::Swim`] says.

use serde::{Deserialize, Serialize};

use crate::farm::TaskRef;
use crate::mesh::{Entry, FarmId, FarmProgress, FarmSpec, Home, NodeId, OutputFile};
use crate::observe::Observation;
use crate::pieces::Pieces;

/// Bumped whenever a message changes shape; peers with another version are refused.
pub const PROTOCOL_VERSION: u32 = 30;
/// The libp2p protocol names carry the version, so an old node cannot even talk the new one.
pub const REQUEST_PROTOCOL: &str = "/mesh/req/13";
/// The stream that carries messages for a peer's engine, in order.
pub const PEER_PROTOCOL: &str = "/mesh/peer/10";
/// A file's bytes, one stream per file: the receiver opens it.
pub const DATA_PROTOCOL: &str = "/mesh/data/1";
/// No single request, response or frame of messages may be larger.
pub const MESSAGE_MAX: usize = 64 << 20;

/// The first frame on a [`DATA_PROTOCOL`] stream: a file of `farm` by its
/// blake3 hash, an input (from any node that has it) or a finished task's
/// output (from the node that keeps it until the farm's home has it).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DataAsk {
    /// Which farm the file belongs to.
    pub farm: FarmId,
    /// The file's blake3 hash.
    pub hash: [u8; 32],
}

/// The sender's answer to a [`DataAsk`].
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum DataHead {
    /// Its size and pieces (checked against the hash before any byte is
    /// taken); `at`, where the sender keeps it, when that is on a file
    /// system other nodes may see (the receiver takes it from there when
    /// it sees it, with the same hash).
    File {
        /// Its size and its pieces' chaining values (see [`Pieces`]).
        pieces: Pieces,
        /// Where the sender keeps it, when that is on a shared file system.
        at: Option<String>,
    },
    /// The sender gives no file, and why.
    Refused(Refusal),
}

/// Why a sender gives no file: the receiver acts on which (a file the
/// node does not keep has its task run again; an unreadable one is asked
/// for again later).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum Refusal {
    /// The node keeps no file of that hash for the farm.
    #[error("no such file on this node")]
    NoSuchFile,
    /// `why`: the sender's I/O error, which crosses the wire as its words.
    #[error("cannot read {path}: {why}")]
    Unreadable {
        /// Where the node keeps the file.
        path: String,
        /// The I/O error, in words.
        why: String,
    },
}

/// The receiver's answer to [`DataHead::File`]: send the bytes from
/// `offset` to the end (what it has is verified up to there), or none
/// (`None`: it has the file, or took it from `at`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DataFrom {
    /// Where to start sending (what comes before is verified); none: send nothing.
    pub offset: Option<u64>,
}

/// A request from one node to another.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum Request {
    /// A farm by id, id prefix or name, asked of the coordinator by a node
    /// that does not hold it (`mesh status FARM`, `mesh resume FARM` there).
    FindFarm {
        /// An id, an id's prefix, or a name.
        query: String,
    },
    /// Every farm the coordinator has, in short (`mesh list` on another node).
    ListFarms,
    /// Which node runs or ran a task, asked of the coordinator (`mesh logs`).
    WhereRan {
        /// Which farm the task is of.
        farm: FarmId,
        /// Which task.
        task: TaskRef,
    },
    /// A task's logs from the node that ran it, from these offsets of its
    /// stdout and stderr (`attempt`: the latest that wrote some).
    TaskLog {
        /// Which farm the task is of.
        farm: FarmId,
        /// Which task.
        task: TaskRef,
        /// Which attempt's logs; none: the latest that wrote some.
        attempt: Option<u32>,
        /// Where to start in its stdout and its stderr, in bytes.
        offsets: (u64, u64),
    },
    /// What the node measures of itself, with the task runs that changed
    /// after `since` (the dashboard's task stream, `mesh status --latency`).
    Observe {
        /// The last [`RunRecord::changed`](crate::observe::RunRecord::changed)
        /// the asker saw (0: every run kept).
        since: u64,
    },
    /// Every node as the coordinator last heard it (its beats): `mesh
    /// status`, `mesh watch` and the dashboard ask the coordinator this,
    /// one request, rather than each node.
    Nodes,
    /// Which of these content keys the node keeps the outputs of, whole:
    /// asked by a node a farm is submitted to, of the homes of earlier
    /// farms of the same name, to reuse what they made.
    Kept {
        /// The content keys asked about.
        keys: Vec<[u8; 32]>,
    },
    /// The outputs of what a task depends on, asked of the coordinator by a
    /// node about to run it off the farm's home: they are put in that
    /// node's own `{out}` folder first.
    DepOutputs {
        /// Which farm the task is of.
        farm: FarmId,
        /// The task about to run.
        task: TaskRef,
    },
}

/// A node's answer to a [`Request`].
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum Response {
    /// A farm found by [`Request::FindFarm`].
    Farm(Box<FoundFarm>),
    /// Answer to [`Request::ListFarms`].
    Farms(Vec<FarmSummary>),
    /// Answer to [`Request::WhereRan`]: the node, and whether it runs it now.
    Ran {
        /// The node that runs or ran it; none when not known to have run.
        node: Option<NodeId>,
        /// Whether it runs there now.
        running: bool,
    },
    /// Answer to [`Request::TaskLog`]: what follows the offsets (bounded),
    /// and whether the task still runs there.
    Log {
        /// The attempt whose logs these are; none when no attempt wrote any there.
        attempt: Option<u32>,
        /// Its stdout from the asked offset on.
        out: Vec<u8>,
        /// Its stderr from the asked offset on.
        err: Vec<u8>,
        /// Whether the task still runs on that node.
        running: bool,
    },
    /// Answer to [`Request::Observe`].
    Observed(Box<Observation>),
    /// Answer to [`Request::Nodes`]: each node's peer id and last beat,
    /// the coordinator's own first.
    Nodes(Vec<(String, std::sync::Arc<crate::mesh::Beat>)>),
    /// Answer to [`Request::Kept`]: each key kept whole here with its
    /// outputs, which the node serves by hash from then on, and what its
    /// run grew (see [`crate::engine::Outcome::grew`]).
    Kept(Vec<([u8; 32], Vec<OutputFile>, Option<u32>)>),
    /// Answer to [`Request::DepOutputs`].
    DepOutputs(DepOutputs),
    /// A refusal, in the words of the node that refuses (its error types
    /// say them), which the asker passes on; an asker that acts on a kind
    /// gets an answer of its own (a file's is [`Refusal`]).
    Error(String),
}

/// The outputs of the tasks one task depends on, as the farm's log has
/// them (see [`Request::DepOutputs`]).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct DepOutputs {
    /// Each done dependency that left outputs, with the node that ran it
    /// (and keeps them until the home has them).
    pub done: Vec<(TaskRef, NodeId, Vec<OutputFile>)>,
    /// Dependencies not done now (a run lost with its node, made again):
    /// the asker waits and asks again.
    pub waiting: u64,
    /// The farm's home, which has every output once it is collected.
    pub home: Option<NodeId>,
}

/// A farm as the coordinator knows it, for a node that does not hold it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FoundFarm {
    /// The farm's definition, submitter and inputs.
    pub spec: FarmSpec,
    /// Its home, as the coordinator knows it.
    pub home: Home,
    /// Where it stands, as the coordinator's copy says.
    pub progress: FarmProgress,
    /// Tasks failed for good, with their reasons (the first few).
    pub failures: Vec<Entry>,
}

/// A farm in short, for `mesh list`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FarmSummary {
    /// Which farm.
    pub id: FarmId,
    /// Its name, as its file says.
    pub name: String,
    /// Its home, as the coordinator knows it.
    pub home: Home,
    /// Where it stands, as the coordinator's copy says.
    pub progress: FarmProgress,
    /// It still takes stages (see [`crate::mesh::FarmSpec::open`]).
    pub open: bool,
}
