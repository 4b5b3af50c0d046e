//! A farm that grows while it runs: stages added mid-run and after what they depend on ended, a failure upstream, records restored, and the close.

use super::super::tests::{fail, farm, ok, stage};
use super::super::*;
use crate::farm::graph::{Dep, DepOn};
use crate::farm::{StageDef, TaskRef, Template};
use crate::resources::parse_resources;

/// The tasks started since last asked, and whether the farm was said finished.
fn drain(e: &mut Engine) -> (Vec<(FarmSlot, TaskRef, u32)>, bool) {
    let (mut starts, mut finished) = (Vec::new(), false);
    while let Some(a) = e.poll_action() {
        match a {
            Action::Start {
                farm,
                task,
                attempt,
                ..
            } => starts.push((farm, task, attempt)),
            Action::Emit(Event::FarmFinished { .. }) => finished = true,
            _ => {}
        }
    }
    e.audit().unwrap();
    (starts, finished)
}

/// Stage `name`, one task per index of `up`'s, each waiting for `up`'s task of its index.
fn each_of(name: &str, up: u32, n: u64) -> StageDef {
    let mut s = stage(name, n);
    s.deps = vec![Dep {
        stage: up,
        on: DepOn::Listed {
            tasks: Template::parse("{i}", &["i"]).unwrap(),
            var: None,
        },
    }];
    s
}

fn open() -> AddOptions {
    AddOptions {
        open: true,
        ..AddOptions::default()
    }
}

#[test]
fn an_open_farm_grows_mid_run_and_finishes_only_when_closed() {
    let mut e = Engine::new(parse_resources("cpu=8").unwrap());
    let a = stage("a", 3);
    let slot = e.add_farm(0, farm(vec![a.clone()]), vec![], &open());
    let (starts, _) = drain(&mut e);
    assert_eq!(starts.len(), 3);
    // a/0 ends before the stage that waits on it comes.
    e.task_finished(1, slot, starts[0].1, starts[0].2, ok());
    let (more, finished) = drain(&mut e);
    assert!(more.is_empty() && !finished);
    e.extend_farm(2, slot, farm(vec![a.clone(), each_of("b", 0, 3)]), vec![]);
    let (b, _) = drain(&mut e);
    assert_eq!(
        b.iter().map(|s| s.1).collect::<Vec<_>>(),
        vec![TaskRef::new(1, 0)],
        "b/0 starts at once: a/0 is done; b/1 and b/2 wait"
    );
    e.task_finished(3, slot, starts[1].1, starts[1].2, ok());
    let (b1, _) = drain(&mut e);
    assert_eq!(
        b1.iter().map(|s| s.1).collect::<Vec<_>>(),
        vec![TaskRef::new(1, 1)]
    );
    for (f, t, att) in [starts[2]].into_iter().chain(b).chain(b1) {
        e.task_finished(4, f, t, att, ok());
    }
    let (b2, _) = drain(&mut e);
    assert_eq!(b2.len(), 1);
    e.task_finished(5, b2[0].0, b2[0].1, b2[0].2, ok());
    let (_, finished) = drain(&mut e);
    let p = e.progress(slot);
    assert_eq!((p.done, p.total), (6, 6));
    assert!(
        p.finished() && !finished,
        "every task over, but the farm is open"
    );
    e.set_open(slot, false);
    let (_, finished) = drain(&mut e);
    assert!(finished, "closed with every task over: finished");
}

#[test]
fn a_stage_added_after_a_failure_upstream_skips_what_depended_on_it() {
    let mut e = Engine::new(parse_resources("cpu=8").unwrap());
    let a = stage("a", 2);
    let slot = e.add_farm(0, farm(vec![a.clone()]), vec![], &open());
    let (starts, _) = drain(&mut e);
    e.task_finished(1, slot, starts[0].1, starts[0].2, ok());
    e.task_finished(1, slot, starts[1].1, starts[1].2, fail());
    drain(&mut e);
    let mut whole = stage("c", 1);
    whole.after = vec![0];
    e.extend_farm(2, slot, farm(vec![a, each_of("b", 0, 2), whole]), vec![]);
    let (b, _) = drain(&mut e);
    assert_eq!(
        b.iter().map(|s| s.1).collect::<Vec<_>>(),
        vec![TaskRef::new(1, 0)]
    );
    let p = e.stage_progress(slot);
    assert_eq!(
        (p[1].skipped, p[2].skipped),
        (1, 1),
        "b/1 and c wait on a/1, which failed"
    );
}

#[test]
fn a_grown_stage_restores_its_records_and_a_cancelled_farm_runs_nothing_new() {
    let mut e = Engine::remote(vec![parse_resources("cpu=8").unwrap()]);
    let a = stage("a", 2);
    let slot = e.add_farm(0, farm(vec![a.clone()]), vec![], &open());
    let done = TaskRecord::known_done(0);
    // A coordinator elected after b was added heard b/1 end from a holder.
    e.extend_farm(
        1,
        slot,
        farm(vec![a.clone(), stage("b", 2)]),
        vec![
            (TaskRef::new(1, 1), done.clone()),
            (TaskRef::new(0, 0), done),
        ],
    );
    let p = e.stage_progress(slot);
    assert_eq!(
        (p[0].done, p[1].done),
        (0, 1),
        "records of the new stages only"
    );
    e.cancel(slot);
    e.extend_farm(2, slot, farm(vec![a, stage("b", 2), stage("c", 4)]), vec![]);
    assert_eq!(e.stage_progress(slot)[2].cancelled, 4);
}

#[test]
fn an_open_farm_cancelled_is_over_without_being_closed() {
    let mut e = Engine::new(parse_resources("cpu=8").unwrap());
    let slot = e.add_farm(0, farm(vec![stage("a", 3)]), vec![], &open());
    let (starts, _) = drain(&mut e);
    e.task_finished(1, slot, starts[0].1, starts[0].2, ok());
    e.cancel(slot);
    // The two still running are killed; their ends come back.
    for &(f, t, att) in &starts[1..] {
        e.task_finished(2, f, t, att, fail());
    }
    let (_, finished) = drain(&mut e);
    assert!(finished, "cancelled: over, open or not");
}
