//! The farm a scenario describes, planned before the run: each task's duration and fate, and the lower bound and greedy baselines the makespan is measured against.

use super::*;
use crate::ConfigError;

/// Everything derived from the scenario before the run: the farm, each
/// task's duration and fate, and the lower bound.
pub(super) struct Plan {
    pub(super) peer_cfg: Config,
    /// The scenario's own nodes.
    pub(super) totals: Vec<Resources>,
    /// What the bound and the baselines schedule on: those nodes and, for
    /// each allocation queue that may be granted jobs, the nodes of its
    /// `max` jobs, as if up from the start (the most the mesh can have),
    /// so that waiting for jobs and their walltimes show in the ratios.
    pub(super) machines: Vec<Resources>,
    /// The node of each allocation queue that never refuses a submission:
    /// work that fits only there must still be done (a queue that may be
    /// refused may also be paused, and its work then fails as unplaceable).
    pub(super) queue_nodes: Vec<Resources>,
    pub(super) spec: Arc<FarmSpec>,
    /// First global task number of each stage.
    pub(super) offsets: Vec<usize>,
    pub(super) durations: Vec<u32>,
    /// Tasks that exit 1 on every attempt.
    pub(super) fails: Vec<bool>,
    /// Tasks that must end done: not failing, placeable, nothing upstream failing.
    pub(super) expect_ok: Vec<bool>,
    pub(super) latency: Dist,
    pub(super) lower_bound: u64,
    /// See [`Plan::greedy`]: in submission order, and longest first.
    pub(super) greedy: u64,
    pub(super) longest_first: u64,
    /// When greedy list scheduling (in submission order) finished its
    /// first task, its second, ...: what a run stopped early measures its
    /// pace against (set by [`Plan::with_baselines`] only).
    pub(super) greedy_ends: Vec<u64>,
    /// A recorded workflow's tasks' parents (task numbers, each after its
    /// parents): its graph is per task, not the stages' `after` alone.
    pub(super) parents: Option<Vec<Vec<u32>>>,
    /// A recorded workflow's files and the links they move over.
    pub(super) io: Option<Io>,
}

/// What tasks read from other nodes, and how long that takes.
pub(super) struct Io {
    pub(super) reads: Vec<Vec<Read>>,
    pub(super) input_bytes: u64,
    pub(super) links: Links,
}

/// The nodes a scenario brings: its own, those the bound counts (with
/// every queue's `max` jobs), and those of queues that never refuse.
type Machines = (Vec<Resources>, Vec<Resources>, Vec<Resources>);

pub(super) fn machines(cfg: &SimConfig) -> Result<Machines, SimError> {
    let mut totals = Vec::new();
    for g in &cfg.nodes {
        let r = parse_resources(&g.resources).map_err(ConfigError::from)?;
        totals.extend(std::iter::repeat_n(r, g.count));
    }
    let mut machines = totals.clone();
    for a in cfg.alloc.iter().filter(|a| a.reject_rate < 1.0) {
        let n = a.max as usize * a.nodes_per_job as usize;
        machines.extend(std::iter::repeat_n(a.node_resources(), n));
    }
    let queue_nodes = cfg
        .alloc
        .iter()
        .filter(|a| a.reject_rate == 0.0 && a.max > 0)
        .map(|a| a.node_resources())
        .collect();
    Ok((totals, machines, queue_nodes))
}

