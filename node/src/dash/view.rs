//! What the dashboard page is sent: the status and farms folded into a bounded view, with the history it keeps between updates.
//!
//! Bounded whatever the farm's size and the mesh's: the mesh at a glance
//! and a heat map of a digit per node (the table of nodes is paged from
//! the server, `node_page`), `FARMS_MAX` farms with `FAILURES_MAX`
//! failures each, `BARS_MAX` runs of the last `WINDOW_MS` in the task
//! stream, `RUNNING_MAX` running tasks' figures and `SERIES_MAX` points
//! over time. A million-task farm costs the
//! page what a hundred-task one does, and a thousand nodes about a
//! kilobyte more than ten.

use std::collections::{HashMap, HashSet, VecDeque};

use mesh_protocol::engine::Counts;
use mesh_protocol::mesh::FarmId;
use mesh_protocol::observe::{LatencySummary, RunRecord, RunningUse};
use mesh_protocol::TaskRef;
use percent_encoding::{utf8_percent_encode, NON_ALPHANUMERIC};
use serde::{Deserialize, Serialize};

use crate::view::{
    display_key, eta_s, short_id, FarmView, Glance, MeshStatus, NodeState, NodeView, Observed,
    ResourceUse, StageRates,
};

/// The most one update may weigh, as JSON.
pub const UPDATE_MAX_BYTES: usize = 64 * 1024;
/// The most rows one page of the node table holds.
pub const PAGE_MAX: usize = 200;
pub const FARMS_MAX: usize = 12;
pub const FAILURES_MAX: usize = 20;
pub const BARS_MAX: usize = 1500;
/// Running tasks whose figures are sent: those holding the most memory.
pub const RUNNING_MAX: usize = 64;
/// The task stream shows the last minute.
pub const WINDOW_MS: u64 = 60_000;
/// Five minutes of one point a second.
pub const SERIES_MAX: usize = 300;
const EVENTS_MAX: usize = 50;

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct DashView {
    pub at: u64,
    pub local: String,
    pub coordinator: Option<String>,
    pub term: u64,
    pub glance: Glance,
    pub heat: Heat,
    pub farms: Vec<FarmLine>,
    pub stream: Stream,
    pub series: Series,
    pub events: Vec<EventLine>,
    pub latency: Vec<LatencySummary>,
    /// Running tasks' figures as their executors last looked, those
    /// holding the most memory first.
    pub running: Vec<RunningLine>,
}

/// The mesh as a heat map: a cell per node, the nodes in the order of
/// their ids (the order `node_page` counts `at` in).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Heat {
    /// A digit per node: its share of cores in use, in tenths (`9` for
    /// 90% and more); `-` for a node not heard yet.
    pub levels: String,
    /// The cells that say more than their use: (index, a sum of `MARK_*`).
    pub marks: Vec<(u32, u8)>,
}

pub const MARK_COORDINATOR: u8 = 1;
pub const MARK_LOCAL: u8 = 2;
/// Its local health is above 0: it cannot keep up.
pub const MARK_BEHIND: u8 = 4;
pub const MARK_DRAINING: u8 = 8;

/// A row of the node table.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct NodeLine {
    pub id: String,
    pub coordinator: bool,
    pub local: bool,
    pub state: Option<NodeState>,
    pub resources: Vec<ResourceUse>,
    pub load: Option<f64>,
    pub cpus: Option<u32>,
    pub mem_used: Option<u64>,
    pub mem_total: Option<u64>,
    pub queued: u32,
    pub running: u32,
    pub prefetch: u32,
    pub health: u32,
    pub gpus: usize,
    pub job: Option<String>,
}

impl NodeLine {
    fn of(n: &NodeView) -> NodeLine {
        NodeLine {
            id: n.id.clone(),
            coordinator: n.coordinator,
            local: n.local,
            state: Some(n.state()),
            resources: n.usage.clone(),
            load: n.load,
            cpus: n.cpus,
            mem_used: n.mem_used,
            mem_total: n.mem_total,
            queued: n.queued,
            running: n.running,
            prefetch: n.prefetch,
            health: n.health,
            gpus: n.gpus.len(),
            job: n.job.clone(),
        }
    }
}

