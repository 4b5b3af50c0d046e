//! The job scripts of allocation queues: the SLURM or PBS script that starts a mesh node with the job's resources and walltime, and the job names that tell this mesh's jobs from others.
//!
//! A node submits them (`batch.rs`); `mesh alloc add --dry-run` prints
//! them, with placeholders where no node runs.

use std::fmt::Write as _;
use std::path::Path;

use mesh_protocol::alloc::{BatchSystem, QueueDef};

/// Jobs at least this long get SLURM's SIGTERM a minute before their end.
const SIGNAL_FROM_S: u64 = 600;

/// Where the script's node joins, and how it runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Launch {
    /// The `mesh` binary, as an absolute path on the cluster's shared filesystem.
    pub mesh: String,
    /// Multiaddrs of nodes of the mesh to join, comma-separated.
    pub join: String,
    /// The mesh secret, readable from the compute nodes.
    pub key: String,
    /// A folder for each node's state; the job id and the node's rank are added.
    pub state_root: String,
    /// Where the batch system writes the job's output.
    pub log_dir: String,
    /// The mesh's part of every job's name (see [`job_name`]).
    pub tag: String,
}

impl Launch {
    /// A job of queue `queue` whose node joins `join`, for a mesh node
    /// with state folder `state`: each job's node keeps its state under
    /// `alloc/nodes/` there, and the batch system writes under
    /// `alloc/<queue>/`.
    pub fn new(
        mesh: String,
        join: String,
        key: String,
        state: &Path,
        queue: &str,
        tag: String,
    ) -> Launch {
        let alloc = state.join("alloc");
        Launch {
            mesh,
            join,
            key,
            state_root: alloc.join("nodes").display().to_string(),
            log_dir: alloc.join(queue).display().to_string(),
            tag,
        }
    }
}

/// What a script printed with no node running (`mesh alloc add
/// --dry-run`) has in place of the mesh's addresses, which only a
/// running node knows.
pub const NO_NODE_JOIN: &str = "ADDR";
/// What it has in place of the mesh's part of job names when the mesh
/// key cannot be read.
pub const NO_NODE_TAG: &str = "mesh-TAG";

/// [`script`] as printed with no node running: what only a node (or the
/// mesh key) knows is a placeholder, and a comment under the first line
/// says which and what to put there.
pub fn script_without_node(q: &QueueDef, l: &Launch) -> String {
    let s = script(q, l);
    let (first, rest) = s.split_once('\n').unwrap_or((&s, ""));
    let mut note = format!(
        "# Printed without a running node: {NO_NODE_JOIN} stands for the address of a node\n\
         # of the mesh (comma-separated, as `mesh node` prints it). With a node running\n\
         # (or with --mesh ADDR), `mesh alloc add --dry-run` prints it filled in.\n"
    );
    if l.tag == NO_NODE_TAG {
        let _ = writeln!(
            note,
            "# {NO_NODE_TAG} stands for the mesh's tag (from its key, {}: `mesh init` creates it).",
            l.key
        );
    }
    format!("{first}\n{note}{rest}")
}

/// A job's name: the mesh (`tag`, from its key) and the queue, so that a
/// coordinator elected after one that died finds the jobs it submitted in
/// `squeue`/`qstat`, whether or not they reached the book.
pub fn job_name(tag: &str, queue: &str) -> String {
    format!("{tag}-{queue}")
}

/// The queue a job's name says it belongs to, if it is this mesh's.
pub(super) fn queue_of<'a>(tag: &str, name: &'a str) -> Option<&'a str> {
    name.strip_prefix(tag)?.strip_prefix('-')
}

/// `H:MM:SS` for a number of seconds (both SLURM and PBS read it).
fn hms(s: u64) -> String {
    format!("{}:{:02}:{:02}", s / 3600, (s / 60) % 60, s % 60)
}

/// Megabytes, rounded up: both systems take memory in whole units.
fn mb(bytes: u64) -> u64 {
    bytes.div_ceil(1024 * 1024)
}

