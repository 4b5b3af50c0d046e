//! The simulated batch system behind allocation queues: submissions (some refused), jobs that wait in the queue, start nodes, drain before their walltime and end, answered through the coordinator's real batch API.

use mesh_protocol::alloc::{JobState, QueueDef};
use mesh_protocol::mesh::{AllocCmd, BatchOp};
use serde::{Deserialize, Serialize};

use super::*;

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
}

/// What the allocation queues did in a run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AllocReport {
    /// Submissions asked for, and those the batch system refused.
    pub submissions: u64,
    pub refused: u64,
    /// Jobs accepted, started, and ended at their walltime (drained) or cancelled.
    pub jobs: u64,
    pub started: u64,
    pub drained: u64,
    pub cancelled: u64,
    /// The most nodes batch jobs had up at once.
    pub peak_nodes: u32,
    /// Node-time held by batch jobs' nodes, and the share of their
    /// cpu-time spent running tasks.
    pub node_ms: u64,
    pub busy_share: f64,
    /// Batch-started nodes up: (virtual ms, count) at each change.
    pub nodes_over_time: Vec<(u64, u32)>,
}

/// The simulated batch system's state.
pub(super) struct Batch {
    jobs: Vec<Job>,
    rng: SmallRng,
    delays: Vec<Dist>,
    up: u32,
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
            report: AllocReport::default(),
            busy_cpu_ms: 0.0,
        }
    }

    /// No job is left but those the queues keep at their minimum.
    pub(super) fn settled(&self, cfg: &SimConfig) -> bool {
        let live = self.jobs.iter().filter(|j| j.state != State::Ended).count();
        live <= cfg.alloc.iter().map(|a| a.min as usize).sum()
    }

    fn count(&mut self, now: Millis, delta: i64) {
        self.up = (i64::from(self.up) + delta).max(0) as u32;
        self.report.peak_nodes = self.report.peak_nodes.max(self.up);
        match self.report.nodes_over_time.last_mut() {
            Some((t, c)) if *t == now => *c = self.up,
            _ => self.report.nodes_over_time.push((now, self.up)),
        }
    }
}

impl Sim<'_> {
    pub(super) fn schedule_alloc(&mut self) {
        for (i, a) in self.cfg.alloc.iter().enumerate() {
            self.push(a.add_at_ms, Ev::AllocAdd(i as u32));
        }
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
            BatchOp::Submit { queue, jobs } => {
                self.batch.report.submissions += 1;
                let Some(q) = self.cfg.alloc.iter().position(|a| a.name == queue.name) else {
                    return;
                };
                let refuse = self.batch.rng.random::<f64>() < self.cfg.alloc[q].reject_rate;
                if refuse {
                    self.batch.report.refused += 1;
                    Answer::Submitted(queue, Err("submission refused (simulated)".into()))
                } else {
                    let mut ids = Vec::new();
                    for _ in 0..jobs {
                        let j = self.batch.jobs.len();
                        let id = format!("sim-{}", j + 1);
                        ids.push(id.clone());
                        self.batch.jobs.push(Job {
                            id,
                            queue: q,
                            state: State::Queued,
                            nodes: Vec::new(),
                        });
                        let delay = self.batch.delays[q].sample(&mut self.batch.rng);
                        self.push(at + delay, Ev::JobStart(j as u32));
                    }
                    self.batch.report.jobs += u64::from(jobs);
                    Answer::Submitted(queue, Ok(ids))
                }
            }
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
            BatchOp::Cancel { job, .. } => {
                if let Some(j) = self.batch.jobs.iter().position(|j| j.id == job) {
                    match self.batch.jobs[j].state {
                        State::Queued => {
                            self.batch.jobs[j].state = State::Ended;
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
        })
    }

    /// A job leaves the batch queue: its nodes start, knowing when they drain.
    pub(super) fn job_start(&mut self, j: usize) -> Result<(), SimError> {
        if self.batch.jobs[j].state != State::Queued {
            return Ok(());
        }
        let spec = &self.cfg.alloc[self.batch.jobs[j].queue];
        let mut total = Resources::new();
        total.set(CPU, mesh_protocol::Amount::units(u64::from(spec.cores)));
        if spec.gpus > 0 {
            total.set(
                mesh_protocol::resources::GPU,
                mesh_protocol::Amount::units(u64::from(spec.gpus)),
            );
        }
        let (per_job, walltime, margin) =
            (spec.nodes_per_job, spec.walltime_ms, spec.drain_margin());
        let now = self.now;
        self.batch.jobs[j].state = State::Running;
        self.batch.report.started += 1;
        let id = self.batch.jobs[j].id.clone();
        for _ in 0..per_job {
            let n = self.add_node(total.clone());
            self.batch.jobs[j].nodes.push(n as u32);
            self.start_node(n, false)?;
            self.batch.count(now, 1);
            let deadline = now + walltime - margin;
            if let Some(p) = self.nodes[n].peer.as_mut() {
                p.set_batch_job(Some(id.clone()), Some(deadline));
            }
        }
        // The node's own drain, before the batch system's kill.
        self.push(
            now + walltime - margin,
            Ev::JobEnd {
                job: j as u32,
                cancelled: false,
            },
        );
        Ok(())
    }

    /// A running job ends: its walltime's drain, or a cancellation.
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
        self.batch.jobs[j].state = State::Ended;
        let nodes = self.batch.jobs[j].nodes.clone();
        let up = nodes
            .iter()
            .filter(|&&n| self.nodes[n as usize].peer.is_some())
            .count() as i64;
        for n in nodes {
            self.push(now, Ev::Leave(n));
        }
        self.batch.count(now, -up);
    }

    /// The allocation part of the report, when the scenario has queues.
    pub(super) fn alloc_report(&self) -> Option<AllocReport> {
        if self.cfg.alloc.is_empty() {
            return None;
        }
        let mut r = self.batch.report.clone();
        let mut cpu_ms = 0.0;
        for nd in self.nodes.iter().filter(|nd| nd.batch) {
            let up = nd.up_ms + nd.up_since.map_or(0, |s| self.now.saturating_sub(s));
            r.node_ms += up;
            cpu_ms += nd.cpus * up as f64;
        }
        r.busy_share = if cpu_ms > 0.0 {
            self.batch.busy_cpu_ms / cpu_ms
        } else {
            0.0
        };
        Some(r)
    }
}