/// The heat map of these nodes, in id order.
pub fn heat(status: &MeshStatus) -> Heat {
    let mut nodes: Vec<&NodeView> = status.nodes.iter().collect();
    nodes.sort_by(|a, b| a.id.cmp(&b.id));
    let mut h = Heat::default();
    for (i, n) in nodes.iter().enumerate() {
        let level = match n.state() {
            NodeState::Joining => '-',
            _ => char::from(b'0' + (n.use_share() * 10.0).floor().min(9.0) as u8),
        };
        h.levels.push(level);
        let mark = [
            (n.coordinator, MARK_COORDINATOR),
            (n.local, MARK_LOCAL),
            (n.health > 0, MARK_BEHIND),
            (n.state() == NodeState::Draining, MARK_DRAINING),
        ]
        .iter()
        .filter(|(on, _)| *on)
        .fold(0, |m, (_, bit)| m | bit);
        if mark != 0 {
            h.marks.push((i as u32, mark));
        }
    }
    h
}

/// What the page asks of the node table: a filter, an order and a page,
/// or the node at one cell of the heat map.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct NodeQuery {
    /// Only ids containing this.
    pub q: Option<String>,
    /// Only nodes in this state (`running`, `queued`, `idle`,
    /// `draining`, `joining`; `busy` for running or queued).
    pub state: Option<String>,
    /// `id` (the default), `state`, `use`, `running`, `queued`, `load`, `memory`.
    pub sort: Option<String>,
    #[serde(default)]
    pub desc: bool,
    #[serde(default)]
    pub page: usize,
    pub per: Option<usize>,
    /// The node at this cell of the heat map (id order), alone.
    pub at: Option<usize>,
}

/// One page of the node table, and how many nodes there are and matched.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct NodePage {
    pub total: usize,
    pub matched: usize,
    pub page: usize,
    pub per: usize,
    pub rows: Vec<NodeLine>,
}

/// The page of the node table `q` asks for.
pub fn node_page(status: &MeshStatus, q: &NodeQuery) -> NodePage {
    let mut nodes: Vec<&NodeView> = status.nodes.iter().collect();
    nodes.sort_by(|a, b| a.id.cmp(&b.id));
    let total = nodes.len();
    if let Some(at) = q.at {
        let rows: Vec<NodeLine> = nodes.get(at).map(|n| NodeLine::of(n)).into_iter().collect();
        return NodePage {
            total,
            matched: rows.len(),
            page: 0,
            per: 1,
            rows,
        };
    }
    let state = q.state.as_deref().filter(|s| !s.is_empty());
    nodes.retain(|n| {
        let st = n.state();
        let state_ok = match state {
            None => true,
            Some("busy") => n.running + n.queued > 0,
            Some(s) => state_name(st) == s,
        };
        state_ok && q.q.as_deref().is_none_or(|t| n.id.contains(t))
    });
    let key = |n: &NodeView| -> f64 {
        match q.sort.as_deref() {
            Some("use") => n.use_share(),
            Some("running") => f64::from(n.running),
            Some("queued") => f64::from(n.queued),
            Some("load") => n.load.unwrap_or(-1.0),
            Some("memory") => n.mem_used.map_or(-1.0, |m| m as f64),
            Some("state") => f64::from(n.state() as u8),
            _ => 0.0,
        }
    };
    // By the key, then by id: a stable order from one refresh to the next.
    nodes.sort_by(|a, b| key(a).total_cmp(&key(b)).then_with(|| a.id.cmp(&b.id)));
    if q.desc {
        nodes.reverse();
    }
    let per = q.per.unwrap_or(50).clamp(1, PAGE_MAX);
    let matched = nodes.len();
    let page = q.page.min(matched.saturating_sub(1) / per);
    let rows = nodes
        .iter()
        .skip(page * per)
        .take(per)
        .map(|n| NodeLine::of(n))
        .collect();
    NodePage {
        total,
        matched,
        page,
        per,
        rows,
    }
}

