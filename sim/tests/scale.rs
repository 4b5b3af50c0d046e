//! The simulator at thousands of nodes: one mesh forms from a mass start, and survives its coordinator's crash.

use mesh_sim::run;
use mesh_sim::scenario::load_scenario;

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
