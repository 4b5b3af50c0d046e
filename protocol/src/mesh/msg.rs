//! The messages peers exchange, as the engine sees them.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::alloc::book::{AllocBook, AllocCmd};
use crate::engine::{Counts, Order, Stop, TaskEnd, TaskResult, Usage, Verdict};
use crate::farm::{FarmDef, StageDef};
use crate::ids::TaskRef;
pub use crate::ids::{FarmId, NodeId};
use crate::resources::Resources;

/// Which node is a farm's home (where its outputs go), and since which
/// claim: a node that takes a farm over (`mesh resume FARM --out DIR`)
/// claims it with a higher epoch, and the highest claim wins everywhere.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Home {
    /// Which claim this is: 0 for the submitter's, one more at each takeover.
    pub epoch: u64,
    /// The node that is the home.
    pub node: NodeId,
}

/// A farm as it travels: the definition, who submitted it, and the hashes
/// of its input files (the submitter serves them by hash).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FarmSpec {
    /// Which farm this is, as every node names it.
    pub id: FarmId,
    /// The node that submitted it, its first home.
    pub origin: NodeId,
    /// What the farm file said: stages, sweeps and templates. Shared: the
    /// coordinator's engine runs the generation it holds, not a copy of
    /// it (a copy of an open farm grown by thousands of batches is a
    /// handle per stage, made and dropped with each batch).
    pub def: Arc<FarmDef>,
    /// Its input files, each by hash.
    pub inputs: Vec<InputFile>,
    /// When its submitter made it, in ms since the Unix epoch by the
    /// submitter's clock (0: not known): of the farms a name matches, a
    /// command that names one means the newest.
    pub submitted_ms: u64,
    /// Which generation of the farm this is, from 0: an open farm grows
    /// by generations, each the one before with stages added at the end
    /// (see [`FarmSpec::grows_into`]). Of two copies, the higher wins.
    pub gen: u32,
    /// More stages may still come: the farm is not over when its tasks
    /// are, until a generation that closes it.
    pub open: bool,
}

impl FarmSpec {
    /// Whether `next` may replace this generation: a later one, of the
    /// same farm, whose stages begin with these unchanged (so every
    /// task, log entry and claim of this one means the same there).
    pub fn grows_into(&self, next: &FarmSpec) -> bool {
        next.id == self.id
            && next.gen > self.gen
            && next.def.stages.len() >= self.def.stages.len()
            // A copy of this generation shares its stages: one compared by
            // value is a copy from elsewhere (a holder's, a message's).
            && crate::farm::stages_start(&self.def.stages, &next.def.stages)
    }
}

/// How much of a farm's spec a node holds: its generation, and how many
/// stages and input files that generation has. Stages and inputs are only
/// ever added at the end, so this says which ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpecHeld {
    /// The generation.
    pub gen: u32,
    /// How many stages it has.
    pub stages: u32,
    /// How many input files it has.
    pub inputs: u32,
}

impl SpecHeld {
    /// What `spec` is.
    pub fn of(spec: &FarmSpec) -> SpecHeld {
        SpecHeld {
            gen: spec.gen,
            stages: spec.def.stages.len() as u32,
            inputs: spec.inputs.len() as u32,
        }
    }
}

/// A later generation of an open farm's spec as what it adds to an
/// earlier one: sent to a node that holds the earlier one, and written so
/// by the store, its cost that of what was added, not of the farm.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Growth {
    /// Which farm grew.
    pub farm: FarmId,
    /// The generation it grows, as the node it is for holds it.
    pub after: SpecHeld,
    /// The generation it makes.
    pub gen: u32,
    /// Whether that generation is open.
    pub open: bool,
    /// The stages past `after.stages`.
    pub stages: Vec<Arc<StageDef>>,
    /// The input files past `after.inputs`.
    pub inputs: Vec<InputFile>,
}

impl Growth {
    /// What `next` adds to a spec of its farm held as `after`; `None` when
    /// `next` is no later generation with at least as much.
    pub fn since(after: SpecHeld, next: &FarmSpec) -> Option<Growth> {
        let (stages, inputs) = (after.stages as usize, after.inputs as usize);
        (next.gen > after.gen && next.def.stages.len() >= stages && next.inputs.len() >= inputs)
            .then(|| Growth {
                farm: next.id,
                after,
                gen: next.gen,
                open: next.open,
                stages: crate::farm::stages_from(&next.def.stages, stages)
                    .cloned()
                    .collect(),
                inputs: next.inputs[inputs..].to_vec(),
            })
    }

    /// `was` grown by this, when `was` is what it grows.
    pub fn apply(&self, was: &FarmSpec) -> Option<FarmSpec> {
        if was.id != self.farm || SpecHeld::of(was) != self.after {
            return None;
        }
        let mut next = was.clone();
        let def = Arc::make_mut(&mut next.def);
        def.stages.extend(self.stages.iter().cloned());
        // The graph of the generation before describes fewer stages: the
        // next one's is built on it.
        def.graph = crate::farm::graph::GraphCache::after(&was.def.graph);
        next.inputs.extend(self.inputs.iter().cloned());
        next.gen = self.gen;
        next.open = self.open;
        Some(next)
    }
}

