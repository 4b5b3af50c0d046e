//! The home's policy on examples and on random farms and folders: what users rely on when they submit a farm again.

use std::collections::HashSet;

use proptest::prelude::*;

use super::*;
use crate::farm::{CommandTemplate, FarmDef, StageDef, Sweep, TaskRef, Template};
use crate::ids::NodeId;

fn stage(name: &str, n: u64, after: &[u32]) -> StageDef {
    let mut s = StageDef::new(
        name,
        CommandTemplate::Argv(vec![Template::literal("true")]),
        Sweep::range("i", n),
    );
    s.inputs = vec![Template::literal(&format!("in-{name}.txt"))];
    s.after = after.to_vec();
    s
}

fn farm(stages: Vec<StageDef>) -> FarmDef {
    FarmDef {
        graph: Default::default(),
        name: "f".into(),
        root: "/r".into(),
        out: "/o".into(),
        stages: stages.into_iter().map(std::sync::Arc::new).collect(),
    }
}

fn folder(name: &str, folders: &[&str], manifest: bool) -> Folder {
    Folder {
        name: name.into(),
        folders: folders.iter().map(|s| s.to_string()).collect(),
        manifest,
    }
}

#[test]
fn a_gone_stage_goes_with_its_manifest_and_a_cut_sweep_loses_its_tail() {
    let def = farm(vec![stage("a", 3, &[]), stage("b", 2, &[0])]);
    let found = [
        folder("a", &["0", "2", "3", "10", "07", "notes"], true),
        folder("b", &["0", "1"], true),
        folder("old", &["0", "1", "x"], true),
        folder("empty", &["x"], true),
        folder(".mesh-set-aside", &["5"], false),
    ];
    let stale = set_aside(&def, &found);
    assert_eq!(
        stale,
        vec![
            Stale {
                stage: "a".into(),
                folders: vec!["3".into(), "10".into()],
                gone: false,
                manifest: Manifest::Stays,
            },
            Stale {
                stage: "old".into(),
                folders: vec!["0".into(), "1".into()],
                gone: true,
                manifest: Manifest::Moves,
            },
            Stale {
                stage: "empty".into(),
                folders: vec![],
                gone: true,
                manifest: Manifest::Removed,
            },
        ]
    );
}

#[test]
fn rerun_marks_the_named_stages_and_all_that_read_them() {
    let def = farm(vec![
        stage("a", 1, &[]),
        stage("b", 1, &[0]),
        stage("c", 1, &[1]),
        stage("d", 1, &[]),
    ]);
    assert_eq!(rerun_stages(&def, None), vec![false; 4]);
    assert_eq!(rerun_stages(&def, Some(&[])), vec![true; 4]);
    let b = ["b".to_string()];
    assert_eq!(rerun_stages(&def, Some(&b)), vec![false, true, true, false]);
}

/// A farm of up to 5 stages named `s0`.., each after some earlier ones.
fn random_farm() -> impl Strategy<Value = FarmDef> {
    proptest::collection::vec((0u64..6, proptest::collection::vec(any::<bool>(), 5)), 1..6)
        .prop_map(|stages| {
            farm(
                stages
                    .iter()
                    .enumerate()
                    .map(|(s, (n, after))| {
                        let after: Vec<u32> =
                            (0..s as u32).filter(|&d| after[d as usize]).collect();
                        stage(&format!("s{s}"), *n, &after)
                    })
                    .collect(),
            )
        })
}

/// What `{out}` may hold: the farm's stages and others, hidden folders,
/// indexes in and past the sweeps, and names that are no index.
fn random_out() -> impl Strategy<Value = Vec<Folder>> {
    let name = prop_oneof![
        (0u32..8).prop_map(|s| format!("s{s}")),
        Just(".mesh-set-aside".to_string()),
        Just(".mesh-stash".to_string()),
    ];
    let task = prop_oneof![
        (0u32..10).prop_map(|i| i.to_string()),
        Just("007".to_string()),
        Just("x".to_string()),
        Just(String::new()),
    ];
    proptest::collection::vec(
        (name, proptest::collection::vec(task, 0..8), any::<bool>()),
        0..8,
    )
    .prop_map(|fs| {
        let mut seen = HashSet::new();
        fs.into_iter()
            .filter(|(n, _, _)| seen.insert(n.clone()))
            .map(|(name, mut folders, manifest)| {
                folders.sort();
                folders.dedup();
                Folder {
                    name,
                    folders,
                    manifest,
                }
            })
            .collect()
    })
}

