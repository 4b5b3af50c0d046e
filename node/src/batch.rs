//! The batch-system side of allocation queues: the SLURM and PBS job scripts that start a mesh node, and reading what `sbatch`, `squeue`, `qsub` and `qstat` print.
//!
//! The decisions (when to submit, cancel or drain) are `mesh_protocol::alloc`;
//! this module only speaks the batch systems' languages.

use std::fmt::Write as _;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use mesh_protocol::alloc::{BatchSystem, JobState, QueueDef};
use mesh_protocol::mesh::Listed;

/// Jobs at least this long get SLURM's SIGTERM a minute before their end.
const SIGNAL_FROM_S: u64 = 600;

/// Where the script's node joins, and how it runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Launch {
    /// The `mesh` binary, as an absolute path on the cluster's shared filesystem.
    pub mesh: String,
    /// Multiaddrs of nodes of the mesh to join, comma-separated.
    pub join: String,
    /// The mesh secret, readable from the compute nodes.
    pub key: String,
    /// A folder for each node's state; the job id and the node's rank are added.
    pub state_root: String,
    /// Where the batch system writes the job's output.
    pub log_dir: String,
    /// The mesh's part of every job's name (see [`job_name`]).
    pub tag: String,
}

impl Launch {
    /// A job of queue `queue` whose node joins `join`, for a mesh node
    /// with state folder `state`: each job's node keeps its state under
    /// `alloc/nodes/` there, and the batch system writes under
    /// `alloc/<queue>/`.
    pub fn new(
        mesh: String,
        join: String,
        key: String,
        state: &Path,
        queue: &str,
        tag: String,
    ) -> Launch {
        let alloc = state.join("alloc");
        Launch {
            mesh,
            join,
            key,
            state_root: alloc.join("nodes").display().to_string(),
            log_dir: alloc.join(queue).display().to_string(),
            tag,
        }
    }
}

/// What a script printed with no node running (`mesh alloc add
/// --dry-run`) has in place of the mesh's addresses, which only a
/// running node knows.
pub const NO_NODE_JOIN: &str = "ADDR";
/// What it has in place of the mesh's part of job names when the mesh
/// key cannot be read.
pub const NO_NODE_TAG: &str = "mesh-TAG";

/// [`script`] as printed with no node running: what only a node (or the
/// mesh key) knows is a placeholder, and a comment under the first line
/// says which and what to put there.
pub fn script_without_node(q: &QueueDef, l: &Launch) -> String {
    let s = script(q, l);
    let (first, rest) = s.split_once('\n').unwrap_or((&s, ""));
    let mut note = format!(
        "# Printed without a running node: {NO_NODE_JOIN} stands for the address of a node\n\
         # of the mesh (comma-separated, as `mesh node` prints it). With a node running\n\
         # (or with --mesh ADDR), `mesh alloc add --dry-run` prints it filled in.\n"
    );
    if l.tag == NO_NODE_TAG {
        let _ = writeln!(
            note,
            "# {NO_NODE_TAG} stands for the mesh's tag (from its key, {}: `mesh init` creates it).",
            l.key
        );
    }
    format!("{first}\n{note}{rest}")
}

/// A job's name: the mesh (`tag`, from its key) and the queue, so that a
/// coordinator elected after one that died finds the jobs it submitted in
/// `squeue`/`qstat`, whether or not they reached the book.
pub fn job_name(tag: &str, queue: &str) -> String {
    format!("{tag}-{queue}")
}

/// The queue a job's name says it belongs to, if it is this mesh's.
fn queue_of<'a>(tag: &str, name: &'a str) -> Option<&'a str> {
    name.strip_prefix(tag)?.strip_prefix('-')
}

/// `H:MM:SS` for a number of seconds (both SLURM and PBS read it).
fn hms(s: u64) -> String {
    format!("{}:{:02}:{:02}", s / 3600, (s / 60) % 60, s % 60)
}

/// Megabytes, rounded up: both systems take memory in whole units.
fn mb(bytes: u64) -> u64 {
    bytes.div_ceil(1024 * 1024)
}

/// The job script for one job of `q`.
pub fn script(q: &QueueDef, l: &Launch) -> String {
    // A job starts wherever the batch system puts it: a path relative to
    // this node's folder would name nothing there.
    let l = &Launch {
        mesh: l.mesh.clone(),
        join: l.join.clone(),
        key: absolute(&l.key),
        state_root: absolute(&l.state_root),
        log_dir: absolute(&l.log_dir),
        tag: l.tag.clone(),
    };
    match q.system {
        BatchSystem::Slurm => slurm(q, l),
        BatchSystem::Pbs => pbs(q, l),
    }
}

