//! Queries about the mesh and its farms: the status (with what each node says of itself), farms this node holds or coordinates, and those found by asking the coordinator.

use super::{label_of, Home, Lent};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mesh_protocol::mesh::{Beat, Entry, FarmId, NodeId};
use mesh_protocol::observe::{LatencyData, Observation};
use mesh_protocol::wire::{FarmSummary, FoundFarm, Request, Response};

use super::logs::LogAsk;
use super::views::FAILURES_SHOWN;
use crate::mesh_node::refusals::{QueryError, RequestError, FIND_WAIT};
use crate::mesh_node::reply::Reply;

use crate::control::ControlResponse;
use crate::mesh_node::{farm_display_id, Event};
use crate::view::{FarmView, MeshStatus, NodeView, Observed};

/// How long a count of the outputs kept here stands.
const HELD_RECOUNT: Duration = Duration::from_secs(5);

/// How long `mesh status` and the dashboard wait for a node to say how it
/// is: one that does not answer in time is shown as this node last heard
/// it, or without it.
const ASK_WAIT: std::time::Duration = std::time::Duration::from_millis(800);
/// How long they wait for the coordinator's view of every node: one
/// request, which on a loaded machine may first have to open a connection
/// (the nodes are otherwise shown as this node last heard them, which for
/// a worker is without their load, and the status says so).
const COORDINATOR_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// The dashboard's task stream shows the runs of this many of the busiest
/// nodes (and this one): each is a request a second, and a chart of a
/// thousand nodes' slots reads as nothing.
const OBSERVED_MAX: usize = 16;

/// What a control request about a farm not held here was waiting for.
pub(in crate::mesh_node) enum Asked {
    Status(Reply),
    Resume(Option<String>, Reply),
    Logs(LogAsk, Reply),
}

impl Home {
    /// A farm whose home is this node.
    pub(in crate::mesh_node) fn find_farm(
        &self,
        m: &Lent<'_>,
        query: &str,
    ) -> Result<FarmId, QueryError> {
        let homes: Vec<Known> = self
            .farms
            .iter()
            .map(|(id, o)| Known {
                id: *id,
                shown: o.view.id.clone(),
                name: o.view.name.clone(),
                submitted_ms: m.mesh.spec(*id).map_or(0, |s| s.submitted_ms),
            })
            .collect();
        match_farm(query, &homes).map_err(|e| QueryError::NotHome(Box::new(e)))
    }

    /// Asks the coordinator about a farm this node does not hold.
    pub(in crate::mesh_node) fn ask_coordinator(
        &mut self,
        m: &mut Lent<'_>,
        query: String,
        asked: Asked,
    ) {
        let handle = m.handle.clone();
        if m.mesh.coordinator() == Some(m.me) {
            self.answer(m, Err(QueryError::NotInMesh(query)), asked);
            return;
        }
        tokio::spawn(async move {
            // The coordinator may be the node that just died (`mesh resume`
            // on another node right after): asked again, of whichever node
            // coordinates, until one answers.
            let until = tokio::time::Instant::now() + FIND_WAIT;
            let mut pause = Duration::from_millis(250);
            let r = loop {
                let req = Request::FindFarm {
                    query: query.clone(),
                };
                let why = match handle.ask_coordinator(req).await {
                    Ok(Response::Farm(f)) => break Ok(*f),
                    Ok(_) => break Err(QueryError::Unexpected),
                    Err(RequestError::Refused(e)) => break Err(QueryError::Refused(e)),
                    Err(RequestError::Stopping) => break Err(QueryError::Stopping),
                    Err(e) => e,
                };
                if tokio::time::Instant::now() + pause >= until {
                    break Err(QueryError::NoCoordinator { why });
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(2));
            };
            let _ = handle.tell(Event::Found(Box::new(r), asked)).await;
        });
    }

    /// Answers a control request about a farm with what was found.
    pub(in crate::mesh_node) fn answer(
        &mut self,
        m: &mut Lent<'_>,
        found: Result<FoundFarm, QueryError>,
        asked: Asked,
    ) {
        let f = match found {
            Ok(f) => f,
            Err(e) => {
                let reply = match asked {
                    Asked::Status(r) | Asked::Resume(_, r) | Asked::Logs(_, r) => r,
                };
                let _ = reply.send(e.said());
                return;
            }
        };
        match asked {
            Asked::Status(reply) => {
                let mut view = self.found_view(m, &f);
                if let Some(r) = m.mesh.replica(f.spec.id) {
                    // Each task's run that counts, done or failed for good.
                    let runs = r.log.current().filter_map(|e| {
                        let ran = e.ran()?;
                        Some(crate::used::Measured {
                            stage: e.task().stage,
                            runtime_ms: ran.duration_ms,
                            usage: ran.usage?,
                        })
                    });
                    view.used = crate::used::by_stage(&r.spec.def, runs);
                }
                let _ = reply.send(ControlResponse::Farm(Box::new(view)));
            }
            Asked::Resume(out, reply) => {
                self.take_home(m, f, out, reply);
            }
            Asked::Logs(ask, reply) => self.follow_logs(m, Arc::new(f.spec), ask, reply),
        }
    }

