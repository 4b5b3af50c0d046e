//! The control socket: one JSON request a connection, answered by this node's loop (submit, wait, cancel, status, farm, list, logs, alloc, resume, export, and the client API's hello, farm text, task events and task lists).

use super::feed::tasks_in;
use super::labels_now;
use super::queries::{find_for_task, find_known, found, summaries};
use super::{label_of, Home, HomeOut, Lent};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use mesh_protocol::wire::{FoundFarm, Request, Response};

use super::logs::LogAsk;
use super::queries::{Ask, Asked};
use super::views::{summary_view, Origin};
use crate::alloc::script;
use crate::control::{ControlRequest, ControlResponse, ErrorKind, CONTROL_API};
use crate::farmfile::{self, FarmFileError, LoadOptions};
use crate::mesh_node::refusals::QueryError;
use crate::mesh_node::reply::Reply;
use crate::mesh_node::runs::make_spec;
use crate::mesh_node::{farm_display_id, Event, LoopHandle};
use crate::view::FarmView;
use mesh_protocol::farm::{FarmDef, Stages};
use mesh_protocol::mesh::{FarmId, NodeId};

impl Home {
    pub(in crate::mesh_node) fn on_control(
        &mut self,
        m: &mut Lent<'_>,
        req: ControlRequest,
        reply: Reply,
    ) {
        match req {
            req @ (ControlRequest::Submit { .. } | ControlRequest::SubmitFarm { .. }) => {
                // Served from the connection (`serve_control`); here only
                // for a caller that hands the loop any request.
                let _ = submit_off_loop(req, m.handle, reply);
            }
            ControlRequest::Grow {
                farm,
                toml,
                file,
                close,
                rerun,
            } => self.grow_farm(
                m,
                &farm,
                Growth {
                    added: Added::Text { toml, file },
                    close,
                    rerun,
                },
                reply,
            ),
            ControlRequest::Calls(batch) => match batch.farm.clone() {
                Some(farm) => {
                    let rerun = batch.rerun;
                    let growth = Growth {
                        added: Added::Calls(batch),
                        close: false,
                        rerun,
                    };
                    self.grow_farm(m, &farm, growth, reply)
                }
                None => {
                    let _ = submit_off_loop(ControlRequest::Calls(batch), m.handle, reply);
                }
            },
            ControlRequest::Wait { farm } => self.wait_for(m, &farm, reply),
            ControlRequest::Cancel { farm } => self.cancel_farm(m, &farm, reply),
            ControlRequest::CancelTask { farm, task } => self.cancel_one(m, &farm, &task, reply),
            ControlRequest::Status => self.gather(m, HashMap::new(), Ask::Coordinator, move |o| {
                let _ = reply.send(ControlResponse::Status(Box::new(o.status)));
            }),
            ControlRequest::StatusEvery => self.gather(m, HashMap::new(), Ask::Every, move |o| {
                let _ = reply.send(ControlResponse::Status(Box::new(o.status)));
            }),
            ControlRequest::Observe { since } => self.gather(m, since, Ask::Busiest, move |o| {
                let _ = reply.send(ControlResponse::Observed(Box::new(o)));
            }),
            ControlRequest::Farm { farm } => match find_known(m, &farm) {
                Ok(fid) => match found(m, fid) {
                    Some(f) => self.answer(m, Ok(f), Asked::Status(reply)),
                    None => self.ask_coordinator(m, farm, Asked::Status(reply)),
                },
                Err(_) => self.ask_coordinator(m, farm, Asked::Status(reply)),
            },
            ControlRequest::List => self.list_farms(m, reply),
            ControlRequest::Logs {
                farm,
                task,
                attempt,
                follow,
            } => self.logs_of(
                m,
                farm,
                LogAsk {
                    task,
                    attempt,
                    follow,
                },
                reply,
            ),
            ControlRequest::Alloc(cmd) => self.alloc_command(m, cmd, reply),
            ControlRequest::Allocs => {
                let book = m.mesh.alloc_book();
                let _ = reply.send(ControlResponse::Allocs(Box::new((**book).clone())));
            }
            ControlRequest::AllocScript(def) => {
                let launch = self.allocs.launch(m, &def.name);
                let _ = reply.send(ControlResponse::Script(script::script(&def, &launch)));
            }
            ControlRequest::Resume { farm, out } => match find_known(m, &farm) {
                Ok(fid) if m.mesh.replica(fid).is_some() => {
                    let found = found(m, fid).expect("held here");
                    self.answer(m, Ok(found), Asked::Resume(out, reply));
                }
                _ => self.ask_coordinator(m, farm, Asked::Resume(out, reply)),
            },
            ControlRequest::Hello { api } => {
                let _ = reply.send(hello(m, api));
            }
            ControlRequest::Hold { farm, cancel } => self.hold_farm(m, &farm, cancel, reply),
            ControlRequest::Events { farm } => match self.find_farm(m, &farm) {
                Ok(fid) => self.follow_tasks(m, fid, reply),
                Err(e) => {
                    let _ = reply.send(e.said());
                }
            },
            ControlRequest::Tasks { farm, state, limit } => {
                let r =
                    find_known(m, &farm).and_then(|fid| tasks_in(m, fid, state.as_deref(), limit));
                let _ = reply.send(match r {
                    Ok(tasks) => ControlResponse::Tasks(tasks),
                    Err(e) => e.said(),
                });
            }
            ControlRequest::Export { farm } => self.export(m, &farm, reply),
        }
    }

