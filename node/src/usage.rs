//! What a task used: CPU time, peak memory of its process tree, bytes read and written, read from `/proc` while it runs and once it has exited.
//!
//! CPU time and bytes are exact: they are read from the task's leader
//! once it has exited and before it is reaped (`waitid` with `WNOWAIT`
//! leaves it a zombie), when its `/proc/<pid>/stat` and `/proc/<pid>/io`
//! count itself and every descendant it waited for, as `time` and `sacct`
//! do. Bytes are those of its read and write calls, as Nextflow's `rchar`
//! and `wchar`. Peak memory is sampled: at each look the resident memory
//! of every process in the tree is summed, and each process's own
//! high-water mark (`VmHWM`, which the kernel keeps exactly) is a floor,
//! so a tree whose biggest process is alive at a look is right, and only
//! a short-lived child that peaks and dies between two looks is missed.
//! Looks come at the times the executor asks whether the task has ended
//! (10 ms after it starts, then at doubling intervals up to 250 ms): a
//! peak held for less than that between two looks may be missed.
//!
//! On a node whose environment has `MESH_ENFORCE_MEM=1`, a task that
//! asked for memory (`mem`) and whose tree holds more than that at a look
//! is killed, as SLURM kills a job past `--mem`: placement counted on its
//! ask, and a task that takes more starves its neighbours or has the
//! kernel kill one of them, or the node. Its words then say so, with its
//! peak and its ask.
//!
//! No cgroup is made: it would need root, and would count the page cache
//! a task's writes leave as its memory, where users and `sacct` mean its
//! resident set.

use std::fs;

use mesh_protocol::engine::Usage;

/// Follows one task's process tree from its leader.
pub struct Meter {
    pid: i32,
    /// The largest sum of resident memory seen over the tree, in bytes.
    peak: u64,
    /// The kernel's count of processes it killed for memory, at the start.
    oom_kills: Option<u64>,
    /// The memory the task may hold, in bytes (0: no limit).
    limit: u64,
    /// The tree held more than `limit` at a look: the task is killed.
    over: bool,
    /// Off where the node's environment says `MESH_MEASURE=0`.
    on: bool,
}

/// Whether tasks are measured: unless the node's environment has
/// `MESH_MEASURE=0` (which lets the overhead bench weigh what measuring
/// costs).
fn measuring() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("MESH_MEASURE").is_none_or(|v| v != "0"))
}

/// Whether a task past its memory ask is killed: where the node's
/// environment has `MESH_ENFORCE_MEM=1`. Off by default, as HyperQueue and
/// Snakemake leave an ask a scheduling hint (an imported trace's asks,
/// scaled down, are far below what a shell holds); SLURM users turn it on.
fn enforcing() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("MESH_ENFORCE_MEM").is_some_and(|v| v == "1"))
}

/// One kibibyte: `/proc`'s memory figures are in kB (KiB).
const KIB: u64 = 1024;
/// At most this many processes are followed in a task's tree at one look,
/// so a fork bomb costs the node a bounded walk.
const TREE_MAX: usize = 4096;

impl Meter {
    /// Starts following the task whose leader is `pid`, which asked for
    /// `asked` bytes of memory (0: none), its limit where the node
    /// enforces asks.
    pub fn start(pid: i32, asked: u64) -> Meter {
        let on = measuring();
        let limit = if on && enforcing() { asked } else { 0 };
        Meter {
            pid,
            peak: 0,
            oom_kills: if on { oom_kills_lately() } else { None },
            limit,
            over: false,
            on,
        }
    }

    /// Whether it measures at all (see `measuring`).
    pub fn on(&self) -> bool {
        self.on
    }

    /// One look at the tree: its resident memory now, and each process's
    /// own high-water mark. True when it holds more than it asked for.
    pub fn sample(&mut self) -> bool {
        if !self.on {
            return false;
        }
        let mut rss = 0;
        let mut hwm_max = 0;
        let mut stack = vec![self.pid];
        let mut seen = 0;
        while let Some(pid) = stack.pop() {
            seen += 1;
            if seen > TREE_MAX {
                break;
            }
            let Some((now, hwm)) = memory(pid) else {
                continue;
            };
            rss += now;
            hwm_max = hwm_max.max(hwm);
            children(pid, &mut stack);
        }
        self.peak = self.peak.max(rss).max(hwm_max);
        if self.limit > 0 && rss > self.limit {
            self.over = true;
        }
        self.over
    }

