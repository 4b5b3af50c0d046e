//! Scenarios: what a simulated run is made of (nodes, work, network, faults), as a struct and as TOML.
//!
//! A scenario file is the TOML form of [`SimConfig`]; every field but
//! `seed`, `nodes` and `stages` has a default. Example:
//!
//! ```toml
//! name = "crash"
//! seed = 7
//! steal = true                 # thieves take queued tasks from overloaded peers
//! latency = "uniform:1..3"     # per message, same syntax as durations
//! loss = 0.0                   # probability that any one message is dropped
//! submit_at_ms = 0             # when node `submit_node` submits the farm
//! max_time_ms = 600000         # virtual time limit: a run still busy then is stuck (default:
//!                              # none; stuck when nothing starts or ends for 10 min past the
//!                              # last task's end and the last scripted event)
//! one_mesh = true              # the end check below (default on)
//!
//! [[nodes]]                    # a group of identical nodes; node indices count from 0 in file order
//! count = 3
//! resources = "cpu=4"
//! [[nodes]]
//! count = 1
//! resources = "cpu=8,gpu=2"
//! join_at_ms = 5000            # a late joiner (default 0)
//!
//! [[stages]]
//! name = "work"
//! tasks = 1000
//! durations = "zipf:1.2"       # see `parse_durations`
//! resources = "cpu=1"          # default cpu=1
//! fail_rate = 0.0              # share of tasks that always exit 1 (chosen by the seed)
//! # after = ["prep"], after_each = ["prep"], retries = 0, timeout_ms = 1000
//!
//! [[crashes]]                  # node 2 dies at 800 ms and comes back from its store 1 s later
//! node = 2
//! at_ms = 800
//! restart_after_ms = 1000      # omit: it stays down
//! [[leaves]]                   # a graceful leave: running tasks are interrupted and given back
//! node = 1
//! at_ms = 900
//! [[partitions]]               # these nodes cannot reach the others, nor they them
//! nodes = [0, 1]
//! from_ms = 100
//! until_ms = 3000
//! [[stall]]                    # node 0 is paused (SIGSTOP) from 0 to 45 s: what comes for it
//! node = 0                     # (messages, its timers, task ends, answers) waits, and is
//! from_ms = 0                  # handled in order at until_ms; it sends nothing meanwhile
//! until_ms = 45000
//! [[slow]]                     # node 0 is overloaded: messages to it are served one after
//! node = 0                     # another, each taking 2 ms of its time, so a burst of them
//! per_msg_us = 2000            # is answered late (a queue, not a fixed delay)
//! from_ms = 0
//! until_ms = 60000
//! [[introduce]]                # node 1 is introduced to node 5 (dials it, as a real node does
//! node = 1                     # a member it remembers, or a join address whose node is in
//! to = 5                       # another mesh)
//! at_ms = 20000
//!
//! [[alloc]]                    # an allocation queue (`mesh alloc`) against a simulated batch system
//! name = "cpu"
//! cores = 8                    # per node of a job (gpus = 0, mem = "32G" or none, nodes_per_job = 1)
//! walltime_ms = 600000         # each job's; its nodes drain drain_margin_ms before (default min(2 min, a tenth))
//! max = 10                     # jobs queued and running at most (min = 0)
//! idle_timeout_ms = 60000      # a job whose nodes run nothing this long is cancelled (default 5 min)
//! start_delay = "uniform:20000..60000"  # how long a job waits in the batch queue, as durations
//! reject_rate = 0.1            # share of submissions the batch system refuses
//! add_at_ms = 0                # when the queue is added
//!
//! [mesh]                       # overrides of mesh_protocol::mesh::Config for every node
//! prefetch_percent = 110       # the fixed rule instead of the depth each node measures
//! node_claims_max = 100000     # with a huge prefetch: place work badly on purpose
//! reports_per_s = 2            # the coordinator's beat budget: each node reports every N / 2 s
//! ```
//!
//! How nodes start. The first node up on its side of any partition founds
//! a mesh (`mesh node`); every other node that starts (at the start, late,
//! or as a batch job's) runs `mesh join` through the lowest node up on its
//! side (`Peer::joins_by_address`): it never elects itself before a node it
//! was introduced to has said whom it follows, however long that takes.
//! A node restarted from its store instead rejoins the peers it remembers
//! (the lowest up on its side), and runs alone if none answers in 30 s.
//! A node stalled from its start is up and stopped right after its first
//! step. `[[introduce]]` is how two meshes formed apart meet: a real node
//! dials the members it remembers and its join addresses for a day, and a
//! connection to a node that is not a member introduces it there.
//!
//! The end checks: every task that should succeed is done at the farm's
//! home with its outputs there; and, with `one_mesh` (on by default: a mesh
//! that stays split is what users would see, whatever the farm did), every
//! group of live nodes that can reach each other is one mesh: they follow
//! one coordinator, one of them, in one term, and each knows every other as
//! a member. The mesh is looked at every virtual second; once the farm is
//! over, the run goes on until it is one mesh, and is stuck if it is not by
//! `max_time_ms` (or, without one, 10 virtual minutes after the last task
//! and the last scripted event). The report says since when it was one mesh
//! (`one_mesh_ms`) and which nodes ever coordinated.

