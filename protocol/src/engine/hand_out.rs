//! Handing out ready tasks: which ready task goes next, and where, as resources free up (locally) or a worker asks (a remote engine).

use std::cmp::Reverse;
use std::ops::Bound::{Excluded, Unbounded};

use super::{
    each_done, per_task, Action, Engine, FarmSlot, FarmState, Grant, Millis, Persist, Placement,
    RecordState, Running, Take, TaskRecord, NEAR_LOOK, PENDING, RUNNING,
};
use crate::farm::{StageDef, TaskRef};

impl Engine {
    /// Starts as many ready tasks as the free resources allow.
    pub(super) fn fill(&mut self, now: Millis) {
        if !matches!(self.placement, Placement::Local(_)) {
            return;
        }
        self.hand_out(
            now,
            usize::MAX,
            &mut |placement, _, stage| {
                matches!(placement, Placement::Local(pool) if pool.can_grant(&stage.resources))
            },
            &mut |_, _, _| {},
            &mut |_, _| false,
        );
    }

    /// Starts ready tasks, farm by farm and stage by stage in priority order,
    /// each while `take` accepts its stage's resources; at most `max`.
    /// `started` hears each one. The local engine and the coordinator hand
    /// tasks out through this one loop, so both follow the same order.
    pub(super) fn hand_out(
        &mut self,
        now: Millis,
        max: usize,
        take: &mut Take,
        started: &mut dyn FnMut(FarmSlot, TaskRef, u32),
        near: &mut dyn FnMut(FarmSlot, TaskRef) -> bool,
    ) {
        if self.interrupted {
            return;
        }
        let mut count = 0;
        for fi in 0..self.farms.len() {
            if self.farms[fi].cancelled {
                continue;
            }
            let slot = FarmSlot(fi as u32);
            // By a cursor: starting a task may touch what is walked.
            let mut at = None;
            loop {
                let next = match at {
                    None => self.farms[fi].ranked.first(),
                    Some(k) => self.farms[fi].ranked.range((Excluded(k), Unbounded)).next(),
                };
                let Some(&(depth, s)) = next else {
                    break;
                };
                at = Some((depth, s));
                loop {
                    if count >= max {
                        return;
                    }
                    let st = &self.farms[fi].stages[s as usize];
                    // Ready before `take`: it may reserve what it accepts.
                    // A stage with no task left to start is passed by its
                    // counts (an open farm grown by thousands of batches
                    // has as many stages, nearly all done, and this runs
                    // at every step).
                    if st.unplaceable
                        || !st.open
                        || st.counts.queued() == 0
                        || !self.has_ready(fi, s)
                    {
                        break;
                    }
                    let f = &self.farms[fi];
                    if !take(&self.placement, (slot, s), &f.def.stages[s as usize]) {
                        break;
                    }
                    let Some(index) = self.next_ready(fi, s, &mut |t| near(slot, t)) else {
                        break;
                    };
                    let task = TaskRef::new(s, index);
                    let attempt = self.start(now, slot, task);
                    started(slot, task, attempt);
                    count += 1;
                }
            }
        }
    }

    /// The next task of stage `s` to hand out: of the first few ready one
    /// by one, one that `near` prefers (its inputs are where it is going),
    /// else the first.
    pub(super) fn next_ready(
        &mut self,
        fi: usize,
        s: u32,
        near: &mut dyn FnMut(TaskRef) -> bool,
    ) -> Option<u32> {
        let f = &mut self.farms[fi];
        let si = s as usize;
        let by_cursor = !per_task(&f.def.stages[si]);
        // Not while something it depends on is being made again: it is
        // readied again when that is done (see `on_done`).
        let go = |f: &FarmState, i: u32| {
            f.stages[si].status[i as usize] == PENDING
                && (by_cursor || each_done(f, si, i as usize))
        };
        if !by_cursor {
            let found = f.stages[si]
                .ready
                .iter()
                .take(NEAR_LOOK)
                .position(|&i| go(f, i) && near(TaskRef::new(s, i)));
            if let Some(at) = found {
                return f.stages[si].ready.remove(at);
            }
        }
        while let Some(i) = f.stages[si].ready.pop_front() {
            if go(f, i) {
                return Some(i);
            }
        }
        if by_cursor {
            return f.stages[si].next_by_fronts(true);
        }
        None
    }

