//! The `mesh` command: run, resume and inspect farms from the terminal.

mod alloc_cmd;
mod args;
mod describe_cmd;
mod export_cmd;
mod import;
mod mesh_cmds;
mod out;
mod report;
mod show;
mod sim_args;
mod sim_cmd;
mod sim_deadline;
mod watch;
mod whatif;

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use mesh_node::control::Target;
use mesh_node::farmfile::{self, LoadOptions};
use mesh_node::runner::{self, RunError, RunOptions, RunStart};
use mesh_node::state::{RunState, StateDir, StateError};
use mesh_protocol::resources::parse_resources;
use mesh_protocol::Resources;

/// Exit codes, documented in the README.
pub(crate) const EXIT_FAILED_TASKS: u8 = 1;
pub(crate) const EXIT_BAD_INPUT: u8 = 2;
const EXIT_INTERRUPTED: u8 = 130;

/// mimalloc instead of glibc's malloc: the simulator and a node's engine
/// allocate and free many small records per task, and glibc spent a sixth
/// of a 1,000-node simulation consolidating and unlinking free chunks.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc's `mi_option_purge_delay` (its `mimalloc.h`, v3, which
/// libmimalloc-sys builds): not among the crate's named options.
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// A node gives the memory it frees back to the system at once: mimalloc
/// purges freed pages a second later (its arenas ten), and only as later
/// allocations come by, and a node idles for long stretches after a
/// burst (a map of 100,000 calls taken and written: 595 bytes a pending
/// call stayed resident for good, 191 given back at once). What a node
/// holds is what SLURM counts against its job. The simulator, which
/// allocates and frees far more, keeps the delay.
// The one unsafe call of the workspace: mimalloc offers no safe way to set
// an option.
#[allow(unsafe_code)]
pub(crate) fn give_back_freed_memory() {
    // SAFETY: sets an integer of mimalloc's; called before the node's
    // threads start, as mi_option_set asks.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, 0) };
}

#[cfg(test)]
mod alloc_tests {
    /// The option set is the purge delay: its default is 1000 (ms, in
    /// this mimalloc's options.c), which no option beside it has.
    #[test]
    #[allow(unsafe_code)]
    fn the_purge_delay_option_is_the_one_set() {
        // SAFETY: reads an integer of mimalloc's.
        let v = unsafe { libmimalloc_sys::mi_option_get(super::MI_OPTION_PURGE_DELAY) };
        assert!(
            std::env::var_os("MIMALLOC_PURGE_DELAY").is_some() || v == 1000,
            "option 15 is {v}"
        );
    }
}

