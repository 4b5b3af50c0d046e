//! A farm that grows while it runs: stages added at its end, and its close.
//!
//! An open farm (a Python client's calls, a Snakemake run's jobs) takes
//! stages as they are submitted. A stage that is there never changes, nor
//! does its index, so every task, record and claim keeps its meaning; an
//! added stage may depend on any earlier one, never the other way round.

use std::sync::Arc;

use super::{
    AddOptions, Counts, Engine, FarmSlot, FarmState, Millis, StageState, TaskRecord, CANCELLED,
    DONE, FAILED, SKIPPED,
};
use crate::farm::graph::Graph;
use crate::farm::{stages_from, stages_start, FarmDef, TaskRef};

impl Engine {
    /// Whether the farm in `slot`, whose [`Engine::progress`] is
    /// `counts`, is over: every task ended, and no more will come (an
    /// open farm is over only once cancelled: what it takes after is
    /// cancelled too).
    pub fn over(&self, slot: FarmSlot, counts: &Counts) -> bool {
        self.farms[slot.0 as usize].takes_no_more() && counts.finished()
    }

    /// Opens or closes the farm in `slot`: an open farm is not finished
    /// while its tasks are. Closing one whose tasks are over finishes it.
    pub fn set_open(&mut self, slot: FarmSlot, open: bool) {
        self.farms[slot.0 as usize].open = open;
        if !open {
            self.check_finished(slot);
        }
    }

    /// The farm in `slot` grows into `def`, its stages followed by more:
    /// the stages there keep their state; the new ones are restored from
    /// `restored` (a coordinator elected after they were added finds
    /// their records in its log), wait for what they depend on, and open
    /// once nothing whole-stage is left to wait for. A `def` with no new
    /// stage changes nothing but the definition.
    pub fn extend_farm(
        &mut self,
        now: Millis,
        slot: FarmSlot,
        def: Arc<FarmDef>,
        restored: impl IntoIterator<Item = (TaskRef, TaskRecord)>,
    ) {
        let f = &mut self.farms[slot.0 as usize];
        let old = f.stages.len();
        debug_assert!(def.stages.len() >= old && stages_start(&f.def.stages, &def.stages));
        f.stages
            .extend(stages_from(&def.stages, old).map(|s| StageState::new(s)));
        // The stages it adds are live from here (see `FarmState::link`).
        f.link(def.clone());
        let run = f.run;
        if def.stages.len() == old {
            return;
        }
        if f.cancelled {
            // A cancelled farm runs nothing more: its new tasks end cancelled too.
            for st in &mut f.stages[old..] {
                for i in 0..st.status.len() {
                    st.set(i, CANCELLED);
                }
            }
            return;
        }
        let opts = AddOptions {
            run,
            ..AddOptions::default()
        };
        let restored = restored
            .into_iter()
            .filter(|(t, _)| t.stage as usize >= old);
        let (failed, grew) = self.restore_records(slot, restored, &opts);
        let f = &mut self.farms[slot.0 as usize];
        for (t, lines) in grew {
            super::void_places(f, t, lines);
        }
        if stages_from(&def.stages, old).any(|s| !s.deps.is_empty()) {
            let g = def.graph().clone();
            count_waiting(f, &g, old);
        }
        self.check_placeable(slot, old);
        let f = &mut self.farms[slot.0 as usize];
        for s in old..f.stages.len() {
            let st = &mut f.stages[s];
            st.complete = st.counts.done == st.counts.total;
            let waiting_on = def.stages[s]
                .after
                .iter()
                .filter(|&&u| !f.stages[u as usize].complete)
                .count();
            f.stages[s].waiting_on = waiting_on as u32;
        }
        for s in old as u32..f.stages.len() as u32 {
            if self.farms[slot.0 as usize].stages[s as usize].waiting_on == 0 {
                self.open_stage(slot, s);
            }
        }
        // What the new stages depend on that failed, was skipped or was
        // cancelled skips them, as it skipped the stages there before.
        for t in failed.into_iter().chain(self.ended_badly_above(slot, old)) {
            self.fail_dependents(slot, t.stage, Some(t.index));
        }
        self.fill(now);
        self.check_finished(slot);
    }

    /// The tasks of the stages that stages from `from` on depend on that
    /// ended without being done.
    fn ended_badly_above(&self, slot: FarmSlot, from: usize) -> Vec<TaskRef> {
        let f = &self.farms[slot.0 as usize];
        let mut ups: Vec<u32> = stages_from(&f.def.stages, from)
            .flat_map(|s| {
                s.after
                    .iter()
                    .chain(&s.after_each)
                    .copied()
                    .chain(s.deps.iter().map(|d| d.stage))
            })
            .filter(|&u| (u as usize) < from)
            .collect();
        ups.sort_unstable();
        ups.dedup();
        let mut out = Vec::new();
        for u in ups {
            for (i, &status) in f.stages[u as usize].status.iter().enumerate() {
                if matches!(status, FAILED | SKIPPED | CANCELLED) {
                    out.push(TaskRef::new(u, i as u32));
                }
            }
        }
        out
    }
}

/// What each task of the stages from `from` on waits for, by keyed and
/// listed dependencies, from what is done now.
pub(super) fn count_waiting(f: &mut FarmState, g: &Graph, from: usize) {
    for (s, edges) in crate::farm::from_on(&g.stages, from) {
        if edges.is_empty() {
            continue;
        }
        let waiting = (0..f.stages[s].status.len())
            .map(|i| {
                edges
                    .iter()
                    .map(|e| {
                        let up = &f.stages[e.up_stage as usize].status;
                        e.ups
                            .get(i)
                            .iter()
                            .filter(|&&j| up[j as usize] != DONE)
                            .count() as u32
                    })
                    .sum()
            })
            .collect();
        f.stages[s].waiting = waiting;
    }
}

#[cfg(test)]
mod tests;
