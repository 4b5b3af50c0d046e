//! Membership's tests: SWIM and the beats between real `Membership`s, packets delivered by hand, timers fired at chosen moments.
use super::*;
use rand::RngExt;

fn node(id: u64, life: u64) -> (Membership, Out) {
    let mut out = Out::new(NodeId(id));
    let mut m = Membership::new(0, NodeId(id), id, 2000, false);
    m.set_address(0, format!("n{id}"), Vec::new(), life, &mut out);
    (m, out)
}

/// Delivers every packet waiting in any `out` until none is left, and
/// fires the timers due by `now`.
fn settle(now: Millis, nodes: &mut [&mut (Membership, Out)]) {
    for _ in 0..100 {
        let mut packets = Vec::new();
        for (m, out) in nodes.iter_mut() {
            m.fire_timers(now, out);
            while let Some(a) = out.actions.pop_front() {
                if let Action::Swim { to, data } = a {
                    packets.push((to.id, data));
                }
            }
        }
        if packets.is_empty() {
            return;
        }
        for (to, data) in packets {
            if let Some((m, out)) = nodes.iter_mut().find(|(m, _)| m.me == to) {
                m.handle_swim(now, &data, out);
            }
        }
    }
}

#[test]
fn a_member_declared_dead_for_its_silence_is_back_when_it_restarts() {
    let (mut a, mut b) = (node(1, 10), node(2, 10));
    b.0.introduce(0, NodeId(1), "n1".into(), Vec::new(), &mut b.1);
    settle(0, &mut [&mut a, &mut b]);
    assert!(a.0.contains(NodeId(2)) && b.0.contains(NodeId(1)));
    assert_eq!(a.0.take_fresh(), vec![NodeId(2)]);
    // A watches B (B reported to it), and B falls silent: dead here,
    // while SWIM still has it alive.
    let beat = Arc::new(a.0.get(NodeId(2)).unwrap().beat().clone());
    a.0.heard(0, NodeId(2), beat);
    // SWIM trusts it: not dead at the limit, only at three times it.
    assert!(a.0.expired(5000, Watch::Direct(2000)).is_empty());
    let dead = a.0.expired(6001, Watch::Direct(2000));
    assert_eq!(dead, vec![NodeId(2)]);
    a.0.remove(5000, NodeId(2));
    assert!(!a.0.contains(NodeId(2)));
    // B restarts as its next life and rejoins through A.
    let mut b = node(2, 20);
    b.0.introduce(5000, NodeId(1), "n1".into(), Vec::new(), &mut b.1);
    settle(5000, &mut [&mut a, &mut b]);
    assert!(a.0.contains(NodeId(2)), "the restarted member is back");
    assert_eq!(a.0.take_fresh(), vec![NodeId(2)]);
    assert_eq!(a.0.gone_since(NodeId(2)), None);
}

/// Runs the nodes from `from` to `to` ms, a step at each timer due,
/// delivering every packet at once but those to or from `cut`.
fn run(from: Millis, to: Millis, nodes: &mut [&mut (Membership, Out)], cut: Option<u64>) {
    let mut now = from;
    while now <= to {
        let mut packets = Vec::new();
        for (m, out) in nodes.iter_mut() {
            m.fire_timers(now, out);
        }
        for _ in 0..100 {
            for (m, out) in nodes.iter_mut() {
                while let Some(a) = out.actions.pop_front() {
                    if let Action::Swim { to, data } = a {
                        if cut != Some(m.me.0) && cut != Some(to.id.0) {
                            packets.push((to.id, data));
                        }
                    }
                }
            }
            if packets.is_empty() {
                break;
            }
            for (to, data) in packets.drain(..) {
                if let Some((m, out)) = nodes.iter_mut().find(|(m, _)| m.me == to) {
                    m.handle_swim(now, &data, out);
                }
            }
        }
        let next = nodes.iter().filter_map(|(m, _)| m.next_timer()).min();
        now = next.map_or(to + 1, |t| t.max(now + 1));
    }
}

