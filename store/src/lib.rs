//! Durable farm state: farm definitions, task records (which also serve as the content-key cache) and an event journal.
//!
//! # Contract
//!
//! [`Store::write`] applies a batch so later reads see it, but nothing is
//! durable until [`Store::flush`] returns: from then on it survives the
//! process dying (kill -9). [`Store::sync`] also makes it survive the
//! machine crashing. After a crash the store holds every record flushed
//! (or synced) before it, and possibly some later ones, in order, with no
//! torn record. Drivers write the engine's `Persist` actions as one batch
//! per step and flush once before acting on them (the project's group
//! commit), and sync on a timer and at the end of a run.
//!
//! Two implementations: [`SledStore`] on disk (sled 0.34) and [`MemStore`]
//! for tests and the simulator, which can [`MemStore::crash`] to lose its
//! unflushed tail.

mod mem;
pub mod mesh;
mod sled_store;

use mesh_protocol::engine::TaskRecord;
use mesh_protocol::farm::FarmDef;
use mesh_protocol::TaskRef;
use serde::{Deserialize, Serialize};

pub use mem::MemStore;
pub use mesh::MeshState;
pub use sled_store::SledStore;

/// A farm's key in the store (a node may hold many farms).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct FarmKey(pub u64);

/// One entry of the event journal.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JournalEntry {
    /// Wall-clock milliseconds since the Unix epoch, set by the driver.
    pub at_ms: u64,
    pub farm: FarmKey,
    pub event: JournalEvent,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum JournalEvent {
    RunStarted { run: u32, resumed: bool },
    TaskEnded { task: TaskRef, record: TaskRecord },
    RunStopped { run: u32, reason: String },
}

/// One change, as part of a batch.
#[derive(Clone, Debug, PartialEq)]
pub enum Write {
    Def {
        farm: FarmKey,
        def: Box<FarmDef>,
    },
    /// A named small value of a farm (run counters, summaries), opaque
    /// here. An empty value removes the name.
    Meta {
        farm: FarmKey,
        name: String,
        value: Vec<u8>,
    },
    /// A task's latest record; it replaces the one before, whatever run wrote it.
    Task {
        farm: FarmKey,
        task: TaskRef,
        record: TaskRecord,
    },
    Journal(JournalEntry),
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("the state at {path} is in use by another mesh process")]
    Locked { path: String },
    #[error("cannot write the store's log {path}: {source}")]
    Log {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("database error: {0}")]
    Db(#[from] sled::Error),
    #[error("corrupt record in {what}: {source}")]
    Decode {
        what: &'static str,
        #[source]
        source: postcard::Error,
    },
}

pub type Result<T> = std::result::Result<T, StoreError>;

/// The durable state of one node.
pub trait Store {
    /// Applies a batch atomically; durable only after [`Store::flush`].
    fn write(&mut self, batch: Vec<Write>) -> Result<()>;
    /// Makes everything written so far survive the process dying.
    fn flush(&mut self) -> Result<()>;
    /// Makes everything written so far survive the machine crashing.
    fn sync(&mut self) -> Result<()> {
        self.flush()
    }

    fn def(&self, farm: FarmKey) -> Result<Option<FarmDef>>;
    fn meta(&self, farm: FarmKey, name: &str) -> Result<Option<Vec<u8>>>;
    /// Every named value of a farm whose name starts with `prefix`, by name.
    fn metas(&self, farm: FarmKey, prefix: &str) -> Result<Vec<(String, Vec<u8>)>>;
    fn task(&self, farm: FarmKey, task: TaskRef) -> Result<Option<TaskRecord>>;
    /// Every task record of a farm (of every run), in task order.
    fn tasks(&self, farm: FarmKey) -> Result<Vec<(TaskRef, TaskRecord)>>;
    /// The last `limit` journal entries of a farm, oldest first.
    fn journal(&self, farm: FarmKey, limit: usize) -> Result<Vec<JournalEntry>>;
}

fn meta_key(farm: FarmKey, name: &str) -> Vec<u8> {
    let mut k = farm.0.to_be_bytes().to_vec();
    k.extend_from_slice(name.as_bytes());
    k
}

fn encode<T: Serialize>(v: &T) -> Vec<u8> {
    postcard::to_stdvec(v).expect("postcard encodes plain data into a Vec")
}

fn decode<'a, T: Deserialize<'a>>(what: &'static str, bytes: &'a [u8]) -> Result<T> {
    postcard::from_bytes(bytes).map_err(|source| StoreError::Decode { what, source })
}

#[cfg(test)]
mod tests;