    /// The farm's progress now, then its end when it comes.
    fn wait_for(&mut self, m: &mut Lent<'_>, farm: &str, reply: Reply) {
        match self.find_farm(m, farm) {
            Err(e) => {
                let _ = reply.send(e.said());
            }
            Ok(fid) => {
                let o = self.farms.get_mut(&fid).expect("found");
                let _ = reply.send(ControlResponse::Progress(o.view.clone()));
                if o.view.finished {
                    let _ = reply.send(ControlResponse::Finished(o.view.clone()));
                } else {
                    o.waiters.push(reply);
                }
            }
        }
    }

    fn cancel_farm(&mut self, m: &mut Lent<'_>, farm: &str, reply: Reply) {
        match self.find_farm(m, farm) {
            Err(e) => {
                let _ = reply.send(e.said());
            }
            Ok(fid) => {
                self.out.push_back(HomeOut::Cancel(fid));
                let id = self.farms[&fid].view.id.clone();
                let _ = reply.send(ControlResponse::Cancelled { farm: id });
            }
        }
    }

    /// One task of a farm submitted here, named as users name it (`stage/3`).
    fn cancel_one(&mut self, m: &mut Lent<'_>, farm: &str, task: &str, reply: Reply) {
        let found = self
            .find_farm(m, farm)
            .map_err(|e| (e.kind(), e.to_string()))
            .and_then(|fid| {
                let refused = |e: String| (ErrorKind::Refused, e);
                let spec = m
                    .mesh
                    .spec(fid)
                    .ok_or_else(|| refused(format!("farm {farm} is not held here")))?;
                let t = crate::task_words::parse_task(&spec.def, task)
                    .map_err(|e| refused(e.to_string()))?;
                Ok((fid, t))
            });
        match found {
            Err((kind, message)) => {
                let _ = reply.send(ControlResponse::Error { kind, message });
            }
            Ok((fid, t)) => {
                self.out.push_back(HomeOut::CancelTask(fid, t));
                let id = self.farms[&fid].view.id.clone();
                let _ = reply.send(ControlResponse::Cancelled { farm: id });
            }
        }
    }

    /// The farms this node is the home of, and those the coordinator knows.
    fn list_farms(&mut self, m: &mut Lent<'_>, reply: Reply) {
        let mine = summaries(m);
        let labels = labels_now(m);
        let held: std::collections::HashSet<FarmId> = self
            .farms
            .iter()
            .filter(|(_, o)| o.holds.iter().any(|h| !h.is_closed()))
            .map(|(id, _)| *id)
            .collect();
        let ask = m.mesh.coordinator().filter(|c| *c != m.me);
        let handle = m.handle.clone();
        tokio::spawn(async move {
            let mut all = mine;
            if let Some(c) = ask {
                if let Ok(Response::Farms(theirs)) = handle.request(c, Request::ListFarms).await {
                    for f in theirs {
                        if !all.iter().any(|m| m.id == f.id) {
                            all.push(f);
                        }
                    }
                }
            }
            let views = all
                .iter()
                .map(|f| FarmView {
                    held: held.contains(&f.id),
                    ..summary_view(f, &labels)
                })
                .collect();
            let _ = reply.send(ControlResponse::List(views));
        });
    }

