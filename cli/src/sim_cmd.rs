//! `mesh sim`: run a load-imbalance scenario on the simulator and print what it measured.

use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use mesh_sim::{load_scenario, parse_durations, SimConfig};

use crate::out::{out, outln};
use crate::sim_args::SimArgs;
use crate::whatif::failed;
use mesh_node::control::Target;

pub fn sim(args: &SimArgs, to: &Target) -> Result<ExitCode> {
    if let Some(trace) = &args.workflow {
        return crate::whatif::run(args, trace);
    }
    if let Some(farm) = &args.farm {
        return crate::whatif::farm::run(args, to, farm);
    }
    let nodes = match args.nodes.as_ref().map(|n| &n.0[..]) {
        Some([n]) => Some(*n),
        Some(_) => bail!("--nodes takes one count without --workflow"),
        None => None,
    };
    let mut cfg = match &args.scenario {
        Some(p) => load_scenario(p).with_context(|| format!("scenario {}", p.display()))?,
        None => SimConfig::simple(1, 100, "cpu=4", 10_000, "zipf:1.2"),
    };
    if let Some(s) = args.seed {
        cfg.seed = s;
    }
    if let Some(n) = nodes {
        cfg.scale_nodes(n);
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
    cfg.step |= args.step;
    if let Some(d) = args.deadline {
        return crate::sim_deadline::deadline(&crate::sim_deadline::Ask {
            cfg: &cfg,
            deadline_ms: d.as_millis() as u64,
            within: args.search_time.within(),
            json: args.json,
        });
    }
    // The seed comes first, so a run that goes wrong can be replayed.
    eprintln!("mesh sim: seed {}", cfg.seed);
    let report = match mesh_sim::run(&cfg) {
        Ok(r) => r,
        Err(e) => return Ok(failed(&e, "mesh sim ...")),
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
