//! A mesh node: the tokio loop that drives a [`Peer`] with a libp2p swarm, real processes, the sled store and the control socket.
//!
//! Each turn of the loop feeds the peer one input (a message, a finished
//! task, a timer, a control request), drains its actions, writes every
//! `Persist` as one batch and flushes, and only then sends, starts or kills
//! (the same group commit as the single-machine runner). Slow work (hashing
//! inputs, fetching and serving files, running tasks) happens in spawned
//! futures that come back to the loop through one channel.

mod driver;
mod events;
mod handle;
mod home;
mod inbound;
mod kept;
mod net;
mod refusals;
mod reply;
mod runs;
mod source;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use libp2p::request_response::ResponseChannel;
use libp2p::PeerId;
use mesh_protocol::engine::Outcome;
use mesh_protocol::farm::TaskRef;
use mesh_protocol::mesh::{
    AllocBook, Assigned, Beat, Config, Entry, FarmId, FarmLog, FarmProgress, FarmSpec, Member, Msg,
    NodeId, OutputFile, Peer, Stats,
};
use mesh_protocol::observe::Latencies;
use mesh_protocol::wire::{FoundFarm, Request, Response};
use mesh_protocol::Resources;
use mesh_store::{MeshState, SledStore, Store, StoreError};
use tokio::sync::oneshot;

use crate::alloc::batch;
use crate::control::ControlRequest;
use crate::executor::Live;
use crate::keys;
use crate::{runtime, IoError};
use handle::LoopHandle;
use home::Asked;
use net::Net;
use reply::Reply;
use runs::{FetchError, Runs};

/// Addresses as `mesh node` prints them and `mesh join` takes them.
pub use libp2p::Multiaddr;

pub use crate::dash::dashboard_line;

