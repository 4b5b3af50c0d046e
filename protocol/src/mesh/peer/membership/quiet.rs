//! SWIM's quiet probe round in closed form: a probe started, answered and acknowledged as its packets would be, with none built, for the simulator (`Config::quiet_swim`), which must leave each node as stepping the packets would.
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

/// A ping or an ack that carries nothing but itself, not built.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuietSwim {
    /// Who sent it.
    pub from: Ident,
    /// The sender's incarnation, as the packet carries it.
    pub incarnation: u16,
    /// Whom it is for.
    pub to: Ident,
    /// A ping; else the ack of one.
    pub ping: bool,
    /// The probe's number.
    pub number: u8,
    /// Its size on the wire, as built.
    pub len: usize,
}

impl QuietSwim {
    fn header(&self) -> Header<Ident> {
        Header {
            src: self.from.clone(),
            src_incarnation: self.incarnation,
            dst: self.to.clone(),
            message: if self.ping {
                Message::Ping(self.number)
            } else {
                Message::Ack(self.number)
            },
        }
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
            let ping = self.quiet_packet_to(to, true, number);
            self.rt.quiet = Some((at, ping));
        }
    }

    /// A quiet packet of this node's to `to`, its size counted.
    fn quiet_packet_to(&mut self, to: Ident, ping: bool, number: u8) -> QuietSwim {
        let mut q = QuietSwim {
            from: self.swim.identity().clone(),
            incarnation: self.swim.incarnation(),
            to,
            ping,
            number,
            len: 0,
        };
        // Never fails: foca encoded these identities before.
        q.len = self.swim.quiet_packet_len(&q.header()).unwrap_or(0);
        q
    }

    /// Whether `q` reaching this node would be taken in closed form:
    /// addressed to this very identity, from an active member known at
    /// the incarnation it carries, with nothing to tell back.
    pub(in crate::mesh::peer) fn takes_quietly(&self, q: &QuietSwim) -> bool {
        q.to == *self.swim.identity()
            && self.swim.nothing_to_tell()
            && self.swim.knows_active(&q.from, q.incarnation)
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
        if q.ping {
            self.swim
                .quiet_answer(&q.from, q.incarnation, q.number, &mut self.rt);
            let ack = self.quiet_packet_to(q.from.clone(), false, q.number);
            self.rt.quiet = Some((self.rt.to_send.len(), ack));
        } else {
            self.swim
                .quiet_ack(&q.from, q.incarnation, q.number, &mut self.rt);
        }
        self.drain(now, out);
        true
    }

    /// The packet `q` stands for: the bytes SWIM would have sent.
    pub(in crate::mesh::peer) fn packet(&mut self, q: &QuietSwim) -> Vec<u8> {
        self.swim.quiet_packet(&q.header()).unwrap_or_default()
    }
}
