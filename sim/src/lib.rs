//! Deterministic discrete-event simulation of mesh: real peers and engines on a virtual clock.
//!
//! [`run`] drives many real [`mesh_protocol::mesh::Peer`]s through their
//! real inputs and outputs on one virtual clock, with message latency and
//! loss, partitions, crashes and restarts from the in-memory store, late
//! joins and leaves, and heterogeneous resource vectors (see
//! [`cluster`]). A run is described by a [`SimConfig`], usually loaded
//! from a TOML scenario with [`load_scenario`] (format in [`scenario`]),
//! and yields a [`SimReport`] (serde; [`SimReport::to_svg`] draws it).
//! Same seed, same report: every random draw follows from the seed.
//!
//! [`run_one_node`] is the older single-engine loop, kept for the
//! engine's own timing tests.

pub mod cluster;
pub mod dist;
mod queue;
pub mod report;
pub mod scenario;
pub mod search;
pub mod whatif;
pub mod workflow;

/// Without a time limit (`max_time_ms`), how long a run may pass with no
/// task started or ended, after its last task's end and its last scripted
/// event, before it is stuck: ten virtual minutes.
pub const QUIET_MS: u64 = 600_000;

pub use cluster::{baselines, run, run_bounded, run_within, shapes_of, Within};
pub use dist::{parse_durations, Dist, DistError};
pub use report::{SimReport, Timeline, Traffic};
pub use scenario::{load_scenario, parse_scenario, ConfigError, NodeGroup, SimConfig};
pub use whatif::{run_workload, WhatIf};
pub use workflow::{Links, Replay, Workload, WorkloadError};

/// Why a simulated run did not produce a report.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// The scenario is malformed; nothing ran.
    #[error("bad scenario: {0}")]
    Config(#[from] ConfigError),
    /// A crashed node's store did not read back on its restart.
    #[error("a restarted node cannot read its store: {0}")]
    Restart(#[from] StoreError),
    /// An invariant broke; the seed replays the run up to it.
    #[error("invariant violated at {at_ms} ms (replay with seed {seed}): {message}")]
    Invariant {
        seed: u64,
        at_ms: u64,
        message: String,
    },
    /// Work was left when the virtual time limit (or the last event) came.
    #[error(
        "the run did not finish: {message}; stopped at {} of virtual time (replay with seed {seed})",
        report::duration(*at_ms)
    )]
    Stuck {
        seed: u64,
        at_ms: u64,
        message: String,
    },
}

impl SimError {
    /// The seed that replays the failure, when it is a failure of a run.
    pub fn seed(&self) -> Option<u64> {
        match self {
            SimError::Config(_) | SimError::Restart(_) => None,
            SimError::Invariant { seed, .. } | SimError::Stuck { seed, .. } => Some(*seed),
        }
    }
}

/// Why [`run_one_node`] stopped.
#[derive(Debug, thiserror::Error)]
pub enum OneNodeError {
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The engine's audit: what broke.
    #[error("{0}")]
    Invariant(String),
    /// The engine's counts when the events ran out with work left.
    #[error("the simulation stopped with work left: {0}")]
    Stuck(String),
}

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;

use mesh_protocol::engine::{Action, AddOptions, Engine, Millis, Outcome, Persist, TaskResult};
use mesh_protocol::farm::FarmDef;
use mesh_protocol::{Resources, TaskRef};
use mesh_store::{FarmKey, MemStore, Store, StoreError, Write};

/// What a simulated run did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    /// Virtual time when the last task ended.
    pub makespan_ms: Millis,
    pub tasks_done: u64,
    pub tasks_failed: u64,
    /// Engine steps taken (each input and its actions).
    pub events: u64,
}

