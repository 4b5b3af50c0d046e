//! `mesh alloc`: allocation queues (SLURM or PBS jobs that start mesh nodes for the backlog), as the node's copy of the mesh's book shows them.

use std::process::ExitCode;
use std::time::{Duration, UNIX_EPOCH};

use anyhow::{bail, Result};
use clap::{Args, Subcommand, ValueEnum};
use mesh_node::alloc::script;
use mesh_node::control::{Client, ControlError, ControlRequest, ControlResponse, Target};
use mesh_node::keys;
use mesh_protocol::alloc::{BatchSystem, JobState, QueueDef};
use mesh_protocol::mesh::{AllocBook, AllocCmd, AllocEvent};
use mesh_protocol::resources::{format_bytes, parse_amount, MEM};

use crate::args;
use crate::mesh_cmds::{ask, ask_once};
use crate::out::{out, outln};

#[derive(Subcommand)]
pub enum AllocArgs {
    /// Add a queue: the coordinator submits its jobs when queued tasks
    /// need more cores (or GPUs) than the mesh has, and cancels those that idle.
    Add(AddArgs),
    /// Every queue, with its jobs queued and running.
    List {
        #[arg(long)]
        json: bool,
    },
    /// One queue: its settings and its jobs (id, state, times).
    Info {
        #[arg(value_parser = args::name)]
        queue: String,
        #[arg(long)]
        json: bool,
    },
    /// What happened: submissions with their job ids, failures, job states,
    /// cancellations, pauses.
    Log {
        /// Only this queue's events.
        #[arg(value_parser = args::name)]
        queue: Option<String>,
        /// How many of the latest events.
        #[arg(long, default_value_t = 50)]
        last: usize,
        #[arg(long)]
        json: bool,
    },
    /// Stop submitting for a queue (its jobs keep running).
    Pause {
        #[arg(value_parser = args::name)]
        queue: String,
    },
    /// Submit again for a paused queue (paused by hand or after failures).
    Resume {
        #[arg(value_parser = args::name)]
        queue: String,
    },
    /// Remove a queue; its jobs are cancelled and their nodes hand their tasks back.
    Remove {
        #[arg(value_parser = args::name)]
        queue: String,
    },
}

#[derive(Clone, Copy, ValueEnum)]
pub enum System {
    Slurm,
    Pbs,
}

#[derive(Args)]
pub struct AddArgs {
    system: System,
    /// Each job's walltime, e.g. `1h`, `30m` (its nodes drain before it).
    #[arg(long, value_parser = args::duration)]
    time: Duration,
    /// Cores per node of a job.
    #[arg(long)]
    cores: u32,
    /// Memory per node, e.g. `64G`.
    #[arg(long, value_parser = args::name)]
    mem: Option<String>,
    /// GPUs per node: a queue with GPUs serves tasks that ask for them.
    #[arg(long, default_value_t = 0)]
    gpus: u32,
    /// Nodes per job (one mesh node each).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    nodes_per_job: u32,
    /// The batch system's queue (SLURM partition, PBS queue).
    #[arg(long, value_parser = args::name)]
    queue: Option<String>,
    #[arg(long, value_parser = args::name)]
    account: Option<String>,
    /// An extra line for the script's header, e.g. `--constraint=a100` (repeatable).
    #[arg(long = "directive", value_name = "LINE", value_parser = args::name)]
    directives: Vec<String>,
    /// A shell line run before the node starts, e.g. `module load gcc` (repeatable).
    #[arg(long = "prologue", value_name = "LINE", value_parser = args::name)]
    prologue: Vec<String>,
    /// Jobs kept at least (queued or running), work or not.
    #[arg(long, default_value_t = 0)]
    min: u32,
    /// Jobs at most (queued or running).
    #[arg(long, default_value_t = 10)]
    max: u32,
    /// A running job whose nodes have run nothing this long is cancelled (above --min).
    #[arg(long, default_value = "5m", value_parser = args::duration)]
    idle_timeout: Duration,
    /// Finish the mesh's farms by then: a duration from now (`6h`) or a
    /// date and time (`2026-12-04 18:00`, UTC). The queue then has the jobs a
    /// simulation of what is left says meet it (re-planned every 10 s), not
    /// those the backlog asks for, and says when --max cannot meet it.
    #[arg(long, value_parser = args::deadline)]
    deadline: Option<Duration>,
    /// The queue's name (default: the batch system's, numbered if taken).
    #[arg(long, value_parser = args::name)]
    name: Option<String>,
    /// Print the batch script a job would run, and change nothing.
    #[arg(long)]
    dry_run: bool,
}

