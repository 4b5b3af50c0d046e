//! Recorded workflows through the real peers: makespans between the critical path and the serial sum, transfers that cost time, exact replay, jitter, and the fewest nodes for a deadline.

use mesh_protocol::farm::{CommandTemplate, FarmDef, StageDef, Sweep, Template};
use mesh_sim::whatif::{fewest_nodes, fewest_possible, row, sweep};
use mesh_sim::workflow::Read;
use mesh_sim::{
    run_workload, ConfigError, Links, Replay, SimConfig, SimError, WhatIf, Workload, WorkloadError,
};

const MB: u64 = 1_000_000;

fn stage(name: &str, n: u64) -> StageDef {
    StageDef::new(
        name,
        CommandTemplate::Argv(vec![Template::literal("true")]),
        Sweep::range("i", n),
    )
}

/// split (1 task, 10 s) -> work (`width` tasks of 60 to 120 s, after
/// split) -> post (one per work task, after_each, 30 s, reading 100 MB
/// of it) -> merge (20 s, after post, reading 10 MB of each).
fn fan(width: u32) -> Workload {
    let w = width as usize;
    let def = FarmDef {
        graph: Default::default(),
        name: "fan".into(),
        root: "/".into(),
        out: "/out".into(),
        stages: vec![
            stage("split", 1).into(),
            StageDef {
                after: vec![0],
                ..stage("work", w as u64)
            }
            .into(),
            StageDef {
                after_each: vec![1],
                ..stage("post", w as u64)
            }
            .into(),
            StageDef {
                after: vec![2],
                ..stage("merge", 1)
            }
            .into(),
        ]
        .into(),
    };
    let mut runtime_ms = vec![10_000];
    let mut parents = vec![vec![]];
    let mut reads = vec![vec![]];
    for i in 0..w {
        runtime_ms.push(60_000 + (i as u64 * 7_919) % 60_001);
        parents.push(vec![0]);
        reads.push(vec![]);
    }
    for i in 0..w {
        let up = 1 + i as u32;
        runtime_ms.push(30_000);
        parents.push(vec![up]);
        reads.push(vec![Read {
            from: up,
            file: up,
            bytes: 100 * MB,
        }]);
    }
    let posts: Vec<u32> = (1 + w as u32..1 + 2 * w as u32).collect();
    runtime_ms.push(20_000);
    reads.push(
        posts
            .iter()
            .map(|&p| Read {
                from: p,
                file: p,
                bytes: 10 * MB,
            })
            .collect(),
    );
    parents.push(posts);
    Workload {
        def,
        runtime_ms,
        parents,
        reads,
        input_bytes: 0,
    }
}

fn cluster(nodes: usize, bytes_per_s: Option<f64>) -> WhatIf {
    WhatIf {
        seed: 3,
        nodes,
        node: "cpu=4".into(),
        replay: Replay {
            links: Links {
                bytes_per_s,
                latency_ms: 1,
            },
            jitter: 0.0,
        },
        steal: true,
        step: false,
        cluster: None,
    }
}

/// What `f` answers for `w`, asserted the same with every timer stepped
/// (`WhatIf::step`): a simulator that skips a timer with nothing to do
/// must not change one figure of any answer.
fn both<T: PartialEq + std::fmt::Debug>(w: &WhatIf, f: impl Fn(&WhatIf) -> T) -> T {
    let skipped = f(w);
    let stepped = f(&WhatIf {
        step: true,
        ..w.clone()
    });
    assert_eq!(skipped, stepped, "skipping and stepping differ");
    skipped
}

/// The report's answer (less its speed line), the same stepped.
fn run(wl: &Workload, w: &WhatIf) -> mesh_sim::SimReport {
    both(w, |w| match run_workload(&w.config(wl), wl, &w.replay) {
        Ok(r) => r.answer(),
        Err(e) => panic!("{e}"),
    })
}

#[test]
fn a_workflow_on_four_nodes_takes_between_its_critical_path_and_its_serial_sum() {
    let wl = fan(32);
    let r = run(&wl, &cluster(4, Some(125e6)));
    assert_eq!((r.tasks_done, r.tasks_failed, r.duplicates), (66, 0, 0));
    let cp = wl.critical_path_ms();
    assert!(
        (120_000..=180_000).contains(&cp),
        "the longest chain: split, work, post, merge: {cp}"
    );
    assert!(
        r.makespan >= cp && r.makespan <= wl.work_ms(),
        "makespan {} outside [{cp}, {}]",
        r.makespan,
        wl.work_ms()
    );
    // 16 cores for 32 tasks of at most 2 minutes and their posts: well
    // under twice the bound.
    assert!(
        r.makespan < 2 * r.lower_bound,
        "makespan {} against bound {}",
        r.makespan,
        r.lower_bound
    );
    assert!(r.moved_bytes > 0 && r.stage_in_ms > 0, "{r:?}");
}