    /// A task's logs: of a farm held here, or found through the coordinator.
    fn logs_of(&mut self, m: &mut Lent<'_>, farm: String, ask: LogAsk, reply: Reply) {
        // No farm named: the newest with the task's stage.
        let found = if farm.is_empty() {
            find_for_task(m, &ask.task)
        } else {
            find_known(m, &farm)
        };
        match found {
            Ok(fid) => {
                let spec = m.mesh.spec(fid).cloned().expect("known");
                self.follow_logs(m, spec, ask, reply);
            }
            Err(e) if farm.is_empty() => {
                let _ = reply.send(e.said());
            }
            Err(_) => self.ask_coordinator(m, farm, Asked::Logs(ask, reply)),
        }
    }

    /// Makes this node the farm's home (`mesh resume FARM --out DIR`):
    /// answered at once when it is already, else once the peer has taken it.
    pub(in crate::mesh_node) fn take_home(
        &mut self,
        m: &mut Lent<'_>,
        f: FoundFarm,
        out: Option<String>,
        reply: Reply,
    ) {
        let fid = f.spec.id;
        let here = m.mesh.replica(fid).filter(|r| r.home);
        let already = match (&out, here) {
            (None, Some(_)) => true,
            (Some(o), Some(r)) => o == r.out_dir(),
            (None, None) => {
                let e = QueryError::HomeElsewhere {
                    farm: farm_display_id(&f.spec.def.name, fid),
                    home: label_of(m, f.home.node),
                };
                let _ = reply.send(e.said());
                return;
            }
            (Some(_), None) => false,
        };
        if let Some(r) = here.filter(|r| !already && r.home && r.announced) {
            // This node is the home and told the end: every output is in
            // its folder and the nodes that kept them have freed them, so
            // a new folder would wait for them forever. (A farm that ended
            // while its home was gone has its outputs on the workers
            // still: that is what `resume --out` elsewhere is for.)
            let e = QueryError::Finished {
                farm: farm_display_id(&f.spec.def.name, fid),
                out: r.out_dir().to_string(),
            };
            let _ = reply.send(e.said());
            return;
        }
        match out.filter(|_| !already) {
            Some(out) => self.out.push_back(HomeOut::TakeHome {
                spec: Arc::new(f.spec),
                out,
                reply,
            }),
            None => self.resumed(m, fid, true, reply),
        }
    }

    /// Answers `mesh resume` once this node is the farm's home.
    pub(in crate::mesh_node) fn resumed(
        &mut self,
        m: &mut Lent<'_>,
        fid: FarmId,
        already: bool,
        reply: Reply,
    ) {
        let r = m.mesh.replica(fid).expect("held now");
        let mut o = Origin::new(&r.spec);
        o.view.accepted = true;
        o.view.out = r.out_dir().to_string();
        let out = o.view.out.clone();
        let id = o.view.id.clone();
        if let Some(old) = self.farms.remove(&fid) {
            o.waiters = old.waiters;
        }
        self.farms.insert(fid, o);
        self.refresh_view(m, fid);
        let v = &self.farms[&fid].view;
        let _ = reply.send(ControlResponse::Resumed {
            farm: id,
            out,
            done: v.counts.done,
            total: v.counts.total,
            already,
        });
    }
}

/// The answer to a client's hello: this node, or why the client's API
/// is not this node's.
fn hello(m: &Lent<'_>, api: u32) -> ControlResponse {
    let version = env!("CARGO_PKG_VERSION").to_string();
    if api == CONTROL_API {
        ControlResponse::Hello {
            api,
            version,
            node: m.net.me_label().to_owned(),
        }
    } else {
        ControlResponse::error(ErrorKind::OtherApi, format!(
            "this node (mesh {version}) speaks control API {CONTROL_API} and the client speaks {api}: use the client of this mesh's version (pip install its python/ folder), or a mesh of the client's"
        ))
    }
}

