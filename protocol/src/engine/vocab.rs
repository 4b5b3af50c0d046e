//! The engine's vocabulary towards its driver: task records and how attempts end, the events it hears and the actions it asks for, and progress counts.

use serde::{Deserialize, Serialize};

use super::Grant;
use crate::farm::TaskRef;
use crate::resources::Amount;

/// A run that was live each time the node died this many times is failed:
/// it is probably what kills the node.
pub const CRASHES_MAX: u32 = 3;

pub use crate::ids::FarmSlot;

/// What a task's durable record says; the engine's restart point.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskRecord {
    /// The run of the farm that wrote it: a new run keeps the last run's
    /// records (their content keys let it skip work) but does not restore them.
    pub run: u32,
    /// Where the task stands.
    pub state: RecordState,
    /// Starts so far, the one recorded included (1 for the first run).
    pub attempt: u32,
    /// Failures counted against `retries`.
    pub failures: u32,
    /// Times the node died while this task ran.
    pub crashes: u32,
    /// How the last attempt ended, when it has.
    pub end: Option<TaskEnd>,
    /// The content key the last attempt ran under: a later run skips a task
    /// whose key already succeeded.
    pub key: Option<[u8; 32]>,
    /// How long the last attempt ran, in ms.
    pub duration_ms: u64,
    /// Which log files the last attempt wrote (bit 0 stdout, bit 1 stderr).
    pub logs: u8,
    /// See [`Outcome::grew`]: kept so a restored engine knows which of a
    /// grown stage's tasks exist.
    pub grew: Option<u32>,
    /// See [`Outcome::stderr_line`]: kept with a failed attempt's end, so
    /// whoever reads the record later says the cause, not just the code.
    /// Boxed twice: a record rides in every persist action, which is kept
    /// small (see the mesh peer's `Action`), and most records have none.
    pub stderr_line: Option<Box<String>>,
    /// See [`Outcome::usage`]: what the last attempt used. Boxed as
    /// `stderr_line` is; none where it was not measured.
    pub usage: Option<Box<Usage>>,
}

impl TaskRecord {
    /// The record of a task of run `run` known to be done from elsewhere (a
    /// submitter's done set): no attempt, key or timing of its own.
    pub fn known_done(run: u32) -> TaskRecord {
        TaskRecord {
            run,
            state: RecordState::Done,
            attempt: 0,
            failures: 0,
            crashes: 0,
            end: None,
            key: None,
            duration_ms: 0,
            logs: 0,
            grew: None,
            stderr_line: None,
            usage: None,
        }
    }
}

/// Where a task stands in its durable record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RecordState {
    /// Started and not known to have ended.
    Running,
    /// Stopped on purpose (Ctrl-C, SIGTERM); runs again on resume.
    Interrupted,
    /// Succeeded, or known done from elsewhere (its content key, a
    /// submitter's done set).
    Done,
    /// Failed for good: no retries left, or its node died under it too often.
    Failed,
    /// Stopped because its farm, or the task alone, was cancelled; runs again on resume.
    Cancelled,
}

/// How an attempt ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TaskEnd {
    /// The process exited with this code: a success when the stage counts
    /// the code as one.
    Exited(i32),
    /// A signal ended the process.
    Signaled(i32),
    /// Killed for passing the stage's timeout.
    TimedOut {
        /// The stage's timeout, in ms.
        after_ms: u64,
    },
    /// Skipped because a task with the same content key already succeeded.
    Cached,
    /// The task could not be started or its results not collected. In
    /// words: they are what the farm's log keeps and its users read, the
    /// engine acts on none of their kinds, and the node's error types
    /// (`FetchError`, `FilesError`, ...) say them before they get here.
    Error(String),
    /// The node died while the task ran [`CRASHES_MAX`] times: the task is failed.
    CrashLimit,
    /// Killed, or never started, because its farm or the task alone was cancelled.
    Cancelled,
}

