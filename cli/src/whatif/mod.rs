//! `mesh sim --workflow TRACE.json`: what a recorded workflow would take on a mesh of N nodes, the fewest nodes for a deadline, and the spread under jitter, each answer a set of simulations of the real peers.

pub mod farm;
mod load;
mod plot;

use std::collections::BTreeMap;
use std::process::ExitCode;

use anyhow::{Context, Result};
use mesh_node::view::bytes;
use mesh_protocol::resources::{parse_amount, parse_resources, MEM};
use mesh_protocol::Resources;
use mesh_sim::whatif::{fewest_nodes, sweep, Row, Search};
use mesh_sim::{load_scenario, Links, Replay, SimConfig, SimError, SimReport, WhatIf};
use serde_json::json;

use crate::out::outln;
use crate::sim_args::SimArgs;
use crate::EXIT_FAILED_TASKS;

pub use load::Loaded;

/// Node counts when neither `--nodes` nor `--deadline` says.
const DEFAULT_COUNTS: [usize; 5] = [4, 8, 16, 32, 64];
/// Memory per core a node has when `--mem-per-node` does not say.
const MEM_PER_CORE: u64 = 4 << 30;

pub fn run(args: &SimArgs, path: &std::path::Path) -> Result<ExitCode> {
    let scaled = args.tasks.map(|n| (n as usize, args.seed.unwrap_or(1)));
    let loaded = load::load_scaled(path, args.time_scale, scaled)?;
    answer(args, loaded, None)
}

/// A farm of the mesh as it stands (`mesh sim --farm`): the nodes it has
/// now, and what is done, running and waiting.
pub(crate) struct Standing {
    pub farm: String,
    /// Unix ms when its state was read: the rows' times count from it.
    pub now_ms: u64,
    pub done: usize,
    pub running: usize,
    pub waiting: usize,
    pub nodes: usize,
    pub cores: u32,
    pub mem: u64,
    /// Stages with no finished task, whose runtimes came from the others'.
    pub guessed: Vec<String>,
}

