//! A node's record of itself for observers: recent task runs by slot, counters, and the machine's load and memory.
//!
//! Kept by the mesh node and by `mesh run` alike; what it yields is an
//! `Observation`, the same whichever of them answers.

use std::collections::VecDeque;

use mesh_protocol::mesh::FarmId;
use mesh_protocol::observe::{Counters, LatencyData, Observation, RunRecord};
use mesh_protocol::TaskRef;

/// Runs kept for the task stream: the dashboard shows about a minute, and
/// a thin-task node runs thousands in that.
const RUNS_KEPT: usize = 4096;

/// Most runs one observation carries (the newest).
pub const RUNS_SENT: usize = 2048;

#[derive(Default)]
pub struct Recorder {
    runs: VecDeque<RunRecord>,
    next_seq: u64,
    /// Counts changes (starts and ends), for `RunRecord::changed`.
    changes: u64,
    /// Which slots are taken, by the runs in them.
    slots: Vec<bool>,
    pub counters: Counters,
}

impl Recorder {
    /// A run started now; returns its number for [`Recorder::ended`].
    pub fn started(&mut self, farm: FarmId, task: TaskRef, attempt: u32, unix_ms: u64) -> u64 {
        let slot = match self.slots.iter().position(|taken| !taken) {
            Some(i) => i,
            None => {
                self.slots.push(false);
                self.slots.len() - 1
            }
        };
        self.slots[slot] = true;
        let seq = self.next_seq;
        self.next_seq += 1;
        if self.runs.len() == RUNS_KEPT {
            // A run still going when it leaves the record keeps its slot
            // until it ends.
            self.runs.pop_front();
        }
        self.changes += 1;
        self.runs.push_back(RunRecord {
            seq,
            changed: self.changes,
            farm,
            task,
            attempt,
            slot: slot as u32,
            start: unix_ms,
            end: None,
            failed: false,
        });
        self.counters.tasks_run += 1;
        seq
    }

    pub fn ended(&mut self, seq: u64, slot_hint: Option<u32>, failed: bool, unix_ms: u64) {
        let first = self.runs.front().map_or(0, |r| r.seq);
        let slot = match seq
            .checked_sub(first)
            .and_then(|i| self.runs.get_mut(i as usize))
        {
            Some(r) if r.seq == seq => {
                self.changes += 1;
                r.changed = self.changes;
                r.end = Some(unix_ms);
                r.failed = failed;
                Some(r.slot)
            }
            _ => slot_hint,
        };
        if let Some(s) = slot.and_then(|s| self.slots.get_mut(s as usize)) {
            *s = false;
        }
        if failed {
            self.counters.tasks_failed += 1;
        }
    }

    /// When the run of `task`'s `attempt` started and ended (Unix ms),
    /// while it is in the record. Looked for from the newest: asked just
    /// after a run ends, it is among the last few.
    pub fn run_times(
        &self,
        farm: FarmId,
        task: TaskRef,
        attempt: u32,
    ) -> (Option<u64>, Option<u64>) {
        self.runs
            .iter()
            .rev()
            .find(|r| r.farm == farm && r.task == task && r.attempt == attempt)
            .map_or((None, None), |r| (Some(r.start), r.end))
    }

    /// The slot a run is in, while it is in the record.
    pub fn slot(&self, seq: u64) -> Option<u32> {
        let first = self.runs.front().map_or(0, |r| r.seq);
        let i = seq.checked_sub(first)?;
        self.runs
            .get(i as usize)
            .filter(|r| r.seq == seq)
            .map(|r| r.slot)
    }

    /// What this node says of itself: the runs that changed after `since`
    /// (started or ended), the newest [`RUNS_SENT`] of them.
    pub fn observation(&self, since: u64, latency: LatencyData, unix_ms: u64) -> Observation {
        let machine = machine();
        let mut runs: Vec<RunRecord> = self
            .runs
            .iter()
            .rev()
            .filter(|r| r.changed > since)
            .take(RUNS_SENT)
            .copied()
            .collect();
        runs.reverse();
        Observation {
            unix_ms,
            load: machine.load,
            cpus: machine.cpus,
            mem_used: machine.mem_used,
            mem_total: machine.mem_total,
            held_bytes: 0,
            counters: self.counters,
            latency,
            runs,
            running: Vec::new(),
            beat: None,
        }
    }
}

/// The machine's load and memory, where the system tells them.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Machine {
    pub load: Option<f64>,
    pub cpus: u32,
    pub mem_used: Option<u64>,
    pub mem_total: Option<u64>,
}

