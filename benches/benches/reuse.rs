//! Finished work never redone: a finished farm submitted again on 4 nodes, and run again with `mesh run` into another folder, against its first run.
//!
//! A farm of `MESH_BENCH_REUSE` (10,000) tasks, each writing a small output
//! (`echo {i} > r.txt`), then one gather over all of them. On 4 nodes of one
//! slot: `mesh submit --wait` from the last node to join, then the same
//! farm submitted again into another `--out`: every task is reused, its
//! output linked into the new folder. On one machine: `mesh run`, then
//! `mesh run --out` elsewhere. Reported: the second's wall time over the
//! first's (the cost of finding and placing 10,000 earlier results, as a
//! share of running them), and that nothing ran again.
//!
//! `cargo bench -p mesh-cli --bench reuse`

use std::process::Command;
use std::time::{Duration, Instant};

use mesh_benches::{knob, report, save, use_user_env, user_env};
use mesh_tests::{Cluster, Sandbox};

fn farm(n: u64) -> String {
    format!(
        r#"[farm]
name = "reuse"

[[stage]]
name = "make"
sweep.i = {{ range = "0..{last}" }}
workdir = "w/{{index}}"
shell = "echo {{i}} > r.txt"
outputs = ["r.txt"]

[[stage]]
name = "gather"
after = ["make"]
workdir = "w/gather"
shell = "cat {{out}}/make/*/r.txt | wc -l > n.txt"
outputs = ["n.txt"]
"#,
        last = n - 1
    )
}

fn main() {
    use_user_env();
    let n = knob("MESH_BENCH_REUSE", 10_000);
    let mesh = env!("CARGO_BIN_EXE_mesh");
    let mut results = Vec::new();

    // One machine: `mesh run`, then into another folder.
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("farm.toml"), farm(n)).expect("write farm");
    let run = |out: &str| -> (Duration, serde_json::Value) {
        let start = Instant::now();
        let o = user_env(&mut Command::new(mesh))
            .args([
                "run",
                "farm.toml",
                "--quiet",
                "--json",
                "--resources",
                "cpu=4",
            ])
            .args(["--out", out])
            .env("MESH_STATE_DIR", dir.path().join("state"))
            .current_dir(dir.path())
            .output()
            .expect("run mesh");
        let took = start.elapsed();
        assert!(
            o.status.success(),
            "mesh run failed: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        (took, serde_json::from_slice(&o.stdout).expect("--json"))
    };
    let (first, _) = run("a");
    let (again, v) = run("b");
    let cached = v["counts"]["cached"].as_u64().unwrap_or(0);
    println!(
        "mesh run: first {:.2}s, again into another folder {:.2}s, {cached} of {} reused",
        first.as_secs_f64(),
        again.as_secs_f64(),
        n + 1
    );
    assert_eq!(cached, n + 1, "every task reused");
    let whole = std::fs::read_to_string(dir.path().join("b/gather/0/n.txt")).expect("gather");
    assert_eq!(whole.trim(), n.to_string());
    let ratio = again.as_secs_f64() / first.as_secs_f64();
    results.push(report(
        &format!("mesh run of {n} tasks again into another --out / its first run"),
        ratio,
        "ratio",
        None,
    ));

    // Four nodes: submit, then submit again into another folder.
    let sb = Sandbox::new(mesh);
    let c = Cluster::start(&sb, &["cpu=1"; 4], &[]);
    sb.write("farm.toml", &farm(n));
    let submit = |out: &str| -> (Duration, String) {
        let out = sb.path().join(out).to_string_lossy().to_string();
        let start = Instant::now();
        let r = c.mesh(3, &["submit", "farm.toml", "--out", &out, "--wait"]);
        let took = start.elapsed();
        assert_eq!(r.code, Some(0), "mesh submit failed: {}", r.stderr);
        (took, r.stderr)
    };
    let (first, _) = submit("a");
    let (again, said) = submit("b");
    println!(
        "4 nodes: first {:.2}s, submitted again into another folder {:.2}s ({})",
        first.as_secs_f64(),
        again.as_secs_f64(),
        said.lines().last().unwrap_or("")
    );
    assert!(
        said.contains(&format!("({} reused", n + 1)),
        "every task reused: {said}"
    );
    assert_eq!(sb.read("b/gather/0/n.txt").trim(), n.to_string());
    let ratio = again.as_secs_f64() / first.as_secs_f64();
    results.push(report(
        &format!("4 nodes, {n} tasks submitted again into another --out / the first submission"),
        ratio,
        "ratio",
        None,
    ));
    save("reuse", &results);
}
