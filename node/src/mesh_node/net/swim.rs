//! Membership packets and beats on UDP, sealed with a key derived from mesh.key: a node without the key can neither read nor forge them.
//!
//! SWIM sends a few small packets a second to members chosen at random,
//! so a connection per member (libp2p's handshakes, a socket each) would
//! cost more than the packets; memberlist, Serf and Consul use UDP for the
//! same reason. Beats go the same way (a worker's to its coordinator, the
//! coordinator's answer and its claim): they are small and periodic, and a
//! coordinator that took them on connections kept one open, a descriptor
//! each, to every member (1,068 sockets at 1,000 nodes, more than many
//! systems' default limit of open files). A packet is sealed with
//! XChaCha20-Poly1305 under a key derived from the mesh's pre-shared key,
//! and goes to the member's UDP port, the same number as its TCP port. A
//! packet that is lost is lost: the protocol expects it (beats are sent
//! again each interval; the simulator loses messages too).

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use chacha20poly1305::aead::{Aead, KeyInit};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use libp2p::multiaddr::Protocol;
use libp2p::Multiaddr;
use mesh_protocol::mesh::{Msg, NodeId};
use tokio::net::UdpSocket;

use crate::keys::MeshKey;
use crate::mesh_node::{Event, LoopHandle};

/// Larger than any packet SWIM makes (1,400 bytes) with its seal, and
/// than any beat sent as a datagram (`BEAT_MAX`).
const PACKET_MAX: usize = 2048;
const NONCE_LEN: usize = 24;
/// A beat larger than this (a coordinator's with many victims and long
/// addresses) goes on the connection instead: a datagram over a path's
/// MTU is fragmented, and one lost fragment loses it all.
const BEAT_MAX: usize = 1400;
/// What a packet carries, its first byte once opened.
const KIND_SWIM: u8 = 0;
const KIND_MSG: u8 = 1;

/// This node's UDP socket for membership, and the key packets are sealed with.
pub(super) struct SwimSocket {
    /// The socket for sending (the receiving task has its tokio twin): a
    /// datagram goes out at once (or is dropped), with no wait for the
    /// reactor to have seen it writable.
    out: std::net::UdpSocket,
    cipher: XChaCha20Poly1305,
    /// Nonces: a prefix of this node's own and a counter, never repeated
    /// under the key (the prefix differs between nodes and restarts).
    prefix: [u8; 16],
    sent: u64,
}

/// The key of membership packets: derived, so mesh.key itself is never used twice.
pub(in crate::mesh_node) fn cipher(psk: &MeshKey) -> XChaCha20Poly1305 {
    let key = blake3::derive_key("mesh 2026 membership packets", psk.to_string().as_bytes());
    XChaCha20Poly1305::new(&key.into())
}

/// The receive buffer asked for the membership socket.
const RECEIVE_BUFFER: usize = 4 << 20;

impl SwimSocket {
    /// Binds `ip`'s UDP port `port` (the node's TCP port) and starts
    /// handing what arrives, opened, to the node loop.
    pub(super) fn bind(
        addr: SocketAddr,
        cipher: XChaCha20Poly1305,
        seed: &[u8],
        handle: LoopHandle,
    ) -> io::Result<SwimSocket> {
        let std_sock = std::net::UdpSocket::bind(addr)?;
        std_sock.set_nonblocking(true)?;
        // A coordinator hears every member's beats and a burst of joiners'
        // packets at once; the default buffer (208 KiB on Linux) drops them
        // while the loop is busy. The kernel caps this at net.core.rmem_max.
        if let Err(e) = nix::sys::socket::setsockopt(
            &std_sock,
            nix::sys::socket::sockopt::RcvBuf,
            &RECEIVE_BUFFER,
        ) {
            tracing::debug!("membership socket keeps its default buffer: {e}");
        }
        let out = std_sock.try_clone()?;
        let sock = Arc::new(UdpSocket::from_std(std_sock)?);
        let mut prefix = [0u8; 16];
        prefix.copy_from_slice(&blake3::hash(seed).as_bytes()[..16]);
        tokio::spawn(receive(sock, cipher.clone(), handle));
        Ok(SwimSocket {
            out,
            cipher,
            prefix,
            sent: 0,
        })
    }

    /// Sends a membership packet; one that cannot go now is dropped.
    pub(super) fn send(&mut self, to: SocketAddr, data: &[u8]) {
        let mut packet = Vec::with_capacity(data.len() + 1);
        packet.push(KIND_SWIM);
        packet.extend_from_slice(data);
        self.seal_and_send(to, &packet);
    }

    /// Sends `msg` from node `from` as one packet, if it fits one; false
    /// (and nothing sent) if it does not.
    pub(super) fn send_msg(&mut self, to: SocketAddr, from: NodeId, msg: &Msg) -> bool {
        let Ok(packet) = postcard::to_extend(&(from, msg), vec![KIND_MSG]) else {
            return false;
        };
        if packet.len() > BEAT_MAX {
            return false;
        }
        self.seal_and_send(to, &packet);
        true
    }

