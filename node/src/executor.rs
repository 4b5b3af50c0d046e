//! Runs tasks as child processes: staging, spawning in their own process group, logs, outputs, kills.
//!
//! A task costs a process and two pipes (it is reaped when they close, with
//! no descriptor of its own); files and folders only when it
//! needs them (a log file when output appears, a workdir when the farm asks
//! for one, output folders when there are outputs). On this kind of disk a
//! file costs more than the spawn itself.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::io::{self, Write as _};
use std::os::fd::OwnedFd;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use mesh_protocol::engine::{first_line, Grant, KillReason, TaskResult, Usage};
use mesh_protocol::farm::{Command, FarmDef, TaskSpec};
use mesh_protocol::resources::MEM;
use mesh_protocol::TaskRef;
use nix::fcntl::{fcntl, FcntlArg, OFlag};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::io::AsyncReadExt;
use tokio::net::unix::pipe;
use tokio::sync::mpsc;

use crate::warm::{Handed, Said};

/// Bytes read from a task's pipe at a time.
const PIPE_CHUNK_BYTES: usize = 64 * 1024;
/// How long to wait for a task's pipes to close after it exits (a
/// background child of the task may hold them open).
const PIPE_DRAIN_MS: u64 = 500;
// While its pipes are open, whether a task has ended is asked at the
// times its processes are looked at (see usage.rs): only a task whose
// pipes something else holds is found that way.
use crate::usage::{EXIT_POLL_FIRST_MS, EXIT_POLL_MAX_MS};
/// Times the runner yields to a task whose pipes closed before it can be reaped.
const EXIT_YIELDS: u32 = 3;

/// The variables numeric libraries (OpenMP, MKL, OpenBLAS, numexpr) size
/// their thread pools by: each task gets its granted cores in them, as a
/// Dask nanny sets them to its worker's threads, so that two one-core
/// tasks do not start a pool of every core each and fight over them.
pub const THREAD_VARS: [&str; 4] = [
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "NUMEXPR_NUM_THREADS",
];

/// Log bits in `Finished::logs`.
pub const LOG_STDOUT: u8 = 1;
pub const LOG_STDERR: u8 = 2;

/// Where a task's stdout (`out`) or stderr (`err`) is kept.
pub fn log_path(logs_dir: &Path, def: &FarmDef, t: TaskRef, attempt: u32, stream: &str) -> PathBuf {
    logs_dir
        .join(&def.stage(t).name)
        .join(format!("{}.{attempt}.{stream}", t.index))
}

/// The latest attempt of task `index` that wrote a log in `dir` (a stage's log folder).
pub fn latest_attempt(dir: &Path, index: u32) -> Option<u32> {
    let prefix = format!("{index}.");
    fs::read_dir(dir)
        .ok()?
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let rest = name.strip_prefix(&prefix)?;
            let (a, _) = rest.split_once('.')?;
            a.parse::<u32>().ok()
        })
        .max()
}

/// Looks a bare program name up in PATH once (per run or node) rather than
/// letting every exec walk PATH: a failed exec per PATH entry, per task.
/// `programs` remembers each name (None: not found; the exec reports it).
pub fn resolve_program(programs: &mut HashMap<String, Option<String>>, spec: &mut TaskSpec) {
    let Command::Argv(argv) = &mut spec.command else {
        return;
    };
    if argv[0].contains('/') || spec.env.iter().any(|(k, _)| k == "PATH") {
        return;
    }
    let found = programs.entry(argv[0].clone()).or_insert_with_key(|name| {
        which::which(name)
            .ok()
            .map(|p| p.to_string_lossy().into_owned())
    });
    if let Some(path) = found {
        argv[0] = path.clone();
    }
}

/// A task attempt that is over, reported to the runner.
#[derive(Debug)]
pub struct Finished {
    pub slot: u32,
    pub task: TaskRef,
    pub attempt: u32,
    pub result: TaskResult,
    pub duration_ms: u64,
    pub logs: u8,
    pub key: [u8; 32],
    /// See [`mesh_protocol::engine::Outcome::stderr_line`].
    pub stderr_line: Option<String>,
    /// What it used (see `usage.rs`); none where it never started.
    pub usage: Option<Usage>,
    /// Outputs the task handed back instead of writing them (see
    /// [`Launch::hand`]): name and bytes, no file made for them.
    pub handed: Handed,
}

/// Handle on a live task, for killing it.
#[derive(Clone, Default)]
pub struct Live {
    /// Process group id once spawned (0 before).
    pgid: Arc<AtomicI32>,
    /// Set when a kill was asked for before the process existed.
    kill_asked: Arc<AtomicBool>,
    /// What the task held and spent at its last look (see `usage.rs`).
    pub looked: Arc<crate::usage::Looked>,
}

