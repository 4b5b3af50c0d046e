//! Who is alive: who is in the mesh by SWIM (the `foca` crate), and the beats members sent this node directly.
//!
//! Two sources, each paying a cost that does not grow with the mesh:
//!
//! - **SWIM** (`foca`, sans-IO like the rest of the peer): every probe
//!   period a node pings one member, asks a few others to ping it when it
//!   does not answer, suspects it, and declares it down only if the
//!   suspicion is not refuted in time; who joined and who died rides on
//!   those packets and reaches everyone in O(log N) periods. This is how
//!   every node knows every member (its id and addresses) and learns of
//!   deaths anywhere, at a constant number of packets per node per period.
//! - **Beats**, sent directly, not gossiped: each worker reports to its
//!   coordinator, and the coordinator answers. A node watches only the
//!   members it hears from this way (the coordinator all of its workers,
//!   a worker its coordinator): their silence past a limit is a death,
//!   found in about two seconds, faster than SWIM's suspicion.
//!
//! Once a beat, `upkeep` keeps the two in step: this node back in SWIM
//! when foca went idle, members known only by a beat brought to SWIM (or
//! counted dead once silent), members hidden for their silence judged by
//! SWIM again.
//!
//! The rest of the peer sees members with their last beat (none for
//! members known only by SWIM), `heard`, `expired` and `remove`, and the
//! members that came up since it last asked (`take_fresh`).

use std::cell::Cell;
use std::collections::{BTreeMap, BTreeSet};
use std::num::{NonZeroU32, NonZeroU8, NonZeroUsize};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use foca::{Foca, Identity, Message, NoCustomBroadcast, Notification, OwnedNotification};
use foca::{PostcardCodec, Runtime, Timer};
use rand::rngs::SmallRng;
use rand::SeedableRng;
use rustc_hash::{FxHashMap, FxHashSet};

use super::super::msg::{Beat, Ident, Msg, NodeId, RosterEntry, RosterKind};
use super::action::Action;
use super::due::TimersDue;
use super::out::Out;
use super::Config;
use crate::engine::Millis;
use crate::resources::Resources;
use crate::wire::PROTOCOL_VERSION;
pub use quiet::{Quiet, QuietSwim};

impl Identity for Ident {
    type Addr = NodeId;

    /// Declared down while alive (a long pause, a partition): the node
    /// comes back as its next life at once rather than staying out.
    fn renew(&self) -> Option<Self> {
        Some(self.next_life())
    }

    fn addr(&self) -> NodeId {
        self.id
    }

    /// Of two lives of one node, the later is the node.
    fn win_addr_conflict(&self, other: &Self) -> bool {
        self.life > other.life
    }
}

/// A member as this node knows it: a view of its entry in SWIM and of
/// the last beat it sent here, if any.
#[derive(Clone, Copy)]
pub struct Member<'a> {
    /// Which node it is.
    pub id: NodeId,
    heard: Option<&'a BeatRecord>,
    /// SWIM has it (not only a beat): its identity and address are SWIM's.
    known: bool,
    swim: &'a Swim,
}

/// What a member told this node directly (its beats): most members of
/// a worker never beat to it (it hears only its coordinator), so most
/// members have no such record, and a member costs this node only its
/// entry in SWIM and its id here (a mesh of N nodes holds N² of them).
#[derive(Debug)]
pub(super) struct BeatRecord {
    beat: Arc<Beat>,
    last_seen: Millis,
    /// It sent this node a beat since this node last started watching
    /// (becoming coordinator): its silence is a death.
    direct: bool,
}

impl std::fmt::Debug for Member<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Member")
            .field("id", &self.id)
            .field("ident", &self.ident())
            .field("heard", &self.heard)
            .finish()
    }
}

impl<'a> Member<'a> {
    /// Its last beat to this node, or, for a member known only by SWIM, an
    /// empty one: no resources, following no one.
    pub fn beat(&self) -> &'a Beat {
        self.heard.map_or(&*NO_BEAT, |h| &h.beat)
    }

    /// Its last beat, shared (an empty one for a member known only by SWIM).
    pub fn beat_arc(&self) -> Arc<Beat> {
        self.heard
            .map_or_else(|| Arc::new(NO_BEAT.clone()), |h| h.beat.clone())
    }

    /// When it last beat to this node (0: never).
    pub fn last_seen(&self) -> Millis {
        self.heard.map_or(0, |h| h.last_seen)
    }

    /// It beat to this node since this node last started watching.
    pub(super) fn direct(&self) -> bool {
        self.heard.is_some_and(|h| h.direct)
    }

    /// How SWIM knows it, when it does (a record SWIM keeps of an
    /// earlier life, down, is not how this member is reached now).
    fn ident(&self) -> Option<&'a Ident> {
        self.swim
            .member(&self.id)
            .filter(|_| self.known)
            .map(|m| m.id())
    }

    /// How it is known on the network (its peer id), as SWIM or its beat says.
    pub fn label(&self) -> &'a str {
        self.address().0
    }

    /// Where to reach it, as SWIM or its beat says.
    pub fn addrs(&self) -> &'a [String] {
        self.address().1
    }

    fn address(&self) -> (&'a str, &'a [String]) {
        match (self.ident(), self.heard) {
            (Some(i), _) => (i.at.label(), i.at.addrs()),
            (None, Some(h)) => (&h.beat.label, &h.beat.addrs),
            (None, None) => ("", &[]),
        }
    }
}

type Swim = Foca<Ident, PostcardCodec, SmallRng, NoCustomBroadcast>;

/// What SWIM asked of this node in one call, collected for `drain`, and
/// what it showed of this node's own health (Lifeguard's signals, below).
#[derive(Default)]
struct SwimRt {
    to_send: Vec<(Ident, Vec<u8>)>,
    to_schedule: Vec<(Duration, Timer<Ident>)>,
    notes: Vec<OwnedNotification<Ident>>,
    /// Probes of this node's that no member answered, directly or not.
    probes_failed: u32,
    /// Packets received, and probes started (pings sent).
    received: u32,
    pings: u32,
    /// Answers to this node's probes (direct, or forwarded by a member
    /// asked to probe on its behalf).
    acks: u32,
    /// The incarnation this node's last packet carried: it rises only when
    /// this node refutes a suspicion of itself.
    incarnation: Option<u16>,
    /// A packet in closed form (`quiet`), sent after this many of `to_send`.
    quiet: Option<(usize, QuietSwim)>,
}

