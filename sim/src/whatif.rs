//! What-if runs of a recorded workflow: its [`Workload`] replayed through the real peers on as many nodes as asked, and the questions asked of them (how fast on N nodes, the fewest nodes for a deadline, the spread under jitter).
//!
//! [`run_workload`] runs a workload like any scenario: the same peers,
//! placement, stealing and membership; each task holds its stage's
//! resources for its recorded runtime, after bringing the files it reads
//! from its parents' nodes over simulated links ([`crate::workflow::Links`]).
//! [`sweep`] and [`fewest_nodes`] are the questions, each answer a set of
//! such runs.

use crate::report::SimReport;
use crate::scenario::SimConfig;
use crate::search::Verdict;
use crate::workflow::{Replay, Workload};
use crate::{ConfigError, SimError};

/// The cluster of a what-if run.
#[derive(Clone, Debug, PartialEq)]
pub struct WhatIf {
    pub seed: u64,
    pub nodes: usize,
    /// Each node's resources, as for `--resources` (`cpu=4,mem=16GiB`).
    pub node: String,
    pub replay: Replay,
    pub steal: bool,
    /// Step every timer, even those that do nothing (`SimConfig::step`).
    pub step: bool,
    /// A scenario whose cluster is used instead (its node groups scaled
    /// to `nodes`, its allocation queues, network and knobs; its stages
    /// are not used).
    pub cluster: Option<SimConfig>,
}

impl WhatIf {
    /// The scenario: `nodes` nodes up from the start (or the scenario's,
    /// scaled), the farm submitted by the first at once, messages taking
    /// the links' latency (or the scenario's), no faults.
    pub fn config(&self, wl: &Workload) -> SimConfig {
        let mut cfg = match &self.cluster {
            Some(c) => {
                let mut c = c.clone();
                c.seed = self.seed;
                c.scale_nodes(self.nodes);
                c.steal &= self.steal;
                c.step |= self.step;
                c
            }
            None => {
                let mut c = SimConfig::simple(self.seed, self.nodes, &self.node, 1, "1");
                c.steal = self.steal;
                c.step = self.step;
                c.latency = self.replay.links.latency_ms.max(1).to_string();
                c
            }
        };
        cfg.name = wl.def.name.clone();
        cfg.stages.clear();
        // A what-if asks how long the farm takes; the mesh is one
        // throughout a fault-free run, and a look every virtual second
        // at thousands of nodes for hours of virtual time costs more than
        // the run.
        cfg.one_mesh = false;
        let batch = cfg
            .alloc
            .iter()
            .map(|a| a.max as usize * a.nodes_per_job as usize)
            .sum::<usize>();
        // A what-if's limit is derived from the work (as it was before
        // runs had none, when the scenario's own, if longer, also held):
        // its reports do not move.
        let limit = time_limit(wl, &self.replay, self.nodes + batch);
        cfg.max_time_ms = Some(cfg.max_time_ms.map_or(limit, |m| m.max(limit)));
        cfg
    }
}

/// A generous virtual time limit: everything one after another on one
/// core, every byte over the links, twice, and ten minutes.
fn time_limit(wl: &Workload, replay: &Replay, nodes: usize) -> u64 {
    let bytes: u64 = wl.reads.iter().flatten().map(|r| r.bytes).sum::<u64>()
        + wl.input_bytes.saturating_mul(nodes as u64);
    let edges: usize = wl.reads.iter().map(Vec::len).sum();
    let moved = replay.links.transfer_ms(edges + nodes, bytes);
    let slowest = (1.0 + replay.jitter.max(0.0)) * wl.work_ms() as f64;
    (2.0 * (slowest + moved as f64)) as u64 + 600_000
}

/// Runs a workload on the cluster `cfg` describes (its stages are not
/// used: the workload is the farm). Same scenario, workload, replay and
/// seed: the same report.
pub fn run_workload(
    cfg: &SimConfig,
    wl: &Workload,
    replay: &Replay,
) -> Result<SimReport, SimError> {
    cfg.validate_cluster()?;
    wl.check().map_err(ConfigError::from)?;
    if !(0.0..1.0).contains(&replay.jitter) {
        return Err(ConfigError::Jitter(replay.jitter).into());
    }
    if replay
        .links
        .bytes_per_s
        .is_some_and(|b| b.is_nan() || b <= 0.0)
    {
        return Err(ConfigError::Bandwidth.into());
    }
    crate::cluster::run_workload(cfg, wl, replay)
}

/// One run of a sweep, in numbers.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct RunNumbers {
    pub seed: u64,
    pub makespan_ms: u64,
    pub utilization: f64,
    /// Bytes moved between nodes (parents' files and the farm's inputs).
    pub moved_bytes: u64,
    /// Time tasks spent bringing their files, holding their cores.
    pub stage_in_ms: u64,
    pub tasks_done: u64,
    pub steals: u64,
    /// No schedule on these nodes is shorter: the longest chain, or the
    /// work over the cores (runtimes only, without transfers).
    pub lower_bound_ms: u64,
    /// An ideal list scheduler's makespan on these nodes: no latency, no
    /// transfers, durations unknown (as to mesh).
    pub greedy_ms: u64,
    /// With allocation queues: the node-hours their batch jobs held.
    pub batch_node_hours: f64,
}

