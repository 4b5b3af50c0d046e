//! The node's network layer: a libp2p swarm on TCP, noise bound to the mesh key, peer messages and files on streams, requests by request-response.
//!
//! Everything here is plumbing the node loop drives: it builds the swarm,
//! encodes what goes on the wire (postcard, see [`mesh_protocol::wire`]) and
//! turns libp2p's errors into sentences a user can act on. It makes no
//! decision about the mesh itself.
//!
//! mDNS discovery (the `mdns` feature, off by default) finds nodes of the
//! same LAN without an address to join; the field is always there, as a
//! `Toggle` of a do-nothing behaviour when the feature is off, so the event
//! enum the node loop matches on keeps its shape.

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use libp2p::core::muxing::StreamMuxerBox;
use libp2p::core::transport::timeout::{TransportTimeout, TransportTimeoutError};
use libp2p::core::transport::{Boxed, Transport};
use libp2p::core::upgrade::{InboundConnectionUpgrade, OutboundConnectionUpgrade};
use libp2p::identity::Keypair;
use libp2p::request_response::{self, ProtocolSupport};
use libp2p::swarm::behaviour::toggle::Toggle;
use libp2p::swarm::{DialError, ListenError, NetworkBehaviour};
use libp2p::{identify, noise, ping, tcp, yamux, Multiaddr, PeerId, StreamProtocol, Swarm};
use mesh_protocol::wire::{Request, Response, MESSAGE_MAX, PROTOCOL_VERSION, REQUEST_PROTOCOL};
use serde::de::DeserializeOwned;
use serde::Serialize;
use thiserror::Error;

use crate::keys::MeshKey;

/// How long a connection with no open stream is kept. A node keeps only
/// the connections it uses (its coordinator, and whoever it exchanges
/// tasks or files with now; see `mesh_node/net/links.rs`): the rest close.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(10);
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// For the TCP connection alone, so an unreachable address is told apart from a failed handshake.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// For the mesh's handshake after TCP connects (preamble, noise). A node
/// that accepted the connection and says nothing for this long is paused
/// or overloaded (a node with another mesh key or version says so at once:
/// see [`Handshake`]).
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// What both sides of a connection send first, in clear, before the
/// protocol version: this port speaks mesh. It is all a prober without the
/// key reads before noise (see [`Handshake`]).
const MAGIC: &[u8; 8] = b"mesh/p2p";

#[derive(NetworkBehaviour)]
pub struct Behaviour {
    pub identify: identify::Behaviour,
    pub ping: ping::Behaviour,
    pub rr: request_response::Behaviour<Codec>,
    /// The streams of messages for peers' engines ([`PEER_PROTOCOL`]).
    pub peer_streams: libp2p_stream::Behaviour,
    pub mdns: Mdns,
}

/// LAN discovery, when built with the `mdns` feature and asked for.
#[cfg(feature = "mdns")]
pub type Mdns = Toggle<libp2p::mdns::tokio::Behaviour>;
/// LAN discovery is not built in (the `mdns` feature is off).
#[cfg(not(feature = "mdns"))]
pub type Mdns = Toggle<libp2p::swarm::dummy::Behaviour>;

pub struct NetConfig {
    pub listen: Vec<Multiaddr>,
    pub psk: MeshKey,
    pub identity: Keypair,
    pub idle_timeout: Duration,
    pub request_timeout: Duration,
    /// Find nodes on the LAN by mDNS (only with the `mdns` feature).
    pub mdns: bool,
}

impl NetConfig {
    /// A configuration with the default timeouts.
    pub fn new(listen: Vec<Multiaddr>, psk: MeshKey, identity: Keypair) -> NetConfig {
        NetConfig {
            listen,
            psk,
            identity,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            mdns: false,
        }
    }
}

#[derive(Debug, Error)]
pub enum NetError {
    #[error("cannot set up the noise handshake: {0}")]
    Noise(#[from] noise::Error),
    #[error("cannot start mDNS: {0}")]
    Mdns(String),
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: Multiaddr,
        source: libp2p::TransportError<io::Error>,
    },
    #[error("cannot listen on {0}: another process listens there already (another mesh node?); stop it, or give this node another port")]
    PortTaken(Multiaddr),
}

/// The TCP port of an address (0: the system picks one), if it names one.
pub fn tcp_port(addr: &Multiaddr) -> Option<u16> {
    use libp2p::multiaddr::Protocol;
    addr.iter().find_map(|p| match p {
        Protocol::Tcp(port) => Some(port),
        _ => None,
    })
}

/// The address with its TCP port replaced by `port`.
pub fn with_tcp_port(addr: &Multiaddr, port: u16) -> Multiaddr {
    use libp2p::multiaddr::Protocol;
    addr.iter()
        .map(|p| match p {
            Protocol::Tcp(_) => Protocol::Tcp(port),
            p => p,
        })
        .collect()
}

/// Nothing listens on this address's fixed TCP port now.
pub fn port_free(addr: &Multiaddr) -> bool {
    check_port_free(addr).is_ok()
}

/// Refuses a fixed TCP port that something already listens on. libp2p
/// binds its listeners with SO_REUSEPORT, so a second node of the same
/// user on the same port would start and silently share the connections
/// with the first (the kernel hands each new one to either); a plain bind
/// (SO_REUSEADDR only, as std does) fails on a live listener, and not on
/// the connections a node killed a moment ago left in TIME_WAIT.
fn check_port_free(addr: &Multiaddr) -> Result<(), NetError> {
    use libp2p::multiaddr::Protocol;
    let mut it = addr.iter();
    let ip: std::net::IpAddr = match it.next() {
        Some(Protocol::Ip4(ip)) => ip.into(),
        Some(Protocol::Ip6(ip)) => ip.into(),
        _ => return Ok(()),
    };
    let port = match it.next() {
        Some(Protocol::Tcp(p)) if p != 0 => p,
        _ => return Ok(()),
    };
    match std::net::TcpListener::bind((ip, port)) {
        Err(e) if e.kind() == io::ErrorKind::AddrInUse => Err(NetError::PortTaken(addr.clone())),
        // Anything else (an address not on this machine) libp2p reports itself.
        _ => Ok(()),
    }
}