impl Runtime<Ident> for SwimRt {
    fn notify(&mut self, n: Notification<'_, Ident>) {
        match n {
            Notification::ProbeFailed(..) => self.probes_failed += 1,
            Notification::DataReceived(h) => {
                self.received += 1;
                if matches!(h.message, Message::Ack(_) | Message::ForwardedAck { .. }) {
                    self.acks += 1;
                }
            }
            Notification::DataSent(h) => {
                self.incarnation = Some(h.src_incarnation);
                if matches!(h.message, Message::Ping(_)) {
                    self.pings += 1;
                }
            }
            n => self.notes.push(n.to_owned()),
        }
    }

    fn send_to(&mut self, to: Ident, data: &[u8]) {
        self.to_send.push((to, data.to_vec()));
    }

    fn submit_after(&mut self, event: Timer<Ident>, after: Duration) {
        self.to_schedule.push((after, event));
    }
}

/// Lifeguard's local health (Dadgar et al., 2018, as memberlist runs it):
/// a score from 0 (healthy) to `HEALTH_MAX` that rises when this node's
/// probe goes unanswered while it heard nothing from anyone else either,
/// when it must refute a suspicion of itself, and when its own timers fire
/// late (it is starved of CPU), and falls with each answered probe.
/// Lifeguard tells a node's own fault from its target's by the nacks of
/// the members it asked to probe; foca sends none, and hearing other
/// members while the target is silent says the same: the target, not
/// this node, is at fault (so the successor of a coordinator that died
/// does not slow its own failover). This node's probe period, probe timeout and
/// suspicion timeouts are stretched by `score + 1`: a node that cannot
/// keep up slows its own judgement of others instead of declaring them
/// dead, and sends fewer probes while it is behind.
const HEALTH_MAX: u32 = 8;

/// A timer this late (in ms) means this node was not running when it was due.
const LATE_MS: Millis = 200;

/// How many of the lowest members are kept at hand: enough for the
/// lowest but two (a dead coordinator and one passed over).
const LOW: usize = 3;

/// `Msg::Roster` as [`Membership::on_roster`] hears it: the member that
/// sent it, whether it asks, answers or closes the exchange, the digest
/// of the members it knows, and those it tells of.
pub(super) struct RosterHeard {
    pub(super) from: NodeId,
    pub(super) kind: RosterKind,
    pub(super) digest: u64,
    pub(super) members: Vec<RosterEntry>,
}

pub(super) struct Membership {
    me: NodeId,
    swim: Swim,
    rt: SwimRt,
    /// Lifeguard's local health score, 0 (healthy) to `HEALTH_MAX`.
    health: u32,
    /// The incarnation this node last sent, to see it refute a suspicion.
    incarnation: u16,
    /// This node heard a packet from some member since its probe began.
    heard: bool,
    /// SWIM's timers, by when they are due, then the gossip tick before
    /// the others of its millisecond, then the order they were set in.
    /// The tick's place is fixed because when it was last set is not: a
    /// node that fires a tick with nothing to tell at its next wake
    /// (`skip_quiet`) sets the next one later than one woken for it.
    timers: BTreeMap<(Millis, bool, u64), Timer<Ident>>,
    timer_seq: u64,
    /// A timer that would do nothing wakes no one: it is fired with
    /// whatever wakes the node next (`Config::step_upkeep` off).
    skip_quiet: bool,
    /// While the timers due are fired: when the gossip tick among them
    /// was due (the phase its next one keeps), and whether it had
    /// nothing to tell.
    gossip_fired: Option<(Millis, bool)>,
    /// Those timers fire before an input, with no wake of their own.
    quiet: bool,
    /// Pings and acks that carry nothing are sent in closed form
    /// (`Config::quiet_swim`).
    quiet_swim: bool,
    /// The size of a quiet ping or ack to each member, as last counted
    /// (`quiet::QuietLen`).
    quiet_lens: FxHashMap<NodeId, quiet::QuietLen>,
    /// When health last rose for this node's lateness.
    late_at: Option<Millis>,
    /// The mesh size SWIM's timeouts were last tuned for.
    tuned_for: usize,
    /// SWIM's suspicion timeout at that size, kept: every beat reads it,
    /// and building the config it comes from takes two `log10`s (2% of a
    /// simulated long farm).
    suspect_after: Duration,
    dead_after_ms: Millis,
    /// The live members.
    members: BTreeSet<NodeId>,
    /// The same, to ask whether one is: a coordinator asks at each task
    /// it places, and a walk down the tree of a thousand members, cold in
    /// the cache, was 1% of a simulated run.
    member_set: FxHashSet<NodeId>,
    /// The lowest `LOW` of them, in order: who is elected next is asked
    /// at every look at the members, and a walk down the tree of a
    /// thousand members, cold in the cache, was 1.5% of a simulated run.
    low: Vec<NodeId>,
    /// What those that beat to this node told it.
    told: FxHashMap<NodeId, BeatRecord>,
    /// Moves whenever what the coordinator's victims are found from
    /// changes (`on_tasks::victims_again`): who the members are, or what
    /// a beat says it has queued or would prefetch.
    loads: u64,
    /// Members declared dead, and since when (the home waits for those
    /// that keep its outputs).
    gone: FxHashMap<NodeId, Millis>,
    /// Declared down by SWIM, not yet handed to the peer.
    down: Vec<NodeId>,
    /// When the first watched member would be silent too long, as the
    /// last look (`expired`) found them, and what that look watched.
    silence: Option<Millis>,
    watched: Option<Watch>,
    /// Members declared dead here for their silence to this node while
    /// SWIM still has them alive: they come back when this node stops
    /// watching them (see `unhide`), or when SWIM or a beat says they live.
    hidden: BTreeMap<NodeId, Ident>,
    /// Members that came up (SWIM, or a first beat), not yet handed to the peer.
    fresh: Vec<NodeId>,
    /// Members known only by a beat, not (yet) by SWIM: few, and looked
    /// at every beat (a scan of all members for them, at every node,
    /// cost the simulator N² a beat).
    unknown: BTreeSet<NodeId>,
    /// The sum of `member_hash` over `members`.
    sum: u64,
    /// When this node next looks at its members (checks, elections, steals).
    next_beat: Millis,
    /// When this node next reports to its coordinator.
    next_report: Millis,
    /// A report the driver sends for this node (`Peer::poll_promise`).
    promise: Option<Promise>,
    /// The queue length this node last reported.
    advertised: u32,
    /// SWIM counts this node in the mesh and probes (foca's `Active`).
    /// After a change of identity (a new address, or a new life when the
    /// mesh declared this one down) foca probes no one until a packet
    /// addressed to the new identity arrives; the one gossip it sends may
    /// be lost or go to dead members, and then it would stay idle for good.
    active: bool,
    /// Which member to announce to next while not active.
    rejoin_turn: usize,
    /// The digest of SWIM's live members and this node, while none changed.
    digest: Cell<Option<u64>>,
    /// Since when this node's digest has differed from its coordinator's.
    unlike_since: Option<Millis>,
    /// The coordinator's last answer carried the digest this node had:
    /// it knows the members its coordinator knows.
    agrees: bool,
}