/// What the driver reports when a started task is over.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// How the process ended, as the driver saw it.
    pub result: TaskResult,
    /// The task's content key, when the driver made one.
    pub key: Option<[u8; 32]>,
    /// How long it ran, in ms.
    pub duration_ms: u64,
    /// When it ended, in ms since the Unix epoch by the clock of the node
    /// that ran it; 0 where that is not known (the simulator). The engine
    /// reads no clock: it is carried to the farm's log for its users.
    pub ended_ms: u64,
    /// How many lines the file that grows another stage from this task
    /// has (see [`crate::farm::Grown`]), counted where it ran; none for a
    /// task of a stage that grows none.
    pub grew: Option<u32>,
    /// Which log files it wrote (bit 0 stdout, bit 1 stderr).
    pub logs: u8,
    /// The first line a failed attempt wrote to stderr, when it wrote one
    /// (see [`first_line`]): what tells one failure from another besides
    /// its exit code, for `max_fails`. The engine cannot read logs.
    pub stderr_line: Option<String>,
    /// What it used, as the driver measured it; none where it was not
    /// measured (the simulator, a task that never started).
    pub usage: Option<Usage>,
}

impl Outcome {
    /// An attempt that ended without a process to time or measure: it
    /// could not start, was killed while it waited, or was done before.
    pub fn unrun(result: TaskResult, key: Option<[u8; 32]>, ended_ms: u64) -> Outcome {
        Outcome {
            result,
            key,
            duration_ms: 0,
            ended_ms,
            grew: None,
            logs: 0,
            stderr_line: None,
            usage: None,
        }
    }
}

/// What an attempt used, as the node that ran it measured it: carried
/// with its report to the farm's log, for `mesh status`, `mesh logs`,
/// `mesh export` and the asks' hints. A few bytes (varints).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// User and system CPU time of its processes, children included, in ms.
    pub cpu_ms: u64,
    /// The most resident memory its processes held at once, in bytes (0:
    /// it ended before anyone looked).
    pub peak_rss: u64,
    /// Bytes its processes read through read calls.
    pub read_bytes: u64,
    /// Bytes its processes wrote through write calls.
    pub written_bytes: u64,
    /// The kernel killed it for want of memory.
    pub oom: bool,
}

/// The longest [`Outcome::stderr_line`] kept, in bytes.
pub const STDERR_LINE_MAX: usize = 200;

/// The first line of `text` with anything on it, trimmed and cut to
/// [`STDERR_LINE_MAX`] bytes (at a character's boundary): how a driver
/// makes [`Outcome::stderr_line`] of what the task wrote.
pub fn first_line(text: &str) -> Option<String> {
    let line = text.lines().map(str::trim).find(|l| !l.is_empty())?;
    let mut end = line.len().min(STDERR_LINE_MAX);
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    Some(line[..end].to_string())
}

/// How a started task ended, as its driver reports it; the engine makes a
/// [`TaskEnd`] of it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TaskResult {
    /// The process exited with this code.
    Exited(i32),
    /// A signal ended the process.
    Signaled(i32),
    /// Not run: a task with the same content key already succeeded.
    Cached,
    /// As [`TaskEnd::Error`].
    Error(String),
    /// Killed by the node that ran it for passing the stage's timeout.
    TimedOut,
}

/// Why the engine asks its driver to kill a running task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KillReason {
    /// It passed its stage's timeout.
    Timeout,
    /// Its farm, or the task alone, was cancelled.
    Cancel,
    /// The engine was interrupted (Ctrl-C): the task runs again on resume.
    Interrupt,
}

/// What the driver makes durable before it carries out any later action.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Persist {
    /// A task's record changed: an attempt started or ended, or its node died
    /// under it.
    Task {
        /// Which farm, by its slot in the engine.
        farm: FarmSlot,
        /// Which task of the farm.
        task: TaskRef,
        /// Its new record, in place of the last.
        record: TaskRecord,
    },
    /// A stage stopped by its `max_fails` (`Some`), or going on again
    /// (`None`): a driver that resumes farms keeps it, so that resuming
    /// runs the stage's failed tasks again too (see [`AddOptions::retry_stages`]).
    Stage {
        /// Which farm, by its slot in the engine.
        farm: FarmSlot,
        /// Which stage, by its place in the farm (from 0).
        stage: u32,
        /// Why it stopped; none when it goes on again.
        stop: Option<Stop>,
    },
}

