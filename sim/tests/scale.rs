//! The simulator at thousands of nodes: one mesh forms from a mass start, and survives its coordinator's crash; the end of a farm balanced however seldom nodes report.

use mesh_sim::scenario::load_scenario;
use mesh_sim::{run, SimConfig};

/// `sim/scenarios/mass-crash.toml` at 2,000 nodes: nodes of one core
/// start at once, all joining node 0; node 1 submits 2,000 tasks of 1 to
/// 3 s at 60 s, once the mesh has formed, and the coordinator (node 0)
/// dies for good at 62 s, mid-farm. Every task must come home with its
/// output and the live nodes must end as one mesh around another
/// coordinator (the run's own end checks), with every invariant checked
/// after every step on the way.
///
/// Some 40 s and 0.4 GB in a release build on this 2-core machine, minutes
/// in a debug one, so left out of `cargo test`; CI runs it:
/// `cargo test --release -p mesh-sim --test scale -- --ignored --nocapture`.
/// The scenario's own 10,000 nodes (10⁸ members, memory-bound: 7.5 to 33
/// minutes and 9 GB on this machine as its neighbours load it) are part 3
/// of the `sim_scale` bench.
#[test]
#[ignore]
fn two_thousand_nodes_form_one_mesh_and_survive_the_coordinator_crash() {
    let path = format!("{}/scenarios/mass-crash.toml", env!("CARGO_MANIFEST_DIR"));
    let mut cfg = load_scenario(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    cfg.scale_nodes(2000);
    let r = run(&cfg).unwrap_or_else(|e| panic!("{e}"));
    println!("{}", r.summary());
    assert_eq!(r.tasks_done, 2000);
    r.one_mesh_ms.expect("one mesh at the end");
    assert!(
        r.coordinators.contains(&0) && r.coordinators.iter().any(|&c| c != 0),
        "node 0 coordinated, and another after it died: {:?}",
        r.coordinators
    );
}

/// A mesh of N nodes reports to its coordinator every N / 200 seconds: at
/// 10,000 nodes every 50 s, longer than a farm of a million short tasks
/// lasts, so the victims its beats name are long emptied. Here 1,000
/// nodes report every 500 s (`reports_per_s = 2`): the farm of 100,000
/// tasks (about 2.5 s) runs between two reports. Near its end, tasks
/// queued behind a node's long runs must still move to the slots idle
/// elsewhere, as greedy list scheduling starts them: without the
/// coordinator pointing its thieves at the nodes its claims say are
/// queued, this run measured 1.093 of greedy and no steal won; with it
/// 1.006. Some 13 s in a release build.
#[test]
#[ignore]
fn the_end_of_a_farm_is_balanced_however_seldom_nodes_report() {
    let mut cfg = SimConfig::simple(7, 1000, "cpu=4", 100_000, "zipf:1.2");
    cfg.submit_at_ms = 5_000;
    cfg.mesh.reports_per_s = Some(2);
    let r = run(&cfg).unwrap_or_else(|e| panic!("{e}"));
    println!("{}", r.summary());
    assert_eq!(r.tasks_done, 100_000);
    assert_eq!(r.duplicates, 0);
    assert!(
        r.steals > 0,
        "idle nodes took queued tasks: {}",
        r.summary()
    );
    assert!(
        (r.makespan as f64) <= 1.03 * r.greedy as f64,
        "within 3% of greedy: {}",
        r.summary()
    );
}
