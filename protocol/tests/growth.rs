//! An open farm grown batch by batch between real peers: what each growth costs the coordinator and the home, counted in the log entries the coordinator streams, and a growth lost on its way to a holder.
//!
//! A Python client's loop of `submit(...).result()`, or Snakemake's jobs
//! found ready one batch at a time, grows one open farm by a stage each
//! time. The peers here are the protocol's own, driven as the node drives
//! them, with every message delivered at once and every task done as soon
//! as it starts.

use std::collections::VecDeque;
use std::sync::Arc;

use mesh_protocol::engine::{Outcome, TaskResult};
use mesh_protocol::farm::{CommandTemplate, FarmDef, StageDef, Sweep, Template};
use mesh_protocol::mesh::{Action, Config, FarmId, FarmSpec, Msg, NodeId, Peer, PeerEvent};
use mesh_protocol::resources::parse_resources;
use mesh_protocol::Resources;

const FARM: FarmId = FarmId(7);

/// Peers of a mesh: node 1 founded it and coordinates, node 2 joined it
/// and is the home of the farms submitted to it, any others joined too.
struct Mesh {
    peers: Vec<Peer>,
    now: u64,
    /// Log entries the coordinator streamed to the home in its syncs.
    synced_to_home: u64,
    /// The next growth sent to this node is lost on the way.
    lose_growth_to: Option<NodeId>,
    /// The home heard its farm (or its latest growth) durable this often.
    accepted: u64,
    /// Persists the peers asked for.
    persists: u64,
    /// Every message sent, in order: who to whom, and what.
    sent: Vec<String>,
}

impl Mesh {
    fn new(nodes: u64, cfg: Config) -> Mesh {
        Mesh::keeping(nodes, cfg, true)
    }

    /// As `new`, the peers keeping no store where `store` is false.
    fn keeping(nodes: u64, cfg: Config, store: bool) -> Mesh {
        let res: Resources = parse_resources("cpu=2").expect("resources");
        let mut peers = Vec::new();
        for id in 1..=nodes {
            let mut p = Peer::new(0, NodeId(id), res.clone(), cfg.clone(), id, id > 1);
            p.set_address(0, format!("n{id}"), Vec::new(), 1 << 32);
            if !store {
                p.keep_no_store();
            }
            if id > 1 {
                p.joins_by_address();
                p.introduce(0, NodeId(1), "n1".into(), Vec::new());
            }
            peers.push(p);
        }
        let mut m = Mesh {
            peers,
            now: 0,
            synced_to_home: 0,
            lose_growth_to: None,
            accepted: 0,
            persists: 0,
            sent: Vec::new(),
        };
        let others = nodes as usize - 1;
        m.run_until(60_000, |m| {
            m.peers.iter().all(|p| p.coordinator() == Some(NodeId(1)))
                && m.peers.iter().all(|p| p.member_count() >= others)
        });
        m
    }

    /// Steps every peer's actions (messages delivered at once, tasks done
    /// as they start, inputs always there) and their timers, 10 ms at a
    /// time, until `done` holds or `limit_ms` more have passed.
    fn run_until(&mut self, limit_ms: u64, done: impl Fn(&Mesh) -> bool) {
        let until = self.now + limit_ms;
        while !done(self) {
            assert!(self.now < until, "not settled by {until} ms");
            self.deliver();
            if done(self) {
                return;
            }
            self.now += 10;
            for p in &mut self.peers {
                if p.poll_timeout().is_some_and(|t| t <= self.now) {
                    p.handle_timeout(self.now);
                }
            }
        }
    }

    fn deliver(&mut self) {
        let now = self.now;
        for _ in 0..10_000 {
            let mut moved = false;
            for i in 0..self.peers.len() {
                let from = NodeId(i as u64 + 1);
                let mut actions = VecDeque::new();
                self.peers[i].take_actions(&mut actions);
                for a in actions {
                    moved = true;
                    match a {
                        Action::Send { to, msg } => {
                            self.sent
                                .push(format!("{from:?} -> {to:?} at {now}: {msg:?}"));
                            if let (NodeId(2), Msg::Sync(s)) = (to, &msg) {
                                self.synced_to_home += s.entries.len() as u64;
                            }
                            if matches!(msg, Msg::ReplicateGrown { .. })
                                && self.lose_growth_to == Some(to)
                            {
                                self.lose_growth_to = None;
                                continue;
                            }
                            self.peers[to.0 as usize - 1].handle_message(now, from, msg);
                        }
                        Action::Swim { to, data } => {
                            self.peers[to.id.0 as usize - 1].handle_swim(now, &data);
                        }
                        Action::Start { task, .. } => {
                            let outcome = Outcome {
                                result: TaskResult::Exited(0),
                                key: None,
                                duration_ms: 1,
                                ended_ms: 0,
                                grew: None,
                                logs: 0,
                                stderr_line: None,
                                usage: None,
                            };
                            self.peers[i].task_finished(now, task, outcome, Vec::new());
                        }
                        Action::FetchInputs { farm } => self.peers[i].inputs_ready(now, farm, true),
                        Action::Emit(PeerEvent::Accepted { .. }) if i == 1 => self.accepted += 1,
                        Action::Persist(_) => self.persists += 1,
                        _ => {}
                    }
                }
            }
            if !moved {
                return;
            }
        }
        panic!("the peers never went quiet");
    }
}

