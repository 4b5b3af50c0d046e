//! The node's kept room: earlier results on a farm's home: what each finished farm left, by content key, and a new submission's tasks done before put in place instead of run again.
//!
//! The home writes down, when a farm it is the home of ends, where each
//! done task's outputs are (see `crate::results`), under the task's content
//! key as the coordinator recorded it (its own key and what it depends on).
//! A farm submitted here later works out the same keys for its tasks, in
//! the order of their dependencies, and each task whose key is written
//! down, with its outputs still there unchanged, is done from the start:
//! its outputs linked (or copied) into the new farm's folder, its entry
//! sent with the submission. Keys not kept here are asked of the other
//! nodes that were homes of farms of the same name (as this node and the
//! coordinator know them): what they keep is done from the start too, its
//! outputs brought here as those of any task run elsewhere (and the task
//! run again should that node be gone before they come).
//!
//! The room is [`Kept`]: the loop lends it the store, the transfers that
//! serve what it puts in place and the farms (read-only, through
//! [`Farms`]) as a [`Lent`]; it never touches the `Peer`. A submission it
//! has looked at comes back to the loop to be submitted.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::time::Duration;

use mesh_protocol::farm::{FarmDef, TaskRef};
pub(super) use mesh_protocol::home::TaskKeys;
use mesh_protocol::home::{self, Reuse};
use mesh_protocol::mesh::{files_to_bring, Entry, FarmId, FarmSpec, NodeId, OutputFile, Ran};
use mesh_protocol::wire::{Request, Response};
use mesh_store::{mesh::NODE_KEY, SledStore, Store, Write};
use serde::{Deserialize, Serialize};

use super::reply::Reply;
use super::runs::{input_hash, Farms, Transfers};
use super::{Event, LoopHandle};
use crate::control::ControlResponse;
use crate::results::{meta_name, Place, Results};

/// How long a submission waits for the coordinator's list of farms, and
/// for each earlier home's answer, before it goes on without them.
const KEPT_WAIT: Duration = Duration::from_secs(5);

/// What the home keeps of a content key: where its outputs were left, and
/// the outputs themselves (their hashes and modes travel with the entry).
#[derive(Debug, Default, Serialize, Deserialize)]
struct KeptResult {
    places: Results,
    outputs: Vec<OutputFile>,
    /// What its run grew (see `Outcome::grew`), for the stages grown from it.
    grew: Option<u32>,
    /// The run that made these outputs, whose logs a task reusing them
    /// shows (`mesh logs`, Python's `t.stdout()`). None for results
    /// brought from another home.
    ran: Option<RanAt>,
}

/// What this node keeps of a farm's tasks, as a submission finds it: each
/// task's kept result, and which folder of the farm's `out` holds which
/// task's result.
struct KeptHere {
    tasks: HashMap<TaskRef, KeptResult>,
    holder: HashMap<PathBuf, TaskRef>,
}

/// A farm on its way in whose earlier results are being looked for: the
/// tasks done from the start so far, and those whose results are still
/// wanted, by content key.
struct Reusing {
    spec: FarmSpec,
    reused: Vec<Entry>,
    wanted: Vec<(TaskRef, [u8; 32])>,
}

impl KeptResult {
    /// Its outputs all rode with the log: kept here whole, in no folder.
    fn rides(&self) -> bool {
        !self.outputs.is_empty() && !files_to_bring(&self.outputs)
    }
}

/// The kept room: what it needs of its own; the rest is lent.
pub(super) struct Kept {
    me: NodeId,
    handle: LoopHandle,
}

/// What the loop lends the kept room for one call.
pub(super) struct Lent<'a> {
    pub(super) store: &'a mut SledStore,
    pub(super) transfers: &'a Transfers,
    pub(super) farms: &'a dyn Farms,
}

/// A farm submitted here, its inputs hashed: its tasks' keys, and per
/// stage whether its earlier results may be reused (not when `--rerun`
/// names it).
pub(super) struct Submitting {
    pub(super) spec: FarmSpec,
    pub(super) keys: TaskKeys,
    pub(super) rerun: Vec<bool>,
    pub(super) reply: Reply,
}

