//! What a simulated run measured, as data (serde) and as an SVG picture.

use std::fmt::Write as _;
use std::sync::LazyLock;

use serde::{Deserialize, Serialize};

/// The result of [`crate::run`]. Everything but `events_per_sec`,
/// `wall_ms` and `peak_rss_bytes` is a function of the scenario (same
/// seed, same report).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SimReport {
    pub name: String,
    pub seed: u64,
    pub nodes: usize,
    /// Those nodes by what each offers (`cpu=4,mem=16G`), in the order
    /// first seen: how many of each.
    #[serde(default)]
    pub node_shapes: Vec<(usize, String)>,
    pub tasks: u64,
    /// Virtual ms from the submission to the end of the last task that succeeded.
    pub makespan: u64,
    /// max(work / capacity for each resource and each set of eligible nodes,
    /// the longest dependency chain), in virtual ms.
    pub lower_bound: u64,
    /// makespan / lower_bound.
    pub ratio: f64,
    /// The makespan of an ideal scheduler that, like mesh, does not know
    /// durations: greedy list scheduling with no latency, in submission order.
    pub greedy: u64,
    /// greedy / lower_bound: how far from the bound not knowing durations
    /// alone puts a scheduler on this workload.
    pub greedy_ratio: f64,
    /// The same scheduler knowing durations, longest first (LPT): near 1
    /// when the bound is tight, so that `greedy_ratio` above it is the
    /// price of not knowing durations.
    pub longest_first: u64,
    pub longest_first_ratio: f64,
    /// Busy cpu-time of every execution over the cpu-time of live nodes during the makespan.
    pub utilization: f64,
    /// Steals that brought tasks (summed over the live peers at the end).
    pub steals: u64,
    pub steals_asked: u64,
    pub tasks_stolen: u64,
    /// Messages handed to the network (a beat counts once per receiver).
    pub messages: u64,
    /// Messages from the first node's start to the submission (joining,
    /// then idle), and from the submission until the coordinator finished
    /// the farm (every task done and every output home).
    #[serde(default)]
    pub traffic_idle: Traffic,
    #[serde(default)]
    pub traffic_farm: Traffic,
    pub messages_lost: u64,
    /// Executions that ran to completion beyond one per task.
    pub duplicates: u64,
    /// Every execution started.
    pub executions: u64,
    pub tasks_done: u64,
    pub tasks_failed: u64,
    /// Of those failed, tasks whose node was lost under them `CRASHES_MAX`
    /// times (crashes, or partitions that made a side look dead): failed by
    /// the crash limit, not by their own exit.
    pub crash_limited: u64,
    /// Stages reported unplaceable to the submitter, with the reason.
    pub unplaceable: Vec<String>,
    /// Each node's prefetch depth (tasks it asks to keep queued beyond
    /// those it runs) when a task last ended there; 0 if none ran there.
    pub prefetch: Vec<u32>,
    /// Simulation events processed (deliveries, timers, task ends, faults).
    pub events: u64,
    /// Of the farm's events, those that were the mesh's upkeep between
    /// changes: what the simulator stepped one at a time where an exact
    /// skip would jump, and which timers made them.
    #[serde(default)]
    pub upkeep: Upkeep,
    pub events_per_sec: f64,
    pub wall_ms: f64,
    /// This process's peak resident memory at the end of the run, where
    /// the system tells it (Linux): what a simulation of this size needs.
    #[serde(default)]
    pub peak_rss_bytes: Option<u64>,
    /// What the allocation queues did, when the scenario has any.
    #[serde(default)]
    pub alloc: Option<AllocReport>,
    /// Since when (virtual ms) every look found the mesh one (`one_mesh`,
    /// looked at every second); none when it was not asked for.
    #[serde(default)]
    pub one_mesh_ms: Option<u64>,
    /// Every node that ever coordinated, ascending.
    #[serde(default)]
    pub coordinators: Vec<u32>,
    /// The longest a message waited in a slow node's queue (`[[slow]]`).
    #[serde(default)]
    pub slow_wait_ms: u64,
    /// A recorded workflow's bytes moved between nodes: the files tasks
    /// read from their parents' nodes, and the farm's inputs each node
    /// brought.
    #[serde(default)]
    pub moved_bytes: u64,
    /// The time tasks spent bringing their parents' files, holding their cores.
    #[serde(default)]
    pub stage_in_ms: u64,
    /// For the picture: busy fraction per row and time bucket.
    pub timeline: Timeline,
    /// For the picture: a sample of executions.
    pub sample: Vec<Execution>,
}

