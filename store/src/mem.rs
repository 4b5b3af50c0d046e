//! The in-memory store, for unit tests and the simulator: same contract, and a crash that loses the unflushed tail.

use std::collections::{BTreeMap, HashMap};

use rustc_hash::FxHashMap;

use mesh_protocol::engine::TaskRecord;
use mesh_protocol::farm::FarmDef;
use mesh_protocol::TaskRef;

use crate::{FarmKey, JournalEntry, Result, Store, Write};

#[derive(Default)]
struct State {
    defs: BTreeMap<FarmKey, FarmDef>,
    /// Hashed: the simulator writes and removes a few per task; only a
    /// restart lists them by prefix.
    meta: FxHashMap<(FarmKey, String), Vec<u8>>,
    tasks: HashMap<FarmKey, FarmTasks>,
    journal: Vec<JournalEntry>,
}

/// One farm's task records. Written at every task start and end, in about
/// index order, and read only to resume: a dense vector per stage keeps
/// those writes next to each other in memory. An index far beyond what the
/// stage has seen goes to a map, so a stray one costs no huge vector.
#[derive(Default)]
struct FarmTasks {
    dense: Vec<Vec<Option<TaskRecord>>>,
    sparse: BTreeMap<TaskRef, TaskRecord>,
}

/// How far past a stage's highest dense index a write may land and still grow the vector.
const DENSE_SLACK: usize = 1 << 16;
/// Stages numbered this high or higher keep their records in the map.
const DENSE_STAGES: usize = 1024;

impl FarmTasks {
    fn insert(&mut self, t: TaskRef, record: TaskRecord) {
        let (s, i) = (t.stage as usize, t.index as usize);
        if s < DENSE_STAGES && self.dense.len() <= s {
            self.dense.resize_with(s + 1, Vec::new);
        }
        match self.dense.get_mut(s) {
            Some(v) if i < v.len() => v[i] = Some(record),
            Some(v) if i < v.len() + DENSE_SLACK => {
                v.resize(i + 1, None);
                v[i] = Some(record);
            }
            _ => {
                self.sparse.insert(t, record);
            }
        }
    }

    fn get(&self, t: TaskRef) -> Option<&TaskRecord> {
        let dense = self
            .dense
            .get(t.stage as usize)
            .and_then(|v| v.get(t.index as usize));
        match dense {
            Some(Some(r)) => Some(r),
            _ => self.sparse.get(&t),
        }
    }

    /// Every record, in task order.
    fn all(&self) -> BTreeMap<TaskRef, TaskRecord> {
        let mut out = self.sparse.clone();
        for (s, v) in self.dense.iter().enumerate() {
            for (i, r) in v.iter().enumerate() {
                if let Some(r) = r {
                    out.insert(TaskRef::new(s as u32, i as u32), r.clone());
                }
            }
        }
        out
    }
}

impl State {
    fn apply(&mut self, w: Write) {
        match w {
            Write::Def { farm, def } => {
                self.defs.insert(farm, *def);
            }
            Write::Meta { farm, name, value } => {
                if value.is_empty() {
                    self.meta.remove(&(farm, name));
                } else {
                    self.meta.insert((farm, name), value);
                }
            }
            Write::Task { farm, task, record } => {
                self.tasks.entry(farm).or_default().insert(task, record);
            }
            Write::Journal(e) => self.journal.push(e),
        }
    }
}

/// Reads see every write; a crash keeps only what was flushed.
///
/// Flushed writes live in one state; unflushed ones wait in order and reads
/// look at them first, so a write is applied once (the simulator writes and
/// flushes on every step) and a crash only has to drop the tail.
#[derive(Default)]
pub struct MemStore {
    durable: State,
    unflushed: Vec<Write>,
}

impl MemStore {
    pub fn new() -> MemStore {
        MemStore::default()
    }

    /// Simulates the process dying: everything written since the last flush is gone.
    pub fn crash(&mut self) {
        self.unflushed.clear();
    }

    /// Unflushed writes, newest first.
    fn pending(&self) -> impl Iterator<Item = &Write> {
        self.unflushed.iter().rev()
    }
}

impl Store for MemStore {
    fn write(&mut self, batch: Vec<Write>) -> Result<()> {
        self.unflushed.extend(batch);
        Ok(())
    }

    fn flush(&mut self) -> Result<()> {
        for w in self.unflushed.drain(..) {
            self.durable.apply(w);
        }
        Ok(())
    }

    fn def(&self, farm: FarmKey) -> Result<Option<FarmDef>> {
        let newest = self.pending().find_map(|w| match w {
            Write::Def { farm: f, def } if *f == farm => Some((**def).clone()),
            _ => None,
        });
        Ok(newest.or_else(|| self.durable.defs.get(&farm).cloned()))
    }

    fn meta(&self, farm: FarmKey, name: &str) -> Result<Option<Vec<u8>>> {
        let newest = self.pending().find_map(|w| match w {
            Write::Meta {
                farm: f,
                name: n,
                value,
            } if *f == farm && n == name => Some(value.clone()),
            _ => None,
        });
        Ok(newest
            .or_else(|| self.durable.meta.get(&(farm, name.to_string())).cloned())
            .filter(|v| !v.is_empty()))
    }

    fn metas(&self, farm: FarmKey, prefix: &str) -> Result<Vec<(String, Vec<u8>)>> {
        let mut out: BTreeMap<String, Vec<u8>> = self
            .durable
            .meta
            .iter()
            .filter(|((f, n), _)| *f == farm && n.starts_with(prefix))
            .map(|((_, n), v)| (n.clone(), v.clone()))
            .collect();
        for w in &self.unflushed {
            if let Write::Meta {
                farm: f,
                name,
                value,
            } = w
            {
                if *f == farm && name.starts_with(prefix) {
                    out.insert(name.clone(), value.clone());
                }
            }
        }
        Ok(out.into_iter().filter(|(_, v)| !v.is_empty()).collect())
    }

    fn task(&self, farm: FarmKey, task: TaskRef) -> Result<Option<TaskRecord>> {
        let newest = self.pending().find_map(|w| match w {
            Write::Task {
                farm: f,
                task: t,
                record,
            } if *f == farm && *t == task => Some(record.clone()),
            _ => None,
        });
        Ok(newest.or_else(|| {
            let tasks = self.durable.tasks.get(&farm)?;
            tasks.get(task).cloned()
        }))
    }

    fn tasks(&self, farm: FarmKey) -> Result<Vec<(TaskRef, TaskRecord)>> {
        let mut out = self
            .durable
            .tasks
            .get(&farm)
            .map(FarmTasks::all)
            .unwrap_or_default();
        for w in &self.unflushed {
            if let Write::Task {
                farm: f,
                task,
                record,
            } = w
            {
                if *f == farm {
                    out.insert(*task, record.clone());
                }
            }
        }
        Ok(out.into_iter().collect())
    }

    fn journal(&self, farm: FarmKey, limit: usize) -> Result<Vec<JournalEntry>> {
        let pending = self.pending().filter_map(|w| match w {
            Write::Journal(e) => Some(e),
            _ => None,
        });
        let mut out: Vec<_> = pending
            .chain(self.durable.journal.iter().rev())
            .filter(|e| e.farm == farm)
            .take(limit)
            .cloned()
            .collect();
        out.reverse();
        Ok(out)
    }
}
