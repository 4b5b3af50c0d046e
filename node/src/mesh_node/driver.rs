//! The node's loop: `Node::open` sets the node up from its state folder, `Node::run` selects among its inputs; each step drains the peer's actions, persists first as one flushed batch, then carries out the rest (what the loop's handle brings is handled in `events.rs`).

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use libp2p::StreamProtocol;
use mesh_protocol::mesh::{Action, NodeId, Peer, PeerEvent};
use mesh_protocol::observe::Latency;
use mesh_protocol::wire::{DATA_PROTOCOL, PEER_PROTOCOL};
use mesh_store::{MeshState, SledStore, Store, StoreError};
use nix::sys::signal::Signal;
use tokio::net::UnixListener;
use tokio::sync::mpsc;

use super::home::{accept_control, serve_control};
use super::home::{Alloc, Home, HomeOut, Lent};
use super::net::{self, accept_links, NetOut, NetParts, Reach, REACH_TICK};
use super::runs::{self, accept_data, Runs, RunsOut, RunsParts, Transfers};
use super::source::MeshSource;
use super::{Cmd, Disk, LoopHandle, Net, Node, NodeError, NodeOptions, User};
use crate::control::{socket_path, Starting, CONTROL_PROTOCOL};
use crate::dash::{self, dashboard_line};
use crate::keys;
use crate::net::NetConfig;
use crate::task_words::describe_end;
use crate::{at_ms, grace_end, io_err, limits, sleep_until_opt, stop_signals};

/// A hard open-file limit that leaves room for fewer members than this is
/// told at start.
const FILES_TELL_BELOW: u64 = 1024;

/// How often the machine's load and memory are read for the beats.
const MEASURE_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// Lines about connections refused are said at most this often, each kind.
const THROTTLE: std::time::Duration = std::time::Duration::from_secs(10);

/// Most commands (ended tasks, fetches) handled as one step of the peer.
const CMDS_PER_STEP: usize = 256;

/// Commands waiting for the loop: a few steps' worth. When it is full a
/// sender waits (every sender is a spawned task, never the loop itself),
/// so a slow loop slows what feeds it instead of growing a queue; a task's
/// end is never dropped, as it holds its resources until the loop hears it.
pub(super) const CMDS_MAX: usize = 16 * CMDS_PER_STEP;

/// Runs the node until it is told to stop: set up by [`Node::open`], then [`Node::run`].
pub(super) async fn drive(opts: NodeOptions, out: Box<dyn FnMut(&str)>) -> Result<(), NodeError> {
    let (node, inputs) = Node::open(&opts, out).await?;
    node.run(inputs, &opts).await
}

/// What the loop selects among besides the swarm: its handle's other end,
/// the control socket, the signals that stop it and when it drains.
pub(super) struct Inputs {
    rx: mpsc::Receiver<Cmd>,
    listener: UnixListener,
    sock: PathBuf,
    sigint: tokio::signal::unix::Signal,
    sigterm: tokio::signal::unix::Signal,
    drain_at: Option<tokio::time::Instant>,
}

/// The network a node opens: its swarm, the streams it accepts, and the
/// line to say about its port when it could not keep the one it had.
struct Network {
    swarm: libp2p::Swarm<crate::net::Behaviour>,
    streams: libp2p_stream::Control,
    incoming: libp2p_stream::IncomingStreams,
    control_streams: libp2p_stream::IncomingStreams,
    data_streams: libp2p_stream::IncomingStreams,
    transfers: Arc<Transfers>,
    port_said: Option<String>,
}

/// What a node is made of, once opened: handed to [`Node::assemble`].
struct Parts<'a> {
    peer: Peer,
    me: NodeId,
    clock: Instant,
    handle: LoopHandle,
    store: SledStore,
    swarm: libp2p::Swarm<crate::net::Behaviour>,
    swim_cipher: chacha20poly1305::XChaCha20Poly1305,
    streams: libp2p_stream::Control,
    reach: Reach,
    transfers: Arc<Transfers>,
    out: Box<dyn FnMut(&str)>,
    files: limits::OpenFiles,
    psk: &'a keys::MeshKey,
}

