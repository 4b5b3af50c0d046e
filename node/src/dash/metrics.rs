//! `GET /metrics`: the dashboard's last update in the Prometheus (OpenMetrics) text format.

use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use crate::used::{PEAK_BUCKETS, RUNTIME_BUCKETS_S};
use crate::view::{FarmView, MeshStatus, Observed};
use mesh_protocol::observe::Latency;
use mesh_protocol::observe::{Latencies, LATENCY_NAMES};

/// Upper bounds of the latency buckets, in seconds.
const BUCKETS_S: [f64; 16] = [
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

const KINDS: [Latency; 5] = [
    Latency::QueueWait,
    Latency::SubmitToStart,
    Latency::StartToDone,
    Latency::MessageRtt,
    Latency::StealRtt,
];

type Labels = Vec<(&'static str, String)>;

/// One scrape's worth: the status, what every node said, the farms.
#[derive(Debug)]
struct Snapshot {
    observed: Option<Observed>,
    farms: Vec<FarmView>,
}

pub fn render(observed: Option<&Observed>, farms: &[FarmView]) -> Result<String, std::fmt::Error> {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Snapshot {
        observed: observed.cloned(),
        farms: farms.to_vec(),
    }));
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &registry)?;
    Ok(out)
}

fn gauges(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    values: &[(Labels, f64)],
) -> Result<(), std::fmt::Error> {
    if values.is_empty() {
        return Ok(());
    }
    let mut m = enc.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, v) in values {
        ConstGauge::new(*v).encode(m.encode_family(labels)?)?;
    }
    Ok(())
}

fn counters(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    values: &[(Labels, u64)],
) -> Result<(), std::fmt::Error> {
    if values.is_empty() {
        return Ok(());
    }
    let mut m = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (labels, v) in values {
        ConstCounter::new(*v).encode(m.encode_family(labels)?)?;
    }
    Ok(())
}

impl prometheus_client::collector::Collector for Snapshot {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        encode_tasks(&mut enc, &self.farms)?;
        encode_used(&mut enc, &self.farms)?;
        let Some(o) = &self.observed else {
            return Ok(());
        };
        encode_nodes(&mut enc, &o.status)?;
        encode_counters(&mut enc, o)?;
        encode_latencies(&mut enc, o)
    }
}

/// A node's labels: its id.
fn node_labels(id: &str) -> Labels {
    vec![("node", id.to_string())]
}

/// Tasks by farm, stage and state.
fn encode_tasks(enc: &mut DescriptorEncoder, farms: &[FarmView]) -> Result<(), std::fmt::Error> {
    let mut tasks = Vec::new();
    for f in farms {
        for (stage, c) in &f.stages {
            let states = [
                ("done", c.done),
                ("running", c.running),
                ("queued", c.queued()),
                ("failed", c.failed),
                ("skipped", c.skipped),
                ("cancelled", c.cancelled),
            ];
            for (state, n) in states {
                let labels = vec![
                    ("farm", f.id.clone()),
                    ("stage", stage.clone()),
                    ("state", state.to_string()),
                ];
                tasks.push((labels, n as f64));
            }
        }
    }
    gauges(enc, "mesh_tasks", "Tasks by farm, stage and state", &tasks)
}

/// One histogram per labels: its sum, count and each bucket's own count.
type Histogram = (Labels, f64, u64, Vec<(f64, u64)>);

fn histograms(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    values: &[Histogram],
) -> Result<(), std::fmt::Error> {
    if values.is_empty() {
        return Ok(());
    }
    let mut m = enc.encode_descriptor(name, help, None, MetricType::Histogram)?;
    for (labels, sum, count, buckets) in values {
        m.encode_family(labels)?
            .encode_histogram::<Labels>(*sum, *count, buckets, None)?;
    }
    Ok(())
}

/// What finished tasks used, per farm and stage (see `used.rs`): runtime
/// and peak memory as histograms.
fn encode_used(enc: &mut DescriptorEncoder, farms: &[FarmView]) -> Result<(), std::fmt::Error> {
    let stages = || {
        farms
            .iter()
            .flat_map(|f| f.used.iter().map(move |u| (f, u)))
    };
    let labels = |f: &FarmView, u: &crate::used::StageUse| -> Labels {
        vec![("farm", f.id.clone()), ("stage", u.stage.clone())]
    };
    let runtimes: Vec<Histogram> = stages()
        .map(|(f, u)| {
            let bounds = RUNTIME_BUCKETS_S.iter().copied().chain([f64::INFINITY]);
            let buckets = bounds.zip(u.runtime_buckets.iter().copied()).collect();
            (
                labels(f, u),
                u.runtime_sum_ms as f64 / 1000.0,
                u.runs,
                buckets,
            )
        })
        .collect();
    histograms(
        enc,
        "mesh_task_runtime_seconds",
        "How long each finished task's run that counts took, per farm and stage",
        &runtimes,
    )?;
    let peaks: Vec<Histogram> = stages()
        .map(|(f, u)| {
            let bounds = PEAK_BUCKETS
                .iter()
                .map(|&b| b as f64)
                .chain([f64::INFINITY]);
            let buckets = bounds.zip(u.peak_buckets.iter().copied()).collect();
            (labels(f, u), u.peak_sum as f64, u.runs, buckets)
        })
        .collect();
    histograms(
        enc,
        "mesh_task_peak_memory_bytes",
        "The peak resident memory of each finished task's run that counts, per farm and stage",
        &peaks,
    )
}