/// A worker whose digest of the members has differed from its
/// coordinator's this long asks for the coordinator's roster (and, if
/// they still differ, sends its own). Longer than SWIM takes to tell a
/// join or a death to every member, so a change in the mesh costs no
/// exchange of rosters; a member SWIM's gossip missed costs one.
const ROSTER_SETTLE_MS: Millis = 10_000;

/// SWIM's timing: a probe a second, a direct answer expected within 400 ms,
/// three members asked to probe on this node's behalf, and foca's LAN
/// suspicion of `max(1, log10 N) x 4` periods (a refutation needs to reach
/// more members as the mesh grows), never shorter than `dead_after_ms`.
/// Tuned again as the mesh doubles. (A suspicion of `dead_after_ms` alone
/// in small meshes lost an output in the simulator's fault sweep, seed 37.)
fn swim_config(size: usize, dead_after_ms: Millis) -> foca::Config {
    let n = NonZeroU32::new(size.max(4) as u32).expect("at least 4");
    let mut c = foca::Config::new_lan(n);
    c.probe_rtt = Duration::from_millis(400);
    c.suspect_to_down_after = c
        .suspect_to_down_after
        .max(Duration::from_millis(dead_after_ms));
    // Large membership updates would be cut to fit: the addresses are
    // text, so a packet holds a few members.
    c.max_packet_size = NonZeroUsize::new(1400).expect("non-zero");
    // Two sides of a healed partition have declared each other down and
    // probe only their own: an announce to a down member every few
    // seconds (not foca's 65 s) is what finds the other side again.
    // A mesh forms from nodes that all join at once (a batch system starts
    // them together): each join is told more than foca's 4 log10(N+1)
    // times, which a node that knows only a few members yet computes far
    // too low, and a node asks a random member for a sample of the
    // members every 10 s (foca's 30 s), which is what brings in those the
    // epidemic missed.
    c.max_transmissions = c
        .max_transmissions
        .max(NonZeroU8::new(8).expect("non-zero"));
    c.periodic_announce = Some(foca::PeriodicParams {
        frequency: Duration::from_secs(10),
        num_members: NonZeroUsize::new(1).expect("non-zero"),
    });
    c.periodic_announce_to_down_members = Some(foca::PeriodicParams {
        frequency: Duration::from_secs(3),
        num_members: NonZeroUsize::new(2).expect("non-zero"),
    });
    c
}

impl Membership {
    pub(super) fn new(
        now: Millis,
        me: NodeId,
        seed: u64,
        dead_after_ms: Millis,
        step_upkeep: bool,
    ) -> Membership {
        let ident = Ident::new(me, 0, String::new(), Vec::new());
        let config = swim_config(4, dead_after_ms);
        Membership {
            me,
            suspect_after: config.suspect_to_down_after,
            swim: Foca::new(ident, config, SmallRng::seed_from_u64(seed), PostcardCodec),
            rt: SwimRt::default(),
            health: 0,
            incarnation: 0,
            heard: false,
            timers: BTreeMap::new(),
            timer_seq: 0,
            skip_quiet: !step_upkeep,
            gossip_fired: None,
            quiet: false,
            quiet_swim: false,
            quiet_lens: FxHashMap::default(),
            late_at: None,
            tuned_for: 4,
            dead_after_ms,
            members: BTreeSet::new(),
            member_set: FxHashSet::default(),
            low: Vec::with_capacity(LOW),
            told: FxHashMap::default(),
            loads: 0,
            gone: FxHashMap::default(),
            down: Vec::new(),
            silence: None,
            watched: None,
            hidden: BTreeMap::new(),
            fresh: Vec::new(),
            unknown: BTreeSet::new(),
            sum: 0,
            next_beat: now,
            next_report: now,
            promise: None,
            advertised: 0,
            active: false,
            rejoin_turn: 0,
            digest: Cell::new(None),
            unlike_since: None,
            agrees: false,
        }
    }

    /// How this node is known: its address, and which life of it this is
    /// (later than any before, e.g. the wall clock at start).
    pub(super) fn set_address(
        &mut self,
        now: Millis,
        label: String,
        addrs: Vec<String>,
        life: u64,
        out: &mut Out,
    ) {
        let ident = Ident::new(
            self.me,
            life.max(self.swim.identity().life + 1),
            label,
            addrs,
        );
        // Only fails for an identity of another address, never ours.
        if self.swim.change_identity(ident, &mut self.rt).is_ok() {
            self.active = false;
        }
        self.drain(now, out);
    }

    pub(super) fn label(&self) -> &str {
        self.swim.identity().at.label()
    }

    pub(super) fn addrs(&self) -> &[String] {
        self.swim.identity().at.addrs()
    }

    /// How a member is reached, as SWIM or its beat says.
    pub(super) fn address_of(&self, id: NodeId) -> Option<(&str, &[String])> {
        self.get(id).map(|m| m.address())
    }

    // ----- SWIM -----

    /// A node to join through (an address the user gave, a peer this node
    /// knew): SWIM announces itself there, and learns the members from it.
    pub(super) fn introduce(
        &mut self,
        now: Millis,
        id: NodeId,
        label: String,
        addrs: Vec<String>,
        out: &mut Out,
    ) {
        if id == self.me {
            return;
        }
        let life = self.get(id).and_then(|m| m.ident()).map_or(0, |i| i.life);
        let to = Ident::new(id, life, label, addrs);
        // Refused only for this node itself, ruled out above.
        let _ = self.swim.announce(to, &mut self.rt);
        self.drain(now, out);
        // The members it knows, at once: SWIM's answer to an announce
        // holds only as many as fit a packet.
        out.send(
            id,
            Msg::Roster {
                kind: RosterKind::Ask,
                digest: self.digest(),
                members: Vec::new(),
            },
        );
    }

    // ----- rosters (push-pull) -----

