//! Nodes started by batch jobs: a node that knows its walltime drains before it, and no task is failed for it.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use mesh_tests::{slow_farm, wait_until, Cluster};

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
    // Given two addresses, as batch scripts give several: the first is
    // dead (a node gone since), the second answers.
    let join = format!("/ip4/127.0.0.1/tcp/9,{}", c.nodes[0].address());
    c.add(
        &state,
        Some(&join),
        "cpu=2",
        &["--walltime", "6s", "--drain-margin", "1s"],
    );
    assert!(
        wait_until(Duration::from_secs(20), || c.status(0)["nodes"]
            .as_array()
            .is_some_and(|n| n.len() == 3)),
        "the job's node joined"
    );
    // Every node shows when it drains.
    let s = c.status(0);
    let drains: Vec<u64> = s["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .filter_map(|n| n["drains_in_s"].as_u64())
        .collect();
    assert!(matches!(drains.as_slice(), [d] if *d <= 5), "{s}");
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

/// One SLURM cluster at a time: they share the machine's munged and its socket.
static ONE_SLURM: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// A SLURM cluster, and the right to run it: its fields drop in order, so
/// the cluster is stopped before the next test may start one.
struct OneSlurm {
    slurm: mesh_tests::Slurm,
    _one: std::sync::MutexGuard<'static, ()>,
}

impl std::ops::Deref for OneSlurm {
    type Target = mesh_tests::Slurm;
    fn deref(&self) -> &mesh_tests::Slurm {
        &self.slurm
    }
}

/// A real one-node SLURM cluster, or None (and why) where it cannot start.
fn slurm(sb: &mesh_tests::Sandbox) -> Option<OneSlurm> {
    // A test that failed holding it poisoned it; its cluster is gone all the same.
    let one = ONE_SLURM.lock().unwrap_or_else(|e| e.into_inner());
    match mesh_tests::Slurm::start(&sb.path().join("slurm")) {
        Ok(slurm) => Some(OneSlurm { slurm, _one: one }),
        Err(why) => {
            assert!(
                std::env::var_os("MESH_REQUIRE_SLURM").is_none(),
                "MESH_REQUIRE_SLURM is set and SLURM cannot start: {why}"
            );
            eprintln!("SKIPPED: no SLURM cluster here: {why}");
            None
        }
    }
}

/// The whole loop against a real SLURM: a backlog makes the coordinator
/// submit a job through `mesh alloc`; the job's node joins and runs
/// tasks; its walltime, shorter than the farm, drains it without failing
/// a task, and the coordinator submits a job to replace it; once the work
/// is done the idle job is cancelled.
#[test]
fn mesh_alloc_scales_a_real_slurm_out_and_in_and_walltimes_fail_no_task() {
    let sb = sandbox();
    let Some(slurm) = slurm(&sb) else { return };
    let env = vec![(
        "SLURM_CONF".to_string(),
        slurm.conf.to_string_lossy().into_owned(),
    )];
    // The node is given its state folder relative to where it runs (the
    // same folder the harness names absolutely), as a user typing
    // `mesh node --state-dir n0` would: the jobs start elsewhere.
    let mut c = Cluster::start_with_env(&sb, &["cpu=1"], &["--state-dir", "n0"], env);

    // The script it would submit, without submitting it.
    let args = [
        "alloc",
        "add",
        "slurm",
        "--time",
        "1m",
        "--cores",
        "1",
        "--max",
        "2",
        "--idle-timeout",
        "5s",
        "--prologue",
        "echo prologue ran",
        "--name",
        "cpu",
    ];
    let dry = c.mesh(0, &[&args[..], &["--dry-run"]].concat());
    dry.expect_code(0);
    assert!(
        dry.stdout.contains("#SBATCH --time=0:01:00"),
        "{}",
        dry.stdout
    );
    assert!(dry.stdout.contains(" join "), "{}", dry.stdout);
    // Every path in the script is absolute.
    let n0 = sb.path().canonicalize().expect("sandbox").join("n0");
    for want in [
        format!("--output={}/alloc/cpu/", n0.display()),
        format!("--state-dir {}/alloc/nodes/", n0.display()),
        format!("--key {}/mesh.key ", n0.display()),
    ] {
        assert!(dry.stdout.contains(&want), "no {want} in\n{}", dry.stdout);
    }
    assert!(c.mesh(0, &["alloc", "list", "--json"]).json()["queues"]
        .as_array()
        .is_some_and(|q| q.is_empty()));
    c.mesh(0, &args).expect_code(0);
    let list = c.mesh(0, &["alloc", "list"]);
    assert!(
        list.stdout.contains("cpu") && list.stdout.contains("active"),
        "{}",
        list.stdout
    );

    // 120 tasks of 2 s: 80 s on three cores, longer than the jobs' nodes
    // have before their drain; each expected to take 3 s, so a node stops
    // starting them when less than that is left.
    let farm = slow_farm(120, "2") + "expected = \"3s\"\n";
    sb.write("many.toml", &no_retries(farm));
    let r = c.mesh(0, &["submit", "many.toml", "--out", "many-out"]);
    r.expect_code(0);
    let id = r.stdout.trim().to_string();

    let book = || c.mesh(0, &["alloc", "info", "cpu", "--json"]).json();
    let jobs = |b: &serde_json::Value| b["jobs"].as_array().cloned().unwrap_or_default();
    assert!(
        wait_until(Duration::from_secs(60), || jobs(&book())
            .iter()
            .any(|j| j["joined"] == true)),
        "a job was submitted and its node joined: {}\n{}",
        book(),
        slurm.queue()
    );
    // The job's node says which job it is (of an array, the one that joined
    // first need not be the first listed).
    let first = jobs(&book())
        .iter()
        .find(|j| j["joined"] == true)
        .map(|j| j["job"]["id"].clone())
        .expect("a job joined");
    let s = c.status(0);
    assert!(
        s["nodes"]
            .as_array()
            .is_some_and(|n| n.iter().any(|n| n["job"] == first)),
        "{s}"
    );
    let r = c.mesh(0, &["wait", &id, "--json"]);
    r.expect_code(0);
    let v = r.json();
    assert_eq!(v["counts"]["done"], 120, "{v}");
    assert_eq!(v["counts"]["failed"], 0, "{v}");
    for i in 0..120 {
        assert_eq!(sb.read(&format!("many-out/s/{i}/r.txt")), format!("{i}\n"));
    }

    // The two jobs went as one array; their nodes drained before their
    // walltime and the jobs ended by themselves; the coordinator replaced them.
    let b = book();
    let all = jobs(&b);
    assert!(all.len() >= 3, "the drained jobs were replaced: {b}");
    let first = all[0]["job"]["id"].as_str().expect("a job id");
    let (array, _) = first.split_once('_').expect("an array element");
    assert_eq!(all[1]["job"]["id"], format!("{array}_2"), "{b}");
    let outs: Vec<String> = fs::read_dir(sb.path().join("n0/alloc/cpu"))
        .expect("the queue's folder")
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".out"))
        .filter_map(|e| fs::read_to_string(e.path()).ok())
        .collect();
    let drained = outs
        .iter()
        .filter(|l| l.contains("walltime near: draining"))
        .count();
    assert!(drained >= 2, "both first nodes drained: {outs:?}");
    assert!(outs.iter().all(|l| l.contains("prologue ran")), "{outs:?}");
    assert!(
        !outs
            .iter()
            .any(|l| l.contains("CANCELLED") && l.contains("TIME LIMIT")),
        "killed by SLURM's time limit rather than drained: {outs:?}"
    );

    // Nothing waits any more: the idle job is cancelled, and every job ends.
    let ended = wait_until(Duration::from_secs(60), || {
        jobs(&book()).iter().all(|j| j["job"]["state"] == "Ended")
    });
    assert!(ended, "every job ended: {}\n{}", book(), slurm.queue());
    let log = c.mesh(0, &["alloc", "log", "cpu"]).stdout;
    assert!(log.contains("cancelling: idle for"), "{log}");
    assert!(log.contains("submitted: "), "{log}");
    assert!(
        wait_until(Duration::from_secs(20), || slurm.queue().trim().is_empty()),
        "{}",
        slurm.queue()
    );

    // The queues and their jobs are kept on disk: a node killed and
    // restarted on its state folder still has them.
    let before = c.mesh(0, &["alloc", "list", "--json"]).json();
    c.kill(0);
    c.restart(0, "cpu=1", &[]);
    let after = c.mesh(0, &["alloc", "list", "--json"]).json();
    assert_eq!(after["queues"], before["queues"]);
    assert_eq!(after["jobs"], before["jobs"]);
    assert!(
        wait_until(Duration::from_secs(20), || c
            .mesh(0, &["alloc", "pause", "cpu"])
            .code
            == Some(0)),
        "the restarted node coordinates its queue again"
    );
    assert!(c
        .mesh(0, &["alloc", "list"])
        .stdout
        .contains("paused by the user"));

    // Removing the queue leaves nothing behind.
    c.mesh(0, &["alloc", "remove", "cpu"]).expect_code(0);
    assert!(c.mesh(0, &["alloc", "list", "--json"]).json()["queues"]
        .as_array()
        .is_some_and(|q| q.is_empty()));
}