/// Messages handed to the network over a span of virtual time, with their
/// size as the real node encodes them (postcard), and how many of them were
/// membership (SWIM) packets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Traffic {
    pub messages: u64,
    pub bytes: u64,
    pub swim_messages: u64,
    pub swim_bytes: u64,
    pub span_ms: u64,
    /// The messages by kind: which of the peers' timers and exchanges
    /// the traffic comes from (beats and SWIM while nothing changes).
    #[serde(default)]
    pub by_kind: ByKind,
}

/// The farm's events (from its submission to its end) that were the
/// mesh's upkeep between changes: beats, SWIM packets and resends
/// delivered, and wakes for periodic timers only. A change is anything
/// else: a task starting or ending, a node coming or going, a message
/// that carries work (an assignment, a report, a sync), a suspicion.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Upkeep {
    /// The farm's events.
    pub of: u64,
    /// Of them, upkeep.
    pub events: u64,
    /// Upkeep by source (a message kind delivered, or the timer a wake
    /// was for; "superseded timer" for a wake whose timer had moved),
    /// most first.
    pub by_source: Vec<(String, u64)>,
    /// Stretches between two changes with upkeep in them: how many, their
    /// virtual time in all, and the longest.
    pub stretches: u64,
    pub stretch_ms: u64,
    pub longest_ms: u64,
    /// Upkeep in stretches of a second or more: what a skip could jump.
    pub in_long_stretches: u64,
    /// Over the whole run, timers with nothing to do (SWIM's gossip tick
    /// with nothing to tell and indirect probe of a member that answered,
    /// a worker's heartbeat between its reports, a coordinator's progress
    /// round with nothing to tell and heartbeat with nothing to send) that
    /// woke no one, each
    /// fired with whatever came to its node next (the timers skipped
    /// exactly so far; `--step` steps them too). Not the events saved:
    /// stepped, some fall on another timer's wake.
    #[serde(default)]
    pub skipped: u64,
    /// Workers' reports the simulator sent for them at their heartbeat,
    /// which had nothing else to do, rather than wake them for it; each
    /// heartbeat fired with its node's next event (`--step` wakes them).
    #[serde(default)]
    pub reports_sent: u64,
    /// Membership acks in closed form their probers took when they were
    /// sent, a few milliseconds before they would have arrived, rather
    /// than at a step of their own (a run where nothing can come between:
    /// no loss, no partition, no node that goes or waits; `--step` steps
    /// them).
    #[serde(default)]
    pub acks_when_sent: u64,
    /// Membership pings in closed form answered at their arrival without
    /// a step of their receiver (the same runs).
    #[serde(default)]
    pub pings_answered: u64,
    /// Workers' reports their coordinator answered at their arrival
    /// without a step of its own, where the report brought nothing new
    /// and the step would have done nothing else (runs with no stalled
    /// or slow node; `--step` steps them).
    #[serde(default)]
    pub reports_answered: u64,
    /// Workers' lists of the claims they hold taken by their coordinator
    /// at their arrival without a step, where each listed claim was the
    /// one it recorded (the same runs).
    #[serde(default)]
    pub claims_taken: u64,
    /// Coordinators' answers taken by their workers at their arrival
    /// without a step, where the answer told nothing new and the step
    /// would have done nothing else (the same runs).
    #[serde(default)]
    pub answers_taken: u64,
}

