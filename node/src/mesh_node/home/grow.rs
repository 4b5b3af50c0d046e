//! An open farm grows at its home: the stages a client adds loaded against the farm's own, their inputs hashed off the loop, and the next generation of its spec offered to the coordinator (see `docs/design/open-farm.md`).

use super::kept_lent;
use super::queries::find_known;
use super::{Home, HomeOut, Lent};
use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mesh_protocol::mesh::FarmSpec;

use super::commands::{invalid, write_manifests, Added, Growth};
use crate::control::{ControlResponse, ErrorKind};
use crate::farmfile::{self, LoadOptions};
use crate::mesh_node::kept::{task_keys, TaskKeys};
use crate::mesh_node::refusals::QueryError;
use crate::mesh_node::reply::Reply;
use crate::mesh_node::runs::hash_inputs;
use crate::mesh_node::Event;

/// How long an open farm that was held goes without a hold before its
/// home closes it: a client whose connection dropped holds it again
/// within a second (`Run.hold`), one that is gone does not.
const HOLD_GRACE: Duration = Duration::from_secs(5);
/// How often a close not yet taken is sent again.
const CLOSE_AGAIN: Duration = Duration::from_secs(2);

/// Why an open farm did not grow.
#[derive(Debug, thiserror::Error)]
pub(in crate::mesh_node) enum GrowError {
    #[error("{0}")]
    Unknown(#[from] QueryError),
    #[error("farm {0}: not held here")]
    NotHeld(String),
    #[error("farm {0} has its home on another node: a farm grows on the node it was submitted to")]
    HomeElsewhere(String),
    #[error("closed farm {0}: a farm takes stages only while open (submitted with `open`, not closed since)")]
    Closed(String),
    #[error(
        "{file}: the stages added to a farm must be in its folder {root} (this file is in {here})"
    )]
    Folder {
        file: String,
        root: String,
        here: String,
    },
    #[error("{0}")]
    Input(#[from] crate::mesh_node::runs::SubmitError),
}

impl GrowError {
    /// This refusal as the client hears it: a closed farm is a kind of
    /// its own, which a client answers by opening another.
    fn said(&self) -> ControlResponse {
        let kind = match self {
            GrowError::Unknown(e) => e.kind(),
            GrowError::Closed(_) => ErrorKind::ClosedFarm,
            GrowError::NotHeld(_)
            | GrowError::HomeElsewhere(_)
            | GrowError::Folder { .. }
            | GrowError::Input(_) => ErrorKind::Refused,
        };
        ControlResponse::error(kind, self.to_string())
    }
}

impl Home {
    /// Holds an open farm whose home is here open while `reply`'s
    /// connection lasts (see `ControlRequest::Hold`).
    pub(in crate::mesh_node) fn hold_farm(
        &mut self,
        m: &mut Lent<'_>,
        farm: &str,
        cancel: bool,
        reply: Reply,
    ) {
        let fid = match self.growable(m, farm) {
            Ok(spec) => spec.id,
            Err(e) => {
                let _ = reply.send(e.said());
                return;
            }
        };
        let Some(o) = self.farms.get_mut(&fid) else {
            return;
        };
        let held = ControlResponse::Held {
            farm: o.view.id.clone(),
            open: true,
            gone: Vec::new(),
        };
        if reply.send(held).is_ok() {
            o.holds.push(reply);
            (o.held, o.unheld_since) = (true, None);
            o.cancel_unheld |= cancel;
        }
    }

