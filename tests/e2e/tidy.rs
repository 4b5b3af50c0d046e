//! Tidy checks on the source tree: module docs, which crate may know what, and how long a file may grow.

use std::fs;
use std::path::{Path, PathBuf};

pub(crate) fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

pub(crate) fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() && p.file_name().is_some_and(|n| n == "target") {
            continue; // build output, not source
        }
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn every_module_starts_with_a_doc_line() {
    let mut files = Vec::new();
    for krate in [
        "protocol", "store", "node", "cli", "sim", "tests", "benches",
    ] {
        rust_files(&root().join(krate), &mut files);
    }
    let missing: Vec<_> = files
        .iter()
        .filter(|f| !fs::read_to_string(f).unwrap().starts_with("//!"))
        .map(|f| f.strip_prefix(root()).unwrap_or(f).display().to_string())
        .collect();
    assert!(
        missing.is_empty(),
        "modules without a `//!` first line: {missing:?}"
    );
}

/// The architecture invariants of ARCHITECTURE.md, as dependency rules.
#[test]
fn crates_depend_only_on_what_their_layer_may_know() {
    let deps = |krate: &str| -> String {
        let text = fs::read_to_string(root().join(krate).join("Cargo.toml")).unwrap();
        // Only [dependencies]: tests and benches may use anything.
        let start = text
            .find("[dependencies]")
            .map(|i| i + "[dependencies]".len())
            .unwrap_or(text.len());
        let rest = &text[start..];
        rest[..rest.find("\n[").unwrap_or(rest.len())].to_string()
    };
    let has = |section: &str, name: &str| {
        section.lines().any(|l| {
            l.trim_start().starts_with(&format!("{name}."))
                || l.trim_start().starts_with(&format!("{name} "))
        })
    };
    for io in ["tokio", "libp2p", "sled", "axum", "mesh-store", "mesh-node"] {
        assert!(
            !has(&deps("protocol"), io),
            "protocol must stay free of I/O, but depends on {io}"
        );
    }
    for krate in ["protocol", "store", "node", "sim"] {
        for ui in ["clap", "indicatif", "console"] {
            assert!(
                !has(&deps(krate), ui),
                "only cli knows terminals and flags, but {krate} depends on {ui}"
            );
        }
    }
    for krate in ["protocol", "store", "sim", "cli"] {
        for net in ["tokio", "libp2p", "axum"] {
            assert!(
                !has(&deps(krate), net),
                "only node knows tokio, libp2p and HTTP, but {krate} depends on {net}"
            );
        }
    }
}

#[test]
fn protocol_reads_no_clock_and_no_global_rng() {
    let mut files = Vec::new();
    rust_files(&root().join("protocol/src"), &mut files);
    for f in files {
        let text = fs::read_to_string(&f).unwrap();
        for banned in [
            "Instant::now",
            "SystemTime::now",
            "thread_rng",
            "rand::random",
            "std::fs::",
            "std::net::",
        ] {
            assert!(
                !text.contains(banned),
                "{} uses {banned}: protocol takes time and randomness as inputs",
                f.display()
            );
        }
    }
}

/// A file this long is several modules' worth: it is read in pieces, so it
/// should be split into them.
const SOURCE_LINES_MAX: usize = 1_500;

/// Files over `SOURCE_LINES_MAX` kept for now, each with why. An entry must
/// still be over the limit, so the list shrinks as files are split.
const SOURCE_LINES_ALLOWED: &[(&str, &str)] = &[];

/// Every `.rs` file of ours: vendored code and the end-to-end tests (one
/// binary of many scenarios) are not held to our module sizes.
fn our_rust_files() -> Vec<PathBuf> {
    let mut files = Vec::new();
    for e in fs::read_dir(root()).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if ["vendor", "tests", "target"].contains(&name.as_str()) || name.starts_with('.') {
            continue;
        }
        if p.is_dir() {
            rust_files(&p, &mut files);
        } else if p.extension().is_some_and(|x| x == "rs") {
            files.push(p);
        }
    }
    files
}

#[test]
fn no_source_file_is_over_1500_lines() {
    let mut over = Vec::new();
    for f in our_rust_files() {
        let lines = fs::read_to_string(&f).unwrap().lines().count();
        let name = f.strip_prefix(root()).unwrap_or(&f).display().to_string();
        if lines > SOURCE_LINES_MAX && !SOURCE_LINES_ALLOWED.iter().any(|(a, _)| *a == name) {
            over.push(format!("{name} ({lines} lines)"));
        }
    }
    assert!(
        over.is_empty(),
        "source files over {SOURCE_LINES_MAX} lines (split them by what they are for): {over:?}"
    );
    for (name, _) in SOURCE_LINES_ALLOWED {
        let lines = fs::read_to_string(root().join(name))
            .map(|t| t.lines().count())
            .unwrap_or(0);
        assert!(
            lines > SOURCE_LINES_MAX,
            "{name} is {lines} lines, within {SOURCE_LINES_MAX}: take it off SOURCE_LINES_ALLOWED"
        );
    }
}

