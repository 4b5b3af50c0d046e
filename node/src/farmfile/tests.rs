//! Loading whole farm files: the reference example, defaults, dependencies, warnings, the bad-farm corpus and every example.

use super::*;
use mesh_protocol::farm::{Command, Sweep, TaskRef};

fn opts(out: &str) -> LoadOptions {
    LoadOptions::to(Some(PathBuf::from(out)))
}

/// Writes `files` into a fresh folder and loads `farm.toml` from it.
fn load_in(farm: &str, files: &[(&str, &str)]) -> (tempfile::TempDir, Result<FarmDef>) {
    let dir = tempfile::tempdir().expect("temp dir");
    for (name, text) in files {
        let path = dir.path().join(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).expect("mkdir");
        }
        std::fs::write(path, text).expect("write");
    }
    let path = dir.path().join("farm.toml");
    std::fs::write(&path, farm).expect("write farm");
    let result = load(&path, &opts("/tmp/mesh-test-out"));
    (dir, result)
}

fn good(farm: &str, files: &[(&str, &str)]) -> (tempfile::TempDir, FarmDef) {
    let (dir, result) = load_in(farm, files);
    match result {
        Ok(def) => (dir, def),
        Err(e) => panic!("farm should load, got: {e}"),
    }
}

fn bad(farm: &str, files: &[(&str, &str)]) -> FarmFileError {
    match load_in(farm, files).1 {
        Ok(_) => panic!("farm should not load"),
        Err(e) => e,
    }
}

fn warnings(farm: &str) -> Vec<FarmWarning> {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("farm.toml");
    std::fs::write(&path, farm).expect("write farm");
    match load_with_warnings(&path, &opts("/tmp/mesh-test-out")) {
        Ok((_, w)) => w,
        Err(e) => panic!("farm should load, got: {e}"),
    }
}

/// The warnings of `farm.toml` in a folder that also holds `files`
/// (names ending in `.sh` are made executable).
fn warnings_in(farm: &str, files: &[(&str, &str)]) -> Vec<FarmWarning> {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("temp dir");
    for (name, text) in files {
        let path = dir.path().join(name);
        std::fs::write(&path, text).expect("write");
        if name.ends_with(".sh") {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        }
    }
    let path = dir.path().join("farm.toml");
    std::fs::write(&path, farm).expect("write farm");
    match load_with_warnings(&path, &opts("/tmp/mesh-test-out")) {
        Ok((_, w)) => w,
        Err(e) => panic!("farm should load, got: {e}"),
    }
}

