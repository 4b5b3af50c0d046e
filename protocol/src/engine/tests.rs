//! Engine tests: scripted scenarios and random operation sequences with invariants checked.

use super::*;
use crate::farm::graph::{Dep, DepOn, GraphCache};
use crate::farm::{CommandTemplate, StageDef, Sweep, SweepMode, SweepVar, Template, Values};
use crate::resources::parse_resources;
use crate::resources::Amount;
use proptest::prelude::*;

pub(super) fn stage(name: &str, n: u64) -> StageDef {
    StageDef::new(
        name,
        CommandTemplate::Argv(vec![Template::literal("true")]),
        Sweep::range("i", n),
    )
}

pub(super) fn farm(stages: Vec<StageDef>) -> Arc<FarmDef> {
    Arc::new(FarmDef {
        graph: Default::default(),
        name: "f".into(),
        root: "/r".into(),
        out: "/o".into(),
        stages: stages.into_iter().map(std::sync::Arc::new).collect(),
    })
}

pub(super) fn ok() -> Outcome {
    Outcome {
        result: TaskResult::Exited(0),
        key: None,
        duration_ms: 1,
        ended_ms: 0,
        grew: None,
        logs: 0,
        stderr_line: None,
        usage: None,
    }
}

pub(super) fn fail() -> Outcome {
    Outcome {
        result: TaskResult::Exited(1),
        ..ok()
    }
}

/// Drains actions; returns the starts and everything else, checking persist-before-act order.
type Started = (FarmSlot, TaskRef, u32, Grant);

fn drain(e: &mut Engine) -> (Vec<Started>, Vec<Action>) {
    let mut starts = Vec::new();
    let mut other = Vec::new();
    let mut persisted = std::collections::HashSet::new();
    while let Some(a) = e.poll_action() {
        match a {
            Action::Persist(Persist::Task {
                farm,
                task,
                ref record,
            }) => {
                persisted.insert((farm, task, record.attempt));
                other.push(a);
            }
            Action::Start {
                farm,
                task,
                attempt,
                grant,
            } => {
                assert!(
                    persisted.contains(&(farm, task, attempt)),
                    "start of {task:?} attempt {attempt} before its record"
                );
                starts.push((farm, task, attempt, grant));
            }
            a => other.push(a),
        }
    }
    e.audit().unwrap();
    (starts, other)
}

#[test]
fn runs_up_to_capacity_and_finishes() {
    let mut e = Engine::new(parse_resources("cpu=2").unwrap());
    let slot = e.add_farm(0, farm(vec![stage("a", 5)]), vec![], &AddOptions::default());
    let (starts, _) = drain(&mut e);
    assert_eq!(starts.len(), 2, "two cpus, two tasks at once");
    let mut live = starts;
    let mut done = 0;
    while let Some((f, t, a, _)) = live.pop() {
        e.task_finished(1, f, t, a, ok());
        done += 1;
        let (more, _) = drain(&mut e);
        live.extend(more);
        assert!(e.running_count() <= 2);
    }
    assert_eq!(done, 5);
    let p = e.progress(slot);
    assert_eq!((p.done, p.queued(), p.running), (5, 0, 0));
}

#[test]
fn element_wise_and_whole_stage_dependencies() {
    let mut b = stage("b", 3);
    b.after_each = vec![0];
    let mut c = stage("c", 1);
    c.after = vec![1];
    let mut e = Engine::new(parse_resources("cpu=8").unwrap());
    e.add_farm(
        0,
        farm(vec![stage("a", 3), b, c]),
        vec![],
        &AddOptions::default(),
    );
    let (starts, _) = drain(&mut e);
    assert!(
        starts.iter().all(|s| s.1.stage == 0),
        "only stage a is ready"
    );
    // a/1 done -> b/1 ready, nothing else.
    let a1 = starts.iter().find(|s| s.1.index == 1).unwrap().clone();
    e.task_finished(1, a1.0, a1.1, a1.2, ok());
    let (s2, _) = drain(&mut e);
    assert_eq!(
        s2.iter().map(|s| s.1).collect::<Vec<_>>(),
        vec![TaskRef::new(1, 1)]
    );
    // Finish everything else; c starts only after all of b.
    let mut live: Vec<_> = starts
        .into_iter()
        .filter(|s| s.1.index != 1)
        .chain(s2)
        .collect();
    let mut c_started = false;
    while let Some((f, t, a, _)) = live.pop() {
        if t.stage == 2 {
            c_started = true;
        }
        e.task_finished(2, f, t, a, ok());
        let (more, _) = drain(&mut e);
        for m in &more {
            if m.1.stage == 2 {
                assert_eq!(e.progress(f).done, 6, "c started before a and b were done");
            }
        }
        live.extend(more);
    }
    assert!(c_started);
}

/// A stage grown from `up`'s files: `per` places per task of `up`, then a
/// gather of it all.
fn grown_farm(up: u64, per: u32) -> Arc<FarmDef> {
    let mut grown = stage("grown", 1);
    grown.sweep = Sweep {
        vars: vec![
            SweepVar {
                name: "i".into(),
                values: Values::Range {
                    start: 0,
                    step: 1,
                    count: up,
                    decimals: 0,
                },
            },
            SweepVar {
                name: "line".into(),
                values: Values::Grown(crate::farm::Grown {
                    from: 0,
                    file: "lines.txt".into(),
                    per,
                }),
            },
        ],
        mode: SweepMode::Product,
    };
    grown.deps = vec![Dep {
        stage: 0,
        on: DepOn::Grown { per },
    }];
    let mut gather = stage("gather", 1);
    gather.after = vec![1];
    let mut up_stage = stage("up", up);
    up_stage.outputs = vec![Template::literal("lines.txt")];
    farm(vec![up_stage, grown, gather])
}