/// A submission looked at: to submit now with the tasks done before, or
/// (`None`) waiting for the earlier homes' answers, off the loop.
pub(super) type Looked = Option<(FarmSpec, Vec<Entry>, Reply)>;

/// Where a kept result was made: the farm, its task, the attempt and the
/// node whose log folder has what that run wrote.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub(super) struct RanAt {
    pub(super) farm: FarmId,
    pub(super) task: TaskRef,
    pub(super) attempt: u32,
    pub(super) node: NodeId,
}

impl Kept {
    pub(super) fn new(me: NodeId, handle: LoopHandle) -> Kept {
        Kept { me, handle }
    }

    /// On the home of `farm`: writes down where each done task's outputs
    /// are (of `only`, when given), by its content key; flushed when the
    /// farm ended, else a cache (a lost one costs a rerun).
    pub(super) fn remember(
        &self,
        lent: &mut Lent<'_>,
        farm: FarmId,
        only: Option<&[TaskRef]>,
        flush: bool,
    ) {
        let Some(r) = lent.farms.replica(farm).filter(|r| r.home) else {
            return;
        };
        let def = &r.spec.def;
        let out = Path::new(r.out_dir());
        let mut batch = vec![Write::Meta {
            farm: NODE_KEY,
            name: name_meta(&def.name),
            value: vec![1],
        }];
        let entries: Box<dyn Iterator<Item = &Entry>> = match only {
            Some(ts) => Box::new(ts.iter().filter_map(|t| r.log.get(*t))),
            None => Box::new(r.log.current()),
        };
        for e in entries {
            let Entry::Done {
                task,
                key: Some(key),
                outputs,
                ran,
                node,
                attempt,
            } = e
            else {
                continue;
            };
            let dir = out
                .join(&def.stage(*task).name)
                .join(task.index.to_string());
            // Outputs that rode with the log are kept with the key, not
            // in a folder.
            let place = match Place::left(&dir, files_to_bring(outputs)) {
                Ok(p) => p,
                Err(e) => {
                    tracing::info!(dir = %dir.display(), "outputs not written down for reuse: {e}");
                    continue;
                }
            };
            let name = meta_name(key);
            let mut kept = kept(lent.store, &name).unwrap_or_default();
            let files = !place.files.is_empty();
            kept.outputs = outputs.to_vec();
            // A folder holds it only when it left files there.
            if !kept.rides() {
                kept.places.add(place);
            }
            kept.grew = ran.as_ref().and_then(|r| r.grew);
            // A reused task (attempt 0) did not run: the run that made
            // its outputs stays the one written down.
            if *attempt > 0 {
                kept.ran = Some(RanAt {
                    farm,
                    task: *task,
                    attempt: *attempt,
                    node: *node,
                });
            }
            batch.push(Write::Meta {
                farm: NODE_KEY,
                name,
                value: postcard::to_stdvec(&kept).expect("plain data"),
            });
            if files {
                // Which key this folder holds: set aside when the farm no
                // longer has its task, it stays that key's result.
                batch.push(Write::Meta {
                    farm: NODE_KEY,
                    name: crate::results::holder_name(&dir),
                    value: key.to_vec(),
                });
            }
        }
        if flush {
            write_kept(lent.store, batch);
        } else if let Err(e) = lent.store.write(batch) {
            tracing::warn!("results not written down for reuse: {e}");
        }
    }

    /// Folders of tasks a submission no longer has, moved aside: the
    /// results of other farms' keys they held are written down where they
    /// went (a sweep grown back reuses them).
    fn kept_set_aside(
        &self,
        store: &SledStore,
        moves: &[(PathBuf, PathBuf)],
        batch: &mut Vec<Write>,
    ) {
        for (from, to) in moves {
            let Some(held) = store
                .meta(NODE_KEY, &crate::results::holder_name(from))
                .ok()
                .flatten()
            else {
                continue;
            };
            let Ok(key) = <[u8; 32]>::try_from(held.as_slice()) else {
                continue;
            };
            let name = meta_name(&key);
            let Some(mut kept) = kept(store, &name) else {
                continue;
            };
            if kept.places.renamed(from, to) {
                batch.push(Write::Meta {
                    farm: NODE_KEY,
                    name,
                    value: postcard::to_stdvec(&kept).expect("plain data"),
                });
                batch.push(Write::Meta {
                    farm: NODE_KEY,
                    name: crate::results::holder_name(to),
                    value: key.to_vec(),
                });
            }
        }
    }

