//! `mesh sim` as a user runs it: flags, scenario files, JSON keys, the seed first, stealing on and off.

use crate::sandbox;

fn scenario(name: &str) -> String {
    format!("{}/../sim/scenarios/{name}", env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn sim_prints_its_seed_first_and_the_report_keys() {
    let sb = sandbox();
    let args = &[
        "sim",
        "--nodes",
        "8",
        "--tasks",
        "500",
        "--durations",
        "uniform:5..20",
        "--seed",
        "9",
        "--json",
    ];
    let r = sb.mesh(args);
    r.expect_code(0);
    assert!(r.stderr.starts_with("mesh sim: seed 9"), "{}", r.stderr);
    let v = r.json();
    for key in [
        "makespan",
        "lower_bound",
        "ratio",
        "utilization",
        "steals",
        "messages",
        "duplicates",
        "events_per_sec",
    ] {
        assert!(v.get(key).is_some(), "no {key} in {v}");
    }
    assert_eq!(v["duplicates"], 0);
    assert_eq!(v["tasks_done"], 500);
    assert!(v["ratio"].as_f64().unwrap() >= 1.0);
    // The farm's messages by kind add up to them all, the tasks' own
    // (assignments and reports) among them, and the line for people
    // names the kinds most sent.
    let farm = &v["traffic_farm"];
    let kinds = farm["by_kind"].as_object().expect("by kind");
    let sum: u64 = kinds.values().map(|n| n.as_u64().unwrap()).sum();
    assert_eq!(sum, farm["messages"].as_u64().unwrap(), "{farm}");
    assert!(
        kinds["report"].as_u64().unwrap() > 0 && kinds["assign"].as_u64().unwrap() > 0,
        "{farm}"
    );
    let words = sb.mesh(&args[..args.len() - 1]);
    assert!(
        words.stdout.lines().any(
            |l| l.starts_with("per node per s during the farm:") && l.contains("; most sent: ")
        ),
        "{}",
        words.stdout
    );
    // The same seed replays the same run.
    let again = sb.mesh(args);
    assert_eq!(again.json()["makespan"], v["makespan"]);
}

#[test]
fn stealing_brings_a_badly_placed_farm_near_its_lower_bound() {
    let sb = sandbox();
    let svg = sb.path().join("skew.svg");
    let with = sb.mesh(&[
        "sim",
        &scenario("skew.toml"),
        "--json",
        "--svg",
        &svg.to_string_lossy(),
    ]);
    with.expect_code(0);
    let without = sb.mesh(&["sim", &scenario("skew.toml"), "--json", "--no-steal"]);
    without.expect_code(0);
    let (a, b) = (
        with.json()["ratio"].as_f64().unwrap(),
        without.json()["ratio"].as_f64().unwrap(),
    );
    assert!(a < 1.6 && b > 4.0, "with stealing {a}, without {b}");
    assert!(with.json()["steals"].as_u64().unwrap() > 0);
    assert!(std::fs::read_to_string(&svg).unwrap().starts_with("<svg"));
}

#[test]
fn bad_sim_flags_are_explained() {
    let sb = sandbox();
    let r = sb.mesh(&["sim", "--durations", "zipf:banana"]);
    r.expect_code(2);
    assert!(r.stderr.contains("--durations"), "{}", r.stderr);
    let r = sb.mesh(&["sim", "no-such.toml"]);
    r.expect_code(2);
    assert!(r.stderr.contains("no-such.toml"), "{}", r.stderr);
}

#[test]
fn a_deadline_finds_the_fewest_nodes_for_a_farm_of_minutes() {
    let sb = sandbox();
    // 40 tasks of 2 min, one core each, on nodes of 4 cores: 20 min on one
    // node and its start-up, 10 on two.
    let args = &[
        "sim",
        "--tasks",
        "40",
        "--durations",
        "2m",
        "--deadline",
        "15m",
        "--json",
    ];
    let r = sb.mesh(args);
    r.expect_code(0);
    let v = r.json();
    assert_eq!(v["nodes"], 2, "{v}");
    assert_eq!(v["node"], "cpu=4", "{v}");
    let tried = v["tried"].as_array().unwrap();
    let one = tried.iter().find(|t| t["nodes"] == 1).expect("1 tried");
    assert_eq!(one["meets"], false, "{v}");
    // One node is still running at 15 min: given up on there, its end not
    // simulated.
    assert_eq!(one["past_deadline"], true, "{v}");
    assert!(one["makespan_ms"].is_null(), "{v}");
    let two = tried.iter().find(|t| t["nodes"] == 2).expect("2 tried");
    assert!(two["makespan_ms"].as_u64().unwrap() <= 15 * 60_000, "{v}");
    // Searched from where greedy list scheduling meets it: 8 slots, five
    // rounds of 2 min. The guess and the count below it settle it.
    assert_eq!(v["greedy"]["nodes"], 2, "{v}");
    assert_eq!(v["greedy"]["makespan_ms"], 10 * 60_000, "{v}");
    assert_eq!(v["searched_from"], 2, "{v}");
    assert_eq!(tried.len(), 2, "{v}");
    assert_eq!(v["answered"], true, "{v}");
    // Words for people, and a deadline no count meets says so, exit 1.
    let r = sb.mesh(&[
        "sim",
        "--tasks",
        "4",
        "--durations",
        "10m",
        "--deadline",
        "5m",
    ]);
    r.expect_code(1);
    assert!(
        r.stdout.contains("deadline 5m 00s: not met"),
        "{}",
        r.stdout
    );
    assert!(
        r.stdout
            .contains("room for every task to start at once: the longest tasks alone take longer"),
        "{}",
        r.stdout
    );
    assert!(r.stdout.contains("nodes of cpu=4"), "{}", r.stdout);
    // A report names its nodes' shape, and durations take units.
    let r = sb.mesh(&[
        "sim",
        "--nodes",
        "3",
        "--tasks",
        "6",
        "--durations",
        "uniform:1m..2m",
    ]);
    r.expect_code(0);
    assert!(r.stdout.contains("nodes 3, cpu=4 each"), "{}", r.stdout);
    let r = sb.mesh(&["sim", "--tasks", "4", "--deadline", "2020-01-01 00:00:00"]);
    r.expect_code(2);
    assert!(
        r.stderr.contains("is in the past: it is 20"),
        "{}",
        r.stderr
    );
    // A date and time ahead is the time left until then.
    let r = sb.mesh(&[
        "sim",
        "--tasks",
        "40",
        "--durations",
        "2m",
        "--deadline",
        "2999-01-01 00:00",
        "--json",
    ]);
    r.expect_code(0);
    assert_eq!(r.json()["nodes"], 1, "{}", r.stdout);
    // Out of time to answer: the counts still simulating are stopped,
    // and the search says which and what it knows, exit 3.
    let r = sb.mesh(&[
        "sim",
        "--tasks",
        "40",
        "--durations",
        "2m",
        "--deadline",
        "15m",
        "--search-time",
        "1ms",
    ]);
    r.expect_code(3);
    assert!(
        r.stdout.contains("not answered within 1ms (--search-time)")
            && r.stdout.contains("did not finish simulating")
            && r.stdout.contains("not finished"),
        "{}",
        r.stdout
    );
    // Stopped hours into its farm, a count says where it would end at its
    // pace so far, labelled as no simulated answer.
    let r = sb.mesh(&[
        "sim",
        "--tasks",
        "20000",
        "--durations",
        "uniform:5m..20m",
        "--deadline",
        "20h",
        "--search-time",
        "3s",
    ]);
    r.expect_code(3);
    assert!(
        r.stdout.contains("(projected, not simulated)")
            && (r.stdout.contains("nodes would meet it (about")
                || r.stdout.contains("nodes would miss it (about")),
        "{}",
        r.stdout
    );
    let r = sb.mesh(&[&args[..], &["--search-time", "1ms"]].concat());
    r.expect_code(3);
    let v = r.json();
    assert_eq!(v["answered"], false, "{v}");
    assert!(v["nodes"].is_null(), "{v}");
    let stopped = v["not_finished"].as_array().unwrap();
    assert!(stopped.iter().any(|n| n == 2), "{v}");
    let two = v["tried"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["nodes"] == 2)
        .expect("2 tried");
    assert_eq!(two["finished"], false, "{v}");
    let r = sb.mesh(&[&args[..], &["--search-time", "none"]].concat());
    r.expect_code(0);
    assert_eq!(r.json()["nodes"], 2, "{}", r.stdout);
    for (bad, flag) in [
        (&["--deadline", "0s"][..], "--deadline"),
        (&["--deadline", "soon"], "--deadline"),
        (
            &["--deadline", "1h", "--search-time", "0s"],
            "--search-time",
        ),
        // Without a deadline there is no search to bound.
        (&["--search-time", "1m"], "--deadline"),
    ] {
        let r = sb.mesh(&[&["sim", "--tasks", "4"][..], bad].concat());
        r.expect_code(2);
        assert!(r.stderr.contains(flag), "{}", r.stderr);
    }
}
