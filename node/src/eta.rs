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

/// One estimate of a farm's end, kept for `mesh report`'s history of
/// them: when it was made and the ends it gave (Unix ms).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Estimated {
    pub at_ms: u64,
    pub p50_end_ms: u64,
    pub p90_end_ms: u64,
}

/// Estimates kept of a farm: a long farm's history is thinned to every
/// other one when full, so it spans the whole run at a coarser step.
const HISTORY_MAX: usize = 256;

/// Adds `e` to a farm's `history` of estimates.
pub fn remember(history: &mut Vec<Estimated>, e: &Eta) {
    if history.len() >= HISTORY_MAX {
        let mut i = 0;
        history.retain(|_| {
            i += 1;
            i % 2 == 1
        });
    }
    history.push(Estimated {
        at_ms: e.at_ms,
        p50_end_ms: e.at_ms + e.p50_ms,
        p90_end_ms: e.at_ms + e.p90_ms,
    });
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_history_is_thinned_and_keeps_its_first_and_newest() {
        let mut h = Vec::new();
        for at in 0..1000u64 {
            let e = Eta {
                p50_ms: 10,
                p90_ms: 20,
                at_ms: at,
                ..Eta::default()
            };
            remember(&mut h, &e);
            assert!(h.len() <= HISTORY_MAX);
        }
        assert_eq!(h[0].at_ms, 0);
        assert_eq!(
            h.last().map(|e| (e.at_ms, e.p50_end_ms, e.p90_end_ms)),
            Some((999, 1009, 1019))
        );
        assert!(h.windows(2).all(|w| w[0].at_ms < w[1].at_ms));
    }
}