    /// Says to every connection holding an open farm that it still is:
    /// a connection whose client is gone fails to take it (its writer
    /// ends on the closed socket). A farm with no hold for [`HOLD_GRACE`]
    /// is closed (the close sent again while the farm is still open: a
    /// growth under way when the client died comes first, and refuses
    /// it), and the holds of a farm closed or over otherwise are told so.
    pub(in crate::mesh_node) fn beat_holds(&mut self, m: &mut Lent<'_>) {
        let now = Instant::now();
        let mut close = Vec::new();
        let mut cancel = Vec::new();
        let gone = std::mem::take(&mut self.gone);
        for (fid, o) in self.farms.iter_mut().filter(|(_, o)| o.held) {
            let open = m.mesh.spec(*fid).is_some_and(|s| s.open) && !o.view.finished;
            let farm = o.view.id.clone();
            if !open {
                for h in o.holds.drain(..) {
                    let _ = h.send(ControlResponse::Held {
                        farm: farm.clone(),
                        open: false,
                        gone: Vec::new(),
                    });
                }
                (o.held, o.unheld_since, o.close_sent) = (false, None, None);
                continue;
            }
            o.holds.retain(|h| {
                h.offer(ControlResponse::Held {
                    farm: farm.clone(),
                    open: true,
                    gone: gone.clone(),
                })
                .is_ok()
            });
            o.view.held = !o.holds.is_empty();
            if !o.holds.is_empty() {
                o.unheld_since = None;
                continue;
            }
            let since = *o.unheld_since.get_or_insert(now);
            let resend = o
                .close_sent
                .is_none_or(|at| now.duration_since(at) >= CLOSE_AGAIN);
            if now.duration_since(since) >= HOLD_GRACE && resend {
                if o.cancel_unheld {
                    tracing::info!(%fid, "no client has held farm {farm} for {HOLD_GRACE:?}: it is cancelled, as its client asked");
                    o.held = false;
                    cancel.push(*fid);
                    continue;
                }
                if o.close_sent.is_none() {
                    tracing::info!(%fid, "no client has held farm {farm} open for {HOLD_GRACE:?}: it is closed");
                }
                o.close_sent = Some(now);
                close.push(farm);
            }
        }
        self.out.extend(cancel.into_iter().map(HomeOut::Cancel));
        for farm in close {
            let growth = Growth {
                added: Added::Text {
                    toml: String::new(),
                    file: String::new(),
                },
                close: true,
                rerun: false,
            };
            self.grow_farm(m, &farm, growth, Reply::channel().0);
        }
    }

    /// Adds a client's stages to an open farm whose home is here, or closes it.
    pub(in crate::mesh_node) fn grow_farm(
        &mut self,
        m: &mut Lent<'_>,
        farm: &str,
        g: Growth,
        reply: Reply,
    ) {
        let spec = match self.growable(m, farm) {
            Ok(spec) => spec,
            Err(e) => {
                let _ = reply.send(e.said());
                return;
            }
        };
        let handle = m.handle.clone();
        tokio::task::spawn_blocking(move || {
            let next = next_generation(&spec, &g, &reply);
            let Some(next) = next else {
                return;
            };
            // Which task is which, for a user browsing the folder: written
            // once the growth is on its way, not before (a folder and a file
            // per growth were half of a loop of submits' time a call). Not
            // for calls: a call's value goes to its client, and its task's
            // values name blobs no one browses for (the inodes a call made
            // were most of the time of a loop of `submit(...).result()`).
            let calls = matches!(g.added, Added::Calls(_));
            let added = next
                .as_ref()
                .ok()
                .filter(|_| !calls)
                .map(|(n, _)| (n.def.out.clone(), n.def.stages.skip(spec.def.stages.len())));
            let warn = reply.clone();
            let _ = handle.tell_blocking(Event::Grow(next, reply));
            if let Some((out, stages)) = added {
                write_manifests(&out, &stages, &warn);
            }
        });
    }

    /// The spec of the open farm `farm` names, when its home is here.
    fn growable(&self, m: &Lent<'_>, farm: &str) -> Result<Arc<FarmSpec>, GrowError> {
        let fid = find_known(m, farm).map_err(GrowError::Unknown)?;
        let spec = m
            .mesh
            .spec(fid)
            .cloned()
            .ok_or_else(|| GrowError::NotHeld(farm.to_string()))?;
        let home_here =
            self.farms.contains_key(&fid) && m.mesh.replica(fid).is_some_and(|r| r.home);
        if !home_here {
            return Err(GrowError::HomeElsewhere(farm.to_string()));
        }
        if !spec.open {
            return Err(GrowError::Closed(farm.to_string()));
        }
        Ok(spec)
    }

    /// The next generation of an open farm, made off the loop: offered
    /// to the coordinator, and answered `Submitted` once durable.
    pub(in crate::mesh_node) fn grown(
        &mut self,
        m: &mut Lent<'_>,
        next: Result<(FarmSpec, Option<TaskKeys>), GrowError>,
        reply: Reply,
    ) {
        let (next, keys) = match next {
            Ok(next) => next,
            Err(e) => {
                let _ = reply.send(e.said());
                return;
            }
        };
        let id = next.id;
        m.runs.serve_inputs(&next);
        let from = m.mesh.spec(id).map_or(0, |s| s.def.stages.len());
        let reused = keys.map_or_else(Vec::new, |k| {
            let (kept, mut lent) = kept_lent(m);
            kept.reused_in_growth(&mut lent, &next, &k, from)
        });
        let grows = m
            .mesh
            .replica(id)
            .filter(|r| r.home)
            .is_some_and(|r| r.spec.grows_into(&next));
        if !grows {
            let _ = reply.send(ControlResponse::error(
                ErrorKind::Refused,
                "the farm grew or closed meanwhile (another client's stages came first): send again",
            ));
            return;
        }
        // Its new stages, and whether it is open, shown once the peer has it.
        self.out.push_back(HomeOut::Grow(next, reused));
        if let Some(o) = self.farms.get_mut(&id) {
            if let Some(earlier) = o.submit_reply.replace(reply) {
                let _ = earlier.send(ControlResponse::error(
                    ErrorKind::Refused,
                    "the farm grew again before this growth was durable",
                ));
            }
        }
    }
}