/// The coordinator's term, and what each node runs, holds and has.
fn encode_nodes(enc: &mut DescriptorEncoder, s: &MeshStatus) -> Result<(), std::fmt::Error> {
    gauges(
        enc,
        "mesh_term",
        "The coordinator's term",
        &[(Vec::new(), s.term as f64)],
    )?;
    let mut queued = Vec::new();
    let mut running = Vec::new();
    let mut prefetch = Vec::new();
    let mut coordinator = Vec::new();
    let mut used = Vec::new();
    let mut total = Vec::new();
    let mut load = Vec::new();
    let mut mem_used = Vec::new();
    let mut mem_total = Vec::new();
    for n in &s.nodes {
        queued.push((node_labels(&n.id), n.queued as f64));
        running.push((node_labels(&n.id), n.running as f64));
        prefetch.push((node_labels(&n.id), n.prefetch as f64));
        coordinator.push((node_labels(&n.id), n.coordinator as u8 as f64));
        for r in &n.usage {
            let labels = vec![("node", n.id.clone()), ("resource", r.kind.clone())];
            used.push((labels.clone(), r.used));
            total.push((labels, r.total));
        }
        if let Some(l) = n.load {
            load.push((node_labels(&n.id), l));
        }
        if let Some(m) = n.mem_used {
            mem_used.push((node_labels(&n.id), m as f64));
        }
        if let Some(m) = n.mem_total {
            mem_total.push((node_labels(&n.id), m as f64));
        }
    }
    gauges(
        enc,
        "mesh_node_queued",
        "Tasks queued on a node, not started",
        &queued,
    )?;
    gauges(
        enc,
        "mesh_node_running",
        "Tasks running on a node",
        &running,
    )?;
    gauges(
        enc,
        "mesh_node_prefetch",
        "A node's prefetch depth",
        &prefetch,
    )?;
    gauges(
        enc,
        "mesh_node_coordinator",
        "1 on the coordinator",
        &coordinator,
    )?;
    gauges(
        enc,
        "mesh_node_resource_used",
        "Resources held by running tasks",
        &used,
    )?;
    gauges(
        enc,
        "mesh_node_resource_total",
        "Resources a node offers",
        &total,
    )?;
    gauges(
        enc,
        "mesh_node_load1",
        "The machine's 1-minute load average",
        &load,
    )?;
    gauges(
        enc,
        "mesh_node_memory_used_bytes",
        "The machine's memory in use",
        &mem_used,
    )?;
    gauges(
        enc,
        "mesh_node_memory_total_bytes",
        "The machine's memory",
        &mem_total,
    )
}

/// What each node that answered has counted since it started.
fn encode_counters(enc: &mut DescriptorEncoder, o: &Observed) -> Result<(), std::fmt::Error> {
    let each = |f: fn(&mesh_protocol::observe::Counters) -> u64| -> Vec<(Labels, u64)> {
        o.nodes
            .iter()
            .map(|(id, ob)| (node_labels(id), f(&ob.counters)))
            .collect()
    };
    counters(
        enc,
        "mesh_tasks_started",
        "Task runs started on a node",
        &each(|c| c.tasks_run),
    )?;
    counters(
        enc,
        "mesh_tasks_failed",
        "Task runs that failed on a node",
        &each(|c| c.tasks_failed),
    )?;
    counters(
        enc,
        "mesh_steals",
        "Tasks a node stole from others",
        &each(|c| c.tasks_stolen),
    )?;
    counters(
        enc,
        "mesh_stolen_from",
        "Tasks thieves took from a node",
        &each(|c| c.tasks_given),
    )?;
    counters(
        enc,
        "mesh_messages_sent",
        "Requests a node sent to others",
        &each(|c| c.messages_sent),
    )?;
    counters(
        enc,
        "mesh_messages_received",
        "Requests a node answered",
        &each(|c| c.messages_received),
    )?;
    counters(
        enc,
        "mesh_failovers",
        "New coordinators a node followed",
        &each(|c| c.failovers),
    )
}

/// The latencies of every node that answered, merged, as histograms.
fn encode_latencies(enc: &mut DescriptorEncoder, o: &Observed) -> Result<(), std::fmt::Error> {
    let mut all = Latencies::default();
    for (_, ob) in &o.nodes {
        all.merge(&ob.latency);
    }
    let mut m = enc.encode_descriptor(
        "mesh_latency_seconds",
        "Latencies over every node that answered (kind: queue_wait, submit_to_start, start_to_done, message_rtt, steal_rtt)",
        None,
        MetricType::Histogram,
    )?;
    for (kind, name) in KINDS.into_iter().zip(LATENCY_NAMES) {
        let h = all.get(kind);
        // Each bucket's own count: the encoder adds them up.
        let mut below = 0;
        let mut buckets: Vec<(f64, u64)> = BUCKETS_S
            .iter()
            .map(|&le| {
                let upto = h.count_between(0, (le * 1e6) as u64);
                let n = upto.saturating_sub(below);
                below = upto.max(below);
                (le, n)
            })
            .collect();
        buckets.push((f64::INFINITY, h.len().saturating_sub(below)));
        // The histogram keeps the counts; the sum is its mean times them.
        let sum = h.mean() * h.len() as f64 / 1e6;
        let labels: Labels = vec![("kind", name.to_string())];
        m.encode_family(&labels)?
            .encode_histogram::<Labels>(sum, h.len(), &buckets, None)?;
    }
    Ok(())
}
