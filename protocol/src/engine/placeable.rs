//! Stages no machine fits: failed as unplaceable with what is short and which names no machine offers, and run after all once one fits.

use super::{per_task, ready_each, Action, Engine, Event, FarmSlot, Placement, FAILED, PENDING};
use crate::pool::Pool;
use crate::resources::{Amount, Resources};

impl Engine {
    /// Stages failed as unplaceable that a machine now fits (a partition
    /// healed, a larger node joined) run after all: their tasks that never
    /// started, and what was skipped because of them, wait again.
    pub(super) fn recheck_unplaceable(&mut self) {
        let Placement::Remote(m) = &self.placement else {
            return;
        };
        let mut back = Vec::new();
        for (fi, f) in self.farms.iter().enumerate() {
            for (s, st) in f.stages.iter().enumerate() {
                let req = &f.def.stages[s].resources;
                if st.unplaceable && m.list.iter().any(|x| Pool::ever_fits(x, req)) {
                    back.push((fi, s));
                }
            }
        }
        for (fi, s) in back {
            let f = &mut self.farms[fi];
            f.touch(s as u32);
            let st = &mut f.stages[s];
            st.unplaceable = false;
            for i in 0..st.status.len() {
                if st.status[i] == FAILED && st.attempts[i] == 0 {
                    st.set(i, PENDING);
                }
            }
            st.rewind();
            if st.open && per_task(&f.def.stages[s]) {
                let ready = ready_each(f, s, 0..f.stages[s].status.len());
                f.stages[s].ready.extend(ready);
            }
            self.revive_dependents(FarmSlot(fi as u32), s as u32, None);
        }
    }

    /// The names of the resources any machine offers, sorted.
    fn offered_names(&self) -> Vec<String> {
        let mut names: Vec<String> = match &self.placement {
            Placement::Local(pool) => pool.total().iter().map(|(k, _)| k.to_string()).collect(),
            Placement::Remote(m) => m
                .list
                .iter()
                .flat_map(|r| r.iter().map(|(k, _)| k.to_string()))
                .collect(),
        };
        names.sort_unstable();
        names.dedup();
        names
    }

    /// Marks stages (from stage `from` on) that can never run here as
    /// failed, with an event saying why.
    pub(super) fn check_placeable(&mut self, slot: FarmSlot, from: usize) {
        let f = &self.farms[slot.0 as usize];
        let mut bad = Vec::new();
        for (s, stage) in crate::farm::from_on(&f.def.stages, from) {
            let shortfall = match &self.placement {
                Placement::Local(pool) => Pool::never_fits(pool.total(), &stage.resources),
                Placement::Remote(machines) => {
                    // Unplaceable when no machine fits; the shortfall shown is the largest machine's.
                    let mut best: Option<Vec<(String, Amount, Amount)>> = None;
                    for m in &machines.list {
                        let sf = Pool::never_fits(m, &stage.resources);
                        if best.as_ref().is_none_or(|b| sf.len() < b.len()) {
                            best = Some(sf);
                        }
                    }
                    best.unwrap_or_else(|| Pool::never_fits(&Resources::new(), &stage.resources))
                }
            };
            if !shortfall.is_empty() {
                bad.push((s as u32, shortfall));
            }
        }
        for (s, shortfall) in bad {
            let f = &mut self.farms[slot.0 as usize];
            let st = &mut f.stages[s as usize];
            st.unplaceable = true;
            for i in 0..st.status.len() {
                if st.status[i] == PENDING {
                    st.set(i, FAILED);
                }
            }
            let offered = self.offered_names();
            self.actions.push_back(Action::Emit(Event::Unplaceable {
                farm: slot,
                stage: s,
                shortfall,
                offered,
            }));
            self.fail_dependents(slot, s, None);
        }
    }
}
