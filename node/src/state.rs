//! The state folder: one subfolder per farm with its database, logs and a status snapshot.
//!
//! ```text
//! <state>/farms/<farm-id>/db/            sled: definition, task records, key cache, journal
//! <state>/farms/<farm-id>/status.json    snapshot for `mesh list` / `mesh status` while it runs
//! <state>/farms/<farm-id>/logs/<stage>/<index>.<attempt>.{out,err}
//! ```
//!
//! A farm's id is its name and a hash of its file's canonical path, so running
//! the same farm file again finds its earlier runs (and their key cache).
//! The database is locked by the process running the farm; readers use the
//! snapshot then, and the database itself once the farm is not running.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use mesh_protocol::engine::Counts;
use serde::{Deserialize, Serialize};

use mesh_store::FarmKey;

/// The failed tasks a snapshot lists, at most.
pub const SNAPSHOT_FAILED_MAX: usize = 20;

/// A mesh node's folder of outputs it made for farms homed elsewhere,
/// kept by hash until their home has them.
pub const KEPT_DIR: &str = "kept";

/// Where a node keeps its outputs of `farm` for the farm's home.
pub fn kept_dir(state: &Path, farm: mesh_protocol::mesh::FarmId) -> PathBuf {
    state.join(KEPT_DIR).join(farm.to_string())
}

/// Where `KEPT_DIR` was before it had one meaning ("held" was also a
/// farm's copies, claimed tasks and unacknowledged reports).
const KEPT_DIR_BEFORE: &str = "held";

/// Moves a state folder's kept outputs from where an older node kept
/// them, so that none is lost (and run again) across the upgrade.
pub fn move_kept_outputs(state: &std::path::Path) -> std::io::Result<()> {
    let before = state.join(KEPT_DIR_BEFORE);
    let now = state.join(KEPT_DIR);
    if before.is_dir() && !now.exists() {
        std::fs::rename(before, now)?;
    }
    Ok(())
}

#[derive(Clone, Debug)]
pub struct StateDir {
    root: PathBuf,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RunState {
    Running,
    /// Every task succeeded.
    Done,
    /// Finished, some tasks failed.
    Failed,
    /// Stopped by Ctrl-C or SIGTERM; resumable.
    Interrupted,
    /// The process running it died (kill -9, power loss); resumable.
    Crashed,
    /// Over, with a stage stopped because its first tasks all failed the
    /// same way (`max_fails`); resumable once the cause is fixed.
    Stopped,
}

impl RunState {
    pub fn is_finished(self) -> bool {
        matches!(self, RunState::Done | RunState::Failed)
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StageStatus {
    pub name: String,
    pub counts: Counts,
    /// Why the stage stopped (`max_fails`), while it is stopped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FailedTask {
    pub task: String,
    pub attempt: u32,
    pub reason: String,
}

/// What `mesh list` and `mesh status` show of a farm.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FarmStatus {
    pub id: String,
    pub name: String,
    /// The farm file it was started from.
    pub file: String,
    pub out: String,
    pub run: u32,
    pub state: RunState,
    pub pid: u32,
    pub host: String,
    pub started_at_ms: u64,
    pub updated_at_ms: u64,
    pub elapsed_ms: u64,
    pub counts: Counts,
    pub stages: Vec<StageStatus>,
    pub failed: Vec<FailedTask>,
    /// When it will end, as a quick simulation of what is left says (see
    /// `eta.rs`); none before a task has finished, or once it has ended.
    #[serde(default)]
    pub eta: Option<crate::eta::Eta>,
    /// The estimates of its end so far, oldest first (for `mesh report`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub eta_history: Vec<crate::eta::Estimated>,
    /// What each stage's finished tasks used (see `used.rs`), read from
    /// the store by `mesh status` once the run is over.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub used: Vec<crate::used::StageUse>,
}

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("no farm matches `{0}` (see `mesh list`)")]
    NoMatch(String),
    #[error("`{query}` matches several farms: {ids} (give more of the id)")]
    Ambiguous { query: String, ids: String },
    #[error("no farm has run in {0} yet (start one with `mesh run farm.toml`)")]
    Empty(String),
    /// Nothing ran, and no mesh can run there: a `mesh node` started
    /// without `mesh init` exits at once, saying why in its own output.
    #[error("no farm has run in {0} yet, and no mesh node runs there: it has no mesh.key (`mesh init` makes one for a new mesh, then `mesh node`; or `mesh run farm.toml` runs a farm alone)")]
    NoMesh(String),
    #[error(
        "no unfinished farm to resume (see `mesh list`; `mesh resume FARM` resumes a given one)"
    )]
    NothingToResume,
    /// Unfinished farms there are, of farm files in other folders.
    #[error(
        "no unfinished farm of a farm file in {folder}; elsewhere: {ids} (`mesh resume FARM` resumes one of them)"
    )]
    NoneHere { folder: String, ids: String },
    #[error(
        "no unfinished farm to resume; farm {id} finished with {failed} failed tasks: `mesh resume {id} --retry-failed` runs them again"
    )]
    OnlyFailed { id: String, failed: u64 },
    #[error("cannot read the state folder {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: io::Error,
    },
}

