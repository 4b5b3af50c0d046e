//! A cgroup of its own for each running task, where the node may make them (cgroup v1's `memory` and `cpuacct` controllers): its CPU time and memory high-water mark exact over every process it ever started, orphans included, and the kernel's own word on whether it killed one of them for memory.
//!
//! The node makes `mesh-<pid>` under its own group in both hierarchies
//! at start (stale ones of dead nodes are removed), and in it one group
//! per slot in use, made once and kept, each with a thread of the node
//! that lives in it (cgroup v1 places threads apart): a task is started
//! by its group's thread, so it is born in the group, and a child it
//! forks at once is counted too, where moving the task in after its start
//! would race with it. A start so costs no `mkdir` and no move, only the
//! group's counters zeroed.
//!
//! Asked for with `mesh node --cgroups` (or `MESH_CGROUPS=1`): on this
//! project's machines a group's file operations cost a `true` task a
//! fifth more than measuring from `/proc` (see docs/design/executor.md).
//! cgroup v2 places whole processes, not threads: a task could only be
//! moved in once started, racing with its first forks, so a node on v2
//! (or where it may not write its group: not root, a read-only
//! `/sys/fs/cgroup`) measures from `/proc` (see `usage.rs`). `mesh status
//! --nodes` says which.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, sync_channel, Sender};
use std::sync::{Mutex, OnceLock};

use mesh_protocol::mesh::Measure;

/// The node's own groups, where it makes them.
#[derive(Debug)]
struct Root {
    memory: PathBuf,
    cpuacct: PathBuf,
    /// Slot groups not in use now.
    free: Mutex<Vec<u32>>,
    /// Each slot group's thread (slot `n` at `n - 1`).
    spawners: Mutex<Vec<Sender<Job>>>,
}

/// What a slot group's thread is given to do: a task's start.
type Job = Box<dyn FnOnce() + Send>;

static ROOT: OnceLock<Option<Root>> = OnceLock::new();
static WHY: OnceLock<Measure> = OnceLock::new();

/// How this node measures its tasks (see `usage.rs`): decided at its
/// first task or at [`init`].
pub fn method() -> Measure {
    root();
    *WHY.get().unwrap_or(&Measure::Proc)
}

/// Whether the node was asked to measure its tasks with cgroups
/// (`--cgroups`, or `MESH_CGROUPS=1`).
static WANTED: AtomicBool = AtomicBool::new(false);

/// Settles how the node measures its tasks now rather than at its first,
/// with a cgroup per task where `cgroups` asks for them and the node may
/// make them.
pub fn init(cgroups: bool) {
    if cgroups {
        WANTED.store(true, Ordering::Relaxed);
    }
    root();
}

fn root() -> Option<&'static Root> {
    ROOT.get_or_init(|| {
        let (root, why) = if std::env::var_os("MESH_MEASURE").is_some_and(|v| v == "0") {
            (None, Measure::Off)
        } else if !WANTED.load(Ordering::Relaxed)
            && std::env::var_os("MESH_CGROUPS").is_none_or(|v| v != "1")
        {
            (None, Measure::Proc)
        } else {
            match make_root() {
                Some(r) => (Some(r), Measure::CgroupV1),
                None => (None, Measure::Proc),
            }
        };
        let _ = WHY.set(why);
        root
    })
    .as_ref()
}

/// Where a v1 hierarchy with `controller` is mounted, and this process's
/// group in it.
fn v1_group(controller: &str) -> Option<(PathBuf, PathBuf)> {
    let mounts = fs::read_to_string("/proc/self/mountinfo").ok()?;
    let mount = mounts.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        let mut r = right.split_whitespace();
        let (fstype, _source, opts) = (r.next()?, r.next()?, r.next()?);
        (fstype == "cgroup" && opts.split(',').any(|o| o == controller))
            .then(|| left.split_whitespace().nth(4).map(PathBuf::from))?
    })?;
    let groups = fs::read_to_string("/proc/self/cgroup").ok()?;
    let own = groups.lines().find_map(|l| {
        let mut f = l.splitn(3, ':');
        let (_, controllers, path) = (f.next()?, f.next()?, f.next()?);
        controllers
            .split(',')
            .any(|c| c == controller)
            .then(|| path.trim_start_matches('/').to_string())
    })?;
    Some((mount.clone(), mount.join(own)))
}

fn make_root() -> Option<Root> {
    let (_, memory_home) = v1_group("memory")?;
    let (_, cpuacct_home) = v1_group("cpuacct")?;
    let name = format!("mesh-{}", std::process::id());
    for home in [&memory_home, &cpuacct_home] {
        remove_stale(home);
    }
    let memory = memory_home.join(&name);
    let cpuacct = cpuacct_home.join(&name);
    fs::create_dir_all(&memory).ok()?;
    if fs::create_dir_all(&cpuacct).is_err() {
        let _ = fs::remove_dir(&memory);
        return None;
    }
    let root = Root {
        memory,
        cpuacct,
        free: Mutex::new(Vec::new()),
        spawners: Mutex::new(Vec::new()),
    };
    // A node that may make groups but not move a thread into them (no
    // write to `tasks`) measures from /proc.
    let n = root.slot()?;
    root.free.lock().unwrap_or_else(|e| e.into_inner()).push(n);
    Some(root)
}

