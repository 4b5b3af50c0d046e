//! A recorded workflow as the simulator models it: its farm with the exact graph, each task's runtime, the files it reads from its parents, and the links they move over.
//!
//! A [`Workload`] is what a trace says, already turned into a farm (the
//! CLI builds it through `mesh import`'s own plan, so the graph is the
//! one a real submission of the trace would have). The runs and the
//! questions asked of them are in [`crate::whatif`].

use mesh_protocol::farm::FarmDef;

/// Why a workload's parts do not make one farm (built by hand, or a bug).
#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    #[error(
        "{farm} tasks in the farm, {runtimes} runtimes, {parents} parent lists, {reads} read lists"
    )]
    Parts {
        farm: usize,
        runtimes: usize,
        parents: usize,
        reads: usize,
    },
    #[error("no tasks")]
    NoTasks,
    #[error("task {task}: parent {parent} does not come before it (tasks are numbered in dependency order)")]
    ParentAfter { task: usize, parent: u32 },
    #[error("task {task} reads from {from}, not a parent")]
    NotAParent { task: usize, from: u32 },
}

/// One file a task reads that a parent made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Read {
    /// The parent that made it (a task number, see [`Workload`]).
    pub from: u32,
    /// The file, numbered across the workflow: a node brings each once.
    pub file: u32,
    pub bytes: u64,
}

/// A recorded workflow as a farm to simulate. Tasks are numbered stage by
/// stage in the farm's order (task `i` of stage `s` is `offset(s) + i`),
/// which is an order where every task comes after its parents.
#[derive(Clone, Debug)]
pub struct Workload {
    /// The farm, with its dependency graph: what the coordinator schedules.
    pub def: FarmDef,
    /// Per task: its runtime in virtual ms (the recorded one, scaled).
    pub runtime_ms: Vec<u64>,
    /// Per task: its parents, as task numbers.
    pub parents: Vec<Vec<u32>>,
    /// Per task: the files it reads that its parents made.
    pub reads: Vec<Vec<Read>>,
    /// Bytes of the files no task makes (the farm's inputs): every node
    /// but the submitter brings them all before its first task, as a real
    /// node does (`Action::FetchInputs`).
    pub input_bytes: u64,
}

impl Workload {
    pub fn tasks(&self) -> usize {
        self.runtime_ms.len()
    }

    /// First task number of each stage.
    pub fn offsets(&self) -> Vec<usize> {
        let mut at = 0;
        self.def
            .stages
            .iter()
            .map(|s| {
                let o = at;
                at += s.len() as usize;
                o
            })
            .collect()
    }

    /// Every task's runtime added up: the makespan on one core.
    pub fn work_ms(&self) -> u64 {
        self.runtime_ms.iter().sum()
    }

    /// The longest chain of runtimes through the graph (no transfers): no
    /// number of nodes finishes sooner.
    pub fn critical_path_ms(&self) -> u64 {
        chain(&self.runtime_ms, &self.parents)
    }

    /// Checks that the parts agree (a workload built by hand, or a bug).
    pub fn check(&self) -> Result<(), WorkloadError> {
        let n = self.tasks();
        let farm: usize = self.def.stages.iter().map(|s| s.len() as usize).sum();
        if farm != n || self.parents.len() != n || self.reads.len() != n {
            return Err(WorkloadError::Parts {
                farm,
                runtimes: n,
                parents: self.parents.len(),
                reads: self.reads.len(),
            });
        }
        if n == 0 {
            return Err(WorkloadError::NoTasks);
        }
        for (g, ps) in self.parents.iter().enumerate() {
            if let Some(&parent) = ps.iter().find(|&&p| p as usize >= g) {
                return Err(WorkloadError::ParentAfter { task: g, parent });
            }
            if let Some(r) = self.reads[g].iter().find(|r| !ps.contains(&r.from)) {
                let from = r.from;
                return Err(WorkloadError::NotAParent { task: g, from });
            }
        }
        Ok(())
    }
}

/// The longest path through a graph given in dependency order.
pub(crate) fn chain(durations: &[u64], parents: &[Vec<u32>]) -> u64 {
    let mut finish = vec![0u64; durations.len()];
    for g in 0..durations.len() {
        let start = parents[g]
            .iter()
            .map(|&p| finish[p as usize])
            .max()
            .unwrap_or(0);
        finish[g] = start + durations[g];
    }
    finish.into_iter().max().unwrap_or(0)
}

/// The links between nodes, as the simplest honest model: a file from
/// another node takes a round trip to ask for, then its bytes at the
/// link's bandwidth; links never share bandwidth with each other.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Links {
    /// Bytes per second; `None`: transfers take no time at all.
    pub bytes_per_s: Option<f64>,
    /// One way, in ms; also every message's latency in the run, unless a
    /// scenario says its own (`WhatIf::cluster`).
    pub latency_ms: u64,
}

impl Links {
    /// How long bringing `bytes` from `sources` other nodes takes, one
    /// after another as a node's staging does.
    pub fn transfer_ms(&self, sources: usize, bytes: u64) -> u64 {
        let Some(bps) = self.bytes_per_s else {
            return 0;
        };
        if sources == 0 && bytes == 0 {
            return 0;
        }
        sources as u64 * 2 * self.latency_ms + (bytes as f64 * 1000.0 / bps).ceil() as u64
    }
}

/// How a workload is run, besides the cluster: the links, and how far
/// each runtime may stray from the recorded one.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Replay {
    pub links: Links,
    /// Each runtime is the recorded one times a factor drawn uniformly
    /// from `[1 - jitter, 1 + jitter]`, per task, from the seed.
    pub jitter: f64,
}
