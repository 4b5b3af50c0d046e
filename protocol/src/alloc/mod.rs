//! When to ask a batch system (SLURM, PBS) for more nodes, when to give them back, and when a node must drain before its walltime: pure decisions, time as an argument.
//!
//! The coordinator (and the simulator, with a simulated batch queue) feeds
//! a [`Scaler`] the backlog by resource kind and the allocations it knows,
//! and carries out what it decides; the batch-system side (scripts,
//! `sbatch`, `squeue`, ...) lives in the node. Known pains of the tools
//! our users come from shape the rules: submitting in bursts that the
//! batch system rejects, shrinking while work is still queued, submitting
//! again and again after a failure, and walltime kills blamed on tasks.

pub mod book;

use serde::{Deserialize, Serialize};

pub use crate::engine::Millis;
use crate::resources::{Amount, Resources, CPU, GPU, MEM};

/// Which batch system a queue's jobs are submitted to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum BatchSystem {
    /// SLURM (`sbatch`, `squeue`, `scancel`).
    Slurm,
    /// PBS (`qsub`, `qstat`, `qdel`).
    Pbs,
}

/// An allocation queue: what one batch job asks for, and the limits on
/// how many such jobs exist at once.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueDef {
    /// The queue's name, unique in the mesh: its jobs' names carry it.
    pub name: String,
    /// The batch system its jobs go to.
    pub system: BatchSystem,
    /// The job's walltime.
    pub time_limit_s: u64,
    /// Per node of the job.
    pub cores: u32,
    /// Memory per node, in bytes (None: none asked for).
    pub mem_bytes: Option<u64>,
    /// GPUs per node.
    pub gpus: u32,
    /// Nodes per job.
    pub nodes_per_job: u32,
    /// The partition (SLURM) or queue (PBS) to submit to, if not the default.
    pub partition: Option<String>,
    /// The account to charge, if not the default.
    pub account: Option<String>,
    /// Extra lines for the script's header, as the user wrote them.
    pub directives: Vec<String>,
    /// Shell lines run before the node starts (`module load ...`).
    pub prologue: Vec<String>,
    /// Jobs (queued or running) kept at least / at most.
    pub min: u32,
    /// See `min`: the most jobs at once.
    pub max: u32,
    /// A job whose nodes ran nothing this long is cancelled (above `min`).
    pub idle_timeout_s: u64,
    /// Finish the mesh's farms by then (Unix ms): the queue has the jobs a
    /// simulation of what is left says meet it, not those the backlog asks
    /// for (`mesh alloc add --deadline`; see `eta::plan`).
    pub deadline_ms: Option<u64>,
}

impl QueueDef {
    /// A queue with `mesh alloc add`'s defaults: one node per job, no
    /// memory, GPUs, partition, account, directives or prologue, 0 to 10
    /// jobs, cancelled after 5 minutes idle.
    pub fn new(name: &str, system: BatchSystem, time_limit_s: u64, cores: u32) -> QueueDef {
        QueueDef {
            name: name.to_string(),
            system,
            time_limit_s,
            cores,
            mem_bytes: None,
            gpus: 0,
            nodes_per_job: 1,
            partition: None,
            account: None,
            directives: Vec::new(),
            prologue: Vec::new(),
            min: 0,
            max: 10,
            idle_timeout_s: 300,
            deadline_ms: None,
        }
    }

    /// How long a job's node can run tasks: its walltime less the drain
    /// margin `mesh join --walltime` takes by default (2 minutes, or a
    /// tenth of a shorter walltime), as the job scripts start it.
    pub fn usable_ms(&self) -> Millis {
        let walltime = self.time_limit_s * 1000;
        walltime.saturating_sub((walltime / 10).min(120_000))
    }

    /// One node of this queue's jobs, as resources (cores, GPUs, memory).
    pub fn node_resources(&self) -> Resources {
        let mut r = Resources::new();
        r.set(CPU, Amount::units(u64::from(self.cores)));
        if self.gpus > 0 {
            r.set(GPU, Amount::units(u64::from(self.gpus)));
        }
        if let Some(m) = self.mem_bytes {
            r.set(MEM, Amount::units(m));
        }
        r
    }

    /// Whether this queue's jobs serve GPU tasks (its jobs have GPUs).
    pub fn for_gpus(&self) -> bool {
        self.gpus > 0
    }

