//! A farm's home's policy, sans I/O: which earlier results a submission may reuse (every task's content key, the stages run again), which folders of `{out}` are set aside, and in what order a follower is told the farm's tasks, decided from what the home's I/O found.
//!
//! The node (and `mesh run`) read folders, hash files and rename; these
//! functions take what they found as plain data and say what to do, so
//! the simulator and property tests reach the same decisions.

mod feed;
mod keys;
mod reuse;
mod set_aside;

pub use feed::{Rest, Seen, Told};
pub use keys::{dependency_order, rerun_stages, task_keys, TaskKeys};
pub use reuse::{first_keeper, homes_to_ask, reuse, unkept, Answer, Reuse, HOMES_ASKED};
pub use set_aside::{is_index, looked_at, set_aside, Folder, Manifest, Stale};

#[cfg(test)]
mod tests;