/// The job script for one job of `q`.
pub fn script(q: &QueueDef, l: &Launch) -> String {
    // A job starts wherever the batch system puts it: a path relative to
    // this node's folder would name nothing there.
    let l = &Launch {
        mesh: l.mesh.clone(),
        join: l.join.clone(),
        key: absolute(&l.key),
        state_root: absolute(&l.state_root),
        log_dir: absolute(&l.log_dir),
        tag: l.tag.clone(),
    };
    match q.system {
        BatchSystem::Slurm => slurm(q, l),
        BatchSystem::Pbs => pbs(q, l),
    }
}

/// `path` made absolute against this process's folder (no filesystem access).
fn absolute(path: &str) -> String {
    std::path::absolute(path).map_or_else(|_| path.to_owned(), |p| p.display().to_string())
}

fn header_common(out: &mut String, q: &QueueDef) {
    let _ = writeln!(out, "#!/bin/bash");
    let _ = writeln!(
        out,
        "# A mesh node for allocation queue `{}`, written by `mesh alloc`.",
        q.name
    );
}

/// What a batch system's script says in its own shell words: the command
/// that runs the node once per host (`srun ...`, or none), the node's
/// resources as granted, its rank among the job's hosts, the job's id,
/// and `alloc_job`, the shell expressions of the job's id as the batch
/// system lists it (an array element's own id), which the node gossips so
/// the coordinator knows which job it belongs to.
struct Words<'a> {
    run: &'a str,
    resources: &'a str,
    rank: &'a str,
    job: &'a str,
    alloc_job: &'a [&'a str],
}

/// The shell that follows the header: the prologue, then the node, which
/// drains before the walltime (`--walltime`) so that no task is killed by it.
fn body(out: &mut String, q: &QueueDef, l: &Launch, w: &Words) {
    let Words {
        run,
        resources,
        rank,
        job,
        alloc_job,
    } = *w;
    let _ = writeln!(out, "set -eu");
    for line in alloc_job {
        let _ = writeln!(out, "export MESH_ALLOC_JOB=\"{line}\"");
    }
    for line in &q.prologue {
        let _ = writeln!(out, "{line}");
    }
    let run = if run.is_empty() {
        String::new()
    } else {
        format!("{run} ")
    };
    // The node's command is run by a shell of its own on each node of the
    // job (its rank and job id are that shell's to expand), so it is
    // quoted twice: each path as a word of it, then the whole as a word
    // of the script's line. A path holding a space, a quote, a `$` or a
    // backtick stays that path.
    let inner = format!(
        "exec {mesh} --state-dir {root}/\"{job}-{rank}\" join {join} --key {key} --listen /ip4/0.0.0.0/tcp/0 --resources \"{resources}\" --walltime {time}s",
        mesh = quote(&l.mesh),
        root = quote(&l.state_root),
        join = quote(&l.join),
        key = quote(&l.key),
        time = q.time_limit_s,
    );
    let _ = writeln!(out, "{run}sh -c {}", quote(&inner));
}

/// `word` as one word of a POSIX shell line (shlex); a NUL, which no
/// path or address holds, is dropped.
fn quote(word: &str) -> String {
    shlex::try_quote(word).map_or_else(|_| quote(&word.replace('\0', "")), |q| q.into_owned())
}

