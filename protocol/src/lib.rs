//! Wire types and the sans-IO scheduling engine of mesh: no I/O, no clock, no global RNG.
//!
//! Everything here is driven from outside: `mesh-node` feeds the engine real
//! events and time, `mesh-sim` feeds it simulated ones. See ARCHITECTURE.md.

#![warn(missing_docs)]

pub mod alloc;
pub mod engine;
pub mod eta;
pub mod farm;
pub mod home;
pub mod ids;
pub mod mesh;
pub mod observe;
pub mod pieces;
pub mod pool;
pub mod resources;
mod tally;
pub mod wire;

pub use farm::{graph, FarmDef, TaskRef};
pub use resources::{Amount, Resources};
