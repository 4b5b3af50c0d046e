//! A mesh that heals itself: a mass start against one slow seed, a stalled seed, two meshes formed apart that meet.

use mesh_sim::scenario::parse_scenario;
use mesh_sim::{run, SimReport};

fn ok(toml: &str) -> SimReport {
    let cfg = parse_scenario(toml).unwrap_or_else(|e| panic!("{e}"));
    run(&cfg).unwrap_or_else(|e| panic!("{e}"))
}

/// `nodes` nodes of one core start at once, all joining node 0, which
/// serves the messages that reach it one after another, `per_msg_us`
/// each, for the first 30 s (a job array's burst); `tasks` tasks of 1 to
/// 3 s are submitted on node 1 at `submit_at_ms`.
fn swamped_seed(
    seed: u64,
    nodes: usize,
    per_msg_us: u64,
    tasks: u64,
    submit_at_ms: u64,
) -> SimReport {
    ok(&format!(
        r#"
seed = {seed}
submit_node = 1
submit_at_ms = {submit_at_ms}
[[nodes]]
count = {nodes}
resources = "cpu=1"
[[stages]]
name = "work"
tasks = {tasks}
durations = "uniform:1000..3000"
[[slow]]
node = 0
per_msg_us = {per_msg_us}
from_ms = 0
until_ms = 30000
"#
    ))
}

/// [`swamped_seed`] with 200 tasks submitted at 60 s, once the mesh has formed.
fn mass_start(nodes: usize, per_msg_us: u64) -> SimReport {
    let r = swamped_seed(1, nodes, per_msg_us, 200, 60_000);
    println!("{}", r.summary());
    // The run's own end checks: every task done at the home with its
    // output, and one mesh (see `one_mesh` in the scenario docs).
    assert_eq!(r.tasks_done, 200);
    assert!(
        r.slow_wait_ms >= 2000,
        "the seed was not swamped: answers at most {} ms late",
        r.slow_wait_ms
    );
    let formed = r.one_mesh_ms.expect("one mesh");
    assert!(formed <= 60_000, "one mesh only from {formed} ms");
    r
}

/// 200 nodes against a seed that takes 5 ms a message: its answers come
/// up to 3 s late; one mesh from 28 s, and its successor (node 1), which
/// took 2 s without an answer for a death, coordinated besides it.
#[test]
fn a_mass_start_against_one_slow_seed_forms_one_mesh_and_loses_nothing() {
    mass_start(200, 3000);
}

/// A farm submitted while the coordinator (node 0, the seed of 100
/// nodes) is still swamped: it serves the messages that reach it 5 ms
/// each until 30 s, and the farm comes at 20 s. Its queue then holds the
/// workers' beats from before the farm, each saying its node holds
/// nothing, and it reaches them after it has handed those nodes tasks.
/// Such a beat spoke of a time before the tasks were sent: the claims
/// stay (each node ran 2 of its tasks again, 170 to 260 duplicates a
/// seed, while a beat stood for an empty claim list whatever its age).
#[test]
fn beats_that_waited_in_a_swamped_coordinators_queue_take_no_task_from_the_node_running_it() {
    for seed in 1..=3 {
        let r = swamped_seed(seed, 100, 5000, 400, 20_000);
        assert_eq!(r.tasks_done, 400, "seed {seed}: {}", r.summary());
        assert!(
            r.slow_wait_ms >= 2000,
            "seed {seed}: the coordinator was not swamped: {}",
            r.summary()
        );
        assert_eq!(
            (r.duplicates, r.executions),
            (0, 400),
            "seed {seed}: {}",
            r.summary()
        );
    }
}

/// The issue's size: 2,000 nodes, 2 ms a message at the seed: its queue
/// grows to minutes, and the mesh forms around its successors (one mesh
/// from 54 s; nodes 0, 1 and 2 each coordinated at some point, and no
/// task ran twice: 9 did while a beat that waited in the queue could
/// stand for an empty claim list). About 76 s and 1.8 GB in a release build, so left
/// out of `cargo test`: `cargo test --release -p mesh-sim --test heal -- --ignored --nocapture`.
#[test]
#[ignore]
fn a_mass_start_of_2000_nodes_against_one_slow_seed_forms_one_mesh() {
    mass_start(2000, 2000);
}

