//! What a node measures of itself for the dashboard, `mesh status --latency` and `/metrics`: latency histograms, counters, recent task runs.
//!
//! Pure data: the times come in as arguments, like everywhere in this
//! crate. Histograms count microseconds, so the node's message round trips
//! (timed by the driver) and the peer's millisecond clock share one unit.

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use crate::farm::TaskRef;
use crate::mesh::FarmId;

/// The latencies every node keeps, in the order of [`Latency`].
pub const LATENCY_NAMES: [&str; 5] = [
    "queue_wait",
    "submit_to_start",
    "start_to_done",
    "message_rtt",
    "steal_rtt",
];

/// One kind of latency.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Latency {
    /// A task's wait in the queue of the node that ran it: handed there
    /// (or stolen) to started.
    QueueWait = 0,
    /// On the coordinator: from taking the farm to a task's start (the
    /// report's arrival less the run's duration; later stages include the
    /// wait for what they depend on). In `mesh run`: from the farm's start.
    SubmitToStart = 1,
    /// On the node that ran a task: from its start to the coordinator's
    /// acknowledgement that its result is recorded on enough holders. In
    /// `mesh run`: start to the record's flush.
    StartToDone = 2,
    /// A round trip to another node: its connection's ping, and the
    /// requests a node answers itself (files, logs, what it knows).
    MessageRtt = 3,
    /// A steal request and the victim's answer.
    StealRtt = 4,
}

/// The highest latency a histogram tells apart: a day, in microseconds.
const MAX_US: u64 = 86_400_000_000;

/// Latency histograms (microseconds, two significant digits: a few
/// kilobytes each, whatever the number of tasks).
#[derive(Clone, Debug)]
pub struct Latencies {
    hists: [Histogram<u64>; 5],
}

impl Default for Latencies {
    fn default() -> Self {
        let h = || Histogram::new_with_bounds(1, MAX_US, 2).expect("valid bounds");
        Latencies {
            hists: [h(), h(), h(), h(), h()],
        }
    }
}

/// A histogram's recorded values, to send to another node and merge there.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LatencyData {
    /// Per kind, in the order of [`Latency`]: (value in µs, count) for
    /// every value recorded.
    pub kinds: Vec<Vec<(u64, u64)>>,
}

/// One latency in short: what `mesh status --latency` prints.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LatencySummary {
    /// Which latency, as [`LATENCY_NAMES`] names it.
    pub name: String,
    /// How many were recorded.
    pub count: u64,
    /// The median, in ms (0 when none was recorded).
    pub p50_ms: f64,
    /// The 90th percentile, in ms (0 when none was recorded).
    pub p90_ms: f64,
    /// The 99th percentile, in ms (0 when none was recorded).
    pub p99_ms: f64,
    /// The longest, in ms (0 when none was recorded).
    pub max_ms: f64,
    /// The mean, in ms (0 when none was recorded).
    pub mean_ms: f64,
}

impl Latencies {
    /// Records one latency of `kind`, in microseconds (0 counts as 1).
    pub fn record(&mut self, kind: Latency, micros: u64) {
        self.hists[kind as usize].saturating_record(micros.max(1));
    }

    /// Records one latency of `kind`, in milliseconds.
    pub fn record_ms(&mut self, kind: Latency, ms: u64) {
        self.record(kind, ms.saturating_mul(1000));
    }

    /// The histogram of `kind`, in microseconds.
    pub fn get(&self, kind: Latency) -> &Histogram<u64> {
        &self.hists[kind as usize]
    }

    /// The values recorded, to send to another node (see [`Latencies::merge`]).
    pub fn export(&self) -> LatencyData {
        LatencyData {
            kinds: self
                .hists
                .iter()
                .map(|h| {
                    h.iter_recorded()
                        .map(|v| (v.value_iterated_to(), v.count_at_value()))
                        .collect()
                })
                .collect(),
        }
    }

    /// Adds another node's histograms to these.
    pub fn merge(&mut self, data: &LatencyData) {
        for (h, values) in self.hists.iter_mut().zip(&data.kinds) {
            for &(v, n) in values {
                let _ = h.record_n(v.clamp(1, MAX_US), n);
            }
        }
    }

    /// Each latency in short, in the order of [`Latency`].
    pub fn summaries(&self) -> Vec<LatencySummary> {
        let ms = |us: u64| us as f64 / 1000.0;
        self.hists
            .iter()
            .zip(LATENCY_NAMES)
            .map(|(h, name)| {
                let q = |p: f64| {
                    if h.is_empty() {
                        0.0
                    } else {
                        ms(h.value_at_quantile(p))
                    }
                };
                LatencySummary {
                    name: name.to_string(),
                    count: h.len(),
                    p50_ms: q(0.5),
                    p90_ms: q(0.9),
                    p99_ms: q(0.99),
                    max_ms: if h.is_empty() { 0.0 } else { ms(h.max()) },
                    mean_ms: if h.is_empty() { 0.0 } else { h.mean() / 1000.0 },
                }
            })
            .collect()
    }
}

