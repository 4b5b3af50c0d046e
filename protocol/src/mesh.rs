//! The mesh peer: membership, coordinator election, placement and stealing as one sans-IO state machine.

mod msg;
mod pace;
mod peer;
mod replica;
mod stage_counts;

pub use crate::alloc::book::{
    AllocBook, AllocCmd, AllocEvent, AllocJob, AllocQueue, Allocs, BatchOp, Listed, POLL_MS,
    TICK_MS,
};
pub use msg::{
    files_to_bring, Address, Assigned, Beat, Entry, Failure, FarmId, FarmProgress, FarmSpec,
    Growth, Home, Ident, InputFile, MachineLoad, Measure, Msg, NodeId, OutputFile, Ran, Report,
    RosterEntry, RosterKind, SpecHeld, Started, SyncMsg, TaskRun, Victim, Who, Writer, STARTED_MAX,
};
pub use peer::{
    ballot, member_hash, term_round, Action, Config, Fetched, Member, Peer, PeerEvent, Persist,
    Quiet, QuietSwim, Stats, TimerKind, TimersDue,
};
pub use replica::{entry_record, record_entry, void_place, FarmLog, Replica, StoredFarm};
pub use stage_counts::StageCounts;
