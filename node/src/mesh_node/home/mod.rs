//! The node's home room: the farms submitted here and what their users ask of them (control requests, submissions, reuse, views, the feed of tasks, queries, growth, logs, export, the allocation queues).
//!
//! The room is [`Home`]: it owns the farms' views, their waiters,
//! followers and holds, and the `mesh alloc` changes waiting to be seen.
//! The loop lends it, for each call, what it reads of the rest of the node
//! as a [`Lent`]: the farms and the mesh through [`Mesh`] (which the `Peer`
//! implements, read-only), the net and runs rooms' handles, the kept room,
//! the store. What it wants changed in the mesh (a farm submitted, grown,
//! cancelled, taken home; an allocation command) it returns as a
//! [`HomeOut`], which the loop hands to the peer after the call, as the
//! peer returns its `Action`s. The reads that need none of the home's own
//! state are functions of the [`Lent`] (`queries.rs`, `logs.rs`, ...).

mod alloc;
mod commands;
mod export;
mod feed;
mod grow;
mod logs;
mod queries;
mod submit;
mod views;

use std::collections::{HashMap, HashSet, VecDeque};
use std::path::Path;
use std::sync::Arc;

use mesh_protocol::farm::TaskRef;
use mesh_protocol::mesh::{
    AllocBook, AllocCmd, Beat, Entry, FarmId, FarmLog, FarmProgress, FarmSpec, Member, NodeId,
    Stats,
};
use mesh_protocol::observe::Latencies;

use super::kept::{self, Kept};
use super::net::{Members, Net};
use super::reply::Reply;
use super::runs::{Farms, Runs};
use super::{Disk, LoopHandle};

pub(super) use alloc::Alloc;
pub(super) use commands::{accept_control, serve_control};
pub(super) use grow::GrowError;
pub(super) use logs::local_answer;
pub(super) use queries::{find_known, found, observation, summaries, Asked};
pub(super) use views::Origin;

/// The farms this node is the home of (those submitted here): what users
/// see of them and who waits on or follows them; and the allocation
/// changes waiting to be seen.
pub(super) struct Home {
    farms: HashMap<FarmId, Origin>,
    /// Nodes that left the mesh since the holds last heard (see `grow.rs`).
    gone: Vec<String>,
    /// Farms whose followers have more of the log to hear, in a later
    /// turn of the loop (see `feed.rs`).
    feed_more: HashSet<FarmId>,
    /// The mesh secret's file and the changes waiting to be seen (`mesh
    /// alloc`): the loop hands it the batch operations the peer asks for.
    pub(super) allocs: Alloc,
    out: VecDeque<HomeOut>,
}

/// What the home wants done in the mesh, in the order it arose: the
/// loop hands each to the peer.
pub(super) enum HomeOut {
    Submit(FarmSpec, Vec<Entry>),
    /// An open farm's next generation (checked to be one before); the
    /// loop then has the home show it ([`Home::refresh_view`]).
    Grow(FarmSpec, Vec<Entry>),
    Cancel(FarmId),
    CancelTask(FarmId, TaskRef),
    /// This node becomes the farm's home; the loop then hands the reply
    /// back ([`Home::resumed`]) to answer from the farm as it is then.
    TakeHome {
        spec: Arc<FarmSpec>,
        out: String,
        reply: Reply,
    },
    Alloc(AllocCmd),
}

/// What the home reads of the farms and the mesh; the `Peer` is one.
pub(super) trait Mesh: Farms + Members {
    fn specs(&self) -> Box<dyn Iterator<Item = &Arc<FarmSpec>> + '_>;
    fn members(&self) -> Box<dyn Iterator<Item = Member<'_>> + '_>;
    fn coordinated(&self) -> Vec<FarmId>;
    fn coordinated_farm(
        &self,
        farm: FarmId,
        failures_max: usize,
    ) -> Option<(mesh_protocol::mesh::Home, FarmProgress, Vec<Entry>)>;
    fn coordinated_log(&self, farm: FarmId) -> Option<&FarmLog>;
    fn where_ran(&self, farm: FarmId, task: TaskRef) -> Option<(NodeId, bool)>;
    fn runs(&self, farm: FarmId, task: TaskRef) -> bool;
    fn beat(&self) -> Beat;
    fn node_beats(&self) -> Vec<(String, Arc<Beat>)>;
    fn term(&self) -> u64;
    fn stats(&self) -> &Stats;
    fn latencies(&self) -> Option<(&Latencies, u64)>;
    fn alloc_book(&self) -> &Arc<AllocBook>;
}

/// What the loop lends the home for one call.
pub(super) struct Lent<'a> {
    pub(super) mesh: &'a dyn Mesh,
    pub(super) net: &'a Net,
    pub(super) runs: &'a mut Runs,
    pub(super) kept: &'a Kept,
    pub(super) disk: &'a mut Disk,
    pub(super) state: &'a Path,
    pub(super) handle: &'a LoopHandle,
    pub(super) me: NodeId,
}

/// How users know node `n`: its peer id.
pub(in crate::mesh_node) fn label_of(m: &Lent<'_>, n: NodeId) -> String {
    m.net.label_of(n, m.mesh)
}

/// Every node's peer id as this node knows it.
pub(super) fn labels_now(m: &Lent<'_>) -> HashMap<NodeId, String> {
    m.mesh
        .members()
        .map(|m| (m.id, m.label().to_string()))
        .chain([(m.me, m.net.me_label().to_owned())])
        .collect()
}

/// The kept room, with what it is lent in turn for one call.
pub(super) fn kept_lent<'a>(m: &'a mut Lent<'_>) -> (&'a Kept, kept::Lent<'a>) {
    let lent = kept::Lent {
        store: &mut m.disk.store,
        transfers: m.runs.transfers(),
        farms: m.mesh,
    };
    (m.kept, lent)
}

impl Home {
    pub(super) fn new(allocs: Alloc) -> Home {
        Home {
            farms: HashMap::new(),
            gone: Vec::new(),
            feed_more: HashSet::new(),
            allocs,
            out: VecDeque::new(),
        }
    }

    /// What the home wants done next, in order.
    pub(super) fn poll(&mut self) -> Option<HomeOut> {
        self.out.pop_front()
    }

    /// A farm of this node's kept in the store, at start: its view, before
    /// the peer has its copy again.
    pub(super) fn restored(&mut self, spec: &FarmSpec) {
        let mut o = Origin::new(spec);
        o.view.accepted = true;
        self.farms.insert(spec.id, o);
    }

    /// The coordinator took a farm submitted (or grown) here.
    pub(super) fn accepted(&mut self, farm: FarmId, tasks: u64) {
        if let Some(o) = self.farms.get_mut(&farm) {
            o.view.accepted = true;
            if let Some(r) = o.submit_reply.take() {
                let _ = r.send(crate::control::ControlResponse::Submitted {
                    farm: o.view.id.clone(),
                    tasks,
                });
            }
        }
    }

    /// The coordinator refused a farm submitted here.
    pub(super) fn refused(&mut self, farm: FarmId, reason: String) {
        if let Some(mut o) = self.farms.remove(&farm) {
            if let Some(r) = o.submit_reply.take() {
                let _ = r.send(crate::control::ControlResponse::error(
                    crate::control::ErrorKind::Refused,
                    reason,
                ));
            }
        }
    }

    /// A node left the mesh: told to the clients holding farms here (a
    /// call of theirs it ran runs again; bounded: a burst of deaths says some).
    pub(super) fn member_gone(&mut self, label: String) {
        if self.gone.len() < 64 {
            self.gone.push(label);
        }
    }
}
