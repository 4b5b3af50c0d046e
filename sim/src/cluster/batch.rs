//! The simulated batch system behind allocation queues: submissions (some refused), jobs that wait in the queue, start nodes, drain before their walltime and end, answered through the coordinator's real batch API.
//!
//! Each `[[alloc]]` queue is added with `mesh alloc add` on the submitting
//! node; from then on the coordinator's real `Allocs` decides, and this
//! module plays SLURM: an answer comes a round trip after the question, an
//! accepted job waits its drawn start delay, then brings `nodes_per_job`
//! new nodes that know their job and deadline from their first step. At
//! the deadline (walltime less the drain margin) they leave as `mesh join`
//! does, tasks handed back; at the walltime the batch system kills
//! whatever is still there. A cancelled job's nodes leave as on SIGTERM.

use super::*;
use crate::report::AllocReport;
use mesh_protocol::alloc::{JobState, QueueDef};
use mesh_protocol::mesh::{AllocBook, AllocCmd, BatchOp, Listed};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Queued,
    Running,
    Ended,
}

struct Job {
    id: String,
    queue: usize,
    state: State,
    nodes: Vec<u32>,
}

/// The batch system's answer to the coordinator, a round trip after it asked.
pub(super) enum Answer {
    Submitted(QueueDef, Result<Vec<String>, String>),
    Polled(Vec<(String, JobState)>),
    Cancelled(String),
    Listed(u64, Vec<Listed>),
}

/// The simulated batch system's state.
pub(super) struct Batch {
    jobs: Vec<Job>,
    rng: SmallRng,
    delays: Vec<Dist>,
    /// Batch-started nodes up, and jobs queued or running.
    up: u32,
    live: u32,
    pub(super) report: AllocReport,
    /// Busy cpu-ms of runs on batch-started nodes.
    pub(super) busy_cpu_ms: f64,
}

impl Batch {
    pub(super) fn new(cfg: &SimConfig) -> Batch {
        Batch {
            jobs: Vec::new(),
            // Its own stream: a scenario without queues draws as before.
            rng: SmallRng::seed_from_u64(mix(cfg.seed, 0xba7c, 0)),
            delays: cfg
                .alloc
                .iter()
                .map(|a| parse_durations(&a.start_delay).expect("validated"))
                .collect(),
            up: 0,
            live: 0,
            report: AllocReport::default(),
            busy_cpu_ms: 0.0,
        }
    }

    fn count_nodes(&mut self, now: Millis, delta: i64) {
        self.up = (i64::from(self.up) + delta).max(0) as u32;
        self.report.peak_nodes = self.report.peak_nodes.max(self.up);
        match self.report.nodes_over_time.last_mut() {
            Some((t, c)) if *t == now => *c = self.up,
            _ => self.report.nodes_over_time.push((now, self.up)),
        }
    }

    fn end(&mut self, j: usize) {
        self.jobs[j].state = State::Ended;
        self.live -= 1;
    }
}

