//! What is left of a farm, simulated quickly: each stage's tasks drawn from its own finished runtimes, run on the mesh's slots in the order the stages allow. Pure: no clock, a seeded generator.
//!
//! The estimate of a farm's end that its home shows (`node/src/eta.rs`)
//! and the allocation queues' deadline planning on the coordinator both
//! use it. `mesh sim --farm` runs the real peers on a virtual clock; this
//! is the cheap one. What it leaves out, and so where it is wrong: where on
//! the nodes a task fits beyond its stage's whole tasks per node, data
//! moving, and which tasks a keyed or listed dependency pairs.

use crate::alloc::Plan;
use crate::engine::Counts;
use crate::farm::graph::DepOn;
use crate::farm::FarmDef;
use crate::mesh::Entry;
use crate::resources::{Resources, CPU};
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};

/// A stage's runtimes as Kaplan and Meier estimate them from its finished
/// tasks and, cut short, its running ones (each has run at least so long):
/// each runtime seen with its probability; what the running ones leave
/// over sits at the longest of them.
#[derive(Clone, Debug)]
pub struct Runtimes {
    /// Ascending (what the running ones leave over sits at the longest).
    at: Vec<f64>,
    /// The probability of a runtime up to and including each of `at`.
    cum: Vec<f64>,
}

impl Runtimes {
    /// None without a finished runtime to go on.
    pub fn estimate(done: &[f64], running: &[f64]) -> Option<Runtimes> {
        if done.is_empty() {
            return None;
        }
        // Ends before cuts at the same time, as the estimator has them.
        let mut seen: Vec<(f64, bool)> = done.iter().map(|&t| (t, true)).collect();
        seen.extend(running.iter().map(|&t| (t, false)));
        seen.sort_by(|a, b| a.0.total_cmp(&b.0).then(b.1.cmp(&a.1)));
        let (mut at, mut cum) = (Vec::new(), Vec::new());
        let mut left = 1.0;
        let mut at_risk = seen.len() as f64;
        for &(t, ended) in &seen {
            if ended {
                let m = left / at_risk;
                at.push(t);
                cum.push(1.0 - left + m);
                left -= m;
            }
            at_risk -= 1.0;
        }
        if left > 1e-12 {
            at.push(seen.last().map_or(0.0, |s| s.0));
            cum.push(1.0);
        }
        Some(Runtimes { at, cum })
    }

    /// A runtime drawn, longer than `above` when given (one that has run
    /// past every runtime seen is about to end: `above` itself). A draw is
    /// two binary searches: a farm draws one per task left.
    pub fn draw(&self, rng: &mut SmallRng, above: Option<f64>) -> f64 {
        let from = above.map_or(0, |a| self.at.partition_point(|&t| t <= a));
        let before = from.checked_sub(1).map_or(0.0, |i| self.cum[i]);
        let total = self.cum.last().copied().unwrap_or(0.0) - before;
        if from >= self.at.len() || total <= 0.0 {
            return above.unwrap_or(0.0);
        }
        let u = before + rng.random::<f64>() * total;
        let i = self.cum.partition_point(|&c| c <= u).max(from);
        self.at[i.min(self.at.len() - 1)]
    }

    /// What is left of a task that runs now, for how long unknown: a task
    /// caught running is a long one more often (it is drawn by its
    /// length), and it is anywhere in its run (a uniform share is left).
    fn draw_left(&self, rng: &mut SmallRng, by_length: &[f64]) -> f64 {
        let total = by_length.last().copied().unwrap_or(0.0);
        if total <= 0.0 {
            return 0.0;
        }
        let u = rng.random::<f64>() * total;
        let i = by_length
            .partition_point(|&c| c <= u)
            .min(self.at.len() - 1);
        self.at[i] * rng.random::<f64>()
    }

    /// The cumulative weights by which `draw_left` picks a runtime.
    fn by_length(&self) -> Vec<f64> {
        let mut before = 0.0;
        let mut sum = 0.0;
        self.at
            .iter()
            .zip(&self.cum)
            .map(|(&t, &c)| {
                sum += (c - before) * t;
                before = c;
                sum
            })
            .collect()
    }
}

