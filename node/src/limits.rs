//! Host limits a node meets at size: its open-file limit raised at start and weighed against the mesh, and lines about them said at most so often.
//!
//! Many Linux systems start processes with a soft limit of 1,024 open
//! files and a far higher hard limit. A node raises the soft limit to the
//! hard one at start, as Go's runtime does for every program, so a mesh
//! of thousands does not meet a limit nobody asked for; where the hard
//! limit itself is low, the node says so, at start and once the mesh
//! outgrows it, and says when it could not take a connection for want of
//! descriptors, rather than failing in silence.

use std::collections::HashMap;
use std::io;
use std::time::{Duration, Instant};

use nix::sys::resource::{getrlimit, setrlimit, Resource};

/// Descriptors a node needs besides one per member it talks to: its
/// store, sockets, logs, and the pipes of the tasks it runs.
pub const FILES_BASE: u64 = 64;

/// The open-file limit after `raise_open_files`, and what it was before.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpenFiles {
    pub limit: u64,
    pub was: u64,
}

impl OpenFiles {
    /// How many members a node can talk to at once within this limit.
    pub fn members(&self) -> u64 {
        self.limit.saturating_sub(FILES_BASE)
    }

    /// The limit is too low for a mesh of `size` nodes: the coordinator,
    /// or a home fetching outputs, may talk to every member at once.
    pub fn short_for(&self, size: usize) -> bool {
        (size as u64) > self.members()
    }
}

/// Raises this process's soft open-file limit to its hard limit; the
/// limit in force after, and before.
pub fn raise_open_files() -> io::Result<OpenFiles> {
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).map_err(io::Error::from)?;
    if soft >= hard {
        return Ok(OpenFiles {
            limit: soft,
            was: soft,
        });
    }
    setrlimit(Resource::RLIMIT_NOFILE, hard, hard).map_err(io::Error::from)?;
    Ok(OpenFiles {
        limit: hard,
        was: soft,
    })
}

/// How many descriptors this process has open (Linux; None elsewhere).
pub fn open_files_in_use() -> Option<u64> {
    Some(std::fs::read_dir("/proc/self/fd").ok()?.count() as u64)
}

/// The error means this process (or the system) is out of descriptors.
/// The transport wraps the accept's own error in another io::Error, so
/// the code is looked for down the chain.
pub fn out_of_files(e: &io::Error) -> bool {
    std::iter::successors(Some(e), |e| {
        e.get_ref()
            .and_then(|inner| inner.downcast_ref::<io::Error>())
    })
    .any(|e| {
        matches!(
            e.raw_os_error(),
            Some(code) if code == nix::libc::EMFILE || code == nix::libc::ENFILE
        )
    })
}

/// Lines of one kind said at most once per `every`, with how many were
/// held back since (a node refusing hundreds of connections a second
/// says so once, not hundreds of times).
#[derive(Debug)]
pub struct Throttle {
    every: Duration,
    kinds: HashMap<usize, (Instant, u64)>,
}

impl Throttle {
    pub fn new(every: Duration) -> Throttle {
        Throttle {
            every,
            kinds: HashMap::new(),
        }
    }

    /// The line to say now, if one of its kind was not said lately.
    pub fn line(&mut self, kind: usize, now: Instant, line: &str) -> Option<String> {
        match self.kinds.get_mut(&kind) {
            Some((at, held)) if now < *at + self.every => {
                *held += 1;
                None
            }
            Some((at, held)) => {
                let text = if *held > 0 {
                    format!("{line} (and {held} more like it since)")
                } else {
                    line.to_string()
                };
                *at = now;
                *held = 0;
                Some(text)
            }
            None => {
                self.kinds.insert(kind, (now, 0));
                Some(line.to_string())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_soft_limit_is_raised_to_the_hard_one() {
        let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
        let got = raise_open_files().unwrap();
        assert_eq!(got.limit, hard);
        let (soft, _) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
        assert_eq!(soft, hard);
        assert!(open_files_in_use().unwrap() > 0);
    }

    #[test]
    fn a_limit_is_short_for_a_mesh_bigger_than_it_leaves_room_for() {
        let f = OpenFiles {
            limit: 1024,
            was: 1024,
        };
        assert_eq!(f.members(), 1024 - FILES_BASE);
        assert!(!f.short_for(900));
        assert!(f.short_for(1000));
    }

    #[test]
    fn a_throttled_line_is_said_once_per_period_with_the_count_held_back() {
        let mut t = Throttle::new(Duration::from_secs(10));
        let t0 = Instant::now();
        assert_eq!(t.line(1, t0, "a").as_deref(), Some("a"));
        assert_eq!(t.line(1, t0 + Duration::from_secs(1), "a"), None);
        assert_eq!(t.line(1, t0 + Duration::from_secs(2), "a"), None);
        // Another kind is its own.
        assert_eq!(t.line(2, t0, "b").as_deref(), Some("b"));
        assert_eq!(
            t.line(1, t0 + Duration::from_secs(11), "a").as_deref(),
            Some("a (and 2 more like it since)")
        );
    }

    #[test]
    fn emfile_and_enfile_are_out_of_files() {
        assert!(out_of_files(&io::Error::from_raw_os_error(
            nix::libc::EMFILE
        )));
        assert!(out_of_files(&io::Error::from_raw_os_error(
            nix::libc::ENFILE
        )));
        assert!(!out_of_files(&io::Error::from_raw_os_error(
            nix::libc::ECONNREFUSED
        )));
        // As the transport hands it on: wrapped.
        let wrapped = io::Error::other(io::Error::from_raw_os_error(nix::libc::EMFILE));
        assert!(out_of_files(&wrapped));
    }
}
