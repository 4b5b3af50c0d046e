//! `mesh report` on a 100,000-task farm (issue 63): how long it takes and how big the page is, against `mesh export` of the same farm in the same run.
//!
//! Two real nodes of 2 slots run a keyed farm of `MESH_BENCH_REPORT_TASKS`
//! (100,000) `true` tasks (1,000 merges each waiting for its key's split
//! tasks, so data moves between nodes and the timeline has two stages);
//! then, three times each, `mesh export FARM -o trace.json` (the baseline:
//! the report reads the same trace) and `mesh report FARM -o page.html`.
//! Targets: the report within 5 s and 20 MB of HTML.
//!
//! `cargo bench -p mesh-cli --bench report`

use std::process::Command;
use std::time::Duration;

use mesh_benches::{knob, median, report, save, time, use_user_env, write_keyed_farm};
use mesh_tests::{Cluster, Sandbox};

fn main() {
    use_user_env();
    let n = knob("MESH_BENCH_REPORT_TASKS", 100_000);
    let sb = Sandbox::new(env!("CARGO_BIN_EXE_mesh"));
    let c = Cluster::start(&sb, &["cpu=2", "cpu=2"], &[]);
    let farm = write_keyed_farm(sb.path(), n, "[\"true\"]");
    let r = c.mesh(0, &["submit", farm.to_str().unwrap(), "--wait"]);
    r.expect_code(0);
    let id = r.stdout.lines().next().expect("the farm's id").to_string();
    let tasks: u64 = c.mesh(0, &["status", &id, "--json"]).json()["counts"]["total"]
        .as_u64()
        .expect("counts");
    println!("farm {id}: {tasks} tasks done on 2 nodes");

    let node = c.nodes[0].state.clone();
    let run = |args: &[&str]| -> Duration {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_mesh"));
        cmd.current_dir(sb.path())
            .env("MESH_STATE_DIR", &node)
            .args(args);
        time(&mut cmd)
    };
    let trace = sb.path().join("trace.json");
    let page = sb.path().join("page.html");
    let export = median(
        (0..3)
            .map(|_| run(&["export", &id, "-o", trace.to_str().unwrap()]))
            .collect(),
    );
    let made = median(
        (0..3)
            .map(|_| run(&["report", &id, "-o", page.to_str().unwrap()]))
            .collect(),
    );
    let mb = std::fs::metadata(&page).expect("the page").len() as f64 / 1e6;
    let trace_mb = std::fs::metadata(&trace).expect("the trace").len() as f64 / 1e6;
    println!(
        "mesh export: {:.2} s, {trace_mb:.1} MB of JSON",
        export.as_secs_f64()
    );
    let results = vec![
        report(
            &format!("mesh report, {tasks} tasks (s)"),
            made.as_secs_f64(),
            "s",
            Some(("<=", 5.0, made.as_secs_f64() <= 5.0)),
        ),
        report(
            "mesh report / mesh export, same farm",
            made.as_secs_f64() / export.as_secs_f64(),
            "ratio",
            None,
        ),
        report(
            &format!("the page, {tasks} tasks (MB)"),
            mb,
            "MB",
            Some(("<=", 20.0, mb <= 20.0)),
        ),
    ];
    save("report", &results);
}
