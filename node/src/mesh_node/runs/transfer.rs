//! Files between nodes: one stream a file ([`DATA_PROTOCOL`]), checked piece by piece and written to disk as it comes, taken up from the last verified piece after a cut.
//!
//! The receiver opens a stream and asks for a file by hash ([`DataAsk`]);
//! the sender answers with its size and its pieces' hashes ([`DataHead`],
//! see `mesh_protocol::pieces`), and where it keeps it when other nodes may
//! see that place (`--shared-fs`). The receiver takes it from there when it
//! sees it with the same hash (a hard link, else the file system's own
//! copy): no byte crosses the mesh. Otherwise it checks what it already
//! has of the file (`.<name>.part` beside where it goes, kept through a
//! kill of either side), says where to go on from ([`DataFrom`]), and
//! the bytes follow as one flow: read and written off the loop, in
//! blocks of [`BLOCK`] with at most [`BLOCKS_QUEUED`] waiting, so a
//! transfer holds about a megabyte, whatever the file's size.
//!
//! A stream of its own per file, on the connection the nodes already
//! have: yamux gives each stream a window that grows with what it carries
//! (up to 2x the bandwidth-delay product) and splits writes into 16 KiB
//! frames, so a peer's messages pass between a transfer's frames.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{AsyncReadExt, AsyncWriteExt, StreamExt};
use libp2p::{PeerId, StreamProtocol};
use mesh_protocol::farm::TaskRef;
use mesh_protocol::mesh::{FarmId, NodeId};
use mesh_protocol::pieces::{piece_count, Cv, PieceError, PieceHasher, Pieces};
use mesh_protocol::wire::{DataAsk, DataFrom, DataHead, Refusal, DATA_PROTOCOL};
use tokio::sync::{mpsc, watch, Semaphore};

use crate::mesh_node::{Event, LoopHandle};
use crate::net;

/// A node fetches at most this many files at once; the others wait their
/// turn (the link is full with fewer, and each holds its blocks).
const FETCHES_AT_ONCE: usize = 4;
/// A node sends at most this many files at once.
const SENDS_AT_ONCE: usize = 8;
/// Bytes read or written at a time.
const BLOCK: usize = 256 << 10;
/// Blocks waiting between the disk and the stream, each way.
const BLOCKS_QUEUED: usize = 4;
/// How long a stream may stay silent (no head, no bytes) before the
/// transfer is given up as cut (it goes on from there when asked again).
const SILENCE: Duration = Duration::from_secs(60);
/// How long a sender waits for the receiver to say where to go on from
/// (it reads back the part a cut transfer left first: gigabytes, at the
/// disk's speed).
const PART_CHECK_WAIT: Duration = Duration::from_secs(600);
/// How long opening a stream may take, dialling the node if need be.
const OPEN_TIMEOUT: Duration =
    Duration::from_secs(net::CONNECT_TIMEOUT.as_secs() + net::HANDSHAKE_TIMEOUT.as_secs());
/// A farm's home shows the bytes coming this often during a transfer.
const PROGRESS_EVERY: Duration = Duration::from_secs(1);
/// A stream reset before its head came (the sender's incoming streams
/// have one place: one that came meanwhile is dropped) is opened again.
const OPEN_TRIES: u32 = 6;

