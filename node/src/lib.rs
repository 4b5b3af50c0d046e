//! The real mesh node: farm loading, the process executor, durable state, and the loop that drives the engine.

pub mod alloc;
pub mod calls;
pub mod cgroup;
pub mod control;
pub mod dash;
pub mod eta;
pub mod executor;
pub mod export;
pub mod farmfile;
pub mod gpus;
pub mod grown;
pub mod keys;
mod launched;
pub mod limits;
pub mod mesh_node;
pub mod net;
pub mod observe;
mod reaper;
pub mod results;
pub mod runner;
pub mod state;
pub mod state_folder;
pub mod task_view;
pub mod task_words;
pub mod usage;
pub mod used;
pub mod view;
pub mod warm;

use std::io;

use mesh_protocol::resources::{Amount, Resources, CPU, GPU, MEM};
use tokio::signal::unix::{signal, Signal, SignalKind};

/// An I/O failure and what mesh was doing when it happened.
#[derive(Debug, thiserror::Error)]
#[error("{what}: {source}")]
pub struct IoError {
    pub what: String,
    #[source]
    pub source: io::Error,
}

/// For `map_err`: wraps an io::Error with what was being done.
pub(crate) fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> IoError {
    let what = what.into();
    move |source| IoError { what, source }
}

/// The single-threaded runtime a farm run or a node drives its loop on.
///
/// A node is one thread, as HyperQueue's workers and Dask's event loop
/// are: a task's pipes, its end, the loop's timers and the messages of its
/// connections all wake that thread, and nothing crosses threads between
/// one thin task's end and the next one's start. With the connections on
/// worker threads beside the loop (one core left to it), 4,000 `true` on
/// 2 nodes of one slot took 1.12-1.43 of `mesh run`'s time, 1.00-1.05 on
/// one thread; and files moved no faster (1 GiB node to node 307-431 MB/s,
/// 495-542 on one thread, round trips during it p50 0.5-6.3 ms against
/// 1.6-1.8 ms). Hashing and disk writes of transfers still go to blocking
/// threads. See docs/design/data.md.
pub(crate) fn runtime() -> Result<tokio::runtime::Runtime, IoError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(io_err("cannot start the runtime"))
}

/// After Ctrl-C, tasks get this long to exit on SIGTERM before SIGKILL.
const INTERRUPT_GRACE_MS: u64 = 3000;

/// The wall-clock instant `ms` virtual milliseconds after `clock` (the
/// engine's and the peer's time zero).
pub(crate) fn at_ms(clock: std::time::Instant, ms: u64) -> tokio::time::Instant {
    tokio::time::Instant::from_std(clock + std::time::Duration::from_millis(ms))
}

/// When running tasks are killed outright after a Ctrl-C at `interrupted_at`;
/// none before one, or once they have been.
pub(crate) fn grace_end(
    interrupted_at: Option<std::time::Instant>,
    hard_killed: bool,
) -> Option<tokio::time::Instant> {
    interrupted_at
        .filter(|_| !hard_killed)
        .map(|t| at_ms(t, INTERRUPT_GRACE_MS))
}

/// Sleeps until `at`, or forever when there is no deadline (a `select!` arm that never fires).
pub(crate) async fn sleep_until_opt(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// SIGINT and SIGTERM, watched from now on: registered before anything slow,
/// so a Ctrl-C that comes early is caught, not lost or fatal.
pub(crate) fn stop_signals() -> Result<(Signal, Signal), IoError> {
    let int = signal(SignalKind::interrupt()).map_err(io_err("cannot watch SIGINT"))?;
    let term = signal(SignalKind::terminate()).map_err(io_err("cannot watch SIGTERM"))?;
    Ok((int, term))
}

/// What this machine offers: its usable cores and its memory.
pub fn detect_resources() -> Resources {
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get() as u64)
        .unwrap_or(1);
    let mut r = Resources::new();
    r.set(CPU, Amount::units(cpus));
    if let Some(bytes) = total_memory_bytes() {
        r.set(MEM, Amount::units(bytes));
    }
    r
}

/// What this machine offers and its GPUs: cores, memory and GPUs found
/// here (see `gpus.rs`), each overridden by what the user declared
/// (`--resources`); a declared `gpu = N` takes the first N devices found.
pub fn machine(declared: &Resources) -> (Resources, Vec<gpus::Gpu>) {
    let mut r = detect_resources();
    let found = gpus::detect();
    if !found.is_empty() {
        r.set(GPU, Amount::units(found.len() as u64));
    }
    for (k, v) in declared.iter() {
        r.set(k, v);
    }
    let devices = gpus::take(&found, r.get(GPU).whole() as usize);
    (r, devices)
}

/// MemTotal from /proc/meminfo (Linux); None elsewhere.
fn total_memory_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}