use std::io;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use mesh_protocol::mesh::Config;
use mesh_protocol::resources::{parse_resources, AmountError, ResourceSpecError, CPU};

use crate::dist::{parse_durations, DistError};
use crate::SimError;

/// One simulated run: nodes, the farm, the network and the faults.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimConfig {
    #[serde(default = "default_name")]
    pub name: String,
    /// Everything random (durations, latency, loss, the peers' own choices)
    /// follows from it; 1 unless said, as `mesh sim` without a scenario.
    #[serde(default = "one_u64")]
    pub seed: u64,
    pub nodes: Vec<NodeGroup>,
    /// The one farm of the run, submitted by `submit_node` at `submit_at_ms`.
    pub stages: Vec<StageSpec>,
    #[serde(default = "yes")]
    pub steal: bool,
    /// Per-message delay, in the syntax of [`parse_durations`].
    #[serde(default = "default_latency")]
    pub latency: String,
    /// Probability that a message (of any kind) is lost.
    #[serde(default)]
    pub loss: f64,
    #[serde(default)]
    pub submit_node: usize,
    #[serde(default)]
    pub submit_at_ms: u64,
    /// A run with work left at this virtual time is reported stuck. None:
    /// no fixed limit; a run is stuck once nothing has started or ended for
    /// [`crate::QUIET_MS`] past its last task's end and its last scripted
    /// event (a farm of days runs its days).
    #[serde(default)]
    pub max_time_ms: Option<u64>,
    /// Every invariant of the stepped peer is checked after every step on
    /// what the step changed (nothing free beyond its total; its pool
    /// against its grants; as coordinator, the claims of each node whose
    /// claims changed against the load booked for it, the live runs of each
    /// stage whose runs changed against its counter), as are the sim's own
    /// (a start fits what is free, no duplicate without a fault). The same
    /// checks as a pass over all the peer's tasks run after every
    /// `check_every`-th step (0, the default: never during the run), and at
    /// the end, with the scan of every task's status behind the progress
    /// counters.
    #[serde(default)]
    pub check_every: u64,
    /// Step every periodic timer of the peers, even one that does nothing
    /// (a gossip tick with nothing to tell), rather than skip it: slower,
    /// and the same run to the byte, which is what it is for.
    #[serde(default)]
    pub step: bool,
    /// Every successful task leaves one output that the home fetches from
    /// the node that ran it (the farm ends when all are home). Off for
    /// studies of scheduling alone.
    #[serde(default = "yes")]
    pub outputs: bool,
    #[serde(default)]
    pub crashes: Vec<CrashSpec>,
    #[serde(default)]
    pub leaves: Vec<LeaveSpec>,
    #[serde(default)]
    pub partitions: Vec<PartitionSpec>,
    #[serde(default)]
    pub stall: Vec<StallSpec>,
    #[serde(default)]
    pub slow: Vec<SlowSpec>,
    #[serde(default)]
    pub introduce: Vec<IntroduceSpec>,
    /// At the end, every group of live nodes that can reach each other is
    /// one mesh (see the module docs).
    #[serde(default = "yes")]
    pub one_mesh: bool,
    /// Allocation queues: nodes that batch jobs bring when the backlog asks for them.
    #[serde(default)]
    pub alloc: Vec<AllocSpec>,
    #[serde(default)]
    pub mesh: MeshKnobs,
}