/// The stages grown from a stage's files, asked at each of its tasks' ends,
/// are listed once per generation of an open farm, each built on the list
/// before: a growth that adds a grown stage is found, one that adds none
/// keeps it.
#[test]
fn a_grown_stage_added_by_a_growth_is_found_from_the_generation_before() {
    let whole = grown_farm(3, 4);
    let generation = |n: usize, before: Option<&FarmDef>| FarmDef {
        stages: whole.stages.take(n),
        graph: before.map_or_else(Default::default, |b| GraphCache::after(&b.graph)),
        ..(*whole).clone()
    };
    let first = generation(1, None);
    assert_eq!(first.grows(0), None);
    let second = generation(2, Some(&first));
    assert_eq!(second.grows(0), Some(("lines.txt", 4)));
    assert_eq!(second.grows(1), None);
    let third = generation(3, Some(&second));
    assert_eq!(third.grows(0), Some(("lines.txt", 4)));
    assert_eq!(third.graph.grown(&third), &[1]);
}

/// Only the lines found are tasks: the places past them are counted
/// nowhere, a task that found none grows nothing, and the gather starts
/// once the tasks that exist are done; restored from records, the engine
/// knows the same tasks.
#[test]
fn a_grown_stage_has_a_task_per_line_found_and_its_gather_waits_for_those_only() {
    let def = grown_farm(3, 4);
    assert_eq!(def.stages[1].len(), 12);
    let mut e = Engine::new(parse_resources("cpu=16").unwrap());
    let slot = e.add_farm(0, def.clone(), vec![], &AddOptions::default());
    let (starts, actions) = drain(&mut e);
    assert_eq!(starts.len(), 3, "only `up` runs before it ends");
    let mut records = Vec::new();
    let grew = [2u32, 0, 4];
    for (s, n) in starts.iter().zip(grew) {
        e.task_finished(
            1,
            s.0,
            s.1,
            s.2,
            Outcome {
                grew: Some(n),
                ..ok()
            },
        );
    }
    let (grown, more) = drain(&mut e);
    let mut got: Vec<u32> = grown.iter().map(|s| s.1.index).collect();
    got.sort_unstable();
    assert_eq!(
        got,
        vec![0, 1, 8, 9, 10, 11],
        "lines 0-1 of up/0 and 0-3 of up/2"
    );
    assert_eq!(e.stage_progress(slot)[1].total, 6);
    for s in &grown[..5] {
        e.task_finished(2, s.0, s.1, s.2, ok());
    }
    assert!(
        drain(&mut e).0.is_empty(),
        "the gather waits for the last grown task"
    );
    e.task_finished(3, grown[5].0, grown[5].1, grown[5].2, ok());
    let (gather, _) = drain(&mut e);
    assert_eq!(
        gather.iter().map(|s| s.1).collect::<Vec<_>>(),
        vec![TaskRef::new(2, 0)]
    );
    e.audit().unwrap();
    for a in actions.into_iter().chain(more) {
        if let Action::Persist(Persist::Task { task, record, .. }) = a {
            records.push((task, record));
        }
    }
    // The records of `up` say what each grew; restored, the same places
    // are tasks, and the grown ones run again (their ends were not kept here).
    let done: Vec<(TaskRef, TaskRecord)> = records
        .into_iter()
        .filter(|(t, r)| t.stage == 0 && r.state == RecordState::Done)
        .collect();
    assert_eq!(done.len(), 3);
    let mut e = Engine::new(parse_resources("cpu=16").unwrap());
    let slot = e.add_farm(0, def, done, &AddOptions::default());
    let (again, _) = drain(&mut e);
    let mut got: Vec<u32> = again.iter().map(|s| s.1.index).collect();
    got.sort_unstable();
    assert_eq!(got, vec![0, 1, 8, 9, 10, 11]);
    assert_eq!(e.stage_progress(slot)[1].total, 6);
    e.audit().unwrap();
}

/// A merge per key waits for its key's tasks only: it starts while the
/// other key's tasks still run, and a failure skips its own key's merge.
#[test]
fn a_keyed_gather_starts_with_its_own_key_and_a_failure_skips_only_its_key() {
    let vals = |v: &[&str]| Values::List(v.iter().map(|s| s.to_string()).collect());
    let split = StageDef::new(
        "split",
        CommandTemplate::Argv(vec![Template::literal("true")]),
        Sweep {
            vars: vec![
                SweepVar {
                    name: "k".into(),
                    values: vals(&["x", "y"]),
                },
                SweepVar {
                    name: "j".into(),
                    values: vals(&["0", "1", "2"]),
                },
            ],
            mode: SweepMode::Product,
        },
    );
    let mut merge = StageDef::new(
        "merge",
        CommandTemplate::Argv(vec![Template::literal("true")]),
        Sweep {
            vars: vec![SweepVar {
                name: "k".into(),
                values: vals(&["x", "y"]),
            }],
            mode: SweepMode::Product,
        },
    );
    merge.deps = vec![Dep {
        stage: 0,
        on: DepOn::Keyed {
            down: vec![0],
            up: vec![0],
        },
    }];
    let mut e = Engine::new(parse_resources("cpu=8").unwrap());
    let slot = e.add_farm(0, farm(vec![split, merge]), vec![], &AddOptions::default());
    let (starts, _) = drain(&mut e);
    assert_eq!(starts.len(), 6, "every split task, no merge");
    // Key x is split/0..3: done, merge/0 starts while y's run.
    for s in starts.iter().filter(|s| s.1.index < 3) {
        e.task_finished(1, s.0, s.1, s.2, ok());
    }
    let (s2, _) = drain(&mut e);
    assert_eq!(
        s2.iter().map(|s| s.1).collect::<Vec<_>>(),
        vec![TaskRef::new(1, 0)]
    );
    // One of y's fails: merge/1 is skipped, the rest end.
    let y: Vec<_> = starts.iter().filter(|s| s.1.index >= 3).collect();
    e.task_finished(2, y[0].0, y[0].1, y[0].2, fail());
    for s in &y[1..] {
        e.task_finished(2, s.0, s.1, s.2, ok());
    }
    e.task_finished(3, s2[0].0, s2[0].1, s2[0].2, ok());
    let p = e.stage_progress(slot);
    assert_eq!((p[1].done, p[1].skipped), (1, 1));
    assert!(e.progress(slot).finished());
}