/// Removes the groups of nodes that died (a `mesh-<pid>` whose pid is
/// gone, and its slot groups), where nothing runs in them any more.
fn remove_stale(home: &Path) {
    let Ok(entries) = fs::read_dir(home) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("mesh-"))
            .and_then(|p| p.parse::<i32>().ok())
        else {
            continue;
        };
        if Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        if let Ok(slots) = fs::read_dir(e.path()) {
            for s in slots.flatten().filter(|s| s.path().is_dir()) {
                let _ = fs::remove_dir(s.path());
            }
        }
        let _ = fs::remove_dir(e.path());
    }
}

impl Root {
    /// A free slot group; a new one (with its thread) when none is.
    fn slot(&self) -> Option<u32> {
        if let Some(n) = self.free.lock().unwrap_or_else(|e| e.into_inner()).pop() {
            return Some(n);
        }
        let mut spawners = self.spawners.lock().unwrap_or_else(|e| e.into_inner());
        let n = spawners.len() as u32 + 1;
        let memory = self.memory.join(n.to_string());
        let cpuacct = self.cpuacct.join(n.to_string());
        fs::create_dir_all(&memory).ok()?;
        fs::create_dir_all(&cpuacct).ok()?;
        let (tx, rx) = channel::<Job>();
        let (entered_tx, entered) = sync_channel(1);
        std::thread::Builder::new()
            .name(format!("mesh-cgroup-{n}"))
            .spawn(move || {
                let me = tid().to_string();
                let entered = fs::write(memory.join("tasks"), &me)
                    .and_then(|()| fs::write(cpuacct.join("tasks"), &me));
                let ok = entered.is_ok();
                let _ = entered_tx.send(ok);
                if ok {
                    for job in rx {
                        job();
                    }
                }
            })
            .ok()?;
        if !entered.recv().unwrap_or(false) {
            return None;
        }
        spawners.push(tx);
        Some(n)
    }
}

/// A task's group while it runs: back among the free ones when dropped.
#[derive(Debug)]
pub struct Group {
    root: &'static Root,
    n: u32,
    memory: PathBuf,
    cpuacct: PathBuf,
    /// The group's count of kills for memory before this task.
    oom_before: u64,
}

/// The calling thread's id, as the kernel numbers threads in `tasks`.
fn tid() -> i32 {
    nix::unistd::gettid().as_raw()
}

impl Group {
    /// A group for a task about to start, its counters zeroed; `None` on
    /// a node that measures from `/proc`.
    pub fn take() -> Option<Group> {
        let root = root()?;
        let n = root.slot()?;
        let mut g = Group {
            root,
            n,
            memory: root.memory.join(n.to_string()),
            cpuacct: root.cpuacct.join(n.to_string()),
            oom_before: 0,
        };
        // Zeroed rather than made anew: a start costs writes only.
        let _ = fs::write(g.memory.join("memory.max_usage_in_bytes"), "0");
        let _ = fs::write(g.cpuacct.join("cpuacct.usage"), "0");
        g.oom_before = g.oom_kills();
        Some(g)
    }

    /// Runs `start` (the start of a task) on the group's thread, so the
    /// task is born in the group; here, where that thread is gone.
    pub fn spawn_in<T: Send + 'static>(&self, start: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = sync_channel(1);
        let start = std::sync::Arc::new(Mutex::new(Some(start)));
        let job = {
            let start = start.clone();
            move || {
                if let Some(f) = start.lock().unwrap_or_else(|e| e.into_inner()).take() {
                    let _ = tx.send(f());
                }
            }
        };
        let sent = self
            .root
            .spawners
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(self.n as usize - 1)
            .is_some_and(|s| s.send(Box::new(job)).is_ok());
        if let Some(done) = sent.then(|| rx.recv().ok()).flatten() {
            return done;
        }
        let f = start.lock().unwrap_or_else(|e| e.into_inner()).take();
        f.expect("a start that its group's thread did not run")()
    }

    /// CPU time of every process that ran in the group, in ms.
    pub fn cpu_ms(&self) -> Option<u64> {
        read_u64(&self.cpuacct.join("cpuacct.usage")).map(|ns| ns / 1_000_000)
    }

    /// The group's memory high-water mark less the page cache its
    /// processes may have filled: what they held at most, without the file
    /// pages their reads and writes left, which `ps` and `sacct` do not
    /// count either. v1 keeps no high-water mark without the cache, and a
    /// file written then deleted leaves none at the end, so the cache is
    /// taken as what the processes read and wrote (`moved`): a floor,
    /// never more than they held.
    pub fn peak(&self, moved: u64) -> Option<u64> {
        let max = read_u64(&self.memory.join("memory.max_usage_in_bytes"))?;
        Some(max.saturating_sub(moved))
    }

    /// Whether the kernel killed a process of the group for memory while
    /// this task ran.
    pub fn oom_killed(&self) -> bool {
        self.oom_kills() > self.oom_before
    }

    fn oom_kills(&self) -> u64 {
        fs::read_to_string(self.memory.join("memory.oom_control"))
            .ok()
            .and_then(|t| {
                t.lines()
                    .find_map(|l| l.strip_prefix("oom_kill ")?.trim().parse().ok())
            })
            .unwrap_or(0)
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        // A process the task left running (a daemon it started) stays in
        // the group and would count toward the next task: that group is
        // not used again.
        // The node itself is listed: its thread for the group lives there.
        let node = std::process::id().to_string();
        let empty = fs::read_to_string(self.memory.join("cgroup.procs"))
            .is_ok_and(|p| p.split_whitespace().all(|pid| pid == node));
        if empty {
            self.root
                .free
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(self.n);
        }
    }
}

fn read_u64(path: &Path) -> Option<u64> {
    fs::read_to_string(path).ok()?.trim().parse().ok()
}