    /// A digest of the members SWIM has alive or suspect, and this node:
    /// equal on two nodes that know the same members.
    pub(super) fn digest(&self) -> u64 {
        if let Some(d) = self.digest.get() {
            return d;
        }
        let me = self.swim.identity();
        let d = self
            .swim
            .iter_members()
            .map(|m| roster_hash(m.id()))
            .fold(roster_hash(me), u64::wrapping_add);
        self.digest.set(Some(d));
        d
    }

    /// The members SWIM has alive or suspect, as a roster.
    fn roster(&self) -> Vec<RosterEntry> {
        self.swim
            .iter_membership_state()
            .filter(|m| m.state() != foca::State::Down)
            .cloned()
            .collect()
    }

    /// This node's coordinator's digest, from its answer: true once it
    /// has differed from this node's for `ROSTER_SETTLE_MS` (again every
    /// `ROSTER_SETTLE_MS` while it does), when this node should ask.
    pub(super) fn roster_unlike(&mut self, now: Millis, theirs: u64) -> bool {
        self.agrees = theirs == self.digest();
        if self.agrees {
            self.unlike_since = None;
            return false;
        }
        let since = *self.unlike_since.get_or_insert(now);
        if now.saturating_sub(since) < ROSTER_SETTLE_MS {
            return false;
        }
        self.unlike_since = Some(now);
        true
    }

    /// Whether this node knew the members its coordinator knew, at the
    /// coordinator's last answer.
    pub(super) fn agrees(&self) -> bool {
        self.agrees
    }

    /// This node follows another coordinator: what it knew of the last
    /// one's members says nothing of this one's.
    pub(super) fn new_coordinator(&mut self) {
        self.agrees = false;
    }

    /// A roster message from `from`: merged, and answered as its kind asks.
    pub(super) fn on_roster(&mut self, now: Millis, heard: RosterHeard, out: &mut Out) {
        let RosterHeard {
            from,
            kind,
            digest,
            members,
        } = heard;
        if !members.is_empty() {
            // Not told on by SWIM: it is news to this node only (what is
            // news to the mesh, SWIM spreads itself). Fails only on a
            // malformed roster, which then changes nothing more.
            let _ = self
                .swim
                .apply_many(members.into_iter(), false, &mut self.rt);
            self.drain(now, out);
        }
        let reply = match kind {
            RosterKind::Ask => RosterKind::Answer,
            RosterKind::Answer => RosterKind::Last,
            RosterKind::Last => return,
        };
        let mine = self.digest();
        if mine != digest {
            out.send(
                from,
                Msg::Roster {
                    kind: reply,
                    digest: mine,
                    members: self.roster(),
                },
            );
        }
    }

    /// A SWIM packet from the network; a malformed one is dropped.
    pub(super) fn handle_swim(&mut self, now: Millis, data: &[u8], out: &mut Out) {
        self.swim_data(data);
        self.drain(now, out);
    }

    /// Kept up once a beat: this node stays in SWIM (`rejoin`), members
    /// SWIM does not know are brought to it (`introduce_unknown`), and
    /// members hidden long enough are judged by SWIM again (`rejudge`).
    pub(super) fn upkeep(&mut self, now: Millis, out: &mut Out) {
        let after = self.rejudge_after();
        self.rejoin(now, out);
        self.introduce_unknown(now, after, out);
        self.rejudge(now, after);
    }

    /// How long SWIM is given to find a death by itself: twice its
    /// suspicion (as stretched by this node's local health) and a few
    /// probe periods.
    fn rejudge_after(&self) -> Millis {
        let suspect = self.suspect_after.as_millis() as Millis * (u64::from(self.health) + 1);
        2 * suspect + 5_000
    }

    /// How SWIM knows a member, or, for one known only by its beat, the
    /// identity to announce to (any life of it takes an announce).
    fn ident_of(m: Member<'_>) -> Ident {
        match m.ident() {
            Some(i) => i.clone(),
            None => Ident::new(m.id, 0, m.beat().label.clone(), m.beat().addrs.clone()),
        }
    }

    /// A member this node knows only by a beat is not in SWIM here (this
    /// node restarted, or SWIM's gossip of it was lost): nothing would
    /// ever judge it once it stops beating to this node. One such member
    /// a beat is announced to, which brings it into SWIM if it lives; one
    /// silent for longer than SWIM would take to find a death is dead.
    fn introduce_unknown(&mut self, now: Millis, after: Millis, out: &mut Out) {
        let unknown = || self.unknown.iter().filter_map(|&id| self.get(id));
        let dead: Vec<NodeId> = unknown()
            .filter(|m| !m.direct() && now.saturating_sub(m.last_seen()) > after)
            .map(|m| m.id)
            .filter(|id| !self.down.contains(id))
            .collect();
        let count = unknown().count();
        if count > dead.len() {
            let to = unknown()
                .filter(|m| !dead.contains(&m.id))
                .nth(self.rejoin_turn % (count - dead.len()))
                .map(Self::ident_of);
            self.rejoin_turn += 1;
            if let Some(to) = to {
                // Refused only for this node itself, never a member.
                let _ = self.swim.announce(to, &mut self.rt);
                self.drain(now, out);
            }
        }
        self.down.extend(dead);
    }

    /// A member declared dead here for its silence while SWIM had it alive
    /// (this node's coordinator, or a worker of this coordinator, cut off by
    /// a partition) is SWIM's to judge again once SWIM has had time to find
    /// a real death. Still alive in SWIM then, it was cut off, not dead;
    /// without this a worker never counts its old coordinator as a member
    /// again after a partition heals, and the home takes every output kept
    /// there as lost.
    fn rejudge(&mut self, now: Millis, after: Millis) {
        if self.hidden.is_empty() {
            return;
        }
        let due: Vec<NodeId> = self
            .hidden
            .keys()
            .filter(|id| self.gone.get(id).is_some_and(|&at| now >= at + after))
            .copied()
            .collect();
        if due.is_empty() {
            return;
        }
        for id in due {
            let alive = self
                .swim
                .member(&id)
                .is_some_and(|m| m.state() != foca::State::Down);
            if alive {
                self.swim_up(id);
            } else {
                // SWIM no longer has it either: it stays gone.
                self.hidden.remove(&id);
            }
        }
    }