/// How a state is named in a query.
fn state_name(s: NodeState) -> &'static str {
    match s {
        NodeState::Running => "running",
        NodeState::Queued => "queued",
        NodeState::Idle => "idle",
        NodeState::Draining => "draining",
        NodeState::Joining => "joining",
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct FarmLine {
    pub id: String,
    pub name: String,
    pub home: String,
    pub finished: bool,
    pub stages: Vec<StageLine>,
    pub failures: Vec<FailureLine>,
    /// Outputs coming home, in words (see `DataView::words`).
    #[serde(default)]
    pub data: Option<String>,
    /// When it ends, in words (see `FarmView::eta_words`).
    #[serde(default)]
    pub eta: Option<String>,
    /// The hints on its stages' asks, as `mesh status FARM` gives them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hints: Vec<String>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct StageLine {
    pub name: String,
    pub total: u64,
    pub done: u64,
    pub running: u64,
    pub queued: u64,
    pub failed: u64,
    pub skipped: u64,
    pub cancelled: u64,
    /// Tasks ended per second, recently.
    pub rate: f64,
    pub eta_s: Option<f64>,
    /// What its finished tasks used (see `used.rs`), once one was measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub used: Option<StageUsed>,
}

/// A stage's figures as the dashboard shows them: runtime p50, CPU as a
/// share of one core, peak memory p50 and max against the ask (bytes; 0:
/// no ask).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct StageUsed {
    pub runs: u64,
    pub runtime_p50_ms: u64,
    pub cpu_pct: f64,
    pub peak_p50: u64,
    pub peak_max: u64,
    pub mem_asked: u64,
    pub oom: u64,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct FailureLine {
    pub text: String,
    /// Where the page fetches the task's logs.
    pub logs: Option<String>,
}

/// A running task as its node last looked at it: found in the task
/// stream by its node and slot.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct RunningLine {
    pub node: String,
    pub slot: u32,
    pub farm: String,
    pub stage: String,
    /// The task's number in its stage, and its attempt.
    pub task: u32,
    pub attempt: u32,
    /// Unix ms (the observer's clock) it started at.
    pub start: u64,
    /// Its share of one core since the last look (since its start at the
    /// first), in %; none until its node reads its CPU.
    pub cpu_pct: Option<f64>,
    /// Resident memory of its tree now, and the most seen, in bytes.
    pub rss: u64,
    pub peak: u64,
    /// The memory its stage asks for a task, in bytes (0: none).
    pub mem_asked: u64,
}

/// The task stream: bars are `[lane, start, end, stage, failed]`, times
/// in ms after `t0`, `end` null while running.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Stream {
    pub t0: u64,
    pub t1: u64,
    pub lanes: Vec<Lane>,
    pub stages: Vec<String>,
    pub bars: Vec<(u32, u64, Option<u64>, u32, u8)>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Lane {
    pub node: String,
    pub slot: u32,
}

/// Per interval: tasks ended, failed, stolen, and the nodes there were.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Series {
    pub t: Vec<u64>,
    pub done: Vec<u64>,
    pub failed: Vec<u64>,
    pub steals: Vec<u64>,
    pub nodes: Vec<u64>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct EventLine {
    pub at: u64,
    pub text: String,
}

/// A run in the stream, on the observer's clock.
#[derive(Clone, Copy)]
struct Bar {
    run: RunRecord,
}

/// Totals at one update, to difference into the series.
#[derive(Clone, Copy, Default)]
struct Totals {
    ended: u64,
    failed: u64,
    stolen: u64,
}

/// What the dashboard remembers between updates.
#[derive(Default)]
pub struct Model {
    /// The last change of a run seen from each node.
    since: HashMap<String, u64>,
    bars: HashMap<(String, u64), Bar>,
    rates: StageRates,
    series: VecDeque<(u64, Totals, u64)>,
    last: Option<Totals>,
    events: VecDeque<EventLine>,
    nodes_seen: HashSet<String>,
    farms_seen: HashMap<String, bool>,
    coordinator: Option<String>,
    farm_names: HashMap<u64, (String, Vec<String>)>,
    /// Running tasks' last figures, by node, farm, task and attempt, with
    /// the observer's time they arrived at: what a CPU share is counted from.
    running: HashMap<RunKey, (RunningUse, u64)>,
}

type RunKey = (String, FarmId, TaskRef, u32);

impl Model {
    /// Where each node's runs are to be read from (what changed after).
    pub fn since(&self) -> HashMap<String, u64> {
        self.since.clone()
    }