pub fn machine() -> Machine {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
    let load = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok());
    let (mem_total, mem_avail) = std::fs::read_to_string("/proc/meminfo")
        .map(|s| meminfo(&s))
        .unwrap_or((None, None));
    Machine {
        load,
        cpus,
        mem_used: mem_total.zip(mem_avail).map(|(t, a)| t.saturating_sub(a)),
        mem_total,
    }
}

impl Machine {
    /// As a beat carries it; none where the system does not say.
    pub fn as_load(&self) -> Option<mesh_protocol::mesh::MachineLoad> {
        Some(mesh_protocol::mesh::MachineLoad {
            load_centi: (self.load? * 100.0).round() as u32,
            cpus: self.cpus,
            mem_used: self.mem_used?,
            mem_total: self.mem_total?,
            measure: crate::cgroup::method(),
        })
    }
}

/// `MemTotal` and `MemAvailable` of /proc/meminfo, in bytes.
fn meminfo(s: &str) -> (Option<u64>, Option<u64>) {
    let field = |name: &str| {
        s.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| {
                rest.trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<u64>()
                    .ok()
            })
            .map(|kb| kb * 1024)
    };
    (field("MemTotal:"), field("MemAvailable:"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(i: u32) -> TaskRef {
        TaskRef::new(0, i)
    }

    #[test]
    fn runs_take_the_lowest_free_slot_and_give_it_back() {
        let mut r = Recorder::default();
        let a = r.started(FarmId(1), task(0), 1, 100);
        let b = r.started(FarmId(1), task(1), 1, 101);
        assert_eq!((r.slot(a), r.slot(b)), (Some(0), Some(1)));
        r.ended(a, None, false, 150);
        let c = r.started(FarmId(1), task(2), 1, 151);
        assert_eq!(r.slot(c), Some(0), "the freed slot is reused");
        r.ended(b, None, true, 160);
        let o = r.observation(0, LatencyData::default(), 170);
        assert_eq!(o.runs.len(), 3);
        assert_eq!(o.runs[1].end, Some(160));
        assert!(o.runs[1].failed);
        assert_eq!(o.counters.tasks_run, 3);
        assert_eq!(o.counters.tasks_failed, 1);
        // Only what changed since is sent again: c started, then b ended.
        let seen = o.runs.iter().map(|r| r.changed).max().expect("runs");
        let o = r.observation(seen, LatencyData::default(), 171);
        assert!(o.runs.is_empty());
        r.ended(c, None, false, 180);
        let o = r.observation(seen, LatencyData::default(), 181);
        assert_eq!(o.runs.iter().map(|r| r.seq).collect::<Vec<_>>(), vec![c]);
        assert_eq!(o.runs[0].end, Some(180));
    }

    #[test]
    fn the_record_is_bounded_and_keeps_long_runs_slots() {
        let mut r = Recorder::default();
        let long = r.started(FarmId(1), task(0), 1, 0);
        for i in 1..(RUNS_KEPT as u32 + 10) {
            let s = r.started(FarmId(1), task(i), 1, i.into());
            r.ended(s, r.slot(s), false, u64::from(i) + 1);
        }
        assert_eq!(r.runs.len(), RUNS_KEPT);
        let o = r.observation(0, LatencyData::default(), 0);
        assert_eq!(o.runs.len(), RUNS_SENT);
        // The long run left the record but still holds slot 0.
        r.ended(long, Some(0), false, 99_999);
        let s = r.started(FarmId(1), task(1), 2, 100_000);
        assert_eq!(r.slot(s), Some(0));
    }

    #[test]
    fn a_runs_times_are_found_by_its_task_and_attempt() {
        let mut r = Recorder::default();
        let a = r.started(FarmId(1), task(0), 1, 100);
        let b = r.started(FarmId(1), task(0), 2, 200);
        r.ended(a, None, true, 150);
        assert_eq!(r.run_times(FarmId(1), task(0), 1), (Some(100), Some(150)));
        assert_eq!(r.run_times(FarmId(1), task(0), 2), (Some(200), None));
        r.ended(b, None, false, 250);
        assert_eq!(r.run_times(FarmId(1), task(0), 2), (Some(200), Some(250)));
        assert_eq!(r.run_times(FarmId(2), task(0), 1), (None, None));
    }

    #[test]
    fn meminfo_reads_total_and_available() {
        let s = "MemTotal:       16384 kB\nMemFree:  100 kB\nMemAvailable:    8192 kB\n";
        assert_eq!(meminfo(s), (Some(16384 * 1024), Some(8192 * 1024)));
        assert_eq!(meminfo("nothing"), (None, None));
    }
}