    /// While SWIM does not count this node in (it just changed identity, or
    /// declared every member down), announces it to one node it ever knew a
    /// beat, each in turn, those SWIM holds down included (two nodes that
    /// declared each other down across a partition find each other so):
    /// the first answer makes foca active again.
    fn rejoin(&mut self, now: Millis, out: &mut Out) {
        if self.active {
            return;
        }
        let mut known: BTreeMap<NodeId, Ident> = self
            .swim
            .iter_membership_state()
            .map(|m| (m.id().id, m.id().clone()))
            .collect();
        for m in self.iter() {
            known.entry(m.id).or_insert_with(|| Self::ident_of(m));
        }
        for (id, i) in &self.hidden {
            known.entry(*id).or_insert_with(|| i.clone());
        }
        let n = known.len().max(1);
        let Some(to) = known.into_values().nth(self.rejoin_turn % n) else {
            return;
        };
        self.rejoin_turn += 1;
        // Refused only for this node itself, never a member.
        let _ = self.swim.announce(to, &mut self.rt);
        self.drain(now, out);
    }

    /// When SWIM next needs the clock: a timer that would do nothing (a
    /// gossip tick with nothing to tell, the indirect probe of a member
    /// that answered) does not, unless every timer is stepped; it waits
    /// for the node's next wake or input (see `fire_quiet`).
    pub(super) fn next_timer(&self) -> Option<Millis> {
        self.timers
            .iter()
            .find(|(_, t)| !self.skip_quiet || !self.swim.timer_is_quiet(t))
            .map(|(&(at, ..), _)| at)
    }

    /// Whether a timer that would do something is due by `now`: the same
    /// as `next_timer() <= now`, without looking past `now`.
    pub(super) fn timer_due_by(&self, now: Millis) -> bool {
        self.timers
            .iter()
            .take_while(|((at, ..), _)| *at <= now)
            .any(|(_, t)| !self.skip_quiet || !self.swim.timer_is_quiet(t))
    }

    /// Before an input at `now` when nothing else is due: the timers due
    /// by then, each of which would do nothing (had one had something to
    /// do, the node would have been woken for it), fired as the node
    /// woken for each would have: nothing is sent, and the gossip tick
    /// after them keeps its phase.
    pub(super) fn fire_quiet(&mut self, now: Millis, out: &mut Out) {
        if self.timers.keys().next().is_some_and(|&(at, ..)| at <= now) {
            self.quiet = true;
            self.fire_timers(now, out);
            self.quiet = false;
        }
    }

    /// SWIM's timers due by `now`, added to `due`.
    pub(super) fn timers_due(&self, now: Millis, due: &mut TimersDue) {
        for (_, t) in self.timers.iter().take_while(|((at, ..), _)| *at <= now) {
            due.add(t.into());
        }
    }

    /// Fires SWIM's timers due by `now`.
    pub(super) fn fire_timers(&mut self, now: Millis, out: &mut Out) {
        let mut late = false;
        while let Some(entry) = self.timers.first_entry() {
            let (at, other, _) = *entry.key();
            if at > now {
                break;
            }
            let timer = entry.remove();
            // A timer that had nothing to do may be fired late for that
            // alone: not this node's lateness (other timers show it).
            let quiet = self.swim.timer_is_quiet(&timer);
            late |= !quiet && now > at + LATE_MS;
            if !other {
                self.gossip_fired = Some((at, quiet));
            } else if self.skip_quiet && quiet && (self.quiet || now > at) {
                out.stats.quiet_timers += 1;
            }
            // A timer of an old probe or identity is ignored by foca.
            if matches!(timer, Timer::ProbeRandomMember(_)) {
                self.probe_timer(timer);
            } else {
                let _ = self.swim.handle_timer(timer, &mut self.rt);
            }
        }
        if late {
            self.late(now);
        }
        self.drain(now, out);
    }

    /// This node's timers fired late at `now`: it was not running when
    /// they were due. Once a moment, whichever timers show it.
    fn late(&mut self, now: Millis) {
        if self.late_at != Some(now) {
            self.late_at = Some(now);
            self.health = (self.health + 1).min(HEALTH_MAX);
        }
    }

    /// Lifeguard's local health score (0 is healthy).
    pub(super) fn health(&self) -> u32 {
        self.health
    }

    /// How long SWIM's timer waits here: probes and suspicions stretched
    /// by this node's local health (see `HEALTH_MAX`). Stretching the
    /// probe period and the probe's round trip together keeps their order.
    fn stretched(&self, after: Duration, timer: &Timer<Ident>) -> Millis {
        let ms = after.as_millis() as Millis;
        match timer {
            Timer::ProbeRandomMember(_)
            | Timer::SendIndirectProbe { .. }
            | Timer::ChangeSuspectToDown { .. } => ms * (u64::from(self.health) + 1),
            _ => ms,
        }
    }

    /// Lifeguard's score, moved by what SWIM showed in the last call.
    fn weigh_health(&mut self) {
        let rt = &mut self.rt;
        self.heard |= rt.received > 0;
        let mut h = self.health;
        if !self.heard {
            h += rt.probes_failed;
        }
        if rt.pings > 0 {
            self.heard = false;
        }
        if let Some(inc) = rt.incarnation.take() {
            // Higher: this node refuted a suspicion of itself. Lower: it
            // took a new identity, which starts again from 0.
            if inc > self.incarnation {
                h += 1;
            }
            self.incarnation = inc;
        }
        self.health = h.saturating_sub(rt.acks).min(HEALTH_MAX);
        rt.probes_failed = 0;
        rt.acks = 0;
        rt.received = 0;
        rt.pings = 0;
    }

