//! An open farm grows on the coordinator: a later generation of its spec taken into the engine, sent to the farm's holders, and said `Accepted` to its home once durable on as many nodes as a farm is.

use std::sync::Arc;

use super::super::super::msg::*;
use super::super::super::replica::entry_record;
use super::super::out::Out;
use super::super::Node;
use super::Coord;
use crate::engine::Millis;

impl Coord {
    /// `spec`, offered by `from`, is a later generation of a farm this
    /// coordinator has (see [`FarmSpec::grows_into`]): the engine takes
    /// its new stages, restoring what the log already says of them (a
    /// coordinator elected after they were added may have heard their
    /// ends from a holder first), and every other holder is sent it. True
    /// when it grew; false for a copy as old as the one here, or older.
    pub(in super::super) fn grow(
        &mut self,
        now: Millis,
        from: NodeId,
        spec: &Arc<FarmSpec>,
        cx: &Node,
        out: &mut Out,
    ) -> bool {
        let Some(f) = self.farms.get_mut(&spec.id) else {
            return false;
        };
        if !f.spec.grows_into(spec) {
            return false;
        }
        let old = f.spec.def.stages.len() as u32;
        let restored: Vec<_> = f
            .log
            .current_from(old)
            .map(|e| (e.task(), entry_record(e)))
            .collect();
        // Holders that have the generation this one grows are sent what
        // it adds; the others, the whole of it.
        let growth = Growth::since(SpecHeld::of(&f.spec), spec).map(Box::new);
        let had = std::mem::take(&mut f.grown_copies);
        f.tasks += crate::farm::stages_from(&spec.def.stages, old as usize)
            .map(|s| u64::from(s.len()))
            .sum::<u64>();
        f.spec = spec.clone();
        let mut def = spec.def.clone();
        if !def.graph.builds_on_some() {
            // Sent whole, its tables not made here: built on the engine's
            // when needed (a copy of this generation for the engine, as
            // before a generation was shared).
            let before = &self.engine.farm(f.slot).graph;
            let d = Arc::make_mut(&mut def);
            d.graph = std::mem::take(&mut d.graph).built_on(before);
        }
        self.engine.extend_farm(now, f.slot, def, restored);
        self.engine.set_open(f.slot, spec.open);
        f.finished_sent = false;
        f.counts_sent = None;
        // The node that offered it and this one have it; the others are
        // asked to keep it, and say so with its generation.
        f.grown_copies.insert(from);
        f.grown_copies.insert(cx.id);
        f.grown_at = now;
        let term = cx.election.term();
        for h in &f.holders {
            if h.node == from || h.node == cx.id {
                continue;
            }
            let msg = match &growth {
                Some(g) if had.contains(&h.node) => Msg::ReplicateGrown {
                    term,
                    growth: g.clone(),
                },
                _ => Msg::Replicate {
                    term,
                    farm: spec.clone(),
                },
            };
            out.send(h.node, msg);
        }
        self.drain(out);
        true
    }

    /// Farms accepted before whose latest generation is now durable on
    /// enough live holders: their home hears `Accepted` again.
    pub(super) fn accept_grown(&mut self, cx: &Node, out: &mut Out) {
        let need = cx.holders_needed() + 1;
        for (&fid, f) in &mut self.farms {
            if !f.accepted || f.gen_accepted >= f.spec.gen {
                continue;
            }
            let have = f
                .holders
                .iter()
                .filter(|h| h.has_spec && f.grown_copies.contains(&h.node) && cx.live(h.node))
                .count();
            if have < need {
                continue;
            }
            f.gen_accepted = f.spec.gen;
            out.send(
                f.home.node,
                Msg::Accepted {
                    farm: fid,
                    tasks: f.tasks,
                },
            );
        }
    }
}
