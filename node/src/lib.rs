//! The real mesh node: farm loading, the process executor, durable state, and the loop that drives the engine.

pub mod control;
pub mod executor;
pub mod farmfile;
pub mod keys;
pub mod mesh_node;
pub mod net;
pub mod runner;
pub mod state;

use mesh_protocol::resources::{Amount, Resources, CPU, MEM};

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

/// MemTotal from /proc/meminfo (Linux); None elsewhere.
fn total_memory_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}