    pub(super) fn start(&mut self, now: Millis, farm: FarmSlot, task: TaskRef) -> u32 {
        let f = &mut self.farms[farm.0 as usize];
        let timeout = f.def.stages[task.stage as usize].timeout_ms;
        let st = &mut f.stages[task.stage as usize];
        let i = task.index as usize;
        st.set(i, RUNNING);
        st.attempts[i] = st.attempts[i].saturating_add(1);
        let attempt = st.attempts[i];
        let record = TaskRecord {
            run: f.run,
            state: RecordState::Running,
            attempt,
            failures: st.failures[i] as u32,
            crashes: st.crashes[i] as u32,
            end: None,
            key: None,
            duration_ms: 0,
            logs: 0,
            grew: None,
            stderr_line: None,
            usage: None,
        };
        self.actions
            .push_back(Action::Persist(Persist::Task { farm, task, record }));
        let Placement::Local(pool) = &mut self.placement else {
            // Claimed for another node: it grants, times and starts the task.
            self.running.insert(
                (farm, task),
                Running {
                    attempt,
                    grant: Grant::default(),
                    killed: None,
                },
            );
            return attempt;
        };
        let request = &self.farms[farm.0 as usize].def.stages[task.stage as usize].resources;
        let grant = pool.grant(request).expect("fill() checked can_grant");
        self.running.insert(
            (farm, task),
            Running {
                attempt,
                grant: grant.clone(),
                killed: None,
            },
        );
        if let Some(ms) = timeout {
            self.timers
                .push(Reverse((now.saturating_add(ms), farm, task, attempt)));
        }
        self.actions.push_back(Action::Start {
            farm,
            task,
            attempt,
            grant,
        });
        attempt
    }

    /// Hands out up to `max` ready tasks for another node to run, each one
    /// whose stage `take` accepts (it reserves the stage's resources as it
    /// says yes). The tasks count as running until [`Engine::task_finished`],
    /// [`Engine::lost`] or [`Engine::unclaim`] says otherwise.
    pub fn claim(
        &mut self,
        now: Millis,
        max: usize,
        take: &mut dyn FnMut((FarmSlot, u32), &StageDef) -> bool,
    ) -> Vec<(FarmSlot, TaskRef, u32)> {
        self.claim_near(now, max, take, &mut |_, _| false)
    }

    /// As [`Engine::claim`], handing out first, of the tasks ready one by
    /// one, those `near` says would find their inputs where they go.
    pub fn claim_near(
        &mut self,
        now: Millis,
        max: usize,
        take: &mut dyn FnMut((FarmSlot, u32), &StageDef) -> bool,
        near: &mut dyn FnMut(FarmSlot, TaskRef) -> bool,
    ) -> Vec<(FarmSlot, TaskRef, u32)> {
        let mut out = Vec::new();
        self.hand_out(
            now,
            max,
            &mut |_, slot, stage| take(slot, stage),
            &mut |s, t, a| out.push((s, t, a)),
            near,
        );
        out
    }

    /// True when a stage has a task ready to hand out. Stale entries (tasks
    /// no longer pending) are dropped on the way, as `next_ready` would, so
    /// asking again stays cheap.
    pub(super) fn has_ready(&mut self, fi: usize, s: u32) -> bool {
        let f = &mut self.farms[fi];
        let by_cursor = !per_task(&f.def.stages[s as usize]);
        let st = &mut f.stages[s as usize];
        while let Some(&i) = st.ready.front() {
            if st.status[i as usize] == PENDING {
                return true;
            }
            st.ready.pop_front();
        }
        by_cursor && st.next_by_fronts(false).is_some()
    }
}