    fn status(&self, m: &Lent<'_>) -> MeshStatus {
        let coordinator = m.mesh.coordinator();
        // Every node, this one included, as its beat describes it.
        let view = |id: String, node: NodeId, b: &Beat, local: bool| {
            let mut v = NodeView {
                id,
                coordinator: coordinator == Some(node),
                local,
                ..NodeView::default()
            };
            v.describe(b);
            v
        };
        let own = m.mesh.beat();
        let mut nodes = vec![view(m.net.me_label().to_owned(), m.me, &own, true)];
        nodes.extend(
            m.mesh
                .members()
                .map(|m| view(m.label().to_string(), m.id, m.beat(), false)),
        );
        let mut farms: Vec<FarmView> = self.farms.values().map(|o| o.view.clone()).collect();
        farms.sort_by(|a, b| a.id.cmp(&b.id));
        MeshStatus {
            nodes,
            coordinator: coordinator.map(|c| label_of(m, c)),
            term: mesh_protocol::mesh::term_round(m.mesh.term()),
            farms,
            latency: Vec::new(),
            unheard: None,
        }
    }

    /// The mesh's status, handed to `done`: every node as the
    /// coordinator hears it (one request, whatever the mesh's size), with
    /// what the nodes `ask` names say of themselves in time (`since`: the
    /// runs each observer has seen, by node).
    pub(in crate::mesh_node) fn gather(
        &mut self,
        m: &mut Lent<'_>,
        since: HashMap<String, u64>,
        ask: Ask,
        done: impl FnOnce(Observed) + Send + 'static,
    ) {
        let status_only = ask != Ask::Busiest;
        let after = move |label: &str| {
            if status_only {
                u64::MAX
            } else {
                since.get(label).copied().unwrap_or(0)
            }
        };
        let mut status = self.status(m);
        let me = m.net.me_label().to_owned();
        let own = observation(m, after(&me));
        let members: HashMap<String, NodeId> = m
            .mesh
            .members()
            .map(|m| (m.label().to_string(), m.id))
            .collect();
        let coordinator = m.mesh.coordinator().filter(|c| *c != m.me);
        let handle = m.handle.clone();
        tokio::spawn(async move {
            if let Some(c) = coordinator {
                let nodes = handle.request(c, Request::Nodes);
                match tokio::time::timeout(COORDINATOR_WAIT, nodes).await {
                    Ok(Ok(Response::Nodes(beats))) => status.nodes = heard(&status, &me, beats),
                    Ok(Ok(_)) => {
                        status.unheard = Some("the coordinator gave another answer".into())
                    }
                    Ok(Err(e)) => {
                        status.unheard = Some(format!("the coordinator did not answer: {e}"))
                    }
                    Err(_) => {
                        status.unheard = Some(format!(
                            "the coordinator did not answer within {} s",
                            COORDINATOR_WAIT.as_secs()
                        ))
                    }
                }
            }
            let wanted: Vec<(String, NodeId)> = match ask {
                Ask::Coordinator => Vec::new(),
                Ask::Every => members.into_iter().collect(),
                Ask::Busiest => {
                    let mut busy: Vec<&NodeView> = status
                        .nodes
                        .iter()
                        .filter(|n| !n.local && n.running > 0)
                        .collect();
                    busy.sort_by_key(|n| std::cmp::Reverse(n.running));
                    busy.iter()
                        .take(OBSERVED_MAX)
                        .filter_map(|n| Some((n.id.clone(), *members.get(&n.id)?)))
                        .collect()
                }
            };
            let asks = wanted.into_iter().map(|(label, id)| {
                let handle = handle.clone();
                let since = after(&label);
                async move {
                    let ask = handle.request(id, Request::Observe { since });
                    match tokio::time::timeout(ASK_WAIT, ask).await {
                        Ok(Ok(Response::Observed(o))) => Some((label, *o)),
                        _ => None,
                    }
                }
            });
            let mut nodes = vec![(me, own)];
            nodes.extend(futures::future::join_all(asks).await.into_iter().flatten());
            done(Observed::new(status, nodes));
        });
    }
}

