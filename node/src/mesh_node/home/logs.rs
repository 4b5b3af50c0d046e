//! Task logs for `mesh logs` and the dashboard: read on the node that ran the task, found through the coordinator, and followed while the task runs.

use super::kept_lent;
use super::labels_now;
use super::{Home, Lent};
use std::fs;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use std::sync::Arc;

use mesh_protocol::farm::TaskRef;
use mesh_protocol::mesh::{void_place, Entry, FarmId, FarmSpec};
use mesh_protocol::wire::{DepOutputs, Refusal, Request, Response};
use tokio::sync::oneshot;

use crate::mesh_node::refusals::RequestError;
use crate::mesh_node::reply::Reply;

/// The most of a log one answer carries (a follower asks again from there).
const LOG_READ_MAX: usize = 8 << 20;
use crate::control::{ControlResponse, ErrorKind};
use crate::executor;
use crate::task_words::parse_task;

/// How often `mesh logs -f` looks for more output.
const LOG_FOLLOW_MS: u64 = 500;

/// Why `mesh logs` got no (more) log from the node that ran the task.
#[derive(Debug, thiserror::Error)]
enum LogsError {
    #[error(transparent)]
    Ask(#[from] RequestError),
    #[error("unexpected answer from the coordinator")]
    CoordinatorAnswer,
    #[error("unexpected answer")]
    NodeAnswer,
    /// The task as `mesh logs` named it.
    #[error("{0} has not run: it is still to run, or it was skipped because a task it depends on failed (`mesh status FARM` says which)")]
    NotRun(String),
}

/// What `mesh logs` asked for.
pub(in crate::mesh_node) struct LogAsk {
    pub(in crate::mesh_node) task: String,
    pub(in crate::mesh_node) attempt: Option<u32>,
    pub(in crate::mesh_node) follow: bool,
}

impl Home {
    /// Sends a task's logs to `mesh logs`, from the node that ran it (asking
    /// the coordinator which, when this node does not know); with `follow`,
    /// more as they come until the task is over there.
    pub(in crate::mesh_node) fn follow_logs(
        &mut self,
        m: &mut Lent<'_>,
        spec: Arc<FarmSpec>,
        ask: LogAsk,
        reply: Reply,
    ) {
        let task = match parse_task(&spec.def, &ask.task) {
            Ok(t) => t,
            Err(e) => {
                let _ = reply.send(ControlResponse::error(ErrorKind::Refused, e.to_string()));
                return;
            }
        };
        // A task reused from an earlier farm did not run in this one: its
        // logs are those of the run that made its outputs.
        let reused = {
            let (kept, lent) = kept_lent(m);
            kept.reused_from(&lent, spec.id, task)
        };
        let (farm, task, known, attempt) = match reused {
            Some(r) if ask.attempt.is_none() => {
                (r.farm, r.task, Some((r.node, false)), Some(r.attempt))
            }
            _ => (spec.id, task, m.mesh.where_ran(spec.id, task), ask.attempt),
        };
        // The run that counts, as the farm's log here has it (the latest
        // attempt's, when no attempt was named).
        let used = m
            .mesh
            .replica(farm)
            .filter(|_| ask.attempt.is_none())
            .and_then(|r| r.log.get(task).and_then(|e| e.ran().cloned()))
            .and_then(|ran| {
                Some(crate::used::TaskUsed {
                    runtime_ms: ran.duration_ms,
                    usage: ran.usage?,
                })
            });
        let coordinator = m.mesh.coordinator();
        let handle = m.handle.clone();
        let labels = labels_now(m);
        tokio::spawn(async move {
            let r = async {
                let ran = match (known, coordinator) {
                    (Some((node, _)), _) => Some(node),
                    (None, None) => None,
                    (None, Some(c)) => {
                        match handle.request(c, Request::WhereRan { farm, task }).await? {
                            Response::Ran { node, .. } => node,
                            _ => return Err(LogsError::CoordinatorAnswer),
                        }
                    }
                };
                let Some(node) = ran else {
                    return Err(LogsError::NotRun(ask.task));
                };
                let label = labels
                    .get(&node)
                    .cloned()
                    .unwrap_or_else(|| node.to_string());
                let mut offsets = (0u64, 0u64);
                loop {
                    let req = Request::TaskLog {
                        farm,
                        task,
                        attempt,
                        offsets,
                    };
                    let Response::Log {
                        attempt,
                        out,
                        err,
                        running,
                    } = handle.request(node, req).await?
                    else {
                        return Err(LogsError::NodeAnswer);
                    };
                    offsets.0 += out.len() as u64;
                    offsets.1 += err.len() as u64;
                    let more = !out.is_empty() || !err.is_empty();
                    let done = !ask.follow || (!running && !more);
                    // A task: it waits for a slow reader, which so
                    // reads the log no faster than it can.
                    let sent = reply
                        .send_wait(ControlResponse::Log {
                            node: label.clone(),
                            attempt,
                            stdout: out,
                            stderr: err,
                            done,
                            used: used.filter(|_| done),
                        })
                        .await;
                    if done || sent.is_err() {
                        return Ok(());
                    }
                    if !more {
                        tokio::time::sleep(std::time::Duration::from_millis(LOG_FOLLOW_MS)).await;
                    }
                }
            }
            .await;
            if let Err(e) = r {
                let _ = reply.send(ControlResponse::error(ErrorKind::Refused, e.to_string()));
            }
        });
    }
}

/// Answers [`Request::DepOutputs`] from the farm's log as this node has
/// it: the coordinator's, or a copy's.
pub(in crate::mesh_node) fn dep_outputs(m: &Lent<'_>, farm: FarmId, task: TaskRef) -> Response {
    let (log, home) = match (m.mesh.coordinated_log(farm), m.mesh.replica(farm)) {
        (Some(log), _) => (log, m.mesh.coordinated_farm(farm, 0).map(|(h, ..)| h.node)),
        (None, Some(r)) => (&r.log, Some(r.home_of.node)),
        (None, None) => return Response::Error(format!("farm {farm} is not known here")),
    };
    let Some(spec) = m.mesh.spec(farm) else {
        return Response::Error(format!("farm {farm} is not known here"));
    };
    let def = &spec.def;
    let mut answer = DepOutputs {
        home,
        ..DepOutputs::default()
    };
    let mut n = 0;
    while let Some(d) = def.dependency(task, n) {
        n += 1;
        if def.stage(d).outputs.is_empty() || void_place(def, log, d) {
            continue;
        }
        match log.get(d) {
            Some(Entry::Done { node, outputs, .. }) => {
                answer.done.push((d, *node, outputs.to_vec()));
            }
            _ => answer.waiting += 1,
        }
    }
    Response::DepOutputs(answer)
}

/// Answers a request about a task's run from what this node has: at
/// once, or (reading files) through the returned channel.
pub(in crate::mesh_node) fn local_answer(
    m: &Lent<'_>,
    req: Request,
) -> Result<Response, oneshot::Receiver<Response>> {
    match req {
        Request::DepOutputs { farm, task } => Ok(dep_outputs(m, farm, task)),
        Request::WhereRan { farm, task } => {
            let (node, running) = match m.mesh.where_ran(farm, task) {
                Some((n, r)) => (Some(n), r),
                None => (None, false),
            };
            Ok(Response::Ran { node, running })
        }
        Request::TaskLog {
            farm,
            task,
            attempt,
            offsets,
        } => {
            let running = m.mesh.runs(farm, task);
            let Some(spec) = m.mesh.spec(farm) else {
                return Ok(Response::Error(Refusal::NoSuchFile.to_string()));
            };
            let Some(stage) = spec.def.stages.get(task.stage as usize) else {
                return Ok(Response::Error("no such stage".into()));
            };
            let dir = m
                .state
                .join("logs")
                .join(farm.to_string())
                .join(&stage.name);
            let (tx, rx) = oneshot::channel();
            tokio::task::spawn_blocking(move || {
                let _ = tx.send(read_log(&dir, task.index, attempt, offsets, running));
            });
            Err(rx)
        }
        _ => Ok(Response::Error("not asked of a node itself".into())),
    }
}

/// A task's logs in `dir` (its stage's log folder) after these offsets.
fn read_log(
    dir: &Path,
    index: u32,
    attempt: Option<u32>,
    offsets: (u64, u64),
    running: bool,
) -> Response {
    let attempt = attempt.or_else(|| executor::latest_attempt(dir, index));
    let read = |stream: &str, offset: u64| -> Vec<u8> {
        let Some(a) = attempt else {
            return Vec::new();
        };
        let path = dir.join(format!("{index}.{a}.{stream}"));
        let Ok(mut f) = fs::File::open(&path) else {
            return Vec::new();
        };
        let size = f.metadata().map(|m| m.len()).unwrap_or(0);
        if offset >= size || f.seek(SeekFrom::Start(offset)).is_err() {
            return Vec::new();
        }
        let mut data = vec![0u8; LOG_READ_MAX.min((size - offset) as usize)];
        match f.read_exact(&mut data) {
            Ok(()) => data,
            Err(_) => Vec::new(),
        }
    };
    Response::Log {
        attempt,
        out: read("out", offsets.0),
        err: read("err", offsets.1),
        running,
    }
}
