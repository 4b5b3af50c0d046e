//! `mesh sim --deadline` over a scenario's farm: the fewest nodes that finish it in time, each count a simulation, within the time given to answer.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use mesh_sim::search::{fewest_near, Found, Verdict};
use mesh_sim::{SimConfig, SimError, Within};

use crate::out::outln;
use crate::whatif::{failed, span};
use crate::EXIT_FAILED_TASKS;

/// The most nodes a deadline's search simulates (the simulator's tested size).
const NODES_MOST: usize = 10_000;
/// Counts simulated at once: one a core, but no more than this many
/// (each of thousands of nodes holds its peers' memory).
const AT_ONCE_MOST: usize = 8;
/// The search ran out of its time before it could say the fewest nodes.
pub(crate) const EXIT_NOT_ANSWERED: u8 = 3;

/// One node count tried for a deadline.
#[derive(serde::Serialize)]
struct Tried {
    nodes: usize,
    /// None: given up on once still running at the deadline (see
    /// `mesh_sim::run_within`), as `past_deadline` says, or not finished
    /// in the time to answer (`finished` false).
    makespan_ms: Option<u64>,
    utilization: Option<f64>,
    node_hours: Option<f64>,
    meets: bool,
    past_deadline: bool,
    /// False when the search's time ran out first, `simulated_ms` into the farm.
    finished: bool,
    simulated_ms: Option<u64>,
    /// Not finished, or given up past the deadline: where its farm would
    /// end at its pace so far against greedy list scheduling (an
    /// estimate, not a simulated answer).
    projected_ms: Option<u64>,
}

impl Tried {
    fn verdict(&self) -> Verdict {
        match (self.finished, self.meets) {
            (false, _) => Verdict::Unknown,
            (true, true) => Verdict::Meets,
            (true, false) => Verdict::Misses,
        }
    }
}

/// What the search is given.
pub(crate) struct Ask<'a> {
    pub cfg: &'a SimConfig,
    pub deadline_ms: u64,
    /// Wall-clock time to answer in; None: as long as it takes.
    pub within: Option<Duration>,
    pub json: bool,
}

/// The fewest nodes of the scenario's mix that finish its farm in time.
/// The search starts where greedy list scheduling (one scheduler that
/// sees every slot, no latency) meets the deadline: the mesh's makespans
/// come within a few percent of greedy's, each costs milliseconds, and a
/// simulation of a long farm costs minutes. Fewer nodes than could hold
/// the mean work by then are not asked.
pub(crate) fn deadline(ask: &Ask) -> Result<ExitCode> {
    let (cfg, deadline_ms) = (ask.cfg, ask.deadline_ms);
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
    let started = Instant::now();
    let stop = ask.within.map(|d| started + d);
    let scaled = |n: usize| {
        let mut c = cfg.clone();
        c.scale_nodes(n);
        c
    };
    // Said of the first count tried, as its report would (every count may
    // be given up on before a report).
    let shape = match mesh_sim::shapes_of(&scaled(from.max(1))) {
        Ok(s) => mesh_sim::report::node_kinds(&s),
        Err(e) => return Ok(failed(&e, "mesh sim ...")),
    };
    let greedy = match greedy_guess(&scaled, from, most, deadline_ms) {
        Ok(g) => g,
        Err(e) => return Ok(failed(&e, "mesh sim ...")),
    };
    let width = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(AT_ONCE_MOST);
    let mut tried: Vec<Tried> = Vec::new();
    let guess = greedy.map_or(from, |(n, _)| n);
    let found = fewest_near(from, most, guess, width, |counts| {
        let rows = simulate(counts, &scaled, deadline_ms, tasks, stop)?;
        let verdicts = rows.iter().map(Tried::verdict).collect();
        tried.extend(rows);
        Ok::<_, SimError>(verdicts)
    });
    let found = match found {
        Ok(f) => f,
        Err(e) => return Ok(failed(&e, "mesh sim ...")),
    };
    let answer = Answer {
        ask,
        shape,
        from,
        most,
        greedy,
        guess,
        tried,
        elapsed: started.elapsed(),
        found,
    };
    if ask.json {
        answer.json()?;
    } else {
        answer.words();
    }
    Ok(answer.exit())
}

