//! Inputs and outputs: inputs hashed, served and fetched into this node's cache; outputs listed by hash, kept for the farm's home, and pulled home.
//!
//! Files move between nodes by blake3 hash, one stream a file, checked
//! piece by piece as they come (see `transfer.rs`).

use std::collections::HashSet;
use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use mesh_protocol::farm::{path_stays_inside, FarmDef, TaskRef};
use mesh_protocol::mesh::{FarmId, FarmSpec, InputFile, NodeId, OutputFile};

use super::transfer::{self, hash_file, keep_pieces, Fetch, FetchError, Fetching, Transfers};
use super::{Farms, Runs};
use crate::mesh_node::{Event, LoopHandle};
use crate::results::walk;

impl Runs {
    pub(in crate::mesh_node) fn serve_inputs(&mut self, spec: &FarmSpec) {
        let root = PathBuf::from(&spec.def.root);
        for i in &spec.inputs {
            self.transfers.serve_file(i.hash, root.join(&i.path));
        }
    }

    /// Nodes to ask for a farm's files, in order: its submitter, the
    /// coordinator (which keeps a copy), then every other member.
    pub(in crate::mesh_node) fn sources(&self, farm: FarmId, farms: &dyn Farms) -> Vec<NodeId> {
        let mut v: Vec<NodeId> = farms.spec(farm).map(|s| s.origin).into_iter().collect();
        v.extend(farms.coordinator());
        v.extend(farms.member_ids());
        let mut seen = HashSet::new();
        v.retain(|n| *n != self.me && seen.insert(*n));
        v
    }

    /// Brings every input of a farm this node keeps a copy of into its cache.
    pub(in crate::mesh_node) fn fetch_inputs(&mut self, farm: FarmId, farms: &dyn Farms) {
        let Some(spec) = farms.spec(farm).cloned() else {
            return;
        };
        let sources = self.sources(farm, farms);
        let cache = self.state.join("cache");
        let handle = self.handle.clone();
        let t = self.transfers.clone();
        tokio::spawn(async move {
            let mut r = Ok(());
            for i in &spec.inputs {
                let hex = blake3::Hash::from(i.hash).to_hex().to_string();
                let cached = cache.join(&hex);
                if cached.is_file() {
                    continue;
                }
                if let Err(e) = fetch_any(&t, &handle, &sources, farm, i.hash, &cached).await {
                    r = Err(FetchError::Input {
                        path: i.path.clone(),
                        source: Box::new(e),
                    });
                    break;
                }
            }
            let _ = handle.tell(Event::InputsFetched(farm, r)).await;
        });
    }

    /// Brings a task's outputs home from the node that keeps them.
    pub(in crate::mesh_node) fn fetch_outputs(
        &mut self,
        farm: FarmId,
        task: TaskRef,
        from: NodeId,
        outputs: Arc<[OutputFile]>,
        farms: &dyn Farms,
    ) {
        let dir = farms.replica(farm).map(|r| {
            let stage = &r.spec.def.stage(task).name;
            PathBuf::from(r.out_dir())
                .join(stage)
                .join(task.index.to_string())
        });
        if !self.transfers.begin_task(farm, task) {
            // Asked again while it comes: the transfer under way answers.
            return;
        }
        let handle = self.handle.clone();
        let t = self.transfers.clone();
        // Run here before this node was the home: kept apart, in `kept`.
        let held = (from == self.me).then(|| crate::state::kept_dir(&self.state, farm));
        tokio::spawn(async move {
            let r = match (dir, held) {
                (None, _) => Err(FetchError::UnknownFarm),
                (Some(dir), Some(held)) => {
                    tokio::task::spawn_blocking(move || place_kept(&held, &dir, &outputs))
                        .await
                        .unwrap_or_else(|e| Err(e.into()))
                }
                (Some(dir), None) => fetch_all(&t, &handle, from, farm, &dir, &outputs).await,
            };
            t.end_task(farm, task);
            let _ = handle.tell(Event::Fetched(farm, task, r)).await;
        });
    }
}

