//! How a node finds its mesh and stays in it: the addresses `mesh join` was given and the members it remembers, tried with backoff until they answer, for hours.
//!
//! A node never gives up on a transient. An address that refuses the
//! connection (its node is not up yet), or takes it and says nothing in
//! time (paused, overloaded, swamped by a job array's burst), is tried
//! again, a little later each time, with a random spread so that
//! hundreds of joiners do not come back as one burst; the user is told
//! what is happening. Only a definite fault stops a join: a node of
//! another mesh key or version (told for certain by the connection's
//! handshake, see `net.rs`).
//!
//! Every node remembers the addresses of the members it has seen, on disk,
//! and keeps trying those whose node is not a member now, at an interval
//! that stretches to `KNOWN_WAIT_MAX`, until it has not seen them for
//! `FORGET_AFTER` (as Serf reconnects to failed members for a day, and
//! Consul's `retry_join` retries its seeds). A connection to a node that
//! is not a member introduces this node to it (`Peer::introduce`): SWIM
//! merges the two memberships, and the higher coordinator term wins on
//! both sides, as after a partition. So two meshes of one key that can
//! reach each other become one, a node restarted on a new port finds its
//! mesh through the members it remembered, and a node that ran alone
//! because its seed did not answer joins the mesh once it does.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use libp2p::multiaddr::Protocol;
use libp2p::swarm::DialError;
use libp2p::{Multiaddr, PeerId};
use mesh_store::mesh::NODE_KEY;
use mesh_store::{SledStore, Store, StoreError, Write};
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use serde::{Deserialize, Serialize};

use super::{Members, Net, NetOut};
use crate::keys;
use crate::mesh_node::NodeError;
use crate::net::{self, DialFault};

/// Where the remembered members are kept (the node's meta).
const META_REACH: &str = "reach";
/// Where an older node kept them (addresses only).
const META_PEERS: &str = "peers";
/// The TCP port this node last listened on.
const META_PORT: &str = "port";

/// `mesh join`'s first dial comes this long after start at most, at
/// random: a job array of a thousand joiners started together arrives
/// spread over it rather than as one burst.
const JOIN_SPREAD: Duration = Duration::from_millis(1000);
/// A join address that did not answer is tried again after 1 s, 2 s,
/// 4 s, ... up to this, each wait spread at random over its upper half.
const JOIN_WAIT_MAX: Duration = Duration::from_secs(30);
/// A remembered member that is not a member now (gone, restarted
/// elsewhere, or in a mesh this one has not met) is tried after 3 s, 6 s,
/// ... up to this, for as long as it is remembered.
const KNOWN_WAIT_FIRST: Duration = Duration::from_secs(3);
const KNOWN_WAIT_MAX: Duration = Duration::from_secs(300);
/// A remembered address not seen as a member for this long is forgotten.
const FORGET_AFTER_MS: u64 = 24 * 3600 * 1000;
/// At most this many addresses are remembered.
const KNOWN_MAX: usize = 64;
/// A node of another mesh key or version at one of several join addresses
/// stops the join once every address has said so, or this long after the
/// first did (the others never answered).
const WRONG_KEY_MAX: Duration = Duration::from_secs(120);
/// How often the addresses due are dialled.
pub(in crate::mesh_node) const REACH_TICK: Duration = Duration::from_millis(500);

/// One remembered member address (with its `/p2p/` peer id), and when
/// this node last saw it a member (wall clock, ms).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct Known {
    addr: String,
    seen_ms: u64,
}

/// When an address is next tried, and how long the wait after that is.
#[derive(Clone, Copy, Debug)]
struct Backoff {
    next: Instant,
    wait: Duration,
}

impl Backoff {
    fn new(next: Instant, wait: Duration) -> Backoff {
        Backoff { next, wait }
    }

    /// Tried (or failed) now: the next try after the current wait, spread
    /// at random over its upper half; the wait after that doubles, up to
    /// `max`.
    fn tried(&mut self, now: Instant, max: Duration, rng: &mut SmallRng) -> Duration {
        let wait = self.wait;
        let spread = wait / 2 + wait.mul_f64(rng.random::<f64>() / 2.0);
        self.next = now + spread;
        self.wait = (wait * 2).min(max);
        spread
    }
}

/// An address `mesh join` was given, and the node found there.
struct Seed {
    addr: Multiaddr,
    peer: Option<PeerId>,
    backoff: Backoff,
    /// It said it is of another mesh key or version.
    wrong: bool,
    /// A dial of it is under way: the next is reckoned from its end.
    dialing: bool,
}