/// The allocation queues are the mesh's, not one node's: added on any
/// node, seen on every node, and kept when the coordinator dies.
#[test]
fn allocation_queues_are_replicated_and_survive_the_coordinator() {
    let sb = sandbox();
    let mut c = Cluster::start(&sb, &["cpu=1", "cpu=1", "cpu=1"], &[]);
    let coordinator = c.status(0)["coordinator"]
        .as_str()
        .expect("a coordinator")
        .to_string();
    let ids: Vec<String> = (0..3)
        .map(|i| c.own_status(i)["id"].as_str().expect("id").to_string())
        .collect();
    let coord = ids
        .iter()
        .position(|i| *i == coordinator)
        .expect("one of ours");
    let other = (coord + 1) % 3;

    // Bad input is refused with a reason, and changes nothing.
    let r = c.mesh(
        other,
        &[
            "alloc", "add", "pbs", "--time", "1h", "--cores", "4", "--min", "3", "--max", "2",
        ],
    );
    assert_eq!(r.code, Some(2));
    assert!(
        r.stderr.contains("--min 3 is more than --max 2"),
        "{}",
        r.stderr
    );
    let r = c.mesh(other, &["alloc", "pause", "nope"]);
    assert!(
        r.stderr.contains("no allocation queue `nope`"),
        "{}",
        r.stderr
    );

    let dry = c.mesh(
        other,
        &[
            "alloc",
            "add",
            "pbs",
            "--time",
            "2h",
            "--cores",
            "24",
            "--nodes-per-job",
            "2",
            "--queue",
            "workq",
            "--dry-run",
        ],
    );
    dry.expect_code(0);
    assert!(
        dry.stdout.contains("#PBS -l select=2:ncpus=24"),
        "{}",
        dry.stdout
    );
    assert!(dry.stdout.contains("pbsdsh"), "{}", dry.stdout);

    c.mesh(
        other,
        &[
            "alloc", "add", "pbs", "--time", "2h", "--cores", "24", "--queue", "workq",
        ],
    )
    .expect_code(0);
    let has = |i: usize| {
        c.mesh(i, &["alloc", "list", "--json"]).json()["queues"]
            .as_array()
            .is_some_and(|q| q.len() == 1 && q[0]["def"]["name"] == "pbs")
    };
    assert!(
        wait_until(Duration::from_secs(10), || (0..3).all(has)),
        "every node has the queue"
    );
    let r = c.mesh(
        other,
        &[
            "alloc", "add", "pbs", "--time", "2h", "--cores", "24", "--name", "pbs",
        ],
    );
    assert!(r.stderr.contains("already a queue `pbs`"), "{}", r.stderr);

    // The coordinator dies; the new one has the queue and takes changes.
    c.kill(coord);
    let survivor = (coord + 2) % 3;
    assert!(
        wait_until(Duration::from_secs(20), || c
            .mesh(survivor, &["alloc", "pause", "pbs"])
            .code
            == Some(0)),
        "a new coordinator takes the change"
    );
    let info = c.mesh(other, &["alloc", "info", "pbs"]).stdout;
    assert!(info.contains("paused: paused by the user"), "{info}");
    let log = c.mesh(other, &["alloc", "log", "pbs"]).stdout;
    assert!(
        log.contains("pbs: added") && log.contains("pbs: paused by the user"),
        "{log}"
    );
}