#[test]
fn failures_retry_then_fail_and_skip_dependents() {
    let mut a = stage("a", 1);
    a.retries = 1;
    let mut b = stage("b", 1);
    b.after_each = vec![0];
    let mut e = Engine::new(parse_resources("cpu=1").unwrap());
    let slot = e.add_farm(0, farm(vec![a, b]), vec![], &AddOptions::default());
    let (s, _) = drain(&mut e);
    e.task_finished(1, s[0].0, s[0].1, 1, fail());
    let (s, other) = drain(&mut e);
    assert_eq!(s[0].2, 2, "retried as attempt 2");
    assert!(other.iter().any(|a| matches!(
        a,
        Action::Emit(Event::TaskFinished {
            verdict: Verdict::Retry,
            ..
        })
    )));
    e.task_finished(2, s[0].0, s[0].1, 2, fail());
    let (s, _) = drain(&mut e);
    assert!(s.is_empty());
    let p = e.progress(slot);
    assert_eq!((p.failed, p.skipped, p.done), (1, 1, 0));
    assert!(p.finished());
}

/// The two sides of a partition: one failed a task for good (its
/// dependents were skipped), the other finished it. Merged, done wins, and
/// what was skipped only because of that failure runs after all; what
/// another failure still blocks stays skipped until that one is won too.
#[test]
fn a_done_that_wins_over_a_failure_revives_what_the_failure_skipped() {
    let a = stage("a", 2);
    let mut b = stage("b", 2);
    b.after_each = vec![0];
    let mut c = stage("c", 1);
    c.after = vec![1];
    let mut e = Engine::remote(vec![parse_resources("cpu=8").unwrap()]);
    let slot = e.add_farm(0, farm(vec![a, b, c]), vec![], &AddOptions::default());
    let t = |stage, index| TaskRef { stage, index };
    let claimed = e.claim(0, 10, &mut |_, _| true);
    assert_eq!(claimed.len(), 2, "only a is ready: {claimed:?}");
    for (f, task, att) in claimed {
        e.task_finished(1, f, task, att, fail());
    }
    let p = e.progress(slot);
    assert_eq!((p.failed, p.skipped), (2, 3), "{p:?}");
    assert!(p.finished());

    // The other side finished a/0: b/0 waits on nothing that failed; c
    // waits on all of b, and b/1 is still skipped.
    assert!(e.mark_done(2, slot, t(0, 0), None));
    e.audit().unwrap();
    let st = |e: &Engine| e.stage_progress(slot);
    assert_eq!((st(&e)[1].skipped, st(&e)[2].skipped), (1, 1));
    let claimed = e.claim(2, 10, &mut |_, _| true);
    assert_eq!(
        claimed.iter().map(|c| c.1).collect::<Vec<_>>(),
        vec![t(1, 0)]
    );
    for (f, task, att) in claimed {
        e.task_finished(3, f, task, att, ok());
    }
    let p = e.progress(slot);
    assert_eq!((p.done, p.failed, p.skipped), (2, 1, 2), "{p:?}");

    // Then a/1 too: b/1 and c run, and the farm ends with everything done.
    assert!(e.mark_done(4, slot, t(0, 1), None));
    e.audit().unwrap();
    for _ in 0..3 {
        for (f, task, att) in e.claim(5, 10, &mut |_, _| true) {
            e.task_finished(6, f, task, att, ok());
        }
    }
    let p = e.progress(slot);
    assert_eq!((p.done, p.failed, p.skipped), (5, 0, 0), "{p:?}");
    assert!(p.finished());
}

/// The backlog is what could be handed out now: a stage readied task by
/// task counts only its ready tasks, not those waiting for their
/// dependencies (a coordinator that counted them never found its backlog
/// empty, so its idle nodes neither heard of new ready work nor stole).
#[test]
fn the_backlog_counts_only_tasks_ready_to_hand_out() {
    let a = stage("a", 3);
    let mut b = stage("b", 3);
    b.after_each = vec![0];
    let mut e = Engine::remote(vec![parse_resources("cpu=8").unwrap()]);
    e.add_farm(0, farm(vec![a, b]), vec![], &AddOptions::default());
    assert_eq!(e.backlog(), 3, "a's three; b's wait for them");
    let claimed = e.claim(0, 10, &mut |_, _| true);
    assert_eq!((claimed.len(), e.backlog()), (3, 0));
    let waiting: u64 = e.waiting_stages().map(|(_, q)| q).sum();
    assert_eq!(waiting, 0, "nothing ready waits");
    let (f, task, att) = claimed[1];
    e.task_finished(1, f, task, att, ok());
    assert_eq!(e.backlog(), 1, "b/1 is ready");
    assert_eq!(e.claim(2, 10, &mut |_, _| true).len(), 1);
    assert_eq!(e.backlog(), 0);
    e.audit().unwrap();
}

/// A coordinator that took a farm over across a partition hands out from
/// the last index down: what was done is skipped, tasks that become ready
/// together go highest first, and a task handed back still goes first.
#[test]
fn a_descending_engine_hands_out_from_the_last_index_down() {
    let a = stage("a", 5);
    let mut b = stage("b", 5);
    b.after_each = vec![0];
    let mut e = Engine::remote(vec![parse_resources("cpu=8").unwrap()]);
    let t = |stage, index| TaskRef { stage, index };
    let done = [t(0, 0), t(0, 1), t(0, 4)];
    let slot = e.add_farm(
        0,
        farm(vec![a, b]),
        done.map(|t| (t, TaskRecord::known_done(0))),
        &AddOptions::default(),
    );
    let down = Order {
        fronts: vec![Front {
            start: 0,
            way: Way::Down,
            weight: 1,
        }],
    };
    e.reorder(slot, &[down.clone(), down]);
    let tasks = |c: Vec<(FarmSlot, TaskRef, u32)>| c.into_iter().map(|c| c.1).collect::<Vec<_>>();
    // Downstream first (its stage is deeper), then a's pending from the top.
    assert_eq!(
        tasks(e.claim(0, 4, &mut |_, _| true)),
        vec![t(1, 4), t(1, 1), t(1, 0), t(0, 3)]
    );
    let claimed = e.claim(0, 1, &mut |_, _| true);
    assert_eq!(tasks(claimed.clone()), vec![t(0, 2)]);
    let (f, task, att) = claimed[0];
    e.unclaim(1, f, task, att);
    assert_eq!(tasks(e.claim(1, 1, &mut |_, _| true)), vec![t(0, 2)]);
    e.audit().unwrap();
    // b/2 and b/3 wait for a/2 and a/3.
    assert_eq!(e.progress(slot).queued(), 2);
}

