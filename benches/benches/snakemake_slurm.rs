//! Snakemake's jobs three ways, same run: `snakemake --cores 2`; one SLURM job per Snakemake job (`snakemake-executor-plugin-cluster-generic` with `sbatch`, on a one-node SLURM of Debian's slurm-wlm, 2 CPUs); and `snakemake --executor mesh` on one node of 2 slots, a task per job and in group jobs.
//!
//! `MESH_BENCH_PYTHON` is a Python with snakemake and the cluster-generic
//! plugin (snakemake-executor-plugin-mesh/tests/requirements.txt);
//! `MESH_BENCH_SMK_JOBS` (100) `touch {output}` jobs; `MESH_BENCH_SMK_GROUP`
//! (50) jobs per group job. Needs root (the SLURM daemons); says so and
//! stops where it cannot start them.
//!
//! `MESH_BENCH_PYTHON=/path/to/venv/bin/python cargo bench -p mesh-cli --bench snakemake_slurm`

use std::path::Path;
use std::process::Stdio;
use std::time::Instant;

use mesh_benches::{knob, report, save};
use mesh_tests::{NodeProc, Sandbox, Slurm};

fn main() {
    let mesh = env!("CARGO_BIN_EXE_mesh");
    let python = std::env::var("MESH_BENCH_PYTHON").unwrap_or_else(|_| "python3".into());
    let jobs = knob("MESH_BENCH_SMK_JOBS", 100);
    let group = knob("MESH_BENCH_SMK_GROUP", 50);
    let sb = Sandbox::new(mesh);
    let slurm = match Slurm::start(&sb.path().join("slurm")) {
        Ok(s) => s,
        Err(e) => {
            println!("skipped: {e}");
            return;
        }
    };
    let snakefile = format!(
        "rule all:\n    input: expand(\"t/{{i}}.txt\", i=range({jobs}))\n\n\
         rule touch:\n    output: \"t/{{i}}.txt\"\n    shell: \"touch {{output}}\"\n"
    );
    let run = |name: &str, args: &[&str], env: &[(&str, String)]| -> f64 {
        let dir = sb.path().join(name);
        std::fs::create_dir_all(&dir).expect("a workflow folder");
        std::fs::write(dir.join("Snakefile"), &snakefile).expect("the Snakefile");
        let mut c = mesh_tests::snakemake(python.as_ref(), &dir, mesh);
        c.args(args)
            .env("SLURM_CONF", &slurm.conf)
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (k, v) in env {
            c.env(k, v);
        }
        let t = Instant::now();
        let o = c.output().expect("run snakemake");
        let s = t.elapsed().as_secs_f64();
        assert!(
            o.status.success(),
            "snakemake {args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let made = std::fs::read_dir(dir.join("t")).map_or(0, |d| d.count()) as u64;
        assert_eq!(made, jobs, "snakemake {args:?} made {made} of {jobs}");
        println!("  {name}: {s:.1} s");
        s
    };
    println!("{jobs} `touch {{output}}` jobs, a machine of 2 cores:");
    let cores = run("cores", &["--cores", "2"], &[]);
    // cluster-generic writes a job script per job and sbatch runs it; with
    // no status command it waits for the script's own marker files.
    let sbatch = run(
        "slurm",
        &[
            "--executor",
            "cluster-generic",
            "--cluster-generic-submit-cmd",
            "sbatch --parsable --cpus-per-task=1 --output=/dev/null",
            "--jobs",
            "100",
            "--latency-wait",
            "1",
        ],
        &[],
    );
    let state = sb.path().join("node");
    sb.mesh(&["--state-dir", &state.to_string_lossy(), "init"])
        .expect_code(0);
    let node = NodeProc::start(
        Path::new(mesh),
        sb.path(),
        &state,
        &["node", "--resources", "cpu=2"],
    );
    // Its first address printed: it is up.
    node.address();
    let at = state.to_string_lossy().into_owned();
    let mesh_args = [
        "--executor",
        "mesh",
        "--jobs",
        "1000",
        "--mesh-state-dir",
        &at,
    ];
    let per_job = run("mesh", &mesh_args, &[]);
    let g = format!("g={group}");
    let groups = ["--groups", "touch=g", "--group-components", &g];
    let grouped = run("mesh-groups", &[&mesh_args[..], &groups].concat(), &[]);
    println!(
        "mesh, a task per job: {:.2} of --cores 2, {:.2} of a SLURM job per job; in group jobs of {group}: {:.2} and {:.2}",
        per_job / cores,
        per_job / sbatch,
        grouped / cores,
        grouped / sbatch
    );
    let results = vec![
        report("snakemake --cores 2", cores, "s", None),
        report(
            "snakemake, a SLURM job per job (cluster-generic, sbatch)",
            sbatch,
            "s",
            None,
        ),
        report(
            "snakemake --executor mesh, a task per job / a SLURM job per job",
            per_job / sbatch,
            "ratio",
            Some(("<=", 0.1, per_job / sbatch <= 0.1)),
        ),
        report(
            "snakemake --executor mesh, a task per job / --cores 2",
            per_job / cores,
            "ratio",
            Some(("<=", 1.5, per_job / cores <= 1.5)),
        ),
        report(
            &format!("snakemake --executor mesh, group jobs of {group} / --cores 2"),
            grouped / cores,
            "ratio",
            Some(("<=", 1.5, grouped / cores <= 1.5)),
        ),
    ];
    save("snakemake_slurm", &results);
}