/// A farm by id, id prefix or name among every farm this node knows.
pub(in crate::mesh_node) fn find_known(m: &Lent<'_>, query: &str) -> Result<FarmId, QueryError> {
    let known: Vec<Known> = m
        .mesh
        .specs()
        .map(|s| {
            let name = s.def.name.clone();
            Known {
                id: s.id,
                shown: farm_display_id(&name, s.id),
                name,
                submitted_ms: s.submitted_ms,
            }
        })
        .collect();
    match_farm(query, &known)
}

/// The farm `mesh logs TASK` means when it names none: the newest this
/// node knows with a stage of that name, as a farm's name means its
/// newest farm.
pub(in crate::mesh_node) fn find_for_task(m: &Lent<'_>, task: &str) -> Result<FarmId, QueryError> {
    let stage = task.rsplit_once('/').map_or(task, |(s, _)| s);
    m.mesh
        .specs()
        .filter(|s| s.def.stages.iter().any(|st| st.name == stage))
        .max_by_key(|s| (s.submitted_ms, s.id))
        .map(|s| s.id)
        .ok_or_else(|| QueryError::NoFarmWith(task.to_string()))
}

/// Every farm this node holds or coordinates, in short.
pub(in crate::mesh_node) fn summaries(m: &Lent<'_>) -> Vec<FarmSummary> {
    let mut ids: Vec<FarmId> = m.mesh.replicas().map(|r| r.id()).collect();
    ids.extend(m.mesh.coordinated());
    ids.sort();
    ids.dedup();
    // In short: no copy of the farm's definition (a sweep's parameters
    // may be megabytes) nor of its failures.
    ids.into_iter()
        .filter_map(|id| {
            let (home, progress, _) = standing(m, id, 0)?;
            let spec = m.mesh.spec(id)?;
            Some(FarmSummary {
                id,
                name: spec.def.name.clone(),
                home,
                progress,
                open: spec.open,
            })
        })
        .collect()
}

/// What this node knows of a farm it holds or coordinates.
pub(in crate::mesh_node) fn found(m: &Lent<'_>, farm: FarmId) -> Option<FoundFarm> {
    let (home, progress, failures) = standing(m, farm, FAILURES_SHOWN)?;
    Some(FoundFarm {
        spec: (**m.mesh.spec(farm)?).clone(),
        home,
        progress,
        failures,
    })
}

/// Where a farm this node holds or coordinates stands: its home, its
/// progress and its first `failures_max` failures.
fn standing(
    m: &Lent<'_>,
    farm: FarmId,
    failures_max: usize,
) -> Option<(
    mesh_protocol::mesh::Home,
    mesh_protocol::mesh::FarmProgress,
    Vec<Entry>,
)> {
    if let Some(s) = m.mesh.coordinated_farm(farm, failures_max) {
        return Some(s);
    }
    let r = m.mesh.replica(farm)?;
    let failures = r.log.failures().take(failures_max).cloned().collect();
    Some((r.home_of, r.progress(), failures))
}

/// What this node measures of itself, with its runs that changed after `since`.
pub(in crate::mesh_node) fn observation(m: &Lent<'_>, since: u64) -> Observation {
    let mut failovers = None;
    let latency = match m.mesh.latencies() {
        Some((l, f)) => {
            failovers = Some(f);
            l.export()
        }
        None => LatencyData::default(),
    };
    let mut o = m.runs.observation(since, latency);
    let stats = m.mesh.stats();
    o.counters.messages_sent = m.net.sent();
    o.counters.tasks_stolen = stats.tasks_stolen;
    o.counters.tasks_given = stats.tasks_given;
    if let Some(f) = failovers {
        o.counters.failovers = f;
    }
    o.beat = Some(Box::new(m.mesh.beat()));
    o.held_bytes = kept_bytes(m);
    o
}

/// Bytes of outputs kept here for other nodes' farms, counted again
/// at most every few seconds.
fn kept_bytes(m: &Lent<'_>) -> u64 {
    if let Some((at, bytes)) = m.disk.kept_count.get() {
        if at.elapsed() < HELD_RECOUNT {
            return bytes;
        }
    }
    let bytes = crate::mesh_node::runs::kept_farms(m.state)
        .iter()
        .map(|(_, dir)| crate::mesh_node::runs::kept_bytes(dir))
        .sum();
    m.disk.kept_count.set(Some((Instant::now(), bytes)));
    bytes
}

