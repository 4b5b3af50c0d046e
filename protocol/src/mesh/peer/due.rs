//! Which of a peer's timers are due at a moment: what a driver that accounts for its wakes (the simulator's speed line) reads before it calls `handle_timeout`.

/// A set of a peer's timers, as [`Peer::timers_due`](super::Peer::timers_due) finds them due.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TimersDue(u16);

/// Each timer: its name, and whether it is upkeep (fired on a period
/// whatever happens, changing nothing while nothing else changes) rather
/// than the end of something that happened (a suspicion, a task's own
/// timer, a steal or a batch job waited on).
const TIMERS: [(&str, bool); 12] = [
    ("heartbeat", true),
    ("resend", true),
    ("progress", true),
    ("probe", true),
    ("indirect probe", true),
    ("gossip", true),
    ("announce", true),
    ("suspicion", false),
    ("forget down", false),
    ("task timer", false),
    ("steal", false),
    ("allocation", false),
];

/// The timers by name, in the order of [`TimersDue::first`]'s index.
pub const TIMER_NAMES: [&str; 12] = {
    let mut names = [""; 12];
    let mut i = 0;
    while i < TIMERS.len() {
        names[i] = TIMERS[i].0;
        i += 1;
    }
    names
};

/// The timers [`TimersDue`] names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Timer {
    Heartbeat,
    Resend,
    Progress,
    Probe,
    IndirectProbe,
    Gossip,
    Announce,
    Suspicion,
    ForgetDown,
    Task,
    Steal,
    Allocation,
}

impl TimersDue {
    pub(super) fn add(&mut self, t: Timer) {
        self.0 |= 1 << t as u16;
    }

    /// None is due (the wake was for a timer since moved).
    pub fn is_empty(&self) -> bool {
        self.0 == 0
    }

    /// Every timer due is upkeep: the wake changes nothing that anything
    /// else did not.
    pub fn only_upkeep(&self) -> bool {
        TIMERS
            .iter()
            .enumerate()
            .all(|(i, (_, upkeep))| *upkeep || self.0 & (1 << i) == 0)
    }

    /// The first timer due, as an index into [`TIMER_NAMES`]: what the
    /// wake is counted as.
    pub fn first(&self) -> Option<usize> {
        (self.0 != 0).then(|| self.0.trailing_zeros() as usize)
    }
}

impl From<&foca::Timer<super::Ident>> for Timer {
    fn from(t: &foca::Timer<super::Ident>) -> Timer {
        match t {
            foca::Timer::ProbeRandomMember(_) => Timer::Probe,
            foca::Timer::SendIndirectProbe { .. } => Timer::IndirectProbe,
            foca::Timer::ChangeSuspectToDown { .. } => Timer::Suspicion,
            foca::Timer::PeriodicAnnounce(_) | foca::Timer::PeriodicAnnounceDown(_) => {
                Timer::Announce
            }
            foca::Timer::PeriodicGossip(_) => Timer::Gossip,
            foca::Timer::RemoveDown(_) => Timer::ForgetDown,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wake_for_a_suspicion_is_not_upkeep_and_one_for_the_heartbeat_alone_is() {
        let mut due = TimersDue::default();
        assert!(due.is_empty() && due.first().is_none());
        due.add(Timer::Gossip);
        due.add(Timer::Heartbeat);
        assert!(due.only_upkeep());
        assert_eq!(due.first().map(|i| TIMER_NAMES[i]), Some("heartbeat"));
        due.add(Timer::Suspicion);
        assert!(!due.only_upkeep());
        assert_eq!(TIMER_NAMES[Timer::Allocation as usize], "allocation");
    }
}
