//! `mesh describe --json`: the state folder of the environment it runs in and a stage's fields, as clients read them.

use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::Value;

/// `mesh [ARGS] describe --json` in `cwd` with only `env` of mesh's variables.
fn describe(cwd: &Path, args: &[&str], env: &[(&str, &str)]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_mesh"))
        .args(args)
        .args(["describe", "--json"])
        .current_dir(cwd)
        .env_remove("MESH_STATE_DIR")
        .env_remove("XDG_DATA_HOME")
        .env_remove("MESH_ADDR")
        .env_remove("MESH_LOG")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .expect("run mesh describe");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "mesh describe failed: {stderr}");
    serde_json::from_slice(&out.stdout).expect("mesh describe --json prints JSON")
}

#[test]
fn describe_names_the_state_folder_of_its_environment_and_creates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let here = dir.path().canonicalize().unwrap();
    let state = |v: Value| v["state_dir"].as_str().unwrap().to_string();
    let at = |p: &str| here.join(p).display().to_string();

    let v = describe(&here, &[], &[("MESH_STATE_DIR", "rel/state")]);
    assert_eq!(state(v.clone()), at("rel/state"), "relative to its folder");
    assert!(!here.join("rel").exists(), "describe makes no folder");
    let fields: Vec<&str> = v["stage_fields"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap())
        .collect();
    assert_eq!(fields, mesh_node::farmfile::stage_fields());

    let v = describe(
        &here,
        &["--state-dir", "flag"],
        &[("MESH_STATE_DIR", "var")],
    );
    assert_eq!(state(v), at("flag"), "the flag over the variable");

    let home = here.join("home").display().to_string();
    if !cfg!(target_os = "macos") {
        let xdg = at("data");
        let v = describe(&here, &[], &[("XDG_DATA_HOME", &xdg), ("HOME", &home)]);
        assert_eq!(state(v), at("data/mesh"));
    }
    let v = describe(&here, &[], &[("XDG_DATA_HOME", "data"), ("HOME", &home)]);
    let data = if cfg!(target_os = "macos") {
        "home/Library/Application Support/mesh"
    } else {
        "home/.local/share/mesh"
    };
    assert_eq!(state(v), at(data), "a relative XDG_DATA_HOME is not one");
}