impl Node {
    /// Sets the node up from its state folder: the store, the network, the
    /// control socket and the peer, restored to where it stopped.
    async fn open(
        opts: &NodeOptions,
        out: Box<dyn FnMut(&str)>,
    ) -> Result<(Node, Inputs), NodeError> {
        let (sigint, sigterm) = stop_signals()?;
        // Before any connection: a mesh of thousands must not meet a soft
        // limit nobody asked for (see `limits.rs`).
        let files =
            limits::raise_open_files().map_err(io_err("cannot read the open-file limit"))?;
        fs::create_dir_all(&opts.state)
            .map_err(io_err(format!("cannot create {}", opts.state.display())))?;
        let starting = Starting::mark(&opts.state);
        let psk = keys::load_psk(&opts.key)?;
        let identity = keys::load_or_create_identity(&opts.state)?;
        let me = keys::node_id(&identity.public().to_peer_id());
        let (store, db) = open_store(opts)?;
        let damaged = |source| NodeError::Damaged {
            path: db.display().to_string(),
            source,
        };
        let network = open_network(opts, &store, psk.clone(), identity).map_err(|e| match e {
            NodeError::Store(source) => damaged(source),
            e => e,
        })?;
        let (listener, sock) = control_socket(&opts.state)?;
        drop(starting);

        let (handle, rx) = LoopHandle::new(CMDS_MAX, me);
        let clock = Instant::now();
        let seed = u64::from_le_bytes(
            blake3::hash(&crate::state::unix_ms().to_le_bytes()).as_bytes()[..8]
                .try_into()
                .expect("8 bytes"),
        );
        let reach = Reach::load(&store, &opts.join, seed).map_err(damaged)?;
        // A node restarted on its state folder rejoins the mesh it was in, so
        // it first listens for that mesh's coordinator like a joining node.
        let mut peer = Peer::new(
            0,
            me,
            opts.resources.clone(),
            opts.config.clone(),
            seed,
            !opts.join.is_empty() || reach.remembers_any(),
        );
        if !opts.join.is_empty() {
            peer.joins_by_address();
        }
        tokio::spawn(accept_links(network.incoming, handle.clone()));
        tokio::spawn(accept_control(network.control_streams, handle.clone()));
        tokio::spawn(accept_data(network.data_streams, network.transfers.clone()));
        let parts = Parts {
            peer,
            me,
            clock,
            handle,
            store,
            swarm: network.swarm,
            swim_cipher: net::swim_cipher(&psk),
            streams: network.streams,
            reach,
            transfers: network.transfers,
            out,
            files,
            psk: &psk,
        };
        let mut node = Node::assemble(opts, parts);
        node.configure_peer(opts);
        node.restore().map_err(|e| match e {
            NodeError::Store(source) => damaged(source),
            e => e,
        })?;
        node.announce(opts, network.port_said, &psk).await?;
        let inputs = Inputs {
            rx,
            listener,
            sock,
            sigint,
            sigterm,
            drain_at: opts
                .drain_after
                .map(|d| tokio::time::Instant::from_std(clock + d)),
        };
        Ok((node, inputs))
    }

    /// The node, from its parts, with nothing running and no farm yet.
    fn assemble(opts: &NodeOptions, p: Parts<'_>) -> Node {
        let life = crate::state::unix_ms();
        let me_label = p.swarm.local_peer_id().to_string();
        Node {
            state: opts.state.clone(),
            peer: p.peer,
            me: p.me,
            life,
            clock: p.clock,
            handle: p.handle.clone(),
            disk: Disk {
                store: p.store,
                book: MeshState::default(),
                kept_count: std::cell::Cell::new(None),
            },
            net: Net::new(NetParts {
                swarm: p.swarm,
                streams: p.streams,
                swim_cipher: p.swim_cipher,
                reach: p.reach,
                me: p.me,
                life,
                handle: p.handle.clone(),
                files_limit: p.files.limit,
                throttle: limits::Throttle::new(THROTTLE),
            }),
            kept: super::kept::Kept::new(p.me, p.handle.clone()),
            runs: Runs::new(RunsParts {
                state: opts.state.clone(),
                me: p.me,
                me_label,
                handle: p.handle,
                transfers: p.transfers,
                gpu_ids: opts.gpus.iter().map(|g| g.id.clone()).collect(),
            }),
            home: Home::new(Alloc::new(
                std::path::absolute(&opts.key).unwrap_or_else(|_| opts.key.clone()),
                keys::mesh_tag(p.psk),
            )),
            user: User {
                out: p.out,
                files: p.files,
                files_told: false,
                impatient: false,
            },
        }
    }