/// A job the coordinator submitted and died before it booked: its name
/// carries the mesh and the queue, so the coordinator that has the queue
/// now finds it in `squeue`, books it, and cancels it when it idles,
/// rather than leaving it to its walltime.
#[test]
fn a_job_of_this_mesh_missing_from_the_book_is_adopted_from_squeue_and_given_back_when_idle() {
    let sb = sandbox();
    let Some(slurm) = slurm(&sb) else { return };
    let env = vec![(
        "SLURM_CONF".to_string(),
        slurm.conf.to_string_lossy().into_owned(),
    )];
    let c = Cluster::start_with_env(&sb, &["cpu=1"], &[], env);
    let args = [
        "alloc",
        "add",
        "slurm",
        "--time",
        "5m",
        "--cores",
        "1",
        "--max",
        "1",
        "--idle-timeout",
        "5s",
        "--name",
        "cpu",
    ];
    // The job as the coordinator that died would have submitted it.
    let dry = c.mesh(0, &[&args[..], &["--dry-run"]].concat());
    dry.expect_code(0);
    let script = sb.write("orphan.sh", &dry.stdout);
    // Where its output goes, as a submission makes it.
    fs::create_dir_all(sb.path().join("n0/alloc/cpu")).expect("mkdir");
    let out = slurm
        .command("sbatch")
        .args(["--parsable", &script.to_string_lossy()])
        .current_dir(sb.path())
        .output()
        .expect("sbatch");
    assert!(out.status.success(), "{out:?}");
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(
        wait_until(Duration::from_secs(60), || c.status(0)["nodes"]
            .as_array()
            .is_some_and(|n| n.iter().any(|n| n["job"] == id.as_str()))),
        "the job's node joined: {}\n{}",
        c.status(0),
        slurm.queue()
    );

    c.mesh(0, &args).expect_code(0);
    let book = || c.mesh(0, &["alloc", "info", "cpu", "--json"]).json();
    assert!(
        wait_until(Duration::from_secs(30), || book()["jobs"]
            .as_array()
            .is_some_and(|j| j.iter().any(|j| j["job"]["id"] == id.as_str()))),
        "the job is in the book: {}",
        book()
    );
    let log = c.mesh(0, &["alloc", "log", "cpu"]).stdout;
    assert!(log.contains("adopted"), "{log}");
    // Idle, it is cancelled like any job of the queue, and none other was submitted.
    assert!(
        wait_until(Duration::from_secs(60), || slurm.queue().trim().is_empty()),
        "the adopted job was given back: {}\n{}",
        slurm.queue(),
        book()
    );
    let log = c.mesh(0, &["alloc", "log", "cpu"]).stdout;
    assert!(log.contains("cancelling: idle for"), "{log}");
    let b = book();
    assert_eq!(b["jobs"].as_array().map(Vec::len), Some(1), "{b}");
}