impl Live {
    /// Sends `sig` to the task's whole process group.
    pub fn signal(&self, sig: Signal) {
        self.kill_asked.store(true, Ordering::SeqCst);
        let pg = self.pgid.load(Ordering::SeqCst);
        if pg > 0 {
            // ESRCH means it is already gone, which is what we wanted.
            let _ = killpg(Pid::from_raw(pg), sig);
        }
    }
}

/// Everything one attempt needs, owned so it can move into its own future.
pub struct Launch {
    pub slot: u32,
    pub task: TaskRef,
    pub attempt: u32,
    pub spec: TaskSpec,
    pub grant: Grant,
    pub key: [u8; 32],
    pub farm_name: String,
    pub task_id: String,
    pub root: PathBuf,
    pub out_dir: PathBuf,
    pub stdout_log: PathBuf,
    pub stderr_log: PathBuf,
    /// Exit codes after which outputs are collected.
    pub success_codes: Vec<i32>,
    /// The node's GPUs, as tasks name them (`CUDA_VISIBLE_DEVICES`), by
    /// their place in its pool; on a node with GPUs, a task asking none
    /// sees none.
    pub gpu_ids: std::sync::Arc<[String]>,
    /// The mesh node running the task (its peer id), shown to it as `MESH_NODE`; empty outside a mesh.
    pub node: String,
    /// The folder it sees as `{out}`, made before it starts and removed
    /// once it ends; `None` for a task that cannot see `{out}`.
    pub view: Option<crate::task_view::TaskView>,
    /// The most bytes an output a `python` task hands back to its warm
    /// worker may have (0: none is taken): such an output, one of its
    /// plain output paths, is no file but rides with the report.
    pub hand: usize,
    /// The outputs of its dependencies that rode with the log, by their
    /// path under `{out}`: a task run in a warm worker has them in memory
    /// (`mesh_warm.riding`), no file made for them.
    pub riding: crate::warm::Riding,
}

impl Launch {
    /// Whether it runs in a warm Python worker (a stage's `python`).
    pub fn warm(&self) -> bool {
        matches!(self.spec.command, Command::Python(_))
    }
}

/// The signal an engine's kill sends: an interrupt lets the task end on
/// its own within the grace period; a timeout or a cancel does not wait.
pub fn kill_signal(reason: KillReason) -> Signal {
    match reason {
        KillReason::Interrupt => Signal::SIGTERM,
        KillReason::Timeout | KillReason::Cancel => Signal::SIGKILL,
    }
}

/// Starts `l` in the background; its end arrives on `done`.
pub fn launch(l: Launch, done: mpsc::Sender<Finished>) -> Live {
    let (live, attempt) = attempt(l, done);
    tokio::spawn(attempt);
    live
}

/// One attempt from start to report, and the handle that signals it.
fn attempt(
    mut l: Launch,
    done: mpsc::Sender<Finished>,
) -> (Live, impl std::future::Future<Output = ()> + Send + 'static) {
    let live = Live::default();
    let handle = live.clone();
    let attempt = async move {
        let started = Instant::now();
        let mut report = Report {
            done,
            slot: l.slot,
            task: l.task,
            attempt: l.attempt,
            key: l.key,
            sent: false,
            handed: Vec::new(),
            usage: None,
        };
        let Ended {
            result,
            logs,
            handed,
            usage,
        } = run(&l, &handle).await;
        report.handed = handed;
        report.usage = usage;
        let failed = match result {
            TaskResult::Exited(c) => !l.success_codes.contains(&c),
            TaskResult::Signaled(_) => true,
            _ => false,
        };
        let oom = usage
            .filter(|u| u.oom)
            .map(|u| oom_words(u.peak_rss, l.grant.resources.get(MEM).whole()));
        let stderr_line = if oom.is_some() {
            oom
        } else if failed && logs & LOG_STDERR != 0 {
            stderr_line(&l.stderr_log)
        } else {
            None
        };
        report
            .send(
                result,
                started.elapsed().as_millis() as u64,
                logs,
                stderr_line,
            )
            .await;
        // After the report: what depends on the task need not wait for its
        // view of `{out}` to go (a gather's is a folder per dependency).
        if let Some(view) = l.view.take() {
            let _ = tokio::task::spawn_blocking(move || view.remove()).await;
        }
    };
    (live, attempt)
}