/// The libp2p protocol version string of this build; peers must match it exactly.
pub fn protocol_version() -> String {
    format!("/mesh/{PROTOCOL_VERSION}")
}

/// Builds the swarm, listening on every `cfg.listen` address.
pub fn build(cfg: NetConfig) -> Result<Swarm<Behaviour>, NetError> {
    for addr in &cfg.listen {
        check_port_free(addr)?;
    }
    let behaviour = behaviour(&cfg.identity, cfg.request_timeout, cfg.mdns)?;
    let mut swarm = swarm(
        cfg.identity,
        &cfg.psk,
        PROTOCOL_VERSION,
        behaviour,
        cfg.idle_timeout,
    )?;
    for addr in cfg.listen {
        if let Err(source) = swarm.listen_on(addr.clone()) {
            return Err(NetError::Listen { addr, source });
        }
    }
    Ok(swarm)
}

/// What a command line's swarm does: its own streams, and pings, whose
/// failure (the node's machine gone, the network cut) ends a `mesh wait`
/// that would otherwise wait on a dead connection for ever.
#[derive(NetworkBehaviour)]
pub struct ClientBehaviour {
    pub streams: libp2p_stream::Behaviour,
    pub ping: ping::Behaviour,
}

/// A swarm that only dials, for a command line on a machine that runs no
/// node (`mesh --mesh ADDR ...`): the same transport behind the mesh key,
/// a throwaway identity, and nothing but streams it opens itself.
pub fn client(psk: &MeshKey) -> Result<Swarm<ClientBehaviour>, NetError> {
    let behaviour = ClientBehaviour {
        streams: libp2p_stream::Behaviour::new(),
        ping: ping::Behaviour::default(),
    };
    swarm(
        Keypair::generate_ed25519(),
        psk,
        PROTOCOL_VERSION,
        behaviour,
        DEFAULT_IDLE_TIMEOUT,
    )
}

/// A swarm of `behaviour` on the mesh's transport, for a node and a
/// command line alike; connections with no open stream close after `idle`.
/// (`version` is [`PROTOCOL_VERSION`] but in tests of another version.)
fn swarm<B: NetworkBehaviour>(
    identity: Keypair,
    psk: &MeshKey,
    version: u32,
    behaviour: B,
    idle: Duration,
) -> Result<Swarm<B>, NetError> {
    let transport = transport(&identity, psk, version)?;
    Ok(libp2p::SwarmBuilder::with_existing_identity(identity)
        .with_tokio()
        .with_other_transport(|_| transport)
        .unwrap_or_else(|never| match never {})
        .with_behaviour(|_| behaviour)
        .unwrap_or_else(|never| match never {})
        .with_swarm_config(|c| c.with_idle_connection_timeout(idle))
        // The swarm's timeout covers a whole dial: connect, then handshakes.
        .with_connection_timeout(CONNECT_TIMEOUT + HANDSHAKE_TIMEOUT)
        .build())
}

/// TCP, then the mesh's handshake (a clear preamble, then noise with the
/// mesh key in its prologue: [`Handshake`]), then yamux.
///
/// No multistream-select: both sides know what comes once the preamble
/// has shown the same version, which spares its round trips and its
/// protocol names in clear.
fn transport(
    identity: &Keypair,
    psk: &MeshKey,
    version: u32,
) -> Result<Boxed<(PeerId, StreamMuxerBox)>, NetError> {
    let handshake = Handshake::new(identity, psk, version)?;
    let connect = TransportTimeout::with_outgoing_timeout(
        tcp::tokio::Transport::new(tcp::Config::new().nodelay(true)),
        CONNECT_TIMEOUT,
    )
    .map_err(|e| {
        ConnectError(match e {
            TransportTimeoutError::Timeout => io::Error::new(
                io::ErrorKind::TimedOut,
                format!("no TCP connection within {CONNECT_TIMEOUT:?}"),
            ),
            TransportTimeoutError::TimerError(e) | TransportTimeoutError::Other(e) => e,
        })
    });
    let tcp = connect
        .and_then(move |socket, endpoint| handshake.run(socket, endpoint.is_dialer()))
        .map(|(peer, muxer), _| (peer, StreamMuxerBox::new(muxer)))
        .boxed();
    #[cfg(feature = "quic")]
    let tcp = {
        // QUIC does its own TLS handshake on UDP, without the mesh's
        // preamble or noise: a QUIC listener admits anyone who can reach
        // it, mesh.key or not. Only listen on QUIC addresses on a trusted
        // network.
        let quic = libp2p::quic::tokio::Transport::new(libp2p::quic::Config::new(identity))
            .map(|(peer, muxer), _| (peer, StreamMuxerBox::new(muxer)));
        tcp.or_transport(quic)
            .map(|either, _| either.into_inner())
            .boxed()
    };
    Ok(tcp)
}

/// Why the mesh's own handshake on a new connection failed.
#[derive(Debug, Error)]
pub enum KeyCheckError {
    #[error("the other node uses another mesh key")]
    WrongKey,
    #[error("the other node speaks mesh protocol {0}, this one {PROTOCOL_VERSION}")]
    Version(u32),
    /// What a node of protocol 16 or older sends first (pnet's nonce) reads so too.
    #[error(
        "the other side does not open with the mesh's handshake (a node of mesh protocol \
         16 or older, or not a mesh node), this one speaks mesh protocol {PROTOCOL_VERSION}"
    )]
    NotMesh,
    #[error("no answer within {0:?}")]
    Silent(Duration),
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("noise: {0}")]
    Noise(noise::Error),
}