/// Why a file did not come. Only [`FetchError::Missing`] is final (the
/// home then has the task run again); the rest are asked again later.
/// Clone, as a second fetch of the same file shares the first's end;
/// hence the `Arc`s around errors that are not.
#[derive(Clone, Debug, thiserror::Error)]
pub(in crate::mesh_node) enum FetchError {
    /// The node asked (or this one, for what it ran itself) keeps no such file.
    #[error("no such file on this node")]
    Missing,
    #[error("cannot read {path}: {why}")]
    Unreadable { path: String, why: String },
    #[error("the node is stopping")]
    Stopping,
    #[error("node {0} is not a member this node knows")]
    NotMember(NodeId),
    #[error("no other node is connected")]
    NoSource,
    /// Every source was asked: each with why it gave nothing.
    #[error("no node could give it ({})", said(.0))]
    NoneGave(Vec<(NodeId, FetchError)>),
    #[error("the farm is unknown here")]
    UnknownFarm,
    #[error("no stream for the file: {0}")]
    NoStream(Arc<libp2p_stream::OpenStreamError>),
    #[error("no stream for the file in time")]
    NoStreamInTime,
    #[error("no answer: {0}")]
    NoAnswer(Arc<io::Error>),
    #[error("the node did not take the ask: {0}")]
    NotTaken(Arc<io::Error>),
    #[error("the stream ended: {0}")]
    StreamEnded(Arc<io::Error>),
    #[error("the sender stopped {0} bytes before the end (it will go on from there)")]
    Stopped(u64),
    #[error("the transfer was cut: {0} (it will go on from there)")]
    Cut(Arc<io::Error>),
    #[error(transparent)]
    Pieces(#[from] PieceError),
    #[error("output path `{0}` leaves the task's folder")]
    Leaves(String),
    #[error("cannot read {}: {}", .0.display(), .1)]
    Read(PathBuf, #[source] Arc<io::Error>),
    #[error("cannot create {}: {}", .0.display(), .1)]
    Create(PathBuf, #[source] Arc<io::Error>),
    #[error("cannot write {}: {}", .0.display(), .1)]
    Write(PathBuf, #[source] Arc<io::Error>),
    #[error("cannot keep {}: {}", .0.display(), .1)]
    Keep(PathBuf, #[source] Arc<io::Error>),
    #[error("cannot place {}: {}", .0.display(), .1)]
    Place(PathBuf, #[source] Arc<io::Error>),
    #[error("{}: {}", .0.display(), .1)]
    Stat(PathBuf, #[source] Arc<io::Error>),
    #[error("cannot set the mode of {}: {}", .0.display(), .1)]
    Mode(PathBuf, #[source] Arc<io::Error>),
    #[error("the fetch it waited for was dropped")]
    Dropped,
    /// The blocking work of a fetch panicked or was cancelled.
    #[error("{0}")]
    Join(Arc<tokio::task::JoinError>),
    /// One of a farm's inputs, fetched into the cache.
    #[error("input `{path}`: {source}")]
    Input {
        path: String,
        source: Box<FetchError>,
    },
    /// An output a task depends on (`stage/index/path`).
    #[error("{output}: {source}")]
    Dep {
        output: String,
        source: Box<FetchError>,
    },
}

impl FetchError {
    /// An I/O error about `path`, as `kind` says it.
    pub(in crate::mesh_node) fn io(
        kind: fn(PathBuf, Arc<io::Error>) -> FetchError,
        path: &Path,
    ) -> impl FnOnce(io::Error) -> FetchError {
        let path = path.to_path_buf();
        move |e| kind(path, Arc::new(e))
    }
}

impl From<Refusal> for FetchError {
    fn from(r: Refusal) -> FetchError {
        match r {
            Refusal::NoSuchFile => FetchError::Missing,
            Refusal::Unreadable { path, why } => FetchError::Unreadable { path, why },
        }
    }
}

impl From<tokio::task::JoinError> for FetchError {
    fn from(e: tokio::task::JoinError) -> FetchError {
        FetchError::Join(Arc::new(e))
    }
}

fn said(why: &[(NodeId, FetchError)]) -> String {
    let v: Vec<String> = why.iter().map(|(n, e)| format!("{n}: {e}")).collect();
    v.join("; ")
}

/// This node's transfers, shared by the loop and the spawned work.
pub(in crate::mesh_node) struct Transfers {
    state: PathBuf,
    /// The files this node keeps (held outputs, its cache) are on a file
    /// system other nodes see at the same path: they are told where.
    shared: bool,
    streams: libp2p_stream::Control,
    /// Inputs this node serves from the farm's folder (it submitted the
    /// farm): hash and where the file is.
    blobs: Mutex<HashMap<[u8; 32], PathBuf>>,
    fetches: Semaphore,
    sends: Semaphore,
    /// Files being fetched now, by where they go: a second fetch of the
    /// same waits for the first's end.
    landing: Mutex<HashMap<PathBuf, Landing>>,
    /// Tasks whose outputs come home now (the home asks again for those
    /// that take long: the transfer under way answers).
    tasks: Mutex<HashSet<(FarmId, TaskRef)>>,
    pub(in crate::mesh_node) stats: Stats,
}

/// A fetch under way, as a second fetch of the same file waits for it.
type Landing = watch::Receiver<Option<Result<Got, FetchError>>>;

/// What this node's transfers moved, for views and tests.
#[derive(Default)]
pub(in crate::mesh_node) struct Stats {
    /// Bytes sent to other nodes, and received, verified, from them.
    pub sent: AtomicU64,
    pub received: AtomicU64,
    /// Bytes taken in place from where another node kept them.
    pub in_place: AtomicU64,
    /// Files being sent now.
    pub sending: AtomicUsize,
    /// When a send last ended (or began).
    pub last_send: Mutex<Option<Instant>>,
    /// Per farm: bytes brought home (outputs), and of those, bytes of
    /// files still coming.
    pub home: Mutex<HashMap<FarmId, (u64, u64)>>,
}

impl Stats {
    /// Puts the bytes moved into a node's counters.
    pub(in crate::mesh_node) fn count(&self, c: &mut mesh_protocol::observe::Counters) {
        c.bytes_sent = self.sent.load(Ordering::Relaxed);
        c.bytes_received = self.received.load(Ordering::Relaxed);
        c.bytes_in_place = self.in_place.load(Ordering::Relaxed);
    }
}

/// How a fetched file came.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::mesh_node) enum Got {
    /// Over the mesh: this many bytes (less than the file when it went on
    /// from what a cut transfer left).
    Sent(u64),
    /// Taken from where the sender keeps it, on a shared file system.
    InPlace,
}

impl Transfers {
    pub(in crate::mesh_node) fn new(
        state: PathBuf,
        shared: bool,
        streams: libp2p_stream::Control,
    ) -> Transfers {
        Transfers {
            state: std::path::absolute(&state).unwrap_or(state),
            shared,
            streams,
            blobs: Mutex::new(HashMap::new()),
            fetches: Semaphore::new(FETCHES_AT_ONCE),
            sends: Semaphore::new(SENDS_AT_ONCE),
            landing: Mutex::new(HashMap::new()),
            tasks: Mutex::new(HashSet::new()),
            stats: Stats::default(),
        }
    }

    pub(in crate::mesh_node) fn serve_file(&self, hash: [u8; 32], path: PathBuf) {
        lock(&self.blobs).insert(hash, path);
    }

    /// Whether a fetch of `task`'s outputs may begin (none is under way).
    pub(in crate::mesh_node) fn begin_task(&self, farm: FarmId, task: TaskRef) -> bool {
        lock(&self.tasks).insert((farm, task))
    }

    pub(in crate::mesh_node) fn end_task(&self, farm: FarmId, task: TaskRef) {
        lock(&self.tasks).remove(&(farm, task));
    }

    /// Whether this node sends or was sending a file lately (a stopping
    /// node lingers for the home).
    pub(in crate::mesh_node) fn quiet_since(&self) -> Option<Instant> {
        if self.stats.sending.load(Ordering::Relaxed) > 0 {
            return Some(Instant::now());
        }
        *lock(&self.stats.last_send)
    }

    fn count_home(&self, farm: Option<FarmId>, n: u64) {
        self.stats.received.fetch_add(n, Ordering::Relaxed);
        if let Some(farm) = farm {
            let mut home = lock(&self.stats.home);
            let e = home.entry(farm).or_default();
            e.0 += n;
            e.1 += n;
        }
    }

    /// A file of `farm` that brought `n` bytes home is done coming.
    fn landed(&self, farm: Option<FarmId>, n: u64) {
        if let Some(farm) = farm {
            if let Some(e) = lock(&self.stats.home).get_mut(&farm) {
                e.1 = e.1.saturating_sub(n);
            }
        }
    }

    /// Bytes of `farm`'s outputs brought home, and of files still coming.
    pub(in crate::mesh_node) fn home_bytes(&self, farm: FarmId) -> (u64, u64) {
        lock(&self.stats.home)
            .get(&farm)
            .copied()
            .unwrap_or_default()
    }

    /// Where this node keeps a file of `farm` by hash: an input it serves
    /// as the farm's submitter, an output it keeps for the farm's home, or
    /// a file in its cache. The second: whether it is content-addressed
    /// here (never written again, so another node may link it).
    fn locate(&self, farm: FarmId, hash: &[u8; 32]) -> Option<(PathBuf, bool)> {
        if let Some(p) = lock(&self.blobs).get(hash) {
            return Some((p.clone(), false));
        }
        let hex = blake3::Hash::from(*hash).to_hex().to_string();
        [
            crate::state::kept_dir(&self.state, farm).join(&hex),
            self.state.join("cache").join(&hex),
        ]
        .into_iter()
        .find(|p| p.is_file())
        .map(|p| (p, true))
    }
}

/// Whether `dir` is on a network file system (NFS, Lustre, GPFS, BeeGFS,
/// CephFS, SMB): then other nodes likely see it at the same path.
pub(in crate::mesh_node) fn shared_fs(dir: &Path) -> bool {
    const NETWORK: [i64; 7] = [
        0x6969,      // NFS
        0x0BD0_0BD0, // Lustre
        0x4750_4653, // GPFS
        0x1983_0326, // BeeGFS
        0x00C3_6400, // CephFS
        0xFF53_4D42, // CIFS
        0xFE53_4D42, // SMB2
    ];
    nix::sys::statfs::statfs(dir)
        .map(|s| NETWORK.contains(&{ s.filesystem_type().0 }))
        .unwrap_or(false)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Where the pieces of a file kept here are written down, so that serving
/// it does not read it twice.
pub(in crate::mesh_node) fn pieces_path(file: &Path) -> PathBuf {
    let mut name = file.file_name().unwrap_or_default().to_owned();
    name.push(".pieces");
    file.with_file_name(name)
}

/// Writes down a file's pieces beside it (only files of more than one piece have any).
pub(in crate::mesh_node) fn keep_pieces(file: &Path, pieces: &Pieces) {
    if pieces.cvs.is_empty() {
        return;
    }
    if let Ok(bytes) = postcard::to_stdvec(pieces) {
        let _ = fs::write(pieces_path(file), bytes);
    }
}

/// A file's blake3 hash and pieces, read once.
pub(in crate::mesh_node) fn hash_file(path: &Path) -> io::Result<(Cv, Pieces)> {
    let mut f = fs::File::open(path)?;
    let size = f.metadata()?.len();
    let mut h = PieceHasher::new(size);
    let mut buf = vec![0u8; BLOCK];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n])
            .map_err(|_| io::Error::other("the file grew while it was read"))?;
    }
    h.finish()
        .map_err(|_| io::Error::other("the file shrank while it was read"))
}

/// The pieces of a file kept here, from beside it (or from `aside` for a
/// file that is not this node's), else read and written down.
fn pieces_of(path: &Path, aside: Option<&Path>, hash: &Cv) -> io::Result<Pieces> {
    let size = fs::metadata(path)?.len();
    let kept = aside.map_or_else(|| pieces_path(path), Path::to_path_buf);
    if piece_count(size) > 1 {
        if let Ok(bytes) = fs::read(&kept) {
            if let Ok(p) = postcard::from_bytes::<Pieces>(&bytes) {
                if p.size == size && p.check(hash).is_ok() {
                    return Ok(p);
                }
            }
        }
    }
    let (got, pieces) = hash_file(path)?;
    if &got != hash {
        return Err(io::Error::other(
            "the file changed where it was kept (another hash)",
        ));
    }
    if !pieces.cvs.is_empty() {
        if let (Some(dir), Ok(bytes)) = (kept.parent(), postcard::to_stdvec(&pieces)) {
            let _ = fs::create_dir_all(dir).and_then(|_| fs::write(&kept, bytes));
        }
    }
    Ok(pieces)
}

// ----- the sender -----

/// Takes every stream of files asked of this node.
pub(in crate::mesh_node) async fn accept_data(
    mut incoming: libp2p_stream::IncomingStreams,
    t: Arc<Transfers>,
) {
    while let Some((peer, stream)) = incoming.next().await {
        let t = t.clone();
        tokio::spawn(async move {
            if let Err(e) = send(&t, stream).await {
                tracing::debug!(%peer, "a file was not sent whole: {e}");
            }
        });
    }
}

async fn send(t: &Transfers, mut s: libp2p::Stream) -> io::Result<()> {
    let ask: DataAsk = within(SILENCE, net::read_frame(&mut s)).await?;
    let head = match t.locate(ask.farm, &ask.hash) {
        None => Err(Refusal::NoSuchFile),
        Some((path, own)) => {
            let aside = (!own).then(|| {
                let hex = blake3::Hash::from(ask.hash).to_hex().to_string();
                t.state.join("pieces").join(format!("{hex}.pieces"))
            });
            let (p, hash) = (path.clone(), ask.hash);
            let pieces =
                tokio::task::spawn_blocking(move || pieces_of(&p, aside.as_deref(), &hash))
                    .await
                    .map_err(io::Error::other)?;
            match pieces {
                Ok(pieces) => Ok((path, own, pieces)),
                Err(e) => Err(Refusal::Unreadable {
                    path: path.display().to_string(),
                    why: e.to_string(),
                }),
            }
        }
    };
    let (path, pieces) = match head {
        Err(e) => {
            net::write_frame(&mut s, &DataHead::Refused(e)).await?;
            return s.close().await;
        }
        Ok((path, own, pieces)) => {
            let at = (t.shared && own).then(|| path.to_string_lossy().into_owned());
            let head = DataHead::File {
                pieces: pieces.clone(),
                at,
            };
            net::write_frame(&mut s, &head).await?;
            (path, pieces)
        }
    };
    // The receiver first reads back what a cut transfer left, which may be long.
    let from: DataFrom = within(PART_CHECK_WAIT, net::read_frame(&mut s)).await?;
    let Some(offset) = from.offset else {
        return s.close().await;
    };
    let _turn = t.sends.acquire().await.map_err(io::Error::other)?;
    t.stats.sending.fetch_add(1, Ordering::Relaxed);
    let r = send_bytes(t, &mut s, &path, offset, pieces.size).await;
    t.stats.sending.fetch_sub(1, Ordering::Relaxed);
    *lock(&t.stats.last_send) = Some(Instant::now());
    r?;
    s.close().await
}

/// The file's bytes from `offset` to `size`, read off the loop.
async fn send_bytes(
    t: &Transfers,
    s: &mut libp2p::Stream,
    path: &Path,
    offset: u64,
    size: u64,
) -> io::Result<()> {
    let (btx, mut brx) = mpsc::channel::<io::Result<Vec<u8>>>(BLOCKS_QUEUED);
    let path = path.to_path_buf();
    let reader = tokio::task::spawn_blocking(move || {
        let read = || -> io::Result<()> {
            let mut f = fs::File::open(&path)?;
            f.seek(SeekFrom::Start(offset))?;
            let mut left = size.saturating_sub(offset);
            while left > 0 {
                let mut buf = vec![0u8; BLOCK.min(left as usize)];
                f.read_exact(&mut buf)?;
                left -= buf.len() as u64;
                if btx.blocking_send(Ok(buf)).is_err() {
                    return Ok(());
                }
            }
            Ok(())
        };
        if let Err(e) = read() {
            let _ = btx.blocking_send(Err(e));
        }
    });
    while let Some(block) = brx.recv().await {
        let block = block?;
        within(SILENCE, s.write_all(&block)).await?;
        t.stats
            .sent
            .fetch_add(block.len() as u64, Ordering::Relaxed);
    }
    drop(brx);
    let _ = reader.await;
    within(SILENCE, s.flush()).await
}

async fn within<T>(
    limit: Duration,
    f: impl std::future::Future<Output = io::Result<T>>,
) -> io::Result<T> {
    tokio::time::timeout(limit, f).await.unwrap_or_else(|_| {
        Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "silent for too long",
        ))
    })
}

// ----- the receiver -----

/// What a file is fetched as, which says what is done with it beside
/// bringing it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(in crate::mesh_node) enum Fetching {
    /// An output coming home: counted in the farm's progress.
    Home,
    /// An input for this node's cache: its pieces are written beside it,
    /// so this node may serve it in turn.
    Cached,
}

/// A file to bring from another node: which (by its farm and hash), from
/// which node, where it goes, and what for.
#[derive(Clone, Copy)]
pub(in crate::mesh_node) struct Fetch<'a> {
    pub(in crate::mesh_node) from: NodeId,
    pub(in crate::mesh_node) farm: FarmId,
    pub(in crate::mesh_node) hash: [u8; 32],
    pub(in crate::mesh_node) dest: &'a Path,
    /// The permission bits it goes in with (0: as made), given before it
    /// is renamed into place: an executable output is never seen at its
    /// path without them.
    pub(in crate::mesh_node) mode: u32,
    pub(in crate::mesh_node) what: Fetching,
}

/// Brings the file `f` asks for, checked, going on from what an earlier
/// cut transfer left where it goes.
pub(in crate::mesh_node) async fn fetch(
    t: &Arc<Transfers>,
    handle: &LoopHandle,
    f: Fetch<'_>,
) -> Result<Got, FetchError> {
    let dest = f.dest;
    // One transfer per destination: a second waits for the first.
    let mine = {
        let mut landing = lock(&t.landing);
        match landing.get(dest) {
            Some(rx) => Err(rx.clone()),
            None => {
                let (wtx, wrx) = watch::channel(None);
                landing.insert(dest.to_path_buf(), wrx);
                Ok(wtx)
            }
        }
    };
    let done = match mine {
        Err(mut rx) => {
            let r = rx.wait_for(Option::is_some).await;
            return match r {
                Ok(v) => v.clone().expect("some"),
                Err(_) => Err(FetchError::Dropped),
            };
        }
        Ok(done) => Landed {
            t,
            dest: dest.to_path_buf(),
            done,
        },
    };
    let r = fetch_here(t, handle, f).await;
    let _ = done.done.send(Some(r.clone()));
    r
}

/// Takes a fetch's destination off the list when the fetch ends, however
/// it ends (a fetch dropped midway must not leave the next waiting).
struct Landed<'a> {
    t: &'a Transfers,
    dest: PathBuf,
    done: watch::Sender<Option<Result<Got, FetchError>>>,
}