#[derive(Parser)]
#[command(
    name = "mesh",
    version,
    about = "A peer-to-peer task farm: run parameter sweeps and pipelines of commands"
)]
struct Cli {
    /// Where farms keep their state (default: the user's data folder, e.g. ~/.local/share/mesh).
    #[arg(long, global = true, env = mesh_node::state_folder::STATE_DIR_VAR, value_name = "DIR", value_parser = args::path)]
    state_dir: Option<PathBuf>,
    /// Act on the mesh through the node at this address, from a machine that
    /// runs no node (a cluster's login node): submit, wait, status, list,
    /// logs, cancel, resume, watch and alloc, over the connection nodes use,
    /// with the mesh secret (--mesh-key).
    #[arg(long, global = true, env = "MESH_ADDR", value_name = "MULTIADDR", value_parser = args::multiaddr)]
    mesh: Option<mesh_node::mesh_node::Multiaddr>,
    /// The mesh secret for --mesh (default: mesh.key in the state folder).
    #[arg(long, global = true, env = "MESH_KEY", value_name = "FILE", value_parser = args::path)]
    mesh_key: Option<PathBuf>,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run a farm file on this machine, with a progress bar; exit 0 when every task succeeded.
    Run {
        /// The farm file (TOML).
        #[arg(value_parser = args::path)]
        farm: PathBuf,
        /// Where collected outputs go (default ./mesh-out/<farm name>).
        #[arg(long, value_name = "DIR", value_parser = args::path)]
        out: Option<PathBuf>,
        /// Run these stages (all when none is named) and every stage downstream
        /// of them again, even where an earlier run's results could be reused.
        #[arg(long, value_name = "STAGE", num_args = 0.., value_delimiter = ',')]
        rerun: Option<Vec<String>>,
        #[command(flatten)]
        node: NodeArgs,
        #[command(flatten)]
        output: OutputArgs,
    },
    /// Continue a farm after a crash, kill -9 or Ctrl-C (default: the most recent unfinished one).
    /// With a node running here, a mesh farm: this node becomes its home and collects its outputs.
    Resume {
        /// Farm id, id prefix or name (see `mesh list`, or `mesh status` on a mesh).
        #[arg(value_parser = args::name)]
        farm: Option<String>,
        /// Also run tasks that failed for good, with fresh retries.
        #[arg(long)]
        retry_failed: bool,
        /// For a mesh farm whose home was another node: where its outputs go on this machine.
        #[arg(long, value_name = "DIR", value_parser = args::path)]
        out: Option<PathBuf>,
        #[command(flatten)]
        node: NodeArgs,
        #[command(flatten)]
        output: OutputArgs,
    },
    /// Write a runnable farm folder from a recorded workflow.
    Import {
        #[command(subcommand)]
        from: import::ImportFrom,
    },
    /// Write a farm, finished or running, as a WfCommons trace (WfFormat 1.5): its tasks,
    /// their dependencies, runs, files and machines (see docs/export.md).
    Export {
        /// Farm id, id prefix or name (see `mesh list`).
        #[arg(value_parser = args::name)]
        farm: String,
        /// Write the trace to this file (default: standard output).
        #[arg(short = 'o', long = "out", value_name = "FILE", value_parser = args::path)]
        out: Option<PathBuf>,
    },
    /// Write one HTML page of a farm, finished or running: its timeline per node
    /// and slot, what each stage used against its asks, failures, data moved,
    /// and its end as estimated (see docs/report.md).
    Report {
        /// Farm id, id prefix or name (see `mesh list`).
        #[arg(value_parser = args::name)]
        farm: String,
        /// Write the page to this file (default: FARM-ID-report.html here; `-`: standard output).
        #[arg(short = 'o', long = "out", value_name = "FILE", value_parser = args::path)]
        out: Option<PathBuf>,
    },
    /// Check a farm file and show what it would run, without running anything.
    Check {
        #[arg(value_parser = args::path)]
        farm: PathBuf,
        #[arg(long, value_name = "DIR", value_parser = args::path)]
        out: Option<PathBuf>,
        /// How many tasks of each stage to show.
        #[arg(long, default_value_t = 3)]
        show: u32,
        #[arg(long)]
        json: bool,
    },
    /// List farms, most recent first.
    List {
        #[arg(long)]
        json: bool,
    },
    /// Simulate a farm on many virtual nodes: makespan against the lower bound, steals, messages.
    Sim {
        #[command(flatten)]
        args: sim_args::SimArgs,
    },
    /// Create the mesh secret (mesh.key) and this node's identity in the state folder.
    Init,
    /// Show where this mesh keeps its state here and the fields a farm file's
    /// stage takes, in order; --json for clients (the Python package reads it).
    Describe {
        #[arg(long)]
        json: bool,
    },
    /// Run a mesh node in the foreground; it takes farms from `mesh submit` and from other nodes.
    Node {
        #[command(flatten)]
        flags: mesh_cmds::NodeFlags,
    },
    /// Run a node that joins the mesh of the node at MULTIADDR (as `mesh node` printed it).
    Join {
        /// One address, or several comma-separated (any one that answers will do).
        #[arg(value_name = "MULTIADDR[,MULTIADDR...]", value_parser = args::peers)]
        peer: args::Peers,
        #[command(flatten)]
        flags: mesh_cmds::NodeFlags,
    },
    /// Hand a farm to the local node; prints the farm id at once.
    Submit {
        #[arg(value_parser = args::path)]
        farm: PathBuf,
        /// Where collected outputs go on this machine (default ./mesh-out/<farm name>).
        #[arg(long, value_name = "DIR", value_parser = args::path)]
        out: Option<PathBuf>,
        /// Then follow it to the end with a progress bar (exit 0 when every task succeeded).
        #[arg(long)]
        wait: bool,
        /// Run these stages (all when none is named) and every stage downstream
        /// of them again, even where an earlier farm's results could be reused.
        #[arg(long, value_name = "STAGE", num_args = 0.., value_delimiter = ',')]
        rerun: Option<Vec<String>>,
        #[arg(long)]
        json: bool,
    },
    /// Follow a submitted farm to its end.
    Wait {
        #[arg(value_parser = args::name)]
        farm: String,
        #[arg(long)]
        json: bool,
    },
    /// Close an open farm (a Python client's or a Snakemake run's, its client
    /// gone): it takes no more stages, and ends once its tasks do.
    Close {
        #[arg(value_parser = args::name)]
        farm: String,
    },
    /// Stop a submitted farm: nothing new starts, running tasks are killed.
    /// With tasks (`solve/3`): only those, and what depends on them is skipped.
    Cancel {
        #[arg(value_parser = args::name)]
        farm: String,
        /// Tasks of the farm to cancel, as `mesh status` names them (`solve/3`).
        tasks: Vec<String>,
    },
    /// With a node running: every node, the coordinator and the farms; otherwise a farm's
    /// progress per stage (default: the most recent farm).
    Status {
        #[arg(value_parser = args::name)]
        farm: Option<String>,
        #[arg(long)]
        json: bool,
        /// Latency percentiles (p50/p90/p99/max) over the mesh and per node:
        /// queue wait, submit to start, start to recorded done, message and
        /// steal round trips (asks every node).
        #[arg(long)]
        latency: bool,
        /// Every node, a line each (the default is the mesh at a glance).
        #[arg(long)]
        nodes: bool,
        /// Only the nodes running or queueing tasks (implies --nodes).
        #[arg(long, conflicts_with = "idle")]
        busy: bool,
        /// Only the idle nodes (implies --nodes).
        #[arg(long)]
        idle: bool,
        /// Only the nodes whose id contains this (implies --nodes); one
        /// node found is shown whole.
        #[arg(long, value_name = "ID", value_parser = args::name)]
        name: Option<String>,
    },
    /// A live view of the mesh or of a farm in the terminal: per-stage bars with rate and
    /// ETA, nodes with their load, recent failures (plain lines when not on a terminal).
    Watch {
        /// Farm id, id prefix or name (default: every farm).
        #[arg(value_parser = args::name)]
        farm: Option<String>,
        /// Seconds between updates.
        #[arg(long, default_value_t = 1.0, value_name = "S", value_parser = args::seconds)]
        every: f64,
        /// Stop when the farm (or every farm) has finished.
        #[arg(long)]
        until_done: bool,
    },
    /// Allocation queues: SLURM or PBS jobs that start mesh nodes when the
    /// mesh has more work than it can run, and end when they idle.
    Alloc {
        #[command(subcommand)]
        cmd: alloc_cmd::AllocArgs,
    },
    /// Relay one control request, a JSON line on stdin, to the node (this
    /// machine's, or the one at --mesh) and its answers, JSON lines, to
    /// stdout: how a client without libp2p (the Python package) reaches a
    /// mesh from a machine that runs no node. See docs/api.md.
    #[command(hide = true)]
    ControlPipe,
    /// Show a task's stdout and stderr: `mesh logs [FARM] TASK` (TASK is
    /// <stage>/<index>, e.g. solve/3).
    Logs {
        /// TASK, or FARM when a TASK follows.
        #[arg(value_parser = args::name, value_name = "[FARM] TASK")]
        first: String,
        #[arg(value_parser = args::name, hide = true)]
        second: Option<String>,
        /// Farm id, id prefix or name (default: the most recent farm).
        #[arg(long, value_parser = args::name)]
        farm: Option<String>,
        /// Which attempt (default: the latest that wrote output).
        #[arg(long)]
        attempt: Option<u32>,
        /// Keep printing what the task writes until it ends (a mesh farm's task).
        #[arg(long, short)]
        follow: bool,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Args)]