/// `path` made absolute against this process's folder (no filesystem access).
fn absolute(path: &str) -> String {
    std::path::absolute(path).map_or_else(|_| path.to_owned(), |p| p.display().to_string())
}

fn header_common(out: &mut String, q: &QueueDef) {
    let _ = writeln!(out, "#!/bin/bash");
    let _ = writeln!(
        out,
        "# A mesh node for allocation queue `{}`, written by `mesh alloc`.",
        q.name
    );
}

/// The shell that follows the header: the prologue, then the node, which
/// drains before the walltime (`--walltime`) so that no task is killed by it.
/// `alloc_job`: the shell expression of the job's id as the batch
/// system lists it (an array element's own id), which the node gossips so
/// the coordinator knows which job it belongs to.
#[allow(clippy::too_many_arguments)]
fn body(
    out: &mut String,
    q: &QueueDef,
    l: &Launch,
    run: &str,
    resources: &str,
    rank: &str,
    job: &str,
    alloc_job: &[&str],
) {
    let _ = writeln!(out, "set -eu");
    for line in alloc_job {
        let _ = writeln!(out, "export MESH_ALLOC_JOB=\"{line}\"");
    }
    for line in &q.prologue {
        let _ = writeln!(out, "{line}");
    }
    let run = if run.is_empty() {
        String::new()
    } else {
        format!("{run} ")
    };
    let _ = writeln!(
        out,
        "{run}sh -c 'exec \"{mesh}\" --state-dir \"{root}/{job}-{rank}\" join \"{join}\" --key \"{key}\" --listen /ip4/0.0.0.0/tcp/0 --resources \"{resources}\" --walltime {time}s'",
        mesh = l.mesh,
        root = l.state_root,
        join = l.join,
        key = l.key,
        time = q.time_limit_s,
    );
}

fn slurm(q: &QueueDef, l: &Launch) -> String {
    let mut s = String::new();
    header_common(&mut s, q);
    let d = |s: &mut String, line: String| {
        let _ = writeln!(s, "#SBATCH {line}");
    };
    d(&mut s, format!("--job-name={}", job_name(&l.tag, &q.name)));
    d(&mut s, format!("--time={}", hms(q.time_limit_s)));
    d(&mut s, format!("--nodes={}", q.nodes_per_job.max(1)));
    d(&mut s, "--ntasks-per-node=1".into());
    d(&mut s, format!("--cpus-per-task={}", q.cores));
    if let Some(m) = q.mem_bytes {
        d(&mut s, format!("--mem={}M", mb(m)));
    }
    if q.gpus > 0 {
        d(&mut s, format!("--gres=gpu:{}", q.gpus));
    }
    if let Some(p) = &q.partition {
        d(&mut s, format!("--partition={p}"));
    }
    if let Some(a) = &q.account {
        d(&mut s, format!("--account={a}"));
    }
    d(&mut s, format!("--output={}/%x-%j.out", l.log_dir));
    // A backstop to the node's own drain before its walltime: SIGTERM to
    // the job's steps a minute before, and the node hands its tasks back
    // as on Ctrl-C. SLURM may send it up to a minute early, so a short
    // job relies on the drain alone.
    if q.time_limit_s >= SIGNAL_FROM_S {
        d(&mut s, "--signal=TERM@60".into());
    }
    for extra in &q.directives {
        let _ = writeln!(s, "{}", directive_line("#SBATCH", extra));
    }
    // The node's resources, as the batch system granted them.
    let mut res = "cpu=$SLURM_CPUS_PER_TASK".to_string();
    if q.mem_bytes.is_some() {
        res.push_str(",mem=${SLURM_MEM_PER_NODE}MiB");
    }
    if q.gpus > 0 {
        let _ = write!(res, ",gpu={}", q.gpus);
    }
    body(
        &mut s,
        q,
        l,
        "srun --ntasks-per-node=1",
        &res,
        "$SLURM_PROCID",
        "$SLURM_JOB_ID",
        &[
            "${SLURM_ARRAY_JOB_ID:+${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}}",
            "${MESH_ALLOC_JOB:-$SLURM_JOB_ID}",
        ],
    );
    s
}

