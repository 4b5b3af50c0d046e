//! Thin tasks across the mesh: 2 and 4 nodes on loopback, one slot each, against one node with the same slots.
//!
//! A farm of `MESH_BENCH_THIN` (4000) tasks of `true`, and as many of
//! `sleep 0.005`, submitted with `mesh submit --wait` on the last node to
//! join (not the coordinator) of N nodes with `--resources cpu=1` each,
//! against `mesh run --resources cpu=N` of the same farm on one machine,
//! measured in the same run (median of `MESH_BENCH_REPEAT`, 3). The ratio
//! is mesh submit's wall time over mesh run's (target at most 1.10): what
//! spreading thin tasks over nodes costs when every task is about as short
//! as a round trip to the coordinator. Also printed: each node's prefetch
//! depth at the end, from `mesh status --json`.
//!
//! `cargo bench -p mesh-cli --bench thin`

use std::process::Command;
use std::time::{Duration, Instant};

use mesh_benches::{knob, median, report, save, use_user_env, user_env, write_range_farm};
use mesh_tests::{Cluster, Sandbox};

fn main() {
    // The nodes below inherit this environment: cargo's additions (its
    // LD_LIBRARY_PATH alone costs every exec ~50 us) would slow their
    // tasks and not those of `mesh run`, started with `user_env`.
    use_user_env();
    let n = knob("MESH_BENCH_THIN", 4000);
    let repeat = knob("MESH_BENCH_REPEAT", 3) as usize;
    let mesh = env!("CARGO_BIN_EXE_mesh");
    let mut results = Vec::new();
    for (what, command) in [
        ("true", "[\"true\"]"),
        ("sleep 0.005", "[\"sleep\", \"0.005\"]"),
    ] {
        for nodes in [2usize, 4] {
            println!("{n} tasks of `{what}`, {nodes} nodes of one slot");
            let (mut local, mut spread) = (Vec::new(), Vec::new());
            for _ in 0..repeat {
                let dir = tempfile::tempdir().expect("temp dir");
                let farm = write_range_farm(dir.path(), n, command);
                let start = Instant::now();
                let out = user_env(&mut Command::new(mesh))
                    .args(["run", farm.to_str().unwrap(), "--quiet", "--resources"])
                    .arg(format!("cpu={nodes}"))
                    .env("MESH_STATE_DIR", dir.path().join("state"))
                    .current_dir(dir.path())
                    .output()
                    .expect("run mesh");
                local.push(start.elapsed());
                assert!(
                    out.status.success(),
                    "mesh run failed: {}",
                    String::from_utf8_lossy(&out.stderr)
                );

                let sb = Sandbox::new(mesh);
                let cluster = Cluster::start(&sb, &vec!["cpu=1"; nodes], &[]);
                write_range_farm(sb.path(), n, command);
                let start = Instant::now();
                let r = cluster.mesh(nodes - 1, &["submit", "farm.toml", "--wait"]);
                spread.push(start.elapsed());
                assert_eq!(r.code, Some(0), "mesh submit failed: {}", r.stderr);
                let status = cluster.mesh(nodes - 1, &["status", "--json"]);
                let v: serde_json::Value =
                    serde_json::from_str(&status.stdout).expect("status --json");
                let depths: Vec<u64> = v["nodes"]
                    .as_array()
                    .map(|a| a.iter().filter_map(|n| n["prefetch"].as_u64()).collect())
                    .unwrap_or_default();
                println!(
                    "  sample: mesh run {:.3}s, mesh submit {:.3}s, prefetch depths {depths:?}",
                    secs(*local.last().unwrap()),
                    secs(*spread.last().unwrap())
                );
            }
            let (l, s) = (median(local), median(spread));
            let ratio = secs(s) / secs(l);
            results.push(report(
                &format!(
                    "{nodes} nodes x 1 slot, {n} x `{what}`: mesh submit / mesh run cpu={nodes}"
                ),
                ratio,
                "ratio",
                Some(("<=", 1.10, ratio <= 1.10)),
            ));
        }
    }
    save("thin", &results);
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}