/// Why a task killed for memory was: its peak against its ask. It stands
/// where the first line of its stderr would, so every view says it.
fn oom_words(peak: u64, asked: u64) -> String {
    use crate::view::bytes;
    if asked > 0 && peak > asked {
        // Killed here, past its ask (see usage.rs).
        format!(
            "out of memory: it held {}, more than the {} it asked for (mem)",
            bytes(peak),
            bytes(asked)
        )
    } else if asked > 0 {
        format!(
            "out of memory: the kernel killed it holding {} of the {} it asked for (mem)",
            bytes(peak),
            bytes(asked)
        )
    } else {
        format!(
            "out of memory: the kernel killed it holding {}; it asked for no memory (mem)",
            bytes(peak)
        )
    }
}

/// The first line a failed attempt wrote to stderr (from its log's first
/// few KiB: a first line is short), which tells its failure from others'.
fn stderr_line(log: &Path) -> Option<String> {
    use std::io::Read as _;
    let mut head = Vec::new();
    fs::File::open(log)
        .ok()?
        .take(4096)
        .read_to_end(&mut head)
        .ok()?;
    first_line(&String::from_utf8_lossy(&head))
}

/// Reports an attempt's end exactly once, even if its future panics or is
/// dropped: a task that never reports would hold its resources forever.
/// So a report waits for room on a full channel rather than being lost.
struct Report {
    done: mpsc::Sender<Finished>,
    slot: u32,
    task: TaskRef,
    attempt: u32,
    key: [u8; 32],
    sent: bool,
    handed: Handed,
    usage: Option<Usage>,
}

impl Report {
    fn finished(
        &mut self,
        result: TaskResult,
        duration_ms: u64,
        logs: u8,
        stderr_line: Option<String>,
    ) -> Finished {
        self.sent = true;
        Finished {
            slot: self.slot,
            task: self.task,
            attempt: self.attempt,
            result,
            duration_ms,
            logs,
            key: self.key,
            stderr_line,
            handed: std::mem::take(&mut self.handed),
            usage: self.usage.take(),
        }
    }

    async fn send(
        &mut self,
        result: TaskResult,
        duration_ms: u64,
        logs: u8,
        stderr_line: Option<String>,
    ) {
        let f = self.finished(result, duration_ms, logs, stderr_line);
        let _ = self.done.send(f).await;
    }
}

impl Drop for Report {
    fn drop(&mut self) {
        if self.sent {
            return;
        }
        let f = self.finished(
            TaskResult::Error("internal error: the task's runner stopped".into()),
            0,
            0,
            None,
        );
        // A drop cannot wait: a full channel gets the report from a task
        // of its own. With no runtime left, nobody is there to hear it.
        if let Err(mpsc::error::TrySendError::Full(f)) = self.done.try_send(f) {
            let done = self.done.clone();
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(async move {
                    let _ = done.send(f).await;
                });
            }
        }
    }
}

/// Times a start that failed with ETXTBSY is tried again, a little later
/// each time (about a second in all).
const TEXT_BUSY_TRIES: u64 = 20;

/// How an attempt went, as [`run`] tells [`attempt`].
struct Ended {
    result: TaskResult,
    logs: u8,
    handed: Handed,
    /// What its process used, when one ran.
    usage: Option<Usage>,
}

impl Ended {
    /// Ended with `result` and nothing handed back.
    fn with(result: TaskResult, logs: u8, usage: Option<Usage>) -> Ended {
        Ended {
            result,
            logs,
            handed: Vec::new(),
            usage,
        }
    }

    /// Could not start, or its results could not be taken.
    fn error(message: String, logs: u8, usage: Option<Usage>) -> Ended {
        Ended::with(TaskResult::Error(message), logs, usage)
    }
}