impl Plan {
    pub(super) fn new(cfg: &SimConfig) -> Result<Plan, SimError> {
        let (totals, machines, queue_nodes) = machines(cfg)?;
        let mut stages = Vec::new();
        let mut offsets = Vec::new();
        let mut durations = Vec::new();
        let mut fails = Vec::new();
        let index_of = |name: &String| {
            cfg.stages
                .iter()
                .position(|s| &s.name == name)
                .expect("validated") as u32
        };
        for (si, s) in cfg.stages.iter().enumerate() {
            let dist = parse_durations(&s.durations).map_err(ConfigError::from)?;
            offsets.push(durations.len());
            for i in 0..s.tasks {
                let mut rng = SmallRng::seed_from_u64(mix(cfg.seed, si as u64 + 1, i));
                durations.push(dist.sample(&mut rng).min(u32::MAX as u64) as u32);
                fails.push(s.fail_rate > 0.0 && rng.random::<f64>() < s.fail_rate);
            }
            stages.push(Arc::new(StageDef {
                deps: Vec::new(),
                resources: parse_resources(&s.resources).map_err(ConfigError::from)?,
                retries: s.retries,
                // The tasks a scenario fails are drawn at random, and the
                // plan's bound and its check that every other task ends
                // done count on no stage stopping: a run of failures at a
                // stage's start would stop it.
                max_fails: 0,
                timeout_ms: s.timeout_ms,
                expected_ms: s.expected_ms,
                after: s.after.iter().map(index_of).collect(),
                after_each: s.after_each.iter().map(index_of).collect(),
                ..StageDef::new(
                    &s.name,
                    CommandTemplate::Argv(vec![Template::literal("true")]),
                    Sweep::range("i", s.tasks),
                )
            }));
        }
        let def = FarmDef {
            graph: Default::default(),
            name: cfg.name.clone(),
            root: "/".into(),
            out: "/out".into(),
            stages: stages.into(),
        };
        let origin = NodeId(cfg.submit_node as u64 + 1);
        let spec = Arc::new(FarmSpec {
            id: FARM,
            origin,
            def: Arc::new(def),
            inputs: vec![],
            submitted_ms: 0,
            gen: 0,
            open: false,
        });
        let plan = Plan {
            peer_cfg: cfg.peer_config(),
            totals,
            machines,
            queue_nodes,
            spec,
            offsets,
            durations,
            fails,
            expect_ok: Vec::new(),
            latency: parse_durations(&cfg.latency).map_err(ConfigError::from)?,
            lower_bound: 0,
            greedy: 0,
            greedy_ends: Vec::new(),
            longest_first: 0,
            parents: None,
            io: None,
        };
        Ok(plan.measured())
    }

    /// The farm of a recorded workflow: its graph, its runtimes (with
    /// jitter drawn per task from the seed), what each task reads.
    pub(super) fn for_workload(
        cfg: &SimConfig,
        wl: &Workload,
        replay: &Replay,
    ) -> Result<Plan, SimError> {
        let (totals, machines, queue_nodes) = machines(cfg)?;
        let durations = wl
            .runtime_ms
            .iter()
            .enumerate()
            .map(|(g, &ms)| {
                let factor = if replay.jitter > 0.0 {
                    let mut rng = SmallRng::seed_from_u64(mix(cfg.seed, JITTER, g as u64));
                    1.0 + replay.jitter * (2.0 * rng.random::<f64>() - 1.0)
                } else {
                    1.0
                };
                (ms as f64 * factor).round().min(u32::MAX as f64) as u32
            })
            .collect();
        let spec = Arc::new(FarmSpec {
            id: FARM,
            origin: NodeId(cfg.submit_node as u64 + 1),
            def: Arc::new(wl.def.clone()),
            inputs: vec![],
            submitted_ms: 0,
            gen: 0,
            open: false,
        });
        let plan = Plan {
            peer_cfg: cfg.peer_config(),
            totals,
            machines,
            queue_nodes,
            spec,
            offsets: wl.offsets(),
            durations,
            fails: vec![false; wl.tasks()],
            expect_ok: Vec::new(),
            latency: parse_durations(&cfg.latency).map_err(ConfigError::from)?,
            lower_bound: 0,
            greedy: 0,
            greedy_ends: Vec::new(),
            longest_first: 0,
            parents: Some(wl.parents.clone()),
            io: Some(Io {
                reads: wl.reads.clone(),
                input_bytes: wl.input_bytes,
                links: replay.links,
            }),
        };
        Ok(plan.measured())
    }