#[test]
fn a_dry_run_prints_the_job_script_without_a_node() {
    let sb = sandbox();
    let add = [
        "alloc",
        "add",
        "slurm",
        "--time",
        "1h",
        "--cores",
        "4",
        "--mem",
        "8G",
        "--dry-run",
    ];
    let r = sb.mesh(&add);
    r.expect_code(0);
    let state = sb.state().display().to_string();
    for want in [
        "#!/bin/bash\n# Printed without a running node: ADDR stands for",
        "#SBATCH --cpus-per-task=4",
        "#SBATCH --mem=8192M",
        "join ADDR ",
        &format!("--key {state}/mesh.key "),
        &format!("--state-dir {state}/alloc/nodes/"),
        // No mesh.key yet: the job's name has a placeholder too, said so.
        "#SBATCH --job-name=mesh-TAG-slurm",
        "# mesh-TAG stands for the mesh's tag",
    ] {
        assert!(r.stdout.contains(want), "no {want:?} in\n{}", r.stdout);
    }
    assert!(!sb.exists("state/alloc"), "a dry run changes nothing");
    // With the key, the job's name is the mesh's own.
    sb.mesh(&["init"]).expect_code(0);
    let r = sb.mesh(&add);
    r.expect_code(0);
    assert!(!r.stdout.contains("mesh-TAG"), "{}", r.stdout);
    assert!(
        r.stdout.contains("#SBATCH --job-name=mesh-"),
        "{}",
        r.stdout
    );
}