    /// Submits a farm handed to this node, with the tasks done before
    /// (stages `rerun` marks left out) as done from the start: those whose
    /// results this node kept, their outputs put in the farm's folder, and
    /// then those the homes of earlier farms of its name keep, which this
    /// node, the farm's home, brings from them as any output. A home that
    /// does not answer in time costs reruns, never the submission.
    ///
    /// `homes` are the other nodes this node knows were homes of farms of
    /// its name, `coordinator` the coordinator when it is another node.
    pub(super) fn submit_reusing(
        &self,
        lent: &mut Lent<'_>,
        farm: Submitting,
        homes: BTreeSet<NodeId>,
        coordinator: Option<NodeId>,
    ) -> Looked {
        let Submitting {
            spec,
            keys,
            rerun,
            reply,
        } = farm;
        let rerun = &rerun[..];
        // Nothing of a farm of this name kept here: no look-up per task.
        let any_here = kept_name(lent.store, &spec.def.name);
        let mut reused = Vec::new();
        let mut wanted = Vec::new();
        let mut batch = Vec::new();
        let out = Path::new(&spec.def.out);
        // What this node keeps for each task, first, and which folder of
        // `out` holds which task's result: a line inserted above tasks
        // moves each to the next index, where the folder it is put in may
        // hold, whole, the result the next task is known by now.
        let mut here = kept_for(lent.store, &keys, rerun, any_here);
        self.set_aside_for(lent.store, &spec.def, &mut here, &mut batch, &reply);
        let KeptHere {
            tasks: mut found,
            holder,
        } = here;
        let mut aside = Aside {
            holder,
            stash: out.join(crate::results::STASH_DIR),
            stashed: 0,
        };
        // Whether each stage has a folder in `out`: none, nothing of an
        // earlier run to set aside, and no task's folder is looked at.
        let earlier: Vec<bool> = spec
            .def
            .stages
            .iter()
            .map(|st| out.join(&st.name).is_dir())
            .collect();
        let plan = home::reuse(&keys, rerun, |t| found.contains_key(&t), |s| earlier[s]);
        for (t, what) in plan {
            let (s, i) = (t.stage as usize, t.index as usize);
            let dir = out.join(&spec.def.stages[s].name).join(i.to_string());
            let key = keys[s][i];
            let what = match what {
                Reuse::Kept => {
                    aside.keep(t, &dir, &keys, &mut found);
                    let kept = found.remove(&t).expect("planned from what was found");
                    match self.reuse_kept(lent.transfers, t, &key, &dir, kept, &mut batch) {
                        Some(done) => {
                            reused.push(done);
                            continue;
                        }
                        None => home::unkept(earlier[s]),
                    }
                }
                run => run,
            };
            if let Reuse::Run { forget, ask } = what {
                // An earlier run's outputs, which a failure must not leave
                // standing as its result.
                if forget {
                    aside.forget(t, &dir, &keys, &mut found);
                }
                if ask {
                    wanted.push((t, key));
                }
            }
        }
        // What was kept aside and not taken is no task's of this farm.
        if aside.stashed > 0 {
            if let Err(e) = crate::results::remove_folder(&aside.stash) {
                tracing::info!(dir = %aside.stash.display(), "results kept aside stay: {e}");
            }
        }
        write_kept(lent.store, batch);
        if wanted.is_empty() || (homes.is_empty() && coordinator.is_none()) {
            return Some((spec, reused, reply));
        }
        let farm = Reusing {
            spec,
            reused,
            wanted,
        };
        self.reuse_from_homes(farm, homes, coordinator, reply);
        None
    }

