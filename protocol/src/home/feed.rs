//! In what order a follower of a farm is told its tasks: each once, a done one only once its outputs are home, those still waiting in task order when the farm is over, and as failed those of stages that fit no node and those an open farm's stage will not run.

use std::collections::HashSet;

use crate::farm::TaskRef;

/// What one follower has been told of a farm, and what it waits for.
#[derive(Clone, Debug, Default)]
pub struct Told {
    /// How far the farm's log has been read for it.
    pub read: u64,
    /// Tasks said, a bit each, per stage.
    said: Vec<Vec<u64>>,
    /// Done tasks whose outputs are not home yet.
    waiting: HashSet<TaskRef>,
    /// Stages whose tasks without an entry in the log are said failed, of
    /// each kind, and the index from which they are still to be said.
    rest: Vec<(Rest, u32, u32)>,
}

/// Why the tasks of a stage that have no entry in the log are said failed
/// ([`Told::rest`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rest {
    /// The stage fits no node.
    Unplaced,
    /// An open farm's stage has nothing left to run and every task of it
    /// that ended is in the log: the rest were skipped, cancelled or
    /// stopped, and an open farm is never over, which alone would tell them.
    Unrun,
}

/// What the log says of a task a follower reads, as far as the feed cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seen {
    /// Done, its outputs home (`home`) or not yet.
    Done {
        /// Its outputs are in the home's folder.
        home: bool,
    },
    /// Failed for good.
    Failed,
    /// Neither (a later entry says more).
    Open,
}

impl Told {
    /// Room to mark said the tasks of a farm's `stages`, stage `s` of
    /// `len(s)` tasks: those of an open farm's stages added since the
    /// follower came too. Only the stages past those fitted before are
    /// asked their length: a growth costs what it adds, not the farm.
    pub fn fit(&mut self, stages: usize, len: impl Fn(usize) -> u32) {
        for s in self.said.len()..stages {
            self.said.push(vec![0; (len(s) as usize).div_ceil(64)]);
        }
    }

    /// Marks `t` said; false when it was already, or the farm has no `t`.
    pub fn say_once(&mut self, t: TaskRef) -> bool {
        mark(&mut self.said, t)
    }

    /// Whether `t` was said.
    pub fn said(&self, t: TaskRef) -> bool {
        self.said
            .get(t.stage as usize)
            .and_then(|s| s.get(t.index as usize / 64))
            .is_some_and(|w| w & (1u64 << (t.index % 64)) != 0)
    }

    /// Task `t`'s outputs came home (`home`: they are there now): whether
    /// to tell it now.
    pub fn came_home(&mut self, t: TaskRef, home: bool) -> bool {
        home && self.waiting.remove(&t) && self.say_once(t)
    }

    /// An entry of the log for `t` read, the log saying `seen` of it now:
    /// whether to tell it now. A done task whose outputs are not home
    /// waits for them.
    pub fn read_entry(&mut self, t: TaskRef, seen: Seen) -> bool {
        if self.said(t) {
            return false;
        }
        match seen {
            Seen::Done { home: false } => {
                self.waiting.insert(t);
                false
            }
            Seen::Done { home: true } | Seen::Failed => {
                self.waiting.remove(&t);
                self.say_once(t);
                true
            }
            Seen::Open => false,
        }
    }

    /// The farm is over and every output is home: the tasks still waiting
    /// to tell, in task order, as many as `room` places take while one is
    /// kept for the end; and whether the end is told after them (nothing
    /// waits any more, and a place is left).
    pub fn last(&mut self, mut room: usize) -> (Vec<TaskRef>, bool) {
        let mut last: Vec<TaskRef> = self.waiting.iter().copied().collect();
        last.sort_unstable();
        let mut tell = Vec::new();
        for t in last {
            if room <= 1 {
                break;
            }
            self.waiting.remove(&t);
            if self.say_once(t) {
                tell.push(t);
                room -= 1;
            }
        }
        (tell, self.waiting.is_empty() && room >= 1)
    }

    /// The tasks of `which` stages (each with its length, `None` for a
    /// stage the farm does not have) to tell failed, those without an
    /// entry in the log (`in_log`), as many as `room` places take while
    /// `keep_free` stay free; and whether all were (false: the rest later,
    /// from where this stopped).
    pub fn rest(
        &mut self,
        which: Rest,
        stages: &[(u32, Option<u32>)],
        mut room: usize,
        keep_free: usize,
        in_log: impl Fn(TaskRef) -> bool,
    ) -> (Vec<TaskRef>, bool) {
        let mut tell = Vec::new();
        for &(stage, len) in stages {
            let at = match self
                .rest
                .iter()
                .position(|&(w, s, _)| (w, s) == (which, stage))
            {
                Some(i) => i,
                None => {
                    self.rest.push((which, stage, 0));
                    self.rest.len() - 1
                }
            };
            let Some(len) = len else {
                continue;
            };
            let mut i = self.rest[at].2;
            while i < len {
                if room <= keep_free {
                    self.rest[at].2 = i;
                    return (tell, false);
                }
                let t = TaskRef::new(stage, i);
                if !in_log(t) && mark(&mut self.said, t) {
                    tell.push(t);
                    room -= 1;
                }
                i += 1;
            }
            self.rest[at].2 = i;
        }
        (tell, true)
    }

    /// Whether every task of `stage` (of `len`) was looked at by
    /// [`Told::rest`] for `which`.
    pub fn rest_told(&self, which: Rest, stage: u32, len: u32) -> bool {
        self.rest
            .iter()
            .any(|&(w, s, i)| (w, s) == (which, stage) && i >= len)
    }

    /// Done tasks waiting for their outputs.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }
}

/// Marks `t` in `said`; false when it was already, or there is no `t`.
fn mark(said: &mut [Vec<u64>], t: TaskRef) -> bool {
    let Some(word) = said
        .get_mut(t.stage as usize)
        .and_then(|s| s.get_mut(t.index as usize / 64))
    else {
        return false;
    };
    let bit = 1u64 << (t.index % 64);
    let fresh = *word & bit == 0;
    *word |= bit;
    fresh
}