    /// What one job adds: cores and GPUs over all its nodes.
    fn per_job(&self) -> (u64, u64) {
        let n = u64::from(self.nodes_per_job.max(1));
        (u64::from(self.cores) * n, u64::from(self.gpus) * n)
    }
}

/// Where a job is in the batch system, as last polled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum JobState {
    /// Waiting in the batch system to start.
    Queued,
    /// Started: its nodes may have joined the mesh.
    Running,
    /// Gone from the batch system (finished, cancelled, killed at walltime, failed).
    Ended,
}

/// One submitted job of a queue.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Job {
    /// The batch system's job id.
    pub id: String,
    /// The name of the queue that submitted it.
    pub queue: String,
    /// Where it is, as last polled.
    pub state: JobState,
    /// When it was submitted, on the driver's clock.
    pub submitted_at: Millis,
    /// Since when its nodes have run no task (None: busy, or not started).
    pub idle_since: Option<Millis>,
}

/// Work the mesh cannot start now for want of nodes: what ready tasks ask
/// for beyond the free capacity of the nodes there are (in whole cores and GPUs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Backlog {
    /// Cores wanted, in whole cores.
    pub cores: u64,
    /// GPUs wanted, in whole GPUs.
    pub gpus: u64,
}

/// What a deadline asks of an allocation queue: how many more of its
/// jobs than those whose nodes are in the mesh end the work left by then.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// Jobs beyond those whose nodes are here: the fewest that meet the
    /// deadline, or as many as the queue may have when none do.
    pub extra: u32,
    /// When the work ends with them (the p90 of the runs, ms from now).
    pub end_ms: u64,
    /// Whether `extra` jobs meet the deadline.
    pub meets: bool,
}

/// What the caller carries out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Submit `jobs` jobs of the queue (one job array where the batch system has them).
    Submit {
        /// The queue's name.
        queue: String,
        /// How many jobs to submit.
        jobs: u32,
    },
    /// Cancel a job.
    Cancel {
        /// The job's id in the batch system.
        job: String,
        /// Why, in words for the queue's log.
        why: String,
    },
    /// The queue failed too often in a row: no more submissions until resumed.
    Pause {
        /// The queue's name.
        queue: String,
        /// Why, in words for the queue's log.
        why: String,
    },
}

/// Limits on how fast a queue grows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pace {
    /// At most this many jobs per submission.
    pub burst: u32,
    /// At least this long between two submissions of a queue.
    pub interval_ms: Millis,
    /// The wait after a failed submission, doubled on each failure in a row...
    pub backoff_ms: Millis,
    /// ... up to this.
    pub backoff_max_ms: Millis,
    /// Failures in a row that pause the queue.
    pub failures_to_pause: u32,
}

impl Default for Pace {
    fn default() -> Pace {
        Pace {
            burst: 4,
            interval_ms: 10_000,
            backoff_ms: 10_000,
            backoff_max_ms: 600_000,
            failures_to_pause: 5,
        }
    }
}

#[derive(Clone, Debug, Default)]
struct QueueState {
    last_submit: Option<Millis>,
    failures: u32,
    retry_at: Millis,
    paused: bool,
    /// Since when no work of this queue's kind has waited at all.
    no_work_since: Option<Millis>,
}

/// The scaling decisions for every allocation queue of the mesh.
#[derive(Clone, Debug, Default)]
pub struct Scaler {
    /// The limits on how fast each queue grows.
    pub pace: Pace,
    queues: std::collections::BTreeMap<String, QueueState>,
}

impl Scaler {
    /// What to submit and cancel now. `backlog`: ready work beyond what the
    /// nodes there are can start; `jobs`: every job the queues submitted
    /// that has not ended.
    pub fn decide(
        &mut self,
        now: Millis,
        queues: &[QueueDef],
        backlog: Backlog,
        jobs: &[Job],
    ) -> Vec<Decision> {
        self.decide_with(now, queues, backlog, jobs, &[])
    }

