//! The control requests: what `mesh submit`, `wait`, `cancel`, `status` and the rest say to a node, on this machine or over the mesh's network.
//!
//! One JSON request per connection, answered by JSON lines. On the node's
//! machine they go through a Unix socket in the state folder with
//! owner-only permissions: whoever can write to it can run commands as the
//! node's user. From a machine that runs no node (a cluster's login node,
//! `mesh --mesh ADDR`) the same lines go on a libp2p stream
//! ([`CONTROL_PROTOCOL`]) over the connection nodes use among themselves:
//! behind the mesh key, so whoever holds mesh.key may command the mesh, as
//! they may already join it and run tasks on it.

use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use std::collections::HashMap;

use mesh_protocol::alloc::QueueDef;
use mesh_protocol::farm::FarmDef;
use mesh_protocol::mesh::{AllocBook, AllocCmd};

use crate::launched::Launch;
use crate::view::{FarmView, MeshStatus, Observed};
use libp2p::Multiaddr;
use serde::{Deserialize, Serialize};

/// The control requests on a libp2p stream. The build's version is in the
/// name: the JSON follows these enums, which change between versions, so
/// a command line and a node of different builds refuse each other by
/// name instead of misreading a request.
pub const CONTROL_PROTOCOL: &str = concat!("/mesh/control/", env!("CARGO_PKG_VERSION"));

/// The version of the documented control API (docs/api.md): the requests
/// and answers a client outside this build (the Python package) may use,
/// with the shapes written there. Raised when one of them changes shape;
/// a client says its version first ([`ControlRequest::Hello`]) and a node
/// of another version answers with an error that names both, instead of
/// misreading what follows. 2: a refusal says its kind ([`ErrorKind`]),
/// where 1 said words only; 3: a client's calls come as data
/// ([`ControlRequest::Calls`], answered [`ControlResponse::Named`] first).
pub const CONTROL_API: u32 = 3;

/// What kind of refusal a [`ControlResponse::Error`] is: the part of it a
/// client acts on, so that no client reads a kind from the words (which
/// are for people, and change). On the wire a snake_case name,
/// `{"Error": {"kind": "unknown_farm", "message": "..."}}` (docs/api.md).
/// A kind is added only for what some client does differently; the rest
/// are `Refused`, shown as they are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// No farm by that name or id is known (to this node, or to the mesh):
    /// the command line looks for a `mesh run` farm of this machine instead.
    UnknownFarm,
    /// Stages sent to a farm that is closed (its client's hold was gone
    /// long enough, see `Hold`): a client opens another farm for what it
    /// sends next.
    ClosedFarm,
    /// The node cannot read the request: it runs an older mesh, which
    /// knows fewer requests.
    BadRequest,
    /// The client's hello names a control API ([`CONTROL_API`]) the node
    /// does not speak; the words name both.
    OtherApi,
    /// The last answer to a reader that fell too far behind (see
    /// docs/api.md): it may ask again.
    Lagged,
    /// Said by `mesh control-pipe`, not by a node: the relay could not
    /// reach one (a client reads it as a lost connection).
    Unreachable,
    /// Any other refusal, in words to show. Also what a kind this build
    /// does not know reads as (a newer node's), so that it stays a
    /// refusal and not an unreadable answer.
    #[serde(other)]
    Refused,
}

/// Which node a command talks to.
#[derive(Clone, Debug)]
pub enum Target {
    /// The node of this state folder, through its control socket.
    Local(PathBuf),
    /// A node of a mesh, at `addr`, over an authenticated connection with
    /// the mesh secret in `key` (`mesh --mesh ADDR`).
    Remote { addr: Multiaddr, key: PathBuf },
}

impl Target {
    /// Whether a missing node here means "no mesh, a farm of `mesh run`".
    pub fn is_local(&self) -> bool {
        matches!(self, Target::Local(_))
    }
}

/// The socket's path in a state folder.
pub fn socket_path(state: &Path) -> PathBuf {
    state.join("node.sock")
}

/// Where a node starting on a state folder marks itself (see [`Starting`]).
fn starting_path(state: &Path) -> PathBuf {
    state.join("node.starting")
}

/// How long a command waits for a node that is starting here to open its
/// socket (its store and network come first; on a cluster's shared file
/// system, opening the store can take seconds).
const START_WAIT: Duration = Duration::from_secs(60);

