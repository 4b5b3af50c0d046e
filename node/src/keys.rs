//! The node's secrets on disk: the mesh's pre-shared key (`mesh.key`) and this node's identity (`identity.key`).
//!
//! `mesh.key` is what makes a set of nodes one mesh: every node of it holds
//! the same file, and a node without it cannot even finish a handshake. It is
//! the standard libp2p/IPFS `swarm.key` text, so existing tools can read it.
//! `identity.key` is this node's own ed25519 keypair (libp2p's protobuf
//! encoding); its peer id names the node. Both are private and must be 0600.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use std::fmt;
use std::str::FromStr;

use libp2p::identity::{ed25519, Keypair};
use libp2p::PeerId;
use mesh_protocol::mesh::NodeId;
use thiserror::Error;

/// The pre-shared key of the mesh, in the state folder.
pub const PSK_FILE: &str = "mesh.key";
/// This node's keypair, in the state folder.
pub const IDENTITY_FILE: &str = "identity.key";

#[derive(Debug, Error)]
pub enum KeyError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} does not exist: run `mesh init` to start a new mesh, or copy mesh.key from a node of the mesh into this node's state folder")]
    MissingPsk { path: PathBuf },
    #[error("{path} is not a mesh key ({reason}); copy mesh.key from a node of the mesh, or run `mesh init` to start a new mesh")]
    BadPsk { path: PathBuf, reason: String },
    #[error("{path} can be read by other users (mode {mode:03o}); it is a secret: run `chmod 600 {path}`")]
    TooOpen { path: PathBuf, mode: u32 },
    #[error(
        "{path} is not a node identity ({reason}); move it away and a new identity will be created"
    )]
    BadIdentity { path: PathBuf, reason: String },
}

impl KeyError {
    fn io(path: &Path, source: std::io::Error) -> KeyError {
        KeyError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

/// The mesh's secret: 32 random bytes, kept as the libp2p/IPFS `swarm.key`
/// text (three lines: `/key/swarm/psk/1.0.0/`, `/base16/`, 64 hex digits).
///
/// Its own type since libp2p's `pnet` went (see `net.rs`): the key now
/// enters the noise handshake and seals membership packets, both through
/// keys derived from it, never itself.
#[derive(Clone, PartialEq, Eq)]
pub struct MeshKey([u8; 32]);

impl MeshKey {
    pub fn new(bytes: [u8; 32]) -> MeshKey {
        MeshKey(bytes)
    }

    /// A key for one use, derived from the mesh key (blake3's KDF), so the
    /// mesh key itself is never used by two things.
    pub fn derive(&self, context: &str) -> [u8; 32] {
        blake3::derive_key(context, &self.0)
    }

    /// A short digest that is not the secret, for users to compare two
    /// nodes' keys (and to name the mesh's batch jobs).
    pub fn fingerprint(&self) -> String {
        let d = self.derive("mesh 2026 key fingerprint");
        d[..16].iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// The unredacted key, in the `swarm.key` text `mesh.key` holds.
impl fmt::Display for MeshKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("/key/swarm/psk/1.0.0/\n/base16/\n")?;
        for b in &self.0 {
            write!(f, "{b:02x}")?;
        }
        f.write_str("\n")
    }
}

/// Never the secret in a log.
impl fmt::Debug for MeshKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MeshKey({})", self.fingerprint())
    }
}

impl FromStr for MeshKey {
    /// Why the text is not a key, as the end of a sentence.
    type Err = &'static str;

    fn from_str(text: &str) -> Result<MeshKey, &'static str> {
        let lines: Vec<&str> = text.lines().take(3).collect();
        let [kind, encoding, hex] = lines[..] else {
            return Err("expected three lines: /key/swarm/psk/1.0.0/, /base16/, and 64 hex digits");
        };
        if kind != "/key/swarm/psk/1.0.0/" {
            return Err("the first line is not /key/swarm/psk/1.0.0/");
        }
        if encoding != "/base16/" {
            return Err("the second line is not /base16/");
        }
        let hex = hex.trim_end().as_bytes();
        if hex.len() != 64 {
            return Err("the key is not 64 hex digits");
        }
        if !hex.iter().all(u8::is_ascii_hexdigit) {
            return Err("the key has a character that is not a hex digit");
        }
        let digit = |c: u8| (c as char).to_digit(16).expect("checked above") as u8;
        let mut key = [0u8; 32];
        for (byte, pair) in key.iter_mut().zip(hex.chunks(2)) {
            *byte = digit(pair[0]) << 4 | digit(pair[1]);
        }
        Ok(MeshKey(key))
    }
}

/// What `init` found and did, for `mesh init` to print.
#[derive(Debug, Clone)]
pub struct InitReport {
    pub psk_path: PathBuf,
    /// False when a mesh.key was already there (it is never overwritten).
    pub psk_created: bool,
    /// Short, non-secret digest of the key, so users can compare two nodes' keys.
    pub psk_fingerprint: String,
    pub identity_path: PathBuf,
    pub identity_created: bool,
    pub peer_id: PeerId,
}

