//! Allocation queues against the simulated batch system: the real coordinator scales a farm out and in, replaces drained jobs, backs off, and keeps tasks off nodes whose walltime is near.

use mesh_protocol::alloc::JobState;
use mesh_sim::report::AllocReport;
use mesh_sim::scenario::parse_scenario;
use mesh_sim::{run, SimError, SimReport};

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

/// The share of all busy cpu-time that batch-started nodes (every row
/// after the scenario's `own` nodes) spent.
fn batch_share(r: &SimReport, own: usize) -> f64 {
    let busy = |rows: &[Vec<f64>]| rows.iter().flatten().sum::<f64>();
    let all = busy(&r.timeline.busy);
    busy(&r.timeline.busy[own..]) / all
}

#[test]
fn a_backlog_scales_out_within_max_and_idle_jobs_are_given_back() {
    let (r, a) = ok(&farm(500, "", "walltime_ms = 3600000\nmax = 6"));
    assert_eq!((r.tasks_done, r.tasks_failed), (500, 0));
    assert_eq!((r.duplicates, r.executions), (0, 500));
    assert_eq!(a.refused, 0);
    // Bursts of at most four, never more than `max` jobs queued or running.
    assert_eq!(a.largest_submission, 4, "{}", r.summary());
    assert!(
        a.submissions >= 2,
        "six jobs take two bursts: {}",
        r.summary()
    );
    assert_eq!((a.peak_jobs, a.peak_nodes), (6, 6), "{}", r.summary());
    // The bound counts the queue's six jobs as up from the start: the
    // wait for them shows in the ratio, which stays above 1.
    assert!(r.ratio > 1.0 && r.ratio < 2.0, "{}", r.summary());
    // Their nodes did most of the work: 24 of the mesh's 25 cores.
    assert!(batch_share(&r, 1) > 0.8, "{}", batch_share(&r, 1));
    assert!(a.busy_share > 0.5, "{}", r.summary());
    // Once the work is done every job is given back for idling, and the
    // coordinator's book knows each one ended.
    assert_eq!(
        (a.started, a.drained, a.cancelled),
        (a.jobs, 0, a.jobs),
        "{}",
        r.summary()
    );
    assert_eq!(
        a.nodes_over_time.last().map(|p| p.1),
        Some(0),
        "{}",
        r.summary()
    );
    assert!(a
        .book
        .jobs
        .iter()
        .all(|j| j.job.state == JobState::Ended && j.joined));
    assert!(a
        .book
        .log
        .iter()
        .any(|e| e.text.starts_with("cancelling: idle")));
}