/// Simulates `loaded` as asked: its table, or the fewest nodes for a
/// deadline; `standing` when it is what is left of a farm of the mesh.
pub(crate) fn answer(
    args: &SimArgs,
    mut loaded: Loaded,
    standing: Option<Standing>,
) -> Result<ExitCode> {
    let cluster = match &args.scenario {
        Some(p) => Some(load_scenario(p).with_context(|| format!("scenario {}", p.display()))?),
        None => None,
    };
    let cores = args
        .cores_per_node
        .or(standing.as_ref().map(|s| s.cores))
        .unwrap_or(4);
    let mem = match &args.mem_per_node {
        Some(m) => parse_amount(MEM, m)
            .map_err(|e| anyhow::anyhow!("--mem-per-node {m:?}: {e}"))?
            .whole(),
        None => match &standing {
            Some(s) if s.mem > 0 && args.cores_per_node.is_none() => s.mem,
            // Enough for the largest task, whatever the cores.
            _ => (u64::from(cores) * MEM_PER_CORE).max(loaded.most_mem()),
        },
    };
    match &cluster {
        Some(c) => {
            let mut machines: Vec<Resources> = Vec::new();
            for g in &c.nodes {
                machines.push(parse_resources(&g.resources).map_err(|e| anyhow::anyhow!("{e}"))?);
            }
            machines.extend(c.alloc.iter().map(|a| a.node_resources()));
            loaded.check_fits_any(&machines)?;
            if !c.alloc.is_empty() {
                // A batch node drains before its walltime: the what-if
                // knows each task's runtime, so each stage says how long
                // its longest may take (`expected`), as a user would, and
                // stays off nodes that would not finish it.
                loaded.expect_longest(1.0 + args.jitter);
            }
        }
        None => loaded.check_fits(cores, mem)?,
    }
    let base = WhatIf {
        seed: args.seed.unwrap_or(1),
        nodes: 1,
        node: format!("cpu={cores},mem={mem}B"),
        replay: Replay {
            links: Links {
                bytes_per_s: args.bandwidth.0,
                latency_ms: args.latency.as_millis() as u64,
            },
            jitter: args.jitter,
        },
        steal: !args.no_steal,
        step: args.step,
        cluster: cluster.clone(),
    };
    // The seed comes first, so a run that goes wrong can be replayed.
    eprintln!("mesh sim: seed {}", base.seed);
    let wl = &loaded.workload;
    let repeat = args.repeat.max(1) as usize;
    // First run of each count, for the pictures.
    let mut reports: BTreeMap<usize, SimReport> = BTreeMap::new();
    let counts: Vec<usize> = match (&args.nodes, args.deadline, &cluster) {
        (Some(n), ..) => n.0.clone(),
        (None, Some(_), _) => Vec::new(),
        (None, None, Some(c)) => vec![c.node_count()],
        (None, None, None) => match &standing {
            Some(s) => vec![s.nodes.max(1)],
            None => DEFAULT_COUNTS.to_vec(),
        },
    };
    let answer = (|| -> Result<(Vec<Row>, Option<Search>), SimError> {
        let rows = sweep(wl, &base, &counts, repeat, |n, r| {
            reports.insert(n, r);
        })?;
        let search = match args.deadline {
            Some(d) => Some(fewest_nodes(
                wl,
                &base,
                d.as_millis() as u64,
                repeat,
                |n, r| {
                    reports.insert(n, r);
                },
            )?),
            None => None,
        };
        Ok((rows, search))
    })();
    let (rows, search) = match answer {
        Ok(a) => a,
        Err(e) => return Ok(failed(&e, "mesh sim --workflow ...")),
    };
    let view = View {
        loaded: &loaded,
        args,
        base: &base,
        cores,
        mem,
        standing: standing.as_ref(),
        repeat,
        rows: &rows,
        search: search.as_ref(),
        cluster: cluster.as_ref(),
    };
    // The run drawn: the deadline's answer, else the first count asked.
    let drawn = search
        .as_ref()
        .and_then(|s| s.nodes)
        .or(counts.first().copied())
        .and_then(|n| reports.get(&n).map(|r| (n, r)));
    if let Some(file) = &args.plot {
        let svg = plot::svg(&view, drawn).context("cannot draw the plot")?;
        std::fs::write(file, svg).with_context(|| format!("cannot write {}", file.display()))?;
    }
    if let (Some(file), Some((_, r))) = (&args.svg, drawn) {
        std::fs::write(file, r.to_svg())
            .with_context(|| format!("cannot write {}", file.display()))?;
    }
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&view.json())?);
    } else {
        view.print();
    }
    let missed = search.as_ref().is_some_and(|s| s.nodes.is_none());
    Ok(if missed {
        ExitCode::from(EXIT_FAILED_TASKS)
    } else {
        ExitCode::SUCCESS
    })
}

/// What was asked and answered, for people or as JSON.
pub(crate) struct View<'a> {
    loaded: &'a Loaded,
    args: &'a SimArgs,
    base: &'a WhatIf,
    cores: u32,
    mem: u64,
    standing: Option<&'a Standing>,
    repeat: usize,
    rows: &'a [Row],
    search: Option<&'a Search>,
    cluster: Option<&'a SimConfig>,
}

