//! The view model every front end reads: farms, nodes and the mesh as people see them, and each stage's rate and ETA.
//!
//! `mesh status`, `mesh watch`, the dashboard and `/metrics` all read
//! these: the control socket carries them, the dashboard folds them into
//! its bounded page (`dash/view.rs`), the terminal draws them. `MeshStatus`
//! is the one source of truth; `Observed::new` puts what each node says
//! of itself (load, memory, counters, latencies) into its line.

use std::collections::{HashMap, VecDeque};

use mesh_protocol::engine::Counts;
use mesh_protocol::mesh::Beat;
use mesh_protocol::observe::{Counters, Latencies, LatencySummary, Observation};
use mesh_protocol::resources::{Amount, Resources, MEM};

use serde::{Deserialize, Serialize};

use crate::state::FarmStatus;

/// A stage's rate is measured over this long by default.
const RATE_WINDOW_MS: u64 = 20_000;

/// A farm as its submitter sees it.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct FarmView {
    pub id: String,
    pub name: String,
    pub file: String,
    pub out: String,
    pub accepted: bool,
    /// Stages may still be added (an open farm, see `ControlRequest::Grow`).
    #[serde(default)]
    pub open: bool,
    /// A client holds it open now (see `ControlRequest::Hold`); said by
    /// its home only. An open farm no one holds is a dead client's.
    #[serde(default)]
    pub held: bool,
    pub finished: bool,
    pub counts: Counts,
    pub stages: Vec<(String, Counts)>,
    /// The first failures, as `task (attempt N on node): reason`.
    pub failures: Vec<String>,
    pub unplaceable: Vec<String>,
    /// Stages stopped because their first tasks all failed the same way,
    /// as `stage ... stopped after ...` lines.
    #[serde(default)]
    pub stopped: Vec<String>,
    /// The node that is the farm's home (its outputs go there).
    #[serde(default)]
    pub home: String,
    /// Tasks run again after a fault (a node thought dead, a partition) and
    /// completed twice; the first result counts.
    #[serde(default)]
    pub duplicates: u64,
    /// Done tasks run again: the only copy of their outputs went with a node.
    #[serde(default)]
    pub redone: u64,
    /// Outputs coming home (a mesh farm, on its home).
    #[serde(default)]
    pub data: DataView,
    /// When it will end, as a quick simulation of what is left says (on
    /// its home, once a task has finished; see `eta.rs`).
    #[serde(default)]
    pub eta: Option<crate::eta::Eta>,
    /// Its home's estimates of its end so far, oldest first (kept in the
    /// home's memory, for `mesh report`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub eta_history: Vec<crate::eta::Estimated>,
    /// What each stage's finished tasks used against their asks (see
    /// `used.rs`), where the node answering holds the farm's log; only in
    /// answers to `mesh status FARM`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub used: Vec<crate::used::StageUse>,
    /// What each stage's tasks ask for, in stage order; only in answers to
    /// `mesh status FARM` (`mesh sim --farm` places its tasks by them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub asks: Vec<StageAsk>,
}

/// What a stage's tasks each ask for: memory in bytes (0: no ask) and cores.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StageAsk {
    pub stage: String,
    pub mem: u64,
    pub cpu: f64,
}

/// A farm's outputs coming home, as its home sees them.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DataView {
    /// Bytes brought home over the mesh since the home started.
    pub home_bytes: u64,
    /// Bytes of the outputs of finished tasks not home yet.
    pub to_come_bytes: u64,
    /// Bytes a second coming home lately.
    pub rate_bps: f64,
}

impl DataView {
    /// In people's words, when anything comes or came: `outputs home: 1.2
    /// GiB, 3.4 GiB to come at 410 MB/s`.
    pub fn words(&self) -> Option<String> {
        if self.home_bytes == 0 && self.to_come_bytes == 0 {
            return None;
        }
        let mut s = format!("outputs home: {}", bytes(self.home_bytes));
        if self.to_come_bytes > 0 {
            s.push_str(&format!(", {} to come", bytes(self.to_come_bytes)));
        }
        if self.rate_bps >= 1.0 {
            s.push_str(&format!(" at {:.0} MB/s", self.rate_bps / 1e6));
        }
        Some(s)
    }
}

