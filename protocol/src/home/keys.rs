//! Every task's content key as the coordinator records it, and which stages run again whatever was done before: what a submission's reuse is decided by.

use std::collections::HashMap;

use crate::farm::{deps_digest, has_deps, key_with_deps, stage_digest, FarmDef, TaskRef};

/// Each task's content key, per stage in index order.
pub type TaskKeys = Vec<Vec<[u8; 32]>>;

/// Every task's content key as the coordinator records it (its own key
/// and, for a task with dependencies, theirs: see `farm::key_with_deps`),
/// per stage in index order: all made from the farm's definition and the
/// hashes of its inputs (`input_hash` of a path as the task names it),
/// dependencies first. Only the stages from `from` on and those they
/// depend on have theirs (an open farm's growth needs its new stages'
/// keys only: working out every key of the farm at each growth made a
/// loop of submits slower with each call); the others are empty.
pub fn task_keys(def: &FarmDef, from: usize, input_hash: impl Fn(&str) -> [u8; 32]) -> TaskKeys {
    let mut keys: TaskKeys = vec![Vec::new(); def.stages.len()];
    let mut digests: HashMap<u32, [u8; 32]> = HashMap::new();
    let mut needed = vec![false; def.stages.len()];
    let mut look: Vec<u32> = (from as u32..def.stages.len() as u32).collect();
    while let Some(s) = look.pop() {
        if !std::mem::replace(&mut needed[s as usize], true) {
            look.extend(def.stages[s as usize].upstream());
        }
    }
    for s in dependency_order(def) {
        if !needed[s as usize] {
            continue;
        }
        let stage = &def.stages[s as usize];
        for &d in &stage.after {
            let k = &keys[d as usize];
            digests.insert(
                d,
                stage_digest(def, d, |t| k.get(t.index as usize).copied()),
            );
        }
        let mut made = Vec::with_capacity(stage.len() as usize);
        for i in 0..stage.len() {
            let t = TaskRef::new(s, i);
            let hashes: Vec<[u8; 32]> =
                def.expand(t).inputs.iter().map(|p| input_hash(p)).collect();
            let mut key = def.own_key(t, &hashes);
            if has_deps(def, s) {
                let deps = deps_digest(
                    def,
                    t,
                    |d| digests[&d],
                    |d| keys[d.stage as usize].get(d.index as usize).copied(),
                );
                key = key_with_deps(&key, &deps);
            }
            made.push(key);
        }
        keys[s as usize] = made;
    }
    keys
}

/// The farm's stages, each after every stage it depends on.
pub fn dependency_order(def: &FarmDef) -> Vec<u32> {
    let n = def.stages.len();
    let mut placed = vec![false; n];
    let mut order = Vec::with_capacity(n);
    // The farm file refuses cycles: each round places at least one stage.
    while order.len() < n {
        let before = order.len();
        for (s, stage) in def.stages.iter().enumerate() {
            if !placed[s] && stage.upstream().all(|d| placed[d as usize]) {
                placed[s] = true;
                order.push(s as u32);
            }
        }
        if order.len() == before {
            break;
        }
    }
    order
}

/// Per stage, whether `--rerun` names it or a stage it depends on
/// (directly or not): what they read is made again, so they run again too.
/// `Some(&[])` (a bare `--rerun`) names every stage.
pub fn rerun_stages(def: &FarmDef, rerun: Option<&[String]>) -> Vec<bool> {
    let Some(names) = rerun else {
        return vec![false; def.stages.len()];
    };
    let mut marked: Vec<bool> = def
        .stages
        .iter()
        .map(|s| names.is_empty() || names.contains(&s.name))
        .collect();
    // Stages may name any other as a dependency: go round until nothing changes.
    let mut grew = true;
    while grew {
        grew = false;
        for (i, s) in def.stages.iter().enumerate() {
            if !marked[i] && s.upstream().any(|d| marked[d as usize]) {
                marked[i] = true;
                grew = true;
            }
        }
    }
    marked
}
