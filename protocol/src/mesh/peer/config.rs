//! Knobs of the mesh protocol, with defaults that suit a LAN.

/// Knobs of the mesh protocol; the defaults suit a LAN.
#[derive(Clone, Debug)]
pub struct Config {
    /// How often a node looks at its members, its election and its
    /// thefts; and how often the node next in line to coordinate reports
    /// to the coordinator, so that its death is found fast at any size.
    pub heartbeat_ms: u64,
    /// How often any other worker reports to its coordinator in a mesh of
    /// up to 10 nodes; twice this past 10 (Dask's workers beat every
    /// 0.5 s up to 10, every second past that). Three of a worker's
    /// intervals, at least `dead_after_ms`, are the silence that makes it
    /// dead, so a live worker is not missed.
    pub report_ms: u64,
    /// The coordinator hears at most about this many reports a second:
    /// past `reports_per_s * 2 * report_ms / 1000` nodes, each reports
    /// less often than every two `report_ms`.
    pub reports_per_s: u64,
    /// A member silent this long is dead: its tasks run elsewhere.
    pub dead_after_ms: u64,
    /// A node that joins an existing mesh waits this long to hear the
    /// coordinator before it may elect itself.
    pub join_wait_ms: u64,
    /// Take unstarted tasks from overloaded peers when this node runs dry.
    pub steal: bool,
    /// `None` (the default): each node asks for as many queued tasks as
    /// cover a round trip to the coordinator at the rate it runs them (see
    /// the `pace` module). `Some(p)`: the fixed rule instead, a node is
    /// handed tasks until its claimed resources reach `p`% of its capacity
    /// (and always one task beyond a full node).
    pub prefetch_percent: Option<u64>,
    /// Most tasks one node may hold claimed (queued or running) at once;
    /// `None`: twice its cpus plus two. Raised together with
    /// `prefetch_percent`, it places work badly on purpose (the simulator's
    /// skew scenarios: everything on the first node, the rest must steal).
    pub node_claims_max: Option<usize>,
    /// Most tasks in one assignment, report or steal.
    pub batch_max: usize,
    /// Most tasks a node queues (not yet started) at once.
    pub queue_max: usize,
    /// Unacknowledged reports, submissions and replications are sent again this often.
    pub resend_ms: u64,
    /// The coordinator tells submitters about progress this often.
    pub progress_ms: u64,
    /// A steal with no answer after this long is given up.
    pub steal_timeout_ms: u64,
    /// A farm's state (definition, done set, where outputs are) is durable
    /// on this many nodes before anything about it is acknowledged (fewer
    /// only while the mesh has fewer nodes).
    pub replicas: usize,
    /// The home waits this long for a node that keeps outputs it misses to
    /// come back; then those tasks run again elsewhere.
    pub outputs_wait_ms: u64,
    /// How long a message to a node this one has no connection to may take
    /// to arrive: the connection and its handshakes, which take seconds on
    /// a loaded machine (the node's driver gives up after this). An idle
    /// worker's beat stands for an empty `Claimed`, and an idle worker
    /// keeps no connection to its coordinator: a claim younger than this
    /// may be in an `Assign` still on its way, not lost.
    pub connect_ms: u64,
    /// A node that stops (interrupted, or a batch job's at its drain)
    /// stays, once nothing runs on it, at most this long for its results
    /// to be acknowledged and its outputs fetched by their home: leaving
    /// at once lost outputs that the home then waits `outputs_wait_ms`
    /// for, and runs again.
    pub linger_max_ms: u64,
    /// ... and goes earlier, once it has sent no file for this long (the
    /// home has them all).
    pub linger_quiet_ms: u64,
    /// Wake for SWIM's gossip tick even when it has nothing to tell.
    /// Off, such a tick is fired at the node's next wake or input instead
    /// (it sends nothing and only sets the next tick, on the same phase),
    /// so a quiet node is not woken five times a second for nothing. On
    /// is the simulator's stepping mode, against which its skipping is
    /// checked: both must give the same run.
    pub step_upkeep: bool,
    /// SWIM's pings and acks that carry nothing but themselves are not
    /// built: each is handed to the driver in closed form
    /// ([`Action::QuietSwim`](super::Action::QuietSwim)), and the node it
    /// reaches takes it so ([`Peer::handle_quiet_swim`](super::Peer::handle_quiet_swim)),
    /// leaving both nodes as the packet would. The simulator's skipping
    /// mode; a node that sends packets leaves it off (it would build each
    /// anyway).
    pub quiet_swim: bool,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            heartbeat_ms: 250,
            report_ms: 500,
            reports_per_s: 200,
            dead_after_ms: 2000,
            join_wait_ms: 1500,
            steal: true,
            prefetch_percent: None,
            node_claims_max: None,
            batch_max: 256,
            queue_max: 4096,
            resend_ms: 1000,
            progress_ms: 200,
            steal_timeout_ms: 1000,
            replicas: 2,
            outputs_wait_ms: 30_000,
            connect_ms: 10_000,
            linger_max_ms: 10_000,
            linger_quiet_ms: 2_000,
            step_upkeep: false,
            quiet_swim: false,
        }
    }
}