/// A side that took a farm over away from both ends of it hands out
/// from its fronts in turn, each as often as its weight says; tasks ready
/// together go in the same order, and a task handed back still goes first.
#[test]
fn an_engine_with_several_fronts_hands_out_from_each_in_turn() {
    let a = stage("a", 8);
    let mut b = stage("b", 8);
    b.after_each = vec![0];
    let mut e = Engine::remote(vec![parse_resources("cpu=8").unwrap()]);
    let t = |stage, index| TaskRef { stage, index };
    let done = [t(0, 0), t(0, 3), t(0, 4)];
    let slot = e.add_farm(
        0,
        farm(vec![a, b]),
        done.map(|t| (t, TaskRecord::known_done(0))),
        &AddOptions::default(),
    );
    // Up from 3 (twice the turns), down from 3 (from 2).
    let middle = Order {
        fronts: vec![
            Front {
                start: 3,
                way: Way::Up,
                weight: 2,
            },
            Front {
                start: 3,
                way: Way::Down,
                weight: 1,
            },
        ],
    };
    e.reorder(slot, &[middle.clone(), middle]);
    let tasks = |c: Vec<(FarmSlot, TaskRef, u32)>| c.into_iter().map(|c| c.1).collect::<Vec<_>>();
    // b: ready together (3, 4, 0) nearest the starts first; then a: 5, 2, 6, 7, 1.
    assert_eq!(
        tasks(e.claim(0, 7, &mut |_, _| true)),
        vec![
            t(1, 3),
            t(1, 4),
            t(1, 0),
            t(0, 5),
            t(0, 2),
            t(0, 6),
            t(0, 7)
        ]
    );
    let claimed = e.claim(0, 1, &mut |_, _| true);
    assert_eq!(tasks(claimed.clone()), vec![t(0, 1)]);
    let (f, task, att) = claimed[0];
    e.unclaim(1, f, task, att);
    assert_eq!(tasks(e.claim(1, 1, &mut |_, _| true)), vec![t(0, 1)]);
    e.audit().unwrap();
}

#[test]
fn timeouts_kill_and_count_as_failures() {
    let mut a = stage("a", 1);
    a.timeout_ms = Some(100);
    let mut e = Engine::new(parse_resources("cpu=1").unwrap());
    let slot = e.add_farm(0, farm(vec![a]), vec![], &AddOptions::default());
    let (s, _) = drain(&mut e);
    assert_eq!(e.poll_timeout(), Some(100));
    e.handle_timeout(99);
    assert!(e.poll_action().is_none());
    e.handle_timeout(100);
    let kill = e.poll_action().unwrap();
    assert!(matches!(
        kill,
        Action::Kill {
            reason: KillReason::Timeout,
            ..
        }
    ));
    // Resources stay held until the process is really gone.
    assert_eq!(e.free().get("cpu"), Amount::ZERO);
    e.task_finished(
        150,
        slot,
        s[0].1,
        1,
        Outcome {
            result: TaskResult::Signaled(9),
            ..ok()
        },
    );
    let (_, other) = drain(&mut e);
    assert!(other.iter().any(|a| matches!(
        a,
        Action::Persist(Persist::Task {
            record: TaskRecord {
                run: 0,
                state: RecordState::Failed,
                end: Some(TaskEnd::TimedOut { after_ms: 100 }),
                ..
            },
            ..
        })
    )));
}

#[test]
fn unplaceable_stage_is_reported_not_left_waiting() {
    let mut g = stage("g", 2);
    g.resources = parse_resources("cpu=1,gpu=1").unwrap();
    let mut after = stage("after", 1);
    after.after = vec![0];
    let mut e = Engine::new(parse_resources("cpu=4").unwrap());
    let slot = e.add_farm(0, farm(vec![g, after]), vec![], &AddOptions::default());
    let (s, other) = drain(&mut e);
    assert!(s.is_empty());
    assert!(other
        .iter()
        .any(|a| matches!(a, Action::Emit(Event::Unplaceable { stage: 0, .. }))));
    let p = e.progress(slot);
    assert_eq!((p.failed, p.skipped), (2, 1));
    assert!(other
        .iter()
        .any(|a| matches!(a, Action::Emit(Event::FarmFinished { .. }))));
}

#[test]
fn gpus_get_their_own_devices_and_fractions_pack() {
    let mut whole = stage("w", 3);
    whole.resources = parse_resources("cpu=0,gpu=1").unwrap();
    let mut e = Engine::new(parse_resources("cpu=4,gpu=2").unwrap());
    e.add_farm(0, farm(vec![whole]), vec![], &AddOptions::default());
    let (s, _) = drain(&mut e);
    let mut devices: Vec<_> = s.iter().flat_map(|s| s.3.gpus.clone()).collect();
    devices.sort();
    assert_eq!(
        devices,
        vec![0, 1],
        "two tasks, two distinct devices; the third waits"
    );

    let mut half = stage("h", 4);
    half.resources = parse_resources("cpu=0,gpu=0.5").unwrap();
    let mut e = Engine::new(parse_resources("cpu=4,gpu=2").unwrap());
    e.add_farm(0, farm(vec![half]), vec![], &AddOptions::default());
    let (s, _) = drain(&mut e);
    let mut devices: Vec<_> = s.iter().flat_map(|s| s.3.gpus.clone()).collect();
    devices.sort();
    assert_eq!(devices, vec![0, 0, 1, 1]);
}