/// Creates the state folder, a new mesh key unless one exists, and this node's identity unless one exists.
pub fn init(state_dir: &Path) -> Result<InitReport, KeyError> {
    fs::create_dir_all(state_dir).map_err(|e| KeyError::io(state_dir, e))?;
    let psk_path = state_dir.join(PSK_FILE);
    let psk_created = if psk_path.exists() {
        false
    } else {
        let psk = MeshKey::new(random_32());
        match write_private(&psk_path, psk.to_string().as_bytes()) {
            Ok(()) => true,
            // Another `mesh init` won the race: theirs stands, as an existing key would.
            Err(KeyError::Io { source, .. })
                if source.kind() == std::io::ErrorKind::AlreadyExists =>
            {
                false
            }
            Err(e) => return Err(e),
        }
    };
    // Read it back even when just written, so a broken existing key is reported now.
    let psk = load_psk(&psk_path)?;
    let identity_path = state_dir.join(IDENTITY_FILE);
    let identity_created = !identity_path.exists();
    let identity = load_or_create_identity(state_dir)?;
    Ok(InitReport {
        psk_path,
        psk_created,
        psk_fingerprint: psk.fingerprint(),
        identity_path,
        identity_created,
        peer_id: identity.public().to_peer_id(),
    })
}

/// Reads the mesh key, refusing a missing, malformed or world-readable file.
pub fn load_psk(path: &Path) -> Result<MeshKey, KeyError> {
    let text = match read_private(path) {
        Err(KeyError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            return Err(KeyError::MissingPsk {
                path: path.to_path_buf(),
            })
        }
        other => other?,
    };
    let text = String::from_utf8(text).map_err(|_| KeyError::BadPsk {
        path: path.to_path_buf(),
        reason: "not text".into(),
    })?;
    text.parse::<MeshKey>().map_err(|e| KeyError::BadPsk {
        path: path.to_path_buf(),
        reason: e.into(),
    })
}

/// The mesh's name in its batch jobs' names (`mesh-` and 8 hex digits of
/// the key's public fingerprint): the same on every node of a mesh, and
/// different from other meshes' (another user's, or this user's next).
pub fn mesh_tag(psk: &MeshKey) -> String {
    let fp = psk.fingerprint();
    format!("mesh-{}", &fp[..8])
}

/// Reads this node's keypair, or makes one (mode 0600) on first start.
pub fn load_or_create_identity(state_dir: &Path) -> Result<Keypair, KeyError> {
    let path = state_dir.join(IDENTITY_FILE);
    match read_private(&path) {
        Ok(bytes) => Keypair::from_protobuf_encoding(&bytes).map_err(|e| KeyError::BadIdentity {
            path: path.clone(),
            reason: e.to_string(),
        }),
        Err(KeyError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            fs::create_dir_all(state_dir).map_err(|e| KeyError::io(state_dir, e))?;
            let keypair = Keypair::generate_ed25519();
            let bytes = keypair
                .to_protobuf_encoding()
                .map_err(|e| KeyError::BadIdentity {
                    path: path.clone(),
                    reason: e.to_string(),
                })?;
            match write_private(&path, &bytes) {
                Ok(()) => Ok(keypair),
                // Two first starts at once: use the one that landed, so both agree.
                Err(KeyError::Io { source, .. })
                    if source.kind() == std::io::ErrorKind::AlreadyExists =>
                {
                    load_or_create_identity(state_dir)
                }
                Err(e) => Err(e),
            }
        }
        Err(e) => Err(e),
    }
}

/// The mesh-wide number of a node: the first 8 bytes of blake3 of its peer id, big-endian.
pub fn node_id(peer: &PeerId) -> NodeId {
    let hash = blake3::hash(&peer.to_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&hash.as_bytes()[..8]);
    NodeId(u64::from_be_bytes(first))
}

/// 32 bytes from the operating system's CSPRNG.
///
/// An ed25519 secret seed is exactly that (libp2p fills it from an OS-seeded
/// CSPRNG and it is not clamped), which spares a direct dependency on a
/// random-number crate just for the mesh key.
fn random_32() -> [u8; 32] {
    let secret = ed25519::SecretKey::generate();
    let mut bytes = [0u8; 32];
    bytes.copy_from_slice(secret.as_ref());
    bytes
}

/// Creates `path` with mode 0600 from the start (never briefly readable by others), failing if it exists.
fn write_private(path: &Path, bytes: &[u8]) -> Result<(), KeyError> {
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| KeyError::io(path, e))?;
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .map_err(|e| KeyError::io(path, e))
}