async fn run(l: &Launch, live: &Live) -> Ended {
    let cwd = match &l.spec.workdir {
        Some(w) => l.root.join(w),
        None => l.root.clone(),
    };
    // What the outputs' patterns match before the task runs, staging
    // included: what it does not make or change is an earlier run's.
    let before = if l.spec.outputs.iter().any(|p| is_pattern(p)) {
        let (cwd2, outputs) = (cwd.clone(), l.spec.outputs.clone());
        tokio::task::spawn_blocking(move || matched_before(&cwd2, &outputs))
            .await
            .unwrap_or_default()
    } else {
        HashMap::new()
    };
    if let Some(view) = &l.view {
        let view = view.clone();
        let built = tokio::task::spawn_blocking(move || view.build()).await;
        match built {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Ended::error(e.to_string(), 0, None),
            Err(e) => return Ended::error(format!("making the task's view failed: {e}"), 0, None),
        }
    }
    if l.spec.workdir.is_some() || !l.spec.inputs.is_empty() {
        let (root, cwd2, inputs, staged) = (
            l.root.clone(),
            cwd.clone(),
            l.spec.inputs.clone(),
            l.spec.workdir.is_some(),
        );
        // Inputs only looked at (no workdir to copy them into) are a few
        // files' look: here.
        let r = blocking_unless(!staged, move || stage(&root, &cwd2, &inputs, staged)).await;
        match r {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Ended::error(e.to_string(), 0, None),
            Err(e) => return Ended::error(format!("staging failed: {e}"), 0, None),
        }
    }
    if live.kill_asked.load(Ordering::SeqCst) {
        return Ended::with(TaskResult::Signaled(Signal::SIGKILL as i32), 0, None);
    }

    let env = task_env(l, &cwd);
    let (ended, made) = match &l.spec.command {
        Command::Python(argv) => run_warm(l, live, argv, &cwd, &env).await,
        _ => (spawn(l, live, &cwd, &env).await, Vec::new()),
    };
    let Ended {
        result,
        logs,
        mut handed,
        usage,
    } = ended;
    // Only what it says it makes is taken (the worker's answer names each
    // once), and only when it succeeded.
    handed.retain(|(name, _)| l.spec.outputs.contains(name));
    if let TaskResult::Exited(code) = result {
        if !l.success_codes.contains(&code) {
            handed.clear();
        } else if !l.spec.outputs.is_empty() {
            let (cwd2, dest) = (cwd.clone(), l.out_dir.clone());
            let outputs: Vec<String> = l
                .spec
                .outputs
                .iter()
                .filter(|o| !handed.iter().any(|(name, _)| name == *o))
                .cloned()
                .collect();
            // All handed back: nothing is collected and no folder made, and
            // what an earlier run left there goes, as `collect` leaves it.
            // Nothing to collect is a look at one folder: here.
            let collected = blocking_unless(outputs.is_empty(), move || {
                collect(&cwd2, &dest, &outputs, &made, &before)
            })
            .await;
            match collected {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Ended::error(e.to_string(), logs, usage),
                Err(e) => {
                    return Ended::error(format!("collecting outputs failed: {e}"), logs, usage)
                }
            }
        }
    }
    Ended {
        result,
        logs,
        handed,
        usage,
    }
}

