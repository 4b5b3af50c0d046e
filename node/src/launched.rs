//! A node process that has been started on a state folder but has not yet marked itself there: found in `/proc` by its command line.
//!
//! `mesh node &` followed at once by `mesh submit` is README's quick start
//! and every batch script's first two lines. The node marks itself
//! (`node.starting`) at its first step, but between the shell's fork and
//! that step lie the exec, the loader and the argument parser: milliseconds
//! on a quiet machine, more on a loaded one, and there a command found no
//! socket, no mark, and said no node runs (7 tries in 8 in one series). A
//! command that finds neither now looks for a `mesh node` or `mesh join`
//! process of this state folder, and waits a bounded time for its mark;
//! and for a process caught in the middle of an exec (no arguments to read
//! yet), a shorter time for its arguments.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

/// What `/proc` shows of a node starting on a state folder.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Launch {
    /// No process that may be one.
    None,
    /// A process in the middle of an exec, whose program and arguments
    /// cannot be read yet (the parent of a `vfork`, as Python's
    /// `subprocess` does, runs on from there), or a fork of this command's
    /// shell that has not exec'd yet: perhaps a node.
    Exec,
    /// A `mesh node` or `mesh join` process of this folder.
    Node,
}

/// Whether a process that runs `mesh node` or `mesh join` on `state` is
/// alive (Linux's `/proc`; elsewhere, never), or one in the middle of an
/// exec that may be. A process whose state folder cannot be read
/// (another user's) counts as one of this folder only when its command
/// line names it.
pub(crate) fn node_process_on(state: &Path) -> Launch {
    let parent = std::os::unix::process::parent_id();
    let shell = std::fs::read(format!("/proc/{parent}/cmdline"))
        .ok()
        .map(|cmdline| (parent, cmdline));
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Launch::None;
    };
    let me = std::process::id();
    let mut seen = Launch::None;
    for p in procs.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        if pid == me {
            continue;
        }
        match node_state(&p.path(), shell.as_ref()) {
            Some(Seen::Node(s)) if same_folder(&s, state) => return Launch::Node,
            Some(Seen::Exec) => seen = Launch::Exec,
            _ => {}
        }
    }
    seen
}

enum Seen {
    /// A mesh node of this folder (empty: a folder that cannot be told).
    Node(PathBuf),
    Exec,
}

/// What `/proc/<pid>/stat` says of a process: its pid, its state and its
/// parent.
struct Stat {
    pid: u32,
    state: char,
    ppid: u32,
}

fn stat_of(proc_dir: &Path) -> Option<Stat> {
    let stat = std::fs::read_to_string(proc_dir.join("stat")).ok()?;
    // `pid (comm) state ppid ...`: comm may hold spaces and parentheses.
    let (head, after) = stat.rsplit_once(')')?;
    let mut fields = after.split_whitespace();
    Some(Stat {
        pid: head.split_whitespace().next()?.parse().ok()?,
        state: fields.next()?.chars().next()?,
        ppid: fields.next()?.parse().ok()?,
    })
}

/// Whether the process at `/proc/<pid>` shows no arguments while it is
/// neither a kernel thread (its parent `kthreadd`, pid 2) nor a zombie:
/// one in the middle of an exec.
fn in_exec(proc_dir: &Path) -> bool {
    stat_of(proc_dir).is_some_and(|s| {
        !matches!(s.state, 'Z' | 'X' | 'x') && s.ppid != 2 && s.ppid != 0 && s.pid != 2
    })
}

/// The state folder of the process at `/proc/<pid>` if it is a mesh node,
/// or whether it is in the middle of an exec: its arguments not readable
/// yet, or still those of `shell` (this command's parent, its pid and
/// command line) whose child it is. The latter is a shell's `mesh node &`
/// forked and not yet exec'd, which a loaded machine may not run before
/// the shell's next command, this one (2 to 4 tries in 10 said no node
/// runs, stop 91).
fn node_state(proc_dir: &Path, shell: Option<&(u32, Vec<u8>)>) -> Option<Seen> {
    let cmdline = std::fs::read(proc_dir.join("cmdline")).ok()?;
    if cmdline.is_empty() {
        return in_exec(proc_dir).then_some(Seen::Exec);
    }
    if shell.is_some_and(|(pid, line)| {
        *line == cmdline && stat_of(proc_dir).is_some_and(|s| s.ppid == *pid)
    }) {
        return Some(Seen::Exec);
    }
    let args: Vec<OsString> = cmdline
        .split(|&b| b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| OsString::from_vec(a.to_vec()))
        .collect();
    let (program, rest) = args.split_first()?;
    if !is_mesh(program, proc_dir) {
        return None;
    }
    let mut flag = None;
    let mut command = None;
    let mut it = rest.iter();
    while let Some(a) = it.next() {
        let a = a.to_str()?;
        if a == "--state-dir" {
            flag = it.next().map(PathBuf::from);
        } else if let Some(v) = a.strip_prefix("--state-dir=") {
            flag = Some(PathBuf::from(v));
        } else if !a.starts_with('-') && command.is_none() {
            command = Some(a.to_string());
        }
    }
    if !matches!(command.as_deref(), Some("node" | "join")) {
        return None;
    }
    let cwd = std::fs::read_link(proc_dir.join("cwd")).ok();
    let env = std::fs::read(proc_dir.join("environ")).ok();
    if env.is_none() && flag.is_none() {
        return Some(Seen::Node(PathBuf::new()));
    }
    let var = |name: &str| -> Option<OsString> {
        let prefix = format!("{name}=");
        env.as_ref()?
            .split(|&b| b == 0)
            .find_map(|kv| kv.strip_prefix(prefix.as_bytes()))
            .map(|v| OsString::from_vec(v.to_vec()))
    };
    // The rule its `mesh` followed, read from its environment.
    let state = match flag {
        Some(p) => p,
        None => crate::state_folder::resolve(var)?,
    };
    Some(Seen::Node(match (state.is_absolute(), cwd) {
        (true, _) => state,
        (false, Some(cwd)) => cwd.join(state),
        // A relative folder from a process whose folder is hidden: unknown.
        (false, None) => PathBuf::new(),
    }))
}

