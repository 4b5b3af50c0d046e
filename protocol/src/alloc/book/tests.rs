//! The allocation book's tests: queues, jobs and decisions through their records.

use super::*;

fn queue() -> QueueDef {
    QueueDef {
        idle_timeout_s: 60,
        ..QueueDef::new("cpu", BatchSystem::Slurm, 3600, 8)
    }
}

const GRACE: Millis = 2_000;

fn work(cores: u64) -> Backlog {
    Backlog { cores, gpus: 0 }
}

/// A coordinator with one SLURM queue, whose jobs it has listed (none).
fn coordinator() -> Allocs {
    let mut a = unlisted();
    let gen = a.list_gen;
    assert!(!a.listed(0, 1, BatchSystem::Slurm, gen, Ok(Vec::new())));
    a
}

fn unlisted() -> Allocs {
    let mut a = Allocs::default();
    a.coordinating(Some(0));
    let (ops, changed) = a.command(0, 1, AllocCmd::Add(queue()));
    assert!(ops.is_empty() && changed);
    a
}

fn list_op(a: &Allocs) -> BatchOp {
    BatchOp::List {
        system: BatchSystem::Slurm,
        gen: a.list_gen,
    }
}

#[test]
fn a_new_coordinator_adopts_the_jobs_of_this_mesh_its_book_misses_before_it_submits() {
    let mut a = unlisted();
    a.submitted(0, 1, &queue(), Ok(vec!["5".into()]));
    // Nothing in the grace (the newest book may be on its way); then
    // the list, and nothing is submitted until its answer.
    let (ops, _) = a.tick(500, 1, GRACE, work(64), &[]);
    assert!(ops.is_empty(), "{ops:?}");
    let submits = |ops: &[BatchOp]| {
        ops.iter()
            .filter(|o| matches!(o, BatchOp::Submit { .. }))
            .count()
    };
    let (ops, _) = a.tick(2_000, 1, GRACE, work(64), &[]);
    assert!(ops.contains(&list_op(&a)), "{ops:?}");
    assert_eq!(submits(&ops), 0, "{ops:?}");
    let (ops, _) = a.tick(3_000, 1, GRACE, work(64), &[]);
    assert_eq!(submits(&ops), 0, "nothing before the list: {ops:?}");
    // An answer to an earlier coordination of this node's is dropped.
    let gen = a.list_gen;
    assert!(!a.listed(
        3_050,
        1,
        BatchSystem::Slurm,
        gen - 1,
        Ok(vec![Listed::new("8", JobState::Running, "cpu")])
    ));
    // Its predecessor submitted 8 and 9 and died before booking them;
    // 7 ended; 5 is booked; 11 is of a queue removed since.
    let changed = a.listed(
        3_100,
        1,
        BatchSystem::Slurm,
        gen,
        Ok(vec![
            Listed::new("5", JobState::Running, "cpu"),
            Listed::new("7", JobState::Ended, "cpu"),
            Listed::new("8", JobState::Running, "cpu"),
            Listed::new("9", JobState::Queued, "cpu"),
            Listed::new("11", JobState::Running, "gone"),
        ]),
    );
    assert!(changed);
    let ids: Vec<&str> = a.book().jobs.iter().map(|j| j.job.id.as_str()).collect();
    assert_eq!(ids, ["5", "8", "9"]);
    assert_eq!(state(&a, "8"), JobState::Running);
    assert_eq!(state(&a, "9"), JobState::Queued);
    assert!(a
        .book()
        .log
        .iter()
        .any(|e| e.job.as_deref() == Some("8") && e.text.starts_with("adopted")));
    // A late answer to a submission of the same job books it once.
    a.submitted(3_200, 1, &queue(), Ok(vec!["9".into()]));
    assert_eq!(a.book().jobs.iter().filter(|j| j.job.id == "9").count(), 1);
    // Its node joins and idles: the adopted job is cancelled like any.
    let idle = [("8".to_string(), false)];
    let (ops, _) = a.tick(4_000, 1, GRACE, work(0), &idle);
    assert!(
        ops.contains(&BatchOp::Cancel {
            system: BatchSystem::Slurm,
            job: "11".into()
        }),
        "the job of a removed queue is cancelled: {ops:?}"
    );
    assert!(
        a.book()
            .jobs
            .iter()
            .find(|j| j.job.id == "8")
            .unwrap()
            .joined
    );
    let (ops, _) = a.tick(64_000, 1, GRACE, work(0), &idle);
    assert!(
        ops.contains(&BatchOp::Cancel {
            system: BatchSystem::Slurm,
            job: "8".into()
        }),
        "{ops:?}"
    );
    // Listed once a coordination: the next ticks only poll...
    assert!(!ops.iter().any(|o| matches!(o, BatchOp::List { .. })));
    // ... until a node says it was started by a job the book lacks (a
    // deposed coordinator's): listed again, once for that job.
    let stray = [("8".to_string(), false), ("77".to_string(), true)];
    let (ops, _) = a.tick(65_000, 1, GRACE, work(0), &stray);
    assert!(ops.contains(&list_op(&a)), "{ops:?}");
    a.listed(65_100, 1, BatchSystem::Slurm, gen, Ok(Vec::new()));
    let (ops, _) = a.tick(71_000, 1, GRACE, work(0), &stray);
    assert!(
        !ops.iter().any(|o| matches!(o, BatchOp::List { .. })),
        "{ops:?}"
    );
}