/// An allocation queue and the simulated batch system behind it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AllocSpec {
    #[serde(default = "default_name")]
    pub name: String,
    pub cores: u32,
    #[serde(default)]
    pub gpus: u32,
    /// Memory per node of a job, as `mem` in resources ("32G").
    #[serde(default)]
    pub mem: Option<String>,
    #[serde(default = "one_u32")]
    pub nodes_per_job: u32,
    /// Whole seconds, as a batch system takes them.
    pub walltime_ms: u64,
    /// Before the walltime, when a job's nodes drain (default: 2 minutes,
    /// or a tenth of a shorter walltime, as `mesh join --walltime`).
    #[serde(default)]
    pub drain_margin_ms: Option<u64>,
    #[serde(default)]
    pub min: u32,
    #[serde(default = "default_alloc_max")]
    pub max: u32,
    /// Whole seconds, as `mesh alloc add --idle-timeout` takes it.
    #[serde(default = "default_idle_timeout")]
    pub idle_timeout_ms: u64,
    /// How long a job waits in the batch queue before it starts, in the
    /// syntax of [`parse_durations`].
    #[serde(default = "default_start_delay")]
    pub start_delay: String,
    /// Share of submissions the batch system refuses.
    #[serde(default)]
    pub reject_rate: f64,
    #[serde(default)]
    pub add_at_ms: u64,
}

impl AllocSpec {
    pub fn drain_margin(&self) -> u64 {
        self.drain_margin_ms
            .unwrap_or_else(|| (self.walltime_ms / 10).min(120_000))
    }

    /// Memory per node in bytes (validated).
    pub fn mem_bytes(&self) -> Option<u64> {
        let m = self.mem.as_ref()?;
        let a = mesh_protocol::resources::parse_amount(mesh_protocol::resources::MEM, m).ok()?;
        Some(a.whole())
    }

    /// What each node of a job has: the job's cores, GPUs and memory, as
    /// its script starts `mesh join` (and as the coordinator counts the queue).
    pub fn node_resources(&self) -> mesh_protocol::Resources {
        self.queue_def().node_resources()
    }

    /// The queue as `mesh alloc add` would record it.
    pub fn queue_def(&self) -> mesh_protocol::alloc::QueueDef {
        mesh_protocol::alloc::QueueDef {
            gpus: self.gpus,
            mem_bytes: self.mem_bytes(),
            nodes_per_job: self.nodes_per_job,
            min: self.min,
            max: self.max,
            idle_timeout_s: self.idle_timeout_ms / 1000,
            ..mesh_protocol::alloc::QueueDef::new(
                &self.name,
                mesh_protocol::alloc::BatchSystem::Slurm,
                self.walltime_ms / 1000,
                self.cores,
            )
        }
    }
}

/// Identical nodes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeGroup {
    #[serde(default = "one_usize")]
    pub count: usize,
    /// As for `--resources`: `cpu=4,gpu=1,mem=8GiB`.
    pub resources: String,
    /// When the nodes start; 0 for the founding members.
    #[serde(default)]
    pub join_at_ms: u64,
}

