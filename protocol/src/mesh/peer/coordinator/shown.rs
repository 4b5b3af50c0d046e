//! A farm's counts per stage as its holders show them, kept by the coordinator over the stages that may still change, and sent to each holder as what changed since the version it acknowledged.
//!
//! An open farm that Python grows by a batch at a time has a stage or two
//! per batch: thousands, nearly all settled. Each sync used to build every
//! stage's counts and send them whole to every holder, which copied them
//! into its view, so a growth cost the farm's size several times over.

use crate::engine::{Counts, Engine, FarmSlot};
use crate::mesh::StageCounts;

/// What the holders of one farm are shown.
#[derive(Default)]
pub(super) struct Shown {
    /// Each stage's counts, tasks handed out and not yet started where
    /// they went counted queued (see `Coord::shown_counts`).
    stages: StageCounts,
    /// Their sum.
    sum: Counts,
}

impl Shown {
    /// Brought up to what the engine says, `started(s)` of stage `s`'s
    /// tasks started where they went: only the stages that may have
    /// changed since are looked at (see `Engine::live_counts`).
    pub(super) fn refresh(
        &mut self,
        engine: &mut Engine,
        slot: FarmSlot,
        started: impl Fn(u32) -> u64,
    ) {
        engine.live_counts(slot, |s, c| {
            let mut c = c.clone();
            c.split_started(started(s));
            if let Some(was) = self.stages.set(s as usize, c.clone()) {
                self.sum.sub(&was);
                self.sum.add(&c);
            }
        });
    }

    /// The farm's counts, summed over its stages.
    pub(super) fn sum(&self) -> &Counts {
        &self.sum
    }

    /// Each stage's counts, in stage order.
    pub(super) fn stages(&self) -> &[Counts] {
        &self.stages
    }

    pub(super) fn version(&self) -> u64 {
        self.stages.version()
    }

    /// The stages whose counts changed after version `since`, each with
    /// its counts now (from 0: every stage that has counts at all; a
    /// stage of no task is as a holder makes it).
    pub(super) fn since(&self, since: u64) -> Vec<(u32, Counts)> {
        self.stages
            .since(since)
            .map(|s| (s, self.stages[s as usize].clone()))
            .collect()
    }
}
