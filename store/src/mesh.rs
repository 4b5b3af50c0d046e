//! A mesh node's durable state: how a peer's `Persist` actions become store writes, and how a restarted node reads its farms back.
//!
//! One mapping for the real node and the simulator, so the simulator's
//! crashes and restarts exercise what the node keeps on disk.
//!
//! Layout, by store key:
//! - [`NODE_KEY`]: the list of farms held here (`farms`), the results
//!   reported and not yet acknowledged (`h/<farm>/<stage>/<index>`, one
//!   each, so a step writes only what changed), and the allocation book
//!   (`allocs`).
//! - a farm's key (its id): its spec (`spec`), and each later generation
//!   of an open farm written since as what it adds (`g/<generation before>`,
//!   so a growth costs what it adds, not the farm's size); its task records (the
//!   coordinator's own, or entries copied from elsewhere as records); next
//!   to a record, for a task whose outputs are kept somewhere or that
//!   failed, the whole entry (`e/<stage>/<index>`); its final counts once
//!   it is over here (`finished`).
//! - a key derived from the farm's: on the home, the tasks whose outputs
//!   are here (as done records).

use std::sync::Arc;

use mesh_protocol::engine::{Counts, RecordState, TaskRecord};
use std::collections::HashMap;

use mesh_protocol::mesh::{
    entry_record, record_entry, AllocBook, Entry, FarmId, FarmSpec, Growth, Home, Persist, Report,
    SpecHeld, StoredFarm,
};
use mesh_protocol::TaskRef;
use serde::{Deserialize, Serialize};

use crate::{decode, encode, FarmKey, Result, Store, Write};

/// Where the node's own list of farms and held results live.
pub const NODE_KEY: FarmKey = FarmKey(0);
const META_FARMS: &str = "farms";
/// Held results, one per task: `h/<farm>/<stage>/<index>`.
const META_HELD: &str = "h/";
const META_SPEC: &str = "spec";
/// A later generation of a farm written as what it adds: `g/<gen before>`.
const META_GROWTH: &str = "g/";
const META_FINISHED: &str = "finished";
const META_HOME: &str = "home";
/// The mesh's allocation queues (`mesh alloc`), as this node last heard.
const META_ALLOCS: &str = "allocs";
/// Where the home records which outputs are here: a key of its own,
/// derived from the farm's and the home's claim (farm ids use all 64 bits,
/// so no bit of the farm's own key is free to mark it; a node that takes a
/// farm over starts with nothing collected in its new folder).
fn collected_key(farm: FarmId, home: Home) -> FarmKey {
    let h = blake3::Hasher::new()
        .update(b"mesh collected outputs")
        .update(&farm.0.to_le_bytes())
        .update(&home.epoch.to_le_bytes())
        .finalize();
    FarmKey(u64::from_le_bytes(
        h.as_bytes()[..8].try_into().expect("8 bytes"),
    ))
}

fn growth_meta(after: u32) -> String {
    // Zero-padded: the store lists them in the order they apply.
    format!("{META_GROWTH}{after:010}")
}

/// `next` as what it adds to `was`, when it is `was` grown: the stages
/// there and their inputs unchanged, the rest the same farm.
fn growth_between(was: &FarmSpec, next: &FarmSpec) -> Option<Growth> {
    let n = was.inputs.len();
    let same = was.grows_into(next)
        && next.inputs.len() >= n
        && next.inputs[..n] == was.inputs[..]
        && (next.origin, next.submitted_ms) == (was.origin, was.submitted_ms)
        && (&next.def.name, &next.def.root, &next.def.out)
            == (&was.def.name, &was.def.root, &was.def.out);
    same.then(|| Growth::since(SpecHeld::of(was), next))
        .flatten()
}

fn entry_meta(t: TaskRef) -> String {
    format!("e/{}/{}", t.stage, t.index)
}

fn held_meta(farm: FarmId, t: TaskRef) -> String {
    format!("{META_HELD}{farm}/{}/{}", t.stage, t.index)
}

/// A farm as this node last kept it, and its final counts when it was over.
pub type Restored = (StoredFarm, Option<(Counts, Vec<Counts>)>);

/// The farms a node holds, as its store lists them.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct MeshState {
    farms: Vec<FarmId>,
    /// Each open farm's spec as last written here: a later generation of
    /// it is written as what it adds. A closed farm grows no more, and is
    /// not kept here.
    #[serde(skip)]
    written: HashMap<FarmId, Arc<FarmSpec>>,
}