impl Drop for Landed<'_> {
    fn drop(&mut self) {
        lock(&self.t.landing).remove(&self.dest);
    }
}

async fn fetch_here(
    t: &Arc<Transfers>,
    handle: &LoopHandle,
    f: Fetch<'_>,
) -> Result<Got, FetchError> {
    let Fetch {
        from,
        farm,
        hash,
        dest,
        mode,
        what,
    } = f;
    let keep = what == Fetching::Cached;
    // The semaphore is never closed: failing to acquire it means the node's end.
    let _turn = t
        .fetches
        .acquire()
        .await
        .map_err(|_| FetchError::Stopping)?;
    let pid = handle
        .peer_of(from)
        .await
        .map_err(|_| FetchError::Stopping)?
        .ok_or(FetchError::NotMember(from))?;
    let (mut s, pieces, at) = ask(t, pid, farm, hash).await?;
    pieces.check(&hash)?;
    let dir = dest.parent().unwrap_or(Path::new(".")).to_path_buf();
    fs::create_dir_all(&dir).map_err(FetchError::io(FetchError::Create, &dir))?;
    if let Some(at) = at {
        let (at, d, p) = (PathBuf::from(at), dest.to_path_buf(), pieces.clone());
        let took = tokio::task::spawn_blocking(move || take_in_place(&at, &d, &hash, &p, mode))
            .await
            .unwrap_or(false);
        if took {
            let _ = net::write_frame(&mut s, &DataFrom { offset: None }).await;
            let _ = s.close().await;
            t.stats.in_place.fetch_add(pieces.size, Ordering::Relaxed);
            if keep {
                keep_pieces(dest, &pieces);
            }
            return Ok(Got::InPlace);
        }
    }
    let part = part_path(dest);
    let (pt, pp) = (part.clone(), pieces.clone());
    let have = tokio::task::spawn_blocking(move || verified_part(&pt, &pp, &hash))
        .await?
        .map_err(FetchError::io(FetchError::Read, &part))?;
    if have == pieces.size && pieces.size > 0 {
        // Cut after its last byte, before its name.
        let _ = net::write_frame(&mut s, &DataFrom { offset: None }).await;
        land(&part, dest, mode)?;
        return Ok(Got::Sent(0));
    }
    net::write_frame(&mut s, &DataFrom { offset: Some(have) })
        .await
        .map_err(|e| FetchError::StreamEnded(Arc::new(e)))?;
    let farm_of = (what == Fetching::Home).then_some(farm);
    let rest = Rest {
        part: &part,
        pieces: &pieces,
        hash,
        have,
        farm: farm_of,
    };
    let r = receive(t, handle, &mut s, rest).await;
    let _ = s.close().await;
    r?;
    if keep {
        keep_pieces(dest, &pieces);
    }
    land(&part, dest, mode)?;
    Ok(Got::Sent(pieces.size - have))
}