/// Runs the task as a process of its own, and waits for it.
async fn spawn(l: &Launch, live: &Live, cwd: &Path, env: &[(String, String)]) -> Ended {
    let mut cmd = match &l.spec.command {
        Command::Argv(argv) => {
            let mut c = std::process::Command::new(&argv[0]);
            c.args(&argv[1..]);
            c
        }
        Command::Shell(s) => {
            let mut c = std::process::Command::new("/bin/sh");
            c.arg("-c").arg(s);
            c
        }
        Command::Python(argv) => {
            let mut c = std::process::Command::new(crate::warm::interpreter(&argv[0]));
            c.args(&argv[1..]);
            c
        }
    };
    let (pipes, stdin) = match (task_pipe(), task_pipe(), dev_null()) {
        (Ok(out), Ok(err), Ok(stdin)) => ((out, err), stdin),
        (Err(e), ..) | (_, Err(e), _) | (.., Err(e)) => {
            return Ended::error(
                format!("could not set up the task's stdin and output pipes: {e}"),
                0,
                None,
            )
        }
    };
    let ((out_r, out_w), (err_r, err_w)) = pipes;
    cmd.current_dir(cwd)
        .stdin(stdin)
        .stdout(out_w)
        .stderr(err_w)
        // Its own group, so a timeout or cancel kills everything it started;
        // std does this with posix_spawn, no fork-and-exec closure needed.
        .process_group(0)
        .envs(env.iter().map(|(k, v)| (k, v)));
    // Born in a cgroup of its own where the node makes them (cgroup.rs).
    let group = if crate::usage::measuring() {
        crate::cgroup::Group::take()
    } else {
        None
    };
    let spawn = |mut cmd: std::process::Command| match &group {
        Some(g) => g.spawn_in(move || {
            let spawned = cmd.spawn();
            (cmd, spawned)
        }),
        None => {
            let spawned = cmd.spawn();
            (cmd, spawned)
        }
    };
    let (mut cmd, mut spawned) = spawn(cmd);
    // A program written here a moment ago (an input staged, fetched or
    // linked) may still be open for writing in a child that another thread
    // was forking meanwhile: it keeps the descriptor until its own exec, and
    // exec of the program fails with ETXTBSY until then.
    let mut tries = 0u64;
    while tries < TEXT_BUSY_TRIES
        && matches!(&spawned, Err(e) if e.raw_os_error() == Some(nix::errno::Errno::ETXTBSY as i32))
    {
        tries += 1;
        tokio::time::sleep(std::time::Duration::from_millis(5 * tries)).await;
        (cmd, spawned) = spawn(cmd);
    }
    // The command holds this side's copies of the pipes' write ends: they
    // must close for the reads to end when the task's side does.
    drop(cmd);
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => {
            let what = match &l.spec.command {
                Command::Argv(a) => a[0].clone(),
                Command::Shell(_) => "/bin/sh".to_string(),
                Command::Python(a) => crate::warm::interpreter(&a[0]),
            };
            return Ended::error(
                format!("could not start `{what}` in {}: {e}", cwd.display()),
                0,
                None,
            );
        }
    };
    let pid = child.id() as i32;
    // Killed with the node, should it die first (see reaper.rs).
    crate::reaper::watch(pid);
    live.pgid.store(pid, Ordering::SeqCst);
    if live.kill_asked.load(Ordering::SeqCst) {
        let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
    }
    let wrote_out = Arc::new(AtomicBool::new(false));
    let wrote_err = Arc::new(AtomicBool::new(false));
    let out = pump(out_r, l.stdout_log.clone(), wrote_out.clone());
    let err = pump(err_r, l.stderr_log.clone(), wrote_err.clone());
    let pipes = async {
        tokio::join!(out, err);
    };
    tokio::pin!(pipes);
    let mut meter = crate::usage::Meter::start(
        pid,
        l.grant.resources.get(MEM).whole(),
        group,
        live.looked.clone(),
    );
    let exited = tokio::select! {
        // The common case: the task's end closes its pipes, and it is
        // reaped then, without a descriptor or a registration of its own.
        _ = &mut pipes => None,
        s = reap(&mut child, EXIT_POLL_FIRST_MS, &mut meter) => Some(s),
    };
    let pipes_closed = exited.is_none();
    let (status, mut usage) = match exited {
        Some(s) => s,
        None => reap(&mut child, 0, &mut meter).await,
    };
    crate::reaper::unwatch(pid);
    if !pipes_closed {
        // A background process of the task may hold the pipes open: stop reading after a grace.
        let _ =
            tokio::time::timeout(std::time::Duration::from_millis(PIPE_DRAIN_MS), &mut pipes).await;
    }
    let logs = (wrote_out.load(Ordering::SeqCst) as u8 * LOG_STDOUT)
        | (wrote_err.load(Ordering::SeqCst) as u8 * LOG_STDERR);
    let result = match status {
        Ok(s) => match (s.code(), s.signal()) {
            (Some(c), _) => TaskResult::Exited(c),
            (None, Some(sig)) => TaskResult::Signaled(sig),
            (None, None) => TaskResult::Error("the task ended without an exit status".into()),
        },
        Err(e) => TaskResult::Error(format!("waiting for the task failed: {e}")),
    };
    // A SIGKILL mesh sent (a timeout, a cancel) is not the kernel's.
    let killed = result == TaskResult::Signaled(Signal::SIGKILL as i32)
        && !live.kill_asked.load(Ordering::SeqCst);
    if let Some(u) = usage.as_mut() {
        u.oom &= killed;
    }
    Ended::with(result, logs, usage)
}

/// Runs a `python` task in a warm worker of its interpreter (see
/// `warm.rs`); where the node has none set up (a test's executor), as a
/// process of its own.
async fn run_warm(
    l: &Launch,
    live: &Live,
    argv: &[String],
    cwd: &Path,
    env: &[(String, String)],
) -> (Ended, Vec<String>) {
    let task = crate::warm::Task {
        argv,
        root: &l.root,
        cwd,
        env,
        stdout_log: &l.stdout_log,
        stderr_log: &l.stderr_log,
        hand: l.hand,
        riding: &l.riding,
        asked: l.grant.resources.get(MEM).whole(),
    };
    let ran = crate::warm::run(task, live.looked.clone(), |pid| {
        live.pgid.store(pid, Ordering::SeqCst);
        if live.kill_asked.load(Ordering::SeqCst) && pid > 0 {
            let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
        }
    })
    .await;
    let logs = log_bits(&l.stdout_log, &l.stderr_log);
    let mut said = Said::default();
    let (result, mut usage) = match ran {
        Ok(crate::warm::Ended::Exited(c, s, u)) => {
            said = s;
            (TaskResult::Exited(c), u)
        }
        Ok(crate::warm::Ended::Died(s, u)) => match (s.code(), s.signal()) {
            (Some(c), _) => (TaskResult::Exited(c), u),
            (None, Some(sig)) => (TaskResult::Signaled(sig), u),
            (None, None) => (
                TaskResult::Error("the Python worker ended without an exit status".into()),
                u,
            ),
        },
        Err(crate::warm::WarmError::NotSetUp) => {
            return (spawn(l, live, cwd, env).await, Vec::new());
        }
        Err(e) => (TaskResult::Error(e.to_string()), None),
    };
    // As for a task of its own: a SIGKILL mesh sent is not the kernel's.
    let killed = result == TaskResult::Signaled(Signal::SIGKILL as i32)
        && !live.kill_asked.load(Ordering::SeqCst);
    if let Some(u) = usage.as_mut() {
        u.oom &= killed;
    }
    let Said { handed, made } = said;
    let ended = Ended {
        result,
        logs,
        handed,
        usage,
    };
    (ended, made)
}