impl StateDir {
    pub fn new(root: impl Into<PathBuf>) -> StateDir {
        StateDir { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn farm_dir(&self, id: &str) -> PathBuf {
        self.root.join("farms").join(id)
    }

    pub fn db_path(&self, id: &str) -> PathBuf {
        self.farm_dir(id).join("db")
    }

    pub fn logs_dir(&self, id: &str) -> PathBuf {
        self.farm_dir(id).join("logs")
    }

    fn status_path(&self, id: &str) -> PathBuf {
        self.farm_dir(id).join("status.json")
    }

    /// Writes the snapshot atomically (a reader never sees half of it).
    pub fn write_status(&self, s: &FarmStatus) -> io::Result<()> {
        let bytes = serde_json::to_vec_pretty(s).map_err(io::Error::other)?;
        write_atomic(&self.status_path(&s.id), |w| w.write_all(&bytes))
    }

    /// The snapshot, with a `running` farm whose process is gone shown as crashed.
    pub fn read_status(&self, id: &str) -> Option<FarmStatus> {
        let bytes = fs::read(self.status_path(id)).ok()?;
        let mut s: FarmStatus = serde_json::from_slice(&bytes).ok()?;
        if s.state == RunState::Running && s.host == hostname() && !pid_alive(s.pid) {
            s.state = RunState::Crashed;
        }
        Some(s)
    }

    /// Every farm with a snapshot, most recently updated first.
    pub fn list(&self) -> Result<Vec<FarmStatus>, StateError> {
        let dir = self.root.join("farms");
        let entries = match fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(source) => {
                return Err(StateError::Io {
                    path: dir.display().to_string(),
                    source,
                })
            }
        };
        let mut out: Vec<FarmStatus> = entries
            .filter_map(Result::ok)
            .filter_map(|e| self.read_status(&e.file_name().to_string_lossy()))
            .collect();
        out.sort_by(|a, b| b.updated_at_ms.cmp(&a.updated_at_ms).then(a.id.cmp(&b.id)));
        Ok(out)
    }

    /// Finds a farm by exact id, id prefix or name; `None` is the most recent.
    pub fn find(&self, query: Option<&str>) -> Result<FarmStatus, StateError> {
        let all = self.list()?;
        let Some(q) = query else {
            return all.into_iter().next().ok_or_else(|| {
                let root = self.root.display().to_string();
                if self.root.join(crate::keys::PSK_FILE).exists() {
                    StateError::Empty(root)
                } else {
                    StateError::NoMesh(root)
                }
            });
        };
        if let Some(s) = all.iter().find(|s| s.id == q) {
            return Ok(s.clone());
        }
        // A name several farms share (files of one name in several folders)
        // means the most recent, whatever other ids it begins: `all` is
        // newest first.
        if let Some(s) = all.iter().find(|s| s.name == q) {
            return Ok(s.clone());
        }
        let hits: Vec<&FarmStatus> = all.iter().filter(|s| s.id.starts_with(q)).collect();
        match hits.as_slice() {
            [] => Err(StateError::NoMatch(q.to_string())),
            [one] => Ok((*one).clone()),
            many => Err(StateError::Ambiguous {
                query: q.to_string(),
                ids: many
                    .iter()
                    .map(|s| s.id.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            }),
        }
    }

    /// The farm `mesh resume` continues by default: the most recent one of
    /// a farm file in `folder` (the command's own folder) that stopped
    /// unfinished, a stage stopped included (or, with `failed_too`, that
    /// ended with failures). A farm of another folder is never taken
    /// unasked: it is named, for `mesh resume FARM`.
    pub fn most_recent_resumable(
        &self,
        failed_too: bool,
        folder: &Path,
    ) -> Result<FarmStatus, StateError> {
        let all = self.list()?;
        let here = |s: &&FarmStatus| Path::new(&s.file).parent() == Some(folder);
        let resumable = |s: &&FarmStatus| {
            matches!(
                s.state,
                RunState::Interrupted | RunState::Crashed | RunState::Stopped
            ) || (failed_too && s.state == RunState::Failed)
        };
        if let Some(s) = all.iter().filter(here).find(resumable) {
            return Ok(s.clone());
        }
        if let Some(f) = all
            .iter()
            .filter(here)
            .find(|s| s.state == RunState::Failed)
        {
            return Err(StateError::OnlyFailed {
                id: f.id.clone(),
                failed: f.counts.failed,
            });
        }
        let elsewhere: Vec<&str> = all
            .iter()
            .filter(resumable)
            .map(|s| s.id.as_str())
            .collect();
        if elsewhere.is_empty() {
            return Err(StateError::NothingToResume);
        }
        Err(StateError::NoneHere {
            folder: folder.display().to_string(),
            ids: elsewhere.join(", "),
        })
    }
}

/// A farm's id and store key from its name and the canonical path of its file.
pub fn farm_identity(name: &str, canonical_file: &Path) -> (String, FarmKey) {
    let h = blake3::hash(canonical_file.to_string_lossy().as_bytes());
    let id = format!("{name}-{}", &h.to_hex()[..8]);
    let key = farm_key(&id);
    (id, key)
}

/// The store key of the farm with this id.
pub fn farm_key(id: &str) -> FarmKey {
    let h = blake3::hash(id.as_bytes());
    FarmKey(u64::from_be_bytes(
        h.as_bytes()[..8].try_into().expect("32-byte hash"),
    ))
}

pub fn hostname() -> String {
    nix::unistd::gethostname()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_default()
}

pub(crate) fn pid_alive(pid: u32) -> bool {
    // Signal 0 checks existence; EPERM means it exists under another user.
    let exists = match nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), None) {
        Ok(()) => true,
        Err(e) => e == nix::errno::Errno::EPERM,
    };
    // A killed process is a zombie until its parent reaps it, which a
    // shell or a test may do a while later: it answers signal 0, but its
    // farm is as crashed as it will ever be.
    exists && !is_zombie(pid)
}

