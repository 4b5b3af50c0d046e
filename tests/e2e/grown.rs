//! Run-time fan-out: a stage grown from the lines of a file each task of another stage writes (mag's bins), with `mesh run`, after a SIGKILL and resume, on a mesh whose nodes share no file system, and its mistakes said where they were written.

use std::path::Path;
use std::time::Duration;

use crate::sandbox;
use mesh_tests::{apart_possible, wait_until, Cluster};
use nix::sys::signal::Signal;

/// Bins found per sample: `b` finds none.
const BINS: [(&str, u32); 4] = [("a", 3), ("b", 0), ("c", 2), ("d", 4)];

/// `assemble` writes a bin per line of bins.txt per sample, `annotate`
/// grows a task per bin (sleeping `secs`), `report` gathers them all.
fn mag(secs: &str) -> String {
    let samples: Vec<String> = BINS.iter().map(|(s, _)| format!("\"{s}\"")).collect();
    let counts: Vec<String> = BINS.iter().map(|(s, n)| format!("{s}) n={n};;")).collect();
    format!(
        r#"
[farm]
name = "mag"

[defaults]
workdir = "runs/{{stage}}/{{index}}"

[[stage]]
name = "assemble"
sweep.sample = {{ list = [{samples}] }}
shell = "case {{sample}} in {counts} esac; i=1; while [ $i -le $n ]; do echo bin.{{sample}}.$i; i=$((i+1)); done > bins.txt"
outputs = ["bins.txt"]

[[stage]]
name = "annotate"
sweep.bin = {{ lines = "bins.txt", from = "assemble", max = 8 }}
shell = "sleep {secs}; echo {{sample}} {{bin}} > ann.txt"
outputs = ["ann.txt"]

[[stage]]
name = "report"
after = ["annotate"]
shell = "cat {{out}}/annotate/*/ann.txt | sort > all.txt"
outputs = ["all.txt"]
"#,
        samples = samples.join(", "),
        counts = counts.join(" "),
    )
}

/// What `report` must gather: a line per bin found, sorted.
fn want() -> Vec<String> {
    let mut lines: Vec<String> = BINS
        .iter()
        .flat_map(|(s, n)| (1..=*n).map(move |i| format!("{s} bin.{s}.{i}")))
        .collect();
    lines.sort();
    lines
}

fn tasks_made() -> u64 {
    BINS.iter().map(|(_, n)| u64::from(*n)).sum::<u64>() + BINS.len() as u64 + 1
}

#[test]
fn mesh_run_grows_a_task_per_line_and_the_gather_reads_each_once() {
    let s = sandbox();
    s.write("farm.toml", &mag("0"));
    let check = s.mesh(&["check", "farm.toml"]);
    check.expect_code(0);
    assert!(
        check.stdout.contains("stage annotate: up to 32 tasks")
            && check.stdout.contains(
                "grown from each assemble task: a task per line of its bins.txt (at most 8)"
            ),
        "{}",
        check.stdout
    );
    let r = s.mesh(&["run", "farm.toml", "--resources", "cpu=4", "--json"]);
    r.expect_code(0);
    assert_eq!(s.lines("mesh-out/mag/report/0/all.txt"), want());
    let counts = &r.json()["counts"];
    assert_eq!(counts["done"], tasks_made(), "{counts}");
    assert_eq!(
        counts["total"],
        tasks_made(),
        "only the bins found are tasks: {counts}"
    );
    // Task `i` of `annotate` is line `i % 8` of `assemble/(i / 8)`'s file.
    assert_eq!(s.read("mesh-out/mag/annotate/25/ann.txt"), "d bin.d.2\n");
    assert!(!Path::new(&s.path().join("mesh-out/mag/annotate/3")).exists());
    // Exported, it has the tasks that were made, the gather's parents those.
    let id = r.json()["id"].as_str().expect("an id").to_string();
    let trace = s.mesh(&["export", &id]);
    trace.expect_code(0);
    let tasks = trace.json()["workflow"]["specification"]["tasks"].clone();
    let tasks = tasks.as_array().expect("tasks");
    assert_eq!(tasks.len() as u64, tasks_made());
    let report = tasks
        .iter()
        .find(|t| t["id"] == "report.0")
        .expect("report");
    assert_eq!(
        report["parents"].as_array().map(Vec::len),
        Some(want().len())
    );
}

#[test]
fn a_grown_stage_resumes_after_a_sigkill_with_the_tasks_it_had_grown() {
    let s = sandbox();
    s.write("farm.toml", &mag("0.5"));
    let bg = s.spawn(&["run", "farm.toml", "--resources", "cpu=2"]);
    let started = || {
        std::fs::read_dir(s.path().join("mesh-out/mag/annotate"))
            .map(|d| d.count())
            .unwrap_or(0)
    };
    assert!(
        wait_until(Duration::from_secs(60), || started() >= 3),
        "annotate did not start"
    );
    bg.signal(Signal::SIGKILL);
    bg.wait();
    assert!(
        s.read_opt("mesh-out/mag/report/0/all.txt").is_none(),
        "the kill came too late to test anything"
    );
    std::thread::sleep(Duration::from_millis(600));
    let r = s.mesh(&["resume", "--resources", "cpu=2", "--json"]);
    r.expect_code(0);
    assert_eq!(r.json()["counts"]["done"], tasks_made());
    assert_eq!(s.lines("mesh-out/mag/report/0/all.txt"), want());
}

