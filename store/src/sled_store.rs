//! The on-disk store: an append-only log file in front of sled 0.34 trees.
//!
//! Task records and journal entries are the hot path (up to two task
//! records per task). Written straight into sled they cost ~0.3 ms of CPU
//! per task in sled's IO threads, more than spawning the task. So they go to
//! `wal` instead: each [`Store::flush`] appends the batch's records with one
//! `write()`, and sled receives them at checkpoints, folded to the last
//! record per task. Opening the store replays whatever the log holds.
//!
//! Durability: after `flush` the records are in the kernel, so they survive
//! the process being killed (kill -9, OOM). [`Store::sync`] makes them
//! survive a machine crash as well; the runner calls it before every
//! progress refresh and at the end of a run. Metadata goes through the log
//! too (a mesh node rewrites small values, such as the results it holds,
//! every step, and sled's flush is an fsync); definitions, which are rare,
//! go to sled directly and are flushed by sled itself.

use std::cell::RefCell;
use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write as _};
use std::path::{Path, PathBuf};

use mesh_protocol::engine::TaskRecord;
use mesh_protocol::farm::FarmDef;
use mesh_protocol::TaskRef;
use serde::{Deserialize, Serialize};

use crate::{decode, encode, meta_key, FarmKey, JournalEntry, Result, Store, StoreError, Write};

/// sled's page cache; the default (1 GiB) would dwarf a farm's own state.
const CACHE_BYTES: u64 = 32 << 20;
/// Records held in the log before they are folded into sled.
const CHECKPOINT_RECORDS: usize = 8 * 1024;
/// Room kept for the log's next records once written: more is given back.
const PENDING_KEPT_BYTES: usize = 1 << 20;
/// A log record larger than this is corruption, not data.
const WAL_RECORD_BYTES_MAX: usize = 16 << 20;
/// Task records per sled key. Task ids are dense, so records are kept in
/// chunks: a million tasks are 4k sled keys, not a million. sled's memory
/// grows with its number of keys (about 300 bytes each), chunks keep it flat.
const CHUNK_TASKS: u32 = 256;
/// Where the next journal sequence number is kept in the meta tree.
const SEQ_KEY: &[u8] = b"\0journal-seq";

#[derive(Serialize, Deserialize)]
enum WalRecord {
    Task {
        farm: FarmKey,
        task: TaskRef,
        record: TaskRecord,
    },
    Journal {
        seq: u64,
        entry: JournalEntry,
    },
    Meta {
        key: Vec<u8>,
        value: Vec<u8>,
    },
    /// A farm's definition, encoded: in the log with the run it starts, so
    /// a process killed as it starts a run leaves both or neither (with the
    /// definition in sled alone, a kill between the log's write and
    /// sled's flush left the new run's number over the old definition, and
    /// `mesh resume` ran the old farm as the new run; found by the oracle).
    Def {
        farm: FarmKey,
        def: Vec<u8>,
    },
}

pub struct SledStore {
    db: sled::Db,
    defs: sled::Tree,
    meta: sled::Tree,
    tasks: sled::Tree,
    journal: sled::Tree,
    wal: File,
    wal_path: PathBuf,
    /// Encoded records not yet handed to the kernel.
    pending: Vec<u8>,
    /// Records in the log and not yet in sled; reads look here first.
    over_tasks: HashMap<(FarmKey, TaskRef), TaskRecord>,
    over_journal: Vec<(u64, JournalEntry)>,
    over_meta: HashMap<Vec<u8>, Vec<u8>>,
    over_defs: HashMap<FarmKey, Vec<u8>>,
    /// The chunk read last: a re-run looks tasks up in order, chunk by chunk.
    last_chunk: RefCell<Option<([u8; 16], Chunk)>>,
    next_seq: u64,
    sled_dirty: bool,
}

