//! A task's run on a simulated node: its start with its stage's resources, the files it brings from its parents' nodes, its end (or kill), and what the node's peer is told of it.

use super::*;

impl Sim<'_> {
    pub(super) fn start_task(
        &mut self,
        n: usize,
        task: Assigned,
        res: Resources,
    ) -> Result<(), SimError> {
        let g = self.plan.global(task.task);
        let want = &self.plan.spec.def.stages[task.task.stage as usize].resources;
        if &res != want {
            return Err(self.violation(format!(
                "node {n} started task {:?} with {res}, its stage asks for {want}",
                task.task
            )));
        }
        let nd = &mut self.nodes[n];
        // Charged before the check: a violation ends the run, so nothing
        // needs the amount from before it.
        nd.used.give(&res);
        if !nd.total.fits(&nd.used) {
            let m = format!(
                "node {n} started task {:?} ({res}), leaving {} in use of {}",
                task.task, nd.used, nd.total
            );
            return Err(self.violation(m));
        }
        if nd.runs.contains_key(&task.task) {
            let m = format!("node {n} started task {:?} twice at once", task.task);
            return Err(self.violation(m));
        }
        if !self.faults && self.live[g] > 0 {
            return Err(self.violation(format!(
                "task {:?} started on node {n} while it runs elsewhere, in a run without faults",
                task.task
            )));
        }
        // A real home starts a task only once the outputs it depends on
        // are there: it learns its dependencies done from the log the
        // coordinator syncs to it (every `progress_ms`, even to itself),
        // then brings their outputs home. The task holds its grant
        // meanwhile. Replayed workflows only: a scenario's farm keeps the
        // behaviour its tests were written against.
        if self.plan.io.is_some() {
            let mut found = 0;
            if !self.deps_here(n, task.task, &mut found) {
                let now = self.now;
                self.nodes[n].waiting.push((task, res, found, now));
                return Ok(());
            }
        }
        self.launch(n, task, res, self.now);
        Ok(())
    }

    /// Whether every output `t` depends on is at node `n`, where `n` is
    /// the farm's home (elsewhere a task brings its own: [`Self::stage_in`]);
    /// `found` counts the dependencies found so far, so that a later look
    /// goes on from there.
    pub(super) fn deps_here(&self, n: usize, t: TaskRef, found: &mut u64) -> bool {
        let Some(r) = self.nodes[n]
            .peer
            .as_ref()
            .and_then(|p| p.replica(FARM))
            .filter(|r| r.home)
        else {
            return true;
        };
        let def = &r.spec.def;
        while let Some(d) = def.dependency(t, *found) {
            if !r.outputs_here(d) && !void_place(def, &r.log, d) {
                return false;
            }
            *found += 1;
        }
        true
    }

    /// Starts the tasks waiting at node `n` whose dependencies' outputs
    /// are all there now.
    pub(super) fn start_waiting(&mut self, n: usize) {
        let mut waiting = std::mem::take(&mut self.nodes[n].waiting);
        let mut ready = Vec::new();
        waiting.retain_mut(|(task, res, found, since)| {
            if self.deps_here(n, task.task, found) {
                ready.push((*task, res.clone(), *since));
                false
            } else {
                true
            }
        });
        self.nodes[n].waiting = waiting;
        for (task, res, since) in ready {
            self.launch(n, task, res, since);
        }
    }

    /// The run of a task whose resources are held (since `since`): it ends
    /// after bringing its files and its runtime.
    pub(super) fn launch(&mut self, n: usize, task: Assigned, res: Resources, since: Millis) {
        let g = self.plan.global(task.task);
        self.executions += 1;
        let token = self.begin_run(n, task, res, since, false);
        let at = self.now + self.stage_in(n, g) + self.plan.durations[g] as u64;
        self.end_at(n, task, token, at);
    }

    /// Records `task`'s run on node `n`, its resources held since `since`
    /// (`killed`: it ends as killed); its token, for its end.
    pub(super) fn begin_run(
        &mut self,
        n: usize,
        task: Assigned,
        res: Resources,
        since: Millis,
        killed: bool,
    ) -> u64 {
        let token = self.next_token;
        self.next_token += 1;
        self.nodes[n].runs.insert(
            task.task,
            Run {
                attempt: task.attempt,
                token,
                res,
                start: since,
                killed,
            },
        );
        self.live[self.plan.global(task.task)] += 1;
        token
    }

    /// The run of `task` (its token `token`) on node `n` ends at `at`.
    pub(super) fn end_at(&mut self, n: usize, task: Assigned, token: u64, at: Millis) {
        self.busy_until = self.busy_until.max(at);
        let gen = self.nodes[n].gen;
        self.push(
            at,
            Ev::TaskEnd {
                node: n as u32,
                gen,
                task,
                token,
            },
        );
    }

    /// How long a workflow's task takes to bring the files it reads from
    /// its parents' nodes to node `n`, one source after another; each
    /// file comes once per node. Zero for a scenario's farm.
    pub(super) fn stage_in(&mut self, n: usize, g: usize) -> Millis {
        if self.plan.io.is_none() {
            return 0;
        }
        let inputs = self.inputs_wait(n);
        let Some(io) = &self.plan.io else {
            return 0;
        };
        let mut sources: Vec<u32> = Vec::new();
        let mut bytes = 0;
        for &Read {
            from,
            file,
            bytes: b,
        } in &io.reads[g]
        {
            let src = self.ran_on[from as usize];
            if src == n as u32 || src == NOWHERE || !self.brought.insert((n as u32, file)) {
                continue;
            }
            bytes += b;
            if !sources.contains(&src) {
                sources.push(src);
            }
        }
        let ms = inputs + io.links.transfer_ms(sources.len(), bytes);
        self.moved_bytes += bytes;
        self.stage_in_ms += ms;
        ms
    }

    /// How long a task starting now on node `n` waits for a workflow's
    /// inputs (the files no task makes): every node but the submitter,
    /// which has them, brings them all from it before its first task, as
    /// a real node does for a farm with inputs; the node's later tasks
    /// wait for the same transfer.
    pub(super) fn inputs_wait(&mut self, n: usize) -> Millis {
        let Some(io) = &self.plan.io else {
            return 0;
        };
        if n == self.cfg.submit_node || io.input_bytes == 0 {
            return 0;
        }
        let at = match self.inputs_at.get(&(n as u32)) {
            Some(&at) => at,
            None => {
                self.moved_bytes += io.input_bytes;
                let at = self.now + io.links.transfer_ms(1, io.input_bytes);
                self.inputs_at.insert(n as u32, at);
                at
            }
        };
        at.saturating_sub(self.now)
    }

    /// The process is killed: it ends now, with a signal.
    pub(super) fn kill(&mut self, n: usize, task: Assigned) {
        let nd = &mut self.nodes[n];
        if let Some(at) = nd.waiting.iter().position(|(t, ..)| *t == task) {
            // Killed before it started: it ends now, as a real node ends
            // one killed while it waits for its dependencies.
            let (_, res, _, since) = nd.waiting.swap_remove(at);
            let token = self.begin_run(n, task, res, since, true);
            self.end_at(n, task, token, self.now);
            return;
        }
        let Some(r) = nd.runs.get_mut(&task.task) else {
            return;
        };
        if r.attempt != task.attempt || r.killed {
            return;
        }
        r.killed = true;
        r.token = self.next_token;
        self.next_token += 1;
        let token = r.token;
        self.end_at(n, task, token, self.now);
    }

    pub(super) fn task_end(
        &mut self,
        n: usize,
        gen: u32,
        task: Assigned,
        token: u64,
    ) -> Result<(), SimError> {
        let nd = &mut self.nodes[n];
        if nd.gen != gen || nd.runs.get(&task.task).is_none_or(|r| r.token != token) {
            return Ok(());
        }
        let r = nd.runs.remove(&task.task).expect("checked");
        nd.used.take_saturating(&r.res);
        let completed = !r.killed;
        self.end_run(n, task.task, &r, completed);
        let g = self.plan.global(task.task);
        let fail = self.plan.fails[g];
        if completed {
            self.completions[g] = self.completions[g].saturating_add(1);
            if self.completions[g] > 1 {
                self.duplicates += 1;
                if !self.faults {
                    return Err(self.violation(format!(
                        "task {:?} ran to completion twice in a run without faults",
                        task.task
                    )));
                }
            }
            if !fail {
                if !self.ok_done[g] {
                    self.ok_left -= 1;
                }
                self.ok_done[g] = true;
                self.makespan = self.makespan.max(self.now);
                if self.ran_on.get(g) == Some(&NOWHERE) {
                    self.ran_on[g] = n as u32;
                }
            }
        }
        let result = if !completed {
            TaskResult::Signaled(9)
        } else if fail {
            TaskResult::Exited(1)
        } else {
            TaskResult::Exited(0)
        };
        let outcome = Outcome {
            result,
            key: None,
            duration_ms: self.now - r.start,
            ended_ms: 0,
            grew: None,
            logs: 0,
            stderr_line: None,
            usage: None,
        };
        // Every successful task leaves one output, kept on this node until
        // the home fetches it.
        let outputs = if completed && !fail && self.cfg.outputs {
            let mut hash = [0u8; 32];
            hash[..8].copy_from_slice(&(g as u64).to_le_bytes());
            vec![OutputFile {
                path: "out".into(),
                hash,
                size: 1,
                mode: 0o644,
                data: None,
            }]
        } else {
            Vec::new()
        };
        let now = self.now;
        self.step(n, |p| p.task_finished(now, task, outcome, outputs))?;
        let nd = &mut self.nodes[n];
        if let Some(p) = &nd.peer {
            nd.depth = p.prefetch_depth();
        }
        Ok(())
    }
}