/// The farm's input at `path`, as its submitter listed it.
pub(in crate::mesh_node) fn input_file<'a>(
    spec: &'a FarmSpec,
    path: &str,
) -> Option<&'a InputFile> {
    spec.inputs.iter().find(|i| i.path == path)
}

pub(in crate::mesh_node) fn input_hash(spec: &FarmSpec, path: &str) -> [u8; 32] {
    input_file(spec, path).map(|i| i.hash).unwrap_or([0; 32])
}

/// Why a farm could not be submitted from this node.
#[derive(Debug, thiserror::Error)]
pub(in crate::mesh_node) enum SubmitError {
    /// Submitted from another machine (`mesh --mesh ADDR submit`): the
    /// farm's files are read here, and its outputs written here.
    #[error("this node cannot see the farm's folder {}: a farm submitted from another machine must be in a folder the node shares (on a cluster, the home or project file system)", .0.display())]
    Unseen(PathBuf),
    #[error("input {}: {source}", .path.display())]
    Input { path: PathBuf, source: io::Error },
    #[error("the operating system gave no random bytes for the farm's id: {0}")]
    Random(rand::rngs::SysError),
}

/// The farm as it travels: every input file the farm names, hashed.
pub(in crate::mesh_node) fn make_spec(
    def: FarmDef,
    file: &str,
    origin: NodeId,
) -> Result<FarmSpec, SubmitError> {
    let root = PathBuf::from(&def.root);
    if !root.is_dir() {
        return Err(SubmitError::Unseen(root));
    }
    let inputs = hash_inputs(&def, 0, &mut HashSet::new())?;
    let id = new_farm_id(origin, file)?;
    Ok(FarmSpec {
        id,
        origin,
        def: Arc::new(def),
        inputs,
        submitted_ms: crate::state::unix_ms(),
        gen: 0,
        open: false,
    })
}

/// The input files the stages of `def` from stage `from` on name, each
/// once (`seen`: those listed already), hashed.
pub(in crate::mesh_node) fn hash_inputs(
    def: &FarmDef,
    from: usize,
    seen: &mut HashSet<String>,
) -> Result<Vec<InputFile>, SubmitError> {
    let mut inputs = Vec::new();
    let root = PathBuf::from(&def.root);
    for (s, stage) in mesh_protocol::farm::from_on(&def.stages, from) {
        if stage.inputs.is_empty() {
            continue;
        }
        for i in 0..stage.len() {
            for input in def.expand(TaskRef::new(s as u32, i)).inputs {
                if !seen.insert(input.clone()) {
                    continue;
                }
                let path = root.join(&input);
                let unread = |source| SubmitError::Input {
                    path: path.clone(),
                    source,
                };
                let mut f = fs::File::open(&path).map_err(unread)?;
                let mode = f.metadata().map(|m| mode_of(&m)).map_err(unread)?;
                let mut h = blake3::Hasher::new();
                h.update_reader(&mut f).map_err(unread)?;
                inputs.push(InputFile {
                    path: input,
                    hash: *h.finalize().as_bytes(),
                    mode,
                });
            }
        }
    }
    Ok(inputs)
}

/// A farm id of its own for every submission. The origin, the file and the
/// clock alone collided: a loop of Python maps of one name, or parallel
/// submissions of one file, land in the same millisecond with the same
/// synthetic path, and a second farm of an id already held was taken for the
/// first. So the id draws 128 bits from the operating system as well; the
/// rest only makes an id easier to tell apart when read.
fn new_farm_id(origin: NodeId, file: &str) -> Result<FarmId, SubmitError> {
    use rand::TryRng;
    let mut nonce = [0u8; 16];
    rand::rngs::SysRng
        .try_fill_bytes(&mut nonce)
        .map_err(SubmitError::Random)?;
    let mut h = blake3::Hasher::new();
    h.update(&origin.0.to_be_bytes());
    h.update(file.as_bytes());
    h.update(&crate::state::unix_ms().to_be_bytes());
    h.update(&nonce);
    Ok(FarmId(u64::from_be_bytes(
        h.finalize().as_bytes()[..8].try_into().expect("8 bytes"),
    )))
}

