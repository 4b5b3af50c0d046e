//! Data that follows the graph: a task run off its farm's home finds what it depends on at `{out}/<stage>/<index>/<file>` in a folder of this node's own, put there from the nodes that made it or the home, checked by hash.
//!
//! The coordinator's log says, for each dependency, which node ran it and
//! the blake3 of each file it left ([`Request::DepOutputs`]). That node
//! keeps them until the farm's home has them all, and the home has them
//! from then on: either may give them. A dependency whose only copy went
//! with its node is made again (the home finds it lost and the coordinator
//! runs it again): the task waits for that run, and never starts with a
//! file missing.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use mesh_protocol::farm::TaskRef;
use mesh_protocol::mesh::{Entry, FarmId, FarmSpec, NodeId, OutputFile};
use mesh_protocol::wire::{DepOutputs, Request, Response};

use super::staging::{fetch_any, file_hash, place_riding, replace_with};
use super::transfer::{FetchError, Transfers};
use super::{Farms, Runs};
use crate::mesh_node::refusals::RequestError;
use crate::mesh_node::LoopHandle;
use crate::warm::Riding;

/// How long a task waits for what it depends on (a run made again after
/// its node died, a coordinator being elected) before it fails for it.
const DEPS_WAIT: Duration = Duration::from_secs(600);
/// How long a task holds its slot waiting for a dependency being made
/// again before it goes back to the coordinator: the slot may be the one
/// that run needs (a submitter killed mid-graph left every worker's slots
/// to tasks waiting for its lost outputs).
const REMADE_HOLD: Duration = Duration::from_secs(3);

/// Why the outputs a task depends on are not in place.
pub(in crate::mesh_node) enum NotPlaced {
    /// Some are being made again: the task goes back, unstarted.
    Remade,
    /// Not in place within [`DEPS_WAIT`], for the last reason seen.
    Failed(DepsError),
}