/// What a search found, to be said.
struct Answer<'a> {
    ask: &'a Ask<'a>,
    /// A node's resources.
    shape: String,
    /// Fewer nodes than this cannot hold the mean work by the deadline.
    from: usize,
    most: usize,
    /// Where greedy list scheduling meets it, and its makespan there.
    greedy: Option<(usize, u64)>,
    guess: usize,
    tried: Vec<Tried>,
    elapsed: Duration,
    found: Found,
}

impl Answer<'_> {
    /// Ran out of time before the fewest count was settled (a count
    /// stopped above a meet whose count below missed settles nothing).
    fn stopped(&self) -> bool {
        let f = &self.found;
        let settled = match f.nodes {
            Some(n) => n == f.misses + 1,
            None => f.misses >= self.most,
        };
        !f.unknown.is_empty() && !settled
    }

    fn why_not(&self) -> Option<String> {
        (self.found.nodes.is_none() && !self.stopped()).then(|| {
            format!(
                // Counts go up to a node a task, or past it where the mean
                // work needs more (a short deadline): either way every task
                // could start at once.
                "not met with {} nodes, room for every task to start at once: \
                 the longest tasks alone take longer",
                self.most
            )
        })
    }

    fn exit(&self) -> ExitCode {
        match (self.found.nodes, self.stopped()) {
            (_, true) => ExitCode::from(EXIT_NOT_ANSWERED),
            (Some(_), false) => ExitCode::SUCCESS,
            (None, false) => ExitCode::from(EXIT_FAILED_TASKS),
        }
    }

    fn json(&self) -> Result<()> {
        let greedy = self
            .greedy
            .map(|(n, m)| serde_json::json!({"nodes": n, "makespan_ms": m}));
        outln!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "deadline_ms": self.ask.deadline_ms,
                "nodes": self.found.nodes,
                "node": self.shape,
                "tried": self.tried,
                "why_not": self.why_not(),
                "greedy": greedy,
                "searched_from": self.guess,
                "search_ms": self.elapsed.as_millis() as u64,
                "answered": !self.stopped(),
                "misses": self.found.misses,
                "not_finished": self.found.unknown,
            }))?
        );
        Ok(())
    }

    fn words(&self) {
        let (cfg, deadline_ms) = (self.ask.cfg, self.ask.deadline_ms);
        let stages: Vec<String> = cfg
            .stages
            .iter()
            .map(|s| format!("{} tasks of {} ({})", s.tasks, s.durations, s.resources))
            .collect();
        outln!("farm: {}", stages.join(", then "));
        outln!(
            "nodes of {}; fewer than {} cannot hold the mean work by then; {}",
            self.shape,
            self.from,
            match self.greedy {
                Some((n, m)) => format!(
                    "greedy list scheduling meets it with {n} (makespan {}), searched from there",
                    span(m)
                ),
                None => format!("greedy list scheduling misses it even with {}", self.most),
            }
        );
        table(&self.tried, deadline_ms);
        let order: Vec<String> = self.tried.iter().map(|t| t.nodes.to_string()).collect();
        let order = order.join(", ");
        let took = span(self.elapsed.as_millis() as u64);
        let f = &self.found;
        match (f.nodes, self.stopped()) {
            (_, true) => outln!("deadline {}: {}", span(deadline_ms), self.not_answered()),
            (Some(n), false) => {
                let t = self.tried.iter().find(|t| t.nodes == n).expect("tried");
                outln!(
                    "deadline {}: {n} nodes meet it (makespan {}); tried {order} in {took}",
                    span(deadline_ms),
                    span(t.makespan_ms.unwrap_or_default()),
                );
            }
            (None, false) => outln!(
                "deadline {}: {} (tried {order} in {took})",
                span(deadline_ms),
                self.why_not().unwrap_or_default(),
            ),
        }
    }

    /// Which counts did not finish, and what is known without them.
    fn not_answered(&self) -> String {
        let f = &self.found;
        let within = self.ask.within.map_or("as long as it takes".into(), |d| {
            humantime::format_duration(d).to_string()
        });
        let unknown: Vec<String> = f.unknown.iter().map(|n| n.to_string()).collect();
        let known = match f.nodes {
            Some(n) => format!(
                "{n} nodes meet it, {} miss it; between them not settled",
                f.misses
            ),
            None if f.misses >= self.from => format!("{} nodes miss it", f.misses),
            None => "nothing settled".into(),
        };
        format!(
            "not answered within {within} (--search-time): {} node{} did not finish \
             simulating; {known}{}. Give it more time, e.g. --search-time 30m, for the \
             simulated answer",
            unknown.join(" and "),
            if unknown == ["1"] { "" } else { "s" },
            self.projected(),
        )
    }

    /// What the counts not finished would do at their pace so far: an
    /// estimate the user can act on while the simulated answer waits.
    fn projected(&self) -> String {
        let mut rows: Vec<&Tried> = self.tried.iter().filter(|t| !t.finished).collect();
        rows.sort_by_key(|t| t.nodes);
        let said: Vec<String> = rows
            .iter()
            .filter_map(|t| {
                let p = t.projected_ms?;
                let verb = if p <= self.ask.deadline_ms {
                    "meet"
                } else {
                    "miss"
                };
                Some(format!(
                    "{} nodes would {verb} it (about {}, from its first {})",
                    t.nodes,
                    span(p),
                    span(t.simulated_ms.unwrap_or_default())
                ))
            })
            .collect();
        if said.is_empty() {
            return String::new();
        }
        format!(
            "; at their pace so far against greedy list scheduling (projected, not \
             simulated): {}",
            said.join(", ")
        )
    }
}

