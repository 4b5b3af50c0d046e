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
use mesh_protocol::farm::FarmDef;
use mesh_protocol::mesh::{AllocBook, AllocCmd};

use crate::view::{FarmView, MeshStatus, Observed};
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
