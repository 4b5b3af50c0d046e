//! Running a task on this node: its launch put together from the farm's definition, its inputs put in place, the executor, and its outputs kept.

use std::collections::HashMap;
use std::fs;
use std::path::PathBuf;
use std::sync::Arc;

use mesh_protocol::engine::{Grant, KillReason, Outcome, TaskResult};
use mesh_protocol::farm::reads_outputs;
use mesh_protocol::mesh::{void_place, Assigned, Entry, FarmSpec, NodeId, OutputFile};
use tokio::sync::mpsc;

use super::deps::{place_deps, DepsError, DepsPlace, NotPlaced};
use super::staging::{
    fetch_input, input_file, input_hash, keep_outputs, manifest, place_riding, InputSources,
};
use super::transfer::{FetchError, Transfers};
use super::{Farms, Runs};
use crate::executor::{self, Finished, Launch};
use crate::mesh_node::{Event, LoopHandle};
use crate::task_view::TaskView;

/// The most bytes an output handed back by a warm Python worker may have
/// to ride with the task's report and the farm's log instead of being a
/// file (a number, a short string, a small tuple: a Python call's value);
/// every copy of the log holds it, so it stays small.
pub(in crate::mesh_node) const RIDES_MAX: usize = 1024;

impl Runs {
    /// Starts one task: here directly when this node submitted the farm,
    /// otherwise after fetching its inputs, with its outputs sent back after.
    pub(in crate::mesh_node) fn start(&mut self, task: Assigned, grant: Grant, farms: &dyn Farms) {
        let mut found = 0;
        if !self.deps_here(&task, &mut found, farms) || self.workdir_taken(&task, farms) {
            tracing::debug!(farm = %task.farm, task = ?task.task, found, "waits for its dependencies' outputs or its workdir");
            self.waiting_deps.push((task, grant, found));
            return;
        }
        let Some(spec) = farms.spec(task.farm).cloned() else {
            let why = "the farm's definition is not on this node";
            self.end_unrun(task, TaskResult::Error(why.into()));
            return;
        };
        self.workdir_taken_by(&task, farms);
        self.live
            .insert((task.farm, task.task), (task.attempt, None, false));
        let seq =
            self.recorder
                .started(task.farm, task.task, task.attempt, crate::state::unix_ms());
        self.run_seq
            .insert((task.farm, task.task), (seq, self.recorder.slot(seq)));
        let def = &spec.def;
        let stage = def.stage(task.task);
        let local = spec.origin == self.me;
        let farm_dir = self.state.join("work").join(task.farm.to_string());
        // Off the home, `{out}` is this node's own folder for the farm,
        // where what the task depends on is put before it starts.
        let farm_out = farm_dir.join("out");
        // A task that can see `{out}` sees a folder of its own there, with
        // exactly the outputs it depends on (see `task_view`), made from
        // the farm's output folder on its home, from this node's own
        // folder for the farm elsewhere.
        let view = stage.reads_out().then(|| TaskView {
            dir: farm_dir
                .join("views")
                .join(&stage.name)
                .join(format!("{}.{}", task.task.index, task.attempt)),
            base: if local {
                PathBuf::from(&def.out)
            } else {
                farm_out.clone()
            },
            def: spec.clone(),
            task: task.task,
        });
        let mut tspec = match &view {
            Some(v) => def.expand_in(task.task, &v.dir.to_string_lossy()),
            None if local => def.expand(task.task),
            None => def.expand_in(task.task, &farm_out.to_string_lossy()),
        };
        let hashes: Vec<[u8; 32]> = tspec.inputs.iter().map(|i| input_hash(&spec, i)).collect();
        let task_id = def.task_name(task.task);
        // The task's own key; the coordinator adds what it depends on (see `farm::key_with_deps`).
        let key = def.own_key(task.task, &hashes);
        executor::resolve_program(&mut self.programs, &mut tspec);
        let (root, out_dir) = if local {
            (
                PathBuf::from(&def.root),
                PathBuf::from(&def.out)
                    .join(&stage.name)
                    .join(task.task.index.to_string()),
            )
        } else {
            // Apart from `{out}`, whose globs see dependencies only.
            (
                farm_dir.join("root"),
                farm_dir
                    .join("runs")
                    .join(&stage.name)
                    .join(format!("{}.{}", task.task.index, task.attempt)),
            )
        };
        let logs_dir = self.state.join("logs").join(task.farm.to_string());
        let launch = Launch {
            slot: 0,
            task: task.task,
            attempt: task.attempt,
            success_codes: stage.success_codes.clone(),
            spec: tspec,
            grant,
            key,
            farm_name: def.name.clone(),
            task_id,
            root,
            out_dir,
            stdout_log: executor::log_path(&logs_dir, def, task.task, task.attempt, "out"),
            stderr_log: executor::log_path(&logs_dir, def, task.task, task.attempt, "err"),
            gpu_ids: self.gpu_ids.clone(),
            node: self.me_label.clone(),
            view,
            hand: RIDES_MAX,
            riding: Vec::new(),
        };
        let handle = self.handle.clone();
        let cache = self.state.join("cache");
        let held = crate::state::kept_dir(&self.state, task.farm);
        let sources = self.sources(task.farm, farms);
        let transfers = self.transfers.clone();
        let riding = if local && reads_outputs(def, task.task.stage) {
            self.riding_deps(&task, farms)
        } else {
            Vec::new()
        };
        let in_memory = launch.warm();
        let deps = (!local && reads_outputs(def, task.task.stage)).then(|| DepsPlace {
            farm: task.farm,
            task: task.task,
            me: self.me,
            out: farm_out,
            cache: cache.clone(),
            held: held.clone(),
            in_memory,
        });
        let attempt = Attempt {
            launch,
            spec,
            task,
            local,
            sources,
            transfers,
            deps,
            cache,
            held,
            riding,
            handle: handle.clone(),
        };
        tokio::spawn(async move {
            let (outcome, outputs) = attempt.run().await;
            let _ = handle.tell(Event::Finished(task, outcome, outputs)).await;
        });
    }
}