/// A failed [`Handshake`], as the transport reports it. libp2p's
/// `Either` errors report their inner error's source rather than the
/// inner error, so the `KeyCheckError` is this wrapper's source, where
/// `dial_fault` finds it (as `ConnectError` does for TCP's).
#[derive(Debug, Error)]
#[error("{0}")]
struct KeyCheckFailed(#[source] KeyCheckError);

/// The mesh's handshake on a new TCP connection: a preamble both ways in
/// clear ([`MAGIC`], then the protocol version), then noise's XX with a
/// prologue derived from the mesh key, then yamux.
///
/// The preamble tells a node of another version (or no mesh node) at
/// once, on both sides. The prologue binds the key into noise: both sides
/// hash it into the handshake, and a side with another key fails to
/// verify the first message that carries a tag (the listener's, the
/// second), so the dialer knows for certain; it then sends a third
/// message that cannot verify either ([`REFUSAL`]), so the listener knows
/// at once too, rather than from a connection closed in the middle of the
/// handshake (which a dial given up for another address also does). The
/// prologue ends with the preamble, so what was said in clear is checked
/// as well. What a prober without the key learns is in docs/mesh.md
/// ("What the mesh key keeps out").
#[derive(Clone)]
struct Handshake {
    noise: noise::Config,
    /// The key's part of the prologue: derived, never the key itself.
    bound: [u8; 32],
    version: u32,
}

/// The dialer's third handshake message when the listener's second did not
/// verify: the size of a real one (an encrypted static key and an empty
/// payload's tag), all zeros, which the listener's noise refuses as it
/// refuses a message under another key.
const REFUSAL: [u8; 2 + 48 + 16] = {
    let mut r = [0u8; 66];
    r[1] = 64;
    r
};

impl Handshake {
    fn new(identity: &Keypair, psk: &MeshKey, version: u32) -> Result<Handshake, NetError> {
        Ok(Handshake {
            noise: noise::Config::new(identity)?,
            bound: psk.derive("mesh 2026 noise prologue"),
            version,
        })
    }

    fn preamble(&self) -> [u8; 12] {
        let mut p = [0u8; 12];
        p[..8].copy_from_slice(MAGIC);
        p[8..].copy_from_slice(&self.version.to_be_bytes());
        p
    }

    async fn run<S>(
        self,
        mut socket: S,
        dialer: bool,
    ) -> Result<(PeerId, yamux::Muxer<noise::Output<Tap<S>>>), KeyCheckFailed>
    where
        S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    {
        let check = async move {
            let mine = self.preamble();
            socket.write_all(&mine).await?;
            socket.flush().await?;
            let mut theirs = [0u8; 12];
            socket.read_exact(&mut theirs).await?;
            if theirs[..8] != MAGIC[..] {
                return Err(KeyCheckError::NotMesh);
            }
            let version = u32::from_be_bytes(theirs[8..].try_into().expect("4 bytes"));
            if version != self.version {
                return Err(KeyCheckError::Version(version));
            }
            let mut prologue = self.bound.to_vec();
            prologue.extend_from_slice(&mine);
            let noise = self.noise.with_prologue(prologue);
            let tap = Tap(Arc::new(Mutex::new(socket)));
            let mut back = Tap(tap.0.clone());
            let done = if dialer {
                noise.upgrade_outbound(tap, "/noise").await
            } else {
                noise.upgrade_inbound(tap, "/noise").await
            };
            let (peer, io) = match done {
                Ok(ok) => ok,
                Err(e) if other_key(&e) => {
                    if dialer {
                        // Best effort: the listener may be gone already.
                        let _ = back.write_all(&REFUSAL).await;
                        let _ = back.close().await;
                    }
                    return Err(KeyCheckError::WrongKey);
                }
                Err(e) => return Err(KeyCheckError::Noise(e)),
            };
            drop(back);
            // Infallible in fact: a yamux "upgrade" only wraps the stream.
            let muxer = if dialer {
                yamux::Config::default()
                    .upgrade_outbound(io, "/yamux/1.0.0")
                    .await
            } else {
                yamux::Config::default()
                    .upgrade_inbound(io, "/yamux/1.0.0")
                    .await
            }
            .map_err(|e| KeyCheckError::Io(io::Error::other(e)))?;
            Ok((peer, muxer))
        };
        tokio::time::timeout(HANDSHAKE_TIMEOUT, check)
            .await
            .unwrap_or(Err(KeyCheckError::Silent(HANDSHAKE_TIMEOUT)))
            .map_err(KeyCheckFailed)
    }
}

/// A handshake message that did not verify: the other side hashed another
/// prologue, so holds another mesh key (or sent [`REFUSAL`]).
fn other_key(e: &noise::Error) -> bool {
    let snow = match e {
        noise::Error::Noise(s) => Some(s),
        noise::Error::Io(io) => io.get_ref().and_then(|i| i.downcast_ref::<snow::Error>()),
        _ => None,
    };
    matches!(snow, Some(snow::Error::Decrypt))
}

/// A connection's socket shared by noise and [`Handshake`], so that a
/// dialer whose noise failed on the key still holds the socket to send
/// [`REFUSAL`] on (noise drops what it was given when it fails). The lock
/// is never contended: one side at a time uses it.
struct Tap<S>(Arc<Mutex<S>>);

impl<S> Tap<S> {
    fn get(&self) -> MutexGuard<'_, S> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Tap<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.get()).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Tap<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.get()).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.get()).poll_write_vectored(cx, bufs)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.get()).poll_flush(cx)
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.get()).poll_close(cx)
    }
}

/// What a failed dial means for whoever wants to try again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DialFault {
    /// Nothing took the connection: not started yet, gone, or out of reach.
    Unreachable,
    /// It took the connection and said nothing in time: paused, overloaded,
    /// or swamped by others joining (worth trying again).
    Silent,
    /// Another mesh key: trying again will not help.
    WrongKey,
    /// A node of another mesh version.
    Version,
    /// An address this node cannot dial at all (no transport for it).
    Unsupported,
    /// Anything else (a handshake cut short, a peer id that changed).
    Other,
}