impl Upkeep {
    /// The speed line's second half: the wakes skipped, how much of what
    /// was stepped was upkeep, in stretches how long, and from which
    /// timers, none of which the simulator can skip exactly yet.
    fn describe(&self) -> String {
        if self.events == 0 {
            return String::new();
        }
        let skipped = if self.skipped > 0 {
            format!(
                "skipped: {} timers had nothing to do and woke no one (SWIM's gossip \
                 tick with nothing to tell and indirect probe of a member that answered, a \
                 worker's heartbeat between its reports and resend round with nothing to \
                 send, a coordinator's progress round with nothing to tell and heartbeat with \
                 nothing to send; each fired with its node's next event); ",
                self.skipped
            )
        } else {
            String::new()
        };
        // A count of what went without a wake or a step, where any did.
        let went = |n: u64, what: &str| {
            if n > 0 {
                format!("{n} {what}; ")
            } else {
                String::new()
            }
        };
        let reported = went(
            self.reports_sent,
            "workers' reports sent for them, their heartbeats having nothing else to do, \
             with no wake",
        );
        let acks = went(
            self.acks_when_sent,
            "membership acks taken by their probers when sent, with no step",
        );
        let pings = went(
            self.pings_answered,
            "membership pings answered at their arrival, with no step",
        );
        let answered = went(
            self.reports_answered,
            "workers' reports answered by their coordinator at their arrival, with no step",
        );
        let claims = went(
            self.claims_taken,
            "workers' lists of claims taken by their coordinator at their arrival, with no step",
        );
        let answers = went(
            self.answers_taken,
            "coordinators' answers taken by their workers at their arrival, with no step",
        );
        let share = |n: u64| 100.0 * n as f64 / self.events as f64;
        let sources: Vec<String> = self
            .by_source
            .iter()
            .take(5)
            .map(|(s, n)| format!("{s} {:.0}%", share(*n)))
            .collect();
        format!(
            "{skipped}{reported}{acks}{pings}{answered}{claims}{answers}stepped, not skipped: {:.1}% of the farm's events were the mesh's upkeep between \
             changes, in {} quiet stretches of {} on average (longest {}; {:.0}% of the upkeep \
             in stretches of a second or more): {}; none of these has an exact skip yet\n",
            100.0 * self.events as f64 / self.of.max(1) as f64,
            self.stretches,
            span(self.stretch_ms / self.stretches.max(1)),
            span(self.longest_ms),
            share(self.in_long_stretches),
            sources.join(", "),
        )
    }
}

/// How many kinds of message there are.
const KINDS: usize = mesh_protocol::mesh::Msg::KINDS.len();

/// Messages counted per kind ([`mesh_protocol::mesh::Msg::kind`]); a map
/// of kind to count (those counted) in JSON.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ByKind(pub [u64; KINDS]);

impl Default for ByKind {
    fn default() -> ByKind {
        ByKind([0; KINDS])
    }
}

impl ByKind {
    /// The kinds counted, most first (ties in the order of the kinds).
    pub fn most_first(&self) -> Vec<(&'static str, u64)> {
        let mut v: Vec<(&'static str, u64)> = mesh_protocol::mesh::Msg::KINDS
            .iter()
            .zip(self.0)
            .filter(|(_, n)| *n > 0)
            .map(|(k, n)| (*k, n))
            .collect();
        v.sort_by_key(|&(_, n)| std::cmp::Reverse(n));
        v
    }
}

impl Serialize for ByKind {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let counted = self.most_first();
        let mut m = s.serialize_map(Some(counted.len()))?;
        for (k, n) in counted {
            m.serialize_entry(k, &n)?;
        }
        m.end()
    }
}

impl<'de> Deserialize<'de> for ByKind {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<ByKind, D::Error> {
        let m = std::collections::BTreeMap::<String, u64>::deserialize(d)?;
        let mut k = ByKind::default();
        for (name, n) in m {
            // A kind this build does not know (a report of another version) is left out.
            if let Some(i) = mesh_protocol::mesh::Msg::KINDS
                .iter()
                .position(|&x| x == name)
            {
                k.0[i] = n;
            }
        }
        Ok(k)
    }
}

impl Traffic {
    pub fn count(&mut self, msg: &mesh_protocol::mesh::Msg) {
        let size = postcard::serialize_with_flavor(msg, postcard::ser_flavors::Size::default())
            .unwrap_or(0) as u64;
        use mesh_protocol::mesh::Msg;
        let swim = matches!(msg, Msg::Swim(_) | Msg::Roster { .. });
        self.add(msg.kind(), size, swim);
    }

