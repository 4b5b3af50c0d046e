//! Per-task overhead: N tasks of `true` through `mesh run` against `xargs -P ncpu`
//! and against a minimal Rust spawn loop (the floor), measured in one run;
//! and `mesh run` with what each task used left unmeasured (`MESH_MEASURE=0`),
//! so the cost of measuring is the ratio of the two, each against xargs.
//!
//! All three run their tasks in the same environment: the user's, without
//! what cargo adds (see `user_env`).
//!
//! `cargo bench -p mesh-cli --bench overhead`; knobs: MESH_BENCH_TASKS (10000), MESH_BENCH_REPEAT (3).

use std::process::Command;

use mesh_benches::{
    knob, median, ncpu, report, save, self_cpu, spawn_loop, time, user_env, write_range_farm,
};

fn main() {
    // cargo passes --bench (and filters); this harness takes none of them.
    let n = knob("MESH_BENCH_TASKS", 10_000);
    let repeat = knob("MESH_BENCH_REPEAT", 3) as usize;
    let p = ncpu();
    let mesh = env!("CARGO_BIN_EXE_mesh");
    println!("overhead: {n} tasks of `true`, {p} at a time, median of {repeat}");

    let (mut xargs, mut mesh_t, mut floor, mut cpu_ms) = (vec![], vec![], vec![], vec![]);
    let mut unmeasured = Vec::new();
    let mut floor_cpu_ms = Vec::new();
    for _ in 0..repeat {
        xargs.push(time(
            Command::new("sh")
                .arg("-c")
                .arg(format!("seq {n} | xargs -P {p} -n1 true")),
        ));
        let before = self_cpu();
        floor.push(spawn_loop(n as usize, p));
        floor_cpu_ms.push((self_cpu() - before).as_secs_f64() * 1000.0);
        let run = |measure: &str| {
            let dir = tempfile::tempdir().expect("temp dir");
            let farm = write_range_farm(dir.path(), n, "[\"true\"]");
            let start = std::time::Instant::now();
            let out = user_env(&mut Command::new(mesh))
                .args([
                    "run",
                    farm.to_str().unwrap(),
                    "--json",
                    "--quiet",
                    "--resources",
                    &format!("cpu={p}"),
                ])
                .env("MESH_STATE_DIR", dir.path().join("state"))
                .env("MESH_MEASURE", measure)
                .current_dir(dir.path())
                .output()
                .expect("run mesh");
            (start.elapsed(), out)
        };
        let (took, off) = run("0");
        assert!(off.status.success(), "mesh failed unmeasured");
        unmeasured.push(took);
        let (took, out) = run("1");
        mesh_t.push(took);
        println!(
            "  sample: xargs {:.3}s floor {:.3}s mesh {:.3}s",
            xargs.last().unwrap().as_secs_f64(),
            floor.last().unwrap().as_secs_f64(),
            mesh_t.last().unwrap().as_secs_f64()
        );
        assert!(
            out.status.success(),
            "mesh failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("mesh --json output");
        assert_eq!(v["counts"]["done"], n, "every task ran");
        cpu_ms.push(v["mesh_cpu_ms"].as_f64().unwrap_or(0.0));
    }
    let (x, m, f) = (median(xargs), median(mesh_t), median(floor));
    let u = median(unmeasured);
    let measuring = m.as_secs_f64() / u.as_secs_f64();
    cpu_ms.sort_by(f64::total_cmp);
    let cpu = cpu_ms[cpu_ms.len() / 2];
    floor_cpu_ms.sort_by(f64::total_cmp);
    let floor_cpu = floor_cpu_ms[floor_cpu_ms.len() / 2];
    let ratio = m.as_secs_f64() / x.as_secs_f64();
    let results = vec![
        report("xargs wall", x.as_secs_f64(), "s", None),
        report("spawn-loop floor wall", f.as_secs_f64(), "s", None),
        report("mesh run wall", m.as_secs_f64(), "s", None),
        report(
            "mesh run wall, tasks unmeasured (MESH_MEASURE=0)",
            u.as_secs_f64(),
            "s",
            None,
        ),
        report(
            "unmeasured / xargs wall ratio",
            u.as_secs_f64() / x.as_secs_f64(),
            "",
            None,
        ),
        // What measuring each task's CPU, memory and bytes costs.
        report(
            "measured / unmeasured wall ratio",
            measuring,
            "",
            Some(("<=", 1.03, measuring <= 1.03)),
        ),
        report(
            "mesh / xargs wall ratio",
            ratio,
            "",
            Some(("<=", 0.75, ratio <= 0.75)),
        ),
        report(
            "floor / xargs wall ratio",
            f.as_secs_f64() / x.as_secs_f64(),
            "",
            None,
        ),
        report(
            "mesh / floor wall ratio",
            m.as_secs_f64() / f.as_secs_f64(),
            "",
            None,
        ),
        report(
            "mesh own cpu per task",
            cpu / n as f64,
            "ms",
            Some(("<=", 0.05, cpu / n as f64 <= 0.05)),
        ),
        // What spawning and reaping alone cost the spawning process: the
        // floor under mesh's own CPU per task.
        report("floor own cpu per task", floor_cpu / n as f64, "ms", None),
        report("mesh / floor own cpu", cpu / floor_cpu, "", None),
    ];
    save("overhead", &results);
}