fn formed() -> [(Membership, Out); 3] {
    let (mut a, mut b, mut c) = (node(1, 10), node(2, 10), node(3, 10));
    b.0.introduce(0, NodeId(1), "n1".into(), Vec::new(), &mut b.1);
    c.0.introduce(0, NodeId(1), "n1".into(), Vec::new(), &mut c.1);
    run(0, 5_000, &mut [&mut a, &mut b, &mut c], None);
    for m in [&a, &b, &c] {
        assert_eq!(m.0.len(), 2, "node {} sees both others", m.0.me.0);
        assert_eq!(m.0.health(), 0, "a mesh that answers is healthy");
    }
    [a, b, c]
}

/// When node `m`'s gossip tick is next due.
fn gossip_due(m: &Membership) -> Millis {
    m.timers
        .iter()
        .find(|(_, t)| matches!(t, Timer::PeriodicGossip(_)))
        .map(|(&(at, ..), _)| at)
        .expect("a member of a mesh has its gossip tick set")
}

#[test]
fn timers_with_nothing_to_do_wake_no_one_and_the_gossip_tick_keeps_its_phase() {
    let [mut a, mut b, mut c] = formed();
    // Long enough for every update to have been told its times.
    run(5_000, 30_000, &mut [&mut a, &mut b, &mut c], None);
    let quiet = |m: &Membership| {
        let tick = m
            .timers
            .values()
            .find(|t| matches!(t, Timer::PeriodicGossip(_)));
        m.swim.timer_is_quiet(tick.expect("the gossip tick is set"))
    };
    assert!(quiet(&a.0), "nothing left to tell");
    let due = gossip_due(&a.0);
    let next = a.0.next_timer().expect("probes are set");
    assert!(
        next > due,
        "the tick at {due} wakes no one (next wake {next})"
    );
    // A node that steps every timer is woken for the first.
    a.0.skip_quiet = false;
    let first = a.0.timers.keys().next().map(|&(at, ..)| at);
    assert_eq!(a.0.next_timer(), first);
    assert!(first <= Some(due));
    a.0.skip_quiet = true;
    // Fired with the node's next input, the ticks due since send
    // nothing, and the next one keeps the phase of 200 ms: three ticks
    // and a bit later, or just before another timer is due. What else
    // is due by then would do nothing too (an indirect probe of a
    // member that answered), or it would have woken the node.
    let now = (due + 3 * 200 + 57).min(next - 1);
    let others: Vec<&Timer<Ident>> =
        a.0.timers
            .iter()
            .filter(|(&(at, other, _), _)| other && at <= now)
            .map(|(_, t)| t)
            .collect();
    assert!(others.iter().all(|t| a.0.swim.timer_is_quiet(t)));
    let others = others.len() as u64;
    a.1.actions.clear();
    let ticks = a.1.stats.quiet_timers;
    a.0.fire_quiet(now, &mut a.1);
    assert!(a.1.actions.is_empty(), "a quiet tick sends nothing");
    let again = gossip_due(&a.0);
    assert!(
        again > now && again - now <= 200,
        "next tick {again}, now {now}"
    );
    assert_eq!((again - due) % 200, 0, "the phase kept");
    assert_eq!(
        a.1.stats.quiet_timers - ticks,
        (now - due) / 200 + 1 + others
    );
}

#[test]
fn a_watched_member_is_looked_at_the_moment_its_silence_is_too_long() {
    let (mut a, mut b) = (node(1, 10), node(2, 10));
    b.0.introduce(0, NodeId(1), "n1".into(), Vec::new(), &mut b.1);
    settle(0, &mut [&mut a, &mut b]);
    let beat = Arc::new(a.0.get(NodeId(2)).unwrap().beat().clone());
    a.0.heard(100, NodeId(2), beat);
    // Watched by this node, its coordinator: silent too long after 2 s.
    assert!(a.0.expired(1000, Watch::Direct(2000)).is_empty());
    assert_eq!(a.0.next_silence(), Some(2101));
    // SWIM trusts it, so then it gets three times as long, to the ms.
    assert!(a.0.expired(2101, Watch::Direct(2000)).is_empty());
    assert_eq!(a.0.next_silence(), Some(6101));
    assert!(a.0.expired(6100, Watch::Direct(2000)).is_empty());
    assert_eq!(a.0.expired(6101, Watch::Direct(2000)), vec![NodeId(2)]);
    // Watching no one, no look is due; a change of watch is news.
    a.0.expired(6101, Watch::None);
    assert_eq!(a.0.next_silence(), None);
    assert!(a.0.watch_changed(Watch::Direct(2000)));
    assert!(!a.0.watch_changed(Watch::None));
}