/// What is left of one stage.
#[derive(Clone, Debug)]
pub struct StageLeft {
    /// Tasks of the stage that can run at once on the whole mesh, were it
    /// running nothing else: each holds that share of the mesh.
    pub slots: u64,
    /// Stages each of whose tasks must end before any of this one starts
    /// (a keyed or listed dependency is counted so too: the estimate does
    /// not know which tasks it pairs).
    pub after: Vec<usize>,
    /// Stages whose task `i` must end before this one's task `i`.
    pub after_each: Vec<usize>,
    /// Tasks not started.
    pub waiting: u64,
    /// Tasks running now.
    pub running: u64,
    /// How long some of them have run, in ms, where that is known (`mesh
    /// run` knows each; a mesh's home knows none): such a task goes on for
    /// what is left of a runtime longer than that. The others have a
    /// share of a runtime drawn by length left.
    pub elapsed: Vec<f64>,
    /// Its finished tasks' runtimes, in ms (none: drawn from the others').
    pub runtimes: Vec<f64>,
}

/// Tasks drawn in all the runs of one estimate at most: a million-task
/// farm gets its least runs, and an estimate stays well under a second.
const DRAWS_MAX: u64 = 4_000_000;
const RUNS_MIN: u64 = 3;
const RUNS_MAX: u64 = 21;

/// The whole mesh, in the units a task's share of it is counted in.
const MESH: u64 = 1 << 40;

/// How many runs an estimate of `tasks` left simulates.
pub fn runs_for(tasks: u64) -> u32 {
    (DRAWS_MAX / tasks.max(1)).clamp(RUNS_MIN, RUNS_MAX) as u32
}

/// Milliseconds until the farm ends in each of `runs` simulated runs,
/// ascending; None when no task has finished to draw runtimes from, or
/// when a stage has tasks left and no slot anywhere.
pub fn simulate(stages: &[StageLeft], runs: u32, seed: u64) -> Option<Vec<u64>> {
    let all: Vec<f64> = stages
        .iter()
        .flat_map(|s| s.runtimes.iter().copied())
        .collect();
    let all = Runtimes::estimate(&all, &[])?;
    let own: Vec<Option<Runtimes>> = stages
        .iter()
        .map(|s| Runtimes::estimate(&s.runtimes, &[]))
        .collect();
    let pools: Vec<&Runtimes> = own.iter().map(|o| o.as_ref().unwrap_or(&all)).collect();
    let by_length: Vec<Vec<f64>> = pools.iter().map(|p| p.by_length()).collect();
    if stages
        .iter()
        .any(|s| s.slots == 0 && s.waiting + s.running > 0)
    {
        return None;
    }
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut ends: Vec<u64> = (0..runs)
        .map(|_| one_run(stages, &pools, &by_length, &mut rng))
        .collect();
    ends.sort_unstable();
    Some(ends)
}

/// Runtimes kept per stage at most: evenly taken from those there are.
pub const SAMPLES_MAX: usize = 4096;

/// Each stage's finished runtimes (ms) from a farm's log: its successes
/// that say how long they ran (not results reused from an earlier farm).
pub fn runtimes<'a>(def: &FarmDef, log: impl Iterator<Item = &'a Entry>) -> Vec<Vec<f64>> {
    let mut by_stage = vec![Vec::new(); def.stages.len()];
    for e in log {
        if let (true, Some(ran)) = (e.is_done(), e.ran()) {
            if let Some(v) = by_stage.get_mut(e.task().stage as usize) {
                v.push(ran.duration_ms as f64);
            }
        }
    }
    for v in &mut by_stage {
        if v.len() > SAMPLES_MAX {
            let step = v.len() as f64 / SAMPLES_MAX as f64;
            *v = (0..SAMPLES_MAX)
                .map(|i| v[(i as f64 * step) as usize])
                .collect();
        }
    }
    by_stage
}