/// A queue with a deadline against a real SLURM: the jobs a simulation of
/// what is left says meet it, not those the backlog asks for. A loose
/// deadline the nodes there are meet submits nothing; a tight one makes
/// the queue submit more, and says when its --max cannot meet it.
#[test]
fn a_deadline_queue_submits_what_the_deadline_needs_on_a_real_slurm() {
    let sb = sandbox();
    let Some(slurm) = slurm(&sb) else { return };
    let env = vec![(
        "SLURM_CONF".to_string(),
        slurm.conf.to_string_lossy().into_owned(),
    )];
    let c = Cluster::start_with_env(&sb, &["cpu=1"], &["--state-dir", "n0"], env);
    // 120 tasks of 1 s: 2 minutes on the one core there is.
    sb.write("many.toml", &no_retries(slow_farm(120, "1")));
    let r = c.mesh(0, &["submit", "many.toml", "--out", "many-out"]);
    r.expect_code(0);
    let id = r.stdout.trim().to_string();
    let add = |name: &str, deadline: &str| {
        c.mesh(
            0,
            &[
                "alloc",
                "add",
                "slurm",
                "--time",
                "5m",
                "--cores",
                "1",
                "--max",
                "3",
                "--deadline",
                deadline,
                "--name",
                name,
            ],
        )
        .expect_code(0);
    };
    add("loose", "1h");
    add("tight", "70s");
    let info = |q: &str| c.mesh(0, &["alloc", "info", q, "--json"]).json();
    let planned = |q: &str| {
        let v = info(q);
        let extra = v["queue"]["plan"]["extra"].as_u64();
        (extra, v["jobs"].as_array().map_or(0, |j| j.len()))
    };
    // Once a task has run, each queue has its plan; the tight one submits.
    assert!(
        wait_until(Duration::from_secs(60), || planned("tight").1 >= 2),
        "the tight deadline submitted more than one job: {}\n{}",
        info("tight"),
        slurm.queue()
    );
    let (loose_extra, loose_jobs) = planned("loose");
    assert_eq!(loose_extra, Some(0), "{}", info("loose"));
    assert_eq!(
        loose_jobs,
        0,
        "a loose deadline submits none: {}",
        info("loose")
    );
    let said = c.mesh(0, &["alloc", "info", "tight"]).stdout;
    assert!(said.contains("deadline"), "{said}");
    assert!(said.contains("plan ("), "{said}");
    let log = c.mesh(0, &["alloc", "log", "tight"]).stdout;
    eprintln!("{log}");
    assert!(
        log.contains("cannot be met within --max 3") || log.contains("job(s) beyond the"),
        "{log}"
    );
    let log = c.mesh(0, &["alloc", "log", "loose"]).stdout;
    assert!(log.contains("0 job(s) beyond the 0"), "{log}");
    // Nothing left behind.
    c.mesh(0, &["cancel", &id]).expect_code(0);
    for q in ["loose", "tight"] {
        c.mesh(0, &["alloc", "remove", q]).expect_code(0);
    }
    assert!(
        wait_until(Duration::from_secs(30), || slurm.queue().trim().is_empty()),
        "{}",
        slurm.queue()
    );
}