fn pbs(q: &QueueDef, l: &Launch) -> String {
    let mut s = String::new();
    header_common(&mut s, q);
    let d = |s: &mut String, line: String| {
        let _ = writeln!(s, "#PBS {line}");
    };
    d(&mut s, format!("-N {}", job_name(&l.tag, &q.name)));
    d(&mut s, format!("-l walltime={}", hms(q.time_limit_s)));
    let mut select = format!("select={}:ncpus={}", q.nodes_per_job.max(1), q.cores);
    if let Some(m) = q.mem_bytes {
        let _ = write!(select, ":mem={}mb", mb(m));
    }
    if q.gpus > 0 {
        let _ = write!(select, ":ngpus={}", q.gpus);
    }
    d(&mut s, format!("-l {select}"));
    if let Some(p) = &q.partition {
        d(&mut s, format!("-q {p}"));
    }
    if let Some(a) = &q.account {
        d(&mut s, format!("-A {a}"));
    }
    d(&mut s, "-j oe".into());
    d(&mut s, format!("-o {}", l.log_dir));
    for extra in &q.directives {
        let _ = writeln!(s, "{}", directive_line("#PBS", extra));
    }
    let mut res = "cpu=$NCPUS".to_string();
    if let Some(m) = q.mem_bytes {
        let _ = write!(res, ",mem={}MiB", mb(m));
    }
    if q.gpus > 0 {
        let _ = write!(res, ",gpu={}", q.gpus);
    }
    // One node per host of the job: pbsdsh runs the line once per host
    // (PBS_VNODENUM numbers them).
    let run = if q.nodes_per_job > 1 {
        "pbsdsh -u --"
    } else {
        ""
    };
    let rank = if q.nodes_per_job > 1 {
        "$PBS_VNODENUM"
    } else {
        "0"
    };
    body(&mut s, q, l, run, &res, rank, "$PBS_JOBID", &["$PBS_JOBID"]);
    s
}

/// A directive as the user gave it: with its prefix added when missing.
fn directive_line(prefix: &str, given: &str) -> String {
    let g = given.trim();
    if g.starts_with('#') {
        g.to_string()
    } else {
        format!("{prefix} {g}")
    }
}

/// The command that submits `jobs` jobs of a script file: one job array
/// where there are more than one.
pub fn submit_command(system: BatchSystem, script: &str, jobs: u32) -> Vec<String> {
    let mut c: Vec<String> = match system {
        BatchSystem::Slurm => vec!["sbatch".into(), "--parsable".into()],
        BatchSystem::Pbs => vec!["qsub".into()],
    };
    if jobs > 1 {
        match system {
            BatchSystem::Slurm => c.push(format!("--array=1-{jobs}")),
            BatchSystem::Pbs => c.extend(["-J".into(), format!("1-{jobs}")]),
        }
    }
    c.push(script.into());
    c
}

/// The job id in what `sbatch --parsable` or `qsub` printed.
pub fn parse_submitted(system: BatchSystem, stdout: &str) -> Result<String, BatchError> {
    let line = stdout.lines().map(str::trim).find(|l| !l.is_empty());
    let Some(line) = line else {
        return Err(BatchError::NoJobId);
    };
    let id = match system {
        // `12345` or `12345;cluster`.
        BatchSystem::Slurm => line.split(';').next().unwrap_or(line),
        // `1234.server` or `1234[].server` for an array.
        BatchSystem::Pbs => line,
    };
    let digits = id
        .trim_start()
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_digit());
    if digits {
        Ok(id.to_string())
    } else {
        Err(BatchError::NotJobId(line.to_string()))
    }
}

/// The ids of the jobs one submission made: an array's elements as the
/// batch system lists them (`12_1`, `1234[1].server`), or the one job.
pub fn array_ids(system: BatchSystem, id: &str, jobs: u32) -> Vec<String> {
    if jobs <= 1 {
        return vec![id.to_string()];
    }
    (1..=jobs)
        .map(|i| match system {
            BatchSystem::Slurm => format!("{id}_{i}"),
            BatchSystem::Pbs => match id.split_once("[]") {
                Some((head, tail)) => format!("{head}[{i}]{tail}"),
                None => format!("{id}[{i}]"),
            },
        })
        .collect()
}

/// The command that asks for the state of these jobs.
pub fn poll_command(system: BatchSystem, ids: &[String]) -> Vec<String> {
    match system {
        BatchSystem::Slurm => vec![
            "squeue".into(),
            "--noheader".into(),
            "--array".into(),
            "--format=%i %T".into(),
            format!("--jobs={}", ids.join(",")),
        ],
        BatchSystem::Pbs => {
            // `-t`: an array's subjobs, each with its own state.
            let mut c = vec!["qstat".into(), "-x".into(), "-f".into(), "-t".into()];
            c.extend(ids.iter().cloned());
            c
        }
    }
}

/// Each job's state in what `squeue` or `qstat -f` printed.
pub fn parse_states(system: BatchSystem, stdout: &str) -> Vec<(String, JobState)> {
    match system {
        BatchSystem::Slurm => stdout
            .lines()
            .filter_map(|l| {
                let mut w = l.split_whitespace();
                let (id, state) = (w.next()?, w.next()?);
                Some((id.to_string(), slurm_state(state)))
            })
            .collect(),
        BatchSystem::Pbs => qstat_jobs(stdout)
            .into_iter()
            .map(|(id, state, _)| (id, state))
            .collect(),
    }
}

