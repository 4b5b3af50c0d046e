//! The mesh commands: `init`, `node`, `join`, `submit`, `wait`, `cancel`, and `status` of a running mesh.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use mesh_node::control::{
    Client, ControlError, ControlRequest, ControlResponse, ErrorKind, Target,
};
use mesh_node::farmfile::{self, LoadOptions};
use mesh_node::limits::OpenFiles;
use mesh_node::mesh_node::{run_node, Multiaddr, NodeOptions};
use mesh_node::view::{short_id, FarmView, MeshStatus, NodeState, NodeView, BUSIEST_SHOWN};
use mesh_protocol::mesh::Config;

use crate::out::outln;
use crate::{args, node_resources, show, NodeArgs, EXIT_FAILED_TASKS};
use mesh_protocol::resources::format_bytes;

pub fn init(state: &Path) -> Result<ExitCode> {
    let r = mesh_node::keys::init(state)?;
    if r.psk_created {
        outln!("created {} (the mesh secret)", r.psk_path.display());
    } else {
        outln!("kept the existing {}", r.psk_path.display());
    }
    outln!("mesh key fingerprint {}", r.psk_fingerprint);
    outln!(
        "node identity {} ({})",
        r.peer_id,
        r.identity_path.display()
    );
    outln!(
        "to let another machine in, copy {} into its state folder",
        r.psk_path.display()
    );
    Ok(ExitCode::SUCCESS)
}

/// Options of `mesh node` and `mesh join`.
#[derive(clap::Args)]
pub struct NodeFlags {
    /// Where to listen (repeatable).
    #[arg(long, value_name = "MULTIADDR", default_value = "/ip4/0.0.0.0/tcp/0", value_parser = args::multiaddr)]
    pub listen: Vec<Multiaddr>,
    /// The mesh secret (default: mesh.key in the state folder).
    #[arg(long, value_name = "FILE", value_parser = args::path)]
    pub key: Option<PathBuf>,
    /// A member silent this long is declared dead and its tasks run elsewhere.
    #[arg(long, value_name = "MS", default_value_t = 2000)]
    pub dead_after_ms: u64,
    /// A farm's state (definition, inputs, done set, where outputs are) is
    /// durable on this many nodes before anything is acknowledged (fewer
    /// only while the mesh has fewer nodes).
    #[arg(long, value_name = "N", default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..))]
    pub replicas: u16,
    /// How long a farm's home waits for a node that keeps outputs it has
    /// not collected yet to come back; then those tasks run again elsewhere.
    #[arg(long, value_name = "MS", default_value_t = 30_000)]
    pub outputs_wait_ms: u64,
    /// Do not take queued work from busier nodes.
    #[arg(long)]
    pub no_steal: bool,
    /// Hand this node tasks until their resources reach this percentage of
    /// its capacity (a bigger queue here, less to steal for others), instead
    /// of the depth it measures (enough queued tasks to cover a round trip
    /// to the coordinator at the rate it runs them).
    #[arg(long, value_name = "PERCENT")]
    pub prefetch_percent: Option<u64>,
    /// At most this many tasks queued or running here at once (default: 2 per core + 2).
    #[arg(long, value_name = "N")]
    pub claims_max: Option<usize>,
    /// Find other nodes on the LAN by mDNS (only in builds with the `mdns` feature).
    #[arg(long)]
    pub mdns: bool,
    /// This node's state folder is on a file system every node of the mesh
    /// sees at the same path (a cluster's home or project file system): a
    /// farm's home takes the outputs kept here in place (a hard link) instead
    /// of over the network. Found by itself on NFS, Lustre, GPFS, BeeGFS,
    /// CephFS and SMB.
    #[arg(long)]
    pub shared_fs: bool,
    /// This node is killed after this long (a batch job's walltime, e.g. `1h`):
    /// `--drain-margin` before, it hands back its queued and running tasks,
    /// without spending their retries, and stops.
    #[arg(long, value_name = "DURATION", value_parser = args::duration)]
    pub walltime: Option<std::time::Duration>,
    /// How long before the walltime the node drains (default: 2 minutes, or a
    /// tenth of a shorter walltime).
    #[arg(long, value_name = "DURATION", value_parser = args::duration)]
    pub drain_margin: Option<std::time::Duration>,
    /// The batch job that started this node, as the batch system lists it
    /// (the scripts of `mesh alloc` set it): the coordinator learns which
    /// of its jobs are up and idle.
    #[arg(long, value_name = "ID", env = "MESH_ALLOC_JOB")]
    pub alloc_job: Option<String>,
    #[command(flatten)]
    pub node: NodeArgs,
}