    /// Tells the peer what this machine is and what it was started as.
    fn configure_peer(&mut self, opts: &NodeOptions) {
        self.peer.set_wall_base(crate::state::unix_ms());
        self.peer.set_files_max(self.user.files.limit);
        self.peer.set_gpus(
            opts.gpus
                .iter()
                .map(|g| (g.id.clone(), g.name.clone()))
                .collect(),
        );
        self.peer.set_batch_job(
            opts.alloc_job.clone(),
            opts.drain_after.map(|d| d.as_millis() as u64),
        );
        self.peer.observe();
    }

    /// Says what the person starting the node should know, and serves the
    /// dashboard when asked to.
    async fn announce(
        &mut self,
        opts: &NodeOptions,
        port_said: Option<String>,
        psk: &keys::MeshKey,
    ) -> Result<(), NodeError> {
        let files = self.user.files;
        if files.members() < FILES_TELL_BELOW {
            self.say(&format!(
                "the open-file limit is {} (the system's hard limit): enough for a mesh of about {} \
                 nodes; raise it (`ulimit -Hn`, or LimitNOFILE= in a systemd unit) for a bigger one",
                files.limit,
                files.members()
            ));
        }
        if let Some(line) = port_said {
            self.say(&line);
        }
        if self.net.remembers_any() {
            self.say("rejoining the mesh through the members this node remembers");
        }
        if let Some(addr) = opts.http {
            let dash_key = psk.to_string();
            let http =
                dash::Http::new(addr, Some(dash_key.as_bytes())).map_err(NodeError::Dashboard)?;
            let token = http.token.clone();
            let source = Arc::new(MeshSource {
                handle: self.handle.clone(),
            });
            let bound = dash::serve(http, source)
                .await
                .map_err(io_err(format!("cannot serve the dashboard on {addr}")))?;
            self.say(&dashboard_line(bound, token.as_deref()));
        }
        if let Some(d) = opts.drain_after {
            self.say(&format!(
                "this node drains in {} (before its walltime)",
                humantime::format_duration(std::time::Duration::from_secs(d.as_secs()))
            ));
        }
        Ok(())
    }