/// Each job in what `qstat -f` printed (a `Job Id:` line, then indented
/// `key = value` lines): its id, state and name (when printed). A job
/// whose state is not printed is left out.
fn qstat_jobs(stdout: &str) -> Vec<(String, JobState, Option<String>)> {
    let mut out = Vec::new();
    let mut job: (Option<String>, Option<JobState>, Option<String>) = (None, None, None);
    let mut flush = |job: &mut (Option<String>, Option<JobState>, Option<String>)| {
        if let (Some(id), Some(state), name) = std::mem::take(job) {
            out.push((id, state, name));
        }
    };
    for l in stdout.lines() {
        if let Some(rest) = l.strip_prefix("Job Id:") {
            flush(&mut job);
            job.0 = Some(rest.trim().to_string());
        } else if let Some((k, v)) = l.trim().split_once(" = ") {
            match k {
                "Job_Name" => job.2 = Some(v.trim().to_string()),
                "job_state" => job.1 = Some(pbs_state(v.trim())),
                _ => {}
            }
        }
    }
    flush(&mut job);
    out
}

fn slurm_state(s: &str) -> JobState {
    match s {
        "PENDING" | "CONFIGURING" | "REQUEUED" | "RESV_DEL_HOLD" | "REQUEUE_HOLD"
        | "REQUEUE_FED" | "SUSPENDED" => JobState::Queued,
        "RUNNING" | "COMPLETING" | "STAGE_OUT" | "SIGNALING" | "RESIZING" => JobState::Running,
        _ => JobState::Ended,
    }
}

fn pbs_state(s: &str) -> JobState {
    match s {
        "Q" | "H" | "W" | "T" | "S" | "U" => JobState::Queued,
        "R" | "E" | "B" => JobState::Running,
        _ => JobState::Ended,
    }
}

/// The command that lists every job of `user`, for [`parse_listed`]. On
/// PBS it gives ids only (`qselect`), whose states and names come from
/// [`poll_command`]'s `qstat -f`.
pub fn list_command(system: BatchSystem, user: &str) -> Vec<String> {
    match system {
        BatchSystem::Slurm => vec![
            "squeue".into(),
            "--noheader".into(),
            "--array".into(),
            format!("--user={user}"),
            "--format=%i|%T|%j".into(),
        ],
        BatchSystem::Pbs => vec!["qselect".into(), "-u".into(), user.into()],
    }
}

/// The jobs of the mesh of `tag` (not ended) in what `squeue` (as
/// [`list_command`] asks) or `qstat -f -t` printed. An array's parent
/// (`1234[].server`) is not a job the book follows; its subjobs are.
pub fn parse_listed(system: BatchSystem, tag: &str, stdout: &str) -> Vec<Listed> {
    let mut out = Vec::new();
    let mut keep = |id: &str, state: JobState, name: &str| {
        if let Some(queue) = queue_of(tag, name) {
            if state != JobState::Ended && !id.contains("[]") {
                out.push(Listed::new(id, state, queue));
            }
        }
    };
    match system {
        BatchSystem::Slurm => {
            for l in stdout.lines() {
                let mut f = l.trim().splitn(3, '|');
                if let (Some(id), Some(state), Some(name)) = (f.next(), f.next(), f.next()) {
                    keep(id, slurm_state(state), name);
                }
            }
        }
        BatchSystem::Pbs => {
            for (id, state, name) in qstat_jobs(stdout) {
                if let Some(name) = name {
                    keep(&id, state, &name);
                }
            }
        }
    }
    out
}

/// The command that cancels a job.
pub fn cancel_command(system: BatchSystem, id: &str) -> Vec<String> {
    match system {
        BatchSystem::Slurm => vec!["scancel".into(), id.into()],
        BatchSystem::Pbs => vec!["qdel".into(), id.into()],
    }
}

/// How a batch operation ended, for the peer.
#[derive(Debug)]
pub enum Done {
    Submitted(QueueDef, Result<Vec<String>, BatchError>),
    Polled(BatchSystem, Result<Vec<(String, JobState)>, BatchError>),
    Cancelled(String, Result<(), BatchError>),
    /// With the `gen` of the `BatchOp::List` it answers.
    Listed(BatchSystem, u64, Result<Vec<Listed>, BatchError>),
}