/// Runs a node in the foreground; `join`: the addresses of the mesh it
/// joins (any one that answers), none for a new mesh.
pub fn node(state: &Path, flags: &NodeFlags, join: Vec<Multiaddr>) -> Result<ExitCode> {
    if flags.mdns && !cfg!(feature = "mdns") {
        bail!(
            "this mesh was built without mDNS; rebuild with `--features mdns`, or join by address"
        );
    }
    // GPUs are found here; a count given in --resources takes that many.
    let (resources, gpus) = node_resources(&flags.node)?;
    crate::warm_workers(state, &flags.node);
    let config = Config {
        dead_after_ms: flags.dead_after_ms,
        join_wait_ms: flags.dead_after_ms.min(1500),
        steal: !flags.no_steal,
        prefetch_percent: flags.prefetch_percent,
        node_claims_max: flags.claims_max,
        outputs_wait_ms: flags.outputs_wait_ms,
        replicas: flags.replicas as usize,
        connect_ms: (mesh_node::net::CONNECT_TIMEOUT + mesh_node::net::HANDSHAKE_TIMEOUT)
            .as_millis() as u64,
        ..Config::default()
    };
    let opts = NodeOptions {
        state: state.to_path_buf(),
        listen: flags.listen.clone(),
        join,
        resources,
        gpus,
        key: match &flags.key {
            // Job scripts pass it on to nodes started elsewhere.
            Some(k) => std::path::absolute(k)
                .with_context(|| format!("--key {}: cannot make it absolute", k.display()))?,
            None => state.join(mesh_node::keys::PSK_FILE),
        },
        config,
        mdns: flags.mdns,
        shared_fs: flags.shared_fs,
        http: flags.node.http,
        drain_after: flags.walltime.map(|w| {
            let margin = flags
                .drain_margin
                .unwrap_or_else(|| (w / 10).min(std::time::Duration::from_secs(120)));
            w.saturating_sub(margin)
        }),
        alloc_job: flags.alloc_job.clone().filter(|j| !j.is_empty()),
    };
    crate::give_back_freed_memory();
    run_node(
        opts,
        Box::new(|line: &str| {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{line}");
            let _ = out.flush();
        }),
    )?;
    Ok(ExitCode::SUCCESS)
}

pub(crate) fn ask(to: &Target, req: &ControlRequest) -> Result<Client> {
    Client::request(to, req).map_err(|e| match e {
        ControlError::NoNode(_) => anyhow::anyhow!("{e}"),
        other => anyhow::Error::new(other),
    })
}

/// A request with one answer: that answer, or the node's refusal in its words.
pub(crate) fn ask_once(to: &Target, req: &ControlRequest) -> Result<ControlResponse> {
    let mut c = ask(to, req)?;
    match c.recv() {
        Some(Ok(ControlResponse::Error { message, .. })) => bail!("{message}"),
        Some(Ok(r)) => Ok(r),
        Some(Err(e)) => Err(e.into()),
        None => bail!("the node closed the connection"),
    }
}

