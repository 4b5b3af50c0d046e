//! A farm's counts per stage as its holders show them, kept by the coordinator over the stages that may still change, and sent to each holder as what changed since the version it acknowledged.
//!
//! An open farm that Python grows by a batch at a time has a stage or two
//! per batch: thousands, nearly all settled. Each sync used to build every
//! stage's counts and send them whole to every holder, which copied them
//! into its view, so a growth cost the farm's size several times over.

use std::collections::BTreeMap;

use crate::engine::{Counts, Engine, FarmSlot};

/// What the holders of one farm are shown.
#[derive(Default)]
pub(super) struct Shown {
    /// Each stage's counts, in stage order, tasks handed out and not yet
    /// started where they went counted queued (see `Coord::shown_counts`).
    stages: Vec<Counts>,
    /// Their sum.
    sum: Counts,
    /// Counts up with every stage whose counts change.
    version: u64,
    /// The version each stage's counts last changed at, and the stages
    /// by it (each stage under its latest only).
    at: Vec<u64>,
    by_version: BTreeMap<u64, u32>,
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
        let n = engine.stage_count(slot);
        if self.stages.len() < n {
            self.stages.resize(n, Counts::default());
            self.at.resize(n, 0);
        }
        engine.live_counts(slot, |s, c| {
            let mut c = c.clone();
            c.split_started(started(s));
            let i = s as usize;
            if self.stages[i] == c {
                return;
            }
            self.sum.sub(&self.stages[i]);
            self.sum.add(&c);
            self.stages[i] = c;
            self.version += 1;
            self.by_version.remove(&self.at[i]);
            self.at[i] = self.version;
            self.by_version.insert(self.version, s);
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
        self.version
    }

    /// The stages whose counts changed after version `since`, each with
    /// its counts now (from 0: every stage that has counts at all; a
    /// stage of no task is as a holder makes it).
    pub(super) fn since(&self, since: u64) -> Vec<(u32, Counts)> {
        self.by_version
            .range(since + 1..)
            .map(|(_, &s)| (s, self.stages[s as usize].clone()))
            .collect()
    }
}