/// Which logs a task run in a worker wrote (the worker writes them itself).
fn log_bits(out: &Path, err: &Path) -> u8 {
    let wrote = |p: &Path| fs::metadata(p).map(|m| m.len() > 0).unwrap_or(false);
    (wrote(out) as u8 * LOG_STDOUT) | (wrote(err) as u8 * LOG_STDERR)
}

/// What a task finds in its environment besides the node's: who it is,
/// what it was granted, its GPUs, then its stage's `env`.
fn task_env(l: &Launch, cwd: &Path) -> Vec<(String, String)> {
    let mut env = vec![
        ("MESH_FARM".to_string(), l.farm_name.clone()),
        ("MESH_TASK_ID".to_string(), l.task_id.clone()),
        ("MESH_ATTEMPT".to_string(), l.attempt.to_string()),
        (
            "MESH_WORKDIR".to_string(),
            cwd.to_string_lossy().into_owned(),
        ),
        (
            "MESH_OUT".to_string(),
            l.out_dir.to_string_lossy().into_owned(),
        ),
    ];
    if !l.node.is_empty() {
        env.push(("MESH_NODE".to_string(), l.node.clone()));
    }
    for (k, v) in l.grant.resources.iter() {
        let value = if k == MEM {
            v.whole().to_string()
        } else {
            v.to_plain()
        };
        env.push((
            format!("MESH_RESOURCE_{}", k.to_ascii_uppercase().replace('-', "_")),
            value,
        ));
    }
    let threads = task_threads(&l.grant).to_string();
    for var in THREAD_VARS {
        // The user's own setting, on the node or in the stage, wins.
        let set = std::env::var_os(var).is_some() || l.spec.env.iter().any(|(k, _)| k == var);
        if !set {
            env.push((var.to_string(), threads.clone()));
        }
    }
    if !l.grant.gpus.is_empty() || !l.gpu_ids.is_empty() {
        let ids: Vec<String> = l
            .grant
            .gpus
            .iter()
            .map(|&g| {
                l.gpu_ids
                    .get(g as usize)
                    .cloned()
                    .unwrap_or_else(|| g.to_string())
            })
            .collect();
        env.push(("CUDA_VISIBLE_DEVICES".to_string(), ids.join(",")));
        env.push(("MESH_GPUS".to_string(), ids.join(",")));
    }
    env.extend(l.spec.env.iter().cloned());
    env
}

/// The threads a task's numeric libraries may start: its granted cores,
/// at least one (a task asking half a core or none still runs one).
pub fn task_threads(grant: &Grant) -> u64 {
    grant.resources.get("cpu").whole().max(1)
}

/// A pipe for a task's stdout or stderr: this side's read end, ready for
/// the runtime (non-blocking), and the task's write end (blocking, as a
/// program expects its output to be).
fn task_pipe() -> io::Result<(pipe::Receiver, OwnedFd)> {
    let (r, w) = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
    // Set outright: a new pipe's read end has no other status flags.
    fcntl(&r, FcntlArg::F_SETFL(OFlag::O_NONBLOCK))?;
    Ok((pipe::Receiver::from_owned_fd_unchecked(r)?, w))
}

/// A task's stdin: a copy of one /dev/null opened for the whole run
/// (opening it anew looked its path up for every task).
fn dev_null() -> io::Result<fs::File> {
    static DEV_NULL: OnceLock<fs::File> = OnceLock::new();
    let f = match DEV_NULL.get() {
        Some(f) => f,
        None => {
            let f = fs::File::open("/dev/null")?;
            DEV_NULL.get_or_init(|| f)
        }
    };
    f.try_clone()
}

/// Waits for the task to end, asking the kernel without blocking. With
/// `first_ms` 0, its pipes have closed: it has exited or is about to (it
/// closes its files a moment before it can be reaped). Otherwise first after
/// `first_ms`, then at doubling intervals: how a task is found that ended
/// while something it started still holds its pipes. Each wake looks at
/// what the task's tree holds (and kills it past its memory limit), and
/// what it used is read once it has exited, before it is reaped (see
/// `usage.rs`): `None` where that could not be read.
async fn reap(
    child: &mut std::process::Child,
    first_ms: u64,
    meter: &mut crate::usage::Meter,
) -> (io::Result<ExitStatus>, Option<Usage>) {
    if first_ms == 0 {
        for _ in 0..EXIT_YIELDS {
            if let Some(ended) = reap_exited(child, meter) {
                return ended;
            }
            // An exiting process runs for microseconds between closing
            // its files and becoming reapable: let it, before any timer.
            std::thread::yield_now();
        }
    }
    let mut wait_ms = first_ms;
    loop {
        if wait_ms > 0 {
            tokio::time::sleep(std::time::Duration::from_millis(wait_ms)).await;
            if meter.sample() {
                // Past its memory ask (see usage.rs): the whole group goes.
                let _ = killpg(Pid::from_raw(child.id() as i32), Signal::SIGKILL);
            }
        }
        if let Some(ended) = reap_exited(child, meter) {
            return ended;
        }
        wait_ms = (wait_ms * 2).clamp(1, EXIT_POLL_MAX_MS);
    }
}