/// A whole, checked part renamed to its name, with its bits first.
fn land(part: &Path, dest: &Path, mode: u32) -> Result<(), FetchError> {
    crate::results::give_mode(part, mode).map_err(FetchError::io(FetchError::Mode, part))?;
    fs::rename(part, dest).map_err(FetchError::io(FetchError::Keep, dest))
}

/// Opens a stream to `pid` and asks for the file: the stream, the file's
/// pieces and where the sender keeps it (when others may see it).
async fn ask(
    t: &Transfers,
    pid: PeerId,
    farm: FarmId,
    hash: [u8; 32],
) -> Result<(libp2p::Stream, Pieces, Option<String>), FetchError> {
    let mut why = None;
    for attempt in 0..OPEN_TRIES {
        if attempt > 0 {
            tokio::time::sleep(Duration::from_millis(50 << attempt.min(4))).await;
        }
        let mut control = t.streams.clone();
        let open = control.open_stream(pid, StreamProtocol::new(DATA_PROTOCOL));
        let mut s = match tokio::time::timeout(OPEN_TIMEOUT, open).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return Err(FetchError::NoStream(Arc::new(e))),
            Err(_) => return Err(FetchError::NoStreamInTime),
        };
        let head = async {
            net::write_frame(&mut s, &DataAsk { farm, hash }).await?;
            within(SILENCE, net::read_frame::<_, DataHead>(&mut s)).await
        };
        match head.await {
            Ok(DataHead::File { pieces, at }) => return Ok((s, pieces, at)),
            Ok(DataHead::Refused(r)) => return Err(r.into()),
            // Dropped before it was read: asked again on a new stream.
            Err(e) if e.kind() != io::ErrorKind::TimedOut => why = Some(e),
            Err(e) => return Err(FetchError::NoAnswer(Arc::new(e))),
        }
    }
    // Every try (there is at least one) that did not return left its why.
    let why = why.unwrap_or_else(|| io::Error::other("no try"));
    Err(FetchError::NotTaken(Arc::new(why)))
}