/// Why a batch operation did not do what it was asked.
#[derive(Debug, thiserror::Error)]
pub enum BatchError {
    #[error("`{program}` did not answer within {} s", COMMAND_TIMEOUT.as_secs())]
    Timeout { program: String },
    #[error("cannot run `{program}`: {source}")]
    Spawn { program: String, source: io::Error },
    /// The command ran and said no: `stderr` is what it printed.
    #[error("`{}` failed ({}): {}", .argv.join(" "), .status, .stderr.trim())]
    Failed {
        argv: Vec<String>,
        status: ExitStatus,
        stderr: String,
    },
    #[error("the batch system printed no job id")]
    NoJobId,
    #[error("not a job id: {0}")]
    NotJobId(String),
    #[error("cannot create {path}: {source}")]
    Create { path: String, source: io::Error },
    #[error("cannot write {}: {source}", .path.display())]
    Write { path: PathBuf, source: io::Error },
    #[error("cannot tell this user's name")]
    NoUser,
}

impl BatchError {
    /// Whether the batch system said it knows none of the jobs asked of it
    /// (SLURM forgets ended jobs after a while; PBS without job history).
    fn jobs_unknown(&self) -> bool {
        matches!(self, BatchError::Failed { stderr, .. } if says_unknown_job(stderr))
    }
}

/// Whether a line a batch command printed on stderr says the job asked of
/// it is not known: the batch system's own words, the only way it says so.
fn says_unknown_job(line: &str) -> bool {
    line.contains("Invalid job id") || line.contains("Unknown Job Id")
}

/// The longest a batch command may take before it counts as failed.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);

/// Runs a batch command; its standard output, or what went wrong.
async fn run(argv: &[String]) -> Result<String, BatchError> {
    let out = output(argv).await?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(failed(argv, &out))
    }
}