/// A request that submits a farm, served off the loop from the
/// connection it came on: loaded (or its calls made stages), checked, its
/// inputs hashed and every task's key worked out, then handed to the loop
/// once (`Event::Submit`), so a submission enters the loop once. Any other
/// request is given back, for the loop.
pub(in crate::mesh_node) fn submit_off_loop(
    req: ControlRequest,
    handle: &LoopHandle,
    reply: Reply,
) -> Option<(ControlRequest, Reply)> {
    let (handle, origin) = (handle.clone(), handle.me());
    match req {
        ControlRequest::Submit { def, file, rerun } => {
            // A farm the client loaded (`mesh submit` on this machine): a
            // million tasks' keys take seconds.
            tokio::task::spawn_blocking(move || {
                let farm = Incoming {
                    def: *def,
                    file: &file,
                    rerun: rerun.as_deref(),
                    open: false,
                    manifests: true,
                };
                prepare_submit(&handle, origin, farm, reply)
            });
        }
        ControlRequest::SubmitFarm {
            toml,
            file,
            out,
            cwd,
            rerun,
            check,
            open,
        } => {
            let f = FarmText {
                toml,
                file,
                out,
                cwd,
                rerun,
                check,
                open,
            };
            tokio::task::spawn_blocking(move || submit_text(&handle, origin, f, reply));
        }
        ControlRequest::Calls(batch) if batch.farm.is_none() => {
            tokio::task::spawn_blocking(move || open_with_calls(&handle, origin, &batch, reply));
        }
        other => return Some((other, reply)),
    }
    None
}

/// A farm file's text (the Python client, `mesh --mesh ADDR submit`):
/// loaded, checked or submitted, as reading its params files, hashing
/// inputs and working out every task's key take their time.
fn submit_text(handle: &LoopHandle, origin: NodeId, f: FarmText, reply: Reply) {
    let Some(def) = load_farm(&f, &reply) else {
        return;
    };
    if f.check {
        let _ = reply.send(ControlResponse::Checked {
            name: def.name.clone(),
            out: def.out.clone(),
            tasks: def.task_count(),
            stages: def
                .stages
                .iter()
                .map(|s| (s.name.clone(), u64::from(s.len())))
                .collect(),
        });
        return;
    }
    let farm = Incoming {
        def,
        file: &f.file,
        rerun: f.rerun.as_deref(),
        open: f.open,
        manifests: true,
    };
    prepare_submit(handle, origin, farm, reply);
}

/// A client's first batch of calls, as a new open farm of them
/// (`ControlRequest::Calls` with `new`): its stages made, each call's
/// task said, then submitted as a farm file's would be.
fn open_with_calls(
    handle: &LoopHandle,
    origin: NodeId,
    batch: &crate::calls::CallBatch,
    reply: Reply,
) {
    let (def, tasks) = match crate::calls::farm(batch) {
        Ok(made) => made,
        Err(e) => {
            let _ = reply.send(ControlResponse::error(ErrorKind::Refused, e.to_string()));
            return;
        }
    };
    let _ = reply.send(ControlResponse::Named { tasks });
    // Messages name the farm by a file in its folder, as a farm
    // file submitted from there would be.
    let file = Path::new(&def.root).join(format!("{}.toml", def.name));
    let file = file.to_string_lossy();
    let every: &[String] = &[];
    let farm = Incoming {
        def,
        file: &file,
        rerun: batch.rerun.then_some(every),
        open: true,
        manifests: false,
    };
    prepare_submit(handle, origin, farm, reply);
}