/// How many tasks asking `request` fit at once on `nodes` of these totals,
/// each node counted in whole tasks.
pub fn slots(request: &Resources, nodes: &[Resources]) -> u64 {
    nodes
        .iter()
        .map(|n| {
            request
                .iter()
                .filter(|(_, a)| !a.is_zero())
                .map(|(name, a)| n.get(name).0 / a.0)
                .min()
                .unwrap_or_else(|| n.get(CPU).whole().max(1))
        })
        .sum()
}

/// What is left of each stage of `def`, from its counts now, its
/// finished runtimes and the mesh's nodes.
pub fn stages_left(
    def: &FarmDef,
    counts: &[Counts],
    mut runtimes: Vec<Vec<f64>>,
    nodes: &[Resources],
) -> Vec<StageLeft> {
    def.stages
        .iter()
        .enumerate()
        .map(|(s, st)| {
            let c = counts.get(s).cloned().unwrap_or_default();
            let mut after: Vec<usize> = st.after.iter().map(|&u| u as usize).collect();
            let mut after_each: Vec<usize> = st.after_each.iter().map(|&u| u as usize).collect();
            for d in &st.deps {
                match d.on {
                    DepOn::Grown { .. } => after_each.push(d.stage as usize),
                    _ => after.push(d.stage as usize),
                }
            }
            after.sort_unstable();
            after.dedup();
            // Counted running from when a node has it: those queued there
            // beyond what its cores run wait as the others do.
            let slots = slots(&st.resources, nodes);
            let running = c.running.min(slots);
            StageLeft {
                slots,
                after,
                after_each,
                waiting: c.queued() + (c.running - running),
                running,
                elapsed: Vec::new(),
                runtimes: runtimes.get_mut(s).map(std::mem::take).unwrap_or_default(),
            }
        })
        .collect()
}

/// The stages that draw from the others' runtimes.
pub fn guessed<'a>(stages: &[StageLeft], names: impl Iterator<Item = &'a str>) -> Vec<String> {
    stages
        .iter()
        .zip(names)
        .filter(|(s, _)| s.runtimes.is_empty() && s.waiting + s.running > 0)
        .map(|(_, n)| n.to_string())
        .collect()
}

/// The run's end: tasks start, stage by stage in the farm's order, where a
/// slot of their stage is free and what they wait for has ended.
fn one_run(
    stages: &[StageLeft],
    pools: &[&Runtimes],
    by_length: &[Vec<f64>],
    rng: &mut SmallRng,
) -> u64 {
    let n = stages.len();
    let mut later: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (s, st) in stages.iter().enumerate() {
        for &u in st.after.iter().chain(&st.after_each) {
            if u < n {
                later[u].push(s);
            }
        }
    }
    // Tasks not ended, per stage; not started and not held back by what
    // they wait for; running.
    let mut left: Vec<u64> = stages.iter().map(|s| s.waiting + s.running).collect();
    let mut unstarted: Vec<u64> = stages.iter().map(|s| s.waiting).collect();
    // The mesh as a whole, shared by the stages that run at once.
    let need: Vec<u64> = stages.iter().map(|s| MESH / s.slots.max(1)).collect();
    // Below zero while more runs now than the slots say (a node joined
    // and left, a stage's share is rounded).
    let mut free = MESH as i64;
    let mut ready: BTreeSet<usize> = BTreeSet::new();
    let mut ends: BinaryHeap<Reverse<(u64, usize)>> = BinaryHeap::new();
    for (s, st) in stages.iter().enumerate() {
        for k in 0..st.running {
            free -= need[s] as i64;
            let t = match st.elapsed.get(k as usize) {
                Some(&ran) => pools[s].draw(rng, Some(ran)) - ran,
                None => pools[s].draw_left(rng, &by_length[s]),
            };
            ends.push(Reverse((t.round() as u64, s)));
        }
    }
    let startable = |s: usize, left: &[u64], unstarted: &[u64]| -> u64 {
        let st = &stages[s];
        if st.after.iter().any(|&u| u < n && left[u] > 0) {
            return 0;
        }
        // Task i waits for task i upstream: those of the tasks not started
        // whose upstream task has not ended are the last to be free.
        let held = st
            .after_each
            .iter()
            .filter(|&&u| u < n)
            .map(|&u| left[u])
            .max()
            .unwrap_or(0);
        unstarted[s].saturating_sub(held)
    };
    for s in 0..n {
        if startable(s, &left, &unstarted) > 0 {
            ready.insert(s);
        }
    }
    let mut now = 0u64;
    loop {
        let mut emptied = Vec::new();
        for &s in &ready {
            let can = startable(s, &left, &unstarted);
            let start = can.min(free.max(0) as u64 / need[s]);
            for _ in 0..start {
                let t = pools[s].draw(rng, None);
                ends.push(Reverse((now + t.round() as u64, s)));
            }
            unstarted[s] -= start;
            free -= (start * need[s]) as i64;
            if unstarted[s] == 0 {
                emptied.push(s);
            }
        }
        for s in emptied {
            ready.remove(&s);
        }
        let Some(Reverse((t, s))) = ends.pop() else {
            return now;
        };
        now = t;
        left[s] -= 1;
        free += need[s] as i64;
        if unstarted[s] > 0 {
            ready.insert(s);
        }
        for &d in &later[s] {
            if unstarted[d] > 0 && startable(d, &left, &unstarted) > 0 {
                ready.insert(d);
            }
        }
    }
}