/// Bytes for people: `512 B`, `3.4 MiB`, `1.2 GiB`.
pub fn bytes(n: u64) -> String {
    bytesize::ByteSize::b(n).to_string()
}

impl FarmView {
    /// Its state in a word: `finished`, `open` (still taking stages, see
    /// `ControlRequest::Grow`), or `running`.
    pub fn state_word(&self) -> &'static str {
        if self.finished {
            "finished"
        } else if self.open {
            "open"
        } else {
            "running"
        }
    }

    /// When it ends, in words, as its home last estimated it and counted
    /// on from then (see [`crate::eta::Eta::words`]); none once it has.
    pub fn eta_words(&self, now_ms: u64) -> Option<String> {
        let e = self.eta.as_ref().filter(|_| !self.finished)?;
        Some(e.words(now_ms))
    }

    /// A farm of `mesh run`, from its status snapshot: this machine is its
    /// home, and failures read as a mesh farm's do.
    pub fn from_status(s: &FarmStatus) -> FarmView {
        FarmView {
            id: s.id.clone(),
            name: s.name.clone(),
            file: s.file.clone(),
            out: s.out.clone(),
            accepted: true,
            finished: s.state.is_finished() || s.state == crate::state::RunState::Stopped,
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
            eta: s.eta.clone(),
            stopped: s
                .stages
                .iter()
                .filter_map(|st| st.stopped.clone())
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
    /// How it measures what its tasks use (absent when it did not answer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measure: Option<mesh_protocol::mesh::Measure>,
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
    /// Its local health: 0 when it keeps up, up to 8 when it cannot (its
    /// probes go unanswered, its timers fire late); it then waits longer
    /// before it calls another node dead.
    #[serde(default)]
    pub health: u32,
    /// Bytes of outputs it keeps for farms whose homes do not have them
    /// yet; absent when the node did not answer in time.
    #[serde(default)]
    pub held_bytes: Option<u64>,
    /// Its open-file limit, as its beat says (0: not known).
    #[serde(default)]
    pub files_max: u64,
    /// Its GPUs: how its tasks name each, and the model where known.
    #[serde(default)]
    pub gpus: Vec<GpuView>,
}

/// One GPU of a node.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuView {
    pub id: String,
    pub name: String,
}

impl NodeView {
    /// Its addresses, resources and load, as its beat says.
    pub fn describe(&mut self, b: &Beat) {
        self.addrs = b.addrs.clone();
        self.resources = ResourceView {
            total: b.total.to_string(),
            used: b.used.to_string(),
        };
        self.queued = b.queued;
        self.running = b.running;
        self.prefetch = b.prefetch;
        self.usage = ResourceUse::of(&b.total, &b.used);
        self.job = b.job.clone();
        self.drains_in_s = b.ends_in_ms.map(|ms| ms / 1000);
        self.health = b.health;
        self.files_max = b.files_max;
        if let Some(m) = b.machine {
            self.load = Some(f64::from(m.load_centi) / 100.0);
            self.cpus = Some(m.cpus);
            self.mem_used = Some(m.mem_used);
            self.mem_total = Some(m.mem_total);
            self.measure = Some(m.measure);
        }
        self.gpus = b
            .gpus
            .iter()
            .map(|(id, name)| GpuView {
                id: id.clone(),
                name: name.clone(),
            })
            .collect();
    }
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
                a.as_f64()
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
    /// Why the other nodes are shown as this node last heard them (their
    /// load then, often nothing), not as the coordinator hears them now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unheard: Option<String>,
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
            v.held_bytes = Some(o.held_bytes);
            v.counters = Some(o.counters);
            v.latency = own.summaries();
            if let Some(b) = &o.beat {
                // What the node says of itself is newer than what this
                // node heard (nothing, unless it coordinates).
                v.describe(b);
            }
        }
        status.latency = all.summaries();
        Observed { status, nodes }
    }
}