/// Why a stage stopped starting tasks: its first ended attempts, at least
/// its `max_fails`, all failed the same way, and none succeeded.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stop {
    /// The attempts that failed so, and how many tasks they were.
    pub attempts: u32,
    /// How many tasks those attempts were of.
    pub tasks: u32,
    /// The first of them: how it ended, and the first line it wrote to stderr.
    pub task: TaskRef,
    /// How the first of them ended.
    pub end: TaskEnd,
    /// The first line it wrote to stderr, if it wrote one.
    pub stderr_line: Option<String>,
}

/// What happened, for the driver to show or log; the engine needs no answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// An attempt ended, or a task was failed for crashing its node too often.
    TaskFinished {
        /// Which farm, by its slot in the engine.
        farm: FarmSlot,
        /// Which task of the farm.
        task: TaskRef,
        /// Which attempt ended.
        attempt: u32,
        /// How it ended.
        end: TaskEnd,
        /// See [`Outcome::stderr_line`].
        stderr_line: Option<String>,
        /// What follows: done, retried, failed for good, ...
        verdict: Verdict,
    },
    /// A stage asks for more than this node has; its tasks are failed.
    Unplaceable {
        /// Which farm, by its slot in the engine.
        farm: FarmSlot,
        /// Which stage, by its place in the farm (from 0).
        stage: u32,
        /// (resource, asked, available)
        shortfall: Vec<(String, Amount, Amount)>,
        /// The names of every resource a machine offers: a name asked
        /// that none offers is likely mistyped (see
        /// [`crate::resources::shortfall_words`]).
        offered: Vec<String>,
    },
    /// A stage stopped starting tasks (see [`Stop`]); its tasks not yet
    /// over wait for a resume, and what depends on them is skipped.
    StageStopped {
        /// Which farm, by its slot in the engine.
        farm: FarmSlot,
        /// Which stage, by its place in the farm (from 0).
        stage: u32,
        /// Why it stopped.
        stop: Stop,
    },
    /// A task of a stopped stage that was running when it stopped
    /// succeeded: the stage goes on.
    StageResumed {
        /// Which farm, by its slot in the engine.
        farm: FarmSlot,
        /// Which stage, by its place in the farm (from 0).
        stage: u32,
        /// The task whose success resumed it.
        task: TaskRef,
    },
    /// Every task of the farm is over: nothing runs and nothing is left to start.
    FarmFinished {
        /// Which farm, by its slot in the engine.
        farm: FarmSlot,
    },
}

/// What follows the end of an attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Verdict {
    /// The task is done.
    Done,
    /// It failed with retries left: it runs again.
    Retry,
    /// Failed for good (no retries left): what depends on it is skipped.
    Failed,
    /// Its farm, or the task alone, was cancelled.
    Cancelled,
    /// Killed by an interrupt: it runs again on resume, with no retry spent.
    Interrupted,
    /// Failed, with retries left, in a stage that stopped: it waits, as
    /// the stage's tasks that did not start do, for a resume.
    Stopped,
}

/// What the engine asks of its driver, in the order it must be done.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Make this durable before carrying out any later action.
    Persist(Persist),
    /// Start an attempt of a task with what it was granted (a local engine
    /// only: a remote one hands tasks out instead).
    Start {
        /// Which farm, by its slot in the engine.
        farm: FarmSlot,
        /// Which task of the farm.
        task: TaskRef,
        /// Which try of the task this is, counting from 1: its end is reported
        /// with it.
        attempt: u32,
        /// The resources and GPU devices it may use.
        grant: Grant,
    },
    /// Kill a running attempt; its end is reported as any other.
    Kill {
        /// Which farm, by its slot in the engine.
        farm: FarmSlot,
        /// Which task of the farm.
        task: TaskRef,
        /// Which attempt to kill.
        attempt: u32,
        /// Why: a timeout, a cancel or an interrupt.
        reason: KillReason,
    },
    /// Tell the user (or the log) of this.
    Emit(Event),
}

