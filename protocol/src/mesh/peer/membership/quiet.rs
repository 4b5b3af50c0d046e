//! SWIM's quiet round in closed form: a probe started, answered and acknowledged, and an announce's feed, as their packets would be, with none built, for the simulator (`Config::quiet_swim`), which must leave each node as stepping the packets would.
//!
//! A packet is quiet where it carries nothing but itself: its sender has
//! nothing to gossip, and its receiver knows the sender active at the
//! incarnation it carries (it learns nothing from it). The probe timer,
//! the ping's arrival and the ack's each leave the node as the packet's
//! step does: the same timers at the same times and in the same order,
//! the same draws of foca's generator, Lifeguard's counts, the packet in
//! `Out`'s stats. The driver counts its bytes and draws its latency as
//! for any packet; a packet its receiver cannot take so is built
//! (`packet`) and delivered as any other.

use foca::Header;

use super::*;

/// A ping, an ack or a feed that carries nothing its receiver would not
/// know, not built.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuietSwim {
    /// Who sent it.
    pub from: Ident,
    /// The sender's incarnation, as the packet carries it.
    pub incarnation: u16,
    /// Whom it is for.
    pub to: Ident,
    /// What it is.
    pub packet: Quiet,
    /// Its size on the wire, as built.
    pub len: usize,
}

/// Which packet a [`QuietSwim`] stands for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Quiet {
    /// A probe's ping, with the probe's number.
    Ping(u8),
    /// The ack of a probe's ping.
    Ack(u8),
    /// The answer to an announce: the members it lists, in order.
    Feed(Vec<RosterEntry>),
}

/// The most members for which sizes are kept (`QuietLen`): a record per
/// member on every node grows as the square of the mesh (1,000 nodes
/// kept a million, 20 MB), where a probe round is a small part of the
/// run; in a mesh of long tasks on tens of nodes it is a large one.
const QUIET_LENS_MAX: usize = 64;

/// The size of a quiet ping and of a quiet ack between two identities,
/// the sender at an incarnation: counted by encoding the header, a third
/// of a quiet probe round's own work, and the same for every round
/// between them (a probe number is one byte).
pub(super) struct QuietLen {
    from: Ident,
    to: Ident,
    incarnation: u16,
    /// A ping's, then an ack's, once counted.
    len: [Option<usize>; 2],
}

impl QuietLen {
    /// A record for `q`'s two identities and incarnation, nothing counted.
    fn of(q: &QuietSwim) -> QuietLen {
        QuietLen {
            from: q.from.clone(),
            to: q.to.clone(),
            incarnation: q.incarnation,
            len: [None; 2],
        }
    }

    /// Whether this record's sizes are `q`'s: the same identities and
    /// incarnation.
    fn sizes(&self, q: &QuietSwim) -> bool {
        self.from == q.from && self.to == q.to && self.incarnation == q.incarnation
    }
}

impl QuietSwim {
    fn header(&self) -> Header<Ident> {
        Header {
            src: self.from.clone(),
            src_incarnation: self.incarnation,
            dst: self.to.clone(),
            message: match self.packet {
                Quiet::Ping(n) => Message::Ping(n),
                Quiet::Ack(n) => Message::Ack(n),
                Quiet::Feed(_) => Message::Feed,
            },
        }
    }

    /// An ack of a probe.
    pub fn is_ack(&self) -> bool {
        matches!(self.packet, Quiet::Ack(_))
    }

    /// A probe's ping.
    pub fn is_ping(&self) -> bool {
        matches!(self.packet, Quiet::Ping(_))
    }
}

impl Membership {
    /// SWIM sends packets in closed form where it can.
    pub(in crate::mesh::peer) fn set_quiet_swim(&mut self, on: bool) {
        self.quiet_swim = on;
    }

    /// The probe timer, fired: where the probe before was answered and
    /// there is nothing to gossip, the probe starts with its ping in
    /// closed form, in its place among the packets sent.
    pub(super) fn probe_timer(&mut self, timer: Timer<Ident>) {
        // A timer of an old identity does nothing: foca sees to that.
        if !(self.quiet_swim && self.swim.is_current(&timer) && self.swim.probe_is_quiet()) {
            let _ = self.swim.handle_timer(timer, &mut self.rt);
            return;
        }
        let at = self.rt.to_send.len();
        if let Some((to, number)) = self.swim.quiet_probe(&mut self.rt) {
            let ping = self.quiet_packet_to(to, Quiet::Ping(number));
            self.rt.quiet = Some((at, ping));
        }
    }

