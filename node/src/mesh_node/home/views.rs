//! Farms as users see them: the view of each farm whose home is this node (`Origin`, kept fresh for `mesh wait` and `status`), and views of farms found elsewhere or listed in short.

use super::{label_of, Home, Lent};
use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use mesh_protocol::engine::Stop;
use mesh_protocol::farm::FarmDef;
use mesh_protocol::mesh::{Entry, FarmId, FarmSpec, NodeId};
use mesh_protocol::wire::{FarmSummary, FoundFarm};

use crate::control::ControlResponse;
use crate::eta;
use crate::mesh_node::reply::Reply;
use crate::mesh_node::{farm_display_id, Event};
use crate::task_words::{describe_failure, describe_stop};
use crate::view::{DataView, FarmView};
use mesh_protocol::engine::Counts;
use mesh_protocol::resources::Resources;

/// Failures kept per farm for `mesh wait` and `status`.
pub(in crate::mesh_node) const FAILURES_SHOWN: usize = 50;

/// A farm submitted here, as `mesh wait` and `status` show it.
pub(in crate::mesh_node) struct Origin {
    pub(in crate::mesh_node) view: FarmView,
    pub(in crate::mesh_node) waiters: Vec<Reply>,
    pub(in crate::mesh_node) submit_reply: Option<Reply>,
    /// Clients following the farm's tasks one by one (see `feed.rs`).
    pub(in crate::mesh_node) feeds: Vec<super::feed::Feed>,
    /// Connections holding the open farm open (see `grow.rs`), whether
    /// any has since this node started, since when none has, and when the
    /// close for that was last sent.
    pub(in crate::mesh_node) holds: Vec<Reply>,
    pub(in crate::mesh_node) held: bool,
    pub(in crate::mesh_node) unheld_since: Option<Instant>,
    pub(in crate::mesh_node) close_sent: Option<Instant>,
    /// A hold asked for the farm to be cancelled, not closed, once no
    /// client holds it (a Snakemake's: its jobs end with it).
    pub(in crate::mesh_node) cancel_unheld: bool,
    /// When the bytes still to come were last counted, and the bytes home
    /// then (the rate is over the time between two counts).
    data_counted: Option<(Instant, u64)>,
    /// The version of its copy's stage counts the view last took (see
    /// `StageCounts::since`).
    stages_seen: u64,
    /// The stages whose counts in the view have tasks that will not run
    /// (skipped, cancelled, stopped): the only ones a follower may have
    /// to be told of as not run (see `feed.rs`), kept as the view's counts
    /// change so that telling costs those stages, not the farm's.
    pub(in crate::mesh_node) not_run: BTreeSet<u32>,
    /// How far into the log results are written down for reuse as they
    /// land (see `kept/`), and the done tasks whose outputs were not
    /// home yet then.
    pub(in crate::mesh_node) remembered: u64,
    pub(in crate::mesh_node) remember_wait: Vec<mesh_protocol::ids::TaskRef>,
    /// An estimate of its end is being made; the next is not made before.
    estimating: bool,
    estimate_after: Option<Instant>,
    /// Its estimates so far: in `mesh status FARM`'s answer only, not in
    /// every view the dashboard and `mesh list` send.
    eta_history: Vec<eta::Estimated>,
}

/// The bytes still to come are counted again at most this often (over
/// every output not home).
const DATA_COUNT_EVERY: Duration = Duration::from_secs(1);

impl Origin {
    pub(in crate::mesh_node) fn new(spec: &FarmSpec) -> Origin {
        let def = &spec.def;
        Origin {
            view: FarmView {
                id: farm_display_id(&def.name, spec.id),
                name: def.name.clone(),
                file: String::new(),
                out: def.out.clone(),
                accepted: false,
                open: spec.open,
                held: false,
                finished: false,
                counts: mesh_protocol::engine::Counts {
                    total: def.task_count(),
                    ..Default::default()
                },
                stages: def
                    .stages
                    .iter()
                    .map(|s| {
                        (
                            s.name.clone(),
                            mesh_protocol::engine::Counts {
                                total: s.len() as u64,
                                ..Default::default()
                            },
                        )
                    })
                    .collect(),
                failures: Vec::new(),
                unplaceable: Vec::new(),
                stopped: Vec::new(),
                home: String::new(),
                duplicates: 0,
                redone: 0,
                data: DataView::default(),
                eta: None,
                eta_history: Vec::new(),
                used: Vec::new(),
                asks: Vec::new(),
            },
            waiters: Vec::new(),
            submit_reply: None,
            feeds: Vec::new(),
            holds: Vec::new(),
            held: false,
            unheld_since: None,
            close_sent: None,
            cancel_unheld: false,
            data_counted: None,
            stages_seen: 0,
            not_run: BTreeSet::new(),
            remembered: 0,
            remember_wait: Vec::new(),
            estimating: false,
            estimate_after: None,
            eta_history: Vec::new(),
        }
    }