/// Why the outputs a task depends on are not in place yet.
#[derive(Debug, thiserror::Error)]
pub(in crate::mesh_node) enum DepsError {
    #[error(transparent)]
    Ask(#[from] RequestError),
    #[error("an unexpected answer from the coordinator")]
    Unexpected,
    #[error("{0} of its dependencies are being made again")]
    Remaking(u64),
    #[error(transparent)]
    Fetch(#[from] FetchError),
}

/// Where a task's dependencies come from, and where they go.
pub(in crate::mesh_node) struct DepsPlace {
    pub(in crate::mesh_node) farm: FarmId,
    pub(in crate::mesh_node) task: TaskRef,
    pub(in crate::mesh_node) me: NodeId,
    /// This node's `{out}` for the farm.
    pub(in crate::mesh_node) out: PathBuf,
    pub(in crate::mesh_node) cache: PathBuf,
    /// The outputs this node made for the farm, by hash.
    pub(in crate::mesh_node) held: PathBuf,
    /// The task runs in a warm Python worker: the outputs that rode with
    /// the log are handed to it in memory, not put in files (see
    /// `executor::Launch::riding`).
    pub(in crate::mesh_node) in_memory: bool,
}

/// Puts every output `p.task` depends on under `p.out`, from this node's
/// own, its cache, the node that made it or the home; waits (asking
/// again) while a dependency is being made again. Bytes fetched from
/// other nodes are counted by the transfers.
pub(in crate::mesh_node) async fn place_deps(
    t: &Arc<Transfers>,
    handle: &LoopHandle,
    spec: &FarmSpec,
    p: &DepsPlace,
) -> Result<Riding, NotPlaced> {
    let start = tokio::time::Instant::now();
    let until = start + DEPS_WAIT;
    let mut pause = Duration::from_millis(100);
    loop {
        let why = match ask(handle, p.farm, p.task).await {
            Ok(deps) if deps.waiting == 0 => match place_all(t, handle, spec, p, &deps).await {
                Ok(riding) => return Ok(riding),
                Err(e) => e.into(),
            },
            Ok(_) if start.elapsed() >= REMADE_HOLD => return Err(NotPlaced::Remade),
            Ok(deps) => DepsError::Remaking(deps.waiting),
            Err(e) => e,
        };
        if tokio::time::Instant::now() + pause >= until {
            return Err(NotPlaced::Failed(why));
        }
        tracing::debug!(farm = %p.farm, task = ?p.task, "dependencies not here yet ({why}); again in {pause:?}");
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(5));
    }
}

async fn ask(handle: &LoopHandle, farm: FarmId, task: TaskRef) -> Result<DepOutputs, DepsError> {
    match handle
        .ask_coordinator(Request::DepOutputs { farm, task })
        .await?
    {
        Response::DepOutputs(d) => Ok(d),
        _ => Err(DepsError::Unexpected),
    }
}

async fn place_all(
    t: &Arc<Transfers>,
    handle: &LoopHandle,
    spec: &FarmSpec,
    p: &DepsPlace,
    deps: &DepOutputs,
) -> Result<Riding, FetchError> {
    let mut riding = Riding::new();
    for (d, node, outputs) in &deps.done {
        let dir = p
            .out
            .join(&spec.def.stage(*d).name)
            .join(d.index.to_string());
        let mut sources = vec![*node];
        sources.extend(deps.home.filter(|h| h != node && *h != p.me));
        sources.retain(|s| *s != p.me);
        for o in outputs {
            let dest = dir.join(&o.path);
            if o.rides() {
                if p.in_memory {
                    if let Some(data) = &o.data {
                        let stage = &spec.def.stage(*d).name;
                        riding.push((format!("{stage}/{}/{}", d.index, o.path), data.to_vec()));
                    }
                    continue;
                }
                let (o2, d2) = (o.clone(), dest.clone());
                tokio::task::spawn_blocking(move || place_riding(&o2, &d2)).await??;
                continue;
            }
            let hex = blake3::Hash::from(o.hash).to_hex().to_string();
            // Made here: kept by hash among this node's outputs of the farm.
            let own = p.held.join(&hex);
            let cached = p.cache.join(&hex);
            let (d2, o2, c2, h) = (dest.clone(), own.clone(), cached.clone(), o.hash);
            let here = tokio::task::spawn_blocking(move || in_place(&d2, &[&o2, &c2], &h)).await;
            if here.unwrap_or(false) {
                continue;
            }
            let from = if own.is_file() {
                own
            } else {
                if !cached.is_file() {
                    fetch_any(t, handle, &sources, p.farm, o.hash, &cached)
                        .await
                        .map_err(|e| FetchError::Dep {
                            output: format!("{}/{}/{}", spec.def.stage(*d).name, d.index, o.path),
                            source: Box::new(e),
                        })?;
                }
                cached
            };
            let (from, dest2, mode) = (from.clone(), dest.clone(), o.mode);
            // Another attempt's file of the same name, made before a
            // dependency ran again, gives way: replaced whole, so another
            // task here reading it meanwhile sees one or the other.
            tokio::task::spawn_blocking(move || replace_with(&from, &dest2, mode)).await??;
        }
        if p.in_memory && outputs.iter().all(|o| o.rides()) {
            // No file of it here.
            continue;
        }
        // A file an earlier run of the dependency made, and this one did
        // not, is not what it made: a task's view shows the folder whole.
        let (keep, d2): (Vec<String>, _) = (
            outputs.iter().map(|o| o.path.clone()).collect(),
            dir.clone(),
        );
        tokio::task::spawn_blocking(move || {
            crate::results::prune(&d2, &keep.iter().map(String::as_str).collect())
        })
        .await?
        .map_err(FetchError::io(FetchError::Place, &dir))?;
    }
    Ok(riding)
}

/// Whether `dest` is already the file of this hash, put there for another
/// task of the farm on this node: a link to where this node keeps it, or
/// a copy with these contents. Another file of the name (an earlier run of
/// a dependency made again since) is not.
fn in_place(dest: &Path, of: &[&Path], hash: &[u8; 32]) -> bool {
    let Ok(m) = fs::metadata(dest) else {
        return false;
    };
    of.iter()
        .any(|p| fs::metadata(p).is_ok_and(|o| o.ino() == m.ino() && o.dev() == m.dev()))
        || file_hash(dest).is_ok_and(|h| h == *hash)
}

impl Runs {
    /// On the home: serves a task's outputs from the farm's output folder,
    /// by hash, to nodes whose tasks depend on them (after the node that
    /// made them is gone, the home is the one left with them).
    pub(in crate::mesh_node) fn serve_outputs(
        &self,
        farm: FarmId,
        task: TaskRef,
        outputs: &[OutputFile],
        farms: &dyn Farms,
    ) {
        let Some(r) = farms.replica(farm).filter(|r| r.home) else {
            return;
        };
        let dir = PathBuf::from(r.out_dir())
            .join(&r.spec.def.stage(task).name)
            .join(task.index.to_string());
        // One that rode with the log is no file here: it goes with the log.
        for o in outputs.iter().filter(|o| !o.rides()) {
            self.transfers.serve_file(o.hash, dir.join(&o.path));
        }
    }

    /// At start: the outputs of every farm this node is the home of that
    /// are here, served again (see `serve_outputs`).
    pub(in crate::mesh_node) fn serve_home_outputs(&self, farms: &dyn Farms) {
        for r in farms.replicas().filter(|r| r.home) {
            for &t in &r.collected {
                if let Some(Entry::Done { outputs, .. }) = r.log.get(t) {
                    self.serve_outputs(r.id(), t, outputs, farms);
                }
            }
        }
    }
}
