//! Warm Python workers: a task whose stage says `python` runs in an interpreter kept alive between tasks, so a thin task pays no interpreter start and no re-import.
//!
//! A worker is `python warm.py` (the script embedded here, written once
//! into the node's state folder), one task at a time: the node writes the
//! task (script, arguments, folder, environment, log files) as a line on
//! its stdin and reads its exit code back, with the small outputs the
//! script handed back instead of writing files (a Python call's value:
//! a file made per call was most of a thin call's cost). Workers are kept per
//! interpreter, per set of GPUs (`CUDA_VISIBLE_DEVICES` counts only
//! when a process starts), per thread count (a numeric library sizes its
//! pool once, at import) and per farm folder (a client's calls, or a
//! farm's tasks, never meet modules another one imported: a package
//! upgraded between two runs is imported anew, as a Dask cluster of each
//! run would), taken by a task for its run, given back after it, and
//! stopped after `IDLE_MAX` unused or once more than `idle_total_max`
//! wait (the least recently used first). Each is its own process group:
//! a kill of the task (a timeout, a cancel) kills the worker and all it
//! started, and the next task gets a fresh one.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use mesh_protocol::engine::Usage;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout};

use crate::usage::Totals;

/// The worker's own code.
const SCRIPT: &str = include_str!("warm.py");
/// A worker unused this long is stopped.
const IDLE_MAX: Duration = Duration::from_secs(60);
/// Idle workers kept per kind, at most.
const IDLE_PER_KIND: usize = 64;
/// How long a worker sent SIGKILL is given to be dead before what it used
/// is read, in ms: it is read only dead, when its counts include
/// everything it did.
const DEATH_WAIT_MS: u32 = 100;

/// Idle workers kept in all: twice the machine's cores, so that the
/// workers of farms that ended give way to a new farm's.
fn idle_total_max() -> usize {
    // Asked once: the standard library reads the cgroup's files each time,
    // which was a tenth of the node's time for thin calls.
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(2, |n| n.get())) * 2
}

/// Where the script is, and which Python a node's `--python` says.
struct Setup {
    script: PathBuf,
    python: Option<String>,
}

static SETUP: OnceLock<Setup> = OnceLock::new();
static IDLE: OnceLock<Mutex<HashMap<Kind, Vec<Worker>>>> = OnceLock::new();

/// What makes workers interchangeable.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Kind {
    python: String,
    gpus: Option<String>,
    /// The task's thread variables (`OMP_NUM_THREADS`, ...), as set.
    threads: Vec<(String, String)>,
    /// The farm's folder on this node.
    root: PathBuf,
}

struct Worker {
    child: Child,
    /// Its process id, its group's: watched until it is dropped.
    pid: i32,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    used: Instant,
    /// What it had used in all when it last answered (see `usage::Call`).
    totals: Option<Totals>,
}

impl Drop for Worker {
    fn drop(&mut self) {
        crate::reaper::unwatch(self.pid);
    }
}

#[derive(Serialize)]
struct Request<'a> {
    argv: &'a [String],
    cwd: &'a Path,
    env: HashMap<&'a str, &'a str>,
    out: &'a Path,
    err: &'a Path,
    /// The most bytes an output handed back may have.
    hand: usize,
    /// The outputs of its dependencies that rode with the log, base64 by
    /// their path under `{out}`.
    #[serde(skip_serializing_if = "HashMap::is_empty")]
    riding: HashMap<&'a str, String>,
}

#[derive(Deserialize)]
struct Answer {
    code: i32,
    /// Outputs handed back, base64 by name.
    #[serde(default)]
    handed: HashMap<String, String>,
    /// Outputs written only to be outputs, by name.
    #[serde(default)]
    made: Vec<String>,
    /// What the run used itself: CPU ms, peak memory above what the
    /// worker held before it, bytes read, bytes written (none where the
    /// node does not measure).
    used: Option<[u64; 4]>,
    /// The worker's totals after it: CPU ms, bytes read, bytes written,
    /// resident memory.
    worker: Option<[u64; 4]>,
}

/// Makes warm workers possible on this node: the script is written into
/// `state`; `python` (the node's `--python`) runs every Python task.
pub fn init(state: &Path, python: Option<String>) -> io::Result<()> {
    if SETUP.get().is_some() {
        return Ok(());
    }
    std::fs::create_dir_all(state)?;
    let script = state.join("warm.py");
    let tmp = state.join(format!(".warm.py.{}", std::process::id()));
    std::fs::write(&tmp, SCRIPT)?;
    std::fs::rename(&tmp, &script)?;
    let _ = SETUP.set(Setup { script, python });
    Ok(())
}

/// The interpreter a task's `python` command runs in here: the node's
/// `--python`, else the one it names where this machine has it (a path
/// that exists, or a name on PATH), else `python3`.
pub fn interpreter(named: &str) -> String {
    if let Some(p) = SETUP.get().and_then(|s| s.python.clone()) {
        return p;
    }
    let here = if named.contains('/') {
        Path::new(named).is_file()
    } else {
        which::which(named).is_ok()
    };
    if here {
        named.to_string()
    } else {
        "python3".to_string()
    }
}