impl SledStore {
    /// Opens (or creates) the store in folder `path`, replaying its log.
    /// Fails with [`StoreError::Locked`] while another process has it open.
    pub fn open(path: &Path) -> Result<SledStore> {
        let db = match open_db(path) {
            // sled 0.34 counts a half-written `snap.*.generating` among its
            // snapshots and, when it sorts last, refuses the whole database
            // as corrupt (spacejam/sled#1527). A node killed while sled
            // wrote one is that case. Such a file is unfinished by
            // construction (it is renamed only once synced), so dropping it
            // leaves the last whole snapshot and the log, as before the kill.
            Err(StoreError::Db(sled::Error::Corruption { .. }))
                if drop_unfinished_snapshots(path) > 0 =>
            {
                open_db(path)?
            }
            r => r?,
        };
        // sled's lock (held above) also guards the log: no one else writes it.
        let wal_path = path.join("mesh.wal");
        let meta = db.open_tree("meta")?;
        let next_seq = match meta.get(SEQ_KEY)? {
            Some(v) => u64::from_be_bytes(v.as_ref().try_into().unwrap_or([0; 8])),
            None => 0,
        };
        let wal = OpenOptions::new()
            .create(true)
            .read(true)
            .append(true)
            .open(&wal_path)
            .map_err(|e| wal_err(&wal_path, e))?;
        let mut s = SledStore {
            defs: db.open_tree("defs")?,
            meta,
            tasks: db.open_tree("tasks")?,
            journal: db.open_tree("journal")?,
            db,
            wal,
            wal_path,
            pending: Vec::new(),
            over_tasks: HashMap::new(),
            over_journal: Vec::new(),
            over_meta: HashMap::new(),
            over_defs: HashMap::new(),
            last_chunk: RefCell::new(None),
            next_seq,
            sled_dirty: false,
        };
        s.replay()?;
        Ok(s)
    }

    /// Reads the log left by an earlier process into the overlay, then
    /// checkpoints it. A torn tail (the process died mid-write) ends the replay.
    fn replay(&mut self) -> Result<()> {
        let mut bytes = Vec::new();
        File::open(&self.wal_path)
            .and_then(|mut f| f.read_to_end(&mut bytes))
            .map_err(|e| wal_err(&self.wal_path, e))?;
        let mut at = 0;
        while at + 8 <= bytes.len() {
            let len = u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes")) as usize;
            let sum = &bytes[at + 4..at + 8];
            let Some(body) = bytes.get(at + 8..at + 8 + len) else {
                break;
            };
            if len > WAL_RECORD_BYTES_MAX || &blake3::hash(body).as_bytes()[..4] != sum {
                break;
            }
            let Ok(rec) = postcard::from_bytes::<WalRecord>(body) else {
                break;
            };
            self.apply_overlay(rec);
            at += 8 + len;
        }
        if !bytes.is_empty() {
            self.checkpoint()?;
        }
        Ok(())
    }

    fn apply_overlay(&mut self, rec: WalRecord) {
        match rec {
            WalRecord::Task { farm, task, record } => {
                self.over_tasks.insert((farm, task), record);
            }
            WalRecord::Journal { seq, entry } => {
                self.next_seq = self.next_seq.max(seq + 1);
                self.over_journal.push((seq, entry));
            }
            WalRecord::Meta { key, value } => {
                self.over_meta.insert(key, value);
            }
            WalRecord::Def { farm, def } => {
                self.over_defs.insert(farm, def);
            }
        }
    }

    fn append(&mut self, rec: WalRecord) {
        // Encoded in place behind room for its length and sum: a record
        // of a growth of 100,000 calls is megabytes, not copied again.
        let at = self.pending.len();
        let mut buf = std::mem::take(&mut self.pending);
        buf.extend_from_slice(&[0; 8]);
        let mut buf =
            postcard::to_extend(&rec, buf).expect("postcard encodes plain data into a Vec");
        let body = at + 8;
        let len = (buf.len() - body) as u32;
        let sum = *blake3::hash(&buf[body..]).as_bytes();
        buf[at..at + 4].copy_from_slice(&len.to_le_bytes());
        buf[at + 4..body].copy_from_slice(&sum[..4]);
        self.pending = buf;
        self.apply_overlay(rec);
    }

    /// Folds the log into sled, makes sled durable, and empties the log.
    pub fn checkpoint(&mut self) -> Result<()> {
        self.flush_pending()?;
        if self.overlay_len() == 0 {
            return Ok(());
        }
        for (farm, def) in self.over_defs.drain() {
            self.defs.insert(farm.0.to_be_bytes(), def)?;
        }
        let mut meta = sled::Batch::default();
        for (key, value) in self.over_meta.drain() {
            if value.is_empty() {
                meta.remove(key);
            } else {
                meta.insert(key, value);
            }
        }
        self.meta.apply_batch(meta)?;
        let mut chunks: HashMap<[u8; 16], Chunk> = HashMap::new();
        for ((farm, task), record) in self.over_tasks.drain() {
            let (c, slot) = chunk_of(task);
            let key = chunk_key(farm, task.stage, c);
            let chunk = match chunks.entry(key) {
                std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::hash_map::Entry::Vacant(e) => {
                    e.insert(load_chunk(&self.tasks, key)?)
                }
            };
            if chunk.len() <= slot {
                chunk.resize(slot + 1, None);
            }
            chunk[slot] = Some(record);
        }
        let mut tasks = sled::Batch::default();
        for (key, chunk) in &chunks {
            tasks.insert(key, encode(chunk));
        }
        *self.last_chunk.borrow_mut() = None;
        let mut journal = sled::Batch::default();
        for (seq, entry) in self.over_journal.drain(..) {
            journal.insert(journal_key(entry.farm, seq), encode(&entry));
        }
        self.journal.apply_batch(journal)?;
        self.tasks.apply_batch(tasks)?;
        self.meta.insert(SEQ_KEY, &self.next_seq.to_be_bytes())?;
        self.db.flush()?;
        self.sled_dirty = false;
        // Only now may the log go: everything in it is in sled (replaying it again would be harmless).
        self.wal
            .set_len(0)
            .map_err(|e| wal_err(&self.wal_path, e))?;
        Ok(())
    }

