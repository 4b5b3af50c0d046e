//! Why a request got no answer of its own: one to another node (`RequestError`), or a control request about a farm (`QueryError`), kept apart from the rooms that raise them so that none of those rooms needs another for its errors.

use std::time::Duration;

use libp2p::request_response;
use mesh_protocol::mesh::NodeId;
use mesh_protocol::wire::Response;

use crate::control::{ControlResponse, ErrorKind};

/// How long a question about a farm this node does not hold waits for a
/// coordinator to answer: longer than a dead one takes to be found dead
/// and another elected.
pub(super) const FIND_WAIT: Duration = Duration::from_secs(60);

pub(super) type Answer = Result<Response, RequestError>;

/// Why a request to another node got no answer of its own.
#[derive(Debug, thiserror::Error)]
pub(super) enum RequestError {
    #[error("the node is stopping")]
    Stopping,
    #[error("node {0} is not a member this node knows")]
    NotMember(NodeId),
    #[error("no coordinator is elected yet")]
    NoCoordinator,
    /// It did not reach the node, or no answer came back.
    #[error(transparent)]
    Failed(#[from] request_response::OutboundFailure),
    /// The node answered [`Response::Error`]: its words, which crossed the wire.
    #[error("{0}")]
    Refused(String),
}

/// Why a control request about a farm is refused: said to the client as
/// [`ControlResponse::Error`] of its [`kind`](QueryError::kind), in these words.
#[derive(Debug, thiserror::Error)]
pub(super) enum QueryError {
    #[error("no farm `{0}` is known here")]
    Unknown(String),
    /// `mesh logs TASK` with no farm named, and no farm known here has its stage.
    #[error("no farm known here has a task {0}")]
    NoFarmWith(String),
    #[error("`{0}` matches several farms; give the full id")]
    Ambiguous(String),
    /// Asked of a farm whose home is this node (`wait`, `cancel`, events).
    #[error("{0}; a farm whose home is another node is followed there, or taken over here with `mesh resume FARM --out DIR`")]
    NotHome(Box<QueryError>),
    #[error("no farm `{0}` is known to this mesh (see `mesh status`)")]
    NotInMesh(String),
    /// The coordinator's answer to another node's `FindFarm`.
    #[error("no farm `{0}` is known to this mesh")]
    UnknownToMesh(String),
    #[error("the node is stopping")]
    Stopping,
    #[error("unexpected answer from the coordinator")]
    Unexpected,
    /// The coordinator's [`Response::Error`] to a `FindFarm`, in its words.
    #[error("{0}")]
    Refused(String),
    #[error("no coordinator answered for {} s ({why}); see `mesh status`", FIND_WAIT.as_secs())]
    NoCoordinator { why: RequestError },
    #[error("no task state `{0}`: ask for done, failed or unfinished")]
    NoSuchState(String),
    #[error("this node keeps no copy of the farm's log: ask its home")]
    NoCopy,
    /// `mesh resume` of a farm whose home is another node, with no `--out`.
    #[error("the home of {farm} is {home}; to collect its outputs on this node, give --out DIR")]
    HomeElsewhere { farm: String, home: String },
    /// `mesh resume --out` elsewhere of a farm this node is the home of and told the end of.
    #[error("{farm} has finished: every output is in {out} on this node; copy that folder")]
    Finished { farm: String, out: String },
}

impl QueryError {
    /// The kind a client reads this as.
    pub(super) fn kind(&self) -> ErrorKind {
        match self {
            QueryError::Unknown(_)
            | QueryError::NoFarmWith(_)
            | QueryError::NotInMesh(_)
            | QueryError::UnknownToMesh(_) => ErrorKind::UnknownFarm,
            // A coordinator refuses a `FindFarm` for one reason only, a
            // farm it does not know (`inbound.rs`): its words say which.
            QueryError::Refused(_) => ErrorKind::UnknownFarm,
            QueryError::NotHome(e) => e.kind(),
            QueryError::Ambiguous(_)
            | QueryError::Stopping
            | QueryError::Unexpected
            | QueryError::NoCoordinator { .. }
            | QueryError::NoSuchState(_)
            | QueryError::NoCopy
            | QueryError::HomeElsewhere { .. }
            | QueryError::Finished { .. } => ErrorKind::Refused,
        }
    }

    /// This refusal as the client hears it.
    pub(super) fn said(&self) -> ControlResponse {
        ControlResponse::error(self.kind(), self.to_string())
    }
}