/// Each stage's tasks ended, sampled over a window, for its rate: the
/// dashboard's and `mesh watch`'s.
#[derive(Debug)]
pub struct StageRates {
    window_ms: u64,
    /// By (farm, stage): (when, tasks ended then), oldest first.
    samples: HashMap<(String, String), VecDeque<(u64, u64)>>,
}

impl Default for StageRates {
    fn default() -> StageRates {
        StageRates::new(RATE_WINDOW_MS)
    }
}

impl StageRates {
    pub fn new(window_ms: u64) -> StageRates {
        StageRates {
            window_ms,
            samples: HashMap::new(),
        }
    }

    /// Tasks ended per second over the window, with `ended` at `now` (ms) added.
    pub fn rate(&mut self, farm: &str, stage: &str, ended: u64, now: u64) -> f64 {
        let samples = self
            .samples
            .entry((farm.to_string(), stage.to_string()))
            .or_default();
        samples.push_back((now, ended));
        while samples
            .front()
            .is_some_and(|(t, _)| *t + self.window_ms < now)
        {
            samples.pop_front();
        }
        match (samples.front(), samples.back()) {
            (Some((t0, e0)), Some((t1, e1))) if t1 > t0 => {
                e1.saturating_sub(*e0) as f64 * 1000.0 / (t1 - t0) as f64
            }
            _ => 0.0,
        }
    }

    /// Forgets the farms no longer shown.
    pub fn keep(&mut self, shown: impl Fn(&str) -> bool) {
        self.samples.retain(|(farm, _), _| shown(farm));
    }
}

/// Seconds until the stage is over at `rate`: 0 once it is, None while
/// nothing ends.
pub fn eta_s(c: &Counts, rate: f64) -> Option<f64> {
    match c.total.saturating_sub(c.ended()) {
        0 => Some(0.0),
        left if rate > 0.0 => Some(left as f64 / rate),
        _ => None,
    }
}

/// The high half of a farm's id, as its display id (`name-hex`) shows it.
pub fn display_key(display: &str) -> u64 {
    display
        .rsplit('-')
        .next()
        .and_then(|h| u64::from_str_radix(h, 16).ok())
        .unwrap_or(0)
}

/// A peer id as people read it at a glance: its last eight characters.
pub fn short_id(id: &str) -> &str {
    &id[id.len().saturating_sub(8)..]
}

/// What a node is doing, to group nodes at a glance (as `sinfo` groups
/// them by state).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum NodeState {
    /// Running tasks.
    Running,
    /// Tasks queued, none running yet.
    Queued,
    /// Nothing to do.
    Idle,
    /// Its batch job's walltime is near: it takes nothing more.
    Draining,
    /// Not yet heard: it joined and has not reported.
    Joining,
}

impl NodeState {
    pub fn word(self) -> &'static str {
        match self {
            NodeState::Running => "running tasks",
            NodeState::Queued => "tasks queued",
            NodeState::Idle => "idle",
            NodeState::Draining => "draining",
            NodeState::Joining => "joining",
        }
    }
}

impl NodeView {
    pub fn state(&self) -> NodeState {
        if self.usage.is_empty() {
            NodeState::Joining
        } else if self.drains_in_s == Some(0) {
            NodeState::Draining
        } else if self.running > 0 {
            NodeState::Running
        } else if self.queued > 0 {
            NodeState::Queued
        } else {
            NodeState::Idle
        }
    }

    /// Its share of its cores in use, from 0 to 1 (of its first resource
    /// when it offers no cores).
    pub fn use_share(&self) -> f64 {
        self.usage
            .iter()
            .find(|u| u.kind == "cpu")
            .or_else(|| self.usage.first())
            .filter(|u| u.total > 0.0)
            .map_or(0.0, |u| (u.used / u.total).clamp(0.0, 1.0))
    }
}

