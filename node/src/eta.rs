//! When a farm will end, as its home estimates it from a quick simulation of what is left (`mesh_protocol::eta`), for `mesh status`, `mesh watch`, the dashboard and the Python client's `progress()`.
//!
//! A rate (tasks a second lately) is wrong for any farm whose stages
//! differ: the long stage still to come, or the few tasks of a merge that
//! run alone. Its home makes the estimate: `mesh run` on its loop, with
//! each running task's elapsed time; a mesh node off its loop, without.

pub use mesh_protocol::eta::*;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// A farm's end as estimated: from when it was estimated.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Eta {
    /// Half the simulated runs ended by then, and nine in ten.
    pub p50_ms: u64,
    pub p90_ms: u64,
    /// When it was estimated (Unix ms).
    pub at_ms: u64,
    /// Runs simulated, and the wall time they took.
    pub runs: u32,
    pub cost_ms: u64,
    /// Stages none of whose tasks has finished: drawn from the others'
    /// runtimes, so the estimate is a guess until one has.
    #[serde(default)]
    pub guessed: Vec<String>,
}

impl Eta {
    /// In words, counted on from when it was made: `ends in about 4m 10s
    /// (by 5m 2s in 9 runs of 10)`.
    pub fn words(&self, now_ms: u64) -> String {
        let since = now_ms.saturating_sub(self.at_ms);
        let left = |ms: u64| {
            let s = ms.saturating_sub(since).div_ceil(1000);
            humantime::format_duration(std::time::Duration::from_secs(s)).to_string()
        };
        let mut words = if self.p90_ms <= since {
            "ends any moment now (later than estimated)".to_string()
        } else {
            format!(
                "ends in about {} (by {} in 9 runs of 10)",
                left(self.p50_ms),
                left(self.p90_ms)
            )
        };
        if !self.guessed.is_empty() {
            words.push_str(&format!(
                "; a guess for {}, none of whose tasks has finished",
                self.guessed.join(", ")
            ));
        }
        words
    }
}

/// A farm's end is estimated again at most this often, and so that the
/// estimates take at most one part in `SHARE` of a core (a million-task
/// farm's takes a few tenths of a second).
const EVERY: Duration = Duration::from_secs(2);
const SHARE: u32 = 10;

/// How long after an estimate that took `took` the next may be made.
pub fn next_after(took: Duration) -> Duration {
    EVERY.max(took * SHARE)
}

/// The farm's end estimated at `at_ms` (Unix) from what is left of its
/// stages (named in order): None until a task has finished, or while a
/// stage fits nowhere.
pub fn estimate<'a>(
    stages: &[StageLeft],
    names: impl Iterator<Item = &'a str>,
    at_ms: u64,
    seed: u64,
) -> Option<Eta> {
    let started = std::time::Instant::now();
    let tasks = stages.iter().map(|s| s.waiting + s.running).sum();
    let runs = runs_for(tasks);
    let ends = simulate(stages, runs, seed)?;
    Some(Eta {
        p50_ms: quantile(&ends, 0.5),
        p90_ms: quantile(&ends, 0.9),
        at_ms,
        runs,
        cost_ms: started.elapsed().as_millis() as u64,
        guessed: guessed(stages, names),
    })
}
