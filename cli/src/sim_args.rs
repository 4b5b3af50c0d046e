//! The flags of `mesh sim`, read by the scenario runs (`sim_cmd`) and the what-if of a recorded workflow (`whatif`) alike.

use std::path::PathBuf;

use crate::args;

#[derive(clap::Args)]
#[command(group = clap::ArgGroup::new("replay").args(["workflow", "farm"]))]
pub struct SimArgs {
    /// A scenario file (TOML, see sim/scenarios/); the flags below override
    /// it. With --workflow, its nodes, allocation queues, network and
    /// knobs are the cluster, and the workflow is its farm.
    #[arg(value_parser = args::path)]
    pub scenario: Option<PathBuf>,
    /// Replay a recorded workflow (a WfCommons trace, WfFormat 1.4 to 1.6)
    /// instead of a scenario's farm: its graph, runtimes, cores, memory
    /// and file sizes, through the real peers (see docs/sim.md).
    #[arg(long, value_name = "TRACE.json", value_parser = args::path,
          conflicts_with = "durations")]
    pub workflow: Option<PathBuf>,
    /// A farm of this mesh, running or finished, simulated from where it
    /// stands now: what is done stays done, what runs goes on for what is
    /// left of it, and each stage's runtimes are drawn from its finished
    /// tasks. Times in the table count from now (see docs/sim.md).
    #[arg(long, value_name = "FARM", conflicts_with_all = ["workflow", "scenario", "durations"])]
    pub farm: Option<String>,
    /// With --farm: each stage's memory ask set to the most a task of it
    /// used (see `mesh status FARM`), for "with asks set to what was used,
    /// 20 nodes finish in ..."; stages with no measured task keep their ask.
    #[arg(long, requires = "farm")]
    pub asks_used: bool,
    /// Simulated nodes (default 100, or the scenario's); with a scenario, its
    /// node groups are scaled to this many nodes in the same proportions.
    /// With --workflow, one count or several (`4,8,16`), a simulation each
    /// (default 4,8,16,32,64).
    #[arg(long, value_name = "N[,N...]", value_parser = args::node_counts)]
    pub nodes: Option<args::NodeCounts>,
    /// Tasks of the farm (default 10000, or the scenario's first stage).
    /// With --workflow or --farm: the workflow with about this many tasks,
    /// each stage of more than one task scaled in proportion (a stage of
    /// one stays one), runtimes drawn per stage; with --farm, from a
    /// fresh start rather than from where the farm stands.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub tasks: Option<u64>,
    /// How long tasks run: `uniform:5m..20m`, `exp:90s`, `zipf:1.2`, `bimodal:10s,5m,0.1`,
    /// `2m`; a bare number is milliseconds.
    #[arg(long)]
    pub durations: Option<String>,
    /// With --workflow: cores of each node (default 4); with --farm, the
    /// mesh's nodes' own unless said.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..),
          requires = "replay", conflicts_with = "scenario")]
    pub cores_per_node: Option<u32>,
    /// With --workflow: memory of each node, e.g. `64G` (default 4 GiB a
    /// core, and at least the largest task's).
    #[arg(
        long,
        value_name = "SIZE",
        requires = "replay",
        conflicts_with = "scenario"
    )]
    pub mem_per_node: Option<String>,
    /// With --workflow: each task takes its recorded runtime times this.
    #[arg(long, value_name = "S", default_value_t = 1.0, value_parser = args::factor, requires = "replay")]
    pub time_scale: f64,
    /// With --workflow: each link's bandwidth (`125MB/s`, `10Gbit/s`, or
    /// `inf` for transfers that take no time).
    #[arg(long, value_name = "RATE", default_value = "1Gbit/s", value_parser = args::bandwidth, requires = "replay")]
    pub bandwidth: args::Bandwidth,
    /// With --workflow: one way across the network, for messages and files.
    #[arg(long, value_name = "DURATION", default_value = "1ms", value_parser = args::duration, requires = "replay")]
    pub latency: std::time::Duration,
    /// Find the fewest nodes that finish by then: a duration from now
    /// (`6h`, `2days`) or a date and time (`2026-12-04 18:00`, UTC); nodes
    /// of the trace's or the mesh's shape with --workflow or --farm, else
    /// of the scenario's mix.
    #[arg(long, value_name = "WHEN", value_parser = args::deadline)]
    pub deadline: Option<std::time::Duration>,
    /// With --deadline (not --workflow or --farm): how long the search may
    /// take to answer (`30s`, `10m`, or `none`). Past it, the counts still
    /// simulating are stopped and the search says what it knows: which
    /// count it could not finish, the fewest that met and the most that
    /// missed so far (exit 3).
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = args::search_time, requires = "deadline")]
    pub search_time: args::SearchTime,
    /// With --workflow: runs per node count, seeds SEED, SEED+1, ...; the
    /// table gives the median and 90th percentile makespan.
    #[arg(long, value_name = "K", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..), requires = "replay")]
    pub repeat: u32,
    /// With --workflow: each runtime is its recorded one times a factor
    /// drawn from [1 - J, 1 + J] per task and run.
    #[arg(long, value_name = "J", default_value_t = 0.0, value_parser = args::share, requires = "replay")]
    pub jitter: f64,
    /// With --workflow: draw makespan and utilization against nodes, and
    /// each node's busy cores over one run.
    #[arg(long, value_name = "FILE.svg", value_parser = args::path, requires = "replay")]
    pub plot: Option<PathBuf>,
    /// Everything random follows from it (default: the scenario's, or 1).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Turn work stealing off, to compare.
    #[arg(long)]
    pub no_steal: bool,
    /// Step every periodic timer of the simulated nodes, even those that
    /// do nothing, rather than skip them: the same answer, slower; a check
    /// of the skipping (see docs/sim.md).
    #[arg(long)]
    pub step: bool,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Draw utilization over time per node and a sample of the task stream.
    #[arg(long, value_name = "FILE", value_parser = args::path)]
    pub svg: Option<PathBuf>,
}