#[test]
fn a_list_that_fails_is_asked_again_and_holds_only_its_systems_submissions() {
    let mut a = unlisted();
    let (ops, _) = a.tick(2_000, 1, GRACE, work(64), &[]);
    assert_eq!(ops, [list_op(&a)]);
    let gen = a.list_gen;
    assert!(a.listed(
        2_100,
        1,
        BatchSystem::Slurm,
        gen,
        Err("squeue: timeout".into())
    ));
    let (ops, _) = a.tick(3_000, 1, GRACE, work(64), &[]);
    assert!(ops.is_empty(), "{ops:?}");
    let (ops, _) = a.tick(7_000, 1, GRACE, work(64), &[]);
    assert_eq!(ops, [list_op(&a)]);
    a.listed(7_100, 1, BatchSystem::Slurm, gen, Ok(Vec::new()));
    let (ops, _) = a.tick(8_000, 1, GRACE, work(64), &[]);
    assert!(
        matches!(ops.as_slice(), [BatchOp::Submit { .. }]),
        "{ops:?}"
    );
    // A PBS queue whose listing fails does not stop the SLURM queue.
    let mut a = unlisted();
    let pbs = QueueDef::new("pbs", BatchSystem::Pbs, 3600, 8);
    a.command(0, 1, AllocCmd::Add(pbs));
    let gen = a.list_gen;
    a.listed(0, 1, BatchSystem::Slurm, gen, Ok(Vec::new()));
    let submitted = |ops: &[BatchOp]| -> Vec<String> {
        ops.iter()
            .filter_map(|o| match o {
                BatchOp::Submit { queue, .. } => Some(queue.name.clone()),
                _ => None,
            })
            .collect()
    };
    let (ops, _) = a.tick(2_000, 1, GRACE, work(16), &[]);
    assert!(
        ops.contains(&BatchOp::List {
            system: BatchSystem::Pbs,
            gen
        }),
        "{ops:?}"
    );
    assert_eq!(submitted(&ops), ["cpu"], "{ops:?}");
    a.listed(
        2_100,
        1,
        BatchSystem::Pbs,
        gen,
        Err("qselect: not found".into()),
    );
    for t in [3_000, 4_000] {
        let (ops, _) = a.tick(t, 1, GRACE, work(16), &[]);
        assert!(submitted(&ops).iter().all(|q| q == "cpu"), "{ops:?}");
    }
}

fn state(a: &Allocs, id: &str) -> JobState {
    a.book()
        .jobs
        .iter()
        .find(|j| j.job.id == id)
        .map(|j| j.job.state)
        .expect("booked")
}