/// What this node does to find its mesh and stay in it.
pub(in crate::mesh_node) struct Reach {
    seeds: Vec<Seed>,
    known: Vec<Known>,
    tries: HashMap<String, Backoff>,
    /// Members came up since the remembered addresses were last written:
    /// they are written with the next tick, not once per member (a mesh
    /// of N forming would write N lists of N addresses on every node).
    stale: bool,
    /// A connection to some node is up since this node started: it is in
    /// a mesh (or reached the node it joins through).
    joined: bool,
    first_wrong: Option<Instant>,
    rng: SmallRng,
}

impl Reach {
    /// The join addresses, and the members remembered in `store`.
    pub(in crate::mesh_node) fn load(
        store: &SledStore,
        join: &[Multiaddr],
        seed: u64,
    ) -> Result<Reach, StoreError> {
        let known = match store.meta(NODE_KEY, META_REACH)? {
            Some(b) => postcard::from_bytes(&b).unwrap_or_default(),
            None => match store.meta(NODE_KEY, META_PEERS)? {
                Some(b) => postcard::from_bytes::<Vec<String>>(&b)
                    .unwrap_or_default()
                    .into_iter()
                    .map(|addr| Known {
                        addr,
                        seen_ms: crate::state::unix_ms(),
                    })
                    .collect(),
                None => Vec::new(),
            },
        };
        let mut rng = SmallRng::seed_from_u64(seed);
        let now = Instant::now();
        let seeds = join
            .iter()
            .map(|a| Seed {
                addr: a.clone(),
                peer: a.iter().find_map(|p| match p {
                    Protocol::P2p(p) => Some(p),
                    _ => None,
                }),
                backoff: Backoff::new(
                    now + JOIN_SPREAD.mul_f64(rng.random::<f64>()),
                    Duration::from_secs(1),
                ),
                wrong: false,
                dialing: false,
            })
            .collect();
        Ok(Reach {
            seeds,
            known,
            tries: HashMap::new(),
            stale: false,
            joined: join.is_empty(),
            first_wrong: None,
            rng,
        })
    }

    /// This node remembers members it has seen (it was in a mesh).
    pub(in crate::mesh_node) fn remembers_any(&self) -> bool {
        !self.known.is_empty()
    }

    pub(super) fn joined(&self) -> bool {
        self.joined
    }
}

/// The addresses to listen on: a first TCP address whose port the system
/// would pick (`tcp/0`, `mesh node`'s default) takes the port this node
/// last listened on, when that is free, and the line that says so. The
/// others remember a node by its address: a mesh whose nodes all restart
/// at once on new ports would find no one, and come back as meshes of one.
pub(in crate::mesh_node) fn reuse_port(
    store: &SledStore,
    listen: &[Multiaddr],
) -> Result<(Vec<Multiaddr>, Option<String>), StoreError> {
    let mut listen = listen.to_vec();
    let Some(first) = listen.iter_mut().find(|a| net::tcp_port(a).is_some()) else {
        return Ok((listen, None));
    };
    if net::tcp_port(first) != Some(0) {
        return Ok((listen, None));
    }
    let Some(last) = store
        .meta(NODE_KEY, META_PORT)?
        .and_then(|b| postcard::from_bytes::<u16>(&b).ok())
    else {
        return Ok((listen, None));
    };
    let again = net::with_tcp_port(first, last);
    let said = if net::port_free(&again) {
        *first = again;
        format!("listening on port {last} again, as before its restart, so the members that remember it find it")
    } else {
        format!("port {last}, where this node listened before, is taken: it listens on a new one (its members find it through the members it remembers)")
    };
    Ok((listen, Some(said)))
}

/// The peer id at the end of an address, if it names one.
fn peer_of(addr: &str) -> Option<PeerId> {
    let a: Multiaddr = addr.parse().ok()?;
    match a.iter().last() {
        Some(Protocol::P2p(p)) => Some(p),
        _ => None,
    }
}

/// An address without its `/p2p/` peer id, to compare where a connection went.
fn bare(addr: &Multiaddr) -> Multiaddr {
    addr.iter()
        .filter(|p| !matches!(p, Protocol::P2p(_)))
        .collect()
}