/// Counters a node keeps from its start, for `/metrics` and the dashboard.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counters {
    /// Messages this node sent to other nodes.
    pub messages_sent: u64,
    /// Messages this node received from other nodes.
    pub messages_received: u64,
    /// Tasks this node took from others, and gave to thieves.
    pub tasks_stolen: u64,
    /// Tasks this node gave to thieves.
    pub tasks_given: u64,
    /// Times this node saw a new coordinator take over.
    pub failovers: u64,
    /// Runs of tasks this node started.
    pub tasks_run: u64,
    /// Runs on this node that ended failed.
    pub tasks_failed: u64,
    /// Bytes of files this node sent other nodes over the mesh, received
    /// from them (checked), and took in place where another node kept
    /// them on a shared file system.
    #[serde(default)]
    pub bytes_sent: u64,
    /// Bytes of files received from other nodes, checked.
    #[serde(default)]
    pub bytes_received: u64,
    /// Bytes of files taken in place, where another node kept them on a
    /// shared file system.
    #[serde(default)]
    pub bytes_in_place: u64,
}

/// A running task's figures at its executor's last look: a run of the
/// task stream, found by its farm, task and attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunningUse {
    /// The farm, task and attempt of the run.
    pub farm: FarmId,
    /// Which task of the farm.
    pub task: TaskRef,
    /// Which attempt of the task.
    pub attempt: u32,
    /// Resident memory of its process tree now, in bytes.
    pub rss: u64,
    /// The most its tree held at a look, in bytes.
    pub peak: u64,
    /// CPU time its tree has spent (user and system), in ms; none until
    /// the executor reads it (from half a second in, see `usage.rs`).
    pub cpu_ms: Option<u64>,
}

/// One run of a task on a node, for the task stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunRecord {
    /// Numbers runs on the node as they start.
    pub seq: u64,
    /// When the record last changed (its start, then its end), on a counter
    /// of the node's: a reader asks for what changed after the last it saw.
    pub changed: u64,
    /// Which farm the task is of.
    pub farm: FarmId,
    /// Which task of the farm.
    pub task: TaskRef,
    /// Which attempt of the task this run was.
    pub attempt: u32,
    /// Which of the node's slots it ran in (a row of the Gantt chart).
    pub slot: u32,
    /// Unix milliseconds on the node's clock.
    pub start: u64,
    /// When it ended, as `start`; none while it runs.
    pub end: Option<u64>,
    /// Whether it ended failed.
    pub failed: bool,
}

/// What a node tells whoever observes the mesh (`Request::Observe`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Observation {
    /// The node's unix clock when it answered: runs are shifted by its
    /// difference to the observer's, so a skewed clock does not misplace them.
    pub unix_ms: u64,
    /// The machine's one-minute load average and cores; memory in bytes
    /// (None where the system does not say).
    pub load: Option<f64>,
    /// The machine's cores, all of them.
    pub cpus: u32,
    /// Memory in use, in bytes.
    pub mem_used: Option<u64>,
    /// All the machine's memory, in bytes.
    pub mem_total: Option<u64>,
    /// Bytes of outputs this node keeps for other nodes' farms until
    /// their homes have them (`<state>/held`).
    pub held_bytes: u64,
    /// The node's counters since it started.
    pub counters: Counters,
    /// The node's latency histograms.
    pub latency: LatencyData,
    /// Runs that changed after the asked-for point, oldest first.
    pub runs: Vec<RunRecord>,
    /// What each task running on the node holds and has spent so far, as
    /// its executor last looked (sent whole each time: it changes at each
    /// look, and a node runs a bounded number at once).
    pub running: Vec<RunningUse>,
    /// The node's beat (its resources and load): only its coordinator
    /// hears it otherwise.
    pub beat: Option<Box<crate::mesh::Beat>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_survive_export_and_merge() {
        let mut a = Latencies::default();
        for ms in 1..=100 {
            a.record_ms(Latency::QueueWait, ms);
        }
        let mut b = Latencies::default();
        b.record(Latency::MessageRtt, 250);
        b.merge(&a.export());
        let s = b.summaries();
        assert_eq!(s[0].name, "queue_wait");
        assert_eq!(s[0].count, 100);
        assert!((s[0].p50_ms - 50.0).abs() < 1.0, "{:?}", s[0]);
        assert!((s[0].p99_ms - 99.0).abs() < 1.0, "{:?}", s[0]);
        assert!((s[0].max_ms - 100.0).abs() < 1.0, "{:?}", s[0]);
        assert_eq!(s[3].count, 1);
        assert!((s[3].p50_ms - 0.25).abs() < 0.01, "{:?}", s[3]);
        assert_eq!(s[4].count, 0);
        assert_eq!(s[4].p99_ms, 0.0);
    }
}