/// A farm file's text checked as `mesh check` checks a file: its warnings
/// said, and `None` once its mistake or an unknown `--rerun` stage is.
fn load_farm(f: &FarmText, reply: &Reply) -> Option<mesh_protocol::farm::FarmDef> {
    let (toml, file, rerun) = (&f.toml, &f.file, f.rerun.as_deref());
    let file_path = Path::new(file);
    // The client's folder, not this node's: the command line's `--out`
    // (and its default) are taken from where it runs.
    let cwd = match &f.cwd {
        Some(c) => PathBuf::from(c),
        None => file_path
            .parent()
            .map_or_else(|| PathBuf::from("/"), Path::to_path_buf),
    };
    let opts = LoadOptions::to(f.out.as_ref().map(|o| cwd.join(o)));
    let (mut def, warnings) = match farmfile::load_str_with_warnings(file_path, toml, &opts) {
        Ok(d) => d,
        Err(e) => {
            let _ = reply.send(invalid(file, &e));
            return None;
        }
    };
    if opts.out.is_none() {
        def.out = cwd
            .join("mesh-out")
            .join(&def.name)
            .to_string_lossy()
            .into_owned();
    }
    for w in warnings {
        let _ = reply.send(ControlResponse::Warning(w.to_string()));
    }
    for n in rerun.unwrap_or_default() {
        if def.stage_index(n).is_none() {
            let all: Vec<&str> = def.stages.iter().map(|s| s.name.as_str()).collect();
            let _ = reply.send(ControlResponse::error(
                ErrorKind::Refused,
                format!(
                    "rerun {n}: the farm has no such stage (stages: {})",
                    all.join(", ")
                ),
            ));
            return None;
        }
    }
    Some(def)
}

pub(in crate::mesh_node) fn invalid(file: &str, e: &FarmFileError) -> ControlResponse {
    ControlResponse::Invalid {
        message: e.to_string(),
        file: e
            .invalid()
            .map_or_else(|| file.to_string(), |i| i.file.clone()),
        line: e.line(),
        column: e.column(),
        field: e.field().map(str::to_string),
    }
}

/// Serves the control requests that come on libp2p streams (`mesh --mesh
/// ADDR` from a machine that runs no node) as the control socket's.
pub(in crate::mesh_node) async fn accept_control(
    mut incoming: libp2p_stream::IncomingStreams,
    handle: LoopHandle,
) {
    use futures::StreamExt;
    use tokio_util::compat::FuturesAsyncReadCompatExt;
    while let Some((peer, stream)) = incoming.next().await {
        tracing::info!("control request from {peer}");
        tokio::spawn(serve_control(stream.compat(), handle.clone()));
    }
}

/// Serves one control connection: reads the request, forwards it to the loop, writes the answers.
pub(in crate::mesh_node) async fn serve_control<S>(stream: S, handle: LoopHandle)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + 'static,
{
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    let (read, mut write) = tokio::io::split(stream);
    let mut lines = BufReader::new(read).lines();
    let Ok(Some(line)) = lines.next_line().await else {
        return;
    };
    let (rtx, mut rrx) = Reply::channel();
    // A hold lasts as long as its client: its end of the connection
    // closing (the process gone) ends it at once, not at the next write.
    let mut holding = false;
    match read_request(&line) {
        Ok(req) => {
            holding = matches!(req, ControlRequest::Hold { .. });
            if let Some((req, rtx)) = submit_off_loop(req, &handle, rtx) {
                if handle.control_to(req, rtx).await.is_err() {
                    return;
                }
            }
        }
        Err(e) => {
            let _ = rtx.send(ControlResponse::error(ErrorKind::BadRequest, e.to_string()));
            drop(rtx);
        }
    }
    loop {
        let resp = tokio::select! {
            r = rrx.recv() => r,
            l = lines.next_line(), if holding => match l {
                Ok(Some(_)) => continue,
                Ok(None) | Err(_) => None,
            },
        };
        let Some(resp) = resp else {
            break;
        };
        let Ok(mut b) = serde_json::to_vec(&resp) else {
            break;
        };
        b.push(b'\n');
        if write.write_all(&b).await.is_err() || write.flush().await.is_err() {
            break;
        }
        if resp.is_last() {
            break;
        }
    }
    // A stream's end must be said, or the other side waits for more.
    let _ = write.shutdown().await;
}

