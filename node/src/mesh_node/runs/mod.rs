//! The node's runs room: the attempts of tasks on this node (started, waiting for their dependencies or their workdir, live), files to and from other nodes, and the record of each run, behind [`Runs`]' methods.
//!
//! The room owns its state; the loop reaches it only through those
//! methods. It reads the farms this node holds through [`Farms`] (the
//! peer, read-only) and says what the peer must hear as [`RunsOut`]
//! values, taken with [`Runs::poll`]: the room never touches the `Peer`.
//! Its parts: `task.rs` one attempt, `staging.rs` inputs and outputs by
//! hash, `deps.rs` a task's dependencies put in place, `transfer.rs`
//! files between nodes.

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;

use mesh_protocol::engine::{Grant, KillReason, Outcome, TaskResult};
use mesh_protocol::farm::TaskRef;
use mesh_protocol::mesh::{Assigned, FarmId, FarmSpec, NodeId, OutputFile, Replica};
use mesh_protocol::observe::{LatencyData, Observation, RunningUse};
use nix::sys::signal::Signal;

mod deps;
mod staging;
mod task;
mod transfer;

pub(super) use staging::{hash_inputs, input_hash, kept_bytes, kept_farms, make_spec, SubmitError};
pub(super) use transfer::{accept_data, shared_fs, FetchError, Transfers};

use super::LoopHandle;
use crate::executor::{self, Live};
use crate::observe::Recorder;

/// What the runs room reads of the farms this node holds.
pub(super) trait Farms {
    fn spec(&self, farm: FarmId) -> Option<&Arc<FarmSpec>>;
    fn replica(&self, farm: FarmId) -> Option<&Replica>;
    /// Every farm this node keeps a copy of.
    fn replicas(&self) -> Box<dyn Iterator<Item = &Replica> + '_>;
    fn coordinator(&self) -> Option<NodeId>;
    /// Every member but this node.
    fn member_ids(&self) -> Vec<NodeId>;
}

/// What the runs room wants the peer to hear.
pub(super) enum RunsOut {
    /// An attempt that ended without a process: its farm's definition
    /// was not here, or it was killed while it waited.
    Ended(Assigned, Outcome),
}

/// What the runs room is made of when the node opens.
pub(super) struct RunsParts {
    pub(super) state: PathBuf,
    pub(super) me: NodeId,
    pub(super) me_label: String,
    pub(super) handle: LoopHandle,
    pub(super) transfers: Arc<Transfers>,
    pub(super) gpu_ids: Arc<[String]>,
}

/// The attempts of tasks on this node: running, and waiting for what
/// they depend on; the files they move and the record of their runs.
pub(super) struct Runs {
    state: PathBuf,
    me: NodeId,
    /// This node's peer id as text, said with every task it runs.
    me_label: String,
    handle: LoopHandle,
    live: HashMap<(FarmId, TaskRef), (u32, Option<Live>, bool)>,
    /// Tasks given to this node, the home of their farm, whose
    /// dependencies' outputs are not all here yet: each with its grant and
    /// how many of its dependencies were found here so far (see `task.rs`).
    waiting_deps: Vec<(Assigned, Grant, u64)>,
    run_seq: HashMap<(FarmId, TaskRef), (u64, Option<u32>)>,
    /// The workdirs in the farm folders of farms submitted here that tasks
    /// run in now, with the farm and how many; and each such task's.
    /// Two farms of one file (submitted at once, into two `--out`s) share
    /// their workdirs: a task of one waits while one of the other runs in
    /// the same folder, or each could collect the other's files.
    workdirs: HashMap<PathBuf, (FarmId, u32)>,
    workdir_of: HashMap<(FarmId, TaskRef, u32), PathBuf>,
    /// Bare program names and where PATH finds them.
    programs: HashMap<String, Option<String>>,
    /// The node's GPUs as tasks name them, by their place in its pool.
    gpu_ids: Arc<[String]>,
    /// Files to and from other nodes.
    transfers: Arc<Transfers>,
    /// Runs for the task stream, counters, and each live run's record.
    recorder: Recorder,
    out: VecDeque<RunsOut>,
}

impl Runs {
    pub(super) fn new(p: RunsParts) -> Runs {
        Runs {
            state: p.state,
            me: p.me,
            me_label: p.me_label,
            handle: p.handle,
            live: HashMap::new(),
            waiting_deps: Vec::new(),
            run_seq: HashMap::new(),
            workdirs: HashMap::new(),
            workdir_of: HashMap::new(),
            programs: HashMap::new(),
            gpu_ids: p.gpu_ids,
            transfers: p.transfers,
            recorder: Recorder::default(),
            out: VecDeque::new(),
        }
    }

