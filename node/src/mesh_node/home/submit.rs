//! The home's side of reuse: a farm submitted here goes through the kept room (what earlier farms left, looked up and put in place) before the peer hears of it, and what a farm that runs or ended leaves is written down by it.

use std::collections::BTreeSet;

use mesh_protocol::farm::TaskRef;
use mesh_protocol::mesh::{Entry, FarmId, FarmSpec, NodeId};

use super::queries::summaries;
use super::views::Origin;
use super::{kept_lent, Home, HomeOut, Lent};
use crate::mesh_node::kept::Submitting;
use crate::mesh_node::reply::Reply;

impl Home {
    /// Submits a farm handed to this node, with the tasks done before (see
    /// `Kept::submit_reusing`): at once, or once the earlier homes of its
    /// name have answered (`Event::SubmitReused`).
    pub(in crate::mesh_node) fn submit_reusing(&mut self, m: &mut Lent<'_>, farm: Submitting) {
        let homes = earlier_homes(m, &farm.spec.def.name);
        let coordinator = m.mesh.coordinator().filter(|c| *c != m.me);
        let (kept, mut lent) = kept_lent(m);
        if let Some((spec, reused, reply)) =
            kept.submit_reusing(&mut lent, farm, homes, coordinator)
        {
            self.submit_now(spec, reused, reply);
        }
    }

    /// Hands the farm to the peer: it becomes its home, with these tasks done.
    pub(in crate::mesh_node) fn submit_now(
        &mut self,
        spec: FarmSpec,
        reused: Vec<Entry>,
        reply: Reply,
    ) {
        let mut o = Origin::new(&spec);
        o.submit_reply = Some(reply);
        self.farms.insert(spec.id, o);
        self.out.push_back(HomeOut::Submit(spec, reused));
    }

    /// On the home of a farm that just ended: writes down where each done
    /// task's outputs are, by its content key.
    pub(in crate::mesh_node) fn remember_results(&mut self, m: &mut Lent<'_>, farm: FarmId) {
        let (kept, mut lent) = kept_lent(m);
        kept.remember(&mut lent, farm, None, true);
    }

    /// On the home of a farm that runs: writes down the results of the
    /// tasks whose outputs came home since it last looked, so a client
    /// that comes back (a notebook restarted) reuses them while the farm
    /// still runs. A cache: not flushed, as a lost one costs a rerun.
    pub(in crate::mesh_node) fn remember_landed(&mut self, m: &mut Lent<'_>, farm: FarmId) {
        let Some(r) = m.mesh.replica(farm).filter(|r| r.home) else {
            return;
        };
        let Some(o) = self.farms.get_mut(&farm) else {
            return;
        };
        let len = r.log.len();
        let mut tasks = std::mem::take(&mut o.remember_wait);
        tasks.extend(
            r.log
                .slice(o.remembered, (len - o.remembered.min(len)) as usize)
                .iter()
                .filter(|e| matches!(e, Entry::Done { .. }))
                .map(Entry::task),
        );
        o.remembered = len;
        let (here, wait): (Vec<TaskRef>, Vec<TaskRef>) =
            tasks.into_iter().partition(|t| r.outputs_here(*t));
        o.remember_wait = wait;
        if !here.is_empty() {
            let (kept, mut lent) = kept_lent(m);
            kept.remember(&mut lent, farm, Some(&here), false);
        }
    }
}

/// The other nodes this node knows were the home of a farm named `name`.
fn earlier_homes(m: &Lent<'_>, name: &str) -> BTreeSet<NodeId> {
    summaries(m)
        .into_iter()
        .filter(|f| f.name == name && f.home.node != m.me)
        .map(|f| f.home.node)
        .collect()
}