    fn notify(&mut self) {
        // Cloned for each waiter only: an open farm grown by many batches
        // has a long list of stages, and most farms have no waiter.
        let view = &self.view;
        self.waiters.retain(|w| {
            let r = if view.finished {
                w.send(ControlResponse::Finished(view.clone()))
            } else {
                // The next one, or the end, says as much: a slow
                // reader misses some and is not cut off.
                w.offer(ControlResponse::Progress(view.clone()))
            };
            r.is_ok() && !view.finished
        });
    }
}

impl Home {
    /// The home's view of a farm, from the peer's copy: counts and every failure with its reason.
    pub(in crate::mesh_node) fn refresh_view(&mut self, m: &mut Lent<'_>, farm: FarmId) {
        let Some(r) = m.mesh.replica(farm) else {
            return;
        };
        let p = r.progress_summed();
        let failed: Vec<Entry> = r.log.failures().take(FAILURES_SHOWN).cloned().collect();
        let failures = describe_failures(m, &r.spec, &failed);
        let unplaceable = describe_unplaceable(&r.spec.def, &p.unplaceable);
        let stopped = describe_stops(&r.spec.def, &p.stopped);
        let home = label_of(m, r.home_of.node);
        let out = r.out_dir().to_string();
        let (home_bytes, coming) = m.runs.transfers().home_bytes(farm);
        let Some(o) = self.farms.get_mut(&farm) else {
            return;
        };
        let now = Instant::now();
        let due = o
            .data_counted
            .is_none_or(|(at, _)| now >= at + DATA_COUNT_EVERY);
        if due {
            let to_come: u64 = r
                .missing()
                .filter_map(|e| match e {
                    Entry::Done { outputs, .. } => {
                        Some(outputs.iter().map(|f| f.size).sum::<u64>())
                    }
                    _ => None,
                })
                .sum();
            if let Some((at, before)) = o.data_counted {
                let secs = now.duration_since(at).as_secs_f64();
                o.view.data.rate_bps = home_bytes.saturating_sub(before) as f64 / secs;
            }
            // Outputs coming now are partly here already.
            o.view.data.to_come_bytes = to_come.saturating_sub(coming);
            o.data_counted = Some((now, home_bytes));
        }
        o.view.data.home_bytes = home_bytes;
        o.view.home = home;
        o.view.out = out;
        o.view.counts = p.counts.clone();
        // The stages whose counts changed since the view last looked, and
        // those an open farm added.
        let mut changed = Vec::new();
        if r.stages.version() < o.stages_seen {
            // Another copy than the one the view last looked at: all of it.
            for (s, c) in o.view.stages.iter_mut().zip(r.stages.iter()) {
                s.1 = c.clone();
            }
            changed.extend(0..o.view.stages.len() as u32);
        } else {
            for i in r.stages.since(o.stages_seen) {
                if let Some(s) = o.view.stages.get_mut(i as usize) {
                    s.1 = r.stages[i as usize].clone();
                    changed.push(i);
                }
            }
        }
        o.stages_seen = r.stages.version();
        let named = r.spec.def.stages.len().min(r.stages.len());
        for (i, st) in mesh_protocol::farm::from_on(&r.spec.def.stages, o.view.stages.len()) {
            if i >= named {
                break;
            }
            o.view.stages.push((st.name.clone(), r.stages[i].clone()));
            changed.push(i as u32);
        }
        for s in changed {
            let c = &o.view.stages[s as usize].1;
            if c.skipped + c.cancelled + c.stopped > 0 {
                o.not_run.insert(s);
            } else {
                o.not_run.remove(&s);
            }
        }
        o.view.open = r.spec.open;
        let ended = p.finished && !o.view.finished;
        o.view.finished = p.finished;
        o.view.duplicates = p.duplicates;
        o.view.redone = p.redone;
        o.view.unplaceable = unplaceable;
        o.view.stopped = stopped;
        o.view.failures = failures;
        if ended {
            // Written down before anyone waiting hears of the end: a
            // submission right after it reuses what it made.
            self.remember_results(m, farm);
        } else {
            self.remember_landed(m, farm);
        }
        self.estimate_end(m, farm);
        // Followers of single tasks hear of each before anyone hears the end.
        self.feed(m, farm, None);
        if let Some(o) = self.farms.get_mut(&farm) {
            o.notify();
        }
    }

    /// Starts an estimate of when the farm ends, off the node's loop,
    /// unless one is being made or was made lately (see `eta::next_after`).
    fn estimate_end(&mut self, m: &mut Lent<'_>, farm: FarmId) {
        let now = Instant::now();
        let nodes: Vec<Resources> = match self.farms.get(&farm) {
            Some(o) if o.view.finished => {
                if let Some(o) = self.farms.get_mut(&farm) {
                    o.view.eta = None;
                }
                return;
            }
            Some(o) if !o.estimating && o.estimate_after.is_none_or(|t| now >= t) => m
                .mesh
                .node_beats()
                .into_iter()
                .map(|(_, b)| (*b.total).clone())
                .collect(),
            _ => return,
        };
        let (Some(r), Some(o)) = (m.mesh.replica(farm), self.farms.get_mut(&farm)) else {
            return;
        };
        let counts: Vec<Counts> = o.view.stages.iter().map(|s| s.1.clone()).collect();
        let stages = eta::stages_left(
            &r.spec.def,
            &counts,
            eta::runtimes(&r.spec.def, r.log.current()),
            &nodes,
        );
        let names: Vec<String> = r.spec.def.stages.iter().map(|s| s.name.clone()).collect();
        o.estimating = true;
        let handle = m.handle.clone();
        let seed = farm.0;
        tokio::task::spawn_blocking(move || {
            let started = Instant::now();
            let at = crate::state::unix_ms();
            let estimate = eta::estimate(&stages, names.iter().map(String::as_str), at, seed);
            let _ = handle.tell_blocking(Event::Estimated(farm, estimate, started.elapsed()));
        });
    }