    /// The loop: one step of the peer, then whichever input is ready,
    /// until the node is stopped and has handed over what it must.
    async fn run(mut self, mut inputs: Inputs, opts: &NodeOptions) -> Result<(), NodeError> {
        // The join addresses until they answer, and remembered members that
        // are not members now (see `reach.rs`).
        let mut reach = tokio::time::interval(REACH_TICK);
        reach.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The machine's load and memory, for the beats the coordinator shows.
        let mut measure = tokio::time::interval(MEASURE_EVERY);
        measure.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut interrupted_at: Option<Instant> = None;
        let mut hard_killed = false;
        let node = &mut self;
        loop {
            node.step();
            if let Some(at) = interrupted_at {
                if node.runs.idle() && node.may_stop(at) {
                    break;
                }
            }
            let timer = node.peer.poll_timeout().map(|at| at_ms(node.clock, at));
            let grace = grace_end(interrupted_at, hard_killed);
            tokio::select! {
                ev = node.net.next_event() => {
                    let r = node.net.on_swarm(ev, opts, &node.peer);
                    node.net_acts();
                    r?;
                }
                Some(cmd) = inputs.rx.recv() => {
                    // Whatever else is ready joins this step: the tasks that
                    // ended meanwhile go to the coordinator as one report.
                    let mut cmds = vec![cmd];
                    while cmds.len() < CMDS_PER_STEP {
                        match inputs.rx.try_recv() {
                            Ok(cmd) => cmds.push(cmd),
                            Err(_) => break,
                        }
                    }
                    node.on_cmds(cmds);
                }
                // Followers of long logs, fed a part a turn (see `feed.rs`).
                _ = std::future::ready(()), if node.home.feeding() => {
                    node.at_home(|h, m| h.feed_more(m));
                }
                Ok((stream, _)) = inputs.listener.accept() => {
                    tokio::spawn(serve_control(stream, node.handle.clone()));
                }
                _ = sleep_until_opt(inputs.drain_at), if interrupted_at.is_none() => {
                    node.say("walltime near: draining");
                    node.interrupt(&mut interrupted_at);
                }
                _ = inputs.sigint.recv() => node.interrupt(&mut interrupted_at),
                _ = inputs.sigterm.recv() => node.interrupt(&mut interrupted_at),
                _ = sleep_until_opt(timer) => {
                    let now = node.now();
                    node.peer.handle_timeout(now);
                }
                _ = reach.tick() => {
                    node.net.reach_out(&node.peer);
                    node.net_acts();
                    node.at_home(|h, m| {
                        h.allocs.answer_waits(m);
                        h.beat_holds(m);
                    });
                }
                _ = measure.tick() => {
                    node.peer.set_machine(crate::observe::machine().as_load());
                }
                _ = sleep_until_opt(grace) => {
                    hard_killed = true;
                    node.runs.signal_all(Signal::SIGKILL);
                }
            }
        }
        self.disk.store.sync()?;
        let _ = fs::remove_file(&inputs.sock);
        Ok(())
    }
}

/// The node's store in its state folder, and where it is; its kept
/// outputs moved to where this version keeps them first.
fn open_store(opts: &NodeOptions) -> Result<(SledStore, PathBuf), NodeError> {
    let node_dir = opts.state.join("node");
    fs::create_dir_all(&node_dir)
        .map_err(io_err(format!("cannot create {}", node_dir.display())))?;
    let db = node_dir.join("db");
    crate::state::move_kept_outputs(&opts.state).map_err(io_err(
        "cannot move this node's kept outputs to their new folder",
    ))?;
    match SledStore::open(&db) {
        Err(StoreError::Locked { .. }) => Err(NodeError::Busy(opts.state.display().to_string())),
        Err(source) => Err(NodeError::Damaged {
            path: db.display().to_string(),
            source,
        }),
        Ok(store) => Ok((store, db)),
    }
}

/// The swarm on the port this node had (when it can), and the streams it
/// accepts: the peers' engines, control requests and data.
fn open_network(
    opts: &NodeOptions,
    store: &SledStore,
    psk: keys::MeshKey,
    identity: libp2p::identity::Keypair,
) -> Result<Network, NodeError> {
    let (listen, port_said) = net::reuse_port(store, &opts.listen)?;
    let mut net_cfg = NetConfig::new(listen, psk, identity);
    net_cfg.mdns = opts.mdns;
    let swarm = crate::net::build(net_cfg)?;
    let mut streams = swarm.behaviour().peer_streams.new_control();
    let incoming = streams
        .accept(StreamProtocol::new(PEER_PROTOCOL))
        .expect("the peer protocol is accepted once");
    let control_streams = streams
        .accept(StreamProtocol::new(CONTROL_PROTOCOL))
        .expect("the control protocol is accepted once");
    let transfers = Arc::new(Transfers::new(
        opts.state.clone(),
        opts.shared_fs || runs::shared_fs(&opts.state),
        streams.clone(),
    ));
    let data_streams = streams
        .accept(StreamProtocol::new(DATA_PROTOCOL))
        .expect("the data protocol is accepted once");
    Ok(Network {
        swarm,
        streams,
        incoming,
        control_streams,
        data_streams,
        transfers,
        port_said,
    })
}

