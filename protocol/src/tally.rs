//! A map that counts its entries per group and remembers which groups changed: what makes the invariant checks incremental.
//!
//! The coordinator keeps its claims per node and its live runs per stage
//! in its own books (the load it booked for a node, a stage's running
//! counter), and the checks hold those books against the entries. A pass
//! over every entry after every step costs in proportion to the mesh;
//! instead the map counts its entries per group as it changes, and a
//! check compares the books with the counts of the groups the step
//! touched. The full pass stays, for tests and the end of a simulation:
//! it also recounts the counts here.

use std::collections::hash_map::Entry;
use std::hash::Hash;
use std::ops::Deref;

use rustc_hash::FxHashMap;

/// Entries keyed by `K`, counted per group `G` (given by `group`).
/// Reads go through `Deref` to the map; changes through the methods here.
pub struct Tally<K, V, G> {
    map: FxHashMap<K, V>,
    counts: FxHashMap<G, usize>,
    touched: Vec<G>,
    group: fn(&K, &V) -> G,
}

impl<K: Hash + Eq, V, G: Hash + Eq + Copy> Tally<K, V, G> {
    pub fn new(group: fn(&K, &V) -> G) -> Self {
        Tally {
            map: FxHashMap::default(),
            counts: FxHashMap::default(),
            touched: Vec::new(),
            group,
        }
    }

    fn count(&mut self, g: G, up: bool) {
        self.touched.push(g);
        match self.counts.entry(g) {
            Entry::Occupied(mut e) => {
                if up {
                    *e.get_mut() += 1;
                } else if *e.get() <= 1 {
                    e.remove();
                } else {
                    *e.get_mut() -= 1;
                }
            }
            Entry::Vacant(e) => {
                if up {
                    e.insert(1);
                }
            }
        }
    }

    pub fn insert(&mut self, k: K, v: V) -> Option<V> {
        // The key may move to another group (a claim to another node).
        if let Some(old) = self.map.get(&k) {
            let g = (self.group)(&k, old);
            self.count(g, false);
        }
        let g = (self.group)(&k, &v);
        self.count(g, true);
        self.map.insert(k, v)
    }

    pub fn remove(&mut self, k: &K) -> Option<V> {
        let v = self.map.remove(k)?;
        let g = (self.group)(k, &v);
        self.count(g, false);
        Some(v)
    }

    /// Changes an entry in place; its group may change too.
    pub fn update<R>(&mut self, k: &K, f: impl FnOnce(&mut V) -> R) -> Option<R> {
        let v = self.map.get_mut(k)?;
        let before = (self.group)(k, v);
        let r = f(v);
        let after = (self.group)(k, v);
        if before != after {
            self.count(before, false);
            self.count(after, true);
        }
        Some(r)
    }

    /// Every entry, to change in place without moving any to another
    /// group (for a group given by the key alone; [`Tally::recount`]
    /// catches a move).
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (&K, &mut V)> {
        self.map.iter_mut()
    }

    /// Entries in group `g`, as counted.
    pub fn in_group(&self, g: &G) -> usize {
        self.counts.get(g).copied().unwrap_or(0)
    }

    /// The groups changed since the last call (maybe repeated).
    pub fn take_touched(&mut self) -> Vec<G> {
        std::mem::take(&mut self.touched)
    }

    /// Hands back what [`Tally::take_touched`] gave, emptied, to collect
    /// the next step's groups in: checked after every step, a buffer
    /// taken and grown again each time was an allocation a step.
    pub fn recycle_touched(&mut self, mut done: Vec<G>) {
        if self.touched.is_empty() {
            done.clear();
            self.touched = done;
        }
    }

    /// The counts against a pass over every entry.
    pub fn recount(&self) -> Result<(), String> {
        let mut counts: FxHashMap<G, usize> = FxHashMap::default();
        for (k, v) in &self.map {
            *counts.entry((self.group)(k, v)).or_default() += 1;
        }
        if counts != self.counts {
            return Err(format!(
                "{} groups counted as entries changed, {} by a pass over the entries",
                self.counts.len(),
                counts.len()
            ));
        }
        Ok(())
    }
}

impl<K, V, G> Deref for Tally<K, V, G> {
    type Target = FxHashMap<K, V>;
    fn deref(&self) -> &Self::Target {
        &self.map
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_follow_inserts_moves_and_removes() {
        let mut t: Tally<u32, char, char> = Tally::new(|_, v| *v);
        t.insert(1, 'a');
        t.insert(2, 'a');
        t.insert(3, 'b');
        assert_eq!((t.in_group(&'a'), t.in_group(&'b')), (2, 1));
        // Key 2 moves to group b.
        t.insert(2, 'b');
        assert_eq!((t.in_group(&'a'), t.in_group(&'b')), (1, 2));
        t.remove(&1);
        t.remove(&1);
        assert_eq!(t.in_group(&'a'), 0);
        let mut touched = t.take_touched();
        touched.sort();
        touched.dedup();
        assert_eq!(touched, vec!['a', 'b']);
        assert!(t.take_touched().is_empty());
        t.recount().unwrap();
        assert_eq!(t.len(), 2);
    }
}