/// 21 nodes join node 0, which is paused (SIGSTOP) from its start to 45 s;
/// node 1 submits 300 tasks at 10 s, when no node can say whom the mesh
/// follows. Nobody elects itself meanwhile (a node `mesh join` pointed at
/// a mesh waits for its word, however long): once node 0 resumes, it
/// coordinates one mesh of all 21 at once, and the farm runs.
#[test]
fn a_stalled_seed_is_waited_for_and_nobody_elects_itself_meanwhile() {
    for seed in 1..=3 {
        let r = ok(&format!(
            r#"
seed = {seed}
submit_node = 1
submit_at_ms = 10000
[[nodes]]
count = 21
resources = "cpu=2"
[[stages]]
name = "work"
tasks = 300
durations = "uniform:100..500"
[[stall]]
node = 0
from_ms = 0
until_ms = 45000
"#
        ));
        assert_eq!(r.coordinators, [0], "seed {seed}: {}", r.summary());
        assert_eq!(r.tasks_done, 300);
        let formed = r.one_mesh_ms.expect("one mesh");
        assert!(
            formed <= 45_000 + 60_000,
            "seed {seed}: one mesh from {formed} ms"
        );
    }
}

/// Two meshes formed apart: nodes 0 to 3 (side A) and 4 to 7 (side B)
/// cannot reach each other until 20 s, each side joining its own lowest
/// node; node 1 submits 3,000 tasks of 50 to 150 ms at 2 s, which A runs
/// alone. At 20 s the sides can reach each other, and node `a` of A is
/// introduced to node `b` of B (as a node dials a member it remembers, or
/// a join address whose node is in another mesh). B's coordinator, node
/// 4, wins (its term is the higher ballot) and takes A's farm over.
fn meet(seed: u64, a: usize, b: usize) -> SimReport {
    ok(&format!(
        r#"
seed = {seed}
submit_node = 1
submit_at_ms = 2000
[[nodes]]
count = 8
resources = "cpu=2"
[[stages]]
name = "work"
tasks = 3000
durations = "uniform:50..150"
[[partitions]]
nodes = [4, 5, 6, 7]
from_ms = 0
until_ms = 20000
[[introduce]]
node = {a}
to = {b}
at_ms = 20000
"#
    ))
}

/// One mesh within 60 s of the meeting, A's farm done with every output
/// home, and no task run twice because of it. Each case once ran tasks
/// twice (over 20 seeds of each meeting, 4,432 duplicates in 104 of 120
/// runs; none now):
/// - (1, 4, 3): A's home offers its copy to node 4, which places the
///   farm's pending tasks at once, A's running ones among them, before
///   A's workers have said what they hold (15 duplicates);
/// - (3, 7, 3) and (2, 5, 1): A's coordinator hears of B only from B's
///   workers, which ignored its claim (an older term), and node 4 does
///   not know it: it coordinates on for seconds, and re-queues the tasks
///   of the worker that went over to B as if it had died (4 and 3);
/// - (0, 7, 1): A's coordinator, deposed, hands its farm over, and its
///   workers hear whom to follow only at their next report (8);
/// - (0, 4, 6) and (3, 4, 7): A's home takes outputs kept on B's nodes,
///   which it never saw as members, as lost 30 s after its own start
///   (578 and 549).
#[test]
fn two_meshes_that_meet_become_one_and_run_nothing_twice() {
    for (a, b, seed) in [
        (1, 4, 3),
        (3, 7, 3),
        (2, 5, 1),
        (0, 7, 1),
        (0, 4, 6),
        (3, 4, 7),
    ] {
        let r = meet(seed, a, b);
        let at = format!("{a} introduced to {b}, seed {seed}");
        assert_eq!(r.tasks_done, 3000, "{at}");
        assert_eq!(r.duplicates, 0, "{at}: {}", r.summary());
        assert!(r.coordinators.contains(&4), "{at}: {:?}", r.coordinators);
        let formed = r.one_mesh_ms.expect("one mesh");
        assert!(
            formed <= 20_000 + 60_000,
            "{at}: one mesh only from {formed} ms"
        );
    }
}

/// The scenario file users start from (`mesh sim sim/scenarios/heal.toml`):
/// 500 nodes against a seed swamped for 30 s, then paused for 20 s (to
/// 65 s) while the farm runs. Every task done with its output home, and
/// one mesh, whoever coordinates after the pause, within 60 s of it.
#[test]
fn the_heal_scenario_ends_in_one_mesh_with_every_output_home() {
    let path = format!("{}/scenarios/heal.toml", env!("CARGO_MANIFEST_DIR"));
    let cfg = mesh_sim::scenario::load_scenario(&path).unwrap_or_else(|e| panic!("{e}"));
    let r = run(&cfg).unwrap_or_else(|e| panic!("{e}"));
    println!("{}", r.summary());
    assert_eq!(r.tasks_done, 2000, "{}", r.summary());
    let formed = r.one_mesh_ms.expect("one mesh");
    assert!(
        formed <= 65_000 + 60_000,
        "one mesh only from {formed} ms: {}",
        r.summary()
    );
}