/// Whom a status asks, besides the coordinator, for what they measure of
/// themselves (latencies, counters, task runs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::mesh_node) enum Ask {
    /// No one: `mesh status`, `mesh watch`.
    Coordinator,
    /// The busiest few (`OBSERVED_MAX`), for the dashboard's task stream.
    Busiest,
    /// Every node: `mesh status --latency`.
    Every,
}

/// The nodes as the coordinator's beats describe them, this node's own
/// line kept as it describes itself.
fn heard(status: &MeshStatus, me: &str, beats: Vec<(String, Arc<Beat>)>) -> Vec<NodeView> {
    let coordinator = status.coordinator.as_deref();
    let own = status.nodes.iter().find(|n| n.local).cloned();
    own.into_iter()
        .chain(beats.into_iter().filter(|(id, _)| id != me).map(|(id, b)| {
            let mut v = NodeView {
                coordinator: coordinator == Some(id.as_str()),
                id,
                ..NodeView::default()
            };
            v.describe(&b);
            v
        }))
        .collect()
}

/// A farm a query may name: its id, as shown, its name, and when it was submitted.
struct Known {
    id: FarmId,
    shown: String,
    name: String,
    submitted_ms: u64,
}

/// A farm by its display id, name or id prefix among `known`. A name
/// several farms share (a farm file submitted again) means the newest of
/// them, as it does for `mesh run`'s farms: the one a user just submitted.
/// An id prefix that several ids share is ambiguous.
fn match_farm(query: &str, known: &[Known]) -> Result<FarmId, QueryError> {
    if let Some(k) = known.iter().find(|k| k.shown == query) {
        return Ok(k.id);
    }
    // The tie-break on the id keeps the choice the same on every node.
    let newest = known
        .iter()
        .filter(|k| k.name == query)
        .max_by_key(|k| (k.submitted_ms, k.id));
    if let Some(k) = newest {
        return Ok(k.id);
    }
    let hits: Vec<FarmId> = known
        .iter()
        .filter(|k| k.shown.starts_with(query))
        .map(|k| k.id)
        .collect();
    match hits.as_slice() {
        [one] => Ok(*one),
        [] => Err(QueryError::Unknown(query.to_string())),
        _ => Err(QueryError::Ambiguous(query.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::{ControlResponse, ErrorKind};

    #[test]
    fn every_refusal_of_an_unknown_farm_reads_as_one_to_a_client() {
        let q = || "nope".to_string();
        let unknown = |e: &QueryError| e.kind() == ErrorKind::UnknownFarm;
        for e in [
            QueryError::Unknown(q()),
            QueryError::NotInMesh(q()),
            QueryError::UnknownToMesh(q()),
            QueryError::NotHome(Box::new(QueryError::Unknown(q()))),
            QueryError::NoFarmWith(q()),
            // The coordinator's words to a `FindFarm`, passed on.
            QueryError::Refused(QueryError::UnknownToMesh(q()).to_string()),
        ] {
            assert!(unknown(&e), "{e}");
        }
        assert!(!unknown(&QueryError::Ambiguous(q())));
        assert!(!unknown(&QueryError::NoCopy));
        let e = match_farm("nope", &[]).unwrap_err();
        assert!(unknown(&e), "{e}");
        // Said with its words unchanged, the kind beside them.
        let ControlResponse::Error { kind, message } = QueryError::Unknown(q()).said() else {
            panic!("not a refusal");
        };
        assert_eq!(kind, ErrorKind::UnknownFarm);
        assert_eq!(message, "no farm `nope` is known here");
    }

    #[test]
    fn a_name_several_farms_share_means_the_newest_and_a_shared_prefix_is_ambiguous() {
        let k = |id: u64, name: &str, shown: &str, at: u64| Known {
            id: FarmId(id),
            shown: shown.into(),
            name: name.into(),
            submitted_ms: at,
        };
        let known = [
            k(1, "pk", "pk-aa11", 100),
            k(2, "pk", "pk-aa22", 300),
            k(3, "pk", "pk-bb33", 200),
            k(4, "pkx", "pkx-cc44", 400),
        ];
        assert_eq!(match_farm("pk", &known).unwrap(), FarmId(2));
        assert_eq!(match_farm("pk-aa11", &known).unwrap(), FarmId(1));
        assert_eq!(match_farm("pk-b", &known).unwrap(), FarmId(3));
        assert!(matches!(
            match_farm("pk-aa", &known),
            Err(QueryError::Ambiguous(_))
        ));
    }
}