/// Outputs a script handed back instead of writing them: name, bytes.
pub type Handed = Vec<(String, Vec<u8>)>;

/// A task's dependencies' outputs that rode with the log: path under
/// `{out}`, bytes.
pub type Riding = Vec<(String, Vec<u8>)>;

/// What a script said of its outputs: those it handed back, and the
/// files it wrote only to be outputs (`mesh_warm.made`: a Python call's
/// big value), which the node moves rather than copies.
#[derive(Default)]
pub struct Said {
    pub handed: Handed,
    pub made: Vec<String>,
}

/// How a run in a worker ended, with what it used (see `usage::Call`):
/// none where the node does not measure, or a dead worker could not be
/// read.
pub enum Ended {
    /// Its exit code, and what it said of its outputs.
    Exited(i32, Said, Option<Usage>),
    /// The worker died (killed, or the script ended its process); the
    /// status it died with.
    Died(std::process::ExitStatus, Option<Usage>),
}

/// Why a task could not run in a worker.
#[derive(Debug, thiserror::Error)]
pub enum WarmError {
    #[error("warm Python workers are not set up on this node")]
    NotSetUp,
    #[error("could not start `{python}`: {source}")]
    Start { python: String, source: io::Error },
    #[error("talking to the Python worker: {0}")]
    Pipe(#[from] io::Error),
    #[error("the Python worker handed back `{0}` unreadable")]
    Handed(String),
}

/// A task as a warm worker runs it: what the executor hands over.
pub struct Task<'a> {
    /// `[python, script, args...]`.
    pub argv: &'a [String],
    /// The farm's folder: workers are kept per folder (see `Kind`).
    pub root: &'a Path,
    pub cwd: &'a Path,
    pub env: &'a [(String, String)],
    pub stdout_log: &'a Path,
    pub stderr_log: &'a Path,
    /// The most bytes an output the script hands back may have.
    pub hand: usize,
    /// Its dependencies' outputs that rode with the log, which the script
    /// finds in memory.
    pub riding: &'a Riding,
    /// The memory the task asked for, in bytes (see `usage::Call`).
    pub asked: u64,
}

/// Runs `task` in a warm worker of its farm's folder; `started` is told
/// the worker's process id (its group's) before the task runs, and the
/// looks at the running call are left in `looked`.
pub async fn run(
    task: Task<'_>,
    looked: std::sync::Arc<crate::usage::Looked>,
    started: impl FnOnce(i32),
) -> Result<Ended, WarmError> {
    let Task {
        argv,
        root,
        cwd,
        env,
        stdout_log,
        stderr_log,
        hand,
        riding,
        asked,
    } = task;
    let setup = SETUP.get().ok_or(WarmError::NotSetUp)?;
    let gpus = env
        .iter()
        .find(|(k, _)| k == "CUDA_VISIBLE_DEVICES")
        .map(|(_, v)| v.clone());
    let threads = env
        .iter()
        .filter(|(k, _)| k.ends_with("_NUM_THREADS"))
        .cloned()
        .collect();
    let kind = Kind {
        python: interpreter(&argv[0]),
        gpus,
        threads,
        root: root.to_path_buf(),
    };
    let mut w = match take(&kind) {
        Some(w) => w,
        None => start(&kind, &setup.script)?,
    };
    started(w.pid);
    let req = Request {
        argv: &argv[1..],
        cwd,
        env: env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect(),
        out: stdout_log,
        err: stderr_log,
        hand,
        riding: riding
            .iter()
            .map(|(path, data)| {
                use base64::Engine as _;
                (
                    path.as_str(),
                    base64::engine::general_purpose::STANDARD.encode(data),
                )
            })
            .collect(),
    };
    let mut line = serde_json::to_vec(&req).map_err(io::Error::other)?;
    line.push(b'\n');
    let mut answer = String::new();
    let mut meter = crate::usage::Call::start(w.pid, w.totals, asked, looked);
    let talk = async {
        w.stdin.write_all(&line).await?;
        w.stdin.flush().await?;
        w.stdout.read_line(&mut answer).await
    };
    let talked = tokio::select! {
        t = talk => t,
        never = looks(&mut meter, w.pid) => match never {},
    };
    match talked {
        Ok(n) if n > 0 => {
            let a: Answer = serde_json::from_str(&answer).map_err(io::Error::other)?;
            let usage = a.used.map(|[cpu_ms, peak_rss, read_bytes, written_bytes]| {
                meter.told(Usage {
                    cpu_ms,
                    peak_rss,
                    read_bytes,
                    written_bytes,
                    oom: false,
                })
            });
            w.totals = a
                .worker
                .map(|[cpu_ms, read_bytes, written_bytes, rss]| Totals {
                    cpu_ms,
                    read_bytes,
                    written_bytes,
                    rss,
                });
            w.used = Instant::now();
            give_back(kind, w);
            let mut handed = Vec::with_capacity(a.handed.len());
            for (name, b64) in a.handed {
                use base64::Engine as _;
                match base64::engine::general_purpose::STANDARD.decode(b64) {
                    Ok(bytes) if hand > 0 && bytes.len() <= hand => handed.push((name, bytes)),
                    _ => return Err(WarmError::Handed(name)),
                }
            }
            Ok(Ended::Exited(
                a.code,
                Said {
                    handed,
                    made: a.made,
                },
                usage,
            ))
        }
        // The worker is gone: killed with the task, or the script ended
        // the process itself.
        _ => {
            let _ = w.child.start_kill();
            let usage = match meter.on() {
                true => exited(w.pid).await.map(|k| meter.died(k, w.totals)),
                false => None,
            };
            let status = w.child.wait().await?;
            Ok(Ended::Died(status, usage))
        }
    }
}