/// Reads a secret file, refusing it if group or others may read or write it.
fn read_private(path: &Path) -> Result<Vec<u8>, KeyError> {
    let meta = fs::metadata(path).map_err(|e| KeyError::io(path, e))?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(KeyError::TooOpen {
            path: path.to_path_buf(),
            mode,
        });
    }
    fs::read(path).map_err(|e| KeyError::io(path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(path: &Path) -> u32 {
        fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn init_creates_private_files_and_never_overwrites_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        let first = init(&state).unwrap();
        assert!(first.psk_created && first.identity_created);
        assert_eq!(mode(&first.psk_path), 0o600);
        assert_eq!(mode(&first.identity_path), 0o600);
        let text = fs::read_to_string(&first.psk_path).unwrap();
        assert!(
            text.starts_with("/key/swarm/psk/1.0.0/\n/base16/\n"),
            "{text}"
        );

        let second = init(&state).unwrap();
        assert!(!second.psk_created && !second.identity_created);
        assert_eq!(fs::read_to_string(&first.psk_path).unwrap(), text);
        assert_eq!(second.peer_id, first.peer_id);
        assert_eq!(second.psk_fingerprint, first.psk_fingerprint);

        let psk = load_psk(&first.psk_path).unwrap();
        assert_eq!(psk.to_string(), text);
        assert_eq!(psk.fingerprint(), first.psk_fingerprint);
        let id = load_or_create_identity(&state).unwrap();
        assert_eq!(id.public().to_peer_id(), first.peer_id);
    }

    #[test]
    fn two_meshes_get_different_keys_and_job_names() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (ra, rb) = (init(a.path()).unwrap(), init(b.path()).unwrap());
        assert_ne!(ra.psk_fingerprint, rb.psk_fingerprint);
        let tag = |r: &InitReport| mesh_tag(&load_psk(&r.psk_path).unwrap());
        assert_ne!(tag(&ra), tag(&rb));
        // Every node of a mesh names its jobs alike (the same key, the same tag).
        assert_eq!(tag(&ra), format!("mesh-{}", &ra.psk_fingerprint[..8]));
    }

    #[test]
    fn load_psk_refuses_open_missing_and_malformed_files() {
        let dir = tempfile::tempdir().unwrap();
        let report = init(dir.path()).unwrap();
        fs::set_permissions(&report.psk_path, fs::Permissions::from_mode(0o644)).unwrap();
        let err = load_psk(&report.psk_path).unwrap_err();
        assert!(
            matches!(err, KeyError::TooOpen { mode: 0o644, .. }),
            "{err:?}"
        );
        let msg = err.to_string();
        assert!(
            msg.contains("chmod 600") && msg.contains("mesh.key"),
            "{msg}"
        );

        let missing = load_psk(&dir.path().join("nope.key"))
            .unwrap_err()
            .to_string();
        assert!(
            missing.contains("mesh init") && missing.contains("copy mesh.key"),
            "{missing}"
        );

        let bad = dir.path().join("bad.key");
        write_private(&bad, b"hello\n").unwrap();
        let err = load_psk(&bad).unwrap_err();
        assert!(matches!(err, KeyError::BadPsk { .. }), "{err:?}");
        assert!(err.to_string().contains("bad.key"), "{err}");
    }

    #[test]
    fn a_mesh_key_reads_back_what_it_writes_and_says_what_is_wrong() {
        let key = MeshKey::new([0xab; 32]);
        let text = key.to_string();
        assert_eq!(
            text,
            format!("/key/swarm/psk/1.0.0/\n/base16/\n{}\n", "ab".repeat(32))
        );
        assert_eq!(text.parse::<MeshKey>(), Ok(key.clone()));
        // Upper-case hex and no final newline, as other tools may write it.
        let upper = format!("/key/swarm/psk/1.0.0/\n/base16/\n{}", "AB".repeat(32));
        assert_eq!(upper.parse::<MeshKey>(), Ok(key.clone()));
        assert_eq!(key.fingerprint().len(), 32);
        assert_ne!(key.fingerprint(), MeshKey::new([0xac; 32]).fingerprint());
        assert!(!format!("{key:?}").contains("abab"), "{key:?}");
        for (bad, why) in [
            ("hello\n", "three lines"),
            ("/key/swarm/psk/2.0.0/\n/base16/\naa\n", "first line"),
            ("/key/swarm/psk/1.0.0/\n/base64/\naa\n", "second line"),
            ("/key/swarm/psk/1.0.0/\n/base16/\naa\n", "64 hex digits"),
        ] {
            let err = bad.parse::<MeshKey>().unwrap_err();
            assert!(err.contains(why), "{bad:?}: {err}");
        }
        let odd = format!("/key/swarm/psk/1.0.0/\n/base16/\n{}zz\n", "ab".repeat(31));
        assert!(odd.parse::<MeshKey>().unwrap_err().contains("hex digit"));
    }

    #[test]
    fn node_id_is_the_big_endian_prefix_of_blake3() {
        let peer = Keypair::generate_ed25519().public().to_peer_id();
        let hash = blake3::hash(&peer.to_bytes());
        let expected = u64::from_be_bytes(hash.as_bytes()[..8].try_into().unwrap());
        assert_eq!(node_id(&peer), NodeId(expected));
        assert_eq!(node_id(&peer), node_id(&peer));
    }
}
