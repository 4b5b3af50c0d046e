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
//! A call in a warm Python worker (see `warm.rs`) is measured by the
//! worker itself, its own use before the call apart (`warm.py` reads its
//! counts around the call and resets its high-water mark as it begins);
//! [`Call`] adds what the processes the call started held, looked at as
//! a task's tree is, and reads a worker that died in a call.
//!
//! No cgroup is made: it would need root, and would count the page cache
//! a task's writes leave as its memory, where users and `sacct` mean its
//! resident set.

use std::fs;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

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
    /// The task's own cgroup, where the node makes them (see cgroup.rs):
    /// its CPU, high-water mark and kills for memory, exact.
    group: Option<crate::cgroup::Group>,
    /// Where each look leaves what it found, for the dashboard.
    looked: Arc<Looked>,
}

/// What a running task held and had spent at its last look, left where
/// the node reads it for the dashboard (its executor's `Live` handle).
#[derive(Debug, Default)]
pub struct Looked {
    rss: AtomicU64,
    peak: AtomicU64,
    /// CPU ms plus one; 0 until a look reads it.
    cpu: AtomicU64,
    looks: AtomicU64,
}

/// CPU time is read at a look from this one on (some 0.5 s after a start):
/// a thin task's looks stay a read of its memory alone.
const CPU_LOOK: u64 = 6;

impl Looked {
    /// The resident memory now, the most seen and the CPU spent: none
    /// before the first look.
    pub fn now(&self) -> Option<(u64, u64, Option<u64>)> {
        if self.looks.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let cpu = self.cpu.load(Ordering::Relaxed);
        Some((
            self.rss.load(Ordering::Relaxed),
            self.peak.load(Ordering::Relaxed),
            cpu.checked_sub(1),
        ))
    }

    /// Counts a look and says whether this one reads CPU time.
    fn count(&self) -> bool {
        self.looks.fetch_add(1, Ordering::Relaxed) + 1 >= CPU_LOOK
    }

    fn store(&self, rss: u64, peak: u64, cpu_ms: Option<u64>) {
        self.rss.store(rss, Ordering::Relaxed);
        self.peak.store(peak, Ordering::Relaxed);
        if let Some(c) = cpu_ms {
            self.cpu.store(c + 1, Ordering::Relaxed);
        }
    }
}

/// Whether tasks are measured: unless the node's environment has
/// `MESH_MEASURE=0` (which lets the overhead bench weigh what measuring
/// costs).
pub(crate) fn measuring() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("MESH_MEASURE").is_none_or(|v| v != "0"))
}

/// `mesh node --enforce-mem` (or `mesh run --enforce-mem`): as
/// `MESH_ENFORCE_MEM=1`.
static ENFORCE: AtomicBool = AtomicBool::new(false);

/// Holds tasks to their memory asks from now on (see `enforcing`).
pub fn enforce_mem() {
    ENFORCE.store(true, Ordering::Relaxed);
}

/// Whether a task past its memory ask is killed: where the node's
/// environment has `MESH_ENFORCE_MEM=1` (or `--enforce-mem`). Off by default, as HyperQueue and
/// Snakemake leave an ask a scheduling hint (an imported trace's asks,
/// scaled down, are far below what a shell holds); SLURM users turn it on.
fn enforcing() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    ENFORCE.load(Ordering::Relaxed)
        || *ON.get_or_init(|| std::env::var_os("MESH_ENFORCE_MEM").is_some_and(|v| v == "1"))
}

/// A task (or a warm call) is looked at first this long after its start,
/// then at doubling intervals up to `EXIT_POLL_MAX_MS`, when the executor
/// also asks whether it has ended: the longest interval is how long a peak
/// of memory may go unseen. A node with many long tasks wakes for each
/// four times a second, some 50 µs of reading `/proc` each time.
pub(crate) const EXIT_POLL_FIRST_MS: u64 = 10;
pub(crate) const EXIT_POLL_MAX_MS: u64 = 250;

/// One kibibyte: `/proc`'s memory figures are in kB (KiB).
const KIB: u64 = 1024;
/// At most this many processes are followed in a task's tree at one look,
/// so a fork bomb costs the node a bounded walk.
const TREE_MAX: usize = 4096;

