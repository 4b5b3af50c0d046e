//! Which of a peer's timers are due at a moment: what a driver that accounts for its wakes (the simulator's speed line) reads before it calls `handle_timeout`.

/// A peer's timers, as [`TimersDue`] names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimerKind {
    /// The heartbeat: members judged, an election round, a report if due.
    Heartbeat,
    /// Resends: a busy worker's claims, fetches and redos.
    Resend,
    /// The coordinator's progress round to the farms' holders.
    Progress,
    /// SWIM's probe of the next member.
    Probe,
    /// SWIM's indirect probe, if the direct one went unanswered.
    IndirectProbe,
    /// SWIM's gossip tick.
    Gossip,
    /// SWIM's announce to a random (or a down) member.
    Announce,
    /// A member watched for its silence would be silent too long now.
    Silence,
    /// A suspected member declared down.
    Suspicion,
    /// A down member forgotten.
    ForgetDown,
    /// A task's own timer on its worker.
    Task,
    /// A steal that got no answer given up.
    Steal,
    /// The coordinator's wait to hear what its members hold ends.
    Settle,
    /// The allocation queues' next look at the batch system.
    Allocation,
}

impl TimerKind {
    /// Every kind, each at the index of its discriminant.
    pub const ALL: [TimerKind; 14] = [
        TimerKind::Heartbeat,
        TimerKind::Resend,
        TimerKind::Progress,
        TimerKind::Probe,
        TimerKind::IndirectProbe,
        TimerKind::Gossip,
        TimerKind::Announce,
        TimerKind::Silence,
        TimerKind::Suspicion,
        TimerKind::ForgetDown,
        TimerKind::Task,
        TimerKind::Steal,
        TimerKind::Settle,
        TimerKind::Allocation,
    ];

    /// As the speed line says it.
    pub fn name(self) -> &'static str {
        match self {
            TimerKind::Heartbeat => "heartbeat",
            TimerKind::Resend => "resend",
            TimerKind::Progress => "progress",
            TimerKind::Probe => "probe",
            TimerKind::IndirectProbe => "indirect probe",
            TimerKind::Gossip => "gossip",
            TimerKind::Announce => "announce",
            TimerKind::Silence => "silence",
            TimerKind::Suspicion => "suspicion",
            TimerKind::ForgetDown => "forget down",
            TimerKind::Task => "task timer",
            TimerKind::Steal => "steal",
            TimerKind::Settle => "settle",
            TimerKind::Allocation => "allocation",
        }
    }

    /// Upkeep: fired on a period whatever happens, changing nothing while
    /// nothing else changes; not the end of something that happened (a
    /// suspicion, a task's own timer, a steal or a batch job waited on).
    fn upkeep(self) -> bool {
        !matches!(
            self,
            TimerKind::Suspicion
                | TimerKind::ForgetDown
                | TimerKind::Task
                | TimerKind::Steal
                | TimerKind::Settle
                | TimerKind::Allocation
        )
    }
}

/// A set of a peer's timers, as [`Peer::timers_due`](super::Peer::timers_due) finds them due.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TimersDue(u16);

impl TimersDue {
    pub(super) fn add(&mut self, t: TimerKind) {
        self.0 |= 1 << t as u16;
    }

    fn has(&self, t: TimerKind) -> bool {
        self.0 & (1 << t as u16) != 0
    }

    /// Every timer due is upkeep: the wake changes nothing that anything
    /// else did not.
    pub fn only_upkeep(&self) -> bool {
        TimerKind::ALL.iter().all(|&t| t.upkeep() || !self.has(t))
    }

    /// The first timer due, in [`TimerKind::ALL`]'s order: what the wake
    /// is counted as. None: the wake was for a timer since moved.
    pub fn first(&self) -> Option<TimerKind> {
        (self.0 != 0).then(|| TimerKind::ALL[self.0.trailing_zeros() as usize])
    }
}

impl From<&foca::Timer<super::Ident>> for TimerKind {
    fn from(t: &foca::Timer<super::Ident>) -> TimerKind {
        match t {
            foca::Timer::ProbeRandomMember(_) => TimerKind::Probe,
            foca::Timer::SendIndirectProbe { .. } => TimerKind::IndirectProbe,
            foca::Timer::ChangeSuspectToDown { .. } => TimerKind::Suspicion,
            foca::Timer::PeriodicAnnounce(_) | foca::Timer::PeriodicAnnounceDown(_) => {
                TimerKind::Announce
            }
            foca::Timer::PeriodicGossip(_) => TimerKind::Gossip,
            foca::Timer::RemoveDown(_) => TimerKind::ForgetDown,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wake_for_a_suspicion_is_not_upkeep_and_one_for_the_heartbeat_alone_is() {
        let mut due = TimersDue::default();
        assert_eq!(due.first(), None);
        due.add(TimerKind::Gossip);
        due.add(TimerKind::Heartbeat);
        assert!(due.only_upkeep());
        assert_eq!(due.first().map(TimerKind::name), Some("heartbeat"));
        due.add(TimerKind::Suspicion);
        assert!(!due.only_upkeep());
        for (i, t) in TimerKind::ALL.iter().enumerate() {
            assert_eq!(*t as usize, i, "{t:?} out of place in ALL");
        }
    }
}
