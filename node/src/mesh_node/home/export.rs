//! `mesh export` on a node: a farm this node keeps a copy of, as a WfCommons trace, from that copy of the farm's replicated log and the machines' beats (see `crate::export`).
//!
//! What each task's entry says is read on the loop (a pass over the log,
//! as a `Tasks` request makes); the machines the coordinator hears come in
//! one request to it; the files' sizes are read and the trace is written
//! off the loop, so a large farm does not hold the node up.

use super::queries::{find_known, found};
use super::{label_of, Home, Lent};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use mesh_protocol::engine::TaskEnd;
use mesh_protocol::mesh::{Beat, Entry, FarmId, NodeId, Replica};
use mesh_protocol::wire::{Request, Response};
use mesh_protocol::TaskRef;

use crate::control::{ControlResponse, ErrorKind};
use crate::export::{self, Ended, FarmFacts, Machine, TaskFacts};
use crate::mesh_node::farm_display_id;
use crate::mesh_node::reply::Reply;
use crate::task_words::describe_failure;

/// How long the coordinator has to say which nodes it hears (and what
/// they offer); past that, the machines are those this node hears.
const MACHINES_WAIT: Duration = Duration::from_secs(5);

impl Home {
    /// Answers `Export`: the farm `query` as a trace, or why not.
    pub(in crate::mesh_node) fn export(&mut self, m: &mut Lent<'_>, query: &str, reply: Reply) {
        let fid = match find_known(m, query) {
            Ok(f) => f,
            Err(e) => {
                let _ = reply.send(e.said());
                return;
            }
        };
        let Some(r) = m.mesh.replica(fid) else {
            let home = found(m, fid)
                .map(|f| format!(" (its home is {})", label_of(m, f.home.node)))
                .unwrap_or_default();
            let _ = reply.send(ControlResponse::error(ErrorKind::Refused, format!(
                "this node keeps no copy of the log of {}: export it on its home or a node that keeps one{home}",
                m.mesh
                    .spec(fid)
                    .map_or_else(|| fid.to_string(), |s| farm_display_id(&s.def.name, fid))
            )));
            return;
        };
        let mut facts = FarmFacts::new(
            (*r.spec.def).clone(),
            farm_display_id(&r.spec.def.name, fid),
            crate::state::unix_ms(),
        );
        // A few nodes run a farm's many tasks: each named once.
        let mut labels: HashMap<NodeId, String> = HashMap::new();
        for (s, stage) in r.spec.def.stages.iter().enumerate() {
            for i in 0..stage.len() {
                let t = TaskRef::new(s as u32, i);
                facts.tasks[s][i as usize] = task_facts(m, r, fid, t, &mut labels);
            }
        }
        let spec = r.spec.clone();
        let cache = m.state.join("cache");
        let mut beats: HashMap<String, Arc<Beat>> = m.mesh.node_beats().into_iter().collect();
        let coordinator = m.mesh.coordinator().filter(|c| *c != m.me);
        let handle = m.handle.clone();
        tokio::spawn(async move {
            if let Some(c) = coordinator {
                if let Ok(Ok(Response::Nodes(heard))) =
                    tokio::time::timeout(MACHINES_WAIT, handle.request(c, Request::Nodes)).await
                {
                    // The coordinator hears every node's beat; a worker
                    // hears its coordinator's alone.
                    beats.extend(heard);
                }
            }
            facts.machines = beats
                .iter()
                .map(|(name, b)| Machine::of(name, &b.total))
                .collect();
            let answer = tokio::task::spawn_blocking(move || {
                facts.input_sizes = input_sizes(&spec, &cache);
                let (trace, _) = export::trace(&facts);
                ControlResponse::Trace(Box::new(trace))
            })
            .await
            .unwrap_or_else(|e| {
                ControlResponse::error(ErrorKind::Refused, format!("writing the trace failed: {e}"))
            });
            let _ = reply.send(answer);
        });
    }
}

/// What the farm's log says of task `t`: the run that counts, with its
/// times where the log has them (a copy restored after a restart keeps
/// none: then what this node saw, if it ran it).
fn task_facts(
    m: &Lent<'_>,
    r: &Replica,
    fid: FarmId,
    t: TaskRef,
    labels: &mut HashMap<NodeId, String>,
) -> TaskFacts {
    let mut f = TaskFacts::default();
    let mut label = |n: NodeId| labels.entry(n).or_insert_with(|| label_of(m, n)).clone();
    let Some(e) = r.log.get(t) else {
        return f;
    };
    f.grew = e.ran().and_then(|r| r.grew);
    f.usage = e.ran().and_then(|r| r.usage);
    match e {
        Entry::Done {
            node,
            attempt,
            outputs,
            ..
        } => {
            f.ended = Ended::Done;
            f.node = Some(label(*node));
            f.attempt = *attempt;
            f.outputs = outputs.iter().map(|o| (o.path.clone(), o.size)).collect();
            // A run that counts exited 0 when only 0 counts.
            f.exit_code = (r.spec.def.stage(t).success_codes == [0]).then_some(0);
        }
        Entry::Failed {
            node,
            attempt,
            end,
            stderr_line,
            ..
        } => {
            f.ended = Ended::Failed;
            f.node = Some(label(*node));
            f.attempt = *attempt;
            f.reason = Some(describe_failure(end, stderr_line.as_deref()));
            if let TaskEnd::Exited(c) = **end {
                f.exit_code = Some(c);
            }
        }
        Entry::Redo { .. } => return f,
    }
    if f.attempt == 0 {
        // Reused from an earlier farm: it did not run in this one.
        return f;
    }
    match e.ran() {
        Some(ran) if ran.ended_ms != 0 => {
            f.start_ms = ran.started_ms();
            f.runtime_ms = Some(ran.duration_ms);
            f.exit_code = ran.exit_code.or(f.exit_code);
        }
        // Not said in the log (a copy restored from the store's
        // records keeps no times): what this node saw, if it ran it.
        _ => {
            if let (Some(start), Some(end)) = m.runs.record().run_times(fid, t, f.attempt) {
                f.start_ms = Some(start);
                f.runtime_ms = Some(end.saturating_sub(start));
            }
        }
    }
    f
}

/// The size of each of the farm's inputs, where this node can see it: in
/// its cache by content (exactly the file the farm was submitted with),
/// else in the farm's folder (on the node it was submitted to).
fn input_sizes(
    spec: &mesh_protocol::mesh::FarmSpec,
    cache: &std::path::Path,
) -> HashMap<String, u64> {
    let root = PathBuf::from(&spec.def.root);
    spec.inputs
        .iter()
        .filter_map(|i| {
            let hex = blake3::Hash::from(i.hash).to_hex().to_string();
            let size = std::fs::metadata(cache.join(hex))
                .or_else(|_| std::fs::metadata(root.join(&i.path)))
                .ok()
                .filter(std::fs::Metadata::is_file)?
                .len();
            Some((i.path.clone(), size))
        })
        .collect()
}