    /// An estimate of the farm's end is made: the views show it.
    pub(in crate::mesh_node) fn estimated(
        &mut self,
        farm: FarmId,
        estimate: Option<eta::Eta>,
        took: Duration,
    ) {
        let Some(o) = self.farms.get_mut(&farm) else {
            return;
        };
        o.estimating = false;
        o.estimate_after = Some(Instant::now() + eta::next_after(took));
        if !o.view.finished {
            if let Some(e) = &estimate {
                eta::remember(&mut o.eta_history, e);
            }
            o.view.eta = estimate;
            o.notify();
        }
    }

    /// A farm's view from what a node that holds it said.
    pub(in crate::mesh_node) fn found_view(&self, m: &Lent<'_>, f: &FoundFarm) -> FarmView {
        let mut o = Origin::new(&f.spec);
        let v = &mut o.view;
        v.accepted = true;
        v.counts = f.progress.counts.clone();
        for (i, c) in f.progress.stages.iter().enumerate() {
            if let Some(s) = v.stages.get_mut(i) {
                s.1 = c.clone();
            }
        }
        v.finished = f.progress.finished;
        v.duplicates = f.progress.duplicates;
        v.redone = f.progress.redone;
        v.unplaceable = describe_unplaceable(&f.spec.def, &f.progress.unplaceable);
        v.stopped = describe_stops(&f.spec.def, &f.progress.stopped);
        v.failures = describe_failures(m, &f.spec, &f.failures);
        v.home = label_of(m, f.home.node);
        v.asks = f
            .spec
            .def
            .stages
            .iter()
            .map(|s| crate::view::StageAsk {
                stage: s.name.clone(),
                mem: s.resources.get(mesh_protocol::resources::MEM).whole(),
                cpu: s.resources.get(mesh_protocol::resources::CPU).as_f64(),
            })
            .collect();
        if let Some(r) = m.mesh.replica(f.spec.id).filter(|r| r.home) {
            v.out = r.out_dir().to_string();
        }
        // The home's estimate of its end (only the home makes one).
        if let Some(here) = self.farms.get(&f.spec.id) {
            if !v.finished {
                v.eta = here.view.eta.clone();
            }
            v.eta_history = here.eta_history.clone();
        }
        o.view
    }
}

fn describe_failures(m: &Lent<'_>, spec: &FarmSpec, entries: &[Entry]) -> Vec<String> {
    entries
        .iter()
        .filter_map(|e| match e {
            Entry::Failed {
                task,
                attempt,
                node,
                end,
                stderr_line,
                ..
            } => Some(format!(
                "{} (attempt {attempt} on {}): {}",
                spec.def.task_name(*task),
                label_of(m, *node),
                describe_failure(end, stderr_line.as_deref())
            )),
            _ => None,
        })
        .collect()
}

/// Stages that fit no node, as users read them.
fn describe_unplaceable(def: &FarmDef, stages: &[(u32, String)]) -> Vec<String> {
    stages
        .iter()
        .map(|(s, reason)| {
            let name = def
                .stages
                .get(*s as usize)
                .map_or("?", |st| st.name.as_str());
            format!("stage {name} fits no node of the mesh: {reason}")
        })
        .collect()
}

/// Stages stopped by `max_fails`, as users read them.
fn describe_stops(def: &FarmDef, stops: &[(u32, Stop)]) -> Vec<String> {
    stops
        .iter()
        .map(|(s, stop)| {
            let name = def
                .stages
                .get(*s as usize)
                .map_or("?", |st| st.name.as_str());
            describe_stop(name, stop)
        })
        .collect()
}

/// A farm in short as `mesh list` shows it.
pub(in crate::mesh_node) fn summary_view(
    f: &FarmSummary,
    labels: &HashMap<NodeId, String>,
) -> FarmView {
    FarmView {
        id: farm_display_id(&f.name, f.id),
        name: f.name.clone(),
        accepted: true,
        open: f.open,
        finished: f.progress.finished,
        counts: f.progress.counts.clone(),
        duplicates: f.progress.duplicates,
        redone: f.progress.redone,
        home: labels
            .get(&f.home.node)
            .cloned()
            .unwrap_or_else(|| f.home.node.to_string()),
        ..FarmView::default()
    }
}