impl MeshState {
    /// Reads a node's farms and held results back.
    pub fn load<S: Store>(store: &S) -> Result<(MeshState, Vec<Restored>, Vec<Report>)> {
        let mut state: MeshState = match store.meta(NODE_KEY, META_FARMS)? {
            Some(b) => decode("the node's farm list", &b)?,
            None => MeshState::default(),
        };
        let mut held: Vec<Report> = Vec::new();
        for (_, b) in store.metas(NODE_KEY, META_HELD)? {
            held.push(decode("a held result", &b)?);
        }
        let mut farms = Vec::new();
        for fid in &state.farms {
            let key = FarmKey(fid.0);
            let Some(b) = store.meta(key, META_SPEC)? else {
                continue;
            };
            let mut spec: FarmSpec = decode("a farm's spec", &b)?;
            for (_, b) in store.metas(key, META_GROWTH)? {
                let g: Growth = decode("a farm's growth", &b)?;
                // One written before the spec was written whole again
                // grows a generation the spec has passed.
                if let Some(next) = g.apply(&spec) {
                    spec = next;
                }
            }
            let spec = Arc::new(spec);
            if spec.open {
                state.written.insert(*fid, spec.clone());
            }
            let records = store.tasks(key)?;
            let mut entries = Vec::new();
            for (t, r) in &records {
                let Some(mut e) = record_entry(*t, r) else {
                    continue;
                };
                let has_outputs = spec
                    .def
                    .stages
                    .get(t.stage as usize)
                    .is_some_and(|s| !s.outputs.is_empty());
                if r.state == RecordState::Failed || has_outputs {
                    if let Some(b) = store.meta(key, &entry_meta(*t))? {
                        e = decode("a task's entry", &b)?;
                    }
                }
                entries.push(e);
            }
            let home: Option<(Home, Option<String>)> = match store.meta(key, META_HOME)? {
                Some(b) => Some(decode("a farm's home", &b)?),
                None => None,
            };
            let claim = home.as_ref().map_or(
                Home {
                    epoch: 0,
                    node: spec.origin,
                },
                |(h, _)| *h,
            );
            let collected = store
                .tasks(collected_key(*fid, claim))?
                .into_iter()
                .map(|(t, _)| t)
                .collect();
            let finished = match store.meta(key, META_FINISHED)? {
                Some(b) => Some(decode("a farm's final counts", &b)?),
                None => None,
            };
            farms.push((
                StoredFarm {
                    spec,
                    records,
                    entries,
                    collected,
                    home,
                },
                finished,
            ));
        }
        Ok((state, farms, held))
    }

    /// The allocation book kept here, if any.
    pub fn load_allocs<S: Store>(store: &S) -> Result<Option<AllocBook>> {
        match store.meta(NODE_KEY, META_ALLOCS)? {
            Some(b) => Ok(Some(decode("the allocation queues", &b)?)),
            None => Ok(None),
        }
    }

    /// The writes that make one of the peer's persists durable.
    pub fn writes(&mut self, p: Persist, out: &mut Vec<Write>) {
        match p {
            Persist::Farm(spec) => {
                let was = self.written.get(&spec.id);
                if was.is_some_and(|was| Arc::ptr_eq(was, &spec)) {
                    // Written already (as home, then as coordinator or holder).
                    return;
                }
                let growth = was.and_then(|was| growth_between(was, &spec));
                out.push(match growth {
                    Some(g) => Write::Meta {
                        farm: FarmKey(spec.id.0),
                        name: growth_meta(g.after.gen),
                        value: encode(&g),
                    },
                    None => Write::Meta {
                        farm: FarmKey(spec.id.0),
                        name: META_SPEC.into(),
                        value: encode(&*spec),
                    },
                });
                if spec.open {
                    self.written.insert(spec.id, spec.clone());
                } else {
                    self.written.remove(&spec.id);
                }
                if !self.farms.contains(&spec.id) {
                    self.farms.push(spec.id);
                    out.push(Write::Meta {
                        farm: NODE_KEY,
                        name: META_FARMS.into(),
                        value: encode(self),
                    });
                }
            }
            Persist::Task { farm, task, record } => out.push(Write::Task {
                farm: FarmKey(farm.0),
                task,
                record,
            }),
            Persist::Entries {
                farm,
                entries,
                records,
            } => {
                for e in entries {
                    let task = e.task();
                    let beside = match &e {
                        Entry::Done { outputs, .. } => !outputs.is_empty(),
                        Entry::Failed { .. } | Entry::Redo { .. } => true,
                    };
                    if records {
                        out.push(Write::Task {
                            farm: FarmKey(farm.0),
                            task,
                            record: entry_record(&e),
                        });
                    }
                    if beside {
                        out.push(Write::Meta {
                            farm: FarmKey(farm.0),
                            name: entry_meta(task),
                            value: encode(&e),
                        });
                    }
                }
            }
            Persist::Collected { farm, home, tasks } => {
                for task in tasks {
                    out.push(Write::Task {
                        farm: collected_key(farm, home),
                        task,
                        record: TaskRecord::known_done(1),
                    });
                }
            }
            Persist::Finished {
                farm,
                counts,
                stages,
            } => out.push(Write::Meta {
                farm: FarmKey(farm.0),
                name: META_FINISHED.into(),
                value: encode(&(counts, stages)),
            }),
            Persist::Home {
                farm,
                home,
                out: dir,
            } => out.push(Write::Meta {
                farm: FarmKey(farm.0),
                name: META_HOME.into(),
                value: encode(&(home, dir)),
            }),
            Persist::Allocs(book) => out.push(Write::Meta {
                farm: NODE_KEY,
                name: META_ALLOCS.into(),
                value: encode(&*book),
            }),
            Persist::Unacked { reports, gone } => {
                for r in reports {
                    out.push(Write::Meta {
                        farm: NODE_KEY,
                        name: held_meta(r.task.farm, r.task.task),
                        value: encode(&r),
                    });
                }
                for (farm, task) in gone {
                    out.push(Write::Meta {
                        farm: NODE_KEY,
                        name: held_meta(farm, task),
                        value: Vec::new(),
                    });
                }
            }
        }
    }
}