impl DialFault {
    /// Trying again may work (the other node may come, wake or calm down).
    pub fn transient(self) -> bool {
        !matches!(
            self,
            DialFault::WrongKey | DialFault::Version | DialFault::Unsupported
        )
    }
}

/// Each address a failed dial tried, what its failure means, and the
/// cause in words.
pub fn dial_attempts(err: &DialError) -> Vec<(Multiaddr, DialFault, String)> {
    let DialError::Transport(attempts) = err else {
        return Vec::new();
    };
    attempts
        .iter()
        .map(|(addr, e)| {
            let (fault, cause) = match e {
                libp2p::TransportError::MultiaddrNotSupported(_) => (
                    DialFault::Unsupported,
                    "address not supported by this node".to_string(),
                ),
                libp2p::TransportError::Other(io) => {
                    let fault = io_fault(io);
                    let cause = match fault {
                        DialFault::WrongKey => "it uses another mesh key: copy mesh.key from \
                                                a node of the mesh into this node's state folder"
                            .to_string(),
                        DialFault::Version => format!("{}: upgrade the older node", io_chain(io)),
                        DialFault::Silent => "it took the connection but did not answer in \
                                              time: paused, or overloaded"
                            .to_string(),
                        DialFault::Other => format!("the handshake failed ({})", io_chain(io)),
                        DialFault::Unreachable | DialFault::Unsupported => io_chain(io),
                    };
                    (fault, cause)
                }
            };
            (addr.clone(), fault, cause)
        })
        .collect()
}

/// What a failed dial means: the most definite fault of its attempts.
pub fn dial_fault(err: &DialError) -> DialFault {
    dial_attempts(err)
        .into_iter()
        .map(|(_, f, _)| f)
        .min_by_key(|f| match f {
            DialFault::WrongKey => 0,
            DialFault::Version => 1,
            DialFault::Unsupported => 2,
            DialFault::Silent => 3,
            DialFault::Other => 4,
            DialFault::Unreachable => 5,
        })
        .unwrap_or(DialFault::Other)
}

/// The fault of an inbound connection that failed its handshake, when it
/// is one the accepting node's user should hear of (another mesh key or
/// version), and the sentence that says so.
pub fn listen_fault(err: &ListenError) -> Option<(DialFault, String)> {
    let ListenError::Transport(libp2p::TransportError::Other(io)) = err else {
        return None;
    };
    match io_fault(io) {
        DialFault::WrongKey => Some((DialFault::WrongKey, "it uses another mesh key".into())),
        DialFault::Version => Some((DialFault::Version, io_chain(io))),
        _ => None,
    }
}

fn io_fault(io: &io::Error) -> DialFault {
    if is_connect_failure(io) {
        return DialFault::Unreachable;
    }
    let check = causes(io).find_map(|c| c.downcast_ref::<KeyCheckError>());
    match check {
        Some(KeyCheckError::WrongKey) => DialFault::WrongKey,
        Some(KeyCheckError::Version(_) | KeyCheckError::NotMesh) => DialFault::Version,
        Some(KeyCheckError::Silent(_)) => DialFault::Silent,
        Some(KeyCheckError::Io(_) | KeyCheckError::Noise(_)) => DialFault::Other,
        // The swarm's own limit on a whole dial: the node did not finish
        // the handshake in time.
        None if causes(io).any(|c| {
            matches!(
                c.downcast_ref::<TransportTimeoutError<io::Error>>(),
                Some(TransportTimeoutError::Timeout)
            )
        }) =>
        {
            DialFault::Silent
        }
        None => DialFault::Other,
    }
}

fn behaviour(
    identity: &Keypair,
    request_timeout: Duration,
    mdns: bool,
) -> Result<Behaviour, NetError> {
    let identify = identify::Behaviour::new(
        identify::Config::new(protocol_version(), identity.public())
            .with_agent_version(format!("mesh/{}", env!("CARGO_PKG_VERSION"))),
    );
    let rr = request_response::Behaviour::new(
        [(StreamProtocol::new(REQUEST_PROTOCOL), ProtocolSupport::Full)],
        request_response::Config::default().with_request_timeout(request_timeout),
    );
    #[cfg(feature = "mdns")]
    let mdns = Toggle::from(if mdns {
        Some(
            libp2p::mdns::tokio::Behaviour::new(
                libp2p::mdns::Config::default(),
                identity.public().to_peer_id(),
            )
            .map_err(|e| NetError::Mdns(e.to_string()))?,
        )
    } else {
        None
    });
    #[cfg(not(feature = "mdns"))]
    let mdns = {
        let _ = mdns;
        Toggle::from(None)
    };
    Ok(Behaviour {
        identify,
        ping: ping::Behaviour::default(),
        rr,
        peer_streams: libp2p_stream::Behaviour::new(),
        mdns,
    })
}

/// Whether a peer's identify protocol version is ours.
///
/// The error is the end of a sentence that starts with the peer, as
/// [`check_identified`] writes it: `peer {peer} {error}`.
pub fn check_version(theirs: &str) -> Result<(), String> {
    let ours = protocol_version();
    if theirs == ours {
        Ok(())
    } else {
        Err(format!(
            "speaks {theirs}, this node speaks {ours}: upgrade the older node"
        ))
    }
}

/// On `identify::Event::Received`: disconnects a peer of another protocol
/// version and says why, so old and new nodes never exchange messages they
/// would misread.
pub fn check_identified(
    swarm: &mut Swarm<Behaviour>,
    peer: PeerId,
    info: &identify::Info,
) -> Result<(), String> {
    check_version(&info.protocol_version).map_err(|e| {
        // Already gone is as good as disconnected.
        let _ = swarm.disconnect_peer_id(peer);
        format!("peer {peer} {e}")
    })
}