/// One stage of the farm.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StageSpec {
    pub name: String,
    pub tasks: u64,
    /// How long each task runs, drawn once per task from the seed (see [`parse_durations`]).
    pub durations: String,
    #[serde(default = "default_stage_resources")]
    pub resources: String,
    /// Stages that must be complete before this one starts.
    #[serde(default)]
    pub after: Vec<String>,
    /// Stages whose task `i` must be done before this stage's task `i`.
    #[serde(default)]
    pub after_each: Vec<String>,
    /// Share of the tasks (chosen by the seed) that exit 1 on every attempt.
    #[serde(default)]
    pub fail_rate: f64,
    #[serde(default)]
    pub retries: u32,
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// `expected`: a node that drains sooner does not start the stage's tasks.
    #[serde(default)]
    pub expected_ms: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CrashSpec {
    pub node: usize,
    pub at_ms: u64,
    /// Restarts from its store this long after the crash; never when absent.
    #[serde(default)]
    pub restart_after_ms: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LeaveSpec {
    pub node: usize,
    pub at_ms: u64,
}

/// During `[from_ms, until_ms)` no message passes between `nodes` and the rest.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PartitionSpec {
    pub nodes: Vec<usize>,
    pub from_ms: u64,
    pub until_ms: u64,
}

/// During `[from_ms, until_ms)` the node is paused (SIGSTOP): everything
/// for it waits until `until_ms` and is then handled in order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StallSpec {
    pub node: usize,
    pub from_ms: u64,
    pub until_ms: u64,
}

/// During `[from_ms, until_ms)` messages arriving at the node are served
/// one after another, each taking `per_msg_us` of its time.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SlowSpec {
    pub node: usize,
    pub per_msg_us: u64,
    pub from_ms: u64,
    pub until_ms: u64,
}

/// At `at_ms`, `node` is introduced to `to` (`Peer::introduce`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IntroduceSpec {
    pub node: usize,
    pub to: usize,
    pub at_ms: u64,
}

/// Overrides of the peers' [`Config`]; absent fields keep its defaults.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MeshKnobs {
    pub heartbeat_ms: Option<u64>,
    /// How often a worker reports to its coordinator in a small mesh.
    pub report_ms: Option<u64>,
    /// The coordinator's budget of beats a second: lowered, a small mesh
    /// reports as seldom as a large one does (every N / budget seconds).
    pub reports_per_s: Option<u64>,
    pub dead_after_ms: Option<u64>,
    pub join_wait_ms: Option<u64>,
    pub prefetch_percent: Option<u64>,
    pub node_claims_max: Option<usize>,
    pub batch_max: Option<usize>,
    pub queue_max: Option<usize>,
    pub resend_ms: Option<u64>,
    pub progress_ms: Option<u64>,
    pub steal_timeout_ms: Option<u64>,
    pub replicas: Option<usize>,
    pub outputs_wait_ms: Option<u64>,
    /// How long a message to a node with no connection may take (the
    /// real node's is 10 s: connecting and its handshakes); default: the
    /// resend interval, as simulated messages open no connections.
    pub connect_ms: Option<u64>,
    /// How long a leaving node stays at most for its outputs to be
    /// fetched, and how long without a fetch lets it go earlier (the real
    /// node's: 10 s and 2 s).
    pub linger_max_ms: Option<u64>,
    pub linger_quiet_ms: Option<u64>,
}

fn default_name() -> String {
    "sim".into()
}
fn yes() -> bool {
    true
}
fn one_u64() -> u64 {
    1
}
fn one_usize() -> usize {
    1
}
fn one_u32() -> u32 {
    1
}
fn default_alloc_max() -> u32 {
    10
}
fn default_idle_timeout() -> u64 {
    300_000
}
fn default_start_delay() -> String {
    "uniform:10000..30000".into()
}
fn default_latency() -> String {
    "uniform:1..3".into()
}
fn default_stage_resources() -> String {
    "cpu=1".into()
}