    fn add(&mut self, kind: usize, size: u64, swim: bool) {
        self.messages += 1;
        self.bytes += size;
        self.by_kind.0[kind] += 1;
        if swim {
            self.swim_messages += 1;
            self.swim_bytes += size;
        }
    }

    /// A membership packet of `len` bytes in closed form, counted as
    /// `count` counts the `Msg::Swim` it stands for.
    pub fn count_swim(&mut self, len: usize) {
        use mesh_protocol::mesh::Msg;
        // The message's tag and kind, sized once: a quiet farm counts a
        // packet at every probe, and serializing the empty message for
        // them was 1% of its run.
        static TAG_KIND: LazyLock<(u64, usize)> = LazyLock::new(|| {
            let empty = Msg::Swim(Vec::new());
            let size =
                postcard::serialize_with_flavor(&empty, postcard::ser_flavors::Size::default())
                    .unwrap_or(1) as u64;
            (size - 1, empty.kind())
        });
        let (tag, kind) = *TAG_KIND;
        // The tag, the packet's length as a varint, the packet.
        let varint = (u64::from(usize::BITS - len.leading_zeros()).max(1)).div_ceil(7);
        self.add(kind, tag + varint + len as u64, true);
    }

    /// What was counted since `earlier` (span not set).
    pub fn minus(&self, earlier: &Traffic) -> Traffic {
        Traffic {
            messages: self.messages - earlier.messages,
            bytes: self.bytes - earlier.bytes,
            swim_messages: self.swim_messages - earlier.swim_messages,
            swim_bytes: self.swim_bytes - earlier.swim_bytes,
            span_ms: 0,
            by_kind: ByKind(std::array::from_fn(|i| {
                self.by_kind.0[i] - earlier.by_kind.0[i]
            })),
        }
    }

    /// `count` per node per virtual second of the span.
    pub fn per_node_per_s(&self, count: u64, nodes: usize) -> f64 {
        count as f64 / nodes.max(1) as f64 / (self.span_ms.max(1) as f64 / 1000.0)
    }

    fn describe(&self, nodes: usize) -> String {
        // The four kinds most sent: the steady traffic a long run steps
        // through one message at a time, and where it comes from.
        let most: Vec<String> = self
            .by_kind
            .most_first()
            .into_iter()
            .take(4)
            .map(|(k, n)| format!("{k} {:.1}", self.per_node_per_s(n, nodes)))
            .collect();
        format!(
            "{:.1} messages, {:.0} bytes; of them membership {:.1}, {:.0} bytes (over {} ms){}",
            self.per_node_per_s(self.messages, nodes),
            self.per_node_per_s(self.bytes, nodes),
            self.per_node_per_s(self.swim_messages, nodes),
            self.per_node_per_s(self.swim_bytes, nodes),
            self.span_ms,
            if most.is_empty() {
                String::new()
            } else {
                format!("; most sent: {}", most.join(", "))
            }
        )
    }
}

/// What the allocation queues did in a run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AllocReport {
    /// Submissions asked for, and those the batch system refused.
    pub submissions: u64,
    pub refused: u64,
    /// The most jobs one submission asked for (the scaler's burst).
    pub largest_submission: u32,
    /// Jobs accepted, started, and ended at their walltime (drained) or cancelled.
    pub jobs: u64,
    pub started: u64,
    pub drained: u64,
    pub cancelled: u64,
    /// The most jobs queued or running in the batch system at once.
    pub peak_jobs: u32,
    /// The most nodes batch jobs had up at once.
    pub peak_nodes: u32,
    /// Task runs a drain or a cancellation interrupted (handed back, run
    /// again elsewhere without a retry spent): what `expected` avoids.
    pub interrupted: u64,
    /// Nodes still up at their job's walltime, killed by the batch system.
    pub killed: u64,
    /// Node-time held by batch jobs' nodes, and the share of their
    /// cpu-time spent running tasks.
    pub node_ms: u64,
    pub busy_share: f64,
    /// Batch-started nodes up: (virtual ms, count) at each change.
    pub nodes_over_time: Vec<(u64, u32)>,
    /// The coordinator's allocation book at the end (`mesh alloc list`
    /// and `log`; its times are virtual ms).
    pub book: mesh_protocol::mesh::AllocBook,
}