/// How a farm is doing; per stage and summed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    /// Tasks in all.
    pub total: u64,
    /// Tasks done, cached ones included.
    pub done: u64,
    /// Of `done`, those skipped because their content key had succeeded.
    pub cached: u64,
    /// Tasks running. An engine counts every task it handed out; a mesh
    /// coordinator's view moves those its nodes have not started yet
    /// (sent ahead, see `pace.rs`) to `queued_on_nodes`.
    pub running: u64,
    /// Tasks failed for good.
    pub failed: u64,
    /// Not run because something they depend on failed.
    pub skipped: u64,
    /// Tasks cancelled.
    pub cancelled: u64,
    /// Held by a stage that stopped (`max_fails`): they run on resume.
    #[serde(default)]
    pub stopped: u64,
    /// Handed to a node and queued there, not started: counted in
    /// `queued()`, not in `running`. Only a mesh coordinator's view has
    /// them, from its nodes' beats (`Beat::started`); an engine's own
    /// counts never do.
    #[serde(default)]
    pub queued_on_nodes: u64,
}

impl Counts {
    /// Tasks still to start: ready, waiting for what they depend on, or
    /// queued on a node (`queued_on_nodes`).
    pub fn queued(&self) -> u64 {
        self.total
            - self.done
            - self.running
            - self.failed
            - self.skipped
            - self.cancelled
            - self.stopped
    }

    /// True when nothing runs and nothing is left to start.
    pub fn finished(&self) -> bool {
        self.running == 0 && self.queued() == 0
    }

    /// Tasks this run is through with: done, failed, skipped, cancelled,
    /// or held by a stopped stage.
    pub fn ended(&self) -> u64 {
        self.done + self.failed + self.skipped + self.cancelled + self.stopped
    }

    /// Adds `o`'s counts to these (a farm's, over its stages).
    pub fn add(&mut self, o: &Counts) {
        self.total += o.total;
        self.done += o.done;
        self.cached += o.cached;
        self.running += o.running;
        self.failed += o.failed;
        self.skipped += o.skipped;
        self.cancelled += o.cancelled;
        self.stopped += o.stopped;
        self.queued_on_nodes += o.queued_on_nodes;
    }

    /// Takes `o`'s counts from these (a stage's, from its farm's sum).
    pub fn sub(&mut self, o: &Counts) {
        self.total -= o.total;
        self.done -= o.done;
        self.cached -= o.cached;
        self.running -= o.running;
        self.failed -= o.failed;
        self.skipped -= o.skipped;
        self.cancelled -= o.cancelled;
        self.stopped -= o.stopped;
        self.queued_on_nodes -= o.queued_on_nodes;
    }

    /// Of the tasks counted running (handed out), only `started` have
    /// started where they were sent: the rest are queued on nodes.
    pub fn split_started(&mut self, started: u64) {
        let n = self.running.saturating_sub(started);
        self.running -= n;
        self.queued_on_nodes += n;
    }
}

/// Options for adding a farm.
#[derive(Clone, Debug, Default)]
pub struct AddOptions {
    /// The run this engine drives; restored records of other runs are history.
    pub run: u32,
    /// Re-queue tasks whose record says they failed (with fresh retries).
    pub retry_failed: bool,
    /// The same for these stages only: those a `max_fails` stop held
    /// when the farm last ran ([`Persist::Stage`]). Resuming a stopped
    /// stage runs it whole: its failures were the stage's (a program
    /// missing), not each task's.
    pub retry_stages: Vec<u32>,
    /// The farm is open: more stages may come (see `Engine::extend_farm`).
    pub open: bool,
}
