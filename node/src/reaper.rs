//! Tasks die with their node: a watchdog process that kills every task's process group once the node that started them is gone, however it went.
//!
//! A task runs in a process group of its own (so a timeout or a cancel
//! kills all it started), which also means that a node killed outright
//! (SIGKILL, the kernel's OOM killer, a crash) would leave its tasks
//! running on: a task retried elsewhere would overlap with its first run,
//! two writers of one output. `PR_SET_PDEATHSIG` reaches only a direct
//! child, not a shell's children nor a group, and fires when the thread
//! that forked exits, not the process; a subreaper sees orphans but dies
//! with the node. So the node keeps one small watchdog (`/bin/sh`, in a
//! group of its own, deaf to the terminal's signals) whose stdin is a
//! pipe only the node holds: the node writes `+PGID` when a task's group
//! starts and `-PGID` when it ends, and when the node is gone the kernel
//! closes the pipe, the watchdog reads its end, and it kills every group
//! still listed. A group is listed from its spawn until its leader is
//! reaped, so its id cannot have been reused while listed.

use std::collections::HashSet;
use std::fs::File;
use std::io::Write as _;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};

/// The watchdog: groups on its stdin, killed at its end of file. Read a
/// line at a time by a POSIX shell; a group is removed by cutting it out
/// of the list (no process started per line).
const WATCHDOG: &str = r#"trap '' INT HUP TERM QUIT TSTP TTIN TTOU
set -f
pgs=' '
while IFS= read -r l; do
  case $l in
    +*) pgs="$pgs${l#+} " ;;
    -*) g=${l#-}
        case $pgs in *" $g "*) pgs="${pgs%% $g *} ${pgs#* $g }" ;; esac ;;
  esac
done
for g in $pgs; do kill -KILL -"$g" 2>/dev/null; done
"#;

struct Watchdog {
    child: Child,
    pipe: File,
}

struct State {
    dog: Option<Watchdog>,
    /// The groups listed, to list again should the watchdog die first.
    groups: HashSet<i32>,
}

static STATE: OnceLock<Mutex<State>> = OnceLock::new();

fn state() -> std::sync::MutexGuard<'static, State> {
    STATE
        .get_or_init(|| {
            Mutex::new(State {
                dog: None,
                groups: HashSet::new(),
            })
        })
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

fn start() -> std::io::Result<Watchdog> {
    // The node's end closes on exec (no task inherits it, so none keeps
    // the watchdog waiting); the watchdog's end is its stdin.
    let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    let child = Command::new("/bin/sh")
        .arg("-c")
        .arg(WATCHDOG)
        .stdin(Stdio::from(r))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()?;
    Ok(Watchdog {
        child,
        pipe: File::from(w),
    })
}

/// Writes `line` to the watchdog, starting it (again) where it is not
/// running, with every group listed so far.
fn tell(st: &mut State, line: &str) {
    for _ in 0..2 {
        let alive = st
            .dog
            .as_mut()
            .is_some_and(|d| matches!(d.child.try_wait(), Ok(None)));
        if !alive {
            if let Some(mut old) = st.dog.take() {
                let _ = old.child.wait();
            }
            match start() {
                Ok(mut d) => {
                    let all: String = st.groups.iter().map(|g| format!("+{g}\n")).collect();
                    if d.pipe.write_all(all.as_bytes()).is_err() {
                        continue;
                    }
                    st.dog = Some(d);
                }
                Err(e) => {
                    tracing::warn!(
                        "cannot start the watchdog that kills tasks with their node: {e}"
                    );
                    return;
                }
            }
        }
        if let Some(d) = st.dog.as_mut() {
            if d.pipe.write_all(line.as_bytes()).is_ok() {
                return;
            }
            st.dog = None;
        }
    }
}

/// A task's process group started: it is killed if the node dies first.
pub fn watch(pgid: i32) {
    if pgid <= 0 {
        return;
    }
    let mut st = state();
    if st.groups.insert(pgid) {
        tell(&mut st, &format!("+{pgid}\n"));
    }
}

/// A task's group leader was reaped: its id may be reused now.
pub fn unwatch(pgid: i32) {
    let mut st = state();
    if st.groups.remove(&pgid) {
        tell(&mut st, &format!("-{pgid}\n"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    fn alive(pid: i32) -> bool {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok()
    }

    fn reap_within(child: &mut Child, limit: Duration) -> bool {
        let end = Instant::now() + limit;
        while Instant::now() < end {
            if matches!(child.try_wait(), Ok(Some(_))) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        false
    }

    #[test]
    fn the_watchdog_kills_the_groups_listed_at_its_end_and_spares_those_unlisted() {
        let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
        let mut dog = Command::new("/bin/sh")
            .arg("-c")
            .arg(WATCHDOG)
            .stdin(Stdio::from(r))
            .process_group(0)
            .spawn()
            .unwrap();
        let spawn = || {
            Command::new("/bin/sh")
                .arg("-c")
                .arg("sleep 60 & wait")
                .process_group(0)
                .spawn()
                .unwrap()
        };
        let (mut kept, mut spared, mut gone) = (spawn(), spawn(), spawn());
        let mut pipe = File::from(w);
        let (k, s, g) = (kept.id(), spared.id(), gone.id());
        write!(
            pipe,
            "+{k}\n+{s}\n+{g}\n-{s}\n-{g}\n+{g}\n-{}\n",
            99_999_999
        )
        .unwrap();
        // The node is gone: its end of the pipe closes.
        drop(pipe);
        assert!(
            reap_within(&mut dog, Duration::from_secs(10)),
            "the watchdog ends at its end of file"
        );
        assert!(
            reap_within(&mut kept, Duration::from_secs(10)),
            "a listed group is killed"
        );
        assert!(
            reap_within(&mut gone, Duration::from_secs(10)),
            "a group listed again is killed"
        );
        assert!(alive(s as i32), "a group no longer listed is spared");
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(s as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
        let _ = spared.wait();
    }
}