/// Whether /proc says `pid` has exited and waits to be reaped (state Z or
/// X); false where /proc cannot tell.
fn is_zombie(pid: u32) -> bool {
    let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // The command name, in parentheses, may hold spaces: the state follows
    // the last parenthesis.
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .is_some_and(|state| matches!(state, "Z" | "X" | "x"))
}

/// Wall-clock milliseconds since the Unix epoch.
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Writes a file whole or not at all: into a temporary file beside it,
/// on the disk (fsync), then named, so that neither a reader nor a crash
/// ever finds half of it, or, after a power cut, an empty file by its name.
pub fn write_atomic(
    path: &Path,
    write: impl FnOnce(&mut io::BufWriter<&fs::File>) -> io::Result<()>,
) -> io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    remove_stale_puts_of(dir, &name)?;
    // As a file made with the usual umask would be, not tempfile's 0600:
    // a farm's tables and snapshots are read by the user's group too. Named
    // as `results::put` names its copies, so that one a killed process left
    // is known as unfinished, passed over by a walk and swept when the file
    // is written next (a random `.tmpXXXX` stayed among the outputs).
    let tmp = tempfile::Builder::new()
        .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o644))
        .prefix(&format!(".{name}.{}.", std::process::id()))
        .suffix(PUT_SUFFIX)
        .tempfile_in(dir)?;
    let mut w = io::BufWriter::new(tmp.as_file());
    write(&mut w)?;
    w.flush()?;
    drop(w);
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

/// How a copy that `results::put` or [`write_atomic`] is making ends its
/// name until it is renamed: `.<name>.<pid>.<n>.mesh-put`.
pub(crate) const PUT_SUFFIX: &str = ".mesh-put";

/// Removes the copies of `dir/name` that a process now gone began and never
/// renamed: [`write_atomic`] calls it before it writes a
/// file again (a stage's manifest, a farm's snapshot), so a kill mid-write
/// leaves nothing behind once the file is written next.
pub(crate) fn remove_stale_puts_of(dir: &Path, name: &str) -> io::Result<()> {
    let prefix = format!(".{name}.");
    for e in fs::read_dir(dir)? {
        let e = e?;
        if e.file_name().to_string_lossy().starts_with(&prefix) && !e.file_type()?.is_dir() {
            remove_if_stale_put(&e)?;
        }
    }
    Ok(())
}

/// Removes `e` if it is such a copy and the process making it is gone;
/// a live process's copy is still coming.
pub(crate) fn remove_if_stale_put(e: &fs::DirEntry) -> io::Result<()> {
    let name = e.file_name();
    let name = name.to_string_lossy();
    let Some(rest) = name.strip_suffix(PUT_SUFFIX) else {
        return Ok(());
    };
    // `.<name>.<pid>.<n>.mesh-put`
    let pid = rest.rsplit('.').nth(1).and_then(|p| p.parse::<u32>().ok());
    let gone = pid.is_some_and(|p| {
        p != std::process::id() && (p == 0 || p > i32::MAX as u32 || !pid_alive(p))
    });
    if !gone {
        return Ok(());
    }
    match fs::remove_file(e.path()) {
        Err(err) if err.kind() != io::ErrorKind::NotFound => Err(err),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_outputs_of_an_older_node_move_to_their_folder_and_a_newer_folder_is_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path();
        std::fs::create_dir_all(state.join("held/farm")).unwrap();
        std::fs::write(state.join("held/farm/abc"), b"output").unwrap();
        move_kept_outputs(state).unwrap();
        assert_eq!(
            std::fs::read(state.join("kept/farm/abc")).unwrap(),
            b"output"
        );
        assert!(!state.join("held").exists());
        // Both there (an older node started on it again): nothing moves.
        std::fs::create_dir_all(state.join("held/other")).unwrap();
        move_kept_outputs(state).unwrap();
        assert!(state.join("held/other").is_dir());
        assert!(!state.join("kept/other").exists());
    }
}