    /// With what each task is expected to do, and the bound.
    fn measured(mut self) -> Plan {
        self.expect_ok = self.expected();
        self.lower_bound = self.bound();
        self
    }

    /// With the greedy baselines too: each a list schedule of every task,
    /// which a run computes beside the simulation instead (see `run_planned`).
    pub(super) fn with_baselines(mut self) -> Plan {
        let mut ends = Vec::new();
        self.greedy = self.greedy_with(false, Some(&mut ends));
        self.longest_first = self.greedy(true);
        self.greedy_ends = ends;
        self
    }

    /// Greedy list scheduling's makespans: in submission order, and longest first.
    pub(super) fn baselines(&self) -> (u64, u64) {
        (self.greedy(false), self.greedy(true))
    }

    pub(super) fn global(&self, t: TaskRef) -> usize {
        self.offsets[t.stage as usize] + t.index as usize
    }

    /// Task `g` as a user names it: `stage/index`.
    pub(super) fn task_name(&self, g: usize) -> String {
        let s = self.offsets.partition_point(|&o| o <= g).saturating_sub(1);
        format!("{}/{}", self.spec.def.stages[s].name, g - self.offsets[s])
    }

    pub(super) fn stage_len(&self, s: usize) -> usize {
        self.offsets
            .get(s + 1)
            .copied()
            .unwrap_or(self.durations.len())
            - self.offsets[s]
    }

    /// Machines (by index in `machines`) a stage fits on.
    pub(super) fn eligible(&self, s: usize) -> Vec<usize> {
        let req = &self.spec.def.stages[s].resources;
        (0..self.machines.len())
            .filter(|&n| fits(&self.machines[n], req))
            .collect()
    }

    pub(super) fn expected(&self) -> Vec<bool> {
        let def = &self.spec.def;
        let mut ok = vec![true; self.durations.len()];
        if let Some(parents) = &self.parents {
            // Tasks come after their parents: one pass sees each parent settled.
            for s in 0..def.stages.len() {
                let req = &def.stages[s].resources;
                let placeable = self
                    .totals
                    .iter()
                    .chain(&self.queue_nodes)
                    .any(|m| fits(m, req));
                for i in 0..self.stage_len(s) {
                    let g = self.offsets[s] + i;
                    ok[g] =
                        placeable && !self.fails[g] && parents[g].iter().all(|&p| ok[p as usize]);
                }
            }
            return ok;
        }
        for s in 0..def.stages.len() {
            let req = &def.stages[s].resources;
            let placeable = self
                .totals
                .iter()
                .chain(&self.queue_nodes)
                .any(|m| fits(m, req));
            let whole_ok = def.stages[s].after.iter().all(|&d| {
                let d = d as usize;
                (0..self.stage_len(d)).all(|i| ok[self.offsets[d] + i])
            });
            for i in 0..self.stage_len(s) {
                let g = self.offsets[s] + i;
                let each_ok = def.stages[s]
                    .after_each
                    .iter()
                    .all(|&d| ok[self.offsets[d as usize] + i]);
                ok[g] = placeable && whole_ok && each_ok && !self.fails[g];
            }
        }
        ok
    }