/// A dial error as a sentence, naming the cause when the handshake failed.
///
/// A node of another mesh key or version is told by the mesh's handshake
/// ([`Handshake`]); a node that accepted the connection and said
/// nothing in time is paused or overloaded; refused, unreachable or silent
/// addresses fail in TCP's connect (see `ConnectError`).
pub fn explain_dial_error(err: &DialError) -> String {
    let attempts = dial_attempts(err);
    if attempts.is_empty() {
        return format!("dial failed: {err}");
    }
    let lines: Vec<String> = attempts
        .into_iter()
        .map(|(addr, _, cause)| format!("{addr}: {cause}"))
        .collect();
    format!("dial failed: {}", lines.join("; "))
}

/// A failure to open the TCP connection itself, before any handshake.
///
/// libp2p's `Either` error wrappers report their inner error's source, not
/// the inner error, so a bare io::Error from TCP would be invisible to
/// [`explain_dial_error`]; this wrapper's source is that io::Error.
#[derive(Debug, Error)]
#[error("{0}")]
struct ConnectError(#[source] io::Error);

/// TCP could not connect at all: nothing is listening, or the host is out of reach.
fn is_connect_failure(e: &io::Error) -> bool {
    // The swarm wraps the transport's error in io::Errors of kind Other; the
    // kind that tells is on the innermost one.
    causes(e).any(|c| {
        c.downcast_ref::<io::Error>().is_some_and(|io| {
            matches!(
                io.kind(),
                io::ErrorKind::ConnectionRefused
                    | io::ErrorKind::HostUnreachable
                    | io::ErrorKind::NetworkUnreachable
                    | io::ErrorKind::AddrNotAvailable
                    | io::ErrorKind::TimedOut
            )
        })
    })
}

/// An error and everything inside it, outermost first.
///
/// `io::Error::source` skips the error an `io::Error` wraps (it returns that
/// error's source), so wrapped errors are reached through `get_ref`.
fn causes<'a>(
    e: &'a (dyn std::error::Error + 'static),
) -> impl Iterator<Item = &'a (dyn std::error::Error + 'static)> {
    std::iter::successors(Some(e), |c| match c.downcast_ref::<io::Error>() {
        Some(io) => io.get_ref().map(|inner| inner as _),
        None => c.source(),
    })
}

/// An error and its causes, `outer: inner: innermost`, skipping repeats.
fn io_chain(e: &io::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    for c in causes(e) {
        let text = c.to_string();
        if !text.is_empty() && !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
    }
    parts.join(": ")
}

/// The request-response codec: one postcard value per frame, behind a
/// big-endian u32 length (the frames of the peer streams too).
#[derive(Clone, Copy, Debug, Default)]
pub struct Codec;

impl request_response::Codec for Codec {
    type Protocol = StreamProtocol;
    type Request = Request;
    type Response = Response;

    async fn read_request<T>(&mut self, _: &StreamProtocol, io: &mut T) -> io::Result<Request>
    where
        T: AsyncRead + Unpin + Send,
    {
        read_frame(io).await
    }

    async fn read_response<T>(&mut self, _: &StreamProtocol, io: &mut T) -> io::Result<Response>
    where
        T: AsyncRead + Unpin + Send,
    {
        read_frame(io).await
    }

    async fn write_request<T>(
        &mut self,
        _: &StreamProtocol,
        io: &mut T,
        req: Request,
    ) -> io::Result<()>
    where
        T: AsyncWrite + Unpin + Send,
    {
        write_frame(io, &req).await
    }

    async fn write_response<T>(
        &mut self,
        _: &StreamProtocol,
        io: &mut T,
        res: Response,
    ) -> io::Result<()>
    where
        T: AsyncWrite + Unpin + Send,
    {
        write_frame(io, &res).await
    }
}

fn too_big(size: usize) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("frame of {size} bytes is over the limit of {MESSAGE_MAX} bytes"),
    )
}

pub async fn read_frame<T, V>(io: &mut T) -> io::Result<V>
where
    T: AsyncRead + Unpin + Send,
    V: DeserializeOwned,
{
    let mut prefix = [0u8; 4];
    io.read_exact(&mut prefix).await?;
    let size = u32::from_be_bytes(prefix) as usize;
    if size > MESSAGE_MAX {
        return Err(too_big(size));
    }
    // Grow with what actually arrives rather than trusting the prefix
    // with an allocation up front.
    let mut data = Vec::new();
    io.take(size as u64).read_to_end(&mut data).await?;
    if data.len() != size {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("frame ended after {} of {size} bytes", data.len()),
        ));
    }
    postcard::from_bytes(&data).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

