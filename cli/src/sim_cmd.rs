//! `mesh sim`: run a load-imbalance scenario on the simulator and print what it measured.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use mesh_sim::{load_scenario, parse_durations, NodeGroup, SimConfig};

use crate::out::{out, outln};
use crate::{args, EXIT_FAILED_TASKS};

#[derive(clap::Args)]
pub struct SimArgs {
    /// A scenario file (TOML, see sim/scenarios/); the flags below override it.
    #[arg(value_parser = args::path)]
    pub scenario: Option<PathBuf>,
    /// Simulated nodes (default 100, or the scenario's); with a scenario, its
    /// node groups are scaled to this many nodes in the same proportions.
    #[arg(long)]
    pub nodes: Option<usize>,
    /// Tasks of the farm (default 10000, or the scenario's first stage).
    #[arg(long)]
    pub tasks: Option<u64>,
    /// How long tasks run: `zipf:1.2`, `uniform:5..20` (ms), `bimodal:10,500,0.1`, `exp:40`, `12`.
    #[arg(long)]
    pub durations: Option<String>,
    /// Everything random follows from it (default: the scenario's, or 1).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Turn work stealing off, to compare.
    #[arg(long)]
    pub no_steal: bool,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Draw utilization over time per node and a sample of the task stream.
    #[arg(long, value_name = "FILE", value_parser = args::path)]
    pub svg: Option<PathBuf>,
}

pub fn sim(args: &SimArgs) -> Result<ExitCode> {
    let mut cfg = match &args.scenario {
        Some(p) => load_scenario(p).with_context(|| format!("scenario {}", p.display()))?,
        None => SimConfig::simple(1, 100, "cpu=4", 10_000, "zipf:1.2"),
    };
    if let Some(s) = args.seed {
        cfg.seed = s;
    }
    if let Some(n) = args.nodes {
        scale_nodes(&mut cfg.nodes, n);
    }
    if let Some(t) = args.tasks {
        if let Some(stage) = cfg.stages.first_mut() {
            stage.tasks = t;
        }
    }
    if let Some(d) = &args.durations {
        parse_durations(d).map_err(|e| anyhow::anyhow!("--durations: {e}"))?;
        for stage in &mut cfg.stages {
            stage.durations = d.clone();
        }
    }
    if args.no_steal {
        cfg.steal = false;
    }
    // The seed comes first, so a run that goes wrong can be replayed.
    eprintln!("mesh sim: seed {}", cfg.seed);
    let report = match mesh_sim::run(&cfg) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            if let Some(seed) = e.seed() {
                eprintln!("replay: mesh sim ... --seed {seed}");
            }
            return Ok(ExitCode::from(EXIT_FAILED_TASKS));
        }
    };
    if let Some(path) = &args.svg {
        std::fs::write(path, report.to_svg())
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        out!("{}", report.summary());
    }
    Ok(ExitCode::SUCCESS)
}

/// Scales node groups to `n` nodes in total, keeping their proportions (each group keeps at least one node).
fn scale_nodes(groups: &mut Vec<NodeGroup>, n: usize) {
    let total: usize = groups.iter().map(|g| g.count).sum();
    if total == 0 || groups.is_empty() {
        return;
    }
    let mut left = n;
    let last = groups.len() - 1;
    for (i, g) in groups.iter_mut().enumerate() {
        let c = if i == last {
            left
        } else {
            (g.count * n / total)
                .max(1)
                .min(left.saturating_sub(last - i))
        };
        g.count = c;
        left -= c;
    }
    groups.retain(|g| g.count > 0);
}
