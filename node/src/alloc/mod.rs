//! A node's side of allocation queues: the job scripts that start mesh nodes (`script.rs`) and the batch systems' commands (`batch.rs`); the node's loop runs them from `mesh_node/home/alloc.rs`.
//!
//! The decisions (when to submit, cancel or drain) are `mesh_protocol::alloc`;
//! this folder only speaks the batch systems' languages.

pub mod batch;
pub mod script;