impl View<'_> {
    /// Every count simulated, once each, by nodes.
    fn all_rows(&self) -> Vec<&Row> {
        let mut all: BTreeMap<usize, &Row> = BTreeMap::new();
        for r in self
            .rows
            .iter()
            .chain(self.search.into_iter().flat_map(|s| &s.tried))
        {
            all.entry(r.nodes).or_insert(r);
        }
        all.into_values().collect()
    }

    fn json(&self) -> serde_json::Value {
        let l = self.loaded;
        let t = &l.trace;
        let wl = &l.workload;
        let mut v = json!({
            "workflow": {
                "trace": l.source,
                "name": t.name,
                "schema": t.schema,
                "system": t.system,
                "tasks": wl.tasks(),
                "edges": l.edges,
                "stages": l.stages,
                "time_scale": self.args.time_scale,
                "work_ms": wl.work_ms(),
                "critical_path_ms": wl.critical_path_ms(),
                "read_bytes": l.read_bytes,
                "input_bytes": wl.input_bytes,
                "untimed_tasks": l.untimed,
            },
            "cluster": {
                "cores_per_node": self.cores,
                "mem_per_node": self.mem,
                "node": self.base.node,
                "bandwidth_bytes_per_s": self.base.replay.links.bytes_per_s,
                "latency_ms": self.base.replay.links.latency_ms,
                "steal": self.base.steal,
                "scenario": self.args.scenario.as_ref().map(|p| p.display().to_string()),
                "alloc": self.cluster.map(|c| c.alloc.len()),
            },
            "seed": self.base.seed,
            "repeat": self.repeat,
            "jitter": self.base.replay.jitter,
            "rows": self.rows,
            "deadline": self.search,
        });
        if let Some(st) = self.standing {
            // From now: what a script or the Python client reads.
            let rows: Vec<serde_json::Value> = self
                .all_rows()
                .iter()
                .map(|r| {
                    json!({
                        "nodes": r.nodes,
                        "finish_p50_ms": r.makespan_p50_ms,
                        "finish_p90_ms": r.makespan_p90_ms,
                        "finish_p50_at_ms": st.now_ms + r.makespan_p50_ms,
                        "finish_p90_at_ms": st.now_ms + r.makespan_p90_ms,
                        "utilization": r.utilization,
                        "node_hours": r.node_hours,
                    })
                })
                .collect();
            v["farm"] = json!({
                "id": st.farm,
                "now_ms": st.now_ms,
                "done": st.done,
                "running": st.running,
                "waiting": st.waiting,
                "nodes": st.nodes,
                "stages_guessed": st.guessed,
                "rows": rows,
            });
        }
        v
    }

    fn print(&self) {
        let l = self.loaded;
        let t = &l.trace;
        let wl = &l.workload;
        if let Some(st) = self.standing {
            outln!(
                "farm {} as it stands at {} UTC: {} done, {} running, {} waiting; the mesh has {} node{} of {} cores",
                st.farm,
                clock(st.now_ms),
                st.done,
                st.running,
                st.waiting,
                st.nodes,
                if st.nodes == 1 { "" } else { "s" },
                st.cores,
            );
            if !st.guessed.is_empty() {
                outln!(
                    "  no task of {} has finished yet: their runtimes are drawn from the other stages'",
                    st.guessed.join(", ")
                );
            }

            outln!("  times below count from then, for what is left:");
        }
        let system = t
            .system
            .as_deref()
            .map(|s| format!(" ({s})"))
            .unwrap_or_default();
        outln!(
            "workflow {}: WfFormat {}{system}, {} tasks, {} edges, {} stages",
            l.source,
            t.schema,
            wl.tasks(),
            l.edges,
            l.stages
        );
        outln!(
            "  runtimes {} in all, critical path {} (time scale {}); {} read from parents, {} of inputs",
            span(wl.work_ms()),
            span(wl.critical_path_ms()),
            self.args.time_scale,
            bytes(l.read_bytes),
            bytes(wl.input_bytes),
        );
        if l.untimed > 0 {
            outln!(
                "  note: {} tasks have no recorded runtime: they take no time",
                l.untimed
            );
        }
        let links = match self.base.replay.links.bytes_per_s {
            Some(b) => format!("{}/s", decimal_bytes(b)),
            None => "no transfer time".into(),
        };
        let jitter = if self.base.replay.jitter > 0.0 {
            format!(", runtimes x 1 ± {}", self.base.replay.jitter)
        } else {
            String::new()
        };
        let nodes = match self.cluster {
            Some(c) => {
                let groups: Vec<String> = c
                    .nodes
                    .iter()
                    .map(|g| format!("{} x {}", g.count, g.resources))
                    .collect();
                let queues: Vec<String> = c
                    .alloc
                    .iter()
                    .map(|a| {
                        format!(
                            ", queue {} of up to {} jobs of {} cores",
                            a.name, a.max, a.cores
                        )
                    })
                    .collect();
                format!(
                    "the scenario's nodes ({}, scaled){}",
                    groups.join(", "),
                    queues.concat()
                )
            }
            None => format!("nodes of {} cores and {}", self.cores, bytes(self.mem)),
        };
        outln!(
            "  {nodes}; links {links}, {} ms; seed {}, {} run{} per count{jitter}",
            self.base.replay.links.latency_ms,
            self.base.seed,
            self.repeat,
            if self.repeat == 1 { "" } else { "s" },
        );
        let rows = self.all_rows();
        let many = self.repeat > 1;
        if rows.is_empty() {
            self.print_search();
            return;
        }
        let head = if many {
            format!("{:>13}  {:>13}", "makespan p50", "p90")
        } else {
            format!("{:>13}", "makespan")
        };
        outln!(
            "{:>6}  {head}  {:>11}  {:>10}  {:>14}  {:>10}",
            "nodes",
            "utilization",
            "node-hours",
            "critical share",
            "moved"
        );
        for r in &rows {
            let ms = if many {
                format!(
                    "{:>13}  {:>13}",
                    span(r.makespan_p50_ms),
                    span(r.makespan_p90_ms)
                )
            } else {
                format!("{:>13}", span(r.makespan_p50_ms))
            };
            let moved = r.runs.first().map_or(0, |x| x.moved_bytes);
            outln!(
                "{:>6}  {ms}  {:>10.1}%  {:>10.2}  {:>14.2}  {:>10}",
                r.nodes,
                r.utilization * 100.0,
                r.node_hours,
                r.critical_share,
                bytes(moved)
            );
        }
        self.print_search();
        if let Some(st) = self.standing {
            for r in &rows {
                outln!(
                    "on {} node{}: finished at about {} UTC (p50), {} (p90)",
                    r.nodes,
                    if r.nodes == 1 { "" } else { "s" },
                    clock(st.now_ms + r.makespan_p50_ms),
                    clock(st.now_ms + r.makespan_p90_ms),
                );
            }
        }
    }

    fn print_search(&self) {
        let many = self.repeat > 1;
        if let Some(s) = self.search {
            let tried: Vec<String> = s.tried.iter().map(|r| r.nodes.to_string()).collect();
            let which = if many { "p90 makespan" } else { "makespan" };
            match s.nodes {
                Some(n) => {
                    let r = s.tried.iter().find(|r| r.nodes == n).expect("tried");
                    // Fewer than the bound were not simulated: say why.
                    let below = if s.least > 1 {
                        format!(" (fewer than {} cannot hold the work by then)", s.least)
                    } else {
                        String::new()
                    };
                    outln!(
                        "deadline {}: {n} nodes meet it ({which} {}); tried {}{below}",
                        span(s.deadline_ms),
                        span(r.makespan_p90_ms),
                        tried.join(", ")
                    );
                }
                None => outln!(
                    "deadline {}: not met: {}{}",
                    span(s.deadline_ms),
                    s.why_not.as_deref().unwrap_or("no count tried met it"),
                    if tried.is_empty() {
                        String::new()
                    } else {
                        format!(" (tried {})", tried.join(", "))
                    }
                ),
            }
        }
    }
}