/// ARCHITECTURE.md is a map (bird's-eye view, code map, invariants) that a
/// reader takes in at one sitting; the design decisions and their figures
/// live in docs/design/.
const ARCHITECTURE_LINES_MAX: usize = 400;

#[test]
fn the_architecture_is_a_map_of_at_most_400_lines() {
    let text = fs::read_to_string(root().join("ARCHITECTURE.md")).unwrap();
    let lines = text.lines().count();
    assert!(
        lines <= ARCHITECTURE_LINES_MAX,
        "ARCHITECTURE.md is {lines} lines, over {ARCHITECTURE_LINES_MAX}: \
         move design and figures to docs/design/"
    );
}

/// The README's farm is the sweep example, which the tests run: what a
/// reader copies from the front page works as shown.
#[test]
fn the_readme_farm_is_the_sweep_example() {
    let readme = fs::read_to_string(root().join("README.md")).unwrap();
    let example = fs::read_to_string(root().join("examples/sweep/farm.toml")).unwrap();
    let shown = readme
        .split_once("## A farm\n")
        .and_then(|(_, rest)| rest.split_once("```toml\n"))
        .and_then(|(_, rest)| rest.split_once("```\n"))
        .map(|(block, _)| block)
        .expect("README.md has a ```toml block under `## A farm`");
    // The example's leading comments say how to run it; the README says that itself.
    let file = example
        .split_once("\n[farm]\n")
        .map(|(_, rest)| format!("[farm]\n{rest}"))
        .expect("the example has a [farm] table after its comments");
    assert_eq!(
        shown, file,
        "README.md's farm differs from examples/sweep/farm.toml"
    );
}

/// Invariant checks report what broke as a `String` (a test or the
/// simulator shows it, and no caller acts on it): `fn check*`, `audit`
/// and `recount` in protocol. Any other `Result<_, String>` in library code is an
/// error its caller can only print, so it stays on this list, with why,
/// and with how many the file has: a new one fails the test, and an
/// entry must be lowered as they go.
const STRING_ERRORS_ALLOWED: &[(&str, usize, &str)] = &[
    (
        "cli/src/args.rs",
        16,
        "clap's value parsers return Result<_, String>: clap's convention",
    ),
    (
        "cli/src/import/mod.rs",
        1,
        "a clap value parser (`--scale`): clap's convention",
    ),
    (
        "node/src/net.rs",
        2,
        "check_version and check_identified: a peer's identify version checked, \
         the error the end of the sentence the node logs about that peer",
    ),
    (
        "protocol/src/alloc/book.rs",
        4,
        "a batch system's failure reaches the coordinator as the words the \
         replicated allocation book records; it acts on success or failure \
         alone (the node's BatchError says what went wrong)",
    ),
    (
        "protocol/src/mesh/peer/driver_api.rs",
        4,
        "the peer's side of the same batch answers (see protocol/src/alloc/book.rs)",
    ),
    (
        "sim/src/cluster/batch.rs",
        1,
        "the simulated batch system's answer, in the words the allocation book records",
    ),
    (
        "sim/src/cluster/heal.rs",
        1,
        "`one_mesh` is a check of the simulated mesh: its words go into the report",
    ),
];

