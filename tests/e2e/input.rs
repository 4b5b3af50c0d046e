//! Bad input: rejected before anything runs, exit code 2, a message naming file, line and field.

use crate::sandbox;

#[test]
fn a_malformed_farm_is_rejected_before_anything_runs() {
    let s = sandbox();
    s.write(
        "farm.toml",
        "[[stage]]\nname = \"a\"\nshell = \"touch ran\"\n\n[[stage]]\nname = \"b\"\nafter = [\"nope\"]\nshell = \"touch ran\"\n",
    );
    let r = s.mesh(&["run", "farm.toml"]);
    r.expect_code(2);
    assert!(
        r.stderr.contains("farm.toml:7"),
        "names the file and line: {}",
        r.stderr
    );
    assert!(r.stderr.contains("after"), "names the field: {}", r.stderr);
    assert!(r.stderr.contains("nope"), "{}", r.stderr);
    assert!(!s.exists("ran"), "nothing ran");
    assert!(!s.state().join("farms").exists(), "nothing was recorded");
}

#[test]
fn paths_that_escape_the_farm_folder_are_rejected() {
    let s = sandbox();
    for (i, field) in [
        "inputs = [\"../secret\"]",
        "outputs = [\"/etc/passwd\"]",
        "workdir = \"{x}\"\nsweep.x = { list = [\"ok\", \"../../elsewhere\"] }",
    ]
    .iter()
    .enumerate()
    {
        let name = format!("f{i}.toml");
        s.write(
            &name,
            &format!("[[stage]]\nname = \"a\"\nshell = \"touch ran\"\n{field}\n"),
        );
        let r = s.mesh(&["run", &name]);
        r.expect_code(2);
        assert!(r.stderr.contains(&name), "{}", r.stderr);
        assert!(!s.exists("ran"));
    }
}

#[test]
fn check_shows_the_expansion_without_running() {
    let s = sandbox();
    s.write("farm.toml", "[[stage]]\nname = \"a\"\ncommand = [\"touch\", \"ran-{x}\"]\nsweep.x = { range = \"0..100:10\" }\n");
    let r = s.mesh(&["check", "farm.toml", "--json"]);
    r.expect_code(0);
    let v = r.json();
    assert_eq!(v["tasks"], 11);
    assert_eq!(v["stages"][0]["sample"][1], "touch ran-10");
    assert!(!s.exists("ran-0"));
}
