//! The randomized oracle (`mesh_tests::oracle`): random farms and histories on one node (`mesh run`, kills, resumes, edits, other `--out`s) and on three nodes that share no file system (`mesh submit --wait`, parallel submissions), every step checked against the model.
//!
//! `MESH_ORACLE_SEED=<n>` replays one history (both tests);
//! `MESH_ORACLE_HISTORIES` and `MESH_ORACLE_MESH_HISTORIES` set how many,
//! `MESH_ORACLE_BASE` the first seed, `MESH_ORACLE_STEPS` the run steps
//! per history. `benches/scripts/oracle.sh` runs 1,000 and 100 in release.

use std::time::Instant;

use mesh_tests::oracle::{run_many, Failure, Figures, Plant};
use mesh_tests::{apart_possible, Cluster};

use crate::sandbox;

/// One-node histories CI runs: about 45 s in a debug build on 2 cores.
const HISTORIES: u64 = 80;
/// Three-node histories CI runs: about 10 s (100 took 34 s).
const MESH_HISTORIES: u64 = 30;
const STEPS: usize = 6;
const MESH_STEPS: usize = 4;

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

fn seeds(count: u64, base: u64) -> Vec<u64> {
    match env_u64("MESH_ORACLE_SEED") {
        Some(s) => vec![s],
        None => {
            let base = env_u64("MESH_ORACLE_BASE").unwrap_or(base);
            (base..base + count).collect()
        }
    }
}

fn report(what: &str, ran: usize, f: &Figures, fails: &[Failure], secs: f64) {
    let mut kinds = std::collections::BTreeMap::new();
    for x in fails {
        for k in &x.kinds {
            *kinds.entry(*k).or_insert(0) += 1;
        }
    }
    eprintln!(
        "oracle ({what}): {ran} histories, {} run steps, {} tasks checked ({} ran, {} reused), {} failed {kinds:?}, {secs:.1} s",
        f.steps,
        f.tasks_checked,
        f.runs,
        f.reused,
        fails.len()
    );
    // Every failing seed with its kinds; in full, the first of each kind.
    let mut shown = std::collections::BTreeSet::new();
    for x in fails {
        let first_line = x.report.lines().next().unwrap_or("");
        eprintln!("{first_line} {:?}", x.kinds);
        if x.kinds.iter().any(|k| shown.insert(*k)) {
            eprintln!("{}", x.report);
        }
    }
}

#[test]
fn oracle_one_node_histories_give_right_results() {
    let count = env_u64("MESH_ORACLE_HISTORIES").unwrap_or(HISTORIES);
    let steps = env_u64("MESH_ORACLE_STEPS").map_or(STEPS, |s| s as usize);
    let started = Instant::now();
    let mut make = || Some((sandbox(), None));
    let (f, ran, fails) = run_many(&mut make, &seeds(count, 1), steps, Plant::None);
    report("one node", ran, &f, &fails, started.elapsed().as_secs_f64());
    assert!(
        fails.is_empty(),
        "{} of {ran} histories gave wrong results (see above)",
        fails.len()
    );
}

#[test]
fn oracle_three_node_histories_give_right_results() {
    if !apart_possible() {
        eprintln!("skipped: needs root and `unshare -m` for nodes that share no file system");
        return;
    }
    let count = env_u64("MESH_ORACLE_MESH_HISTORIES").unwrap_or(MESH_HISTORIES);
    let steps = env_u64("MESH_ORACLE_STEPS").map_or(MESH_STEPS, |s| s as usize);
    let started = Instant::now();
    // One mesh for all the histories: each has its own farm file and outs.
    let mut make = || {
        let sb = sandbox();
        let (farm, out) = (sb.path().join("farm"), sb.path().join("out"));
        let c = Cluster::start_apart(&sb, &["cpu=2"; 3], &[], &[&farm, &out]);
        Some((sb, Some(c)))
    };
    let (f, ran, fails) = run_many(&mut make, &seeds(count, 1), steps, Plant::None);
    report(
        "3 nodes apart",
        ran,
        &f,
        &fails,
        started.elapsed().as_secs_f64(),
    );
    assert!(
        fails.is_empty(),
        "{} of {ran} histories gave wrong results (see above)",
        fails.len()
    );
}

/// The oracle can fail: told a wrong model, it says so.
#[test]
fn oracle_catches_a_planted_bug() {
    for (plant, kind) in [
        (Plant::ForgetDep, "wrong view"),
        (Plant::NothingReused, "missing run"),
    ] {
        let mut make = || Some((sandbox(), None::<Cluster>));
        let (_, _, fails) = run_many(&mut make, &(100..106).collect::<Vec<_>>(), 3, plant);
        assert!(
            fails.iter().any(|f| f.kinds.contains(kind)),
            "a model with {plant:?} was not caught: {}",
            fails.iter().map(|f| f.report.as_str()).collect::<String>()
        );
    }
}