/// How long a command waits for a node process of its state folder that
/// has not marked itself yet to do so (its exec and first step; see
/// `launched.rs`). With no such process, a command answers at once.
const LAUNCH_WAIT: Duration = Duration::from_secs(10);

/// How long a command waits on a process caught in the middle of an exec,
/// which may be a node (see `launched.rs`).
const EXEC_WAIT: Duration = Duration::from_secs(1);

/// A node starting on a state folder, from its first step until its
/// control socket listens: `node.starting` holds its process id, so a
/// command run at once after it (`mesh join ADDR & mesh submit ...` in a
/// batch script) waits for the node instead of saying none runs. Removed
/// when dropped, if it is still this process's.
pub struct Starting(PathBuf);

impl Starting {
    pub fn mark(state: &Path) -> Starting {
        let path = starting_path(state);
        // Best effort: a node that cannot write its state folder fails
        // right after, with a clearer error.
        let _ = std::fs::write(&path, format!("{}\n", std::process::id()));
        Starting(path)
    }

    /// Whether a live process is starting a node on `state`.
    fn under_way(state: &Path) -> bool {
        std::fs::read_to_string(starting_path(state))
            .ok()
            .and_then(|t| t.trim().parse::<u32>().ok())
            // 0 and what overflows a pid_t would signal a process group.
            .filter(|&p| (1..=i32::MAX as u32).contains(&p))
            .is_some_and(crate::state::pid_alive)
    }
}