#[test]
fn a_backlog_is_submitted_after_the_grace_and_its_jobs_are_followed_to_their_end() {
    let mut a = coordinator();
    assert_eq!(a.version(), (1, 1));
    // A new coordinator listens first: nothing is decided in the grace.
    let (ops, _) = a.tick(1_000, 1, GRACE, work(16), &[]);
    assert!(ops.is_empty(), "{ops:?}");
    let (ops, _) = a.tick(3_000, 1, GRACE, work(16), &[]);
    let [BatchOp::Submit { queue, jobs: 2 }] = ops.as_slice() else {
        panic!("two 8-core jobs for 16 cores of work: {ops:?}");
    };
    assert!(a.submitted(3_100, 1, queue, Ok(vec!["7_1".into(), "7_2".into()])));
    assert_eq!(state(&a, "7_1"), JobState::Queued);
    // Job 7_1's node joined and works: it runs, whatever the batch system said last.
    let (_, changed) = a.tick(4_000, 1, GRACE, work(0), &[("7_1".into(), true)]);
    assert!(changed);
    assert_eq!(state(&a, "7_1"), JobState::Running);
    assert!(a.book().jobs[0].joined);
    // 7_2 is no longer listed and its node never came: a failure of the queue.
    assert!(a.polled(
        9_000,
        1,
        BatchSystem::Slurm,
        Ok(vec![("7_1".into(), JobState::Running)])
    ));
    assert_eq!(state(&a, "7_2"), JobState::Ended);
    assert!(a
        .book()
        .log
        .iter()
        .any(|e| e.text.contains("ended before its node joined")));
}

#[test]
fn a_deadline_queue_has_the_jobs_its_plan_asks_not_the_backlogs_and_says_so() {
    use crate::alloc::Plan;
    let mut a = Allocs {
        wall_base: 1_000_000,
        ..Allocs::default()
    };
    a.coordinating(Some(0));
    let def = QueueDef {
        deadline_ms: Some(1_000_000 + 600_000),
        ..queue()
    };
    assert!(a.command(0, 1, AllocCmd::Add(def)).1);
    let gen = a.list_gen;
    a.listed(0, 1, BatchSystem::Slurm, gen, Ok(Vec::new()));
    // Due at once, with the time left; not again within PLAN_EVERY_MS.
    let due = a.to_plan(3_000);
    assert_eq!(due.len(), 1);
    assert_eq!(due[0].left_ms, 597_000);
    assert_eq!(due[0].wait_ms, WAIT_GUESS_MS, "no job has joined to tell");
    assert!(a.to_plan(4_000).is_empty());
    // Before a task has finished: said, and nothing beyond --min however
    // much work waits.
    assert!(a.planned(3_000, 1, vec![(due[0].clone(), None)]));
    let (ops, _) = a.tick(3_000, 1, GRACE, work(64), &[]);
    assert!(ops.is_empty(), "{ops:?}");
    // A plan of 3 jobs: 3, though the backlog would ask for 8.
    let plan = Plan {
        extra: 3,
        end_ms: 500_000,
        meets: true,
    };
    assert!(a.planned(13_000, 1, vec![(due[0].clone(), Some(plan.clone()))]));
    let (ops, _) = a.tick(13_000, 1, GRACE, work(64), &[]);
    let [BatchOp::Submit { jobs: 3, .. }] = ops.as_slice() else {
        panic!("the plan's 3 jobs: {ops:?}");
    };
    // The same plan again changes nothing; one that cannot meet it is said.
    assert!(!a.planned(23_000, 1, vec![(due[0].clone(), Some(plan))]));
    let short = Plan {
        extra: 10,
        end_ms: 900_000,
        meets: false,
    };
    assert!(a.planned(33_000, 1, vec![(due[0].clone(), Some(short))]));
    let said: Vec<&str> = a.book().log.iter().map(|e| e.text.as_str()).collect();
    assert!(
        said.iter().any(|t| t.contains("no task has finished yet")),
        "{said:?}"
    );
    assert!(
        said.iter().any(|t| t.contains("3 job(s) beyond the 0")),
        "{said:?}"
    );
    assert!(
        said.iter()
            .any(|t| t.contains("cannot be met within --max 10")),
        "{said:?}"
    );
    let note = a.book().queues[0].plan.clone().unwrap();
    assert_eq!((note.extra, note.meets), (Some(10), false));
}

