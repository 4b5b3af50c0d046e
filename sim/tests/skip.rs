//! Skipping the peers' timers that do nothing gives the same run as stepping every one: every scenario, seeded, compared field by field.

use mesh_protocol::mesh::Msg;
use mesh_sim::scenario::StageSpec;
use mesh_sim::{load_scenario, run, SimConfig, SimReport};

/// The report, and apart from it what says how fast it was made (the
/// speed line, the events stepped, the wall time, the memory).
fn outcome(cfg: &SimConfig, step: bool) -> (SimReport, SimReport) {
    let mut cfg = cfg.clone();
    cfg.step = step;
    match run(&cfg) {
        Ok(r) => (r.answer(), r),
        Err(e) => panic!("{} (step {step}): {e}", cfg.name),
    }
}

/// Events of the farm's upkeep from the source named `name` (a message
/// kind, "heartbeat timer", "superseded timer", ...).
fn from_source(r: &SimReport, name: &str) -> u64 {
    let by = &r.upkeep.by_source;
    by.iter()
        .find(|(s, _)| s.starts_with(name))
        .map_or(0, |(_, n)| *n)
}

/// Both ways, the same report; the events stepped each way, and the
/// skipping run's whole report.
fn same_both_ways(cfg: &SimConfig) -> (u64, u64, SimReport) {
    let (skipped, skipping) = outcome(cfg, false);
    let (stepped, stepping) = outcome(cfg, true);
    let (fewer, saved, all) = (skipping.events, skipping.upkeep.skipped, stepping.events);
    assert_eq!(
        stepping.upkeep.skipped, 0,
        "{}: stepping skips nothing",
        cfg.name
    );
    assert_eq!(
        stepping.upkeep.acks_when_sent, 0,
        "{}: stepping takes each ack at its arrival",
        cfg.name
    );
    assert_eq!(
        stepping.upkeep.pings_answered, 0,
        "{}: stepping answers each ping in a step",
        cfg.name
    );
    assert_eq!(
        stepping.upkeep.reports_answered
            + stepping.upkeep.claims_taken
            + stepping.upkeep.answers_taken,
        0,
        "{}: stepping takes each report and list of claims in a step",
        cfg.name
    );
    if skipped != stepped {
        // The first field that differs, not two reports of thousands of lines.
        let (a, b) = (format!("{skipped:#?}"), format!("{stepped:#?}"));
        let at = a
            .lines()
            .zip(b.lines())
            .position(|(x, y)| x != y)
            .unwrap_or(0);
        let near = |t: &str| {
            t.lines()
                .skip(at.saturating_sub(8))
                .take(12)
                .collect::<Vec<_>>()
                .join("\n")
        };
        panic!(
            "{} seed {}: skipping and stepping differ at line {at} of the report:\nskipping:\n{}\nstepping:\n{}",
            cfg.name,
            cfg.seed,
            near(&a),
            near(&b)
        );
    }
    // Never more events but wakes of timers that had moved (a timer
    // skipped whose round turned loud before it was due moves the node's
    // wake earlier: the later one it had is popped and does nothing), and
    // some timers woke no one where fewer were stepped (not one event
    // each: stepped, some fell on the moment of another timer's wake).
    let moved = |r: &SimReport| from_source(r, "superseded timer");
    let (moved_skipping, moved_stepping) = (moved(&skipping), moved(&stepping));
    assert!(
        fewer - moved_skipping <= all - moved_stepping && (fewer == all || saved > 0),
        "{} seed {}: {fewer} events skipping ({moved_skipping} wakes of a timer that had moved) \
         and {saved} timers without a wake, {all} stepping ({moved_stepping})",
        cfg.name,
        cfg.seed
    );
    eprintln!(
        "{} seed {}: {fewer} events skipping, {all} stepping",
        cfg.name, cfg.seed
    );
    (fewer, all, skipping)
}

