//! The batch systems' commands for allocation queues: the `sbatch`, `squeue`, `scancel`, `qsub`, `qselect`, `qstat` and `qdel` command lines, reading what they print, and running them off the node's loop.

use std::io;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use mesh_protocol::alloc::{BatchSystem, JobState, QueueDef};
use mesh_protocol::mesh::Listed;

use super::script::{queue_of, script, Launch};

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