/// Reaps the leader if it has exited, what it used read first.
fn reap_exited(
    child: &mut std::process::Child,
    meter: &crate::usage::Meter,
) -> Option<(io::Result<ExitStatus>, Option<Usage>)> {
    use nix::sys::wait::{waitid, Id, WaitPidFlag, WaitStatus};
    let pid = Pid::from_raw(child.id() as i32);
    let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
    let usage = if meter.on() {
        match waitid(Id::Pid(pid), flags) {
            Ok(WaitStatus::StillAlive) => return None,
            // A zombie now: its counts, its waited children's included,
            // stay readable until it is reaped.
            Ok(WaitStatus::Signaled(_, Signal::SIGKILL, _)) => Some(meter.finish(true)),
            Ok(_) => Some(meter.finish(false)),
            Err(_) => None,
        }
    } else {
        None
    };
    match child.try_wait() {
        Ok(Some(s)) => Some((Ok(s), usage)),
        Ok(None) => None,
        Err(e) => Some((Err(e), None)),
    }
}

/// Copies a task's pipe into `path`, creating the file only when bytes arrive.
async fn pump(mut pipe: pipe::Receiver, path: PathBuf, wrote: Arc<AtomicBool>) {
    // Read into spare capacity: most tasks write nothing, and zeroing two
    // chunks per task cost more than reading their pipes.
    let mut buf = Vec::with_capacity(PIPE_CHUNK_BYTES);
    let mut file: Option<fs::File> = None;
    loop {
        buf.clear();
        match pipe.read_buf(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        if file.is_none() {
            file = open_log(&path).ok();
        }
        if let Some(f) = file.as_mut() {
            if f.write_all(&buf).is_ok() {
                wrote.store(true, Ordering::SeqCst);
            }
        }
    }
}

fn open_log(path: &Path) -> io::Result<fs::File> {
    let open = || {
        fs::OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .open(path)
    };
    match open() {
        Ok(f) => Ok(f),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            if let Some(dir) = path.parent() {
                fs::create_dir_all(dir)?;
            }
            open()
        }
        Err(e) => Err(e),
    }
}

/// Why an attempt's inputs were not staged or its outputs not collected:
/// the task fails with these words.
#[derive(Debug, thiserror::Error)]
enum FilesError {
    #[error("could not create workdir {}: {source}", .path.display())]
    Workdir { path: PathBuf, source: io::Error },
    #[error("could not create {}: {source}", .path.display())]
    Create { path: PathBuf, source: io::Error },
    #[error("input `{input}` does not exist (looked for {})", .path.display())]
    NoInput { input: String, path: PathBuf },
    #[error("could not stage input `{input}` into {}: {source}", .cwd.display())]
    Stage {
        input: String,
        cwd: PathBuf,
        source: io::Error,
    },
    #[error("bad output pattern `{pattern}`: {source}")]
    Pattern {
        pattern: String,
        source: glob::PatternError,
    },
    #[error("output `{pattern}` was not produced (looked for {})", .path.display())]
    NoOutput { pattern: String, path: PathBuf },
    #[error("could not replace output {}: {source}", .path.display())]
    Replace { path: PathBuf, source: io::Error },
    #[error("could not collect output {}: {source}", .path.display())]
    Collect { path: PathBuf, source: io::Error },
}

/// Creates the workdir and copies inputs into it, keeping their relative paths.
/// `work` on a blocking thread, or here when it is `cheap`: a thread for
/// each thin call's look at its inputs and one for its nothing to collect
/// were a third of the node's time.
async fn blocking_unless<T: Send + 'static>(
    cheap: bool,
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, tokio::task::JoinError> {
    if cheap {
        Ok(work())
    } else {
        tokio::task::spawn_blocking(work).await
    }
}

