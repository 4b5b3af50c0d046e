//! The mesh peer: membership, coordinator election, placement and stealing as one sans-IO state machine.

mod allocs;
mod msg;
mod pace;
mod peer;
mod replica;

pub use allocs::*;
pub use msg::*;
pub use peer::*;
pub use replica::*;