    /// As [`Scaler::decide`], with the jobs a queue with a deadline is to
    /// have (`targets`, by queue: queued and running, a plan's): such a
    /// queue grows to its target, not to what the backlog asks.
    pub fn decide_with(
        &mut self,
        now: Millis,
        queues: &[QueueDef],
        backlog: Backlog,
        jobs: &[Job],
        targets: &[(String, u32)],
    ) -> Vec<Decision> {
        let mut out = Vec::new();
        // Work that queued jobs will take once they start: not asked for twice.
        let (mut cores_left, mut gpus_left) = (backlog.cores, backlog.gpus);
        for q in queues {
            let (cores, gpus) = q.per_job();
            let queued = jobs
                .iter()
                .filter(|j| j.queue == q.name && j.state == JobState::Queued)
                .count() as u64;
            if q.for_gpus() {
                gpus_left = gpus_left.saturating_sub(queued * gpus);
            } else {
                cores_left = cores_left.saturating_sub(queued * cores);
            }
        }
        for q in queues {
            let st = self.queues.entry(q.name.clone()).or_default();
            let live: Vec<&Job> = jobs
                .iter()
                .filter(|j| j.queue == q.name && j.state != JobState::Ended)
                .collect();
            let count = live.len() as u32;

            // Give back what idles, above the minimum, and only when no
            // work of its kind is waiting (shrinking while work waits
            // only means asking again).
            let waiting = if q.for_gpus() { gpus_left } else { cores_left };
            let raw = if q.for_gpus() {
                backlog.gpus
            } else {
                backlog.cores
            };
            if raw == 0 {
                st.no_work_since.get_or_insert(now);
            } else {
                st.no_work_since = None;
            }
            let mut kept = count;
            if waiting == 0 {
                for j in &live {
                    let idle_for = j.idle_since.map(|t| now.saturating_sub(t));
                    if kept > q.min
                        && j.state == JobState::Running
                        && idle_for.is_some_and(|d| d >= q.idle_timeout_s * 1000)
                    {
                        out.push(Decision::Cancel {
                            job: j.id.clone(),
                            why: format!("idle for {} s", idle_for.unwrap_or(0) / 1000),
                        });
                        kept -= 1;
                    }
                }
            }
            // Jobs still in the batch queue that no work has wanted for an
            // idle timeout are cancelled too, newest first: a pending job
            // costs nothing to cancel, a started one its idle timeout.
            let unwanted = st
                .no_work_since
                .map(|t| now.saturating_sub(t))
                .filter(|d| *d >= q.idle_timeout_s * 1000);
            if let Some(d) = unwanted {
                for j in live.iter().rev().filter(|j| j.state == JobState::Queued) {
                    if kept > q.min {
                        out.push(Decision::Cancel {
                            job: j.id.clone(),
                            why: format!("still queued, and no work has waited for {} s", d / 1000),
                        });
                        kept -= 1;
                    }
                }
            }

            if st.paused || now < st.retry_at {
                continue;
            }
            if st
                .last_submit
                .is_some_and(|t| now < t + self.pace.interval_ms)
            {
                continue;
            }
            let (cores, gpus) = q.per_job();
            let wanted = if q.for_gpus() {
                gpus_left.div_ceil(gpus.max(1))
            } else {
                cores_left.div_ceil(cores.max(1))
            };
            let below_min = q.min.saturating_sub(count);
            let jobs_wanted = match targets.iter().find(|(n, _)| *n == q.name) {
                Some((_, target)) => target.saturating_sub(count).max(below_min),
                None => (wanted as u32).max(below_min),
            };
            let room = q.max.saturating_sub(count);
            let n = jobs_wanted.min(room).min(self.pace.burst);
            if n == 0 {
                continue;
            }
            if q.for_gpus() {
                gpus_left = gpus_left.saturating_sub(u64::from(n) * gpus);
            } else {
                cores_left = cores_left.saturating_sub(u64::from(n) * cores);
            }
            st.last_submit = Some(now);
            out.push(Decision::Submit {
                queue: q.name.clone(),
                jobs: n,
            });
        }
        out
    }

    /// The batch system's answer to a submission: the queue backs off
    /// after a failure, doubling the wait on each in a row, and is paused
    /// after `Pace::failures_to_pause` of them.
    pub fn submitted(&mut self, now: Millis, queue: &str, ok: bool) -> Option<Decision> {
        let pace = self.pace;
        let st = self.queues.entry(queue.to_string()).or_default();
        if ok {
            st.failures = 0;
            st.retry_at = 0;
            return None;
        }
        st.failures += 1;
        let wait = pace
            .backoff_ms
            .saturating_mul(1 << (st.failures - 1).min(20))
            .min(pace.backoff_max_ms);
        st.retry_at = now + wait;
        if st.failures >= pace.failures_to_pause {
            st.paused = true;
            return Some(Decision::Pause {
                queue: queue.to_string(),
                why: format!("{} submissions in a row failed", st.failures),
            });
        }
        None
    }