/// Looks at a call's worker and what it started while the call runs, at
/// the times the executor looks at a task of its own (10 ms after the
/// start, then at doubling intervals up to 250 ms): a thin call is never
/// looked at, and costs no read of `/proc` here. A call past its ask
/// (see `usage::Call`) is killed with its worker's group.
async fn looks(meter: &mut crate::usage::Call, pid: i32) -> std::convert::Infallible {
    use crate::usage::{EXIT_POLL_FIRST_MS, EXIT_POLL_MAX_MS};
    use nix::sys::signal::{killpg, Signal};
    let mut wait_ms = EXIT_POLL_FIRST_MS;
    loop {
        tokio::time::sleep(Duration::from_millis(wait_ms)).await;
        if meter.sample() && pid > 0 {
            let _ = killpg(nix::unistd::Pid::from_raw(pid), Signal::SIGKILL);
        }
        wait_ms = (wait_ms * 2).min(EXIT_POLL_MAX_MS);
    }
}

/// Waits for a worker that was sent SIGKILL to have exited, leaving it
/// unreaped so that its counts can still be read: whether SIGKILL is what
/// it died of. None where it is not dead within `DEATH_WAIT_MS` (a process
/// stuck in the kernel), or cannot be asked.
async fn exited(pid: i32) -> Option<bool> {
    use nix::sys::signal::Signal;
    use nix::sys::wait::{waitid, Id, WaitPidFlag, WaitStatus};
    let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
    for _ in 0..DEATH_WAIT_MS {
        match waitid(Id::Pid(nix::unistd::Pid::from_raw(pid)), flags) {
            Ok(WaitStatus::StillAlive) => tokio::time::sleep(Duration::from_millis(1)).await,
            Ok(WaitStatus::Signaled(_, Signal::SIGKILL, _)) => return Some(true),
            Ok(_) => return Some(false),
            Err(_) => return None,
        }
    }
    None
}

fn start(kind: &Kind, script: &Path) -> Result<Worker, WarmError> {
    let mut cmd = tokio::process::Command::new(&kind.python);
    cmd.arg(script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .process_group(0)
        .kill_on_drop(true);
    if let Some(g) = &kind.gpus {
        cmd.env("CUDA_VISIBLE_DEVICES", g);
    }
    // Set from the start: a library may read them at import, before the
    // first task's environment is applied.
    cmd.envs(kind.threads.iter().map(|(k, v)| (k, v)));
    let mut child = cmd.spawn().map_err(|source| WarmError::Start {
        python: kind.python.clone(),
        source,
    })?;
    let stdin = child.stdin.take().expect("piped");
    let stdout = BufReader::new(child.stdout.take().expect("piped"));
    let pid = child.id().map_or(0, |p| p as i32);
    // Killed with the node, should it die first (see reaper.rs).
    crate::reaper::watch(pid);
    Ok(Worker {
        child,
        pid,
        stdin,
        stdout,
        used: Instant::now(),
        totals: None,
    })
}

fn idle() -> std::sync::MutexGuard<'static, HashMap<Kind, Vec<Worker>>> {
    IDLE.get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

/// An idle worker of this kind that is still alive; stale ones go.
fn take(kind: &Kind) -> Option<Worker> {
    let mut idle = idle();
    let now = Instant::now();
    for ws in idle.values_mut() {
        // Dropped: killed (kill_on_drop) and reaped by the runtime.
        ws.retain(|w| now.duration_since(w.used) < IDLE_MAX);
    }
    let ws = idle.get_mut(kind)?;
    while let Some(mut w) = ws.pop() {
        if matches!(w.child.try_wait(), Ok(None)) {
            return Some(w);
        }
    }
    None
}

fn give_back(kind: Kind, w: Worker) {
    let mut idle = idle();
    let ws = idle.entry(kind).or_default();
    if ws.len() < IDLE_PER_KIND {
        ws.push(w);
    }
    // Over the total: the least recently used goes (dropped: killed).
    while idle.values().map(Vec::len).sum::<usize>() > idle_total_max() {
        let oldest = idle
            .iter()
            .flat_map(|(k, ws)| ws.iter().enumerate().map(move |(i, w)| (w.used, k, i)))
            .min_by_key(|(used, ..)| *used)
            .map(|(_, k, i)| (k.clone(), i));
        let Some((k, i)) = oldest else { break };
        if let Some(ws) = idle.get_mut(&k) {
            ws.remove(i);
            if ws.is_empty() {
                idle.remove(&k);
            }
        }
    }
}