impl Net {
    /// Dials what is due: the join addresses until they answer, and the
    /// remembered members that are not members now.
    pub(in crate::mesh_node) fn reach_out(&mut self, members: &dyn Members) {
        let now = Instant::now();
        if std::mem::take(&mut self.reach.stale) {
            self.remember_peers(members);
        }
        let joined = self.reach.joined;
        // Once in, a join address is one more remembered member: tried,
        // more seldom, only while its node is not a member.
        for i in 0..self.reach.seeds.len() {
            let s = &self.reach.seeds[i];
            if s.wrong || s.dialing || now < s.backoff.next {
                continue;
            }
            if s.peer.is_some_and(|p| self.is_member_or_linked(p, members)) {
                continue;
            }
            let s = &mut self.reach.seeds[i];
            s.dialing = true;
            let addr = s.addr.clone();
            if let Err(e) = self.swarm.dial(addr) {
                let s = &mut self.reach.seeds[i];
                s.dialing = false;
                let max = if joined {
                    KNOWN_WAIT_MAX
                } else {
                    JOIN_WAIT_MAX
                };
                s.backoff.tried(now, max, &mut self.reach.rng);
                tracing::info!("cannot dial a join address: {e}");
            }
        }
        for k in 0..self.reach.known.len() {
            let addr = self.reach.known[k].addr.clone();
            let Some(pid) = peer_of(&addr) else {
                continue;
            };
            if self.is_member_or_linked(pid, members) || self.dialing.contains(&pid) {
                self.reach.tries.remove(&addr);
                continue;
            }
            let b = self
                .reach
                .tries
                .entry(addr.clone())
                .or_insert_with(|| Backoff::new(now, KNOWN_WAIT_FIRST));
            if now < b.next {
                continue;
            }
            b.tried(now, KNOWN_WAIT_MAX, &mut self.reach.rng);
            let Ok(a) = addr.parse::<Multiaddr>() else {
                continue;
            };
            let opts = libp2p::swarm::dial_opts::DialOpts::peer_id(pid)
                .addresses(vec![a])
                .build();
            if self.swarm.dial(opts).is_ok() {
                self.dialing.insert(pid);
            }
        }
    }

    /// A member now, or connected (a connection up is being introduced, or
    /// its node is in the mesh and SWIM will say so).
    fn is_member_or_linked(&self, pid: PeerId, members: &dyn Members) -> bool {
        self.swarm.is_connected(&pid) || members.address_of(keys::node_id(&pid)).is_some()
    }

    /// A connection this node dialled is up: to a join address, it has
    /// reached the mesh. Whether `remote` is one of the addresses this node
    /// joins through (a join address, a peer it remembered).
    pub(super) fn reached(&mut self, peer: PeerId, remote: &Multiaddr) -> bool {
        self.reach.joined = true;
        let remote = bare(remote);
        let mut seed = false;
        for s in &mut self.reach.seeds {
            if bare(&s.addr) == remote {
                s.peer = Some(peer);
                s.dialing = false;
                s.backoff.wait = Duration::from_secs(1);
                seed = true;
            }
        }
        seed
    }

    /// A dial failed. Before this node has reached the mesh, a join
    /// address's failure is told with what happens next; only a node of
    /// another mesh key or version at every join address (or at one, for
    /// `WRONG_KEY_MAX`) ends the join.
    pub(super) fn dial_failed(&mut self, error: &DialError) -> Result<(), NodeError> {
        let attempts = net::dial_attempts(error);
        let now = Instant::now();
        let max = if self.reach.joined {
            KNOWN_WAIT_MAX
        } else {
            JOIN_WAIT_MAX
        };
        for (addr, ..) in &attempts {
            let at = bare(addr);
            for s in self.reach.seeds.iter_mut().filter(|s| bare(&s.addr) == at) {
                if std::mem::take(&mut s.dialing) {
                    s.backoff.tried(now, max, &mut self.reach.rng);
                }
            }
        }
        if self.reach.joined {
            for (addr, _, cause) in &attempts {
                tracing::info!("dial of {addr} failed: {cause}");
            }
            return Ok(());
        }
        for (addr, fault, cause) in attempts {
            let at = bare(&addr);
            let Some(i) = self.reach.seeds.iter().position(|s| bare(&s.addr) == at) else {
                tracing::info!("dial of {addr} failed: {cause}");
                continue;
            };
            if !fault.transient() {
                self.reach.seeds[i].wrong = true;
                let first = *self.reach.first_wrong.get_or_insert_with(Instant::now);
                if self.reach.seeds.iter().all(|s| s.wrong) || first.elapsed() >= WRONG_KEY_MAX {
                    return Err(NodeError::Join {
                        addr: addr.to_string(),
                        why: cause,
                    });
                }
                self.say(format!(
                    "cannot join through {addr}: {cause}; trying the other addresses"
                ));
                continue;
            }
            let s = &self.reach.seeds[i];
            let secs = s.backoff.next.saturating_duration_since(now).as_secs_f64();
            let what = match fault {
                DialFault::Silent => format!("no answer from {addr} yet ({cause})"),
                DialFault::Unreachable => format!("cannot reach {addr} yet ({cause})"),
                _ => format!("cannot join through {addr} yet ({cause})"),
            };
            self.say(format!("{what}; trying again in {secs:.0} s"));
        }
        Ok(())
    }