impl Runs {
    /// On a farm's home: the outputs `task` depends on whose bytes rode
    /// with the log, each with where it goes in the farm's output folder,
    /// to be put there as files before it runs.
    fn riding_deps(&self, task: &Assigned, farms: &dyn Farms) -> Vec<(PathBuf, OutputFile)> {
        let mut riding = Vec::new();
        let Some(r) = farms.replica(task.farm).filter(|r| r.home) else {
            return riding;
        };
        let def = &r.spec.def;
        let mut n = 0;
        while let Some(d) = def.dependency(task.task, n) {
            n += 1;
            if let Some(Entry::Done { outputs, .. }) = r.log.get(d) {
                let dir = PathBuf::from(&def.out)
                    .join(&def.stage(d).name)
                    .join(d.index.to_string());
                riding.extend(
                    outputs
                        .iter()
                        .filter(|o| o.rides())
                        .map(|o| (dir.join(&o.path), o.clone())),
                );
            }
        }
        riding
    }

    /// On a farm's home: true once every output of the tasks `task`
    /// depends on is here and verified, so that it never reads a folder of
    /// outputs still coming (a gather once read 19 of 20). `found` counts
    /// the dependencies found here so far: a later look goes on from there.
    fn deps_here(&self, task: &Assigned, found: &mut u64, farms: &dyn Farms) -> bool {
        let Some(r) = farms.replica(task.farm).filter(|r| r.home) else {
            return true;
        };
        while let Some(d) = r.spec.def.dependency(task.task, *found) {
            if !r.outputs_here(d) && !void_place(&r.spec.def, &r.log, d) {
                return false;
            }
            *found += 1;
        }
        true
    }

    /// The folder a task of a farm submitted here runs in, when its stage
    /// gives it a workdir in the farm's folder (elsewhere each farm has a
    /// folder of its own on the node).
    fn home_workdir(&self, task: &Assigned, farms: &dyn Farms) -> Option<PathBuf> {
        let spec = farms.spec(task.farm)?;
        if spec.origin != self.me {
            return None;
        }
        let def = &spec.def;
        def.stage(task.task).workdir.as_ref()?;
        let w = def.expand(task.task).workdir?;
        Some(PathBuf::from(&def.root).join(w))
    }

    /// Whether a task of another farm runs now in the folder `task` would.
    fn workdir_taken(&self, task: &Assigned, farms: &dyn Farms) -> bool {
        // Nothing runs in a workdir of the farm folder: no task to expand.
        if self.workdirs.is_empty() {
            return false;
        }
        self.home_workdir(task, farms).is_some_and(|w| {
            self.workdirs
                .get(&w)
                .is_some_and(|(farm, n)| *farm != task.farm && *n > 0)
        })
    }

    fn workdir_taken_by(&mut self, task: &Assigned, farms: &dyn Farms) {
        if let Some(w) = self.home_workdir(task, farms) {
            let e = self.workdirs.entry(w.clone()).or_insert((task.farm, 0));
            e.1 += 1;
            self.workdir_of
                .insert((task.farm, task.task, task.attempt), w);
        }
    }

    /// A task's attempt ended: its workdir is free for another farm's.
    pub(super) fn workdir_freed(&mut self, task: &Assigned) {
        let Some(w) = self
            .workdir_of
            .remove(&(task.farm, task.task, task.attempt))
        else {
            return;
        };
        if let Some(e) = self.workdirs.get_mut(&w) {
            e.1 = e.1.saturating_sub(1);
            if e.1 == 0 {
                self.workdirs.remove(&w);
            }
        }
    }