/// The allocation queues' lines of the summary: what was asked of the
/// batch system, and the batch-started nodes over time (scale out and in).
/// Node indices, the first few of many.
fn spread_nodes(nodes: &[u32]) -> String {
    const SHOWN: usize = 8;
    let mut s: Vec<String> = nodes.iter().take(SHOWN).map(u32::to_string).collect();
    if nodes.len() > SHOWN {
        s.push(format!("... ({} nodes)", nodes.len()));
    }
    format!("[{}]", s.join(", "))
}

fn alloc_summary(a: &AllocReport) -> String {
    let mut s = format!(
        "allocation: {} submissions ({} refused, up to {} jobs each), {} jobs (at most {} at once): \
         {} started, {} drained at walltime, {} cancelled\n\
         batch nodes: peak {}, {:.1} node-hours held, {:.1}% of their cpu-time running tasks, \
         {} runs interrupted by a drain or cancel, {} killed at walltime\n",
        a.submissions,
        a.refused,
        a.largest_submission,
        a.jobs,
        a.peak_jobs,
        a.started,
        a.drained,
        a.cancelled,
        a.peak_nodes,
        a.node_ms as f64 / 3_600_000.0,
        a.busy_share * 100.0,
        a.interrupted,
        a.killed,
    );
    for q in &a.book.queues {
        if let Some(why) = &q.paused {
            s.push_str(&format!("queue {} paused: {why}\n", q.def.name));
        }
    }
    s.push_str(
        "(the lower bound and the greedy makespans above count every queue's max jobs as up \
         from the start: waiting for jobs and their walltimes are part of the ratios)\n",
    );
    if let Some(&(last, count)) = a.nodes_over_time.last() {
        let (width, mean) = mean_per_interval(&a.nodes_over_time, last, 20);
        let mean: Vec<String> = mean.iter().map(|m| format!("{m:.0}")).collect();
        s.push_str(&format!(
            "batch nodes over time (mean up in each {} from the start): {}; {count} from {}\n",
            duration(width),
            mean.join(" "),
            duration(last),
        ));
    }
    s
}

/// The mean number of nodes up in each of at most `k` equal intervals of
/// `[0, end)`, as wide as a clock reads easily (30 s, 2 min, 1 h), from
/// the count's changes `(ms, count)`: the scale out and in read left to
/// right, dips included.
fn mean_per_interval(changes: &[(u64, u32)], end: u64, k: u64) -> (u64, Vec<f64>) {
    const NICE_S: [u64; 17] = [
        1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200,
    ];
    let least = end.div_ceil(k.max(1));
    let width = NICE_S
        .iter()
        .map(|s| s * 1000)
        .find(|&w| w >= least)
        .unwrap_or_else(|| least.div_ceil(86_400_000) * 86_400_000);
    let mut node_ms = vec![0u64; end.div_ceil(width).max(1) as usize];
    // Each stretch between two changes, spread over the intervals it spans.
    for (i, &(from, count)) in changes.iter().enumerate() {
        let to = changes.get(i + 1).map_or(end, |c| c.0).min(end);
        let mut t = from;
        while t < to {
            let b = (t / width) as usize;
            let upto = to.min((b as u64 + 1) * width);
            node_ms[b] += u64::from(count) * (upto - t);
            t = upto;
        }
    }
    // The last interval is cut short at `end`.
    let mean = node_ms
        .iter()
        .enumerate()
        .map(|(b, &ms)| ms as f64 / width.min(end - b as u64 * width).max(1) as f64)
        .collect();
    (width, mean)
}

/// `4, cpu=4 each` or `12: 8 of cpu=4, 4 of cpu=8,gpu=1`.
pub(crate) fn shapes(nodes: usize, shapes: &[(usize, String)]) -> String {
    match shapes {
        [] => nodes.to_string(),
        [_] => format!("{nodes}, {} each", node_kinds(shapes)),
        _ => format!("{nodes}: {}", node_kinds(shapes)),
    }
}

/// What a node of the mix is: `cpu=4`, or `8 of cpu=4, 4 of cpu=8,gpu=1`.
pub fn node_kinds(shapes: &[(usize, String)]) -> String {
    match shapes {
        [(_, one)] => one.clone(),
        many => many
            .iter()
            .map(|(n, r)| format!("{n} of {r}"))
            .collect::<Vec<_>>()
            .join(", "),
    }
}