    /// max(for each stage's set of eligible nodes and each resource: the work
    /// that can only run there over its capacity, the longest chain).
    pub(super) fn bound(&self) -> u64 {
        let def = &self.spec.def;
        let n = def.stages.len();
        let elig: Vec<Vec<usize>> = (0..n).map(|s| self.eligible(s)).collect();
        let mut best = 0.0f64;
        for set in elig.iter().filter(|e| !e.is_empty()) {
            // Stages that fit only inside this set must be done by it.
            let inside: Vec<usize> = (0..n)
                .filter(|&t| !elig[t].is_empty() && elig[t].iter().all(|x| set.contains(x)))
                .collect();
            let mut names: Vec<&str> = Vec::new();
            for &t in &inside {
                names.extend(def.stages[t].resources.iter().map(|(k, _)| k));
            }
            names.sort();
            names.dedup();
            for r in names {
                let cap: f64 = set.iter().map(|&x| self.machines[x].get(r).0 as f64).sum();
                let mut work = 0.0;
                for &t in &inside {
                    let req = def.stages[t].resources.get(r).0 as f64;
                    let o = self.offsets[t];
                    let ms: u64 = (0..self.stage_len(t))
                        .filter(|&i| self.expect_ok[o + i])
                        .map(|i| self.durations[o + i] as u64)
                        .sum();
                    work += req * ms as f64;
                }
                if cap > 0.0 {
                    best = best.max(work / cap);
                }
            }
        }
        if let Some(parents) = &self.parents {
            let durations: Vec<u64> = (0..self.durations.len())
                .map(|g| u64::from(self.durations[g]) * u64::from(self.expect_ok[g]))
                .collect();
            let chain = crate::workflow::chain(&durations, parents);
            return (best.ceil() as u64).max(chain).max(1);
        }
        // Longest chain: a task ends no sooner than its own duration after
        // every whole stage it waits on and its element-wise predecessors.
        let mut finish = vec![0u64; self.durations.len()];
        let mut stage_end = vec![0u64; n];
        for s in 0..n {
            if elig[s].is_empty() {
                continue;
            }
            let start = def.stages[s]
                .after
                .iter()
                .map(|&d| stage_end[d as usize])
                .max()
                .unwrap_or(0);
            for i in 0..self.stage_len(s) {
                let g = self.offsets[s] + i;
                if !self.expect_ok[g] {
                    continue;
                }
                let each = def.stages[s]
                    .after_each
                    .iter()
                    .map(|&d| finish[self.offsets[d as usize] + i])
                    .max()
                    .unwrap_or(0);
                finish[g] = start.max(each) + self.durations[g] as u64;
                stage_end[s] = stage_end[s].max(finish[g]);
            }
        }
        let chain = stage_end.iter().copied().max().unwrap_or(0);
        (best.ceil() as u64).max(chain).max(1)
    }

    /// The makespan of greedy list scheduling with no latency: one
    /// scheduler that sees every slot, knows no durations (so neither does
    /// mesh), and starts ready tasks in submission order on the first node
    /// they fit as soon as it has room. What mesh's own schedule can be
    /// held to; its distance from the lower bound is the price of not
    /// knowing durations. Every node is up from the start; tasks expected
    /// to fail are left out, as in the bound.
    ///
    /// With `longest_first`, a scheduler that does know durations: of the
    /// ready tasks that fit a free node, the longest starts first (LPT,
    /// within 4/3 of the optimum on identical slots; tasks made ready one
    /// by one by an element-wise dependency queue behind those ready when
    /// their stage opened). How close it comes to the bound tells whether
    /// the bound itself is tight.
    pub(super) fn greedy(&self, longest_first: bool) -> u64 {
        self.greedy_with(longest_first, None)
    }