    /// Starts the tasks whose dependencies' outputs have all come.
    pub(in crate::mesh_node) fn start_ready(&mut self, farms: &dyn Farms) {
        if self.waiting_deps.is_empty() {
            return;
        }
        let mut ready = Vec::new();
        let mut waiting = std::mem::take(&mut self.waiting_deps);
        waiting.retain_mut(|(task, grant, found)| {
            if self.deps_here(task, found, farms) && !self.workdir_taken(task, farms) {
                ready.push((*task, grant.clone()));
                false
            } else {
                true
            }
        });
        self.waiting_deps = waiting;
        for (task, grant) in ready {
            self.start(task, grant, farms);
        }
    }

    /// A task killed while it waited for its dependencies' outputs ends as
    /// its process would have, never having started. False when it was not waiting.
    pub(super) fn unwait(&mut self, task: Assigned, reason: KillReason) -> bool {
        let Some(at) = self.waiting_deps.iter().position(|(t, ..)| *t == task) else {
            return false;
        };
        self.waiting_deps.swap_remove(at);
        let sig = executor::kill_signal(reason) as i32;
        self.end_unrun(task, TaskResult::Signaled(sig));
        true
    }
}

/// One attempt at a task on this node, with all it needs off the loop.
struct Attempt {
    launch: Launch,
    spec: Arc<FarmSpec>,
    task: Assigned,
    /// The farm was submitted here: its inputs are in place, and the
    /// task's outputs stay where it wrote them.
    local: bool,
    /// The nodes its inputs are fetched from.
    sources: Vec<NodeId>,
    transfers: Arc<Transfers>,
    /// Off the home, where the outputs it depends on are put (none: it
    /// reads none, or runs on the home).
    deps: Option<DepsPlace>,
    /// This node's cache of inputs.
    cache: PathBuf,
    /// Where a remote farm's outputs are kept, content-addressed, until
    /// its home has them.
    held: PathBuf,
    /// On the home, the outputs it depends on that rode with the log.
    riding: Vec<(PathBuf, OutputFile)>,
    handle: LoopHandle,
}

/// Why an attempt ends before its task runs, in the words of its report.
#[derive(Debug, thiserror::Error)]
enum NotRun {
    #[error("cannot create {}: {source}", .dir.display())]
    Folder {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error("the outputs it depends on: {0}")]
    Deps(DepsError),
    #[error("given back: what it depends on is being made again")]
    Remade,
    #[error("fetching input `{input}`: {source}")]
    Input { input: String, source: FetchError },
    #[error("the outputs it depends on: {0}")]
    Riding(FetchError),
    #[error(transparent)]
    Grown(crate::grown::GrownError),
}

impl Attempt {
    /// Fetches its inputs, runs it, and keeps the outputs of a remote
    /// farm's task (in `held`) until its home has them.
    async fn run(mut self) -> (Outcome, Vec<OutputFile>) {
        let key = self.launch.key;
        let fail = |e: String| {
            let ended_ms = crate::state::unix_ms();
            (
                Outcome::unrun(TaskResult::Error(e), Some(key), ended_ms),
                Vec::new(),
            )
        };
        if let Err(e) = self.put_in_place().await {
            return fail(e.to_string());
        }
        let Attempt {
            launch,
            spec,
            task,
            local,
            held,
            handle,
            ..
        } = self;
        let out_dir = launch.out_dir.clone();
        // One attempt, one report: room for it is all this channel needs.
        let (done_tx, mut done_rx) = mpsc::channel::<Finished>(1);
        let live = executor::launch(launch, done_tx);
        let _ = handle.tell(Event::Launched(task, live)).await;
        let Some(f) = done_rx.recv().await else {
            return fail("the task's runner stopped".into());
        };
        let mut outcome = Outcome {
            result: f.result,
            key: Some(f.key),
            duration_ms: f.duration_ms,
            ended_ms: crate::state::unix_ms(),
            grew: None,
            logs: f.logs,
            stderr_line: f.stderr_line,
            usage: f.usage,
        };
        if matches!(outcome.result, TaskResult::Exited(c)
            if spec.def.stage(task.task).success_codes.contains(&c))
        {
            match crate::grown::count(&spec.def, task.task, &out_dir) {
                Ok(n) => outcome.grew = n,
                Err(e) => outcome.result = TaskResult::Error(e.to_string()),
            }
        }
        let mut outputs: Vec<OutputFile> = f
            .handed
            .into_iter()
            .map(|(path, data)| riding_output(path, data))
            .collect();
        if local && out_dir.exists() {
            // Run on the home: the outputs are in place. Their manifest still
            // goes into the farm's state, so a node that takes the farm over
            // knows what to bring (or to run again, when they are gone).
            let dir = out_dir.clone();
            if let Ok(Ok(m)) = tokio::task::spawn_blocking(move || manifest(&dir)).await {
                outputs.extend(m);
            }
        }
        if !local && out_dir.exists() {
            if let TaskResult::Exited(code) = outcome.result {
                if spec.def.stage(task.task).success_codes.contains(&code) {
                    let dir = out_dir.clone();
                    let kept = tokio::task::spawn_blocking(move || keep_outputs(&dir, &held)).await;
                    match kept {
                        Ok(Ok(o)) => outputs.extend(o),
                        Ok(Err(e)) => {
                            outcome.result = TaskResult::Error(format!("keeping outputs: {e}"))
                        }
                        Err(e) => {
                            outcome.result = TaskResult::Error(format!("keeping outputs: {e}"))
                        }
                    }
                }
            }
            let _ = tokio::task::spawn_blocking(move || fs::remove_dir_all(out_dir)).await;
        }
        (outcome, outputs)
    }