/// `45 s`, `2 min 30 s`, `1 h 30 min`: a time a user reads at a glance.
/// A span of virtual time as [`duration`] gives it, below a minute to the
/// millisecond or the tenth of a second.
fn span(ms: u64) -> String {
    match ms {
        0..1000 => format!("{ms} ms"),
        1000..60_000 => format!("{:.1} s", ms as f64 / 1000.0),
        _ => duration(ms),
    }
}

pub(crate) fn duration(ms: u64) -> String {
    let s = ms / 1000;
    match (s / 3600, s % 3600 / 60, s % 60) {
        (0, 0, s) => format!("{s} s"),
        (0, m, 0) => format!("{m} min"),
        (0, m, s) => format!("{m} min {s} s"),
        (h, 0, _) => format!("{h} h"),
        (h, m, _) => format!("{h} h {m} min"),
    }
}

/// Busy cpu per node over time, in buckets that widen as the run grows.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Timeline {
    pub bucket_ms: u64,
    /// Per node: busy cpu-ms in each bucket.
    pub busy: Vec<Vec<f64>>,
    /// Per node: its cpus (the full-row value is `cpus * bucket_ms`).
    pub cpus: Vec<f64>,
}

/// One execution of a task, for the task-stream picture.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Execution {
    pub node: u32,
    pub stage: u32,
    pub index: u32,
    pub start: u64,
    pub end: u64,
    /// False when it was killed or lost with its node.
    pub completed: bool,
}

pub(crate) const BUCKETS: usize = 200;

impl Timeline {
    pub(crate) fn new(cpus: Vec<f64>) -> Timeline {
        Timeline {
            bucket_ms: 5,
            busy: vec![Vec::new(); cpus.len()],
            cpus,
        }
    }

    /// Adds `weight` busy cpus on `node` during `[start, end)`.
    pub(crate) fn add(&mut self, node: usize, start: u64, end: u64, weight: f64) {
        if weight == 0.0 || end <= start {
            return;
        }
        while end > self.bucket_ms * BUCKETS as u64 {
            // Twice as wide: merge neighbours, so memory stays fixed however long the run.
            self.bucket_ms *= 2;
            for row in &mut self.busy {
                let merged: Vec<f64> = row.chunks(2).map(|c| c.iter().sum()).collect();
                *row = merged;
            }
        }
        let row = &mut self.busy[node];
        let w = self.bucket_ms;
        let (first, last) = ((start / w) as usize, ((end - 1) / w) as usize);
        if row.len() <= last {
            row.resize(last + 1, 0.0);
        }
        for (b, cell) in row.iter_mut().enumerate().take(last + 1).skip(first) {
            let lo = start.max(b as u64 * w);
            let hi = end.min((b as u64 + 1) * w);
            *cell += (hi - lo) as f64 * weight;
        }
    }
}

impl SimReport {
    /// The report without the wall-clock figures: equal for equal scenarios.
    pub fn deterministic(&self) -> SimReport {
        SimReport {
            events_per_sec: 0.0,
            wall_ms: 0.0,
            peak_rss_bytes: None,
            ..self.clone()
        }
    }

    /// The report less its speed line (the events stepped and the upkeep
    /// among them, besides the wall-clock figures): what skipping the
    /// timers that do nothing must not change (`SimConfig::step`).
    pub fn answer(&self) -> SimReport {
        SimReport {
            events: 0,
            upkeep: Upkeep::default(),
            ..self.deterministic()
        }
    }

