//! A mass start on this machine: N nodes launched at once against one seed, as a batch system's job array starts them; how soon they are one mesh, and how many meshes there are after two minutes.
//!
//! For each size in `MESH_BENCH_MASS_SIZES` (`200,400,600`), the first
//! node starts alone and the N-1 others `mesh join` it, launched as fast
//! as this process can start them. Measured:
//! - one mesh: from the last launch until every node has printed
//!   `mesh node … joined` for each of the N-1 others and all follow one
//!   coordinator (target: 600 nodes within 120 s);
//! - meshes after two minutes: the distinct coordinators the nodes
//!   follow, a node that follows none counting as a mesh of its own
//!   (target: 1), and nodes that exited (target: 0).
//!
//! `cargo bench -p mesh-cli --bench mass_start` (600 nodes want about
//! 9 GB of memory).

use std::time::Duration;

use mesh_benches::procs;
use mesh_benches::{report, save};

/// How long after the last launch the meshes are counted.
const AFTER: Duration = Duration::from_secs(120);

fn main() {
    mesh_benches::use_user_env();
    let bin = procs::mesh_bin(env!("CARGO_BIN_EXE_mesh"));
    let sizes: Vec<usize> = std::env::var("MESH_BENCH_MASS_SIZES")
        .unwrap_or_else(|_| "200,400,600".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let mut results = Vec::new();
    for &n in &sizes {
        let dir = tempfile::tempdir().expect("temp dir");
        let (mut nodes, launched) = procs::start(&bin, dir.path(), n);
        let one = procs::wait_all_see_all(&nodes, AFTER, true);
        let took = launched.elapsed().as_secs_f64();
        match &one {
            Ok(()) => println!("{n} nodes: one mesh {took:.1} s after the last launch"),
            Err(e) => println!("{n} nodes: NOT one mesh after {took:.0} s: {e}"),
        }
        std::thread::sleep(AFTER.saturating_sub(launched.elapsed()));
        let meshes = procs::meshes(&nodes);
        let exited = nodes
            .iter_mut()
            .map(|nd| nd.child.try_wait().ok().flatten().is_some())
            .filter(|&gone| gone)
            .count();
        println!(
            "  after {} s: {meshes} mesh(es), {exited} node(s) exited",
            AFTER.as_secs()
        );
        let target = (n >= 600).then_some(("<=", 120.0, one.is_ok() && took <= 120.0));
        results.push(report(
            &format!("{n} nodes at once: one mesh (s)"),
            if one.is_ok() { took } else { f64::INFINITY },
            "s",
            target,
        ));
        results.push(report(
            &format!("{n} nodes at once: meshes after 2 min"),
            meshes as f64,
            "meshes",
            Some(("<=", 1.0, meshes == 1)),
        ));
        results.push(report(
            &format!("{n} nodes at once: nodes exited"),
            exited as f64,
            "nodes",
            Some(("<=", 0.0, exited == 0)),
        ));
        drop(nodes);
    }
    save("mass_start", &results);
}