pub struct NodeOptions {
    pub state: PathBuf,
    pub listen: Vec<Multiaddr>,
    /// Bootstrap from these peers (`mesh join`): any one answering will do.
    pub join: Vec<Multiaddr>,
    pub resources: Resources,
    /// Its GPUs, as tasks name them, one per device of `resources`' `gpu`.
    pub gpus: Vec<crate::gpus::Gpu>,
    /// The mesh secret; `<state>/mesh.key` unless given.
    pub key: PathBuf,
    /// Serve the dashboard here (`--http`).
    pub http: Option<std::net::SocketAddr>,
    /// Drain and stop this long after starting (a batch job's walltime less
    /// a margin): tasks here are handed back as on Ctrl-C.
    pub drain_after: Option<std::time::Duration>,
    /// The batch job that started this node (`mesh alloc`), as the batch
    /// system lists it.
    pub alloc_job: Option<String>,
    pub config: Config,
    /// Find nodes on the LAN by mDNS (needs the `mdns` feature).
    pub mdns: bool,
    /// The state folder is on a file system every node sees at the same
    /// path (`--shared-fs`; found by itself on network file systems): a
    /// farm's home takes outputs kept here in place, not over the mesh.
    pub shared_fs: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error(transparent)]
    Key(#[from] keys::KeyError),
    #[error(transparent)]
    Net(#[from] crate::net::NetError),
    #[error("state store: {0}")]
    Store(#[from] StoreError),
    #[error("another mesh node already uses the state folder {0}")]
    Busy(String),
    #[error("cannot read this node's state in {path}; if it is damaged, move it aside (`mv {path} {path}.damaged`) and start the node again (it rejoins the peers it is given, and the other nodes of the mesh keep the farms it held)")]
    Damaged {
        path: String,
        #[source]
        source: StoreError,
    },
    #[error("cannot join {addr}: {why}")]
    Join { addr: String, why: String },
    #[error(transparent)]
    Dashboard(#[from] crate::dash::HttpError),
    #[error(transparent)]
    Io(#[from] IoError),
}

/// What reaches the node's loop through its [`LoopHandle`]: something
/// that ended or arrived, or a call that waits for the loop's answer.
enum Cmd {
    Event(Event),
    Call(Call),
}

/// Something that ended or arrived off the loop, for the loop to act on.
enum Event {
    Finished(Assigned, Outcome, Vec<OutputFile>),
    /// A frame of messages for the engine from a peer's stream.
    Peer(PeerId, Vec<Msg>),
    /// The home brought a task's outputs, or could not.
    Fetched(FarmId, TaskRef, Result<(), FetchError>),
    /// This node brought a farm's inputs into its cache, or could not.
    InputsFetched(FarmId, Result<(), FetchError>),
    /// A membership packet, opened (see `swim.rs`).
    Swim(Vec<u8>),
    /// A message for the engine that came as a packet (a beat), and its sender.
    Packet(NodeId, Msg),
    /// The coordinator's answer about a farm this node does not hold.
    Found(Box<Result<FoundFarm, refusals::QueryError>>, Asked),
    Launched(Assigned, Live),
    /// A task that waited here for a dependency being made again goes back
    /// to the coordinator unstarted (its `Finished` follows): its slot is
    /// free for the run it waits for.
    GiveBack(Assigned),
    /// Another node's request, answered off the loop: the answer to send.
    Answered(ResponseChannel<Response>, Response),
    /// Bytes of a farm's outputs came home (at most once a second a transfer).
    Moved(FarmId),
    /// An estimate of a farm's end, and how long it took to make.
    Estimated(FarmId, Option<crate::eta::Eta>, std::time::Duration),
    /// A farm to submit, its inputs hashed, and per stage whether its
    /// earlier results may be reused (not when `--rerun` names it).
    /// An open farm's next generation, made off the loop, to offer.
    /// With each task's key unless its tasks all run (`rerun`).
    Grow(
        Result<(FarmSpec, Option<kept::TaskKeys>), home::GrowError>,
        Reply,
    ),
    Submit(
        Result<(FarmSpec, kept::TaskKeys), runs::SubmitError>,
        Vec<bool>,
        Reply,
    ),
    /// A farm to submit once the homes of earlier farms of its name said
    /// which of its tasks' results they keep: with those, as entries.
    SubmitReused(Box<FarmSpec>, Vec<Entry>, Reply),
    /// A batch command (`mesh alloc`) ended.
    Batch(batch::Done),
    /// A follower of a farm's tasks has room again (see `feed.rs`).
    Feed(FarmId),
}

/// A call through the [`LoopHandle`]: the loop answers on the channel it carries.
enum Call {
    Request {
        to: NodeId,
        req: Request,
        reply: oneshot::Sender<refusals::Answer>,
    },
    /// A request for whichever node coordinates now.
    AskCoordinator {
        req: Request,
        reply: oneshot::Sender<refusals::Answer>,
    },
    /// The peer id of a node (dialled if need be), for a transfer.
    PeerOf(NodeId, oneshot::Sender<Option<PeerId>>),
    Control(ControlRequest, Reply),
}

/// A node's state, owned by its loop; each module of this folder is an
/// `impl Node` block over it. Its parts are grouped by what they are for,
/// so that a method can hold one part while it changes another.
struct Node {
    state: PathBuf,
    peer: Peer,
    me: NodeId,
    /// Which life of this node this is (the wall clock at start): later
    /// than any before, so the mesh tells a restart from a late packet.
    life: u64,
    clock: Instant,
    handle: LoopHandle,
    /// The store and the outputs kept on disk.
    disk: Disk,
    /// The swarm, the nodes known, the streams to them and how they are reached.
    net: Net,
    /// The attempts this node runs, and those waiting to.
    /// The attempts this node runs and those waiting to, the files they
    /// move, and the record of their runs.
    runs: Runs,
    /// Earlier farms' results kept here by content key, for later ones.
    kept: kept::Kept,
    /// The farms submitted here, and the clients that follow them.
    home: home::Home,
    /// What the person running this node hears, and how they asked it to stop.
    user: User,
}

/// What a node keeps on disk: the store, how the peer's persists map to
/// it, and the size of the outputs it keeps for farms' homes.
struct Disk {
    store: SledStore,
    /// How the peer's persists map to the store.
    book: MeshState,
    /// Bytes under `<state>/kept` as last counted, and when: a status
    /// page asks every second, and a node may keep many files.
    kept_count: std::cell::Cell<Option<(Instant, u64)>>,
}

impl Disk {
    /// Writes `batch` and flushes it, so that what follows may count on it.
    fn write_flushed(&mut self, batch: Vec<mesh_store::Write>) -> Result<(), StoreError> {
        self.store.write(batch)?;
        self.store.flush()
    }
}

/// The person running this node: the lines they see, kept few, and
/// whether they asked it twice to stop.
struct User {
    out: Box<dyn FnMut(&str)>,
    /// This process's open-file limit, and whether this node has said
    /// the mesh outgrew it.
    files: crate::limits::OpenFiles,
    files_told: bool,
    /// Stopped twice (a second Ctrl-C): no lingering.
    impatient: bool,
}

impl net::Members for Peer {
    fn address_of(&self, n: NodeId) -> Option<(&str, &[String])> {
        Peer::address_of(self, n)
    }

    fn addresses(&self) -> Vec<String> {
        self.members()
            .flat_map(|m| m.addrs().iter().cloned())
            .collect()
    }
}

impl runs::Farms for Peer {
    fn spec(&self, farm: FarmId) -> Option<&Arc<FarmSpec>> {
        Peer::spec(self, farm)
    }

    fn replica(&self, farm: FarmId) -> Option<&mesh_protocol::mesh::Replica> {
        Peer::replica(self, farm)
    }

    fn replicas(&self) -> Box<dyn Iterator<Item = &mesh_protocol::mesh::Replica> + '_> {
        Box::new(Peer::replicas(self))
    }

    fn coordinator(&self) -> Option<NodeId> {
        Peer::coordinator(self)
    }

    fn member_ids(&self) -> Vec<NodeId> {
        self.members().map(|m| m.id).collect()
    }
}

impl home::Mesh for Peer {
    fn specs(&self) -> Box<dyn Iterator<Item = &Arc<FarmSpec>> + '_> {
        Box::new(Self::specs(self))
    }
    fn members(&self) -> Box<dyn Iterator<Item = Member<'_>> + '_> {
        Box::new(Self::members(self))
    }
    fn coordinated(&self) -> Vec<FarmId> {
        Self::coordinated(self)
    }
    fn coordinated_farm(
        &self,
        farm: FarmId,
        failures_max: usize,
    ) -> Option<(mesh_protocol::mesh::Home, FarmProgress, Vec<Entry>)> {
        Self::coordinated_farm(self, farm, failures_max)
    }
    fn coordinated_log(&self, farm: FarmId) -> Option<&FarmLog> {
        Self::coordinated_log(self, farm)
    }
    fn where_ran(&self, farm: FarmId, task: TaskRef) -> Option<(NodeId, bool)> {
        Self::where_ran(self, farm, task)
    }
    fn runs(&self, farm: FarmId, task: TaskRef) -> bool {
        Self::runs(self, farm, task)
    }
    fn beat(&self) -> Beat {
        Self::beat(self)
    }
    fn node_beats(&self) -> Vec<(String, Arc<Beat>)> {
        Self::node_beats(self)
    }
    fn term(&self) -> u64 {
        Self::term(self)
    }
    fn stats(&self) -> &Stats {
        Self::stats(self)
    }
    fn latencies(&self) -> Option<(&Latencies, u64)> {
        Self::latencies(self)
    }
    fn alloc_book(&self) -> &Arc<AllocBook> {
        Self::alloc_book(self)
    }
}

/// Runs a node until SIGINT or SIGTERM; `out` hears the lines a user sees.
pub fn run_node(opts: NodeOptions, out: Box<dyn FnMut(&str)>) -> Result<(), NodeError> {
    runtime()?.block_on(driver::drive(opts, out))
}

/// How users name a farm: its name and the start of its mesh id.
pub fn farm_display_id(name: &str, id: FarmId) -> String {
    format!("{name}-{:08x}", id.0 >> 32)
}