    /// Carries out what SWIM asked: packets out, timers set, members up and down.
    fn drain(&mut self, now: Millis, out: &mut Out) {
        let mut quiet = self.rt.quiet.take();
        for (i, (to, data)) in self.rt.to_send.drain(..).enumerate() {
            if quiet.as_ref().is_some_and(|(at, _)| *at == i) {
                out.quiet_swim(quiet.take().expect("just seen").1);
            }
            out.stats.swim_packets += 1;
            out.stats.swim_bytes += data.len() as u64;
            out.push(Action::Swim { to, data });
        }
        if let Some((_, q)) = quiet {
            out.quiet_swim(q);
        }
        // Taken for the loop and given back empty: nearly every drain sets
        // a timer, and a vector left without room grows anew at each.
        let mut timers = std::mem::take(&mut self.rt.to_schedule);
        let fired = self.gossip_fired.take();
        for (after, timer) in timers.drain(..) {
            self.timer_seq += 1;
            let gossip = matches!(timer, Timer::PeriodicGossip(_));
            let at = match fired {
                // The tick after one fired keeps its phase: the first
                // beat of it after now, however late this one was fired.
                Some((base, quiet)) if gossip => {
                    let every = (after.as_millis() as Millis).max(1);
                    let passed = (now - base) / every + 1;
                    // Each tick from `base` on that had no wake for it.
                    if self.skip_quiet && quiet && (self.quiet || now > base) {
                        out.stats.quiet_timers += passed;
                    }
                    base + every * passed
                }
                _ => now + self.stretched(after, &timer),
            };
            self.timers.insert((at, !gossip, self.timer_seq), timer);
        }
        self.rt.to_schedule = timers;
        self.weigh_health();
        let notes = std::mem::take(&mut self.rt.notes);
        if !notes.is_empty() {
            self.digest.set(None);
        }
        for n in notes {
            match n {
                OwnedNotification::Active => self.active = true,
                OwnedNotification::Idle
                | OwnedNotification::Defunct
                | OwnedNotification::Rejoin(_) => self.active = false,
                OwnedNotification::MemberUp(ident) => self.swim_up(ident.id),
                // A new life of a member declared dead here for its
                // silence: it restarted, and SWIM, which never saw it
                // down, says only this (no MemberUp).
                OwnedNotification::Rename(_, ident)
                    if self.member_set.contains(&ident.id)
                        || self.hidden.contains_key(&ident.id) =>
                {
                    self.swim_up(ident.id)
                }
                OwnedNotification::Rename(..) => {}
                OwnedNotification::MemberDown(ident) => {
                    if self
                        .hidden
                        .get(&ident.id)
                        .is_some_and(|h| h.life <= ident.life)
                    {
                        self.hidden.remove(&ident.id);
                    }
                    let newer = self
                        .get(ident.id)
                        .and_then(|m| m.ident())
                        .is_some_and(|i| i.life > ident.life);
                    if !newer && self.member_set.contains(&ident.id) {
                        self.down.push(ident.id);
                    }
                }
                // Lifeguard's signals, counted by `SwimRt` itself.
                _ => {}
            }
        }
        self.tune();
    }

    /// SWIM has `id` up: a member known to SWIM from now on, and new
    /// here if it was not a member.
    fn swim_up(&mut self, id: NodeId) {
        self.hidden.remove(&id);
        if self.member_set.contains(&id) {
            self.unknown.remove(&id);
        } else {
            self.admit(id, true);
            self.fresh.push(id);
        }
    }

    /// A member that was not one (known to SWIM, or only by a beat): no
    /// longer counted as gone, nor hidden.
    fn admit(&mut self, id: NodeId, swim: bool) {
        self.gone.remove(&id);
        self.hidden.remove(&id);
        if swim {
            self.unknown.remove(&id);
        } else {
            self.unknown.insert(id);
        }
        if self.members.insert(id) {
            self.loads += 1;
            self.member_set.insert(id);
            self.sum = self.sum.wrapping_add(member_hash(id));
            if self.low.len() < LOW || self.low.last().is_some_and(|&l| id < l) {
                let i = self.low.partition_point(|&l| l < id);
                self.low.insert(i, id);
                self.low.truncate(LOW);
            }
        }
    }

    /// Suspicion lasts longer, and updates are told more times, as the mesh
    /// grows: retuned when it doubles or halves.
    fn tune(&mut self) {
        let n = self.members.len() + 1;
        if n > 2 * self.tuned_for || 2 * n < self.tuned_for {
            self.tuned_for = n.max(4);
            let config = swim_config(n, self.dead_after_ms);
            self.suspect_after = config.suspect_to_down_after;
            // Only refuses changes of the probe period and rtt, which
            // swim_config keeps the same at every size.
            let _ = self.swim.set_config(config);
        }
    }

    // ----- members -----