    /// Folds one poll in and returns what the page is sent. `now`: unix ms.
    pub fn update(&mut self, now: u64, obs: &Observed, farms: &[FarmView]) -> DashView {
        let status = &obs.status;
        let local = status
            .nodes
            .iter()
            .find(|n| n.local)
            .map(|n| n.id.clone())
            .unwrap_or_default();
        self.note_changes(now, obs, farms);
        for f in farms {
            self.farm_names
                .entry(display_key(&f.id))
                .or_insert_with(|| {
                    (
                        f.id.clone(),
                        f.stages.iter().map(|(n, _)| n.clone()).collect(),
                    )
                });
        }

        // Runs, shifted onto this clock by the node's own.
        for (node, o) in &obs.nodes {
            let shift = now as i64 - o.unix_ms as i64;
            let at = |t: u64| (t as i64 + shift).max(0) as u64;
            for r in &o.runs {
                let mut run = *r;
                run.start = at(run.start);
                run.end = run.end.map(at);
                self.bars.insert((node.clone(), r.seq), Bar { run });
                let s = self.since.entry(node.clone()).or_insert(0);
                *s = (*s).max(r.changed);
            }
        }
        let t0 = now.saturating_sub(WINDOW_MS);
        let live: HashSet<&String> = obs.nodes.iter().map(|(n, _)| n).collect();
        // A running bar of a node that answered without it has ended
        // unseen (left the node's record): dropped with the window.
        self.bars.retain(|(node, _), b| {
            b.run
                .end
                .map_or(live.contains(node) || b.run.start >= t0, |e| e >= t0)
        });
        if self.bars.len() > BARS_MAX {
            let mut starts: Vec<u64> = self.bars.values().map(|b| b.run.start).collect();
            let cut = starts.len() - BARS_MAX;
            let (_, nth, _) = starts.select_nth_unstable(cut);
            let nth = *nth;
            self.bars.retain(|_, b| b.run.start >= nth);
        }

        let running = self.running_lines(now, obs, farms);
        let nodes_total = status.nodes.len();
        let farm_lines = self.farm_lines(now, farms);
        let stream = self.stream(t0, now);
        let series = self.series(now, obs, farms, nodes_total as u64);
        DashView {
            at: now,
            local,
            coordinator: status.coordinator.clone(),
            term: status.term,
            glance: status.glance(),
            heat: heat(status),
            farms: farm_lines,
            stream,
            series,
            events: self.events.iter().cloned().collect(),
            latency: status.latency.clone(),
            running,
        }
    }

    /// The running tasks' figures, each found in the stream by its run,
    /// as the nodes that answered this time told them.
    fn running_lines(&mut self, now: u64, obs: &Observed, farms: &[FarmView]) -> Vec<RunningLine> {
        let runs: HashMap<RunKey, (u32, u64)> = self
            .bars
            .iter()
            .filter(|(_, b)| b.run.end.is_none())
            .map(|((node, _), b)| {
                let r = &b.run;
                ((node.clone(), r.farm, r.task, r.attempt), (r.slot, r.start))
            })
            .collect();
        let mut lines = Vec::new();
        let mut next = HashMap::new();
        for (node, o) in &obs.nodes {
            for u in &o.running {
                let key = (node.clone(), u.farm, u.task, u.attempt);
                let Some(&(slot, start)) = runs.get(&key) else {
                    continue;
                };
                // A share of the CPU since the last figures came, or since
                // the task started.
                let since = match self.running.get(&key) {
                    Some((was, at)) if was.cpu_ms.is_some() && *at < now => {
                        was.cpu_ms.map(|c| (c, *at))
                    }
                    _ => Some((0, start)),
                };
                let cpu_pct = u.cpu_ms.zip(since).and_then(|(c, (c0, t0))| {
                    (now > t0).then(|| c.saturating_sub(c0) as f64 * 100.0 / (now - t0) as f64)
                });
                let (farm, stage) = self.stage_name(u.farm, u.task.stage);
                let mem_asked = farms
                    .iter()
                    .find(|f| f.id == farm)
                    .and_then(|f| f.asks.iter().find(|a| a.stage == stage))
                    .map_or(0, |a| a.mem);
                lines.push(RunningLine {
                    node: node.clone(),
                    slot,
                    farm,
                    stage,
                    task: u.task.index,
                    attempt: u.attempt,
                    start,
                    cpu_pct,
                    rss: u.rss,
                    peak: u.peak,
                    mem_asked,
                });
                next.insert(key, (*u, now));
            }
        }
        self.running = next;
        lines.sort_by(|a, b| b.peak.cmp(&a.peak).then(a.start.cmp(&b.start)));
        lines.truncate(RUNNING_MAX);
        lines
    }

    /// A run's farm and stage by name, where the farm is known.
    fn stage_name(&self, farm: FarmId, stage: u32) -> (String, String) {
        match self.farm_names.get(&(farm.0 >> 32)) {
            Some((id, names)) => (
                id.clone(),
                names
                    .get(stage as usize)
                    .cloned()
                    .unwrap_or_else(|| "?".into()),
            ),
            None => (farm.to_string(), stage.to_string()),
        }
    }

    fn event(&mut self, at: u64, text: String) {
        if self.events.len() == EVENTS_MAX {
            self.events.pop_front();
        }
        self.events.push_back(EventLine { at, text });
    }