    fn flush_pending(&mut self) -> Result<()> {
        if !self.pending.is_empty() {
            self.wal
                .write_all(&self.pending)
                .map_err(|e| wal_err(&self.wal_path, e))?;
            self.pending.clear();
            if self.pending.capacity() > PENDING_KEPT_BYTES {
                // A big record's room is not kept for the small ones after.
                self.pending = Vec::new();
            }
        }
        Ok(())
    }

    fn overlay_len(&self) -> usize {
        self.over_tasks.len()
            + self.over_journal.len()
            + self.over_meta.len()
            + self.over_defs.len()
    }
}

/// A chunk of task records: slot `index % CHUNK_TASKS` of the chunk holding `index`.
type Chunk = Vec<Option<TaskRecord>>;

fn chunk_key(farm: FarmKey, stage: u32, chunk: u32) -> [u8; 16] {
    let mut k = [0u8; 16];
    k[..8].copy_from_slice(&farm.0.to_be_bytes());
    k[8..12].copy_from_slice(&stage.to_be_bytes());
    k[12..].copy_from_slice(&chunk.to_be_bytes());
    k
}

/// The chunk stored under `key` in `tasks`, or an empty one.
fn open_db(path: &Path) -> Result<sled::Db> {
    sled::Config::new()
        .path(path)
        .cache_capacity(CACHE_BYTES)
        // No background flusher: we flush when we choose, and
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
        })
}

/// Removes sled's unfinished snapshot files in `path`; how many went.
fn drop_unfinished_snapshots(path: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(path) else {
        return 0;
    };
    let mut dropped = 0;
    for e in entries.flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        if name.starts_with("snap.")
            && name.ends_with(".generating")
            && std::fs::remove_file(e.path()).is_ok()
        {
            dropped += 1;
        }
    }
    dropped
}

fn load_chunk(tasks: &sled::Tree, key: [u8; 16]) -> Result<Chunk> {
    match tasks.get(key)? {
        Some(v) => decode("task records", &v),
        None => Ok(Vec::new()),
    }
}

fn chunk_of(t: TaskRef) -> (u32, usize) {
    (t.index / CHUNK_TASKS, (t.index % CHUNK_TASKS) as usize)
}

fn journal_key(farm: FarmKey, seq: u64) -> Vec<u8> {
    let mut k = farm.0.to_be_bytes().to_vec();
    k.extend_from_slice(&seq.to_be_bytes());
    k
}

fn wal_err(path: &Path, source: io::Error) -> StoreError {
    StoreError::Log {
        path: path.display().to_string(),
        source,
    }
}