/// Where a file is written while it comes: beside where it goes, hidden,
/// and kept when the transfer is cut.
pub(in crate::mesh_node) fn part_path(dest: &Path) -> PathBuf {
    let name = dest.file_name().unwrap_or_default().to_string_lossy();
    dest.with_file_name(format!(".{name}.part"))
}

/// How much of the file a cut transfer left in `part` checks out, read
/// back piece by piece; the rest is cut off.
fn verified_part(part: &Path, pieces: &Pieces, hash: &Cv) -> io::Result<u64> {
    let mut f = match fs::OpenOptions::new().read(true).write(true).open(part) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e),
    };
    let len = f.metadata()?.len().min(pieces.size);
    let whole = len == pieces.size;
    // A piece cut short is read again whole.
    let upto = if whole {
        len
    } else {
        len - len % pieces.piece_len()
    };
    let mut h = PieceHasher::checking(pieces, *hash, 0);
    let mut buf = vec![0u8; BLOCK];
    let mut ok = true;
    while ok && h.at() < upto {
        let n = BLOCK.min((upto - h.at()) as usize);
        f.read_exact(&mut buf[..n])?;
        ok = h.update(&buf[..n]).is_ok();
    }
    let mut good = h.verified();
    if ok && whole && h.finish().is_ok() {
        good = len;
    }
    f.set_len(good)?;
    Ok(good)
}