/// The `Result<_, String>`s in `text` outside its `#[cfg(test)]` module
/// (and, with `checks`, outside invariant checks), by line.
fn string_errors(text: &str, checks: bool) -> Vec<usize> {
    // Cut at the module of tests written in place (`mod tests;` only names a
    // file); nothing follows it, as clippy's `items_after_test_module` holds.
    let marker = "\n#[cfg(test)]\nmod ";
    let cut = text.match_indices(marker).map(|(i, _)| i).find(|&i| {
        let rest = &text[i + marker.len()..];
        !rest[..rest.find('\n').unwrap_or(rest.len())]
            .trim_end()
            .ends_with(';')
    });
    let code = &text[..cut.unwrap_or(text.len())];
    let bytes = code.as_bytes();
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(at) = code[from..].find("Result<").map(|i| from + i) {
        from = at + "Result<".len();
        if at > 0 && (bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_') {
            continue; // `FooResult<...>`
        }
        // The type's arguments, split at the commas of its own level.
        let (mut depth, mut args, mut arg) = (1, Vec::new(), String::new());
        for (i, c) in code[from..].char_indices() {
            match c {
                '<' | '(' | '[' => depth += 1,
                '>' if i > 0 && bytes[from + i - 1] == b'-' => {} // `->`
                '>' | ')' | ']' => depth -= 1,
                ',' if depth == 1 => {
                    args.push(std::mem::take(&mut arg));
                    continue;
                }
                _ => {}
            }
            if depth == 0 {
                break;
            }
            arg.push(c);
        }
        if !arg.trim().is_empty() {
            args.push(arg); // not after a trailing comma
        }
        if args.len() != 2 || args[1].trim() != "String" {
            continue;
        }
        let line_start = code[..at].rfind('\n').map_or(0, |i| i + 1);
        let line_end = code[at..].find('\n').map_or(code.len(), |i| at + i);
        let line = &code[line_start..line_end];
        let check = checks
            && ["fn check", "fn audit(", "fn recount("]
                .iter()
                .any(|f| line.contains(f));
        if !check {
            found.push(code[..at].matches('\n').count() + 1);
        }
    }
    found
}

#[test]
fn no_library_error_is_a_bare_string_outside_the_checks_and_a_short_list() {
    let mut files = Vec::new();
    for krate in ["protocol", "store", "node", "cli", "sim"] {
        rust_files(&root().join(krate).join("src"), &mut files);
    }
    let mut wrong = Vec::new();
    for f in files {
        let name = f.strip_prefix(root()).unwrap_or(&f).display().to_string();
        if f.file_name().is_some_and(|n| n == "tests.rs") {
            continue; // a module of tests, split out of its parent
        }
        // The engine's and the peer's invariant checks are in protocol.
        let checks = name.starts_with("protocol/");
        let lines = string_errors(&fs::read_to_string(&f).unwrap(), checks);
        let allowed = STRING_ERRORS_ALLOWED
            .iter()
            .find(|(a, ..)| *a == name)
            .map_or(0, |(_, n, _)| *n);
        if lines.len() != allowed {
            wrong.push(format!(
                "{name}: {} at lines {lines:?}, {allowed} allowed",
                lines.len()
            ));
        }
    }
    for (name, ..) in STRING_ERRORS_ALLOWED {
        assert!(
            root().join(name).is_file(),
            "{name} is gone: take it off STRING_ERRORS_ALLOWED"
        );
    }
    assert!(
        wrong.is_empty(),
        "`Result<_, String>` in library code (give the error a thiserror enum that \
         says what went wrong; an invariant check is a `fn check_*`): {wrong:#?}"
    );
}

#[test]
fn string_errors_are_found_where_they_hide() {
    let text = "fn a() -> Result<(), String> {}\n\
                fn b() -> io::Result<String> {}\n\
                fn c() -> Result<Vec<(u8, String)>, String> {}\n\
                fn check_x(&self) -> Result<(), String> {}\n\
                fn d(f: Result<Box<dyn Fn() -> u8>, String>) {}\n\
                fn e() -> Result<String, Error> {}\n\
                fn f() -> Result<\n    Vec<u8>,\n    String,\n> {}\n\
                #[cfg(test)]\nmod split;\nfn g() -> Result<u8, String> {}\n\
                \n#[cfg(test)]\nmod tests { fn t() -> Result<(), String> {} }\n";
    assert_eq!(string_errors(text, true), vec![1, 3, 5, 7, 13]);
    assert_eq!(string_errors(text, false), vec![1, 3, 4, 5, 7, 13]);
}

/// The names an unbounded queue goes by: tokio's, the futures crate's and
/// the standard library's (whose bounded one is `sync_channel`).
const UNBOUNDED: &[&str] = &[
    "unbounded_channel",
    "UnboundedSender",
    "UnboundedReceiver",
    "mpsc::unbounded(",
    "mpsc::channel()",
];

/// Lines of `text` (from 1) that make or name an unbounded queue.
fn unbounded_queues(text: &str) -> Vec<usize> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| UNBOUNDED.iter().any(|u| l.contains(u)))
        .map(|(i, _)| i + 1)
        .collect()
}

/// Every queue of the node has a bound, and a policy for when it is full
/// (docs/design/node-loop.md): one that grows with a slow loop or reader
/// holds memory nobody asked for, and hides the slowness.
#[test]
fn the_node_has_no_unbounded_queue() {
    let mut files = Vec::new();
    rust_files(&root().join("node"), &mut files);
    let found: Vec<String> = files
        .iter()
        .flat_map(|f| {
            let name = f.strip_prefix(root()).unwrap_or(f).display().to_string();
            unbounded_queues(&fs::read_to_string(f).unwrap())
                .into_iter()
                .map(move |l| format!("{name}:{l}"))
        })
        .collect();
    assert!(
        found.is_empty(),
        "unbounded queues in node (give each a bound, and say in \
         docs/design/node-loop.md what happens when it is full): {found:?}"
    );
}