#[test]
fn a_program_that_is_not_on_path_is_warned_of_with_the_fix() {
    const SCRIPT: (&str, &str) = ("wrapper.sh", "#!/bin/sh\n");
    let farm = |command: &str, rest: &str| {
        format!(
            "[farm]\nname = \"f\"\n[[stage]]\nname = \"solve\"\ncommand = {command}\nsweep.i = {{ range = \"1..20\" }}\n{rest}"
        )
    };
    // The issue's farm: the script is in the farm's folder, without `./`.
    let w = warnings_in(&farm(r#"["wrapper.sh", "{i}"]"#, ""), &[SCRIPT]);
    assert_eq!(w.len(), 1, "{w:?}");
    assert_eq!((w[0].line, w[0].field.as_str()), (5, "stage.command"));
    assert_eq!(
        w[0].message,
        "stage `solve` runs `wrapper.sh`, which is not on PATH: the one in the farm's folder is run as `./wrapper.sh`"
    );
    // Tasks in folders of their own reach it only as an input.
    let w = warnings_in(
        &farm(r#"["wrapper.sh"]"#, "workdir = \"runs/{index}\"\n"),
        &[SCRIPT],
    );
    assert!(
        w[0].message
            .contains("list it in `inputs` and write `./wrapper.sh`"),
        "{w:?}"
    );
    // Nowhere at all.
    let w = warnings_in(&farm(r#"["no-such-program-here"]"#, ""), &[]);
    assert!(
        w[0].message
            .ends_with("which is not on PATH, so its tasks will not start"),
        "{w:?}"
    );
    // A relative path that is not where the tasks run, or not executable.
    let w = warnings_in(&farm(r#"["./solver"]"#, ""), &[]);
    assert!(
        w[0].message
            .contains("neither in the folder its tasks run in nor one of their inputs"),
        "{w:?}"
    );
    let w = warnings_in(&farm(r#"["./run.py"]"#, ""), &[("run.py", "print(1)\n")]);
    assert!(
        w[0].message.contains("`./run.py`, which is not executable"),
        "{w:?}"
    );
    // From [defaults], the line and field are there.
    let w = warnings_in(
        "[defaults]\ncommand = [\"wrapper.sh\"]\n[[stage]]\nname = \"solve\"\n",
        &[SCRIPT],
    );
    assert_eq!(
        (w[0].line, w[0].field.as_str()),
        (2, "defaults.command"),
        "{w:?}"
    );
}

#[test]
fn programs_tasks_can_start_are_not_warned_of() {
    const SCRIPT: (&str, &str) = ("wrapper.sh", "#!/bin/sh\n");
    for stage in [
        // On PATH, and in the farm's folder with `./`.
        "command = [\"true\"]",
        "command = [\"./wrapper.sh\"]",
        // Staged as an input into each task's folder.
        "command = [\"./wrapper.sh\", \"{i}\"]\nworkdir = \"runs/{index}\"\ninputs = [\"wrapper.sh\"]",
        // What a shell line runs, a program named by a placeholder, a
        // PATH of the stage's own, and a program an earlier stage may make.
        "shell = \"wrapper.sh {i}\"",
        "command = [\"{i}\"]",
        "command = [\"wrapper.sh\"]\nenv = { PATH = \"/opt/tools/bin\" }",
        "command = [\"./made-by-build\"]\nafter = [\"build\"]",
        "command = [\"./made-by-build\"]\nworkdir = \"runs/{index}\"",
    ] {
        let farm = format!(
            "[[stage]]\nname = \"build\"\nshell = \"true\"\n[[stage]]\nname = \"solve\"\nsweep.i = {{ range = \"1..3\" }}\n{stage}\n"
        );
        let w = warnings_in(&farm, &[SCRIPT]);
        assert!(w.is_empty(), "{stage}: {w:?}");
    }
}

#[test]
fn outputs_from_a_folder_tasks_share_are_warned_of() {
    // The new user's farm: 30 tasks writing o.txt where they all run.
    let w = warnings(
        "[farm]\nname = \"f\"\n[[stage]]\nname = \"s\"\nshell = \"echo {i} > o.txt\"\nsweep.i = { range = \"1..30\" }\noutputs = [\"o.txt\"]\n",
    );
    assert_eq!(w.len(), 1, "{w:?}");
    assert_eq!((w[0].line, w[0].field.as_str()), (7, "stage.outputs"));
    assert!(w[0].message.contains("30 tasks"), "{}", w[0]);
    assert!(
        w[0].message.contains("{index}"),
        "says how to fix it: {}",
        w[0]
    );
    assert!(w[0].to_string().contains("farm.toml:7: stage.outputs: "));
    // A workdir shared by every task is no better.
    let w = warnings(
        "[farm]\nname = \"f\"\n[defaults]\noutputs = [\"o.txt\"]\n[[stage]]\nname = \"s\"\nshell = \"true\"\nsweep.i = { list = [1, 2] }\nworkdir = \"runs/{stage}\"\n",
    );
    assert_eq!(w.len(), 1, "{w:?}");
    assert_eq!((w[0].line, w[0].field.as_str()), (4, "defaults.outputs"));
}

#[test]
fn outputs_from_a_folder_of_their_own_are_fine() {
    for workdir in ["runs/{index}", "runs/{i}"] {
        let w = warnings(&format!(
            "[farm]\nname = \"f\"\n[[stage]]\nname = \"s\"\nshell = \"true\"\nsweep.i = {{ list = [1, 2] }}\nworkdir = \"{workdir}\"\noutputs = [\"o.txt\"]\n"
        ));
        assert!(w.is_empty(), "{workdir}: {w:?}");
    }
    // One task alone, or no outputs, races with nothing.
    let w = warnings(
        "[farm]\nname = \"f\"\n[[stage]]\nname = \"a\"\nshell = \"true\"\noutputs = [\"o.txt\"]\n[[stage]]\nname = \"b\"\nshell = \"true\"\nsweep.i = { list = [1, 2] }\n",
    );
    assert!(w.is_empty(), "{w:?}");
}

#[test]
fn stages_sharing_a_folder_warn_only_when_they_can_overlap() {
    let farm = |after: &str| {
        format!(
            "[farm]\nname = \"f\"\n[[stage]]\nname = \"a\"\nshell = \"true\"\noutputs = [\"o.txt\"]\n[[stage]]\nname = \"b\"\nshell = \"true\"\n{after}outputs = [\"p.txt\"]\n"
        )
    };
    let w = warnings(&farm(""));
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(w[0].message.contains("stages `a` and `b`"), "{}", w[0]);
    assert!(warnings(&farm("after = [\"a\"]\n")).is_empty());
}

fn values(def: &FarmDef, stage: u32) -> Vec<Vec<String>> {
    let s = &def.stages[stage as usize];
    (0..s.len()).map(|i| s.sweep.binding(i)).collect()
}

const BRIEF_EXAMPLE: &str = r#"
[farm]
name = "sweep"

[defaults]
resources = { cpu = 1, mem = "512MiB" }
retries = 1
timeout = "10m"

[[stage]]
name = "solve"
command = ["./wrapper.sh", "solver", "{x}", "{seed}"]
sweep.x = { lines = "params.txt" }
sweep.seed = { range = "1..3" }
sweep_mode = "product"
workdir = "runs/{stage}/{index}"
inputs = ["case/model.edp", "wrapper.sh"]
outputs = ["result.dat", "logs/*.log"]
env = { OMP_NUM_THREADS = "1" }
resources = { cpu = 1, gpu = 0.5, token = 1 }
success_codes = [0]

[[stage]]
name = "report"
after = ["solve"]
shell = "cat {out}/solve/*/result.dat > summary.txt"
outputs = ["summary.txt"]
"#;

#[test]
fn the_reference_example_expands_to_the_right_tasks() {
    let (dir, def) = good(
        BRIEF_EXAMPLE,
        &[
            ("params.txt", "alpha\n\nbeta\n  gamma  \n"),
            ("wrapper.sh", "#!/bin/sh\n"),
            ("case/model.edp", "model\n"),
        ],
    );
    assert_eq!(def.name, "sweep");
    assert_eq!(def.out, "/tmp/mesh-test-out");
    let root = dir.path().canonicalize().expect("canonical");
    assert_eq!(def.root, root.to_str().expect("utf8"));
    assert_eq!(def.stages.len(), 2);
    assert_eq!(def.stages[0].len(), 9, "3 lines x 3 seeds");
    assert_eq!(def.task_count(), 10);

    // Product order: the first variable varies slowest.
    let task = def.expand(TaskRef::new(0, 4));
    assert_eq!(
        task.command,
        Command::Argv(vec![
            "./wrapper.sh".into(),
            "solver".into(),
            "beta".into(),
            "2".into()
        ])
    );
    assert_eq!(task.workdir.as_deref(), Some("runs/solve/4"));
    assert_eq!(task.inputs, ["case/model.edp", "wrapper.sh"]);
    assert_eq!(task.outputs, ["result.dat", "logs/*.log"]);
    assert_eq!(task.env, [("OMP_NUM_THREADS".to_string(), "1".to_string())]);
    assert_eq!(def.task_name(TaskRef::new(0, 8)), "solve/8");
    assert_eq!(def.expand(TaskRef::new(0, 8)).command, {
        Command::Argv(vec![
            "./wrapper.sh".into(),
            "solver".into(),
            "gamma".into(),
            "3".into(),
        ])
    });

    let solve = &def.stages[0];
    // Resources merge per key: mem from [defaults], the rest from the stage.
    assert_eq!(
        solve.resources.to_string(),
        "cpu=1,gpu=0.5,mem=512MiB,token=1"
    );
    assert_eq!(solve.retries, 1);
    assert_eq!(solve.timeout_ms, Some(600_000));
    assert_eq!(solve.success_codes, [0]);

    let report = &def.stages[1];
    assert_eq!(report.after, [0]);
    assert!(report.after_each.is_empty());
    assert_eq!(report.len(), 1);
    assert_eq!(
        def.expand(TaskRef::new(1, 0)).command,
        Command::Shell("cat /tmp/mesh-test-out/solve/*/result.dat > summary.txt".into())
    );
    // [defaults] apply to every stage.
    assert_eq!(report.resources.to_string(), "cpu=1,mem=512MiB");
    assert_eq!(report.retries, 1);
}

#[test]
fn defaults_merge_and_every_task_takes_a_core_unless_it_says_otherwise() {
    let (_dir, def) = good(
        r#"
[defaults]
resources = { mem = "1GiB", token = 1 }
env = { A = "from-defaults", B = 2 }
retries = 3
workdir = "runs/{stage}/{index}"
expected = "10m"

[[stage]]
name = "plain"
command = ["true"]

[[stage]]
name = "no-core"
command = ["true"]
resources = { cpu = 0, token = 0 }
env = { A = "own" }
retries = 0
timeout = 90
expected = 30
"#,
        &[],
    );
    let plain = &def.stages[0];
    assert_eq!(plain.resources.to_string(), "cpu=1,mem=1GiB,token=1");
    assert_eq!(plain.retries, 3);
    assert_eq!(plain.timeout_ms, None);
    assert_eq!(plain.expected_ms, Some(600_000));
    let task = def.expand(TaskRef::new(0, 0));
    assert_eq!(task.workdir.as_deref(), Some("runs/plain/0"));
    assert_eq!(
        task.env,
        [
            ("A".into(), "from-defaults".into()),
            ("B".into(), "2".into())
        ]
    );

    let own = &def.stages[1];
    assert_eq!(
        own.resources.to_string(),
        "mem=1GiB",
        "cpu = 0 and token = 0 ask for nothing"
    );
    assert_eq!(own.retries, 0);
    assert_eq!(own.timeout_ms, Some(90_000));
    assert_eq!(own.expected_ms, Some(30_000));
    let task = def.expand(TaskRef::new(1, 0));
    assert_eq!(
        task.env,
        [("B".into(), "2".into()), ("A".into(), "own".into())]
    );
    assert_eq!(task.workdir.as_deref(), Some("runs/no-core/0"));
}

#[test]
fn max_fails_comes_from_the_stage_then_defaults_then_five() {
    let farm = |defaults: &str| {
        format!(
            "{defaults}[[stage]]\nname = \"own\"\ncommand = [\"true\"]\nmax_fails = 0\n\n[[stage]]\nname = \"plain\"\ncommand = [\"true\"]\n"
        )
    };
    let (_dir, def) = good(&farm(""), &[]);
    assert_eq!((def.stages[0].max_fails, def.stages[1].max_fails), (0, 5));
    let (_dir, def) = good(&farm("[defaults]\nmax_fails = 20\n"), &[]);
    assert_eq!((def.stages[0].max_fails, def.stages[1].max_fails), (0, 20));
}

#[test]
fn a_bad_max_fails_is_located() {
    for (value, want) in [
        ("-1", "-1 is out of range"),
        ("\"five\"", "invalid type: string \"five\""),
        ("2.5", "invalid type"),
    ] {
        let err = bad(
            &format!("[defaults]\nretries = 1\nmax_fails = {value}\n[[stage]]\nname = \"s\"\ncommand = [\"true\"]\n"),
            &[],
        );
        assert_eq!(err.line(), Some(3), "{err}");
        assert_eq!(err.field(), Some("defaults.max_fails"), "{err}");
        let msg = err.to_string();
        assert!(msg.contains(":3:13: "), "{msg}");
        assert!(msg.contains(want), "{value}: {msg}");
        assert!(
            msg.contains("a number of failed attempts (0 turns stopping off)"),
            "{msg}"
        );
    }
}

#[test]
fn dependencies_resolve_to_stage_positions() {
    let (_dir, def) = good(
        r#"
[[stage]]
name = "report"
command = ["true"]
after = "analyze"

[[stage]]
name = "simulate"
command = ["echo", "{x}"]
sweep.x = { range = "1..4" }

[[stage]]
name = "analyze"
shell = "cat {out}/simulate/{index}/sim.dat"
sweep.i = { range = "0..3" }
after_each = ["simulate"]
after = ["simulate", "simulate"]
"#,
        &[],
    );
    assert_eq!(
        def.stages[0].after,
        [2],
        "a stage may wait for one defined later"
    );
    assert_eq!(def.stages[2].after_each, [1]);
    assert_eq!(def.stages[2].after, [1], "repeated names count once");
    assert_eq!(
        def.expand(TaskRef::new(2, 3)).command,
        Command::Shell("cat /tmp/mesh-test-out/simulate/3/sim.dat".into())
    );
}

#[test]
fn zip_pairs_values_and_lists_take_any_scalar() {
    let (_dir, def) = good(
        r#"
[[stage]]
name = "z"
command = ["echo", "{a}", "{b}"]
sweep.a = { list = [1, "two", 2.5, true, 0.10, -3] }
sweep.b = { range = "10..15" }
sweep_mode = "zip"
"#,
        &[],
    );
    assert_eq!(def.stages[0].len(), 6);
    assert_eq!(
        values(&def, 0),
        [
            ["1", "10"],
            ["two", "11"],
            ["2.5", "12"],
            ["true", "13"],
            ["0.10", "14"],
            ["-3", "15"]
        ]
    );
}

#[test]
fn names_and_output_folder_have_defaults() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("my-farm.toml");
    let text = "[[stage]]\nname = \"s\"\ncommand = [\"true\"]\n";
    let def = load_str(&path, text, &LoadOptions::default()).expect("loads");
    assert_eq!(def.name, "my-farm");
    let cwd = std::env::current_dir().expect("cwd");
    assert_eq!(
        PathBuf::from(&def.out),
        cwd.join("mesh-out").join("my-farm")
    );
    let def = load_str(&path, text, &opts("./results")).expect("loads");
    assert_eq!(PathBuf::from(&def.out), cwd.join("results"));
    assert_eq!(def.stages[0].sweep, Sweep::single());
    assert_eq!(def.stages[0].success_codes, [0]);
}

#[test]
fn a_file_name_that_is_no_farm_name_asks_for_one() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("my farm.toml");
    let text = "[[stage]]\nname = \"s\"\ncommand = [\"true\"]\n";
    let err = load_str(&path, text, &LoadOptions::default()).expect_err("bad stem");
    assert_eq!(err.field(), Some("farm.name"));
    assert_eq!(err.line(), Some(1));
    assert!(
        err.to_string().contains("set one with `[farm] name"),
        "{err}"
    );
}

#[test]
fn errors_read_file_line_context_field_and_expectation() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("sweep.toml");
    let text = "[[stage]]\nname = \"solve\"\ncommand = [\"true\"]\nretries = \"x\"\n";
    let err = load_str(&path, text, &LoadOptions::default()).expect_err("bad retries");
    assert_eq!(
        err.to_string(),
        format!(
            "{}:4:11: stage `solve`, field `retries`: invalid type: string \"x\", expected a non-negative integer",
            path.display()
        )
    );
    assert_eq!(err.line(), Some(4));
    assert_eq!(err.column(), Some(11));
    assert_eq!(err.field(), Some("stage.retries"));
}

#[test]
fn sweep_values_used_in_paths_are_checked_only_where_used() {
    // A value with `..` is fine as an argument ...
    good(
        r#"
[[stage]]
name = "s"
command = ["echo", "{x}"]
sweep.x = { list = ["../up", "/abs"] }
workdir = "runs/{index}"
"#,
        &[],
    );
    // ... but not in an output path.
    let err = bad(
        r#"
[[stage]]
name = "s"
command = ["echo", "{x}"]
sweep.x = { lines = "p.txt" }
outputs = ["out-{x}.dat"]
"#,
        &[("p.txt", "ok\n/etc/shadow\n")],
    );
    assert_eq!(err.field(), Some("stage.outputs"));
    assert!(err.to_string().contains("value `/etc/shadow`"), "{err}");
    // Dynamic inputs are checked when staged, not at load time.
    good(
        r#"
[[stage]]
name = "s"
command = ["true"]
sweep.case = { list = ["a", "b"] }
inputs = ["cases/{case}.dat"]
"#,
        &[],
    );
}

#[test]
fn a_cycle_is_named_in_order() {
    let err = bad(
        r#"
[[stage]]
name = "a"
command = ["true"]

[[stage]]
name = "b"
command = ["true"]
after = ["c"]

[[stage]]
name = "c"
command = ["true"]
after = ["a", "b"]
"#,
        &[],
    );
    assert!(
        err.to_string().contains("dependency cycle: b -> c -> b"),
        "{err}"
    );
    assert_eq!(err.line(), Some(9));
}

/// Checks one bad farm against its `.expected` file: `line: N`, `field: F`
/// (or `-` for none), then substrings the message must contain.
fn check(file: &Path, expected: &str) -> std::result::Result<(), String> {
    let mut lines = expected.lines();
    let want_line: usize = lines
        .next()
        .and_then(|l| l.strip_prefix("line: "))
        .and_then(|n| n.trim().parse().ok())
        .ok_or("the .expected file must start with `line: N`")?;
    let want_field = lines
        .next()
        .and_then(|l| l.strip_prefix("field: "))
        .map(str::trim)
        .ok_or("the second line of the .expected file must be `field: F`")?;
    let err = match load(file, &opts("/tmp/mesh-test-out")) {
        Ok(_) => return Err("loaded without error".to_string()),
        Err(e) => e,
    };
    let msg = err.to_string();
    let mut wrong = Vec::new();
    if err.line() != Some(want_line) {
        wrong.push(format!("line {:?}, expected {want_line}", err.line()));
    }
    let want_field = (want_field != "-").then_some(want_field);
    if err.field() != want_field {
        wrong.push(format!("field {:?}, expected {want_field:?}", err.field()));
    }
    for sub in lines.filter(|l| !l.trim().is_empty()) {
        if !msg.contains(sub) {
            wrong.push(format!("message lacks {sub:?}"));
        }
    }
    if !msg.starts_with(&format!("{}:{want_line}:", file.display())) {
        wrong.push("message does not start with file:line:".to_string());
    }
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(format!("{}\n      actual: {msg}", wrong.join("; ")))
    }
}

#[test]
fn bad_farms_fail_with_the_expected_errors() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/farms/bad");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("tests/farms/bad")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    files.sort();
    assert!(files.len() >= 25, "only {} bad farms", files.len());
    let mut failures = Vec::new();
    for file in &files {
        let expected = match std::fs::read_to_string(file.with_extension("expected")) {
            Ok(text) => text,
            Err(e) => {
                failures.push(format!("{}: no .expected file: {e}", file.display()));
                continue;
            }
        };
        if std::env::var_os("MESH_SHOW_ERRORS").is_some() {
            if let Err(e) = load(file, &opts("/tmp/mesh-test-out")) {
                eprintln!("{e}");
            }
        }
        if let Err(why) = check(file, &expected) {
            let name = file
                .file_name()
                .map(|n| n.to_string_lossy())
                .unwrap_or_default();
            failures.push(format!("{name}: {why}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} bad farms did not fail as expected:\n{}",
        failures.len(),
        files.len(),
        failures.join("\n")
    );
}

#[test]
fn every_example_loads() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let mut farms: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("examples/")
        .filter_map(|e| e.ok().map(|e| e.path().join("farm.toml")))
        .filter(|p| p.is_file())
        .collect();
    farms.sort();
    assert!(
        farms.len() >= 3,
        "expected at least three examples, found {farms:?}"
    );
    for farm in farms {
        if let Err(e) = load(&farm, &opts("/tmp/mesh-example-out")) {
            panic!("{} does not load: {e}", farm.display());
        }
    }
}

#[test]
fn a_string_of_digits_is_a_number_of_seconds_in_every_duration_field() {
    let (_dir, def) = good(
        r#"
[defaults]
expected = " 30 "

[[stage]]
name = "s"
command = ["true"]
timeout = "5"
"#,
        &[],
    );
    assert_eq!(def.stages[0].timeout_ms, Some(5_000), "as `timeout = 5`");
    assert_eq!(def.stages[0].expected_ms, Some(30_000));
    let err = bad(
        "[[stage]]\nname = \"s\"\ncommand = [\"true\"]\ntimeout = \"0\"\n",
        &[],
    );
    assert!(err.to_string().contains("greater than zero"), "{err}");
    // What is refused is said with the forms that are accepted, digits included.
    let err = bad(
        "[[stage]]\nname = \"s\"\ncommand = [\"true\"]\nexpected = \"5 parsecs\"\n",
        &[],
    );
    assert_eq!(err.field(), Some("stage.expected"));
    assert!(
        err.to_string()
            .contains("a number of seconds such as \"90\" or 90"),
        "{err}"
    );
}

#[test]
fn mem_needs_a_unit_except_zero_which_drops_a_default() {
    for value in ["256", "\"256\"", "0.5", "\"1.5\""] {
        let farm = format!(
            "[[stage]]\nname = \"s\"\ncommand = [\"true\"]\nresources = {{ mem = {value} }}\n"
        );
        let err = bad(&farm, &[]);
        assert_eq!((err.line(), err.column()), (Some(4), Some(21)), "{err}");
        assert_eq!(err.field(), Some("stage.resources.mem"));
        let msg = err.to_string();
        assert!(
            msg.contains("has no unit") && msg.contains("\"4G\""),
            "{msg}"
        );
    }
    let (_dir, def) = good(
        r#"
[defaults]
resources = { mem = "256MiB" }

[[stage]]
name = "bytes"
command = ["true"]
resources = { mem = "300B" }

[[stage]]
name = "none"
command = ["true"]
resources = { mem = 0 }
"#,
        &[],
    );
    assert_eq!(def.stages[0].resources.to_string(), "cpu=1,mem=300B");
    assert_eq!(def.stages[1].resources.to_string(), "cpu=1");
    // Other resources are counts, and take bare numbers.
    good(
        "[[stage]]\nname = \"s\"\ncommand = [\"true\"]\nresources = { cpu = 2, token = \"3\" }\n",
        &[],
    );
}

#[test]
fn literal_braces_reach_the_shell_line() {
    let (_dir, def) = good(
        r#"
[[stage]]
name = "s"
sweep.f = { list = ["a.txt"] }
shell = "awk '{{print $1}}' {f}; echo ${{HOME}}"
"#,
        &[],
    );
    assert_eq!(
        def.expand(TaskRef::new(0, 0)).command,
        Command::Shell("awk '{print $1}' a.txt; echo ${HOME}".into())
    );
}

const KEYED: &str = r#"
[[stage]]
name = "split"
sweep.chrom = { list = ["1", "2"] }
sweep.part = { range = "0..2" }
shell = "true"

[[stage]]
name = "merge"
sweep.c = { list = ["2", "1"] }
after = [{ stage = "split", by = { c = "chrom" } }]
shell = "echo {c}"

[[stage]]
name = "check"
after_each = "merge"
shell = "echo {c} {index}"

[[stage]]
name = "pair"
sweep.l = { list = ["1"] }
after = ["check", { stage = "merge", tasks = "{l} 2", match = "c" }]
shell = "true"
"#;

#[test]
fn keyed_listed_and_inherited_dependencies_load_into_the_tasks_they_name() {
    let (_d, def) = good(KEYED, &[]);
    // merge/0 is c=2: split tasks with chrom 2 are 3, 4, 5.
    let deps = |t: TaskRef| -> Vec<TaskRef> { (0..).map_while(|n| def.dependency(t, n)).collect() };
    assert_eq!(
        deps(TaskRef::new(1, 0)),
        vec![TaskRef::new(0, 3), TaskRef::new(0, 4), TaskRef::new(0, 5)]
    );
    // check takes merge's sweep, and pairs with it.
    assert_eq!(def.stages[2].sweep.vars[0].name, "c");
    assert_eq!(def.stages[2].len(), 2);
    match def.expand(TaskRef::new(2, 1)).command {
        Command::Shell(s) => assert_eq!(s, "echo 1 1"),
        other => panic!("{other:?}"),
    }
    // pair waits for all of check, then merge's c=1 and c=2 (1 and 0).
    assert_eq!(
        deps(TaskRef::new(3, 0)),
        vec![
            TaskRef::new(2, 0),
            TaskRef::new(2, 1),
            TaskRef::new(1, 0),
            TaskRef::new(1, 1)
        ]
    );
}

#[test]
fn a_bad_keyed_or_listed_dependency_is_an_error_at_its_line_and_field() {
    let cases = [
        (
            KEYED.replace("by = { c = \"chrom\" }", "by = [\"c\"]"),
            "farm.toml:11:",
            "field `after.by`: stage `split` has no sweep variable `c` (its variables: chrom, part)",
        ),
        (
            KEYED.replace("tasks = \"{l} 2\"", "tasks = \"{l} 7\""),
            "farm.toml:22:",
            "field `after`: listed from stage `merge`: task 0 names `7`, which no task has",
        ),
        (
            KEYED.replace("match = \"c\"", "match = \"c\", by = [\"l\"]"),
            "farm.toml:22:",
            "field `after.tasks`: `by` and `tasks` are two ways of choosing the tasks waited for; give one",
        ),
        (
            KEYED.replace("list = [\"2\", \"1\"]", "list = [\"8\", \"9\"]"),
            "farm.toml:11:",
            "keyed on stage `split`: no task's key matches a task of that stage",
        ),
        (
            KEYED.replace("{ stage = \"split\", by", "{ stage = \"splat\", by"),
            "farm.toml:11:",
            "unknown stage `splat`",
        ),
    ];
    for (farm, at, says) in cases {
        let e = bad(&farm, &[]).to_string();
        assert!(
            e.contains(at) && e.contains(says),
            "wanted {at} … {says}, got: {e}"
        );
    }
}

#[test]
fn a_stage_key_names_its_tasks_and_is_per_stage_only() {
    let (_d, def) = good(
        "[farm]\nname = \"f\"\n[[stage]]\nname = \"f3-0\"\nkey = \"{id}\"\ncommand = [\"true\"]\nsweep.id = { list = [\"call-1\", \"call-2\"] }\n",
        &[],
    );
    let (_d, other) = good(
        "[farm]\nname = \"f\"\n[[stage]]\nname = \"f9-4\"\nkey = \"{id}\"\ncommand = [\"true\"]\nsweep.id = { list = [\"call-2\"] }\n",
        &[],
    );
    // The same call in another growth's stage: the same key.
    assert_eq!(
        def.own_key(TaskRef::new(0, 1), &[]),
        other.own_key(TaskRef::new(0, 0), &[])
    );
    let e = bad(
        "[farm]\nname = \"f\"\n[defaults]\nkey = \"{id}\"\n[[stage]]\nname = \"s\"\ncommand = [\"true\"]\n",
        &[],
    );
    assert!(e.to_string().contains("key"), "{e}");
    let e = bad(
        "[farm]\nname = \"f\"\n[[stage]]\nname = \"s\"\nkey = \"{nope}\"\ncommand = [\"true\"]\n",
        &[],
    );
    assert!(e.to_string().contains("key"), "{e}");
}

/// A value of `field` that loads in a stage `b` after a stage `a`, and the
/// stage's command fields in its place for `command`, `shell` and `python`
/// (one command a stage).
fn sample(field: &str) -> &'static str {
    match field {
        "name" => "name = \"b\"",
        "key" => "key = \"{x}\"",
        "command" => "command = [\"true\"]",
        "shell" => "shell = \"true\"",
        "python" => "python = [\"python3\", \"job.py\"]",
        "sweep" => "sweep.x = { list = [1, 2] }",
        "sweep_mode" => "sweep_mode = \"zip\"",
        "workdir" => "workdir = \"w/{index}\"",
        "inputs" => "inputs = [\"in.txt\"]",
        "outputs" => "outputs = [\"*.out\"]",
        "env" => "env = { A = \"1\" }",
        "resources" => "resources = { cpu = 2, mem = \"1G\" }",
        "retries" => "retries = 2",
        "max_fails" => "max_fails = 0",
        "timeout" => "timeout = \"1m\"",
        "expected" => "expected = 30",
        "success_codes" => "success_codes = [0, 3]",
        "after" => "after = [\"a\"]",
        "after_each" => "after_each = \"a\"",
        other => panic!(
            "stage field `{other}` is new: give it a sample here, a row in docs/farm-file.md's \
             stage fields, and see that python/mesh writes it"
        ),
    }
}

#[test]
fn every_stage_field_listed_is_read_and_no_other() {
    let files = [("in.txt", "x\n"), ("job.py", "")];
    for &field in stage_fields() {
        let command = if ["command", "shell", "python"].contains(&field) {
            ""
        } else {
            "command = [\"true\"]\n"
        };
        let name = if field == "name" {
            ""
        } else {
            "name = \"b\"\n"
        };
        // `key` names a variable; `zip` combines two.
        let sweep = if field == "key" || field == "sweep_mode" {
            "sweep.x = { list = [1, 2] }\nsweep.y = { list = [3, 4] }\n"
        } else {
            ""
        };
        let farm = format!(
            "[[stage]]\nname = \"a\"\ncommand = [\"true\"]\nsweep.i = {{ list = [1, 2] }}\n\n\
             [[stage]]\n{name}{command}{sweep}{}\n",
            sample(field)
        );
        let (_dir, result) = load_in(&farm, &files);
        if let Err(e) = result {
            panic!("stage field `{field}` is listed but not read:\n{farm}\n{e}");
        }
    }
    let e = bad(
        "[[stage]]\nname = \"a\"\ncommand = [\"true\"]\ntimeout_s = 3\n",
        &[],
    );
    assert!(e.to_string().contains("unknown field `timeout_s`"), "{e}");
    for field in default_fields() {
        assert!(stage_fields().contains(field), "{field}");
    }
}

#[test]
fn the_stage_fields_are_in_the_order_the_docs_list_them() {
    let docs = include_str!("../../../docs/farm-file.md");
    let table = docs
        .split("\n## Stage fields\n")
        .nth(1)
        .expect("docs/farm-file.md has a Stage fields section");
    let listed: Vec<&str> = table
        .lines()
        .skip_while(|l| !l.starts_with("| `"))
        .take_while(|l| l.starts_with('|'))
        .filter_map(|l| l.strip_prefix("| `")?.split('`').next())
        .map(|f| f.strip_suffix(".<var>").unwrap_or(f))
        .collect();
    assert_eq!(listed, stage_fields());
}