/// Runs a batch command to its end (bounded by `COMMAND_TIMEOUT`).
async fn output(argv: &[String]) -> Result<std::process::Output, BatchError> {
    let (program, args) = argv.split_first().expect("a command");
    tokio::time::timeout(
        COMMAND_TIMEOUT,
        tokio::process::Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .map_err(|_| BatchError::Timeout {
        program: program.clone(),
    })?
    .map_err(|source| BatchError::Spawn {
        program: program.clone(),
        source,
    })
}

fn failed(argv: &[String], out: &std::process::Output) -> BatchError {
    BatchError::Failed {
        argv: argv.to_vec(),
        status: out.status,
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Writes the queue's script into `dir` (its own folder there, where the
/// jobs' output goes too) and submits `jobs` jobs of it.
pub async fn submit(queue: QueueDef, jobs: u32, launch: Launch, dir: &Path) -> Done {
    let r = async {
        tokio::fs::create_dir_all(&launch.log_dir)
            .await
            .map_err(|source| BatchError::Create {
                path: launch.log_dir.clone(),
                source,
            })?;
        let path = dir.join(format!("{}.sh", queue.name));
        tokio::fs::write(&path, script(&queue, &launch))
            .await
            .map_err(|source| BatchError::Write {
                path: path.clone(),
                source,
            })?;
        let argv = submit_command(queue.system, &path.to_string_lossy(), jobs);
        let out = run(&argv).await?;
        let id = parse_submitted(queue.system, &out)?;
        Ok(array_ids(queue.system, &id, jobs))
    }
    .await;
    Done::Submitted(queue, r)
}

/// Asks where these jobs are. A batch system that knows none of them
/// any more (SLURM forgets ended jobs after a while) has them all ended.
pub async fn poll(system: BatchSystem, jobs: Vec<String>) -> Done {
    let r = match run(&poll_command(system, &jobs)).await {
        Ok(out) => Ok(parse_states(system, &out)),
        Err(e) if e.jobs_unknown() => Ok(Vec::new()),
        Err(e) => Err(e),
    };
    Done::Polled(system, r)
}

/// Every job of this mesh (`tag`) the batch system knows, submitted by
/// this user.
pub async fn list(system: BatchSystem, gen: u64, tag: String) -> Done {
    let user = nix::unistd::User::from_uid(nix::unistd::Uid::current())
        .ok()
        .flatten()
        .map(|u| u.name)
        .or_else(|| std::env::var("USER").ok());
    let r = async {
        let user = user.ok_or(BatchError::NoUser)?;
        let out = run(&list_command(system, &user)).await?;
        match system {
            BatchSystem::Slurm => Ok(parse_listed(system, &tag, &out)),
            BatchSystem::Pbs => {
                let ids: Vec<String> = out.split_whitespace().map(str::to_string).collect();
                if ids.is_empty() {
                    return Ok(Vec::new());
                }
                // A job that ended between `qselect` and `qstat` (with no
                // job history kept) makes qstat fail for it alone: what it
                // printed of the others still counts.
                let argv = poll_command(system, &ids);
                let out = output(&argv).await?;
                let err = String::from_utf8_lossy(&out.stderr);
                let only_gone = err
                    .lines()
                    .filter(|l| !l.trim().is_empty())
                    .all(|l| l.contains("Unknown Job Id"));
                if !out.status.success() && !only_gone {
                    return Err(failed(&argv, &out));
                }
                Ok(parse_listed(
                    system,
                    &tag,
                    &String::from_utf8_lossy(&out.stdout),
                ))
            }
        }
    }
    .await;
    Done::Listed(system, gen, r)
}

pub async fn cancel(system: BatchSystem, job: String) -> Done {
    let r = run(&cancel_command(system, &job)).await.map(|_| ());
    Done::Cancelled(job, r)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn launch() -> Launch {
        Launch {
            mesh: "/home/ada/bin/mesh".into(),
            join: "/ip4/10.0.0.5/tcp/7070/p2p/12D3KooWExample".into(),
            key: "/home/ada/.local/share/mesh/mesh.key".into(),
            state_root: "/scratch/ada/mesh".into(),
            log_dir: "/home/ada/.local/share/mesh/alloc/gpu".into(),
            tag: "mesh-5f0c9a1e".into(),
        }
    }

    #[test]
    fn every_path_in_a_script_is_absolute_whatever_the_node_was_given() {
        let l = Launch {
            mesh: "/opt/mesh/bin/mesh".into(),
            join: "/ip4/10.0.0.5/tcp/7070".into(),
            key: "n1/mesh.key".into(),
            state_root: "n1/alloc/nodes".into(),
            log_dir: "n1/alloc/cpu".into(),
            tag: "mesh-5f0c9a1e".into(),
        };
        let here = std::env::current_dir().expect("a current folder");
        for system in [BatchSystem::Slurm, BatchSystem::Pbs] {
            let s = script(&bare(system), &l);
            for rel in ["n1/mesh.key", "n1/alloc/nodes", "n1/alloc/cpu"] {
                let abs = here.join(rel).display().to_string();
                assert!(s.contains(&abs), "{system:?}: no {abs} in\n{s}");
                assert!(
                    !s.contains(&format!(" {rel}")) && !s.contains(&format!("\"{rel}")),
                    "{system:?}: {rel} left relative in\n{s}"
                );
            }
        }
    }

    /// Every option set.
    fn full(system: BatchSystem) -> QueueDef {
        QueueDef {
            name: "gpu".into(),
            system,
            time_limit_s: 5400,
            cores: 16,
            mem_bytes: Some(64 << 30),
            gpus: 2,
            nodes_per_job: 2,
            partition: Some("gpu-long".into()),
            account: Some("proj42".into()),
            directives: vec![
                match system {
                    BatchSystem::Slurm => "--constraint=a100".into(),
                    BatchSystem::Pbs => "-l place=scatter".into(),
                },
                match system {
                    BatchSystem::Slurm => "#SBATCH --exclusive".into(),
                    BatchSystem::Pbs => "#PBS -m n".into(),
                },
            ],
            prologue: vec![
                "module load cuda/12".into(),
                "export OMP_NUM_THREADS=1".into(),
            ],
            min: 0,
            max: 10,
            idle_timeout_s: 300,
        }
    }

    /// The fewest options.
    fn bare(system: BatchSystem) -> QueueDef {
        QueueDef {
            max: 4,
            ..QueueDef::new("cpu", system, 3600, 8)
        }
    }

    fn expect(name: &str, got: &str) {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("src/batch_expected")
            .join(name);
        if std::env::var_os("MESH_BLESS").is_some() {
            std::fs::write(&path, got).expect("write expected");
        }
        let want = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e} (MESH_BLESS=1 writes it)", path.display()));
        assert_eq!(got, want, "{name} differs from the expected script");
    }

    #[test]
    fn scripts_match_the_expected_files_for_every_option() {
        expect(
            "slurm-full.sh",
            &script(&full(BatchSystem::Slurm), &launch()),
        );
        expect(
            "slurm-bare.sh",
            &script(&bare(BatchSystem::Slurm), &launch()),
        );
        expect("pbs-full.sh", &script(&full(BatchSystem::Pbs), &launch()));
        expect("pbs-bare.sh", &script(&bare(BatchSystem::Pbs), &launch()));
    }

    #[test]
    fn a_script_printed_without_a_node_says_what_stands_in_for_the_mesh() {
        let l = Launch::new(
            "/opt/mesh".into(),
            NO_NODE_JOIN.into(),
            "/home/ada/.local/share/mesh/mesh.key".into(),
            Path::new("/home/ada/.local/share/mesh"),
            "cpu",
            NO_NODE_TAG.into(),
        );
        for system in [BatchSystem::Slurm, BatchSystem::Pbs] {
            let s = script_without_node(&bare(system), &l);
            assert!(
                s.starts_with("#!/bin/bash\n# Printed without a running node: ADDR stands for"),
                "{s}"
            );
            assert!(s.contains("join \"ADDR\""), "{s}");
            assert!(s.contains("# mesh-TAG stands for the mesh's tag"), "{s}");
            assert!(s.contains("mesh-TAG-cpu"), "the job's name: {s}");
            assert!(
                s.contains("/home/ada/.local/share/mesh/alloc/nodes/"),
                "{s}"
            );
            // The rest is the script a node would submit.
            let (_, note_and_rest) = s.split_once('\n').unwrap();
            assert!(note_and_rest.ends_with(&script(&bare(system), &l).split_once('\n').unwrap().1));
        }
        let tagged = Launch {
            tag: "mesh-5f0c9a1e".into(),
            ..l
        };
        let s = script_without_node(&bare(BatchSystem::Slurm), &tagged);
        assert!(!s.contains("mesh-TAG"), "{s}");
    }

    #[test]
    fn a_short_job_relies_on_its_own_drain_not_slurms_early_signal() {
        let mut q = bare(BatchSystem::Slurm);
        assert!(script(&q, &launch()).contains("--signal=TERM@60"));
        q.time_limit_s = 300;
        let s = script(&q, &launch());
        assert!(!s.contains("--signal"), "{s}");
        assert!(s.contains("--walltime 300s"), "{s}");
    }

    #[test]
    fn submit_poll_and_cancel_commands() {
        assert_eq!(
            submit_command(BatchSystem::Slurm, "j.sh", 3),
            ["sbatch", "--parsable", "--array=1-3", "j.sh"]
        );
        assert_eq!(
            submit_command(BatchSystem::Slurm, "j.sh", 1),
            ["sbatch", "--parsable", "j.sh"]
        );
        assert_eq!(
            submit_command(BatchSystem::Pbs, "j.sh", 2),
            ["qsub", "-J", "1-2", "j.sh"]
        );
        assert_eq!(cancel_command(BatchSystem::Slurm, "12"), ["scancel", "12"]);
        assert_eq!(cancel_command(BatchSystem::Pbs, "7.srv"), ["qdel", "7.srv"]);
        assert_eq!(
            poll_command(BatchSystem::Slurm, &["12".into(), "13".into()])
                .last()
                .map(String::as_str),
            Some("--jobs=12,13")
        );
    }

    #[test]
    fn submitted_ids_are_read_and_errors_are_not_taken_for_ids() {
        let s = BatchSystem::Slurm;
        let id = |system, out| parse_submitted(system, out).ok();
        assert_eq!(id(s, "4242\n"), Some("4242".into()));
        assert_eq!(id(s, "4242;cluster-a\n"), Some("4242".into()));
        assert!(matches!(parse_submitted(s, ""), Err(BatchError::NoJobId)));
        assert!(matches!(
            parse_submitted(s, "sbatch: error: invalid partition"),
            Err(BatchError::NotJobId(_))
        ));
        let p = BatchSystem::Pbs;
        assert_eq!(id(p, "1234.pbs-server\n"), Some("1234.pbs-server".into()));
        assert_eq!(
            id(p, "1235[].pbs-server\n"),
            Some("1235[].pbs-server".into())
        );
        assert!(parse_submitted(p, "qsub: Unknown queue").is_err());
    }

    #[test]
    fn a_poll_of_jobs_the_batch_system_forgot_is_told_from_other_failures() {
        use std::os::unix::process::ExitStatusExt;
        let failed = |stderr: &str| BatchError::Failed {
            argv: vec!["squeue".into(), "--jobs=12".into()],
            status: ExitStatus::from_raw(1 << 8),
            stderr: stderr.into(),
        };
        let gone = failed("slurm_load_jobs error: Invalid job id specified\n");
        assert!(gone.jobs_unknown());
        assert!(failed("qstat: Unknown Job Id 12.server").jobs_unknown());
        assert!(!failed("squeue: error: Unable to contact slurm controller").jobs_unknown());
        assert!(!BatchError::NoUser.jobs_unknown());
        // The words people see are what the batch system printed, trimmed.
        assert_eq!(
            gone.to_string(),
            "`squeue --jobs=12` failed (exit status: 1): slurm_load_jobs error: Invalid job id specified"
        );
    }

    #[test]
    fn an_array_submission_names_each_of_its_jobs() {
        assert_eq!(array_ids(BatchSystem::Slurm, "12", 1), ["12"]);
        assert_eq!(array_ids(BatchSystem::Slurm, "12", 2), ["12_1", "12_2"]);
        assert_eq!(
            array_ids(BatchSystem::Pbs, "1235[].pbs-server", 2),
            ["1235[1].pbs-server", "1235[2].pbs-server"]
        );
    }

    #[test]
    fn qstat_of_an_array_gives_each_subjob_its_state() {
        // `qstat -x -f -t 1235[].pbs-server`, as PBS Pro prints it (abridged):
        // the array (B: begun) then each subjob.
        let out = "Job Id: 1235[].pbs-server\n    Job_Name = mesh-cpu\n    job_state = B\n    array = True\n\nJob Id: 1235[1].pbs-server\n    job_state = R\n\nJob Id: 1235[2].pbs-server\n    job_state = Q\n\nJob Id: 1235[3].pbs-server\n    job_state = X\n";
        let states = parse_states(BatchSystem::Pbs, out);
        let ids = array_ids(BatchSystem::Pbs, "1235[].pbs-server", 3);
        let of = |id: &str| states.iter().find(|(i, _)| i == id).map(|(_, s)| *s);
        assert_eq!(of(&ids[0]), Some(JobState::Running));
        assert_eq!(of(&ids[1]), Some(JobState::Queued));
        assert_eq!(of(&ids[2]), Some(JobState::Ended));
    }

    #[test]
    fn squeue_output_is_read() {
        // `squeue --noheader --array --format="%i %T"`, as SLURM 22.05 prints it.
        let out = "4242 RUNNING\n4243_1 PENDING\n4243_2 RUNNING\n4244 COMPLETING\n4245 CANCELLED\n";
        assert_eq!(
            parse_states(BatchSystem::Slurm, out),
            vec![
                ("4242".into(), JobState::Running),
                ("4243_1".into(), JobState::Queued),
                ("4243_2".into(), JobState::Running),
                ("4244".into(), JobState::Running),
                ("4245".into(), JobState::Ended),
            ]
        );
    }

    #[test]
    fn qstat_output_is_read() {
        // `qstat -x -f` as PBS Pro prints it (abridged).
        let out = "Job Id: 1234.pbs-server\n    Job_Name = mesh-cpu\n    Job_Owner = ada@login1\n    job_state = R\n    queue = workq\n\nJob Id: 1235.pbs-server\n    Job_Name = mesh-cpu\n    job_state = Q\n\nJob Id: 1236.pbs-server\n    job_state = F\n    Exit_status = 271\n";
        assert_eq!(
            parse_states(BatchSystem::Pbs, out),
            vec![
                ("1234.pbs-server".into(), JobState::Running),
                ("1235.pbs-server".into(), JobState::Queued),
                ("1236.pbs-server".into(), JobState::Ended),
            ]
        );
    }

    #[test]
    fn this_meshs_jobs_are_found_by_name_among_all_the_users_jobs() {
        let tag = "mesh-5f0c9a1e";
        let user = "ada";
        assert_eq!(
            list_command(BatchSystem::Slurm, user),
            [
                "squeue",
                "--noheader",
                "--array",
                "--user=ada",
                "--format=%i|%T|%j"
            ]
        );
        assert_eq!(
            list_command(BatchSystem::Pbs, user),
            ["qselect", "-u", "ada"]
        );
        // Another mesh's job, the user's own job (a space in its name), an
        // array of this mesh, a job ending.
        let out = "12|RUNNING|mesh-00aa11bb-cpu\n13|RUNNING|my analysis\n14_1|PENDING|mesh-5f0c9a1e-gpu\n14_2|RUNNING|mesh-5f0c9a1e-gpu\n15|COMPLETED|mesh-5f0c9a1e-cpu\n16|RUNNING|mesh-5f0c9a1e-big-mem\n";
        assert_eq!(
            parse_listed(BatchSystem::Slurm, tag, out),
            vec![
                Listed::new("14_1", JobState::Queued, "gpu"),
                Listed::new("14_2", JobState::Running, "gpu"),
                Listed::new("16", JobState::Running, "big-mem"),
            ]
        );
        // `qstat -f -t` of what `qselect` gave: an array's parent is not a job of the book.
        let out = "Job Id: 1234[].pbs\n    Job_Name = mesh-5f0c9a1e-cpu\n    job_state = B\n\nJob Id: 1234[1].pbs\n    Job_Name = mesh-5f0c9a1e-cpu\n    job_state = R\n\nJob Id: 1240.pbs\n    Job_Name = other\n    job_state = R\n\nJob Id: 1241.pbs\n    job_state = Q\n    Job_Name = mesh-5f0c9a1e-cpu\n";
        assert_eq!(
            parse_listed(BatchSystem::Pbs, tag, out),
            vec![
                Listed::new("1234[1].pbs", JobState::Running, "cpu"),
                Listed::new("1241.pbs", JobState::Queued, "cpu"),
            ]
        );
    }
}