#[test]
fn restore_skips_done_and_reruns_running_with_higher_attempt() {
    let rec = |state, attempt| TaskRecord {
        state,
        attempt,
        ..TaskRecord::known_done(0)
    };
    let restored = vec![
        (TaskRef::new(0, 0), rec(RecordState::Done, 1)),
        (TaskRef::new(0, 1), rec(RecordState::Running, 1)),
        (TaskRef::new(0, 2), rec(RecordState::Interrupted, 2)),
    ];
    let mut e = Engine::new(parse_resources("cpu=8").unwrap());
    let slot = e.add_farm(
        0,
        farm(vec![stage("a", 4)]),
        restored,
        &AddOptions::default(),
    );
    let (s, other) = drain(&mut e);
    let mut got: Vec<_> = s.iter().map(|s| (s.1.index, s.2)).collect();
    got.sort();
    assert_eq!(got, vec![(1, 2), (2, 3), (3, 1)]);
    assert_eq!(e.progress(slot).done, 1);
    // The crash is recorded before the rerun starts.
    assert!(other.iter().any(|a| matches!(
        a,
        Action::Persist(Persist::Task {
            task: TaskRef { index: 1, .. },
            record: TaskRecord { crashes: 1, .. },
            ..
        })
    )));
}

#[test]
fn a_task_that_keeps_crashing_the_node_is_failed() {
    let restored = vec![(
        TaskRef::new(0, 0),
        TaskRecord {
            state: RecordState::Running,
            attempt: 3,
            crashes: CRASHES_MAX - 1,
            ..TaskRecord::known_done(0)
        },
    )];
    let mut e = Engine::new(parse_resources("cpu=1").unwrap());
    let slot = e.add_farm(
        0,
        farm(vec![stage("a", 1)]),
        restored,
        &AddOptions::default(),
    );
    let (s, _) = drain(&mut e);
    assert!(s.is_empty());
    assert_eq!(e.progress(slot).failed, 1);
}

#[test]
fn interrupt_kills_and_records_interrupted() {
    let mut e = Engine::new(parse_resources("cpu=2").unwrap());
    let slot = e.add_farm(0, farm(vec![stage("a", 4)]), vec![], &AddOptions::default());
    let (s, _) = drain(&mut e);
    e.interrupt();
    let (_, other) = drain(&mut e);
    assert_eq!(
        other
            .iter()
            .filter(|a| matches!(
                a,
                Action::Kill {
                    reason: KillReason::Interrupt,
                    ..
                }
            ))
            .count(),
        2
    );
    for (f, t, a, _) in s {
        e.task_finished(
            5,
            f,
            t,
            a,
            Outcome {
                result: TaskResult::Signaled(15),
                ..ok()
            },
        );
    }
    let (starts, other) = drain(&mut e);
    assert!(starts.is_empty(), "nothing starts after an interrupt");
    assert_eq!(
        other
            .iter()
            .filter(|a| matches!(
                a,
                Action::Persist(Persist::Task {
                    record: TaskRecord {
                        run: 0,
                        state: RecordState::Interrupted,
                        ..
                    },
                    ..
                })
            ))
            .count(),
        2
    );
    assert_eq!(e.progress(slot).failed, 0);
}

#[test]
fn stale_reports_are_ignored() {
    let mut e = Engine::new(parse_resources("cpu=1").unwrap());
    let slot = e.add_farm(0, farm(vec![stage("a", 1)]), vec![], &AddOptions::default());
    let (s, _) = drain(&mut e);
    e.task_finished(1, slot, s[0].1, 7, ok());
    assert_eq!(e.progress(slot).done, 0);
    assert_eq!(e.running_count(), 1);
}

/// The failure of the issue that brought `max_fails`: a bare program name
/// that is not on PATH, said with the task's own folder.
fn cannot_start(i: u32) -> Outcome {
    Outcome {
        result: TaskResult::Error(format!(
            "could not start `wrapper.sh` in /r/runs/{i}: No such file or directory (os error 2)"
        )),
        ..ok()
    }
}

fn exited(code: i32, line: &str) -> Outcome {
    Outcome {
        result: TaskResult::Exited(code),
        stderr_line: Some(line.to_string()),
        ..ok()
    }
}

/// Runs what the engine starts to its end, each attempt ending as `end`
/// says, until nothing runs. Returns the attempts in order, and every
/// other action.
fn run_all(
    e: &mut Engine,
    mut end: impl FnMut(TaskRef, u32) -> Outcome,
) -> (Vec<(TaskRef, u32)>, Vec<Action>) {
    let (mut live, mut other) = drain(e);
    let mut ran = Vec::new();
    while !live.is_empty() {
        let (f, t, a, _) = live.remove(0);
        ran.push((t, a));
        e.task_finished(1, f, t, a, end(t, a));
        let (more, o) = drain(e);
        live.extend(more);
        other.extend(o);
    }
    (ran, other)
}

fn stops(other: &[Action]) -> Vec<(u32, Stop)> {
    other
        .iter()
        .filter_map(|a| match a {
            Action::Emit(Event::StageStopped { stage, stop, .. }) => Some((*stage, stop.clone())),
            _ => None,
        })
        .collect()
}

/// The records a store would keep: the last one of each task.
fn records(other: &[Action]) -> Vec<(TaskRef, TaskRecord)> {
    let mut last = std::collections::BTreeMap::new();
    for a in other {
        if let Action::Persist(Persist::Task { task, record, .. }) = a {
            last.insert(*task, record.clone());
        }
    }
    last.into_iter().collect()
}