fn slurm(q: &QueueDef, l: &Launch) -> String {
    let mut s = String::new();
    header_common(&mut s, q);
    let d = |s: &mut String, line: String| {
        let _ = writeln!(s, "#SBATCH {line}");
    };
    d(&mut s, format!("--job-name={}", job_name(&l.tag, &q.name)));
    d(&mut s, format!("--time={}", hms(q.time_limit_s)));
    d(&mut s, format!("--nodes={}", q.nodes_per_job.max(1)));
    d(&mut s, "--ntasks-per-node=1".into());
    d(&mut s, format!("--cpus-per-task={}", q.cores));
    if let Some(m) = q.mem_bytes {
        d(&mut s, format!("--mem={}M", mb(m)));
    }
    if q.gpus > 0 {
        d(&mut s, format!("--gres=gpu:{}", q.gpus));
    }
    if let Some(p) = &q.partition {
        d(&mut s, format!("--partition={p}"));
    }
    if let Some(a) = &q.account {
        d(&mut s, format!("--account={a}"));
    }
    d(&mut s, format!("--output={}/%x-%j.out", l.log_dir));
    // A backstop to the node's own drain before its walltime: SIGTERM to
    // the job's steps a minute before, and the node hands its tasks back
    // as on Ctrl-C. SLURM may send it up to a minute early, so a short
    // job relies on the drain alone.
    if q.time_limit_s >= SIGNAL_FROM_S {
        d(&mut s, "--signal=TERM@60".into());
    }
    for extra in &q.directives {
        let _ = writeln!(s, "{}", directive_line("#SBATCH", extra));
    }
    // The node's resources, as the batch system granted them.
    let mut res = "cpu=$SLURM_CPUS_PER_TASK".to_string();
    if q.mem_bytes.is_some() {
        res.push_str(",mem=${SLURM_MEM_PER_NODE}MiB");
    }
    if q.gpus > 0 {
        let _ = write!(res, ",gpu={}", q.gpus);
    }
    let words = Words {
        run: "srun --ntasks-per-node=1",
        resources: &res,
        rank: "$SLURM_PROCID",
        job: "$SLURM_JOB_ID",
        alloc_job: &[
            "${SLURM_ARRAY_JOB_ID:+${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}}",
            "${MESH_ALLOC_JOB:-$SLURM_JOB_ID}",
        ],
    };
    body(&mut s, q, l, &words);
    s
}

fn pbs(q: &QueueDef, l: &Launch) -> String {
    let mut s = String::new();
    header_common(&mut s, q);
    let d = |s: &mut String, line: String| {
        let _ = writeln!(s, "#PBS {line}");
    };
    d(&mut s, format!("-N {}", job_name(&l.tag, &q.name)));
    d(&mut s, format!("-l walltime={}", hms(q.time_limit_s)));
    let mut select = format!("select={}:ncpus={}", q.nodes_per_job.max(1), q.cores);
    if let Some(m) = q.mem_bytes {
        let _ = write!(select, ":mem={}mb", mb(m));
    }
    if q.gpus > 0 {
        let _ = write!(select, ":ngpus={}", q.gpus);
    }
    d(&mut s, format!("-l {select}"));
    if let Some(p) = &q.partition {
        d(&mut s, format!("-q {p}"));
    }
    if let Some(a) = &q.account {
        d(&mut s, format!("-A {a}"));
    }
    d(&mut s, "-j oe".into());
    d(&mut s, format!("-o {}", l.log_dir));
    for extra in &q.directives {
        let _ = writeln!(s, "{}", directive_line("#PBS", extra));
    }
    let mut res = "cpu=$NCPUS".to_string();
    if let Some(m) = q.mem_bytes {
        let _ = write!(res, ",mem={}MiB", mb(m));
    }
    if q.gpus > 0 {
        let _ = write!(res, ",gpu={}", q.gpus);
    }
    // One node per host of the job: pbsdsh runs the line once per host
    // (PBS_VNODENUM numbers them).
    let run = if q.nodes_per_job > 1 {
        "pbsdsh -u --"
    } else {
        ""
    };
    let rank = if q.nodes_per_job > 1 {
        "$PBS_VNODENUM"
    } else {
        "0"
    };
    let words = Words {
        run,
        resources: &res,
        rank,
        job: "$PBS_JOBID",
        alloc_job: &["$PBS_JOBID"],
    };
    body(&mut s, q, l, &words);
    s
}