    /// `mesh alloc resume`: submissions may go again, at once.
    pub fn resume(&mut self, queue: &str) {
        let st = self.queues.entry(queue.to_string()).or_default();
        st.paused = false;
        st.failures = 0;
        st.retry_at = 0;
    }

    /// Stops the queue's submissions until [`Scaler::resume`] (`mesh alloc pause`,
    /// or a book that says it is paused).
    pub fn pause(&mut self, queue: &str) {
        self.queues.entry(queue.to_string()).or_default().paused = true;
    }

    /// Whether the queue's submissions are paused.
    pub fn is_paused(&self, queue: &str) -> bool {
        self.queues.get(queue).is_some_and(|s| s.paused)
    }
}

/// Whether a node whose walltime ends at `ends_at` may still start a task
/// expected to take `expected_ms` (None: unknown), keeping `margin_ms` to
/// hand back what it has and stop cleanly.
pub fn fits_before_walltime(
    now: Millis,
    ends_at: Millis,
    expected_ms: Option<Millis>,
    margin_ms: Millis,
) -> bool {
    let deadline = ends_at.saturating_sub(margin_ms);
    match expected_ms {
        Some(e) => now.saturating_add(e) <= deadline,
        // Unknown length: start while the deadline has not come.
        None => now < deadline,
    }
}