proptest! {
    /// After the set-aside, `{out}` holds the farm as it is now: every
    /// task folder the farm no longer has goes, with a gone stage's
    /// manifest, and nothing of a task the farm has (what a reuse puts
    /// its result in) is ever set aside.
    #[test]
    fn out_holds_the_farm_as_it_is_now(def in random_farm(), found in random_out()) {
        let stale = set_aside(&def, &found);
        let keys = task_keys(&def, 0, |_| [0; 32]);
        let aside: HashSet<(String, String)> = stale
            .iter()
            .flat_map(|s| s.folders.iter().map(|f| (s.stage.clone(), f.clone())))
            .collect();
        for (s, stage_keys) in keys.iter().enumerate() {
            for i in 0..stage_keys.len() {
                let name = def.stages[s].name.clone();
                prop_assert!(!aside.contains(&(name, i.to_string())), "task {s}/{i} of the farm set aside");
            }
        }
        for f in &found {
            let st = def.stages.iter().find(|s| s.name == f.name);
            let of = stale.iter().find(|s| s.stage == f.name);
            if !looked_at(&f.name) {
                prop_assert!(of.is_none(), "mesh's own {} looked into", f.name);
                continue;
            }
            for t in &f.folders {
                let belongs = st.is_some_and(|st| t.parse::<u64>().is_ok_and(|i| i < st.sweep.len()));
                let want = is_index(t) && !belongs;
                prop_assert_eq!(aside.contains(&(f.name.clone(), t.clone())), want, "{}/{}", f.name, t);
            }
            match (st, of) {
                (Some(_), Some(of)) => prop_assert_eq!(of.manifest, Manifest::Stays),
                (None, None) => prop_assert!(false, "gone stage {} left in place", f.name),
                (None, Some(of)) => {
                    prop_assert!(of.gone);
                    let want = match (f.manifest, of.folders.is_empty()) {
                        (false, _) => Manifest::Stays,
                        (true, false) => Manifest::Moves,
                        (true, true) => Manifest::Removed,
                    };
                    prop_assert_eq!(of.manifest, want);
                }
                (Some(_), None) => {}
            }
        }
    }

    /// A task whose definition, inputs and dependencies are unchanged keeps
    /// its key (and so its kept result); a changed input changes the key of
    /// its stage's tasks and of every task downstream, so none of them is
    /// ever handed an earlier result.
    #[test]
    fn a_changed_input_changes_exactly_its_stage_and_those_downstream(
        def in random_farm(),
        pick in 0usize..5,
    ) {
        let changed = format!("in-s{}.txt", pick % def.stages.len());
        let before = task_keys(&def, 0, |_| [1; 32]);
        let after = task_keys(&def, 0, |p| if p == changed { [2; 32] } else { [1; 32] });
        let mut touched = vec![false; def.stages.len()];
        for s in dependency_order(&def) {
            let st = &def.stages[s as usize];
            // A stage of no tasks has no key to change downstream.
            touched[s as usize] = !st.is_empty()
                && (st.name == changed[3..changed.len() - 4]
                    || st.upstream().any(|d| touched[d as usize]));
        }
        for (s, t) in touched.iter().enumerate() {
            for (i, (b, a)) in before[s].iter().zip(&after[s]).enumerate() {
                prop_assert_eq!(b != a, *t, "task {}/{}", s, i);
            }
        }
        // Keys are worked out for the stages asked and those they read.
        let from = pick % def.stages.len();
        let some = task_keys(&def, from, |_| [1; 32]);
        for s in from..def.stages.len() {
            prop_assert_eq!(&some[s], &before[s]);
        }
    }
}