pub fn alloc(to: &Target, args: AllocArgs) -> Result<ExitCode> {
    match args {
        AllocArgs::Add(a) => add(to, a),
        AllocArgs::List { json } => {
            let book = book(to)?;
            if json {
                outln!("{}", serde_json::to_string_pretty(&book)?);
            } else {
                list(&book);
            }
            Ok(ExitCode::SUCCESS)
        }
        AllocArgs::Info { queue, json } => {
            let book = book(to)?;
            let Some(q) = book.queue(&queue) else {
                bail!("no allocation queue `{queue}` (see `mesh alloc list`)");
            };
            let jobs: Vec<_> = book.jobs.iter().filter(|j| j.job.queue == queue).collect();
            if json {
                let v = serde_json::json!({ "queue": q, "jobs": jobs });
                outln!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                info(q, &jobs);
            }
            Ok(ExitCode::SUCCESS)
        }
        AllocArgs::Log { queue, last, json } => {
            let book = book(to)?;
            if let Some(q) = &queue {
                if book.queue(q).is_none() && !book.log.iter().any(|e| &e.queue == q) {
                    bail!("no allocation queue `{q}` (see `mesh alloc list`)");
                }
            }
            let events: Vec<&AllocEvent> = book
                .log
                .iter()
                .filter(|e| {
                    queue
                        .as_ref()
                        .is_none_or(|q| &e.queue == q || e.queue.is_empty())
                })
                .collect();
            let events = &events[events.len().saturating_sub(last)..];
            if json {
                outln!("{}", serde_json::to_string_pretty(events)?);
            } else {
                for e in events {
                    outln!("{}", event_line(e));
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        AllocArgs::Pause { queue } => change(to, AllocCmd::Pause { queue }),
        AllocArgs::Resume { queue } => change(to, AllocCmd::Resume { queue }),
        AllocArgs::Remove { queue } => change(to, AllocCmd::Remove { queue }),
    }
}

fn add(to: &Target, a: AddArgs) -> Result<ExitCode> {
    let system = match a.system {
        System::Slurm => BatchSystem::Slurm,
        System::Pbs => BatchSystem::Pbs,
    };
    if a.cores == 0 {
        bail!("--cores must be at least 1");
    }
    if a.time.as_secs() < 60 {
        bail!(
            "--time {}: a job's walltime must be at least a minute (its node drains before it)",
            humantime::format_duration(a.time)
        );
    }
    if a.min > a.max {
        bail!("--min {} is more than --max {}", a.min, a.max);
    }
    let mem_bytes = match &a.mem {
        None => None,
        Some(m) => Some(
            parse_amount(MEM, m)
                .map_err(|e| anyhow::anyhow!("--mem {m}: {e}"))?
                .whole(),
        ),
    };
    if let Some(n) = &a.name {
        if n.is_empty()
            || !n
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            bail!("--name {n:?}: use letters, digits, `-` and `_`");
        }
    }
    let base = match system {
        BatchSystem::Slurm => "slurm",
        BatchSystem::Pbs => "pbs",
    };
    let name = match a.name {
        Some(n) => n,
        // A dry run adds nothing, so no name it could take is taken.
        None if a.dry_run => base.to_string(),
        None => {
            let book = book(to)?;
            (1..)
                .map(|i| {
                    if i == 1 {
                        base.to_string()
                    } else {
                        format!("{base}-{i}")
                    }
                })
                .find(|n| book.queue(n).is_none())
                .expect("a free name")
        }
    };
    let def = QueueDef {
        mem_bytes,
        gpus: a.gpus,
        nodes_per_job: a.nodes_per_job,
        partition: a.queue,
        account: a.account,
        directives: a.directives,
        prologue: a.prologue,
        min: a.min,
        max: a.max,
        idle_timeout_s: a.idle_timeout.as_secs(),
        deadline_ms: a
            .deadline
            .map(|d| mesh_node::state::unix_ms() + d.as_millis() as u64),
        ..QueueDef::new(&name, system, a.time.as_secs(), a.cores)
    };
    if a.dry_run {
        out!("{}", dry_run(to, def)?);
        return Ok(ExitCode::SUCCESS);
    }
    let name = def.name.clone();
    let book = send(to, AllocCmd::Add(def))?;
    if let Some(q) = book.queue(&name) {
        outln!("added allocation queue `{name}`: {}", shape(&q.def));
    }
    Ok(ExitCode::SUCCESS)
}

/// The script a job of `def` would run: as the node here (or at
/// --mesh) writes it, or, with no node running here, built from the
/// flags and the state folder, the mesh's address left as a placeholder.
fn dry_run(to: &Target, def: QueueDef) -> Result<String> {
    let state = match Client::request(to, &ControlRequest::AllocScript(def.clone())) {
        Ok(mut c) => {
            return match c.recv() {
                Some(Ok(ControlResponse::Script(s))) => Ok(s),
                other => bail!("unexpected answer from the node: {other:?}"),
            }
        }
        Err(ControlError::NoNode(state)) => state,
        Err(e) => return Err(e.into()),
    };
    // What the node here would use: the key in its state folder, and this binary.
    let key = state.join(keys::PSK_FILE);
    let tag = keys::load_psk(&key)
        .map(|psk| keys::mesh_tag(&psk))
        .unwrap_or_else(|_| script::NO_NODE_TAG.into());
    let launch = script::Launch::new(
        std::env::current_exe()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|_| "mesh".into()),
        script::NO_NODE_JOIN.into(),
        key.display().to_string(),
        &state,
        &def.name,
        tag,
    );
    Ok(script::script_without_node(&def, &launch))
}

fn change(to: &Target, cmd: AllocCmd) -> Result<ExitCode> {
    let what = match &cmd {
        AllocCmd::Pause { queue } => format!("paused `{queue}`"),
        AllocCmd::Resume { queue } => format!("resumed `{queue}`"),
        AllocCmd::Remove { queue } => format!("removed `{queue}` (its jobs are cancelled)"),
        AllocCmd::Add(d) => format!("added `{}`", d.name),
    };
    send(to, cmd)?;
    outln!("{what}");
    Ok(ExitCode::SUCCESS)
}

fn send(to: &Target, cmd: AllocCmd) -> Result<AllocBook> {
    match ask_once(to, &ControlRequest::Alloc(cmd))? {
        ControlResponse::Allocs(b) => Ok(*b),
        other => bail!("unexpected answer from the node: {other:?}"),
    }
}

fn book(to: &Target) -> Result<AllocBook> {
    let mut c = ask(to, &ControlRequest::Allocs)?;
    match c.recv() {
        Some(Ok(ControlResponse::Allocs(b))) => Ok(*b),
        Some(Ok(other)) => bail!("unexpected answer from the node: {other:?}"),
        Some(Err(e)) => Err(e.into()),
        None => bail!("the node closed the connection"),
    }
}

/// A Unix time in ms as people read it, to the second, in UTC.
fn unix_words(ms: u64) -> String {
    let at = std::time::UNIX_EPOCH + Duration::from_millis(ms);
    format!("{} UTC", humantime::format_rfc3339_seconds(at))
}

/// What a deadline queue's latest plan said, in a line.
fn plan_words(d: &QueueDef, p: &mesh_protocol::alloc::book::DeadlinePlan) -> String {
    let made = unix_words(p.unix_ms);
    match (p.extra, p.end_unix_ms) {
        (Some(n), Some(end)) if p.meets => format!(
            "plan ({made}): {n} job(s) beyond those whose nodes are here meet the deadline; \
             the work ends about {} (p90)",
            unix_words(end)
        ),
        (Some(n), Some(end)) => format!(
            "plan ({made}): the deadline cannot be met within --max {}: with {n} more job(s) \
             the work ends about {} (p90)",
            d.max,
            unix_words(end)
        ),
        _ => format!("plan ({made}): no task has finished yet to tell how long the work takes"),
    }
}

/// What one job of a queue asks for, in a line.
fn shape(d: &QueueDef) -> String {
    let mut s = format!(
        "{} job(s) of {} × {} core(s)",
        match d.system {
            BatchSystem::Slurm => "SLURM",
            BatchSystem::Pbs => "PBS",
        },
        d.nodes_per_job,
        d.cores
    );
    if let Some(m) = d.mem_bytes {
        s.push_str(&format!(", {}", format_bytes(m)));
    }
    if d.gpus > 0 {
        s.push_str(&format!(", {} GPU(s)", d.gpus));
    }
    s.push_str(&format!(
        ", walltime {}, {}..{} jobs, idle timeout {}",
        humantime::format_duration(Duration::from_secs(d.time_limit_s)),
        d.min,
        d.max,
        humantime::format_duration(Duration::from_secs(d.idle_timeout_s)),
    ));
    if let Some(p) = &d.partition {
        s.push_str(&format!(", queue {p}"));
    }
    if let Some(at) = d.deadline_ms {
        s.push_str(&format!(", deadline {}", unix_words(at)));
    }
    if let Some(a) = &d.account {
        s.push_str(&format!(", account {a}"));
    }
    s
}

fn list(book: &AllocBook) {
    if book.queues.is_empty() {
        outln!("no allocation queues (add one with `mesh alloc add slurm --time 1h --cores 8`)");
        return;
    }
    outln!(
        "{:<14} {:<6} {:>9} {:>6} {:>5} {:>8} {:>7} {:>8}  STATE",
        "QUEUE",
        "SYSTEM",
        "WALLTIME",
        "CORES",
        "GPUS",
        "MIN..MAX",
        "QUEUED",
        "RUNNING"
    );
    for q in &book.queues {
        let d = &q.def;
        let count = |s: JobState| {
            book.live()
                .filter(|j| j.job.queue == d.name && j.job.state == s)
                .count()
        };
        outln!(
            "{:<14} {:<6} {:>9} {:>6} {:>5} {:>8} {:>7} {:>8}  {}",
            d.name,
            match d.system {
                BatchSystem::Slurm => "slurm",
                BatchSystem::Pbs => "pbs",
            },
            humantime::format_duration(Duration::from_secs(d.time_limit_s)).to_string(),
            d.cores,
            d.gpus,
            format!("{}..{}", d.min, d.max),
            count(JobState::Queued),
            count(JobState::Running),
            q.paused
                .as_deref()
                .map_or_else(|| "active".to_string(), |w| format!("paused: {w}")),
        );
    }
}

fn info(q: &mesh_protocol::mesh::AllocQueue, jobs: &[&mesh_protocol::mesh::AllocJob]) {
    let d = &q.def;
    outln!("queue `{}`: {}", d.name, shape(d));
    match &q.paused {
        Some(w) => outln!("paused: {w} (`mesh alloc resume {}`)", d.name),
        None => outln!("active"),
    }
    if let Some(p) = &q.plan {
        outln!("{}", plan_words(d, p));
    }
    for line in &d.directives {
        outln!("directive: {line}");
    }
    for line in &d.prologue {
        outln!("prologue: {line}");
    }
    if jobs.is_empty() {
        outln!("no jobs yet");
        return;
    }
    outln!(
        "{:<22} {:<8} {:<6} {:<20} ENDED",
        "JOB",
        "STATE",
        "JOINED",
        "SUBMITTED"
    );
    for j in jobs {
        outln!(
            "{:<22} {:<8} {:<6} {:<20} {}",
            j.job.id,
            match j.job.state {
                JobState::Queued => "queued",
                JobState::Running => "running",
                JobState::Ended => "ended",
            },
            if j.joined { "yes" } else { "no" },
            time(j.submitted_unix_ms),
            j.ended_unix_ms.map(time).unwrap_or_default(),
        );
    }
}

/// A time in UTC, as the batch systems' logs are compared with it.
fn time(unix_ms: u64) -> String {
    humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_millis(unix_ms))
        .to_string()
        .replace('T', " ")
}

fn event_line(e: &AllocEvent) -> String {
    let mut s = format!("{}  ", time(e.unix_ms));
    if !e.queue.is_empty() {
        s.push_str(&format!("{}: ", e.queue));
    }
    if let Some(j) = &e.job {
        s.push_str(&format!("job {j}: "));
    }
    s.push_str(&e.text);
    s
}
