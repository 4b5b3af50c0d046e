//! Which tasks of a submission are done from the start with a result kept before, which run, and which earlier homes are asked: decided from what the home found kept, here and elsewhere.

use std::collections::BTreeSet;

use super::TaskKeys;
use crate::farm::TaskRef;
use crate::ids::NodeId;

/// Earlier homes of a farm's name asked at most for the results a new
/// submission's tasks would reuse (each is asked for every key not kept
/// here).
pub const HOMES_ASKED: usize = 16;

/// What becomes of one task of a submission.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reuse {
    /// The result this node keeps for its key is put in its folder: done
    /// from the start. Should that fail, it is [`unkept`].
    Kept,
    /// It runs, unless an earlier home keeps its result (`ask`).
    Run {
        /// Its folder holds an earlier run's outputs, which a failure must
        /// not leave standing as its result: set aside before it runs.
        forget: bool,
        /// Its result may be asked of the earlier homes of the farm's
        /// name (not for a stage run again whatever was done).
        ask: bool,
    },
}

/// What becomes of each task of a submission, stage by stage in index
/// order: `rerun` the stages that run again whatever was done, `kept(t)`
/// whether this node keeps a result for task `t`'s key, `folder(s)`
/// whether stage `s` has a folder in `{out}` (none: nothing of an earlier
/// run to set aside, and no task's folder is looked at).
pub fn reuse(
    keys: &TaskKeys,
    rerun: &[bool],
    kept: impl Fn(TaskRef) -> bool,
    folder: impl Fn(usize) -> bool,
) -> Vec<(TaskRef, Reuse)> {
    let mut out = Vec::with_capacity(keys.iter().map(Vec::len).sum());
    for (s, stage_keys) in keys.iter().enumerate() {
        let earlier = folder(s);
        let again = rerun.get(s).copied().unwrap_or(false);
        for i in 0..stage_keys.len() {
            let t = TaskRef::new(s as u32, i as u32);
            let what = if again {
                Reuse::Run {
                    forget: earlier,
                    ask: false,
                }
            } else if kept(t) {
                Reuse::Kept
            } else {
                unkept(earlier)
            };
            out.push((t, what));
        }
    }
    out
}

/// A task whose kept result could not be put in place, or that has none
/// here: it runs unless an earlier home keeps its result, its folder's
/// earlier outputs (`folder`: its stage has a folder) set aside first.
pub fn unkept(folder: bool) -> Reuse {
    Reuse::Run {
        forget: folder,
        ask: true,
    }
}

/// The earlier homes to ask, in order: those this node and the
/// coordinator know of farms of the name (`listed`: every farm's name
/// and home the coordinator lists), never this node, at most
/// [`HOMES_ASKED`].
pub fn homes_to_ask<'a>(
    known: &BTreeSet<NodeId>,
    listed: impl IntoIterator<Item = (&'a str, NodeId)>,
    name: &str,
    me: NodeId,
) -> Vec<NodeId> {
    let mut homes = known.clone();
    homes.extend(
        listed
            .into_iter()
            .filter(|&(n, home)| n == name && home != me)
            .map(|(_, home)| home),
    );
    homes.remove(&me);
    homes.into_iter().take(HOMES_ASKED).collect()
}

/// An earlier home's answer: the keys it keeps, each with what it keeps.
pub type Answer<T> = (NodeId, Vec<([u8; 32], T)>);

/// Of the answers of the homes asked (in the order asked), the home whose
/// result each wanted task reuses, with its key: the first that keeps it.
pub fn first_keeper<'a, T>(
    wanted: &[(TaskRef, [u8; 32])],
    answers: &'a [Answer<T>],
) -> Vec<(TaskRef, [u8; 32], NodeId, &'a T)> {
    let mut by_key: std::collections::HashMap<[u8; 32], (NodeId, &T)> =
        std::collections::HashMap::new();
    for (home, kept) in answers {
        for (k, v) in kept {
            by_key.entry(*k).or_insert((*home, v));
        }
    }
    wanted
        .iter()
        .filter_map(|(t, k)| by_key.get(k).map(|&(h, v)| (*t, *k, h, v)))
        .collect()
}