/// A directive as the user gave it: with its prefix added when missing.
fn directive_line(prefix: &str, given: &str) -> String {
    let g = given.trim();
    if g.starts_with('#') {
        g.to_string()
    } else {
        format!("{prefix} {g}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn launch() -> Launch {
        Launch {
            mesh: "/home/ada/bin/mesh".into(),
            join: "/ip4/10.0.0.5/tcp/7070/p2p/12D3KooWExample".into(),
            key: "/home/ada/.local/share/mesh/mesh.key".into(),
            state_root: "/scratch/ada/mesh".into(),
            log_dir: "/home/ada/.local/share/mesh/alloc/gpu".into(),
            tag: "mesh-5f0c9a1e".into(),
        }
    }

    /// A state folder, key and binary whose paths hold a space, a quote, a
    /// `$` and a backtick: bash reads the script, and the node's command
    /// gets each path as it is, with its job's id and rank filled in.
    #[test]
    fn paths_with_quotes_dollars_and_spaces_stay_whole_in_a_job_script() {
        let dir = tempfile::tempdir().expect("temp dir");
        let odd = dir.path().join("it's a $HOME `x` dir");
        std::fs::create_dir_all(&odd).expect("odd dir");
        // Stands in for the mesh binary: says its arguments, a line each.
        let fake = odd.join("mesh");
        std::fs::write(
            &fake,
            "#!/bin/sh\nfor a in \"$@\"; do printf '%s\\n' \"$a\"; done\n",
        )
        .expect("fake");
        std::os::unix::fs::PermissionsExt::set_mode(
            &mut std::fs::metadata(&fake).unwrap().permissions(),
            0o755,
        );
        std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .expect("chmod");
        let l = Launch {
            mesh: fake.display().to_string(),
            join: "/ip4/10.0.0.5/tcp/7070".into(),
            key: odd.join("mesh.key").display().to_string(),
            state_root: odd.join("nodes").display().to_string(),
            log_dir: odd.join("logs").display().to_string(),
            tag: "mesh-5f0c9a1e".into(),
        };
        for system in [BatchSystem::Slurm, BatchSystem::Pbs] {
            let s = script(&bare(system), &l);
            let checked = std::process::Command::new("bash")
                .args(["-n", "-c", &s])
                .output()
                .expect("bash");
            assert!(
                checked.status.success(),
                "bash -n: {}\n{s}",
                String::from_utf8_lossy(&checked.stderr)
            );
        }
        // The node's line, run as srun would run it on rank 0 of job 7.
        let s = script(&bare(BatchSystem::Slurm), &l);
        let line = s
            .lines()
            .last()
            .unwrap()
            .trim_start_matches("srun --ntasks-per-node=1 ");
        let out = std::process::Command::new("bash")
            .args(["-c", line])
            .env("SLURM_JOB_ID", "7")
            .env("SLURM_PROCID", "0")
            .env("SLURM_CPUS_PER_TASK", "2")
            .output()
            .expect("run the line");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let args: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(String::from)
            .collect();
        let after = |flag: &str| {
            args.iter()
                .position(|a| a == flag)
                .map(|i| args[i + 1].clone())
        };
        assert_eq!(
            after("--state-dir"),
            Some(format!("{}/7-0", l.state_root)),
            "{args:?}"
        );
        assert_eq!(after("--key"), Some(l.key.clone()), "{args:?}");
        assert_eq!(after("--resources"), Some("cpu=2".into()), "{args:?}");
    }

    #[test]
    fn every_path_in_a_script_is_absolute_whatever_the_node_was_given() {
        let l = Launch {
            mesh: "/opt/mesh/bin/mesh".into(),
            join: "/ip4/10.0.0.5/tcp/7070".into(),
            key: "n1/mesh.key".into(),
            state_root: "n1/alloc/nodes".into(),
            log_dir: "n1/alloc/cpu".into(),
            tag: "mesh-5f0c9a1e".into(),
        };
        let here = std::env::current_dir().expect("a current folder");
        for system in [BatchSystem::Slurm, BatchSystem::Pbs] {
            let s = script(&bare(system), &l);
            for rel in ["n1/mesh.key", "n1/alloc/nodes", "n1/alloc/cpu"] {
                let abs = here.join(rel).display().to_string();
                assert!(s.contains(&abs), "{system:?}: no {abs} in\n{s}");
                assert!(
                    !s.contains(&format!(" {rel}")) && !s.contains(&format!("\"{rel}")),
                    "{system:?}: {rel} left relative in\n{s}"
                );
            }
        }
    }

    /// Every option set.
    fn full(system: BatchSystem) -> QueueDef {
        QueueDef {
            name: "gpu".into(),
            system,
            time_limit_s: 5400,
            cores: 16,
            mem_bytes: Some(64 << 30),
            gpus: 2,
            nodes_per_job: 2,
            partition: Some("gpu-long".into()),
            account: Some("proj42".into()),
            directives: vec![
                match system {
                    BatchSystem::Slurm => "--constraint=a100".into(),
                    BatchSystem::Pbs => "-l place=scatter".into(),
                },
                match system {
                    BatchSystem::Slurm => "#SBATCH --exclusive".into(),
                    BatchSystem::Pbs => "#PBS -m n".into(),
                },
            ],
            prologue: vec![
                "module load cuda/12".into(),
                "export OMP_NUM_THREADS=1".into(),
            ],
            min: 0,
            max: 10,
            idle_timeout_s: 300,
            deadline_ms: None,
        }
    }

    /// The fewest options.
    fn bare(system: BatchSystem) -> QueueDef {
        QueueDef {
            max: 4,
            ..QueueDef::new("cpu", system, 3600, 8)
        }
    }

    fn expect(name: &str, got: &str) {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("src/alloc/script_expected")
            .join(name);
        if std::env::var_os("MESH_BLESS").is_some() {
            std::fs::write(&path, got).expect("write expected");
        }
        let want = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e} (MESH_BLESS=1 writes it)", path.display()));
        assert_eq!(got, want, "{name} differs from the expected script");
    }

    #[test]
    fn scripts_match_the_expected_files_for_every_option() {
        expect(
            "slurm-full.sh",
            &script(&full(BatchSystem::Slurm), &launch()),
        );
        expect(
            "slurm-bare.sh",
            &script(&bare(BatchSystem::Slurm), &launch()),
        );
        expect("pbs-full.sh", &script(&full(BatchSystem::Pbs), &launch()));
        expect("pbs-bare.sh", &script(&bare(BatchSystem::Pbs), &launch()));
    }

    #[test]
    fn a_script_printed_without_a_node_says_what_stands_in_for_the_mesh() {
        let l = Launch::new(
            "/opt/mesh".into(),
            NO_NODE_JOIN.into(),
            "/home/ada/.local/share/mesh/mesh.key".into(),
            Path::new("/home/ada/.local/share/mesh"),
            "cpu",
            NO_NODE_TAG.into(),
        );
        for system in [BatchSystem::Slurm, BatchSystem::Pbs] {
            let s = script_without_node(&bare(system), &l);
            assert!(
                s.starts_with("#!/bin/bash\n# Printed without a running node: ADDR stands for"),
                "{s}"
            );
            assert!(s.contains("join ADDR "), "{s}");
            assert!(s.contains("# mesh-TAG stands for the mesh's tag"), "{s}");
            assert!(s.contains("mesh-TAG-cpu"), "the job's name: {s}");
            assert!(
                s.contains("/home/ada/.local/share/mesh/alloc/nodes/"),
                "{s}"
            );
            // The rest is the script a node would submit.
            let (_, note_and_rest) = s.split_once('\n').unwrap();
            assert!(note_and_rest.ends_with(&script(&bare(system), &l).split_once('\n').unwrap().1));
        }
        let tagged = Launch {
            tag: "mesh-5f0c9a1e".into(),
            ..l
        };
        let s = script_without_node(&bare(BatchSystem::Slurm), &tagged);
        assert!(!s.contains("mesh-TAG"), "{s}");
    }

    #[test]
    fn a_short_job_relies_on_its_own_drain_not_slurms_early_signal() {
        let mut q = bare(BatchSystem::Slurm);
        assert!(script(&q, &launch()).contains("--signal=TERM@60"));
        q.time_limit_s = 300;
        let s = script(&q, &launch());
        assert!(!s.contains("--signal"), "{s}");
        assert!(s.contains("--walltime 300s"), "{s}");
    }
}
