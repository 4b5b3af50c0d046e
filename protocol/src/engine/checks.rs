//! The engine's invariant checks, in three costs: what every step may afford, a pass over the live runs, and an audit of every task.

use super::{Counts, Engine, Placement, CANCELLED, DONE, FAILED, HELD, RUNNING, SKIPPED, VOID};

impl Engine {
    /// Checks the engine's invariants that are cheap enough for every step
    /// of the simulator: what the pool has lent matches the live runs (a
    /// pass over them, for the local placement only: a node runs a few),
    /// and as many runs are live as the counters say are running. See
    /// [`Engine::check_runs`] and [`Engine::audit`] for the deeper checks.
    pub fn check_invariants(&self) -> Result<(), String> {
        if let Placement::Local(pool) = &self.placement {
            pool.check(self.running.values().map(|r| &r.grant))?;
        }
        let counted: u64 = self
            .farms
            .iter()
            .flat_map(|f| &f.stages)
            .map(|st| st.counts.running)
            .sum();
        if counted != self.running.len() as u64 {
            return Err(format!(
                "{} live runs, {counted} counted running",
                self.running.len()
            ));
        }
        Ok(())
    }

    /// Live runs per stage against each stage's running counter: a pass
    /// over the live runs (thousands, for a coordinator).
    pub fn check_runs(&self) -> Result<(), String> {
        let mut live: Vec<Vec<u64>> = self.farms.iter().map(|f| vec![0; f.stages.len()]).collect();
        for (f, t) in self.running.keys() {
            match live
                .get_mut(f.0 as usize)
                .and_then(|s| s.get_mut(t.stage as usize))
            {
                Some(n) => *n += 1,
                None => return Err(format!("a live run of unknown task {f:?}/{t:?}")),
            }
        }
        for (fi, (f, live)) in self.farms.iter().zip(&live).enumerate() {
            for (si, (st, &n)) in f.stages.iter().zip(live).enumerate() {
                if n != st.counts.running {
                    return Err(format!(
                        "farm {fi} stage {si}: {n} live runs, {} counted running",
                        st.counts.running
                    ));
                }
            }
        }
        Ok(())
    }

    /// The running counters of the stages whose live runs changed since
    /// the last call, against those runs: [`Engine::check_runs`] on what
    /// changed, for a check after every step.
    pub fn check_changed_runs(&mut self) -> Result<(), String> {
        let mut touched = self.running.take_touched();
        touched.sort_unstable();
        touched.dedup();
        for &(f, s) in &touched {
            let live = self.running.in_group(&(f, s)) as u64;
            let counted = self
                .farms
                .get(f.0 as usize)
                .and_then(|fs| fs.stages.get(s as usize))
                .map(|st| st.counts.running);
            if counted != Some(live) {
                return Err(format!(
                    "farm {} stage {s}: {live} live runs, {counted:?} counted running",
                    f.0
                ));
            }
        }
        self.running.recycle_touched(touched);
        Ok(())
    }

    /// Live runs of this engine.
    pub fn live_runs(&self) -> usize {
        self.running.len()
    }

    /// Every check: [`Engine::check_invariants`], [`Engine::check_runs`],
    /// and the counters against a scan of every task's status. For tests,
    /// and once at the end of a simulation.
    pub fn audit(&self) -> Result<(), String> {
        self.check_invariants()?;
        self.check_runs()?;
        self.running.recount()?;
        for (fi, f) in self.farms.iter().enumerate() {
            // The hand-out walks `ranked`: a live stage missing from it
            // would never be handed out.
            let ranked: Vec<u32> = f.ranked.iter().map(|&(_, s)| s).collect();
            let mut sorted = ranked.clone();
            sorted.sort_unstable();
            if sorted.len() != f.live.len() || !sorted.iter().eq(f.live.iter()) {
                return Err(format!(
                    "farm {fi}: the stages ranked for the hand-out {ranked:?} are not the live ones {:?}",
                    f.live
                ));
            }
            for (si, st) in f.stages.iter().enumerate() {
                let mut c = Counts {
                    total: st.status.len() as u64,
                    ..Counts::default()
                };
                for &s in &st.status {
                    match s {
                        VOID => c.total -= 1,
                        RUNNING => c.running += 1,
                        DONE => c.done += 1,
                        FAILED => c.failed += 1,
                        SKIPPED => c.skipped += 1,
                        CANCELLED => c.cancelled += 1,
                        HELD => c.stopped += 1,
                        _ => {}
                    }
                }
                let k = &st.counts;
                if !f.live.contains(&(si as u32)) && !st.settled() {
                    return Err(format!(
                        "farm {fi} stage {si}: {k:?} not settled, but passed over as if it were"
                    ));
                }
                if c.stopped > 0 && st.stopped.is_none() {
                    return Err(format!(
                        "farm {fi} stage {si}: {} tasks held, but the stage is not stopped",
                        c.stopped
                    ));
                }
                if (c.total, c.running, c.done, c.failed, c.skipped, c.cancelled)
                    != (k.total, k.running, k.done, k.failed, k.skipped, k.cancelled)
                    || c.stopped != k.stopped
                {
                    return Err(format!(
                        "farm {fi} stage {si}: counters {k:?} but statuses say {c:?}"
                    ));
                }
            }
        }
        Ok(())
    }
}