#[test]
fn work_claimed_by_a_node_that_cannot_start_it_within_a_minute_brings_jobs() {
    // Five one-hour tasks on one node of two cores: it claims three (two
    // running, one queued as its prefetch). Counting only the two
    // unclaimed asked for one job of two cores, which took those two,
    // and the third waited an hour behind the first node's runs: the farm
    // took two hours.
    let (r, a) = ok(r#"
seed = 3
max_time_ms = 14400000
[[nodes]]
resources = "cpu=2"
[[stages]]
name = "long"
tasks = 5
durations = "3600000"
[[alloc]]
cores = 2
walltime_ms = 7200000
max = 4
idle_timeout_ms = 60000
start_delay = "uniform:5000..10000"
"#);
    assert_eq!((r.tasks_done, r.tasks_failed), (5, 0), "{}", r.summary());
    assert_eq!(r.duplicates, 0, "{}", r.summary());
    // Two jobs: the second one's node steals the task that waits, and
    // the farm ends in about an hour.
    assert_eq!(a.peak_jobs, 2, "{}", r.summary());
    assert!(r.makespan < 3_900_000, "{}", r.summary());
}

#[test]
fn walltimes_shorter_than_the_farm_drain_nodes_without_failing_a_task_and_jobs_are_replaced() {
    let (r, a) = ok(&farm(600, "retries = 0", "walltime_ms = 60000\nmax = 3"));
    // No retries: a task failed for a drain would fail for good.
    assert_eq!((r.tasks_done, r.tasks_failed), (600, 0));
    assert!(a.drained >= 4, "{}", r.summary());
    assert!(
        a.jobs > 3 && a.peak_jobs <= 3,
        "drained jobs were replaced: {}",
        r.summary()
    );
    assert_eq!(
        a.killed,
        0,
        "every node left before its walltime: {}",
        r.summary()
    );
    // Without `expected`, nodes start tasks until their drain, which
    // interrupts some: handed back and run again elsewhere, and nothing
    // else ran anything twice.
    assert!(a.interrupted > 0, "{}", r.summary());
    // A task that ends just before its node leaves has its output there;
    // the node stays until the home has fetched it, so the only runs
    // beyond one a task are the interrupted ones (and any duplicate).
    assert_eq!(
        r.executions,
        r.tasks_done + a.interrupted + r.duplicates,
        "{}",
        r.summary()
    );
}

#[test]
fn tasks_expected_to_outlast_a_nodes_walltime_are_not_started_there() {
    let (r, a) = ok(&farm(
        300,
        "retries = 0\nexpected_ms = 10000",
        "walltime_ms = 60000\nmax = 3",
    ));
    assert_eq!((r.tasks_done, r.tasks_failed), (300, 0));
    assert!(a.drained >= 2, "{}", r.summary());
    // Every task fits in what was left of its node's time: none was
    // interrupted by a drain, so each ran exactly once.
    assert_eq!(a.interrupted, 0, "{}", r.summary());
    assert_eq!(r.executions, 300, "{}", r.summary());
}

#[test]
fn refused_submissions_back_off_and_pause_the_queue() {
    let (r, a) = ok(&farm(100, "", "walltime_ms = 600000\nreject_rate = 1.0"));
    // The farm ends on the one node the mesh has.
    assert_eq!((r.tasks_done, r.tasks_failed), (100, 0));
    // 10 + 20 + 40 + 80 s of backoff after the first four refusals; the
    // fifth pauses the queue, though the farm runs for minutes more.
    assert!(r.makespan > 400_000, "{}", r.summary());
    assert_eq!(
        (a.submissions, a.refused, a.jobs),
        (5, 5, 0),
        "{}",
        r.summary()
    );
    let q = a.book.queue("sim").expect("the queue is in the book");
    assert!(
        q.paused
            .as_ref()
            .is_some_and(|w| w.contains("5 submissions")),
        "{q:?}"
    );
    let failed = a
        .book
        .log
        .iter()
        .filter(|e| e.text.starts_with("submission failed"));
    assert_eq!(failed.count(), 5, "{:?}", a.book.log);
    assert!(r
        .summary()
        .contains("queue sim paused: 5 submissions in a row failed"));
}

#[test]
fn gpu_work_brings_gpu_jobs_of_several_nodes() {
    let (r, a) = ok(r#"
seed = 8
max_time_ms = 3600000
[[nodes]]
resources = "cpu=2"
[[stages]]
name = "train"
tasks = 60
durations = "uniform:20000..40000"
resources = "cpu=1,gpu=1,mem=8G"
[[alloc]]
name = "gpu"
cores = 4
gpus = 2
mem = "32G"
nodes_per_job = 2
walltime_ms = 3600000
max = 2
idle_timeout_ms = 30000
start_delay = "uniform:5000..10000"
"#);
    // No node of the mesh has a GPU: the queue's shape keeps the stage
    // waiting for its jobs instead of failing it as unplaceable.
    assert_eq!((r.tasks_done, r.tasks_failed), (60, 0), "{}", r.summary());
    assert!(r.unplaceable.is_empty(), "{:?}", r.unplaceable);
    assert_eq!((a.peak_jobs, a.peak_nodes), (2, 4), "{}", r.summary());
    assert_eq!(batch_share(&r, 1), 1.0);
}

#[test]
fn a_run_with_queues_replays_exactly() {
    let toml = farm(200, "", "walltime_ms = 60000\nmax = 3\nreject_rate = 0.3");
    let (r1, _) = ok(&toml);
    let (r2, _) = ok(&toml);
    assert_eq!(r1.deterministic(), r2.deterministic());
}

#[test]
fn bad_queues_are_refused_with_the_field_named() {
    const BASE: &str = "seed = 1\n[[nodes]]\nresources = \"cpu=1\"\n[[stages]]\nname = \"s\"\ntasks = 1\ndurations = \"1\"\n[[alloc]]\n";
    for (extra, want) in [
        (
            "cores = 0\nwalltime_ms = 60000",
            "alloc[0] (sim).cores must be at least 1",
        ),
        (
            "cores = 1\nwalltime_ms = 60000\nmin = 3\nmax = 2",
            "min 3 is more than max 2",
        ),
        (
            "cores = 1\nwalltime_ms = 60000\ndrain_margin_ms = 60000",
            "walltime_ms must be longer than the drain margin",
        ),
        (
            "cores = 1\nwalltime_ms = 60500",
            "walltime_ms must be whole seconds",
        ),
        (
            "cores = 1\nwalltime_ms = 60000\nmem = \"lots\"",
            "alloc[0] (sim).mem \"lots\"",
        ),
        (
            "cores = 1\nwalltime_ms = 60000\nstart_delay = \"soon\"",
            "alloc[0] (sim).start_delay",
        ),
        (
            "cores = 1\nwalltime_ms = 60000\nreject_rate = 2.0",
            "reject_rate must be from 0 to 1",
        ),
    ] {
        let err = parse_scenario(&format!("{BASE}{extra}\n"))
            .err()
            .unwrap_or_else(|| panic!("{extra:?} was accepted"));
        assert!(
            matches!(&err, SimError::Config(m) if m.to_string().contains(want)),
            "{extra:?}: {err}"
        );
    }
    let toml = format!("{BASE}cores = 1\nwalltime_ms = 60000\nwalltime = \"1h\"\n");
    let err = parse_scenario(&toml).expect_err("unknown field");
    assert!(
        err.to_string().contains("unknown field `walltime`"),
        "{err}"
    );
}

// Two gaps of the first scaler, shown on the simulator before they were
// closed: jobs asked for work their walltime could not take, and queued
// jobs kept after the work was gone.

#[test]
fn no_job_is_submitted_for_work_longer_than_the_queues_walltime() {
    let (r, a) = ok(r#"
seed = 7
max_time_ms = 3600000
[[nodes]]
resources = "cpu=2"
[[stages]]
name = "long"
tasks = 8
durations = "uniform:100000..150000"
expected_ms = 200000
[[alloc]]
cores = 4
walltime_ms = 180000
max = 3
idle_timeout_ms = 60000
start_delay = "uniform:5000..10000"
"#);
    assert_eq!((r.tasks_done, r.tasks_failed), (8, 0));
    // Each node of the queue drains 162 s after it starts: none may take
    // a task expected to run 200 s, so none should be asked for.
    assert_eq!(a.jobs, 0, "{}", r.summary());
}

#[test]
fn queued_jobs_are_cancelled_once_the_work_is_gone() {
    let (r, a) = ok(r#"
seed = 7
max_time_ms = 3600000
[[nodes]]
resources = "cpu=4"
[[stages]]
name = "work"
tasks = 40
durations = "uniform:5000..10000"
[[alloc]]
cores = 4
walltime_ms = 3600000
max = 8
idle_timeout_ms = 60000
start_delay = "uniform:300000..400000"
"#);
    assert_eq!((r.tasks_done, r.tasks_failed), (40, 0));
    // The farm ends in about a minute, minutes before any job leaves the
    // batch queue: a pending job costs nothing to cancel, a started one
    // its idle timeout on every node.
    assert_eq!((a.cancelled, a.started), (a.jobs, 0), "{}", r.summary());
}

/// Two nodes of one core, 60 tasks of 5 to 10 s, a queue of at most one
/// 4-core job; `crash` is a `[[crashes]]` table or nothing.
fn failover_farm(crash: &str) -> String {
    format!(
        r#"
seed = 3
max_time_ms = 7200000
submit_node = 1
[[nodes]]
resources = "cpu=1"
[[nodes]]
resources = "cpu=1"
[[stages]]
name = "work"
tasks = 60
durations = "uniform:5000..10000"
[[alloc]]
cores = 4
max = 1
walltime_ms = 3600000
start_delay = "uniform:5000..10000"
idle_timeout_ms = 30000
{crash}
"#
    )
}

#[test]
fn a_job_submitted_just_before_a_coordinator_failover_is_adopted_and_given_back_when_idle() {
    // Without a fault the coordinator (node 0) asks for the one job (after
    // its grace, and the list of the jobs already there) and has the batch
    // system's answer a round trip later.
    let (_, a) = ok(&failover_farm(""));
    let at = |a: &AllocReport, what: &str| {
        a.book
            .log
            .iter()
            .find(|e| e.text.starts_with(what))
            .map(|e| e.unix_ms)
            .expect("logged")
    };
    let (asked, answered) = (at(&a, "submitting"), at(&a, "submitted"));
    assert!(answered > asked + 1, "{asked} {answered}");
    // It dies while `sbatch` runs: the job exists, and no book has it.
    let crash = format!("[[crashes]]\nnode = 0\nat_ms = {}", asked + 1);
    let (r, a) = ok(&failover_farm(&crash));
    assert_eq!((r.tasks_done, r.tasks_failed), (60, 0), "{}", r.summary());
    let job = a
        .book
        .jobs
        .first()
        .unwrap_or_else(|| panic!("the new coordinator's book has no job: {:?}", a.book.log));
    assert!(
        a.book
            .log
            .iter()
            .any(|e| e.job.as_ref() == Some(&job.job.id) && e.text.starts_with("adopted")),
        "{:?}",
        a.book.log
    );
    // Booked, it is the queue's one job (none submitted besides it), and
    // it is given back when idle rather than held to its walltime.
    assert_eq!(a.jobs, 1, "{}", r.summary());
    assert_eq!(a.peak_jobs, 1, "{}", r.summary());
    assert_eq!(
        (a.cancelled, a.drained, a.killed),
        (1, 0, 0),
        "{}",
        r.summary()
    );
    assert_eq!(job.job.state, JobState::Ended);
}