/// The value at `q` (0 to 1) of ascending `ends`.
pub fn quantile(ends: &[u64], q: f64) -> u64 {
    if ends.is_empty() {
        return 0;
    }
    let i = ((ends.len() - 1) as f64 * q).round() as usize;
    ends[i.min(ends.len() - 1)]
}

/// The shape of an allocation queue's jobs, and what is known of how long
/// its batch system keeps one waiting.
#[derive(Clone, Debug)]
pub struct JobShape {
    /// One node of a job, and how many nodes a job has.
    pub node: Resources,
    /// How many such nodes a job has.
    pub nodes_per_job: u32,
    /// How long a job waits before its node joins, as the queue's jobs
    /// did so far (a guess before one has).
    pub wait_ms: u64,
}

/// What a plan is made for: what is left of the farms, and the nodes
/// there are to run it.
#[derive(Clone, Copy, Debug)]
pub struct WorkLeft<'a> {
    /// What is left of each stage.
    pub stages: &'a [StageLeft],
    /// What one task of each stage asks, in the order of `stages`: how
    /// many fit the nodes a plan adds.
    pub requests: &'a [Resources],
    /// The nodes there are.
    pub nodes: &'a [Resources],
}

/// Draws in all the simulations of one plan at most: a plan looks at a
/// dozen counts of jobs.
const PLAN_DRAWS_MAX: u64 = 2_000_000;