fn scenario(name: &str) -> SimConfig {
    load_scenario(format!(
        "{}/scenarios/{name}.toml",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap()
}

/// Each of sim/scenarios, with three seeds; the two of a thousand nodes
/// and more scaled down to a few hundred (the full sizes are benches).
fn every_scenario(names: &[&str]) {
    for &name in names {
        let mut base = scenario(name);
        if base.node_count() > 500 {
            base.scale_nodes(300);
        }
        for seed in [base.seed, base.seed + 1, base.seed + 2] {
            let mut cfg = base.clone();
            cfg.seed = seed;
            same_both_ways(&cfg);
        }
    }
}

#[test]
fn every_small_scenario_runs_the_same_skipped_or_stepped() {
    every_scenario(&["basic", "cluster", "faults", "skew", "alloc"]);
}

#[test]
fn every_large_scenario_runs_the_same_skipped_or_stepped() {
    every_scenario(&["heal", "large", "mass-crash"]);
}

#[test]
fn a_farm_of_minutes_runs_the_same_skipped_or_stepped() {
    // The quiet stretches a skip is for: every slot busy for minutes.
    for seed in 1..=3 {
        let mut cfg = SimConfig::simple(seed, 6, "cpu=2", 60, "uniform:1m..4m");
        cfg.stages.push(StageSpec {
            name: "gather".into(),
            tasks: 1,
            durations: "30s".into(),
            after: vec![cfg.stages[0].name.clone()],
            ..cfg.stages[0].clone()
        });
        let (fewer, all, _) = same_both_ways(&cfg);
        // A quiet node woke for its gossip tick five times a second: a
        // sixth of these events and more.
        assert!(
            fewer * 6 < all * 5,
            "seed {seed}: {fewer} events skipping, {all} stepping"
        );
    }
}

#[test]
fn a_workers_heartbeat_wakes_it_only_for_more_than_its_report() {
    // A worker of a small mesh reports every other heartbeat (500 ms);
    // while its slots are busy the beat between does nothing, and is
    // fired with its node's next event, and the report's beat does
    // nothing but report: the simulator sends the report for it at the
    // beat's moment, and the beat fires with the node's next event. The
    // coordinator's beats, and those of the node next in line (it watches
    // the coordinator), still wake.
    let cfg = SimConfig::simple(1, 10, "cpu=2", 80, "uniform:1m..4m");
    let wakes = |step: bool| {
        let (_, r) = outcome(&cfg, step);
        (from_source(&r, "heartbeat"), r.upkeep.reports_sent)
    };
    let ((skipped, sent), (stepped, none)) = (wakes(false), wakes(true));
    assert_eq!(none, 0, "stepping sends no report for a worker");
    // Two nodes of ten beat four times a second, eight twice: the two
    // wake 8 times of the 40 a second stepped; the eight's 16 reports
    // are sent for them.
    assert!(
        skipped * 10 < stepped * 3 && skipped * 10 > stepped,
        "{skipped} heartbeat wakes skipping, {stepped} stepping"
    );
    assert!(
        sent * 10 > stepped * 3 && sent * 2 < stepped,
        "{sent} reports sent for their workers, {stepped} heartbeat wakes stepping"
    );
    same_both_ways(&cfg);
}

#[test]
fn a_coordinators_progress_round_with_nothing_to_tell_wakes_no_one() {
    // Five rounds a second tell the holders of the farm's copies how far
    // it is; while tasks of minutes run, the counts change a few times a
    // minute and nearly every round tells nothing: it fires with the
    // coordinator's next step (its heartbeat's, at the latest), sends
    // nothing, and the round after it keeps its phase.
    let cfg = SimConfig::simple(2, 6, "cpu=2", 60, "uniform:1m..4m");
    let wakes = |step: bool| from_source(&outcome(&cfg, step).1, "progress");
    let (skipped, stepped) = (wakes(false), wakes(true));
    assert!(
        stepped > 1_000 && skipped * 10 < stepped,
        "{skipped} progress wakes skipping, {stepped} stepping"
    );
    same_both_ways(&cfg);
}

#[test]
fn a_probers_ack_is_taken_when_sent_where_nothing_can_come_between() {
    // SWIM's ack of a quiet probe reaches its prober a few milliseconds
    // after it is sent; where nothing can be lost, cut off or stalled on
    // the way, the prober takes it when it is sent, without a step of its
    // own, and the probed node answers the ping at its arrival without
    // the rest of a step. Ten nodes probe once a second each.
    let cfg = SimConfig::simple(3, 10, "cpu=2", 80, "uniform:1m..4m");
    let (_, _, r) = same_both_ways(&cfg);
    let (taken, probes) = (r.upkeep.acks_when_sent, r.makespan / 1000 * 10);
    assert!(
        taken * 10 > probes * 8,
        "{taken} acks taken when sent, over {probes} probes in the farm alone"
    );
    let answered = r.upkeep.pings_answered;
    assert!(
        answered * 10 > probes * 8,
        "{answered} pings answered without a step, over {probes} probes"
    );
    // Where a message may be lost, each ack waits for its arrival, and
    // each ping is answered in its step.
    let mut lossy = cfg.clone();
    lossy.loss = 0.01;
    let (_, _, r) = same_both_ways(&lossy);
    assert_eq!(r.upkeep.acks_when_sent, 0, "lossy links");
    assert_eq!(r.upkeep.pings_answered, 0, "lossy links");
}

#[test]
fn a_coordinator_takes_what_tells_it_nothing_new_without_a_step() {
    // While every slot is busy, each of nine workers reports twice a
    // second, listing the claims it holds (its coordinator answers); no
    // report tells the coordinator anything it did not know, nor the
    // answer the worker, and the step around them would do nothing
    // else: all are taken at their arrival without one, the report's
    // answer sent as the step would send it. No list goes on its own,
    // and the workers' resend rounds, with nothing to send, wake no one.
    // Stepped, every one is a step; the same report.
    let cfg = SimConfig::simple(2, 10, "cpu=2", 80, "uniform:1m..4m");
    let (_, _, r) = same_both_ways(&cfg);
    let seconds = r.makespan / 1000;
    let answered = r.upkeep.reports_answered;
    assert!(
        answered > seconds * 9 * 2 * 6 / 10,
        "{answered} reports answered without a step in {seconds} s of nine workers"
    );
    let claimed = Msg::KINDS
        .iter()
        .position(|k| *k == "claimed")
        .expect("a kind");
    assert_eq!(
        r.traffic_farm.by_kind.0[claimed], 0,
        "lists sent on their own"
    );
    let resends = from_source(&r, "resend timer");
    assert!(
        resends < seconds * 2,
        "{resends} resend wakes in {seconds} s: only the coordinator's wake"
    );
    let answers = r.upkeep.answers_taken;
    assert!(
        answers > seconds * 9 * 2 * 6 / 10,
        "{answers} answers taken by their workers without a step in {seconds} s of nine workers"
    );
    // A node that is stalled a while takes each in a step.
    let mut stalled = cfg.clone();
    stalled.stall.push(mesh_sim::scenario::StallSpec {
        node: 3,
        from_ms: 40_000,
        until_ms: 42_000,
    });
    let (_, _, r) = same_both_ways(&stalled);
    let unstepped = r.upkeep.reports_answered + r.upkeep.claims_taken + r.upkeep.answers_taken;
    assert_eq!(unstepped, 0, "a stalled node");
}