/// A farm as it comes in, loaded: by the client (`mesh submit` on this
/// machine) or here from its text.
struct Incoming<'a> {
    def: FarmDef,
    /// The farm file it was loaded from.
    file: &'a str,
    /// The stages run again whatever was done before (`--rerun`).
    rerun: Option<&'a [String]>,
    /// See `ControlRequest::SubmitFarm`.
    open: bool,
    /// Each stage's `tasks.tsv` is written (not for a client's calls:
    /// see `Home::grow_farm`).
    manifests: bool,
}

/// Off the loop, for either way a farm comes in: each stage's manifest
/// written, the inputs hashed and every task's key worked out, then the
/// farm handed to the loop to submit, with `origin` its home.
fn prepare_submit(handle: &LoopHandle, origin: NodeId, farm: Incoming<'_>, reply: Reply) {
    let Incoming {
        def,
        file,
        rerun,
        open,
        manifests,
    } = farm;
    let rerun = crate::results::rerun_stages(&def, rerun);
    if manifests {
        write_manifests(&def.out, &def.stages, &reply);
    }
    let spec = make_spec(def, file, origin).map(|mut spec| {
        spec.open = open;
        let keys = crate::mesh_node::kept::task_keys(&spec, 0);
        (spec, keys)
    });
    let _ = handle.tell_blocking(Event::Submit(spec, rerun, reply));
}

/// A control request that does not read as its shape: what was expected,
/// where (line and column, and the field's path in the request), and for
/// a call of a batch, which call (its key).
#[derive(Debug, thiserror::Error)]
enum BadRequest {
    #[error("bad request: call `{key}` (calls[{index}]), at `{path}`: {inner}")]
    Call {
        key: String,
        index: usize,
        path: String,
        inner: serde_json::Error,
    },
    #[error("bad request: at `{path}`: {inner}")]
    At {
        path: String,
        inner: serde_json::Error,
    },
    #[error("bad request: {0}")]
    Unread(serde_json::Error),
}

/// A control request read from its line.
fn read_request(line: &str) -> Result<ControlRequest, BadRequest> {
    let de = &mut serde_json::Deserializer::from_str(line);
    serde_path_to_error::deserialize(de).map_err(|e| {
        use serde_path_to_error::Segment;
        let path = e.path().to_string();
        let segments: Vec<&Segment> = e.path().iter().collect();
        let index = segments.windows(2).find_map(|w| match w {
            [Segment::Map { key }, Segment::Seq { index }] if key == "calls" => Some(*index),
            _ => None,
        });
        let key = index.and_then(|i| {
            let v: serde_json::Value = serde_json::from_str(line).ok()?;
            Some(
                v.get("Calls")?
                    .get("calls")?
                    .get(i)?
                    .get("key")?
                    .as_str()?
                    .to_string(),
            )
        });
        let inner = e.into_inner();
        match (index, key) {
            (Some(index), Some(key)) => BadRequest::Call {
                key,
                index,
                path,
                inner,
            },
            _ if path == "." => BadRequest::Unread(inner),
            _ => BadRequest::At { path, inner },
        }
    })
}

/// Writes the `tasks.tsv` of each of `stages` (a farm's, or those added
/// to an open farm) in `out` before they run (see
/// `results::write_manifests`); a folder that cannot take it is said, and
/// the farm goes on.
pub(in crate::mesh_node) fn write_manifests(out: &str, stages: &Stages, reply: &Reply) {
    let out = Path::new(out);
    if let Err(e) = crate::results::write_manifests(out, stages) {
        let _ = reply.send(ControlResponse::Warning(format!(
            "which task is which ({}) is not written in {}: {e}",
            crate::results::MANIFEST,
            out.display()
        )));
    }
}

/// What a `Grow` request brings (see `ControlRequest::Grow`), to `grow.rs`.
pub(in crate::mesh_node) struct Growth {
    pub(in crate::mesh_node) added: Added,
    pub(in crate::mesh_node) close: bool,
    pub(in crate::mesh_node) rerun: bool,
}

/// The stages a growth adds: a farm file's (of the new stages only;
/// empty for a close), or a client's calls.
pub(in crate::mesh_node) enum Added {
    Text { toml: String, file: String },
    Calls(Box<crate::calls::CallBatch>),
}