/// Virtual milliseconds for people: `850 ms`, `42.5 s`, `12m 05s`, `3h 20m`.
/// A simulation that went wrong, said with how to replay it (`how`: the
/// command up to its seed); the exit code for it.
pub(crate) fn failed(e: &SimError, how: &str) -> ExitCode {
    eprintln!("error: {e}");
    if let Some(seed) = e.seed() {
        eprintln!("replay: {how} --seed {seed}");
    }
    ExitCode::from(EXIT_FAILED_TASKS)
}

/// Unix ms as a UTC date and time: `2026-12-04 18:05:00`.
fn clock(unix_ms: u64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(unix_ms);
    let s = humantime::format_rfc3339_seconds(t).to_string();
    s.get(..19).unwrap_or(&s).replace('T', " ")
}

pub(crate) fn span(ms: u64) -> String {
    if ms < 1000 {
        format!("{ms} ms")
    } else if ms < 60_000 {
        format!("{:.1} s", ms as f64 / 1000.0)
    } else if ms < 3_600_000 {
        let s = ms / 1000;
        format!("{}m {:02}s", s / 60, s % 60)
    } else {
        let m = ms / 60_000;
        format!("{}h {:02}m", m / 60, m % 60)
    }
}

/// A rate's bytes in decimal units, as links are sold: `125 MB`, `1.25 GB`.
fn decimal_bytes(b: f64) -> String {
    let units = ["B", "kB", "MB", "GB", "TB"];
    let mut v = b;
    let mut u = 0;
    while v >= 1000.0 && u + 1 < units.len() {
        v /= 1000.0;
        u += 1;
    }
    let num = format!("{v:.3}");
    let num = num.trim_end_matches('0').trim_end_matches('.');
    format!("{num} {}", units[u])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_and_rates_read_as_people_write_them() {
        assert_eq!(span(850), "850 ms");
        assert_eq!(span(42_500), "42.5 s");
        assert_eq!(span(725_000), "12m 05s");
        assert_eq!(span(12_000_000), "3h 20m");
        assert_eq!(decimal_bytes(125e6), "125 MB");
        assert_eq!(decimal_bytes(1.25e9), "1.25 GB");
    }
}