#[test]
fn probes_that_go_unanswered_lower_this_node_health_and_answers_restore_it() {
    let [mut a, mut b, mut c] = formed();
    // A hears no one, as a node starved of CPU hears no one in time.
    run(5_000, 20_000, &mut [&mut a, &mut b, &mut c], Some(1));
    assert!(a.0.health() >= 2, "health {}", a.0.health());
    assert_eq!(b.0.health(), 0, "B's probes of C were answered");
    // Answered again, it is healthy again.
    run(20_000, 120_000, &mut [&mut a, &mut b, &mut c], None);
    assert_eq!(a.0.health(), 0);
}

/// When a lone partner falls silent, the ms until this node declares it down.
fn declares_down_after(health: u32) -> Millis {
    let (mut a, mut b) = (node(1, 10), node(2, 10));
    b.0.introduce(0, NodeId(1), "n1".into(), Vec::new(), &mut b.1);
    run(0, 5_000, &mut [&mut a, &mut b], None);
    assert!(a.0.contains(NodeId(2)));
    a.0.health = health;
    let mut t = 5_000;
    while a.0.expired(t, Watch::None).is_empty() {
        assert!(t < 600_000, "never declared down");
        run(t, t + 500, &mut [&mut a, &mut b], Some(2));
        t += 500;
    }
    t - 5_000
}

#[test]
fn an_unhealthy_node_takes_longer_to_declare_a_silent_member_down() {
    let healthy = declares_down_after(0);
    let unhealthy = declares_down_after(4);
    assert!(healthy <= 12_000, "healthy: {healthy} ms");
    assert!(
        unhealthy >= 3 * healthy,
        "stretched by its health: {unhealthy} ms, healthy {healthy} ms"
    );
}

#[test]
fn the_lowest_members_kept_at_hand_follow_every_join_and_death() {
    let (mut m, _) = node(50, 10);
    let mut rng = SmallRng::seed_from_u64(7);
    for step in 0..5_000u64 {
        let id = NodeId(rng.random_range(1..40));
        if rng.random_bool(0.5) {
            m.admit(id, true);
        } else {
            m.remove(step, id);
        }
        m.check().unwrap();
        let (not, nor) = (
            NodeId(rng.random_range(1..40)),
            Some(NodeId(rng.random_range(1..40))),
        );
        let scan = m.ids().find(|&x| x != not && Some(x) != nor);
        assert_eq!(m.lowest_but(not, nor), scan, "step {step}");
        assert_eq!(m.lowest(), m.ids().next());
    }
}

#[test]
fn a_heartbeat_that_fires_late_counts_against_this_node_health_once_a_moment() {
    let [mut a, _, _] = formed();
    let now = a.0.next_beat() + 3 * LATE_MS;
    assert!(a.0.beat_due(now, 250));
    assert_eq!(a.0.health(), 1, "the node was not running when it was due");
    // SWIM's timers late at the same moment show the same lateness.
    a.0.fire_timers(now, &mut a.1);
    assert_eq!(a.0.health(), 1);
    // On time, no more.
    assert!(a.0.beat_due(now + 250, 250));
    assert_eq!(a.0.health(), 1);
}

#[test]
fn timers_that_fire_late_count_against_this_node_health() {
    let [mut a, _, _] = formed();
    let due = a.0.next_timer().expect("a probe timer");
    a.0.fire_timers(due + 3 * LATE_MS, &mut a.1);
    assert_eq!(
        a.0.health(),
        1,
        "this node was not running when its timer was due"
    );
}

/// A packet as delivered: when, from, to, its bytes.
type Sent = (Millis, u64, u64, Vec<u8>);