/// Runs `def` on one node with `resources`; task `t` takes `duration(t)` ms
/// and exits with `exit(t)`. Invariants are checked after every event.
pub fn run_one_node(
    def: FarmDef,
    resources: Resources,
    duration: impl Fn(TaskRef) -> Millis,
    exit: impl Fn(TaskRef, u32) -> i32,
) -> Result<(Report, MemStore), OneNodeError> {
    let mut engine = Engine::new(resources);
    let mut store = MemStore::new();
    let farm_key = FarmKey(1);
    let slot = engine.add_farm(0, Arc::new(def), Vec::new(), &AddOptions::default());
    // (end time, task, attempt): completions waiting to happen.
    let mut pending: BinaryHeap<Reverse<(Millis, TaskRef, u32)>> = BinaryHeap::new();
    let mut now = 0;
    let mut events = 0;
    loop {
        let mut batch = Vec::new();
        while let Some(a) = engine.poll_action() {
            match a {
                Action::Persist(Persist::Task { task, record, .. }) => batch.push(Write::Task {
                    farm: farm_key,
                    task,
                    record,
                }),
                Action::Start { task, attempt, .. } => {
                    pending.push(Reverse((now + duration(task), task, attempt)));
                }
                Action::Persist(Persist::Stage { .. }) | Action::Kill { .. } | Action::Emit(_) => {}
            }
        }
        store.write(batch)?;
        store.flush()?;
        engine.audit().map_err(OneNodeError::Invariant)?;
        let next_timer = engine.poll_timeout();
        let next_end = pending.peek().map(|Reverse((at, ..))| *at);
        let completion_first = match (next_end, next_timer) {
            (None, None) => break,
            (Some(end), Some(timer)) => end <= timer,
            (Some(_), None) => true,
            (None, Some(_)) => false,
        };
        if completion_first {
            let Reverse((at, task, attempt)) = pending.pop().expect("peeked");
            now = at;
            let outcome = Outcome {
                result: TaskResult::Exited(exit(task, attempt)),
                key: None,
                duration_ms: duration(task),
                ended_ms: 0,
                grew: None,
                logs: 0,
                stderr_line: None,
                usage: None,
            };
            engine.task_finished(now, slot, task, attempt, outcome);
        } else if let Some(timer) = next_timer {
            now = now.max(timer);
            engine.handle_timeout(now);
        }
        events += 1;
    }
    let c = engine.progress(slot);
    if !c.finished() {
        return Err(OneNodeError::Stuck(format!("{c:?}")));
    }
    Ok((
        Report {
            makespan_ms: now,
            tasks_done: c.done,
            tasks_failed: c.failed,
            events,
        },
        store,
    ))
}

/// Peak resident memory (VmHWM) of process `pid` (this one when none) so
/// far, in bytes, where Linux tells it: what a simulation of a size
/// needs, and what the benchmarks read of the processes they start.
pub fn peak_rss_bytes(pid: Option<u32>) -> Option<u64> {
    let path = match pid {
        Some(pid) => format!("/proc/{pid}/status"),
        None => "/proc/self/status".to_string(),
    };
    let status = std::fs::read_to_string(path).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;
    use mesh_protocol::farm::{CommandTemplate, StageDef, Sweep, Template};
    use mesh_protocol::resources::parse_resources;

    fn farm(n: u64, retries: u32) -> FarmDef {
        FarmDef {
            graph: Default::default(),
            name: "sim".into(),
            root: "/".into(),
            out: "/out".into(),
            stages: vec![std::sync::Arc::new(StageDef {
                retries,
                ..StageDef::new(
                    "a",
                    CommandTemplate::Argv(vec![Template::literal("true")]),
                    Sweep::range("i", n),
                )
            })]
            .into(),
        }
    }

    #[test]
    fn equal_tasks_on_four_cores_take_a_quarter_of_the_work() {
        let (r, store) = run_one_node(
            farm(100, 0),
            parse_resources("cpu=4").unwrap(),
            |_| 10,
            |_, _| 0,
        )
        .unwrap();
        assert_eq!(r.tasks_done, 100);
        assert_eq!(r.makespan_ms, 250, "100 tasks of 10 ms on 4 cores");
        assert_eq!(
            store.tasks(FarmKey(1)).unwrap().len(),
            100,
            "every task has a durable record"
        );
    }

    #[test]
    fn failures_retry_on_the_virtual_clock() {
        // Every task fails its first attempt and succeeds on the second.
        let (r, _) = run_one_node(
            farm(10, 1),
            parse_resources("cpu=2").unwrap(),
            |_| 5,
            |_, attempt| if attempt == 1 { 1 } else { 0 },
        )
        .unwrap();
        assert_eq!((r.tasks_done, r.tasks_failed), (10, 0));
        assert_eq!(r.makespan_ms, 50, "20 attempts of 5 ms on 2 cores");
    }
}