    /// What the task reads put where it reads it: off the home, its
    /// folder, the outputs it depends on and its inputs; on the home, the
    /// outputs that rode with the log; then a grown stage's line.
    async fn put_in_place(&mut self) -> Result<(), NotRun> {
        let (launch, spec, task) = (&mut self.launch, &self.spec, self.task);
        if !self.local {
            // The farm's folder here stands in for the submitter's: a task with
            // no workdir and no inputs still runs in it.
            fs::create_dir_all(&launch.root).map_err(|source| NotRun::Folder {
                dir: launch.root.clone(),
                source,
            })?;
            if let Some(p) = &self.deps {
                match place_deps(&self.transfers, &self.handle, spec, p).await {
                    Ok(riding) => launch.riding = riding,
                    Err(NotPlaced::Failed(e)) => return Err(NotRun::Deps(e)),
                    Err(NotPlaced::Remade) => {
                        let _ = self.handle.tell(Event::GiveBack(task)).await;
                        return Err(NotRun::Remade);
                    }
                }
            }
            let from = InputSources {
                farm: spec.id,
                nodes: &self.sources,
                cache: &self.cache,
            };
            for input in &launch.spec.inputs {
                let (hash, mode) =
                    input_file(spec, input).map_or(([0; 32], 0), |i| (i.hash, i.mode));
                let dest = launch.root.join(input);
                fetch_input(&self.transfers, &self.handle, &from, hash, mode, &dest)
                    .await
                    .map_err(|source| NotRun::Input {
                        input: input.clone(),
                        source,
                    })?;
            }
        }
        let riding = std::mem::take(&mut self.riding);
        give_riding(launch, &spec.def.out, riding)
            .await
            .map_err(NotRun::Riding)?;
        // A task of a grown stage: its value is a line of what the task it grew
        // from wrote, which is under `{out}` here now, as any dependency's.
        let out_root = match &self.deps {
            Some(p) => p.out.clone(),
            None => PathBuf::from(&spec.def.out),
        };
        match crate::grown::line(&spec.def, task.task, &out_root) {
            Ok(Some(line)) => {
                let seen_out = launch.view.as_ref().map_or(&out_root, |v| &v.dir);
                launch.spec =
                    spec.def
                        .expand_line_in(task.task, &seen_out.to_string_lossy(), &line);
                executor::resolve_program(&mut HashMap::new(), &mut launch.spec);
            }
            Ok(None) => {}
            Err(e) => return Err(NotRun::Grown(e)),
        }
        Ok(())
    }
}

/// On the home, the outputs a task depends on that rode with the log: in
/// memory for a warm worker (a gather of a hundred small values made a
/// hundred files), else as files where its `{out}` shows them.
async fn give_riding(
    launch: &mut Launch,
    out: &str,
    riding: Vec<(PathBuf, OutputFile)>,
) -> Result<(), FetchError> {
    if riding.is_empty() {
        return Ok(());
    }
    if launch.warm() {
        let out = PathBuf::from(out);
        launch.riding = riding
            .into_iter()
            .filter_map(|(dest, o)| {
                let rel = dest.strip_prefix(&out).ok()?.to_string_lossy().into_owned();
                Some((rel, o.data?.into_vec()))
            })
            .collect();
        return Ok(());
    }
    tokio::task::spawn_blocking(move || {
        riding
            .iter()
            .try_for_each(|(dest, o)| place_riding(o, dest))
    })
    .await
    .map_err(FetchError::from)
    .and_then(|r| r)
}

/// An output handed back by the task, as the report carries it.
fn riding_output(path: String, data: Vec<u8>) -> OutputFile {
    OutputFile {
        path,
        hash: *blake3::hash(&data).as_bytes(),
        size: data.len() as u64,
        mode: 0o644,
        data: Some(data.into_boxed_slice()),
    }
}
