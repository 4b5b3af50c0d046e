//! `mesh sim`: run a load-imbalance scenario on the simulator and print what it measured.

use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use mesh_sim::{load_scenario, parse_durations, SimConfig};

use crate::out::{out, outln};
use crate::sim_args::SimArgs;
use crate::whatif::{failed, span};
use crate::EXIT_FAILED_TASKS;
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
    if let Some(d) = args.deadline {
        return deadline(&cfg, d.as_millis() as u64, args.json);
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

/// The most nodes a deadline's search simulates (the simulator's tested size).
const NODES_MOST: usize = 10_000;

/// One node count tried for a deadline.
#[derive(serde::Serialize)]
struct Tried {
    nodes: usize,
    /// None: given up on once still running at the deadline (see
    /// `mesh_sim::run_within`), as `past_deadline` says.
    makespan_ms: Option<u64>,
    utilization: Option<f64>,
    node_hours: Option<f64>,
    meets: bool,
    past_deadline: bool,
}

/// `--deadline` over a scenario's (or the flags') farm: the fewest nodes of
/// the scenario's mix that finish it in time, each count a simulation.
/// The search starts where the cores could just hold the mean work by
/// then: fewer nodes cannot meet it, and each simulation of a long farm
/// costs its nodes times its virtual time.
fn deadline(cfg: &SimConfig, deadline_ms: u64, json: bool) -> Result<ExitCode> {
    let from = cfg.nodes_for_work(deadline_ms);
    let tasks: u64 = cfg.stages.iter().map(|s| s.tasks).sum();
    // More nodes than tasks leave some idle whatever happens.
    let most = (tasks.max(1) as usize).max(from);
    if from > NODES_MOST {
        bail!(
            "the deadline {} needs at least {from} nodes just to hold the farm's mean work; \
             mesh sim simulates at most {NODES_MOST}",
            span(deadline_ms)
        );
    }
    let most = most.min(NODES_MOST);
    eprintln!("mesh sim: seed {}", cfg.seed);
    let mut tried: Vec<Tried> = Vec::new();
    // Said of the first count tried, as its report would (every count may
    // be given up on before a report).
    let shape = {
        let mut c = cfg.clone();
        c.scale_nodes(from.max(1));
        match mesh_sim::shapes_of(&c) {
            Ok(s) => mesh_sim::report::node_kinds(&s),
            Err(e) => return Ok(failed(&e, "mesh sim ...")),
        }
    };
    let found = mesh_sim::whatif::fewest(from, most, |n| -> Result<bool, mesh_sim::SimError> {
        let mut c = cfg.clone();
        c.scale_nodes(n);
        // A count still running at the deadline has answered: no.
        let Some(r) = mesh_sim::run_within(&c, deadline_ms)? else {
            tried.push(Tried {
                nodes: n,
                makespan_ms: None,
                utilization: None,
                node_hours: None,
                meets: false,
                past_deadline: true,
            });
            return Ok(false);
        };
        let meets = r.tasks_done == tasks && r.makespan <= deadline_ms;
        tried.push(Tried {
            nodes: n,
            makespan_ms: Some(r.makespan),
            utilization: Some(r.utilization),
            node_hours: Some(n as f64 * r.makespan as f64 / 3_600_000.0),
            meets,
            past_deadline: false,
        });
        Ok(meets)
    });
    let found = match found {
        Ok(f) => f,
        Err(e) => return Ok(failed(&e, "mesh sim ...")),
    };
    let why_not = found.is_none().then(|| {
        format!(
            "not met with {most} nodes, a node for every task: the longest tasks alone take longer"
        )
    });
    if json {
        outln!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "deadline_ms": deadline_ms,
                "nodes": found,
                "node": shape,
                "tried": tried,
                "why_not": why_not,
            }))?
        );
    } else {
        let stages: Vec<String> = cfg
            .stages
            .iter()
            .map(|s| format!("{} tasks of {} ({})", s.tasks, s.durations, s.resources))
            .collect();
        outln!("farm: {}", stages.join(", then "));
        outln!(
            "nodes of {shape}; searched from {from} node{}, the fewest whose cores hold the mean work by then",
            if from == 1 { "" } else { "s" }
        );
        outln!(
            "{:>6}  {:>13}  {:>11}  {:>10}  meets",
            "nodes",
            "makespan",
            "utilization",
            "node-hours"
        );
        let mut rows: Vec<&Tried> = tried.iter().collect();
        rows.sort_by_key(|t| t.nodes);
        for t in rows {
            let (makespan, util, hours) = match (t.makespan_ms, t.utilization, t.node_hours) {
                (Some(m), Some(u), Some(h)) => {
                    (span(m), format!("{:.1}%", u * 100.0), format!("{h:.2}"))
                }
                // Stopped at the deadline: its end is later, by how much
                // was not simulated.
                _ => (format!("> {}", span(deadline_ms)), "—".into(), "—".into()),
            };
            outln!(
                "{:>6}  {:>13}  {:>11}  {:>10}  {}",
                t.nodes,
                makespan,
                util,
                hours,
                if t.meets { "yes" } else { "no" }
            );
        }
        let order: Vec<String> = tried.iter().map(|t| t.nodes.to_string()).collect();
        match found {
            Some(n) => {
                let t = tried.iter().find(|t| t.nodes == n).expect("tried");
                outln!(
                    "deadline {}: {n} nodes meet it (makespan {}); tried {}",
                    span(deadline_ms),
                    span(t.makespan_ms.unwrap_or_default()),
                    order.join(", ")
                );
            }
            None => outln!(
                "deadline {}: {} (tried {})",
                span(deadline_ms),
                why_not.as_deref().unwrap_or_default(),
                order.join(", ")
            ),
        }
    }
    Ok(if found.is_some() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_FAILED_TASKS)
    })
}
