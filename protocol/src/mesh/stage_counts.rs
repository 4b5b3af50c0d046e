//! A farm's counts per stage, each with when it last changed: what changed since a version is found without a look at every stage.
//!
//! The coordinator sends each holder the stages changed since the version
//! the holder has, and a home's view takes the stages its copy changed
//! since it last looked: an open farm grown by thousands of batches has as
//! many stages, nearly all of them settled.

use std::collections::BTreeMap;
use std::ops::Deref;

use crate::engine::Counts;

/// Each stage's counts, in stage order, and the order they changed in.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StageCounts {
    counts: Vec<Counts>,
    /// Counts up with every change of a stage's counts.
    version: u64,
    /// The version each stage's counts last changed at (0: never), and
    /// the stages by it (each under its latest only).
    at: Vec<u64>,
    by_version: BTreeMap<u64, u32>,
}

impl StageCounts {
    /// Stages with these counts, none of them changed yet.
    pub fn new(counts: Vec<Counts>) -> StageCounts {
        StageCounts {
            at: vec![0; counts.len()],
            counts,
            ..StageCounts::default()
        }
    }

    /// Stage `s`'s counts are `c` (a stage past the last is made room
    /// for, those between at their defaults): what they were, where they
    /// change.
    pub fn set(&mut self, s: usize, c: Counts) -> Option<Counts> {
        if s >= self.counts.len() {
            self.counts.resize(s + 1, Counts::default());
            self.at.resize(s + 1, 0);
        }
        if self.counts[s] == c {
            return None;
        }
        self.version += 1;
        self.by_version.remove(&self.at[s]);
        self.at[s] = self.version;
        self.by_version.insert(self.version, s as u32);
        Some(std::mem::replace(&mut self.counts[s], c))
    }

    /// The version now: what the next call of `since` starts from.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// The stages whose counts changed after version `since`, in the order
    /// they last changed.
    pub fn since(&self, since: u64) -> impl Iterator<Item = u32> + '_ {
        self.by_version.range(since + 1..).map(|(_, &s)| s)
    }
}

impl Deref for StageCounts {
    type Target = [Counts];

    fn deref(&self) -> &[Counts] {
        &self.counts
    }
}
