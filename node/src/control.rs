//! The local control socket: what `mesh submit`, `wait`, `cancel` and `status` say to the node on the same machine.
//!
//! One JSON request per connection, answered by JSON lines. The socket lives
//! in the state folder with owner-only permissions: whoever can write to it
//! can run commands as the node's user.

use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use std::collections::HashMap;

use mesh_protocol::alloc::QueueDef;
use mesh_protocol::engine::Counts;
use mesh_protocol::farm::FarmDef;
use mesh_protocol::mesh::{AllocBook, AllocCmd};
use mesh_protocol::observe::{Counters, Latencies, LatencySummary, Observation};
use mesh_protocol::resources::{Amount, Resources, MEM};

use crate::state::FarmStatus;
use serde::{Deserialize, Serialize};

/// The socket's path in a state folder.
pub fn socket_path(state: &Path) -> PathBuf {
    state.join("node.sock")
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum ControlRequest {
    /// A farm loaded and checked by the CLI; `file` is its canonical path.
    Submit {
        def: Box<FarmDef>,
        file: String,
    },
    /// Follow a farm submitted on this node until it ends.
    Wait {
        farm: String,
    },
    Cancel {
        farm: String,
    },
    /// The mesh's nodes, with what each says of itself (load, latencies).
    Status,
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
    Error(String),
}

/// A farm as its submitter sees it.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct FarmView {
    pub id: String,
    pub name: String,
    pub file: String,
    pub out: String,
    pub accepted: bool,
    pub finished: bool,
    pub counts: Counts,
    pub stages: Vec<(String, Counts)>,
    /// The first failures, as `task (attempt N on node): reason`.
    pub failures: Vec<String>,
    pub unplaceable: Vec<String>,
    /// The node that is the farm's home (its outputs go there).
    #[serde(default)]
    pub home: String,
    /// Tasks run again after a fault (a node thought dead, a partition) and
    /// completed twice; the first result counts.
    #[serde(default)]
    pub duplicates: u64,
}

impl FarmView {
    /// A farm of `mesh run`, from its status snapshot: this machine is its
    /// home, and failures read as a mesh farm's do.
    pub fn from_status(s: &FarmStatus) -> FarmView {
        FarmView {
            id: s.id.clone(),
            name: s.name.clone(),
            file: s.file.clone(),
            out: s.out.clone(),
            accepted: true,
            finished: s.state.is_finished(),
            counts: s.counts.clone(),
            stages: s
                .stages
                .iter()
                .map(|st| (st.name.clone(), st.counts.clone()))
                .collect(),
            failures: s
                .failed
                .iter()
                .map(|f| {
                    format!(
                        "{} (attempt {} on {}): {}",
                        f.task, f.attempt, s.host, f.reason
                    )
                })
                .collect(),
            home: s.host.clone(),
            ..FarmView::default()
        }
    }
}

/// One node of the mesh, as `mesh status` shows it.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct NodeView {
    /// The libp2p peer id.
    pub id: String,
    pub addrs: Vec<String>,
    pub resources: ResourceView,
    pub queued: u32,
    pub running: u32,
    /// Tasks the node asks to keep queued beyond those it runs: its
    /// prefetch depth, from its tasks' mean duration and its round trip
    /// to the coordinator.
    #[serde(default)]
    pub prefetch: u32,
    pub coordinator: bool,
    /// This is the node that answered.
    pub local: bool,
    /// The machine's one-minute load average and cores, and its memory
    /// in bytes: absent when the node did not answer in time.
    #[serde(default)]
    pub load: Option<f64>,
    #[serde(default)]
    pub cpus: Option<u32>,
    #[serde(default)]
    pub mem_used: Option<u64>,
    #[serde(default)]
    pub mem_total: Option<u64>,
    #[serde(default)]
    pub counters: Option<Counters>,
    /// Each resource in use against the node's total.
    #[serde(default)]
    pub usage: Vec<ResourceUse>,
    /// This node's latencies (see `mesh status --latency`).
    #[serde(default)]
    pub latency: Vec<LatencySummary>,
    /// The batch job that started it (`mesh alloc`), and how long until
    /// it drains before its walltime, in seconds.
    #[serde(default)]
    pub job: Option<String>,
    #[serde(default)]
    pub drains_in_s: Option<u64>,
}

/// One resource of a node: in use and total, in its unit (bytes for `mem`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ResourceUse {
    pub kind: String,
    pub used: f64,
    pub total: f64,
}

impl ResourceUse {
    pub fn of(total: &Resources, used: &Resources) -> Vec<ResourceUse> {
        let n = |kind: &str, a: Amount| {
            if kind == MEM {
                a.whole() as f64
            } else {
                a.0 as f64 / 1000.0
            }
        };
        total
            .iter()
            .map(|(kind, t)| ResourceUse {
                kind: kind.to_string(),
                used: n(kind, used.get(kind)),
                total: n(kind, t),
            })
            .collect()
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ResourceView {
    pub total: String,
    pub used: String,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct MeshStatus {
    pub nodes: Vec<NodeView>,
    pub coordinator: Option<String>,
    pub term: u64,
    pub farms: Vec<FarmView>,
    /// Every answering node's latencies together.
    #[serde(default)]
    pub latency: Vec<LatencySummary>,
}

/// The status, and what each node that answered said of itself.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Observed {
    pub status: MeshStatus,
    /// By node id (its peer id).
    pub nodes: Vec<(String, Observation)>,
}

impl Observed {
    /// Puts each node's own measures into its line of the status.
    pub fn new(mut status: MeshStatus, nodes: Vec<(String, Observation)>) -> Observed {
        let mut all = Latencies::default();
        for (id, o) in &nodes {
            all.merge(&o.latency);
            let Some(v) = status.nodes.iter_mut().find(|v| &v.id == id) else {
                continue;
            };
            let mut own = Latencies::default();
            own.merge(&o.latency);
            v.load = o.load;
            v.cpus = Some(o.cpus);
            v.mem_used = o.mem_used;
            v.mem_total = o.mem_total;
            v.counters = Some(o.counters);
            v.latency = own.summaries();
        }
        status.latency = all.summaries();
        Observed { status, nodes }
    }
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
}

/// A connection to the local node, yielding its answers.
pub struct Client {
    lines: std::io::Lines<BufReader<UnixStream>>,
}

impl Client {
    /// Sends one request to the node of `state`.
    pub fn request(state: &Path, req: &ControlRequest) -> Result<Client, ControlError> {
        let path = socket_path(state);
        let mut stream = match UnixStream::connect(&path) {
            Ok(s) => s,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused
                ) =>
            {
                return Err(ControlError::NoNode(state.to_path_buf()))
            }
            Err(source) => {
                return Err(ControlError::Io {
                    path: path.display().to_string(),
                    source,
                })
            }
        };
        let mut line = serde_json::to_vec(req)?;
        line.push(b'\n');
        stream.write_all(&line).map_err(|source| ControlError::Io {
            path: path.display().to_string(),
            source,
        })?;
        Ok(Client {
            lines: BufReader::new(stream).lines(),
        })
    }

    /// The node's next answer; `None` once it has said everything.
    pub fn recv(&mut self) -> Option<Result<ControlResponse, ControlError>> {
        let line = match self.lines.next()? {
            Ok(l) => l,
            Err(source) => {
                return Some(Err(ControlError::Io {
                    path: "control socket".into(),
                    source,
                }))
            }
        };
        Some(serde_json::from_str(&line).map_err(ControlError::from))
    }
}