impl AsRef<FarmDef> for FarmSpec {
    fn as_ref(&self) -> &FarmDef {
        &self.def
    }
}

/// One input file of a farm, as its submitter serves it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputFile {
    /// Relative to the farm's root, as the task names it.
    pub path: String,
    /// Its blake3 hash: the submitter serves it by this.
    pub hash: [u8; 32],
    /// Its permission bits (`0o7777`), which travel with it: a staged
    /// `./wrapper.sh` must stay executable on every node. 0: not known.
    pub mode: u32,
}

/// A node as membership knows it: its id, which life of it (a restart,
/// or a rejoin after it was declared dead, is a new one), and where it is
/// reached. Carried in every membership packet, and held once per member
/// by every node: a mesh of N nodes holds N², and the simulator holds
/// them all in one process. So an identity is one pointer to its parts,
/// shared by every copy in the thread: decoding one looks it up among
/// those alive (`intern`) rather than allocating it again.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Ident(Arc<Who>);

/// What an [`Ident`] says.
#[derive(Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Who {
    /// Which node.
    pub id: NodeId,
    /// Which life of the node: a restart, or a rejoin after it was declared
    /// dead, is a later one.
    pub life: u64,
    /// Set by the driver, opaque to the protocol.
    pub at: Address,
}

impl Ident {
    /// The identity of life `life` of node `id`, known as `label`, reached at `addrs`.
    pub fn new(id: NodeId, life: u64, label: String, addrs: Vec<String>) -> Ident {
        Ident::of(Who {
            id,
            life,
            at: Address::new(label, addrs),
        })
    }

    /// The next life of this node, at the same address.
    pub fn next_life(&self) -> Ident {
        Ident::of(Who {
            id: self.id,
            life: self.life + 1,
            at: self.at.clone(),
        })
    }

    fn of(who: Who) -> Ident {
        intern(who)
    }
}

impl std::ops::Deref for Ident {
    type Target = Who;

    fn deref(&self) -> &Who {
        &self.0
    }
}

impl std::fmt::Debug for Ident {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl Serialize for Ident {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

impl<'de> Deserialize<'de> for Ident {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Ident, D::Error> {
        Ok(Ident::of(Who::deserialize(d)?))
    }
}

/// The identities alive in this thread, by what they say: what a member
/// costs a node is a pointer, not a copy, even when every node of a
/// simulated mesh decodes its own. Per thread, so decoding one (a dozen
/// times per member per node while a mesh forms) takes no lock; a node
/// whose runtime moves between threads shares a little less. Entries whose
/// identity is gone are swept once the table has doubled since the last
/// sweep.
#[derive(Default)]
struct Interned {
    live: std::collections::HashMap<Arc<Who>, (), rustc_hash::FxBuildHasher>,
    swept_at: usize,
}

thread_local! {
    static INTERNED: std::cell::RefCell<Interned> = std::cell::RefCell::default();
}

fn intern(who: Who) -> Ident {
    INTERNED.with_borrow_mut(|t| {
        if let Some((arc, ())) = t.live.get_key_value(&who) {
            return Ident(arc.clone());
        }
        if t.live.len() >= 2 * t.swept_at.max(512) {
            // Held only here: no member, message or node has it any more.
            t.live.retain(|who, ()| Arc::strong_count(who) > 1);
            t.swept_at = t.live.len();
        }
        let arc = Arc::new(who);
        t.live.insert(arc.clone(), ());
        Ident(arc)
    })
}

/// Where a node is reached: its label (the peer id) and the addresses to
/// dial it at. Encoded as the two fields themselves; decoded, an empty
/// one (every simulated node's) is one shared value, not an allocation
/// per member per node.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Address(Arc<Place>);

#[derive(Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
struct Place {
    label: String,
    addrs: Vec<String>,
}

static NOWHERE: std::sync::LazyLock<Address> =
    std::sync::LazyLock::new(|| Address(Arc::new(Place::default())));

impl Address {
    /// A label and the addresses to dial; both empty make the one shared empty
    /// address (a simulated node's).
    pub fn new(label: String, addrs: Vec<String>) -> Address {
        if label.is_empty() && addrs.is_empty() {
            return NOWHERE.clone();
        }
        Address(Arc::new(Place { label, addrs }))
    }

    /// How the node is known on the network (its peer id).
    pub fn label(&self) -> &str {
        &self.0.label
    }