    /// [`Plan::greedy`], with each task's end pushed to `ends` as it
    /// comes (in time order).
    fn greedy_with(&self, longest_first: bool, mut ends: Option<&mut Vec<u64>>) -> u64 {
        if let Some(parents) = &self.parents {
            return self.greedy_dag(parents, longest_first, ends);
        }
        let def = &self.spec.def;
        let n = def.stages.len();
        let reqs: Vec<&Resources> = def.stages.iter().map(|s| &s.resources).collect();
        let mut free = self.machines.clone();
        // Per stage: indices ready to start, in order; whole-stage waits left.
        let mut ready: Vec<VecDeque<u32>> = vec![VecDeque::new(); n];
        let mut waits: Vec<usize> = def.stages.iter().map(|s| s.after.len()).collect();
        let mut left: Vec<usize> = (0..n)
            .map(|s| {
                (0..self.stage_len(s))
                    .filter(|&i| self.expect_ok[self.offsets[s] + i])
                    .count()
            })
            .collect();
        // Per task: element-wise predecessors not yet done.
        let mut each: Vec<u8> = (0..self.durations.len())
            .map(|g| {
                let s = self.offsets.partition_point(|&o| o <= g) - 1;
                def.stages[s].after_each.len() as u8
            })
            .collect();
        let open = |s: usize, ready: &mut Vec<VecDeque<u32>>, each: &[u8]| {
            for i in 0..self.stage_len(s) {
                let g = self.offsets[s] + i;
                if self.expect_ok[g] && each[g] == 0 {
                    ready[s].push_back(i as u32);
                }
            }
            if longest_first {
                let d = &self.durations[self.offsets[s]..];
                ready[s]
                    .make_contiguous()
                    .sort_by_key(|&i| Reverse(d[i as usize]));
            }
        };
        let mut opened = vec![false; n];
        for s in 0..n {
            if waits[s] == 0 && !self.eligible(s).is_empty() {
                opened[s] = true;
                open(s, &mut ready, &each);
            }
        }
        // (end, node, stage, index) of running tasks.
        let mut running: BinaryHeap<Reverse<(u64, usize, usize, u32)>> = BinaryHeap::new();
        let mut now = 0;
        let mut end = 0;
        let fill =
            |node: usize,
             now: u64,
             free: &mut Vec<Resources>,
             ready: &mut Vec<VecDeque<u32>>,
             running: &mut BinaryHeap<Reverse<(u64, usize, usize, u32)>>| {
                let duration = |s: usize, i: u32| self.durations[self.offsets[s] + i as usize];
                loop {
                    // Taking only shrinks what is free: a stage whose next
                    // task does not fit now will not later in this fill.
                    let fits = |s: &usize| ready[*s].front().is_some() && free[node].fits(reqs[*s]);
                    let pick = if longest_first {
                        (0..n)
                            .filter(fits)
                            .max_by_key(|&s| (duration(s, ready[s][0]), Reverse(s)))
                    } else {
                        (0..n).find(fits)
                    };
                    let Some(s) = pick else { break };
                    let i = ready[s].pop_front().expect("fits checked it");
                    // It fits (checked above), so nothing saturates.
                    free[node].take_saturating(reqs[s]);
                    running.push(Reverse((now + duration(s, i) as u64, node, s, i)));
                }
            };
        for node in 0..free.len() {
            fill(node, now, &mut free, &mut ready, &mut running);
        }
        while let Some(Reverse((at, node, s, i))) = running.pop() {
            now = at;
            end = end.max(at);
            if let Some(e) = ends.as_deref_mut() {
                e.push(at);
            }
            free[node].give(reqs[s]);
            left[s] -= 1;
            let mut more = false;
            // Element-wise dependents of this task, and stages waiting on this one whole.
            for t in 0..n {
                if def.stages[t].after_each.contains(&(s as u32))
                    && (i as usize) < self.stage_len(t)
                {
                    let g = self.offsets[t] + i as usize;
                    each[g] = each[g].saturating_sub(1);
                    if opened[t] && each[g] == 0 && self.expect_ok[g] {
                        ready[t].push_back(i);
                        more = true;
                    }
                }
                if left[s] == 0 && def.stages[t].after.contains(&(s as u32)) {
                    waits[t] -= 1;
                    if waits[t] == 0 && !self.eligible(t).is_empty() {
                        opened[t] = true;
                        open(t, &mut ready, &each);
                        more = true;
                    }
                }
            }
            if more {
                for node in 0..free.len() {
                    fill(node, now, &mut free, &mut ready, &mut running);
                }
            } else {
                fill(node, now, &mut free, &mut ready, &mut running);
            }
        }
        end.max(1)
    }