#[test]
fn each_task_is_said_once_across_stages_and_words() {
    let mut f = Told::default();
    f.fit(2, |s| [100, 10][s]);
    for t in [
        TaskRef::new(0, 0),
        TaskRef::new(0, 63),
        TaskRef::new(0, 64),
        TaskRef::new(1, 5),
    ] {
        assert!(!f.said(t));
        assert!(f.say_once(t), "{t:?} is new");
        assert!(f.said(t));
        assert!(!f.say_once(t), "{t:?} is said once");
    }
    assert!(!f.said(TaskRef::new(0, 1)));
    // A task the farm does not have is never said.
    assert!(!f.say_once(TaskRef::new(2, 0)));
    assert!(!f.say_once(TaskRef::new(1, 64)));
}

/// What happens to a farm's log as a follower reads it: a task ends done
/// (its outputs home or not) or failed, or its outputs come home.
#[derive(Clone, Debug)]
enum Happens {
    Done(u32, bool),
    Failed(u32),
    Home(u32),
}

fn happens() -> impl Strategy<Value = Happens> {
    prop_oneof![
        (0u32..20, any::<bool>()).prop_map(|(i, h)| Happens::Done(i, h)),
        (0u32..20).prop_map(Happens::Failed),
        (0u32..20).prop_map(Happens::Home),
    ]
}

proptest! {
    /// A follower is told each task once, a done one never before its
    /// outputs are home, and, once the farm is over and it has room,
    /// every task that ended, before the end and never after it.
    #[test]
    fn each_ended_task_is_told_once_and_a_done_one_only_once_home(
        log in proptest::collection::vec(happens(), 0..60),
        room in 2usize..40,
    ) {
        let mut f = Told::default();
        f.fit(1, |s| [20][s]);
        // The log's last word on each task, and which outputs are home.
        let mut is: std::collections::HashMap<u32, Seen> = Default::default();
        let mut home: HashSet<u32> = HashSet::new();
        let mut told: Vec<u32> = Vec::new();
        for h in &log {
            let (i, tell) = match *h {
                Happens::Done(i, h) => {
                    if h { home.insert(i); }
                    // Done wins over failed.
                    is.insert(i, Seen::Done { home: home.contains(&i) });
                    (i, f.read_entry(TaskRef::new(0, i), Seen::Done { home: home.contains(&i) }))
                }
                Happens::Failed(i) => {
                    let seen = *is.entry(i).or_insert(Seen::Failed);
                    let seen = match seen {
                        Seen::Done { .. } => Seen::Done { home: home.contains(&i) },
                        s => s,
                    };
                    (i, f.read_entry(TaskRef::new(0, i), seen))
                }
                Happens::Home(i) => {
                    home.insert(i);
                    (i, f.came_home(TaskRef::new(0, i), true))
                }
            };
            if tell {
                prop_assert!(!told.contains(&i), "task {} told twice", i);
                if matches!(is.get(&i), Some(Seen::Done { .. })) {
                    prop_assert!(home.contains(&i), "task {} told before its outputs came", i);
                }
                told.push(i);
            }
        }
        // Over: every output is home.
        let mut end = false;
        let mut rounds = 0;
        while !end {
            let (last, e) = f.last(room);
            prop_assert!(last.len() < room, "the end's place is kept");
            for t in last {
                prop_assert!(!told.contains(&t.index), "task {} told twice", t.index);
                told.push(t.index);
            }
            end = e;
            rounds += 1;
            prop_assert!(rounds < 40, "the end is never told");
        }
        prop_assert_eq!(f.waiting(), 0);
        let ended: HashSet<u32> = is.keys().copied().collect();
        let told: HashSet<u32> = told.into_iter().collect();
        prop_assert_eq!(told, ended);
    }
}

#[test]
fn unplaced_tasks_are_told_as_room_allows_from_where_it_stopped() {
    let mut f = Told::default();
    f.fit(2, |s| [3, 5][s]);
    // Task 1/1 has an entry in the log: said by it, not here.
    let in_log = |t: TaskRef| t == TaskRef::new(1, 1);
    let (tell, all) = f.rest(Rest::Unplaced, &[(1, Some(5)), (7, None)], 3, 1, in_log);
    assert_eq!(tell, vec![TaskRef::new(1, 0), TaskRef::new(1, 2)]);
    assert!(!all);
    let (tell, all) = f.rest(Rest::Unplaced, &[(1, Some(5)), (7, None)], 10, 1, in_log);
    assert_eq!(tell, vec![TaskRef::new(1, 3), TaskRef::new(1, 4)]);
    assert!(all);
}

