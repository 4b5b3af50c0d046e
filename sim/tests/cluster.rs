//! Many real peers on the virtual clock: fault-free runs, faults, resources, stealing, determinism.

use mesh_sim::scenario::{CrashSpec, LeaveSpec, NodeGroup, PartitionSpec, StageSpec};
use mesh_sim::{load_scenario, run, SimConfig, SimError};

fn ok(cfg: &SimConfig) -> mesh_sim::SimReport {
    match run(cfg) {
        Ok(r) => r,
        Err(e) => panic!("{e}"),
    }
}

fn scenario(name: &str) -> SimConfig {
    load_scenario(format!(
        "{}/scenarios/{name}.toml",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap()
}

#[test]
fn three_nodes_finish_a_thousand_tasks_without_duplicates() {
    let r = ok(&scenario("basic"));
    assert_eq!((r.tasks_done, r.tasks_failed), (1000, 0));
    assert_eq!(r.duplicates, 0);
    assert_eq!(r.executions, 1000);
    assert!(r.ratio >= 1.0 && r.ratio < 1.5, "ratio {}", r.ratio);
    assert!(r.utilization > 0.6, "utilization {}", r.utilization);
    assert!(r.to_svg().starts_with("<svg"));
}

#[test]
fn a_worker_crash_mid_farm_reruns_its_tasks_and_the_farm_finishes() {
    let mut cfg = SimConfig::simple(11, 4, "cpu=2", 600, "uniform:10..30");
    cfg.crashes = vec![CrashSpec {
        node: 2,
        at_ms: 700,
        restart_after_ms: Some(3000),
    }];
    let r = ok(&cfg);
    assert_eq!(r.tasks_done, 600);
    assert!(
        r.executions > 600,
        "the dead node's running tasks ran again: {} executions",
        r.executions
    );
}

/// Beats (reports and their answers) a second while the farm ran.
fn beats_per_s(r: &mesh_sim::SimReport) -> f64 {
    let farm = &r.traffic_farm;
    farm.by_kind.0[0] as f64 / (farm.span_ms as f64 / 1000.0)
}

/// When the last task to start on a node other than `dead` started: the
/// dead node's task, run again.
fn started_again(r: &mesh_sim::SimReport, dead: u32) -> u64 {
    r.sample
        .iter()
        .filter(|e| e.completed && e.node != dead)
        .map(|e| e.start)
        .max()
        .expect("a task ran again")
}

#[test]
fn a_small_mesh_reports_twice_a_second_and_a_dead_worker_is_still_found_within_dead_after() {
    // Five nodes, four running a task of a minute: the workers report to
    // the coordinator (node 0) every `report_ms`, 500 ms, but node 1,
    // next in line should the coordinator die, every heartbeat (250 ms);
    // the coordinator answers each. 4 + 2 + 2 + 2 reports a second,
    // answered: 20 beats a second, where every worker reporting every
    // heartbeat sent 32.
    let mut cfg = SimConfig::simple(21, 5, "cpu=1", 4, "60000");
    cfg.submit_at_ms = 5_000;
    let r = ok(&cfg);
    assert_eq!((r.tasks_done, r.executions), (4, 4));
    let beats_per_s = beats_per_s(&r);
    assert!(
        (18.0..23.0).contains(&beats_per_s),
        "{beats_per_s:.1} beats a second: {}",
        r.summary()
    );
    // Node 3 dies 20 s into its task: three reports of 500 ms fit in the
    // 2 s after which its coordinator calls it dead and runs its task on
    // the idle node.
    let dead_after = cfg.peer_config().dead_after_ms;
    cfg.crashes = vec![CrashSpec {
        node: 3,
        at_ms: 25_000,
        restart_after_ms: None,
    }];
    let r = ok(&cfg);
    assert_eq!((r.tasks_done, r.executions), (4, 5));
    let again = started_again(&r, 3);
    assert!(
        (25_000..25_000 + dead_after + 1_000).contains(&again),
        "the dead node's task started again at {again} ms: {}",
        r.summary()
    );
}

#[test]
fn past_ten_nodes_workers_report_once_a_second_and_a_dead_worker_is_found_within_three_reports() {
    // Twenty nodes, nineteen running a task of a minute. Past ten nodes a
    // worker reports every two `report_ms`, once a second (Dask's
    // scheduler asks as much of 11 to 49 workers), the node next in line
    // still every heartbeat: 18 + 4 reports a second, answered, 44 beats
    // (twice a second, it was 80).
    let mut cfg = SimConfig::simple(21, 20, "cpu=1", 19, "60000");
    cfg.submit_at_ms = 5_000;
    let r = ok(&cfg);
    assert_eq!((r.tasks_done, r.executions), (19, 19));
    let beats_per_s = beats_per_s(&r);
    assert!(
        (40.0..48.0).contains(&beats_per_s),
        "{beats_per_s:.1} beats a second: {}",
        r.summary()
    );
    // Node 3 dies 20 s into its task: its coordinator waits three of its
    // reports (3 s, more than `dead_after_ms`), then runs its task on
    // the idle node; not before two reports' silence (a live worker's
    // late report is no death).
    let report_ms = 2 * cfg.peer_config().report_ms;
    cfg.crashes = vec![CrashSpec {
        node: 3,
        at_ms: 25_000,
        restart_after_ms: None,
    }];
    let r = ok(&cfg);
    assert_eq!((r.tasks_done, r.executions), (19, 20));
    let again = started_again(&r, 3);
    assert!(
        (25_000 + 2 * report_ms..25_000 + 3 * report_ms + 1_000).contains(&again),
        "the dead node's task started again at {again} ms: {}",
        r.summary()
    );
}

/// Duplicate runs per seed (1 to 5) of 400 tasks on 4 nodes whose
/// coordinator, node 0, dies at 0.5 s and comes back after `restart_after_ms`.
fn coordinator_crash_duplicates(restart_after_ms: Option<u64>) -> Vec<u64> {
    (1..=5)
        .map(|seed| {
            let mut cfg = SimConfig::simple(seed, 4, "cpu=2", 400, "uniform:10..30");
            cfg.crashes = vec![CrashSpec {
                node: 0,
                at_ms: 500,
                restart_after_ms,
            }];
            let r = ok(&cfg);
            assert_eq!(r.tasks_done, 400);
            r.duplicates
        })
        .collect()
}

#[test]
fn a_coordinator_restarted_at_once_hands_out_no_task_its_workers_run() {
    // The coordinator (node 0) dies mid-farm and is back 0.3 s later,
    // before anyone calls it dead: elected again from its own store, it
    // has every task the workers run pending, and handed them out again
    // before their `Claimed` came (11 duplicate runs in 400 here). It now
    // waits, a round trip, for every member to say what it holds. A
    // worker's report may overtake its `Claimed`: the task it names was
    // pending, the report was dropped (and acknowledged), and the task ran
    // again at the end of the farm (4 per run in 6 seeds of 10, and a
    // farm 1.2 s longer); a success now counts as the node's claim.
    let dups = coordinator_crash_duplicates(Some(300));
    assert!(dups.iter().all(|&d| d == 0), "duplicates per run: {dups:?}");
}

#[test]
fn a_coordinator_that_never_comes_back_hands_out_no_task_its_workers_ran() {
    // The coordinator (node 0, also the farm's home) dies mid-farm for
    // good. Its successor kept no copy of the farm: it has it once a
    // holder's offer comes, and the members' `Claimed` and reports often
    // come first. They were dropped (and the members counted as heard), so
    // it handed out again what the workers had done and not yet had
    // acknowledged: 21 to 41 duplicate runs in 400. They are kept until
    // the farm comes. What is left (8 to 13): tasks the dead coordinator
    // ran itself since its last sync to the holders, whose only record,
    // and outputs, died with it.
    let dups = coordinator_crash_duplicates(None);
    assert!(
        dups.iter().all(|&d| d <= 14),
        "duplicates per run: {dups:?}"
    );
}

#[test]
fn a_worker_that_never_comes_back_is_replaced() {
    let mut cfg = SimConfig::simple(12, 4, "cpu=2", 400, "uniform:10..30");
    cfg.crashes = vec![CrashSpec {
        node: 3,
        at_ms: 500,
        restart_after_ms: None,
    }];
    assert_eq!(ok(&cfg).tasks_done, 400);
}

#[test]
fn five_percent_message_loss_still_finishes() {
    let mut cfg = SimConfig::simple(13, 4, "cpu=2", 500, "uniform:5..20");
    cfg.loss = 0.05;
    let r = ok(&cfg);
    assert_eq!(r.tasks_done, 500);
    assert!(r.messages_lost > 0);
}

#[test]
fn a_lost_assignment_costs_a_busy_worker_about_a_second_not_a_report_interval() {
    // Ten nodes reporting every 5 s (`reports_per_s = 2`), 2% of messages
    // lost, tasks of 100 to 300 ms: 20 s of work without loss. A claim
    // goes back once its worker lists what it holds without it, and only
    // a list made after the claim counts: an assignment carries the
    // coordinator's clock as its beats do, so the next assignment tells
    // a busy worker that it missed one, and its `Claimed` a second later
    // says so (its reports, 5 s apart, list nothing: at that pace the
    // list goes on its own). Told only by the answers to its reports, it
    // waited for the next one (the mean went from 21.9 s to 28.0 s over
    // these seeds).
    let run = |seed: u64, loss: f64| {
        let mut cfg = SimConfig::simple(seed, 10, "cpu=2", 2000, "uniform:100..300");
        cfg.loss = loss;
        cfg.mesh.reports_per_s = Some(2);
        let r = ok(&cfg);
        assert_eq!(r.tasks_done, 2000, "seed {seed}: {}", r.summary());
        r.makespan as f64
    };
    let without = run(1, 0.0);
    let with: Vec<f64> = (1..=5).map(|seed| run(seed, 0.02)).collect();
    let mean = with.iter().sum::<f64>() / with.len() as f64;
    assert!(
        mean < 1.2 * without,
        "makespans {with:?} with 2% loss, {without} without"
    );
}

#[test]
fn a_partition_that_heals() {
    let mut cfg = SimConfig::simple(14, 5, "cpu=2", 800, "uniform:10..30");
    cfg.partitions = vec![PartitionSpec {
        nodes: vec![3, 4],
        from_ms: 300,
        until_ms: 3500,
    }];
    assert_eq!(ok(&cfg).tasks_done, 800);
}

#[test]
fn gpu_tasks_run_only_on_gpu_nodes() {
    let mut cfg = SimConfig::simple(15, 3, "cpu=4", 200, "uniform:5..10");
    cfg.nodes.push(NodeGroup {
        count: 1,
        resources: "cpu=4,gpu=2".into(),
        join_at_ms: 0,
    });
    // Submitted once the mesh has formed, so the gpu node is known.
    cfg.submit_at_ms = 500;
    cfg.stages.push(StageSpec {
        name: "gpu".into(),
        tasks: 50,
        durations: "uniform:5..10".into(),
        resources: "cpu=1,gpu=1".into(),
        after: vec![],
        after_each: vec![],
        fail_rate: 0.0,
        retries: 0,
        timeout_ms: None,
        expected_ms: None,
    });
    let r = ok(&cfg);
    assert_eq!(r.tasks_done, 250);
    let gpu_runs: Vec<_> = r.sample.iter().filter(|e| e.stage == 1).collect();
    assert!(!gpu_runs.is_empty());
    assert!(gpu_runs.iter().all(|e| e.node == 3), "{gpu_runs:?}");
}

#[test]
fn an_unplaceable_stage_is_reported_at_the_origin() {
    let mut cfg = SimConfig::simple(16, 2, "cpu=2", 20, "5");
    cfg.submit_at_ms = 500;
    cfg.stages[0].resources = "cpu=1,gpu=1".into();
    let r = ok(&cfg);
    assert_eq!(r.tasks_done, 0);
    assert_eq!(r.unplaceable.len(), 1, "{:?}", r.unplaceable);
    assert!(r.unplaceable[0].contains("gpu"), "{:?}", r.unplaceable);
    // What `mesh sim` prints says why every task failed, after the count.
    let summary = r.summary();
    let line = summary
        .lines()
        .skip_while(|l| !l.starts_with("tasks 0 done, 20 failed"))
        .nth(1);
    assert_eq!(
        line.map(|l| l.starts_with("unplaceable: ") && l.contains("gpu")),
        Some(true),
        "{summary}"
    );
}

#[test]
fn stealing_fixes_a_bad_placement() {
    let mut with = scenario("skew");
    with.steal = true;
    let mut without = with.clone();
    without.steal = false;
    let a = ok(&with);
    let b = ok(&without);
    println!("with stealing:\n{}\nwithout:\n{}", a.summary(), b.summary());
    assert!(a.steals > 0, "{}", a.summary());
    assert_eq!(a.duplicates, 0);
    assert!(a.ratio < 1.25, "with stealing: {}", a.summary());
    assert!(
        (a.makespan as f64) < 1.2 * a.greedy as f64,
        "with stealing, near an ideal scheduler: {}",
        a.summary()
    );
    assert!(b.ratio > 3.0, "without stealing: {}", b.summary());
}

#[test]
fn the_greedy_baseline_is_list_scheduling_in_order() {
    // Equal tasks pack perfectly: greedy meets the bound.
    let mut cfg = SimConfig::simple(3, 2, "cpu=2", 40, "10");
    assert_eq!(ok(&cfg).greedy, 100, "40 tasks of 10 ms on 4 slots");
    // One long task last: greedy, not knowing, starts it when a slot frees
    // (at 10 ms) and ends at 110; knowing durations would give 100.
    cfg.stages[0].tasks = 4;
    cfg.stages[0].durations = "10".into();
    cfg.stages.push(mesh_sim::scenario::StageSpec {
        name: "long".into(),
        tasks: 1,
        durations: "100".into(),
        ..cfg.stages[0].clone()
    });
    cfg.nodes[0].count = 1;
    cfg.nodes[0].resources = "cpu=4".into();
    let r = ok(&cfg);
    assert_eq!(r.lower_bound, 100);
    assert_eq!(r.greedy, 110);
    assert_eq!(
        r.longest_first, 100,
        "knowing durations starts the long one first"
    );
    assert!(
        r.makespan >= 110,
        "mesh cannot beat it here: {}",
        r.summary()
    );
}

/// A node that leaves mid-farm (Ctrl-C, a batch job's drain) stays, as a
/// real one does, until the home has the outputs of the tasks it ran:
/// they are not lost with it, so nothing waits `outputs_wait_ms` (30 s)
/// to run them again. It went at once before, and every seed took 33 s.
#[test]
fn a_node_that_leaves_mid_farm_stays_until_the_home_has_its_outputs() {
    for seed in 1..=4 {
        let mut cfg = SimConfig::simple(seed, 4, "cpu=2", 400, "uniform:10..30");
        cfg.leaves = vec![LeaveSpec {
            node: 2,
            at_ms: 700,
        }];
        let r = ok(&cfg);
        assert_eq!(r.tasks_done, 400);
        assert!(r.makespan < 5_000, "seed {seed}: {}", r.summary());
        // Only the two it was running when it left ran again.
        assert!(r.executions <= 402, "seed {seed}: {}", r.summary());
    }
}

/// A node that crashes while it leaves, and is started again, is a node
/// of the mesh like any other: the leave's end is not its end.
#[test]
fn a_node_restarted_after_crashing_while_it_left_stays_up() {
    let mut cfg = SimConfig::simple(3, 4, "cpu=2", 400, "uniform:100..300");
    cfg.leaves = vec![LeaveSpec {
        node: 2,
        at_ms: 700,
    }];
    cfg.crashes = vec![CrashSpec {
        node: 2,
        at_ms: 800,
        restart_after_ms: Some(10),
    }];
    let r = ok(&cfg);
    assert_eq!(r.tasks_done, 400);
    let t = &r.timeline;
    let after = (6_000 / t.bucket_ms) as usize;
    let busy_late: f64 = t.busy[2].iter().skip(after).sum();
    assert!(
        busy_late > 0.0,
        "node 2 ran nothing after 6 s: {}",
        r.summary()
    );
}

#[test]
fn the_fault_scenario_file_finishes() {
    let r = ok(&scenario("faults"));
    assert_eq!(r.tasks_done, 340);
}

#[test]
fn a_seed_sweep_with_faults_keeps_the_invariants() {
    let started = std::time::Instant::now();
    for seed in 0..20 {
        let mut cfg = SimConfig::simple(seed, 4, "cpu=2", 150, "uniform:5..40");
        cfg.loss = 0.02;
        let victim = 1 + (seed as usize % 3);
        cfg.crashes = vec![CrashSpec {
            node: victim,
            at_ms: 100 + seed * 37,
            restart_after_ms: (seed % 2 == 0).then_some(1000),
        }];
        cfg.partitions = vec![PartitionSpec {
            nodes: vec![1 + (seed as usize + 1) % 3],
            from_ms: 200 + seed * 11,
            until_ms: 1200 + seed * 50,
        }];
        if let Err(e) = run(&cfg) {
            panic!("{e}");
        }
        assert!(started.elapsed().as_secs() < 60, "the sweep is time-boxed");
    }
}

/// One run of the any-node fault sweep: 5 nodes, the farm submitted on a
/// drawn node, 2% of messages lost, three crashes of drawn nodes (the
/// submitter and the coordinator included; the submitter always comes
/// back, another may not), and a partition of a drawn pair that heals.
fn any_node_faults(seed: u64) -> SimConfig {
    let mix = |k: u64| {
        let mut x =
            seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ k.wrapping_mul(0xc2b2_ae3d_27d4_eb4f);
        x ^= x >> 31;
        x.wrapping_mul(0xff51_afd7_ed55_8ccd) >> 33
    };
    let nodes = 5;
    let mut cfg = SimConfig::simple(seed, nodes, "cpu=2", 200, "uniform:5..40");
    cfg.loss = 0.02;
    cfg.submit_node = (mix(1) % nodes as u64) as usize;
    cfg.submit_at_ms = 300;
    cfg.mesh.outputs_wait_ms = Some(3000);
    cfg.crashes = (0..3)
        .map(|k| {
            let node = (mix(10 + k) % nodes as u64) as usize;
            let at_ms = 400 + mix(20 + k) % 1500;
            let back = node == cfg.submit_node || mix(30 + k) % 4 != 0;
            CrashSpec {
                node,
                at_ms,
                restart_after_ms: back.then_some(300 + mix(40 + k) % 2500),
            }
        })
        .collect();
    let a = (mix(50) % nodes as u64) as usize;
    let b = (a + 1 + (mix(51) % (nodes as u64 - 1)) as usize) % nodes;
    cfg.partitions = vec![PartitionSpec {
        nodes: vec![a, b],
        from_ms: 500 + mix(52) % 1000,
        until_ms: 2500 + mix(53) % 2000,
    }];
    cfg
}

#[test]
fn a_seed_sweep_with_faults_of_any_node_loses_nothing() {
    let started = std::time::Instant::now();
    for seed in 0..100 {
        any_node_faults_lose_nothing(seed);
        assert!(started.elapsed().as_secs() < 90, "the sweep is time-boxed");
    }
}

/// Runs `any_node_faults(seed)`: every task ends done or failed for its
/// crashes, none lost.
fn any_node_faults_lose_nothing(seed: u64) {
    let cfg = any_node_faults(seed);
    let r = match run(&cfg) {
        Ok(r) => r,
        Err(e) => panic!("{e}\n{cfg:?}"),
    };
    assert_eq!(
        r.tasks_done + r.crash_limited,
        200,
        "seed {seed}: {}",
        r.summary()
    );
}

/// Seeds of the long sweep that once never finished: a node whose SWIM
/// went idle after a change of identity (1100, 5269: two nodes that had
/// declared each other down across a partition), a worker that never
/// counted its old coordinator as a member again after a partition (1100),
/// and a restarted coordinator that knew a worker only by its beats and so
/// never saw it die (1570).
#[test]
fn seeds_that_once_stalled_finish_with_nothing_lost() {
    for seed in [1100, 1558, 1570, 5269] {
        any_node_faults_lose_nothing(seed);
    }
}

/// The longer sweep: `MESH_SIM_SWEEP=5000 cargo test --release -p mesh-sim
/// -- --ignored long_seed_sweep` runs seeds 1000 to 5999 (about 20 s);
/// `MESH_SIM_FROM=S` starts at seed S, to replay a failure.
#[test]
#[ignore]
fn a_long_seed_sweep_with_faults_of_any_node() {
    let var = |k: &str, d: u64| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let n = var("MESH_SIM_SWEEP", 500);
    for seed in var("MESH_SIM_FROM", 1000)..1000 + n {
        let cfg = any_node_faults(seed);
        if let Err(e) = run(&cfg) {
            panic!("{e}\n{cfg:?}");
        }
    }
}

#[test]
fn the_same_seed_gives_the_same_report() {
    let cfg = scenario("faults");
    let a = ok(&cfg).deterministic();
    let b = ok(&cfg).deterministic();
    assert_eq!(a, b);
    let mut other = cfg.clone();
    other.seed += 1;
    assert_ne!(ok(&other).deterministic(), a);
}

#[test]
fn violations_name_the_seed() {
    let mut cfg = SimConfig::simple(99, 1, "cpu=1", 10, "1000");
    cfg.max_time_ms = Some(2000);
    let e = run(&cfg).unwrap_err();
    assert!(matches!(e, SimError::Stuck { seed: 99, .. }), "{e}");
    assert!(e.to_string().contains("seed 99"), "{e}");
}

#[test]
fn a_farm_of_hours_runs_its_hours_and_one_that_cannot_finish_says_why_in_words() {
    // 10 tasks of 5 min on 2 one-core nodes: 25 min of virtual time, past
    // the 10 min that once was every run's limit.
    let cfg = SimConfig::simple(3, 2, "cpu=1", 10, "uniform:4m..5m");
    let r = ok(&cfg);
    assert_eq!(r.tasks_done, 10);
    assert!(r.makespan > 20 * 60_000, "{}", r.makespan);
    assert_eq!(r.node_shapes, vec![(2, "cpu=1".to_string())]);
    assert!(
        r.summary().contains("nodes 2, cpu=1 each"),
        "{}",
        r.summary()
    );

    let mut cut = cfg.clone();
    cut.max_time_ms = Some(6 * 60_000);
    let e = run(&cut).unwrap_err().to_string();
    for words in [
        "the run did not finish",
        "time limit (max_time_ms = 360000)",
        "of 10 tasks not done (the first: ",
        "its coordinator, node ",
        "replay with seed 3",
    ] {
        assert!(e.contains(words), "{words:?} not in: {e}");
    }
    for dump in ["Counts {", "NodeId(", "Some(("] {
        assert!(!e.contains(dump), "a Debug dump in: {e}");
    }
}

/// 1000 nodes, 100k tasks: `cargo test --release -p mesh-sim -- --ignored --nocapture`.
#[test]
#[ignore]
fn large_run_measures_events_per_second() {
    let r = ok(&scenario("large"));
    println!("{}", r.summary());
    assert_eq!(r.tasks_done, 100_000);
}

/// A deadline's search gives up on a count once its farm is still
/// running past the deadline: a run that ends in time is the whole run,
/// report for report, and one whose last task ends a millisecond late is
/// given up on.
#[test]
fn a_run_given_up_past_a_time_is_the_whole_run_when_it_ends_in_time_and_none_when_not() {
    let cfg = SimConfig::simple(5, 3, "cpu=2", 300, "uniform:100..300");
    let whole = ok(&cfg);
    let within = mesh_sim::run_within(&cfg, whole.makespan)
        .expect("runs")
        .expect("ends in time");
    assert_eq!(within.deterministic(), whole.deterministic());
    let late = mesh_sim::run_within(&cfg, whole.makespan - 1).expect("runs");
    assert!(late.is_none(), "its last task ends after the time given");
}

/// A search with a time to answer in stops a count whose simulation
/// outlasts it, saying how far into the farm it got; with time enough the
/// bounded run is the whole run. And greedy's baseline, where the search
/// starts, is the one the run's report gives.
#[test]
fn a_run_out_of_wall_time_says_how_far_it_got_and_with_time_enough_is_the_whole_run() {
    use mesh_sim::Within;
    use std::time::{Duration, Instant};
    let cfg = SimConfig::simple(5, 3, "cpu=2", 300, "uniform:100..300");
    let whole = ok(&cfg);
    let far = Instant::now() + Duration::from_secs(3600);
    match mesh_sim::run_bounded(&cfg, whole.makespan, Some(far)).expect("runs") {
        Within::Ended(r) => assert_eq!(r.deterministic(), whole.deterministic()),
        other => panic!("ends in time: {other:?}"),
    }
    assert!(matches!(
        mesh_sim::run_bounded(&cfg, whole.makespan - 1, Some(far)).expect("runs"),
        Within::Past { .. }
    ));
    match mesh_sim::run_bounded(&cfg, whole.makespan, Some(Instant::now())).expect("runs") {
        Within::OutOfTime { at_ms, .. } => assert!(at_ms < whole.makespan, "{at_ms}"),
        other => panic!("out of time at once: {other:?}"),
    }
    let (bound, greedy) = mesh_sim::baselines(&cfg).expect("plans");
    assert_eq!((bound, greedy), (whole.lower_bound, whole.greedy));
}

#[test]
fn the_speed_line_counts_a_minute_of_running_tasks_as_upkeep_and_names_its_timers() {
    // Four tasks of a minute on five nodes: once they run, nothing
    // changes for a minute but the mesh's own beats, probes and resends,
    // which the simulator steps one by one.
    let mut cfg = SimConfig::simple(21, 5, "cpu=1", 4, "60000");
    cfg.submit_at_ms = 5_000;
    let r = ok(&cfg);
    let u = &r.upkeep;
    assert!(u.of <= r.events && u.events <= u.of, "{u:?}");
    assert!(u.events as f64 > 0.9 * u.of as f64, "{u:?}");
    assert!((50_000..=60_000).contains(&u.longest_ms), "{u:?}");
    assert!(u.in_long_stretches as f64 > 0.9 * u.events as f64, "{u:?}");
    let sources: Vec<&str> = u.by_source.iter().map(|(s, _)| s.as_str()).collect();
    let timers = [
        "beat",
        "swim",
        "heartbeat timer",
        "probe timer",
        "report sent for its worker",
    ];
    for timer in timers {
        assert!(sources.contains(&timer), "{timer} not in {sources:?}");
    }
    assert_eq!(u.by_source.iter().map(|(_, n)| n).sum::<u64>(), u.events);
    assert!(r
        .summary()
        .contains("of the farm's events were the mesh's upkeep"));

    // Two thousand tasks of tens of milliseconds on four nodes: something
    // starts or ends every few milliseconds, and the events are the work.
    let r = ok(&SimConfig::simple(22, 4, "cpu=2", 2_000, "uniform:10..50"));
    let u = &r.upkeep;
    assert!(u.longest_ms < 1_000, "{u:?}");
    assert!((u.events as f64) < 0.5 * u.of as f64, "{u:?}");
    assert_eq!(u.in_long_stretches, 0, "{u:?}");
}

#[test]
fn a_run_stopped_halfway_projects_its_end_within_a_percent_of_the_whole_run() {
    // What `--deadline` tells of a count it stopped: the farm's end at its
    // pace so far against greedy list scheduling. Stopped at half the
    // makespan, it lands within 1% of the end the whole run reaches
    // (0.2% for uniform durations, 0.4% for exponential ones' long tail).
    for (seed, durations) in [(31, "uniform:60000..180000"), (32, "exp:90000")] {
        let cfg = SimConfig::simple(seed, 5, "cpu=4", 1_500, durations);
        let whole = ok(&cfg).makespan;
        let projected = match mesh_sim::run_bounded(&cfg, whole / 2, None) {
            Ok(mesh_sim::Within::Past { projected_ms }) => projected_ms.expect("tasks ended"),
            Ok(_) => panic!("a run given half its makespan went past it"),
            Err(e) => panic!("{e}"),
        };
        let off = (projected as f64 - whole as f64).abs() / whole as f64;
        assert!(
            off < 0.01,
            "{durations}: projected {projected} ms from half, the whole run {whole} ms"
        );
    }
}