    /// Seals and sends one packet; one that cannot go now is dropped.
    fn seal_and_send(&mut self, to: SocketAddr, data: &[u8]) {
        self.sent += 1;
        let mut nonce = [0u8; NONCE_LEN];
        nonce[..16].copy_from_slice(&self.prefix);
        nonce[16..].copy_from_slice(&self.sent.to_be_bytes());
        let Ok(sealed) = self.cipher.encrypt(XNonce::from_slice(&nonce), data) else {
            return;
        };
        let mut packet = Vec::with_capacity(NONCE_LEN + sealed.len());
        packet.extend_from_slice(&nonce);
        packet.extend_from_slice(&sealed);
        if let Err(e) = self.out.send_to(&packet, to) {
            tracing::debug!(%to, "membership packet dropped: {e}");
        }
    }
}

/// Opens what arrives and hands it to the loop; anything that does not
/// open under the key (another mesh, noise), or does not read as what
/// its first byte says, is dropped.
async fn receive(sock: Arc<UdpSocket>, cipher: XChaCha20Poly1305, handle: LoopHandle) {
    let mut buf = vec![0u8; PACKET_MAX];
    loop {
        let n = match sock.recv_from(&mut buf).await {
            Ok((n, _)) => n,
            // A refused send of ours (ICMP) surfaces here on some systems.
            Err(_) => continue,
        };
        if n <= NONCE_LEN {
            continue;
        }
        let (nonce, sealed) = buf[..n].split_at(NONCE_LEN);
        let Ok(mut data) = cipher.decrypt(XNonce::from_slice(nonce), sealed) else {
            continue;
        };
        let cmd = match data.first() {
            Some(&KIND_SWIM) => {
                data.remove(0);
                Event::Swim(data)
            }
            Some(&KIND_MSG) => match postcard::from_bytes::<(NodeId, Msg)>(&data[1..]) {
                Ok((from, msg)) => Event::Packet(from, msg),
                Err(_) => continue,
            },
            _ => continue,
        };
        if handle.tell(cmd).await.is_err() {
            return;
        }
    }
}

/// Where a member takes membership packets: the UDP port of the first of
/// its addresses that names an IP and a TCP port.
pub(super) fn udp_target(addrs: &[String]) -> Option<SocketAddr> {
    addrs.iter().find_map(|a| {
        let a: Multiaddr = a.parse().ok()?;
        let mut ip = None;
        let mut port = None;
        for p in a.iter() {
            match p {
                Protocol::Ip4(v4) => ip = Some(std::net::IpAddr::V4(v4)),
                Protocol::Ip6(v6) => ip = Some(std::net::IpAddr::V6(v6)),
                Protocol::Tcp(p) => port = Some(p),
                _ => {}
            }
        }
        Some(SocketAddr::new(ip?, port?))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mesh_node::Cmd;

    #[test]
    fn the_udp_port_is_the_tcp_port_of_the_first_usable_address() {
        let addrs = vec![
            "/dns4/example.org/tcp/7".to_string(),
            "/ip4/127.0.0.1/tcp/4001".to_string(),
        ];
        assert_eq!(udp_target(&addrs), Some("127.0.0.1:4001".parse().unwrap()));
        assert_eq!(udp_target(&["not an address".to_string()]), None);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_packet_opens_only_under_the_same_mesh_key() {
        let (tx, mut rx) = LoopHandle::new(16, mesh_protocol::mesh::NodeId(1));
        let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let key = MeshKey::new([7; 32]);
        let b = SwimSocket::bind(any, cipher(&key), b"b", tx).unwrap();
        let to = b.out.local_addr().unwrap();
        let (tx2, _rx2) = LoopHandle::new(16, mesh_protocol::mesh::NodeId(1));
        let mut a = SwimSocket::bind(any, cipher(&key), b"a", tx2.clone()).unwrap();
        let mut other = SwimSocket::bind(any, cipher(&MeshKey::new([8; 32])), b"c", tx2).unwrap();
        other.send(to, b"forged");
        a.send(to, b"hello");
        let got = tokio::time::timeout(std::time::Duration::from_secs(10), rx.recv())
            .await
            .expect("a packet in time");
        match got {
            Some(Cmd::Event(Event::Swim(data))) => assert_eq!(data, b"hello"),
            _ => panic!("expected the sealed packet"),
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_small_message_travels_as_a_packet_with_its_sender_and_a_large_one_does_not() {
        let (tx, mut rx) = LoopHandle::new(16, mesh_protocol::mesh::NodeId(1));
        let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let key = MeshKey::new([7; 32]);
        let b = SwimSocket::bind(any, cipher(&key), b"b", tx).unwrap();
        let to = b.out.local_addr().unwrap();
        let (tx2, _rx2) = LoopHandle::new(16, mesh_protocol::mesh::NodeId(1));
        let mut a = SwimSocket::bind(any, cipher(&key), b"a", tx2).unwrap();
        let big = Msg::Refused {
            farm: mesh_protocol::mesh::FarmId(1),
            reason: "x".repeat(BEAT_MAX),
        };
        assert!(!a.send_msg(to, NodeId(5), &big));
        let small = Msg::Collected {
            farm: mesh_protocol::mesh::FarmId(9),
        };
        assert!(a.send_msg(to, NodeId(5), &small));
        let got = tokio::time::timeout(std::time::Duration::from_secs(10), rx.recv())
            .await
            .expect("a packet in time");
        match got {
            Some(Cmd::Event(Event::Packet(from, msg))) => {
                assert_eq!(from, NodeId(5));
                assert_eq!(msg, small);
            }
            _ => panic!("expected the message"),
        }
    }
}