impl Drop for Starting {
    fn drop(&mut self) {
        let mine = std::fs::read_to_string(&self.0)
            .is_ok_and(|t| t.trim() == std::process::id().to_string());
        if mine {
            let _ = std::fs::remove_file(&self.0);
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum ControlRequest {
    /// A farm loaded and checked by the CLI; `file` is its canonical path.
    Submit {
        def: Box<FarmDef>,
        file: String,
        /// `--rerun [STAGE...]`: these stages (all when empty) and those
        /// downstream of them run again even where earlier results stand.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        rerun: Option<Vec<String>>,
    },
    /// Follow a farm submitted on this node until it ends.
    Wait {
        farm: String,
    },
    Cancel {
        farm: String,
    },
    /// One task of a farm (`"solve/3"`): it does not start, or is killed;
    /// the tasks that depend on it are skipped. Answered `Cancelled`.
    CancelTask {
        farm: String,
        task: String,
    },
    /// The mesh's nodes as the coordinator hears them (one request to
    /// it, whatever the mesh's size), and this node's own measures.
    Status,
    /// The same, with every node asked for its own measures (latencies,
    /// counters): `mesh status --latency`, a request to each node.
    StatusEvery,
    /// The status and every node's own record, with the task runs each
    /// that changed after `since[node]` (the dashboard, polling).
    Observe {
        since: HashMap<String, u64>,
    },
    /// One farm, from this node's copy or from the coordinator.
    Farm {
        farm: String,
    },
    /// Every farm of the mesh this node or the coordinator knows.
    List,
    /// A task's logs, from whichever node ran it; with `follow`, more as
    /// they are written until the task ends there.
    Logs {
        farm: String,
        task: String,
        attempt: Option<u32>,
        follow: bool,
    },
    /// Continue a mesh farm with this node as its home (outputs to `out`,
    /// every one of them brought there); nothing finished runs again.
    Resume {
        farm: String,
        out: Option<String>,
    },
    /// A change to the allocation queues (`mesh alloc add|remove|pause|resume`),
    /// answered with the book once this node's copy shows it.
    Alloc(AllocCmd),
    /// The allocation queues, their jobs and their log.
    Allocs,
    /// The batch script a queue would submit from this node (`--dry-run`).
    AllocScript(QueueDef),
    /// A client outside this build says which control API it speaks
    /// ([`CONTROL_API`]); answered with [`ControlResponse::Hello`], or an
    /// error naming both versions.
    Hello {
        api: u32,
    },
    /// A farm file's text, checked by this node as `mesh check` checks a
    /// file (the same located errors), and submitted unless `check`.
    /// `file` names it in messages and its folder is the farm's folder.
    /// The outputs go to `out`, taken from `cwd` when relative, by default
    /// `mesh-out/<name>` there, as the command line's `--out` from the
    /// folder it runs in (`cwd` defaults to the farm's folder). Answered
    /// with a [`ControlResponse::Warning`] per warning, then `Submitted`
    /// (or `Checked`), or `Invalid`.
    SubmitFarm {
        toml: String,
        file: String,
        #[serde(default)]
        out: Option<String>,
        #[serde(default)]
        cwd: Option<String>,
        #[serde(default)]
        rerun: Option<Vec<String>>,
        #[serde(default)]
        check: bool,
        /// The farm is open: `Grow` adds stages to it while it runs, and
        /// it ends only once closed (a client's calls, a workflow's jobs).
        #[serde(default)]
        open: bool,
    },
    /// Adds stages to an open farm whose home is this node: `toml` is a
    /// farm file of the new stages only (its `[farm]` table is not read),
    /// which may depend on the farm's stages by name; `file` names it in
    /// messages, and its folder must be the farm's. `close`: nothing more
    /// comes, and the farm ends once its tasks do (`toml` may be empty).
    /// An added task whose result this node keeps (by content key, see
    /// `SubmitFarm`) is done from the start unless `rerun`.
    /// Answered as `SubmitFarm` is, `Submitted` once the new stages are
    /// durable.
    Grow {
        farm: String,
        #[serde(default)]
        toml: String,
        file: String,
        #[serde(default)]
        close: bool,
        /// Run every added task, reusing no earlier result (as `SubmitFarm`
        /// with every stage in `rerun`): a workflow manager's jobs, which it
        /// decided must run.
        #[serde(default)]
        rerun: bool,
    },
    /// A client's function calls as data (see [`crate::calls`]): added as
    /// one growth to the open farm `farm` names, whose home is this node,
    /// or, with `new`, opening a farm of them. Answered with `Named` (each
    /// call's task, once its stage is made), then as `Grow` is (`Submitted`
    /// once durable, or a refusal; a call that cannot be run as sent is
    /// refused with its key and field, and none of the batch runs).
    Calls(Box<crate::calls::CallBatch>),
    /// Holds an open farm whose home is this node open while this
    /// connection lasts: answered `Held` now and every half second, and a
    /// last `Held` with `open: false` once the farm is closed. When the
    /// last connection holding it is gone (its client's process ended),
    /// the farm is closed as `Grow` with `close` closes it; with
    /// `cancel`, it is cancelled instead (its running tasks killed, none
    /// started after): a client whose work must not outlive it.
    Hold {
        farm: String,
        #[serde(default)]
        cancel: bool,
    },
    /// Each task of a farm whose home is this node, once, as it ends for
    /// good with its outputs home ([`ControlResponse::Task`]), from the
    /// first; then `Finished`.
    Events {
        farm: String,
    },
    /// The tasks of a farm this node holds that are `done`, `failed`, or
    /// `unfinished` (none of those yet), or all of them; at most `limit`.
    Tasks {
        farm: String,
        #[serde(default)]
        state: Option<String>,
        #[serde(default)]
        limit: Option<u64>,
    },
    /// A farm this node keeps a copy of, as a WfCommons trace (WfFormat
    /// 1.5, see docs/export.md): answered with [`ControlResponse::Trace`].
    Export {
        farm: String,
    },
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum ControlResponse {
    /// The farm is durable on two nodes (one in a mesh of one) and will run.
    Submitted {
        farm: String,
        tasks: u64,
    },
    Progress(FarmView),
    /// The farm is over; the view is final.
    Finished(FarmView),
    Status(Box<MeshStatus>),
    Observed(Box<Observed>),
    Cancelled {
        farm: String,
    },
    Farm(Box<FarmView>),
    /// The farms of the mesh, in short (no stages, no failures).
    List(Vec<FarmView>),
    /// A piece of a task's logs; `done` on the last.
    Log {
        node: String,
        attempt: Option<u32>,
        stdout: Vec<u8>,
        stderr: Vec<u8>,
        done: bool,
        /// What the task's run that counts used, with the last answer, where
        /// the node answering holds the farm's log and the run was measured.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        used: Option<crate::used::TaskUsed>,
    },
    /// This node is the farm's home now; `mesh wait` follows it.
    Resumed {
        farm: String,
        out: String,
        done: u64,
        total: u64,
        /// It was the home already.
        already: bool,
    },
    Allocs(Box<AllocBook>),
    Script(String),
    /// A refusal: what kind, for a client to act on, and the words to show.
    Error {
        kind: ErrorKind,
        message: String,
    },
    /// The node speaks the client's control API.
    Hello {
        api: u32,
        /// The node's build (`mesh --version`).
        version: String,
        /// Its peer id.
        node: String,
    },
    /// Something valid in a farm file but likely a mistake (as `mesh check` warns).
    Warning(String),
    /// The task (`stage/index`) each call of a `Calls` batch is, in the
    /// batch's order: said before the calls can run, so a client knows
    /// each call's end when it is told.
    Named {
        tasks: Vec<String>,
    },
    /// A farm file checked and not submitted (`SubmitFarm` with `check`).
    Checked {
        name: String,
        /// Where its outputs would go.
        out: String,
        tasks: u64,
        /// Each stage with its number of tasks.
        stages: Vec<(String, u64)>,
    },
    /// A farm file with a mistake: the located words of `mesh check`,
    /// and where, when it is about the file's content.
    Invalid {
        message: String,
        file: String,
        line: Option<usize>,
        column: Option<usize>,
        field: Option<String>,
    },
    /// The farm is held (see [`ControlRequest::Hold`]); the last says it
    /// is closed. `gone`: nodes that left the mesh since the last `Held`
    /// (their running tasks run again elsewhere), for the client to say.
    Held {
        farm: String,
        open: bool,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        gone: Vec<String>,
    },
    /// A task that ended for good (see [`ControlRequest::Events`]).
    Task(Box<TaskEvent>),
    Tasks(Vec<TaskEvent>),
    /// A farm as a WfCommons trace: the JSON document itself.
    Trace(Box<serde_json::Value>),
}

impl ControlResponse {
    /// A refusal of this kind, in these words.
    pub fn error(kind: ErrorKind, message: impl Into<String>) -> ControlResponse {
        ControlResponse::Error {
            kind,
            message: message.into(),
        }
    }

    /// An answer after which the node says nothing more on its connection.
    pub fn is_last(&self) -> bool {
        matches!(
            self,
            ControlResponse::Finished(_)
                | ControlResponse::Error { .. }
                | ControlResponse::Submitted { .. }
                | ControlResponse::Status(_)
                | ControlResponse::Cancelled { .. }
                | ControlResponse::Farm(_)
                | ControlResponse::List(_)
                | ControlResponse::Resumed { .. }
                | ControlResponse::Log { done: true, .. }
                | ControlResponse::Hello { .. }
                | ControlResponse::Checked { .. }
                | ControlResponse::Invalid { .. }
                | ControlResponse::Tasks(_)
                | ControlResponse::Trace(_)
                | ControlResponse::Held { open: false, .. }
        )
    }
}

/// A task of a farm as a client sees it: where it stands, and once it
/// ended, how, where it ran, and where its outputs are on the home.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TaskEvent {
    /// `<stage>/<index>`.
    pub task: String,
    pub stage: String,
    pub index: u32,
    /// Its sweep values, by variable, in the stage's order.
    pub params: indexmap::IndexMap<String, String>,
    /// `done`, `failed`, or `unfinished` (in a `Tasks` answer only).
    pub state: String,
    /// The exit code, where it is known: a failure's, or 0 for a task
    /// done in a stage whose only success code is 0.
    pub exit_code: Option<i32>,
    /// The signal that killed it.
    pub signal: Option<i32>,
    /// Why it failed, in the words of `mesh status`.
    pub reason: Option<String>,
    /// The node that ran it (its peer id).
    pub node: Option<String>,
    /// Which attempt ended so; 0 for a result reused from an earlier farm.
    pub attempt: u32,
    /// When that attempt started and ended (Unix ms, by the clock of the
    /// node that ran it, from the farm's log); `None` where the log does
    /// not say (a task reused from an earlier farm).
    pub start_ms: Option<u64>,
    pub end_ms: Option<u64>,
    /// When the node answering had it (Unix ms): the result and its outputs home.
    pub at_ms: u64,
    /// Its outputs, absolute paths on the farm's home.
    pub outputs: Vec<String>,
    /// Its outputs whose bytes rode with its report instead (a Python
    /// call's small value), base64 by path: no file on the home.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub values: std::collections::BTreeMap<String, String>,
    /// What the run that counts used (CPU ms, peak resident bytes, bytes
    /// read and written, killed for memory), where its node measured it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<mesh_protocol::engine::Usage>,
}

#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("no mesh node is running with state folder {}: start one with `mesh node` (or `mesh join ADDR`), or run the farm on this machine alone with `mesh run`", .0.display())]
    NoNode(PathBuf),
    #[error("talking to the node at {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: io::Error,
    },
    #[error("the node sent something unreadable: {0}")]
    Decode(#[from] serde_json::Error),
    #[error(transparent)]
    Key(#[from] crate::keys::KeyError),
    #[error("cannot reach the mesh at {addr}: {why}")]
    Unreachable { addr: String, why: Box<ReachError> },
}

impl ControlError {
    /// The kind a relay (`mesh control-pipe`) says this error as: a node
    /// not reached is `Unreachable`, which a client reads as a lost
    /// connection; a key or an answer it cannot read is a plain refusal.
    pub fn kind(&self) -> ErrorKind {
        match self {
            ControlError::NoNode(_)
            | ControlError::Io { .. }
            | ControlError::Unreachable { .. } => ErrorKind::Unreachable,
            ControlError::Decode(_) | ControlError::Key(_) => ErrorKind::Refused,
        }
    }
}

/// Why a control request over the mesh (`--mesh ADDR`) got no answer.
#[derive(Debug, thiserror::Error)]
pub enum ReachError {
    #[error("cannot start the network: {0}")]
    Runtime(io::Error),
    #[error(transparent)]
    Net(#[from] crate::net::NetError),
    /// The dial failed: its causes, as `net::explain_dial_error` says them.
    #[error("{0}")]
    Dial(String),
    #[error("no answer within {} s", remote::CONNECT_WITHIN.as_secs())]
    Silent,
    #[error("the node there does not take {CONTROL_PROTOCOL}: it runs another version of mesh (this is {})", env!("CARGO_PKG_VERSION"))]
    OtherVersion,
    #[error("opening a control stream: {0}")]
    Open(libp2p_stream::OpenStreamError),
    #[error("sending the request: {0}")]
    Send(io::Error),
    #[error("reading the answer: {0}")]
    Read(io::Error),
    #[error("the node closed the stream without an answer")]
    Closed,
    #[error("the connection's thread ended")]
    ThreadEnded,
}

/// A connection to a node, yielding its answers.
pub struct Client {
    lines: Lines,
}

enum Lines {
    Local(std::io::Lines<BufReader<UnixStream>>),
    /// Lines read by [`remote`]'s thread, which drives the connection.
    Remote(std::sync::mpsc::Receiver<io::Result<String>>),
}

impl Client {
    /// Sends one request to the node `to`.
    pub fn request(to: &Target, req: &ControlRequest) -> Result<Client, ControlError> {
        Client::request_line(to, serde_json::to_vec(req)?)
    }

    /// Sends one request already written as JSON (a relay passes on what
    /// a client wrote, read or not by this build: `mesh control-pipe`).
    pub fn request_line(to: &Target, mut line: Vec<u8>) -> Result<Client, ControlError> {
        if line.last() != Some(&b'\n') {
            line.push(b'\n');
        }
        match to {
            Target::Local(state) => Client::local(state, &line),
            Target::Remote { addr, key } => Ok(Client {
                lines: Lines::Remote(remote::request(addr, key, line)?),
            }),
        }
    }

    fn local(state: &Path, line: &[u8]) -> Result<Client, ControlError> {
        let path = socket_path(state);
        let until = Instant::now() + START_WAIT;
        let launched_until = Instant::now() + LAUNCH_WAIT;
        let exec_until = Instant::now() + EXEC_WAIT;
        let mut stream = loop {
            match UnixStream::connect(&path) {
                Ok(s) => break s,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused
                    ) =>
                {
                    let now = Instant::now();
                    let waiting = if Starting::under_way(state) {
                        now < until
                    } else {
                        // Not marked yet: a node process of this folder is
                        // given a moment to mark itself, no more, so one
                        // hung before its first step is not waited on; a
                        // process caught in its exec, a moment to show
                        // what it runs.
                        match crate::launched::node_process_on(state) {
                            Launch::Node => now < launched_until,
                            Launch::Exec => now < exec_until,
                            Launch::None => false,
                        }
                    };
                    if !waiting {
                        return Err(ControlError::NoNode(state.to_path_buf()));
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(source) => {
                    return Err(ControlError::Io {
                        path: path.display().to_string(),
                        source,
                    })
                }
            }
        };
        stream.write_all(line).map_err(|source| ControlError::Io {
            path: path.display().to_string(),
            source,
        })?;
        Ok(Client {
            lines: Lines::Local(BufReader::new(stream).lines()),
        })
    }

    /// The node's next answer; `None` once it has said everything.
    pub fn recv(&mut self) -> Option<Result<ControlResponse, ControlError>> {
        Some(
            self.recv_line()?
                .and_then(|l| Ok(serde_json::from_str(&l)?)),
        )
    }

    /// The node's next answer as the line it sent.
    pub fn recv_line(&mut self) -> Option<Result<String, ControlError>> {
        let line = match &mut self.lines {
            Lines::Local(l) => l.next()?,
            Lines::Remote(rx) => rx.recv().ok()?,
        };
        Some(line.map_err(|source| ControlError::Io {
            path: "control connection".into(),
            source,
        }))
    }
}

mod remote {
    //! A control request over the network: a thread with its own small
    //! runtime dials the node, opens a control stream, and passes the
    //! answers' lines back, so the command line stays blocking code.

    use std::io;
    use std::path::Path;
    use std::sync::mpsc;
    use std::time::Duration;

    use futures::{AsyncBufReadExt, AsyncWriteExt, StreamExt};
    use libp2p::swarm::SwarmEvent;
    use libp2p::{ping, Multiaddr, PeerId, StreamProtocol};

    use super::{ControlError, ReachError, CONTROL_PROTOCOL};
    use crate::{keys, net};

    /// How long the dial may take.
    pub(super) const CONNECT_WITHIN: Duration = Duration::from_secs(15);
    /// Lines of an answer read ahead of the command that reads them: the
    /// node's own queue for the connection holds more.
    const LINES_QUEUED: usize = 1024;
    /// How often a full queue of lines is tried again: the stream's task
    /// must not block its thread, which also drives the connection.
    const LINES_RETRY: Duration = Duration::from_millis(10);
    /// Streams opened for one request, at most. A node takes the streams
    /// of a protocol one at a time (libp2p-stream hands each to a channel
    /// with one place) and resets one that comes while the last still
    /// waits there: several commands at once (a `mesh wait` and a `mesh
    /// cancel`) met that about one time in two here.
    const ATTEMPTS: u32 = 8;

    pub(super) fn request(
        addr: &Multiaddr,
        key: &Path,
        line: Vec<u8>,
    ) -> Result<mpsc::Receiver<io::Result<String>>, ControlError> {
        let psk = keys::load_psk(key)?;
        let unreachable = |why: ReachError| ControlError::Unreachable {
            addr: addr.to_string(),
            why: Box::new(why),
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| unreachable(ReachError::Runtime(e)))?;
        let (lines_tx, lines_rx) = mpsc::sync_channel(LINES_QUEUED);
        // One word, sent once: whether the request went out.
        let (ready_tx, ready_rx) = mpsc::sync_channel(1);
        let addr = addr.clone();
        std::thread::spawn(move || {
            runtime.block_on(async move {
                let (control, peer, driver) =
                    match tokio::time::timeout(CONNECT_WITHIN, connect(addr, &psk)).await {
                        Err(_) => {
                            let _ = ready_tx.send(Err(ReachError::Silent));
                            return;
                        }
                        Ok(Err(why)) => {
                            let _ = ready_tx.send(Err(why));
                            return;
                        }
                        Ok(Ok(c)) => c,
                    };
                match ask(control, peer, &line).await {
                    Err(why) => {
                        let _ = ready_tx.send(Err(why));
                    }
                    Ok((first, mut lines)) => {
                        let _ = ready_tx.send(Ok(()));
                        if pass(&lines_tx, Ok(first)).await {
                            while let Some(l) = lines.next().await {
                                if !pass(&lines_tx, l).await {
                                    break;
                                }
                            }
                        }
                    }
                }
                driver.abort();
            })
        });
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(lines_rx),
            Ok(Err(why)) => Err(unreachable(why)),
            Err(_) => Err(unreachable(ReachError::ThreadEnded)),
        }
    }

    /// Hands a line to the command, waiting while its queue is full;
    /// false once it stopped reading.
    async fn pass(tx: &mpsc::SyncSender<io::Result<String>>, mut line: io::Result<String>) -> bool {
        loop {
            match tx.try_send(line) {
                Ok(()) => return true,
                Err(mpsc::TrySendError::Full(l)) => {
                    line = l;
                    tokio::time::sleep(LINES_RETRY).await;
                }
                Err(mpsc::TrySendError::Disconnected(_)) => return false,
            }
        }
    }

    type Lines = futures::io::Lines<futures::io::BufReader<libp2p::Stream>>;

    /// Sends the request on a control stream and returns the first line of
    /// the answer with the rest to come. A stream that ends before its
    /// first line was reset by the node before it read the request (a node
    /// serving one always answers at least once): asked again on a new one.
    async fn ask(
        mut control: libp2p_stream::Control,
        peer: PeerId,
        line: &[u8],
    ) -> Result<(String, Lines), ReachError> {
        let mut why = ReachError::Closed;
        for attempt in 0..ATTEMPTS {
            if attempt > 0 {
                tokio::time::sleep(Duration::from_millis(20 << attempt.min(5))).await;
            }
            let mut stream = match control
                .open_stream(peer, StreamProtocol::new(CONTROL_PROTOCOL))
                .await
            {
                Ok(s) => s,
                Err(libp2p_stream::OpenStreamError::UnsupportedProtocol(_)) => {
                    return Err(ReachError::OtherVersion)
                }
                Err(e) => {
                    why = ReachError::Open(e);
                    continue;
                }
            };
            if let Err(e) = stream.write_all(line).await {
                why = ReachError::Send(e);
                continue;
            }
            let mut lines = futures::io::BufReader::new(stream).lines();
            match lines.next().await {
                Some(Ok(first)) => return Ok((first, lines)),
                Some(Err(e)) => why = ReachError::Read(e),
                None => why = ReachError::Closed,
            }
        }
        Err(why)
    }

    /// Dials `addr`; the swarm is driven by a task of its own from then on.
    async fn connect(
        addr: Multiaddr,
        psk: &keys::MeshKey,
    ) -> Result<(libp2p_stream::Control, PeerId, tokio::task::JoinHandle<()>), ReachError> {
        let mut swarm = net::client(psk)?;
        let control = swarm.behaviour().streams.new_control();
        swarm
            .dial(addr.clone())
            .map_err(|e| ReachError::Dial(net::explain_dial_error(&e)))?;
        let peer = loop {
            match swarm.select_next_some().await {
                SwarmEvent::ConnectionEstablished { peer_id, .. } => break peer_id,
                SwarmEvent::OutgoingConnectionError { error, .. } => {
                    return Err(ReachError::Dial(net::explain_dial_error(&error)))
                }
                _ => {}
            }
        };
        let driver = tokio::spawn(async move {
            // Until the node stops answering pings: then the swarm goes,
            // with the connection, and the answer's lines end.
            loop {
                if let SwarmEvent::Behaviour(net::ClientBehaviourEvent::Ping(ping::Event {
                    result: Err(_),
                    ..
                })) = swarm.select_next_some().await
                {
                    break;
                }
            }
        });
        Ok((control, peer, driver))
    }
}

#[cfg(test)]
mod tests {
    use super::{ControlResponse, ErrorKind};

    #[test]
    fn a_refusal_says_its_kind_as_a_field_in_snake_case() {
        let e = ControlResponse::error(ErrorKind::UnknownFarm, "no farm `x` is known here");
        let line = serde_json::to_string(&e).unwrap();
        assert_eq!(
            line,
            r#"{"Error":{"kind":"unknown_farm","message":"no farm `x` is known here"}}"#
        );
        for (kind, name) in [
            (ErrorKind::ClosedFarm, "closed_farm"),
            (ErrorKind::BadRequest, "bad_request"),
            (ErrorKind::OtherApi, "other_api"),
            (ErrorKind::Lagged, "lagged"),
            (ErrorKind::Unreachable, "unreachable"),
            (ErrorKind::Refused, "refused"),
        ] {
            assert_eq!(serde_json::to_string(&kind).unwrap(), format!("\"{name}\""));
        }
        assert!(e.is_last());
    }

    #[test]
    fn a_kind_this_build_does_not_know_is_a_plain_refusal() {
        let line = r#"{"Error":{"kind":"from_a_newer_node","message":"words"}}"#;
        let Ok(ControlResponse::Error { kind, message }) = serde_json::from_str(line) else {
            panic!("not read as a refusal");
        };
        assert_eq!((kind, message.as_str()), (ErrorKind::Refused, "words"));
    }
}
