//! Runs one farm on this machine: the tokio loop that drives the engine with real processes and the sled store.
//!
//! Each turn of the loop drains the engine's actions, writes every `Persist`
//! as one batch and flushes once (group commit), and only then starts, kills
//! or reports anything. Completions that arrive together are fed to the
//! engine together, so a busy farm pays one flush for many tasks.

use std::collections::HashMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mesh_protocol::engine::{
    Action, AddOptions, Counts, Engine, Event, FarmSlot, Outcome, Persist, RecordState, Stop,
    TaskRecord, TaskResult, Verdict,
};
use mesh_protocol::farm::{deps_digest, has_deps, key_with_deps, stage_digest, FarmDef};
use mesh_protocol::mesh::FarmId;
use mesh_protocol::{Resources, TaskRef};
use mesh_store::{FarmKey, JournalEntry, JournalEvent, SledStore, Store, StoreError, Write};
use nix::sys::signal::Signal;
use tokio::sync::mpsc;

use crate::dash;
use crate::eta;
use crate::executor::{self, Finished, Launch, Live};
use crate::observe::Recorder;
use crate::results::{self, Results};
use crate::state::{
    farm_identity, farm_key, hostname, unix_ms, FailedTask, FarmStatus, RunState, StageStatus,
    StateDir, StateError, SNAPSHOT_FAILED_MAX,
};
use crate::task_view::TaskView;
use crate::task_words::{describe_failure, describe_stop, parse_task};
use crate::view::{FarmView, MeshStatus, NodeView, Observed, ResourceUse, ResourceView};
use crate::{at_ms, grace_end, io_err, runtime, sleep_until_opt, stop_signals, IoError};
use mesh_protocol::observe::{Latencies, Latency};
use std::sync::Mutex;

mod start;

/// How often the observer hears about progress.
const PROGRESS_EVERY_MS: u64 = 100;
/// How often the status snapshot on disk is refreshed.
const SNAPSHOT_EVERY_MS: u64 = 1000;
/// Engine actions handled per turn of the loop before signals and messages get a look.
const STEP_ACTIONS_MAX: usize = 4096;

/// Ended attempts waiting for the loop. When it is full an attempt's
/// report waits for room (a lost report would hold its slot forever); a
/// step's worth of ends keeps a busy loop fed without holding more.
const FINISHED_MAX: usize = STEP_ACTIONS_MAX;

/// The longest a failure waits unsaid while its stage may still stop (its
/// failures so far all alike): a stop says them in one line instead, but
/// a slow stage's first failure should not wait for the next.
const HOLD_SAY_MS: u64 = 10_000;

/// What to run.
pub enum RunStart {
    /// A farm freshly loaded from `file` (canonical path): a new run.
    New { def: Box<FarmDef>, file: PathBuf },
    /// Continue the latest run of the farm with this id.
    Resume { id: String },
}

pub struct RunOptions {
    pub state: StateDir,
    /// What this node offers (cpu and mem detected, `--resources` applied).
    pub resources: Resources,
    /// Its GPUs, as tasks name them, one per device of `resources`' `gpu`.
    pub gpus: Vec<crate::gpus::Gpu>,
    /// On resume, run failed tasks again with fresh retries.
    pub retry_failed: bool,
    /// `--rerun [STAGE...]`: run these stages (all when empty) and every
    /// stage downstream of them even where their content keys succeeded before.
    pub rerun: Option<Vec<String>>,
    /// Serve the dashboard (`mesh run --http`).
    pub http: Option<dash::Http>,
    /// Told the dashboard's address once it is served.
    pub on_http: Option<fn(&str)>,
}

/// What `mesh run` shows its dashboard: kept by the loop as it goes.
struct Shared {
    status: FarmStatus,
    node: NodeView,
    recorder: Recorder,
    latency: Latencies,
    def: Arc<FarmDef>,
    logs_dir: PathBuf,
}

/// The dashboard's view of `mesh run`: one node, one farm.
struct RunSource(Arc<Mutex<Shared>>);

impl dash::Source for RunSource {
    fn observe(
        &self,
        since: HashMap<String, u64>,
    ) -> dash::BoxFuture<Result<Observed, dash::SourceError>> {
        let sh = self.0.lock().expect("not poisoned");
        let since = since.get(&sh.node.id).copied().unwrap_or(0);
        let status = MeshStatus {
            nodes: vec![sh.node.clone()],
            ..MeshStatus::default()
        };
        let o = sh
            .recorder
            .observation(since, sh.latency.export(), unix_ms());
        let observed = Observed::new(status, vec![(sh.node.id.clone(), o)]);
        Box::pin(std::future::ready(Ok(observed)))
    }

    fn farms(&self) -> dash::BoxFuture<Result<Vec<FarmView>, dash::SourceError>> {
        let sh = self.0.lock().expect("not poisoned");
        let view = FarmView::from_status(&sh.status);
        Box::pin(std::future::ready(Ok(vec![view])))
    }

    fn logs(
        &self,
        _farm: String,
        task: String,
        attempt: Option<u32>,
    ) -> dash::BoxFuture<Result<String, dash::SourceError>> {
        let (def, logs_dir) = {
            let sh = self.0.lock().expect("not poisoned");
            (sh.def.clone(), sh.logs_dir.clone())
        };
        Box::pin(async move {
            let t = parse_task(&def, &task)?;
            let stage_dir = logs_dir.join(&def.stage(t).name);
            let attempt = attempt
                .or_else(|| executor::latest_attempt(&stage_dir, t.index))
                .ok_or_else(|| dash::SourceError::NoLogs(task.clone()))?;
            let read = |stream| {
                fs::read(executor::log_path(&logs_dir, &def, t, attempt, stream))
                    .unwrap_or_default()
            };
            Ok(dash::logs_text(&read("out"), &read("err")))
        })
    }
}

