//! What nodes say to each other over the network, and the limits on it.
//!
//! Everything is encoded with postcard. Peer-to-peer requests carry either a
//! message for the receiver's [`crate::mesh::Peer`] or a piece of a file
//! (an input, or an output on its way home), which the node serves itself.
//! Heartbeats travel by gossip as [`crate::mesh::Msg::Beat`].

use serde::{Deserialize, Serialize};

use crate::farm::TaskRef;
use crate::mesh::{Entry, FarmId, FarmProgress, FarmSpec, Home, Msg, NodeId};
use crate::observe::Observation;

/// Bumped whenever a message changes shape; peers with another version are refused.
pub const PROTOCOL_VERSION: u32 = 7;
/// The libp2p protocol names carry the version, so an old node cannot even talk the new one.
pub const REQUEST_PROTOCOL: &str = "/mesh/req/5";
pub const GOSSIP_TOPIC: &str = "mesh/beat/5";
/// No single request or response may be larger (a frame of the request-response codec).
pub const MESSAGE_MAX: usize = 64 << 20;
/// Files move in pieces of at most this many bytes.
pub const CHUNK_MAX: usize = 8 << 20;
/// A single input or output file may be at most this large.
pub const FILE_MAX: u64 = 4 << 30;

/// A request from one node to another.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum Request {
    /// For the receiver's engine, in order (one, or what a node had for
    /// this peer while its last request there was unanswered); answered
    /// once taken, with [`Response::Peer`] when taking them gave the
    /// receiver something to say back, else [`Response::Ok`].
    Peer(Vec<Msg>),
    /// A farm by id, id prefix or name, asked of the coordinator by a node
    /// that does not hold it (`mesh status FARM`, `mesh resume FARM` there).
    FindFarm { query: String },
    /// Every farm the coordinator has, in short (`mesh list` on another node).
    ListFarms,
    /// Which node runs or ran a task, asked of the coordinator (`mesh logs`).
    WhereRan { farm: FarmId, task: TaskRef },
    /// A task's logs from the node that ran it, from these offsets of its
    /// stdout and stderr (`attempt`: the latest that wrote some).
    TaskLog {
        farm: FarmId,
        task: TaskRef,
        attempt: Option<u32>,
        offsets: (u64, u64),
    },
    /// A piece of a file of `farm` by its blake3 hash: an input (from any
    /// node that has it) or a finished task's output (from the node that
    /// keeps it until the farm's home has it).
    GetBlob {
        farm: FarmId,
        hash: [u8; 32],
        offset: u64,
    },
    /// What the node measures of itself, with the task runs that changed
    /// after `since` (the dashboard, `mesh status`, `/metrics` of another node).
    Observe { since: u64 },
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum Response {
    Ok,
    /// Answer to [`Request::Peer`]: messages for the asker's engine that
    /// the receiver had for it once it took the request (an ack and the
    /// next tasks for a report, say), carried back on the same exchange
    /// instead of a request of their own.
    Peer(Vec<Msg>),
    /// A farm found by [`Request::FindFarm`].
    Farm(Box<FoundFarm>),
    /// Answer to [`Request::ListFarms`].
    Farms(Vec<FarmSummary>),
    /// Answer to [`Request::WhereRan`]: the node, and whether it runs it now.
    Ran {
        node: Option<NodeId>,
        running: bool,
    },
    /// Answer to [`Request::TaskLog`]: what follows the offsets (bounded),
    /// and whether the task still runs there.
    Log {
        attempt: Option<u32>,
        out: Vec<u8>,
        err: Vec<u8>,
        running: bool,
    },
    /// A piece of a blob, and the blob's whole size.
    Blob {
        size: u64,
        data: Vec<u8>,
    },
    /// Answer to [`Request::Observe`].
    Observed(Box<Observation>),
    Error(String),
}

/// A farm as the coordinator knows it, for a node that does not hold it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FoundFarm {
    pub spec: FarmSpec,
    pub home: Home,
    pub progress: FarmProgress,
    /// Tasks failed for good, with their reasons (the first few).
    pub failures: Vec<Entry>,
}

/// A farm in short, for `mesh list`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FarmSummary {
    pub id: FarmId,
    pub name: String,
    pub home: Home,
    pub progress: FarmProgress,
}