    /// The addresses to dial it at.
    pub fn addrs(&self) -> &[String] {
        &self.0.addrs
    }
}

impl Serialize for Address {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

impl<'de> Deserialize<'de> for Address {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Address, D::Error> {
        let p = Place::deserialize(d)?;
        Ok(Address::new(p.label, p.addrs))
    }
}

/// A member that the coordinator says has tasks queued: a thief's victim.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Victim {
    /// The member with tasks queued.
    pub node: NodeId,
    /// How many tasks it has queued, as its last beat said.
    pub queued: u32,
    /// Its prefetch depth: queued beyond this, it is overloaded.
    pub prefetch: u32,
}

/// What a node tells its coordinator about itself (its report, every
/// `Beat::interval_ms`), and what the coordinator answers: whom it
/// follows, its backlog, the victims to steal from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Beat {
    /// The sender's [`PROTOCOL_VERSION`](crate::wire::PROTOCOL_VERSION): a
    /// beat of another version is ignored.
    pub version: u32,
    /// How the node is known on the network (its peer id) and where to reach it;
    /// set by the driver, opaque to the protocol.
    pub label: String,
    /// The addresses to dial it at (see `label`).
    pub addrs: Vec<String>,
    /// The highest coordinator term this node knows, and who holds it.
    pub term: u64,
    /// Who holds that term, when the node knows.
    pub coordinator: Option<NodeId>,
    /// The resources the node offers its tasks. Shared, as `used`,
    /// `started` and `victims` are: a node beats several times a second
    /// with the same values, built once and counted, not copied, into
    /// each beat (the wire carries them as plain values).
    pub total: Arc<Resources>,
    /// Resources held by running tasks.
    pub used: Arc<Resources>,
    /// Tasks assigned here and not started: what a thief may take.
    pub queued: u32,
    /// Tasks running on it now.
    pub running: u32,
    /// Of those, how many of each farm's stage, at most [`STARTED_MAX`]
    /// stages (the most started first): the coordinator tells a farm's
    /// tasks running from those only sent ahead (`Counts::queued_on_nodes`).
    pub started: Arc<[Started]>,
    /// On the coordinator: tasks ready and not yet handed to anyone.
    pub backlog: u64,
    /// How many tasks this node wants queued beyond what it runs (its
    /// prefetch depth, see `Peer::prefetch_depth`).
    pub prefetch: u32,
    /// The batch job that started this node (`mesh alloc`), if one did.
    pub job: Option<String>,
    /// How long until this node drains before its walltime, if it has one.
    pub ends_in_ms: Option<u64>,
    /// The version of the allocation book this node holds.
    pub allocs: (u64, u64),
    /// The sender wants this node's beat back (a report to the
    /// coordinator, or a question to whom it follows); an answer never asks.
    pub ask: bool,
    /// From the coordinator: how often each node reports to it (the
    /// interval stretches with the mesh, so it hears a bounded number of
    /// beats a second).
    pub interval_ms: u64,
    /// From the coordinator: the members with the most tasks queued.
    pub victims: Arc<[Victim]>,
    /// A digest of the members the sender's SWIM has alive (itself
    /// included): a worker whose digest stays unlike its coordinator's
    /// asks for its roster (see `Roster`).
    pub roster: u64,
    /// The sender's local health (Lifeguard's score: 0 is healthy, up to
    /// 8 for a node that cannot keep up, e.g. starved of CPU).
    pub health: u32,
    /// Cores and GPUs of the tasks queued on the sender that cannot start
    /// within a minute there: the coordinator's allocation queues count
    /// them with the work no node has claimed.
    pub late_cores: u32,
    /// See `late_cores`: the GPUs of those tasks.
    pub late_gpus: u32,
    /// The sender's open-file limit (0: not known): a node whose limit is
    /// lower than the mesh is large cannot talk to every member at once,
    /// as a coordinator or a home fetching outputs may (`mesh status`
    /// says so).
    pub files_max: u64,
    /// The sender holds no task: nothing queued, running, waiting for its
    /// farm, or reported and not yet acknowledged. Its beats then stand
    /// for the empty list of claims (`claimed`): an idle mesh's workers
    /// send their coordinator nothing but beats, which go as packets, so
    /// it keeps no connection open to them.
    pub idle: bool,
    /// In a worker's report to the coordinator it follows, where its
    /// reports come at least as often as its resend round (every second:
    /// up to 200 nodes): every task it holds (queued, running, waiting for
    /// its farm, reported and not yet acknowledged), as a [`Msg::Claimed`]
    /// lists them, so claims whose `Assign` or `Stolen` was lost go back to
    /// the queue. Past that, the round sends them as `Claimed`. Empty in
    /// every other beat.
    pub claimed: Vec<Assigned>,
    /// The sender's clock as it built this beat. A coordinator's tells its
    /// workers how late an assignment of its they can speak for (`seen`).
    pub clock: u64,
    /// The latest `clock` of its coordinator's beats the sender has heard,
    /// in the term it follows (0: none yet). What `idle` says of the
    /// tasks it holds is news of every assignment sent before then, and
    /// of none after: the coordinator drops no younger claim for it (a
    /// beat that waited in a swamped coordinator's queue behind
    /// assignments would otherwise take their tasks away from a node
    /// running them, and run them twice).
    pub seen: u64,
    /// The sender's GPUs: how its tasks name each (`CUDA_VISIBLE_DEVICES`)
    /// and its model where the driver says, in the order of its pool.
    pub gpus: Vec<(String, String)>,
    /// The sender's machine, as its driver last measured it: shown in
    /// `mesh status` and the dashboard, which the coordinator answers.
    pub machine: Option<MachineLoad>,
}

/// The most stages a beat tells its running tasks of (`Beat::started`),
/// so that a beat stays a packet: a node running tasks of more stages
/// than this has the rest shown as queued on it.
pub const STARTED_MAX: usize = 64;

/// How many tasks of a farm's stage run on a node (see `Beat::started`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Started {
    /// Which farm.
    pub farm: FarmId,
    /// Which of its stages, by position.
    pub stage: u32,
    /// How many of its tasks run there now.
    pub tasks: u32,
}