    /// The outputs `kept` for task `t` (known by `key`) put in `dir`, and
    /// served from there: the task done from the start, or `None` when
    /// they could not be put there (it runs). What changed of the
    /// record is written with `batch`.
    fn reuse_kept(
        &self,
        transfers: &Transfers,
        t: TaskRef,
        key: &[u8; 32],
        dir: &Path,
        mut kept: KeptResult,
        batch: &mut Vec<Write>,
    ) -> Option<Entry> {
        if kept.rides() {
            // Nothing to put in place: the bytes go with the entry.
            return Some(done_before(t, *key, self.me, kept.outputs, kept.grew));
        }
        let crate::results::Reused { here, changed } = kept.places.reuse(dir).unwrap_or_else(|e| {
            tracing::info!(dir = %dir.display(), "earlier outputs not reused: {e}");
            crate::results::Reused::FAILED
        });
        if changed {
            batch.push(Write::Meta {
                farm: NODE_KEY,
                name: meta_name(key),
                value: postcard::to_stdvec(&kept).expect("plain data"),
            });
        }
        if !here {
            return None;
        }
        // Served from where they are now: a file of these contents was
        // served from another folder before (a line inserted above moved
        // this task to a new index), which may hold another task's now.
        for o in kept.outputs.iter().filter(|o| !o.rides()) {
            transfers.serve_file(o.hash, dir.join(&o.path));
        }
        if files_to_bring(&kept.outputs) {
            batch.push(Write::Meta {
                farm: NODE_KEY,
                name: crate::results::holder_name(dir),
                value: key.to_vec(),
            });
        }
        Some(done_before(t, *key, self.me, kept.outputs, kept.grew))
    }

    /// The tasks of an open farm's added stages (from stage `from` on)
    /// whose results this node keeps, put in place and done from the
    /// start, as a farm submitted again reuses them; their outputs'
    /// folders are the farm's own, new with their stages, so nothing is
    /// set aside. Results kept by other homes are not asked for.
    pub(super) fn reused_in_growth(
        &self,
        lent: &mut Lent<'_>,
        spec: &FarmSpec,
        keys: &TaskKeys,
        from: usize,
    ) -> Vec<Entry> {
        let mut reused = Vec::new();
        if !kept_name(lent.store, &spec.def.name) {
            return reused;
        }
        let mut batch = Vec::new();
        let out = Path::new(&spec.def.out);
        for (s, stage_keys) in keys.iter().enumerate().skip(from) {
            let stage = out.join(&spec.def.stages[s].name);
            for (i, key) in stage_keys.iter().enumerate() {
                let Some(kept) = kept(lent.store, &meta_name(key)) else {
                    continue;
                };
                let t = TaskRef::new(s as u32, i as u32);
                let dir = stage.join(i.to_string());
                reused.extend(self.reuse_kept(lent.transfers, t, key, &dir, kept, &mut batch));
            }
        }
        write_kept(lent.store, batch);
        reused
    }

    /// `out` holds the farm as it is now: a sweep cut short, a stage gone,
    /// leave it (see `results::set_aside_stale`); what they hold stays a
    /// result where it went (a sweep grown back takes it), and the
    /// folders that move are followed in `here`.
    fn set_aside_for(
        &self,
        store: &SledStore,
        def: &FarmDef,
        here: &mut KeptHere,
        batch: &mut Vec<Write>,
        reply: &Reply,
    ) {
        let KeptHere {
            tasks: found,
            holder,
        } = here;
        let out = Path::new(&def.out);
        match crate::results::set_aside_stale(out, def, crate::state::unix_ms()) {
            Ok(Some(set)) => {
                let mut elsewhere = Vec::new();
                for (from, to) in &set.moves {
                    match holder.remove(from) {
                        Some(t) => {
                            if let Some(kept) = found.get_mut(&t) {
                                kept.places.renamed(from, to);
                            }
                            holder.insert(to.clone(), t);
                        }
                        None => elsewhere.push((from.clone(), to.clone())),
                    }
                }
                self.kept_set_aside(store, &elsewhere, batch);
                let n = set.moves.len() as u64;
                let _ = reply.send(ControlResponse::Warning(crate::results::set_aside_line(
                    n, &set.to,
                )));
            }
            Ok(None) => {}
            Err(e) => {
                let _ = reply.send(ControlResponse::Warning(format!(
                    "the outputs of tasks no longer in the farm stay in {}: {e}",
                    out.display()
                )));
            }
        }
    }