    /// What the task used, read from its leader after it exited and before
    /// it is reaped (a zombie still has its counts). `sigkilled`: its
    /// leader died of SIGKILL. `oom` says that it passed its ask, or that
    /// it was SIGKILLed while the kernel killed some process for memory:
    /// its caller keeps it only where no timeout or cancel sent the kill.
    pub fn finish(&self, sigkilled: bool) -> Usage {
        let (read_bytes, written_bytes) = io(self.pid);
        let oom = self.over
            || (sigkilled && matches!((self.oom_kills, oom_kills()), (Some(a), Some(b)) if b > a));
        Usage {
            cpu_ms: cpu_ms(self.pid),
            peak_rss: self.peak,
            read_bytes,
            written_bytes,
            oom,
        }
    }
}

/// A process's resident memory now and its high-water mark, in bytes.
fn memory(pid: i32) -> Option<(u64, u64)> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb = |key: &str| {
        status.lines().find_map(|l| {
            l.strip_prefix(key)?
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()
        })
    };
    Some((kb("VmRSS:")? * KIB, kb("VmHWM:").unwrap_or(0) * KIB))
}

/// Pushes the children of every thread of `pid` on `stack`.
fn children(pid: i32, stack: &mut Vec<i32>) {
    let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return;
    };
    for t in tasks.flatten() {
        if let Ok(text) = fs::read_to_string(t.path().join("children")) {
            stack.extend(
                text.split_whitespace()
                    .filter_map(|c| c.parse::<i32>().ok()),
            );
        }
    }
}

/// User and system CPU time of `pid` and of the children it waited for, in ms.
fn cpu_ms(pid: i32) -> u64 {
    let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0;
    };
    // The command name may hold spaces and parentheses: fields start after the last `)`.
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return 0;
    };
    // Fields 14 to 17 of proc(5), utime, stime, cutime and cstime, counted
    // from the state (field 3, the first here).
    let ticks: u64 = rest
        .split_whitespace()
        .skip(11)
        .take(4)
        .filter_map(|f| f.parse::<u64>().ok())
        .sum();
    ticks * 1000 / clock_ticks()
}

/// Clock ticks a second, as `/proc` counts CPU time.
fn clock_ticks() -> u64 {
    use nix::unistd::{sysconf, SysconfVar};
    match sysconf(SysconfVar::CLK_TCK) {
        Ok(Some(t)) if t > 0 => t as u64,
        _ => 100,
    }
}

/// Bytes `pid` (and the children it waited for) read and wrote through
/// its read and write calls (`rchar`, `wchar`): what it asked for, on any
/// file system. The block layer's counts (`read_bytes`) say 0 for a file
/// on tmpfs or NFS, and for a reread the page cache serves.
fn io(pid: i32) -> (u64, u64) {
    let Ok(text) = fs::read_to_string(format!("/proc/{pid}/io")) else {
        return (0, 0);
    };
    let field = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key)?.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    (field("rchar:"), field("wchar:"))
}

/// The kernel's count of processes killed for want of memory, since boot.
fn oom_kills() -> Option<u64> {
    let text = fs::read_to_string("/proc/vmstat").ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("oom_kill ")?.trim().parse().ok())
}

/// [`oom_kills`] as read at most a second ago: a task's start takes it
/// from here, as reading `/proc/vmstat` (some 180 lines) for each of many
/// short tasks cost more than running them. A kill up to a second before
/// a task started may so be laid at its door, only if it then dies of a
/// SIGKILL no one in mesh sent.
fn oom_kills_lately() -> Option<u64> {
    use std::sync::Mutex;
    use std::time::{Duration, Instant};
    static LATELY: Mutex<Option<(Instant, Option<u64>)>> = Mutex::new(None);
    let mut lately = LATELY.lock().unwrap_or_else(|e| e.into_inner());
    match *lately {
        Some((at, count)) if at.elapsed() < Duration::from_secs(1) => count,
        _ => {
            let count = oom_kills();
            *lately = Some((Instant::now(), count));
            count
        }
    }
}