    /// This node listens on `port` (its first TCP address): the port it
    /// asks for at its next start (see `reuse_port`).
    pub(super) fn remember_port(&mut self, port: u16) {
        let w = Write::Meta {
            farm: NODE_KEY,
            name: META_PORT.into(),
            value: postcard::to_stdvec(&port).unwrap_or_default(),
        };
        self.out.push_back(NetOut::Keep {
            write: w,
            what: "the port it listens on",
        });
    }

    /// A member came up: its address is remembered with the next tick (the
    /// first at once: a node stopped right after joining still finds its
    /// mesh when it starts again).
    pub(in crate::mesh_node) fn member_seen(&mut self, members: &dyn Members) {
        if self.reach.known.is_empty() {
            self.remember_peers(members);
        } else {
            self.reach.stale = true;
        }
    }

    /// Keeps the addresses of the members, the oldest forgotten first, so
    /// a restart (or a mesh this one was split from) finds them again.
    fn remember_peers(&mut self, members: &dyn Members) {
        let now_ms = crate::state::unix_ms();
        let mut addrs = members.addresses();
        addrs.sort();
        addrs.dedup();
        addrs.truncate(KNOWN_MAX);
        let mut known: Vec<Known> = addrs
            .into_iter()
            .map(|addr| Known {
                addr,
                seen_ms: now_ms,
            })
            .collect();
        let mut older: Vec<Known> = std::mem::take(&mut self.reach.known)
            .into_iter()
            .filter(|k| {
                now_ms.saturating_sub(k.seen_ms) < FORGET_AFTER_MS
                    && !known.iter().any(|n| n.addr == k.addr)
            })
            .collect();
        older.sort_by_key(|k| std::cmp::Reverse(k.seen_ms));
        for k in older {
            if known.len() >= KNOWN_MAX {
                break;
            }
            known.push(k);
        }
        self.reach
            .tries
            .retain(|a, _| known.iter().any(|k| &k.addr == a));
        self.reach.known = known;
        let w = Write::Meta {
            farm: NODE_KEY,
            name: META_REACH.into(),
            value: postcard::to_stdvec(&self.reach.known).unwrap_or_default(),
        };
        // Flushed now: an idle node persists nothing else, and one killed
        // before its next flush would start again knowing no peer (on a
        // new port, as `mesh node` listens by default, as a mesh of one).
        self.out.push_back(NetOut::Keep {
            write: w,
            what: "the peers' addresses",
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_doubles_up_to_its_cap_and_is_spread_over_its_upper_half() {
        let mut rng = SmallRng::seed_from_u64(1);
        let start = Instant::now();
        let mut b = Backoff::new(start, Duration::from_secs(1));
        let mut waits = Vec::new();
        for _ in 0..8 {
            let w = b.tried(start, Duration::from_secs(30), &mut rng);
            waits.push(w);
        }
        for (w, cap) in waits.iter().zip([1, 2, 4, 8, 16, 30, 30, 30]) {
            let cap = Duration::from_secs(cap);
            assert!(
                *w >= cap / 2 && *w <= cap,
                "{w:?} outside [{:?}, {cap:?}]",
                cap / 2
            );
        }
        // Spread: two joiners that failed together do not come back together.
        let mut other = Backoff::new(start, Duration::from_secs(16));
        let mut b16 = Backoff::new(start, Duration::from_secs(16));
        let mut rng2 = SmallRng::seed_from_u64(2);
        assert_ne!(
            other.tried(start, Duration::from_secs(30), &mut rng2),
            b16.tried(start, Duration::from_secs(30), &mut rng)
        );
    }

    #[test]
    fn addresses_compare_without_their_peer_id() {
        let pid = PeerId::random();
        let a: Multiaddr = "/ip4/127.0.0.1/tcp/4001".parse().unwrap();
        let with = a.clone().with(Protocol::P2p(pid));
        assert_eq!(bare(&with), a);
        assert_eq!(peer_of(&with.to_string()), Some(pid));
        assert_eq!(peer_of(&a.to_string()), None);
    }
}