impl RunNumbers {
    pub fn of(r: &SimReport) -> RunNumbers {
        RunNumbers {
            seed: r.seed,
            makespan_ms: r.makespan,
            utilization: r.utilization,
            moved_bytes: r.moved_bytes,
            stage_in_ms: r.stage_in_ms,
            tasks_done: r.tasks_done,
            steals: r.steals,
            lower_bound_ms: r.lower_bound,
            greedy_ms: r.greedy,
            batch_node_hours: r.alloc.as_ref().map_or(0.0, |a| a.node_ms as f64 / 3.6e6),
        }
    }
}

/// What one node count did, over its runs.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Row {
    pub nodes: usize,
    pub runs: Vec<RunNumbers>,
    /// Median and 90th percentile of the runs' makespans (nearest rank).
    pub makespan_p50_ms: u64,
    pub makespan_p90_ms: u64,
    /// Mean over the runs.
    pub utilization: f64,
    /// Nodes held for the median makespan, and the batch jobs' (their mean).
    pub node_hours: f64,
    /// The critical path over the median makespan: near 1, the graph
    /// alone explains the makespan and more nodes cannot help.
    pub critical_share: f64,
}

/// The `q`-quantile of `v` by nearest rank (`v` not empty).
pub fn quantile(v: &[u64], q: f64) -> u64 {
    let mut s = v.to_vec();
    s.sort_unstable();
    let rank = ((q * s.len() as f64).ceil() as usize).clamp(1, s.len());
    s[rank - 1]
}

/// The seed of run `k` of `repeat` from the base seed: run 0 is the base.
pub fn run_seed(seed: u64, k: usize) -> u64 {
    seed.wrapping_add(k as u64)
}

/// `repeat` runs on `nodes` nodes, seeds `base.seed`, `+1`, ...; the
/// report of the first is handed to `keep` (for pictures).
pub fn row(
    wl: &Workload,
    base: &WhatIf,
    nodes: usize,
    repeat: usize,
    mut keep: impl FnMut(SimReport),
) -> Result<Row, SimError> {
    let mut runs = Vec::with_capacity(repeat.max(1));
    for k in 0..repeat.max(1) {
        let w = WhatIf {
            seed: run_seed(base.seed, k),
            nodes,
            ..base.clone()
        };
        let r = run_workload(&w.config(wl), wl, &w.replay)?;
        if r.tasks_done != wl.tasks() as u64 {
            return Err(SimError::Stuck {
                seed: w.seed,
                at_ms: r.makespan,
                message: format!(
                    "{} of {} tasks done on {nodes} nodes: {}",
                    r.tasks_done,
                    wl.tasks(),
                    r.unplaceable.join("; ")
                ),
            });
        }
        runs.push(RunNumbers::of(&r));
        if k == 0 {
            keep(r);
        }
    }
    let makespans: Vec<u64> = runs.iter().map(|r| r.makespan_ms).collect();
    let p50 = quantile(&makespans, 0.5);
    Ok(Row {
        nodes,
        makespan_p50_ms: p50,
        makespan_p90_ms: quantile(&makespans, 0.9),
        utilization: runs.iter().map(|r| r.utilization).sum::<f64>() / runs.len() as f64,
        node_hours: nodes as f64 * p50 as f64 / 3_600_000.0
            + runs.iter().map(|r| r.batch_node_hours).sum::<f64>() / runs.len() as f64,
        critical_share: wl.critical_path_ms() as f64 / p50.max(1) as f64,
        runs,
    })
}

/// The rows for each node count, in the order given.
pub fn sweep(
    wl: &Workload,
    base: &WhatIf,
    counts: &[usize],
    repeat: usize,
    mut keep: impl FnMut(usize, SimReport),
) -> Result<Vec<Row>, SimError> {
    counts
        .iter()
        .map(|&n| row(wl, base, n, repeat, |r| keep(n, r)))
        .collect()
}

/// The answer to "how few nodes meet this deadline".
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Search {
    pub deadline_ms: u64,
    /// The fewest nodes whose makespan (the 90th percentile with
    /// repeats) met the deadline; none when no count tried did.
    pub nodes: Option<usize>,
    /// Every count simulated, in the order tried.
    pub tried: Vec<Row>,
    /// The fewest nodes that could hold the work by the deadline at all
    /// (see [`fewest_possible`]): fewer are not simulated.
    pub least: usize,
    /// Why there is no answer, when there is none.
    pub why_not: Option<String>,
}