    /// The tasks not kept here, asked of the homes of earlier farms of
    /// the name (and those the coordinator knows): the farm is submitted
    /// with whatever they keep, off the loop.
    fn reuse_from_homes(
        &self,
        farm: Reusing,
        homes: BTreeSet<NodeId>,
        coordinator: Option<NodeId>,
        reply: Reply,
    ) {
        let Reusing {
            spec,
            mut reused,
            wanted,
        } = farm;
        let handle = self.handle.clone();
        let (me, name) = (self.me, spec.def.name.clone());
        tokio::spawn(async move {
            let mut listed = Vec::new();
            if let Some(c) = coordinator {
                let asked = tokio::time::timeout(KEPT_WAIT, handle.request(c, Request::ListFarms));
                if let Ok(Ok(Response::Farms(farms))) = asked.await {
                    listed = farms;
                }
            }
            let listed = listed.iter().map(|f| (f.name.as_str(), f.home.node));
            let homes = home::homes_to_ask(&homes, listed, &name, me);
            let keys: Vec<[u8; 32]> = wanted.iter().map(|(_, k)| *k).collect();
            let asks = homes.into_iter().map(|h| {
                let (handle, keys) = (handle.clone(), keys.clone());
                async move {
                    let asked = handle.request(h, Request::Kept { keys });
                    (h, tokio::time::timeout(KEPT_WAIT, asked).await)
                }
            });
            let mut answers = Vec::new();
            for (h, answer) in futures::future::join_all(asks).await {
                if let Ok(Ok(Response::Kept(kept))) = answer {
                    let kept = kept
                        .into_iter()
                        .map(|(k, outputs, grew)| (k, (outputs, grew)));
                    answers.push((h, kept.collect()));
                }
            }
            for (t, k, h, (outputs, grew)) in home::first_keeper(&wanted, &answers) {
                reused.push(done_before(t, k, h, outputs.clone(), *grew));
            }
            let _ = handle
                .tell(Event::SubmitReused(Box::new(spec), reused, reply))
                .await;
        });
    }

    /// Answers [`Request::Kept`]: the keys whose outputs this node keeps
    /// whole, each with its outputs, served by hash from now on.
    pub(super) fn kept_here(
        &self,
        lent: &mut Lent<'_>,
        keys: &[[u8; 32]],
    ) -> Vec<([u8; 32], Vec<OutputFile>, Option<u32>)> {
        let mut out = Vec::new();
        for key in keys {
            let Some(kept) = kept(lent.store, &meta_name(key)) else {
                continue;
            };
            if !kept.rides() {
                let Some(place) = kept.places.whole() else {
                    continue;
                };
                for o in kept.outputs.iter().filter(|o| !o.rides()) {
                    lent.transfers
                        .serve_file(o.hash, Path::new(&place.dir).join(&o.path));
                }
            }
            out.push((*key, kept.outputs, kept.grew));
        }
        out
    }

    /// The run whose outputs a task of `farm` reused, as this node (its
    /// home) wrote it down: None for a task that ran in `farm`, or whose
    /// result came from another home.
    pub(super) fn reused_from(
        &self,
        lent: &Lent<'_>,
        farm: FarmId,
        task: TaskRef,
    ) -> Option<RanAt> {
        let r = lent.farms.replica(farm)?;
        let key = match r.log.get(task)? {
            Entry::Done {
                key: Some(key),
                attempt: 0,
                ..
            } => **key,
            _ => return None,
        };
        kept(lent.store, &meta_name(&key))?.ran
    }
}

/// Whether this node kept the results of a farm named `name`.
fn kept_name(store: &SledStore, name: &str) -> bool {
    matches!(store.meta(NODE_KEY, &name_meta(name)), Ok(Some(_)))
}

fn kept(store: &SledStore, name: &str) -> Option<KeptResult> {
    let bytes = store.meta(NODE_KEY, name).ok()??;
    postcard::from_bytes(&bytes).ok()
}

/// What is written down for reuse is a cache: a write that fails costs
/// a rerun later, never a result, so it is said and the node goes on.
fn write_kept(store: &mut SledStore, batch: Vec<Write>) {
    if batch.is_empty() {
        return;
    }
    if let Err(e) = store.write(batch).and_then(|()| store.flush()) {
        tracing::warn!("results not written down for reuse: {e}");
    }
}

