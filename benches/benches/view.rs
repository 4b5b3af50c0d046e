//! What a task's own view of `{out}` costs a gather: a farm of many tasks that each leave an output, and one gather over all of them, with the gather reading them through its view against reading the farm's folder itself, in the same run.
//!
//! `MESH_BENCH_VIEW` (100,000) tasks `echo {i} > r.txt`, then a gather
//! `printf '%s\n' .../make/*/r.txt | xargs cat | wc -l` (the shell's own
//! `printf`, as 100,000 paths are more than one command's arguments may
//! be). Two farms, alike but for the gather's line: one reads `{out}/make/*/r.txt` (its view: a folder per task it
//! depends on, a link per file, made before it starts), the other the
//! same glob under the farm's output folder given as a plain path (no
//! `{out}` in its line, so no view: what every gather did before). Each
//! farm runs whole once (`mesh run`), then once more with every `make`
//! reused and the gather run again (`--rerun gather`), which isolates the
//! gather's start. Reported: whole farm with the view / without, and the
//! gather's rerun with / without.
//!
//! `cargo bench -p mesh-cli --bench view`

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use mesh_benches::{knob, report, save, use_user_env, user_env};

fn farm(name: &str, n: u64, gather_reads: &str) -> String {
    format!(
        r#"[farm]
name = "{name}"

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
shell = "printf '%s\\n' {gather_reads}/make/*/r.txt | xargs cat | wc -l > n.txt"
outputs = ["n.txt"]
"#,
        last = n - 1
    )
}

fn run(mesh: &str, dir: &Path, file: &str, extra: &[&str]) -> Duration {
    let start = Instant::now();
    let o = user_env(&mut Command::new(mesh))
        .args(["run", file, "--quiet", "--resources", "cpu=2"])
        .args(extra)
        .env("MESH_STATE_DIR", dir.join("state"))
        .current_dir(dir)
        .output()
        .expect("run mesh");
    let took = start.elapsed();
    assert!(
        o.status.success(),
        "mesh run failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    took
}

fn main() {
    use_user_env();
    let n = knob("MESH_BENCH_VIEW", 100_000);
    let mesh = env!("CARGO_BIN_EXE_mesh");
    let dir = tempfile::tempdir().expect("temp dir");
    let plain_out = dir.path().join("mesh-out/plain");
    std::fs::write(dir.path().join("view.toml"), farm("view", n, "{out}")).expect("write");
    std::fs::write(
        dir.path().join("plain.toml"),
        farm("plain", n, &plain_out.to_string_lossy()),
    )
    .expect("write");

    let whole_view = run(mesh, dir.path(), "view.toml", &[]);
    let whole_plain = run(mesh, dir.path(), "plain.toml", &[]);
    for name in ["view", "plain"] {
        let got =
            std::fs::read_to_string(dir.path().join(format!("mesh-out/{name}/gather/0/n.txt")))
                .expect("the gather's output");
        assert_eq!(
            got.trim(),
            n.to_string(),
            "{name}: the gather saw every output"
        );
    }
    // The gather alone, alternated, 3 times each.
    let (mut g_view, mut g_plain) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        g_view.push(run(mesh, dir.path(), "view.toml", &["--rerun", "gather"]).as_secs_f64());
        g_plain.push(run(mesh, dir.path(), "plain.toml", &["--rerun", "gather"]).as_secs_f64());
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (gv, gp) = (median(&mut g_view), median(&mut g_plain));
    println!(
        "{n} tasks and a gather: whole farm {:.2}s with the view, {:.2}s without; the gather rerun {gv:.2}s / {gp:.2}s (medians of 3)",
        whole_view.as_secs_f64(),
        whole_plain.as_secs_f64()
    );
    let whole = whole_view.as_secs_f64() / whole_plain.as_secs_f64();
    let results = vec![
        report(
            &format!("{n} outputs and a gather, with the view / without"),
            whole,
            "ratio",
            Some(("<=", 1.2, whole <= 1.2)),
        ),
        report(
            &format!("the gather of {n} run again, with the view / without"),
            gv / gp,
            "ratio",
            None,
        ),
    ];
    save("view", &results);
}