/// A machine's load and memory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MachineLoad {
    /// The one-minute load average, in hundredths.
    pub load_centi: u32,
    /// Its cores, all of them (the node may offer fewer).
    pub cpus: u32,
    /// Memory in use, in bytes.
    pub mem_used: u64,
    /// All its memory, in bytes.
    pub mem_total: u64,
    /// How it measures what its tasks use.
    pub measure: Measure,
}

/// How a node measures what its tasks use (see the node's `usage.rs` and
/// `cgroup.rs`), for `mesh status --nodes`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Measure {
    /// Each task's process tree, sampled from `/proc`, and its leader's
    /// counts once it exited.
    #[default]
    Proc,
    /// A cgroup v1 group (`memory`, `cpuacct`) of its own per task.
    CgroupV1,
    /// Not at all (`MESH_MEASURE=0`).
    Off,
}

impl Measure {
    /// In a word, for `mesh status --nodes`'s table.
    pub fn word(self) -> &'static str {
        match self {
            Measure::Proc => "/proc",
            Measure::CgroupV1 => "cgroup v1",
            Measure::Off => "off",
        }
    }

    /// In words, for `mesh status --nodes`.
    pub fn words(self) -> &'static str {
        match self {
            Measure::Proc => "/proc (each task's process tree, sampled)",
            Measure::CgroupV1 => "cgroup v1 (a memory and cpuacct group per task)",
            Measure::Off => "off (MESH_MEASURE=0)",
        }
    }
}

/// A member in a roster: as SWIM knows it, with its incarnation and
/// whether it is alive or suspect.
pub type RosterEntry = foca::Member<Ident>;

/// A roster exchange, memberlist's push-pull: SWIM's gossip may miss a
/// member (a join told while hundreds of nodes start at once, packets
/// lost), and a node that missed one would hear of it only by chance.
/// A joining node asks the node it joins through; a worker whose digest
/// of the members stays unlike its coordinator's asks the coordinator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RosterKind {
    /// Here is my digest: your roster, if yours differs.
    Ask,
    /// My roster; yours back if ours still differ once you have merged it.
    Answer,
    /// My roster, nothing back.
    Last,
}

/// One task handed to a node to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Assigned {
    /// Which farm the task is of.
    pub farm: FarmId,
    /// Which task of the farm.
    pub task: TaskRef,
    /// Which try of the task this is, counting from 1: a report of an older
    /// one is ignored.
    pub attempt: u32,
}

/// One output file of a finished task, as the node that ran it keeps it
/// (content-addressed) until the farm's home has it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct OutputFile {
    /// Relative to the task's output folder.
    pub path: String,
    /// Its blake3 hash, by which the node keeps it and the home fetches it.
    pub hash: [u8; 32],
    /// Its size in bytes.
    pub size: u64,
    /// Its permission bits, as for [`InputFile::mode`].
    pub mode: u32,
    /// Its bytes, for a small value the task handed back instead of
    /// writing a file (a Python call's): they ride with the report and
    /// the log, and are a file only where a task that reads them runs.
    pub data: Option<Box<[u8]>>,
}

impl OutputFile {
    /// Whether its bytes ride with the log, so there is no file to bring home.
    pub fn rides(&self) -> bool {
        self.data.is_some()
    }
}

/// Whether a task that left `outputs` has files for its home to bring:
/// none, or all riding with the log, is nothing to bring.
pub fn files_to_bring(outputs: &[OutputFile]) -> bool {
    outputs.iter().any(|o| !o.rides())
}

/// One run of a task: which node ran which attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TaskRun {
    /// Which task ran.
    pub task: TaskRef,
    /// The node that ran it.
    pub node: NodeId,
    /// Which try of the task that run was.
    pub attempt: u32,
}

/// How a task's attempt ended on the node that ran it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Report {
    /// Which attempt of which task ended.
    pub task: Assigned,
    /// How it ended, as the node saw it.
    pub result: TaskResult,
    /// The attempt's content key, when its node had one.
    pub key: Option<[u8; 32]>,
    /// How long it ran, in ms.
    pub duration_ms: u64,
    /// See [`crate::engine::Outcome::ended_ms`].
    pub ended_ms: u64,
    /// See [`crate::engine::Outcome::grew`].
    pub grew: Option<u32>,
    /// The outputs of a successful attempt, kept on the node that ran it.
    pub outputs: Vec<OutputFile>,
    /// See [`crate::engine::Outcome::stderr_line`]: the coordinator's
    /// engine tells failures apart by it.
    pub stderr_line: Option<String>,
    /// See [`crate::engine::Outcome::usage`].
    pub usage: Option<Usage>,
}

