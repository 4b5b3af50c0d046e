//! The home's policy on examples and on random farms and folders: what users rely on when they submit a farm again.

use std::collections::HashSet;

use proptest::prelude::*;

use super::*;
use crate::farm::{CommandTemplate, FarmDef, StageDef, Sweep, Template};

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
        stages,
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