#[test]
fn a_file_with_more_lines_than_max_fails_its_task_saying_so() {
    let s = sandbox();
    s.write("farm.toml", &mag("0").replace("max = 8", "max = 3"));
    let r = s.mesh(&["run", "farm.toml", "--resources", "cpu=2"]);
    assert_ne!(r.code, Some(0));
    let all = format!("{}{}", r.stdout, r.stderr);
    assert!(
        all.contains("assemble/3")
            && all.contains(
                "its `bins.txt` has 4 lines, more than the 3 a stage grown from it takes"
            ),
        "{all}"
    );
}

#[test]
fn mistakes_in_a_grown_variable_are_errors_at_their_line() {
    let s = sandbox();
    let farm = mag("0");
    for (from, to, want) in [
        (
            "from = \"assemble\"",
            "from = \"assmble\"",
            "field `sweep.bin.from`: unknown stage `assmble`",
        ),
        (
            "max = 8",
            "max = 0",
            "field `sweep.bin.max`: 0 is out of range",
        ),
        (
            "sweep.bin = {",
            "sweep.x = { list = [1] }\nsweep.bin = {",
            "a grown variable is its stage's only one",
        ),
        (
            "outputs = [\"bins.txt\"]",
            "",
            "stage `assemble` keeps no outputs, so none of its files reach the tasks grown from it",
        ),
        (
            "lines = \"bins.txt\", from",
            "list = [1], from",
            "takes its values from `lines = \"file\"`",
        ),
    ] {
        assert!(farm.contains(from), "{from}");
        s.write("farm.toml", &farm.replacen(from, to, 1));
        let r = s.mesh(&["check", "farm.toml"]);
        r.expect_code(2);
        assert!(
            r.stderr.contains("farm.toml:") && r.stderr.contains(want),
            "{to}: {}",
            r.stderr
        );
    }
}

#[test]
fn a_stage_grows_on_nodes_that_share_no_file_system() {
    let s = sandbox();
    let apart = apart_possible();
    let c = if apart {
        let (farm, out) = (s.path().join("farm"), s.path().join("out"));
        let hidden: [&Path; 2] = [&farm, &out];
        Cluster::start_apart(&s, &["cpu=2"; 3], &[], &hidden)
    } else {
        eprintln!("nodes share this machine's file system: needs root and `unshare -m` to hide it");
        Cluster::start(&s, &["cpu=2"; 3], &[])
    };
    s.write("farm/farm.toml", &mag("0.3"));
    let out = s.path().join("out").to_string_lossy().to_string();
    let r = c.mesh(0, &["submit", "farm/farm.toml", "--out", &out, "--wait"]);
    r.expect_code(0);
    assert_eq!(s.lines("out/report/0/all.txt"), want(), "{}", r.stderr);
    for (i, (sample, n)) in BINS.iter().enumerate() {
        for line in 0..8u32 {
            let t = i as u32 * 8 + line;
            let got = s.read_opt(&format!("out/annotate/{t}/ann.txt"));
            if line < *n {
                assert_eq!(got, Some(format!("{sample} bin.{sample}.{}\n", line + 1)));
            } else {
                assert_eq!(got, None, "annotate/{t} is no task");
            }
        }
    }
}

#[test]
fn the_submitter_killed_mid_growth_and_the_farm_resumed_on_another_node_grows_the_same_tasks() {
    let s = sandbox();
    let apart = apart_possible();
    let (farm, out) = (s.path().join("farm"), s.path().join("out"));
    let hidden: [&Path; 2] = [&farm, &out];
    let mut c = if apart {
        Cluster::start_apart(&s, &["cpu=2"; 3], &[], &hidden)
    } else {
        eprintln!("nodes share this machine's file system: needs root and `unshare -m` to hide it");
        Cluster::start(&s, &["cpu=2"; 3], &[])
    };
    s.write("farm/farm.toml", &mag("1"));
    let out = out.to_string_lossy().to_string();
    let r = c.mesh(0, &["submit", "farm/farm.toml", "--out", &out]);
    r.expect_code(0);
    let id = r.stdout.trim().to_string();
    // Killed once every sample's bins are known and some were annotated.
    let going = wait_until(Duration::from_secs(60), || {
        c.mesh(0, &["status", &id, "--json"]).json()["counts"]["done"]
            .as_u64()
            .unwrap_or(0)
            >= BINS.len() as u64 + 2
    });
    assert!(going, "the farm did not get going");
    c.kill(0);
    let resumed = s.path().join("resumed").to_string_lossy().to_string();
    c.mesh(1, &["resume", &id, "--out", &resumed])
        .expect_code(0);
    let w = c.mesh(1, &["wait", &id, "--json"]);
    w.expect_code(0);
    assert_eq!(w.json()["counts"]["done"], tasks_made(), "{}", w.stdout);
    assert_eq!(s.lines("resumed/report/0/all.txt"), want(), "{}", w.stderr);
}

#[test]
fn the_grown_example_checks_a_prime_per_line_found() {
    let s = sandbox();
    let example = include_str!("../../examples/grown/farm.toml");
    s.write("farm.toml", example);
    let check = s.mesh(&["check", "farm.toml"]);
    check.expect_code(0);
    assert!(
        check.stdout.contains("farm grown: up to 131 tasks")
            && check.stdout.contains("<line 1 of found.txt> (block 0)"),
        "{}",
        check.stdout
    );
    s.mesh(&["run", "farm.toml", "--resources", "cpu=2"])
        .expect_code(0);
    let primes: Vec<u64> = (2..125u64)
        .filter(|n| (2..*n).take_while(|d| d * d <= *n).all(|d| n % d != 0))
        .collect();
    let want: Vec<String> = primes
        .iter()
        .map(|p| format!("{p} (block {}) squared is {}", p / 25, p * p))
        .collect();
    assert_eq!(s.lines("mesh-out/grown/summary/0/primes.txt"), want);
}