    /// SWIM takes a packet; an announce is answered with its feed in
    /// closed form where no other closed packet waits in this step.
    pub(super) fn swim_data(&mut self, data: &[u8]) {
        self.swim
            .set_quiet_feeds(self.quiet_swim && self.rt.quiet.is_none());
        let at = self.rt.to_send.len();
        // A packet from an old life, of another mesh, or garbled: nothing
        // to do (SWIM expects loss).
        let _ = self.swim.handle_data(data, &mut self.rt);
        if let Some(feed) = self.swim.take_quiet_feed() {
            let q = QuietSwim {
                from: self.swim.identity().clone(),
                incarnation: feed.incarnation,
                to: feed.dst,
                packet: Quiet::Feed(feed.members),
                len: feed.len,
            };
            self.rt.quiet = Some((at, q));
        }
    }

    /// A quiet ping or ack of this node's to `to`, its size counted.
    fn quiet_packet_to(&mut self, to: Ident, packet: Quiet) -> QuietSwim {
        let mut q = QuietSwim {
            from: self.swim.identity().clone(),
            incarnation: self.swim.incarnation(),
            to,
            packet,
            len: 0,
        };
        let slot = usize::from(q.is_ack());
        let kept = self
            .quiet_lens
            .get(&q.to.id)
            .filter(|l| l.sizes(&q))
            .and_then(|l| l.len[slot]);
        // Never fails: foca encoded these identities before.
        let count = |m: &mut Self, q: &QuietSwim| m.swim.quiet_packet_len(&q.header()).unwrap_or(0);
        if let Some(len) = kept {
            debug_assert_eq!(len, count(self, &q));
            q.len = len;
        } else if self.len() > QUIET_LENS_MAX {
            // A large mesh's probes go round many members, each seldom:
            // counted each time, with no record per member per node.
            self.quiet_lens.clear();
            q.len = count(self, &q);
        } else {
            q.len = count(self, &q);
            let l = self
                .quiet_lens
                .entry(q.to.id)
                .or_insert_with(|| QuietLen::of(&q));
            if !l.sizes(&q) {
                *l = QuietLen::of(&q);
            }
            l.len[slot] = Some(q.len);
        }
        q
    }

    /// Whether `q` reaching this node would be taken in closed form:
    /// addressed to this very identity, from an active member known at
    /// the incarnation it carries, with nothing to tell back.
    pub(in crate::mesh::peer) fn takes_quietly(&self, q: &QuietSwim) -> bool {
        q.to == *self.swim.identity()
            && match &q.packet {
                Quiet::Ping(_) | Quiet::Ack(_) => {
                    self.swim.nothing_to_tell() && self.swim.knows_active(&q.from, q.incarnation)
                }
                // Answered by nothing: this node's own news stays to tell.
                Quiet::Feed(members) => {
                    self.swim
                        .takes_nothing_from_feed(&q.from, q.incarnation, members)
                }
            }
    }

    /// `q` reaches this node at `now` and is taken as
    /// [`handle_swim`](Self::handle_swim) takes the packet, a ping
    /// answered with its ack in closed form; false, and nothing changed,
    /// where it cannot be ([`takes_quietly`](Self::takes_quietly)).
    pub(in crate::mesh::peer) fn quiet_swim_in(
        &mut self,
        now: Millis,
        q: &QuietSwim,
        out: &mut Out,
    ) -> bool {
        if !self.takes_quietly(q) {
            return false;
        }
        match q.packet {
            Quiet::Ping(number) => {
                self.swim
                    .quiet_answer(&q.from, q.incarnation, number, &mut self.rt);
                let ack = self.quiet_packet_to(q.from.clone(), Quiet::Ack(number));
                self.rt.quiet = Some((self.rt.to_send.len(), ack));
            }
            Quiet::Ack(number) => {
                self.swim
                    .quiet_ack(&q.from, q.incarnation, number, &mut self.rt);
            }
            Quiet::Feed(_) => self
                .swim
                .quiet_feed_in(&q.from, q.incarnation, &mut self.rt),
        }
        self.drain(now, out);
        true
    }

    /// The packet `q` stands for: the bytes SWIM would have sent.
    pub(in crate::mesh::peer) fn packet(&mut self, q: &QuietSwim) -> Vec<u8> {
        let built = match &q.packet {
            Quiet::Feed(members) => self.swim.quiet_feed_packet(&q.header(), members),
            Quiet::Ping(_) | Quiet::Ack(_) => self.swim.quiet_packet(&q.header()),
        };
        built.unwrap_or_default()
    }
}