#[test]
fn a_stage_whose_first_attempts_fail_alike_stops_and_its_other_tasks_wait() {
    let mut a = stage("solve", 20);
    a.retries = 1;
    let mut b = stage("report", 1);
    b.after = vec![0];
    let def = farm(vec![a, b]);
    let mut e = Engine::new(parse_resources("cpu=1").unwrap());
    let slot = e.add_farm(0, def.clone(), vec![], &AddOptions::default());
    let (ran, other) = run_all(&mut e, |t, _| cannot_start(t.index));
    // solve/0 twice, solve/1 twice, solve/2 once: five alike, and no more.
    let t = |i| TaskRef::new(0, i);
    assert_eq!(
        ran,
        vec![(t(0), 1), (t(0), 2), (t(1), 1), (t(1), 2), (t(2), 1)]
    );
    let stopped = stops(&other);
    assert_eq!(stopped.len(), 1, "one stop is said: {other:?}");
    let (stage, stop) = &stopped[0];
    assert_eq!(
        (*stage, stop.attempts, stop.tasks, stop.task),
        (0, 5, 3, t(0))
    );
    assert!(
        matches!(&stop.end, TaskEnd::Error(e) if e.contains("`wrapper.sh` in /r/runs/0")),
        "{stop:?}"
    );
    // The stop is persisted before it is said, and said after the
    // failure that brought it.
    let at = |want: &dyn Fn(&Action) -> bool| other.iter().position(want).unwrap();
    let persisted = at(&|a| matches!(a, Action::Persist(Persist::Stage { stop: Some(_), .. })));
    let said = at(&|a| matches!(a, Action::Emit(Event::StageStopped { .. })));
    let fifth = at(
        &|a| matches!(a, Action::Emit(Event::TaskFinished { task, verdict: Verdict::Stopped, .. }) if *task == t(2)),
    );
    assert!(fifth < persisted && persisted < said, "{other:?}");
    let c = e.stage_progress(slot);
    assert_eq!((c[0].failed, c[0].stopped, c[0].queued()), (2, 18, 0));
    assert_eq!(c[1].skipped, 1, "what waits on the stage is skipped");
    assert!(e.progress(slot).finished());
    assert!(other
        .iter()
        .any(|a| matches!(a, Action::Emit(Event::FarmFinished { .. }))));
    assert_eq!(e.stage_stop(slot, 0), Some(stop));

    // No record says a held task failed: a resume runs them, and with the
    // stopped stage named, the two that failed for good too.
    let kept = records(&other);
    assert_eq!(kept.len(), 3);
    assert!(kept
        .iter()
        .all(|(t, r)| (r.state == RecordState::Failed) == (t.index < 2)));
    for (retry_stages, ran_again) in [(vec![], 18), (vec![0], 20)] {
        let mut e = Engine::new(parse_resources("cpu=1").unwrap());
        let opts = AddOptions {
            retry_stages,
            ..AddOptions::default()
        };
        let slot = e.add_farm(0, def.clone(), kept.clone(), &opts);
        let (ran, _) = run_all(&mut e, |_, _| ok());
        let p = e.stage_progress(slot);
        assert_eq!(ran.iter().filter(|r| r.0.stage == 0).count(), ran_again);
        assert_eq!(p[0].done, ran_again as u64);
        assert_eq!(p[1].done, u64::from(ran_again == 20));
        // The one held with a retry left goes on from its attempt.
        assert!(ran.contains(&(t(2), 2)), "{ran:?}");
    }
}

#[test]
fn a_stage_with_an_early_success_is_never_stopped() {
    let mut e = Engine::new(parse_resources("cpu=1").unwrap());
    let slot = e.add_farm(
        0,
        farm(vec![stage("a", 12)]),
        vec![],
        &AddOptions::default(),
    );
    let (ran, other) = run_all(&mut e, |t, _| {
        if t.index == 0 {
            ok()
        } else {
            cannot_start(t.index)
        }
    });
    assert_eq!(ran.len(), 12, "every task ran");
    assert!(stops(&other).is_empty());
    let p = e.progress(slot);
    assert_eq!((p.done, p.failed, p.stopped), (1, 11, 0));
}

#[test]
fn failures_that_differ_do_not_stop_a_stage() {
    let mut e = Engine::new(parse_resources("cpu=1").unwrap());
    let slot = e.add_farm(
        0,
        farm(vec![stage("a", 12)]),
        vec![],
        &AddOptions::default(),
    );
    // Four alike, then a fifth that says something else.
    let (ran, other) = run_all(&mut e, |t, _| match t.index {
        4 => exited(1, "MemoryError"),
        i => exited(
            1,
            &format!("ModuleNotFoundError: no module named `solver{i}`"),
        ),
    });
    assert_eq!(ran.len(), 12);
    assert!(stops(&other).is_empty());
    assert_eq!(e.progress(slot).failed, 12);
    // Another exit code is another failure too.
    let mut e = Engine::new(parse_resources("cpu=1").unwrap());
    e.add_farm(
        0,
        farm(vec![stage("a", 12)]),
        vec![],
        &AddOptions::default(),
    );
    let (ran, other) = run_all(&mut e, |t, _| exited(1 + (t.index as i32 % 2), "boom"));
    assert_eq!((ran.len(), stops(&other).len()), (12, 0));
}

#[test]
fn max_fails_is_set_per_stage_and_zero_turns_it_off() {
    let mut two = stage("two", 10);
    two.max_fails = 2;
    let mut off = stage("off", 10);
    off.max_fails = 0;
    let mut e = Engine::new(parse_resources("cpu=1").unwrap());
    let slot = e.add_farm(0, farm(vec![two, off]), vec![], &AddOptions::default());
    let (ran, other) = run_all(&mut e, |_, _| exited(127, "wrapper.sh: not found"));
    let ran_of = |s| ran.iter().filter(|r| r.0.stage == s).count();
    assert_eq!((ran_of(0), ran_of(1)), (2, 10));
    let stopped = stops(&other);
    assert_eq!(stopped.len(), 1);
    assert_eq!((stopped[0].0, stopped[0].1.attempts), (0, 2));
    let c = e.stage_progress(slot);
    assert_eq!((c[0].failed, c[0].stopped), (2, 8));
    assert_eq!((c[1].failed, c[1].stopped), (10, 0));
}