pub(crate) struct NodeArgs {
    /// Resources this node offers, added to or overriding the detected cpu and mem,
    /// e.g. `cpu=8,mem=32GiB,gpu=2,license=4`.
    #[arg(long, value_name = "LIST")]
    pub(crate) resources: Option<String>,
    /// Serve the live dashboard and /metrics at this address, e.g. 127.0.0.1:8787.
    /// On an address other than loopback every request needs the token the
    /// node prints (derived from mesh.key).
    #[arg(long, value_name = "ADDR")]
    pub(crate) http: Option<std::net::SocketAddr>,
    /// The Python that runs every `python` task here (Python functions from
    /// `import mesh`), in warm workers; default: the interpreter the farm
    /// names where this machine has it, else `python3`.
    #[arg(long, value_name = "PATH")]
    pub(crate) python: Option<String>,
    /// Kill a task whose processes hold more memory than its `mem` ask, as
    /// SLURM does past `--mem`, saying its peak and its ask (default: an
    /// ask places tasks and is not a limit). Also `MESH_ENFORCE_MEM=1`.
    #[arg(long)]
    pub(crate) enforce_mem: bool,
    /// Measure each task in a cgroup of its own where this node may make
    /// one (root, cgroup v1): exact CPU and peak memory over every process
    /// it had, at some cost per task (default: its process tree, sampled
    /// from /proc). Also `MESH_CGROUPS=1`.
    #[arg(long)]
    pub(crate) cgroups: bool,
}