/// Hears what happens during a run; the CLI draws it.
pub trait Observer {
    fn started(&mut self, _status: &FarmStatus) {}
    fn progress(&mut self, _status: &FarmStatus) {}
    fn task_failed(&mut self, _task: &str, _attempt: u32, _reason: &str, _retrying: bool) {}
    fn unplaceable(&mut self, _stage: &str, _shortfall: &str) {}
    /// A stage stopped (`max_fails`): `line` says why, once for all its failures.
    fn stage_stopped(&mut self, _line: &str) {}
    /// A stopped stage goes on (a task of it succeeded after all).
    fn stage_resumed(&mut self, _line: &str) {}
    /// Outputs of tasks no longer in the farm were moved out of its folder.
    fn set_aside(&mut self, _line: &str) {}
    fn interrupting(&mut self) {}
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("farm {id} is already running in another mesh process{holder}")]
    AlreadyRunning { id: String, holder: String },
    #[error("farm {0} has no stored definition; run it with `mesh run FILE` instead")]
    NoDefinition(String),
    #[error(transparent)]
    State(#[from] StateError),
    #[error("state store: {0}")]
    Store(#[from] StoreError),
    #[error(transparent)]
    Io(#[from] IoError),
}

const META_RUN: &str = "run";
const META_FILE: &str = "file";
const META_RESOURCES: &str = "resources";

/// Where the stop of a stage (`max_fails`) is kept, by its position: a
/// resume runs the stage whole, and `mesh status` shows it stopped.
fn meta_stop(stage: usize) -> String {
    format!("stop.{stage}")
}

/// Runs (or resumes) a farm to the end, or until Ctrl-C / SIGTERM.
pub fn run_farm(
    start: RunStart,
    opts: &RunOptions,
    obs: &mut dyn Observer,
) -> Result<FarmStatus, RunError> {
    runtime()?.block_on(async {
        // Before anything slow (opening the store, clearing a big farm's old run).
        let (sigint, sigterm) = stop_signals()?;
        drive(start, opts, obs, sigint, sigterm).await
    })
}

/// The loop of `mesh run`, as the node's: [`Driver::open`] the farm's
/// store and records the run's start, then [`Driver::run`] until the farm
/// ends or is stopped, then [`Driver::close`].
async fn drive(
    start: RunStart,
    opts: &RunOptions,
    obs: &mut dyn Observer,
    sigint: tokio::signal::unix::Signal,
    sigterm: tokio::signal::unix::Signal,
) -> Result<FarmStatus, RunError> {
    let (mut d, mut engine) = Driver::open(start, opts, obs).await?;
    let interrupted = d.run(&mut engine, opts, obs, sigint, sigterm).await?;
    d.close(&engine, opts, obs, interrupted)
}

impl Driver {
    /// The loop: a step of the engine, then whichever input is ready,
    /// until the farm is over or stopped and nothing runs. Returns when
    /// it was interrupted, if it was.
    async fn run(
        &mut self,
        engine: &mut Engine,
        opts: &RunOptions,
        obs: &mut dyn Observer,
        mut sigint: tokio::signal::unix::Signal,
        mut sigterm: tokio::signal::unix::Signal,
    ) -> Result<Option<Instant>, RunError> {
        let (clock, d) = (self.clock, self);
        let (tx, mut rx) = mpsc::channel::<Finished>(FINISHED_MAX);
        let mut progress = tokio::time::interval(Duration::from_millis(PROGRESS_EVERY_MS));
        progress.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let mut last_snapshot = Instant::now();
        let mut finished = false;
        let mut interrupted_at: Option<Instant> = None;
        let mut hard_killed = false;

        loop {
            let Stepped {
                finished: done,
                more,
            } = d.step(engine, &tx, obs)?;
            finished |= done;
            if (finished || interrupted_at.is_some()) && engine.idle() {
                break;
            }
            let timer = engine.poll_timeout().map(|at| at_ms(clock, at));
            let grace = grace_end(interrupted_at, hard_killed);
            tokio::select! {
                biased;
                Some(first) = rx.recv() => {
                    let now = ms_since(clock);
                    let mut next = Some(first);
                    // Everything that already arrived goes to the engine before one flush.
                    while let Some(f) = next {
                        d.finish(engine, now, f);
                        next = rx.try_recv().ok();
                    }
                }
                _ = sigint.recv() => d.interrupt(engine, &mut interrupted_at, obs),
                _ = sigterm.recv() => d.interrupt(engine, &mut interrupted_at, obs),
                _ = sleep_until_opt(timer) => engine.handle_timeout(ms_since(clock)),
                _ = sleep_until_opt(grace) => {
                    hard_killed = true;
                    d.kill_all_now();
                }
                _ = progress.tick() => {
                    d.say_held_long(engine, obs);
                    // What progress shows as done must also survive a machine
                    // crash: one fdatasync per refresh, not per task.
                    d.store.sync()?;
                    d.refresh(engine, clock);
                    d.estimate_end(engine);
                    obs.progress(&d.status);
                    if last_snapshot.elapsed() >= Duration::from_millis(SNAPSHOT_EVERY_MS) {
                        last_snapshot = Instant::now();
                        let _ = opts.state.write_status(&d.status);
                    }
                }
                // Lowest priority: with actions still queued, go round again at once.
                _ = std::future::ready(()), if more => {}
            }
        }
        Ok(interrupted_at)
    }

    /// After the loop: the run's end said, journaled and made durable, and
    /// what was kept aside for it and not taken again removed.
    fn close(
        mut self,
        engine: &Engine,
        opts: &RunOptions,
        obs: &mut dyn Observer,
        interrupted_at: Option<Instant>,
    ) -> Result<FarmStatus, RunError> {
        let (clock, key, run) = (self.clock, self.key, self.status.run);
        let d = &mut self;
        d.say_unsaid(engine, obs);
        d.refresh(engine, clock);
        d.status.eta = None;
        let counts = d.status.counts.clone();
        d.status.state = if interrupted_at.is_some() && !counts.finished() {
            RunState::Interrupted
        } else if counts.done == counts.total {
            RunState::Done
        } else if counts.stopped > 0 {
            RunState::Stopped
        } else {
            RunState::Failed
        };
        let reason = match d.status.state {
            RunState::Interrupted => "interrupted",
            RunState::Done => "done",
            RunState::Stopped => "stopped",
            _ => "failed",
        };
        d.store.write(vec![Write::Journal(JournalEntry {
            at_ms: unix_ms(),
            farm: key,
            event: JournalEvent::RunStopped {
                run,
                reason: reason.into(),
            },
        })])?;
        d.store.sync()?;
        if d.status.state != RunState::Interrupted {
            // What was kept aside for this run and not taken again is an
            // earlier result of no task of the farm any more.
            if let Err(e) = results::remove_folder(&d.stash_dir) {
                tracing::info!(dir = %d.stash_dir.display(), "results kept aside stay: {e}");
            }
        }
        // Nothing runs now. A view is removed after its task's report (off
        // the loop, so its dependents need not wait): the last task's may
        // be there still as the run ends, its links keeping a second name
        // of each output it read.
        if let Err(e) = results::remove_folder(&d.views_dir) {
            tracing::info!(dir = %d.views_dir.display(), "the tasks' views of the output stay: {e}");
        }
        opts.state
            .write_status(&d.status)
            .map_err(io_err("cannot write the status snapshot"))?;
        obs.progress(&d.status);
        Ok(self.status)
    }
}

fn ms_since(clock: Instant) -> u64 {
    clock.elapsed().as_millis() as u64
}

struct Driver {
    id: String,
    key: FarmKey,
    def: Arc<FarmDef>,
    slot: FarmSlot,
    store: SledStore,
    logs_dir: PathBuf,
    root: PathBuf,
    out: PathBuf,
    /// Where each attempt that can see `{out}` has its own view of it.
    views_dir: PathBuf,
    gpu_ids: Arc<[String]>,
    /// blake3 of each input file, read once per run.
    input_hashes: HashMap<String, [u8; 32]>,
    /// The digest of each `after` stage's keys (see `farm::deps_digest`),
    /// made once its dependents start: the stage is complete by then.
    stage_digests: HashMap<u32, [u8; 32]>,
    /// Stages whose earlier results are not reused (`--rerun`).
    rerun: Vec<bool>,
    /// Results written down since the last step, persisted with its batch.
    pending: Vec<Write>,
    /// Keys of the records in the batch being made: a dependent prepared in
    /// the same step as its dependency's end reads the key from here, as the
    /// store has only the record before.
    unwritten: HashMap<TaskRef, [u8; 32]>,
    /// The same for the entries (results, holders) the batch writes.
    unwritten_meta: HashMap<String, Vec<u8>>,
    /// Where results kept aside for this run go (see `keep_aside`), and
    /// how many went.
    stash_dir: PathBuf,
    stashed: u64,
    /// Bare program names and where PATH finds them (None: not found; exec reports it).
    programs: HashMap<String, Option<String>>,
    live: HashMap<TaskRef, (u32, Live, Instant)>,
    /// Per stage, how many of its tasks succeeded after running, and the
    /// runtimes (ms) of some of them, for the estimate of the end.
    runtimes: Vec<(u64, Vec<f64>)>,
    /// The end is estimated again not before this.
    estimate_after: Option<Instant>,
    /// Per stage that may still stop: its failures not said yet, and when
    /// the first was held (see `HOLD_SAY_MS`).
    unsaid: HashMap<u32, (Instant, Vec<Unsaid>)>,
    /// What the observer and the snapshot see; `failed` is kept here as failures happen.
    status: FarmStatus,
    /// What the dashboard sees, when one is served; and each live run's
    /// record there and start.
    shared: Option<Arc<Mutex<Shared>>>,
    runs: HashMap<TaskRef, (u64, Option<u32>, Instant)>,
    clock: Instant,
}

/// What a step of the driver left: whether the farm finished, and whether
/// more actions wait (the loop goes round again at once).
struct Stepped {
    finished: bool,
    more: bool,
}

impl Driver {
    /// Drains up to `STEP_ACTIONS_MAX` engine actions: persists as one durable
    /// batch, then acts.
    ///
    /// A start whose content key already succeeded is answered here, with no
    /// process and no flush of its own, so a re-run of a finished million-task
    /// farm costs a batch per few thousand tasks. The bound keeps signals and
    /// progress flowing while that happens.
    fn step(
        &mut self,
        engine: &mut Engine,
        tx: &mpsc::Sender<Finished>,
        obs: &mut dyn Observer,
    ) -> Result<Stepped, RunError> {
        let mut finished = false;
        let mut batch = Vec::new();
        let mut acts = Vec::new();
        let mut launches = Vec::new();
        for _ in 0..STEP_ACTIONS_MAX {
            let Some(a) = engine.poll_action() else { break };
            match a {
                Action::Persist(p) => self.persist(p, &mut batch),
                Action::Start {
                    task,
                    attempt,
                    grant,
                    ..
                } => {
                    if let Some(l) = self.prepare(engine, task, attempt, grant)? {
                        launches.push(l);
                    }
                }
                other => acts.push(other),
            }
        }
        // Results written down since the last step and by this one's
        // starts (reuses, results kept aside): all in this batch, as the
        // entries it leaves unwritten are read from `unwritten_meta` only
        // until it is written.
        batch.append(&mut self.pending);
        if !batch.is_empty() {
            self.store.write(batch)?;
            self.unwritten.clear();
            self.unwritten_meta.clear();
            self.store.flush()?;
        }
        // Persisted; now act. Starts first: kills and emits never concern a task started in this step.
        for l in launches {
            let task = l.task;
            let attempt = l.attempt;
            tracing::debug!(farm = %self.id, task = task.index, stage = task.stage, attempt, "start");
            if let Some(sh) = &self.shared {
                let mut sh = sh.lock().expect("not poisoned");
                // Numbered as a mesh farm whose display id this is.
                let farm = FarmId(crate::view::display_key(&self.id) << 32);
                let seq = sh.recorder.started(farm, task, attempt, unix_ms());
                let slot = sh.recorder.slot(seq);
                let since_start = self.clock.elapsed().as_micros() as u64;
                sh.latency.record(Latency::SubmitToStart, since_start);
                self.runs.insert(task, (seq, slot, Instant::now()));
            }
            let live = executor::launch(l, tx.clone());
            self.live.insert(task, (attempt, live, Instant::now()));
        }
        for a in acts {
            match a {
                Action::Kill { task, reason, .. } => {
                    if let Some((_, live, _)) = self.live.get(&task) {
                        live.signal(executor::kill_signal(reason));
                    }
                }
                Action::Emit(ev) => finished |= self.emit(engine, ev, obs),
                Action::Persist(_) | Action::Start { .. } => unreachable!("handled while draining"),
            }
        }
        Ok(Stepped {
            finished,
            more: engine.has_actions(),
        })
    }

    fn persist(&mut self, p: Persist, batch: &mut Vec<Write>) {
        let (task, record) = match p {
            Persist::Task { task, record, .. } => (task, record),
            Persist::Stage { stage, stop, .. } => {
                let value = stop
                    .map(|s| serde_json::to_vec(&s).expect("a stop encodes as JSON"))
                    .unwrap_or_default();
                batch.push(Write::Meta {
                    farm: self.key,
                    name: meta_stop(stage as usize),
                    value,
                });
                return;
            }
        };
        // The journal keeps what someone may ask about later: attempts that
        // did not succeed. Successes are in the task records already.
        if record.end.is_some() && record.state != RecordState::Done {
            batch.push(Write::Journal(JournalEntry {
                at_ms: unix_ms(),
                farm: self.key,
                event: JournalEvent::TaskEnded {
                    task,
                    record: record.clone(),
                },
            }));
        }
        if let Some(k) = record.key {
            self.unwritten.insert(task, k);
        }
        batch.push(Write::Task {
            farm: self.key,
            task,
            record,
        });
    }

    /// Builds a task's launch, or answers the engine at once when its content key already succeeded.
    fn prepare(
        &mut self,
        engine: &mut Engine,
        task: TaskRef,
        attempt: u32,
        grant: mesh_protocol::engine::Grant,
    ) -> Result<Option<Launch>, RunError> {
        let def = self.def.clone();
        let stage = def.stage(task);
        // A task that can see `{out}` sees a folder of its own there, with
        // exactly what it depends on (see `task_view`).
        let view = stage.reads_out().then(|| TaskView {
            dir: self
                .views_dir
                .join(&stage.name)
                .join(format!("{}.{attempt}", task.index)),
            base: self.out.clone(),
            def: self.def.clone(),
            task,
        });
        let seen_out = match &view {
            Some(v) => v.dir.to_string_lossy().into_owned(),
            None => def.out.clone(),
        };
        let mut spec = match crate::grown::line(&def, task, &self.out) {
            Ok(None) => def.expand_in(task, &seen_out),
            Ok(Some(line)) => def.expand_line_in(task, &seen_out, &line),
            Err(e) => {
                let outcome = Outcome::unrun(TaskResult::Error(e.to_string()), None, 0);
                engine.task_finished(0, self.slot, task, attempt, outcome);
                return Ok(None);
            }
        };
        let hashes: Vec<[u8; 32]> = spec.inputs.iter().map(|i| self.input_hash(i)).collect();
        let task_id = def.task_name(task);
        let mut key = def.own_key(task, &hashes);
        if has_deps(&def, task.stage) {
            key = key_with_deps(&key, &self.deps_digest(task)?);
        }
        let out_dir = self.out.join(&stage.name).join(task.index.to_string());
        if !stage.outputs.is_empty() {
            // What the folder holds may be the result another task of this
            // farm is known by now (a line inserted above it moved it to
            // another index): kept aside before anything replaces it.
            self.keep_aside(&out_dir, &key)?;
        }
        if !self.rerun[task.stage as usize] && self.reuse(&key, &out_dir)? {
            engine.task_finished(
                0,
                self.slot,
                task,
                attempt,
                Outcome {
                    // Its outputs are back in place: what it grew is read again.
                    grew: crate::grown::count(&def, task, &out_dir).ok().flatten(),
                    ..Outcome::unrun(TaskResult::Cached, Some(key), 0)
                },
            );
            return Ok(None);
        }
        // It runs again: what its folder holds is an earlier run's, which a
        // failure must not leave standing as its result (as Snakemake
        // removes a job's outputs before it runs).
        if let Err(e) = results::remove_folder(&out_dir) {
            tracing::info!(dir = %out_dir.display(), "an earlier run's outputs stay: {e}");
        }
        executor::resolve_program(&mut self.programs, &mut spec);
        Ok(Some(Launch {
            slot: self.slot.0,
            task,
            attempt,
            success_codes: stage.success_codes.clone(),
            spec,
            grant,
            key,
            farm_name: def.name.clone(),
            task_id,
            root: self.root.clone(),
            out_dir,
            stdout_log: executor::log_path(&self.logs_dir, &def, task, attempt, "out"),
            stderr_log: executor::log_path(&self.logs_dir, &def, task, attempt, "err"),
            gpu_ids: self.gpu_ids.clone(),
            node: String::new(),
            view,
            // `mesh run` keeps every output as a file of its folder.
            hand: 0,
            riding: Vec::new(),
        }))
    }

    /// What `task`'s key takes of the tasks it depends on, from their records.
    fn deps_digest(&mut self, task: TaskRef) -> Result<[u8; 32], RunError> {
        let (def, farm) = (self.def.clone(), self.key);
        let unwritten = &self.unwritten;
        let key_of = |store: &SledStore, t: TaskRef| -> Result<Option<[u8; 32]>, RunError> {
            if let Some(k) = unwritten.get(&t) {
                return Ok(Some(*k));
            }
            Ok(store.task(farm, t)?.and_then(|r| r.key))
        };
        for &s in &def.stage(task).after {
            if !self.stage_digests.contains_key(&s) {
                let mut err = None;
                let d = stage_digest(&def, s, |t| {
                    key_of(&self.store, t).unwrap_or_else(|e| {
                        err.get_or_insert(e);
                        None
                    })
                });
                if let Some(e) = err {
                    return Err(e);
                }
                self.stage_digests.insert(s, d);
            }
        }
        let mut err = None;
        let d = deps_digest(
            &def,
            task,
            |s| self.stage_digests[&s],
            |t| {
                key_of(&self.store, t).unwrap_or_else(|e| {
                    err.get_or_insert(e);
                    None
                })
            },
        );
        match err {
            Some(e) => Err(e),
            None => Ok(d),
        }
    }

    /// True when `key` succeeded before and `dir` now holds its outputs
    /// (put there from where they were left, when that was elsewhere).
    fn reuse(&mut self, key: &[u8; 32], dir: &Path) -> Result<bool, RunError> {
        let name = results::meta_name(key);
        let Some(bytes) = self.meta(&name)? else {
            return Ok(false);
        };
        let Ok(mut res) = postcard::from_bytes::<Results>(&bytes) else {
            return Ok(false);
        };
        let results::Reused {
            here: reused,
            changed,
        } = res.reuse(dir).unwrap_or_else(|e| {
            tracing::info!(dir = %dir.display(), "earlier outputs not reused: {e}");
            results::Reused::FAILED
        });
        if changed {
            self.put_meta(name, postcard::to_stdvec(&res).expect("plain data"));
        }
        if reused && res.places.first().is_some_and(|p| !p.files.is_empty()) {
            self.put_meta(results::holder_name(dir), key.to_vec());
        }
        Ok(reused)
    }

    /// A farm's store entry, as the batch being made leaves it.
    fn meta(&self, name: &str) -> Result<Option<Vec<u8>>, RunError> {
        if let Some(v) = self.unwritten_meta.get(name) {
            return Ok(Some(v.clone()));
        }
        Ok(self.store.meta(self.key, name)?)
    }

    fn put_meta(&mut self, name: String, value: Vec<u8>) {
        self.unwritten_meta.insert(name.clone(), value.clone());
        self.pending.push(Write::Meta {
            farm: self.key,
            name,
            value,
        });
    }

    /// Before `dir` is replaced by the result of `key` (put there, or run):
    /// when it holds, whole, the result of another key, that result moves
    /// to this farm's stash and is written down there, so the task now
    /// known by that key (at another index) takes it from there. Only for
    /// this run: the stash is emptied when the run ends.
    fn keep_aside(&mut self, dir: &Path, key: &[u8; 32]) -> Result<(), RunError> {
        let Some(held) = self.meta(&results::holder_name(dir))? else {
            return Ok(());
        };
        let Ok(other) = <[u8; 32]>::try_from(held.as_slice()) else {
            return Ok(());
        };
        if other == *key {
            return Ok(());
        }
        let name = results::meta_name(&other);
        let Some(mut res) = self
            .meta(&name)?
            .and_then(|b| postcard::from_bytes::<Results>(&b).ok())
        else {
            return Ok(());
        };
        self.stashed += 1;
        // Named by the run's start too: a resumed run adds to what the
        // interrupted one kept aside.
        let to = self
            .stash_dir
            .join(format!("{}-{}", self.status.started_at_ms, self.stashed));
        match res.moved(dir, &to) {
            Ok(true) => {
                self.put_meta(name, postcard::to_stdvec(&res).expect("plain data"));
                self.put_meta(results::holder_name(&to), other.to_vec());
            }
            Ok(false) => {}
            Err(e) => tracing::info!(dir = %dir.display(), "an earlier result not kept aside: {e}"),
        }
        Ok(())
    }

    /// Writes down where a success left its outputs, for a later run's [`Driver::reuse`].
    fn remember(&mut self, task: TaskRef, key: &[u8; 32]) {
        let stage = self.def.stage(task);
        let dir = self.out.join(&stage.name).join(task.index.to_string());
        let place = match results::Place::left(&dir, !stage.outputs.is_empty()) {
            Ok(p) => p,
            Err(e) => {
                tracing::info!(dir = %dir.display(), "outputs not written down for reuse: {e}");
                return;
            }
        };
        let name = results::meta_name(key);
        // With no outputs any place will do: the one written down is not
        // read first (a read per task of a farm of `true`s).
        let files = !place.files.is_empty();
        let mut res = match self.meta(&name) {
            Ok(Some(b)) if files => postcard::from_bytes::<Results>(&b).unwrap_or_default(),
            _ => Results::default(),
        };
        res.add(place);
        self.put_meta(name, postcard::to_stdvec(&res).expect("plain data"));
        if files {
            self.put_meta(results::holder_name(&dir), key.to_vec());
        }
    }

    fn input_hash(&mut self, input: &str) -> [u8; 32] {
        if let Some(h) = self.input_hashes.get(input) {
            return *h;
        }
        let mut hasher = blake3::Hasher::new();
        // A missing input hashes as empty; staging then fails the task with a clear message.
        if let Ok(f) = fs::File::open(self.root.join(input)) {
            let _ = hasher.update_reader(f);
        }
        let h = *hasher.finalize().as_bytes();
        self.input_hashes.insert(input.to_string(), h);
        h
    }

    fn finish(&mut self, engine: &mut Engine, now: u64, f: Finished) {
        if self
            .live
            .get(&f.task)
            .is_some_and(|(a, ..)| *a == f.attempt)
        {
            self.live.remove(&f.task);
        }
        let codes = &self.def.stage(f.task).success_codes;
        let mut result = f.result;
        let mut grew = None;
        if matches!(result, TaskResult::Exited(c) if codes.contains(&c)) {
            let dir = self
                .out
                .join(&self.def.stage(f.task).name)
                .join(f.task.index.to_string());
            match crate::grown::count(&self.def, f.task, &dir) {
                Ok(n) => grew = n,
                Err(e) => result = TaskResult::Error(e.to_string()),
            }
        }
        let failed = match result {
            TaskResult::Exited(c) => !codes.contains(&c),
            TaskResult::Cached => false,
            _ => true,
        };
        if !failed {
            self.remember(f.task, &f.key);
            if !matches!(result, TaskResult::Cached) {
                self.ran_for(f.task, f.duration_ms);
            }
        }
        if let (Some(sh), Some((seq, slot, at))) = (&self.shared, self.runs.remove(&f.task)) {
            let mut sh = sh.lock().expect("not poisoned");
            sh.recorder.ended(seq, slot, failed, unix_ms());
            sh.latency
                .record(Latency::StartToDone, at.elapsed().as_micros() as u64);
        }
        engine.task_finished(
            now,
            FarmSlot(f.slot),
            f.task,
            f.attempt,
            Outcome {
                result,
                key: Some(f.key),
                duration_ms: f.duration_ms,
                ended_ms: 0,
                grew,
                logs: f.logs,
                stderr_line: f.stderr_line,
                usage: f.usage,
            },
        );
    }

    fn emit(&mut self, engine: &Engine, ev: Event, obs: &mut dyn Observer) -> bool {
        match ev {
            Event::TaskFinished {
                task,
                attempt,
                end,
                stderr_line,
                verdict,
                ..
            } => {
                let stage = task.stage;
                if matches!(verdict, Verdict::Failed | Verdict::Retry | Verdict::Stopped) {
                    let name = self.def.task_name(task);
                    let reason = describe_failure(&end, stderr_line.as_deref());
                    tracing::info!(farm = %self.id, task = %name, attempt, %reason, ?verdict, "task failed");
                    let failure = Unsaid {
                        task: name,
                        attempt,
                        reason,
                        verdict,
                    };
                    let holds = engine.stage_may_stop(self.slot, stage)
                        || engine.stage_stop(self.slot, stage).is_some();
                    if holds {
                        // A stop would say this failure with the others.
                        let (_, held) = self
                            .unsaid
                            .entry(stage)
                            .or_insert_with(|| (Instant::now(), Vec::new()));
                        held.push(failure);
                    } else {
                        self.say_withheld(stage, obs);
                        self.say(failure, obs);
                    }
                } else if verdict == Verdict::Done && !engine.stage_may_stop(self.slot, stage) {
                    // A success: the stage is not stopping.
                    self.say_withheld(stage, obs);
                }
                false
            }
            Event::StageStopped { stage, stop, .. } => {
                // Its failures so far are this one line.
                self.unsaid.remove(&stage);
                let line = describe_stop(&self.def.stages[stage as usize].name, &stop);
                tracing::info!(farm = %self.id, "{line}");
                obs.stage_stopped(&line);
                false
            }
            Event::StageResumed { stage, task, .. } => {
                let line = format!(
                    "stage `{}` goes on: {} succeeded, so the failures that stopped it were its tasks' own",
                    self.def.stages[stage as usize].name,
                    self.def.task_name(task)
                );
                obs.stage_resumed(&line);
                self.say_withheld(stage, obs);
                false
            }
            Event::Unplaceable {
                stage,
                shortfall,
                offered,
                ..
            } => {
                let name = &self.def.stages[stage as usize].name;
                let text = mesh_protocol::resources::shortfall_words(&shortfall, &offered, "here");
                obs.unplaceable(name, &text);
                let failed = FailedTask {
                    task: format!("{name}/*"),
                    attempt: 0,
                    reason: format!("unplaceable: {text}"),
                };
                self.note_failed(failed);
                false
            }
            Event::FarmFinished { .. } => true,
        }
    }

    /// Says a failure as it happened, now.
    fn say(&mut self, f: Unsaid, obs: &mut dyn Observer) {
        // One held by a stop is retried when its stage goes on.
        let retrying = matches!(f.verdict, Verdict::Retry | Verdict::Stopped);
        obs.task_failed(&f.task, f.attempt, &f.reason, retrying);
        if !retrying {
            self.note_failed(FailedTask {
                task: f.task,
                attempt: f.attempt,
                reason: f.reason,
            });
        }
    }

    /// Says the failures held for `stage`, whose stop did not come.
    fn say_withheld(&mut self, stage: u32, obs: &mut dyn Observer) {
        if let Some((_, held)) = self.unsaid.remove(&stage) {
            for f in held {
                self.say(f, obs);
            }
        }
    }

    /// Says failures held longer than `HOLD_SAY_MS` in stages that did not
    /// stop: a stage of slow tasks does not keep its first failure unsaid
    /// until the next ends.
    fn say_held_long(&mut self, engine: &Engine, obs: &mut dyn Observer) {
        let due: Vec<u32> = self
            .unsaid
            .iter()
            .filter(|(&s, (since, _))| {
                engine.stage_stop(self.slot, s).is_none()
                    && since.elapsed() >= Duration::from_millis(HOLD_SAY_MS)
            })
            .map(|(&s, _)| s)
            .collect();
        for s in due {
            self.say_withheld(s, obs);
        }
    }

    /// At the end: failures held for stages that did not stop are said;
    /// those of stopped stages were said by their stop.
    fn say_unsaid(&mut self, engine: &Engine, obs: &mut dyn Observer) {
        let mut stages: Vec<u32> = self.unsaid.keys().copied().collect();
        stages.sort_unstable();
        for s in stages {
            if engine.stage_stop(self.slot, s).is_some() {
                self.unsaid.remove(&s);
            } else {
                self.say_withheld(s, obs);
            }
        }
    }

    /// The snapshot lists the first failures only, so it stays small.
    fn note_failed(&mut self, f: FailedTask) {
        if self.status.failed.len() < SNAPSHOT_FAILED_MAX {
            self.status.failed.push(f);
        }
    }

    fn kill_all_now(&self) {
        for (_, live, _) in self.live.values() {
            live.signal(Signal::SIGKILL);
        }
    }

    fn interrupt(&mut self, engine: &mut Engine, at: &mut Option<Instant>, obs: &mut dyn Observer) {
        if at.is_some() {
            // A second Ctrl-C: do not wait for the grace period.
            self.kill_all_now();
            return;
        }
        *at = Some(Instant::now());
        obs.interrupting();
        engine.interrupt();
    }

    /// A success's runtime, kept for the estimate of the end: every one
    /// up to `eta::SAMPLES_MAX` a stage, then each in turn replacing one.
    fn ran_for(&mut self, task: TaskRef, ms: u64) {
        if let Some((seen, kept)) = self.runtimes.get_mut(task.stage as usize) {
            if kept.len() < eta::SAMPLES_MAX {
                kept.push(ms as f64);
            } else {
                kept[(*seen % eta::SAMPLES_MAX as u64) as usize] = ms as f64;
            }
            *seen += 1;
        }
    }

    /// When the farm ends, as a quick simulation of what is left says, at
    /// most every `eta::EVERY` and a share of the time (see `eta.rs`).
    fn estimate_end(&mut self, engine: &Engine) {
        let now = Instant::now();
        if self.estimate_after.is_some_and(|t| now < t) {
            return;
        }
        let counts: Vec<Counts> = self
            .status
            .stages
            .iter()
            .map(|s| s.counts.clone())
            .collect();
        let runtimes = self.runtimes.iter().map(|(_, r)| r.clone()).collect();
        let mut stages = eta::stages_left(&self.def, &counts, runtimes, &[engine.total().clone()]);
        for (task, (.., started)) in &self.live {
            if let Some(s) = stages.get_mut(task.stage as usize) {
                s.elapsed
                    .push(now.duration_since(*started).as_millis() as f64);
            }
        }
        let names = self.def.stages.iter().map(|s| s.name.as_str());
        self.status.eta = eta::estimate(&stages, names, unix_ms(), self.status.started_at_ms);
        if let Some(e) = &self.status.eta {
            eta::remember(&mut self.status.eta_history, e);
        }
        self.estimate_after = Some(Instant::now() + eta::next_after(now.elapsed()));
    }

    fn refresh(&mut self, engine: &Engine, clock: Instant) {
        self.status.counts = engine.progress(self.slot);
        self.status.stages = stage_statuses(&self.def, engine, self.slot);
        self.status.updated_at_ms = unix_ms();
        self.status.elapsed_ms = clock.elapsed().as_millis() as u64;
        if let Some(sh) = &self.shared {
            let mut sh = sh.lock().expect("not poisoned");
            let total = engine.total();
            let used = engine.used();
            sh.node.resources = ResourceView {
                total: total.to_string(),
                used: used.to_string(),
            };
            sh.node.usage = ResourceUse::of(total, &used);
            sh.node.running = self.live.len() as u32;
            sh.node.queued = self.status.counts.queued() as u32;
            sh.status = self.status.clone();
        }
    }
}

/// A failure not said yet (see `Driver::unsaid`).
struct Unsaid {
    task: String,
    attempt: u32,
    reason: String,
    verdict: Verdict,
}

/// Each stage's counts, as the engine has them, and why it stopped.
fn stage_statuses(def: &FarmDef, engine: &Engine, slot: FarmSlot) -> Vec<StageStatus> {
    def.stages
        .iter()
        .zip(engine.stage_progress(slot))
        .enumerate()
        .map(|(i, (s, counts))| StageStatus {
            name: s.name.clone(),
            counts,
            stopped: engine
                .stage_stop(slot, i as u32)
                .map(|stop| describe_stop(&s.name, stop)),
        })
        .collect()
}

/// A farm that is not running, read from its store: exact counts, as resume
/// would see them. Fails with `AlreadyRunning` while a process holds it.
pub fn inspect(state: &StateDir, id: &str) -> Result<Inspected, RunError> {
    let store = open_store(state, id)?;
    let key = farm_key(id);
    let def = store
        .def(key)?
        .ok_or_else(|| RunError::NoDefinition(id.to_string()))?;
    let resources = store
        .meta(key, META_RESOURCES)?
        .and_then(|b| mesh_protocol::resources::parse_resources(&String::from_utf8_lossy(&b)).ok())
        .unwrap_or_default();
    let run = stored_run(&store, key)?;
    let records = store.tasks(key)?;
    // The last run's tasks that ended for good, as measured where they ran.
    let used = crate::used::by_stage(
        &def,
        records.iter().filter_map(|(t, r)| {
            let ended = matches!(r.state, RecordState::Done | RecordState::Failed);
            (ended && r.run == run).then_some(())?;
            Some(crate::used::Measured {
                stage: t.stage,
                runtime_ms: r.duration_ms,
                usage: *r.usage.as_deref()?,
            })
        }),
    );
    let mut engine = Engine::new(resources);
    // Interrupted first, so restoring starts nothing.
    engine.interrupt();
    let def = Arc::new(def);
    let slot = engine.add_farm(
        0,
        def.clone(),
        records,
        &AddOptions {
            run,
            ..AddOptions::default()
        },
    );
    // As the run ended: its records do not say which stages stopped.
    for (s, stop) in stored_stops(&store, key, &def)? {
        engine.stop_stage(slot, s, stop);
    }
    Ok(Inspected {
        counts: engine.progress(slot),
        stages: stage_statuses(&def, &engine, slot),
        used,
    })
}

/// A farm that is not running, as its store has it.
pub struct Inspected {
    pub counts: Counts,
    pub stages: Vec<StageStatus>,
    /// What each stage's tasks of the last run used.
    pub used: Vec<crate::used::StageUse>,
}

/// What task `index` of stage `stage` used in the farm's last run, where
/// it ended and was measured. Fails with `AlreadyRunning` while a process
/// holds the farm.
pub fn task_used(
    state: &StateDir,
    id: &str,
    stage: &str,
    index: u32,
) -> Result<Option<crate::used::TaskUsed>, RunError> {
    let store = open_store(state, id)?;
    let key = farm_key(id);
    let Some(def) = store.def(key)? else {
        return Ok(None);
    };
    let Some(s) = def.stages.iter().position(|st| st.name == stage) else {
        return Ok(None);
    };
    let run = stored_run(&store, key)?;
    let task = TaskRef::new(s as u32, index);
    Ok(store.tasks(key)?.into_iter().find_map(|(t, r)| {
        let ended = matches!(r.state, RecordState::Done | RecordState::Failed);
        (t == task && ended && r.run == run).then_some(())?;
        Some(crate::used::TaskUsed {
            runtime_ms: r.duration_ms,
            usage: *r.usage.as_deref()?,
        })
    }))
}

/// A farm that is not running, as `mesh export` writes it: each task of
/// its last run from its record (how long it ran, how it ended), its
/// outputs as the store wrote them down for reuse, the run's start and
/// length from its snapshot, and this machine with what the run offered.
/// A record keeps no start time: the tasks' runs have none. Fails with
/// `AlreadyRunning` while a process holds the farm.
pub fn export(state: &StateDir, id: &str) -> Result<crate::export::FarmFacts, RunError> {
    use crate::export::{Ended, FarmFacts, Machine};
    use mesh_protocol::engine::TaskEnd;
    let store = open_store(state, id)?;
    let key = farm_key(id);
    let def = store
        .def(key)?
        .ok_or_else(|| RunError::NoDefinition(id.to_string()))?;
    let run = stored_run(&store, key)?;
    let status = state.read_status(id);
    let host = status.as_ref().map_or_else(hostname, |s| s.host.clone());
    let offered = store
        .meta(key, META_RESOURCES)?
        .and_then(|b| mesh_protocol::resources::parse_resources(&String::from_utf8_lossy(&b)).ok())
        .unwrap_or_default();
    let out = PathBuf::from(&def.out);
    let mut facts = FarmFacts::new(def, id.to_string(), unix_ms());
    for (t, rec) in store.tasks(key)? {
        // An earlier run's record is what that run did, not this one.
        if rec.run != run {
            continue;
        }
        let stage = &facts.def.stages[t.stage as usize];
        let dir = out.join(&stage.name).join(t.index.to_string());
        let Some(f) = facts
            .tasks
            .get_mut(t.stage as usize)
            .and_then(|s| s.get_mut(t.index as usize))
        else {
            continue;
        };
        f.ended = match rec.state {
            RecordState::Done => Ended::Done,
            RecordState::Failed => Ended::Failed,
            _ => continue,
        };
        f.node = Some(host.clone());
        f.attempt = rec.attempt;
        f.grew = rec.grew;
        f.usage = rec.usage.as_deref().copied();
        match &rec.end {
            Some(TaskEnd::Exited(c)) => {
                f.exit_code = Some(*c);
                f.runtime_ms = Some(rec.duration_ms);
            }
            Some(TaskEnd::Signaled(_) | TaskEnd::TimedOut { .. }) => {
                f.runtime_ms = Some(rec.duration_ms);
            }
            // Reused from an earlier run: it did not run in this one.
            Some(TaskEnd::Cached) => f.attempt = 0,
            _ => {}
        }
        if f.ended == Ended::Failed {
            f.reason = rec
                .end
                .as_ref()
                .map(|end| describe_failure(end, rec.stderr_line.as_deref().map(String::as_str)));
        }
        if let (Ended::Done, Some(k)) = (f.ended, rec.key) {
            let res = store
                .meta(key, &results::meta_name(&k))?
                .and_then(|b| postcard::from_bytes::<Results>(&b).ok())
                .unwrap_or_default();
            let want = dir.to_string_lossy();
            if let Some(p) = res.places.iter().find(|p| p.dir == want) {
                f.outputs = p.files.iter().map(|s| (s.path.clone(), s.size)).collect();
            }
        }
    }
    let root = PathBuf::from(&facts.def.root);
    for (s, stage) in facts.def.stages.iter().enumerate() {
        if stage.inputs.is_empty() {
            continue;
        }
        for i in 0..stage.len() {
            for input in facts.def.expand(TaskRef::new(s as u32, i)).inputs {
                if facts.input_sizes.contains_key(&input) {
                    continue;
                }
                if let Ok(m) = fs::metadata(root.join(&input)) {
                    if m.is_file() {
                        facts.input_sizes.insert(input, m.len());
                    }
                }
            }
        }
    }
    facts.machines = vec![Machine::of(&host, &offered)];
    facts.span = status.map(|s| (s.started_at_ms, s.elapsed_ms));
    Ok(facts)
}

/// Opens a farm's store, explaining who holds it when it is locked.
fn open_store(state: &StateDir, id: &str) -> Result<SledStore, RunError> {
    let dir = state.farm_dir(id);
    fs::create_dir_all(&dir).map_err(io_err(format!("cannot create {}", dir.display())))?;
    match SledStore::open(&state.db_path(id)) {
        Err(StoreError::Locked { .. }) => {
            let holder = state
                .read_status(id)
                .map(|s| format!(" (pid {} on {})", s.pid, s.host))
                .unwrap_or_default();
            Err(RunError::AlreadyRunning {
                id: id.to_string(),
                holder,
            })
        }
        r => Ok(r?),
    }
}

/// The stages stopped when the farm's run ended, with why.
fn stored_stops(
    store: &SledStore,
    key: FarmKey,
    def: &FarmDef,
) -> Result<Vec<(u32, Stop)>, RunError> {
    let mut stops = Vec::new();
    for s in 0..def.stages.len() {
        if let Some(b) = store.meta(key, &meta_stop(s))? {
            // One that does not read (written by another version) is no stop.
            if let Ok(stop) = serde_json::from_slice::<Stop>(&b) {
                stops.push((s as u32, stop));
            }
        }
    }
    Ok(stops)
}

fn stored_run(store: &SledStore, key: FarmKey) -> Result<u32, RunError> {
    Ok(store
        .meta(key, META_RUN)?
        .and_then(|b| b.try_into().ok().map(u32::from_be_bytes))
        .unwrap_or(0))
}