/// A fact about one task of a farm that every holder of the farm keeps:
/// the replicated part of a farm's state. Entries only accumulate, and
/// done wins over failed, so holders merge them in any order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Entry {
    /// The task is done: the run that counts, and where its outputs are.
    Done {
        /// Which task is done.
        task: TaskRef,
        /// The completion's content key. Boxed, as is a failure's end: a
        /// log holds an entry per task in each of its copies, and the
        /// simulator, which has no keys, a copy on several of its nodes.
        /// Encoded as the value itself.
        key: Option<Box<[u8; 32]>>,
        /// Who ran it (which attempt), and so holds its outputs until the home has them.
        node: NodeId,
        /// Which attempt of the task it was; 0 when never run in this farm, its
        /// result reused from an earlier one.
        attempt: u32,
        /// Shared: the coordinator's log, each holder's copy, the syncs
        /// between them and what is written to the store are clones of one
        /// entry (a vector each was a third of a 1,000-node simulation's
        /// memory). Encoded as a vector.
        outputs: Arc<[OutputFile]>,
        /// When the run that counts ran, by its node's clock: what a client
        /// following the farm is told. Boxed and absent in the simulator.
        ran: Option<Box<Ran>>,
    },
    /// Failed for good, with the reason.
    Failed {
        /// Which task failed.
        task: TaskRef,
        /// The attempt that failed last.
        attempt: u32,
        /// The node that ran it.
        node: NodeId,
        /// How it ended.
        end: Box<TaskEnd>,
        /// When it ran, by its node's clock, where known (see [`Ran`]).
        ran: Option<Box<Ran>>,
        /// See [`crate::engine::Outcome::stderr_line`]: the cause every
        /// holder shows beside the end, as the log file stays on the node
        /// that ran it.
        stderr_line: Option<Box<str>>,
    },
    /// The outputs of `node`'s run (`attempt`) of a done task are lost with
    /// that node (gone for longer than the home waits, or it has them no
    /// more): the task runs again, and that run never counts as done again.
    Redo {
        /// Which task runs again.
        task: TaskRef,
        /// The node whose outputs of it are lost.
        node: NodeId,
        /// Which attempt of the task that node's run was.
        attempt: u32,
    },
}

/// When a run ended and how long it took, in ms, by the clock of the node
/// that ran it: the start and end a client of the farm is shown.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ran {
    /// When it ended, in ms since the Unix epoch (0: not known).
    pub ended_ms: u64,
    /// How long it ran, in ms.
    pub duration_ms: u64,
    /// Its exit code, when it exited (a stage may count more than 0 a success).
    pub exit_code: Option<i32>,
    /// See [`crate::engine::Outcome::grew`]: which of a grown stage's
    /// tasks exist, replicated with the rest of the farm.
    pub grew: Option<u32>,
    /// What the run used (see [`Usage`]), where its node measured it.
    pub usage: Option<Usage>,
}

impl Ran {
    /// From a report: none when its node said neither when it ended nor
    /// what it grew.
    pub fn of(r: &Report) -> Option<Box<Ran>> {
        (r.ended_ms != 0 || r.grew.is_some() || r.usage.is_some()).then(|| {
            Box::new(Ran {
                ended_ms: r.ended_ms,
                duration_ms: r.duration_ms,
                exit_code: match r.result {
                    TaskResult::Exited(c) => Some(c),
                    _ => None,
                },
                grew: r.grew,
                usage: r.usage,
            })
        })
    }

    /// Where its node said when it ended (0: not said).
    pub fn started_ms(&self) -> Option<u64> {
        (self.ended_ms != 0).then(|| self.ended_ms.saturating_sub(self.duration_ms))
    }
}

impl Entry {
    /// When the run it records ran, where that is known.
    pub fn ran(&self) -> Option<&Ran> {
        match self {
            Entry::Done { ran, .. } | Entry::Failed { ran, .. } => ran.as_deref(),
            Entry::Redo { .. } => None,
        }
    }

    /// Which task the entry is of.
    pub fn task(&self) -> TaskRef {
        match self {
            Entry::Done { task, .. } | Entry::Failed { task, .. } | Entry::Redo { task, .. } => {
                *task
            }
        }
    }

    /// Whether it says the task is done.
    pub fn is_done(&self) -> bool {
        matches!(self, Entry::Done { .. })
    }

    /// Whether it says the task failed for good.
    pub fn is_failed(&self) -> bool {
        matches!(self, Entry::Failed { .. })
    }
}

/// A farm's progress, as its home shows it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FarmProgress {
    /// Which farm this is the progress of.
    pub farm: FarmId,
    /// Its tasks' counts, summed over its stages.
    pub counts: Counts,
    /// The same counts per stage, in the farm's stage order.
    pub stages: Vec<Counts>,
    /// Every task is over and every output is home.
    pub finished: bool,
    /// Runs that completed a task already done (only after a fault: a node
    /// declared dead that was alive, a partition); the first result counts.
    pub duplicates: u64,
    /// Done tasks run again because the only copy of their outputs went
    /// with a node before the home (or a task that needed them) had it.
    pub redone: u64,
    /// Stages that fit no node of the mesh (their tasks are failed), and why.
    pub unplaceable: Vec<(u32, String)>,
    /// Stages stopped because their first tasks all failed the same way
    /// (`max_fails`), and why.
    pub stopped: Vec<(u32, Stop)>,
}

/// A coordinator that wrote a farm's log, the order it hands each stage's
/// tasks out in (stages missing: from the first index up), and the other
/// nodes it had keep a copy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Writer {
    /// The coordinator that wrote the log.
    pub node: NodeId,
    /// The order of each stage, in stage order (stages missing: from the
    /// first index up).
    pub order: Vec<Order>,
    /// In id order: each may be on a side of a partition of its own, and
    /// the sides keep their places apart (see [`Order::apart`]).
    pub holders: Vec<NodeId>,
}

