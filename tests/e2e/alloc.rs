//! Nodes started by batch jobs: a node that knows its walltime drains before it, and no task is failed for it.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use mesh_tests::{wait_until, Cluster};

use crate::mesh::slow_farm;
use crate::sandbox;

/// The farm with no retries: a task failed for a drain would fail it.
fn no_retries(farm: String) -> String {
    farm + "retries = 0\n"
}

#[test]
fn a_node_with_a_walltime_drains_before_it_and_no_task_fails_for_it() {
    let sb = sandbox();
    let mut c = Cluster::start(&sb, &["cpu=2", "cpu=2"], &[]);
    // The batch job's node: 6 s of walltime, drained 1 s before.
    let state = sb.path().join("n-job");
    fs::create_dir_all(&state).expect("mkdir");
    let key = state.join("mesh.key");
    fs::copy(sb.path().join("n0/mesh.key"), &key).expect("copy key");
    fs::set_permissions(&key, fs::Permissions::from_mode(0o600)).expect("chmod");
    let first = c.nodes[0].address();
    c.add(
        &state,
        Some(&first),
        "cpu=2",
        &["--walltime", "6s", "--drain-margin", "1s"],
    );
    assert!(
        wait_until(Duration::from_secs(20), || c.status(0)["nodes"]
            .as_array()
            .is_some_and(|n| n.len() == 3)),
        "the job's node joined"
    );
    // No retries: a task failed for the drain would fail the farm.
    sb.write("slow.toml", &no_retries(slow_farm(30, "1")));
    let r = c.mesh(0, &["submit", "slow.toml", "--out", "slow-out"]);
    r.expect_code(0);
    let id = r.stdout.trim().to_string();
    assert!(
        wait_until(Duration::from_secs(20), || c.own_status(2)["running"]
            .as_u64()
            > Some(0)),
        "the job's node ran tasks"
    );
    // It stops by itself, before its walltime is over (started ~6 s ago at most).
    let code = c.nodes[2].wait_exit(Duration::from_secs(15));
    assert_eq!(code, Some(0), "{}", c.nodes[2].lines().join("\n"));
    assert!(
        c.nodes[2]
            .lines()
            .iter()
            .any(|l| l.contains("walltime near: draining")),
        "{}",
        c.nodes[2].lines().join("\n")
    );
    let r = c.mesh(0, &["wait", &id, "--json"]);
    r.expect_code(0);
    let v = r.json();
    assert_eq!(v["counts"]["done"], 30, "{v}");
    assert_eq!(v["counts"]["failed"], 0, "{v}");
    for i in 0..30 {
        assert_eq!(sb.read(&format!("slow-out/s/{i}/r.txt")), format!("{i}\n"));
    }
}

#[test]
fn a_slurm_job_of_the_generated_script_joins_runs_tasks_and_drains_before_its_walltime() {
    use mesh_node::batch::{parse_submitted, script, Launch};
    use mesh_protocol::alloc::{BatchSystem, QueueDef};

    let sb = sandbox();
    let slurm = match mesh_tests::Slurm::start(&sb.path().join("slurm")) {
        Ok(s) => s,
        Err(why) => {
            assert!(
                std::env::var_os("MESH_REQUIRE_SLURM").is_none(),
                "MESH_REQUIRE_SLURM is set and SLURM cannot start: {why}"
            );
            eprintln!("SKIPPED: no SLURM cluster here: {why}");
            return;
        }
    };
    let c = Cluster::start(&sb, &["cpu=1"], &[]);
    let q = QueueDef {
        name: "cpu".into(),
        system: BatchSystem::Slurm,
        time_limit_s: 40,
        cores: 1,
        mem_bytes: None,
        gpus: 0,
        nodes_per_job: 1,
        partition: None,
        account: None,
        directives: Vec::new(),
        prologue: vec!["echo prologue ran".into()],
        min: 0,
        max: 1,
        idle_timeout_s: 60,
    };
    let path = |p: &str| sb.path().join(p).to_string_lossy().into_owned();
    let launch = Launch {
        mesh: env!("CARGO_BIN_EXE_mesh").into(),
        join: c.nodes[0].address(),
        key: path("n0/mesh.key"),
        state_root: path("jobs"),
        log_dir: sb.path().to_string_lossy().into_owned(),
    };
    let job = sb.write("job.sh", &script(&q, &launch));
    let out = slurm
        .command("sbatch")
        .arg("--parsable")
        .arg(&job)
        .output()
        .expect("sbatch");
    let id = parse_submitted(BatchSystem::Slurm, &String::from_utf8_lossy(&out.stdout))
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    let joined = wait_until(Duration::from_secs(60), || {
        c.status(0)["nodes"]
            .as_array()
            .is_some_and(|n| n.len() == 2)
    });
    assert!(joined, "the job's node joined; squeue: {}", slurm.queue());

    sb.write("many.toml", &no_retries(slow_farm(60, "1")));
    let r = c.mesh(0, &["submit", "many.toml", "--out", "many-out"]);
    r.expect_code(0);
    let farm = r.stdout.trim().to_string();
    let remote_busy = || {
        c.status(0)["nodes"].as_array().is_some_and(|n| {
            n.iter()
                .any(|v| v["local"] == false && v["running"].as_u64() > Some(0))
        })
    };
    assert!(
        wait_until(Duration::from_secs(30), remote_busy),
        "the job's node ran tasks"
    );
    // The node drains before the walltime and the job ends by itself.
    let ended = wait_until(Duration::from_secs(60), || !slurm.queue().contains(&id));
    assert!(ended, "the job ended: {}", slurm.queue());
    let log = fs::read_to_string(sb.path().join(format!("mesh-cpu-{id}.out"))).unwrap_or_default();
    assert!(log.contains("prologue ran"), "{log}");
    assert!(log.contains("walltime near: draining"), "{log}");
    assert!(
        !log.contains("CANCELLED"),
        "killed by SLURM rather than drained:\n{log}"
    );

    let r = c.mesh(0, &["wait", &farm, "--json"]);
    r.expect_code(0);
    let v = r.json();
    assert_eq!(v["counts"]["done"], 60, "{v}");
    assert_eq!(v["counts"]["failed"], 0, "{v}");
}