/// Why a task's outputs were not listed or kept (the task fails with it).
#[derive(Debug, thiserror::Error)]
pub(in crate::mesh_node) enum KeepError {
    #[error("cannot list outputs: {0}")]
    List(io::Error),
    #[error("{}: {source}", .path.display())]
    Read { path: PathBuf, source: io::Error },
    #[error("cannot create {}: {source}", .path.display())]
    Create { path: PathBuf, source: io::Error },
    #[error("cannot keep {}: {source}", .path.display())]
    Keep { path: PathBuf, source: io::Error },
}

/// Every file under `dir` with its blake3 hash and size.
pub(in crate::mesh_node) fn manifest(dir: &Path) -> Result<Vec<OutputFile>, KeepError> {
    Ok(hashed(dir)?.into_iter().map(|(o, _)| o).collect())
}

/// Every file under `dir` with its blake3 hash and size, and its pieces.
fn hashed(dir: &Path) -> Result<Vec<(OutputFile, mesh_protocol::pieces::Pieces)>, KeepError> {
    let mut files = Vec::new();
    walk(dir, dir, &mut files).map_err(KeepError::List)?;
    let mut out = Vec::new();
    for (rel, path) in files {
        let unread = |source| KeepError::Read {
            path: path.clone(),
            source,
        };
        let (hash, pieces) = hash_file(&path).map_err(unread)?;
        let size = pieces.size;
        let mode = fs::metadata(&path).map(|m| mode_of(&m)).map_err(unread)?;
        out.push((
            OutputFile {
                path: rel,
                hash,
                size,
                mode,
                data: None,
            },
            pieces,
        ));
    }
    Ok(out)
}

/// The farms this node keeps outputs of, and their folders
/// (`<state>/kept/<farm>/`, one file per output, named by its hash).
pub(in crate::mesh_node) fn kept_farms(state: &Path) -> Vec<(FarmId, PathBuf)> {
    let Ok(dirs) = fs::read_dir(state.join(crate::state::KEPT_DIR)) else {
        return Vec::new();
    };
    dirs.flatten()
        .filter_map(|d| {
            let farm = u64::from_str_radix(d.file_name().to_str()?, 16).ok()?;
            Some((FarmId(farm), d.path()))
        })
        .collect()
}