/// snakemake#301 on a mesh: a workflow's jobs run in a few batch jobs that
/// `mesh alloc` submits and gives back, not a batch job each. Real
/// Snakemake (`MESH_TEST_SNAKEMAKE_PYTHON`, a Python with it and the
/// plugin, as `.ci/run` makes) on the one-node SLURM; the node the user
/// runs has one core and the jobs ask for two, so only the batch jobs'
/// nodes can run them.
#[test]
#[ignore = "needs MESH_TEST_SNAKEMAKE_PYTHON, a Python with snakemake and the plugin; .ci/run runs it"]
fn snakemake_jobs_run_in_a_few_batch_jobs_that_mesh_alloc_submits() {
    let Some(python) = std::env::var_os("MESH_TEST_SNAKEMAKE_PYTHON") else {
        eprintln!("SKIPPED: MESH_TEST_SNAKEMAKE_PYTHON names no Python with snakemake");
        return;
    };
    let sb = sandbox();
    let Some(slurm) = slurm(&sb) else { return };
    let env = vec![(
        "SLURM_CONF".to_string(),
        slurm.conf.to_string_lossy().into_owned(),
    )];
    let c = Cluster::start_with_env(&sb, &["cpu=1"], &["--state-dir", "n0"], env);
    c.mesh(
        0,
        &[
            "alloc",
            "add",
            "slurm",
            "--time",
            "5m",
            "--cores",
            "2",
            "--max",
            "2",
            "--idle-timeout",
            "10s",
            "--name",
            "smk",
        ],
    )
    .expect_code(0);
    let jobs = 20;
    let dir = sb.path().join("wf");
    fs::create_dir_all(&dir).unwrap();
    fs::write(
        dir.join("Snakefile"),
        format!(
            "rule all:\n    input: expand(\"t/{{i}}.txt\", i=range({jobs}))\n\n\
             rule work:\n    output: \"t/{{i}}.txt\"\n    threads: 2\n    \
             shell: \"sleep 0.5; echo {{wildcards.i}} job=$SLURM_JOB_ID > {{output}}\"\n"
        ),
    )
    .unwrap();
    let state = sb.path().join("n0").to_string_lossy().into_owned();
    let out = mesh_tests::snakemake(&python, &dir, env!("CARGO_BIN_EXE_mesh"))
        .args(["--executor", "mesh", "--jobs", "100"])
        .args(["--mesh-state-dir", &state, "--latency-wait", "5"])
        .env("SLURM_CONF", &slurm.conf)
        .output()
        .expect("run snakemake");
    assert!(
        out.status.success(),
        "snakemake: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        c.mesh(0, &["alloc", "log", "smk"]).stdout
    );
    // Every job ran, on a node a batch job started; in few batch jobs.
    let mut batch_jobs = std::collections::BTreeSet::new();
    for i in 0..jobs {
        let text = fs::read_to_string(dir.join(format!("t/{i}.txt"))).unwrap();
        let job = text.trim().strip_prefix(&format!("{i} job=")).unwrap_or("");
        assert!(!job.is_empty(), "job {i} ran outside a batch job: {text:?}");
        batch_jobs.insert(job.to_string());
    }
    eprintln!("{jobs} Snakemake jobs ran in the batch jobs {batch_jobs:?}");
    assert!(batch_jobs.len() <= 2, "{batch_jobs:?}");
    // Nothing left behind once the work is done.
    c.mesh(0, &["alloc", "remove", "smk"]).expect_code(0);
    assert!(
        wait_until(Duration::from_secs(30), || slurm.queue().trim().is_empty()),
        "{}",
        slurm.queue()
    );
}
