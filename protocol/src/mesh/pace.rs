//! Prefetch sizing: how many tasks a node keeps queued beyond what it runs, from what it measures (Little's law).
//!
//! A slot idles when its task ends and the next one is still on its way:
//! a replacement asked for at the end of a task arrives a round trip
//! later, and meanwhile the node starts tasks at its rate (its slots over
//! the mean duration). So a node that keeps `rate × round trip` tasks
//! queued, plus one, never waits (Little's law). Both are measured here:
//! per stage the recent mean duration of its tasks on this node, and the
//! round trip to the coordinator (the time from a report to the
//! assignment that answers it). Thin tasks get a deep queue, long ones
//! the old one task beyond full. The coordinator bounds what a node asks
//! for by the stage's remaining work (its placement,
//! `peer/coordinator/placement.rs`).

use rustc_hash::{FxHashMap, FxHashSet};

use crate::engine::Millis;
use crate::mesh::FarmId;

/// A stage counts toward the depth while its last completion here is this recent.
const ACTIVE_MS: Millis = 2000;
/// The round trip assumed before one is measured.
const RTT_GUESS_MS: f64 = 2.0;
/// A run measured shorter than this counts as this long: a run of 0 ms
/// still took time, and the depth must stay finite.
const DURATION_FLOOR_MS: f64 = 0.5;
/// Weight of a new sample in the smoothed means: about the last eight count.
const NEW: f64 = 0.125;

/// What this node measured about its stages and its coordinator.
#[derive(Debug, Default)]
pub struct Pace {
    stages: FxHashMap<(FarmId, u32), Stage>,
    /// The stages of `stages` that may have ended a task in the last
    /// `ACTIVE_MS`: the depth looks at these, not at every stage that ever
    /// ran here (an open farm of calls has a stage or more per call).
    recent: FxHashSet<(FarmId, u32)>,
    rtt_ms: Option<f64>,
    /// Mean deviation of the round trip: a queue sized for the mean round
    /// trip runs dry on every slower one, so the depth covers the mean
    /// plus twice this (as TCP sizes its retransmission timer).
    rtt_dev_ms: f64,
    /// The last depth's measure holds until then, for that `base` and
    /// `max`, unless something is measured first: the first moment a stage
    /// that counted stops counting. None once a measure came in.
    holds: Option<(Millis, u32, u32)>,
}

#[derive(Debug)]
struct Stage {
    mean_ms: f64,
    /// Tasks of the stage this node runs at once.
    slots: u64,
    last: Millis,
}

fn smooth(old: f64, sample: f64) -> f64 {
    old + NEW * (sample - old)
}

impl Pace {
    /// A task of `stage` ran `duration_ms` here; the node runs `slots` of them at once.
    pub fn finished(
        &mut self,
        now: Millis,
        farm: FarmId,
        stage: u32,
        slots: u64,
        duration_ms: u64,
    ) {
        let d = duration_ms as f64;
        let s = self.stages.entry((farm, stage)).or_insert(Stage {
            mean_ms: d,
            slots,
            last: now,
        });
        s.mean_ms = smooth(s.mean_ms, d);
        s.slots = slots;
        s.last = now;
        self.recent.insert((farm, stage));
        self.holds = None;
    }

    /// The recent mean duration of `stage`'s tasks here, once one ended.
    pub fn mean_ms(&self, farm: FarmId, stage: u32) -> Option<Millis> {
        self.stages.get(&(farm, stage)).map(|s| s.mean_ms as Millis)
    }

    /// A round trip to the coordinator took `ms`.
    pub fn round_trip(&mut self, ms: Millis) {
        self.holds = None;
        let ms = ms as f64;
        match self.rtt_ms {
            None => {
                self.rtt_ms = Some(ms);
                self.rtt_dev_ms = ms / 2.0;
            }
            Some(r) => {
                self.rtt_dev_ms = smooth(self.rtt_dev_ms, (ms - r).abs());
                self.rtt_ms = Some(smooth(r, ms));
            }
        }
    }

    /// Tasks to keep queued beyond those running: the largest need of the
    /// stages that ran here lately, `base` before any has, at most `max`.
    /// Stages no longer recent are forgotten.
    pub fn depth(&mut self, now: Millis, base: u32, max: u32) -> u32 {
        let rtt = self.rtt_ms.unwrap_or(RTT_GUESS_MS) + 2.0 * self.rtt_dev_ms;
        let stages = &self.stages;
        let active = |k: &(FarmId, u32)| now.saturating_sub(stages[k].last) <= ACTIVE_MS;
        self.recent.retain(active);
        let until = self
            .recent
            .iter()
            .map(|k| self.stages[k].last + ACTIVE_MS + 1)
            .min()
            .unwrap_or(Millis::MAX);
        self.holds = Some((until, base, max));
        self.recent
            .iter()
            .map(|k| &self.stages[k])
            .map(|s| {
                let rate = s.slots as f64 / s.mean_ms.max(DURATION_FLOOR_MS);
                (rate * rtt).ceil().min(u32::MAX as f64) as u32 + 1
            })
            .max()
            .unwrap_or(base)
            .clamp(1, max.max(1))
    }

    /// Until when [`Pace::depth`], asked with `base` and `max`, says what it
    /// said last, if nothing is measured first: None if that is not known
    /// (a measure came in since).
    pub fn holds_until(&self, base: u32, max: u32) -> Option<Millis> {
        self.holds
            .filter(|&(_, b, m)| (b, m) == (base, max))
            .map(|(until, ..)| until)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const F: FarmId = FarmId(1);

    #[test]
    fn thin_tasks_get_a_queue_that_covers_a_round_trip() {
        let mut p = Pace::default();
        for _ in 0..100 {
            p.finished(0, F, 0, 4, 3);
            p.round_trip(4);
        }
        // 4 slots / 3 ms = 1.33 tasks per ms, 4 ms away: 5.3 -> 6, plus one.
        assert_eq!(p.depth(0, 1, 4096), 7);
        // A round trip that varies needs more.
        for i in 0..100 {
            p.round_trip(if i % 2 == 0 { 2 } else { 6 });
        }
        assert!(p.depth(0, 1, 4096) >= 9, "{}", p.depth(0, 1, 4096));
    }

    #[test]
    fn long_tasks_keep_one_beyond_full() {
        let mut p = Pace::default();
        p.finished(0, F, 0, 16, 10_000);
        p.round_trip(3);
        assert_eq!(p.depth(0, 1, 4096), 2);
    }

    #[test]
    fn before_any_measure_the_base_holds_and_max_bounds() {
        let mut p = Pace::default();
        assert_eq!(p.depth(0, 3, 4096), 3);
        p.finished(0, F, 0, 64, 0);
        p.round_trip(100);
        assert_eq!(p.depth(0, 3, 50), 50);
    }

    #[test]
    fn idle_stages_stop_counting() {
        let mut p = Pace::default();
        p.finished(0, F, 0, 4, 1);
        p.round_trip(10);
        assert!(p.depth(100, 1, 4096) > 10);
        assert_eq!(p.depth(ACTIVE_MS + 1, 1, 4096), 1);
    }

    #[test]
    fn the_means_follow_recent_samples() {
        let mut p = Pace::default();
        p.finished(0, F, 0, 1, 100);
        for _ in 0..40 {
            p.finished(0, F, 0, 1, 10);
        }
        p.round_trip(10);
        // 1 slot / ~10 ms, 10 ms away: about one, plus one.
        assert!(p.depth(0, 1, 4096) <= 3);
    }
}