/// `spec` with the stages of `g` added (none when it closes the farm
/// only), their inputs hashed; `None` once its mistake is said.
fn next_generation(
    spec: &FarmSpec,
    g: &Growth,
    reply: &Reply,
) -> Option<Result<(FarmSpec, Option<TaskKeys>), GrowError>> {
    let mut def = (*spec.def).clone();
    // The calls' tasks, said once their inputs are found.
    let mut named = None;
    match &g.added {
        Added::Text { toml, file } if !toml.trim().is_empty() => {
            let opts = LoadOptions {
                out: Some(Path::new(&spec.def.out).to_path_buf()),
                before: spec.def.stages.clone(),
                before_graph: spec.def.graph.built().cloned(),
            };
            let (grown, warnings) =
                match farmfile::load_str_with_warnings(Path::new(file), toml, &opts) {
                    Ok(d) => d,
                    Err(e) => {
                        let _ = reply.send(invalid(file, &e));
                        return None;
                    }
                };
            if grown.root != def.root {
                return Some(Err(GrowError::Folder {
                    file: file.clone(),
                    root: def.root.clone(),
                    here: grown.root,
                }));
            }
            for w in warnings {
                let _ = reply.send(ControlResponse::Warning(w.to_string()));
            }
            def.stages = grown.stages;
            // The loader's graph, and the tables of the generation before to
            // build the others on.
            def.graph = grown.graph.built_on(&spec.def.graph);
        }
        Added::Text { .. } => {}
        Added::Calls(batch) => match crate::calls::grow(&mut def, batch) {
            Ok(tasks) => named = Some(tasks),
            Err(e) => {
                let _ = reply.send(ControlResponse::error(ErrorKind::Refused, e.to_string()));
                return None;
            }
        },
    }
    let old = spec.def.stages.len();
    let mut seen: HashSet<String> = spec.inputs.iter().map(|i| i.path.clone()).collect();
    let added = match hash_inputs(&def, old, &mut seen) {
        Ok(added) => added,
        Err(e) => return Some(Err(e.into())),
    };
    if let Some(tasks) = named {
        let _ = reply.send(ControlResponse::Named { tasks });
    }
    let mut inputs = spec.inputs.clone();
    inputs.extend(added);
    // Field by field: `..spec.clone()` made and dropped a copy of every
    // stage's handle, twice a growth of a farm of thousands of stages.
    let next = FarmSpec {
        id: spec.id,
        origin: spec.origin,
        def: Arc::new(def),
        inputs,
        submitted_ms: spec.submitted_ms,
        gen: spec.gen + 1,
        open: !g.close,
    };
    // Worked out here, off the loop: every task's key, as a submission's.
    let keys = (!g.rerun && next.def.stages.len() > old).then(|| task_keys(&next, old));
    Some(Ok((next, keys)))
}

#[cfg(test)]
mod tests {
    use super::GrowError;
    use super::QueryError;
    use crate::control::{ControlResponse, ErrorKind};

    fn kind(e: GrowError) -> ErrorKind {
        match e.said() {
            ControlResponse::Error { kind, .. } => kind,
            other => panic!("not a refusal: {other:?}"),
        }
    }

    #[test]
    fn a_closed_farm_and_an_unknown_one_are_refused_as_kinds_a_client_reads() {
        assert_eq!(
            kind(GrowError::Closed("python-1a2b".into())),
            ErrorKind::ClosedFarm
        );
        assert_eq!(
            kind(GrowError::NotHeld("python-1a2b".into())),
            ErrorKind::Refused
        );
        let unknown = GrowError::Unknown(QueryError::Unknown("python-1a2b".into()));
        assert_eq!(unknown.to_string(), "no farm `python-1a2b` is known here");
        assert_eq!(kind(unknown), ErrorKind::UnknownFarm);
    }
}