/// The mesh at a glance, the same at 4 nodes and at 4,000: the nodes by
/// state, resources in use against the total, the spread of load, the
/// busiest few, and what needs a look. `mesh status`, `mesh watch` and
/// the dashboard show it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Glance {
    pub nodes: usize,
    pub by_state: Vec<(NodeState, usize)>,
    /// Nodes whose local health is above 0 (they cannot keep up).
    pub behind: usize,
    /// Each resource summed over the nodes.
    pub resources: Vec<ResourceUse>,
    /// Tasks running and queued per node: least, median, most.
    pub tasks_spread: (u32, u32, u32),
    /// The busiest few: id, running, queued.
    pub busiest: Vec<(String, u32, u32)>,
    /// Machine load averages: least, median, most, over the nodes that say.
    pub load_spread: Option<(f64, f64, f64)>,
    /// GPUs over the mesh by model, and how many.
    pub gpus: Vec<(String, usize)>,
    /// Nodes whose open-file limit is too low for a mesh this size.
    pub short_of_files: Vec<String>,
}

/// How many of the busiest nodes a glance names.
pub const BUSIEST_SHOWN: usize = 5;

impl Glance {
    /// The nodes by state, as `mesh status` and `mesh watch` say it:
    /// `2 running · 298 idle`.
    pub fn states_words(&self) -> String {
        let states: Vec<String> = self
            .by_state
            .iter()
            .map(|(st, c)| format!("{c} {}", st.word()))
            .collect();
        states.join(" · ")
    }

    /// The busiest, each its short id with tasks running+queued:
    /// `…a1b2c3d4 2+1 · …`.
    pub fn busiest_words(&self) -> String {
        let busy: Vec<String> = self
            .busiest
            .iter()
            .map(|(id, r, q)| format!("…{} {r}+{q}", short_id(id)))
            .collect();
        busy.join(" · ")
    }
}

impl MeshStatus {
    pub fn glance(&self) -> Glance {
        let n = self.nodes.len();
        let mut by_state: HashMap<NodeState, usize> = HashMap::new();
        for v in &self.nodes {
            *by_state.entry(v.state()).or_default() += 1;
        }
        let mut by_state: Vec<(NodeState, usize)> = by_state.into_iter().collect();
        by_state.sort();
        let mut resources: Vec<ResourceUse> = Vec::new();
        for u in self.nodes.iter().flat_map(|v| &v.usage) {
            match resources.iter_mut().find(|r| r.kind == u.kind) {
                Some(r) => {
                    r.used += u.used;
                    r.total += u.total;
                }
                None => resources.push(u.clone()),
            }
        }
        let mut tasks: Vec<u32> = self.nodes.iter().map(|v| v.running + v.queued).collect();
        tasks.sort_unstable();
        let spread = |v: &[u32]| match v {
            [] => (0, 0, 0),
            v => (v[0], v[v.len() / 2], v[v.len() - 1]),
        };
        let mut busy: Vec<&NodeView> = self
            .nodes
            .iter()
            .filter(|v| v.running + v.queued > 0)
            .collect();
        busy.sort_by(|a, b| (b.running + b.queued, &a.id).cmp(&(a.running + a.queued, &b.id)));
        let mut loads: Vec<f64> = self.nodes.iter().filter_map(|v| v.load).collect();
        loads.sort_by(f64::total_cmp);
        let mut gpus: HashMap<String, usize> = HashMap::new();
        for g in self.nodes.iter().flat_map(|v| &v.gpus) {
            let model = if g.name.is_empty() { "GPU" } else { &g.name };
            *gpus.entry(model.to_string()).or_default() += 1;
        }
        let mut gpus: Vec<(String, usize)> = gpus.into_iter().collect();
        gpus.sort();
        let short_of_files = self
            .nodes
            .iter()
            .filter(|v| {
                v.files_max > 0
                    && crate::limits::OpenFiles {
                        limit: v.files_max,
                        was: v.files_max,
                    }
                    .short_for(n)
            })
            .map(|v| v.id.clone())
            .collect();
        Glance {
            nodes: n,
            by_state,
            behind: self.nodes.iter().filter(|v| v.health > 0).count(),
            resources,
            tasks_spread: spread(&tasks),
            busiest: busy
                .iter()
                .take(BUSIEST_SHOWN)
                .map(|v| (v.id.clone(), v.running, v.queued))
                .collect(),
            load_spread: (!loads.is_empty())
                .then(|| (loads[0], loads[loads.len() / 2], loads[loads.len() - 1])),
            gpus,
            short_of_files,
        }
    }
}