pub async fn write_frame<T, V>(io: &mut T, value: &V) -> io::Result<()>
where
    T: AsyncWrite + Unpin + Send,
    V: Serialize,
{
    // Prefix and value in one write: one muxer frame, not two.
    let mut frame = postcard::to_extend(value, vec![0u8; 4])
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    let len = frame.len() - 4;
    // Refused here too: the peer would refuse it after we sent it all.
    if len > MESSAGE_MAX {
        return Err(too_big(len));
    }
    let size = u32::try_from(len).map_err(|_| too_big(len))?;
    frame[..4].copy_from_slice(&size.to_be_bytes());
    io.write_all(&frame).await?;
    io.flush().await
}

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::HashMap;
    use std::sync::Arc;

    use futures::StreamExt;
    use libp2p::request_response::{Codec as _, Event as RrEvent, Message as RrMessage};
    use libp2p::swarm::SwarmEvent;
    use mesh_protocol::farm::TaskRef;
    use mesh_protocol::mesh::{
        Beat, FarmId, Ident, MachineLoad, Msg, NodeId, RosterEntry, RosterKind, Started, Victim,
    };
    use mesh_protocol::resources::{Amount, Resources, CPU};
    use mesh_protocol::wire::PEER_PROTOCOL;
    use tokio::time::timeout;

    use super::*;

    const WAIT: Duration = Duration::from_secs(20);

    fn psk(byte: u8) -> MeshKey {
        MeshKey::new([byte; 32])
    }

    #[test]
    fn a_fixed_port_something_listens_on_is_refused_a_free_one_is_not() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = taken.local_addr().unwrap().port();
        let addr: Multiaddr = format!("/ip4/127.0.0.1/tcp/{port}").parse().unwrap();
        let err = check_port_free(&addr).unwrap_err();
        assert!(matches!(err, NetError::PortTaken(_)), "{err}");
        assert!(err.to_string().contains("another mesh node"), "{err}");
        drop(taken);
        check_port_free(&addr).unwrap();
        // Port 0 (the system picks) and non-TCP addresses are not checked.
        check_port_free(&"/ip4/127.0.0.1/tcp/0".parse().unwrap()).unwrap();
        check_port_free(&"/ip4/127.0.0.1/udp/9/quic-v1".parse().unwrap()).unwrap();
    }

    fn node(key: MeshKey) -> Swarm<Behaviour> {
        let listen = vec!["/ip4/127.0.0.1/tcp/0".parse().unwrap()];
        build(NetConfig::new(listen, key, Keypair::generate_ed25519())).unwrap()
    }

    async fn listen_addr(swarm: &mut Swarm<Behaviour>) -> Multiaddr {
        timeout(WAIT, async {
            loop {
                if let SwarmEvent::NewListenAddr { address, .. } = swarm.select_next_some().await {
                    return address;
                }
            }
        })
        .await
        .expect("no listen address")
    }

    /// Two swarms of one mesh key, `a` connected to `b` and both driven by
    /// a task of their own, with what opens streams from `a` and what
    /// takes them on `b`.
    pub(crate) struct LinkedPair {
        pub a: PeerId,
        pub b: PeerId,
        pub a_control: libp2p_stream::Control,
        pub b_incoming: libp2p_stream::IncomingStreams,
        pub swarms: tokio::task::JoinHandle<()>,
    }

    pub(crate) async fn linked_pair() -> LinkedPair {
        let (mut a, mut b) = (node(psk(7)), node(psk(7)));
        let b_addr = listen_addr(&mut b).await;
        let (a_id, b_id) = (*a.local_peer_id(), *b.local_peer_id());
        let a_control = a.behaviour().peer_streams.new_control();
        let b_incoming = b
            .behaviour()
            .peer_streams
            .new_control()
            .accept(StreamProtocol::new(PEER_PROTOCOL))
            .expect("accepted once");
        a.dial(b_addr).expect("dial");
        timeout(WAIT, async {
            loop {
                tokio::select! {
                    ev = a.select_next_some() => {
                        if matches!(ev, SwarmEvent::ConnectionEstablished { .. }) {
                            return;
                        }
                    }
                    _ = b.select_next_some() => {}
                }
            }
        })
        .await
        .expect("no connection in time");
        let swarms = tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = a.select_next_some() => {}
                    _ = b.select_next_some() => {}
                }
            }
        });
        LinkedPair {
            a: a_id,
            b: b_id,
            a_control,
            b_incoming,
            swarms,
        }
    }

    fn resources(cpus: u64) -> Resources {
        let mut r = Resources::new();
        r.set(CPU, Amount::units(cpus));
        r
    }

    #[tokio::test(flavor = "current_thread")]
    async fn requests_and_responses_cross_two_swarms() {
        let (mut a, mut b) = (node(psk(1)), node(psk(1)));
        let b_addr = listen_addr(&mut b).await;
        let b_id = *b.local_peer_id();
        let (farm, task) = (FarmId(42), TaskRef::new(1, 5));
        let rr = &mut a.behaviour_mut().rr;
        let where_req =
            rr.send_request_with_addresses(&b_id, Request::WhereRan { farm, task }, vec![b_addr]);
        let log_req = rr.send_request(
            &b_id,
            Request::TaskLog {
                farm: FarmId(42),
                task,
                attempt: Some(2),
                offsets: (1 << 33, 7),
            },
        );

        let mut responses = HashMap::new();
        let mut requests = Vec::new();
        timeout(WAIT, async {
            while responses.len() < 2 {
                tokio::select! {
                    ev = a.select_next_some() => match ev {
                        SwarmEvent::Behaviour(BehaviourEvent::Rr(RrEvent::Message {
                            message: RrMessage::Response { request_id, response }, ..
                        })) => {
                            responses.insert(request_id, response);
                        }
                        SwarmEvent::Behaviour(BehaviourEvent::Rr(RrEvent::OutboundFailure {
                            error, ..
                        })) => panic!("request failed: {error}"),
                        _ => {}
                    },
                    ev = b.select_next_some() => {
                        if let SwarmEvent::Behaviour(BehaviourEvent::Rr(RrEvent::Message {
                            message: RrMessage::Request { request, channel, .. }, ..
                        })) = ev {
                            let response = match &request {
                                Request::WhereRan { .. } => Response::Ran { node: Some(NodeId(3)), running: true },
                                _ => Response::Log { attempt: Some(2), out: vec![1, 2, 3], err: Vec::new(), running: false },
                            };
                            requests.push(request);
                            b.behaviour_mut().rr.send_response(channel, response).unwrap();
                        }
                    }
                }
            }
        })
        .await
        .expect("no responses in time");

        assert_eq!(requests.len(), 2);
        assert!(requests.iter().any(
            |r| matches!(r, Request::WhereRan { farm: f, task: t } if *f == farm && *t == task)
        ));
        assert!(requests.iter().any(|r| matches!(
            r,
            Request::TaskLog { farm: FarmId(42), offsets: (o, 7), .. } if *o == 1 << 33
        )));
        assert!(matches!(
            responses[&where_req],
            Response::Ran {
                node: Some(NodeId(3)),
                running: true
            }
        ));
        assert!(matches!(
            &responses[&log_req],
            Response::Log { out, .. } if out == &[1, 2, 3]
        ));
    }

    #[tokio::test(flavor = "current_thread")]
    async fn frames_of_messages_cross_one_stream_in_order() {
        let p = linked_pair().await;
        let (a_id, b_id, mut a_control, mut incoming) = (p.a, p.b, p.a_control, p.b_incoming);
        let mut frames: Vec<Vec<Msg>> = (0..3u64)
            .map(|i| {
                (0..=i)
                    .map(|j| Msg::Stolen {
                        id: i * 10 + j,
                        tasks: Vec::new(),
                    })
                    .collect()
            })
            .collect();
        // A coordinator's answer to a report, every field set.
        frames.push(vec![
            Msg::Beat(Arc::new(Beat {
                version: PROTOCOL_VERSION,
                label: a_id.to_string(),
                addrs: vec!["/ip4/127.0.0.1/tcp/4001".into()],
                term: 3,
                coordinator: Some(NodeId(11)),
                total: resources(8).into(),
                used: resources(2).into(),
                queued: 4,
                running: 2,
                started: vec![Started {
                    farm: FarmId(0x2643_e22c),
                    stage: 1,
                    tasks: 2,
                }]
                .into(),
                backlog: 100,
                prefetch: 3,
                job: Some("4242_1".into()),
                ends_in_ms: Some(60_000),
                allocs: (3, 7),
                ask: false,
                interval_ms: 750,
                victims: vec![Victim {
                    node: NodeId(12),
                    queued: 40,
                    prefetch: 2,
                }]
                .into(),
                roster: 0x5eed,
                health: 2,
                late_cores: 1,
                late_gpus: 0,
                files_max: 1024,
                idle: false,
                // A report's field, set here too: every field travels.
                claimed: vec![mesh_protocol::mesh::Assigned {
                    farm: mesh_protocol::mesh::FarmId(0xfa4d),
                    task: mesh_protocol::TaskRef { stage: 1, index: 9 },
                    attempt: 2,
                }],
                clock: 123_456,
                seen: 123_000,
                gpus: vec![("3".into(), "NVIDIA H200".into())],
                machine: Some(MachineLoad {
                    load_centi: 150,
                    cpus: 16,
                    mem_used: 1 << 30,
                    mem_total: 8 << 30,
                    measure: mesh_protocol::mesh::Measure::CgroupV1,
                }),
            })),
            Msg::Swim(vec![1, 2, 3]),
            Msg::Roster {
                kind: RosterKind::Answer,
                digest: 0x5eed,
                members: vec![RosterEntry::alive(Ident::new(
                    NodeId(12),
                    7,
                    b_id.to_string(),
                    vec!["/ip4/127.0.0.1/tcp/4002".into()],
                ))],
            },
        ]);
        let got = timeout(WAIT, async {
            let mut out = a_control
                .open_stream(b_id, StreamProtocol::new(PEER_PROTOCOL))
                .await
                .expect("stream opened");
            for f in &frames {
                write_frame(&mut out, f).await.expect("frame written");
            }
            let (from, mut inp) = incoming.next().await.expect("a stream");
            assert_eq!(from, a_id);
            let mut got = Vec::new();
            for _ in 0..frames.len() {
                got.push(
                    read_frame::<_, Vec<Msg>>(&mut inp)
                        .await
                        .expect("frame read"),
                );
            }
            got
        })
        .await
        .expect("no frames in time");
        p.swarms.abort();
        assert_eq!(got, frames);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn the_codec_refuses_frames_over_the_limit() {
        let mut frame = ((MESSAGE_MAX + 1) as u32).to_be_bytes().to_vec();
        frame.extend_from_slice(&[0; 16]);
        let protocol = StreamProtocol::new(REQUEST_PROTOCOL);
        let err = Codec
            .read_request(&protocol, &mut futures::io::Cursor::new(frame))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        let text = err.to_string();
        assert!(text.contains(&(MESSAGE_MAX + 1).to_string()), "{text}");
        assert!(text.contains(&MESSAGE_MAX.to_string()), "{text}");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn the_codec_round_trips_and_notices_a_short_frame() {
        let protocol = StreamProtocol::new(REQUEST_PROTOCOL);
        let mut buf = futures::io::Cursor::new(Vec::new());
        let sent = Response::Error("no such blob".into());
        Codec
            .write_response(&protocol, &mut buf, sent)
            .await
            .unwrap();
        let mut bytes = buf.into_inner();
        let got = Codec
            .read_response(&protocol, &mut futures::io::Cursor::new(bytes.clone()))
            .await
            .unwrap();
        assert!(matches!(got, Response::Error(s) if s == "no such blob"));
        bytes.pop();
        let err = Codec
            .read_response(&protocol, &mut futures::io::Cursor::new(bytes))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
    }

    /// `a` dials a plain TCP listener on 127.0.0.1:`port` (not a node):
    /// the dial's error.
    async fn dial_error_from(a: &mut Swarm<Behaviour>, port: u16) -> DialError {
        a.dial(
            format!("/ip4/127.0.0.1/tcp/{port}")
                .parse::<Multiaddr>()
                .unwrap(),
        )
        .unwrap();
        timeout(WAIT, async {
            loop {
                if let SwarmEvent::OutgoingConnectionError { error, .. } =
                    a.select_next_some().await
                {
                    return error;
                }
            }
        })
        .await
        .expect("no dial error in time")
    }

    /// `a` dials `b` until the dial failed on both sides, within the
    /// handshake's timeout: the dialer's error and the listener's;
    /// connected at all (`how`) fails the test.
    async fn dial_fails(
        mut a: Swarm<Behaviour>,
        mut b: Swarm<Behaviour>,
        how: &str,
    ) -> (DialError, ListenError) {
        let b_addr = listen_addr(&mut b).await;
        let started = std::time::Instant::now();
        a.dial(b_addr).unwrap();
        let (mut dial_error, mut refused) = (None, None);
        timeout(WAIT, async {
            while dial_error.is_none() || refused.is_none() {
                tokio::select! {
                    ev = a.select_next_some() => match ev {
                        SwarmEvent::OutgoingConnectionError { error, .. } => dial_error = Some(error),
                        SwarmEvent::ConnectionEstablished { .. } => panic!("connected {how}"),
                        _ => {}
                    },
                    ev = b.select_next_some() => match ev {
                        SwarmEvent::IncomingConnectionError { error, .. } => refused = Some(error),
                        SwarmEvent::ConnectionEstablished { .. } => panic!("accepted a peer {how}"),
                        _ => {}
                    }
                }
            }
        })
        .await
        .expect("the dial neither failed nor succeeded in time");
        assert!(
            started.elapsed() < HANDSHAKE_TIMEOUT,
            "{:?}",
            started.elapsed()
        );
        assert_eq!(a.connected_peers().count(), 0);
        assert_eq!(b.connected_peers().count(), 0);
        (dial_error.unwrap(), refused.unwrap())
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_dial_with_another_mesh_key_fails_at_once_on_both_sides_and_names_the_key() {
        // Told by noise's tags (and the dialer's refusal), not by a
        // handshake that times out (as a paused node's does).
        let (error, refused) = dial_fails(node(psk(3)), node(psk(4)), "with the wrong key").await;
        assert_eq!(dial_fault(&error), DialFault::WrongKey);
        assert!(!dial_fault(&error).transient());
        let text = explain_dial_error(&error);
        assert!(
            text.contains("another mesh key") && text.contains("mesh.key"),
            "{text}"
        );
        let (fault, why) = listen_fault(&refused).expect("a fault to tell");
        assert_eq!(fault, DialFault::WrongKey);
        assert!(why.contains("another mesh key"), "{why}");
    }

    /// A node of this mesh's key that speaks `version` on the wire.
    fn node_of_version(key: MeshKey, version: u32) -> Swarm<Behaviour> {
        let identity = Keypair::generate_ed25519();
        let behaviour = behaviour(&identity, DEFAULT_REQUEST_TIMEOUT, false).unwrap();
        let mut swarm = swarm(identity, &key, version, behaviour, DEFAULT_IDLE_TIMEOUT).unwrap();
        swarm
            .listen_on("/ip4/127.0.0.1/tcp/0".parse().unwrap())
            .unwrap();
        swarm
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_node_of_another_version_is_told_at_once_on_both_sides_and_not_as_another_key() {
        let b = node_of_version(psk(6), PROTOCOL_VERSION + 1);
        let (error, refused) = dial_fails(node(psk(6)), b, "across versions").await;
        assert_eq!(dial_fault(&error), DialFault::Version);
        let text = explain_dial_error(&error);
        let theirs = format!("speaks mesh protocol {}", PROTOCOL_VERSION + 1);
        assert!(
            text.contains(&theirs) && text.contains("upgrade the older node"),
            "{text}"
        );
        assert!(!text.contains("mesh.key"), "{text}");
        let (fault, why) = listen_fault(&refused).expect("a fault to tell");
        assert_eq!(fault, DialFault::Version);
        assert!(
            why.contains(&format!("speaks mesh protocol {PROTOCOL_VERSION}")),
            "{why}"
        );
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_node_of_protocol_15_that_opens_with_pnet_is_of_another_version() {
        // What a node of protocol 16 sent first: pnet's random 24-byte nonce.
        let old = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = old.local_addr().unwrap().port();
        let server = tokio::spawn(async move {
            use tokio::io::AsyncWriteExt as _;
            let (mut s, _) = old.accept().await.unwrap();
            s.write_all(&[0x5a; 24]).await.unwrap();
            // Holds the connection open, as the old node waits for our nonce.
            tokio::time::sleep(WAIT).await;
        });
        let mut a = node(psk(5));
        let started = std::time::Instant::now();
        let error = dial_error_from(&mut a, port).await;
        assert!(
            started.elapsed() < HANDSHAKE_TIMEOUT,
            "{:?}",
            started.elapsed()
        );
        assert_eq!(dial_fault(&error), DialFault::Version);
        let text = explain_dial_error(&error);
        assert!(text.contains("16 or older"), "{text}");
        server.abort();
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_node_that_takes_the_connection_and_says_nothing_is_silent_not_of_another_key() {
        // A paused node: the kernel takes the connection, nobody answers.
        let paused = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = paused.local_addr().unwrap().port();
        let mut a = node(psk(5));
        let error = dial_error_from(&mut a, port).await;
        assert_eq!(dial_fault(&error), DialFault::Silent);
        assert!(dial_fault(&error).transient());
        let text = explain_dial_error(&error);
        assert!(text.contains("paused, or overloaded"), "{text}");
        assert!(!text.contains("mesh.key"), "{text}");
        drop(paused);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_refused_dial_does_not_blame_the_key() {
        let mut a = node(psk(5));
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let error = dial_error_from(&mut a, port).await;
        let text = explain_dial_error(&error);
        assert!(!text.contains("mesh.key"), "{text}");
        assert!(text.contains(&port.to_string()), "{text}");
        assert_eq!(dial_fault(&error), DialFault::Unreachable);
    }

    #[test]
    fn versions_must_match_exactly() {
        assert_eq!(check_version(&protocol_version()), Ok(()));
        let err = check_version("/mesh/0").unwrap_err();
        assert!(
            err.contains("/mesh/0") && err.contains(&protocol_version()),
            "{err}"
        );
        assert!(err.contains("upgrade the older node"), "{err}");
    }
}