fn stage(root: &Path, cwd: &Path, inputs: &[String], staged: bool) -> Result<(), FilesError> {
    if staged {
        fs::create_dir_all(cwd).map_err(|source| FilesError::Workdir {
            path: cwd.to_path_buf(),
            source,
        })?;
    }
    for input in inputs {
        let src = root.join(input);
        if !src.is_file() {
            return Err(FilesError::NoInput {
                input: input.clone(),
                path: src,
            });
        }
        if !staged {
            continue;
        }
        let dst = cwd.join(input);
        if let Some(dir) = dst.parent() {
            fs::create_dir_all(dir).map_err(|source| FilesError::Create {
                path: dir.to_path_buf(),
                source,
            })?;
        }
        fs::copy(&src, &dst).map_err(|source| FilesError::Stage {
            input: input.clone(),
            cwd: cwd.to_path_buf(),
            source,
        })?;
    }
    Ok(())
}

fn is_pattern(output: &str) -> bool {
    output.contains(['*', '?', '['])
}

/// A file as it was: the same inode, size and modification time is a file
/// nobody wrote since.
type Seen = (u64, u64, i64, i64);

fn seen(m: &fs::Metadata) -> Seen {
    use std::os::unix::fs::MetadataExt;
    (m.ino(), m.size(), m.mtime(), m.mtime_nsec())
}

/// Every file the output patterns match in `cwd` before the task runs.
fn matched_before(cwd: &Path, outputs: &[String]) -> HashMap<PathBuf, Seen> {
    let mut found = HashMap::new();
    for pattern in outputs.iter().filter(|p| is_pattern(p)) {
        let Ok(paths) = glob::glob(&cwd.join(pattern).to_string_lossy()) else {
            continue;
        };
        for p in paths.flatten() {
            if let Ok(m) = fs::metadata(&p) {
                if m.is_file() {
                    found.insert(p, seen(&m));
                }
            }
        }
    }
    found
}

/// Copies outputs (paths or glob patterns, relative to the workdir) into
/// `dest`, which then holds them and nothing else: what an earlier run
/// left there goes. A plain path that is missing fails the task; a pattern
/// may match nothing, and collects only the files this run made or changed
/// (`before` is what it matched before the run): a file an earlier run
/// left in the workdir (a chromosome dropped from the farm) is not this
/// run's output. Those `own`, made only to be outputs (a warm worker said
/// so), are moved there instead, where the two folders are on one file
/// system.
fn collect(
    cwd: &Path,
    dest: &Path,
    outputs: &[String],
    own: &[String],
    before: &HashMap<PathBuf, Seen>,
) -> Result<(), FilesError> {
    let mut made = HashSet::new();
    let mut kept = HashSet::new();
    // A folder made now holds only what is put in it now: nothing of an
    // earlier run to look for (a thin call's folder is new, and listing it
    // was 3% of the node's time).
    let was = dest.symlink_metadata().is_ok();
    for pattern in outputs {
        let is_glob = is_pattern(pattern);
        let matches: Vec<PathBuf> = if is_glob {
            let full = cwd.join(pattern);
            glob::glob(&full.to_string_lossy())
                .map_err(|source| FilesError::Pattern {
                    pattern: pattern.clone(),
                    source,
                })?
                .filter_map(Result::ok)
                .filter(|p| {
                    fs::metadata(p).is_ok_and(|m| m.is_file() && before.get(p) != Some(&seen(&m)))
                })
                .collect()
        } else {
            let p = cwd.join(pattern);
            if !p.is_file() {
                return Err(FilesError::NoOutput {
                    pattern: pattern.clone(),
                    path: p,
                });
            }
            vec![p]
        };
        for src in matches {
            let rel = src.strip_prefix(cwd).unwrap_or(&src);
            let dst = dest.join(rel);
            if let Some(dir) = dst.parent() {
                if made.insert(dir.to_path_buf()) {
                    fs::create_dir_all(dir).map_err(|source| FilesError::Create {
                        path: dir.to_path_buf(),
                        source,
                    })?;
                }
            }
            // Unlinked first, not written through: an earlier run's output
            // there may be linked into another `--out` folder (see `results`).
            match fs::remove_file(&dst) {
                Err(source) if source.kind() != io::ErrorKind::NotFound => {
                    return Err(FilesError::Replace { path: dst, source })
                }
                _ => {}
            }
            let moved = own.contains(pattern) && fs::rename(&src, &dst).is_ok();
            if !moved {
                fs::copy(&src, &dst).map_err(|source| FilesError::Collect {
                    path: src.clone(),
                    source,
                })?;
            }
            kept.insert(rel.to_string_lossy().into_owned());
        }
    }
    if !was {
        return Ok(());
    }
    let keep = kept.iter().map(String::as_str).collect();
    crate::results::prune(dest, &keep).map_err(|source| FilesError::Replace {
        path: dest.to_path_buf(),
        source,
    })
}