/// Whether a node must drain now: hand back its queue, stop taking work,
/// and stop what runs so that no task is killed by the batch system.
pub fn must_drain(now: Millis, ends_at: Millis, margin_ms: Millis) -> bool {
    now >= ends_at.saturating_sub(margin_ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue(name: &str, gpus: u32) -> QueueDef {
        QueueDef {
            gpus,
            ..QueueDef::new(name, BatchSystem::Slurm, 3600, 8)
        }
    }

    fn job(id: &str, queue: &str, state: JobState, idle_since: Option<Millis>) -> Job {
        Job {
            id: id.into(),
            queue: queue.into(),
            state,
            submitted_at: 0,
            idle_since,
        }
    }

    fn submits(d: &[Decision]) -> Vec<(String, u32)> {
        d.iter()
            .filter_map(|d| match d {
                Decision::Submit { queue, jobs } => Some((queue.clone(), *jobs)),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_backlog_asks_for_as_many_jobs_as_cover_it_in_bursts_within_max() {
        let mut s = Scaler::default();
        let q = [queue("cpu", 0)];
        // 20 cores of work, 8 per job: 3 jobs.
        let d = s.decide(0, &q, Backlog { cores: 20, gpus: 0 }, &[]);
        assert_eq!(submits(&d), vec![("cpu".into(), 3)]);
        // Not again within the interval, even with more work.
        let d = s.decide(
            5_000,
            &q,
            Backlog {
                cores: 200,
                gpus: 0,
            },
            &[],
        );
        assert!(submits(&d).is_empty());
        // A burst is at most 4 jobs; max bounds queued and running jobs together.
        let jobs: Vec<Job> = (0..8)
            .map(|i| job(&i.to_string(), "cpu", JobState::Running, None))
            .collect();
        let d = s.decide(
            10_000,
            &q,
            Backlog {
                cores: 1000,
                gpus: 0,
            },
            &jobs,
        );
        assert_eq!(submits(&d), vec![("cpu".into(), 2)]);
        let d = s.decide(
            20_000,
            &q,
            Backlog {
                cores: 1000,
                gpus: 0,
            },
            &[],
        );
        assert_eq!(submits(&d), vec![("cpu".into(), 4)]);
    }

    #[test]
    fn queued_jobs_count_toward_the_backlog_and_gpu_work_asks_gpu_queues() {
        let mut s = Scaler::default();
        let q = [queue("cpu", 0), queue("gpu", 2)];
        let pending = [job("1", "cpu", JobState::Queued, None)];
        // 8 cores wanted, one 8-core job already queued: nothing more for
        // cpu; 3 GPUs wanted, 2 per job: 2 gpu jobs.
        let d = s.decide(0, &q, Backlog { cores: 8, gpus: 3 }, &pending);
        assert_eq!(submits(&d), vec![("gpu".into(), 2)]);
    }

    #[test]
    fn min_is_kept_and_idle_jobs_above_it_are_cancelled_only_when_nothing_waits() {
        let mut s = Scaler::default();
        let mut q = queue("cpu", 0);
        q.min = 1;
        let q = [q];
        let d = s.decide(0, &q, Backlog::default(), &[]);
        assert_eq!(submits(&d), vec![("cpu".into(), 1)]);
        let idle = [
            job("1", "cpu", JobState::Running, Some(0)),
            job("2", "cpu", JobState::Running, Some(0)),
        ];
        // Work waits: nothing is cancelled, however long idle.
        let d = s.decide(1_000_000, &q, Backlog { cores: 1, gpus: 0 }, &idle);
        assert!(!d.iter().any(|d| matches!(d, Decision::Cancel { .. })));
        // Nothing waits: one cancelled, the minimum kept.
        let d = s.decide(1_000_000, &q, Backlog::default(), &idle);
        let cancels: Vec<_> = d
            .iter()
            .filter(|d| matches!(d, Decision::Cancel { .. }))
            .collect();
        assert_eq!(cancels.len(), 1, "{d:?}");
        // Not idle long enough: kept.
        let d = s.decide(200_000, &q, Backlog::default(), &idle);
        assert!(!d.iter().any(|d| matches!(d, Decision::Cancel { .. })));
    }

    #[test]
    fn queued_jobs_no_work_wants_for_an_idle_timeout_are_cancelled_newest_first() {
        let mut s = Scaler::default();
        let q = [queue("cpu", 0)];
        let jobs = [
            job("1", "cpu", JobState::Queued, None),
            job("2", "cpu", JobState::Queued, None),
        ];
        let cancels = |d: &[Decision]| -> Vec<String> {
            d.iter()
                .filter_map(|d| match d {
                    Decision::Cancel { job, .. } => Some(job.clone()),
                    _ => None,
                })
                .collect()
        };
        // Work waits: they stay.
        assert!(cancels(&s.decide(0, &q, Backlog { cores: 1, gpus: 0 }, &jobs)).is_empty());
        // No work from 1 s on; not for long enough yet at 300 s.
        assert!(cancels(&s.decide(1_000, &q, Backlog::default(), &jobs)).is_empty());
        assert!(cancels(&s.decide(300_000, &q, Backlog::default(), &jobs)).is_empty());
        assert_eq!(
            cancels(&s.decide(301_000, &q, Backlog::default(), &jobs)),
            ["2", "1"]
        );
        // Work came back in between: the clock starts again.
        let mut s = Scaler::default();
        s.decide(0, &q, Backlog::default(), &jobs);
        s.decide(200_000, &q, Backlog { cores: 1, gpus: 0 }, &jobs);
        assert!(cancels(&s.decide(400_000, &q, Backlog::default(), &jobs)).is_empty());
    }

    #[test]
    fn failures_back_off_doubling_then_pause_until_resumed() {
        let mut s = Scaler::default();
        let q = [queue("cpu", 0)];
        let work = Backlog { cores: 8, gpus: 0 };
        let mut now = 0;
        let mut waits = Vec::new();
        for i in 0..5 {
            let d = s.decide(now, &q, work, &[]);
            assert_eq!(submits(&d).len(), 1, "try {i} at {now}");
            let paused = s.submitted(now, "cpu", false);
            if i < 4 {
                assert!(paused.is_none());
                // Nothing before the backoff ends.
                let wait = s.queues["cpu"].retry_at - now;
                waits.push(wait);
                assert!(submits(&s.decide(now + wait - 1, &q, work, &[])).is_empty());
                now += wait;
            } else {
                assert!(matches!(paused, Some(Decision::Pause { .. })));
            }
        }
        assert_eq!(waits, vec![10_000, 20_000, 40_000, 80_000]);
        assert!(s.is_paused("cpu"));
        assert!(submits(&s.decide(now + 10_000_000, &q, work, &[])).is_empty());
        s.resume("cpu");
        assert_eq!(submits(&s.decide(now + 10_000_000, &q, work, &[])).len(), 1);
        assert!(s.submitted(now, "cpu", true).is_none());
    }

    #[test]
    fn a_node_takes_only_what_ends_before_its_walltime_and_drains_at_the_margin() {
        let ends = 3_600_000;
        let margin = 60_000;
        assert!(fits_before_walltime(0, ends, Some(600_000), margin));
        assert!(!fits_before_walltime(
            3_000_000,
            ends,
            Some(600_000),
            margin
        ));
        assert!(fits_before_walltime(3_000_000, ends, None, margin));
        assert!(!fits_before_walltime(3_540_000, ends, None, margin));
        assert!(!must_drain(3_539_999, ends, margin));
        assert!(must_drain(3_540_000, ends, margin));
    }
}