#[test]
fn an_open_farms_unrun_tasks_are_told_once_apart_from_the_unplaced() {
    let mut f = Told::default();
    f.fit(2, |s| [4, 2][s]);
    // 0/0 ran and is in the log; 0/1 fits no node and was said so.
    let in_log = |t: TaskRef| t == TaskRef::new(0, 0);
    let (tell, _) = f.rest(Rest::Unplaced, &[(0, Some(2))], 10, 1, in_log);
    assert_eq!(tell, vec![TaskRef::new(0, 1)]);
    assert!(!f.rest_told(Rest::Unrun, 0, 4));
    let (tell, all) = f.rest(Rest::Unrun, &[(0, Some(4))], 2, 1, in_log);
    assert_eq!(tell, vec![TaskRef::new(0, 2)]);
    assert!(!all && !f.rest_told(Rest::Unrun, 0, 4));
    let (tell, all) = f.rest(Rest::Unrun, &[(0, Some(4)), (1, Some(2))], 10, 1, in_log);
    assert_eq!(
        tell,
        vec![TaskRef::new(0, 3), TaskRef::new(1, 0), TaskRef::new(1, 1)]
    );
    assert!(all && f.rest_told(Rest::Unrun, 0, 4) && f.rest_told(Rest::Unrun, 1, 2));
    // Each once, whatever asks again.
    assert_eq!(
        f.rest(Rest::Unrun, &[(0, Some(4))], 10, 1, in_log).0,
        vec![]
    );
    assert!(!f.read_entry(TaskRef::new(0, 2), Seen::Failed));
}

/// A submission's tasks: a stage run again runs whatever was kept (its
/// folder's earlier outputs set aside, nothing asked of other homes); a
/// task whose result is kept here is done from the start; the others run
/// unless an earlier home keeps theirs, what their folder holds set aside.
#[test]
fn a_task_reuses_what_is_kept_here_unless_its_stage_runs_again() {
    let keys: TaskKeys = vec![vec![[1; 32], [2; 32]], vec![[3; 32], [4; 32]], vec![]];
    let kept = |t: TaskRef| t.index == 0;
    let plan = reuse(&keys, &[false, true], kept, |s| s == 0);
    let run = |forget, ask| Reuse::Run { forget, ask };
    assert_eq!(
        plan,
        vec![
            (TaskRef::new(0, 0), Reuse::Kept),
            (TaskRef::new(0, 1), run(true, true)),
            (TaskRef::new(1, 0), run(false, false)),
            (TaskRef::new(1, 1), run(false, false)),
        ]
    );
    assert_eq!(unkept(false), run(false, true));
}

/// The earlier homes asked: those known here and those the coordinator
/// lists for farms of the same name, never this node, in id order, at
/// most `HOMES_ASKED`; of their answers, the first home that keeps a key
/// is the one its task reuses.
#[test]
fn earlier_homes_are_asked_once_each_and_the_first_keeper_is_taken() {
    let me = NodeId(5);
    let known: std::collections::BTreeSet<NodeId> = [NodeId(9), NodeId(5)].into();
    let listed = [
        ("f", NodeId(3)),
        ("g", NodeId(4)),
        ("f", NodeId(5)),
        ("f", NodeId(9)),
    ];
    assert_eq!(
        homes_to_ask(&known, listed, "f", me),
        vec![NodeId(3), NodeId(9)]
    );
    let many = (0..40).map(|n| ("f", NodeId(n)));
    let asked = homes_to_ask(&Default::default(), many, "f", me);
    assert_eq!(asked.len(), HOMES_ASKED);
    assert!(!asked.contains(&me));

    let (a, b) = (TaskRef::new(0, 0), TaskRef::new(0, 1));
    let wanted = [(a, [1; 32]), (b, [2; 32]), (TaskRef::new(1, 0), [7; 32])];
    let answers = vec![
        (NodeId(3), vec![([2; 32], "b at 3")]),
        (NodeId(9), vec![([1; 32], "a at 9"), ([2; 32], "b at 9")]),
    ];
    assert_eq!(
        first_keeper(&wanted, &answers),
        vec![
            (a, [1; 32], NodeId(9), &"a at 9"),
            (b, [2; 32], NodeId(3), &"b at 3")
        ]
    );
}