/// The fewest nodes with which greedy list scheduling meets the deadline
/// and its makespan there: where the simulations start.
fn greedy_guess(
    scaled: &impl Fn(usize) -> SimConfig,
    from: usize,
    most: usize,
    deadline_ms: u64,
) -> Result<Option<(usize, u64)>, SimError> {
    let mut makespans = Vec::new();
    let n = mesh_sim::whatif::fewest(from, most, |n| -> Result<bool, SimError> {
        let (_, greedy) = mesh_sim::baselines(&scaled(n))?;
        makespans.push((n, greedy));
        Ok(greedy <= deadline_ms)
    })?;
    Ok(n.and_then(|n| makespans.into_iter().find(|&(c, _)| c == n)))
}

/// Simulates each count at once, one thread each, until the deadline's
/// virtual time or the wall clock's `stop`.
fn simulate(
    counts: &[usize],
    scaled: &(impl Fn(usize) -> SimConfig + Sync),
    deadline_ms: u64,
    tasks: u64,
    stop: Option<Instant>,
) -> Result<Vec<Tried>, SimError> {
    std::thread::scope(|s| {
        let runs: Vec<_> = counts
            .iter()
            .map(|&n| s.spawn(move || (n, mesh_sim::run_bounded(&scaled(n), deadline_ms, stop))))
            .collect();
        runs.into_iter()
            .map(|h| {
                let (n, within) = h.join().expect("a simulation thread panicked");
                Ok(tried(n, within?, deadline_ms, tasks))
            })
            .collect()
    })
}

fn tried(n: usize, within: Within, deadline_ms: u64, tasks: u64) -> Tried {
    let none = Tried {
        nodes: n,
        makespan_ms: None,
        utilization: None,
        node_hours: None,
        meets: false,
        past_deadline: false,
        finished: true,
        simulated_ms: None,
        projected_ms: None,
    };
    match within {
        Within::Ended(r) => Tried {
            makespan_ms: Some(r.makespan),
            utilization: Some(r.utilization),
            node_hours: Some(n as f64 * r.makespan as f64 / 3_600_000.0),
            meets: r.tasks_done == tasks && r.makespan <= deadline_ms,
            ..none
        },
        // A count still running at the deadline has answered: no.
        Within::Past { projected_ms } => Tried {
            past_deadline: true,
            projected_ms,
            ..none
        },
        Within::OutOfTime {
            at_ms,
            projected_ms,
        } => Tried {
            finished: false,
            simulated_ms: Some(at_ms),
            projected_ms,
            ..none
        },
    }
}

fn table(tried: &[Tried], deadline_ms: u64) {
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
            _ if t.finished => (format!("> {}", span(deadline_ms)), "—".into(), "—".into()),
            _ => (
                format!("? ({} in)", span(t.simulated_ms.unwrap_or_default())),
                "—".into(),
                "—".into(),
            ),
        };
        let meets = match (t.finished, t.meets) {
            (false, _) => "not finished",
            (true, true) => "yes",
            (true, false) => "no",
        };
        outln!(
            "{:>6}  {:>13}  {:>11}  {:>10}  {meets}",
            t.nodes,
            makespan,
            util,
            hours,
        );
    }
}