#[test]
fn slow_links_cost_time_and_one_node_moves_nothing() {
    let wl = fan(16);
    let free = run(&wl, &cluster(4, None));
    let slow = run(&wl, &cluster(4, Some(10e6)));
    assert_eq!(free.stage_in_ms, 0);
    // At least the merge brings 10 MB at 10 MB/s from each post that ran
    // elsewhere: 12 of 16 on four nodes, one after another.
    assert!(
        slow.makespan > free.makespan + 5_000 && slow.stage_in_ms > 5_000,
        "{} against {}",
        slow.makespan,
        free.makespan
    );
    let alone = run(&wl, &cluster(1, Some(10e6)));
    assert_eq!((alone.moved_bytes, alone.stage_in_ms), (0, 0));
    assert!(alone.makespan >= wl.work_ms() / 4, "{}", alone.makespan);
}

#[test]
fn the_same_seed_replays_the_same_report_and_jitter_follows_the_seed() {
    let wl = fan(16);
    let mut w = cluster(4, Some(125e6));
    w.replay.jitter = 0.3;
    let a = run(&wl, &w).deterministic();
    let b = run(&wl, &w).deterministic();
    assert_eq!(a, b);
    w.seed = 4;
    let c = run(&wl, &w);
    assert_ne!(a.makespan, c.makespan, "another seed draws other runtimes");
    let r = both(&w, |w| row(&wl, w, 4, 5, |_| {}).unwrap());
    assert_eq!(r.runs.len(), 5);
    assert!(r.makespan_p50_ms <= r.makespan_p90_ms);
    let seeds: Vec<u64> = r.runs.iter().map(|x| x.seed).collect();
    assert_eq!(seeds, vec![4, 5, 6, 7, 8]);
}

#[test]
fn more_nodes_are_never_faster_than_the_critical_path_and_help_a_wide_graph() {
    let wl = fan(32);
    let rows = both(&cluster(1, Some(125e6)), |w| {
        sweep(&wl, w, &[1, 2, 4, 8, 16], 1, |_, _| {}).unwrap()
    });
    let cp = wl.critical_path_ms();
    for r in &rows {
        assert!(r.makespan_p50_ms >= cp, "{} nodes: {r:?}", r.nodes);
        assert!(r.critical_share <= 1.0);
    }
    assert!(
        rows[4].makespan_p50_ms * 3 < rows[0].makespan_p50_ms,
        "16 nodes against 1: {} against {}",
        rows[4].makespan_p50_ms,
        rows[0].makespan_p50_ms
    );
}

#[test]
fn the_fewest_nodes_for_a_deadline_meet_it() {
    let wl = fan(32);
    let base = cluster(1, Some(125e6));
    let one = row(&wl, &base, 1, 1, |_| {}).unwrap().makespan_p50_ms;
    let deadline = one / 3;
    let s = both(&base, |w| {
        fewest_nodes(&wl, w, deadline, 1, |_, _| {}).unwrap()
    });
    let n = s
        .nodes
        .expect("a wide graph meets a third of one node's time");
    let met = s.tried.iter().find(|r| r.nodes == n).unwrap();
    assert!(met.makespan_p90_ms <= deadline);
    assert!(s
        .tried
        .iter()
        .filter(|r| r.nodes < n)
        .all(|r| r.makespan_p90_ms > deadline));
    // The count below the answer missed, or could not hold the work; no
    // count under that bound was simulated.
    assert!(s.least <= n, "{s:?}");
    assert!(
        n - 1 < s.least || s.tried.iter().any(|r| r.nodes == n - 1),
        "{s:?}"
    );
    assert!(s.tried.iter().all(|r| r.nodes >= s.least), "{s:?}");
    // Under the critical path: nothing is simulated.
    let s = fewest_nodes(&wl, &base, wl.critical_path_ms() - 1, 1, |_, _| {}).unwrap();
    assert!(s.nodes.is_none() && s.tried.is_empty(), "{s:?}");
}

#[test]
fn fewer_nodes_than_the_work_needs_by_the_deadline_are_not_simulated() {
    let wl = fan(32);
    let base = cluster(1, None);
    // Every task holds a core for its runtime: 4-core nodes hold a
    // deadline's worth each, and a count under that cannot meet it.
    let work = wl.work_ms();
    let deadline = work / 10;
    let least = fewest_possible(&wl, &base, deadline);
    assert_eq!(least, 3, "{work} core-ms on 4 cores by {deadline} ms");
    let short = both(&base, |w| row(&wl, w, least - 1, 1, |_| {}).unwrap());
    assert!(short.makespan_p90_ms > deadline, "{short:?}");
    // Jitter may shorten every runtime: the bound takes the shortest.
    let mut jittered = base.clone();
    jittered.replay.jitter = 0.5;
    assert_eq!(fewest_possible(&wl, &jittered, deadline), 2);
    // A deadline the work fits on one node's cores many times over: one.
    assert_eq!(fewest_possible(&wl, &base, work), 1);
    // A scenario's cluster, whose nodes differ: no bound.
    let mut mixed = base.clone();
    mixed.cluster = Some(SimConfig::simple(1, 4, "cpu=2", 1, "1"));
    assert_eq!(fewest_possible(&wl, &mixed, deadline), 1);
}