/// The coordinator's log of a farm, from position `from`, and its progress.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SyncMsg {
    /// The coordinator's term: a holder that follows a later one ignores
    /// the sync.
    pub term: u64,
    /// Which coordinator's log this is (a restarted one starts a new log).
    pub log: u64,
    /// Counts up with every `Sync` of this log: messages may arrive out of
    /// order, and only the newest says where the farm stands.
    pub seq: u64,
    /// Which farm the log is of.
    pub farm: FarmId,
    /// The log position of the first of `entries`.
    pub from: u64,
    /// The log's entries from `from` on, in order.
    pub entries: Vec<Entry>,
    /// The log's length when sent: a holder is up to date once it has that many.
    pub len: u64,
    /// The farm's home as the coordinator knows it.
    pub home: Home,
    /// The farm's counts, summed over its stages, as the coordinator's
    /// engine says.
    pub counts: Counts,
    /// The same counts per stage: those of the stages that changed after
    /// version `stages_base` of them (the one the holder said it has),
    /// each with its stage's index. A holder that has not that version
    /// takes none (and says which it has).
    pub stages: Vec<(u32, Counts)>,
    /// See `stages`.
    pub stages_base: u64,
    /// The version of the stages' counts this message brings a holder to.
    pub stages_version: u64,
    /// Every task of the farm is over.
    pub finished: bool,
    /// See [`FarmProgress::duplicates`], [`FarmProgress::unplaceable`]
    /// and [`FarmProgress::stopped`].
    pub duplicates: u64,
    /// Stages that fit no node, and why (see [`FarmProgress::unplaceable`]).
    pub unplaceable: Vec<(u32, String)>,
    /// Stages stopped by `max_fails`, and why (see [`FarmProgress::stopped`]).
    pub stopped: Vec<(u32, Stop)>,
    /// The order the coordinator hands each stage's tasks out in, and the
    /// other live nodes it has keep a copy: a holder says both when it
    /// offers its copy (see [`Writer`]).
    pub order: Vec<Order>,
    /// The other live nodes it has keep a copy, in id order (see
    /// [`Writer::holders`]).
    pub holders: Vec<NodeId>,
}

/// A task's attempt that failed and will be retried, for the home to show.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Failure {
    /// Which farm the task is of.
    pub farm: FarmId,
    /// Which task failed.
    pub task: TaskRef,
    /// Which attempt failed.
    pub attempt: u32,
    /// The node that ran it.
    pub node: NodeId,
    /// How it ended.
    pub end: TaskEnd,
    /// What follows: a retry.
    pub verdict: Verdict,
}