/// Bytes of the files in `dir` (a farm's kept outputs).
pub(in crate::mesh_node) fn kept_bytes(dir: &Path) -> u64 {
    fs::read_dir(dir)
        .map(|files| {
            files
                .flatten()
                .filter_map(|f| f.metadata().ok())
                .filter(|m| m.is_file())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

/// Moves every file under `dir` into `kept` under its blake3 hash; the manifest.
/// Their pieces are written down beside them, for the transfer home.
pub(in crate::mesh_node) fn keep_outputs(
    dir: &Path,
    held: &Path,
) -> Result<Vec<OutputFile>, KeepError> {
    let files = hashed(dir)?;
    fs::create_dir_all(held).map_err(|source| KeepError::Create {
        path: held.to_path_buf(),
        source,
    })?;
    for (f, pieces) in &files {
        let path = dir.join(&f.path);
        let target = held.join(blake3::Hash::from(f.hash).to_hex().as_str());
        if !target.is_file() {
            fs::rename(&path, &target)
                .or_else(|_| fs::copy(&path, &target).map(|_| ()))
                .map_err(|source| KeepError::Keep {
                    path: path.clone(),
                    source,
                })?;
            keep_pieces(&target, pieces);
        }
    }
    Ok(files.into_iter().map(|(o, _)| o).collect())
}

/// Brings every output of a task from `from` into `dir`, each checked by hash.
async fn fetch_all(
    t: &Arc<Transfers>,
    handle: &LoopHandle,
    from: NodeId,
    farm: FarmId,
    dir: &Path,
    outputs: &[OutputFile],
) -> Result<(), FetchError> {
    // One that rode with the log is no file to bring.
    for o in outputs.iter().filter(|o| !o.rides()) {
        let (d, o2) = (dir.to_path_buf(), o.clone());
        let needed = tokio::task::spawn_blocking(move || output_needed(&d, &o2)).await??;
        if let Some(dest) = needed {
            let f = Fetch {
                from,
                farm,
                hash: o.hash,
                dest: &dest,
                mode: o.mode,
                what: Fetching::Home,
            };
            let got = transfer::fetch(t, handle, f).await?;
            set_mode(&dest, o.mode)?;
            tracing::debug!(%farm, path = %o.path, ?got, "output home");
        }
    }
    let (d, outputs) = (dir.to_path_buf(), outputs.to_vec());
    tokio::task::spawn_blocking(move || only_outputs(&d, &outputs)).await?
}

/// Leaves in a task's folder under `{out}` what its run made and nothing
/// else: a file an earlier run of it left there goes (see `results::prune`).
pub(in crate::mesh_node) fn only_outputs(
    dir: &Path,
    outputs: &[OutputFile],
) -> Result<(), FetchError> {
    let keep = outputs.iter().map(|o| o.path.as_str()).collect();
    crate::results::prune(dir, &keep).map_err(FetchError::io(FetchError::Place, dir))
}

/// Where output `o` goes under `dir`, unless it is there already.
fn output_needed(dir: &Path, o: &OutputFile) -> Result<Option<PathBuf>, FetchError> {
    if !path_stays_inside(&o.path) {
        return Err(FetchError::Leaves(o.path.clone()));
    }
    let dest = dir.join(&o.path);
    if dest.is_file() && file_hash(&dest).ok() == Some(o.hash) {
        set_mode(&dest, o.mode)?;
        return Ok(None);
    }
    Ok(Some(dest))
}

/// Puts outputs this node keeps in `kept` into `dir` (those already there, checked, stay).
fn place_kept(held: &Path, dir: &Path, outputs: &[OutputFile]) -> Result<(), FetchError> {
    for o in outputs.iter().filter(|o| !o.rides()) {
        let Some(dest) = output_needed(dir, o)? else {
            continue;
        };
        let src = held.join(blake3::Hash::from(o.hash).to_hex().as_str());
        if !src.is_file() {
            return Err(FetchError::Missing);
        }
        if let Some(d) = dest.parent() {
            fs::create_dir_all(d).map_err(FetchError::io(FetchError::Create, d))?;
        }
        crate::results::put_as(&src, &dest, o.mode)
            .map_err(FetchError::io(FetchError::Place, &dest))?;
    }
    only_outputs(dir, outputs)
}

/// A file's permission bits, as they travel (see `InputFile::mode`).
fn mode_of(m: &fs::Metadata) -> u32 {
    m.permissions().mode() & 0o7777
}

/// Gives `path` the permission bits it had where it was made (0: unknown, left as it is).
fn set_mode(path: &Path, mode: u32) -> Result<(), FetchError> {
    if mode == 0 {
        return Ok(());
    }
    let now = fs::metadata(path).map_err(FetchError::io(FetchError::Stat, path))?;
    if mode_of(&now) != mode {
        fs::set_permissions(path, fs::Permissions::from_mode(mode))
            .map_err(FetchError::io(FetchError::Mode, path))?;
    }
    Ok(())
}

pub(in crate::mesh_node) fn file_hash(path: &Path) -> io::Result<[u8; 32]> {
    let mut h = blake3::Hasher::new();
    h.update_reader(fs::File::open(path)?)?;
    Ok(*h.finalize().as_bytes())
}

/// How long a node keeps asking for an input no source could give yet.
const INPUT_WAIT: Duration = Duration::from_secs(60);

/// Where the inputs of a farm's tasks come from on a node that is not
/// its home: the first of the nodes that has each, by way of this node's
/// cache.
#[derive(Clone, Copy)]
pub(in crate::mesh_node) struct InputSources<'a> {
    pub(in crate::mesh_node) farm: FarmId,
    pub(in crate::mesh_node) nodes: &'a [NodeId],
    pub(in crate::mesh_node) cache: &'a Path,
}

/// Puts the input of `hash` at `dest` with `mode`, from this node's cache
/// or fetched once from the first of its sources that has it.
pub(in crate::mesh_node) async fn fetch_input(
    t: &Arc<Transfers>,
    handle: &LoopHandle,
    from: &InputSources<'_>,
    hash: [u8; 32],
    mode: u32,
    dest: &Path,
) -> Result<(), FetchError> {
    let InputSources {
        farm,
        nodes: sources,
        cache,
    } = *from;
    let hex = blake3::Hash::from(hash).to_hex().to_string();
    let cached = cache.join(&hex);
    // A node that just got its first task of a farm may not know the
    // submitter as a member yet (membership is still spreading on a busy
    // machine), and the coordinator's copy may still be on its way: asked
    // again for a while before the task fails for it.
    let until = tokio::time::Instant::now() + INPUT_WAIT;
    let mut pause = Duration::from_millis(250);
    while !cached.is_file() {
        match fetch_any(t, handle, sources, farm, hash, &cached).await {
            Ok(()) => break,
            Err(e) if tokio::time::Instant::now() + pause >= until => return Err(e),
            Err(e) => {
                tracing::debug!("input {hex} not fetched yet ({e}); again in {pause:?}");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(5));
            }
        }
    }
    let dest = dest.to_path_buf();
    tokio::task::spawn_blocking(move || put_input(&cached, &dest, hash, mode)).await?
}

/// Puts the input of hash `hash` at `dest` unless the file there is it
/// already: a farm's folder on a node is shared by its tasks, and a file
/// another task left at that path (an earlier version of the input, a
/// Snakemake job's output of the same name) is not the input asked for.
/// A copy of its own (see `results::put`), never a link to the cached
/// file, which a task or a user writing to `dest` would change under its
/// hash for every later farm that takes it.
fn put_input(cached: &Path, dest: &Path, hash: [u8; 32], mode: u32) -> Result<(), FetchError> {
    if placed::holds(dest, &hash) {
        return set_mode(dest, mode);
    }
    if let Some(dir) = dest.parent() {
        fs::create_dir_all(dir).map_err(FetchError::io(FetchError::Create, dir))?;
    }
    replace_with(cached, dest, mode)?;
    placed::note(dest, hash);
    Ok(())
}

/// What this node put where, by hash, so that a file is hashed again only
/// when it changed (its inode, size or time), not for every task reading it.
mod placed {
    use std::collections::HashMap;
    use std::os::unix::fs::MetadataExt as _;
    use std::path::{Path, PathBuf};
    use std::sync::{Mutex, OnceLock};

    /// Files remembered, at most: past it the memo starts again.
    const MAX: usize = 65_536;

    type Seen = (u64, u64, u64, i64, i64);
    type Memo = HashMap<PathBuf, (Seen, [u8; 32])>;
    static MEMO: OnceLock<Mutex<Memo>> = OnceLock::new();

    fn seen(path: &Path) -> Option<Seen> {
        let m = std::fs::metadata(path).ok().filter(|m| m.is_file())?;
        Some((m.dev(), m.ino(), m.size(), m.mtime(), m.mtime_nsec()))
    }

    fn memo() -> std::sync::MutexGuard<'static, Memo> {
        MEMO.get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the file at `path` has the contents of `hash`.
    pub(in crate::mesh_node) fn holds(path: &Path, hash: &[u8; 32]) -> bool {
        let Some(now) = seen(path) else {
            return false;
        };
        if let Some((was, h)) = memo().get(path) {
            if *was == now {
                return h == hash;
            }
        }
        let Ok(h) = super::file_hash(path) else {
            return false;
        };
        remember(path, now, h);
        h == *hash
    }

    /// `path` was just given the contents of `hash`.
    pub(in crate::mesh_node) fn note(path: &Path, hash: [u8; 32]) {
        if let Some(now) = seen(path) {
            remember(path, now, hash);
        }
    }

    fn remember(path: &Path, now: Seen, hash: [u8; 32]) {
        let mut m = memo();
        if m.len() >= MAX {
            m.clear();
        }
        m.insert(path.to_path_buf(), (now, hash));
    }
}

/// Puts an output whose bytes rode with the log (see
/// [`OutputFile::rides`]) at `dest` as a file, for a task that reads it:
/// left as it is when the file there has its hash, else replaced whole.
pub(in crate::mesh_node) fn place_riding(o: &OutputFile, dest: &Path) -> Result<(), FetchError> {
    let Some(data) = &o.data else {
        return Ok(());
    };
    // Its name came in a peer's report.
    if !path_stays_inside(&o.path) {
        return Err(FetchError::Leaves(o.path.clone()));
    }
    if !file_hash(dest).is_ok_and(|h| h == o.hash) {
        return crate::results::put_bytes(data, dest, o.mode)
            .map_err(FetchError::io(FetchError::Place, dest));
    }
    set_mode(dest, o.mode)
}

/// Puts a copy of `cached` at `dest` with `mode`, replacing what is there
/// whole (see `results::put`).
pub(in crate::mesh_node) fn replace_with(
    cached: &Path,
    dest: &Path,
    mode: u32,
) -> Result<(), FetchError> {
    crate::results::put_as(cached, dest, mode).map_err(FetchError::io(FetchError::Place, dest))
}

/// Fetches a file by its blake3 hash from the first of `sources` that has
/// it, into this node's cache (its pieces kept beside it, to serve it on).
pub(in crate::mesh_node) async fn fetch_any(
    t: &Arc<Transfers>,
    handle: &LoopHandle,
    sources: &[NodeId],
    farm: FarmId,
    hash: [u8; 32],
    dest: &Path,
) -> Result<(), FetchError> {
    let mut why = Vec::new();
    for from in sources {
        let f = Fetch {
            from: *from,
            farm,
            hash,
            dest,
            mode: 0,
            what: Fetching::Cached,
        };
        match transfer::fetch(t, handle, f).await {
            Ok(_) => return Ok(()),
            Err(e) => why.push((*from, e)),
        }
    }
    if why.is_empty() {
        return Err(FetchError::NoSource);
    }
    Err(FetchError::NoneGave(why))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt as _;

    #[test]
    fn an_input_replaces_what_another_task_left_at_its_path() {
        let d = tempfile::tempdir().expect("temp dir");
        let cached = d.path().join("cached");
        fs::write(&cached, b"the input, as submitted").expect("write");
        let hash = file_hash(&cached).expect("hash");
        let dest = d.path().join("root/data/a.txt");
        fs::create_dir_all(dest.parent().expect("parent")).expect("mkdir");
        // An earlier version of it, left by another task of the farm.
        fs::write(&dest, b"an older a.txt").expect("write");
        put_input(&cached, &dest, hash, 0o644).expect("placed");
        assert_eq!(fs::read(&dest).expect("read"), b"the input, as submitted");
        // In place already: left as it is (same inode).
        let ino = fs::metadata(&dest).expect("meta").ino();
        put_input(&cached, &dest, hash, 0o644).expect("placed");
        assert_eq!(fs::metadata(&dest).expect("meta").ino(), ino);
        // Changed under it since: put again.
        fs::write(&dest, b"written over by a task").expect("write");
        put_input(&cached, &dest, hash, 0o644).expect("placed");
        assert_eq!(fs::read(&dest).expect("read"), b"the input, as submitted");
    }
}