    fn note_changes(&mut self, now: u64, obs: &Observed, farms: &[FarmView]) {
        let first = self.nodes_seen.is_empty() && self.farms_seen.is_empty();
        let ids: HashSet<String> = obs.status.nodes.iter().map(|n| n.id.clone()).collect();
        if !first {
            for n in ids
                .difference(&self.nodes_seen)
                .cloned()
                .collect::<Vec<_>>()
            {
                self.event(now, format!("node {} joined", short_id(&n)));
            }
            for n in self
                .nodes_seen
                .difference(&ids)
                .cloned()
                .collect::<Vec<_>>()
            {
                self.event(now, format!("node {} left", short_id(&n)));
            }
        }
        self.nodes_seen = ids;
        if obs.status.coordinator != self.coordinator {
            if let Some(c) = &obs.status.coordinator {
                self.event(
                    now,
                    format!(
                        "node {} coordinates (term {})",
                        short_id(c),
                        obs.status.term
                    ),
                );
            }
            self.coordinator = obs.status.coordinator.clone();
        }
        for f in farms {
            match self.farms_seen.insert(f.id.clone(), f.finished) {
                None if !first => self.event(now, format!("farm {} submitted", f.id)),
                Some(false) if f.finished => self.event(now, format!("farm {} finished", f.id)),
                _ => {}
            }
        }
    }

    fn farm_lines(&mut self, now: u64, farms: &[FarmView]) -> Vec<FarmLine> {
        let mut lines = Vec::new();
        for f in farms.iter().take(FARMS_MAX) {
            let mut stages = Vec::new();
            for (name, c) in &f.stages {
                let rate = self.rates.rate(&f.id, name, c.ended(), now);
                let mut line = stage_line(name, c, rate);
                line.used = f.used.iter().find(|u| &u.stage == name).map(|u| StageUsed {
                    runs: u.runs,
                    runtime_p50_ms: u.runtime_p50_ms,
                    cpu_pct: u.cpu_pct,
                    peak_p50: u.peak_p50,
                    peak_max: u.peak_max,
                    mem_asked: u.mem_asked,
                    oom: u.oom,
                });
                stages.push(line);
            }
            let failures = f
                .failures
                .iter()
                .take(FAILURES_MAX)
                .map(|text| FailureLine {
                    text: text.clone(),
                    logs: logs_link(&f.id, text),
                })
                .collect();
            lines.push(FarmLine {
                id: f.id.clone(),
                name: f.name.clone(),
                home: f.home.clone(),
                finished: f.finished,
                stages,
                failures,
                data: f.data.words(),
                eta: f.eta_words(now),
                hints: f.used.iter().flat_map(|u| u.hints()).collect(),
            });
        }
        let shown: HashSet<&str> = farms.iter().map(|f| f.id.as_str()).collect();
        self.rates.keep(|farm| shown.contains(farm));
        lines
    }

    fn stream(&self, t0: u64, now: u64) -> Stream {
        let mut lanes: Vec<Lane> = self
            .bars
            .iter()
            .map(|((node, _), b)| Lane {
                node: node.clone(),
                slot: b.run.slot,
            })
            .collect::<HashSet<_>>()
            .into_iter()
            .collect();
        lanes.sort();
        let lane_of: HashMap<&Lane, u32> = lanes
            .iter()
            .enumerate()
            .map(|(i, l)| (l, i as u32))
            .collect();
        let mut stages: Vec<String> = Vec::new();
        let mut stage_of: HashMap<(u64, u32), u32> = HashMap::new();
        let mut bars: Vec<(u32, u64, Option<u64>, u32, u8)> = Vec::with_capacity(self.bars.len());
        for ((node, _), b) in &self.bars {
            let r = &b.run;
            let lane = lane_of[&Lane {
                node: node.clone(),
                slot: r.slot,
            }];
            let key = (r.farm.0, r.task.stage);
            let stage = *stage_of.entry(key).or_insert_with(|| {
                let (farm, stage) = self.stage_name(r.farm, r.task.stage);
                stages.push(format!("{farm}/{stage}"));
                stages.len() as u32 - 1
            });
            bars.push((
                lane,
                r.start.saturating_sub(t0),
                r.end.map(|e| e.min(now).saturating_sub(t0)),
                stage,
                r.failed as u8,
            ));
        }
        bars.sort_unstable_by_key(|b| (b.1, b.0));
        Stream {
            t0,
            t1: now,
            lanes,
            stages,
            bars,
        }
    }