#[derive(Args)]
struct OutputArgs {
    /// Print the final status as JSON on stdout (no progress bar).
    #[arg(long)]
    json: bool,
    /// No progress bar or progress lines.
    #[arg(long, short)]
    quiet: bool,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("MESH_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let matches = <Cli as clap::CommandFactory>::command().get_matches();
    let cli = match <Cli as clap::FromArgMatches>::from_arg_matches(&matches) {
        Ok(c) => c,
        Err(e) => e.exit(),
    };
    // MESH_ADDR exported for the commands of a login shell must not stop
    // that shell (or a job that inherits it) from starting a node.
    let mesh_from_env =
        matches.value_source("mesh") == Some(clap::parser::ValueSource::EnvVariable);
    match dispatch(cli, mesh_from_env) {
        Ok(code) => code,
        Err(e) => {
            if let Some(fe) = e.downcast_ref::<farmfile::FarmFileError>() {
                eprintln!("error: {fe}");
                return ExitCode::from(EXIT_BAD_INPUT);
            }
            eprintln!("error: {}", describe(&e));
            ExitCode::from(EXIT_BAD_INPUT)
        }
    }
}

/// An error and its causes, each said once. Most of mesh's errors name
/// their cause in their own message and also keep it as their source
/// (for callers that look at it); printed as a chain, the cause came two
/// or three times (`database error: X: X`).
fn describe(e: &anyhow::Error) -> String {
    let mut out = e.to_string();
    for cause in e.chain().skip(1) {
        let c = cause.to_string();
        if !out.contains(&c) {
            out.push_str(": ");
            out.push_str(&c);
        }
    }
    out
}

fn dispatch(cli: Cli, mesh_from_env: bool) -> Result<ExitCode> {
    let state = StateDir::new(mesh_node::state_folder::of_this_process(
        cli.state_dir.as_deref(),
    )?);
    let local = local_only(&cli.command);
    let to = match cli.mesh {
        Some(_) if local.is_some() && mesh_from_env => Target::Local(state.root().to_path_buf()),
        None => Target::Local(state.root().to_path_buf()),
        Some(addr) => {
            if let Some(what) = local {
                bail!("--mesh acts on a running mesh from another machine; `mesh {what}` runs here (leave out --mesh)");
            }
            let key = cli
                .mesh_key
                .unwrap_or_else(|| state.root().join(mesh_node::keys::PSK_FILE));
            Target::Remote { addr, key }
        }
    };
    let remote = !to.is_local();
    match cli.command {
        Cmd::Run {
            farm,
            out,
            rerun,
            node,
            output,
        } => {
            let (def, warnings) = farmfile::load_with_warnings(&farm, &LoadOptions::to(out))?;
            show::warn(&warnings);
            check_stages(&def, rerun.as_deref())?;
            let file = farm
                .canonicalize()
                .with_context(|| format!("cannot resolve {}", farm.display()))?;
            let again = Again {
                retry_failed: false,
                rerun,
            };
            let def = Box::new(def);
            run(RunStart::New { def, file }, &state, &node, again, &output)
        }
        Cmd::Resume {
            farm,
            retry_failed,
            out,
            node,
            output,
        } => {
            if let Some(code) = resume_on_mesh(&to, farm.as_deref(), out.as_deref(), output.json)? {
                return Ok(code);
            }
            let id = farm_to_resume(&state, farm.as_deref(), retry_failed)?;
            let again = Again {
                retry_failed,
                rerun: None,
            };
            run(RunStart::Resume { id }, &state, &node, again, &output)
        }
        Cmd::Check {
            farm,
            out,
            show,
            json,
        } => {
            let (def, warnings) = farmfile::load_with_warnings(&farm, &LoadOptions::to(out))?;
            if !json {
                show::warn(&warnings);
            }
            show::check(&def, &warnings, show, json)?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::List { json } => {
            let local = if remote { Vec::new() } else { state.list()? };
            match mesh_cmds::list(&to)? {
                Some(mesh) => mesh_cmds::print_list(&mesh, &local, json)?,
                None => show::list(&local, json)?,
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Import { from } => import::import(&from),
        Cmd::Export { farm, out } => export_cmd::export(&to, &state, &farm, out.as_deref()),
        Cmd::Report { farm, out } => report::report(&to, &state, &farm, out.as_deref()),
        Cmd::Init => mesh_cmds::init(state.root()),
        Cmd::Describe { json } => describe_cmd::describe(state.root(), json),
        Cmd::Alloc { cmd } => alloc_cmd::alloc(&to, cmd),
        Cmd::Sim { args } => sim_cmd::sim(&args, &to),
        Cmd::Node { flags } => mesh_cmds::node(state.root(), &flags, Vec::new()),
        Cmd::Join { peer, flags } => mesh_cmds::node(state.root(), &flags, peer.0),
        Cmd::Submit {
            farm,
            out,
            wait,
            rerun,
            json,
        } => mesh_cmds::submit(&to, &farm, out, wait, rerun, json),
        Cmd::Wait { farm, json } => mesh_cmds::wait(&to, &farm, json),
        Cmd::Cancel { farm, tasks } => mesh_cmds::cancel(&to, &farm, &tasks),
        Cmd::Close { farm } => mesh_cmds::close(&to, &farm),
        Cmd::ControlPipe => mesh_cmds::control_pipe(&to),
        Cmd::Watch {
            farm,
            every,
            until_done,
        } => watch::watch(&state, &to, farm.as_deref(), every, until_done),
        Cmd::Status {
            farm,
            json,
            latency,
            nodes,
            busy,
            idle,
            name,
        } => {
            let show = if latency {
                mesh_cmds::Show::Latency
            } else if nodes || busy || idle || name.is_some() {
                mesh_cmds::Show::Nodes { busy, idle, name }
            } else {
                mesh_cmds::Show::Glance
            };
            if !status_on_mesh(&to, farm.as_deref(), json, &show)? {
                status_here(&state, farm.as_deref(), json)?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Logs {
            first,
            second,
            farm,
            attempt,
            follow,
            json,
        } => {
            let (farm, task) = logs_names(first, second, farm)?;
            let ask = LogsAsk {
                farm,
                task,
                attempt,
                follow,
                json,
            };
            logs(&to, &state, &ask)
        }
    }
}

/// What `mesh logs` asks for, its farm and task told apart.
struct LogsAsk {
    farm: Option<String>,
    task: String,
    attempt: Option<u32>,
    follow: bool,
    json: bool,
}

/// `mesh logs`: from the node here (or at `--mesh`), else of a `mesh run`
/// farm of this machine.
fn logs(to: &Target, state: &StateDir, ask: &LogsAsk) -> Result<ExitCode> {
    let LogsAsk {
        farm,
        task,
        attempt,
        follow,
        json,
    } = ask;
    let remote = !to.is_local();
    if remote && farm.is_none() {
        bail!("with --mesh, name the task's farm: `mesh logs FARM {task}`");
    }
    // No farm named: the node here looks for the newest farm it knows
    // with the task's stage. None such: a farm of `mesh run`.
    let named = farm.as_deref().unwrap_or("");
    let node_said = match mesh_cmds::logs(to, named, task, *attempt, *follow, *json)? {
        mesh_cmds::Logs::Shown(code) => return Ok(code),
        mesh_cmds::Logs::NoNode => None,
        mesh_cmds::Logs::Unknown(words) => Some(words),
    };
    if remote {
        return Err(no_mesh_farm(named));
    }
    let s = match (state.find(farm.as_deref()), node_said) {
        (Ok(s), _) => s,
        // A node runs here and no `mesh run` farm is found either: what
        // the node said, not that no farm has run here.
        (
            Err(StateError::Empty(_) | StateError::NoMesh(_) | StateError::NoMatch(_)),
            Some(words),
        ) => bail!("{words}"),
        (Err(e), _) => return Err(e.into()),
    };
    show::logs(state, &s, task, *attempt, *json)
}

/// `mesh resume` of a mesh farm: `farm`, or the newest unfinished one
/// whose home is the node; `None` where there is none such and the farm
/// is one of `mesh run` on this machine.
fn resume_on_mesh(
    to: &Target,
    farm: Option<&str>,
    out: Option<&Path>,
    json: bool,
) -> Result<Option<ExitCode>> {
    let mesh_farm = match farm {
        Some(q) => Some(q.to_string()),
        None => mesh_cmds::unfinished_home_farm(to)?,
    };
    let remote = !to.is_local();
    if let Some(q) = mesh_farm.as_deref() {
        if let Some(code) = mesh_cmds::resume(to, q, out, json)? {
            return Ok(Some(code));
        }
        if remote {
            return Err(no_mesh_farm(q));
        }
    } else if remote {
        bail!("no unfinished farm has the node at --mesh as its home; name the farm to resume");
    } else if out.is_some() {
        bail!("--out is for a mesh farm: name it (`mesh resume FARM --out DIR`)");
    }
    Ok(None)
}

/// The `mesh run` farm of this machine to resume: `farm`, or the most
/// recent one started in this folder that has something left to run
/// (failed tasks count with `retry_failed`).
fn farm_to_resume(state: &StateDir, farm: Option<&str>, retry_failed: bool) -> Result<String> {
    let target = match farm {
        Some(q) => state.find(Some(q))?,
        None => {
            let here = std::env::current_dir()
                .and_then(|d| d.canonicalize())
                .context("cannot read the current folder")?;
            state.most_recent_resumable(retry_failed, &here)?
        }
    };
    if target.state == RunState::Running {
        bail!(
            "farm {} is running (pid {} on {}); nothing to resume",
            target.id,
            target.pid,
            target.host
        );
    }
    if target.state.is_finished() && !retry_failed {
        eprintln!(
            "farm {} already finished ({}); use --retry-failed to run its failed tasks again",
            target.id,
            show::state_word(target.state)
        );
    }
    Ok(target.id)
}

/// `mesh status` from the node: the mesh (with a node running here, the
/// mesh is what status shows), or `farm` where the mesh has it; false
/// where the farm is one of `mesh run` on this machine.
fn status_on_mesh(
    to: &Target,
    farm: Option<&str>,
    json: bool,
    show: &mesh_cmds::Show,
) -> Result<bool> {
    let remote = !to.is_local();
    match farm {
        None => {
            let latency = matches!(show, mesh_cmds::Show::Latency);
            if let Some(s) = mesh_cmds::status(to, latency)? {
                let here = if remote {
                    "the node at --mesh"
                } else {
                    "this node"
                };
                mesh_cmds::print_status(&s, json, show, here)?;
                return Ok(true);
            }
        }
        Some(q) => {
            if mesh_cmds::farm_status(to, q, json)? {
                return Ok(true);
            }
            if remote {
                return Err(no_mesh_farm(q));
            }
        }
    }
    Ok(false)
}

/// `mesh status` of a `mesh run` farm of this machine: `farm`, or the most
/// recent one.
fn status_here(state: &StateDir, farm: Option<&str>, json: bool) -> Result<()> {
    let mut s = state.find(farm)?;
    if s.state != RunState::Running {
        // Not running: the store has the exact picture (a snapshot may lag a crash).
        match runner::inspect(state, &s.id) {
            Ok(i) => {
                s.counts = i.counts;
                s.stages = i.stages;
                s.used = i.used;
            }
            Err(RunError::AlreadyRunning { .. }) => {}
            Err(e) => return Err(e.into()),
        }
    }
    show::status(&s, json)
}

/// With `--mesh`, a farm the mesh does not know is an error: there is no
/// `mesh run` farm of this machine to fall back on.
fn no_mesh_farm(farm: &str) -> anyhow::Error {
    anyhow::anyhow!("the mesh knows no farm `{farm}` (see `mesh list`)")
}

/// The commands that act on this machine alone, which `--mesh` makes no sense for.
fn local_only(cmd: &Cmd) -> Option<&'static str> {
    match cmd {
        Cmd::Run { .. } => Some("run"),
        Cmd::Check { .. } => Some("check"),
        Cmd::Import { .. } => Some("import"),
        Cmd::Sim { .. } => Some("sim"),
        Cmd::Init => Some("init"),
        Cmd::Describe { .. } => Some("describe"),
        Cmd::Node { .. } => Some("node"),
        Cmd::Join { .. } => Some("join"),
        _ => None,
    }
}

/// Where to serve the dashboard, and its token off loopback (from the
/// mesh secret: `key`, or mesh.key in the state folder).
pub(crate) fn dashboard(
    state: &Path,
    addr: std::net::SocketAddr,
    key: Option<&Path>,
) -> Result<mesh_node::dash::Http> {
    let secret = if addr.ip().is_loopback() {
        None
    } else {
        let path = key
            .map(Path::to_path_buf)
            .unwrap_or_else(|| state.join(mesh_node::keys::PSK_FILE));
        let psk = mesh_node::keys::load_psk(&path).with_context(|| {
            format!("--http {addr} is not loopback: its token comes from the mesh secret (`mesh init` creates one)")
        })?;
        Some(psk.to_string())
    };
    Ok(mesh_node::dash::Http::new(
        addr,
        secret.as_deref().map(str::as_bytes),
    )?)
}

/// What this node offers, and its GPUs: found here, `--resources` over them.
pub(crate) fn node_resources(args: &NodeArgs) -> Result<(Resources, Vec<mesh_node::gpus::Gpu>)> {
    let declared = match &args.resources {
        Some(spec) => parse_resources(spec).with_context(|| format!("--resources {spec}"))?,
        None => Resources::new(),
    };
    Ok(mesh_node::machine(&declared))
}

/// What `mesh run` and `mesh resume` do again that a plain run would not.
struct Again {
    retry_failed: bool,
    rerun: Option<Vec<String>>,
}

/// Every stage `--rerun` names is one of the farm's.
pub(crate) fn check_stages(
    def: &mesh_protocol::farm::FarmDef,
    named: Option<&[String]>,
) -> Result<()> {
    for n in named.unwrap_or_default() {
        if def.stage_index(n).is_none() {
            let all: Vec<&str> = def.stages.iter().map(|s| s.name.as_str()).collect();
            bail!(
                "--rerun {n}: the farm has no such stage (stages: {})",
                all.join(", ")
            );
        }
    }
    Ok(())
}

fn run(
    start: RunStart,
    state: &StateDir,
    node: &NodeArgs,
    again: Again,
    output: &OutputArgs,
) -> Result<ExitCode> {
    let http = match node.http {
        Some(addr) => Some(dashboard(state.root(), addr, None)?),
        None => None,
    };
    let (resources, gpus) = node_resources(node)?;
    warm_workers(state.root(), node);
    let opts = RunOptions {
        state: state.clone(),
        resources,
        gpus,
        retry_failed: again.retry_failed,
        rerun: again.rerun,
        http,
        on_http: Some(|line| eprintln!("{line}")),
    };
    let mut obs = show::Progress::new(output.json, output.quiet, std::io::stderr().is_terminal());
    let status = runner::run_farm(start, &opts, &mut obs)?;
    obs.finish();
    if output.json {
        let mut v = serde_json::to_value(&status)?;
        v["mesh_cpu_ms"] = serde_json::json!(self_cpu_ms());
        out::outln!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        show::summary(&status, Path::new(&status.out), obs.said_stops());
    }
    Ok(match status.state {
        RunState::Done => ExitCode::SUCCESS,
        RunState::Interrupted => ExitCode::from(EXIT_INTERRUPTED),
        _ => ExitCode::from(EXIT_FAILED_TASKS),
    })
}

/// Warm Python workers for `python` tasks; without them (a state folder
/// that cannot take the worker's script) each runs as a process of its own.
pub(crate) fn warm_workers(state: &Path, node: &NodeArgs) {
    // How tasks are measured is settled (and a cgroup made) before the first.
    mesh_node::cgroup::init(node.cgroups);
    if node.enforce_mem {
        mesh_node::usage::enforce_mem();
    }
    if let Err(e) = mesh_node::warm::init(state, node.python.clone()) {
        eprintln!(
            "warning: no warm Python workers (cannot write {}: {e}): python tasks start an interpreter each",
            state.join("warm.py").display()
        );
    }
}

/// CPU time this process has used (user + system), in milliseconds.
fn self_cpu_ms() -> u64 {
    use nix::sys::resource::{getrusage, UsageWho};
    match getrusage(UsageWho::RUSAGE_SELF) {
        Ok(u) => {
            let ms =
                |t: nix::sys::time::TimeVal| t.tv_sec() as u64 * 1000 + t.tv_usec() as u64 / 1000;
            ms(u.user_time()) + ms(u.system_time())
        }
        Err(_) => 0,
    }
}

/// The farm and task `mesh logs` names: `[FARM] TASK`, or `TASK --farm FARM`.
fn logs_names(
    first: String,
    second: Option<String>,
    farm: Option<String>,
) -> Result<(Option<String>, String)> {
    let (farm, task) = match second {
        Some(task) if farm.is_some() => bail!(
            "the farm is named twice (`{first}` and --farm): `mesh logs {first} {task}` is enough"
        ),
        Some(task) => (Some(first), task),
        None => (farm, first),
    };
    if !task.contains('/') {
        let farm_hint = farm.as_deref().unwrap_or(&task);
        bail!(
            "`{task}` is not a task: TASK is <stage>/<index>, e.g. `mesh logs {farm_hint} solve/3`; `mesh status {farm_hint}` lists a farm's stages and failures"
        );
    }
    Ok((farm, task))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_says_each_cause_once() {
        let io = || std::io::Error::new(std::io::ErrorKind::NotFound, "no such file");
        // An error that names its cause and keeps it as its source.
        let named = mesh_node::IoError {
            what: "cannot write the store's log /s/mesh.wal".into(),
            source: io(),
        };
        let e = anyhow::Error::new(named).context("cannot open the farm");
        assert_eq!(
            describe(&e),
            "cannot open the farm: cannot write the store's log /s/mesh.wal: no such file"
        );
        // A cause the message does not name is still said.
        let e = anyhow::Error::new(io()).context("reading params.txt");
        assert_eq!(describe(&e), "reading params.txt: no such file");
    }
}