/// A stage of `n` tasks of `true`.
fn stage(name: &str, n: u64) -> Arc<StageDef> {
    Arc::new(StageDef::new(
        name,
        CommandTemplate::Argv(vec![Template::literal("true")]),
        Sweep::range("i", n),
    ))
}

fn spec(stages: Vec<Arc<StageDef>>, gen: u32) -> FarmSpec {
    FarmSpec {
        id: FARM,
        origin: NodeId(2),
        def: Arc::new(FarmDef {
            graph: Default::default(),
            name: "calls".into(),
            root: "/".into(),
            out: "/out".into(),
            stages: stages.into(),
        }),
        inputs: Vec::new(),
        submitted_ms: 0,
        gen,
        open: true,
    }
}

fn done_on_home(m: &Mesh, tasks: u64) -> bool {
    m.peers[1]
        .progress(FARM)
        .is_some_and(|p| p.counts.done == tasks)
}

#[test]
fn each_growth_of_an_open_farm_streams_the_home_only_the_entries_it_lacks() {
    let mut m = Mesh::new(2, Config::default());
    let mut stages = vec![stage("s0", 1)];
    let now = m.now;
    m.peers[1].submit(now, spec(stages.clone(), 0), Vec::new());
    m.run_until(10_000, |m| done_on_home(m, 1));
    let growths = 60u64;
    for g in 1..=growths {
        stages.push(stage(&format!("s{g}"), 1));
        let now = m.now;
        assert!(m.peers[1].grow(now, spec(stages.clone(), g as u32), Vec::new()));
        m.run_until(10_000, |m| done_on_home(m, g + 1));
    }
    // Every task's entry reaches the home once, give or take a resend;
    // each growth sent the whole log again before (1,891 entries here for
    // 61 tasks, the square of the farm's growths).
    let tasks = growths + 1;
    println!(
        "{} entries streamed to the home for {tasks} tasks",
        m.synced_to_home
    );
    assert!(
        m.synced_to_home <= 2 * tasks,
        "{} entries streamed to the home for {tasks} tasks",
        m.synced_to_home
    );
    let log = &m.peers[1].replica(FARM).expect("the home's copy").log;
    assert_eq!(log.done_count(), tasks);
}

#[test]
fn a_growth_lost_on_its_way_to_a_holder_is_sent_again_and_the_home_hears_it_durable() {
    // Three copies of every farm: the home's, the coordinator's and node
    // 3's, so no growth is durable before node 3 keeps it.
    let cfg = Config {
        replicas: 3,
        ..Config::default()
    };
    let mut m = Mesh::new(3, cfg);
    let mut stages = vec![stage("s0", 1)];
    let now = m.now;
    m.peers[1].submit(now, spec(stages.clone(), 0), Vec::new());
    m.run_until(10_000, |m| m.accepted == 1 && done_on_home(m, 1));
    for g in 1..=3u64 {
        stages.push(stage(&format!("s{g}"), 1));
        // The second growth never reaches node 3 the first time.
        if g == 2 {
            m.lose_growth_to = Some(NodeId(3));
        }
        let now = m.now;
        assert!(m.peers[1].grow(now, spec(stages.clone(), g as u32), Vec::new()));
        m.run_until(20_000, |m| m.accepted == g + 1);
        // Said durable only once node 3 keeps it too.
        let held = m.peers[2].replica(FARM).expect("node 3's copy");
        assert_eq!(held.spec.gen, g as u32, "growth {g} said durable");
        assert_eq!(m.lose_growth_to, None, "growth {g} was sent as a growth");
        m.run_until(10_000, |m| done_on_home(m, g + 1));
    }
    let held = m.peers[2].replica(FARM).expect("node 3's copy");
    assert_eq!(held.spec.def.stages.len(), 4);
}

#[test]
fn peers_that_keep_no_store_make_no_persist_and_run_a_farm_as_those_that_keep_one() {
    // The simulator's nodes that never restart keep no store: what they
    // do must be what a node that writes everything down does.
    let run = |store: bool| {
        let cfg = Config {
            replicas: 3,
            ..Config::default()
        };
        let mut m = Mesh::keeping(3, cfg, store);
        let mut stages = vec![stage("s0", 4)];
        let now = m.now;
        m.peers[1].submit(now, spec(stages.clone(), 0), Vec::new());
        m.run_until(10_000, |m| done_on_home(m, 4));
        for g in 1..=3u64 {
            stages.push(stage(&format!("s{g}"), 2));
            let now = m.now;
            assert!(m.peers[1].grow(now, spec(stages.clone(), g as u32), Vec::new()));
            m.run_until(20_000, |m| done_on_home(m, 4 + 2 * g));
        }
        m
    };
    let kept = run(true);
    let none = run(false);
    assert!(kept.persists > 0, "a node that keeps a store writes to it");
    assert_eq!(
        none.persists, 0,
        "a node that keeps none is asked to write nothing"
    );
    assert_eq!(kept.sent.len(), none.sent.len());
    for (a, b) in kept.sent.iter().zip(&none.sent) {
        assert_eq!(a, b, "the same messages, in the same order");
    }
    assert_eq!(kept.now, none.now);
    for (a, b) in kept.peers.iter().zip(&none.peers) {
        assert_eq!(a.progress(FARM), b.progress(FARM));
    }
}