/// What is left to come of a file: the part file it is written to, the
/// pieces (of the file of `hash`) it is checked against as it comes, and
/// how much of it the part holds checked already.
struct Rest<'a> {
    part: &'a Path,
    pieces: &'a Pieces,
    hash: Cv,
    have: u64,
    /// The farm whose output comes home, whose bytes are counted and shown
    /// coming (none: an input for the cache).
    farm: Option<FarmId>,
}

/// The bytes from `rest.have` to the end, checked and written as they come.
async fn receive(
    t: &Transfers,
    handle: &LoopHandle,
    s: &mut libp2p::Stream,
    rest: Rest<'_>,
) -> Result<(), FetchError> {
    let Rest {
        part,
        pieces,
        hash,
        have,
        farm,
    } = rest;
    let (btx, mut brx) = mpsc::channel::<Vec<u8>>(BLOCKS_QUEUED);
    let (part_w, pieces_w) = (part.to_path_buf(), pieces.clone());
    let writer = tokio::task::spawn_blocking(move || -> Result<(), FetchError> {
        let mut f = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&part_w)
            .map_err(FetchError::io(FetchError::Write, &part_w))?;
        f.set_len(have)
            .and_then(|_| f.seek(SeekFrom::Start(have)).map(|_| ()))
            .map_err(FetchError::io(FetchError::Write, &part_w))?;
        let mut h = PieceHasher::checking(&pieces_w, hash, have / pieces_w.piece_len());
        while let Some(block) = brx.blocking_recv() {
            if let Err(e) = h.update(&block) {
                // What came before the bad piece stays, checked.
                let _ = f.set_len(h.verified());
                return Err(e.into());
            }
            f.write_all(&block)
                .map_err(FetchError::io(FetchError::Write, &part_w))?;
        }
        if h.at() < pieces_w.size {
            // Cut: what came stays, to be checked when it goes on.
            return Ok(());
        }
        let verified = h.verified();
        h.finish().map_err(|e| {
            let _ = f.set_len(verified);
            FetchError::from(e)
        })?;
        // On the disk before it is named: once the home has it, the node
        // that made it may let its copy go (0.2 ms a small file here).
        f.sync_data()
            .map_err(FetchError::io(FetchError::Write, &part_w))
    });
    let mut left = pieces.size - have;
    let mut r = Ok(());
    let mut told = Instant::now();
    while left > 0 {
        let mut buf = vec![0u8; BLOCK.min(left as usize)];
        let n = match within(SILENCE, s.read(&mut buf)).await {
            Ok(0) => {
                r = Err(FetchError::Stopped(left));
                break;
            }
            Ok(n) => n,
            Err(e) => {
                r = Err(FetchError::Cut(Arc::new(e)));
                break;
            }
        };
        buf.truncate(n);
        left -= n as u64;
        t.count_home(farm, n as u64);
        if let Some(farm) = farm.filter(|_| told.elapsed() >= PROGRESS_EVERY) {
            told = Instant::now();
            // Full: this progress is dropped; the next one, or the
            // fetch's end, says as much.
            handle.hint(Event::Moved(farm));
        }
        if btx.send(buf).await.is_err() {
            break;
        }
    }
    drop(btx);
    t.landed(farm, pieces.size - have - left);
    let written = writer.await?;
    r?;
    written
}

/// Takes the file kept at `at` by another node (a shared file system):
/// linked (else copied by the file system) beside `dest`, checked by its
/// hash, then named. Whether it was.
fn take_in_place(at: &Path, dest: &Path, hash: &Cv, pieces: &Pieces, mode: u32) -> bool {
    let Ok(meta) = fs::metadata(at) else {
        return false;
    };
    if meta.len() != pieces.size || !meta.is_file() {
        return false;
    }
    let name = dest.file_name().unwrap_or_default().to_string_lossy();
    let tmp = dest.with_file_name(format!(".{name}.link"));
    let _ = fs::remove_file(&tmp);
    if fs::hard_link(at, &tmp).is_err() && fs::copy(at, &tmp).is_err() {
        return false;
    }
    // A link shares the kept file's bits, which are the output's own.
    let moded = crate::results::give_mode(&tmp, mode).is_ok();
    let ok =
        moded && hash_file(&tmp).is_ok_and(|(h, _)| &h == hash) && fs::rename(&tmp, dest).is_ok();
    if !ok {
        let _ = fs::remove_file(&tmp);
    }
    ok
}