/// `mesh control-pipe`: one request from stdin to the node, its answers
/// to stdout as they come, each line as the node wrote it (this build
/// reads neither, so a client of another API version hears the node's own
/// refusal). A node that cannot be reached is said as the node says an
/// error, `{"Error": {"kind": "unreachable", "message": "..."}}`, so the
/// client reads one kind of answer.
pub fn control_pipe(to: &Target) -> Result<ExitCode> {
    let mut line = String::new();
    std::io::stdin()
        .read_line(&mut line)
        .context("reading the request from standard input")?;
    if line.trim().is_empty() {
        bail!("control-pipe: no request on standard input (one JSON line, see docs/api.md)");
    }
    let said = |r: ControlResponse| -> Result<ExitCode> {
        outln!("{}", serde_json::to_string(&r)?);
        Ok(ExitCode::from(EXIT_FAILED_TASKS))
    };
    let mut c = match Client::request_line(to, line.into_bytes()) {
        Ok(c) => c,
        Err(e) => return said(ControlResponse::error(e.kind(), e.to_string())),
    };
    while let Some(l) = c.recv_line() {
        match l {
            Ok(l) => {
                let mut out = crate::out::stdout();
                writeln!(out, "{l}")?;
                out.flush()?;
            }
            Err(e) => return said(ControlResponse::error(e.kind(), e.to_string())),
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub fn submit(
    to: &Target,
    farm: &Path,
    out: Option<PathBuf>,
    wait: bool,
    rerun: Option<Vec<String>>,
    json: bool,
) -> Result<ExitCode> {
    let (def, warnings) = farmfile::load_with_warnings(farm, &LoadOptions::to(out))?;
    crate::show::warn(&warnings);
    crate::check_stages(&def, rerun.as_deref())?;
    let file = farm
        .canonicalize()
        .with_context(|| format!("cannot resolve {}", farm.display()))?;
    let mut c = ask(
        to,
        &ControlRequest::Submit {
            def: Box::new(def),
            file: file.to_string_lossy().into_owned(),
            rerun,
        },
    )?;
    let id = loop {
        match c.recv() {
            Some(Ok(ControlResponse::Submitted { farm, tasks })) => {
                if json {
                    outln!("{}", serde_json::json!({ "farm": farm, "tasks": tasks }));
                } else {
                    outln!("{farm}");
                }
                break farm;
            }
            // Said before the farm is accepted (outputs of tasks no longer
            // in the farm set aside); the answer follows.
            Some(Ok(ControlResponse::Warning(w))) => eprintln!("mesh: {w}"),
            Some(Ok(ControlResponse::Error { message, .. })) => {
                bail!("the node refused the farm: {message}")
            }
            Some(Ok(other)) => bail!("unexpected answer from the node: {other:?}"),
            Some(Err(e)) => return Err(e.into()),
            None => bail!("the node closed the connection before accepting the farm"),
        }
    };
    let _ = crate::out::stdout().flush();
    if wait {
        return follow(to, &id, json);
    }
    Ok(ExitCode::SUCCESS)
}

pub fn wait(to: &Target, farm: &str, json: bool) -> Result<ExitCode> {
    follow(to, farm, json)
}

/// `mesh resume FARM` with a node running here: the node becomes the
/// farm's home (or is already) and the farm is followed to its end.
/// `None` when no node runs here or the mesh knows no such farm (then it
/// is a farm of `mesh run`).
pub fn resume(to: &Target, farm: &str, out: Option<&Path>, json: bool) -> Result<Option<ExitCode>> {
    let out = match out {
        Some(d) => {
            std::fs::create_dir_all(d).with_context(|| format!("cannot create {}", d.display()))?;
            Some(
                d.canonicalize()
                    .with_context(|| format!("cannot resolve {}", d.display()))?
                    .to_string_lossy()
                    .into_owned(),
            )
        }
        None => None,
    };
    let req = ControlRequest::Resume {
        farm: farm.to_string(),
        out,
    };
    let mut c = match Client::request(to, &req) {
        Ok(c) => c,
        Err(ControlError::NoNode(_)) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    match c.recv() {
        Some(Ok(ControlResponse::Resumed {
            farm,
            out,
            done,
            total,
            already,
        })) => {
            if already {
                eprintln!(
                    "{farm}: this node is its home; {done} of {total} done; outputs in {out}"
                );
            } else {
                eprintln!(
                    "{farm}: this node is its home now; {done} of {total} done; every output is brought to {out}"
                );
            }
            follow(to, &farm, json).map(Some)
        }
        Some(Ok(ControlResponse::Error {
            kind: ErrorKind::UnknownFarm,
            ..
        })) => Ok(None),
        Some(Ok(ControlResponse::Error { message, .. })) => bail!("{message}"),
        Some(Ok(other)) => bail!("unexpected answer from the node: {other:?}"),
        Some(Err(e)) => Err(e.into()),
        None => bail!("the node closed the connection"),
    }
}

/// What `mesh logs` got of the node here.
pub enum Logs {
    /// The logs, printed: the command's exit code.
    Shown(ExitCode),
    /// No node runs here: the farm is one of `mesh run`, if any.
    NoNode,
    /// The node knows no such farm, or none with the task's stage: its
    /// words, which say more than "no farm has run here" where a `mesh
    /// run` farm is not found either.
    Unknown(String),
}

/// `mesh logs TASK --farm FARM` with a node running here: the task's logs
/// from the node that ran it (stdout to stdout, stderr to stderr), more
/// as they come with `follow`.
pub fn logs(
    to: &Target,
    farm: &str,
    task: &str,
    attempt: Option<u32>,
    follow: bool,
    json: bool,
) -> Result<Logs> {
    let req = ControlRequest::Logs {
        farm: farm.to_string(),
        task: task.to_string(),
        attempt,
        follow: follow && !json,
    };
    let mut c = match Client::request(to, &req) {
        Ok(c) => c,
        Err(ControlError::NoNode(_)) => return Ok(Logs::NoNode),
        Err(e) => return Err(e.into()),
    };
    let (mut all_out, mut all_err) = (Vec::new(), Vec::new());
    let mut last = (String::new(), None);
    let mut figures = None;
    while let Some(r) = c.recv() {
        match r? {
            ControlResponse::Log {
                node,
                attempt,
                stdout,
                stderr,
                done,
                used,
            } => {
                figures = used.or(figures);
                if json {
                    all_out.extend(stdout);
                    all_err.extend(stderr);
                } else {
                    crate::out::stdout().write_all(&stdout)?;
                    std::io::stderr().write_all(&stderr)?;
                }
                last = (node, attempt);
                if done {
                    break;
                }
            }
            ControlResponse::Error {
                kind: ErrorKind::UnknownFarm,
                message,
            } => return Ok(Logs::Unknown(message)),
            ControlResponse::Error { message, .. } => bail!("{message}"),
            other => bail!("unexpected answer from the node: {other:?}"),
        }
    }
    if json {
        let v = serde_json::json!({
            "farm": farm,
            "task": task,
            "node": last.0,
            "attempt": last.1,
            "stdout": String::from_utf8_lossy(&all_out),
            "stderr": String::from_utf8_lossy(&all_err),
            "used": figures,
        });
        outln!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        crate::show::task_used(task, last.1, Some(&last.0), figures.as_ref());
    }
    Ok(Logs::Shown(ExitCode::SUCCESS))
}

/// The mesh's farms, as the node here and the coordinator know them;
/// `None` when no node runs here.
pub fn list(to: &Target) -> Result<Option<Vec<FarmView>>> {
    let mut c = match Client::request(to, &ControlRequest::List) {
        Ok(c) => c,
        Err(ControlError::NoNode(_)) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    match c.recv() {
        Some(Ok(ControlResponse::List(v))) => Ok(Some(v)),
        Some(Ok(ControlResponse::Error { message, .. })) => bail!("{message}"),
        Some(Ok(other)) => bail!("unexpected answer from the node: {other:?}"),
        Some(Err(e)) => Err(e.into()),
        None => bail!("the node closed the connection"),
    }
}

/// `mesh list` with a node running: the mesh's farms, then this machine's
/// own (`mesh run`); as JSON, `{"mesh": [...], "local": [...]}`.
pub fn print_list(
    mesh: &[FarmView],
    local: &[mesh_node::state::FarmStatus],
    json: bool,
) -> Result<()> {
    if json {
        let v = serde_json::json!({ "mesh": mesh, "local": local });
        outln!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    if mesh.is_empty() {
        outln!("no mesh farms yet (submit one with `mesh submit farm.toml`)");
    } else {
        outln!(
            "{:<28} {:<10} {:>16} {:>8}  HOME",
            "MESH FARM",
            "STATE",
            "DONE/TOTAL",
            "FAILED"
        );
        for f in mesh {
            outln!(
                "{:<28} {:<10} {:>16} {:>8}  {}",
                f.id,
                f.state_word(),
                format!("{}/{}", f.counts.done, f.counts.total),
                f.counts.failed,
                f.home
            );
        }
    }
    if !local.is_empty() {
        outln!();
        crate::show::list(local, false)?;
    }
    Ok(())
}

/// `mesh resume` with no farm named and a node running here: the one
/// unfinished mesh farm whose home is this node, if there is one (several:
/// an error naming them).
pub fn unfinished_home_farm(to: &Target) -> Result<Option<String>> {
    let (Some(s), Some(farms)) = (status(to, false)?, list(to)?) else {
        return Ok(None);
    };
    let me = s.nodes.iter().find(|n| n.local).map(|n| n.id.clone());
    let mine: Vec<&FarmView> = farms
        .iter()
        .filter(|f| !f.finished && Some(&f.home) == me.as_ref())
        .collect();
    match mine.as_slice() {
        [] => Ok(None),
        [one] => Ok(Some(one.id.clone())),
        many => {
            let ids: Vec<&str> = many.iter().map(|f| f.id.as_str()).collect();
            bail!(
                "several farms of this node are unfinished ({}); name the one to resume",
                ids.join(", ")
            )
        }
    }
}

/// `mesh status FARM` with a node running here: the farm as the mesh knows
/// it, from any node. False when no node runs here or the mesh knows no
/// such farm (then it is a farm of `mesh run`).
pub fn farm_status(to: &Target, farm: &str, json: bool) -> Result<bool> {
    let Some(v) = farm_view(to, farm)? else {
        return Ok(false);
    };
    if json {
        outln!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        outln!("farm {} ({}), home {}", v.id, v.state_word(), v.home);
        if let Some(words) = v.eta_words(mesh_node::state::unix_ms()) {
            outln!("  {words}");
        }
        for (name, c) in &v.stages {
            let stopped = if c.stopped > 0 {
                format!(", {} stopped", c.stopped)
            } else {
                String::new()
            };
            // Sent ahead to a node is not running there yet.
            let sent = if c.queued_on_nodes > 0 {
                format!(", {} queued on nodes", c.queued_on_nodes)
            } else {
                String::new()
            };
            outln!(
                "  {name}: {}/{} done, {} running{sent}, {} failed, {} skipped{stopped}",
                c.done,
                c.total,
                c.running,
                c.failed,
                c.skipped
            );
        }
        // On stdout with the stages above: one stream, lines apart.
        for line in farm_lines(&v) {
            outln!("{line}");
        }
        for line in crate::show::used_lines(&v.used) {
            outln!("  {line}");
        }
    }
    Ok(true)
}

/// A mesh farm's view from the node (`mesh status FARM --json`'s);
/// `None` with no node here or where the mesh does not know the farm.
pub fn farm_view(to: &Target, farm: &str) -> Result<Option<Box<FarmView>>> {
    let req = ControlRequest::Farm {
        farm: farm.to_string(),
    };
    let mut c = match Client::request(to, &req) {
        Ok(c) => c,
        Err(ControlError::NoNode(_)) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    match c.recv() {
        Some(Ok(ControlResponse::Farm(v))) => Ok(Some(v)),
        Some(Ok(ControlResponse::Error {
            kind: ErrorKind::UnknownFarm,
            ..
        })) => Ok(None),
        Some(Ok(ControlResponse::Error { message, .. })) => bail!("{message}"),
        Some(Ok(other)) => bail!("unexpected answer from the node: {other:?}"),
        Some(Err(e)) => Err(e.into()),
        None => bail!("the node closed the connection"),
    }
}

/// Follows a farm to its end, drawing progress on stderr.
fn follow(to: &Target, farm: &str, json: bool) -> Result<ExitCode> {
    let mut c = ask(
        to,
        &ControlRequest::Wait {
            farm: farm.to_string(),
        },
    )?;
    let terminal = std::io::stderr().is_terminal() && !json;
    let mut bar: Option<ProgressBar> = None;
    let mut last_line = Instant::now() - Duration::from_secs(10);
    let mut final_view: Option<FarmView> = None;
    while let Some(r) = c.recv() {
        match r? {
            ControlResponse::Progress(v) => {
                if terminal {
                    let b = bar.get_or_insert_with(|| {
                        let b = ProgressBar::new(v.counts.total);
                        b.set_style(
                            ProgressStyle::with_template(
                                "{prefix} [{bar:40}] {pos}/{len} {msg} ({elapsed})",
                            )
                            .expect("static template")
                            .progress_chars("=> "),
                        );
                        b.set_prefix(v.id.clone());
                        b
                    });
                    b.set_position(v.counts.done + v.counts.failed + v.counts.skipped);
                    let data = v.data.words().map(|w| format!(", {w}"));
                    let eta = v.eta_words(mesh_node::state::unix_ms());
                    b.set_message(format!(
                        "running {} failed {}{}{}",
                        v.counts.running,
                        v.counts.failed,
                        data.unwrap_or_default(),
                        eta.map(|w| format!(", {w}")).unwrap_or_default()
                    ));
                } else if !json && last_line.elapsed() >= Duration::from_secs(1) {
                    last_line = Instant::now();
                    let data = v.data.words().map(|w| format!(", {w}"));
                    let eta = v.eta_words(mesh_node::state::unix_ms());
                    eprintln!(
                        "{}: {}/{} done, {} running, {} failed{}{}",
                        v.id,
                        v.counts.done,
                        v.counts.total,
                        v.counts.running,
                        v.counts.failed,
                        data.unwrap_or_default(),
                        eta.map(|w| format!(", {w}")).unwrap_or_default()
                    );
                }
            }
            ControlResponse::Finished(v) => {
                final_view = Some(v);
                break;
            }
            ControlResponse::Error { message, .. } => bail!("{message}"),
            other => bail!("unexpected answer from the node: {other:?}"),
        }
    }
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    let Some(v) = final_view else {
        bail!(
            "the node stopped (or the connection to it was lost) before the farm finished; it resumes when the node is started again, and `mesh wait` follows it again"
        )
    };
    if json {
        outln!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        for line in farm_lines(&v) {
            eprintln!("{line}");
        }
    }
    Ok(if v.counts.done == v.counts.total {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_FAILED_TASKS)
    })
}

/// A farm's end in words: its counts, then what went wrong, a line each.
fn farm_lines(v: &FarmView) -> Vec<String> {
    let mut lines = Vec::new();
    let c = &v.counts;
    // Reused: done in an earlier farm with the same content key, not run again.
    let reused = if c.cached > 0 {
        format!(" ({} reused from earlier farms)", c.cached)
    } else {
        String::new()
    };
    lines.push(format!(
        "{}: {} of {} done{reused}, {} failed, {} skipped, {} cancelled; outputs in {}",
        v.id, c.done, c.total, c.failed, c.skipped, c.cancelled, v.out
    ));
    for u in &v.unplaceable {
        lines.push(format!("  unplaceable: {u}"));
    }
    for s in &v.stopped {
        lines.push(format!("  {s}"));
    }
    if c.stopped > 0 {
        lines.push(format!(
            "  {} tasks stopped with their stage: submit the farm again once the cause is fixed",
            c.stopped
        ));
    }
    if v.redone > 0 {
        lines.push(format!(
            "  {} done task(s) ran again: the only copy of their outputs went with a node",
            v.redone
        ));
    }
    if v.duplicates > 0 {
        lines.push(format!(
            "  {} task(s) ran again after a fault (a node thought dead, a partition) and completed twice; the first result counts",
            v.duplicates
        ));
    }
    for f in &v.failures {
        lines.push(format!("  failed: {f}"));
    }
    if c.skipped > 0 {
        // A failure reads `solve/3 (attempt 1 on ...): ...`: its task first.
        let names = v
            .failures
            .iter()
            .filter_map(|f| f.split_whitespace().next());
        lines.push(format!("  {}", crate::show::skipped_line(c.skipped, names)));
    }
    lines
}

/// Closes an open farm (a Python client's, a Snakemake run's, whose
/// client is gone): it takes no more stages, and ends once its tasks do.
pub fn close(to: &Target, farm: &str) -> Result<ExitCode> {
    let req = ControlRequest::Grow {
        farm: farm.to_string(),
        toml: String::new(),
        file: String::new(),
        close: true,
        rerun: true,
    };
    let mut c = ask(to, &req)?;
    loop {
        match c.recv() {
            Some(Ok(ControlResponse::Submitted { farm, .. })) => {
                outln!("closed {farm}");
                return Ok(ExitCode::SUCCESS);
            }
            Some(Ok(ControlResponse::Warning(_))) => continue,
            Some(Ok(ControlResponse::Error { message, .. })) => bail!("{message}"),
            Some(Ok(other)) => bail!("unexpected answer from the node: {other:?}"),
            Some(Err(e)) => bail!(e),
            None => bail!("the node closed the connection"),
        }
    }
}

pub fn cancel(to: &Target, farm: &str, tasks: &[String]) -> Result<ExitCode> {
    let asks: Vec<(ControlRequest, String)> = if tasks.is_empty() {
        vec![(
            ControlRequest::Cancel {
                farm: farm.to_string(),
            },
            String::new(),
        )]
    } else {
        tasks
            .iter()
            .map(|t| {
                let req = ControlRequest::CancelTask {
                    farm: farm.to_string(),
                    task: t.clone(),
                };
                (req, format!(" {t}"))
            })
            .collect()
    };
    for (req, what) in asks {
        let mut c = ask(to, &req)?;
        match c.recv() {
            Some(Ok(ControlResponse::Cancelled { farm })) => outln!("cancelled {farm}{what}"),
            Some(Ok(ControlResponse::Error { message, .. })) => bail!("{message}"),
            Some(Ok(other)) => bail!("unexpected answer from the node: {other:?}"),
            Some(Err(e)) => bail!(e),
            None => bail!("the node closed the connection"),
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The mesh's status from the local node, or `None` when no node runs here;
/// `every`: every node asked for its own measures (latencies).
pub fn status(to: &Target, every: bool) -> Result<Option<MeshStatus>> {
    let req = if every {
        ControlRequest::StatusEvery
    } else {
        ControlRequest::Status
    };
    let mut c = match Client::request(to, &req) {
        Ok(c) => c,
        Err(ControlError::NoNode(_)) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    match c.recv() {
        Some(Ok(ControlResponse::Status(s))) => Ok(Some(*s)),
        Some(Ok(other)) => bail!("unexpected answer from the node: {other:?}"),
        Some(Err(e)) => Err(e.into()),
        None => bail!("the node closed the connection"),
    }
}

/// What `mesh status` shows of the mesh.
pub enum Show {
    /// The mesh at a glance: a screenful at any size.
    Glance,
    /// A line per node, or one node whole when `name` finds one.
    Nodes {
        busy: bool,
        idle: bool,
        name: Option<String>,
    },
    /// Latency percentiles over the mesh and per node.
    Latency,
}

/// `here` names the node that answered: "this node", or the one at `--mesh`.
pub fn print_status(s: &MeshStatus, json: bool, show: &Show, here: &str) -> Result<()> {
    if json {
        outln!("{}", serde_json::to_string_pretty(s)?);
        return Ok(());
    }
    match show {
        Show::Latency => print_latency(s, here),
        Show::Glance => print_glance(s, here),
        Show::Nodes { busy, idle, name } => {
            let picked: Vec<&NodeView> = s
                .nodes
                .iter()
                .filter(|n| !busy || n.running + n.queued > 0)
                .filter(|n| !idle || n.state() == NodeState::Idle)
                .filter(|n| name.as_deref().is_none_or(|q| n.id.contains(q)))
                .collect();
            match picked.as_slice() {
                [one] if name.is_some() => print_node(s, one, here),
                [] => outln!("no node matches"),
                many => print_node_lines(many, here),
            }
        }
    }
    print_farms(s);
    Ok(())
}

fn print_latency(s: &MeshStatus, here: &str) {
    outln!(
        "latency over the mesh ({} nodes answered):",
        s.nodes.iter().filter(|n| n.cpus.is_some()).count()
    );
    show::latency_table(&s.latency, "  ");
    for n in &s.nodes {
        outln!(
            "node {}{}:",
            n.id,
            if n.local {
                format!(" [{here}]")
            } else {
                String::new()
            }
        );
        if n.latency.is_empty() {
            outln!("  did not answer in time");
        } else {
            show::latency_table(&n.latency, "  ");
        }
    }
}

/// An amount of a resource as people read it: bytes for `mem`.
fn amount(kind: &str, v: f64) -> String {
    if kind == mesh_protocol::resources::MEM {
        format_bytes(v as u64)
    } else if v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

/// The mesh at a glance: at most a screenful, whatever its size.
fn print_glance(s: &MeshStatus, here: &str) {
    let g = s.glance();
    let me = s
        .nodes
        .iter()
        .find(|n| n.local)
        .map_or("", |n| short_id(&n.id));
    outln!(
        "coordinator {} (term {}) · {} node(s) · {here} …{me}",
        s.coordinator.as_deref().unwrap_or("not elected yet"),
        s.term,
        g.nodes
    );
    if let Some(why) = &s.unheard {
        outln!("  ({why}: the other nodes as this one last heard them)");
    }
    let behind = if g.behind > 0 {
        format!(" · {} behind (cannot keep up: CPU, network)", g.behind)
    } else {
        String::new()
    };
    outln!("  nodes     {}{behind}", g.states_words());
    if !g.resources.is_empty() {
        let used: Vec<String> = g
            .resources
            .iter()
            .map(|r| {
                format!(
                    "{} {} of {}",
                    r.kind,
                    amount(&r.kind, r.used),
                    amount(&r.kind, r.total)
                )
            })
            .collect();
        outln!("  in use    {}", used.join(" · "));
    }
    let (least, median, most) = g.tasks_spread;
    outln!("  tasks     per node, running and queued: least {least}, median {median}, most {most}");
    if !g.busiest.is_empty() {
        outln!("  busiest   {}", g.busiest_words());
    }
    if let Some((least, median, most)) = g.load_spread {
        outln!("  machines  load least {least:.2}, median {median:.2}, most {most:.2}");
    }
    if !g.gpus.is_empty() {
        let gpus: Vec<String> = g.gpus.iter().map(|(m, c)| format!("{c} × {m}")).collect();
        outln!("  gpus      {}", gpus.join(" · "));
    }
    if !g.short_of_files.is_empty() {
        let ids: Vec<String> = g
            .short_of_files
            .iter()
            .take(BUSIEST_SHOWN)
            .map(|id| format!("…{}", short_id(id)))
            .collect();
        outln!(
            "  files     {} node(s) with an open-file limit too low for {} nodes: {} (raise it: `ulimit -Hn`, or LimitNOFILE=)",
            g.short_of_files.len(),
            g.nodes,
            ids.join(", ")
        );
    }
    outln!("  (every node: `mesh status --nodes`, with --busy, --idle or --name ID)");
}

/// A line per node.
fn print_node_lines(nodes: &[&NodeView], here: &str) {
    outln!(
        "{:<10} {:<14} {:>4} {:>5}  {:<13} {:<19} {:>6}  {:<9}  gpus",
        "node",
        "state",
        "run",
        "queue",
        "cpu in use",
        "memory",
        "load",
        "measures"
    );
    for n in nodes {
        let mark = match (n.coordinator, n.local) {
            (true, true) => format!(" [coordinator, {here}]"),
            (true, false) => " [coordinator]".to_string(),
            (false, true) => format!(" [{here}]"),
            _ => String::new(),
        };
        let cpu = n
            .usage
            .iter()
            .find(|u| u.kind == "cpu")
            .map_or(String::new(), |u| {
                format!("{} of {}", amount("cpu", u.used), amount("cpu", u.total))
            });
        let mem = match (n.mem_used, n.mem_total) {
            (Some(u), Some(t)) => format!("{} of {}", format_bytes(u), format_bytes(t)),
            _ => String::new(),
        };
        let load = n.load.map_or(String::new(), |l| format!("{l:.2}"));
        let measures = n.measure.map_or("", |m| m.word());
        outln!(
            "…{:<9} {:<14} {:>4} {:>5}  {cpu:<13} {mem:<19} {load:>6}  {measures:<9}  {}{mark}",
            short_id(&n.id),
            n.state().word(),
            n.running,
            n.queued,
            n.gpus.len()
        );
    }
}

/// One node whole.
fn print_node(s: &MeshStatus, n: &NodeView, here: &str) {
    let role = match (n.coordinator, n.local) {
        (true, true) => format!(" [coordinator, {here}]"),
        (true, false) => " [coordinator]".to_string(),
        (false, true) => format!(" [{here}]"),
        _ => String::new(),
    };
    outln!("  {}{role}", n.id);
    if let Some(a) = n.addrs.first() {
        outln!("    address   {a}");
    }
    if n.job.is_some() || n.drains_in_s.is_some() {
        let drains = n.drains_in_s.map_or(String::new(), |s| {
            format!(
                "drains in {}",
                humantime::format_duration(Duration::from_secs(s))
            )
        });
        match &n.job {
            Some(j) => outln!(
                "    batch job {j}{}",
                if drains.is_empty() {
                    String::new()
                } else {
                    format!(", {drains}")
                }
            ),
            None => outln!("    {drains}"),
        }
    }
    outln!(
        "    resources {} (in use: {})",
        n.resources.total,
        if n.resources.used.is_empty() {
            "nothing"
        } else {
            &n.resources.used
        }
    );
    outln!("    tasks     {} running, {} queued", n.running, n.queued);
    if let Some(m) = n.measure {
        outln!("    measures  what each task uses with {}", m.words());
    }
    if !n.gpus.is_empty() {
        let gpus: Vec<String> = n
            .gpus
            .iter()
            .map(|g| {
                if g.name.is_empty() {
                    g.id.clone()
                } else {
                    format!("{} {}", g.id, g.name)
                }
            })
            .collect();
        outln!("    gpus      {}", gpus.join(", "));
    }
    if n.health > 0 {
        outln!(
            "    behind    local health {} of 8: it cannot keep up (CPU, network), and waits longer before it calls others dead",
            n.health
        );
    }
    let files = OpenFiles {
        limit: n.files_max,
        was: n.files_max,
    };
    if n.files_max > 0 && files.short_for(s.nodes.len()) {
        outln!(
            "    files     open-file limit {}: too low for a mesh of {} nodes (raise it: `ulimit -Hn`, or LimitNOFILE=)",
            n.files_max,
            s.nodes.len()
        );
    }
    if let (Some(load), Some(cpus)) = (n.load, n.cpus) {
        let mem = match (n.mem_used, n.mem_total) {
            (Some(u), Some(t)) => {
                format!(", memory {} of {}", format_bytes(u), format_bytes(t))
            }
            _ => String::new(),
        };
        outln!("    machine   load {load:.2} on {cpus} cores{mem}");
    }
    if let Some(b) = n.held_bytes.filter(|&b| b > 0) {
        outln!(
            "    holds     {} of outputs until their farms' homes have them",
            format_bytes(b)
        );
    }
}

/// The farms whose home is the node that answered.
fn print_farms(s: &MeshStatus) {
    if s.farms.is_empty() {
        outln!("no farms submitted on this node");
    }
    for f in &s.farms {
        let state = if f.finished || f.accepted {
            f.state_word()
        } else {
            "waiting for the coordinator"
        };
        outln!(
            "farm {} ({state}): {}/{} done, {} running, {} queued on nodes, {} failed",
            f.id,
            f.counts.done,
            f.counts.total,
            f.counts.running,
            f.counts.queued_on_nodes,
            f.counts.failed
        );
    }
}