/// What is wrong with a scenario (or a workload); nothing ran. `at` names
/// the field, as `stages[0] (a).durations`.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {}: {source}", .path.display())]
    Unreadable { path: PathBuf, source: io::Error },
    /// A scenario file's mistake, with the file.
    #[error("{}: {source}", .path.display())]
    In {
        path: PathBuf,
        source: Box<ConfigError>,
    },
    #[error(transparent)]
    Toml(#[from] toml::de::Error),
    /// Durations or resources read again after the checks (they passed them).
    #[error(transparent)]
    Dist(#[from] DistError),
    #[error(transparent)]
    Spec(#[from] ResourceSpecError),
    #[error("a scenario needs at least one stage")]
    NoStages,
    #[error("{at}: tasks must be from 1 to 2^32-1")]
    Tasks { at: String },
    #[error("{at}: {source}")]
    Durations { at: String, source: DistError },
    #[error("{at} {value:?}: {source}")]
    Resources {
        at: String,
        value: String,
        source: ResourceSpecError,
    },
    #[error("{at} {value:?}: {source}")]
    Amount {
        at: String,
        value: String,
        source: AmountError,
    },
    #[error("{at} must be from 0 to 1")]
    Share { at: String },
    #[error("{at}: it may depend only on earlier stages, not {dep:?}")]
    Later { at: String, dep: String },
    #[error("{at}: no stage named {dep:?}")]
    NoStage { at: String, dep: String },
    #[error("{at}: after_each {dep:?} needs the same number of tasks")]
    EachCount { at: String, dep: String },
    #[error("a scenario needs at least one node")]
    NoNodes,
    #[error("{at} must be at least 1")]
    AtLeastOne { at: String },
    #[error("{at}: min {min} is more than max {max}")]
    MinOverMax { at: String, min: u32, max: u32 },
    #[error("{at} must be whole seconds (a multiple of 1000), as the queue takes it")]
    WholeSeconds { at: String },
    #[error("{at}.walltime_ms must be longer than the drain margin ({margin_ms} ms)")]
    Walltime { at: String, margin_ms: u64 },
    #[error("{at}: two queues named {name:?}")]
    TwoQueues { at: String, name: String },
    #[error("loss must be from 0 to below 1")]
    Loss,
    #[error("submit_node {node} but only {nodes} nodes")]
    SubmitNode { node: usize, nodes: usize },
    #[error("{at}: node {node} but only {nodes} nodes")]
    NoSuchNode {
        at: String,
        node: usize,
        nodes: usize,
    },
    #[error("{at}: the submitting node may not leave")]
    SubmitterLeaves { at: String },
    #[error("{at}: until_ms must be after from_ms")]
    Backwards { at: String },
    #[error("{at}: a node is not introduced to itself")]
    SelfIntroduced { at: String },
    #[error("workload: {0}")]
    Workload(#[from] crate::workflow::WorkloadError),
    #[error("jitter {0} must be from 0 to below 1")]
    Jitter(f64),
    #[error("bandwidth must be above 0")]
    Bandwidth,
}

/// Reads a scenario file (TOML, see the module docs) and checks it.
pub fn load_scenario(path: impl AsRef<std::path::Path>) -> Result<SimConfig, SimError> {
    let path = path.as_ref();
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Unreadable {
        path: path.to_path_buf(),
        source,
    })?;
    parse_scenario(&text).map_err(|e| match e {
        SimError::Config(c) => SimError::Config(ConfigError::In {
            path: path.to_path_buf(),
            source: Box::new(c),
        }),
        other => other,
    })
}

/// Parses and checks a scenario given as TOML text.
pub fn parse_scenario(text: &str) -> Result<SimConfig, SimError> {
    let cfg: SimConfig = toml::from_str(text).map_err(ConfigError::from)?;
    cfg.validate()?;
    Ok(cfg)
}

impl SimConfig {
    /// A fault-free scenario of `nodes` identical nodes and one stage; tests build on it.
    pub fn simple(seed: u64, nodes: usize, resources: &str, tasks: u64, durations: &str) -> Self {
        SimConfig {
            name: default_name(),
            seed,
            nodes: vec![NodeGroup {
                count: nodes,
                resources: resources.into(),
                join_at_ms: 0,
            }],
            stages: vec![StageSpec {
                name: "work".into(),
                tasks,
                durations: durations.into(),
                resources: default_stage_resources(),
                after: vec![],
                after_each: vec![],
                fail_rate: 0.0,
                retries: 0,
                timeout_ms: None,
                expected_ms: None,
            }],
            steal: true,
            latency: default_latency(),
            loss: 0.0,
            submit_node: 0,
            submit_at_ms: 0,
            max_time_ms: None,
            check_every: 0,
            step: false,
            outputs: true,
            crashes: vec![],
            leaves: vec![],
            partitions: vec![],
            stall: vec![],
            slow: vec![],
            introduce: vec![],
            one_mesh: true,
            alloc: vec![],
            mesh: MeshKnobs::default(),
        }
    }

    /// Scales the node groups to `n` nodes in all, keeping their
    /// proportions (each group keeps at least one node).
    pub fn scale_nodes(&mut self, n: usize) {
        let groups = &mut self.nodes;
        let total: usize = groups.iter().map(|g| g.count).sum();
        if total == 0 || groups.is_empty() {
            return;
        }
        let mut left = n;
        let last = groups.len() - 1;
        for (i, g) in groups.iter_mut().enumerate() {
            let c = if i == last {
                left
            } else {
                (g.count * n / total)
                    .max(1)
                    .min(left.saturating_sub(last - i))
            };
            g.count = c;
            left -= c;
        }
        groups.retain(|g| g.count > 0);
    }

    /// The fewest nodes of these groups' mix whose cores could hold the
    /// stages' mean work (tasks × mean duration × cores each) within
    /// `deadline_ms`, less a twentieth for the draws: fewer cannot meet
    /// it, so a search for the fewest that do starts here.
    pub fn nodes_for_work(&self, deadline_ms: u64) -> usize {
        let cpu = |text: &str| parse_resources(text).map_or(1.0, |r| r.get(CPU).as_f64());
        let count = self.node_count().max(1) as f64;
        let per_node = self
            .nodes
            .iter()
            .map(|g| g.count as f64 * cpu(&g.resources))
            .sum::<f64>()
            / count;
        let work: f64 = self
            .stages
            .iter()
            .map(|s| {
                let mean = parse_durations(&s.durations).map_or(0.0, |d| d.mean());
                s.tasks as f64 * mean * cpu(&s.resources)
            })
            .sum();
        let least = 0.95 * work / (deadline_ms.max(1) as f64 * per_node.max(0.001));
        (least.floor() as usize).max(1)
    }

    /// How many nodes the groups add up to.
    pub fn node_count(&self) -> usize {
        self.nodes.iter().map(|g| g.count).sum()
    }

    /// True when the run has faults, so duplicate executions are allowed.
    pub fn has_faults(&self) -> bool {
        self.loss > 0.0
            || !self.crashes.is_empty()
            || !self.leaves.is_empty()
            || !self.partitions.is_empty()
            // A paused or swamped node looks dead to the others.
            || !self.stall.is_empty()
            || !self.slow.is_empty()
            // Batch jobs end (walltimes, cancels) under running tasks.
            || !self.alloc.is_empty()
    }

    /// The peers' configuration: the defaults with this scenario's overrides.
    pub fn peer_config(&self) -> Config {
        let d = Config::default();
        let m = &self.mesh;
        Config {
            heartbeat_ms: m.heartbeat_ms.unwrap_or(d.heartbeat_ms),
            report_ms: m.report_ms.unwrap_or(d.report_ms),
            reports_per_s: m.reports_per_s.unwrap_or(d.reports_per_s),
            dead_after_ms: m.dead_after_ms.unwrap_or(d.dead_after_ms),
            join_wait_ms: m.join_wait_ms.unwrap_or(d.join_wait_ms),
            steal: self.steal,
            prefetch_percent: m.prefetch_percent.or(d.prefetch_percent),
            node_claims_max: m.node_claims_max.or(d.node_claims_max),
            batch_max: m.batch_max.unwrap_or(d.batch_max),
            queue_max: m.queue_max.unwrap_or(d.queue_max),
            resend_ms: m.resend_ms.unwrap_or(d.resend_ms),
            progress_ms: m.progress_ms.unwrap_or(d.progress_ms),
            steal_timeout_ms: m.steal_timeout_ms.unwrap_or(d.steal_timeout_ms),
            replicas: m.replicas.unwrap_or(d.replicas),
            outputs_wait_ms: m.outputs_wait_ms.unwrap_or(d.outputs_wait_ms),
            connect_ms: m.connect_ms.unwrap_or(d.resend_ms),
            linger_max_ms: m.linger_max_ms.unwrap_or(d.linger_max_ms),
            linger_quiet_ms: m.linger_quiet_ms.unwrap_or(d.linger_quiet_ms),
            step_upkeep: self.step,
            quiet_swim: !self.step,
        }
    }

    /// Checks everything a run would trip over, with messages that name the field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_stages()?;
        self.validate_cluster()
    }

    /// Checks the farm's stages.
    fn validate_stages(&self) -> Result<(), ConfigError> {
        if self.stages.is_empty() {
            return Err(ConfigError::NoStages);
        }
        for (i, s) in self.stages.iter().enumerate() {
            let at = format!("stages[{i}] ({})", s.name);
            if s.tasks == 0 || s.tasks > u32::MAX as u64 {
                return Err(ConfigError::Tasks { at });
            }
            if let Err(source) = parse_durations(&s.durations) {
                let at = format!("{at}.durations");
                return Err(ConfigError::Durations { at, source });
            }
            if let Err(source) = mesh_protocol::resources::parse_resources(&s.resources) {
                return Err(ConfigError::Resources {
                    at: format!("{at}.resources"),
                    value: s.resources.clone(),
                    source,
                });
            }
            if !(0.0..=1.0).contains(&s.fail_rate) {
                let at = format!("{at}.fail_rate");
                return Err(ConfigError::Share { at });
            }
            for d in s.after.iter().chain(&s.after_each) {
                let dep = d.clone();
                match self.stages.iter().position(|t| &t.name == d) {
                    Some(j) if j < i => {}
                    Some(_) => return Err(ConfigError::Later { at, dep }),
                    None => return Err(ConfigError::NoStage { at, dep }),
                }
            }
            for d in &s.after_each {
                let j = self
                    .stages
                    .iter()
                    .position(|t| &t.name == d)
                    .expect("checked");
                if self.stages[j].tasks != s.tasks {
                    let dep = d.clone();
                    return Err(ConfigError::EachCount { at, dep });
                }
            }
        }
        Ok(())
    }

    /// Checks everything but the stages: the nodes, the network, the
    /// queues and the faults (a recorded workflow brings its own farm).
    pub fn validate_cluster(&self) -> Result<(), ConfigError> {
        let n = self.node_count();
        if n == 0 {
            return Err(ConfigError::NoNodes);
        }
        for (i, g) in self.nodes.iter().enumerate() {
            if let Err(source) = mesh_protocol::resources::parse_resources(&g.resources) {
                return Err(ConfigError::Resources {
                    at: format!("nodes[{i}].resources"),
                    value: g.resources.clone(),
                    source,
                });
            }
        }
        if let Err(source) = parse_durations(&self.latency) {
            let at = "latency".to_string();
            return Err(ConfigError::Durations { at, source });
        }
        for (i, a) in self.alloc.iter().enumerate() {
            let at = format!("alloc[{i}] ({})", a.name);
            if a.cores == 0 {
                let at = format!("{at}.cores");
                return Err(ConfigError::AtLeastOne { at });
            }
            if a.nodes_per_job == 0 {
                let at = format!("{at}.nodes_per_job");
                return Err(ConfigError::AtLeastOne { at });
            }
            if a.min > a.max {
                let (min, max) = (a.min, a.max);
                return Err(ConfigError::MinOverMax { at, min, max });
            }
            if let Some(m) = &a.mem {
                if let Err(source) =
                    mesh_protocol::resources::parse_amount(mesh_protocol::resources::MEM, m)
                {
                    return Err(ConfigError::Amount {
                        at: format!("{at}.mem"),
                        value: m.clone(),
                        source,
                    });
                }
            }
            for (field, ms) in [
                ("walltime_ms", a.walltime_ms),
                ("idle_timeout_ms", a.idle_timeout_ms),
            ] {
                if ms % 1000 != 0 {
                    let at = format!("{at}.{field}");
                    return Err(ConfigError::WholeSeconds { at });
                }
            }
            if a.walltime_ms <= a.drain_margin() {
                let margin_ms = a.drain_margin();
                return Err(ConfigError::Walltime { at, margin_ms });
            }
            if let Err(source) = parse_durations(&a.start_delay) {
                let at = format!("{at}.start_delay");
                return Err(ConfigError::Durations { at, source });
            }
            if !(0.0..=1.0).contains(&a.reject_rate) {
                let at = format!("{at}.reject_rate");
                return Err(ConfigError::Share { at });
            }
            if self.alloc[..i].iter().any(|b| b.name == a.name) {
                let name = a.name.clone();
                return Err(ConfigError::TwoQueues { at, name });
            }
        }
        if !(0.0..1.0).contains(&self.loss) {
            return Err(ConfigError::Loss);
        }
        if self.submit_node >= n {
            let node = self.submit_node;
            return Err(ConfigError::SubmitNode { node, nodes: n });
        }
        let node_ok = |at: String, node: usize| {
            if node >= n {
                Err(ConfigError::NoSuchNode { at, node, nodes: n })
            } else {
                Ok(())
            }
        };
        for (i, c) in self.crashes.iter().enumerate() {
            node_ok(format!("crashes[{i}]"), c.node)?;
        }
        for (i, l) in self.leaves.iter().enumerate() {
            let at = format!("leaves[{i}]");
            node_ok(at.clone(), l.node)?;
            if l.node == self.submit_node {
                return Err(ConfigError::SubmitterLeaves { at });
            }
        }
        for (i, p) in self.partitions.iter().enumerate() {
            let at = format!("partitions[{i}]");
            for &node in &p.nodes {
                node_ok(at.clone(), node)?;
            }
            if p.until_ms <= p.from_ms {
                return Err(ConfigError::Backwards { at });
            }
        }
        for (i, s) in self.stall.iter().enumerate() {
            let at = format!("stall[{i}]");
            node_ok(at.clone(), s.node)?;
            if s.until_ms <= s.from_ms {
                return Err(ConfigError::Backwards { at });
            }
        }
        for (i, s) in self.slow.iter().enumerate() {
            let at = format!("slow[{i}]");
            node_ok(at.clone(), s.node)?;
            if s.until_ms <= s.from_ms {
                return Err(ConfigError::Backwards { at });
            }
            if s.per_msg_us == 0 {
                let at = format!("{at}.per_msg_us");
                return Err(ConfigError::AtLeastOne { at });
            }
        }
        for (i, s) in self.introduce.iter().enumerate() {
            let at = format!("introduce[{i}]");
            node_ok(at.clone(), s.node)?;
            node_ok(format!("{at}.to"), s.to)?;
            if s.node == s.to {
                return Err(ConfigError::SelfIntroduced { at });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_scenario_file_loads() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/scenarios");
        let mut seen = 0;
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "toml") {
                load_scenario(&p).unwrap();
                seen += 1;
            }
        }
        assert!(seen >= 3, "only {seen} scenarios in {dir}");
    }

    #[test]
    fn errors_name_the_field() {
        let e = parse_scenario(
            "seed = 1\n[[nodes]]\nresources = \"cpu=2\"\n[[stages]]\nname = \"a\"\ntasks = 3\ndurations = \"zipf:x\"\n",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("stages[0] (a).durations"), "{e}");
        let e = parse_scenario("seed = 1\nnodez = 3\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("nodez"), "{e}");
    }

    #[test]
    fn a_scenario_without_a_seed_runs_seed_1() {
        let farm = "[[nodes]]\ncount = 2\nresources = \"cpu=2\"\n\
                    [[stages]]\nname = \"a\"\ntasks = 3\ndurations = \"1s\"\n";
        assert_eq!(parse_scenario(farm).unwrap().seed, 1);
        let seeded = parse_scenario(&format!("seed = 9\n{farm}")).unwrap();
        assert_eq!(seeded.seed, 9);
    }
}