/// The fewest jobs of `shape` beyond the nodes there are (`work.nodes`)
/// that end what is left (`work.stages`, each asking its `work.requests`)
/// within `left_ms`, at most `most`; None while no task has finished to
/// draw runtimes from, or while a stage fits no node even with the jobs.
/// A job's node is counted from when it would join: until then the nodes
/// there are run alone, and what they do meanwhile is not counted (a plan
/// leans to more jobs).
pub fn plan(work: WorkLeft, shape: &JobShape, left_ms: u64, most: u32, seed: u64) -> Option<Plan> {
    let WorkLeft {
        stages,
        requests,
        nodes,
    } = work;
    let tasks: u64 = stages.iter().map(|s| s.waiting + s.running).sum();
    let runs = (PLAN_DRAWS_MAX / (tasks.max(1) * 12)).clamp(1, 5) as u32;
    let alone = simulate(stages, runs, seed).map(|e| quantile(&e, 0.9));
    let with = |extra: u32| -> Option<u64> {
        if extra == 0 {
            return alone;
        }
        let mut more = nodes.to_vec();
        let added = u64::from(extra) * u64::from(shape.nodes_per_job.max(1));
        more.extend((0..added).map(|_| shape.node.clone()));
        let grown: Vec<StageLeft> = stages
            .iter()
            .zip(requests)
            .map(|(s, r)| StageLeft {
                slots: slots(r, &more),
                ..s.clone()
            })
            .collect();
        let end = shape.wait_ms + quantile(&simulate(&grown, runs, seed)?, 0.9);
        Some(alone.map_or(end, |a| a.min(end)))
    };
    // Each count simulated once: the search comes back to the counts it
    // tried (the one it keeps, the one that stopped the doubling).
    let mut known: BTreeMap<u32, Option<u64>> = BTreeMap::new();
    let mut end = |extra: u32| *known.entry(extra).or_insert_with(|| with(extra));
    let alone = end(0)?;
    if alone <= left_ms {
        return Some(Plan {
            extra: 0,
            end_ms: alone,
            meets: true,
        });
    }
    // Doubling to a count that meets it (or the most), then halving back.
    let mut hi = 1u32.min(most);
    while hi < most && end(hi)? > left_ms {
        hi = (hi * 2).min(most);
    }
    let at_hi = end(hi)?;
    if hi == 0 || at_hi > left_ms {
        return Some(Plan {
            extra: most,
            end_ms: end(most)?,
            meets: false,
        });
    }
    let mut lo = hi / 2;
    while lo + 1 < hi {
        let mid = (lo + hi) / 2;
        if end(mid)? <= left_ms {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    Some(Plan {
        extra: hi,
        end_ms: end(hi)?,
        meets: true,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn running_tasks_weigh_as_runtimes_at_least_so_long() {
        // Two ended at 1 s and 2 s; one has run 3 s and goes on.
        let r = Runtimes::estimate(&[2.0, 1.0], &[3.0]).unwrap();
        assert_eq!(r.at, vec![1.0, 2.0, 3.0]);
        let mass = masses(&r);
        for m in &mass {
            assert!((m - 1.0 / 3.0).abs() < 1e-9, "{mass:?}");
        }
        let mut rng = SmallRng::seed_from_u64(1);
        for _ in 0..20 {
            assert_eq!(r.draw(&mut rng, Some(2.5)), 3.0);
            assert!(r.at.contains(&r.draw(&mut rng, None)));
        }
        // Past everything seen: about to end.
        assert_eq!(r.draw(&mut rng, Some(9.0)), 9.0);
        // Nothing finished: nothing to go on.
        assert!(Runtimes::estimate(&[], &[4.0]).is_none());
        // Only ends: each as often as it was seen.
        let plain = Runtimes::estimate(&[1.0, 1.0, 4.0, 2.0], &[]).unwrap();
        assert_eq!(plain.at, vec![1.0, 1.0, 2.0, 4.0]);
        assert!((masses(&plain).iter().sum::<f64>() - 1.0).abs() < 1e-9);
    }

    /// Each runtime's own probability.
    fn masses(r: &Runtimes) -> Vec<f64> {
        let mut before = 0.0;
        r.cum
            .iter()
            .map(|&c| {
                let m = c - before;
                before = c;
                m
            })
            .collect()
    }

    fn stage(slots: u64, waiting: u64, running: u64, runtimes: &[f64]) -> StageLeft {
        StageLeft {
            slots,
            after: Vec::new(),
            after_each: Vec::new(),
            waiting,
            running,
            elapsed: Vec::new(),
            runtimes: runtimes.to_vec(),
        }
    }

    #[test]
    fn tasks_of_one_length_end_in_waves_of_the_slots() {
        // 10 tasks of 1 s on 4 slots: 3 waves.
        let ends = simulate(&[stage(4, 10, 0, &[1000.0])], 5, 1).unwrap();
        assert_eq!(ends, vec![3000; 5]);
    }

    #[test]
    fn a_long_stage_still_to_come_counts_in_full_where_a_rate_would_not() {
        // 8 short tasks left of the first stage, then 4 of 10 s after it,
        // on 4 slots: 2 waves of 1 s, then one of 10 s.
        let mut long = stage(4, 4, 0, &[10_000.0]);
        long.after = vec![0];
        let ends = simulate(&[stage(4, 8, 0, &[1000.0]), long], 3, 1).unwrap();
        assert_eq!(ends, vec![12_000; 3]);
        // Element-wise, each long task starts as its own short one ends:
        // the same here, as the waves line up.
        let mut each = stage(4, 4, 0, &[10_000.0]);
        each.after_each = vec![0];
        let ends = simulate(&[stage(4, 4, 0, &[1000.0]), each], 1, 1).unwrap();
        assert_eq!(ends, vec![11_000]);
    }

    #[test]
    fn a_stage_none_of_whose_tasks_finished_draws_from_the_others() {
        let mut merge = stage(2, 1, 0, &[]);
        merge.after = vec![0];
        let stages = [stage(2, 2, 0, &[500.0]), merge];
        assert_eq!(simulate(&stages, 3, 1).unwrap(), vec![1000; 3]);
        assert_eq!(guessed(&stages, ["map", "merge"].into_iter()), ["merge"]);
        // Nothing finished anywhere: no estimate.
        assert!(simulate(&[stage(2, 3, 0, &[])], 3, 1).is_none());
        // A stage that fits nowhere never ends.
        assert!(simulate(&[stage(0, 3, 0, &[5.0])], 3, 1).is_none());
    }

    #[test]
    fn a_running_task_has_part_of_a_long_runtime_left() {
        // Runtimes 1 s and 9 s: a task caught running is the 9 s one 9
        // times in 10, with a uniform share left: on average 4.1 s.
        let stages = [stage(1, 0, 1, &[1000.0, 9000.0])];
        let ends = simulate(&stages, 2000, 7).unwrap();
        let mean = ends.iter().sum::<u64>() as f64 / ends.len() as f64;
        assert!((mean - 4100.0).abs() < 250.0, "{mean}");
        assert!(*ends.last().unwrap() <= 9000);
        // Known to have run 5 s: the 9 s one, with 4 s left.
        let mut known = stage(1, 0, 1, &[1000.0, 9000.0]);
        known.elapsed = vec![5000.0];
        assert_eq!(simulate(&[known], 5, 7).unwrap(), vec![4000; 5]);
    }

    #[test]
    fn the_same_farm_and_seed_give_the_same_estimate_and_runs_shrink_with_size() {
        let stages = [stage(3, 50, 2, &[100.0, 300.0, 900.0])];
        assert_eq!(simulate(&stages, 9, 4), simulate(&stages, 9, 4));
        assert_eq!(runs_for(10), 21);
        assert_eq!(runs_for(1_000_000), 4);
        assert_eq!(runs_for(100_000_000), 3);
    }

    fn cores(n: u64) -> Resources {
        let mut r = Resources::new();
        r.set(CPU, crate::resources::Amount::units(n));
        r
    }

    #[test]
    fn a_deadline_asks_for_the_fewest_jobs_that_meet_it() {
        // 64 tasks of 1 s left, one core each, on a node of 2 cores: 32 s.
        let one = cores(1);
        let nodes = [cores(2)];
        let stages = [stage(2, 64, 0, &[1000.0])];
        let shape = JobShape {
            node: cores(4),
            nodes_per_job: 1,
            wait_ms: 2000,
        };
        let work = WorkLeft {
            stages: &stages,
            requests: std::slice::from_ref(&one),
            nodes: &nodes,
        };
        let plan = |left_ms, most| plan(work, &shape, left_ms, most, 1).unwrap();
        // Loose: the node there is does it.
        assert_eq!(
            plan(60_000, 10),
            Plan {
                extra: 0,
                end_ms: 32_000,
                meets: true
            }
        );
        // 12 s: 2 s of wait, then 10 s on 2 + 4n cores: 64 / 10 s = 6.4 cores,
        // so 2 jobs (10 cores: 7 rounds, 2 + 7 = 9 s... within 12 s), not 1.
        let p = plan(12_000, 10);
        assert!(p.meets, "{p:?}");
        assert_eq!(p.extra, 2, "{p:?}");
        assert!(p.end_ms <= 12_000);
        // Tighter than any count allows: all it may have, and said.
        let p = plan(3_000, 10);
        assert_eq!((p.extra, p.meets), (10, false), "{p:?}");
        // Nothing finished yet: no plan.
        let blind = [stage(2, 64, 0, &[])];
        let work = WorkLeft {
            stages: &blind,
            ..work
        };
        assert!(super::plan(work, &shape, 1000, 10, 1).is_none());
    }
}