    /// The headline numbers on one line each, as `mesh sim` prints them.
    pub fn summary(&self) -> String {
        format!(
            "seed {}\nnodes {}\nmakespan {} ms ({})\nlower bound {} ms\nratio {:.3}\n\
             greedy without latency {} ms (ratio {:.3}; mesh / greedy {:.3})\n\
             longest first, knowing durations {} ms (ratio {:.3})\nutilization {:.1}%\n\
             steals {} ({} tasks, {} asked)\nmessages {} ({} lost)\n\
             per node per s before the farm: {}\nper node per s during the farm: {}\n\
             duplicates {}\n\
             tasks {} done, {} failed, {} executions\n{}prefetch depth {}\n\
             events {} ({:.0}/s; {:.1} s, peak memory {})\n{}one mesh since {} ms; coordinated: {}\nlongest wait at a slow node {} ms\n",
            self.seed,
            shapes(self.nodes, &self.node_shapes),
            self.makespan,
            duration(self.makespan),
            self.lower_bound,
            self.ratio,
            self.greedy,
            self.greedy_ratio,
            self.makespan as f64 / self.greedy as f64,
            self.longest_first,
            self.longest_first_ratio,
            self.utilization * 100.0,
            self.steals,
            self.tasks_stolen,
            self.steals_asked,
            self.messages,
            self.messages_lost,
            self.traffic_idle.describe(self.nodes),
            self.traffic_farm.describe(self.nodes),
            self.duplicates,
            self.tasks_done,
            self.tasks_failed,
            self.executions,
            // Why a stage's tasks all failed: it fits no node (the JSON's
            // `unplaceable`); without it a typo in an ask reads as a farm
            // that failed for nothing.
            if self.unplaceable.is_empty() {
                String::new()
            } else {
                format!("unplaceable: {}\n", self.unplaceable.join("; "))
            },
            spread(&self.prefetch),
            self.events,
            self.events_per_sec,
            self.wall_ms / 1000.0,
            self.peak_rss_bytes
                .map_or_else(|| "unknown".to_string(), |b| format!("{} MB", b / 1_000_000)),
            self.upkeep.describe(),
            self.one_mesh_ms
                .map_or_else(|| "-".to_string(), |ms| ms.to_string()),
            spread_nodes(&self.coordinators),
            self.slow_wait_ms,
        ) + &self.alloc.as_ref().map_or_else(String::new, alloc_summary)
    }

    /// An SVG picture: utilization per node over time (a heat map; nodes are
    /// grouped into at most 100 rows) above a sample of the task stream.
    pub fn to_svg(&self) -> String {
        let tl = &self.timeline;
        let n = tl.busy.len().max(1);
        let per_row = n.div_ceil(100);
        let rows = n.div_ceil(per_row);
        let cols = tl.busy.iter().map(Vec::len).max().unwrap_or(0).max(1);
        let (left, top, width) = (80.0, 40.0, 800.0);
        let cell_w = width / cols as f64;
        let row_h = (300.0 / rows as f64).clamp(2.0, 20.0);
        let heat_h = row_h * rows as f64;
        let lanes = 60usize;
        let lane_h = 4.0;
        let stream_top = top + heat_h + 40.0;
        let height = stream_top + lanes as f64 * lane_h + 40.0;
        let span = (tl.bucket_ms * cols as u64).max(1) as f64;
        let mut s = String::new();
        let _ = write!(
            s,
            r##"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">
<rect width="100%" height="100%" fill="#fff"/>
<text x="{left}" y="16">{name}: seed {seed}, {nodes} nodes, {tasks} tasks, makespan {ms} ms (bound {lb} ms, ratio {ratio:.3}), utilization {u:.1}%</text>
<text x="4" y="{ty}">nodes</text>
"##,
            w = left + width + 20.0,
            h = height,
            name = xml(&self.name),
            seed = self.seed,
            nodes = self.nodes,
            tasks = self.tasks,
            ms = self.makespan,
            lb = self.lower_bound,
            ratio = self.ratio,
            u = self.utilization * 100.0,
            ty = top + 10.0,
        );
        for r in 0..rows {
            let nodes = r * per_row..((r + 1) * per_row).min(n);
            let cpus: f64 = nodes
                .clone()
                .map(|i| tl.cpus.get(i).copied().unwrap_or(0.0))
                .sum();
            for c in 0..cols {
                let busy: f64 = nodes
                    .clone()
                    .map(|i| {
                        tl.busy
                            .get(i)
                            .and_then(|row| row.get(c))
                            .copied()
                            .unwrap_or(0.0)
                    })
                    .sum();
                let u = if cpus > 0.0 {
                    (busy / (cpus * tl.bucket_ms as f64)).clamp(0.0, 1.0)
                } else {
                    0.0
                };
                if u > 0.0 {
                    let _ = writeln!(
                        s,
                        r##"<rect x="{:.2}" y="{:.2}" width="{:.2}" height="{:.2}" fill="#1f5fbf" fill-opacity="{:.3}"/>"##,
                        left + c as f64 * cell_w,
                        top + r as f64 * row_h,
                        cell_w + 0.05,
                        row_h,
                        u
                    );
                }
            }
        }
        let _ = writeln!(
            s,
            r##"<rect x="{left}" y="{top}" width="{width}" height="{heat_h:.2}" fill="none" stroke="#888"/>
<text x="{left}" y="{:.2}">0 ms</text><text x="{:.2}" y="{:.2}" text-anchor="end">{} ms</text>
<text x="4" y="{:.2}">tasks</text>"##,
            top + heat_h + 14.0,
            left + width,
            top + heat_h + 14.0,
            span as u64,
            stream_top + 10.0,
        );
        for (i, e) in self.sample.iter().enumerate() {
            let lane = i % lanes;
            let x0 = left + e.start as f64 / span * width;
            let x1 = left + e.end as f64 / span * width;
            let color = if !e.completed {
                "#c0392b"
            } else {
                ["#2e86c1", "#28b463", "#d68910", "#8e44ad"][e.stage as usize % 4]
            };
            let _ = writeln!(
                s,
                r##"<rect x="{x0:.2}" y="{:.2}" width="{:.2}" height="{:.2}" fill="{color}"><title>node {} task {}/{} {}..{} ms</title></rect>"##,
                stream_top + lane as f64 * lane_h,
                (x1 - x0).max(0.5),
                lane_h - 1.0,
                e.node,
                e.stage,
                e.index,
                e.start,
                e.end
            );
        }
        s.push_str("</svg>\n");
        s
    }
}