impl Sim<'_> {
    pub(super) fn schedule_alloc(&mut self) {
        for (i, a) in self.cfg.alloc.iter().enumerate() {
            self.push(a.add_at_ms, Ev::AllocAdd(i as u32));
        }
    }

    /// The coordinator's book, else the submitting node's (what `mesh alloc list` shows).
    fn alloc_book(&self) -> Option<&Arc<AllocBook>> {
        let coord = self.alive.iter().find_map(|&n| {
            self.nodes[n as usize]
                .peer
                .as_ref()
                .filter(|p| p.is_coordinator())
        });
        coord
            .or(self.nodes[self.cfg.submit_node].peer.as_ref())
            .map(|p| p.alloc_book())
    }

    /// The scale-in is over: the batch system runs no more jobs than the
    /// queues keep at their minimum, and the coordinator knows it.
    pub(super) fn alloc_settled(&self) -> bool {
        if self.cfg.alloc.is_empty() {
            return true;
        }
        let min: usize = self.cfg.alloc.iter().map(|a| a.min as usize).sum();
        self.batch.live as usize <= min
            && self.alloc_book().is_some_and(|b| b.live().count() <= min)
    }

    /// `mesh alloc add` on the submitting node, again until the mesh has
    /// the queue (the first try may come before a coordinator).
    pub(super) fn alloc_add(&mut self, q: usize) -> Result<(), SimError> {
        let def = self.cfg.alloc[q].queue_def();
        let n = match self.nodes[self.cfg.submit_node].peer {
            Some(_) => self.cfg.submit_node,
            None => match self.alive.first() {
                Some(&n) => n as usize,
                None => return Ok(()),
            },
        };
        let peer = self.nodes[n].peer.as_ref().expect("up");
        if peer.alloc_book().queue(&def.name).is_some() {
            return Ok(());
        }
        let now = self.now;
        self.push(now + 1_000, Ev::AllocAdd(q as u32));
        self.step(n, |p| p.alloc_command(now, AllocCmd::Add(def)))
    }

    /// Carries out the coordinator's batch operation; the answer arrives a
    /// round trip later.
    pub(super) fn batch(&mut self, n: usize, op: BatchOp) {
        let gen = self.nodes[n].gen;
        let at = self.round_trip();
        let answer = match op {
            BatchOp::Submit { queue, jobs } => self.submit(at, *queue, jobs),
            BatchOp::Poll { jobs, .. } => Answer::Polled(
                self.batch
                    .jobs
                    .iter()
                    .filter(|j| jobs.contains(&j.id))
                    .filter_map(|j| match j.state {
                        State::Queued => Some((j.id.clone(), JobState::Queued)),
                        State::Running => Some((j.id.clone(), JobState::Running)),
                        State::Ended => None,
                    })
                    .collect(),
            ),
            // One mesh, one user: every job is this mesh's, its queue by name.
            BatchOp::List { gen, .. } => Answer::Listed(
                gen,
                self.batch
                    .jobs
                    .iter()
                    .filter_map(|j| {
                        let state = match j.state {
                            State::Queued => JobState::Queued,
                            State::Running => JobState::Running,
                            State::Ended => return None,
                        };
                        Some(Listed {
                            id: j.id.clone(),
                            state,
                            queue: self.cfg.alloc[j.queue].name.clone(),
                        })
                    })
                    .collect(),
            ),
            BatchOp::Cancel { job, .. } => {
                if let Some(j) = self.batch.jobs.iter().position(|j| j.id == job) {
                    match self.batch.jobs[j].state {
                        State::Queued => {
                            self.batch.end(j);
                            self.batch.report.cancelled += 1;
                        }
                        State::Running => {
                            // SIGTERM to its nodes: they hand their tasks back and go.
                            let at = self.now + self.latency();
                            self.push(
                                at,
                                Ev::JobEnd {
                                    job: j as u32,
                                    cancelled: true,
                                },
                            );
                        }
                        // Gone already: scancel of a finished job is not an error.
                        State::Ended => {}
                    }
                }
                Answer::Cancelled(job)
            }
        };
        self.push(
            at,
            Ev::BatchAnswer {
                node: n as u32,
                gen,
                answer: Box::new(answer),
            },
        );
    }

    /// A submission of `jobs` jobs (one array), refused at the queue's
    /// rate; each accepted job starts after its drawn wait from `at`,
    /// when the answer is back.
    fn submit(&mut self, at: Millis, queue: QueueDef, jobs: u32) -> Answer {
        let b = &mut self.batch;
        b.report.submissions += 1;
        b.report.largest_submission = b.report.largest_submission.max(jobs);
        let Some(q) = self.cfg.alloc.iter().position(|a| a.name == queue.name) else {
            b.report.refused += 1;
            let why = format!("no queue {:?} here (simulated)", queue.name);
            return Answer::Submitted(queue, Err(why));
        };
        if b.rng.random::<f64>() < self.cfg.alloc[q].reject_rate {
            b.report.refused += 1;
            return Answer::Submitted(queue, Err("submission refused (simulated)".into()));
        }
        let mut ids = Vec::new();
        let mut starts = Vec::new();
        for _ in 0..jobs {
            let j = b.jobs.len();
            let id = format!("sim-{}", j + 1);
            ids.push(id.clone());
            b.jobs.push(Job {
                id,
                queue: q,
                state: State::Queued,
                nodes: Vec::new(),
            });
            starts.push((at + b.delays[q].sample(&mut b.rng), j));
        }
        b.live += jobs;
        b.report.peak_jobs = b.report.peak_jobs.max(b.live);
        b.report.jobs += u64::from(jobs);
        for (start, j) in starts {
            self.push(start, Ev::JobStart(j as u32));
        }
        Answer::Submitted(queue, Ok(ids))
    }

    pub(super) fn batch_answer(
        &mut self,
        node: usize,
        gen: u32,
        answer: Answer,
    ) -> Result<(), SimError> {
        if self.nodes[node].gen != gen || self.nodes[node].peer.is_none() {
            return Ok(());
        }
        let now = self.now;
        self.step(node, |p| match answer {
            Answer::Submitted(q, r) => p.batch_submitted(now, &q, r),
            Answer::Polled(states) => {
                p.batch_polled(now, mesh_protocol::alloc::BatchSystem::Slurm, Ok(states))
            }
            Answer::Cancelled(job) => p.batch_cancelled(now, &job, Ok(())),
            Answer::Listed(gen, jobs) => {
                p.batch_listed(now, mesh_protocol::alloc::BatchSystem::Slurm, gen, Ok(jobs))
            }
        })
    }

    /// A job leaves the batch queue: its nodes start, knowing when they drain.
    pub(super) fn job_start(&mut self, j: usize) -> Result<(), SimError> {
        if self.batch.jobs[j].state != State::Queued {
            return Ok(());
        }
        let spec = &self.cfg.alloc[self.batch.jobs[j].queue];
        let total = spec.node_resources();
        let (per_job, walltime, margin) =
            (spec.nodes_per_job, spec.walltime_ms, spec.drain_margin());
        let now = self.now;
        let deadline = now + walltime - margin;
        self.batch.jobs[j].state = State::Running;
        self.batch.report.started += 1;
        let id = self.batch.jobs[j].id.clone();
        for _ in 0..per_job {
            let n = self.add_node(total.clone(), id.clone(), deadline);
            self.batch.jobs[j].nodes.push(n as u32);
            self.batch.count_nodes(now, 1);
            self.start_node(n, false)?;
        }
        // The nodes' own drain, then the batch system's kill.
        let job = j as u32;
        self.push(
            deadline,
            Ev::JobEnd {
                job,
                cancelled: false,
            },
        );
        self.push(now + walltime, Ev::JobKill(job));
        Ok(())
    }

    /// A running job ends: its walltime's drain, or a cancellation. Its
    /// nodes leave gracefully: what runs there is interrupted and handed
    /// back, no retry spent.
    pub(super) fn job_end(&mut self, j: usize, cancelled: bool) {
        if self.batch.jobs[j].state != State::Running {
            return;
        }
        if cancelled {
            self.batch.report.cancelled += 1;
        } else {
            self.batch.report.drained += 1;
        }
        let now = self.now;
        self.batch.end(j);
        let nodes = self.batch.jobs[j].nodes.clone();
        let mut up = 0;
        for n in nodes {
            let nd = &self.nodes[n as usize];
            if nd.peer.is_some() {
                up += 1;
                self.batch.report.interrupted +=
                    nd.runs.values().filter(|r| !r.killed).count() as u64;
                self.push(now, Ev::Leave(n));
            }
        }
        self.batch.count_nodes(now, -up);
    }

    /// The walltime: whatever of the job is still up dies like a crash.
    /// Its nodes were counted down when they began to leave.
    pub(super) fn job_kill(&mut self, j: usize) {
        let nodes = self.batch.jobs[j].nodes.clone();
        for n in nodes {
            if self.nodes[n as usize].peer.is_some() {
                self.batch.report.killed += 1;
                self.stop_node(n as usize, true);
            }
        }
    }

    /// The allocation part of the report, when the scenario has queues.
    pub(super) fn alloc_report(&self) -> Option<AllocReport> {
        if self.cfg.alloc.is_empty() {
            return None;
        }
        let mut r = self.batch.report.clone();
        let mut cpu_ms = 0.0;
        for nd in self.nodes.iter().filter(|nd| nd.job.is_some()) {
            let up = nd.up_ms + nd.up_since.map_or(0, |s| self.now.saturating_sub(s));
            r.node_ms += up;
            cpu_ms += nd.cpus * up as f64;
        }
        r.busy_share = if cpu_ms > 0.0 {
            self.batch.busy_cpu_ms / cpu_ms
        } else {
            0.0
        };
        r.book = self.alloc_book().map(|b| (**b).clone()).unwrap_or_default();
        Some(r)
    }
}