/// A stage all of whose attempts have been made has nothing left to hold:
/// its failures end it as usual, and no stop is said.
#[test]
fn a_stage_with_nothing_left_to_start_is_not_stopped() {
    let mut e = Engine::new(parse_resources("cpu=8").unwrap());
    let slot = e.add_farm(0, farm(vec![stage("a", 6)]), vec![], &AddOptions::default());
    assert!(e.stage_may_stop(slot, 0));
    let (ran, other) = run_all(&mut e, |t, _| cannot_start(t.index));
    assert_eq!(ran.len(), 6);
    assert!(stops(&other).is_empty());
    assert_eq!(e.progress(slot).failed, 6);
    // One whose tasks and retries make fewer attempts than max_fails
    // never stops: a driver need not hold its failures back.
    let mut small = stage("small", 2);
    small.retries = 1;
    let mut e = Engine::new(parse_resources("cpu=8").unwrap());
    let slot = e.add_farm(0, farm(vec![small]), vec![], &AddOptions::default());
    assert!(!e.stage_may_stop(slot, 0));
}

#[test]
fn a_success_of_a_task_running_when_its_stage_stopped_lets_it_go_on() {
    let mut b = stage("b", 20);
    b.after_each = vec![0];
    let mut e = Engine::new(parse_resources("cpu=6").unwrap());
    let slot = e.add_farm(
        0,
        farm(vec![stage("a", 20), b]),
        vec![],
        &AddOptions::default(),
    );
    let (mut live, _) = drain(&mut e);
    assert_eq!(live.len(), 6);
    // Five fail alike, each making room for one more: the stage stops
    // with a/5 to a/9 running.
    let mut other = Vec::new();
    for _ in 0..5 {
        let (f, t, a, _) = live.remove(0);
        e.task_finished(1, f, t, a, exited(2, "no such file: input.dat"));
        let (starts, o) = drain(&mut e);
        live.extend(starts);
        other.extend(o);
    }
    assert_eq!(stops(&other).len(), 1);
    let running: Vec<u32> = live.iter().map(|l| l.1.index).collect();
    assert_eq!(running, vec![5, 6, 7, 8, 9]);
    assert_eq!(e.stage_progress(slot)[0].stopped, 10);
    assert!(!e.stage_may_stop(slot, 0));
    // a/5 succeeds: the failures were those tasks' own.
    let (f, t, a, _) = live.remove(0);
    e.task_finished(2, f, t, a, ok());
    let (starts, other) = drain(&mut e);
    assert!(other.iter().any(|a| matches!(
        a,
        Action::Emit(Event::StageResumed { stage: 0, task, .. }) if *task == t
    )));
    assert!(other
        .iter()
        .any(|a| matches!(a, Action::Persist(Persist::Stage { stop: None, .. }))));
    assert_eq!(e.stage_stop(slot, 0), None);
    let mut started: Vec<TaskRef> = starts.iter().map(|s| s.1).collect();
    started.sort();
    assert_eq!(
        started,
        vec![TaskRef::new(0, 10), TaskRef::new(1, 5)],
        "b/5 follows its a; the held tasks of a start again"
    );
    let c = e.stage_progress(slot);
    assert_eq!((c[0].stopped, c[0].queued()), (0, 9));
}

/// The mesh's coordinator, which hands tasks out by `claim`, stops a stage
/// the same way: by what its workers report, on whichever node.
#[test]
fn a_remote_engine_stops_a_stage_too() {
    let mut e = Engine::remote(vec![parse_resources("cpu=4").unwrap()]);
    let slot = e.add_farm(
        0,
        farm(vec![stage("a", 50)]),
        vec![],
        &AddOptions::default(),
    );
    let mut claimed = 0;
    loop {
        let batch = e.claim(0, 3, &mut |_, _| true);
        if batch.is_empty() {
            break;
        }
        claimed += batch.len();
        for (f, t, a) in batch {
            let node = t.index % 3;
            let end = Outcome {
                result: TaskResult::Error(format!(
                    "could not start `solve` in /state/n{node}/work/7/root: Permission denied (os error 13)"
                )),
                ..ok()
            };
            e.task_finished(1, f, t, a, end);
        }
    }
    e.audit().unwrap();
    assert_eq!(
        claimed, 6,
        "two batches of three: the stop came in the second"
    );
    let p = e.progress(slot);
    assert_eq!((p.failed, p.stopped), (6, 44));
    assert!(p.finished());
}

#[derive(Clone, Debug)]
enum Op {
    Finish {
        pick: usize,
        code: i32,
    },
    Tick(u64),
    Cancel,
    /// One task of stage `stage % 4`, index `index % n`: a client's future.
    CancelTask {
        stage: u32,
        index: u32,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (any::<usize>(), prop_oneof![3 => Just(0), 1 => Just(1), 1 => Just(2)]).prop_map(|(pick, code)| Op::Finish { pick, code }),
        2 => (1u64..200).prop_map(Op::Tick),
        1 => Just(Op::Cancel),
        2 => (any::<u32>(), any::<u32>()).prop_map(|(stage, index)| Op::CancelTask { stage, index }),
    ]
}

fn order() -> impl Strategy<Value = Order> {
    let way = prop_oneof![Just(Way::Up), Just(Way::Down)];
    let front =
        (any::<u32>(), way, 1u32..4).prop_map(|(start, way, weight)| Front { start, way, weight });
    proptest::collection::vec(front, 0..4).prop_map(|fronts| Order { fronts })
}

