//! The in-memory store, for unit tests and the simulator: same contract, and a crash that loses the unflushed tail.

use std::collections::BTreeMap;

use mesh_protocol::engine::TaskRecord;
use mesh_protocol::farm::FarmDef;
use mesh_protocol::TaskRef;

use crate::{FarmKey, JournalEntry, Result, Store, Write};

#[derive(Clone, Default)]
struct State {
    defs: BTreeMap<FarmKey, FarmDef>,
    meta: BTreeMap<(FarmKey, String), Vec<u8>>,
    tasks: BTreeMap<(FarmKey, TaskRef), TaskRecord>,
    journal: Vec<JournalEntry>,
}

impl State {
    fn apply(&mut self, w: Write) {
        match w {
            Write::Def { farm, def } => {
                self.defs.insert(farm, *def);
            }
            Write::Meta { farm, name, value } => {
                self.meta.insert((farm, name), value);
            }
            Write::Task { farm, task, record } => {
                self.tasks.insert((farm, task), record);
            }
            Write::Journal(e) => self.journal.push(e),
        }
    }
}

/// Reads see every write; a crash keeps only what was flushed.
#[derive(Default)]
pub struct MemStore {
    durable: State,
    live: State,
    unflushed: Vec<Write>,
}

impl MemStore {
    pub fn new() -> MemStore {
        MemStore::default()
    }

    /// Simulates the process dying: everything written since the last flush is gone.
    pub fn crash(&mut self) {
        self.unflushed.clear();
        self.live = self.durable.clone();
    }
}

impl Store for MemStore {
    fn write(&mut self, batch: Vec<Write>) -> Result<()> {
        for w in batch {
            self.live.apply(w.clone());
            self.unflushed.push(w);
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<()> {
        for w in self.unflushed.drain(..) {
            self.durable.apply(w);
        }
        Ok(())
    }

    fn def(&self, farm: FarmKey) -> Result<Option<FarmDef>> {
        Ok(self.live.defs.get(&farm).cloned())
    }

    fn meta(&self, farm: FarmKey, name: &str) -> Result<Option<Vec<u8>>> {
        Ok(self.live.meta.get(&(farm, name.to_string())).cloned())
    }

    fn task(&self, farm: FarmKey, task: TaskRef) -> Result<Option<TaskRecord>> {
        Ok(self.live.tasks.get(&(farm, task)).cloned())
    }

    fn tasks(&self, farm: FarmKey) -> Result<Vec<(TaskRef, TaskRecord)>> {
        Ok(self
            .live
            .tasks
            .range((farm, TaskRef::new(0, 0))..=(farm, TaskRef::new(u32::MAX, u32::MAX)))
            .map(|((_, t), r)| (*t, r.clone()))
            .collect())
    }

    fn journal(&self, farm: FarmKey, limit: usize) -> Result<Vec<JournalEntry>> {
        let mut out: Vec<_> = self
            .live
            .journal
            .iter()
            .rev()
            .filter(|e| e.farm == farm)
            .take(limit)
            .cloned()
            .collect();
        out.reverse();
        Ok(out)
    }
}