/// A farm file's text as a client sends it, with where it is read from
/// and what the client asks of it.
struct FarmText {
    toml: String,
    file: String,
    out: Option<String>,
    cwd: Option<String>,
    rerun: Option<Vec<String>>,
    /// Only loaded and checked, not submitted.
    check: bool,
    /// See `ControlRequest::SubmitFarm`.
    open: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(
        dir: &Path,
        toml: &str,
        out: Option<&str>,
        cwd: Option<&str>,
    ) -> (Option<mesh_protocol::farm::FarmDef>, Vec<ControlResponse>) {
        let (tx, mut rx) = Reply::channel();
        let file = dir.join("f.toml");
        let text = FarmText {
            toml: toml.to_string(),
            file: file.to_str().expect("utf-8").to_string(),
            out: out.map(str::to_string),
            cwd: cwd.map(str::to_string),
            rerun: None,
            check: true,
            open: false,
        };
        let def = load_farm(&text, &tx);
        let mut said = Vec::new();
        while let Ok(r) = rx.try_recv() {
            said.push(r);
        }
        (def, said)
    }

    const FARM: &str = "[farm]\nname = \"f\"\n[[stage]]\nname = \"s\"\ncommand = [\"true\"]\n";

    #[test]
    fn a_farms_outputs_go_where_the_client_runs() {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path();
        let (def, _) = load(d, FARM, None, Some("/home/me/work"));
        assert_eq!(def.expect("valid").out, "/home/me/work/mesh-out/f");
        let (def, _) = load(d, FARM, Some("res"), Some("/home/me/work"));
        assert_eq!(def.expect("valid").out, "/home/me/work/res");
        let (def, _) = load(d, FARM, Some("/abs/o"), Some("/home/me/work"));
        assert_eq!(def.expect("valid").out, "/abs/o");
        // No folder given: the farm's own.
        let (def, _) = load(d, FARM, None, None);
        assert_eq!(
            def.expect("valid").out,
            d.join("mesh-out/f").to_str().expect("utf-8")
        );
    }

    #[test]
    fn a_mistake_is_answered_located() {
        let dir = tempfile::tempdir().expect("tempdir");
        let bad = FARM.replace("command", "comand");
        let (def, said) = load(dir.path(), &bad, None, None);
        assert!(def.is_none());
        match &said[..] {
            [ControlResponse::Invalid {
                message,
                line,
                field,
                ..
            }] => {
                assert_eq!(*line, Some(5));
                assert_eq!(field.as_deref(), Some("stage.comand"));
                assert!(message.contains("f.toml:5:1: stage `s`"), "{message}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_request_not_of_its_shape_is_refused_naming_the_call_and_field() {
        let call = |key: &str, retries: &str| {
            format!(r#"{{"key":"{key}","function":"fns/a.pkl","retries":{retries}}}"#)
        };
        let batch = |calls: &[String]| {
            let run = r#"{"python":"python3","worker":"w.py","args_file":"calls/{id}.pkl","vals_file":"calls/{id}.vals","result":"r/{id}"}"#;
            format!(
                r#"{{"Calls":{{"farm":"python-1","run":{run},"calls":[{}]}}}}"#,
                calls.join(",")
            )
        };
        // As a client sends it: it reads.
        let good = batch(&[call("k0", "1"), call("k1", "2")]);
        assert!(
            matches!(read_request(&good), Ok(ControlRequest::Calls(_))),
            "{good}"
        );
        // A client of another make giving a call's retries as 1.5.
        let e = read_request(&batch(&[call("k0", "1"), call("k1", "1.5")]))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("bad request: call `k1` (calls[1]), at `Calls.calls[1].retries`: invalid type: floating point `1.5`, expected u32"), "{e}");
        // Elsewhere: the field's path; not JSON at all: where it stops.
        let e = read_request(r#"{"Wait":{"farm":7}}"#)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("bad request: at `Wait.farm`: invalid type: integer `7`"),
            "{e}"
        );
        let e = read_request("{\"Wait\"").unwrap_err().to_string();
        assert!(e.starts_with("bad request: EOF while parsing"), "{e}");
    }
}