    /// The next thing the room wants the peer to hear, oldest first.
    pub(super) fn poll(&mut self) -> Option<RunsOut> {
        self.out.pop_front()
    }

    /// Files to and from other nodes, for what serves or counts them.
    pub(super) fn transfers(&self) -> &Arc<Transfers> {
        &self.transfers
    }

    /// The record of this node's runs.
    pub(super) fn record(&self) -> &Recorder {
        &self.recorder
    }

    /// What this node's runs and transfers add to what it measures of
    /// itself, with its runs that changed after `since`.
    pub(super) fn observation(&self, since: u64, latency: LatencyData) -> Observation {
        let mut o = self
            .recorder
            .observation(since, latency, crate::state::unix_ms());
        let mut counters = self.recorder.counters;
        self.transfers.stats.count(&mut counters);
        o.counters = counters;
        o.running = self
            .live
            .iter()
            .filter_map(|(&(farm, task), (attempt, live, _))| {
                let (rss, peak, cpu_ms) = live.as_ref()?.looked.now()?;
                Some(RunningUse {
                    farm,
                    task,
                    attempt: *attempt,
                    rss,
                    peak,
                    cpu_ms,
                })
            })
            .collect();
        o
    }

    /// Messages from other nodes' engines and requests, counted.
    pub(super) fn count_received(&mut self, n: u64) {
        self.recorder.counters.messages_received += n;
    }

    /// Whether no attempt runs here.
    pub(super) fn idle(&self) -> bool {
        self.live.is_empty()
    }

    /// Sends `sig` to every attempt running here.
    pub(super) fn signal_all(&self, sig: Signal) {
        for (_, live, _) in self.live.values() {
            if let Some(l) = live {
                l.signal(sig);
            }
        }
    }

    /// Stops an attempt: one still waiting ends at once, a running one is
    /// signalled, one not launched yet is killed as it launches.
    pub(super) fn kill(&mut self, task: Assigned, reason: KillReason) {
        if self.unwait(task, reason) {
            return;
        }
        let sig = executor::kill_signal(reason);
        if let Some((attempt, live, kill)) = self.live.get_mut(&(task.farm, task.task)) {
            if *attempt == task.attempt {
                match live {
                    Some(l) => l.signal(sig),
                    None => *kill = true,
                }
            }
        }
    }

    /// An attempt's process started: it can be signalled (at once, when
    /// it was killed before it could be).
    pub(super) fn launched(&mut self, task: Assigned, live: Live) {
        if let Some((attempt, slot, kill)) = self.live.get_mut(&(task.farm, task.task)) {
            if *attempt == task.attempt {
                if *kill {
                    live.signal(Signal::SIGKILL);
                }
                *slot = Some(live);
            }
        }
    }

    /// An attempt ended: it is no longer live, its workdir is free, its
    /// run's record closed, and its outputs served on the home.
    pub(super) fn ended(
        &mut self,
        task: &Assigned,
        outcome: &Outcome,
        outputs: &[OutputFile],
        farms: &dyn Farms,
    ) {
        if self
            .live
            .get(&(task.farm, task.task))
            .is_some_and(|(a, ..)| *a == task.attempt)
        {
            self.live.remove(&(task.farm, task.task));
        }
        // Whichever attempt it was: each holds its workdir.
        self.workdir_freed(task);
        if let Some((seq, slot)) = self.run_seq.remove(&(task.farm, task.task)) {
            let failed = !farms.spec(task.farm).is_some_and(|s| {
                let codes = &s.def.stages[task.task.stage as usize].success_codes;
                match outcome.result {
                    TaskResult::Exited(c) => codes.contains(&c),
                    TaskResult::Cached => true,
                    _ => false,
                }
            });
            self.recorder
                .ended(seq, slot, failed, crate::state::unix_ms());
        }
        self.serve_outputs(task.farm, task.task, outputs, farms);
    }

    /// An attempt that ends without a process, with this result.
    pub(super) fn end_unrun(&mut self, task: Assigned, result: TaskResult) {
        let outcome = Outcome::unrun(result, None, crate::state::unix_ms());
        self.out.push_back(RunsOut::Ended(task, outcome));
    }
}