/// What this node keeps for each task of the farm (none of a stage
/// run again), and which folder of `out` holds which task's result: a
/// line inserted above tasks moves each to the next index, where the
/// folder it is put in may hold, whole, the result the next task is
/// known by now.
fn kept_for(store: &SledStore, keys: &TaskKeys, rerun: &[bool], any_here: bool) -> KeptHere {
    let mut found: HashMap<TaskRef, KeptResult> = HashMap::new();
    let mut holder: HashMap<PathBuf, TaskRef> = HashMap::new();
    if any_here {
        for (s, stage_keys) in keys.iter().enumerate() {
            if rerun.get(s).copied().unwrap_or(false) {
                continue;
            }
            for (i, key) in stage_keys.iter().enumerate() {
                let t = TaskRef::new(s as u32, i as u32);
                if let Some(kept) = kept(store, &meta_name(key)) {
                    for p in &kept.places.places {
                        holder.insert(PathBuf::from(&p.dir), t);
                    }
                    found.insert(t, kept);
                }
            }
        }
    }
    KeptHere {
        tasks: found,
        holder,
    }
}

/// Every task's content key as the coordinator records it, from the
/// stages from `from` on (see `home::task_keys`): the inputs' hashes are
/// the submission's.
pub(super) fn task_keys(spec: &FarmSpec, from: usize) -> TaskKeys {
    home::task_keys(&spec.def, from, |p| input_hash(spec, p))
}

/// The name under which a node notes that it kept results of farms named `name`.
fn name_meta(name: &str) -> String {
    format!("kept-name/{name}")
}

/// The entry of a task done before: attempt 0, counted as reused, with
/// what it grew.
fn done_before(
    task: TaskRef,
    key: [u8; 32],
    node: NodeId,
    outputs: Vec<OutputFile>,
    grew: Option<u32>,
) -> Entry {
    Entry::Done {
        task,
        key: Some(Box::new(key)),
        node,
        attempt: 0,
        outputs: outputs.into(),
        ran: grew.map(|grew| {
            Box::new(Ran {
                ended_ms: 0,
                duration_ms: 0,
                exit_code: None,
                grew: Some(grew),
                usage: None,
            })
        }),
    }
}

/// Results a submission is about to put in folders that hold, whole, the
/// result another of its tasks is known by now: moved to the stash first,
/// for that task to take.
struct Aside {
    /// Which task's kept result each folder holds.
    holder: HashMap<PathBuf, TaskRef>,
    stash: PathBuf,
    stashed: u64,
}

impl Aside {
    /// Before `dir` takes task `t`'s result.
    fn keep(
        &mut self,
        t: TaskRef,
        dir: &Path,
        keys: &TaskKeys,
        found: &mut HashMap<TaskRef, KeptResult>,
    ) {
        let Some(&other) = self.holder.get(dir) else {
            return;
        };
        if other == t || keys_of(keys, other) == keys_of(keys, t) {
            return;
        }
        let Some(kept) = found.get_mut(&other) else {
            return;
        };
        self.stashed += 1;
        let to = self.stash.join(self.stashed.to_string());
        match kept.places.moved(dir, &to) {
            Ok(true) => {
                self.holder.remove(dir);
                self.holder.insert(to, other);
            }
            Ok(false) => {}
            Err(e) => tracing::info!(dir = %dir.display(), "an earlier result not kept aside: {e}"),
        }
    }

    /// Before `dir` is emptied for task `t` to run.
    fn forget(
        &mut self,
        t: TaskRef,
        dir: &Path,
        keys: &TaskKeys,
        found: &mut HashMap<TaskRef, KeptResult>,
    ) {
        self.keep(t, dir, keys, found);
        if let Err(e) = crate::results::remove_folder(dir) {
            tracing::info!(dir = %dir.display(), "an earlier run's outputs stay: {e}");
        }
    }
}

/// Task `t`'s key among a submission's.
fn keys_of(keys: &TaskKeys, t: TaskRef) -> Option<[u8; 32]> {
    keys.get(t.stage as usize)?.get(t.index as usize).copied()
}