/// Whether a process whose command line starts with `program` runs mesh:
/// named `mesh`, named as this very command was (an install under another
/// name, `mesh-0.9` or a wrapper's copy, starts its node and runs its
/// commands under that name), or running this command's own executable
/// (a link under yet another name). A node under any other name is not
/// waited for, as before.
fn is_mesh(program: &OsString, proc_dir: &Path) -> bool {
    let Some(name) = Path::new(program).file_name() else {
        return false;
    };
    if name == "mesh" {
        return true;
    }
    let ours = std::env::args_os().next();
    if ours.as_deref().and_then(|p| Path::new(p).file_name()) == Some(name) {
        return true;
    }
    match (
        std::fs::read_link(proc_dir.join("exe")),
        std::env::current_exe(),
    ) {
        (Ok(theirs), Ok(mine)) => theirs == mine,
        _ => false,
    }
}

/// Whether two spellings of a state folder are one folder. An empty path is
/// a folder that could not be told, taken as this one: waiting a little
/// longer for a node is better than saying none runs while one starts.
fn same_folder(theirs: &Path, ours: &Path) -> bool {
    if theirs.as_os_str().is_empty() {
        return true;
    }
    let canon = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    canon(theirs) == canon(ours)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_process_is_found_by_its_state_folder_and_no_other() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("st");
        std::fs::create_dir_all(&state).unwrap();
        let other = dir.path().join("other");
        std::fs::create_dir_all(&other).unwrap();
        assert_ne!(node_process_on(&state), Launch::Node);
        // A stand-in with a node's command line, `mesh -s -- --state-dir
        // DIR node`: a shell that `exec -a` names `mesh`, reading what it
        // runs (a sleep, then more, so it stays this process) from its input.
        // Whether it is found, and found as a node of another folder.
        let started = |name: &str| {
            let mut child = std::process::Command::new("bash")
                .arg("-c")
                .arg(format!(
                    "exec -a {name} bash -s -- --state-dir {} node <<< 'sleep 10; :'",
                    state.display()
                ))
                .spawn()
                .unwrap();
            let found = (0..200).any(|_| {
                std::thread::sleep(std::time::Duration::from_millis(10));
                node_process_on(&state) == Launch::Node
            });
            let elsewhere = node_process_on(&other) == Launch::Node;
            child.kill().unwrap();
            child.wait().unwrap();
            (found, elsewhere)
        };
        let (found, elsewhere) = started("mesh");
        assert!(found, "the node process of this folder is found");
        assert!(!elsewhere, "a node of another folder is not this one's");
        // A command run under another name than `mesh` (an install named
        // `mesh-0.9`) finds its node started under that same name; a
        // process under a name that is neither is no node.
        let ours = std::env::args_os().next().unwrap();
        let ours = Path::new(&ours)
            .file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .to_string();
        assert_ne!(ours, "mesh");
        assert!(
            started(&ours).0,
            "a node under this command's own name is found"
        );
        assert!(
            !started("mash").0,
            "a process under another name is no node"
        );
        // `mesh node &` forked by a shell that has not exec'd yet shows the
        // shell's own command line: a subshell that stays a fork stands in.
        let mut shell = std::process::Command::new("bash")
            .arg("-c")
            .arg("( sleep 10; : ) & wait")
            .spawn()
            .unwrap();
        let pid = shell.id();
        // The subshell, once bash runs (its command line read then, not
        // the test's own before its exec).
        let forked = (0..200).find_map(|_| {
            std::thread::sleep(std::time::Duration::from_millis(10));
            // Found by its parent, as `/proc/*/task/*/children` is not
            // in every kernel.
            let dir = std::fs::read_dir("/proc")
                .ok()?
                .flatten()
                .find(|p| stat_of(&p.path()).is_some_and(|s| s.ppid == pid))?
                .path();
            let line = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let as_fork = matches!(node_state(&dir, Some(&(pid, line))), Some(Seen::Exec));
            let otherwise = node_state(&dir, Some(&(pid, b"zsh\0".to_vec()))).is_none();
            Some((as_fork, otherwise))
        });
        let _ = std::process::Command::new("pkill")
            .args(["-P", &pid.to_string()])
            .status();
        shell.kill().unwrap();
        shell.wait().unwrap();
        let (as_fork, otherwise) = forked.expect("the subshell is seen");
        assert!(as_fork, "a fork of this command's shell may be a node");
        assert!(
            otherwise,
            "a process with another command line than the shell's is none"
        );
        assert_ne!(
            node_process_on(&state),
            Launch::Node,
            "a process gone is no node"
        );
    }
}