    /// [`Plan::greedy`] on a per-task graph: a task is ready once its
    /// parents are done; of the ready tasks that fit a free node, the
    /// first stage's first (or, with `longest_first`, the longest) starts.
    /// Only nodes with room are filled when tasks become ready, so a run
    /// of a thousand nodes does not look at every node per task.
    fn greedy_dag(
        &self,
        parents: &[Vec<u32>],
        longest_first: bool,
        mut ends: Option<&mut Vec<u64>>,
    ) -> u64 {
        let def = &self.spec.def;
        let n = def.stages.len();
        let total = self.durations.len();
        let reqs: Vec<&Resources> = def.stages.iter().map(|s| &s.resources).collect();
        let stage_of: Vec<u32> = (0..n)
            .flat_map(|s| std::iter::repeat_n(s as u32, self.stage_len(s)))
            .collect();
        let mut children: Vec<Vec<u32>> = vec![Vec::new(); total];
        let mut waiting: Vec<u32> = vec![0; total];
        for g in (0..total).filter(|&g| self.expect_ok[g]) {
            waiting[g] = parents[g].len() as u32;
            for &p in &parents[g] {
                children[p as usize].push(g as u32);
            }
        }
        // Per stage: ready tasks by (key, task), smallest first.
        let key = |g: usize| {
            if longest_first {
                u64::from(u32::MAX - self.durations[g])
            } else {
                g as u64
            }
        };
        let mut ready: Vec<BinaryHeap<Reverse<(u64, u32)>>> = vec![BinaryHeap::new(); n];
        for g in (0..total).filter(|&g| self.expect_ok[g] && waiting[g] == 0) {
            ready[stage_of[g] as usize].push(Reverse((key(g), g as u32)));
        }
        let mut free = self.machines.clone();
        // Nodes that may have room for something.
        let mut roomy: std::collections::BTreeSet<usize> = (0..free.len()).collect();
        let mut running: BinaryHeap<Reverse<(u64, usize, u32)>> = BinaryHeap::new();
        let mut end = 0;
        let fill = |node: usize,
                    now: u64,
                    free: &mut Vec<Resources>,
                    ready: &mut Vec<BinaryHeap<Reverse<(u64, u32)>>>,
                    running: &mut BinaryHeap<Reverse<(u64, usize, u32)>>|
         -> bool {
            loop {
                let pick = (0..n)
                    .filter(|&s| free[node].fits(reqs[s]))
                    .filter_map(|s| ready[s].peek().map(|Reverse(k)| (*k, s)))
                    .min();
                let Some((_, s)) = pick else {
                    return false;
                };
                let Reverse((_, g)) = ready[s].pop().expect("peeked");
                free[node].take_saturating(reqs[s]);
                running.push(Reverse((
                    now + u64::from(self.durations[g as usize]),
                    node,
                    g,
                )));
                if ready.iter().all(BinaryHeap::is_empty) {
                    return true;
                }
            }
        };
        let fill_roomy =
            |now: u64,
             roomy: &mut std::collections::BTreeSet<usize>,
             free: &mut Vec<Resources>,
             ready: &mut Vec<BinaryHeap<Reverse<(u64, u32)>>>,
             running: &mut BinaryHeap<Reverse<(u64, usize, u32)>>| {
                let mut full = Vec::new();
                for &node in roomy.iter() {
                    if ready.iter().all(BinaryHeap::is_empty) {
                        break;
                    }
                    let emptied = fill(node, now, free, ready, running);
                    if !reqs.iter().any(|r| free[node].fits(r)) {
                        full.push(node);
                    }
                    if emptied {
                        break;
                    }
                }
                for node in full {
                    roomy.remove(&node);
                }
            };
        fill_roomy(0, &mut roomy, &mut free, &mut ready, &mut running);
        while let Some(Reverse((at, node, g))) = running.pop() {
            end = end.max(at);
            if let Some(e) = ends.as_deref_mut() {
                e.push(at);
            }
            let s = stage_of[g as usize] as usize;
            free[node].give(reqs[s]);
            roomy.insert(node);
            for &c in &children[g as usize] {
                let c = c as usize;
                waiting[c] -= 1;
                if waiting[c] == 0 {
                    ready[stage_of[c] as usize].push(Reverse((key(c), c as u32)));
                }
            }
            fill_roomy(at, &mut roomy, &mut free, &mut ready, &mut running);
        }
        end.max(1)
    }
}