impl Store for SledStore {
    fn write(&mut self, batch: Vec<Write>) -> Result<()> {
        for w in batch {
            match w {
                Write::Task { farm, task, record } => {
                    self.append(WalRecord::Task { farm, task, record })
                }
                Write::Journal(entry) => {
                    let seq = self.next_seq;
                    self.next_seq += 1;
                    self.append(WalRecord::Journal { seq, entry });
                }
                Write::Def { farm, def } => {
                    let def = encode(&*def);
                    if def.len() <= WAL_RECORD_BYTES_MAX / 2 {
                        self.append(WalRecord::Def { farm, def });
                    } else {
                        // Too large for a log record: into sled, made
                        // durable before the log's records of this batch
                        // (see `flush`).
                        self.defs.insert(farm.0.to_be_bytes(), def)?;
                        self.sled_dirty = true;
                    }
                }
                Write::Meta { farm, name, value } => self.append(WalRecord::Meta {
                    key: meta_key(farm, &name),
                    value,
                }),
            }
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<()> {
        if self.sled_dirty {
            self.db.flush()?;
            self.sled_dirty = false;
        }
        self.flush_pending()?;
        if self.overlay_len() >= CHECKPOINT_RECORDS {
            self.checkpoint()?;
        }
        Ok(())
    }

    fn sync(&mut self) -> Result<()> {
        self.flush()?;
        self.wal
            .sync_data()
            .map_err(|e| wal_err(&self.wal_path, e))?;
        Ok(())
    }

    fn def(&self, farm: FarmKey) -> Result<Option<FarmDef>> {
        if let Some(v) = self.over_defs.get(&farm) {
            return decode("farm definition", v).map(Some);
        }
        self.defs
            .get(farm.0.to_be_bytes())?
            .map(|v| decode("farm definition", &v))
            .transpose()
    }

    fn meta(&self, farm: FarmKey, name: &str) -> Result<Option<Vec<u8>>> {
        let key = meta_key(farm, name);
        if let Some(v) = self.over_meta.get(&key) {
            return Ok(Some(v.clone()).filter(|v| !v.is_empty()));
        }
        Ok(self.meta.get(key)?.map(|v| v.to_vec()))
    }

    fn metas(&self, farm: FarmKey, prefix: &str) -> Result<Vec<(String, Vec<u8>)>> {
        let start = meta_key(farm, prefix);
        let name = |k: &[u8]| String::from_utf8_lossy(&k[8..]).into_owned();
        let mut out = std::collections::BTreeMap::new();
        for kv in self.meta.scan_prefix(&start) {
            let (k, v) = kv?;
            out.insert(name(&k), v.to_vec());
        }
        for (k, v) in &self.over_meta {
            if k.starts_with(&start) {
                out.insert(name(k), v.clone());
            }
        }
        Ok(out.into_iter().filter(|(_, v)| !v.is_empty()).collect())
    }

    fn task(&self, farm: FarmKey, task: TaskRef) -> Result<Option<TaskRecord>> {
        if let Some(r) = self.over_tasks.get(&(farm, task)) {
            return Ok(Some(r.clone()));
        }
        let (c, slot) = chunk_of(task);
        let key = chunk_key(farm, task.stage, c);
        let mut last = self.last_chunk.borrow_mut();
        if last.as_ref().is_none_or(|(k, _)| *k != key) {
            *last = Some((key, load_chunk(&self.tasks, key)?));
        }
        let (_, chunk) = last.as_ref().expect("just filled");
        Ok(chunk.get(slot).cloned().flatten())
    }

    fn tasks(&self, farm: FarmKey) -> Result<Vec<(TaskRef, TaskRecord)>> {
        let mut out = Vec::new();
        for kv in self.tasks.scan_prefix(farm.0.to_be_bytes()) {
            let (k, v) = kv?;
            let stage = u32::from_be_bytes(k[8..12].try_into().expect("16-byte chunk key"));
            let c = u32::from_be_bytes(k[12..16].try_into().expect("16-byte chunk key"));
            let chunk: Chunk = decode("task records", &v)?;
            for (slot, rec) in chunk.into_iter().enumerate() {
                let t = TaskRef::new(stage, c * CHUNK_TASKS + slot as u32);
                if let Some(rec) = rec {
                    if !self.over_tasks.contains_key(&(farm, t)) {
                        out.push((t, rec));
                    }
                }
            }
        }
        out.extend(
            self.over_tasks
                .iter()
                .filter(|((f, _), _)| *f == farm)
                .map(|((_, t), r)| (*t, r.clone())),
        );
        out.sort_by_key(|(t, _)| *t);
        Ok(out)
    }

    fn journal(&self, farm: FarmKey, limit: usize) -> Result<Vec<JournalEntry>> {
        let mut out: Vec<JournalEntry> = self
            .over_journal
            .iter()
            .rev()
            .filter(|(_, e)| e.farm == farm)
            .take(limit)
            .map(|(_, e)| e.clone())
            .collect();
        let rest = limit - out.len();
        for kv in self
            .journal
            .scan_prefix(farm.0.to_be_bytes())
            .rev()
            .take(rest)
        {
            let (_, v) = kv?;
            out.push(decode("journal entry", &v)?);
        }
        out.reverse();
        Ok(out)
    }
}

impl Drop for SledStore {
    fn drop(&mut self) {
        // Best effort: a clean close leaves an empty log. Errors leave the
        // log in place, and the next open replays it.
        let _ = self.checkpoint();
    }
}