impl Meter {
    /// Starts following the task whose leader is `pid`, which asked for
    /// `asked` bytes of memory (0: none), its limit where the node
    /// enforces asks.
    pub fn start(
        pid: i32,
        asked: u64,
        group: Option<crate::cgroup::Group>,
        looked: Arc<Looked>,
    ) -> Meter {
        let on = measuring();
        let limit = if on && enforcing() { asked } else { 0 };
        Meter {
            pid,
            peak: 0,
            // The task's cgroup counts its kills for memory itself.
            oom_kills: if on && group.is_none() {
                oom_kills_lately()
            } else {
                None
            },
            limit,
            over: false,
            on,
            group,
            looked,
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
        let with_cpu = self.looked.count();
        // A cgroup counts its CPU in one file; the tree is read otherwise.
        let group_cpu = match (&self.group, with_cpu) {
            (Some(g), true) => g.cpu_ms(),
            _ => None,
        };
        let l = look(self.pid, with_cpu && group_cpu.is_none());
        let rss = l.root_rss + l.rest_rss;
        self.peak = self.peak.max(rss).max(l.root_hwm).max(l.rest_hwm);
        if self.limit > 0 && rss > self.limit {
            self.over = true;
        }
        let cpu = group_cpu.or(with_cpu.then(|| ticks_ms(l.cpu_ticks)));
        self.looked.store(rss, self.peak, cpu);
        self.over
    }

    /// What the task used, read from its leader after it exited and before
    /// it is reaped (a zombie still has its counts). `sigkilled`: its
    /// leader died of SIGKILL. `oom` says that it passed its ask, or that
    /// it was SIGKILLed while the kernel killed some process for memory:
    /// its caller keeps it only where no timeout or cancel sent the kill.
    pub fn finish(&self, sigkilled: bool) -> Usage {
        let (read_bytes, written_bytes) = io(self.pid);
        // Asked only of a task SIGKILLed: no other died for memory.
        let killed_for_memory = sigkilled
            && match &self.group {
                Some(g) => g.oom_killed(),
                None => matches!((self.oom_kills, oom_kills()), (Some(a), Some(b)) if b > a),
            };
        // A cgroup's CPU counts every process the task ever had, those it
        // did not wait for too; its high-water mark, the peaks between looks.
        let group = self.group.as_ref();
        Usage {
            cpu_ms: group
                .and_then(|g| g.cpu_ms())
                .unwrap_or_else(|| cpu_ms(self.pid)),
            peak_rss: self.peak.max(
                group
                    .and_then(|g| g.peak(read_bytes + written_bytes))
                    .unwrap_or(0),
            ),
            read_bytes,
            written_bytes,
            oom: self.over || killed_for_memory,
        }
    }
}

/// Follows one call in a warm Python worker (see `warm.rs`), whose
/// worker is `pid`. The worker tells what the call used itself (`warm.py`
/// reads its own counts around it, its memory above what it held when
/// the call began); what is looked at here is the processes the call
/// started (a Snakemake job's shell and the tools it runs), as a task's
/// tree is, and the worker's own high-water mark, for a call that killed
/// its worker before it could tell. Where the node enforces memory asks,
/// a call whose worker holds more than it held before the call by more
/// than its ask, its processes included, is killed with its worker.
pub struct Call {
    pid: i32,
    /// What the worker held when it last answered, in bytes.
    held: u64,
    /// The memory the call may hold, in bytes (0: no limit).
    limit: u64,
    /// It held more than `limit` at a look: it is killed.
    over: bool,
    /// The most the worker's descendants held at one look, in bytes.
    children: u64,
    /// The worker's high-water mark at the last look: the worker resets
    /// it as each call begins, so it is the call's.
    worker_hwm: u64,
    /// The kernel's count of processes it killed for memory, at the start.
    oom_kills: Option<u64>,
    on: bool,
    /// The worker's CPU time when it last answered, in ms: what the
    /// call's live figure is counted from.
    cpu_before: u64,
    looked: Arc<Looked>,
}

/// What a warm worker had used in all when it last answered, as it told:
/// what a call's figures are counted from when the worker dies in it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    pub cpu_ms: u64,
    pub read_bytes: u64,
    pub written_bytes: u64,
    /// Its resident memory, in bytes.
    pub rss: u64,
}

impl Call {
    /// Starts following a call in the worker `pid`, which had used
    /// `before` when it last answered (none: a fresh worker, whose own
    /// memory counts against the ask, as a task's interpreter's does), for
    /// a task that asked for `asked` bytes (0: none).
    pub fn start(pid: i32, before: Option<Totals>, asked: u64, looked: Arc<Looked>) -> Call {
        let on = measuring();
        let before = before.unwrap_or_default();
        Call {
            pid,
            held: before.rss,
            cpu_before: before.cpu_ms,
            looked,
            limit: if on && enforcing() { asked } else { 0 },
            over: false,
            children: 0,
            worker_hwm: 0,
            oom_kills: if on { oom_kills_lately() } else { None },
            on,
        }
    }