/// What peers say to each other (and a node to itself); each variant
/// says who sends it to whom.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Msg {
    /// Who I am, what I hold, whom I follow: a report to the coordinator,
    /// or its answer. Shared, because a coordinator's claim goes to many.
    Beat(Arc<Beat>),
    /// A membership packet (probe, acknowledgement, gossip of who joined
    /// and died; see `peer/membership.rs`), when it travels as a message.
    Swim(Vec<u8>),
    /// A roster exchange: the sender's digest of the members, and the
    /// members its SWIM has alive or suspect (empty in an `Ask`).
    Roster {
        /// Which part of the exchange this is.
        kind: RosterKind,
        /// The sender's digest of the members its SWIM has alive.
        digest: u64,
        /// The members its SWIM has alive or suspect (empty in an `Ask`).
        members: Vec<RosterEntry>,
    },
    /// A holder of the farm (its submitter, or a node keeping a copy) to the
    /// coordinator: the farm and what this holder knows of it. Sent on
    /// submission and again to every new coordinator, so one that does not
    /// hold the farm takes it over without re-running finished tasks.
    Submit {
        /// The farm's definition, submitter and inputs.
        farm: Arc<FarmSpec>,
        /// What this holder knows ended for good, as much as fits one message
        /// (the rest follows as `Offer`).
        entries: Vec<Entry>,
        /// The farm's home as this holder knows it.
        home: Home,
        /// The coordinator whose log this copy follows, and its order:
        /// none for a farm not coordinated yet.
        writer: Option<Writer>,
    },
    /// More of what a holder knows of a farm, when it did not fit one `Submit`.
    Offer {
        /// Which farm the entries are of.
        farm: FarmId,
        /// More of its entries, after those of the `Submit`.
        entries: Vec<Entry>,
    },
    /// Coordinator to submitter: the farm is durable on two nodes (one in a mesh of one).
    Accepted {
        /// Which farm was taken.
        farm: FarmId,
        /// How many tasks the farm has.
        tasks: u64,
    },
    /// Coordinator to submitter: the farm cannot be taken.
    Refused {
        /// Which farm was refused.
        farm: FarmId,
        /// Why, in words for the user.
        reason: String,
    },
    /// Coordinator to a node: hold a copy of this farm (its state follows by `Sync`).
    Replicate {
        /// The coordinator's term: a node that follows a later one ignores it.
        term: u64,
        /// The farm to keep a copy of.
        farm: Arc<FarmSpec>,
    },
    /// Coordinator to a holder of a farm's earlier generation: keep its
    /// later one, sent as what it adds (a holder that has not the
    /// generation it grows says which it has, and is sent it whole).
    ReplicateGrown {
        /// As `Replicate`'s.
        term: u64,
        /// What the later generation adds.
        growth: Box<Growth>,
    },
    /// Holder to coordinator: the copy is durable.
    Replicated {
        /// Which farm the copy is of.
        farm: FarmId,
        /// The generation of the farm's spec the copy holds.
        gen: u32,
    },
    /// Coordinator to the farm's holders. Boxed: it is the largest
    /// message, and every other message would pay its size.
    Sync(Box<SyncMsg>),
    /// Holder to coordinator: every entry before `next` is durable here.
    /// `over`: it knows every task of the farm is over.
    Synced {
        /// Which farm's log.
        farm: FarmId,
        /// The log position up to which (not included) entries are durable here.
        next: u64,
        /// The holder knows every task of the farm is over.
        over: bool,
        /// The version of the stages' counts it has (see [`SyncMsg::stages`]).
        stages: u64,
    },
    /// The home to every node: every output of this farm is home; what
    /// was kept for it may go.
    Collected {
        /// Which farm is collected.
        farm: FarmId,
    },
    /// A node that found outputs of these farms in its state at a restart
    /// (it may have been down when their ends were told) to its
    /// coordinator, and the coordinator to each farm's home: the home
    /// answers `node` with `Collected` for each whose end it told.
    Keeps {
        /// The node that found the outputs: the home answers it.
        node: NodeId,
        /// The farms it found outputs of.
        farms: Vec<FarmId>,
    },
    /// Coordinator to worker: run these. `echo`: the `at` of the worker's
    /// report this answers, so the worker measures its round trip.
    Assign {
        /// The coordinator's term: a worker that follows a later one refuses
        /// the tasks.
        term: u64,
        /// The attempts to run, in the order to start them.
        tasks: Vec<Assigned>,
        /// The `at` of the worker's report this answers, if it answers one.
        echo: Option<u64>,
        /// The coordinator's clock as it sent this, as a beat's
        /// (`Beat::clock`): a busy worker speaks for later assignments
        /// sooner than its next report's answer would let it.
        clock: u64,
    },
    /// Worker to coordinator: these attempts are over (any number, one
    /// message per step). `at`: the worker's clock, echoed back by the
    /// assignment that answers it; `prefetch`: the worker's depth now.
    Report {
        /// The term of the coordinator it reports to.
        term: u64,
        /// The attempts that are over.
        reports: Vec<Report>,
        /// The worker's clock when it sent this, echoed by the answer.
        at: u64,
        /// The worker's prefetch depth now.
        prefetch: u32,
    },
    /// Coordinator to worker: these reports are recorded; forget them.
    Ack {
        /// The attempts whose reports are recorded.
        tasks: Vec<Assigned>,
    },
    /// Worker to coordinator: I will not run these after all (queue them again).
    Release {
        /// The term of the coordinator it gives them back to.
        term: u64,
        /// The attempts given back, not started.
        tasks: Vec<Assigned>,
    },
    /// Worker to coordinator, after a new coordinator is elected: the
    /// tasks it has claimed (running or queued), which the coordinator
    /// adopts; and every second where its reports, which list them
    /// otherwise (`Beat::claimed`), come further apart.
    Claimed {
        /// The term of the new coordinator.
        term: u64,
        /// Every attempt the worker holds, running or queued.
        tasks: Vec<Assigned>,
        /// As `Beat::seen`: the list speaks for assignments sent before
        /// the coordinator's clock said this.
        seen: u64,
    },
    /// The home to the coordinator: these done tasks' outputs are lost with
    /// the node that kept them (gone too long); run them again.
    Redo {
        /// Which farm the runs are of.
        farm: FarmId,
        /// The runs whose outputs are lost.
        tasks: Vec<TaskRun>,
    },
    /// Worker to coordinator: I was assigned tasks of a farm I do not know.
    GetFarm {
        /// The farm whose definition it needs.
        farm: FarmId,
        /// The generation of it the worker holds, if any: a later one
        /// comes as what it adds ([`Msg::Grown`]).
        have: Option<SpecHeld>,
    },
    /// Coordinator to worker: the farm asked for.
    Farm(Arc<FarmSpec>),
    /// Thief to victim: give me unstarted tasks, at most `max`, as many as
    /// a node of `total` resources already holding `load` may be handed
    /// (the coordinator's rule: about 1.1x its capacity, one beyond full).
    Steal {
        /// Which steal this is: the answer names it, so a late one is told apart.
        id: u64,
        /// The thief's resources.
        total: Resources,
        /// What the thief already holds of them.
        load: Resources,
        /// The most tasks it takes.
        max: u32,
    },
    /// Victim to thief: the tasks given up (maybe none).
    Stolen {
        /// The steal this answers (see `Steal`).
        id: u64,
        /// The attempts given up, now the thief's.
        tasks: Vec<Assigned>,
    },
    /// Victim to coordinator: these tasks of mine now belong to `to`.
    Moved {
        /// The term of the coordinator it tells.
        term: u64,
        /// The thief they went to.
        to: NodeId,
        /// The attempts moved.
        tasks: Vec<Assigned>,
    },
    /// Anyone to coordinator, and coordinator to workers: stop this farm.
    Cancel {
        /// The farm to stop.
        farm: FarmId,
    },
    /// Coordinator to the home: an attempt failed and will be retried.
    Failure(Failure),
    /// Anyone to coordinator: a user's change to the allocation queues.
    /// Boxed, as the largest message: every other would pay its size.
    Alloc(Box<AllocCmd>),
    /// The allocation book, to a node that holds an older one.
    Allocs(Arc<AllocBook>),
    /// Anyone to coordinator, and coordinator to the worker that has it:
    /// stop this one task (a client's future cancelled), not its farm.
    CancelTask {
        /// Which farm the task is of.
        farm: FarmId,
        /// The task to stop.
        task: TaskRef,
    },
    /// Coordinator to worker: the farm asked for, as what its generation
    /// adds to the one the worker holds (`GetFarm::have`).
    Grown(Box<Growth>),
}