    /// The live members, in id order.
    pub(super) fn iter(&self) -> impl Iterator<Item = Member<'_>> {
        self.members.iter().map(|&id| self.view(id))
    }

    fn view(&self, id: NodeId) -> Member<'_> {
        Member {
            id,
            heard: self.told.get(&id),
            known: !self.unknown.contains(&id),
            swim: &self.swim,
        }
    }

    /// The live members' ids, in order.
    pub(super) fn ids(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.members.iter().copied()
    }

    pub(super) fn get(&self, id: NodeId) -> Option<Member<'_>> {
        self.member_set.contains(&id).then(|| self.view(id))
    }

    /// `get(id)`'s beat, without the look at whether SWIM knows it: a
    /// worker asks for its coordinator's at every poll.
    pub(super) fn beat_of(&self, id: NodeId) -> Option<&Beat> {
        self.member_set
            .contains(&id)
            .then(|| self.told.get(&id).map_or(&*NO_BEAT, |h| &h.beat))
    }

    /// See `loads`.
    pub(super) fn loads(&self) -> u64 {
        self.loads
    }

    pub(super) fn contains(&self, id: NodeId) -> bool {
        self.member_set.contains(&id)
    }

    pub(super) fn len(&self) -> usize {
        self.members.len()
    }

    /// See [`super::Peer::members_sum`].
    pub(super) fn sum(&self) -> u64 {
        self.sum
    }

    pub(super) fn lowest(&self) -> Option<NodeId> {
        self.low.first().copied()
    }

    /// The lowest member other than `not` and `nor`: among the lowest
    /// three, since at most two are left out.
    pub(super) fn lowest_but(&self, not: NodeId, nor: Option<NodeId>) -> Option<NodeId> {
        self.low
            .iter()
            .copied()
            .find(|&m| m != not && Some(m) != nor)
    }

    /// The lowest members kept at hand are the lowest of the members, and
    /// the set asked holds as many as the ordered one (both change together).
    pub(super) fn check(&self) -> Result<(), String> {
        if self.member_set.len() != self.members.len() {
            return Err(format!(
                "{} members in the set asked, {} in order",
                self.member_set.len(),
                self.members.len()
            ));
        }
        if self.low.iter().eq(self.members.iter().take(LOW)) {
            Ok(())
        } else {
            Err(format!(
                "lowest members kept {:?}, the members' lowest {:?}",
                self.low,
                self.members.iter().take(LOW).collect::<Vec<_>>()
            ))
        }
    }

    /// When `id` was declared dead, if it was and has not come back.
    pub(super) fn gone_since(&self, id: NodeId) -> Option<Millis> {
        self.gone.get(&id).copied()
    }

    /// Whether `beat` from `from` says nothing its last one here did not:
    /// heard `Again` (a member, with the same resources), running the
    /// same stages (what the coordinator's counts split by).
    pub(super) fn hears_again(&self, from: NodeId, beat: &Beat) -> bool {
        self.member_set.contains(&from)
            && self
                .told
                .get(&from)
                .is_some_and(|h| h.beat.total == beat.total && h.beat.started == beat.started)
    }

    /// A member's beat, sent to this node.
    pub(super) fn heard(&mut self, now: Millis, from: NodeId, beat: Arc<Beat>) -> Heard {
        let was = self.member_set.contains(&from);
        if !was {
            let swim = self.hidden.contains_key(&from);
            self.admit(from, swim);
        }
        let load = |b: &Beat| (b.queued, b.prefetch);
        let (resized, reloaded) = match self.told.get(&from) {
            Some(h) => (h.beat.total != beat.total, load(&h.beat) != load(&beat)),
            None => (*beat.total != Resources::EMPTY, true),
        };
        if reloaded {
            self.loads += 1;
        }
        let told = BeatRecord {
            beat,
            last_seen: now,
            direct: true,
        };
        self.told.insert(from, told);
        if !was {
            Heard::New
        } else if resized {
            Heard::Resized
        } else {
            Heard::Again
        }
    }

    /// A member came up or SWIM declared one down since the peer last
    /// looked (`take_fresh`, `expired`): the peer looks in the same step,
    /// whatever brought it, rather than at its next wake, whose time
    /// depends on which timers wake it.
    pub(super) fn has_news(&self) -> bool {
        !self.fresh.is_empty() || self.down.iter().any(|id| self.member_set.contains(id))
    }

    /// Members that came up since the last call.
    pub(super) fn take_fresh(&mut self) -> Vec<NodeId> {
        let mut fresh = std::mem::take(&mut self.fresh);
        fresh.retain(|id| self.member_set.contains(id));
        fresh
    }

    /// Members to declare dead: those SWIM declared down, and those this
    /// node watches (`watch`: all it hears from directly, as coordinator,
    /// or one, its coordinator) silent longer than `limit`. Still listed
    /// until `remove`d, one at a time, so each death is handled with the
    /// others alive.
    pub(super) fn expired(&mut self, now: Millis, watch: Watch) -> Vec<NodeId> {
        self.down.retain(|id| self.member_set.contains(id));
        let mut dead = self.down.clone();
        let silent = |h: &BeatRecord, limit: Millis| now.saturating_sub(h.last_seen) > limit;
        let mut next = Millis::MAX;
        match watch {
            Watch::Direct(limit) => {
                // A worker silent past the limit that SWIM has alive and
                // unsuspected (it answers probes: it is slow, e.g. one of
                // hundreds of nodes starting at once, not dead) gets three
                // times as long; a dead one is suspected within a few
                // probes somewhere in the mesh, and its tasks go back as
                // soon as this node hears so.
                let mut silent_ones = Vec::new();
                for (&id, h) in self.told.iter().filter(|(_, h)| h.direct) {
                    if !silent(h, limit) {
                        next = next.min(h.last_seen + limit + 1);
                    } else if silent(h, 3 * limit) || !self.swim_trusts(id) {
                        if !dead.contains(&id) {
                            silent_ones.push(id);
                        }
                    } else {
                        // Looked at again then, or when SWIM says more.
                        next = next.min(h.last_seen + 3 * limit + 1);
                    }
                }
                // The map's order is arbitrary; deaths are handled in id order.
                silent_ones.sort_unstable();
                dead.extend(silent_ones);
            }
            Watch::One(id, limit) => {
                if let Some(h) = self.told.get(&id).filter(|h| h.direct) {
                    if !silent(h, limit) {
                        next = h.last_seen + limit + 1;
                    } else if !dead.contains(&id) {
                        dead.push(id);
                    }
                }
            }
            Watch::None => {}
        }
        self.silence = (next < Millis::MAX).then_some(next);
        self.watched = Some(watch);
        dead
    }

    /// When a member this node watches would first be silent too long,
    /// as the last look found them: a look then finds the death at that
    /// moment, not at whichever wake comes after it (a beat since then
    /// makes it a look that finds nothing).
    pub(super) fn next_silence(&self) -> Option<Millis> {
        self.silence
    }

    /// Whether whose silence this node judges, or how long it waits,
    /// changed since the last look (an election, the mesh's size, this
    /// node's health): looked at again in the same step.
    pub(super) fn watch_changed(&self, watch: Watch) -> bool {
        self.watched != Some(watch)
    }

    /// SWIM has `id` alive and does not suspect it.
    fn swim_trusts(&self, id: NodeId) -> bool {
        self.swim
            .member(&id)
            .is_some_and(|m| m.state() == foca::State::Alive)
    }

    /// `id` is dead from `now`.
    pub(super) fn remove(&mut self, now: Millis, id: NodeId) {
        if self.members.remove(&id) {
            self.loads += 1;
            self.member_set.remove(&id);
            if self.low.contains(&id) {
                self.low.clear();
                self.low.extend(self.members.iter().take(LOW));
            }
            let known = !self.unknown.remove(&id);
            self.told.remove(&id);
            self.sum = self.sum.wrapping_sub(member_hash(id));
            let swim_down = match self.down.iter().position(|&d| d == id) {
                Some(i) => {
                    self.down.swap_remove(i);
                    true
                }
                None => false,
            };
            let ident = self.swim.member(&id).map(|m| m.id().clone());
            if let Some(ident) = ident.filter(|_| known && !swim_down) {
                self.hidden.insert(id, ident);
            }
        }
        self.gone.insert(id, now);
    }

    /// This node stopped watching the members it declared dead for their
    /// silence (it no longer coordinates, or follows another coordinator):
    /// those SWIM still has alive are members again, as SWIM judges them.
    pub(super) fn unhide(&mut self) {
        for id in std::mem::take(&mut self.hidden).into_keys() {
            self.swim_up(id);
        }
    }

    /// This node starts watching afresh (it was elected): only members
    /// that report to it from now on count as silent when they stop.
    pub(super) fn unwatch_all(&mut self) {
        for h in self.told.values_mut() {
            h.direct = false;
        }
    }

    /// This node was not listening (stopped, or starved of CPU): every
    /// member counts as heard a heartbeat before `now`.
    pub(super) fn refresh(&mut self, now: Millis, heartbeat_ms: Millis) {
        for h in self.told.values_mut() {
            h.last_seen = h.last_seen.max(now.saturating_sub(heartbeat_ms));
        }
    }

    pub(super) fn next_beat(&self) -> Millis {
        self.next_beat
    }

    /// A look at the members is due at `now`: the next one is set.
    pub(super) fn beat_due(&mut self, now: Millis, heartbeat_ms: Millis) -> bool {
        if now < self.next_beat {
            return false;
        }
        // The most frequent timer that always wakes the node: a quiet
        // SWIM timer fired late is no sign of lateness, this is.
        if now > self.next_beat + LATE_MS {
            self.late(now);
        }
        self.next_beat = now + heartbeat_ms;
        true
    }

    /// The heartbeat due at `next_beat` had nothing to do (see
    /// `Peer::quiet_until`): the next one is a beat later, on its
    /// phase, and this one is no sign of lateness however late it fired.
    pub(super) fn beat_quiet(&mut self, heartbeat_ms: Millis, out: &mut Out) {
        self.next_beat += heartbeat_ms;
        self.count_quiet(out);
    }

    /// A heartbeat fired with the next input, having woken no one.
    pub(super) fn count_quiet(&self, out: &mut Out) {
        if self.skip_quiet {
            out.stats.quiet_timers += 1;
        }
    }

    /// When the next report to the coordinator is due.
    pub(super) fn next_report(&self) -> Millis {
        self.next_report
    }

    /// Whether timers with nothing to do wake no one (all are stepped
    /// with `Config::step_upkeep`).
    pub(super) fn skips_quiet(&self) -> bool {
        self.skip_quiet
    }

    /// Nothing for the heartbeat's look at the members to do: SWIM counts
    /// this node in, no member is known only by a beat or hidden, none
    /// came up or went down unhandled, and the last look watched no one.
    pub(super) fn quiet_look(&self) -> bool {
        self.quiet_look_watching(Watch::None)
    }

    /// `quiet_look`, for a node whose last look watched as `watch` does
    /// (the coordinator its workers: the silence timer wakes it for the
    /// first that could be silent).
    pub(super) fn quiet_look_watching(&self, watch: Watch) -> bool {
        self.active
            && self.unknown.is_empty()
            && self.hidden.is_empty()
            && self.fresh.is_empty()
            && self.down.is_empty()
            && self.watched == Some(watch)
    }

    /// A report to the coordinator is due at `now`, one every `interval`.
    pub(super) fn report_due(&mut self, now: Millis, interval: Millis) -> bool {
        if now < self.next_report {
            return false;
        }
        self.next_report = now + interval;
        true
    }

    pub(super) fn advertised(&self) -> u32 {
        self.advertised
    }

    pub(super) fn advertise(&mut self, queued: u32) {
        self.advertised = queued;
    }

    /// The report the driver sends for this node, if it does.
    pub(super) fn promise(&self) -> Option<Promise> {
        self.promise
    }

    pub(super) fn set_promise(&mut self, promise: Option<Promise>) {
        self.promise = promise;
    }

    /// The heartbeat whose report the driver sent fired with a later
    /// input: the next beat and report are set as its wake would have set
    /// them, the queue length it told is the one advertised, and the
    /// report counts as this node's message.
    pub(super) fn report_sent(&mut self, heartbeat_ms: Millis, queued: u32, out: &mut Out) {
        let Some(p) = self.promise.take() else {
            return;
        };
        self.next_beat = p.at + heartbeat_ms;
        self.next_report = p.next;
        self.advertised = queued;
        out.stats.messages += 1;
    }
}