    /// Whether it measures at all (see `measuring`).
    pub fn on(&self) -> bool {
        self.on
    }

    /// One look at the worker and the processes under it. True when the
    /// call holds more than it asked for.
    pub fn sample(&mut self) -> bool {
        if !self.on {
            return false;
        }
        let with_cpu = self.looked.count();
        let l = look(self.pid, with_cpu);
        self.children = self.children.max(l.rest_rss).max(l.rest_hwm);
        self.worker_hwm = self.worker_hwm.max(l.root_hwm);
        let rss = l.root_rss.saturating_sub(self.held) + l.rest_rss;
        if self.limit > 0 && rss > self.limit {
            self.over = true;
        }
        let peak = self.worker_hwm.saturating_sub(self.held) + self.children;
        let cpu = with_cpu.then(|| ticks_ms(l.cpu_ticks).saturating_sub(self.cpu_before));
        self.looked.store(rss, peak.max(rss), cpu);
        self.over
    }

    /// What the call used: what the worker told of itself, and the most
    /// the processes it started held at a look, added to its peak.
    pub fn told(&self, worker: Usage) -> Usage {
        Usage {
            peak_rss: worker.peak_rss + self.children,
            ..worker
        }
    }

    /// What a call used whose worker died in it (killed with the task,
    /// past its ask, by the kernel, or a script that ended the process):
    /// read from the dead worker before it is reaped, less `before`, what
    /// it had used when it last answered (none for a fresh worker: its
    /// start counts, as a task's own process's does). Its memory is as of
    /// the last look. `oom` as [`Meter::finish`] says it.
    pub fn died(&self, sigkilled: bool, before: Option<Totals>) -> Usage {
        let b = before.unwrap_or_default();
        let (read, written) = io(self.pid);
        Usage {
            cpu_ms: cpu_ms(self.pid).saturating_sub(b.cpu_ms),
            peak_rss: self.worker_hwm.saturating_sub(b.rss) + self.children,
            read_bytes: read.saturating_sub(b.read_bytes),
            written_bytes: written.saturating_sub(b.written_bytes),
            oom: self.over
                || (sigkilled
                    && matches!((self.oom_kills, oom_kills()), (Some(a), Some(b)) if b > a)),
        }
    }
}

/// What one look at a process tree found, in bytes.
#[derive(Default)]
struct Look {
    /// The root's resident memory and its high-water mark.
    root_rss: u64,
    root_hwm: u64,
    /// The resident memory of the rest of the tree, summed, and the
    /// largest high-water mark among them.
    rest_rss: u64,
    rest_hwm: u64,
    /// CPU ticks of the tree's processes (and of the children they
    /// waited for), where asked for.
    cpu_ticks: u64,
}

/// Walks the tree under `pid` (none where `pid` is gone), reading its
/// CPU time too where `cpu`.
fn look(pid: i32, cpu: bool) -> Look {
    let mut l = Look::default();
    let mut stack = vec![pid];
    let mut seen = 0;
    while let Some(p) = stack.pop() {
        seen += 1;
        if seen > TREE_MAX {
            break;
        }
        let Some((now, hwm)) = memory(p) else {
            continue;
        };
        if cpu {
            l.cpu_ticks += cpu_ticks(p);
        }
        if p == pid {
            (l.root_rss, l.root_hwm) = (now, hwm);
        } else {
            l.rest_rss += now;
            l.rest_hwm = l.rest_hwm.max(hwm);
        }
        children(p, &mut stack);
    }
    l
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
    ticks_ms(cpu_ticks(pid))
}

fn ticks_ms(ticks: u64) -> u64 {
    ticks * 1000 / clock_ticks()
}

/// [`cpu_ms`] in the kernel's clock ticks.
fn cpu_ticks(pid: i32) -> u64 {
    let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0;
    };
    // The command name may hold spaces and parentheses: fields start after the last `)`.
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return 0;
    };
    // Fields 14 to 17 of proc(5), utime, stime, cutime and cstime, counted
    // from the state (field 3, the first here).
    rest.split_whitespace()
        .skip(11)
        .take(4)
        .filter_map(|f| f.parse::<u64>().ok())
        .sum()
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