fn xml(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Smallest, median and largest of a list, for the summary.
fn spread(v: &[u32]) -> String {
    let mut v = v.to_vec();
    v.sort_unstable();
    match (v.first(), v.last()) {
        (Some(lo), Some(hi)) => format!("{lo} min, {} median, {hi} max", v[v.len() / 2]),
        _ => "none".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_packet_in_closed_form_counts_as_the_packet_it_stands_for() {
        for len in [0, 1, 60, 127, 128, 1400, 16_383, 16_384] {
            let (mut built, mut quiet) = (Traffic::default(), Traffic::default());
            built.count(&mesh_protocol::mesh::Msg::Swim(vec![7; len]));
            quiet.count_swim(len);
            assert_eq!(built, quiet, "{len} bytes");
        }
    }

    #[test]
    fn timeline_widens_and_keeps_the_total() {
        let mut t = Timeline::new(vec![2.0]);
        t.add(0, 0, 10, 1.0);
        t.add(0, 995, 5000, 2.0);
        let total: f64 = t.busy[0].iter().sum();
        assert_eq!(total, 10.0 + 4005.0 * 2.0);
        assert!(t.busy[0].len() <= BUCKETS);
    }

    #[test]
    fn the_batch_node_count_is_shown_as_a_mean_per_interval() {
        // 1 up from 0 s, 4 from 5 s, a dip to 2 during 21..24 s, none from 38 s.
        let changes = [(0, 1), (5_000, 4), (21_000, 2), (24_000, 4), (38_000, 0)];
        let (width, mean) = mean_per_interval(&changes, 38_000, 4);
        assert_eq!(width, 10_000);
        assert_eq!(mean, vec![2.5, 4.0, 3.4, 4.0]);
        let (width, mean) = mean_per_interval(&changes, 38_000, 38);
        assert_eq!((width, mean.len()), (1_000, 38));
        // Widths a clock reads: 38 s over at most 3 intervals is 15 s each.
        assert_eq!(mean_per_interval(&changes, 38_000, 3).0, 15_000);
        assert_eq!(mean_per_interval(&changes, 2_327_000, 20).0, 120_000);
        assert_eq!((mean[4], mean[5], mean[22], mean[37]), (1.0, 4.0, 2.0, 4.0));
        assert_eq!(duration(38_000), "38 s");
        assert_eq!(duration(150_000), "2 min 30 s");
        assert_eq!(duration(5_400_000), "1 h 30 min");
    }
}