/// A worker's heartbeat whose only work is its report to the coordinator,
/// which the driver sends for it at that moment (`Peer::poll_promise`);
/// the heartbeat fires with the node's next input, without sending it.
/// It holds until an input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Promise {
    /// When the heartbeat is due.
    pub(super) at: Millis,
    /// The next report it sets.
    pub(super) next: Millis,
    /// The first heartbeat after it that may do something: every one
    /// before is quiet, that one but for its report.
    pub(super) loud: Millis,
}

/// What a beat told of its sender.
pub(super) enum Heard {
    /// It is new here (it joined, or came back).
    New,
    /// Its resources are not what this node knew (its first beat after
    /// SWIM told of it).
    Resized,
    Again,
}

/// Whose silence this node takes as a death.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Watch {
    /// The coordinator: every member that reports to it.
    Direct(Millis),
    /// A worker: its coordinator.
    One(NodeId, Millis),
    None,
}

/// One member's part of a roster digest (a sum, so the order of members
/// does not matter): its id and life, mixed.
fn roster_hash(i: &Ident) -> u64 {
    mix(i.id.0 ^ i.life.rotate_left(32))
}

/// A node's part of [`super::Peer::members_sum`].
pub fn member_hash(id: NodeId) -> u64 {
    mix(id.0)
}

/// splitmix64's finaliser.
fn mix(x: u64) -> u64 {
    let mut z = x ^ 0x9e37_79b9_7f4a_7c15;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// How often a node reports to its coordinator in a mesh of `size`: every
/// `report_ms` up to 10 nodes and every two past that (the first steps of
/// Dask's `heartbeat_interval`, 0.5 s up to 10 workers, 1 s past), and
/// once the coordinator would hear more than `reports_per_s` beats a
/// second so, stretched (as Dask's scheduler stretches its workers'
/// heartbeats). Never more often than the heartbeat.
pub(super) fn report_interval(cfg: &Config, size: usize) -> Millis {
    let per_s = cfg.reports_per_s.max(1);
    let step = if size <= 10 { 1 } else { 2 };
    (cfg.report_ms * step)
        .max(cfg.heartbeat_ms)
        .max(size as u64 * 1000 / per_s)
}

/// The silence after which the coordinator of a mesh of `size` calls a
/// worker that reports to it dead: three of its reports, at least
/// `dead_after_ms` (before local health stretches it).
pub(super) fn silence_limit(cfg: &Config, size: usize) -> Millis {
    cfg.dead_after_ms.max(3 * report_interval(cfg, size))
}

/// The beat of a member known only by SWIM: nothing of its resources or
/// whom it follows until it says so itself.
static NO_BEAT: LazyLock<Beat> = LazyLock::new(|| Beat {
    roster: 0,
    health: 0,
    late_cores: 0,
    late_gpus: 0,
    files_max: 0,
    idle: true,
    claimed: Vec::new(),
    clock: 0,
    seen: 0,
    gpus: Vec::new(),
    machine: None,
    version: PROTOCOL_VERSION,
    label: String::new(),
    addrs: Vec::new(),
    term: 0,
    coordinator: None,
    total: Arc::new(Resources::EMPTY),
    used: Arc::new(Resources::EMPTY),
    queued: 0,
    running: 0,
    started: Arc::new([]),
    backlog: 0,
    prefetch: 0,
    job: None,
    ends_in_ms: None,
    allocs: (0, 0),
    ask: false,
    interval_ms: 0,
    victims: Arc::new([]),
});

mod quiet;
#[cfg(test)]
mod tests;