#[cfg(test)]
mod tests {
    use std::process::{Child, Command};
    use std::time::Duration;

    use nix::sys::wait::{waitid, Id, WaitPidFlag};
    use nix::unistd::Pid;

    use super::*;

    /// `script` in a group of its own, as a worker is.
    fn sh(script: &str) -> Child {
        use std::os::unix::process::CommandExt;
        Command::new("sh")
            .arg("-c")
            .arg(script)
            .process_group(0)
            .spawn()
            .expect("sh")
    }

    /// Kills `worker`'s group, and so what it started.
    fn kill(worker: &Child) {
        use nix::sys::signal::{killpg, Signal};
        let _ = killpg(Pid::from_raw(worker.id() as i32), Signal::SIGKILL);
    }

    /// A warm worker's own use is its own to tell; what the processes a
    /// call started held is looked at and added.
    #[test]
    fn a_call_adds_what_the_processes_it_started_held_to_what_its_worker_told() {
        const MIB: u64 = 1 << 20;
        let mut worker = sh(
            "python3 -c 'x = bytearray(64 << 20); x[::4096] = bytes(len(x) // 4096); \
             import time; time.sleep(3)'; true",
        );
        let mut call = Call::start(worker.id() as i32, None, 0, Default::default());
        for _ in 0..15 {
            std::thread::sleep(Duration::from_millis(100));
            call.sample();
        }
        let told = call.told(Usage {
            cpu_ms: 5,
            peak_rss: MIB,
            ..Usage::default()
        });
        kill(&worker);
        let _ = worker.wait();
        // The child's 64 MiB and its interpreter; not the shell's own.
        assert!((65 * MIB..100 * MIB).contains(&told.peak_rss), "{told:?}");
        assert_eq!(told.cpu_ms, 5);
    }

    /// A worker killed in a call is read dead, less what it had used when
    /// it last answered.
    #[test]
    fn a_call_whose_worker_died_is_read_from_the_dead_worker() {
        let mut worker = sh("while :; do :; done");
        let pid = worker.id() as i32;
        let call = Call::start(pid, None, 0, Default::default());
        // A loaded machine stretches its run, not its CPU.
        for _ in 0..300 {
            if cpu_ms(pid) >= 300 {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        kill(&worker);
        let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT;
        waitid(Id::Pid(Pid::from_raw(pid)), flags).expect("dead, unreaped");
        let all = call.died(true, None);
        let before = Totals {
            cpu_ms: 100,
            ..Totals::default()
        };
        let since = call.died(true, Some(before));
        let _ = worker.wait();
        assert!(all.cpu_ms >= 300, "{all:?}");
        assert_eq!(since.cpu_ms, all.cpu_ms - 100);
        assert!(!all.oom, "no kill for memory: {all:?}");
    }

    /// A running task's looks are left for the dashboard: what its tree
    /// holds now, and from the sixth look on the CPU it has spent (a
    /// child's, which its shell has not waited for yet, included).
    #[test]
    fn a_running_tasks_looks_say_what_it_holds_and_has_spent_so_far() {
        const MIB: u64 = 1 << 20;
        let mut task = sh(
            "python3 -c 'x = bytearray(48 << 20); x[::4096] = bytes(len(x) // 4096); \
             import time; t = time.process_time(); \
             exec(\"while time.process_time() - t < 0.4: pass\"); time.sleep(30)'; true",
        );
        let pid = task.id() as i32;
        let looked = Arc::new(Looked::default());
        let mut meter = Meter::start(pid, 0, None, looked.clone());
        assert_eq!(looked.now(), None, "nothing before the first look");
        // Until the child holds its memory and has spun (a loaded machine
        // stretches both), a look each 100 ms.
        let mut seen = None;
        for _ in 0..300 {
            std::thread::sleep(Duration::from_millis(100));
            meter.sample();
            seen = looked.now();
            if matches!(seen, Some((rss, _, Some(cpu))) if rss >= 48 * MIB && cpu >= 400) {
                break;
            }
        }
        kill(&task);
        let _ = task.wait();
        let (rss, peak, cpu) = seen.expect("looked");
        assert!((48 * MIB..90 * MIB).contains(&rss), "holds {rss} B");
        assert!(peak >= rss, "{peak} < {rss}");
        let cpu = cpu.expect("CPU read from the sixth look");
        assert!((400..5000).contains(&cpu), "{cpu} ms");
    }
}
