//! What nodes say to each other over the network, and the limits on it.
//!
//! Everything is encoded with postcard. Peer-to-peer requests carry either a
//! message for the receiver's [`crate::mesh::Peer`] or a data transfer
//! (input blobs, collected outputs), which the node handles itself.
//! Heartbeats travel by gossip as [`crate::mesh::Msg::Beat`].

use serde::{Deserialize, Serialize};

use crate::farm::TaskRef;
use crate::mesh::{FarmId, Msg};

/// Bumped whenever a message changes shape; peers with another version are refused.
pub const PROTOCOL_VERSION: u32 = 2;
/// The libp2p protocol names carry the version, so an old node cannot even talk the new one.
pub const REQUEST_PROTOCOL: &str = "/mesh/req/2";
pub const GOSSIP_TOPIC: &str = "mesh/beat/2";
/// No single request or response may be larger (a frame of the request-response codec).
pub const MESSAGE_MAX: usize = 64 << 20;
/// Files move in pieces of at most this many bytes.
pub const CHUNK_MAX: usize = 8 << 20;
/// A single input or output file may be at most this large.
pub const FILE_MAX: u64 = 4 << 30;

/// A request from one node to another.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum Request {
    /// For the receiver's engine; answered with [`Response::Ok`] once taken.
    Peer(Msg),
    /// A piece of an input file of `farm`, by its blake3 hash.
    GetBlob {
        farm: FarmId,
        hash: [u8; 32],
        offset: u64,
    },
    /// A piece of one output file of a finished task, for the submitter's
    /// `out` tree. `hash` is the whole file's blake3, checked on arrival.
    PutOutput {
        farm: FarmId,
        task: TaskRef,
        /// Relative to the task's output folder.
        path: String,
        hash: [u8; 32],
        size: u64,
        offset: u64,
        data: Vec<u8>,
    },
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum Response {
    Ok,
    /// A piece of a blob, and the blob's whole size.
    Blob {
        size: u64,
        data: Vec<u8>,
    },
    Error(String),
}
