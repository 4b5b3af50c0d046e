//! The ids every layer names things by: a node, a farm mesh-wide, a farm in one engine, a task in its farm.

use serde::{Deserialize, Serialize};

/// A node, by a number derived from its network identity. The lowest live id coordinates.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct NodeId(pub u64);

impl std::fmt::Display for NodeId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// A submitted farm, mesh-wide.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct FarmId(pub u64);

impl std::fmt::Display for FarmId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// A farm in one engine: farms are numbered by the engine in the order
/// they are added.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct FarmSlot(pub u32);

/// One task: a stage (by position in the farm) and its index in that stage.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct TaskRef {
    /// The stage, by its position in the farm (from 0).
    pub stage: u32,
    /// Its index in that stage (from 0).
    pub index: u32,
}

impl TaskRef {
    /// Task `index` of stage `stage`.
    pub fn new(stage: u32, index: u32) -> TaskRef {
        TaskRef { stage, index }
    }
}