#[test]
fn unbounded_queues_are_found() {
    let text = "let (tx, rx) = mpsc::channel(8);\n\
                let (tx, rx) = tokio::sync::mpsc::unbounded_channel();\n\
                tx: UnboundedSender<Cmd>,\n\
                rx: mpsc::UnboundedReceiver<Msg>,\n\
                let (a, b) = futures::channel::mpsc::unbounded();\n\
                let (a, b) = std::sync::mpsc::channel();\n\
                let (a, b) = std::sync::mpsc::sync_channel(1);\n";
    assert_eq!(unbounded_queues(text), vec![2, 3, 4, 5, 6]);
}

#[test]
fn no_function_is_let_off_taking_too_many_arguments() {
    // An event's facts travel as one value and a step's roles as few
    // arguments; a function that needs more than clippy allows is split
    // or given a struct, never let off.
    let allow = ["allow(clippy::", "too_many_arguments)"].concat();
    let mut found = Vec::new();
    for f in our_rust_files() {
        let text = fs::read_to_string(&f).unwrap();
        for (i, line) in text.lines().enumerate() {
            if line.contains(&allow) {
                found.push(format!("{}:{}", f.display(), i + 1));
            }
        }
    }
    assert!(found.is_empty(), "let off too_many_arguments: {found:?}");
}

/// The lines of `text` (1-based) where a room of the node reaches past its
/// own state: the `Peer`, the `Node`, or a part of it that is no room's
/// (`self.peer`, `self.home`, ...; comments aside; `Event::Peer`, the
/// frames a link reads for the loop, is no `Peer`).
fn reaches_past_its_room(text: &str) -> Vec<usize> {
    let parts = ["peer", "home", "disk", "user", "alloc", "net", "runs"];
    let ident = |w: &str| -> String {
        w.chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim_start().starts_with("//"))
        .filter(|(_, l)| {
            let l = l.replace("Event::Peer", "");
            l.contains("impl Node")
                || l.contains("Node {")
                || l.split("self.")
                    .skip(1)
                    .any(|w| parts.contains(&ident(w).as_str()))
                || l.split(|c: char| !c.is_alphanumeric() && c != '_')
                    .any(|w| w == "Peer")
        })
        .map(|(i, _)| i + 1)
        .collect()
}

/// The node's rooms own their state behind their methods: the net room
/// (`node/src/mesh_node/net/`: the swarm, links, membership packets,
/// reach) reads membership through `Members`, the runs room
/// (`node/src/mesh_node/runs/`: attempts, staging, dependencies,
/// transfers) reads the farms through `Farms`, the kept room
/// (`node/src/mesh_node/kept/`: earlier results by content key) is lent
/// the store, the transfers and the farms for each call, and the home room
/// (`node/src/mesh_node/home/`: control requests, submissions, views, the
/// feed, queries, growth, logs, export) is lent what it reads, the farms
/// and the mesh through `Mesh`; each says what it wants done as values
/// (`NetOut`, `RunsOut`, `HomeOut`). Their fields are private, so the
/// compiler keeps the loop out; this keeps each room out of the loop's parts.
#[test]
fn the_rooms_reach_no_peer_and_no_part_of_the_node() {
    for room in ["net", "runs", "kept", "home"] {
        let mut files = Vec::new();
        rust_files(&root().join("node/src/mesh_node").join(room), &mut files);
        assert!(!files.is_empty(), "the {room} room has no files");
        let mut found = Vec::new();
        for f in files {
            for line in reaches_past_its_room(&fs::read_to_string(&f).unwrap()) {
                found.push(format!("{}:{line}", f.display()));
            }
        }
        assert!(
            found.is_empty(),
            "the {room} room reaches past itself: {found:?}"
        );
    }
}

#[test]
fn reaches_past_a_room_are_found() {
    let text = "use mesh_protocol::mesh::{Msg, Peer};\n\
                // the `Peer` in a comment\n\
                let id: PeerId = p;\n\
                impl Node {\n\
                self.peer.introduce(now, n);\n\
                self.peers.insert(n, p);\n\
                self.home.farms.clear();\n\
                fn f(p: &Peer) {}\n\
                self.home_workdir(task);\n\
                self.recorder.started(t);\n\
                handle.tell(Event::Peer(peer, msgs));\n";
    assert_eq!(reaches_past_its_room(text), vec![1, 4, 5, 7, 8]);
}