#[test]
fn a_workload_whose_parts_disagree_is_refused() {
    let mut wl = fan(4);
    wl.parents[1] = vec![3];
    let e = run_workload(&cluster(2, None).config(&wl), &wl, &cluster(2, None).replay).unwrap_err();
    assert!(
        matches!(
            &e,
            SimError::Config(ConfigError::Workload(WorkloadError::ParentAfter {
                task: 1,
                parent: 3
            }))
        ),
        "{e}"
    );
}

#[test]
fn idle_nodes_take_work_that_becomes_ready_task_by_task() {
    // The posts become ready one by one as their work tasks end: idle
    // nodes must hear of them, and steal what queued behind busy ones,
    // for the makespan to stay near an ideal list scheduler's.
    let wl = fan(32);
    for nodes in [4, 8] {
        let r = run(&wl, &cluster(nodes, None));
        assert!(
            (r.makespan as f64) < 1.15 * r.greedy as f64,
            "{nodes} nodes: makespan {} against greedy {}",
            r.makespan,
            r.greedy
        );
    }
}

#[test]
fn a_workflow_runs_on_an_allocation_queues_batch_nodes() {
    use mesh_sim::scenario::AllocSpec;
    let mut wl = fan(16);
    // As `mesh sim --workflow` does with queues: each stage expects its
    // longest task, so none starts on a node that drains before it ends.
    let offsets = wl.offsets();
    for (s, st) in wl.def.stages.iter_mut().enumerate() {
        let o = offsets[s];
        std::sync::Arc::make_mut(st).expected_ms = wl.runtime_ms[o..o + st.len() as usize]
            .iter()
            .copied()
            .max();
    }
    let mut cluster_cfg = SimConfig::simple(1, 1, "cpu=2", 1, "1");
    cluster_cfg.alloc = vec![AllocSpec {
        name: "cpu".into(),
        cores: 8,
        gpus: 0,
        mem: None,
        nodes_per_job: 1,
        walltime_ms: 600_000,
        drain_margin_ms: None,
        min: 0,
        max: 4,
        idle_timeout_ms: 60_000,
        start_delay: "uniform:5000..20000".into(),
        reject_rate: 0.0,
        add_at_ms: 0,
    }];
    let w = WhatIf {
        cluster: Some(cluster_cfg),
        ..cluster(1, Some(125e6))
    };
    let r = both(&w, |w| {
        row(&wl, w, 1, 1, |r| {
            let a = r.alloc.as_ref().expect("the queue's report");
            assert!(a.started > 0, "{a:?}");
        })
        .unwrap()
    });
    let run = &r.runs[0];
    assert_eq!(run.tasks_done, 34);
    assert!(run.batch_node_hours > 0.0);
    assert!(r.node_hours > run.batch_node_hours);
    assert!(r.makespan_p50_ms >= wl.critical_path_ms());
    // One 2-core node alone takes at least half the work.
    assert!(r.makespan_p50_ms < wl.work_ms() / 2, "{r:?}");
}

/// `n` tasks of 1 s, each after the one before, reading nothing.
fn chain(n: u64) -> Workload {
    let stages = (0..n)
        .map(|i| StageDef {
            after: if i == 0 { vec![] } else { vec![i as u32 - 1] },
            ..stage(&format!("s{i}"), 1)
        })
        .map(std::sync::Arc::new)
        .collect();
    Workload {
        def: FarmDef {
            graph: Default::default(),
            name: "chain".into(),
            root: "/".into(),
            out: "/out".into(),
            stages,
        },
        runtime_ms: vec![1_000; n as usize],
        parents: (0..n as u32)
            .map(|i| if i == 0 { vec![] } else { vec![i - 1] })
            .collect(),
        reads: vec![vec![]; n as usize],
        input_bytes: 0,
    }
}

#[test]
fn the_home_starts_a_task_once_what_it_depends_on_is_home() {
    // A real home holds a task until it knows each dependency done and
    // has its outputs. The coordinator syncs its log to the holders every
    // `progress_ms` (200 ms), but an entry some task waits for goes at
    // once: a chain on one node waits a round trip at each edge, not a
    // sync round (it waited 100-215 ms an edge before; the accuracy bench
    // found the real tail of Epigenomics 0.1 s an edge behind).
    let wl = chain(10);
    let r = run(&wl, &cluster(1, None));
    assert_eq!((r.tasks_done, r.duplicates), (10, 0));
    let waited = r.makespan - wl.critical_path_ms();
    assert!(
        waited <= 9 * 20,
        "9 edges, each a round trip, no sync round: waited {waited} ms"
    );
}
