//! Earlier results on a farm's home: what each finished farm left, by content key, and a new submission's tasks done before put in place instead of run again.
//!
//! The home writes down, when a farm it is the home of ends, where each
//! done task's outputs are (see `crate::results`), under the task's content
//! key as the coordinator recorded it (its own key and what it depends on).
//! A farm submitted here later works out the same keys for its tasks, in
//! the order of their dependencies, and each task whose key is written
//! down, with its outputs still there unchanged, is done from the start:
//! its outputs linked (or copied) into the new farm's folder, its entry
//! sent with the submission.

use std::collections::HashMap;
use std::path::Path;

use mesh_protocol::farm::{
    content_key, deps_digest, has_deps, key_with_deps, stage_digest, FarmDef, TaskRef,
};
use mesh_protocol::mesh::{Entry, FarmId, FarmSpec, OutputFile};
use mesh_store::{mesh::NODE_KEY, Store, Write};
use serde::{Deserialize, Serialize};

use super::staging::input_hash;
use super::Node;
use crate::results::{meta_name, Place, Results};

/// What the home keeps of a content key: where its outputs were left, and
/// the outputs themselves (their hashes and modes travel with the entry).
#[derive(Debug, Default, Serialize, Deserialize)]
struct Kept {
    places: Results,
    outputs: Vec<OutputFile>,
}

impl Node {
    /// On the home of a farm that just ended: writes down where each done
    /// task's outputs are, by its content key.
    pub(super) fn remember_results(&mut self, farm: FarmId) {
        let Some(r) = self.peer.replica(farm).filter(|r| r.home) else {
            return;
        };
        let def = &r.spec.def;
        let out = Path::new(r.out_dir());
        let mut batch = Vec::new();
        for e in r.log.current() {
            let Entry::Done {
                task,
                key: Some(key),
                outputs,
                ..
            } = e
            else {
                continue;
            };
            let dir = out
                .join(&def.stage(*task).name)
                .join(task.index.to_string());
            let place = if outputs.is_empty() {
                Place {
                    dir: dir.to_string_lossy().into_owned(),
                    files: Vec::new(),
                }
            } else {
                match Place::of(&dir) {
                    Ok(p) => p,
                    Err(e) => {
                        tracing::info!(dir = %dir.display(), "outputs not written down for reuse: {e}");
                        continue;
                    }
                }
            };
            let name = meta_name(key);
            let mut kept = self.kept(&name).unwrap_or_default();
            kept.places.add(place);
            kept.outputs = outputs.to_vec();
            batch.push(Write::Meta {
                farm: NODE_KEY,
                name,
                value: postcard::to_stdvec(&kept).expect("plain data"),
            });
        }
        self.write_kept(batch);
    }

    /// The tasks of a farm about to be submitted here that were done
    /// before with the same content key (stages `rerun` marks left out),
    /// their outputs put in the farm's folder: entries done from the start.
    pub(super) fn reusable(&mut self, spec: &FarmSpec, rerun: &[bool]) -> Vec<Entry> {
        let def = &spec.def;
        let out = Path::new(&def.out);
        let mut keys: HashMap<TaskRef, [u8; 32]> = HashMap::new();
        let mut digests: HashMap<u32, [u8; 32]> = HashMap::new();
        let mut entries = Vec::new();
        let mut batch = Vec::new();
        for s in dependency_order(def) {
            if rerun.get(s as usize).copied().unwrap_or(false) {
                continue;
            }
            let stage = &def.stages[s as usize];
            // A whole-stage dependency counts only once every task of it was reused.
            for &d in &stage.after {
                let len = def.stages[d as usize].len();
                if !digests.contains_key(&d)
                    && (0..len).all(|i| keys.contains_key(&TaskRef::new(d, i)))
                {
                    digests.insert(d, stage_digest(def, d, |t| keys.get(&t).copied()));
                }
            }
            if stage.after.iter().any(|d| !digests.contains_key(d)) {
                continue;
            }
            for i in 0..stage.len() {
                let t = TaskRef::new(s, i);
                if stage
                    .after_each
                    .iter()
                    .any(|&d| !keys.contains_key(&TaskRef::new(d, i)))
                {
                    continue;
                }
                let hashes: Vec<[u8; 32]> = def
                    .expand(t)
                    .inputs
                    .iter()
                    .map(|p| input_hash(spec, p))
                    .collect();
                let mut key = content_key(
                    &def.name,
                    &def.task_name(t),
                    &def.expand_for_key(t),
                    &stage.resources,
                    &hashes,
                );
                if has_deps(def, s) {
                    let deps = deps_digest(def, t, |d| digests[&d], |d| keys.get(&d).copied());
                    key = key_with_deps(&key, &deps);
                }
                let name = meta_name(&key);
                let Some(mut kept) = self.kept(&name) else {
                    continue;
                };
                let dir = out.join(&stage.name).join(i.to_string());
                let (reused, changed) = kept.places.reuse(&dir).unwrap_or_else(|e| {
                    tracing::info!(dir = %dir.display(), "earlier outputs not reused: {e}");
                    (false, true)
                });
                if changed {
                    batch.push(Write::Meta {
                        farm: NODE_KEY,
                        name,
                        value: postcard::to_stdvec(&kept).expect("plain data"),
                    });
                }
                if reused {
                    keys.insert(t, key);
                    entries.push(Entry::Done {
                        task: t,
                        key: Some(Box::new(key)),
                        node: self.me,
                        attempt: 0,
                        outputs: kept.outputs.into(),
                    });
                }
            }
        }
        self.write_kept(batch);
        entries
    }

    fn kept(&self, name: &str) -> Option<Kept> {
        let bytes = self.store.meta(NODE_KEY, name).ok()??;
        postcard::from_bytes(&bytes).ok()
    }

    /// What is written down for reuse is a cache: a write that fails costs
    /// a rerun later, never a result, so it is said and the node goes on.
    fn write_kept(&mut self, batch: Vec<Write>) {
        if batch.is_empty() {
            return;
        }
        if let Err(e) = self.store.write(batch).and_then(|()| self.store.flush()) {
            tracing::warn!("results not written down for reuse: {e}");
        }
    }
}

/// The farm's stages, each after every stage it depends on.
fn dependency_order(def: &FarmDef) -> Vec<u32> {
    let n = def.stages.len();
    let mut placed = vec![false; n];
    let mut order = Vec::with_capacity(n);
    // The farm file refuses cycles: each round places at least one stage.
    while order.len() < n {
        let before = order.len();
        for (s, stage) in def.stages.iter().enumerate() {
            if !placed[s]
                && stage
                    .after
                    .iter()
                    .chain(&stage.after_each)
                    .all(|&d| placed[d as usize])
            {
                placed[s] = true;
                order.push(s as u32);
            }
        }
        if order.len() == before {
            break;
        }
    }
    order
}