proptest! {
    /// Random completions, failures, timeouts and cancels on a three-stage
    /// farm: invariants hold after every step, nothing starts twice while
    /// live, and the farm always ends with every task accounted for.
    #[test]
    fn random_operation_sequences_keep_invariants(
        ops in proptest::collection::vec(op(), 0..200),
        cpus in 1u64..5,
        n in 1u64..8,
        retries in 0u32..3,
        max_fails in 0u32..4,
        orders in proptest::collection::vec(order(), 0..4),
    ) {
        let mut a = stage("a", n);
        a.retries = retries;
        a.max_fails = max_fails;
        a.timeout_ms = Some(150);
        let mut b = stage("b", n);
        b.after_each = vec![0];
        b.resources = parse_resources("cpu=1,gpu=0.5").unwrap();
        let mut c = stage("c", 2);
        c.after = vec![1];
        // Each task of d waits for a's task of its index and a/0.
        let mut d = stage("d", n);
        d.deps = vec![Dep {
            stage: 0,
            on: DepOn::Listed { tasks: Template::parse("{i} 0", &["i"]).unwrap(), var: None },
        }];
        let mut e = Engine::new(parse_resources(&format!("cpu={cpus},gpu=1")).unwrap());
        let slot = e.add_farm(0, farm(vec![a, b, c, d]), vec![], &AddOptions::default());
        // Tasks of the first index up may have started: the orders from
        // now on.
        e.reorder(slot, &orders);
        let mut now = 0;
        let mut live: Vec<(FarmSlot, TaskRef, u32)> = Vec::new();
        let collect = |e: &mut Engine, live: &mut Vec<(FarmSlot, TaskRef, u32)>| {
            let (starts, _) = drain(e);
            for (f, t, att, _) in starts {
                assert!(!live.iter().any(|l| l.1 == t), "{t:?} started while live");
                if t.stage == 3 {
                    let a = &e.farms[f.0 as usize].stages[0].status;
                    assert!(a[t.index as usize] == DONE && a[0] == DONE, "{t:?} started before a/{} and a/0", t.index);
                }
                live.push((f, t, att));
            }
        };
        collect(&mut e, &mut live);
        for op in ops.into_iter().chain(std::iter::repeat_n(Op::Finish { pick: 0, code: 0 }, 100)) {
            match op {
                Op::Finish { pick, code } if !live.is_empty() => {
                    let (f, t, att) = live.remove(pick % live.len());
                    e.task_finished(now, f, t, att, Outcome { result: TaskResult::Exited(code), ..ok() });
                }
                Op::Finish { .. } => {}
                Op::Tick(d) => {
                    now += d;
                    e.handle_timeout(now);
                }
                Op::Cancel => e.cancel(slot),
                Op::CancelTask { stage, index } => {
                    let s = stage % 4;
                    let len = if s == 2 { 2 } else { n as u32 };
                    e.cancel_task(slot, TaskRef::new(s, index % len));
                }
            }
            collect(&mut e, &mut live);
        }
        let p = e.progress(slot);
        prop_assert!(p.finished(), "not finished: {:?}", p);
        prop_assert_eq!(p.done + p.failed + p.skipped + p.cancelled + p.stopped, p.total);
        prop_assert_eq!(e.free(), e.total());
    }
}

/// Of the tasks ready one by one, one whose inputs are where it would go
/// is handed out first; with none such, the order is as before.
#[test]
fn a_claim_prefers_the_ready_task_whose_inputs_are_near() {
    let mut b = stage("b", 4);
    b.after_each = vec![0];
    let mut e = Engine::remote(vec![parse_resources("cpu=8").unwrap()]);
    let slot = e.add_farm(
        0,
        farm(vec![stage("a", 4), b]),
        vec![],
        &AddOptions::default(),
    );
    let a = e.claim(0, 4, &mut |_, _| true);
    for (f, t, att) in &a {
        e.task_finished(1, *f, *t, *att, ok());
    }
    let near = |i: u32| move |_: FarmSlot, t: TaskRef| t == TaskRef::new(1, i);
    let got = e.claim_near(2, 1, &mut |_, _| true, &mut near(2));
    assert_eq!(got[0].1, TaskRef::new(1, 2));
    let got = e.claim_near(2, 1, &mut |_, _| true, &mut |_, _| false);
    assert_eq!(got[0].1, TaskRef::new(1, 0));
    assert_eq!(e.progress(slot).running, 2);
}

/// The passes over a farm's counts and ready work go over the stages
/// that may change: one found settled is passed over until a task of it
/// runs again (a done that wins over a failure revives what the failure
/// skipped; a redo runs a done task again), and is then looked at again.
#[test]
fn a_settled_stage_is_passed_over_until_a_task_of_it_runs_again() {
    let a = stage("a", 2);
    let mut b = stage("b", 2);
    b.after_each = vec![0];
    let mut e = Engine::remote(vec![parse_resources("cpu=8").unwrap()]);
    let slot = e.add_farm(0, farm(vec![a, b]), vec![], &AddOptions::default());
    let t = |stage, index| TaskRef { stage, index };
    let looked = |e: &mut Engine| {
        let mut seen = Vec::new();
        e.live_counts(slot, |s, c| seen.push((s, c.done, c.failed, c.skipped)));
        seen
    };
    assert_eq!(looked(&mut e), vec![(0, 0, 0, 0), (1, 0, 0, 0)]);
    for (f, task, att) in e.claim(0, 10, &mut |_, _| true) {
        e.task_finished(1, f, task, att, fail());
    }
    // Both settle: their last counts are seen once, then neither again.
    assert_eq!(looked(&mut e), vec![(0, 0, 2, 0), (1, 0, 0, 2)]);
    assert_eq!(looked(&mut e), vec![]);
    assert_eq!(e.backlog(), 0);
    e.audit().unwrap();

    // a/0 was done on the other side of a partition: b/0 runs after all.
    assert!(e.mark_done(2, slot, t(0, 0), None));
    e.audit().unwrap();
    assert_eq!(e.backlog(), 1);
    assert_eq!(looked(&mut e), vec![(0, 1, 1, 0), (1, 0, 0, 1)]);
    let claimed = e.claim(3, 10, &mut |_, _| true);
    assert_eq!(
        claimed.iter().map(|c| c.1).collect::<Vec<_>>(),
        vec![t(1, 0)]
    );
    for (f, task, att) in claimed {
        e.task_finished(4, f, task, att, ok());
    }
    assert_eq!(looked(&mut e), vec![(1, 1, 0, 1)]);
    assert_eq!(looked(&mut e), vec![]);

    // Its outputs lost with a node: b/0 runs again.
    assert!(e.redo(slot, t(1, 0)));
    e.audit().unwrap();
    assert_eq!(e.backlog(), 1);
    assert_eq!(looked(&mut e), vec![(1, 0, 0, 1)]);
    e.audit().unwrap();
}