    fn series(&mut self, now: u64, obs: &Observed, farms: &[FarmView], nodes: u64) -> Series {
        let mut t = Totals::default();
        for f in farms {
            t.ended += f.counts.done + f.counts.failed;
            t.failed += f.counts.failed;
        }
        t.stolen = obs.nodes.iter().map(|(_, o)| o.counters.tasks_stolen).sum();
        let last = self.last.replace(t).unwrap_or(t);
        // Farms that leave the list, or nodes that restart, lower a total:
        // an interval never goes negative.
        let d = Totals {
            ended: t.ended.saturating_sub(last.ended),
            failed: t.failed.saturating_sub(last.failed),
            stolen: t.stolen.saturating_sub(last.stolen),
        };
        if self.series.len() == SERIES_MAX {
            self.series.pop_front();
        }
        self.series.push_back((now, d, nodes));
        let mut s = Series::default();
        for (at, d, n) in &self.series {
            s.t.push(*at);
            s.done.push(d.ended);
            s.failed.push(d.failed);
            s.steals.push(d.stolen);
            s.nodes.push(*n);
        }
        s
    }
}

impl DashView {
    /// The view as JSON within [`UPDATE_MAX_BYTES`]: when the limits on
    /// each part are not enough (many failures, long names), the task
    /// stream and the failures are halved in turn until it fits.
    pub fn to_json(mut self) -> String {
        for round in 0.. {
            let json = serde_json::to_string(&self).expect("the view serializes");
            if json.len() <= UPDATE_MAX_BYTES || round > 64 {
                return json;
            }
            // Halve the heaviest part.
            let parts = [weigh(&self.stream), weigh(&self.farms)];
            let heaviest = (0..2).max_by_key(|&i| parts[i]).expect("two parts");
            match heaviest {
                0 if !self.stream.bars.is_empty() => {
                    let keep = self.stream.bars.len() / 2;
                    self.stream.keep_newest(keep);
                }
                1 if self.farms.iter().any(|f| !f.failures.is_empty()) => {
                    for f in &mut self.farms {
                        f.failures.truncate(f.failures.len() / 2);
                    }
                }
                _ => {
                    self.series = Series::default();
                    self.events.clear();
                    self.farms.truncate(self.farms.len() / 2);
                }
            }
        }
        unreachable!("the loop returns")
    }
}

impl Stream {
    /// Keeps the `n` newest bars and the lanes they are in.
    fn keep_newest(&mut self, n: usize) {
        // Bars are sorted by start.
        let cut = self.bars.len().saturating_sub(n);
        self.bars.drain(..cut);
        let mut used: Vec<Option<u32>> = vec![None; self.lanes.len()];
        let mut lanes = Vec::new();
        for b in &mut self.bars {
            let i = b.0 as usize;
            let new = *used[i].get_or_insert_with(|| {
                lanes.push(self.lanes[i].clone());
                lanes.len() as u32 - 1
            });
            b.0 = new;
        }
        // Lanes stay in node and slot order.
        let mut order: Vec<u32> = (0..lanes.len() as u32).collect();
        order.sort_by(|&a, &b| lanes[a as usize].cmp(&lanes[b as usize]));
        let mut rank = vec![0u32; lanes.len()];
        for (r, &i) in order.iter().enumerate() {
            rank[i as usize] = r as u32;
        }
        for b in &mut self.bars {
            b.0 = rank[b.0 as usize];
        }
        lanes.sort();
        self.lanes = lanes;
    }
}

/// A part of the view's size as JSON.
fn weigh<T: Serialize>(part: &T) -> usize {
    serde_json::to_vec(part).map_or(0, |v| v.len())
}

fn stage_line(name: &str, c: &Counts, rate: f64) -> StageLine {
    StageLine {
        name: name.to_string(),
        total: c.total,
        done: c.done,
        running: c.running,
        queued: c.queued(),
        failed: c.failed,
        skipped: c.skipped,
        cancelled: c.cancelled,
        rate,
        eta_s: eta_s(c, rate),
        used: None,
    }
}

/// `task (attempt N on node): reason` to the URL of that attempt's logs.
fn logs_link(farm: &str, failure: &str) -> Option<String> {
    let (task, rest) = failure.split_once(" (attempt ")?;
    let attempt: u32 = rest.split(' ').next()?.parse().ok()?;
    Some(format!(
        "/api/logs/{}/{}?attempt={attempt}",
        utf8_percent_encode(farm, NON_ALPHANUMERIC),
        utf8_percent_encode(task, NON_ALPHANUMERIC)
    ))
}