/// The fewest nodes that meet `deadline_ms`: counts searched from where
/// greedy list scheduling over the graph meets it, never under the
/// fewest that could hold the work by then ([`fewest_possible`]), up by
/// doubling steps until one meets it, then halved between the last that
/// did not and the first that did (see [`crate::search::fewest_near`]).
/// Makespans shrink with nodes roughly but not strictly (placement and
/// stealing take other turns), so the answer is the fewest that met it
/// among those tried, each a real simulation, with the count below it
/// tried and missed or under the bound. Nothing is simulated when the
/// critical path alone is over the deadline.
pub fn fewest_nodes(
    wl: &Workload,
    base: &WhatIf,
    deadline_ms: u64,
    repeat: usize,
    mut keep: impl FnMut(usize, SimReport),
) -> Result<Search, SimError> {
    let cp = wl.critical_path_ms();
    // More nodes than tasks leave some idle whatever happens.
    let most = wl.tasks().max(1);
    let least = fewest_possible(wl, base, deadline_ms).min(most);
    let mut search = Search {
        deadline_ms,
        nodes: None,
        tried: Vec::new(),
        least,
        why_not: None,
    };
    if cp > deadline_ms {
        search.why_not =
            Some("the critical path alone is longer: no number of nodes meets it".into());
        return Ok(search);
    }
    // Where greedy list scheduling over the graph meets it (no latency,
    // no transfers): the mesh comes close behind, so the search starts
    // there rather than at the bound, which a narrow graph is far above.
    let guess = greedy_meets(wl, base, least, most, deadline_ms)?;
    let mut tried = Vec::new();
    let found = crate::search::fewest_near(least, most, guess, 1, |counts| {
        counts
            .iter()
            .map(|&n| {
                let r = row(wl, base, n, repeat, |r| keep(n, r))?;
                let met = r.makespan_p90_ms <= deadline_ms;
                tried.push(r);
                Ok(if met { Verdict::Meets } else { Verdict::Misses })
            })
            .collect::<Result<Vec<_>, SimError>>()
    })?;
    search.tried = tried;
    search.nodes = found.nodes;
    if search.nodes.is_none() {
        search.why_not = Some(format!(
            "not met with {most} nodes, one for every task: the graph and the links leave no room"
        ));
    }
    Ok(search)
}

/// The fewest nodes from `least` to `most` with which greedy list
/// scheduling of `wl` meets `deadline_ms` (`most` when none does): a
/// pass over the graph per count asked, milliseconds each.
fn greedy_meets(
    wl: &Workload,
    base: &WhatIf,
    least: usize,
    most: usize,
    deadline_ms: u64,
) -> Result<usize, SimError> {
    let found = fewest(least, most, |n| -> Result<bool, SimError> {
        let w = WhatIf {
            nodes: n,
            ..base.clone()
        };
        let cfg = w.config(wl);
        cfg.validate_cluster()?;
        let (_, greedy) = crate::cluster::workload_baselines(&cfg, wl, &w.replay)?;
        Ok(greedy <= deadline_ms)
    })?;
    Ok(found.unwrap_or(most))
}

/// Fewer nodes than this cannot finish `wl` by `deadline_ms` whatever
/// the schedule: every task holds its stage's cores for its runtime (at
/// least its recorded one less the jitter), and `n` nodes have `n` times
/// a node's cores. 1 for a scenario's cluster, whose nodes differ.
pub fn fewest_possible(wl: &Workload, base: &WhatIf, deadline_ms: u64) -> usize {
    let cpu = mesh_protocol::resources::CPU;
    let node_cores = match (
        &base.cluster,
        mesh_protocol::resources::parse_resources(&base.node),
    ) {
        (None, Ok(r)) => r.get(cpu).as_f64(),
        _ => return 1,
    };
    if node_cores <= 0.0 || deadline_ms == 0 {
        return 1;
    }
    let offsets = wl.offsets();
    let mut core_ms = 0.0;
    for (s, stage) in wl.def.stages.iter().enumerate() {
        let cores = stage.resources.get(cpu).as_f64();
        let end = offsets.get(s + 1).copied().unwrap_or(wl.tasks());
        let ms: u64 = wl.runtime_ms[offsets[s]..end].iter().sum();
        core_ms += ms as f64 * cores;
    }
    let shortest = core_ms * (1.0 - base.replay.jitter.clamp(0.0, 1.0));
    // A thousandth off: runtimes rounded to whole virtual milliseconds
    // must not rule out a count that the simulation would find meets it.
    let n = (shortest / (node_cores * deadline_ms as f64) * (1.0 - 1e-3)).ceil();
    (n as usize).max(1)
}

/// The fewest node counts from `from` to `most` for which `meets` holds:
/// counts doubled from `from` until one meets it, then halved between the
/// last that did not and the first that did (`from - 1` is taken to miss
/// unasked). None when `most` does not. `meets` is asked each count once.
pub fn fewest<E>(
    from: usize,
    most: usize,
    mut meets: impl FnMut(usize) -> Result<bool, E>,
) -> Result<Option<usize>, E> {
    let (mut lo, mut hi) = (from.max(1) - 1, from.clamp(1, most.max(1)));
    loop {
        if meets(hi)? {
            break;
        }
        if hi >= most {
            return Ok(None);
        }
        lo = hi;
        hi = (hi * 2).min(most);
    }
    // Invariant: lo missed (or was never asked), hi met.
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if meets(mid)? {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    Ok(Some(hi))
}