#[test]
fn an_idle_job_is_cancelled_once_and_a_removed_queue_cancels_its_jobs() {
    let mut a = coordinator();
    let q = queue();
    a.submitted(0, 1, &q, Ok(vec!["1".into(), "2".into()]));
    let busy = [("1".to_string(), false), ("2".to_string(), true)];
    a.tick(3_000, 1, GRACE, work(0), &busy);
    // Job 1's node has idled 60 s with nothing waiting: cancelled, once.
    let (ops, _) = a.tick(63_000, 1, GRACE, work(0), &busy);
    assert!(
        matches!(ops.as_slice(), [BatchOp::Cancel { job, .. }] if job == "1"),
        "{ops:?}"
    );
    let (ops, _) = a.tick(64_000, 1, GRACE, work(0), &busy);
    assert!(
        !ops.iter().any(|o| matches!(o, BatchOp::Cancel { .. })),
        "{ops:?}"
    );
    // Removing the queue cancels what is still live.
    let (ops, changed) = a.command(
        65_000,
        1,
        AllocCmd::Remove {
            queue: "cpu".into(),
        },
    );
    assert!(changed);
    assert_eq!(ops.len(), 2, "{ops:?}");
    assert!(a.book().queues.is_empty() && a.book().jobs.is_empty());
}

#[test]
fn a_running_job_whose_node_never_joins_is_cancelled_even_with_work_waiting() {
    let mut a = coordinator();
    a.submitted(0, 1, &queue(), Ok(vec!["9".into()]));
    a.polled(
        3_000,
        1,
        BatchSystem::Slurm,
        Ok(vec![("9".into(), JobState::Running)]),
    );
    a.tick(3_000, 1, GRACE, work(8), &[]);
    let (ops, _) = a.tick(122_000, 1, GRACE, work(8), &[]);
    assert!(
        !ops.iter().any(|o| matches!(o, BatchOp::Cancel { .. })),
        "{ops:?}"
    );
    let (ops, _) = a.tick(123_000, 1, GRACE, work(8), &[]);
    assert!(
        ops.iter()
            .any(|o| matches!(o, BatchOp::Cancel { job, .. } if job == "9")),
        "{ops:?}"
    );
}

#[test]
fn failed_submissions_pause_the_queue_in_the_book() {
    let mut a = coordinator();
    let q = queue();
    for i in 0..5 {
        a.submitted(i, 1, &q, Err("sbatch: error: invalid account".into()));
    }
    let paused = a.book().queue("cpu").and_then(|q| q.paused.clone());
    assert!(paused.is_some_and(|w| w.contains("5 submissions")));
    let (ops, _) = a.tick(10_000_000, 1, GRACE, work(100), &[]);
    assert!(ops.is_empty(), "a paused queue submits nothing: {ops:?}");
    let (_, changed) = a.command(
        10_000_001,
        1,
        AllocCmd::Resume {
            queue: "cpu".into(),
        },
    );
    assert!(changed);
    let (ops, _) = a.tick(10_001_000, 1, GRACE, work(100), &[]);
    assert!(
        matches!(ops.as_slice(), [BatchOp::Submit { .. }]),
        "{ops:?}"
    );
}

#[test]
fn a_stage_expected_to_outlast_a_queues_jobs_is_said_once() {
    let mut a = coordinator();
    // One hour of walltime, drained two minutes early: 58 minutes usable.
    let stages = [
        ("f/long".to_string(), 3_600_000),
        ("f/short".to_string(), 600_000),
    ];
    assert!(a.warn_expected(1_000, 1, &stages));
    assert!(!a.warn_expected(2_000, 1, &stages), "said once");
    let said: Vec<&AllocEvent> = a
        .book()
        .log
        .iter()
        .filter(|e| e.text.contains("will not run them"))
        .collect();
    assert_eq!(said.len(), 1, "{said:?}");
    assert!(said[0].text.contains("f/long") && said[0].text.contains("3480 s"));
}

#[test]
fn the_newest_book_wins_across_terms() {
    let a = coordinator();
    let mut member = Allocs::default();
    assert!(member.adopt(a.book().clone()));
    assert!(!member.adopt(a.book().clone()), "the same version again");
    // A coordinator of a later term edits its copy: it is newer than
    // anything of the earlier term, however many edits that had.
    let mut b = Allocs::default();
    b.coordinating(Some(0));
    assert!(b.adopt(a.book().clone()));
    b.command(
        0,
        5,
        AllocCmd::Pause {
            queue: "cpu".into(),
        },
    );
    assert_eq!(b.version(), (5, 1));
    assert!(member.adopt(b.book().clone()));
    assert!(member
        .book()
        .queue("cpu")
        .is_some_and(|q| q.paused.is_some()));
    assert!(!b.adopt(a.book().clone()), "an older book is ignored");
}