/// The control socket: owner-only, and a stale one from a dead node is replaced.
fn control_socket(state: &Path) -> Result<(UnixListener, PathBuf), NodeError> {
    let sock = socket_path(state);
    let _ = fs::remove_file(&sock);
    let listener = UnixListener::bind(&sock)
        .map_err(io_err(format!("cannot listen on {}", sock.display())))?;
    fs::set_permissions(&sock, fs::Permissions::from_mode(0o600))
        .map_err(io_err(format!("cannot restrict {}", sock.display())))?;
    Ok((listener, sock))
}

impl Node {
    pub(super) fn now(&self) -> u64 {
        self.clock.elapsed().as_millis() as u64
    }

    pub(super) fn say(&mut self, line: &str) {
        (self.user.out)(line);
    }

    /// How users know node `n`: its peer id.
    pub(super) fn label_of(&self, n: NodeId) -> String {
        self.net.label_of(n, &self.peer)
    }

    /// Calls the home room with what it is lent, then hands the peer what
    /// it wants done.
    pub(super) fn at_home<R>(&mut self, f: impl FnOnce(&mut Home, &mut Lent<'_>) -> R) -> R {
        let mut lent = Lent {
            mesh: &self.peer,
            net: &self.net,
            runs: &mut self.runs,
            kept: &self.kept,
            disk: &mut self.disk,
            state: &self.state,
            handle: &self.handle,
            me: self.me,
        };
        let r = f(&mut self.home, &mut lent);
        self.home_acts();
        r
    }

    /// Carries out what the home room wants done, in its order.
    fn home_acts(&mut self) {
        while let Some(o) = self.home.poll() {
            let now = self.now();
            match o {
                HomeOut::Submit(spec, reused) => self.peer.submit(now, spec, reused),
                HomeOut::Grow(spec, reused) => {
                    let farm = spec.id;
                    let grew = self.peer.grow(now, spec, reused);
                    debug_assert!(grew, "the home offers only a farm's next generation");
                    self.at_home(|h, m| h.refresh_view(m, farm));
                }
                HomeOut::Cancel(farm) => self.peer.cancel(now, farm),
                HomeOut::CancelTask(farm, task) => self.peer.cancel_task(now, farm, task),
                HomeOut::TakeHome { spec, out, reply } => {
                    let farm = spec.id;
                    self.peer.take_home(now, spec, out);
                    self.at_home(|h, m| h.resumed(m, farm, false, reply));
                }
                HomeOut::Alloc(cmd) => self.peer.alloc_command(now, cmd),
            }
        }
    }

    /// Tells the peer of the attempts the runs room ended without a process.
    fn runs_acts(&mut self) {
        while let Some(o) = self.runs.poll() {
            match o {
                RunsOut::Ended(task, outcome) => {
                    let now = self.now();
                    self.peer.task_finished(now, task, outcome, Vec::new());
                }
            }
        }
    }

    /// Has the peer ask about every farm this node keeps outputs of (see
    /// `Peer::restore_kept`): at start, and on following a new coordinator.
    pub(super) fn ask_about_kept(&mut self) {
        self.peer
            .restore_kept(runs::kept_farms(&self.state).into_iter().map(|(f, _)| f));
    }

    /// Carries out what the net room wants done, in its order.
    fn net_acts(&mut self) {
        while let Some(o) = self.net.poll() {
            let now = self.now();
            match o {
                NetOut::Say(line) => self.say(&line),
                NetOut::Keep { write, what } => {
                    if let Err(e) = self.disk.write_flushed(vec![write]) {
                        tracing::warn!("cannot keep {what}: {e}");
                    }
                }
                NetOut::Introduce { node, label, addrs } => {
                    self.peer.introduce(now, node, label, addrs)
                }
                NetOut::SeedReached(node) => self.peer.seed_reached(now, node),
                NetOut::Rtt(us) => self.peer.record_latency(Latency::MessageRtt, us),
                NetOut::Address { label, addrs } => {
                    self.peer.set_address(now, label, addrs, self.life)
                }
                NetOut::Request(req, channel) => self.on_request(req, channel),
            }
        }
    }

    /// Reloads the farms kept in the store: this node's own submissions go
    /// to the coordinator again, with what is known done.
    fn restore(&mut self) -> Result<(), NodeError> {
        let (book, farms, held) = MeshState::load(&self.disk.store)?;
        self.disk.book = book;
        for (stored, finished) in farms {
            let spec = stored.spec.clone();
            if spec.origin == self.me {
                self.runs.serve_inputs(&spec);
                self.home.restored(&spec);
            }
            self.peer.restore_farm(stored, finished);
            if spec.origin == self.me {
                self.at_home(|h, m| h.refresh_view(m, spec.id));
            }
        }
        self.peer.restore_unacked(held);
        self.ask_about_kept();
        self.runs.serve_home_outputs(&self.peer);
        match MeshState::load_allocs(&self.disk.store) {
            Ok(Some(book)) => self.peer.restore_allocs(book),
            Ok(None) => {}
            // A book an older mesh wrote, of another shape: the coordinator's
            // comes with its beats, and its jobs are found again by listing
            // the batch systems' (see `Allocs::listed`).
            Err(e) => self.say(&format!(
                "the allocation queues kept here could not be read ({e}); \
                 the coordinator's copy is taken"
            )),
        }
        Ok(())
    }

    /// Drains the peer's actions: persists first, as one flushed batch, then the rest in order.
    fn step(&mut self) {
        self.runs.start_ready(&self.peer);
        self.runs_acts();
        loop {
            let mut batch = Vec::new();
            let mut acts = Vec::new();
            for _ in 0..4096 {
                let Some(a) = self.peer.poll_action() else {
                    break;
                };
                match a {
                    Action::Persist(p) => self.disk.book.writes(p, &mut batch),
                    other => acts.push(other),
                }
            }
            if batch.is_empty() && acts.is_empty() {
                return;
            }
            if !batch.is_empty() {
                let r = self.disk.write_flushed(batch);
                if let Err(e) = r {
                    // Acting on what is not durable would break the
                    // promises the peer makes; stop here.
                    tracing::error!("state store failed: {e}");
                    eprintln!("mesh node: state store failed: {e}");
                    std::process::exit(1);
                }
            }
            for a in acts {
                self.act(a);
                self.runs_acts();
            }
        }
    }

    fn act(&mut self, a: Action) {
        match a {
            Action::Persist(_) => unreachable!("persists are written before acting"),
            Action::Send { to, msg } => self.net.send_msg(to, msg, &self.peer),
            Action::Swim { to, data } => self.net.swim(to.id, to.at.addrs(), data, &self.peer),
            // Never asked for here (`Config::quiet_swim` is the
            // simulator's); built and sent as any packet.
            Action::QuietSwim(q) => {
                let data = self.peer.quiet_packet(&q);
                self.net.swim(q.to.id, q.to.at.addrs(), data, &self.peer)
            }
            Action::Start { task, grant } => self.runs.start(task, grant, &self.peer),
            Action::Kill { task, reason } => self.runs.kill(task, reason),
            Action::Fetch {
                farm,
                task,
                from,
                outputs,
            } => self
                .runs
                .fetch_outputs(farm, task, from, outputs, &self.peer),
            Action::Forget { farm } => {
                self.disk.kept_count.set(None);
                // What it kept for the home, and its own folder for the
                // farm (the dependencies put there, the inputs).
                let held = crate::state::kept_dir(&self.state, farm);
                let work = self.state.join("work").join(farm.to_string());
                tokio::task::spawn_blocking(move || {
                    let _ = fs::remove_dir_all(held);
                    let _ = fs::remove_dir_all(work);
                });
            }
            Action::FetchInputs { farm } => self.runs.fetch_inputs(farm, &self.peer),
            Action::Batch(op) => self.at_home(|h, m| h.allocs.batch(m, op)),
            Action::Emit(ev) => self.emit(ev),
        }
    }

    fn emit(&mut self, ev: PeerEvent) {
        match ev {
            PeerEvent::MemberUp(n) => {
                let label = self.label_of(n);
                self.say(&format!("mesh node {label} joined"));
                self.net.member_seen(&self.peer);
                self.net_acts();
                let size = self.peer.member_count() + 1;
                if !self.user.files_told && self.user.files.short_for(size) {
                    self.user.files_told = true;
                    self.say(&format!(
                        "this mesh has {size} nodes, more than this node's open-file limit ({}) \
                         leaves room for if it must talk to all at once (as a coordinator, or a \
                         home fetching outputs, may): raise it (`ulimit -Hn`, or LimitNOFILE= in \
                         a systemd unit)",
                        self.user.files.limit
                    ));
                }
            }
            PeerEvent::MemberDown(n) => {
                self.net.forget(n);
                let label = self.label_of(n);
                self.say(&format!(
                    "mesh node {label} is gone; its tasks run elsewhere"
                ));
                self.home.member_gone(label);
            }
            PeerEvent::Coordinator { term, node } => {
                let label = self.label_of(node);
                let round = mesh_protocol::mesh::term_round(term);
                self.say(&format!("coordinator is {label} (term {round})"));
                // A new coordinator may mean this node was cut off from the
                // mesh (a partition that healed) and missed the end of a
                // farm whose outputs it keeps: it asks again.
                self.ask_about_kept();
            }
            PeerEvent::Accepted { farm, tasks } => self.home.accepted(farm, tasks),
            PeerEvent::Refused { farm, reason } => self.home.refused(farm, reason),
            PeerEvent::Progress(farm) => self.at_home(|h, m| h.refresh_view(m, farm)),
            PeerEvent::Silent { ms, released } => self.say(&format!(
                "this node was silent for {ms} ms (stopped or starved): the mesh may have \
                 declared it dead, so its {released} queued tasks go back to the coordinator"
            )),
            PeerEvent::Failure(f) => {
                // An attempt that will be retried: said in the node's output;
                // failures for good are in the farm's replicated state.
                let label = self.label_of(f.node);
                let name = self
                    .peer
                    .spec(f.farm)
                    .map(|s| s.def.task_name(f.task))
                    .unwrap_or_default();
                let what = describe_end(&f.end);
                self.say(&format!(
                    "{name} (attempt {} on {label}): {what}, will retry",
                    f.attempt
                ));
            }
            PeerEvent::Unplaceable { farm, .. } => self.at_home(|h, m| h.refresh_view(m, farm)),
        }
    }

    fn interrupt(&mut self, at: &mut Option<Instant>) {
        if at.is_some() {
            // Asked twice: stop now, whatever is left to hand over.
            self.user.impatient = true;
            self.runs.signal_all(Signal::SIGKILL);
            return;
        }
        *at = Some(Instant::now());
        self.say("stopping: tasks here are stopped and handed back");
        let now = self.now();
        self.peer.interrupt(now);
    }

    /// Whether a stopping node whose tasks are over may go: once the
    /// coordinator has acknowledged its results and the home has stopped
    /// fetching outputs from it (or after `Config::linger_max_ms`), at once when it is
    /// alone. A batch job's node
    /// never comes back for them: leaving earlier would run those tasks again.
    fn may_stop(&self, since: Instant) -> bool {
        let now = Instant::now();
        let cfg = self.peer.config();
        let (linger_max, quiet) = (
            Duration::from_millis(cfg.linger_max_ms),
            Duration::from_millis(cfg.linger_quiet_ms),
        );
        if self.user.impatient || now >= since + linger_max {
            return true;
        }
        // Alone in its mesh (a notebook's `mesh.local()`): no home will
        // come to fetch from it, and no node can take what is queued here
        // (it stays queued in the farm, for this node's next start).
        if self.peer.member_count() == 0 && self.peer.reported() {
            return true;
        }
        let last = self
            .runs
            .transfers()
            .quiet_since()
            .map_or(since, |t| t.max(since));
        self.peer.idle() && now >= last + quiet
    }
}