impl Msg {
    /// Every kind of message by name, indexed by [`Msg::kind`]: what the
    /// simulator counts its traffic by, to say which of the peers' timers
    /// and exchanges the messages of a run come from.
    pub const KINDS: [&'static str; 31] = [
        "beat",
        "swim",
        "roster",
        "submit",
        "offer",
        "accepted",
        "refused",
        "replicate",
        "replicated",
        "sync",
        "synced",
        "collected",
        "keeps",
        "assign",
        "report",
        "ack",
        "release",
        "claimed",
        "redo",
        "get_farm",
        "farm",
        "steal",
        "stolen",
        "moved",
        "cancel",
        "failure",
        "alloc",
        "allocs",
        "cancel_task",
        "grown",
        "replicate_grown",
    ];

    /// This message's kind, an index into [`Msg::KINDS`].
    pub fn kind(&self) -> usize {
        match self {
            Msg::Beat(_) => 0,
            Msg::Swim(_) => 1,
            Msg::Roster { .. } => 2,
            Msg::Submit { .. } => 3,
            Msg::Offer { .. } => 4,
            Msg::Accepted { .. } => 5,
            Msg::Refused { .. } => 6,
            Msg::Replicate { .. } => 7,
            Msg::Replicated { .. } => 8,
            Msg::Sync(_) => 9,
            Msg::Synced { .. } => 10,
            Msg::Collected { .. } => 11,
            Msg::Keeps { .. } => 12,
            Msg::Assign { .. } => 13,
            Msg::Report { .. } => 14,
            Msg::Ack { .. } => 15,
            Msg::Release { .. } => 16,
            Msg::Claimed { .. } => 17,
            Msg::Redo { .. } => 18,
            Msg::GetFarm { .. } => 19,
            Msg::Farm(_) => 20,
            Msg::Steal { .. } => 21,
            Msg::Stolen { .. } => 22,
            Msg::Moved { .. } => 23,
            Msg::Cancel { .. } => 24,
            Msg::Failure(_) => 25,
            Msg::Alloc(_) => 26,
            Msg::Allocs(_) => 27,
            Msg::CancelTask { .. } => 28,
            Msg::Grown(_) => 29,
            Msg::ReplicateGrown { .. } => 30,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::farm::{CommandTemplate, Sweep, Template};

    /// Generation `gen` of an open farm of `n` one-task stages, each with
    /// an input file of its own.
    fn farm(gen: u32, n: usize) -> FarmSpec {
        let stage = |i: usize| {
            Arc::new(StageDef::new(
                &format!("f{i}"),
                CommandTemplate::Argv(vec![Template::literal("true")]),
                Sweep::range("i", 1),
            ))
        };
        FarmSpec {
            id: FarmId(3),
            origin: NodeId(1),
            def: Arc::new(FarmDef {
                graph: Default::default(),
                name: "python".into(),
                root: "/r".into(),
                out: "/r/out".into(),
                stages: (0..n).map(stage).collect(),
            }),
            inputs: (0..n)
                .map(|i| InputFile {
                    path: format!("calls/{i}.pkl"),
                    hash: [i as u8; 32],
                    mode: 0o644,
                })
                .collect(),
            submitted_ms: 1,
            gen,
            open: true,
        }
    }

    #[test]
    fn a_growth_carries_only_what_was_added_and_grows_only_what_it_was_made_from() {
        let (was, next) = (farm(4, 100), farm(7, 103));
        let g = Growth::since(SpecHeld::of(&was), &next).expect("a later generation");
        assert_eq!((g.stages.len(), g.inputs.len(), g.gen), (3, 3, 7));
        let whole = postcard::to_allocvec(&next).unwrap().len();
        let sent = postcard::to_allocvec(&Msg::Grown(Box::new(g.clone())))
            .unwrap()
            .len();
        assert!(
            sent * 20 < whole,
            "{sent} bytes sent for a {whole}-byte farm"
        );
        assert_eq!(g.apply(&was), Some(next.clone()));
        // Not from another generation, however many stages it has.
        assert_eq!(g.apply(&farm(5, 100)), None);
        assert_eq!(g.apply(&farm(4, 101)), None);
        // Nothing to send to a node as late, or later.
        assert_eq!(Growth::since(SpecHeld::of(&next), &next), None);
        assert_eq!(Growth::since(SpecHeld::of(&farm(8, 104)), &next), None);
    }
}
