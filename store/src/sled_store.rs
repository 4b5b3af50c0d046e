//! The on-disk store: sled 0.34 trees, flushed explicitly by one thread.

use std::path::Path;

use mesh_protocol::engine::TaskRecord;
use mesh_protocol::farm::FarmDef;
use mesh_protocol::TaskRef;

use crate::{
    decode, encode, meta_key, task_from_key, task_key, FarmKey, JournalEntry, KeyRecord, Result,
    Store, StoreError, Write,
};

/// sled's page cache; the default (1 GiB) would dwarf a farm's own state.
const CACHE_BYTES: u64 = 32 << 20;

pub struct SledStore {
    db: sled::Db,
    defs: sled::Tree,
    meta: sled::Tree,
    tasks: sled::Tree,
    keys: sled::Tree,
    journal: sled::Tree,
}

impl SledStore {
    /// Opens (or creates) the database in `path`. Fails with
    /// [`StoreError::Locked`] while another process has it open.
    pub fn open(path: &Path) -> Result<SledStore> {
        let db = sled::Config::new()
            .path(path)
            .cache_capacity(CACHE_BYTES)
            // No background flusher: we flush in groups ourselves, and
            // concurrent flushes can deadlock in sled 0.34.
            .flush_every_ms(None)
            .mode(sled::Mode::HighThroughput)
            .open()
            .map_err(|e| match e {
                sled::Error::Io(ref io) if io.to_string().contains("could not acquire lock") => {
                    StoreError::Locked {
                        path: path.display().to_string(),
                    }
                }
                e => StoreError::Db(e),
            })?;
        Ok(SledStore {
            defs: db.open_tree("defs")?,
            meta: db.open_tree("meta")?,
            tasks: db.open_tree("tasks")?,
            keys: db.open_tree("keys")?,
            journal: db.open_tree("journal")?,
            db,
        })
    }
}

impl Store for SledStore {
    fn write(&mut self, batch: Vec<Write>) -> Result<()> {
        if batch.is_empty() {
            return Ok(());
        }
        let mut defs = sled::Batch::default();
        let mut meta = sled::Batch::default();
        let mut tasks = sled::Batch::default();
        let mut keys = sled::Batch::default();
        let mut journal = sled::Batch::default();
        for w in batch {
            match w {
                Write::Def { farm, def } => defs.insert(&farm.0.to_be_bytes(), encode(&*def)),
                Write::Meta { farm, name, value } => meta.insert(meta_key(farm, &name), value),
                Write::Task { farm, task, record } => {
                    tasks.insert(&task_key(farm, task), encode(&record))
                }
                Write::ClearTasks { farm } => {
                    // Apply what came before, then clear: order within the batch holds.
                    self.tasks.apply_batch(std::mem::take(&mut tasks))?;
                    for k in self.tasks.scan_prefix(farm.0.to_be_bytes()).keys() {
                        tasks.remove(k?);
                    }
                }
                Write::KeyDone { key, record } => keys.insert(&key, encode(&record)),
                Write::Journal(entry) => {
                    let seq = self.db.generate_id()?;
                    let mut k = entry.farm.0.to_be_bytes().to_vec();
                    k.extend_from_slice(&seq.to_be_bytes());
                    journal.insert(k, encode(&entry));
                }
            }
        }
        // Task records last: a reader that sees a task's end also sees its key and journal entry.
        self.defs.apply_batch(defs)?;
        self.meta.apply_batch(meta)?;
        self.keys.apply_batch(keys)?;
        self.journal.apply_batch(journal)?;
        self.tasks.apply_batch(tasks)?;
        Ok(())
    }

    fn flush(&mut self) -> Result<()> {
        self.db.flush()?;
        Ok(())
    }

    fn def(&self, farm: FarmKey) -> Result<Option<FarmDef>> {
        self.defs
            .get(farm.0.to_be_bytes())?
            .map(|v| decode("farm definition", &v))
            .transpose()
    }

    fn meta(&self, farm: FarmKey, name: &str) -> Result<Option<Vec<u8>>> {
        Ok(self.meta.get(meta_key(farm, name))?.map(|v| v.to_vec()))
    }

    fn task(&self, farm: FarmKey, task: TaskRef) -> Result<Option<TaskRecord>> {
        self.tasks
            .get(task_key(farm, task))?
            .map(|v| decode("task record", &v))
            .transpose()
    }

    fn tasks(&self, farm: FarmKey) -> Result<Vec<(TaskRef, TaskRecord)>> {
        self.tasks
            .scan_prefix(farm.0.to_be_bytes())
            .map(|kv| {
                let (k, v) = kv?;
                Ok((task_from_key(&k), decode("task record", &v)?))
            })
            .collect()
    }

    fn key_done(&self, key: &[u8; 32]) -> Result<Option<KeyRecord>> {
        self.keys
            .get(key)?
            .map(|v| decode("key record", &v))
            .transpose()
    }

    fn journal(&self, farm: FarmKey, limit: usize) -> Result<Vec<JournalEntry>> {
        let mut out: Vec<JournalEntry> = self
            .journal
            .scan_prefix(farm.0.to_be_bytes())
            .rev()
            .take(limit)
            .map(|kv| {
                let (_, v) = kv?;
                decode("journal entry", &v)
            })
            .collect::<Result<_>>()?;
        out.reverse();
        Ok(out)
    }
}
