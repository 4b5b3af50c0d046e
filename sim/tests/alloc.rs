//! Allocation queues against the simulated batch system: the real coordinator scales a farm out and in, replaces drained jobs, backs off, and keeps tasks off nodes whose walltime is near.

use mesh_sim::cluster::AllocReport;
use mesh_sim::scenario::parse_scenario;
use mesh_sim::{run, SimReport};

fn ok(toml: &str) -> (SimReport, AllocReport) {
    let cfg = parse_scenario(toml).unwrap_or_else(|e| panic!("{e}"));
    let r = run(&cfg).unwrap_or_else(|e| panic!("{e}"));
    let a = r.alloc.clone().expect("the scenario has queues");
    (r, a)
}

/// One small node, `tasks` tasks of 5 to 10 s, and a queue of 4-core jobs.
fn farm(tasks: u32, stage_extra: &str, queue_extra: &str) -> String {
    format!(
        r#"
seed = 5
max_time_ms = 3600000
[[nodes]]
resources = "cpu=1"
[[stages]]
name = "work"
tasks = {tasks}
durations = "uniform:5000..10000"
{stage_extra}
[[alloc]]
cores = 4
start_delay = "uniform:5000..10000"
idle_timeout_ms = 30000
{queue_extra}
"#
    )
}

#[test]
fn a_backlog_scales_out_within_max_and_idle_jobs_are_given_back() {
    let (r, a) = ok(&farm(400, "", "walltime_ms = 3600000\nmax = 4"));
    assert_eq!((r.tasks_done, r.tasks_failed), (400, 0));
    assert_eq!(r.duplicates, 0);
    assert_eq!(a.refused, 0);
    // Never more than `max` jobs, in bursts of at most four.
    assert_eq!(a.peak_nodes, 4, "{a:?}");
    assert!(a.jobs >= 4 && a.jobs <= 8, "{a:?}");
    assert!(a.submissions >= 1 && a.submissions <= a.jobs, "{a:?}");
    // Their nodes did most of the work: 16 of the mesh's 17 cores.
    assert!(a.busy_share > 0.5, "{a:?}");
    // Once the work is done every job is given back: none left running.
    assert_eq!(a.started, a.drained + a.cancelled, "{a:?}");
    assert!(a.cancelled >= 4, "{a:?}");
    assert_eq!(a.nodes_over_time.last().map(|p| p.1), Some(0), "{a:?}");
}

#[test]
fn walltimes_shorter_than_the_farm_drain_nodes_without_failing_a_task_and_jobs_are_replaced() {
    let (r, a) = ok(&farm(600, "retries = 0", "walltime_ms = 60000\nmax = 3"));
    // No retries: a task failed for a drain would fail for good.
    assert_eq!((r.tasks_done, r.tasks_failed), (600, 0));
    assert!(a.drained >= 4, "{a:?}");
    assert!(a.jobs > 3, "drained jobs were replaced: {a:?}");
    // Without `expected`, nodes start tasks until their drain, which
    // interrupts some (handed back, run again elsewhere).
    assert!(r.executions > r.tasks_done, "{r:?}");
}

#[test]
fn tasks_expected_to_outlast_a_nodes_walltime_are_not_started_there() {
    let (r, a) = ok(&farm(
        300,
        "retries = 0\nexpected_ms = 10000",
        "walltime_ms = 60000\nmax = 3",
    ));
    assert_eq!((r.tasks_done, r.tasks_failed), (300, 0));
    assert!(a.drained >= 2, "{a:?}");
    // Every task fits in what was left of its node's time: none was
    // interrupted by a drain, so each ran exactly once.
    assert_eq!(r.executions, 300, "{r:?}");
}

#[test]
fn refused_submissions_back_off_and_pause_the_queue() {
    let (r, a) = ok(&farm(100, "", "walltime_ms = 600000\nreject_rate = 1.0"));
    // The farm ends on the one node the mesh has.
    assert_eq!((r.tasks_done, r.tasks_failed), (100, 0));
    // 10 + 20 + 40 + 80 s of backoff after the first four refusals; the
    // fifth pauses the queue, though the farm runs for minutes more.
    assert!(r.makespan > 400_000, "{r:?}");
    assert_eq!((a.submissions, a.refused, a.jobs), (5, 5, 0), "{a:?}");
}

#[test]
fn a_run_with_queues_replays_exactly() {
    let toml = farm(200, "", "walltime_ms = 60000\nmax = 3\nreject_rate = 0.3");
    let (r1, _) = ok(&toml);
    let (r2, _) = ok(&toml);
    assert_eq!(r1.deterministic(), r2.deterministic());
}