/// `run`, with SWIM's quiet packets in closed form where `quiet`; each
/// packet delivered, in the order it was sent, logged as (when, from,
/// to, bytes), one in closed form as the bytes it stands for. Also how
/// many were taken in closed form, and how many of those were feeds.
fn run_logged(
    from: Millis,
    to: Millis,
    nodes: &mut [&mut (Membership, Out)],
    quiet: bool,
) -> (Vec<Sent>, u64, u64) {
    for (m, _) in nodes.iter_mut() {
        m.set_quiet_swim(quiet);
    }
    let mut log = Vec::new();
    let (mut closed, mut feeds) = (0, 0);
    let mut now = from;
    while now <= to {
        for (m, out) in nodes.iter_mut() {
            m.fire_timers(now, out);
        }
        for _ in 0..100 {
            let mut packets = Vec::new();
            for (i, (_, out)) in nodes.iter_mut().enumerate() {
                packets.extend(out.actions.drain(..).map(|a| (i, a)));
            }
            if packets.is_empty() {
                break;
            }
            for (i, a) in packets {
                let me = nodes[i].0.me;
                let (to, bytes, q) = match a {
                    Action::Swim { to, data } => (to.id, data, None),
                    Action::QuietSwim(q) => (q.to.id, nodes[i].0.packet(&q), Some(q)),
                    _ => continue,
                };
                log.push((now, me.0, to.0, bytes.clone()));
                let Some(j) = nodes.iter().position(|(m, _)| m.me == to) else {
                    continue;
                };
                let (m, out) = &mut *nodes[j];
                match q {
                    Some(q) if m.quiet_swim_in(now, &q, out) => {
                        closed += 1;
                        feeds += u64::from(matches!(q.packet, Quiet::Feed(_)));
                    }
                    _ => m.handle_swim(now, &bytes, out),
                }
            }
        }
        let next = nodes.iter().filter_map(|(m, _)| m.next_timer()).min();
        now = next.map_or(to + 1, |t| t.max(now + 1));
    }
    (log, closed, feeds)
}

/// All a node's SWIM state that a later step reads, but foca's own
/// (the packets it sends from then on show that).
fn swim_state(m: &(Membership, Out)) -> String {
    let (m, out) = m;
    format!(
        "timers {:?} health {} heard {} incarnation {} late {:?} gossip {:?} stats {:?} members {:?} sum {}",
        m.timers, m.health, m.heard, m.incarnation, m.late_at, m.gossip_fired, out.stats,
        m.swim.iter_members().map(|x| x.id().clone()).collect::<Vec<_>>(), m.sum
    )
}

#[test]
fn probe_rounds_in_closed_form_leave_the_nodes_as_their_packets_do() {
    let mut stepped = formed();
    let mut quiet = formed();
    // Both the same mesh: every join told, nothing left to gossip. The
    // closed form takes over probes from then on, and the feeds that
    // answer the periodic announces (built packets).
    for set in [&mut stepped, &mut quiet] {
        let [a, b, c] = set;
        run(5_000, 30_000, &mut [a, b, c], None);
    }
    let [a, b, c] = &mut stepped;
    let (stepped_log, none, _) = run_logged(30_001, 70_000, &mut [a, b, c], false);
    let [x, y, z] = &mut quiet;
    let (quiet_log, closed, feeds) = run_logged(30_001, 70_000, &mut [x, y, z], true);
    assert_eq!(none, 0);
    // A probe a second each, its ping and its ack, all in closed form;
    // an announce every 10 s each, its feed too.
    assert!(
        closed >= 2 * 3 * 39,
        "{closed} packets taken in closed form"
    );
    assert!(feeds >= 3 * 3, "{feeds} feeds taken in closed form");
    assert_eq!(stepped_log.len(), quiet_log.len());
    for (s, q) in stepped_log.iter().zip(&quiet_log) {
        assert_eq!(s, q);
    }
    for (s, q) in stepped.iter().zip(&quiet) {
        assert_eq!(swim_state(s), swim_state(q), "node {}", s.0.me.0);
    }
    // Stepped on, both send the same: foca's draws and its member cursor
    // were left as the packets left them.
    let [a, b, c] = &mut stepped;
    let (stepped_on, _, _) = run_logged(70_001, 80_000, &mut [a, b, c], false);
    let [x, y, z] = &mut quiet;
    let (quiet_on, _, _) = run_logged(70_001, 80_000, &mut [x, y, z], false);
    assert_eq!(stepped_on, quiet_on);
}

#[test]
fn workers_report_twice_a_second_up_to_ten_nodes_once_a_second_to_two_hundred_then_less_often() {
    // Dask's scheduler's first two steps (0.5 s up to 10 workers, 1 s
    // past), then the coordinator's budget of reports a second.
    let cfg = Config::default();
    let every = |size| report_interval(&cfg, size);
    assert_eq!((every(1), every(10)), (500, 500));
    assert_eq!((every(11), every(200)), (1000, 1000));
    assert_eq!((every(400), every(1000)), (2000, 5000));
}
